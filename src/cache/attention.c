/* Causal GQA attention straight from the cache's pages.
 *
 * Per KV head: the query heads of its group are scaled by 1/sqrt(head_dim) and rotated once with the K
 * codec's Hadamard rotation (orthonormal, so q·k is unchanged); keys and values are decoded one tile at a
 * time into a small stack buffer, in their codecs' rotated domains, and every query of the group consumes
 * the tile (each KV vector decoded once per query chunk, not once per query head). Softmax is online
 * (running max m and sum l, Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"),
 * so no score matrix exists at any context length. The V accumulator lives in V's rotated domain and
 * is un-rotated once per query head at the end.
 *
 * Threads: the work is cut into items that depend on the call's shapes and the cache's n_ctx alone, and
 * the cache's pool (common/pool.h) runs them in any order on any thread, so every thread count gives the
 * same bits. A few query tokens (decode) over more than one slice of keys (kvcache.h: at least 1024,
 * at most 64 slices up to n_ctx): one item per context slice, covering every KV head in turn (the next
 * head's first tile prefetched), each leaving a partial softmax state (m, l, unnormalised acc) in the
 * cache's scratch; the queries are prepared (scaled, rotated, quantized for e8box) once per call, not
 * per slice; the partials are merged in slice order by log-sum-exp:
 * out = Σ_s e^(m_s − M) acc_s / Σ_s e^(m_s − M) l_s, M = max_s m_s. Otherwise (prefill, short
 * contexts) one item per (KV head, chunk of up to 64 of its queries), each final. Calls too small to pay
 * for waking the workers run on the caller's thread. */
#include "kvcache.h"

#include "common/cpu.h"
#include "common/pool.h"
#include "quant/e8_box.h"
#include "quant/voronoi.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* Stack budget per worker: one K tile, one V tile and one chunk of rotated queries, 32 KiB each. */
#define TILE_FLOATS 8192
#define TILE_MAX_TOKENS 64
#define QCHUNK_MAX 64
static_assert(E8KV_ATTEND_SLICE_MIN % TILE_MAX_TOKENS == 0, "slices hold whole tiles");
/* query-key products of a call below which its items run on the caller's thread (~10 µs of work) */
#define ATTEND_POOL_MIN 65536

/* RoPE of the keys of slots [slot, slot + n) of one head at their positions (kv_slot_pos: after an
 * eviction, runs of consecutive positions). */
static void rope_slots(const e8kv_cache *c, const kv_layer *L, size_t head, float *restrict x, size_t slot,
                       size_t n) {
    for (size_t t = 0; t < n;) {
        const size_t p = kv_slot_pos(L, head, slot + t);
        size_t run = 1;
        while (t + run < n && kv_slot_pos(L, head, slot + t + run) == p + run)
            run++;
        e8kv_rope_apply(c->rope, x + t * c->head_dim, run, 1, p);
        t += run;
    }
}

/* The fused reader of a run of n coded vectors of one page, when the format has one; 0 otherwise. */
static int read_fast(const e8kv_cache *c, const kv_format *f, float *restrict dst, const uint8_t *src,
                     size_t n) {
    if (!c->use_avx2) return 0;
    const size_t d = c->head_dim;
    switch (f->fast) {
    case KV_FAST_F32:
        for (size_t i = 0; i < n * d; i++)
            dst[i] = e8kv_load_lef32(src + 4 * i);
        return 1;
    case KV_FAST_F16:
        e8kv_cache_read_f16_avx2(dst, src, n, d);
        return 1;
    case KV_FAST_E8BALL:
        if (f->codec->bits == 4 && e8kv_cache_read_e8ball4_avx2(dst, src, n, d, f->vector_bytes)) return 1;
        e8kv_e8ball_decode_rows_avx2(dst, src, n, d, f->codec->bits, f->vector_bytes);
        return 1;
    case KV_FAST_E8BOX:
        for (size_t i = 0; i < n; i++)
            e8kv_box_decode_avx2(dst + i * d, src + i * f->vector_bytes, d, f->codec->bits);
        return 1;
    default:
        return 0;
    }
}

