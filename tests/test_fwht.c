/* The seeded random-sign Hadamard rotation (src/transform/fwht.h): exact inverse, orthonormality,
 * block split for non-powers of two, seeds, bad head_dim, and the AVX2 butterfly against its _ref twin
 * (bit-exact: every butterfly output is one IEEE add or subtract in both; the AVX2 twin's fma with a ±1
 * multiplier rounds once, like the add). */
#include "test_util.h"

#include "common/cpu.h"
#include "common/rng.h"
#include "transform/fwht.h"

#include <math.h>

static const size_t k_dims[] = {8, 16, 64, 96, 128, 256, 512};
#define N_DIMS (sizeof k_dims / sizeof k_dims[0])

static void fill_normal(e8kv_rng *rng, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)e8kv_rng_normal(rng);
}

static double dot(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

static void test_round_trip(void **state) {
    (void)state;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 11);
    for (size_t k = 0; k < N_DIMS; k++) {
        const size_t d = k_dims[k];
        e8kv_rot rot;
        assert_ok(e8kv_rot_init(&rot, d, 99));
        for (int t = 0; t < 50; t++) {
            float x[E8KV_MAX_HEAD_DIM], y[E8KV_MAX_HEAD_DIM];
            fill_normal(&rng, x, d);
            if (t == 1) x[0] *= 1e4f; /* uneven magnitudes */
            memcpy(y, x, d * sizeof(float));
            e8kv_rot_forward(&rot, y, 1);
            e8kv_rot_inverse(&rot, y, 1);
            double err = 0.0;
            for (size_t i = 0; i < d; i++) err += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            const double rel = sqrt(err / dot(x, x, d));
            if (rel > 1e-6) fail_msg("head_dim %zu: round-trip relative error %g", d, rel);
        }
    }
}

static void test_orthonormal(void **state) {
    (void)state;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 12);
    for (size_t k = 0; k < N_DIMS; k++) {
        const size_t d = k_dims[k];
        e8kv_rot rot;
        assert_ok(e8kv_rot_init(&rot, d, 5));
        for (int t = 0; t < 50; t++) {
            float x[2 * E8KV_MAX_HEAD_DIM], r[2 * E8KV_MAX_HEAD_DIM];
            fill_normal(&rng, x, 2 * d);
            memcpy(r, x, 2 * d * sizeof(float));
            e8kv_rot_forward(&rot, r, 2); /* two vectors in one call */
            const float *const a = x, *const b = x + d, *const ra = r, *const rb = r + d;
            const double na = sqrt(dot(a, a, d)), nb = sqrt(dot(b, b, d));
            assert_true(fabs(sqrt(dot(ra, ra, d)) - na) <= 1e-6 * na);
            assert_true(fabs(dot(ra, rb, d) - dot(a, b, d)) <= 1e-6 * na * nb);
            /* and it is not the identity (nor a sign flip of it) */
            assert_true(fabs(dot(ra, a, d)) < 0.99 * na * na);
        }
    }
}

/* 96 = 64 + 32: each block rotated on its own, so the first 64 outputs depend only on the first 64
 * inputs; the split is greedy from the largest power of two. */
static void test_block_split(void **state) {
    (void)state;
    e8kv_rot rot;
    assert_ok(e8kv_rot_init(&rot, 96, 1));
    assert_int_equal(rot.n_block, 2);
    assert_int_equal(rot.block_len[0], 64);
    assert_int_equal(rot.block_len[1], 32);
    float x[96] = {0};
    x[70] = 1.0f;
    e8kv_rot_forward(&rot, x, 1);
    for (size_t i = 0; i < 64; i++) assert_true(x[i] == 0.0f);
    for (size_t i = 64; i < 96; i++) assert_true(fabsf(fabsf(x[i]) - 1.0f / sqrtf(32.0f)) < 1e-7f);
    assert_ok(e8kv_rot_init(&rot, 504, 1)); /* 256+128+64+32+16+8: the most blocks */
    assert_int_equal(rot.n_block, 6);
    assert_ok(e8kv_rot_init(&rot, 512, 1));
    assert_int_equal(rot.n_block, 1);
}

