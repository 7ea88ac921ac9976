/* Persistent thread pool (pool.h, e8kv.h). A job is published by bumping `gen` (release) after fn, args,
 * n and the item counter `next` are set; each worker spins on `gen` for up to POOL_SPIN_NS, then sleeps
 * on `wake` under `mu`. The caller always takes `mu` and broadcasts after the bump, and a worker
 * re-checks `gen` under `mu` before it sleeps, so no wake-up is lost. Items are claimed by fetch-add on
 * `next`. Completion: every worker takes part in every job (those that find no item left just count
 * down) and decrements `pending` (release); the caller, once out of items, spins on it (acquire),
 * yielding after a while, so a job is over only when no worker can still read its fields. `run_mu`
 * makes callers of one pool take turns. */
#include "pool.h"

#include "error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* how long an idle worker spins before it sleeps */
#define POOL_SPIN_NS 50000

typedef struct {
    e8kv_pool *pool;
    pthread_t tid;
} pool_worker;

struct e8kv_pool {
    size_t n_workers;
    pool_worker *workers;
    pthread_mutex_t run_mu; /* held by the caller whose job runs */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint gen;       /* bumped once per job */
    atomic_size_t next;    /* the next unclaimed item of the current job */
    atomic_size_t pending; /* workers of the current job not yet done */
    int stop;              /* under mu */
    e8kv_pool_fn fn;       /* the current job, written before gen is bumped */
    void *args;
    size_t n;
};

/* the pool whose job the calling thread is running an item of (workers: their own pool, always) */
static _Thread_local const e8kv_pool *tl_job_pool;

int e8kv_pool_in_job(const e8kv_pool *p) {
    return p && tl_job_pool == p;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* the next generation after `seen`, or the same one when the pool stops */
static unsigned wait_job(e8kv_pool *p, unsigned seen) {
    const uint64_t t0 = now_ns();
    for (unsigned i = 1;; i++) {
        const unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        CPU_RELAX();
        if (i % 64 == 0 && now_ns() - t0 > POOL_SPIN_NS) break;
    }
    pthread_mutex_lock(&p->mu);
    unsigned g;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !p->stop)
        pthread_cond_wait(&p->wake, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void run_items(e8kv_pool *p) {
    for (;;) {
        const size_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n) break;
        p->fn(p->args, i);
    }
}

static void *worker_main(void *arg) {
    pool_worker *const w = arg;
    e8kv_pool *const p = w->pool;
    tl_job_pool = p;
    unsigned seen = 0; /* gen at create: a worker that starts late still sees the first job */
    for (;;) {
        const unsigned g = wait_job(p, seen);
        if (g == seen) break; /* stop */
        seen = g;
        run_items(p);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

e8kv_pool *e8kv_pool_create(size_t n_threads, size_t *err) {
    size_t dummy;
    if (!err) err = &dummy;
    *err = 0;
    if (n_threads == 0 || n_threads > E8KV_POOL_MAX_THREADS) {
        *err = E8KV_ERR(BAD_ARGUMENT);
        return NULL;
    }
    e8kv_pool *const p = calloc(1, sizeof *p);
    const size_t n_workers = n_threads - 1;
    if (!p) {
        *err = E8KV_ERR(OUT_OF_MEMORY);
        return NULL;
    }
    p->workers = n_workers ? calloc(n_workers, sizeof *p->workers) : NULL;
    int ok = !n_workers || p->workers;
    const int run_mu = ok && pthread_mutex_init(&p->run_mu, NULL) == 0;
    const int mu = run_mu && pthread_mutex_init(&p->mu, NULL) == 0;
    const int wake = mu && pthread_cond_init(&p->wake, NULL) == 0;
    if (!wake) {
        if (mu) pthread_mutex_destroy(&p->mu);
        if (run_mu) pthread_mutex_destroy(&p->run_mu);
        free(p->workers);
        free(p);
        *err = E8KV_ERR(OUT_OF_MEMORY);
        return NULL;
    }
    atomic_init(&p->gen, 0u);
    atomic_init(&p->next, 0);
    atomic_init(&p->pending, 0);
    for (size_t i = 0; i < n_workers; i++) {
        p->workers[i].pool = p;
        if (pthread_create(&p->workers[i].tid, NULL, worker_main, &p->workers[i])) {
            e8kv_pool_free(p); /* joins the p->n_workers started */
            *err = E8KV_ERR(OUT_OF_MEMORY);
            return NULL;
        }
        p->n_workers = i + 1;
    }
    return p;
}

void e8kv_pool_free(e8kv_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n_workers; i++)
        pthread_join(p->workers[i].tid, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    free(p->workers);
    free(p);
}

size_t e8kv_pool_threads(const e8kv_pool *p) {
    return p ? p->n_workers + 1 : 1;
}

size_t e8kv_pool_run(e8kv_pool *p, e8kv_pool_fn fn, void *args, size_t n) {
    if (!fn) return E8KV_ERR(BAD_ARGUMENT);
    /* no workers, one item, or an item of this pool's own job asking for more: the calling thread */
    if (!p || p->n_workers == 0 || n <= 1 || tl_job_pool == p) {
        for (size_t i = 0; i < n; i++)
            fn(args, i);
        return n;
    }
    pthread_mutex_lock(&p->run_mu);
    p->fn = fn;
    p->args = args;
    p->n = n;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_workers, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1u, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    const e8kv_pool *const outer = tl_job_pool;
    tl_job_pool = p;
    run_items(p);
    tl_job_pool = outer;
    for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++) {
        CPU_RELAX();
        if (i % 1024 == 0) sched_yield();
    }
    pthread_mutex_unlock(&p->run_mu);
    return n;
}
