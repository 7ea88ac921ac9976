/* rANS entropy coder with static (per-frame) models.
 *
 * After J. Duda, "Asymmetric numeral systems" (arXiv:1311.2540, 2013) and F. Giesen, "Interleaved
 * entropy coders" (arXiv:1402.3392, 2014). Parameters, fixed by the format (doc/format.md §3):
 *   - frequencies normalized to 2^12 (E8KV_RANS_SCALE_BITS), every present symbol >= 1;
 *   - 32-bit state kept in [2^16, 2^32), 16-bit renormalization, so each symbol emits at most one word;
 *   - 4 interleaved states (symbol i belongs to state i mod 4) sharing one word stream, so a decoder
 *     has four independent dependency chains in flight.
 *
 * Contexts: a coder call takes an array of tables, a `period` P and an optional per-group selector
 * `sel`: symbol i is coded with table[(sel ? sel[i / P] : 0) * P + i % P]. P = 1 is one table; P =
 * vector_bytes gives per-field tables; P = 8 with sel = coset bits gives E8's per-coset, per-coordinate
 * tables.
 *
 * Block layout: 4 x u32 initial decoder states (state 0 first), then u16 words in read order. The
 * decoder checks every read against the end of its input and, at the end, that the input is used up
 * and every state is back at its initial value 2^16; anything else is E8KV_ERROR_CORRUPTED (or
 * E8KV_ERROR_TRUNCATED when it ran out of bytes). */
#ifndef E8KV_RANS_H
#define E8KV_RANS_H

#include "common/common.h"

#define E8KV_RANS_SCALE_BITS 12
#define E8KV_RANS_SCALE (1u << E8KV_RANS_SCALE_BITS)
#define E8KV_RANS_L (1u << 16)
#define E8KV_RANS_STREAMS 4
#define E8KV_RANS_MAX_SYMBOLS 256
/* Serialized table: varint n_sym + at most 2 bytes per frequency. */
#define E8KV_RANS_TABLE_MAX_BYTES (2 + 2 * E8KV_RANS_MAX_SYMBOLS)

/* Encoder-side model of one context. n_sym == 0 is the empty table (codes no symbol). */
typedef struct {
    uint32_t n_sym;                            /* alphabet is [0, n_sym) */
    uint16_t freq[E8KV_RANS_MAX_SYMBOLS];      /* sum == E8KV_RANS_SCALE unless n_sym == 0 */
    uint16_t start[E8KV_RANS_MAX_SYMBOLS];     /* prefix sums of freq */
} e8kv_rans_table;

/* Decoder-side model: one packed entry per slot: symbol | (freq - 1) << 8 | (slot - start) << 20. */
typedef struct {
    uint32_t slot[E8KV_RANS_SCALE];
} e8kv_rans_dtable;

/* ---- freq.c: models */

/* Normalize counts[0..n_sym) to frequencies summing to 2^12, each nonzero count getting >= 1, with the
 * rounding chosen greedily to minimize the coded size of exactly these counts. n_sym <= 256. All-zero
 * counts give the empty table. */
size_t e8kv_rans_table_build(e8kv_rans_table *t, const uint64_t *counts, size_t n_sym);
/* Bits needed to code `counts` with table t (the counts it was built from); +inf-free: assumes every
 * counted symbol has freq > 0. */
double e8kv_rans_table_cost_bits(const e8kv_rans_table *t, const uint64_t *counts);
/* Serialize (varint n_sym, then frequencies as varints with zero runs). Returns bytes written. */
size_t e8kv_rans_table_write(uint8_t *dst, size_t dst_capacity, const e8kv_rans_table *t);
/* Parse and validate a serialized table; returns bytes consumed. */
size_t e8kv_rans_table_read(e8kv_rans_table *t, const uint8_t *src, size_t src_size);
/* Fill the decoder slots. The table must be valid (built or read). */
void e8kv_rans_dtable_init(e8kv_rans_dtable *d, const e8kv_rans_table *t);

/* LEB128 varints, shared by the entropy formats. */
size_t e8kv_varint_write(uint8_t *dst, size_t dst_capacity, uint64_t v);
/* Returns bytes consumed; TRUNCATED when the input ends, CORRUPTED beyond 10 bytes / 64 bits. */
size_t e8kv_varint_read(uint64_t *v, const uint8_t *src, size_t src_size);

/* ---- rans.c: coding */

/* Worst-case block size for n symbols. */
static inline size_t e8kv_rans_bound(size_t n) { return 4 * E8KV_RANS_STREAMS + 2 * n; }

/* Encode n symbols (see the context rule above). Every symbol must have freq > 0 in its table
 * (E8KV_ERROR_BAD_ARGUMENT otherwise). Returns bytes written. */
size_t e8kv_rans_encode(void *dst, size_t dst_capacity, const uint8_t *sym, size_t n,
                        const e8kv_rans_table *tables, size_t period, const uint8_t *sel);

/* Decode exactly n symbols from exactly src_size bytes. sel must hold the group selectors (decoded
 * earlier) and every selector must index an existing table set (the caller guarantees it). */
size_t e8kv_rans_decode_ref(uint8_t *sym, size_t n, const void *src, size_t src_size,
                            const e8kv_rans_dtable *tables, size_t period, const uint8_t *sel);
/* The same, 4-way unrolled with a fast path for one table; identical results and errors. */
size_t e8kv_rans_decode(uint8_t *sym, size_t n, const void *src, size_t src_size,
                        const e8kv_rans_dtable *tables, size_t period, const uint8_t *sel);

#endif
