/* entropy/frame: lossless round trips for every content x coder (+ delta) and page size, random access
 * by page, fixed-rate codec bytes coded smaller and bit-exact back, raw fallback and the compress bound,
 * malformed frames (truncated, bit-flipped, wrong version/magic, trailing bytes) each with its named
 * error, golden frames of format v1 against an independent definition of their bytes, E8 frame
 * quantization, and a replay of fuzz/corpus/frame through the fuzz target. */
#include "test_util.h"

#include "common/common.h"
#include "common/rng.h"
#include "entropy/e8_entropy.h"
#include "golden_frames.h"

#include <dirent.h>
#include <math.h>
#include <xxhash.h>

#include "../fuzz/fuzz_frame.c"

static size_t encode(uint8_t **out, const void *src, size_t row_bytes, size_t n_rows, e8kv_frame_content c,
                     e8kv_frame_coder k, size_t rpp, int delta) {
    const e8kv_frame_params p = {.content = c, .coder = k, .rows_per_page = rpp, .delta = delta,
                                 .meta = "meta!", .meta_size = 5};
    const size_t cap = e8kv_compress_bound(row_bytes, n_rows, rpp, 5);
    assert_ok(cap);
    *out = malloc(cap);
    const size_t n = e8kv_frame_encode(*out, cap, src, row_bytes, n_rows, &p);
    assert_ok(n);
    assert_true(n <= cap);
    return n;
}

/* round trip + random access + every-page checks */
static size_t check_frame(const uint8_t *src, size_t row_bytes, size_t n_rows, e8kv_frame_content c,
                          e8kv_frame_coder k, size_t rpp, int delta) {
    uint8_t *f;
    const size_t n = encode(&f, src, row_bytes, n_rows, c, k, rpp, delta);
    e8kv_frame_info fi;
    assert_int_equal(e8kv_frame_get_info(&fi, f, n), n);
    assert_int_equal(fi.version, E8KV_FRAME_VERSION);
    assert_int_equal(fi.n_rows, n_rows);
    assert_int_equal(fi.row_bytes, row_bytes);
    assert_int_equal(fi.meta_size, 5);
    assert_memory_equal(f + fi.meta_offset, "meta!", 5);
    const size_t raw = row_bytes * n_rows;
    uint8_t *out = malloc(raw + 1);
    assert_int_equal(e8kv_frame_decode(out, raw, f, n), raw);
    if (raw) assert_memory_equal(out, src, raw);
    if (raw) assert_error(e8kv_frame_decode(out, raw - 1, f, n), DST_TOO_SMALL);
    size_t off = 0;
    for (size_t pg = 0; pg < fi.n_pages; pg++) {
        const size_t r = e8kv_frame_decode_page(out, raw, f, n, pg);
        assert_ok(r);
        assert_memory_equal(out, src + off, r);
        off += r;
    }
    assert_int_equal(off, raw);
    assert_error(e8kv_frame_decode_page(out, raw, f, n, fi.n_pages), BAD_ARGUMENT);
    /* encoding twice gives identical bytes */
    uint8_t *g;
    assert_int_equal(encode(&g, src, row_bytes, n_rows, c, k, rpp, delta), n);
    assert_memory_equal(f, g, n);
    free(g), free(f), free(out);
    return n;
}

static uint8_t *e8_rows(size_t n_vec, size_t head_dim, float step, uint64_t seed) {
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    float *x = malloc(n_vec * head_dim * sizeof *x);
    for (size_t i = 0; i < n_vec * head_dim; i++) x[i] = (float)e8kv_rng_normal(&rng);
    int16_t *q = malloc(n_vec * head_dim * sizeof *q);
    assert_int_equal(e8kv_frame_e8_quantize(q, n_vec * head_dim, x, n_vec, head_dim, step, 1), n_vec * head_dim);
    uint8_t *rows = malloc(n_vec * head_dim * 2);
    for (size_t i = 0; i < n_vec * head_dim; i++) {
        rows[2 * i] = (uint8_t)(uint16_t)q[i];
        rows[2 * i + 1] = (uint8_t)((uint16_t)q[i] >> 8);
    }
    free(x), free(q);
    return rows;
}

