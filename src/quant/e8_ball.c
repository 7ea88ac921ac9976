/* e8ball:B (and the default e8:B): fixed-rate E8 codes with a ball-shaped codebook.
 *
 * One head vector (already rotated, so coordinates are ≈ Gaussian) = fp16 scale s = β(B)·||x||/sqrt(d)
 * followed by one index per 8 values:
 *   B = 2  16-bit index into the ball of the 65536 smallest E8 points (voronoi.h for the exact set).
 *   B = 3,4  "ball + Voronoi residual": the fine lattice (1/m)·E8, m = 2^(B−2), nested in E8. The
 *          closest fine point y of m·t (t = x/s) is split into its coset digits u (8·(B−2) bits,
 *          Conway & Sloane 1983) and the coarse point c = (y − r)/m, r the canonical coset
 *          representative; c must be a ball codeword (16 bits). Reconstruction s·(c + r/m). The
 *          codewords fill the union of the Voronoi cells of m·E8 over the ball: a ball-shaped
 *          2^24 / 2^32 codebook per 8 values with table-lookup decode.
 * Overload (the closest point outside the ball) is handled by a radial shrink and a descent over the 240
 * minimal vectors (B = 2) and, for B ≥ 3, by clamping the residual into the Voronoi cell of the chosen
 * coarse point. All decisions are integer arithmetic (voronoi.h), so codes are bit-exact everywhere.
 * Byte layout: doc/format.md §2. */
#include "voronoi.h"

#include "common/cpu.h"
#include "common/fp16.h"

#include <pthread.h>
#include <stdlib.h>

/* β(B): scale / per-coordinate RMS, tuned on Gaussian data (see the test and the report). */
static const double k_beta[5] = {0.0, 0.0, 0.95, 1.15, 1.25};

/* ---------------------------------------------------------------- tables */

#define N_CAND 117361 /* E8 points of norm ≤ 12 */
/* index map: half-vectors (4 doubled coordinates of one parity, norm ≤ 48) */
#define N_HALF_KEYS 28561 /* 13^4: (c_i + 6) in base 13 */
#define N_HALF_MAX 1465   /* 761 even + 704 odd half-vectors */
/* radial shrink target of the overload path, |t|² in lattice units (the ball reaches 12) */
#define BALL_TARGET_NORM 11.0
#define BALL_SHRINK_STEP 8
/* overload of e8ball:3/4 (e8kv_ball_residual_overload): candidate 1's first-guess |t|² and step, and
 * candidate 2's first-guess residual radius (in units of m) and step; tuned for speed at < 0.02 dB */
#define RESIDUAL_TARGET_NORM 12.0
#define CAND1_STEP 8
#define RESIDUAL_CELL_RADIUS 0.7
#define RESIDUAL_STEP 16

static int8_t g_ball[E8KV_BALL_SIZE][8];
/* Index map (point -> ball index) without hashing, small enough to stay in L2: a point is two
 * half-vectors h1 = (c0..c3), h2 = (c4..c7) of the same parity with Σ ≡ 0 (mod 4). Half-vectors are
 * grouped in 4 classes (parity, Σ mod 4 ∈ {0, 2}) and sorted by norm within a class, so the partners
 * h2 of h1 with |h1|² + |h2|² ≤ 48 form a prefix of one class: row h1 of the jagged table g_map holds
 * the ball index of (h1, h2) at position pos(h2), 0 for lattice points outside the ball (the origin, the
 * only codeword with index 0, is recognised by its position g_origin_pos). */
static uint32_t g_half[N_HALF_KEYS]; /* bit 31 valid | class << 21 | pos << 11 | gid */
static uint32_t g_row_off[N_HALF_MAX];
static uint16_t g_row_len[N_HALF_MAX];
static uint8_t g_row_cls[N_HALF_MAX];
static uint16_t g_map[N_CAND]; /* ≤ the number of E8 points of norm ≤ 12 */
static uint32_t g_origin_pos;
static int8_t g_res1[256][8];
static int8_t g_res2[65536][8];
static int32_t g_minvec_t[8][240]; /* the 240 minimal vectors (ball entries 1..240), transposed */
static int32_t g_minvec_p[4][240]; /* the same, coordinate pairs (2j, 2j+1) as two int16 */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

