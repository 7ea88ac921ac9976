/* Internal layout of the KV cache shared by kvcache.c (store, spec grammar) and attention.c (reads).
 *
 * Storage, per layer, per KV head, separately for K and V: a table of n_page_max page pointers. A page
 * holds page_tokens consecutive token vectors of one stream, contiguous, each exactly vector_bytes of
 * the stream's codec (codes and side information together, as the codec lays them out). Pages are
 * allocated on first write and freed by truncate/clear/eviction, from the cache's slab allocator
 * (pages.h), and e8kv_cache_bytes() counts the slabs it holds, so it tracks what really lives.
 *
 * A page is "raw" (the original f32 vectors) while any of its tokens is inside the full-precision recent
 * window; once the window has moved past its last token it is encoded in place of the raw copy.
 * Attention-sink positions (< n_sink) are kept exact (original f32) in a small side buffer per head;
 * their slots in the coded pages are unused. */
#ifndef E8KV_KVCACHE_H
#define E8KV_KVCACHE_H

#include "quant/codec.h"
#include "calib.h"
#include "pages.h"

#include <pthread.h>

#define E8KV_CACHE_DEFAULT_PAGE 64
/* Cache specs are at most this many bytes, with at most this many layer rules (an auto= allocation of a
 * 128-layer model needs up to 256 rules once written out as a canonical spec, persist.c). */
#define E8KV_CACHE_SPEC_MAX E8KV_CACHE_SPEC_MAX_LEN
#define E8KV_CACHE_RULES_MAX 512
#define E8KV_CACHE_MAX_CODECS 64

typedef struct {
    uint8_t *data;   /* NULL when not allocated */
    uint8_t raw;     /* 1: original f32 vectors (page_tokens * head_dim floats); 0: codec bytes */
    uint32_t slab;   /* the slab holding data (pages.h) */
} kv_page;

/* Formats with a fused page reader in attention_avx2.c (others go through the codec's decode): the
 * codec's traits.reader. */
typedef enum {
    KV_FAST_NONE = E8KV_READER_NONE,
    KV_FAST_F32 = E8KV_READER_F32,
    KV_FAST_F16 = E8KV_READER_F16,
    KV_FAST_E8BALL = E8KV_READER_E8BALL,
    KV_FAST_E8BOX = E8KV_READER_E8BOX
} kv_fast_kind;

/* Calibrated transform coding of one stream of one layer (cache spec "e8t:B", xform.c): per KV head the
 * calibration's eigenbasis P (y = P·x, klt.h) and the weights w_i = λ_i^(−1/4) applied before the stream's
 * codec (e8:B): it codes w ⊙ (P·x). Keys with the calibration's query energies code in the score domain
 * first: P·S·x with S = diag(s) and P, λ the eigenbasis of S·C·S (C the key covariance), built once per
 * calibration and RoPE setting and shared (calib.h, e8kv_calib_score). */
typedef struct {
    char spec[E8KV_CODEC_SPEC_MAX + 1]; /* the format as the spec names it ("e8t:4") */
    const float *basis; /* (n_head_kv, d, d), borrowed from the calibration (or score_owned) */
    float *w, *w_inv;   /* e8t: (n_head_kv, d) each: λ^(−1/4) and λ^(1/4) (one allocation, w owns it) */
    /* a var_coded base (e8tv): (n_head_kv) the base codec with each head's eigenvalues as the variances of
     * its coordinates (e8kv_codec_create_var), in place of w and the rotation; NULL otherwise */
    e8kv_codec **var_codec;
    const float *s;     /* score-weighted keys: (n_head_kv, 2, d) s and 1/s (borrowed like basis); else NULL */
} kv_xform;

typedef struct {
    const e8kv_codec *codec; /* owned by the cache's codec list (for e8t: its e8:B code) */
    const kv_xform *xf;      /* calibrated transform before the codec (owned by the cache), or NULL */
    size_t vector_bytes;
    int rotated;             /* reads happen in the coded domain: the codec's rotation (after xf's transform) */
    kv_fast_kind fast;
    int centered;            /* the stream's per-head mean is subtracted before coding (see kv_layer) */
    size_t group;            /* token-group codec (codec.h): G tokens coded together; 0 otherwise */
    int is_key;              /* the K stream (what a token-group codec is told) */
} kv_format;

/* Centering needs at least this many tokens in the first append of a sequence; fewer: no centering. */
#define E8KV_CACHE_CENTER_MIN_TOKENS 16

