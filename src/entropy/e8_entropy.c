/* Parity-aware E8 point coding (see e8_entropy.h): coset bit, 7 free coordinates and the last one with
 * its parity-implied low bit removed, each with its own rANS table per coset, escapes for rare values.
 *
 * Block layout: varint n_escape_bytes, escape bytes, varint coset_block_bytes, rANS block of the n
 * coset symbols (one table), rANS block of the 8n coordinate symbols (period 8, selector = coset). */
#include "e8_entropy.h"

#include <stdlib.h>

static inline uint32_t zigzag(int64_t v) { return (uint32_t)(v >= 0 ? 2 * v : -2 * v - 1); }
static inline int64_t unzigzag(uint64_t z) { return (z & 1) ? -(int64_t)((z + 1) / 2) : (int64_t)(z / 2); }

/* Split a point into its coset and 8 unescaped zigzag values. Returns 0, or BAD_ARGUMENT. */
static size_t split_point(const int32_t *y, uint8_t *coset, uint32_t z[8]) {
    const int32_t c = y[0] & 1;
    int64_t sum = 0, vsum = 0;
    for (int j = 0; j < 8; j++) {
        if ((y[j] & 1) != c || y[j] >= E8KV_E8_MAX_ABS || y[j] <= -E8KV_E8_MAX_ABS)
            return E8KV_ERR(BAD_ARGUMENT);
        sum += y[j];
    }
    if (sum % 4 != 0) return E8KV_ERR(BAD_ARGUMENT);
    for (int j = 0; j < 7; j++) {
        const int64_t v = ((int64_t)y[j] - c) / 2;
        vsum += v;
        z[j] = zigzag(v);
    }
    const int64_t v7 = ((int64_t)y[7] - c) / 2;
    const int64_t p = vsum & 1; /* sum of v is even, so v7 ≡ p (mod 2) */
    assert(((v7 - p) & 1) == 0);
    z[7] = zigzag((v7 - p) / 2);
    *coset = (uint8_t)c;
    return 0;
}

size_t e8kv_e8_model_fit(e8kv_e8_model *m, const int32_t *y2, size_t n_pts) {
    if (!m || (!y2 && n_pts)) return E8KV_ERR(BAD_ARGUMENT);
    uint64_t(*cnt)[256] = calloc(17, sizeof *cnt); /* [0] coset, [1 + 8c + j] coordinates */
    if (!cnt) return E8KV_ERR(OUT_OF_MEMORY);
    for (size_t i = 0; i < n_pts; i++) {
        uint8_t c;
        uint32_t z[8];
        const size_t r = split_point(y2 + 8 * i, &c, z);
        if (e8kv_is_error(r)) {
            free(cnt);
            return r;
        }
        cnt[0][c]++;
        for (int j = 0; j < 8; j++) cnt[1 + 8 * c + j][z[j] < E8KV_E8_ESCAPE ? z[j] : E8KV_E8_ESCAPE]++;
    }
    size_t r = e8kv_rans_table_build(&m->coset, cnt[0], 2);
    for (int c = 0; c < 2 && !e8kv_is_error(r); c++)
        for (int j = 0; j < 8 && !e8kv_is_error(r); j++)
            r = e8kv_rans_table_build(&m->coord[c][j], cnt[1 + 8 * c + j], 256);
    free(cnt);
    return e8kv_is_error(r) ? r : 0;
}

size_t e8kv_e8_model_write(uint8_t *dst, size_t dst_capacity, const e8kv_e8_model *m) {
    size_t pos = 0, r;
    E8KV_RETURN_IF_ERROR(r = e8kv_rans_table_write(dst, dst_capacity, &m->coset));
    pos += r;
    for (int c = 0; c < 2; c++)
        for (int j = 0; j < 8; j++) {
            E8KV_RETURN_IF_ERROR(r = e8kv_rans_table_write(dst + pos, dst_capacity - pos, &m->coord[c][j]));
            pos += r;
        }
    return pos;
}

size_t e8kv_e8_model_read(e8kv_e8_model *m, const uint8_t *src, size_t src_size) {
    size_t pos = 0, r;
    E8KV_RETURN_IF_ERROR(r = e8kv_rans_table_read(&m->coset, src, src_size));
    if (m->coset.n_sym > 2) return E8KV_ERR(CORRUPTED);
    pos += r;
    for (int c = 0; c < 2; c++)
        for (int j = 0; j < 8; j++) {
            E8KV_RETURN_IF_ERROR(r = e8kv_rans_table_read(&m->coord[c][j], src + pos, src_size - pos));
            pos += r;
        }
    return pos;
}

