/* Append kernels: token rows (f32/f16/bf16) → page bytes.
 *
 * e8box:4 reproduces the CPU codec bit for bit (src/transform/fwht.c, src/quant/e8_box.c): the same
 * random signs, the same butterflies in the same stage order with every output one IEEE add or subtract
 * (__fadd_rn/__fsub_rn: no contraction), the same 1/sqrtf(n) multiply, then the same fixed-point
 * quantizer (one correctly rounded multiply, everything after it integer arithmetic) and the same choice
 * among the step candidates (double arithmetic, strict < so the first best wins). A group of d/8 lanes
 * codes one vector, lane b holding block b (values 8b..8b+7); the butterflies of stride ≥ 8 go between
 * lanes. Raw formats convert with round-to-nearest-even. */
#include "cuda_internal.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FX_BITS 13
#define FX_ONE (1 << FX_BITS)
#define FX_HALF (1 << (FX_BITS - 1))
#define FX_LIMIT 16777216.0f
#define STEP_ZERO 160

__constant__ float c_ratio[4] = {7.5f, 8.0f, 8.5f, 9.0f};

/* δ(e) = ldexp(frac[e & 7], (e >> 3) − 20), exact */
__device__ __forceinline__ float box_step(unsigned e) {
    return __fmul_rn(c_box_frac[e & 7u], __int_as_float(((int)(e >> 3) - 20 + 127) << 23));
}

__device__ __forceinline__ int32_t fx_round(float v) {
    if (!(v < FX_LIMIT)) v = FX_LIMIT;
    if (v < -FX_LIMIT) v = -FX_LIMIT;
    return __float2int_rn(v);
}

__device__ __forceinline__ int32_t floor_div(int32_t a, int32_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* nearest_coset of e8_box.c, the same result with 32-bit work: floor division by 2^13 is an arithmetic
 * shift; the error e = X − p2·2^12 fits 32 bits (|X| ≤ 2^24), its square is one 32 × 32 → 64 multiply; the
 * cost of the parity change s = ∓2 at coordinate i is e'² − e² = 2^14·(2^12 ± e), so the candidates are
 * ranked by the 32-bit key 2^12 ± e in the CPU's order (coordinate, then −2, strict <). */
__device__ __forceinline__ int64_t nearest_coset(int32_t p2[8], const int32_t X[8], int k) {
    const int32_t lo = k ? -15 : -16, hi = k ? 15 : 14;
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

/* ---- e8p:2 (src/quant/e8_p.c): the same rotation, then per vector the rms in double summed in the CPU's
 * order, four step candidates, and per block the exact sorted search over 9 orbits x 2 shifts ---- */
__constant__ uint8_t c_orbit[9][8] = {
    {0, 0, 0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0, 0, 0},
    {2, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 0, 0, 0, 0, 0}, {2, 1, 0, 0, 0, 0, 0, 0},
    {1, 1, 1, 1, 0, 0, 0, 0}, {2, 2, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 1},
};
__constant__ float c_p_ratio[4] = {0.85f, 0.95f, 1.05f, 1.15f};
__constant__ uint16_t c_p_pat[256]; /* set once by the host (e8p_patterns) */

/* W -> its index among the sorted patterns (W is one of them) */
__device__ __forceinline__ unsigned e8p_index(unsigned w) {
    unsigned lo = 0;
#pragma unroll
    for (unsigned step = 128; step; step >>= 1)
        if (c_p_pat[lo + step - 1] < w) lo += step;
    return lo;
}

/* e8kv_e8p_nearest_ref: the block's code and squared distance in fixed-point units */
__device__ int64_t e8p_nearest(unsigned *code, const float x[8], float k) {
    int32_t X[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        X[i] = fx_round(__fmul_rn(x[i], k));
    const int32_t H = FX_HALF;
    int64_t best = INT64_MAX;
    int best_sb = 0, best_o = 0;
    for (int sb = 0; sb < 2; sb++) {
        int32_t ay[8];
        unsigned neg = 0;
        int64_t yy = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int32_t Y = X[i] - (sb ? H / 2 : -H / 2);
            ay[i] = Y < 0 ? -Y : Y;
            neg += Y < 0;
            yy += (int64_t)Y * Y;
        }
        int64_t ys[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int r = 0;
#pragma unroll
            for (int j = 0; j < 8; j++)
                r += (ay[j] > ay[i]) | ((ay[j] == ay[i]) & (j < i));
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j == r) ys[j] = ay[i];
        }
        for (int o = 0; o < 9; o++) {
            int64_t dot = 0, aa = 0;
            unsigned cs = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int64_t m = 2 * c_orbit[o][j] + 1;
                dot += m * ys[j];
                aa += m * m;
                cs += c_orbit[o][j];
            }
            if ((cs ^ neg) & 1u) dot -= 2 * (2 * c_orbit[o][7] + 1) * ys[7];
            const int64_t dist = yy + aa * H * H - 2 * H * dot;
            if (dist < best) best = dist, best_sb = sb, best_o = o;
        }
    }
    int32_t Y[8], ay[8];
    unsigned neg = 0, cs = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        Y[i] = X[i] - (best_sb ? H / 2 : -H / 2);
        ay[i] = Y[i] < 0 ? -Y[i] : Y[i];
        neg += Y[i] < 0;
        cs += c_orbit[best_o][i];
    }
    const int flip = (cs ^ neg) & 1u;
    unsigned w = 0, sgn = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int r = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            r += (ay[j] > ay[i]) | ((ay[j] == ay[i]) & (j < i));
        w |= (unsigned)c_orbit[best_o][r] << (2 * i);
        sgn |= (unsigned)((Y[i] < 0) ^ (flip && r == 7)) << i;
    }
    *code = e8p_index(w) | (sgn & 127u) << 8 | (unsigned)best_sb << 15;
    return best;
}

