/* cache/evict.c: token eviction. Attention of an evicted f32 cache against a naive double-precision
 * attention written here over the kept tokens at their own positions (RoPE applied here from its
 * definition); codes that move as bytes (every format reads back the same vectors at the same positions);
 * the memory that eviction returns, measured by the allocator; the spec grammar; positions after an
 * eviction (append, attend, truncate); budget eviction at append; save/load of an evicted cache. */
#include "test_util.h"

#include "cache/kvcache.h"
#include "common/rng.h"

#include <malloc.h>
#include <math.h>

#define NL 2
#define HKV 2
#define NH 4
#define D 16
#define THETA 10000.0f

static float *rand_vec(e8kv_rng *rng, size_t n, double sd) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(sd * e8kv_rng_normal(rng));
    return x;
}

static e8kv_cache *make(const char *spec, size_t n_ctx, size_t *err) {
    const e8kv_cache_params p = {.n_layer = NL,
                                 .n_head_kv = HKV,
                                 .head_dim = D,
                                 .n_ctx = n_ctx,
                                 .spec = spec,
                                 .seed = 7,
                                 .rope_theta = THETA,
                                 .rope_neox = 1};
    return e8kv_cache_create(&p, err);
}

/* RoPE (split halves) of one vector at position pos, in double, from the definition. */
static void rope_ref(double *y, const float *x, size_t pos) {
    for (size_t i = 0; i < D / 2; i++) {
        const double a = (double)pos * pow((double)THETA, -2.0 * (double)i / D);
        y[i] = x[i] * cos(a) - x[i + D / 2] * sin(a);
        y[i + D / 2] = x[i] * sin(a) + x[i + D / 2] * cos(a);
    }
}

/* One query vector per query head (before RoPE) at position qpos against the kept tokens of each KV head
 * (positions from the cache's index), K and V given per position (n, HKV * D). */
static void naive_attend_kept(const e8kv_cache *c, size_t layer, const float *K, const float *V,
                              const float *q, size_t qpos, double *out) {
    const kv_layer *L = &c->layers[layer];
    const size_t g = NH / HKV, n = L->n_tokens;
    double *sc = malloc(n * sizeof *sc);
    for (size_t hq = 0; hq < NH; hq++) {
        const size_t h = hq / g;
        double qr[D], kr[D];
        rope_ref(qr, q + hq * D, qpos);
        double mx = -INFINITY;
        for (size_t j = 0; j < n; j++) {
            const size_t p = kv_slot_pos(L, h, j);
            rope_ref(kr, K + (p * HKV + h) * D, p);
            double dot = 0;
            for (size_t i = 0; i < D; i++)
                dot += qr[i] * kr[i];
            sc[j] = dot / sqrt((double)D);
            if (sc[j] > mx) mx = sc[j];
        }
        double z = 0;
        for (size_t j = 0; j < n; j++)
            z += (sc[j] = exp(sc[j] - mx));
        for (size_t i = 0; i < D; i++) {
            double o = 0;
            for (size_t j = 0; j < n; j++)
                o += sc[j] / z * V[(kv_slot_pos(L, h, j) * HKV + h) * D + i];
            out[hq * D + i] = o;
        }
    }
    free(sc);
}

/* The query heads of q rotated by RoPE at position pos (what attend takes). */
static void rope_q(float *dst, const float *q, size_t pos) {
    double y[D];
    for (size_t hq = 0; hq < NH; hq++) {
        rope_ref(y, q + hq * D, pos);
        for (size_t i = 0; i < D; i++)
            dst[hq * D + i] = (float)y[i];
    }
}

static void append_all(e8kv_cache *c, const float *K, const float *V, size_t p0, size_t n) {
    for (size_t l = 0; l < NL; l++)
        assert_ok(e8kv_cache_append(c, l, K + p0 * HKV * D, V + p0 * HKV * D, n));
}

/* f32 keys before RoPE: after eviction, attention equals the naive one over the kept tokens at their own
 * positions, for every scorer; a token appended afterwards takes the next position. */
