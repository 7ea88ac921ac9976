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

#include "../common/cpu.h"
#include "../common/fp16.h"

#include <pthread.h>
#include <stdlib.h>

/* β(B): scale / per-coordinate RMS, tuned on Gaussian data (see the test and the report). */
static const double k_beta[5] = {0.0, 0.0, 0.95, 1.18, 1.17};

/* ---------------------------------------------------------------- tables */

#define N_CAND 117361 /* E8 points of norm ≤ 12 */
#define HASH_BITS 17
#define HASH_SIZE (1u << HASH_BITS)

static int8_t g_ball[E8KV_BALL_SIZE][8];
static uint32_t g_hash_key[HASH_SIZE]; /* 0 = empty (a valid key has every nibble ≥ 2) */
static uint16_t g_hash_val[HASH_SIZE];
static int8_t g_res1[256][8];
static int8_t g_res2[65536][8];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

typedef struct {
    uint32_t norm2, h, key;
} cand;

static uint32_t pack_key(const int32_t c2[8]) {
    uint32_t k = 0;
    for (int i = 0; i < 8; i++) k |= (uint32_t)(c2[i] + 8) << (4 * i);
    return k;
}
static uint32_t key_hash(uint32_t key) { return key * 0x9E3779B1u; }

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
        for (int j = 0; j < 8; j++) g_ball[i][j] = (int8_t)((int)((key >> (4 * j)) & 15u) - 8);
        uint32_t slot = key_hash(key) >> (32 - HASH_BITS);
        while (g_hash_key[slot]) slot = (slot + 1) & (HASH_SIZE - 1);
        g_hash_key[slot] = key;
        g_hash_val[slot] = (uint16_t)i;
    }
    int32_t r2[8];
    for (uint32_t d = 0; d < 256; d++) {
        e8kv_e8_coset_rep(r2, d, 1);
        for (int j = 0; j < 8; j++) g_res1[d][j] = (int8_t)r2[j];
    }
    for (uint32_t d = 0; d < 65536; d++) {
        e8kv_e8_coset_rep(r2, d, 2);
        for (int j = 0; j < 8; j++) g_res2[d][j] = (int8_t)r2[j];
    }
}

static void ensure_tables(void) { pthread_once(&g_once, build_tables); }

const int8_t *e8kv_ball_table(void) {
    ensure_tables();
    return &g_ball[0][0];
}

const int8_t *e8kv_ball_residual_table(unsigned log2_m) {
    ensure_tables();
    assert(log2_m == 1 || log2_m == 2);
    return log2_m == 1 ? &g_res1[0][0] : &g_res2[0][0];
}

int32_t e8kv_ball_index(const int32_t c2[8]) {
    int32_t n2 = 0;
    for (int i = 0; i < 8; i++) {
        if (c2[i] < -6 || c2[i] > 6) return -1;
        n2 += c2[i] * c2[i];
    }
    if (n2 > E8KV_BALL_MAX_NORM2) return -1;
    const uint32_t key = pack_key(c2);
    uint32_t slot = key_hash(key) >> (32 - HASH_BITS);
    for (;;) {
        const uint32_t k = g_hash_key[slot];
        if (k == key) return g_hash_val[slot];
        if (k == 0) return -1;
        slot = (slot + 1) & (HASH_SIZE - 1);
    }
}

/* ---------------------------------------------------------------- block encoders */

/* X scaled by a/256 toward the origin (floor), the radial shrink of the overload paths */
static void shrink(int32_t *out, const int32_t *X, int32_t a, int n) {
    for (int i = 0; i < n; i++) out[i] = (int32_t)(((int64_t)X[i] * a) >> 8);
}

static uint32_t ball_overload(int32_t c2[8], const int32_t X[8]) {
    /* 1. radial shrink: the largest a/256 (binary search) whose closest point is a codeword */
    int32_t best[8] = {0}, y2[8], Xs[8];
    int32_t best_idx = 0; /* the origin is codeword 0 */
    int32_t lo = 0, hi = 256;
    while (hi - lo > 1) {
        const int32_t mid = (lo + hi) / 2;
        shrink(Xs, X, mid, 8);
        e8kv_e8_nearest_fx(y2, Xs);
        const int32_t idx = e8kv_ball_index(y2);
        if (idx >= 0) {
            lo = mid;
            memcpy(best, y2, sizeof best);
            best_idx = idx;
        } else {
            hi = mid;
        }
    }
    /* 2. descent: move to the neighbour c + v (v one of the 240 minimal vectors, ball entries 1..240)
     * that is a codeword and reduces the distance most; D(c+v) − D(c) = −2H·(e·v2) + 8H², so the
     * best move maximizes e·v2 and must exceed 4H (H = FX_HALF, e = X − H·c2). */
    for (int iter = 0; iter < 64; iter++) {
        int64_t e[8];
        for (int i = 0; i < 8; i++) e[i] = (int64_t)X[i] - (int64_t)best[i] * E8KV_FX_HALF;
        int64_t best_dot = 4 * (int64_t)E8KV_FX_HALF;
        int32_t move_idx = -1, move[8];
        for (int k = 1; k <= 240; k++) {
            const int8_t *const v = g_ball[k];
            int64_t dot = 0;
            for (int i = 0; i < 8; i++) dot += e[i] * v[i];
            if (dot <= best_dot) continue;
            int32_t c[8];
            for (int i = 0; i < 8; i++) c[i] = best[i] + v[i];
            const int32_t idx = e8kv_ball_index(c);
            if (idx < 0) continue;
            best_dot = dot;
            move_idx = idx;
            memcpy(move, c, sizeof move);
        }
        if (move_idx < 0) break;
        memcpy(best, move, sizeof best);
        best_idx = move_idx;
    }
    memcpy(c2, best, sizeof best);
    return (uint32_t)best_idx;
}

