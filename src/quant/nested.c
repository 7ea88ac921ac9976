/* e8nest:B[:q=R] and d4nest:B[:q=R]: nested-lattice (Voronoi) codes with a per-vector scale and clamp
 * (the KakeyaLattice-style codec), after Conway & Sloane, "A fast encoding method for lattice codes and
 * quantizers", IEEE T-IT 1983.
 *
 * Fine lattice δ·Λ inside the coarse lattice m·δ·Λ, m = 2^B, Λ = E8 (8 values per block) or D4 (4):
 * every block is one coset of mΛ in Λ, named by its digits u = G^{-1}·y mod m (B bits per value), and
 * decodes to the coset's canonical representative (the point in the Voronoi cell of mΛ; voronoi.h).
 * Scale rule (q_range R): δ = R·σ̂ / m with σ̂ = ||x|| / sqrt(d), stored as fp16; every coordinate is
 * clamped to ±R·σ̂ (= ±m·δ, the extent of the coarse cell along the axes). Overload (the closest fine
 * point outside the coarse cell) is handled by clamping, not wrapping: the block is shrunk toward the
 * origin by the largest a/256 (binary search) whose closest point lies in the cell.
 * Default R per rate: tuned for Gaussian data (k_default_q). Byte layout: doc/format.md §2. */
#include "voronoi.h"

#include "common/cpu.h"
#include "common/fp16.h"

#include <math.h>
#include <stdlib.h>

/* default q_range by bits, measured on Gaussian data (d = 64): the SNR-optimal value */
static const float k_default_q_e8[5] = {0, 0, 4.2f, 4.5f, 5.0f};
static const float k_default_q_d4[5] = {0, 0, 3.5f, 3.9f, 4.3f};

typedef struct {
    int lattice_dim; /* 8 (E8) or 4 (D4) */
    unsigned log2_m;
    float q_range;
} nest_state;

typedef void (*nearest_fn)(int32_t *y, const int32_t *X);

static void e8_nearest_ref(int32_t *y, const int32_t *X) {
    e8kv_e8_nearest_fx(y, X);
}
static void d4_nearest_ref(int32_t *y, const int32_t *X) {
    e8kv_d4_nearest_fx(y, X);
}

/* digits and canonical representative, one lattice or the other (E8 in doubled coordinates) */
static uint32_t digits_of(int dim, const int32_t *y, unsigned L) {
    return dim == 8 ? e8kv_e8_digits(y, L) : e8kv_d4_digits(y, L);
}
static void rep_of(int dim, int32_t *r, uint32_t dg, unsigned L) {
    if (dim == 8)
        e8kv_e8_coset_rep(r, dg, L);
    else
        e8kv_d4_coset_rep(r, dg, L);
}

static void shrink(int32_t *out, const int32_t *X, int32_t a, int n) {
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)(((int64_t)X[i] * a) >> 8);
}

/* one block: the digits of the closest fine point inside the coarse cell */
static uint32_t encode_block(int dim, unsigned L, const int32_t *X, nearest_fn nearest) {
    int32_t y[8], r[8], Xs[8];
    nearest(y, X);
    uint32_t dg = digits_of(dim, y, L);
    rep_of(dim, r, dg, L);
    if (memcmp(r, y, (size_t)dim * sizeof(int32_t)) == 0) return dg;
    uint32_t best = 0; /* a = 0: the origin, digits 0 */
    for (int32_t lo = 0, hi = 256; hi - lo > 1;) {
        const int32_t mid = (lo + hi) / 2;
        shrink(Xs, X, mid, dim);
        nearest(y, Xs);
        dg = digits_of(dim, y, L);
        rep_of(dim, r, dg, L);
        if (memcmp(r, y, (size_t)dim * sizeof(int32_t)) == 0) {
            lo = mid;
            best = dg;
        } else {
            hi = mid;
        }
    }
    return best;
}

/* LSB-first bit writer/reader over the index area (n <= 32; touches only the bytes that hold the
 * field, so never past the end of the vector) */
