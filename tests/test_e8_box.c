/* e8box:4: the block quantizer against exhaustive search over the box, the decoder's and the block
 * quantizer's AVX2 twins bit-exact against the references, rate–distortion on Gaussian data,
 * determinism, errors, pinned SHA-256. */
#include "test_util.h"

#include "common/cpu.h"
#include "common/rng.h"
#include "quant/codec.h"
#include "quant/e8_box.h"
#include "sha256.h"

#include <math.h>

#define E8BOX4_SHA "f4b0278855336b4d63c9055c3621d13410567a7b26e2a94f9dd168ceeb10a134"

/* Decoding one block's bytes gives an E8 point of the box, and no E8 point of the box is closer to the
 * input: exhaustive over the 3 nearest allowed values of every coordinate in both cosets (an optimum
 * never lies further: moving a coordinate toward the input by 2 keeps the parity class of the sum
 * mod 4 only in pairs, and each coordinate's cost is convex). head_dim 8: one block, no rotation
 * effect on the check (the codec's decode is compared in the rotated domain). */
static void test_nearest_in_box(void **state) {
    (void)state;
    size_t err = 0;
    e8kv_codec *c = e8kv_codec_create("e8box:4", 8, 3, &err);
    assert_non_null(c);
    const size_t vb = e8kv_codec_vector_bytes(c);
    assert_int_equal(vb, 6);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 17);
    for (int t = 0; t < 3000; t++) {
        float x[8], y[8], t8[8];
        for (int i = 0; i < 8; i++)
            x[i] = (float)(e8kv_rng_normal(&rng) * (t % 5 == 0 ? 3.0 : 1.0));
        uint8_t b[6];
        assert_int_equal(e8kv_codec_encode(c, b, 6, x, 1), 6);
        assert_int_equal(e8kv_codec_decode_rotated(c, y, 8, b, 6, 1), 8);
        /* the rotated input the encoder saw, in units of δ/2 */
        memcpy(t8, x, sizeof x);
        assert_int_equal(e8kv_codec_rotate(c, t8, 1, 0), 8);
        if (b[0] == 0) continue;
        const double h = 0.5 * e8kv_box_step(b[0]);
        int32_t p2[8], sum = 0;
        for (int i = 0; i < 8; i++) {
            const double v = y[i] / h;
            p2[i] = (int32_t)lround(v);
            assert_true(fabs(v - p2[i]) < 1e-5 * (1 + fabs(v))); /* one float product */
            sum += p2[i];
        }
        const int k = p2[0] & 1;
        for (int i = 0; i < 8; i++) {
            assert_int_equal(p2[i] & 1, k);
            assert_true(p2[i] >= (k ? -15 : -16) && p2[i] <= (k ? 15 : 14));
        }
        assert_int_equal(((sum % 4) + 4) % 4, 0);
        double got = 0.0;
        for (int i = 0; i < 8; i++)
            got += (t8[i] / h - p2[i]) * (t8[i] / h - p2[i]);
        /* exhaustive: per coordinate the 3 allowed values nearest to t8/h in each coset */
        double best = INFINITY;
        for (int kk = 0; kk < 2; kk++) {
            int32_t cand[8][3];
            for (int i = 0; i < 8; i++) {
                const double u = t8[i] / h;
                int32_t c0 = 2 * (int32_t)floor((u - kk) / 2.0) + kk; /* allowed value at or below u */
                const int32_t lo = kk ? -15 : -16, hi = kk ? 15 : 14;
                int32_t base = c0 - 2;
                if (base < lo) base = lo;
                if (base + 4 > hi) base = hi - 4;
                for (int j = 0; j < 3; j++)
                    cand[i][j] = base + 2 * j;
            }
            for (int m = 0; m < 6561; m++) {
                int mm = m, s = 0;
                double dd = 0.0;
                for (int i = 0; i < 8; i++, mm /= 3) {
                    const int32_t v = cand[i][mm % 3];
                    s += v;
                    dd += (t8[i] / h - v) * (t8[i] / h - v);
                }
                if (((s % 4) + 4) % 4 == 0 && dd < best) best = dd;
            }
        }
        /* the encoder works in 13-bit fixed point: ties and near-ties within its rounding */
        if (got > best + 1e-3) fail_msg("vector %d: distance %.6f, exhaustive %.6f", t, got, best);
    }
    e8kv_codec_free(c);
}

static void test_decode_twin(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) skip();
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 18);
    for (size_t d = 32; d <= 256; d *= 2) {
        const size_t vb = e8kv_box_vector_bytes(d);
        uint8_t b[1 + 4 + 128];
        float y1[256], y2[256];
        for (int t = 0; t < 2000; t++) {
            for (size_t i = 0; i < vb; i++)
                b[i] = (uint8_t)e8kv_rng_next(&rng);
            if (t % 7 == 0) b[0] = 0;
            e8kv_box_decode_ref(y1, b, d);
            e8kv_box_decode_avx2(y2, b, d);
            assert_memory_equal(y1, y2, d * sizeof(float));
        }
    }
}

