/* entropy/rans: round trips over many shapes and contexts, fast decoder == _ref twin (symbols and error
 * codes), coded size vs the empirical entropy, table serialization, malformed blocks and tables, and a
 * replay of every fuzz/corpus/rans input through the fuzz target. */
#include "test_util.h"

#include "common/rng.h"
#include "entropy/rans.h"

#include <dirent.h>
#include <math.h>

#include "../fuzz/fuzz_rans.c"

/* n symbols from a two-sided geometric law (a quantized Laplacian), mapped to 0..alphabet-1 */
static void make_symbols(uint8_t *s, size_t n, double p_zero, size_t alphabet, uint64_t seed) {
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (k + 1 < alphabet && e8kv_rng_uniform(&rng) > p_zero) k++;
        s[i] = (uint8_t)k;
    }
}

static void count(uint64_t *c, const uint8_t *s, size_t n, size_t period, size_t which) {
    memset(c, 0, 256 * sizeof *c);
    for (size_t i = which; i < n; i += period) c[s[i]]++;
}

static double entropy_bits(const uint64_t *c) {
    double tot = 0, h = 0;
    for (int k = 0; k < 256; k++) tot += (double)c[k];
    for (int k = 0; k < 256; k++)
        if (c[k]) h -= (double)c[k] * log2((double)c[k] / tot);
    return h;
}

/* encode with `period` tables fitted per position, decode with both decoders, compare */
static size_t round_trip(const uint8_t *s, size_t n, size_t period, const uint8_t *sel, size_t n_sets) {
    e8kv_rans_table *t = calloc(period * n_sets, sizeof *t);
    e8kv_rans_dtable *d = calloc(period * n_sets, sizeof *d);
    uint64_t *c = calloc(256 * period * n_sets, sizeof *c);
    for (size_t i = 0; i < n; i++) {
        const size_t ti = (sel ? sel[i / period] : 0) * period + i % period;
        c[256 * ti + s[i]]++;
    }
    for (size_t k = 0; k < period * n_sets; k++) {
        assert_ok(e8kv_rans_table_build(&t[k], c + 256 * k, 256));
        e8kv_rans_dtable_init(&d[k], &t[k]);
    }
    const size_t cap = e8kv_rans_bound(n);
    uint8_t *buf = malloc(cap), *a = malloc(n + 1), *b = malloc(n + 1);
    const size_t sz = e8kv_rans_encode(buf, cap, s, n, t, period, sel);
    assert_ok(sz);
    /* encoding twice gives identical bytes */
    uint8_t *buf2 = malloc(cap);
    assert_int_equal(e8kv_rans_encode(buf2, cap, s, n, t, period, sel), sz);
    assert_memory_equal(buf, buf2, sz);
    assert_int_equal(e8kv_rans_decode_ref(a, n, buf, sz, d, period, sel), n);
    assert_int_equal(e8kv_rans_decode(b, n, buf, sz, d, period, sel), n);
    if (n) {
        assert_memory_equal(a, s, n);
        assert_memory_equal(b, s, n);
    }
    /* every truncation is an error, the same from both decoders */
    for (size_t cut = 0; cut < sz; cut += 1 + sz / 97) {
        const size_t ra = e8kv_rans_decode_ref(a, n, buf, cut, d, period, sel);
        assert_true(e8kv_is_error(ra));
        assert_int_equal(ra, e8kv_rans_decode(b, n, buf, cut, d, period, sel));
    }
    /* bit flips: an error or some output, identical from both decoders, never a fault */
    for (size_t k = 0; k < 64 && sz; k++) {
        const size_t pos = (k * 2654435761u) % sz;
        buf[pos] ^= (uint8_t)(1u << (k % 8));
        const size_t ra = e8kv_rans_decode_ref(a, n, buf, sz, d, period, sel);
        assert_int_equal(ra, e8kv_rans_decode(b, n, buf, sz, d, period, sel));
        if (!e8kv_is_error(ra) && n) assert_memory_equal(a, b, n);
        buf[pos] ^= (uint8_t)(1u << (k % 8));
    }
    free(t), free(d), free(c), free(buf), free(buf2), free(a), free(b);
    return sz;
}

