/* The internal quantizer interface behind the public codec API.
 *
 * A codec is: an optional rotation (transform/fwht.h) followed by one quantizer that maps one rotated
 * head vector to a fixed number of bytes and back. Each quantizer lives in its own file and provides an
 * init function that validates the parameters, fills `ops`, `vector_bytes` and its private `state`.
 * Codec objects are immutable after init, so encode/decode are thread-safe; scratch lives on the stack
 * (head_dim <= E8KV_MAX_HEAD_DIM). */
#ifndef E8KV_CODEC_H
#define E8KV_CODEC_H

#include "../common/common.h"
#include "../transform/fwht.h"

struct e8kv_codec;

typedef struct {
    /* Encode one finite vector of head_dim floats (already rotated when the codec rotates) into exactly
     * vector_bytes bytes. Returns 0 or an error (e.g. E8KV_ERROR_RANGE). */
    size_t (*encode)(const struct e8kv_codec *codec, uint8_t *restrict dst, const float *restrict x);
    /* Decode one vector (still in the rotated domain). Pure function of the bytes; never fails. */
    void (*decode)(const struct e8kv_codec *codec, float *restrict y, const uint8_t *restrict src);
    /* Release `state` (may be NULL). */
    void (*destroy)(struct e8kv_codec *codec);
} e8kv_quant_ops;

/* Token-group codecs (group_tokens = G > 1; their e8kv_quant_ops encode and decode are NULL): G
 * consecutive vectors of one stream are coded together into exactly G * vector_bytes bytes, so that
 * statistics may span tokens (per-channel key scales). is_key: the K stream of a cache (and the public
 * API's calls); 0 the V stream, which such a format may code per token. encode: x is (G, head_dim),
 * finite; 0 or an error. decode: tokens [t0, t0 + n) of the group at src into y (n, head_dim); a pure
 * function of the bytes that never fails. */
typedef struct {
    size_t (*encode)(const struct e8kv_codec *codec, uint8_t *restrict dst, const float *restrict x,
                     int is_key);
    void (*decode)(const struct e8kv_codec *codec, float *restrict y, const uint8_t *restrict src, size_t t0,
                   size_t n, int is_key);
} e8kv_group_ops;

/* Codec specs are at most this many characters (longer: E8KV_ERROR_SPEC, never cut). */
#define E8KV_CODEC_SPEC_MAX 63

/* Parsed spec: "family[:bits][:key=value]..." */
typedef struct {
    char family[16];
    int bits;        /* 0 when absent or not a whole number */
    int rate8;       /* the rate in eighths of a bit ("e8v:3.5" → 28), 0 when absent */
    float q_range;   /* 0 when absent */
} e8kv_spec;

struct e8kv_codec {
    char spec[E8KV_CODEC_SPEC_MAX + 1];
    size_t head_dim;
    size_t vector_bytes;
    int bits;
    float q_range;
    int rotate;
    e8kv_rot rot;
    uint64_t seed;
    const e8kv_quant_ops *ops;
    void *state;
    const e8kv_group_ops *group; /* token-group codecs only, else NULL */
    size_t group_tokens;         /* 0: vectors coded one by one; G > 1: a token-group codec */
};

typedef struct e8kv_codec e8kv_codec_t;

/* Quantizer constructors, one per file. Each validates head_dim and bits and returns 0 or an error. */
size_t e8kv_quant_init_plain(e8kv_codec_t *codec, const e8kv_spec *spec);   /* f32, f16        (codec.c) */
size_t e8kv_quant_init_q8_0(e8kv_codec_t *codec, const e8kv_spec *spec);    /* q8_0, q8_0h     (scalar.c) */
size_t e8kv_quant_init_q4_0(e8kv_codec_t *codec, const e8kv_spec *spec);    /* q4_0, q4_0h     (scalar.c) */
size_t e8kv_quant_init_lloyd(e8kv_codec_t *codec, const e8kv_spec *spec);   /* lloyd:B         (lloyd.c) */
size_t e8kv_quant_init_e8ball(e8kv_codec_t *codec, const e8kv_spec *spec);  /* e8ball:B, e8:B  (e8_ball.c) */
size_t e8kv_quant_init_e8nest(e8kv_codec_t *codec, const e8kv_spec *spec);  /* e8nest:B        (nested.c) */
size_t e8kv_quant_init_d4nest(e8kv_codec_t *codec, const e8kv_spec *spec);  /* d4nest:B        (nested.c) */
/* Peers of the literature as formats, measured side by side (BENCHMARKS.md) */
size_t e8kv_quant_init_kivi(e8kv_codec_t *codec, const e8kv_spec *spec);    /* kivi:B      (kivi.c) */
size_t e8kv_quant_init_kvquant(e8kv_codec_t *codec, const e8kv_spec *spec); /* kvquant:B   (kvquant.c) */
size_t e8kv_quant_init_e8r(e8kv_codec_t *codec, const e8kv_spec *spec);     /* e8r:B       (e8_relaxed_box.c) */
size_t e8kv_quant_init_kakeya(e8kv_codec_t *codec, const e8kv_spec *spec);  /* kakeya:q=Q  (kakeya.c) */

/* Parse a spec string; returns 0, E8KV_ERROR_SPEC, or E8KV_ERROR_RATE for a rate outside 1..16. */
size_t e8kv_spec_parse(e8kv_spec *out, const char *spec);

#endif
