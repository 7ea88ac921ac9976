/* Append kernels: token rows (f32/f16/bf16) → page bytes.
 *
 * e8box:4, e8box:3 and e8p:2 reproduce the CPU codecs bit for bit (src/transform/fwht.c, src/quant/e8_box.c,
 * src/quant/e8_p.c): the same random signs, the same butterflies in the same stage order with every output
 * one IEEE add or subtract (no contraction), the same 1/sqrtf(n) multiply, then the same fixed-point
 * quantizer (one correctly rounded multiply, everything after it integer arithmetic) and the same choice
 * among the step candidates (double arithmetic, strict < so the first best wins). A group of d/8 lanes
 * codes one vector, lane b holding block b (values 8b..8b+7); the butterflies of stride ≥ 8 go between
 * lanes. The step search, which is most of the work, computes each candidate's distance from a few sums
 * per block (e8box:B: box_block, one template for B = 4 and 3 whose only differences are the box's ends, the
 * step ratios and the bit planes; e8p:2: e8p_search) and the code of the chosen candidate only once.
 * Raw formats convert with round-to-nearest-even. */
#include "cuda_internal.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FX_BITS 13
#define FX_ONE (1 << FX_BITS)
#define FX_HALF (1 << (FX_BITS - 1))
#define STEP_ZERO 160

/* the step ratios max|x|/δ of e8box:B (e8_box.c's k_ratio): B = 4, B = 3 */
__constant__ float c_ratio[4] = {7.5f, 8.0f, 8.5f, 9.0f};
__constant__ float c_ratio3[4] = {4.0f, 4.5f, 5.0f, 5.5f};

/* δ(e) = ldexp(frac[e & 7], (e >> 3) − 20), exact */
__device__ __forceinline__ float box_step(unsigned e) {
    return __fmul_rn(c_box_frac[e & 7u], __int_as_float(((int)(e >> 3) - 20 + 127) << 23));
}

/* nearest_coset of e8_box.c (B bits: p2 ∈ [−2^B, 2^B − 2] for k = 0, [1 − 2^B, 2^B − 1] for k = 1), the same
 * result with 32-bit work: floor division by 2^13 is an arithmetic shift; the error e = X − p2·2^12 fits 32
 * bits (|X| ≤ 2^24), its square is one 32 × 32 → 64 multiply; the cost of the parity change s = ∓2 at
 * coordinate i is e'² − e² = 2^14·(2^12 ± e), so the candidates are ranked by the 32-bit key 2^12 ± e in the
 * CPU's order (coordinate, then −2, strict <). */
template <int B> __device__ __forceinline__ int64_t nearest_coset(int32_t p2[8], const int32_t X[8], int k) {
    const int32_t lo = k ? 1 - (1 << B) : -(1 << B), hi = k ? (1 << B) - 1 : (1 << B) - 2;
    int32_t sum = 0, e[8];
    int64_t dist = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int32_t m = (X[i] - k * FX_HALF + FX_HALF) >> FX_BITS;
        int32_t v = 2 * m + k;
        v = v < lo ? lo : v > hi ? hi : v;
        p2[i] = v;
        sum += v;
        e[i] = X[i] - v * FX_HALF;
        dist += (int64_t)e[i] * e[i];
    }
    if ((sum & 3) == 0) return dist;
    int best_i = -1, best_s = 0;
    int32_t best_key = INT32_MAX;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int32_t km = FX_HALF + e[i], kp = FX_HALF - e[i]; /* s = −2, s = +2 */
        if (p2[i] - 2 >= lo && km < best_key) best_key = km, best_i = i, best_s = -2;
        if (p2[i] + 2 <= hi && kp < best_key) best_key = kp, best_i = i, best_s = 2;
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i == best_i) p2[i] += best_s;
    return dist + (int64_t)best_key * (4 * FX_HALF);
}

/* ---- e8p:2 (src/quant/e8_p.c): the block search of e8kv_e8p_nearest_ref without its per-orbit ranks ----
 * Within one shift, orbit o (c sorted decreasing: n2 twos, n1 ones) on |Y| sorted decreasing has
 * Σ (2c_j + 1)·|Y|_(j) = P8 + 2·P(n1 + n2) + 2·P(n2), P(j) the sum of the j largest |Y|: a sorting network
 * (19 compare-exchanges, values only: equal |Y| give equal sums) and prefix sums replace the per-orbit
 * products; the first (shift, orbit) with the least yy + H·(Σ(2c+1)²·H − 2·dot) wins, as there, and only
 * then are the ranks (with the CPU's tie order: equal |Y| by index) computed, once. Checked against
 * e8kv_e8p_nearest_ref over 5·10^6 random blocks (distance) and by tests/test_cuda.cu (codes). */
__constant__ float c_p_ratio[4] = {0.85f, 0.95f, 1.05f, 1.15f};
__constant__ uint16_t c_p_pat[256]; /* set once by the host (e8p_patterns) */

/* orbit o: n2 twos then n1 ones (c sorted decreasing) */
__device__ __forceinline__ int e8p_n2(int o) {
    return o == 3 || o == 5 ? 1 : o == 7 ? 2 : 0;
}
__device__ __forceinline__ int e8p_n1(int o) {
    return o == 1 || o == 5 ? 1 : o == 2 ? 2 : o == 4 ? 3 : o == 6 ? 4 : o == 8 ? 8 : 0;
}

__device__ __forceinline__ void cmp_swap(int32_t &a, int32_t &b) {
    const int32_t hi = a > b ? a : b, lo = a > b ? b : a;
    a = hi, b = lo;
}

/* The least distance over the 18 (shift, orbit) pairs of a block X (fixed point) and the first pair that
 * has it: *sb_o = 16·shift + orbit. */
__device__ __forceinline__ int64_t e8p_search(const int32_t X[8], int *sb_o) {
    const int32_t H = FX_HALF;
    int64_t best = INT64_MAX;
#pragma unroll
    for (int sb = 0; sb < 2; sb++) {
        int32_t a[8];
        unsigned neg = 0;
        int64_t yy = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int32_t Y = X[i] - (sb ? H / 2 : -H / 2);
            a[i] = Y < 0 ? -Y : Y;
            neg += Y < 0;
            yy += (int64_t)Y * Y;
        }
        cmp_swap(a[0], a[2]), cmp_swap(a[1], a[3]), cmp_swap(a[4], a[6]), cmp_swap(a[5], a[7]);
        cmp_swap(a[0], a[4]), cmp_swap(a[1], a[5]), cmp_swap(a[2], a[6]), cmp_swap(a[3], a[7]);
        cmp_swap(a[0], a[1]), cmp_swap(a[2], a[3]), cmp_swap(a[4], a[5]), cmp_swap(a[6], a[7]);
        cmp_swap(a[2], a[4]), cmp_swap(a[3], a[5]);
        cmp_swap(a[1], a[4]), cmp_swap(a[3], a[6]);
        cmp_swap(a[1], a[2]), cmp_swap(a[3], a[4]), cmp_swap(a[5], a[6]);
        int32_t P[9];
        P[0] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            P[j + 1] = P[j] + a[j];
#pragma unroll
        for (int o = 0; o < 9; o++) { /* |dot| < 5·8·2^18, Σ(2c+1)²·H < 2^19: 32-bit */
            const int n2 = e8p_n2(o), n1 = e8p_n1(o);
            int32_t dot = P[8] + 2 * P[n1 + n2] + 2 * P[n2];
            /* the wrong sign parity: the smallest |Y| changes sign */
            if (((unsigned)(2 * n2 + n1) ^ neg) & 1u) dot -= 2 * (o == 8 ? 3 : 1) * a[7];
            const int64_t d = yy + (int64_t)H * (((8 - n1 - n2) + 9 * n1 + 25 * n2) * H - 2 * dot);
            if (d < best) best = d, *sb_o = 16 * sb + o;
        }
    }
    return best;
}

/* The 16-bit code of the pair sb_o (e8p_search) for X: the orbit's c on the ranks of |Y| (equal |Y| by
 * index), the signs of Y with the smallest |Y|'s flipped on the wrong parity, the pattern's index by binary
 * search over pat (the 256 sorted W). */
