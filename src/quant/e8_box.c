/* e8box:4: E8 points in a box, 4 bits per value with every coordinate its own nibble.
 *
 * The fixed-rate E8 code built for reading speed. E8 = D8 ∪ (D8 + ½) (Conway & Sloane, SPLAG ch. 4 §8.1);
 * in doubled coordinates p2 = 2p the points with p2_i = 2n_i − 16 + k, n_i ∈ 0..15, coset k ∈ {0, 1}, and
 * Σ n_i even (⇔ Σ p2 ≡ 0 mod 4) are the E8 points of the box [−8, 7]⁸ (k = 0) ∪ [−7.5, 7.5]⁸ (k = 1):
 * 2^32 points, one per unit volume, the lattice's granular gain (0.65 dB over a scalar grid) with the
 * cube's shape. Each coordinate is a nibble and each block's coset a bit, so a reader turns bytes into
 * lattice coordinates with shifts, masks and one broadcast: no table, no parity sum (the constraint
 * Σ n even is spent as redundancy instead of being implied, and the coset bits sit in their own bytes).
 * A per-vector step δ on a 1/8-octave grid, chosen by the encoder among a few candidates around the
 * largest coordinate (clipping a tail coordinate is cheaper than coarsening all of them). Measured on
 * N(0,1): 21.1 dB at 4.25 bits per value (e8:4: 21.3, q4_0h: 21.3 at 4.5; BENCHMARKS.md).
 *
 * Vector layout (doc/format.md §2.4), head_dim d (a multiple of 8), 1 + ⌈d/64⌉ + d/2 bytes:
 *   u8 e          δ = 2^((e − 160)/8); e = 0: the zero vector
 *   ⌈d/64⌉ bytes  coset bits: block b (values 8b..8b+7) in bit b % 8 of byte b / 8
 *   d/2 bytes     nibbles, in groups of up to 32 values: group g holds values [32g, 32g + m), m ≤ 32, in
 *                 m/2 bytes; byte i of the group: low nibble value 32g + i, high nibble value 32g + m/2 + i
 * Value i of block b decodes to (δ/2)·(2n_i − 16 + k_b). */
#include "e8_box.h"

#include "../common/cpu.h"
#include "voronoi.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#define STEP_ZERO 160
/* candidate ratios max|x| / δ the encoder tries (the box reaches 7.5 / 8); tuned on N(0,1) */
static const float k_ratio[] = {7.5f, 8.0f, 8.5f, 9.0f};
#define N_RATIO (sizeof k_ratio / sizeof k_ratio[0])

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

size_t e8kv_box_vector_bytes(size_t d) {
    return 1 + (d + 63) / 64 + d / 2;
}

/* Nibble position of value i: (byte offset within the nibble area, high nibble?) */
static inline void nibble_pos(size_t d, size_t i, size_t *byte, int *high) {
    const size_t g = i / 32, m = d - 32 * g < 32 ? d - 32 * g : 32, j = i - 32 * g;
    *byte = 16 * g + (j < m / 2 ? j : j - m / 2);
    *high = j >= m / 2;
}

