/* The public codec API: spec parsing, the family registry, rotation, NaN/Inf screening and the plain
 * f32/f16 formats. Quantizers themselves live one per file (see codec.h). */
#include "codec.h"
#include "e8_box.h"
#include "e8_p.h"
#include "e8_vlc.h"

#include "common/fp16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    e8kv_traits traits;
    size_t (*init)(e8kv_codec_t *codec, const e8kv_spec *spec); /* NULL: calibrated, no codec of its own */
    /* var_coded families: the init with per-coordinate variances (e8kv_codec_create_var) */
    size_t (*init_var)(e8kv_codec_t *codec, const e8kv_spec *spec, const float *var);
} family_entry;

/* Trait shorthands of the registry (codec.h): centring and the RoPE default of keys */
#define PLAIN .center = E8KV_CENTER_NEVER
#define KEEPS .center = E8KV_CENTER_ON_REQUEST /* llama.cpp's and the peers' published semantics */
#define OURS .center = E8KV_CENTER_DEFAULT
#define PRE .rope_pre = 1 /* e8kv's key formats: coded before RoPE, measured better (BENCHMARKS.md) */
#define FAMILY(name, ...) {.family = name, __VA_ARGS__}

/* e8:B is the default fixed-rate E8 code: the ball-shaped codebook (plus its Voronoi residual stage at
 * 3 and 4 bits), the design with the best measured fixed-rate SNR (BENCHMARKS.md). Plain K and the
 * llama.cpp formats (post-RoPE in llama.cpp) keep keys after RoPE, and so does e8box, the format built for
 * reading speed: its integer-domain attention needs keys in the rotated domain. */
static const family_entry k_families[] = {
    {FAMILY("f32", PLAIN, .reader = E8KV_READER_F32), e8kv_quant_init_f32, NULL},
    {FAMILY("f16", PLAIN, .reader = E8KV_READER_F16, .gpu = E8KV_GPU_F16), e8kv_quant_init_f16, NULL},
    {FAMILY("bf16", PLAIN, .gpu = E8KV_GPU_BF16), e8kv_quant_init_bf16, NULL},
    {FAMILY("q8_0", KEEPS), e8kv_quant_init_q8_0, NULL},
    {FAMILY("q8_0h", KEEPS, .rotates = 1), e8kv_quant_init_q8_0, NULL},
    {FAMILY("q4_0", KEEPS), e8kv_quant_init_q4_0, NULL},
    {FAMILY("q4_0h", KEEPS, .rotates = 1), e8kv_quant_init_q4_0, NULL},
    {FAMILY("lloyd", OURS, PRE, .rotates = 1), e8kv_quant_init_lloyd, NULL},
    {FAMILY("e8", OURS, PRE, .rotates = 1, .reader = E8KV_READER_E8BALL), e8kv_quant_init_e8ball, NULL},
    {FAMILY("e8ball", OURS, PRE, .rotates = 1, .reader = E8KV_READER_E8BALL), e8kv_quant_init_e8ball, NULL},
    {FAMILY("e8nest", OURS, PRE, .rotates = 1), e8kv_quant_init_e8nest, NULL},
    {FAMILY("d4nest", OURS, PRE, .rotates = 1), e8kv_quant_init_d4nest, NULL},
    {FAMILY("e8v", OURS, PRE, .rotates = 1, .var_coded = 1, .auto_rates = 1), e8kv_quant_init_e8v,
     e8kv_quant_init_e8v_var},
    {FAMILY("e8box", OURS, .rotates = 1, .reader = E8KV_READER_E8BOX, .attn_int = 1, .gpu = E8KV_GPU_E8BOX4),
     e8kv_quant_init_e8box, NULL},
    {FAMILY("e8p", OURS, PRE, .rotates = 1, .gpu = E8KV_GPU_E8P2), e8kv_quant_init_e8p, NULL},
    /* calibrated transforms of a stream, then a codec (cache/xform.c, e8kv calibrate): keys calibrated
     * before RoPE are coded before it */
    {FAMILY("e8t", OURS, PRE, .base = "e8", .calibrated = 1), NULL, NULL},
    {FAMILY("e8tv", OURS, PRE, .base = "e8v", .calibrated = 1, .auto_rates = 1), NULL, NULL},
    /* peers (BENCHMARKS.md, "Peers side by side"); kivi and kvquant code groups of tokens together */
    {FAMILY("kivi", KEEPS), e8kv_quant_init_kivi, NULL},
    {FAMILY("kvquant", KEEPS, PRE), e8kv_quant_init_kvquant, NULL},
    {FAMILY("e8r", KEEPS, PRE, .rotates = 1), e8kv_quant_init_e8r, NULL},
    {FAMILY("kakeya", KEEPS, .rotates = 1), e8kv_quant_init_kakeya, NULL},
};
#undef PLAIN
#undef KEEPS
#undef OURS
#undef PRE
#undef FAMILY

