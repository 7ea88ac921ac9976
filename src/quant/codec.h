/* The internal quantizer interface behind the public codec API.
 *
 * A codec is: an optional rotation (transform/fwht.h) followed by one quantizer that maps one rotated
 * head vector to a fixed number of bytes and back. Each quantizer lives in its own file and provides an
 * init function that validates the parameters, fills `ops`, `vector_bytes` and its private `state`.
 * Codec objects are immutable after init, so encode/decode are thread-safe; scratch lives on the stack
 * (head_dim <= E8KV_MAX_HEAD_DIM). */
#ifndef E8KV_CODEC_H
#define E8KV_CODEC_H

#include "common/common.h"
#include "transform/fwht.h"

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

/* Per-family traits (ggml's type traits): what the cache, its transforms, persistence and attention need
 * to know about a format, read from the registry (codec.c) and copied into each codec at create, where the
 * family's init may narrow them for its parameters (a fused reader only at some rates or head sizes). Code
 * outside the registry asks these, never the family's name, so a new family touches its own file and its
 * registry entry only. */
typedef enum { /* the cache's fused page readers (attention.c); NONE: the codec's own decode */
    E8KV_READER_NONE = 0,
    E8KV_READER_F32,
    E8KV_READER_F16,
    E8KV_READER_E8BALL, /* doc/format.md §2: fp16 scale, then B bytes per 8 values, B = 2..4 */
    E8KV_READER_E8BOX
} e8kv_reader_kind;
typedef enum { /* the cache subtracts each stream's per-head mean before coding (kvcache.h) */
    E8KV_CENTER_NEVER = 0, /* plain formats: their error does not scale with the vector */
    E8KV_CENTER_ON_REQUEST, /* only with the cache's center=all: formats that keep a published semantics */
    E8KV_CENTER_DEFAULT     /* e8kv's own formats: on unless center=0 */
} e8kv_center_kind;
typedef enum {
    E8KV_PAGE_VECTOR = 0, /* every vector coded alone into vector_bytes */
    E8KV_PAGE_TOKEN_GROUP /* group_tokens vectors of a stream coded together (e8kv_group_ops) */
} e8kv_page_layout;

typedef struct {
    const char *family;
    const char *base;      /* calibrated formats: the family that codes after the transform, else NULL */
    uint8_t rotates;       /* the seeded random-sign Hadamard rotation before the quantizer */
    uint8_t center;        /* e8kv_center_kind */
    uint8_t rope_pre;      /* keys are coded before RoPE by default (when the caller gives RoPE) */
    uint8_t reader;        /* e8kv_reader_kind */
    uint8_t attn_int;      /* integer-domain attention tiles (attn_box.c) read keys and values of it */
    uint8_t layout;        /* e8kv_page_layout (set from group_tokens after the init) */
    uint8_t evictable;     /* single tokens may be removed or moved (not within a token group) */
    uint8_t calibrated;    /* a cache-level format: a calibrated transform, then `base` (xform.c); it has no
                              codec of its own */
    uint8_t var_coded;     /* per-coordinate variances may replace the rotation (e8kv_codec_create_var):
                              how a calibrated stream of `base` codes its eigenbasis coordinates */
    uint8_t auto_rates;    /* any rate on the 1/8-bit grid: auto= may allocate the streams' rates */
    uint8_t gpu;           /* e8kv_gpu_format: the CUDA cache's page format of this codec (e8box:4, e8p:2,
                              f16), NONE when the GPU has no kernel for it */
} e8kv_traits;

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
    size_t state_bytes;          /* the bytes of the tables behind state (set by the init where they matter) */
    const e8kv_group_ops *group; /* token-group codecs only, else NULL */
    size_t group_tokens;         /* 0: vectors coded one by one; G > 1: a token-group codec */
    e8kv_traits traits;          /* the family's, as the init narrowed them */
};

typedef struct e8kv_codec e8kv_codec_t;

/* Quantizer constructors, one per file. Each validates head_dim and bits and returns 0 or an error. */
size_t e8kv_quant_init_f32(e8kv_codec_t *codec, const e8kv_spec *spec);     /* f32             (codec.c) */
size_t e8kv_quant_init_f16(e8kv_codec_t *codec, const e8kv_spec *spec);     /* f16             (codec.c) */
size_t e8kv_quant_init_bf16(e8kv_codec_t *codec, const e8kv_spec *spec);    /* bf16            (codec.c) */
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

/* The traits of a codec (as its init narrowed them). */
static inline const e8kv_traits *e8kv_codec_traits(const e8kv_codec_t *codec) {
    return &codec->traits;
}
/* The registry's traits of the family a spec names (the text before its first ':'), whatever its rate
 * and options; NULL for an unknown family. */
const e8kv_traits *e8kv_family_traits(const char *spec);
/* The codec spec a calibrated format's stream codes with: its base family with the same rate and options
 * ("e8tv:3.5" → "e8v:3.5") into buf; spec itself when it is not calibrated. */
const char *e8kv_codec_base_spec(const char *spec, char buf[E8KV_CODEC_SPEC_MAX + 1]);
/* A codec of a var_coded family that codes coordinate i as having variance var[i] (head_dim values, any
 * positive scale), without the rotation: how a calibrated stream codes its eigenbasis coordinates. NULL
 * and *err as e8kv_codec_create; SPEC for a family that is not var_coded. */
e8kv_codec_t *e8kv_codec_create_var(const char *spec, size_t head_dim, const float *var, size_t *err);

#endif
