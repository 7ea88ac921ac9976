/* e8box:B (B = 4, 3, 2), E8 points in a box with B bits per value, every coordinate its own bit field.
 *
 * The fixed-rate E8 code built for reading speed. E8 = D8 ∪ (D8 + ½) (Conway & Sloane, SPLAG ch. 4 §8.1);
 * in doubled coordinates p2 = 2p the points with p2_i = 2n_i − 2^B + k, n_i ∈ 0..2^B − 1, coset
 * k ∈ {0, 1}, and Σ n_i even (⇔ Σ p2 ≡ 0 mod 4) are the E8 points of the box [−2^(B−1), 2^(B−1) − 1]⁸
 * (k = 0) ∪ [−2^(B−1) + ½, 2^(B−1) − ½]⁸ (k = 1): 2^(8B) points, one per unit volume, the lattice's
 * granular gain (0.65 dB over a scalar grid) with the cube's shape. Each coordinate is a B-bit field and
 * each block's coset a bit, so a reader turns bytes into lattice coordinates with shifts, masks and one
 * broadcast: no table, no parity sum (the constraint Σ n even is spent as redundancy instead of being
 * implied, and the coset bits sit in their own bytes). A per-vector step δ on a 1/8-octave grid, chosen
 * by the encoder among a few candidates around the largest coordinate (clipping a tail coordinate is
 * cheaper than coarsening all of them). Measured on N(0,1): 21.1 dB at 4.25 bits per value (e8:4: 21.3,
 * q4_0h: 21.3 at 4.5; BENCHMARKS.md); B = 3 and 2 in BENCHMARKS.md ("Low-rate formats a GPU decodes").
 *
 * Vector layout (doc/format.md §2.4), head_dim d (a multiple of 8), 1 + ⌈d/64⌉ + B·d/8 bytes:
 *   u8 e          δ = 2^((e − 160)/8); e = 0: the zero vector
 *   ⌈d/64⌉ bytes  coset bits: block b (values 8b..8b+7) in bit b % 8 of byte b / 8
 *   planes        B = 4: one plane of 4-bit fields (n); B = 2: one plane of 2-bit fields (n); B = 3: a
 *                 plane of 2-bit fields (n & 3), then a plane of 1-bit fields (n >> 2).
 * A plane of w-bit fields (d·w/8 bytes) is cut into 16-byte groups of G = 128/w values: group g holds
 * values [Gg, Gg + m), m = min(G, d − Gg), in m·w/8 bytes at offset 16g; value Gg + r + j·(m·w/8) sits
 * in byte r, bits [w·j, w·j + w). So one aligned 16-byte load gives a GPU thread whole blocks of 8 values,
 * and each field comes out with one shift and one mask (w = 4 is e8box:4's nibble order, unchanged).
 * Value i of block b decodes to (δ/2)·(2n_i − 2^B + k_b). */
#include "e8_box.h"

#include "common/cpu.h"
#include "voronoi.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#define STEP_ZERO 160
/* candidate ratios max|x| / δ the encoder tries, per B (the box reaches 2^(B−1) − ½ on both sides and
 * 2^(B−1) below): the lower the rate, the more of the tail is clipped. Tuned on N(0,1) at d = 64 and 128
 * (B = 2: {1.5 .. 2.25} 9.40 / 8.91 dB, {2.25 .. 3} 9.89 / 9.74, {2.75 .. 3.5} 9.69 / 9.74; B = 3:
 * {3.5 .. 5} 15.35 / 15.05, {4 .. 5.5} 15.36 / 15.10, {5 .. 6.5} 14.81 / 14.94); B = 4 is pinned by its
 * SHA-256 */
#define N_RATIO 4
static const float k_ratio[3][N_RATIO] = {
    {2.25f, 2.5f, 2.75f, 3.0f}, /* B = 2 */
    {4.0f, 4.5f, 5.0f, 5.5f},   /* B = 3 */
    {7.5f, 8.0f, 8.5f, 9.0f},   /* B = 4 */
};

/* 2^(j/8), j = 0..7, correctly rounded to binary32: δ(e) = ldexp(frac[e & 7], (e >> 3) − 20), exact */
static const float k_frac[8] = {0x1p+0f,        0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                                0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};

float e8kv_box_step(unsigned e) {
    return ldexpf(k_frac[e & 7u], (int)(e >> 3) - STEP_ZERO / 8);
}

