/* Saving and loading a whole KV cache (doc/format.md §4): parameters as a canonical cache spec, per-layer
 * token counts, the exact sink and window (raw f32) tokens, and every coded page. Coded pages go through
 * an entropy-coded frame per layer and stream (doc/format.md §3, rANS over the codec bytes), so the
 * saved form is smaller than the hot pages and decodes bit-exactly back to them. XXH64 over the whole
 * file, plus the frames' own checksums. Untrusted bytes: every count of stored data (tokens, pages, rows)
 * is checked against the bytes that back it before anything is allocated from it; the configured capacity
 * (n_ctx, sink), which a small file may legitimately describe, is bounded (page tables at most 2^26
 * entries); failures are named errors, never asserts. */
#include "kvcache.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#define CACHE_MAGIC "E8KC"
/* header flags (offset 60), sections after the meta in this order: */
#define CACHE_FLAG_FREQS 2u /* RoPE's frequencies (params.rope_freqs), head_dim/2 f32 (version 3) */
#define CACHE_FLAG_CALIB 1u /* a calibration (versions 2 and 3) */
#define CACHE_HEADER_BYTES 64
#define CANON_SPEC_MAX E8KV_CACHE_SPEC_MAX /* what kvcache.c parses */
#define CANON_RULES_MAX E8KV_CACHE_RULES_MAX
#define FRAME_ROWS_PER_PAGE 1024
#define PAGE_ABSENT 0
#define PAGE_RAW 1
#define PAGE_CODED 2
/* Loading refuses headers whose page tables alone would exceed this many entries (16 bytes each). */
#define LOAD_MAX_TABLE_ENTRIES ((size_t)1 << 26)
/* ... and whose sink buffers, or centering means, would exceed this many floats. */
#define LOAD_MAX_FIXED_FLOATS ((size_t)1 << 28)

_Static_assert(CACHE_HEADER_BYTES == 4 + 2 + 2 + 8 + 4 * 4 + 8 + 8 + 4 + 4 + 4 + 4, "§4.1 header size");

/* ---------------------------------------------------------------- canonical spec */

/* The spec a stream's format was made from (an e8t stream's nominal "e8t:B"). */
static const char *fmt_spec(const e8kv_cache *c, size_t l, int is_k) {
    const kv_format *f = is_k ? &c->layers[l].k : &c->layers[l].v;
    return f->xf ? f->xf->spec : e8kv_codec_spec(f->codec);
}

/* The cache spec that recreates c's configuration: "k=K,v=V[,layersA-B.k=X]...,window=W,sink=S,page=P,
 * center=0|1,rope=pre|post" with K, V the formats of layer 0 and one rule per run of layers that differ
 * from them (e8t streams by their "e8t:B" name: with the calibration saved beside the spec they rebuild
 * the same transforms). */
static size_t canon_spec(const e8kv_cache *c, char *dst, size_t cap) {
    size_t n = 0, n_rules = 0;
    for (size_t i = 0; i < c->n_codecs; i++) /* token-group formats (the peers kivi, kvquant) are not saved */
        if (e8kv_codec_traits(c->codecs[i])->layout == E8KV_PAGE_TOKEN_GROUP) return E8KV_ERR(UNSUPPORTED);
    int w = snprintf(dst, cap, "k=%s,v=%s", fmt_spec(c, 0, 1), fmt_spec(c, 0, 0));
    if (w < 0 || (size_t)w >= cap) return E8KV_ERR(UNSUPPORTED);
    n = (size_t)w;
    for (int is_k = 1; is_k >= 0; is_k--) {
        const char *base = fmt_spec(c, 0, is_k);
        for (size_t l = 1; l < c->n_layer;) {
            const char *x = fmt_spec(c, l, is_k);
            if (!strcmp(x, base)) {
                l++;
                continue;
            }
            size_t e = l;
            while (e + 1 < c->n_layer && !strcmp(fmt_spec(c, e + 1, is_k), x)) e++;
            if (++n_rules > CANON_RULES_MAX) return E8KV_ERR(UNSUPPORTED);
            w = snprintf(dst + n, cap - n, ",layers%zu-%zu.%c=%s", l, e, is_k ? 'k' : 'v', x);
            if (w < 0 || (size_t)w >= cap - n) return E8KV_ERR(UNSUPPORTED);
            n += (size_t)w;
            l = e + 1;
        }
    }
    w = snprintf(dst + n, cap - n, ",window=%zu,sink=%zu,page=%zu,center=%s,rope=%s", c->window, c->n_sink,
                 c->page_tokens, c->center == 3 ? "rope" : c->center == 2 ? "all" : c->center ? "1" : "0",
                 c->rope_pre ? "pre" : "post");
    if (w < 0 || (size_t)w >= cap - n) return E8KV_ERR(UNSUPPORTED);
    n += (size_t)w;
    const size_t e = e8kv_evict_canon(c, dst + n, cap - n); /* eviction items, when configured */
    E8KV_RETURN_IF_ERROR(e);
    return n + e;
}

/* Eviction section (defined with the other eviction code at the end of this file). */
static size_t evict_bound(const e8kv_cache *c);
typedef struct wbuf wbuf;
typedef struct rbuf rbuf;
static size_t save_evict(wbuf *w, const e8kv_cache *c);
static size_t load_evict(rbuf *r, e8kv_cache *c);

/* ---------------------------------------------------------------- sizes */

static size_t n_pages_used(const e8kv_cache *c, size_t n_tokens) {
    return (n_tokens + c->page_tokens - 1) / c->page_tokens;
}

/* Tokens of page i that are stored (positions below n_tokens). */
static size_t page_valid(const e8kv_cache *c, size_t i, size_t n_tokens) {
    const size_t first = i * c->page_tokens;
    return n_tokens - first < c->page_tokens ? n_tokens - first : c->page_tokens;
}

/* A page exists exactly when one of its stored positions is not a sink position (kvcache.c allocates on
 * the first non-sink write). */
