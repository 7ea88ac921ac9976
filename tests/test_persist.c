/* cache/persist: saved caches (doc/format.md §4). A loaded cache (new, or loaded into an existing one)
 * gives bit-identical attention output to the original, saves back to the same bytes and keeps accepting
 * appends with the same results as the original; the saved form is smaller than the hot pages; malformed
 * input (truncated, bit-flipped, wrong magic/version, trailing bytes, oversized counts, bad page map,
 * non-finite exact tokens) and mismatched targets each get their named error; file helpers; a golden file
 * written from doc/format.md by an independent Python writer; and a replay of fuzz/corpus/cache through
 * the fuzz target. */
#include "test_util.h"

#include "cache/kvcache.h"
#include "common/common.h"
#include "common/rng.h"

#include <dirent.h>
#include <unistd.h>
#include <xxhash.h>

#include "../fuzz/fuzz_cache_load.c"

typedef struct {
    size_t n_layer, n_head_kv, n_head, d, n_ctx;
    const char *spec;
} shape;

static e8kv_cache *make(const shape *s, size_t *err) {
    const e8kv_cache_params p = {.n_layer = s->n_layer,
                                 .n_head_kv = s->n_head_kv,
                                 .head_dim = s->d,
                                 .n_ctx = s->n_ctx,
                                 .spec = s->spec,
                                 .seed = 7,
                                 .rope_theta = 10000.0f,
                                 .rope_neox = 1};
    return e8kv_cache_create(&p, err);
}

static float *rand_vec(e8kv_rng *rng, size_t n) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)e8kv_rng_normal(rng);
    return x;
}

/* Append n tokens of random K/V to every layer of every cache in cs (the same data to each), in chunks. */
static void append_all(e8kv_cache **cs, size_t n_c, const shape *s, size_t n, uint64_t seed) {
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    const size_t w = s->n_head_kv * s->d;
    for (size_t done = 0; done < n;) {
        const size_t chunk = done == 0 ? 40 : 13; /* a first append of >= 16 tokens fixes the means */
        const size_t m = n - done < chunk ? n - done : chunk;
        for (size_t l = 0; l < s->n_layer; l++) {
            float *k = rand_vec(&rng, m * w), *v = rand_vec(&rng, m * w);
            for (size_t i = 0; i < n_c; i++)
                assert_ok(e8kv_cache_append(cs[i], l, k, v, m));
            free(k), free(v);
        }
        done += m;
    }
}

/* Attention of every position of every layer (one query per position) must be bit-identical. */
static void check_same_attention(e8kv_cache *a, e8kv_cache *b, const shape *s, uint64_t seed) {
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    const size_t n = e8kv_cache_n_tokens(a, 0), w = s->n_head * s->d;
    assert_int_equal(e8kv_cache_n_tokens(b, 0), n);
    float *q = rand_vec(&rng, n * w), *oa = malloc(n * w * sizeof *oa), *ob = malloc(n * w * sizeof *ob);
    for (size_t l = 0; l < s->n_layer; l++) {
        assert_int_equal(e8kv_cache_attend(a, oa, n * w, l, q, s->n_head, n, 0), n * w);
        assert_int_equal(e8kv_cache_attend(b, ob, n * w, l, q, s->n_head, n, 0), n * w);
        assert_memory_equal(oa, ob, n * w * sizeof *oa);
    }
    free(q), free(oa), free(ob);
}

static const shape k_shapes[] = {
    /* window + sink + per-layer formats, GQA, a page size that does not divide the token count */
    {3, 2, 4, 64, 300, "k=e8:4,v=e8:3,layers1-1=q4_0h,layer2.v=f16,window=20,sink=3,page=16"},
    {2, 1, 2, 32, 200, "e8:2,center=0"},            /* no window, no sink, no centering */
    {2, 2, 2, 64, 256, "balanced"},                 /* preset */
    {1, 2, 4, 64, 128, "e8nest:4,sink=70,page=32"}, /* sink beyond the first page */
    {2, 1, 1, 64, 150, "k=e8:4,v=e8:4,rope=pre"},   /* keys before RoPE */
};

