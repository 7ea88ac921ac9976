/* Entropy-coded lattice quantization helpers: global-step quantization to Z, D4, E8 or D8*, the
 * parity-aware empirical entropy of the resulting lattice coordinates, and the step search that hits a
 * target rate. Closest points come from lattice.h (Conway & Sloane); the rate model is the one a rANS
 * coder with per-coordinate tables achieves (see rate_bits below). */
#include "eclq.h"

#include "quant/lattice.h"

#include <math.h>
#include <stdlib.h>

size_t e8kv_eclq_block(e8kv_eclq_lattice lat) {
    switch (lat) {
    case E8KV_ECLQ_Z:
        return 1;
    case E8KV_ECLQ_D4:
        return 4;
    case E8KV_ECLQ_E8:
        return 8;
    case E8KV_ECLQ_D8STAR:
        return 8;
    }
    return 0;
}

const char *e8kv_eclq_name(e8kv_eclq_lattice lat) {
    switch (lat) {
    case E8KV_ECLQ_Z:
        return "z";
    case E8KV_ECLQ_D4:
        return "d4";
    case E8KV_ECLQ_E8:
        return "e8";
    case E8KV_ECLQ_D8STAR:
        return "d8star";
    }
    return "";
}

/* log2 of the volume of the fundamental cell per block, in the unscaled lattice (y = y2/2). */
static double log2_volume(e8kv_eclq_lattice lat) {
    switch (lat) {
    case E8KV_ECLQ_Z:
        return 0.0; /* Z: 1 */
    case E8KV_ECLQ_D4:
        return 1.0; /* D4: index 2 in Z^4 */
    case E8KV_ECLQ_E8:
        return 0.0; /* E8: unimodular */
    case E8KV_ECLQ_D8STAR:
        return -1.0; /* Z^8 ∪ (Z^8 + ½): twice the density of Z^8 */
    }
    return 0.0;
}

double e8kv_entropy_from_counts(const uint64_t *counts, size_t n_bins) {
    if (!counts) return 0.0;
    uint64_t total = 0;
    for (size_t i = 0; i < n_bins; i++)
        total += counts[i];
    if (total == 0) return 0.0;
    double h = 0.0;
    const double t = (double)total;
    for (size_t i = 0; i < n_bins; i++)
        if (counts[i]) h += (double)counts[i] * log2(t / (double)counts[i]);
    return h / t;
}

double e8kv_eclq_initial_step(e8kv_eclq_lattice lat, double variance, double bits_per_value) {
    const size_t b = e8kv_eclq_block(lat);
    if (!b || !(variance > 0.0) || !isfinite(variance) || !isfinite(bits_per_value)) return 0.0;
    const double two_pi_e = 2.0 * M_PI * exp(1.0);
    return sqrt(two_pi_e * variance) * exp2(-bits_per_value - log2_volume(lat) / (double)b);
}

static float round_half_away(float v) {
    return v >= 0.0f ? floorf(v + 0.5f) : -floorf(-v + 0.5f);
}

size_t e8kv_eclq_quantize(int32_t *y2, const float *x, size_t n, double step, e8kv_eclq_lattice lat) {
    const size_t b = e8kv_eclq_block(lat);
    if (!b || !y2 || !x || n == 0 || n % b || !(step > 0.0) || !isfinite(step)) return E8KV_ERR(BAD_ARGUMENT);
    if (!e8kv_all_finite(x, n)) return E8KV_ERR(NONFINITE);
    const double inv = 1.0 / step;
    /* keep 2·|y| + 2 (the farthest a closest point can be from 2·|x/step|) inside the estimator's range */
    const double max_abs = 0.5 * (double)E8KV_ECLQ_MAX_ABS_Y2 - 2.0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)x[i] * inv) > max_abs) return E8KV_ERR(RANGE);
    float s[8];
    for (size_t i = 0; i < n; i += b) {
        for (size_t j = 0; j < b; j++)
            s[j] = (float)((double)x[i + j] * inv);
        switch (lat) {
        case E8KV_ECLQ_Z:
            y2[i] = 2 * (int32_t)round_half_away(s[0]);
            break;
        case E8KV_ECLQ_D4:
            e8kv_d4_nearest(y2 + i, s);
            break;
        case E8KV_ECLQ_E8:
            e8kv_e8_nearest(y2 + i, s);
            break;
        case E8KV_ECLQ_D8STAR:
            e8kv_e8_relaxed_nearest(y2 + i, s);
            break;
        }
    }
    return n;
}

