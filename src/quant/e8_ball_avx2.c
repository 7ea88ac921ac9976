/* AVX2 twins of the e8ball encoder and decoder (bit-exact against e8_ball.c's _ref path; the
 * tests compare them). One 8-value block is one __m256i of fixed-point coordinates, so the E8 closest
 * point (voronoi.h rules: ties toward +inf, parity fix on the first largest error, D8 wins equal
 * distances) runs in a handful of lane operations. Rare paths (overload) call the shared scalar code. */
#include "voronoi.h"

#include "common/fp16.h"

#include <immintrin.h>
#include <limits.h>

static inline __m256i hmax_epi32(__m256i v) {
    v = _mm256_max_epi32(v, _mm256_permute2x128_si256(v, v, 0x01));
    v = _mm256_max_epi32(v, _mm256_shuffle_epi32(v, 0x4E));
    return _mm256_max_epi32(v, _mm256_shuffle_epi32(v, 0xB1));
}
static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* D8 closest point of X / 2^FX; returns the integer point, *dist the squared distance (fits int32:
 * every residual is at most 1.5·2^FX in magnitude, 8·(1.5·2^13)^2 < 2^31). */
static inline __m256i d8_nearest(__m256i X, int32_t *dist) {
    const __m256i half = _mm256_set1_epi32(E8KV_FX_HALF);
    __m256i r = _mm256_srai_epi32(_mm256_add_epi32(X, half), E8KV_FX_BITS);
    __m256i e = _mm256_sub_epi32(X, _mm256_slli_epi32(r, E8KV_FX_BITS));
    const int odd =
        __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_slli_epi32(r, 31)))) & 1;
    if (odd) {
        const __m256i ae = _mm256_abs_epi32(e);
        const __m256i mx = hmax_epi32(ae);
        const int w =
            __builtin_ctz((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(ae, mx))));
        const __m256i onehot =
            _mm256_cmpeq_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(w));
        const __m256i delta = _mm256_or_si256(_mm256_srai_epi32(e, 31), _mm256_set1_epi32(1)); /* ±1 */
        r = _mm256_add_epi32(r, _mm256_and_si256(onehot, delta));
        e = _mm256_sub_epi32(X, _mm256_slli_epi32(r, E8KV_FX_BITS));
    }
    *dist = hsum_epi32(_mm256_mullo_epi32(e, e));
    return r;
}

static inline __m256i e8_nearest(__m256i X) {
    int32_t da, db;
    const __m256i a = d8_nearest(X, &da);
    const __m256i b = d8_nearest(_mm256_sub_epi32(X, _mm256_set1_epi32(E8KV_FX_HALF)), &db);
    if (da <= db) return _mm256_add_epi32(a, a);
    return _mm256_add_epi32(_mm256_add_epi32(b, b), _mm256_set1_epi32(1));
}

/* lanes j + k of v moved to lane j (zero where j + k > 7) */
static inline __m256i lanes_down(__m256i v, int k) {
    const __m256i j = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i idx = _mm256_add_epi32(j, _mm256_set1_epi32(k));
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), idx);
    return _mm256_and_si256(_mm256_permutevar8x32_epi32(v, idx), keep);
}

/* e8kv_e8_digits in lanes: w_j = (y2_j − y2_7)/2, u_j = Σ_{i=j..6} w_i (j = 1..6, a suffix sum),
 * u_0 = (w_0 + u_1)/2, u_7 = y2_7; exact integer arithmetic, so bit-identical to the scalar routine */