typedef struct {
    uint32_t norm2, h, key;
} cand;

static uint32_t pack_key(const int32_t c2[8]) {
    uint32_t k = 0;
    for (int i = 0; i < 8; i++)
        k |= (uint32_t)(c2[i] + 8) << (4 * i);
    return k;
}
static uint32_t key_hash(uint32_t key) {
    return key * 0x9E3779B1u;
} /* the codebook order (format) */

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->norm2 != y->norm2) return x->norm2 < y->norm2 ? -1 : 1;
    if (x->h != y->h) return x->h < y->h ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
}

/* every E8 point with Σ y2² ≤ 48: all coordinates of one parity, Σ y2 ≡ 0 (mod 4) */
static void enumerate(cand *out, size_t *n, int32_t *c2, int pos, int parity, int32_t norm2, int32_t sum) {
    if (pos == 8) {
        if ((sum & 3) == 0) {
            cand *const c = &out[(*n)++];
            c->norm2 = (uint32_t)norm2;
            c->key = pack_key(c2);
            c->h = key_hash(c->key);
        }
        return;
    }
    for (int32_t v = -6 - parity; v <= 6; v += 2) {
        if (v < -6) continue;
        if (norm2 + v * v > E8KV_BALL_MAX_NORM2) continue;
        c2[pos] = v;
        enumerate(out, n, c2, pos + 1, parity, norm2 + v * v, sum + v);
    }
}

static uint32_t half_key(const int32_t *h) {
    return (uint32_t)((h[0] + 6) + 13 * ((h[1] + 6) + 13 * ((h[2] + 6) + 13 * (h[3] + 6))));
}

typedef struct {
    int32_t norm2;
    uint32_t key;
} half_ent;

static int half_cmp(const void *a, const void *b) {
    const half_ent *x = a, *y = b;
    if (x->norm2 != y->norm2) return x->norm2 < y->norm2 ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
}

static int half_class(int parity, int32_t sum) {
    return 2 * parity + (((sum % 4) + 4) % 4) / 2;
}

static void build_index_map(void) {
    static half_ent cls[4][N_HALF_MAX];
    int n_cls[4] = {0};
    for (uint32_t k = 0; k < N_HALF_KEYS; k++) {
        int32_t h[4], n2 = 0, sum = 0;
        for (int i = 0, r = (int)k; i < 4; i++, r /= 13)
            h[i] = r % 13 - 6;
        const int parity = h[0] & 1;
        int ok = 1;
        for (int i = 0; i < 4; i++) {
            ok &= (h[i] & 1) == parity;
            n2 += h[i] * h[i];
            sum += h[i];
        }
        if (!ok || n2 > E8KV_BALL_MAX_NORM2) continue;
        const int c = half_class(parity, sum);
        cls[c][n_cls[c]++] = (half_ent){n2, k};
    }
    uint32_t gid = 0, off = 0;
    for (int c = 0; c < 4; c++)
        qsort(cls[c], (size_t)n_cls[c], sizeof(half_ent), half_cmp);
    for (int c = 0; c < 4; c++)
        for (int p = 0; p < n_cls[c]; p++) {
            const half_ent *const e = &cls[c][p];
            /* partners: the class with the complementary sum (total ≡ 0 mod 4), norm ≤ 48 − |h1|² */
            const int want = c; /* Σ ≡ 0 (mod 4) pairs sums ≡ 0 with 0 and ≡ 2 with 2, same parity */
            int len = 0;
            while (len < n_cls[want] && cls[want][len].norm2 <= E8KV_BALL_MAX_NORM2 - e->norm2)
                len++;
            g_half[e->key] = 0x80000000u | (uint32_t)c << 21 | (uint32_t)p << 11 | gid;
            g_row_off[gid] = off;
            g_row_len[gid] = (uint16_t)len;
            g_row_cls[gid] = (uint8_t)want;
            off += (uint32_t)len;
            gid++;
        }
    assert(gid <= N_HALF_MAX && off <= N_CAND);
    for (uint32_t i = 0; i < E8KV_BALL_SIZE; i++) {
        int32_t c2[8];
        for (int j = 0; j < 8; j++)
            c2[j] = g_ball[i][j];
        const int64_t pos = e8kv_ball_prepare(c2);
        assert(pos >= 0);
        g_map[pos] = (uint16_t)i;
        if (i == 0) g_origin_pos = (uint32_t)pos;
    }
}

