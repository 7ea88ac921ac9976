/* Fused split-K decode attention over the paged cache (one query token per sequence).
 *
 * Grid (split, kv head, sequence); a block of 4 warps owns one KV head of one sequence and all G query
 * heads that share it (GQA), so every code is read once. Warps take 16-token tiles in turn and keep their
 * own online-softmax state (FlashAttention-2 style); the block merges its warps and stores its split's
 * state (store_split), and the block that finishes a (sequence, KV head) last (an atomic ticket in the
 * workspace) merges the splits by log-sum-exp and undoes the rotation once per head: one kernel per call
 * (merge_last).
 *
 * Three split kernels share that frame: attn_box_kernel when K and V are each e8box:4 or e8box:3 (a
 * cp.async pipeline through shared memory), attn_e8p_kernel for e8p:2 pages (table decode into f16
 * subnormals), both described where they are defined, and attn_split_kernel for raw pages and e8box paired
 * with raw pages (described here).
 *
 * Both products run on the tensor cores (mma.sync m16n8k16, f32 accumulate):
 *   scores S = Q·Kᵀ: A = the query rows (rows 0..G−1 the f16/bf16 "hi" part of q, rows 8..8+G−1 the
 *     residual "lo" part, so q keeps ~22 bits; bf16 keys add a third bf16 part in one more product, so
 *     that q keeps ~24 bits there too), B = 8 tokens × 16 coordinates of K;
 *   output Oᵀ += Vᵀ·Pᵀ: A = 16 coordinates × 16 tokens of V, B = P (columns 0..G−1 hi, G..2G−1 lo when
 *     2G ≤ 8): the score fragment of a thread is exactly the P fragment it feeds (no shuffle but the lo).
 * e8box:4 codes become f16 in registers without a table: a nibble n and the block's coset bit k are
 * OR-ed into the mantissa of 1024 (0x6400 | (2n + k)) and 1040 subtracted, which gives the doubled
 * lattice coordinate 2n + k − 16 exactly; the per-vector half step multiplies the score (K) or the
 * probability (V). e8box:3 the same way with 2n + k − 8 (0x6400 | (2n + k), minus 1032), n's two low bits
 * from the 2-bit plane and its high bit from the 1-bit plane merged by one lop3 per field (box3_w). Since
 * q·k is invariant under a permutation of the coordinates, each thread decodes the coordinates its
 * 16-byte (K) / 8-byte (V) load holds (e8box:3: its loads of the two planes) and the query and output are
 * permuted to match (kdim / vdim below). q is rotated once per block (R orthonormal: q·k = Rq·Rk); V stays
 * rotated until the merge. */
#include "cuda_internal.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define WARPS 4
#define V_BOX_SCALE                                                                                          \
    256.0f /* P·h lifted out of f16 subnormals: exact power of 2, divided out at the merge                  \
            */
#define V_F16_SCALE 32768.0f /* P ≤ 1 on f16 pages: weights down to 2^-39 of the largest survive in f16 */
#define LOG2E 1.4426950408889634f
#define PAIR_G E8KV_CU_PAIR_G
#define PAIR_U 8 /* tokens whose blocks attn_pair_kernel loads at once */

template <bool BF>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    if constexpr (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* x as the pair element type (hi part) and the float it rounds to */
template <bool BF> __device__ __forceinline__ uint16_t to16(float x, float *back) {
    if constexpr (BF) {
        const __nv_bfloat16 h = __float2bfloat16_rn(x);
        *back = __bfloat162float(h);
        return __bfloat16_as_ushort(h);
    } else {
        const __half h = __float2half_rn(x);
        *back = __half2float(h);
        return __half_as_ushort(h);
    }
}
template <bool BF> __device__ __forceinline__ uint16_t hi16(float x) {
    float b;
    return to16<BF>(x, &b);
}
template <bool BF> __device__ __forceinline__ uint16_t lo16(float x) {
    float b;
    to16<BF>(x, &b);
    return to16<BF>(x - b, &b);
}
/* the third part: x − hi − lo (exact in f32), rounded; bf16 hi + lo keep only ~16 bits of x, which at
 * scores of a few hundred log2 units is an error of ~1e-3 in a weight, so bf16 keys take a third part */
template <bool BF> __device__ __forceinline__ uint16_t lo2_16(float x) {
    float b, c;
    to16<BF>(x, &b);
    to16<BF>(x - b, &c);
    return to16<BF>((x - b) - c, &c);
}
__device__ __forceinline__ uint32_t pack(uint16_t a, uint16_t b) {
    return (uint32_t)a | ((uint32_t)b << 16);
}

/* (mantissa bits | 0x6400) as f16x2 minus 1040: the doubled coordinates 2n + k − 16, exact */
__device__ __forceinline__ uint32_t box_f16x2(uint32_t bits) {
    uint32_t r;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(bits), "r"(0x64106410u));
    return r;
}

/* e8box:3: (mantissa bits | 0x6400) as f16x2 minus 1032: the doubled coordinates 2n + k − 8, exact */
__device__ __forceinline__ uint32_t box3_f16x2(uint32_t bits) {
    uint32_t r;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(bits), "r"(0x64086408u));
    return r;
}

/* e8box:3 in registers. A lane holds words of the 2-bit plane (byte i: fields j = 0..3 at bits 2j, the
 * values i + 16j (+ 64·group at d = 128)) and the words of the 1-bit plane with the same byte indices
 * (d = 128: the bit of field j of group G at bit 4G + j of byte i; d = 64: at bit 2j + c, c = which half of
 * the 16 bytes i lies in). box3_w brings field j of every byte to bits q, q + 1 and its high bit to q + 2
 * (one lop3 after shifts of x and y that the k-steps share); then one shift, one lop3 (with the coset
 * bits) and one sub per f16x2. The two halves of an f16x2 are bytes p and p + 2 of a word: two values of
 * one token (K, same block) or one value of two tokens interleaved by a byte permutation (V). */
template <int D> __device__ __forceinline__ int box3_q(int j) {
    return D == 128 ? j + 2 : j < 3 ? 2 * j : 4;
}
/* c: d = 128: 4·group (the high bits of field j at bit c + j); d = 64: the half (at bit c + 2j). L: the
 * merge as an explicit lop3 (attn_box_kernel; attn_split_kernel keeps the and/or that ptxas fuses) */
template <int D, bool L = false>
__device__ __forceinline__ uint32_t box3_w(uint32_t x, uint32_t y, int c, int j) {
    const uint32_t m = 0x03030303u << box3_q<D>(j);
    uint32_t xs, ys;
    if constexpr (D == 128) {
        xs = j < 3 ? x << (2 - j) : x >> 1;
        ys = y << (4 - c);
    } else {
        xs = j < 3 ? x : x >> 2;
        ys = j < 3 ? y << (2 - c) : y >> c;
    }
    if constexpr (L) {
        uint32_t r;
        asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(r) : "r"(xs), "r"(ys), "r"(m)); /* m ? xs : ys */
        return r;
    }
    return (xs & m) | (ys & ~m);
}
/* the f16x2 bits of field j of bytes p and p + 2 of w = box3_w(…, j); km: 0x6400 and the coset bits */
template <int D> __device__ __forceinline__ uint32_t box3_bits(uint32_t w, int j, int p, uint32_t km) {
    const int sh = box3_q<D>(j) - 1 + 8 * p;
    return ((sh >= 0 ? w >> sh : w << 1) & 0x000E000Eu) | km;
}
/* 0x6400 | coset bit sh of the low and of the high 16 bits of cc */
__device__ __forceinline__ uint32_t box3_km(uint32_t cc, int sh) {
    return ((cc >> sh) & 0x00010001u) | 0x64006400u;
}

/* e8box:3 K, lane column t4 of token tk: d = 128: bytes 8t4 … 8t4 + 7 of the 2-bit plane (group t4/2)
 * and bytes 8(t4 % 2) … of the 1-bit plane; d = 64: bytes 4t4 … and 4(t4 % 2) …; w: the 2-bit words, then
 * the 1-bit words; kc: the coset bytes in both halves */
template <int D>
__device__ __forceinline__ void box3_load_k(uint32_t *w, uint32_t &kc, const uint8_t *kb, int bs, int tk,
                                            int t4) {
    const uint8_t *const x = kb + (size_t)tk * (D / 4);
    const uint8_t *const y = kb + (size_t)bs * (D / 4) + (size_t)tk * (D / 8);
    if constexpr (D == 128) {
        const uint2 u = __ldg((const uint2 *)(x + 8 * t4)), v = __ldg((const uint2 *)(y + 8 * (t4 & 1)));
        w[0] = u.x, w[1] = u.y, w[2] = v.x, w[3] = v.y;
        kc = __ldg((const uint16_t *)(kb + (size_t)bs * (3 * D / 8) + bs + 2 * tk)) * 0x00010001u;
    } else {
        w[0] = __ldg((const uint32_t *)(x + 4 * t4));
        w[1] = __ldg((const uint32_t *)(y + 4 * (t4 & 1)));
        kc = __ldg(kb + (size_t)bs * (3 * D / 8) + bs + tk) * 0x00010001u;
    }
}
/* the B fragment of k-step s: field s % 4 of word s / 4, bytes 0, 2 (bb[0]) and 1, 3 (bb[1]) */
template <int D>
__device__ __forceinline__ void box3_kstep(const uint32_t *w, uint32_t kc, int t4, int s, uint32_t (&bb)[2]) {
    constexpr int NW = D / 64;
    const int j = s & 3, wi = s >> 2;
    const int c = D == 128 ? 4 * (t4 >> 1) : t4 >> 1, cs = D == 128 ? 8 * (t4 >> 1) + (t4 & 1) : t4 >> 1;
    const uint32_t km = box3_km(kc, cs + 2 * j), x = box3_w<D>(w[wi], w[NW + wi], c, j);
    bb[0] = box3_f16x2(box3_bits<D>(x, j, 0, km));
    bb[1] = box3_f16x2(box3_bits<D>(x, j, 1, km));
}

/* e8box:3 V, lane row g of token tv: d = 128: word g of the 2-bit plane (group g/4), word g % 4 of the
 * 1-bit plane; d = 64: bytes 2g, 2g + 1 and 2(g % 4), 2(g % 4) + 1 */
template <int D>
__device__ __forceinline__ void box3_load_v(uint32_t (&w)[2], const uint8_t *vb, int bs, int tv, int g) {
    const uint8_t *const x = vb + (size_t)tv * (D / 4);
    const uint8_t *const y = vb + (size_t)bs * (D / 4) + (size_t)tv * (D / 8);
    if constexpr (D == 128) {
        w[0] = __ldg((const uint32_t *)(x + 4 * g));
        w[1] = __ldg((const uint32_t *)(y + 4 * (g & 3)));
    } else {
        w[0] = __ldg((const uint16_t *)(x + 2 * g));
        w[1] = __ldg((const uint16_t *)(y + 2 * (g & 3)));
    }
}
/* the coset bytes of tokens tv (even) and tv + 1: the first in the low 16 bits, the second in the high */
template <int D> __device__ __forceinline__ uint32_t box3_load_vc(const uint8_t *vb, int bs, int tv) {
    const uint8_t *const side = vb + (size_t)bs * (3 * D / 8) + bs;
    if constexpr (D == 128)
        return __ldg((const uint32_t *)(side + 2 * tv));
    else
        return __byte_perm(__ldg((const uint16_t *)(side + tv)), 0u, 0x4140);
}
/* the A fragments of M-tile mt for the token pair (a, b) (words wa, wb; cosets vc): field mt % 4 of word
 * mt / 4 (d = 128), bytes p = 0 (row g, r[0]) and 1 (row g + 8, r[1]) */
template <int D>
__device__ __forceinline__ void box3_vtile(const uint32_t (&wa)[2], const uint32_t (&wb)[2], uint32_t vc,
                                           int g, int mt, uint32_t (&r)[2]) {
    const int j = mt & 3, sel = D == 128 && (mt >> 2) ? 0x7632 : 0x5410;
    const int c = D == 128 ? 4 * (g >> 2) : g >> 2, cs = D == 128 ? 8 * (g >> 2) + ((g & 3) >> 1) : g >> 2;
    const uint32_t km = box3_km(vc, cs + 2 * j),
                   x = box3_w<D>(__byte_perm(wa[0], wb[0], sel), __byte_perm(wa[1], wb[1], sel), c, j);
    r[0] = box3_f16x2(box3_bits<D>(x, j, 0, km));
    r[1] = box3_f16x2(box3_bits<D>(x, j, 1, km));
}

/* coordinate of query column kk (0..15) of k-step s for lane column t4 (see the file comment) */
template <int D, int KF> __device__ __forceinline__ int kdim(int t4, int s, int kk) {
    const int upper = kk >> 3, r = kk & 1;
    if constexpr (KF == FMT_BOX4) {
        const int B = (D / 8) * t4 + 4 * (s >> 1) + upper + 2 * r;
        return 32 * (B >> 4) + (B & 15) + 16 * (s & 1);
    } else if constexpr (KF == FMT_BOX3) {
        /* box3_kstep: byte 2r + upper of the lane's word s / 4, field s % 4 */
        if constexpr (D == 128)
            return 64 * (t4 >> 1) + 16 * (s & 3) + 8 * (t4 & 1) + 4 * (s >> 2) + 2 * r + upper;
        else
            return 16 * s + 4 * t4 + 2 * r + upper;
    } else {
        return (D / 4) * t4 + 4 * s + 2 * upper + r;
    }
}
/* coordinate of output row g (hi = row g + 8) of M-tile mt */
template <int D, int VF> __device__ __forceinline__ int vdim(int g, int mt, int hi) {
    if constexpr (VF == FMT_BOX4) {
        const int B = (D / 16) * g + mt;
        return 32 * (B >> 4) + (B & 15) + 16 * hi;
    } else if constexpr (VF == FMT_BOX3) {
        /* box3_vtile: byte 2(mt / 4) + hi of the lane's word, field mt % 4 */
        if constexpr (D == 128)
            return 64 * (g >> 2) + 16 * (mt & 3) + 4 * (g & 3) + 2 * (mt >> 2) + hi;
        else
            return 16 * mt + 2 * g + hi;
    } else {
        return (D / 8) * g + 2 * mt + hi;
    }
}

/* The bytes one lane needs for one 16-token tile, loaded as wide as the layout allows:
 *   K: tokens g and 8 + g (the B operand), 16 B (d = 128) / 8 B (d = 64) of nibbles each, or 64 / 32 B raw;
 *      their coset bytes; the steps of tokens 2t4, 2t4 + 1 and 2t4 + 8, 2t4 + 9 (the score columns);
 *   V: tokens 2t4, 2t4 + 1, 2t4 + 8, 2t4 + 9 (the A operand), 8 / 4 B of nibbles each, or 32 / 16 B raw;
 *      their coset bytes and steps.
 * e8box:3: 8 + 8 B (d = 128) / 4 + 4 B (d = 64) of the two planes per K token, 4 + 4 B / 2 + 2 B per V
 * token (box3_load_k, box3_load_v). */
template <int D, int KF, int VF> struct tile_regs {
    uint32_t kw[2][KF == FMT_BOX4 || KF == FMT_BOX3 ? D / 32 : D / 8];
    uint32_t vw[4][VF == FMT_BOX4 ? (D / 64 > 0 ? D / 64 : 1) : VF == FMT_BOX3 ? 2 : D / 16];
    uint32_t kc[2], ks[2], vc[2], vs[2];
};

/* A context longer than the sequence's table (max_blocks · block_size) is read only up to the table's end and
 * its output is NaN (merge_last): no row reads another row's entries. Page ids are not checked
 * here (a check in the loops costs ~10%): e8kv_cuda_check_tables_async does that. */
__device__ __forceinline__ int table_ctx(const attn_launch &a, int seq) {
    return min(a.ctx_lens[seq], a.table_ctx);
}

template <int D, int KF, int VF>
__device__ __forceinline__ void load_tile(tile_regs<D, KF, VF> &r, const attn_launch &a, const int32_t *table,
                                          int kvh, int tile0, int g, int t4) {
    const int bs = (int)a.block_size, page = table[tile0 / bs], o0 = tile0 % bs;
    const uint8_t *const kb = a.k.pool + (size_t)page * a.k.page_bytes + (size_t)kvh * a.k.head_bytes;
    const uint8_t *const vb = a.v.pool + (size_t)page * a.v.page_bytes + (size_t)kvh * a.v.head_bytes;
    constexpr int NC = (D + 63) / 64;
#pragma unroll
    for (int tt = 0; tt < 2; tt++) {
        const int tk = o0 + 8 * tt + g;
        if constexpr (KF == FMT_BOX4) {
            if constexpr (D == 128) {
                const uint4 u = __ldg((const uint4 *)(kb + (size_t)tk * (D / 2) + 16 * t4));
                r.kw[tt][0] = u.x, r.kw[tt][1] = u.y, r.kw[tt][2] = u.z, r.kw[tt][3] = u.w;
            } else {
                const uint2 u = __ldg((const uint2 *)(kb + (size_t)tk * (D / 2) + 8 * t4));
                r.kw[tt][0] = u.x, r.kw[tt][1] = u.y;
            }
            const uint8_t *const side = kb + (size_t)bs * (D / 2);
            r.kc[tt] = NC == 2 ? __ldg((const uint16_t *)(side + bs + 2 * tk)) : __ldg(side + bs + tk);
            r.ks[tt] = __ldg((const uint16_t *)(side + o0 + 8 * tt + 2 * t4));
        } else if constexpr (KF == FMT_BOX3) {
            box3_load_k<D>(r.kw[tt], r.kc[tt], kb, bs, tk, t4);
            r.ks[tt] = __ldg((const uint16_t *)(kb + (size_t)bs * (3 * D / 8) + o0 + 8 * tt + 2 * t4));
        } else {
            const uint4 *const p4 = (const uint4 *)(kb + ((size_t)tk * D + (D / 4) * t4) * 2);
#pragma unroll
            for (int i = 0; i < D / 32; i++) {
                const uint4 u = __ldg(p4 + i);
                r.kw[tt][4 * i] = u.x, r.kw[tt][4 * i + 1] = u.y, r.kw[tt][4 * i + 2] = u.z,
                             r.kw[tt][4 * i + 3] = u.w;
            }
        }
    }
    const int tv[4] = {o0 + 2 * t4, o0 + 2 * t4 + 1, o0 + 2 * t4 + 8, o0 + 2 * t4 + 9};
    if constexpr (VF == FMT_BOX4) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (D == 128) {
                const uint2 u = __ldg((const uint2 *)(vb + (size_t)tv[i] * (D / 2) + 8 * g));
                r.vw[i][0] = u.x, r.vw[i][1] = u.y;
            } else {
                r.vw[i][0] = __ldg((const uint32_t *)(vb + (size_t)tv[i] * (D / 2) + 4 * g));
            }
        }
        const uint8_t *const side = vb + (size_t)bs * (D / 2);
#pragma unroll
        for (int pr = 0; pr < 2; pr++) {
            r.vc[pr] = NC == 2 ? __ldg((const uint32_t *)(side + bs + 2 * tv[2 * pr]))
                               : __ldg((const uint16_t *)(side + bs + tv[2 * pr]));
            r.vs[pr] = __ldg((const uint16_t *)(side + tv[2 * pr]));
        }
    } else if constexpr (VF == FMT_BOX3) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            box3_load_v<D>(r.vw[i], vb, bs, tv[i], g);
#pragma unroll
        for (int pr = 0; pr < 2; pr++) {
            r.vc[pr] = box3_load_vc<D>(vb, bs, tv[2 * pr]);
            r.vs[pr] = __ldg((const uint16_t *)(vb + (size_t)bs * (3 * D / 8) + tv[2 * pr]));
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 *const p4 = (const uint4 *)(vb + ((size_t)tv[i] * D + (D / 8) * g) * 2);
#pragma unroll
            for (int j = 0; j < D / 64; j++) {
                const uint4 u = __ldg(p4 + j);
                r.vw[i][4 * j] = u.x, r.vw[i][4 * j + 1] = u.y, r.vw[i][4 * j + 2] = u.z,
                            r.vw[i][4 * j + 3] = u.w;
            }
        }
    }
}

/* The unnormalised Hadamard transform of one row held by a warp: lane l has coordinates 32j + l in v[j].
 * Butterflies in the order h = 1, 2, …, D/2 (those below 32 across lanes, the others within a lane). */
template <int D> __device__ __forceinline__ void fwht_warp(float (&v)[D / 32]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int h = 1; h < 32 && h < D; h *= 2)
#pragma unroll
        for (int j = 0; j < D / 32; j++) {
            const float o = __shfl_xor_sync(0xffffffffu, v[j], h);
            v[j] = lane & h ? o - v[j] : v[j] + o;
        }
#pragma unroll
    for (int hj = 1; hj < D / 32; hj *= 2)
#pragma unroll
        for (int j = 0; j < D / 32; j++)
            if (!(j & hj)) {
                const float u = v[j], w = v[j + hj];
                v[j] = u + w, v[j + hj] = u - w;
            }
}

/* The unnormalised Hadamard transform of rows 0..G−1 of x, in place, a warp per row (no barrier between the
 * butterflies); the block must be synchronised before and is after. */
template <int D> __device__ __forceinline__ void fwht_rows(float (*x)[D], int G) {
    for (int r = threadIdx.x >> 5; r < G; r += blockDim.x >> 5) {
        float v[D / 32];
#pragma unroll
        for (int j = 0; j < D / 32; j++)
            v[j] = x[r][32 * j + (threadIdx.x & 31)];
        fwht_warp<D>(v);
#pragma unroll
        for (int j = 0; j < D / 32; j++)
            x[r][32 * j + (threadIdx.x & 31)] = v[j];
    }
    __syncthreads();
}

/* The query rows of the G heads of (seq, KV head kvh) into sq, a warp per row; with rot, times the rotation
 * signs and through the Hadamard transform (the rotated domain of the code pages). Ends with the block
 * synchronised. */