static void test_evict_attention_exact(void **state) {
    (void)state;
    const char *specs[] = {"f32,rope=pre,page=16,evict=keykey:0.6,recent=8",
                           "f32,rope=pre,page=16,evict=snapkv:0.6,recent=8,obs=16",
                           "f32,rope=pre,page=16,evict=h2o:0.7,recent=8",
                           "f32,rope=pre,page=16,sink=2,evict=stream:0.5,recent=8",
                           "f32,rope=pre,page=16,evict=keykey:0.5,evict1=0.8"};
    const size_t n = 200;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 11);
    float *K = rand_vec(&rng, (n + 1) * HKV * D, 1.0), *V = rand_vec(&rng, (n + 1) * HKV * D, 1.0);
    float *Q = rand_vec(&rng, NL * n * NH * D, 1.0), *q = rand_vec(&rng, NH * D, 1.0);
    float out[NH * D];
    double ref[NH * D];
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        size_t err = 0;
        e8kv_cache *c = make(specs[s], 512, &err);
        assert_non_null(c);
        append_all(c, K, V, 0, n);
        const size_t before = e8kv_cache_bytes(c);
        const size_t kept = e8kv_cache_evict(c, Q, NH, n, 0);
        assert_false(e8kv_is_error(kept));
        assert_true(kept < n);
        assert_true(e8kv_cache_bytes(c) < before);
        for (size_t l = 0; l < NL; l++) {
            const kv_layer *L = &c->layers[l];
            assert_int_equal(e8kv_cache_n_tokens(c, l), n); /* positions stay the caller's */
            assert_int_equal(e8kv_cache_n_kept(c, l), L->n_tokens);
            assert_int_equal(L->n_tokens % 16, 0); /* whole pages */
            const double frac = l == 1 && s == 4 ? 0.8 : c->ev.frac;
            assert_true(L->n_tokens >= n - (size_t)floor(frac * n));
            assert_true(L->n_tokens < n - (size_t)floor(frac * n) + 16);
            for (size_t h = 0; h < HKV; h++) {
                /* first position and the newest `recent` kept, positions ascending */
                assert_int_equal(kv_slot_pos(L, h, 0), 0);
                for (size_t j = 1; j < L->n_tokens; j++)
                    assert_true(kv_slot_pos(L, h, j) > kv_slot_pos(L, h, j - 1));
                for (size_t j = 0; j < 8; j++)
                    assert_int_equal(kv_slot_pos(L, h, L->n_tokens - 1 - j), n - 1 - j);
                if (s == 3) { /* stream: sinks and the newest tokens */
                    assert_int_equal(kv_slot_pos(L, h, 1), 1);
                    assert_int_equal(kv_slot_pos(L, h, 2), n - (L->n_tokens - 2));
                }
            }
        }
        /* one more token at position n, then its attention */
        append_all(c, K, V, n, 1);
        for (size_t l = 0; l < NL; l++) {
            assert_int_equal(e8kv_cache_n_tokens(c, l), n + 1);
            float qr[NH * D];
            rope_q(qr, q, n);
            assert_int_equal(e8kv_cache_attend(c, out, NH * D, l, qr, NH, 1, n), NH * D);
            naive_attend_kept(c, l, K, V, q, n, ref);
            for (size_t i = 0; i < NH * D; i++)
                if (!(fabs(out[i] - ref[i]) < 1e-4))
                    fail_msg("%s layer %zu: out[%zu] %g ref %g", specs[s], l, i, out[i], ref[i]);
            /* a query inside the evicted span has no slot */
            assert_error(e8kv_cache_attend(c, out, NH * D, l, q, NH, 1, 3), DIMENSION);
        }
        e8kv_cache_free(c);
    }
    free(K);
    free(V);
    free(Q);
    free(q);
}

/* Every format: the kept tokens read back bit-identical (codes move as bytes, RoPE at the same position),
 * and attention runs on the evicted cache. */
