/* AVX2 twin of e8kv_box_decode_ref (bit-exact: the same integer lattice coordinates, then the same single
 * float multiply). Per 32 values: 16 bytes of nibbles split into low and high halves (already in value
 * order, doc/format.md §2.4), each block's coset bit broadcast to its 8 bytes by a compare against the
 * bit masks, p2 = 2n − 16 + k in int8, widened to f32. */
#include "e8_box.h"

#include <immintrin.h>

/* p2 = 2n − 16 + k (int8, value order) of the 32 values of group g (d % 32 == 0) */
static inline __m256i group_p2(const uint8_t *restrict src, size_t d, size_t g) {
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 1 + (d + 63) / 64 + 16 * g));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i n = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
    const unsigned bits = (unsigned)(src[1 + g / 2] >> (4 * (g % 2))) & 15u; /* blocks 4g .. 4g+3 */
    const __m256i sel = _mm256_setr_epi8(1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4,
                                         4, 8, 8, 8, 8, 8, 8, 8, 8);
    const __m256i k =
        _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_set1_epi8((char)bits), sel), sel); /* −1 / 0 */
    return _mm256_sub_epi8(_mm256_sub_epi8(_mm256_add_epi8(n, n), _mm256_set1_epi8(16)), k);
}

void e8kv_box_decode_avx2(float *restrict y, const uint8_t *restrict src, size_t d) {
    assert(d % 32 == 0);
    const __m256 h = _mm256_set1_ps(e8kv_box_half_steps()[src[0]]);
    for (size_t g = 0; g < d / 32; g++) {
        const __m256i p = group_p2(src, d, g);
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
