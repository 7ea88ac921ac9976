/* Integer (fixed-point) lattice helpers shared by the fixed-rate E8 codes (e8_ball.c, nested.c) and
 * their AVX2 twins.
 *
 * Why fixed point: a code must be a pure function of the input bits on every platform and at every -O
 * level, with or without FMA contraction. The encoders therefore turn the scaled input t = x / s into
 * integers X = round_half_even(t · 2^E8KV_FX_BITS) with ONE correctly rounded float multiply, and every
 * decision after that (closest point, ties, distances, overload handling) is integer arithmetic.
 *
 * Lattices (Conway & Sloane, SPLAG ch. 4 and 20):
 *   D_n  integer vectors with even sum; closest point: round every coordinate (ties toward +inf); if
 *        the sum is odd, move the coordinate with the LARGEST rounding error (first one on equal
 *        errors) to the integer on the other side of x (up when x sits exactly on the integer).
 *   E8   D8 ∪ (D8 + ½), in doubled coordinates y2 = 2y; the closer coset wins, D8 on equal distance.
 *
 * Voronoi (nested lattice) codes (Conway & Sloane, "A fast encoding method for lattice codes and
 * quantizers", IEEE T-IT 1983): the coset of a point y of Λ modulo mΛ (m = 2^log2_m) is named by the
 * digits u = G^{-1} y mod m in the generator basis G below; the canonical representative of a coset is
 * r − m·Q_Λ(r / m) with r = G·u, i.e. the coset point in the Voronoi cell of mΛ at the origin, ties
 * broken by the closest-point rule above (identically on both sides).
 *
 * E8 generator (rows, ordinary coordinates; SPLAG ch. 4 eq. (99)), det 1:
 *   g0 = (2,0,0,0,0,0,0,0), g_i = e_i − e_{i−1} (i = 1..6), g7 = (½,½,½,½,½,½,½,½)
 * D4 generator (rows), det 2:
 *   g0 = (2,0,0,0), g_i = e_i − e_{i−1} (i = 1..3)
 * Digits are packed little-endian: digit i occupies bits [i·log2_m, (i+1)·log2_m). */
#ifndef E8KV_VORONOI_H
#define E8KV_VORONOI_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"

#define E8KV_FX_BITS 13
#define E8KV_FX_ONE (1 << E8KV_FX_BITS)
#define E8KV_FX_HALF (1 << (E8KV_FX_BITS - 1))
/* inputs are clamped to ±2^24 fixed-point units (±2048 lattice units) so nothing overflows */
#define E8KV_FX_LIMIT 16777216.0f

/* v is t · 2^E8KV_FX_BITS (already multiplied); round half to even (the default rounding mode, the
 * same as _mm256_cvtps_epi32) after clamping. */
static inline int32_t e8kv_fx_round(float v) {
    if (!(v < E8KV_FX_LIMIT)) v = E8KV_FX_LIMIT; /* NaN never reaches here: inputs are screened */
    if (v < -E8KV_FX_LIMIT) v = -E8KV_FX_LIMIT;
    return (int32_t)lrintf(v);
}

/* Closest point of D_n (n = 4 or 8) to X / 2^FX, integer coordinates. */
void e8kv_dn_nearest_fx(int32_t *y, const int32_t *X, size_t n);
/* Closest point of E8 to X / 2^FX in doubled coordinates y2 = 2y. */
void e8kv_e8_nearest_fx(int32_t y2[8], const int32_t X[8]);
/* Closest point of D4 to X / 2^FX (integer coordinates). */
void e8kv_d4_nearest_fx(int32_t y[4], const int32_t X[4]);

/* Digits of the coset y + mE8 (y2 doubled, a point of E8), packed; log2_m in 1..4. */
uint32_t e8kv_e8_digits(const int32_t y2[8], unsigned log2_m);
/* The canonical representative (doubled coordinates) of the coset named by `digits`. */
void e8kv_e8_coset_rep(int32_t r2[8], uint32_t digits, unsigned log2_m);
/* The same with a given closest-point kernel (the scalar one or its bit-exact AVX2 twin). */
void e8kv_e8_coset_rep_with(int32_t r2[8], uint32_t digits, unsigned log2_m,
                            void (*nearest)(int32_t y2[8], const int32_t X[8]));
/* D4 versions (plain integer coordinates). */
uint32_t e8kv_d4_digits(const int32_t y[4], unsigned log2_m);
void e8kv_d4_coset_rep(int32_t r[4], uint32_t digits, unsigned log2_m);

/* Σ x_i² in double. Each product of two floats is exact in double, so the result does not depend on
 * FMA contraction; the summation order is fixed (8 lane sums, lane = i mod 8, combined pairwise). */
double e8kv_sumsq_f32(const float *x, size_t n);

/* ---- the ball codebook of e8ball (e8_ball.c) ----
 * The 65536 points of E8 of smallest norm: all 56881 points of norm ≤ 10 and the first 8655 points of
 * the norm-12 shell, ordered by (norm, h(key), key) where key packs the doubled coordinates as nibbles
 * (y2_i + 8) << 4i and h(key) = (key · 0x9E3779B1) mod 2^32. The index of a point is its rank. */
#define E8KV_BALL_SIZE 65536
#define E8KV_BALL_MAX_NORM2 48 /* Σ y2_i² of the outermost shell (norm 12) */

