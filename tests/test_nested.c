/* e8nest:B / d4nest:B (nested-lattice Voronoi codes): canonical coset representatives against brute
 * force, the encoder against brute-force search over the whole codebook on small cases, round-trip
 * quality, q_range, determinism, bad input, the AVX2 twin, and pinned SHA-256 of the bytes. */
#include "test_util.h"

#include "common/cpu.h"
#include "common/rng.h"
#include "quant/codec.h"
#include "quant/lattice.h"
#include "quant/voronoi.h"
#include "sha256.h"

#include <math.h>

/* pinned once the format was final (see test_pinned_sha256) */
#define E8NEST2_SHA "2cad22f9b963da5c83f96aaa0a5865c2155910d9dc38c07930bd4a5349ec4b1b"
#define E8NEST4_SHA "c5bdc420646ebf713c041507eed10c7f111e405d813438e7148c7f14a4a3b128"
#define D4NEST3_SHA "b3c150d70fce8de2933feb611dd8f7f0ca889a5ea186b320a914355cc32cfee5"

/* D4 representatives: digits round-trip, and each rep is a D4 point no farther from the origin than
 * from any other point of m·D4 (checked against the 24 minimal vectors of D4 scaled by m). */
static void test_d4_coset(void **state) {
    (void)state;
    int32_t mins[24][4];
    int n = 0;
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            for (int si = -1; si <= 1; si += 2)
                for (int sj = -1; sj <= 1; sj += 2) {
                    memset(mins[n], 0, sizeof mins[n]);
                    mins[n][i] = si;
                    mins[n][j] = sj;
                    n++;
                }
    assert_int_equal(n, 24);
    for (unsigned L = 1; L <= 4; L++) {
        const int32_t m = 1 << L;
        for (uint32_t d = 0; d < (1u << (4 * L)); d++) {
            int32_t r[4];
            e8kv_d4_coset_rep(r, d, L);
            assert_int_equal((r[0] + r[1] + r[2] + r[3]) & 1, 0);
            assert_int_equal(e8kv_d4_digits(r, L), d);
            const int32_t n0 = r[0] * r[0] + r[1] * r[1] + r[2] * r[2] + r[3] * r[3];
            for (int k = 0; k < 24; k++) {
                int32_t nk = 0;
                for (int i = 0; i < 4; i++)
                    nk += (r[i] - m * mins[k][i]) * (r[i] - m * mins[k][i]);
                assert_true(n0 <= nk);
            }
        }
    }
}

/* Brute force over the whole codebook, d4nest:2 (256 codewords) and e8nest:2 (65536), Gaussian blocks:
 * when the closest lattice point is a codeword the encoder finds it exactly; otherwise (overload) the
 * radial clamp is the specified heuristic, not a nearest-codeword search: measured worst squared-distance
 * ratio to the true nearest codeword 2.44 (d4nest:2) and 2.59 (e8nest:2 at q=2.5, where every block
 * overloads); the stated bound is 3. */
