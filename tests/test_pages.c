/* cache/pages.c: the slab allocator of the cache's pages. Alloc, free and reuse; slabs released when
 * empty; reservations that fit slabs to the pages asked for; compaction that keeps every page's bytes;
 * the accounting against what the system was asked for (an allocator hook that records every block) and
 * against what malloc holds (malloc_usable_size); out-of-memory at every allocation, in the allocator and
 * through a cache's append, with nothing already stored lost; and the cache-level invariant: after
 * append, eviction, truncate and remove, e8kv_cache_bytes less its fixed part and index is the
 * allocator's held bytes, which are the bytes of the blocks it holds from the system. */
#include "test_util.h"

#include "cache/kvcache.h"
#include "cache/pages.h"
#include "common/common.h"
#include "common/rng.h"

#include <malloc.h>

/* ---------------------------------------------------------------- a recording system allocator */
#define TRACK_MAX 4096
typedef struct {
    void *ptr[TRACK_MAX];
    size_t size[TRACK_MAX]; /* as reserved: e8kv_aligned_size of the request */
    size_t n, live_bytes, n_alloc;
    long fail_after; /* allocations left before every one fails; < 0: never */
} tracker;

static void *track_alloc(void *user, size_t n_bytes) {
    tracker *t = user;
    if (t->fail_after == 0) return NULL;
    if (t->fail_after > 0) t->fail_after--;
    void *q = e8kv_malloc_aligned(n_bytes);
    assert_non_null(q);
    assert_true(t->n < TRACK_MAX);
    t->ptr[t->n] = q;
    t->size[t->n++] = e8kv_aligned_size(n_bytes);
    t->live_bytes += e8kv_aligned_size(n_bytes);
    t->n_alloc++;
    return q;
}

static void track_free(void *user, void *q) {
    tracker *t = user;
    for (size_t i = 0; i < t->n; i++)
        if (t->ptr[i] == q) {
            t->live_bytes -= t->size[i];
            t->ptr[i] = t->ptr[--t->n];
            t->size[i] = t->size[t->n];
            e8kv_free_aligned(q);
            return;
        }
    fail_msg("free of a block the allocator never handed out");
}

static void track(kv_pages *p, tracker *t) {
    memset(t, 0, sizeof *t);
    t->fail_after = -1;
    p->sys_alloc = track_alloc;
    p->sys_free = track_free;
    p->sys_user = t;
}

/* malloc_usable_size of every block the allocator holds, and their number */
static void add_block(void *user, const void *block) {
    size_t *acc = user;
    acc[0] += malloc_usable_size((void *)(uintptr_t)block);
    acc[1]++;
}

/* held == what was asked of the system (exactly), and malloc really holds that up to one 64-byte granule
 * per block */
static void check_held(const kv_pages *p, const tracker *t) {
    assert_int_equal(e8kv_pages_bytes(p), t->live_bytes);
    size_t acc[2] = {0, 0};
    e8kv_pages_each_block(p, add_block, acc);
    assert_int_equal(acc[1], t->n);
    if (!(acc[0] >= t->live_bytes && acc[0] - t->live_bytes <= 64 * acc[1]))
        fail_msg("malloc holds %zu bytes in %zu blocks, the allocator counts %zu", acc[0], acc[1],
                 t->live_bytes);
}

static void fill(uint8_t *page, size_t n, uint32_t tag) {
    for (size_t i = 0; i < n; i++)
        page[i] = (uint8_t)(tag * 131u + i * 7u);
}

static int filled(const uint8_t *page, size_t n, uint32_t tag) {
    for (size_t i = 0; i < n; i++)
        if (page[i] != (uint8_t)(tag * 131u + i * 7u)) return 0;
    return 1;
}

/* ---------------------------------------------------------------- the allocator alone */
#define PAGE_B 1000 /* stride 1024: 64 pages a slab at most (64 KiB < E8KV_SLAB_TARGET_BYTES) */
#define N_PAGES 300

