/* kakeya[:q=Q], the "KakeyaLattice" package's q_range operating points as a format (peer). q_range Q at
 * that package's meaning: after the seeded random-sign Hadamard rotation, the step is δ = max|x_i| / Q, so
 * every coordinate lies within ±Q steps (the clamp), and each block of 4 values is the nearest point of
 * the D4 lattice (integer vectors with an even sum) to x/δ, pulled back into the cube [−Q, Q]^4 when the
 * parity fix steps outside it (a coordinate at Q + 1 moves to Q − 1, which keeps the sum even). The
 * points of D4 in the cube are named by an index in [0, (2Q+1)^3·(Q+1)): the first three coordinates in
 * base 2Q+1, the fourth, whose parity the first three fix, as one of at most Q + 1 values. So a block
 * costs nb = ⌈log2((2Q+1)^3·(Q+1))⌉ bits, about 4·log2(2Q+1) − 1, and a vector 32 + (d/4)·nb bits: at
 * head_dim 128 and Q = 38, 32 + 32·25 = 832 bits per token and head, the package's figure (6.5 bits per
 * value; 6.75 at head_dim 64). Operating points Q = 10 / 38 / 152; any integer Q from 1 to 8192
 * (E8KV_ERROR_Q_RANGE otherwise); no q= means 38. The package's unit-norm factorization and per-vector
 * scale together are the one f32 step here (32 side bits, as in its count).
 *
 * Vector layout (doc/format.md §2.8), head_dim d a multiple of 8 (the rotation), ⌈(32 + (d/4)·nb)/8⌉ bytes:
 *   f32 δ (little-endian); 0: the zero vector
 *   d/4 fields of nb bits (bitpack.h), field b the index of block b:
 *     index = ((a0·(2Q+1) + a1)·(2Q+1) + a2)·(Q+1) + j,  a_i = v_i + Q,
 *     v3 = 2j + ((v0 + v1 + v2 + Q) mod 2) − Q
 * Decode: y_i = δ·v_i (digits beyond their range, which no encode writes, are clamped). */
#include "bitpack.h"
#include "codec.h"
#include "lattice.h"

#include <math.h>
#include <stdlib.h>

#define KAKEYA_DEFAULT_Q 38
#define KAKEYA_MAX_Q 8192

typedef struct {
    int q;
    unsigned nb; /* bits per 4-value block */
} kakeya_state;

static size_t kakeya_encode(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x) {
    const kakeya_state *const st = c->state;
    const size_t d = c->head_dim;
    const int Q = st->q;
    memset(dst, 0, c->vector_bytes);
    float a = 0.0f;
    for (size_t i = 0; i < d; i++)
        a = fmaxf(a, fabsf(x[i]));
    const float step = a / (float)Q;
    if (!(step < INFINITY)) return E8KV_ERR(RANGE);
    e8kv_store_lef32(dst, step);
    uint8_t *const fields = dst + 4;
    for (size_t b = 0; b < d / 4; b++) {
        float y[4];
        int32_t y2[4], v[4];
        for (int i = 0; i < 4; i++)
            y[i] = step > 0.0f ? x[4 * b + i] / step : 0.0f;
        e8kv_d4_nearest(y2, y);
        for (int i = 0; i < 4; i++) {
            v[i] = y2[i] / 2;
            if (v[i] > Q) v[i] -= 2; /* at most Q + 1: one step back keeps the sum even */
            if (v[i] < -Q) v[i] += 2;
        }
        const uint64_t W = 2 * (uint64_t)Q + 1;
        const uint64_t a3 = (uint64_t)(v[3] + Q);
        const uint64_t idx = (((uint64_t)(v[0] + Q) * W + (uint64_t)(v[1] + Q)) * W + (uint64_t)(v[2] + Q)) *
                                 ((uint64_t)Q + 1) +
                             a3 / 2;
        e8kv_bits_put(fields, b * st->nb, st->nb, idx);
    }
    return 0;
}

static void kakeya_decode(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src) {
    const kakeya_state *const st = c->state;
    const size_t d = c->head_dim;
    const int Q = st->q;
    const uint64_t W = 2 * (uint64_t)Q + 1;
    const float step = e8kv_load_lef32(src);
    const uint8_t *const fields = src + 4;
    for (size_t b = 0; b < d / 4; b++) {
        uint64_t idx = e8kv_bits_get(fields, b * st->nb, st->nb);
        uint64_t j = idx % ((uint64_t)Q + 1);
        idx /= (uint64_t)Q + 1;
        int64_t v[4];
        v[2] = (int64_t)(idx % W) - Q;
        idx /= W;
        v[1] = (int64_t)(idx % W) - Q;
        idx /= W;
        v[0] = (int64_t)(idx < W ? idx : W - 1) - Q;
        const int64_t par = (v[0] + v[1] + v[2] + Q) & 1;
        if (2 * (int64_t)j + par > 2 * (int64_t)Q) j = (uint64_t)Q - (uint64_t)par;
        v[3] = 2 * (int64_t)j + par - Q;
        for (int i = 0; i < 4; i++)
            y[4 * b + i] = step * (float)v[i];
    }
}

static void kakeya_destroy(e8kv_codec_t *c) {
    free(c->state);
    c->state = NULL;
}

static const e8kv_quant_ops k_kakeya_ops = {kakeya_encode, kakeya_decode, kakeya_destroy};

size_t e8kv_quant_init_kakeya(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->rate8) return E8KV_ERR(SPEC); /* the rate follows from Q */
    const float qf = spec->q_range > 0.0f ? spec->q_range : (float)KAKEYA_DEFAULT_Q;
    if (qf != floorf(qf) || qf < 1.0f || qf > (float)KAKEYA_MAX_Q) return E8KV_ERR(Q_RANGE);
    if (codec->head_dim % 8) return E8KV_ERR(HEAD_DIM);
    kakeya_state *st = calloc(1, sizeof *st);
    if (!st) return E8KV_ERR(OUT_OF_MEMORY);
    st->q = (int)qf;
    const uint64_t W = 2 * (uint64_t)st->q + 1, count = W * W * W * ((uint64_t)st->q + 1);
    st->nb = 1;
    while (st->nb < 64 && (1ull << st->nb) < count)
        st->nb++;
    codec->state = st;
    codec->ops = &k_kakeya_ops;
    codec->bits = 0;
    codec->q_range = qf;
    codec->vector_bytes = (32 + codec->head_dim / 4 * st->nb + 7) / 8;
    return 0;
}
