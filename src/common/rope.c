/* RoPE (include/e8kv.h, e8kv_rope_*; kernels in rope.h). Pair i of a head vector at position p turns by
 * p·theta^(-2i/d). Each position's (cos, sin) is that of its block's base 64·floor(p/64), taken in double
 * (p·f reaches 1e5 rad, beyond float), turned by that of the offset p mod 64 from a table made in double at
 * create: one complex product in double per position and pair, rounded once to float (the float cos/sin of
 * the exact angle but for rare last-bit ties), never a drift along the context, and the same bits for a
 * position however the rows are split (chunks, pages, evicted runs). */
#include "rope.h"

#include "e8kv.h"

#include "cpu.h"

#include <math.h>
#include <stdlib.h>

struct e8kv_rope {
    size_t head_dim;
    int neox;
    int avx2;
    double inv_freq[E8KV_MAX_HEAD_DIM / 2];
    double *ct, *st; /* (E8KV_ROPE_BLOCK, head_dim / 2): cos, sin of offset j's angles */
};

e8kv_rope *e8kv_rope_create(size_t head_dim, float theta, int neox, size_t *err) {
    size_t e = 0;
    e8kv_rope *r = NULL;
    if (head_dim == 0 || head_dim % 2 || head_dim > E8KV_MAX_HEAD_DIM) e = E8KV_ERR(HEAD_DIM);
    else if (!(theta > 0.0f) || !isfinite(theta)) e = E8KV_ERR(BAD_ARGUMENT);
    else if (!(r = calloc(1, sizeof *r))) e = E8KV_ERR(OUT_OF_MEMORY);
    if (!e) {
        const size_t half = head_dim / 2;
        r->head_dim = head_dim;
        r->neox = neox ? 1 : 0;
        r->avx2 = e8kv_cpu_has_avx2();
        r->ct = malloc(E8KV_ROPE_BLOCK * half * sizeof *r->ct);
        r->st = malloc(E8KV_ROPE_BLOCK * half * sizeof *r->st);
        if (!r->ct || !r->st) e = E8KV_ERR(OUT_OF_MEMORY);
        for (size_t i = 0; i < half && !e; i++) {
            r->inv_freq[i] = pow((double)theta, -2.0 * (double)i / (double)head_dim);
            for (size_t j = 0; j < E8KV_ROPE_BLOCK; j++) {
                r->ct[j * half + i] = cos((double)j * r->inv_freq[i]);
                r->st[j * half + i] = sin((double)j * r->inv_freq[i]);
            }
        }
    }
    if (e) {
        e8kv_rope_free(r);
        r = NULL;
    }
    if (err) *err = e;
    return r;
}

void e8kv_rope_free(e8kv_rope *rope) {
    if (!rope) return;
    free(rope->ct);
    free(rope->st);
    free(rope);
}

size_t e8kv_rope_bytes(const e8kv_rope *rope) {
    return rope ? sizeof *rope + 2 * e8kv_aligned_size(E8KV_ROPE_BLOCK * rope->head_dim / 2 * sizeof(double)) : 0;
}

void e8kv_rope_apply(const e8kv_rope *rope, float *x, size_t n, size_t n_vec, size_t pos0) {
    const size_t d = rope->head_dim, half = d / 2;
    double cb[E8KV_MAX_HEAD_DIM / 2], sb[E8KV_MAX_HEAD_DIM / 2];
    for (size_t t = 0; t < n;) {
        const size_t pos = pos0 + t, j = pos % E8KV_ROPE_BLOCK, base = pos - j;
        const size_t run = E8KV_ROPE_BLOCK - j < n - t ? E8KV_ROPE_BLOCK - j : n - t;
        for (size_t i = 0; i < half; i++) {
            const double a = fmod((double)base * rope->inv_freq[i], 6.283185307179586);
            cb[i] = cos(a);
            sb[i] = sin(a);
        }
        float *const xt = x + t * n_vec * d;
        if (rope->avx2)
            e8kv_rope_rows_avx2(xt, run, n_vec, d, rope->neox, cb, sb, rope->ct + j * half, rope->st + j * half);
        else
            e8kv_rope_rows_ref(xt, run, n_vec, d, rope->neox, cb, sb, rope->ct + j * half, rope->st + j * half);
        t += run;
    }
}

/* no FMA contraction here either (a build for a CPU with FMA would otherwise fuse them): the twins' bits */
E8KV_NO_FP_CONTRACT
void e8kv_rope_rows_ref(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, const double *restrict cb,
                        const double *restrict sb, const double *restrict ct, const double *restrict st) {
    E8KV_NO_FP_CONTRACT_BODY
    const size_t half = d / 2;
    float C[E8KV_MAX_HEAD_DIM / 2], S[E8KV_MAX_HEAD_DIM / 2];
    for (size_t t = 0; t < n; t++) {
        const double *const c = ct + t * half, *const s = st + t * half;
        for (size_t i = 0; i < half; i++) {
            const double p = cb[i] * c[i], q = sb[i] * s[i], u = sb[i] * c[i], w = cb[i] * s[i];
            C[i] = (float)(p - q);
            S[i] = (float)(u + w);
        }
        for (size_t h = 0; h < n_vec; h++) {
            float *const y = x + (t * n_vec + h) * d;
            for (size_t i = 0; i < half; i++) {
                const size_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                const float x0 = y[i0], x1 = y[i1];
                const float a = x0 * C[i], b = x1 * S[i], e = x0 * S[i], f = x1 * C[i];
                y[i0] = a - b;
                y[i1] = e + f;
            }
        }
    }
}