static void roundtrip(const shape *s, size_t n_tok) {
    size_t err = 0;
    e8kv_cache *a = make(s, &err);
    assert_non_null(a);
    append_all(&a, 1, s, n_tok, 11);
    const char meta[] = "prompt=1,2,3";
    size_t n = 0;
    uint8_t *f = test_cache_save(a, &n, meta, sizeof meta);
    e8kv_cache_file_info fi;
    assert_int_equal(e8kv_cache_file_get_info(&fi, f, n), n);
    assert_int_equal(fi.n_layer, s->n_layer);
    assert_int_equal(fi.n_ctx, s->n_ctx);
    assert_int_equal(fi.meta_size, sizeof meta);
    assert_memory_equal(f + fi.meta_offset, meta, sizeof meta);

    e8kv_cache *b = e8kv_cache_load(f, n, 1, &err);
    if (!b) fail_msg("load: %s", e8kv_error_name(err));
    e8kv_cache *c = make(s, &err); /* loaded into an existing cache that already holds other tokens */
    append_all(&c, 1, s, 5, 99);
    assert_int_equal(e8kv_cache_load_into(c, f, n), n_tok);
    for (size_t l = 0; l < s->n_layer; l++)
        assert_int_equal(e8kv_cache_n_tokens(b, l), n_tok);
    /* the same pages and fixed memory (the slabs holding the pages follow each cache's history, pages.h) */
    for (size_t i = 0; i < 2; i++) {
        const e8kv_cache *x = i ? c : b;
        assert_int_equal(e8kv_pages_live_bytes(&x->pages), e8kv_pages_live_bytes(&a->pages));
        assert_int_equal(e8kv_cache_bytes(x) - e8kv_pages_bytes(&x->pages),
                         e8kv_cache_bytes(a) - e8kv_pages_bytes(&a->pages));
    }
    check_same_attention(a, b, s, 5);
    check_same_attention(a, c, s, 5);
    /* save(load(x)) == x */
    size_t n2 = 0;
    uint8_t *g = test_cache_save(b, &n2, meta, sizeof meta);
    assert_int_equal(n2, n);
    assert_memory_equal(f, g, n);
    free(g);
    /* the loaded caches continue: same appends, same attention */
    e8kv_cache *all[3] = {a, b, c};
    append_all(all, 3, s, s->n_ctx - n_tok, 12);
    check_same_attention(a, b, s, 6);
    check_same_attention(a, c, s, 6);
    free(f);
    e8kv_cache_free(a), e8kv_cache_free(b), e8kv_cache_free(c);
}

static void test_roundtrip_attention(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++) {
        roundtrip(&k_shapes[i], 101);
        roundtrip(&k_shapes[i], 2); /* shorter than the sink and the first page */
    }
}

static void test_empty_and_truncated_cache(void **state) {
    (void)state;
    const shape *s = &k_shapes[0];
    size_t err = 0, n = 0;
    e8kv_cache *a = make(s, &err);
    uint8_t *f = test_cache_save(a, &n, NULL, 0); /* nothing stored yet */
    e8kv_cache *b = e8kv_cache_load(f, n, 1, &err);
    assert_non_null(b);
    assert_int_equal(e8kv_cache_n_tokens(b, 2), 0);
    free(f);
    /* after truncate: coded pages that fall back inside the window stay coded; layers of unequal length */
    append_all(&a, 1, s, 120, 3);
    e8kv_cache_truncate(a, 77);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 4);
    float *k = rand_vec(&rng, 9 * s->n_head_kv * s->d);
    assert_ok(e8kv_cache_append(a, 1, k, k, 9));
    f = test_cache_save(a, &n, NULL, 0);
    e8kv_cache_free(b);
    b = e8kv_cache_load(f, n, 1, &err);
    assert_non_null(b);
    assert_int_equal(e8kv_cache_n_tokens(b, 1), 86);
    assert_int_equal(e8kv_cache_n_tokens(b, 0), 77);
    const size_t w = s->n_head * s->d;
    float *q = rand_vec(&rng, w), *oa = malloc(w * 4), *ob = malloc(w * 4);
    for (size_t l = 0; l < s->n_layer; l++) {
        const size_t nt = e8kv_cache_n_tokens(a, l);
        assert_ok(e8kv_cache_attend(a, oa, w, l, q, s->n_head, 1, nt - 1));
        assert_ok(e8kv_cache_attend(b, ob, w, l, q, s->n_head, 1, nt - 1));
        assert_memory_equal(oa, ob, w * 4);
    }
    free(q), free(oa), free(ob), free(k), free(f);
    e8kv_cache_free(a), e8kv_cache_free(b);
}

/* Coded pages are entropy-coded: the file is smaller than the hot pages it holds. */
static void test_smaller_than_hot(void **state) {
    (void)state;
    const shape s = {2, 2, 2, 64, 512, "e8:4"};
    size_t err = 0, n = 0;
    e8kv_cache *a = make(&s, &err);
    append_all(&a, 1, &s, 512, 21);
    uint8_t *f = test_cache_save(a, &n, NULL, 0);
    const size_t hot = e8kv_cache_bytes(a) - e8kv_cache_fixed_bytes(a);
    print_message("e8:4, Gaussian data: saved %zu bytes, hot pages %zu bytes (%.1f%%)\n", n, hot,
                  100.0 * (double)n / (double)hot);
    assert_true(n < hot);
    free(f);
    e8kv_cache_free(a);
}