static void test_bad_head_dim(void **state) {
    (void)state;
    e8kv_rot rot;
    assert_error(e8kv_rot_init(&rot, 12, 0), HEAD_DIM);
    assert_error(e8kv_rot_init(&rot, 0, 0), HEAD_DIM);
    assert_error(e8kv_rot_init(&rot, 520, 0), HEAD_DIM);
    assert_error(e8kv_rot_init(NULL, 64, 0), BAD_ARGUMENT);
    /* and through the public API of a rotated codec */
    size_t err = 0;
    assert_null(e8kv_codec_create("q8_0h", 12, 0, &err));
    assert_error(err, HEAD_DIM);
    assert_null(e8kv_codec_create("lloyd:3", 520, 0, &err));
    assert_error(err, HEAD_DIM);
    assert_null(e8kv_codec_create("lloyd:3", 0, 0, &err));
    assert_error(err, HEAD_DIM);
}

static void test_seeds(void **state) {
    (void)state;
    e8kv_rot a, b, c;
    assert_ok(e8kv_rot_init(&a, 128, 42));
    assert_ok(e8kv_rot_init(&b, 128, 42));
    assert_ok(e8kv_rot_init(&c, 128, 43));
    assert_memory_equal(a.signs, b.signs, 128 * sizeof(float));
    int n_diff = 0, n_neg = 0;
    for (size_t i = 0; i < 128; i++) {
        assert_true(a.signs[i] == 1.0f || a.signs[i] == -1.0f);
        n_diff += a.signs[i] != c.signs[i];
        n_neg += a.signs[i] < 0.0f;
    }
    assert_true(n_diff > 32);                /* independent signs differ in about half the places */
    assert_true(n_neg > 32 && n_neg < 96);   /* and are balanced */
}

static void test_avx2_twin_bit_exact(void **state) {
    (void)state;
    if (!e8kv_cpu_has_avx2()) {
        print_message("no AVX2 (or E8KV_FORCE_REF set): twin comparison skipped\n");
        skip();
    }
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 13);
    for (size_t n = 8; n <= E8KV_MAX_HEAD_DIM; n *= 2) {
        for (int t = 0; t < 200; t++) {
            float a[E8KV_MAX_HEAD_DIM], b[E8KV_MAX_HEAD_DIM];
            for (size_t i = 0; i < n; i++) {
                /* mixed magnitudes, signed zeros and exact cancellations */
                const double g = e8kv_rng_normal(&rng);
                const int kind = (int)(e8kv_rng_next(&rng) % 8);
                a[i] = kind == 0 ? -0.0f : kind == 1 ? 0.0f : kind == 2 ? 1.0f : (float)(g * pow(10.0, kind - 4));
            }
            memcpy(b, a, n * sizeof(float));
            e8kv_fwht_ref(a, n);
            e8kv_fwht_avx2(b, n);
            assert_memory_equal(a, b, n * sizeof(float));
        }
    }
}

/* e8kv_rot_inverse (its AVX2 body when the CPU has AVX2; the scale and sign folded into one multiply)
 * bit-exact with the inverse written out as before: each block's Hadamard transform, then 1/sqrt(n), then
 * the sign; head_dims that split into several blocks included. */
static void test_inverse_bit_exact(void **state) {
    (void)state;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 29);
    static const size_t dims[] = {8, 24, 64, 72, 96, 128, 200, 256, 512};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const size_t d = dims[di], n_vec = 5;
        e8kv_rot rot;
        assert_int_equal(e8kv_rot_init(&rot, d, 1000 + di), 0);
        float a[5 * E8KV_MAX_HEAD_DIM], b[5 * E8KV_MAX_HEAD_DIM];
        for (size_t i = 0; i < n_vec * d; i++) a[i] = (float)e8kv_rng_normal(&rng);
        memcpy(b, a, n_vec * d * sizeof(float));
        e8kv_rot_inverse(&rot, a, n_vec);
        for (size_t v = 0; v < n_vec; v++) {
            float *const x = b + v * d;
            for (size_t blk = 0, off = 0; blk < rot.n_block; off += rot.block_len[blk++]) {
                const size_t n = rot.block_len[blk];
                e8kv_fwht_ref(x + off, n);
                const float s = 1.0f / sqrtf((float)n);
                for (size_t i = 0; i < n; i++) x[off + i] *= s;
            }
            for (size_t i = 0; i < d; i++) x[i] *= rot.signs[i];
        }
        assert_memory_equal(a, b, n_vec * d * sizeof(float));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),  cmocka_unit_test(test_orthonormal),
        cmocka_unit_test(test_block_split), cmocka_unit_test(test_bad_head_dim),
        cmocka_unit_test(test_seeds),       cmocka_unit_test(test_avx2_twin_bit_exact),
        cmocka_unit_test(test_inverse_bit_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
