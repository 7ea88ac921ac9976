/* The perplexity harness (see ppl.h), matching llama.cpp's tools/perplexity: chunking, BOS handling,
 * second-half scoring, PPL = exp(mean NLL) with std error ppl * sqrt((E[nll^2] - E[nll]^2) / (n - 1)),
 * and its KL-divergence statistics (mean KLD and its std error; "same top p" = top-1 agreement). */
#include "ppl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


size_t e8kv_log_softmax(float *dst, const float *logits, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    const float mx = logits[best];
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += (double)expf(logits[i] - mx); /* terms in float (~1 ulp), the sum in double */
    const float lse = mx + (float)log(sum);
    for (size_t i = 0; i < n; i++)
        dst[i] = logits[i] - lse;
    return best;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void derive(e8kv_ppl_result *r, size_t n_eval_tokens) {
    const double n = (double)r->count;
    if (r->count == 0) return;
    const double mean = r->sum_nll / n, var = r->sum_nll2 / n - mean * mean;
    r->ppl = exp(mean);
    r->ppl_se = var > 0.0 && r->count > 1 ? sqrt(var / (n - 1.0)) * r->ppl : 0.0;
    r->kld = r->sum_kld / n;
    const double kvar = r->sum_kld2 / n - r->kld * r->kld;
    r->kld_se = kvar > 0.0 && r->count > 1 ? sqrt(kvar / (n - 1.0)) : 0.0;
    r->top1 = (double)r->n_same_top1 / n;
    r->top1_se = r->count > 1 ? sqrt(r->top1 * (1.0 - r->top1) / (n - 1.0)) : 0.0;
    r->tokens_per_s = r->seconds > 0.0 ? (double)n_eval_tokens / r->seconds : 0.0;
}

typedef struct {
    e8kv_kv_hook fn;
    void *user;
    int active;
} dump_gate;

static void dump_trampoline(void *user, size_t layer, const float *k, const float *v, size_t n_tok,
                            size_t pos0) {
    const dump_gate *g = user;
    if (g->active) g->fn(g->user, layer, k, v, n_tok, pos0);
}

size_t e8kv_qcap_init(e8kv_qcap *qc, const e8kv_model *m, size_t n_pos) {
    *qc = (e8kv_qcap){NULL, m->cfg.n_layer, n_pos, m->cfg.n_head * m->cfg.head_dim, 0};
    qc->q = malloc(qc->n_layer * n_pos * qc->q_dim * sizeof(float));
    return qc->q ? 0 : E8KV_ERR(OUT_OF_MEMORY);
}

void e8kv_qcap_free(e8kv_qcap *qc) {
    free(qc->q);
    qc->q = NULL;
}

void e8kv_qcap_hook(void *user, size_t layer, const float *q, size_t n_tok, size_t pos0) {
    const e8kv_qcap *g = user;
    if (!g->active || layer >= g->n_layer || pos0 + n_tok > g->n_pos) return;
    memcpy(g->q + (layer * g->n_pos + pos0) * g->q_dim, q, n_tok * g->q_dim * sizeof(float));
}

size_t e8kv_qcap_evict(e8kv_qcap *qc, e8kv_cache *kv, size_t n_head, size_t n_q) {
    if (!qc->q || n_q == 0 || n_q > qc->n_pos) return E8KV_ERR(BAD_ARGUMENT);
    /* layer l's rows start at l * n_pos; the cache reads them at l * n_q (destination <= source, in order) */
    for (size_t l = 1; n_q < qc->n_pos && l < qc->n_layer; l++)
        memmove(qc->q + l * n_q * qc->q_dim, qc->q + l * qc->n_pos * qc->q_dim, n_q * qc->q_dim * sizeof(float));
    return e8kv_cache_evict(kv, qc->q, n_head, n_q, 0);
}

/* Prefix mode: prefill, compress, then the scored tokens (logits of every one of them). Returns the
 * forward passes' error or 0; *compressed: the cache's bytes right after the eviction. */
static size_t eval_prefix(e8kv_context *ctx, float *logits, size_t cap, const int32_t *chunk, size_t prefix,
                          size_t score, e8kv_qcap *qc, size_t n_head, size_t *compressed, size_t *n_kept) {
    qc->active = 1;
    size_t r = e8kv_context_eval(ctx, NULL, 0, chunk, prefix, prefix);
    qc->active = 0;
    if (e8kv_is_error(r)) return r;
    /* the context owns its cache; eviction is the one change the harness makes to it between passes */
    e8kv_cache *kv = (e8kv_cache *)(uintptr_t)e8kv_context_cache(ctx);
    r = e8kv_qcap_evict(qc, kv, n_head, prefix);
    if (e8kv_is_error(r) && r != E8KV_ERR(BAD_ARGUMENT)) return r; /* BAD_ARGUMENT: the spec does not evict */
    *compressed = e8kv_cache_bytes(kv);
    *n_kept = e8kv_cache_n_kept(kv, 0);
    r = e8kv_context_eval(ctx, logits, cap, chunk + prefix, score, 0);
    return e8kv_is_error(r) ? r : 0;
}

size_t e8kv_ppl_run(const e8kv_model *m, const int32_t *tokens, size_t n_tokens, const e8kv_ppl_params *p,
                    e8kv_ppl_result *results) {
    if (!m || !p || !results || !p->specs || p->n_specs == 0 || p->n_specs > E8KV_PPL_MAX_SPECS)
        return E8KV_ERR(BAD_ARGUMENT);
    const size_t prefix = p->prefix;
    if (prefix && p->score < 2) return E8KV_ERR(BAD_ARGUMENT);
    const size_t n_ctx = prefix ? prefix + p->score : p->n_ctx;
    if (!prefix && (n_ctx < 4 || n_ctx % 2)) return E8KV_ERR(BAD_ARGUMENT);
    if (!tokens || n_tokens == 0) return E8KV_ERR(SRC_SIZE);
    if (m->cfg.n_ctx_train && n_ctx > m->cfg.n_ctx_train) return E8KV_ERR(CONTEXT_FULL);
    const size_t n_chunk_max = n_tokens / n_ctx;
    if (n_chunk_max == 0) return E8KV_ERR(SRC_SIZE);
    const size_t n_chunk = p->n_chunks && p->n_chunks < n_chunk_max ? p->n_chunks : n_chunk_max;
    const size_t nv = m->cfg.vocab_size, first = prefix ? prefix : n_ctx / 2, n_rows = n_ctx - first,
                 n_scored = n_ctx - 1 - first;
    const int32_t bos = m->tokenizer ? e8kv_tokenizer_bos(m->tokenizer) : 1;
    /* K and V values a cache holds after one chunk */
    const double n_kv_values = 2.0 * (double)(prefix ? prefix : n_ctx) * (double)m->cfg.n_layer *
                               (double)m->cfg.n_head_kv * (double)m->cfg.head_dim;
    e8kv_qcap qc = {0};

    memset(results, 0, p->n_specs * sizeof *results);
    for (size_t i = 0; i < p->n_specs; i++) {
        results[i].spec = p->specs[i] ? p->specs[i] : "";
        if (!p->specs[i]) results[i].status = E8KV_ERR(SPEC);
    }

    size_t ret = 0;
    dump_gate gate = {p->dump_hook, p->dump_user, 1};
    e8kv_context_params cp = {.n_ctx = n_ctx,
                              .n_batch = n_ctx,
                              .kv_spec = "f32",
                              .seed = p->seed,
                              .n_threads = p->n_threads,
                              .kv_hook = p->dump_hook ? dump_trampoline : NULL,
                              .kv_hook_user = &gate,
                              .calib = p->calib};
    e8kv_context *base = e8kv_context_create(m, &cp, &ret);
    e8kv_context *ctx[E8KV_PPL_MAX_SPECS] = {0};
    cp.kv_hook = NULL;
    if (prefix) {
        cp.q_hook = e8kv_qcap_hook;
        cp.q_hook_user = &qc;
        const size_t qr = e8kv_qcap_init(&qc, m, prefix);
        if (qr) ret = qr;
    }
    for (size_t i = 0; i < p->n_specs && base; i++) {
        if (results[i].status || !strcmp(results[i].spec, "f32")) continue;
        cp.kv_spec = results[i].spec;
        size_t err = 0;
        ctx[i] = e8kv_context_create(m, &cp, &err);
        if (!ctx[i]) results[i].status = e8kv_is_error(err) ? err : E8KV_ERR(GENERIC);
    }
    int32_t *chunk = malloc(n_ctx * sizeof *chunk);
    float *logits = malloc(n_rows * nv * sizeof *logits);
    float *base_lsm = malloc(n_scored * nv * sizeof *base_lsm); /* (n_scored, vocab) */
    float *lsm = malloc(nv * sizeof *lsm);
    size_t *base_top = malloc(n_scored * sizeof *base_top);
    e8kv_ppl_result b = {0};
    b.spec = "f32";
    if (!base || e8kv_is_error(ret)) goto done;
    if (!chunk || !logits || !base_lsm || !lsm || !base_top) {
        ret = E8KV_ERR(OUT_OF_MEMORY);
        goto done;
    }

    for (size_t c = 0; c < n_chunk; c++) {
        memcpy(chunk, tokens + c * n_ctx, n_ctx * sizeof *chunk);
        if (m->cfg.add_bos) chunk[0] = bos;
        const int32_t *target = tokens + c * n_ctx + first + 1; /* the text's own tokens, never BOS */

        /* baseline */
        e8kv_context_reset(base);
        double t0 = now_s();
        ret = e8kv_context_eval(base, logits, n_rows * nv, chunk, n_ctx, first);
        b.seconds += now_s() - t0;
        gate.active = 0;
        if (e8kv_is_error(ret)) goto done;
        b.kv_bytes = e8kv_cache_bytes(e8kv_context_cache(base));
        b.bits_per_value = e8kv_cache_bits_per_value(e8kv_context_cache(base));
        /* the baseline holds the whole chunk, prefix mode included */
        b.eff_bits_per_value =
            8.0 * (double)b.kv_bytes / n_kv_values * (prefix ? (double)prefix / n_ctx : 1.0);
        for (size_t j = 0; j < n_scored; j++) {
            float *row = base_lsm + j * nv;
            base_top[j] = e8kv_log_softmax(row, logits + j * nv, nv);
            const double nll = -(double)row[target[j]];
            b.sum_nll += nll;
            b.sum_nll2 += nll * nll;
        }
        b.count += n_scored;
        b.n_same_top1 += n_scored;
        derive(&b, (c + 1) * n_ctx);

        /* each format on the same chunk */
        for (size_t i = 0; i < p->n_specs; i++) {
            e8kv_ppl_result *r = &results[i];
            if (r->status) continue;
            if (!ctx[i]) { /* "f32": the baseline itself */
                const char *spec = r->spec;
                *r = b;
                r->spec = spec;
                continue;
            }
            e8kv_context_reset(ctx[i]);
            t0 = now_s();
            size_t held = 0;
            const size_t e = prefix ? eval_prefix(ctx[i], logits, n_rows * nv, chunk, prefix, p->score, &qc,
                                                  m->cfg.n_head, &held, &r->n_kept)
                                    : e8kv_context_eval(ctx[i], logits, n_rows * nv, chunk, n_ctx, first);
            r->seconds += now_s() - t0;
            if (e8kv_is_error(e)) { /* e.g. a codec's RANGE error: report it, keep the others going */
                r->status = e;
                continue;
            }
            r->kv_bytes = prefix ? held : e8kv_cache_bytes(e8kv_context_cache(ctx[i]));
            if (prefix) r->compression = (16.0 / 8.0) * n_kv_values / (double)held;
            r->bits_per_value = e8kv_cache_bits_per_value(e8kv_context_cache(ctx[i]));
            r->eff_bits_per_value = 8.0 * (double)r->kv_bytes / n_kv_values;
            for (size_t j = 0; j < n_scored; j++) {
                const float *brow = base_lsm + j * nv;
                const size_t top = e8kv_log_softmax(lsm, logits + j * nv, nv);
                const double nll = -(double)lsm[target[j]];
                double kld = 0.0;
                for (size_t k = 0; k < nv; k++)
                    kld += (double)expf(brow[k]) * (double)(brow[k] - lsm[k]);
                r->sum_nll += nll;
                r->sum_nll2 += nll * nll;
                r->sum_kld += kld;
                r->sum_kld2 += kld * kld;
                r->n_same_top1 += top == base_top[j];
            }
            r->count += n_scored;
            derive(r, (c + 1) * n_ctx);
        }
        if (p->baseline) *p->baseline = b;
        if (p->progress) p->progress(p->progress_user, c, n_chunk, results, p->n_specs);
    }
    ret = n_chunk;
done:
    for (size_t i = 0; i < p->n_specs; i++)
        e8kv_context_free(ctx[i]);
    e8kv_context_free(base);
    free(chunk);
    free(logits);
    free(base_lsm);
    free(lsm);
    free(base_top);
    e8kv_qcap_free(&qc);
    return ret;
}