static inline int32_t floor_div(int32_t a, int32_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* Nearest point of one coset (k) of E8 within the box to X / 2^FX (one block), doubled coordinates p2;
 * returns the squared distance in fixed-point units. Per coordinate the nearest allowed value (clamped
 * into the box); if Σ p2 ≢ 0 (mod 4), the single change by ±2 that keeps the box and costs least (first
 * coordinate, then the downward move, on equal cost): exact for D8 ∩ box and its translate, since a
 * parity-correct point differs from the per-coordinate optimum in an odd number of coordinates and one
 * ±2 step is the cheapest such change. */
static int64_t nearest_coset(int32_t p2[8], const int32_t X[8], int k) {
    const int32_t lo = k ? -15 : -16, hi = k ? 15 : 14;
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
    assert(best_i >= 0); /* a box of 16 values per coordinate always leaves a move */
    p2[best_i] += best_s;
    return dist + best_c;
}

/* Nearest E8 point in the box: the closer coset (D8 on equal distance). */
int64_t e8kv_box_nearest_ref(int32_t p2[8], const float *restrict x, float k) {
    int32_t X[8], a[8], b[8];
    for (int i = 0; i < 8; i++)
        X[i] = e8kv_fx_round(x[i] * k);
    const int64_t da = nearest_coset(a, X, 0), db = nearest_coset(b, X, 1);
    memcpy(p2, db < da ? b : a, sizeof a);
    return db < da ? db : da;
}

static size_t encode(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x) {
    const size_t d = codec->head_dim, nb = e8kv_box_vector_bytes(d), n_cos = (d + 63) / 64;
    const int avx2 = e8kv_cpu_has_avx2();
    float amax = 0.0f;
    for (size_t i = 0; i < d; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax; /* inputs are finite (screened by the codec) */
    }
    /* every candidate step above the grid: refused before anything is written */
    if (!(8.0 * log2((double)amax / k_ratio[N_RATIO - 1]) + STEP_ZERO < 255.5)) return E8KV_ERR(RANGE);
    memset(dst, 0, nb);
    if (amax == 0.0f) return 0;
    /* candidate steps: e nearest to log2(max/ratio) on the grid; the one with the least squared error */
    int32_t best[E8KV_MAX_HEAD_DIM];
    double best_err = INFINITY;
    unsigned best_e = 0, prev_e = 0;
    for (size_t r = 0; r < N_RATIO; r++) {
        const double want = 8.0 * log2((double)amax / k_ratio[r]) + STEP_ZERO;
        if (!(want < 255.5)) continue; /* this ratio's step is above the grid; a larger ratio fits */
        const unsigned e = want < 1.0 ? 1u : (unsigned)lround(want);
        if (e == prev_e) continue;
        prev_e = e;
        const float delta = e8kv_box_step(e), k = (float)E8KV_FX_ONE / delta;
        int32_t p2[E8KV_MAX_HEAD_DIM];
        int64_t dist = 0;
        for (size_t j = 0; j < d; j += 8)
            dist += avx2 ? e8kv_box_nearest_avx2(p2 + j, x + j, k) : e8kv_box_nearest_ref(p2 + j, x + j, k);
        const double err = (double)dist * ((double)delta * delta); /* in units of x² · 2^(2·FX) */
        if (err < best_err) {
            best_err = err;
            best_e = e;
            memcpy(best, p2, d * sizeof *p2);
        }
    }
    dst[0] = (uint8_t)best_e;
    uint8_t *const nib = dst + 1 + n_cos;
    for (size_t j = 0; j < d; j += 8) {
        const int32_t k = best[j] & 1;
        dst[1 + j / 64] |= (uint8_t)(k << ((j / 8) % 8));
        for (size_t i = j; i < j + 8; i++) {
            const uint32_t n = (uint32_t)(best[i] + 16 - k) / 2; /* 0..15 */
            size_t byte;
            int high;
            nibble_pos(d, i, &byte, &high);
            nib[byte] |= (uint8_t)(high ? n << 4 : n);
        }
    }
    return 0;
}

void e8kv_box_decode_ref(float *restrict y, const uint8_t *restrict src, size_t d) {
    const size_t n_cos = (d + 63) / 64;
    const float h = e8kv_box_half_steps()[src[0]];
    const uint8_t *const nib = src + 1 + n_cos;
    for (size_t i = 0; i < d; i++) {
        size_t byte;
        int high;
        nibble_pos(d, i, &byte, &high);
        const int32_t n = high ? nib[byte] >> 4 : nib[byte] & 15;
        const int32_t k = (src[1 + i / 64] >> ((i / 8) % 8)) & 1;
        y[i] = (float)(2 * n - 16 + k) * h;
    }
}

static void decode(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src) {
    e8kv_box_decode_ref(y, src, codec->head_dim);
}

static const e8kv_quant_ops k_ops = {encode, decode, NULL};

size_t e8kv_quant_init_e8box(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    if (spec->rate8 != 32) return E8KV_ERR(RATE); /* 4 bits: one nibble per value */
    if (codec->head_dim % 8) return E8KV_ERR(HEAD_DIM);
    codec->bits = 4;
    codec->vector_bytes = e8kv_box_vector_bytes(codec->head_dim);
    codec->ops = &k_ops;
    return 0;
}
