/* Shared definitions of the CUDA cache (cuda_cache.cu), its append kernels (cuda_encode.cu) and its decode
 * attention (cuda_attn.cu). Page layout: doc/format.md §6. */
#ifndef E8KV_CUDA_INTERNAL_CUH
#define E8KV_CUDA_INTERNAL_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "e8kv_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* 2^(j/8), j = 0..7, correctly rounded to binary32: the e8box step table of the CPU codec (e8_box.c),
 * δ(e) = frac[e & 7] · 2^((e >> 3) − 20). One copy per translation unit (static). */
static __constant__ float c_box_frac[8] = {0x1p+0f,        0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                                           0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};

/* Element i of an input row of dtype E8KV_DTYPE_F32 / F16 / BF16, as float. */
__device__ __forceinline__ float e8kv_cuda_load_val(const void *src, size_t i, int dtype) {
    if (dtype == E8KV_DTYPE_F32) return ((const float *)src)[i];
    if (dtype == E8KV_DTYPE_F16) return __half2float(((const __half *)src)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
}

enum { FMT_BOX4 = 0, FMT_BF16 = 1, FMT_F16 = 2, FMT_E8P2 = 3, FMT_BOX3 = 4 };

/* the e8box page formats (codes of the rotated vector, steps and coset bits beside them) */
static inline __host__ __device__ bool fmt_is_box(int fmt) {
    return fmt == FMT_BOX4 || fmt == FMT_BOX3;
}

/* bytes of one vector of head_dim d in a format */
static inline size_t fmt_vector_bytes(int fmt, size_t d) {
    return fmt == FMT_BOX4   ? 1 + (d + 63) / 64 + d / 2
           : fmt == FMT_BOX3 ? 1 + (d + 63) / 64 + 3 * d / 8
           : fmt == FMT_E8P2 ? 1 + d / 4
                             : 2 * d;
}

/* e8p:2's 256 patterns (doc/format.md §2.5): W = Σ c_i·4^i, increasing, over every c ∈ {0,1,2}^8 with
 * n0 + 9·n1 + 25·n2 ≤ 40, or (n2, n0) = (2, 6), or n1 = 8 (n_c: coordinates equal to c). */
static inline void e8p_patterns(uint16_t pat[256]) {
    unsigned t = 0;
    for (unsigned w = 0; w < 65536 && t < 256; w++) {
        unsigned n[4] = {0, 0, 0, 0};
        for (int i = 0; i < 8; i++)
            n[(w >> (2 * i)) & 3u]++;
        if (!n[3] && (n[0] + 9 * n[1] + 25 * n[2] <= 40 || (n[2] == 2 && n[0] == 6) || n[1] == 8))
            pat[t++] = (uint16_t)w;
    }
}

/* ---- one block of a page vector, as the CPU decoders give it (e8kv_box_decode_ref, e8kv_e8p_decode_ref: one
 * rounded product per value), before the inverse rotation: the gather (cuda_encode.cu) and the attention over
 * head_dim 256 (cuda_attn.cu, attn_pair_kernel) read pages with these. area: the (page, KV head)'s bytes, o:
 * the token's offset in the page, b: the block (8 coordinates 8b..8b+7), bs: tokens per page, frac:
 * c_box_frac's values (a shared copy), pat: e8p:2's patterns (e8p_patterns). Raw pages: unpack8 of the
 * block's 16 bytes. */
/* 8 packed f16 (f16) or bf16 values of a 16-byte word, as floats (exact) */
__device__ __forceinline__ void unpack8(float x[8], const uint4 u, bool f16) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint16_t h = (uint16_t)(w[i / 2] >> (16 * (i & 1)));
        x[i] = f16 ? __half2float(__ushort_as_half(h)) : __bfloat162float(__ushort_as_bfloat16(h));
    }
}

