/* llama.cpp's q8_0 and q4_0 block formats, with exactly ggml's reference semantics
 * (quantize_row_q8_0_ref / quantize_row_q4_0_ref, dequantize_row_q8_0 / _q4_0), so bytes match
 * llama.cpp's for every input it handles. Families q8_0h / q4_0h are the same formats applied after the
 * codec's random-sign Hadamard rotation (codec.c rotates; nothing here differs).
 *
 * Blocks of 32 values, head_dim a multiple of 32 (else E8KV_ERROR_HEAD_DIM), each block:
 *   q8_0 (34 bytes, 8.5 bits/value): f16 d = amax/127, then 32 × int8 q = roundf(x·(1/d)); x̂ = q·d.
 *   q4_0 (18 bytes, 4.5 bits/value): m = the value of largest magnitude WITH its sign (first one on a
 *        tie), f16 d = m/-8, q = min(15, (int)(x·(1/d) + 8.5)), 16 bytes qs[j] = q[j] | q[j+16] << 4;
 *        x̂ = (q - 8)·d.
 * The quants use the f32 scale before it is rounded to f16, as ggml does. Where ggml's formula is
 * undefined we define it: when 1/d is not finite (d = 0, or |d| < 2^-128 which rounds to f16 zero
 * anyway) the reciprocal is taken as 0, giving q = 0 (q8_0) or q = 8 (q4_0), so the block decodes to
 * zeros. A scale that rounds to f16 infinity (amax/127 or amax/8 >= 65520) is E8KV_ERROR_RANGE, and so is
 * a non-finite value after the rotation (overflow of a huge input); nothing is written then.
 * The products and sums below must not be contracted into FMAs (this file is compiled without -mfma). */
#include "codec.h"

#include "common/fp16.h"

#include <float.h>
#include <math.h>

#define QK 32
#define Q8_0_BLOCK_BYTES (2 + QK)
#define Q4_0_BLOCK_BYTES (2 + QK / 2)

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* 1/d, or 0 where that is not a finite number (see the header). */
static float safe_recip(const float d) {
    if (d == 0.0f) return 0.0f;
    const float id = 1.0f / d;
    return isfinite(id) ? id : 0.0f;
}

static int scale_fits(const float d) { return isfinite(e8kv_fp16_to_fp32(e8kv_fp32_to_fp16(d))); }

/* roundf (half away from zero) for |v| < 2^31, without a libm call: v - trunc(v) is exact. */
static inline int32_t round_half_away_i32(const float v) {
    const int32_t t = (int32_t)v;
    const float f = v - (float)t;
    return t + (f >= 0.5f) - (f <= -0.5f);
}

/* The block scale, or NaN when the block holds a NaN or an infinity (only possible after a rotation
 * that overflowed: the codec screened its input), which the caller answers with E8KV_ERROR_RANGE. */
static float q8_0_scale(const float *restrict x) {
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        finite &= a <= FLT_MAX;
        amax = a > amax ? a : amax;
    }
    return finite ? amax / 127.0f : NAN;
}

static float q4_0_scale(const float *restrict x) {
    float amax = 0.0f, max = 0.0f;
    int finite = 1;
    for (int j = 0; j < QK; j++) {
        finite &= fabsf(x[j]) <= FLT_MAX;
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return finite ? max / -8.0f : NAN;
}

static size_t q8_0_encode(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x) {
    const size_t nb = c->head_dim / QK;
    float d[E8KV_MAX_HEAD_DIM / QK];
    for (size_t b = 0; b < nb; b++) {
        d[b] = q8_0_scale(x + b * QK);
        if (!scale_fits(d[b])) return E8KV_ERR(RANGE);
    }
    for (size_t b = 0; b < nb; b++) {
        const float *const xb = x + b * QK;
        uint8_t *const out = dst + b * Q8_0_BLOCK_BYTES;
        const float id = safe_recip(d[b]);
        e8kv_store_le16(out, e8kv_fp32_to_fp16(d[b]));
        for (int j = 0; j < QK; j++) out[2 + j] = (uint8_t)(int8_t)round_half_away_i32(xb[j] * id);
    }
    return 0;
}

static void q8_0_decode(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src) {
    const size_t nb = c->head_dim / QK;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *const in = src + b * Q8_0_BLOCK_BYTES;
        const float d = e8kv_fp16_to_fp32(e8kv_load_le16(in));
        for (int j = 0; j < QK; j++) y[b * QK + j] = (float)(int8_t)in[2 + j] * d;
    }
}

static size_t q4_0_encode(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x) {
    const size_t nb = c->head_dim / QK;
    float d[E8KV_MAX_HEAD_DIM / QK];
    for (size_t b = 0; b < nb; b++) {
        d[b] = q4_0_scale(x + b * QK);
        if (!scale_fits(d[b])) return E8KV_ERR(RANGE);
    }
    for (size_t b = 0; b < nb; b++) {
        const float *const xb = x + b * QK;
        uint8_t *const out = dst + b * Q4_0_BLOCK_BYTES;
        const float id = safe_recip(d[b]);
        e8kv_store_le16(out, e8kv_fp32_to_fp16(d[b]));
        for (int j = 0; j < QK / 2; j++) {
            const float t0 = xb[j] * id, t1 = xb[j + QK / 2] * id;
            const int q0 = (int)(t0 + 8.5f), q1 = (int)(t1 + 8.5f);
            assert(q0 >= 0 && q1 >= 0);
            const uint8_t lo = (uint8_t)(q0 < 15 ? q0 : 15), hi = (uint8_t)(q1 < 15 ? q1 : 15);
            out[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
    return 0;
}

static void q4_0_decode(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src) {
    const size_t nb = c->head_dim / QK;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *const in = src + b * Q4_0_BLOCK_BYTES;
        const float d = e8kv_fp16_to_fp32(e8kv_load_le16(in));
        for (int j = 0; j < QK / 2; j++) {
            y[b * QK + j] = (float)((int)(in[2 + j] & 0x0F) - 8) * d;
            y[b * QK + j + QK / 2] = (float)((int)(in[2 + j] >> 4) - 8) * d;
        }
    }
}

static const e8kv_quant_ops k_q8_0_ops = {q8_0_encode, q8_0_decode, NULL};
static const e8kv_quant_ops k_q4_0_ops = {q4_0_encode, q4_0_decode, NULL};

static size_t init_block(e8kv_codec_t *codec, const e8kv_spec *spec, const e8kv_quant_ops *ops,
                         size_t block_bytes, int bits) {
    if (spec->bits || spec->q_range > 0.0f) return E8KV_ERR(SPEC); /* these formats take no options */
    if (codec->head_dim == 0 || codec->head_dim % QK != 0) return E8KV_ERR(HEAD_DIM);
    codec->ops = ops;
    codec->vector_bytes = codec->head_dim / QK * block_bytes;
    codec->bits = bits;
    return 0;
}

size_t e8kv_quant_init_q8_0(e8kv_codec_t *codec, const e8kv_spec *spec) {
    return init_block(codec, spec, &k_q8_0_ops, Q8_0_BLOCK_BYTES, 8);
}

size_t e8kv_quant_init_q4_0(e8kv_codec_t *codec, const e8kv_spec *spec) {
    return init_block(codec, spec, &k_q4_0_ops, Q4_0_BLOCK_BYTES, 4);
}
