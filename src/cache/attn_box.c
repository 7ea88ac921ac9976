/* Integer-domain attention over e8box:4 pages: query quantization and the portable reference tile
 * (the math is in kvcache.h above e8kv_box_query; the AVX2 twin is attn_box_avx2.c). */
#include "kvcache.h"

#include "quant/e8_box.h"

#include <math.h>

void e8kv_box_query_init(e8kv_box_query *bq, const float *q, const float *mu_k, size_t d) {
    assert(d % 64 == 0 && d <= E8KV_BOX_MAX_D);
    memset(bq, 0, sizeof *bq);
    float amax = 0.0f;
    for (size_t i = 0; i < d; i++)
        amax = fmaxf(amax, fabsf(q[i]));
    int32_t sum = 0;
    if (amax > 0.0f) {
        bq->sq = amax / 127.0f;
        const float inv = 127.0f / amax;
        for (size_t i = 0; i < d; i++) {
            int32_t v = (int32_t)lrintf(q[i] * inv);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            bq->q8[i] = (int8_t)v;
            sum += v;
        }
    }
    bq->off = 16 * sum;
    /* coset table: the sum of q8 over block b, then every byte's sum by adding its lowest set bit's */
    for (size_t c = 0; c < d / 64; c++) {
        int32_t qb[8];
        for (size_t b = 0; b < 8; b++) {
            qb[b] = 0;
            for (size_t i = 0; i < 8; i++)
                qb[b] += bq->q8[64 * c + 8 * b + i];
        }
        bq->ctab[c][0] = c ? 0 : -bq->off;
        for (unsigned x = 1; x < 256; x++)
            bq->ctab[c][x] = bq->ctab[c][x & (x - 1)] + qb[__builtin_ctz(x)];
    }
    double qm = 0.0;
    for (size_t i = 0; mu_k && i < d; i++)
        qm += (double)q[i] * mu_k[i];
    bq->qmu = (float)qm;
}

/* u = 2n + k of value i (d % 32 == 0: groups of 32, doc/format.md §2.4) */
static inline int32_t u_of(const uint8_t *v, size_t d, size_t i) {
    const uint8_t *const p = v + 1 + (d + 63) / 64 + 16 * (i / 32) + i % 16;
    return 2 * (i % 32 < 16 ? *p & 15 : *p >> 4) + (v[1 + i / 64] >> (i / 8 % 8) & 1);
}

void e8kv_attn_box_tile_ref(const e8kv_box_query *bq, size_t n_q, const uint8_t *k, const uint8_t *v,
                            size_t vb, size_t n, size_t d, const float *mu_v, const float *bias, float *m,
                            float *l, float *const *acc) {
    assert(n <= 64 && d % 64 == 0 && d <= E8KV_BOX_MAX_D);
    const float *const hs = e8kv_box_half_steps();
    for (size_t g = 0; g < n_q; g++) {
        const e8kv_box_query *const q = &bq[g];
        float s[64], w[64];
        float m_new = m[g];
        for (size_t j = 0; j < n; j++) {
            const uint8_t *const kj = k + j * vb;
            int32_t dot = -q->off;
            for (size_t i = 0; i < d; i++)
                dot += q->q8[i] * u_of(kj, d, i);
            s[j] = q->sq * hs[kj[0]] * (float)dot + q->qmu;
            if (bias) s[j] = s[j] + bias[g * 64 + j];
            if (s[j] > m_new) m_new = s[j];
        }
        const float corr = expf(m[g] - m_new); /* m = -inf on the first tile: 0 */
        float psum = 0.0f, wmax = 0.0f;
        for (size_t j = 0; j < n; j++) {
            const float p = expf(s[j] - m_new);
            psum += p;
            w[j] = p * hs[v[j * vb]];
            wmax = fmaxf(wmax, w[j]);
        }
        int32_t an[E8KV_BOX_MAX_D] = {0}, sw = 0;
        const float to8 = wmax > 0.0f ? 127.0f / wmax : 0.0f;
        for (size_t j = 0; j < n; j++) {
            const int32_t w8 = (int32_t)lrintf(w[j] * to8);
            const uint8_t *const vj = v + j * vb;
            sw += w8;
            for (size_t i = 0; i < d; i++)
                an[i] += w8 * u_of(vj, d, i);
        }
        const float scale = wmax / 127.0f;
        float *const a = acc[g];
        for (size_t i = 0; i < d; i++)
            a[i] = a[i] * corr + scale * (float)(an[i] - 16 * sw) + (mu_v ? mu_v[i] * psum : 0.0f);
        l[g] = l[g] * corr + psum;
        m[g] = m_new;
    }
}