static void build_tables(void) {
    static cand all[N_CAND]; /* scratch of the one-time build (static: the build cannot fail) */
    size_t n = 0;
    int32_t c2[8];
    enumerate(all, &n, c2, 0, 0, 0, 0);
    enumerate(all, &n, c2, 0, 1, 0, 0);
    assert(n == N_CAND);
    qsort(all, n, sizeof *all, cand_cmp);
    assert(all[56880].norm2 == 40 && all[56881].norm2 == 48);
    for (uint32_t i = 0; i < E8KV_BALL_SIZE; i++) {
        const uint32_t key = all[i].key;
        for (int j = 0; j < 8; j++)
            g_ball[i][j] = (int8_t)((int)((key >> (4 * j)) & 15u) - 8);
    }
    build_index_map();
    for (int k = 0; k < 240; k++)
        for (int j = 0; j < 8; j++)
            g_minvec_t[j][k] = g_ball[k + 1][j];
    for (int k = 0; k < 240; k++)
        for (int j = 0; j < 4; j++)
            g_minvec_p[j][k] = (int32_t)((uint32_t)(uint16_t)g_ball[k + 1][2 * j] |
                                         ((uint32_t)(uint16_t)g_ball[k + 1][2 * j + 1] << 16));
    int32_t r2[8];
    for (uint32_t d = 0; d < 256; d++) {
        e8kv_e8_coset_rep(r2, d, 1);
        for (int j = 0; j < 8; j++)
            g_res1[d][j] = (int8_t)r2[j];
    }
    for (uint32_t d = 0; d < 65536; d++) {
        e8kv_e8_coset_rep(r2, d, 2);
        for (int j = 0; j < 8; j++)
            g_res2[d][j] = (int8_t)r2[j];
    }
}

static void ensure_tables(void) {
    pthread_once(&g_once, build_tables);
}

const int8_t *e8kv_ball_table(void) {
    ensure_tables();
    return &g_ball[0][0];
}

const int8_t *e8kv_ball_residual_table(unsigned log2_m) {
    ensure_tables();
    assert(log2_m == 1 || log2_m == 2);
    return log2_m == 1 ? &g_res1[0][0] : &g_res2[0][0];
}

int64_t e8kv_ball_prepare(const int32_t c2[8]) {
    for (int i = 0; i < 8; i++)
        if (c2[i] < -6 || c2[i] > 6) return -1;
    const uint32_t a = g_half[half_key(c2)], b = g_half[half_key(c2 + 4)];
    if (!(a & b & 0x80000000u)) return -1;
    const uint32_t gid = a & 0x7FFu, pos2 = (b >> 11) & 0x3FFu, cls2 = (b >> 21) & 3u;
    if (cls2 != g_row_cls[gid] || pos2 >= g_row_len[gid]) return -1;
    const uint32_t pos = g_row_off[gid] + pos2;
    __builtin_prefetch(&g_map[pos]);
    return pos;
}

int32_t e8kv_ball_lookup(int64_t prep) {
    if (prep < 0) return -1;
    const uint16_t v = g_map[prep];
    return v || prep == (int64_t)g_origin_pos ? v : -1;
}

