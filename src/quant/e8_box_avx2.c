/* AVX2 twins of e8kv_box_decode_ref and e8kv_box_nearest_ref (e8_box.c), bit-exact.
 *
 * Decoder, B = 4: per 32 values, 16 bytes of nibbles split into low and high halves (already in value
 * order, doc/format.md §2.4), each block's coset bit broadcast to its 8 bytes by a compare against the bit
 * masks, p2 = 2n − 16 + k in int8, widened to f32. B = 2, 3: the fields of each plane's 16-byte groups
 * shifted and masked into n (int8, value order) first, then the same coset step and widening.
 *
 * Block quantizer: the 8 coordinates in the lanes. Per coset k the per-coordinate nearest p2 of parity k
 * is 2·⌊(X − kH + H) / ONE⌋ + k (ONE = 2^FX_BITS, so the floor division is an arithmetic shift), clamped
 * into the box. If Σ p2 ≢ 0 (mod 4), the reference's cheapest single ±2 move: with e = X − p2·H the
 * move s changes the squared error by 4H² − 2sH·e, i.e. 4H·(H + e) for s = −2 and 4H·(H − e) for
 * s = +2, so comparing H ± e in int32 orders the moves exactly as the reference's 64-bit costs; ties go
 * to the first coordinate and to −2, as there. */
#include "e8_box.h"
#include "voronoi.h"

#include <immintrin.h>
#include <limits.h>

/* The 32 nibbles n of group g of a vector (d % 32 == 0), in value order (doc/format.md §2.4). */
static inline __m256i group_n(const uint8_t *vec, size_t d, size_t g) {
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(vec + 1 + (d + 63) / 64 + 16 * g));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

/* u = 2n + k (0..31) of group g: the doubled E8 coordinate plus 16; each block's coset bit k is broadcast
 * to its 8 bytes by comparing against the bit masks. */
static inline __m256i group_u(const uint8_t *vec, size_t d, size_t g) {
    const unsigned bits = (unsigned)(vec[1 + g / 2] >> (4 * (g % 2))) & 15u; /* blocks 4g .. 4g+3 */
    const __m256i sel = _mm256_setr_epi8(1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4,
                                         4, 8, 8, 8, 8, 8, 8, 8, 8);
    const __m256i k =
        _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_set1_epi8((char)bits), sel), sel); /* −1 / 0 */
    const __m256i n = group_n(vec, d, g);
    return _mm256_sub_epi8(_mm256_add_epi8(n, n), k);
}

/* n of every value (B = 2 or 3, d % 32 == 0), int8 in value order, into nv (d + 16 bytes) */
static void low_n(int8_t *nv, const uint8_t *src, size_t d, int bits) {
    const uint8_t *const pl = src + 1 + (d + 63) / 64;
    const __m128i m3 = _mm_set1_epi8(3), m1 = _mm_set1_epi8(1);
    for (size_t g = 0; g < (d + 63) / 64; g++) { /* 2-bit plane: groups of 64 values in 16 (or 8) bytes */
        const size_t nb = (d - 64 * g < 64 ? d - 64 * g : 64) / 4;
        const __m128i b = nb == 16 ? _mm_loadu_si128((const __m128i *)(const void *)(pl + 16 * g))
                                   : _mm_loadl_epi64((const __m128i *)(const void *)(pl + 16 * g));
        for (int j = 0; j < 4; j++) {
            const __m128i v = _mm_and_si128(_mm_srl_epi16(b, _mm_cvtsi32_si128(2 * j)), m3);
            int8_t *const o = nv + 64 * g + nb * (size_t)j;
            if (nb == 16)
                _mm_storeu_si128((__m128i *)(void *)o, v);
            else
                _mm_storel_epi64((__m128i *)(void *)o, v);
        }
    }
    if (bits == 2) return;
    const uint8_t *const hp = pl + d / 4;
    for (size_t g = 0; g < (d + 127) / 128; g++) { /* 1-bit plane: groups of 128 values in 16 (4..12) bytes */
        const size_t nb = (d - 128 * g < 128 ? d - 128 * g : 128) / 8;
        _Alignas(16) uint8_t raw[16] = {0};
        memcpy(raw, hp + 16 * g, nb);
        const __m128i b = _mm_load_si128((const __m128i *)(const void *)raw);
        for (int j = 0; j < 8; j++) { /* bytes past nb add 0 to the values after them */
            const __m128i v = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(b, _mm_cvtsi32_si128(j)), m1), 2);
            int8_t *const o = nv + 128 * g + nb * (size_t)j;
            _mm_storeu_si128((__m128i *)(void *)o,
                             _mm_add_epi8(_mm_loadu_si128((const __m128i *)(void *)o), v));
        }
    }
}

/* o[0..32) = h · p, the 32 signed bytes of p (doubled lattice coordinates) as floats. */
static inline void store_scaled32(float *restrict o, __m256i p, __m256 h) {
    const __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
    _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), h));
    _mm256_storeu_ps(o + 8,
                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), h));
    _mm256_storeu_ps(o + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), h));
    _mm256_storeu_ps(o + 24,
                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), h));
}