static const family_entry *find_family(const char *spec) {
    const size_t n = spec ? strcspn(spec, ":") : 0;
    for (size_t i = 0; n && i < sizeof k_families / sizeof k_families[0]; i++)
        if (strlen(k_families[i].traits.family) == n && !memcmp(k_families[i].traits.family, spec, n))
            return &k_families[i];
    return NULL;
}

const e8kv_traits *e8kv_family_traits(const char *spec) {
    const family_entry *fam = find_family(spec);
    return fam ? &fam->traits : NULL;
}

const char *e8kv_codec_base_spec(const char *spec, char buf[E8KV_CODEC_SPEC_MAX + 1]) {
    const e8kv_traits *t = e8kv_family_traits(spec);
    if (!t || !t->calibrated) return spec;
    /* the base name is never longer than the calibrated one ("e8tv" → "e8v"): never cut */
    snprintf(buf, E8KV_CODEC_SPEC_MAX + 1, "%s%s", t->base, spec + strlen(t->family));
    return buf;
}

size_t e8kv_spec_parse(e8kv_spec *out, const char *spec) {
    memset(out, 0, sizeof *out);
    if (!spec || !spec[0] || strlen(spec) > E8KV_CODEC_SPEC_MAX) return E8KV_ERR(SPEC);
    char buf[E8KV_CODEC_SPEC_MAX + 1];
    memcpy(buf, spec, strlen(spec) + 1);
    char *save = NULL;
    char *tok = strtok_r(buf, ":", &save);
    if (!tok || strlen(tok) >= sizeof out->family) return E8KV_ERR(SPEC);
    memcpy(out->family, tok, strlen(tok) + 1);
    int first = 1;
    while ((tok = strtok_r(NULL, ":", &save)) != NULL) {
        char *end = NULL;
        if (first && tok[0] >= '0' && tok[0] <= '9') {
            const double b = strtod(tok, &end);
            if (*end) return E8KV_ERR(SPEC);
            /* a number, but no format has that rate: above 16, or not a multiple of 1/8 */
            if (!(b > 0.0) || b > 16.0 || b * 8.0 != floor(b * 8.0)) return E8KV_ERR(RATE);
            out->rate8 = (int)(b * 8.0);
            out->bits = out->rate8 % 8 ? 0 : out->rate8 / 8;
        } else if (strncmp(tok, "q=", 2) == 0) {
            const float q = strtof(tok + 2, &end);
            if (*end || !(q > 0.0f) || q > 1e6f) return E8KV_ERR(SPEC);
            out->q_range = q;
        } else {
            return E8KV_ERR(SPEC);
        }
        first = 0;
    }
    return 0;
}

static size_t fail(size_t *err, size_t code) {
    if (err) *err = code;
    return code;
}