__device__ __forceinline__ unsigned e8p_code(const int32_t X[8], int sb_o, const uint16_t *pat) {
    const int32_t H = FX_HALF;
    const int sb = sb_o >> 4, o = sb_o & 15, n2 = e8p_n2(o), n1 = e8p_n1(o);
    int32_t Y[8], ay[8];
    unsigned neg = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        Y[i] = X[i] - (sb ? H / 2 : -H / 2);
        ay[i] = Y[i] < 0 ? -Y[i] : Y[i];
        neg += Y[i] < 0;
    }
    const unsigned flip = ((unsigned)(2 * n2 + n1) ^ neg) & 1u;
    unsigned w = 0, sgn = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int r = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            r += (ay[j] > ay[i]) | ((ay[j] == ay[i]) & (j < i));
        w |= (unsigned)(r < n2 ? 2 : r < n2 + n1 ? 1 : 0) << (2 * i);
        sgn |= (unsigned)((Y[i] < 0) ^ (flip && r == 7)) << i;
    }
    unsigned lo = 0;
#pragma unroll
    for (unsigned step = 128; step; step >>= 1)
        if (pat[lo + step - 1] < w) lo += step;
    return lo | (sgn & 127u) << 8 | (unsigned)sb << 15;
}

/* The unnormalised Hadamard butterflies of a vector held by a group of LANES lanes, lane b holding values
 * 8b..8b+7, in the CPU's stage order (src/transform/fwht.c): strides 1, 2, 4 inside the lane, then 8 ..
 * 4·LANES between lanes, where the lower lane of a pair computes a + b and the upper one a − b as
 * fma(b, −1, a): one rounding of an exact value, the CPU's subtraction. Every lane of the warp calls it
 * (full-warp shuffles). */
template <int LANES> __device__ __forceinline__ void fwht_lanes(float x[8], int b) {
#pragma unroll
    for (int h = 1; h < 8; h *= 2)
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (!(i & h)) {
                const float a = x[i], c = x[i + h];
                x[i] = __fadd_rn(a, c);
                x[i + h] = __fsub_rn(a, c);
            }
#pragma unroll
    for (int l = 1; l < LANES; l *= 2) {
        const float sg = b & l ? -1.0f : 1.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = __fmaf_rn(x[i], sg, __shfl_xor_sync(0xffffffffu, x[i], l));
    }
}

/* center=rope: lane b's values 8b .. 8b + 7 (RoPE pairs 4b .. 4b + 3) minus (ADD: plus) R_p·μ at those of
 * the row's RC_PAIRS chosen pairs (rc: the row's pairs and means before RoPE, cs: position p's cos, sin) */
template <bool ADD>
__device__ __forceinline__ void rope_centre(float x[8], int b, const float *__restrict__ rc,
                                            const float *__restrict__ cs) {
    const int32_t *const idx = (const int32_t *)(rc + 2 * RC_PAIRS);
#pragma unroll
    for (int c = 0; c < RC_PAIRS; c++) {
        const int i = idx[c];
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (i == 4 * b + k) {
                const float2 t = rope_turn(rc[2 * c], rc[2 * c + 1], cs[2 * i], cs[2 * i + 1]);
                x[2 * k] = ADD ? __fadd_rn(x[2 * k], t.x) : __fsub_rn(x[2 * k], t.x);
                x[2 * k + 1] = ADD ? __fadd_rn(x[2 * k + 1], t.y) : __fsub_rn(x[2 * k + 1], t.y);
            }
    }
}

/* ---- the front of both kernels ----
 * A group of LANES = d/8 lanes per vector, lane b holding values 8b..8b+7. Loads the lane's 8 values (one or
 * two 16-byte loads when the rows are aligned), stores them to the token's sink row (sink: that vector's row,
 * else NULL; a non-finite lane stores nothing and raises FLAG_NONFINITE), subtracts the sequence's means when
 * the stream is centred (mu: that vector's d means, else NULL), multiplies by the random signs and runs the
 * butterflies (fwht_lanes). Then the 1/sqrtf(d) multiply. Returns whether the 8 inputs are finite. */
