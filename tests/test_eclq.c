/* quant/eclq: the empirical entropy estimator against closed forms (hand-computed histograms, the
 * discrete entropy of a uniformly quantized Gaussian computed from erfc), the parity-aware E8 rate on
 * hand-built point sets, the step search hitting its target, D8* against E8 (DESIGN.md), and errors. */
#include "test_util.h"

#include "common/common.h"
#include "common/rng.h"
#include "eclq.h"

#include <math.h>

static float *gauss(size_t n, uint64_t seed) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)e8kv_rng_normal(&rng);
    return x;
}

static void test_entropy_from_counts(void **state) {
    (void)state;
    const uint64_t fair[2] = {7, 7};
    assert_float_equal(e8kv_entropy_from_counts(fair, 2), 1.0, 1e-12);
    const uint64_t skew[2] = {3, 1}; /* H(1/4) = 2 − (3/4)·log2 3 */
    assert_float_equal(e8kv_entropy_from_counts(skew, 2), 2.0 - 0.75 * 1.5849625007211562, 1e-12);
    const uint64_t eight[8] = {5, 5, 5, 5, 5, 5, 5, 5};
    assert_float_equal(e8kv_entropy_from_counts(eight, 8), 3.0, 1e-12);
    const uint64_t dyadic[4] = {4, 2, 1, 1}; /* 1/2·1 + 1/4·2 + 2·1/8·3 = 1.75 */
    assert_float_equal(e8kv_entropy_from_counts(dyadic, 4), 1.75, 1e-12);
    const uint64_t one[3] = {0, 9, 0};
    assert_float_equal(e8kv_entropy_from_counts(one, 3), 0.0, 1e-15);
    const uint64_t none[3] = {0, 0, 0};
    assert_float_equal(e8kv_entropy_from_counts(none, 3), 0.0, 1e-15);
}

/* Uniform scalar quantization of N(0,1) with step δ: P(k) = Φ((k+½)δ) − Φ((k−½)δ). */
static void test_scalar_entropy_gaussian(void **state) {
    (void)state;
    const size_t n = (size_t)1 << 18;
    float *x = gauss(n, 11);
    int32_t *y2 = malloc(n * sizeof *y2);
    const double steps[3] = {0.25, 0.5, 1.0};
    for (int s = 0; s < 3; s++) {
        const double d = steps[s];
        double h_ref = 0.0;
        for (int k = -60; k <= 60; k++) {
            const double p = 0.5 * (erfc(-(k + 0.5) * d / sqrt(2.0)) - erfc(-(k - 0.5) * d / sqrt(2.0)));
            if (p > 0.0) h_ref -= p * log2(p);
        }
        assert_int_equal(e8kv_eclq_quantize(y2, x, n, d, E8KV_ECLQ_Z), n);
        double h = 0.0;
        assert_ok(e8kv_eclq_entropy(&h, y2, n, E8KV_ECLQ_Z));
        if (fabs(h - h_ref) > 0.01) fail_msg("step %.2f: entropy %.4f, closed form %.4f", d, h, h_ref);
    }
    free(y2);
    free(x);
}