static float g_half[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void build_half(void) {
    for (unsigned e = 1; e < 256; e++)
        g_half[e] = 0.5f * e8kv_box_step(e); /* exact: a power of 2 */
}

const float *e8kv_box_half_steps(void) {
    pthread_once(&g_once, build_half);
    return g_half;
}

size_t e8kv_box_vector_bytes(size_t d, int bits) {
    assert(bits >= 2 && bits <= 4 && d % 8 == 0);
    return 1 + (d + 63) / 64 + d * (size_t)bits / 8;
}

void e8kv_box_field_pos(size_t d, unsigned w, size_t i, size_t *byte, unsigned *shift) {
    const size_t G = 128 / w, g = i / G, m = d - G * g < G ? d - G * g : G, nb = m * w / 8, j = i - G * g;
    *byte = 16 * g + j % nb;
    *shift = w * (unsigned)(j / nb);
}

static inline int32_t floor_div(int32_t a, int32_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* Nearest point of one coset (k) of E8 within the box of B bits to X / 2^FX (one block), doubled
 * coordinates p2; returns the squared distance in fixed-point units. Per coordinate the nearest allowed
 * value (clamped into the box); if Σ p2 ≢ 0 (mod 4), the single change by ±2 that keeps the box and costs
 * least (first coordinate, then the downward move, on equal cost): exact for D8 ∩ box and its translate,
 * since a parity-correct point differs from the per-coordinate optimum in an odd number of steps of 2 in
 * some coordinate, each coordinate's cost is convex along its allowed values, and one ±2 step is the
 * cheapest such change. */
static int64_t nearest_coset(int32_t p2[8], const int32_t X[8], int k, int bits) {
    const int32_t top = 1 << bits, lo = k ? 1 - top : -top, hi = k ? top - 1 : top - 2;
    int32_t sum = 0;
    int64_t dist = 0;
    for (int i = 0; i < 8; i++) {
        /* p2 of parity k nearest to 2X/2^FX: round (X − k·H)/ONE to an integer m, p2 = 2m + k */
        const int32_t m = floor_div(X[i] - k * E8KV_FX_HALF + E8KV_FX_HALF, E8KV_FX_ONE); /* ties up */
        int32_t v = 2 * m + k;
        v = v < lo ? lo : v > hi ? hi : v;
        p2[i] = v;
        sum += v;
        const int64_t e = (int64_t)X[i] - (int64_t)v * E8KV_FX_HALF;
        dist += e * e;
    }
    if (((sum % 4) + 4) % 4 == 0) return dist;
    int best_i = -1, best_s = 0;
    int64_t best_c = INT64_MAX;
    for (int i = 0; i < 8; i++)
        for (int s = -2; s <= 2; s += 4) {
            const int32_t v = p2[i] + s;
            if (v < lo || v > hi) continue;
            const int64_t e0 = (int64_t)X[i] - (int64_t)p2[i] * E8KV_FX_HALF,
                          e1 = (int64_t)X[i] - (int64_t)v * E8KV_FX_HALF;
            const int64_t c = e1 * e1 - e0 * e0;
            if (c < best_c) {
                best_c = c;
                best_i = i;
                best_s = s;
            }
        }
    assert(best_i >= 0); /* a box of at least 4 values per coordinate always leaves a move */
    p2[best_i] += best_s;
    return dist + best_c;
}

/* Nearest E8 point in the box: the closer coset (D8 on equal distance). */
int64_t e8kv_box_nearest_ref(int32_t p2[8], const float *restrict x, float k, int bits) {
    int32_t X[8], a[8], b[8];
    for (int i = 0; i < 8; i++)
        X[i] = e8kv_fx_round(x[i] * k);
    const int64_t da = nearest_coset(a, X, 0, bits), db = nearest_coset(b, X, 1, bits);
    memcpy(p2, db < da ? b : a, sizeof a);
    return db < da ? db : da;
}

/* Write field value f (w bits) of value i into the plane at pl. */
static inline void put_field(uint8_t *pl, size_t d, unsigned w, size_t i, uint32_t f) {
    size_t byte;
    unsigned shift;
    e8kv_box_field_pos(d, w, i, &byte, &shift);
    pl[byte] |= (uint8_t)(f << shift);
}

static inline uint32_t get_field(const uint8_t *pl, size_t d, unsigned w, size_t i) {
    size_t byte;
    unsigned shift;
    e8kv_box_field_pos(d, w, i, &byte, &shift);
    return (uint32_t)(pl[byte] >> shift) & ((1u << w) - 1u);
}

static size_t encode(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x) {
    const int bits = codec->bits;
    const size_t d = codec->head_dim, nb = e8kv_box_vector_bytes(d, bits), n_cos = (d + 63) / 64;
    const float *const ratio = k_ratio[bits - 2];
    const int avx2 = e8kv_cpu_has_avx2();
    float amax = 0.0f;
    for (size_t i = 0; i < d; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax; /* inputs are finite (screened by the codec) */
    }
    /* every candidate step above the grid: refused before anything is written */
    if (!(8.0 * log2((double)amax / ratio[N_RATIO - 1]) + STEP_ZERO < 255.5)) return E8KV_ERR(RANGE);
    memset(dst, 0, nb);
    if (amax == 0.0f) return 0;
    /* candidate steps: e nearest to log2(max/ratio) on the grid; the one with the least squared error */
    int32_t best[E8KV_MAX_HEAD_DIM];
    double best_err = INFINITY;
    unsigned best_e = 0, prev_e = 0;
    for (size_t r = 0; r < N_RATIO; r++) {
        const double want = 8.0 * log2((double)amax / ratio[r]) + STEP_ZERO;
        if (!(want < 255.5)) continue; /* this ratio's step is above the grid; a larger ratio fits */
        const unsigned e = want < 1.0 ? 1u : (unsigned)lround(want);
        if (e == prev_e) continue;
        prev_e = e;
        const float delta = e8kv_box_step(e), k = (float)E8KV_FX_ONE / delta;
        int32_t p2[E8KV_MAX_HEAD_DIM];
        int64_t dist = 0;
        for (size_t j = 0; j < d; j += 8)
            dist += avx2 ? e8kv_box_nearest_avx2(p2 + j, x + j, k, bits)
                         : e8kv_box_nearest_ref(p2 + j, x + j, k, bits);
        const double err = (double)dist * ((double)delta * delta); /* in units of x² · 2^(2·FX) */
        if (err < best_err) {
            best_err = err;
            best_e = e;
            memcpy(best, p2, d * sizeof *p2);
        }
    }
    dst[0] = (uint8_t)best_e;
    uint8_t *const pl = dst + 1 + n_cos;
    const int32_t top = 1 << bits;
    for (size_t j = 0; j < d; j += 8) {
        const int32_t k = best[j] & 1;
        dst[1 + j / 64] |= (uint8_t)(k << ((j / 8) % 8));
        for (size_t i = j; i < j + 8; i++) {
            const uint32_t n = (uint32_t)(best[i] + top - k) / 2; /* 0 .. 2^B − 1 */
            if (bits == 4) {
                put_field(pl, d, 4, i, n);
            } else {
                put_field(pl, d, 2, i, n & 3u);
                if (bits == 3) put_field(pl + d / 4, d, 1, i, n >> 2);
            }
        }
    }
    return 0;
}

void e8kv_box_decode_ref(float *restrict y, const uint8_t *restrict src, size_t d, int bits) {
    const size_t n_cos = (d + 63) / 64;
    const float h = e8kv_box_half_steps()[src[0]];
    const uint8_t *const pl = src + 1 + n_cos;
    const int32_t top = 1 << bits;
    for (size_t i = 0; i < d; i++) {
        const int32_t n = (int32_t)(bits == 4 ? get_field(pl, d, 4, i)
                                              : get_field(pl, d, 2, i) |
                                                    (bits == 3 ? get_field(pl + d / 4, d, 1, i) << 2 : 0u));
        const int32_t k = (src[1 + i / 64] >> ((i / 8) % 8)) & 1;
        y[i] = (float)(2 * n - top + k) * h;
    }
}

static void decode(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src) {
    if (codec->head_dim % 32 == 0 && e8kv_cpu_has_avx2()) /* bit-identical twin */
        e8kv_box_decode_avx2(y, src, codec->head_dim, codec->bits);
    else
        e8kv_box_decode_ref(y, src, codec->head_dim, codec->bits);
}

static const e8kv_quant_ops k_ops = {encode, decode, NULL};

size_t e8kv_quant_init_e8box(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    /* whole bits 2, 3 or 4: one field of B bits per value */
    if (spec->rate8 != 16 && spec->rate8 != 24 && spec->rate8 != 32) return E8KV_ERR(RATE);
    if (codec->head_dim % 8) return E8KV_ERR(HEAD_DIM);
    codec->bits = spec->rate8 / 8;
    codec->vector_bytes = e8kv_box_vector_bytes(codec->head_dim, codec->bits);
    codec->ops = &k_ops;
    if (codec->head_dim % 32) codec->traits.reader = E8KV_READER_NONE; /* the fused reader: 32 at a time */
    /* the integer-domain attention tiles read the 4-bit code; the GPU cache the 4- and 3-bit codes */
    codec->traits.attn_int = codec->bits == 4;
    codec->traits.gpu = codec->bits == 4   ? E8KV_GPU_E8BOX4
                        : codec->bits == 3 ? E8KV_GPU_E8BOX3
                                           : E8KV_GPU_NONE;
    return 0;
}
