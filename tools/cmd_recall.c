/* e8kv recall: passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2) through a
 * compressed cache. A 5-digit number is hidden at a depth of 0..100% of a filler text of about --ctx
 * tokens, the question comes at the end; the prompt is prefilled, the cache compressed (eviction with the
 * prompt's queries when the spec evicts), and the greedy answer must contain the number exactly.
 * Accuracy per format and depth; --json: one object per (format, depth). */
#include "cli.h"
#include "cli_util.h"
#include "e8kv.h"
#include "model.h"
#include "ppl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHO "e8kv recall"
#define MAX_DEPTHS 21
#define ANSWER_TOKENS 8

static const char k_intro[] =
    "There is an important info hidden inside a lot of irrelevant text. Find it and "
    "memorize it. I will quiz you about the important information there.";
static const char k_filler[] =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
static const char k_question[] = " What is the pass key? The pass key is";

static void usage(FILE *f) {
    fprintf(f, "usage: e8kv recall [-m MODEL] [options]\n\n"
               "  --ctx N        prompt length in tokens, about (default 1024)\n"
               "  --depths N     depths 0, 100/(N-1) .. 100%% (default 5, at most 21)\n"
               "  --trials N     passkeys per depth (default 5)\n"
               "  --kv FORMATS   cache specs as in e8kv ppl (default f16); eviction runs after the prompt\n"
               "  --threads N    threads (default: CPUs)   --seed S   passkeys' seed (default 1)\n"
               "  --calib FILE   calibration for the e8t formats   --json   one JSON object per row\n");
}

/* Token ids of a piece of text without BOS; NULL on failure. */
static int32_t *encode(const e8kv_model *m, const char *text, size_t *n) {
    const size_t len = strlen(text);
    const size_t cap = len + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return NULL;
    *n = e8kv_tokenizer_encode(m->tokenizer, ids, cap, text, len, 0);
    if (e8kv_is_error(*n) || *n > cap) {
        free(ids);
        return NULL;
    }
    return ids;
}

static size_t cat(int32_t *dst, size_t n, const int32_t *src, size_t k) {
    memcpy(dst + n, src, k * sizeof *src);
    return n + k;
}

