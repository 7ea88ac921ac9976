/* The peers' formats (kivi:B, kvquant:B, e8r:B, kakeya:q=Q): rates with every side byte, round trips
 * against bounds derived here from the definitions (doc/format.md §2.5–2.8), nearest-point checks by
 * exhaustive search, bad input, and the cache's token-group path (pages coded once full, reads equal to
 * the codec's own group decode, attention over them, truncate and reopen, what is refused). */
#include "test_util.h"

#include "cache/kvcache.h"
#include "common/fp16.h"
#include "common/rng.h"
#include "quant/codec.h"
#include "sha256.h"

#include <math.h>

static float *gauss(size_t n, uint64_t seed, float sigma, float mean) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = mean + sigma * (float)e8kv_rng_normal(&rng);
    return x;
}

static e8kv_codec *make(const char *spec, size_t d) {
    size_t err = 0;
    e8kv_codec *c = e8kv_codec_create(spec, d, 7, &err);
    if (!c) fail_msg("%s at head_dim %zu: %s", spec, d, e8kv_error_name(err));
    return c;
}

/* bytes per vector, and so the rate, follow from the layouts with every side byte */
static void test_rates(void **state) {
    (void)state;
    static const struct {
        const char *spec;
        size_t d, bytes;
    } cases[] = {
        /* kivi: d·B/8 codes + 4 bytes per 32 values (fp16 min, fp16 step) */
        {"kivi:1", 64, 16},
        {"kivi:2", 64, 24},
        {"kivi:4", 64, 40},
        {"kivi:2", 128, 48},
        /* kvquant: ⌈(4d + 64·d·B/8 + 4·⌈0.01·64·d⌉) / 64⌉ */
        {"kvquant:2", 64, 23},
        {"kvquant:3", 64, 31},
        {"kvquant:4", 64, 39},
        {"kvquant:3", 128, 62},
        /* e8r: fp16 half step + ⌈d/64⌉ coset bytes + d·B/8 */
        {"e8r:2", 64, 19},
        {"e8r:3", 64, 27},
        {"e8r:4", 128, 68},
        /* kakeya: ⌈(32 + (d/4)·⌈log2((2Q+1)^3 (Q+1))⌉) / 8⌉; 832 bits at d = 128, Q = 38 */
        {"kakeya:q=38", 128, 104},
        {"kakeya", 128, 104},
        {"kakeya:q=10", 128, 72},
        {"kakeya:q=152", 128, 136},
        {"kakeya:q=38", 64, 54},
        {"kakeya:q=1", 64, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        e8kv_codec *c = make(cases[i].spec, cases[i].d);
        if (e8kv_codec_vector_bytes(c) != cases[i].bytes)
            fail_msg("%s d=%zu: %zu bytes, expected %zu", cases[i].spec, cases[i].d,
                     e8kv_codec_vector_bytes(c), cases[i].bytes);
        assert_true(fabs(e8kv_codec_bits_per_value(c) - 8.0 * (double)cases[i].bytes / (double)cases[i].d) <
                    1e-12);
        e8kv_codec_free(c);
    }
    /* kvquant's outlier count: the padding is spent on outliers, at least 1% */
    e8kv_codec *c = make("kvquant:3", 64);
    assert_true(c->group_tokens == 64);
    e8kv_codec_free(c);
}

/* kivi keys: per channel over 32 tokens, every value within half a step (plus fp16 rounding of the
 * fields) of the input, the extremes of each channel reproduced to fp16 accuracy; values per token. */
static void test_kivi_round_trip(void **state) {
    (void)state;
    const size_t d = 64, G = 32;
    for (int B = 1; B <= 4; B++) {
        char spec[16];
        snprintf(spec, sizeof spec, "kivi:%d", B);
        e8kv_codec *c = make(spec, d);
        assert_int_equal(c->group_tokens, G);
        const size_t vb = e8kv_codec_vector_bytes(c);
        /* channels with their own offsets and spreads, as keys have */
        float *x = gauss(G * d, 11 + (uint64_t)B, 1.0f, 0.0f);
        for (size_t t = 0; t < G; t++)
            for (size_t ch = 0; ch < d; ch++)
                x[t * d + ch] = x[t * d + ch] * (0.2f + 0.05f * (float)ch) + (float)ch - 30.0f;
        uint8_t *buf = malloc(G * vb);
        float *y = malloc(G * d * sizeof *y);
        for (int is_key = 1; is_key >= 0; is_key--) {
            assert_ok(c->group->encode(c, buf, x, is_key));
            c->group->decode(c, y, buf, 0, G, is_key);
            const size_t n_cells = is_key ? d : G * d / 32;
            for (size_t cell = 0; cell < n_cells; cell++) {
                float lo = INFINITY, hi = -INFINITY;
                for (size_t j = 0; j < 32; j++) {
                    const size_t i = is_key ? j * d + cell : cell * 32 + j;
                    lo = fminf(lo, x[i]);
                    hi = fmaxf(hi, x[i]);
                }
                const float step = (hi - lo) / (float)((1 << B) - 1);
                /* half a step, the fp16 rounding of min and step over 2^B levels, float slack */
                const float tol = 0.5f * step + fabsf(lo) * 1e-3f + step * (float)(1 << B) * 1e-3f + 1e-5f;
                for (size_t j = 0; j < 32; j++) {
                    const size_t i = is_key ? j * d + cell : cell * 32 + j;
                    if (fabsf(y[i] - x[i]) > tol)
                        fail_msg("%s %s cell %zu: |%g - %g| > %g", spec, is_key ? "K" : "V", cell, y[i], x[i],
                                 tol);
                }
            }
            /* decoding a token range gives the same values as the whole group */
            float part[5 * 64];
            c->group->decode(c, part, buf, 13, 5, is_key);
            assert_memory_equal(part, y + 13 * d, sizeof part);
        }
        /* the public API codes whole groups as keys and refuses a partial group */
        uint8_t *buf2 = malloc(G * vb);
        assert_int_equal(e8kv_codec_encode(c, buf2, G * vb, x, G), G * vb);
        assert_ok(c->group->encode(c, buf, x, 1));
        assert_memory_equal(buf, buf2, G * vb); /* and encoding twice gives the same bytes */
        assert_error(e8kv_codec_encode(c, buf2, G * vb, x, G - 1), SRC_SIZE);
        assert_error(e8kv_codec_decode(c, y, G * d, buf2, (G - 1) * vb, G - 1), SRC_SIZE);
        free(buf2);
        free(buf);
        free(y);
        free(x);
        e8kv_codec_free(c);
    }
}

/* kvquant: the planted outliers come back exact (fp16), every other value within its level cell, and
 * the statistics are not spoiled by them (the inliers' error stays Lloyd–Max-sized). */
static void test_kvquant_outliers(void **state) {
    (void)state;
    const size_t d = 64, G = 64, N = G * d;
    e8kv_codec *c = make("kvquant:3", d);
    const size_t vb = e8kv_codec_vector_bytes(c);
    const size_t n_out = (G * vb - 4 * d - N * 3 / 8) / 4;
    assert_int_equal(n_out, 48);
    assert_true(n_out * 100 >= N); /* at least 1% */
    uint8_t *buf = malloc(G * vb);
    float *y = malloc(N * sizeof *y);
    for (int is_key = 1; is_key >= 0; is_key--) {
        float *x = gauss(N, 5 + (uint64_t)is_key, 1.0f, 2.0f);
        /* 40 planted outliers of ±50 to ±89, fewer than n_out */
        for (size_t j = 0; j < 40; j++)
            x[(j * 977 + 31) % N] = (j & 1 ? -1.0f : 1.0f) * (50.0f + (float)j);
        assert_ok(c->group->encode(c, buf, x, is_key));
        c->group->decode(c, y, buf, 0, G, is_key);
        double se = 0.0, ss = 0.0;
        for (size_t i = 0; i < N; i++) {
            if (fabsf(x[i]) >= 50.0f) {
                assert_float_equal(y[i], e8kv_fp16_to_fp32(e8kv_fp32_to_fp16(x[i])), 0.0f);
                continue;
            }
            se += (double)(y[i] - x[i]) * (y[i] - x[i]);
            ss += (double)(x[i] - 2.0f) * (x[i] - 2.0f);
        }
        /* 3-bit Lloyd–Max on N(0,1): MSE 0.0345; with the tails removed as outliers it is lower */
        const double nmse = se / ss;
        if (!(nmse < 0.0345)) fail_msg("kvquant:3 %s normalized MSE %g", is_key ? "K" : "V", nmse);
        float part[3 * 64];
        c->group->decode(c, part, buf, 61, 3, is_key);
        assert_memory_equal(part, y + 61 * d, sizeof part);
        free(x);
    }
    /* corrupted sparse entries (indices past the group) are ignored, never written out of bounds */
    float *x = gauss(N, 9, 1.0f, 0.0f);
    assert_ok(c->group->encode(c, buf, x, 1));
    memset(buf + G * vb - 4 * n_out, 0xFF, 4 * n_out);
    c->group->decode(c, y, buf, 0, G, 1);
    free(x);
    free(buf);
    free(y);
    e8kv_codec_free(c);
}

/* e8r: every decoded block is a point of D8* (all coordinates of y/h integers or all half-integers) in
 * the box, and no point of the box at the same step is closer: the box is a product of per-coordinate
 * sets within each coset, so the exhaustive search is per coordinate over all 2^B values, both cosets. */
static void test_e8r_nearest(void **state) {
    (void)state;
    const size_t d = 64;
    for (int B = 2; B <= 5; B++) {
        char spec[16];
        snprintf(spec, sizeof spec, "e8r:%d", B);
        e8kv_codec *c = make(spec, d);
        const size_t vb = e8kv_codec_vector_bytes(c);
        float *x = gauss(d * 50, 21 + (uint64_t)B, 1.0f, 0.0f);
        uint8_t *buf = malloc(50 * vb);
        float *y = malloc(50 * d * sizeof *y);
        assert_int_equal(e8kv_codec_encode(c, buf, 50 * vb, x, 50), 50 * vb);
        assert_int_equal(e8kv_codec_decode_rotated(c, y, 50 * d, buf, 50 * vb, 50), 50 * d);
        assert_int_equal(e8kv_codec_rotate(c, x, 50, 0), 50 * d); /* x in the coded domain */
        for (size_t v = 0; v < 50; v++) {
            const float h = e8kv_fp16_to_fp32(e8kv_load_le16(buf + v * vb));
            assert_true(h > 0.0f);
            for (size_t b = 0; b < d / 8; b++) {
                const float *xb = x + v * d + 8 * b, *yb = y + v * d + 8 * b;
                const float p0 = yb[0] / h;
                const int odd = fabsf(fmodf(p0, 2.0f)) == 1.0f;
                double got = 0.0, best[2] = {0.0, 0.0};
                for (int i = 0; i < 8; i++) {
                    const float p = yb[i] / h; /* doubled coordinate 2n − 2^B + k */
                    assert_float_equal(p, rintf(p), 0.0f);
                    assert_int_equal(fabsf(fmodf(p, 2.0f)) == 1.0f, odd);
                    assert_true(p >= -(float)(1 << B) && p <= (float)((1 << B) - 1));
                    got += (double)(xb[i] - yb[i]) * (xb[i] - yb[i]);
                    for (int k = 0; k < 2; k++) {
                        double m = INFINITY;
                        for (int n = 0; n < (1 << B); n++) {
                            const double e = xb[i] - (double)h * (2 * n - (1 << B) + k);
                            m = fmin(m, e * e);
                        }
                        best[k] += m;
                    }
                }
                const double opt = fmin(best[0], best[1]);
                if (got > opt * (1.0 + 1e-5) + 1e-9)
                    fail_msg("%s vector %zu block %zu: %g > optimum %g", spec, v, b, got, opt);
            }
        }
        free(x);
        free(buf);
        free(y);
        e8kv_codec_free(c);
    }
}

/* kakeya: step = max|x|/Q; each 4-block decodes to a D4 point (even sum) inside [−Q, Q]^4 steps within
 * one step of the input per coordinate; the largest coordinate is reproduced exactly; Q's index range
 * round-trips (the digit mapping is a bijection on D4 ∩ cube). */
static void test_kakeya(void **state) {
    (void)state;
    const size_t d = 64;
    static const int qs[] = {1, 2, 3, 10, 38, 152, 8192};
    for (size_t s = 0; s < sizeof qs / sizeof qs[0]; s++) {
        char spec[24];
        snprintf(spec, sizeof spec, "kakeya:q=%d", qs[s]);
        const int Q = qs[s];
        e8kv_codec *c = make(spec, d);
        const size_t vb = e8kv_codec_vector_bytes(c);
        float *x = gauss(d * 40, 31 + (uint64_t)s, 3.0f, 0.0f);
        uint8_t *buf = malloc(40 * vb);
        float *y = malloc(40 * d * sizeof *y);
        assert_int_equal(e8kv_codec_encode(c, buf, 40 * vb, x, 40), 40 * vb);
        assert_int_equal(e8kv_codec_decode_rotated(c, y, 40 * d, buf, 40 * vb, 40), 40 * d);
        assert_int_equal(e8kv_codec_rotate(c, x, 40, 0), 40 * d);
        for (size_t v = 0; v < 40; v++) {
            const float step = e8kv_load_lef32(buf + v * vb);
            float amax = 0.0f;
            for (size_t i = 0; i < d; i++)
                amax = fmaxf(amax, fabsf(x[v * d + i]));
            assert_float_equal(step, amax / (float)Q, 0.0f);
            for (size_t b = 0; b < d / 4; b++) {
                long sum = 0;
                for (int i = 0; i < 4; i++) {
                    const float u = y[v * d + 4 * b + i] / step;
                    const long n = lrintf(u);
                    assert_true(fabsf(u - (float)n) < 1e-3f * (1.0f + fabsf(u)));
                    assert_true(n >= -Q && n <= Q);
                    sum += n;
                    assert_true(fabsf(x[v * d + 4 * b + i] - y[v * d + 4 * b + i]) <= step * 1.0001f);
                }
                assert_int_equal(sum & 1, 0);
            }
        }
        free(x);
        free(buf);
        free(y);
        e8kv_codec_free(c);
    }
}

static void test_bad_input(void **state) {
    (void)state;
    size_t err = 0;
    static const struct {
        const char *spec;
        size_t d;
        int code;
    } bad[] = {
        {"kivi", 64, E8KV_ERROR_RATE},
        {"kivi:5", 64, E8KV_ERROR_RATE},
        {"kivi:2.5", 64, E8KV_ERROR_RATE},
        {"kivi:2:q=3", 64, E8KV_ERROR_SPEC},
        {"kivi:2", 48, E8KV_ERROR_HEAD_DIM},
        {"kvquant:1", 64, E8KV_ERROR_RATE},
        {"kvquant:5", 64, E8KV_ERROR_RATE},
        {"kvquant:3", 32, E8KV_ERROR_HEAD_DIM},
        {"e8r:1", 64, E8KV_ERROR_RATE},
        {"e8r:7", 64, E8KV_ERROR_RATE},
        {"e8r:3", 12, E8KV_ERROR_HEAD_DIM},
        {"e8r:3:q=2", 64, E8KV_ERROR_SPEC},
        {"kakeya:3", 64, E8KV_ERROR_SPEC},
        {"kakeya:q=2.5", 64, E8KV_ERROR_Q_RANGE},
        {"kakeya:q=8193", 64, E8KV_ERROR_Q_RANGE},
        {"kakeya:q=38", 12, E8KV_ERROR_HEAD_DIM},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e8kv_codec *c = e8kv_codec_create(bad[i].spec, bad[i].d, 1, &err);
        if (c || e8kv_get_error_code(err) != (e8kv_error_code)bad[i].code)
            fail_msg("%s d=%zu: %s", bad[i].spec, bad[i].d, c ? "accepted" : e8kv_error_name(err));
    }
    const size_t d = 64;
    static const char *specs[] = {"kivi:2", "kvquant:3", "e8r:3", "kakeya:q=38"};
    for (size_t s = 0; s < 4; s++) {
        e8kv_codec *c = make(specs[s], d);
        const size_t G = c->group_tokens > 1 ? c->group_tokens : 1, vb = e8kv_codec_vector_bytes(c);
        float *x = gauss(G * d, 3, 1.0f, 0.0f);
        uint8_t *buf = malloc(G * vb);
        float *y = malloc(G * d * sizeof *y);
        x[5] = NAN;
        assert_error(e8kv_codec_encode(c, buf, G * vb, x, G), NONFINITE);
        x[5] = 1e7f; /* beyond fp16 (after the rotation too): formats with fp16 fields refuse it by name */
        const size_t r = e8kv_codec_encode(c, buf, G * vb, x, G);
        if (s < 3)
            assert_error(r, RANGE);
        else
            assert_int_equal(r, G * vb); /* kakeya's step is f32 */
        x[5] = 0.5f;
        assert_int_equal(e8kv_codec_encode(c, buf, G * vb, x, G), G * vb);
        /* a scale field set to NaN by someone else decodes to CORRUPTED, never NaN values */
        const size_t at = s == 1 ? 2 : s == 0 ? 2 : 0;
        if (s == 3) {
            e8kv_store_lef32(buf, NAN);
        } else {
            buf[at] = 0xFF;
            buf[at + 1] = 0x7E;
        }
        assert_error(e8kv_codec_decode(c, y, G * d, buf, G * vb, G), CORRUPTED);
        assert_error(e8kv_codec_encode(c, buf, G * vb - 1, x, G), DST_TOO_SMALL);
        free(x);
        free(buf);
        free(y);
        e8kv_codec_free(c);
    }
}

/* ---- the cache's token-group path ---- */

static e8kv_cache *make_cache(const char *spec, size_t n_ctx, size_t *err) {
    e8kv_cache_params p = {0};
    p.n_layer = 1;
    p.n_head_kv = 2;
    p.head_dim = 64;
    p.n_ctx = n_ctx;
    p.spec = spec;
    p.seed = 1;
    return e8kv_cache_create(&p, err);
}

/* The cache's reads of a token-group format equal the codec's decode of the same groups (K in key
 * mode, V in value mode), whatever the pieces the tokens were appended in; tokens of a page not yet
 * full are exact; attention equals softmax attention over what the reads return. */
static void test_cache_groups(void **state) {
    (void)state;
    static const char *specs[] = {"kivi:2", "kvquant:3", "kivi:4,sink=1", "kvquant:2,window=40"};
    const size_t d = 64, H = 2, n = 150, row = H * d;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        size_t err = 0;
        e8kv_cache *c = make_cache(specs[s], 256, &err);
        if (!c) fail_msg("%s: %s", specs[s], e8kv_error_name(err));
        float *k = gauss(n * row, 41 + s, 1.0f, 0.5f), *v = gauss(n * row, 43 + s, 1.0f, -0.5f);
        size_t done = 0;
        static const size_t pieces[] = {7, 50, 71, 22};
        for (size_t i = 0; i < 4; i++) {
            assert_int_equal(e8kv_cache_append(c, 0, k + done * row, v + done * row, pieces[i]),
                             done + pieces[i]);
            done += pieces[i];
        }
        const kv_layer *L = &c->layers[0];
        const e8kv_codec *codec = L->k.codec;
        const size_t G = codec->group_tokens, vb = codec->vector_bytes, P = c->page_tokens;
        const size_t n_sink = c->n_sink, window = c->window;
        /* bits per value are the codec's, with its side bytes */
        assert_true(fabs(e8kv_cache_bits_per_value(c) - 8.0 * (double)vb / (double)d) < 1e-12);
        float got[256 * 64], want[64 * 64], grp[64 * 64];
        uint8_t *buf = malloc(G * vb);
        for (size_t h = 0; h < H; h++)
            for (int is_k = 1; is_k >= 0; is_k--) {
                e8kv_cache_read_tokens(c, L, h, is_k, 0, n, got);
                const float *src = is_k ? k : v;
                for (size_t p0 = 0; p0 < n; p0 += G) {
                    const size_t coded_end = n >= window ? (n - window) / P * P : 0;
                    for (size_t t = 0; t < G && p0 + t < n; t++)
                        for (size_t i = 0; i < d; i++) /* the group as the cache codes it */
                            grp[t * d + i] = src[(p0 + t < n_sink ? n_sink : p0 + t) * row + h * d + i];
                    if (p0 + G <= coded_end) {
                        assert_ok(codec->group->encode(codec, buf, grp, is_k));
                        codec->group->decode(codec, want, buf, 0, G, is_k);
                    } else {
                        memcpy(want, grp, sizeof grp); /* raw page: exact */
                    }
                    for (size_t t = 0; t < G && p0 + t < n; t++) {
                        const size_t pos = p0 + t;
                        const float *w = pos < n_sink ? src + pos * row + h * d : want + t * d;
                        for (size_t i = 0; i < d; i++)
                            if (got[pos * d + i] != w[i])
                                fail_msg("%s head %zu %s pos %zu [%zu]: %g != %g", specs[s], h,
                                         is_k ? "K" : "V", pos, i, got[pos * d + i], w[i]);
                    }
                }
            }
        /* attention of one query at the last position against what the reads return */
        float q[2 * 64], out[2 * 64], kk[256 * 64], vv[256 * 64];
        for (size_t i = 0; i < 2 * d; i++)
            q[i] = 0.1f * (float)((int)(i % 13) - 6);
        assert_int_equal(e8kv_cache_attend(c, out, 2 * d, 0, q, 2, 1, n - 1), 2 * d);
        for (size_t h = 0; h < H; h++) {
            e8kv_cache_read_tokens(c, L, h, 1, 0, n, kk);
            e8kv_cache_read_tokens(c, L, h, 0, 0, n, vv);
            double m = -INFINITY, l = 0.0, acc[64] = {0};
            double sc[256];
            for (size_t j = 0; j < n; j++) {
                double dot = 0.0;
                for (size_t i = 0; i < d; i++)
                    dot += (double)q[h * d + i] * kk[j * d + i];
                sc[j] = dot / 8.0;
                m = fmax(m, sc[j]);
            }
            for (size_t j = 0; j < n; j++) {
                const double p = exp(sc[j] - m);
                l += p;
                for (size_t i = 0; i < d; i++)
                    acc[i] += p * vv[j * d + i];
            }
            for (size_t i = 0; i < d; i++)
                assert_float_equal(out[h * d + i], acc[i] / l, 1e-4);
        }
        free(buf);
        free(k);
        free(v);
        e8kv_cache_free(c);
    }
}

