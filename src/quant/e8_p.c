/* e8p:2, 16 bits per 8 values from a 256-entry table of absolute-value patterns, signs and a ¼ shift.
 *
 * The 2-bit fixed-rate E8 code a GPU decodes from a 512-byte table. The box code (e8box:2) keeps the
 * cube's shape and at 2 bits loses 0.7 dB to the ball codebook e8:2 (2^16 smallest E8 points), whose
 * 512 KiB table does not fit a GPU's shared memory. The idea of QuIP#'s E8P codebook (Tseng et al., 2024)
 * gives a ball-like set that decodes from a small table: every point of D8 + ½ has no zero coordinate,
 * so it is a sign vector s times an absolute-value pattern a (a_i ∈ {½, 3/2, 5/2, ...}), and s ⊙ a lies
 * in D8 + ½ exactly when the number of negative signs ≡ Σ (a_i − ½) (mod 2): 7 free sign bits, the 8th
 * implied. Shifting by ±¼ in every coordinate (one bit) doubles the set: (D8 + ¾) ∪ (D8 + ¼) = E8 + ¼, a
 * translate of E8, so the granular cells stay E8's. Ours takes as the 256 patterns every orbit (all
 * coordinate permutations) of patterns over {½, 3/2, 5/2} with Σ a² ≤ 10 (227 patterns), plus the orbits
 * of (5/2, 5/2, ½⁶) (28) and (3/2⁸) (1): whole orbits, so the encoder's nearest-point search is exact
 * by sorting (below). Measured on N(0,1) with one global scale: 10.41 dB against 10.43 for the 2^16
 * smallest E8 points (BENCHMARKS.md).
 *
 * Vector layout (doc/format.md §2.5), head_dim d (a multiple of 8), 1 + d/4 bytes:
 *   u8 e            δ = 2^((e − 160)/8) as e8box (§2.4); e = 0: the zero vector
 *   d/8 × u16 (LE)  block codes: bits 0–7 pattern index t, bits 8–14 signs of coordinates 0–6 (1:
 *                   negative), bit 15 the shift (0: −¼, 1: +¼)
 * Pattern t is the t-th smallest 16-bit word W = Σ c_i·4^i, c_i = a_i − ½ ∈ {0, 1, 2}, over the set
 * above; coordinate 7 is negative when (the sign bits set + Σ c_i) is odd. Value i decodes to
 * (δ/4)·(±(4c_i + 2) ± 1), an odd integer in [−11, 11] times the exact δ/4.
 *
 * Encoder, exact nearest point per block (integers after one rounding, as e8box): for each shift, the
 * target Y = X ∓ ¼; within one orbit Σ_i s_i·a_i·Y_i is largest with s_i = sign(Y_i) and the largest a
 * on the largest |Y| (rearrangement); when the sign parity is wrong, the cheapest fix flips the sign of
 * the smallest |Y|, which then carries the smallest a (flipping any other coordinate, or pairing it with
 * a larger a, gives a sorted objective that is dominated term by term). 9 orbits × 2 shifts per block. */
#include "e8_p.h"

#include "e8_box.h"
#include "voronoi.h"

#include <math.h>
#include <pthread.h>

#define STEP_ZERO 160
#define N_ORBIT 9
/* the orbits by their patterns sorted in decreasing order, c_i = a_i − ½ (the tie order of the search) */
static const uint8_t k_orbit[N_ORBIT][8] = {
    {0, 0, 0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0, 0, 0},
    {2, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 0, 0, 0, 0, 0}, {2, 1, 0, 0, 0, 0, 0, 0},
    {1, 1, 1, 1, 0, 0, 0, 0}, {2, 2, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 1},
};
/* candidate steps δ = rms(x) · ratio (nearest on the grid), the least squared error wins. N(0,1), d = 64 /
 * 128: one candidate (0.95) 10.52 / 10.44 dB, two (0.9, 1) 10.58 / 10.47, these four 10.60 / 10.48
 * ({0.7 .. 1.15} 10.57 / 10.45, {0.9 .. 1.2} 10.60 / 10.47) */
static const float k_ratio[] = {0.85f, 0.95f, 1.05f, 1.15f};
#define N_RATIO (sizeof k_ratio / sizeof k_ratio[0])

