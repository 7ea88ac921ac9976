/* Scalar baselines through the public codec API: q8_0 / q4_0 (llama.cpp block formats, plain and after
 * the rotation) and lloyd:B (Lloyd–Max levels for N(0,1) after the rotation). Bit-exact comparison
 * against an independent numpy implementation lives in tests/py_scalar_ref.py; here: layouts, hand-worked
 * blocks, determinism, error bounds, the Lloyd–Max table re-derived by Lloyd iteration, and MSE on
 * Gaussian data against the known Lloyd–Max values. */
#include "test_util.h"

#include "common/common.h"
#include "common/fp16.h"
#include "common/rng.h"

#include <math.h>

static e8kv_codec *make(const char *spec, size_t d) {
    size_t err = 0;
    e8kv_codec *const c = e8kv_codec_create(spec, d, 7, &err);
    if (!c) fail_msg("create %s/%zu: %s", spec, d, e8kv_error_name(err));
    return c;
}

static void fill_normal(e8kv_rng *rng, float *x, size_t n, double sigma) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(sigma * e8kv_rng_normal(rng));
}

static void test_layout(void **state) {
    (void)state;
    const struct {
        const char *spec;
        size_t d, bytes;
    } cases[] = {
        {"q8_0", 32, 34},   {"q8_0", 128, 136}, {"q8_0h", 96, 102}, {"q4_0", 32, 18},
        {"q4_0h", 128, 72}, {"lloyd:2", 8, 4},  {"lloyd:3", 128, 50}, {"lloyd:4", 96, 50},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        e8kv_codec *const c = make(cases[i].spec, cases[i].d);
        assert_int_equal(e8kv_codec_vector_bytes(c), cases[i].bytes);
        assert_true(fabs(e8kv_codec_bits_per_value(c) - 8.0 * (double)cases[i].bytes / (double)cases[i].d) < 1e-12);
        e8kv_codec_free(c);
    }
    e8kv_codec *const q8 = make("q8_0", 64), *const q4 = make("q4_0", 64);
    assert_true(e8kv_codec_bits_per_value(q8) == 8.5);
    assert_true(e8kv_codec_bits_per_value(q4) == 4.5);
    assert_false(e8kv_codec_is_rotated(q8));
    e8kv_codec_free(q8);
    e8kv_codec_free(q4);
    e8kv_codec *const h = make("q4_0h", 64);
    assert_true(e8kv_codec_is_rotated(h));
    e8kv_codec_free(h);
}

/* A q4_0 block worked by hand from ggml's rule: max = -8 (largest magnitude, sign kept), d = 1, id = 1,
 * q = min(15, (int)(x + 8.5)). */
static void test_q4_0_hand_block(void **state) {
    (void)state;
    float x[32] = {0};
    x[0] = 2.0f;   /* q = 10 */
    x[1] = -8.0f;  /* the max: q = 0 */
    x[2] = 7.9f;   /* 16.4 -> 16 -> clamped to 15 */
    x[3] = -0.5f;  /* 8.0 -> 8 */
    x[4] = 0.49f;  /* 8.99 -> 8 */
    x[16] = 1.5f;  /* 10.0 -> 10, high nibble of byte 0 */
    x[17] = 8.0f;  /* same magnitude as -8 but later: not the max; 16.5 -> 15 */
    e8kv_codec *const c = make("q4_0", 32);
    uint8_t b[18];
    assert_int_equal(e8kv_codec_encode(c, b, sizeof b, x, 1), 18);
    assert_int_equal(e8kv_load_le16(b), 0x3c00); /* f16 1.0 */
    assert_int_equal(b[2 + 0], 10 | (10 << 4));
    assert_int_equal(b[2 + 1], 0 | (15 << 4));
    assert_int_equal(b[2 + 2], 15 | (8 << 4));
    assert_int_equal(b[2 + 3], 8 | (8 << 4));
    assert_int_equal(b[2 + 4], 8 | (8 << 4));
    float y[32];
    assert_int_equal(e8kv_codec_decode(c, y, 32, b, 18, 1), 32);
    assert_true(y[0] == 2.0f && y[1] == -8.0f && y[2] == 7.0f && y[3] == 0.0f && y[17] == 7.0f);
    e8kv_codec_free(c);
}

