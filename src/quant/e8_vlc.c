/* e8v: E8 points entropy-coded inside a fixed budget per vector (layout and rationale in e8_vlc.h).
 *
 * The prefix codes (entropy/huff.h) are built once from discretized Gaussians: the magnitude M of a
 * doubled coordinate p2 sits at |p2|/2 lattice units, and a code of class c is matched to a coordinate of
 * spread σ = 2^((c − 8)/4) lattice units, with the mass of each magnitude ∝ (number of signs) · exp(−x²/2σ²).
 * Five families, by what the E8 structure leaves free:
 *   A  even coset (D8), coordinates 0..6: p2 = ±2M          (sign bit when M > 0)
 *   B  odd coset (D8 + ½), coordinates 0..6: p2 = ±(2M + 1) (sign bit)
 *   C  even coset, coordinate 7 with p2 ≡ 0 (mod 4): p2 = ±4M        (sign bit when M > 0)
 *   D  even coset, coordinate 7 with p2 ≡ 2 (mod 4): p2 = ±(4M + 2)  (sign bit)
 *   E  odd coset, coordinate 7 with p2 ≡ r (mod 4), r ∈ {1, 3}: |p2| = 2M + 1, the sign fixed by r
 * (E8 = D8 ∪ (D8 + ½): all doubled coordinates of one parity and Σ p2 ≡ 0 (mod 4), so the last
 * coordinate's residue mod 4 follows from the others: Conway & Sloane, SPLAG ch. 4 §8.1). */
#include "e8_vlc.h"

#include "common/cpu.h"
#include "common/rng.h"
#include "entropy/huff.h"
#include "voronoi.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#define N_TYPES 5
#define N_CLASSES 25 /* classes with a code: 0..24 */
#define TYPE_A 0
#define TYPE_B 1
#define TYPE_C 2
#define TYPE_D 3
#define TYPE_E 4
/* header: E8KV_VLC_STEP_BITS bits s, δ = 2^((s − STEP_ZERO)/32); s = 0 is the zero vector */
#define STEP_ZERO 512
_Static_assert(E8KV_VLC_STEP_BITS == 10, "e8kv_vlc_step_index reads 10 bits");
#define STEP_MAX ((1 << E8KV_VLC_STEP_BITS) - 1)

static e8kv_huff g_tab[N_TYPES][N_CLASSES];
/* shell codes for blocks of class ≤ SHELL_CLASS_MAX: symbol n = the E8 shell of norm 2n (n = 0..5, all
 * inside the e8ball codebook, whose order is by norm), symbol 6 = escape (norm ≥ 12) */
#define N_SHELLS 6
#define SHELL_CLASS_MAX 9
static e8kv_huff g_shell[SHELL_CLASS_MAX + 1];
/* E8 shell sizes by norm 0, 2, 4, ... (the theta series of E8: 240·σ3(n) for n ≥ 1) */
static const uint32_t k_shell_size[] = {1,      240,    2160,   6720,   17520,  30240,
                                        60480,  82560,  140400, 181680, 272160, 319680,
                                        490560, 527520, 743040, 846720, 1123440};
static uint32_t g_shell_start[N_SHELLS + 1]; /* first ball index of each shell */
static double g_step[STEP_MAX + 1];          /* δ(s) = 2^((s − STEP_ZERO)/32), built with the codes */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static double type_pos(int type, double m) {
    switch (type) {
    case TYPE_A:
        return m;
    case TYPE_C:
        return 2.0 * m;
    case TYPE_D:
        return 2.0 * m + 1.0;
    default:
        return m + 0.5; /* B, E */
    }
}

static double type_mult(int type, uint32_t m) {
    if (type == TYPE_E) return 1.0;
    if ((type == TYPE_A || type == TYPE_C) && m == 0) return 1.0;
    return 2.0;
}

/* Magnitude counts of each family at class c, from the closest E8 points of N(0, σ²) blocks (σ of the
 * class, seeded, so the tables are fixed): the marginals of E8 points are not quite discretized Gaussians
 * (its Voronoi cells are not cubes). A count of 1 is added to every magnitude the model puts mass on. */
#define TRAIN_BLOCKS 6000
#define TRAIN_SEED 0x6538767463ull /* "e8vtc" */