/* The bytes one lane needs for block b of token o, loaded (page_load) apart from their decode (page_decode),
 * so that a kernel can have several tokens' loads in flight before it decodes any. w: e8box:4 the block's
 * nibble word (x, y); e8box:3 its 2-bit word (x, y) and 1-bit word (z, w); e8p:2 its 16-bit code (x); raw
 * pages the block's 8 values. s: the step byte, and for e8box the coset byte of the block in bits 8..15. */
struct page_raw {
    uint4 w;
    uint32_t s;
};
template <int D>
__device__ __forceinline__ void page_load(page_raw &r, int fmt, const uint8_t *area, size_t o, int b,
                                          size_t bs) {
    constexpr size_t NC = (D + 63) / 64; /* coset bytes per token */
    if (fmt == FMT_BOX4) {
        const uint2 w = *(const uint2 *)(area + o * (D / 2) + 16 * (b / 4) + 8 * (b & 1));
        r.w = make_uint4(w.x, w.y, 0u, 0u);
        r.s = area[bs * (D / 2) + o] | (uint32_t)area[bs * (D / 2) + bs + o * NC + b / 8] << 8;
    } else if (fmt == FMT_BOX3) {
        /* block b's 2-bit fields in bytes 16(b/8) + 8(b%2) + 0..7 of the 2-bit plane, bits 2·((b%8)/2); its
         * 1-bit fields in bytes 8(b%2) + 0..7 of the 1-bit plane, bit b/2 (d = 128), or bytes 0..7, bit b (d
         * = 64) */
        const uint2 w = *(const uint2 *)(area + o * (D / 4) + 16 * (b / 8) + 8 * (b & 1));
        const uint2 u = *(const uint2 *)(area + bs * (D / 4) + o * (D / 8) + (D == 64 ? 0 : 8 * (b & 1)));
        r.w = make_uint4(w.x, w.y, u.x, u.y);
        r.s = area[bs * (3 * D / 8) + o] | (uint32_t)area[bs * (3 * D / 8) + bs + o * NC + b / 8] << 8;
    } else if (fmt == FMT_E8P2) {
        r.w = make_uint4(*(const uint16_t *)(area + o * (D / 4) + 2 * b), 0u, 0u, 0u);
        r.s = area[bs * (D / 4) + o];
    } else { /* raw pages: row o of d values */
        r.w = *(const uint4 *)(area + (o * D + 8 * b) * 2);
        r.s = 0u;
    }
}
/* e8box's half step δ/2 of step byte e */
__device__ __forceinline__ float page_box_half_step(unsigned e, const float *frac) {
    return e ? __fmul_rn(frac[e & 7u], __int_as_float(((int)(e >> 3) - 21 + 127) << 23)) : 0.0f;
}
template <int D>
__device__ __forceinline__ void page_decode(float x[8], int fmt, const page_raw &r, int b, const float *frac,
                                            const uint16_t *pat) {
    if (fmt == FMT_BOX4) {
        const float h = page_box_half_step(r.s & 255u, frac);
        const int k = (int)(r.s >> (8 + b % 8)) & 1, sh = (b >> 1) & 1 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int n = (int)(((i < 4 ? r.w.x >> (8 * i) : r.w.y >> (8 * (i - 4))) >> sh) & 15u);
            x[i] = __fmul_rn((float)(2 * n - 16 + k), h);
        }
    } else if (fmt == FMT_BOX3) {
        const float h = page_box_half_step(r.s & 255u, frac);
        const int k = (int)(r.s >> (8 + b % 8)) & 1, sh = 2 * ((b & 7) >> 1), sh1 = D == 64 ? b : b >> 1;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned lo = ((i < 4 ? r.w.x >> (8 * i) : r.w.y >> (8 * (i - 4))) >> sh) & 3u;
            const unsigned hi = ((i < 4 ? r.w.z >> (8 * i) : r.w.w >> (8 * (i - 4))) >> sh1) & 1u;
            x[i] = __fmul_rn((float)(2 * (int)(lo | hi << 2) - 8 + k), h);
        }
    } else if (fmt == FMT_E8P2) {
        const unsigned code = r.w.x, e = r.s;
        const unsigned t = code & 255u, sgn = (code >> 8) & 127u, W = pat[t];
        const unsigned csum = __popc(W & 0x5555u) + 2u * __popc(W & 0xAAAAu);
        const unsigned sg = sgn | ((__popc(sgn) + csum) & 1u) << 7;
        const int shift = code >> 15 ? 1 : -1;
        const float qs = e ? __fmul_rn(frac[e & 7u], __int_as_float(((int)(e >> 3) - 22 + 127) << 23)) : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int m = 4 * (int)((W >> (2 * i)) & 3u) + 2;
            x[i] = __fmul_rn((float)(((sg >> i) & 1u ? -m : m) + shift), qs);
        }
    } else {
        unpack8(x, r.w, fmt == FMT_F16);
    }
}
/* load and decode in one (the gather) */
template <int D>
__device__ __forceinline__ void page_block(float x[8], int fmt, const uint8_t *area, size_t o, int b,
                                           size_t bs, const float *frac, const uint16_t *pat) {
    page_raw r;
    page_load<D>(r, fmt, area, o, b, bs);
    page_decode<D>(x, fmt, r, b, frac, pat);
}

