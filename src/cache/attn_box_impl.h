/* The body of the fast e8box:4 attention tiles (attn_box_avx2.c, attn_box_vnni.c): the same integers and
 * float expressions as e8kv_attn_box_tile_ref (attn_box.c), exp by exp_avx2. Included by exactly those two
 * files, with BOX_VNNI 0 (AVX2: vpmaddubsw + vpmaddwd) or 1 (AVX-VNNI: vpdpbusd); BOX_TILE_FN names the
 * function. Layout of a vector: doc/format.md §2.4; a 32-byte chunk c of the nibble bytes holds groups
 * 2c and 2c+1, raw byte r < 16 values r (low nibble) and 16 + r (high), r ≥ 16 values 16 + r and 32 + r.
 *
 * Scores (per query, 8 keys at a time): q·u with u = 2n + k splits into 2·Σ q8_i·n_i, taken straight from
 * the nibble bytes (low nibbles against the query's matching bytes, high nibbles likewise; no per-key
 * unpacking into u), plus Σ_b k_b·Q_b − 16·Σ q8 for the coset bits, one look-up in the query's table
 * (e8kv_box_query.ctab) per coset byte, gathered for 8 keys.
 * Values: Σ_j w8_j·n_ji needs the tokens interleaved (the byte products sum neighbouring bytes): the raw
 * bytes of 2 (AVX2) or 4 (VNNI) tokens are interleaved once per tile and then split into nibbles, so every
 * query's products land in 16-bit pair sums (vpmaddubsw, flushed to int32 every PAIR_FLUSH pairs) or
 * straight in int32 (vpdpbusd); the coset term Σ_j w8_j·k_jb by masked vpsadbw as before. */
#include "kvcache.h"

#include "quant/e8_box.h"
#include "simd_avx2.h"

#include <immintrin.h>
#include <math.h>

#define TILE 64
#define NCH_MAX (E8KV_BOX_MAX_D / 64) /* 32-byte nibble chunks per vector */
#define PAIR_FLUSH 8                  /* pairs per int16 accumulation: 8 · 2 · 15 · 127 = 30480 < 32767 */
#define TOK_IL (BOX_VNNI ? 4 : 2)     /* tokens interleaved for the value products */
/* the short register loops fully unrolled (gcc keeps them rolled, with the accumulators in memory) */
#define E8KV_UNROLL _Pragma("GCC unroll 16")

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

/* the low and high nibbles of the 32 bytes x, each in its byte, to lo and hi (32-byte aligned) */
static inline void store_nibbles(uint8_t *lo, uint8_t *hi, __m256i x) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    _mm256_store_si256((__m256i *)(void *)lo, _mm256_and_si256(x, m4));
    _mm256_store_si256((__m256i *)(void *)hi, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4));
}

/* the 8 per-key sums of a[0..7] (8 int32 lanes each), in key order */
static inline __m256i reduce8(const __m256i *a) {
    const __m256i h0 = _mm256_hadd_epi32(a[0], a[1]), h1 = _mm256_hadd_epi32(a[2], a[3]),
                  h2 = _mm256_hadd_epi32(a[4], a[5]), h3 = _mm256_hadd_epi32(a[6], a[7]);
    const __m256i g0 = _mm256_hadd_epi32(h0, h1), g1 = _mm256_hadd_epi32(h2, h3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* Σ over the 32 bytes of one chunk of (nibble · query byte): int32 lanes to be summed */
static inline __m256i nib_dot(__m256i acc, __m256i lo, __m256i hi, __m256i qlo, __m256i qhi) {
#if BOX_VNNI
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, lo, qlo), hi, qhi);
#else
    /* each pair sum ≤ 2·15·127, the two ≤ 7620: no int16 overflow */
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, qlo), _mm256_maddubs_epi16(hi, qhi));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

