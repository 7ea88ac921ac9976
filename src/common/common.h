/* Internal helpers shared by every module: alignment, little-endian I/O, logging (errors are made with
 * include/e8kv.h's E8KV_ERR). Depends on nothing but the public header and libc. */
#ifndef E8KV_COMMON_H
#define E8KV_COMMON_H

#include "e8kv.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define E8KV_ALIGN 64

/* Aligned allocation; size rounded up to a multiple of E8KV_ALIGN. Free with e8kv_free_aligned. */
void *e8kv_malloc_aligned(size_t n_bytes);
void *e8kv_calloc_aligned(size_t n_bytes);
void e8kv_free_aligned(void *p);
/* Bytes e8kv_malloc_aligned really reserves for a request of n_bytes (for honest byte accounting). */
size_t e8kv_aligned_size(size_t n_bytes);

/* Little-endian fixed-width loads and stores (alignment-free). */
static inline uint16_t e8kv_load_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t e8kv_load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t e8kv_load_le64(const uint8_t *p) {
    return (uint64_t)e8kv_load_le32(p) | ((uint64_t)e8kv_load_le32(p + 4) << 32);
}
static inline void e8kv_store_le16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void e8kv_store_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void e8kv_store_le64(uint8_t *p, uint64_t v) {
    e8kv_store_le32(p, (uint32_t)v);
    e8kv_store_le32(p + 4, (uint32_t)(v >> 32));
}
static inline float e8kv_load_lef32(const uint8_t *p) {
    const uint32_t u = e8kv_load_le32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline void e8kv_store_lef32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    e8kv_store_le32(p, u);
}

/* Library logging through the user's callback (silent when none is set). */
void e8kv_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 when all n floats are finite. */
int e8kv_all_finite(const float *x, size_t n);

#endif
