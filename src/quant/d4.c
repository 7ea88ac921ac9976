/* The D_n lattices (integer vectors with even coordinate sum) and D4 itself; closest point after
 * Conway & Sloane (IEEE T-IT 1982; SPLAG ch. 20 §2): round every coordinate; if the sum is odd, move the
 * coordinate whose rounding error is LARGEST to its second-nearest integer (the one on the other side of
 * x). Moving coordinate j that way adds (1 - |e_j|)² - e_j² = 1 - 2|e_j| to the squared distance, least
 * for the largest |e_j|. D8 is used by E8 (e8.c) as its integer coset. */
#include "lattice.h"

#include <assert.h>

float e8kv_dn_nearest(int32_t *y2, const float *x, size_t n) {
    assert(n >= 1 && n <= 16);
    int32_t r[16];
    int32_t sum = 0;
    size_t worst = 0;
    float worst_err = -1.0f;
    for (size_t i = 0; i < n; i++) {
        const float f = e8kv_round_half_away(x[i]);
        r[i] = (int32_t)f;
        sum += r[i];
        const float err = fabsf(x[i] - f);
        if (err > worst_err) {
            worst_err = err;
            worst = i;
        }
    }
    if (sum & 1) r[worst] += (x[worst] >= (float)r[worst]) ? 1 : -1;
    float d = 0.0f;
    for (size_t i = 0; i < n; i++) {
        y2[i] = 2 * r[i];
        const float e = x[i] - (float)r[i];
        d += e * e;
    }
    return d;
}

float e8kv_d4_nearest(int32_t y2[4], const float x[4]) { return e8kv_dn_nearest(y2, x, 4); }

int e8kv_dn_contains(const int32_t *y2, size_t n) {
    int32_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (y2[i] & 1) return 0;
        sum += y2[i] / 2;
    }
    return (sum & 1) == 0;
}
