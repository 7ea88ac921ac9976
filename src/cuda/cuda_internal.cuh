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
} gather_launch;
size_t e8kv_cu_launch_gather(const gather_launch *g, cudaStream_t stream);

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

/* Partial splits for these sizes (the host and the workspace bound agree through this). */
size_t e8kv_cu_n_split(size_t n_seq, size_t n_head_kv, size_t max_ctx, int n_sm, int ctas_per_sm);
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
