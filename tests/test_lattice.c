/* Closest point of E8, D8, D4 and D8* (src/quant/lattice.h) against brute-force search.
 *
 * The brute force enumerates, per coset, every lattice candidate whose coordinates all lie within
 * 1.5 of x (integers, or half-integers for the odd coset) and keeps those passing an independent
 * membership test. The nearest point lies inside that window because its distance to x is at most the
 * covering radius (1 for E8 and D4, √2 for D8, 1 for D8*), which bounds every coordinate difference.
 * Distances are compared in double; ties are exact (inputs on a quarter grid) or within float rounding. */
#include "test_util.h"

#include "common/rng.h"
#include "quant/lattice.h"

#include <math.h>

typedef enum { LAT_D4, LAT_D8, LAT_E8, LAT_D8STAR } lattice_kind;

static size_t lat_dim(lattice_kind k) { return k == LAT_D4 ? 4 : 8; }

/* Independent membership in doubled coordinates. */
static int member(lattice_kind k, const int32_t *y2) {
    const size_t n = lat_dim(k);
    int n_odd = 0;
    long sum = 0;
    for (size_t i = 0; i < n; i++) {
        n_odd += (y2[i] % 2 != 0);
        sum += y2[i];
    }
    switch (k) {
    case LAT_D4:
    case LAT_D8: return n_odd == 0 && (sum / 2) % 2 == 0;
    case LAT_E8: return (n_odd == 0 || n_odd == 8) && sum % 4 == 0;
    case LAT_D8STAR: return n_odd == 0 || n_odd == 8;
    }
    return 0;
}

static double dist2(const float *x, const int32_t *y2, size_t n) {
    double d = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double e = (double)x[i] - 0.5 * (double)y2[i];
        d += e * e;
    }
    return d;
}

/* Minimum squared distance over all lattice points in the window (see the header). */
static double brute_force(lattice_kind k, const float *x) {
    const size_t n = lat_dim(k);
    double best = INFINITY;
    for (int odd = 0; odd <= 1; odd++) {
        if (odd && (k == LAT_D4 || k == LAT_D8)) continue;
        int32_t cand[8][4];
        int n_cand[8];
        for (size_t i = 0; i < n; i++) {
            n_cand[i] = 0;
            /* doubled coordinates of the right parity within 2·1.5 = 3 of 2x */
            const double t = 2.0 * (double)x[i];
            for (int32_t v = (int32_t)floor(t) - 4; v <= (int32_t)ceil(t) + 4; v++) {
                if ((v & 1) != odd || fabs((double)v - t) > 3.0) continue;
                assert_true(n_cand[i] < 4);
                cand[i][n_cand[i]++] = v;
            }
        }
        size_t total = 1;
        for (size_t i = 0; i < n; i++) total *= (size_t)n_cand[i];
        for (size_t c = 0; c < total; c++) {
            int32_t y2[8];
            size_t rest = c;
            for (size_t i = 0; i < n; i++) {
                y2[i] = cand[i][rest % (size_t)n_cand[i]];
                rest /= (size_t)n_cand[i];
            }
            if (!member(k, y2)) continue;
            const double d = dist2(x, y2, n);
            if (d < best) best = d;
        }
    }
    return best;
}

static float nearest(lattice_kind k, int32_t *y2, const float *x) {
    switch (k) {
    case LAT_D4: return e8kv_d4_nearest(y2, x);
    case LAT_D8: return e8kv_dn_nearest(y2, x, 8);
    case LAT_E8: return e8kv_e8_nearest(y2, x);
    case LAT_D8STAR: return e8kv_e8_relaxed_nearest(y2, x);
    }
    return 0.0f;
}

#define N_PER_CASE 120

static const char *k_names[] = {"D4", "D8", "E8", "D8*"};

/* mode 0: Gaussian · scale; mode 1: quarter-integer grid (exact ties between candidates and cosets);
 * mode 2: half-integers (ties in every coordinate). */
static void fill(e8kv_rng *rng, float *x, size_t n, int mode, double scale) {
    for (size_t i = 0; i < n; i++) {
        if (mode == 0)
            x[i] = (float)(scale * e8kv_rng_normal(rng));
        else if (mode == 1)
            x[i] = (float)((double)((int64_t)(e8kv_rng_next(rng) % 41) - 20) * 0.25);
        else
            x[i] = (float)((double)((int64_t)(e8kv_rng_next(rng) % 21) - 10) * 0.5);
    }
}

