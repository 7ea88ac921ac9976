/* Fused e8ball:4 page reader with nibble-packed tables (AVX2).
 *
 * Why: decode attention over e8:4 does two random table look-ups per 8 values (ball point c, Voronoi
 * residual r). The codec's int8 tables are 512 KiB each; together with the streamed pages they do not
 * stay in a 1 MiB L2, so the reader waited on L3. Every doubled coordinate fits in a nibble (ball
 * c2 ∈ [−6, 6], residual r2 ∈ [−8, 7]; checked when the tables are built), so each entry packs into one
 * 32-bit word: byte j = (x_j + 8) | (x_{j+4} + 8) << 4 (j = 0..3). Both tables are then 256 KiB.
 *
 * Decode of 8 blocks at once (one 64-value chunk of a vector): gather 8 ball words and 8 residual words,
 * then per byte lane y + 40 = 4·(c + 8) + (r + 8) ∈ [8, 71] (no carry between bytes), so the fine-lattice
 * point in doubled coordinates is y = byte − 40 and the value y · h / 8 (h the fp16 scale), the same
 * exact integer times the same float as the codec's reference decode: bit-identical output (tested in
 * tests/test_cache.c against e8kv_codec_decode_rotated). */
#include "kvcache.h"

#include "common/fp16.h"
#include "quant/voronoi.h"

#include <immintrin.h>
#include <pthread.h>

static uint32_t g_ball_nib[E8KV_BALL_SIZE];
static uint32_t g_res_nib[E8KV_BALL_SIZE];
static int g_nib_ok;
static pthread_once_t g_nib_once = PTHREAD_ONCE_INIT;

/* one table entry (8 doubled coordinates) -> nibble word; 0 when a coordinate is out of [−8, 7] */
static int pack_nibbles(uint32_t *w, const int8_t *x) {
    uint32_t r = 0;
    for (int j = 0; j < 4; j++) {
        const int lo = x[j] + 8, hi = x[j + 4] + 8;
        if (lo < 0 || lo > 15 || hi < 0 || hi > 15) return 0;
        r |= (uint32_t)(lo | hi << 4) << (8 * j);
    }
    *w = r;
    return 1;
}

static void build_nib(void) {
    const int8_t *const ball = e8kv_ball_table(), *const res = e8kv_ball_residual_table(2);
    int ok = 1;
    for (size_t i = 0; i < E8KV_BALL_SIZE; i++) {
        ok &= pack_nibbles(&g_ball_nib[i], ball + 8 * i);
        ok &= pack_nibbles(&g_res_nib[i], res + 8 * i);
    }
    g_nib_ok = ok;
}

const uint32_t *e8kv_attn_ball_nib(void) {
    pthread_once(&g_nib_once, build_nib);
    return g_nib_ok ? g_ball_nib : NULL;
}

const uint32_t *e8kv_attn_res4_nib(void) {
    pthread_once(&g_nib_once, build_nib);
    return g_nib_ok ? g_res_nib : NULL;
}

/* 16 biased bytes (two blocks) -> 16 floats (byte − 40) · k */
static inline void emit16(float *restrict y, __m128i b, __m256i bias, __m256 vk) {
    const __m256i lo = _mm256_sub_epi32(_mm256_cvtepu8_epi32(b), bias);
    const __m256i hi = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), bias);
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), vk));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), vk));
}

/* The 8 blocks of one 64-value chunk as biased bytes: A holds blocks 0,1 | 4,5 and B blocks 2,3 | 6,7
 * (128-bit lanes), each block's 8 coordinates in order. p points at the chunk's first block (4 bytes
 * per block: 16-bit ball index, 16-bit residual digits, little-endian). */
static inline void chunk_bytes(__m256i *A, __m256i *B, const uint8_t *p, const int *bt, const int *rt) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)p);
    const __m256i ib = _mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)), ir = _mm256_srli_epi32(x, 16);
    const __m256i cb = _mm256_i32gather_epi32(bt, ib, 4), cr = _mm256_i32gather_epi32(rt, ir, 4);
    const __m256i nib = _mm256_set1_epi32(0x0F0F0F0F);
    const __m256i lo =
        _mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(cb, nib), 2), _mm256_and_si256(cr, nib));
    const __m256i hi = _mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(cb, 4), nib), 2),
                                        _mm256_and_si256(_mm256_srli_epi32(cr, 4), nib));
    *A = _mm256_unpacklo_epi32(lo, hi);
    *B = _mm256_unpackhi_epi32(lo, hi);
}

int e8kv_cache_read_e8ball4_avx2(float *restrict dst, const uint8_t *restrict src, size_t n, size_t d,
                                 size_t vector_bytes) {
    if (d % 64) return 0;
    const int *const bt = (const int *)(const void *)e8kv_attn_ball_nib();
    const int *const rt = (const int *)(const void *)e8kv_attn_res4_nib();
    if (!bt || !rt) return 0;
    const __m256i bias = _mm256_set1_epi32(40);
    for (size_t t = 0; t < n; t++) {
        const uint8_t *v = src + t * vector_bytes;
        const __m256 vk = _mm256_set1_ps(_cvtsh_ss(e8kv_load_le16(v)) / 8.0f);
        float *y = dst + t * d;
        for (size_t b = 0; b < d; b += 64, y += 64) {
            __m256i A, B;
            chunk_bytes(&A, &B, v + 2 + b / 2, bt, rt);
            emit16(y, _mm256_castsi256_si128(A), bias, vk);
            emit16(y + 16, _mm256_castsi256_si128(B), bias, vk);
            emit16(y + 32, _mm256_extracti128_si256(A, 1), bias, vk);
            emit16(y + 48, _mm256_extracti128_si256(B, 1), bias, vk);
        }
    }
    return 1;
}
