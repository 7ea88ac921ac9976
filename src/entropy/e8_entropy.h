/* Parity-aware entropy coding of E8 lattice points (doubled coordinates y2, see quant/lattice.h).
 *
 * A point of E8 = D8 ∪ (D8 + ½) is its coset bit c (y2 odd) plus v = (y2 - c) / 2 in Z^8 with an even
 * coordinate sum (for both cosets), so v_7's low bit is implied by v_0..v_6. Coded symbols per point:
 *   c                         one table
 *   v_0 .. v_6                one table per (coset, coordinate)
 *   h = (v_7 - p) / 2         p = (v_0 + ... + v_6) mod 2; one table per coset
 * so the rate approaches H(c) + sum_j H(v_j | c) + H(h | c), one bit per point below coding v_7 whole.
 * Values map to symbols by zigzag (0, -1, 1, -2, ...); zigzag >= 255 is symbol 255 followed by the
 * varint zigzag - 255 in an escape area, so any |y2| < 2^30 is representable. Layout: doc/format.md §3. */
#ifndef E8KV_E8_ENTROPY_H
#define E8KV_E8_ENTROPY_H

#include "rans.h"

#define E8KV_E8_ESCAPE 255
#define E8KV_E8_MAX_ABS (1 << 30) /* |y2| must be below this */

typedef struct {
    e8kv_rans_table coset;
    e8kv_rans_table coord[2][8]; /* [coset][coordinate]; coordinate 7 holds h */
} e8kv_e8_model;

typedef struct {
    e8kv_rans_dtable coset;
    e8kv_rans_dtable coord[2][8];
} e8kv_e8_dmodel;

/* Fit the 17 tables to n_pts points (y2: n_pts x 8). Points outside E8 or with |y2| >= 2^30:
 * E8KV_ERROR_BAD_ARGUMENT. */
size_t e8kv_e8_model_fit(e8kv_e8_model *m, const int32_t *y2, size_t n_pts);
size_t e8kv_e8_model_write(uint8_t *dst, size_t dst_capacity, const e8kv_e8_model *m);
size_t e8kv_e8_model_read(e8kv_e8_model *m, const uint8_t *src, size_t src_size);
void e8kv_e8_dmodel_init(e8kv_e8_dmodel *d, const e8kv_e8_model *m);

/* One block of points coded with a given model (the frame shares one model across its pages). */
size_t e8kv_e8_block_bound(size_t n_pts);
size_t e8kv_e8_block_encode(uint8_t *dst, size_t dst_capacity, const e8kv_e8_model *m, const int32_t *y2,
                            size_t n_pts);
/* Decode exactly n_pts points from exactly src_size bytes. */
size_t e8kv_e8_block_decode(int32_t *y2, size_t n_pts, const e8kv_e8_dmodel *d, const uint8_t *src,
                            size_t src_size);

/* A self-contained stream: varint n_pts, model, block. */
size_t e8kv_e8_stream_bound(size_t n_pts);
size_t e8kv_e8_stream_encode(void *dst, size_t dst_capacity, const int32_t *y2, size_t n_pts);
/* Returns the number of points decoded (at most y2_capacity / 8). */
size_t e8kv_e8_stream_decode(int32_t *y2, size_t y2_capacity, const void *src, size_t src_size);
/* The real coded size in bytes of the stream for these points (tables and headers counted), e.g. for
 * `e8kv bench codec` rows of entropy-coded E8. */
size_t e8kv_e8_coded_size(const int32_t *y2, size_t n_pts);

#endif
