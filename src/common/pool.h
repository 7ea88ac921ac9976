/* A small persistent thread pool for fork-join kernels (one decode attention step: a few hundred µs of
 * work cut into one share per thread). Creating and joining threads on every call cost tens of µs per
 * thread, which at 64K tokens and 16 threads was a visible part of a step; the pool's workers spin for
 * a short while after each job (so back-to-back steps start at once) and then sleep on a condition
 * variable (so they do not steal the cores of whatever runs between steps).
 *
 * One job at a time: e8kv_pool_try_run answers 0 without running anything when another caller holds the
 * pool, and that caller then runs its shares some other way (its own threads, or inline). */
#ifndef E8KV_POOL_H
#define E8KV_POOL_H

#include <stddef.h>

typedef struct e8kv_pool e8kv_pool;

/* fn(args, i) runs share i */
typedef void (*e8kv_pool_fn)(void *args, size_t i);

/* A pool of n_workers threads (the caller is one more). NULL when n_workers == 0 or a thread or the
 * memory could not be had. */
e8kv_pool *e8kv_pool_create(size_t n_workers);
/* Stops and joins the workers; NULL is a no-op. No job may be running. */
void e8kv_pool_free(e8kv_pool *pool);
size_t e8kv_pool_workers(const e8kv_pool *pool);

/* Runs shares 0 .. n-1 (n <= workers + 1): share 0 on the caller's thread, share i on worker i - 1, and
 * returns 1 once all are done. Returns 0 and runs nothing when the pool is busy with another caller's
 * job or n is out of range. */
int e8kv_pool_try_run(e8kv_pool *pool, e8kv_pool_fn fn, void *args, size_t n);

#endif