static int page_expected(const e8kv_cache *c, size_t i, size_t n_tokens) {
    return i * c->page_tokens + page_valid(c, i, n_tokens) > c->n_sink;
}

static size_t sink_used(const e8kv_cache *c, size_t n_tokens) {
    return n_tokens < c->n_sink ? n_tokens : c->n_sink;
}

/* Coded rows (stored tokens of coded pages) of one stream of layer L. */
static size_t coded_rows(const e8kv_cache *c, const kv_layer *L, int is_k) {
    const kv_page *tab = is_k ? L->k_pages : L->v_pages;
    size_t n = 0;
    for (size_t h = 0; h < c->n_head_kv; h++)
        for (size_t i = 0; i < n_pages_used(c, L->n_tokens); i++) {
            const kv_page *pg = &tab[h * c->n_page_max + i];
            if (pg->data && !pg->raw) n += page_valid(c, i, L->n_tokens);
        }
    return n;
}

static size_t raw_tokens(const e8kv_cache *c, const kv_layer *L, int is_k) {
    const kv_page *tab = is_k ? L->k_pages : L->v_pages;
    size_t n = 0;
    for (size_t h = 0; h < c->n_head_kv; h++)
        for (size_t i = 0; i < n_pages_used(c, L->n_tokens); i++) {
            const kv_page *pg = &tab[h * c->n_page_max + i];
            if (pg->data && pg->raw) n += page_valid(c, i, L->n_tokens);
        }
    return n;
}

/* Coded pages are grouped by codec: one frame per codec of the cache (c->codecs, in order of first use
 * scanning layers with K before V, which is the order e8kv_cache_create makes them in), rows in the
 * order (layer, K before V, head, page, token). e8t streams belong to the group of their e8:B code. */
static size_t group_rows(const e8kv_cache *c, const e8kv_codec *codec) {
    size_t n = 0;
    for (size_t l = 0; l < c->n_layer; l++) {
        const kv_layer *L = &c->layers[l];
        if (L->k.codec == codec) n += coded_rows(c, L, 1);
        if (L->v.codec == codec) n += coded_rows(c, L, 0);
    }
    return n;
}

/* Copy the coded rows of one group between the pages and buf (to_buf: pages -> buf). */
static void group_copy(const e8kv_cache *c, const e8kv_codec *codec, uint8_t *buf, int to_buf) {
    size_t off = 0;
    for (size_t l = 0; l < c->n_layer; l++)
        for (int is_k = 1; is_k >= 0; is_k--) {
            const kv_layer *L = &c->layers[l];
            const kv_format *f = is_k ? &L->k : &L->v;
            if (f->codec != codec) continue;
            kv_page *tab = is_k ? L->k_pages : L->v_pages;
            for (size_t h = 0; h < c->n_head_kv; h++)
                for (size_t i = 0; i < n_pages_used(c, L->n_tokens); i++) {
                    kv_page *pg = &tab[h * c->n_page_max + i];
                    if (!pg->data || pg->raw) continue;
                    const size_t nb = page_valid(c, i, L->n_tokens) * f->vector_bytes;
                    if (to_buf)
                        memcpy(buf + off, pg->data, nb);
                    else
                        memcpy(pg->data, buf + off, nb);
                    off += nb;
                }
        }
}

size_t e8kv_cache_save_bound(const e8kv_cache *cache, size_t meta_size) {
    if (!cache || meta_size > UINT32_MAX) return E8KV_ERR(BAD_ARGUMENT);
    const e8kv_cache *c = cache;
    size_t n = CACHE_HEADER_BYTES + CANON_SPEC_MAX + meta_size + 8 + kv_n_rope_freqs(c) * sizeof(float);
    const size_t d4 = c->head_dim * sizeof(float);
    for (size_t l = 0; l < c->n_layer; l++) {
        const kv_layer *L = &c->layers[l];
        n += 4 + 2 * c->n_head_kv * n_pages_used(c, L->n_tokens);
        if (L->k_mu) n += 4 + 2 * c->n_head_kv * d4;
        if (L->k_rc) n += c->n_head_kv * E8KV_RC_PAIRS * 3 * 4;
        n += 2 * c->n_head_kv * sink_used(c, L->n_tokens) * d4;
        n += (raw_tokens(c, L, 1) + raw_tokens(c, L, 0)) * d4;
    }
    for (size_t g = 0; g < c->n_codecs; g++) {
        const size_t rows = group_rows(c, c->codecs[g]);
        n += 4;
        if (rows) {
            const size_t b = e8kv_compress_bound(c->codecs[g]->vector_bytes, rows, FRAME_ROWS_PER_PAGE, 0);
            E8KV_RETURN_IF_ERROR(b);
            n += b;
        }
    }
    if (c->ev.scorer) {
        const size_t b = evict_bound(c);
        E8KV_RETURN_IF_ERROR(b);
        n += b;
    }
    if (c->calib && c->xforms) {
        const size_t b = e8kv_calib_save_bound(c->calib);
        E8KV_RETURN_IF_ERROR(b);
        n += 8 + b;
    }
    return n;
}

/* ---------------------------------------------------------------- save */

struct wbuf {
    uint8_t *p, *end;
};

static size_t put(wbuf *w, const void *src, size_t n) {
    if ((size_t)(w->end - w->p) < n) return E8KV_ERR(DST_TOO_SMALL);
    if (n) memcpy(w->p, src, n);
    w->p += n;
    return 0;
}

static size_t put_u32(wbuf *w, uint32_t v) {
    uint8_t b[4];
    e8kv_store_le32(b, v);
    return put(w, b, 4);
}

static size_t put_f32s(wbuf *w, const float *x, size_t n) {
    if ((size_t)(w->end - w->p) / 4 < n) return E8KV_ERR(DST_TOO_SMALL);
    for (size_t i = 0; i < n; i++)
        e8kv_store_lef32(w->p + 4 * i, x[i]);
    w->p += 4 * n;
    return 0;
}