int e8kv_cmd_recall(int argc, char **argv) {
    const char *model_path = NULL, *calib_arg = NULL;
    e8kv_cli_list kv = {0};
    size_t ctx = 1024, n_depth = 5, n_trial = 5;
    int n_threads = 0, json = 0;
    uint64_t seed = 1;
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_STR("-m", &model_path),
        E8KV_OPT_SIZE("--ctx", &ctx, 128, 1u << 20),
        E8KV_OPT_SIZE("--depths", &n_depth, 1, MAX_DEPTHS),
        E8KV_OPT_SIZE("--trials", &n_trial, 1, 10000),
        E8KV_OPT_LIST("--kv", &kv),
        E8KV_OPT_THREADS(&n_threads),
        E8KV_OPT_U64("--seed", &seed),
        E8KV_OPT_FLAG("--json", &json),
        E8KV_OPT_STR("--calib", &calib_arg),
    };
    const int pr = e8kv_cli_parse(WHO, usage, argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (pr >= 0) return e8kv_cli_list_free(&kv), pr;
    int rc = 2;
    e8kv_cli_specs fs = {0};
    if (!e8kv_cli_split_specs(&fs, WHO, kv.v, kv.n, "f16")) goto args_out;
    for (size_t i = 0; i < fs.n; i++)
        if (!e8kv_cli_check_spec(WHO, "--kv", fs.v[i])) goto args_out;
    rc = 1;
    char mpath[4096];
    e8kv_model *m = e8kv_cli_load_model(model_path, mpath, sizeof mpath);
    if (!m) goto args_out;
    int cal_failed = 0;
    e8kv_calib *cal = e8kv_cli_load_calib(calib_arg, mpath, WHO, &cal_failed, NULL, 0);
    e8kv_cli_note_presets(WHO, (const char *const *)fs.v, fs.n, cal);
    size_t n_in = 0, n_fi = 0, n_qu = 0;
    int32_t *intro = encode(m, k_intro, &n_in), *fill = encode(m, k_filler, &n_fi),
            *ques = encode(m, k_question, &n_qu);
    const e8kv_model_config *cfg = &m->cfg;
    const size_t n_max = ctx + 64, nv = cfg->vocab_size;
    int32_t *prompt = malloc(n_max * sizeof *prompt);
    float *logits = malloc(nv * sizeof *logits);
    e8kv_qcap qc = {0};
    const size_t qr = e8kv_qcap_init(&qc, m, n_max);
    if (cal_failed || !intro || !fill || !ques || !prompt || !logits || qr || !n_fi) {
        fprintf(stderr, "%s: setup failed (tokenizer, calibration or memory)\n", WHO);
        goto out;
    }
    const int threads = e8kv_cli_threads(n_threads);
    if (!json)
        printf("passkey recall, ~%zu-token prompts, %zu trials per depth\n%-40s", ctx, n_trial, "format");
    for (size_t di = 0; di < n_depth && !json; di++)
        printf(" %5.0f%%", n_depth > 1 ? 100.0 * (double)di / (double)(n_depth - 1) : 0.0);
    if (!json) printf("   all\n");
    for (size_t s = 0; s < fs.n; s++) {
        const e8kv_context_params cp = {.n_ctx = n_max,
                                        .kv_spec = fs.v[s],
                                        .seed = 0,
                                        .n_threads = threads,
                                        .q_hook = e8kv_qcap_hook,
                                        .q_hook_user = &qc,
                                        .calib = cal};
        size_t err = 0;
        e8kv_context *c = e8kv_context_create(m, &cp, &err);
        if (!c) {
            e8kv_cli_spec_error(WHO, fs.v[s], err, cal != NULL);
            continue;
        }
        if (!json) printf("%-40s", fs.v[s]);
        size_t all_ok = 0;
        for (size_t di = 0; di < n_depth; di++) {
            const double depth = n_depth > 1 ? (double)di / (double)(n_depth - 1) : 0.0;
            size_t ok = 0;
            for (size_t t = 0; t < n_trial; t++) {
                /* the passkey: 10000..99999 from (seed, depth, trial) */
                uint64_t x =
                    seed * 0x9E3779B97F4A7C15ull + di * 0xBF58476D1CE4E5B9ull + t * 0x94D049BB133111EBull;
                x ^= x >> 31;
                x *= 0xD6E8FEB86659FD93ull;
                x ^= x >> 29;
                char key[8], needle[160];
                snprintf(key, sizeof key, "%05u", (unsigned)(10000 + x % 90000));
                snprintf(needle, sizeof needle, " The pass key is %s. Remember it. %s is the pass key.", key,
                         key);
                size_t n_ne = 0;
                int32_t *ne = encode(m, needle, &n_ne);
                if (!ne) goto next_spec;
                const size_t fixed = 1 + n_in + n_ne + n_qu;
                const size_t n_fill = ctx > fixed ? (ctx - fixed) / n_fi : 0;
                const size_t before = (size_t)(depth * (double)n_fill + 0.5);
                size_t n = 0;
                prompt[n++] = e8kv_tokenizer_bos(m->tokenizer);
                n = cat(prompt, n, intro, n_in);
                for (size_t i = 0; i < before; i++)
                    n = cat(prompt, n, fill, n_fi);
                n = cat(prompt, n, ne, n_ne);
                for (size_t i = before; i < n_fill; i++)
                    n = cat(prompt, n, fill, n_fi);
                n = cat(prompt, n, ques, n_qu);
                free(ne);
                e8kv_context_reset(c);
                qc.active = 1;
                size_t r = e8kv_context_eval(c, logits, nv, prompt, n, n - 1);
                qc.active = 0;
                e8kv_cache *kvc = (e8kv_cache *)(uintptr_t)e8kv_context_cache(c);
                if (!e8kv_is_error(r)) {
                    const size_t e = e8kv_qcap_evict(&qc, kvc, cfg->n_head, n);
                    if (e8kv_is_error(e) && e8kv_get_error_code(e) != E8KV_ERROR_BAD_ARGUMENT) r = e;
                }
                /* greedy answer: the first run of digits must be the key */
                char ans[ANSWER_TOKENS * 16 + 1] = {0};
                size_t al = 0;
                for (size_t i = 0; i < ANSWER_TOKENS && !e8kv_is_error(r); i++) {
                    int32_t best = 0;
                    for (size_t k = 1; k < nv; k++)
                        if (logits[k] > logits[best]) best = (int32_t)k;
                    const char *piece = NULL;
                    const size_t pl = e8kv_tokenizer_piece(m->tokenizer, best, &piece);
                    for (size_t k = 0; !e8kv_is_error(pl) && k < pl && al + 1 < sizeof ans; k++)
                        ans[al++] = piece[k];
                    r = e8kv_context_eval(c, logits, nv, &best, 1, 0);
                }
                if (e8kv_is_error(r)) {
                    fprintf(stderr, "%s: %s: %s\n", WHO, fs.v[s], e8kv_error_name(r));
                    goto next_spec;
                }
                const char *d0 = ans;
                while (*d0 && (*d0 < '0' || *d0 > '9'))
                    d0++;
                size_t dl = 0;
                while (d0[dl] >= '0' && d0[dl] <= '9')
                    dl++;
                ok += dl == 5 && !memcmp(d0, key, 5);
            }
            all_ok += ok;
            if (json) {
                printf("{\"spec\":");
                e8kv_cli_json_string(stdout, fs.v[s]);
                printf(",\"ctx\":%zu,\"depth\":%.4f,\"trials\":%zu,\"correct\":%zu,\"accuracy\":%.4f}\n", ctx,
                       depth, n_trial, ok, (double)ok / (double)n_trial);
            } else
                printf(" %5.0f%%", 100.0 * (double)ok / (double)n_trial), fflush(stdout);
        }
        if (!json) printf(" %5.1f%%\n", 100.0 * (double)all_ok / (double)(n_trial * n_depth));
    next_spec:
        e8kv_context_free(c);
    }
    rc = 0;
out:
    free(intro);
    free(fill);
    free(ques);
    free(prompt);
    free(logits);
    e8kv_qcap_free(&qc);
    e8kv_calib_free(cal);
    e8kv_model_free(m);
args_out:
    e8kv_cli_specs_free(&fs);
    e8kv_cli_list_free(&kv);
    return rc;
}