static void rehash(uint8_t *f, size_t n) {
    e8kv_store_le64(f + n - 8, XXH64(f, n - 8, 0));
}

/* A one-layer cache of p (2 KV heads of p->head_dim) holding 40 tokens of random K/V (seed), saved: the file
 * (*n bytes, meta `meta`) and the cache in *out. */
static uint8_t *saved_one_layer(const e8kv_cache_params *p, uint64_t seed, const char *meta, e8kv_cache **out,
                                size_t *n) {
    const size_t n_tok = 40, row = p->n_head_kv * p->head_dim;
    size_t err = 0;
    e8kv_cache *a = e8kv_cache_create(p, &err);
    assert_non_null(a);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    float *k = rand_vec(&rng, n_tok * row), *v = rand_vec(&rng, n_tok * row);
    assert_int_equal(e8kv_cache_append(a, 0, k, v, n_tok), n_tok);
    free(k), free(v);
    *out = a;
    return test_cache_save(a, n, meta, meta ? strlen(meta) : 0);
}

/* f (n bytes) with the u32 at `at` (or the u16 version when at == 4) set to value and the checksum redone
 * must load as CORRUPTED */
static void expect_corrupted(const uint8_t *f, size_t n, size_t at, uint32_t value, const char *what) {
    uint8_t *g = malloc(n);
    memcpy(g, f, n);
    if (at == 4)
        e8kv_store_le16(g + 4, (uint16_t)value);
    else
        e8kv_store_le32(g + at, value);
    rehash(g, n);
    size_t err = 0;
    assert_null(e8kv_cache_load(g, n, 1, &err));
    if (e8kv_get_error_code(err) != E8KV_ERROR_CORRUPTED)
        fail_msg("%s, byte %zu = %#x: %s", what, at, value, e8kv_error_name(err));
    free(g);
}

/* center=rope's side record (doc/format.md §4.3: per KV head 8 RoPE pairs, then their means before RoPE):
 * a pair past head_dim / 2, a pair twice, or a non-finite mean, each with a valid checksum, is CORRUPTED;
 * the file as saved loads. */
static void test_rope_centre_record(void **state) {
    (void)state;
    const size_t n_kv = 2, d = 64, row = n_kv * d;
    e8kv_cache_params p = {.n_layer = 1,
                           .n_head_kv = n_kv,
                           .head_dim = d,
                           .n_ctx = 64,
                           .spec = "e8box:4,center=rope",
                           .seed = 9,
                           .rope_theta = 10000.0f};
    size_t err = 0, n = 0;
    e8kv_cache *a = NULL;
    uint8_t *f = saved_one_layer(&p, 5, NULL, &a, &n);
    e8kv_cache_file_info fi;
    assert_ok(e8kv_cache_file_get_info(&fi, f, n));
    /* layer 0: token count, mu_set, the K and V means, then head 0's pairs and means */
    const size_t rc0 = fi.meta_offset + fi.meta_size + 4 + 4 + 2 * row * 4;
    const uint32_t pair0 = e8kv_load_le32(f + rc0);
    assert_true(pair0 < d / 2 && e8kv_load_le32(f + rc0 + 4) != pair0);
    expect_corrupted(f, n, rc0, (uint32_t)(d / 2), "a pair past head_dim / 2");
    expect_corrupted(f, n, rc0 + 4, pair0, "a pair twice");
    expect_corrupted(f, n, rc0 + 8 * 4, 0x7fc00000u, "a NaN mean");
    e8kv_cache *b = e8kv_cache_load(f, n, 1, &err);
    assert_non_null(b);
    e8kv_cache_free(b);
    free(f);
    e8kv_cache_free(a);
}

/* A cache made with params.rope_freqs (a scaled RoPE) saves them (version 3, flag 2, head_dim/2 f32 after
 * the meta) and loads back the same bits; version 1 and 2 files keep their bytes; bad frequencies, flags or
 * a section cut short are CORRUPTED even with a valid checksum. */
