/* AVX2 twin of e8kv_attn_box_tile_ref (attn_box.c): the same integers, the same float expressions, exp by
 * exp_avx2 (tests compare the two within a relative tolerance).
 *
 * Per tile the nibbles of keys and values are split once (16 bytes → 32 values in order, doc/format.md
 * §2.4) into small L1 buffers: keys as u = 2n + k (the coset bit broadcast to its block, so no query needs
 * the coset table), values as nibbles interleaved token pair by token pair. Per query:
 *   scores: vpmaddubsw(u, q8) (≤ 2·31·127 per pair) → vpmaddwd(1) → per-token int32 lanes, four tokens
 *           reduced together by two hadds, minus the offset 16·Σ q8;
 *   values: vpmaddubsw(pair-interleaved nibbles, (w8_j, w8_j+1)) gives w8_j·n_j + w8_j+1·n_j+1 per value in
 *           int16 (≤ 2·15·127 per pair, flushed to int32 every 8 pairs); the coset term Σ_j w8_j·k_jb of
 *           block b by comparing the tile's coset bytes with bit b, masking the weights and vpsadbw.
 * The body is specialised for head_dim 64 and 128 (constant loop bounds). */
#include "kvcache.h"

#include "../quant/e8_box.h"
#include "../quant/e8_box_avx2.h"
#include "simd_avx2.h"

#include <immintrin.h>
#include <math.h>

#define TILE 64
#define PAIR_FLUSH 8 /* pairs per int16 accumulation: 8 · 2 · 15 · 127 = 30480 < 32767 */

static inline int32_t hsum_epi32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* Σ of the 64 bytes of w where the byte sel of cos has bit b set (cos, w: 64 bytes each) */
static inline __m256i masked_sad(const uint8_t *cos, __m256i w0, __m256i w1, __m256i bit) {
    const __m256i c0 = _mm256_load_si256((const __m256i *)(const void *)cos),
                  c1 = _mm256_load_si256((const __m256i *)(const void *)(cos + 32));
    const __m256i k0 = _mm256_cmpeq_epi8(_mm256_and_si256(c0, bit), bit),
                  k1 = _mm256_cmpeq_epi8(_mm256_and_si256(c1, bit), bit);
    const __m256i z = _mm256_setzero_si256();
    return _mm256_add_epi64(_mm256_sad_epu8(_mm256_and_si256(k0, w0), z),
                            _mm256_sad_epu8(_mm256_and_si256(k1, w1), z));
}