/* A u32 size, then rows x row_bytes of `rows_buf` as one frame; frees rows_buf (malloc'd by the caller). */
static size_t put_frame(wbuf *w, uint8_t *rows_buf, size_t row_bytes, size_t rows,
                        const e8kv_frame_params *fp) {
    size_t r = (size_t)(w->end - w->p) < 4 ? E8KV_ERR(DST_TOO_SMALL) : 0;
    if (!e8kv_is_error(r))
        r = e8kv_frame_encode(w->p + 4, (size_t)(w->end - w->p) - 4, rows_buf, row_bytes, rows, fp);
    free(rows_buf);
    if (e8kv_is_error(r)) return r;
    if (r > UINT32_MAX) return E8KV_ERR(UNSUPPORTED);
    e8kv_store_le32(w->p, (uint32_t)r);
    w->p += 4 + r;
    return 0;
}

/* One codec's coded rows: u32 frame size, then the frame (none when the size is 0). */
static size_t save_group(wbuf *w, const e8kv_cache *c, const e8kv_codec *codec) {
    const size_t rows = group_rows(c, codec), vb = codec->vector_bytes;
    if (rows == 0) return put_u32(w, 0);
    uint8_t *buf = malloc(rows * vb);
    if (!buf) return E8KV_ERR(OUT_OF_MEMORY);
    group_copy(c, codec, buf, 1);
    const e8kv_frame_params fp = {
        .content = E8KV_FRAME_BYTES, .coder = E8KV_FRAME_RANS, .rows_per_page = FRAME_ROWS_PER_PAGE};
    return put_frame(w, buf, vb, rows, &fp);
}

static size_t save_layer(wbuf *w, const e8kv_cache *c, const kv_layer *L) {
    const size_t d = c->head_dim, n_used = n_pages_used(c, L->n_tokens), ns = sink_used(c, L->n_tokens);
    E8KV_RETURN_IF_ERROR(put_u32(w, (uint32_t)L->n_tokens));
    if (L->k_mu) { /* centering: whether the means are fixed, and the means (original domain) */
        E8KV_RETURN_IF_ERROR(put_u32(w, L->mu_set ? 1u : 0u));
        if (L->mu_set) {
            E8KV_RETURN_IF_ERROR(put_f32s(w, L->k_mu, c->n_head_kv * d));
            E8KV_RETURN_IF_ERROR(put_f32s(w, L->v_mu, c->n_head_kv * d));
            for (size_t h = 0; L->k_rc && h < c->n_head_kv; h++) { /* center=rope: pairs, their means */
                for (size_t k = 0; k < E8KV_RC_PAIRS; k++)
                    E8KV_RETURN_IF_ERROR(put_u32(w, L->k_rc[h].pair[k]));
                E8KV_RETURN_IF_ERROR(put_f32s(w, L->k_rc[h].m, 2 * E8KV_RC_PAIRS));
            }
        }
    }
    for (int is_k = 1; is_k >= 0; is_k--) { /* page map: K heads, then V heads */
        const kv_page *tab = is_k ? L->k_pages : L->v_pages;
        for (size_t h = 0; h < c->n_head_kv; h++)
            for (size_t i = 0; i < n_used; i++) {
                const kv_page *pg = &tab[h * c->n_page_max + i];
                const uint8_t st = !pg->data ? PAGE_ABSENT : pg->raw ? PAGE_RAW : PAGE_CODED;
                E8KV_RETURN_IF_ERROR(put(w, &st, 1));
            }
    }
    for (int is_k = 1; is_k >= 0; is_k--) { /* sink tokens */
        const float *s = is_k ? L->k_sink : L->v_sink;
        for (size_t h = 0; h < c->n_head_kv && ns; h++)
            E8KV_RETURN_IF_ERROR(put_f32s(w, s + h * c->n_sink * d, ns * d));
    }
    for (int is_k = 1; is_k >= 0; is_k--) { /* raw (window) pages */
        const kv_page *tab = is_k ? L->k_pages : L->v_pages;
        for (size_t h = 0; h < c->n_head_kv; h++)
            for (size_t i = 0; i < n_used; i++) {
                const kv_page *pg = &tab[h * c->n_page_max + i];
                if (pg->data && pg->raw)
                    E8KV_RETURN_IF_ERROR(put_f32s(w, (const float *)(const void *)pg->data,
                                                  page_valid(c, i, L->n_tokens) * d));
            }
    }
    return 0;
}

