/* A Llama-family model in memory (weights dequantized to float at load) and its forward pass.
 * Loaders: GGUF (model.c, through gguf.h) and llama2.c checkpoints (llama2c.c). The KV cache is an
 * e8kv_cache (public API), so any format plugs in without touching the forward pass: every token's K and
 * V are appended to the cache (and so pass through its codec) before any attention reads them. */
#ifndef E8KV_MODEL_H
#define E8KV_MODEL_H

#include "e8kv.h"
#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    E8KV_ROPE_INTERLEAVED = 0, /* rotate pairs (x[2i], x[2i+1]): llama.cpp "norm", llama2.c */
    E8KV_ROPE_SPLIT_HALF = 1   /* rotate (x[i], x[i + d/2]): llama.cpp "neox", HF Llama/Qwen2 */
} e8kv_rope_layout;

typedef struct {
    char arch[32];
    size_t n_layer, dim, n_head, n_head_kv, head_dim, hidden_dim, vocab_size, n_ctx_train;
    float rope_theta, norm_eps;
    e8kv_rope_layout rope_layout;
    /* A scaled RoPE (GGUF rope.scaling.type linear, rope_freqs.weight): pair i of a head vector at position
     * p turns by p·rope_freqs[i] instead of p·rope_theta^(-2i/head_dim). The engine's RoPE and the cache
     * (e8kv_cache_params.rope_freqs) take these same floats. 0: unscaled, rope_freqs unused. */
    int has_rope_freqs;
    float rope_freqs[E8KV_MAX_HEAD_DIM / 2]; /* (head_dim / 2) when has_rope_freqs */
    int add_bos; /* the vocabulary wants BOS in front of a text (llama.cpp's add_bos_token) */
} e8kv_model_config;

typedef struct {
    float *attn_norm;     /* (dim) */
    float *wq;            /* (n_head * head_dim, dim): row-major, out x in */
    float *wk, *wv;       /* (n_head_kv * head_dim, dim) */
    float *bq, *bk, *bv;  /* biases (Qwen2) or NULL */
    float *wo;            /* (dim, n_head * head_dim) */
    float *ffn_norm;      /* (dim) */
    float *w_gate, *w_up; /* (hidden_dim, dim) */
    float *w_down;        /* (dim, hidden_dim) */
} e8kv_layer_weights;

typedef struct e8kv_model {
    e8kv_model_config cfg;
    float *tok_embd;            /* (vocab_size, dim) */
    float *out_norm;            /* (dim) */
    float *output;              /* (vocab_size, dim); equals tok_embd when tied */
    e8kv_layer_weights *layers; /* n_layer */
    e8kv_tokenizer *tokenizer;
    void *owned; /* an e8kv_model_storage, released by e8kv_model_free */
} e8kv_model;

/* Loader-owned storage (internal to the loaders): every weight in one float arena and, while loading a
 * GGUF, the open file. */
typedef struct {
    float *arena;
    e8kv_gguf *gguf;
} e8kv_model_storage;

/* ---------------------------------------------------------------- loading
 * All loaders return 0 or an error; on error *out is NULL and, when msg is not NULL, msg holds a
 * human-readable reason (e.g. the unsupported architecture's name). */

/* GGUF (general.architecture llama, mistral or qwen2). RoPE scaling: rope.scaling.type none or linear
 * (rope.scaling.factor) and the rope_freqs.weight factors (Llama 3.1); other types (yarn, longrope ...) and
 * rope.scaling.attn_factor != 1 are refused. Errors: those of e8kv_gguf_open, and
 * E8KV_ERROR_UNSUPPORTED (architecture, tensor type, RoPE scaling), E8KV_ERROR_CORRUPTED (missing key or
 * tensor, invalid scaling factor or rope_freqs), E8KV_ERROR_DIMENSION (a tensor's shape disagrees with the
 * config), E8KV_ERROR_OUT_OF_MEMORY. */
size_t e8kv_model_load_gguf(e8kv_model **out, const char *path, char *msg, size_t msg_capacity);
/* llama2.c checkpoint (legacy v0 header of 7 int32) plus its tokenizer.bin (NULL: no tokenizer).
 * Errors: E8KV_ERROR_IO, _TRUNCATED / _CORRUPTED (sizes disagree with the header), _OUT_OF_MEMORY. */
size_t e8kv_model_load_llama2c(e8kv_model **out, const char *ckpt_path, const char *tokenizer_path, char *msg,
                               size_t msg_capacity);
/* By content: GGUF magic -> GGUF, otherwise llama2.c with tokenizer `tok512.bin`/`tokenizer.bin` next
 * to the checkpoint when present. */