/* P = 2: query rows of 2D coordinates whose halves are rotated by the D-point transform each (head_dim 256
 * kept as two heads of 128) */
template <int D, int P = 1>
__device__ __forceinline__ void load_query(const attn_launch &a, int seq, int kvh, int G, bool rot,
                                           float (*sq)[D * P]) {
    const int lane = threadIdx.x & 31;
    for (int r = threadIdx.x >> 5; r < G; r += blockDim.x >> 5) {
        const size_t row = ((size_t)seq * a.n_head + (size_t)kvh * G + r) * (D * P);
#pragma unroll
        for (int h = 0; h < P; h++) {
            float v[D / 32];
#pragma unroll
            for (int j = 0; j < D / 32; j++) {
                const int i = 32 * j + lane;
                v[j] = e8kv_cuda_load_val(a.q, row + D * h + i, a.q_dtype);
                if (rot) v[j] *= a.signs[i];
            }
            if (rot) fwht_warp<D>(v);
#pragma unroll
            for (int j = 0; j < D / 32; j++)
                sq[r][D * h + 32 * j + lane] = v[j];
        }
    }
    __syncthreads();
}

/* Where the P fragment of a thread comes from when the score fragment of row g is the P fragment of column g
 * (attn_split_kernel, attn_e8p_kernel): src/kind: the hi part of row g (kind 0), the lo part of row g − G in
 * columns G..2G−1 when 2G ≤ 8 (kind 1), or nothing (2); col_row[c]: the head of output column 2t4 + c. */
struct p_cols {
    int src, kind, col_row[2];
};
__device__ __forceinline__ p_cols p_columns(int lane, int G, bool LO) {
    const int g = lane >> 2, t4 = lane & 3;
    p_cols p;
    p.src = g < G ? lane : (LO && g < 2 * G) ? (g - G) * 4 + t4 : lane;
    p.kind = g < G ? 0 : (LO && g < 2 * G) ? 1 : 2;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int col = 2 * t4 + c;
        p.col_row[c] = col < G ? col : (LO && col < 2 * G) ? col - G : 0;
    }
    return p;
}
/* P of tokens 8tt + 2t4 + c of row g (pv[tt][c]) → the B fragments of Oᵀ += Vᵀ·Pᵀ: pb (hi parts, and the lo
 * parts in columns G..2G−1 when 2G ≤ 8) and pl (lo parts of rows g < G, for a second product when 2G > 8) */
template <bool BF>
__device__ __forceinline__ void p_fragments(const float (&pv)[2][2], const p_cols &pc, int g, int G,
                                            uint32_t (&pb)[2], uint32_t (&pl)[2]) {
#pragma unroll
    for (int tt = 0; tt < 2; tt++) {
        const float x0 = __shfl_sync(0xffffffffu, pv[tt][0], pc.src),
                    x1 = __shfl_sync(0xffffffffu, pv[tt][1], pc.src);
        pb[tt] = pc.kind == 0   ? pack(hi16<BF>(x0), hi16<BF>(x1))
                 : pc.kind == 1 ? pack(lo16<BF>(x0), lo16<BF>(x1))
                                : 0u;
        pl[tt] = g < G ? pack(lo16<BF>(x0), lo16<BF>(x1)) : 0u;
    }
}
/* output fragments (columns 2t4, 2t4 + 1) times their heads' softmax rescale factors */
template <int N> __device__ __forceinline__ void scale_cols(float (&o)[N][4], float al0, float al1) {
#pragma unroll
    for (int mt = 0; mt < N; mt++) {
        o[mt][0] *= al0, o[mt][2] *= al0;
        o[mt][1] *= al1, o[mt][3] *= al1;
    }
}

/* The row of sequence seq in the sink rows and the means (the caller's, else seq itself), or -1 when it is
 * out of range (the sequence's output is then NaN: merge_last) */
__device__ __forceinline__ int seq_row(const attn_launch &a, int seq) {
    const int row = a.rows ? a.rows[seq] : seq;
    return row >= 0 && row < a.rows_max ? row : -1;
}

/* sink=N: split 0's block asks for its sink rows (to L1) at entry, before its first copies queue up ahead of
 * them; sink_state reads them later */
template <int D>
__device__ __forceinline__ void sink_prefetch(const attn_launch &a, int seq, int kvh, int split) {
    if (!a.sink_n || split) return;
    const int ns = min(a.sink_n, a.ctx_lens[seq]), row = seq_row(a, seq);
    if (ns <= 0 || row < 0) return;
    constexpr int LPR = D * 4 / 128; /* 128-byte lines per row */
    for (int i = threadIdx.x; i < 2 * ns * LPR; i += blockDim.x) {
        const int j = (i / LPR) % ns;
        const float *const p = (i < ns * LPR ? a.sink_k : a.sink_v) +
                               ((size_t)row * a.sink_n * a.n_head_kv + (size_t)j * a.n_head_kv + kvh) * D +
                               32 * (i % LPR);
        asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    }
}

/* sink=N: the softmax state of a (sequence, KV head)'s G heads over its exact sink rows (positions
 * 0 .. min(N, ctx) − 1, f32, in the output's domain), a warp per head, stored to sink_o / sink_ml for
 * merge_last. Split 0's block runs it while its first tiles are in flight. */
template <int D> __device__ __forceinline__ void sink_state(const attn_launch &a, int seq, int kvh, int G) {
    constexpr int PL = D / 32;
    const int ns = min(a.sink_n, a.ctx_lens[seq]), row = seq_row(a, seq);
    if (ns <= 0 || row < 0) return; /* merge_last: no sink, or a NaN output */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t srow = (size_t)row * a.sink_n * a.n_head_kv + (size_t)kvh;
    const float scale = rsqrtf((float)D) * LOG2E;
    for (int r = warp; r < G; r += WARPS) {
        const size_t h = (size_t)seq * a.n_head + (size_t)kvh * G + r;
        float q[PL], o[PL], m = -INFINITY, l = 0.0f;
#pragma unroll
        for (int k = 0; k < PL; k++)
            q[k] = e8kv_cuda_load_val(a.q, h * D + lane + 32 * k, a.q_dtype), o[k] = 0.0f;
#pragma unroll 4
        for (int j = 0; j < ns; j++) {
            const float *const kr = a.sink_k + (srow + (size_t)j * a.n_head_kv) * D + lane;
            const float *const vr = a.sink_v + (srow + (size_t)j * a.n_head_kv) * D + lane;
            float dot = 0.0f, v[PL];
#pragma unroll
            for (int k = 0; k < PL; k++)
                dot += q[k] * __ldg(kr + 32 * k), v[k] = __ldg(vr + 32 * k);
            for (int x = 16; x; x >>= 1)
                dot += __shfl_xor_sync(0xffffffffu, dot, x);
            dot *= scale;
            const float mn = fmaxf(m, dot), al = exp2f(m - mn), p = exp2f(dot - mn);
            l = l * al + p;
#pragma unroll
            for (int k = 0; k < PL; k++)
                o[k] = o[k] * al + p * v[k];
            m = mn;
        }
#pragma unroll
        for (int k = 0; k < PL; k++)
            a.sink_o[h * D + lane + 32 * k] = o[k];
        if (lane == 0) a.sink_ml[2 * h] = m, a.sink_ml[2 * h + 1] = l;
    }
}

/* The split-K merge, fused: every block stores its partial state, then takes a ticket; the block that
 * finishes a (sequence, KV head) last merges its n_split states for the G heads (log-sum-exp), undoes
 * the V rotation and writes the output, and sets the counter back to 0 for the next call. The states
 * are read across the warps (split s by warp s mod WARPS, 16-byte loads), so the merge costs a few
 * L2 round trips instead of a second kernel that walks n_split states in a loop. buf: WARPS × 8 × D
 * floats of shared memory that the caller no longer uses, 16-byte aligned (read and written as float4). */
template <int D, bool SK>
__device__ __forceinline__ void merge_last(const attn_launch &a, int seq, int kvh, int G,
                                           float (*buf)[8][D]) {
    __shared__ float sM[8], sL[8], sW[8], sLc[8];
    __shared__ int s_last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n = (int)a.n_split;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned *const cnt = a.done + (size_t)seq * a.n_head_kv + kvh;
        const int last = atomicAdd(cnt, 1u) == (unsigned)n - 1;
        if (last) *cnt = 0;
        s_last = last;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const size_t head0 = (size_t)seq * a.n_head + (size_t)kvh * G;
    /* sink=N: the sink rows' state (sink_state, stored by split 0) joins the splits'. center=1: the pages
     * hold x − μ of the sequence's row; the scores of the coded keys lack q·μ_k (the sink state is shifted
     * down by it instead: only differences count), and the coded part of the output lacks μ_v */
    bool sink = false, bad_row = false;
    int row = -1;
    if ((SK || a.k.mu || a.v.mu) && a.ctx_lens[seq] > 0) {
        row = seq_row(a, seq);
        bad_row = row < 0;
        sink = SK && !bad_row;
    }
    /* max and denominator per head: warp r mod WARPS walks head r's splits */
    for (int r = warp; r < G; r += WARPS) {
        const float2 *const ml = reinterpret_cast<const float2 *>(a.part_ml) + (head0 + r) * n;
        float M = -INFINITY;
        for (int s = lane; s < n; s += 32)
            M = fmaxf(M, __ldcg(&ml[s]).x);
        /* q·μ_k in the scores' units (log2, scaled): what the coded keys' scores lack, taken off the exact
         * states that join them (sink rows, a learned sink) */
        float qmu = 0.0f;
        if (a.k.mu && row >= 0 && (sink || a.lsink)) {
            const float *const mu = a.k.mu + ((size_t)row * a.n_head_kv + kvh) * D;
            float dot = 0.0f;
            for (int i = lane; i < D; i += 32)
                dot += e8kv_cuda_load_val(a.q, (head0 + r) * D + i, a.q_dtype) * mu[i];
            for (int o = 16; o; o >>= 1)
                dot += __shfl_xor_sync(0xffffffffu, dot, o);
            qmu = dot * (rsqrtf((float)D) * LOG2E);
        }
        float2 sml = make_float2(-INFINITY, 0.0f);
        if constexpr (SK) {
            if (sink) sml = __ldcg(reinterpret_cast<const float2 *>(a.sink_ml) + head0 + r);
            sml.x -= qmu;
            M = fmaxf(M, sml.x);
        }
        /* a learned sink: a score of its own with a zero value (the denominator alone); NaN: a NaN output */
        const float ls = a.lsink ? __ldg(&a.lsink[kvh * G + r]) * LOG2E - qmu : -INFINITY;
        M = fmaxf(M, ls);
        for (int o = 16; o; o >>= 1)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float L = 0.0f;
        if (M != -INFINITY)
            for (int s = lane; s < n; s += 32) {
                const float2 v = __ldcg(&ml[s]);
                L += exp2f(v.x - M) * v.y;
            }
        for (int o = 16; o; o >>= 1)
            L += __shfl_xor_sync(0xffffffffu, L, o);
        float sw = 0.0f, Lc = L; /* the sink state's weight; the coded positions' share of L */
        if constexpr (SK) {
            sw = M != -INFINITY ? exp2f(sml.x - M) : 0.0f;
            L += sw * sml.y;
        }
        if (a.lsink && M != -INFINITY) L += exp2f(ls - M);
        if (lane == 0) {
            sM[r] = M, sL[r] = L, sLc[r] = Lc;
            if constexpr (SK) sW[r] = sw;
        }
    }
    __syncthreads();
    /* Σ_s w_s·O_s over F = G·D/4 float4 outputs: thread t owns outputs f = t mod F (+ 128) and the splits
     * s ≡ t / F (mod NG), NG = 128 / F groups; 8 splits' loads in flight per output before any sum */
    const int F = G * D / 4, NG = F < 128 ? 128 / F : 1, grp = F < 128 ? tid / F : 0;
    constexpr int U = 8;
    float4 acc[2];
    float *const bufp = &buf[0][0][0];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int f = (F < 128 ? tid % F : tid) + 128 * e;
        acc[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (f >= F || grp >= NG) continue;
        const int r = f / (D / 4);
        const float Mr = sM[r];
        if (Mr == -INFINITY) continue;
        const size_t hs = (head0 + r) * n;
        for (int s0 = grp; s0 < n; s0 += U * NG) {
            float4 o[U];
            float m[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int s = s0 + u * NG;
                if (s < n) {
                    m[u] = __ldcg(&a.part_ml[2 * (hs + s)]);
                    o[u] = __ldcg(reinterpret_cast<const float4 *>(a.part_o + (hs + s) * D) + f % (D / 4));
                } else {
                    m[u] = -INFINITY;
                    o[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float w = exp2f(m[u] - Mr);
                acc[e].x += w * o[u].x, acc[e].y += w * o[u].y, acc[e].z += w * o[u].z,
                    acc[e].w += w * o[u].w;
            }
        }
    }
    /* group g's sums at bufp[g·F·4 …] (NG·F ≤ 256 float4s: within WARPS × 8 × D floats) */
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int f = (F < 128 ? tid % F : tid) + 128 * e;
        if (f < F && grp < NG) reinterpret_cast<float4 *>(bufp)[grp * F + f] = acc[e];
    }
    __syncthreads();
    /* sum over the groups and divide, in place (output idx = r·D + i is buf[0][r][i]); then the inverse
     * rotation in buf[0] */
    for (int idx = tid; idx < G * D; idx += blockDim.x) {
        float O = 0.0f;
        for (int gi = 0; gi < NG; gi++)
            O += bufp[gi * G * D + idx];
        const float L = sL[idx / D];
        bufp[idx] = L > 0.0f ? O / (L * a.v_div) : 0.0f;
    }
    __syncthreads();
    if (a.v_rot) {
        if constexpr (D == 256) /* two heads of 128 (attn_pair_kernel): each half its own transform */
            fwht_rows<128>(reinterpret_cast<float(*)[128]>(&buf[0][0][0]), 2 * G);
        else
            fwht_rows<D>(buf[0], G);
    }
    for (int idx = tid; idx < G * D; idx += blockDim.x) {
        const int r = idx / D, i = idx % D;
        float o = a.v_rot ? buf[0][r][i] * a.rot_scale * a.signs[D == 256 ? i & 127 : i] : buf[0][r][i];
        if (sink && sL[r] > 0.0f)
            o += sW[r] * __ldcg(&a.sink_o[(head0 + r) * D + i]) / sL[r]; /* output domain */
        if (a.v.mu && row >= 0 && sL[r] > 0.0f)
            o += a.v.mu[((size_t)row * a.n_head_kv + kvh) * D + i] * (sLc[r] / sL[r]);
        a.out[(head0 + r) * D + i] =
            bad_row || a.ctx_lens[seq] > a.table_ctx ? __int_as_float(0x7fc00000) : o;
    }
}

/* A block's warps merged into its split's state: warp w's running maximum and sum of head r are sm[w][r] and
 * sl[w][r], its (unnormalised) output for head r, coordinate i is o(w, r, i); part_o / part_ml get the
 * log-sum-exp combination of the warps. */
template <int D, typename F>
__device__ __forceinline__ void store_split(const attn_launch &a, int seq, int kvh, int G, int split,
                                            const float (*sm)[8], const float (*sl)[8], F o) {
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int r = idx / D, i = idx % D;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; w++)
            M = fmaxf(M, sm[w][r]);
        float O = 0.0f, L = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < WARPS; w++) {
                const float wt = exp2f(sm[w][r] - M);
                O += wt * o(w, r, i);
                L += wt * sl[w][r];
            }
        const size_t base = ((size_t)seq * a.n_head + (size_t)kvh * G + r) * a.n_split + split;
        a.part_o[base * D + i] = O;
        if (i == 0) {
            a.part_ml[2 * base] = M;
            a.part_ml[2 * base + 1] = L;
        }
    }
}

template <int D, int KF, int VF, bool SK>
__global__ void __launch_bounds__(128, 3) attn_split_kernel(const attn_launch a) {
    constexpr int KS = D / 16; /* k-steps of the scores = M-tiles of the output */
    constexpr bool KBF = KF == FMT_BF16, VBF = VF == FMT_BF16;
    __shared__ float sq[8][D];
    __shared__ float sh[256];
    __shared__ __align__(16) float so[WARPS][8][D]; /* merge_last's buffer: float4 accesses */
    __shared__ float sm[WARPS][8], sl[WARPS][8];

    const int split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
    const int G = (int)(a.n_head / a.n_head_kv);
    const bool LO = 2 * G <= 8;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int n_split = (int)a.n_split;
    const int ctx = table_ctx(a, seq);
    const int chunk = ((ctx + n_split - 1) / n_split + 15) & ~15;
    const int start = split * chunk, end = min(start + chunk, ctx);
    /* positions [0, lo) are sink rows (merge_last): masked here like those past the end; a position p is
     * read when (unsigned)(p - lo) < span */
    const int lo = SK ? min(a.sink_n, ctx) : 0;
    const unsigned span = end > lo ? (unsigned)(end - lo) : 0u;
    const int32_t *const table = a.block_tables + (size_t)seq * a.max_blocks;

    if (SK) sink_prefetch<D>(a, seq, kvh, split);
    for (int i = tid; i < 256; i += blockDim.x)
        sh[i] = i ? c_box_frac[i & 7] * __int_as_float(((i >> 3) - 21 + 127) << 23) : 0.0f; /* δ/2 */
    if (SK && split == 0) sink_state<D>(a, seq, kvh, G);
    load_query<D>(a, seq, kvh, G, fmt_is_box(KF), sq);
    const float qscale = (fmt_is_box(KF) ? a.rot_scale : 1.0f) * rsqrtf((float)D) * LOG2E;
    /* bf16 keys: the third part of q in rows 0..G−1 of a second A (rows 8..15 zero), one more product per
     * k-step; there both A fragments are read from shared memory at each k-step, since the registers of
     * the raw tiles leave no room for a third set (a spill otherwise) */
    uint32_t qa[KBF ? 1 : KS][4];
    __shared__ uint4 sqa[KBF ? KS : 1][32];
    __shared__ uint2 sq3[KBF ? KS : 1][32];
#pragma unroll
    for (int s = 0; s < KS; s++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int kk = ((j & 2) ? 8 : 0) + 2 * t4;
            uint32_t w = 0, w3 = 0;
            if (g < G) {
                const float x0 = sq[g][kdim<D, KF>(t4, s, kk)] * qscale,
                            x1 = sq[g][kdim<D, KF>(t4, s, kk + 1)] * qscale;
                w = (j & 1) ? pack(lo16<KBF>(x0), lo16<KBF>(x1)) : pack(hi16<KBF>(x0), hi16<KBF>(x1));
                if (KBF && !(j & 1)) w3 = pack(lo2_16<KBF>(x0), lo2_16<KBF>(x1));
            }
            if constexpr (KBF) {
                if (warp == 0) {
                    reinterpret_cast<uint32_t *>(&sqa[s][lane])[j] = w;
                    if (!(j & 1)) reinterpret_cast<uint32_t *>(&sq3[s][lane])[j >> 1] = w3;
                }
            } else {
                qa[s][j] = w;
            }
        }
    if constexpr (KBF) __syncthreads();

    float m = -INFINITY, l = 0.0f;
    float oacc[KS][4];
#pragma unroll
    for (int mt = 0; mt < KS; mt++)
        oacc[mt][0] = oacc[mt][1] = oacc[mt][2] = oacc[mt][3] = 0.0f;
    const p_cols pc = p_columns(lane, G, LO);

    /* the loop is software-pipelined for the code formats: the next tile's bytes are in flight while this
     * one is decoded (raw pages hold 4x the registers and stay unpipelined) */
    constexpr bool PIPE = (KF == FMT_BOX4 || KF == FMT_BOX3) && (VF == FMT_BOX4 || VF == FMT_BOX3);
    /* the first block of a K lane's bytes (its coset bit is bit 0 after this shift) */
    const int kshift = (32 * (((D / 8) * t4) >> 4) + (((D / 8) * t4) & 15)) >> 3;
    tile_regs<D, KF, VF> cur, nxt;
    int tile0 = start + 16 * warp;
    if (tile0 < end) load_tile<D, KF, VF>(cur, a, table, kvh, tile0, g, t4);
    for (; tile0 < end; tile0 += 16 * WARPS) {
        const int next0 = tile0 + 16 * WARPS;
        if (PIPE && next0 < end) load_tile<D, KF, VF>(nxt, a, table, kvh, next0, g, t4);
        /* ---- scores: row g, tokens 8tt + 2t4 + c. Four independent accumulator chains (token tile ×
         * k-step parity) so the tensor-core latency overlaps instead of serialising 8 products per chain. */
        float sc[2][2];
        float acc[2][2][4];
#pragma unroll
        for (int tt = 0; tt < 2; tt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                acc[tt][h][0] = acc[tt][h][1] = acc[tt][h][2] = acc[tt][h][3] = 0.0f;
#pragma unroll
        for (int s = 0; s < KS; s++) {
            /* bf16 keys: this k-step's two A fragments, volatile so that they stay in the loop */
            uint32_t qk[4], q3[4] = {0u, 0u, 0u, 0u};
            if constexpr (KBF) {
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(qk[0]), "=r"(qk[1]), "=r"(qk[2]), "=r"(qk[3])
                             : "r"((uint32_t)__cvta_generic_to_shared(&sqa[KBF ? s : 0][lane])));
                asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
                             : "=r"(q3[0]), "=r"(q3[2])
                             : "r"((uint32_t)__cvta_generic_to_shared(&sq3[KBF ? s : 0][lane])));
            }
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                if constexpr (KF == FMT_BOX4) {
                    /* lane t4 holds blocks 4·t4 .. 4·t4 + 3 (d = 128) of its token; k-step s: word s/2,
                     * nibble s%2 */
                    const uint32_t cos = cur.kc[tt] >> kshift;
                    const uint32_t x = cur.kw[tt][s >> 1];
                    constexpr int BPL = D / 32; /* blocks per lane */
                    const int blk = (BPL == 4 ? (s >> 2) : 0) + 2 * (s & 1);
                    const uint32_t km = 0x64006400u | (((cos >> blk) & 1u) * 0x00010001u);
                    uint32_t bb[2];
                    bb[0] = box_f16x2((((s & 1) ? x >> 3 : x << 1) & 0x001E001Eu) | km);
                    bb[1] = box_f16x2((((s & 1) ? x >> 11 : x >> 7) & 0x001E001Eu) | km);
                    mma16816<false>(acc[tt][s & 1], qa[s], bb);
                } else if constexpr (KF == FMT_BOX3) {
                    uint32_t bb[2];
                    box3_kstep<D>(cur.kw[tt], cur.kc[tt], t4, s, bb);
                    mma16816<false>(acc[tt][s & 1], qa[s], bb);
                } else {
                    const uint32_t bb[2] = {cur.kw[tt][2 * s], cur.kw[tt][2 * s + 1]};
                    if constexpr (KBF) {
                        mma16816<true>(acc[tt][s & 1], qk, bb);
                        mma16816<true>(acc[tt][s & 1], q3, bb);
                    } else {
                        mma16816<false>(acc[tt][s & 1], qa[s], bb);
                    }
                }
            }
        }