int32_t e8kv_ball_index(const int32_t c2[8]) {
    return e8kv_ball_lookup(e8kv_ball_prepare(c2));
}

/* ---------------------------------------------------------------- block encoders */

const int32_t *e8kv_ball_minvec_pairs(void) {
    ensure_tables();
    return &g_minvec_p[0][0];
}

/* X scaled by a/256 toward the origin (floor), the radial shrink of the overload paths */
static void shrink(int32_t *out, const int32_t *X, int32_t a, int n) {
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)(((int64_t)X[i] * a) >> 8);
}

/* The first shrink factor a/256 that brings |X·a/256|² to target_norm (in E8KV_FX_ONE² units): a correctly
 * rounded sqrt of exact integers, so deterministic; 256 (no shrink) when X is already inside. */
static int32_t shrink_start(const int32_t X[8], double target_norm) {
    int64_t n2 = 0;
    for (int i = 0; i < 8; i++)
        n2 += (int64_t)X[i] * X[i];
    int32_t a = 256;
    if (n2 > 0) {
        const double g = 256.0 * sqrt(target_norm * (double)E8KV_FX_ONE * (double)E8KV_FX_ONE / (double)n2);
        if (g < 256.0) a = (int32_t)g;
    }
    return a;
}

int32_t e8kv_ball_shrink(const e8kv_ball_kernels *kern, int32_t best[8], const int32_t X[8]) {
    /* First guess: the a/256 that brings |t|² to BALL_TARGET_NORM (a correctly rounded sqrt of exact
     * integers: deterministic); then a − 8, a − 16, ... until the closest point is a codeword; a ≤ 0
     * gives the origin (codeword 0). */
    int32_t a = shrink_start(X, BALL_TARGET_NORM);
    for (; a > 0; a -= BALL_SHRINK_STEP) {
        int32_t Xs[8];
        shrink(Xs, X, a, 8);
        kern->nearest(best, Xs);
        const int32_t idx = e8kv_ball_index(best);
        if (idx >= 0) return idx;
    }
    memset(best, 0, 8 * sizeof(int32_t));
    return 0;
}

/* e = X − H·best scaled down by 2^k until every |e_i| < 2^15 (so the AVX2 twin can use 16-bit
 * multiply-adds); the threshold 4H is scaled alike. Returns k. */
int e8kv_ball_descent_setup(int32_t e[8], int32_t *cn, const int32_t best[8], const int32_t X[8]) {
    int32_t amax = 0, n = 0;
    for (int i = 0; i < 8; i++) {
        e[i] = X[i] - best[i] * E8KV_FX_HALF;
        const int32_t a = e[i] < 0 ? -e[i] : e[i];
        if (a > amax) amax = a;
        n += best[i] * best[i];
    }
    int k = 0;
    while ((amax >> k) >= 32768)
        k++;
    for (int i = 0; i < 8; i++)
        e[i] >>= k; /* arithmetic shift: floor */
    *cn = n;
    return k;
}

int e8kv_ball_descent_step_ref(int32_t best[8], const int32_t X[8]) {
    int32_t e[8], cn;
    const int k = e8kv_ball_descent_setup(e, &cn, best, X);
    int32_t best_dot = (4 * E8KV_FX_HALF) >> k;
    int found = -1;
    for (int j = 0; j < 240; j++) {
        int32_t dot = 0, cv = 0;
        for (int i = 0; i < 8; i++) {
            dot += e[i] * g_minvec_t[i][j];
            cv += best[i] * g_minvec_t[i][j];
        }
        if (dot <= best_dot) continue;
        const int32_t nn = cn + 2 * cv + 8;
        if (nn > E8KV_BALL_MAX_NORM2) continue;
        if (nn == E8KV_BALL_MAX_NORM2) {
            int32_t c[8];
            for (int i = 0; i < 8; i++)
                c[i] = best[i] + g_minvec_t[i][j];
            if (e8kv_ball_index(c) < 0) continue;
        }
        best_dot = dot;
        found = j;
    }
    if (found < 0) return 0;
    for (int i = 0; i < 8; i++)
        best[i] += g_minvec_t[i][found];
    return 1;
}