static e8kv_codec_t *create(const char *spec_str, size_t head_dim, uint64_t seed, const float *var,
                            size_t *err) {
    e8kv_spec spec;
    if (!spec_str) {
        fail(err, E8KV_ERR(BAD_ARGUMENT));
        return NULL;
    }
    /* a bad rate is E8KV_ERROR_RATE only for a family with a codec; anything else unparsable is SPEC */
    const size_t parsed = e8kv_spec_parse(&spec, spec_str);
    if (e8kv_is_error(parsed) && e8kv_get_error_code(parsed) != E8KV_ERROR_RATE) {
        fail(err, E8KV_ERR(SPEC));
        return NULL;
    }
    const family_entry *fam = find_family(spec.family);
    if (!fam || !fam->init || (var && !fam->init_var)) {
        fail(err, E8KV_ERR(SPEC));
        return NULL;
    }
    if (e8kv_is_error(parsed)) {
        fail(err, parsed);
        return NULL;
    }
    if (head_dim == 0 || head_dim > E8KV_MAX_HEAD_DIM) {
        fail(err, E8KV_ERR(HEAD_DIM));
        return NULL;
    }
    e8kv_codec_t *c = calloc(1, sizeof *c);
    if (!c) {
        fail(err, E8KV_ERR(OUT_OF_MEMORY));
        return NULL;
    }
    snprintf(c->spec, sizeof c->spec, "%s", spec_str);
    c->head_dim = head_dim;
    c->bits = spec.bits;
    c->q_range = spec.q_range;
    c->seed = seed;
    c->traits = fam->traits;
    if (var) c->traits.rotates = 0; /* the variances take the rotation's place */
    c->rotate = c->traits.rotates;
    size_t r = 0;
    if (c->rotate) r = e8kv_rot_init(&c->rot, head_dim, seed);
    if (!e8kv_is_error(r)) r = var ? fam->init_var(c, &spec, var) : fam->init(c, &spec);
    if (e8kv_is_error(r)) {
        fail(err, r);
        e8kv_codec_free(c);
        return NULL;
    }
    assert(c->ops && c->vector_bytes > 0);
    assert(c->group_tokens <= 1 ? c->ops->encode && c->ops->decode : c->group && !c->rotate);
    if (c->group_tokens > 1) { /* a token group is coded together: no token moves or leaves alone */
        c->traits.layout = E8KV_PAGE_TOKEN_GROUP;
        c->traits.evictable = 0;
    } else {
        c->traits.layout = E8KV_PAGE_VECTOR;
        c->traits.evictable = 1;
    }
    if (err) *err = 0;
    return c;
}

e8kv_codec *e8kv_codec_create(const char *spec_str, size_t head_dim, uint64_t seed, size_t *err) {
    return create(spec_str, head_dim, seed, NULL, err);
}

e8kv_codec_t *e8kv_codec_create_var(const char *spec, size_t head_dim, const float *var, size_t *err) {
    if (!var) {
        fail(err, E8KV_ERR(BAD_ARGUMENT));
        return NULL;
    }
    return create(spec, head_dim, 0, var, err);
}

void e8kv_codec_free(e8kv_codec *codec) {
    if (!codec) return;
    if (codec->ops && codec->ops->destroy) codec->ops->destroy(codec);
    free(codec);
}

const char *e8kv_codec_spec(const e8kv_codec *codec) {
    return codec ? codec->spec : "";
}
e8kv_gpu_format e8kv_codec_gpu_format(const e8kv_codec *codec) {
    return codec ? (e8kv_gpu_format)codec->traits.gpu : E8KV_GPU_NONE;
}
size_t e8kv_codec_head_dim(const e8kv_codec *codec) {
    return codec ? codec->head_dim : 0;
}
size_t e8kv_codec_vector_bytes(const e8kv_codec *codec) {
    return codec ? codec->vector_bytes : 0;
}
int e8kv_codec_is_rotated(const e8kv_codec *codec) {
    return codec ? codec->rotate : 0;
}

double e8kv_codec_bits_per_value(const e8kv_codec *codec) {
    if (!codec) return 0.0;
    return 8.0 * (double)codec->vector_bytes / (double)codec->head_dim;
}