void e8kv_e8_dmodel_init(e8kv_e8_dmodel *d, const e8kv_e8_model *m) {
    e8kv_rans_dtable_init(&d->coset, &m->coset);
    for (int c = 0; c < 2; c++)
        for (int j = 0; j < 8; j++) e8kv_rans_dtable_init(&d->coord[c][j], &m->coord[c][j]);
}

size_t e8kv_e8_block_bound(size_t n_pts) {
    /* escapes: at most 5 varint bytes per coordinate (zigzag < 2^31) */
    return 10 + 8 * n_pts * 5 + e8kv_rans_bound(n_pts) + e8kv_rans_bound(8 * n_pts);
}

size_t e8kv_e8_block_encode(uint8_t *dst, size_t dst_capacity, const e8kv_e8_model *m, const int32_t *y2,
                            size_t n_pts) {
    if (!dst || !m || (!y2 && n_pts)) return E8KV_ERR(BAD_ARGUMENT);
    uint8_t *const sym = malloc(9 * n_pts + 1); /* n coset symbols, then 8n coordinate symbols */
    uint8_t *const esc = malloc(40 * n_pts + 1);
    size_t r = 0, n_esc = 0, pos = 0;
    if (!sym || !esc) {
        r = E8KV_ERR(OUT_OF_MEMORY);
        goto done;
    }
    for (size_t i = 0; i < n_pts; i++) {
        uint32_t z[8];
        r = split_point(y2 + 8 * i, &sym[i], z);
        if (e8kv_is_error(r)) goto done;
        for (int j = 0; j < 8; j++) {
            if (z[j] < E8KV_E8_ESCAPE) {
                sym[n_pts + 8 * i + j] = (uint8_t)z[j];
                continue;
            }
            sym[n_pts + 8 * i + j] = E8KV_E8_ESCAPE;
            n_esc += e8kv_varint_write(esc + n_esc, 5, z[j] - E8KV_E8_ESCAPE);
        }
    }
    if (e8kv_is_error(r = e8kv_varint_write(dst, dst_capacity, n_esc))) goto done;
    pos = r;
    if (dst_capacity - pos < n_esc) {
        r = E8KV_ERR(DST_TOO_SMALL);
        goto done;
    }
    memcpy(dst + pos, esc, n_esc);
    pos += n_esc;
    /* the coset block's size goes before it: encode it after a 5-byte gap, then close the gap */
    if (dst_capacity - pos < 5) {
        r = E8KV_ERR(DST_TOO_SMALL);
        goto done;
    }
    const size_t cb = e8kv_rans_encode(dst + pos + 5, dst_capacity - pos - 5, sym, n_pts, &m->coset, 1, NULL);
    if (e8kv_is_error(r = cb)) goto done;
    uint8_t len[10];
    const size_t lb = e8kv_varint_write(len, sizeof len, cb);
    memmove(dst + pos + lb, dst + pos + 5, cb);
    memcpy(dst + pos, len, lb);
    pos += lb + cb;
    r = e8kv_rans_encode(dst + pos, dst_capacity - pos, sym + n_pts, 8 * n_pts, &m->coord[0][0], 8, sym);
    if (!e8kv_is_error(r)) r += pos;
done:
    free(sym);
    free(esc);
    return r;
}