#pragma unroll
        for (int tt = 0; tt < 2; tt++) {
            sc[tt][0] = (acc[tt][0][0] + acc[tt][1][0]) + (acc[tt][0][2] + acc[tt][1][2]);
            sc[tt][1] = (acc[tt][0][1] + acc[tt][1][1]) + (acc[tt][0][3] + acc[tt][1][3]);
        }
        const bool full = tile0 + 16 <= end && (!SK || tile0 >= lo);
        float tmax = -INFINITY;
#pragma unroll
        for (int tt = 0; tt < 2; tt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int t = 8 * tt + 2 * t4 + c;
                float sv = sc[tt][c];
                if (fmt_is_box(KF)) sv *= sh[(cur.ks[tt] >> (8 * c)) & 255u];
                if (g >= G || (!full && (SK ? (unsigned)(tile0 + t - lo) >= span : tile0 + t >= end)))
                    sv = -INFINITY;
                sc[tt][c] = sv;
                tmax = fmaxf(tmax, sv);
            }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float m_new = fmaxf(m, tmax);
        const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m - m_new);
        float pv[2][2];
        l *= alpha;
#pragma unroll
        for (int tt = 0; tt < 2; tt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const float p = m_new == -INFINITY ? 0.0f : exp2f(sc[tt][c] - m_new);
                l += p;
                pv[tt][c] = fmt_is_box(VF)  ? p * sh[(cur.vs[tt] >> (8 * c)) & 255u] * V_BOX_SCALE
                            : VF == FMT_F16 ? p * V_F16_SCALE
                                            : p;
            }
        m = m_new;
        /* P fragment, column g: hi of row g; with 2G <= 8 the lo of row g − G in columns G..2G−1, else a
         * second product with the lo parts into the same columns */
        uint32_t pb[2], pl[2];
        p_fragments<VBF>(pv, pc, g, G, pb, pl);
        scale_cols<KS>(oacc, __shfl_sync(0xffffffffu, alpha, pc.col_row[0] * 4),
                       __shfl_sync(0xffffffffu, alpha, pc.col_row[1] * 4));
        /* ---- values: tokens 2t4, 2t4 + 1 (pair 0) and 2t4 + 8, 2t4 + 9 (pair 1) */
        if constexpr (VF == FMT_BOX4) {
            const int B0 = (D / 16) * g, blo = (32 * (B0 >> 4) + (B0 & 15)) >> 3, bhi = blo + 2;
            /* cosets of tokens (2t4, 2t4+1) in vc[0], (2t4+8, 2t4+9) in vc[1]: n_cos bytes each */
            constexpr int CB = 8 * ((D + 63) / 64);
            const uint32_t c0 = cur.vc[0], c1 = cur.vc[1];
            const uint32_t klo0 = 0x64006400u | ((c0 >> blo) & 1u) | (((c0 >> (CB + blo)) & 1u) << 16),
                           khi0 = 0x64006400u | ((c0 >> bhi) & 1u) | (((c0 >> (CB + bhi)) & 1u) << 16),
                           klo1 = 0x64006400u | ((c1 >> blo) & 1u) | (((c1 >> (CB + blo)) & 1u) << 16),
                           khi1 = 0x64006400u | ((c1 >> bhi) & 1u) | (((c1 >> (CB + bhi)) & 1u) << 16);
#pragma unroll
            for (int mt = 0; mt < KS; mt++) {
                const int wi = mt >> 2, bi = mt & 3;
                const uint32_t sel = bi | (bi << 4) | ((4 + bi) << 8) | ((4 + bi) << 12);
                const uint32_t x0 = __byte_perm(cur.vw[0][wi], cur.vw[1][wi], sel),
                               x1 = __byte_perm(cur.vw[2][wi], cur.vw[3][wi], sel);
                uint32_t r[4];
                r[0] = box_f16x2(((x0 << 1) & 0x001E001Eu) | klo0);
                r[1] = box_f16x2(((x0 >> 3) & 0x001E001Eu) | khi0);
                r[2] = box_f16x2(((x1 << 1) & 0x001E001Eu) | klo1);
                r[3] = box_f16x2(((x1 >> 3) & 0x001E001Eu) | khi1);
                mma16816<false>(oacc[mt], r, pb);
                if (!LO) mma16816<false>(oacc[mt], r, pl);
            }
        } else if constexpr (VF == FMT_BOX3) {
            /* tokens (2t4, 2t4 + 1): r[0], r[1]; (2t4 + 8, 2t4 + 9): r[2], r[3] */
#pragma unroll
            for (int mt = 0; mt < KS; mt++) {
                uint32_t r[4], r0[2], r1[2];
                box3_vtile<D>(cur.vw[0], cur.vw[1], cur.vc[0], g, mt, r0);
                box3_vtile<D>(cur.vw[2], cur.vw[3], cur.vc[1], g, mt, r1);
                r[0] = r0[0], r[1] = r0[1], r[2] = r1[0], r[3] = r1[1];
                mma16816<false>(oacc[mt], r, pb);
                if (!LO) mma16816<false>(oacc[mt], r, pl);
            }
        } else {
            /* tokens past the end or in the sink: zeros, not garbage */
            uint32_t mask0 = 0xffffffffu, mask1 = 0xffffffffu;
            if (!full && SK) {
                const int p = tile0 + 2 * t4 - lo;
                mask0 = ((unsigned)p < span ? 0xffffu : 0u) | ((unsigned)(p + 1) < span ? 0xffff0000u : 0u);
                mask1 =
                    ((unsigned)(p + 8) < span ? 0xffffu : 0u) | ((unsigned)(p + 9) < span ? 0xffff0000u : 0u);
            } else if (!full) {
                mask0 = (tile0 + 2 * t4 < end ? 0xffffu : 0u) | (tile0 + 2 * t4 + 1 < end ? 0xffff0000u : 0u);
                mask1 =
                    (tile0 + 2 * t4 + 8 < end ? 0xffffu : 0u) | (tile0 + 2 * t4 + 9 < end ? 0xffff0000u : 0u);
            }
#pragma unroll
            for (int mt = 0; mt < KS; mt++) {
                uint32_t r[4];
                r[0] = __byte_perm(cur.vw[0][mt], cur.vw[1][mt], 0x5410) & mask0;
                r[1] = __byte_perm(cur.vw[0][mt], cur.vw[1][mt], 0x7632) & mask0;
                r[2] = __byte_perm(cur.vw[2][mt], cur.vw[3][mt], 0x5410) & mask1;
                r[3] = __byte_perm(cur.vw[2][mt], cur.vw[3][mt], 0x7632) & mask1;
                mma16816<VBF>(oacc[mt], r, pb);
                if (!LO) mma16816<VBF>(oacc[mt], r, pl);
            }
        }
        if (PIPE)
            cur = nxt;
        else if (next0 < end)
            load_tile<D, KF, VF>(cur, a, table, kvh, next0, g, t4);
    }
    /* ---- merge the warps */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
#pragma unroll
    for (int mt = 0; mt < KS; mt++) {
        const int dl = vdim<D, VF>(g, mt, 0), dh = vdim<D, VF>(g, mt, 1);
        so[warp][2 * t4][dl] = oacc[mt][0];
        so[warp][2 * t4 + 1][dl] = oacc[mt][1];
        so[warp][2 * t4][dh] = oacc[mt][2];
        so[warp][2 * t4 + 1][dh] = oacc[mt][3];
    }
    if (t4 == 0) {
        sm[warp][g] = m;
        sl[warp][g] = l;
    }
    __syncthreads();
    store_split<D>(a, seq, kvh, G, split, sm, sl,
                   [&](int w, int r, int i) { return so[w][r][i] + (LO ? so[w][r + G][i] : 0.0f); });
    merge_last<D, SK>(a, seq, kvh, G, so);
}

/* ---- e8box:4 K and V: a per-warp cp.async pipeline into shared memory ----
 *
 * The kernel above keeps the next tile in registers: 2 KB in flight per warp, ~780 instructions per
 * 16-token tile (ncu, H100). Here each warp owns BOX_STAGES shared-memory buffers and keeps
 * BOX_STAGES − 1 tiles of its own in flight with 16-byte cp.async copies (5 per lane per tile), reads the
 * current one from shared memory, and spends fewer instructions per tile:
 *  - scores with the token axis as M: S = K·Qᵀ, A = 16 tokens × 16 coordinates of K, B = the query
 *    columns: for G ≤ 4 columns 0..3 the f16 "hi" parts of the G heads and 4..7 their "lo" parts (one
 *    product per k-step, every row used); G > 4 two products (hi, lo);
 *  - the coset bits leave the decode: a nibble n becomes 2n − 16 by one lop3 (n into the mantissa of
 *    1024, or 16n for a high nibble) and one f16x2 fma (×2 − 2064, or ×1/8 − 144), exact; the coset bit k
 *    of block b adds k·Q_b to a score (Q_b = the sum of the query over the block: one more product with
 *    A = the 16 tokens' coset bits × 16 blocks) and Σ_t P_t·h_t·k_t,b to the output coordinates of block b
 *    (one more product into a 16-block accumulator, added at the merge);
 *  - the running maximum is updated only when a score exceeds it (a warp vote); P stays ≤ 1 as before,
 *    and the rescale of the accumulators is skipped on the tiles that do not raise it;
 *  - P reaches the B operand of Oᵀ += Vᵀ·Pᵀ by movmatrix (a register transpose), no shuffles.
 * V rows sit 16 bytes further apart than their length in shared memory so that the 8-byte (4-byte) reads
 * of four tokens by a quarter warp hit different banks.
 * e8box:3 (B = 3, K and V both; box_geo<D, 3>, box3_stage) runs the same pipeline on its four areas (2-bit
 * plane, 1-bit plane, steps, cosets of 16 tokens: whole aligned 16-byte chunks, 3-4 copies per lane at
 * d = 128) and decodes the fields as attn_split_kernel's box3_kstep and box3_vtile place them: their
 * fragments are this kernel's A operands as they are (a k-step's B fragment of token g is the A fragment of
 * row g; the V tiles are A in both kernels), the query columns follow kdim and the output rows vdim. Its
 * coset bits leave the decode as e8box:4's do (the same coset bytes, block order and coset products), so a
 * field costs one lop3 and one fma once the planes are merged (box3_kstep_nc, box3_vtile_nc: 2n − 8 with
 * the field at any bit q of its byte, no shift into place and no coset lop3; ~35% fewer integer ops in the
 * PTX of the loop than 2n + k − 8 in the mantissa). Mixed pairs (K e8box:4 and V e8box:3, or the reverse)
 * run here too: a sub-tile holds K's area of its format's layout and V's area of the other's (box_pair), each
 * stream is copied by its own format's plan and decoded by its own format's code. */
#ifndef BOX_STAGES
#define BOX_STAGES 4 /* buffers per warp (3: 2-10% slower on the H100 at Llama-3-8B shapes, batch 1-8) */
#endif
#ifndef BOX_MINB
#define BOX_MINB 3 /* resident blocks per SM the register budget is made for */
#endif
#ifndef BOX_NT
#define BOX_NT 2 /* 16-token sub-tiles per tile */
#endif

/* a sub-tile's bytes in shared memory; B = 4 (e8box:4) or 3 (e8box:3) */
template <int D, int B> struct box_geo {
    static constexpr int KN = D / 2;                       /* nibble bytes of a token */
    static constexpr int PB = KN;                          /* plane bytes of a token */
    static constexpr int NC = (D + 63) / 64;               /* coset bytes of a token */
    static constexpr int VROW = KN + 16;                   /* V row pitch in shared memory */
    static constexpr int K_SIDE = 16 * KN;                 /* K steps, then cosets */
    static constexpr int K_BYTES = 16 * KN + 16 + 16 * NC; /* nibbles, steps, cosets of 16 tokens */
    static constexpr int V_OFF = K_BYTES;                  /* V rows */
    static constexpr int V_SIDE = V_OFF + 16 * VROW;       /* V steps, then cosets */
    static constexpr int STAGE = V_SIDE + 16 + 16 * NC;    /* 2400 (d = 128), 1344 (d = 64) */
    static constexpr int CPR = KN / 16;                    /* 16-byte chunks per row */
};
/* e8box:3: K = 2-bit plane rows (d/4 bytes, unpadded: the reads of a half warp, tokens g.. g + 3 at byte
 * 8t4 (4t4), are consecutive), 1-bit plane rows (d/8), steps, cosets; V the same with the 2-bit rows padded
 * to d/4 + 16 bytes at d = 128 (the 4-byte reads of tokens 2t4 by lanes t4 = 0 and 2 would share a bank) */
template <int D> struct box_geo<D, 3> {
    static constexpr int PB = 3 * D / 8;                     /* plane bytes of a token */
    static constexpr int NC = (D + 63) / 64;                 /* coset bytes of a token */
    static constexpr int KROW = D / 4;                       /* K 2-bit row pitch */
    static constexpr int VROW = D / 4 + (D == 128 ? 16 : 0); /* V 2-bit row pitch */
    static constexpr int K1 = 16 * KROW;                     /* K 1-bit rows */
    static constexpr int K_SIDE = K1 + 16 * (D / 8);         /* K steps, then cosets */
    static constexpr int V_OFF = K_SIDE + 16 + 16 * NC;      /* V 2-bit rows */
    static constexpr int V1 = V_OFF + 16 * VROW;             /* V 1-bit rows */
    static constexpr int V_SIDE = V1 + 16 * (D / 8);         /* V steps, then cosets */
    static constexpr int STAGE = V_SIDE + 16 + 16 * NC;      /* 1888 (d = 128), 832 (d = 64) */
    static constexpr int CPR = D / 64;                       /* 16-byte chunks per 2-bit row */
    static_assert(K1 % 16 == 0 && K_SIDE % 16 == 0 && V_OFF % 16 == 0 && VROW % 16 == 0 && V1 % 16 == 0 &&
                      V_SIDE % 16 == 0 && STAGE % 16 == 0,
                  "16-byte cp.async destinations");
};

/* e8box:3 staging of one 16-token sub-tile at page offset o0 (a multiple of 16): lanes 0..15 copy K, 16..31
 * V (i = lane mod 16): 2-bit chunks i + 16j (j < d/64), 1-bit chunk i (i < d/8), side chunk i (i ≤ NC: the
 * step bytes, then the coset bytes). Each area of 16 tokens is contiguous in the head area and starts at a
 * multiple of 16 bytes (page, head and plane offsets are), so every copy is a whole aligned 16-byte chunk,
 * the 8-byte 1-bit rows of d = 64 included. cp(shared offset in the sub-tile, byte offset in the lane's
 * stream's head area of the page). */
template <int D, typename F> __device__ __forceinline__ void box3_stage(int lane, int bs, int o0, F &&cp) {
    using Gm = box_geo<D, 3>;
    const int i = lane & 15, kv = lane >> 4;
    const int pitch = kv ? Gm::VROW : Gm::KROW;
    const uint32_t d2 = (kv ? Gm::V_OFF : 0) + (i / Gm::CPR) * pitch + 16 * (i % Gm::CPR);
#pragma unroll
    for (int j = 0; j < D / 64; j++)
        cp(d2 + j * (16 / Gm::CPR) * pitch, (uint32_t)(o0 * (D / 4) + 16 * i + 256 * j));
    if (i < D / 8) cp((kv ? Gm::V1 : Gm::K1) + 16 * i, (uint32_t)(bs * (D / 4) + o0 * (D / 8) + 16 * i));
    if (i <= Gm::NC)
        cp((kv ? Gm::V_SIDE : Gm::K_SIDE) + 16 * i,
           (uint32_t)(bs * Gm::PB + (i ? bs + 16 * (i - 1) + o0 * Gm::NC : o0)));
}
/* the plane words of box3_load_k for token tk of a staged sub-tile sb (the coset bytes are read as
 * e8box:4's) */
template <int D> __device__ __forceinline__ void box3_lds_k(uint32_t *w, const uint8_t *sb, int tk, int t4) {
    using Gm = box_geo<D, 3>;
    if constexpr (D == 128) {
        const uint2 u = *(const uint2 *)(sb + tk * Gm::KROW + 8 * t4),
                    v = *(const uint2 *)(sb + Gm::K1 + tk * (D / 8) + 8 * (t4 & 1));
        w[0] = u.x, w[1] = u.y, w[2] = v.x, w[3] = v.y;
    } else {
        w[0] = *(const uint32_t *)(sb + tk * Gm::KROW + 4 * t4);
        w[1] = *(const uint32_t *)(sb + Gm::K1 + tk * (D / 8) + 4 * (t4 & 1));
    }
}
/* the words of box3_load_v for token tv of a staged sub-tile sb */
template <int D>
__device__ __forceinline__ void box3_lds_v(uint32_t (&w)[2], const uint8_t *sb, int tv, int g) {
    using Gm = box_geo<D, 3>;
    if constexpr (D == 128) {
        w[0] = *(const uint32_t *)(sb + Gm::V_OFF + tv * Gm::VROW + 4 * g);
        w[1] = *(const uint32_t *)(sb + Gm::V1 + tv * (D / 8) + 4 * (g & 3));
    } else {
        w[0] = *(const uint16_t *)(sb + Gm::V_OFF + tv * Gm::VROW + 2 * g);
        w[1] = *(const uint16_t *)(sb + Gm::V1 + tv * (D / 8) + 2 * (g & 3));
    }
}

__device__ __forceinline__ void cp16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp8(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
    uint32_t r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
    return r;
}
__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
/* (x & mask) | magic in one LOP3: the magic comes in a register (a LOP3 takes one immediate; left to
 * itself the compiler splits the two constants into two instructions) */
template <uint32_t MASK> __device__ __forceinline__ uint32_t and_or(uint32_t x, uint32_t magic) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "n"(MASK), "r"(magic));
    return r;
}
/* nibbles at bits 0..3 and 16..19 of x → f16x2 of 2n − 16 (magic = 0x64006400) */
__device__ __forceinline__ uint32_t nib_lo(uint32_t x, uint32_t magic) {
    return hfma2(and_or<0x000F000Fu>(x, magic), 0x40004000u /* 2 */, 0xE808E808u /* −2064 */);
}
/* nibbles at bits 4..7 and 20..23 of x → f16x2 of 2n − 16 */
__device__ __forceinline__ uint32_t nib_hi(uint32_t x, uint32_t magic) {
    return hfma2(and_or<0x00F000F0u>(x, magic), 0x30003000u /* 1/8 */, 0xD880D880u /* −144 */);
}
/* e8box:3 in attn_box_kernel: the coset bits leave the decode as in e8box:4 (coset products), so a field
 * needs no coset lop3 and no shift into a fixed mantissa position: field j of w = box3_w(…, j) at bits
 * q..q + 2 (q = box3_q) of bytes 0 and 2 → f16x2 of 2n − 8 by one lop3 (0x6400 | 2^q·n) and one fma
 * (×2^(1−q) − (2^(11−q) + 8)), exact: the product 2^(11−q) + 2n and the result 2n − 8 are integers f16
 * holds, and the fma rounds once */
template <int D> __device__ __forceinline__ uint32_t box3_field(uint32_t w, int j, uint32_t magic) {
    const int q = box3_q<D>(j);
    const uint32_t sc = (uint32_t)(16 - q) << 10, of = 0x8000u | (uint32_t)(26 - q) << 10 | 1u << (q + 2);
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "r"(0x00070007u << q), "r"(magic));
    return hfma2(r, sc * 0x00010001u, of * 0x00010001u);
}
/* box3_kstep less the coset bits (bytes 1 and 3 after one shift of the merged word) */
template <int D>
__device__ __forceinline__ void box3_kstep_nc(const uint32_t *w, int t4, int s, uint32_t magic,
                                              uint32_t (&bb)[2]) {
    constexpr int NW = D / 64;
    const int j = s & 3, wi = s >> 2, c = D == 128 ? 4 * (t4 >> 1) : t4 >> 1;
    const uint32_t x = box3_w<D, true>(w[wi], w[NW + wi], c, j);
    bb[0] = box3_field<D>(x, j, magic);
    bb[1] = box3_field<D>(x >> 8, j, magic);
}
/* box3_vtile less the coset bits */
template <int D>
__device__ __forceinline__ void box3_vtile_nc(const uint32_t (&wa)[2], const uint32_t (&wb)[2], int g, int mt,
                                              uint32_t magic, uint32_t (&r)[2]) {
    const int j = mt & 3, sel = D == 128 && (mt >> 2) ? 0x7632 : 0x5410, c = D == 128 ? 4 * (g >> 2) : g >> 2;
    const uint32_t x = box3_w<D, true>(__byte_perm(wa[0], wb[0], sel), __byte_perm(wa[1], wb[1], sel), c, j);
    r[0] = box3_field<D>(x, j, magic);
    r[1] = box3_field<D>(x >> 8, j, magic);
}
/* 2^x (MUFU.EX2; results below 2^-126 flush to 0, weights far below what f16 P keeps) */
__device__ __forceinline__ float ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
/* bits 0 and 16 of x → f16x2 of 0 / 1 */
__device__ __forceinline__ uint32_t bits_f16x2(uint32_t x) {
    return (x & 0x00010001u) * 0x3C00u;
}