/* q8_0 by hand: amax = 127 gives d = 1 exactly; roundf is half away from zero. */
static void test_q8_0_hand_block(void **state) {
    (void)state;
    float x[32] = {0};
    x[0] = 127.0f;
    x[1] = -2.5f; /* -> -3 */
    x[2] = 2.5f;  /* -> 3 */
    x[3] = -127.0f;
    x[4] = 0.4999f;
    e8kv_codec *const c = make("q8_0", 32);
    uint8_t b[34];
    assert_int_equal(e8kv_codec_encode(c, b, sizeof b, x, 1), 34);
    assert_int_equal(e8kv_load_le16(b), 0x3c00);
    assert_int_equal((int8_t)b[2], 127);
    assert_int_equal((int8_t)b[3], -3);
    assert_int_equal((int8_t)b[4], 3);
    assert_int_equal((int8_t)b[5], -127);
    assert_int_equal((int8_t)b[6], 0);
    e8kv_codec_free(c);
}

static void test_deterministic_and_bounded(void **state) {
    (void)state;
    const char *specs[] = {"q8_0", "q8_0h", "q4_0", "q4_0h", "lloyd:2", "lloyd:3", "lloyd:4"};
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 3);
    enum { D = 128, N = 64 };
    static float x[N * D], y[N * D];
    fill_normal(&rng, x, N * D, 3.0);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        e8kv_codec *const c = make(specs[s], D);
        const size_t vb = e8kv_codec_vector_bytes(c);
        uint8_t *const a = malloc(N * vb), *const b = malloc(N * vb);
        assert_int_equal(e8kv_codec_encode(c, a, N * vb, x, N), N * vb);
        assert_int_equal(e8kv_codec_encode(c, b, N * vb, x, N), N * vb);
        assert_memory_equal(a, b, N * vb);
        /* vector i alone encodes to the same bytes (random access, no state between vectors) */
        assert_int_equal(e8kv_codec_encode(c, b, vb, x + 5 * D, 1), vb);
        assert_memory_equal(a + 5 * vb, b, vb);
        assert_int_equal(e8kv_codec_decode(c, y, N * D, a, N * vb, N), N * D);
        double err = 0.0, sig = 0.0;
        for (size_t i = 0; i < N * D; i++) {
            err += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            sig += (double)x[i] * x[i];
        }
        /* SNR floors far below what each format reaches (q8_0 ~ 40 dB, q4_0 ~ 18, lloyd:2 ~ 9) */
        const double snr_db = 10.0 * log10(sig / err);
        const double floor_db = s < 2 ? 35.0 : s < 4 ? 15.0 : s == 4 ? 8.5 : s == 5 ? 14.0 : 19.5;
        if (snr_db < floor_db) fail_msg("%s: SNR %.2f dB < %.1f", specs[s], snr_db, floor_db);
        free(a);
        free(b);
        e8kv_codec_free(c);
    }
}

/* Per block, q8_0 errors are at most d/2 (+ f16 rounding of d times |q|) and q4_0 errors at most d/2
 * except the clamped top level. */
