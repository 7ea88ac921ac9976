/* Model calibration for the e8t formats (calibrate.h). Public API only: a context with an exact f32 cache
 * that wants keys before RoPE, whose K/V hook feeds e8kv_calib_observe. */
#include "calibrate.h"

#include <stdlib.h>

#define ERR(name) ((size_t) - (ptrdiff_t)E8KV_ERROR_##name)

typedef struct {
    e8kv_calib *cal;
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

static e8kv_calib *fail(e8kv_calib *cal, size_t *err, size_t code) {
    e8kv_calib_free(cal);
    if (err) *err = code;
    return NULL;
}

e8kv_calib *e8kv_calibrate_model(const e8kv_model *m, const int32_t *tokens, size_t n_tokens,
                                 const e8kv_calibrate_params *p, size_t *err) {
    if (err) *err = 0;
    if (!m || !tokens || !p || p->n_ctx < 16) return fail(NULL, err, ERR(BAD_ARGUMENT));
    if (p->n_ctx > m->cfg.n_ctx_train && m->cfg.n_ctx_train) return fail(NULL, err, ERR(CONTEXT_FULL));
    const size_t n_all = n_tokens / p->n_ctx;
    if (n_all == 0) return fail(NULL, err, ERR(SRC_SIZE));
    const size_t n_chunks = p->n_chunks && p->n_chunks < n_all ? p->n_chunks : n_all;
    const e8kv_model_config *cfg = &m->cfg;
    size_t e = 0;
    e8kv_calib *cal = e8kv_calib_create(cfg->n_layer, cfg->n_head_kv, cfg->head_dim, &e);
    if (!cal) return fail(NULL, err, e);

    observe_state st = {cal, 0};
    /* exact values, keys handed to the hook before RoPE (what an e8t cache receives) */
    const e8kv_context_params cp = {.n_ctx = p->n_ctx,
                                    .n_batch = p->n_ctx,
                                    .kv_spec = cfg->rope_theta > 0.0f ? "f32,rope=pre" : "f32",
                                    .n_threads = p->n_threads,
                                    .kv_hook = observe_hook,
                                    .kv_hook_user = &st};
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