#ifdef BOX_PROF
/* -DBOX_PROF (a measurement build, never the library's): thread 0 of each block of attn_box_kernel stamps
 * %globaltimer at entry (0), once its first copies are issued (6), after the query rotation (7), before its
 * first tile (1), after its last tile (2), after storing its split (3) and at its end (4: the last block of a
 * (sequence, KV head) after the merge), with its SM (5): e8kv_cu_box_prof reads them. */
__device__ unsigned long long g_box_prof[BOX_PROF_MAX][8];
__device__ __forceinline__ void box_stamp(int k) {
    if (threadIdx.x == 0) {
        const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (b < BOX_PROF_MAX) g_box_prof[b][k] = t;
        if (k == 0 && b < BOX_PROF_MAX) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            g_box_prof[b][5] = sm;
        }
    }
}
size_t e8kv_cu_box_prof(unsigned long long *host, size_t n_blocks, int clear) {
    const size_t n = n_blocks < BOX_PROF_MAX ? n_blocks : BOX_PROF_MAX;
    if (clear) {
        static unsigned long long zero[BOX_PROF_MAX][8];
        return cudaMemcpyToSymbol(g_box_prof, zero, sizeof zero) == cudaSuccess ? 0 : E8KV_ERR(CUDA);
    }
    return cudaMemcpyFromSymbol(host, g_box_prof, n * 8 * sizeof(unsigned long long)) == cudaSuccess
               ? n
               : E8KV_ERR(CUDA);
}
#define BOX_STAMP(k) box_stamp(k)
#else
#define BOX_STAMP(k) ((void)0)
#endif

/* a sub-tile of K in e8box:BK and V in e8box:BV: K's area of box_geo<D, BK>, then V's area of box_geo<D, BV>
 * moved by VSH bytes (0 when BK = BV, the layouts above as they are) */
template <int D, int BK, int BV> struct box_pair {
    static constexpr int VSH = box_geo<D, BK>::V_OFF - box_geo<D, BV>::V_OFF;
    static constexpr int STAGE = box_geo<D, BV>::STAGE + VSH;
    static_assert(VSH % 16 == 0, "16-byte cp.async destinations");
};
/* center=rope: a lane's operands of the bias product q·R_p·μ (attn_box_kernel's and attn_e8p_kernel's RC
 * instances), for the pairs c = t4 + 4e of the row's RC_PAIRS (rcp: the row's means before RoPE and pair
 * indices; NULL, a bad row: zeros): α_e = q_a μ_a + q_b μ_b, β_e = q_b μ_a − q_a μ_b of query head `head` of
 * the KV head (0 for head ≥ G), scaled as the scores (log2), and the constant table's cos, sin of j·ω for
 * tokens j = g + 8tt as f16 pairs, hi parts in th[tt + 2e], lo parts in tl[tt + 2e]. Per sub-tile at p0 each
 * head's (α·C + β·S, β·C − α·S), C, S = cos, sin of p0·ω, against the table gives Σ_c α cos((p0 + j)ω) +
 * β sin((p0 + j)ω) = q·R_{p0+j}·μ. */
template <int D>
__device__ __forceinline__ void rc_operands(const attn_launch &a, const float *rcp, int seq, int kvh, int G,
                                            int head, int g, int t4, float (&al)[2], float (&be)[2],
                                            uint32_t (&th)[4], uint32_t (&tl)[4]) {
    al[0] = al[1] = be[0] = be[1] = 0.0f;
    th[0] = th[1] = th[2] = th[3] = tl[0] = tl[1] = tl[2] = tl[3] = 0u;
    if (!rcp) return;
    const int32_t *const idx = (const int32_t *)(rcp + 2 * RC_PAIRS);
    const float sc = rsqrtf((float)D) * LOG2E;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int c = t4 + 4 * e, i = idx[c];
        if (head < G) {
            const size_t h = (size_t)seq * a.n_head + (size_t)kvh * G + head;
            const float qa = e8kv_cuda_load_val(a.q, h * D + 2 * i, a.q_dtype) * sc,
                        qb = e8kv_cuda_load_val(a.q, h * D + 2 * i + 1, a.q_dtype) * sc;
            const float ma = rcp[2 * c], mb = rcp[2 * c + 1];
            al[e] = qa * ma + qb * mb;
            be[e] = qb * ma - qa * mb;
        }
#pragma unroll
        for (int tt = 0; tt < 2; tt++) {
            const float C = a.k.cs[(size_t)(g + 8 * tt) * D + 2 * i], S = a.k.cs[(size_t)(g + 8 * tt) * D + 2 * i + 1];
            th[tt + 2 * e] = pack(hi16<false>(C), hi16<false>(S));
            tl[tt + 2 * e] = pack(lo16<false>(C), lo16<false>(S));
        }
    }
}

/* center=rope: the head side of a sub-tile's bias product (rc_operands), the lane's pairs t4 + 4e turned to
 * the sub-tile's first position (cs[e]: its cos, sin): x[e] = (α·C + β·S, β·C − α·S) */
__device__ __forceinline__ void rc_turn(const float (&al)[2], const float (&be)[2], const float2 (&cs)[2],
                                        float (&x)[2][2]) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
        x[e][0] = al[e] * cs[e].x + be[e] * cs[e].y;
        x[e][1] = be[e] * cs[e].x - al[e] * cs[e].y;
    }
}

/* center=rope (RC): a sub-tile's stage also holds the cos, sin of its first position for the row's RC_PAIRS
 * pairs (8 bytes each), after the V area */
#define RC_STAGE_BYTES (8 * RC_PAIRS)
template <int D, int BK, int BV, bool RC> __host__ __device__ static constexpr int box_stage_bytes(void) {
    return box_pair<D, BK, BV>::STAGE + (RC ? RC_STAGE_BYTES : 0);
}
/* 16-token sub-tiles per tile: BOX_NT, one for head_dim 256 (P = 2: a sub-tile holds both halves' bytes) */
template <int P> __host__ __device__ static constexpr int box_nt(void) {
    return P == 2 ? 1 : BOX_NT;
}
template <int D, int BK, int BV, bool RC, int P = 1>
__host__ __device__ static constexpr int box_smem_bytes(void) {
    return WARPS * BOX_STAGES * box_nt<P>() * P * box_stage_bytes<D, BK, BV, RC>();
}

/* the register budget: BOX_MINB blocks per SM, but 2 for a center=rope instance where shared memory (its
 * stages and ~8 KB of static arrays, 1 KB per block for the system, 228 KB per SM) lets only 2 in anyway
 * (its bias needs ~12 more registers per thread), and 2 for head_dim 256 (two halves' output fragments) */
template <int D, int BK, int BV, bool RC, int P = 1> __host__ __device__ static constexpr int box_minb(void) {
    return P == 2 || (RC && 3 * (box_smem_bytes<D, BK, BV, RC>() + 9 * 1024) > 228 * 1024) ? 2 : BOX_MINB;
}

/* P = 2: head_dim 256 (D = 128), a KV head kept as two heads of 128 (its halves, internal heads 2·kvh and
 * 2·kvh + 1 of the pages: attn_pair_kernel), up to 4 query heads (not G8) and no center=rope. A sub-tile's
 * stage holds both halves' areas (one 16-token sub-tile per tile); a score adds both halves' sums, each
 * times its own step; the output keeps one set of fragments per half, and merge_last undoes each half's
 * transform. */
template <int D, int BK, int BV, bool G8, bool SK, bool RC, int P = 1>
__global__ void __launch_bounds__(128, (box_minb<D, BK, BV, RC, P>())) attn_box_kernel(const attn_launch a) {
    static_assert((BK == 4 || BK == 3) && (BV == 4 || BV == 3), "e8box:4 or e8box:3");
    static_assert(P == 1 || (P == 2 && D == 128 && !G8 && !RC), "head_dim 256: halves of 128, G <= 4");
    /* GK: the K area of a sub-tile; GV: the V area, VSH bytes from where box_geo<D, BV> puts it; G4: the
     * copy plan of an e8box:4 stream */
    using GK = box_geo<D, BK>;
    using GV = box_geo<D, BV>;
    using G4 = box_geo<D, 4>;
    constexpr int VSH = box_pair<D, BK, BV>::VSH, STAGE = box_stage_bytes<D, BK, BV, RC>(),
                  RC_OFF = box_pair<D, BK, BV>::STAGE;
    constexpr int KS = D / 16, NW = D / 32, NT = box_nt<P>(), DQ = D * P;
    /* [WARPS][BOX_STAGES][NT][P][STAGE]: sub-tile u of a buffer, half h at (u·P + h)·STAGE */
    extern __shared__ __align__(16) uint8_t box_dyn[];
    uint8_t(*const stage)[BOX_STAGES][NT * P][STAGE] =
        reinterpret_cast<uint8_t(*)[BOX_STAGES][NT * P][STAGE]>(box_dyn);
    __shared__ float sq[8][DQ];
    __shared__ float sh[256];
    __shared__ float sm[WARPS][8], sl[WARPS][8];
    __shared__ float scos[WARPS][8][16 * P];
    static_assert(WARPS * BOX_STAGES * NT * P * STAGE >= sizeof(float) * WARPS * 8 * DQ,
                  "the merge buffer aliases the stages");

    BOX_STAMP(0);
    const int split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
    const int G = (int)(a.n_head / a.n_head_kv);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int n_split = (int)a.n_split;
    if (SK) sink_prefetch<DQ>(a, seq, kvh, split);
    {
        /* the query rows and the rotation signs on their way to L1 before this block's copies queue up
         * ahead of them (load_query below) */
        const int esz = a.q_dtype == E8KV_DTYPE_F32 ? 4 : 2, qbytes = G * DQ * esz, qlines = qbytes / 128 + 1;
        const char *const qb = (const char *)a.q + ((size_t)seq * a.n_head + (size_t)kvh * G) * DQ * esz;
        const char *const p = tid < qlines ? qb + min(128 * tid, qbytes - 1)
                                           : (const char *)a.signs + 128 * (tid - qlines); /* D·4 bytes */
        if (tid < qlines + D * 4 / 128) asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    }
    const int ctx = table_ctx(a, seq);
    const int chunk = ((ctx + n_split - 1) / n_split + 16 * NT - 1) & -(16 * NT);
    const int start = split * chunk, end = min(start + chunk, ctx);
    const int lo = SK ? min(a.sink_n, ctx) : 0; /* sink positions [0, lo): masked (attn_split_kernel) */
    const int32_t *const table = a.block_tables + (size_t)seq * a.max_blocks;
    /* pages of 16·2^k tokens: a tile's page and offset by shifts */
    const int bs = (int)a.block_size, bs16 = bs >> 4, pow2 = (bs16 & (bs16 - 1)) == 0;
    const int bshift = __ffs(bs16) - 1;

    /* per-lane copy offsets: nibble chunks c = lane + 32j (K at 16c, V in its padded row), and one side
     * chunk (lanes 0..NC: K step bytes, then cosets; lanes 16..16 + NC: the same of V) */
    const uint8_t *const kpool = a.k.pool + (size_t)(P * kvh) * a.k.head_bytes; /* half h: + h·head_bytes */
    const uint8_t *const vpool = a.v.pool + (size_t)(P * kvh) * a.v.head_bytes;
    const int side = lane & 15;
    const bool has_side = side <= G4::NC;
    const int side_src = bs * G4::PB + (side ? bs + 16 * (side - 1) : 0), side_mul = side ? G4::NC : 1;
    const uint32_t side_dst = (lane < 16 ? G4::K_SIDE : G4::V_SIDE + VSH) + 16 * side;
    const uint8_t *const side_pool = lane < 16 ? kpool : vpool;
    /* page sizes below 4 GiB (e8kv_cuda_cache_create checks): one 32 × 32 → 64-bit multiply per page */
    const uint32_t kpb = (uint32_t)a.k.page_bytes, vpb = (uint32_t)a.v.page_bytes,
                   side_pb = lane < 16 ? kpb : vpb;
    const uint32_t khb = (uint32_t)a.k.head_bytes, vhb = (uint32_t)a.v.head_bytes,
                   side_hb = lane < 16 ? khb : vhb;

    const int step = 16 * NT * WARPS, first = start + 16 * NT * warp;
    const int n_t = first < end ? (end - first + step - 1) / step : 0;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(&stage[warp][0][0][0]);
    auto page_of = [&](int t0, int *o0) {
        const int T = t0 >> 4;
        const int pi = pow2 ? T >> bshift : T / bs16;
        *o0 = 16 * (pow2 ? T & (bs16 - 1) : T % bs16);
        return table[pi];
    };
    /* chunk c = lane + 32j: K at 16c, V at its padded row; c + 32 is 32 / CPR rows further */
    const uint32_t vdst0 = G4::V_OFF + VSH + (lane / G4::CPR) * G4::VROW + 16 * (lane % G4::CPR);
    /* an e8box:3 stream: box3_stage's lanes 0..15 (K) or 16..31 (V) (side_pool: the lane's stream); an
     * e8box:4 stream: every lane's nibble chunks, and the side chunks of lanes 0..NC (K) or 16..16 + NC (V).
     * A mixed pair runs both plans, each for its own stream. */
    /* center=rope: lane c < RC_PAIRS copies the cos, sin of the row's c-th pair at a sub-tile's first
     * position into the stage */
    const float *rcp = NULL, *rc_cs = NULL; /* the row's centre pairs (a bad row: none, NaN output) */
    int2 rc_sh = make_int2(0, 0);            /* the row's position shift (e8kv_cuda_set_row_shifts) */
    if constexpr (RC) {
        const int rrow = seq_row(a, seq);
        if (rrow >= 0) {
            rcp = a.k.rc + ((size_t)rrow * a.n_head_kv + kvh) * RC_FLOATS;
            if (lane < RC_PAIRS) {
                rc_cs = a.k.cs + 2 * ((const int32_t *)(rcp + 2 * RC_PAIRS))[lane];
                rc_sh = rc_shift(a.k.shift, rrow);
            }
        }
    }
    auto issue = [&](int pg, int o0, uint32_t dst0, int p0) {
        if constexpr (RC)
            if (rc_cs) cp8(dst0 + RC_OFF + 8 * lane, rc_cs + (size_t)rc_position(rc_sh, p0, a.k.n_pos) * D);
#pragma unroll
        for (int h = 0; h < P; h++) { /* half h of the head (P = 2) at h·STAGE */
            const uint32_t dst = dst0 + h * STAGE;
            if ((BK == 3 && lane < 16) || (BV == 3 && lane >= 16)) {
                const uint8_t *const src = side_pool + (uint64_t)(uint32_t)pg * side_pb + h * side_hb;
                box3_stage<D>(lane, bs, o0, [&](uint32_t d, uint32_t s) {
                    cp16(dst + d + (lane < 16 ? 0 : VSH), src + s);
                });
            }
            if constexpr (BK == 4 || BV == 4) {
                const uint8_t *const kn =
                    kpool + (uint64_t)(uint32_t)pg * kpb + (uint32_t)(h * khb + o0 * G4::KN + 16 * lane);
                const uint8_t *const vn =
                    vpool + (uint64_t)(uint32_t)pg * vpb + (uint32_t)(h * vhb + o0 * G4::KN + 16 * lane);
#pragma unroll
                for (int j = 0; j < G4::KN / 32; j++) {
                    if constexpr (BK == 4) cp16(dst + 16 * lane + 512 * j, kn + 512 * j);
                    if constexpr (BV == 4) cp16(dst + vdst0 + (32 / G4::CPR) * G4::VROW * j, vn + 512 * j);
                }
                if (has_side && ((BK == 4 && lane < 16) || (BV == 4 && lane >= 16)))
                    cp16(dst + side_dst, side_pool + (uint64_t)(uint32_t)pg * side_pb +
                                             (uint32_t)(h * side_hb + side_src + o0 * side_mul));
            }
        }
    };
    /* start this warp's copies first: their latency overlaps the query rotation. A tile is NT
     * sub-tiles of 16 tokens (each in one page); a sub-tile at or past the end is not copied (its page
     * may not exist): its scores are masked and its stale bytes decode to finite values times P = 0. */
    auto lookup = [&](int t0, int(&pg)[NT], int(&o)[NT]) {
#pragma unroll
        for (int u = 0; u < NT; u++)
            pg[u] = t0 + 16 * u < end ? page_of(t0 + 16 * u, &o[u]) : 0;
    };
    auto issue_tile = [&](int t0, int buf, const int(&pg)[NT], const int(&o)[NT]) {
#pragma unroll
        for (int u = 0; u < NT; u++)
            if (t0 + 16 * u < end) issue(pg[u], o[u], sbase + (buf * NT + u) * P * STAGE, t0 + 16 * u);
    };
    /* the pages of the first BOX_STAGES tiles looked up together (their table loads in flight at once, not
     * one after each copy: the copies are asm with a memory clobber), then the first copies */
    int pg_first[BOX_STAGES][NT] = {}, o_first[BOX_STAGES][NT] = {};
#pragma unroll
    for (int i = 0; i < BOX_STAGES; i++)
        if (i < n_t) lookup(first + i * step, pg_first[i], o_first[i]);
#pragma unroll
    for (int i = 0; i < BOX_STAGES - 1; i++) {
        if (i < n_t) issue_tile(first + i * step, i, pg_first[i], o_first[i]);
        cp_commit();
    }
    int pg_next[NT], o_next[NT];
#pragma unroll
    for (int u = 0; u < NT; u++)
        pg_next[u] = pg_first[BOX_STAGES - 1][u], o_next[u] = o_first[BOX_STAGES - 1][u];

    BOX_STAMP(6);
    if (SK && split == 0) sink_state<DQ>(a, seq, kvh, G);
    for (int i = tid; i < 256; i += blockDim.x)
        sh[i] = i ? c_box_frac[i & 7] * __int_as_float(((i >> 3) - 21 + 127) << 23) : 0.0f; /* δ/2 */
    load_query<D, P>(a, seq, kvh, G, true, sq);
    BOX_STAMP(7);
    const float qscale = a.rot_scale * rsqrtf((float)DQ) * LOG2E;
    /* B fragments of the scores: k-step s = word s/2 of the lane's nibbles, low (s even) or high nibbles;
     * k index 2t4 ↔ byte 0, 2t4 + 1 ↔ byte 2, 2t4 + 8 ↔ byte 1, 2t4 + 9 ↔ byte 3 of the word. Column g:
     * G ≤ 4: hi of head g (g < 4) or lo of head g − 4; G > 4: head g, hi and lo in two fragments. The
     * coset fragments hold Q_b (k index = block b). P = 2: one set per half h (query coordinates D·h..). */
    const int row = G8 ? g : (g & 3);
    const bool hi_col = G8 || g < 4;
    uint32_t qh[P][KS][2], ql[G8 ? KS : 1][2], qch[P][2], qcl[P][2];
#pragma unroll
    for (int h = 0; h < P; h++) {
#pragma unroll
        for (int s = 0; s < KS; s++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                float x[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int coord;
                    if constexpr (BK == 4) {
                        const int o = (D / 8) * t4 + 4 * (s >> 1) + j + 2 * e;
                        coord = 32 * (o >> 4) + (o & 15) + 16 * (s & 1);
                    } else {
                        coord = kdim<D, FMT_BOX3>(t4, s, 2 * t4 + 8 * j + e); /* box3_kstep */
                    }
                    x[e] = row < G ? sq[row][D * h + coord] * qscale : 0.0f;
                }
                qh[h][s][j] = hi_col ? pack(hi16<false>(x[0]), hi16<false>(x[1]))
                                     : pack(lo16<false>(x[0]), lo16<false>(x[1]));
                if constexpr (G8) ql[s][j] = pack(lo16<false>(x[0]), lo16<false>(x[1]));
            }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float x[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int blk = 2 * t4 + 8 * j + e;
                float sum = 0.0f;
                if (row < G && blk < D / 8)
                    for (int i = 0; i < 8; i++)
                        sum += sq[row][D * h + 8 * blk + i] * qscale;
                x[e] = sum;
            }
            qch[h][j] = hi_col ? pack(hi16<false>(x[0]), hi16<false>(x[1]))
                               : pack(lo16<false>(x[0]), lo16<false>(x[1]));
            qcl[h][j] = pack(lo16<false>(x[0]), lo16<false>(x[1]));
        }
    }

    /* center=rope (a.k.rc): + q·R_p·μ for the row's RC_PAIRS chosen pairs (rc_operands), per 16-token
     * sub-tile at p0 one product A·B: A = the constant table (token rows g / g + 8, two products for its hi
     * and lo parts), B = for column g's head (hi or lo part as qh's) the pair's (α·C + β·S, β·C − α·S). The
     * pages hold x − R_p·μ at those pairs (encode). */
    float rc_al[2] = {}, rc_be[2] = {};
    uint32_t rc_ah[4] = {}, rc_al16[4] = {};
    if constexpr (RC) rc_operands<D>(a, rcp, seq, kvh, G, row, g, t4, rc_al, rc_be, rc_ah, rc_al16);
    /* the bias of a sub-tile (its stage sb holds the cos, sin of its first position) into c[4] (the score
     * fragment's layout) */
    auto rc_bias = [&](const uint8_t *sb, float (&c)[4]) {
        c[0] = c[1] = c[2] = c[3] = 0.0f;
        float x[2][2];
        const float2 cs[2] = {*reinterpret_cast<const float2 *>(sb + RC_OFF + 8 * t4),
                              *reinterpret_cast<const float2 *>(sb + RC_OFF + 8 * (t4 + 4))};
        rc_turn(rc_al, rc_be, cs, x);
        const uint32_t bh[2] = {hi_col ? pack(hi16<false>(x[0][0]), hi16<false>(x[0][1]))
                                       : pack(lo16<false>(x[0][0]), lo16<false>(x[0][1])),
                                hi_col ? pack(hi16<false>(x[1][0]), hi16<false>(x[1][1]))
                                       : pack(lo16<false>(x[1][0]), lo16<false>(x[1][1]))};
        mma16816<false>(c, rc_ah, bh);
        mma16816<false>(c, rc_al16, bh);
        if constexpr (G8) {
            const uint32_t bl[2] = {pack(lo16<false>(x[0][0]), lo16<false>(x[0][1])),
                                    pack(lo16<false>(x[1][0]), lo16<false>(x[1][1]))};
            mma16816<false>(c, rc_ah, bl);
        }
    };

    /* this thread's score columns are heads h0 = 2·(t4 mod 2) (G ≤ 4: t4 and t4 ^ 2 hold hi and lo of the
     * same heads and add them) or 2·t4 (G > 4), and h0 + 1; the output columns 2t4, 2t4 + 1 are the same
     * heads */
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float oacc[P * KS][4], ocos[P][4]; /* half h: oacc[h·KS + mt], ocos[h] */
#pragma unroll
    for (int mt = 0; mt < P * KS; mt++)
        oacc[mt][0] = oacc[mt][1] = oacc[mt][2] = oacc[mt][3] = 0.0f;
