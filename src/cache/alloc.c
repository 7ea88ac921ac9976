/* Bit allocation over the streams of a cache (cache spec item auto=FAMILY:B).
 *
 * Model: stream s (one layer's K or V) coded alone at r bits per value adds c_s · 4^(−r) nats per token of
 * KL divergence (distortion falls 6 dB per bit; for small distortions the logits' KLD is proportional
 * to it, and the contributions of different streams add). Minimising Σ_s c_s · 4^(−r_s) at a fixed mean
 * rate is reverse water-filling: every stream above the bounds gets r_s = r̄ + ½·log2(c_s / geomean(c)).
 * On the grid of rates a codec offers (steps of 1/8 bit or coarser) the greedy rule is exact for this
 * separable convex objective: start every stream at the lowest rate and give the next step to the stream
 * whose distortion falls most, until the budget is spent (Fox 1966, "Discrete optimization via marginal
 * analysis"). The coefficients c_s come from the calibration (e8kv_calib_sensitivity). */
#include "kvcache.h"

#include <math.h>
#include <stdlib.h>

size_t e8kv_alloc_rates(int *rate8, const double *c, size_t n, int mean8, int lo8, int hi8, int step8) {
    if (!rate8 || !c || n == 0 || step8 <= 0 || lo8 <= 0 || lo8 > mean8 || mean8 > hi8 || lo8 % step8 ||
        hi8 % step8)
        return E8KV_ERR(BAD_ARGUMENT);
    for (size_t s = 0; s < n; s++) {
        if (!(c[s] >= 0.0) || !isfinite(c[s])) return E8KV_ERR(BAD_ARGUMENT);
        rate8[s] = lo8;
    }
    /* the budget in grid steps: the mean rate rounded down to the grid */
    size_t steps = n * (size_t)(mean8 - lo8) / (size_t)step8;
    const double shrink = 1.0 - pow(4.0, -(double)step8 / 8.0); /* fraction of c·4^(−r) one step removes */
    for (; steps > 0; steps--) {
        size_t best = SIZE_MAX;
        double best_gain = -1.0;
        for (size_t s = 0; s < n; s++) {
            if (rate8[s] + step8 > hi8) continue;
            const double gain = c[s] * pow(4.0, -(double)rate8[s] / 8.0) * shrink;
            if (gain > best_gain) { /* first stream on ties: deterministic */
                best_gain = gain;
                best = s;
            }
        }
        if (best == SIZE_MAX) break; /* every stream at the top (mean8 ≤ hi8 makes this unreachable) */
        rate8[best] += step8;
    }
    return 0;
}

/* The grid of auto= (expand_auto in kvcache.c): steps of 64/gcd(64, d) eighths of a bit (whole bytes per
 * vector), every stream in [1.5, 8] bits; test_calib pins the two together. */
size_t e8kv_calib_auto_rates(const e8kv_calib *cal, double mean_bits, double *rates) {
    size_t n_layer = 0, d = 0;
    if (!cal || !rates || e8kv_is_error(e8kv_calib_info(cal, &n_layer, NULL, &d, NULL)) ||
        e8kv_calib_sensitivity(cal, 0, 0) < 0.0 || !(mean_bits > 0.0) || mean_bits > 8.0)
        return E8KV_ERR(BAD_ARGUMENT);
    size_t g = 64, b = d;
    while (b) {
        const size_t t = g % b;
        g = b;
        b = t;
    }
    const int step8 = (int)(64 / g), lo8 = (12 + step8 - 1) / step8 * step8,
              mean8 = (int)lround(mean_bits * 8.0);
    if (fabs(mean_bits * 8.0 - mean8) > 1e-9 || mean8 % step8 || mean8 < lo8) return E8KV_ERR(RATE);
    const size_t n = 2 * n_layer;
    double *c = malloc(n * sizeof *c);
    int *r8 = malloc(n * sizeof *r8);
    size_t r = c && r8 ? 0 : E8KV_ERR(OUT_OF_MEMORY);
    for (size_t s = 0; s < n && !r; s++)
        c[s] = e8kv_calib_sensitivity(cal, s % n_layer, s >= n_layer);
    if (!r) r = e8kv_alloc_rates(r8, c, n, mean8, lo8, 64, step8);
    for (size_t s = 0; s < n && !e8kv_is_error(r); s++)
        rates[s] = r8[s] / 8.0;
    free(c);
    free(r8);
    return e8kv_is_error(r) ? r : 0;
}