void e8kv_cache_add_rows_ref(float *restrict y, const float *restrict mu, size_t n, size_t d) {
    for (size_t t = 0; t < n; t++)
        for (size_t j = 0; j < d; j++)
            y[t * d + j] += mu[j];
}

/* turn: with center=rope, keys get the turned part of their centre too (attention adds it to the scores
 * instead: rc_bias) */
static void read_tokens(const e8kv_cache *c, const kv_layer *L, size_t head, int is_k, size_t p0, size_t n,
                        float *restrict dst, int turn) {
    const kv_format *f = is_k ? &L->k : &L->v;
    const kv_page *tab = (is_k ? L->k_pages : L->v_pages) + head * c->n_page_max;
    const float *sink = is_k ? L->k_sink : L->v_sink;
    const size_t d = c->head_dim, P = c->page_tokens, vb = f->vector_bytes;
    const int rope = is_k && c->rope_pre;
    /* un-rotated reads of a transforming format (K with rope=pre) need the inverse after decoding */
    const int unrotate = !f->rotated && (f->xf || f->codec->rotate);
    for (size_t t = 0; t < n;) {
        const size_t pos = p0 + t;
        float *y = dst + t * d;
        const float *exact = NULL;
        const kv_page *pg = NULL;
        if (pos < c->n_sink) {
            exact = sink + (head * c->n_sink + pos) * d;
        } else {
            pg = &tab[pos / P];
            assert(pg->data);
            if (pg->raw) exact = (const float *)(const void *)pg->data + (pos % P) * d;
        }
        size_t run = 1;
        if (exact) {
            memcpy(y, exact, d * sizeof(float));
            if (f->rotated) e8kv_fmt_forward(f, head, d, y, 1);
        } else {
            /* the rest of this page, as far as the request goes */
            run = P - pos % P < n - t ? P - pos % P : n - t;
            const uint8_t *src = pg->data + (pos % P) * vb;
            if (f->group)
                e8kv_cache_read_group(f, pg->data, pos % P, run, y);
            else if (!read_fast(c, f, y, src, run))
                for (size_t i = 0; i < run; i++)
                    e8kv_fmt_decode(f, head, y + i * d, src + i * vb);
            if (unrotate) e8kv_fmt_inverse(f, head, d, y, run);
            if (f->centered) { /* add back the mean subtracted before coding (kvcache.h) */
                const float *mu = (is_k ? L->k_mu_read : L->v_mu_read) + head * d;
                if (c->use_avx2)
                    e8kv_cache_add_rows_avx2(y, mu, run, d);
                else
                    e8kv_cache_add_rows_ref(y, mu, run, d);
            }
            if (is_k && turn && L->k_rc) /* center=rope: the centre's turned part at each key's position */
                for (size_t i = 0; i < run; i++) {
                    float tc[E8KV_MAX_HEAD_DIM], cs[E8KV_MAX_HEAD_DIM];
                    e8kv_cache_rc_cos_sin(c, kv_slot_pos(L, head, pos + i), cs);
                    e8kv_cache_rc_turned(c, L, head, cs, tc);
                    if (f->rotated) e8kv_fmt_forward(f, head, d, tc, 1);
                    for (size_t j = 0; j < d; j++)
                        y[i * d + j] += tc[j];
                }
        }
        if (rope) rope_slots(c, L, head, y, pos, run);
        t += run;
    }
}

void e8kv_cache_read_tokens(const e8kv_cache *c, const kv_layer *L, size_t head, int is_k, size_t p0,
                            size_t n, float *restrict dst) {
    read_tokens(c, L, head, is_k, p0, n, dst, 1);
}

void e8kv_attn_tile_ref(const float *restrict q, const float *restrict K, const float *restrict V,
                        const float *restrict bias, size_t n, size_t d, float *restrict m, float *restrict l,
                        float *restrict acc) {
    float s[TILE_MAX_TOKENS];
    assert(n <= TILE_MAX_TOKENS);
    float m_new = *m;
    for (size_t j = 0; j < n; j++) {
        float dot = 0.0f;
        for (size_t i = 0; i < d; i++)
            dot += q[i] * K[j * d + i];
        s[j] = bias ? dot + bias[j] : dot;
        if (s[j] > m_new) m_new = s[j];
    }
    const float corr = expf(*m - m_new); /* *m = -inf on the first tile: corr = 0 */
    float sum = *l * corr;
    for (size_t i = 0; i < d; i++)
        acc[i] *= corr;
    for (size_t j = 0; j < n; j++) {
        const float p = expf(s[j] - m_new);
        sum += p;
        for (size_t i = 0; i < d; i++)
            acc[i] += p * V[j * d + i];
    }
    *m = m_new;
    *l = sum;
}