static void test_alloc_free_reuse(void **state) {
    (void)state;
    kv_pages p;
    tracker t;
    assert_int_equal(e8kv_pages_init(&p, 2), 0);
    track(&p, &t);
    assert_int_equal(e8kv_pages_bytes(&p), 0);
    static uint8_t *pg[N_PAGES];
    static uint32_t id[N_PAGES];
    assert_int_equal(e8kv_pages_reserve(&p, PAGE_B, N_PAGES), 0);
    for (size_t i = 0; i < N_PAGES; i++) {
        pg[i] = e8kv_pages_alloc(&p, PAGE_B, &id[i]);
        assert_non_null(pg[i]);
        assert_int_equal((uintptr_t)pg[i] % E8KV_ALIGN, 0);
        for (size_t j = 0; j < PAGE_B; j++)
            assert_int_equal(pg[i][j], 0); /* zeroed */
        fill(pg[i], 1024, (uint32_t)i);    /* the whole stride is the page's */
    }
    for (size_t i = 0; i < N_PAGES; i++)
        assert_true(filled(pg[i], 1024, (uint32_t)i)); /* no two pages overlap */
    assert_int_equal(e8kv_pages_live_bytes(&p), N_PAGES * 1024);
    check_held(&p, &t);
    /* freed pages are reused before any new slab */
    const size_t held = e8kv_pages_bytes(&p), n_alloc = t.n_alloc;
    for (size_t i = 0; i < N_PAGES; i += 3)
        e8kv_pages_free(&p, pg[i], id[i]);
    for (size_t i = 0; i < N_PAGES; i += 3) {
        pg[i] = e8kv_pages_alloc(&p, 1024, &id[i]); /* 1024 B: the same class */
        assert_non_null(pg[i]);
        for (size_t j = 0; j < 1024; j++)
            assert_int_equal(pg[i][j], 0); /* a reused page is zeroed too */
        fill(pg[i], 1024, (uint32_t)i);
    }
    assert_int_equal(t.n_alloc, n_alloc);
    assert_int_equal(e8kv_pages_bytes(&p), held);
    for (size_t i = 0; i < N_PAGES; i++)
        assert_true(filled(pg[i], 1024, (uint32_t)i));
    /* another size is another class */
    uint32_t id2 = 0;
    uint8_t *other = e8kv_pages_alloc(&p, 5000, &id2);
    assert_non_null(other);
    assert_int_equal(p.n_cls, 2);
    assert_null(e8kv_pages_alloc(&p, 9000, &id2)); /* a third size: max_cls is 2 */
    e8kv_pages_free(&p, other, id2);
    check_held(&p, &t);
    e8kv_pages_release(&p);
    assert_int_equal(t.n, 0); /* everything went back */
    /* without a reservation a new slab holds 1/64 of its class's live pages (at least one) */
    assert_int_equal(e8kv_pages_init(&p, 1), 0);
    track(&p, &t);
    for (size_t i = 0; i < N_PAGES; i++)
        assert_non_null(pg[i] = e8kv_pages_alloc(&p, PAGE_B, &id[i]));
    assert_true(p.n_slab < N_PAGES * 2 / 3);
    check_held(&p, &t);
    e8kv_pages_release(&p);
    assert_int_equal(t.n, 0);
}

static void test_slab_release(void **state) {
    (void)state;
    kv_pages p;
    tracker t;
    assert_int_equal(e8kv_pages_init(&p, 1), 0);
    track(&p, &t);
    static uint8_t *pg[N_PAGES];
    static uint32_t id[N_PAGES];
    assert_int_equal(e8kv_pages_reserve(&p, PAGE_B, N_PAGES), 0);
    /* a reservation takes slabs of the most pages (64 of 1024 B) and one for the rest: 4·64 + 44 */
    assert_int_equal(p.n_slab, 5);
    const size_t slabs =
        4 * e8kv_aligned_size(E8KV_SLAB_HEADER + 64 * 1024) + e8kv_aligned_size(E8KV_SLAB_HEADER + 44 * 1024);
    assert_int_equal(p.slab_bytes, slabs);
    for (size_t i = 0; i < N_PAGES; i++) {
        pg[i] = e8kv_pages_alloc(&p, PAGE_B, &id[i]);
        assert_non_null(pg[i]);
    }
    assert_int_equal(p.n_slab, 5); /* nothing beyond the reservation */
    check_held(&p, &t);
    /* free the pages of one slab: it goes back, and only it */
    const uint32_t s0 = id[0];
    size_t in_s0 = 0;
    for (size_t i = 0; i < N_PAGES; i++)
        if (id[i] == s0) {
            e8kv_pages_free(&p, pg[i], id[i]);
            pg[i] = NULL;
            in_s0++;
        }
    assert_true(in_s0 == 64 || in_s0 == 44);
    assert_int_equal(p.n_slab, 4);
    assert_int_equal(p.slab_bytes, slabs - e8kv_aligned_size(E8KV_SLAB_HEADER + in_s0 * 1024));
    check_held(&p, &t);
    /* free everything: no slab and no table is left */
    for (size_t i = 0; i < N_PAGES; i++)
        if (pg[i]) e8kv_pages_free(&p, pg[i], id[i]);
    assert_int_equal(p.n_slab, 0);
    assert_int_equal(e8kv_pages_bytes(&p), 0);
    assert_int_equal(t.n, 0);
    e8kv_pages_release(&p);
}

