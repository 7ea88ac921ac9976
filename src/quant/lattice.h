/* Closest-point routines for the lattices e8kv quantizes with (Conway & Sloane, "Fast quantizing and
 * decoding algorithms for lattice quantizers and codes", IEEE T-IT 1982; SPLAG ch. 20).
 *
 *   Z^n   round each coordinate
 *   D_n   integer vectors with even sum: round; if the sum is odd, re-round the coordinate with the
 *         LARGEST rounding error the other way                                           (d4.c)
 *   E8    D8 ∪ (D8 + ½): the closer of the two coset candidates                         (e8.c)
 *   D8*   Z^8 ∪ (Z^8 + ½) ("relaxed parity" E8: no even-sum rule): the closer of the two (e8_relaxed.c)
 *
 * Outputs are in doubled coordinates (2·y, integers) so that half-integer points are exact and codes can
 * be compared bit for bit. Rounding is round-half-away-from-zero everywhere, so the result is a pure
 * function of the input bits. When two coset candidates are at exactly equal distance, the integer coset
 * wins; within D_n, ties between coordinates of equal rounding error go to the lowest index.
 * Inputs must be finite with |x_i| < 2^22 (so that x - ½ and the doubled coordinates are exact). */
#ifndef E8KV_LATTICE_H
#define E8KV_LATTICE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Round half away from zero (the tie rule of every routine here). */
static inline float e8kv_round_half_away(float v) {
    return v >= 0.0f ? floorf(v + 0.5f) : -floorf(-v + 0.5f);
}

/* Closest point of D_n (n <= 16) to x; y2 = 2·y. Returns the squared distance. */
float e8kv_dn_nearest(int32_t *y2, const float *x, size_t n);
/* Closest point of D4. Returns squared distance. */
float e8kv_d4_nearest(int32_t y2[4], const float x[4]);
/* Closest point of E8 to x; y2 = 2·y (all even or all odd, sum ≡ 0 mod 4). Returns squared distance. */
float e8kv_e8_nearest(int32_t y2[8], const float x[8]);
/* Closest point of D8* = Z^8 ∪ (Z^8 + ½). Returns squared distance. */
float e8kv_e8_relaxed_nearest(int32_t y2[8], const float x[8]);

/* 1 when y2 (doubled coordinates) is a point of E8. */
int e8kv_e8_contains(const int32_t y2[8]);
/* 1 when y2 (doubled coordinates) is a point of D_n (all even, sum of y ≡ 0 mod 2). */
int e8kv_dn_contains(const int32_t *y2, size_t n);
/* 1 when y2 (doubled coordinates) is a point of D8* (all even or all odd). */
int e8kv_e8_relaxed_contains(const int32_t y2[8]);

#endif
