/* Perplexity, KL divergence and top-1 agreement of KV-cache formats, by llama.cpp's llama-perplexity
 * protocol: the text is tokenized once and cut into chunks of n_ctx tokens; each chunk is evaluated from
 * an empty cache (its first token replaced by BOS when the vocabulary adds BOS) and only the second half
 * is scored: the logits at positions n_ctx/2 .. n_ctx-2 predict tokens n_ctx/2+1 .. n_ctx-1.
 * Every chunk runs first with an f32 cache (the baseline); its log-softmax over the scored positions is
 * kept and each requested format is then run on the same chunk and compared with it.
 *
 * Prefix mode (prefix > 0, the protocol of eviction): each chunk is prefix + score tokens; a format's run
 * prefills the prefix, then compresses its cache (e8kv_cache_evict with the prefix's queries, when the
 * spec evicts), then evaluates the score tokens, which attend to the compressed prefix; the logits of
 * positions prefix .. prefix + score - 2 are scored (score - 1 tokens per chunk). The compression is
 * measured right after the eviction: f16 bytes of the prefix's K and V / e8kv_cache_bytes. */
#ifndef E8KV_PPL_H
#define E8KV_PPL_H

#include "model.h"

#include <stddef.h>
#include <stdint.h>

#define E8KV_PPL_MAX_SPECS 32

typedef struct {
    const char *spec; /* p->specs[i] itself (borrowed, never copied or cut); "f32" for the baseline */
    size_t status; /* 0, or the error that made the format unavailable (context creation) */
    size_t count;  /* scored tokens so far */
    double sum_nll, sum_nll2;
    double sum_kld, sum_kld2;
    size_t n_same_top1;
    double seconds; /* wall time of this format's forward passes */
    /* derived by e8kv_ppl_finish (also kept current after each chunk) */
    double ppl, ppl_se;    /* exp(mean NLL), and its std error as llama.cpp: ppl * sd(NLL)/sqrt(n-1) */
    double kld, kld_se;    /* mean KL(base || this) in nats per token, and its std error */
    double top1, top1_se;  /* fraction of positions whose argmax equals the baseline's */
    double bits_per_value; /* e8kv_cache_bits_per_value */
    size_t kv_bytes;       /* e8kv_cache_bytes with the cache holding a full chunk of n_ctx tokens */
    double eff_bits_per_value; /* 8 * kv_bytes / (K and V values of that chunk): everything allocated
                                * counted (exact window and sink tokens, means, page tables) */
    double tokens_per_s;   /* chunk tokens evaluated per second of forward passes */
    double compression;    /* prefix mode: f16 bytes of the prefix / bytes held after compressing it */
    size_t n_kept;         /* prefix mode: tokens layer 0 keeps after the eviction (last chunk) */
} e8kv_ppl_result;

typedef void (*e8kv_ppl_progress)(void *user, size_t chunk, size_t n_chunk, const e8kv_ppl_result *res,
                                  size_t n_res);

typedef struct {
    size_t n_ctx;               /* chunk length, even, >= 4 (ignored in prefix mode) */
    size_t prefix, score;       /* prefix mode when prefix > 0: chunks of prefix + score (>= 2) tokens */
    size_t n_chunks;            /* 0 = every complete chunk of the text */
    int n_threads;              /* 0 = number of online CPUs */
    uint64_t seed;              /* rotation seed of the caches */
    const char *const *specs;   /* formats to compare with the f32 baseline; "f32" reuses the baseline */
    size_t n_specs;             /* 1 .. E8KV_PPL_MAX_SPECS */
    e8kv_ppl_progress progress; /* optional: called after each chunk */
    void *progress_user;
    e8kv_kv_hook dump_hook; /* optional: receives the baseline's K/V of the first chunk */
    void *dump_user;
    e8kv_ppl_result *baseline; /* optional: receives the f32 baseline's own figures */
    const e8kv_calib *calib;   /* optional: calibration for e8t formats */
} e8kv_ppl_params;

/* Runs the whole protocol; results[i] belongs to specs[i] (a format whose context cannot be created is
 * skipped with results[i].status set and the run goes on). Returns the number of chunks evaluated or an
 * error: E8KV_ERROR_BAD_ARGUMENT (n_ctx odd or < 4, no specs), E8KV_ERROR_SRC_SIZE (fewer tokens than
 * one chunk, empty text), E8KV_ERROR_CONTEXT_FULL (n_ctx above the model's training context),
 * E8KV_ERROR_OUT_OF_MEMORY, or a forward-pass error. */
size_t e8kv_ppl_run(const e8kv_model *m, const int32_t *tokens, size_t n_tokens, const e8kv_ppl_params *p,
                    e8kv_ppl_result *results);

/* The queries of a prefill (before RoPE), for the eviction scorers that need them (snapkv, h2o): pass
 * e8kv_qcap_hook and the capture as the context's q_hook / q_hook_user, set `active` around the prefill,
 * then e8kv_qcap_evict. The capture holds up to n_pos positions per layer; a prefill may be shorter. */
typedef struct {
    float *q; /* (n_layer, n_pos, q_dim) */
    size_t n_layer, n_pos, q_dim;
    int active;
} e8kv_qcap;

/* 0 or E8KV_ERROR_OUT_OF_MEMORY. */
size_t e8kv_qcap_init(e8kv_qcap *qc, const e8kv_model *m, size_t n_pos);
void e8kv_qcap_free(e8kv_qcap *qc);
void e8kv_qcap_hook(void *user, size_t layer, const float *q, size_t n_tok, size_t pos0);
/* e8kv_cache_evict with the captured queries of positions 0 .. n_q - 1 (n_q <= n_pos), laid out as it
 * wants them ((n_layer, n_q, q_dim): the layers are moved together in place when n_q < n_pos, so the
 * capture is spent until the next prefill fills it again). Returns what e8kv_cache_evict returns
 * (E8KV_ERROR_BAD_ARGUMENT when the spec does not evict); n_q > n_pos is BAD_ARGUMENT. */
size_t e8kv_qcap_evict(e8kv_qcap *qc, e8kv_cache *kv, size_t n_head, size_t n_q);

/* Log-softmax of one row of n logits (double accumulation); returns the index of the largest logit. */
size_t e8kv_log_softmax(float *dst, const float *logits, size_t n);

#endif
