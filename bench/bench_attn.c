/* `e8kv bench attn`: CPU decode attention over the KV cache (public e8kv_cache_* API only), each format
 * against f16 and f32 in the same run, at model-like shapes and long contexts.
 *
 * One row per (shape, ctx, format): a one-layer cache of `ctx` tokens is filled with N(0,1) keys and
 * values (a 1024-token pool reused cyclically), then one decode step (1 query token at position ctx-1,
 * all query heads) is timed: the fastest of --reps runs after one warm-up (the JSON adds the median).
 * Before timing, the step is checked against the same cache read through the portable _ref twins (the
 * cache's use_avx2 switched off, kvcache.h): `check` is max |fast − ref| / max |ref| over the outputs. */
#include "bench.h"
#include "cli_util.h"

#include "cache/kvcache.h"
#include "common/rng.h"
#include "e8kv.h"

#include <math.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIST 16
#define POOL_TOK 1024

typedef struct {
    const char *name;
    size_t n_head_kv, n_head, head_dim;
} attn_shape;

static const attn_shape k_shapes[] = {
    {"smollm2-135m", 3, 9, 64},
    {"llama3-8b", 8, 32, 128},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: e8kv bench attn [--ctx N[,N...]] [--kv SPEC]... [--shape NAME|all] [--threads T]\n"
            "                       [--reps N] [--no-baseline] [--json]\n\n"
            "Decode attention (one query token over the whole context, one layer) from the KV cache.\n"
            "  --ctx LIST     context lengths (default 4096,16384,65536)\n"
            "  --kv SPEC      cache spec (codec or full cache grammar, see e8kv.h); repeatable;\n"
            "                 default e8:4. f16 and f32 rows are added unless --no-baseline\n"
            "  --shape NAME   smollm2-135m (3 KV / 9 query heads, head_dim 64), llama3-8b (8 / 32, 128),\n"
            "                 or all (default)\n"
            "  --threads T    attention threads (cache param n_threads, default 1)\n"
            "  --reps N       timed decode steps; the fastest is reported (default 7)\n"
            "  --json         one JSON object per row\n"
            "Columns: kv_bytes = e8kv_cache_bytes() (really allocated), bits/val = e8kv_cache_bits_per_value(),\n"
            "ns/step = one decode step (all heads of one layer), ns/token = ns/step / ctx, GB/s = kv_bytes /\n"
            "step time, rss = VmRSS before and after filling the cache, fill = seconds to append ctx tokens,\n"
            "check = max |fast - ref| / max |ref| against the same step through the portable _ref twins.\n");
}

static long vm_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return kib;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int parse_size(const char *s, size_t *out) {
    char *end = NULL;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || (*end && *end != ',') || v == 0) return 0;
    *out = (size_t)v;
    return 1;
}