static void train_counts(int c, double cnt[N_TYPES][E8KV_HUFF_MAX_SYMBOLS], const uint32_t *n_sym) {
    const double sigma = pow(2.0, (c - 8) / 4.0);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, TRAIN_SEED + (uint64_t)c);
    for (int b = 0; b < TRAIN_BLOCKS; b++) {
        int32_t X[8], p2[8];
        for (int i = 0; i < 8; i++)
            X[i] = e8kv_fx_round((float)(sigma * e8kv_rng_normal(&rng) * E8KV_FX_ONE));
        e8kv_e8_nearest_fx(p2, X);
        const int k = p2[0] & 1;
        int32_t S = 0;
        for (int i = 0; i < 7; i++) {
            const int32_t a = p2[i] < 0 ? -p2[i] : p2[i];
            const uint32_t M = (uint32_t)(k ? (a - 1) / 2 : a / 2);
            const int t = k ? TYPE_B : TYPE_A;
            cnt[t][M < n_sym[t] - 1 ? M : n_sym[t] - 1] += 1.0;
            S += p2[i];
        }
        const int r = ((-S) % 4 + 4) % 4;
        const int32_t a = p2[7] < 0 ? -p2[7] : p2[7];
        const int t = k ? TYPE_E : r == 0 ? TYPE_C : TYPE_D;
        const uint32_t M = (uint32_t)(k ? (a - 1) / 2 : r == 0 ? a / 4 : (a - 2) / 4);
        cnt[t][M < n_sym[t] - 1 ? M : n_sym[t] - 1] += 1.0;
    }
}

static void build_tables(void) {
    (void)e8kv_ball_table(); /* the shell codes index the e8ball codebook (built once, e8_ball.c) */
    for (int st = 0; st <= STEP_MAX; st++)
        g_step[st] = pow(2.0, (st - STEP_ZERO) / 32.0);
    for (int n = 0; n < N_SHELLS; n++)
        g_shell_start[n + 1] = g_shell_start[n] + k_shell_size[n];
    for (int c = 0; c <= SHELL_CLASS_MAX; c++) { /* P(shell n) ∝ size · exp(−|p|²/2σ²), |p|² = 2n */
        const double sigma2 = pow(2.0, (c - 8) / 2.0);
        double p[N_SHELLS + 1] = {0};
        for (size_t n = 0; n < sizeof k_shell_size / sizeof k_shell_size[0]; n++)
            p[n < N_SHELLS ? n : N_SHELLS] += k_shell_size[n] * exp(-(double)n / sigma2);
        if (!(p[N_SHELLS] > 1e-300)) p[N_SHELLS] = 1e-300;
        const size_t r = e8kv_huff_build(&g_shell[c], p, N_SHELLS + 1);
        assert(!e8kv_is_error(r));
        (void)r;
    }
    for (int c = 0; c < N_CLASSES; c++) {
        const double sigma = pow(2.0, (c - 8) / 4.0);
        uint32_t n_sym[N_TYPES];
        double cnt[N_TYPES][E8KV_HUFF_MAX_SYMBOLS];
        memset(cnt, 0, sizeof cnt);
        for (int t = 0; t < N_TYPES; t++) { /* the alphabet: magnitudes up to 8σ (+2), then the escape */
            uint32_t n = 0;
            while (n < E8KV_HUFF_MAX_SYMBOLS - 1 && (n < 2 || type_pos(t, n) <= 8.0 * sigma + 2.0))
                n++;
            n_sym[t] = n + 1;
            for (uint32_t m = 0; m <= n; m++)
                cnt[t][m] = 1.0;
        }
        train_counts(c, cnt, n_sym);
        for (int t = 0; t < N_TYPES; t++) {
            const size_t r = e8kv_huff_build(&g_tab[t][c], cnt[t], n_sym[t]);
            assert(!e8kv_is_error(r));
            (void)r;
        }
    }
}

/* ---------------------------------------------------------------- magnitudes */

/* class → (table, raw low bits) */
static const e8kv_huff *table_of(int type, int c, unsigned *raw) {
    unsigned m = 0;
    if (c >= N_CLASSES) {
        m = (unsigned)(c - (N_CLASSES - 1) + 3) / 4;
        c -= 4 * (int)m;
    }
    *raw = m;
    return &g_tab[type][c];
}

