/* Token eviction: after a prefill (e8kv_cache_evict) or whenever a layer holds more than a budget
 * (budget=N, at append), score the tokens of each layer and KV head, keep the best ones and compact the
 * pages so the freed slots' memory is returned (pages past the last kept slot are freed; the accounting
 * in e8kv_cache_bytes follows). Kept tokens keep their positions: each layer stores the position of each
 * kept slot per KV head (kv_layer.pos, counted in the bytes), so keys coded before RoPE get their own
 * phases at attention time and keys coded after it keep theirs.
 *
 * Never evicted: the first max(sink, 1) positions (attention sinks; BOS) and the newest `recent` tokens.
 * Scorers (importance of key j of one KV head; the GQA group's query heads are summed):
 *   keykey  key-key attention, the importance measure of the "NexusQuant" pipeline: the keys themselves,
 *           centred, stand in for queries, each of up to KEYKEY_OBSERVERS evenly spaced keys attends
 *           causally (its own key excluded) and j scores the mean weight it receives from the keys that
 *           see it.
 *   snapkv  the attention of the last `obs` queries of the prefix, summed, then the largest over a window
 *           of SNAPKV_POOL neighbouring slots (Li et al. 2024, "SnapKV", §4.2 clustering by pooling; max
 *           pooling as in the authors' code): a token next to an attended one ranks as high as it, so
 *           attended spans are kept whole. Averaging instead left gaps inside them: a passkey's digits
 *           kept with one missing, and the greedy answer skipping that digit (BENCHMARKS.md).
 *   h2o     accumulated attention: the sum of the weights from every query given (Zhang et al. 2023,
 *           "H2O: Heavy-Hitter Oracle").
 *   stream  sinks and the newest tokens only (Xiao et al. 2023, "StreamingLLM"): the floor.
 * Scores use keys as attention reads them (decoded codes, RoPE at their positions, means added back). */
#include "kvcache.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define KEYKEY_OBSERVERS 256
#define SNAPKV_POOL 7

/* ---------------------------------------------------------------- spec grammar */

static int parse_frac(const char *s, size_t len, float *out) {
    char buf[16];
    if (len == 0 || len >= sizeof buf) return 0;
    for (size_t i = 0; i < len; i++)
        if (!isdigit((unsigned char)s[i]) && s[i] != '.') return 0;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *end = NULL;
    const double v = strtod(buf, &end);
    if (end != buf + len || !(v >= 0.0) || !(v < 1.0)) return 0;
    *out = (float)v;
    return 1;
}

static int parse_count(const char *s, size_t len, size_t *out) {
    if (len == 0 || len > 9) return 0;
    size_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) return 0;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    *out = v;
    return 1;
}

static const char *const k_scorers[] = {"", "keykey", "snapkv", "h2o", "stream"};

int e8kv_evict_parse_item(kv_evict_cfg *ev, const char *key, size_t klen, const char *val, size_t vlen,
                          size_t *err) {
    *err = 0;
#define KEY_IS(s) (klen == strlen(s) && !memcmp(key, s, klen))
    if (KEY_IS("evict")) { /* SCORER:F */
        const char *colon = memchr(val, ':', vlen);
        const size_t nlen = colon ? (size_t)(colon - val) : vlen;
        int sc = 0;
        for (int i = 1; i < (int)(sizeof k_scorers / sizeof k_scorers[0]); i++)
            if (strlen(k_scorers[i]) == nlen && !memcmp(k_scorers[i], val, nlen)) sc = i;
        if (!sc || !colon || !parse_frac(colon + 1, vlen - nlen - 1, &ev->frac)) *err = E8KV_ERR(SPEC);
        ev->scorer = sc;
        return 1;
    }
    if (KEY_IS("recent")) {
        if (!parse_count(val, vlen, &ev->recent) || ev->recent == 0) *err = E8KV_ERR(SPEC);
        ev->tuned = 1;
        return 1;
    }
    if (KEY_IS("obs")) {
        if (!parse_count(val, vlen, &ev->obs) || ev->obs == 0) *err = E8KV_ERR(SPEC);
        ev->tuned = 1;
        return 1;
    }
    if (KEY_IS("budget")) {
        if (!parse_count(val, vlen, &ev->budget)) *err = E8KV_ERR(SPEC);
        ev->tuned = 1;
        return 1;
    }
#undef KEY_IS
    /* evictA[-B]=F: the fraction of layers A..B */
    if (klen > 5 && !memcmp(key, "evict", 5) && isdigit((unsigned char)key[5])) {
        size_t q = 5, first = 0, last = 0;
        while (q < klen && isdigit((unsigned char)key[q]))
            q++;
        int ok = parse_count(key + 5, q - 5, &first);
        last = first;
        if (ok && q < klen && key[q] == '-') {
            const size_t s = ++q;
            while (q < klen && isdigit((unsigned char)key[q]))
                q++;
            ok = parse_count(key + s, q - s, &last) && last >= first;
        }
        float f = 0.0f;
        if (!ok || q != klen || ev->n_rules >= E8KV_EVICT_RULES_MAX || last > UINT32_MAX ||
            !parse_frac(val, vlen, &f)) {
            *err = E8KV_ERR(SPEC);
            return 1;
        }
        ev->tuned = 1;
        ev->first[ev->n_rules] = (uint32_t)first;
        ev->last[ev->n_rules] = (uint32_t)last;
        ev->rule_frac[ev->n_rules++] = f;
        return 1;
    }
    return 0;
}

