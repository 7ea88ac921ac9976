/* Bad input through the public codec API, for every family in the registry (src/quant/codec.c):
 * NaN/Inf, zero vectors, huge finite values, unsupported head_dim, rates out of range, short buffers,
 * source size mismatches, unknown specs and NULL pointers. Each case must give its named error and a
 * rejected encode must leave the destination untouched. */
#include "test_util.h"

#include <math.h>

typedef enum { HUGE_OK, HUGE_RANGE } huge_rule;

typedef struct {
    const char *spec;
    size_t head_dim;        /* a supported head_dim */
    huge_rule huge;         /* documented answer to a 1e30 component */
    size_t bad_dims[4];     /* unsupported head_dims (0-terminated list after the first) */
} family_case;

static const family_case k_cases[] = {
    {"f32", 64, HUGE_OK, {0, 513, 1000, 0}},
    {"f16", 64, HUGE_RANGE, {0, 513, 0, 0}},
    {"bf16", 64, HUGE_OK, {0, 513, 0, 0}},
    {"q8_0", 64, HUGE_RANGE, {48, 12, 0, 0}},
    {"q8_0h", 96, HUGE_RANGE, {48, 12, 520, 0}},
    {"q4_0", 128, HUGE_RANGE, {40, 31, 0, 0}},
    {"q4_0h", 64, HUGE_RANGE, {48, 12, 520, 0}},
    {"lloyd:2", 64, HUGE_RANGE, {12, 4, 520, 0}},
    {"lloyd:3", 72, HUGE_RANGE, {12, 20, 0, 0}},
    {"lloyd:4", 128, HUGE_RANGE, {100, 7, 0, 0}},
    {"e8:2", 64, HUGE_RANGE, {12, 4, 520, 0}},
    {"e8:4", 128, HUGE_RANGE, {12, 100, 0, 0}},
    {"e8ball:2", 128, HUGE_RANGE, {36, 0, 0, 0}},
    {"e8ball:3", 96, HUGE_RANGE, {12, 20, 0, 0}},
    {"e8nest:2", 64, HUGE_RANGE, {12, 4, 520, 0}},
    {"e8nest:4:q=3.5", 128, HUGE_RANGE, {36, 0, 0, 0}},
    {"d4nest:3", 64, HUGE_RANGE, {6, 2, 0, 0}},
    {"d4nest:4", 96, HUGE_RANGE, {10, 0, 0, 0}},
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

static e8kv_codec *make(const family_case *fc) {
    size_t err = 1;
    e8kv_codec *const c = e8kv_codec_create(fc->spec, fc->head_dim, 1, &err);
    if (!c) fail_msg("create %s/%zu: %s", fc->spec, fc->head_dim, e8kv_error_name(err));
    assert_int_equal(err, 0);
    return c;
}

static float *gaussian(size_t n, uint32_t seed) {
    float *const x = malloc(n * sizeof *x);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        float u = 0.0f;
        for (int k = 0; k < 4; k++) {
            s = s * 1664525u + 1013904223u;
            u += (float)(s >> 8) / 16777216.0f - 0.5f;
        }
        x[i] = u;
    }
    return x;
}

static void test_nonfinite(void **state) {
    (void)state;
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t f = 0; f < N_CASES; f++) {
        e8kv_codec *const c = make(&k_cases[f]);
        const size_t d = k_cases[f].head_dim, vb = e8kv_codec_vector_bytes(c);
        float *const x = gaussian(3 * d, 1);
        uint8_t *const dst = malloc(3 * vb);
        for (size_t b = 0; b < 3; b++) {
            for (size_t where = 0; where < 3; where++) {
                const size_t pos = where * d + (where * 7) % d; /* in vector 0, 1 or 2 */
                const float keep = x[pos];
                x[pos] = bad[b];
                memset(dst, 0xAB, 3 * vb);
                assert_error(e8kv_codec_encode(c, dst, 3 * vb, x, 3), NONFINITE);
                for (size_t i = 0; i < 3 * vb; i++)
                    if (dst[i] != 0xAB) fail_msg("%s: byte %zu written on a rejected encode", k_cases[f].spec, i);
                x[pos] = keep;
            }
        }
        assert_int_equal(e8kv_codec_encode(c, dst, 3 * vb, x, 3), 3 * vb);
        free(x);
        free(dst);
        e8kv_codec_free(c);
    }
}

