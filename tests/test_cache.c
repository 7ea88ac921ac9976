/* cache/: the public e8kv_cache_* API against a naive double-precision attention written here from the
 * definition (softmax(q·k / sqrt(d)) · V, causal, GQA), over the exact inputs (f32) or over the vectors
 * the codec itself reconstructs (compressed formats); bad input; byte accounting; the AVX2 tile kernel
 * against its reference twin. */
#include "test_util.h"

#include "cache/kvcache.h"
#include "common/cpu.h"
#include "common/rng.h"
#include "quant/voronoi.h"

#include <math.h>

typedef struct {
    size_t n_layer, n_head_kv, n_head, d, n_ctx;
} shape;

static float *rand_vec(e8kv_rng *rng, size_t n, double sd) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(sd * e8kv_rng_normal(rng));
    return x;
}

/* Naive causal GQA attention in double. K, V: (n_kv_tok, n_head_kv * d); q, out: (n_tok, n_head * d);
 * sinks: NULL, or a learned sink logit per query head that joins each softmax with a zero value. */
static void naive_attend_sinks(const shape *s, const float *K, const float *V, const float *q, size_t n_tok,
                               size_t pos0, const float *sinks, double *out) {
    const size_t d = s->d, g = s->n_head / s->n_head_kv;
    double *sc = malloc((pos0 + n_tok) * sizeof *sc);
    assert_non_null(sc);
    for (size_t t = 0; t < n_tok; t++)
        for (size_t hq = 0; hq < s->n_head; hq++) {
            const size_t h = hq / g, n_keys = pos0 + t + 1;
            const float *qv = q + (t * s->n_head + hq) * d;
            double mx = -INFINITY;
            for (size_t j = 0; j < n_keys; j++) {
                double dot = 0;
                for (size_t i = 0; i < d; i++)
                    dot += (double)qv[i] * K[(j * s->n_head_kv + h) * d + i];
                sc[j] = dot / sqrt((double)d);
                if (sc[j] > mx) mx = sc[j];
            }
            if (sinks && sinks[hq] > mx) mx = sinks[hq];
            double z = sinks ? exp((double)sinks[hq] - mx) : 0;
            for (size_t j = 0; j < n_keys; j++)
                z += (sc[j] = exp(sc[j] - mx));
            double *o = out + (t * s->n_head + hq) * d;
            for (size_t i = 0; i < d; i++)
                o[i] = 0;
            for (size_t j = 0; j < n_keys; j++)
                for (size_t i = 0; i < d; i++)
                    o[i] += sc[j] / z * V[(j * s->n_head_kv + h) * d + i];
        }
    free(sc);
}

static void naive_attend(const shape *s, const float *K, const float *V, const float *q, size_t n_tok,
                         size_t pos0, double *out) {
    naive_attend_sinks(s, K, V, q, n_tok, pos0, NULL, out);
}

/* What the codec gives back for every head vector of x (n_vec * d floats). */
static float *codec_roundtrip(const char *spec, size_t d, uint64_t seed, const float *x, size_t n_vec) {
    size_t err = 0;
    e8kv_codec *c = e8kv_codec_create(spec, d, seed, &err);
    assert_non_null(c);
    const size_t vb = e8kv_codec_vector_bytes(c);
    uint8_t *buf = malloc(n_vec * vb);
    float *y = malloc(n_vec * d * sizeof *y);
    assert_true(buf && y);
    assert_int_equal(e8kv_codec_encode(c, buf, n_vec * vb, x, n_vec), n_vec * vb);
    assert_int_equal(e8kv_codec_decode(c, y, n_vec * d, buf, n_vec * vb, n_vec), n_vec * d);
    free(buf);
    e8kv_codec_free(c);
    return y;
}

static e8kv_cache *make_cache(const shape *s, const char *spec, size_t n_threads, size_t *err) {
    e8kv_cache_params p = {0};
    p.n_layer = s->n_layer;
    p.n_head_kv = s->n_head_kv;
    p.head_dim = s->d;
    p.n_ctx = s->n_ctx;
    p.spec = spec;
    p.seed = 1234;
    p.n_threads = n_threads;
    return e8kv_cache_create(&p, err);
}

/* Append K/V of `n` tokens to every layer in chunks of varying size (1, 7, 64, ...). */
static void fill(e8kv_cache *c, const shape *s, float *const *K, float *const *V, size_t n) {
    static const size_t chunks[] = {1, 7, 64, 3, 100, 1, 31};
    const size_t row = s->n_head_kv * s->d;
    for (size_t l = 0; l < s->n_layer; l++) {
        size_t done = 0, ci = 0;
        while (done < n) {
            size_t k = chunks[ci++ % (sizeof chunks / sizeof chunks[0])];
            if (k > n - done) k = n - done;
            assert_int_equal(e8kv_cache_append(c, l, K[l] + done * row, V[l] + done * row, k), done + k);
            done += k;
        }
        assert_int_equal(e8kv_cache_n_tokens(c, l), n);
    }
}

static double max_abs_diff(const float *a, const double *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* Build a cache with `spec`, fill it, and compare decode (1 query token at the end) and chunked prefill
 * (n_tok > 1 at pos0 > 0) against naive attention over what the codec reconstructs. Returns 0 when the
 * spec is not implemented yet (E8KV_ERROR_UNSUPPORTED), 1 when checked. */
static int check_spec_q(const char *spec, const char *k_codec, const char *v_codec, size_t n_threads,
                        double tol, double q_sd) {
    const shape s = {2, 2, 6, 64, 300};
    const size_t n = 203, row = s.n_head_kv * s.d;
    size_t err = 0;
    e8kv_cache *c = make_cache(&s, spec, n_threads, &err);
    if (!c && e8kv_get_error_code(err) == E8KV_ERROR_UNSUPPORTED) {
        print_message("  [skip] %s: codec not implemented yet\n", spec);
        return 0;
    }
    assert_non_null(c);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 99);
    float *K[2], *V[2], *Kd[2], *Vd[2];
    for (size_t l = 0; l < s.n_layer; l++) {
        K[l] = rand_vec(&rng, n * row, 1.0);
        V[l] = rand_vec(&rng, n * row, 1.0);
        Kd[l] = codec_roundtrip(k_codec, s.d, 1234, K[l], n * s.n_head_kv);
        Vd[l] = codec_roundtrip(v_codec, s.d, 1234, V[l], n * s.n_head_kv);
    }
    fill(c, &s, K, V, n);
    const size_t cases[][2] = {{1, n - 1}, {9, 100}, {5, 0}, {70, 130}}; /* (n_tok, pos0) */
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const size_t nt = cases[ci][0], pos0 = cases[ci][1], n_out = nt * s.n_head * s.d;
        float *q = rand_vec(&rng, n_out, q_sd); /* 2: a sharp softmax, masking errors show */
        float *out = malloc(n_out * sizeof *out);
        double *ref = malloc(n_out * sizeof *ref);
        assert_true(out && ref);
        for (size_t l = 0; l < s.n_layer; l++) {
            assert_int_equal(e8kv_cache_attend(c, out, n_out, l, q, s.n_head, nt, pos0), n_out);
            naive_attend(&s, Kd[l], Vd[l], q, nt, pos0, ref);
            const double e = max_abs_diff(out, ref, n_out);
            if (e > tol)
                fail_msg("%s layer %zu n_tok %zu pos0 %zu: max |diff| %g > %g", spec, l, nt, pos0, e, tol);
        }
        free(q);
        free(out);
        free(ref);
    }
    for (size_t l = 0; l < s.n_layer; l++) {
        free(K[l]);
        free(V[l]);
        free(Kd[l]);
        free(Vd[l]);
    }
    e8kv_cache_free(c);
    return 1;
}

static int check_spec(const char *spec, const char *k_codec, const char *v_codec, size_t n_threads,
                      double tol) {
    return check_spec_q(spec, k_codec, v_codec, n_threads, tol, 2.0);
}

static void test_f32_exact(void **state) {
    (void)state;
    assert_true(check_spec("f32", "f32", "f32", 1, 1e-5));
    assert_true(check_spec("f32", "f32", "f32", 2, 1e-5)); /* threaded over KV heads */
}

static void test_f16_and_mixed(void **state) {
    (void)state;
    assert_true(check_spec("f16", "f16", "f16", 1, 1e-5));
    assert_true(check_spec("k=f16,v=f32", "f16", "f32", 2, 1e-5));
    assert_true(check_spec("k=bf16,v=f16", "bf16", "f16", 1, 1e-5));
}

/* e8kv_cache_spec_layers: the grammar resolved per stream without a cache (what the CUDA cache reads) */
static void test_spec_layers(void **state) {
    (void)state;
    char sp[8][E8KV_CODEC_SPEC_MAX_LEN + 1];
    e8kv_cache_spec_items it;
    assert_int_equal(e8kv_cache_spec_layers("k=e8box:4,v=bf16,layer1=e8p:2,layers2-3.v=f16,layer3.k=bf16", 4,
                                            NULL, &it, sp),
                     0);
    const char *want[8] = {"e8box:4", "bf16", "e8p:2", "e8p:2", "e8box:4", "f16", "bf16", "f16"};
    for (int i = 0; i < 8; i++)
        assert_string_equal(sp[i], want[i]);
    assert_true(it.sink == 0 && it.window == 0 && it.page == 0 && it.rope == -1 && it.center == -1 &&
                !it.auto_rates && !it.evicts);
    /* items, and a preset expanded as the cache would (uncalibrated without a calibration) */
    assert_int_equal(e8kv_cache_spec_layers("balanced,page=32,window=8,rope=post,center=0", 2, NULL, &it, sp), 0);
    char first[64];
    snprintf(first, sizeof first, "%s", e8kv_cache_preset_spec("balanced"));
    *strchr(first, ',') = 0; /* "e8:4,sink=1": its codec */
    assert_string_equal(sp[0], first);
    assert_true(it.sink == 1 && it.window == 8 && it.page == 32 && it.rope == 0 && it.center == 0);
    assert_int_equal(e8kv_cache_spec_layers("auto=e8tv:3,evict=snapkv:0.5", 2, NULL, &it, NULL), 0);
    assert_true(it.auto_rates && it.evicts);
    /* refusals: a rule past the last layer, not a spec, no arguments */
    assert_error(e8kv_cache_spec_layers("e8:4,layer2=f16", 2, NULL, &it, sp), SPEC);
    assert_error(e8kv_cache_spec_layers("f16,e8:4", 2, NULL, &it, sp), SPEC);
    assert_error(e8kv_cache_spec_layers(NULL, 2, NULL, &it, sp), BAD_ARGUMENT);
    assert_error(e8kv_cache_spec_layers("e8:4", 0, NULL, &it, sp), BAD_ARGUMENT);
}

/* e8kv_cache_spec_evict: the eviction items as the cache reads them, and the spec without them (what the
 * transformers CUDA cache, which evicts in Python, hands to the CUDA cache) */