static void test_evict_formats(void **state) {
    (void)state;
    const char *fmts[] = {"f16",  "q8_0",  "q4_0h",    "lloyd:3",  "e8:2",
                          "e8:4", "e8v:3", "e8nest:4", "d4nest:3", "e8box:4"};
    const size_t n = 150, dd = 64;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 5);
    float *K = rand_vec(&rng, n * HKV * dd, 1.0), *V = rand_vec(&rng, n * HKV * dd, 1.0);
    float *q = rand_vec(&rng, NH * dd, 1.0), *out = malloc(NH * dd * sizeof *out);
    float *before = malloc(n * dd * sizeof(float)), *after = malloc(n * dd * sizeof(float));
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        char spec[128];
        snprintf(spec, sizeof spec, "%s,sink=1,page=32,evict=keykey:0.5", fmts[f]);
        const e8kv_cache_params p = {.n_layer = 1,
                                     .n_head_kv = HKV,
                                     .head_dim = dd,
                                     .n_ctx = 256,
                                     .spec = spec,
                                     .seed = 3,
                                     .rope_theta = THETA};
        size_t err = 0;
        e8kv_cache *c = e8kv_cache_create(&p, &err);
        if (!c) fail_msg("%s: %s", spec, e8kv_error_name(err));
        assert_ok(e8kv_cache_append(c, 0, K, V, n));
        const kv_layer *L = &c->layers[0];
        float *snap[2][HKV];
        for (int is_k = 0; is_k < 2; is_k++)
            for (size_t h = 0; h < HKV; h++) {
                snap[is_k][h] = malloc(n * dd * sizeof(float));
                e8kv_cache_read_tokens(c, L, h, is_k, 0, n, snap[is_k][h]);
            }
        assert_ok(e8kv_cache_evict(c, NULL, 0, 0, 0));
        assert_true(L->n_tokens < n);
        for (int is_k = 0; is_k < 2; is_k++)
            for (size_t h = 0; h < HKV; h++) {
                e8kv_cache_read_tokens(c, L, h, is_k, 0, L->n_tokens, after);
                /* values and keys coded after RoPE move as bytes and read back bit-identical; keys coded
                 * before it get RoPE by a recurrence over runs of positions, which moved: ~1e-6 */
                const double tol = is_k && c->rope_pre ? 1e-5 : 0.0;
                for (size_t j = 0; j < L->n_tokens * dd; j++) {
                    const float x = snap[is_k][h][kv_slot_pos(L, h, j / dd) * dd + j % dd];
                    if (!(fabs(after[j] - x) <= tol * (1.0 + fabs(x))))
                        fail_msg("%s: %s of head %zu slot %zu differs after eviction", fmts[f],
                                 is_k ? "K" : "V", h, j / dd);
                }
                free(snap[is_k][h]);
            }
        assert_int_equal(e8kv_cache_attend(c, out, NH * dd, 0, q, NH, 1, n - 1), NH * dd);
        for (size_t i = 0; i < NH * dd; i++)
            assert_true(isfinite(out[i]));
        e8kv_cache_free(c);
    }
    (void)before;
    free(before);
    free(after);
    free(K);
    free(V);
    free(q);
    free(out);
}

/* Bytes the allocator really holds for a cache's pages and position index: malloc_usable_size (which
 * glibc and the sanitizers' allocators both answer) of every block of the page allocator (slabs and
 * tables, pages.h) and of every layer's index, and the number of those blocks. */
static void add_block(void *user, const void *block) {
    size_t *acc = user;
    acc[0] += malloc_usable_size((void *)(uintptr_t)block);
    acc[1]++;
}
static size_t real_page_bytes(const e8kv_cache *c, size_t *n_blocks) {
    size_t acc[2] = {0, 0};
    e8kv_pages_each_block(&c->pages, add_block, acc);
    for (size_t l = 0; l < c->n_layer; l++)
        if (c->layers[l].pos) add_block(acc, c->layers[l].pos);
    *n_blocks = acc[1];
    return acc[0];
}

/* Evicted memory is really returned: the pages of evicted tokens are freed and their slabs compacted, and
 * what the allocator holds for pages and the position index is the accounting (e8kv_cache_bytes less its
 * fixed part) plus at most one 64-byte granule per allocation (the allocator's rounding of 64-byte-aligned
 * blocks), before and after eviction. Pages come in slabs (pages.h), so these allocations are slabs, not
 * pages. (glibc's global counters, mallinfo2, were tried first and are no measurement of this: its
 * per-thread cache counts freed small chunks as in use, so the freed total moved with the process's
 * allocation history.) */
