/* Cold-tier frames (doc/format.md §3): header, models shared by all pages, a page index for random
 * access, XXH64 over everything before the pages and XXH32 per page. Each page is coded on its own with
 * the frame's models (rANS per byte position, parity-aware E8, or delta + zstd) and is stored raw when
 * coding would not make it smaller. */
#include "e8_entropy.h"
#include "rans.h"
#include "zstd_path.h"

#include <stdlib.h>
#include <xxhash.h>

#define FRAME_MAGIC "E8KF"
#define FRAME_FIXED 40                 /* bytes of the fixed header */
#define PAGE_RAW_FLAG 0x80000000u      /* in a page index size: the page is stored raw */
#define PAGE_MAX_BYTES 0x7fffffffu
#define FLAG_DELTA 1u
#define MAX_PERFIELD 256               /* per-byte-position models for rows up to this many bytes */

typedef struct {
    e8kv_frame_info info;
    const uint8_t *tables;
    size_t tables_size;
    const uint8_t *index;
} frame_view;

static size_t tables_bound(size_t row_bytes) {
    const size_t n = row_bytes <= MAX_PERFIELD ? (row_bytes > 17 ? row_bytes : 17) : 17;
    return 10 + n * E8KV_RANS_TABLE_MAX_BYTES;
}

static size_t page_rows(const e8kv_frame_info *fi, size_t page) {
    const size_t first = page * fi->rows_per_page;
    const size_t left = fi->n_rows - first;
    return left < fi->rows_per_page ? left : fi->rows_per_page;
}

size_t e8kv_compress_bound(size_t row_bytes, size_t n_rows, size_t rows_per_page, size_t meta_size) {
    if (row_bytes == 0 || n_rows > SIZE_MAX / 2 / row_bytes) return E8KV_ERR(BAD_ARGUMENT);
    if (rows_per_page == 0 || rows_per_page > n_rows) rows_per_page = n_rows ? n_rows : 1;
    const size_t n_pages = (n_rows + rows_per_page - 1) / rows_per_page;
    return FRAME_FIXED + meta_size + tables_bound(row_bytes) + 8 * n_pages + 8 + n_rows * row_bytes;
}

/* ---- models */

typedef struct {
    size_t period;               /* BYTES/RANS: 1 or row_bytes */
    e8kv_rans_table *t;          /* BYTES/RANS: period tables */
    e8kv_rans_dtable *d;
    e8kv_e8_model *e8;           /* E8/RANS */
    e8kv_e8_dmodel *e8d;
} models;

static void models_free(models *m) {
    free(m->t), free(m->d), free(m->e8), free(m->e8d);
    memset(m, 0, sizeof *m);
}

static void int16_to_points(int32_t *p, const uint8_t *rows, size_t n_val) {
    for (size_t k = 0; k < n_val; k++) p[k] = (int16_t)e8kv_load_le16(rows + 2 * k);
}