static inline uint32_t e8_digits(__m256i y2, unsigned log2_m) {
    const __m256i u7 = _mm256_permutevar8x32_epi32(y2, _mm256_set1_epi32(7));
    const __m256i w = _mm256_srai_epi32(_mm256_sub_epi32(y2, u7), 1);
    __m256i sfx = _mm256_blend_epi32(w, _mm256_setzero_si256(), 0x81);
    sfx = _mm256_add_epi32(sfx, lanes_down(sfx, 1));
    sfx = _mm256_add_epi32(sfx, lanes_down(sfx, 2));
    sfx = _mm256_add_epi32(sfx, lanes_down(sfx, 4));
    const __m256i u0 = _mm256_srai_epi32(_mm256_add_epi32(w, lanes_down(sfx, 1)), 1);
    __m256i u = _mm256_blend_epi32(sfx, u0, 0x01);
    u = _mm256_blend_epi32(u, u7, 0x80);
    const __m256i mask = _mm256_set1_epi32((1 << log2_m) - 1);
    const __m256i sh =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)log2_m));
    return (uint32_t)hsum_epi32(_mm256_sllv_epi32(_mm256_and_si256(u, mask), sh)); /* disjoint bits */
}

uint32_t e8kv_e8_digits_avx2(const int32_t y2[8], unsigned log2_m) {
    return e8_digits(_mm256_loadu_si256((const __m256i *)y2), log2_m);
}

void e8kv_e8_nearest_fx_avx2(int32_t y2[8], const int32_t X[8]) {
    _mm256_storeu_si256((__m256i *)y2, e8_nearest(_mm256_loadu_si256((const __m256i *)X)));
}

/* One descent step with the result of e8kv_ball_descent_step_ref: the member neighbour with the largest
 * e·v > threshold, the smallest index on equal values. e·v and c·v for 8 minimal vectors at a time with
 * 16-bit multiply-adds on coordinate pairs; then the best of the neighbours that are codewords for
 * certain (norm ≤ 10), and only norm-12 neighbours that would beat it are looked up in the index map, best
 * first, so a step usually costs no look-up at all. */
/* index of the first of the 240 values equal to v (one exists) */
static inline int first_equal(const int32_t *a, int32_t v) {
    const __m256i vv = _mm256_set1_epi32(v);
    for (int g = 0;; g += 8) {
        const unsigned m = (unsigned)_mm256_movemask_ps(
            _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_loadu_si256((const __m256i *)(a + g)), vv)));
        if (m) return g + __builtin_ctz(m);
    }
}

