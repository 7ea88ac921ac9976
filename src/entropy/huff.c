/* Canonical, length-limited prefix codes (see huff.h). */
#include "huff.h"

#include <math.h>

/* Huffman code lengths of n symbols with weights w (n ≤ 128): merge the two lightest nodes until one
 * is left (ties: the node holding the smaller symbol first), a leaf's length its depth. O(n²), n small. */
static void huffman_lengths(const double *w, size_t n, uint8_t *len) {
    double weight[2 * E8KV_HUFF_MAX_SYMBOLS];
    int parent[2 * E8KV_HUFF_MAX_SYMBOLS], alive[2 * E8KV_HUFF_MAX_SYMBOLS];
    size_t min_sym[2 * E8KV_HUFF_MAX_SYMBOLS];
    for (size_t i = 0; i < n; i++) {
        weight[i] = w[i];
        parent[i] = -1;
        alive[i] = 1;
        min_sym[i] = i;
    }
    size_t n_nodes = n;
    for (size_t left = n; left > 1; left--) {
        size_t a = SIZE_MAX, b = SIZE_MAX; /* the two lightest alive nodes */
        for (size_t i = 0; i < n_nodes; i++) {
            if (!alive[i]) continue;
            if (a == SIZE_MAX || weight[i] < weight[a] ||
                (weight[i] == weight[a] && min_sym[i] < min_sym[a])) {
                b = a;
                a = i;
            } else if (b == SIZE_MAX || weight[i] < weight[b] ||
                       (weight[i] == weight[b] && min_sym[i] < min_sym[b])) {
                b = i;
            }
        }
        weight[n_nodes] = weight[a] + weight[b];
        min_sym[n_nodes] = min_sym[a] < min_sym[b] ? min_sym[a] : min_sym[b];
        parent[n_nodes] = -1;
        alive[n_nodes] = 1;
        alive[a] = alive[b] = 0;
        parent[a] = parent[b] = (int)n_nodes;
        n_nodes++;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned d = 0;
        for (int p = parent[i]; p >= 0; p = parent[p])
            d++;
        len[i] = (uint8_t)(d ? d : 1);
    }
}

size_t e8kv_huff_build(e8kv_huff *h, const double *p, size_t n_sym) {
    if (!h || !p || n_sym == 0 || n_sym > E8KV_HUFF_MAX_SYMBOLS) return E8KV_ERR(BAD_ARGUMENT);
    memset(h, 0, sizeof *h);
    h->n_sym = (uint32_t)n_sym;
    double total = 0.0;
    for (size_t i = 0; i < n_sym; i++) {
        if (!(p[i] > 0.0) || !isfinite(p[i])) return E8KV_ERR(BAD_ARGUMENT);
        total += p[i];
    }
    double w[E8KV_HUFF_MAX_SYMBOLS];
    const double floor_p = ldexp(1.0, -(E8KV_HUFF_MAX_LEN - 2));
    for (size_t i = 0; i < n_sym; i++)
        w[i] = fmax(p[i] / total, floor_p);
    huffman_lengths(w, n_sym, h->len);
    /* limit the lengths: clamp, then lengthen the longest codes below the limit until Kraft holds */
    uint32_t kraft = 0;
    const uint32_t full = 1u << E8KV_HUFF_MAX_LEN;
    for (size_t i = 0; i < n_sym; i++) {
        if (h->len[i] > E8KV_HUFF_MAX_LEN) h->len[i] = E8KV_HUFF_MAX_LEN;
        kraft += 1u << (E8KV_HUFF_MAX_LEN - h->len[i]);
    }
    while (kraft > full) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < n_sym; i++)
            if (h->len[i] < E8KV_HUFF_MAX_LEN && (best == SIZE_MAX || h->len[i] > h->len[best])) best = i;
        assert(best != SIZE_MAX);
        kraft -= 1u << (E8KV_HUFF_MAX_LEN - h->len[best] - 1);
        h->len[best]++;
    }
    /* canonical codes: symbols in (length, symbol) order get consecutive values */
    for (size_t i = 0; i < n_sym; i++)
        h->count[h->len[i]]++;
    uint32_t code = 0, index = 0;
    for (unsigned l = 1; l <= E8KV_HUFF_MAX_LEN; l++) {
        code = (code + h->count[l - 1]) << 1;
        h->first_code[l] = (uint16_t)code;
        h->first_index[l] = (uint16_t)index;
        index += h->count[l];
    }
    uint16_t next[E8KV_HUFF_MAX_LEN + 1];
    for (unsigned l = 1; l <= E8KV_HUFF_MAX_LEN; l++)
        next[l] = 0;
    for (unsigned l = 1; l <= E8KV_HUFF_MAX_LEN; l++)
        for (size_t i = 0; i < n_sym; i++)
            if (h->len[i] == l) {
                h->code[i] = (uint16_t)(h->first_code[l] + next[l]);
                h->sorted[h->first_index[l] + next[l]] = (uint8_t)i;
                next[l]++;
            }
    for (size_t i = 0; i < n_sym; i++) {
        const unsigned l = h->len[i];
        if (l > E8KV_HUFF_LUT_BITS) continue;
        const uint32_t lo = (uint32_t)h->code[i] << (E8KV_HUFF_LUT_BITS - l),
                       n = 1u << (E8KV_HUFF_LUT_BITS - l);
        for (uint32_t k = 0; k < n; k++)
            h->lut[lo + k] = (uint16_t)(i << 4 | l);
    }
    return 0;
}

uint32_t e8kv_huff_decode_slow(const e8kv_huff *h, e8kv_bitr *r) {
    const uint32_t bits = e8kv_bitr_peek(r, E8KV_HUFF_MAX_LEN);
    for (unsigned l = 1; l <= E8KV_HUFF_MAX_LEN; l++) {
        const uint32_t code = bits >> (E8KV_HUFF_MAX_LEN - l);
        if (code - h->first_code[l] < h->count[l]) {
            e8kv_bitr_skip(r, l);
            return h->sorted[h->first_index[l] + code - h->first_code[l]];
        }
    }
    e8kv_bitr_skip(r, E8KV_HUFF_MAX_LEN); /* not a code word (corrupted bytes): a symbol, never a fault */
    return 0;
}
