/* e8v: E8 lattice points entropy-coded inside a fixed number of bytes per vector.
 *
 * A fixed-rate code is needed for random access by token, but fixed-rate lattice codebooks pay for their
 * shape: e8:4 sits at 2.7x the Shannon bound on real K/V where an entropy-coded E8 sits at 1.08x
 * (BENCHMARKS.md). e8v keeps the fixed size and codes inside it: per vector a step δ is chosen so that
 * the E8 point of y/δ, coded with prefix codes matched to each coordinate's expected spread, just fits the
 * budget. Over 64 values the code length fluctuates little (~±10 bits), so a per-vector budget costs only
 * ~0.1 dB against a freely variable rate, while the 64-dimensional "typical set" it carves out of the
 * lattice is far better shaped than an 8-dimensional ball. With per-coordinate spreads σ_i (a calibrated
 * eigenbasis, transform/klt.h), one step for all coordinates is reverse water-filling: large components
 * get more bits, components far below the step none.
 *
 * Vector layout (doc/format.md §2.3), exactly e8kv_vlc.vector_bytes bytes, bits MSB first:
 *   10 bits s  the step δ = 2^((s − 512)/32) (s = 0: the zero vector, nothing follows)
 *   per block of 8 coordinates that is coded (some class ≥ E8KV_VLC_CLASS_DROP, see below), the E8 point
 *   p of y/δ (doubled coordinates p2 = 2p), in one of two codes chosen by the block's mean class:
 *     shell code (mean class ≤ 9, coarse blocks): a prefix code of the shell n (|p|² = 2n, n = 0..5) or
 *          an escape, then the point's rank within its shell in the e8ball codebook order (truncated
 *          binary: the shell's points are equally likely for an isotropic source); after an escape,
 *          the coordinate code
 *     coordinate code: 1 bit, the E8 coset (0: D8, 1: D8 + ½); coordinates 0..6: the magnitude (prefix
 *          code of the coordinate's class, escape + Exp-Golomb beyond the table), then a sign bit unless
 *          it is implied (p2 = 0); coordinate 7: its residue mod 4 is fixed by Σ p2 ≡ 0 (mod 4), so only
 *          the magnitude within that residue class is coded (half the alphabet), with a sign bit where
 *          both signs remain
 *   zero bits up to the end of the budget.
 * The encoder takes the smallest δ (finest step) whose code fits the budget.
 * Coordinate i's code is chosen by its class c_i = C + floor((q_i + 2)/4), q_i = round(8·log2(σ_i²/σ̄²))
 * (σ normalized to mean σ² = 1) and C the finest class at which the expected length fits the budget:
 * class c is matched to a coordinate of spread 2^((c − 8)/4) lattice units. Codes exist for classes 0..24;
 * above, the magnitude's low m = ceil((c − 24)/4) bits are sent raw and the rest with the code of class
 * c − 4m. A block whose classes are all below E8KV_VLC_CLASS_DROP is not coded and decodes to 0. The
 * prefix codes are fixed: built once from seeded samples of Gaussian blocks (e8_vlc.c), pinned by the
 * SHA-256 tests. */
#ifndef E8KV_E8_VLC_H
#define E8KV_E8_VLC_H

#include "codec.h"

#define E8KV_VLC_CLASS_DROP 2
#define E8KV_VLC_CLASS_MAX 40
#define E8KV_VLC_STEP_BITS 10

typedef struct {
    size_t head_dim, vector_bytes;
    uint8_t *cls;   /* (head_dim) the class of each coordinate's code */
    uint8_t *coded; /* (head_dim / 8) 1: the block is coded (in cls's allocation) */
    int c_unit;     /* the class of a coordinate of mean variance */
    size_t n_coded; /* coordinates in coded blocks */
    void (*nearest)(int32_t y2[8], const int32_t X[8]); /* E8 closest point (ref or bit-identical AVX2) */
} e8kv_vlc;

/* var: the expected variances of the coordinates (any positive scale; NULL = all equal). Errors: HEAD_DIM
 * (not a multiple of 8), BAD_ARGUMENT (negative or non-finite variance), RATE (vector_bytes too small to
 * code any block). */
size_t e8kv_vlc_init(e8kv_vlc *v, size_t head_dim, size_t vector_bytes, const float *var);
/* Frees what init allocated (head_dim·9/8 bytes); a zeroed or failed-init e8kv_vlc is fine. */
void e8kv_vlc_free(e8kv_vlc *v);
/* Encode one finite vector into exactly v->vector_bytes bytes. Returns 0 or E8KV_ERROR_RANGE (a vector
 * too large for the coarsest step: never at an RMS up to 2^13; init makes the all-zero code fit the
 * budget, so smaller vectors always have a code, if only that one). */
size_t e8kv_vlc_encode(const e8kv_vlc *v, uint8_t *restrict dst, const float *restrict y);
/* Decode one vector. Pure function of the bytes: any bytes decode to some finite vector. */
void e8kv_vlc_decode(const e8kv_vlc *v, float *restrict y, const uint8_t *restrict src);
/* Bits of y's code at step index s (header included; y finite, |y/δ(s)| below the fixed-point range):
 * what the encoder compares with the budget (tests check that the chosen step is the finest that fits). */
size_t e8kv_vlc_code_bits(const e8kv_vlc *v, const float *y, int s);
/* The step index s of an encoded vector (its first 10 bits). */
int e8kv_vlc_step_index(const uint8_t *src);

/* Codec glue ("e8v:B": the rotation, then e8v with equal variances, 2 + B·head_dim/8 bytes). */
size_t e8kv_quant_init_e8v(e8kv_codec_t *codec, const e8kv_spec *spec);
/* "e8v:B" with the variances var (head_dim) and no rotation (e8kv_codec_create_var): the code of a calibrated
 * stream's eigenbasis coordinates (cache spec "e8tv:B"). */
size_t e8kv_quant_init_e8v_var(e8kv_codec_t *codec, const e8kv_spec *spec, const float *var);

#endif
