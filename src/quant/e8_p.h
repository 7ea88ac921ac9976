/* e8p:2, 16 bits per 8 values: a 256-entry table of absolute-value patterns, 7 sign bits and a ¼ shift,
 * a subset of E8 + ¼ (layout and rationale in e8_p.c; bytes in doc/format.md §2.5). */
#ifndef E8KV_E8_P_H
#define E8KV_E8_P_H

#include "codec.h"

/* Bytes of one vector: 1 + d/4. */
size_t e8kv_e8p_vector_bytes(size_t head_dim);
/* The 256 patterns: entry t is W = Σ c_i·4^i (c_i = a_i − ½ ∈ {0, 1, 2}), increasing; built once. */
const uint16_t *e8kv_e8p_patterns(void);
/* One block's code → the point in quarter units q (x_i = q_i · δ/4, q_i odd in [−11, 11]). */
void e8kv_e8p_decode_block(int32_t q[8], unsigned code);
/* Decode one vector of d values (the rotated domain). */
void e8kv_e8p_decode_ref(float *restrict y, const uint8_t *restrict src, size_t d);
/* One block of the encoder: X_i = round-half-even(x_i · k) (clamped as e8box), then the nearest codebook
 * point to X / 2^E8KV_FX_BITS; its code to *code; returns the squared distance in fixed-point units. */
int64_t e8kv_e8p_nearest_ref(uint16_t *code, const float *restrict x, float k);

size_t e8kv_quant_init_e8p(e8kv_codec_t *codec, const e8kv_spec *spec);

#endif
