/* kivi:B, the KIVI-style asymmetric integer format as a peer (after Liu et al., "KIVI: A Tuning-Free
 * Asymmetric 2bit Quantization for KV Cache", ICML 2024): keys quantized per channel over groups of 32
 * tokens, values per token over groups of 32 values, both with an fp16 minimum and an fp16 step
 * (asymmetric min/max rounding to 2^B levels), and the newest tokens exact (the cache's window=, KIVI's
 * residual; a cache keeps a token-group page exact until it is full anyway).
 *
 * Per-channel key statistics span tokens, which one vector's bytes cannot hold: this is a token-group
 * codec (codec.h) with G = 32. Both streams take the same bytes per token, vector_bytes = head_dim·(B+1)/8
 * (head_dim a multiple of 32, B = 1..4): side information 32 bits per 32 values either way, so the rate is
 * B + 1 bits per value (KIVI-2: 3 bits), every side byte counted. Layout of a group (doc/format.md §2.5):
 *   K: bytes [0, 4d): per channel c, fp16 minimum m_c then fp16 step s_c (little-endian);
 *      then G·d fields of B bits, field t·d + c the level of token t, channel c (bitpack.h)
 *   V: G slots of vector_bytes, slot t: per 32-value chunk j, fp16 m_j then fp16 s_j (d/8 bytes), then
 *      d fields of B bits, field c the level of value c
 * A value decodes to m + q·s (f32 arithmetic on the fp16 fields). Encode: m = fp16(min), s = fp16((max −
 * m) / (2^B − 1)), q = clamp(round-half-away((x − m) / s), 0, 2^B − 1), q = 0 when s = 0. A minimum or
 * step that fp16 cannot hold (|x| >= 65520, or a range over 65504·(2^B − 1)) is E8KV_ERROR_RANGE. */
#include "bitpack.h"
#include "codec.h"

#include "common/fp16.h"

#include <math.h>

#define KIVI_GROUP 32 /* tokens per key group, values per value chunk */

/* fp16 minimum and step of values in [lo, hi] for L levels; 0 or RANGE */
static size_t minmax_fields(float lo, float hi, unsigned levels, uint16_t *hm, uint16_t *hs) {
    if (!(fabsf(lo) < 65520.0f) || !(fabsf(hi) < 65520.0f)) return E8KV_ERR(RANGE);
    *hm = e8kv_fp32_to_fp16(lo);
    const float m = e8kv_fp16_to_fp32(*hm);
    const float step = (hi - m) / (float)(levels - 1);
    if (!(step < 65520.0f)) return E8KV_ERR(RANGE);
    *hs = e8kv_fp32_to_fp16(step > 0.0f ? step : 0.0f);
    return 0;
}

static unsigned level_of(float x, float m, float s, unsigned levels) {
    if (!(s > 0.0f)) return 0;
    const float u = (x - m) / s;
    if (!(u > 0.0f)) return 0;
    const float r = floorf(u + 0.5f);
    return r >= (float)(levels - 1) ? levels - 1 : (unsigned)r;
}

static size_t kivi_encode_group(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x,
                                int is_key) {
    const size_t d = c->head_dim, G = KIVI_GROUP, vb = c->vector_bytes;
    const unsigned B = (unsigned)c->bits, levels = 1u << B;
    memset(dst, 0, G * vb);
    if (is_key) {
        uint8_t *const codes = dst + 4 * d;
        for (size_t ch = 0; ch < d; ch++) {
            float lo = x[ch], hi = x[ch];
            for (size_t t = 1; t < G; t++) {
                lo = fminf(lo, x[t * d + ch]);
                hi = fmaxf(hi, x[t * d + ch]);
            }
            uint16_t hm, hs;
            E8KV_RETURN_IF_ERROR(minmax_fields(lo, hi, levels, &hm, &hs));
            e8kv_store_le16(dst + 4 * ch, hm);
            e8kv_store_le16(dst + 4 * ch + 2, hs);
            const float m = e8kv_fp16_to_fp32(hm), s = e8kv_fp16_to_fp32(hs);
            for (size_t t = 0; t < G; t++)
                e8kv_bits_put(codes, (t * d + ch) * B, B, level_of(x[t * d + ch], m, s, levels));
        }
        return 0;
    }
    for (size_t t = 0; t < G; t++) {
        uint8_t *const slot = dst + t * vb, *const codes = slot + d / 8;
        const float *const xt = x + t * d;
        for (size_t j = 0; j < d / KIVI_GROUP; j++) {
            const float *const xc = xt + j * KIVI_GROUP;
            float lo = xc[0], hi = xc[0];
            for (size_t i = 1; i < KIVI_GROUP; i++) {
                lo = fminf(lo, xc[i]);
                hi = fmaxf(hi, xc[i]);
            }
            uint16_t hm, hs;
            E8KV_RETURN_IF_ERROR(minmax_fields(lo, hi, levels, &hm, &hs));
            e8kv_store_le16(slot + 4 * j, hm);
            e8kv_store_le16(slot + 4 * j + 2, hs);
            const float m = e8kv_fp16_to_fp32(hm), s = e8kv_fp16_to_fp32(hs);
            for (size_t i = 0; i < KIVI_GROUP; i++)
                e8kv_bits_put(codes, (j * KIVI_GROUP + i) * B, B, level_of(xc[i], m, s, levels));
        }
    }
    return 0;
}

static void kivi_decode_group(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src,
                              size_t t0, size_t n, int is_key) {
    const size_t d = c->head_dim, vb = c->vector_bytes;
    const unsigned B = (unsigned)c->bits;
    if (is_key) {
        const uint8_t *const codes = src + 4 * d;
        for (size_t ch = 0; ch < d; ch++) {
            const float m = e8kv_fp16_to_fp32(e8kv_load_le16(src + 4 * ch));
            const float s = e8kv_fp16_to_fp32(e8kv_load_le16(src + 4 * ch + 2));
            for (size_t t = 0; t < n; t++)
                y[t * d + ch] = m + (float)e8kv_bits_get(codes, ((t0 + t) * d + ch) * B, B) * s;
        }
        return;
    }
    for (size_t t = 0; t < n; t++) {
        const uint8_t *const slot = src + (t0 + t) * vb, *const codes = slot + d / 8;
        for (size_t j = 0; j < d / KIVI_GROUP; j++) {
            const float m = e8kv_fp16_to_fp32(e8kv_load_le16(slot + 4 * j));
            const float s = e8kv_fp16_to_fp32(e8kv_load_le16(slot + 4 * j + 2));
            for (size_t i = 0; i < KIVI_GROUP; i++) {
                const size_t ch = j * KIVI_GROUP + i;
                y[t * d + ch] = m + (float)e8kv_bits_get(codes, ch * B, B) * s;
            }
        }
    }
}

static const e8kv_quant_ops k_kivi_ops = {NULL, NULL, NULL};
static const e8kv_group_ops k_kivi_group = {kivi_encode_group, kivi_decode_group};

size_t e8kv_quant_init_kivi(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    if (spec->bits < 1 || spec->bits > 4 || spec->rate8 != 8 * spec->bits) return E8KV_ERR(RATE);
    if (codec->head_dim % KIVI_GROUP) return E8KV_ERR(HEAD_DIM);
    codec->ops = &k_kivi_ops;
    codec->group = &k_kivi_group;
    codec->group_tokens = KIVI_GROUP;
    codec->vector_bytes = codec->head_dim * (size_t)(spec->bits + 1) / 8;
    return 0;
}
