/* e8box:B (B = 4, 3, 2), E8 points in a box with B bits per value (layout and rationale in e8_box.c; bytes
 * in doc/format.md §2.4). The codec glue is e8kv_quant_init_e8box (codec.h); the reader twins live here
 * so the cache's attention path and the tests share them. */
#ifndef E8KV_E8_BOX_H
#define E8KV_E8_BOX_H

#include "codec.h"

/* Bytes of one vector: 1 + ceil(d/64) + bits·d/8 (bits 2, 3 or 4). */
size_t e8kv_box_vector_bytes(size_t head_dim, int bits);
/* Where value i (of d) lies in a plane of w-bit fields (w = 1, 2, 4): byte offset within the plane and
 * the field's lowest bit (doc/format.md §2.4). */
void e8kv_box_field_pos(size_t d, unsigned w, size_t i, size_t *byte, unsigned *shift);
/* The step of step code e (1..255): 2^((e − 160)/8), exact in binary32. */
float e8kv_box_step(unsigned e);
/* δ(e)/2 for every step code (index 0: the zero vector, 0), built once. */
const float *e8kv_box_half_steps(void);
/* Decode one vector of d values (the rotated domain) of e8box:bits. _avx2: d % 32 == 0, bit-identical. */
void e8kv_box_decode_ref(float *restrict y, const uint8_t *restrict src, size_t d, int bits);
void e8kv_box_decode_avx2(float *restrict y, const uint8_t *restrict src, size_t d, int bits);

/* One block of the encoder: X_i = round-half-even(x_i · k) (clamped to ±2^24 fixed-point units), then the
 * nearest E8 point of the box of `bits` bits to X / 2^E8KV_FX_BITS in doubled coordinates p2
 * (doc/format.md §2.4 tie rules); returns the squared distance in fixed-point units. _avx2 is
 * bit-identical. */
int64_t e8kv_box_nearest_ref(int32_t p2[8], const float *restrict x, float k, int bits);
int64_t e8kv_box_nearest_avx2(int32_t p2[8], const float *restrict x, float k, int bits);

size_t e8kv_quant_init_e8box(e8kv_codec_t *codec, const e8kv_spec *spec);

#endif