/* center=rope (the CUDA cache's key centre, include/e8kv_cuda.h, the same bytes): keys arrive after RoPE;
 * besides the mean after RoPE (k_mu), the first append gives each RoPE pair's mean before RoPE (each key
 * turned back by its position, sums in double in token order). On the E8KV_RC_PAIRS pairs where that mean's
 * energy exceeds the mean after RoPE's by most (ties: the lower pair), k_mu is 0 and a key at position p
 * codes (x − k_mu) − R_p·m, m the pair's mean before RoPE turned to p with the cos/sin RoPE uses at p
 * (e8kv_rope_apply's floats); reads add it back at the key's own position (kv_slot_pos). */
#define E8KV_RC_PAIRS 8
typedef struct {
    float m[2 * E8KV_RC_PAIRS];     /* (a, b) of each chosen pair: its mean before RoPE */
    uint32_t pair[E8KV_RC_PAIRS];   /* the chosen pairs (RoPE pair index, < head_dim / 2) */
} kv_rc;

typedef struct {
    kv_format k, v;
    size_t n_tokens;
    kv_page *k_pages;  /* (n_head_kv, n_page_max) */
    kv_page *v_pages;  /* (n_head_kv, n_page_max) */
    float *k_sink;     /* (n_head_kv, n_sink, head_dim), original f32; NULL when n_sink == 0 */
    float *v_sink;
    /* Centering (streams with fmt.centered): keys and values of LLMs share a large per-channel
     * component across tokens, which a per-vector scale would spend bits on. The mean of each head's
     * stream over the first append of a sequence (E8KV_CACHE_CENTER_MIN_TOKENS or more tokens, else 0)
     * is subtracted before coding and added back exactly on read, so it costs head_dim floats per head
     * (counted in fixed_bytes) and changes nothing but the coding error.
     * mu: (n_head_kv, head_dim) original domain; mu_read: the same in the domain reads happen in. */
    float *k_mu, *v_mu, *k_mu_read, *v_mu_read;
    kv_rc *k_rc;       /* center=rope: (n_head_kv) the turned part of K's centre; NULL otherwise */
    int mu_set;        /* the means of the current sequence are fixed */
    /* eviction (evict.c): slots [0, n_map) hold the positions pos[h * n_map + slot] of KV head h (kept
     * tokens keep their RoPE positions); slots >= n_map hold position slot + n_evicted. n_tokens counts
     * slots; the next appended token takes position n_tokens + n_evicted. */
    uint32_t *pos; /* (n_head_kv, n_map), NULL when nothing was evicted */
    size_t n_map, n_evicted;
    float evict_frac; /* fraction of the layer's tokens one eviction removes */
} kv_layer;

/* Decode attention cuts the context into slices (attention.c): at least E8KV_ATTEND_SLICE_MIN keys each,
 * at most E8KV_ATTEND_SLICES_MAX slices up to n_ctx, each leaving a partial softmax state of at most
 * E8KV_ATTEND_PART_MAX floats (n_tok·n_head·(head_dim + 2)) in the cache's scratch. */
#define E8KV_ATTEND_SLICE_MIN 1024
#define E8KV_ATTEND_SLICES_MAX 64
#define E8KV_ATTEND_PART_MAX 16384

/* ---------------------------------------------------------------- eviction (evict.c) */
typedef enum {
    KV_EVICT_NONE = 0,
    KV_EVICT_KEYKEY,
    KV_EVICT_SNAPKV,
    KV_EVICT_H2O,
    KV_EVICT_STREAM
} kv_evict_scorer;
#define E8KV_EVICT_RULES_MAX 32
typedef struct {
    int scorer;     /* kv_evict_scorer */
    float frac;     /* evict=SCORER:F */
    size_t recent;  /* recent=W: newest tokens never evicted */
    size_t obs;     /* obs=W: snapkv observation window (queries) */
    size_t budget;  /* budget=N: evict at append when a layer holds more than N tokens; 0 = never */
    size_t n_rules; /* evictA-B=F per-layer fractions, later rules win */
    uint32_t first[E8KV_EVICT_RULES_MAX], last[E8KV_EVICT_RULES_MAX];
    float rule_frac[E8KV_EVICT_RULES_MAX];
    int tuned;      /* recent=, obs=, budget= or evictA-B= was given (meaningless without evict=) */
} kv_evict_cfg;
#define E8KV_EVICT_DEFAULT_RECENT 32
#define E8KV_EVICT_DEFAULT_OBS 32

