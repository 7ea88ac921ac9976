/* Persistent thread pool (pool.h, e8kv.h).
 *
 * A job lives in one 64-bit word, `job` = seq (32 bits) | n (16) | next (16): its sequence number, its
 * item count and the next unclaimed item. A thread claims item i by a compare-and-swap from
 * (seq, n, i) to (seq, n, i + 1), so a claim can only succeed while its job is live and the item free;
 * a worker woken late, holding a stale word, fails its swap and touches nothing. fn and args are written
 * before the word is published (release) and rewritten only after every item of the job is done, so
 * the thread that won item i reads the fn and args of item i's job. The caller waits for `done` (items
 * finished) to reach n, never for idle workers: a worker that the scheduler keeps away costs nothing
 * (on a loaded machine, waiting for every worker to check in cost a time slice per job).
 *
 * Idle workers spin on the word for up to POOL_SPIN_NS, then sleep on `wake` under `mu`; the caller
 * publishes, then takes `mu` and broadcasts, and a worker re-checks the word under `mu` before it
 * sleeps, so no wake-up is lost. `run_mu` makes callers of one pool take turns. */
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
/* items per published job (16 bits of the word); e8kv_pool_run cuts longer loops into several jobs */
#define JOB_ITEMS_MAX 0xffffu

#define JOB_SEQ(w) ((uint32_t)((w) >> 32))
#define JOB_N(w) ((size_t)(((w) >> 16) & 0xffffu))
#define JOB_NEXT(w) ((size_t)((w)&0xffffu))

struct e8kv_pool {
    size_t n_workers;
    pthread_t *tids;
    pthread_mutex_t run_mu; /* held by the caller whose job runs */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    _Atomic uint64_t job; /* seq | n | next */
    atomic_size_t done;   /* items of the current job finished */
    atomic_int stop;
    e8kv_pool_fn fn; /* the current job's, written before its word is published */
    void *args;
    size_t base; /* the first item of the caller's loop that this job's item 0 stands for */
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

/* Claim and run items of the job in word w until none is left (or the job is no longer w's). */
static void run_items(e8kv_pool *p, uint64_t w) {
    while (JOB_NEXT(w) < JOB_N(w)) {
        if (!atomic_compare_exchange_weak_explicit(&p->job, &w, w + 1, memory_order_acq_rel,
                                                   memory_order_acquire)) {
            continue; /* w now holds the current word: another item, or another job */
        }
        p->fn(p->args, p->base + JOB_NEXT(w));
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        w++;
    }
}

/* Wait until the word's sequence number differs from seq (or the pool stops); returns the word. */
static uint64_t wait_job(e8kv_pool *p, uint32_t seq) {
    const uint64_t t0 = now_ns();
    for (unsigned i = 1;; i++) {
        const uint64_t w = atomic_load_explicit(&p->job, memory_order_acquire);
        if (JOB_SEQ(w) != seq || atomic_load_explicit(&p->stop, memory_order_relaxed)) return w;
        CPU_RELAX();
        if (i % 64 == 0 && now_ns() - t0 > POOL_SPIN_NS) break;
    }
    pthread_mutex_lock(&p->mu);
    uint64_t w;
    while (JOB_SEQ(w = atomic_load_explicit(&p->job, memory_order_acquire)) == seq &&
           !atomic_load_explicit(&p->stop, memory_order_relaxed))
        pthread_cond_wait(&p->wake, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return w;
}

static void *worker_main(void *arg) {
    e8kv_pool *const p = arg;
    tl_job_pool = p;
    uint32_t seen = 0; /* the word at create: a worker that starts late still sees the first job */
    while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
        const uint64_t w = wait_job(p, seen);
        seen = JOB_SEQ(w);
        run_items(p, w);
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
    p->tids = n_workers ? calloc(n_workers, sizeof *p->tids) : NULL;
    const int ok = !n_workers || p->tids;
    const int run_mu = ok && pthread_mutex_init(&p->run_mu, NULL) == 0;
    const int mu = run_mu && pthread_mutex_init(&p->mu, NULL) == 0;
    const int wake = mu && pthread_cond_init(&p->wake, NULL) == 0;
    if (!wake) {
        if (mu) pthread_mutex_destroy(&p->mu);
        if (run_mu) pthread_mutex_destroy(&p->run_mu);
        free(p->tids);
        free(p);
        *err = E8KV_ERR(OUT_OF_MEMORY);
        return NULL;
    }
    atomic_init(&p->job, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->stop, 0);
    for (size_t i = 0; i < n_workers; i++) {
        if (pthread_create(&p->tids[i], NULL, worker_main, p)) {
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
    atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n_workers; i++)
        pthread_join(p->tids[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    free(p->tids);
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
    const e8kv_pool *const outer = tl_job_pool;
    tl_job_pool = p;
    for (size_t base = 0; base < n; base += JOB_ITEMS_MAX) {
        const size_t m = n - base < JOB_ITEMS_MAX ? n - base : JOB_ITEMS_MAX;
        p->fn = fn;
        p->args = args;
        p->base = base;
        atomic_store_explicit(&p->done, 0, memory_order_relaxed);
        const uint64_t w = atomic_load_explicit(&p->job, memory_order_relaxed);
        const uint64_t nw = (uint64_t)(JOB_SEQ(w) + 1u) << 32 | (uint64_t)m << 16;
        atomic_store_explicit(&p->job, nw, memory_order_release);
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        run_items(p, nw);
        for (unsigned i = 1; atomic_load_explicit(&p->done, memory_order_acquire) != m; i++) {
            CPU_RELAX();
            if (i % 1024 == 0) sched_yield();
        }
    }
    tl_job_pool = outer;
    pthread_mutex_unlock(&p->run_mu);
    return n;
}
