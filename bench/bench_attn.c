/* `e8kv bench attn`: CPU decode attention over the KV cache (timed through the public e8kv_cache_* API;
 * kvcache.h only to switch the fused kernels off for the check below and to name the kernel), each format
 * against f16 and f32 in the same run, at model-like shapes and long contexts.
 *
 * One row per (shape, ctx, format): a one-layer cache of `ctx` tokens is filled with N(0,1) keys and
 * values (a 1024-token pool reused cyclically), then one decode step (1 query token at position ctx-1,
 * all query heads) is timed: the fastest of --reps steps, the formats of one (shape, ctx) taking turns
 * rep by rep (run_group); vs_f16 compares each rep with f16's step of the same rep.
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
    float rope_theta; /* the model's RoPE base, given to the cache with --rope */
} attn_shape;

static const attn_shape k_shapes[] = {
    {"smollm2-135m", 3, 9, 64, 100000.0f},
    {"llama3-8b", 8, 32, 128, 500000.0f},
};

/* --rope: the caches get the shape's RoPE parameters, so rope=pre specs (keys coded before RoPE, rotated
 * at attention time) can be timed against rope=post; without it no cache knows RoPE (every key format
 * is read as given, the earlier tables' setting) */
static int g_rope;

#define WHO "e8kv bench attn"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: e8kv bench attn [--ctx N[,N...]] [--kv SPEC]... [--shape NAME|all] [--threads T]\n"
        "                       [--reps N] [--no-baseline] [--rope] [--json]\n\n"
        "Decode attention (one query token over the whole context, one layer) from the KV cache.\n"
        "  --ctx LIST     context lengths (default 4096,16384,65536)\n"
        "  --kv FORMATS   cache specs, as e8kv ppl --kv (repeatable; ';' separates formats, and ','\n"
        "                 in a value without '='); default e8:4. f16 and f32 rows are added unless\n"
        "                 --no-baseline\n"
        "  --shape NAME   smollm2-135m (3 KV / 9 query heads, head_dim 64), llama3-8b (8 / 32, 128),\n"
        "                 or all (default)\n"
        "  --threads T    attention threads, 1 to 64 (cache param n_threads, default 1)\n"
        "  --reps N       timed decode steps per format, 1 to 64, the formats taking turns; the\n"
        "                 fastest is reported (default 7)\n"
        "  --rope         give the caches the shape's RoPE base (neox layout), so that 'rope=pre' specs\n"
        "                 (keys coded before RoPE, rotated back at each read) run; e8kv's key formats\n"
        "                 then default to rope=pre, other formats and 'rope=post' specs are unchanged\n"
        "  --json         one JSON object per row\n"
        "Columns: kv_bytes = e8kv_cache_bytes() (really allocated), bits/val = e8kv_cache_bits_per_value(),\n"
        "ns/step = one decode step (all heads of one layer), ns/token = ns/step / ctx, GB/s = kv_bytes /\n"
        "step time, rss = VmRSS before and after filling the cache, fill = seconds to append ctx tokens,\n"
        "check = max |fast - ref| / max |ref| against the same step through the portable _ref twins,\n"
        "kernel = the tile kernel that ran (ref, avx2, vnni), vs_f16 = median over reps of f16's step\n"
        "time / this format's in the same rep (0 without an f16 row).\n");
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

/* One format's cache of one (shape, ctx), filled and checked, with its timed steps. */
typedef struct {
    const char *spec;
    e8kv_cache *c;
    long rss0, rss1;
    double fill_s, check;
    double t[64]; /* seconds per timed step, in rep order */
} attn_row;

static const char *kernel_name(const e8kv_cache *c) {
    if (!c->use_avx2) return "ref";
    /* the integer-domain tiles are the ones with a VNNI twin */
    return e8kv_codec_traits(c->layers[0].k.codec)->attn_int && c->use_vnni ? "vnni" : "avx2";
}

