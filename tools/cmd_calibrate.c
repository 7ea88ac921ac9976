/* e8kv calibrate: measure what the e8t formats need from a model (engine/calibrate.h) on calibration text
 * and write it to a file (doc/format.md §5) that ppl and generate pick up by default. */
#include "calibrate.h"
#include "cli.h"
#include "cli_util.h"
#include "e8kv.h"
#include "ppl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WHO "e8kv calibrate"
#define CHECK_MAX 9 /* allocations --check measures */

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: e8kv calibrate [-m MODEL] -f TEXT [options]\n\n"
        "Per layer, KV head and stream (K before RoPE, V): the covariance of the centred vectors over the\n"
        "text, its eigenbasis and eigenvalues (the e8t formats code in that basis). Calibrate on text\n"
        "other than what you evaluate on. The table printed is the transform-coding gain per head:\n"
        "10 log10(arithmetic / geometric mean of the eigenvalues), and what e8t gets of it with one\n"
        "scale per vector: 10 log10(mean(l) / mean(sqrt(l))^2).\n\n"
        "  -m MODEL          GGUF or llama2.c checkpoint (default: $E8KV_MODEL or the fetched SmolLM2)\n"
        "  -f TEXT           UTF-8 calibration text\n"
        "  -o FILE           output (default: MODEL.e8cal, where ppl and generate look for it)\n"
        "  --ctx N           tokens per chunk, each chunk one sequence, >= 16 (default 512)\n"
        "  --chunks N        chunks observed (default 16; 0 = all)\n"
        "  --threads N       threads, 1 to 64 (default 0: number of CPUs)\n\n"
        "Sensitivities (for the cache spec item auto=FAMILY:B, which spreads B bits per value over the\n"
        "streams by them): each layer's K and V alone coded with the probe format, everything else\n"
        "exact, on the first chunk(s) of the text; c = KLD x 4^rate is stored per stream.\n"
        "  --no-sensitivity  skip them (auto= then refuses this calibration)\n"
        "  --probe SPEC      probe format, FAMILY:RATE (default e8tv:2)\n"
        "  --probe-chunks N  chunks per probe (default 1)\n"
        "  --probe-sink S    exact first positions in the probes (default 1, as the presets)\n\n"
        "Diagnostics (printed after the table; --json: one JSON object instead): each layer's K and V share\n"
        "of its sensitivity, and the AM/GM ratio of the layers' sensitivities (K + V), which predicts\n"
        "when a uniform bit allocation is far from the best one (1: every layer alike).\n"
        "  --from FILE       read this calibration instead of measuring one (-f then only for --check)\n"
        "  --json            the report as one JSON object on stdout\n"
        "  --check           how well the sensitivities rank allocations: the predicted KLD\n"
        "                    sum_s c_s 4^-r_s of 9 allocations of --check-rate bits per value on average\n"
        "                    (uniform, auto=, half of auto=, its mirror, K or V +0.5 bit, 3 random pairs\n"
        "                    of +-d) against their KLD measured by ppl on the first chunks of -f TEXT (use\n"
        "                    a text other than the calibration's); prints Spearman's rho\n"
        "  --check-rate B    mean e8tv rate of the allocations (default 3)\n"
        "  --check-chunks N  chunks of --ctx tokens measured per allocation (default 2)\n"
        "The file written with -o (or MODEL.e8cal) gets a FILE.info beside it: the text, its size and the\n"
        "options it was made with, which ppl and generate print with the calibration they use.\n");
}

static void probe_progress(void *user, size_t done, size_t total) {
    (void)user;
    fprintf(stderr, "e8kv calibrate: sensitivity probes %zu/%zu\n", done, total);
}

/* 10·log10(AM / GM) of the eigenvalues (full transform-coding gain over a rotation) and 10·log10(mean λ /
 * mean(√λ)²) (what e8t's weighting gets with one scale per vector, xform.c); λ floored at 1e-12 of the
 * largest */
static void gains_db(const float *eig, size_t d, double *full, double *e8t) {
    double am = 0.0, lg = 0.0, rt = 0.0;
    const double fl = 1e-12 * (eig[0] > 0.0f ? eig[0] : 1.0);
    for (size_t i = 0; i < d; i++) {
        const double v = eig[i] > fl ? eig[i] : fl;
        am += v;
        lg += log(v);
        rt += sqrt(v);
    }
    am /= (double)d;
    rt /= (double)d;
    *full = 10.0 * log10(am / exp(lg / (double)d));
    *e8t = 10.0 * log10(am / (rt * rt));
}