typedef void (*tile_fn)(const float *restrict, const float *restrict, const float *restrict,
                        const float *restrict, size_t, size_t, float *restrict, float *restrict,
                        float *restrict);

typedef struct {
    const e8kv_cache *c;
    const kv_layer *L;
    float *out; /* (n_tok, n_head, head_dim) */
    const float *q;
    size_t n_head, group, n_tok, pos0, n_keys;
    tile_fn tile;
    size_t qchunk, n_qchunk; /* by query chunk: queries of a KV head's group per piece, pieces per head */
    size_t slice, n_slice;   /* by context slice: keys per slice, slices; n_slice 0: by query chunk */
    float *part;             /* slice s's partial at part + s·E8KV_ATTEND_PART_MAX: m, l (n_tok·n_head
                                each), then the unnormalised acc (n_tok, n_head, head_dim) */
    /* by context slice: every query prepared once (prep_queries), not once per slice: (n_head_kv,
     * n_tok·group, head_dim) and, for the e8box tiles, (n_head_kv, n_tok·group); else NULL */
    const float *qprep;
    const e8kv_box_query *bqprep;
    const float *sinks; /* learned sinks (n_head logits, e8kv_cache_attend_sinks), else NULL */
} attend_job;

/* Start loading the coded bytes of tokens [p0, p0 + n) of one stream of one head (the next tile), so
 * the page's first lines do not wait for the hardware prefetcher to notice a new page. */
static void prefetch_tokens(const e8kv_cache *c, const kv_layer *L, size_t head, int is_k, size_t p0,
                            size_t n) {
    if (p0 < c->n_sink || !n) return;
    const kv_format *f = is_k ? &L->k : &L->v;
    const kv_page *pg = (is_k ? L->k_pages : L->v_pages) + head * c->n_page_max + p0 / c->page_tokens;
    if (!pg->data) return;
    const size_t P = c->page_tokens, vb = pg->raw ? c->head_dim * sizeof(float) : f->vector_bytes;
    const size_t run = P - p0 % P < n ? P - p0 % P : n;
    const uint8_t *src = pg->data + (p0 % P) * vb;
    for (size_t o = 0; o < run * vb; o += 64)
        __builtin_prefetch(src + o);
}

/* ---------------------------------------------------------------- e8box:4 integer-domain tiles */

#define BOX_QMAX 16 /* queries per chunk on the integer path (decode: the GQA group) */

/* the integer tiles read the codecs whose traits say so (e8box:4; e8box:3 and e8box:2 go through the fused
 * reader, read_fast) */
static int box_ok(const e8kv_cache *c, const kv_layer *L, size_t n_q) {
    return e8kv_codec_traits(L->k.codec)->attn_int && e8kv_codec_traits(L->v.codec)->attn_int &&
           L->k.rotated && L->v.rotated && c->head_dim % 64 == 0 &&
           c->head_dim <= E8KV_BOX_MAX_D && n_q <= BOX_QMAX;
}

/* the tile [p, p + n) lies in one coded page of K and of V of head h, past the sinks, and every query
 * of the chunk sees all of it (first_lim: what the chunk's first query sees) */
static int box_tile_ok(const e8kv_cache *c, const kv_layer *L, size_t h, size_t p, size_t n,
                       size_t first_lim) {
    const size_t P = c->page_tokens;
    if (p < c->n_sink || p / P != (p + n - 1) / P || p + n > first_lim) return 0;
    const kv_page *kp = L->k_pages + h * c->n_page_max + p / P, *vp = L->v_pages + h * c->n_page_max + p / P;
    return kp->data && vp->data && !kp->raw && !vp->raw;
}