size_t e8kv_model_load(e8kv_model **out, const char *path, char *msg, size_t msg_capacity);
void e8kv_model_free(e8kv_model *m);

/* The default model scripts/fetch_model.sh caches: $E8KV_MODEL, else $E8KV_CACHE_DIR/NAME, else
 * ~/.cache/e8kv/NAME. Returns the path's length or E8KV_ERROR_DST_TOO_SMALL. Does not check it exists. */
#define E8KV_DEFAULT_MODEL_NAME "SmolLM2-135M-Instruct.Q4_1.gguf"
size_t e8kv_model_default_path(char *dst, size_t capacity);

/* ---------------------------------------------------------------- inference context */
typedef struct e8kv_context e8kv_context;

/* Called after each layer's K and V of a batch are computed (K after RoPE, or before it when the cache
 * spec says rope=pre), before they are appended:
 * k, v are (n_tok, n_head_kv * head_dim) of positions pos0 .. pos0 + n_tok - 1. Used by --dump-kv. */
typedef void (*e8kv_kv_hook)(void *user, size_t layer, const float *k, const float *v, size_t n_tok,
                             size_t pos0);
/* Called with each layer's queries of a batch before RoPE, q (n_tok, n_head * head_dim) of positions
 * pos0 .. pos0 + n_tok - 1, before the keys' hook. Used by calibration (e8kv_calib_observe_q). */
typedef void (*e8kv_q_hook)(void *user, size_t layer, const float *q, size_t n_tok, size_t pos0);

/* The most threads a context (and ppl, calibration) uses: a larger n_threads is BAD_ARGUMENT. */
#define E8KV_MAX_THREADS 64

typedef struct {
    size_t n_ctx;         /* cache capacity in tokens (<= cfg.n_ctx_train when known) */
    size_t n_batch;       /* most tokens per forward step; longer inputs are split (0 = n_ctx) */
    const char *kv_spec;  /* e8kv_cache spec: "f32", "q4_0h", "k=SPEC,v=SPEC" ... (NULL = f32) */
    uint64_t seed;        /* the cache's rotation seed */
    int n_threads;        /* 0 = number of online CPUs (at most E8KV_MAX_THREADS); 1 .. E8KV_MAX_THREADS;
                             the results are the same bits at any count */
    e8kv_kv_hook kv_hook; /* optional */
    void *kv_hook_user;
    e8kv_q_hook q_hook; /* optional */
    void *q_hook_user;
    const e8kv_calib *calib; /* calibration for e8t formats (must outlive the context), or NULL */
} e8kv_context_params;

/* NULL on failure with *err set: E8KV_ERROR_BAD_ARGUMENT (also n_threads < 0 or > E8KV_MAX_THREADS),
 * E8KV_ERROR_CONTEXT_FULL (n_ctx above the model's trained context), the cache's errors
 * (E8KV_ERROR_SPEC, _HEAD_DIM ...), E8KV_ERROR_OUT_OF_MEMORY. */
e8kv_context *e8kv_context_create(const e8kv_model *m, const e8kv_context_params *p, size_t *err);
void e8kv_context_free(e8kv_context *c);
/* Empty the cache; the next token is at position 0. */
void e8kv_context_reset(e8kv_context *c);
size_t e8kv_context_pos(const e8kv_context *c);
const e8kv_cache *e8kv_context_cache(const e8kv_context *c);
/* Replace the cache's contents by a saved cache (e8kv_cache_load_into: same dims, spec and seed, n_ctx large
 * enough, else its error) whose layers all hold the same number of tokens (else E8KV_ERROR_CORRUPTED), and
 * continue at the position after them. Returns the new position; after an error the context is empty. */
size_t e8kv_context_load_cache(e8kv_context *c, const void *src, size_t src_size);

/* Run n_tok tokens at positions pos .. pos + n_tok - 1 (pos = tokens already evaluated) and advance.
 * Logits of the tokens with index >= logits_from are written to `logits`, row-major
 * ((n_tok - logits_from), vocab_size); pass logits_from = n_tok (and logits NULL) for none.
 * Returns the new position or an error: E8KV_ERROR_CONTEXT_FULL, _BAD_ARGUMENT (token id out of range,
 * logits_from > n_tok), _DST_TOO_SMALL, and the cache's errors (e.g. E8KV_ERROR_NONFINITE); after an
 * error the context is back at its position before the call. */
size_t e8kv_context_eval(e8kv_context *c, float *logits, size_t logits_capacity, const int32_t *tokens,
                         size_t n_tok, size_t logits_from);

#endif
