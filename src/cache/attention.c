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
 * Threads: for a few query tokens (decode) the context is cut into one slice per thread, every thread
 * covering all KV heads over its slice (3 KV heads over 2 threads would leave one thread idle for a
 * third of the time); each slice leaves a partial softmax state (m, l, unnormalised acc) and the
 * partials are merged by log-sum-exp: out = Σ_i e^(m_i − M) acc_i / Σ_i e^(m_i − M) l_i, M = max_i m_i.
 * Prefill (many query tokens) splits over KV heads. The shares run on the cache's persistent pool
 * (common/pool.h), made at create for n_threads > 1. */
#include "kvcache.h"

#include "../common/cpu.h"
#include "../common/pool.h"
#include "../quant/e8_box.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* Stack budget per worker: one K tile, one V tile and one chunk of rotated queries, 32 KiB each. */
#define TILE_FLOATS 8192
#define TILE_MAX_TOKENS 64
#define QCHUNK_MAX 64

/* RoPE of n consecutive key vectors at positions pos .. pos + n - 1 (x: (n, head_dim)). The angle of
 * the first is taken in double (pos * theta^(-2i/d) reaches 1e5 rad, beyond float's precision); the
 * next ones by rotating (cos, sin) by the per-frequency step, so a run costs head_dim trig calls instead
 * of n * head_dim. n <= one page (64 by default): the recurrence drifts by ~n float ulps. */
static void rope_apply_run(const e8kv_cache *c, float *restrict x, size_t pos, size_t n) {
    const size_t d = c->head_dim, half = d / 2;
    float cs[E8KV_MAX_HEAD_DIM / 2], sn[E8KV_MAX_HEAD_DIM / 2], dc[E8KV_MAX_HEAD_DIM / 2],
        ds[E8KV_MAX_HEAD_DIM / 2];
    for (size_t i = 0; i < half; i++) {
        const double f = c->rope_inv_freq[i];
        const double a = fmod((double)pos * f, 6.283185307179586);
        cs[i] = (float)cos(a);
        sn[i] = (float)sin(a);
        dc[i] = (float)cos(f);
        ds[i] = (float)sin(f);
    }
    for (size_t t = 0; t < n; t++) {
        float *const y = x + t * d;
        for (size_t i = 0; i < half; i++) {
            const size_t i0 = c->rope_neox ? i : 2 * i, i1 = c->rope_neox ? i + half : 2 * i + 1;
            const float x0 = y[i0], x1 = y[i1];
            y[i0] = x0 * cs[i] - x1 * sn[i];
            y[i1] = x0 * sn[i] + x1 * cs[i];
            const float c2 = cs[i] * dc[i] - sn[i] * ds[i];
            sn[i] = sn[i] * dc[i] + cs[i] * ds[i];
            cs[i] = c2;
        }
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
        e8kv_cache_read_e8ball_avx2(dst, src, n, d, f->codec->bits, f->vector_bytes);
        return 1;
    case KV_FAST_E8BOX:
        for (size_t i = 0; i < n; i++)
            e8kv_box_decode_avx2(dst + i * d, src + i * f->vector_bytes, d);
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

void e8kv_cache_read_tokens(const e8kv_cache *c, const kv_layer *L, size_t head, int is_k, size_t p0,
                            size_t n, float *restrict dst) {
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
        }
        if (rope) rope_apply_run(c, y, pos, run);
        t += run;
    }
}