static void test_rope_freqs_section(void **state) {
    (void)state;
    const size_t n_kv = 2, d = 64;
    float freqs[32];
    for (size_t i = 0; i < d / 2; i++)
        freqs[i] = (float)(pow(500000.0, -2.0 * (double)i / (double)d) / (i >= 20 ? 8.0 : 1.0));
    static const char *specs[] = {"e8box:4,center=rope", "e8:4,rope=pre,sink=1"};
    for (size_t si = 0; si < 2; si++) {
        e8kv_cache_params p = {.n_layer = 1,
                               .n_head_kv = n_kv,
                               .head_dim = d,
                               .n_ctx = 64,
                               .spec = specs[si],
                               .seed = 9,
                               .rope_freqs = freqs};
        size_t err = 0, n = 0;
        e8kv_cache *a = NULL;
        uint8_t *f = saved_one_layer(&p, 6, "mm", &a, &n);
        e8kv_cache_file_info fi;
        assert_ok(e8kv_cache_file_get_info(&fi, f, n));
        assert_int_equal(fi.version, 3);
        assert_int_equal(e8kv_load_le32(f + 60), 2);
        assert_int_equal(fi.n_rope_freqs, d / 2);
        assert_memory_equal(fi.rope_freqs, freqs, d / 2 * sizeof(float));
        /* loads back: the same attention, bit for bit */
        e8kv_cache *b = e8kv_cache_load(f, n, 1, &err);
        assert_non_null(b);
        e8kv_rng rng;
        e8kv_rng_seed(&rng, 7);
        float *q = rand_vec(&rng, 4 * d), o[4 * 64], o2[4 * 64];
        assert_int_equal(e8kv_cache_attend(a, o, 4 * d, 0, q, 4, 1, 39), 4 * d);
        assert_int_equal(e8kv_cache_attend(b, o2, 4 * d, 0, q, 4, 1, 39), 4 * d);
        assert_memory_equal(o, o2, sizeof o);
        e8kv_cache_free(b);
        const size_t at = fi.meta_offset + fi.meta_size; /* the first frequency */
        expect_corrupted(f, n, at, 0x7fc00000u, "a NaN frequency");
        expect_corrupted(f, n, at + 4 * 31, 0xbf800000u, "a negative frequency");
        expect_corrupted(f, n, at + 8, 0x7f800000u, "an infinite frequency");
        expect_corrupted(f, n, 60, 3, "flags 3 without a calibration");
        expect_corrupted(f, n, 60, 1, "version 3 without the frequencies' flag");
        expect_corrupted(f, n, 4, 2, "version 2 with the frequencies' flag");
        /* a meta that leaves 4 bytes before the checksum: the frequencies' section cut short */
        expect_corrupted(f, n, 56, (uint32_t)(n - 8 - 4 - fi.meta_offset), "the frequencies cut short");
        free(q), free(f);
        e8kv_cache_free(a);
        /* the same cache with rope_theta: version 1, no section */
        p.rope_freqs = NULL, p.rope_theta = 10000.0f;
        f = saved_one_layer(&p, 6, NULL, &a, &n);
        assert_ok(e8kv_cache_file_get_info(&fi, f, n));
        assert_int_equal(fi.version, 1);
        assert_int_equal(fi.n_rope_freqs, 0);
        free(f);
        e8kv_cache_free(a);
    }
}