static void decode_low(float *restrict y, const uint8_t *restrict src, size_t d, int bits) {
    _Alignas(32) int8_t nv[E8KV_MAX_HEAD_DIM + 16];
    low_n(nv, src, d, bits);
    const __m256 h = _mm256_set1_ps(e8kv_box_half_steps()[src[0]]);
    const __m256i sel = _mm256_setr_epi8(1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4,
                                         4, 8, 8, 8, 8, 8, 8, 8, 8);
    for (size_t g = 0; g < d / 32; g++) {
        const unsigned cb = (unsigned)(src[1 + g / 2] >> (4 * (g % 2))) & 15u; /* blocks 4g .. 4g+3 */
        const __m256i k = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_set1_epi8((char)cb), sel), sel);
        const __m256i n = _mm256_load_si256((const __m256i *)(const void *)(nv + 32 * g));
        const __m256i p =
            _mm256_sub_epi8(_mm256_sub_epi8(_mm256_add_epi8(n, n), k), _mm256_set1_epi8((char)(1 << bits)));
        store_scaled32(y + 32 * g, p, h);
    }
}

void e8kv_box_decode_avx2(float *restrict y, const uint8_t *restrict src, size_t d, int bits) {
    assert(d % 32 == 0 && d <= E8KV_MAX_HEAD_DIM && bits >= 2 && bits <= 4);
    if (bits != 4) {
        decode_low(y, src, d, bits);
        return;
    }
    const __m256 h = _mm256_set1_ps(e8kv_box_half_steps()[src[0]]);
    for (size_t g = 0; g < d / 32; g++) {
        const __m256i p = _mm256_sub_epi8(group_u(src, d, g), _mm256_set1_epi8(16)); /* p2 */
        store_scaled32(y + 32 * g, p, h);
    }
}

static inline int32_t hsum8_epi32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* Σ e_i² exactly (|e| < 2^25: the squares and their sum are integers below 2^53) */
static inline int64_t sumsq(__m256i e) {
    const __m256d a = _mm256_cvtepi32_pd(_mm256_castsi256_si128(e)),
                  b = _mm256_cvtepi32_pd(_mm256_extracti128_si256(e, 1));
    const __m256d s = _mm256_add_pd(_mm256_mul_pd(a, a), _mm256_mul_pd(b, b));
    __m128d x = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    x = _mm_add_sd(x, _mm_unpackhi_pd(x, x));
    return (int64_t)_mm_cvtsd_f64(x);
}

static inline int64_t nearest_coset_avx2(__m256i *p2, __m256i X, int k, int bits) {
    const int32_t H = E8KV_FX_HALF, top = 1 << bits, lo = k ? 1 - top : -top, hi = k ? top - 1 : top - 2;
    const __m256i m = _mm256_srai_epi32(_mm256_add_epi32(X, _mm256_set1_epi32(H - k * H)), E8KV_FX_BITS);
    __m256i v = _mm256_add_epi32(_mm256_slli_epi32(m, 1), _mm256_set1_epi32(k));
    v = _mm256_min_epi32(_mm256_max_epi32(v, _mm256_set1_epi32(lo)), _mm256_set1_epi32(hi));
    const __m256i e = _mm256_sub_epi32(X, _mm256_slli_epi32(v, E8KV_FX_BITS - 1));
    const int64_t dist = sumsq(e);
    if ((hsum8_epi32(v) & 3) == 0) {
        *p2 = v;
        return dist;
    }
    const __m256i vh = _mm256_set1_epi32(H), none = _mm256_set1_epi32(INT32_MAX);
    /* −2 allowed where v ≥ lo + 2, +2 where v ≤ hi − 2 */
    const __m256i cm =
        _mm256_blendv_epi8(none, _mm256_add_epi32(vh, e), _mm256_cmpgt_epi32(v, _mm256_set1_epi32(lo + 1)));
    const __m256i cp =
        _mm256_blendv_epi8(none, _mm256_sub_epi32(vh, e), _mm256_cmpgt_epi32(_mm256_set1_epi32(hi - 1), v));
    const __m256i c = _mm256_min_epi32(cm, cp);
    __m256i mn = _mm256_min_epi32(c, _mm256_permute2x128_si256(c, c, 1));
    mn = _mm256_min_epi32(mn, _mm256_shuffle_epi32(mn, 0x4E));
    mn = _mm256_min_epi32(mn, _mm256_shuffle_epi32(mn, 0xB1));
    const int32_t best = _mm256_cvtsi256_si32(mn);
    assert(best != INT32_MAX); /* a box of at least 4 values per coordinate always leaves a move */
    const unsigned lanes = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, mn)));
    const int i = __builtin_ctz(lanes); /* the first coordinate of least cost */
    _Alignas(32) int32_t cmv[8], cpv[8], vv[8];
    _mm256_store_si256((__m256i *)(void *)cmv, cm);
    _mm256_store_si256((__m256i *)(void *)cpv, cp);
    _mm256_store_si256((__m256i *)(void *)vv, v);
    vv[i] += cpv[i] < cmv[i] ? 2 : -2; /* −2 on equal cost */
    *p2 = _mm256_load_si256((const __m256i *)(const void *)vv);
    return dist + 4 * (int64_t)H * best;
}

int64_t e8kv_box_nearest_avx2(int32_t p2[8], const float *restrict x, float k, int bits) {
    const __m256 lim = _mm256_set1_ps(E8KV_FX_LIMIT);
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_set1_ps(k));
    t = _mm256_max_ps(_mm256_min_ps(t, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
    const __m256i X = _mm256_cvtps_epi32(t); /* round half to even, as lrintf in the default mode */
    __m256i a, b;
    const int64_t da = nearest_coset_avx2(&a, X, 0, bits), db = nearest_coset_avx2(&b, X, 1, bits);
    _mm256_storeu_si256((__m256i *)(void *)p2, db < da ? b : a);
    return db < da ? db : da;
}
