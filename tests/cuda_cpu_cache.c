/* test_cuda's view into a CPU cache (include/e8kv.h): the bytes it holds for one coded vector, so that the
 * CUDA cache's codes can be compared with the CPU cache's, not only with the codec's (the pages are the CPU
 * cache's internals, src/cache/kvcache.h). */
#include "cache/kvcache.h"

#include <string.h>

size_t e8kv_test_cpu_vector(const e8kv_cache *c, size_t layer, int is_v, size_t head, size_t slot, uint8_t *dst,
                            size_t cap);

/* The bytes of slot `slot` of head `head`'s K (is_v 0) or V stream in layer `layer`: vector_bytes written to
 * dst, or 0 when that slot holds no codes (a sink, a raw window page, nothing there) or dst is too small. */
size_t e8kv_test_cpu_vector(const e8kv_cache *c, size_t layer, int is_v, size_t head, size_t slot, uint8_t *dst,
                            size_t cap) {
    if (!c || layer >= c->n_layer || head >= c->n_head_kv || slot < c->n_sink) return 0;
    const kv_layer *L = &c->layers[layer];
    const kv_format *f = is_v ? &L->v : &L->k;
    if (slot >= L->n_tokens || f->group || cap < f->vector_bytes) return 0;
    const kv_page *pg = (is_v ? L->v_pages : L->k_pages) + head * c->n_page_max + slot / c->page_tokens;
    if (!pg->data || pg->raw) return 0;
    memcpy(dst, pg->data + (slot % c->page_tokens) * f->vector_bytes, f->vector_bytes);
    return f->vector_bytes;
}