size_t e8kv_cache_save(void *dst, size_t dst_capacity, const e8kv_cache *cache, const void *meta,
                       size_t meta_size) {
    if (!dst || !cache || (meta_size && !meta) || meta_size > UINT32_MAX) return E8KV_ERR(BAD_ARGUMENT);
    const e8kv_cache *c = cache;
    char spec[CANON_SPEC_MAX + 1];
    const size_t spec_len = canon_spec(c, spec, sizeof spec);
    E8KV_RETURN_IF_ERROR(spec_len);
    if (c->n_layer > UINT32_MAX || c->n_head_kv > UINT32_MAX || c->n_ctx > UINT32_MAX)
        return E8KV_ERR(UNSUPPORTED);
    if (dst_capacity < CACHE_HEADER_BYTES + 8) return E8KV_ERR(DST_TOO_SMALL);
    uint8_t *const out = dst;
    wbuf w = {out + CACHE_HEADER_BYTES, out + dst_capacity - 8}; /* the checksum's 8 bytes kept free */
    E8KV_RETURN_IF_ERROR(put(&w, spec, spec_len));
    E8KV_RETURN_IF_ERROR(put(&w, meta, meta_size));
    if (kv_n_rope_freqs(c)) { /* the frequencies the keys' turns were made with (rope=pre, center=rope) */
        if ((size_t)(w.end - w.p) < kv_n_rope_freqs(c) * 4) return E8KV_ERR(DST_TOO_SMALL);
        for (size_t i = 0; i < kv_n_rope_freqs(c); i++, w.p += 4)
            e8kv_store_lef32(w.p, c->rope_freqs[i]);
    }
    const int with_calib = c->xforms != NULL;
    if (with_calib) { /* u64 size, then the calibration the e8t streams were built from (§5) */
        if ((size_t)(w.end - w.p) < 8) return E8KV_ERR(DST_TOO_SMALL);
        const size_t cs = e8kv_calib_save(w.p + 8, (size_t)(w.end - w.p) - 8, c->calib);
        E8KV_RETURN_IF_ERROR(cs);
        e8kv_store_le64(w.p, cs);
        w.p += 8 + cs;
    }
    for (size_t l = 0; l < c->n_layer; l++)
        E8KV_RETURN_IF_ERROR(save_layer(&w, c, &c->layers[l]));
    for (size_t g = 0; g < c->n_codecs; g++)
        E8KV_RETURN_IF_ERROR(save_group(&w, c, c->codecs[g]));
    if (c->ev.scorer) E8KV_RETURN_IF_ERROR(save_evict(&w, c));
    const size_t total = (size_t)(w.p - out) + 8;
    memcpy(out, CACHE_MAGIC, 4);
    e8kv_store_le16(out + 4, kv_n_rope_freqs(c) ? 3
                             : with_calib       ? 2
                                                : 1); /* versions 1, 2 stay byte-identical */
    e8kv_store_le16(out + 6, (uint16_t)spec_len);
    e8kv_store_le64(out + 8, total);
    e8kv_store_le32(out + 16, (uint32_t)c->n_layer);
    e8kv_store_le32(out + 20, (uint32_t)c->n_head_kv);
    e8kv_store_le32(out + 24, (uint32_t)c->head_dim);
    e8kv_store_le32(out + 28, (uint32_t)c->page_tokens);
    e8kv_store_le64(out + 32, c->n_ctx);
    e8kv_store_le64(out + 40, c->seed);
    e8kv_store_lef32(out + 48, c->rope_theta);
    e8kv_store_le32(out + 52, (uint32_t)c->rope_neox);
    e8kv_store_le32(out + 56, (uint32_t)meta_size);
    e8kv_store_le32(out + 60,
                    (with_calib ? CACHE_FLAG_CALIB : 0u) | (kv_n_rope_freqs(c) ? CACHE_FLAG_FREQS : 0u));
    e8kv_store_le64(w.p, XXH64(out, total - 8, 0));
    return total;
}

/* ---------------------------------------------------------------- header */

/* The value of ",key=N" in a canonical spec (always present there); SIZE_MAX when absent or not a number. */
static size_t spec_number(const char *spec, const char *key) {
    char pat[16];
    snprintf(pat, sizeof pat, ",%s=", key);
    const char *p = strstr(spec, pat);
    if (!p) return SIZE_MAX;
    p += strlen(pat);
    size_t v = 0, n = 0;
    for (; *p >= '0' && *p <= '9' && n < 10; p++, n++)
        v = v * 10 + (size_t)(*p - '0');
    return n == 0 || (*p && *p != ',') ? SIZE_MAX : v;
}

