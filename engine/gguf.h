/* GGUF v2/v3 reader: memory-mapped, every offset and size validated against the file before use.
 * Spec: ggml's docs/gguf.md. Tensor data is dequantized to float on request (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q6_K, Q4_K). Untrusted input: a malformed file is a named error, never a crash.
 * Tensor data must be laid out as ggml writes it (info order, aligned running offsets), as llama.cpp
 * requires. A reader is immutable after open: any number of threads may query it at once. */
#ifndef E8KV_GGUF_H
#define E8KV_GGUF_H

#include "e8kv.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    E8KV_GGUF_UINT8 = 0, E8KV_GGUF_INT8 = 1, E8KV_GGUF_UINT16 = 2, E8KV_GGUF_INT16 = 3,
    E8KV_GGUF_UINT32 = 4, E8KV_GGUF_INT32 = 5, E8KV_GGUF_FLOAT32 = 6, E8KV_GGUF_BOOL = 7,
    E8KV_GGUF_STRING = 8, E8KV_GGUF_ARRAY = 9, E8KV_GGUF_UINT64 = 10, E8KV_GGUF_INT64 = 11,
    E8KV_GGUF_FLOAT64 = 12
} e8kv_gguf_type;

/* ggml tensor type ids (pinned by the GGUF spec). */
typedef enum {
    E8KV_GGML_F32 = 0, E8KV_GGML_F16 = 1, E8KV_GGML_Q4_0 = 2, E8KV_GGML_Q4_1 = 3, E8KV_GGML_Q5_0 = 6,
    E8KV_GGML_Q5_1 = 7, E8KV_GGML_Q8_0 = 8, E8KV_GGML_Q4_K = 12, E8KV_GGML_Q6_K = 14, E8KV_GGML_BF16 = 30
} e8kv_ggml_type;

typedef struct e8kv_gguf e8kv_gguf;

typedef struct {
    const char *name;     /* NUL-terminated copy owned by the reader */
    uint32_t type;        /* e8kv_ggml_type */
    uint32_t n_dims;
    uint64_t ne[4];       /* ne[0] is the contiguous (innermost) dimension; unused dims are 1 */
    uint64_t n_elements;
    uint64_t n_bytes;
    const void *data;     /* inside the mapping, bounds-checked */
} e8kv_gguf_tensor;

/* Open and validate. Errors: E8KV_ERROR_IO, _TRUNCATED, _CORRUPTED, _VERSION, _OUT_OF_MEMORY. */
size_t e8kv_gguf_open(e8kv_gguf **out, const char *path);
/* Same over a caller-owned buffer (tests, fuzzing); the buffer must outlive the reader. */
size_t e8kv_gguf_open_buffer(e8kv_gguf **out, const void *data, size_t n_bytes);
void e8kv_gguf_close(e8kv_gguf *g);

/* Header facts: format version (2 or 3), tensor data alignment, byte offset of the data section. */
uint32_t e8kv_gguf_version(const e8kv_gguf *g);
size_t e8kv_gguf_alignment(const e8kv_gguf *g);
size_t e8kv_gguf_data_offset(const e8kv_gguf *g);

/* Metadata: index of key or -1. Keys can be enumerated: idx in [0, n_kv), key NUL-terminated. */
long e8kv_gguf_find(const e8kv_gguf *g, const char *key);
size_t e8kv_gguf_n_kv(const e8kv_gguf *g);
const char *e8kv_gguf_kv_key(const e8kv_gguf *g, long idx);
e8kv_gguf_type e8kv_gguf_kv_type(const e8kv_gguf *g, long idx);
/* Scalar getters convert any integer/float/bool type; return 0 on success or an error: missing key
 * E8KV_ERROR_BAD_ARGUMENT, wrong value type E8KV_ERROR_CORRUPTED, value not representable (negative or
 * fractional for u64) E8KV_ERROR_RANGE. Array element index past the end: E8KV_ERROR_BAD_ARGUMENT. */
size_t e8kv_gguf_get_u64(const e8kv_gguf *g, const char *key, uint64_t *out);
size_t e8kv_gguf_get_f32(const e8kv_gguf *g, const char *key, float *out);
size_t e8kv_gguf_get_bool(const e8kv_gguf *g, const char *key, int *out);
/* String value (not NUL-terminated in the file: returns pointer and length). */
size_t e8kv_gguf_get_str(const e8kv_gguf *g, const char *key, const char **s, size_t *len);
/* Arrays: element type and count; element access for strings and numbers. */
size_t e8kv_gguf_get_arr(const e8kv_gguf *g, const char *key, e8kv_gguf_type *elem_type, uint64_t *n);
size_t e8kv_gguf_get_arr_str(const e8kv_gguf *g, const char *key, uint64_t i, const char **s, size_t *len);
size_t e8kv_gguf_get_arr_f32(const e8kv_gguf *g, const char *key, uint64_t i, float *out);
size_t e8kv_gguf_get_arr_i64(const e8kv_gguf *g, const char *key, uint64_t i, int64_t *out);

/* Tensors. */
size_t e8kv_gguf_n_tensors(const e8kv_gguf *g);
const e8kv_gguf_tensor *e8kv_gguf_tensor_at(const e8kv_gguf *g, size_t i);
const e8kv_gguf_tensor *e8kv_gguf_find_tensor(const e8kv_gguf *g, const char *name);
/* Dequantize a whole tensor to float (n_elements floats). Unknown type: E8KV_ERROR_UNSUPPORTED. */
size_t e8kv_gguf_tensor_to_f32(float *dst, size_t dst_capacity, const e8kv_gguf_tensor *t);
/* Dequantize rows [row0, row0 + n_rows) of a tensor (a row is ne[0] values): n_rows * ne[0] floats.
 * Rows out of range: E8KV_ERROR_BAD_ARGUMENT. */
size_t e8kv_gguf_tensor_rows_to_f32(float *dst, size_t dst_capacity, const e8kv_gguf_tensor *t, uint64_t row0,
                                    uint64_t n_rows);

#endif
