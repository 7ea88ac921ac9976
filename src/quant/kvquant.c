/* kvquant:B, the KVQuant-style non-uniform dense-and-sparse format as a peer (after Hooper et al.,
 * "KVQuant: Towards 10 Million Context Length LLM Inference with KV Cache Quantization", NeurIPS 2024):
 * keys per channel and (by the cache's default for this format) before RoPE, values per token, each
 * normalized by its own mean and standard deviation and quantized to the 2^B non-uniform levels of the
 * Lloyd–Max quantizer of N(0, 1) (the "NF" choice of level set; B = 2, 3, 4), with about 1% of the values,
 * those furthest from their channel's (token's) mean in standard deviations, kept exact in sparse form
 * (index + fp16).
 *
 * What differs from the paper, and why: KVQuant fits per-channel levels and outlier thresholds offline on
 * calibration data; here every statistic comes from the page being coded (G = 64 tokens), so the format
 * needs nothing but the data and its side information is in the rate: per channel (K) or per token and
 * 64-value chunk (V) an fp16 mean and fp16 deviation (0.5 bits per value), plus the sparse outliers.
 *
 * Token-group codec (codec.h), G = 64, head_dim a multiple of 64. vector_bytes = ⌈(4d + G·d·B/8 +
 * 4·⌈0.01·G·d⌉) / G⌉ and the group's outlier count n_out = (G·vector_bytes − 4d − G·d·B/8) / 4 (the
 * padding spent on outliers: 48 of 4096 values at head_dim 64, 1.17%; B + 0.875 bits per value). Layout of
 * a group (doc/format.md §2.6):
 *   bytes [0, 4d)  cells: K, channel c (cell c); V, token t and chunk j = c / 64 (cell t·d/64 + j):
 *                  fp16 mean μ then fp16 deviation σ per cell
 *   G·d fields of B bits (bitpack.h), field t·d + c: the level index of token t, channel c
 *   n_out entries of 4 bytes: u16 index t·d + c, then the fp16 value (ascending indices)
 * Decode: μ + σ·ℓ[q] per value, then each outlier entry overwrites its value (entries whose index is
 * outside the group are ignored). Encode: per cell μ, σ over all its values (double); the n_out values
 * with the largest |x − μ|/σ (ties: lower index) are outliers; μ, σ are recomputed without them, rounded
 * to fp16, and q is the level nearest to (x − μ)/σ (the lloyd:B thresholds). E8KV_ERROR_RANGE when a mean,
 * deviation or outlier does not fit fp16. */
#include "bitpack.h"
#include "codec.h"

#include "common/fp16.h"

#include <math.h>
#include <stdlib.h>

#define KVQ_GROUP 64
#define KVQ_CHUNK 64    /* values per cell of a value token */
#define KVQ_MAX_OUT 512 /* ⌈0.01·64·512⌉ + 64/4 padding at most */

/* Lloyd–Max levels of N(0, 1), positive halves (the constants of lloyd.c) */
static const float k_half2[2] = {0.452780035f, 1.51041761f};
static const float k_half3[4] = {0.245094179f, 0.756005281f, 1.34390928f, 2.1519457f};
static const float k_half4[8] = {0.12839503f, 0.388048299f, 0.656759119f, 0.942340456f,
                                 1.2562312f,  1.61804639f,  2.06901723f,  2.73258957f};

typedef struct {
    float level[16], threshold[15];
    unsigned n_level;
    size_t n_out;
} kvq_state;

static inline size_t cell_of(size_t t, size_t ch, size_t d, int is_key) {
    return is_key ? ch : t * (d / KVQ_CHUNK) + ch / KVQ_CHUNK;
}

typedef struct {
    float z;
    uint32_t idx;
} outlier;

/* a before b in the outlier order: larger z, then lower index */
static inline int before(const outlier *a, const outlier *b) {
    return a->z > b->z || (a->z == b->z && a->idx < b->idx);
}

