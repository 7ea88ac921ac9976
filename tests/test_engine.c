/* engine/: model loaders (llama2.c, GGUF), the forward pass over the public cache API, the perplexity
 * harness and the sampler.
 *  - stories260K (a real trained llama2.c model, shared data; skipped when missing): greedy generation
 *    from BOS gives the known-good story; batched prefill equals token-by-token decoding; sub-batches and
 *    thread counts do not change the logits; ppl invariants.
 *  - malformed checkpoints and GGUF files (built here byte by byte): named errors, never a crash.
 * The logits themselves are checked against an independent numpy forward in tests/py_forward_ref.py. */
#include "test_util.h"

#include "model.h"
#include "ppl.h"
#include "sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *stories_path(void) {
    static char buf[4096];
    const char *p = test_data_path("stories260K/stories260K.bin");
    if (!p) return NULL;
    snprintf(buf, sizeof buf, "%s", p);
    return buf;
}

static e8kv_model *load_stories(void) {
    const char *p = stories_path();
    if (!p) return NULL;
    e8kv_model *m = NULL;
    char msg[256];
    assert_ok(e8kv_model_load(&m, p, msg, sizeof msg));
    assert_non_null(m);
    return m;
}

#define SKIP_WITHOUT_STORIES(m)                                                                              \
    do {                                                                                                     \
        if (!(m)) {                                                                                          \
            print_message("stories260K missing under E8KV_SHARED_DATA: skipped\n");                          \
            skip();                                                                                          \
        }                                                                                                    \
    } while (0)

static e8kv_context *make_ctx(const e8kv_model *m, size_t n_ctx, size_t n_batch, int n_threads) {
    const e8kv_context_params p = {
        .n_ctx = n_ctx, .n_batch = n_batch, .kv_spec = "f32", .n_threads = n_threads};
    size_t err = 0;
    e8kv_context *c = e8kv_context_create(m, &p, &err);
    if (!c) fail_msg("context: %s", e8kv_error_name(err));
    return c;
}

static void test_stories_greedy(void **state) {
    (void)state;
    e8kv_model *m = load_stories();
    SKIP_WITHOUT_STORIES(m);
    assert_int_equal(m->cfg.dim, 64);
    assert_int_equal(m->cfg.n_layer, 5);
    assert_int_equal(m->cfg.n_head_kv, 4);
    assert_int_equal(m->cfg.vocab_size, 512);
    assert_non_null(m->tokenizer);
    e8kv_context *c = make_ctx(m, 256, 0, 1);
    e8kv_sampler s;
    assert_ok(e8kv_sampler_init(&s, m->cfg.vocab_size, 0.0f, 1.0f, 1));
    float *logits = malloc(m->cfg.vocab_size * sizeof *logits);
    int32_t tok = e8kv_tokenizer_bos(m->tokenizer);
    char text[1024] = "";
    size_t len = 0;
    for (int i = 0; i < 40; i++) {
        assert_int_equal(e8kv_context_eval(c, logits, m->cfg.vocab_size, &tok, 1, 0), (size_t)i + 1);
        tok = e8kv_sampler_sample(&s, logits);
        const char *piece;
        const size_t n = e8kv_tokenizer_piece(m->tokenizer, tok, &piece);
        assert_false(e8kv_is_error(n));
        if (len + n < sizeof text) {
            memcpy(text + len, piece, n);
            len += n;
            text[len] = 0;
        }
    }
    const char *t = text;
    while (*t == ' ')
        t++; /* the first piece after BOS carries SentencePiece's space */
    const char *want = "Once upon a time, there was a little girl named Lily";
    if (strncmp(t, want, strlen(want))) fail_msg("got \"%s\"", t);
    free(logits);
    e8kv_sampler_free(&s);
    e8kv_context_free(c);
    e8kv_model_free(m);
}

/* Deterministic token sequence over the vocabulary (not text: the forward pass does not care). */
static void some_tokens(int32_t *t, size_t n, size_t vocab) {
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = (int32_t)((x >> 8) % vocab);
    }
}

static double max_abs_diff(const float *a, const float *b, size_t n, double *max_abs) {
    double d = 0.0, mx = 0.0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)a[i]));
    }
    if (max_abs) *max_abs = mx;
    return d;
}

/* One batch of 48 tokens == 48 single-token steps == sub-batches of 7 == 2 threads: the causal mask,
 * positions and cache appends agree however the tokens are fed. Tolerance: 1e-4 of the largest logit
 * (float sums in a different order). */
