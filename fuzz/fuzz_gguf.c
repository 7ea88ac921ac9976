/* libFuzzer target for the GGUF reader: open the bytes as a GGUF file, read every metadata value through
 * every getter, look every tensor up by name and dequantize the small ones. Errors are expected; crashes,
 * sanitizer reports and leaks are bugs. Corpus: fuzz/corpus/gguf/ (replayed by tests/test_gguf.c). */
#include "dequant.h"
#include "gguf.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void touch_metadata(const e8kv_gguf *g) {
    for (long i = 0; i < (long)e8kv_gguf_n_kv(g); i++) {
        const char *key = e8kv_gguf_kv_key(g, i), *s;
        size_t len;
        uint64_t u, n;
        float f;
        int b;
        int64_t v;
        e8kv_gguf_type et;
        if (e8kv_gguf_find(g, key) != i) abort(); /* keys are unique */
        (void)e8kv_gguf_kv_type(g, i);
        (void)e8kv_gguf_get_u64(g, key, &u);
        (void)e8kv_gguf_get_f32(g, key, &f);
        (void)e8kv_gguf_get_bool(g, key, &b);
        if (!e8kv_is_error(e8kv_gguf_get_str(g, key, &s, &len)) && len) {
            volatile char c = s[0] ^ s[len - 1]; /* ASan checks both ends */
            (void)c;
        }
        if (e8kv_is_error(e8kv_gguf_get_arr(g, key, &et, &n))) continue;
        for (uint64_t j = 0; j < n && j < 4096; j++) {
            if (!e8kv_is_error(e8kv_gguf_get_arr_str(g, key, j, &s, &len)) && len) {
                volatile char c = s[0] ^ s[len - 1];
                (void)c;
            }
            (void)e8kv_gguf_get_arr_f32(g, key, j, &f);
            (void)e8kv_gguf_get_arr_i64(g, key, j, &v);
        }
        (void)e8kv_gguf_get_arr_i64(g, key, n, &v); /* one past the end: an error */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    e8kv_gguf *g = NULL;
    if (e8kv_is_error(e8kv_gguf_open_buffer(&g, data, size))) return 0;
    touch_metadata(g);
    for (size_t i = 0; i < e8kv_gguf_n_tensors(g); i++) {
        const e8kv_gguf_tensor *t = e8kv_gguf_tensor_at(g, i);
        if (e8kv_gguf_find_tensor(g, t->name) != t) abort(); /* names are unique */
        if (t->data && (const uint8_t *)t->data + t->n_bytes > data + size) abort();
        if (t->n_elements > (1u << 16)) continue;
        float *y = malloc((size_t)t->n_elements * sizeof *y);
        if (!y) continue;
        const size_t r = e8kv_gguf_tensor_to_f32(y, (size_t)t->n_elements, t);
        if (!e8kv_is_error(r) && r != t->n_elements) abort();
        if (t->ne[1] >= 2) (void)e8kv_gguf_tensor_rows_to_f32(y, (size_t)t->n_elements, t, 1, 1);
        free(y);
    }
    e8kv_gguf_close(g);
    return 0;
}
