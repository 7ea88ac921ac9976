/* AVX2/FMA twin of e8kv_attn_tile_ref (attention.c): the same online-softmax tile update with 8-wide dot
 * products and accumulations. Differs from the reference only by float summation order (tested within a
 * relative tolerance in tests/test_cache.c). Requires head_dim % 8 == 0; other sizes use the reference. */
#include "kvcache.h"

#include "simd_avx2.h"

#include <immintrin.h>
#include <math.h>

#define TILE_MAX_TOKENS 64

void e8kv_attn_tile_avx2(const float *restrict q, const float *restrict K, const float *restrict V,
                         const float *restrict bias, size_t n, size_t d, float *restrict m, float *restrict l,
                         float *restrict acc) {
    if (d % 8) {
        e8kv_attn_tile_ref(q, K, V, bias, n, d, m, l, acc);
        return;
    }
    float s[TILE_MAX_TOKENS + 8];
    float m_new = *m;
    /* scores four keys at a time: four accumulators, one combined horizontal reduction */
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = K + j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (size_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
        }
        /* hadd(hadd(a0,a1), hadd(a2,a3)) holds, per 128-bit half, the partial sums of keys 0..3 */
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(s + j, r4);
    }
    for (; j < n; j++) {
        const float *k = K + j * d;
        __m256 a0 = _mm256_setzero_ps();
        for (size_t i = 0; i < d; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a0);
        s[j] = hsum256(a0);
    }
    for (j = 0; bias && j < n; j++) /* center=rope: the keys' turned centre */
        s[j] += bias[j];
    for (j = 0; j < n; j++)
        if (s[j] > m_new) m_new = s[j];
    /* weights p_j = e^(s_j - m'), 8 at a time; lanes past n are masked to 0 */
    const __m256 vm = _mm256_set1_ps(m_new);
    __m256 vsum = _mm256_setzero_ps();
    for (j = 0; j < n; j += 8) {
        const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)j), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), idx));
        const __m256 p = _mm256_and_ps(valid, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
        _mm256_storeu_ps(s + j, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    const float corr = expf(*m - m_new);
    const float sum = *l * corr + hsum256(vsum);
    const __m256 vc = _mm256_set1_ps(corr);
    /* acc += sum_j p_j v_j with 32 accumulator lanes held in registers across the whole tile */
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
        __m256 c0 = _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc), c1 = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 8), vc);
        __m256 c2 = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 16), vc), c3 = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 24), vc);
        for (size_t t = 0; t < n; t++) {
            const __m256 vp = _mm256_set1_ps(s[t]);
            const float *v = V + t * d + i;
            c0 = _mm256_fmadd_ps(vp, _mm256_loadu_ps(v), c0);
            c1 = _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + 8), c1);
            c2 = _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + 16), c2);
            c3 = _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + 24), c3);
        }
        _mm256_storeu_ps(acc + i, c0);
        _mm256_storeu_ps(acc + i + 8, c1);
        _mm256_storeu_ps(acc + i + 16, c2);
        _mm256_storeu_ps(acc + i + 24, c3);
    }
    for (; i < d; i += 8) {
        __m256 c0 = _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc);
        for (size_t t = 0; t < n; t++) c0 = _mm256_fmadd_ps(_mm256_set1_ps(s[t]), _mm256_loadu_ps(V + t * d + i), c0);
        _mm256_storeu_ps(acc + i, c0);
    }
    *m = m_new;
    *l = sum;
}

void e8kv_rc_bias_run_avx2(float *restrict out, const float *const *rows, const float *a, const float *b,
                           size_t m) {
    __m256 va[E8KV_RC_PAIRS], vb[E8KV_RC_PAIRS];
    for (size_t k = 0; k < E8KV_RC_PAIRS; k++)
        va[k] = _mm256_set1_ps(a[k]), vb[k] = _mm256_set1_ps(b[k]);
    size_t t = 0;
    for (; t + 8 <= m; t += 8) { /* 8 keys: the pairs' products in one register */
        __m256 s = _mm256_setzero_ps();
        for (size_t k = 0; k < E8KV_RC_PAIRS; k++) {
            s = _mm256_fmadd_ps(_mm256_loadu_ps(rows[k] + t), va[k], s);
            s = _mm256_fmadd_ps(_mm256_loadu_ps(rows[k] + t + RC_FINE), vb[k], s);
        }
        _mm256_storeu_ps(out + t, s);
    }
    if (t < m) { /* the last keys one by one */
        const float *tail[E8KV_RC_PAIRS];
        for (size_t k = 0; k < E8KV_RC_PAIRS; k++)
            tail[k] = rows[k] + t;
        e8kv_rc_bias_run_ref(out + t, tail, a, b, m - t);
    }
}

void e8kv_cache_read_f16_avx2(float *restrict dst, const uint8_t *restrict src, size_t n, size_t d) {
    const size_t total = n * d; /* d % 8 == 0: vectors are contiguous in the page */
    for (size_t i = 0; i < total; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i))));
}

#if defined(__AVX2__)
void e8kv_cache_add_rows_avx2(float *restrict y, const float *restrict mu, size_t n, size_t d) {
    assert(d % 8 == 0);
    for (size_t t = 0; t < n; t++) {
        float *const row = y + t * d;
        for (size_t j = 0; j < d; j += 8)
            _mm256_storeu_ps(row + j, _mm256_add_ps(_mm256_loadu_ps(row + j), _mm256_loadu_ps(mu + j)));
    }
}
#else
void e8kv_cache_add_rows_avx2(float *restrict y, const float *restrict mu, size_t n, size_t d) {
    e8kv_cache_add_rows_ref(y, mu, n, d);
}
#endif
