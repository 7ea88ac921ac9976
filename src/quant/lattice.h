/* Closest-point routines for the lattices e8kv quantizes with (Conway & Sloane, "Fast quantizing and
 * decoding algorithms for lattice quantizers and codes", IEEE T-IT 1982; SPLAG ch. 20).
 *
 *   Z^n   round each coordinate
 *   D_n   integer vectors with even sum: round; if the sum is odd, re-round the coordinate with the
 *         LARGEST rounding error the other way
 *   E8    D8 ∪ (D8 + ½): the closer of the two coset candidates
 *   D8*   Z^8 ∪ (Z^8 + ½) ("relaxed parity" E8: no even-sum rule): the closer of the two
 *
 * Outputs are in doubled coordinates (2·y, integers) so that half-integer points are exact and codes can
 * be compared bit for bit. Rounding is
 * round-half-away-from-zero everywhere, so the result is a pure function of the input bits.
 * When two candidates are at exactly equal distance, the integer coset (D8) wins. */
#ifndef E8KV_LATTICE_H
#define E8KV_LATTICE_H

#include <stddef.h>
#include <stdint.h>

/* Closest point of D_n (n <= 16) to x; y2 = 2·y. Returns the squared distance. */
float e8kv_dn_nearest(int32_t *y2, const float *x, size_t n);
/* Closest point of E8 to x; y2 = 2·y (all even or all odd, sum ≡ 0 mod 4). Returns squared distance. */
float e8kv_e8_nearest(int32_t y2[8], const float x[8]);
/* Closest point of D8* = Z^8 ∪ (Z^8 + ½). Returns squared distance. */
float e8kv_e8_relaxed_nearest(int32_t y2[8], const float x[8]);
/* Closest point of D4. Returns squared distance. */
float e8kv_d4_nearest(int32_t y2[4], const float x[4]);

/* 1 when y2 (doubled coordinates) is a point of E8. */
int e8kv_e8_contains(const int32_t y2[8]);

#endif
