/* Llama-family forward pass over a compressed KV cache, and the GGUF model loader.
 *
 * Read top to bottom like llama2.c's run.c, with batches: for n_tok tokens x (n_tok, dim),
 *   per layer:  h = RMSNorm(x) * w_attn_norm
 *               q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)       (cblas_sgemm)
 *               q, k = RoPE(q, k) at their positions                       (interleaved or split-half)
 *               cache <- (k, v)                                            (through the cache's codec)
 *               a = softmax(q K^T / sqrt(head_dim)) V over the cache       (e8kv_cache_attend, GQA)
 *               x += a Wo^T
 *               h = RMSNorm(x) * w_ffn_norm
 *               x += (silu(h Wgate^T) * (h Wup^T)) Wdown^T                 (SwiGLU)
 *   logits = RMSNorm(x) * w_out_norm  Wout^T                               (Wout = token_embd when tied)
 * Threads: one pool (e8kv_pool) per context runs every parallel part, the matrix products (row x token
 * blocks), SwiGLU and the cache's attention, in pieces that do not depend on the thread count, so any
 * thread count gives the same logits as one thread, bit for bit.
 * References: llama2.c run.c (Karpathy), llama.cpp's llama graph and its GGUF tensor names. */
#include "model.h"

#include "gguf.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void set_msg(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_msg(char *msg, size_t cap, const char *fmt, ...) {
    if (!msg || cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
}

void e8kv_model_free(e8kv_model *m) {
    if (!m) return;
    e8kv_model_storage *o = m->owned;
    if (o) {
        free(o->arena);
        e8kv_gguf_close(o->gguf);
        free(o);
    }
    e8kv_tokenizer_free(m->tokenizer);
    free(m->layers);
    free(m);
}

/* ---------------------------------------------------------------- GGUF loader */

/* Dequantize tensor `name` into dst after checking its shape is (rows, cols) with ne[0] = cols
 * (dst NULL: the check alone). */
static size_t load_tensor(float *dst, const e8kv_gguf *g, const char *name, size_t rows, size_t cols,
                          char *msg, size_t cap) {
    const e8kv_gguf_tensor *t = e8kv_gguf_find_tensor(g, name);
    if (!t) {
        set_msg(msg, cap, "tensor '%s' missing", name);
        return E8KV_ERR(CORRUPTED);
    }
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
        set_msg(msg, cap, "tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%zu, %zu]", name,
                (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                (unsigned long long)t->ne[3], cols, rows);
        return E8KV_ERR(DIMENSION);
    }
    if (!dst) return 0; /* shape check only */
    const size_t r = e8kv_gguf_tensor_to_f32(dst, rows * cols, t);
    if (e8kv_is_error(r)) {
        set_msg(msg, cap, "tensor '%s' (ggml type %u): %s", name, (unsigned)t->type, e8kv_error_name(r));
        return r;
    }
    return 0;
}

static size_t get_u64(const e8kv_gguf *g, const char *arch, const char *suffix, size_t *out, char *msg,
                      size_t cap) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint64_t v = 0;
    if (e8kv_is_error(e8kv_gguf_get_u64(g, key, &v)) || v == 0 || v > (1u << 30)) {
        set_msg(msg, cap, "metadata key '%s' missing or invalid", key);
        return E8KV_ERR(CORRUPTED);
    }
    *out = (size_t)v;
    return 0;
}

/* RoPE scaling as llama.cpp reads it from a GGUF, folded into per-pair frequencies (rope_theta stays):
 *   {arch}.rope.scaling.type    "none", or "linear" (position interpolation: every frequency / factor);
 *                               llama.cpp takes an absent type as linear, so a lone factor scales too
 *   {arch}.rope.scaling.factor  (older files: {arch}.rope.scale_linear); absent or 0 without a type: none
 *   rope_freqs.weight           F32 (head_dim/2) "freq factors" (Llama 3.1's rope_type llama3, whatever the
 *                               type): ggml_rope_ext divides pair i's frequency by factor i
 * f_i = theta^(-2i/head_dim) / factor / ff_i in double, kept as float so that the engine's RoPE and the
 * cache's turn by the same values. yarn and longrope also scale cos/sin or switch factors with the context
 * length, attn_factor scales cos/sin: refused rather than run with wrong logits. */
