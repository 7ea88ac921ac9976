/* libFuzzer target for the frame decoder (doc/format.md §3). Each input is decoded as is (so the
 * checksum paths are exercised) and again with its XXH64/XXH32 fields recomputed (so mutations reach the
 * models and page decoders). Decoding must give a result or a named error, never a fault, and a frame
 * that decodes must decode page by page to the same bytes. Replayed by tests/test_frame.c. */
#include "e8kv.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_OUT (4u << 20)

static uint32_t ld32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void st32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static void try_decode(const uint8_t *data, size_t size) {
    e8kv_frame_info fi;
    const size_t r = e8kv_frame_get_info(&fi, data, size);
    if (e8kv_is_error(r)) return;
    if (fi.n_rows > FUZZ_MAX_OUT / fi.row_bytes) return;
    const size_t n = fi.n_rows * fi.row_bytes;
    uint8_t *all = malloc(n + 1), *one = malloc(n + 1);
    if (!all || !one) abort();
    const size_t ra = e8kv_frame_decode(all, n, data, size);
    if (!e8kv_is_error(ra)) {
        if (ra != n) abort();
        size_t off = 0;
        for (size_t pg = 0; pg < fi.n_pages && pg < 64; pg++) {
            const size_t rp = e8kv_frame_decode_page(one, n, data, size, pg);
            if (e8kv_is_error(rp) || off + rp > n || memcmp(one, all + off, rp) != 0) abort();
            off += rp;
        }
    }
    free(all);
    free(one);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try_decode(data, size);
    if (size < 40 || size > (8u << 20)) return 0;
    /* repair the checksums, reading the layout straight from the fixed header */
    const uint64_t meta = (uint64_t)(data[32] | data[33] << 8), tables = ld32(data + 36), n_pages = ld32(data + 28);
    const uint64_t header = 40 + meta + tables + 8 * n_pages + 8;
    if (header > size) return 0;
    uint8_t *c = malloc(size);
    if (!c) abort();
    memcpy(c, data, size);
    uint64_t off = header;
    for (uint64_t pg = 0; pg < n_pages; pg++) {
        uint8_t *e = c + 40 + meta + tables + 8 * pg;
        const uint64_t sz = ld32(e) & 0x7fffffffu;
        if (off + sz > size) break;
        st32(e + 4, XXH32(c + off, (size_t)sz, 0));
        off += sz;
    }
    const uint64_t h = XXH64(c, (size_t)header - 8, 0);
    for (int i = 0; i < 8; i++) c[header - 8 + (uint64_t)i] = (uint8_t)(h >> (8 * i));
    try_decode(c, size);
    free(c);
    return 0;
}