/* One row; returns 0 on success. */
static int run_row(const attn_shape *sh, size_t ctx, const char *spec, size_t n_threads, int reps, int json) {
    const size_t row = sh->n_head_kv * sh->head_dim;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 42);
    float *pool_k = malloc(POOL_TOK * row * sizeof(float)), *pool_v = malloc(POOL_TOK * row * sizeof(float));
    float *q = malloc(sh->n_head * sh->head_dim * sizeof(float)), *out = malloc(sh->n_head * sh->head_dim * sizeof(float));
    if (!pool_k || !pool_v || !q || !out) {
        fprintf(stderr, "bench attn: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < POOL_TOK * row; i++) {
        pool_k[i] = (float)e8kv_rng_normal(&rng);
        pool_v[i] = (float)e8kv_rng_normal(&rng);
    }
    for (size_t i = 0; i < sh->n_head * sh->head_dim; i++) q[i] = (float)e8kv_rng_normal(&rng);

    const long rss0 = vm_rss_kib();
    e8kv_cache_params p = {0};
    p.n_layer = 1;
    p.n_head_kv = sh->n_head_kv;
    p.head_dim = sh->head_dim;
    p.n_ctx = ctx;
    p.spec = spec;
    p.seed = 1;
    p.n_threads = n_threads;
    size_t err = 0;
    e8kv_cache *c = e8kv_cache_create(&p, &err);
    int rc = 0;
    if (!c) {
        fprintf(stderr, "bench attn: %s: %s\n", spec, e8kv_error_name(err));
        rc = 1;
        goto done;
    }
    const double t_fill = e8kv_cli_now_s();
    for (size_t done = 0; done < ctx;) {
        size_t n = ctx - done < POOL_TOK ? ctx - done : POOL_TOK;
        const size_t r = e8kv_cache_append(c, 0, pool_k, pool_v, n);
        if (e8kv_is_error(r)) {
            fprintf(stderr, "bench attn: append: %s\n", e8kv_error_name(r));
            rc = 1;
            goto done;
        }
        done += n;
    }
    const double fill_s = e8kv_cli_now_s() - t_fill;
    const long rss1 = vm_rss_kib();
    double t[64];
    if (reps > 64) reps = 64;
    const size_t n_out = sh->n_head * sh->head_dim;
    /* the fast kernels against their portable twins on this very cache */
    float *ref = malloc(n_out * sizeof *ref);
    double check = 0.0;
    if (ref) {
        const int fast = c->use_avx2;
        c->use_avx2 = 0;
        const size_t r1 = e8kv_cache_attend(c, ref, n_out, 0, q, sh->n_head, 1, ctx - 1);
        c->use_avx2 = fast;
        const size_t r2 = e8kv_cache_attend(c, out, n_out, 0, q, sh->n_head, 1, ctx - 1);
        double emax = 0.0, rmax = 0.0;
        for (size_t i = 0; i < n_out && !e8kv_is_error(r1) && !e8kv_is_error(r2); i++) {
            emax = fmax(emax, fabs((double)out[i] - ref[i]));
            rmax = fmax(rmax, fabs((double)ref[i]));
        }
        check = rmax > 0.0 ? emax / rmax : emax;
        free(ref);
    }
    for (int i = -1; i < reps; i++) {
        const double t0 = e8kv_cli_now_s();
        const size_t r = e8kv_cache_attend(c, out, n_out, 0, q, sh->n_head, 1, ctx - 1);
        const double dt = e8kv_cli_now_s() - t0;
        if (e8kv_is_error(r)) {
            fprintf(stderr, "bench attn: attend: %s\n", e8kv_error_name(r));
            rc = 1;
            goto done;
        }
        if (i >= 0) t[i] = dt;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    /* the fastest run: on a shared machine interference only adds time (the JSON keeps the median too) */
    const double step = t[0], step_med = t[reps / 2];
    const size_t bytes = e8kv_cache_bytes(c);
    const double bpv = e8kv_cache_bits_per_value(c);
    if (json)
        printf("{\"bench\":\"attn\",\"shape\":\"%s\",\"n_head_kv\":%zu,\"n_head\":%zu,\"head_dim\":%zu,"
               "\"kv\":\"%s\",\"ctx\":%zu,\"threads\":%zu,\"kv_bytes\":%zu,\"bits_per_value\":%.4f,"
               "\"ns_per_step\":%.0f,\"ns_per_step_median\":%.0f,\"ns_per_token\":%.3f,\"gb_per_s\":%.3f,\"rss_before_kib\":%ld,"
               "\"rss_after_kib\":%ld,\"fill_s\":%.3f,\"check\":%.2e}\n",
               sh->name, sh->n_head_kv, sh->n_head, sh->head_dim, spec, ctx, n_threads, bytes, bpv, step * 1e9,
               step_med * 1e9, step * 1e9 / (double)ctx, (double)bytes / step * 1e-9, rss0, rss1, fill_s, check);
    else
        printf("%-13s %6zu  %-24s %12zu %8.3f %12.0f %9.3f %7.2f %8ld %8ld %7.2f %8.1e\n", sh->name, ctx, spec, bytes,
               bpv, step * 1e9, step * 1e9 / (double)ctx, (double)bytes / step * 1e-9, rss0 / 1024, rss1 / 1024,
               fill_s, check);
    fflush(stdout);
done:
    e8kv_cache_free(c);
    free(pool_k);
    free(pool_v);
    free(q);
    free(out);
    return rc;
}

int e8kv_bench_attn(int argc, char **argv) {
    size_t ctxs[MAX_LIST] = {4096, 16384, 65536}, n_ctx = 3, n_threads = 1;
    const char *specs[MAX_LIST];
    size_t n_spec = 0;
    const char *shape = "all";
    int reps = 7, json = 0, baseline = 1, ctx_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--no-baseline")) {
            baseline = 0;
        } else if (!strcmp(a, "--ctx") && val) {
            if (!ctx_set) n_ctx = 0;
            ctx_set = 1;
            for (const char *s = val; s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL) {
                if (n_ctx >= MAX_LIST || !parse_size(s, &ctxs[n_ctx])) {
                    fprintf(stderr, "e8kv bench attn: bad --ctx '%s'\n", val);
                    return 2;
                }
                n_ctx++;
            }
            i++;
        } else if (!strcmp(a, "--kv") && val) {
            if (n_spec >= MAX_LIST - 2) return 2;
            specs[n_spec++] = val;
            i++;
        } else if (!strcmp(a, "--shape") && val) {
            shape = val;
            i++;
        } else if (!strcmp(a, "--threads") && val) {
            if (!parse_size(val, &n_threads)) return 2;
            i++;
        } else if (!strcmp(a, "--reps") && val) {
            size_t r = 0;
            if (!parse_size(val, &r)) return 2;
            reps = r > 64 ? 64 : (int)r;
            i++;
        } else {
            fprintf(stderr, "e8kv bench attn: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!n_spec) specs[n_spec++] = "e8:4";
    if (baseline) {
        int has16 = 0, has32 = 0;
        for (size_t i = 0; i < n_spec; i++) {
            has16 |= !strcmp(specs[i], "f16");
            has32 |= !strcmp(specs[i], "f32");
        }
        if (!has16) specs[n_spec++] = "f16";
        if (!has32) specs[n_spec++] = "f32";
    }
    int matched = 0, rc = 0;
    if (!json)
        printf("%-13s %6s  %-24s %12s %8s %12s %9s %7s %8s %8s %7s %8s\n", "shape", "ctx", "kv", "kv_bytes", "bits/val",
               "ns/step", "ns/token", "GB/s", "rss0 MiB", "rss1 MiB", "fill s", "check");
    for (size_t si = 0; si < sizeof k_shapes / sizeof k_shapes[0]; si++) {
        if (strcmp(shape, "all") && strcmp(shape, k_shapes[si].name)) continue;
        matched = 1;
        for (size_t ci = 0; ci < n_ctx; ci++)
            for (size_t ki = 0; ki < n_spec; ki++) rc |= run_row(&k_shapes[si], ctxs[ci], specs[ki], n_threads, reps, json);
    }
    if (!matched) {
        fprintf(stderr, "e8kv bench attn: unknown shape '%s'\n", shape);
        return 2;
    }
    return rc;
}