static uint16_t g_pat[256];    /* pattern t → W */
static uint8_t g_index[65536]; /* W → t (patterns only) */
static float g_quarter[256];   /* δ(e)/4, 0 for e = 0 */
static int8_t g_mag[256][8];   /* pattern t → 4c_i + 2 = 4·a_i */
static uint8_t g_par[256];     /* pattern t → Σ c_i mod 2 */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int in_set(unsigned w) {
    unsigned n[3] = {0, 0, 0};
    for (int i = 0; i < 8; i++) {
        const unsigned c = (w >> (2 * i)) & 3u;
        if (c > 2) return 0;
        n[c]++;
    }
    /* 4·Σ a² = Σ (2c + 1)² = n0 + 9·n1 + 25·n2 */
    const unsigned q = n[0] + 9 * n[1] + 25 * n[2];
    return q <= 40 || (n[2] == 2 && n[0] == 6) || n[1] == 8;
}

static void build(void) {
    unsigned t = 0;
    for (unsigned w = 0; w < 65536; w++)
        if (in_set(w)) {
            assert(t < 256);
            g_pat[t] = (uint16_t)w;
            g_index[w] = (uint8_t)t;
            unsigned par = 0;
            for (int i = 0; i < 8; i++) {
                g_mag[t][i] = (int8_t)(4 * ((w >> (2 * i)) & 3u) + 2);
                par += (w >> (2 * i)) & 3u;
            }
            g_par[t] = (uint8_t)(par & 1u);
            t++;
        }
    assert(t == 256);
    for (unsigned e = 1; e < 256; e++)
        g_quarter[e] = 0.25f * e8kv_box_step(e); /* exact: a power of 2 */
}

const uint16_t *e8kv_e8p_patterns(void) {
    pthread_once(&g_once, build);
    return g_pat;
}

size_t e8kv_e8p_vector_bytes(size_t d) {
    return 1 + d / 4;
}

/* the tables are built (e8kv_e8p_patterns) */
static inline void block_q(int32_t q[8], unsigned code) {
    const unsigned t = code & 255u, sgn = (code >> 8) & 127u;
    const unsigned s = sgn | (((unsigned)__builtin_popcount(sgn) + g_par[t]) & 1u) << 7;
    const int32_t sh = code >> 15 ? 1 : -1;
    for (int i = 0; i < 8; i++) {
        const int32_t m = g_mag[t][i];
        q[i] = ((s >> i) & 1u ? -m : m) + sh;
    }
}

void e8kv_e8p_decode_block(int32_t q[8], unsigned code) {
    (void)e8kv_e8p_patterns();
    block_q(q, code);
}

/* Σ c_i of an orbit: its sign parity */
static unsigned orbit_csum(int o) {
    unsigned s = 0;
    for (int j = 0; j < 8; j++)
        s += k_orbit[o][j];
    return s;
}

int64_t e8kv_e8p_nearest_ref(uint16_t *code, const float *restrict x, float k) {
    int32_t X[8];
    for (int i = 0; i < 8; i++)
        X[i] = e8kv_fx_round(x[i] * k);
    /* in units of 2^-FX of δ a coordinate is ±(2c + 1)·H ± H/2, H = 2^(FX−1); |Y| < 2^25, so the dot
     * products below stay under 2^31 · 5 · 8 and every distance is exact in int64 */
    const int32_t H = E8KV_FX_HALF;
    int64_t best = INT64_MAX;
    int best_sb = 0, best_o = 0;
    int32_t Ys[2][8];
    int order_s[2][8];
    for (int sb = 0; sb < 2; sb++) {
        int32_t *const Y = Ys[sb];
        int *const order = order_s[sb];
        int64_t yy = 0;
        int32_t ay[8];
        unsigned neg = 0;
        for (int i = 0; i < 8; i++) {
            Y[i] = X[i] - (sb ? H / 2 : -H / 2);
            ay[i] = Y[i] < 0 ? -Y[i] : Y[i];
            neg += Y[i] < 0;
            yy += (int64_t)Y[i] * Y[i];
        }
        /* coordinates by |Y| decreasing, equal |Y| by index: the rank of i counts the coordinates before
         * it (branch-free: the comparisons vectorize, a sort's branches mispredict) */
        for (int i = 0; i < 8; i++) {
            int r = 0;
            for (int j = 0; j < 8; j++)
                r += (ay[j] > ay[i]) | ((ay[j] == ay[i]) & (j < i));
            order[r] = i;
        }
        int64_t ys[8]; /* |Y| in the order */
        for (int j = 0; j < 8; j++)
            ys[j] = ay[order[j]];
        for (int o = 0; o < N_ORBIT; o++) {
            /* 2a_j = 2c_j + 1 on the j-th largest |Y|: Σ (Y − s·a)² = Σ Y² + H²·Σ (2a)² − 2H·Σ 2a·|Y| */
            int64_t dot = 0, aa = 0;
            for (int j = 0; j < 8; j++) {
                const int64_t m = 2 * k_orbit[o][j] + 1;
                dot += m * ys[j];
                aa += m * m;
            }
            /* the wrong sign parity: the smallest |Y| (last in order) changes sign */
            if ((orbit_csum(o) ^ neg) & 1u) dot -= 2 * (2 * k_orbit[o][7] + 1) * ys[7];
            const int64_t dist = yy + aa * H * H - 2 * H * dot;
            if (dist < best) {
                best = dist;
                best_sb = sb;
                best_o = o;
            }
        }
    }
    const int32_t *const Y = Ys[best_sb];
    const int *const order = order_s[best_sb];
    unsigned neg = 0;
    for (int i = 0; i < 8; i++)
        neg += Y[i] < 0;
    const int flip = (orbit_csum(best_o) ^ neg) & 1u;
    unsigned w = 0, sgn = 0;
    for (int j = 0; j < 8; j++) {
        const int i = order[j];
        w |= (unsigned)k_orbit[best_o][j] << (2 * i);
        sgn |= (unsigned)((Y[i] < 0) ^ (flip && j == 7)) << i;
    }
    (void)e8kv_e8p_patterns();
    *code = (uint16_t)(g_index[w] | (sgn & 127u) << 8 | (unsigned)best_sb << 15);
    return best;
}