static void check_lattice(lattice_kind k) {
    const size_t n = lat_dim(k);
    const double scales[] = {0.3, 1.0, 2.5, 10.0, 1000.0};
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 1234 + (uint64_t)k);
    int n_checked = 0;
    for (int mode = 0; mode < 3; mode++) {
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
            if (mode > 0 && s > 0) break; /* the grids have their own scale */
            for (int t = 0; t < N_PER_CASE; t++) {
                float x[8];
                int32_t y2[8];
                fill(&rng, x, n, mode, scales[s]);
                const float dr = nearest(k, y2, x);
                if (!member(k, y2)) fail_msg("%s: output is not a lattice point (mode %d)", k_names[k], mode);
                const double got = dist2(x, y2, n), best = brute_force(k, x);
                /* the returned squared distance is the distance of the returned point */
                assert_true(fabs((double)dr - got) <= 1e-5 * (1.0 + got));
                /* grid inputs are exact in double: no slack; Gaussian inputs: float rounding only */
                const double tol = mode == 0 ? 1e-5 * (1.0 + best) : 0.0;
                if (got > best + tol)
                    fail_msg("%s mode %d scale %g: distance %.9g > brute force %.9g", k_names[k], mode,
                             scales[s], got, best);
                n_checked++;
            }
        }
    }
    assert_int_equal(n_checked, N_PER_CASE * 7);
}

static void test_d4_brute_force(void **state) {
    (void)state;
    check_lattice(LAT_D4);
}
static void test_d8_brute_force(void **state) {
    (void)state;
    check_lattice(LAT_D8);
}
static void test_e8_brute_force(void **state) {
    (void)state;
    check_lattice(LAT_E8);
}
static void test_d8star_brute_force(void **state) {
    (void)state;
    check_lattice(LAT_D8STAR);
}

/* Sum odd after rounding: the coordinate with the LARGEST rounding error (x0, error 0.4) must move.
 * A variant that moves another one (x1, error 0.1, or any zero) lands at distance >= 0.97 instead of
 * 0.37, and moving x0 the wrong way (to 2) costs 1.96. */
static void test_e8_flips_largest_error(void **state) {
    (void)state;
    const float cases[3][8] = {
        {0.6f, 0.1f, 0, 0, 0, 0, 0, 0},
        {-0.6f, 0.1f, 0, 0, 0, 0, 0, 0},
        {0.1f, 0.2f, 0.0f, 1.35f, 0.0f, 0.0f, 0.0f, 0.0f}, /* largest error at index 3: 1.35 -> 2 */
    };
    const int32_t expect[3][8] = {
        {0, 0, 0, 0, 0, 0, 0, 0},
        {0, 0, 0, 0, 0, 0, 0, 0},
        {0, 0, 0, 4, 0, 0, 0, 0},
    };
    for (int c = 0; c < 3; c++) {
        int32_t y2[8];
        e8kv_e8_nearest(y2, cases[c]);
        for (int i = 0; i < 8; i++) assert_int_equal(y2[i], expect[c][i]);
        assert_true(e8kv_e8_contains(y2));
        e8kv_dn_nearest(y2, cases[c], 8);
        for (int i = 0; i < 8; i++) assert_int_equal(y2[i], expect[c][i]);
    }
    /* D4 with the same rule */
    const float x4[4] = {0.1f, -0.7f, 0.2f, 0.0f}; /* rounds to (0,-1,0,0): odd; x1 error 0.3 is largest */
    int32_t y4[4];
    e8kv_d4_nearest(y4, x4);
    const int32_t e4[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) assert_int_equal(y4[i], e4[i]);
}

/* Documented tie rules: equal coset distances go to the integer coset; rounding is half away from 0. */
static void test_tie_rules(void **state) {
    (void)state;
    const float q[8] = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
    int32_t y2[8];
    /* 0 and (½)^8 are both at squared distance 0.5 */
    assert_true(e8kv_e8_nearest(y2, q) == 0.5f);
    for (int i = 0; i < 8; i++) assert_int_equal(y2[i], 0);
    assert_true(e8kv_e8_relaxed_nearest(y2, q) == 0.5f);
    for (int i = 0; i < 8; i++) assert_int_equal(y2[i], 0);
    const float h[8] = {0.5f, -0.5f, 0, 0, 0, 0, 0, 0};
    e8kv_dn_nearest(y2, h, 8); /* rounds to (1,-1,0...), even sum: kept */
    assert_int_equal(y2[0], 2);
    assert_int_equal(y2[1], -2);
}

static void test_membership(void **state) {
    (void)state;
    const int32_t e8_ok[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    const int32_t e8_bad[8] = {1, 1, 1, 1, 1, 1, 1, -1}; /* sum 6 */
    const int32_t mixed[8] = {1, 1, 1, 1, 1, 1, 1, 2};
    const int32_t d8_bad[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    assert_true(e8kv_e8_contains(e8_ok));
    assert_false(e8kv_e8_contains(e8_bad));
    assert_false(e8kv_e8_contains(mixed));
    assert_false(e8kv_e8_contains(d8_bad));
    assert_true(e8kv_e8_relaxed_contains(e8_bad));
    assert_false(e8kv_e8_relaxed_contains(mixed));
    assert_false(e8kv_dn_contains(d8_bad, 8));
    const int32_t d4_ok[4] = {2, -2, 0, 0};
    assert_true(e8kv_dn_contains(d4_ok, 4));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_d4_brute_force),      cmocka_unit_test(test_d8_brute_force),
        cmocka_unit_test(test_e8_brute_force),      cmocka_unit_test(test_d8star_brute_force),
        cmocka_unit_test(test_e8_flips_largest_error), cmocka_unit_test(test_tie_rules),
        cmocka_unit_test(test_membership),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
