/* AVX2/FMA twin of e8kv_attn_tile_ref (attention.c): the same online-softmax tile update with 8-wide dot
 * products and accumulations. Differs from the reference only by float summation order (tested within a
 * relative tolerance in tests/test_cache.c). Requires head_dim % 8 == 0; other sizes use the reference. */
#include "kvcache.h"

#include <immintrin.h>
#include <math.h>

#define TILE_MAX_TOKENS 64

static inline float hsum256(__m256 v) {
    const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void e8kv_attn_tile_avx2(const float *restrict q, const float *restrict K, const float *restrict V, size_t n,
                         size_t d, float *restrict m, float *restrict l, float *restrict acc) {
    if (d % 8) {
        e8kv_attn_tile_ref(q, K, V, n, d, m, l, acc);
        return;
    }
    float s[TILE_MAX_TOKENS];
    float m_new = *m;
    for (size_t j = 0; j < n; j++) {
        const float *k = K + j * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        size_t i = 0;
        for (; i + 16 <= d; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), a1);
        }
        if (i < d) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a0);
        s[j] = hsum256(_mm256_add_ps(a0, a1));
        if (s[j] > m_new) m_new = s[j];
    }
    const float corr = expf(*m - m_new);
    float sum = *l * corr;
    const __m256 vc = _mm256_set1_ps(corr);
    for (size_t i = 0; i < d; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc));
    for (size_t j = 0; j < n; j++) {
        const float p = expf(s[j] - m_new);
        sum += p;
        const __m256 vp = _mm256_set1_ps(p);
        const float *v = V + j * d;
        for (size_t i = 0; i < d; i += 8)
            _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
    }
    *m = m_new;
    *l = sum;
}