static void test_evict_memory(void **state) {
    (void)state;
    const size_t n = 2048, dd = 64;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 9);
    float *K = rand_vec(&rng, n * HKV * dd, 1.0), *V = rand_vec(&rng, n * HKV * dd, 1.0);
    const e8kv_cache_params p = {.n_layer = 4,
                                 .n_head_kv = HKV,
                                 .head_dim = dd,
                                 .n_ctx = n,
                                 .spec = "e8:2,sink=1,evict=stream:0.8",
                                 .seed = 3,
                                 .rope_theta = THETA};
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_create(&p, &err);
    assert_non_null(c);
    for (size_t l = 0; l < 4; l++)
        assert_ok(e8kv_cache_append(c, l, K, V, n));
    const size_t b0 = e8kv_cache_bytes(c);
    size_t n_allocs_before = 0, n_allocs_after = 0;
    const size_t r0 = real_page_bytes(c, &n_allocs_before), a0 = b0 - e8kv_cache_fixed_bytes(c);
    assert_ok(e8kv_cache_evict(c, NULL, 0, 0, 0));
    const size_t b1 = e8kv_cache_bytes(c);
    const size_t r1 = real_page_bytes(c, &n_allocs_after), a1 = b1 - e8kv_cache_fixed_bytes(c);
    const size_t g0 = 64 * n_allocs_before, g1 = 64 * n_allocs_after;
    if (!(r0 >= a0 && r0 - a0 <= g0) || !(r1 >= a1 && r1 - a1 <= g1))
        fail_msg("allocator holds %zu / %zu bytes, accounting says %zu / %zu (before / after eviction)", r0,
                 r1, a0, a1);
    /* pages: ceil(kept / 64) per head and stream, each 64 * vector_bytes; index: 4 bytes per kept slot */
    size_t pages = 0, index = 0;
    for (size_t l = 0; l < 4; l++) {
        const kv_layer *L = &c->layers[l];
        assert_int_equal(L->n_tokens, 448); /* 2048 - floor(0.8 * 2048) = 410, up to whole pages */
        pages += 2 * HKV * e8kv_aligned_size(64 * L->k.vector_bytes) * ((L->n_tokens + 63) / 64);
        index += HKV * L->n_tokens * sizeof(uint32_t);
    }
    /* the pages handed out are exactly the kept ones; the slabs holding them waste at most 1/32 of their
     * pages (compaction, pages.h) and their 64-byte headers; the rest is the index and the tables */
    assert_int_equal(e8kv_pages_live_bytes(&c->pages), pages);
    assert_true(c->pages.slab_bytes <=
                pages + pages / E8KV_SLAB_WASTE_DIV + E8KV_SLAB_HEADER * c->pages.n_slab);
    assert_int_equal(b1, e8kv_pages_bytes(&c->pages) + index + e8kv_cache_fixed_bytes(c));
    assert_true((b1 - e8kv_cache_fixed_bytes(c)) * 4 < b0 - e8kv_cache_fixed_bytes(c));
    e8kv_cache_free(c);
    free(K);
    free(V);
}