uint32_t e8kv_ball_encode_block_q(int32_t c2[8], const int32_t X[8], const int32_t y2[8]) {
    const int32_t idx = e8kv_ball_index(y2);
    if (idx >= 0) {
        memcpy(c2, y2, 8 * sizeof(int32_t));
        return (uint32_t)idx;
    }
    return ball_overload(c2, X);
}

uint32_t e8kv_ball_encode_block(int32_t c2[8], const int32_t X[8]) {
    int32_t y2[8];
    e8kv_e8_nearest_fx(y2, X);
    return e8kv_ball_encode_block_q(c2, X, y2);
}

uint32_t e8kv_ball_residual_overload(const int32_t X[8], unsigned log2_m) {
    const int8_t *const res = e8kv_ball_residual_table(log2_m);
    const int32_t m = 1 << log2_m;
    int32_t c2[8], Z[8], Zs[8], y2[8];
    const uint32_t idx = e8kv_ball_encode_block(c2, X);
    /* fine-lattice offset from the coarse centre, in fine units: m·(t − c) */
    for (int i = 0; i < 8; i++) Z[i] = m * (X[i] - c2[i] * E8KV_FX_HALF);
    /* clamp: the largest a/256 whose closest fine point lies in the Voronoi cell of m·E8 (a = 0 gives
     * the origin, which always does) */
    uint32_t best = 0;
    for (int32_t lo = 0, hi = 257; hi - lo > 1;) {
        const int32_t mid = (lo + hi) / 2;
        shrink(Zs, Z, mid, 8);
        e8kv_e8_nearest_fx(y2, Zs);
        const uint32_t d = e8kv_e8_digits(y2, log2_m);
        const int8_t *const r = res + 8 * d;
        int inside = 1;
        for (int i = 0; i < 8; i++) inside &= r[i] == y2[i];
        if (inside) {
            lo = mid;
            best = d;
        } else {
            hi = mid;
        }
    }
    return idx | (best << 16);
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

static size_t block_bytes(int bits) { return (size_t)bits; } /* 16 + 8·(B−2) bits per 8 values */

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
        for (int i = 0; i < 8; i++) X[i] = e8kv_fx_round(x[b + i] * k);
        if (log2_m == 0) {
            e8kv_store_le16(p, (uint16_t)e8kv_ball_encode_block(c2, X));
            continue;
        }
        for (int i = 0; i < 8; i++) Xf[i] = m * X[i];
        e8kv_e8_nearest_fx(y2, Xf);
        uint32_t dg = e8kv_e8_digits(y2, log2_m);
        const int8_t *const r = res + 8 * dg;
        for (int i = 0; i < 8; i++) c2[i] = (y2[i] - r[i]) / m; /* exact: y − r ∈ m·E8 */
        const int32_t idx = e8kv_ball_index(c2);
        const uint32_t packed = idx >= 0 ? (uint32_t)idx | (dg << 16) : e8kv_ball_residual_overload(X, log2_m);
        e8kv_store_le16(p, (uint16_t)packed);
        if (log2_m == 1)
            p[2] = (uint8_t)(packed >> 16);
        else
            e8kv_store_le16(p + 2, (uint16_t)(packed >> 16));
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
            for (int i = 0; i < 8; i++) y[b + i] = (float)c[i] * k;
            continue;
        }
        const uint32_t dg = log2_m == 1 ? p[2] : e8kv_load_le16(p + 2);
        const int8_t *const r = res + 8 * (size_t)dg;
        for (int i = 0; i < 8; i++) y[b + i] = (float)(m * c[i] + r[i]) * k;
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
    codec->ops = e8kv_cpu_has_avx2() ? &k_ops_avx2 : &k_ops_ref;
    codec->state = NULL;
    return 0;
}