/* Fills row->c and checks its fast step against the _ref twins; 0 on success. */
static int prepare_row(attn_row *row, const attn_shape *sh, size_t ctx, size_t n_threads, const float *pool_k,
                       const float *pool_v, const float *q, float *out) {
    row->rss0 = vm_rss_kib();
    e8kv_cache_params p = {0};
    p.n_layer = 1;
    p.n_head_kv = sh->n_head_kv;
    p.head_dim = sh->head_dim;
    p.n_ctx = ctx;
    p.spec = row->spec;
    p.seed = 1;
    p.n_threads = n_threads;
    if (g_rope) {
        p.rope_theta = sh->rope_theta;
        p.rope_neox = 1;
    }
    size_t err = 0;
    row->c = e8kv_cache_create(&p, &err);
    if (!row->c) {
        fprintf(stderr, "bench attn: %s: %s\n", row->spec, e8kv_error_name(err));
        return 1;
    }
    const double t_fill = e8kv_cli_now_s();
    for (size_t done = 0; done < ctx;) {
        const size_t n = ctx - done < POOL_TOK ? ctx - done : POOL_TOK;
        const size_t r = e8kv_cache_append(row->c, 0, pool_k, pool_v, n);
        if (e8kv_is_error(r)) {
            fprintf(stderr, "bench attn: append: %s\n", e8kv_error_name(r));
            return 1;
        }
        done += n;
    }
    row->fill_s = e8kv_cli_now_s() - t_fill;
    row->rss1 = vm_rss_kib();
    /* the fast kernels against their portable twins on this very cache */
    const size_t n_out = sh->n_head * sh->head_dim;
    float *ref = malloc(n_out * sizeof *ref);
    if (!ref) return 1;
    const int fast = row->c->use_avx2;
    row->c->use_avx2 = 0;
    const size_t r1 = e8kv_cache_attend(row->c, ref, n_out, 0, q, sh->n_head, 1, ctx - 1);
    row->c->use_avx2 = fast;
    const size_t r2 = e8kv_cache_attend(row->c, out, n_out, 0, q, sh->n_head, 1, ctx - 1);
    double emax = 0.0, rmax = 0.0;
    for (size_t i = 0; i < n_out; i++) {
        emax = fmax(emax, fabs((double)out[i] - ref[i]));
        rmax = fmax(rmax, fabs((double)ref[i]));
    }
    free(ref);
    if (e8kv_is_error(r1) || e8kv_is_error(r2)) {
        fprintf(stderr, "bench attn: attend: %s\n", e8kv_error_name(e8kv_is_error(r1) ? r1 : r2));
        return 1;
    }
    row->check = rmax > 0.0 ? emax / rmax : emax;
    return 0;
}

/* All formats of one (shape, ctx): every cache is built first, then the timed steps go round the caches
 * rep by rep, so a slow phase of a shared machine hits every format alike; each timed step follows an
 * untimed step of the same cache (warm caches, and the previous cache's pool workers gone to sleep).
 * vs_f16 is the median over reps of t_f16 / t_format, the two steps of the same rep. */