static void brute_case(int dim, unsigned L, const char *qopt, int n_iter, uint64_t seed) {
    const uint32_t n_code = 1u << (dim * L);
    int32_t(*const reps)[8] = malloc(sizeof(int32_t[8]) * n_code);
    for (uint32_t d = 0; d < n_code; d++) {
        if (dim == 8)
            e8kv_e8_coset_rep(reps[d], d, L);
        else
            e8kv_d4_coset_rep(reps[d], d, L);
    }
    /* representation unit: E8 reps are doubled coordinates (half fixed units), D4 plain */
    const int64_t unit = dim == 8 ? E8KV_FX_HALF : E8KV_FX_ONE;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    size_t err;
    char spec[32];
    snprintf(spec, sizeof spec, "%s:%u%s", dim == 8 ? "e8nest" : "d4nest", L, qopt);
    e8kv_codec *const c = e8kv_codec_create(spec, 8, 1, &err);
    assert_non_null(c);
    int n_exact = 0, n_over = 0;
    double worst = 1.0;
    for (int it = 0; it < n_iter; it++) {
        /* encode one 8-value vector, decode it, and recompute the encoder's fixed-point input */
        float x[8];
        const double sc = 0.3 + 2.0 * (double)it / n_iter;
        for (int i = 0; i < 8; i++)
            x[i] = (float)(e8kv_rng_normal(&rng) * sc);
        uint8_t b[2 + 8];
        float y[8];
        assert_ok(e8kv_nest_encode_ref(c, b, x));
        e8kv_nest_decode_ref(c, y, b);
        /* recompute the fixed-point input exactly as the encoder does */
        uint16_t h = e8kv_load_le16(b);
        const float delta = (float)ldexp((double)((h & 0x3FF) | 0x400), ((h >> 10) & 31) - 25);
        assert_true((h & 0x7C00) != 0);
        const float k = (float)E8KV_FX_ONE / delta;
        const int32_t lim = (1 << L) * E8KV_FX_ONE;
        for (int blk = 0; blk < 8 / dim; blk++) {
            int32_t X[8];
            for (int i = 0; i < dim; i++) {
                int32_t v = e8kv_fx_round(x[blk * dim + i] * k);
                X[i] = v > lim ? lim : v < -lim ? -lim : v;
            }
            int64_t best = INT64_MAX, got;
            for (uint32_t d = 0; d < n_code; d++) {
                int64_t dd = 0;
                for (int i = 0; i < dim; i++) {
                    const int64_t e = X[i] - reps[d][i] * unit;
                    dd += e * e;
                }
                if (dd < best) best = dd;
            }
            /* the decoded block, back in fixed units */
            int64_t dg = 0;
            for (int i = 0; i < dim; i++) {
                const double yi = (double)y[blk * dim + i] / (double)delta * E8KV_FX_ONE;
                const int64_t e = X[i] - (int64_t)llround(yi);
                dg += e * e;
            }
            got = dg;
            int32_t q[8];
            if (dim == 8)
                e8kv_e8_nearest_fx(q, X);
            else
                e8kv_d4_nearest_fx(q, X);
            int64_t dq = 0;
            for (int i = 0; i < dim; i++)
                dq += (X[i] - q[i] * unit) * (X[i] - q[i] * unit);
            if (dq == best) { /* the closest lattice point is a codeword: must be found exactly */
                assert_true(got == best);
                n_exact++;
            } else {
                const double ratio = (double)got / (double)(best > 0 ? best : 1);
                if (ratio > worst) worst = ratio;
                assert_true(ratio <= 3.0);
                n_over++;
            }
        }
    }
    print_message("%s: %d exact, %d clamped, worst squared-distance ratio %.3f\n", spec, n_exact, n_over,
                  worst);
    assert_int_equal(n_exact + n_over, n_iter * (8 / dim));
    if (qopt[0] == 0)
        assert_true(n_exact >= 4 * n_over); /* at the default q_range most blocks are exact */
    else
        assert_true(n_over >= n_iter / 2);
    e8kv_codec_free(c);
    free(reps);
}

static void test_brute_force(void **state) {
    (void)state;
    brute_case(4, 2, "", 400, 3);
    brute_case(8, 2, "", 40, 4);
    brute_case(8, 2, ":q=2.5", 60, 5); /* a small q_range: many clamped blocks */
}

/* Gaussian data, head_dim 64: measured e8nest 9.93 / 15.6 / 21.2 dB and d4nest 9.4 / 15.0 / 20.4 dB at
 * 2 / 3 / 4 bits with the default q_range; floors leave a margin for the sample size. A far-off q_range
 * must cost quality (the knob does something). */
static void test_round_trip(void **state) {
    (void)state;
    const double floor_e8[5] = {0, 0, 9.7, 15.3, 20.9}, floor_d4[5] = {0, 0, 9.1, 14.7, 20.1};
    for (int bits = 2; bits <= 4; bits++) {
        char spec[32];
        snprintf(spec, sizeof spec, "e8nest:%d", bits);
        const double se8 = test_codec_snr_db(spec, 64, 1500, 5, 99);
        snprintf(spec, sizeof spec, "d4nest:%d", bits);
        const double sd4 = test_codec_snr_db(spec, 64, 1500, 5, 99);
        print_message("e8nest:%d %.3f dB, d4nest:%d %.3f dB\n", bits, se8, bits, sd4);
        assert_true(se8 >= floor_e8[bits]);
        assert_true(sd4 >= floor_d4[bits]);
        snprintf(spec, sizeof spec, "e8nest:%d:q=1.2", bits);
        assert_true(test_codec_snr_db(spec, 64, 300, 6, 99) < se8 - 1.0);
    }
}