static void test_round_trip_shapes(void **state) {
    (void)state;
    const size_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 63, 1000, 4097, 100003};
    uint8_t *s = malloc(100003);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        make_symbols(s, sizes[k], 0.3, 256, 1 + k);
        round_trip(s, sizes[k], 1, NULL, 1);
        round_trip(s, sizes[k], 3, NULL, 1);
        round_trip(s, sizes[k], 34, NULL, 1);
    }
    /* a single symbol (frequency 2^12: zero bits per symbol) and a uniform byte source */
    memset(s, 7, 50000);
    assert_int_equal(round_trip(s, 50000, 1, NULL, 1), 4 * E8KV_RANS_STREAMS);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 3);
    for (size_t i = 0; i < 100003; i++) s[i] = (uint8_t)e8kv_rng_next(&rng);
    const size_t sz = round_trip(s, 100003, 1, NULL, 1);
    assert_true(sz < 100003 * 1.003 + 64);
    free(s);
}

static void test_selector_contexts(void **state) {
    (void)state;
    /* groups of 8 with a per-group selector picking one of two table sets (the E8 coset layout) */
    const size_t n = 8 * 5001;
    uint8_t *s = malloc(n), *sel = malloc(n / 8);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 11);
    for (size_t g = 0; g < n / 8; g++) sel[g] = (uint8_t)(e8kv_rng_next(&rng) & 1);
    make_symbols(s, n, 0.4, 40, 12);
    for (size_t i = 0; i < n; i++) s[i] = (uint8_t)(s[i] + 50 * sel[i / 8] + (i % 8)); /* disjoint alphabets */
    round_trip(s, n, 8, sel, 2);
    round_trip(s, n - 3, 8, sel, 2); /* partial last group */
    free(s), free(sel);
}

static void test_rate_near_entropy(void **state) {
    (void)state;
    const size_t n = 1 << 20;
    uint8_t *s = malloc(n);
    const double pz[] = {0.05, 0.2, 0.5, 0.9};
    for (size_t k = 0; k < 4; k++) {
        make_symbols(s, n, pz[k], 256, 100 + k);
        uint64_t c[256];
        count(c, s, n, 1, 0);
        const double h = entropy_bits(c) / 8.0;
        const size_t sz = round_trip(s, n, 1, NULL, 1);
        e8kv_rans_table t;
        assert_ok(e8kv_rans_table_build(&t, c, 256));
        const double model = e8kv_rans_table_cost_bits(&t, c) / 8.0;
        /* the coder adds < 0.1% to the ideal cost of its 12-bit model (+ the 16 state bytes), and the
         * 12-bit model costs < 1% over the empirical entropy (wide alphabets pay for rare symbols) */
        assert_true((double)sz <= model * 1.001 + 16);
        assert_true(model <= h * 1.01);
    }
    free(s);
}