/* One spec item of the eviction grammar (key, value); 1 when the key is eviction's (0 = not ours), and
 * *err the SPEC error of a bad value. */
int e8kv_evict_parse_item(kv_evict_cfg *ev, const char *key, size_t klen, const char *val, size_t vlen,
                          size_t *err);
/* The name of a kv_evict_scorer ("" for none). */
const char *e8kv_evict_scorer_name(int scorer);
/* Append the eviction items of c's configuration to a canonical spec; bytes written or an error. */
size_t e8kv_evict_canon(const struct e8kv_cache *c, char *dst, size_t cap);
/* Position of a slot of head h. */
static inline size_t kv_slot_pos(const kv_layer *L, size_t h, size_t slot) {
    return slot < L->n_map ? L->pos[h * L->n_map + slot] : slot + L->n_evicted;
}
/* Forget a layer's eviction state (the cache was emptied). */
void e8kv_evict_reset(struct e8kv_cache *c, kv_layer *L);
/* Budget eviction after an append of n_new tokens to layer l (no-op without budget=). 0 or an error. */
size_t e8kv_evict_after_append(struct e8kv_cache *c, size_t l, size_t n_new);
/* Free every page whose first slot is >= n_keep in both streams of L (kvcache.c). */
void e8kv_cache_free_pages_from(struct e8kv_cache *c, kv_layer *L, size_t n_keep);
/* A zeroed page for pg from c's allocator (raw: f32 vectors, else f's codes); 0 or OUT_OF_MEMORY. */
size_t e8kv_cache_alloc_page(struct e8kv_cache *c, const kv_format *f, kv_page *pg, int raw);
/* Reserve nk pages of K's format fk (raw f32 pages when rk) and nv of V's, so that they come from as few
 * slabs as possible (pages.h): one reservation when both are the same size. 0, or 1 when out of memory. */
int e8kv_cache_reserve_pages(struct e8kv_cache *c, const kv_format *fk, int rk, size_t nk,
                             const kv_format *fv, int rv, size_t nv);
/* After frees: empty the sparse slabs into the others so they go back to the system (pages.h); the pages'
 * contents are unchanged, their addresses move. */
void e8kv_cache_compact_pages(struct e8kv_cache *c);

