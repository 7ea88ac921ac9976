/* Fixed-point closest point of D_n / E8 and Voronoi coset digits / canonical representatives (see
 * voronoi.h for the rules and the generator matrices; Conway & Sloane, SPLAG ch. 20 and IEEE T-IT 1983).
 * Everything is integer arithmetic, so a code is a pure function of the input bits. */
#include "voronoi.h"

/* floor(a / 2^k) for signed a (arithmetic shift; gcc and clang define >> on negatives this way). */
static inline int32_t floor_shift(int32_t a, unsigned k) {
    return a >> k;
}

void e8kv_dn_nearest_fx(int32_t *y, const int32_t *X, size_t n) {
    assert(n <= 8);
    int32_t e[8];
    int32_t sum = 0, worst_abs = -1;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        y[i] = floor_shift(X[i] + E8KV_FX_HALF, E8KV_FX_BITS); /* ties toward +inf */
        e[i] = X[i] - y[i] * E8KV_FX_ONE;                      /* in [-HALF, HALF) */
        sum += y[i];
        const int32_t a = e[i] < 0 ? -e[i] : e[i];
        if (a > worst_abs) {
            worst_abs = a;
            worst = i;
        }
    }
    if (sum & 1) y[worst] += e[worst] >= 0 ? 1 : -1;
}

static int64_t dist2_int(const int32_t *X, const int32_t *y, int32_t offset, size_t n) {
    int64_t d = 0;
    for (size_t i = 0; i < n; i++) {
        const int64_t e = (int64_t)X[i] - ((int64_t)y[i] * E8KV_FX_ONE + offset);
        d += e * e;
    }
    return d;
}

void e8kv_e8_nearest_fx(int32_t y2[8], const int32_t X[8]) {
    int32_t a[8], b[8], Xs[8];
    e8kv_dn_nearest_fx(a, X, 8);
    for (int i = 0; i < 8; i++)
        Xs[i] = X[i] - E8KV_FX_HALF;
    e8kv_dn_nearest_fx(b, Xs, 8);
    const int64_t da = dist2_int(X, a, 0, 8);
    const int64_t db = dist2_int(X, b, E8KV_FX_HALF, 8);
    if (da <= db)
        for (int i = 0; i < 8; i++)
            y2[i] = 2 * a[i];
    else
        for (int i = 0; i < 8; i++)
            y2[i] = 2 * b[i] + 1;
}

void e8kv_d4_nearest_fx(int32_t y[4], const int32_t X[4]) {
    e8kv_dn_nearest_fx(y, X, 4);
}

uint32_t e8kv_e8_digits(const int32_t y2[8], unsigned log2_m) {
    assert(log2_m >= 1 && log2_m <= 4);
    /* solve y = Σ u_i g_i from the last column back (every division is exact) */
    /* every halving is of an even number, so the arithmetic shift is an exact division */
    int32_t u[8];
    u[7] = y2[7];
    u[6] = (y2[6] - u[7]) >> 1;
    for (int j = 5; j >= 1; j--)
        u[j] = ((y2[j] - u[7]) >> 1) + u[j + 1];
    u[0] = (((y2[0] - u[7]) >> 1) + u[1]) >> 1;
    const uint32_t mask = (1u << log2_m) - 1u;
    uint32_t d = 0;
    for (unsigned i = 0; i < 8; i++)
        d |= ((uint32_t)u[i] & mask) << (i * log2_m);
    return d;
}

void e8kv_e8_coset_rep(int32_t r2[8], uint32_t digits, unsigned log2_m) {
    e8kv_e8_coset_rep_with(r2, digits, log2_m, e8kv_e8_nearest_fx);
}

void e8kv_e8_coset_rep_with(int32_t r2[8], uint32_t digits, unsigned log2_m,
                            void (*nearest)(int32_t y2[8], const int32_t X[8])) {
    assert(log2_m >= 1 && log2_m <= 4);
    const uint32_t mask = (1u << log2_m) - 1u;
    int32_t u[8];
    for (unsigned i = 0; i < 8; i++)
        u[i] = (int32_t)((digits >> (i * log2_m)) & mask);
    /* r2 = 2·Σ u_i g_i */
    for (int j = 0; j < 8; j++)
        r2[j] = u[7];
    r2[0] += 4 * u[0];
    for (int i = 1; i <= 6; i++) {
        r2[i] += 2 * u[i];
        r2[i - 1] -= 2 * u[i];
    }
    /* subtract m·Q(r / m): r/m = r2 / 2^(log2_m + 1), exact in fixed point */
    int32_t X[8], q2[8];
    for (int j = 0; j < 8; j++)
        X[j] = r2[j] * (E8KV_FX_ONE >> (log2_m + 1));
    nearest(q2, X);
    for (int j = 0; j < 8; j++)
        r2[j] -= q2[j] * (1 << log2_m);
}

uint32_t e8kv_d4_digits(const int32_t y[4], unsigned log2_m) {
    assert(log2_m >= 1 && log2_m <= 4);
    int32_t u[4];
    u[3] = y[3];
    u[2] = y[2] + u[3];
    u[1] = y[1] + u[2];
    u[0] = (y[0] + u[1]) / 2;
    const uint32_t mask = (1u << log2_m) - 1u;
    uint32_t d = 0;
    for (unsigned i = 0; i < 4; i++)
        d |= ((uint32_t)u[i] & mask) << (i * log2_m);
    return d;
}

void e8kv_d4_coset_rep(int32_t r[4], uint32_t digits, unsigned log2_m) {
    assert(log2_m >= 1 && log2_m <= 4);
    const uint32_t mask = (1u << log2_m) - 1u;
    int32_t u[4];
    for (unsigned i = 0; i < 4; i++)
        u[i] = (int32_t)((digits >> (i * log2_m)) & mask);
    r[0] = 2 * u[0] - u[1];
    r[1] = u[1] - u[2];
    r[2] = u[2] - u[3];
    r[3] = u[3];
    int32_t X[4], q[4];
    for (int j = 0; j < 4; j++)
        X[j] = r[j] * (E8KV_FX_ONE >> log2_m);
    e8kv_d4_nearest_fx(q, X);
    for (int j = 0; j < 4; j++)
        r[j] -= q[j] * (1 << log2_m);
}

double e8kv_sumsq_f32(const float *x, size_t n) {
    double lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += (double)x[i + j] * (double)x[i + j];
    for (; i < n; i++)
        lane[i & 7] += (double)x[i] * (double)x[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}
