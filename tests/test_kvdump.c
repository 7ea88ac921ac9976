/* bench/kvdump: the K/V dump reader (doc/format.md section 1) on a well-formed file written byte by byte
 * here, and on every malformed variant the format names: truncated, bad magic, wrong version, size
 * mismatch, head_dim 0 or too large, reserved field set, overflowing n_vec, NaN, header bit flips. */
#include "test_util.h"

#include "../bench/kvdump.c" /* the reader is CLI code (bench/), not part of the library */

#include <math.h>
#include <unistd.h>

typedef struct {
    uint8_t *bytes;
    size_t size;
} blob;

/* A dump exactly as doc/format.md lays it out, written without the reader's helpers. */
static blob make_dump(uint32_t version, uint32_t head_dim, uint64_t n_vec, const float *v) {
    blob b;
    b.size = 40 + (size_t)n_vec * head_dim * 4;
    b.bytes = calloc(1, b.size);
    assert_non_null(b.bytes);
    memcpy(b.bytes, "E8KVDUMP", 8);
    for (int i = 0; i < 4; i++)
        b.bytes[8 + i] = (uint8_t)(version >> (8 * i));
    for (int i = 0; i < 4; i++)
        b.bytes[12 + i] = (uint8_t)(head_dim >> (8 * i));
    for (int i = 0; i < 8; i++)
        b.bytes[16 + i] = (uint8_t)(n_vec >> (8 * i));
    b.bytes[24] = 3;  /* keys and values */
    b.bytes[28] = 30; /* n_layer */
    b.bytes[32] = 3;  /* n_head_kv */
    for (size_t i = 0; i < (size_t)n_vec * head_dim; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++)
            b.bytes[40 + 4 * i + (size_t)k] = (uint8_t)(u >> (8 * k));
    }
    return b;
}

static char g_path[64];

static void write_file(const uint8_t *bytes, size_t size) {
    FILE *f = fopen(g_path, "wb");
    assert_non_null(f);
    if (size) assert_int_equal(fwrite(bytes, 1, size, f), size);
    fclose(f);
}

static size_t read_bytes(e8kv_kvdump *d, const uint8_t *bytes, size_t size) {
    write_file(bytes, size);
    return e8kv_kvdump_read(d, g_path);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/e8kv_test_kvdump_%ld.kvd", (long)getpid());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(g_path);
    return 0;
}

static float g_vals[3 * 8];

static void fill_vals(void) {
    for (int i = 0; i < 24; i++)
        g_vals[i] = (float)(i - 11) * 0.37f;
    g_vals[5] = -0.0f;
    g_vals[6] = 1e-40f; /* subnormal survives */
    g_vals[7] = 3.4e38f;
}

static void test_valid(void **state) {
    (void)state;
    fill_vals();
    blob b = make_dump(1, 8, 3, g_vals);
    e8kv_kvdump d;
    assert_ok(read_bytes(&d, b.bytes, b.size));
    assert_int_equal(d.n_vec, 3);
    assert_int_equal(d.head_dim, 8);
    assert_int_equal(d.flags, 3);
    assert_int_equal(d.n_layer, 30);
    assert_int_equal(d.n_head_kv, 3);
    assert_non_null(d.data);
    assert_memory_equal(d.data, g_vals, sizeof g_vals); /* bit-exact, -0.0 and subnormal included */
    e8kv_kvdump_free(&d);
    assert_null(d.data);
    e8kv_kvdump_free(NULL);
    free(b.bytes);
    /* zero vectors is a valid (empty) dump */
    b = make_dump(1, 64, 0, NULL);
    assert_ok(read_bytes(&d, b.bytes, b.size));
    assert_int_equal(d.n_vec, 0);
    assert_int_equal(d.head_dim, 64);
    e8kv_kvdump_free(&d);
    free(b.bytes);
}

static void test_truncated(void **state) {
    (void)state;
    fill_vals();
    blob b = make_dump(1, 8, 3, g_vals);
    e8kv_kvdump d;
    assert_error(read_bytes(&d, b.bytes, 0), TRUNCATED);
    assert_error(read_bytes(&d, b.bytes, 20), TRUNCATED);
    assert_error(read_bytes(&d, b.bytes, 39), TRUNCATED);
    assert_error(read_bytes(&d, b.bytes, 40), TRUNCATED);
    assert_error(read_bytes(&d, b.bytes, b.size - 1), TRUNCATED);
    assert_null(d.data);
    /* n_vec announcing far more than the file holds: rejected before any allocation */
    for (int i = 0; i < 8; i++)
        b.bytes[16 + i] = 0;
    b.bytes[21] = 1; /* 2^40 vectors */
    assert_error(read_bytes(&d, b.bytes, b.size), TRUNCATED);
    free(b.bytes);
}