#pragma unroll
    for (int h = 0; h < P; h++)
        ocos[h][0] = ocos[h][1] = ocos[h][2] = ocos[h][3] = 0.0f;
    constexpr int CB = 8 * GV::NC;
    uint32_t magic;
    asm("mov.b32 %0, 0x64006400;" : "=r"(magic));

    /* the scores of a tile: [sub-tile][token g / g + 8][head h0 / h1] */
    auto scores = [&](int buf, int tile0, float(&out)[NT][2][2]) {
    /* ---- scores of each sub-tile u: tokens g (row g) and g + 8 (row g + 8) */
#pragma unroll
        for (int u = 0; u < NT; u++) {
            float vs[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}; /* the halves' sums (P = 2) */
#pragma unroll
            for (int h = 0; h < P; h++) {
                const uint8_t *const sb = &stage[warp][buf][u * P + h][0];
                uint32_t kw[2][NW], kc[2];
                float ksc[2];
                float acc[4][4]; /* four independent chains */
#pragma unroll
                for (int c = 0; c < 4; c++)
                    acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;
                float bias[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* center=rope: q·R_p·μ */
                if constexpr (RC) rc_bias(sb, bias);
                if constexpr (BK == 3) {
                    /* A = box3_kstep_nc of tokens g (a0, a2) and g + 8 (a1, a3) */
#pragma unroll
                    for (int tt = 0; tt < 2; tt++) {
                        const int tk = g + 8 * tt;
                        box3_lds_k<D>(kw[tt], sb, tk, t4);
                        kc[tt] = GK::NC == 2 ? *(const uint16_t *)(sb + GK::K_SIDE + 16 + 2 * tk)
                                             : sb[GK::K_SIDE + 16 + tk];
                        ksc[tt] = sh[sb[GK::K_SIDE + tk]];
                    }
#pragma unroll
                    for (int s = 0; s < KS; s++) {
                        uint32_t b0[2], b1[2];
                        box3_kstep_nc<D>(kw[0], t4, s, magic, b0);
                        box3_kstep_nc<D>(kw[1], t4, s, magic, b1);
                        const uint32_t ak[4] = {b0[0], b1[0], b0[1], b1[1]};
                        mma16816<false>(acc[s & 3], ak, qh[h][s]);
                        if constexpr (G8) mma16816<false>(acc[s & 3], ak, ql[s]);
                    }
                } else {
#pragma unroll
                    for (int tt = 0; tt < 2; tt++) {
                        const int tk = g + 8 * tt;
                        if constexpr (D == 128) {
                            const uint4 q4 = *(const uint4 *)(sb + tk * GK::KN + 16 * t4);
                            kw[tt][0] = q4.x, kw[tt][1] = q4.y, kw[tt][2] = q4.z, kw[tt][3] = q4.w;
                            kc[tt] = *(const uint16_t *)(sb + 16 * GK::KN + 16 + 2 * tk);
                        } else {
                            const uint2 q2 = *(const uint2 *)(sb + tk * GK::KN + 8 * t4);
                            kw[tt][0] = q2.x, kw[tt][1] = q2.y;
                            kc[tt] = sb[16 * GK::KN + 16 + tk];
                        }
                        ksc[tt] = sh[sb[16 * GK::KN + tk]];
                    }
#pragma unroll
                    for (int w = 0; w < NW; w++) {
                        const uint32_t x0 = kw[0][w], x1 = kw[1][w], y0 = x0 >> 8, y1 = x1 >> 8;
                        const uint32_t alo[4] = {nib_lo(x0, magic), nib_lo(x1, magic), nib_lo(y0, magic),
                                                 nib_lo(y1, magic)};
                        const uint32_t ahi[4] = {nib_hi(x0, magic), nib_hi(x1, magic), nib_hi(y0, magic),
                                                 nib_hi(y1, magic)};
                        mma16816<false>(acc[2 * (w & 1)], alo, qh[h][2 * w]);
                        mma16816<false>(acc[2 * (w & 1) + 1], ahi, qh[h][2 * w + 1]);
                        if constexpr (G8) {
                            mma16816<false>(acc[2 * (w & 1)], alo, ql[2 * w]);
                            mma16816<false>(acc[2 * (w & 1) + 1], ahi, ql[2 * w + 1]);
                        }
                    }
                }
                {
                    /* + Σ_b k_b·Q_b: A = coset bits (token g / g + 8, blocks 2t4, 2t4 + 1 and + 8; e8box:3
                     * has the same coset bytes and block order) */
                    const uint32_t u0 = kc[0] >> (2 * t4), u1 = kc[1] >> (2 * t4);
                    const uint32_t ac[4] = {bits_f16x2(u0 | (u0 << 15)), bits_f16x2(u1 | (u1 << 15)),
                                            bits_f16x2((u0 >> 8) | (u0 << 7)),
                                            bits_f16x2((u1 >> 8) | (u1 << 7))};
                    mma16816<false>(acc[0], ac, qch[h]);
                    if constexpr (G8) mma16816<false>(acc[1], ac, qcl[h]);
                }
#pragma unroll
                for (int tt = 0; tt < 2; tt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int e = 2 * tt + c;
                        float v = (acc[0][e] + acc[1][e]) + (acc[2][e] + acc[3][e]);
                        /* (RC: P = 1) */
                        vs[tt][c] += RC ? v * ksc[tt] + bias[e] : v * ksc[tt];
                    }
            }
#pragma unroll
            for (int tt = 0; tt < 2; tt++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    /* G ≤ 4: lanes t4 and t4 ^ 2 hold the hi and lo parts of the same heads (the same
                     * tokens, the same steps) */
                    float v = vs[tt][c];
                    if (!G8) v += __shfl_xor_sync(0xffffffffu, v, 2);
                    const int pos = tile0 + 16 * u + g + 8 * tt;
                    out[u][tt][c] = pos >= end || (SK && pos < lo) ? -INFINITY : v;
                }
        }
    };
    /* software-pipelined: the scores of tile i + 1 are computed between the probabilities and the value
     * products of tile i (one basic block), so their independent chains overlap; tile i + 1 must then be
     * resident, so BOX_STAGES − 2 tiles stay in flight during the compute */
    float sc[NT][2][2];
    BOX_STAMP(1);
    if (n_t > 0) {
        cp_wait<BOX_STAGES - 2>();
        __syncwarp();
        scores(0, first, sc);
    }
    for (int i = 0; i < n_t; i++) {
        const int jn = i + BOX_STAGES - 1;
        if (jn < n_t) issue_tile(first + jn * step, jn % BOX_STAGES, pg_next, o_next);
        cp_commit();
        if (jn + 1 < n_t) lookup(first + (jn + 1) * step, pg_next, o_next);
        /* ---- online softmax; the maximum moves only when a score passes it */
        bool up = false;
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int tt = 0; tt < 2; tt++)
                up = up || sc[u][tt][0] > m0 || sc[u][tt][1] > m1;
        if (__any_sync(0xffffffffu, up)) {
            float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
            for (int u = 0; u < NT; u++)
#pragma unroll
                for (int tt = 0; tt < 2; tt++)
                    x0 = fmaxf(x0, sc[u][tt][0]), x1 = fmaxf(x1, sc[u][tt][1]);
#pragma unroll
            for (int o = 4; o < 32; o *= 2) {
                x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o));
                x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o));
            }
            const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
            const float al0 = n0 == -INFINITY ? 1.0f : ex2(m0 - n0),
                        al1 = n1 == -INFINITY ? 1.0f : ex2(m1 - n1);
            m0 = n0, m1 = n1;
            l0 *= al0, l1 *= al1;
            scale_cols<P * KS>(oacc, al0, al1);
            scale_cols<P>(ocos, al0, al1);
        }
        cp_wait<BOX_STAGES - 2>();
        __syncwarp();
        /* tile i + 1 (past the last tile: stale bytes, every score masked, never used) */
        float sn[NT][2][2];
        scores((i + 1) % BOX_STAGES, first + (i + 1) * step, sn);
#pragma unroll
        for (int u = 0; u < NT; u++) {
            float wt[2][2]; /* the weights of tokens g (tt = 0) and g + 8 (tt = 1), heads h0 and h1 */
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                wt[tt][0] = m0 == -INFINITY ? 0.0f : ex2(sc[u][tt][0] - m0);
                wt[tt][1] = m1 == -INFINITY ? 0.0f : ex2(sc[u][tt][1] - m1);
                l0 += wt[tt][0], l1 += wt[tt][1];
            }
#pragma unroll
            for (int h = 0; h < P; h++) {
                const uint8_t *const sb = &stage[warp][i % BOX_STAGES][u * P + h][0];
                /* P·(δ_v/2) in f16 hi/lo, transposed into the B fragments (tokens 2t4.., column g) */
                uint32_t pb[2], pl[2] = {0u, 0u};
#pragma unroll
                for (int tt = 0; tt < 2; tt++) {
                    const int tk = g + 8 * tt;
                    const float vsc = sh[sb[GV::V_SIDE + VSH + tk]] * V_BOX_SCALE;
                    const float x0 = wt[tt][0] * vsc, x1 = wt[tt][1] * vsc;
                    if constexpr (G8) {
                        pb[tt] = transpose8x8(pack(hi16<false>(x0), hi16<false>(x1)));
                        pl[tt] = transpose8x8(pack(lo16<false>(x0), lo16<false>(x1)));
                    } else {
                        pb[tt] = transpose8x8(t4 < 2 ? pack(hi16<false>(x0), hi16<false>(x1))
                                                     : pack(lo16<false>(x0), lo16<false>(x1)));
                    }
                }
                /* ---- values: tokens 2t4, 2t4 + 1, 2t4 + 8, 2t4 + 9 */
                const int tv[4] = {2 * t4, 2 * t4 + 1, 2 * t4 + 8, 2 * t4 + 9};
                if constexpr (BV == 3) {
                    /* A = box3_vtile_nc of the token pairs (2t4, 2t4 + 1) (a0, a1) and (2t4 + 8, 2t4 + 9)
                     * (a2, a3) */
                    uint32_t vw[4][2];
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        box3_lds_v<D>(vw[r], sb + VSH, tv[r], g);
#pragma unroll
                    for (int mt = 0; mt < KS; mt++) {
                        uint32_t r0[2], r1[2];
                        box3_vtile_nc<D>(vw[0], vw[1], g, mt, magic, r0);
                        box3_vtile_nc<D>(vw[2], vw[3], g, mt, magic, r1);
                        const uint32_t r[4] = {r0[0], r0[1], r1[0], r1[1]};
                        mma16816<false>(oacc[h * KS + mt], r, pb);
                        if constexpr (G8) mma16816<false>(oacc[h * KS + mt], r, pl);
                    }
                } else {
                    uint32_t vw[4][D / 64 > 0 ? D / 64 : 1];
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        if constexpr (D == 128) {
                            const uint2 q2 =
                                *(const uint2 *)(sb + VSH + GV::V_OFF + tv[r] * GV::VROW + 8 * g);
                            vw[r][0] = q2.x, vw[r][1] = q2.y;
                        } else {
                            vw[r][0] = *(const uint32_t *)(sb + VSH + GV::V_OFF + tv[r] * GV::VROW + 4 * g);
                        }
                    }
#pragma unroll
                    for (int mt = 0; mt < KS; mt++) {
                        const int wi = mt >> 2, bi = mt & 3;
                        const uint32_t sel = bi | ((4 + bi) << 8);
                        const uint32_t x0 = __byte_perm(vw[0][wi], vw[1][wi], sel),
                                       x1 = __byte_perm(vw[2][wi], vw[3][wi], sel);
                        const uint32_t r[4] = {nib_lo(x0, magic), nib_hi(x0, magic), nib_lo(x1, magic),
                                               nib_hi(x1, magic)};
                        mma16816<false>(oacc[h * KS + mt], r, pb);
                        if constexpr (G8) mma16816<false>(oacc[h * KS + mt], r, pl);
                    }
                }
                {
                    /* the coset part: A = coset bits (block g / g + 8, tokens 2t4, 2t4 + 1 / 2t4 + 8, 2t4 +
                     * 9; e8box:3 has the same coset bytes and block order) */
                    uint32_t vc[2];
#pragma unroll
                    for (int pr = 0; pr < 2; pr++)
                        vc[pr] = GV::NC == 2
                                     ? *(const uint32_t *)(sb + VSH + GV::V_SIDE + 16 + 2 * tv[2 * pr])
                                     : *(const uint16_t *)(sb + VSH + GV::V_SIDE + 16 + tv[2 * pr]);
                    uint32_t ac[4];
#pragma unroll
                    for (int pr = 0; pr < 2; pr++) {
                        const uint32_t x = vc[pr] >> g; /* bit 0: token 2t4 + 8pr, bit CB: the next token */
                        ac[2 * pr] = bits_f16x2(CB == 16 ? x : (x | (x << 8)));
                        ac[2 * pr + 1] = CB == 16 ? bits_f16x2(x >> 8) : 0u;
                    }
                    mma16816<false>(ocos[h], ac, pb);
                    if constexpr (G8) mma16816<false>(ocos[h], ac, pl);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int tt = 0; tt < 2; tt++)
                sc[u][tt][0] = sn[u][tt][0], sc[u][tt][1] = sn[u][tt][1];
        __syncwarp();
    }
    cp_wait<0>();
    /* ---- merge the warps: l over the tokens (rows g), then columns through shared memory */
#pragma unroll
    for (int o = 4; o < 32; o *= 2) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o);
    }
    __syncthreads(); /* every warp is done with its stages: they become the merge buffer */
    BOX_STAMP(2);
    float(*so)[8][DQ] = reinterpret_cast<float(*)[8][DQ]>(box_dyn);
#pragma unroll
    for (int h = 0; h < P; h++) {
#pragma unroll
        for (int mt = 0; mt < KS; mt++) {
            const int dl = D * h + vdim < D, BV == 4 ? FMT_BOX4 : FMT_BOX3 > (g, mt, 0),
                      dh = D * h + vdim < D, BV == 4 ? FMT_BOX4 : FMT_BOX3 > (g, mt, 1);
            so[warp][2 * t4][dl] = oacc[h * KS + mt][0];
            so[warp][2 * t4 + 1][dl] = oacc[h * KS + mt][1];
            so[warp][2 * t4][dh] = oacc[h * KS + mt][2];
            so[warp][2 * t4 + 1][dh] = oacc[h * KS + mt][3];
        }
        /* block b of half h: column 16h + b (the output coordinate i's is i >> 3 at every P) */
        scos[warp][2 * t4][16 * h + g] = ocos[h][0];
        scos[warp][2 * t4 + 1][16 * h + g] = ocos[h][1];
        scos[warp][2 * t4][16 * h + g + 8] = ocos[h][2];
        scos[warp][2 * t4 + 1][16 * h + g + 8] = ocos[h][3];
    }
    if (g == 0 && (G8 || t4 < 2)) {
        sm[warp][2 * t4] = m0, sm[warp][2 * t4 + 1] = m1;
        sl[warp][2 * t4] = l0, sl[warp][2 * t4 + 1] = l1;
    }
    __syncthreads();
    store_split<DQ>(a, seq, kvh, G, split, sm, sl, [&](int w, int r, int i) {
        float o = so[w][r][i] + scos[w][r][i >> 3];
        if (!G8) o += so[w][r + 4][i] + scos[w][r + 4][i >> 3];
        return o;
    });
    BOX_STAMP(3);
    merge_last<DQ, SK>(a, seq, kvh, G, so);
    BOX_STAMP(4);
}

/* One wave: every block of the launch resident at once and all with the same work, so no tail. */
/* ---- e8p:2 pages (K and V both) on the tensor cores ----
 *
 * The frame of attn_split_kernel: a warp takes 16-token sub-tiles of its split (E8P_NT per step, the next
 * step's codes already loaded into registers, the pages of the step after that too), the scores are
 * S = Q·Kᵀ with the query rows as A (rows 0..G−1 the f16 hi parts, 8..8+G−1 the lo parts) and the score
 * fragment of a thread is the P fragment it feeds into Oᵀ += Vᵀ·Pᵀ. For G = 4 (E8P_SW; Llama-3-8B) the
 * scores are Sᵀ = K·Qᵀ instead: the decoded K words of a lane's two tokens g, g + 8 are exactly an A fragment
 * (16 tokens × 16 coordinates), the query is B (columns 0..3 the hi parts, 4..7 the lo parts), so one product
 * covers 16 tokens instead of 8 and no lane computes empty rows; hi + lo is one shuffle (lanes t4, t4 ^ 2),
 * each lane keeps the softmax state of its two heads (2t4 + c) & 3, which are also the output columns it
 * rescales, and movmatrix transposes P·δ (hi parts from lanes t4 < 2, lo parts from the others) into the B
 * fragments of Oᵀ += Vᵀ·Pᵀ. H100, Llama-3-8B 8 × 32K: 143 → 121 µs (ncu: 61.6 → 55.1 M instructions, and
 * 15 registers fewer).
 *
 * Decode (doc/format.md §2.5): coordinate i of a block is x̂_i = δ/4·((1 − 2σ_i)(4c_i + 2) + 2h − 1)
 * = δ·(G_i + (2h − 31)/4) with G_i = 8 + c_i for σ_i = 0 and 7 − c_i for σ_i = 1, i.e. the nibble
 * G_i = (8 | c_i) XOR 0xF·σ_i. Two tables in shared memory give the eight nibbles of a block at once:
 * T[t] = the nibbles 8 | c_i of pattern t (nibble 7 XOR 0xF when Σc_i is odd: that share of σ_7), and
 * S[b] for the code's second byte b = the nibbles 0xF·σ_i (nibble 7: 0xF·(σ_0 ⊕ … ⊕ σ_6)), so that
 * Y = T[t] XOR S[b] holds the G_i (S[b] depends on b's low 7 bits only: the top bit is h). Row r of the
 * table area is 256 bytes: T[r] written 32 times over (bytes 4l … 4l + 3 for lane l), then S[r] 32 times
 * over, so a warp's random lookups never share a bank, and the byte offset of an entry is one PRMT of the
 * code word with the lane's offset (code byte → bits 8..15, 4l or 128 + 4l → bits 0..7): the integer pipe,
 * which the decode keeps busier than any other, does one instruction per lookup. The words
 * Y & 0x000F000F, Y & 0x00F000F0 and the same of Y >> 8 (a multiply-high, on the FMA pipe) are f16x2
 * subnormals G·2^-24 and G·2^-20, exact mma operands with no bias to remove
 * (one accumulator per scale; the k-steps of the scores are grouped by scale, the output rows keep theirs
 * until the merge). The (2h − 31)/4 part is one more product per sub-tile with 2h − 31 per (token, block)
 * as an operand: against ¼ of the query's sum over each block (scores), or against P·δ (values: per block of
 * coordinates, added at the merge). Since q·k is invariant under a permutation of the coordinates, the
 * lane that decodes a block gets the query coordinates that match (the qa setup below) and the output
 * coordinates are put back in order at the merge. V stays rotated until merge_last. */
#ifndef E8P_NT
#define E8P_NT 2 /* 16-token sub-tiles per warp step */
#endif
#ifndef E8P_MINB
#define E8P_MINB 3 /* resident blocks per SM the register budget is made for */
#endif
#ifndef E8P_ROWS
#define E8P_ROWS 1 /* 1: 256-byte rows of T and S (64 KB, PRMT offsets); 0: T then S by entry (48 KB) */
/* (0 with E8P_MINB 4, 16 warps per SM at 128 registers: 8 × 32K 137 µs against 121 for the default, H100) */
#endif
#if E8P_ROWS
#define E8P_TAB_BYTES (256 * 256) /* 256 rows of T and S entries, 32 copies each */
#else
#define E8P_TAB_BYTES (384 * 128) /* T (256 entries) then S (128 entries), 32 copies each */
#endif
#ifndef E8P_SW
#define E8P_SW 1 /* G = 4: scores as Sᵀ = K·Qᵀ (16 tokens per product) */
#endif
/* P·δ_V lifted out of f16 subnormals: an exact power of 2, divided out at the merge */
#define E8P_VSCALE 64.0f
__constant__ uint16_t c_pat_a[256];

/* dynamic shared memory of attn_e8p_kernel<D, GT>: the table rows (T and S, 256 × 64 words); the rotated
 * query sq[8][D] f32 is made there first, the merge buffer (WARPS × 8 × D floats) after the loop */
template <int D> static constexpr int e8p_smem_bytes(void) {
    return E8P_TAB_BYTES;
}