size_t e8kv_cache_file_get_info(e8kv_cache_file_info *info, const void *src, size_t src_size) {
    if (!info || !src) return E8KV_ERR(BAD_ARGUMENT);
    memset(info, 0, sizeof *info);
    const uint8_t *const in = src;
    if (src_size < 6) return E8KV_ERR(TRUNCATED);
    if (memcmp(in, CACHE_MAGIC, 4)) return E8KV_ERR(CORRUPTED);
    const unsigned version = e8kv_load_le16(in + 4);
    if (version < 1 || version > 3) return E8KV_ERR(VERSION);
    if (src_size < CACHE_HEADER_BYTES + 8) return E8KV_ERR(TRUNCATED);
    const uint64_t total = e8kv_load_le64(in + 8);
    if (total > src_size) return E8KV_ERR(TRUNCATED);
    if (total < src_size || total < CACHE_HEADER_BYTES + 8) return E8KV_ERR(CORRUPTED);
    if (XXH64(in, total - 8, 0) != e8kv_load_le64(in + total - 8)) return E8KV_ERR(CHECKSUM);
    const size_t spec_len = e8kv_load_le16(in + 6), meta_size = e8kv_load_le32(in + 56);
    const uint32_t flags = e8kv_load_le32(in + 60);
    /* version 1: no flag; 2: the calibration; 3: the frequencies, and the calibration or not */
    const int flags_ok =
        version == 3 ? (flags & ~(CACHE_FLAG_CALIB | CACHE_FLAG_FREQS)) == 0 && (flags & CACHE_FLAG_FREQS)
                     : flags == (version == 2 ? CACHE_FLAG_CALIB : 0u);
    if (spec_len == 0 || spec_len > CANON_SPEC_MAX || !flags_ok || e8kv_load_le32(in + 52) > 1)
        return E8KV_ERR(CORRUPTED);
    if (spec_len + (uint64_t)meta_size > total - CACHE_HEADER_BYTES - 8) return E8KV_ERR(CORRUPTED);
    if (memchr(in + CACHE_HEADER_BYTES, 0, spec_len)) return E8KV_ERR(CORRUPTED);
    size_t body = CACHE_HEADER_BYTES + spec_len + meta_size; /* the first byte after the meta */
    if (flags & CACHE_FLAG_FREQS) { /* head_dim/2 f32, finite and >= 0 (e8kv_cache_params.rope_freqs) */
        const uint32_t hd = e8kv_load_le32(in + 24);
        if (hd % 2 || hd == 0 || hd > E8KV_MAX_HEAD_DIM || total - 8 - body < (uint64_t)hd / 2 * 4)
            return E8KV_ERR(CORRUPTED);
        info->n_rope_freqs = hd / 2;
        for (size_t i = 0; i < info->n_rope_freqs; i++) {
            info->rope_freqs[i] = e8kv_load_lef32(in + body + 4 * i);
            if (!(info->rope_freqs[i] >= 0.0f) || !isfinite(info->rope_freqs[i])) return E8KV_ERR(CORRUPTED);
        }
        body += 4 * info->n_rope_freqs;
    }
    if (flags & CACHE_FLAG_CALIB) { /* u64 size, then the calibration (checked by e8kv_calib_load) */
        if (total - 8 - body < 8) return E8KV_ERR(CORRUPTED);
        const uint64_t cs = e8kv_load_le64(in + body);
        if (cs == 0 || cs > total - 8 - body - 8) return E8KV_ERR(CORRUPTED);
        info->calib_offset = body + 8;
        info->calib_size = (size_t)cs;
        body += 8 + (size_t)cs;
    }
    info->version = version;
    info->file_size = (size_t)total;
    info->n_layer = e8kv_load_le32(in + 16);
    info->n_head_kv = e8kv_load_le32(in + 20);
    info->head_dim = e8kv_load_le32(in + 24);
    info->page_tokens = e8kv_load_le32(in + 28);
    const uint64_t n_ctx = e8kv_load_le64(in + 32);
    if (n_ctx > UINT32_MAX) return E8KV_ERR(CORRUPTED);
    info->n_ctx = (size_t)n_ctx;
    info->seed = e8kv_load_le64(in + 40);
    info->rope_theta = e8kv_load_lef32(in + 48);
    info->rope_neox = (int)e8kv_load_le32(in + 52);
    memcpy(info->spec, in + CACHE_HEADER_BYTES, spec_len);
    info->spec[spec_len] = 0;
    info->meta_offset = CACHE_HEADER_BYTES + spec_len;
    info->meta_size = meta_size;
    /* every layer record holds at least its u32 token count */
    if (info->n_layer == 0 || info->n_head_kv == 0 || info->head_dim == 0 || info->page_tokens == 0 ||
        info->n_ctx == 0)
        return E8KV_ERR(CORRUPTED);
    if (info->n_layer > (total - body - 8) / 4) return E8KV_ERR(CORRUPTED);
    const size_t n_page_max = (info->n_ctx + info->page_tokens - 1) / info->page_tokens;
    if (info->n_head_kv > 4096 || n_page_max > LOAD_MAX_TABLE_ENTRIES / info->n_head_kv ||
        info->n_layer > LOAD_MAX_TABLE_ENTRIES / (info->n_head_kv * n_page_max))
        return E8KV_ERR(CORRUPTED);
    /* the sizes the spec gives the cache's fixed allocations: the same page size, bounded sink and means */
    const size_t sink = spec_number(info->spec, "sink");
    if (spec_number(info->spec, "page") != info->page_tokens || sink == SIZE_MAX || info->head_dim > 4096)
        return E8KV_ERR(CORRUPTED);
    const size_t per_layer =
        info->n_head_kv * info->head_dim * (4 + 2 * (sink < info->n_ctx ? sink : info->n_ctx));
    if (info->n_layer > LOAD_MAX_FIXED_FLOATS / per_layer)
        return E8KV_ERR(CORRUPTED); /* no overflow: < 2^57 */
    return (size_t)total;
}

/* ---------------------------------------------------------------- load */

struct rbuf {
    const uint8_t *p, *end;
};

static size_t take(rbuf *r, const uint8_t **out, size_t n) {
    if ((size_t)(r->end - r->p) < n) return E8KV_ERR(CORRUPTED); /* the file's total size was checked */
    *out = r->p;
    r->p += n;
    return 0;
}

static size_t get_f32s(rbuf *r, float *dst, size_t n) {
    if ((size_t)(r->end - r->p) / 4 < n) return E8KV_ERR(CORRUPTED);
    for (size_t i = 0; i < n; i++)
        dst[i] = e8kv_load_lef32(r->p + 4 * i);
    r->p += 4 * n;
    return e8kv_all_finite(dst, n) ? 0 : E8KV_ERR(CORRUPTED);
}

/* Codes from a file are untrusted: bytes that no encode writes (an f16 payload or a scale field that is NaN
 * or Inf) would decode to NaN/Inf inside attention. Every row is decoded once (in the rotated domain,
 * which keeps finite values finite) and must be finite. */
static size_t check_codes(const e8kv_codec *codec, const uint8_t *buf, size_t rows) {
    float y[E8KV_MAX_HEAD_DIM];
    for (size_t i = 0; i < rows; i++) {
        codec->ops->decode(codec, y, buf + i * codec->vector_bytes);
        if (!e8kv_all_finite(y, codec->head_dim)) return E8KV_ERR(CORRUPTED);
    }
    return 0;
}

static size_t load_group(rbuf *r, e8kv_cache *c, const e8kv_codec *codec) {
    const size_t rows = group_rows(c, codec), vb = codec->vector_bytes;
    const uint8_t *b = NULL;
    E8KV_RETURN_IF_ERROR(take(r, &b, 4));
    const size_t size = e8kv_load_le32(b);
    if ((size == 0) != (rows == 0)) return E8KV_ERR(CORRUPTED);
    if (size == 0) return 0;
    const uint8_t *fr = NULL;
    E8KV_RETURN_IF_ERROR(take(r, &fr, size));
    e8kv_frame_info fi;
    E8KV_RETURN_IF_ERROR(e8kv_frame_get_info(&fi, fr, size));
    if (fi.row_bytes != vb || fi.n_rows != rows || fi.content != E8KV_FRAME_BYTES) return E8KV_ERR(CORRUPTED);
    uint8_t *buf = malloc(rows * vb);
    if (!buf) return E8KV_ERR(OUT_OF_MEMORY);
    size_t rd = e8kv_frame_decode(buf, rows * vb, fr, size);
    if (!e8kv_is_error(rd)) rd = check_codes(codec, buf, rows);
    if (!e8kv_is_error(rd)) group_copy(c, codec, buf, 0);
    free(buf);
    return e8kv_is_error(rd) ? rd : 0;
}