/* The probe format, checked before the covariance pass (minutes on a real model) rather than after it: a
 * cache coding layer 0's K and V with it, over a stand-in calibration of the model's shape (random
 * vectors), must be creatable. E8KV_ERROR_NO_ERROR or why not. */
static e8kv_error_code check_probe(const e8kv_model *m, const char *probe, size_t sink) {
    const e8kv_model_config *cfg = &m->cfg;
    const char *colon = strchr(probe, ':');
    if (!colon || colon == probe || strchr(probe, ',') || strchr(probe, '=') || strlen(probe) > 64)
        return E8KV_ERROR_SPEC;
    size_t err = 0;
    e8kv_calib *cal = e8kv_calib_create(cfg->n_layer, cfg->n_head_kv, cfg->head_dim, &err);
    if (!cal) return e8kv_get_error_code(err);
    const size_t n_tok = 2 * cfg->head_dim + 16, kv_dim = cfg->n_head_kv * cfg->head_dim;
    float *k = malloc(n_tok * kv_dim * sizeof *k), *v = malloc(n_tok * kv_dim * sizeof *v);
    float *q = malloc(n_tok * cfg->n_head * cfg->head_dim * sizeof *q);
    e8kv_error_code code = k && v && q ? E8KV_ERROR_NO_ERROR : E8KV_ERROR_OUT_OF_MEMORY;
    uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift: any full-rank data will do */
    for (size_t i = 0; !code && i < n_tok * cfg->n_head * cfg->head_dim; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const float r = (float)(x >> 40) / (float)(1u << 24) - 0.5f;
        q[i] = r;
        if (i < n_tok * kv_dim) k[i] = r * 3.0f, v[i] = -r;
    }
    for (size_t l = 0; l < cfg->n_layer && !code && !e8kv_is_error(err); l++) {
        err = e8kv_calib_observe(cal, l, k, v, n_tok);
        if (!e8kv_is_error(err)) err = e8kv_calib_observe_q(cal, l, q, cfg->n_head, n_tok);
    }
    if (!code && !e8kv_is_error(err)) err = e8kv_calib_finalize(cal);
    if (!code && !e8kv_is_error(err)) {
        const size_t cap = strlen(probe) * 2 + 96;
        char *spec = malloc(cap);
        if (spec) {
            snprintf(spec, cap, "f32,sink=%zu%s,layer0.k=%s,layer0.v=%s", sink,
                     cfg->rope_theta > 0.0f ? ",rope=pre" : "", probe, probe);
            const e8kv_cache_params cp = {.n_layer = cfg->n_layer,
                                          .n_head_kv = cfg->n_head_kv,
                                          .head_dim = cfg->head_dim,
                                          .n_ctx = sink + 64,
                                          .spec = spec,
                                          .rope_theta = cfg->rope_theta,
                                          .rope_neox = cfg->rope_layout == E8KV_ROPE_SPLIT_HALF,
                                          .calib = cal,
                                          .rope_freqs = cfg->has_rope_freqs ? cfg->rope_freqs : NULL};
            e8kv_cache *c = e8kv_cache_create(&cp, &err);
            if (c) err = 0;
            e8kv_cache_free(c);
            free(spec);
        } else {
            code = E8KV_ERROR_OUT_OF_MEMORY;
        }
    }
    free(k), free(v), free(q);
    e8kv_calib_free(cal);
    return code ? code : e8kv_get_error_code(err);
}

/* ---------------------------------------------------------------- diagnostics (issue 16 item 4) */

/* AM/GM of x[0..n) (1: all equal); values floored at 1e-30 so that a zero does not make it infinite */
static double am_gm(const double *x, size_t n) {
    double am = 0.0, lg = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double v = x[i] > 1e-30 ? x[i] : 1e-30;
        am += v;
        lg += log(v);
    }
    return am / (double)n / exp(lg / (double)n);
}

/* ranks 1..n of x, ties sharing their mean rank */
static void ranks(const double *x, size_t n, double *rk) {
    for (size_t i = 0; i < n; i++) {
        size_t below = 0, same = 0;
        for (size_t j = 0; j < n; j++) {
            below += x[j] < x[i];
            same += x[j] == x[i];
        }
        rk[i] = (double)below + 0.5 * (double)(same + 1);
    }
}