static void test_bad_magic(void **state) {
    (void)state;
    fill_vals();
    blob b = make_dump(1, 8, 3, g_vals);
    e8kv_kvdump d;
    b.bytes[0] = 'e';
    assert_error(read_bytes(&d, b.bytes, b.size), CORRUPTED);
    b.bytes[0] = 'E';
    b.bytes[7] = 'Q';
    assert_error(read_bytes(&d, b.bytes, b.size), CORRUPTED);
    free(b.bytes);
}

static void test_wrong_version(void **state) {
    (void)state;
    fill_vals();
    const uint32_t versions[3] = {0, 2, 0x01000000u};
    for (int i = 0; i < 3; i++) {
        blob b = make_dump(versions[i], 8, 3, g_vals);
        e8kv_kvdump d;
        assert_error(read_bytes(&d, b.bytes, b.size), VERSION);
        free(b.bytes);
    }
}

static void test_size_mismatch(void **state) {
    (void)state;
    fill_vals();
    blob b = make_dump(1, 8, 3, g_vals);
    uint8_t *longer = calloc(1, b.size + 4);
    memcpy(longer, b.bytes, b.size);
    e8kv_kvdump d;
    assert_error(read_bytes(&d, longer, b.size + 1), CORRUPTED);
    assert_error(read_bytes(&d, longer, b.size + 4), CORRUPTED);
    /* header says 2 vectors, file holds 3 */
    b.bytes[16] = 2;
    assert_error(read_bytes(&d, b.bytes, b.size), CORRUPTED);
    /* n_vec·head_dim·4 overflows 64 bits */
    memset(b.bytes + 16, 0xff, 8);
    assert_error(read_bytes(&d, b.bytes, b.size), CORRUPTED);
    free(longer);
    free(b.bytes);
}

static void test_head_dim(void **state) {
    (void)state;
    fill_vals();
    blob b = make_dump(1, 0, 3, g_vals);
    e8kv_kvdump d;
    assert_error(read_bytes(&d, b.bytes, b.size), HEAD_DIM);
    free(b.bytes);
    b = make_dump(1, E8KV_MAX_HEAD_DIM + 1, 0, NULL);
    assert_error(read_bytes(&d, b.bytes, b.size), HEAD_DIM);
    free(b.bytes);
}

static void test_reserved_nan_io(void **state) {
    (void)state;
    fill_vals();
    blob b = make_dump(1, 8, 3, g_vals);
    e8kv_kvdump d;
    b.bytes[38] = 1;
    assert_error(read_bytes(&d, b.bytes, b.size), CORRUPTED);
    free(b.bytes);
    g_vals[13] = NAN;
    b = make_dump(1, 8, 3, g_vals);
    assert_error(read_bytes(&d, b.bytes, b.size), NONFINITE);
    assert_null(d.data);
    free(b.bytes);
    g_vals[13] = -INFINITY;
    b = make_dump(1, 8, 3, g_vals);
    assert_error(read_bytes(&d, b.bytes, b.size), NONFINITE);
    free(b.bytes);
    assert_error(e8kv_kvdump_read(&d, "/nonexistent/dir/x.kvd"), IO);
    assert_error(e8kv_kvdump_read(&d, NULL), BAD_ARGUMENT);
    assert_error(e8kv_kvdump_read(NULL, g_path), BAD_ARGUMENT);
    assert_error(e8kv_kvdump_parse_header(NULL, b.bytes, 40, 40), BAD_ARGUMENT);
}

/* Every single-bit flip of the header gives success or a named error; never a crash (ASan build). */
static void test_header_bit_flips(void **state) {
    (void)state;
    fill_vals();
    blob b = make_dump(1, 8, 3, g_vals);
    for (size_t bit = 0; bit < 40 * 8; bit++) {
        b.bytes[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        e8kv_kvdump d;
        const size_t r = read_bytes(&d, b.bytes, b.size);
        if (e8kv_is_error(r)) {
            const e8kv_error_code c = e8kv_get_error_code(r);
            assert_true(c == E8KV_ERROR_CORRUPTED || c == E8KV_ERROR_TRUNCATED || c == E8KV_ERROR_VERSION ||
                        c == E8KV_ERROR_HEAD_DIM);
            assert_null(d.data);
        } else {
            /* only flags, n_layer and n_head_kv may change without breaking the file */
            assert_true(bit / 8 >= 24 && bit / 8 < 36);
            assert_memory_equal(d.data, g_vals, sizeof g_vals);
        }
        e8kv_kvdump_free(&d);
        b.bytes[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    free(b.bytes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),           cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_magic),       cmocka_unit_test(test_wrong_version),
        cmocka_unit_test(test_size_mismatch),   cmocka_unit_test(test_head_dim),
        cmocka_unit_test(test_reserved_nan_io), cmocka_unit_test(test_header_bit_flips),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
