/* Calibration of a model for the e8t cache formats (transform coding): run the model with an exact cache
 * over calibration text and hand every layer's K (before RoPE) and V of each chunk to e8kv_calib_observe
 * (one chunk = one sequence, centred by its own mean like a cache) and its queries (before RoPE) to
 * e8kv_calib_observe_q (the score weights of e8t and e8tv keys), then finalize (eigenbases). */
#ifndef E8KV_CALIBRATE_H
#define E8KV_CALIBRATE_H

#include "model.h"

typedef struct {
    size_t n_ctx;    /* tokens per chunk (each chunk is one sequence), >= 16 */
    size_t n_chunks; /* chunks observed (0 = every complete chunk) */
    int n_threads;   /* 0 = number of online CPUs */
} e8kv_calibrate_params;

/* Returns a finalized calibration or NULL with *err: E8KV_ERROR_BAD_ARGUMENT, E8KV_ERROR_SRC_SIZE (fewer
 * tokens than one chunk), E8KV_ERROR_CONTEXT_FULL (n_ctx above the model's context), a forward-pass or
 * cache error, E8KV_ERROR_OUT_OF_MEMORY. */
e8kv_calib *e8kv_calibrate_model(const e8kv_model *m, const int32_t *tokens, size_t n_tokens,
                                 const e8kv_calibrate_params *p, size_t *err);

/* Sensitivities for auto= allocation (e8kv_calib_set_sensitivity): every stream (layer, K or V) is
 * coded alone with `probe` (e.g. "e8tv:2", a family:rate spec), every other stream exact, with sink
 * exact first positions; the mean KLD against the exact run over n_chunks chunks of n_ctx tokens
 * (llama-perplexity protocol, engine/ppl.h) gives c = KLD · 4^rate. Probes run 32 at a time. */
typedef struct {
    size_t n_ctx, n_chunks; /* 0: the calibration's chunk length; 1 chunk */
    const char *probe;      /* NULL: "e8tv:2" */
    size_t sink;            /* exact first positions in the probes (the presets keep 1) */
    int n_threads;
    void (*progress)(void *user, size_t done, size_t total); /* optional, after each batch */
    void *progress_user;
} e8kv_sensitivity_params;

/* 0, or an error: BAD_ARGUMENT (probe not FAMILY:RATE), a ppl error, the first probe format's error. */
size_t e8kv_calibrate_sensitivity(const e8kv_model *m, const int32_t *tokens, size_t n_tokens, e8kv_calib *cal,
                                  const e8kv_sensitivity_params *p);

#endif