/* Fit the frame's models and write them to dst. Returns bytes written. */
static size_t models_fit_write(models *m, uint8_t *dst, size_t cap, const e8kv_frame_info *fi,
                               const uint8_t *src) {
    const size_t n_bytes = fi->n_rows * fi->row_bytes;
    if (fi->content == E8KV_FRAME_E8) {
        int32_t *const p = malloc((n_bytes / 2 + 1) * sizeof *p);
        m->e8 = malloc(sizeof *m->e8);
        if (!p || !m->e8) {
            free(p);
            return E8KV_ERR(OUT_OF_MEMORY);
        }
        int16_to_points(p, src, n_bytes / 2);
        const size_t r = e8kv_e8_model_fit(m->e8, p, n_bytes / 16);
        free(p);
        E8KV_RETURN_IF_ERROR(r);
        return e8kv_e8_model_write(dst, cap, m->e8);
    }
    /* bytes: one model per byte position, or one for all, whichever codes smaller (tables counted) */
    const size_t rb = fi->row_bytes, max_p = rb <= MAX_PERFIELD ? rb : 1;
    uint64_t *const cnt = calloc(256 * max_p, sizeof *cnt);
    uint64_t *const all = calloc(256, sizeof *all);
    m->t = malloc(max_p * sizeof *m->t);
    e8kv_rans_table *const one = malloc(sizeof *one);
    uint8_t *const scratch = malloc(E8KV_RANS_TABLE_MAX_BYTES);
    size_t r = 0;
    if (!cnt || !all || !m->t || !one || !scratch) {
        r = E8KV_ERR(OUT_OF_MEMORY);
        goto done;
    }
    for (size_t i = 0; i < n_bytes; i++) cnt[256 * (i % rb % max_p) + src[i]]++, all[src[i]]++;
    double bits_pf = 0, bits_one;
    for (size_t k = 0; k < max_p && !e8kv_is_error(r); k++) {
        r = e8kv_rans_table_build(&m->t[k], cnt + 256 * k, 256);
        if (!e8kv_is_error(r)) bits_pf += e8kv_rans_table_cost_bits(&m->t[k], cnt + 256 * k) +
                                          8.0 * (double)e8kv_rans_table_write(scratch, E8KV_RANS_TABLE_MAX_BYTES, &m->t[k]);
    }
    if (e8kv_is_error(r) || e8kv_is_error(r = e8kv_rans_table_build(one, all, 256))) goto done;
    bits_one = e8kv_rans_table_cost_bits(one, all) +
               8.0 * (double)e8kv_rans_table_write(scratch, E8KV_RANS_TABLE_MAX_BYTES, one);
    m->period = max_p;
    if (max_p > 1 && bits_one <= bits_pf) {
        m->period = 1;
        m->t[0] = *one;
    }
    size_t pos;
    if (e8kv_is_error(r = e8kv_varint_write(dst, cap, m->period))) goto done;
    pos = r;
    for (size_t k = 0; k < m->period; k++) {
        if (e8kv_is_error(r = e8kv_rans_table_write(dst + pos, cap - pos, &m->t[k]))) goto done;
        pos += r;
    }
    r = pos;
done:
    free(cnt), free(all), free(one), free(scratch);
    return r;
}

/* Parse the models of a frame (and build the decoder tables). */
static size_t models_read(models *m, const frame_view *v) {
    const e8kv_frame_info *fi = &v->info;
    size_t pos = 0, r;
    if (fi->coder != E8KV_FRAME_RANS) return v->tables_size == 0 ? 0 : E8KV_ERR(CORRUPTED);
    if (fi->content == E8KV_FRAME_E8) {
        m->e8 = malloc(sizeof *m->e8);
        m->e8d = malloc(sizeof *m->e8d);
        if (!m->e8 || !m->e8d) return E8KV_ERR(OUT_OF_MEMORY);
        E8KV_RETURN_IF_ERROR(r = e8kv_e8_model_read(m->e8, v->tables, v->tables_size));
        if (r != v->tables_size) return E8KV_ERR(CORRUPTED);
        e8kv_e8_dmodel_init(m->e8d, m->e8);
        return 0;
    }
    uint64_t p;
    E8KV_RETURN_IF_ERROR(r = e8kv_varint_read(&p, v->tables, v->tables_size));
    pos += r;
    if (p != 1 && (p != fi->row_bytes || p > MAX_PERFIELD)) return E8KV_ERR(CORRUPTED);
    m->period = (size_t)p;
    m->t = malloc(m->period * sizeof *m->t);
    m->d = malloc(m->period * sizeof *m->d);
    if (!m->t || !m->d) return E8KV_ERR(OUT_OF_MEMORY);
    for (size_t k = 0; k < m->period; k++) {
        E8KV_RETURN_IF_ERROR(r = e8kv_rans_table_read(&m->t[k], v->tables + pos, v->tables_size - pos));
        pos += r;
        e8kv_rans_dtable_init(&m->d[k], &m->t[k]);
    }
    return pos == v->tables_size ? 0 : E8KV_ERR(CORRUPTED);
}

