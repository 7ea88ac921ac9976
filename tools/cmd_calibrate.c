/* e8kv calibrate: measure what the e8t formats need from a model (engine/calibrate.h) on calibration text
 * and write it to a file (doc/format.md §5) that ppl and generate pick up by default. */
#include "calibrate.h"
#include "cli.h"
#include "cli_util.h"
#include "e8kv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WHO "e8kv calibrate"

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
        "  --probe-sink S    exact first positions in the probes (default 1, as the presets)\n");
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
                                          .calib = cal};
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

int e8kv_cmd_calibrate(int argc, char **argv) {
    const char *model_arg = NULL, *text_path = NULL, *out_arg = NULL;
    e8kv_calibrate_params p = {.n_ctx = 512, .n_chunks = 16};
    e8kv_sensitivity_params sp = {.n_chunks = 1, .sink = 1, .progress = probe_progress};
    int sens = 1, no_sens = 0;
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
    };
    const int pr = e8kv_cli_parse(WHO, usage, argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (pr >= 0) return pr;
    sens = !no_sens;
    p.n_threads = e8kv_cli_threads(p.n_threads); /* 0: the online CPUs, at most E8KV_MAX_THREADS */
    if (!text_path) return e8kv_cli_usage_error(WHO, "-f TEXT is required");
    size_t n_bytes = 0;
    char *text = e8kv_cli_read_all(text_path, &n_bytes);
    if (!text) {
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
    size_t n_tok = 0;
    e8kv_calib *cal = NULL;
    if (sens) {
        const e8kv_error_code pe = check_probe(m, sp.probe ? sp.probe : "e8tv:2", sp.sink);
        if (pe) {
            fprintf(stderr,
                    "e8kv calibrate: --probe '%s': %s (expected FAMILY:RATE of a cache format, e.g. "
                    "e8tv:2 or e8v:3)\n",
                    sp.probe ? sp.probe : "e8tv:2", e8kv_error_code_name(pe));
            rc = 2;
            free(text);
            e8kv_model_free(m);
            return rc;
        }
    }
    int32_t *ids = e8kv_cli_tokenize(m, text, n_bytes, &n_tok, "e8kv calibrate");
    if (!ids) goto out;
    const e8kv_model_config *cfg = &m->cfg;
    fprintf(stderr, "e8kv calibrate: %s, %zu tokens of %s, chunks of %zu (%zu observed)\n", path, n_tok,
            text_path, p.n_ctx, p.n_chunks ? p.n_chunks : n_tok / (p.n_ctx ? p.n_ctx : 1));
    const double t0 = e8kv_cli_now_s();
    size_t err = 0;
    cal = e8kv_calibrate_model(m, ids, n_tok, &p, &err);
    if (!cal) {
        fprintf(stderr, "e8kv calibrate: %s\n", e8kv_error_name(err));
        goto out;
    }
    const double t_cov = e8kv_cli_now_s() - t0;
    if (sens) {
        sp.n_ctx = p.n_ctx;
        sp.n_threads = p.n_threads;
        err = e8kv_calibrate_sensitivity(m, ids, n_tok, cal, &sp);
        if (e8kv_is_error(err)) {
            fprintf(stderr, "e8kv calibrate: sensitivity probes: %s\n", e8kv_error_name(err));
            goto out;
        }
    }
    const size_t w = e8kv_calib_save_file(cal, out);
    if (e8kv_is_error(w)) {
        fprintf(stderr, "e8kv calibrate: cannot write %s: %s\n", out, e8kv_error_name(w));
        goto out;
    }
    size_t n_obs = 0;
    e8kv_calib_info(cal, NULL, NULL, NULL, &n_obs);
    printf("gain dB per KV head: full transform-coding gain / what e8t gets (see --help)\n");
    printf("layer  %-40s %-40s%s\n", "K", "V", sens ? "  sensitivity K / V (KLD x 4^rate)" : "");
    for (size_t l = 0; l < cfg->n_layer; l++) {
        char b[2][128] = {"", ""};
        for (int s = 0; s < 2; s++)
            for (size_t h = 0; h < cfg->n_head_kv; h++) {
                double full, e8t;
                gains_db(e8kv_calib_eigenvalues(cal, l, s, h), cfg->head_dim, &full, &e8t);
                const size_t n = strlen(b[s]);
                snprintf(b[s] + n, sizeof b[s] - n, "%s%.1f/%.1f", h ? "  " : "", full, e8t);
            }
        printf("%5zu  %-40s %-40s", l, b[0], b[1]);
        if (sens) printf("  %.4g / %.4g", e8kv_calib_sensitivity(cal, l, 0), e8kv_calib_sensitivity(cal, l, 1));
        printf("\n");
    }
    fprintf(stderr, "e8kv calibrate: %zu tokens per layer observed, %.1f s (covariances %.1f s); wrote %s (%zu bytes)\n",
            n_obs, e8kv_cli_now_s() - t0, t_cov, out, w);
    rc = 0;
out:
    e8kv_calib_free(cal);
    free(ids);
    free(text);
    e8kv_model_free(m);
    return rc;
}