static void test_spec_evict(void **state) {
    (void)state;
    e8kv_evict_items ev;
    char rest[128];
    assert_int_equal(e8kv_cache_spec_evict("e8box:4,sink=4,evict=snapkv:0.5,recent=8,budget=64", &ev, rest,
                                           sizeof rest),
                     0);
    assert_string_equal(ev.scorer, "snapkv");
    assert_true(ev.frac == 0.5f && ev.recent == 8 && ev.obs == 32 && ev.budget == 64 && ev.n_rules == 0);
    assert_string_equal(rest, "e8box:4,sink=4");
    assert_int_equal(e8kv_cache_spec_evict("k=e8box:4,v=bf16,obs=16,layers0-1=bf16,evict=h2o:0.25,evict1=0.5",
                                           &ev, rest, sizeof rest),
                     0);
    assert_string_equal(ev.scorer, "h2o");
    assert_true(ev.frac == 0.25f && ev.recent == 32 && ev.obs == 16 && ev.budget == 0 && ev.n_rules == 1);
    assert_string_equal(rest, "k=e8box:4,v=bf16,layers0-1=bf16");
    /* a codec's own options ('=' after ':') stay; no eviction: scorer "", the spec whole */
    assert_int_equal(e8kv_cache_spec_evict("e8nest:4:q=38,evict=stream:0", &ev, rest, sizeof rest), 0);
    assert_true(!strcmp(ev.scorer, "stream") && ev.frac == 0.0f && !strcmp(rest, "e8nest:4:q=38"));
    assert_int_equal(e8kv_cache_spec_evict("e8:4,sink=1", &ev, NULL, 0), 0);
    assert_string_equal(ev.scorer, "");
    assert_int_equal(e8kv_cache_spec_evict("e8:4,sink=1", &ev, rest, sizeof rest), 0);
    assert_string_equal(rest, "e8:4,sink=1");
    /* tuning items without a scorer, and bad values, are SPEC (a cache refuses them too); rest too small */
    const char *bad[] = {"e8:4,budget=64", "e8:4,recent=8", "e8:4,obs=8", "e8:4,evict0-1=0.5",
                         "e8:4,evict=snapkv:1.5", "e8:4,evict=nope:0.5", "e8:4,evict=keykey:0.5,budget=x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_error(e8kv_cache_spec_evict(bad[i], &ev, rest, sizeof rest), SPEC);
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_create(&(e8kv_cache_params){.n_layer = 1, .n_head_kv = 1, .head_dim = 64,
                                                          .n_ctx = 64, .spec = "f16,budget=16"},
                                      &err);
    assert_null(c);
    assert_error(err, SPEC);
    assert_int_equal(e8kv_cache_spec_evict("e8box:4,evict=stream:0", &ev, rest, 8), 0); /* "e8box:4" + NUL */
    assert_error(e8kv_cache_spec_evict("e8box:4,evict=stream:0", &ev, rest, 7), DST_TOO_SMALL);
    assert_error(e8kv_cache_spec_evict(NULL, &ev, rest, sizeof rest), BAD_ARGUMENT);
}

static void test_compressed_specs(void **state) {
    (void)state;
    /* compressed formats: the cache must match attention over the vectors the codec reconstructs */
    static const char *specs[] = {"q8_0", "q4_0", "q8_0h",    "q4_0h",   "lloyd:3", "e8:4",
                                  "e8:3", "e8:2", "e8nest:4", "e8box:3", "e8box:2", "e8p:2"};
    size_t checked = 0;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        checked += (size_t)check_spec(specs[i], specs[i], specs[i], 2, 2e-5);
    print_message("  compressed specs checked: %zu of %zu\n", checked, sizeof specs / sizeof specs[0]);
}

static void test_causal_mask(void **state) {
    (void)state;
    /* values after the query's position are huge: any leak through the mask shows in the output */
    const shape s = {1, 1, 2, 8, 64};
    e8kv_cache *c = make_cache(&s, "f32", 1, NULL);
    assert_non_null(c);
    float K[20 * 8], V[20 * 8];
    for (size_t j = 0; j < 20; j++)
        for (size_t i = 0; i < 8; i++) {
            K[j * 8 + i] = 0.0f;                     /* uniform attention over visible keys */
            V[j * 8 + i] = j > 13 ? 1e6f : (float)j; /* mean of 0..p for visible positions */
        }
    assert_int_equal(e8kv_cache_append(c, 0, K, V, 20), 20);
    float q[4 * 2 * 8], out[4 * 2 * 8];
    for (size_t i = 0; i < 64; i++)
        q[i] = 1.0f;
    assert_int_equal(e8kv_cache_attend(c, out, 64, 0, q, 2, 4, 10), 64);
    for (size_t t = 0; t < 4; t++)
        for (size_t i = 0; i < 16; i++)
            assert_float_equal(out[t * 16 + i], (10.0 + (double)t) / 2.0, 1e-5);
    e8kv_cache_free(c);
}

static void test_bad_input(void **state) {
    (void)state;
    const shape s = {2, 2, 4, 16, 10};
    size_t err = 0;
    e8kv_cache *c = make_cache(&s, "f32", 1, &err);
    assert_non_null(c);
    assert_int_equal(err, 0);
    float k[12 * 32] = {0}, v[12 * 32] = {0}, q[4 * 64] = {0}, out[4 * 64];
    for (size_t i = 0; i < 12 * 32; i++)
        k[i] = v[i] = (float)(i % 7) - 3.0f;
    assert_int_equal(e8kv_cache_append(c, 0, k, v, 8), 8);
    const size_t bytes = e8kv_cache_bytes(c);
    assert_error(e8kv_cache_append(c, 0, k, v, 3), CONTEXT_FULL);
    assert_error(e8kv_cache_append(c, 1, k, v, 11), CONTEXT_FULL);
    assert_error(e8kv_cache_append(c, 2, k, v, 1), DIMENSION);
    assert_error(e8kv_cache_append(c, 0, NULL, v, 1), BAD_ARGUMENT);
    assert_error(e8kv_cache_append(c, 0, k, v, 0), BAD_ARGUMENT);
    float bad[32];
    memcpy(bad, k, sizeof bad);
    bad[31] = NAN;
    assert_error(e8kv_cache_append(c, 0, k, bad, 1), NONFINITE);
    bad[31] = INFINITY;
    assert_error(e8kv_cache_append(c, 0, bad, v, 1), NONFINITE);
    assert_int_equal(e8kv_cache_n_tokens(c, 0), 8);
    assert_int_equal(e8kv_cache_n_tokens(c, 1), 0);
    assert_int_equal(e8kv_cache_bytes(c), bytes);
    assert_error(e8kv_cache_n_tokens(c, 2), DIMENSION);
    /* attention dimensions */
    assert_error(e8kv_cache_attend(c, out, 64, 2, q, 4, 1, 0), DIMENSION); /* layer */
    assert_error(e8kv_cache_attend(c, out, 64, 0, q, 3, 1, 0), DIMENSION); /* 3 % 2 */
    assert_error(e8kv_cache_attend(c, out, 64, 0, q, 0, 1, 0), DIMENSION);
    assert_error(e8kv_cache_attend(c, out, 64, 0, q, 4, 1, 8), DIMENSION);     /* position 8 not stored */
    assert_error(e8kv_cache_attend(c, out, 4 * 64, 0, q, 4, 2, 7), DIMENSION); /* 7, 8 */
    assert_error(e8kv_cache_attend(c, out, 4 * 64, 1, q, 4, 1, 0), DIMENSION); /* empty layer */
    assert_error(e8kv_cache_attend(c, out, 63, 0, q, 4, 1, 0), DST_TOO_SMALL);
    assert_error(e8kv_cache_attend(c, NULL, 64, 0, q, 4, 1, 0), BAD_ARGUMENT);
    assert_int_equal(e8kv_cache_attend(c, out, 64, 0, q, 4, 1, 7), 64);
    /* NaN/Inf anywhere in the query: a named error and out untouched (issue 12, item 7) */
    for (int kind = 0; kind < 3; kind++) {
        float qb[2 * 64], o2[2 * 64];
        for (size_t i = 0; i < 2 * 64; i++)
            qb[i] = (float)(i % 5) - 2.0f;
        qb[kind == 0 ? 0 : kind == 1 ? 77 : 127] = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
        memset(o2, 0x5A, sizeof o2);
        assert_error(e8kv_cache_attend(c, o2, 2 * 64, 0, qb, 4, 2, 6), NONFINITE);
        for (size_t i = 0; i < sizeof o2; i++)
            assert_int_equal(((const uint8_t *)o2)[i], 0x5A);
    }
    e8kv_cache_free(c);

    /* f16 overflow half-way through a call: nothing of that call stays */
    c = make_cache(&s, "f16", 1, NULL);
    assert_non_null(c);
    assert_int_equal(e8kv_cache_append(c, 0, k, v, 1), 1);
    const size_t b1 = e8kv_cache_bytes(c);
    float big[4 * 32];
    memcpy(big, k, sizeof big);
    big[3 * 32 + 5] = 1e6f; /* fourth token */
    assert_error(e8kv_cache_append(c, 0, big, v, 4), RANGE);
    assert_int_equal(e8kv_cache_n_tokens(c, 0), 1);
    assert_int_equal(e8kv_cache_bytes(c), b1);
    e8kv_cache_free(c);

    /* create */
    static const char *garbage[] = {"", "f33", "f16:3", "k=f16", "v=f16,k=", "f16,window=x", "f16,page=0",
                                    "f16,layers3=f32", "f16,layers1-0=f32", "f16,foo=1", ",", "f16,",
                                    "f16,rope=pre", "f16,rope=sideways", "f16,layersx=f32", "e8:4:z",
                                    /* a codec or preset only as the first item: a list is not a spec */
                                    "f16,e8:4", "k=e8:4,f16", "sink=1,balanced", "e8:4,sink=1,f16"};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        assert_null(make_cache(&s, garbage[i], 1, &err));
        if (e8kv_get_error_code(err) != E8KV_ERROR_SPEC)
            fail_msg("spec \"%s\": %s", garbage[i], e8kv_error_name(err));
    }
    const shape s12 = {1, 1, 1, 12, 10};
    assert_null(make_cache(&s12, "e8:4", 1, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_HEAD_DIM);
    assert_null(make_cache(&s12, "k=f16,v=e8:4", 1, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_HEAD_DIM);
    const shape s0 = {0, 1, 1, 16, 10};
    assert_null(make_cache(&s0, "f32", 1, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_BAD_ARGUMENT);
    assert_null(e8kv_cache_create(NULL, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_BAD_ARGUMENT);
    e8kv_cache_free(NULL);
}

static void test_truncate_clear(void **state) {
    (void)state;
    /* truncate then append B == a fresh cache holding A[:n_keep] + B: bit-exact outputs */
    const shape s = {2, 1, 2, 32, 400};
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 5);
    const size_t row = s.d, nA = 150, n_keep = 70, nB = 90, n = n_keep + nB;
    float *A = rand_vec(&rng, nA * row, 1.0), *B = rand_vec(&rng, nB * row, 1.0);
    float *AB = malloc(n * row * sizeof *AB);
    memcpy(AB, A, n_keep * row * sizeof *AB);
    memcpy(AB + n_keep * row, B, nB * row * sizeof *AB);
    e8kv_cache *c1 = make_cache(&s, "f16", 1, NULL), *c2 = make_cache(&s, "f16", 1, NULL);
    assert_true(c1 && c2);
    const size_t empty = e8kv_cache_bytes(c1);
    assert_int_equal(empty, e8kv_cache_fixed_bytes(c1));
    for (size_t l = 0; l < 2; l++)
        assert_int_equal(e8kv_cache_append(c1, l, A, A, nA), nA);
    assert_int_equal(e8kv_cache_truncate(c1, n_keep), n_keep);
    assert_int_equal(e8kv_cache_truncate(c1, 1000), n_keep);
    for (size_t l = 0; l < 2; l++) {
        assert_int_equal(e8kv_cache_append(c1, l, B, B, nB), n);
        assert_int_equal(e8kv_cache_append(c2, l, AB, AB, n), n);
    }
    /* the same pages (the slabs holding them follow each cache's history, pages.h) */
    assert_int_equal(e8kv_pages_live_bytes(&c1->pages), e8kv_pages_live_bytes(&c2->pages));
    assert_int_equal(e8kv_cache_bytes(c1) - e8kv_pages_bytes(&c1->pages),
                     e8kv_cache_bytes(c2) - e8kv_pages_bytes(&c2->pages));
    float *q = rand_vec(&rng, 3 * 2 * row, 1.0);
    float o1[3 * 2 * 32], o2[3 * 2 * 32];
    for (size_t l = 0; l < 2; l++) {
        assert_int_equal(e8kv_cache_attend(c1, o1, 192, l, q, 2, 3, n - 3), 192);
        assert_int_equal(e8kv_cache_attend(c2, o2, 192, l, q, 2, 3, n - 3), 192);
        assert_memory_equal(o1, o2, sizeof o1);
    }
    e8kv_cache_clear(c1);
    assert_int_equal(e8kv_cache_n_tokens(c1, 0), 0);
    assert_int_equal(e8kv_cache_bytes(c1), empty);
    free(A);
    free(B);
    free(AB);
    free(q);
    e8kv_cache_free(c1);
    e8kv_cache_free(c2);
}

/* Window, sinks and per-layer formats: position p of layer l is exact when p < sink or its page still
 * holds a token inside the window at n tokens ((p / P + 1) * P > n - W), and otherwise what the codec
 * reconstructs. Checked against naive attention over exactly that mix. */
static void check_mix(const char *spec, const char *codec, size_t W, size_t S, size_t P, int layer1_exact) {
    const shape s = {2, 1, 3, 32, 500};
    const size_t n = 333, row = s.d;
    size_t err = 0;
    e8kv_cache *c = make_cache(&s, spec, 1, &err);
    if (!c && e8kv_get_error_code(err) == E8KV_ERROR_UNSUPPORTED) return;
    if (!c) fail_msg("%s: %s", spec, e8kv_error_name(err));
    assert_int_equal(e8kv_cache_page_tokens(c), P);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 17);
    float *K[2], *V[2], *Km[2], *Vm[2];
    for (size_t l = 0; l < 2; l++) {
        K[l] = rand_vec(&rng, n * row, 1.0);
        V[l] = rand_vec(&rng, n * row, 1.0);
        Km[l] = codec_roundtrip(codec, s.d, 1234, K[l], n);
        Vm[l] = codec_roundtrip(codec, s.d, 1234, V[l], n);
        for (size_t p = 0; p < n; p++) {
            const int exact = (l == 1 && layer1_exact) || p < S || (W > 0 && (p / P + 1) * P + W > n);
            if (!exact) continue;
            memcpy(Km[l] + p * row, K[l] + p * row, row * sizeof(float));
            memcpy(Vm[l] + p * row, V[l] + p * row, row * sizeof(float));
        }
    }
    fill(c, &s, K, V, n);
    const size_t nt = 4, pos0 = n - nt, n_out = nt * s.n_head * s.d;
    float *q = rand_vec(&rng, n_out, 2.0), *out = malloc(n_out * sizeof(float));
    double *ref = malloc(n_out * sizeof(double));
    for (size_t l = 0; l < 2; l++) {
        assert_int_equal(e8kv_cache_attend(c, out, n_out, l, q, s.n_head, nt, pos0), n_out);
        naive_attend(&s, Km[l], Vm[l], q, nt, pos0, ref);
        const double e = max_abs_diff(out, ref, n_out);
        if (e > 2e-5) fail_msg("%s layer %zu: max |diff| %g", spec, l, e);
    }
    /* the mix really differs from the all-coded cache, so the check above has teeth */
    if (W || S) {
        float *Kc = codec_roundtrip(codec, s.d, 1234, K[0], n),
              *Vc = codec_roundtrip(codec, s.d, 1234, V[0], n);
        naive_attend(&s, Kc, Vc, q, nt, pos0, ref);
        assert_int_equal(e8kv_cache_attend(c, out, n_out, 0, q, s.n_head, nt, pos0), n_out);
        assert_true(max_abs_diff(out, ref, n_out) > 1e-4);
        free(Kc);
        free(Vc);
    }
    for (size_t l = 0; l < 2; l++) {
        free(K[l]);
        free(V[l]);
        free(Km[l]);
        free(Vm[l]);
    }
    free(q);
    free(out);
    free(ref);
    e8kv_cache_free(c);
}

static void test_window_sink_layers(void **state) {
    (void)state;
    check_mix("q4_0", "q4_0", 0, 0, 64, 0);
    check_mix("q4_0,window=40,page=16", "q4_0", 40, 0, 16, 0);
    check_mix("q4_0h,sink=5", "q4_0h", 0, 5, 64, 0);
    check_mix("q4_0h,window=64,sink=3,page=32,layers1=f32", "q4_0h", 64, 3, 32, 1);
    check_mix("kv=q8_0,layer1=f32,window=1", "q8_0", 1, 0, 64, 1);
}

/* A scaled RoPE's frequencies (params.rope_freqs): transformers' rope_type "llama3" of theta's, written out
 * from its definition (factor 8, low/high frequency factors 1 and 4, an original context of `orig`
 * positions, short enough that the tests' few hundred positions meet every branch). */
static void llama3_freqs(float *f, size_t d, double theta, double orig) {
    const double factor = 8.0, lo = 1.0, hi = 4.0;
    for (size_t i = 0; i < d / 2; i++) {
        const double inv = pow(theta, -2.0 * (double)i / (double)d), wavelen = 2.0 * M_PI / inv;
        if (wavelen < orig / hi)
            f[i] = (float)inv;
        else if (wavelen > orig / lo)
            f[i] = (float)(inv / factor);
        else {
            const double smooth = (orig / wavelen - lo) / (hi - lo);
            f[i] = (float)((1.0 - smooth) * inv / factor + smooth * inv);
        }
    }
}

/* rope=pre: keys go in before RoPE and the cache applies it at attention time; the result must equal
 * attention over keys with RoPE applied up front (computed here in double). With params.rope_freqs (a
 * scaled RoPE, rope_theta 0) the same with those frequencies. */
static void rope_ref(float *x, size_t d, size_t pos, double theta, const float *freqs, int neox) {
    for (size_t i = 0; i < d / 2; i++) {
        const double a = (double)pos * (freqs ? (double)freqs[i] : pow(theta, -2.0 * (double)i / (double)d));
        const size_t i0 = neox ? i : 2 * i, i1 = neox ? i + d / 2 : 2 * i + 1;
        const double x0 = x[i0], x1 = x[i1];
        x[i0] = (float)(x0 * cos(a) - x1 * sin(a));
        x[i1] = (float)(x0 * sin(a) + x1 * cos(a));
    }
}

static void test_rope_pre(void **state) {
    (void)state;
    const shape s = {1, 2, 4, 64, 300};
    const size_t n = 150, row = s.n_head_kv * s.d;
    float freqs[32];
    llama3_freqs(freqs, s.d, 500000.0, 64.0);
    for (int neox = 0; neox < 2; neox++)
        for (int k = 0; k < 4; k++) {
            const int coded = k % 2, scaled = k >= 2;
            e8kv_cache_params p = {0};
            p.n_layer = 1;
            p.n_head_kv = s.n_head_kv;
            p.head_dim = s.d;
            p.n_ctx = s.n_ctx;
            p.spec =
                coded ? "q8_0h,rope=pre,sink=2,center=0" : "f32,rope=pre"; /* centering: test_centering */
            p.seed = 1234;
            p.rope_theta = scaled ? 0.0f : 10000.0f;
            p.rope_freqs = scaled ? freqs : NULL;
            p.rope_neox = neox;
            size_t err = 0;
            e8kv_cache *c = e8kv_cache_create(&p, &err);
            assert_non_null(c);
            e8kv_rng rng;
            e8kv_rng_seed(&rng, 3);
            float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 1.0);
            float *Kr = coded ? codec_roundtrip("q8_0h", s.d, 1234, K, n * s.n_head_kv) : malloc(n * row * 4);
            if (!coded) memcpy(Kr, K, n * row * sizeof(float));
            float *Vr = coded ? codec_roundtrip("q8_0h", s.d, 1234, V, n * s.n_head_kv) : malloc(n * row * 4);
            if (!coded) memcpy(Vr, V, n * row * sizeof(float));
            if (coded) { /* sinks are exact */
                memcpy(Kr, K, 2 * row * sizeof(float));
                memcpy(Vr, V, 2 * row * sizeof(float));
            }
            for (size_t t = 0; t < n; t++)
                for (size_t h = 0; h < s.n_head_kv; h++)
                    rope_ref(Kr + t * row + h * s.d, s.d, t, 10000.0, scaled ? freqs : NULL, neox);
            assert_int_equal(e8kv_cache_append(c, 0, K, V, n), n);
            const size_t nt = 3, n_out = nt * s.n_head * s.d;
            float *q = rand_vec(&rng, n_out, 2.0), *out = malloc(n_out * sizeof(float));
            double *ref = malloc(n_out * sizeof(double));
            assert_int_equal(e8kv_cache_attend(c, out, n_out, 0, q, s.n_head, nt, n - nt), n_out);
            naive_attend(&s, Kr, Vr, q, nt, n - nt, ref);
            const double e = max_abs_diff(out, ref, n_out);
            if (e > 1e-4)
                fail_msg("rope=pre neox=%d coded=%d scaled=%d: max |diff| %g", neox, coded, scaled, e);
            free(K);
            free(V);
            free(Kr);
            free(Vr);
            free(q);
            free(out);
            free(ref);
            e8kv_cache_free(c);
        }
}

/* e8kv_cache_bytes() is the real allocation: pages at the allocator's aligned size plus the stated fixed
 * overhead; for full pages it is the nominal bits_per_value cost within 1%. */
static void test_bytes_accounting(void **state) {
    (void)state;
    static const char *specs[] = {"f32", "f16", "q8_0", "q4_0", "k=f16,v=q4_0", "e8:4", "e8:3"};
    const shape s = {3, 2, 2, 64, 4096};
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 8);
    const size_t n = 1024, row = s.n_head_kv * s.d;
    float *K = rand_vec(&rng, n * row, 1.0);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        size_t err = 0;
        e8kv_cache *c = make_cache(&s, specs[i], 1, &err);
        if (!c && e8kv_get_error_code(err) == E8KV_ERROR_UNSUPPORTED) continue;
        assert_non_null(c);
        const size_t fixed = e8kv_cache_fixed_bytes(c);
        assert_int_equal(e8kv_cache_bytes(c), fixed);
        for (size_t l = 0; l < s.n_layer; l++)
            assert_int_equal(e8kv_cache_append(c, l, K, K, n), n);
        const double nominal = e8kv_cache_bits_per_value(c) / 8.0 * (double)(2 * s.n_layer * n * row);
        const double got = (double)(e8kv_cache_bytes(c) - fixed);
        print_message("  %-14s %.3f bits/value: %zu bytes (%zu fixed), nominal %.0f\n", specs[i],
                      e8kv_cache_bits_per_value(c), e8kv_cache_bytes(c), fixed, nominal);
        assert_true(got >= nominal);
        assert_true(got <= nominal * 1.01);
        /* fixed overhead is small and stated: page tables + structs, plus the centering means of coded
         * formats (4 float vectors per layer and KV head: K and V, original and read domain) */
        const size_t means = 4 * s.n_layer * s.n_head_kv * s.d * sizeof(float);
        assert_true(fixed < 4096 + 2 * s.n_layer * s.n_head_kv * (s.n_ctx / 64) * 16 + means);
        /* one more token opens one page per layer, head and stream */
        const size_t b0 = e8kv_cache_bytes(c);
        assert_int_equal(e8kv_cache_append(c, 0, K, K, 1), n + 1);
        assert_true(e8kv_cache_bytes(c) > b0);
        e8kv_cache_truncate(c, n);
        assert_int_equal(e8kv_cache_bytes(c), b0);
        e8kv_cache_free(c);
    }
    free(K);
}