/* Spearman's rho: Pearson's correlation of the ranks; NAN when either side is constant */
static double spearman(const double *a, const double *b, size_t n) {
    double ra[CHECK_MAX], rb[CHECK_MAX], ma = 0.0, mb = 0.0, sab = 0.0, saa = 0.0, sbb = 0.0;
    ranks(a, n, ra);
    ranks(b, n, rb);
    for (size_t i = 0; i < n; i++)
        ma += ra[i] / (double)n, mb += rb[i] / (double)n;
    for (size_t i = 0; i < n; i++) {
        sab += (ra[i] - ma) * (rb[i] - mb);
        saa += (ra[i] - ma) * (ra[i] - ma);
        sbb += (rb[i] - mb) * (rb[i] - mb);
    }
    return saa > 0.0 && sbb > 0.0 ? sab / sqrt(saa * sbb) : NAN;
}

typedef struct {
    const char *name;
    double *rate;     /* (2 n_layer): K of every layer, then V */
    char *spec;       /* the cache spec measuring it */
    double predicted; /* sum_s c_s 4^-r_s */
    e8kv_ppl_result res;
} allocation;

/* The allocations of --check (see the usage) at mean rate B on the grid of `step` bits. 0 or an error. */
static size_t make_allocations(allocation *al, const e8kv_calib *cal, size_t n_layer, double B, double step,
                               size_t sink, const char *rope) {
    static const char *names[CHECK_MAX] = {"uniform", "auto",     "half-auto", "mirror-auto", "k+0.5",
                                           "v+0.5",   "random-1", "random-2",  "random-3"};
    const size_t n = 2 * n_layer;
    double *autor = al[1].rate;
    size_t r = e8kv_calib_auto_rates(cal, B, autor);
    if (e8kv_is_error(r)) return r;
    uint64_t x = 0x2545f4914f6cdd1dull;
    const double kv = step * ceil(0.5 / step - 1e-9); /* K or V +0.5 bit, on the grid */
    const double lo = step * ceil(1.5 / step - 1e-9); /* the lowest rate auto= gives */
    for (size_t a = 0; a < CHECK_MAX; a++) {
        double *const rt = al[a].rate;
        al[a].name = names[a];
        for (size_t s = 0; s < n && a != 1; s++) {
            const double d = autor[s] - B, half = step * floor(0.5 * d / step + 0.5),
                         k = s < n_layer ? kv : -kv;
            const double by[6] = {0.0, 0.0, half, -d, k, -k}; /* offsets of allocations 0..5; random: 0 */
            rt[s] = B + (a < 6 ? by[a] : 0.0);
        }
        if (a >= 6) { /* random pairs: one stream up by d, another down by d, d in {0, 1, .., 4} steps */
            size_t *perm = malloc(n * sizeof *perm);
            if (!perm) return (size_t) - (ptrdiff_t)E8KV_ERROR_OUT_OF_MEMORY;
            for (size_t s = 0; s < n; s++)
                perm[s] = s;
            for (size_t s = n - 1; s > 0; s--) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                const size_t j = (size_t)(x % (s + 1)), t = perm[s];
                perm[s] = perm[j], perm[j] = t;
            }
            for (size_t s = 0; s + 1 < n; s += 2) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                const double d = step * (double)(x % (uint64_t)(kv / step + 1.5)); /* 0 .. +-kv */
                rt[perm[s]] = B + d, rt[perm[s + 1]] = B - d;
            }
            free(perm);
        }
        al[a].predicted = 0.0;
        for (size_t s = 0; s < n; s++) {
            if (rt[s] < lo) rt[s] = lo;
            if (rt[s] > 8.0) rt[s] = 8.0;
            al[a].predicted += e8kv_calib_sensitivity(cal, s % n_layer, s >= n_layer) * pow(4.0, -rt[s]);
        }
        const size_t cap = 64 + n * 32;
        if (!(al[a].spec = malloc(cap))) return (size_t) - (ptrdiff_t)E8KV_ERROR_OUT_OF_MEMORY;
        int w = snprintf(al[a].spec, cap, "e8tv:%g,sink=%zu%s", B, sink, rope);
        for (size_t s = 0; s < n; s++)
            w += snprintf(al[a].spec + w, cap - (size_t)w, ",layer%zu.%c=e8tv:%g", s % n_layer,
                          s < n_layer ? 'k' : 'v', rt[s]);
    }
    return 0;
}

