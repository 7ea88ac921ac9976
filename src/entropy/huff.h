/* Canonical prefix (Huffman) codes with a bounded length, read and written with the MSB-first bit
 * reader/writer of common/bitstream.h.
 *
 * Why prefix codes and not rANS here: the fixed-size entropy-coded E8 vectors (quant/e8_vlc.c) are coded
 * one 64-value vector at a time inside a fixed budget of bytes, so every bit of coder state that must be
 * flushed per vector is lost rate (a rANS state is 32 bits); a prefix code has none, decodes with one
 * table look-up per symbol, and on the discretized Gaussians it is used for costs 0.01–0.05 bit per symbol
 * over the entropy.
 *
 * Codes are canonical (Schwartz & Kallick 1964; as in DEFLATE, RFC 1951 §3.2.2): symbols sorted by
 * (length, symbol) get consecutive code values, MSB first. Lengths come from Huffman's algorithm
 * (Huffman 1952) on the probabilities raised to at least 2^-(E8KV_HUFF_MAX_LEN - 2) and renormalized,
 * which keeps every length ≤ E8KV_HUFF_MAX_LEN; ties are broken by symbol index, so a table is a pure
 * function of its probabilities. */
#ifndef E8KV_HUFF_H
#define E8KV_HUFF_H

#include "common/bitstream.h"
#include "common/common.h"

#define E8KV_HUFF_MAX_SYMBOLS 128
#define E8KV_HUFF_MAX_LEN 15
#define E8KV_HUFF_LUT_BITS 9

typedef struct {
    uint32_t n_sym;
    uint8_t len[E8KV_HUFF_MAX_SYMBOLS];
    uint16_t code[E8KV_HUFF_MAX_SYMBOLS];
    /* decoding: codes of ≤ LUT_BITS bits by one look-up of the next LUT_BITS bits: symbol << 4 | length;
     * 0 = a longer code, decoded from the canonical ranges below */
    uint16_t lut[1 << E8KV_HUFF_LUT_BITS];
    uint16_t first_code[E8KV_HUFF_MAX_LEN + 2];  /* first code value of each length */
    uint16_t first_index[E8KV_HUFF_MAX_LEN + 2]; /* its position in `sorted` */
    uint16_t count[E8KV_HUFF_MAX_LEN + 1];
    uint8_t sorted[E8KV_HUFF_MAX_SYMBOLS]; /* symbols in canonical order */
} e8kv_huff;

/* Build the code of n_sym symbols (1..128) with probabilities p (any positive scale; every p > 0).
 * Returns 0 or E8KV_ERROR_BAD_ARGUMENT. */
size_t e8kv_huff_build(e8kv_huff *h, const double *p, size_t n_sym);

/* Decode one symbol. */
uint32_t e8kv_huff_decode_slow(const e8kv_huff *h, e8kv_bitr *r);
static inline uint32_t e8kv_huff_decode(const e8kv_huff *h, e8kv_bitr *r) {
    const uint16_t e = h->lut[e8kv_bitr_peek(r, E8KV_HUFF_LUT_BITS)];
    if (e) {
        e8kv_bitr_skip(r, e & 15u);
        return e >> 4;
    }
    return e8kv_huff_decode_slow(h, r);
}

#endif