static void test_malformed(void **state) {
    (void)state;
    const shape *s = &k_shapes[0];
    size_t err = 0, n = 0;
    e8kv_cache *a = make(s, &err);
    append_all(&a, 1, s, 90, 8);
    uint8_t *f = test_cache_save(a, &n, "m", 1);
    uint8_t *g = malloc(n + 1);
    e8kv_cache_file_info fi;
    /* truncated at every length */
    for (size_t k = 0; k < n; k += (k < 128 ? 1 : 97)) {
        assert_null(e8kv_cache_load(f, k, 1, &err));
        assert_error(err, TRUNCATED);
    }
    /* trailing bytes */
    memcpy(g, f, n);
    g[n] = 0;
    assert_error(e8kv_cache_file_get_info(&fi, g, n + 1), CORRUPTED);
    /* any flipped bit: checksum, magic or version */
    for (size_t k = 0; k < n; k += 13) {
        memcpy(g, f, n);
        g[k] ^= (uint8_t)(1u << (k % 8));
        const size_t r = e8kv_cache_file_get_info(&fi, g, n);
        assert_true(e8kv_is_error(r));
        const e8kv_error_code ec = e8kv_get_error_code(r);
        assert_true(ec == E8KV_ERROR_CHECKSUM || ec == E8KV_ERROR_CORRUPTED || ec == E8KV_ERROR_VERSION ||
                    ec == E8KV_ERROR_TRUNCATED);
        if (k >= 16 && k < n - 8) assert_int_equal(ec, E8KV_ERROR_CHECKSUM);
    }
    memcpy(g, f, n);
    g[0] = 'X';
    assert_error(e8kv_cache_file_get_info(&fi, g, n), CORRUPTED);
    memcpy(g, f, n);
    e8kv_store_le16(g + 4, 4); /* versions 1, 2 and 3 exist */
    assert_error(e8kv_cache_file_get_info(&fi, g, n), VERSION);
    assert_null(e8kv_cache_load(g, n, 1, &err));
    assert_error(err, VERSION);
    /* oversized counts with a valid checksum */
    memcpy(g, f, n);
    e8kv_store_le32(g + 16, 1000000); /* n_layer */
    rehash(g, n);
    assert_error(e8kv_cache_file_get_info(&fi, g, n), CORRUPTED);
    memcpy(g, f, n);
    e8kv_store_le32(g + 20, 100000); /* n_head_kv */
    rehash(g, n);
    assert_error(e8kv_cache_file_get_info(&fi, g, n), CORRUPTED);
    memcpy(g, f, n);
    e8kv_store_le64(g + 32, (uint64_t)1 << 40); /* n_ctx */
    rehash(g, n);
    assert_error(e8kv_cache_file_get_info(&fi, g, n), CORRUPTED);
    memcpy(g, f, n);
    e8kv_store_le32(g + 28, 65536); /* a page size the spec does not say (tables sized from a lie) */
    rehash(g, n);
    assert_error(e8kv_cache_file_get_info(&fi, g, n), CORRUPTED);
    memcpy(g, f, n);
    e8kv_store_le16(g + 6, 600); /* spec length */
    rehash(g, n);
    assert_error(e8kv_cache_file_get_info(&fi, g, n), CORRUPTED);
    memcpy(g, f, n);
    e8kv_store_le32(g + 56, 0x7fffffff); /* meta size */
    rehash(g, n);
    assert_error(e8kv_cache_file_get_info(&fi, g, n), CORRUPTED);
    /* layer 0's token count above n_ctx, then above what its bytes can hold */
    assert_ok(e8kv_cache_file_get_info(&fi, f, n));
    const size_t layer0 = fi.meta_offset + fi.meta_size;
    memcpy(g, f, n);
    e8kv_store_le32(g + layer0, (uint32_t)s->n_ctx + 1);
    rehash(g, n);
    assert_null(e8kv_cache_load(g, n, 1, &err));
    assert_error(err, CORRUPTED);
    memcpy(g, f, n);
    e8kv_store_le32(g + layer0, (uint32_t)s->n_ctx);
    rehash(g, n);
    assert_null(e8kv_cache_load(g, n, 1, &err));
    assert_error(err, CORRUPTED);
    /* layer 0 is centered (e8 formats): u32 flag and the K, V means follow its token count */
    const size_t mu0 = layer0 + 4, map0 = mu0 + 4 + 2 * s->n_head_kv * s->d * 4;
    const uint32_t bad_mu[3] = {2, 0, 0x7f800000u}; /* unknown flag, means unset with tokens, an Inf mean */
    const size_t at_mu[3] = {mu0, mu0, mu0 + 4 + 4 * 70};
    for (int i = 0; i < 3; i++) {
        memcpy(g, f, n);
        e8kv_store_le32(g + at_mu[i], bad_mu[i]);
        rehash(g, n);
        assert_null(e8kv_cache_load(g, n, 1, &err));
        assert_error(err, CORRUPTED);
    }
    /* page map: an unknown state, a missing page, a raw page made coded */
    const uint8_t bad[3] = {3, 0, 2};
    const size_t at[3] = {map0 + 1, map0 + 1, map0 + 5}; /* page 1 of K head 0; page 5 (raw) */
    for (int i = 0; i < 3; i++) {
        memcpy(g, f, n);
        assert_int_not_equal(g[at[i]], bad[i]);
        g[at[i]] = bad[i];
        rehash(g, n);
        assert_null(e8kv_cache_load(g, n, 1, &err));
        assert_error(err, CORRUPTED);
    }
    /* a non-finite exact (sink) value */
    memcpy(g, f, n);
    const size_t n_used = (90 + 15) / 16;
    e8kv_store_le32(g + map0 + 2 * s->n_head_kv * n_used, 0x7fc00000u);
    rehash(g, n);
    assert_null(e8kv_cache_load(g, n, 1, &err));
    assert_error(err, CORRUPTED);
    /* a spec the grammar rejects */
    memcpy(g, f, n);
    g[64] = '#';
    rehash(g, n);
    assert_null(e8kv_cache_load(g, n, 1, &err));
    assert_error(err, CORRUPTED);
    /* a failed load_into leaves the target empty */
    e8kv_cache *c = make(s, &err);
    append_all(&c, 1, s, 10, 1);
    memcpy(g, f, n);
    e8kv_store_le32(g + layer0, (uint32_t)s->n_ctx);
    rehash(g, n);
    assert_true(e8kv_is_error(e8kv_cache_load_into(c, g, n)));
    assert_int_equal(e8kv_cache_n_tokens(c, 0), 0);
    assert_int_equal(e8kv_cache_bytes(c), e8kv_cache_fixed_bytes(c));
    e8kv_cache_free(c);
    free(f), free(g);
    e8kv_cache_free(a);
}