/* ---- pages */

static size_t page_encode(uint8_t *dst, size_t cap, const models *m, const e8kv_frame_info *fi,
                          const e8kv_frame_params *p, const uint8_t *rows, size_t n_rows) {
    const size_t n_bytes = n_rows * fi->row_bytes;
    switch (fi->coder) {
    case E8KV_FRAME_RANS:
        if (fi->content == E8KV_FRAME_BYTES)
            return e8kv_rans_encode(dst, cap, rows, n_bytes, m->t, m->period, NULL);
        else {
            int32_t *const pts = malloc((n_bytes / 2 + 1) * sizeof *pts);
            if (!pts) return E8KV_ERR(OUT_OF_MEMORY);
            int16_to_points(pts, rows, n_bytes / 2);
            const size_t r = e8kv_e8_block_encode(dst, cap, m->e8, pts, n_bytes / 16);
            free(pts);
            return r;
        }
    case E8KV_FRAME_ZSTD:
        return e8kv_zstd_page_encode(dst, cap, rows, fi->row_bytes, n_rows,
                                     fi->content == E8KV_FRAME_E8 ? 2 : 1, fi->delta, p->zstd_level);
    default:
        return E8KV_ERR(BAD_ARGUMENT);
    }
}

static size_t page_decode(uint8_t *rows, size_t n_rows, const models *m, const e8kv_frame_info *fi,
                          const uint8_t *src, size_t size) {
    const size_t n_bytes = n_rows * fi->row_bytes;
    switch (fi->coder) {
    case E8KV_FRAME_RANS:
        if (fi->content == E8KV_FRAME_BYTES)
            return e8kv_rans_decode(rows, n_bytes, src, size, m->d, m->period, NULL);
        else {
            int32_t *const pts = malloc((n_bytes / 2 + 1) * sizeof *pts);
            if (!pts) return E8KV_ERR(OUT_OF_MEMORY);
            size_t r = e8kv_e8_block_decode(pts, n_bytes / 16, m->e8d, src, size);
            for (size_t k = 0; !e8kv_is_error(r) && k < n_bytes / 2; k++) {
                if (pts[k] > INT16_MAX || pts[k] < INT16_MIN) r = E8KV_ERR(CORRUPTED);
                else e8kv_store_le16(rows + 2 * k, (uint16_t)(int16_t)pts[k]);
            }
            free(pts);
            return e8kv_is_error(r) ? r : n_bytes;
        }
    case E8KV_FRAME_ZSTD:
        return e8kv_zstd_page_decode(rows, fi->row_bytes, n_rows, src, size,
                                     fi->content == E8KV_FRAME_E8 ? 2 : 1, fi->delta);
    default:
        return E8KV_ERR(CORRUPTED);
    }
}

/* ---- encode */