/* Truncate into a coded page, append again: the page is reopened (its kept tokens read as before) and
 * coded again once full; remove and save are refused by name; a page size that splits a group is SPEC. */
static void test_cache_reopen_and_refusals(void **state) {
    (void)state;
    const size_t d = 64, H = 2, row = H * d;
    size_t err = 0;
    e8kv_cache *c = make_cache("kivi:2", 256, &err);
    assert_non_null(c);
    float *k = gauss(128 * row, 51, 1.0f, 0.0f), *v = gauss(128 * row, 52, 1.0f, 0.0f);
    assert_int_equal(e8kv_cache_append(c, 0, k, v, 128), 128);
    const kv_layer *L = &c->layers[0];
    float before[128 * 64], after[128 * 64];
    e8kv_cache_read_tokens(c, L, 1, 1, 0, 128, before);
    const size_t bytes_coded = e8kv_cache_bytes(c);
    assert_int_equal(e8kv_cache_truncate(c, 100), 100);
    float *k2 = gauss(20 * row, 53, 1.0f, 0.0f), *v2 = gauss(20 * row, 54, 1.0f, 0.0f);
    assert_int_equal(e8kv_cache_append(c, 0, k2, v2, 20), 120);
    e8kv_cache_read_tokens(c, L, 1, 1, 0, 120, after);
    assert_memory_equal(after, before, 100 * d * sizeof(float)); /* kept tokens unchanged */
    for (size_t t = 100; t < 120; t++) /* the new ones exact while the page is open */
        assert_memory_equal(after + t * d, k2 + (t - 100) * row + d, d * sizeof(float));
    assert_true(e8kv_cache_bytes(c) > bytes_coded); /* one page raw again */
    assert_int_equal(e8kv_cache_append(c, 0, k2, v2, 8), 128);
    assert_int_equal(e8kv_cache_bytes(c), bytes_coded); /* coded again once full */
    e8kv_cache_read_tokens(c, L, 1, 1, 0, 128, after);
    for (size_t i = 0; i < 128 * d; i++)
        assert_true(isfinite(after[i]));
    assert_memory_equal(after, before, 64 * d * sizeof(float)); /* the first page never moved */
    assert_error(e8kv_cache_remove(c, 10, 5), UNSUPPORTED);
    assert_error(e8kv_cache_save_bound(c, 0) ? e8kv_cache_save(after, sizeof after, c, NULL, 0) : 0,
                 UNSUPPORTED);
    e8kv_cache_free(c);
    free(k);
    free(v);
    free(k2);
    free(v2);
    /* page 48 splits kivi's 32-token groups; 96 does not (kvquant's 64 it does) */
    assert_null(make_cache("kivi:2,page=48", 256, &err));
    assert_int_equal(e8kv_get_error_code(err), E8KV_ERROR_SPEC);
    c = make_cache("kivi:2,page=96", 256, &err);
    assert_non_null(c);
    e8kv_cache_free(c);
    assert_null(make_cache("kvquant:3,page=96", 256, &err));
    /* the per-vector peers go through the ordinary path: e8r and kakeya, with a window */
    c = make_cache("k=e8r:3,v=kakeya:q=10,window=16", 256, &err);
    assert_non_null(c);
    float *k3 = gauss(70 * row, 55, 1.0f, 0.0f);
    assert_int_equal(e8kv_cache_append(c, 0, k3, k3, 70), 70);
    e8kv_cache_free(c);
    free(k3);
}

