/* AVX2 twin of e8kv_rope_rows_ref (rope.c): the same products and sums, 8 pairs per vector, never fused
 * (E8KV_NO_FP_CONTRACT), so both give the same bits (tests/test_common.c). neox pairs (i, i + d/2) are two
 * halves of the vector; interleaved pairs (2i, 2i + 1) sit in one vector: C and S duplicated per pair, the
 * pair swapped (_mm256_permute_ps 0xB1) and its first lane negated (a product by -1 is exact). */
#include "rope.h"

#if defined(__AVX2__)
#include <immintrin.h>

E8KV_NO_FP_CONTRACT
void e8kv_rope_rows_avx2(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, const double *restrict cb,
                         const double *restrict sb, const double *restrict ct, const double *restrict st) {
    E8KV_NO_FP_CONTRACT_BODY
    const size_t half = d / 2;
    if (half % 8) {
        e8kv_rope_rows_ref(x, n, n_vec, d, neox, cb, sb, ct, st);
        return;
    }
    float C[E8KV_MAX_HEAD_DIM], S[E8KV_MAX_HEAD_DIM];
    const __m256 sign = _mm256_setr_ps(-1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f);
    for (size_t t = 0; t < n; t++) {
        const double *const c = ct + t * half, *const s = st + t * half;
        for (size_t i = 0; i < half; i += 8) {
            __m128 cf[2], sf[2]; /* pairs i .. i+3 and i+4 .. i+7: products in double, rounded once */
            for (size_t k = 0; k < 2; k++) {
                const __m256d vc = _mm256_loadu_pd(c + i + 4 * k), vs = _mm256_loadu_pd(s + i + 4 * k);
                const __m256d vcb = _mm256_loadu_pd(cb + i + 4 * k), vsb = _mm256_loadu_pd(sb + i + 4 * k);
                cf[k] = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_mul_pd(vcb, vc), _mm256_mul_pd(vsb, vs)));
                sf[k] = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(vsb, vc), _mm256_mul_pd(vcb, vs)));
            }
            const __m256 Cv = _mm256_set_m128(cf[1], cf[0]), Sv = _mm256_set_m128(sf[1], sf[0]);
            if (neox) {
                _mm256_storeu_ps(C + i, Cv);
                _mm256_storeu_ps(S + i, Sv);
            } else { /* duplicate each pair's C and S over its two lanes */
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
    }
}
#else
void e8kv_rope_rows_avx2(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, const double *restrict cb,
                         const double *restrict sb, const double *restrict ct, const double *restrict st) {
    e8kv_rope_rows_ref(x, n, n_vec, d, neox, cb, sb, ct, st);
}
#endif
