/* D8* = Z^8 ∪ (Z^8 + ½), the "relaxed parity" E8 (E8 without its even-sum rule). It is a lattice (the
 * dual of D8, twice E8's point density), so at equal step it has lower MSE than E8 but costs one more bit
 * per 8 values; compare the two at matched rate (DESIGN.md). Closest point: round every coordinate in
 * each coset independently and keep the closer coset (integer coset on exact ties). */
#include "lattice.h"

float e8kv_e8_relaxed_nearest(int32_t y2[8], const float x[8]) {
    float da = 0.0f, db = 0.0f;
    int32_t a[8], b[8];
    for (int i = 0; i < 8; i++) {
        const float ra = e8kv_round_half_away(x[i]);
        const float rb = e8kv_round_half_away(x[i] - 0.5f);
        a[i] = 2 * (int32_t)ra;
        b[i] = 2 * (int32_t)rb + 1;
        const float ea = x[i] - ra, eb = x[i] - (rb + 0.5f);
        da += ea * ea;
        db += eb * eb;
    }
    const int32_t *const w = da <= db ? a : b;
    for (int i = 0; i < 8; i++) y2[i] = w[i];
    return da <= db ? da : db;
}

int e8kv_e8_relaxed_contains(const int32_t y2[8]) {
    const int32_t odd = y2[0] & 1;
    for (int i = 0; i < 8; i++)
        if ((y2[i] & 1) != odd) return 0;
    return 1;
}