static int run_group(const attn_shape *sh, size_t ctx, const char *const *specs, size_t n_spec,
                     size_t n_threads, int reps, int json) {
    const size_t row_w = sh->n_head_kv * sh->head_dim, n_out = sh->n_head * sh->head_dim;
    e8kv_rng rng;
    e8kv_rng_seed(&rng, 42);
    float *pool_k = malloc(POOL_TOK * row_w * sizeof(float)),
          *pool_v = malloc(POOL_TOK * row_w * sizeof(float));
    float *q = malloc(n_out * sizeof(float)), *out = malloc(n_out * sizeof(float));
    attn_row *rows = calloc(n_spec, sizeof *rows);
    int rc = 0;
    if (!pool_k || !pool_v || !q || !out || !rows) {
        fprintf(stderr, "bench attn: out of memory\n");
        rc = 1;
        goto done;
    }
    for (size_t i = 0; i < POOL_TOK * row_w; i++) {
        pool_k[i] = (float)e8kv_rng_normal(&rng);
        pool_v[i] = (float)e8kv_rng_normal(&rng);
    }
    for (size_t i = 0; i < n_out; i++)
        q[i] = (float)e8kv_rng_normal(&rng);
    for (size_t k = 0; k < n_spec && !rc; k++) {
        rows[k].spec = specs[k];
        rc = prepare_row(&rows[k], sh, ctx, n_threads, pool_k, pool_v, q, out);
    }
    if (rc) goto done;
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++)
        for (size_t k = 0; k < n_spec; k++) {
            e8kv_cache_attend(rows[k].c, out, n_out, 0, q, sh->n_head, 1, ctx - 1); /* untimed */
            const double t0 = e8kv_cli_now_s();
            e8kv_cache_attend(rows[k].c, out, n_out, 0, q, sh->n_head, 1, ctx - 1);
            rows[k].t[i] = e8kv_cli_now_s() - t0;
        }
    const attn_row *f16 = NULL;
    for (size_t k = 0; k < n_spec; k++)
        if (!strcmp(rows[k].spec, "f16")) f16 = &rows[k];
    for (size_t k = 0; k < n_spec; k++) {
        const attn_row *r = &rows[k];
        double ts[64], ratio[64];
        for (int i = 0; i < reps; i++) {
            ts[i] = r->t[i];
            ratio[i] = f16 ? f16->t[i] / r->t[i] : 0.0;
        }
        qsort(ts, (size_t)reps, sizeof ts[0], cmp_double);
        qsort(ratio, (size_t)reps, sizeof ratio[0], cmp_double);
        /* the fastest step: on a shared machine interference only adds time (the JSON has the median) */
        const double step = ts[0], step_med = ts[reps / 2], vs_f16 = ratio[reps / 2];
        const size_t bytes = e8kv_cache_bytes(r->c);
        const double bpv = e8kv_cache_bits_per_value(r->c);
        if (json) {
            printf("{\"bench\":\"attn\",\"shape\":\"%s\",\"n_head_kv\":%zu,\"n_head\":%zu,\"head_dim\":%zu,"
                   "\"kv\":",
                   sh->name, sh->n_head_kv, sh->n_head, sh->head_dim);
            e8kv_cli_json_string(stdout, r->spec);
            printf(",\"kernel\":\"%s\",\"ctx\":%zu,\"threads\":%zu,\"kv_bytes\":%zu,"
                   "\"bits_per_value\":%.4f,\"ns_per_step\":%.0f,\"ns_per_step_median\":%.0f,"
                   "\"ns_per_token\":%.3f,\"gb_per_s\":%.3f,\"vs_f16\":%.3f,\"rss_before_kib\":%ld,"
                   "\"rss_after_kib\":%ld,\"fill_s\":%.3f,\"check\":%.2e}\n",
                   kernel_name(r->c), ctx, n_threads, bytes, bpv, step * 1e9, step_med * 1e9,
                   step * 1e9 / (double)ctx, (double)bytes / step * 1e-9, vs_f16, r->rss0, r->rss1, r->fill_s,
                   r->check);
        } else {
            printf("%-13s %6zu  %-24s %-5s %12zu %8.3f %12.0f %9.3f %7.2f %6.2f %8ld %8ld %7.2f %8.1e\n",
                   sh->name, ctx, r->spec, kernel_name(r->c), bytes, bpv, step * 1e9,
                   step * 1e9 / (double)ctx, (double)bytes / step * 1e-9, vs_f16, r->rss0 / 1024,
                   r->rss1 / 1024, r->fill_s, r->check);
        }
    }
    fflush(stdout);