static size_t load_layer(rbuf *r, e8kv_cache *c, kv_layer *L) {
    const size_t d = c->head_dim;
    const uint8_t *b = NULL;
    E8KV_RETURN_IF_ERROR(take(r, &b, 4));
    const size_t n_tokens = e8kv_load_le32(b);
    if (n_tokens > c->n_ctx) return E8KV_ERR(CONTEXT_FULL);
    L->n_tokens = n_tokens; /* free_pages_from(0) on failure releases what follows */
    if (L->k_mu) {
        const size_t hd = c->n_head_kv * d;
        E8KV_RETURN_IF_ERROR(take(r, &b, 4));
        const uint32_t mu_set = e8kv_load_le32(b);
        if (mu_set > 1 || (n_tokens > 0 && !mu_set)) return E8KV_ERR(CORRUPTED);
        memset(L->k_mu, 0, 4 * hd * sizeof(float)); /* k_mu, v_mu and their read-domain copies */
        if (mu_set) {
            E8KV_RETURN_IF_ERROR(get_f32s(r, L->k_mu, hd));
            E8KV_RETURN_IF_ERROR(get_f32s(r, L->v_mu, hd));
            for (size_t h = 0; L->k_rc && h < c->n_head_kv; h++) { /* center=rope: distinct pairs */
                uint8_t seen[E8KV_MAX_HEAD_DIM / 2] = {0};
                for (size_t k = 0; k < E8KV_RC_PAIRS; k++) {
                    E8KV_RETURN_IF_ERROR(take(r, &b, 4));
                    const uint32_t i = e8kv_load_le32(b);
                    if (i >= d / 2 || seen[i]++) return E8KV_ERR(CORRUPTED);
                    L->k_rc[h].pair[k] = i;
                }
                E8KV_RETURN_IF_ERROR(get_f32s(r, L->k_rc[h].m, 2 * E8KV_RC_PAIRS));
            }
            e8kv_cache_means_to_read_domain(c, L); /* exactly as kvcache.c derives them */
        }
        L->mu_set = (int)mu_set;
    }
    const size_t n_used = n_pages_used(c, n_tokens), ns = sink_used(c, n_tokens);
    const uint8_t *map = NULL;
    if (n_used > (size_t)(r->end - r->p) / 2 / c->n_head_kv) return E8KV_ERR(CORRUPTED);
    E8KV_RETURN_IF_ERROR(take(r, &map, 2 * c->n_head_kv * n_used));
    size_t n_st[2][2] = {{0}}; /* [is_k][raw]: the pages the map asks for (checked below) */
    for (size_t j = 0; j < 2 * c->n_head_kv * n_used; j++)
        if (map[j] == PAGE_RAW || map[j] == PAGE_CODED) n_st[j < c->n_head_kv * n_used][map[j] == PAGE_RAW]++;
    if (e8kv_cache_reserve_pages(c, &L->k, 0, n_st[1][0], &L->v, 0, n_st[0][0]) ||
        e8kv_cache_reserve_pages(c, &L->k, 1, n_st[1][1], &L->v, 1, n_st[0][1]))
        return E8KV_ERR(OUT_OF_MEMORY);
    for (int is_k = 1; is_k >= 0; is_k--) {
        kv_page *tab = is_k ? L->k_pages : L->v_pages;
        const kv_format *f = is_k ? &L->k : &L->v;
        for (size_t h = 0; h < c->n_head_kv; h++)
            for (size_t i = 0; i < n_used; i++) {
                const uint8_t st = *map++;
                if (st > PAGE_CODED || (st == PAGE_RAW && c->window == 0) ||
                    (st != PAGE_ABSENT) != page_expected(c, i, n_tokens))
                    return E8KV_ERR(CORRUPTED);
                if (st != PAGE_ABSENT)
                    E8KV_RETURN_IF_ERROR(
                        e8kv_cache_alloc_page(c, f, &tab[h * c->n_page_max + i], st == PAGE_RAW));
            }
    }
    for (int is_k = 1; is_k >= 0; is_k--) {
        float *s = is_k ? L->k_sink : L->v_sink;
        for (size_t h = 0; h < c->n_head_kv && ns; h++)
            E8KV_RETURN_IF_ERROR(get_f32s(r, s + h * c->n_sink * d, ns * d));
    }
    for (int is_k = 1; is_k >= 0; is_k--) {
        kv_page *tab = is_k ? L->k_pages : L->v_pages;
        for (size_t h = 0; h < c->n_head_kv; h++)
            for (size_t i = 0; i < n_used; i++) {
                kv_page *pg = &tab[h * c->n_page_max + i];
                if (pg->data && pg->raw)
                    E8KV_RETURN_IF_ERROR(
                        get_f32s(r, (float *)(void *)pg->data, page_valid(c, i, n_tokens) * d));
            }
    }
    return 0;
}

