/* Deterministic pseudo-random numbers: splitmix64 seeding a xoshiro256** generator, and standard normal
 * deviates by Box–Muller. Same seed, same stream on every platform. */
#ifndef E8KV_RNG_H
#define E8KV_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
    int has_spare;
    double spare;
} e8kv_rng;

void e8kv_rng_seed(e8kv_rng *rng, uint64_t seed);
uint64_t e8kv_rng_next(e8kv_rng *rng);
/* Uniform in [0, 1) with 53 random bits. */
double e8kv_rng_uniform(e8kv_rng *rng);
/* Standard normal. */
double e8kv_rng_normal(e8kv_rng *rng);

#endif