size_t e8kv_frame_encode(void *dst, size_t dst_capacity, const void *src, size_t row_bytes, size_t n_rows,
                         const e8kv_frame_params *params) {
    if (!dst || (!src && n_rows) || !params || row_bytes == 0 || row_bytes > UINT32_MAX)
        return E8KV_ERR(BAD_ARGUMENT);
    if ((params->meta_size && !params->meta) || params->meta_size > 65535) return E8KV_ERR(BAD_ARGUMENT);
    if (params->content != E8KV_FRAME_BYTES && params->content != E8KV_FRAME_E8) return E8KV_ERR(BAD_ARGUMENT);
    if (params->coder != E8KV_FRAME_STORED && params->coder != E8KV_FRAME_RANS &&
        params->coder != E8KV_FRAME_ZSTD)
        return E8KV_ERR(BAD_ARGUMENT);
    if (params->content == E8KV_FRAME_E8 && row_bytes % 16) return E8KV_ERR(BAD_ARGUMENT);
    if (n_rows > SIZE_MAX / 2 / row_bytes) return E8KV_ERR(BAD_ARGUMENT);
    e8kv_frame_info fi = {.version = E8KV_FRAME_VERSION, .content = params->content, .coder = params->coder,
                          .delta = params->coder == E8KV_FRAME_ZSTD && params->delta, .row_bytes = row_bytes,
                          .n_rows = n_rows, .meta_size = params->meta_size};
    fi.rows_per_page = params->rows_per_page && params->rows_per_page < n_rows ? params->rows_per_page
                                                                             : (n_rows ? n_rows : 1);
    if (fi.rows_per_page > PAGE_MAX_BYTES / row_bytes) return E8KV_ERR(BAD_ARGUMENT);
    fi.n_pages = (n_rows + fi.rows_per_page - 1) / fi.rows_per_page;
    if (fi.n_pages > UINT32_MAX) return E8KV_ERR(BAD_ARGUMENT);

    uint8_t *const out = dst;
    const uint8_t *const in = src;
    models m = {0};
    uint8_t *scratch = NULL;
    size_t r = 0, pos = FRAME_FIXED + fi.meta_size;
    if (dst_capacity < pos) return E8KV_ERR(DST_TOO_SMALL);
    if (fi.meta_size) memcpy(out + FRAME_FIXED, params->meta, fi.meta_size);
    size_t tables_size = 0;
    if (fi.coder == E8KV_FRAME_RANS) {
        if (e8kv_is_error(r = models_fit_write(&m, out + pos, dst_capacity - pos, &fi, in))) goto done;
        tables_size = r;
        pos += r;
    }
    const size_t index_pos = pos;
    if (dst_capacity - pos < 8 * fi.n_pages + 8) {
        r = E8KV_ERR(DST_TOO_SMALL);
        goto done;
    }
    pos += 8 * fi.n_pages + 8;
    const size_t header_size = pos;
    const size_t page_raw_max = fi.rows_per_page * row_bytes;
    size_t scratch_cap = 0;
    if (fi.coder == E8KV_FRAME_RANS)
        scratch_cap = fi.content == E8KV_FRAME_E8 ? e8kv_e8_block_bound(page_raw_max / 16)
                                                  : e8kv_rans_bound(page_raw_max);
    else if (fi.coder == E8KV_FRAME_ZSTD)
        scratch_cap = e8kv_zstd_page_bound(page_raw_max);
    if (scratch_cap && !(scratch = malloc(scratch_cap))) {
        r = E8KV_ERR(OUT_OF_MEMORY);
        goto done;
    }
    for (size_t pg = 0; pg < fi.n_pages; pg++) {
        const size_t nr = page_rows(&fi, pg), raw = nr * row_bytes;
        const uint8_t *const rows = in + pg * fi.rows_per_page * row_bytes;
        size_t sz = raw;
        uint32_t flag = PAGE_RAW_FLAG;
        const uint8_t *body = rows;
        if (fi.coder != E8KV_FRAME_STORED) {
            r = page_encode(scratch, scratch_cap, &m, &fi, params, rows, nr);
            if (e8kv_is_error(r)) goto done;
            if (r < raw) sz = r, flag = 0, body = scratch;
        }
        if (dst_capacity - pos < sz) {
            r = E8KV_ERR(DST_TOO_SMALL);
            goto done;
        }
        memcpy(out + pos, body, sz);
        e8kv_store_le32(out + index_pos + 8 * pg, (uint32_t)sz | flag);
        e8kv_store_le32(out + index_pos + 8 * pg + 4, XXH32(body, sz, 0));
        pos += sz;
    }
    memcpy(out, FRAME_MAGIC, 4);
    e8kv_store_le16(out + 4, E8KV_FRAME_VERSION);
    out[6] = (uint8_t)fi.content;
    out[7] = (uint8_t)fi.coder;
    e8kv_store_le32(out + 8, fi.delta ? FLAG_DELTA : 0);
    e8kv_store_le32(out + 12, (uint32_t)row_bytes);
    e8kv_store_le64(out + 16, n_rows);
    e8kv_store_le32(out + 24, (uint32_t)fi.rows_per_page);
    e8kv_store_le32(out + 28, (uint32_t)fi.n_pages);
    e8kv_store_le16(out + 32, (uint16_t)fi.meta_size);
    e8kv_store_le16(out + 34, 0);
    e8kv_store_le32(out + 36, (uint32_t)tables_size);
    e8kv_store_le64(out + header_size - 8, XXH64(out, header_size - 8, 0));
    r = pos;
done:
    models_free(&m);
    free(scratch);
    return r;
}