static void test_q8_0_error_bound(void **state) {
    (void)state;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 4);
    e8kv_codec *const c = make("q8_0", 256);
    for (int t = 0; t < 200; t++) {
        float x[256], y[256];
        fill_normal(&rng, x, 256, pow(10.0, (t % 9) - 4));
        uint8_t b[272];
        assert_int_equal(e8kv_codec_encode(c, b, sizeof b, x, 1), 272);
        assert_int_equal(e8kv_codec_decode(c, y, 256, b, 272, 1), 256);
        for (size_t k = 0; k < 8; k++) {
            float amax = 0.0f;
            for (size_t j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * k + j]));
            const float d = amax / 127.0f;
            const float dh = e8kv_fp16_to_fp32(e8kv_load_le16(b + 34 * k));
            for (size_t j = 0; j < 32; j++) {
                const double bound = 0.5 * d + 127.0 * fabs((double)dh - d) + 1e-6 * d;
                assert_true(fabs((double)x[32 * k + j] - y[32 * k + j]) <= bound);
            }
        }
    }
    e8kv_codec_free(c);
}

static void test_zero_and_range(void **state) {
    (void)state;
    const char *specs[] = {"q8_0", "q8_0h", "q4_0", "q4_0h", "lloyd:2", "lloyd:3", "lloyd:4"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        e8kv_codec *const c = make(specs[s], 64);
        const size_t vb = e8kv_codec_vector_bytes(c);
        float x[64] = {0}, y[64];
        uint8_t b[128];
        assert_true(vb <= sizeof b);
        assert_int_equal(e8kv_codec_encode(c, b, vb, x, 1), vb);
        for (size_t i = 0; i < 64; i++) y[i] = 1.0f;
        assert_int_equal(e8kv_codec_decode(c, y, 64, b, vb, 1), 64);
        for (size_t i = 0; i < 64; i++) assert_true(y[i] == 0.0f);
        /* a scale just past f16 (q8_0: amax/127, q4_0: amax/8, lloyd: the norm): E8KV_ERROR_RANGE and
         * nothing written. The rotated variants spread a spike, so they get only the huge cases. */
        const int rotated_q = s == 1 || s == 3;
        x[3] = s < 2 ? 65504.0f * 127.0f * 1.001f : s < 4 ? 65504.0f * 8.0f * 1.001f : 65600.0f;
        if (rotated_q) x[3] = 1e30f;
        memset(b, 0xAB, sizeof b);
        assert_error(e8kv_codec_encode(c, b, vb, x, 1), RANGE);
        for (size_t i = 0; i < vb; i++)
            if (b[i] != 0xAB) fail_msg("%s: byte %zu written on error", specs[s], i);
        x[3] = 1e30f;
        assert_error(e8kv_codec_encode(c, b, vb, x, 1), RANGE);
        x[3] = 3e38f; /* the rotation overflows to Inf: still a range error, not garbage */
        x[4] = -3e38f;
        x[5] = 3e38f;
        assert_error(e8kv_codec_encode(c, b, vb, x, 1), RANGE);
        x[4] = x[5] = 0.0f;
        x[3] = s < 2 ? 60000.0f * 127.0f : s < 4 ? 60000.0f * 8.0f : 60000.0f;
        if (rotated_q) x[3] = 1000.0f; /* rotated: spread, stays well inside */
        assert_int_equal(e8kv_codec_encode(c, b, vb, x, 1), vb);
        e8kv_codec_free(c);
    }
}

/* ---- Lloyd–Max levels: the committed table against Lloyd iteration with closed-form cell integrals
 * ∫φ = Φ(b) − Φ(a), ∫xφ = φ(a) − φ(b), ∫x²φ = Φ(b) − Φ(a) + aφ(a) − bφ(b). */

static double phi(double x) { return isinf(x) ? 0.0 : exp(-0.5 * x * x) / sqrt(2.0 * M_PI); }
static double Phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }
static double xphi(double x) { return isinf(x) ? 0.0 : x * phi(x); }

/* MSE of the quantizer with `levels` (ascending) and midpoint thresholds on N(0, 1). */
static double lloyd_mse(const double *c, int n) {
    double mse = 0.0;
    for (int k = 0; k < n; k++) {
        const double a = k == 0 ? -INFINITY : 0.5 * (c[k - 1] + c[k]);
        const double b = k == n - 1 ? INFINITY : 0.5 * (c[k] + c[k + 1]);
        const double p = Phi(b) - Phi(a), m1 = phi(a) - phi(b), m2 = p + xphi(a) - xphi(b);
        mse += m2 - 2.0 * c[k] * m1 + c[k] * c[k] * p;
    }
    return mse;
}

