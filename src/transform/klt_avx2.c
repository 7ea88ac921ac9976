/* AVX2/FMA twins of the KLT basis transforms (klt.h). Forward: eight rows' dot products at a time with
 * eight accumulators; inverse: the output held in registers (d/8 of them, up to 16 for d = 128) while
 * the rows P[i] scaled by y_i are added, so a key decoded in the attention loop costs n_used·d/8 FMAs and
 * no memory traffic besides P (16 KiB at d = 64, L1-resident across a tile). */
#include "klt.h"

#include <immintrin.h>

static inline float hsum(__m256 v) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

void e8kv_klt_forward_avx2(const float *restrict P, size_t d, float *x, size_t n_vec) {
    if (d % 8) {
        e8kv_klt_forward_ref(P, d, x, n_vec);
        return;
    }
    float t[E8KV_MAX_HEAD_DIM];
    for (size_t v = 0; v < n_vec; v++) {
        float *const xv = x + v * d;
        for (size_t i = 0; i < d; i++) {
            const float *const row = P + i * d;
            __m256 acc = _mm256_setzero_ps();
            for (size_t k = 0; k < d; k += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(row + k), _mm256_loadu_ps(xv + k), acc);
            t[i] = hsum(acc);
        }
        memcpy(xv, t, d * sizeof(float));
    }
}

/* d = 64 with the output in 8 registers */
static void inverse64(const float *restrict P, size_t n_used, float *x) {
    __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, o4 = o0, o5 = o0, o6 = o0, o7 = o0;
    for (size_t i = 0; i < n_used; i++) {
        const __m256 y = _mm256_set1_ps(x[i]);
        const float *const r = P + i * 64;
        o0 = _mm256_fmadd_ps(y, _mm256_loadu_ps(r), o0);
        o1 = _mm256_fmadd_ps(y, _mm256_loadu_ps(r + 8), o1);
        o2 = _mm256_fmadd_ps(y, _mm256_loadu_ps(r + 16), o2);
        o3 = _mm256_fmadd_ps(y, _mm256_loadu_ps(r + 24), o3);
        o4 = _mm256_fmadd_ps(y, _mm256_loadu_ps(r + 32), o4);
        o5 = _mm256_fmadd_ps(y, _mm256_loadu_ps(r + 40), o5);
        o6 = _mm256_fmadd_ps(y, _mm256_loadu_ps(r + 48), o6);
        o7 = _mm256_fmadd_ps(y, _mm256_loadu_ps(r + 56), o7);
    }
    _mm256_storeu_ps(x, o0);
    _mm256_storeu_ps(x + 8, o1);
    _mm256_storeu_ps(x + 16, o2);
    _mm256_storeu_ps(x + 24, o3);
    _mm256_storeu_ps(x + 32, o4);
    _mm256_storeu_ps(x + 40, o5);
    _mm256_storeu_ps(x + 48, o6);
    _mm256_storeu_ps(x + 56, o7);
}

void e8kv_klt_inverse_avx2(const float *restrict P, size_t d, size_t n_used, float *x, size_t n_vec) {
    if (d % 8) {
        e8kv_klt_inverse_ref(P, d, n_used, x, n_vec);
        return;
    }
    if (d == 64) {
        for (size_t v = 0; v < n_vec; v++)
            inverse64(P, n_used, x + v * 64);
        return;
    }
    float t[E8KV_MAX_HEAD_DIM];
    for (size_t v = 0; v < n_vec; v++) {
        float *const xv = x + v * d;
        for (size_t k0 = 0; k0 < d; k0 += 32) { /* 32 outputs (4 registers) per pass over the rows */
            const size_t nk = d - k0 < 32 ? d - k0 : 32;
            __m256 o[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                           _mm256_setzero_ps()};
            for (size_t i = 0; i < n_used; i++) {
                const __m256 y = _mm256_set1_ps(xv[i]);
                for (size_t b = 0; b < nk / 8; b++)
                    o[b] = _mm256_fmadd_ps(y, _mm256_loadu_ps(P + i * d + k0 + 8 * b), o[b]);
            }
            for (size_t b = 0; b < nk / 8; b++)
                _mm256_storeu_ps(t + k0 + 8 * b, o[b]);
        }
        memcpy(xv, t, d * sizeof(float));
    }
}