void e8kv_attn_tile_ref(const float *restrict q, const float *restrict K, const float *restrict V, size_t n,
                        size_t d, float *restrict m, float *restrict l, float *restrict acc) {
    float s[TILE_MAX_TOKENS];
    assert(n <= TILE_MAX_TOKENS);
    float m_new = *m;
    for (size_t j = 0; j < n; j++) {
        float dot = 0.0f;
        for (size_t i = 0; i < d; i++)
            dot += q[i] * K[j * d + i];
        s[j] = dot;
        if (dot > m_new) m_new = dot;
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

typedef void (*tile_fn)(const float *restrict, const float *restrict, const float *restrict, size_t, size_t,
                        float *restrict, float *restrict, float *restrict);

typedef struct {
    const e8kv_cache *c;
    const kv_layer *L;
    float *out; /* (n_tok, n_head, head_dim): the result, or the unnormalised acc of a partial */
    const float *q;
    size_t n_head, group, n_tok, pos0;
    size_t h_begin, h_end; /* KV heads of this worker */
    size_t k_begin, k_end; /* key positions of this worker (context slice) */
    float *m, *l;          /* (n_tok, n_head): partial state of a slice; NULL: finalise into out */
    tile_fn tile;
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

static int box_ok(const e8kv_cache *c, const kv_layer *L, size_t n_q) {
    return L->k.fast == KV_FAST_E8BOX && L->v.fast == KV_FAST_E8BOX && L->k.rotated && L->v.rotated &&
           c->head_dim % 64 == 0 && c->head_dim <= E8KV_BOX_MAX_D && n_q <= BOX_QMAX;
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

static void box_tile(const e8kv_cache *c, const kv_layer *L, size_t h, const e8kv_box_query *bq, size_t n_q,
                     size_t p, size_t n, float *m, float *l, float *const *accs) {
    const size_t P = c->page_tokens, vb = L->k.vector_bytes, d = c->head_dim;
    const uint8_t *const k = L->k_pages[h * c->n_page_max + p / P].data + (p % P) * vb;
    const uint8_t *const v = L->v_pages[h * c->n_page_max + p / P].data + (p % P) * vb;
    const float *const mu_v = L->v.centered ? L->v_mu_read + h * d : NULL;
    if (!c->use_avx2) {
        e8kv_attn_box_tile_ref(bq, n_q, k, v, vb, n, d, mu_v, m, l, accs);
        return;
    }
#ifdef E8KV_HAVE_AVXVNNI
    if (c->use_vnni) {
        e8kv_attn_box_tile_vnni(bq, n_q, k, v, vb, n, d, mu_v, m, l, accs);
        return;
    }
#endif
    e8kv_attn_box_tile_avx2(bq, n_q, k, v, vb, n, d, mu_v, m, l, accs);
}

static void attend_head(const attend_job *job, size_t h) {
    const e8kv_cache *c = job->c;
    const kv_layer *L = job->L;
    const size_t d = c->head_dim, g = job->group, row = job->n_head * d;
    const size_t n_q = job->n_tok * g;
    size_t tt = TILE_FLOATS / d;
    if (tt > TILE_MAX_TOKENS) tt = TILE_MAX_TOKENS;
    size_t qc = TILE_FLOATS / d;
    if (qc > QCHUNK_MAX) qc = QCHUNK_MAX;
    float kt[TILE_FLOATS], vt[TILE_FLOATS], qr[TILE_FLOATS];
    float m[QCHUNK_MAX], l[QCHUNK_MAX];
    const float scale = 1.0f / sqrtf((float)d);
    for (size_t a = 0; a < n_q; a += qc) {
        const size_t b = a + qc < n_q ? a + qc : n_q;
        for (size_t qi = a; qi < b; qi++) {
            const size_t t = qi / g, hq = h * g + qi % g;
            float *qv = qr + (qi - a) * d;
            const float *src = job->q + t * row + hq * d;
            for (size_t i = 0; i < d; i++)
                qv[i] = src[i] * scale;
            if (L->k.rotated) e8kv_fmt_query(&L->k, h, d, qv, 1);
            memset(job->out + t * row + hq * d, 0, d * sizeof(float));
            m[qi - a] = -INFINITY;
            l[qi - a] = 0.0f;
        }
        /* e8box:4 keys and values read in the rotated domain: integer-domain tiles (attn_box.c) */
        const int box = box_ok(c, L, b - a);
        e8kv_box_query bq[BOX_QMAX];
        float *accs[BOX_QMAX];
        for (size_t qi = a; box && qi < b; qi++) {
            const size_t t = qi / g, hq = h * g + qi % g;
            e8kv_box_query_init(&bq[qi - a], qr + (qi - a) * d, L->k.centered ? L->k_mu_read + h * d : NULL,
                                d);
            accs[qi - a] = job->out + t * row + hq * d;
        }
        size_t n_keys = job->pos0 + (b - 1) / g + 1; /* the chunk's last query sees this many */
        if (n_keys > job->k_end) n_keys = job->k_end;
        for (size_t p = job->k_begin; p < n_keys; p += tt) {
            const size_t n = p + tt < n_keys ? tt : n_keys - p;
            if (p + n < n_keys) {
                const size_t n2 = n_keys - p - n < tt ? n_keys - p - n : tt;
                prefetch_tokens(c, L, h, 1, p + n, n2);
                prefetch_tokens(c, L, h, 0, p + n, n2);
            }
            if (box && box_tile_ok(c, L, h, p, n, job->pos0 + a / g + 1)) {
                box_tile(c, L, h, bq, b - a, p, n, m, l, accs);
                continue;
            }
            e8kv_cache_read_tokens(c, L, h, 1, p, n, kt);
            e8kv_cache_read_tokens(c, L, h, 0, p, n, vt);
            for (size_t qi = a; qi < b; qi++) {
                const size_t t = qi / g, hq = h * g + qi % g;
                const size_t lim = job->pos0 + t + 1; /* causal: positions < lim */
                if (lim <= p) continue;
                const size_t nv = lim - p < n ? lim - p : n;
                job->tile(qr + (qi - a) * d, kt, vt, nv, d, &m[qi - a], &l[qi - a],
                          job->out + t * row + hq * d);
            }
        }
        for (size_t qi = a; qi < b; qi++) {
            const size_t t = qi / g, hq = h * g + qi % g;
            float *o = job->out + t * row + hq * d;
            if (job->m) { /* a slice's partial: the merge normalises */
                job->m[t * job->n_head + hq] = m[qi - a];
                job->l[t * job->n_head + hq] = l[qi - a];
                continue;
            }
            const float inv = 1.0f / l[qi - a]; /* l >= 1: the max term contributes e^0 */
            for (size_t i = 0; i < d; i++)
                o[i] *= inv;
            if (L->v.rotated) e8kv_fmt_inverse(&L->v, h, d, o, 1);
        }
    }
}

static void *attend_worker(void *arg) {
    const attend_job *job = arg;
    for (size_t h = job->h_begin; h < job->h_end; h++)
        attend_head(job, h);
    return NULL;
}

static void attend_share(void *jobs, size_t i) {
    attend_worker((attend_job *)jobs + i);
}

#define MAX_THREADS E8KV_ATTEND_MAX_THREADS
#define CTX_SLICE_MIN 1024     /* keys per context slice at least */
#define CTX_PARTIAL_MAX 262144 /* floats of one slice's partial acc at most (1 MiB) */

size_t e8kv_cache_attend(e8kv_cache *cache, float *out, size_t out_capacity, size_t layer, const float *q,
                         size_t n_head, size_t n_tok, size_t pos0) {
    if (!cache || !out || !q || n_tok == 0) return E8KV_ERR(BAD_ARGUMENT);
    if (layer >= cache->n_layer || n_head == 0 || n_head % cache->n_head_kv) return E8KV_ERR(DIMENSION);
    const kv_layer *L = &cache->layers[layer];
    if (pos0 > L->n_tokens || n_tok > L->n_tokens - pos0) return E8KV_ERR(DIMENSION);
    const size_t n_out = n_tok * n_head * cache->head_dim;
    if (out_capacity < n_out) return E8KV_ERR(DST_TOO_SMALL);
    if (!e8kv_all_finite(q, n_out)) return E8KV_ERR(NONFINITE); /* q has out's shape */

    const size_t d = cache->head_dim, n_keys = pos0 + n_tok;
    attend_job base = {cache,
                       L,
                       out,
                       q,
                       n_head,
                       n_head / cache->n_head_kv,
                       n_tok,
                       pos0,
                       0,
                       cache->n_head_kv,
                       0,
                       n_keys,
                       NULL,
                       NULL,
                       cache->use_avx2 ? e8kv_attn_tile_avx2 : e8kv_attn_tile_ref};
    size_t n_thr = cache->n_threads > MAX_THREADS ? MAX_THREADS : cache->n_threads;
    /* context slices of at least CTX_SLICE_MIN keys, each with a partial of n_out + 2·n_tok·n_head floats */
    const int by_ctx = n_thr > 1 && n_keys >= n_thr * CTX_SLICE_MIN && n_out <= CTX_PARTIAL_MAX;
    if (!by_ctx && n_thr > cache->n_head_kv) n_thr = cache->n_head_kv;
    float *scratch = NULL;
    if (by_ctx) {
        const size_t per = n_out + 2 * n_tok * n_head;
        scratch = malloc(n_thr * per * sizeof(float)); /* slice 0's acc is `out` itself; its m, l live here */
        if (!scratch) return E8KV_ERR(OUT_OF_MEMORY);
    }
    if (n_thr <= 1) {
        attend_worker(&base);
        return n_out;
    }
    attend_job jobs[MAX_THREADS];
    for (size_t i = 0; i < n_thr; i++) {
        jobs[i] = base;
        if (by_ctx) {
            /* slice bounds on tile multiples, so slices read whole pages */
            const size_t n_tiles = (n_keys + TILE_MAX_TOKENS - 1) / TILE_MAX_TOKENS;
            const size_t k0 = n_tiles * i / n_thr * TILE_MAX_TOKENS,
                         k1 = n_tiles * (i + 1) / n_thr * TILE_MAX_TOKENS;
            float *const part = scratch + i * (n_out + 2 * n_tok * n_head);
            jobs[i].k_begin = k0;
            jobs[i].k_end = k1 < n_keys ? k1 : n_keys;
            jobs[i].out = i ? part + 2 * n_tok * n_head : out;
            jobs[i].m = part;
            jobs[i].l = part + n_tok * n_head;
        } else {
            jobs[i].h_begin = cache->n_head_kv * i / n_thr;
            jobs[i].h_end = cache->n_head_kv * (i + 1) / n_thr;
        }
    }
    /* the cache's pool runs the shares (the caller's thread takes the first); when another caller holds
     * the pool, threads of this call's own, and a thread that fails to start runs inline */
    if (!e8kv_pool_try_run(cache->pool, attend_share, jobs, n_thr)) {
        pthread_t tid[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        for (size_t i = 1; i < n_thr; i++)
            started[i] = pthread_create(&tid[i], NULL, attend_worker, &jobs[i]) == 0;
        attend_worker(&jobs[0]);
        for (size_t i = 1; i < n_thr; i++) {
            if (started[i])
                pthread_join(tid[i], NULL);
            else
                attend_worker(&jobs[i]);
        }
    }
    if (by_ctx) {
        /* log-sum-exp merge of the slices' partial states into slice 0's acc (= out) */
        const size_t n_rows = n_tok * n_head;
        for (size_t r = 0; r < n_rows; r++) {
            float M = -INFINITY;
            for (size_t i = 0; i < n_thr; i++)
                if (jobs[i].m[r] > M) M = jobs[i].m[r];
            float *const o = out + r * d;
            float sum = 0.0f;
            for (size_t i = 0; i < n_thr; i++) {
                if (jobs[i].m[r] == -INFINITY) continue; /* the slice saw no key of this query */
                const float w = expf(jobs[i].m[r] - M);
                sum += w * jobs[i].l[r];
                if (i == 0) {
                    for (size_t k = 0; k < d; k++)
                        o[k] *= w;
                } else {
                    const float *const a = jobs[i].out + r * d;
                    for (size_t k = 0; k < d; k++)
                        o[k] += w * a[k];
                }
            }
            const float inv = 1.0f / sum; /* ≥ 1: the slice holding the max contributes its l ≥ 1 */
            for (size_t k = 0; k < d; k++)
                o[k] *= inv;
            if (L->v.rotated) e8kv_fmt_inverse(&L->v, r % n_head / base.group, d, o, 1);
        }
        free(scratch);
    }
    return n_out;
}