/* bits of magnitude M in class c of `type`, written to w unless w is NULL */
static size_t put_mag(e8kv_bitw *w, int type, int c, uint32_t M) {
    unsigned m;
    const e8kv_huff *h = table_of(type, c, &m);
    const uint32_t hi = M >> m, esc = h->n_sym - 1;
    size_t bits = m;
    if (hi < esc) {
        bits += h->len[hi];
        if (w) e8kv_bitw_put(w, h->code[hi], h->len[hi]);
    } else { /* escape, then Exp-Golomb (order 0) of hi − esc */
        const uint32_t v = hi - esc + 1;
        unsigned nb = 0;
        while ((v >> nb) > 1)
            nb++;
        bits += h->len[esc] + 2 * nb + 1;
        if (w) {
            e8kv_bitw_put(w, h->code[esc], h->len[esc]);
            e8kv_bitw_put(w, 0, nb);
            e8kv_bitw_put(w, v, nb + 1);
        }
    }
    if (w && m) e8kv_bitw_put(w, M & ((1u << m) - 1u), m);
    return bits;
}

static uint32_t get_mag(e8kv_bitr *r, int type, int c) {
    unsigned m;
    const e8kv_huff *h = table_of(type, c, &m);
    uint32_t hi = e8kv_huff_decode(h, r);
    if (hi == h->n_sym - 1) {
        unsigned nb = 0;
        while (nb < 24 && e8kv_bitr_get(r, 1) == 0)
            nb++; /* bounded: corrupted input ends as a value */
        const uint32_t v = (1u << nb) | e8kv_bitr_get(r, nb);
        hi += v - 1;
    }
    return m ? (hi << m) | e8kv_bitr_get(r, m) : hi;
}

/* ---------------------------------------------------------------- vectors */

static int class_of(const e8kv_vlc *v, size_t i) {
    return v->cls[i];
}

static int block_coded(const e8kv_vlc *v, size_t j) {
    return v->coded[j];
}

/* Truncated binary code of v in [0, n): ⌊log2 n⌋ or one more bit (nearly uniform). */
static size_t put_trunc(e8kv_bitw *w, uint32_t v, uint32_t n) {
    unsigned k = 0;
    while ((n >> (k + 1)) != 0)
        k++;
    const uint32_t u = (2u << k) - n; /* the first u values take k bits */
    if (v < u) {
        if (w) e8kv_bitw_put(w, v, k);
        return k;
    }
    if (w) e8kv_bitw_put(w, v + u, k + 1);
    return k + 1;
}

static uint32_t get_trunc(e8kv_bitr *r, uint32_t n) {
    unsigned k = 0;
    while ((n >> (k + 1)) != 0)
        k++;
    const uint32_t u = (2u << k) - n;
    const uint32_t v = e8kv_bitr_get(r, k);
    if (v < u) return v;
    const uint32_t v2 = (v << 1 | e8kv_bitr_get(r, 1)) - u;
    return v2 < n ? v2 : n - 1; /* corrupted bytes: some value in range */
}

/* The block's shell-code class (its mean class), or -1 when the block is coded per coordinate: at low
 * rates a coordinate's prefix code costs up to a bit over its entropy, where the E8 point as (shell, index
 * within the shell) is within 0.1 bit of the block's entropy (isotropic: every point of a shell is equally
 * likely). */
static int shell_class(const e8kv_vlc *v, size_t j) {
    int sum = 0;
    for (size_t i = 8 * j; i < 8 * j + 8; i++)
        sum += v->cls[i];
    const int cb = (sum + 4) / 8;
    return cb <= SHELL_CLASS_MAX ? cb : -1;
}