/* Error flags the append kernels raise (atomicOr) */
#define FLAG_NONFINITE 1u
#define FLAG_RANGE 2u

/* One stream (K or V) of one layer: where its pages are and how they are cut. */
typedef struct {
    uint8_t *pool;     /* n_blocks pages */
    size_t n_blocks;   /* pages in the pool: an append to a slot past it writes nothing (FLAG_RANGE) */
    size_t page_bytes; /* n_head_kv * head_bytes */
    size_t head_bytes; /* block_size * vector bytes */
    int fmt;
    /* center=1 (the e8box and e8p streams of a cache without center=0): the means of this (layer, stream),
     * f32 (rows, n_head_kv, d), subtracted before coding and added back by the attention; NULL: uncentred */
    float *mu;
    /* center=rope (a K stream): per (row, KV head) RC_FLOATS floats: the means before RoPE of the RC_PAIRS
     * RoPE pairs chosen for that head (pair c: rc[2c], rc[2c + 1]), then the pairs' indices (int32 bits);
     * mu is 0 there, and a token at position p codes x − mu − R_p·μ_pairs (rope_centre below); NULL: none */
    float *rc;
    const float *cs; /* center=rope: cos, sin of position p, pair i at cs[2 (p·d/2 + i)], p < n_pos */
    int n_pos;
    /* center=rope: per row (from, off), index i ≥ from of the row's table at position i + off
     * (e8kv_cuda_set_row_shifts); NULL: position = index */
    const int32_t *shift;
} stream_desc;

/* center=rope: RC_PAIRS RoPE pairs per (row, KV head) keep a centre turned to each key's position */
#define RC_PAIRS 8
#define RC_FLOATS (3 * RC_PAIRS)

/* center=rope: the position of index i of a row whose shift is (from, off) (stream_desc.shift) */
__device__ __forceinline__ int rc_shifted(int2 sh, int i) {
    return i >= sh.x ? i + sh.y : i;
}
/* ... clamped below n_pos (the attention's table row of a sub-tile) */
__device__ __forceinline__ int rc_position(int2 sh, int i, int n_pos) {
    return min(rc_shifted(sh, i), n_pos - 1);
}
/* the row's (from, off), (0, 0) without shifts */
__device__ __forceinline__ int2 rc_shift(const int32_t *shift, int row) {
    return shift && row >= 0 ? make_int2(shift[2 * row], shift[2 * row + 1]) : make_int2(0, 0);
}

/* R_p·(a, b) for pair i: (a·C − b·S, a·S + b·C), each product rounded, no fusion (src/common/rope.c's
 * e8kv_rope_rows_ref, which the host side's e8kv_rope_apply runs) */
__device__ __forceinline__ float2 rope_turn(float a, float b, float C, float S) {
    return make_float2(__fsub_rn(__fmul_rn(a, C), __fmul_rn(b, S)), __fadd_rn(__fmul_rn(a, S), __fmul_rn(b, C)));
}