const char *e8kv_evict_scorer_name(int scorer) {
    return scorer > 0 && scorer < (int)(sizeof k_scorers / sizeof k_scorers[0]) ? k_scorers[scorer] : "";
}

size_t e8kv_evict_canon(const e8kv_cache *c, char *dst, size_t cap) {
    if (!c->ev.scorer) return 0;
    /* %.9g of a float reads back to the same float */
    int w = snprintf(dst, cap, ",evict=%s:%.9g,recent=%zu,obs=%zu,budget=%zu", k_scorers[c->ev.scorer],
                     (double)c->ev.frac, c->ev.recent, c->ev.obs, c->ev.budget);
    if (w < 0 || (size_t)w >= cap) return E8KV_ERR(UNSUPPORTED);
    size_t n = (size_t)w;
    for (size_t i = 0; i < c->ev.n_rules; i++) {
        w = snprintf(dst + n, cap - n, ",evict%u-%u=%.9g", (unsigned)c->ev.first[i], (unsigned)c->ev.last[i],
                     (double)c->ev.rule_frac[i]);
        if (w < 0 || (size_t)w >= cap - n) return E8KV_ERR(UNSUPPORTED);
        n += (size_t)w;
    }
    return n;
}

void e8kv_evict_reset(e8kv_cache *c, kv_layer *L) {
    c->index_bytes -= c->n_head_kv * L->n_map * sizeof(uint32_t);
    free(L->pos);
    L->pos = NULL;
    L->n_map = 0;
    L->n_evicted = 0;
}

/* ---------------------------------------------------------------- scoring */

/* One observer (query qv already scaled, at position pq, or the key of slot self) over the n keys K of
 * one head with positions kp: softmax over the keys it sees, weights added to score (and 1 to cnt). sink:
 * the head's learned attention sink, a logit that joins the softmax with no key (-INFINITY: none), so an
 * observer whose attention goes to the sink adds less to every key. */
static void observe(const float *qv, size_t pq, size_t self, const float *K, const size_t *kp, size_t n,
                    size_t d, float sink, float *w, double *score, double *cnt) {
    float mx = sink;
    size_t seen = 0;
    for (size_t j = 0; j < n; j++) {
        if (kp[j] > pq || j == self) {
            w[j] = -INFINITY;
            continue;
        }
        float s = 0.0f;
        for (size_t i = 0; i < d; i++)
            s += qv[i] * K[j * d + i];
        w[j] = s;
        if (s > mx) mx = s;
        seen++;
    }
    if (!seen) return;
    double sum = sink != -INFINITY ? exp((double)sink - (double)mx) : 0.0;
    for (size_t j = 0; j < n; j++)
        if (w[j] != -INFINITY) sum += (double)(w[j] = expf(w[j] - mx));
    const double inv = 1.0 / sum;
    for (size_t j = 0; j < n; j++)
        if (w[j] != -INFINITY) {
            score[j] += (double)w[j] * inv;
            if (cnt) cnt[j] += 1.0;
        }
}