static void test_zero_vectors(void **state) {
    (void)state;
    for (size_t f = 0; f < N_CASES; f++) {
        e8kv_codec *const c = make(&k_cases[f]);
        const size_t d = k_cases[f].head_dim, vb = e8kv_codec_vector_bytes(c);
        float *const x = calloc(2 * d, sizeof(float)), *const y = malloc(2 * d * sizeof(float));
        uint8_t *const b = malloc(2 * vb);
        assert_int_equal(e8kv_codec_encode(c, b, 2 * vb, x, 2), 2 * vb);
        for (int rot = 0; rot < 2; rot++) {
            for (size_t i = 0; i < 2 * d; i++) y[i] = 1.0f;
            if (rot)
                assert_int_equal(e8kv_codec_decode_rotated(c, y, 2 * d, b, 2 * vb, 2), 2 * d);
            else
                assert_int_equal(e8kv_codec_decode(c, y, 2 * d, b, 2 * vb, 2), 2 * d);
            for (size_t i = 0; i < 2 * d; i++)
                if (y[i] != 0.0f) fail_msg("%s: zero vector decodes to %g at %zu", k_cases[f].spec, y[i], i);
        }
        free(x);
        free(y);
        free(b);
        e8kv_codec_free(c);
    }
}

static void test_huge_values(void **state) {
    (void)state;
    for (size_t f = 0; f < N_CASES; f++) {
        e8kv_codec *const c = make(&k_cases[f]);
        const size_t d = k_cases[f].head_dim, vb = e8kv_codec_vector_bytes(c);
        float *const x = gaussian(2 * d, 2), *const y = malloc(2 * d * sizeof(float));
        uint8_t *const b = malloc(2 * vb);
        for (int sign = -1; sign <= 1; sign += 2) {
            x[d + 3] = (float)sign * 1e30f; /* in the second vector */
            memset(b, 0xAB, 2 * vb);
            const size_t r = e8kv_codec_encode(c, b, 2 * vb, x, 2);
            if (k_cases[f].huge == HUGE_RANGE) {
                assert_error(r, RANGE);
                /* all or nothing: the first vector's bytes are not left behind */
                for (size_t i = 0; i < vb; i++) assert_true(b[i] == 0 || b[i] == 0xAB);
                /* a single huge vector: nothing written at all */
                memset(b, 0xAB, vb);
                assert_error(e8kv_codec_encode(c, b, vb, x + d, 1), RANGE);
                for (size_t i = 0; i < vb; i++) assert_int_equal(b[i], 0xAB);
            } else {
                assert_int_equal(r, 2 * vb);
                assert_int_equal(e8kv_codec_decode(c, y, 2 * d, b, 2 * vb, 2), 2 * d);
                assert_true(fabsf(y[d + 3] - (float)sign * 1e30f) <= 0x1p-8f * 1e30f); /* f32 exact, bf16 8 bits */
            }
        }
        free(x);
        free(y);
        free(b);
        e8kv_codec_free(c);
    }
}

static void test_head_dim(void **state) {
    (void)state;
    for (size_t f = 0; f < N_CASES; f++) {
        for (size_t k = 0; k < 4; k++) {
            const size_t d = k_cases[f].bad_dims[k];
            if (k > 0 && d == 0) break;
            size_t err = 0;
            assert_null(e8kv_codec_create(k_cases[f].spec, d, 0, &err));
            if (e8kv_get_error_code(err) != E8KV_ERROR_HEAD_DIM)
                fail_msg("%s head_dim %zu: %s", k_cases[f].spec, d, e8kv_error_name(err));
        }
    }
}

static void test_rate(void **state) {
    (void)state;
    const char *bad_rate[] = {"lloyd:1", "lloyd:5", "lloyd:0", "lloyd:17", "lloyd:999999999999999999999", "lloyd",
                              "e8:5",    "e8:1",    "e8:0",    "e8ball:5", "e8ball:16",                   "e8",
                              "e8nest:5", "e8nest:1:q=3", "d4nest:1", "d4nest:8"};
    for (size_t i = 0; i < sizeof bad_rate / sizeof bad_rate[0]; i++) {
        size_t err = 0;
        assert_null(e8kv_codec_create(bad_rate[i], 64, 0, &err));
        if (e8kv_get_error_code(err) != E8KV_ERROR_RATE) fail_msg("%s: %s", bad_rate[i], e8kv_error_name(err));
    }
}