template <int D>
__device__ __forceinline__ bool load_rotated(float x[8], const void *__restrict__ src, size_t vi, int b,
                                             bool live, int dtype, int vec16, const float *__restrict__ signs,
                                             float rot_scale, const float *__restrict__ mu,
                                             float *__restrict__ sink, unsigned *flags,
                                             const float *__restrict__ rc = NULL,
                                             const float *__restrict__ cs = NULL) {
    constexpr int LANES = D / 8;
    if (live && vec16) {
        const size_t at = vi * D + 8 * b;
        if (dtype == E8KV_DTYPE_F32) {
            const float4 u0 = ((const float4 *)src)[at / 4], u1 = ((const float4 *)src)[at / 4 + 1];
            x[0] = u0.x, x[1] = u0.y, x[2] = u0.z, x[3] = u0.w, x[4] = u1.x, x[5] = u1.y, x[6] = u1.z,
            x[7] = u1.w;
        } else {
            unpack8(x, ((const uint4 *)src)[at / 8], dtype == E8KV_DTYPE_F16);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = live ? e8kv_cuda_load_val(src, vi * D + 8 * b + i, dtype) : 0.0f;
    }
    if (sink) { /* sink=N: the exact values too; raised here as well, since a token may have no page slot */
        bool fin = true;
#pragma unroll
        for (int i = 0; i < 8; i++)
            fin = fin && isfinite(x[i]);
        if (fin) {
            ((float4 *)sink)[2 * b] = make_float4(x[0], x[1], x[2], x[3]);
            ((float4 *)sink)[2 * b + 1] = make_float4(x[4], x[5], x[6], x[7]);
        } else {
            atomicOr(flags, FLAG_NONFINITE);
        }
    }
    if (mu) { /* center=1: x − μ, one rounding, what the CPU cache codes */
        const float4 m0 = ((const float4 *)mu)[2 * b], m1 = ((const float4 *)mu)[2 * b + 1];
        const float m[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = __fsub_rn(x[i], m[i]);
    }
    if (rc) rope_centre<false>(x, b, rc, cs); /* center=rope: the chosen pairs also lose R_p·μ_pair */
    const float4 s0 = ((const float4 *)signs)[2 * b], s1 = ((const float4 *)signs)[2 * b + 1];
    const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        finite = finite && isfinite(x[i]);
        x[i] = __fmul_rn(x[i], s[i]);
    }
    fwht_lanes<LANES>(x, b);
#pragma unroll
    for (int i = 0; i < 8; i++)
        x[i] = __fmul_rn(x[i], rot_scale);
    return finite;
}

/* A lane's place (its vector: token and KV head; its block b; its group's lanes) and its 8 rotated values.
 * Every lane of the warp calls it (full-warp shuffles); all_finite: the group's inputs are all finite. */
typedef struct {
    int lane, b;
    unsigned gmask;
    bool live, all_finite;
    size_t head;
    int64_t slot;
} lane_pos;

template <int D>
__device__ __forceinline__ lane_pos lane_front(float x[8], const int64_t *__restrict__ slots,
                                               const void *__restrict__ src, size_t n_tok, size_t n_head_kv,
                                               int dtype, int vec16, const float *__restrict__ signs,
                                               float rot_scale, const token_args &ta, unsigned *flags,
                                               uint64_t n_slots) {
    constexpr int LANES = D / 8;
    lane_pos p;
    p.lane = threadIdx.x & 31, p.b = p.lane % LANES;
    p.gmask = (LANES == 32 ? 0xffffffffu : ((1u << LANES) - 1u)) << (p.lane / LANES * LANES);
    const unsigned vi = (blockIdx.x * 128u + threadIdx.x) / LANES, n_kv = (unsigned)n_head_kv; /* < 2^31 */
    p.live = vi < n_tok * n_head_kv;
    p.head = p.live ? vi % n_kv : 0;
    p.slot = p.live && slots ? slots[vi / n_kv] : -1;
    if (p.slot >= 0 && (uint64_t)p.slot >= n_slots) { /* past the pool: not written (its sink row still is) */
        if (p.b == 0) atomicOr(flags, FLAG_RANGE);
        p.slot = -1;
    }
    const float *mu = NULL; /* center=1: the means of the token's row, for this head */
    if (ta.rows && p.live) {
        const int32_t row = ta.rows[vi / n_kv];
        if (row >= 0 && (size_t)row < ta.rows_max)
            mu = ta.mu + ((size_t)row * n_kv + p.head) * D;
        else if (row >= 0 && p.b == 0)
            atomicOr(flags, FLAG_RANGE); /* coded uncentred; the caller's step fails */
    }
    const float *rc = NULL, *cs = NULL; /* center=rope: the token's row's centre pairs, its position's cos/sin */
    if (mu && ta.pos) {
        const int32_t pos = ta.pos[vi / n_kv];
        if (pos >= 0 && pos < ta.n_pos) {
            rc = ta.rc + ((size_t)ta.rows[vi / n_kv] * n_kv + p.head) * RC_FLOATS;
            cs = ta.cs + (size_t)pos * D;
        } else {
            if (p.b == 0) atomicOr(flags, FLAG_RANGE); /* the caller's step fails */
            mu = NULL;
        }
    }
    float *sink = NULL; /* sink=N: where the token's exact values go */
    if (ta.sink_slots && p.live) {
        const int64_t ss = ta.sink_slots[vi / n_kv];
        if (ss >= 0 && (uint64_t)ss < ta.n_sink_slots)
            sink = ta.sink + ((size_t)ss * n_kv + p.head) * D;
        else if (ss >= 0 && p.b == 0)
            atomicOr(flags, FLAG_RANGE);
    }
    const bool finite =
        load_rotated<D>(x, src, vi, p.b, p.live, dtype, vec16, signs, rot_scale, mu, sink, flags, rc, cs);
    p.all_finite = (__ballot_sync(0xffffffffu, finite) & p.gmask) == p.gmask;
    return p;
}

/* ---- e8box:B's step search (B = 4, 3) without the per-coordinate search of nearest_coset ----
 * For a candidate step, the CPU sums over the blocks min(d_0, d_1), d_k = nearest_coset's squared distance
 * for coset k. Both come from five sums over the block's 8 values, in 32-bit integers:
 *
 * X = round(v), v = x·k, is read off the float v + 1.5·2^23 (|v| < 2^22: the sum rounds v half to even,
 * the CPU's __float2int_rn, and X sits in its low bits). In the interior, X ∈ [BOX_BOT(B), BOX_TOP(B)] (p2 =
 * X/4096 ∈ [1 − 2^B, 2^B − 2]: B = 4: X ∈ [−61440, 57344], B = 3: [−28672, 24576]), the D8 coordinate is
 * 2·m, m = round(X/8192) (ties up), with error ρ = the low 13 bits of X sign-extended, and the D8 + ½
 * coordinate is the odd neighbour on ρ's side with error ∓(4096 − |ρ|); no coordinate is clamped and each
 * coset's cheapest parity change is the move toward X: its cost is 2^14·(4096 − |e|) (nearest_coset's
 * key), so d_0 = Σρ² + [Σm odd]·2^14·(4096 − max|ρ|) and d_1 = Σ(4096 − |ρ|)² + [Σ odd coordinates / 2
 * odd]·2^14·min|ρ|, the parities being bits 12 and 13 of X's xor over the block. Beyond the interior (a
 * coordinate clamped at the box, or its move blocked) X is clamped to the interior's end and Δ = X − X_c
 * added: above it (k = 0 at its top 2^B − 2, k = 1 one above it), d_0 gains Δ², d_1 gains Δ² − 8192Δ, both
 * keys +Δ; below it (k = 1 at its bottom 1 − 2^B, k = 0 one below it), d_0 gains Δ² − 8192|Δ| and d_1 Δ²,
 * both keys +|Δ|, and the D8 parity flips (X_c = BOX_BOT(B), an odd multiple of 4096, is a tie that the
 * clamped coordinate −2^B breaks downward). Only the box's ends depend on B. Checked against nearest_coset
 * over 2·10^7 random blocks with every coordinate in the box's reach (B = 4), and against
 * e8kv_box_nearest_ref over 10^7 blocks, values far outside the box and rounding ties among them (B = 3).
 * Interior values cost 7 operations per candidate, the others 19: the two largest |x| of each lane take the
 * general form, the rest the interior one unless the third largest is beyond it too (then all 8 do).
 * Every step candidate has max|x|/δ ≤ ratio·2^(1/16), so the sums fit: d_k < 2^32. B = 4: |X| < 9.4·8192.
 * B = 3: |X| ≤ 47051 (5.5·2^(1/16)·8192). In coset 0 every coordinate's error is at most |X| − 24576 ≤
 * 22475, and so is that of a coordinate not above the box with the parity change on it (from −8 to −6;
 * an odd Σm needs such a coordinate): d_0 ≤ 8·22475² < 4.05·10^9. In coset 1 at most |X| − 28672 ≤ 18379,
 * and |X| − 20480 with the change: d_1 ≤ 7·18379² + 26571² < 3.1·10^9. */
#define BOX_MAGIC 12582912.0f /* 1.5·2^23, whose bits are BOX_MAGIC_BITS */
#define BOX_MAGIC_BITS 0x4B400000
#define BOX_TOP(B) (((1 << (B)) - 2) * FX_HALF) /* p2 = 2^B − 2 (B = 4: 14): the interior's largest X */
#define BOX_BOT(B) ((1 - (1 << (B))) * FX_HALF) /* p2 = 1 − 2^B (B = 4: −15): the smallest */

typedef struct {
    uint32_t s2, xr;        /* Σ ρ² + Δ², xor of the (clamped) X bits */
    int32_t s1, sn, sp;     /* Σ |ρ|, Σ min(Δ, 0), Σ max(Δ, 0) */
    int32_t mx, mn;         /* max(|ρ| − |Δ|), min(|ρ| + |Δ|) */
} box_sums;

__device__ __forceinline__ int32_t box_fixed(float x, float k) { /* the bits of v + 1.5·2^23 */
    return __float_as_int(__fadd_rn(__fmul_rn(x, k), BOX_MAGIC));
}

__device__ __forceinline__ int32_t sext13(int32_t v) {
    return (int32_t)((uint32_t)v << 19) >> 19;
}

__device__ __forceinline__ void box_interior(box_sums &s, float x, float k) {
    const int32_t B = box_fixed(x, k), r = sext13(B), t = abs(r);
    s.s2 += (uint32_t)(r * r);
    s.s1 += t;
    s.mx = max(s.mx, t);
    s.mn = min(s.mn, t);
    s.xr ^= (uint32_t)B;
}

template <int NB> __device__ __forceinline__ void box_general(box_sums &s, float x, float k) {
    const int32_t B = box_fixed(x, k);
    const int32_t Bc = min(max(B, BOX_MAGIC_BITS + BOX_BOT(NB)), BOX_MAGIC_BITS + BOX_TOP(NB));
    const int32_t dl = B - Bc, a = abs(dl), r = sext13(Bc), t = abs(r);
    s.s2 += (uint32_t)(r * r) + (uint32_t)(a * a);
    s.s1 += t;
    s.sn += min(dl, 0);
    s.sp += max(dl, 0);
    s.mx = max(s.mx, t - a);
    s.mn = min(s.mn, t + a);
    s.xr ^= (uint32_t)Bc ^ (dl < 0 ? 4096u : 0u);
}

/* the block's distance min(d_0, d_1) and its coset (1 only when d_1 < d_0, as the CPU); NB: the box's bits */
template <int NB>
__device__ __forceinline__ uint32_t box_block(const float y[8], float third, float k, int *coset) {
    box_sums s = {0u, 0u, 0, 0, 0, INT32_MIN, INT32_MAX};
    if (__fmul_rn(third, k) > (float)BOX_TOP(NB)) {
#pragma unroll
        for (int i = 0; i < 6; i++)
            box_general<NB>(s, y[i], k);
    } else {
#pragma unroll
        for (int i = 0; i < 6; i++)
            box_interior(s, y[i], k);
    }
    box_general<NB>(s, y[6], k);
    box_general<NB>(s, y[7], k);
    const uint32_t p0 = ((s.xr >> 13) ^ (s.xr >> 12)) & 1u, p1 = (s.xr >> 13) & 1u;
    const uint32_t d0 = s.s2 + 8192u * (uint32_t)s.sn + (p0 ? 16384u * (uint32_t)(4096 - s.mx) : 0u);
    const uint32_t d1 =
        8u * 16777216u + s.s2 - 8192u * (uint32_t)(s.s1 + s.sp) + (p1 ? 16384u * (uint32_t)s.mn : 0u);
    *coset = d1 < d0;
    return d1 < d0 ? d1 : d0;
}

/* 8192/frac[j], correctly rounded (set once by the host): k = 8192/δ(e) = c_box_kfrac[e & 7]·2^(20 − (e >> 3))
 * exactly, the quotient being a normal float */
__constant__ float c_box_kfrac[8];
/* 160 − 8·log2(ratio_r): the float estimates of the step targets (set once by the host from c_ratio,
 * c_ratio3): B = 4, B = 3 */
__constant__ float c_box_off[4];
__constant__ float c_box3_off[4];

/* The grid steps of the four step targets w_r (the CPU computes them in double): from float estimates wf_r
 * within 2e-4 of them, unless one lies within 1e-3 of a rounding boundary (a half integer, 255.5 among
 * them): then false, and the caller computes them in double as the CPU does (step_of). wf_r = lg + off_r, lg
 * = 8·log2 of the vector's max|x| or rms. ok: w < 255.5;
 * e = 256 where not (the grid's end: the steps stay non-increasing in r). */
__device__ __forceinline__ bool steps_of_estimates(unsigned e[4], bool ok[4], float lg, const float off[4]) {
    bool near = false;
    float wf[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        wf[r] = __fadd_rn(lg, off[r]);
        near = near || fabsf(__fsub_rn(__fsub_rn(wf[r], floorf(wf[r])), 0.5f)) < 1e-3f;
        ok[r] = wf[r] < 255.5f;
        e[r] = ok[r] ? (unsigned)max(1, __float2int_rn(wf[r])) : 256u;
    }
    return !near;
}
__device__ __forceinline__ void step_of(unsigned *e, bool *ok, double want) {
    *ok = want < 255.5;
    *e = *ok ? (want < 1.0 ? 1u : (unsigned)llround(want)) : 256u;
}

/* k = 8192/δ(e) as the CPU's (float)8192 / δ: c_box_kfrac[e & 7]·2^(20 − (e >> 3)), exact */
__device__ __forceinline__ float step_scale(unsigned e) {
    return __fmul_rn(c_box_kfrac[e & 7u], __int_as_float((127 + 20 - (int)(e >> 3)) << 23));
}

/* The CPU's choice among the four candidates from the group's per-lane distances: the least error
 * Σdist·δ², the first candidate on equal errors (a repeated step repeats its predecessor's error and is
 * never chosen, as the CPU skips it); candidates with !ok never. The group sums the four at once: after the
 * exchanges over lane bits 0 and 1, lane b holds candidate c = 2·bit0 + bit1's partial sum, then the plain
 * butterfly; two more exchanges compare the candidates. Every lane of the group gets the same c. */
template <int LANES>
__device__ __forceinline__ int pick_step(const uint64_t dist[4], const unsigned e[4], const bool ok[4], int b,
                                         unsigned gmask) {
    const int q1 = b & 1, q2 = (b >> 1) & 1;
    uint64_t k0 = q1 ? dist[2] : dist[0], k1 = q1 ? dist[3] : dist[1];
    k0 += __shfl_xor_sync(gmask, q1 ? dist[0] : dist[2], 1);
    k1 += __shfl_xor_sync(gmask, q1 ? dist[1] : dist[3], 1);
    uint64_t tot = q2 ? k1 : k0;
    tot += __shfl_xor_sync(gmask, q2 ? k0 : k1, 2);
#pragma unroll
    for (int l = 4; l < LANES; l *= 2)
        tot += __shfl_xor_sync(gmask, tot, l);
    int c = 2 * q1 + q2;
    const unsigned ec = c == 0 ? e[0] : c == 1 ? e[1] : c == 2 ? e[2] : e[3];
    const bool okc = c == 0 ? ok[0] : c == 1 ? ok[1] : c == 2 ? ok[2] : ok[3];
    const float dc = box_step(ec);
    double err = okc ? __dmul_rn((double)tot, __dmul_rn((double)dc, (double)dc)) : INFINITY;
#pragma unroll
    for (int l = 2; l >= 1; l /= 2) {
        const double oe = __shfl_xor_sync(gmask, err, l);
        const int oc = __shfl_xor_sync(gmask, c, l);
        if (oe < err || (oe == err && oc < c)) err = oe, c = oc;
    }
    return c;
}

/* e8box:B (B = 4, 3): LANES = d/8 lanes per vector, 128 threads per block. The head area (doc/format.md
 * §6): the plane bytes of token o at o·B·d/8 (B = 3: the 2-bit plane there, o·d/4, and the 1-bit plane at
 * block_size·d/4 + o·d/8), then the step bytes, then the coset bytes. */
template <int D, int B>
__global__ void __launch_bounds__(128)
    append_box_kernel(stream_desc sd, const int64_t *__restrict__ slots, const void *__restrict__ src,
                      size_t n_tok, size_t n_head_kv, size_t block_size, int dtype,
                      const float *__restrict__ signs, float rot_scale, unsigned *flags, int vec16,
                      const token_args ta) {
    static_assert(B == 4 || B == 3, "e8box:4 and e8box:3");
    constexpr int LANES = D / 8, N_COS = (D + 63) / 64, PB = B * D / 8; /* PB: plane bytes per token */
    float x[8];
    const lane_pos p = lane_front<D>(x, slots, src, n_tok, n_head_kv, dtype, vec16, signs, rot_scale, ta,
                                     flags, (uint64_t)sd.n_blocks * block_size);
    const int lane = p.lane, b = p.b;
    const unsigned gmask = p.gmask;
    const size_t head = p.head;
    const int64_t slot = p.slot;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
    for (int l = 1; l < LANES; l *= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, l));
    if (!p.live || slot < 0) return; /* whole groups leave together: every later shuffle is group-local */
    if (!p.all_finite) {
        if (b == 0) atomicOr(flags, FLAG_NONFINITE);
        return;
    }
    /* the four step targets 8·log2(max/ratio_r) + 160 and their grid steps */
    unsigned e[4];
    bool ok[4];
    if (amax != 0.0f) {
        if (!steps_of_estimates(e, ok, __fmul_rn(8.0f, log2f(amax)), B == 4 ? c_box_off : c_box3_off))
#pragma unroll
            for (int r = 0; r < 4; r++)
                step_of(&e[r], &ok[r],
                        8.0 * log2((double)amax / (double)(B == 4 ? c_ratio[r] : c_ratio3[r])) + STEP_ZERO);
        if (!ok[3]) {
            if (b == 0) atomicOr(flags, FLAG_RANGE);
            return;
        }
    }
    uint8_t *const area =
        sd.pool + (size_t)(slot / (int64_t)block_size) * sd.page_bytes + head * sd.head_bytes;
    const size_t off = (size_t)(slot % (int64_t)block_size);
    uint8_t *const nib = area + off * (B == 4 ? D / 2 : D / 4); /* B = 3: the 2-bit plane */
    uint8_t *const step = area + block_size * PB + off;
    uint8_t *const cos = area + block_size * PB + block_size + off * N_COS;

    uint32_t best_nib = 0; /* the 8 fields n of block b, in nibbles */
    int best_k = 0;
    unsigned best_e = 0;
    if (amax != 0.0f) {
        /* the search works on a copy with the lane's two largest |x| last: the sums do not depend on the
         * order */
        float y[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            y[i] = x[i];
#pragma unroll
        for (int p = 0; p < 2; p++)
#pragma unroll
            for (int i = 0; i < 7 - p; i++) {
                const float lo = y[i], hi = y[i + 1];
                const bool sw = fabsf(lo) > fabsf(hi);
                y[i] = sw ? hi : lo;
                y[i + 1] = sw ? lo : hi;
            }
        float third = 0.0f;
#pragma unroll
        for (int i = 0; i < 6; i++)
            third = fmaxf(third, fabsf(y[i]));
        /* B = 4: the four targets lie 0.75, 0.70 and 0.66 apart, so the candidates' distinct steps are
         * e[0], e[0] − 1, ..., e[3]: three for about 90% of vectors (a repeated step, which the CPU skips,
         * costs nothing here); slot j holds e[0] − j, in the CPU's order. B = 3: they lie 1.36, 1.22 and
         * 1.10 apart, so the four steps differ (but where clamped at 1: a repeated step repeats its
         * predecessor's error and is never picked, as the CPU skips it); slot j holds e[j]. */
        unsigned es[4];
        bool oks[4];
        uint64_t dist[4];
        int kk[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (B == 4) {
                es[j] = e[0] - (unsigned)j;
                oks[j] = (unsigned)j <= e[0] - e[3] && es[j] <= 255u;
            } else {
                es[j] = e[j];
                oks[j] = ok[j];
            }
            dist[j] = 0, kk[j] = 0;
            if (oks[j]) dist[j] = box_block<B>(y, third, step_scale(es[j]), &kk[j]);
        }
        const int c = pick_step<LANES>(dist, es, oks, b, gmask);
        best_e = B == 4 ? e[0] - (unsigned)c : c == 0 ? es[0] : c == 1 ? es[1] : c == 2 ? es[2] : es[3];
        best_k = c == 0 ? kk[0] : c == 1 ? kk[1] : c == 2 ? kk[2] : kk[3];
        /* the chosen candidate's code in the original order, with nearest_coset's tie rules */
        const float k = step_scale(best_e);
        int32_t X[8], p2[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            X[i] = box_fixed(x[i], k) - BOX_MAGIC_BITS; /* fx_round's value: |X| < 2^17 */
        (void)nearest_coset<B>(p2, X, best_k);
        uint32_t w = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            w |= (uint32_t)(p2[i] + (1 << B) - best_k) >> 1 << (4 * i);
        best_nib = w;
    }
    if (B == 4) {
        /* block b: values 8b..8b+7 sit in bytes 16(b/4) + 8(b%2) + 0..7, high nibbles when b % 4 >= 2 */
        const uint32_t other = __shfl_down_sync(gmask, best_nib, 2);
        if ((b & 3) < 2) {
            uint64_t w = 0;
#pragma unroll
            for (int i = 0; i < 8; i++)
                w |= (uint64_t)(((best_nib >> (4 * i)) & 15u) | (((other >> (4 * i)) & 15u) << 4)) << (8 * i);
            *(uint64_t *)(nib + 16 * (b / 4) + 8 * (b % 2)) = w;
        }
    } else {
        /* the 2-bit plane (n & 3): block b's values sit in bytes 16(b/8) + 8(b%2) + 0..7, bits
         * 2·((b%8)/2) of them, so lanes b, b + 2, b + 4, b + 6 (b % 8 < 2) make one 8-byte word: two
         * shuffles, each doubling the bits per value */
        const uint32_t lo = best_nib & 0x33333333u;
        const uint32_t lo2 = lo | __shfl_down_sync(gmask, lo, 2) << 2; /* nibble i: lanes b, b + 2 */
        const uint32_t other = __shfl_down_sync(gmask, lo2, 4);        /* lanes b + 4, b + 6 */
        if ((b & 7) < 2) {
            uint64_t w = 0;
#pragma unroll
            for (int i = 0; i < 8; i++)
                w |= (uint64_t)(((lo2 >> (4 * i)) & 15u) | (((other >> (4 * i)) & 15u) << 4)) << (8 * i);
            *(uint64_t *)(nib + 16 * (b / 8) + 8 * (b % 2)) = w;
        }
        /* the 1-bit plane (n >> 2), one group of d values (d/8 bytes): value 8b + i in byte i, bit b
         * (d = 64), in byte 8(b%2) + i, bit b/2 (d = 128). The ballot of value i's bits over the group is
         * byte i of the plane (d = 128: of its two words, after a shuffle that puts the even lanes' bits
         * first); lane b < d/64 stores word b */
        uint32_t hb = 0; /* bit i: value i's n >> 2 */
#pragma unroll
        for (int i = 0; i < 8; i++)
            hb |= ((best_nib >> (4 * i + 2)) & 1u) << i;
        if (D == 128) hb = __shfl_sync(gmask, hb, (lane & ~15) | (b < 8 ? 2 * b : 2 * b - 15));
        const int at = lane / LANES * LANES + (D == 64 ? 0 : 8 * (b & 1)); /* the word's bits in a ballot */
        uint64_t w = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            w |= (uint64_t)((__ballot_sync(gmask, (hb >> i) & 1u) >> at) & 255u) << (8 * i);
        if (b < D / 64) *(uint64_t *)(area + block_size * (D / 4) + off * (D / 8) + 8 * b) = w;
    }
    const unsigned kbits = (__ballot_sync(gmask, best_k) & gmask) >> (lane / LANES * LANES);
    if (b == 0) {
        *step = (uint8_t)best_e;
#pragma unroll
        for (int j = 0; j < N_COS; j++)
            cos[j] = (uint8_t)(kbits >> (8 * j));
    }
}

/* 160 + 8·log2(ratio_r) of e8p:2: the float estimate of its step targets */
__constant__ float c_p_off[4];

/* e8p:2: the same front; the rms in double summed in the CPU's order by one thread per vector (the block's
 * vectors through shared memory: one warp's serial sums instead of every lane's); four step candidates */
template <int D>
__global__ void __launch_bounds__(128)
    append_e8p_kernel(stream_desc sd, const int64_t *__restrict__ slots, const void *__restrict__ src,
                      size_t n_tok, size_t n_head_kv, size_t block_size, int dtype,
                      const float *__restrict__ signs, float rot_scale, unsigned *flags, int vec16,
                      const token_args ta) {
    constexpr int LANES = D / 8, VPB = 128 / LANES;
    __shared__ float xs[VPB][D + 1]; /* +1: the VPB summing threads read one column at a time */
    __shared__ double rms_s[VPB];
    __shared__ uint16_t pat_s[256]; /* the patterns, for the lanes' binary searches */
    float x[8];
    const lane_pos p = lane_front<D>(x, slots, src, n_tok, n_head_kv, dtype, vec16, signs, rot_scale, ta,
                                     flags, (uint64_t)sd.n_blocks * block_size);
    const int b = p.b, vl = threadIdx.x / LANES;
    const unsigned gmask = p.gmask;
    const size_t head = p.head;
    const int64_t slot = p.slot;
#pragma unroll
    for (int i = 0; i < 8; i++)
        xs[vl][8 * b + i] = x[i];
    pat_s[threadIdx.x] = c_p_pat[threadIdx.x];
    pat_s[threadIdx.x + 128] = c_p_pat[threadIdx.x + 128];
    __syncthreads();
    if (threadIdx.x < VPB) { /* Σ x_i² in the CPU's order: every product exact, each sum rounded */
        double ss = 0.0;
        for (int i = 0; i < D; i++) {
            const double v = (double)xs[threadIdx.x][i];
            ss = __fma_rn(v, v, ss);
        }
        rms_s[threadIdx.x] = __dsqrt_rn(__ddiv_rn(ss, (double)D));
    }
    __syncthreads();
    if (!p.live || slot < 0) return; /* whole groups leave together: every later shuffle is group-local */
    if (!p.all_finite) {
        if (b == 0) atomicOr(flags, FLAG_NONFINITE);
        return;
    }
    const double rms = rms_s[vl];
    unsigned e[4];
    bool ok[4];
    if (rms != 0.0) {
        if (!steps_of_estimates(e, ok, __fmul_rn(8.0f, log2f((float)rms)), c_p_off))
#pragma unroll
            for (int r = 0; r < 4; r++)
                step_of(&e[r], &ok[r],
                        __dadd_rn(__dmul_rn(8.0, log2(__dmul_rn(rms, (double)c_p_ratio[r]))), (double)STEP_ZERO));
        if (!ok[0]) { /* the smallest target above the grid */
            if (b == 0) atomicOr(flags, FLAG_RANGE);
            return;
        }
    }
    uint8_t *const area =
        sd.pool + (size_t)(slot / (int64_t)block_size) * sd.page_bytes + head * sd.head_bytes;
    const size_t off = (size_t)(slot % (int64_t)block_size);
    unsigned best_code = 0, best_e = 0;
    if (rms != 0.0) {
        /* |x|/δ < √d/0.81 for every candidate (|x| ≤ √d·rms, δ ≥ 0.85·rms·2^(−1/16)): |X| < 2^17 */
        uint64_t dist[4];
        int32_t X[8];
        int sb_o;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float k = step_scale(e[r]);
#pragma unroll
            for (int i = 0; i < 8; i++)
                X[i] = box_fixed(x[i], k) - BOX_MAGIC_BITS;
            dist[r] = (uint64_t)e8p_search(X, &sb_o);
        }
        const int c = pick_step<LANES>(dist, e, ok, b, gmask);
        best_e = c == 0 ? e[0] : c == 1 ? e[1] : c == 2 ? e[2] : e[3];
        const float k = step_scale(best_e);
#pragma unroll
        for (int i = 0; i < 8; i++)
            X[i] = box_fixed(x[i], k) - BOX_MAGIC_BITS;
        (void)e8p_search(X, &sb_o);
        best_code = e8p_code(X, sb_o, pat_s);
    }
    *(uint16_t *)(area + off * (D / 4) + 2 * b) = (uint16_t)best_code;
    if (b == 0) area[block_size * (D / 4) + off] = (uint8_t)best_e;
}

__device__ __forceinline__ void to_raw(__half *y, float f) {
    *y = __float2half_rn(f);
}
__device__ __forceinline__ void to_raw(__nv_bfloat16 *y, float f) {
    *y = __float2bfloat16_rn(f);
}

/* raw pages: one thread per 8 values (never centred; sink rows as in the coded formats) */
template <typename T>
__global__ void __launch_bounds__(128)
    append_raw_kernel(stream_desc sd, const int64_t *__restrict__ slots, const void *__restrict__ src,
                      size_t n_tok, size_t n_head_kv, size_t d, size_t block_size, int dtype, unsigned *flags,
                      const token_args ta) {
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per_row = n_head_kv * d / 8;
    if (t >= n_tok * per_row) return;
    const size_t tok = t / per_row, j = t % per_row, head = 8 * j / d, i0 = 8 * j % d;
    int64_t slot = slots ? slots[tok] : -1;
    const int64_t ss = ta.sink_slots ? ta.sink_slots[tok] : -1;
    if (slot >= 0 && (uint64_t)slot >= (uint64_t)sd.n_blocks * block_size) { /* past the pool: not written */
        if (i0 == 0) atomicOr(flags, FLAG_RANGE);
        slot = -1;
    }
    if (slot < 0 && ss < 0) return; /* nothing to write: not even checked */
    float *sink = NULL;             /* sink=N: where the token's exact values go */
    if (ss >= 0 && (uint64_t)ss < ta.n_sink_slots)
        sink = ta.sink + ((size_t)ss * n_head_kv + head) * d + i0;
    else if (ss >= 0 && i0 == 0)
        atomicOr(flags, FLAG_RANGE);
    float f[8];
    T v[8];
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        f[i] = e8kv_cuda_load_val(src, tok * n_head_kv * d + head * d + i0 + i, dtype);
        finite = finite && isfinite(f[i]);
        to_raw(&v[i], f[i]);
    }
    if (!finite) {
        atomicOr(flags, FLAG_NONFINITE);
        return;
    }
    if (sink) {
        ((float4 *)sink)[0] = make_float4(f[0], f[1], f[2], f[3]);
        ((float4 *)sink)[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    if (slot < 0) return;
    uint8_t *const area =
        sd.pool + (size_t)(slot / (int64_t)block_size) * sd.page_bytes + head * sd.head_bytes;
    *(uint4 *)(area + ((size_t)(slot % (int64_t)block_size) * d + i0) * 2) = *(const uint4 *)v;
}

/* the constant tables the host computes once: e8p:2's patterns, the e8box 8192/frac and float targets */
static size_t encode_tables(void) {
    static int ready = 0;
    if (ready) return 0;
    uint16_t pat[256];
    e8p_patterns(pat);
    float frac[8], kfrac[8], ratio[4], ratio3[4], off[4], off3[4], p_ratio[4], p_off[4];
    if (cudaMemcpyFromSymbol(frac, c_box_frac, sizeof frac) != cudaSuccess ||
        cudaMemcpyFromSymbol(ratio, c_ratio, sizeof ratio) != cudaSuccess ||
        cudaMemcpyFromSymbol(ratio3, c_ratio3, sizeof ratio3) != cudaSuccess ||
        cudaMemcpyFromSymbol(p_ratio, c_p_ratio, sizeof p_ratio) != cudaSuccess)
        return E8KV_ERR(CUDA);
    for (int j = 0; j < 8; j++)
        kfrac[j] = (float)FX_ONE / frac[j];
    for (int r = 0; r < 4; r++) {
        off[r] = (float)(STEP_ZERO - 8.0 * log2((double)ratio[r]));
        off3[r] = (float)(STEP_ZERO - 8.0 * log2((double)ratio3[r]));
        p_off[r] = (float)(STEP_ZERO + 8.0 * log2((double)p_ratio[r]));
    }
    if (cudaMemcpyToSymbol(c_p_pat, pat, sizeof pat) != cudaSuccess ||
        cudaMemcpyToSymbol(c_box_kfrac, kfrac, sizeof kfrac) != cudaSuccess ||
        cudaMemcpyToSymbol(c_box_off, off, sizeof off) != cudaSuccess ||
        cudaMemcpyToSymbol(c_box3_off, off3, sizeof off3) != cudaSuccess ||
        cudaMemcpyToSymbol(c_p_off, p_off, sizeof p_off) != cudaSuccess)
        return E8KV_ERR(CUDA);
    ready = 1;
    return 0;
}

size_t e8kv_cu_launch_append(const stream_desc *sd, const int64_t *d_slots, const void *d_src, size_t n_tok,
                             size_t n_head_kv, size_t d, size_t block_size, int dtype, const float *d_signs,
                             float rot_scale, unsigned *d_flags, cudaStream_t stream,
                             const token_args *ta_in) {
    if (n_tok == 0) return 0;
    token_args ta0 = {NULL, NULL, 0, NULL, NULL, 0, NULL, NULL, NULL, 0};
    if (ta_in) ta0 = *ta_in;
    ta0.mu = sd->mu;
    if (!sd->mu) ta0.rows = NULL; /* an uncentred stream ignores the rows */
    if (sd->rc && ta0.rows) { /* center=rope: positions are required (e8kv_cuda_append_pos_async) */
        if (!ta0.pos) return E8KV_ERR(BAD_ARGUMENT);
        ta0.rc = sd->rc, ta0.cs = sd->cs, ta0.n_pos = sd->n_pos;
    } else {
        ta0.pos = NULL;
    }
    if (fmt_is_box(sd->fmt) || sd->fmt == FMT_E8P2) {
        E8KV_RETURN_IF_ERROR(encode_tables());
        /* the kernels index vectors in 32 bits: pieces of fewer than 2^31 threads */
        const size_t per = ((size_t)1 << 31) / (n_head_kv * (d / 8)),
                     row = n_head_kv * d * (dtype == E8KV_DTYPE_F32 ? 4 : 2);
        for (size_t t0 = 0; t0 < n_tok; t0 += per) {
            const size_t n = n_tok - t0 < per ? n_tok - t0 : per;
            const size_t blocks = (n * n_head_kv * (d / 8) + 127) / 128;
            const int64_t *const sl = d_slots ? d_slots + t0 : NULL;
            const void *const x = (const uint8_t *)d_src + t0 * row;
            token_args ta = ta0;
            if (ta.rows) ta.rows += t0;
            if (ta.sink_slots) ta.sink_slots += t0;
            if (ta.pos) ta.pos += t0;
            const int vec16 = ((uintptr_t)x & 15) == 0; /* rows of d values keep every lane's 8 aligned */
            if (sd->fmt == FMT_E8P2 && d == 128)
                append_e8p_kernel<128><<<(unsigned)blocks, 128, 0, stream>>>(
                    *sd, sl, x, n, n_head_kv, block_size, dtype, d_signs, rot_scale, d_flags, vec16, ta);
            else if (sd->fmt == FMT_E8P2)
                append_e8p_kernel<64><<<(unsigned)blocks, 128, 0, stream>>>(
                    *sd, sl, x, n, n_head_kv, block_size, dtype, d_signs, rot_scale, d_flags, vec16, ta);
            else if (sd->fmt == FMT_BOX3 && d == 128)
                append_box_kernel<128, 3><<<(unsigned)blocks, 128, 0, stream>>>(
                    *sd, sl, x, n, n_head_kv, block_size, dtype, d_signs, rot_scale, d_flags, vec16, ta);
            else if (sd->fmt == FMT_BOX3)
                append_box_kernel<64, 3><<<(unsigned)blocks, 128, 0, stream>>>(
                    *sd, sl, x, n, n_head_kv, block_size, dtype, d_signs, rot_scale, d_flags, vec16, ta);
            else if (d == 128)
                append_box_kernel<128, 4><<<(unsigned)blocks, 128, 0, stream>>>(
                    *sd, sl, x, n, n_head_kv, block_size, dtype, d_signs, rot_scale, d_flags, vec16, ta);
            else
                append_box_kernel<64, 4><<<(unsigned)blocks, 128, 0, stream>>>(
                    *sd, sl, x, n, n_head_kv, block_size, dtype, d_signs, rot_scale, d_flags, vec16, ta);
        }
    } else {
        const size_t threads = n_tok * n_head_kv * d / 8, blocks = (threads + 127) / 128;
        if (sd->fmt == FMT_F16)
            append_raw_kernel<__half><<<(unsigned)blocks, 128, 0, stream>>>(
                *sd, d_slots, d_src, n_tok, n_head_kv, d, block_size, dtype, d_flags, ta0);
        else
            append_raw_kernel<__nv_bfloat16><<<(unsigned)blocks, 128, 0, stream>>>(
                *sd, d_slots, d_src, n_tok, n_head_kv, d, block_size, dtype, d_flags, ta0);
    }
    return cudaGetLastError() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
}

/* center=1: the mean of n_tok rows, one thread per value, summed in double in token order as the CPU cache
 * does (kvcache.c, set_means); the loads run 8 tokens ahead of the sums */
__global__ void means_kernel(float *mu, const void *src, size_t n_tok, size_t n_vals, int dtype) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vals) return;
    double s = 0.0;
    if (n_tok >= E8KV_CUDA_CENTER_MIN_TOKENS) {
        size_t t = 0;
        for (; t + 8 <= n_tok; t += 8) {
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                x[u] = e8kv_cuda_load_val(src, (t + u) * n_vals + i, dtype);
#pragma unroll
            for (int u = 0; u < 8; u++)
                s += (double)x[u];
        }
        for (; t < n_tok; t++)
            s += (double)e8kv_cuda_load_val(src, t * n_vals + i, dtype);
    }
    mu[i] = (float)(s / (double)n_tok);
}