static void test_table_serialization(void **state) {
    (void)state;
    uint64_t c[256] = {0};
    c[0] = 5, c[3] = 1000, c[4] = 1, c[200] = 77;
    e8kv_rans_table t, u;
    assert_ok(e8kv_rans_table_build(&t, c, 256));
    assert_int_equal(t.n_sym, 201);
    uint32_t sum = 0;
    for (int k = 0; k < 256; k++) {
        assert_true((c[k] > 0) == (t.freq[k] > 0));
        sum += t.freq[k];
    }
    assert_int_equal(sum, E8KV_RANS_SCALE);
    uint8_t buf[E8KV_RANS_TABLE_MAX_BYTES];
    const size_t n = e8kv_rans_table_write(buf, sizeof buf, &t);
    assert_ok(n);
    assert_true(n < 16); /* zero runs keep sparse tables small */
    assert_int_equal(e8kv_rans_table_read(&u, buf, n), n);
    assert_memory_equal(&t, &u, sizeof t);
    for (size_t cut = 0; cut < n; cut++) assert_error(e8kv_rans_table_read(&u, buf, cut), TRUNCATED);
    assert_error(e8kv_rans_table_write(buf, 3, &t), DST_TOO_SMALL);
    /* dense table at the worst case fits the stated maximum */
    for (int k = 0; k < 256; k++) c[k] = 1000 + (uint64_t)k;
    assert_ok(e8kv_rans_table_build(&t, c, 256));
    assert_true(e8kv_rans_table_write(buf, sizeof buf, &t) <= E8KV_RANS_TABLE_MAX_BYTES);
    /* malformed: sum not 2^12, alphabet too large, zero run past the end, frequency too large */
    const uint8_t bad_sum[] = {2, 0x80, 0x10, 1};           /* 2048 + 1 */
    const uint8_t bad_nsym[] = {0x81, 0x02};                /* 257 */
    const uint8_t bad_run[] = {3, 0, 5};                    /* zero run of 6 in 3 symbols */
    const uint8_t bad_freq[] = {1, 0x81, 0x20};             /* 4097 */
    assert_error(e8kv_rans_table_read(&u, bad_sum, sizeof bad_sum), CORRUPTED);
    assert_error(e8kv_rans_table_read(&u, bad_nsym, sizeof bad_nsym), CORRUPTED);
    assert_error(e8kv_rans_table_read(&u, bad_run, sizeof bad_run), CORRUPTED);
    assert_error(e8kv_rans_table_read(&u, bad_freq, sizeof bad_freq), CORRUPTED);
    /* empty table */
    memset(c, 0, sizeof c);
    assert_ok(e8kv_rans_table_build(&t, c, 256));
    assert_int_equal(e8kv_rans_table_write(buf, sizeof buf, &t), 1);
    assert_int_equal(e8kv_rans_table_read(&u, buf, 1), 1);
    assert_int_equal(u.n_sym, 0);
}

static void test_bad_arguments(void **state) {
    (void)state;
    uint64_t c[4] = {1, 2, 0, 3};
    e8kv_rans_table t;
    e8kv_rans_dtable d;
    assert_ok(e8kv_rans_table_build(&t, c, 4));
    e8kv_rans_dtable_init(&d, &t);
    uint8_t s[4] = {0, 1, 2, 3}, buf[64];
    assert_error(e8kv_rans_encode(buf, sizeof buf, s, 4, &t, 1, NULL), BAD_ARGUMENT); /* freq 0 */
    assert_error(e8kv_rans_encode(buf, sizeof buf, s, 2, &t, 0, NULL), BAD_ARGUMENT);
    assert_error(e8kv_rans_encode(buf, 8, s, 2, &t, 1, NULL), DST_TOO_SMALL);
    assert_error(e8kv_rans_decode(s, 2, buf, 8, &d, 1, NULL), TRUNCATED);
    /* a state below 2^16 is invalid */
    memset(buf, 0, 16);
    assert_error(e8kv_rans_decode(s, 1, buf, 16, &d, 1, NULL), CORRUPTED);
    assert_error(e8kv_rans_decode_ref(s, 1, buf, 16, &d, 1, NULL), CORRUPTED);
    /* trailing bytes after a valid stream */
    s[2] = 3;
    const size_t n = e8kv_rans_encode(buf, sizeof buf, s, 3, &t, 1, NULL);
    assert_ok(n);
    assert_error(e8kv_rans_decode(s, 3, buf, n + 2, &d, 1, NULL), CORRUPTED);
    assert_error(e8kv_rans_decode_ref(s, 3, buf, n + 2, &d, 1, NULL), CORRUPTED);
    assert_int_equal(e8kv_varint_write(buf, 0, 1), E8KV_ERR(DST_TOO_SMALL));
}

static void test_fuzz_corpus_replay(void **state) {
    (void)state;
    const char *root = getenv("E8KV_SOURCE_DIR");
    if (!root) skip();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/rans", root);
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    size_t n_files = 0;
    struct dirent *de;
    uint8_t *buf = malloc(1 << 20);
    while ((de = readdir(dp)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        const size_t n = fread(buf, 1, 1 << 20, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        n_files++;
    }
    closedir(dp);
    free(buf);
    assert_true(n_files > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_shapes),  cmocka_unit_test(test_selector_contexts),
        cmocka_unit_test(test_rate_near_entropy),  cmocka_unit_test(test_table_serialization),
        cmocka_unit_test(test_bad_arguments),      cmocka_unit_test(test_fuzz_corpus_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