static void test_spec(void **state) {
    (void)state;
    const char *bad_spec[] = {"",         "e9",      "q8_1",          "Q8_0",      "q8_0:4",  "q4_0:q=2",
                              "lloyd:2:zz", "lloyd:x", "lloyd:2:q=1",   "f16:8",     "lloyd:-2", ":2",
                              "f32:q=",  "averyveryverylongfamilyname:2",
                              "lloyd:2:q=1:q=1:q=1:q=1:q=1:q=1:q=1:q=1:q=1:q=1:q=1:q=1:q=1:q=1:q",
                              "e8nest:2:q=0", "e8nest:2:q=-1", "d4nest:2:q=x", "e8nest:2:r=3"};
    for (size_t i = 0; i < sizeof bad_spec / sizeof bad_spec[0]; i++) {
        size_t err = 0;
        e8kv_codec *const c = e8kv_codec_create(bad_spec[i], 64, 0, &err);
        if (c) fail_msg("\"%s\" accepted", bad_spec[i]);
        if (e8kv_get_error_code(err) != E8KV_ERROR_SPEC) fail_msg("\"%s\": %s", bad_spec[i], e8kv_error_name(err));
    }
    /* an unknown family with a bad rate is still a spec error, and err may be NULL */
    size_t err = 0;
    assert_null(e8kv_codec_create("e9:99", 64, 0, &err));
    assert_error(err, SPEC);
    assert_null(e8kv_codec_create("e9", 64, 0, NULL));
}

static void test_buffer_sizes(void **state) {
    (void)state;
    for (size_t f = 0; f < N_CASES; f++) {
        e8kv_codec *const c = make(&k_cases[f]);
        const size_t d = k_cases[f].head_dim, vb = e8kv_codec_vector_bytes(c);
        float *const x = gaussian(2 * d, 3), *const y = malloc(2 * d * sizeof(float));
        uint8_t *const b = malloc(2 * vb + 1);
        memset(b, 0xAB, 2 * vb + 1);
        assert_error(e8kv_codec_encode(c, b, 2 * vb - 1, x, 2), DST_TOO_SMALL);
        for (size_t i = 0; i < 2 * vb; i++) assert_int_equal(b[i], 0xAB);
        assert_int_equal(e8kv_codec_encode(c, b, 2 * vb + 1, x, 2), 2 * vb); /* larger is fine */
        assert_int_equal(b[2 * vb], 0xAB);
        assert_error(e8kv_codec_decode(c, y, 2 * d - 1, b, 2 * vb, 2), DST_TOO_SMALL);
        assert_error(e8kv_codec_decode_rotated(c, y, 2 * d - 1, b, 2 * vb, 2), DST_TOO_SMALL);
        assert_error(e8kv_codec_decode(c, y, 2 * d, b, 2 * vb - 1, 2), SRC_SIZE);
        assert_error(e8kv_codec_decode(c, y, 2 * d, b, 2 * vb + 1, 2), SRC_SIZE);
        assert_error(e8kv_codec_decode_rotated(c, y, 2 * d, b, 2 * vb + 1, 2), SRC_SIZE);
        assert_error(e8kv_codec_decode(c, y, 2 * d, b, vb, 2), SRC_SIZE);
        assert_error(e8kv_codec_decode(c, y, 2 * d, b, 2 * vb, SIZE_MAX / 2), SRC_SIZE);
        assert_error(e8kv_codec_encode(c, b, 2 * vb, x, SIZE_MAX / 2), DST_TOO_SMALL);
        assert_int_equal(e8kv_codec_decode(c, y, 2 * d, b, 2 * vb, 2), 2 * d);
        free(x);
        free(y);
        free(b);
        e8kv_codec_free(c);
    }
}

