/* AVX2 twin of e8kv_box_decode_ref (bit-exact: the same integer lattice coordinates, then the same single
 * float multiply). Per 32 values: 16 bytes of nibbles split into low and high halves (already in value
 * order, doc/format.md §2.4), each block's coset bit broadcast to its 8 bytes by a compare against the
 * bit masks, p2 = 2n − 16 + k in int8, widened to f32. */
#include "e8_box.h"
#include "e8_box_avx2.h"

#include <immintrin.h>

void e8kv_box_decode_avx2(float *restrict y, const uint8_t *restrict src, size_t d) {
    assert(d % 32 == 0);
    const __m256 h = _mm256_set1_ps(e8kv_box_half_steps()[src[0]]);
    for (size_t g = 0; g < d / 32; g++) {
        const __m256i p = _mm256_sub_epi8(e8kv_box_group_u(src, d, g), _mm256_set1_epi8(16)); /* p2 */
        const __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
        float *const o = y + 32 * g;
        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), h));
        _mm256_storeu_ps(o + 8,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), h));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), h));
        _mm256_storeu_ps(o + 24,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), h));
    }
}