/* Scores of the n slots of head h of layer l. q: the layer's queries (n_q, n_head * d) before RoPE at
 * positions q_pos0..., or NULL; rope: what turns them (the cache's RoPE; NULL: none); sinks: the layer's
 * learned sinks, n_head logits (NULL: none; keykey has no query heads and takes none). Scratch: K (n, d),
 * kp (n), w (n), cnt (n). */
static void score_head(const e8kv_cache *c, const kv_layer *L, size_t h, int scorer, const float *q,
                       size_t n_head, size_t n_q, size_t q_pos0, const e8kv_rope *rope, const float *sinks,
                       double *score, float *K, size_t *kp, float *w, double *cnt) {
    const size_t n = L->n_tokens, d = c->head_dim;
    for (size_t j = 0; j < n; j++) {
        score[j] = 0.0;
        kp[j] = kv_slot_pos(L, h, j);
    }
    if (scorer == KV_EVICT_STREAM) {
        for (size_t j = 0; j < n; j++)
            score[j] = (double)j;
        return;
    }
    e8kv_cache_read_tokens(c, L, h, 1, 0, n, K);
    if (L->k.rotated) e8kv_fmt_inverse(&L->k, h, d, K, n); /* the original domain: q·k as the model has it */
    const float scale = 1.0f / sqrtf((float)d);
    float qv[E8KV_MAX_HEAD_DIM];
    if (scorer == KV_EVICT_KEYKEY) {
        /* centred keys: the component all keys share (kvcache.h, centering) would otherwise decide every
         * key-key score (measured: uncentred key-key kept worse tokens than sinks + window) */
        double mu[E8KV_MAX_HEAD_DIM] = {0};
        for (size_t j = 0; j < n; j++)
            for (size_t t = 0; t < d; t++)
                mu[t] += K[j * d + t];
        for (size_t j = 0; j < n; j++)
            for (size_t t = 0; t < d; t++)
                K[j * d + t] -= (float)(mu[t] / (double)n);
        memset(cnt, 0, n * sizeof *cnt);
        const size_t stride = n > KEYKEY_OBSERVERS ? (n + KEYKEY_OBSERVERS - 1) / KEYKEY_OBSERVERS : 1;
        for (size_t i = n - 1 + stride; i >= stride; i -= stride) { /* the newest key observes */
            const size_t o = i - stride;
            for (size_t t = 0; t < d; t++)
                qv[t] = K[o * d + t] * scale;
            observe(qv, kp[o], o, K, kp, n, d, -INFINITY, w, score, cnt);
        }
        for (size_t j = 0; j < n; j++)
            score[j] = cnt[j] > 0.0 ? score[j] / cnt[j] : 0.0;
        return;
    }
    /* snapkv / h2o: real queries of the GQA group */
    const size_t g = n_head / c->n_head_kv, row = n_head * d;
    const size_t q0 = scorer == KV_EVICT_SNAPKV && n_q > c->ev.obs ? n_q - c->ev.obs : 0;
    for (size_t t = q0; t < n_q; t++)
        for (size_t hq = h * g; hq < (h + 1) * g; hq++) {
            memcpy(qv, q + t * row + hq * d, d * sizeof(float));
            if (rope) e8kv_rope_apply(rope, qv, 1, 1, q_pos0 + t); /* as the keys' reads turn them */
            for (size_t i = 0; i < d; i++)
                qv[i] *= scale;
            observe(qv, q_pos0 + t, SIZE_MAX, K, kp, n, d, sinks ? sinks[hq] : -INFINITY, w, score, NULL);
        }
    if (scorer == KV_EVICT_SNAPKV) { /* the largest of SNAPKV_POOL neighbours (cnt as scratch) */
        for (size_t j = 0; j < n; j++) {
            const size_t a = j >= SNAPKV_POOL / 2 ? j - SNAPKV_POOL / 2 : 0;
            const size_t b = j + SNAPKV_POOL / 2 + 1 < n ? j + SNAPKV_POOL / 2 + 1 : n;
            double s = 0.0;
            for (size_t i = a; i < b; i++)
                s = score[i] > s ? score[i] : s;
            cnt[j] = s;
        }
        memcpy(score, cnt, n * sizeof *score);
    }
}

