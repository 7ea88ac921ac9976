/* rANS encoder and decoders (see rans.h for parameters, context rule and block layout).
 *
 * Encoding runs backwards over the symbols (rANS is LIFO) and writes words downwards from the end of
 * dst, so the decoder reads them forwards; symbol i uses state i mod 4 and the decoder performs exactly
 * the mirror image of the encoder's steps. Invariants (state x in [L, 2^32), L = 2^16, M = 2^12):
 *   encode s (freq f, start c): if x >= f·2^20 emit x mod 2^16, x >>= 16; x = (x / f)·M + x mod f + c
 *   decode: slot = x mod M -> s, f, slot - c; x = f·(x / M) + slot - c; if x < L: x = x·2^16 + word
 * One emitted word per symbol at most, since f·2^20 >= 2^20 > 2^32 / 2^16. Decoding any bytes keeps x
 * in [16, 2^32) before renormalization, so no step can overflow or loop, whatever the input. */
#include "rans.h"

static inline const e8kv_rans_table *table_for(const e8kv_rans_table *tables, size_t period,
                                               const uint8_t *sel, size_t i) {
    return tables + (sel ? (size_t)sel[i / period] * period : 0) + i % period;
}

size_t e8kv_rans_encode(void *dst, size_t dst_capacity, const uint8_t *sym, size_t n,
                        const e8kv_rans_table *tables, size_t period, const uint8_t *sel) {
    if (!dst || (!sym && n) || !tables || period == 0) return E8KV_ERR(BAD_ARGUMENT);
    for (size_t i = 0; i < n; i++) {
        const e8kv_rans_table *t = table_for(tables, period, sel, i);
        if (sym[i] >= t->n_sym || t->freq[sym[i]] == 0) return E8KV_ERR(BAD_ARGUMENT);
    }
    const size_t head = 4 * E8KV_RANS_STREAMS;
    if (dst_capacity < head) return E8KV_ERR(DST_TOO_SMALL);
    uint8_t *const lo = (uint8_t *)dst + head;
    uint8_t *p = (uint8_t *)dst + dst_capacity;
    uint32_t x[E8KV_RANS_STREAMS];
    for (int k = 0; k < E8KV_RANS_STREAMS; k++) x[k] = E8KV_RANS_L;
    for (size_t i = n; i-- > 0;) {
        const e8kv_rans_table *t = table_for(tables, period, sel, i);
        const uint32_t f = t->freq[sym[i]], c = t->start[sym[i]];
        uint32_t *const xs = &x[i % E8KV_RANS_STREAMS];
        if ((uint64_t)*xs >= ((uint64_t)f << 20)) {
            if (p - lo < 2) return E8KV_ERR(DST_TOO_SMALL);
            p -= 2;
            e8kv_store_le16(p, (uint16_t)*xs);
            *xs >>= 16;
        }
        *xs = ((*xs / f) << E8KV_RANS_SCALE_BITS) + *xs % f + c;
    }
    const size_t words = (size_t)((uint8_t *)dst + dst_capacity - p);
    memmove(lo, p, words);
    for (int k = 0; k < E8KV_RANS_STREAMS; k++) e8kv_store_le32((uint8_t *)dst + 4 * k, x[k]);
    return head + words;
}

static size_t read_states(uint32_t x[E8KV_RANS_STREAMS], const uint8_t *src, size_t src_size) {
    if (src_size < 4 * E8KV_RANS_STREAMS) return E8KV_ERR(TRUNCATED);
    for (int k = 0; k < E8KV_RANS_STREAMS; k++) {
        x[k] = e8kv_load_le32(src + 4 * k);
        if (x[k] < E8KV_RANS_L) return E8KV_ERR(CORRUPTED);
    }
    return 0;
}