/* Code one block's E8 point p2 (doubled coordinates); returns its bits (w NULL: count only). */
static size_t code_block(const e8kv_vlc *v, size_t j, const int32_t *p2, e8kv_bitw *w) {
    const int k = p2[0] & 1;
    size_t bits = 0;
    const int cs = shell_class(v, j);
    if (cs >= 0) {
        int32_t n2 = 0;
        for (int i = 0; i < 8; i++)
            n2 += p2[i] * p2[i];
        const e8kv_huff *h = &g_shell[cs];
        const int shell = n2 / 8; /* doubled coordinates: Σ p2² = 4|p|² = 8n */
        if (shell < N_SHELLS) {
            const int32_t idx = e8kv_ball_index(p2);
            assert(idx >= (int32_t)g_shell_start[shell] && idx < (int32_t)g_shell_start[shell + 1]);
            if (w) e8kv_bitw_put(w, h->code[shell], h->len[shell]);
            return h->len[shell] + put_trunc(w, (uint32_t)idx - g_shell_start[shell], k_shell_size[shell]);
        }
        bits += h->len[N_SHELLS]; /* escape, then the coordinates */
        if (w) e8kv_bitw_put(w, h->code[N_SHELLS], h->len[N_SHELLS]);
    }
    bits += 1;
    if (w) e8kv_bitw_put(w, (uint32_t)k, 1);
    int32_t S = 0;
    for (size_t i = 0; i < 7; i++) {
        const int32_t a = p2[i] < 0 ? -p2[i] : p2[i];
        const uint32_t M = (uint32_t)(k ? (a - 1) / 2 : a / 2);
        bits += put_mag(w, k ? TYPE_B : TYPE_A, class_of(v, 8 * j + i), M);
        if (k || M) {
            bits++;
            if (w) e8kv_bitw_put(w, p2[i] < 0, 1);
        }
        S += p2[i];
    }
    const int r = ((-S) % 4 + 4) % 4;
    const int32_t a = p2[7] < 0 ? -p2[7] : p2[7];
    const int c7 = class_of(v, 8 * j + 7);
    assert(((p2[7] - r) % 4) == 0);
    if (k) {
        bits += put_mag(w, TYPE_E, c7, (uint32_t)(a - 1) / 2);
    } else {
        const uint32_t M = (uint32_t)(r == 0 ? a / 4 : (a - 2) / 4);
        bits += put_mag(w, r == 0 ? TYPE_C : TYPE_D, c7, M);
        if (r == 2 || M) {
            bits++;
            if (w) e8kv_bitw_put(w, p2[7] < 0, 1);
        }
    }
    return bits;
}

static void decode_block(const e8kv_vlc *v, size_t j, e8kv_bitr *r, int32_t *p2) {
    const int cs = shell_class(v, j);
    if (cs >= 0) {
        const uint32_t shell = e8kv_huff_decode(&g_shell[cs], r);
        if (shell < N_SHELLS) {
            const int8_t *c =
                e8kv_ball_table() + 8 * (g_shell_start[shell] + get_trunc(r, k_shell_size[shell]));
            for (int i = 0; i < 8; i++)
                p2[i] = c[i];
            return;
        }
    }
    const int k = (int)e8kv_bitr_get(r, 1);
    int32_t S = 0;
    for (size_t i = 0; i < 7; i++) {
        const uint32_t M = get_mag(r, k ? TYPE_B : TYPE_A, class_of(v, 8 * j + i));
        const int32_t a = k ? (int32_t)(2 * M + 1) : (int32_t)(2 * M);
        p2[i] = (k || M) && e8kv_bitr_get(r, 1) ? -a : a;
        S += p2[i];
    }
    const int res = ((-S) % 4 + 4) % 4;
    const int c7 = class_of(v, 8 * j + 7);
    if (k) {
        const uint32_t M = get_mag(r, TYPE_E, c7);
        const int32_t a = (int32_t)(2 * M + 1);
        /* residue 1: +1, −3, +5, ...; residue 3: −1, +3, −5, ... */
        p2[7] = ((M & 1u) == 0) == (res == 1) ? a : -a;
    } else {
        const uint32_t M = get_mag(r, res == 0 ? TYPE_C : TYPE_D, c7);
        const int32_t a = res == 0 ? (int32_t)(4 * M) : (int32_t)(4 * M + 2);
        p2[7] = (res == 2 || M) && e8kv_bitr_get(r, 1) ? -a : a;
    }
}

static double step_of(int s) {
    return g_step[s];
}