struct e8kv_cache {
    size_t n_layer, n_head_kv, head_dim, n_ctx;
    size_t page_tokens, n_page_max;
    size_t window;     /* newest tokens kept exact */
    size_t n_sink;     /* first positions kept exact */
    size_t n_threads;  /* threads of the cache's own pool, the caller's included (1: no pool) */
    e8kv_pool *pool;   /* the threads attention runs on: pool_owned or one borrowed (set_pool); NULL:
                          the caller's thread */
    e8kv_pool *pool_owned; /* made at create for n_threads > 1 */
    /* Attention scratch, made at create so that no call allocates: the slices' partial states, slice s
     * at attn_part + s·E8KV_ATTEND_PART_MAX; NULL when n_ctx fits one slice. Working memory, not counted
     * in e8kv_cache_bytes (like the pool's threads). attn_mu: one attend call at a time uses it. */
    size_t attn_slice; /* keys per context slice */
    float *attn_part;  /* (n_slice_max + 1)·E8KV_ATTEND_PART_MAX: the partials, then the prepared queries */
    struct e8kv_box_query_s *attn_boxq; /* E8KV_ATTEND_PART_MAX / (head_dim + 2) prepared e8box queries,
                                           when a layer's keys are e8box; else NULL */
    pthread_mutex_t attn_mu;
    int attn_mu_ready;
    int use_avx2;      /* fused AVX2 readers and tile kernel (e8kv_cpu_has_avx2() at create; tests flip it) */
    int use_vnni;      /* with use_avx2: the AVX-VNNI e8box tile (e8kv_cpu_has_avxvnni() at create) */
    int rope_pre;      /* keys stored before RoPE: attention applies RoPE to decoded keys */
    float rope_theta;
    int rope_neox;     /* 1: split halves (NeoX/llama.cpp NEOX), 0: interleaved pairs */
    float *rope_freqs; /* a copy of params.rope_freqs (head_dim / 2, counted in fixed_bytes), or NULL */
    int center;        /* centering: 0 off, 1 e8kv's formats (default), 2 all coded formats (center=all),
                          3 center=rope (as 1, K's centre partly turned by RoPE: kv_rc) */
    /* center=rope, the reads' cos, sin of every RoPE pair: the fine table, positions 0 .. RC_FINE − 1 as
     * head_dim rows (pair i's cos in row 2i, its sin in row 2i + 1) of RC_FINE floats, then rc_n_coarse rows
     * of positions RC_FINE·b, (head_dim / 2, 2) each; position RC_FINE·b + r is one complex product of the
     * two (e8kv_cache_rc_cos_sin; attention.c's score bias runs along r). NULL otherwise. */
    float *rc_tab;
    size_t rc_n_coarse;
    uint64_t seed;     /* rotation seed of the codecs */
    const e8kv_calib *calib; /* transform coding: the calibration (borrowed, or calib_owned) */
    e8kv_calib *calib_owned; /* the calibration of a loaded cache, owned */
    kv_xform *xforms;  /* (n_layer, 2): the e8t streams' transforms (K at 2l, V at 2l + 1), NULL if none */
    /* score-domain key transforms built for this cache alone, when the calibration's shared set is for
     * another RoPE setting (xform.c); NULL otherwise */
    e8kv_calib_score *score_owned;
    double rope_inv_freq[E8KV_MAX_HEAD_DIM / 2]; /* with has_rope: theta^(-2i/head_dim) (double like the
                                                    engine's tables), or rope_freqs[i] */
    e8kv_rope *rope;  /* with rope=pre: the keys' RoPE at attention time (src/common/rope.c); with
                         center=rope: the turns of K's centre */
    kv_layer *layers;
    e8kv_codec *codecs[E8KV_CACHE_MAX_CODECS]; /* unique codecs, owned */
    size_t n_codecs;
    kv_pages pages;          /* the allocator of every page (pages.h): its slabs are the pages' bytes */
    size_t fixed_bytes;      /* page tables, layer array, sink buffers, the struct itself */
    kv_evict_cfg ev;         /* eviction (evict.c); ev.scorer == KV_EVICT_NONE: off */
    size_t index_bytes;      /* the kept positions' index (kv_layer.pos) of every layer */
};

/* RoPE known to the cache: params.rope_theta > 0 or params.rope_freqs (rope_inv_freq holds its frequencies)
 */
static inline int kv_has_rope(const e8kv_cache *c) {
    return c->rope_theta > 0.0f || c->rope_freqs;
}
/* A RoPE object of the cache's frequencies and layout (rope_inv_freq set), or NULL and *err set: the cache's
 * own (rope=pre, center=rope), or one for a caller that needs it where the cache has none (eviction). */
e8kv_rope *kv_rope_create(const e8kv_cache *c, size_t *err);

/* head_dim / 2 when the cache was made with params.rope_freqs, else 0 */
static inline size_t kv_n_rope_freqs(const e8kv_cache *c) {
    return c->rope_freqs ? c->head_dim / 2 : 0;
}

/* Stream transforms of a format, in place on n vectors of head h (xform.c). forward: original domain →
 * the domain the codes live in (xf's W·P, then the codec's rotation); inverse: back; query: the map a
 * query needs to score keys read in the coded domain (Gᵀ with G the inverse: W⁻¹ instead of W, which
 * equals forward when there is no xf since the rotation is orthonormal). Identity for plain formats. */
void e8kv_fmt_forward(const kv_format *f, size_t h, size_t d, float *x, size_t n);
void e8kv_fmt_inverse(const kv_format *f, size_t h, size_t d, float *x, size_t n);
void e8kv_fmt_query(const kv_format *f, size_t h, size_t d, float *q, size_t n);
/* Encode one vector of head h (centred, original domain); decode one into the coded domain. */
size_t e8kv_fmt_encode(const kv_format *f, size_t h, uint8_t *dst, const float *x);
void e8kv_fmt_decode(const kv_format *f, size_t h, float *y, const uint8_t *src);

/* xform.c: the rate of a calibrated format's spec ("e8t:B", "e8tv:B") in eighths of a bit, 0 for any other
 * (or one with options); is_var: its base is var_coded. */
int e8kv_xform_rate(const char *spec, int *is_var);
/* Build the transforms of every e8t stream of c (per-layer specs in ks, vs). 0 or an error: SPEC without
 * a calibration, DIMENSION when it was made for other dimensions. */