/* Free most pages in a scattered pattern, compact as a cache does (every owner entry whose slab is
 * marked moves): every page keeps its bytes, fewer slabs remain, the waste is within 1/32. */
static void test_compaction(void **state) {
    (void)state;
    kv_pages p;
    tracker t;
    assert_int_equal(e8kv_pages_init(&p, 1), 0);
    track(&p, &t);
    static uint8_t *pg[N_PAGES];
    static uint32_t id[N_PAGES];
    assert_int_equal(e8kv_pages_reserve(&p, PAGE_B, N_PAGES), 0);
    for (size_t i = 0; i < N_PAGES; i++) {
        pg[i] = e8kv_pages_alloc(&p, PAGE_B, &id[i]);
        fill(pg[i], 1024, (uint32_t)i);
    }
    for (size_t round = 0; round < 3; round++) {
        /* round 0: 2 of 3 pages; then half of the rest, twice */
        for (size_t i = 0; i < N_PAGES; i++)
            if (pg[i] && (round == 0 ? i % 3 != 0 : (i / 3) % 2 == round - 1)) {
                e8kv_pages_free(&p, pg[i], id[i]);
                pg[i] = NULL;
            }
        const size_t before = p.n_slab;
        if (e8kv_pages_compact_begin(&p)) {
            for (size_t i = 0; i < N_PAGES; i++)
                if (pg[i] && e8kv_pages_moving(&p, id[i])) e8kv_pages_move(&p, &pg[i], &id[i]);
            e8kv_pages_compact_end(&p);
        }
        assert_true(p.n_slab <= before);
        size_t live = 0;
        for (size_t i = 0; i < N_PAGES; i++)
            if (pg[i]) {
                assert_true(filled(pg[i], 1024, (uint32_t)i));
                live++;
            }
        assert_int_equal(e8kv_pages_live_bytes(&p), live * 1024);
        print_message("round %zu: %zu live pages in %zu slabs (%zu before), %zu slab bytes\n", round, live,
                      p.n_slab, before, p.slab_bytes);
        assert_true(p.slab_bytes <=
                    live * 1024 + live * 1024 / E8KV_SLAB_WASTE_DIV + E8KV_SLAB_HEADER * p.n_slab);
        check_held(&p, &t);
    }
    e8kv_pages_release(&p);
    assert_int_equal(t.n, 0);
}

/* Random allocs (with and without reservations, two sizes), frees and compactions: every page keeps its
 * bytes, none overlaps another, and the held bytes are what the system gave, at every step. */