/* The code bytes one lane needs for E8P_NT sub-tiles:
 *   K: tokens g and 8 + g, blocks (D/32)·t4 … (D/32)·t4 + D/32 − 1 (D/64 words of two block codes);
 *   V: tokens 2t4, 2t4 + 1, 2t4 + 8, 2t4 + 9, blocks (D/64)·g … (one word, or its low half at d = 64);
 *   the step bytes of tokens 8tt + 2t4 and 8tt + 2t4 + 1 (the score / P columns of the thread). */
template <int D> struct e8p_regs {
    uint32_t kw[E8P_NT][2][D / 64];
    uint32_t vw[E8P_NT][4];
    uint32_t ks[E8P_NT][2], vs[E8P_NT][2];
};

/* The pages of the E8P_NT sub-tiles from token t0 on (0 past the end: those sub-tiles are skipped), loaded
 * a step before e8p_load needs them, so that the code loads do not wait for the block table */
template <int P = 1>
__device__ __forceinline__ void e8p_pages(int (&pg)[E8P_NT], const int32_t *table, int t0, int end, int bs,
                                          int bshift) {
#pragma unroll
    for (int u = 0; u < E8P_NT; u++) {
        const int s0 = t0 + 16 * (u / P); /* P = 2: slots 2u', 2u' + 1 are the halves of sub-tile u' */
        /* pages of 16·2^k tokens (bshift = k + 4 ≥ 4): the page by a shift, else by division */
        pg[u] = s0 < end ? __ldg(table + (bshift >= 4 ? s0 >> bshift : s0 / bs)) : 0;
    }
}

/* A lane's four code addresses in page 0 (K and V codes, K and V step bytes) and the page sizes (< 2^32
 * bytes, the cache checks it): per sub-tile, one 32 × 32 → 64-bit multiply-add and one 64-bit add per
 * address. */
struct e8p_base {
    const uint8_t *kb, *vb; /* the KV head's area in page 0 of each pool */
    uint32_t okt, ovt, os;  /* the lane's byte offsets there: K codes, V codes, step bytes (K and V alike) */
    uint32_t kpb, vpb;      /* page sizes */
    uint32_t khb, vhb;      /* P = 2: the second half's area is one head area further */
};
template <int D, bool SW, int P = 1>
__device__ __forceinline__ e8p_base e8p_bases(const attn_launch &a, int kvh, int g, int t4) {
    const int bs = (int)a.block_size;
    e8p_base b;
    b.kb = a.k.pool + (size_t)(P * kvh) * a.k.head_bytes;
    b.vb = a.v.pool + (size_t)(P * kvh) * a.v.head_bytes;
    b.khb = (uint32_t)a.k.head_bytes, b.vhb = (uint32_t)a.v.head_bytes;
    b.okt = g * (D / 4) + (D / 16) * t4;
    b.ovt = 2 * t4 * (D / 4) + (D / 32) * g;
    b.os = bs * (D / 4) + (SW ? g : 2 * t4);
    b.kpb = (uint32_t)a.k.page_bytes, b.vpb = (uint32_t)a.v.page_bytes;
    /* opaque to the compiler, which would otherwise recompute them from the thread index and the launch
     * parameters in every step (register pressure): ~30 instructions per sub-tile */
    asm volatile("" : "+r"(b.okt), "+r"(b.ovt), "+r"(b.os), "+l"(b.kb), "+l"(b.vb));
    return b;
}

/* P = 2: slot u holds half u % P of sub-tile u / P */
template <int D, bool SW, int P = 1>
__device__ __forceinline__ void e8p_load(e8p_regs<D> &r, const e8p_base &b, const int (&pg)[E8P_NT], int t0,
                                         int end, int bs, int bshift) {
#pragma unroll
    for (int u = 0; u < E8P_NT; u++) {
        const int s0 = t0 + 16 * (u / P);
        if (s0 >= end) continue; /* its page may not exist; the sub-tile is skipped */
        const uint32_t page = (uint32_t)pg[u], o0 = bshift >= 4 ? s0 & ((1 << bshift) - 1) : s0 % bs;
        /* one base per stream and area, the rest immediate offsets */
        const uint8_t *const kp = b.kb + (uint64_t)page * b.kpb + (u % P) * b.khb;
        const uint8_t *const vp = b.vb + (uint64_t)page * b.vpb + (u % P) * b.vhb;
        const uint8_t *const kt = kp + (b.okt + o0 * (D / 4)), *const vt = vp + (b.ovt + o0 * (D / 4));
        const uint8_t *const ksd = kp + (b.os + o0), *const vsd = vp + (b.os + o0);
#pragma unroll
        for (int tt = 0; tt < 2; tt++) {
            if constexpr (D == 128) {
                const uint2 x = __ldg((const uint2 *)(kt + 8 * tt * (D / 4)));
                r.kw[u][tt][0] = x.x, r.kw[u][tt][1] = x.y;
            } else {
                r.kw[u][tt][0] = __ldg((const uint32_t *)(kt + 8 * tt * (D / 4)));
            }
            if constexpr (SW) { /* token g + 8tt */
                r.ks[u][tt] = __ldg(ksd + 8 * tt);
                r.vs[u][tt] = __ldg(vsd + 8 * tt);
            } else { /* tokens 8tt + 2t4, 8tt + 2t4 + 1 */
                r.ks[u][tt] = __ldg((const uint16_t *)(ksd + 8 * tt));
                r.vs[u][tt] = __ldg((const uint16_t *)(vsd + 8 * tt));
            }
        }
        constexpr int tv[4] = {0, 1, 8, 9}; /* tokens 2t4 + tv[i] */
#pragma unroll
        for (int i = 0; i < 4; i++)
            r.vw[u][i] = D == 128 ? __ldg((const uint32_t *)(vt + tv[i] * (D / 4)))
                                  : (uint32_t)__ldg((const uint16_t *)(vt + tv[i] * (D / 4)));
    }
}

/* T[t] and S[b] of the block code in the low (hf = 0) or high half of w; lane4 = 4 · lane: the row of T is
 * the code's first byte, the row of S its second (its top bit h lands on a copy of S) */
__device__ __forceinline__ void e8p_ts(const uint8_t *tabs, uint32_t lane4, uint32_t w, int hf, uint32_t &T,
                                       uint32_t &S) {
#if E8P_ROWS
    T = *reinterpret_cast<const uint32_t *>(tabs + __byte_perm(w, lane4, hf ? 0x5524 : 0x5504));
    S = *reinterpret_cast<const uint32_t *>(tabs + __byte_perm(w, lane4 | 128u, hf ? 0x5534 : 0x5514));
#else
    T = *reinterpret_cast<const uint32_t *>(tabs + (((hf ? w >> 9 : w << 7) & 0x7F80u) | lane4));
    S = *reinterpret_cast<const uint32_t *>(tabs + 256 * 128 + (((hf ? w >> 17 : w >> 1) & 0x3F80u) | lane4));
#endif
}
/* Y = T XOR S: the nibbles G_i of the block */
__device__ __forceinline__ uint32_t e8p_y(const uint8_t *tabs, uint32_t lane4, uint32_t w, int hf) {
    uint32_t T, S;
    e8p_ts(tabs, lane4, w, hf, T, S);
    return T ^ S;
}

/* x >> 8 as a multiply-high: the FMA pipe instead of the integer pipe's shifter */
__device__ __forceinline__ uint32_t e8p_shr8(uint32_t x) {
    uint32_t r;
    asm("mul.hi.u32 %0, %1, 16777216;" : "=r"(r) : "r"(x));
    return r;
}

/* (a ^ b) & m in one LOP3 (the compiler shares a ^ b between two masks otherwise) */
template <uint32_t M> __device__ __forceinline__ uint32_t e8p_xand(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0x28;" : "=r"(r) : "r"(a), "r"(b), "n"(M));
    return r;
}
/* (~a & 0x00800080) | 0xCF40CF40 in one LOP3 */
__device__ __forceinline__ uint32_t e8p_hsel(uint32_t a) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xAE;" : "=r"(r) : "r"(a), "r"(0x00800080u), "r"(0xCF40CF40u));
    return r;
}
/* the shift bits h of two block codes (bits 15, 31 of x) → f16x2 of 2h − 31 (−29 = 0xCF40, −31 = 0xCFC0) */
__device__ __forceinline__ uint32_t e8p_hword(uint32_t x) {
    return e8p_hsel(x >> 8);
}
/* the same for the first blocks of x and y (bits 15 of each; PRMT's sign copy puts them in bits 7 and 23) */
__device__ __forceinline__ uint32_t e8p_hword2(uint32_t x, uint32_t y, int hf) {
    return e8p_hsel(__byte_perm(x, y, hf ? 0xFFBB : 0xDD99));
}

/* GT: the GQA group size n_head / n_head_kv when it is known at compile time (4: Llama-3-8B), else 0; RC:
 * center=rope (the keys' turned centre added to each score, as attn_box_kernel's RC instance) */
/* P = 2: head_dim 256 (D = 128), a KV head kept as two heads of 128 (attn_pair_kernel), GT = 0 (any G ≤ 4,
 * the scores as Sᵀ = K·Qᵀ with the columns of heads past G zero), no center=rope: register slot u of a step
 * holds half u % 2 of sub-tile u / 2 (E8P_NT / 2 sub-tiles per step), a score adds both halves' sums (each
 * times its own step), the output keeps one set of fragments per half and merge_last undoes each half's
 * transform */
template <int D, int GT, bool SK, bool RC, int P = 1>
__global__ void __launch_bounds__(128, P == 2 ? 2 : E8P_MINB) attn_e8p_kernel(const attn_launch a) {
    static_assert(P == 1 || (P == 2 && D == 128 && GT == 0 && !RC && E8P_NT % 2 == 0 && E8P_SW),
                  "head_dim 256 (the score product with K as A)");
    constexpr int KS = D / 16, BPL = D / 32, NBL = D / 64, KW = D / 64, NTT = E8P_NT / P, DQ = D * P;
    extern __shared__ __align__(16) uint32_t e8p_dyn[];
    float(*const sq)[DQ] = reinterpret_cast<float(*)[DQ]>(e8p_dyn); /* until the tables are made */
    __shared__ float sh[256];                                       /* δ(e) */
    __shared__ float sm[WARPS][8], sl[WARPS][8];
    __shared__ float scos[WARPS][8][16 * P];
    /* center=rope: per warp, two steps of the cos, sin of each sub-tile's first position for the row's
     * RC_PAIRS pairs (the next step's copied while this one is computed) */
    __shared__ __align__(16) float2 rcs[WARPS][2][RC ? E8P_NT * RC_PAIRS : 1];
    static_assert(E8P_TAB_BYTES >= sizeof(float) * WARPS * 8 * DQ, "the merge buffer aliases the tables");

    const int split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
    const int G = GT ? GT : (int)(a.n_head / a.n_head_kv);
    const bool LO = 2 * G <= 8;
    /* the score product with K as A (below): G = 4, and every G ≤ 4 at P = 2 (the heads past G zero) */
    constexpr bool SW = (GT == 4 || P == 2) && E8P_SW;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int n_split = (int)a.n_split;
    const int ctx = table_ctx(a, seq);
    const int chunk = ((ctx + n_split - 1) / n_split + 16 * NTT - 1) & -(16 * NTT);
    const int start = split * chunk, end = min(start + chunk, ctx);
    const int lo = SK ? min(a.sink_n, ctx) : 0; /* sink positions [0, lo): masked (attn_split_kernel) */
    const unsigned span = end > lo ? (unsigned)(end - lo) : 0u;
    const int32_t *const table = a.block_tables + (size_t)seq * a.max_blocks;
    const int step = 16 * NTT * WARPS, first = start + 16 * NTT * warp;
    const int bshift = (a.block_size & (a.block_size - 1)) == 0 ? __ffs((int)a.block_size) - 1 : 0;

    if (SK) sink_prefetch<DQ>(a, seq, kvh, split);
    /* center=rope: lane c < RC_PAIRS copies the cos, sin of the row's c-th pair at each sub-tile's first
     * position (a bad row copies nothing: its output is NaN, merge_last) */
    const int rrow = RC ? seq_row(a, seq) : -1;
    const float *const rcp = RC && rrow >= 0 ? a.k.rc + ((size_t)rrow * a.n_head_kv + kvh) * RC_FLOATS : NULL;
    const float *const rc_cs =
        rcp && lane < RC_PAIRS ? a.k.cs + 2 * ((const int32_t *)(rcp + 2 * RC_PAIRS))[lane] : NULL;
    const int2 rc_sh = rc_cs ? rc_shift(a.k.shift, rrow) : make_int2(0, 0); /* e8kv_cuda_set_row_shifts */
    auto rc_issue = [&](int t0, int buf) {
        if constexpr (RC) {
            if (rc_cs)
#pragma unroll
                for (int u = 0; u < E8P_NT; u++)
                    if (t0 + 16 * u < end)
                        cp8((uint32_t)__cvta_generic_to_shared(&rcs[warp][buf][RC_PAIRS * u + lane]),
                            rc_cs + (size_t)rc_position(rc_sh, t0 + 16 * u, a.k.n_pos) * D);
            cp_commit();
        }
    };
    /* the first step's codes are in flight while the tables and the query are made */
    e8p_regs<D> cur, nxt;
    int pg[E8P_NT]; /* the pages of the next step */
    e8p_pages<P>(pg, table, first, end, (int)a.block_size, bshift);
    const e8p_base eb = e8p_bases<D, SW, P>(a, kvh, g, t4);
    if (first < end) e8p_load<D, SW, P>(cur, eb, pg, first, end, (int)a.block_size, bshift);
    rc_issue(first, 0);
    e8p_pages<P>(pg, table, first + step, end, (int)a.block_size, bshift);

    if (SK && split == 0) sink_state<DQ>(a, seq, kvh, G);
    load_query<D, P>(a, seq, kvh, G, true, sq);
    const float qscale = a.rot_scale * rsqrtf((float)DQ) * LOG2E;
    /* A fragments: k-step s holds block (D/32)·t4 + s/2 of the lane's K words, elements (0, 4) / (2, 6) for
     * s even (scale 2^-24), (1, 5) / (3, 7) for s odd (2^-20): k index 2t4 + 8u + c ↔ element s%2 + 2u + 4c.
     * qs: the shift product, k index 2t4 + 8u + c ↔ block (D/32)·t4 + 2u + c, ¼ of the block's query sum. */
    uint32_t qa[P][KS][SW ? 2 : 4], qs[P][SW ? 2 : 4]; /* P = 2: [h] for half h (query coordinates D·h..) */
    if constexpr (SW) {
        /* B fragments of Qᵀ (k × 8 columns: column g the hi part of head g for g < 4, the lo part of head g −
         * 4 for g ≥ 4), same k order as the A fragments below: qa[s][u] holds k 2t4 + 8u + c ↔ element s%2 +
         * 2u + 4c of block (D/32)·t4 + s/2; qs[u]: k 2t4 + 8u + c ↔ block (D/32)·t4 + 2u + c */
        const int hd = g & 3;
#pragma unroll
        for (int h = 0; h < P; h++) {
#pragma unroll
            for (int s = 0; s < KS; s++)
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    float x[2];
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        x[c] = hd < G ? sq[hd][D * h + 8 * (BPL * t4 + (s >> 1)) + (s & 1) + 2 * u + 4 * c] *
                                            qscale
                                      : 0.0f;
                    qa[h][s][u] = g < 4 ? pack(hi16<false>(x[0]), hi16<false>(x[1]))
                                        : pack(lo16<false>(x[0]), lo16<false>(x[1]));
                }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                float x[2];
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int lb = 2 * u + c;
                    float sum = 0.0f;
                    if (hd < G && lb < BPL)
                        for (int i = 0; i < 8; i++)
                            sum += sq[hd][D * h + 8 * (BPL * t4 + lb) + i] * qscale;
                    x[c] = 0.25f * sum;
                }
                qs[h][u] = g < 4 ? pack(hi16<false>(x[0]), hi16<false>(x[1]))
                                 : pack(lo16<false>(x[0]), lo16<false>(x[1]));
            }
        }
    } else { /* (P = 1) */
#pragma unroll
        for (int s = 0; s < KS; s++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float x[2];
#pragma unroll
                for (int c = 0; c < 2; c++)
                    x[c] = g < G ? sq[g][8 * (BPL * t4 + (s >> 1)) + (s & 1) + 2 * (j >> 1) + 4 * c] * qscale
                                 : 0.0f;
                qa[0][s][j] = (j & 1) ? pack(lo16<false>(x[0]), lo16<false>(x[1]))
                                      : pack(hi16<false>(x[0]), hi16<false>(x[1]));
            }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float x[2];
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int lb = 2 * (j >> 1) + c;
                float sum = 0.0f;
                if (g < G && lb < BPL)
                    for (int i = 0; i < 8; i++)
                        sum += sq[g][8 * (BPL * t4 + lb) + i] * qscale;
                x[c] = 0.25f * sum;
            }
            qs[0][j] = (j & 1) ? pack(lo16<false>(x[0]), lo16<false>(x[1]))
                               : pack(hi16<false>(x[0]), hi16<false>(x[1]));
        }
    }
    __syncthreads(); /* sq is read: the tables take its place */
    for (int i = tid; i < 256; i += blockDim.x) {
        const unsigned W = c_pat_a[i];
        uint32_t T = 0, S = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            T |= (8u | ((W >> (2 * k)) & 3u)) << (4 * k);
            if (k < 7) S |= (((unsigned)i >> k) & 1u) * (0xFu << (4 * k));
        }
        if (__popc(W & 0x5555u) & 1) T ^= 0xF0000000u;
        if (__popc((unsigned)i & 0x7Fu) & 1) S |= 0xF0000000u;
#if E8P_ROWS
        uint4 *const row = reinterpret_cast<uint4 *>(e8p_dyn + 64 * i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            row[j] = make_uint4(T, T, T, T), row[8 + j] = make_uint4(S, S, S, S);
#else
        uint4 *const dT = reinterpret_cast<uint4 *>(e8p_dyn + 32 * i), *const dS = reinterpret_cast<uint4 *>(
                                                                           e8p_dyn + 256 * 32 + 32 * i);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            dT[j] = make_uint4(T, T, T, T);
            if (i < 128) dS[j] = make_uint4(S, S, S, S);
        }
#endif
        sh[i] = i ? c_box_frac[i & 7] * __int_as_float(((i >> 3) - 20 + 127) << 23) : 0.0f;
    }
    __syncthreads();

    /* center=rope: + q·R_p·μ for the row's RC_PAIRS pairs (rc_operands), one product per 16-token sub-tile
     * at p0 between the constant table and, per head, the pair's (α·C + β·S, β·C − α·S). SW: the table is A
     * (rows = tokens), the heads B (columns as qa's); else the heads are A (rows g / g + 8 = hi / lo of head
     * g, as qa's) and the table B. The pages hold x − R_p·μ there. */
    float rc_al[2] = {}, rc_be[2] = {};
    uint32_t rc_th[4] = {}, rc_tl[4] = {};
    if constexpr (RC)
        rc_operands<D>(a, rcp, seq, kvh, G, SW ? (g & 3) : g, g, t4, rc_al, rc_be, rc_th, rc_tl);
    /* the head side of sub-tile u's bias (buffer buf): x[e] = pair t4 + 4e's two k entries */
    auto rc_heads = [&](int buf, int u, float(&x)[2][2]) {
        const float2 cs[2] = {rcs[warp][buf][RC_PAIRS * u + t4], rcs[warp][buf][RC_PAIRS * u + t4 + 4]};
        rc_turn(rc_al, rc_be, cs, x);
    };
    int rc_buf = 0;

    float m = -INFINITY, l = 0.0f;
    float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.0f, 0.0f}; /* SW: heads (2t4 + c) & 3 */
    float oacc[P * KS][4], ocos[P][4];                          /* half h: oacc[h·KS + mt], ocos[h] */
#pragma unroll
    for (int mt = 0; mt < P * KS; mt++)
        oacc[mt][0] = oacc[mt][1] = oacc[mt][2] = oacc[mt][3] = 0.0f;