/* center=rope: a query's terms against K's turned centre (kvcache.h, kv_rc), scaled as its scores: key j at
 * position p scores + Σ_k C_k(p)·a[k] + S_k(p)·b[k], (C_k, S_k) the cos, sin of pair k at p, a = q0·m_a +
 * q1·m_b, b = q1·m_a − q0·m_b (q·R_p·m over the pair) */
typedef struct {
    float a[E8KV_RC_PAIRS], b[E8KV_RC_PAIRS];
} rc_query;

/* The terms of queries [qa, qb) of KV head h's group (rq[qi - qa]), from the unrotated queries */
static void rc_queries(const attend_job *job, size_t h, size_t qa, size_t qb, rc_query *rq) {
    const e8kv_cache *c = job->c;
    const kv_rc *rc = &job->L->k_rc[h];
    const size_t d = c->head_dim, g = job->group, row = job->n_head * d, half = d / 2;
    const float scale = 1.0f / sqrtf((float)d);
    for (size_t qi = qa; qi < qb; qi++) {
        const float *src = job->q + (qi / g) * row + (h * g + qi % g) * d;
        for (size_t k = 0; k < E8KV_RC_PAIRS; k++) {
            const size_t i = rc->pair[k];
            const float q0 = src[c->rope_neox ? i : 2 * i] * scale,
                        q1 = src[c->rope_neox ? i + half : 2 * i + 1] * scale;
            const float ma = rc->m[2 * k], mb = rc->m[2 * k + 1];
            rq[qi - qa].a[k] = q0 * ma + q1 * mb;
            rq[qi - qa].b[k] = q1 * ma - q0 * mb;
        }
    }
}

/* kvcache.h: a run's bias (the AVX2 twin is in attention_avx2.c) */
void e8kv_rc_bias_run_ref(float *restrict out, const float *const *rows, const float *a, const float *b,
                          size_t m) {
    for (size_t t = 0; t < m; t++) {
        float s = 0.0f;
        for (size_t k = 0; k < E8KV_RC_PAIRS; k++)
            s += rows[k][t] * a[k] + rows[k][t + RC_FINE] * b[k];
        out[t] = s;
    }
}

/* slot `slot` of head h's keys is read exact (a sink, or a raw window page) */
static int rc_exact_slot(const e8kv_cache *c, const kv_layer *L, size_t h, size_t slot) {
    return slot < c->n_sink || L->k_pages[h * c->n_page_max + slot / c->page_tokens].raw;
}

/* The score bias of slots [p, p + n) of head h for n_q queries: bias[g·TILE_MAX_TOKENS + j], 0 past n and for
 * the keys read exact (sinks, window pages: their own values hold the whole centre). Per run
 * of keys at consecutive positions within one block of RC_FINE: with (C_b, S_b) the block start's cos, sin,
 * a' = C_b·a + S_b·b and b' = C_b·b − S_b·a per query and pair, then each key adds C_r·a' + S_r·b' along the
 * fine table's rows (r = its position mod RC_FINE): 2·E8KV_RC_PAIRS products per key and query. */