/* Histogram layout of the rate model, one histogram of (2·max_abs + 1) bins per context:
 *   Z       h[0]                      every value
 *   D4      h[j], j < 3               coordinate j of the block
 *           h[3 + p]                  coordinate 3 given p = parity of y0 + y1 + y2
 *   E8      h[j·2 + c], j < 7         coordinate j given the coset bit c
 *           h[14 + 2c + p]            coordinate 7 given c and p = parity of Σ_{j<7} floor(y2_j / 2)
 *   D8*     h[j·2 + c], j < 8         coordinate j given c (no parity rule, so nothing to save)
 * plus, for E8 and D8*, a 2-bin histogram of the coset bit.
 *
 * Why this is a coder's rate: a rANS/arithmetic coder that sends, per block, the coset bit with table
 * p(c), then y_j with the table p(y_j | c) for j < 7, then y_7 with the table p(y_7 | c, p) spends
 * −log2 of those probabilities per symbol; with the tables set to the empirical frequencies its total
 * length is exactly Σ_contexts Σ_y n_y·log2(N_context / n_y), i.e. H(c) + Σ_{j<7} H(y_j | c) +
 * H(y_7 | c, p) per block, up to the tables' side information and the coder's O(1) termination. The
 * decoder knows c and y_0..y_6 before y_7, hence p; and in E8 p fixes y_7's own parity (even coset:
 * Σ y even; odd coset: Σ y2 ≡ 0 mod 4, i.e. Σ floor(y2/2) even), so the table for y_7 only spreads
 * probability over half the values: about one bit per block saved against D8*, which has no parity rule.
 * The model ignores the remaining dependence between coordinates, so it is an upper bound on the joint
 * entropy H(y) and what a real per-coordinate coder reaches. */
static size_t n_contexts(e8kv_eclq_lattice lat) {
    switch (lat) {
    case E8KV_ECLQ_Z:
        return 1;
    case E8KV_ECLQ_D4:
        return 5;
    case E8KV_ECLQ_E8:
        return 18;
    case E8KV_ECLQ_D8STAR:
        return 16;
    }
    return 0;
}

/* floor(v / 2) for negative v too (arithmetic shift is implementation-defined for negatives in C11). */
static int32_t floor_half(int32_t v) {
    return v >= 0 ? v / 2 : -((1 - v) / 2);
}

static double rate_bits(const uint64_t *hist, size_t n_ctx, size_t n_bins) {
    double bits = 0.0;
    for (size_t h = 0; h < n_ctx; h++) {
        const uint64_t *c = hist + h * n_bins;
        uint64_t total = 0;
        for (size_t i = 0; i < n_bins; i++)
            total += c[i];
        if (!total) continue;
        bits += e8kv_entropy_from_counts(c, n_bins) * (double)total;
    }
    return bits;
}

size_t e8kv_eclq_entropy(double *bits_per_value, const int32_t *y2, size_t n, e8kv_eclq_lattice lat) {
    const size_t b = e8kv_eclq_block(lat);
    if (!b || !bits_per_value || !y2 || n == 0 || n % b) return E8KV_ERR(BAD_ARGUMENT);
    int32_t max_abs = 0;
    for (size_t i = 0; i < n; i++) {
        if (y2[i] > E8KV_ECLQ_MAX_ABS_Y2 || y2[i] < -E8KV_ECLQ_MAX_ABS_Y2) return E8KV_ERR(RANGE);
        const int32_t a = y2[i] < 0 ? -y2[i] : y2[i];
        if (a > max_abs) max_abs = a;
    }
    const size_t n_bins = 2 * (size_t)max_abs + 1, n_ctx = n_contexts(lat);
    uint64_t *hist = calloc(n_ctx * n_bins, sizeof *hist);
    if (!hist) return E8KV_ERR(OUT_OF_MEMORY);
    uint64_t coset[2] = {0, 0};
    size_t r = 0;
#define BIN(ctx, v) hist[(size_t)(ctx)*n_bins + (size_t)((v) + max_abs)]
    for (size_t i = 0; i < n && !r; i += b) {
        const int32_t *y = y2 + i;
        switch (lat) {
        case E8KV_ECLQ_Z:
            if (y[0] & 1)
                r = E8KV_ERR(CORRUPTED);
            else
                BIN(0, y[0])++;
            break;
        case E8KV_ECLQ_D4: {
            int32_t s = 0;
            for (int j = 0; j < 4; j++) {
                if (y[j] & 1) r = E8KV_ERR(CORRUPTED);
                s += y[j] / 2;
            }
            if (s & 1) r = E8KV_ERR(CORRUPTED);
            if (r) break;
            const int32_t p = (y[0] / 2 + y[1] / 2 + y[2] / 2) & 1;
            for (int j = 0; j < 3; j++)
                BIN(j, y[j])++;
            BIN(3 + p, y[3])++;
            break;
        }
        case E8KV_ECLQ_E8: {
            if (!e8kv_e8_contains(y)) {
                r = E8KV_ERR(CORRUPTED);
                break;
            }
            const int c = y[0] & 1;
            int32_t s = 0;
            for (int j = 0; j < 7; j++)
                s += floor_half(y[j]);
            const int p = s & 1;
            coset[c]++;
            for (int j = 0; j < 7; j++)
                BIN(j * 2 + c, y[j])++;
            BIN(14 + 2 * c + p, y[7])++;
            break;
        }
        case E8KV_ECLQ_D8STAR: {
            const int c = y[0] & 1;
            for (int j = 1; j < 8; j++)
                if ((y[j] & 1) != c) r = E8KV_ERR(CORRUPTED);
            if (r) break;
            coset[c]++;
            for (int j = 0; j < 8; j++)
                BIN(j * 2 + c, y[j])++;
            break;
        }
        }
    }
#undef BIN
    if (!r) {
        double bits = rate_bits(hist, n_ctx, n_bins);
        bits += e8kv_entropy_from_counts(coset, 2) * (double)(coset[0] + coset[1]);
        *bits_per_value = bits / (double)n;
    }
    free(hist);
    return r;
}

