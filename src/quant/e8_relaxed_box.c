/* e8r:B, relaxed-parity E8 at a fixed rate: the "NexusQuant"-style lattice as a selectable format. After
 * the seeded random-sign Hadamard rotation every block of 8 values is quantized to D8* = Z^8 ∪ (Z^8 + ½)
 * (E8 without its even-sum rule, e8_relaxed.c) scaled by a per-vector step δ and cut to a box, so that each
 * coordinate is B bits and each block's coset one bit: in doubled coordinates p2_i = 2n_i − 2^B + k with
 * n_i ∈ 0..2^B − 1 and the block's coset k ∈ {0, 1}. Without a parity rule the nearest point of the box is
 * exact per coordinate: in each coset round and clamp every coordinate, keep the closer coset (k = 0 on
 * equal distance). The write-up this follows entropy-codes its lattice indices; this is its fixed-rate
 * form (random access per token), its true rate B + 1/8 + 16/head_dim bits per value (2.375 at B = 2 and
 * head_dim 64).
 *
 * Vector layout (doc/format.md §2.7), head_dim d a multiple of 8, B = 2..6, 2 + ⌈d/64⌉ + d·B/8 bytes:
 *   fp16 h        the half step δ/2; 0: the zero vector
 *   ⌈d/64⌉ bytes  coset bits: block b in bit b % 8 of byte b / 8
 *   d fields of B bits (bitpack.h): n_i
 * Value i of block b decodes to h·(2n_i − 2^B + k_b). Encode: with a = max|x_i|, the half step is chosen
 * among fp16(f·a/(2^B − 1)) for f in k_frac (clipping a few tail coordinates beats coarsening all of them),
 * the one with the least squared error (the first on ties); a half step fp16 cannot hold is RANGE. */
#include "bitpack.h"
#include "codec.h"

#include "common/fp16.h"

#include <math.h>

static const float k_frac[] = {1.0f, 0.9f, 0.8f, 0.7f, 0.6f, 0.5f};
#define N_FRAC (sizeof k_frac / sizeof k_frac[0])

/* nearest box point of coset k to x/h per coordinate (n), returns the squared error in x units */
static float block_coset(unsigned n[8], const float *x, float h, unsigned B, int k) {
    const float top = (float)((1u << B) - 1), off = (float)(1u << B) - (float)k;
    float err = 0.0f;
    for (int i = 0; i < 8; i++) {
        float v = floorf((x[i] / h + off) * 0.5f + 0.5f);
        v = v < 0.0f ? 0.0f : v > top ? top : v;
        n[i] = (unsigned)v;
        const float e = x[i] - h * (2.0f * v - off);
        err += e * e;
    }
    return err;
}

/* codes of every block at half step h into n (d values) and k (d/8 blocks); returns the squared error */
static float quantize(unsigned *n, uint8_t *k, const float *x, size_t d, float h, unsigned B) {
    float total = 0.0f;
    for (size_t b = 0; b < d / 8; b++) {
        unsigned n1[8];
        const float e0 = block_coset(n + 8 * b, x + 8 * b, h, B, 0);
        const float e1 = block_coset(n1, x + 8 * b, h, B, 1);
        k[b] = e1 < e0;
        if (k[b]) memcpy(n + 8 * b, n1, sizeof n1);
        total += k[b] ? e1 : e0;
    }
    return total;
}

static size_t e8r_encode(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x) {
    const size_t d = c->head_dim;
    const unsigned B = (unsigned)c->bits;
    memset(dst, 0, c->vector_bytes);
    float a = 0.0f;
    for (size_t i = 0; i < d; i++)
        a = fmaxf(a, fabsf(x[i]));
    if (!(a < INFINITY)) return E8KV_ERR(RANGE);
    if (a == 0.0f) return 0; /* h = 0: the zero vector */
    unsigned n[E8KV_MAX_HEAD_DIM], best_n[E8KV_MAX_HEAD_DIM];
    uint8_t k[E8KV_MAX_HEAD_DIM / 8], best_k[E8KV_MAX_HEAD_DIM / 8];
    uint16_t best_h = 0;
    float best = INFINITY;
    for (size_t f = 0; f < N_FRAC; f++) {
        const uint16_t hh = e8kv_fp32_to_fp16(k_frac[f] * a / (float)((1u << B) - 1));
        const float h = e8kv_fp16_to_fp32(hh);
        if (!(h < 65520.0f)) return E8KV_ERR(RANGE);
        if (!(h > 0.0f)) continue; /* underflow: a tinier step cannot be stored */
        const float e = quantize(n, k, x, d, h, B);
        if (e < best) {
            best = e;
            best_h = hh;
            memcpy(best_n, n, d * sizeof *n);
            memcpy(best_k, k, d / 8);
        }
    }
    if (best_h == 0) return 0; /* every value below fp16's smallest step: zeros */
    e8kv_store_le16(dst, best_h);
    uint8_t *const cos = dst + 2, *const fields = cos + (d + 63) / 64;
    for (size_t b = 0; b < d / 8; b++)
        cos[b / 8] |= (uint8_t)(best_k[b] << (b % 8));
    for (size_t i = 0; i < d; i++)
        e8kv_bits_put(fields, i * B, B, best_n[i]);
    return 0;
}

static void e8r_decode(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src) {
    const size_t d = c->head_dim;
    const unsigned B = (unsigned)c->bits;
    const float h = e8kv_fp16_to_fp32(e8kv_load_le16(src));
    const uint8_t *const cos = src + 2, *const fields = cos + (d + 63) / 64;
    const int base = -(int)(1u << B);
    for (size_t i = 0; i < d; i++) {
        const int k = cos[i / 64] >> (i / 8 % 8) & 1;
        y[i] = h * (float)(2 * (int)e8kv_bits_get(fields, i * B, B) + base + k);
    }
}

static const e8kv_quant_ops k_e8r_ops = {e8r_encode, e8r_decode, NULL};

size_t e8kv_quant_init_e8r(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    if (spec->bits < 2 || spec->bits > 6 || spec->rate8 != 8 * spec->bits) return E8KV_ERR(RATE);
    if (codec->head_dim % 8) return E8KV_ERR(HEAD_DIM);
    codec->ops = &k_e8r_ops;
    codec->vector_bytes = 2 + (codec->head_dim + 63) / 64 + codec->head_dim * (size_t)spec->bits / 8;
    return 0;
}