static void rc_bias(const e8kv_cache *c, const kv_layer *L, size_t h, const rc_query *rq, size_t n_q,
                    size_t p, size_t n, float *bias) {
    memset(bias, 0, n_q * TILE_MAX_TOKENS * sizeof *bias);
    const kv_rc *rc = &L->k_rc[h];
    const size_t P = c->page_tokens;
    for (size_t j = 0; j < n;) {
        const size_t slot = p + j, page_end = (slot / P + 1) * P - p; /* j of the page's end */
        if (rc_exact_slot(c, L, h, slot)) { /* sink and window keys are read whole: no bias */
            j = slot < c->n_sink ? c->n_sink - p : page_end;
            continue;
        }
        const size_t pos = kv_slot_pos(L, h, slot), r0 = pos % RC_FINE;
        size_t m = RC_FINE - r0; /* a run: consecutive positions in one block of RC_FINE, one coded page */
        if (m > n - j) m = n - j;
        if (m > page_end - j) m = page_end - j;
        if (slot < L->n_map) /* mapped slots (after an eviction): as far as the positions stay consecutive */
            for (size_t t = 1; t < m; t++)
                if (kv_slot_pos(L, h, slot + t) != pos + t) {
                    m = t;
                    break;
                }
        float buf[E8KV_MAX_HEAD_DIM];
        const float *cb = e8kv_cache_rc_coarse(c, pos / RC_FINE, buf), *rows[E8KV_RC_PAIRS];
        for (size_t k = 0; k < E8KV_RC_PAIRS; k++)
            rows[k] = c->rc_tab + 2 * rc->pair[k] * RC_FINE + r0;
        for (size_t g = 0; g < n_q; g++) {
            float a2[E8KV_RC_PAIRS], b2[E8KV_RC_PAIRS];
            for (size_t k = 0; k < E8KV_RC_PAIRS; k++) {
                const size_t i = rc->pair[k];
                const float C = cb[2 * i], S = cb[2 * i + 1], a = rq[g].a[k], b = rq[g].b[k];
                a2[k] = C * a + S * b, b2[k] = C * b - S * a;
            }
            if (c->use_avx2)
                e8kv_rc_bias_run_avx2(bias + g * TILE_MAX_TOKENS + j, rows, a2, b2, m);
            else
                e8kv_rc_bias_run_ref(bias + g * TILE_MAX_TOKENS + j, rows, a2, b2, m);
        }
        j += m;
    }
}

static void box_tile(const e8kv_cache *c, const kv_layer *L, size_t h, const e8kv_box_query *bq, size_t n_q,
                     size_t p, size_t n, const float *bias, float *m, float *l, float *const *accs) {
    const size_t P = c->page_tokens, vb = L->k.vector_bytes, d = c->head_dim;
    const uint8_t *const k = L->k_pages[h * c->n_page_max + p / P].data + (p % P) * vb;
    const uint8_t *const v = L->v_pages[h * c->n_page_max + p / P].data + (p % P) * vb;
    const float *const mu_v = L->v.centered ? L->v_mu_read + h * d : NULL;
    if (!c->use_avx2) {
        e8kv_attn_box_tile_ref(bq, n_q, k, v, vb, n, d, mu_v, bias, m, l, accs);
        return;
    }
#ifdef E8KV_HAVE_AVXVNNI
    if (c->use_vnni) {
        e8kv_attn_box_tile_vnni(bq, n_q, k, v, vb, n, d, mu_v, bias, m, l, accs);
        return;
    }
#endif
    e8kv_attn_box_tile_avx2(bq, n_q, k, v, vb, n, d, mu_v, bias, m, l, accs);
}

/* The queries [a, b) of KV head h's group, scaled by 1/sqrt(head_dim) and mapped into the keys' read
 * domain (qr: (b - a, head_dim)), and quantized for the integer e8box tiles when bq is not NULL. */
static void prep_queries(const attend_job *job, size_t h, size_t a, size_t b, float *qr, e8kv_box_query *bq) {
    const kv_layer *L = job->L;
    const size_t d = job->c->head_dim, g = job->group, row = job->n_head * d;
    const float scale = 1.0f / sqrtf((float)d);
    for (size_t qi = a; qi < b; qi++) {
        const size_t t = qi / g, hq = h * g + qi % g;
        float *qv = qr + (qi - a) * d;
        const float *src = job->q + t * row + hq * d;
        for (size_t i = 0; i < d; i++)
            qv[i] = src[i] * scale;
        if (L->k.rotated) e8kv_fmt_query(&L->k, h, d, qv, 1);
        if (bq) e8kv_box_query_init(&bq[qi - a], qv, L->k.centered ? L->k_mu_read + h * d : NULL, d);
    }
}

/* Queries [qa, qb) of KV head h's group (query index t·group + j: token t, its j-th query head) against
 * keys [k_begin, k_end), each query also stopping at its causal limit. acc: rows (n_tok, n_head,
 * head_dim) of the accumulators; m_out, l_out: (n_tok, n_head) to leave a slice's partial state in
 * (the merge normalises), or NULL to normalise and un-rotate in acc. */