static void test_stories_batch_equals_decode(void **state) {
    (void)state;
    e8kv_model *m = load_stories();
    SKIP_WITHOUT_STORIES(m);
    enum { N = 48 };
    const size_t nv = m->cfg.vocab_size;
    int32_t toks[N];
    some_tokens(toks, N, nv);
    float *ref = malloc(N * nv * sizeof *ref), *got = malloc(N * nv * sizeof *got);
    e8kv_context *c = make_ctx(m, 64, 0, 1);
    assert_int_equal(e8kv_context_eval(c, ref, N * nv, toks, N, 0), N);
    double mx;
    /* single steps */
    e8kv_context_reset(c);
    assert_int_equal(e8kv_context_pos(c), 0);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(e8kv_context_eval(c, got + i * nv, nv, toks + i, 1, 0), i + 1);
    double d = max_abs_diff(ref, got, N * nv, &mx);
    assert_true(mx > 1.0);
    if (d > 1e-4 * mx) fail_msg("decode vs batch: max diff %g (max |logit| %g)", d, mx);
    e8kv_context_free(c);
    /* sub-batches of 7, 2 threads, logits only from token 20 on */
    c = make_ctx(m, 64, 7, 2);
    assert_int_equal(e8kv_context_eval(c, got, (N - 20) * nv, toks, N, 20), N);
    d = max_abs_diff(ref + 20 * nv, got, (N - 20) * nv, NULL);
    if (d > 1e-4 * mx) fail_msg("sub-batches vs batch: max diff %g", d);
    e8kv_context_free(c);
    /* keys handed to the cache before RoPE (rope=pre): the cache rotates them with the engine's own RoPE
     * (one implementation, e8kv_rope_*), so the logits are the same bits */
    const e8kv_context_params pre = {.n_ctx = 64, .kv_spec = "f32,rope=pre", .n_threads = 1};
    size_t perr = 0;
    c = e8kv_context_create(m, &pre, &perr);
    if (!c) fail_msg("rope=pre: %s", e8kv_error_name(perr));
    assert_int_equal(e8kv_context_eval(c, got, N * nv, toks, N, 0), N);
    d = max_abs_diff(ref, got, N * nv, NULL);
    if (d != 0.0) fail_msg("rope=pre vs post: max diff %g (one RoPE: expected the same bits)", d);
    e8kv_context_free(c);
    c = make_ctx(m, 64, 7, 2);
    assert_int_equal(e8kv_context_eval(c, got, (N - 20) * nv, toks, N, 20), N);
    /* the context is full at 64: 17 more tokens do not fit, and nothing changes */
    assert_error(e8kv_context_eval(c, got, nv, toks, 17, 16), CONTEXT_FULL);
    assert_int_equal(e8kv_context_pos(c), N);
    /* bad arguments */
    const int32_t bad = (int32_t)nv;
    assert_error(e8kv_context_eval(c, got, nv, &bad, 1, 0), BAD_ARGUMENT);
    assert_error(e8kv_context_eval(c, got, nv, toks, 1, 2), BAD_ARGUMENT);
    assert_error(e8kv_context_eval(c, got, nv - 1, toks, 1, 0), DST_TOO_SMALL);
    assert_int_equal(e8kv_context_pos(c), N);
    e8kv_context_free(c);
    /* n_ctx above the model's 512 */
    const e8kv_context_params big = {.n_ctx = 513, .kv_spec = "f32"};
    size_t err = 0;
    assert_null(e8kv_context_create(m, &big, &err));
    assert_error(err, CONTEXT_FULL);
    const e8kv_context_params badspec = {.n_ctx = 16, .kv_spec = "nonsense:9"};
    assert_null(e8kv_context_create(m, &badspec, &err));
    assert_true(e8kv_is_error(err));
    free(ref);
    free(got);
    e8kv_model_free(m);
}

