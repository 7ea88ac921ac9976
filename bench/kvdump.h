/* Reader for K/V dump files (`.kvd`, doc/format.md section 1): validate the header against the file
 * size, then load every vector as f32. Untrusted bytes: every field is checked and a malformed file is a
 * named error, never a crash. Depends only on the public header and common/ (little-endian loads). */
#ifndef E8KV_KVDUMP_H
#define E8KV_KVDUMP_H

#include <stddef.h>
#include <stdint.h>

#define E8KV_KVDUMP_MAGIC "E8KVDUMP"
#define E8KV_KVDUMP_VERSION 1
#define E8KV_KVDUMP_HEADER_BYTES 40

#define E8KV_KVDUMP_FLAG_KEYS 1u
#define E8KV_KVDUMP_FLAG_VALUES 2u
#define E8KV_KVDUMP_FLAG_PRE_ROPE 4u

typedef struct {
    size_t n_vec;
    size_t head_dim;
    uint32_t flags;     /* E8KV_KVDUMP_FLAG_* */
    uint32_t n_layer;   /* 0 = unknown */
    uint32_t n_head_kv; /* 0 = unknown */
    float *data;        /* (n_vec, head_dim), row-major; NULL after parse_header */
} e8kv_kvdump;

/* Validate a 40-byte header against the total file size and fill everything but `data`.
 * Errors: TRUNCATED (file shorter than the header or than the vectors it announces), CORRUPTED (bad
 * magic, reserved field not 0, size overflow, or file longer than announced), VERSION (version != 1),
 * HEAD_DIM (head_dim 0 or above E8KV_MAX_HEAD_DIM). Returns 0 or the error. */
size_t e8kv_kvdump_parse_header(e8kv_kvdump *out, const uint8_t *header, size_t header_size,
                                uint64_t file_size);

/* Open, validate and load a dump. On success out->data holds n_vec·head_dim finite floats (free with
 * e8kv_kvdump_free). Errors: those of parse_header, IO (cannot open or read), NONFINITE (NaN/Inf in the
 * vectors), OUT_OF_MEMORY. On error *out is zeroed and nothing needs freeing. */
size_t e8kv_kvdump_read(e8kv_kvdump *out, const char *path);

/* Release out->data (NULL-safe) and zero the struct. */
void e8kv_kvdump_free(e8kv_kvdump *dump);

#endif