static void test_null_pointers(void **state) {
    (void)state;
    for (size_t f = 0; f < N_CASES; f++) {
        e8kv_codec *const c = make(&k_cases[f]);
        const size_t d = k_cases[f].head_dim, vb = e8kv_codec_vector_bytes(c);
        float *const x = gaussian(d, 4);
        uint8_t *const b = malloc(vb);
        assert_error(e8kv_codec_encode(NULL, b, vb, x, 1), BAD_ARGUMENT);
        assert_error(e8kv_codec_encode(c, NULL, vb, x, 1), BAD_ARGUMENT);
        assert_error(e8kv_codec_encode(c, b, vb, NULL, 1), BAD_ARGUMENT);
        assert_error(e8kv_codec_decode(NULL, x, d, b, vb, 1), BAD_ARGUMENT);
        assert_error(e8kv_codec_decode(c, NULL, d, b, vb, 1), BAD_ARGUMENT);
        assert_error(e8kv_codec_decode(c, x, d, NULL, vb, 1), BAD_ARGUMENT);
        assert_error(e8kv_codec_decode_rotated(c, x, d, NULL, vb, 1), BAD_ARGUMENT);
        assert_error(e8kv_codec_rotate(NULL, x, 1, 0), BAD_ARGUMENT);
        assert_error(e8kv_codec_rotate(c, NULL, 1, 1), BAD_ARGUMENT);
        free(x);
        free(b);
        e8kv_codec_free(c);
    }
    size_t err = 0;
    assert_null(e8kv_codec_create(NULL, 64, 0, &err));
    assert_error(err, BAD_ARGUMENT);
    e8kv_codec_free(NULL); /* a no-op */
    assert_int_equal(e8kv_codec_vector_bytes(NULL), 0);
}

/* Bytes no encode wrote (issue 12, item 7): a NaN or Inf f32/f16 payload or scale field decodes to
 * E8KV_ERROR_CORRUPTED, never to NaN/Inf output; any bytes either decode to finite values or give that
 * error, for every family; the largest finite f16 still decodes. */
static void test_untrusted_bytes(void **state) {
    (void)state;
    static const struct {
        const char *spec;
        size_t offset; /* of a 16-bit little-endian f16 field (payload or scale) in vector 1 */
    } f16_fields[] = {{"f16", 10}, {"q4_0h", 0},    {"q4_0h", 18},  {"q8_0", 34},
                      {"e8:4", 0}, {"e8nest:3", 0}, {"lloyd:3", 0}, {"e8ball:2", 0}};
    static const uint16_t bad_halves[] = {0x7C00, 0xFC00, 0x7E00, 0xFFFF, 0x7C01};
    for (size_t k = 0; k < sizeof f16_fields / sizeof f16_fields[0]; k++) {
        size_t err = 0;
        e8kv_codec *c = e8kv_codec_create(f16_fields[k].spec, 64, 1, &err);
        assert_non_null(c);
        const size_t vb = e8kv_codec_vector_bytes(c);
        float *const x = gaussian(3 * 64, 9), y[3 * 64];
        uint8_t *const b = malloc(3 * vb);
        assert_int_equal(e8kv_codec_encode(c, b, 3 * vb, x, 3), 3 * vb);
        for (size_t i = 0; i < sizeof bad_halves / sizeof bad_halves[0]; i++) {
            uint8_t *const field = b + vb + f16_fields[k].offset;
            const uint8_t save0 = field[0], save1 = field[1];
            field[0] = (uint8_t)bad_halves[i];
            field[1] = (uint8_t)(bad_halves[i] >> 8);
            assert_error(e8kv_codec_decode(c, y, 3 * 64, b, 3 * vb, 3), CORRUPTED);
            assert_error(e8kv_codec_decode_rotated(c, y, 3 * 64, b, 3 * vb, 3), CORRUPTED);
            assert_error(e8kv_codec_decode(c, y, 64, b + vb, vb, 1), CORRUPTED);
            field[0] = save0;
            field[1] = save1;
        }
        assert_int_equal(e8kv_codec_decode(c, y, 3 * 64, b, 3 * vb, 3), 3 * 64); /* restored: fine */
        free(x);
        free(b);
        e8kv_codec_free(c);
    }
    /* the largest finite f16, and an f32 NaN */
    e8kv_codec *c = e8kv_codec_create("f16", 8, 1, NULL);
    uint8_t h[16] = {0};
    h[4] = 0xFF, h[5] = 0x7B; /* 65504 */
    float y[8];
    assert_int_equal(e8kv_codec_decode(c, y, 8, h, 16, 1), 8);
    assert_true(y[2] == 65504.0f);
    e8kv_codec_free(c);
    c = e8kv_codec_create("f32", 8, 1, NULL);
    uint8_t w[32] = {0};
    w[30] = 0xC0, w[31] = 0x7F; /* the last value: a quiet NaN */
    assert_error(e8kv_codec_decode(c, y, 8, w, 32, 1), CORRUPTED);
    e8kv_codec_free(c);
    /* random bytes: finite values or CORRUPTED, for every family */
    static const char *const more[] = {"e8v:3", "e8v:1.5", "e8box:4", "e8box:3", "e8box:2", "e8p:2"};
    for (size_t f = 0; f < N_CASES + sizeof more / sizeof more[0]; f++) {
        const char *spec = f < N_CASES ? k_cases[f].spec : more[f - N_CASES];
        const size_t d = f < N_CASES ? k_cases[f].head_dim : 64;
        c = e8kv_codec_create(spec, d, 1, NULL);
        assert_non_null(c);
        const size_t vb = e8kv_codec_vector_bytes(c);
        uint8_t *const b = malloc(vb);
        float *const out = malloc(d * sizeof *out);
        uint32_t s = (uint32_t)f * 7919u + 1u;
        size_t n_bad = 0;
        for (int t = 0; t < 3000; t++) {
            for (size_t i = 0; i < vb; i++) {
                s = s * 1664525u + 1013904223u;
                b[i] = (uint8_t)(s >> 24);
            }
            const size_t r = e8kv_codec_decode(c, out, d, b, vb, 1);
            if (e8kv_is_error(r)) {
                assert_error(r, CORRUPTED);
                n_bad++;
            } else {
                for (size_t i = 0; i < d; i++)
                    if (!isfinite(out[i])) fail_msg("%s: random bytes decoded to %g", spec, out[i]);
            }
        }
        if (!strcmp(spec, "f16") || !strcmp(spec, "bf16") || !strcmp(spec, "f32"))
            assert_true(n_bad > 0); /* the check was reached */
        free(b);
        free(out);
        e8kv_codec_free(c);
    }
}

