/* Shared helpers for the cmocka tests: locating shared data, skipping cleanly, deterministic data. */
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

/* Path under ../shared/data (E8KV_SHARED_DATA); NULL when that file is missing. */
static inline const char *test_data_path(const char *rel) {
    static char buf[4096];
    const char *base = getenv("E8KV_SHARED_DATA");
    if (!base) base = "../shared/data";
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

#endif