/* The E8 points of every coded block of y at step δ(s), and their total bits (header included). */
static size_t quantize(const e8kv_vlc *v, const float *y, int s, int32_t *p2) {
    const float k = (float)(E8KV_FX_ONE / step_of(s));
    size_t bits = E8KV_VLC_STEP_BITS;
    for (size_t j = 0; j < v->head_dim / 8; j++) {
        if (!block_coded(v, j)) continue;
        int32_t X[8];
        for (int i = 0; i < 8; i++)
            X[i] = e8kv_fx_round(y[8 * j + i] * k);
        v->nearest(p2 + 8 * j, X);
        bits += code_block(v, j, p2 + 8 * j, NULL);
    }
    return bits;
}

/* Expected bits of a coordinate coded with class c, sign included: the entropy of the code's model. */
static double class_bits(int type, int c) {
    unsigned m;
    const e8kv_huff *h = table_of(type, c, &m);
    const double sigma = pow(2.0, (c - 4.0 * m - 8) / 4.0);
    double z = 0.0, e = 0.0;
    for (uint32_t k = 0; k + 1 < h->n_sym; k++) {
        const double x = type_pos(type, k) / sigma, w = type_mult(type, k) * exp(-0.5 * x * x);
        z += w;
        e += w * (h->len[k] + (type == TYPE_E ? 0.0 : type_mult(type, k) > 1.0 ? 1.0 : 0.0));
    }
    return m + (z > 0.0 ? e / z : h->len[0]);
}

/* Classes for a unit-variance coordinate at class C (c_i = C + round(q_i/4)), and the coded blocks. */
static double set_classes(e8kv_vlc *v, const int16_t *q, int C) {
    double bits = E8KV_VLC_STEP_BITS;
    v->n_coded = 0;
    for (size_t j = 0; j < v->head_dim / 8; j++) {
        v->coded[j] = 0;
        for (size_t i = 8 * j; i < 8 * j + 8; i++) {
            int c = C + ((q[i] + 2) >> 2); /* arithmetic shift: floor */
            c = c < 0 ? 0 : c > E8KV_VLC_CLASS_MAX ? E8KV_VLC_CLASS_MAX : c;
            v->cls[i] = (uint8_t)c;
            if (c >= E8KV_VLC_CLASS_DROP) v->coded[j] = 1;
        }
        if (!v->coded[j]) continue;
        v->n_coded += 8;
        bits += 1.0;                               /* coset */
        for (size_t i = 8 * j; i < 8 * j + 8; i++) /* the coset's two families alike, on average */
            bits += 0.5 * (class_bits(i % 8 == 7 ? TYPE_C : TYPE_A, v->cls[i]) +
                           class_bits(i % 8 == 7 ? TYPE_E : TYPE_B, v->cls[i]));
    }
    return bits;
}

/* Bits of the all-zero point in every coded block, header included (code_block only counts). */
static size_t zero_bits(const e8kv_vlc *v) {
    static const int32_t zero[8] = {0};
    size_t bits = E8KV_VLC_STEP_BITS;
    for (size_t j = 0; j < v->head_dim / 8; j++)
        if (block_coded(v, j)) bits += code_block(v, j, zero, NULL);
    return bits;
}