static void test_evict_spec(void **state) {
    (void)state;
    const char *bad[] = {"e8:4,evict=keykey",
                         "e8:4,evict=foo:0.5",
                         "e8:4,evict=keykey:1",
                         "e8:4,evict=keykey:-0.1",
                         "e8:4,evict=keykey:0.5x",
                         "e8:4,recent=0",
                         "e8:4,evict=h2o:0.5,window=16",
                         "e8:4,evict=keykey:0.5,evict2=0.5",
                         "e8:4,evict1-0=0.5",
                         "e8:4,obs=x",
                         "e8:4,evict0=1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t err = 0;
        e8kv_cache *c = make(bad[i], 64, &err);
        if (c) fail_msg("%s accepted", bad[i]);
        assert_error(err, SPEC);
    }
    const char *good[] = {"e8:4,evict=keykey:0.6",
                          "auto=e8v:3,evict=snapkv:0.5,obs=64",
                          "e8:2,evict=h2o:0,recent=1",
                          "f16,evict=stream:0.9,budget=100",
                          "e8:4,evict=keykey:0.5,evict0-1=0.25",
                          "evict-high",
                          "evict-balanced",
                          "evict-max",
                          "evict-safe"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t err = 0;
        e8kv_cache *c = make(good[i], 64, &err);
        /* auto= needs a calibration with sensitivities (the evict-* presets use it): without one, SPEC */
        const char *ps = e8kv_cache_preset_spec(good[i]);
        if (!c && e8kv_get_error_code(err) == E8KV_ERROR_SPEC && strstr(ps ? ps : good[i], "auto=")) continue;
        if (!c) fail_msg("%s refused: %s", good[i], e8kv_error_name(err));
        e8kv_cache_free(c);
    }
    assert_non_null(e8kv_cache_preset_spec("evict-max"));
    assert_string_equal(e8kv_cache_preset_spec("evict-safe"), "auto=e8tv:4,sink=1,evict=snapkv:0.5");
    /* token-group formats code groups of tokens together: eviction, which moves single tokens, is refused */
    {
        const e8kv_cache_params gp = {
            .n_layer = NL, .n_head_kv = HKV, .head_dim = 64, .n_ctx = 64, .spec = "kivi:4,evict=stream:0.5"};
        size_t gerr = 0;
        e8kv_cache *g = e8kv_cache_create(&gp, &gerr);
        if (g) fail_msg("kivi:4 with eviction accepted");
        assert_error(gerr, UNSUPPORTED);
    }
    /* no eviction configured, or queries missing for a scorer that needs them */
    size_t err = 0;
    e8kv_cache *c = make("e8:4", 64, &err);
    assert_error(e8kv_cache_evict(c, NULL, 0, 0, 0), BAD_ARGUMENT);
    e8kv_cache_free(c);
    c = make("e8:4,evict=snapkv:0.5", 64, &err);
    assert_error(e8kv_cache_evict(c, NULL, 0, 0, 0), BAD_ARGUMENT);
    float q[NH * D] = {0};
    assert_error(e8kv_cache_evict(c, q, 3, 1, 0), DIMENSION);
    q[5] = NAN;
    assert_error(e8kv_cache_evict(c, q, NH, 1, 0), NONFINITE);
    e8kv_cache_free(c);
}

/* Truncate and remove after an eviction; clear forgets it. */
static void test_evict_positions(void **state) {
    (void)state;
    const size_t n = 120;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 2);
    float *K = rand_vec(&rng, (n + 40) * HKV * D, 1.0), *V = rand_vec(&rng, (n + 40) * HKV * D, 1.0);
    size_t err = 0;
    e8kv_cache *c = make("e8:2,page=8,evict=keykey:0.5,recent=4", 256, &err);
    assert_non_null(c);
    append_all(c, K, V, 0, n);
    assert_ok(e8kv_cache_evict(c, NULL, 0, 0, 0));
    const size_t kept = e8kv_cache_n_kept(c, 0);
    append_all(c, K, V, n, 40);
    assert_int_equal(e8kv_cache_n_tokens(c, 0), n + 40);
    assert_int_equal(e8kv_cache_n_kept(c, 0), kept + 40);
    assert_error(e8kv_cache_truncate(c, n - 2), UNSUPPORTED); /* inside the evicted span */
    assert_error(e8kv_cache_remove(c, n + 1, 2), UNSUPPORTED);
    assert_int_equal(e8kv_cache_truncate(c, n + 10), n + 10);
    assert_int_equal(e8kv_cache_n_kept(c, 1), kept + 10);
    e8kv_cache_clear(c);
    assert_int_equal(e8kv_cache_n_tokens(c, 0), 0);
    assert_null(c->layers[0].pos);
    assert_int_equal(c->index_bytes, 0);
    append_all(c, K, V, 0, 10);
    assert_int_equal(e8kv_cache_n_tokens(c, 1), 10);
    e8kv_cache_free(c);
    free(K);
    free(V);
}

/* budget=N: appends one token at a time keep each layer within N + a page, and attention stays exact
 * against the naive one (f32, keys before RoPE). */
