/* An MSB-first bit writer and reader over fixed buffers (as zstd keeps bitstream.h in common/): the prefix
 * codes of entropy/huff.h and the entropy-coded E8 vectors of quant/e8_vlc.c write and read through it. */
#ifndef E8KV_BITSTREAM_H
#define E8KV_BITSTREAM_H

#include "common.h"

/* MSB-first bit writer into a fixed buffer; writing past the end is a caller bug (asserted). */
typedef struct {
    uint8_t *p;
    size_t cap_bits, n_bits;
} e8kv_bitw;

static inline void e8kv_bitw_init(e8kv_bitw *w, uint8_t *dst, size_t n_bytes) {
    w->p = dst;
    w->cap_bits = 8 * n_bytes;
    w->n_bits = 0;
    memset(dst, 0, n_bytes);
}

static inline void e8kv_bitw_put(e8kv_bitw *w, uint32_t v, unsigned n) { /* the n low bits of v, MSB first */
    assert(n <= 32 && w->n_bits + n <= w->cap_bits);
    for (unsigned i = n; i-- > 0;) {
        if ((v >> i) & 1u) w->p[w->n_bits >> 3] |= (uint8_t)(0x80u >> (w->n_bits & 7));
        w->n_bits++;
    }
}

/* MSB-first bit reader over a fixed buffer; bits past the end read as 0 (a decoder of fixed-size vectors
 * never fails: corrupted bytes give some vector, never a fault). */
typedef struct {
    const uint8_t *p;
    size_t n_bytes;
    size_t pos;    /* next byte to load into acc */
    uint64_t acc;  /* bits not yet consumed, MSB-aligned */
    unsigned have; /* valid bits in acc */
} e8kv_bitr;

static inline void e8kv_bitr_init(e8kv_bitr *r, const uint8_t *src, size_t n_bytes) {
    r->p = src;
    r->n_bytes = n_bytes;
    r->pos = 0;
    r->acc = 0;
    r->have = 0;
}

static inline void e8kv_bitr_fill(e8kv_bitr *r) {
    while (r->have <= 56) {
        const uint64_t b = r->pos < r->n_bytes ? r->p[r->pos] : 0u;
        r->pos++;
        r->acc |= b << (56 - r->have);
        r->have += 8;
    }
}

/* The next n bits (n ≤ 32) without consuming them. */
static inline uint32_t e8kv_bitr_peek(e8kv_bitr *r, unsigned n) {
    if (r->have < n) e8kv_bitr_fill(r);
    return n ? (uint32_t)(r->acc >> (64 - n)) : 0u;
}

static inline void e8kv_bitr_skip(e8kv_bitr *r, unsigned n) {
    if (r->have < n) e8kv_bitr_fill(r);
    r->acc = n < 64 ? r->acc << n : 0;
    r->have -= n;
}

static inline uint32_t e8kv_bitr_get(e8kv_bitr *r, unsigned n) {
    const uint32_t v = e8kv_bitr_peek(r, n);
    e8kv_bitr_skip(r, n);
    return v;
}

#endif