static void test_mismatched_target(void **state) {
    (void)state;
    const shape s = {2, 2, 4, 64, 128, "k=e8:4,v=e8:3,window=8"};
    size_t err = 0, n = 0;
    e8kv_cache *a = make(&s, &err);
    append_all(&a, 1, &s, 100, 2);
    uint8_t *f = test_cache_save(a, &n, NULL, 0);
    shape t = s;
    t.d = 32; /* other model dims */
    e8kv_cache *c = make(&t, &err);
    assert_error(e8kv_cache_load_into(c, f, n), DIMENSION);
    e8kv_cache_free(c);
    t = s, t.n_layer = 3;
    c = make(&t, &err);
    assert_error(e8kv_cache_load_into(c, f, n), DIMENSION);
    e8kv_cache_free(c);
    t = s, t.n_head_kv = 1;
    c = make(&t, &err);
    assert_error(e8kv_cache_load_into(c, f, n), DIMENSION);
    e8kv_cache_free(c);
    t = s, t.spec = "k=e8:4,v=e8:4,window=8";
    c = make(&t, &err);
    assert_error(e8kv_cache_load_into(c, f, n), SPEC);
    e8kv_cache_free(c);
    const e8kv_cache_params other_seed = {
        .n_layer = 2, .n_head_kv = 2, .head_dim = 64, .n_ctx = 128, .spec = s.spec, .seed = 8};
    c = e8kv_cache_create(&other_seed, &err);
    assert_error(e8kv_cache_load_into(c, f, n), SPEC);
    e8kv_cache_free(c);
    t = s, t.n_ctx = 99;
    c = make(&t, &err);
    assert_error(e8kv_cache_load_into(c, f, n), CONTEXT_FULL);
    e8kv_cache_free(c);
    t = s, t.n_ctx = 1000; /* a larger context is fine */
    c = make(&t, &err);
    assert_int_equal(e8kv_cache_load_into(c, f, n), 100);
    e8kv_cache_free(c);
    /* bad arguments */
    assert_error(e8kv_cache_save(f, 10, a, NULL, 0), DST_TOO_SMALL);
    assert_error(e8kv_cache_save(f, n - 1, a, NULL, 0), DST_TOO_SMALL);
    assert_error(e8kv_cache_save(NULL, n, a, NULL, 0), BAD_ARGUMENT);
    assert_error(e8kv_cache_save(f, n, a, NULL, 3), BAD_ARGUMENT);
    assert_error(e8kv_cache_save_bound(NULL, 0), BAD_ARGUMENT);
    assert_error(e8kv_cache_load_into(NULL, f, n), BAD_ARGUMENT);
    assert_null(e8kv_cache_load(NULL, n, 1, &err));
    assert_error(err, BAD_ARGUMENT);
    free(f);
    e8kv_cache_free(a);
}

static void test_files(void **state) {
    (void)state;
    const shape *s = &k_shapes[1];
    size_t err = 0;
    e8kv_cache *a = make(s, &err);
    append_all(&a, 1, s, 70, 9);
    char path[] = "/tmp/e8kv_test_persist_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    const size_t n = e8kv_cache_save_file(a, path, "xy", 2);
    assert_ok(n);
    e8kv_cache *b = e8kv_cache_load_file(path, 1, &err);
    assert_non_null(b);
    check_same_attention(a, b, s, 1);
    void *buf = NULL;
    assert_int_equal(e8kv_cache_read_file(&buf, path), n);
    free(buf);
    remove(path);
    assert_null(e8kv_cache_load_file(path, 1, &err));
    assert_error(err, IO);
    assert_error(e8kv_cache_save_file(a, "/nonexistent-dir/x.e8kc", NULL, 0), IO);
    /* a directory is not a file: I/O error, not "out of memory" (issue 12, item 7) */
    char dir[] = "/tmp/e8kv_test_persist_dir_XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_null(e8kv_cache_load_file(dir, 1, &err));
    assert_error(err, IO);
    assert_null(e8kv_calib_load_file(dir, &err));
    assert_error(err, IO);
    assert_error(e8kv_cache_read_file(&buf, dir), IO);
    assert_null(buf);
    rmdir(dir);
    e8kv_cache_free(a), e8kv_cache_free(b);
}