/* ---- decode */

static size_t frame_open(frame_view *v, const uint8_t *src, size_t src_size) {
    memset(v, 0, sizeof *v);
    e8kv_frame_info *fi = &v->info;
    if (src_size < 6) return E8KV_ERR(TRUNCATED);
    if (memcmp(src, FRAME_MAGIC, 4) != 0) return E8KV_ERR(CORRUPTED);
    fi->version = e8kv_load_le16(src + 4);
    if (fi->version != E8KV_FRAME_VERSION) return E8KV_ERR(VERSION);
    if (src_size < FRAME_FIXED) return E8KV_ERR(TRUNCATED);
    const uint32_t flags = e8kv_load_le32(src + 8);
    if (src[6] > E8KV_FRAME_E8 || src[7] > E8KV_FRAME_ZSTD || (flags & ~FLAG_DELTA)) return E8KV_ERR(CORRUPTED);
    fi->content = (e8kv_frame_content)src[6];
    fi->coder = (e8kv_frame_coder)src[7];
    fi->delta = (flags & FLAG_DELTA) != 0;
    fi->row_bytes = e8kv_load_le32(src + 12);
    const uint64_t n_rows = e8kv_load_le64(src + 16);
    fi->rows_per_page = e8kv_load_le32(src + 24);
    fi->n_pages = e8kv_load_le32(src + 28);
    fi->meta_size = e8kv_load_le16(src + 32);
    fi->meta_offset = FRAME_FIXED;
    v->tables_size = e8kv_load_le32(src + 36);
    if (fi->row_bytes == 0 || fi->rows_per_page == 0 || e8kv_load_le16(src + 34) != 0) return E8KV_ERR(CORRUPTED);
    if (fi->rows_per_page > PAGE_MAX_BYTES / fi->row_bytes) return E8KV_ERR(CORRUPTED);
    if (fi->content == E8KV_FRAME_E8 && fi->row_bytes % 16) return E8KV_ERR(CORRUPTED);
    if (fi->delta && fi->coder != E8KV_FRAME_ZSTD) return E8KV_ERR(CORRUPTED);
    if (n_rows / fi->rows_per_page > UINT32_MAX) return E8KV_ERR(CORRUPTED);
    fi->n_rows = (size_t)n_rows;
    if ((fi->n_rows + fi->rows_per_page - 1) / fi->rows_per_page != fi->n_pages) return E8KV_ERR(CORRUPTED);
    /* every size above is < 2^32 and there are at most 2^32 pages, so these sums cannot overflow */
    fi->header_size = FRAME_FIXED + fi->meta_size + v->tables_size + 8 * fi->n_pages + 8;
    if (src_size < fi->header_size) return E8KV_ERR(TRUNCATED);
    if (XXH64(src, fi->header_size - 8, 0) != e8kv_load_le64(src + fi->header_size - 8))
        return E8KV_ERR(CHECKSUM);
    v->tables = src + FRAME_FIXED + fi->meta_size;
    v->index = v->tables + v->tables_size;
    uint64_t total = fi->header_size;
    for (size_t pg = 0; pg < fi->n_pages; pg++) {
        const uint32_t e = e8kv_load_le32(v->index + 8 * pg);
        const size_t raw = page_rows(fi, pg) * fi->row_bytes;
        if ((e & PAGE_RAW_FLAG) ? (e & ~PAGE_RAW_FLAG) != raw : fi->coder == E8KV_FRAME_STORED)
            return E8KV_ERR(CORRUPTED);
        total += e & ~PAGE_RAW_FLAG;
    }
    if (total > SIZE_MAX) return E8KV_ERR(CORRUPTED);
    fi->frame_size = (size_t)total;
    return fi->frame_size;
}