/* The AVX2 block quantizer against the reference: the same point and distance for Gaussian blocks at
 * scales from inside the box to far outside (clamping), inputs exactly on the half grid (rounding ties
 * and equal-cost ±2 moves), and inputs past the fixed-point limit. */
static void test_nearest_twin(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) skip();
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 19);
    static const float ks[] = {8192.0f / 0.37f, 8192.0f, 8192.0f / 1.9f, 8192.0f * 3.1f};
    for (int t = 0; t < 200000; t++) {
        float x[8];
        const int kind = t % 4;
        for (int i = 0; i < 8; i++) {
            if (kind == 0) x[i] = (float)e8kv_rng_normal(&rng) * 3.0f;
            if (kind == 1) x[i] = (float)(e8kv_rng_next(&rng) % 41) * 0.25f - 5.0f; /* quarter grid: ties */
            if (kind == 2) x[i] = (float)e8kv_rng_normal(&rng) * 40.0f;             /* clamped */
            if (kind == 3) x[i] = (float)(e8kv_rng_next(&rng) % 33) * 0.5f - 8.0f;  /* half grid */
        }
        if (t % 1000 == 0) x[t % 8] = t % 2000 ? 3e9f : -3e9f; /* beyond the fixed-point limit */
        const float k = kind % 2 ? 8192.0f : ks[(size_t)t / 4 % 4];
        int32_t a[8], b[8];
        const int64_t da = e8kv_box_nearest_ref(a, x, k), db = e8kv_box_nearest_avx2(b, x, k);
        assert_int_equal(da, db);
        assert_memory_equal(a, b, sizeof a);
    }
}

/* N(0,1): measured 21.10 dB at 4.25 bits (e8:4: 21.26 dB) and, at head_dim 128 (4.1875 bits: the step
 * covers the largest of 128 values), 20.58 dB; floors 21.0 and 20.45. */
static void test_gaussian_snr(void **state) {
    (void)state;
    const double snr = test_codec_snr_db("e8box:4", 64, 4096, 21, 9);
    if (snr < 21.0) fail_msg("e8box:4: SNR %.2f dB < 21.0", snr);
    const double snr128 = test_codec_snr_db("e8box:4", 128, 2048, 22, 9);
    if (snr128 < 20.45) fail_msg("e8box:4 d=128: SNR %.2f dB < 20.45", snr128);
}

static void test_errors(void **state) {
    (void)state;
    size_t err = 0;
    assert_null(e8kv_codec_create("e8box:3", 64, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_RATE);
    assert_null(e8kv_codec_create("e8box:4", 60, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_HEAD_DIM);
    assert_null(e8kv_codec_create("e8box:4:q=3", 64, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_SPEC);
    e8kv_codec *c = e8kv_codec_create("e8box:4", 64, 0, &err);
    assert_non_null(c);
    assert_int_equal(e8kv_codec_vector_bytes(c), 34);
    float x[64] = {0}, y[64];
    uint8_t b[34];
    memset(b, 0xAB, sizeof b);
    assert_int_equal(e8kv_codec_encode(c, b, 34, x, 1), 34); /* zero vector: exact */
    assert_int_equal(b[0], 0);
    assert_int_equal(e8kv_codec_decode(c, y, 64, b, 34, 1), 64);
    for (int i = 0; i < 64; i++)
        assert_true(y[i] == 0.0f);
    x[5] = 1e30f; /* step beyond the code range */
    memset(b, 0xAB, sizeof b);
    assert_error(e8kv_codec_encode(c, b, 34, x, 1), RANGE);
    for (int i = 0; i < 34; i++)
        assert_int_equal(b[i], 0xAB);
    x[5] = NAN;
    assert_error(e8kv_codec_encode(c, b, 34, x, 1), NONFINITE);
    e8kv_codec_free(c);
}

static void test_pinned_sha256(void **state) {
    (void)state;
    enum { D = 64, N = 256 };
    float *const x = malloc(sizeof(float) * D * N);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 2024);
    for (size_t i = 0; i < D * N; i++)
        x[i] = (float)e8kv_rng_normal(&rng);
    size_t err;
    e8kv_codec *const c = e8kv_codec_create("e8box:4", D, 7, &err);
    assert_non_null(c);
    const size_t nb = 34 * N;
    uint8_t *const b = malloc(nb), *const b2 = malloc(nb);
    assert_int_equal(e8kv_codec_encode(c, b, nb, x, N), nb);
    assert_int_equal(e8kv_codec_encode(c, b2, nb, x, N), nb);
    assert_memory_equal(b, b2, nb);
    char hex[65];
    sha256_hex(hex, b, nb);
    if (strcmp(hex, E8BOX4_SHA) != 0) fail_msg("e8box:4: sha256 %s, pinned %s", hex, E8BOX4_SHA);
    free(b);
    free(b2);
    free(x);
    e8kv_codec_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nearest_in_box), cmocka_unit_test(test_decode_twin),
        cmocka_unit_test(test_nearest_twin),   cmocka_unit_test(test_gaussian_snr),
        cmocka_unit_test(test_errors),         cmocka_unit_test(test_pinned_sha256),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
