/* E8 = D8 ∪ (D8 + ½); closest point after Conway & Sloane (IEEE T-IT 1982, SPLAG ch. 20 §3): the closer
 * of the D8 closest point to x and the D8 closest point to x - ½ (shifted back). The D8 step (d4.c)
 * re-rounds the coordinate with the LARGEST rounding error when the sum is odd; a published variant that
 * re-rounds another coordinate is wrong. tests/test_lattice.c checks both against brute force. */
#include "lattice.h"

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

int e8kv_e8_contains(const int32_t y2[8]) {
    const int32_t odd = y2[0] & 1;
    int32_t sum = 0;
    for (int i = 0; i < 8; i++) {
        if ((y2[i] & 1) != odd) return 0;
        sum += y2[i];
    }
    return (sum & 3) == 0;
}