size_t e8kv_vlc_init(e8kv_vlc *v, size_t head_dim, size_t vector_bytes, const float *var) {
    if (!v || vector_bytes < 3) return E8KV_ERR(BAD_ARGUMENT);
    if (head_dim == 0 || head_dim % 8 || head_dim > E8KV_MAX_HEAD_DIM) return E8KV_ERR(HEAD_DIM);
    memset(v, 0, sizeof *v);
    v->head_dim = head_dim;
    v->vector_bytes = vector_bytes;
    double mean = 0.0;
    for (size_t i = 0; var && i < head_dim; i++) {
        if (!(var[i] >= 0.0f) || !isfinite(var[i])) return E8KV_ERR(BAD_ARGUMENT);
        mean += var[i] / (double)head_dim;
    }
    int16_t q[E8KV_MAX_HEAD_DIM]; /* round(8·log2(σ_i²/σ̄²)) */
    for (size_t i = 0; i < head_dim; i++) {
        /* a coordinate without variance is dropped with every class (q at the floor) */
        double qi = var ? (mean > 0.0 && var[i] > 0.0 ? 8.0 * log2(var[i] / mean) : -1024.0) : 0.0;
        if (qi < -1024.0) qi = -1024.0;
        q[i] = (int16_t)lrint(qi);
    }
    v->cls = malloc(head_dim + head_dim / 8);
    if (!v->cls) return E8KV_ERR(OUT_OF_MEMORY);
    v->coded = v->cls + head_dim;
    pthread_once(&g_once, build_tables);
    v->nearest = e8kv_cpu_has_avx2() ? e8kv_e8_nearest_fx_avx2 : e8kv_e8_nearest_fx; /* bit-identical */
    /* the finest classes whose expected length fits the budget: a vector's step then adapts to its own
     * energy and keeps σ_i/δ near these classes (the budget fixes the ratio, not the scale) */
    const size_t budget = 8 * vector_bytes;
    int C = 0;
    while (C < E8KV_VLC_CLASS_MAX && set_classes(v, q, C + 1) <= (double)budget)
        C++;
    set_classes(v, q, C);
    /* The estimate prices every block with the coordinate code, but blocks of mean class ≤ 9 use the
     * shell code, whose zero point costs a single bit: at the lowest rates (e8v:1 at head_dim 64) the
     * estimate admits no coded block although a code fits. Then the lowest classes that code a block. */
    while (v->n_coded == 0 && C < E8KV_VLC_CLASS_MAX)
        set_classes(v, q, ++C);
    /* The length is not monotone in the step: at a coarse step every point is 0, whose code at a high
     * class (a coordinate spread of several lattice units) is long. The encoder's last resort is that
     * all-zero code at the coarsest step (e8kv_vlc_encode), so it must fit: without this, e8v:2.875
     * (class 11: 202 zero bits in a 200-bit budget at head_dim 64) could never encode a vector. */
    while (zero_bits(v) > budget && C > 0)
        set_classes(v, q, --C);
    if (v->n_coded == 0 || zero_bits(v) > budget) {
        e8kv_vlc_free(v);
        return E8KV_ERR(RATE);
    }
    v->c_unit = C;
    return 0;
}

void e8kv_vlc_free(e8kv_vlc *v) {
    if (!v) return;
    free(v->cls);
    v->cls = v->coded = NULL;
}

size_t e8kv_vlc_encode(const e8kv_vlc *v, uint8_t *restrict dst, const float *restrict y) {
    const size_t d = v->head_dim, budget = 8 * v->vector_bytes;
    memset(dst, 0, v->vector_bytes);
    double amax = 0.0;
    for (size_t i = 0; i < d; i++)
        amax = fmax(amax, fabs((double)y[i]));
    if (amax == 0.0) return 0; /* s = 0: the zero vector */
    /* the finest step whose code fits the budget (the length grows as the step shrinks, i.e. as s
     * falls), keeping |y/δ| inside the fixed-point range (2048 lattice units): s in [lo, hi] */
    int lo = (int)ceil(STEP_ZERO + 32.0 * log2(amax / 2000.0)), hi = STEP_MAX;
    if (lo < 1) lo = 1;
    while (lo < hi && amax / step_of(lo) > 2000.0)
        lo++; /* rounding of the log: at most a step */
    int32_t p2[E8KV_MAX_HEAD_DIM];
    if (amax / step_of(hi) > 2000.0 || quantize(v, y, hi, p2) > budget) return E8KV_ERR(RANGE);
    /* Start where a vector of this RMS lands (σ̄/δ at class c_unit), correct by the slope of the length
     * (each coded coordinate gains a bit per octave: n_coded/32 bits per step of s), then walk to the
     * finest fitting step: ~3 trial encodings instead of a bisection's 10. */
    double s2 = 0.0;
    for (size_t i = 0; i < d; i++)
        s2 += (double)y[i] * y[i];
    double g = STEP_ZERO + 32.0 * (0.5 * log2(s2 / (double)d) - (v->c_unit - 8) / 4.0);
    g = g < lo ? lo : g > hi ? hi : g;
    int st = (int)g;
    const double len_g = (double)quantize(v, y, st, p2);
    st += (int)ceil((len_g - (double)budget) * 32.0 / (double)(v->n_coded ? v->n_coded : 1));
    st = st < lo ? lo : st > hi ? hi : st;
    if (quantize(v, y, st, p2) <= budget) {
        while (st > lo && quantize(v, y, st - 1, p2) <= budget)
            st--;
    } else {
        while (st < hi && quantize(v, y, ++st, p2) > budget) {
        }
    }
    lo = st;
    const size_t bits = quantize(v, y, lo, p2);
    e8kv_bitw w;
    e8kv_bitw_init(&w, dst, v->vector_bytes);
    e8kv_bitw_put(&w, (uint32_t)lo, E8KV_VLC_STEP_BITS);
    for (size_t j = 0; j < d / 8; j++)
        if (block_coded(v, j)) code_block(v, j, p2 + 8 * j, &w);
    assert(w.n_bits == bits);
    (void)bits;
    return 0;
}

