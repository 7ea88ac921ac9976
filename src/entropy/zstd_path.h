/* The delta + zstd path of the cold tier: rows (token axis) are delta-coded column by column, then the
 * page goes through ZSTD_compress. Delta works on elem_bytes-wide little-endian integers modulo
 * 2^(8·elem_bytes) (1: codec bytes, 2: int16 E8 coordinates), so it is exactly invertible. */
#ifndef E8KV_ZSTD_PATH_H
#define E8KV_ZSTD_PATH_H

#include "common/common.h"

size_t e8kv_zstd_page_bound(size_t n_bytes);
/* rows: n_rows x row_bytes; row_bytes must be a multiple of elem_bytes (1 or 2). */
size_t e8kv_zstd_page_encode(uint8_t *dst, size_t dst_capacity, const uint8_t *rows, size_t row_bytes,
                             size_t n_rows, size_t elem_bytes, int delta, int level);
/* Decode exactly n_rows x row_bytes bytes from exactly src_size bytes. */
size_t e8kv_zstd_page_decode(uint8_t *rows, size_t row_bytes, size_t n_rows, const uint8_t *src,
                             size_t src_size, size_t elem_bytes, int delta);

#endif