/* What an append kernel does per token besides coding it. center=1: token i of a centred stream codes
 * x − μ of row rows[i] (negative: none; rows_max or more: none, and FLAG_RANGE); rows NULL: every token
 * uncentred. sink=N: token i's exact values (before centring) also go to sink slot sink_slots[i] of `sink`
 * (f32, (n_sink_slots, n_head_kv, d); negative: none; n_sink_slots or more: not written, FLAG_RANGE); NaN/Inf
 * are refused with the codes (FLAG_NONFINITE). */
typedef struct {
    const int32_t *rows;
    const float *mu; /* the stream's means, (rows_max, n_head_kv, d) */
    size_t rows_max;
    const int64_t *sink_slots;
    float *sink;
    size_t n_sink_slots;
    /* center=rope: each token's position (n_tok int32, in [0, n_pos); else the token is RANGE) and the
     * stream's centre pairs (stream_desc.rc / cs); pos NULL on other streams */
    const int32_t *pos;
    const float *rc, *cs;
    int n_pos;
} token_args;

/* append: n_tok rows of n_head_kv * d values of dtype into slots (d_slots NULL: no page is written, e.g. the
 * sink rows alone), with `ta` (NULL: codes alone; ta->mu is the launcher's business: sd->mu) */
size_t e8kv_cu_launch_append(const stream_desc *sd, const int64_t *d_slots, const void *d_src, size_t n_tok,
                             size_t n_head_kv, size_t d, size_t block_size, int dtype, const float *d_signs,
                             float rot_scale, unsigned *d_flags, cudaStream_t stream, const token_args *ta);

/* center=1: mu (n_vals) = the mean of n_tok rows of n_vals values of dtype, summed in double in token order
 * (the CPU cache's set_means), or 0 when n_tok < E8KV_CUDA_CENTER_MIN_TOKENS */
size_t e8kv_cu_launch_means(float *mu, const void *d_src, size_t n_tok, size_t n_vals, int dtype,
                            cudaStream_t stream);
/* center=rope: after e8kv_cu_launch_means wrote mu (the means after RoPE) for n_head_kv heads of d, the
 * means before RoPE of the tokens at positions 0 .. n_tok − 1 (un-turned by cs, summed in double), and for
 * each head the RC_PAIRS pairs whose mean the one after RoPE misses most, |μ_pre|² − |μ_post|² (ties: the
 * lower pair), into rc; mu set to 0 at those pairs. n_tok < E8KV_CUDA_CENTER_MIN_TOKENS: rc of zeros, pairs
 * 0 .. RC_PAIRS − 1 (mu is then 0 too). */
size_t e8kv_cu_launch_rope_means(float *mu, float *rc, const float *cs, const void *d_src, size_t n_tok,
                                 size_t n_head_kv, size_t d, int dtype, cudaStream_t stream);

/* gather (page bytes → rows): what the attention reads at positions [0, n_tok) of n_seq sequences, written
 * as (n_seq, n_head_kv, n_tok, d) of out_dtype per stream; tables (n_seq, max_blocks) page ids (outside
 * [0, n_blocks): that vector is NaN); rows as in attn_launch (NULL: seq; outside [0, rows_max) on a stream
 * with means or sink rows: NaN); sink[s] the (layer, stream)'s sink rows (sink_n = 0: none) */
typedef struct {
    stream_desc sd[2];
    void *out[2];
    int out_dtype, sink_n;
    const int32_t *tables, *rows;
    size_t max_blocks, n_blocks, rows_max, n_seq, n_tok, n_head_kv, d, block_size;
    const float *sink[2];
    const float *signs;
    float rot_scale;
    int pair; /* head_dim 256: n_head_kv counts 128-coordinate heads, two per KV head (out: (…, d · 2)) */
} gather_launch;
size_t e8kv_cu_launch_gather(const gather_launch *g, cudaStream_t stream);

