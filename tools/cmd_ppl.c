/* e8kv ppl: perplexity, KL divergence and top-1 agreement of KV-cache formats against the f32 cache, by
 * llama.cpp's llama-perplexity protocol (engine/ppl.h). One row per format; --json: one object per line. */
#include "cli.h"
#include "cli_util.h"
#include "e8kv.h"
#include "model.h"
#include "ppl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WHO "e8kv ppl"

static void usage(FILE *f) {
    fprintf(
        f, "usage: e8kv ppl [-m MODEL] -f TEXT [options]\n\n"
           "  -m MODEL          GGUF (llama, mistral, qwen2) or llama2.c checkpoint; default $E8KV_MODEL or\n"
           "                    ~/.cache/e8kv/" E8KV_DEFAULT_MODEL_NAME " (scripts/fetch_model.sh)\n"
           "  -f TEXT           UTF-8 text file, tokenized once (e.g. wikitext-2-raw/wiki.test.raw)\n"
           "  --ctx N           tokens per chunk (default 512); the second half of each chunk is scored\n"
           "  --chunks N        evaluate the first N chunks only (default: all)\n"
           "  --prefix P --score S   prefix mode (eviction's protocol): chunks of P + S tokens; each format\n"
           "                    prefills P tokens, compresses its cache (evict= in the spec), then scores\n"
           "                    S - 1 tokens attending to it; reports the compression (f16 bytes of the\n"
           "                    prefix / bytes held after it is compressed). --ctx is then ignored\n"
           "  --kv FORMATS      KV formats to compare with the f32 baseline (default f32). Repeatable;\n"
           "                    formats are also separated by ';'. A format with '=' in it is one cache\n"
           "                    spec of the full grammar (include/e8kv.h), passed as is, e.g.\n"
           "                    --kv 'k=e8:4,v=e8:3,rope=pre'; one without is a ','-separated list of\n"
           "                    codec specs and presets, e.g. f16,q8_0,q4_0h,e8:4,balanced. Specs of up\n"
           "                    to 8191 characters, never cut\n"
           "  --kv-k SPEC --kv-v SPEC   one format with different keys and values\n"
           "  --threads N       threads, 1 to 64 (default 0: number of CPUs)\n"
           "  --seed S          rotation seed of the caches (default 0)\n"
           "  --json            one JSON object per format instead of the table\n"
           "  --calib FILE      calibration for the e8t formats (default: $E8KV_CALIB, else MODEL.e8cal\n"
           "                    when it exists; e8kv calibrate writes it)\n"
           "  --dump-kv FILE    write the f32 run's K (after RoPE) and V of the first chunk (doc/format.md, "
           "1)\n");
}

/* --dump-kv: the first chunk's K and V per layer, collected then written in (layer, K tokens, V tokens)
 * order as doc/format.md section 1 specifies. */
typedef struct {
    float *buf; /* (n_layer, 2, n_ctx, kv_dim) */
    size_t n_ctx, kv_dim, n_tok;
} kv_dump;

