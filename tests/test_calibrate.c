/* engine/calibrate: a model's calibration and its sensitivity probes on stories260K (shared data; skipped
 * when missing). The probes' coefficients must equal KLD x 4^rate of the same probe run directly through
 * the perplexity protocol (engine/ppl.h) stream by stream, K of every layer then V; a probe spec of any
 * length the cache takes is used whole; malformed probes are named errors. */
#include "test_util.h"

#include "calibrate.h"
#include "model.h"
#include "ppl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CTX 64

typedef struct {
    e8kv_model *m;
    int32_t *tokens;
    size_t n_tokens;
    e8kv_calib *cal;
} fixture;

static int setup(void **state) {
    static fixture f;
    memset(&f, 0, sizeof f);
    *state = &f;
    const char *p = test_data_path("stories260K/stories260K.bin");
    if (!p) return 0;
    char msg[256];
    if (e8kv_is_error(e8kv_model_load(&f.m, p, msg, sizeof msg))) return -1;
    /* token ids drawn at random from the vocabulary: any text will do for these checks */
    f.n_tokens = 8 * N_CTX;
    f.tokens = malloc(f.n_tokens * sizeof *f.tokens);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 5);
    for (size_t i = 0; i < f.n_tokens; i++)
        f.tokens[i] = (int32_t)(3 + e8kv_rng_next(&rng) % (f.m->cfg.vocab_size - 3));
    const e8kv_calibrate_params cp = {.n_ctx = N_CTX, .n_chunks = 4, .n_threads = 1};
    size_t err = 0;
    f.cal = e8kv_calibrate_model(f.m, f.tokens, f.n_tokens, &cp, &err);
    return f.cal ? 0 : -1;
}

static int teardown(void **state) {
    fixture *f = *state;
    e8kv_calib_free(f->cal);
    free(f->tokens);
    e8kv_model_free(f->m);
    return 0;
}

#define SKIP_WITHOUT_MODEL(f)                                                                                \
    do {                                                                                                     \
        if (!(f)->m) {                                                                                       \
            print_message("stories260K missing under E8KV_SHARED_DATA: skipped\n");                          \
            skip();                                                                                          \
        }                                                                                                    \
    } while (0)

/* Probes with `probe` on a copy of the calibration; the coefficients (K of every layer, then V) go to c. */
static size_t probe_into(const fixture *f, const char *probe, size_t sink, double *c) {
    void *buf = malloc(e8kv_calib_save_bound(f->cal));
    const size_t n = e8kv_calib_save(buf, e8kv_calib_save_bound(f->cal), f->cal);
    assert_ok(n);
    size_t err = 0;
    e8kv_calib *cal = e8kv_calib_load(buf, n, &err);
    free(buf);
    assert_non_null(cal);
    const e8kv_sensitivity_params sp = {
        .n_ctx = N_CTX, .n_chunks = 2, .probe = probe, .sink = sink, .n_threads = 1};
    const size_t r = e8kv_calibrate_sensitivity(f->m, f->tokens, f->n_tokens, cal, &sp);
    const size_t L = f->m->cfg.n_layer;
    for (size_t s = 0; s < 2 * L && !e8kv_is_error(r); s++)
        c[s] = e8kv_calib_sensitivity(cal, s % L, s >= L);
    e8kv_calib_free(cal);
    return r;
}