uint32_t e8kv_ball_encode_block_k(const e8kv_ball_kernels *kern, int32_t c2[8], const int32_t X[8],
                                  const int32_t y2[8]) {
    return e8kv_ball_encode_block_idx(kern, c2, X, y2, e8kv_ball_index(y2));
}

uint32_t e8kv_ball_encode_block_idx(const e8kv_ball_kernels *kern, int32_t c2[8], const int32_t X[8],
                                    const int32_t y2[8], int32_t idx) {
    if (idx >= 0) {
        memcpy(c2, y2, 8 * sizeof(int32_t));
        return (uint32_t)idx;
    }
    idx = e8kv_ball_shrink(kern, c2, X);
    int moved = 0;
    for (int iter = 0; iter < E8KV_BALL_DESCENT_STEPS; iter++) {
        if (!kern->descent_step(c2, X)) break;
        moved = 1;
    }
    if (moved) idx = e8kv_ball_index(c2);
    assert(idx >= 0);
    return (uint32_t)idx;
}

const e8kv_ball_kernels e8kv_ball_kernels_ref = {e8kv_e8_nearest_fx, e8kv_ball_descent_step_ref};

uint32_t e8kv_ball_encode_block(int32_t c2[8], const int32_t X[8]) {
    int32_t y2[8];
    e8kv_e8_nearest_fx(y2, X);
    return e8kv_ball_encode_block_k(&e8kv_ball_kernels_ref, c2, X, y2);
}

/* 1 when the closest fine point to (a/256)·Z lies in the Voronoi cell of m·E8 (its digits in *d) */
static int residual_inside(const e8kv_ball_kernels *kern, uint32_t *d, const int32_t Z[8], int32_t a,
                           unsigned log2_m) {
    int32_t Zs[8], y2[8];
    shrink(Zs, Z, a, 8);
    kern->nearest(y2, Zs);
    *d = e8kv_e8_digits(y2, log2_m);
    const int8_t *const r = e8kv_ball_residual_table(log2_m) + 8 * *d;
    int inside = 1;
    for (int i = 0; i < 8; i++)
        inside &= r[i] == y2[i];
    return inside;
}

/* squared distance (fine fixed-point units) from m·X to the codeword (ball index, digits) */
static int64_t residual_dist(const int32_t X[8], uint32_t packed, unsigned log2_m) {
    const int8_t *const c = g_ball[packed & 0xFFFFu];
    const int8_t *const r = e8kv_ball_residual_table(log2_m) + 8 * (packed >> 16);
    int64_t d = 0;
    for (int i = 0; i < 8; i++) {
        const int64_t e =
            (int64_t)X[i] * (1 << log2_m) - ((int64_t)(c[i] * (1 << log2_m)) + r[i]) * E8KV_FX_HALF;
        d += e * e;
    }
    return d;
}