static size_t check_end(const uint32_t x[E8KV_RANS_STREAMS], const uint8_t *p, const uint8_t *end,
                        size_t n) {
    if (p != end) return E8KV_ERR(CORRUPTED);
    for (int k = 0; k < E8KV_RANS_STREAMS; k++)
        if (x[k] != E8KV_RANS_L) return E8KV_ERR(CORRUPTED);
    return n;
}

size_t e8kv_rans_decode_ref(uint8_t *sym, size_t n, const void *src, size_t src_size,
                            const e8kv_rans_dtable *tables, size_t period, const uint8_t *sel) {
    if ((!sym && n) || !src || !tables || period == 0) return E8KV_ERR(BAD_ARGUMENT);
    uint32_t x[E8KV_RANS_STREAMS];
    E8KV_RETURN_IF_ERROR(read_states(x, src, src_size));
    const uint8_t *p = (const uint8_t *)src + 4 * E8KV_RANS_STREAMS;
    const uint8_t *const end = (const uint8_t *)src + src_size;
    for (size_t i = 0; i < n; i++) {
        const e8kv_rans_dtable *d = tables + (sel ? (size_t)sel[i / period] * period : 0) + i % period;
        uint32_t *const xs = &x[i % E8KV_RANS_STREAMS];
        const uint32_t e = d->slot[*xs & (E8KV_RANS_SCALE - 1)];
        sym[i] = (uint8_t)e;
        *xs = (((e >> 8) & 0xfff) + 1) * (*xs >> E8KV_RANS_SCALE_BITS) + (e >> 20);
        if (*xs < E8KV_RANS_L) {
            if (end - p < 2) return E8KV_ERR(TRUNCATED);
            *xs = (*xs << 16) | e8kv_load_le16(p);
            p += 2;
        }
    }
    return check_end(x, p, end, n);
}

/* One decode step of state X with slot table D into OUT; leaves the function on running out of input. */
#define RANS_STEP(X, D, OUT)                                                                          \
    do {                                                                                               \
        const uint32_t e_ = (D)->slot[(X) & (E8KV_RANS_SCALE - 1)];                                    \
        (OUT) = (uint8_t)e_;                                                                           \
        (X) = (((e_ >> 8) & 0xfff) + 1) * ((X) >> E8KV_RANS_SCALE_BITS) + (e_ >> 20);                  \
        if ((X) < E8KV_RANS_L) {                                                                       \
            if (end - p < 2) return E8KV_ERR(TRUNCATED);                                               \
            (X) = ((X) << 16) | e8kv_load_le16(p);                                                     \
            p += 2;                                                                                    \
        }                                                                                              \
    } while (0)

/* The same step without a branch on renormalization (taken for ~20-25% of symbols, unpredictably): the
 * next word is always loaded and used only when x < L. Callers guarantee 2 readable bytes at p. */
#define RANS_STEP_NB(X, D, OUT)                                                                       \
    do {                                                                                               \
        const uint32_t e_ = (D)->slot[(X) & (E8KV_RANS_SCALE - 1)];                                    \
        (OUT) = (uint8_t)e_;                                                                           \
        (X) = (((e_ >> 8) & 0xfff) + 1) * ((X) >> E8KV_RANS_SCALE_BITS) + (e_ >> 20);                  \
        const uint32_t need_ = (X) < E8KV_RANS_L;                                                      \
        (X) = ((X) << (16 * need_)) | ((uint32_t)e8kv_load_le16(p) & (0u - need_));                    \
        p += 2 * need_;                                                                                \
    } while (0)

