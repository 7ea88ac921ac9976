/* Calibration of a model for the e8t cache formats (transform coding): run the model with an exact cache
 * over calibration text and hand every layer's K (before RoPE) and V of each chunk to e8kv_calib_observe
 * (one chunk = one sequence, centred by its own mean like a cache), then finalize (eigenbases). */
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

#endif
