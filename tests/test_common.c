/* common/: error codes and names, fp16/bf16 conversions against the compiler's own _Float16, rng. */
#include "test_util.h"

#include "common/common.h"
#include "common/fp16.h"
#include "common/rng.h"

#include <math.h>

static void test_errors(void **state) {
    (void)state;
    assert_false(e8kv_is_error(0));
    assert_false(e8kv_is_error(12345));
    for (int c = 1; c < E8KV_ERROR_MAX_CODE; c++) {
        const size_t e = (size_t) - (ptrdiff_t)c;
        assert_true(e8kv_is_error(e));
        assert_int_equal(e8kv_get_error_code(e), c);
        assert_non_null(e8kv_error_name(e));
    }
    assert_string_equal(e8kv_error_name(E8KV_ERR(HEAD_DIM)), "head_dim not supported by this format");
    /* pinned values: renumbering breaks every caller */
    assert_int_equal(E8KV_ERROR_HEAD_DIM, 3);
    assert_int_equal(E8KV_ERROR_NONFINITE, 6);
    assert_int_equal(E8KV_ERROR_CHECKSUM, 11);
    assert_int_equal(e8kv_version_number(), E8KV_VERSION_NUMBER);
}

#if defined(__FLT16_MAX__)
static void test_fp16_against_compiler(void **state) {
    (void)state;
    /* every half value round-trips exactly (NaN stays NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = e8kv_fp16_to_fp32((uint16_t)h);
        _Float16 ref;
        const uint16_t hh = (uint16_t)h;
        memcpy(&ref, &hh, 2);
        if (isnan(f)) {
            assert_true(isnan((float)ref));
            continue;
        }
        assert_true(f == (float)ref);
        assert_int_equal(e8kv_fp32_to_fp16(f), h);
    }
    /* fp32 -> fp16 rounding matches the compiler on random and tie cases */
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 7);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)e8kv_rng_next(&rng);
        if (i % 4 == 0) u = (u & 0xffffe000u) | 0x1000u; /* exact halfway cases */
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        const _Float16 r = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &r, 2);
        assert_int_equal(e8kv_fp32_to_fp16(f), rb);
    }
}
#endif

static void test_bf16(void **state) {
    (void)state;
    assert_true(e8kv_bf16_to_fp32(e8kv_fp32_to_bf16(1.0f)) == 1.0f);
    assert_true(e8kv_bf16_to_fp32(e8kv_fp32_to_bf16(-2.5f)) == -2.5f);
    /* 1 + 2^-8 is a tie between 1 and 1 + 2^-7: round to even gives 1 */
    assert_true(e8kv_bf16_to_fp32(e8kv_fp32_to_bf16(1.0f + 1.0f / 256.0f)) == 1.0f);
    assert_true(isnan(e8kv_bf16_to_fp32(e8kv_fp32_to_bf16(NAN))));
}

static void test_rng_deterministic(void **state) {
    (void)state;
    e8kv_rng a, b;
    e8kv_rng_seed(&a, 42);
    e8kv_rng_seed(&b, 42);
    double s = 0, s2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        const double x = e8kv_rng_normal(&a);
        assert_true(x == e8kv_rng_normal(&b));
        s += x;
        s2 += x * x;
    }
    assert_true(fabs(s / n) < 0.01);
    assert_true(fabs(s2 / n - 1.0) < 0.02);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
#if defined(__FLT16_MAX__)
        cmocka_unit_test(test_fp16_against_compiler),
#endif
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_rng_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