size_t e8kv_cache_load_into(e8kv_cache *cache, const void *src, size_t src_size) {
    if (!cache || !src) return E8KV_ERR(BAD_ARGUMENT);
    e8kv_cache_file_info fi;
    E8KV_RETURN_IF_ERROR(e8kv_cache_file_get_info(&fi, src, src_size));
    e8kv_cache *c = cache;
    if (fi.n_layer != c->n_layer || fi.n_head_kv != c->n_head_kv || fi.head_dim != c->head_dim)
        return E8KV_ERR(DIMENSION);
    char spec[CANON_SPEC_MAX + 1];
    E8KV_RETURN_IF_ERROR(canon_spec(c, spec, sizeof spec));
    if (strcmp(spec, fi.spec) || fi.seed != c->seed || fi.page_tokens != c->page_tokens) return E8KV_ERR(SPEC);
    if ((fi.calib_size != 0) != (c->xforms != NULL)) return E8KV_ERR(SPEC);
    if (fi.calib_size) { /* the e8t streams must come from the very same calibration */
        const size_t cap = e8kv_calib_save_bound(c->calib);
        E8KV_RETURN_IF_ERROR(cap);
        uint8_t *mine = cap == fi.calib_size ? malloc(cap) : NULL;
        if (cap == fi.calib_size && !mine) return E8KV_ERR(OUT_OF_MEMORY);
        const int same = mine && e8kv_calib_save(mine, cap, c->calib) == cap &&
                         !memcmp(mine, (const uint8_t *)src + fi.calib_offset, cap);
        free(mine);
        if (!same) return E8KV_ERR(SPEC);
    }
    /* keys the cache turns by RoPE (rope=pre), or codes made with its turns (center=rope): the same RoPE */
    if ((c->rope_pre || c->center == 3) &&
        (fi.rope_neox != c->rope_neox || fi.n_rope_freqs != kv_n_rope_freqs(c) ||
         (kv_n_rope_freqs(c) ? memcmp(fi.rope_freqs, c->rope_freqs, kv_n_rope_freqs(c) * sizeof(float))
                             : memcmp(&fi.rope_theta, &c->rope_theta, sizeof(float)))))
        return E8KV_ERR(SPEC);
    e8kv_cache_clear(c);
    rbuf r = {(const uint8_t *)src + fi.meta_offset + fi.meta_size + 4 * fi.n_rope_freqs +
                  (fi.calib_size ? 8 + fi.calib_size : 0),
              (const uint8_t *)src + fi.file_size - 8};
    size_t res = 0, n_max = 0;
    for (size_t l = 0; l < c->n_layer && !e8kv_is_error(res); l++) {
        res = load_layer(&r, c, &c->layers[l]);
        if (c->layers[l].n_tokens > n_max) n_max = c->layers[l].n_tokens;
    }
    for (size_t g = 0; g < c->n_codecs && !e8kv_is_error(res); g++)
        res = load_group(&r, c, c->codecs[g]);
    if (!e8kv_is_error(res) && c->ev.scorer) res = load_evict(&r, c);
    if (!e8kv_is_error(res) && r.p != r.end) res = E8KV_ERR(CORRUPTED);
    if (e8kv_is_error(res)) {
        e8kv_cache_clear(c);
        return res;
    }
    for (size_t l = 0; l < c->n_layer; l++) /* positions: evicted tokens count */
        if (c->layers[l].n_tokens + c->layers[l].n_evicted > n_max)
            n_max = c->layers[l].n_tokens + c->layers[l].n_evicted;
    return n_max;
}

e8kv_cache *e8kv_cache_load(const void *src, size_t src_size, size_t n_threads, size_t *err) {
    size_t r = 0;
    e8kv_cache_file_info fi;
    if (!src) r = E8KV_ERR(BAD_ARGUMENT);
    if (!e8kv_is_error(r)) r = e8kv_cache_file_get_info(&fi, src, src_size);
    e8kv_cache *c = NULL;
    e8kv_calib *cal = NULL;
    if (!e8kv_is_error(r) && fi.calib_size) {
        cal = e8kv_calib_load((const uint8_t *)src + fi.calib_offset, fi.calib_size, &r);
        if (!cal && e8kv_get_error_code(r) != E8KV_ERROR_OUT_OF_MEMORY) r = E8KV_ERR(CORRUPTED);
    }
    if (!e8kv_is_error(r)) {
        const e8kv_cache_params p = {.n_layer = fi.n_layer,
                                     .n_head_kv = fi.n_head_kv,
                                     .head_dim = fi.head_dim,
                                     .n_ctx = fi.n_ctx,
                                     .spec = fi.spec,
                                     .seed = fi.seed,
                                     .n_threads = n_threads,
                                     .rope_theta = fi.rope_theta,
                                     .rope_neox = fi.rope_neox,
                                     .calib = cal,
                                     .rope_freqs = fi.n_rope_freqs ? fi.rope_freqs : NULL};
        c = e8kv_cache_create(&p, &r);
        if (c) { /* the cache owns the calibration it was loaded with */
            c->calib_owned = cal;
            cal = NULL;
        }
        if (!c && !e8kv_is_error(r)) r = E8KV_ERR(CORRUPTED);
        /* a spec the grammar or a codec rejects came from the file: corrupted, not a caller's mistake */
        if (!c && e8kv_get_error_code(r) != E8KV_ERROR_OUT_OF_MEMORY) r = E8KV_ERR(CORRUPTED);
    }
    if (c) {
        r = e8kv_cache_load_into(c, src, src_size);
        /* the file's own parameters: a spec that does not recreate itself, or more tokens than its
         * n_ctx, can only be corrupted bytes */
        const e8kv_error_code ec = e8kv_get_error_code(r);
        if (ec == E8KV_ERROR_SPEC || ec == E8KV_ERROR_DIMENSION || ec == E8KV_ERROR_CONTEXT_FULL)
            r = E8KV_ERR(CORRUPTED);
        if (e8kv_is_error(r)) {
            e8kv_cache_free(c);
            c = NULL;
        }
    }
    e8kv_calib_free(cal);
    if (err) *err = e8kv_is_error(r) ? r : 0;
    return c;
}

/* ---------------------------------------------------------------- files */

size_t e8kv_cache_save_file(const e8kv_cache *cache, const char *path, const void *meta, size_t meta_size) {
    if (!cache || !path) return E8KV_ERR(BAD_ARGUMENT);
    const size_t cap = e8kv_cache_save_bound(cache, meta_size);
    E8KV_RETURN_IF_ERROR(cap);
    uint8_t *buf = malloc(cap);
    if (!buf) return E8KV_ERR(OUT_OF_MEMORY);
    size_t r = e8kv_cache_save(buf, cap, cache, meta, meta_size);
    if (!e8kv_is_error(r)) r = e8kv_file_write(path, buf, r); /* atomic: the old file survives a failure */
    free(buf);
    return r;
}