void e8kv_vlc_decode(const e8kv_vlc *v, float *restrict y, const uint8_t *restrict src) {
    const size_t d = v->head_dim;
    memset(y, 0, d * sizeof(float));
    e8kv_bitr r;
    e8kv_bitr_init(&r, src, v->vector_bytes);
    const int s = (int)e8kv_bitr_get(&r, E8KV_VLC_STEP_BITS);
    if (s == 0) return;
    const float half_step = (float)(0.5 * step_of(s));
    for (size_t j = 0; j < d / 8; j++) {
        if (!block_coded(v, j)) continue;
        int32_t p2[8];
        decode_block(v, j, &r, p2);
        for (int i = 0; i < 8; i++)
            y[8 * j + i] = (float)p2[i] * half_step;
    }
}

size_t e8kv_vlc_code_bits(const e8kv_vlc *v, const float *y, int s) {
    int32_t p2[E8KV_MAX_HEAD_DIM];
    return quantize(v, y, s, p2);
}

int e8kv_vlc_step_index(const uint8_t *src) {
    return (int)((unsigned)src[0] << 2 | (unsigned)src[1] >> 6);
}

/* ---------------------------------------------------------------- codec glue */

typedef struct {
    e8kv_vlc vlc;
} vlc_state;

static size_t enc(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x) {
    return e8kv_vlc_encode(&((const vlc_state *)codec->state)->vlc, dst, x);
}

static void dec(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src) {
    e8kv_vlc_decode(&((const vlc_state *)codec->state)->vlc, y, src);
}

static void destroy(e8kv_codec_t *codec) {
    if (codec->state) e8kv_vlc_free(&((vlc_state *)codec->state)->vlc);
    free(codec->state);
}

static const e8kv_quant_ops k_ops = {enc, dec, destroy};

static size_t init(e8kv_codec_t *codec, const e8kv_spec *spec, const float *var) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    if (codec->head_dim % 8 != 0) return E8KV_ERR(HEAD_DIM);
    /* B from 1 to 8 bits per value in steps that give whole bytes: B·head_dim/8 bytes of code */
    if (spec->rate8 < 8 || spec->rate8 > 64 || ((size_t)spec->rate8 * codec->head_dim) % 64)
        return E8KV_ERR(RATE);
    vlc_state *s = calloc(1, sizeof *s);
    if (!s) return E8KV_ERR(OUT_OF_MEMORY);
    const size_t r =
        e8kv_vlc_init(&s->vlc, codec->head_dim, 2 + (size_t)spec->rate8 * codec->head_dim / 64, var);
    if (e8kv_is_error(r)) {
        free(s);
        return r;
    }
    codec->bits = spec->bits; /* 0 for a fractional rate */
    codec->vector_bytes = s->vlc.vector_bytes;
    codec->state = s;
    codec->state_bytes = sizeof *s + codec->head_dim * 9 / 8; /* what e8kv_vlc_init allocates */
    codec->ops = &k_ops;
    return 0;
}

size_t e8kv_quant_init_e8v(e8kv_codec_t *codec, const e8kv_spec *spec) {
    return init(codec, spec, NULL);
}

size_t e8kv_quant_init_e8v_var(e8kv_codec_t *codec, const e8kv_spec *spec, const float *var) {
    return init(codec, spec, var);
}