/* A canonical spec longer than 511 characters (40 layer rules) is saved and read back whole: the file
 * info holds any spec the library writes (it once held 512 bytes and was overrun). */
static void test_long_spec(void **state) {
    (void)state;
    char spec[1024] = "f32";
    for (size_t l = 0; l < 40; l += 2) {
        const size_t n = strlen(spec);
        snprintf(spec + n, sizeof spec - n, ",layers%zu-%zu=f16", l, l);
    }
    const shape s = {40, 1, 1, 8, 16, spec};
    size_t err = 0;
    e8kv_cache *a = make(&s, &err);
    assert_non_null(a);
    append_all(&a, 1, &s, 16, 3);
    size_t n = 0;
    uint8_t *buf = test_cache_save(a, &n, NULL, 0);
    e8kv_cache_file_info *fi = malloc(sizeof *fi);
    assert_int_equal(e8kv_cache_file_get_info(fi, buf, n), n);
    assert_true(strlen(fi->spec) > 600);
    if (!strstr(fi->spec, ",layers39-39.v=f32,window=")) fail_msg("%s", fi->spec); /* layer 0 is f16 */
    e8kv_cache *b = e8kv_cache_load(buf, n, 1, &err);
    assert_non_null(b);
    check_same_attention(a, b, &s, 1);
    free(fi), free(buf);
    e8kv_cache_free(a), e8kv_cache_free(b);
}

/* tests/data/golden_caches/f32_window.e8kc and f32_freqs.e8kc (format version 3: rope=pre, RoPE frequencies),
 * written from doc/format.md alone by make_golden.py there: each loads into the cache that appending the same
 * K/V builds, attention bit-identical at every position; the version 3 file into a cache of theta's RoPE is
 * SPEC. */
static void test_golden(void **state) {
    (void)state;
    static const float freqs[4] = {1.0f, 0.25f, 0.0625f, 0.001953125f}; /* make_golden.py's FREQS */
    for (int v3 = 0; v3 < 2; v3++) {
        const char *src = getenv("E8KV_SOURCE_DIR");
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/data/golden_caches/%s", src ? src : "..",
                 v3 ? "f32_freqs.e8kc" : "f32_window.e8kc");
        void *buf = NULL;
        const size_t n = e8kv_cache_read_file(&buf, path);
        if (e8kv_is_error(n)) skip();
        e8kv_cache_file_info fi;
        assert_int_equal(e8kv_cache_file_get_info(&fi, buf, n), n);
        assert_string_equal(fi.spec, v3 ? "k=f32,v=f32,window=2,sink=1,page=4,center=1,rope=pre"
                                        : "k=f32,v=f32,window=2,sink=1,page=4,center=1,rope=post");
        assert_int_equal(fi.meta_size, 6);
        assert_int_equal(fi.version, v3 ? 3 : 1);
        assert_int_equal(fi.n_rope_freqs, v3 ? 4 : 0);
        size_t err = 0;
        e8kv_cache *g = e8kv_cache_load(buf, n, 1, &err);
        if (!g) fail_msg("golden load %s: %s", path, e8kv_error_name(err));
        e8kv_cache_params p = {.n_layer = 2,
                               .n_head_kv = 1,
                               .head_dim = 8,
                               .n_ctx = 16,
                               .spec =
                                   v3 ? "f32,window=2,sink=1,page=4,rope=pre" : "f32,window=2,sink=1,page=4",
                               .rope_theta = 10000.0f,
                               .rope_freqs = v3 ? freqs : NULL};
        e8kv_cache *a = e8kv_cache_create(&p, &err);
        assert_non_null(a);
        const size_t tokens[2] = {7, 5};
        for (size_t l = 0; l < 2; l++) {
            float k[7 * 8], v[7 * 8];
            for (size_t t = 0; t < tokens[l]; t++)
                for (size_t i = 0; i < 8; i++) {
                    k[t * 8 + i] = (float)((double)l + (double)t / 8 + (double)i / 1024);
                    v[t * 8 + i] = -k[t * 8 + i];
                }
            assert_int_equal(e8kv_cache_append(a, l, k, v, tokens[l]), tokens[l]);
        }
        /* the same pages and fixed memory (their slabs follow each cache's history, pages.h) */
        assert_int_equal(e8kv_pages_live_bytes(&g->pages), e8kv_pages_live_bytes(&a->pages));
        assert_int_equal(e8kv_cache_bytes(g) - e8kv_pages_bytes(&g->pages),
                         e8kv_cache_bytes(a) - e8kv_pages_bytes(&a->pages));
        e8kv_rng rng;
        e8kv_rng_seed(&rng, 2);
        float *q = rand_vec(&rng, 7 * 2 * 8), oa[7 * 16], og[7 * 16];
        for (size_t l = 0; l < 2; l++) {
            const size_t nt = tokens[l];
            assert_int_equal(e8kv_cache_n_tokens(g, l), nt);
            assert_ok(e8kv_cache_attend(a, oa, nt * 16, l, q, 2, nt, 0));
            assert_ok(e8kv_cache_attend(g, og, nt * 16, l, q, 2, nt, 0));
            assert_memory_equal(oa, og, nt * 16 * sizeof(float));
        }
        if (v3) { /* theta's RoPE is not these frequencies */
            e8kv_cache_free(a);
            p.rope_freqs = NULL;
            a = e8kv_cache_create(&p, &err);
            assert_non_null(a);
            assert_error(e8kv_cache_load_into(a, buf, n), SPEC);
        }
        free(q), free(buf);
        e8kv_cache_free(a), e8kv_cache_free(g);
    }
}

