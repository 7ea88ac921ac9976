/* "lloyd:B", a TurboQuant-style scalar baseline (Zandieh et al., "TurboQuant", 2025; Lloyd 1982,
 * Max 1960): after the random-sign Hadamard rotation the coordinates of u = x·√d/‖x‖ are close to
 * N(0, 1), so each one is quantized with the B-bit Lloyd–Max quantizer of the standard Gaussian and the
 * norm is kept on the side.
 *
 * Vector layout (vector_bytes = 2 + B·head_dim/8; head_dim a multiple of 8, B = 2, 3, 4 else
 * E8KV_ERROR_RATE, no other option):
 *   bytes 0..1   f16 n̂ = ‖x‖ rounded to binary16 (RNE); ‖x‖ >= 65520 is E8KV_ERROR_RANGE
 *   bytes 2..    head_dim indices of B bits, index i in bits [B·i, B·i + B) of a little-endian bit
 *                stream (bit k is bit k mod 8 of byte 2 + k/8), least significant bit first.
 * Index k selects level c_k of the ascending table below (k = 0 is the most negative level).
 * Decode: y_i = c_k · s with s = n̂ / sqrtf(head_dim) in f32 (a zero norm gives exact zeros).
 * Encode: u_i = x_i · √d / n̂ in double, k = number of thresholds t_j = (c_j + c_{j+1})/2 (double) with
 * t_j <= u_i (a tie goes to the upper level); n̂ = 0 encodes every index as 2^(B-1) (the level just above 0).
 *
 * The levels are the Lloyd–Max fixed point for N(0, 1) (iterated to convergence in double with the
 * closed-form Gaussian cell integrals), committed as a table so the format cannot drift with a libm;
 * tests/test_scalar.c re-derives them by Lloyd iteration and tests/py_scalar_ref.py by numerical
 * integration. MSE per coordinate on N(0,1): 0.1175, 0.03455, 0.009501 for B = 2, 3, 4. */
#include "codec.h"

#include "common/fp16.h"

#include <math.h>
#include <stdlib.h>

/* Positive halves of the symmetric level tables (ascending). */
static const float k_levels2[2] = {0.452780035f, 1.51041761f};
static const float k_levels3[4] = {0.245094179f, 0.756005281f, 1.34390928f, 2.1519457f};
static const float k_levels4[8] = {0.12839503f, 0.388048299f, 0.656759119f, 0.942340456f,
                                   1.2562312f,  1.61804639f,  2.06901723f,  2.73258957f};

#define LLOYD_MAX_LEVELS 16

typedef struct {
    float level[LLOYD_MAX_LEVELS];       /* ascending, 2^B of them */
    double threshold[LLOYD_MAX_LEVELS];  /* 2^B - 1 midpoints */
    int n_level;
} lloyd_state;

static size_t lloyd_encode(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x) {
    const lloyd_state *const st = c->state;
    const size_t d = c->head_dim;
    const int bits = c->bits;
    /* an overflowed rotation (Inf/NaN) makes ss, hence the f16 norm, non-finite: RANGE below */
    double ss = 0.0;
    for (size_t i = 0; i < d; i++) ss += (double)x[i] * (double)x[i];
    const uint16_t h = e8kv_fp32_to_fp16((float)sqrt(ss));
    const float norm = e8kv_fp16_to_fp32(h);
    if (!isfinite(norm)) return E8KV_ERR(RANGE);
    e8kv_store_le16(dst, h);
    const double scale = norm > 0.0f ? sqrt((double)d) / (double)norm : 0.0;
    uint8_t *out = dst + 2;
    uint64_t acc = 0;
    int n_acc = 0;
    for (size_t i = 0; i < d; i++) {
        const double u = (double)x[i] * scale;
        /* k = the number of thresholds <= u, by binary search over the ascending thresholds */
        int k = 0;
        for (int step = st->n_level / 2; step > 0; step /= 2) k += st->threshold[k + step - 1] <= u ? step : 0;
        acc |= (uint64_t)k << n_acc;
        n_acc += bits;
        while (n_acc >= 8) {
            *out++ = (uint8_t)acc;
            acc >>= 8;
            n_acc -= 8;
        }
    }
    assert(n_acc == 0 && out == dst + c->vector_bytes);
    return 0;
}

static void lloyd_decode(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src) {
    const lloyd_state *const st = c->state;
    const size_t d = c->head_dim;
    const int bits = c->bits;
    const uint32_t mask = (1u << bits) - 1u;
    const float s = e8kv_fp16_to_fp32(e8kv_load_le16(src)) / sqrtf((float)d);
    const uint8_t *in = src + 2;
    uint32_t acc = 0;
    int n_acc = 0;
    for (size_t i = 0; i < d; i++) {
        if (n_acc < bits) {
            acc |= (uint32_t)*in++ << n_acc;
            n_acc += 8;
        }
        y[i] = st->level[acc & mask] * s;
        acc >>= bits;
        n_acc -= bits;
    }
}

static void lloyd_destroy(e8kv_codec_t *c) {
    free(c->state);
    c->state = NULL;
}

static const e8kv_quant_ops k_lloyd_ops = {lloyd_encode, lloyd_decode, lloyd_destroy};

size_t e8kv_quant_init_lloyd(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    const float *half;
    switch (spec->bits) {
    case 2: half = k_levels2; break;
    case 3: half = k_levels3; break;
    case 4: half = k_levels4; break;
    default: return E8KV_ERR(RATE);
    }
    if (codec->head_dim == 0 || codec->head_dim % 8 != 0) return E8KV_ERR(HEAD_DIM);
    lloyd_state *const st = calloc(1, sizeof *st);
    if (!st) return E8KV_ERR(OUT_OF_MEMORY);
    const int n = 1 << spec->bits, h = n / 2;
    for (int k = 0; k < h; k++) {
        st->level[h + k] = half[k];
        st->level[h - 1 - k] = -half[k];
    }
    for (int k = 0; k < n - 1; k++) st->threshold[k] = 0.5 * ((double)st->level[k] + (double)st->level[k + 1]);
    st->n_level = n;
    codec->state = st;
    codec->ops = &k_lloyd_ops;
    codec->bits = spec->bits;
    codec->vector_bytes = 2 + (size_t)spec->bits * codec->head_dim / 8;
    return 0;
}