static size_t load_rope_scaling(e8kv_model_config *cfg, const e8kv_gguf *g, char *msg, size_t cap) {
    const char *a = cfg->arch;
    char key[128];
    const char *type = NULL;
    size_t type_len = 0;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    const int has_type = e8kv_gguf_find(g, key) >= 0;
    if (has_type && e8kv_is_error(e8kv_gguf_get_str(g, key, &type, &type_len))) {
        set_msg(msg, cap, "metadata key '%s' is not a string", key);
        return E8KV_ERR(CORRUPTED);
    }
    float factor = 0.0f;
    int has_factor = 0;
    static const char *const factor_keys[] = {"rope.scaling.factor", "rope.scale_linear"};
    for (size_t i = 0; i < 2 && !has_factor; i++) {
        snprintf(key, sizeof key, "%s.%s", a, factor_keys[i]);
        if (e8kv_gguf_find(g, key) < 0) continue;
        if (e8kv_is_error(e8kv_gguf_get_f32(g, key, &factor))) {
            set_msg(msg, cap, "metadata key '%s' is not a number", key);
            return E8KV_ERR(CORRUPTED);
        }
        has_factor = 1;
    }
    int linear;
    if (!has_type) {
        linear = has_factor && factor != 0.0f; /* NaN and negatives included: refused below */
    } else if (type_len == 4 && !memcmp(type, "none", 4)) {
        linear = 0; /* llama.cpp never scales with type none, whatever the factor */
    } else if (type_len == 6 && !memcmp(type, "linear", 6)) {
        linear = 1;
    } else {
        set_msg(msg, cap,
                "rope scaling type '%.*s' is not supported (supported: none, linear, and rope_freqs factors)",
                (int)(type_len < 64 ? type_len : 64), type);
        return E8KV_ERR(UNSUPPORTED);
    }
    if (linear && !has_factor) {
        set_msg(msg, cap, "rope scaling 'linear' without %s.rope.scaling.factor", a);
        return E8KV_ERR(CORRUPTED);
    }
    if (linear && !(factor > 0.0f && isfinite(factor))) {
        set_msg(msg, cap, "rope scaling factor %g is not finite and > 0", (double)factor);
        return E8KV_ERR(CORRUPTED);
    }
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", a);
    float attn_factor = 1.0f;
    if (e8kv_gguf_find(g, key) >= 0 &&
        (e8kv_is_error(e8kv_gguf_get_f32(g, key, &attn_factor)) || attn_factor != 1.0f)) {
        set_msg(msg, cap, "metadata key '%s' (%g) is not supported (only 1)", key, (double)attn_factor);
        return E8KV_ERR(UNSUPPORTED);
    }
    const e8kv_gguf_tensor *t = e8kv_gguf_find_tensor(g, "rope_freqs.weight");
    if (!t && !(linear && factor != 1.0f)) return 0; /* unscaled: rope_theta alone, as before */

    const size_t hd = cfg->head_dim, half = hd / 2;
    if (half > sizeof cfg->rope_freqs / sizeof cfg->rope_freqs[0]) {
        set_msg(msg, cap, "head_dim %zu above %d (unsupported)", hd, E8KV_MAX_HEAD_DIM);
        return E8KV_ERR(UNSUPPORTED);
    }
    float ff[E8KV_MAX_HEAD_DIM / 2];
    for (size_t i = 0; i < half; i++)
        ff[i] = 1.0f;
    if (t) {
        if (t->type != E8KV_GGML_F32 || t->ne[0] != half || t->n_elements != half) {
            set_msg(msg, cap,
                    "tensor 'rope_freqs.weight' must be F32 of head_dim/2 = %zu values (ggml type %u, %llu "
                    "values)",
                    half, (unsigned)t->type, (unsigned long long)t->n_elements);
            return E8KV_ERR(CORRUPTED);
        }
        const size_t r = e8kv_gguf_tensor_to_f32(ff, half, t);
        if (e8kv_is_error(r)) {
            set_msg(msg, cap, "tensor 'rope_freqs.weight': %s", e8kv_error_name(r));
            return r;
        }
        for (size_t i = 0; i < half; i++) {
            if (!(ff[i] > 0.0f) || !isfinite(ff[i])) {
                set_msg(msg, cap, "tensor 'rope_freqs.weight' [%zu] = %g, not finite and > 0", i,
                        (double)ff[i]);
                return E8KV_ERR(CORRUPTED);
            }
        }
    }
    const double scale = linear ? (double)factor : 1.0;
    for (size_t i = 0; i < half; i++) {
        const double f = pow((double)cfg->rope_theta, -2.0 * (double)i / (double)hd) / scale / (double)ff[i];
        cfg->rope_freqs[i] = (float)f;
        if (!isfinite(cfg->rope_freqs[i])) { /* a tiny theta over tiny factors */
            set_msg(msg, cap, "RoPE frequency %zu (%g) beyond float range", i, f);
            return E8KV_ERR(CORRUPTED);
        }
    }
    cfg->has_rope_freqs = 1;
    return 0;
}