/* head_dim 256: query heads per KV head of one attention call (attn_pair_kernel and attn_box_kernel's P = 2
 * instances: merge_last's buffer holds G·d ≤ 1024 outputs) */
#define E8KV_CU_PAIR_G 4

/* d = 256 (attn_pair_kernel, attn_box_kernel's P = 2): KV head h's pages are heads 2h and 2h + 1 of k / v
 * (their head_bytes are those of 128 coordinates), each coded by the 128-coordinate transform (signs: 128
 * values, rot_scale 1/√128) */
typedef struct {
    stream_desc k, v;
    size_t n_head_kv, n_head, d, block_size, n_seq, max_blocks, n_split;
    const void *q;
    int q_dtype;
    const int32_t *block_tables, *ctx_lens;
    int table_ctx;      /* max_blocks · block_size (at most INT32_MAX): a longer context is refused (NaN) */
    const float *signs; /* rotation signs (d) */
    float rot_scale;    /* 1 / sqrtf(d) as the CPU computes it */
    float *part_o;      /* (n_seq, n_head, n_split, d) */
    float *part_ml;     /* (n_seq, n_head, n_split, 2) */
    unsigned *done;     /* (n_seq, n_head_kv): splits finished; the last one merges and sets it back to 0 */
    int v_rot;          /* V pages rotated (e8box): the merge undoes the rotation */
    float v_div;        /* the V pages' scale of P */
    float *out;         /* (n_seq, n_head, d) */
    /* each sequence's row of the sink rows and the means (k.mu, v.mu): rows[seq], or seq when NULL; a row
     * outside [0, rows_max) makes the sequence's output NaN */
    const int32_t *rows;
    int rows_max;
    /* sink=N: positions [0, min(N, ctx)) are read from the exact rows of sink_k / sink_v (f32, (row, N,
     * n_head_kv, d) for this layer) instead of the pages: split 0 computes their state (sink_state), the
     * merge adds it (merge_last); sink_n = 0: none */
    const float *sink_k, *sink_v;
    float *sink_o, *sink_ml; /* (n_seq, n_head, d) and (n_seq, n_head, 2): the sink rows' softmax state */
    int sink_n;
    /* learned attention sinks (e8kv_cuda_set_layer_sinks): a logit per query head of the layer (n_head
     * floats, the scores' natural units) joining each softmax with a zero value (merge_last); NULL: none */
    const float *lsink;
} attn_launch;

/* Partial splits for these sizes (the host and the workspace bound agree through this); split_min: tokens a
 * split takes at least (e8kv_cu_split_min). */
size_t e8kv_cu_n_split(size_t n_seq, size_t n_head_kv, size_t max_ctx, int n_sm, int ctas_per_sm,
                       size_t split_min);
/* the fewest tokens a split of the layer's attention kernel takes, for (head_dim, K format, V format) */
size_t e8kv_cu_split_min(size_t d, int kf, int vf);
/* resident blocks per SM of the attention kernel for (head_dim, K format, V format) */
int e8kv_cu_ctas_per_sm(size_t d, int kf, int vf, int rc); /* rc: a center=rope layer */
size_t e8kv_cu_launch_attend(const attn_launch *a, cudaStream_t stream);
/* FLAG_RANGE into *flags for any entry of n_seq block tables (n_seq, max_blocks) that a context reads and
 * that names no page of [0, n_blocks), and for a context < 0 or past max_blocks · block_size */
size_t e8kv_cu_launch_check_tables(const int32_t *tables, const int32_t *ctx_lens, size_t n_seq,
                                   size_t max_blocks, size_t block_size, size_t n_blocks, unsigned *flags,
                                   cudaStream_t stream);
#ifdef BOX_PROF
#define BOX_PROF_MAX 4096
/* clear: zero the stamps; else copy those of n_blocks blocks ([block][8], cuda_attn.cu says which) to host;
 * returns the count or an error (a measurement build only) */
size_t e8kv_cu_box_prof(unsigned long long *host, size_t n_blocks, int clear);
#endif

#endif