static void dump_hook(void *user, size_t layer, const float *k, const float *v, size_t n_tok, size_t pos0) {
    kv_dump *d = user;
    if (pos0 + n_tok > d->n_ctx) return;
    float *base = d->buf + layer * 2 * d->n_ctx * d->kv_dim;
    memcpy(base + pos0 * d->kv_dim, k, n_tok * d->kv_dim * sizeof(float));
    memcpy(base + (d->n_ctx + pos0) * d->kv_dim, v, n_tok * d->kv_dim * sizeof(float));
    if (pos0 + n_tok > d->n_tok) d->n_tok = pos0 + n_tok;
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static int write_dump(const char *path, const kv_dump *d, const e8kv_model_config *cfg) {
    const uint64_t n_vec = (uint64_t)cfg->n_layer * 2 * d->n_tok * cfg->n_head_kv;
    unsigned char h[40] = {'E', '8', 'K', 'V', 'D', 'U', 'M', 'P'};
    put32(h + 8, 1);
    put32(h + 12, (uint32_t)cfg->head_dim);
    put32(h + 16, (uint32_t)n_vec);
    put32(h + 20, (uint32_t)(n_vec >> 32));
    put32(h + 24, 3); /* keys and values present; keys after RoPE */
    put32(h + 28, (uint32_t)cfg->n_layer);
    put32(h + 32, (uint32_t)cfg->n_head_kv);
    /* atomic (e8kv_file_writer): a failed write leaves an existing file as it was */
    size_t r = 0;
    e8kv_file_writer *w = e8kv_file_writer_open(path, &r);
    if (w) r = e8kv_file_writer_write(w, h, sizeof h);
    /* little-endian f32 on every target we build for */
    const size_t n = d->n_tok * d->kv_dim * sizeof(float);
    for (size_t l = 0; w && l < cfg->n_layer && !e8kv_is_error(r); l++) {
        const float *base = d->buf + l * 2 * d->n_ctx * d->kv_dim;
        r = e8kv_file_writer_write(w, base, n);
        if (!e8kv_is_error(r)) r = e8kv_file_writer_write(w, base + d->n_ctx * d->kv_dim, n);
    }
    if (w && e8kv_is_error(r))
        e8kv_file_writer_abort(w);
    else if (w)
        r = e8kv_file_writer_commit(w);
    if (e8kv_is_error(r)) {
        fprintf(stderr, "e8kv ppl: cannot write %s: %s\n", path, e8kv_error_name(r));
        return 1;
    }
    fprintf(stderr, "e8kv ppl: wrote %llu vectors of %zu floats to %s\n", (unsigned long long)n_vec,
            cfg->head_dim, path);
    return 0;
}

typedef struct {
    const e8kv_ppl_result *baseline;
} progress_state;

static void progress(void *user, size_t chunk, size_t n_chunk, const e8kv_ppl_result *res, size_t n_res) {
    const progress_state *ps = user;
    fprintf(stderr, "[%zu/%zu] PPL f32 %.4f", chunk + 1, n_chunk, ps->baseline->ppl);
    for (size_t i = 0; i < n_res; i++) {
        if (res[i].status || !strcmp(res[i].spec, "f32")) continue;
        fprintf(stderr, " | %s %.4f", res[i].spec, res[i].ppl);
    }
    fprintf(stderr, "  (%.1f tok/s f32)\n", ps->baseline->tokens_per_s);
}

int e8kv_cmd_ppl(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL, *kv_k = NULL, *kv_v = NULL, *dump = NULL;
    const char *calib_arg = NULL;
    e8kv_cli_list kv = {0};
    size_t n_ctx = 512, n_chunks = 0, prefix = 0, score = 0;
    int n_threads = 0, json = 0;
    uint64_t seed = 0;
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_STR("-m", &model_path),
        E8KV_OPT_STR("-f", &text_path),
        E8KV_OPT_SIZE("--ctx", &n_ctx, 4, 1u << 24),
        E8KV_OPT_SIZE("--chunks", &n_chunks, 0, SIZE_MAX),
        E8KV_OPT_SIZE("--prefix", &prefix, 1, 1u << 24),
        E8KV_OPT_SIZE("--score", &score, 2, 1u << 24),
        E8KV_OPT_LIST("--kv", &kv),
        E8KV_OPT_STR("--kv-k", &kv_k),
        E8KV_OPT_STR("--kv-v", &kv_v),
        E8KV_OPT_THREADS(&n_threads),
        E8KV_OPT_U64("--seed", &seed),
        E8KV_OPT_FLAG("--json", &json),
        E8KV_OPT_STR("--dump-kv", &dump),
        E8KV_OPT_STR("--calib", &calib_arg),
    };
    const int pr = e8kv_cli_parse(WHO, usage, argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (pr >= 0) return e8kv_cli_list_free(&kv), pr;
    int rc = 2;
    e8kv_cli_specs fs = {0};
    char *kv_pair = NULL;
    if (!text_path) {
        e8kv_cli_usage_error(WHO, "-f TEXT is required");
        goto args_out;
    }
    if ((prefix == 0) != (score == 0)) {
        e8kv_cli_usage_error(WHO, "--prefix and --score go together");
        goto args_out;
    }
    if (prefix) n_ctx = prefix + score;
    if (!prefix && n_ctx % 2) {
        e8kv_cli_usage_error(WHO, "--ctx %zu: must be even (the second half of each chunk is scored)", n_ctx);
        goto args_out;
    }
    if ((kv_k == NULL) != (kv_v == NULL)) {
        e8kv_cli_usage_error(WHO, "--kv-k and --kv-v go together");
        goto args_out;
    }
    /* the formats: the --kv values split by the CLI's one list rule (cli_util.h), then --kv-k/--kv-v */
    if (!e8kv_cli_split_specs(&fs, WHO, kv.v, kv.n, kv_k ? NULL : "f32")) goto args_out;
    if (kv_k) {
        const size_t len = strlen(kv_k) + strlen(kv_v) + 6; /* "k=" "," "v=" and the NUL */
        if (!(kv_pair = malloc(len)) || !e8kv_cli_specs_add(&fs, kv_pair)) {
            fprintf(stderr, "%s: out of memory\n", WHO);
            rc = 1;
            goto args_out;
        }
        snprintf(kv_pair, len, "k=%s,v=%s", kv_k, kv_v);
    }
    if (fs.n > E8KV_PPL_MAX_SPECS) {
        e8kv_cli_usage_error(WHO, "%zu formats: at most %d in one run", fs.n, E8KV_PPL_MAX_SPECS);
        goto args_out;
    }
    for (size_t i = 0; i < fs.n; i++)
        if (!e8kv_cli_check_spec(WHO, "--kv", fs.v[i])) goto args_out;
    const char *const *specs = fs.v;
    const size_t n_specs = fs.n;

    rc = 1;
    char *text = NULL;
    size_t n_bytes = 0;
    if (!(text = e8kv_cli_read_all(text_path, &n_bytes))) {
        fprintf(stderr, "e8kv ppl: cannot read %s\n", text_path);
        goto args_out;
    }
    if (n_bytes == 0) {
        fprintf(stderr, "e8kv ppl: %s is empty [%s]\n", text_path, e8kv_error_code_name(E8KV_ERROR_SRC_SIZE));
        free(text);
        goto args_out;
    }
    char mpath[4096];
    e8kv_model *m = e8kv_cli_load_model(model_path, mpath, sizeof mpath);
    if (!m) {
        free(text);
        goto args_out;
    }
    int cal_failed = 0;
    int32_t *ids = NULL;
    kv_dump kd = {0};
    e8kv_ppl_result *res = calloc(n_specs, sizeof *res);
    char cal_path[4200];
    e8kv_calib *cal = e8kv_cli_load_calib(calib_arg, mpath, "e8kv ppl", &cal_failed, cal_path, sizeof cal_path);
    if (cal_failed) goto out;
    e8kv_cli_note_presets(WHO, specs, n_specs, cal);
    if (n_ctx > m->cfg.n_ctx_train) {
        fprintf(stderr, "e8kv ppl: --ctx %zu is larger than the model's context (%zu) [%s]\n", n_ctx,
                m->cfg.n_ctx_train, e8kv_error_code_name(E8KV_ERROR_CONTEXT_FULL));
        goto out;
    }
    /* tokenize once, as llama.cpp: BOS in front when the vocabulary adds it */
    size_t n_tok = 0;
    ids = e8kv_cli_tokenize(m, text, n_bytes, &n_tok, "e8kv ppl");
    if (!ids) goto out;
    if (n_tok < n_ctx) {
        fprintf(stderr, "e8kv ppl: the text has %zu tokens, fewer than one chunk of %zu [%s]\n", n_tok, n_ctx,
                e8kv_error_code_name(E8KV_ERROR_SRC_SIZE));
        goto out;
    }
    const e8kv_model_config *cfg = &m->cfg;
    if (dump) {
        kd.n_ctx = n_ctx;
        kd.kv_dim = cfg->n_head_kv * cfg->head_dim;
        kd.buf = malloc(cfg->n_layer * 2 * n_ctx * kd.kv_dim * sizeof(float));
        if (!kd.buf) {
            fprintf(stderr, "e8kv ppl: out of memory for --dump-kv\n");
            goto out;
        }
    }
    const size_t n_chunk_all = n_tok / n_ctx;
    const size_t n_chunk = n_chunks && n_chunks < n_chunk_all ? n_chunks : n_chunk_all;
    const int threads = e8kv_cli_threads(n_threads);
    fprintf(stderr,
            "e8kv ppl: %s (%s, %zu layers, dim %zu, %zu/%zu heads, head_dim %zu), %zu tokens, "
            "%zu chunks of %zu, %d threads\n",
            model_path ? model_path : "default model", cfg->arch, cfg->n_layer, cfg->dim, cfg->n_head,
            cfg->n_head_kv, cfg->head_dim, n_tok, n_chunk, n_ctx, threads);
    e8kv_ppl_result baseline = {0};
    progress_state ps = {&baseline};
    const e8kv_ppl_params pp = {.n_ctx = n_ctx,
                                .prefix = prefix,
                                .score = score,
                                .n_chunks = n_chunks,
                                .n_threads = threads,
                                .seed = seed,
                                .specs = specs,
                                .n_specs = n_specs,
                                .progress = progress,
                                .progress_user = &ps,
                                .dump_hook = dump ? dump_hook : NULL,
                                .dump_user = &kd,
                                .baseline = &baseline,
                                .calib = cal};
    const size_t r = e8kv_ppl_run(m, ids, n_tok, &pp, res);
    if (e8kv_is_error(r)) {
        fprintf(stderr, "e8kv ppl: %s\n", e8kv_error_name(r));
        goto out;
    }
    if (json) {
        for (size_t i = 0; i < n_specs; i++) {
            const e8kv_ppl_result *x = &res[i];
            printf("{\"model\":");
            e8kv_cli_json_string(stdout, model_path ? model_path : "default");
            printf(",\"arch\":");
            e8kv_cli_json_string(stdout, cfg->arch);
            printf(",\"spec\":");
            e8kv_cli_json_string(stdout, x->spec);
            printf(",\"available\":%s,\"calib\":", x->status ? "false" : "true");
            if (cal)
                e8kv_cli_json_string(stdout, cal_path);
            else
                printf("null");
            if (x->status) {
                printf(",\"error\":\"%s\"}\n", e8kv_error_name(x->status));
                continue;
            }
            printf(",\"ctx\":%zu,\"chunks\":%zu,\"tokens_scored\":%zu,\"threads\":%d,\"ppl\":%.6f,\"ppl_se\":"
                   "%.6f,"
                   "\"ppl_f32\":%.6f,\"kld\":%.8f,\"kld_se\":%.8f,\"top1\":%.6f,\"top1_se\":%.6f,"
                   "\"bits_per_value\":%.4f,\"eff_bits_per_value\":%.4f,\"kv_bytes\":%zu,"
                   "\"tokens_per_s\":%.2f",
                   n_ctx, r, x->count, threads, x->ppl, x->ppl_se, baseline.ppl, x->kld, x->kld_se, x->top1,
                   x->top1_se, x->bits_per_value, x->eff_bits_per_value, x->kv_bytes, x->tokens_per_s);
            if (prefix)
                printf(",\"prefix\":%zu,\"score\":%zu,\"compression\":%.4f,\"kept\":%zu", prefix, score,
                       x->compression, x->n_kept);
            printf("}\n");
        }
    } else {
        printf("\nctx %zu, %zu chunks, %zu scored tokens per format; f32 baseline PPL %.4f +/- %.5f\n", n_ctx,
               r, baseline.count, baseline.ppl, baseline.ppl_se);
        printf("bits/val: the formats' rate with their side information; eff: 8 x allocated bytes / values "
               "held\n");
        printf("%-16s %8s %6s %11s %20s %8s %24s %16s %8s\n", "format", "bits/val", "eff", "KV MiB", "PPL",
               "dPPL", "KLD (nats)", "top-1 %", "tok/s");
        for (size_t i = 0; i < n_specs; i++) {
            const e8kv_ppl_result *x = &res[i];
            if (x->status) {
                printf("%-16s unavailable: %s\n", x->spec, e8kv_error_name(x->status));
                continue;
            }
            char ppl[32], kld[32], top[32];
            snprintf(ppl, sizeof ppl, "%.4f +/- %.4f", x->ppl, x->ppl_se);
            snprintf(kld, sizeof kld, "%.3e +/- %.1e", x->kld, x->kld_se);
            snprintf(top, sizeof top, "%.2f +/- %.2f", 100.0 * x->top1, 100.0 * x->top1_se);
            printf("%-16s %8.3f %6.3f %11.3f %20s %+7.3f%% %24s %16s %8.1f\n", x->spec, x->bits_per_value,
                   x->eff_bits_per_value, (double)x->kv_bytes / (1024.0 * 1024.0), ppl, 100.0 * (x->ppl / baseline.ppl - 1.0), kld,
                   top, x->tokens_per_s);
            if (prefix && x->compression > 0.0)
                printf("%-16s compression %.2fx of the %zu-token prefix (layer 0 keeps %zu)\n", "",
                       x->compression, prefix, x->n_kept);
        }
    }
    size_t n_ok = 0;
    for (size_t i = 0; i < n_specs; i++) {
        n_ok += res[i].status == 0;
        if (res[i].status) e8kv_cli_spec_error(WHO, res[i].spec, res[i].status, cal != NULL);
    }
    rc = 0;
    if (n_ok == 0) {
        fprintf(stderr, "e8kv ppl: none of the %zu format%s requested is available\n", n_specs,
                n_specs == 1 ? "" : "s");
        rc = 1;
    }
    if (dump && write_dump(dump, &kd, cfg)) rc = 1;
out:
    e8kv_calib_free(cal);
    free(kd.buf);
    free(res);
    free(ids);
    free(text);
    e8kv_model_free(m);
args_out:
    e8kv_cli_specs_free(&fs);
    e8kv_cli_list_free(&kv);
    free(kv_pair);
    return rc;
}
