/* AVX2 twin of e8kv_fwht_ref: the three butterfly stages inside each 8-float register are done with
 * shuffles, the remaining stages with full-register adds. Every output of every stage is the same single
 * IEEE operation as in the reference (a + b, or fma(b, -1, a) = a - b rounded once), in the same stage
 * order, so the twins are bit-exact; tests/test_fwht.c checks that. Compiled with -mavx2 -mfma; only
 * called when the CPU has them. */
#include "fwht.h"

#if defined(__AVX2__)
#include <immintrin.h>

void e8kv_fwht_avx2(float *x, size_t n) {
    assert(n >= 8 && (n & (n - 1)) == 0);
    const __m256 sign1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 sign2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 sign4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    for (size_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        /* h = 1: (a+b, a-b) on adjacent pairs */
        __m256 sw = _mm256_permute_ps(v, 0xB1);
        v = _mm256_fmadd_ps(v, sign1, sw);
        /* h = 2 */
        sw = _mm256_permute_ps(v, 0x4E);
        v = _mm256_fmadd_ps(v, sign2, sw);
        /* h = 4 */
        sw = _mm256_permute2f128_ps(v, v, 0x01);
        v = _mm256_fmadd_ps(v, sign4, sw);
        _mm256_storeu_ps(x + i, v);
    }
    for (size_t h = 8; h < n; h *= 2) {
        for (size_t i = 0; i < n; i += 2 * h) {
            for (size_t j = i; j < i + h; j += 8) {
                const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
            }
        }
    }
}

void e8kv_rot_inverse_avx2(const e8kv_rot *rot, float *x, size_t n_vec, const float *scale) {
    const size_t d = rot->head_dim;
    for (size_t v = 0; v < n_vec; v++) {
        float *const xv = x + v * d;
        for (size_t b = 0, off = 0; b < rot->n_block; off += rot->block_len[b++])
            e8kv_fwht_avx2(xv + off, rot->block_len[b]);
        for (size_t i = 0; i < d; i += 8)
            _mm256_storeu_ps(xv + i, _mm256_mul_ps(_mm256_loadu_ps(xv + i), _mm256_loadu_ps(scale + i)));
    }
}
#else
void e8kv_fwht_avx2(float *x, size_t n) { e8kv_fwht_ref(x, n); }
void e8kv_rot_inverse_avx2(const e8kv_rot *rot, float *x, size_t n_vec, const float *scale) {
    (void)scale;
    e8kv_rot_inverse(rot, x, n_vec);
}
#endif