static void attend_part(const attend_job *job, size_t h, size_t qa, size_t qb, size_t k_begin, size_t k_end,
                        float *acc_rows, float *m_out, float *l_out) {
    const e8kv_cache *c = job->c;
    const kv_layer *L = job->L;
    const size_t d = c->head_dim, g = job->group, row = job->n_head * d;
    size_t tt = TILE_FLOATS / d;
    if (tt > TILE_MAX_TOKENS) tt = TILE_MAX_TOKENS;
    const size_t qc = job->qchunk;
    float kt[TILE_FLOATS], vt[TILE_FLOATS], qr[TILE_FLOATS];
    float m[QCHUNK_MAX], l[QCHUNK_MAX];
    const size_t n_qh = job->n_tok * g; /* queries of one KV head */
    for (size_t a = qa; a < qb; a += qc) {
        const size_t b = a + qc < qb ? a + qc : qb;
        /* e8box:4 keys and values read in the rotated domain: integer-domain tiles (attn_box.c) */
        const int box = box_ok(c, L, b - a);
        e8kv_box_query bq_local[BOX_QMAX];
        const float *qs = qr; /* the chunk's prepared queries */
        const e8kv_box_query *bq = bq_local;
        if (job->qprep) { /* prepared once per call for all slices (e8kv_cache_attend) */
            qs = job->qprep + (h * n_qh + a) * d;
            bq = job->bqprep ? job->bqprep + h * n_qh + a : NULL;
        } else {
            prep_queries(job, h, a, b, qr, box ? bq_local : NULL);
        }
        /* center=rope: the chunk's terms against K's turned centre, added to each tile's scores (rc_bias) */
        rc_query rq[QCHUNK_MAX];
        if (L->k_rc) rc_queries(job, h, a, b, rq);
        float *accs[BOX_QMAX];
        for (size_t qi = a; qi < b; qi++) {
            const size_t t = qi / g, hq = h * g + qi % g;
            memset(acc_rows + t * row + hq * d, 0, d * sizeof(float));
            m[qi - a] = -INFINITY;
            l[qi - a] = 0.0f;
            if (box) accs[qi - a] = acc_rows + t * row + hq * d;
        }
        size_t n_keys = job->pos0 + (b - 1) / g + 1; /* the chunk's last query sees this many */
        if (n_keys > k_end) n_keys = k_end;
        for (size_t p = k_begin; p < n_keys; p += tt) {
            const size_t n = p + tt < n_keys ? tt : n_keys - p;
            if (p + n < n_keys) {
                const size_t n2 = n_keys - p - n < tt ? n_keys - p - n : tt;
                prefetch_tokens(c, L, h, 1, p + n, n2);
                prefetch_tokens(c, L, h, 0, p + n, n2);
            } else if (job->n_slice && h + 1 < c->n_head_kv && b == qb) { /* the next head of the slice */
                prefetch_tokens(c, L, h + 1, 1, k_begin, tt);
                prefetch_tokens(c, L, h + 1, 0, k_begin, tt);
            }
            float bias_buf[QCHUNK_MAX * TILE_MAX_TOKENS];
            const float *bias = NULL;
            if (L->k_rc) {
                rc_bias(c, L, h, rq, b - a, p, n, bias_buf);
                bias = bias_buf;
            }
            if (box && box_tile_ok(c, L, h, p, n, job->pos0 + a / g + 1)) {
                box_tile(c, L, h, bq, b - a, p, n, bias, m, l, accs);
                continue;
            }
            read_tokens(c, L, h, 1, p, n, kt, 0); /* keys less the turned centre: it is in the bias */
            read_tokens(c, L, h, 0, p, n, vt, 0);
            for (size_t qi = a; qi < b; qi++) {
                const size_t t = qi / g, hq = h * g + qi % g;
                const size_t lim = job->pos0 + t + 1; /* causal: positions < lim */
                if (lim <= p) continue;
                const size_t nv = lim - p < n ? lim - p : n;
                job->tile(qs + (qi - a) * d, kt, vt, bias ? bias + (qi - a) * TILE_MAX_TOKENS : NULL, nv, d,
                          &m[qi - a], &l[qi - a], acc_rows + t * row + hq * d);
            }
        }
        for (size_t qi = a; qi < b; qi++) {
            const size_t t = qi / g, hq = h * g + qi % g;
            float *o = acc_rows + t * row + hq * d;
            if (m_out) { /* a slice's partial: the merge normalises */
                m_out[t * job->n_head + hq] = m[qi - a];
                l_out[t * job->n_head + hq] = l[qi - a];
                continue;
            }
            float sum = l[qi - a];                                   /* >= 1: the max term contributes e^0 */
            if (job->sinks) sum += expf(job->sinks[hq] - m[qi - a]); /* (-inf: 0; past the max: out → 0) */
            const float inv = 1.0f / sum;
            for (size_t i = 0; i < d; i++)
                o[i] *= inv;
            if (L->v.rotated) e8kv_fmt_inverse(&L->v, h, d, o, 1);
        }
    }
}