static size_t encode(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x) {
    const size_t d = codec->head_dim, nb = e8kv_e8p_vector_bytes(d);
    double ss = 0.0;
    for (size_t i = 0; i < d; i++)
        ss += (double)x[i] * x[i]; /* inputs are finite (screened by the codec) */
    const double rms = sqrt(ss / (double)d);
    /* every candidate step above the grid: refused before anything is written */
    if (!(8.0 * log2(rms * k_ratio[0]) + STEP_ZERO < 255.5)) return E8KV_ERR(RANGE);
    memset(dst, 0, nb);
    if (rms == 0.0) return 0;
    uint16_t best[E8KV_MAX_HEAD_DIM / 8];
    double best_err = INFINITY;
    unsigned best_e = 0, prev_e = 0;
    for (size_t r = 0; r < N_RATIO; r++) {
        const double want = 8.0 * log2(rms * k_ratio[r]) + STEP_ZERO;
        if (!(want < 255.5)) continue;
        const unsigned e = want < 1.0 ? 1u : (unsigned)lround(want);
        if (e == prev_e) continue;
        prev_e = e;
        const float delta = e8kv_box_step(e), k = (float)E8KV_FX_ONE / delta;
        uint16_t codes[E8KV_MAX_HEAD_DIM / 8];
        int64_t dist = 0;
        for (size_t j = 0; j < d; j += 8)
            dist += e8kv_e8p_nearest_ref(&codes[j / 8], x + j, k);
        const double err = (double)dist * ((double)delta * delta);
        if (err < best_err) {
            best_err = err;
            best_e = e;
            memcpy(best, codes, d / 8 * sizeof *codes);
        }
    }
    dst[0] = (uint8_t)best_e;
    for (size_t j = 0; j < d / 8; j++) {
        dst[1 + 2 * j] = (uint8_t)(best[j] & 255u);
        dst[2 + 2 * j] = (uint8_t)(best[j] >> 8);
    }
    return 0;
}

void e8kv_e8p_decode_ref(float *restrict y, const uint8_t *restrict src, size_t d) {
    (void)e8kv_e8p_patterns();
    const float qs = g_quarter[src[0]];
    for (size_t j = 0; j < d / 8; j++) {
        int32_t q[8];
        block_q(q, (unsigned)src[1 + 2 * j] | (unsigned)src[2 + 2 * j] << 8);
        for (int i = 0; i < 8; i++)
            y[8 * j + (size_t)i] = (float)q[i] * qs;
    }
}

static void decode(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src) {
    e8kv_e8p_decode_ref(y, src, codec->head_dim);
}

static const e8kv_quant_ops k_ops = {encode, decode, NULL};

size_t e8kv_quant_init_e8p(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    if (spec->rate8 != 16) return E8KV_ERR(RATE); /* 16 bits per 8 values */
    if (codec->head_dim % 8) return E8KV_ERR(HEAD_DIM);
    (void)e8kv_e8p_patterns();
    codec->bits = 2;
    codec->vector_bytes = e8kv_e8p_vector_bytes(codec->head_dim);
    codec->ops = &k_ops;
    return 0;
}