static inline __attribute__((always_inline)) void tile_impl(const e8kv_box_query *bq, size_t n_q,
                                                            const uint8_t *k, const uint8_t *v, size_t vb,
                                                            size_t n, const size_t d, const float *mu_v,
                                                            float *m, float *l, float *const *acc) {
    const float *const hs = e8kv_box_half_steps();
    const size_t n_grp = d / 32, n_cos = d / 64, n4 = (n + 3) & ~(size_t)3, n_pair = (n + 1) / 2;
    _Alignas(32) uint8_t ku[TILE][E8KV_BOX_MAX_D];              /* keys' u = 2n + k, value order */
    _Alignas(32) uint8_t vp[TILE / 2][2 * E8KV_BOX_MAX_D];      /* value nibbles, pair-interleaved */
    _Alignas(32) float hk[TILE], hv[TILE] = {0};                /* δ/2 per token; 0 past n */
    _Alignas(32) uint8_t vc[E8KV_BOX_MAX_D / 64][TILE] = {{0}}; /* values' coset bytes, token order */
    for (size_t j = 0; j < n4; j++) {
        if (j < n) {
            const uint8_t *const kj = k + j * vb;
            hk[j] = hs[kj[0]];
            for (size_t g = 0; g < n_grp; g++)
                _mm256_store_si256((__m256i *)(void *)(ku[j] + 32 * g), e8kv_box_group_u(kj, d, g));
        } else { /* padding to a multiple of 4 keys: u = 0, step 0 (score qmu, weight masked) */
            hk[j] = 0.0f;
            memset(ku[j], 0, d);
        }
    }
    for (size_t pr = 0; pr < n_pair; pr++) {
        const size_t j = 2 * pr;
        const uint8_t *const v0 = v + j * vb, *const v1 = j + 1 < n ? v0 + vb : NULL;
        hv[j] = hs[v0[0]];
        for (size_t c = 0; c < n_cos; c++)
            vc[c][j] = v0[1 + c];
        if (v1) {
            hv[j + 1] = hs[v1[0]];
            for (size_t c = 0; c < n_cos; c++)
                vc[c][j + 1] = v1[1 + c];
        }
        for (size_t g = 0; g < n_grp; g++) {
            const __m256i a = e8kv_box_group_n(v0, d, g),
                          b = v1 ? e8kv_box_group_n(v1, d, g) : _mm256_setzero_si256();
            _mm256_store_si256((__m256i *)(void *)(vp[pr] + 64 * g), _mm256_unpacklo_epi8(a, b));
            _mm256_store_si256((__m256i *)(void *)(vp[pr] + 64 * g + 32), _mm256_unpackhi_epi8(a, b));
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t qi = 0; qi < n_q; qi++) {
        const e8kv_box_query *const q = &bq[qi];
        _Alignas(32) float s[TILE];
        __m256i qq[E8KV_BOX_MAX_D / 32];
        for (size_t g = 0; g < n_grp; g++)
            qq[g] = _mm256_loadu_si256((const __m256i *)(const void *)(q->q8 + 32 * g));
        const __m128 vsq = _mm_set1_ps(q->sq), vqmu = _mm_set1_ps(q->qmu);
        const __m128i voff = _mm_set1_epi32(q->off);
        /* scores, four keys at a time */
        for (size_t j = 0; j < n4; j += 4) {
            __m256i a[4];
            for (int t = 0; t < 4; t++) {
                __m256i sum = _mm256_setzero_si256();
                for (size_t g = 0; g < n_grp; g++) {
                    const __m256i ub = _mm256_load_si256((const __m256i *)(const void *)(ku[j + t] + 32 * g));
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ub, qq[g]), ones));
                }
                a[t] = sum;
            }
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
            __m128i dot = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            dot = _mm_sub_epi32(dot, voff); /* Σ q8·(2n + k) − 16·Σ q8 */
            /* s = sq·h·dot + qmu, as the reference evaluates it */
            const __m128 hq = _mm_mul_ps(vsq, _mm_load_ps(hk + j));
            _mm_store_ps(s + j, _mm_add_ps(_mm_mul_ps(hq, _mm_cvtepi32_ps(dot)), vqmu));
        }
        /* running max over the n valid scores */
        __m256 vmx = _mm256_set1_ps(m[qi]);
        for (size_t j = 0; j < n; j += 8) {
            const __m256 valid =
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane));
            vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(vmx, _mm256_loadu_ps(s + j), valid));
        }
        vmx = hmax256(vmx);
        const float m_new = _mm256_cvtss_f32(vmx);
        /* weights p_j (lanes past n masked to 0), w_j = p_j·δ_j/2 */
        __m256 vsum = _mm256_setzero_ps(), vwmax = _mm256_setzero_ps();
        _Alignas(32) float w[TILE];
        for (size_t j = 0; j < n; j += 8) {
            const __m256 valid =
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane));
            const __m256 sv = _mm256_blendv_ps(vmx, _mm256_loadu_ps(s + j), valid); /* past n: e^0, masked */
            const __m256 p = _mm256_and_ps(valid, exp_avx2(_mm256_sub_ps(sv, vmx)));
            vsum = _mm256_add_ps(vsum, p);
            const __m256 wj = _mm256_mul_ps(p, _mm256_load_ps(hv + j));
            _mm256_store_ps(w + j, wj);
            vwmax = _mm256_max_ps(vwmax, wj);
        }
        const float psum = hsum256(vsum);
        const float wmax = _mm256_cvtss_f32(hmax256(vwmax));
        const float corr = expf(m[qi] - m_new), to8 = wmax > 0.0f ? 127.0f / wmax : 0.0f;
        /* 7-bit weights as bytes in token order (round to nearest even, as lrintf); 0 past n */
        _Alignas(32) uint8_t w8[TILE] = {0};
        const __m256 vto8 = _mm256_set1_ps(to8);
        for (size_t j = 0; j < n; j += 32) {
            __m256i x[4];
            for (int t = 0; t < 4; t++)
                x[t] = j + 8 * t < n ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(w + j + 8 * t), vto8))
                                     : _mm256_setzero_si256();
            const __m256i p16 =
                _mm256_packus_epi16(_mm256_packs_epi32(x[0], x[1]), _mm256_packs_epi32(x[2], x[3]));
            _mm256_store_si256((__m256i *)(void *)(w8 + j),
                               _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
        const __m256i w0 = _mm256_load_si256((const __m256i *)(const void *)w8),
                      w1 = _mm256_load_si256((const __m256i *)(const void *)(w8 + 32));
        const int32_t sw = hsum_epi32(_mm256_add_epi64(_mm256_sad_epu8(w0, _mm256_setzero_si256()),
                                                       _mm256_sad_epu8(w1, _mm256_setzero_si256())));
        /* Σ_j w8_j·n_ji, 64 values (two groups) at a time */
        _Alignas(32) int32_t an[E8KV_BOX_MAX_D];
        for (size_t ch = 0; ch < d / 64; ch++) {
            __m256i a32[8];
            for (int i = 0; i < 8; i++)
                a32[i] = _mm256_setzero_si256();
            for (size_t p0 = 0; p0 < n_pair; p0 += PAIR_FLUSH) {
                const size_t p1 = p0 + PAIR_FLUSH < n_pair ? p0 + PAIR_FLUSH : n_pair;
                __m256i a16[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                                  _mm256_setzero_si256()};
                for (size_t pr = p0; pr < p1; pr++) {
                    uint16_t pw;
                    memcpy(&pw, w8 + 2 * pr, 2);
                    const __m256i wp = _mm256_set1_epi16((short)pw);
                    const uint8_t *const src = vp[pr] + 128 * ch;
                    for (int i = 0; i < 4; i++)
                        a16[i] = _mm256_add_epi16(
                            a16[i],
                            _mm256_maddubs_epi16(
                                _mm256_load_si256((const __m256i *)(const void *)(src + 32 * i)), wp));
                }
                for (int i = 0; i < 4; i++) {
                    a32[2 * i] =
                        _mm256_add_epi32(a32[2 * i], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a16[i])));
                    a32[2 * i + 1] = _mm256_add_epi32(
                        a32[2 * i + 1], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a16[i], 1)));
                }
            }
            /* a16[0] = unpacklo of group 2ch: values 0..7 (lane 0), 16..23 (lane 1); a16[1] =
             * unpackhi: 8..15, 24..31; a16[2], a16[3] the same for group 2ch + 1 */
            static const int at[8] = {0, 16, 8, 24, 32, 48, 40, 56};
            for (int i = 0; i < 8; i++)
                _mm256_store_si256((__m256i *)(void *)(an + 64 * ch + at[i]), a32[i]);
        }
        /* Σ_j w8_j·k_jb per block b: the weights of the tokens whose coset byte has bit b */
        int32_t ak[E8KV_BOX_MAX_D / 8];
        for (size_t c = 0; c < n_cos; c++)
            for (int b = 0; b < 8; b++)
                ak[8 * c + (size_t)b] =
                    hsum_epi32(masked_sad(vc[c], w0, w1, _mm256_set1_epi8((char)(1 << b))));
        const float scale = wmax / 127.0f;
        float *const out = acc[qi];
        const __m256 vcorr = _mm256_set1_ps(corr), vscale = _mm256_set1_ps(scale), vps = _mm256_set1_ps(psum);
        for (size_t i = 0; i < d; i += 8) { /* the reference's expression, one block at a time */
            /* 2·Σ w8·n + Σ w8·k − 16·Σ w8 = Σ w8·(u − 16), the reference's integer */
            const __m256i t = _mm256_add_epi32(
                _mm256_slli_epi32(_mm256_load_si256((const __m256i *)(const void *)(an + i)), 1),
                _mm256_set1_epi32(ak[i / 8] - 16 * sw));
            __m256 o = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(out + i), vcorr),
                                     _mm256_mul_ps(vscale, _mm256_cvtepi32_ps(t)));
            if (mu_v) o = _mm256_add_ps(o, _mm256_mul_ps(_mm256_loadu_ps(mu_v + i), vps));
            _mm256_storeu_ps(out + i, o);
        }
        l[qi] = l[qi] * corr + psum;
        m[qi] = m_new;
    }
}

void e8kv_attn_box_tile_avx2(const e8kv_box_query *bq, size_t n_q, const uint8_t *k, const uint8_t *v,
                             size_t vb, size_t n, size_t d, const float *mu_v, float *m, float *l,
                             float *const *acc) {
    assert(n <= TILE && (d == 64 || d == 128));
    if (d == 64)
        tile_impl(bq, n_q, k, v, vb, n, 64, mu_v, m, l, acc);
    else
        tile_impl(bq, n_q, k, v, vb, n, 128, mu_v, m, l, acc);
}