uint32_t e8kv_ball_residual_overload(const e8kv_ball_kernels *kern, const int32_t X[8], unsigned log2_m) {
    const int8_t *const res = e8kv_ball_residual_table(log2_m);
    const int32_t m = 1 << log2_m;
    int32_t c2[8], Z[8], y2[8], Xs[8];
    /* candidate 1: the whole block shrunk toward the origin: a first guess a/256 bringing |t|² to
     * RESIDUAL_TARGET_NORM, then a − CAND1_STEP, ... until the closest fine point has its coarse part in
     * the ball (a ≤ 0: the origin, packed 0) */
    uint32_t cand1 = 0;
    int32_t a = shrink_start(X, RESIDUAL_TARGET_NORM);
    for (; a > 0; a -= CAND1_STEP) {
        shrink(Xs, X, a, 8);
        for (int i = 0; i < 8; i++)
            Xs[i] *= m;
        kern->nearest(y2, Xs);
        const uint32_t d = e8kv_e8_digits(y2, log2_m);
        const int8_t *const r = res + 8 * d;
        for (int i = 0; i < 8; i++)
            c2[i] = (y2[i] - r[i]) / m;
        const int32_t idx1 = e8kv_ball_index(c2);
        if (idx1 >= 0) {
            cand1 = (uint32_t)idx1 | (d << 16);
            break;
        }
    }
    /* candidate 2: the nearest ball codeword c (overload path of e8ball:2), then the residual m·(t − c)
     * clamped into the Voronoi cell of m·E8 the same way */
    kern->nearest(y2, X);
    const uint32_t idx = e8kv_ball_encode_block_k(kern, c2, X, y2);
    for (int i = 0; i < 8; i++)
        Z[i] = m * (X[i] - c2[i] * E8KV_FX_HALF);
    /* clamp by steps of RESIDUAL_STEP/256 from a first guess a0 (|a0·z| = RESIDUAL_CELL_RADIUS·m lattice
     * units): upward while the closest fine point stays in the Voronoi cell of m·E8, else downward
     * until it is (a = 0 gives the origin, which always is) */
    int64_t z2 = 0;
    for (int i = 0; i < 8; i++)
        z2 += (int64_t)Z[i] * Z[i];
    int32_t a0 = 256;
    if (z2 > 0) {
        const double g = 256.0 * RESIDUAL_CELL_RADIUS * m * E8KV_FX_ONE / sqrt((double)z2);
        if (g < 256.0) a0 = (int32_t)g;
    }
    uint32_t best = 0;
    int found = 0;
    for (int32_t s = a0; s > 0; s -= RESIDUAL_STEP) { /* downward until inside */
        uint32_t d;
        if (residual_inside(kern, &d, Z, s, log2_m)) {
            best = d;
            found = 1;
            a0 = s;
            break;
        }
    }
    if (found) {
        for (int32_t s = a0 + RESIDUAL_STEP; s <= 256; s += RESIDUAL_STEP) { /* upward while inside */
            uint32_t d;
            if (!residual_inside(kern, &d, Z, s, log2_m)) break;
            best = d;
        }
    }
    const uint32_t cand2 = idx | (best << 16);
    /* the closer one; candidate 1 on equal distance */
    return residual_dist(X, cand2, log2_m) < residual_dist(X, cand1, log2_m) ? cand2 : cand1;
}

/* ---------------------------------------------------------------- whole vectors */

size_t e8kv_ball_scale(uint16_t *h, const float *x, size_t d, int bits) {
    assert(bits >= 2 && bits <= 4);
    const double sigma = sqrt(e8kv_sumsq_f32(x, d) / (double)d);
    const float s = (float)(k_beta[bits] * sigma);
    *h = e8kv_fp32_to_fp16(s);
    if ((*h & 0x7C00u) == 0x7C00u) return E8KV_ERR(RANGE);
    return 0;
}

static size_t block_bytes(int bits) {
    return (size_t)bits;
} /* 16 + 8·(B−2) bits per 8 values */

