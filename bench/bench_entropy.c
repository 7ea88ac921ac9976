/* `e8kv bench entropy`: the cold tier on real K/V vectors (or Gaussian ones).
 *
 * Rows: (1) the fixed-rate codec (default e8:4) as stored in hot pages, and its lossless recoding
 * through an rANS frame and a zstd frame (sizes, bits/value, decode MB/s of output rows); (2) the
 * entropy-coded E8 frame (ECLQ: rotation, one global step, parity-aware rANS) at the largest step whose
 * MSE is <= the fixed-rate codec's (bisection), with its frame size, saving and decode speed, plus zstd
 * with delta on the same rows; (3) the raw rANS decoder on the E8 case (8 coordinate tables selected by
 * the coset bit, 4 states) and on one table, _ref and fast, MB/s of decoded symbols; (4) with a dump
 * that has the model's layer/head layout, a whole e8kv cache saved with e8kv_cache_save versus its hot
 * pages. Every size counts every byte of the frame (header, tables, page index, checksums). */
#include "bench.h"
#include "cli_util.h"
#include "kvdump.h"

#include "common/common.h"
#include "common/rng.h"
#include "entropy/rans.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f, "usage: e8kv bench entropy [--data gauss|FILE.kvd] [--n-vec N] [--codec SPEC] [--page ROWS]\n"
               "                          [--reps N] [--seed S]\n\n"
               "  --data FILE   K/V dump (doc/format.md section 1); default gauss (65536 x 64, N(0,1))\n"
               "  --codec SPEC  fixed-rate reference codec (default e8:4)\n"
               "  --page ROWS   frame rows per page (default 256)\n"
               "  --reps N      decode timing repetitions, the fastest is reported (default 5)\n"
               "MB/s are of decoded output (rows, or symbols for the raw rANS rows), one thread.\n");
}

static double mse_of(const float *x, const float *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = (double)x[i] - (double)y[i];
        s += e * e;
    }
    return s / (double)n;
}

/* Fastest of reps full decodes of a frame, in MB/s of output. */
static double frame_decode_mbs(const uint8_t *f, size_t n, uint8_t *out, size_t out_size, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = e8kv_cli_now_s();
        const size_t d = e8kv_frame_decode(out, out_size, f, n);
        const double t = e8kv_cli_now_s() - t0;
        if (e8kv_is_error(d) || d != out_size) return -1.0;
        if (t < best) best = t;
    }
    return (double)out_size / best / 1e6;
}

static size_t frame(uint8_t **out, const void *rows, size_t row_bytes, size_t n_rows, e8kv_frame_content c,
                    e8kv_frame_coder k, int delta, size_t page) {
    const e8kv_frame_params p = {.content = c, .coder = k, .rows_per_page = page, .delta = delta};
    const size_t cap = e8kv_compress_bound(row_bytes, n_rows, page, 0);
    *out = malloc(cap);
    if (!*out) return E8KV_ERR(OUT_OF_MEMORY);
    return e8kv_frame_encode(*out, cap, rows, row_bytes, n_rows, &p);
}

static void print_frame_rows(const char *name, const uint8_t *rows, size_t row_bytes, size_t n_rows,
                             e8kv_frame_content c, size_t n_values, size_t page, int reps, double ref_bits) {
    static const struct {
        const char *name;
        e8kv_frame_coder coder;
        int delta;
    } k_coders[] = {
        {"rans", E8KV_FRAME_RANS, 0}, {"zstd", E8KV_FRAME_ZSTD, 0}, {"zstd+delta", E8KV_FRAME_ZSTD, 1}};
    uint8_t *out = malloc(row_bytes * n_rows);
    for (size_t i = 0; i < sizeof k_coders / sizeof k_coders[0]; i++) {
        uint8_t *f = NULL;
        const size_t n = frame(&f, rows, row_bytes, n_rows, c, k_coders[i].coder, k_coders[i].delta, page);
        if (e8kv_is_error(n)) {
            printf("  %-22s %-11s error %s\n", name, k_coders[i].name, e8kv_error_name(n));
        } else {
            const double bits = 8.0 * (double)n / (double)n_values;
            printf("  %-22s %-11s %12zu %9.4f %+8.1f%% %10.0f\n", name, k_coders[i].name, n, bits,
                   100.0 * (bits / ref_bits - 1.0), frame_decode_mbs(f, n, out, row_bytes * n_rows, reps));
        }
        free(f);
    }
    free(out);
}