size_t e8kv_codec_encode(const e8kv_codec *codec, void *dst, size_t dst_capacity, const float *src,
                         size_t n_vec) {
    if (!codec || (!dst && n_vec) || (!src && n_vec)) return E8KV_ERR(BAD_ARGUMENT);
    const size_t d = codec->head_dim, vb = codec->vector_bytes;
    if (n_vec > SIZE_MAX / vb || dst_capacity < n_vec * vb) return E8KV_ERR(DST_TOO_SMALL);
    /* screen everything first so a rejected call writes nothing */
    if (!e8kv_all_finite(src, n_vec * d)) return E8KV_ERR(NONFINITE);
    float tmp[E8KV_MAX_HEAD_DIM];
    uint8_t *const out = dst;
    const size_t G = codec->group_tokens;
    if (G > 1) { /* token-group codecs: whole groups, coded as a cache codes its K stream */
        if (n_vec % G) return E8KV_ERR(SRC_SIZE);
        for (size_t v = 0; v < n_vec; v += G) {
            const size_t r = codec->group->encode(codec, out + v * vb, src + v * d, 1);
            if (e8kv_is_error(r)) {
                memset(out, 0, v * vb);
                return r;
            }
        }
        return n_vec * vb;
    }
    for (size_t v = 0; v < n_vec; v++) {
        memcpy(tmp, src + v * d, d * sizeof(float));
        if (codec->rotate) e8kv_rot_forward(&codec->rot, tmp, 1);
        const size_t r = codec->ops->encode(codec, out + v * vb, tmp);
        if (e8kv_is_error(r)) {
            memset(out, 0, v * vb); /* all or nothing */
            return r;
        }
    }
    return n_vec * vb;
}

/* 1 when no x[i] is NaN or Inf, i.e. every |x| as bits is below the infinity pattern 0x7F800000: adding
 * 0x00800000 sets bit 31 exactly for those that are not. Branch-free AND/ADD/OR, which compilers vectorize
 * with plain SSE2, so the check costs little next to even the f32 decode. */
typedef uint32_t u32_alias __attribute__((may_alias)); /* reads a float's bits without memcpy */
#if defined(__GNUC__) && !defined(__clang__)
#define E8KV_VECTORIZE __attribute__((optimize("O3"))) /* gcc vectorizes the reduction only at -O3 */
#else
#define E8KV_VECTORIZE /* clang does at -O2 */
#endif
E8KV_VECTORIZE static int all_finite_fast(const float *restrict x, size_t n) {
    const u32_alias *const u = (const u32_alias *)x;
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++)
        m |= (u[i] & 0x7FFFFFFFu) + 0x00800000u;
    return (m >> 31) == 0;
}

static size_t decode_impl(const e8kv_codec *codec, float *dst, size_t dst_capacity, const void *src,
                          size_t src_size, size_t n_vec, int unrotate) {
    if (!codec || (!dst && n_vec) || (!src && n_vec)) return E8KV_ERR(BAD_ARGUMENT);
    const size_t d = codec->head_dim, vb = codec->vector_bytes;
    if (n_vec > SIZE_MAX / vb || src_size != n_vec * vb) return E8KV_ERR(SRC_SIZE);
    if (dst_capacity < n_vec * d) return E8KV_ERR(DST_TOO_SMALL);
    const uint8_t *const in = src;
    const size_t G = codec->group_tokens;
    if (G > 1) {
        if (n_vec % G) return E8KV_ERR(SRC_SIZE);
        for (size_t v = 0; v < n_vec; v += G) {
            codec->group->decode(codec, dst + v * d, in + v * vb, 0, G, 1);
            if (!all_finite_fast(dst + v * d, G * d)) return E8KV_ERR(CORRUPTED);
        }
        return n_vec * d;
    }
    for (size_t v = 0; v < n_vec; v++) {
        codec->ops->decode(codec, dst + v * d, in + v * vb);
        /* Every encoded vector decodes to finite values (encode refuses what would not); NaN or Inf can
         * only come from bytes no encode wrote: an f32/f16 payload or a scale field that is NaN or Inf.
         * Checked before the rotation, which keeps finite values finite and non-finite ones non-finite. */
        if (!all_finite_fast(dst + v * d, d)) return E8KV_ERR(CORRUPTED);
        if (unrotate && codec->rotate) e8kv_rot_inverse(&codec->rot, dst + v * d, 1);
    }
    return n_vec * d;
}