static size_t load_gguf_model(e8kv_model *m, e8kv_gguf *g, char *msg, size_t cap) {
    e8kv_model_config *cfg = &m->cfg;
    const char *s = NULL;
    size_t len = 0;
    if (e8kv_is_error(e8kv_gguf_get_str(g, "general.architecture", &s, &len))) {
        set_msg(msg, cap, "metadata key 'general.architecture' missing");
        return E8KV_ERR(CORRUPTED);
    }
    if (len >= sizeof cfg->arch) len = sizeof cfg->arch - 1;
    memcpy(cfg->arch, s, len);
    cfg->arch[len] = 0;
    if (!strcmp(cfg->arch, "llama") || !strcmp(cfg->arch, "mistral")) {
        /* llama.cpp's converter permutes Wq/Wk back to Meta's interleaved-pair RoPE layout */
        cfg->rope_layout = E8KV_ROPE_INTERLEAVED;
    } else if (!strcmp(cfg->arch, "qwen2")) {
        cfg->rope_layout = E8KV_ROPE_SPLIT_HALF;
    } else {
        set_msg(msg, cap, "unsupported architecture '%s' (supported: llama, mistral, qwen2)", cfg->arch);
        return E8KV_ERR(UNSUPPORTED);
    }
    const char *a = cfg->arch;
    size_t r;
    if (e8kv_is_error(r = get_u64(g, a, "block_count", &cfg->n_layer, msg, cap))) return r;
    if (e8kv_is_error(r = get_u64(g, a, "embedding_length", &cfg->dim, msg, cap))) return r;
    if (e8kv_is_error(r = get_u64(g, a, "feed_forward_length", &cfg->hidden_dim, msg, cap))) return r;
    if (e8kv_is_error(r = get_u64(g, a, "attention.head_count", &cfg->n_head, msg, cap))) return r;
    if (e8kv_is_error(r = get_u64(g, a, "context_length", &cfg->n_ctx_train, msg, cap))) return r;
    char key[128];
    uint64_t u = 0;
    snprintf(key, sizeof key, "%s.attention.head_count_kv", a);
    cfg->n_head_kv = e8kv_is_error(e8kv_gguf_get_u64(g, key, &u)) ? cfg->n_head : (size_t)u;
    if (cfg->n_head_kv == 0 || cfg->n_head % cfg->n_head_kv || cfg->dim % cfg->n_head) {
        set_msg(msg, cap, "head counts %zu/%zu do not divide dim %zu", cfg->n_head, cfg->n_head_kv, cfg->dim);
        return E8KV_ERR(DIMENSION);
    }
    cfg->head_dim = cfg->dim / cfg->n_head;
    snprintf(key, sizeof key, "%s.attention.key_length", a);
    if (!e8kv_is_error(e8kv_gguf_get_u64(g, key, &u)) && u != cfg->head_dim) {
        set_msg(msg, cap, "key_length %llu != dim / n_head = %zu (unsupported)", (unsigned long long)u,
                cfg->head_dim);
        return E8KV_ERR(UNSUPPORTED);
    }
    if (cfg->head_dim % 2) {
        set_msg(msg, cap, "odd head_dim %zu", cfg->head_dim);
        return E8KV_ERR(DIMENSION);
    }
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    if (e8kv_is_error(e8kv_gguf_get_f32(g, key, &cfg->rope_theta))) cfg->rope_theta = 10000.0f;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if (e8kv_is_error(e8kv_gguf_get_f32(g, key, &cfg->norm_eps))) {
        set_msg(msg, cap, "metadata key '%s' missing", key);
        return E8KV_ERR(CORRUPTED);
    }
    if (!(cfg->rope_theta > 0.0f) || !(cfg->norm_eps >= 0.0f) || !isfinite(cfg->norm_eps) ||
        !isfinite(cfg->rope_theta)) {
        set_msg(msg, cap, "invalid rope.freq_base or rms epsilon");
        return E8KV_ERR(CORRUPTED);
    }
    if (e8kv_is_error(r = load_rope_scaling(cfg, g, msg, cap))) return r;
    e8kv_gguf_type et;
    uint64_t n_vocab = 0;
    if (e8kv_is_error(e8kv_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_vocab)) || n_vocab == 0 ||
        n_vocab > (1u << 24)) {
        set_msg(msg, cap, "token list 'tokenizer.ggml.tokens' missing or invalid");
        return E8KV_ERR(CORRUPTED);
    }
    cfg->vocab_size = (size_t)n_vocab;
    int add_bos = 0;
    if (e8kv_is_error(e8kv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos))) {
        /* llama.cpp's default: SentencePiece vocabularies add BOS, GPT-2 BPE ones do not */
        add_bos = !e8kv_is_error(e8kv_gguf_get_str(g, "tokenizer.ggml.model", &s, &len)) && len == 5 &&
                  !memcmp(s, "llama", 5);
    }
    cfg->add_bos = add_bos != 0;

    const size_t dim = cfg->dim, q_dim = cfg->n_head * cfg->head_dim;
    const size_t kv_dim = cfg->n_head_kv * cfg->head_dim, hid = cfg->hidden_dim, nv = cfg->vocab_size;
    const int tied = e8kv_gguf_find_tensor(g, "output.weight") == NULL;
    const int bias = e8kv_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    const size_t per_layer = 2 * dim + q_dim * dim + 2 * kv_dim * dim + dim * q_dim + 3 * hid * dim +
                             (bias ? q_dim + 2 * kv_dim : 0);
    const size_t n_float = nv * dim * (tied ? 1 : 2) + dim + cfg->n_layer * per_layer;
    e8kv_model_storage *o = m->owned;
    m->layers = calloc(cfg->n_layer, sizeof *m->layers);
    if (!m->layers) return E8KV_ERR(OUT_OF_MEMORY);
    /* pass 0 checks every tensor's presence and shape, so that the arena's size is backed by tensors
     * really in the file (no allocation from metadata alone); pass 1 allocates and dequantizes */
    float *p = NULL;