#pragma unroll
    for (int h = 0; h < P; h++)
        ocos[h][0] = ocos[h][1] = ocos[h][2] = ocos[h][3] = 0.0f;
    const p_cols pc = p_columns(lane, G, LO);
    const uint8_t *const tabs = reinterpret_cast<const uint8_t *>(e8p_dyn);
    const uint32_t lane4 = 4 * lane;
    /* ---- values of register slot us into half h's output: rows g / g + 8 of M-tile 4bb + k = elements
     * k / 4 + k of block (D/64)·g + bb, columns tokens 2t4, 2t4 + 1 (a0, a1) and 2t4 + 8, 2t4 + 9 (a2, a3) */
    auto values = [&](int us, int h, const uint32_t(&pb)[2], const uint32_t(&pl)[2]) {
#pragma unroll
        for (int bb = 0; bb < NBL; bb++) {
            uint32_t Yv[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                Yv[i] = e8p_y(tabs, lane4, cur.vw[us][i], bb);
            const uint32_t zl0 = __byte_perm(Yv[0], Yv[1], 0x5410), zh0 = __byte_perm(Yv[0], Yv[1], 0x7632),
                           zl1 = __byte_perm(Yv[2], Yv[3], 0x5410), zh1 = __byte_perm(Yv[2], Yv[3], 0x7632);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const bool s8 = k >= 2;
                const uint32_t msk = (k & 1) ? 0x00F000F0u : 0x000F000Fu;
                const uint32_t r[4] = {(s8 ? e8p_shr8(zl0) : zl0) & msk, (s8 ? e8p_shr8(zh0) : zh0) & msk,
                                       (s8 ? e8p_shr8(zl1) : zl1) & msk, (s8 ? e8p_shr8(zh1) : zh1) & msk};
                mma16816<false>(oacc[h * KS + 4 * bb + k], r, pb);
                if (!LO) mma16816<false>(oacc[h * KS + 4 * bb + k], r, pl);
            }
        }
        {
            /* the (2h − 31) part: rows g / g + 8 = blocks (D/64)·g and (D/64)·g + 1 */
            const uint32_t *const w = cur.vw[us];
            const uint32_t r[4] = {e8p_hword2(w[0], w[1], 0), NBL > 1 ? e8p_hword2(w[0], w[1], 1) : 0u,
                                   e8p_hword2(w[2], w[3], 0), NBL > 1 ? e8p_hword2(w[2], w[3], 1) : 0u};
            mma16816<false>(ocos[h], r, pb);
            if (!LO) mma16816<false>(ocos[h], r, pl);
        }
    };

    for (int t0 = first; t0 < end; t0 += step) {
        const int n0 = t0 + step;
        if constexpr (RC) { /* this step's cos, sin landed (every lane's copies); the other buffer is free */
            cp_wait<0>();
            __syncwarp();
        }
        if (n0 < end) {
            e8p_load<D, SW, P>(nxt, eb, pg, n0, end, (int)a.block_size, bshift);
            e8p_pages<P>(pg, table, n0 + step, end, (int)a.block_size, bshift);
            rc_issue(n0, rc_buf ^ 1);
        }
#pragma unroll
        for (int u = 0; u < NTT; u++) {
            const int tile0 = t0 + 16 * u;
            if (tile0 >= end) break;
            uint32_t pb[2], pl[2] = {0u, 0u};
            if constexpr (SW) {
                /* ---- scores Sᵀ = K·Qᵀ: A = 16 tokens (rows g, g + 8 = the lane's tokens of tt = 0, 1) × 16
                 * coordinates, B = the query columns (hi 0..3, lo 4..7): one product per 16 tokens instead of
                 * 8, and every lane's scores are used. acc[scale 2^-24, 2^-20, shift][fragment]: fragment
                 * 2r + c = token g + 8r, column 2t4 + c. P = 2: raw sums each half's (slot us = u·P + h)
                 * times its step */
                float raw[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
                for (int h = 0; h < P; h++) {
                    const int us = u * P + h;
                    float acc[3][4];
#pragma unroll
                    for (int x = 0; x < 3; x++)
                        acc[x][0] = acc[x][1] = acc[x][2] = acc[x][3] = 0.0f;
#pragma unroll
                    for (int wi = 0; wi < KW; wi++) {
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) {
                            uint32_t T0, S0, T1, S1;
                            e8p_ts(tabs, lane4, cur.kw[us][0][wi], hf, T0, S0);
                            e8p_ts(tabs, lane4, cur.kw[us][1][wi], hf, T1, S1);
                            const uint32_t T08 = e8p_shr8(T0), S08 = e8p_shr8(S0), T18 = e8p_shr8(T1),
                                           S18 = e8p_shr8(S1);
                            const int lb = 2 * wi + hf;
                            const uint32_t a0[4] = {
                                e8p_xand<0x000F000Fu>(T0, S0), e8p_xand<0x000F000Fu>(T1, S1),
                                e8p_xand<0x000F000Fu>(T08, S08), e8p_xand<0x000F000Fu>(T18, S18)};
                            const uint32_t a4[4] = {
                                e8p_xand<0x00F000F0u>(T0, S0), e8p_xand<0x00F000F0u>(T1, S1),
                                e8p_xand<0x00F000F0u>(T08, S08), e8p_xand<0x00F000F0u>(T18, S18)};
                            mma16816<false>(acc[0], a0, qa[h][2 * lb]);
                            mma16816<false>(acc[1], a4, qa[h][2 * lb + 1]);
                        }
                    }
                    {
                        const uint32_t ah[4] = {e8p_hword(cur.kw[us][0][0]), e8p_hword(cur.kw[us][1][0]),
                                                KW > 1 ? e8p_hword(cur.kw[us][0][KW - 1]) : 0u,
                                                KW > 1 ? e8p_hword(cur.kw[us][1][KW - 1]) : 0u};
                        mma16816<false>(acc[2], ah, qs[h]);
                    }
#pragma unroll
                    for (int r = 0; r < 2; r++)
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const float x =
                                0x1p24f * acc[0][2 * r + c] + 0x1p20f * acc[1][2 * r + c] + acc[2][2 * r + c];
                            raw[r][c] += P == 1 ? x : x * sh[cur.ks[us][r]];
                        }
                }
                float bias[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* center=rope: q·R_p·μ, fragment 2r + c */
                if constexpr (RC) {
                    float x[2][2];
                    rc_heads(rc_buf, u, x);
                    uint32_t bh[2];
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        bh[e] = g < 4 ? pack(hi16<false>(x[e][0]), hi16<false>(x[e][1]))
                                      : pack(lo16<false>(x[e][0]), lo16<false>(x[e][1]));
                    mma16816<false>(bias, rc_th, bh);
                    mma16816<false>(bias, rc_tl, bh);
                }
                const bool full = tile0 + 16 <= end && (!SK || tile0 >= lo);
                /* hi + lo: columns 2t4 + c and 2t4 + c ± 4 are lanes t4 and t4 ^ 2; both get head (2t4 + c) &
                 * 3 */
                float sc[2][2];
                bool over = false;
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        float x = raw[r][c], sv;
                        if constexpr (RC) { /* (P = 1) */
                            x = x * sh[cur.ks[u][r]] + bias[2 * r + c];
                            sv = x + __shfl_xor_sync(0xffffffffu, x, 2);
                        } else if constexpr (P == 1) {
                            x += __shfl_xor_sync(0xffffffffu, x, 2);
                            sv = x * sh[cur.ks[u][r]];
                        } else { /* the halves' sums already times their steps */
                            sv = x + __shfl_xor_sync(0xffffffffu, x, 2);
                        }
                        if (!full &&
                            (SK ? (unsigned)(tile0 + 8 * r + g - lo) >= span : tile0 + 8 * r + g >= end))
                            sv = -INFINITY;
                        sc[r][c] = sv;
                        over |= sv > m2[c];
                    }
                /* the running maxima move only when a score passes them (a warp vote): then the tile maxima
                 * over the tokens (lanes g) and the accumulators are rescaled, on those sub-tiles only */
                if (__any_sync(0xffffffffu, over)) {
                    float al[2];
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        float tmax = fmaxf(sc[0][c], sc[1][c]);
                        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 4));
                        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 8));
                        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
                        const float m_new = fmaxf(m2[c], tmax);
                        al[c] = m_new == -INFINITY ? 1.0f : ex2(m2[c] - m_new);
                        l2[c] *= al[c];
                        m2[c] = m_new;
                    }
                    scale_cols<P * KS>(oacc, al[0], al[1]);
                    scale_cols<P>(ocos, al[0], al[1]);
                }
                /* P·δ·64 of tokens g, g + 8: the hi parts in columns 0..3 (lanes t4 < 2), the lo parts
                 * in 4..7; a transpose of each 8 × 8 half gives the B fragments (tokens 2t4, 2t4 + 1 of
                 * column g) */
                float pr[2][2];
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        pr[r][c] = m2[c] == -INFINITY ? 0.0f : ex2(sc[r][c] - m2[c]);
                        l2[c] += pr[r][c];
                    }
#pragma unroll
                for (int h = 0; h < P; h++) {
                    const int us = u * P + h;
                    uint32_t pw[2];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        float pv[2];
#pragma unroll
                        for (int c = 0; c < 2; c++)
                            pv[c] = pr[r][c] * sh[cur.vs[us][r]] * E8P_VSCALE;
                        pw[r] = t4 < 2 ? pack(hi16<false>(pv[0]), hi16<false>(pv[1]))
                                       : pack(lo16<false>(pv[0]), lo16<false>(pv[1]));
                    }
                    pb[0] = transpose8x8(pw[0]);
                    pb[1] = transpose8x8(pw[1]);
                    values(us, h, pb, pl);
                }
            } else {
                /* ---- scores of tokens 8tt + 2t4 + c (P = 1): [tt][scale 2^-24, 2^-20, shift][fragment] */
                float acc[2][3][4];
#pragma unroll
                for (int tt = 0; tt < 2; tt++)
#pragma unroll
                    for (int x = 0; x < 3; x++)
                        acc[tt][x][0] = acc[tt][x][1] = acc[tt][x][2] = acc[tt][x][3] = 0.0f;
#pragma unroll
                for (int tt = 0; tt < 2; tt++) {
#pragma unroll
                    for (int wi = 0; wi < KW; wi++) {
                        const uint32_t w = cur.kw[u][tt][wi];
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) {
                            /* Y = T ^ S and Y >> 8 = (T >> 8) ^ (S >> 8): each XOR fuses with its mask
                             * into one LOP3, the shifts run on the FMA pipe */
                            uint32_t T, S;
                            e8p_ts(tabs, lane4, w, hf, T, S);
                            const uint32_t T8 = e8p_shr8(T), S8 = e8p_shr8(S);
                            const int lb = 2 * wi + hf;
                            const uint32_t b0[2] = {e8p_xand<0x000F000Fu>(T, S),
                                                    e8p_xand<0x000F000Fu>(T8, S8)};
                            const uint32_t b4[2] = {e8p_xand<0x00F000F0u>(T, S),
                                                    e8p_xand<0x00F000F0u>(T8, S8)};
                            mma16816<false>(acc[tt][0], qa[0][2 * lb], b0);
                            mma16816<false>(acc[tt][1], qa[0][2 * lb + 1], b4);
                        }
                    }
                    const uint32_t hb[2] = {e8p_hword(cur.kw[u][tt][0]),
                                            KW > 1 ? e8p_hword(cur.kw[u][tt][KW - 1]) : 0u};
                    mma16816<false>(acc[tt][2], qs[0], hb);
                }
                float bias[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}}; /* center=rope */
                if constexpr (RC) {
                    float x[2][2];
                    rc_heads(rc_buf, u, x);
                    const uint32_t ah[4] = {pack(hi16<false>(x[0][0]), hi16<false>(x[0][1])),
                                            pack(lo16<false>(x[0][0]), lo16<false>(x[0][1])),
                                            pack(hi16<false>(x[1][0]), hi16<false>(x[1][1])),
                                            pack(lo16<false>(x[1][0]), lo16<false>(x[1][1]))};
#pragma unroll
                    for (int tt = 0; tt < 2; tt++) {
                        const uint32_t bth[2] = {rc_th[tt], rc_th[tt + 2]},
                                       btl[2] = {rc_tl[tt], rc_tl[tt + 2]};
                        mma16816<false>(bias[tt], ah, bth);
                        mma16816<false>(bias[tt], ah, btl);
                    }
                }
                const bool full = tile0 + 16 <= end && (!SK || tile0 >= lo);
                float sc[2][2], tmax = -INFINITY;
#pragma unroll
                for (int tt = 0; tt < 2; tt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float raw = 0x1p24f * (acc[tt][0][c] + acc[tt][0][c + 2]) +
                                          0x1p20f * (acc[tt][1][c] + acc[tt][1][c + 2]) +
                                          (acc[tt][2][c] + acc[tt][2][c + 2]);
                        float sv = raw * sh[(cur.ks[u][tt] >> (8 * c)) & 255u];
                        if constexpr (RC) sv += bias[tt][c] + bias[tt][c + 2];
                        if (g >= G || (!full && (SK ? (unsigned)(tile0 + 8 * tt + 2 * t4 + c - lo) >= span
                                                    : tile0 + 8 * tt + 2 * t4 + c >= end)))
                            sv = -INFINITY;
                        sc[tt][c] = sv;
                        tmax = fmaxf(tmax, sv);
                    }
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
                /* the running maximum moves only when a score passes it (a warp vote): the accumulators are
                 * rescaled on those sub-tiles only */
                if (__any_sync(0xffffffffu, tmax > m)) {
                    const float m_new = fmaxf(m, tmax);
                    const float alpha = m_new == -INFINITY ? 1.0f : ex2(m - m_new);
                    l *= alpha;
                    m = m_new;
                    const float al0 = __shfl_sync(0xffffffffu, alpha, pc.col_row[0] * 4),
                                al1 = __shfl_sync(0xffffffffu, alpha, pc.col_row[1] * 4);
                    scale_cols<KS>(oacc, al0, al1);
                    scale_cols<1>(ocos, al0, al1);
                }
                float pv[2][2];
#pragma unroll
                for (int tt = 0; tt < 2; tt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float p = m == -INFINITY ? 0.0f : ex2(sc[tt][c] - m);
                        l += p;
                        pv[tt][c] = p * sh[(cur.vs[u][tt] >> (8 * c)) & 255u] * E8P_VSCALE;
                    }
                p_fragments<false>(pv, pc, g, G, pb, pl);
                values(u, 0, pb, pl);
            }
        }
        if (n0 < end) cur = nxt;
        rc_buf ^= 1;
    }
    /* ---- merge the warps: the output rows put back in coordinate order at their scale */
    if constexpr (SW) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            l2[c] += __shfl_xor_sync(0xffffffffu, l2[c], 4);
            l2[c] += __shfl_xor_sync(0xffffffffu, l2[c], 8);
            l2[c] += __shfl_xor_sync(0xffffffffu, l2[c], 16);
        }
    } else {
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
    }
    __syncthreads(); /* no warp reads the tables any more: they become the merge buffer */
    float(*const so)[8][DQ] = reinterpret_cast<float(*)[8][DQ]>(e8p_dyn);
#pragma unroll
    for (int h = 0; h < P; h++) {
#pragma unroll
        for (int mt = 0; mt < KS; mt++) {
            const int k = mt & 3, dl = D * h + 8 * (NBL * g + (mt >> 2)) + k, dh = dl + 4;
            const float scl = (k & 1) ? 0x1p20f : 0x1p24f;
            so[warp][2 * t4][dl] = oacc[h * KS + mt][0] * scl;
            so[warp][2 * t4 + 1][dl] = oacc[h * KS + mt][1] * scl;
            so[warp][2 * t4][dh] = oacc[h * KS + mt][2] * scl;
            so[warp][2 * t4 + 1][dh] = oacc[h * KS + mt][3] * scl;
        }
        /* block b of half h: column (D/8)·h + b, the output coordinate i's i >> 3 */
        scos[warp][2 * t4][(D / 8) * h + NBL * g] = 0.25f * ocos[h][0];
        scos[warp][2 * t4 + 1][(D / 8) * h + NBL * g] = 0.25f * ocos[h][1];
        if (NBL > 1) {
            scos[warp][2 * t4][(D / 8) * h + NBL * g + 1] = 0.25f * ocos[h][2];
            scos[warp][2 * t4 + 1][(D / 8) * h + NBL * g + 1] = 0.25f * ocos[h][3];
        }
    }
    if constexpr (SW) {
        if (g == 0 && t4 < 2)
#pragma unroll
            for (int c = 0; c < 2; c++)
                sm[warp][2 * t4 + c] = m2[c], sl[warp][2 * t4 + c] = l2[c];
    } else if (t4 == 0) {
        sm[warp][g] = m, sl[warp][g] = l;
    }
    __syncthreads();
    const int lo_col = SW ? 4 : G; /* the column of head r's lo part: r + 4 (SW), else r + G */
    store_split<DQ>(a, seq, kvh, G, split, sm, sl, [&](int w, int r, int i) {
        float o = so[w][r][i] + scos[w][r][i >> 3];
        if (LO) o += so[w][r + lo_col][i] + scos[w][r + lo_col][i >> 3];
        return o;
    });
    merge_last<DQ, SK>(a, seq, kvh, G, so);
}

/* both instances: with sink rows and without (P = 2: head_dim 256) */
template <int D, int GT, bool RC, int P = 1> static int e8p_smem_attr(void) {
    static int done = 0;
    if (!done &&
        cudaFuncSetAttribute(attn_e8p_kernel<D, GT, false, RC, P>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             e8p_smem_bytes<D>()) == cudaSuccess &&
        cudaFuncSetAttribute(attn_e8p_kernel<D, GT, true, RC, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             e8p_smem_bytes<D>()) == cudaSuccess)
        done = 1;
    return !done;
}
/* blocks per SM of attn_e8p_kernel<D, GT, ·, RC, P>, the fewer of its two instances (0 on error) */
template <int D, int GT, bool RC, int P = 1> static int e8p_occupancy(void) {
    int n = 0, ns = 0;
    if (e8p_smem_attr<D, GT, RC, P>() ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_e8p_kernel<D, GT, false, RC, P>, 128,
                                                      e8p_smem_bytes<D>()) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ns, attn_e8p_kernel<D, GT, true, RC, P>, 128,
                                                      e8p_smem_bytes<D>()) != cudaSuccess)
        return 0;
    return n < ns ? n : ns;
}
/* launch attn_e8p_kernel<D, GT, SK, RC, P> with GT = 4 where the group size is 4 (P = 1), else the run-time G
 * (0); SK: sink rows (a cache without them runs the instance that has no sink code at all); RC: center=rope;
 * P = 2: head_dim 256 */
template <int D, bool SK, bool RC, int P = 1>
static size_t e8p_launch(const attn_launch &l, cudaStream_t stream) {
    const dim3 grid((unsigned)l.n_split, (unsigned)l.n_head_kv, (unsigned)l.n_seq);
    if constexpr (P == 1) {
        if (l.n_head == 4 * l.n_head_kv) {
            if (e8p_smem_attr<D, 4, RC>()) return E8KV_ERR(CUDA);
            attn_e8p_kernel<D, 4, SK, RC><<<grid, 128, e8p_smem_bytes<D>(), stream>>>(l);
            return 0;
        }
    }
    if (e8p_smem_attr<D, 0, RC, P>()) return E8KV_ERR(CUDA);
    attn_e8p_kernel<D, 0, SK, RC, P><<<grid, 128, e8p_smem_bytes<D>(), stream>>>(l);
    return 0;
}
template <int D, bool SK> static size_t e8p_launch_rc(const attn_launch &l, cudaStream_t stream) {
    return l.k.rc ? e8p_launch<D, SK, true>(l, stream) : e8p_launch<D, SK, false>(l, stream);
}

#ifndef SPLIT_FILL
#define SPLIT_FILL 1 /* 0: one wave of whole blocks per (sequence, KV head) pair only */
#endif
#ifndef SPLIT_MIN
/* tokens a split of a tensor-core kernel takes at least: each block's setup (page lookups, the query's
 * transform, fragments) and the last block's merge cost the same however few tokens it reads, so short
 * contexts want fewer, longer splits (H200, batch 1 x 4K, in CUDA graphs: 64 -> 256 tokens took e8box:4 from
 * 20.2 to 16.3 us and e8p:2 from 23.2 to 15.3 at Llama-3-8B shapes; unchanged at >= 32K; BENCHMARKS.md) */
#define SPLIT_MIN 256
#endif
#define SPLIT_MIN_PAIR 64 /* attn_pair_kernel's raw pages at head_dim 256: CUDA cores, more splits pay */
/* share of the resident block slots that n·per blocks keep busy over their waves, in 1/1024 */
static size_t wave_fill(size_t blocks, size_t wave) {
    return blocks * 1024 / (((blocks + wave - 1) / wave) * wave);
}

/* ---- head_dim 256: attn_pair_kernel ----
 *
 * A KV head of 256 coordinates is kept as two heads of 128, its halves (e8kv_cuda.h), so its pages, their
 * append and their gather are those of head_dim 128. A score needs both halves, q·k = q₀·k₀ + q₁·k₁, before
 * its softmax: lane l of a warp reads block l mod 16 of half l / 16 of a token's K and V with the gather's
 * decoders (page_load, page_decode: the CPU codecs' values), the G ≤ GM scores are sums over the warp, and
 * the output is accumulated in the pages' domain (each half rotated by its own 128-point transform, which
 * merge_last undoes). A warp takes 16-token tiles in turn and PAIR_U tokens of a tile at a time: their bytes
 * loaded before any is decoded, their score sums interleaved, one softmax update for the PAIR_U. Plain FMAs
 * on the CUDA cores: slower than SDPA on bf16 (BENCHMARKS.md, "head_dim 256"). Pages in e8box:4 or e8box:3
 * on both sides go to attn_box_kernel's P = 2 instances instead, e8p:2 to attn_e8p_kernel's (tensor cores,
 * ~4x faster); this kernel serves the other pairs (bf16/f16 pages, e8box with raw pages). The split-K frame
 * (splits, sink rows, means, learned sinks, merge) is the other kernels'. */

/* GM: the most query heads per KV head the instance holds registers for (2: Gemma 3 4B and 12B; 4); the K
 * and V formats are read at run time */