static void test_errors_and_bytes(void **state) {
    (void)state;
    size_t err;
    const char *bad_rate[] = {"e8nest:1", "e8nest:5", "d4nest:8", "d4nest", "e8nest:q=3"};
    for (size_t i = 0; i < 5; i++) {
        assert_null(e8kv_codec_create(bad_rate[i], 64, 1, &err));
        assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_RATE);
    }
    assert_null(e8kv_codec_create("e8nest:2", 60, 1, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_HEAD_DIM);
    assert_null(e8kv_codec_create("d4nest:2", 62, 1, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_HEAD_DIM);
    assert_null(e8kv_codec_create("e8nest:2:q=x", 64, 1, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_SPEC);
    /* bytes: fp16 step + B bits per value */
    for (int bits = 2; bits <= 4; bits++) {
        char spec[32];
        snprintf(spec, sizeof spec, "d4nest:%d:q=3", bits);
        e8kv_codec *const c = e8kv_codec_create(spec, 64, 1, &err);
        assert_non_null(c);
        assert_int_equal(e8kv_codec_vector_bytes(c), 2 + 8 * (size_t)bits);
        e8kv_codec_free(c);
    }
    e8kv_codec *const c = e8kv_codec_create("e8nest:3", 16, 1, &err);
    assert_non_null(c);
    float x[32] = {0}, y[32];
    uint8_t b[2 * 8];
    assert_int_equal(e8kv_codec_vector_bytes(c), 8);
    x[20] = NAN;
    assert_error(e8kv_codec_encode(c, b, sizeof b, x, 2), NONFINITE);
    x[20] = 3e38f;
    assert_error(e8kv_codec_encode(c, b, sizeof b, x, 2), RANGE);
    x[20] = 0.0f;
    assert_int_equal(e8kv_codec_encode(c, b, sizeof b, x, 2), sizeof b); /* zero vectors */
    assert_int_equal(e8kv_codec_decode(c, y, 32, b, sizeof b, 2), 32);
    for (int i = 0; i < 32; i++)
        assert_true(y[i] == 0.0f);
    e8kv_codec_free(c);
}

static void test_twins(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) skip();
    enum { D = 64, N = 4000 };
    float *const x = malloc(sizeof(float) * D * N);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 8);
    for (size_t v = 0; v < N; v++)
        for (size_t i = 0; i < D; i++) {
            const int kind = (int)(v % 6);
            float f = (float)e8kv_rng_normal(&rng);
            if (kind == 0) f = 0.0f;
            if (kind == 1) f *= 1e-5f;
            if (kind == 2) f *= 3e3f;
            if (kind == 3) f = (float)((int)(i % 5) - 2);
            if (kind == 4 && i != v % D) f *= 1e-3f;
            x[v * D + i] = f;
        }
    const char *specs[] = {"e8nest:2", "e8nest:3", "e8nest:4:q=2", "e8nest:4:q=9"};
    for (size_t sidx = 0; sidx < 4; sidx++) {
        size_t err;
        e8kv_codec *const c = e8kv_codec_create(specs[sidx], D, 1, &err);
        assert_non_null(c);
        const size_t vb = e8kv_codec_vector_bytes(c);
        uint8_t *const ba = malloc(vb * N), *const bb = malloc(vb * N);
        float *const ya = malloc(sizeof(float) * D * N), *const yb = malloc(sizeof(float) * D * N);
        for (size_t v = 0; v < N; v++) {
            assert_ok(e8kv_nest_encode_ref(c, ba + v * vb, x + v * D));
            assert_ok(e8kv_nest_encode_avx2(c, bb + v * vb, x + v * D));
        }
        assert_memory_equal(ba, bb, vb * N);
        /* decoders on the codes and on random bytes (finite scales) */
        for (int pass = 0; pass < 2; pass++) {
            if (pass)
                for (size_t v = 0; v < N; v++)
                    for (size_t i = 0; i < vb; i++)
                        ba[v * vb + i] = (uint8_t)(i == 1 ? e8kv_rng_next(&rng) & 0x7B : e8kv_rng_next(&rng));
            for (size_t v = 0; v < N; v++) {
                e8kv_nest_decode_ref(c, ya + v * D, ba + v * vb);
                e8kv_nest_decode_avx2(c, yb + v * D, ba + v * vb);
            }
            assert_memory_equal(ya, yb, sizeof(float) * D * N);
        }
        free(ya);
        free(yb);
        free(ba);
        free(bb);
        e8kv_codec_free(c);
    }
    free(x);
}

/* Pinned SHA-256 of the encoded bytes (codec seed 7, Gaussian data from e8kv_rng seed 2024, 128 vectors
 * of head_dim 64, rotation included). A change of these hashes is a FORMAT CHANGE. */