size_t e8kv_cu_launch_means(float *mu, const void *d_src, size_t n_tok, size_t n_vals, int dtype,
                            cudaStream_t stream) {
    if (n_tok == 0) return 0;
    means_kernel<<<(unsigned)((n_vals + 127) / 128), 128, 0, stream>>>(mu, d_src, n_tok, n_vals, dtype);
    return cudaGetLastError() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
}

/* center=rope: one block per KV head, one thread per RoPE pair (d/2 ≤ 64). The pair's mean before RoPE: each
 * token's pair turned back by its position, (x·C + y·S, y·C − x·S) (products exact in double, one rounding
 * each sum), summed in double in token order (the loads run 8 tokens ahead of the sums); then the RC_PAIRS
 * pairs of largest |μ_pre|² − |μ_post|² (μ as the f32 the cache keeps), ties to the lower pair. */
template <int D>
__global__ void rope_means_kernel(float *mu, float *rc, const float *cs, const void *src, size_t n_tok,
                                  size_t n_head_kv, int dtype) {
    constexpr int H = D / 2;
    __shared__ double se[H];
    __shared__ float sa[H], sb[H];
    const int i = threadIdx.x, head = blockIdx.x;
    const size_t n_vals = n_head_kv * D, at = (size_t)head * D + 2 * i;
    double sx = 0.0, sy = 0.0;
    const bool on = n_tok >= E8KV_CUDA_CENTER_MIN_TOKENS;
    auto add = [&](float x, float y, float C, float S) { /* products exact in double */
        sx += __dadd_rn(__dmul_rn((double)x, (double)C), __dmul_rn((double)y, (double)S));
        sy += __dsub_rn(__dmul_rn((double)y, (double)C), __dmul_rn((double)x, (double)S));
    };
    if (on) {
        size_t t = 0;
        for (; t + 8 <= n_tok; t += 8) {
            float x[8], y[8];
            float2 c[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                x[u] = e8kv_cuda_load_val(src, (t + u) * n_vals + at, dtype);
                y[u] = e8kv_cuda_load_val(src, (t + u) * n_vals + at + 1, dtype);
                c[u] = *reinterpret_cast<const float2 *>(cs + (t + u) * D + 2 * i);
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                add(x[u], y[u], c[u].x, c[u].y);
        }
        for (; t < n_tok; t++)
            add(e8kv_cuda_load_val(src, t * n_vals + at, dtype), e8kv_cuda_load_val(src, t * n_vals + at + 1, dtype),
                cs[t * D + 2 * i], cs[t * D + 2 * i + 1]);
    }
    const float a = on ? (float)(sx / (double)n_tok) : 0.0f, b = on ? (float)(sy / (double)n_tok) : 0.0f;
    const double ma = mu[at], mb = mu[at + 1];
    sa[i] = a, sb[i] = b;
    se[i] = on ? __dsub_rn(__dadd_rn(__dmul_rn((double)a, a), __dmul_rn((double)b, b)),
                           __dadd_rn(__dmul_rn(ma, ma), __dmul_rn(mb, mb)))
               : -(double)i; /* no means: pairs 0 .. RC_PAIRS − 1 */
    __syncthreads();
    if (i == 0) {
        float *const r = rc + (size_t)head * RC_FLOATS;
        int32_t *const idx = (int32_t *)(r + 2 * RC_PAIRS);
        uint64_t taken = 0;
        for (int c = 0; c < RC_PAIRS; c++) {
            int best = -1;
            double bv = 0.0;
            for (int j = 0; j < H; j++) {
                const double v = se[j] == se[j] ? se[j] : -INFINITY; /* NaN means: last */
                if (!(taken >> j & 1) && (best < 0 || v > bv)) best = j, bv = v;
            }
            taken |= 1ull << best;
            idx[c] = best;
            r[2 * c] = sa[best], r[2 * c + 1] = sb[best];
            mu[(size_t)head * D + 2 * best] = 0.0f;
            mu[(size_t)head * D + 2 * best + 1] = 0.0f;
        }
    }
}

size_t e8kv_cu_launch_rope_means(float *mu, float *rc, const float *cs, const void *d_src, size_t n_tok,
                                 size_t n_head_kv, size_t d, int dtype, cudaStream_t stream) {
    if (n_tok == 0) return 0;
    if (d == 128)
        rope_means_kernel<128><<<(unsigned)n_head_kv, 64, 0, stream>>>(mu, rc, cs, d_src, n_tok, n_head_kv, dtype);
    else
        rope_means_kernel<64><<<(unsigned)n_head_kv, 32, 0, stream>>>(mu, rc, cs, d_src, n_tok, n_head_kv, dtype);
    return cudaGetLastError() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
}

/* ---- gather: page bytes → rows, the values the attention reads (a chunk of many queries attends them with
 * a dense kernel) ----
 * Vector vi = (seq, KV head, position), position fastest; a group of D/8 lanes per vector, lane b decodes
 * block b as the CPU decoders do (page_block, cuda_internal.cuh), then the inverse
 * rotation as e8kv_rot_inverse computes it (fwht_lanes, then one multiply by sign_i/√d), then + μ (one
 * rounding), then the output dtype (round to nearest even). A cache of head_dim 256 (g.pair) has two
 * 128-coordinate heads per KV head, each gathered as one; its rows are written as the caller's 256. Positions
 * below sink_n: the sink row's exact values. Every lane reaches the shuffles (full-warp masks); a vector with
 * no valid page or row is NaN. */
/* 16 resident blocks per SM (32 registers), what the launcher's grid is cut for: the e8box:3 decode beside
 * the others would take 40 and leave 12 */
template <int D> __global__ void __launch_bounds__(128, 16) gather_kernel(const gather_launch g) {
    constexpr int LANES = D / 8;
    const int st = blockIdx.y, b = threadIdx.x % LANES;
    const stream_desc sd = g.sd[st];
    __shared__ uint16_t pat_s[256]; /* the tables the lanes index at random (constant memory serialises) */
    __shared__ float frac_s[8];
    if (sd.fmt == FMT_E8P2)
        pat_s[threadIdx.x] = c_p_pat[threadIdx.x], pat_s[threadIdx.x + 128] = c_p_pat[threadIdx.x + 128];
    if (threadIdx.x < 8) frac_s[threadIdx.x] = c_box_frac[threadIdx.x];
    __syncthreads();
    /* A block takes one (sequence, KV head) at a time (blockIdx.z, then every gridDim.z-th) and strides
     * over its positions, 128 / LANES at a time: the divisions by the runtime sizes are done once per
     * (sequence, KV head), and a position's page and offset are shifts when the page size is a power of
     * two. 32-bit positions (the launcher keeps every vector index below 2^27). */
    constexpr unsigned VPB = 128 / LANES;
    const unsigned n_tok = (unsigned)g.n_tok, bs = (unsigned)g.block_size;
    const unsigned n_sh = (unsigned)(g.n_seq * g.n_head_kv);
    const bool pow2 = (bs & (bs - 1u)) == 0u;
    const int bshift = __ffs((int)bs) - 1;
    for (unsigned sh = blockIdx.z; sh < n_sh; sh += gridDim.z) {
        const unsigned head = sh % (unsigned)g.n_head_kv, seq = sh / (unsigned)g.n_head_kv;
        const int32_t *const table = g.tables + (size_t)seq * g.max_blocks;
        /* the sequence's row (sink rows and means); a bad row makes every vector NaN */
        const bool has_row = sd.mu || g.sink_n;
        const int32_t row = has_row ? (g.rows ? g.rows[seq] : (int32_t)seq) : 0;
        const bool bad_row = has_row && (row < 0 || (size_t)row >= g.rows_max);
        /* center=rope: the row's position shift (e8kv_cuda_set_row_shifts) */
        const int2 rsh = sd.rc && !bad_row ? rc_shift(sd.shift, row) : make_int2(0, 0);
        for (unsigned p0 = blockIdx.x * VPB; p0 < n_tok; p0 += gridDim.x * VPB) {
            const unsigned pos = p0 + threadIdx.x / LANES;
            const bool live = pos < n_tok;
            float x[8];
            bool bad = live && bad_row;
            const float *src = NULL, *mu = NULL; /* src: a sink row's exact values */
            if (live && !bad && pos < (unsigned)g.sink_n)
                src = g.sink[st] + (((size_t)row * g.sink_n + pos) * g.n_head_kv + head) * D + 8 * b;
            else if (live && !bad && sd.mu)
                mu = sd.mu + ((size_t)row * g.n_head_kv + head) * D + 8 * b;
            const unsigned o = pow2 ? pos & (bs - 1u) : pos % bs;
            const uint8_t *area = NULL;
            if (live && !bad && !src) {
                const int32_t page = table[pow2 ? pos >> bshift : pos / bs];
                if (page < 0 || (size_t)page >= g.n_blocks)
                    bad = true;
                else
                    area = sd.pool + (size_t)page * sd.page_bytes + head * sd.head_bytes;
            }
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = 0.0f;
        if (fmt_is_box(sd.fmt) || sd.fmt == FMT_E8P2) { /* uniform over the grid's y row */
            if (area) page_block<D>(x, sd.fmt, area, o, b, g.block_size, frac_s, pat_s);
            fwht_lanes<LANES>(x, b);
            const float4 s0 = ((const float4 *)g.signs)[2 * b], s1 = ((const float4 *)g.signs)[2 * b + 1];
            const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
                x[i] = __fmul_rn(x[i], g.rot_scale * s[i]); /* exact: s = ±1 */
            if (mu) {
                const float4 m0 = ((const float4 *)mu)[0], m1 = ((const float4 *)mu)[1];
                const float m[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
#pragma unroll
                for (int i = 0; i < 8; i++)
                    x[i] = __fadd_rn(x[i], m[i]);
                /* center=rope: + R_p·μ at the row's chosen pairs, p the position of index pos */
                const int rp = rc_shifted(rsh, (int)pos);
                if (sd.rc && rp < sd.n_pos)
                    rope_centre<true>(x, b, sd.rc + ((size_t)row * g.n_head_kv + head) * RC_FLOATS,
                                      sd.cs + (size_t)rp * D);
            }
        } else if (area) { /* raw pages: row o of d values */
            page_block<D>(x, sd.fmt, area, o, b, g.block_size, frac_s, pat_s);
        }
        if (!live) continue;
        if (src) {
            const float4 a = ((const float4 *)src)[0], c = ((const float4 *)src)[1];
            x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = c.x, x[5] = c.y, x[6] = c.z, x[7] = c.w;
        }
        if (bad)
#pragma unroll
            for (int i = 0; i < 8; i++)
                x[i] = __int_as_float(0x7fc00000);
        const size_t at =
            g.pair
                ? ((((size_t)seq * (g.n_head_kv / 2) + head / 2) * n_tok + pos) * 2 + (head & 1)) * D + 8 * b
                : ((size_t)sh * n_tok + pos) * D + 8 * b;
        if (g.out_dtype == E8KV_DTYPE_F32) {
            float4 *const y = (float4 *)((float *)g.out[st] + at);
            y[0] = make_float4(x[0], x[1], x[2], x[3]);
            y[1] = make_float4(x[4], x[5], x[6], x[7]);
        } else {
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint16_t lo = g.out_dtype == E8KV_DTYPE_F16
                                        ? __half_as_ushort(__float2half_rn(x[2 * i]))
                                        : __bfloat16_as_ushort(__float2bfloat16_rn(x[2 * i]));
                const uint16_t hi = g.out_dtype == E8KV_DTYPE_F16
                                        ? __half_as_ushort(__float2half_rn(x[2 * i + 1]))
                                        : __bfloat16_as_ushort(__float2bfloat16_rn(x[2 * i + 1]));
                w[i] = (uint32_t)lo | (uint32_t)hi << 16;
            }
            *(uint4 *)((uint16_t *)g.out[st] + at) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
    }
}

size_t e8kv_cu_launch_gather(const gather_launch *g, cudaStream_t stream) {
    const size_t n_vec = g->n_seq * g->n_head_kv * g->n_tok;
    if (n_vec == 0) return 0;
    E8KV_RETURN_IF_ERROR(encode_tables());
    if (n_vec >= ((size_t)1 << 27)) return E8KV_ERR(DIMENSION); /* the kernel's 32-bit indices */
    const size_t n_sh = g->n_seq * g->n_head_kv, vpb = 128 / (g->d / 8);
    int dev = 0, n_sm = 132;
    if (cudaGetDevice(&dev) == cudaSuccess)
        cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
    /* with the 2 streams: 16 blocks of 128 per SM, striding over the positions (at least one block per
     * sequence and head, grid z at most 65535: the blocks then loop over the sequences and heads) */
    const size_t most = (size_t)n_sm * 8, per = (g->n_tok + vpb - 1) / vpb,
                 cap = most / n_sh ? most / n_sh : 1;
    const dim3 grid((unsigned)(per < cap ? per : cap), 2, (unsigned)(n_sh < 65535 ? n_sh : 65535));
    if (g->d == 128)
        gather_kernel<128><<<grid, 128, 0, stream>>>(*g);
    else
        gather_kernel<64><<<grid, 128, 0, stream>>>(*g);
    return cudaGetLastError() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
}
