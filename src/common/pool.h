/* The library's one set of worker threads (public API: e8kv_pool_* in e8kv.h). A cache's attention runs
 * on a pool (its own, or one given with e8kv_cache_set_pool), and so does a caller's own parallel work
 * (the engine's forward pass: matrix products, SwiGLU), so one set of threads serves a whole decode step.
 *
 * A job is a parallel loop: fn(args, i) for every i in [0, n), each exactly once, the items claimed one
 * at a time by the caller's thread and every worker (dynamic scheduling: causal attention items differ
 * in cost). Which thread runs an item is unspecified, so a job whose items write disjoint outputs gives
 * the same bits at any thread count; that is how the engine and attention stay bit-identical to one
 * thread.
 *
 * Creating and joining threads per call cost tens of µs per thread, a visible part of a decode step at
 * long context; the workers live as long as the pool, spin for a short while after each job (so
 * back-to-back jobs start at once) and then sleep on a condition variable (so they do not steal the cores
 * of whatever runs between steps). */
#ifndef E8KV_POOL_H
#define E8KV_POOL_H

#include "e8kv.h"

#include <stddef.h>

/* Is the calling thread running an item of a job of `pool` right now (worker or caller)? */
int e8kv_pool_in_job(const e8kv_pool *pool);

#endif