#define TAKE(n) (pass ? (p += (n), p - (n)) : NULL)
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            o->arena = malloc(n_float * sizeof(float));
            if (!o->arena) {
                set_msg(msg, cap, "out of memory for %zu MB of weights", n_float * 4 >> 20);
                return E8KV_ERR(OUT_OF_MEMORY);
            }
            p = o->arena;
        }
        m->tok_embd = TAKE(nv * dim);
        m->out_norm = TAKE(dim);
        m->output = tied ? m->tok_embd : TAKE(nv * dim);
        if (e8kv_is_error(r = load_tensor(m->tok_embd, g, "token_embd.weight", nv, dim, msg, cap))) return r;
        if (e8kv_is_error(r = load_tensor(m->out_norm, g, "output_norm.weight", 1, dim, msg, cap))) return r;
        if (!tied && e8kv_is_error(r = load_tensor(m->output, g, "output.weight", nv, dim, msg, cap)))
            return r;
        for (size_t l = 0; l < cfg->n_layer; l++) {
            e8kv_layer_weights *w = &m->layers[l];
            struct {
                float **dst;
                const char *name;
                size_t rows, cols;
            } spec[] = {
                {&w->attn_norm, "attn_norm.weight", 1, dim}, {&w->wq, "attn_q.weight", q_dim, dim},
                {&w->wk, "attn_k.weight", kv_dim, dim},      {&w->wv, "attn_v.weight", kv_dim, dim},
                {&w->wo, "attn_output.weight", dim, q_dim},  {&w->ffn_norm, "ffn_norm.weight", 1, dim},
                {&w->w_gate, "ffn_gate.weight", hid, dim},   {&w->w_up, "ffn_up.weight", hid, dim},
                {&w->w_down, "ffn_down.weight", dim, hid},   {&w->bq, "attn_q.bias", 1, q_dim},
                {&w->bk, "attn_k.bias", 1, kv_dim},          {&w->bv, "attn_v.bias", 1, kv_dim},
            };
            const size_t n_spec = sizeof spec / sizeof spec[0] - (bias ? 0 : 3);
            for (size_t i = 0; i < n_spec; i++) {
                char name[96];
                snprintf(name, sizeof name, "blk.%zu.%s", l, spec[i].name);
                *spec[i].dst = TAKE(spec[i].rows * spec[i].cols);
                if (e8kv_is_error(
                        r = load_tensor(*spec[i].dst, g, name, spec[i].rows, spec[i].cols, msg, cap)))
                    return r;
            }
        }
    }
#undef TAKE
    assert(p == o->arena + n_float);
    if (e8kv_is_error(r = e8kv_tokenizer_from_gguf(&m->tokenizer, g))) {
        set_msg(msg, cap, "tokenizer: %s", e8kv_error_name(r));
        return r;
    }
    return 0;
}

size_t e8kv_model_load_gguf(e8kv_model **out, const char *path, char *msg, size_t msg_capacity) {
    if (!out || !path) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    set_msg(msg, msg_capacity, "ok");
    e8kv_model *m = calloc(1, sizeof *m);
    e8kv_model_storage *o = calloc(1, sizeof *o);
    if (!m || !o) {
        free(m);
        free(o);
        return E8KV_ERR(OUT_OF_MEMORY);
    }
    m->owned = o;
    size_t r = e8kv_gguf_open(&o->gguf, path);
    if (e8kv_is_error(r)) {
        set_msg(msg, msg_capacity, "%s: %s", path, e8kv_error_name(r));
    } else {
        r = load_gguf_model(m, o->gguf, msg, msg_capacity);
    }
    if (e8kv_is_error(r)) {
        e8kv_model_free(m);
        return r;
    }
    /* the weights are floats now and the tokenizer holds copies: the mapping can go */
    e8kv_gguf_close(o->gguf);
    o->gguf = NULL;
    *out = m;
    return 0;
}