static void test_calibration(void **state) {
    fixture *f = *state;
    SKIP_WITHOUT_MODEL(f);
    size_t n_layer = 0, n_head_kv = 0, head_dim = 0, n_tok = 0;
    e8kv_calib_info(f->cal, &n_layer, &n_head_kv, &head_dim, &n_tok);
    assert_int_equal(n_layer, f->m->cfg.n_layer);
    assert_int_equal(n_head_kv, f->m->cfg.n_head_kv);
    assert_int_equal(head_dim, f->m->cfg.head_dim);
    assert_int_equal(n_tok, 4 * N_CTX);
    assert_non_null(e8kv_calib_query_energy(f->cal, 0, 0));
    const e8kv_calibrate_params bad = {.n_ctx = 8, .n_chunks = 1};
    size_t err = 0;
    assert_null(e8kv_calibrate_model(f->m, f->tokens, f->n_tokens, &bad, &err));
    assert_error(err, BAD_ARGUMENT);
    const e8kv_calibrate_params few = {.n_ctx = N_CTX, .n_chunks = 1};
    assert_null(e8kv_calibrate_model(f->m, f->tokens, N_CTX - 1, &few, &err));
    assert_error(err, SRC_SIZE);
}

/* Each coefficient is KLD x 4^rate of the stream alone coded with the probe, as a ppl run measures it. */
static void test_probes_match_ppl(void **state) {
    fixture *f = *state;
    SKIP_WITHOUT_MODEL(f);
    const size_t L = f->m->cfg.n_layer;
    double c[64];
    assert_ok(probe_into(f, "e8tv:2", 1, c));
    char specs[64][96];
    const char *ptr[64];
    for (size_t s = 0; s < 2 * L; s++) {
        snprintf(specs[s], sizeof specs[s], "f32,sink=1,rope=pre,layer%zu.%c=e8tv:2", s % L,
                 s < L ? 'k' : 'v');
        ptr[s] = specs[s];
    }
    e8kv_ppl_result res[64];
    const e8kv_ppl_params pp = {
        .n_ctx = N_CTX, .n_chunks = 2, .n_threads = 1, .specs = ptr, .n_specs = 2 * L, .calib = f->cal};
    assert_int_equal(e8kv_ppl_run(f->m, f->tokens, f->n_tokens, &pp, res), 2);
    double total = 0.0;
    for (size_t s = 0; s < 2 * L; s++) {
        assert_int_equal(res[s].status, 0);
        const double want = (res[s].kld > 0.0 ? res[s].kld : 0.0) * 16.0;
        if (!(fabs(c[s] - want) <= 1e-9 * (want > 1.0 ? want : 1.0)))
            fail_msg("stream %zu (%s): coefficient %.9g, ppl run %.9g", s, ptr[s], c[s], want);
        assert_true(isfinite(c[s]) && c[s] >= 0.0);
        total += c[s];
    }
    assert_true(total > 0.0); /* coding any stream at 2 bits moves the logits */
}

/* A probe is used whole whatever its length (the probe specs were once cut at 95 characters): a rate
 * written with many leading zeros is the same probe. */
static void test_long_probe(void **state) {
    fixture *f = *state;
    SKIP_WITHOUT_MODEL(f);
    const size_t L = f->m->cfg.n_layer;
    double a[64], b[64];
    char probe[64] = "e8tv:";
    while (strlen(probe) < 62)
        strcat(probe, "0");
    strcat(probe, "2");
    assert_int_equal(strlen(probe), 63);
    assert_ok(probe_into(f, "e8tv:2", 1000000, a));
    assert_ok(probe_into(f, probe, 1000000, b));
    for (size_t s = 0; s < 2 * L; s++)
        assert_true(a[s] == b[s]);
}

static void test_bad_probes(void **state) {
    fixture *f = *state;
    SKIP_WITHOUT_MODEL(f);
    double c[64];
    assert_error(probe_into(f, "bogus", 1, c), BAD_ARGUMENT);         /* not FAMILY:RATE */
    assert_error(probe_into(f, "e8tv:0", 1, c), BAD_ARGUMENT);        /* no rate */
    assert_error(probe_into(f, "e8tv:2,sink=3", 1, c), BAD_ARGUMENT); /* a cache spec, not a format */
    assert_error(probe_into(f, "nope:2", 1, c), SPEC);                /* the first probe's own error */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibration),
        cmocka_unit_test(test_probes_match_ppl),
        cmocka_unit_test(test_long_probe),
        cmocka_unit_test(test_bad_probes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
