/* E8 = D8 ∪ (D8 + ½); closest point after Conway & Sloane (IEEE T-IT 1982, SPLAG ch. 20 §3).
 * D_n: round every coordinate; if the coordinate sum is odd, move the coordinate whose rounding error
 * is LARGEST to its second-nearest integer (the one on the other side of x). A published variant that
 * re-rounds another coordinate is wrong; tests/test_lattice.c checks against brute force. */
#include "lattice.h"

#include <assert.h>
#include <math.h>

static float round_half_away(float v) { return v >= 0.0f ? floorf(v + 0.5f) : -floorf(-v + 0.5f); }

float e8kv_dn_nearest(int32_t *y2, const float *x, size_t n) {
    assert(n <= 16);
    int32_t r[16];
    int sum = 0;
    size_t worst = 0;
    float worst_err = -1.0f;
    for (size_t i = 0; i < n; i++) {
        const float f = round_half_away(x[i]);
        r[i] = (int32_t)f;
        sum += r[i];
        const float err = fabsf(x[i] - f);
        if (err > worst_err) {
            worst_err = err;
            worst = i;
        }
    }
    if (sum & 1) {
        /* the other side of x: if x >= rounded value go up, else down */
        r[worst] += (x[worst] >= (float)r[worst]) ? 1 : -1;
    }
    float d = 0.0f;
    for (size_t i = 0; i < n; i++) {
        y2[i] = 2 * r[i];
        const float e = x[i] - (float)r[i];
        d += e * e;
    }
    return d;
}

float e8kv_e8_nearest(int32_t y2[8], const float x[8]) {
    int32_t a[8], b[8];
    float xs[8];
    const float da = e8kv_dn_nearest(a, x, 8);
    for (int i = 0; i < 8; i++) xs[i] = x[i] - 0.5f;
    const float db = e8kv_dn_nearest(b, xs, 8);
    if (da <= db) {
        for (int i = 0; i < 8; i++) y2[i] = a[i];
        return da;
    }
    for (int i = 0; i < 8; i++) y2[i] = b[i] + 1;
    return db;
}

float e8kv_e8_relaxed_nearest(int32_t y2[8], const float x[8]) {
    float da = 0.0f, db = 0.0f;
    int32_t a[8], b[8];
    for (int i = 0; i < 8; i++) {
        const float ra = round_half_away(x[i]);
        const float rb = round_half_away(x[i] - 0.5f) + 0.5f;
        a[i] = (int32_t)(2.0f * ra);
        b[i] = (int32_t)(2.0f * rb);
        da += (x[i] - ra) * (x[i] - ra);
        db += (x[i] - rb) * (x[i] - rb);
    }
    const int32_t *w = da <= db ? a : b;
    for (int i = 0; i < 8; i++) y2[i] = w[i];
    return da <= db ? da : db;
}

float e8kv_d4_nearest(int32_t y2[4], const float x[4]) { return e8kv_dn_nearest(y2, x, 4); }

int e8kv_e8_contains(const int32_t y2[8]) {
    const int odd = y2[0] & 1;
    int32_t sum = 0;
    for (int i = 0; i < 8; i++) {
        if ((y2[i] & 1) != odd) return 0;
        sum += y2[i];
    }
    return (sum % 4) == 0;
}