static void test_round_trips(void **state) {
    (void)state;
    uint8_t b[GOLDEN_BYTES_ROWS * GOLDEN_BYTES_ROW];
    golden_bytes(b);
    uint8_t *e = e8_rows(300, 64, 0.3f, 5);
    const size_t rpps[] = {0, 1, 7, 64, 299, 300, 1000};
    for (size_t i = 0; i < sizeof rpps / sizeof rpps[0]; i++)
        for (int k = 0; k < 3; k++)
            for (int d = 0; d < 2; d++) {
                if (d && k != E8KV_FRAME_ZSTD) continue;
                check_frame(b, GOLDEN_BYTES_ROW, GOLDEN_BYTES_ROWS, E8KV_FRAME_BYTES, (e8kv_frame_coder)k, rpps[i], d);
                check_frame(e, 128, 300, E8KV_FRAME_E8, (e8kv_frame_coder)k, rpps[i], d);
            }
    check_frame(e, 128, 0, E8KV_FRAME_E8, E8KV_FRAME_RANS, 0, 0);
    check_frame(e, 128, 1, E8KV_FRAME_E8, E8KV_FRAME_RANS, 0, 0);
    check_frame(b, 1, 17, E8KV_FRAME_BYTES, E8KV_FRAME_RANS, 4, 0);
    check_frame(b, 300, 30, E8KV_FRAME_BYTES, E8KV_FRAME_RANS, 4, 0); /* wider than per-field limit */
    /* an E8 frame costs the one-block E8 stream plus its fixed header and, per page, the index entry,
     * two rANS state blocks and three varints */
    const size_t n = check_frame(e, 128, 300, E8KV_FRAME_E8, E8KV_FRAME_RANS, 64, 0);
    int32_t *pts = malloc(300 * 64 * sizeof *pts);
    for (size_t i = 0; i < 300 * 64; i++) pts[i] = (int16_t)e8kv_load_le16(e + 2 * i);
    const size_t stream = e8kv_e8_coded_size(pts, 300 * 8);
    print_message("E8 frame %zu bytes (%.3f bits/value), one-block stream %zu\n", n, 8.0 * n / (300 * 64.0), stream);
    assert_true(n <= stream + 40 + 5 + 8 + 5 * (8 + 2 * 16 + 3 * 3));
    free(pts);
    free(e);
}

static void test_codec_bytes_lossless(void **state) {
    (void)state;
    /* fixed-rate formats: the page's codec bytes come back bit-exact from a smaller frame */
    const char *specs[] = {"f16", "q8_0", "q4_0h", "lloyd:3", "e8:4", "e8:2"};
    const size_t head_dim = 64, n_vec = 2048;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 9);
    float *x = malloc(n_vec * head_dim * sizeof *x);
    for (size_t i = 0; i < n_vec * head_dim; i++) x[i] = (float)e8kv_rng_normal(&rng) * (1.0f + (float)(i % 7));
    int n_tested = 0;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        size_t err;
        e8kv_codec *c = e8kv_codec_create(specs[s], head_dim, 1, &err);
        if (!c) continue; /* a family not built yet */
        const size_t vb = e8kv_codec_vector_bytes(c);
        uint8_t *bytes = malloc(vb * n_vec);
        assert_int_equal(e8kv_codec_encode(c, bytes, vb * n_vec, x, n_vec), vb * n_vec);
        const size_t fr = check_frame(bytes, vb, n_vec, E8KV_FRAME_BYTES, E8KV_FRAME_RANS, 256, 0);
        const size_t fz = check_frame(bytes, vb, n_vec, E8KV_FRAME_BYTES, E8KV_FRAME_ZSTD, 256, 1);
        print_message("%-8s raw %7zu  rans %7zu (%.3f)  zstd+delta %7zu (%.3f)\n", specs[s], vb * n_vec, fr,
                      (double)fr / (double)(vb * n_vec), fz, (double)fz / (double)(vb * n_vec));
        assert_true(fr <= vb * n_vec + 8 * 8 + 200); /* never much larger than raw (raw page fallback) */
        free(bytes);
        e8kv_codec_free(c);
        n_tested++;
    }
    assert_true(n_tested > 0);
    free(x);
}