static void test_stories_ppl(void **state) {
    (void)state;
    e8kv_model *m = load_stories();
    SKIP_WITHOUT_STORIES(m);
    /* the model's own greedy story, 3 chunks of 64 */
    enum { CTX = 64, N = 3 * CTX + 5 };
    int32_t toks[N];
    e8kv_context *c = make_ctx(m, N, 0, 1);
    float *logits = malloc(m->cfg.vocab_size * sizeof *logits);
    toks[0] = 1;
    for (size_t i = 0; i + 1 < N; i++) {
        assert_false(e8kv_is_error(e8kv_context_eval(c, logits, m->cfg.vocab_size, toks + i, 1, 0)));
        size_t best = 0;
        for (size_t k = 1; k < m->cfg.vocab_size; k++)
            if (logits[k] > logits[best]) best = k;
        toks[i + 1] = (int32_t)best;
    }
    e8kv_context_free(c);
    const char *specs[] = {"f32", "f16", "no-such-format"};
    e8kv_ppl_result res[3], base;
    e8kv_ppl_params p = {.n_ctx = CTX, .n_threads = 1, .specs = specs, .n_specs = 3, .baseline = &base};
    assert_int_equal(e8kv_ppl_run(m, toks, N, &p, res), 3);
    /* 3 chunks x (CTX/2 - 1) scored tokens; greedy text is very predictable */
    assert_int_equal(base.count, 3 * (CTX / 2 - 1));
    assert_true(base.ppl >= 1.0 && base.ppl < 3.0);
    assert_int_equal(res[0].count, base.count);
    assert_true(res[0].ppl == base.ppl && res[0].kld == 0.0 && res[0].top1 == 1.0);
    assert_true(res[2].status != 0 && e8kv_is_error(res[2].status));
    if (res[1].status == 0) { /* f16 cache: tiny but real change */
        assert_true(res[1].kld >= 0.0 && res[1].kld < 1e-3);
        assert_true(fabs(res[1].ppl / base.ppl - 1.0) < 1e-2);
        assert_true(res[1].top1 > 0.95);
        assert_true(res[1].bits_per_value > 15.9 && res[1].bits_per_value < 16.5);
    }
    /* bad input */
    p.n_chunks = 1;
    assert_error(e8kv_ppl_run(m, toks, CTX - 1, &p, res), SRC_SIZE);
    assert_error(e8kv_ppl_run(m, toks, 0, &p, res), SRC_SIZE);
    p.n_ctx = 1024;
    assert_error(e8kv_ppl_run(m, toks, N, &p, res), CONTEXT_FULL);
    p.n_ctx = 63;
    assert_error(e8kv_ppl_run(m, toks, N, &p, res), BAD_ARGUMENT);
    p.n_ctx = CTX;
    p.n_specs = 0;
    assert_error(e8kv_ppl_run(m, toks, N, &p, res), BAD_ARGUMENT);
    free(logits);
    e8kv_model_free(m);
}

/* e8kv_qcap_evict gives the cache each layer's own queries whatever the capture's capacity: a prefill of
 * n tokens into a capture of n + 37 positions evicts as one of exactly n positions (the logits of the
 * next token are the same bits), and reading the larger capture as if it were laid out by n (what
 * e8kv recall did) keeps other tokens. */
static void evict_after_prefill(const e8kv_model *m, const int32_t *toks, size_t n, size_t cap, int raw_layout,
                                float *logits) {
    e8kv_qcap qc;
    assert_int_equal(e8kv_qcap_init(&qc, m, cap), 0);
    const e8kv_context_params p = {.n_ctx = n + 8,
                                   .kv_spec = "f16,sink=1,evict=snapkv:0.5,page=16,recent=8,obs=16",
                                   .n_threads = 1,
                                   .q_hook = e8kv_qcap_hook,
                                   .q_hook_user = &qc};
    size_t err = 0;
    e8kv_context *c = e8kv_context_create(m, &p, &err);
    if (!c) fail_msg("context: %s", e8kv_error_name(err));
    qc.active = 1;
    assert_false(e8kv_is_error(e8kv_context_eval(c, NULL, 0, toks, n, n)));
    qc.active = 0;
    e8kv_cache *kv = (e8kv_cache *)(uintptr_t)e8kv_context_cache(c);
    const size_t kept = raw_layout ? e8kv_cache_evict(kv, qc.q, m->cfg.n_head, n, 0)
                                   : e8kv_qcap_evict(&qc, kv, m->cfg.n_head, n);
    assert_false(e8kv_is_error(kept));
    assert_true(kept < n);
    assert_false(e8kv_is_error(e8kv_context_eval(c, logits, m->cfg.vocab_size, toks + n, 1, 0)));
    e8kv_qcap_free(&qc);
    e8kv_context_free(c);
}

static void test_qcap_evict_layout(void **state) {
    (void)state;
    e8kv_model *m = load_stories();
    SKIP_WITHOUT_STORIES(m);
    enum { N = 200 };
    const size_t nv = m->cfg.vocab_size;
    int32_t toks[N + 1];
    some_tokens(toks, N + 1, nv);
    float *exact = malloc(nv * sizeof *exact), *wide = malloc(nv * sizeof *wide), *raw = malloc(nv * sizeof *raw);
    evict_after_prefill(m, toks, N, N, 0, exact);
    evict_after_prefill(m, toks, N, N + 37, 0, wide);
    evict_after_prefill(m, toks, N, N + 37, 1, raw);
    assert_memory_equal(exact, wide, nv * sizeof *exact);
    assert_memory_not_equal(exact, raw, nv * sizeof *exact);
    /* bad input */
    e8kv_qcap qc;
    assert_int_equal(e8kv_qcap_init(&qc, m, 8), 0);
    assert_error(e8kv_qcap_evict(&qc, NULL, m->cfg.n_head, 9), BAD_ARGUMENT);
    assert_error(e8kv_qcap_evict(&qc, NULL, m->cfg.n_head, 0), BAD_ARGUMENT);
    e8kv_qcap_free(&qc);
    free(exact);
    free(wide);
    free(raw);
    e8kv_model_free(m);
}