/* The library's levels, read through the public API: a vector with n̂ = √d = 8 and indices 0..2^B-1
 * decodes (in the rotated domain) to exactly the levels. */
static void library_levels(int bits, double *levels) {
    char spec[16];
    snprintf(spec, sizeof spec, "lloyd:%d", bits);
    e8kv_codec *const c = make(spec, 64);
    const size_t vb = e8kv_codec_vector_bytes(c);
    uint8_t b[2 + 32] = {0};
    e8kv_store_le16(b, e8kv_fp32_to_fp16(8.0f));
    const int n = 1 << bits;
    for (int k = 0; k < n; k++) {
        const size_t bit = (size_t)bits * (size_t)k;
        b[2 + bit / 8] |= (uint8_t)(k << (bit % 8));
        if (bit % 8 + (size_t)bits > 8) b[2 + bit / 8 + 1] |= (uint8_t)(k >> (8 - bit % 8));
    }
    float y[64];
    assert_int_equal(e8kv_codec_decode_rotated(c, y, 64, b, vb, 1), 64);
    for (int k = 0; k < n; k++) levels[k] = y[k];
    e8kv_codec_free(c);
}

static void test_lloyd_levels(void **state) {
    (void)state;
    const double known_mse[5] = {0, 0, 0.1175, 0.03454, 0.009497}; /* Max (1960) */
    for (int bits = 2; bits <= 4; bits++) {
        const int n = 1 << bits;
        double c[16], lib[16];
        for (int k = 0; k < n; k++) c[k] = -3.0 + 6.0 * (k + 0.5) / n;
        for (int it = 0; it < 20000; it++) {
            double t[17];
            t[0] = -INFINITY;
            t[n] = INFINITY;
            for (int k = 1; k < n; k++) t[k] = 0.5 * (c[k - 1] + c[k]);
            for (int k = 0; k < n; k++) c[k] = (phi(t[k]) - phi(t[k + 1])) / (Phi(t[k + 1]) - Phi(t[k]));
        }
        library_levels(bits, lib);
        for (int k = 0; k < n; k++)
            if (fabs(lib[k] - c[k]) > 2e-7 * (1.0 + fabs(c[k])))
                fail_msg("lloyd:%d level %d: table %.9f, Lloyd iteration %.9f", bits, k, lib[k], c[k]);
        const double mse = lloyd_mse(lib, n);
        print_message("lloyd:%d  Lloyd-Max MSE on N(0,1) = %.6f (known %.6g)\n", bits, mse, known_mse[bits]);
        assert_true(fabs(mse / known_mse[bits] - 1.0) < 0.01);
    }
}

/* Packing and encoder rule, checked by an independent encoder in double: choose a rotated-domain
 * vector r, hand the codec x = R⁻¹r, and compare the indices it writes (unpacked here: index i in bits
 * [B·i, B·i+B), LSB first) with the nearest level to u_i = r_i·√d/n̂. Coordinates within 1e-4 of a
 * decision threshold are skipped (the rotation round trip moves u by ~1e-6). */