size_t e8kv_e8_block_decode(int32_t *y2, size_t n_pts, const e8kv_e8_dmodel *d, const uint8_t *src,
                            size_t src_size) {
    if ((!y2 && n_pts) || !d || !src) return E8KV_ERR(BAD_ARGUMENT);
    if (n_pts > SIZE_MAX / 16) return E8KV_ERR(BAD_ARGUMENT);
    uint64_t v;
    size_t pos = 0, r;
    E8KV_RETURN_IF_ERROR(r = e8kv_varint_read(&v, src, src_size));
    pos += r;
    if (v > src_size - pos) return E8KV_ERR(TRUNCATED);
    const uint8_t *const esc = src + pos, *const esc_end = src + pos + v;
    pos += (size_t)v;
    E8KV_RETURN_IF_ERROR(r = e8kv_varint_read(&v, src + pos, src_size - pos));
    pos += r;
    if (v > src_size - pos) return E8KV_ERR(TRUNCATED);
    const size_t cb = (size_t)v;
    uint8_t *const sym = malloc(9 * n_pts + 1);
    if (!sym) return E8KV_ERR(OUT_OF_MEMORY);
    r = e8kv_rans_decode(sym, n_pts, src + pos, cb, &d->coset, 1, NULL);
    if (e8kv_is_error(r)) goto done;
    for (size_t i = 0; i < n_pts; i++)
        if (sym[i] > 1) {
            r = E8KV_ERR(CORRUPTED);
            goto done;
        }
    pos += cb;
    r = e8kv_rans_decode(sym + n_pts, 8 * n_pts, src + pos, src_size - pos, &d->coord[0][0], 8, sym);
    if (e8kv_is_error(r)) goto done;
    const uint8_t *e = esc;
    for (size_t i = 0; i < n_pts; i++) {
        const int64_t c = sym[i];
        int64_t vsum = 0;
        for (int j = 0; j < 8; j++) {
            uint64_t z = sym[n_pts + 8 * i + j];
            if (z == E8KV_E8_ESCAPE) {
                uint64_t extra;
                r = e8kv_varint_read(&extra, e, (size_t)(esc_end - e));
                if (e8kv_is_error(r)) {
                    r = E8KV_ERR(CORRUPTED); /* the escape area is inside the block: short means corrupt */
                    goto done;
                }
                e += r;
                if (extra > ((uint64_t)1 << 32)) {
                    r = E8KV_ERR(CORRUPTED);
                    goto done;
                }
                z += extra;
            }
            int64_t val = unzigzag(z);
            if (j < 7) vsum += val;
            else val = 2 * val + (vsum & 1);
            const int64_t y = 2 * val + c;
            if (y >= E8KV_E8_MAX_ABS || y <= -E8KV_E8_MAX_ABS) {
                r = E8KV_ERR(CORRUPTED);
                goto done;
            }
            y2[8 * i + j] = (int32_t)y;
        }
    }
    r = (e == esc_end) ? n_pts : E8KV_ERR(CORRUPTED);
done:
    free(sym);
    return r;
}

size_t e8kv_e8_stream_bound(size_t n_pts) {
    return 10 + 17 * E8KV_RANS_TABLE_MAX_BYTES + e8kv_e8_block_bound(n_pts);
}

size_t e8kv_e8_stream_encode(void *dst, size_t dst_capacity, const int32_t *y2, size_t n_pts) {
    if (!dst || (!y2 && n_pts)) return E8KV_ERR(BAD_ARGUMENT);
    e8kv_e8_model *const m = malloc(sizeof *m);
    if (!m) return E8KV_ERR(OUT_OF_MEMORY);
    uint8_t *const out = dst;
    size_t pos = 0, r = e8kv_e8_model_fit(m, y2, n_pts);
    if (!e8kv_is_error(r)) r = e8kv_varint_write(out, dst_capacity, n_pts);
    if (!e8kv_is_error(r)) pos += r, r = e8kv_e8_model_write(out + pos, dst_capacity - pos, m);
    if (!e8kv_is_error(r)) pos += r, r = e8kv_e8_block_encode(out + pos, dst_capacity - pos, m, y2, n_pts);
    if (!e8kv_is_error(r)) r += pos;
    free(m);
    return r;
}

size_t e8kv_e8_stream_decode(int32_t *y2, size_t y2_capacity, const void *src, size_t src_size) {
    if (!y2 || !src) return E8KV_ERR(BAD_ARGUMENT);
    const uint8_t *const in = src;
    uint64_t n;
    size_t pos = 0, r;
    E8KV_RETURN_IF_ERROR(r = e8kv_varint_read(&n, in, src_size));
    pos += r;
    if (n > y2_capacity / 8) return E8KV_ERR(DST_TOO_SMALL);
    e8kv_e8_model *const m = malloc(sizeof *m);
    e8kv_e8_dmodel *const d = malloc(sizeof *d);
    if (!m || !d) {
        r = E8KV_ERR(OUT_OF_MEMORY);
        goto done;
    }
    if (e8kv_is_error(r = e8kv_e8_model_read(m, in + pos, src_size - pos))) goto done;
    pos += r;
    e8kv_e8_dmodel_init(d, m);
    r = e8kv_e8_block_decode(y2, (size_t)n, d, in + pos, src_size - pos);
done:
    free(m);
    free(d);
    return r;
}

size_t e8kv_e8_coded_size(const int32_t *y2, size_t n_pts) {
    const size_t cap = e8kv_e8_stream_bound(n_pts);
    void *const buf = malloc(cap);
    if (!buf) return E8KV_ERR(OUT_OF_MEMORY);
    const size_t r = e8kv_e8_stream_encode(buf, cap, y2, n_pts);
    free(buf);
    return r;
}