/* Point sets whose parity-aware rate is known by hand (doubled coordinates). */
static void test_parity_rate_by_hand(void **state) {
    (void)state;
    int32_t y[4 * 8] = {0};
    double h = 0.0;
    /* {0, (1,0,0,0,0,0,0,1)} twice each: y0 costs 1 bit, y7 is implied by the parity of y0..y6 */
    for (int b = 0; b < 4; b += 2)
        y[b * 8 + 0] = y[b * 8 + 7] = 2;
    assert_ok(e8kv_eclq_entropy(&h, y, 32, E8KV_ECLQ_E8));
    assert_float_equal(h, 1.0 / 8.0, 1e-12);
    /* D8* has no parity rule: y7 costs its own bit */
    assert_ok(e8kv_eclq_entropy(&h, y, 32, E8KV_ECLQ_D8STAR));
    assert_float_equal(h, 2.0 / 8.0, 1e-12);
    /* {0, (½,…,½)}: only the coset bit carries information */
    memset(y, 0, sizeof y);
    for (int j = 0; j < 8; j++)
        y[8 + j] = y[24 + j] = 1;
    assert_ok(e8kv_eclq_entropy(&h, y, 32, E8KV_ECLQ_E8));
    assert_float_equal(h, 1.0 / 8.0, 1e-12);
    /* odd coset: (½,…,½) and (−½,½,…,½,−½): y0 1 bit given c, y7 implied (Σ y2 ≡ 0 mod 4) */
    for (int b = 0; b < 4; b++)
        for (int j = 0; j < 8; j++)
            y[b * 8 + j] = 1;
    y[8] = y[15] = -1;
    y[24] = y[31] = -1;
    assert_ok(e8kv_eclq_entropy(&h, y, 32, E8KV_ECLQ_E8));
    assert_float_equal(h, 1.0 / 8.0, 1e-12);
    /* D4 {0, (1,0,0,1)}: 1 bit per 4 values */
    int32_t d4[8] = {0, 0, 0, 0, 2, 0, 0, 2};
    assert_ok(e8kv_eclq_entropy(&h, d4, 8, E8KV_ECLQ_D4));
    assert_float_equal(h, 1.0 / 4.0, 1e-12);
    /* not lattice points */
    int32_t bad[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    assert_error(e8kv_eclq_entropy(&h, bad, 8, E8KV_ECLQ_E8), CORRUPTED);
    assert_error(e8kv_eclq_entropy(&h, bad, 4, E8KV_ECLQ_D4), CORRUPTED);
    int32_t mixed[8] = {1, 0, 0, 0, 0, 0, 0, 1};
    assert_error(e8kv_eclq_entropy(&h, mixed, 8, E8KV_ECLQ_D8STAR), CORRUPTED);
    int32_t odd_scalar[1] = {3};
    assert_error(e8kv_eclq_entropy(&h, odd_scalar, 1, E8KV_ECLQ_Z), CORRUPTED);
}

/* On the same E8 codes, the D8* formula (no parity) costs H(y7|c) − H(y7|c,p) more: about one bit per
 * block at high rate, where y7's parity is close to a fair coin. */
static void test_parity_saving_on_gaussian(void **state) {
    (void)state;
    const size_t n = (size_t)1 << 17;
    float *x = gauss(n, 5);
    int32_t *y2 = malloc(n * sizeof *y2);
    const double step = e8kv_eclq_initial_step(E8KV_ECLQ_E8, 1.0, 4.0);
    assert_int_equal(e8kv_eclq_quantize(y2, x, n, step, E8KV_ECLQ_E8), n);
    double h_e8 = 0.0, h_relaxed = 0.0;
    assert_ok(e8kv_eclq_entropy(&h_e8, y2, n, E8KV_ECLQ_E8));
    assert_ok(e8kv_eclq_entropy(&h_relaxed, y2, n, E8KV_ECLQ_D8STAR));
    const double saving = (h_relaxed - h_e8) * 8.0;
    if (saving < 0.97 || saving > 1.0 + 1e-9) fail_msg("parity saving %.4f bit per block", saving);
    free(y2);
    free(x);
}

static void test_initial_step(void **state) {
    (void)state;
    const double s2pie = 4.132731354122493; /* sqrt(2πe) */
    assert_float_equal(e8kv_eclq_initial_step(E8KV_ECLQ_E8, 1.0, 4.0), s2pie / 16.0, 1e-12);
    assert_float_equal(e8kv_eclq_initial_step(E8KV_ECLQ_Z, 4.0, 2.0), 2.0 * s2pie / 4.0, 1e-12);
    assert_float_equal(e8kv_eclq_initial_step(E8KV_ECLQ_D4, 1.0, 3.0), s2pie / 8.0 / pow(2.0, 0.25), 1e-12);
    assert_float_equal(e8kv_eclq_initial_step(E8KV_ECLQ_D8STAR, 1.0, 3.0), s2pie / 8.0 * pow(2.0, 0.125),
                       1e-12);
    assert_true(e8kv_eclq_initial_step(E8KV_ECLQ_E8, 0.0, 3.0) == 0.0);
    assert_true(e8kv_eclq_initial_step((e8kv_eclq_lattice)9, 1.0, 3.0) == 0.0);
}

/* The search hits its target within 0.01 bit, and E8's MSE / D(R) meets the bars. */
static void test_step_for_rate(void **state) {
    (void)state;
    const size_t n = (size_t)1 << 18;
    float *x = gauss(n, 3);
    int32_t *y2 = malloc(n * sizeof *y2);
    const struct {
        e8kv_eclq_lattice lat;
        double bits, lo, hi; /* bounds on MSE / D(R) from DESIGN.md (theory 1.224 for E8, 1.423 for Z) */
    } cases[] = {
        {E8KV_ECLQ_E8, 4.0, 1.18, 1.24}, {E8KV_ECLQ_E8, 3.0, 1.18, 1.27}, {E8KV_ECLQ_E8, 2.0, 1.18, 1.36},
        {E8KV_ECLQ_Z, 4.0, 1.38, 1.50},  {E8KV_ECLQ_D4, 3.0, 1.25, 1.40}, {E8KV_ECLQ_D8STAR, 3.0, 1.22, 1.34},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        e8kv_eclq_point p;
        assert_ok(e8kv_eclq_step_for_rate(&p, y2, x, n, cases[i].lat, 1.0, cases[i].bits, 1e-3));
        if (fabs(p.bits_per_value - cases[i].bits) > 0.01)
            fail_msg("%s: rate %.4f for target %.1f", e8kv_eclq_name(cases[i].lat), p.bits_per_value,
                     cases[i].bits);
        /* empirical variance of this sample, as the bench uses */
        double m = 0.0, v = 0.0;
        for (size_t k = 0; k < n; k++)
            m += x[k];
        m /= (double)n;
        for (size_t k = 0; k < n; k++)
            v += ((double)x[k] - m) * ((double)x[k] - m);
        v /= (double)n;
        const double ratio = p.mse / (v * exp2(-2.0 * p.bits_per_value));
        if (ratio < cases[i].lo || ratio > cases[i].hi)
            fail_msg("%s at %.1f bits: MSE/D(R) = %.4f outside [%.2f, %.2f]", e8kv_eclq_name(cases[i].lat),
                     cases[i].bits, ratio, cases[i].lo, cases[i].hi);
    }
    free(y2);
    free(x);
}

/* DESIGN.md: D8* has twice E8's density, so at equal step it has lower MSE and a higher rate; at matched
 * rate strict E8 wins. */
static void test_relaxed_vs_strict(void **state) {
    (void)state;
    const size_t n = (size_t)1 << 17;
    float *x = gauss(n, 9);
    int32_t *y2 = malloc(n * sizeof *y2);
    const double steps[3] = {0.2, 0.4, 0.8};
    for (int s = 0; s < 3; s++) {
        e8kv_eclq_point e8, d8;
        assert_ok(e8kv_eclq_measure(&e8, y2, x, n, steps[s], E8KV_ECLQ_E8));
        assert_ok(e8kv_eclq_measure(&d8, y2, x, n, steps[s], E8KV_ECLQ_D8STAR));
        if (!(d8.mse < e8.mse) || !(d8.bits_per_value > e8.bits_per_value))
            fail_msg("step %.2f: D8* mse %.5f rate %.4f vs E8 mse %.5f rate %.4f", steps[s], d8.mse,
                     d8.bits_per_value, e8.mse, e8.bits_per_value);
    }
    e8kv_eclq_point e8, d8;
    assert_ok(e8kv_eclq_step_for_rate(&e8, y2, x, n, E8KV_ECLQ_E8, 1.0, 3.0, 1e-3));
    assert_ok(e8kv_eclq_step_for_rate(&d8, y2, x, n, E8KV_ECLQ_D8STAR, 1.0, e8.bits_per_value, 1e-3));
    assert_true(e8.mse < d8.mse);
    free(y2);
    free(x);
}

static void test_errors(void **state) {
    (void)state;
    float x[16] = {0};
    int32_t y2[16];
    double h;
    e8kv_eclq_point p;
    assert_error(e8kv_eclq_quantize(NULL, x, 8, 1.0, E8KV_ECLQ_E8), BAD_ARGUMENT);
    assert_error(e8kv_eclq_quantize(y2, NULL, 8, 1.0, E8KV_ECLQ_E8), BAD_ARGUMENT);
    assert_error(e8kv_eclq_quantize(y2, x, 12, 1.0, E8KV_ECLQ_E8), BAD_ARGUMENT);
    assert_error(e8kv_eclq_quantize(y2, x, 6, 1.0, E8KV_ECLQ_D4), BAD_ARGUMENT);
    assert_error(e8kv_eclq_quantize(y2, x, 0, 1.0, E8KV_ECLQ_Z), BAD_ARGUMENT);
    assert_error(e8kv_eclq_quantize(y2, x, 8, 0.0, E8KV_ECLQ_E8), BAD_ARGUMENT);
    assert_error(e8kv_eclq_quantize(y2, x, 8, -1.0, E8KV_ECLQ_E8), BAD_ARGUMENT);
    assert_error(e8kv_eclq_quantize(y2, x, 8, NAN, E8KV_ECLQ_E8), BAD_ARGUMENT);
    assert_error(e8kv_eclq_quantize(y2, x, 8, 1.0, (e8kv_eclq_lattice)7), BAD_ARGUMENT);
    x[3] = NAN;
    assert_error(e8kv_eclq_quantize(y2, x, 8, 1.0, E8KV_ECLQ_E8), NONFINITE);
    x[3] = INFINITY;
    assert_error(e8kv_eclq_quantize(y2, x, 8, 1.0, E8KV_ECLQ_E8), NONFINITE);
    x[3] = 1e9f;
    assert_error(e8kv_eclq_quantize(y2, x, 8, 1e-3, E8KV_ECLQ_E8), RANGE);
    x[3] = 0.0f;
    assert_error(e8kv_eclq_entropy(&h, y2, 7, E8KV_ECLQ_E8), BAD_ARGUMENT);
    assert_error(e8kv_eclq_entropy(NULL, y2, 8, E8KV_ECLQ_E8), BAD_ARGUMENT);
    int32_t huge[1] = {4 * E8KV_ECLQ_MAX_ABS_Y2};
    assert_error(e8kv_eclq_entropy(&h, huge, 1, E8KV_ECLQ_Z), RANGE);
    assert_error(e8kv_eclq_measure(&p, NULL, x, 8, 1.0, E8KV_ECLQ_E8), BAD_ARGUMENT);
    for (int i = 0; i < 16; i++)
        x[i] = (float)i - 7.5f;
    /* 32 blocks: the empirical rate is a step function of the step with jumps of order log2(32)/256,
     * so 2 ± 1e-9 is unreachable; the closest point found comes back with RATE */
    float *g = gauss(256, 17);
    int32_t g2[256];
    p.step = 0.0;
    assert_error(e8kv_eclq_step_for_rate(&p, g2, g, 256, E8KV_ECLQ_E8, 1.0, 2.0, 1e-9), RATE);
    assert_true(p.step > 0.0 && fabs(p.bits_per_value - 2.0) < 0.05);
    e8kv_eclq_point q;
    assert_ok(e8kv_eclq_measure(&q, g2, g, 256, p.step, E8KV_ECLQ_E8));
    assert_float_equal(q.bits_per_value, p.bits_per_value, 1e-12);
    free(g);
    assert_error(e8kv_eclq_step_for_rate(&p, y2, x, 16, E8KV_ECLQ_E8, 1.0, 0.0, 1e-3), RATE);
    assert_error(e8kv_eclq_step_for_rate(&p, y2, x, 16, E8KV_ECLQ_E8, 1.0, 17.0, 1e-3), RATE);
    assert_error(e8kv_eclq_step_for_rate(&p, y2, x, 16, E8KV_ECLQ_E8, 0.0, 3.0, 1e-3), BAD_ARGUMENT);
    assert_error(e8kv_eclq_step_for_rate(&p, y2, x, 16, E8KV_ECLQ_E8, 1.0, 3.0, 0.0), BAD_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entropy_from_counts), cmocka_unit_test(test_scalar_entropy_gaussian),
        cmocka_unit_test(test_parity_rate_by_hand), cmocka_unit_test(test_parity_saving_on_gaussian),
        cmocka_unit_test(test_initial_step),        cmocka_unit_test(test_step_for_rate),
        cmocka_unit_test(test_relaxed_vs_strict),   cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