static inline __attribute__((always_inline)) void tile_impl(const e8kv_box_query *bq, size_t n_q,
                                                            const uint8_t *k, const uint8_t *v, size_t vb,
                                                            size_t n, const size_t d, const float *mu_v,
                                                            const float *bias, float *m, float *l,
                                                            float *const *acc) {
    const float *const hs = e8kv_box_half_steps();
    const size_t n_ch = d / 64, n_cos = d / 64, off = 1 + n_cos, n8 = (n + 7) & ~(size_t)7;
    const size_t n_il = (n + TOK_IL - 1) / TOK_IL;
    _Alignas(32) uint8_t klo[TILE][NCH_MAX][32], khi[TILE][NCH_MAX][32]; /* keys' nibbles */
    _Alignas(32) int32_t kc[NCH_MAX][TILE];                              /* keys' coset bytes */
    _Alignas(32) uint8_t vn[TILE / TOK_IL][NCH_MAX][2 * TOK_IL][32];     /* values' nibbles, interleaved */
    _Alignas(32) float hk[TILE], hv[TILE] = {0};                         /* δ/2 per token; 0 past n */
    _Alignas(32) uint8_t vc[NCH_MAX][TILE] = {{0}};                      /* values' coset bytes */
    for (size_t j = 0; j < n8; j++) {
        if (j < n) {
            const uint8_t *const kj = k + j * vb;
            hk[j] = hs[kj[0]];
            E8KV_UNROLL
            for (size_t c = 0; c < n_ch; c++) {
                kc[c][j] = kj[1 + c];
                store_nibbles(klo[j][c], khi[j][c],
                              _mm256_loadu_si256((const __m256i *)(const void *)(kj + off + 32 * c)));
            }
        } else { /* padding to a multiple of 8 keys: nibbles 0, step 0 (score qmu, weight masked) */
            hk[j] = 0.0f;
            E8KV_UNROLL
            for (size_t c = 0; c < n_ch; c++) {
                kc[c][j] = 0;
                _mm256_store_si256((__m256i *)(void *)klo[j][c], _mm256_setzero_si256());
                _mm256_store_si256((__m256i *)(void *)khi[j][c], _mm256_setzero_si256());
            }
        }
    }
    for (size_t t = 0; t < n_il; t++) {
        __m256i raw[4][NCH_MAX];
        E8KV_UNROLL
        for (size_t u = 0; u < TOK_IL; u++) {
            const size_t j = TOK_IL * t + u;
            E8KV_UNROLL
            for (size_t c = 0; c < n_ch; c++)
                raw[u][c] =
                    j < n ? _mm256_loadu_si256((const __m256i *)(const void *)(v + j * vb + off + 32 * c))
                          : _mm256_setzero_si256();
            if (j < n) {
                hv[j] = hs[v[j * vb]];
                for (size_t c = 0; c < n_cos; c++)
                    vc[c][j] = v[j * vb + 1 + c];
            }
        }
        E8KV_UNROLL
        for (size_t c = 0; c < n_ch; c++) {
#if BOX_VNNI
            /* quads: r_i lane 0 holds raw bytes 4i .. 4i+3 of tokens a, b, c, d byte by byte, lane 1 the same
             * for raw bytes 16 + 4i .. */
            const __m256i ab0 = _mm256_unpacklo_epi8(raw[0][c], raw[1][c]),
                          ab1 = _mm256_unpackhi_epi8(raw[0][c], raw[1][c]),
                          cd0 = _mm256_unpacklo_epi8(raw[2][c], raw[3][c]),
                          cd1 = _mm256_unpackhi_epi8(raw[2][c], raw[3][c]);
            const __m256i r[TOK_IL] = {_mm256_unpacklo_epi16(ab0, cd0), _mm256_unpackhi_epi16(ab0, cd0),
                                       _mm256_unpacklo_epi16(ab1, cd1), _mm256_unpackhi_epi16(ab1, cd1)};
#else
            /* pairs: r_0 lane 0 holds raw bytes 0 .. 7 of tokens a, b byte by byte, lane 1 raw bytes 16 ..
             * 23; r_1 raw bytes 8 .. 15 and 24 .. 31 */
            const __m256i r[TOK_IL] = {_mm256_unpacklo_epi8(raw[0][c], raw[1][c]),
                                       _mm256_unpackhi_epi8(raw[0][c], raw[1][c])};
#endif
            E8KV_UNROLL
            for (int i = 0; i < TOK_IL; i++)
                store_nibbles(vn[t][c][2 * i], vn[t][c][2 * i + 1], r[i]);
        }
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t qi = 0; qi < n_q; qi++) {
        const e8kv_box_query *const q = &bq[qi];
        _Alignas(32) float s[TILE];
        __m256i qlo[NCH_MAX], qhi[NCH_MAX]; /* the query bytes matching low and high nibbles */
        for (size_t c = 0; c < n_ch; c++) {
            const int8_t *const q8 = q->q8 + 64 * c;
            qlo[c] = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(const void *)(q8 + 32)),
                                      _mm_loadu_si128((const __m128i *)(const void *)q8));
            qhi[c] = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(const void *)(q8 + 48)),
                                      _mm_loadu_si128((const __m128i *)(const void *)(q8 + 16)));
        }
        const __m256 vsq = _mm256_set1_ps(q->sq), vqmu = _mm256_set1_ps(q->qmu);
        for (size_t j = 0; j < n8; j += 8) {
            __m256i a[8];
            E8KV_UNROLL
            for (int t = 0; t < 8; t++) {
                __m256i sum = _mm256_setzero_si256();
                E8KV_UNROLL
                for (size_t c = 0; c < n_ch; c++)
                    sum =
                        nib_dot(sum, _mm256_load_si256((const __m256i *)(const void *)klo[j + (size_t)t][c]),
                                _mm256_load_si256((const __m256i *)(const void *)khi[j + (size_t)t][c]),
                                qlo[c], qhi[c]);
                a[t] = sum;
            }
            /* Σ q8·(2n + k) − 16·Σ q8 = 2·Σ q8·n + ctab (the coset terms and the offset) */
            __m256i dot = _mm256_slli_epi32(reduce8(a), 1);
            for (size_t c = 0; c < n_cos; c++)
                dot = _mm256_add_epi32(
                    dot, _mm256_i32gather_epi32(
                             q->ctab[c], _mm256_load_si256((const __m256i *)(const void *)(kc[c] + j)), 4));
            /* s = sq·h·dot + qmu, as the reference evaluates it */
            const __m256 hq = _mm256_mul_ps(vsq, _mm256_load_ps(hk + j));
            __m256 sj = _mm256_add_ps(_mm256_mul_ps(hq, _mm256_cvtepi32_ps(dot)), vqmu);
            if (bias) sj = _mm256_add_ps(sj, _mm256_loadu_ps(bias + qi * TILE + j)); /* center=rope */
            _mm256_store_ps(s + j, sj);
        }
        /* running max over the n valid scores */
        __m256 vmx = _mm256_set1_ps(m[qi]);
        for (size_t j = 0; j < n; j += 8) {
            const __m256 valid =
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane));
            vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(vmx, _mm256_load_ps(s + j), valid));
        }
        vmx = hmax256(vmx);
        const float m_new = _mm256_cvtss_f32(vmx);
        /* weights p_j (lanes past n masked to 0), w_j = p_j·δ_j/2 */
        __m256 vsum = _mm256_setzero_ps(), vwmax = _mm256_setzero_ps();
        _Alignas(32) float w[TILE];
        for (size_t j = 0; j < n; j += 8) {
            const __m256 valid =
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane));
            const __m256 sv = _mm256_blendv_ps(vmx, _mm256_load_ps(s + j), valid); /* past n: e^0, masked */
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
            E8KV_UNROLL
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
        /* Σ_j w8_j·n_ji, 64 values (one chunk) at a time */
        _Alignas(32) int32_t an[E8KV_BOX_MAX_D];
        for (size_t c = 0; c < n_ch; c++) {
            int32_t *const dst = an + 64 * c;
#if BOX_VNNI
            __m256i a32[8];
            E8KV_UNROLL
            for (int i = 0; i < 8; i++)
                a32[i] = _mm256_setzero_si256();
            for (size_t t = 0; t < n_il; t++) {
                int32_t wq;
                memcpy(&wq, w8 + 4 * t, 4);
                const __m256i ww = _mm256_set1_epi32(wq);
                E8KV_UNROLL
                for (int i = 0; i < 8; i++)
                    a32[i] = _mm256_dpbusd_avx_epi32(
                        a32[i], _mm256_load_si256((const __m256i *)(const void *)vn[t][c][i]), ww);
            }
            /* a32[2i]: lane 0 values 4i .. 4i+3, lane 1 values 32 + 4i ..; a32[2i+1]: 16 + 4i .., 48 + 4i ..
             */
            E8KV_UNROLL
            for (int i = 0; i < 4; i++) {
                _mm_store_si128((__m128i *)(void *)(dst + 4 * i), _mm256_castsi256_si128(a32[2 * i]));
                _mm_store_si128((__m128i *)(void *)(dst + 32 + 4 * i),
                                _mm256_extracti128_si256(a32[2 * i], 1));
                _mm_store_si128((__m128i *)(void *)(dst + 16 + 4 * i),
                                _mm256_castsi256_si128(a32[2 * i + 1]));
                _mm_store_si128((__m128i *)(void *)(dst + 48 + 4 * i),
                                _mm256_extracti128_si256(a32[2 * i + 1], 1));
            }
#else
            __m256i a32[8];
            E8KV_UNROLL
            for (int i = 0; i < 8; i++)
                a32[i] = _mm256_setzero_si256();
            for (size_t p0 = 0; p0 < n_il; p0 += PAIR_FLUSH) {
                const size_t p1 = p0 + PAIR_FLUSH < n_il ? p0 + PAIR_FLUSH : n_il;
                __m256i a16[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                                  _mm256_setzero_si256()};
                for (size_t t = p0; t < p1; t++) {
                    uint16_t pw;
                    memcpy(&pw, w8 + 2 * t, 2);
                    const __m256i wp = _mm256_set1_epi16((short)pw);
                    E8KV_UNROLL
                    for (int i = 0; i < 4; i++)
                        a16[i] = _mm256_add_epi16(
                            a16[i], _mm256_maddubs_epi16(
                                        _mm256_load_si256((const __m256i *)(const void *)vn[t][c][i]), wp));
                }
                E8KV_UNROLL
                for (int i = 0; i < 4; i++) {
                    a32[2 * i] =
                        _mm256_add_epi32(a32[2 * i], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a16[i])));
                    a32[2 * i + 1] = _mm256_add_epi32(
                        a32[2 * i + 1], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a16[i], 1)));
                }
            }
            /* a16[0]: low nibbles of raw bytes 0..7 (values 0..7) and 16..23 (values 32..39); a16[1]: their
             * high nibbles (16..23, 48..55); a16[2], a16[3]: raw bytes 8..15, 24..31 likewise */
            static const int at[8] = {0, 32, 16, 48, 8, 40, 24, 56};
            E8KV_UNROLL
            for (int i = 0; i < 8; i++)
                _mm256_store_si256((__m256i *)(void *)(dst + at[i]), a32[i]);
#endif
        }
        /* Σ_j w8_j·k_jb per block b: the weights of the tokens whose coset byte has bit b */
        int32_t ak[E8KV_BOX_MAX_D / 8];
        for (size_t c = 0; c < n_cos; c++)
            E8KV_UNROLL
        for (int b = 0; b < 8; b++)
            ak[8 * c + (size_t)b] = hsum_epi32(masked_sad(vc[c], w0, w1, _mm256_set1_epi8((char)(1 << b))));
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

void BOX_TILE_FN(const e8kv_box_query *bq, size_t n_q, const uint8_t *k, const uint8_t *v, size_t vb,
                 size_t n, size_t d, const float *mu_v, const float *bias, float *m, float *l,
                 float *const *acc) {
    assert(n <= TILE && (d == 64 || d == 128));
    if (d == 64)
        tile_impl(bq, n_q, k, v, vb, n, 64, mu_v, bias, m, l, acc);
    else
        tile_impl(bq, n_q, k, v, vb, n, 128, mu_v, bias, m, l, acc);
}
