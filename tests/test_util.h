/* Shared helpers for the cmocka tests: locating test data, skipping cleanly, deterministic data. */
#ifndef E8KV_TEST_UTIL_H
#define E8KV_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "e8kv.h"

/* Path under the test data, $E8KV_SHARED_DATA (ctest: data/ in the repository) or else ./data; NULL when
 * that file is missing. */
static inline const char *test_data_path(const char *rel) {
    static char buf[4096];
    const char *base = getenv("E8KV_SHARED_DATA");
    if (!base) base = "data";
    snprintf(buf, sizeof buf, "%s/%s", base, rel);
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

/* Assert that a size_t result is the named error. */
#define assert_error(expr, name)                                                                       \
    do {                                                                                               \
        const size_t r_ = (expr);                                                                      \
        if (!e8kv_is_error(r_) || e8kv_get_error_code(r_) != E8KV_ERROR_##name) {                      \
            fail_msg("%s: expected E8KV_ERROR_" #name ", got %s (%zu)", #expr,                         \
                     e8kv_is_error(r_) ? e8kv_error_name(r_) : "success", r_);                         \
        }                                                                                              \
    } while (0)

#define assert_ok(expr)                                                                                \
    do {                                                                                               \
        const size_t r_ = (expr);                                                                      \
        if (e8kv_is_error(r_)) fail_msg("%s failed: %s", #expr, e8kv_error_name(r_));                  \
    } while (0)

/* A saved cache (e8kv_cache_save with meta) in a malloc'd buffer of its bound, its size in *n; the save must
 * succeed and stay within the bound. */
static inline uint8_t *test_cache_save(const e8kv_cache *c, size_t *n, const void *meta, size_t meta_size) {
    const size_t cap = e8kv_cache_save_bound(c, meta_size);
    assert_ok(cap);
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    *n = e8kv_cache_save(buf, cap, c, meta, meta_size);
    assert_ok(*n);
    assert_true(*n <= cap);
    return buf;
}

#include "common/rng.h"

#include <math.h>

/* SNR in dB of a codec (rotation seed codec_seed) round trip on n_vec i.i.d. N(0,1) vectors of dimension d
 * from rng seed `seed`, checking on the way that encoding twice gives identical bytes. */
static inline double test_codec_snr_db(const char *spec, size_t d, size_t n_vec, uint64_t seed,
                                       uint64_t codec_seed) {
    size_t err = 0;
    e8kv_codec *const c = e8kv_codec_create(spec, d, codec_seed, &err);
    assert_non_null(c);
    const size_t nb = n_vec * e8kv_codec_vector_bytes(c);
    float *const x = malloc(n_vec * d * sizeof(float)), *const y = malloc(n_vec * d * sizeof(float));
    uint8_t *const b = malloc(nb), *const b2 = malloc(nb);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    for (size_t i = 0; i < n_vec * d; i++)
        x[i] = (float)e8kv_rng_normal(&rng);
    assert_int_equal(e8kv_codec_encode(c, b, nb, x, n_vec), nb);
    assert_int_equal(e8kv_codec_encode(c, b2, nb, x, n_vec), nb);
    assert_memory_equal(b, b2, nb); /* encoding twice gives identical bytes */
    assert_int_equal(e8kv_codec_decode(c, y, n_vec * d, b, nb, n_vec), n_vec * d);
    double se = 0.0, sx = 0.0;
    for (size_t i = 0; i < n_vec * d; i++) {
        se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        sx += (double)x[i] * x[i];
    }
    free(x);
    free(y);
    free(b);
    free(b2);
    e8kv_codec_free(c);
    return 10.0 * log10(sx / se);
}

#endif