static void test_evict_budget(void **state) {
    (void)state;
    const size_t n = 300;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 4);
    float *K = rand_vec(&rng, n * HKV * D, 1.0), *V = rand_vec(&rng, n * HKV * D, 1.0);
    float *q = rand_vec(&rng, NH * D, 1.0), out[NH * D];
    double ref[NH * D];
    size_t err = 0;
    e8kv_cache *c = make("f32,rope=pre,page=16,sink=1,evict=keykey:0,budget=64,recent=8", 512, &err);
    assert_non_null(c);
    size_t max_kept = 0;
    for (size_t t = 0; t < n; t++) {
        append_all(c, K, V, t, 1);
        if (e8kv_cache_n_kept(c, 0) > max_kept) max_kept = e8kv_cache_n_kept(c, 0);
    }
    assert_true(max_kept <= 64 + 16 + 1);
    assert_int_equal(e8kv_cache_n_tokens(c, 0), n);
    float qr[NH * D];
    rope_q(qr, q, n - 1);
    assert_int_equal(e8kv_cache_attend(c, out, NH * D, 1, qr, NH, 1, n - 1), NH * D);
    naive_attend_kept(c, 1, K, V, q, n - 1, ref);
    for (size_t i = 0; i < NH * D; i++)
        assert_true(fabs(out[i] - ref[i]) < 1e-4);
    e8kv_cache_free(c);
    free(K);
    free(V);
    free(q);
}

/* Save and load of an evicted cache: the same positions, bytes and attention output, bit for bit; the
 * loaded cache goes on appending at the right position; a truncated file is refused by name. */
static void test_evict_save_load(void **state) {
    (void)state;
    const size_t n = 180, dd = 64;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 12);
    float *K = rand_vec(&rng, (n + 1) * HKV * dd, 1.0), *V = rand_vec(&rng, (n + 1) * HKV * dd, 1.0);
    float *q = rand_vec(&rng, NH * dd, 1.0), *o1 = malloc(NH * dd * sizeof(float)),
          *o2 = malloc(NH * dd * sizeof(float));
    const char *specs[] = {"e8:2,sink=1,page=32,evict=keykey:0.6,evict1=0.3",
                           "e8box:4,page=16,evict=stream:0.5", "q4_0h,evict=keykey:0.5,recent=5"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const e8kv_cache_params p = {.n_layer = NL,
                                     .n_head_kv = HKV,
                                     .head_dim = dd,
                                     .n_ctx = 256,
                                     .spec = specs[s],
                                     .seed = 3,
                                     .rope_theta = THETA};
        size_t err = 0;
        e8kv_cache *a = e8kv_cache_create(&p, &err);
        assert_non_null(a);
        for (size_t l = 0; l < NL; l++)
            assert_ok(e8kv_cache_append(a, l, K, V, n));
        assert_ok(e8kv_cache_evict(a, NULL, 0, 0, 0));
        size_t sz = 0;
        uint8_t *buf = test_cache_save(a, &sz, NULL, 0);
        e8kv_cache *b = e8kv_cache_load(buf, sz, 1, &err);
        if (!b) fail_msg("%s: load: %s", specs[s], e8kv_error_name(err));
        /* the same pages and index (the slabs holding them follow each cache's history) */
        assert_int_equal(e8kv_pages_live_bytes(&b->pages), e8kv_pages_live_bytes(&a->pages));
        assert_int_equal(e8kv_cache_bytes(b) - e8kv_pages_bytes(&b->pages),
                         e8kv_cache_bytes(a) - e8kv_pages_bytes(&a->pages));
        for (size_t l = 0; l < NL; l++) {
            const kv_layer *La = &a->layers[l], *Lb = &b->layers[l];
            assert_int_equal(Lb->n_tokens, La->n_tokens);
            assert_int_equal(Lb->n_evicted, La->n_evicted);
            assert_int_equal(Lb->n_map, La->n_map);
            assert_memory_equal(Lb->pos, La->pos, HKV * La->n_map * sizeof(uint32_t));
            assert_int_equal(e8kv_cache_n_tokens(b, l), n);
            assert_ok(e8kv_cache_attend(a, o1, NH * dd, l, q, NH, 1, n - 1));
            assert_ok(e8kv_cache_attend(b, o2, NH * dd, l, q, NH, 1, n - 1));
            assert_memory_equal(o1, o2, NH * dd * sizeof(float));
        }
        for (size_t l = 0; l < NL; l++) { /* both go on at position n */
            assert_int_equal(e8kv_cache_append(a, l, K + n * HKV * dd, V + n * HKV * dd, 1), n + 1);
            assert_int_equal(e8kv_cache_append(b, l, K + n * HKV * dd, V + n * HKV * dd, 1), n + 1);
            assert_ok(e8kv_cache_attend(a, o1, NH * dd, l, q, NH, 1, n));
            assert_ok(e8kv_cache_attend(b, o2, NH * dd, l, q, NH, 1, n));
            assert_memory_equal(o1, o2, NH * dd * sizeof(float));
        }
        /* load_into an existing cache of the same spec */
        e8kv_cache *c2 = e8kv_cache_create(&p, &err);
        assert_int_equal(e8kv_cache_load_into(c2, buf, sz), n);
        assert_int_equal(c2->layers[0].n_map, a->layers[0].n_map);
        /* the cold form is smaller than the hot pages */
        assert_true(sz < e8kv_cache_bytes(c2));
        assert_error(e8kv_cache_load_into(c2, buf, sz - 9), TRUNCATED);
        e8kv_cache_free(c2);
        e8kv_cache_free(a);
        e8kv_cache_free(b);
        free(buf);
    }
    free(K);
    free(V);
    free(q);
    free(o1);
    free(o2);
}