/* Item i of the job: context slice i (every KV head), or KV head i % n_head_kv and its query chunk
 * i / n_head_kv. */
static void attend_item(void *args, size_t i) {
    const attend_job *job = args;
    const size_t n_kv = job->c->n_head_kv, h = i % n_kv, k = i / n_kv;
    const size_t n_q = job->n_tok * job->group;
    if (job->n_slice) { /* slice i, every KV head in turn (the next head's first tile prefetched) */
        const size_t rows = job->n_tok * job->n_head;
        float *const part = job->part + i * E8KV_ATTEND_PART_MAX;
        const size_t k0 = i * job->slice, k1 = k0 + job->slice < job->n_keys ? k0 + job->slice : job->n_keys;
        for (size_t hh = 0; hh < n_kv; hh++)
            attend_part(job, hh, 0, n_q, k0, k1, part + 2 * rows, part, part + rows);
    } else {
        /* the last chunks (the most keys) first, so that no big piece is left for the end */
        const size_t qa = (job->n_qchunk - 1 - k) * job->qchunk;
        attend_part(job, h, qa, qa + job->qchunk < n_q ? qa + job->qchunk : n_q, 0, job->n_keys, job->out,
                    NULL, NULL);
    }
}

/* out row r = Σ_s e^(m_s − M) acc_s / Σ_s e^(m_s − M) l_s over the slices s in order, M = max_s m_s
 * (log-sum-exp merge of the partial softmax states), then un-rotated out of V's coded domain. */
static void merge_slices(const attend_job *job) {
    const e8kv_cache *c = job->c;
    const size_t d = c->head_dim, rows = job->n_tok * job->n_head;
    for (size_t r = 0; r < rows; r++) {
        float M = -INFINITY;
        for (size_t s = 0; s < job->n_slice; s++) {
            const float ms = job->part[s * E8KV_ATTEND_PART_MAX + r];
            if (ms > M) M = ms;
        }
        float *const o = job->out + r * d;
        memset(o, 0, d * sizeof(float));
        float sum = 0.0f;
        for (size_t s = 0; s < job->n_slice; s++) {
            const float *const part = job->part + s * E8KV_ATTEND_PART_MAX;
            if (part[r] == -INFINITY) continue; /* the slice holds no key this query sees */
            const float w = expf(part[r] - M);
            sum += w * part[rows + r];
            const float *const a = part + 2 * rows + r * d;
            for (size_t k = 0; k < d; k++)
                o[k] += w * a[k];
        }
        /* sum ≥ 1 (the slice holding the max contributes its l ≥ 1), and a learned sink's own term */
        if (job->sinks) sum += expf(job->sinks[r % job->n_head] - M);
        const float inv = 1.0f / sum;
        for (size_t k = 0; k < d; k++)
            o[k] *= inv;
        if (job->L->v.rotated) e8kv_fmt_inverse(&job->L->v, r % job->n_head / job->group, d, o, 1);
    }
}

size_t e8kv_cache_attend(e8kv_cache *cache, float *out, size_t out_capacity, size_t layer, const float *q,
                         size_t n_head, size_t n_tok, size_t pos0) {
    return e8kv_cache_attend_sinks(cache, out, out_capacity, layer, q, n_head, n_tok, pos0, NULL);
}

