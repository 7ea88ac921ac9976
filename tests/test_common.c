/* common/: error codes and names, fp16/bf16 conversions against the compiler's own _Float16, rng, and the
 * thread pool. */
#include "test_util.h"

#include "common/common.h"
#include "common/fp16.h"
#include "common/pool.h"
#include "common/rng.h"

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

/* pool: every share of every job runs exactly once, on the thread the header promises for share 0 */
typedef struct {
    atomic_int runs[8];
    pthread_t caller;
    atomic_int share0_on_caller;
    int sleep_us; /* per share, so jobs overlap with other callers */
} pool_job;

static void pool_share(void *args, size_t i) {
    pool_job *const j = args;
    atomic_fetch_add(&j->runs[i], 1);
    if (i == 0) atomic_store(&j->share0_on_caller, pthread_equal(pthread_self(), j->caller));
    if (j->sleep_us) usleep((useconds_t)j->sleep_us);
}

static void test_pool_runs_every_share(void **state) {
    (void)state;
    assert_null(e8kv_pool_create(0));
    e8kv_pool_free(NULL);
    e8kv_pool *p = e8kv_pool_create(3);
    assert_non_null(p);
    assert_int_equal(e8kv_pool_workers(p), 3);
    for (int rep = 0; rep < 2000; rep++) { /* back to back: workers still spinning */
        const size_t n = 1 + (size_t)rep % 4;
        pool_job j = {.caller = pthread_self()};
        assert_true(e8kv_pool_try_run(p, pool_share, &j, n));
        for (size_t i = 0; i < 8; i++)
            assert_int_equal(atomic_load(&j.runs[i]), i < n ? 1 : 0);
        assert_true(atomic_load(&j.share0_on_caller));
        if (rep % 500 == 499) usleep(120000); /* past the spin: workers asleep, woken by the next job */
    }
    pool_job j = {.caller = pthread_self()};
    assert_false(e8kv_pool_try_run(p, pool_share, &j, 5)); /* more shares than threads */
    assert_false(e8kv_pool_try_run(p, pool_share, &j, 0));
    assert_int_equal(atomic_load(&j.runs[0]), 0);
    e8kv_pool_free(p);
}

/* two callers at once: the one that finds the pool busy is told so and nothing of its job runs */
typedef struct {
    e8kv_pool *p;
    atomic_int ran, refused;
} pool_race;

static void *pool_caller(void *arg) {
    pool_race *const r = arg;
    for (int rep = 0; rep < 200; rep++) {
        pool_job j = {.caller = pthread_self(), .sleep_us = 50};
        if (e8kv_pool_try_run(r->p, pool_share, &j, 3)) {
            for (size_t i = 0; i < 3; i++)
                assert_int_equal(atomic_load(&j.runs[i]), 1);
            atomic_fetch_add(&r->ran, 1);
        } else {
            for (size_t i = 0; i < 3; i++)
                assert_int_equal(atomic_load(&j.runs[i]), 0);
            atomic_fetch_add(&r->refused, 1);
        }
    }
    return NULL;
}

static void test_pool_busy(void **state) {
    (void)state;
    pool_race r = {.p = e8kv_pool_create(2)};
    assert_non_null(r.p);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, pool_caller, &r), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&r.ran) + atomic_load(&r.refused), 400);
    assert_true(atomic_load(&r.ran) > 0);
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
 * directory is an I/O error; writing through a symbolic link keeps the link. */
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
    assert_int_equal(e8kv_get_error_code(e8kv_file_write("/nonexistent-e8kv-dir/x", old_bytes, 10)),
                     E8KV_ERROR_IO);
    assert_int_equal(e8kv_get_error_code(e8kv_file_write(NULL, old_bytes, 10)), E8KV_ERROR_BAD_ARGUMENT);
    assert_int_equal(count_prefixed(dir, "f.bin.tmp") + count_prefixed(dir, "l.bin"), 1);
    unlink(link_path);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
#if defined(__FLT16_MAX__)
        cmocka_unit_test(test_fp16_against_compiler),
#endif
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_rng_deterministic),
        cmocka_unit_test(test_pool_runs_every_share),
        cmocka_unit_test(test_pool_busy),
        cmocka_unit_test(test_atomic_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