static void test_presets(void **state) {
    (void)state;
    static const char *names[] = {"near-lossless", "balanced", "aggressive"};
    const shape s = {2, 1, 1, 64, 100};
    for (size_t i = 0; i < 3; i++) {
        const char *spec = e8kv_cache_preset_spec(names[i]);
        assert_non_null(spec);
        size_t e1 = 0, e2 = 0;
        e8kv_cache *a = make_cache(&s, names[i], 1, &e1), *b = make_cache(&s, spec, 1, &e2);
        assert_int_equal(e1, e2); /* the name behaves exactly as its expansion */
        if (a) assert_true(e8kv_cache_bits_per_value(a) == e8kv_cache_bits_per_value(b));
        e8kv_cache_free(a);
        e8kv_cache_free(b);
    }
    assert_null(e8kv_cache_preset_spec("fast"));
    size_t err = 0;
    assert_null(make_cache(&s, "balanced,balanced2", 1, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_SPEC);
}

/* AVX2 tile kernel against the reference: same online-softmax state within float tolerance. */
static void test_tile_avx2_vs_ref(void **state) {
    (void)state;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 11);
    static const size_t dims[] = {8, 16, 24, 64, 128, 256};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const size_t d = dims[di];
        for (size_t n = 1; n <= 64; n += 9) {
            float *q = rand_vec(&rng, d, 0.5), *K = rand_vec(&rng, n * d, 1.0),
                  *V = rand_vec(&rng, n * d, 1.0);
            float *a1 = rand_vec(&rng, d, 1.0), *a2 = malloc(d * sizeof(float));
            memcpy(a2, a1, d * sizeof(float));
            float m1 = 0.3f, m2 = 0.3f, l1 = 2.0f, l2 = 2.0f;
            float *bias = n % 2 ? rand_vec(&rng, n, 1.0) : NULL; /* center=rope's score bias, every other n */
            e8kv_attn_tile_ref(q, K, V, bias, n, d, &m1, &l1, a1);
            e8kv_attn_tile_avx2(q, K, V, bias, n, d, &m2, &l2, a2);
            free(bias);
            /* dot products of d terms: rounding differences ~ d * eps * |q||k| */
            assert_float_equal(m1, m2, 1e-5 * (double)d);
            assert_float_equal(l1, l2, 1e-5 * fabs(l1) * (double)d);
            for (size_t i = 0; i < d; i++)
                assert_float_equal(a1[i], a2[i], 1e-5 * (1.0 + fabs(a1[i])) * (double)d);
            free(q);
            free(K);
            free(V);
            free(a1);
            free(a2);
        }
    }
}