typedef struct {
    double s;
    size_t j;
} ranked;

static int by_score_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? 1 : -1;
    return x->j < y->j ? 1 : x->j > y->j ? -1 : 0; /* ties: the newer token first */
}

/* Move slot src to slot dst (dst < src) in one stream of one head: coded bytes (no raw pages: eviction
 * excludes window=). Slots below n_sink never move (they are kept and come first). */
static void move_slot(const e8kv_cache *c, const kv_format *f, kv_page *tab, size_t dst, size_t src) {
    const size_t P = c->page_tokens, vb = f->vector_bytes;
    assert(dst >= c->n_sink && tab[dst / P].data && tab[src / P].data && !tab[src / P].raw);
    memmove(tab[dst / P].data + (dst % P) * vb, tab[src / P].data + (src % P) * vb, vb);
}

/* Evict layer l down to about m_want slots per head (never below its protected slots; rounded up to
 * whole pages, which cost the same). protect_new: the newest slots also kept (those of the append that
 * triggered it). 0 or an error; on an error nothing changed. */
static size_t evict_layer(e8kv_cache *c, size_t l, size_t m_want, size_t protect_new, const float *q,
                          size_t n_head, size_t n_q, size_t q_pos0, const e8kv_rope *rope,
                          const float *sinks) {
    kv_layer *L = &c->layers[l];
    const size_t n = L->n_tokens, H = c->n_head_kv, d = c->head_dim, P = c->page_tokens;
    const size_t lo = c->n_sink > 0 ? c->n_sink : 1; /* slots [0, lo) kept: sinks, or BOS */
    size_t recent = c->ev.recent > protect_new ? c->ev.recent : protect_new;
    if (lo >= n || recent >= n - lo) return 0;
    const size_t hi = n - recent; /* candidates [lo, hi) */
    size_t m = m_want < lo + recent ? lo + recent : m_want;
    m = (m + P - 1) / P * P;
    if (m >= n) return 0;
    const size_t n_keep_c = m - lo - recent;
    int scorer = c->ev.scorer;
    if (!q && (scorer == KV_EVICT_SNAPKV || scorer == KV_EVICT_H2O)) scorer = KV_EVICT_KEYKEY;

    double *score = malloc(n * sizeof *score), *cnt = malloc(n * sizeof *cnt);
    float *K = malloc(n * d * sizeof *K), *w = malloc(n * sizeof *w);
    size_t *kp = malloc(n * sizeof *kp), *keep = malloc(H * m * sizeof *keep);
    ranked *rk = malloc((hi - lo) * sizeof *rk);
    uint8_t *flag = malloc(n);
    uint32_t *npos = malloc(H * m * sizeof *npos);
    size_t r = score && cnt && K && w && kp && keep && rk && flag && npos ? 0 : E8KV_ERR(OUT_OF_MEMORY);
    for (size_t h = 0; h < H && !r; h++) {
        score_head(c, L, h, scorer, q ? q + l * n_q * n_head * d : NULL, n_head, n_q, q_pos0, rope,
                   sinks ? sinks + l * n_head : NULL, score, K, kp, w, cnt);
        for (size_t j = lo; j < hi; j++)
            rk[j - lo] = (ranked){score[j], j};
        qsort(rk, hi - lo, sizeof *rk, by_score_desc);
        memset(flag, 0, n);
        for (size_t j = 0; j < lo; j++)
            flag[j] = 1;
        for (size_t j = hi; j < n; j++)
            flag[j] = 1;
        for (size_t i = 0; i < n_keep_c; i++)
            flag[rk[i].j] = 1;
        size_t k = 0;
        for (size_t j = 0; j < n; j++)
            if (flag[j]) {
                npos[h * m + k] = (uint32_t)kp[j];
                keep[h * m + k++] = j;
            }
        assert(k == m);
    }
    free(score);
    free(cnt);
    free(K);
    free(w);
    free(kp);
    free(rk);
    free(flag);
    if (r) {
        free(keep);
        free(npos);
        return r;
    }
    /* compaction: keep[] ascends with keep[i] >= i, so moving in order never overwrites a kept source */
    const size_t M = c->n_page_max;
    for (size_t h = 0; h < H; h++)
        for (size_t i = lo; i < m; i++) {
            const size_t s = keep[h * m + i];
            if (s == i) continue;
            move_slot(c, &L->k, L->k_pages + h * M, i, s);
            move_slot(c, &L->v, L->v_pages + h * M, i, s);
        }
    free(keep);
    const size_t next = n + L->n_evicted; /* the position the next token takes */
    c->index_bytes -= H * L->n_map * sizeof(uint32_t);
    free(L->pos);
    L->pos = npos;
    L->n_map = m;
    L->n_evicted = next - m;
    L->n_tokens = m;
    c->index_bytes += H * m * sizeof(uint32_t);
    e8kv_cache_free_pages_from(c, L, m);
    return 0;
}

