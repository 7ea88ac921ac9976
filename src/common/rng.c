/* xoshiro256** (Blackman & Vigna 2018) seeded through splitmix64; Box–Muller normals. */
#include "rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void e8kv_rng_seed(e8kv_rng *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
    rng->has_spare = 0;
    rng->spare = 0.0;
}

uint64_t e8kv_rng_next(e8kv_rng *rng) {
    uint64_t *s = rng->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double e8kv_rng_uniform(e8kv_rng *rng) { return (double)(e8kv_rng_next(rng) >> 11) * 0x1.0p-53; }

double e8kv_rng_normal(e8kv_rng *rng) {
    if (rng->has_spare) {
        rng->has_spare = 0;
        return rng->spare;
    }
    double u1;
    do u1 = e8kv_rng_uniform(rng);
    while (u1 <= 0.0);
    const double u2 = e8kv_rng_uniform(rng);
    const double r = sqrt(-2.0 * log(u1));
    const double t = 6.283185307179586 * u2;
    rng->spare = r * sin(t);
    rng->has_spare = 1;
    return r * cos(t);
}