/* Threads: the forward pass (matrix products, SwiGLU, the cache's attention) runs on one pool in
 * pieces that do not depend on the thread count, so 2, 3 and 64 threads give the logits of 1 thread bit
 * for bit: a prefill in batches (the second at pos0 > 0) and single-token decode steps, with f32 and
 * coded caches (rope=pre included), and the perplexity harness. Counts above E8KV_MAX_THREADS or below
 * 0 are refused by the engine itself. */
static void test_stories_threads_identical(void **state) {
    (void)state;
    e8kv_model *m = load_stories();
    SKIP_WITHOUT_STORIES(m);
    enum { N = 300, STEPS = 12 };
    const size_t nv = m->cfg.vocab_size;
    int32_t toks[N + STEPS];
    some_tokens(toks, N + STEPS, nv);
    float *ref = malloc((N + STEPS) * nv * sizeof *ref), *got = malloc((N + STEPS) * nv * sizeof *got);
    static const char *specs[] = {"f32", "e8:4", "k=e8:4,v=e8:3,rope=pre"};
    static const int threads[] = {1, 2, 3, 64};
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
            const e8kv_context_params p = {
                .n_ctx = 512, .n_batch = 200, .kv_spec = specs[si], .n_threads = threads[ti]};
            size_t err = 0;
            e8kv_context *c = e8kv_context_create(m, &p, &err);
            if (!c) fail_msg("%s, %d threads: %s", specs[si], threads[ti], e8kv_error_name(err));
            float *const dst = ti ? got : ref;
            assert_int_equal(e8kv_context_eval(c, dst, N * nv, toks, N, 0), N);
            for (size_t i = N; i < N + STEPS; i++)
                assert_int_equal(e8kv_context_eval(c, dst + i * nv, nv, toks + i, 1, 0), i + 1);
            e8kv_context_free(c);
            if (ti && memcmp(ref, got, (N + STEPS) * nv * sizeof *ref))
                fail_msg("%s: %d threads differ from 1", specs[si], threads[ti]);
        }
    }
    /* perplexity: every figure equal */
    const char *pspecs[] = {"f32", "e8:4"};
    e8kv_ppl_result r1[2], rt[2], b1, bt;
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        e8kv_ppl_params pp = {.n_ctx = 128, .n_threads = threads[ti], .specs = pspecs, .n_specs = 2};
        pp.baseline = ti ? &bt : &b1;
        assert_int_equal(e8kv_ppl_run(m, toks, N, &pp, ti ? rt : r1), 2);
        if (!ti) continue;
        assert_true(bt.ppl == b1.ppl && bt.count == b1.count && bt.count > 0);
        for (size_t k = 0; k < 2; k++) {
            assert_int_equal(rt[k].status, 0);
            assert_true(rt[k].ppl == r1[k].ppl && rt[k].ppl_se == r1[k].ppl_se);
            assert_true(rt[k].kld == r1[k].kld && rt[k].top1 == r1[k].top1);
        }
        assert_true(rt[1].kld > 0.0); /* e8:4 really changed something */
    }
    /* thread counts the engine refuses */
    static const int bad[] = {-1, E8KV_MAX_THREADS + 1, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const e8kv_context_params p = {.n_ctx = 16, .kv_spec = "f32", .n_threads = bad[i]};
        size_t err = 0;
        assert_null(e8kv_context_create(m, &p, &err));
        assert_error(err, BAD_ARGUMENT);
    }
    free(ref);
    free(got);
    e8kv_model_free(m);
}