/* LANES = d / 8 lanes per vector; 128 threads per block; P: e8p:2 instead of e8box:4 */
template <int D, bool P>
__global__ void __launch_bounds__(128)
    append_box_kernel(stream_desc sd, const int64_t *__restrict__ slots, const void *__restrict__ src,
                      size_t n_tok, size_t n_head_kv, size_t block_size, int dtype,
                      const float *__restrict__ signs, float rot_scale, unsigned *flags, int vec16) {
    constexpr int LANES = D / 8, N_COS = (D + 63) / 64;
    const int lane = threadIdx.x & 31, b = lane % LANES;
    const unsigned gmask = (LANES == 32 ? 0xffffffffu : ((1u << LANES) - 1u)) << (lane / LANES * LANES);
    const size_t vi = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / LANES;
    const size_t n_vec = n_tok * n_head_kv;
    const bool live = vi < n_vec;
    const size_t tok = live ? vi / n_head_kv : 0, head = live ? vi % n_head_kv : 0;
    const int64_t slot = live ? slots[tok] : -1;

    float x[8];
    bool finite = true;
    if (live && vec16) { /* the lane's 8 values in one or two 16-byte loads */
        const size_t at = vi * D + 8 * b;
        if (dtype == E8KV_DTYPE_F32) {
            const float4 u0 = ((const float4 *)src)[at / 4], u1 = ((const float4 *)src)[at / 4 + 1];
            x[0] = u0.x, x[1] = u0.y, x[2] = u0.z, x[3] = u0.w, x[4] = u1.x, x[5] = u1.y, x[6] = u1.z,
            x[7] = u1.w;
        } else {
            const uint4 u = ((const uint4 *)src)[at / 8];
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint16_t h = (uint16_t)(w[i / 2] >> (16 * (i & 1)));
                x[i] = dtype == E8KV_DTYPE_F16 ? __half2float(__ushort_as_half(h))
                                               : __bfloat162float(__ushort_as_bfloat16(h));
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = live ? e8kv_cuda_load_val(src, vi * D + 8 * b + i, dtype) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        finite = finite && isfinite(x[i]);
        x[i] = __fmul_rn(x[i], signs[8 * b + i]);
    }
    /* butterflies: strides 1, 2, 4 inside the lane, then 8 .. D/2 between lanes */
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
        const bool upper = b & l;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float p = __shfl_xor_sync(0xffffffffu, x[i], l);
            x[i] = upper ? __fsub_rn(p, x[i]) : __fadd_rn(x[i], p);
        }
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        x[i] = __fmul_rn(x[i], rot_scale);
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
#pragma unroll
    for (int l = 1; l < LANES; l *= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, amax, l);
        amax = o > amax ? o : amax;
    }
    const bool all_finite = (__ballot_sync(0xffffffffu, finite) & gmask) == gmask;
    if (!live || slot < 0) return; /* whole groups leave together: every later shuffle is group-local */
    if (!all_finite) {
        if (b == 0) atomicOr(flags, FLAG_NONFINITE);
        return;
    }
    if constexpr (P) {
        const int base = lane / LANES * LANES;
        double ss = 0.0; /* Σ x_i² in the CPU's order: every product exact, each sum rounded */
        for (int l = 0; l < LANES; l++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const double v = (double)__shfl_sync(gmask, x[i], base + l);
                ss = __dadd_rn(ss, __dmul_rn(v, v));
            }
        const double rms = __dsqrt_rn(__ddiv_rn(ss, (double)D));
        if (!(__dadd_rn(__dmul_rn(8.0, log2(__dmul_rn(rms, (double)c_p_ratio[0]))), (double)STEP_ZERO) <
              255.5)) {
            if (b == 0) atomicOr(flags, FLAG_RANGE);
            return;
        }
        uint8_t *const area =
            sd.pool + (size_t)(slot / (int64_t)block_size) * sd.page_bytes + head * sd.head_bytes;
        const size_t off = (size_t)(slot % (int64_t)block_size);
        unsigned best_code = 0, best_e = 0;
        if (rms != 0.0) {
            double best_err = INFINITY;
            unsigned prev_e = 0;
            for (int r = 0; r < 4; r++) {
                const double want =
                    __dadd_rn(__dmul_rn(8.0, log2(__dmul_rn(rms, (double)c_p_ratio[r]))), (double)STEP_ZERO);
                if (!(want < 255.5)) continue;
                const unsigned e = want < 1.0 ? 1u : (unsigned)llround(want);
                if (e == prev_e) continue;
                prev_e = e;
                const float delta = box_step(e), k = __fdiv_rn((float)FX_ONE, delta);
                unsigned code;
                int64_t dist = e8p_nearest(&code, x, k);
#pragma unroll
                for (int l = 1; l < LANES; l *= 2)
                    dist += __shfl_xor_sync(gmask, dist, l);
                const double err = __dmul_rn((double)dist, __dmul_rn((double)delta, (double)delta));
                if (err < best_err) best_err = err, best_e = e, best_code = code;
            }
        }
        *(uint16_t *)(area + off * (D / 4) + 2 * b) = (uint16_t)best_code;
        if (b == 0) area[block_size * (D / 4) + off] = (uint8_t)best_e;
        return;
    }
    /* the four step targets 8·log2(max/ratio) + 160 (double, as the CPU): lane r of the group computes ratio
     * r's and the group shares them (one log2 per lane instead of five) */
    const double want_own = 8.0 * log2((double)amax / (double)c_ratio[b & 3]) + STEP_ZERO;
    double wants[4];