e8kv_cache *e8kv_cache_load_file(const char *path, size_t n_threads, size_t *err) {
    void *buf = NULL;
    const size_t n = e8kv_cache_read_file(&buf, path);
    if (e8kv_is_error(n)) {
        if (err) *err = n;
        return NULL;
    }
    e8kv_cache *c = e8kv_cache_load(buf, n, n_threads, err);
    free(buf);
    return c;
}

/* ---------------------------------------------------------------- eviction section (doc/format.md §4.7)
 *
 * Present when the canonical spec has evict=: per layer u32 n_evicted and u32 n_map, then u32 frame size
 * and a frame (zstd after a delta along rows, 4-byte rows) of every kept position of the mapped slots in
 * (layer, head, slot) order as u32 LE; size 0 when no layer has any. Loaded positions must describe what
 * eviction can make: per head strictly increasing, the sink positions at their own slots, the last
 * mapped slot at position n_map - 1 + n_evicted (the slots after it continue from there). */

#define EVICT_FRAME_ROWS 4096

static size_t evict_rows(const e8kv_cache *c) {
    size_t n = 0;
    for (size_t l = 0; l < c->n_layer; l++)
        n += c->n_head_kv * c->layers[l].n_map;
    return n;
}

static size_t evict_bound(const e8kv_cache *c) {
    const size_t rows = evict_rows(c);
    size_t n = 8 * c->n_layer + 4;
    if (rows) {
        const size_t b = e8kv_compress_bound(4, rows, EVICT_FRAME_ROWS, 0);
        E8KV_RETURN_IF_ERROR(b);
        n += b;
    }
    return n;
}

static size_t save_evict(wbuf *w, const e8kv_cache *c) {
    for (size_t l = 0; l < c->n_layer; l++) {
        const kv_layer *L = &c->layers[l];
        if (L->n_evicted > UINT32_MAX || L->n_map + L->n_evicted > UINT32_MAX) return E8KV_ERR(UNSUPPORTED);
        E8KV_RETURN_IF_ERROR(put_u32(w, (uint32_t)L->n_evicted));
        E8KV_RETURN_IF_ERROR(put_u32(w, (uint32_t)L->n_map));
    }
    const size_t rows = evict_rows(c);
    if (rows == 0) return put_u32(w, 0);
    uint8_t *buf = malloc(rows * 4);
    if (!buf) return E8KV_ERR(OUT_OF_MEMORY);
    size_t o = 0;
    for (size_t l = 0; l < c->n_layer; l++)
        for (size_t i = 0; i < c->n_head_kv * c->layers[l].n_map; i++, o += 4)
            e8kv_store_le32(buf + o, c->layers[l].pos[i]);
    const e8kv_frame_params fp = {
        .content = E8KV_FRAME_BYTES, .coder = E8KV_FRAME_ZSTD, .rows_per_page = EVICT_FRAME_ROWS, .delta = 1};
    return put_frame(w, buf, 4, rows, &fp);
}

static size_t load_evict(rbuf *r, e8kv_cache *c) {
    const size_t H = c->n_head_kv;
    const uint8_t *b = NULL;
    size_t rows = 0;
    for (size_t l = 0; l < c->n_layer; l++) {
        kv_layer *L = &c->layers[l];
        E8KV_RETURN_IF_ERROR(take(r, &b, 8));
        L->n_evicted = e8kv_load_le32(b);
        L->n_map = e8kv_load_le32(b + 4);
        if (L->n_map > L->n_tokens || (L->n_map == 0) != (L->n_evicted == 0) ||
            L->n_map + L->n_evicted > UINT32_MAX) {
            for (size_t i = 0; i <= l; i++) /* no index allocated yet */
                c->layers[i].n_map = c->layers[i].n_evicted = 0;
            return E8KV_ERR(CORRUPTED);
        }
        rows += H * L->n_map; /* n_map <= n_tokens <= n_ctx: no overflow */
    }
    E8KV_RETURN_IF_ERROR(take(r, &b, 4));
    const size_t size = e8kv_load_le32(b);
    size_t res = (size == 0) != (rows == 0) ? E8KV_ERR(CORRUPTED) : 0;
    const uint8_t *fr = NULL;
    uint8_t *buf = NULL;
    if (!res && size) res = take(r, &fr, size);
    e8kv_frame_info fi;
    if (!res && size) res = e8kv_frame_get_info(&fi, fr, size);
    if (!e8kv_is_error(res) && size && (fi.row_bytes != 4 || fi.n_rows != rows)) res = E8KV_ERR(CORRUPTED);
    if (!e8kv_is_error(res) && size && !(buf = malloc(rows * 4))) res = E8KV_ERR(OUT_OF_MEMORY);
    if (!e8kv_is_error(res) && size) res = e8kv_frame_decode(buf, rows * 4, fr, size);
    size_t o = 0;
    for (size_t l = 0; l < c->n_layer && !e8kv_is_error(res); l++) {
        kv_layer *L = &c->layers[l];
        const size_t m = L->n_map;
        if (!m) continue;
        L->pos = malloc(H * m * sizeof *L->pos);
        if (!L->pos) {
            res = E8KV_ERR(OUT_OF_MEMORY);
            break;
        }
        c->index_bytes += H * m * sizeof *L->pos;
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < m; i++, o += 4) {
                const uint32_t p = e8kv_load_le32(buf + o);
                L->pos[h * m + i] = p;
                if ((i > 0 && p <= L->pos[h * m + i - 1]) || (i < c->n_sink && p != i) ||
                    (i + 1 == m && p != m - 1 + L->n_evicted))
                    res = E8KV_ERR(CORRUPTED);
            }
    }
    free(buf);
    if (e8kv_is_error(res))
        for (size_t l = 0; l < c->n_layer; l++) { /* load_into clears the rest */
            kv_layer *L = &c->layers[l];
            if (!L->pos) L->n_map = L->n_evicted = 0; /* read but not allocated: nothing counted */
            e8kv_evict_reset(c, L);
        }
    return e8kv_is_error(res) ? res : 0;
}