/* Symbols of E8 points as the E8 frame codes them (doc/format.md §3.4): coset bits, then 8 symbols per
 * point (zigzag v_0..v_6 and h), escapes clamped to 255 (the timing does not depend on their values). */
static void e8_symbols(const int16_t *q, size_t n_pts, uint8_t *coset, uint8_t *sym) {
    for (size_t i = 0; i < n_pts; i++) {
        const int16_t *y = q + 8 * i;
        const int c = y[0] & 1;
        coset[i] = (uint8_t)c;
        long vsum = 0;
        for (int j = 0; j < 8; j++) {
            long v = (y[j] - c) / 2;
            if (j < 7)
                vsum += v;
            else
                v = (v - (long)(((vsum % 2) + 2) % 2)) / 2;
            const unsigned long z = v >= 0 ? 2ul * (unsigned long)v : 2ul * (unsigned long)(-v) - 1;
            sym[8 * i + j] = (uint8_t)(z > 255 ? 255 : z);
        }
    }
}

static void rans_rows(const uint8_t *sym, size_t n, size_t period, const uint8_t *sel, size_t n_sets,
                      int reps, const char *name) {
    const size_t n_tab = period * n_sets;
    e8kv_rans_table *t = calloc(n_tab, sizeof *t);
    e8kv_rans_dtable *d = malloc(n_tab * sizeof *d);
    uint64_t(*counts)[256] = calloc(n_tab, sizeof *counts);
    for (size_t i = 0; i < n; i++)
        counts[(sel ? (size_t)sel[i / period] * period : 0) + i % period][sym[i]]++;
    for (size_t k = 0; k < n_tab; k++) {
        e8kv_rans_table_build(&t[k], counts[k], 256);
        if (t[k].n_sym) e8kv_rans_dtable_init(&d[k], &t[k]);
    }
    const size_t cap = e8kv_rans_bound(n);
    uint8_t *buf = malloc(cap), *out = malloc(n);
    const size_t nb = e8kv_rans_encode(buf, cap, sym, n, t, period, sel);
    if (e8kv_is_error(nb)) {
        printf("  %s: encode error %s\n", name, e8kv_error_name(nb));
    } else {
        double best[2] = {1e30, 1e30};
        for (int r = 0; r < reps; r++)
            for (int fast = 0; fast < 2; fast++) {
                const double t0 = e8kv_cli_now_s();
                const size_t got = fast ? e8kv_rans_decode(out, n, buf, nb, d, period, sel)
                                        : e8kv_rans_decode_ref(out, n, buf, nb, d, period, sel);
                const double dt = e8kv_cli_now_s() - t0;
                if (got != n || memcmp(out, sym, n)) {
                    printf("  %s: decode mismatch\n", name);
                    break;
                }
                if (dt < best[fast]) best[fast] = dt;
            }
        printf("  %-34s %10zu symbols %8.3f bits/sym   ref %6.0f MB/s   fast %6.0f MB/s\n", name, n,
               8.0 * (double)nb / (double)n, (double)n / best[0] / 1e6, (double)n / best[1] / 1e6);
    }
    free(t), free(d), free(counts), free(buf), free(out);
}