size_t e8kv_model_load(e8kv_model **out, const char *path, char *msg, size_t msg_capacity) {
    if (!out || !path) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_msg(msg, msg_capacity, "%s: cannot open", path);
        return E8KV_ERR(IO);
    }
    char magic[4] = {0};
    const size_t n = fread(magic, 1, 4, f);
    fclose(f);
    if (n == 4 && !memcmp(magic, "GGUF", 4)) return e8kv_model_load_gguf(out, path, msg, msg_capacity);
    /* llama.2c checkpoint: look for its tokenizer next to it */
    char tok[4096];
    const char *slash = strrchr(path, '/');
    const int dir_len = slash ? (int)(slash - path + 1) : 0;
    static const char *const names[] = {"tok512.bin", "tokenizer.bin"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(tok, sizeof tok, "%.*s%s", dir_len, path, names[i]);
        FILE *t = fopen(tok, "rb");
        if (t) {
            fclose(t);
            return e8kv_model_load_llama2c(out, path, tok, msg, msg_capacity);
        }
    }
    return e8kv_model_load_llama2c(out, path, NULL, msg, msg_capacity);
}

size_t e8kv_model_default_path(char *dst, size_t capacity) {
    const char *env = getenv("E8KV_MODEL");
    int n;
    if (env && *env) {
        n = snprintf(dst, capacity, "%s", env);
    } else {
        const char *dir = getenv("E8KV_CACHE_DIR");
        const char *home = getenv("HOME");
        if (dir && *dir) {
            n = snprintf(dst, capacity, "%s/%s", dir, E8KV_DEFAULT_MODEL_NAME);
        } else {
            n = snprintf(dst, capacity, "%s/.cache/e8kv/%s", home ? home : ".", E8KV_DEFAULT_MODEL_NAME);
        }
    }
    if (n < 0 || (size_t)n >= capacity) return E8KV_ERR(DST_TOO_SMALL);
    return (size_t)n;
}

/* ---------------------------------------------------------------- context */
struct e8kv_context {
    const e8kv_model *m;
    e8kv_cache *cache;
    /* The forward pass's one set of threads: matrix products, SwiGLU and the cache's attention all run
     * their items on it (OpenBLAS itself runs single-threaded inside each item). */
    e8kv_pool *pool;
    size_t n_ctx, n_batch, pos;
    int keys_pre_rope; /* the cache wants keys before RoPE (e8kv_cache_keys_pre_rope) */
    e8kv_kv_hook kv_hook;
    void *kv_hook_user;
    e8kv_q_hook q_hook;
    void *q_hook_user;
    e8kv_rope *rope; /* queries' and (rope=post) keys' RoPE: the library's, the cache's rope=pre keys' too */
    /* scratch, (n_batch, ...) each */
    float *x;   /* (n_batch, dim) residual stream */
    float *xb;  /* (n_batch, dim) normalized */
    float *q;   /* (n_batch, n_head * head_dim) */
    float *k;   /* (n_batch, n_head_kv * head_dim) */
    float *v;   /* (n_batch, n_head_kv * head_dim) */
    float *att; /* (n_batch, n_head * head_dim) */
    float *hb;  /* (n_batch, hidden_dim) */
    float *hb2; /* (n_batch, hidden_dim) */
};

void e8kv_context_free(e8kv_context *c) {
    if (!c) return;
    e8kv_cache_free(c->cache); /* before the pool it borrows */
    e8kv_pool_free(c->pool);
    e8kv_rope_free(c->rope);
    free(c->x);
    free(c->xb);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->att);
    free(c->hb);
    free(c->hb2);
    free(c);
}

static float *falloc(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n * sizeof(float) + 64) ? NULL : p;
}