size_t e8kv_xform_build(struct e8kv_cache *c, const char *const *ks, const char *const *vs);
void e8kv_xform_free(struct e8kv_cache *c);

/* alloc.c: rates (eighths of a bit) for n streams with coefficients c minimising Σ c_s·4^(−r_s) at mean
 * rate mean8 (rounded down to the grid), each r_s in [lo8, hi8] on the grid of step8. 0 or BAD_ARGUMENT. */
size_t e8kv_alloc_rates(int *rate8, const double *c, size_t n, int mean8, int lo8, int hi8, int step8);

/* Bytes of one page of `fmt` (raw pages hold f32). */
static inline size_t kv_page_bytes(const struct e8kv_cache *c, const kv_format *fmt, int raw) {
    return c->page_tokens * (raw ? c->head_dim * sizeof(float) : fmt->vector_bytes);
}

/* Attention tile update (online softmax) for one query against n keys/values of one tile:
 * s_j = q·k_j (q already scaled; + bias_j when bias is not NULL: center=rope), m' = max(m, max_j s_j), acc =
 * acc·e^(m-m') + sum_j e^(s_j-m') v_j, l likewise. K, V: (n, d). Reference and AVX2 twins (attention_avx2.c).
 */
void e8kv_attn_tile_ref(const float *restrict q, const float *restrict K, const float *restrict V,
                        const float *restrict bias, size_t n, size_t d, float *restrict m, float *restrict l,
                        float *restrict acc);
void e8kv_attn_tile_avx2(const float *restrict q, const float *restrict K, const float *restrict V,
                         const float *restrict bias, size_t n, size_t d, float *restrict m, float *restrict l,
                         float *restrict acc);

/* Integer-domain attention over e8box:4 pages (attn_box.c, attn_box_avx2.c), for keys read in the codec's
 * rotated domain (rope=post) and head_dim 64 or 128. A value is (δ/2)·(u − 16) with u = 2n + k, n its
 * nibble and k its block's coset bit (doc/format.md §2.4), so with the query q ≈ sq·q8 (int8, |q8| ≤ 127):
 *   q·x_j = sq·(δ_j/2)·(Σ_i q8_i·u_ji − 16·Σ_i q8_i),
 * the products summed exactly in integers, and the softmax-weighted values Σ_j w_j x_j (w_j = p_j·δ_j/2)
 * from 7-bit weights w8_j = round(127·w_j / max w) times u, also exact integers. The only approximations
 * against decoding to floats are the int8 query (error ≤ 1/254 of its largest coordinate per coordinate)
 * and the 7-bit weights (≤ 1/254 of the tile's largest weight each): far below the 4-bit code's own error
 * (tests/test_cache.c bounds it). */
#define E8KV_BOX_MAX_D 128
typedef struct e8kv_box_query_s {
    int8_t q8[E8KV_BOX_MAX_D];
    int32_t off;                           /* 16·Σ q8 */
    float sq;                              /* q ≈ sq·q8 */
    float qmu;                             /* q·(the keys' centering mean), exact; 0 without centering */
    /* coset terms of the fast tiles: ctab[c][byte] = Σ over the bits b set in coset byte c of the sum of
     * q8 over block 8c + b, minus off in ctab[0] (so a key scores 2·Σ q8·n + Σ_c ctab[c][its byte c]) */
    int32_t ctab[E8KV_BOX_MAX_D / 64][256];
} e8kv_box_query;

/* Quantize one rotated, scaled query of d values (d = 64 or 128); mu_k: the keys' mean in the read
 * domain, or NULL. */
void e8kv_box_query_init(e8kv_box_query *bq, const float *q, const float *mu_k, size_t d);
/* One tile: n ≤ 64 tokens of one page (k, v: their first vectors' bytes, vb bytes apart), n_q queries
 * sharing it; per query the online-softmax state m, l and the unnormalised accumulator acc (d floats,
 * the V read domain); mu_v the values' mean (read domain) or NULL; bias: per query 64 floats added to
 * its keys' scores (center=rope; (n_q, 64), the lanes past n 0), or NULL. _ref and _avx2 give the same
 * results up to float summation order and exp's last bits. */
void e8kv_attn_box_tile_ref(const e8kv_box_query *bq, size_t n_q, const uint8_t *k, const uint8_t *v,
                            size_t vb, size_t n, size_t d, const float *mu_v, const float *bias, float *m,
                            float *l, float *const *acc);