/* center=rope's score bias along a run (e8kv_rc_bias_run_*): the AVX2 twin against the reference, runs of 1
 * to 64 keys from any first row offset, within float summation order. */
static void test_rc_bias_twins(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) skip();
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 23);
    float *tab = rand_vec(&rng, E8KV_RC_PAIRS * 2 * RC_FINE, 1.0); /* per pair a cos row, then its sin row */
    static const size_t ms[] = {1, 7, 8, 13, 33, 64};
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
        for (size_t r0 = 0; r0 + ms[mi] <= RC_FINE; r0 += 9) {
            const float *rows[E8KV_RC_PAIRS];
            float a[E8KV_RC_PAIRS], b[E8KV_RC_PAIRS], o1[RC_FINE], o2[RC_FINE];
            for (size_t k = 0; k < E8KV_RC_PAIRS; k++) {
                rows[k] = tab + 2 * RC_FINE * k + r0;
                a[k] = (float)e8kv_rng_normal(&rng), b[k] = (float)e8kv_rng_normal(&rng);
            }
            e8kv_rc_bias_run_ref(o1, rows, a, b, ms[mi]);
            e8kv_rc_bias_run_avx2(o2, rows, a, b, ms[mi]);
            for (size_t t = 0; t < ms[mi]; t++)
                assert_float_equal(o1[t], o2[t], 1e-5 * (1.0 + fabs(o1[t])));
        }
    free(tab);
}

/* Fused page readers (AVX2) against the codec's own decode, bit-exact, and whole attention with the
 * fused path against the reference path (codec decode + reference tile kernel). */
static void test_fused_readers(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) skip();
    /* center=0: this compares the readers with the codec's decode; the centering add-back on top of
     * them is test_centering's */
    static const char *specs[] = {"f32",           "f16",           "e8:2,center=0",
                                  "e8:3,center=0", "e8:4,center=0", "e8ball:3,center=0",
                                  "q4_0,center=0"};
    const shape s = {1, 2, 6, 64, 300};
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 21);
    const size_t n = 200, row = s.n_head_kv * s.d;
    float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 3.0);
    float *a = malloc(n * s.d * sizeof(float)), *b = malloc(n * s.d * sizeof(float));
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        size_t err = 0;
        e8kv_cache *c = make_cache(&s, specs[i], 1, &err);
        if (!c && e8kv_get_error_code(err) == E8KV_ERROR_UNSUPPORTED) continue;
        assert_non_null(c);
        assert_int_equal(e8kv_cache_append(c, 0, K, V, n), n);
        const kv_layer *L = &c->layers[0];
        if (!strncmp(specs[i], "q4_0", 4))
            assert_int_equal(L->k.fast, KV_FAST_NONE);
        else
            assert_int_not_equal(L->k.fast, KV_FAST_NONE);
        for (int is_k = 0; is_k < 2; is_k++)
            for (size_t h = 0; h < s.n_head_kv; h++) {
                c->use_avx2 = 1;
                e8kv_cache_read_tokens(c, L, h, is_k, 3, n - 3, a);
                /* independent: the public codec decode of the page bytes */
                const kv_format *f = is_k ? &L->k : &L->v;
                const kv_page *tab = (is_k ? L->k_pages : L->v_pages) + h * c->n_page_max;
                for (size_t p = 3; p < n; p++) {
                    const size_t P = c->page_tokens, vb = f->vector_bytes;
                    assert_int_equal(e8kv_codec_decode_rotated(f->codec, b + (p - 3) * s.d, s.d,
                                                               tab[p / P].data + (p % P) * vb, vb, 1),
                                     s.d);
                }
                assert_memory_equal(a, b, (n - 3) * s.d * sizeof(float));
            }
        const size_t nt = 5, n_out = nt * s.n_head * s.d;
        float *q = rand_vec(&rng, n_out, 2.0), *o1 = malloc(n_out * 4), *o2 = malloc(n_out * 4);
        c->use_avx2 = 1;
        assert_int_equal(e8kv_cache_attend(c, o1, n_out, 0, q, s.n_head, nt, n - nt), n_out);
        c->use_avx2 = 0;
        assert_int_equal(e8kv_cache_attend(c, o2, n_out, 0, q, s.n_head, nt, n - nt), n_out);
        for (size_t j = 0; j < n_out; j++)
            assert_float_equal(o1[j], o2[j], 1e-5 * (1.0 + fabs(o2[j])));
        free(q);
        free(o1);
        free(o2);
        e8kv_cache_free(c);
    }
    free(K);
    free(V);
    free(a);
    free(b);
}

/* The nibble-packed tables of the e8ball:4 attention reader hold exactly the codec's int8 tables
 * (all 65536 entries of each), and the reader is bit-exact against the codec's decode on random code
 * bytes (any 16-bit index is valid) at head_dim 64, 128 and 256. */
static void test_e8ball4_nibble_reader(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) skip();
    const uint32_t *bn = e8kv_attn_ball_nib(), *rn = e8kv_attn_res4_nib();
    assert_non_null(bn);
    assert_non_null(rn);
    const int8_t *ball = e8kv_ball_table(), *res = e8kv_ball_residual_table(2);
    for (size_t i = 0; i < E8KV_BALL_SIZE; i++)
        for (int j = 0; j < 8; j++) {
            const int sh = 8 * (j % 4) + 4 * (j / 4);
            assert_int_equal((int)((bn[i] >> sh) & 15) - 8, ball[8 * i + j]);
            assert_int_equal((int)((rn[i] >> sh) & 15) - 8, res[8 * i + j]);
        }
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 44);
    static const size_t dims[] = {64, 128, 256};
    for (size_t di = 0; di < 3; di++) {
        const size_t d = dims[di], n = 37;
        size_t err = 0;
        e8kv_codec *codec = e8kv_codec_create("e8:4", d, 5, &err);
        assert_non_null(codec);
        const size_t vb = e8kv_codec_vector_bytes(codec);
        uint8_t *src = malloc(n * vb);
        float *a = malloc(n * d * sizeof(float)), *b = malloc(n * d * sizeof(float));
        for (size_t i = 0; i < n * vb; i++)
            src[i] = (uint8_t)(e8kv_rng_next(&rng) >> 24);
        for (size_t t = 0; t < n; t++) { /* finite fp16 scales of both signs, 2^-14 .. 2^15 */
            src[t * vb] = (uint8_t)(e8kv_rng_next(&rng) >> 24);
            src[t * vb + 1] = (uint8_t)(0x04 + (e8kv_rng_next(&rng) >> 58) % 0x74) | (t & 1 ? 0x80 : 0);
        }
        assert_int_equal(e8kv_cache_read_e8ball4_avx2(a, src, n, d, vb), 1);
        for (size_t t = 0; t < n; t++)
            assert_int_equal(e8kv_codec_decode_rotated(codec, b + t * d, d, src + t * vb, vb, 1), d);
        assert_memory_equal(a, b, n * d * sizeof(float));
        free(src);
        free(a);
        free(b);
        e8kv_codec_free(codec);
    }
    float dummy[8];
    const uint8_t none[8] = {0};
    assert_int_equal(e8kv_cache_read_e8ball4_avx2(dummy, none, 0, 40, 22), 0); /* d % 64 */
}

/* Threads: decode attention over more than one context slice (kvcache.h: 1024 keys here) leaves a
 * partial softmax state per slice (every KV head), merged by log-sum-exp in slice order. The pieces do not
 * depend on the thread count, so 1 to 4 threads (the cache's own pool, or pools given with
 * e8kv_cache_set_pool) give the same bits; and the merged result matches the unsliced computation (the
 * per-query-chunk path, scratch hidden) up to float rounding (the merge regroups the sums: 1e-5
 * relative), for decode and a few causal query tokens whose key counts end inside different slices, and
 * with window/sink positions present. */
static void test_context_split_threads(void **state) {
    (void)state;
    static const char *specs[] = {"f32", "e8:4", "k=e8:4,v=f16,window=100,sink=4",
                                  "e8box:4,window=64,sink=2"};
    const shape s = {1, 3, 9, 64, 5000};
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 33);
    const size_t n = 4500, row = s.n_head_kv * s.d;
    float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 1.0);
    e8kv_pool *pools[5] = {NULL};
    for (size_t t = 2; t <= 4; t++)
        assert_non_null(pools[t] = e8kv_pool_create(t, NULL));
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        size_t err = 0;
        /* made with 4 threads: the cache's own pool; with 1: none */
        e8kv_cache *c1 = make_cache(&s, specs[i], i % 2 ? 1 : 4, &err);
        assert_non_null(c1);
        assert_true((c1->pool != NULL) == (i % 2 == 0));
        assert_int_equal(e8kv_pool_threads(c1->pool), i % 2 ? 1 : 4);
        assert_int_equal(c1->attn_slice, 1024);
        assert_non_null(c1->attn_part);
        assert_int_equal(e8kv_cache_append(c1, 0, K, V, n), n);
        static const size_t n_toks[] = {1, 3};
        for (size_t ti = 0; ti < 2; ti++) {
            const size_t nt = n_toks[ti], n_out = nt * s.n_head * s.d;
            float *q = rand_vec(&rng, n_out, 3.0), *o1 = malloc(n_out * 4), *o2 = malloc(n_out * 4);
            assert_int_equal(e8kv_cache_attend(c1, o1, n_out, 0, q, s.n_head, nt, n - nt), n_out);
            for (size_t t = 1; t <= 4; t++) {
                assert_int_equal(e8kv_cache_set_pool(c1, pools[t]), 0);
                assert_null(c1->pool_owned); /* the cache's own threads are gone */
                memset(o2, 0xff, n_out * 4);
                assert_int_equal(e8kv_cache_attend(c1, o2, n_out, 0, q, s.n_head, nt, n - nt), n_out);
                assert_memory_equal(o1, o2, n_out * 4);
            }
            float *const part = c1->attn_part;
            c1->attn_part = NULL; /* no scratch: one piece per (KV head, query chunk) over all keys */
            memset(o2, 0xff, n_out * 4);
            assert_int_equal(e8kv_cache_attend(c1, o2, n_out, 0, q, s.n_head, nt, n - nt), n_out);
            c1->attn_part = part;
            for (size_t j = 0; j < n_out; j++)
                assert_float_equal(o1[j], o2[j], 1e-5 * (1.0 + fabs(o1[j])));
            free(q);
            free(o1);
            free(o2);
        }
        e8kv_cache_free(c1);
    }
    for (size_t t = 2; t <= 4; t++)
        e8kv_pool_free(pools[t]);
    free(K);
    free(V);
}

/* Learned attention sinks (e8kv_cache_attend_sinks, gpt-oss): f32 pages against the naive attention with
 * the sink in its softmax, over context slices (decode), a few tokens and a chunk; on coded pages (centred
 * e8box:4, e8:4 keys with exact sink rows) the sink scales each head's output by one factor, the one the
 * exact keys give within the codes' error (keys with a large common offset: a sink compared with the
 * scores less q·mean would be far off); -inf sinks change no bit; NaN and +inf are refused. */