/* Every file of fuzz/corpus/cache through the fuzz target (crash/edge inputs kept by fuzzing). */
static void test_fuzz_corpus(void **state) {
    (void)state;
    const char *src = getenv("E8KV_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/cache", src ? src : "..");
    DIR *d = opendir(dir);
    if (!d) skip();
    size_t n_files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        void *buf = NULL;
        const size_t n = e8kv_cache_read_file(&buf, path);
        assert_ok(n);
        LLVMFuzzerTestOneInput(buf, n);
        free(buf);
        n_files++;
    }
    closedir(d);
    print_message("replayed %zu corpus files\n", n_files);
    assert_true(n_files > 0);
}

/* Codes that no encode writes (issue 12, item 7): a saved cache whose coded page holds an f16 Inf payload
 * or a NaN/Inf scale field (written with valid checksums, so only the content is wrong) is CORRUPTED at
 * load, never a cache whose attention returns NaN. */
static void test_nonfinite_codes(void **state) {
    (void)state;
    static const struct {
        const char *spec;
        size_t offset; /* of an f16 field in a vector */
        uint16_t half;
    } cases[] = {{"f16,page=16", 10, 0x7C00},
                 {"q4_0h,page=16", 18, 0x7E00},
                 {"e8:4,page=16", 0, 0xFC00},
                 {"k=f16,v=e8:3,page=16", 0, 0x7C00}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const shape s = {2, 2, 2, 64, 64, cases[k].spec};
        size_t err = 0;
        e8kv_cache *a = make(&s, &err);
        assert_non_null(a);
        append_all(&a, 1, &s, 40, 11);
        size_t n = 0;
        uint8_t *f = test_cache_save(a, &n, NULL, 0);
        e8kv_cache *ok = e8kv_cache_load(f, n, 1, &err); /* intact: loads */
        assert_non_null(ok);
        e8kv_cache_free(ok);
        free(f);
        /* layer 1, V of head 1, page 1 (tokens 16..31), token 19 */
        kv_page *pg = &a->layers[1].v_pages[1 * a->n_page_max + 1];
        assert_non_null(pg->data);
        assert_false(pg->raw);
        uint8_t *field = pg->data + 3 * a->layers[1].v.vector_bytes + cases[k].offset;
        field[0] = (uint8_t)cases[k].half;
        field[1] = (uint8_t)(cases[k].half >> 8);
        f = test_cache_save(a, &n, NULL, 0);
        assert_null(e8kv_cache_load(f, n, 1, &err));
        assert_error(err, CORRUPTED);
        e8kv_cache *into = make(&s, &err);
        assert_error(e8kv_cache_load_into(into, f, n), CORRUPTED);
        assert_int_equal(e8kv_cache_n_tokens(into, 1), 0); /* left empty */
        e8kv_cache_free(into);
        free(f);
        e8kv_cache_free(a);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_attention), cmocka_unit_test(test_empty_and_truncated_cache),
        cmocka_unit_test(test_smaller_than_hot),    cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_rope_centre_record),  cmocka_unit_test(test_rope_freqs_section),
        cmocka_unit_test(test_mismatched_target),   cmocka_unit_test(test_files),
        cmocka_unit_test(test_long_spec),           cmocka_unit_test(test_golden),
        cmocka_unit_test(test_fuzz_corpus),         cmocka_unit_test(test_nonfinite_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
