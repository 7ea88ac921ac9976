/* AVX2 twin of e8kv_rope_rows_ref (rope.c): the same products and sums, never fused (E8KV_NO_FP_CONTRACT),
 * so both give the same bits (tests/test_common.c). The angle's cos and sin advance in double, 4 pairs per
 * vector, and are rounded to float once per row; the rotation runs 8 pairs per vector: neox pairs
 * (i, i + d/2) are two halves of the vector, interleaved pairs (2i, 2i + 1) sit in one vector with C and S
 * duplicated per pair, the pair swapped (_mm256_permute_ps 0xB1) and its first lane negated (exact). */
#include "rope.h"

#if defined(__AVX2__)
#include <immintrin.h>

E8KV_NO_FP_CONTRACT
void e8kv_rope_rows_avx2(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, double *restrict cc,
                         double *restrict ss, const double *restrict dc, const double *restrict ds) {
    E8KV_NO_FP_CONTRACT_BODY
    const size_t half = d / 2;
    if (half % 8) {
        e8kv_rope_rows_ref(x, n, n_vec, d, neox, cc, ss, dc, ds);
        return;
    }
    float C[E8KV_MAX_HEAD_DIM], S[E8KV_MAX_HEAD_DIM];
    const __m256 sign = _mm256_setr_ps(-1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f);
    for (size_t t = 0; t < n; t++) {
        for (size_t i = 0; i < half && n_vec; i += 8) {
            const __m256 Cv = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(cc + i + 4)),
                                              _mm256_cvtpd_ps(_mm256_loadu_pd(cc + i)));
            const __m256 Sv = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(ss + i + 4)),
                                              _mm256_cvtpd_ps(_mm256_loadu_pd(ss + i)));
            if (neox) {
                _mm256_storeu_ps(C + i, Cv);
                _mm256_storeu_ps(S + i, Sv);
            } else { /* each pair's C and S over its two lanes */
                const __m256 c_lo = _mm256_unpacklo_ps(Cv, Cv), c_hi = _mm256_unpackhi_ps(Cv, Cv);
                const __m256 s_lo = _mm256_unpacklo_ps(Sv, Sv), s_hi = _mm256_unpackhi_ps(Sv, Sv);
                _mm256_storeu_ps(C + 2 * i, _mm256_permute2f128_ps(c_lo, c_hi, 0x20));
                _mm256_storeu_ps(C + 2 * i + 8, _mm256_permute2f128_ps(c_lo, c_hi, 0x31));
                _mm256_storeu_ps(S + 2 * i, _mm256_permute2f128_ps(s_lo, s_hi, 0x20));
                _mm256_storeu_ps(S + 2 * i + 8, _mm256_permute2f128_ps(s_lo, s_hi, 0x31));
            }
        }
        for (size_t h = 0; h < n_vec; h++) {
            float *const y = x + (t * n_vec + h) * d;
            if (neox) {
                for (size_t i = 0; i < half; i += 8) {
                    const __m256 Cv = _mm256_loadu_ps(C + i), Sv = _mm256_loadu_ps(S + i);
                    const __m256 a = _mm256_loadu_ps(y + i), b = _mm256_loadu_ps(y + half + i);
                    _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_mul_ps(a, Cv), _mm256_mul_ps(b, Sv)));
                    _mm256_storeu_ps(y + half + i, _mm256_add_ps(_mm256_mul_ps(a, Sv), _mm256_mul_ps(b, Cv)));
                }
            } else {
                for (size_t j = 0; j < d; j += 8) {
                    const __m256 v = _mm256_loadu_ps(y + j);
                    const __m256 w = _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), sign); /* (-x1, x0) */
                    _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_mul_ps(v, _mm256_loadu_ps(C + j)),
                                                          _mm256_mul_ps(w, _mm256_loadu_ps(S + j))));
                }
            }
        }
        for (size_t i = 0; i < half; i += 4) { /* one position on */
            const __m256d c = _mm256_loadu_pd(cc + i), s = _mm256_loadu_pd(ss + i);
            const __m256d sc = _mm256_loadu_pd(dc + i), sd = _mm256_loadu_pd(ds + i);
            _mm256_storeu_pd(cc + i, _mm256_sub_pd(_mm256_mul_pd(c, sc), _mm256_mul_pd(s, sd)));
            _mm256_storeu_pd(ss + i, _mm256_add_pd(_mm256_mul_pd(s, sc), _mm256_mul_pd(c, sd)));
        }
    }
}
#else
void e8kv_rope_rows_avx2(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, double *restrict cc,
                         double *restrict ss, const double *restrict dc, const double *restrict ds) {
    e8kv_rope_rows_ref(x, n, n_vec, d, neox, cc, ss, dc, ds);
}
#endif
