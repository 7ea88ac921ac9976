/* KLT: symmetric eigensolver (cyclic Jacobi) and the basis transforms (see klt.h). */
#include "klt.h"

#include <math.h>
#include <stdlib.h>

#define JACOBI_MAX_SWEEPS 100

/* One Jacobi rotation zeroing a[p][q] (p < q): a ← Jᵀ a J, v ← v J (v's columns the eigenvectors). */
static void rotate(double *a, double *v, size_t n, size_t p, size_t q) {
    const double apq = a[p * n + q];
    const double theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
    /* the smaller root of t² + 2θt − 1 = 0: the rotation angle of magnitude ≤ π/4 (stable) */
    const double t = (theta >= 0.0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
    const double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
    for (size_t k = 0; k < n; k++) { /* columns p, q */
        const double akp = a[k * n + p], akq = a[k * n + q];
        a[k * n + p] = c * akp - s * akq;
        a[k * n + q] = s * akp + c * akq;
    }
    for (size_t k = 0; k < n; k++) { /* rows p, q */
        const double apk = a[p * n + k], aqk = a[q * n + k];
        a[p * n + k] = c * apk - s * aqk;
        a[q * n + k] = s * apk + c * aqk;
    }
    a[p * n + q] = a[q * n + p] = 0.0;
    for (size_t k = 0; k < n; k++) {
        const double vkp = v[k * n + p], vkq = v[k * n + q];
        v[k * n + p] = c * vkp - s * vkq;
        v[k * n + q] = s * vkp + c * vkq;
    }
}

size_t e8kv_sym_eigen(double *a, size_t n, double *w, double *v) {
    if (!a || !w || !v || n == 0) return E8KV_ERR(BAD_ARGUMENT);
    double *vc = malloc(n * n * sizeof *vc); /* eigenvectors as columns while iterating */
    size_t *order = malloc(n * sizeof *order);
    if (!vc || !order) {
        free(vc);
        free(order);
        return E8KV_ERR(OUT_OF_MEMORY);
    }
    for (size_t i = 0; i < n * n; i++)
        vc[i] = (i % (n + 1) == 0) ? 1.0 : 0.0;
    double total = 0.0;
    for (size_t i = 0; i < n * n; i++)
        total += a[i] * a[i];
    size_t r = E8KV_ERR(GENERIC);
    for (int sweep = 0; sweep < JACOBI_MAX_SWEEPS; sweep++) {
        double off = 0.0;
        for (size_t p = 0; p < n; p++)
            for (size_t q = p + 1; q < n; q++)
                off += 2.0 * a[p * n + q] * a[p * n + q];
        if (off <= 1e-28 * total) {
            r = 0;
            break;
        }
        for (size_t p = 0; p < n; p++)
            for (size_t q = p + 1; q < n; q++)
                if (a[p * n + q] != 0.0) rotate(a, vc, n, p, q);
    }
    /* sort by decreasing eigenvalue (stable selection: equal values keep their index order) */
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = 0; i < n; i++) {
        size_t best = i;
        for (size_t j = i + 1; j < n; j++)
            if (a[order[j] * n + order[j]] > a[order[best] * n + order[best]]) best = j;
        const size_t tmp = order[i];
        order[i] = order[best];
        order[best] = tmp;
    }
    for (size_t i = 0; i < n; i++) {
        const size_t col = order[i];
        w[i] = a[col * n + col];
        size_t big = 0;
        for (size_t k = 1; k < n; k++)
            if (fabs(vc[k * n + col]) > fabs(vc[big * n + col])) big = k;
        const double sg = vc[big * n + col] < 0.0 ? -1.0 : 1.0;
        for (size_t k = 0; k < n; k++)
            v[i * n + k] = sg * vc[k * n + col];
    }
    free(vc);
    free(order);
    return r;
}

void e8kv_klt_forward_ref(const float *restrict P, size_t d, float *x, size_t n_vec) {
    float t[E8KV_MAX_HEAD_DIM];
    for (size_t v = 0; v < n_vec; v++) {
        float *const xv = x + v * d;
        for (size_t i = 0; i < d; i++) {
            float s = 0.0f;
            for (size_t k = 0; k < d; k++)
                s += P[i * d + k] * xv[k];
            t[i] = s;
        }
        memcpy(xv, t, d * sizeof(float));
    }
}

void e8kv_klt_inverse_ref(const float *restrict P, size_t d, size_t n_used, float *x, size_t n_vec) {
    float t[E8KV_MAX_HEAD_DIM];
    for (size_t v = 0; v < n_vec; v++) {
        float *const xv = x + v * d;
        for (size_t k = 0; k < d; k++)
            t[k] = 0.0f;
        for (size_t i = 0; i < n_used; i++)
            for (size_t k = 0; k < d; k++)
                t[k] += P[i * d + k] * xv[i];
        memcpy(xv, t, d * sizeof(float));
    }
}