size_t e8kv_codec_decode(const e8kv_codec *codec, float *dst, size_t dst_capacity, const void *src,
                         size_t src_size, size_t n_vec) {
    return decode_impl(codec, dst, dst_capacity, src, src_size, n_vec, 1);
}

size_t e8kv_codec_decode_rotated(const e8kv_codec *codec, float *dst, size_t dst_capacity, const void *src,
                                 size_t src_size, size_t n_vec) {
    return decode_impl(codec, dst, dst_capacity, src, src_size, n_vec, 0);
}

size_t e8kv_codec_rotate(const e8kv_codec *codec, float *x, size_t n_vec, int inverse) {
    if (!codec || (!x && n_vec)) return E8KV_ERR(BAD_ARGUMENT);
    if (codec->rotate) {
        if (inverse)
            e8kv_rot_inverse(&codec->rot, x, n_vec);
        else
            e8kv_rot_forward(&codec->rot, x, n_vec);
    }
    return n_vec * codec->head_dim;
}

/* ---- plain formats: f32 (little-endian IEEE) and f16 (binary16, round to nearest even) ---- */

static size_t f32_encode(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x) {
    for (size_t i = 0; i < c->head_dim; i++)
        e8kv_store_lef32(dst + 4 * i, x[i]);
    return 0;
}
static void f32_decode(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src) {
    for (size_t i = 0; i < c->head_dim; i++)
        y[i] = e8kv_load_lef32(src + 4 * i);
}
/* f16 and bf16 (the GPU cache's raw pages): 16 bits per value, round to nearest even; RANGE for a value
 * that would round to infinity (at or above `limit`) */
static size_t enc16(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x, float limit,
                    uint16_t (*to16)(float)) {
    for (size_t i = 0; i < c->head_dim; i++)
        if (fabsf(x[i]) >= limit) return E8KV_ERR(RANGE);
    for (size_t i = 0; i < c->head_dim; i++)
        e8kv_store_le16(dst + 2 * i, to16(x[i]));
    return 0;
}
static void dec16(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src, float (*from16)(uint16_t)) {
    for (size_t i = 0; i < c->head_dim; i++)
        y[i] = from16(e8kv_load_le16(src + 2 * i));
}
static size_t f16_encode(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x) {
    return enc16(c, dst, x, 65520.0f, e8kv_fp32_to_fp16);
}
static void f16_decode(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src) {
    dec16(c, y, src, e8kv_fp16_to_fp32);
}
static size_t bf16_encode(const e8kv_codec_t *c, uint8_t *restrict dst, const float *restrict x) {
    return enc16(c, dst, x, 0x1.ffp127f, e8kv_fp32_to_bf16);
}
static void bf16_decode(const e8kv_codec_t *c, float *restrict y, const uint8_t *restrict src) {
    dec16(c, y, src, e8kv_bf16_to_fp32);
}

static const e8kv_quant_ops k_f32_ops = {f32_encode, f32_decode, NULL};
static const e8kv_quant_ops k_f16_ops = {f16_encode, f16_decode, NULL};
static const e8kv_quant_ops k_bf16_ops = {bf16_encode, bf16_decode, NULL};

static size_t init_plain(e8kv_codec_t *codec, const e8kv_spec *spec, const e8kv_quant_ops *ops, int bits) {
    if (spec->bits || spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    codec->ops = ops;
    codec->vector_bytes = codec->head_dim * (size_t)bits / 8;
    codec->bits = bits;
    return 0;
}
size_t e8kv_quant_init_f32(e8kv_codec_t *codec, const e8kv_spec *spec) {
    return init_plain(codec, spec, &k_f32_ops, 32);
}
size_t e8kv_quant_init_f16(e8kv_codec_t *codec, const e8kv_spec *spec) {
    return init_plain(codec, spec, &k_f16_ops, 16);
}
size_t e8kv_quant_init_bf16(e8kv_codec_t *codec, const e8kv_spec *spec) {
    return init_plain(codec, spec, &k_bf16_ops, 16);
}