/* A whole cache (all layers and heads of the dump, no window) saved versus its hot pages. */
static void cache_row(const e8kv_kvdump *kd, const char *codec) {
    if (!kd->n_layer || !kd->n_head_kv || kd->flags != (E8KV_KVDUMP_FLAG_KEYS | E8KV_KVDUMP_FLAG_VALUES))
        return;
    const size_t H = kd->n_head_kv, d = kd->head_dim, T = kd->n_vec / (2 * kd->n_layer * H);
    if (T * 2 * kd->n_layer * H != kd->n_vec || T == 0) return;
    const e8kv_cache_params p = {
        .n_layer = kd->n_layer, .n_head_kv = H, .head_dim = d, .n_ctx = T, .spec = codec, .seed = 1};
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_create(&p, &err);
    if (!c) return;
    for (size_t l = 0; l < kd->n_layer; l++) {
        const float *k = kd->data + l * 2 * T * H * d, *v = k + T * H * d;
        if (e8kv_is_error(e8kv_cache_append(c, l, k, v, T))) break;
    }
    const size_t cap = e8kv_cache_save_bound(c, 0);
    uint8_t *buf = e8kv_is_error(cap) ? NULL : malloc(cap);
    const size_t n = buf ? e8kv_cache_save(buf, cap, c, NULL, 0) : E8KV_ERR(OUT_OF_MEMORY);
    const size_t hot = e8kv_cache_bytes(c) - e8kv_cache_fixed_bytes(c);
    const size_t codes = kd->n_vec * (size_t)(e8kv_cache_bits_per_value(c) * (double)d / 8.0 + 0.5);
    if (!e8kv_is_error(n))
        printf("\ne8kv_cache_save, %zu layers x %zu KV heads x %zu tokens, --kv %s: saved %zu B vs hot pages "
               "%zu B "
               "(codes %zu B): %.1f%% smaller than the pages, %.1f%% smaller than the codes\n",
               (size_t)kd->n_layer, H, T, codec, n, hot, codes, 100.0 * (1.0 - (double)n / (double)hot),
               100.0 * (1.0 - (double)n / (double)codes));
    free(buf);
    e8kv_cache_free(c);
}