static void test_learned_sinks(void **state) {
    (void)state;
    static const char *specs[] = {"f32", "e8box:4", "k=e8:4,v=f16,sink=4"};
    const shape s = {1, 2, 8, 64, 2600};
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 41);
    const size_t n = 2500, row = s.n_head_kv * s.d;
    float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 1.0);
    for (size_t i = 0; i < n * row; i++)
        K[i] += 2.0f, V[i] += 1.0f;
    float sinks[8], none[8];
    for (size_t h = 0; h < 8; h++)
        none[h] = -INFINITY;
    const size_t cases[][2] = {{1, n - 1}, {3, n - 3}, {70, 300}}; /* (n_tok, pos0) */
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        size_t err = 0;
        e8kv_cache *c = make_cache(&s, specs[i], 2, &err);
        assert_non_null(c);
        assert_int_equal(e8kv_cache_append(c, 0, K, V, n), n);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const size_t nt = cases[ci][0], pos0 = cases[ci][1], n_out = nt * s.n_head * s.d;
            float *q = rand_vec(&rng, n_out, 1.0), *o = malloc(n_out * 4), *o0 = malloc(n_out * 4);
            double *ref = malloc(n_out * sizeof *ref), *ref0 = malloc(n_out * sizeof *ref0);
            assert_true(o && o0 && ref && ref0);
            /* each head's sink about its typical log-sum-exp (~ q·mean / sqrt(d) + log n): weights of 5-95%
             */
            for (size_t h = 0; h < 8; h++) {
                double qm = 0;
                for (size_t j = 0; j < s.d; j++)
                    qm += q[(nt - 1) * s.n_head * s.d + h * s.d + j] * 2.0;
                sinks[h] = (float)(qm / 8.0 + log((double)pos0 + nt) + 3.0 * e8kv_rng_normal(&rng) * 0.5);
            }
            assert_int_equal(e8kv_cache_attend_sinks(c, o, n_out, 0, q, s.n_head, nt, pos0, sinks), n_out);
            assert_int_equal(e8kv_cache_attend(c, o0, n_out, 0, q, s.n_head, nt, pos0), n_out);
            naive_attend_sinks(&s, K, V, q, nt, pos0, sinks, ref);
            naive_attend(&s, K, V, q, nt, pos0, ref0);
            if (i == 0) {
                const double e = max_abs_diff(o, ref, n_out);
                if (e > 2e-5) fail_msg("f32 n_tok %zu: max |diff| %g", nt, e);
            }
            /* per (token, head): out = out without sinks × w, w the exact keys' factor within the codes'
             * error */
            double lo = 1, hi = 0;
            for (size_t r = 0; r < nt * s.n_head; r++) {
                double num = 0, den = 0, num_r = 0, den_r = 0;
                for (size_t j = 0; j < s.d; j++) {
                    num += (double)o[r * s.d + j] * o0[r * s.d + j],
                        den += (double)o0[r * s.d + j] * o0[r * s.d + j];
                    num_r += ref[r * s.d + j] * ref0[r * s.d + j],
                        den_r += ref0[r * s.d + j] * ref0[r * s.d + j];
                }
                const double w = num / den, w_ref = num_r / den_r;
                for (size_t j = 0; j < s.d; j++)
                    assert_float_equal(o[r * s.d + j], w * o0[r * s.d + j],
                                       1e-5 * (1.0 + fabs(o0[r * s.d + j])));
                if (fabs(w - w_ref) > 0.02 + 0.05 * w_ref)
                    fail_msg("%s n_tok %zu row %zu: sink factor %g, exact keys %g", specs[i], nt, r, w,
                             w_ref);
                lo = fmin(lo, w_ref), hi = fmax(hi, w_ref);
            }
            assert_true(lo < 0.9 && hi > 0.1); /* the sinks matter in this test */
            memset(o, 0xff, n_out * 4);
            assert_int_equal(e8kv_cache_attend_sinks(c, o, n_out, 0, q, s.n_head, nt, pos0, none), n_out);
            assert_memory_equal(o, o0, n_out * 4);
            free(q);
            free(o);
            free(o0);
            free(ref);
            free(ref0);
        }
        float q1[8 * 64] = {0}, o1[8 * 64];
        sinks[3] = NAN;
        assert_error(e8kv_cache_attend_sinks(c, o1, 8 * 64, 0, q1, 8, 1, n - 1, sinks), NONFINITE);
        sinks[3] = INFINITY;
        assert_error(e8kv_cache_attend_sinks(c, o1, 8 * 64, 0, q1, 8, 1, n - 1, sinks), NONFINITE);
        e8kv_cache_free(c);
    }
    free(K);
    free(V);
}

/* Prefill (many query tokens: one piece per (KV head, query chunk)) gives the same bits on any pool. */
static void test_prefill_threads(void **state) {
    (void)state;
    const shape s = {1, 2, 8, 64, 700};
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 34);
    const size_t n = 700, row = s.n_head_kv * s.d, n_out = n * s.n_head * s.d;
    float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 1.0);
    float *q = rand_vec(&rng, n_out, 3.0), *o1 = malloc(n_out * 4), *o2 = malloc(n_out * 4);
    size_t err = 0;
    e8kv_cache *c = make_cache(&s, "k=e8:4,v=e8:3", 1, &err);
    assert_non_null(c);
    assert_null(c->attn_part); /* n_ctx fits one slice */
    assert_int_equal(e8kv_cache_append(c, 0, K, V, n), n);
    assert_int_equal(e8kv_cache_attend(c, o1, n_out, 0, q, s.n_head, n, 0), n_out);
    for (size_t t = 2; t <= 5; t += 3) {
        e8kv_pool *p = e8kv_pool_create(t, NULL);
        assert_non_null(p);
        assert_int_equal(e8kv_cache_set_pool(c, p), 0);
        memset(o2, 0xff, n_out * 4);
        assert_int_equal(e8kv_cache_attend(c, o2, n_out, 0, q, s.n_head, n, 0), n_out);
        assert_memory_equal(o1, o2, n_out * 4);
        assert_int_equal(e8kv_cache_set_pool(c, NULL), 0);
        e8kv_pool_free(p);
    }
    assert_int_equal(e8kv_cache_set_pool(NULL, NULL), E8KV_ERR(BAD_ARGUMENT));
    e8kv_cache_free(c);
    /* more threads than a cache makes: E8KV_CACHE_MAX_THREADS of them, same bits */
    c = make_cache(&s, "k=e8:4,v=e8:3", E8KV_CACHE_MAX_THREADS + 36, &err);
    assert_non_null(c);
    assert_int_equal(e8kv_pool_threads(c->pool), E8KV_CACHE_MAX_THREADS);
    assert_int_equal(e8kv_cache_append(c, 0, K, V, n), n);
    memset(o2, 0xff, n_out * 4);
    assert_int_equal(e8kv_cache_attend(c, o2, n_out, 0, q, s.n_head, n, 0), n_out);
    assert_memory_equal(o1, o2, n_out * 4);
    e8kv_cache_free(c);
    free(K);
    free(V);
    free(q);
    free(o1);
    free(o2);
}

/* Centering: keys/values with a large common offset per head are coded as (x - mean) and read back as
 * decode + mean. Checked against an independent reference (mean in double here, the codec's own round
 * trip of the centered vectors, naive attention), for a real error reduction on offset data, for the
 * short-first-append rule, for a fresh mean after clear, and for the bytes it costs. */
static void test_centering(void **state) {
    (void)state;
    const shape s = {1, 2, 6, 64, 512};
    const size_t n = 256, row = s.n_head_kv * s.d, nt = 4, n_out = nt * s.n_head * s.d;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 77);
    float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 1.0);
    float *off = rand_vec(&rng, row, 6.0); /* a common component 6x the per-token spread */
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < row; i++) {
            K[t * row + i] += off[i];
            V[t * row + i] -= off[i];
        }
    float *q = rand_vec(&rng, n_out, 0.3);
    double *exact = malloc(n_out * sizeof(double)), *ref = malloc(n_out * sizeof(double));
    float *o_on = malloc(n_out * sizeof(float)), *o_off = malloc(n_out * sizeof(float));
    naive_attend(&s, K, V, q, nt, n - nt, exact);

    size_t err = 0;
    e8kv_cache *on = make_cache(&s, "e8:4", 1, &err), *plain = make_cache(&s, "e8:4,center=0", 1, &err);
    assert_non_null(on);
    assert_non_null(plain);
    /* llama.cpp's formats keep its semantics unless center=all; e8kv's own formats center by default */
    {
        e8kv_cache *a = make_cache(&s, "q4_0h", 1, &err), *b = make_cache(&s, "q4_0h,center=all", 1, &err);
        e8kv_cache *l = make_cache(&s, "lloyd:4", 1, &err);
        assert_non_null(a);
        assert_non_null(b);
        assert_non_null(l);
        assert_int_equal(a->layers[0].k.centered, 0);
        assert_int_equal(b->layers[0].k.centered, 1);
        assert_int_equal(l->layers[0].v.centered, 1);
        assert_int_equal(on->layers[0].k.centered, 1);
        assert_int_equal(plain->layers[0].k.centered, 0);
        e8kv_cache_free(a);
        e8kv_cache_free(b);
        e8kv_cache_free(l);
    }
    /* the means are side information: 4 float vectors per layer and KV head */
    assert_int_equal(e8kv_cache_fixed_bytes(on) - e8kv_cache_fixed_bytes(plain),
                     4 * s.n_layer * s.n_head_kv * s.d * sizeof(float));
    assert_int_equal(e8kv_cache_append(on, 0, K, V, n), n);
    assert_int_equal(e8kv_cache_append(plain, 0, K, V, n), n);
    assert_int_equal(e8kv_cache_attend(on, o_on, n_out, 0, q, s.n_head, nt, n - nt), n_out);
    assert_int_equal(e8kv_cache_attend(plain, o_off, n_out, 0, q, s.n_head, nt, n - nt), n_out);

    /* reference: mean over the append (double), codec round trip of x - mean, plus mean */
    float *Kc = malloc(n * row * sizeof(float)), *Vc = malloc(n * row * sizeof(float));
    float *mk = malloc(row * sizeof(float)), *mv = malloc(row * sizeof(float));
    for (size_t i = 0; i < row; i++) {
        double sk = 0, sv = 0;
        for (size_t t = 0; t < n; t++) {
            sk += K[t * row + i];
            sv += V[t * row + i];
        }
        mk[i] = (float)(sk / (double)n);
        mv[i] = (float)(sv / (double)n);
        for (size_t t = 0; t < n; t++) {
            Kc[t * row + i] = K[t * row + i] - mk[i];
            Vc[t * row + i] = V[t * row + i] - mv[i];
        }
    }
    float *Kr = codec_roundtrip("e8:4", s.d, 1234, Kc, n * s.n_head_kv);
    float *Vr = codec_roundtrip("e8:4", s.d, 1234, Vc, n * s.n_head_kv);
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < row; i++) {
            Kr[t * row + i] += mk[i];
            Vr[t * row + i] += mv[i];
        }
    naive_attend(&s, Kr, Vr, q, nt, n - nt, ref);
    const double e_ref = max_abs_diff(o_on, ref, n_out);
    if (e_ref > 1e-4) fail_msg("centered attention vs reference: max |diff| %g", e_ref);

    /* the point of it: much less error against exact attention on offset data */
    const double e_on = max_abs_diff(o_on, exact, n_out), e_off = max_abs_diff(o_off, exact, n_out);
    print_message("  offset data, e8:4: max error %.4g centered vs %.4g plain\n", e_on, e_off);
    assert_true(e_on < 0.5 * e_off);

    /* a first append shorter than E8KV_CACHE_CENTER_MIN_TOKENS does not center: same as center=0 */
    e8kv_cache_clear(on);
    e8kv_cache_clear(plain);
    const size_t step = E8KV_CACHE_CENTER_MIN_TOKENS - 1;
    for (size_t t = 0; t < n; t += step) {
        const size_t m = n - t < step ? n - t : step;
        assert_int_equal(e8kv_cache_append(on, 0, K + t * row, V + t * row, m), t + m);
        assert_int_equal(e8kv_cache_append(plain, 0, K + t * row, V + t * row, m), t + m);
    }
    assert_int_equal(e8kv_cache_attend(on, o_on, n_out, 0, q, s.n_head, nt, n - nt), n_out);
    assert_int_equal(e8kv_cache_attend(plain, o_off, n_out, 0, q, s.n_head, nt, n - nt), n_out);
    assert_memory_equal(o_on, o_off, n_out * sizeof(float));

    /* after clear, a new sequence measures its own means: shifted data is as accurate as before */
    e8kv_cache_clear(on);
    for (size_t i = 0; i < n * row; i++)
        K[i] += 10.0f;
    naive_attend(&s, K, V, q, nt, n - nt, exact);
    assert_int_equal(e8kv_cache_append(on, 0, K, V, n), n);
    assert_int_equal(e8kv_cache_attend(on, o_on, n_out, 0, q, s.n_head, nt, n - nt), n_out);
    assert_true(max_abs_diff(o_on, exact, n_out) < 0.5 * e_off);

    e8kv_cache_free(on);
    e8kv_cache_free(plain);
    free(K);
    free(V);
    free(off);
    free(q);
    free(exact);
    free(ref);
    free(o_on);
    free(o_off);
    free(Kc);
    free(Vc);
    free(Kr);
    free(Vr);
    free(mk);
    free(mv);
}

/* center=rope, the CUDA cache's turned key centre (kvcache.h, kv_rc), against an independent reference of the
 * CUDA cache's definition (tests/test_cuda.cu builds the same one for the GPU's bytes): the mean after RoPE
 * in double, each RoPE pair's mean before RoPE (keys turned back with e8kv_rope_apply's cos, sin), the 8
 * pairs whose energy grows most, and each key coded as (x − μ) − R_p·m. Checked: the K and V bytes of
 * every coded token, attention over the reference's decode (the float path for e8box:3, the integer tiles'
 * score bias for e8box:4), both RoPE layouts, d 64 and 128; the bytes and reads of kept tokens after an
 * eviction (their own positions); a save/load round trip (the same bits); the side bytes; a short first
 * append (no means: center=1's output bit for bit); and the specs refused. */
