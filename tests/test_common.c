/* common/: error codes and names, fp16/bf16 conversions against the compiler's own _Float16, rng, and the
 * thread pool. */
#include "test_util.h"

#include "common/common.h"
#include "common/fp16.h"
#include "common/pool.h"
#include "common/rng.h"
#include "common/rope.h"
#include "common/cpu.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <unistd.h>

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

/* pool: every item of every job runs exactly once, the workers take part, and a job is over when
 * e8kv_pool_run returns */
#define POOL_ITEMS_MAX 200
typedef struct {
    atomic_int runs[POOL_ITEMS_MAX];
    pthread_t seen[POOL_ITEMS_MAX]; /* the thread of item i */
    e8kv_pool *pool;
    atomic_int in_job; /* items that saw e8kv_pool_in_job(pool) */
    int sleep_us;      /* per item, so that jobs last and overlap with other callers */
} pool_job;

static void pool_item(void *args, size_t i) {
    pool_job *const j = args;
    atomic_fetch_add(&j->runs[i], 1);
    j->seen[i] = pthread_self();
    if (e8kv_pool_in_job(j->pool)) atomic_fetch_add(&j->in_job, 1);
    if (j->sleep_us) usleep((useconds_t)j->sleep_us);
}

static void test_pool_runs_every_item(void **state) {
    (void)state;
    size_t err = 0;
    assert_null(e8kv_pool_create(0, &err));
    assert_int_equal(err, E8KV_ERR(BAD_ARGUMENT));
    assert_null(e8kv_pool_create(E8KV_POOL_MAX_THREADS + 1, &err));
    assert_int_equal(err, E8KV_ERR(BAD_ARGUMENT));
    e8kv_pool_free(NULL);
    assert_int_equal(e8kv_pool_threads(NULL), 1);
    static pool_job j; /* 1.6 KiB of thread ids: not on the stack */
    assert_int_equal(e8kv_pool_run(NULL, NULL, &j, 3), E8KV_ERR(BAD_ARGUMENT));
    for (size_t n_threads = 1; n_threads <= 4; n_threads += 3) {
        e8kv_pool *p = e8kv_pool_create(n_threads, &err);
        assert_non_null(p);
        assert_int_equal(err, 0);
        assert_int_equal(e8kv_pool_threads(p), n_threads);
        assert_false(e8kv_pool_in_job(p));
        for (int rep = 0; rep < 2000; rep++) { /* back to back: workers still spinning */
            const size_t n = (size_t)rep % 67;
            memset(&j, 0, sizeof j);
            j.pool = p;
            assert_int_equal(e8kv_pool_run(rep % 3 ? p : NULL, pool_item, &j, n), n);
            for (size_t i = 0; i < POOL_ITEMS_MAX; i++)
                assert_int_equal(atomic_load(&j.runs[i]), i < n ? 1 : 0);
            /* items of a pool's job know it (one item, or no pool: the caller alone, outside a job) */
            assert_int_equal(atomic_load(&j.in_job), rep % 3 && n > 1 && n_threads > 1 ? (int)n : 0);
            if (rep % 500 == 499) usleep(120000); /* past the spin: workers asleep, woken by the next job */
        }
        assert_false(e8kv_pool_in_job(p));
        /* slow items: the workers take some of them */
        memset(&j, 0, sizeof j);
        j.pool = p;
        j.sleep_us = 2000;
        assert_int_equal(e8kv_pool_run(p, pool_item, &j, 40), 40);
        size_t others = 0;
        for (size_t i = 0; i < 40; i++)
            others += !pthread_equal(j.seen[i], pthread_self());
        if (n_threads == 1)
            assert_int_equal(others, 0);
        else
            assert_true(others > 0);
        e8kv_pool_free(p);
    }
}

/* Several callers at once take turns: no two jobs' items run at the same time, each job is complete when
 * its call returns. And an item that asks its own pool for more runs those items itself. */
typedef struct {
    e8kv_pool *p;
    atomic_int active[3]; /* items of caller c's job running now */
    atomic_int overlaps;
} pool_race;

typedef struct {
    pool_race *r;
    int who;
    atomic_int runs[8];
} race_job;

static void race_item(void *args, size_t i) {
    race_job *const j = args;
    atomic_fetch_add(&j->r->active[j->who], 1);
    for (int c = 0; c < 3; c++)
        if (c != j->who && atomic_load(&j->r->active[c])) atomic_fetch_add(&j->r->overlaps, 1);
    usleep(50);
    atomic_fetch_add(&j->runs[i], 1);
    atomic_fetch_sub(&j->r->active[j->who], 1);
}