static void test_random_ops(void **state) {
    (void)state;
    kv_pages p;
    tracker t;
    assert_int_equal(e8kv_pages_init(&p, 2), 0);
    track(&p, &t);
    static uint8_t *pg[N_PAGES];
    static uint32_t id[N_PAGES];
    static size_t sz[N_PAGES];
    memset(pg, 0, sizeof pg);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 12);
    for (size_t step = 0; step < 3000; step++) {
        const uint64_t r = e8kv_rng_next(&rng);
        const size_t i = (size_t)(r % N_PAGES), op = (size_t)(r >> 32) % 10;
        if (op < 5 && !pg[i]) {
            sz[i] = (r >> 40) & 1 ? 1024 : 3072;
            if (op == 0) assert_int_equal(e8kv_pages_reserve(&p, sz[i], 1 + (size_t)(r >> 48) % 40), 0);
            pg[i] = e8kv_pages_alloc(&p, sz[i], &id[i]);
            assert_non_null(pg[i]);
            fill(pg[i], sz[i], (uint32_t)(i + step));
            sz[i] |= (step << 16); /* the tag is kept with the size */
        } else if (op < 9 && pg[i]) {
            e8kv_pages_free(&p, pg[i], id[i]);
            pg[i] = NULL;
        } else if (op == 9 && e8kv_pages_compact_begin(&p)) {
            for (size_t j = 0; j < N_PAGES; j++)
                if (pg[j] && e8kv_pages_moving(&p, id[j])) e8kv_pages_move(&p, &pg[j], &id[j]);
            e8kv_pages_compact_end(&p);
            assert_false(e8kv_pages_wasteful(&p)); /* compaction leaves at most 1/32 free */
        }
        if (step % 100 == 0 || op == 9) {
            size_t live = 0;
            for (size_t j = 0; j < N_PAGES; j++)
                if (pg[j]) {
                    const size_t n = sz[j] & 0xffff;
                    assert_true(filled(pg[j], n, (uint32_t)(j + (sz[j] >> 16))));
                    live += n;
                }
            assert_int_equal(e8kv_pages_live_bytes(&p), live);
            check_held(&p, &t);
        }
    }
    e8kv_pages_release(&p);
    assert_int_equal(t.n, 0);
}

/* Every allocation of the system allocator failing in turn: alloc answers NULL and reserve 1, with the
 * bytes held and every page already out unchanged. */
static void test_out_of_memory(void **state) {
    (void)state;
    kv_pages p;
    tracker t;
    assert_int_equal(e8kv_pages_init(&p, 2), 0);
    track(&p, &t);
    uint32_t id = 0;
    t.fail_after = 0; /* the very first allocation (the class table) */
    assert_null(e8kv_pages_alloc(&p, PAGE_B, &id));
    assert_int_equal(e8kv_pages_bytes(&p), 0);
    assert_int_equal(t.n, 0);
    t.fail_after = 1; /* the slab table */
    assert_int_equal(e8kv_pages_reserve(&p, PAGE_B, 10), 1);
    assert_int_equal(e8kv_pages_bytes(&p), 0);
    assert_int_equal(t.n, 0);
    t.fail_after = -1;
    static uint8_t *pg[N_PAGES];
    static uint32_t ids[N_PAGES];
    for (size_t i = 0; i < 100; i++) {
        pg[i] = e8kv_pages_alloc(&p, PAGE_B, &ids[i]);
        fill(pg[i], 1024, (uint32_t)i);
    }
    for (long k = 0; k < 4; k++) {
        const size_t held = e8kv_pages_bytes(&p), n_blocks = t.n;
        t.fail_after = k; /* a reservation of 200 pages takes 4 slabs (and maybe a larger table) */
        assert_int_equal(e8kv_pages_reserve(&p, PAGE_B, 200), 1);
        assert_int_equal(e8kv_pages_bytes(&p), held);
        assert_int_equal(t.n, n_blocks);
        t.fail_after = 0;
        size_t got = 0; /* what is free in the live slabs is still handed out, then NULL */
        while (got < 200 && (pg[100 + got] = e8kv_pages_alloc(&p, PAGE_B, &ids[100 + got])) != NULL)
            got++;
        assert_true(got < 200);
        assert_int_equal(e8kv_pages_bytes(&p), held);
        for (size_t i = 0; i < got; i++)
            e8kv_pages_free(&p, pg[100 + i], ids[100 + i]);
        for (size_t i = 0; i < 100; i++)
            assert_true(filled(pg[i], 1024, (uint32_t)i));
        check_held(&p, &t);
    }
    t.fail_after = -1;
    assert_int_equal(e8kv_pages_reserve(&p, PAGE_B, 200), 0);
    check_held(&p, &t);
    e8kv_pages_release(&p);
    assert_int_equal(t.n, 0);
}

/* ---------------------------------------------------------------- through a cache */
#define NL 3
#define HKV 2
#define NH 4
#define D 64

static float *rand_vec(e8kv_rng *rng, size_t n) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)e8kv_rng_normal(rng);
    return x;
}