size_t e8kv_frame_get_info(e8kv_frame_info *info, const void *src, size_t src_size) {
    if (!info || !src) return E8KV_ERR(BAD_ARGUMENT);
    frame_view v;
    const size_t r = frame_open(&v, src, src_size);
    if (!e8kv_is_error(r)) *info = v.info;
    return r;
}

static size_t page_offset(const frame_view *v, size_t page) {
    size_t off = v->info.header_size;
    for (size_t pg = 0; pg < page; pg++) off += e8kv_load_le32(v->index + 8 * pg) & ~PAGE_RAW_FLAG;
    return off;
}

/* Decode pages [first, last) into dst; src holds the whole frame. */
static size_t decode_pages(uint8_t *dst, size_t dst_capacity, const frame_view *v, const uint8_t *src,
                           size_t first, size_t last) {
    const e8kv_frame_info *fi = &v->info;
    size_t need = 0;
    for (size_t pg = first; pg < last; pg++) need += page_rows(fi, pg) * fi->row_bytes;
    if (dst_capacity < need) return E8KV_ERR(DST_TOO_SMALL);
    models m = {0};
    size_t r = models_read(&m, v), written = 0, off = page_offset(v, first);
    for (size_t pg = first; pg < last && !e8kv_is_error(r); pg++) {
        const uint32_t e = e8kv_load_le32(v->index + 8 * pg);
        const size_t sz = e & ~PAGE_RAW_FLAG, nr = page_rows(fi, pg);
        if (XXH32(src + off, sz, 0) != e8kv_load_le32(v->index + 8 * pg + 4)) {
            r = E8KV_ERR(CHECKSUM);
            break;
        }
        if (e & PAGE_RAW_FLAG) memcpy(dst + written, src + off, sz);
        else r = page_decode(dst + written, nr, &m, fi, src + off, sz);
        written += nr * fi->row_bytes;
        off += sz;
    }
    models_free(&m);
    return e8kv_is_error(r) ? r : written;
}

size_t e8kv_frame_decode(void *dst, size_t dst_capacity, const void *src, size_t src_size) {
    if ((!dst && dst_capacity) || !src) return E8KV_ERR(BAD_ARGUMENT);
    frame_view v;
    E8KV_RETURN_IF_ERROR(frame_open(&v, src, src_size));
    if (src_size < v.info.frame_size) return E8KV_ERR(TRUNCATED);
    if (src_size > v.info.frame_size) return E8KV_ERR(CORRUPTED);
    if (!dst && v.info.n_rows) return E8KV_ERR(DST_TOO_SMALL);
    return decode_pages(dst, dst_capacity, &v, src, 0, v.info.n_pages);
}

size_t e8kv_frame_decode_page(void *dst, size_t dst_capacity, const void *src, size_t src_size, size_t page) {
    if (!dst || !src) return E8KV_ERR(BAD_ARGUMENT);
    frame_view v;
    E8KV_RETURN_IF_ERROR(frame_open(&v, src, src_size));
    if (page >= v.info.n_pages) return E8KV_ERR(BAD_ARGUMENT);
    if (src_size < v.info.frame_size) return E8KV_ERR(TRUNCATED);
    if (src_size > v.info.frame_size) return E8KV_ERR(CORRUPTED);
    return decode_pages(dst, dst_capacity, &v, src, page, page + 1);
}