static void test_lloyd_packing(void **state) {
    (void)state;
    enum { D = 64 };
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 77);
    for (int bits = 2; bits <= 4; bits++) {
        const int n = 1 << bits;
        double lev[16];
        library_levels(bits, lev);
        char spec[16];
        snprintf(spec, sizeof spec, "lloyd:%d", bits);
        e8kv_codec *const c = make(spec, D);
        const size_t vb = e8kv_codec_vector_bytes(c);
        assert_int_equal(vb, 2 + (size_t)bits * D / 8);
        int n_checked = 0;
        for (int t = 0; t < 100; t++) {
            float r[D], x[D];
            fill_normal(&rng, r, D, 0.5 + t * 0.05);
            memcpy(x, r, sizeof r);
            e8kv_codec_rotate(c, x, 1, 1);
            uint8_t b[2 + 32];
            assert_int_equal(e8kv_codec_encode(c, b, vb, x, 1), vb);
            double ss = 0.0;
            for (size_t i = 0; i < D; i++) ss += (double)r[i] * r[i];
            const float norm = e8kv_fp16_to_fp32(e8kv_load_le16(b));
            assert_true(fabs(norm - sqrt(ss)) <= sqrt(ss) * 0x1p-11 * 1.0001);
            for (size_t i = 0; i < D; i++) {
                const double u = (double)r[i] * sqrt((double)D) / norm;
                int best = 0;
                for (int k = 1; k < n; k++)
                    if (fabs(u - lev[k]) < fabs(u - lev[best])) best = k;
                int near_threshold = 0;
                for (int k = 0; k + 1 < n; k++) near_threshold |= fabs(u - 0.5 * (lev[k] + lev[k + 1])) < 1e-4;
                if (near_threshold) continue;
                const size_t bit = (size_t)bits * i;
                const unsigned two = (unsigned)b[2 + bit / 8] | (bit / 8 + 1 < vb - 2 ? (unsigned)b[2 + bit / 8 + 1] << 8 : 0u);
                const int got = (int)((two >> (bit % 8)) & (unsigned)(n - 1));
                if (got != best) fail_msg("%s: coordinate %zu u=%.6f index %d, expected %d", spec, i, u, got, best);
                n_checked++;
            }
        }
        assert_true(n_checked > 100 * D * 99 / 100);
        e8kv_codec_free(c);
    }
}

/* MSE and MSE/D(R) on i.i.d. N(0,1) data, every byte counted in R. Also checks the lloyd codec
 * against the Lloyd–Max values: the rotated, normalized coordinates are only approximately Gaussian
 * (a point on the sphere of radius √d), so allow 3%. */
static void test_gaussian_mse(void **state) {
    (void)state;
    const char *specs[] = {"lloyd:2", "lloyd:3", "lloyd:4", "q4_0", "q4_0h", "q8_0", "q8_0h"};
    const double lm[] = {0.1175, 0.03454, 0.009497};
    enum { D = 128, N = 2048 };
    static float x[N * D], y[N * D];
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 2024);
    fill_normal(&rng, x, N * D, 1.0);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        e8kv_codec *const c = make(specs[s], D);
        const size_t vb = e8kv_codec_vector_bytes(c);
        uint8_t *const b = malloc(N * vb);
        assert_int_equal(e8kv_codec_encode(c, b, N * vb, x, N), N * vb);
        assert_int_equal(e8kv_codec_decode(c, y, N * D, b, N * vb, N), N * D);
        double err = 0.0;
        for (size_t i = 0; i < N * D; i++) err += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        const double mse = err / (N * D), rate = e8kv_codec_bits_per_value(c);
        print_message("%-8s d=%d  bits/value %.4f  MSE %.6f  MSE/D(R) %.3f\n", specs[s], D, rate, mse,
                      mse / pow(2.0, -2.0 * rate));
        if (s < 3 && fabs(mse / lm[s] - 1.0) > 0.03)
            fail_msg("%s: MSE %.6f vs Lloyd-Max %.6f", specs[s], mse, lm[s]);
        free(b);
        e8kv_codec_free(c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),          cmocka_unit_test(test_q4_0_hand_block),
        cmocka_unit_test(test_q8_0_hand_block), cmocka_unit_test(test_deterministic_and_bounded),
        cmocka_unit_test(test_q8_0_error_bound), cmocka_unit_test(test_zero_and_range),
        cmocka_unit_test(test_lloyd_levels),    cmocka_unit_test(test_lloyd_packing),
        cmocka_unit_test(test_gaussian_mse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