/* bf16 (the GPU cache's raw pages): the upper 16 bits of binary32 rounded to nearest, ties to even, and
 * RANGE for what would round to infinity. */
static void test_bf16(void **state) {
    (void)state;
    e8kv_codec *c = e8kv_codec_create("bf16", 8, 1, NULL);
    assert_non_null(c);
    assert_int_equal(e8kv_codec_vector_bytes(c), 16);
    const float x[8] = {1.00390625f,  /* 0x3f808000: a tie, even below → 0x3f80 */
                        1.01171875f,  /* 0x3f818000: a tie, odd below → 0x3f82 */
                        0x1.010002p0f, /* just above the tie → 0x3f81 */
                        -2.5f,        /* exact: 0xc020 */
                        3.3895313e38f, /* the largest finite bf16, 0x7f7f */
                        1e-40f,       /* subnormal 0x000116c2 → 0x0001 */
                        0.0f,         -0.0f};
    const uint16_t want[8] = {0x3f80, 0x3f82, 0x3f81, 0xc020, 0x7f7f, 0x0001, 0x0000, 0x8000};
    uint8_t b[16];
    assert_int_equal(e8kv_codec_encode(c, b, sizeof b, x, 1), 16);
    for (int i = 0; i < 8; i++)
        assert_int_equal(b[2 * i] | b[2 * i + 1] << 8, want[i]);
    float y[8];
    assert_int_equal(e8kv_codec_decode(c, y, 8, b, 16, 1), 8);
    assert_true(y[3] == -2.5f && y[0] == 1.0f && y[4] == 3.3895313e38f);
    float big[8] = {0, 0, 0, 3.4e38f, 0, 0, 0, 0}; /* above 0x1.ffp127: rounds to infinity */
    memset(b, 0xab, sizeof b);
    assert_error(e8kv_codec_encode(c, b, sizeof b, big, 1), RANGE);
    assert_int_equal(b[0], 0xab); /* untouched */
    e8kv_codec_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_nonfinite),    cmocka_unit_test(test_zero_vectors), cmocka_unit_test(test_huge_values),
        cmocka_unit_test(test_head_dim),     cmocka_unit_test(test_rate),         cmocka_unit_test(test_spec),
        cmocka_unit_test(test_buffer_sizes), cmocka_unit_test(test_null_pointers),
        cmocka_unit_test(test_untrusted_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