e8kv_context *e8kv_context_create(const e8kv_model *m, const e8kv_context_params *p, size_t *err) {
    size_t dummy;
    if (!err) err = &dummy;
    *err = 0;
    if (!m || !p || p->n_ctx == 0 || p->n_threads < 0 || p->n_threads > E8KV_MAX_THREADS) {
        *err = E8KV_ERR(BAD_ARGUMENT);
        return NULL;
    }
    const e8kv_model_config *cfg = &m->cfg;
    if (cfg->n_ctx_train && p->n_ctx > cfg->n_ctx_train) {
        *err = E8KV_ERR(CONTEXT_FULL);
        return NULL;
    }
    e8kv_context *c = calloc(1, sizeof *c);
    if (!c) {
        *err = E8KV_ERR(OUT_OF_MEMORY);
        return NULL;
    }
    c->m = m;
    c->n_ctx = p->n_ctx;
    c->n_batch = p->n_batch ? (p->n_batch < p->n_ctx ? p->n_batch : p->n_ctx) : p->n_ctx;
    long n_threads = p->n_threads > 0 ? p->n_threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    if (n_threads > E8KV_MAX_THREADS) n_threads = E8KV_MAX_THREADS;
    c->pool = e8kv_pool_create((size_t)n_threads, err);
    if (!c->pool) {
        e8kv_context_free(c);
        return NULL;
    }
    c->kv_hook = p->kv_hook;
    c->kv_hook_user = p->kv_hook_user;
    c->q_hook = p->q_hook;
    c->q_hook_user = p->q_hook_user;
    const char *spec = p->kv_spec ? p->kv_spec : "f32";
    const e8kv_cache_params cp = {.n_layer = cfg->n_layer,
                                  .n_head_kv = cfg->n_head_kv,
                                  .head_dim = cfg->head_dim,
                                  .n_ctx = p->n_ctx,
                                  .spec = spec,
                                  .seed = p->seed,
                                  .rope_theta = cfg->rope_theta,
                                  .rope_neox = cfg->rope_layout == E8KV_ROPE_SPLIT_HALF,
                                  .calib = p->calib,
                                  .rope_freqs = cfg->has_rope_freqs ? cfg->rope_freqs : NULL};
    c->cache = e8kv_cache_create(&cp, err); /* n_threads 0: no threads of its own, it gets the pool */
    if (!c->cache) {
        if (!e8kv_is_error(*err)) *err = E8KV_ERR(GENERIC);
        e8kv_context_free(c);
        return NULL;
    }
    e8kv_cache_set_pool(c->cache, c->pool);
    c->keys_pre_rope = e8kv_cache_keys_pre_rope(c->cache);
    const size_t B = c->n_batch, hd = cfg->head_dim;
    const size_t q_dim = cfg->n_head * hd, kv_dim = cfg->n_head_kv * hd;
    size_t rerr = 0;
    const int neox = cfg->rope_layout == E8KV_ROPE_SPLIT_HALF;
    if (cfg->has_rope_freqs) { /* the cache's floats, widened: queries and keys turn alike */
        double inv_freq[E8KV_MAX_HEAD_DIM / 2];
        assert(hd / 2 <= sizeof inv_freq / sizeof inv_freq[0]); /* the loader checked */
        for (size_t i = 0; i < hd / 2; i++)
            inv_freq[i] = cfg->rope_freqs[i];
        c->rope = e8kv_rope_create_freqs(hd, inv_freq, neox, &rerr);
    } else {
        c->rope = e8kv_rope_create(hd, cfg->rope_theta, neox, &rerr);
    }
    c->x = falloc(B * cfg->dim);
    c->xb = falloc(B * cfg->dim);
    c->q = falloc(B * q_dim);
    c->k = falloc(B * kv_dim);
    c->v = falloc(B * kv_dim);
    c->att = falloc(B * q_dim);
    c->hb = falloc(B * cfg->hidden_dim);
    c->hb2 = falloc(B * cfg->hidden_dim);
    if (!c->rope || !c->x || !c->xb || !c->q || !c->k || !c->v || !c->att || !c->hb || !c->hb2) {
        *err = c->rope ? E8KV_ERR(OUT_OF_MEMORY) : rerr; /* before the free: c goes with it */
        e8kv_context_free(c);
        return NULL;
    }
    openblas_set_num_threads(1); /* the pool's items call it: one thread each, no second pool */
    return c;
}

void e8kv_context_reset(e8kv_context *c) {
    if (!c) return;
    e8kv_cache_clear(c->cache);
    c->pos = 0;
}

size_t e8kv_context_pos(const e8kv_context *c) {
    return c ? c->pos : 0;
}
const e8kv_cache *e8kv_context_cache(const e8kv_context *c) {
    return c ? c->cache : NULL;
}

size_t e8kv_context_load_cache(e8kv_context *c, const void *src, size_t src_size) {
    if (!c || !src) return E8KV_ERR(BAD_ARGUMENT);
    c->pos = 0;
    const size_t n = e8kv_cache_load_into(c->cache, src, src_size);
    if (e8kv_is_error(n)) return n;
    for (size_t l = 0; l < c->m->cfg.n_layer; l++)
        if (e8kv_cache_n_tokens(c->cache, l) != n) { /* a forward pass leaves every layer at one count */
            e8kv_cache_clear(c->cache);
            return E8KV_ERR(CORRUPTED);
        }
    c->pos = n;
    return n;
}

/* ---------------------------------------------------------------- kernels */