static void rope_centre_case(const char *codec, int box, int neox, size_t d, const float *freqs) {
    const size_t n_kv = 2, n_head = 6, g = n_head / n_kv, n = 200, first = 100, n_sink = 2, nt = 4;
    const size_t row = n_kv * d, half = d / 2;
    char spec[96], plain_spec[96], evict_spec[128];
    snprintf(spec, sizeof spec, "%s,sink=%zu,page=16,center=rope", codec, n_sink);
    snprintf(plain_spec, sizeof plain_spec, "%s,sink=%zu,page=16,rope=post", codec, n_sink);
    snprintf(evict_spec, sizeof evict_spec, "%s,evict=keykey:0.5,recent=16", spec);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 900 + d + (size_t)neox);
    const float theta = freqs ? 0.0f : neox ? 500000.0f : 10000.0f;
    size_t err = 0;
    double f64[64];
    for (size_t i = 0; freqs && i < d / 2; i++)
        f64[i] = freqs[i];
    e8kv_rope *rp =
        freqs ? e8kv_rope_create_freqs(d, f64, neox, &err) : e8kv_rope_create(d, theta, neox, &err);
    assert_non_null(rp);
    /* keys: unit noise plus a mean before RoPE with a few large pairs, turned to each position */
    float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 1.0), *m = malloc(row * sizeof *m);
    for (size_t i = 0; i < row; i++)
        m[i] = (float)(e8kv_rng_uniform(&rng) < 0.15 ? 4.0 : 0.3) * (float)e8kv_rng_normal(&rng);
    float *tmp = malloc(row * sizeof *tmp);
    for (size_t t = 0; t < n; t++) {
        memcpy(tmp, m, row * sizeof *tmp);
        e8kv_rope_apply(rp, tmp, 1, n_kv, t);
        for (size_t i = 0; i < row; i++)
            K[t * row + i] += tmp[i];
    }
    /* reference: means over the first append, pairs, turned centres */
    float *mk = calloc(row, sizeof *mk), *mv = calloc(row, sizeof *mv), rm[2][16];
    size_t ri[2][8];
    for (size_t i = 0; i < row; i++) {
        double sk = 0.0, sv = 0.0;
        for (size_t t = 0; t < first; t++)
            sk += K[t * row + i], sv += V[t * row + i];
        mk[i] = (float)(sk / (double)first), mv[i] = (float)(sv / (double)first);
    }
    float cs[128];
    for (size_t h = 0; h < n_kv; h++) {
        double sx[64] = {0}, sy[64] = {0}, e[64];
        float a[64], b[64];
        for (size_t t = 0; t < first; t++) {
            for (size_t i = 0; i < half; i++)
                cs[neox ? i : 2 * i] = 1.0f, cs[neox ? i + half : 2 * i + 1] = 0.0f;
            e8kv_rope_apply(rp, cs, 1, 1, t);
            for (size_t i = 0; i < half; i++) {
                const size_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                const double x = K[t * row + h * d + i0], y = K[t * row + h * d + i1], C = cs[i0], S = cs[i1];
                sx[i] += x * C + y * S;
                sy[i] += y * C - x * S;
            }
        }
        for (size_t i = 0; i < half; i++) {
            const size_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            a[i] = (float)(sx[i] / (double)first), b[i] = (float)(sy[i] / (double)first);
            const double ma = mk[h * d + i0], mb = mk[h * d + i1];
            e[i] = ((double)a[i] * a[i] + (double)b[i] * b[i]) - (ma * ma + mb * mb);
        }
        for (size_t k = 0; k < 8; k++) {
            size_t best = 0;
            for (size_t i = 1; i < half; i++)
                if (e[i] > e[best]) best = i;
            e[best] = -INFINITY;
            ri[h][k] = best, rm[h][2 * k] = a[best], rm[h][2 * k + 1] = b[best];
            mk[h * d + (neox ? best : 2 * best)] = mk[h * d + (neox ? best + half : 2 * best + 1)] = 0.0f;
        }
    }
    /* the reference's codes and decode (sinks exact) */
    e8kv_codec *cc = e8kv_codec_create(codec, d, 1234, &err);
    assert_non_null(cc);
    const size_t vb = e8kv_codec_vector_bytes(cc);
    uint8_t *KB = malloc(n * n_kv * vb), *VB = malloc(n * n_kv * vb);
    float *Kd = malloc(n * row * sizeof *Kd), *Vd = malloc(n * row * sizeof *Vd), *turned = malloc(row * sizeof *turned);
    for (size_t t = 0; t < n; t++)
        for (size_t h = 0; h < n_kv; h++) {
            float tk[128], tv[128];
            memset(turned + h * d, 0, d * sizeof *turned);
            for (size_t k = 0; k < 8; k++) {
                turned[h * d + (neox ? ri[h][k] : 2 * ri[h][k])] = rm[h][2 * k];
                turned[h * d + (neox ? ri[h][k] + half : 2 * ri[h][k] + 1)] = rm[h][2 * k + 1];
            }
            e8kv_rope_apply(rp, turned + h * d, 1, 1, t);
            for (size_t i = 0; i < d; i++) {
                tk[i] = (K[t * row + h * d + i] - mk[h * d + i]) - turned[h * d + i];
                tv[i] = V[t * row + h * d + i] - mv[h * d + i];
            }
            uint8_t *kb = KB + (t * n_kv + h) * vb, *vbp = VB + (t * n_kv + h) * vb;
            assert_int_equal(e8kv_codec_encode(cc, kb, vb, tk, 1), vb);
            assert_int_equal(e8kv_codec_encode(cc, vbp, vb, tv, 1), vb);
            float *yk = Kd + t * row + h * d, *yv = Vd + t * row + h * d;
            if (t < n_sink) {
                memcpy(yk, K + t * row + h * d, d * sizeof *yk);
                memcpy(yv, V + t * row + h * d, d * sizeof *yv);
                continue;
            }
            assert_int_equal(e8kv_codec_decode(cc, yk, d, kb, vb, 1), d);
            assert_int_equal(e8kv_codec_decode(cc, yv, d, vbp, vb, 1), d);
            for (size_t i = 0; i < d; i++) {
                yk[i] = (yk[i] + mk[h * d + i]) + turned[h * d + i];
                yv[i] = yv[i] + mv[h * d + i];
            }
        }
    e8kv_cache_params p = {.n_layer = 1,
                           .n_head_kv = n_kv,
                           .head_dim = d,
                           .n_ctx = 256,
                           .spec = spec,
                           .seed = 1234,
                           .rope_theta = theta,
                           .rope_neox = neox,
                           .rope_freqs = freqs};
    e8kv_cache *c = e8kv_cache_create(&p, &err);
    if (!c) fail_msg("%s: %s", spec, e8kv_error_name(err));
    p.spec = plain_spec;
    e8kv_cache *plain = e8kv_cache_create(&p, &err);
    assert_non_null(plain);
    p.spec = evict_spec;
    e8kv_cache *ev = e8kv_cache_create(&p, &err);
    assert_non_null(ev);
    char window_spec[128];
    snprintf(window_spec, sizeof window_spec, "%s,window=24", spec);
    p.spec = window_spec;
    e8kv_cache *win = e8kv_cache_create(&p, &err); /* pages coded as the window leaves them */
    assert_non_null(win);
    /* side bytes: per KV head 8 pairs and their means, the reads' cos/sin tables, the rope they come from
     * (the frequencies' copy is in both caches) */
    assert_int_equal(e8kv_cache_fixed_bytes(c) - e8kv_cache_fixed_bytes(plain),
                     n_kv * sizeof(kv_rc) + (RC_FINE + 256 / RC_FINE) * d * sizeof(float) +
                         e8kv_rope_bytes(rp));
    for (size_t t = 0; t < n;) { /* the first append, then 1, 7, 13, ... tokens at a time */
        const size_t k = t == 0 ? first : (t % 29) + 1 < n - t ? (t % 29) + 1 : n - t;
        assert_int_equal(e8kv_cache_append(c, 0, K + t * row, V + t * row, k), t + k);
        assert_int_equal(e8kv_cache_append(ev, 0, K + t * row, V + t * row, k), t + k);
        assert_int_equal(e8kv_cache_append(win, 0, K + t * row, V + t * row, k), t + k);
        t += k;
    }
    const kv_layer *L = &c->layers[0];
    assert_non_null(L->k_rc);
    assert_int_equal(L->k.fast == KV_FAST_E8BOX && e8kv_codec_traits(L->k.codec)->attn_int, box);
    size_t diff = 0;
    for (size_t t = n_sink; t < n; t++)
        for (size_t h = 0; h < n_kv; h++) {
            const size_t at = h * c->n_page_max + t / 16;
            diff += memcmp(L->k_pages[at].data + (t % 16) * vb, KB + (t * n_kv + h) * vb, vb) != 0;
            diff += memcmp(L->v_pages[at].data + (t % 16) * vb, VB + (t * n_kv + h) * vb, vb) != 0;
        }
    if (diff) fail_msg("%s neox %d d %zu: %zu vectors differ from the reference", spec, neox, d, diff);
    size_t n_win = 0;
    for (size_t t = n_sink; t < n; t++)
        for (size_t h = 0; h < n_kv; h++) {
            const kv_page *pg = &win->layers[0].k_pages[h * win->n_page_max + t / 16];
            if (pg->raw) continue;
            n_win++;
            diff += memcmp(pg->data + (t % 16) * vb, KB + (t * n_kv + h) * vb, vb) != 0;
        }
    if (diff || n_win < n_kv * (n - 48)) fail_msg("%s: %zu of %zu window-coded vectors differ", window_spec, diff, n_win);
    /* attention over the reference's decode: the last nt tokens' queries */
    const shape s = {1, n_kv, n_head, d, 256};
    const size_t n_out = nt * n_head * d;
    float *q = rand_vec(&rng, n_out, box ? 0.3 : 1.0), *o = malloc(n_out * sizeof *o), *o2 = malloc(n_out * sizeof *o2);
    double *ref = malloc(n_out * sizeof *ref);
    naive_attend(&s, Kd, Vd, q, nt, n - nt, ref);
    assert_int_equal(e8kv_cache_attend(c, o, n_out, 0, q, n_head, nt, n - nt), n_out);
    const double e = max_abs_diff(o, ref, n_out);
    if (e > (box ? 1e-2 : 1e-4)) fail_msg("%s neox %d d %zu: attention vs reference %g", spec, neox, d, e);
    /* decode-sized call (one token over several slices is the other path of e8kv_cache_attend) */
    naive_attend(&s, Kd, Vd, q, 1, n - 1, ref);
    assert_int_equal(e8kv_cache_attend(c, o, n_out, 0, q, n_head, 1, n - 1), n_head * d);
    if (max_abs_diff(o, ref, n_head * d) > (box ? 1e-2 : 1e-4)) fail_msg("%s: decode attention", spec);
    if (c->use_avx2) { /* the portable tiles and bias too */
        c->use_avx2 = c->use_vnni = 0;
        assert_int_equal(e8kv_cache_attend(c, o, n_out, 0, q, n_head, 1, n - 1), n_head * d);
        if (max_abs_diff(o, ref, n_head * d) > (box ? 1e-2 : 1e-4))
            fail_msg("%s: portable decode attention", spec);
        c->use_avx2 = 1, c->use_vnni = e8kv_cpu_has_avxvnni();
    }
    /* with a window: its raw pages are read exact (no centre, no bias) */
    {
        float *Kw = malloc(n * row * sizeof *Kw), *Vw = malloc(n * row * sizeof *Vw);
        memcpy(Kw, Kd, n * row * sizeof *Kw);
        memcpy(Vw, Vd, n * row * sizeof *Vw);
        for (size_t t = 0; t < n; t++)
            for (size_t h = 0; h < n_kv; h++)
                if (win->layers[0].k_pages[h * win->n_page_max + t / 16].raw) {
                    memcpy(Kw + t * row + h * d, K + t * row + h * d, d * sizeof *Kw);
                    memcpy(Vw + t * row + h * d, V + t * row + h * d, d * sizeof *Vw);
                }
        naive_attend(&s, Kw, Vw, q, nt, n - nt, ref);
        assert_int_equal(e8kv_cache_attend(win, o, n_out, 0, q, n_head, nt, n - nt), n_out);
        if (max_abs_diff(o, ref, n_out) > (box ? 1e-2 : 1e-4))
            fail_msg("%s: attention with a window", window_spec);
        free(Kw);
        free(Vw);
    }
    /* save / load: the same bits */
    {
        size_t sz = 0;
        uint8_t *file = test_cache_save(c, &sz, NULL, 0);
        e8kv_cache *r = e8kv_cache_load(file, sz, 1, &err);
        if (!r) fail_msg("load %s: %s", spec, e8kv_error_name(err));
        assert_int_equal(e8kv_cache_attend(c, o, n_out, 0, q, n_head, nt, n - nt), n_out);
        assert_int_equal(e8kv_cache_attend(r, o2, n_out, 0, q, n_head, nt, n - nt), n_out);
        assert_memory_equal(o, o2, n_out * sizeof *o);
        e8kv_cache_free(r);
        /* into a cache of other turns: SPEC, the cache untouched (theta for frequencies, or the reverse) */
        float other[64];
        llama3_freqs(other, d, 10000.0, 64.0);
        e8kv_cache_params q2 = p;
        q2.spec = spec, q2.rope_freqs = freqs ? NULL : other, q2.rope_theta = freqs ? 10000.0f : 0.0f;
        e8kv_cache *x = e8kv_cache_create(&q2, &err);
        assert_non_null(x);
        assert_int_equal(e8kv_get_error_code(e8kv_cache_load_into(x, file, sz)), E8KV_ERROR_SPEC);
        assert_int_equal(e8kv_cache_n_tokens(x, 0), 0);
        e8kv_cache_free(x);
        free(file);
    }
    /* eviction keeps the kept tokens' bytes and reads them at their own positions */
    assert_false(e8kv_is_error(e8kv_cache_evict(ev, NULL, 0, 0, 0)));
    const kv_layer *E = &ev->layers[0];
    assert_true(E->n_tokens < n && E->n_map == E->n_tokens);
    size_t moved = 0;
    for (size_t h = 0; h < n_kv; h++)
        for (size_t j = n_sink; j < E->n_tokens; j++) {
            const size_t pos = kv_slot_pos(E, h, j);
            moved += pos != j;
            const uint8_t *code = E->k_pages[h * ev->n_page_max + j / 16].data + (j % 16) * vb;
            if (memcmp(code, KB + (pos * n_kv + h) * vb, vb)) fail_msg("evicted %s: slot %zu (position %zu)", spec, j, pos);
            float y[128];
            e8kv_cache_read_tokens(ev, E, h, 1, j, 1, y);
            if (E->k.rotated) e8kv_fmt_inverse(&E->k, h, d, y, 1);
            for (size_t i = 0; i < d; i++) {
                const float want = Kd[pos * row + h * d + i];
                if (fabsf(y[i] - want) > 1e-4f * (1.0f + fabsf(want)))
                    fail_msg("evicted %s: slot %zu (position %zu) reads %g, want %g", spec, j, pos, y[i], want);
            }
        }
    assert_true(moved > 0);
    /* the reads' cos, sin (two tables, one product) against RoPE's own, past n_ctx too */
    {
        float *ex = malloc(600 * d * sizeof *ex), rd[128];
        e8kv_cache_rc_exact(c, 0, 600, ex);
        double worst = 0.0;
        for (size_t pos = 0; pos < 600; pos++) {
            e8kv_cache_rc_cos_sin(c, pos, rd);
            for (size_t i = 0; i < d; i++)
                worst = fmax(worst, fabs((double)rd[i] - ex[pos * d + i]));
        }
        if (worst > 1e-6) fail_msg("%s: reads' cos/sin off RoPE's by %g", spec, worst);
        free(ex);
    }
    /* a first append of fewer than E8KV_CACHE_CENTER_MIN_TOKENS: no means, so center=1's output */
    e8kv_cache_clear(c);
    e8kv_cache_clear(plain);
    for (size_t t = 0; t < n; t += 10) {
        assert_int_equal(e8kv_cache_append(c, 0, K + t * row, V + t * row, 10), t + 10);
        assert_int_equal(e8kv_cache_append(plain, 0, K + t * row, V + t * row, 10), t + 10);
    }
    assert_int_equal(e8kv_cache_attend(c, o, n_out, 0, q, n_head, nt, n - nt), n_out);
    assert_int_equal(e8kv_cache_attend(plain, o2, n_out, 0, q, n_head, nt, n - nt), n_out);
    assert_memory_equal(o, o2, n_out * sizeof *o);
    (void)g;
    e8kv_cache_free(c);
    e8kv_cache_free(plain);
    e8kv_cache_free(ev);
    e8kv_cache_free(win);
    e8kv_codec_free(cc);
    e8kv_rope_free(rp);
    free(K), free(V), free(m), free(tmp), free(mk), free(mv), free(KB), free(VB), free(Kd), free(Vd);
    free(turned), free(q), free(o), free(o2), free(ref);
}

