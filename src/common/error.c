/* Error codes, their names, the version, logging and small allocation helpers. */
#include "common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

unsigned e8kv_version_number(void) { return E8KV_VERSION_NUMBER; }

#define E8KV_STR2(x) #x
#define E8KV_STR(x) E8KV_STR2(x)
const char *e8kv_version_string(void) {
    return E8KV_STR(E8KV_VERSION_MAJOR) "." E8KV_STR(E8KV_VERSION_MINOR) "." E8KV_STR(E8KV_VERSION_PATCH);
}

unsigned e8kv_is_error(size_t code) { return code > E8KV_ERR(MAX_CODE); }

e8kv_error_code e8kv_get_error_code(size_t code) {
    if (!e8kv_is_error(code)) return E8KV_ERROR_NO_ERROR;
    return (e8kv_error_code)(0 - code);
}

const char *e8kv_error_code_name(e8kv_error_code code) {
    switch (code) {
    case E8KV_ERROR_NO_ERROR: return "no error";
    case E8KV_ERROR_GENERIC: return "error (generic)";
    case E8KV_ERROR_BAD_ARGUMENT: return "bad argument";
    case E8KV_ERROR_HEAD_DIM: return "head_dim not supported by this format";
    case E8KV_ERROR_RATE: return "bits per value out of range for this format";
    case E8KV_ERROR_DST_TOO_SMALL: return "destination buffer is too small";
    case E8KV_ERROR_NONFINITE: return "input contains NaN or Inf";
    case E8KV_ERROR_OUT_OF_MEMORY: return "out of memory";
    case E8KV_ERROR_CORRUPTED: return "data corrupted";
    case E8KV_ERROR_TRUNCATED: return "input truncated";
    case E8KV_ERROR_VERSION: return "unsupported format version";
    case E8KV_ERROR_CHECKSUM: return "checksum mismatch";
    case E8KV_ERROR_SPEC: return "invalid format spec";
    case E8KV_ERROR_CONTEXT_FULL: return "cache context is full";
    case E8KV_ERROR_DIMENSION: return "dimension mismatch";
    case E8KV_ERROR_RANGE: return "value out of the format's range";
    case E8KV_ERROR_IO: return "I/O error";
    case E8KV_ERROR_UNSUPPORTED: return "unsupported";
    case E8KV_ERROR_SRC_SIZE: return "source size mismatch";
    case E8KV_ERROR_Q_RANGE:
        return "q_range outside [1, sqrt(2*head_dim)]: it is the clamp in multiples of the RMS, not "
               "KakeyaLattice's q_range";
    case E8KV_ERROR_CUDA: return "CUDA runtime error";
    case E8KV_ERROR_NO_SPACE:
        return "no space left on the device (or disk quota exceeded)";
    case E8KV_ERROR_MAX_CODE: break;
    }
    return "unknown error code";
}

const char *e8kv_error_name(size_t code) { return e8kv_error_code_name(e8kv_get_error_code(code)); }

static e8kv_log_fn g_log_fn;
static void *g_log_user;

void e8kv_set_log_callback(e8kv_log_fn fn, void *user) {
    g_log_fn = fn;
    g_log_user = user;
}

void e8kv_log(int level, const char *fmt, ...) {
    if (!g_log_fn) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_log_fn(level, buf, g_log_user);
}

size_t e8kv_aligned_size(size_t n_bytes) {
    return (n_bytes + E8KV_ALIGN - 1) / E8KV_ALIGN * E8KV_ALIGN;
}

void *e8kv_malloc_aligned(size_t n_bytes) {
    if (n_bytes == 0) n_bytes = 1;
    const size_t sz = e8kv_aligned_size(n_bytes);
    if (sz < n_bytes) return NULL;
    return aligned_alloc(E8KV_ALIGN, sz);
}

void *e8kv_calloc_aligned(size_t n_bytes) {
    void *p = e8kv_malloc_aligned(n_bytes);
    if (p) memset(p, 0, e8kv_aligned_size(n_bytes ? n_bytes : 1));
    return p;
}

void e8kv_free_aligned(void *p) { free(p); }

int e8kv_all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}
