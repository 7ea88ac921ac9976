/* Entropy-coded lattice quantization (ECLQ) helpers: quantize with a global step, measure the ideal
 * (empirical-entropy) rate a parity-aware coder would reach, and choose the step that hits a target rate.
 *
 * No coder lives here: the rate reported is the plug-in empirical entropy of the lattice coordinates,
 * i.e. the code length of an ideal arithmetic/rANS coder using per-coordinate frequency tables fitted to
 * the data (table side information not counted). The global step is one float for the whole data set and
 * is counted as negligible side information.
 *
 * Lattices, all in doubled coordinates (y2 = 2·y, see lattice.h), scaled by the step δ: x ≈ δ·y2/2.
 *   Z      (block 1)  uniform scalar quantizer (ECSQ)
 *   D4     (block 4)  integer points with even sum
 *   E8     (block 8)  D8 ∪ (D8 + ½), the unimodular lattice (volume 1)
 *   D8*    (block 8)  Z^8 ∪ (Z^8 + ½), "relaxed parity" E8 (volume ½: twice E8's density)
 *
 * High-rate theory (Gaussian source, variance σ², rate R bits/value): a lattice of volume V per n
 * dimensions scaled by δ has cells of volume δ^n·V, so R ≈ h(X) − log2(δ·V^(1/n)) with
 * h(X) = ½·log2(2πeσ²), giving δ = sqrt(2πeσ²)·2^(−R) / V^(1/n). That is the starting point of the
 * step search; bisection on the measured entropy does the rest.
 *
 * It lives in bench/, not in the library: only `e8kv bench codec` (bench_codec.c) and its test use it;
 * no format of the library does. */
#ifndef E8KV_ECLQ_H
#define E8KV_ECLQ_H

#include "common/common.h"

typedef enum {
    E8KV_ECLQ_Z = 0,
    E8KV_ECLQ_D4 = 1,
    E8KV_ECLQ_E8 = 2,
    E8KV_ECLQ_D8STAR = 3,
} e8kv_eclq_lattice;

/* Largest |y2| the entropy estimator accepts (keeps its histograms small); larger is E8KV_ERROR_RANGE. */
#define E8KV_ECLQ_MAX_ABS_Y2 (1 << 20)

typedef struct {
    double step;           /* δ */
    double bits_per_value; /* parity-aware empirical entropy per value */
    double mse;            /* mean over values of (x − δ·y2/2)² */
} e8kv_eclq_point;

/* Block dimension of the lattice (1, 4 or 8); 0 for an unknown lattice. */
size_t e8kv_eclq_block(e8kv_eclq_lattice lat);
/* Short name: "z", "d4", "e8", "d8star"; "" for an unknown lattice. */
const char *e8kv_eclq_name(e8kv_eclq_lattice lat);

/* Entropy in bits of the distribution given by n_bins counts (0·log 0 = 0). 0 when all counts are 0. */
double e8kv_entropy_from_counts(const uint64_t *counts, size_t n_bins);

/* High-rate initial step δ = sqrt(2πe·variance)·2^(−bits) / V^(1/n). Returns 0 on bad arguments. */
double e8kv_eclq_initial_step(e8kv_eclq_lattice lat, double variance, double bits_per_value);

/* y2[i] = doubled coordinates of the closest lattice point to x/step, n values (n a multiple of the
 * block). Returns n, or BAD_ARGUMENT (NULL, n not a multiple, step not finite and > 0),
 * NONFINITE (NaN/Inf in x), RANGE (|x/step| too large for E8KV_ECLQ_MAX_ABS_Y2). */
size_t e8kv_eclq_quantize(int32_t *y2, const float *x, size_t n, double step, e8kv_eclq_lattice lat);

/* Parity-aware empirical entropy per value of n lattice coordinates (doubled, as from _quantize),
 * stored in *bits_per_value. Returns 0 or an error (BAD_ARGUMENT, RANGE, OUT_OF_MEMORY, CORRUPTED when
 * a block is not a point of the lattice). */
size_t e8kv_eclq_entropy(double *bits_per_value, const int32_t *y2, size_t n, e8kv_eclq_lattice lat);

/* Quantize with `step` and measure MSE and rate. scratch: n int32 (receives y2). Returns 0 or an error. */
size_t e8kv_eclq_measure(e8kv_eclq_point *out, int32_t *scratch, const float *x, size_t n, double step,
                         e8kv_eclq_lattice lat);

/* Find the step whose measured rate is within `tol_bits` of `target_bits` (0 < target ≤ 16), starting
 * from the high-rate guess for `variance`, by a safeguarded secant/bisection search on log2(step).
 * scratch: n int32. Returns 0, or RATE for a target out of range (out untouched) or not reachable within
 * tol_bits (the empirical rate is a step function of the step: with few samples it can jump across the
 * target; out then holds the closest point found), or another error. */
size_t e8kv_eclq_step_for_rate(e8kv_eclq_point *out, int32_t *scratch, const float *x, size_t n,
                               e8kv_eclq_lattice lat, double variance, double target_bits, double tol_bits);

#endif