size_t e8kv_e8ball_encode_ref(const e8kv_codec_t *codec, uint8_t *restrict dst, const float *restrict x) {
    const int bits = codec->bits;
    const unsigned log2_m = (unsigned)bits - 2;
    const size_t d = codec->head_dim, bb = block_bytes(bits);
    uint16_t h;
    E8KV_RETURN_IF_ERROR(e8kv_ball_scale(&h, x, d, bits));
    e8kv_store_le16(dst, h);
    uint8_t *p = dst + 2;
    const float s = e8kv_fp16_to_fp32(h);
    if (s == 0.0f) { /* the zero vector (or one below fp16's range): origin codes */
        memset(p, 0, d / 8 * bb);
        return 0;
    }
    const float k = (float)E8KV_FX_ONE / s;
    const int8_t *const res = log2_m ? e8kv_ball_residual_table(log2_m) : NULL;
    const int32_t m = 1 << log2_m;
    for (size_t b = 0; b < d; b += 8, p += bb) {
        int32_t X[8], c2[8], y2[8], Xf[8];
        for (int i = 0; i < 8; i++)
            X[i] = e8kv_fx_round(x[b + i] * k);
        if (log2_m == 0) {
            e8kv_store_le16(p, (uint16_t)e8kv_ball_encode_block(c2, X));
            continue;
        }
        for (int i = 0; i < 8; i++)
            Xf[i] = m * X[i];
        e8kv_e8_nearest_fx(y2, Xf);
        uint32_t dg = e8kv_e8_digits(y2, log2_m);
        const int8_t *const r = res + 8 * dg;
        for (int i = 0; i < 8; i++)
            c2[i] = (y2[i] - r[i]) / m; /* exact: y − r ∈ m·E8 */
        const int32_t idx = e8kv_ball_index(c2);
        const uint32_t packed = idx >= 0 ? (uint32_t)idx | (dg << 16)
                                         : e8kv_ball_residual_overload(&e8kv_ball_kernels_ref, X, log2_m);
        e8kv_ball_store_block(p, packed, log2_m);
    }
    return 0;
}

void e8kv_e8ball_decode_ref(const e8kv_codec_t *codec, float *restrict y, const uint8_t *restrict src) {
    const int bits = codec->bits;
    const unsigned log2_m = (unsigned)bits - 2;
    const size_t d = codec->head_dim, bb = block_bytes(bits);
    const int32_t m = 1 << log2_m;
    const float k = e8kv_fp16_to_fp32(e8kv_load_le16(src)) / (float)(2 * m); /* exact: power of 2 */
    const uint8_t *p = src + 2;
    const int8_t *const ball = e8kv_ball_table();
    const int8_t *const res = log2_m ? e8kv_ball_residual_table(log2_m) : NULL;
    for (size_t b = 0; b < d; b += 8, p += bb) {
        const int8_t *const c = ball + 8 * (size_t)e8kv_load_le16(p);
        if (log2_m == 0) {
            for (int i = 0; i < 8; i++)
                y[b + i] = (float)c[i] * k;
            continue;
        }
        const uint32_t dg = log2_m == 1 ? p[2] : e8kv_load_le16(p + 2);
        const int8_t *const r = res + 8 * (size_t)dg;
        for (int i = 0; i < 8; i++)
            y[b + i] = (float)(m * c[i] + r[i]) * k;
    }
}

/* ---------------------------------------------------------------- codec glue */

static const e8kv_quant_ops k_ops_ref = {e8kv_e8ball_encode_ref, e8kv_e8ball_decode_ref, NULL};
static const e8kv_quant_ops k_ops_avx2 = {e8kv_e8ball_encode_avx2, e8kv_e8ball_decode_avx2, NULL};

size_t e8kv_quant_init_e8ball(e8kv_codec_t *codec, const e8kv_spec *spec) {
    if (spec->q_range > 0.0f) return E8KV_ERR(SPEC);
    if (spec->bits < 2 || spec->bits > 4) return E8KV_ERR(RATE);
    if (codec->head_dim % 8 != 0) return E8KV_ERR(HEAD_DIM);
    ensure_tables();
    codec->bits = spec->bits;
    codec->vector_bytes = 2 + codec->head_dim / 8 * block_bytes(spec->bits);
    /* the layout the cache's fused reader reads (traits.reader, E8KV_READER_E8BALL) */
    assert(codec->vector_bytes == 2 + codec->head_dim / 8 * (size_t)codec->bits);
    codec->ops = e8kv_cpu_has_avx2() ? &k_ops_avx2 : &k_ops_ref;
    codec->state = NULL;
    return 0;
}