static void test_raw_fallback_and_bound(void **state) {
    (void)state;
    const size_t n = 5000;
    uint8_t *rnd = malloc(n);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 4);
    for (size_t i = 0; i < n; i++) rnd[i] = (uint8_t)e8kv_rng_next(&rng);
    uint8_t *f;
    const size_t sz = encode(&f, rnd, 50, 100, E8KV_FRAME_BYTES, E8KV_FRAME_RANS, 10, 0);
    e8kv_frame_info fi;
    assert_ok(e8kv_frame_get_info(&fi, f, sz));
    for (size_t pg = 0; pg < fi.n_pages; pg++) /* incompressible pages are stored raw */
        assert_true(e8kv_load_le32(f + fi.header_size - 8 - 8 * (fi.n_pages - pg)) & 0x80000000u);
    /* a destination one byte short of the frame */
    const e8kv_frame_params p = {.content = E8KV_FRAME_BYTES, .coder = E8KV_FRAME_RANS, .rows_per_page = 10};
    uint8_t *g = malloc(sz);
    assert_error(e8kv_frame_encode(g, sz - 5 - 1, rnd, 50, 100, &p), DST_TOO_SMALL); /* no meta: 5 fewer */
    assert_int_equal(e8kv_frame_encode(g, sz - 5, rnd, 50, 100, &p), sz - 5);
    /* bad arguments */
    e8kv_frame_params q = p;
    q.content = E8KV_FRAME_E8;
    assert_error(e8kv_frame_encode(g, sz, rnd, 50, 100, &q), BAD_ARGUMENT); /* 50 % 16 */
    assert_error(e8kv_frame_encode(g, sz, rnd, 48, 100, &q), BAD_ARGUMENT); /* not E8 points */
    q = p;
    q.coder = (e8kv_frame_coder)7;
    assert_error(e8kv_frame_encode(g, sz, rnd, 50, 100, &q), BAD_ARGUMENT);
    assert_error(e8kv_frame_encode(g, sz, rnd, 0, 100, &p), BAD_ARGUMENT);
    free(rnd), free(f), free(g);
}

static void test_malformed(void **state) {
    (void)state;
    uint8_t *e = e8_rows(100, 64, 0.3f, 6);
    uint8_t *f;
    const size_t n = encode(&f, e, 128, 100, E8KV_FRAME_E8, E8KV_FRAME_RANS, 16, 0);
    e8kv_frame_info fi;
    assert_ok(e8kv_frame_get_info(&fi, f, n));
    uint8_t *out = malloc(128 * 100);
    /* truncated anywhere: TRUNCATED */
    for (size_t cut = 0; cut < n; cut += 1 + (cut < 64 ? 0 : 37))
        assert_error(e8kv_frame_decode(out, 128 * 100, f, cut), TRUNCATED);
    /* trailing bytes */
    uint8_t *g = malloc(n + 1);
    memcpy(g, f, n);
    g[n] = 0;
    assert_error(e8kv_frame_decode(out, 128 * 100, g, n + 1), CORRUPTED);
    /* magic and version */
    memcpy(g, f, n);
    g[0] = 'X';
    assert_error(e8kv_frame_decode(out, 128 * 100, g, n), CORRUPTED);
    memcpy(g, f, n);
    e8kv_store_le16(g + 4, E8KV_FRAME_VERSION + 1);
    assert_error(e8kv_frame_decode(out, 128 * 100, g, n), VERSION);
    assert_error(e8kv_frame_get_info(&fi, g, n), VERSION);
    e8kv_store_le16(g + 4, 0);
    assert_error(e8kv_frame_decode(out, 128 * 100, g, n), VERSION);
    /* any single bit flip after the version: CHECKSUM (header, tables, index or page), or CORRUPTED when
     * a header field is out of range before the checksum can be located, or TRUNCATED when a flipped
     * size field points past the end; never success */
    for (size_t pos = 6; pos < n; pos += (pos < fi.header_size ? 1 : 7)) {
        memcpy(g, f, n);
        g[pos] ^= (uint8_t)(1u << (pos % 8));
        const size_t r = e8kv_frame_decode(out, 128 * 100, g, n);
        assert_true(e8kv_is_error(r));
        const e8kv_error_code code = e8kv_get_error_code(r);
        assert_true(code == E8KV_ERROR_CHECKSUM || code == E8KV_ERROR_CORRUPTED || code == E8KV_ERROR_TRUNCATED);
        if (pos >= fi.header_size) assert_int_equal(code, E8KV_ERROR_CHECKSUM);
    }
    free(e), free(f), free(g), free(out);
}