done:
    for (size_t k = 0; rows && k < n_spec; k++)
        e8kv_cache_free(rows[k].c);
    free(rows);
    free(pool_k);
    free(pool_v);
    free(q);
    free(out);
    return rc;
}

int e8kv_bench_attn(int argc, char **argv) {
    size_t ctxs[MAX_LIST] = {4096, 16384, 65536}, n_ctx = 3, n_threads = 1, reps_arg = 7;
    const char *specs[MAX_LIST];
    size_t n_spec = 0;
    const char *shape = "all", *ctx_list = NULL;
    int json = 0, no_baseline = 0;
    e8kv_cli_list kv = {0};
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_FLAG("--json", &json),
        E8KV_OPT_FLAG("--no-baseline", &no_baseline),
        E8KV_OPT_FLAG("--rope", &g_rope),
        E8KV_OPT_STR("--ctx", &ctx_list),
        E8KV_OPT_LIST("--kv", &kv),
        E8KV_OPT_STR("--shape", &shape),
        E8KV_OPT_SIZE("--threads", &n_threads, 1, E8KV_MAX_THREADS),
        E8KV_OPT_SIZE("--reps", &reps_arg, 1, 64),
    };
    const int pr = e8kv_cli_parse(WHO, usage, argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (pr >= 0) return e8kv_cli_list_free(&kv), pr;
    const int reps = (int)reps_arg, baseline = !no_baseline;
    if (ctx_list) {
        n_ctx = 0;
        for (const char *s = ctx_list; s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL) {
            char item[32];
            const size_t len = strcspn(s, ",");
            snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item ? len : sizeof item - 1), s);
            if (n_ctx >= MAX_LIST) {
                e8kv_cli_list_free(&kv);
                return e8kv_cli_usage_error(WHO, "--ctx: at most %d lengths", MAX_LIST);
            }
            if (len >= sizeof item) {
                e8kv_cli_list_free(&kv);
                return e8kv_cli_usage_error(WHO, "--ctx '%s': expected whole numbers separated by ','",
                                            ctx_list);
            }
            if (!e8kv_cli_parse_size(WHO, "--ctx", item, 1, 1u << 26, &ctxs[n_ctx++]))
                return e8kv_cli_list_free(&kv), 2;
        }
    }
    e8kv_cli_specs fs;
    if (!e8kv_cli_split_specs(&fs, WHO, kv.v, kv.n, "e8:4")) return e8kv_cli_list_free(&kv), 2;
    e8kv_cli_list_free(&kv);
    if (fs.n > MAX_LIST - 2) {
        e8kv_cli_specs_free(&fs);
        return e8kv_cli_usage_error(WHO, "--kv: at most %d formats", MAX_LIST - 2);
    }
    for (size_t i = 0; i < fs.n; i++) {
        if (!e8kv_cli_check_spec(WHO, "--kv", fs.v[i])) return e8kv_cli_specs_free(&fs), 2;
        specs[n_spec++] = fs.v[i];
    }
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
        printf("%-13s %6s  %-24s %-5s %12s %8s %12s %9s %7s %6s %8s %8s %7s %8s\n", "shape", "ctx", "kv",
               "kernel", "kv_bytes", "bits/val", "ns/step", "ns/token", "GB/s", "vs_f16", "rss0 MiB",
               "rss1 MiB", "fill s", "check");
    for (size_t si = 0; si < sizeof k_shapes / sizeof k_shapes[0]; si++) {
        if (strcmp(shape, "all") && strcmp(shape, k_shapes[si].name)) continue;
        matched = 1;
        for (size_t ci = 0; ci < n_ctx; ci++)
            rc |= run_group(&k_shapes[si], ctxs[ci], specs, n_spec, n_threads, reps, json);
    }
    e8kv_cli_specs_free(&fs);
    if (!matched)
        return e8kv_cli_usage_error(WHO, "unknown shape '%s' (smollm2-135m, llama3-8b or all)", shape);
    return rc;
}