static void print_json_number(double v) {
    if (isfinite(v))
        printf("%.6g", v);
    else
        printf("null");
}

int e8kv_cmd_calibrate(int argc, char **argv) {
    const char *model_arg = NULL, *text_path = NULL, *out_arg = NULL, *from = NULL, *check_rate_arg = NULL;
    e8kv_calibrate_params p = {.n_ctx = 512, .n_chunks = 16};
    e8kv_sensitivity_params sp = {.n_chunks = 1, .sink = 1, .progress = probe_progress};
    int sens = 1, no_sens = 0, json = 0, check = 0;
    size_t check_chunks = 2;
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_STR("-m", &model_arg),
        E8KV_OPT_STR("-f", &text_path),
        E8KV_OPT_STR("-o", &out_arg),
        E8KV_OPT_SIZE("--ctx", &p.n_ctx, 16, 1u << 24),
        E8KV_OPT_SIZE("--chunks", &p.n_chunks, 0, SIZE_MAX),
        E8KV_OPT_THREADS(&p.n_threads),
        E8KV_OPT_FLAG("--no-sensitivity", &no_sens),
        E8KV_OPT_STR("--probe", &sp.probe),
        E8KV_OPT_SIZE("--probe-chunks", &sp.n_chunks, 1, SIZE_MAX),
        E8KV_OPT_SIZE("--probe-sink", &sp.sink, 0, 1u << 24),
        E8KV_OPT_STR("--from", &from),
        E8KV_OPT_FLAG("--json", &json),
        E8KV_OPT_FLAG("--check", &check),
        E8KV_OPT_STR("--check-rate", &check_rate_arg),
        E8KV_OPT_SIZE("--check-chunks", &check_chunks, 1, SIZE_MAX),
    };
    const int pr = e8kv_cli_parse(WHO, usage, argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (pr >= 0) return pr;
    sens = !no_sens;
    p.n_threads = e8kv_cli_threads(p.n_threads); /* 0: the online CPUs, at most E8KV_MAX_THREADS */
    double check_rate = 3.0;
    if (check_rate_arg) {
        char *end = NULL;
        check_rate = strtod(check_rate_arg, &end);
        if (!end || *end || end == check_rate_arg || !(check_rate >= 2.0) || check_rate > 7.5)
            return e8kv_cli_usage_error(WHO, "--check-rate '%s': a number of bits from 2 to 7.5",
                                        check_rate_arg);
    }
    if (!text_path && !from) return e8kv_cli_usage_error(WHO, "-f TEXT is required");
    if (!text_path && check) return e8kv_cli_usage_error(WHO, "--check measures on -f TEXT: it is required");
    if (from && out_arg) return e8kv_cli_usage_error(WHO, "--from reads a calibration: no -o with it");
    size_t n_bytes = 0;
    char *text = NULL;
    if (text_path && !(text = e8kv_cli_read_all(text_path, &n_bytes))) {
        fprintf(stderr, "e8kv calibrate: cannot read %s\n", text_path);
        return 1;
    }
    char path[4096], out[4200];
    e8kv_model *m = e8kv_cli_load_model(model_arg, path, sizeof path);
    if (!m) {
        free(text);
        return 1;
    }
    if (out_arg)
        snprintf(out, sizeof out, "%s", out_arg);
    else
        e8kv_cli_calib_path(out, sizeof out, path);
    int rc = 1;
    size_t n_tok = 0, err = 0;
    e8kv_calib *cal = NULL;
    allocation al[CHECK_MAX] = {{0}};
    int32_t *ids = NULL;
    const e8kv_model_config *cfg = &m->cfg;
    if (sens && !from) {
        const e8kv_error_code pe = check_probe(m, sp.probe ? sp.probe : "e8tv:2", sp.sink);
        if (pe) {
            fprintf(stderr,
                    "e8kv calibrate: --probe '%s': %s (expected FAMILY:RATE of a cache format, e.g. "
                    "e8tv:2 or e8v:3)\n",
                    sp.probe ? sp.probe : "e8tv:2", e8kv_error_code_name(pe));
            rc = 2;
            goto out;
        }
    }
    if (text && !(ids = e8kv_cli_tokenize(m, text, n_bytes, &n_tok, "e8kv calibrate"))) goto out;
    const double t0 = e8kv_cli_now_s();
    double t_cov = 0.0;
    size_t w = 0;
    if (from) {
        cal = e8kv_calib_load_file(from, &err);
        size_t nl = 0, nh = 0, hd = 0;
        if (cal) e8kv_calib_info(cal, &nl, &nh, &hd, NULL);
        if (!cal || nl != cfg->n_layer || nh != cfg->n_head_kv || hd != cfg->head_dim) {
            fprintf(stderr, "e8kv calibrate: --from %s: %s\n", from,
                    cal ? "made for a model of another shape" : e8kv_error_name(err));
            goto out;
        }
        snprintf(out, sizeof out, "%s", from);
    } else {
        fprintf(stderr, "e8kv calibrate: %s, %zu tokens of %s, chunks of %zu (%zu observed)\n", path, n_tok,
                text_path, p.n_ctx, p.n_chunks ? p.n_chunks : n_tok / (p.n_ctx ? p.n_ctx : 1));
        cal = e8kv_calibrate_model(m, ids, n_tok, &p, &err);
        if (!cal) {
            fprintf(stderr, "e8kv calibrate: %s\n", e8kv_error_name(err));
            goto out;
        }
        t_cov = e8kv_cli_now_s() - t0;
        if (sens) {
            sp.n_ctx = p.n_ctx;
            sp.n_threads = p.n_threads;
            err = e8kv_calibrate_sensitivity(m, ids, n_tok, cal, &sp);
            if (e8kv_is_error(err)) {
                fprintf(stderr, "e8kv calibrate: sensitivity probes: %s\n", e8kv_error_name(err));
                goto out;
            }
        }
        w = e8kv_calib_save_file(cal, out);
        if (e8kv_is_error(w)) {
            fprintf(stderr, "e8kv calibrate: cannot write %s: %s\n", out, e8kv_error_name(w));
            goto out;
        }
        size_t n_obs = 0;
        e8kv_calib_info(cal, NULL, NULL, NULL, &n_obs);
        char info[6000];
        snprintf(info, sizeof info,
                 "text=%s\ntext_bytes=%zu\ntext_tokens=%zu\nctx=%zu\nchunks=%zu\ntokens_per_layer=%zu\n"
                 "probe=%s\nprobe_chunks=%zu\nprobe_sink=%zu\nthreads=%d\nmodel=%s\ne8kv=%s\n",
                 text_path, n_bytes, n_tok, p.n_ctx, n_obs / p.n_ctx, n_obs,
                 sens ? (sp.probe ? sp.probe : "e8tv:2") : "none", sp.n_chunks, sp.sink, p.n_threads, path,
                 e8kv_version_string());
        if (!e8kv_cli_calib_info_write(out, info)) {
            fprintf(stderr, "e8kv calibrate: cannot write %s.info\n", out);
            goto out;
        }
    }
    const int have_sens = e8kv_calib_sensitivity(cal, 0, 0) >= 0.0;
    if (check && !have_sens) {
        fprintf(stderr, "e8kv calibrate: --check needs sensitivities, and %s has none\n", out);
        goto out;
    }
    const size_t L = cfg->n_layer;
    double *layer_s = calloc(L, sizeof *layer_s); /* each layer's K + V sensitivity */
    if (!layer_s) goto out;
    for (size_t l = 0; l < L && have_sens; l++)
        layer_s[l] = e8kv_calib_sensitivity(cal, l, 0) + e8kv_calib_sensitivity(cal, l, 1);
    double rho = NAN;
    size_t n_checked = 0, check_tok = 0;
    if (check) {
        /* the e8tv grid at this head_dim: whole bytes per vector (kvcache.c, auto=) */
        size_t g = 64, b = cfg->head_dim;
        while (b) {
            const size_t t = g % b;
            g = b;
            b = t;
        }
        const double step = (double)(64 / g) / 8.0;
        for (size_t a = 0; a < CHECK_MAX; a++)
            if (!(al[a].rate = malloc(2 * L * sizeof *al[a].rate))) goto out_s;
        err = make_allocations(al, cal, L, check_rate, step, sp.sink,
                               cfg->rope_theta > 0.0f ? ",rope=pre" : "");
        if (e8kv_is_error(err)) {
            fprintf(stderr, "e8kv calibrate: --check-rate %g: %s\n", check_rate, e8kv_error_name(err));
            goto out_s;
        }
        const char *specs[CHECK_MAX];
        e8kv_ppl_result res[CHECK_MAX];
        memset(res, 0, sizeof res);
        for (size_t a = 0; a < CHECK_MAX; a++)
            specs[a] = al[a].spec;
        fprintf(stderr, "e8kv calibrate: --check: %d allocations x %zu chunks of %s\n", CHECK_MAX,
                check_chunks, text_path);
        const e8kv_ppl_params pp = {.n_ctx = p.n_ctx,
                                    .n_chunks = check_chunks,
                                    .n_threads = p.n_threads,
                                    .specs = specs,
                                    .n_specs = CHECK_MAX,
                                    .calib = cal};
        const size_t nc = e8kv_ppl_run(m, ids, n_tok, &pp, res);
        if (e8kv_is_error(nc)) {
            fprintf(stderr, "e8kv calibrate: --check: %s\n", e8kv_error_name(nc));
            goto out_s;
        }
        double pa[CHECK_MAX], ma[CHECK_MAX];
        for (size_t a = 0; a < CHECK_MAX; a++) {
            al[a].res = res[a];
            if (res[a].status) {
                fprintf(stderr, "e8kv calibrate: --check: allocation %s: %s\n", al[a].name,
                        e8kv_error_name(res[a].status));
                continue;
            }
            pa[n_checked] = al[a].predicted, ma[n_checked] = res[a].kld;
            check_tok = res[a].count;
            n_checked++;
        }
        rho = n_checked >= 3 ? spearman(pa, ma, n_checked) : NAN;
    }
    const double amgm_layer = have_sens ? am_gm(layer_s, L) : NAN;
    double *streams = malloc(2 * L * sizeof *streams);
    for (size_t s = 0; streams && s < 2 * L && have_sens; s++)
        streams[s] = e8kv_calib_sensitivity(cal, s % L, s >= L);
    const double amgm_stream = have_sens && streams ? am_gm(streams, 2 * L) : NAN;
    free(streams);
    char src[1400];
    e8kv_cli_calib_source(out, src, sizeof src);
    if (json) {
        printf("{\"calib\":");
        e8kv_cli_json_string(stdout, out);
        printf(",\"source\":");
        e8kv_cli_json_string(stdout, src);
        printf(",\"n_layer\":%zu,\"n_head_kv\":%zu,\"head_dim\":%zu,\"layers\":[", L, cfg->n_head_kv,
               cfg->head_dim);
        for (size_t l = 0; l < L; l++) {
            printf("%s{\"layer\":%zu,\"gain_db\":{", l ? "," : "", l);
            for (int st = 0; st < 2; st++) {
                printf("%s\"%c\":[", st ? "," : "", st ? 'v' : 'k');
                for (size_t h = 0; h < cfg->n_head_kv; h++) {
                    double full, e8t;
                    gains_db(e8kv_calib_eigenvalues(cal, l, st, h), cfg->head_dim, &full, &e8t);
                    printf("%s[%.3f,%.3f]", h ? "," : "", full, e8t);
                }
                printf("]");
            }
            printf("}");
            if (have_sens) {
                const double k = e8kv_calib_sensitivity(cal, l, 0), v = e8kv_calib_sensitivity(cal, l, 1);
                printf(",\"sens_k\":%.6g,\"sens_v\":%.6g,\"k_share\":", k, v);
                print_json_number(k + v > 0.0 ? k / (k + v) : NAN);
            }
            printf("}");
        }
        printf("],\"am_gm_layers\":");
        print_json_number(amgm_layer);
        printf(",\"am_gm_streams\":");
        print_json_number(amgm_stream);
        if (check) {
            printf(",\"check\":{\"rate\":%g,\"chunks\":%zu,\"ctx\":%zu,\"tokens_scored\":%zu,\"text\":",
                   check_rate, check_chunks, p.n_ctx, check_tok);
            e8kv_cli_json_string(stdout, text_path);
            printf(",\"spearman\":");
            print_json_number(rho);
            printf(",\"allocations\":[");
            for (size_t a = 0, k = 0; a < CHECK_MAX; a++) {
                if (al[a].res.status) continue;
                double mean = 0.0;
                for (size_t s = 0; s < 2 * L; s++)
                    mean += al[a].rate[s] / (double)(2 * L);
                printf("%s{\"name\":\"%s\",\"mean_rate\":%.4f,\"predicted_kld\":%.6g,\"kld\":%.6g,\"kld_se\":"
                       "%.3g,"
                       "\"ppl\":%.5f,\"ppl_se\":%.4f,\"eff_bits_per_value\":%.4f,\"rates\":[",
                       k++ ? "," : "", al[a].name, mean, al[a].predicted, al[a].res.kld, al[a].res.kld_se,
                       al[a].res.ppl, al[a].res.ppl_se, al[a].res.eff_bits_per_value);
                for (size_t s = 0; s < 2 * L; s++)
                    printf("%s%g", s ? "," : "", al[a].rate[s]);
                printf("]}");
            }
            printf("]}");
        }
        printf("}\n");
    } else {
        printf("calibration %s (%s)\n", out, src);
        printf("gain dB per KV head: full transform-coding gain / what e8t gets (see --help)\n");
        printf("layer  %-40s %-40s%s\n", "K", "V",
               have_sens ? "  sensitivity K / V (KLD x 4^rate), K share, layer share" : "");
        double tot = 0.0;
        for (size_t l = 0; l < L; l++)
            tot += layer_s[l];
        for (size_t l = 0; l < L; l++) {
            char b[2][128] = {"", ""};
            for (int st = 0; st < 2; st++)
                for (size_t h = 0; h < cfg->n_head_kv; h++) {
                    double full, e8t;
                    gains_db(e8kv_calib_eigenvalues(cal, l, st, h), cfg->head_dim, &full, &e8t);
                    const size_t n = strlen(b[st]);
                    snprintf(b[st] + n, sizeof b[st] - n, "%s%.1f/%.1f", h ? "  " : "", full, e8t);
                }
            printf("%5zu  %-40s %-40s", l, b[0], b[1]);
            if (have_sens) {
                const double k = e8kv_calib_sensitivity(cal, l, 0), v = e8kv_calib_sensitivity(cal, l, 1);
                printf("  %.4g / %.4g  %5.1f%%  %5.1f%%", k, v, k + v > 0.0 ? 100.0 * k / (k + v) : 0.0,
                       tot > 0.0 ? 100.0 * layer_s[l] / tot : 0.0);
            }
            printf("\n");
        }
        if (have_sens)
            printf("AM/GM of the layers' sensitivities (K + V): %.3f; of the %zu streams: %.3f (1 = uniform "
                   "allocation is optimal)\n",
                   amgm_layer, 2 * L, amgm_stream);
        if (check) {
            printf("\n--check: mean %g bits per value, %zu chunks of %zu tokens of %s (%zu scored)\n",
                   check_rate, check_chunks, p.n_ctx, text_path, check_tok);
            printf("%-12s %9s %14s %22s %20s\n", "allocation", "mean rate", "predicted KLD", "measured KLD",
                   "PPL");
            for (size_t a = 0; a < CHECK_MAX; a++) {
                if (al[a].res.status) continue;
                double mean = 0.0;
                for (size_t s = 0; s < 2 * L; s++)
                    mean += al[a].rate[s] / (double)(2 * L);
                printf("%-12s %9.4f %14.4g %12.4g +/- %.1e %10.4f +/- %.4f\n", al[a].name, mean,
                       al[a].predicted, al[a].res.kld, al[a].res.kld_se, al[a].res.ppl, al[a].res.ppl_se);
            }
            printf("Spearman rho (predicted vs measured KLD, %zu allocations): %.3f\n", n_checked, rho);
        }
    }
    if (!from)
        fprintf(stderr, "e8kv calibrate: %.1f s (covariances %.1f s); wrote %s (%zu bytes) and %s.info\n",
                e8kv_cli_now_s() - t0, t_cov, out, w, out);
    rc = 0;
out_s:
    free(layer_s);
out:
    for (size_t a = 0; a < CHECK_MAX; a++)
        free(al[a].rate), free(al[a].spec);
    e8kv_calib_free(cal);
    free(ids);
    free(text);
    e8kv_model_free(m);
    return rc;
}