void e8kv_attn_box_tile_avx2(const e8kv_box_query *bq, size_t n_q, const uint8_t *k, const uint8_t *v,
                             size_t vb, size_t n, size_t d, const float *mu_v, const float *bias, float *m,
                             float *l, float *const *acc);
void e8kv_attn_box_tile_vnni(const e8kv_box_query *bq, size_t n_q, const uint8_t *k, const uint8_t *v,
                             size_t vb, size_t n, size_t d, const float *mu_v, const float *bias, float *m,
                             float *l, float *const *acc);

/* Fused readers: n consecutive coded vectors of one page -> n * d floats, bit-identical to the codec's
 * decode in its rotated domain (tests/test_cache.c checks every one against e8kv_codec_decode_rotated). */
void e8kv_cache_read_f16_avx2(float *restrict dst, const uint8_t *restrict src, size_t n, size_t d);
/* (e8ball:B: the codec's own e8kv_e8ball_decode_rows_avx2, quant/voronoi.h.) e8ball:4 reader through
 * nibble-packed tables (attn_e8_avx2.c), bit-identical to it; returns 0
 * (nothing written) when d % 64 != 0. The packed tables (NULL if a coordinate would not fit a nibble). */
int e8kv_cache_read_e8ball4_avx2(float *restrict dst, const uint8_t *restrict src, size_t n, size_t d,
                                 size_t vector_bytes);
const uint32_t *e8kv_attn_ball_nib(void);
const uint32_t *e8kv_attn_res4_nib(void);

/* y[t] += mu for n rows of d floats (the centering add-back on reads); _avx2 needs d % 8 == 0. */
void e8kv_cache_add_rows_ref(float *restrict y, const float *restrict mu, size_t n, size_t d);
void e8kv_cache_add_rows_avx2(float *restrict y, const float *restrict mu, size_t n, size_t d);

/* center=rope: RoPE's own cos, sin at positions [p0, p0 + n) into cs, (n, head_dim / 2, 2) (what codes
 * use); the reads' (within a few float roundings of them) at one position into cs (head_dim floats); the
 * turned part of head h's key centre (L->k_rc) at the position of cs, d floats in the original domain (0
 * outside the chosen pairs), into x. */
#define RC_FINE 64
void e8kv_cache_rc_exact(const struct e8kv_cache *c, size_t p0, size_t n, float *cs);
void e8kv_cache_rc_cos_sin(const struct e8kv_cache *c, size_t pos, float *cs);
/* the coarse row of block b (position RC_FINE·b: its row of rc_tab, or computed into buf past the table) */
const float *e8kv_cache_rc_coarse(const struct e8kv_cache *c, size_t b, float *buf);
/* center=rope's score bias along a run of m ≤ RC_FINE keys (attention.c, rc_bias): out[t] = Σ_k
 * rows[k][t]·a[k]
 * + rows[k][t + RC_FINE]·b[k] over the E8KV_RC_PAIRS pairs (rows[k]: pair k's cos row of the fine table from
 * the run's first r, its sin row RC_FINE further). The twins differ by float summation order only. */
void e8kv_rc_bias_run_ref(float *restrict out, const float *const *rows, const float *a, const float *b,
                          size_t m);
void e8kv_rc_bias_run_avx2(float *restrict out, const float *const *rows, const float *a, const float *b,
                           size_t m);
void e8kv_cache_rc_turned(const struct e8kv_cache *c, const kv_layer *L, size_t h, const float *cs, float *x);

/* Derive the read-domain copies of L's centering means (k_mu_read, v_mu_read) from k_mu, v_mu. */
void e8kv_cache_means_to_read_domain(const struct e8kv_cache *c, kv_layer *L);

/* Token-group formats (kv_format.group = G, dividing page_tokens): a page stays raw until it is full and
 * outside the window, then its G-token groups are coded together (kvcache.c); a coded page reopened by an
 * append after a truncate is decoded back to raw. Decode slots [slot, slot + n) of a coded page. */
void e8kv_cache_read_group(const kv_format *f, const uint8_t *page, size_t slot, size_t n,
                           float *restrict dst);

/* Decode tokens [p0, p0 + n) of one stream (K when is_k) of one head into dst (n, head_dim), in the
 * domain attention works in for that stream (see attention.c). */
void e8kv_cache_read_tokens(const struct e8kv_cache *c, const kv_layer *L, size_t head, int is_k, size_t p0,
                            size_t n, float *restrict dst);

#endif
