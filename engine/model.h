/* A Llama-family model in memory (weights dequantized to float at load) and its forward pass.
 * Loaders: GGUF (gguf.c) and llama2.c checkpoints (llama2c.c). The KV cache is an e8kv_cache (public
 * API), so any format plugs in without touching the forward pass. */
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
} e8kv_model_config;

typedef struct {
    float *attn_norm;        /* (dim) */
    float *wq;               /* (n_head * head_dim, dim): row-major, out x in */
    float *wk, *wv;          /* (n_head_kv * head_dim, dim) */
    float *bq, *bk, *bv;     /* biases (Qwen2) or NULL */
    float *wo;               /* (dim, n_head * head_dim) */
    float *ffn_norm;         /* (dim) */
    float *w_gate, *w_up;    /* (hidden_dim, dim) */
    float *w_down;           /* (dim, hidden_dim) */
} e8kv_layer_weights;

typedef struct e8kv_model {
    e8kv_model_config cfg;
    float *tok_embd;             /* (vocab_size, dim) */
    float *out_norm;             /* (dim) */
    float *output;               /* (vocab_size, dim); equals tok_embd when tied */
    e8kv_layer_weights *layers;  /* n_layer */
    e8kv_tokenizer *tokenizer;
    void *owned;                 /* loader-owned allocations, released by e8kv_model_free */
} e8kv_model;

#endif
