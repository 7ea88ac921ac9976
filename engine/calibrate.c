/* Model calibration for the e8t formats (calibrate.h). Public API only: a context with an exact f32 cache
 * that wants keys before RoPE, whose K/V hook feeds e8kv_calib_observe and whose query hook (queries
 * before RoPE) e8kv_calib_observe_q. */
#include "calibrate.h"
#include "ppl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct {
    e8kv_calib *cal;
    size_t n_head;
    size_t err;
} observe_state;

/* n_batch = n_ctx: every call holds a whole chunk of one layer, i.e. one sequence */
static void observe_hook(void *user, size_t layer, const float *k, const float *v, size_t n_tok,
                         size_t pos0) {
    observe_state *s = user;
    (void)pos0;
    if (e8kv_is_error(s->err)) return;
    const size_t r = e8kv_calib_observe(s->cal, layer, k, v, n_tok);
    if (e8kv_is_error(r)) s->err = r;
}

static void observe_q_hook(void *user, size_t layer, const float *q, size_t n_tok, size_t pos0) {
    observe_state *s = user;
    (void)pos0;
    if (e8kv_is_error(s->err)) return;
    const size_t r = e8kv_calib_observe_q(s->cal, layer, q, s->n_head, n_tok);
    if (e8kv_is_error(r)) s->err = r;
}

static e8kv_calib *fail(e8kv_calib *cal, size_t *err, size_t code) {
    e8kv_calib_free(cal);
    if (err) *err = code;
    return NULL;
}

e8kv_calib *e8kv_calibrate_model(const e8kv_model *m, const int32_t *tokens, size_t n_tokens,
                                 const e8kv_calibrate_params *p, size_t *err) {
    if (err) *err = 0;
    if (!m || !tokens || !p || p->n_ctx < 16) return fail(NULL, err, E8KV_ERR(BAD_ARGUMENT));
    if (p->n_ctx > m->cfg.n_ctx_train && m->cfg.n_ctx_train) return fail(NULL, err, E8KV_ERR(CONTEXT_FULL));
    const size_t n_all = n_tokens / p->n_ctx;
    if (n_all == 0) return fail(NULL, err, E8KV_ERR(SRC_SIZE));
    const size_t n_chunks = p->n_chunks && p->n_chunks < n_all ? p->n_chunks : n_all;
    const e8kv_model_config *cfg = &m->cfg;
    size_t e = 0;
    e8kv_calib *cal = e8kv_calib_create(cfg->n_layer, cfg->n_head_kv, cfg->head_dim, &e);
    if (!cal) return fail(NULL, err, e);

    observe_state st = {cal, cfg->n_head, 0};
    /* exact values, keys handed to the hook before RoPE (what an e8t cache receives) */
    const e8kv_context_params cp = {.n_ctx = p->n_ctx,
                                    .n_batch = p->n_ctx,
                                    .kv_spec = cfg->rope_theta > 0.0f ? "f32,rope=pre" : "f32",
                                    .n_threads = p->n_threads,
                                    .kv_hook = observe_hook,
                                    .kv_hook_user = &st,
                                    .q_hook = observe_q_hook,
                                    .q_hook_user = &st};
    e8kv_context *ctx = e8kv_context_create(m, &cp, &e);
    if (!ctx) return fail(cal, err, e);
    for (size_t c = 0; c < n_chunks && !e8kv_is_error(e) && !e8kv_is_error(st.err); c++) {
        e8kv_context_reset(ctx);
        e = e8kv_context_eval(ctx, NULL, 0, tokens + c * p->n_ctx, p->n_ctx, p->n_ctx);
    }
    e8kv_context_free(ctx);
    if (e8kv_is_error(st.err)) return fail(cal, err, st.err);
    if (e8kv_is_error(e)) return fail(cal, err, e);
    e = e8kv_calib_finalize(cal);
    if (e8kv_is_error(e)) return fail(cal, err, e);

    return cal;
}

size_t e8kv_calibrate_sensitivity(const e8kv_model *m, const int32_t *tokens, size_t n_tokens, e8kv_calib *cal,
                                  const e8kv_sensitivity_params *p) {
    if (!m || !tokens || !cal || !p) return E8KV_ERR(BAD_ARGUMENT);
    const char *probe = p->probe ? p->probe : "e8tv:2";
    const char *colon = strchr(probe, ':');
    const double rate = colon ? strtod(colon + 1, NULL) : 0.0;
    if (!(rate > 0.0) || rate > 16.0 || strchr(probe, ',') || strchr(probe, '=')) return E8KV_ERR(BAD_ARGUMENT);
    const e8kv_model_config *cfg = &m->cfg;
    const size_t n_s = 2 * cfg->n_layer;
    /* each probe's spec in full, never cut: "f32,sink=S,rope=pre,layerL.k=PROBE" */
    const size_t spec_cap = strlen(probe) + 96;
    char *specs = calloc(n_s, spec_cap);
    const char **ptr = calloc(n_s, sizeof *ptr);
    e8kv_ppl_result *res = calloc(E8KV_PPL_MAX_SPECS, sizeof *res);
    size_t r = specs && ptr && res ? 0 : E8KV_ERR(OUT_OF_MEMORY);
    for (size_t i = 0; i < n_s && !r; i++) { /* K of every layer, then V, as the cache orders streams */
        const int w = snprintf(specs + i * spec_cap, spec_cap, "f32,sink=%zu%s,layer%zu.%c=%s", p->sink,
                               cfg->rope_theta > 0.0f ? ",rope=pre" : "", i % cfg->n_layer,
                               i < cfg->n_layer ? 'k' : 'v', probe);
        if (w < 0 || (size_t)w >= spec_cap) r = E8KV_ERR(SPEC);
        ptr[i] = specs + i * spec_cap;
    }
    for (size_t b = 0; b < n_s && !e8kv_is_error(r); b += E8KV_PPL_MAX_SPECS) {
        const size_t n = n_s - b < E8KV_PPL_MAX_SPECS ? n_s - b : E8KV_PPL_MAX_SPECS;
        const e8kv_ppl_params pp = {.n_ctx = p->n_ctx ? p->n_ctx : 512,
                                    .n_chunks = p->n_chunks ? p->n_chunks : 1,
                                    .n_threads = p->n_threads,
                                    .specs = ptr + b,
                                    .n_specs = n,
                                    .calib = cal};
        memset(res, 0, E8KV_PPL_MAX_SPECS * sizeof *res);
        r = e8kv_ppl_run(m, tokens, n_tokens, &pp, res);
        for (size_t i = 0; i < n && !e8kv_is_error(r); i++) {
            if (res[i].status) {
                r = res[i].status;
                break;
            }
            const size_t s = b + i;
            const double kld = res[i].kld > 0.0 ? res[i].kld : 0.0;
            r = e8kv_calib_set_sensitivity(cal, s % cfg->n_layer, s >= cfg->n_layer, kld * pow(4.0, rate));
        }
        if (p->progress && !e8kv_is_error(r)) p->progress(p->progress_user, b + n, n_s);
    }
    free(specs);
    free(ptr);
    free(res);
    return e8kv_is_error(r) ? r : 0;
}