size_t e8kv_rans_decode(uint8_t *sym, size_t n, const void *src, size_t src_size,
                        const e8kv_rans_dtable *tables, size_t period, const uint8_t *sel) {
    if ((!sym && n) || !src || !tables || period == 0) return E8KV_ERR(BAD_ARGUMENT);
    uint32_t x0, x1, x2, x3;
    {
        uint32_t x[E8KV_RANS_STREAMS];
        E8KV_RETURN_IF_ERROR(read_states(x, src, src_size));
        x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
    }
    const uint8_t *p = (const uint8_t *)src + 4 * E8KV_RANS_STREAMS;
    const uint8_t *const end = (const uint8_t *)src + src_size;
    size_t i = 0;
    if (period == 1 && !sel) {
        const e8kv_rans_dtable *const d = tables;
        for (; i + 4 <= n && end - p >= 8; i += 4) { /* a quad reads at most 8 bytes */
            RANS_STEP_NB(x0, d, sym[i]);
            RANS_STEP_NB(x1, d, sym[i + 1]);
            RANS_STEP_NB(x2, d, sym[i + 2]);
            RANS_STEP_NB(x3, d, sym[i + 3]);
        }
        for (; i + 4 <= n; i += 4) {
            RANS_STEP(x0, d, sym[i]);
            RANS_STEP(x1, d, sym[i + 1]);
            RANS_STEP(x2, d, sym[i + 2]);
            RANS_STEP(x3, d, sym[i + 3]);
        }
        for (; i < n; i++) {
            switch (i & 3) {
            case 0: RANS_STEP(x0, d, sym[i]); break;
            case 1: RANS_STEP(x1, d, sym[i]); break;
            case 2: RANS_STEP(x2, d, sym[i]); break;
            default: RANS_STEP(x3, d, sym[i]); break;
            }
        }
    } else {
        /* j = i mod period, base = the table set of group i / period */
        size_t j = 0, g = 0;
        const e8kv_rans_dtable *base = tables + (sel && n ? (size_t)sel[0] * period : 0);
#define NEXT_TABLE()                                                                                   \
    do {                                                                                               \
        if (++j == period) {                                                                           \
            j = 0;                                                                                     \
            g++;                                                                                       \
            if (sel && g * period < n) base = tables + (size_t)sel[g] * period;                        \
        }                                                                                              \
    } while (0)
        if (period % 4 == 0) { /* groups hold whole quads: advance the table position once per quad */
            for (; i + 4 <= n && end - p >= 8; i += 4) {
                const e8kv_rans_dtable *const q = base + j;
                RANS_STEP_NB(x0, q, sym[i]);
                RANS_STEP_NB(x1, q + 1, sym[i + 1]);
                RANS_STEP_NB(x2, q + 2, sym[i + 2]);
                RANS_STEP_NB(x3, q + 3, sym[i + 3]);
                j += 3;
                NEXT_TABLE();
            }
            for (; i + 4 <= n; i += 4) {
                const e8kv_rans_dtable *const q = base + j;
                RANS_STEP(x0, q, sym[i]);
                RANS_STEP(x1, q + 1, sym[i + 1]);
                RANS_STEP(x2, q + 2, sym[i + 2]);
                RANS_STEP(x3, q + 3, sym[i + 3]);
                j += 3;
                NEXT_TABLE();
            }
        }
        for (; i + 4 <= n; i += 4) {
            RANS_STEP(x0, base + j, sym[i]);
            NEXT_TABLE();
            RANS_STEP(x1, base + j, sym[i + 1]);
            NEXT_TABLE();
            RANS_STEP(x2, base + j, sym[i + 2]);
            NEXT_TABLE();
            RANS_STEP(x3, base + j, sym[i + 3]);
            NEXT_TABLE();
        }
        for (; i < n; i++) {
            switch (i & 3) {
            case 0: RANS_STEP(x0, base + j, sym[i]); break;
            case 1: RANS_STEP(x1, base + j, sym[i]); break;
            case 2: RANS_STEP(x2, base + j, sym[i]); break;
            default: RANS_STEP(x3, base + j, sym[i]); break;
            }
            NEXT_TABLE();
        }
#undef NEXT_TABLE
    }
    const uint32_t x[E8KV_RANS_STREAMS] = {x0, x1, x2, x3};
    return check_end(x, p, end, n);
}