#pragma unroll
    for (int r = 0; r < 4; r++)
        wants[r] = __shfl_sync(gmask, want_own, (lane / LANES) * LANES + r);
    if (!(wants[3] < 255.5)) {
        if (b == 0) atomicOr(flags, FLAG_RANGE);
        return;
    }
    uint8_t *const area =
        sd.pool + (size_t)(slot / (int64_t)block_size) * sd.page_bytes + head * sd.head_bytes;
    const size_t off = (size_t)(slot % (int64_t)block_size);
    uint8_t *const nib = area + off * (D / 2);
    uint8_t *const step = area + block_size * (D / 2) + off;
    uint8_t *const cos = area + block_size * (D / 2) + block_size + off * N_COS;

    uint32_t best_nib = 0; /* 8 nibbles of block b */
    int best_k = 0;
    unsigned best_e = 0;
    if (amax != 0.0f) {
        double best_err = INFINITY;
        unsigned prev_e = 0;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const double want = wants[r];
            if (!(want < 255.5)) continue;
            const unsigned e = want < 1.0 ? 1u : (unsigned)llround(want);
            if (e == prev_e) continue;
            prev_e = e;
            const float delta = box_step(e), k = __fdiv_rn((float)FX_ONE, delta);
            int32_t X[8], a[8], c[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                X[i] = fx_round(__fmul_rn(x[i], k));
            const int64_t da = nearest_coset(a, X, 0), db = nearest_coset(c, X, 1);
            int64_t dist = db < da ? db : da;
#pragma unroll
            for (int l = 1; l < LANES; l *= 2)
                dist += __shfl_xor_sync(gmask, dist, l);
            const double err = __dmul_rn((double)dist, __dmul_rn((double)delta, (double)delta));
            if (err < best_err) {
                best_err = err;
                best_e = e;
                const int kk = db < da;
                best_k = kk;
                uint32_t w = 0;
#pragma unroll
                for (int i = 0; i < 8; i++)
                    w |= (uint32_t)(((kk ? c[i] : a[i]) + 16 - kk) / 2) << (4 * i);
                best_nib = w;
            }
        }
    }
    /* block b: values 8b..8b+7 sit in bytes 16(b/4) + 8(b%2) + 0..7, high nibbles when b % 4 >= 2 */
    const uint32_t other = __shfl_down_sync(gmask, best_nib, 2);
    if ((b & 3) < 2) {
        uint64_t w = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            w |= (uint64_t)(((best_nib >> (4 * i)) & 15u) | (((other >> (4 * i)) & 15u) << 4)) << (8 * i);
        *(uint64_t *)(nib + 16 * (b / 4) + 8 * (b % 2)) = w;
    }
    const unsigned kbits = (__ballot_sync(gmask, best_k) & gmask) >> (lane / LANES * LANES);
    if (b == 0) {
        *step = (uint8_t)best_e;
#pragma unroll
        for (int j = 0; j < N_COS; j++)
            cos[j] = (uint8_t)(kbits >> (8 * j));
    }
}