/* snapkv pools by the maximum over 7 neighbours: the 7 tokens around a key the observation attends to most
 * are kept whole, even where clusters of keys attended less (each 1/4.5 of it) fill the budget first when
 * the pooling averages (their mean over 7 then beats the spike's 1/7). Keys before RoPE with no RoPE
 * (rope_theta 0), one direction e0: query logits are the keys' first coordinate exactly. */
static void test_evict_snapkv_pools_spans(void **state) {
    (void)state;
    const size_t n = 200, spike = 80;
    const size_t clusters[] = {20, 40, 120, 140, 160};
    const e8kv_cache_params p = {.n_layer = NL,
                                 .n_head_kv = HKV,
                                 .head_dim = D,
                                 .n_ctx = 256,
                                 .spec = "f32,page=16,evict=snapkv:0.9,recent=8,obs=16",
                                 .seed = 7};
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_create(&p, &err);
    assert_non_null(c);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 5);
    float *K = rand_vec(&rng, n * HKV * D, 0.1), *V = rand_vec(&rng, n * HKV * D, 1.0);
    float *Q = calloc(NL * n * NH * D, sizeof *Q);
    assert_non_null(Q);
    for (size_t t = 0; t < n; t++)
        for (size_t h = 0; h < HKV; h++)
            K[(t * HKV + h) * D] = 0.0f;
    for (size_t h = 0; h < HKV; h++) {
        K[(spike * HKV + h) * D] = 11.5f;
        for (size_t k = 0; k < sizeof clusters / sizeof clusters[0]; k++)
            for (size_t t = clusters[k]; t < clusters[k] + 7; t++)
                K[(t * HKV + h) * D] = 10.0f;
    }
    for (size_t i = 0; i < NL * n * NH; i++)
        Q[i * D] = 4.0f; /* logit = 4 · k0 / sqrt(16) = k0 */
    append_all(c, K, V, 0, n);
    assert_false(e8kv_is_error(e8kv_cache_evict(c, Q, NH, n, 0)));
    for (size_t l = 0; l < NL; l++) {
        const kv_layer *L = &c->layers[l];
        assert_int_equal(L->n_tokens, 32); /* 20 rounded up to whole pages: 1 + 8 protected, 23 chosen */
        for (size_t h = 0; h < HKV; h++) {
            size_t around = 0;
            for (size_t j = 0; j < L->n_tokens; j++) {
                const size_t pos = kv_slot_pos(L, h, j);
                around += pos + 3 >= spike && pos <= spike + 3;
            }
            assert_int_equal(around, 7);
        }
    }
    free(K);
    free(V);
    free(Q);
    e8kv_cache_free(c);
}

/* Learned attention sinks (e8kv_cache_evict_sinks) join each observing query's softmax: -inf sinks are no
 * sinks (the same kept slots); with one observer per KV head (snapkv, one query, as many query heads as KV
 * heads) a sink scales every weight of that observer alike and cannot change what is kept; with many
 * observers a large sink on some query heads shifts the weight to the others and does; NaN and +inf sinks,
 * and sinks without queries, are named errors. */