static void test_pinned_sha256(void **state) {
    (void)state;
    const char *specs[3] = {"e8nest:2", "e8nest:4:q=4.5", "d4nest:3"};
    const char *pinned[3] = {E8NEST2_SHA, E8NEST4_SHA, D4NEST3_SHA};
    enum { D = 64, N = 128 };
    float *const x = malloc(sizeof(float) * D * N);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 2024);
    for (size_t i = 0; i < D * N; i++)
        x[i] = (float)e8kv_rng_normal(&rng);
    for (int k = 0; k < 3; k++) {
        size_t err;
        e8kv_codec *const c = e8kv_codec_create(specs[k], D, 7, &err);
        assert_non_null(c);
        const size_t nb = e8kv_codec_vector_bytes(c) * N;
        uint8_t *const b = malloc(nb);
        assert_int_equal(e8kv_codec_encode(c, b, nb, x, N), nb);
        char hex[65];
        sha256_hex(hex, b, nb);
        if (strcmp(hex, pinned[k]) != 0) fail_msg("%s: sha256 %s, pinned %s", specs[k], hex, pinned[k]);
        free(b);
        e8kv_codec_free(c);
    }
    free(x);
}

/* q_range (issue 12, item 6): e8kv's q is the clamp in multiples of the vector's RMS, useful from 1 to
 * sqrt(2·head_dim); KakeyaLattice's q_range values (10 / 38 / 152: lattice steps up to the largest
 * coordinate) once gave silent nonsense here (e8nest:4:q=38 at head_dim 64: SNR 3.9 dB). Outside the
 * range: E8KV_ERROR_Q_RANGE, with a message through the log callback; at its ends the codec works and the
 * upper end's SNR is no better than a default's. */
static char g_log[512];
static void keep_log(int level, const char *msg, void *user) {
    (void)level;
    (void)user;
    snprintf(g_log, sizeof g_log, "%s", msg);
}

static void test_q_range(void **state) {
    (void)state;
    static const struct {
        const char *spec;
        size_t d;
    } bad[] = {{"e8nest:4:q=38", 64},  {"e8nest:4:q=152", 128}, {"e8nest:2:q=10", 32},
               {"d4nest:3:q=38", 64},  {"d4nest:4:q=152", 512}, {"e8nest:4:q=11.4", 64},
               {"e8nest:3:q=0.5", 64}, {"d4nest:2:q=0.99", 64}, {"e8nest:4:q=33", 512}};
    e8kv_set_log_callback(keep_log, NULL);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t err = 0;
        g_log[0] = 0;
        assert_null(e8kv_codec_create(bad[i].spec, bad[i].d, 1, &err));
        if (e8kv_get_error_code(err) != E8KV_ERROR_Q_RANGE)
            fail_msg("%s at head_dim %zu: %s, expected Q_RANGE", bad[i].spec, bad[i].d, e8kv_error_name(err));
        assert_non_null(strstr(g_log, bad[i].spec));
        assert_non_null(strstr(g_log, "KakeyaLattice"));
    }
    e8kv_set_log_callback(NULL, NULL);
    assert_non_null(strstr(e8kv_error_name(E8KV_ERR(Q_RANGE)), "q_range"));
    /* a cache spec passes the codec's answer on */
    size_t err = 0;
    const e8kv_cache_params p = {
        .n_layer = 1, .n_head_kv = 1, .head_dim = 64, .n_ctx = 16, .spec = "e8nest:4:q=38"};
    assert_null(e8kv_cache_create(&p, &err));
    assert_error(err, Q_RANGE);
    /* the ends are accepted and code; sqrt(2·64) = 11.31 */
    static const char *const good[] = {"e8nest:4:q=1", "e8nest:4:q=11.3", "d4nest:4:q=1", "d4nest:4:q=11.3",
                                       "e8nest:4:q=10"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_true(test_codec_snr_db(good[i], 64, 200, 7, 99) > 2.0);
    assert_true(test_codec_snr_db("e8nest:4:q=32", 512, 50, 7, 99) > 0.0);
    assert_true(test_codec_snr_db("e8nest:4:q=11.3", 64, 400, 8, 99) <
                test_codec_snr_db("e8nest:4", 64, 400, 8, 99));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_d4_coset),   cmocka_unit_test(test_brute_force),
        cmocka_unit_test(test_round_trip), cmocka_unit_test(test_errors_and_bytes),
        cmocka_unit_test(test_twins),      cmocka_unit_test(test_pinned_sha256),
        cmocka_unit_test(test_q_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