static void put_bits(uint8_t *p, size_t bitpos, uint32_t v, unsigned n) {
    uint64_t w = (uint64_t)v << (bitpos & 7);
    const size_t nbytes = ((bitpos & 7) + n + 7) / 8;
    for (size_t i = 0; i < nbytes; i++, w >>= 8)
        p[(bitpos >> 3) + i] |= (uint8_t)w;
}
static uint32_t get_bits(const uint8_t *p, size_t bitpos, unsigned n) {
    const size_t nbytes = ((bitpos & 7) + n + 7) / 8;
    uint64_t w = 0;
    for (size_t i = 0; i < nbytes; i++)
        w |= (uint64_t)p[(bitpos >> 3) + i] << (8 * i);
    return (uint32_t)((w >> (bitpos & 7)) & ((1ull << n) - 1));
}

static size_t nest_encode_with(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x,
                               nearest_fn nearest) {
    const nest_state *const st = codec->state;
    const int dim = st->lattice_dim;
    const unsigned L = st->log2_m;
    const size_t d = codec->head_dim;
    const int32_t m = 1 << L;
    const double sigma = sqrt(e8kv_sumsq_f32(x, d) / (double)d);
    const uint16_t h = e8kv_fp32_to_fp16((float)((double)st->q_range * sigma / (double)m));
    if ((h & 0x7C00u) == 0x7C00u) return E8KV_ERR(RANGE);
    e8kv_store_le16(dst, h);
    uint8_t *const p = dst + 2;
    memset(p, 0, codec->vector_bytes - 2);
    const float s = e8kv_fp16_to_fp32(h);
    if (s == 0.0f) return 0; /* zero vector (or below fp16's range): digits 0 decode to zeros */
    const float k = (float)E8KV_FX_ONE / s;
    const int32_t lim = m * E8KV_FX_ONE; /* the clamp ±R·σ̂ in fixed point */
    const unsigned nbits = (unsigned)dim * L;
    for (size_t b = 0, blk = 0; b < d; b += (size_t)dim, blk++) {
        int32_t X[8];
        for (int i = 0; i < dim; i++) {
            int32_t v = e8kv_fx_round(x[b + (size_t)i] * k);
            X[i] = v > lim ? lim : v < -lim ? -lim : v;
        }
        put_bits(p, blk * nbits, encode_block(dim, L, X, nearest), nbits);
    }
    return 0;
}

/* e8nest:2 (m = 4) has the same representatives as the residual stage of e8ball:4: its 512 KiB table */
static void nest_decode_impl(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src,
                             void (*e8_nearest)(int32_t y2[8], const int32_t X[8])) {
    const nest_state *const st = codec->state;
    const int dim = st->lattice_dim;
    const unsigned L = st->log2_m;
    const float s = e8kv_fp16_to_fp32(e8kv_load_le16(src));
    const float k = dim == 8 ? s * 0.5f : s; /* E8 representatives are in doubled coordinates */
    const unsigned nbits = (unsigned)dim * L;
    const int8_t *const tab = dim == 8 && L == 2 ? e8kv_ball_residual_table(2) : NULL;
    for (size_t b = 0, blk = 0; b < codec->head_dim; b += (size_t)dim, blk++) {
        const uint32_t dg = get_bits(src + 2, blk * nbits, nbits);
        int32_t r[8];
        if (tab)
            for (int i = 0; i < 8; i++)
                r[i] = tab[8 * dg + i];
        else if (dim == 8)
            e8kv_e8_coset_rep_with(r, dg, L, e8_nearest);
        else
            e8kv_d4_coset_rep(r, dg, L);
        for (int i = 0; i < dim; i++)
            y[b + (size_t)i] = (float)r[i] * k;
    }
}

size_t e8kv_nest_encode_ref(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x) {
    const nest_state *const st = codec->state;
    return nest_encode_with(codec, dst, x, st->lattice_dim == 8 ? e8_nearest_ref : d4_nearest_ref);
}
void e8kv_nest_decode_ref(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src) {
    nest_decode_impl(codec, y, src, e8kv_e8_nearest_fx);
}
void e8kv_nest_decode_avx2(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src) {
    nest_decode_impl(codec, y, src, e8kv_e8_nearest_fx_avx2);
}