static size_t kept_slots(const char *spec, const float *K, const float *V, size_t n, const float *Q,
                         size_t n_head, size_t n_q, const float *sinks, size_t *pos) {
    size_t err = 0;
    e8kv_cache *c = make(spec, 512, &err);
    assert_non_null(c);
    append_all(c, K, V, 0, n);
    assert_false(e8kv_is_error(e8kv_cache_evict_sinks(c, Q, n_head, n_q, n - n_q, sinks)));
    size_t m = 0;
    for (size_t l = 0; l < NL; l++)
        for (size_t h = 0; h < HKV; h++)
            for (size_t j = 0; j < c->layers[l].n_tokens; j++)
                pos[m++] = kv_slot_pos(&c->layers[l], h, j);
    e8kv_cache_free(c);
    return m;
}

static void test_evict_sinks(void **state) {
    (void)state;
    const size_t n = 160;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 23);
    float *K = rand_vec(&rng, n * HKV * D, 1.0), *V = rand_vec(&rng, n * HKV * D, 1.0);
    float *Q = rand_vec(&rng, NL * n * NH * D, 1.5);
    size_t *a = malloc(NL * HKV * n * sizeof *a), *b = malloc(NL * HKV * n * sizeof *b);
    float none[NL * NH], big[NL * NH], some[NL * NH];
    for (size_t i = 0; i < NL * NH; i++) {
        none[i] = -INFINITY;
        big[i] = i % 2 ? -INFINITY : 12.0f; /* every other query head mostly attends to its sink */
        some[i] = (float)(e8kv_rng_normal(&rng) * 3.0);
    }
    const char *h2o = "f32,rope=pre,page=16,evict=h2o:0.6,recent=8";
    /* -inf: no sink */
    size_t m = kept_slots(h2o, K, V, n, Q, NH, n, NULL, a);
    assert_int_equal(kept_slots(h2o, K, V, n, Q, NH, n, none, b), m);
    assert_memory_equal(a, b, m * sizeof *a);
    /* many observers: large sinks on half the query heads change the choice */
    assert_int_equal(kept_slots(h2o, K, V, n, Q, NH, n, big, b), m);
    assert_true(memcmp(a, b, m * sizeof *a) != 0);
    /* one observer per KV head: any finite sink keeps the same tokens (HKV query heads, one query) */
    const char *snap = "f32,rope=pre,page=16,evict=snapkv:0.6,recent=8,obs=1";
    const float *q1 = Q + (n - 1) * NH * D; /* the last query; its layer-1 rows follow in q2 */
    float *q2 = malloc(NL * HKV * D * sizeof *q2);
    for (size_t l = 0; l < NL; l++)
        memcpy(q2 + l * HKV * D, q1 + l * n * NH * D, HKV * D * sizeof *q2);
    m = kept_slots(snap, K, V, n, q2, HKV, 1, NULL, a);
    assert_int_equal(kept_slots(snap, K, V, n, q2, HKV, 1, some, b), m);
    assert_memory_equal(a, b, m * sizeof *a);
    /* errors */
    size_t err = 0;
    e8kv_cache *c = make(h2o, 512, &err);
    append_all(c, K, V, 0, n);
    float bad[NL * NH];
    memcpy(bad, some, sizeof bad);
    bad[3] = NAN;
    assert_error(e8kv_cache_evict_sinks(c, Q, NH, n, 0, bad), NONFINITE);
    bad[3] = INFINITY;
    assert_error(e8kv_cache_evict_sinks(c, Q, NH, n, 0, bad), NONFINITE);
    assert_int_equal(c->layers[0].n_tokens, n); /* refused calls evict nothing */
    e8kv_cache_free(c);
    c = make("f32,rope=pre,page=16,evict=keykey:0.6", 512, &err);
    append_all(c, K, V, 0, n);
    assert_error(e8kv_cache_evict_sinks(c, NULL, 0, 0, 0, some), BAD_ARGUMENT);
    e8kv_cache_free(c);
    free(q2);
    free(a);
    free(b);
    free(K);
    free(V);
    free(Q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evict_attention_exact), cmocka_unit_test(test_evict_formats),
        cmocka_unit_test(test_evict_memory),          cmocka_unit_test(test_evict_spec),
        cmocka_unit_test(test_evict_positions),       cmocka_unit_test(test_evict_budget),
        cmocka_unit_test(test_evict_save_load),       cmocka_unit_test(test_evict_snapkv_pools_spans),
        cmocka_unit_test(test_evict_sinks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