/* out = x / sqrt(mean(x^2) + eps) * w, for each of n rows of dim. */
static void rmsnorm(float *restrict out, const float *restrict x, const float *restrict w, size_t n,
                    size_t dim, float eps) {
    for (size_t r = 0; r < n; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        double ss = 0.0;
        for (size_t i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        const float scale = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        for (size_t i = 0; i < dim; i++)
            o[i] = xr[i] * scale * w[i];
    }
}

/* y (n, n_out) = x (n, n_in) W^T (+ beta * y), W (n_out, n_in) row-major, cut into items of a block of
 * rows of W times a block of tokens. The blocks depend on the shapes alone, never on the thread count,
 * so any number of threads computes every item, and so every output, with the same calls: the same
 * bits. A vector (decode) is cut into at most 64 row blocks of 32 rows or more; a batch into blocks of
 * 256 rows or more and 256 tokens, so that each call packs little next to what it computes. */
#define MATMUL_VEC_ROWS 32
#define MATMUL_BATCH_ROWS 256
#define MATMUL_BATCH_TOKENS 256
#define MATMUL_ROW_BLOCKS 64
/* below this many multiply-adds (~10 µs) waking the workers costs more than it saves */
#define MATMUL_POOL_MIN 65536
typedef struct {
    float *y;
    const float *x, *w;
    size_t n, n_out, n_in, rows, tokens, n_row_blocks;
    float beta;
} matmul_job;

static void matmul_item(void *args, size_t i) {
    const matmul_job *j = args;
    const size_t r0 = i % j->n_row_blocks * j->rows, t0 = i / j->n_row_blocks * j->tokens;
    const size_t nr = j->n_out - r0 < j->rows ? j->n_out - r0 : j->rows;
    const size_t nt = j->n - t0 < j->tokens ? j->n - t0 : j->tokens;
    const float *const w = j->w + r0 * j->n_in;
    if (j->n == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)nr, (int)j->n_in, 1.0f, w, (int)j->n_in, j->x, 1,
                    j->beta, j->y + r0, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nt, (int)nr, (int)j->n_in, 1.0f,
                    j->x + t0 * j->n_in, (int)j->n_in, w, (int)j->n_in, j->beta, j->y + t0 * j->n_out + r0,
                    (int)j->n_out);
    }
}

static void matmul(const e8kv_context *c, float *y, const float *x, const float *w, size_t n, size_t n_out,
                   size_t n_in, float beta) {
    const size_t min_rows = n == 1 ? MATMUL_VEC_ROWS : MATMUL_BATCH_ROWS;
    size_t rows = (n_out + MATMUL_ROW_BLOCKS - 1) / MATMUL_ROW_BLOCKS;
    rows = rows < min_rows ? min_rows : (rows + 15) / 16 * 16;
    matmul_job j = {y, x, w, n, n_out, n_in, rows, MATMUL_BATCH_TOKENS, (n_out + rows - 1) / rows, beta};
    e8kv_pool *const pool = (double)n * (double)n_out * (double)n_in < MATMUL_POOL_MIN ? NULL : c->pool;
    e8kv_pool_run(pool, matmul_item, &j, j.n_row_blocks * ((n + j.tokens - 1) / j.tokens));
}

static void add_bias(float *y, const float *b, size_t n, size_t n_out) {
    if (!b) return;
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < n_out; i++)
            y[r * n_out + i] += b[i];
}

/* Rotate n rows of n_heads head vectors; row r is at position pos0 + r (RoPE: include/e8kv.h e8kv_rope_*). */
static void rope(const e8kv_context *c, float *x, size_t n, size_t n_heads, size_t pos0) {
    e8kv_rope_apply(c->rope, x, n, n_heads, pos0);
}

/* hb = silu(hb) * hb2, element-wise over n values, in blocks of SWIGLU_BLOCK. */
#define SWIGLU_BLOCK 4096
typedef struct {
    float *hb;
    const float *hb2;
    size_t n;
} swiglu_job;

static void swiglu_item(void *args, size_t b) {
    const swiglu_job *j = args;
    const size_t i1 = (b + 1) * SWIGLU_BLOCK < j->n ? (b + 1) * SWIGLU_BLOCK : j->n;
    for (size_t i = b * SWIGLU_BLOCK; i < i1; i++) {
        const float g = j->hb[i];
        j->hb[i] = g / (1.0f + expf(-g)) * j->hb2[i];
    }
}

static void swiglu(const e8kv_context *c, float *hb, const float *hb2, size_t n) {
    swiglu_job j = {hb, hb2, n};
    e8kv_pool_run(c->pool, swiglu_item, &j, (n + SWIGLU_BLOCK - 1) / SWIGLU_BLOCK);
}

/* ---------------------------------------------------------------- forward */