static uint8_t *read_file(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc(*size + 1);
    assert_int_equal(fread(b, 1, *size, fp), *size);
    fclose(fp);
    return b;
}

static void test_golden_frames(void **state) {
    (void)state;
    const char *root = getenv("E8KV_SOURCE_DIR");
    if (!root) skip();
    uint8_t b[GOLDEN_BYTES_ROWS * GOLDEN_BYTES_ROW], e[GOLDEN_E8_ROWS * GOLDEN_E8_ROW];
    golden_bytes(b);
    golden_e8(e);
    /* the formulas' bytes are pinned too, so neither side can drift unnoticed */
    assert_true(XXH64(b, sizeof b, 0) == 0x8a9b57ff27f7ce83ull);
    assert_true(XXH64(e, sizeof e, 0) == 0xfc326ac477026dd2ull);
    const struct {
        const char *name;
        const uint8_t *want;
        size_t n;
    } g[] = {{"v1_bytes_rans.e8f", b, sizeof b}, {"v1_bytes_zstd_delta.e8f", b, sizeof b},
             {"v1_e8_rans.e8f", e, sizeof e},     {"v1_e8_zstd.e8f", e, sizeof e}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/data/golden_frames/%s", root, g[i].name);
        size_t size;
        uint8_t *f = read_file(path, &size);
        assert_non_null(f);
        uint8_t *out = malloc(g[i].n);
        assert_int_equal(e8kv_frame_decode(out, g[i].n, f, size), g[i].n);
        assert_memory_equal(out, g[i].want, g[i].n);
        free(out), free(f);
    }
}

static void test_e8_quantize(void **state) {
    (void)state;
    const size_t d = 96, n = 50;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 2);
    float *x = malloc(n * d * sizeof *x), *y = malloc(n * d * sizeof *y);
    int16_t *q = malloc(n * d * sizeof *q);
    for (size_t i = 0; i < n * d; i++) x[i] = (float)e8kv_rng_normal(&rng);
    const float step = 0.25f;
    assert_int_equal(e8kv_frame_e8_quantize(q, n * d, x, n, d, step, 3), n * d);
    assert_int_equal(e8kv_frame_e8_dequantize(y, n * d, q, n, d, step, 3), n * d);
    double se = 0;
    for (size_t i = 0; i < n * d; i++) se += (x[i] - y[i]) * (x[i] - y[i]);
    /* E8 at step δ: MSE = G(E8)·δ² (unit covolume) = 0.0717·δ², within sampling noise */
    const double mse = se / (double)(n * d);
    assert_true(fabs(mse / (0.0716821 * step * step) - 1.0) < 0.1);
    assert_error(e8kv_frame_e8_quantize(q, n * d, x, n, 12, step, 3), HEAD_DIM);
    assert_error(e8kv_frame_e8_quantize(q, n * d, x, n, d, 0.0f, 3), BAD_ARGUMENT);
    assert_error(e8kv_frame_e8_quantize(q, n * d - 1, x, n, d, step, 3), DST_TOO_SMALL);
    x[17] = NAN;
    assert_error(e8kv_frame_e8_quantize(q, n * d, x, n, d, step, 3), NONFINITE);
    x[17] = 1e6f;
    assert_error(e8kv_frame_e8_quantize(q, n * d, x, n, d, 1e-3f, 3), RANGE);
    free(x), free(y), free(q);
}

static void test_fuzz_corpus_replay(void **state) {
    (void)state;
    const char *root = getenv("E8KV_SOURCE_DIR");
    if (!root) skip();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/frame", root);
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    size_t n_files = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        size_t size;
        uint8_t *b = read_file(path, &size);
        assert_non_null(b);
        LLVMFuzzerTestOneInput(b, size);
        free(b);
        n_files++;
    }
    closedir(dp);
    assert_true(n_files > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),        cmocka_unit_test(test_codec_bytes_lossless),
        cmocka_unit_test(test_raw_fallback_and_bound), cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_golden_frames),      cmocka_unit_test(test_e8_quantize),
        cmocka_unit_test(test_fuzz_corpus_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