/* The table (65536 × 8 doubled coordinates, int8); built once, thread-safe. */
const int8_t *e8kv_ball_table(void);
/* Index of the E8 point c2 (doubled) in the ball, or -1 when it is not a codeword. */
int32_t e8kv_ball_index(const int32_t c2[8]);
/* e8kv_ball_index in two halves so look-ups of several blocks overlap: prepare screens c2 (range and
 * norm), finds its position in the index map and prefetches it (-1: not a codeword); lookup reads it. */
int64_t e8kv_ball_prepare(const int32_t c2[8]);
int32_t e8kv_ball_lookup(int64_t prep);
/* Canonical residual table of the m = 2^log2_m Voronoi stage (log2_m 1 or 2): 2^(8·log2_m) × 8 int8. */
const int8_t *e8kv_ball_residual_table(unsigned log2_m);

/* The ball encoder's kernels (the _ref and _avx2 sets give bit-identical results). */
typedef struct {
    void (*nearest)(int32_t y2[8], const int32_t X[8]);
    int (*descent_step)(int32_t best[8], const int32_t X[8]);
} e8kv_ball_kernels;
extern const e8kv_ball_kernels e8kv_ball_kernels_ref;
extern const e8kv_ball_kernels e8kv_ball_kernels_avx2;

/* Nearest ball codeword to X / 2^FX (coarse units), y2 = Q(X) already computed: returns its index and
 * writes its doubled coordinates. Exact when y2 is a codeword. Otherwise (overload) the radial shrink
 * e8kv_ball_shrink then up to E8KV_BALL_DESCENT_STEPS descent steps, each moving to the codeword
 * neighbour best + v (v one of the 240 minimal vectors) with the largest e·v (e = X − H·best scaled by
 * e8kv_ball_descent_setup; first v on equal values) when that reduces the distance. */
#define E8KV_BALL_DESCENT_STEPS 1
uint32_t e8kv_ball_encode_block_k(const e8kv_ball_kernels *kern, int32_t c2[8], const int32_t X[8],
                                  const int32_t y2[8]);
/* The same with idx = e8kv_ball_index(y2) already known. */
uint32_t e8kv_ball_encode_block_idx(const e8kv_ball_kernels *kern, int32_t c2[8], const int32_t X[8],
                                    const int32_t y2[8], int32_t idx);
/* The same with the reference kernels (tests). */
/* Store one e8ball:3/4 block: the 16-bit ball index, then the residual digits (8 bits at m = 2,
 * 16 at m = 4), little-endian (doc/format.md 2.2). */
static inline void e8kv_ball_store_block(uint8_t *p, uint32_t packed, unsigned log2_m) {
    e8kv_store_le16(p, (uint16_t)packed);
    if (log2_m == 1)
        p[2] = (uint8_t)(packed >> 16);
    else
        e8kv_store_le16(p + 2, (uint16_t)(packed >> 16));
}
uint32_t e8kv_ball_encode_block(int32_t c2[8], const int32_t X[8]);
int32_t e8kv_ball_shrink(const e8kv_ball_kernels *kern, int32_t best[8], const int32_t X[8]);
int e8kv_ball_descent_setup(int32_t e[8], int32_t *cn, const int32_t best[8], const int32_t X[8]);
int e8kv_ball_descent_step_ref(int32_t best[8], const int32_t X[8]);
int e8kv_ball_descent_step_avx2(int32_t best[8], const int32_t X[8]);
/* The 240 minimal vectors of E8 (doubled; vector k = ball entry k+1) as [pair j][k] int32 words holding
 * coordinates 2j (low 16 bits) and 2j+1 (high 16 bits). */
const int32_t *e8kv_ball_minvec_pairs(void);
/* Overload path of e8ball:3/4: X coarse units, returns packed (ball index | residual digits << 16). */
uint32_t e8kv_ball_residual_overload(const e8kv_ball_kernels *kern, const int32_t X[8], unsigned log2_m);

/* Per-vector scale of e8ball: fp16 bits of β(B)·||x||/sqrt(d); E8KV_ERROR_RANGE when not finite in
 * fp16. */
size_t e8kv_ball_scale(uint16_t *h, const float *x, size_t d, int bits);

/* Twins (whole-vector, through the codec's state). */
size_t e8kv_e8ball_encode_ref(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x);
void e8kv_e8ball_decode_ref(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src);
size_t e8kv_e8ball_encode_avx2(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x);
void e8kv_e8ball_decode_avx2(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src);
/* The AVX2 decode of n vectors vector_bytes apart (a page run of the cache's fused reader, and the codec's
 * decode with n = 1): bit-identical to e8kv_e8ball_decode_ref. */
void e8kv_e8ball_decode_rows_avx2(float *restrict dst, const uint8_t *restrict src, size_t n, size_t d, int bits,
                                  size_t vector_bytes);

/* e8nest / d4nest twins (nested.c): the AVX2 encoder swaps in the vector E8 closest point. */
size_t e8kv_nest_encode_ref(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x);
size_t e8kv_nest_encode_avx2(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x);
void e8kv_nest_decode_ref(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src);
void e8kv_nest_decode_avx2(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src);

/* AVX2 twin of e8kv_e8_nearest_fx (bit-exact), for tests. */
void e8kv_e8_nearest_fx_avx2(int32_t y2[8], const int32_t X[8]);
/* AVX2 twin of e8kv_e8_digits (bit-exact), for tests. */
uint32_t e8kv_e8_digits_avx2(const int32_t y2[8], unsigned log2_m);

#endif
