/* libFuzzer target for saved caches (doc/format.md §4). Each input is loaded as is (so the checksum path
 * is exercised) and again with its XXH64 recomputed (so mutations reach the header, spec, page map, sink
 * and window tokens and the frames). Loading must give a cache or a named error, never a fault; a cache
 * that loads must attend, accept an append, and save and reload to the same bytes. Replayed by
 * tests/test_persist.c. */
#include "e8kv.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* page-table entries above which the input is skipped (valid, but slow to allocate thousands of times) */
#define FUZZ_MAX_TABLE (1u << 16)

static void exercise(e8kv_cache *c, const e8kv_cache_file_info *fi) {
    const size_t d = fi->head_dim, w = fi->n_head_kv * d;
    float *q = calloc(w, sizeof *q), *out = calloc(w, sizeof *out), *k = calloc(w, sizeof *k);
    if (!q || !out || !k) abort();
    for (size_t i = 0; i < w; i++)
        q[i] = k[i] = (float)(i % 7) - 3.0f;
    const size_t n0 = e8kv_cache_n_tokens(c, 0);
    if (e8kv_is_error(n0)) abort();
    if (n0 > 0 && e8kv_is_error(e8kv_cache_attend(c, out, w, 0, q, fi->n_head_kv, 1, n0 - 1))) abort();
    /* save -> load -> save gives identical bytes */
    const size_t cap = e8kv_cache_save_bound(c, fi->meta_size);
    if (e8kv_is_error(cap)) abort();
    uint8_t *a = malloc(cap), *b = malloc(cap);
    if (!a || !b) abort();
    const size_t na = e8kv_cache_save(a, cap, c, NULL, 0);
    if (e8kv_is_error(na)) abort();
    size_t err = 0;
    e8kv_cache *c2 = e8kv_cache_load(a, na, 1, &err);
    if (!c2) abort();
    const size_t nb = e8kv_cache_save(b, cap, c2, NULL, 0);
    if (nb != na || memcmp(a, b, na)) abort();
    e8kv_cache_free(c2);
    free(a), free(b);
    const size_t r = e8kv_cache_append(c, 0, k, k, 1);
    if (n0 < fi->n_ctx && e8kv_is_error(r) && e8kv_get_error_code(r) != E8KV_ERROR_RANGE) abort();
    free(q), free(out), free(k);
}

static void try_load(const uint8_t *data, size_t size) {
    e8kv_cache_file_info fi;
    if (e8kv_is_error(e8kv_cache_file_get_info(&fi, data, size))) return;
    const size_t n_page_max = (fi.n_ctx + fi.page_tokens - 1) / fi.page_tokens;
    if (fi.n_layer * fi.n_head_kv * n_page_max > FUZZ_MAX_TABLE || fi.n_ctx > (1u << 20)) return;
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_load(data, size, 1, &err);
    if (!c) {
        if (!e8kv_is_error(err)) abort();
        return;
    }
    exercise(c, &fi);
    e8kv_cache_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try_load(data, size);
    if (size < 16 || size > (8u << 20)) return 0;
    uint8_t *c = malloc(size);
    if (!c) abort();
    memcpy(c, data, size);
    /* make the declared size the real one and repair the checksum */
    for (int i = 0; i < 8; i++)
        c[8 + i] = (uint8_t)((uint64_t)size >> (8 * i));
    if (size >= 72) {
        const uint64_t h = XXH64(c, size - 8, 0);
        for (int i = 0; i < 8; i++)
            c[size - 8 + (size_t)i] = (uint8_t)(h >> (8 * i));
        try_load(c, size);
    }
    free(c);
    return 0;
}