int e8kv_bench_entropy(int argc, char **argv) {
    const char *data = "gauss", *codec_spec = "e8:4";
    size_t n_vec = 0, page = 256;
    int reps = 5;
    uint64_t seed = 1;
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_STR("--data", &data),
        E8KV_OPT_SIZE("--n-vec", &n_vec, 1, SIZE_MAX),
        E8KV_OPT_STR("--codec", &codec_spec),
        E8KV_OPT_SIZE("--page", &page, 1, UINT32_MAX),
        E8KV_OPT_INT("--reps", &reps, 1, 1000),
        E8KV_OPT_U64("--seed", &seed),
    };
    const int pr = e8kv_cli_parse("e8kv bench entropy", usage, argc, argv, opts, sizeof opts / sizeof opts[0],
                                  NULL, 0, NULL);
    if (pr >= 0) return pr;
    e8kv_kvdump kd = {0};
    if (!strcmp(data, "gauss")) {
        kd.head_dim = 64;
        kd.n_vec = n_vec ? n_vec : 65536;
        kd.data = malloc(kd.n_vec * kd.head_dim * sizeof(float));
        e8kv_rng rng;
        e8kv_rng_seed(&rng, seed);
        for (size_t i = 0; i < kd.n_vec * kd.head_dim; i++)
            kd.data[i] = (float)e8kv_rng_normal(&rng);
    } else {
        const size_t r = e8kv_kvdump_read(&kd, data);
        if (e8kv_is_error(r)) {
            fprintf(stderr, "e8kv bench entropy: cannot read %s: %s\n", data, e8kv_error_name(r));
            return 1;
        }
        if (n_vec && n_vec < kd.n_vec) kd.n_vec = n_vec, kd.n_layer = 0;
    }
    const size_t d = kd.head_dim, n = kd.n_vec, nv = n * d;
    size_t err = 0;
    e8kv_codec *codec = e8kv_codec_create(codec_spec, d, seed, &err);
    const size_t vb = codec ? e8kv_codec_vector_bytes(codec) : 0;
    uint8_t *rows = codec ? malloc(n * vb) : NULL;
    float *y = codec ? malloc(nv * sizeof *y) : NULL;
    int16_t *q = codec ? malloc(nv * sizeof *q) : NULL;
    if (!codec) {
        fprintf(stderr, "e8kv bench entropy: codec %s: %s\n", codec_spec, e8kv_error_name(err));
    } else if (!kd.data || !rows || !y || !q) {
        err = E8KV_ERR(OUT_OF_MEMORY);
    } else {
        err = e8kv_codec_encode(codec, rows, n * vb, kd.data, n);
        if (!e8kv_is_error(err)) err = e8kv_codec_decode(codec, y, nv, rows, n * vb, n);
        if (!e8kv_is_error(err)) err = 0;
    }
    if (!codec || err) { /* everything allocated so far is released (LeakSanitizer checks this path) */
        if (codec) fprintf(stderr, "e8kv bench entropy: %s: %s\n", codec_spec, e8kv_error_name(err));
        free(rows), free(y), free(q);
        e8kv_codec_free(codec);
        if (!strcmp(data, "gauss"))
            free(kd.data);
        else
            e8kv_kvdump_free(&kd);
        return 1;
    }
    const double mse_ref = mse_of(kd.data, y, nv), bits_ref = e8kv_codec_bits_per_value(codec);
    printf(
        "data %s: %zu vectors x %zu; reference %s: %.4f bits/value, MSE %.6g (one thread, page %zu rows)\n\n",
        data, n, d, codec_spec, bits_ref, mse_ref, page);
    printf("  %-22s %-11s %12s %9s %9s %10s\n", "rows", "coder", "bytes", "bits/val", "vs ref", "dec MB/s");
    char name[128]; /* a codec spec has at most 63 characters */
    snprintf(name, sizeof name, "%s pages (lossless)", codec_spec);
    print_frame_rows(name, rows, vb, n, E8KV_FRAME_BYTES, nv, page, reps, bits_ref);

    /* ECLQ: largest step with MSE <= the reference's (MSE grows with the step) */
    double lo = 1e-3, hi = 8.0, mse_lo = 0;
    for (int it = 0; it < 40; it++) {
        const double mid = sqrt(lo * hi);
        if (e8kv_is_error(e8kv_frame_e8_quantize(q, nv, kd.data, n, d, (float)mid, seed))) {
            hi = mid;
            continue;
        }
        e8kv_frame_e8_dequantize(y, nv, q, n, d, (float)mid, seed);
        const double m = mse_of(kd.data, y, nv);
        if (m <= mse_ref)
            lo = mid, mse_lo = m;
        else
            hi = mid;
    }
    const float step = (float)lo;
    e8kv_frame_e8_quantize(q, nv, kd.data, n, d, step, seed);
    uint8_t *qrows = malloc(nv * 2);
    for (size_t i = 0; i < nv; i++)
        e8kv_store_le16(qrows + 2 * i, (uint16_t)q[i]);
    snprintf(name, sizeof name, "E8 step %.5f", (double)step);
    printf("\nE8 frame at step %.6g: MSE %.6g (<= %s's %.6g)\n", (double)step, mse_lo, codec_spec, mse_ref);
    print_frame_rows(name, qrows, 2 * d, n, E8KV_FRAME_E8, nv, page, reps, bits_ref);

    /* the same points, one frame per (layer, K|V) segment of the dump: tables adapted to each stream */
    if (kd.n_layer && kd.n_vec % (2 * kd.n_layer) == 0) {
        const size_t seg = kd.n_vec / (2 * kd.n_layer);
        size_t total = 0;
        double t_dec = 0;
        uint8_t *out = malloc(seg * 2 * d);
        for (size_t s0 = 0; s0 < n && out; s0 += seg) {
            uint8_t *f = NULL;
            const size_t fn =
                frame(&f, qrows + s0 * 2 * d, 2 * d, seg, E8KV_FRAME_E8, E8KV_FRAME_RANS, 0, page);
            if (e8kv_is_error(fn)) {
                total = 0;
                free(f);
                break;
            }
            total += fn;
            t_dec += (double)(seg * 2 * d) / 1e6 / frame_decode_mbs(f, fn, out, seg * 2 * d, reps);
            free(f);
        }
        free(out);
        if (total) {
            const double bits = 8.0 * (double)total / (double)nv;
            printf("  %-22s %-11s %12zu %9.4f %+8.1f%% %10.0f   (%zu frames, one per layer and K|V)\n", name,
                   "rans/stream", total, bits, 100.0 * (bits / bits_ref - 1.0),
                   (double)(nv * 2) / 1e6 / t_dec, 2 * (size_t)kd.n_layer);
        }
    }

    printf("\nraw rANS decoder (symbols of the E8 frame above):\n");
    const size_t n_pts = nv / 8;
    uint8_t *coset = malloc(n_pts), *sym = malloc(nv);
    e8_symbols(q, n_pts, coset, sym);
    rans_rows(sym, nv, 8, coset, 2, reps, "E8 coordinates, 8 tables x 2 cosets");
    rans_rows(sym, nv, 1, NULL, 1, reps, "same symbols, one table");
    cache_row(&kd, codec_spec);
    free(coset), free(sym), free(qrows), free(rows), free(y), free(q);
    e8kv_codec_free(codec);
    if (!strcmp(data, "gauss"))
        free(kd.data);
    else
        e8kv_kvdump_free(&kd);
    return 0;
}