/* ---------------------------------------------------------------- malformed llama2.c checkpoints */
static char *tmp_file(const char *tag) {
    static char buf[8][256];
    static int k = 0;
    char *p = buf[k++ % 8];
    snprintf(p, 256, "/tmp/e8kv_test_engine_%d_%s", (int)getpid(), tag);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void test_llama2c_malformed(void **state) {
    (void)state;
    /* a tiny valid checkpoint: dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 10, seq_len 4 */
    const int32_t hdr[7] = {8, 16, 1, 2, 1, 10, 4};
    const size_t hd = 4, kv = 4;
    const size_t n_float = 10 * 8 + 8 * 2 + 8 * 8 * 2 + kv * 8 * 2 + 16 * 8 * 3 + 8 + 4 * hd;
    const size_t n = 28 + 4 * n_float;
    unsigned char *buf = calloc(1, n + 8);
    memcpy(buf, hdr, sizeof hdr); /* little-endian host */
    float *w = (float *)(buf + 28);
    for (size_t i = 0; i < n_float; i++)
        w[i] = 0.01f * (float)(i % 17);
    const char *path = tmp_file("ok.bin");
    e8kv_model *m = NULL;
    char msg[256];
    write_bytes(path, buf, n);
    assert_ok(e8kv_model_load_llama2c(&m, path, NULL, msg, sizeof msg));
    assert_int_equal(m->cfg.head_dim, 4);
    assert_ptr_equal(m->output, m->tok_embd); /* shared classifier */
    e8kv_model_free(m);
    /* truncated by one float */
    write_bytes(path, buf, n - 4);
    assert_error(e8kv_model_load_llama2c(&m, path, NULL, msg, sizeof msg), TRUNCATED);
    assert_null(m);
    /* header only */
    write_bytes(path, buf, 20);
    assert_error(e8kv_model_load_llama2c(&m, path, NULL, msg, sizeof msg), TRUNCATED);
    /* trailing bytes */
    write_bytes(path, buf, n + 8);
    assert_error(e8kv_model_load_llama2c(&m, path, NULL, msg, sizeof msg), CORRUPTED);
    /* negative vocab = unshared classifier: the same file is now 80 floats short */
    int32_t h2[7];
    memcpy(h2, hdr, sizeof h2);
    h2[5] = -10;
    memcpy(buf, h2, sizeof h2);
    write_bytes(path, buf, n);
    assert_error(e8kv_model_load_llama2c(&m, path, NULL, msg, sizeof msg), TRUNCATED);
    /* heads that do not divide dim, zero layers */
    memcpy(h2, hdr, sizeof h2);
    h2[3] = 3;
    memcpy(buf, h2, sizeof h2);
    write_bytes(path, buf, n);
    assert_error(e8kv_model_load_llama2c(&m, path, NULL, msg, sizeof msg), CORRUPTED);
    h2[3] = 2;
    h2[2] = 0;
    memcpy(buf, h2, sizeof h2);
    write_bytes(path, buf, n);
    assert_error(e8kv_model_load_llama2c(&m, path, NULL, msg, sizeof msg), CORRUPTED);
    /* missing file */
    remove(path);
    assert_error(e8kv_model_load_llama2c(&m, path, NULL, msg, sizeof msg), IO);
    assert_error(e8kv_model_load(&m, path, msg, sizeof msg), IO);
    free(buf);
}

/* ---------------------------------------------------------------- GGUF files built byte by byte */
typedef struct {
    unsigned char *p;
    size_t n, cap;
} bytes;

static void put(bytes *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 1024;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(bytes *b, uint32_t v) {
    put(b, &v, 4);
}
static void put_u64(bytes *b, uint64_t v) {
    put(b, &v, 8);
}
static void put_f32(bytes *b, float v) {
    put(b, &v, 4);
}
static void put_str(bytes *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_u32(bytes *b, const char *k, uint32_t v) {
    put_str(b, k);
    put_u32(b, 4);
    put_u32(b, v);
}
static void kv_f32(bytes *b, const char *k, float v) {
    put_str(b, k);
    put_u32(b, 6);
    put_f32(b, v);
}
static void kv_str(bytes *b, const char *k, const char *v) {
    put_str(b, k);
    put_u32(b, 8);
    put_str(b, v);
}

typedef struct {
    char name[64];
    uint32_t type;
    uint64_t ne0, ne1;
} tinfo;

enum { TINY_VOCAB = 6, TINY_DIM = 8, TINY_FF = 16, TINY_KV = 4 };

/* A 1-layer llama GGUF (dim 8, 2 heads, 1 KV head, vocab 6, SentencePiece vocabulary), all F32, with
 * optional damage: arch name, one tensor's shape or type. */
static bytes tiny_gguf(const char *arch, const char *bad_tensor, uint64_t bad_ne0, uint32_t bad_type) {
    tinfo t[] = {
        {"token_embd.weight", 0, TINY_DIM, TINY_VOCAB},      {"output_norm.weight", 0, TINY_DIM, 1},
        {"blk.0.attn_norm.weight", 0, TINY_DIM, 1},          {"blk.0.attn_q.weight", 0, TINY_DIM, TINY_DIM},
        {"blk.0.attn_k.weight", 0, TINY_DIM, TINY_KV},       {"blk.0.attn_v.weight", 0, TINY_DIM, TINY_KV},
        {"blk.0.attn_output.weight", 0, TINY_DIM, TINY_DIM}, {"blk.0.ffn_norm.weight", 0, TINY_DIM, 1},
        {"blk.0.ffn_gate.weight", 0, TINY_DIM, TINY_FF},     {"blk.0.ffn_up.weight", 0, TINY_DIM, TINY_FF},
        {"blk.0.ffn_down.weight", 0, TINY_FF, TINY_DIM},
    };
    const size_t nt = sizeof t / sizeof t[0];
    for (size_t i = 0; i < nt; i++) {
        if (bad_tensor && !strcmp(t[i].name, bad_tensor)) {
            if (bad_ne0) t[i].ne0 = bad_ne0;
            if (bad_type != 0xffffffffu) t[i].type = bad_type;
        }
    }
    char key[128];
    bytes b = {0};
    put_u32(&b, 0x46554747u);
    put_u32(&b, 3);
    put_u64(&b, nt);
    put_u64(&b, 16);
    kv_str(&b, "general.architecture", arch);
#define ARCH_KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    kv_u32(&b, ARCH_KEY("block_count"), 1);
    kv_u32(&b, ARCH_KEY("context_length"), 64);
    kv_u32(&b, ARCH_KEY("embedding_length"), TINY_DIM);
    kv_u32(&b, ARCH_KEY("feed_forward_length"), TINY_FF);
    kv_u32(&b, ARCH_KEY("attention.head_count"), 2);
    kv_u32(&b, ARCH_KEY("attention.head_count_kv"), 1);
    kv_f32(&b, ARCH_KEY("rope.freq_base"), 10000.0f);
    kv_f32(&b, ARCH_KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
#undef ARCH_KEY
    kv_str(&b, "tokenizer.ggml.model", "llama");
    static const char *const toks[TINY_VOCAB] = {"<unk>", "<s>", "</s>", "\342\226\201a", "a", "b"};
    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, 9);
    put_u32(&b, 8);
    put_u64(&b, TINY_VOCAB);
    for (int i = 0; i < TINY_VOCAB; i++)
        put_str(&b, toks[i]);
    put_str(&b, "tokenizer.ggml.scores");
    put_u32(&b, 9);
    put_u32(&b, 6);
    put_u64(&b, TINY_VOCAB);
    for (int i = 0; i < TINY_VOCAB; i++)
        put_f32(&b, (float)-i);
    put_str(&b, "tokenizer.ggml.token_type");
    put_u32(&b, 9);
    put_u32(&b, 5);
    put_u64(&b, TINY_VOCAB);
    for (int i = 0; i < TINY_VOCAB; i++)
        put_u32(&b, i == 0 ? 2 : i < 3 ? 3 : 1);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(&b, "tokenizer.ggml.unknown_token_id", 0);
    uint64_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        put_str(&b, t[i].name);
        const int two = t[i].ne1 != 1;
        put_u32(&b, two ? 2 : 1);
        put_u64(&b, t[i].ne0);
        if (two) put_u64(&b, t[i].ne1);
        put_u32(&b, t[i].type);
        put_u64(&b, off);
        off += (t[i].ne0 * t[i].ne1 * 4 + 31) / 32 * 32;
    }
    while (b.n % 32)
        put(&b, "", 1);
    for (size_t i = 0; i < nt; i++) {
        const size_t nf = t[i].ne0 * t[i].ne1, padded = (nf * 4 + 31) / 32 * 32;
        for (size_t k = 0; k < nf; k++)
            put_f32(&b, 0.05f * (float)((k * 7 + i) % 11) - 0.2f);
        for (size_t k = nf * 4; k < padded; k++)
            put(&b, "", 1);
    }
    return b;
}

static size_t load_bytes(const bytes *b, e8kv_model **m, char *msg, size_t cap) {
    const char *path = tmp_file("m.gguf");
    write_bytes(path, b->p, b->n);
    const size_t r = e8kv_model_load(m, path, msg, cap);
    remove(path);
    return r;
}

static void test_gguf_malformed(void **state) {
    (void)state;
    e8kv_model *m = NULL;
    char msg[256];
    /* the undamaged file loads and runs */
    bytes b = tiny_gguf("llama", NULL, 0, 0xffffffffu);
    size_t r = load_bytes(&b, &m, msg, sizeof msg);
    if (e8kv_is_error(r)) fail_msg("tiny gguf: %s", msg);
    assert_int_equal(m->cfg.n_head_kv, 1);
    assert_int_equal(m->cfg.head_dim, 4);
    assert_int_equal(m->cfg.rope_layout, E8KV_ROPE_INTERLEAVED);
    assert_ptr_equal(m->output, m->tok_embd); /* no output.weight: tied */
    e8kv_context *c = make_ctx(m, 8, 0, 1);
    const int32_t toks[3] = {1, 3, 5};
    float logits[3 * TINY_VOCAB];
    assert_int_equal(e8kv_context_eval(c, logits, 3 * TINY_VOCAB, toks, 3, 0), 3);
    for (size_t i = 0; i < 3 * TINY_VOCAB; i++)
        assert_true(isfinite(logits[i]));
    e8kv_context_free(c);
    e8kv_model_free(m);
    /* truncated inside the tensor data, and inside the header */
    const size_t full = b.n;
    b.n = full - 100;
    assert_error(load_bytes(&b, &m, msg, sizeof msg), TRUNCATED);
    assert_null(m);
    b.n = 40;
    assert_error(load_bytes(&b, &m, msg, sizeof msg), TRUNCATED);
    /* a flipped magic byte is not a GGUF: read as a llama2.c checkpoint it is implausible */
    b.n = full;
    b.p[0] ^= 0xff;
    assert_true(e8kv_is_error(load_bytes(&b, &m, msg, sizeof msg)));
    free(b.p);
    /* unsupported architecture: named in the message */
    b = tiny_gguf("gpt2", NULL, 0, 0xffffffffu);
    assert_error(load_bytes(&b, &m, msg, sizeof msg), UNSUPPORTED);
    assert_non_null(strstr(msg, "gpt2"));
    free(b.p);
    /* qwen2 is supported, with split-half RoPE */
    b = tiny_gguf("qwen2", NULL, 0, 0xffffffffu);
    assert_ok(load_bytes(&b, &m, msg, sizeof msg));
    assert_int_equal(m->cfg.rope_layout, E8KV_ROPE_SPLIT_HALF);
    e8kv_model_free(m);
    free(b.p);
    /* a tensor whose shape disagrees with the config */
    b = tiny_gguf("llama", "blk.0.ffn_up.weight", TINY_DIM + 4, 0xffffffffu);
    assert_error(load_bytes(&b, &m, msg, sizeof msg), DIMENSION);
    assert_non_null(strstr(msg, "ffn_up"));
    free(b.p);
    /* a tensor type id the reader does not know (kept as metadata, not convertible) */
    b = tiny_gguf("llama", "output_norm.weight", 0, 99);
    assert_error(load_bytes(&b, &m, msg, sizeof msg), UNSUPPORTED);
    free(b.p);
}

static void test_sampler(void **state) {
    (void)state;
    enum { V = 5 };
    const float logits[V] = {0.0f, 3.0f, 1.0f, -2.0f, 2.5f};
    e8kv_sampler s;
    assert_error(e8kv_sampler_init(&s, V, -1.0f, 0.9f, 1), BAD_ARGUMENT);
    assert_error(e8kv_sampler_init(&s, V, 1.0f, 0.0f, 1), BAD_ARGUMENT);
    assert_ok(e8kv_sampler_init(&s, V, 0.0f, 1.0f, 1));
    assert_int_equal(e8kv_sampler_sample(&s, logits), 1);
    e8kv_sampler_free(&s);
    /* top-p 0.5: p(1) = e^3 / sum = 0.55 > 0.5 alone, so always token 1 */
    assert_ok(e8kv_sampler_init(&s, V, 1.0f, 0.5f, 7));
    for (int i = 0; i < 200; i++)
        assert_int_equal(e8kv_sampler_sample(&s, logits), 1);
    e8kv_sampler_free(&s);
    /* top-p 0.9 at T = 1: nucleus {1, 4, 2} (0.55, 0.33, 0.07 -> 0.96); frequencies match the
     * renormalized probabilities within 4 sigma over 20000 draws */
    assert_ok(e8kv_sampler_init(&s, V, 1.0f, 0.9f, 7));
    int count[V] = {0};
    enum { DRAWS = 20000 };
    for (int i = 0; i < DRAWS; i++)
        count[e8kv_sampler_sample(&s, logits)]++;
    double z = 0.0;
    for (int i = 0; i < V; i++)
        z += exp(logits[i]);
    const double p1 = exp(3.0) / z, p4 = exp(2.5) / z, p2 = exp(1.0) / z, cum = p1 + p4 + p2;
    assert_int_equal(count[0] + count[3], 0);
    const double e1 = p1 / cum, f1 = (double)count[1] / DRAWS;
    assert_true(fabs(f1 - e1) < 4.0 * sqrt(e1 * (1 - e1) / DRAWS));
    const double e2 = p2 / cum, f2 = (double)count[2] / DRAWS;
    assert_true(fabs(f2 - e2) < 4.0 * sqrt(e2 * (1 - e2) / DRAWS));
    e8kv_sampler_free(&s);
}

/* ---------------------------------------------------------------- the CLI's answers to bad input */

/* Runs `e8kv ARGS` (stderr folded into the captured text); returns the exit status. */
static int run_cli(const char *args, char *out, size_t cap) {
    const char *build = getenv("E8KV_BUILD_DIR");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/e8kv %s 2>&1", build ? build : ".", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    const size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_bad_input(void **state) {
    (void)state;
    const char *model = stories_path();
    const char *build = getenv("E8KV_BUILD_DIR");
    char cli[4096];
    snprintf(cli, sizeof cli, "%s/e8kv", build ? build : ".");
    if (!model || access(cli, X_OK) != 0) {
        print_message("stories260K or the e8kv CLI missing: skipped\n");
        skip();
    }
    char model_copy[4096], args[8192], out[8192];
    snprintf(model_copy, sizeof model_copy, "%s", model);
    const char *empty = tmp_file("empty.txt"), *shorty = tmp_file("short.txt"), *text = tmp_file("text.txt");
    write_bytes(empty, "", 0);
    write_bytes(shorty, "Once upon a time", 16);
    char story[4000];
    size_t len = 0;
    while (len + 80 < sizeof story)
        len += (size_t)snprintf(story + len, sizeof story - len,
                                "Lily and Ben went to the park to play with a red ball. ");
    write_bytes(text, story, len);
    /* empty text, text shorter than one chunk, --ctx above the model's 512: named errors, exit 1 */
    snprintf(args, sizeof args, "ppl -m %s -f %s", model_copy, empty);
    assert_int_equal(run_cli(args, out, sizeof out), 1);
    assert_non_null(strstr(out, e8kv_error_code_name(E8KV_ERROR_SRC_SIZE)));
    snprintf(args, sizeof args, "ppl -m %s -f %s --ctx 64", model_copy, shorty);
    assert_int_equal(run_cli(args, out, sizeof out), 1);
    assert_non_null(strstr(out, e8kv_error_code_name(E8KV_ERROR_SRC_SIZE)));
    snprintf(args, sizeof args, "ppl -m %s -f %s --ctx 1024", model_copy, text);
    assert_int_equal(run_cli(args, out, sizeof out), 1);
    assert_non_null(strstr(out, e8kv_error_code_name(E8KV_ERROR_CONTEXT_FULL)));
    /* a truncated GGUF */
    const char *gg = tmp_file("trunc.gguf");
    bytes b = tiny_gguf("llama", NULL, 0, 0xffffffffu);
    write_bytes(gg, b.p, b.n - 64);
    free(b.p);
    snprintf(args, sizeof args, "ppl -m %s -f %s", gg, text);
    assert_int_equal(run_cli(args, out, sizeof out), 1);
    assert_non_null(strstr(out, e8kv_error_code_name(E8KV_ERROR_TRUNCATED)));
    /* a good run: one row per format, an unknown one reported as unavailable; the first chunk's K/V dumped
     * as doc/format.md section 1 says: 5 layers x (64 K + 64 V tokens) x 4 KV heads vectors of 8 floats */
    const char *kvd = tmp_file("dump.kvd");
    snprintf(args, sizeof args,
             "ppl -m %s -f %s --ctx 64 --chunks 2 --threads 1 --kv f32,bogus --json --dump-kv %s", model_copy,
             text, kvd);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_non_null(strstr(out, "\"spec\":\"f32\",\"available\":true"));
    assert_non_null(strstr(out, "\"spec\":\"bogus\",\"available\":false"));
    FILE *f = fopen(kvd, "rb");
    assert_non_null(f);
    unsigned char h[40];
    assert_int_equal(fread(h, 1, 40, f), 40);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fclose(f);
    remove(kvd);
    uint32_t u[8];
    uint64_t n_vec;
    memcpy(u, h + 8, 8);
    memcpy(&n_vec, h + 16, 8);
    memcpy(u + 2, h + 24, 16);
    assert_memory_equal(h, "E8KVDUMP", 8);
    assert_int_equal(u[0], 1);               /* version */
    assert_int_equal(u[1], 8);               /* head_dim */
    assert_int_equal(n_vec, 5 * 2 * 64 * 4); /* n_vec */
    assert_int_equal(u[2], 3);               /* keys and values, keys after RoPE */
    assert_int_equal(u[3], 5);               /* n_layer */
    assert_int_equal(u[4], 4);               /* n_head_kv */
    assert_int_equal(size, 40 + (long)n_vec * 8 * 4);
    remove(empty);
    remove(shorty);
    remove(text);
    remove(gg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_greedy),    cmocka_unit_test(test_stories_batch_equals_decode),
        cmocka_unit_test(test_stories_ppl),       cmocka_unit_test(test_stories_threads_identical),
        cmocka_unit_test(test_qcap_evict_layout),
        cmocka_unit_test(test_llama2c_malformed), cmocka_unit_test(test_gguf_malformed),
        cmocka_unit_test(test_sampler),           cmocka_unit_test(test_cli_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