/* the AVX2 twins swap in the vector E8 closest point (e8_ball_avx2.c); D4 stays scalar */
static void e8_nearest_avx2(int32_t *y, const int32_t *X) {
    e8kv_e8_nearest_fx_avx2(y, X);
}
size_t e8kv_nest_encode_avx2(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x) {
    const nest_state *const st = codec->state;
    return nest_encode_with(codec, dst, x, st->lattice_dim == 8 ? e8_nearest_avx2 : d4_nearest_ref);
}

static void nest_destroy(e8kv_codec_t *codec) {
    free(codec->state);
    codec->state = NULL;
}

static const e8kv_quant_ops k_ops_ref = {e8kv_nest_encode_ref, e8kv_nest_decode_ref, nest_destroy};
static const e8kv_quant_ops k_ops_avx2 = {e8kv_nest_encode_avx2, e8kv_nest_decode_avx2, nest_destroy};

/* The useful q_range at head_dim d is [1, sqrt(2d)]. Below 1 every nonzero vector is clamped (its largest
 * |x_i| is at least σ̂). At sqrt(2d) and above nothing ever is: a block's norm is at most ||x|| = sqrt(d)·σ̂,
 * inside the ball of radius R·σ̂/√2 that the coarse cell m·δ·Λ contains (packing radius of E8 and D4: √2/2
 * at δ = 1), so a larger R only coarsens the step. KakeyaLattice's q_range (10, 38, 152) is another knob:
 * the number of lattice steps from 0 to the vector's largest coordinate, whose role here is m = 2^B
 * (its rate is log2(2Q + 1) bits per value), and read as a clamp it gives nonsense (e8nest:4:q=38 at
 * head_dim 64: 3.9 dB). */
static size_t check_q_range(const e8kv_codec_t *codec, const e8kv_spec *spec) {
    const double q = spec->q_range, q_max = sqrt(2.0 * (double)codec->head_dim);
    if (q == 0.0 || (q >= 1.0 && q <= q_max)) return 0; /* 0: the default */
    e8kv_log(
        0,
        "e8kv: %s at head_dim %zu: q is the clamp in multiples of the vector's RMS, useful from 1 to "
        "sqrt(2*head_dim) = %.4g; KakeyaLattice's q_range Q (10, 38, 152) counts lattice steps up to the "
        "largest coordinate, about log2(2Q+1) bits per value: choose the rate B instead",
        codec->spec, codec->head_dim, q_max);
    return E8KV_ERR(Q_RANGE);
}

static size_t nest_init(e8kv_codec_t *codec, const e8kv_spec *spec, int dim) {
    if (spec->bits < 2 || spec->bits > 4) return E8KV_ERR(RATE);
    if (codec->head_dim % (size_t)dim != 0) return E8KV_ERR(HEAD_DIM);
    const size_t rq = check_q_range(codec, spec);
    if (e8kv_is_error(rq)) return rq;
    nest_state *const st = malloc(sizeof *st);
    if (!st) return E8KV_ERR(OUT_OF_MEMORY);
    st->lattice_dim = dim;
    st->log2_m = (unsigned)spec->bits;
    st->q_range =
        spec->q_range > 0.0f ? spec->q_range : (dim == 8 ? k_default_q_e8 : k_default_q_d4)[spec->bits];
    codec->state = st;
    codec->bits = spec->bits;
    codec->q_range = st->q_range;
    codec->vector_bytes = 2 + (codec->head_dim * (size_t)spec->bits + 7) / 8;
    codec->ops = e8kv_cpu_has_avx2() ? &k_ops_avx2 : &k_ops_ref;
    return 0;
}

size_t e8kv_quant_init_e8nest(e8kv_codec_t *codec, const e8kv_spec *spec) {
    return nest_init(codec, spec, 8);
}
size_t e8kv_quant_init_d4nest(e8kv_codec_t *codec, const e8kv_spec *spec) {
    return nest_init(codec, spec, 4);
}
