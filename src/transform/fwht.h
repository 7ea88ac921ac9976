/* Seeded random-sign Sylvester–Hadamard rotation of a head vector, and its exact inverse.
 *
 * For head_dim a power of two: y = H·D·x / sqrt(head_dim), with D = diag(random ±1 from the seed) and H
 * the Sylvester–Hadamard matrix, computed by the fast Walsh–Hadamard transform in O(d log d). The map is
 * orthonormal, so its inverse is x = D·H·y / sqrt(head_dim) and norms and inner products are preserved.
 *
 * For head_dim a multiple of 8 that is not a power of two the vector is split greedily into power-of-two
 * blocks from the largest down (96 = 64 + 32, 80 = 64 + 16, 72 = 64 + 8) and each block is rotated on its
 * own with its own slice of the signs. Any other head_dim is E8KV_ERROR_HEAD_DIM. */
#ifndef E8KV_FWHT_H
#define E8KV_FWHT_H

#include "common/common.h"

#define E8KV_ROT_MAX_BLOCKS 8

typedef struct {
    size_t head_dim;
    size_t n_block;
    size_t block_len[E8KV_ROT_MAX_BLOCKS]; /* powers of two summing to head_dim */
    float signs[E8KV_MAX_HEAD_DIM];         /* ±1 */
} e8kv_rot;

/* head_dim must be a positive multiple of 8 and at most E8KV_MAX_HEAD_DIM. */
size_t e8kv_rot_init(e8kv_rot *rot, size_t head_dim, uint64_t seed);
/* In place, n_vec vectors of head_dim floats. */
void e8kv_rot_forward(const e8kv_rot *rot, float *x, size_t n_vec);
void e8kv_rot_inverse(const e8kv_rot *rot, float *x, size_t n_vec);

/* Unnormalized in-place Walsh–Hadamard transform of n = 2^k floats (reference and AVX2 twins). */
void e8kv_fwht_ref(float *x, size_t n);
void e8kv_fwht_avx2(float *x, size_t n);
/* e8kv_rot_inverse's AVX2 body (its blocks are multiples of 8), bit-exact with the portable loop: scale =
 * the block's 1/sqrt(n) times the sign, per coordinate. Called by e8kv_rot_inverse when the CPU has AVX2. */
void e8kv_rot_inverse_avx2(const e8kv_rot *rot, float *x, size_t n_vec, const float *scale);

#endif