size_t e8kv_cache_attend_sinks(e8kv_cache *cache, float *out, size_t out_capacity, size_t layer,
                               const float *q, size_t n_head, size_t n_tok, size_t pos0, const float *sinks) {
    if (!cache || !out || !q || n_tok == 0) return E8KV_ERR(BAD_ARGUMENT);
    if (layer >= cache->n_layer || n_head == 0 || n_head % cache->n_head_kv) return E8KV_ERR(DIMENSION);
    const kv_layer *L = &cache->layers[layer];
    /* positions to slots: queries come after every evicted position (evict.c) */
    if (pos0 < L->n_evicted) return E8KV_ERR(DIMENSION);
    pos0 -= L->n_evicted;
    if (pos0 > L->n_tokens || n_tok > L->n_tokens - pos0) return E8KV_ERR(DIMENSION);
    const size_t n_out = n_tok * n_head * cache->head_dim;
    if (out_capacity < n_out) return E8KV_ERR(DST_TOO_SMALL);
    if (!e8kv_all_finite(q, n_out)) return E8KV_ERR(NONFINITE); /* q has out's shape */
    for (size_t h = 0; sinks && h < n_head; h++) /* -inf: no sink for that head; NaN, +inf: refused */
        if (isnan(sinks[h]) || sinks[h] == INFINITY) return E8KV_ERR(NONFINITE);

    const size_t d = cache->head_dim, n_keys = pos0 + n_tok, group = n_head / cache->n_head_kv;
    attend_job job = {.c = cache,
                      .L = L,
                      .out = out,
                      .q = q,
                      .n_head = n_head,
                      .group = group,
                      .n_tok = n_tok,
                      .pos0 = pos0,
                      .n_keys = n_keys,
                      .tile = cache->use_avx2 ? e8kv_attn_tile_avx2 : e8kv_attn_tile_ref,
                      .qchunk = TILE_FLOATS / d < QCHUNK_MAX ? TILE_FLOATS / d : QCHUNK_MAX,
                      .sinks = sinks};
    /* The pieces depend on the call and n_ctx alone, never on the threads (e8kv.h): a few query tokens
     * over more than one slice of keys: every slice (all KV heads), each leaving a partial state; otherwise
     * every (KV head, chunk of its queries), each final. */
    const int by_slice =
        cache->attn_part && n_keys > cache->attn_slice && n_tok * n_head * (d + 2) <= E8KV_ATTEND_PART_MAX;
    size_t n_item;
    if (by_slice) {
        job.slice = cache->attn_slice;
        job.n_slice = (n_keys + job.slice - 1) / job.slice;
        assert(job.n_slice <= (cache->n_ctx + job.slice - 1) / job.slice);
        job.part = cache->attn_part;
        n_item = job.n_slice;
        pthread_mutex_lock(&cache->attn_mu); /* the scratch is the cache's: one call at a time */
        /* each query is scaled, rotated (and quantized for e8box) once, not once per slice */
        float *const qprep = cache->attn_part + job.n_slice * E8KV_ATTEND_PART_MAX;
        const size_t n_qh = n_tok * group;
        for (size_t h = 0; h < cache->n_head_kv; h++)
            for (size_t a = 0; a < n_qh; a += job.qchunk) {
                const size_t b = a + job.qchunk < n_qh ? a + job.qchunk : n_qh;
                const int box = box_ok(cache, L, b - a);
                assert(!box || cache->attn_boxq);
                prep_queries(&job, h, a, b, qprep + (h * n_qh + a) * d,
                             box ? cache->attn_boxq + h * n_qh + a : NULL);
            }
        job.qprep = qprep;
        job.bqprep = cache->attn_boxq;
    } else {
        job.n_qchunk = (n_tok * group + job.qchunk - 1) / job.qchunk;
        n_item = job.n_qchunk * cache->n_head_kv;
    }
    /* tiny calls (short contexts of small models) on the caller's thread: waking workers costs more */
    const double work = (double)n_tok * (double)n_keys * (double)n_head * (double)d;
    e8kv_pool_run(work < ATTEND_POOL_MIN ? NULL : cache->pool, attend_item, &job, n_item);
    if (by_slice) {
        merge_slices(&job);
        pthread_mutex_unlock(&cache->attn_mu);
    }
    return n_out;
}