__device__ __forceinline__ void to_raw(__half *y, float f) {
    *y = __float2half_rn(f);
}
__device__ __forceinline__ void to_raw(__nv_bfloat16 *y, float f) {
    *y = __float2bfloat16_rn(f);
}

/* raw pages: one thread per 8 values */
template <typename T>
__global__ void __launch_bounds__(128)
    append_raw_kernel(stream_desc sd, const int64_t *__restrict__ slots, const void *__restrict__ src,
                      size_t n_tok, size_t n_head_kv, size_t d, size_t block_size, int dtype,
                      unsigned *flags) {
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per_row = n_head_kv * d / 8;
    if (t >= n_tok * per_row) return;
    const size_t tok = t / per_row, j = t % per_row, head = 8 * j / d, i0 = 8 * j % d;
    const int64_t slot = slots[tok];
    if (slot < 0) return;
    T v[8];
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float f = e8kv_cuda_load_val(src, tok * n_head_kv * d + head * d + i0 + i, dtype);
        finite = finite && isfinite(f);
        to_raw(&v[i], f);
    }
    if (!finite) {
        atomicOr(flags, FLAG_NONFINITE);
        return;
    }
    uint8_t *const area =
        sd.pool + (size_t)(slot / (int64_t)block_size) * sd.page_bytes + head * sd.head_bytes;
    *(uint4 *)(area + ((size_t)(slot % (int64_t)block_size) * d + i0) * 2) = *(const uint4 *)v;
}

size_t e8kv_cu_launch_append(const stream_desc *sd, const int64_t *d_slots, const void *d_src, size_t n_tok,
                             size_t n_head_kv, size_t d, size_t block_size, int dtype, const float *d_signs,
                             float rot_scale, unsigned *d_flags, cudaStream_t stream) {
    if (n_tok == 0) return 0;
    if (sd->fmt == FMT_BOX4 || sd->fmt == FMT_E8P2) {
        const size_t threads = n_tok * n_head_kv * (d / 8), blocks = (threads + 127) / 128;
        const int vec16 = ((uintptr_t)d_src & 15) == 0; /* rows of d values keep every lane's 8 aligned */
        if (sd->fmt == FMT_E8P2) {
            static int ready = 0;
            if (!ready) {
                uint16_t pat[256];
                e8p_patterns(pat);
                if (cudaMemcpyToSymbol(c_p_pat, pat, sizeof pat) != cudaSuccess) return E8KV_CU_ERR(CUDA);
                ready = 1;
            }
            if (d == 128)
                append_box_kernel<128, true>
                    <<<(unsigned)blocks, 128, 0, stream>>>(*sd, d_slots, d_src, n_tok, n_head_kv, block_size,
                                                           dtype, d_signs, rot_scale, d_flags, vec16);
            else
                append_box_kernel<64, true>
                    <<<(unsigned)blocks, 128, 0, stream>>>(*sd, d_slots, d_src, n_tok, n_head_kv, block_size,
                                                           dtype, d_signs, rot_scale, d_flags, vec16);
        } else if (d == 128)
            append_box_kernel<128, false><<<(unsigned)blocks, 128, 0, stream>>>(
                *sd, d_slots, d_src, n_tok, n_head_kv, block_size, dtype, d_signs, rot_scale, d_flags, vec16);
        else
            append_box_kernel<64, false><<<(unsigned)blocks, 128, 0, stream>>>(
                *sd, d_slots, d_src, n_tok, n_head_kv, block_size, dtype, d_signs, rot_scale, d_flags, vec16);
    } else {
        const size_t threads = n_tok * n_head_kv * d / 8, blocks = (threads + 127) / 128;
        if (sd->fmt == FMT_F16)
            append_raw_kernel<__half><<<(unsigned)blocks, 128, 0, stream>>>(
                *sd, d_slots, d_src, n_tok, n_head_kv, d, block_size, dtype, d_flags);
        else
            append_raw_kernel<__nv_bfloat16><<<(unsigned)blocks, 128, 0, stream>>>(
                *sd, d_slots, d_src, n_tok, n_head_kv, d, block_size, dtype, d_flags);
    }
    return cudaGetLastError() == cudaSuccess ? 0 : E8KV_CU_ERR(CUDA);
}