/* One batch of n <= n_batch tokens at positions c->pos ...; logits of rows >= logits_from. */
static size_t forward_batch(e8kv_context *c, float *logits, const int32_t *tokens, size_t n,
                            size_t logits_from) {
    const e8kv_model *m = c->m;
    const e8kv_model_config *cfg = &m->cfg;
    const size_t dim = cfg->dim, hd = cfg->head_dim, hid = cfg->hidden_dim;
    const size_t q_dim = cfg->n_head * hd, kv_dim = cfg->n_head_kv * hd;
    const size_t pos0 = c->pos;

    for (size_t r = 0; r < n; r++)
        memcpy(c->x + r * dim, m->tok_embd + (size_t)tokens[r] * dim, dim * sizeof(float));

    for (size_t l = 0; l < cfg->n_layer; l++) {
        const e8kv_layer_weights *w = &m->layers[l];
        /* attention */
        rmsnorm(c->xb, c->x, w->attn_norm, n, dim, cfg->norm_eps);
        matmul(c, c->q, c->xb, w->wq, n, q_dim, dim, 0.0f);
        matmul(c, c->k, c->xb, w->wk, n, kv_dim, dim, 0.0f);
        matmul(c, c->v, c->xb, w->wv, n, kv_dim, dim, 0.0f);
        add_bias(c->q, w->bq, n, q_dim);
        add_bias(c->k, w->bk, n, kv_dim);
        add_bias(c->v, w->bv, n, kv_dim);
        if (c->q_hook) c->q_hook(c->q_hook_user, l, c->q, n, pos0);
        rope(c, c->q, n, cfg->n_head, pos0);
        if (!c->keys_pre_rope) rope(c, c->k, n, cfg->n_head_kv, pos0);
        if (c->kv_hook) c->kv_hook(c->kv_hook_user, l, c->k, c->v, n, pos0);
        /* K/V go through the codec before any attention reads them, this batch's own tokens included */
        const size_t na = e8kv_cache_append(c->cache, l, c->k, c->v, n);
        if (e8kv_is_error(na)) return na;
        /* causal attention of the batch's queries, on the pool (the cache cuts it into items) */
        const size_t ra = e8kv_cache_attend(c->cache, c->att, n * q_dim, l, c->q, cfg->n_head, n, pos0);
        if (e8kv_is_error(ra)) return ra;
        matmul(c, c->x, c->att, w->wo, n, dim, q_dim, 1.0f); /* x += att Wo^T */
        /* feed-forward */
        rmsnorm(c->xb, c->x, w->ffn_norm, n, dim, cfg->norm_eps);
        matmul(c, c->hb, c->xb, w->w_gate, n, hid, dim, 0.0f);
        matmul(c, c->hb2, c->xb, w->w_up, n, hid, dim, 0.0f);
        swiglu(c, c->hb, c->hb2, n * hid);
        matmul(c, c->x, c->hb, w->w_down, n, dim, hid, 1.0f); /* x += ffn */
    }
    if (logits_from < n) {
        const size_t nl = n - logits_from;
        rmsnorm(c->xb, c->x + logits_from * dim, m->out_norm, nl, dim, cfg->norm_eps);
        matmul(c, logits, c->xb, m->output, nl, cfg->vocab_size, dim, 0.0f);
    }
    c->pos += n;
    return 0;
}

size_t e8kv_context_eval(e8kv_context *c, float *logits, size_t logits_capacity, const int32_t *tokens,
                         size_t n_tok, size_t logits_from) {
    if (!c || (!tokens && n_tok) || logits_from > n_tok) return E8KV_ERR(BAD_ARGUMENT);
    const size_t nv = c->m->cfg.vocab_size;
    if (logits_from < n_tok && (!logits || logits_capacity / nv < n_tok - logits_from))
        return E8KV_ERR(DST_TOO_SMALL);
    if (n_tok > c->n_ctx - c->pos) return E8KV_ERR(CONTEXT_FULL);
    for (size_t i = 0; i < n_tok; i++)
        if (tokens[i] < 0 || (size_t)tokens[i] >= nv) return E8KV_ERR(BAD_ARGUMENT);
    const size_t pos_start = c->pos;
    for (size_t done = 0; done < n_tok;) {
        const size_t n = n_tok - done < c->n_batch ? n_tok - done : c->n_batch;
        /* rows of this batch that want logits, and where they land in the caller's buffer */
        const size_t from = logits_from > done ? (logits_from - done < n ? logits_from - done : n) : 0;
        float *dst = from < n ? logits + (done + from - logits_from) * nv : NULL;
        const size_t r = forward_batch(c, dst, tokens + done, n, from);
        if (e8kv_is_error(r)) {
            e8kv_cache_truncate(c->cache, pos_start); /* drop this call's K/V */
            c->pos = pos_start;
            return r;
        }
        done += n;
    }
    return c->pos;
}