size_t e8kv_evict_after_append(e8kv_cache *c, size_t l, size_t n_new) {
    if (!c->ev.scorer || !c->ev.budget) return 0;
    const kv_layer *L = &c->layers[l];
    if (L->n_tokens <= c->ev.budget + c->page_tokens) return 0; /* a page of slack: not at every token */
    const size_t r = evict_layer(c, l, c->ev.budget, n_new, NULL, 0, 0, 0, NULL, NULL); /* (no queries) */
    e8kv_cache_compact_pages(c);
    return r == E8KV_ERR(OUT_OF_MEMORY) ? 0 : r; /* best effort: the append itself stands */
}

size_t e8kv_cache_evict(e8kv_cache *cache, const float *q, size_t n_head, size_t n_q, size_t q_pos0) {
    return e8kv_cache_evict_sinks(cache, q, n_head, n_q, q_pos0, NULL);
}

size_t e8kv_cache_evict_sinks(e8kv_cache *cache, const float *q, size_t n_head, size_t n_q, size_t q_pos0,
                              const float *sinks) {
    if (!cache || !cache->ev.scorer) return E8KV_ERR(BAD_ARGUMENT);
    if (q && (n_head == 0 || n_head % cache->n_head_kv || n_q == 0)) return E8KV_ERR(DIMENSION);
    if (!q && (cache->ev.scorer == KV_EVICT_SNAPKV || cache->ev.scorer == KV_EVICT_H2O))
        return E8KV_ERR(BAD_ARGUMENT);
    if (sinks && !q) return E8KV_ERR(BAD_ARGUMENT); /* sinks weigh queries */
    if (q && !e8kv_all_finite(q, cache->n_layer * n_q * n_head * cache->head_dim)) return E8KV_ERR(NONFINITE);
    for (size_t i = 0; sinks && i < cache->n_layer * n_head; i++) /* -inf: no sink; NaN, +inf: refused */
        if (isnan(sinks[i]) || sinks[i] == INFINITY) return E8KV_ERR(NONFINITE);
    /* the queries turn by the cache's RoPE: its own object (rope=pre, center=rope), else one for this call */
    const e8kv_rope *rope = cache->rope;
    e8kv_rope *made = NULL;
    size_t r = 0;
    if (q && kv_has_rope(cache) && !rope) {
        if (!(made = kv_rope_create(cache, &r))) return r;
        rope = made;
    }
    size_t n_max = 0;
    for (size_t l = 0; l < cache->n_layer && !e8kv_is_error(r); l++) {
        kv_layer *L = &cache->layers[l];
        const size_t n = L->n_tokens;
        const size_t m = n - (size_t)floor((double)L->evict_frac * (double)n);
        r = evict_layer(cache, l, m, 0, q, n_head, n_q, q_pos0, q ? rope : NULL, sinks);
        if (L->n_tokens > n_max) n_max = L->n_tokens;
    }
    e8kv_rope_free(made);
    e8kv_cache_compact_pages(cache); /* the evicted pages' slabs go back to the system */
    return e8kv_is_error(r) ? r : n_max;
}
