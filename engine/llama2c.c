/* llama2.c checkpoints (Karpathy's run.c "legacy" v0 format): a header of 7 little-endian int32
 *   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: unshared classifier), seq_len
 * then f32 weights, each block for all layers at once, in this order:
 *   token_embedding (vocab, dim), rms_att (L, dim), wq (L, dim, dim), wk (L, kv_dim, dim), wv (L, kv_dim,
 * dim), wo (L, dim, dim), rms_ffn (L, dim), w1 (L, hidden, dim), w2 (L, dim, hidden), w3 (L, hidden, dim),
 *   rms_final (dim), freq_cis_real and _imag (seq_len, head_dim / 2 each; unused), [wcls (vocab, dim)]
 * Matrices are (out, in) row-major; w1 = gate, w3 = up, w2 = down. RoPE: theta 1e4, interleaved pairs.
 * The whole payload must be present exactly: a short file is TRUNCATED, a long one CORRUPTED. */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static size_t fail(char *msg, size_t cap, size_t err, const char *what, const char *path) {
    if (msg && cap) snprintf(msg, cap, "%s: %s (%s)", path, what, e8kv_error_name(err));
    return err;
}

static int32_t le32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

size_t e8kv_model_load_llama2c(e8kv_model **out, const char *ckpt_path, const char *tokenizer_path, char *msg,
                               size_t msg_capacity) {
    if (!out || !ckpt_path) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    FILE *f = fopen(ckpt_path, "rb");
    if (!f) return fail(msg, msg_capacity, E8KV_ERR(IO), "cannot open", ckpt_path);
    unsigned char hdr[28];
    if (fread(hdr, 1, sizeof hdr, f) != sizeof hdr) {
        fclose(f);
        return fail(msg, msg_capacity, E8KV_ERR(TRUNCATED), "header shorter than 28 bytes", ckpt_path);
    }
    int32_t h[7];
    for (int i = 0; i < 7; i++)
        h[i] = le32(hdr + 4 * i);
    const int shared = h[5] > 0;
    const int64_t vocab = h[5] < 0 ? -(int64_t)h[5] : h[5];
    if (h[0] <= 0 || h[1] <= 0 || h[2] <= 0 || h[3] <= 0 || h[4] <= 0 || vocab == 0 || h[6] <= 0 ||
        h[0] > (1 << 16) || h[1] > (1 << 18) || h[2] > 1024 || vocab > (1 << 22) || h[6] > (1 << 22) ||
        h[0] % h[3] || h[3] % h[4] || (h[0] / h[3]) % 2) {
        fclose(f);
        return fail(msg, msg_capacity, E8KV_ERR(CORRUPTED), "implausible header", ckpt_path);
    }
    e8kv_model_config cfg = {.n_layer = (size_t)h[2],
                             .dim = (size_t)h[0],
                             .n_head = (size_t)h[3],
                             .n_head_kv = (size_t)h[4],
                             .hidden_dim = (size_t)h[1],
                             .vocab_size = (size_t)vocab,
                             .n_ctx_train = (size_t)h[6],
                             .rope_theta = 10000.0f,
                             .norm_eps = 1e-5f,
                             .rope_layout = E8KV_ROPE_INTERLEAVED,
                             .add_bos = 1};
    snprintf(cfg.arch, sizeof cfg.arch, "llama2.c");
    cfg.head_dim = cfg.dim / cfg.n_head;
    const size_t L = cfg.n_layer, dim = cfg.dim, hid = cfg.hidden_dim, kv_dim = cfg.n_head_kv * cfg.head_dim;
    const size_t n_float = cfg.vocab_size * dim * (shared ? 1 : 2) + L * dim * 2 + L * dim * dim * 2 +
                           L * kv_dim * dim * 2 + L * hid * dim * 3 + dim + (size_t)h[6] * cfg.head_dim;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return fail(msg, msg_capacity, E8KV_ERR(IO), "cannot seek", ckpt_path);
    }
    const long file_size = ftell(f);
    const size_t want = 28 + n_float * sizeof(float);
    if (file_size < 0 || (size_t)file_size != want) {
        fclose(f);
        char what[128];
        snprintf(what, sizeof what, "file has %ld bytes, the header implies %zu", file_size, want);
        return fail(msg, msg_capacity, (size_t)file_size < want ? E8KV_ERR(TRUNCATED) : E8KV_ERR(CORRUPTED), what,
                    ckpt_path);
    }
    e8kv_model *m = calloc(1, sizeof *m);
    e8kv_model_storage *o = calloc(1, sizeof *o);
    float *arena = malloc(n_float * sizeof(float));
    e8kv_layer_weights *layers = calloc(L, sizeof *layers);
    if (!m || !o || !arena || !layers) {
        fclose(f);
        free(m);
        free(o);
        free(arena);
        free(layers);
        return fail(msg, msg_capacity, E8KV_ERR(OUT_OF_MEMORY), "out of memory", ckpt_path);
    }
    m->cfg = cfg;
    m->owned = o;
    o->arena = arena;
    m->layers = layers;
    const int ok = fseek(f, 28, SEEK_SET) == 0 && fread(arena, sizeof(float), n_float, f) == n_float;
    fclose(f);
    if (!ok) {
        e8kv_model_free(m);
        return fail(msg, msg_capacity, E8KV_ERR(IO), "read failed", ckpt_path);
    }
    /* the file is little-endian f32, as is every target we build for */
    _Static_assert(sizeof(float) == 4, "f32");
    float *p = arena;
#define TAKE(n) (p += (n), p - (n))
    m->tok_embd = TAKE(cfg.vocab_size * dim);
    float *rms_att = TAKE(L * dim), *wq = TAKE(L * dim * dim), *wk = TAKE(L * kv_dim * dim);
    float *wv = TAKE(L * kv_dim * dim), *wo = TAKE(L * dim * dim), *rms_ffn = TAKE(L * dim);
    float *w1 = TAKE(L * hid * dim), *w2 = TAKE(L * dim * hid), *w3 = TAKE(L * hid * dim);
    m->out_norm = TAKE(dim);
    (void)TAKE((size_t)h[6] * cfg.head_dim); /* precomputed RoPE tables, recomputed by the context */
    m->output = shared ? m->tok_embd : TAKE(cfg.vocab_size * dim);
#undef TAKE
    for (size_t l = 0; l < L; l++) {
        e8kv_layer_weights *w = &layers[l];
        w->attn_norm = rms_att + l * dim;
        w->wq = wq + l * dim * dim;
        w->wk = wk + l * kv_dim * dim;
        w->wv = wv + l * kv_dim * dim;
        w->wo = wo + l * dim * dim;
        w->ffn_norm = rms_ffn + l * dim;
        w->w_gate = w1 + l * hid * dim;
        w->w_down = w2 + l * dim * hid;
        w->w_up = w3 + l * hid * dim;
    }
    if (tokenizer_path) {
        const size_t r = e8kv_tokenizer_from_llama2c(&m->tokenizer, tokenizer_path, cfg.vocab_size);
        if (e8kv_is_error(r)) {
            e8kv_model_free(m);
            return fail(msg, msg_capacity, r, "tokenizer", tokenizer_path);
        }
    }
    if (msg && msg_capacity) snprintf(msg, msg_capacity, "ok");
    *out = m;
    return 0;
}
