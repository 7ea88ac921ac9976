/* The one way the library builds and propagates its error codes (zstd style: the negated enum value as a
 * size_t, tested with e8kv_is_error). Depends on the public header only, so any layer may include it. */
#ifndef E8KV_ERROR_H
#define E8KV_ERROR_H

#include "e8kv.h"

#include <stddef.h>

#define E8KV_ERR(name) ((size_t) - (ptrdiff_t)E8KV_ERROR_##name)
#define E8KV_RETURN_IF_ERROR(expr)                                                                           \
    do {                                                                                                     \
        const size_t e8kv_r_ = (expr);                                                                       \
        if (e8kv_is_error(e8kv_r_)) return e8kv_r_;                                                          \
    } while (0)

#endif