size_t e8kv_eclq_measure(e8kv_eclq_point *out, int32_t *scratch, const float *x, size_t n, double step,
                         e8kv_eclq_lattice lat) {
    if (!out || !scratch) return E8KV_ERR(BAD_ARGUMENT);
    E8KV_RETURN_IF_ERROR(e8kv_eclq_quantize(scratch, x, n, step, lat));
    double bits = 0.0;
    E8KV_RETURN_IF_ERROR(e8kv_eclq_entropy(&bits, scratch, n, lat));
    const double half = 0.5 * step;
    double se = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double e = (double)x[i] - half * (double)scratch[i];
        se += e * e;
    }
    out->step = step;
    out->bits_per_value = bits;
    out->mse = se / (double)n;
    return 0;
}

size_t e8kv_eclq_step_for_rate(e8kv_eclq_point *out, int32_t *scratch, const float *x, size_t n,
                               e8kv_eclq_lattice lat, double variance, double target_bits, double tol_bits) {
    if (!out || !(tol_bits > 0.0)) return E8KV_ERR(BAD_ARGUMENT);
    if (!(target_bits > 0.0) || target_bits > 16.0) return E8KV_ERR(RATE);
    const double step0 = e8kv_eclq_initial_step(lat, variance, target_bits);
    if (!(step0 > 0.0)) return E8KV_ERR(BAD_ARGUMENT);

    /* The rate falls as log2(step) grows (slope about −1 at high rate). Keep a bracket
     * [lo, hi] in log2(step) with rate(lo) ≥ target ≥ rate(hi), and shrink it. */
    e8kv_eclq_point p, best;
    double l = log2(step0);
    E8KV_RETURN_IF_ERROR(e8kv_eclq_measure(&p, scratch, x, n, exp2(l), lat));
    best = p;
    if (fabs(p.bits_per_value - target_bits) <= tol_bits) {
        *out = p;
        return 0;
    }
    double lo, hi, f_lo, f_hi; /* f = rate − target: f_lo ≥ 0 ≥ f_hi */
    const double dir = p.bits_per_value > target_bits ? 1.0 : -1.0; /* too many bits: larger step */
    double l_prev = l, f_prev = p.bits_per_value - target_bits;
    int expand = 0;
    for (;;) {
        const double f = f_prev;
        /* Newton step with the high-rate slope −1, at least 1/8 octave, to find the other side */
        const double move = fmax(fabs(f), 0.125) * (1.0 + expand);
        l = l_prev + dir * move;
        E8KV_RETURN_IF_ERROR(e8kv_eclq_measure(&p, scratch, x, n, exp2(l), lat));
        if (fabs(p.bits_per_value - target_bits) < fabs(best.bits_per_value - target_bits)) best = p;
        const double fn = p.bits_per_value - target_bits;
        if (fabs(fn) <= tol_bits) {
            *out = p;
            return 0;
        }
        if ((fn > 0.0) != (f > 0.0)) {
            if (dir > 0)
                lo = l_prev, f_lo = f, hi = l, f_hi = fn;
            else
                lo = l, f_lo = fn, hi = l_prev, f_hi = f;
            break;
        }
        l_prev = l;
        f_prev = fn;
        if (++expand > 60) { /* rate never crosses the target */
            *out = best;
            return E8KV_ERR(RATE);
        }
    }
    for (int it = 0; it < 100; it++) {
        /* secant inside the bracket; every third step (or when the secant hugs an end) bisect */
        double m = 0.5 * (lo + hi);
        if (it % 3 != 2 && f_lo != f_hi) {
            const double s = lo + f_lo * (hi - lo) / (f_lo - f_hi);
            if (s > lo + 0.05 * (hi - lo) && s < hi - 0.05 * (hi - lo)) m = s;
        }
        E8KV_RETURN_IF_ERROR(e8kv_eclq_measure(&p, scratch, x, n, exp2(m), lat));
        if (fabs(p.bits_per_value - target_bits) < fabs(best.bits_per_value - target_bits)) best = p;
        const double fm = p.bits_per_value - target_bits;
        if (fabs(fm) <= tol_bits) {
            *out = p;
            return 0;
        }
        if (fm > 0.0)
            lo = m, f_lo = fm;
        else
            hi = m, f_hi = fm;
        if (hi - lo < 1e-12) break;
    }
    *out = best; /* the rate jumps across the target (few samples): closest point, reported as RATE */
    return E8KV_ERR(RATE);
}