/* Encoding twice gives the same bytes, and the bytes are pinned (format drift fails here): 256 seeded
 * N(0, 1) vectors, head_dim 64, rotation seed 7; kivi and kvquant in both layouts (K then V). */
static void test_pinned_sha256(void **state) {
    (void)state;
    static const struct {
        const char *spec, *sha;
    } pins[] = {
        {"kivi:2", "00b8e6e3bf4d3849d762c44893a185554f2c4f28bc33ea0131708e0334b70555"},
        {"kvquant:3", "ff1c0d63440a4fbb183e45e2d9b713b7b457cbebb5ec5c77e2844dd8991f5bdd"},
        {"e8r:3", "a81c9fac7463b536dedd336205ed8ebb3179026ca4a1d13a847730cbba2be351"},
        {"kakeya:q=38", "f5656273f615d1ce62298914db73ca6244c8bea1f8ea5c49fec3b5f3ee03eee2"},
    };
    const size_t d = 64, n = 256;
    float *x = gauss(n * d, 2024, 1.0f, 0.0f);
    for (size_t s = 0; s < sizeof pins / sizeof pins[0]; s++) {
        e8kv_codec *c = make(pins[s].spec, d);
        const size_t vb = e8kv_codec_vector_bytes(c), G = c->group_tokens;
        uint8_t *b = malloc(2 * n * vb), *b2 = malloc(2 * n * vb);
        assert_int_equal(e8kv_codec_encode(c, b, n * vb, x, n), n * vb);
        assert_int_equal(e8kv_codec_encode(c, b2, n * vb, x, n), n * vb);
        assert_memory_equal(b, b2, n * vb);
        size_t nb = n * vb;
        if (G > 1) { /* the value layout of the same vectors */
            for (size_t g = 0; g < n; g += G)
                assert_ok(c->group->encode(c, b + (n + g) * vb, x + g * d, 0));
            nb = 2 * n * vb;
        }
        char hex[65];
        sha256_hex(hex, b, nb);
        if (strcmp(hex, pins[s].sha) != 0)
            fail_msg("%s: sha256 %s, pinned %s", pins[s].spec, hex, pins[s].sha);
        free(b);
        free(b2);
        e8kv_codec_free(c);
    }
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rates),
        cmocka_unit_test(test_kivi_round_trip),
        cmocka_unit_test(test_kvquant_outliers),
        cmocka_unit_test(test_e8r_nearest),
        cmocka_unit_test(test_kakeya),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_cache_groups),
        cmocka_unit_test(test_cache_reopen_and_refusals),
        cmocka_unit_test(test_pinned_sha256),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