static void *pool_caller(void *arg) {
    race_job *const j0 = arg;
    for (int rep = 0; rep < 100; rep++) {
        race_job j = {.r = j0->r, .who = j0->who};
        assert_int_equal(e8kv_pool_run(j.r->p, race_item, &j, 8), 8);
        for (size_t i = 0; i < 8; i++)
            assert_int_equal(atomic_load(&j.runs[i]), 1);
    }
    return NULL;
}

typedef struct {
    e8kv_pool *p;
    pthread_t outer[4];
    pthread_t inner[4][3];
} nest_job;

static void nest_inner(void *args, size_t i) {
    pthread_t *const seen = args;
    seen[i] = pthread_self();
}

static void nest_outer(void *args, size_t i) {
    nest_job *const j = args;
    j->outer[i] = pthread_self();
    assert_int_equal(e8kv_pool_run(j->p, nest_inner, j->inner[i], 3), 3);
}

static void test_pool_callers_take_turns(void **state) {
    (void)state;
    pool_race r = {.p = e8kv_pool_create(3, NULL)};
    assert_non_null(r.p);
    pthread_t t[3];
    race_job js[3];
    for (int i = 0; i < 3; i++) {
        js[i] = (race_job){.r = &r, .who = i};
        assert_int_equal(pthread_create(&t[i], NULL, pool_caller, &js[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&r.overlaps), 0);

    nest_job nj = {.p = r.p};
    assert_int_equal(e8kv_pool_run(r.p, nest_outer, &nj, 4), 4);
    for (size_t i = 0; i < 4; i++)
        for (size_t k = 0; k < 3; k++)
            assert_true(pthread_equal(nj.inner[i][k], nj.outer[i]));
    e8kv_pool_free(r.p);
}

/* Files in dir whose name starts with prefix. */
static size_t count_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static int same_bytes(const char *path, const void *want, size_t n) {
    void *got = NULL;
    const size_t r = e8kv_cache_read_file(&got, path);
    const int same = r == n && memcmp(got, want, n) == 0;
    free(got);
    return same;
}

/* e8kv_file_write replaces a file whole or not at all: over RLIMIT_FSIZE (SIGXFSZ ignored, so write()
 * fails with EFBIG) the old contents stay and no temporary file is left; a directory or a missing
 * directory is an I/O error; a full device (/dev/full) is E8KV_ERROR_NO_SPACE; writing through a symbolic
 * link keeps the link. */
static void test_atomic_write(void **state) {
    (void)state;
    char dir[] = "/tmp/e8kv_test_file_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], link_path[256];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    snprintf(link_path, sizeof link_path, "%s/l.bin", dir);
    static uint8_t old_bytes[3000], new_bytes[200000];
    for (size_t i = 0; i < sizeof old_bytes; i++)
        old_bytes[i] = (uint8_t)(i * 7);
    for (size_t i = 0; i < sizeof new_bytes; i++)
        new_bytes[i] = (uint8_t)(i * 13 + 1);
    assert_int_equal(e8kv_file_write(path, old_bytes, sizeof old_bytes), sizeof old_bytes);
    assert_true(same_bytes(path, old_bytes, sizeof old_bytes));

    struct rlimit saved, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
    lim = saved;
    lim.rlim_cur = 65536;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    const size_t r = e8kv_file_write(path, new_bytes, sizeof new_bytes);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(e8kv_get_error_code(r), E8KV_ERROR_IO);
    assert_true(same_bytes(path, old_bytes, sizeof old_bytes));
    assert_int_equal(count_prefixed(dir, "f.bin.tmp"), 0);

    /* the writer API: abort leaves the old file; commit replaces it */
    size_t err = 0;
    e8kv_file_writer *w = e8kv_file_writer_open(path, &err);
    assert_non_null(w);
    assert_int_equal(e8kv_file_writer_write(w, new_bytes, 100), 100);
    e8kv_file_writer_abort(w);
    assert_true(same_bytes(path, old_bytes, sizeof old_bytes));
    assert_int_equal(count_prefixed(dir, "f.bin.tmp"), 0);
    assert_int_equal(symlink("f.bin", link_path), 0);
    w = e8kv_file_writer_open(link_path, &err);
    assert_non_null(w);
    assert_int_equal(e8kv_file_writer_write(w, new_bytes, 1000), 1000);
    assert_int_equal(e8kv_file_writer_write(w, new_bytes + 1000, sizeof new_bytes - 1000),
                     sizeof new_bytes - 1000);
    assert_int_equal(e8kv_file_writer_commit(w), sizeof new_bytes);
    struct stat st;
    assert_int_equal(lstat(link_path, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_true(same_bytes(path, new_bytes, sizeof new_bytes));

    assert_int_equal(e8kv_get_error_code(e8kv_file_write(dir, old_bytes, 10)), E8KV_ERROR_IO);
    /* a device is written in place: nothing is created beside it */
    const size_t n_dev = count_prefixed("/dev", "null.tmp");
    assert_int_equal(e8kv_file_write("/dev/null", old_bytes, 10), 10);
    assert_int_equal(count_prefixed("/dev", "null.tmp"), n_dev);
    /* a full device (write() fails with ENOSPC) is named, and the writer keeps saying so */
    if (access("/dev/full", W_OK) == 0) {
        assert_int_equal(e8kv_get_error_code(e8kv_file_write("/dev/full", old_bytes, 10)),
                         E8KV_ERROR_NO_SPACE);
        w = e8kv_file_writer_open("/dev/full", &err);
        assert_non_null(w);
        assert_int_equal(e8kv_get_error_code(e8kv_file_writer_write(w, old_bytes, 10)), E8KV_ERROR_NO_SPACE);
        assert_int_equal(e8kv_get_error_code(e8kv_file_writer_write(w, old_bytes, 10)), E8KV_ERROR_NO_SPACE);
        assert_int_equal(e8kv_get_error_code(e8kv_file_writer_commit(w)), E8KV_ERROR_NO_SPACE);
    }
    assert_int_equal(e8kv_get_error_code(e8kv_file_write("/nonexistent-e8kv-dir/x", old_bytes, 10)),
                     E8KV_ERROR_IO);
    assert_int_equal(e8kv_get_error_code(e8kv_file_write(NULL, old_bytes, 10)), E8KV_ERROR_BAD_ARGUMENT);
    assert_int_equal(count_prefixed(dir, "f.bin.tmp") + count_prefixed(dir, "l.bin"), 1);
    unlink(link_path);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

/* RoPE (common/rope.c): the row kernels' twins give the same bits; e8kv_rope_apply against RoPE computed in
 * double with each position's own angle, both layouts, positions to 131K; the same bits however the rows
 * are split (one call, runs of 1..63 rows, one head at a time), which is what lets the engine's keys and
 * the cache's rope=pre keys be rotated identically. */
static void test_rope(void **state) {
    (void)state;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 31);
    static const size_t dims[] = {8, 24, 64, 128};
    static const size_t poss[] = {0, 5, 100003, 131008};
    const size_t n = 150, n_vec = 3;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int neox = 0; neox <= 1; neox++) {
            const size_t d = dims[di], half = d / 2, w = n_vec * d;
            size_t err = 1;
            e8kv_rope *r = e8kv_rope_create(d, 500000.0f, neox, &err);
            assert_non_null(r);
            assert_int_equal(err, 0);
            for (size_t pi = 0; pi < sizeof poss / sizeof poss[0]; pi++) {
                const size_t pos = poss[pi];
                float *x = malloc(n * w * sizeof(float)), *a = malloc(n * w * sizeof(float)),
                      *b = malloc(n * w * sizeof(float));
                for (size_t i = 0; i < n * w; i++) x[i] = (float)e8kv_rng_normal(&rng);
                memcpy(a, x, n * w * sizeof(float));
                memcpy(b, x, n * w * sizeof(float));
                e8kv_rope_apply(r, a, n, n_vec, pos);
                /* split into uneven runs, one head vector at a time */
                for (size_t t = 0, k = 1; t < n; t += k, k = k % 63 + 7)
                    for (size_t h = 0; h < n_vec; h++)
                        for (size_t u = t; u < t + k && u < n; u++)
                            e8kv_rope_apply(r, b + u * w + h * d, 1, 1, pos + u);
                assert_memory_equal(a, b, n * w * sizeof(float));
                double worst = 0;
                for (size_t t = 0; t < n; t++)
                    for (size_t h = 0; h < n_vec; h++)
                        for (size_t i = 0; i < half; i++) {
                            const size_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                            const double f = pow(500000.0, -2.0 * (double)i / (double)d);
                            const double ang = fmod((double)(pos + t) * f, 6.283185307179586);
                            const float *xv = x + t * w + h * d, *av = a + t * w + h * d;
                            const double y0 = xv[i0] * cos(ang) - xv[i1] * sin(ang);
                            const double y1 = xv[i0] * sin(ang) + xv[i1] * cos(ang);
                            worst = fmax(worst, fmax(fabs(av[i0] - y0), fabs(av[i1] - y1)));
                        }
                /* values of size ~4: cos/sin within half a float ulp, then one product and sum in float */
                assert_true(worst < 1e-6);
                free(x);
                free(a);
                free(b);
            }
            e8kv_rope_free(r);
        }
    /* the twins alone, from an arbitrary angle and step (the state they leave included) */
    if (!e8kv_cpu_has_avx2()) return;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int neox = 0; neox <= 1; neox++) {
            const size_t d = dims[di], half = d / 2, rows = 9;
            double c1[64], s1[64], c2[64], s2[64], dc[64], ds[64];
            float a[9 * 2 * 128], b[9 * 2 * 128];
            for (size_t i = 0; i < half; i++) {
                const double u = e8kv_rng_normal(&rng), v = e8kv_rng_normal(&rng);
                c1[i] = c2[i] = cos(u);
                s1[i] = s2[i] = sin(u);
                dc[i] = cos(v);
                ds[i] = sin(v);
            }
            for (size_t i = 0; i < rows * 2 * d; i++) a[i] = b[i] = (float)e8kv_rng_normal(&rng);
            e8kv_rope_rows_ref(a, rows, 2, d, neox, c1, s1, dc, ds);
            e8kv_rope_rows_avx2(b, rows, 2, d, neox, c2, s2, dc, ds);
            assert_memory_equal(a, b, rows * 2 * d * sizeof(float));
            assert_memory_equal(c1, c2, half * sizeof(double));
            assert_memory_equal(s1, s2, half * sizeof(double));
            e8kv_rope_rows_ref(NULL, 5, 0, d, neox, c1, s1, dc, ds); /* advancing alone */
            e8kv_rope_rows_avx2(NULL, 5, 0, d, neox, c2, s2, dc, ds);
            assert_memory_equal(c1, c2, half * sizeof(double));
            assert_memory_equal(s1, s2, half * sizeof(double));
        }
    /* bad parameters are named errors */
    size_t err = 0;
    assert_null(e8kv_rope_create(7, 10000.0f, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_HEAD_DIM);
    assert_null(e8kv_rope_create(64, 0.0f, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_BAD_ARGUMENT);
    assert_null(e8kv_rope_create(64, NAN, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_BAD_ARGUMENT);
    /* the model's own frequencies: theta's give e8kv_rope_create's rotation bit for bit; scaled ones (the low
     * pairs slowed 8x, as Llama 3.1's) turn those pairs by p·f; bad ones are named errors */
    double f[64];
    for (size_t i = 0; i < 64; i++)
        f[i] = pow(500000.0, -2.0 * (double)i / 128.0);
    e8kv_rope *a = e8kv_rope_create(128, 500000.0f, 1, &err), *b = e8kv_rope_create_freqs(128, f, 1, &err);
    assert_non_null(a);
    assert_non_null(b);
    float x[3 * 2 * 128], y[3 * 2 * 128];
    for (size_t i = 0; i < 3 * 2 * 128; i++)
        x[i] = y[i] = (float)sin(0.37 * (double)i) * 3.0f;
    e8kv_rope_apply(a, x, 3, 2, 70001);
    e8kv_rope_apply(b, y, 3, 2, 70001);
    assert_memory_equal(x, y, sizeof x);
    e8kv_rope_free(b);
    for (size_t i = 32; i < 64; i++)
        f[i] /= 8.0;
    b = e8kv_rope_create_freqs(128, f, 0, &err);
    assert_non_null(b);
    float u[128] = {0};
    u[2 * 50] = 1.0f; /* pair 50 (interleaved) at position 1000: (cos, sin) of 1000·f[50] */
    e8kv_rope_apply(b, u, 1, 1, 1000);
    assert_true(fabs(u[100] - cos(1000.0 * f[50])) < 1e-6 && fabs(u[101] - sin(1000.0 * f[50])) < 1e-6);
    e8kv_rope_free(a);
    e8kv_rope_free(b);
    f[3] = -1.0;
    assert_null(e8kv_rope_create_freqs(128, f, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_BAD_ARGUMENT);
    f[3] = NAN;
    assert_null(e8kv_rope_create_freqs(128, f, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_BAD_ARGUMENT);
    assert_null(e8kv_rope_create_freqs(128, NULL, 0, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_BAD_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_rope),
#if defined(__FLT16_MAX__)
        cmocka_unit_test(test_fp16_against_compiler),
#endif
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_rng_deterministic),
        cmocka_unit_test(test_pool_runs_every_item),
        cmocka_unit_test(test_pool_callers_take_turns),
        cmocka_unit_test(test_atomic_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
