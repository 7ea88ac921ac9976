/* rANS models: frequency normalization to 2^12, compact serialization, decoder slot tables, varints.
 *
 * Normalization: start from floor(c·2^12/total) (at least 1 for every present symbol), then move the
 * remaining units one at a time to (or from) the symbol where that changes the coded size
 * sum_i c_i·log2(2^12/f_i) the most (or least): the greedy optimum for this separable convex cost. */
#include "rans.h"

#include <math.h>

size_t e8kv_varint_write(uint8_t *dst, size_t dst_capacity, uint64_t v) {
    size_t n = 0;
    do {
        if (n >= dst_capacity) return E8KV_ERR(DST_TOO_SMALL);
        const uint8_t b = (uint8_t)(v & 0x7f);
        v >>= 7;
        dst[n++] = (uint8_t)(b | (v ? 0x80 : 0));
    } while (v);
    return n;
}

size_t e8kv_varint_read(uint64_t *v, const uint8_t *src, size_t src_size) {
    uint64_t r = 0;
    for (size_t i = 0; i < 10; i++) {
        if (i >= src_size) return E8KV_ERR(TRUNCATED);
        const uint64_t b = src[i];
        if (i == 9 && b > 1) return E8KV_ERR(CORRUPTED); /* would overflow 64 bits */
        r |= (b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = r;
            return i + 1;
        }
    }
    return E8KV_ERR(CORRUPTED);
}

static void fill_start(e8kv_rans_table *t) {
    uint32_t c = 0;
    for (uint32_t s = 0; s < t->n_sym; s++) {
        t->start[s] = (uint16_t)c;
        c += t->freq[s];
    }
}

size_t e8kv_rans_table_build(e8kv_rans_table *t, const uint64_t *counts, size_t n_sym) {
    if (!t || (!counts && n_sym) || n_sym > E8KV_RANS_MAX_SYMBOLS) return E8KV_ERR(BAD_ARGUMENT);
    memset(t, 0, sizeof *t);
    uint64_t total = 0;
    size_t last = 0;
    for (size_t s = 0; s < n_sym; s++) {
        total += counts[s];
        if (counts[s]) last = s + 1;
    }
    if (total == 0) return 0; /* empty table */
    t->n_sym = (uint32_t)last;
    int64_t sum = 0;
    for (size_t s = 0; s < last; s++) {
        if (!counts[s]) continue;
        int64_t f = (int64_t)((double)counts[s] * E8KV_RANS_SCALE / (double)total);
        if (f < 1) f = 1;
        if (f > E8KV_RANS_SCALE) f = E8KV_RANS_SCALE;
        t->freq[s] = (uint16_t)f;
        sum += f;
    }
    while (sum != E8KV_RANS_SCALE) {
        size_t best = last;
        double best_v = 0.0;
        for (size_t s = 0; s < last; s++) {
            const double c = (double)counts[s], f = t->freq[s];
            if (!counts[s]) continue;
            if (sum < E8KV_RANS_SCALE) { /* add a unit where it saves most */
                const double gain = c * log2((f + 1.0) / f);
                if (best == last || gain > best_v) best = s, best_v = gain;
            } else if (t->freq[s] > 1) { /* remove a unit where it costs least */
                const double loss = c * log2(f / (f - 1.0));
                if (best == last || loss < best_v) best = s, best_v = loss;
            }
        }
        assert(best < last); /* at most 256 symbols, so 2^12 units always fit */
        if (sum < E8KV_RANS_SCALE) t->freq[best]++, sum++;
        else t->freq[best]--, sum--;
    }
    fill_start(t);
    return 0;
}

double e8kv_rans_table_cost_bits(const e8kv_rans_table *t, const uint64_t *counts) {
    double bits = 0.0;
    for (uint32_t s = 0; s < t->n_sym; s++)
        if (counts[s] && t->freq[s]) bits += (double)counts[s] * (E8KV_RANS_SCALE_BITS - log2(t->freq[s]));
    return bits;
}

size_t e8kv_rans_table_write(uint8_t *dst, size_t dst_capacity, const e8kv_rans_table *t) {
    size_t pos = 0, r;
    E8KV_RETURN_IF_ERROR(r = e8kv_varint_write(dst, dst_capacity, t->n_sym));
    pos += r;
    for (uint32_t s = 0; s < t->n_sym;) {
        E8KV_RETURN_IF_ERROR(r = e8kv_varint_write(dst + pos, dst_capacity - pos, t->freq[s]));
        pos += r;
        if (t->freq[s]) {
            s++;
            continue;
        }
        uint32_t run = 0; /* further zeros after this one */
        while (s + 1 + run < t->n_sym && t->freq[s + 1 + run] == 0) run++;
        E8KV_RETURN_IF_ERROR(r = e8kv_varint_write(dst + pos, dst_capacity - pos, run));
        pos += r;
        s += 1 + run;
    }
    return pos;
}

size_t e8kv_rans_table_read(e8kv_rans_table *t, const uint8_t *src, size_t src_size) {
    memset(t, 0, sizeof *t);
    uint64_t v;
    size_t pos = 0, r;
    E8KV_RETURN_IF_ERROR(r = e8kv_varint_read(&v, src, src_size));
    pos += r;
    if (v > E8KV_RANS_MAX_SYMBOLS) return E8KV_ERR(CORRUPTED);
    t->n_sym = (uint32_t)v;
    uint32_t sum = 0;
    for (uint32_t s = 0; s < t->n_sym;) {
        E8KV_RETURN_IF_ERROR(r = e8kv_varint_read(&v, src + pos, src_size - pos));
        pos += r;
        if (v > E8KV_RANS_SCALE) return E8KV_ERR(CORRUPTED);
        t->freq[s] = (uint16_t)v;
        sum += (uint32_t)v;
        if (sum > E8KV_RANS_SCALE) return E8KV_ERR(CORRUPTED);
        if (v) {
            s++;
            continue;
        }
        E8KV_RETURN_IF_ERROR(r = e8kv_varint_read(&v, src + pos, src_size - pos));
        pos += r;
        if (v >= t->n_sym - s) return E8KV_ERR(CORRUPTED);
        s += 1 + (uint32_t)v;
    }
    if (t->n_sym && sum != E8KV_RANS_SCALE) return E8KV_ERR(CORRUPTED);
    fill_start(t);
    return pos;
}

void e8kv_rans_dtable_init(e8kv_rans_dtable *d, const e8kv_rans_table *t) {
    if (t->n_sym == 0) { /* empty model (never used by an encoder): decode symbol 0 and leave the state
                            unchanged, so a corrupt selector yields defined output, never a fault */
        for (uint32_t k = 0; k < E8KV_RANS_SCALE; k++) d->slot[k] = (E8KV_RANS_SCALE - 1u) << 8 | k << 20;
        return;
    }
    for (uint32_t s = 0; s < t->n_sym; s++)
        for (uint32_t k = 0; k < t->freq[s]; k++)
            d->slot[t->start[s] + k] = s | (uint32_t)(t->freq[s] - 1) << 8 | k << 20;
}
