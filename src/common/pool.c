/* Persistent fork-join thread pool (pool.h). A job is published by bumping `gen` (release); each worker
 * spins on `gen` for up to POOL_SPIN_NS, then sleeps on `wake` under `mu`. The caller always takes `mu`
 * and broadcasts after the bump, and a worker re-checks `gen` under `mu` before it sleeps, so no wake-up
 * is lost. Completion: each worker decrements `pending` (release) and the caller spins on it (acquire),
 * yielding after a while; a share is a whole attention slice, far longer than the spin. */
#include "pool.h"

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
    size_t index; /* runs share index + 1 */
    pthread_t tid;
} pool_worker;

struct e8kv_pool {
    size_t n_workers;
    pool_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint gen;       /* bumped once per job */
    atomic_size_t pending; /* workers of the current job not yet done */
    atomic_flag busy;      /* a caller holds the pool */
    int stop;              /* under mu */
    e8kv_pool_fn fn;       /* the current job, written before gen is bumped */
    void *args;
    size_t n;
};

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

static void *worker_main(void *arg) {
    pool_worker *const w = arg;
    e8kv_pool *const p = w->pool;
    unsigned seen = 0; /* gen at create: a worker that starts late still sees the first job */
    for (;;) {
        const unsigned g = wait_job(p, seen);
        if (g == seen) break; /* stop */
        seen = g;
        if (w->index + 1 < p->n) p->fn(p->args, w->index + 1);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

e8kv_pool *e8kv_pool_create(size_t n_workers) {
    if (n_workers == 0) return NULL;
    e8kv_pool *const p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->workers = calloc(n_workers, sizeof *p->workers);
    if (!p->workers || pthread_mutex_init(&p->mu, NULL)) {
        free(p->workers);
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->wake, NULL)) {
        pthread_mutex_destroy(&p->mu);
        free(p->workers);
        free(p);
        return NULL;
    }
    atomic_init(&p->gen, 0u);
    atomic_init(&p->pending, 0);
    atomic_flag_clear(&p->busy);
    for (size_t i = 0; i < n_workers; i++) {
        p->workers[i].pool = p;
        p->workers[i].index = i;
        if (pthread_create(&p->workers[i].tid, NULL, worker_main, &p->workers[i])) {
            p->n_workers = i; /* join the ones started */
            e8kv_pool_free(p);
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
    free(p->workers);
    free(p);
}

size_t e8kv_pool_workers(const e8kv_pool *p) {
    return p ? p->n_workers : 0;
}

int e8kv_pool_try_run(e8kv_pool *p, e8kv_pool_fn fn, void *args, size_t n) {
    if (!p || !fn || n == 0 || n > p->n_workers + 1) return 0;
    if (atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire)) return 0;
    p->fn = fn;
    p->args = args;
    p->n = n;
    /* every worker takes part in every job (those past n only count down), so one counter suffices */
    atomic_store_explicit(&p->pending, p->n_workers, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1u, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(args, 0);
    for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++) {
        CPU_RELAX();
        if (i % 1024 == 0) sched_yield();
    }
    atomic_flag_clear_explicit(&p->busy, memory_order_release);
    return 1;
}