static void test_rope_centre(void **state) {
    (void)state;
    for (int neox = 0; neox < 2; neox++) {
        rope_centre_case("e8box:4", 1, neox, 64, NULL);
        rope_centre_case("e8box:3", 0, neox, 64, NULL);
    }
    rope_centre_case("e8box:4", 1, 0, 128, NULL);
    rope_centre_case("e8:4", 0, 1, 128, NULL);
    /* a scaled RoPE's frequencies (params.rope_freqs, rope_theta 0): Llama 3.1's llama3 type */
    float freqs[64];
    llama3_freqs(freqs, 128, 500000.0, 64.0);
    rope_centre_case("e8box:4", 1, 1, 128, freqs);
    llama3_freqs(freqs, 64, 10000.0, 64.0);
    rope_centre_case("e8box:3", 0, 0, 64, freqs);
    /* frequencies that are not finite or negative: BAD_ARGUMENT */
    freqs[5] = NAN;
    e8kv_cache_params bp = {.n_layer = 1,
                            .n_head_kv = 1,
                            .head_dim = 64,
                            .n_ctx = 64,
                            .spec = "e8box:4,center=rope",
                            .rope_freqs = freqs};
    size_t berr = 0;
    assert_null(e8kv_cache_create(&bp, &berr));
    assert_int_equal(e8kv_get_error_code(berr), E8KV_ERROR_BAD_ARGUMENT);
    freqs[5] = -1.0f;
    assert_null(e8kv_cache_create(&bp, &berr));
    assert_int_equal(e8kv_get_error_code(berr), E8KV_ERROR_BAD_ARGUMENT);
    /* refused: keys before RoPE, no RoPE, a head too small for 8 pairs */
    static const struct {
        const char *spec;
        float theta;
        size_t d;
    } bad[] = {{"e8box:4,center=rope,rope=pre", 1e4f, 64}, {"e8box:4,center=rope", 0.0f, 64},
               {"e8:4,center=rope", 1e4f, 8}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e8kv_cache_params p = {.n_layer = 1, .n_head_kv = 1, .head_dim = bad[i].d, .n_ctx = 64,
                               .spec = bad[i].spec, .rope_theta = bad[i].theta};
        size_t err = 0;
        e8kv_cache *c = e8kv_cache_create(&p, &err);
        if (c || e8kv_get_error_code(err) != E8KV_ERROR_SPEC)
            fail_msg("%s (theta %g, d %zu): %s", bad[i].spec, bad[i].theta, bad[i].d, c ? "accepted" : e8kv_error_name(err));
    }
}

/* rope= default: keys before RoPE when the caller gives RoPE's parameters and K is coded; else post. */
static void test_rope_default(void **state) {
    (void)state;
    static const struct {
        const char *spec;
        float theta;
        int want;
    } cases[] = {{"e8:4", 10000.0f, 1},          {"e8:4", 0.0f, 0},           {"f16", 10000.0f, 0},
                 {"f32", 10000.0f, 0},           {"e8:4,rope=post", 1e4f, 0}, {"k=f16,v=e8:3", 1e4f, 0},
                 {"k=q4_0h,v=f16", 10000.0f, 0}, {"f16,rope=pre", 1e4f, 1},   {"balanced", 1e4f, 1},
                 {"k=lloyd:4,v=f16", 1e4f, 1},   {"q8_0,rope=pre", 1e4f, 1},  {"near-lossless", 1e4f, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        e8kv_cache_params p = {0};
        p.n_layer = 1;
        p.n_head_kv = 1;
        p.head_dim = 64;
        p.n_ctx = 64;
        p.spec = cases[i].spec;
        p.rope_theta = cases[i].theta;
        size_t err = 0;
        e8kv_cache *c = e8kv_cache_create(&p, &err);
        assert_non_null(c);
        if (e8kv_cache_keys_pre_rope(c) != cases[i].want)
            fail_msg("%s theta %g: keys_pre_rope %d", cases[i].spec, cases[i].theta,
                     e8kv_cache_keys_pre_rope(c));
        e8kv_cache_free(c);
    }
    assert_int_equal(e8kv_cache_keys_pre_rope(NULL), 0);
    /* a scaled RoPE's frequencies alone (rope_theta 0) are RoPE's parameters too */
    float freqs[32];
    llama3_freqs(freqs, 64, 500000.0, 64.0);
    e8kv_cache_params p = {
        .n_layer = 1, .n_head_kv = 1, .head_dim = 64, .n_ctx = 64, .spec = "e8:4", .rope_freqs = freqs};
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_create(&p, &err);
    assert_non_null(c);
    assert_int_equal(e8kv_cache_keys_pre_rope(c), 1);
    e8kv_cache_free(c);
}

/* The centering add-back twins: one float add per element, so bit-exact. */
static void test_add_rows_twins(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) skip();
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 99);
    const size_t d = 128, n = 37;
    float *a = rand_vec(&rng, n * d, 3.0), *mu = rand_vec(&rng, d, 10.0);
    float *b = malloc(n * d * sizeof(float));
    memcpy(b, a, n * d * sizeof(float));
    e8kv_cache_add_rows_ref(a, mu, n, d);
    e8kv_cache_add_rows_avx2(b, mu, n, d);
    assert_memory_equal(a, b, n * d * sizeof(float));
    free(a);
    free(b);
    free(mu);
}

/* ---------------------------------------------------------------- e8box:4 integer-domain attention */

/* Random e8box:4 vectors (codes of N(0, sd) data through the codec), n of them, d values each. */
static uint8_t *box_codes(e8kv_rng *rng, size_t n, size_t d, double sd) {
    size_t err = 0;
    e8kv_codec *c = e8kv_codec_create("e8box:4", d, 5, &err);
    assert_non_null(c);
    const size_t vb = e8kv_codec_vector_bytes(c);
    float *x = rand_vec(rng, n * d, sd);
    uint8_t *b = malloc(n * vb);
    assert_int_equal(e8kv_codec_encode(c, b, n * vb, x, n), n * vb);
    free(x);
    e8kv_codec_free(c);
    return b;
}

/* A fast tile against the reference tile: the same integers, so only float rounding and exp's last bits
 * differ (m within 1e-6 relative, l and acc within 1e-5); several tiles chained, centering means, 1, 3, 4
 * and 9 queries (one query alone, the GQA groups of the benchmark shapes and more). */
typedef void (*box_tile_fn)(const e8kv_box_query *, size_t, const uint8_t *, const uint8_t *, size_t, size_t,
                            size_t, const float *, const float *, float *, float *, float *const *);

static void check_box_tile_twin(box_tile_fn fast) {
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 31);
    static const size_t nqs[] = {1, 3, 4, 9};
    for (size_t d = 64; d <= 128; d += 64)
        for (size_t qi = 0; qi < 4; qi++) {
            const size_t nq = nqs[qi], vb = 1 + d / 64 + d / 2;
            e8kv_box_query bq[9];
            float m1[9], m2[9], l1[9], l2[9], *a1[9], *a2[9];
            float *mu_k = rand_vec(&rng, d, 0.5), *mu_v = rand_vec(&rng, d, 0.5);
            for (size_t g = 0; g < nq; g++) {
                float *q = rand_vec(&rng, d, 0.4);
                e8kv_box_query_init(&bq[g], q, g % 2 ? mu_k : NULL, d);
                free(q);
                m1[g] = m2[g] = -INFINITY;
                l1[g] = l2[g] = 0.0f;
                a1[g] = calloc(d, sizeof(float));
                a2[g] = calloc(d, sizeof(float));
            }
            /* tiles of 1, 22, 43, 64 tokens (none a multiple of 8 but the last) into the same state */
            for (size_t n = 1; n <= 64; n += 21) {
                uint8_t *k = box_codes(&rng, n, d, 1.0 + (double)n / 10), *v = box_codes(&rng, n, d, 1.0);
                /* center=rope's score bias on every other tile (n 22, 64), 0 past n */
                float *bias = (n % 2 == 0) ? rand_vec(&rng, nq * 64, 0.8) : NULL;
                for (size_t g = 0; bias && g < nq; g++)
                    for (size_t j = n; j < 64; j++)
                        bias[g * 64 + j] = 0.0f;
                e8kv_attn_box_tile_ref(bq, nq, k, v, vb, n, d, nq > 1 ? mu_v : NULL, bias, m1, l1, a1);
                fast(bq, nq, k, v, vb, n, d, nq > 1 ? mu_v : NULL, bias, m2, l2, a2);
                free(bias);
                free(k);
                free(v);
            }
            for (size_t g = 0; g < nq; g++) {
                assert_float_equal(m1[g], m2[g], 1e-6 * (1.0 + fabs(m1[g])));
                assert_float_equal(l1[g], l2[g], 1e-5 * l1[g]);
                for (size_t i = 0; i < d; i++)
                    assert_float_equal(a1[g][i], a2[g][i], 1e-5 * (1.0 + fabs(a1[g][i])));
                free(a1[g]);
                free(a2[g]);
            }
            free(mu_k);
            free(mu_v);
        }
}

