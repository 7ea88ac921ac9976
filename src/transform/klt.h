/* Karhunen–Loève transform (KLT): the eigenbasis of a covariance matrix, and applying it to head vectors.
 *
 * Transform coding (Huang & Schultheiss 1963; Gersho & Gray, "Vector Quantization and Signal
 * Compression", ch. 8): in the eigenbasis of the source covariance the coordinates are uncorrelated and
 * their variances are the eigenvalues, so giving more bits to the large ones (reverse water-filling) saves
 * the ratio (arithmetic mean / geometric mean) of the eigenvalues in MSE over any basis that spreads the
 * energy evenly, such as a Hadamard rotation. LLM keys are strongly correlated across channels: on
 * SmolLM2-135M this ratio is 4–18 dB for keys and ~2.5 dB for values.
 *
 * A basis is stored row-major as P (d×d): row i is the unit eigenvector of the i-th largest eigenvalue,
 * so y = P·x (forward: every y_i a contiguous dot product) and x = Pᵀ·y (inverse: a sum of rows scaled by
 * y_i; only the first n_used rows are read, the rest of y being 0). */
#ifndef E8KV_KLT_H
#define E8KV_KLT_H

#include "common/common.h"

/* Eigen-decomposition of the symmetric n×n matrix a (row-major, double; overwritten) by cyclic Jacobi
 * rotations (Golub & Van Loan, "Matrix Computations", 4th ed., §8.5.2): w the eigenvalues in decreasing
 * order, v (n×n, row-major) row i the unit eigenvector of w[i], its sign fixed so that its largest
 * |component| (the first on ties) is positive. Returns 0, or E8KV_ERROR_GENERIC when 100 sweeps did not
 * bring the off-diagonal norm below 1e-14 of the matrix norm (does not happen for finite input). */
size_t e8kv_sym_eigen(double *a, size_t n, double *w, double *v);

/* y = P·x for n_vec vectors of d floats, in place (d ≤ E8KV_MAX_HEAD_DIM). */
void e8kv_klt_forward_ref(const float *restrict P, size_t d, float *x, size_t n_vec);
/* x = Pᵀ·y using the first n_used coordinates of every y (the others must be 0), in place. */
void e8kv_klt_inverse_ref(const float *restrict P, size_t d, size_t n_used, float *x, size_t n_vec);
/* AVX2/FMA twins (d % 8 == 0): the same sums in another order (tested within a relative tolerance). */
void e8kv_klt_forward_avx2(const float *restrict P, size_t d, float *x, size_t n_vec);
void e8kv_klt_inverse_avx2(const float *restrict P, size_t d, size_t n_used, float *x, size_t n_vec);

#endif