int e8kv_ball_descent_step_avx2(int32_t best[8], const int32_t X[8]) {
    int32_t e[8], cn;
    const int k = e8kv_ball_descent_setup(e, &cn, best, X);
    const int32_t *const vp = e8kv_ball_minvec_pairs();
    __m256i ep[4], cp[4];
    for (int j = 0; j < 4; j++) {
        ep[j] = _mm256_set1_epi32(
            (int32_t)((uint32_t)(uint16_t)e[2 * j] | ((uint32_t)(uint16_t)e[2 * j + 1] << 16)));
        cp[j] = _mm256_set1_epi32(
            (int32_t)((uint32_t)(uint16_t)best[2 * j] | ((uint32_t)(uint16_t)best[2 * j + 1] << 16)));
    }
    const int32_t thr = (4 * E8KV_FX_HALF) >> k;
    const __m256i thrv = _mm256_set1_epi32(thr);
    const __m256i nmax = _mm256_set1_epi32(E8KV_BALL_MAX_NORM2 + 1);
    const __m256i nbase = _mm256_set1_epi32(cn + 8);
    /* candidates above the threshold, split by norm: certain members (norm ≤ 10) and norm-12 ones
     * (index-map look-up); everything else is INT32_MIN */
    int32_t dfree[240], d12[240];
    const __m256i lo = _mm256_set1_epi32(INT32_MIN), n12 = _mm256_set1_epi32(E8KV_BALL_MAX_NORM2);
    __m256i mfree = lo, m12 = lo;
    for (int g = 0; g < 240; g += 8) {
        __m256i dot = _mm256_setzero_si256(), cv = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(vp + 240 * j + g));
            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(ep[j], v));
            cv = _mm256_add_epi32(cv, _mm256_madd_epi16(cp[j], v));
        }
        const __m256i nn = _mm256_add_epi32(nbase, _mm256_add_epi32(cv, cv));
        const __m256i ok = _mm256_and_si256(_mm256_cmpgt_epi32(dot, thrv), _mm256_cmpgt_epi32(nmax, nn));
        const __m256i is12 = _mm256_cmpeq_epi32(nn, n12);
        const __m256i f = _mm256_blendv_epi8(lo, dot, _mm256_andnot_si256(is12, ok));
        const __m256i t = _mm256_blendv_epi8(lo, dot, _mm256_and_si256(is12, ok));
        _mm256_storeu_si256((__m256i *)(dfree + g), f);
        _mm256_storeu_si256((__m256i *)(d12 + g), t);
        mfree = _mm256_max_epi32(mfree, f);
        m12 = _mm256_max_epi32(m12, t);
    }
    int32_t best_dot = thr;
    int best_k = 240;
    const int32_t mf = _mm256_cvtsi256_si32(hmax_epi32(mfree));
    if (mf > thr) {
        best_dot = mf;
        best_k = first_equal(dfree, mf);
    }
    /* norm-12 neighbours that would beat it, best first, until one is a codeword */
    int32_t mt = _mm256_cvtsi256_si32(hmax_epi32(m12));
    while (mt > thr && mt >= best_dot) {
        const int ck = first_equal(d12, mt);
        if (mt == best_dot && ck > best_k) break; /* equal value, later index: the certain one wins */
        int32_t c[8];
        for (int i = 0; i < 8; i++) {
            const int32_t w = vp[240 * (i >> 1) + ck];
            c[i] = best[i] + (int16_t)(i & 1 ? (uint32_t)w >> 16 : (uint32_t)w & 0xFFFFu);
        }
        if (e8kv_ball_index(c) >= 0) {
            best_dot = mt;
            best_k = ck;
            break;
        }
        d12[ck] = INT32_MIN;
        __m256i m = lo;
        for (int g = 0; g < 240; g += 8)
            m = _mm256_max_epi32(m, _mm256_loadu_si256((const __m256i *)(d12 + g)));
        mt = _mm256_cvtsi256_si32(hmax_epi32(m));
    }
    if (best_k == 240) return 0;
    for (int i = 0; i < 8; i++) {
        const int32_t w = vp[240 * (i >> 1) + best_k];
        best[i] += (int16_t)(i & 1 ? (uint32_t)w >> 16 : (uint32_t)w & 0xFFFFu);
    }
    return 1;
}

const e8kv_ball_kernels e8kv_ball_kernels_avx2 = {e8kv_e8_nearest_fx_avx2, e8kv_ball_descent_step_avx2};