template <bool SK, int GM>
__global__ void __launch_bounds__(128, GM == 2 ? 3 : 2) attn_pair_kernel(const attn_launch a) {
    constexpr int D = 256;
    __shared__ float sq[GM][D];
    __shared__ __align__(16) float so[WARPS][8][D]; /* merge_last's buffer: float4 accesses */
    __shared__ float sm[WARPS][8], sl[WARPS][8];
    __shared__ float frac_s[8];
    __shared__ uint16_t pat_s[256];
    const int split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
    const int G = (int)(a.n_head / a.n_head_kv);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, half = lane >> 4, b = lane & 15;
    const int n_split = (int)a.n_split, ctx = table_ctx(a, seq), bs = (int)a.block_size;
    const int chunk = ((ctx + n_split - 1) / n_split + 15) & ~15;
    const int start = split * chunk, end = min(start + chunk, ctx);
    const int lo = SK ? min(a.sink_n, ctx) : 0; /* positions below lo: the sink rows (merge_last) */
    const int kf = a.k.fmt, vf = a.v.fmt;
    const int32_t *const table = a.block_tables + (size_t)seq * a.max_blocks;
    if (SK) sink_prefetch<D>(a, seq, kvh, split);
    if (tid < 8) frac_s[tid] = c_box_frac[tid];
    if (kf == FMT_E8P2 || vf == FMT_E8P2)
        for (int i = tid; i < 256; i += blockDim.x)
            pat_s[i] = c_pat_a[i];
    if (SK && split == 0) sink_state<D>(a, seq, kvh, G);
    /* the query rows, a warp each: with coded keys times the signs and through each half's transform */
    const bool krot = kf != FMT_BF16 && kf != FMT_F16;
    const float qscale = (krot ? a.rot_scale : 1.0f) * rsqrtf((float)D) * LOG2E;
    if (warp < G) {
        const size_t row = ((size_t)seq * a.n_head + (size_t)kvh * G + warp) * D;
        float v0[4], v1[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v0[j] = e8kv_cuda_load_val(a.q, row + 32 * j + lane, a.q_dtype);
            v1[j] = e8kv_cuda_load_val(a.q, row + 128 + 32 * j + lane, a.q_dtype);
            if (krot) v0[j] *= a.signs[32 * j + lane], v1[j] *= a.signs[32 * j + lane];
        }
        if (krot) fwht_warp<128>(v0), fwht_warp<128>(v1);
#pragma unroll
        for (int j = 0; j < 4; j++)
            sq[warp][32 * j + lane] = v0[j] * qscale, sq[warp][128 + 32 * j + lane] = v1[j] * qscale;
    }
    __syncthreads();
    float qr[GM][8], acc[GM][8], m[GM], l[GM];
#pragma unroll
    for (int r = 0; r < GM; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            qr[r][i] = r < G ? sq[r][128 * half + 8 * b + i] : 0.0f, acc[r][i] = 0.0f;
    }
    /* warps take 16-token tiles in turn (a tile is in one page: pages hold a multiple of 16 tokens, splits
     * start at one); PAIR_U tokens' bytes are loaded (page_load) before any is decoded, so that their loads
     * are in flight together */
    for (int tile0 = start + 16 * warp; tile0 < end; tile0 += 16 * WARPS) {
        const int page = table[tile0 / bs], o0 = tile0 % bs;
        const uint8_t *const kb =
            a.k.pool + (size_t)page * a.k.page_bytes + (size_t)(2 * kvh + half) * a.k.head_bytes;
        const uint8_t *const vb =
            a.v.pool + (size_t)page * a.v.page_bytes + (size_t)(2 * kvh + half) * a.v.head_bytes;
#pragma unroll 1
        for (int u0 = 0; u0 < 16; u0 += PAIR_U) {
            page_raw rk[PAIR_U], rv[PAIR_U]; /* (tokens past the end or in the sink: in the page, not used) */
#pragma unroll
            for (int u = 0; u < PAIR_U; u++) {
                page_load<128>(rk[u], kf, kb, (size_t)(o0 + u0 + u), b, (size_t)bs);
                page_load<128>(rv[u], vf, vb, (size_t)(o0 + u0 + u), b, (size_t)bs);
            }
            /* the PAIR_U tokens' scores (the sums over the warp interleaved), masked (sink rows, past the
             * end) */
            float sc[PAIR_U][GM];
#pragma unroll
            for (int u = 0; u < PAIR_U; u++) {
                float x[8];
                page_decode<128>(x, kf, rk[u], b, frac_s, pat_s);
#pragma unroll
                for (int r = 0; r < GM; r++) {
                    float d = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        d = fmaf(qr[r][i], x[i], d);
                    sc[u][r] = d;
                }
            }
#pragma unroll
            for (int off = 16; off; off >>= 1) {
#pragma unroll
                for (int u = 0; u < PAIR_U; u++)
#pragma unroll
                    for (int r = 0; r < GM; r++)
                        sc[u][r] += __shfl_xor_sync(0xffffffffu, sc[u][r], off);
            }
            /* the softmax state once per PAIR_U tokens: the new maximum, then their weights */
#pragma unroll
            for (int r = 0; r < GM; r++) {
                float mt = m[r];
#pragma unroll
                for (int u = 0; u < PAIR_U; u++) {
                    const int t = tile0 + u0 + u;
                    if (t >= end || t < lo) sc[u][r] = -INFINITY;
                    mt = fmaxf(mt, sc[u][r]);
                }
                if (mt > m[r]) { /* uniform: every lane holds the scores */
                    const float al = exp2f(m[r] - mt);
                    l[r] *= al;
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        acc[r][i] *= al;
                    m[r] = mt;
                }
#pragma unroll
                for (int u = 0; u < PAIR_U; u++) {
                    sc[u][r] = m[r] == -INFINITY ? 0.0f : exp2f(sc[u][r] - m[r]);
                    l[r] += sc[u][r];
                }
            }
#pragma unroll
            for (int u = 0; u < PAIR_U; u++) {
                float y[8];
                page_decode<128>(y, vf, rv[u], b, frac_s, pat_s);
#pragma unroll
                for (int r = 0; r < GM; r++)
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        acc[r][i] = fmaf(sc[u][r], y[i], acc[r][i]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GM; r++) {
        if (r >= G) continue;
#pragma unroll
        for (int i = 0; i < 8; i++)
            so[warp][r][128 * half + 8 * b + i] = acc[r][i];
        if (lane == 0) sm[warp][r] = m[r], sl[warp][r] = l[r];
    }
    __syncthreads();
    store_split<D>(a, seq, kvh, G, split, sm, sl, [&](int w, int r, int i) { return so[w][r][i]; });
    merge_last<D, SK>(a, seq, kvh, G, so);
}

/* e8p:2's patterns in constant memory, uploaded by the first launch that reads e8p:2 pages */
static size_t pat_table(void) {
    static int ready = 0;
    if (ready) return 0;
    uint16_t pat[256];
    e8p_patterns(pat);
    if (cudaMemcpyToSymbol(c_pat_a, pat, sizeof pat) != cudaSuccess) return E8KV_ERR(CUDA);
    ready = 1;
    return 0;
}

/* blocks per SM of the G ≤ 4 instances (the fewer: the split count does not know G) */
static int pair_occupancy(void) {
    static int n = 0;
    if (n) return n;
    int n1 = 0, n2 = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n1, attn_pair_kernel<false, PAIR_G>, 128, 0) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n2, attn_pair_kernel<true, PAIR_G>, 128, 0) !=
            cudaSuccess)
        n1 = n2 = 1;
    n = n1 < n2 ? n1 : n2;
    if (n < 1) n = 1;
    return n;
}

static void launch_pair_g(const attn_launch &l, dim3 grid, bool g2, cudaStream_t stream) {
    if (l.sink_n > 0 && g2)
        attn_pair_kernel<true, 2><<<grid, 128, 0, stream>>>(l);
    else if (l.sink_n > 0)
        attn_pair_kernel<true, PAIR_G><<<grid, 128, 0, stream>>>(l);
    else if (g2)
        attn_pair_kernel<false, 2><<<grid, 128, 0, stream>>>(l);
    else
        attn_pair_kernel<false, PAIR_G><<<grid, 128, 0, stream>>>(l);
}

/* attn_box_kernel's dynamic shared memory above 48 KB, set once for the instances of (D, BK, BV, RC, P): with
 * and without sink rows, for up to 4 and (P = 1) more query heads per KV head */
template <int D, int BK, int BV, bool RC, int P = 1> static int box_smem_attr(void) {
    static int done = 0;
    if (done) return 0;
    constexpr int b = box_smem_bytes<D, BK, BV, RC, P>();
    bool ok = cudaFuncSetAttribute(attn_box_kernel<D, BK, BV, false, false, RC, P>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, b) == cudaSuccess &&
              cudaFuncSetAttribute(attn_box_kernel<D, BK, BV, false, true, RC, P>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, b) == cudaSuccess;
    if constexpr (P == 1)
        ok = ok &&
             cudaFuncSetAttribute(attn_box_kernel<D, BK, BV, true, false, RC, P>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, b) == cudaSuccess &&
             cudaFuncSetAttribute(attn_box_kernel<D, BK, BV, true, true, RC, P>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, b) == cudaSuccess;
    done = ok;
    return !done;
}
/* blocks per SM of those instances, the fewest (the split count does not know G); 1 on error */
template <int D, int BK, int BV, bool RC, int P = 1> static int box_occupancy(void) {
    static int n = 0;
    if (n) return n;
    constexpr int b = box_smem_bytes<D, BK, BV, RC, P>();
    int n1 = 0, n2 = 0, n3 = 0, n4 = 0;
    bool ok = !box_smem_attr<D, BK, BV, RC, P>() &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                  &n1, attn_box_kernel<D, BK, BV, false, false, RC, P>, 128, b) == cudaSuccess &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                  &n2, attn_box_kernel<D, BK, BV, false, true, RC, P>, 128, b) == cudaSuccess;
    n = n1 < n2 ? n1 : n2;
    if constexpr (P == 1) {
        ok = ok &&
             cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                 &n3, attn_box_kernel<D, BK, BV, true, false, RC, P>, 128, b) == cudaSuccess &&
             cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n4, attn_box_kernel<D, BK, BV, true, true, RC, P>,
                                                           128, b) == cudaSuccess;
        n = n3 < n ? n3 : n;
        n = n4 < n ? n4 : n;
    }
    if (!ok || n < 1) n = 1;
    return n;
}
/* attn_box_kernel's instance for the group size and sink rows (RC: center=rope; P = 2: head_dim 256, up to 4
 * query heads per KV head) */
template <int D, int BK, int BV, bool RC, int P = 1>
static void launch_box(const attn_launch *a, dim3 grid, bool sk, cudaStream_t stream) {
    constexpr int sb = box_smem_bytes<D, BK, BV, RC, P>();
    box_smem_attr<D, BK, BV, RC, P>();
    if constexpr (P == 1) {
        if (a->n_head > 4 * a->n_head_kv) {
            if (sk)
                attn_box_kernel<D, BK, BV, true, true, RC><<<grid, 128, sb, stream>>>(*a);
            else
                attn_box_kernel<D, BK, BV, true, false, RC><<<grid, 128, sb, stream>>>(*a);
            return;
        }
    }
    if (sk)
        attn_box_kernel<D, BK, BV, false, true, RC, P><<<grid, 128, sb, stream>>>(*a);
    else
        attn_box_kernel<D, BK, BV, false, false, RC, P><<<grid, 128, sb, stream>>>(*a);
}

static size_t launch_pair(const attn_launch *la, cudaStream_t stream) {
    if (la->n_head > (size_t)PAIR_G * la->n_head_kv) return E8KV_ERR(DIMENSION);
    if (la->k.fmt == FMT_E8P2 || la->v.fmt == FMT_E8P2) E8KV_RETURN_IF_ERROR(pat_table());
    attn_launch l = *la;
    l.v_rot = fmt_is_box(l.v.fmt) || l.v.fmt == FMT_E8P2;
    l.v_div = 1.0f; /* the decoded values carry their steps */
    const dim3 grid((unsigned)l.n_split, (unsigned)l.n_head_kv, (unsigned)l.n_seq);
    const bool g2 = l.n_head <= 2 * l.n_head_kv;
    const int kf = l.k.fmt, vf = l.v.fmt;
    if (fmt_is_box(kf) && fmt_is_box(vf)) { /* the tensor-core kernel of head_dim 128, both halves */
        l.v_div = V_BOX_SCALE;
        const bool sk = l.sink_n > 0;
        if (kf == FMT_BOX4 && vf == FMT_BOX4)
            launch_box<128, 4, 4, false, 2>(&l, grid, sk, stream);
        else if (kf == FMT_BOX4)
            launch_box<128, 4, 3, false, 2>(&l, grid, sk, stream);
        else if (vf == FMT_BOX4)
            launch_box<128, 3, 4, false, 2>(&l, grid, sk, stream);
        else
            launch_box<128, 3, 3, false, 2>(&l, grid, sk, stream);
    } else if (kf == FMT_E8P2 && vf == FMT_E8P2) { /* attn_e8p_kernel's P = 2 instances (any G ≤ 4) */
        l.v_div = E8P_VSCALE;
        const size_t r = l.sink_n > 0 ? e8p_launch<128, true, false, 2>(l, stream)
                                      : e8p_launch<128, false, false, 2>(l, stream);
        if (r) return r;
    } else
        launch_pair_g(l, grid, g2, stream);
    return cudaGetLastError() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
}

size_t e8kv_cu_split_min(size_t d, int kf, int vf) {
    const bool tc = d != 256 || (fmt_is_box(kf) && fmt_is_box(vf)) || (kf == FMT_E8P2 && vf == FMT_E8P2);
    return tc ? SPLIT_MIN : SPLIT_MIN_PAIR;
}

size_t e8kv_cu_n_split(size_t n_seq, size_t n_head_kv, size_t max_ctx, int n_sm, int ctas_per_sm,
                       size_t split_min) {
    const size_t per = n_seq * n_head_kv,
                 wave = (size_t)(n_sm > 0 ? n_sm : 1) * (size_t)(ctas_per_sm > 0 ? ctas_per_sm : 1);
    size_t n = wave / per;
    if (SPLIT_FILL && n < 4) {
        /* fewer than 4 splits fit one wave: up to 4, the count whose blocks fill their waves best (by more
         * than 5%), e.g. 256 (sequence, KV head) pairs on 396 slots: 1 split fills 65%, 3 splits 97%; only
         * while every split keeps 2048 tokens (H100, e8p:2 at batch 32: 3 splits 16% faster at 32K, 8% slower
         * at 4K) */
        size_t best = n ? n : 1;
        for (size_t k = best + 1; k <= 4 && 2048 * k <= max_ctx; k++)
            if (wave_fill(k * per, wave) > wave_fill(best * per, wave) + 51) best = k;
        n = best;
    }
    if (split_min < 64) split_min = 64; /* at least one tile per warp */
    const size_t most = (max_ctx + split_min - 1) / split_min;
    if (n > most) n = most;
    if (n > 256) n = 256;
    return n ? n : 1;
}

/* the e8box kernel's stages are dynamic shared memory beyond 48 KB: raise its limit once (per D, BK, BV) */
/* attn_box_kernel serves K and V in e8box:4 or e8box:3, either with either: the bits of a format (of K when
 * both streams are e8box, else 0: attn_split_kernel) */
template <int F> static constexpr int box_b(void) {
    return F == FMT_BOX4 ? 4 : F == FMT_BOX3 ? 3 : 0;
}
template <int KF, int VF> static constexpr int box_bits(void) {
    return box_b<KF>() && box_b<VF>() ? box_b<KF>() : 0;
}

template <int D, int KF, int VF, bool RC> static int occupancy(void) {
    static int n = 0;
    if (n) return n;
    constexpr int BK = box_bits<KF, VF>(), BV = box_b<VF>();
    if constexpr (BK) {
        n = box_occupancy<D, BK, BV, RC>();
    } else {
        int n1 = 0, n2 = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n1, attn_split_kernel<D, KF, VF, false>, 128, 0) !=
                cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n2, attn_split_kernel<D, KF, VF, true>, 128, 0) !=
                cudaSuccess)
            n1 = n2 = 1;
        n = n1 < n2 ? n1 : n2;
    }
    if (n < 1) n = 1;
    return n;
}

/* occupancy for the run-time formats (the dispatch of launch_k / launch_v); rc: center=rope (e8box K and V) */
template <int D, int KF> static int occupancy_v(int vf, int rc) {
    switch (vf) {
    case FMT_BOX4:
        return rc && fmt_is_box(KF) ? occupancy<D, KF, FMT_BOX4, true>() : occupancy<D, KF, FMT_BOX4, false>();
    case FMT_BOX3:
        return rc && fmt_is_box(KF) ? occupancy<D, KF, FMT_BOX3, true>() : occupancy<D, KF, FMT_BOX3, false>();
    case FMT_BF16:
        return occupancy<D, KF, FMT_BF16, false>();
    default:
        return occupancy<D, KF, FMT_F16, false>();
    }
}
template <int D> static int occupancy_k(int kf, int vf, int rc) {
    switch (kf) {
    case FMT_BOX4:
        return occupancy_v<D, FMT_BOX4>(vf, rc);
    case FMT_BOX3:
        return occupancy_v<D, FMT_BOX3>(vf, rc);
    case FMT_BF16:
        return occupancy_v<D, FMT_BF16>(vf, 0);
    default:
        return occupancy_v<D, FMT_F16>(vf, 0);
    }
}

int e8kv_cu_ctas_per_sm(size_t d, int kf, int vf, int rc) {
    if (d == 256) {
        if (kf == FMT_BOX4 && vf == FMT_BOX4) return box_occupancy<128, 4, 4, false, 2>();
        if (kf == FMT_BOX4 && vf == FMT_BOX3) return box_occupancy<128, 4, 3, false, 2>();
        if (kf == FMT_BOX3 && vf == FMT_BOX4) return box_occupancy<128, 3, 4, false, 2>();
        if (kf == FMT_BOX3 && vf == FMT_BOX3) return box_occupancy<128, 3, 3, false, 2>();
        if (kf == FMT_E8P2 && vf == FMT_E8P2) {
            const int n = e8p_occupancy<128, 0, false, 2>();
            return n > 0 ? n : 1;
        }
        return pair_occupancy();
    }
    if (kf == FMT_E8P2) { /* the fewer of the two instances (the split count does not know G) */
        const int n0 = d == 128 ? (rc ? e8p_occupancy<128, 0, true>() : e8p_occupancy<128, 0, false>())
                                : (rc ? e8p_occupancy<64, 0, true>() : e8p_occupancy<64, 0, false>()),
                  n4 = d == 128 ? (rc ? e8p_occupancy<128, 4, true>() : e8p_occupancy<128, 4, false>())
                                : (rc ? e8p_occupancy<64, 4, true>() : e8p_occupancy<64, 4, false>()),
                  n = n0 < n4 ? n0 : n4;
        return n > 0 ? n : 1;
    }
    return d == 128 ? occupancy_k<128>(kf, vf, rc) : occupancy_k<64>(kf, vf, rc);
}

template <int D, int KF, int VF> static void launch(const attn_launch *la, cudaStream_t stream) {
    attn_launch l = *la;
    l.v_rot = fmt_is_box(VF);
    l.v_div = fmt_is_box(VF) ? V_BOX_SCALE : VF == FMT_F16 ? V_F16_SCALE : 1.0f;
    const attn_launch *const a = &l;
    const dim3 grid((unsigned)a->n_split, (unsigned)a->n_head_kv, (unsigned)a->n_seq);
    const bool sk = a->sink_n > 0; /* the instances without sink rows have no sink code at all */
    constexpr int BK = box_bits<KF, VF>(), BV = box_b<VF>();
    if constexpr (BK) {
        if (a->k.rc)
            launch_box<D, BK, BV, true>(a, grid, sk, stream);
        else
            launch_box<D, BK, BV, false>(a, grid, sk, stream);
    } else if (sk) {
        attn_split_kernel<D, KF, VF, true><<<grid, 128, 0, stream>>>(*a);
    } else {
        attn_split_kernel<D, KF, VF, false><<<grid, 128, 0, stream>>>(*a);
    }
}

template <int D, int KF> static void launch_v(const attn_launch *a, cudaStream_t stream) {
    switch (a->v.fmt) {
    case FMT_BOX4:
        launch<D, KF, FMT_BOX4>(a, stream);
        break;
    case FMT_BOX3:
        launch<D, KF, FMT_BOX3>(a, stream);
        break;
    case FMT_BF16:
        launch<D, KF, FMT_BF16>(a, stream);
        break;
    default:
        launch<D, KF, FMT_F16>(a, stream);
        break;
    }
}

template <int D> static void launch_k(const attn_launch *a, cudaStream_t stream) {
    switch (a->k.fmt) {
    case FMT_BOX4:
        launch_v<D, FMT_BOX4>(a, stream);
        break;
    case FMT_BOX3:
        launch_v<D, FMT_BOX3>(a, stream);
        break;
    case FMT_BF16:
        launch_v<D, FMT_BF16>(a, stream);
        break;
    default:
        launch_v<D, FMT_F16>(a, stream);
        break;
    }
}

size_t e8kv_cu_launch_attend(const attn_launch *a, cudaStream_t stream) {
    if (a->d == 256) return launch_pair(a, stream);
    if (a->k.fmt == FMT_E8P2) { /* the cache pairs it with e8p:2 V pages only */
        E8KV_RETURN_IF_ERROR(pat_table());
        attn_launch l = *a;
        l.v_rot = 1, l.v_div = E8P_VSCALE;
        const size_t rc =
            l.sink_n ? (l.d == 128 ? e8p_launch_rc<128, true>(l, stream) : e8p_launch_rc<64, true>(l, stream))
                     : (l.d == 128 ? e8p_launch_rc<128, false>(l, stream) : e8p_launch_rc<64, false>(l, stream));
        if (rc) return rc;
        return cudaGetLastError() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
    }
    if (a->d == 128)
        launch_k<128>(a, stream);
    else
        launch_k<64>(a, stream);
    return cudaGetLastError() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
}

/* e8kv_cuda_check_tables_async: thread i of row s checks entry i when the row's context reads it (i ·
 * block_size < ctx); thread 0 of the row checks the context itself */
__global__ void check_tables_kernel(const int32_t *tables, const int32_t *ctx_lens, size_t max_blocks,
                                    size_t bs, uint32_t n_blocks, unsigned *flags) {
    const size_t s = blockIdx.y, i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int ctx = ctx_lens[s];
    if (i == 0 && (ctx < 0 || (size_t)ctx > max_blocks * bs)) atomicOr(flags, FLAG_RANGE);
    if (i < max_blocks && ctx > 0 && i * bs < (size_t)ctx && (uint32_t)tables[s * max_blocks + i] >= n_blocks)
        atomicOr(flags, FLAG_RANGE);
}

size_t e8kv_cu_launch_check_tables(const int32_t *tables, const int32_t *ctx_lens, size_t n_seq,
                                   size_t max_blocks, size_t block_size, size_t n_blocks, unsigned *flags,
                                   cudaStream_t stream) {
    if (!n_seq) return 0;
    const dim3 grid((unsigned)((max_blocks + 127) / 128 ? (max_blocks + 127) / 128 : 1), (unsigned)n_seq);
    check_tables_kernel<<<grid, 128, 0, stream>>>(tables, ctx_lens, max_blocks, block_size,
                                                  (uint32_t)n_blocks, flags);
    return cudaGetLastError() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
}