static size_t kvq_encode_group(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x,
                               int is_key) {
    const kvq_state *const st = c->state;
    const size_t d = c->head_dim, G = KVQ_GROUP, N = G * d, n_out = st->n_out;
    const unsigned B = (unsigned)c->bits;
    double sum[E8KV_MAX_HEAD_DIM], sq[E8KV_MAX_HEAD_DIM];
    size_t cnt[E8KV_MAX_HEAD_DIM];
    float mu[E8KV_MAX_HEAD_DIM], sd[E8KV_MAX_HEAD_DIM];
    uint8_t is_out[KVQ_GROUP * E8KV_MAX_HEAD_DIM / 8];
    outlier top[KVQ_MAX_OUT];
    memset(dst, 0, G * c->vector_bytes);
    /* first statistics over every value of each cell (the cell count is d in both modes) */
    for (int pass = 0; pass < 2; pass++) {
        memset(sum, 0, d * sizeof *sum);
        memset(sq, 0, d * sizeof *sq);
        memset(cnt, 0, d * sizeof *cnt);
        for (size_t i = 0; i < N; i++) {
            if (pass && (is_out[i >> 3] >> (i & 7) & 1)) continue;
            const size_t k = cell_of(i / d, i % d, d, is_key);
            sum[k] += x[i];
            sq[k] += (double)x[i] * x[i];
            cnt[k]++;
        }
        for (size_t k = 0; k < d; k++) {
            const double m = cnt[k] ? sum[k] / (double)cnt[k] : 0.0;
            const double v = cnt[k] ? sq[k] / (double)cnt[k] - m * m : 0.0;
            mu[k] = (float)m;
            sd[k] = v > 0.0 ? (float)sqrt(v) : 0.0f;
        }
        if (pass) break;
        /* the n_out largest normalized deviations, kept sorted in `top` */
        size_t n_top = 0;
        for (size_t i = 0; i < N; i++) {
            const size_t k = cell_of(i / d, i % d, d, is_key);
            const float dev = fabsf(x[i] - mu[k]);
            const outlier o = {sd[k] > 0.0f ? dev / sd[k] : (dev > 0.0f ? INFINITY : 0.0f), (uint32_t)i};
            if (n_top == n_out && !before(&o, &top[n_top - 1])) continue;
            size_t j = n_top < n_out ? n_top++ : n_top - 1;
            while (j > 0 && before(&o, &top[j - 1])) {
                top[j] = top[j - 1];
                j--;
            }
            top[j] = o;
        }
        memset(is_out, 0, (N + 7) / 8);
        for (size_t j = 0; j < n_top; j++)
            is_out[top[j].idx >> 3] |= (uint8_t)(1u << (top[j].idx & 7));
    }
    float m16[E8KV_MAX_HEAD_DIM], s16[E8KV_MAX_HEAD_DIM];
    for (size_t k = 0; k < d; k++) {
        if (!(fabsf(mu[k]) < 65520.0f) || !(sd[k] < 65520.0f)) return E8KV_ERR(RANGE);
        const uint16_t hm = e8kv_fp32_to_fp16(mu[k]), hs = e8kv_fp32_to_fp16(sd[k]);
        e8kv_store_le16(dst + 4 * k, hm);
        e8kv_store_le16(dst + 4 * k + 2, hs);
        m16[k] = e8kv_fp16_to_fp32(hm);
        s16[k] = e8kv_fp16_to_fp32(hs);
    }
    uint8_t *const codes = dst + 4 * d;
    for (size_t i = 0; i < N; i++) {
        const size_t k = cell_of(i / d, i % d, d, is_key);
        const float u = s16[k] > 0.0f ? (x[i] - m16[k]) / s16[k] : 0.0f;
        unsigned q = 0;
        while (q < st->n_level - 1 && st->threshold[q] <= u)
            q++;
        e8kv_bits_put(codes, i * B, B, q);
    }
    uint8_t *const sparse = codes + N * B / 8;
    size_t e = 0;
    for (size_t i = 0; i < N; i++) { /* ascending indices */
        if (!(is_out[i >> 3] >> (i & 7) & 1)) continue;
        if (!(fabsf(x[i]) < 65520.0f)) return E8KV_ERR(RANGE);
        e8kv_store_le16(sparse + 4 * e, (uint16_t)i);
        e8kv_store_le16(sparse + 4 * e + 2, e8kv_fp32_to_fp16(x[i]));
        e++;
    }
    assert(e == n_out);
    return 0;
}

static void kvq_decode_group(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src, size_t t0,
                             size_t n, int is_key) {
    const kvq_state *const st = c->state;
    const size_t d = c->head_dim, N = KVQ_GROUP * d;
    const unsigned B = (unsigned)c->bits;
    const uint8_t *const codes = src + 4 * d;
    for (size_t t = 0; t < n; t++)
        for (size_t ch = 0; ch < d; ch++) {
            const size_t k = cell_of(t0 + t, ch, d, is_key), i = (t0 + t) * d + ch;
            const float m = e8kv_fp16_to_fp32(e8kv_load_le16(src + 4 * k));
            const float s = e8kv_fp16_to_fp32(e8kv_load_le16(src + 4 * k + 2));
            y[t * d + ch] = m + s * st->level[e8kv_bits_get(codes, i * B, B)];
        }
    const uint8_t *const sparse = codes + N * B / 8;
    for (size_t e = 0; e < st->n_out; e++) {
        const size_t i = e8kv_load_le16(sparse + 4 * e);
        if (i < t0 * d || i >= (t0 + n) * d) continue;
        y[i - t0 * d] = e8kv_fp16_to_fp32(e8kv_load_le16(sparse + 4 * e + 2));
    }
}

static void kvq_destroy(e8kv_codec_t *c) {
    free(c->state);
    c->state = NULL;
}

static const e8kv_quant_ops k_kvq_ops = {NULL, NULL, kvq_destroy};
static const e8kv_group_ops k_kvq_group = {kvq_encode_group, kvq_decode_group};

size_t e8kv_quant_init_kvquant(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    if (spec->bits < 2 || spec->bits > 4 || spec->rate8 != 8 * spec->bits) return E8KV_ERR(RATE);
    const size_t d = codec->head_dim, G = KVQ_GROUP, B = (size_t)spec->bits;
    if (d % KVQ_CHUNK) return E8KV_ERR(HEAD_DIM);
    kvq_state *st = calloc(1, sizeof *st);
    if (!st) return E8KV_ERR(OUT_OF_MEMORY);
    const float *half = B == 2 ? k_half2 : B == 3 ? k_half3 : k_half4;
    const unsigned h = 1u << (B - 1);
    st->n_level = 2 * h;
    for (unsigned i = 0; i < h; i++) {
        st->level[h + i] = half[i];
        st->level[h - 1 - i] = -half[i];
    }
    for (unsigned i = 0; i + 1 < st->n_level; i++)
        st->threshold[i] = 0.5f * (st->level[i] + st->level[i + 1]);
    const size_t dense = 4 * d + G * d * B / 8, want = (G * d + 99) / 100; /* ⌈1%⌉ */
    codec->vector_bytes = (dense + 4 * want + G - 1) / G;
    st->n_out = (G * codec->vector_bytes - dense) / 4;
    assert(st->n_out >= want && st->n_out <= KVQ_MAX_OUT);
    codec->state = st;
    codec->ops = &k_kvq_ops;
    codec->group = &k_kvq_group;
    codec->group_tokens = G;
    return 0;
}