static void test_box_tile_twins(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) skip();
    check_box_tile_twin(e8kv_attn_box_tile_avx2);
}

/* The AVX-VNNI tile (skipped where the CPU or the compiler lacks AVX-VNNI) */
static void test_box_tile_vnni_twin(void **state) {
    (void)state;
#ifdef E8KV_HAVE_AVXVNNI
    if (!e8kv_cpu_has_avxvnni()) skip();
    check_box_tile_twin(e8kv_attn_box_tile_vnni);
#else
    skip();
#endif
}

/* Whole attention through the integer-domain path (e8box:4, keys read in the rotated domain) against
 * naive attention over what the codec reconstructs. The int8 query moves each score by ~|q|·|k|/254/√3
 * and the 7-bit weights each weight by ≤ 1/254 of its tile's largest: with queries of unit spread
 * (scores of spread ~1, as scaled attention logits) the largest output difference measured is 0.0045 on
 * values of unit spread (0.018 with the sharper queries of spread 2 the other formats are checked with,
 * the error growing with the logits' spread); bound 0.01. Decode and chunked prefill (tiles the causal mask
 * cuts fall back to the float path), 1 and 3 threads. */
static void test_box_attention(void **state) {
    (void)state;
    assert_true(check_spec_q("e8box:4", "e8box:4", "e8box:4", 1, 1e-2, 1.0));
    assert_true(check_spec_q("e8box:4", "e8box:4", "e8box:4", 3, 1e-2, 1.0));
    /* and the path is really taken: the fused tiles differ from the float path by the quantization */
    const shape s = {1, 2, 6, 64, 300};
    size_t err = 0;
    e8kv_cache *c = make_cache(&s, "e8box:4", 1, &err);
    assert_non_null(c);
    assert_int_equal(c->layers[0].k.fast, KV_FAST_E8BOX);
    assert_true(c->layers[0].k.rotated);
    e8kv_cache_free(c);
}

/* ---------------------------------------------------------------- remove a range */

/* A cache after e8kv_cache_remove(pos, cnt) attends exactly like a cache given the same tokens without
 * the range (f32; coded formats without centering, whose codes are per vector; keys before RoPE, which
 * take their new positions), and allocates the same bytes. */
static void check_remove(const char *spec, float theta, size_t pos, size_t cnt_asked) {
    const shape s = {2, 2, 6, 64, 400};
    const size_t n = 300, row = s.n_head_kv * s.d, cnt = cnt_asked < n - pos ? cnt_asked : n - pos;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 55);
    float *K[2], *V[2], *K2[2], *V2[2];
    for (size_t l = 0; l < 2; l++) {
        K[l] = rand_vec(&rng, n * row, 1.0);
        V[l] = rand_vec(&rng, n * row, 1.0);
        K2[l] = malloc((n - cnt) * row * sizeof(float));
        V2[l] = malloc((n - cnt) * row * sizeof(float));
        memcpy(K2[l], K[l], pos * row * sizeof(float));
        memcpy(V2[l], V[l], pos * row * sizeof(float));
        memcpy(K2[l] + pos * row, K[l] + (pos + cnt) * row, (n - pos - cnt) * row * sizeof(float));
        memcpy(V2[l] + pos * row, V[l] + (pos + cnt) * row, (n - pos - cnt) * row * sizeof(float));
    }
    e8kv_cache_params p = {.n_layer = 2,
                           .n_head_kv = 2,
                           .head_dim = 64,
                           .n_ctx = 400,
                           .spec = spec,
                           .seed = 3,
                           .rope_theta = theta};
    size_t err = 0;
    e8kv_cache *a = e8kv_cache_create(&p, &err), *b = e8kv_cache_create(&p, &err);
    assert_non_null(a);
    assert_non_null(b);
    fill(a, &s, K, V, n);
    fill(b, &s, K2, V2, n - cnt);
    assert_int_equal(e8kv_cache_remove(a, pos, cnt_asked), n - cnt);
    assert_int_equal(e8kv_cache_bytes(a), e8kv_cache_bytes(b));
    const size_t n_out = s.n_head * s.d;
    float *q = rand_vec(&rng, n_out, 1.0), *o1 = malloc(n_out * sizeof(float)),
          *o2 = malloc(n_out * sizeof(float));
    for (size_t l = 0; l < 2; l++) {
        assert_int_equal(e8kv_cache_attend(a, o1, n_out, l, q, s.n_head, 1, n - cnt - 1), n_out);
        assert_int_equal(e8kv_cache_attend(b, o2, n_out, l, q, s.n_head, 1, n - cnt - 1), n_out);
        assert_memory_equal(o1, o2, n_out * sizeof(float));
    }
    /* and it keeps appending like the other */
    float *k1 = rand_vec(&rng, row, 1.0), *v1 = rand_vec(&rng, row, 1.0);
    for (size_t l = 0; l < 2; l++) {
        assert_int_equal(e8kv_cache_append(a, l, k1, v1, 1), n - cnt + 1);
        assert_int_equal(e8kv_cache_append(b, l, k1, v1, 1), n - cnt + 1);
        assert_int_equal(e8kv_cache_attend(a, o1, n_out, l, q, s.n_head, 1, n - cnt), n_out);
        assert_int_equal(e8kv_cache_attend(b, o2, n_out, l, q, s.n_head, 1, n - cnt), n_out);
        assert_memory_equal(o1, o2, n_out * sizeof(float));
    }
    for (size_t l = 0; l < 2; l++) {
        free(K[l]);
        free(V[l]);
        free(K2[l]);
        free(V2[l]);
    }
    free(q);
    free(o1);
    free(o2);
    free(k1);
    free(v1);
    e8kv_cache_free(a);
    e8kv_cache_free(b);
}

/* With an exact window, every position afterwards holds either its token exactly (raw page) or the
 * codec's reconstruction of it (coded page): moved window tokens that land among coded ones are coded. */
static void test_remove_window(void **state) {
    (void)state;
    const shape s = {1, 2, 6, 64, 400};
    const size_t n = 300, row = s.n_head_kv * s.d, pos = 150, cnt = 100;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 56);
    float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 1.0);
    float *Kd = codec_roundtrip("q8_0", s.d, 3, K, n * s.n_head_kv),
          *Vd = codec_roundtrip("q8_0", s.d, 3, V, n * s.n_head_kv);
    e8kv_cache_params p = {
        .n_layer = 1, .n_head_kv = 2, .head_dim = 64, .n_ctx = 400, .spec = "q8_0,window=70", .seed = 3};
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_create(&p, &err);
    assert_non_null(c);
    fill(c, &s, &K, &V, n);
    assert_int_equal(e8kv_cache_remove(c, pos, cnt), n - cnt);
    float y[64];
    size_t n_exact = 0, n_coded = 0;
    for (size_t t = 0; t < n - cnt; t++) {
        const size_t src = t < pos ? t : t + cnt;
        for (size_t h = 0; h < 2; h++)
            for (int is_k = 0; is_k < 2; is_k++) {
                e8kv_cache_read_tokens(c, &c->layers[0], h, is_k, t, 1, y);
                const float *x = (is_k ? K : V) + src * row + h * s.d,
                            *xd = (is_k ? Kd : Vd) + src * row + h * s.d;
                if (!memcmp(y, x, sizeof y))
                    n_exact++;
                else if (!memcmp(y, xd, sizeof y))
                    n_coded++;
                else
                    fail_msg("position %zu (from %zu) head %zu %s: neither exact nor coded", t, src, h,
                             is_k ? "K" : "V");
            }
    }
    assert_true(n_exact > 0 && n_coded > 0);
    free(K);
    free(V);
    free(Kd);
    free(Vd);
    e8kv_cache_free(c);
}

static void test_remove(void **state) {
    (void)state;
    check_remove("f32", 0.0f, 100, 50);
    check_remove("f32", 0.0f, 0, 300 - 1); /* all but the last token */
    check_remove("f32", 0.0f, 250, 80);    /* a range past the end is cut at the end */
    check_remove("e8:4,center=0", 0.0f, 64, 64);
    check_remove("e8box:4,center=0", 0.0f, 33, 70);
    check_remove("f32,rope=pre", 10000.0f, 10, 5);    /* keys before RoPE take their new positions */
    check_remove("e8:4,center=0", 10000.0f, 70, 130); /* e8:4 codes keys before RoPE by default */
}

static void test_remove_errors(void **state) {
    (void)state;
    const shape s = {1, 2, 6, 64, 400};
    const size_t n = 100, row = s.n_head_kv * s.d;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 57);
    float *K = rand_vec(&rng, n * row, 1.0), *V = rand_vec(&rng, n * row, 1.0);
    size_t err = 0;
    assert_error(e8kv_cache_remove(NULL, 0, 1), BAD_ARGUMENT);
    e8kv_cache_params p = {.n_layer = 1,
                           .n_head_kv = 2,
                           .head_dim = 64,
                           .n_ctx = 400,
                           .spec = "f16",
                           .seed = 3,
                           .rope_theta = 10000.0f};
    e8kv_cache *post = e8kv_cache_create(&p, &err); /* f16 keys default to post-RoPE: they carry RoPE */
    assert_non_null(post);
    fill(post, &s, &K, &V, n);
    const size_t bytes = e8kv_cache_bytes(post);
    assert_error(e8kv_cache_remove(post, 10, 5), UNSUPPORTED);
    assert_int_equal(e8kv_cache_n_tokens(post, 0), n); /* nothing changed */
    assert_int_equal(e8kv_cache_bytes(post), bytes);
    p.spec = "e8:4,sink=4";
    e8kv_cache *sink = e8kv_cache_create(&p, &err);
    assert_non_null(sink);
    fill(sink, &s, &K, &V, n);
    assert_error(e8kv_cache_remove(sink, 2, 5), UNSUPPORTED); /* inside the exact sink positions */
    assert_int_equal(e8kv_cache_remove(sink, 4, 5), n - 5);   /* right after them: fine */
    assert_int_equal(e8kv_cache_remove(sink, 0, 0), n - 5);   /* nothing to remove */
    assert_int_equal(e8kv_cache_remove(sink, 500, 5), n - 5); /* positions no layer holds */
    free(K);
    free(V);
    e8kv_cache_free(post);
    e8kv_cache_free(sink);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_exact),
        cmocka_unit_test(test_f16_and_mixed),
        cmocka_unit_test(test_spec_layers),
        cmocka_unit_test(test_spec_evict),
        cmocka_unit_test(test_compressed_specs),
        cmocka_unit_test(test_causal_mask),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_truncate_clear),
        cmocka_unit_test(test_window_sink_layers),
        cmocka_unit_test(test_rope_pre),
        cmocka_unit_test(test_bytes_accounting),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_tile_avx2_vs_ref),
        cmocka_unit_test(test_fused_readers),
        cmocka_unit_test(test_context_split_threads),
        cmocka_unit_test(test_prefill_threads),
        cmocka_unit_test(test_e8ball4_nibble_reader),
        cmocka_unit_test(test_centering),
        cmocka_unit_test(test_rope_centre),
        cmocka_unit_test(test_rc_bias_twins),
        cmocka_unit_test(test_rope_default),
        cmocka_unit_test(test_add_rows_twins),
        cmocka_unit_test(test_box_tile_twins),
        cmocka_unit_test(test_box_tile_vnni_twin),
        cmocka_unit_test(test_box_attention),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_remove_window),
        cmocka_unit_test(test_remove_errors),
        cmocka_unit_test(test_learned_sinks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
