/* RoPE (include/e8kv.h, e8kv_rope_*; kernels in rope.h). Pair i of a head vector at position p turns by
 * p·theta^(-2i/d). Each position's (cos, sin) is that of its block's base 64·floor(p/64), taken in double
 * (p·f reaches 1e5 rad, beyond float), then turned p mod 64 times by the per-position step, in double (a
 * drift of ~1e-15 at most), rounded once to float: the float cos/sin of the exact angle but for rare
 * last-bit ties, and the same bits for a position however the rows are split (chunks, pages, evicted runs):
 * its value is always reached by the same operations from its block's base. */
#include "rope.h"

#include "e8kv.h"

#include "cpu.h"

#include <math.h>
#include <stdlib.h>

struct e8kv_rope {
    size_t head_dim;
    int neox;
    int avx2;
    double *inv_freq, *dc, *ds; /* head_dim / 2 each, one allocation: the frequencies, their cos and sin */
};

e8kv_rope *e8kv_rope_create(size_t head_dim, float theta, int neox, size_t *err) {
    double f[E8KV_MAX_HEAD_DIM / 2];
    if (!(theta > 0.0f) || !isfinite(theta)) {
        if (err) *err = E8KV_ERR(BAD_ARGUMENT);
        return NULL;
    }
    for (size_t i = 0; i < head_dim / 2 && i < E8KV_MAX_HEAD_DIM / 2; i++)
        f[i] = pow((double)theta, -2.0 * (double)i / (double)head_dim);
    return e8kv_rope_create_freqs(head_dim, f, neox, err);
}

e8kv_rope *e8kv_rope_create_freqs(size_t head_dim, const double *inv_freq, int neox, size_t *err) {
    size_t e = 0;
    e8kv_rope *r = NULL;
    if (head_dim == 0 || head_dim % 2 || head_dim > E8KV_MAX_HEAD_DIM) e = E8KV_ERR(HEAD_DIM);
    else if (!inv_freq) e = E8KV_ERR(BAD_ARGUMENT);
    for (size_t i = 0; i < head_dim / 2 && !e; i++)
        if (!(inv_freq[i] >= 0.0) || !isfinite(inv_freq[i])) e = E8KV_ERR(BAD_ARGUMENT);
    if (!e && !(r = calloc(1, sizeof *r))) e = E8KV_ERR(OUT_OF_MEMORY);
    if (!e) {
        const size_t half = head_dim / 2;
        r->head_dim = head_dim;
        r->neox = neox ? 1 : 0;
        r->avx2 = e8kv_cpu_has_avx2();
        if (!(r->inv_freq = malloc(3 * half * sizeof *r->inv_freq))) {
            e = E8KV_ERR(OUT_OF_MEMORY);
        } else {
            r->dc = r->inv_freq + half;
            r->ds = r->inv_freq + 2 * half;
        }
        for (size_t i = 0; i < half && !e; i++) {
            r->inv_freq[i] = inv_freq[i];
            r->dc[i] = cos(r->inv_freq[i]);
            r->ds[i] = sin(r->inv_freq[i]);
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
    free(rope->inv_freq);
    free(rope);
}

size_t e8kv_rope_bytes(const e8kv_rope *rope) {
    return rope ? sizeof *rope + e8kv_aligned_size(3 * rope->head_dim / 2 * sizeof(double)) : 0;
}

void e8kv_rope_apply(const e8kv_rope *rope, float *x, size_t n, size_t n_vec, size_t pos0) {
    const size_t d = rope->head_dim, half = d / 2;
    double cc[E8KV_MAX_HEAD_DIM / 2], ss[E8KV_MAX_HEAD_DIM / 2];
    void (*rows)(float *restrict, size_t, size_t, size_t, int, double *restrict, double *restrict,
                 const double *restrict, const double *restrict) =
        rope->avx2 ? e8kv_rope_rows_avx2 : e8kv_rope_rows_ref;
    for (size_t t = 0; t < n;) {
        const size_t pos = pos0 + t, j = pos % E8KV_ROPE_BLOCK, base = pos - j;
        const size_t run = E8KV_ROPE_BLOCK - j < n - t ? E8KV_ROPE_BLOCK - j : n - t;
        for (size_t i = 0; i < half; i++) {
            const double a = fmod((double)base * rope->inv_freq[i], 6.283185307179586);
            cc[i] = cos(a);
            ss[i] = sin(a);
        }
        rows(NULL, j, 0, d, rope->neox, cc, ss, rope->dc, rope->ds); /* to the run's first offset */
        rows(x + t * n_vec * d, run, n_vec, d, rope->neox, cc, ss, rope->dc, rope->ds);
        t += run;
    }
}

/* no FMA contraction here either (a build for a CPU with FMA would otherwise fuse them): the twins' bits */
E8KV_NO_FP_CONTRACT
void e8kv_rope_rows_ref(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, double *restrict cc,
                        double *restrict ss, const double *restrict dc, const double *restrict ds) {
    E8KV_NO_FP_CONTRACT_BODY
    const size_t half = d / 2;
    for (size_t t = 0; t < n; t++) {
        for (size_t h = 0; h < n_vec; h++) {
            float *const y = x + (t * n_vec + h) * d;
            for (size_t i = 0; i < half; i++) {
                const size_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                const float C = (float)cc[i], S = (float)ss[i], x0 = y[i0], x1 = y[i1];
                const float a = x0 * C, b = x1 * S, e = x0 * S, f = x1 * C;
                y[i0] = a - b;
                y[i1] = e + f;
            }
        }
        for (size_t i = 0; i < half; i++) {
            const double p = cc[i] * dc[i], q = ss[i] * ds[i], u = ss[i] * dc[i], w = cc[i] * ds[i];
            cc[i] = p - q;
            ss[i] = u + w;
        }
    }
}