size_t e8kv_e8ball_encode_avx2(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x) {
    const int bits = codec->bits;
    const unsigned log2_m = (unsigned)bits - 2;
    const size_t d = codec->head_dim, bb = (size_t)bits;
    uint16_t h;
    E8KV_RETURN_IF_ERROR(e8kv_ball_scale(&h, x, d, bits));
    e8kv_store_le16(dst, h);
    uint8_t *p = dst + 2;
    const float s = e8kv_fp16_to_fp32(h);
    if (s == 0.0f) {
        memset(p, 0, d / 8 * bb);
        return 0;
    }
    const __m256 k = _mm256_set1_ps((float)E8KV_FX_ONE / s);
    const __m256 lim = _mm256_set1_ps(E8KV_FX_LIMIT), nlim = _mm256_set1_ps(-E8KV_FX_LIMIT);
    const int8_t *const res = log2_m ? e8kv_ball_residual_table(log2_m) : NULL;
    const size_t nb = d / 8;
    /* three passes so the table look-ups of all blocks overlap (software prefetch): closest points
     * and digits, then coarse points, then the index-map look-ups; the decisions are those of _ref */
    int32_t Xa[E8KV_MAX_HEAD_DIM / 8][8], y2[E8KV_MAX_HEAD_DIM / 8][8];
    uint32_t dg[E8KV_MAX_HEAD_DIM / 8];
    int64_t prep[E8KV_MAX_HEAD_DIM / 8];
    for (size_t j = 0; j < nb; j++) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), k);
        v = _mm256_max_ps(_mm256_min_ps(v, lim), nlim);
        const __m256i X = _mm256_cvtps_epi32(v);
        _mm256_storeu_si256((__m256i *)Xa[j], X);
        const __m256i yv = e8_nearest(_mm256_slli_epi32(X, (int)log2_m));
        _mm256_storeu_si256((__m256i *)y2[j], yv);
        if (log2_m) {
            dg[j] = e8_digits(yv, log2_m);
            _mm_prefetch((const char *)(res + 8 * dg[j]), _MM_HINT_T0);
        } else {
            prep[j] = e8kv_ball_prepare(y2[j]);
        }
    }
    if (log2_m) {
        for (size_t j = 0; j < nb; j++) {
            const __m256i r = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(res + 8 * dg[j])));
            const __m256i yv = _mm256_loadu_si256((const __m256i *)y2[j]);
            /* the coarse point, exact: y − r ∈ m·E8 */
            _mm256_storeu_si256((__m256i *)y2[j], _mm256_srai_epi32(_mm256_sub_epi32(yv, r), (int)log2_m));
            prep[j] = e8kv_ball_prepare(y2[j]);
        }
    }
    for (size_t j = 0; j < nb; j++, p += bb) {
        int32_t c2[8];
        if (log2_m == 0) {
            e8kv_store_le16(p, (uint16_t)e8kv_ball_encode_block_idx(&e8kv_ball_kernels_avx2, c2, Xa[j], y2[j],
                                                                    e8kv_ball_lookup(prep[j])));
            continue;
        }
        const int32_t idx = e8kv_ball_lookup(prep[j]);
        const uint32_t packed = idx >= 0
                                    ? (uint32_t)idx | (dg[j] << 16)
                                    : e8kv_ball_residual_overload(&e8kv_ball_kernels_avx2, Xa[j], log2_m);
        e8kv_ball_store_block(p, packed, log2_m);
    }
    return 0;
}

/* value = (m·ball[c] + res[r]) · (h / 2m), m = 2^(B−2), coordinates doubled integers (int8): the integer
 * math is exact and the single float multiply rounds like the reference decode, so the floats are
 * bit-identical to it. */
void e8kv_e8ball_decode_rows_avx2(float *restrict dst, const uint8_t *restrict src, size_t n, size_t d, int bits,
                                  size_t vector_bytes) {
    const unsigned log2_m = (unsigned)bits - 2;
    const size_t bb = (size_t)bits;
    const int8_t *const ball = e8kv_ball_table();
    const int8_t *const res = log2_m ? e8kv_ball_residual_table(log2_m) : NULL;
    for (size_t t = 0; t < n; t++) {
        const uint8_t *p = src + t * vector_bytes;
        float *const y = dst + t * d;
        /* F16C's conversion: exact, like e8kv_fp16_to_fp32, without a call per vector */
        const __m256 k = _mm256_set1_ps(_cvtsh_ss(e8kv_load_le16(p)) / (float)(2 << log2_m));
        p += 2;
        for (size_t b = 0; b < d; b += 8, p += bb) {
            __m256i c = _mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(const void *)(ball + 8 * (size_t)e8kv_load_le16(p))));
            if (log2_m) {
                const size_t dg = log2_m == 1 ? p[2] : e8kv_load_le16(p + 2);
                const __m256i r =
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(res + 8 * dg)));
                c = _mm256_add_epi32(_mm256_slli_epi32(c, (int)log2_m), r);
            }
            _mm256_storeu_ps(y + b, _mm256_mul_ps(_mm256_cvtepi32_ps(c), k));
        }
    }
}

void e8kv_e8ball_decode_avx2(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src) {
    e8kv_e8ball_decode_rows_avx2(y, src, 1, codec->head_dim, codec->bits, codec->vector_bytes);
}