static e8kv_cache *make(const char *spec, size_t n_ctx) {
    const e8kv_cache_params prm = {.n_layer = NL,
                                   .n_head_kv = HKV,
                                   .head_dim = D,
                                   .n_ctx = n_ctx,
                                   .spec = spec,
                                   .seed = 5,
                                   .rope_theta = 10000.0f};
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_create(&prm, &err);
    if (!c) fail_msg("%s: %s", spec, e8kv_error_name(err));
    return c;
}

static size_t index_bytes(const e8kv_cache *c) {
    return e8kv_cache_bytes(c) - e8kv_cache_fixed_bytes(c) - e8kv_pages_bytes(&c->pages);
}

/* the cache's pages part of e8kv_cache_bytes is what its allocator holds, which is what the system gave */
static void check_cache(const e8kv_cache *c, const tracker *t) {
    assert_int_equal(e8kv_cache_bytes(c), e8kv_cache_fixed_bytes(c) + c->index_bytes + t->live_bytes);
    check_held(&c->pages, t);
    size_t live = 0; /* and the allocator's live pages are the tables' pages */
    for (size_t l = 0; l < c->n_layer; l++)
        for (size_t i = 0; i < c->n_head_kv * c->n_page_max; i++)
            for (int is_k = 0; is_k < 2; is_k++) {
                const kv_layer *L = &c->layers[l];
                const kv_page *pg = is_k ? &L->k_pages[i] : &L->v_pages[i];
                if (pg->data) live += e8kv_aligned_size(kv_page_bytes(c, is_k ? &L->k : &L->v, pg->raw));
            }
    assert_int_equal(e8kv_pages_live_bytes(&c->pages), live);
}

/* attention of every layer at the last position, one query */
static void attend_all(e8kv_cache *c, const float *q, float *out) {
    const size_t n = e8kv_cache_n_tokens(c, 0);
    for (size_t l = 0; l < NL; l++)
        assert_int_equal(e8kv_cache_attend(c, out + l * NH * D, NH * D, l, q, NH, 1, n - 1), NH * D);
}

static void test_cache_bytes_are_held(void **state) {
    (void)state;
    static const char *specs[] = {"e8:4", "e8:4,window=40,sink=3,page=32", "k=f16,v=q4_0",
                                  "e8:2,sink=1,evict=stream:0.6", "e8:4,rope=pre,page=16"};
    const size_t n_ctx = 1024;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 3);
    float *K = rand_vec(&rng, n_ctx * HKV * D), *V = rand_vec(&rng, n_ctx * HKV * D);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        e8kv_cache *c = make(specs[s], n_ctx);
        tracker *t = calloc(1, sizeof *t);
        track(&c->pages, t);
        /* a prefill, then decode steps, then a chunk */
        for (size_t l = 0; l < NL; l++)
            assert_ok(e8kv_cache_append(c, l, K, V, 300));
        check_cache(c, t);
        for (size_t i = 0; i < 70; i++)
            for (size_t l = 0; l < NL; l++)
                assert_ok(e8kv_cache_append(c, l, K + (300 + i) * HKV * D, V + (300 + i) * HKV * D, 1));
        check_cache(c, t);
        for (size_t l = 0; l < NL; l++)
            assert_ok(e8kv_cache_append(c, l, K + 370 * HKV * D, V + 370 * HKV * D, 200));
        check_cache(c, t);
        const size_t full = e8kv_cache_bytes(c);
        if (c->ev.scorer) {
            assert_ok(e8kv_cache_evict(c, NULL, 0, 0, 0));
            check_cache(c, t);
            /* the pages eviction returns (the fixed part, tables and RoPE, stays; the kept positions'
             * index is new) */
            const size_t fixed = e8kv_cache_fixed_bytes(c);
            assert_true(e8kv_cache_bytes(c) - index_bytes(c) - fixed < (full - fixed) * 6 / 10);
        } else {
            if (!strstr(specs[s], "rope=pre") && !strstr(specs[s], "e8:")) {
                /* keys after RoPE cannot shift: no remove */
            } else {
                assert_false(e8kv_is_error(e8kv_cache_remove(c, 100, 250)));
                check_cache(c, t);
            }
            assert_int_equal(e8kv_cache_truncate(c, 90), 90);
            check_cache(c, t);
            /* what truncation returns: the bytes beside the fixed part (tables, RoPE, codecs) */
            const size_t fixed = e8kv_cache_fixed_bytes(c);
            assert_true(e8kv_cache_bytes(c) - fixed < (full - fixed) / 3);
        }
        e8kv_cache_clear(c);
        check_cache(c, t);
        assert_int_equal(e8kv_cache_bytes(c), e8kv_cache_fixed_bytes(c)); /* nothing left */
        assert_int_equal(t->n, 0);
        e8kv_cache_free(c);
        free(t);
    }
    free(K);
    free(V);
}

