/* The e8box:4 group reader shared by the AVX2 decoder (e8_box_avx2.c) and the integer-domain attention
 * (cache/attn_box_avx2.c). Include only from files built with -mavx2. */
#ifndef E8KV_E8_BOX_AVX2_H
#define E8KV_E8_BOX_AVX2_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* The 32 nibbles n of group g of a vector (d % 32 == 0), in value order (doc/format.md §2.4). */
static inline __m256i e8kv_box_group_n(const uint8_t *vec, size_t d, size_t g) {
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(vec + 1 + (d + 63) / 64 + 16 * g));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

/* u = 2n + k (0..31) of group g: the doubled E8 coordinate plus 16; each block's coset bit k is broadcast
 * to its 8 bytes by comparing against the bit masks. */
static inline __m256i e8kv_box_group_u(const uint8_t *vec, size_t d, size_t g) {
    const unsigned bits = (unsigned)(vec[1 + g / 2] >> (4 * (g % 2))) & 15u; /* blocks 4g .. 4g+3 */
    const __m256i sel = _mm256_setr_epi8(1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4,
                                         4, 8, 8, 8, 8, 8, 8, 8, 8);
    const __m256i k =
        _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_set1_epi8((char)bits), sel), sel); /* −1 / 0 */
    const __m256i n = e8kv_box_group_n(vec, d, g);
    return _mm256_sub_epi8(_mm256_add_epi8(n, n), k);
}

#endif
