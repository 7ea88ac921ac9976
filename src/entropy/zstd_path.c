/* Delta along the token axis + zstd (see zstd_path.h). */
#include "zstd_path.h"

#include <stdlib.h>
#include <zstd.h>
#include <zstd_errors.h>

size_t e8kv_zstd_page_bound(size_t n_bytes) { return ZSTD_compressBound(n_bytes); }

static void delta_forward(uint8_t *d, const uint8_t *x, size_t row_bytes, size_t n_rows, size_t elem) {
    memcpy(d, x, row_bytes * (n_rows ? 1 : 0));
    for (size_t r = 1; r < n_rows; r++) {
        const uint8_t *a = x + r * row_bytes, *b = a - row_bytes;
        uint8_t *o = d + r * row_bytes;
        if (elem == 1) {
            for (size_t k = 0; k < row_bytes; k++) o[k] = (uint8_t)(a[k] - b[k]);
        } else {
            for (size_t k = 0; k < row_bytes; k += 2)
                e8kv_store_le16(o + k, (uint16_t)(e8kv_load_le16(a + k) - e8kv_load_le16(b + k)));
        }
    }
}

static void delta_inverse(uint8_t *x, size_t row_bytes, size_t n_rows, size_t elem) {
    for (size_t r = 1; r < n_rows; r++) {
        uint8_t *a = x + r * row_bytes;
        const uint8_t *b = a - row_bytes;
        if (elem == 1) {
            for (size_t k = 0; k < row_bytes; k++) a[k] = (uint8_t)(a[k] + b[k]);
        } else {
            for (size_t k = 0; k < row_bytes; k += 2)
                e8kv_store_le16(a + k, (uint16_t)(e8kv_load_le16(a + k) + e8kv_load_le16(b + k)));
        }
    }
}

size_t e8kv_zstd_page_encode(uint8_t *dst, size_t dst_capacity, const uint8_t *rows, size_t row_bytes,
                             size_t n_rows, size_t elem_bytes, int delta, int level) {
    if (!dst || (!rows && n_rows) || row_bytes == 0 || (elem_bytes != 1 && elem_bytes != 2) ||
        row_bytes % elem_bytes)
        return E8KV_ERR(BAD_ARGUMENT);
    if (n_rows > SIZE_MAX / row_bytes) return E8KV_ERR(BAD_ARGUMENT);
    const size_t n = n_rows * row_bytes;
    const uint8_t *in = rows;
    uint8_t *tmp = NULL;
    if (delta && n_rows > 1) {
        tmp = malloc(n);
        if (!tmp) return E8KV_ERR(OUT_OF_MEMORY);
        delta_forward(tmp, rows, row_bytes, n_rows, elem_bytes);
        in = tmp;
    }
    const size_t r = ZSTD_compress(dst, dst_capacity, in, n, level ? level : 3);
    free(tmp);
    if (ZSTD_isError(r))
        return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? E8KV_ERR(DST_TOO_SMALL) : E8KV_ERR(GENERIC);
    return r;
}

size_t e8kv_zstd_page_decode(uint8_t *rows, size_t row_bytes, size_t n_rows, const uint8_t *src,
                             size_t src_size, size_t elem_bytes, int delta) {
    if ((!rows && n_rows) || !src || row_bytes == 0 || (elem_bytes != 1 && elem_bytes != 2) ||
        row_bytes % elem_bytes || n_rows > SIZE_MAX / row_bytes)
        return E8KV_ERR(BAD_ARGUMENT);
    const size_t n = n_rows * row_bytes;
    /* the frame content size in the zstd header must say exactly n, so a bomb is refused up front */
    const unsigned long long declared = ZSTD_getFrameContentSize(src, src_size);
    if (declared == ZSTD_CONTENTSIZE_ERROR) return E8KV_ERR(CORRUPTED);
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != n) return E8KV_ERR(CORRUPTED);
    const size_t r = ZSTD_decompress(rows, n, src, src_size);
    if (ZSTD_isError(r) || r != n) return E8KV_ERR(CORRUPTED); /* the page's size is known: never short */
    if (delta) delta_inverse(rows, row_bytes, n_rows, elem_bytes);
    return n;
}