/* Every allocation an append makes failing in turn (the reservations of new pages and of the window's
 * coded copies, and the tables): OUT_OF_MEMORY, and the cache is as before — tokens, bytes, the
 * allocator's blocks and attention outputs bit for bit. Then the same append succeeds. */
static void test_cache_out_of_memory(void **state) {
    (void)state;
    static const char *specs[] = {"e8:4", "e8:4,window=40,sink=3,page=32"};
    const size_t n_ctx = 1024;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 4);
    float *K = rand_vec(&rng, n_ctx * HKV * D), *V = rand_vec(&rng, n_ctx * HKV * D);
    float *q = rand_vec(&rng, NH * D);
    float *o0 = malloc(NL * NH * D * sizeof *o0), *o1 = malloc(NL * NH * D * sizeof *o1);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        e8kv_cache *c = make(specs[s], n_ctx);
        tracker *t = calloc(1, sizeof *t);
        track(&c->pages, t);
        for (size_t l = 0; l < NL; l++)
            assert_ok(e8kv_cache_append(c, l, K, V, 100));
        attend_all(c, q, o0);
        const size_t bytes = e8kv_cache_bytes(c), n_blocks = t->n;
        size_t fails = 0;
        for (long k = 0;; k++) {
            t->fail_after = k;
            const size_t r = e8kv_cache_append(c, 1, K + 100 * HKV * D, V + 100 * HKV * D, 300);
            t->fail_after = -1;
            if (!e8kv_is_error(r)) {
                assert_int_equal(r, 400);
                break;
            }
            assert_error(r, OUT_OF_MEMORY);
            fails++;
            assert_int_equal(e8kv_cache_n_tokens(c, 1), 100);
            assert_int_equal(e8kv_cache_bytes(c), bytes);
            assert_int_equal(t->n, n_blocks);
            check_cache(c, t);
            attend_all(c, q, o1);
            assert_memory_equal(o0, o1, NL * NH * D * sizeof *o0);
        }
        print_message("%s: an append of 300 tokens failed at each of its first %zu allocations\n", specs[s],
                      fails);
        assert_true(fails >= 1);
        check_cache(c, t);
        e8kv_cache_free(c);
        free(t);
    }
    free(K), free(V), free(q), free(o0), free(o1);
}

/* A decode step that opens a page in every head takes one slab for all of them; the pages of a prefill
 * fill their slabs exactly (no unused tail). */
static void test_cache_reservations(void **state) {
    (void)state;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 6);
    float *K = rand_vec(&rng, 1024 * HKV * D), *V = rand_vec(&rng, 1024 * HKV * D);
    e8kv_cache *c = make("e8:4", 1024);
    for (size_t l = 0; l < NL; l++)
        assert_ok(e8kv_cache_append(c, l, K, V, 640)); /* 10 pages of each of 4 streams */
    const kv_page_class *k = &c->pages.cls[0];
    assert_int_equal(c->pages.n_cls, 1);
    assert_int_equal(k->n_cap, k->n_live); /* exactly full */
    assert_int_equal(k->n_live, NL * 2 * HKV * 10);
    const size_t slabs = c->pages.n_slab;
    for (size_t l = 0; l < NL; l++)
        assert_ok(e8kv_cache_append(c, l, K + 640 * HKV * D, V + 640 * HKV * D, 1));
    assert_int_equal(c->pages.n_slab, slabs + NL); /* one slab per layer for its 4 new pages */
    assert_int_equal(k->n_cap, k->n_live);
    e8kv_cache_free(c);
    free(K), free(V);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_free_reuse),    cmocka_unit_test(test_slab_release),
        cmocka_unit_test(test_compaction),          cmocka_unit_test(test_random_ops),
        cmocka_unit_test(test_out_of_memory),       cmocka_unit_test(test_cache_bytes_are_held),
        cmocka_unit_test(test_cache_out_of_memory), cmocka_unit_test(test_cache_reservations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
