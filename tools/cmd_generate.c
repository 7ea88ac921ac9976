/* e8kv generate: streaming text generation through a compressed KV cache (greedy at --temp 0).
 * --tokens IDS and --dump-logits FILE expose the raw forward pass for the independent numpy reference
 * (tests/py_forward_ref.py): FILE receives the logits of every prompt token, f32 little-endian,
 * (n_prompt, vocab) row-major, no header.
 * --save-cache F saves the cache after the prompt (doc/format.md §4) with, as its meta (§4.5), the prompt's
 * token ids and the last prompt token's logits, so --load-cache F continues exactly where the prompt
 * ended without running it again: the same greedy tokens as a run without save/load. */
#include "cli.h"
#include "cli_util.h"
#include "e8kv.h"
#include "model.h"
#include "sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WHO "e8kv generate"

static void usage(FILE *f) {
    fprintf(f,
            "usage: e8kv generate [-m MODEL] -p PROMPT [options]\n\n"
            "  -m MODEL          GGUF or llama2.c checkpoint (default: $E8KV_MODEL or the fetched SmolLM2)\n"
            "  -p PROMPT         prompt text (may be empty: generation starts from BOS)\n"
            "  -n N              tokens to generate (default 128; 0 = only run the prompt)\n"
            "  --kv SPEC         KV-cache format (default f32), e.g. q4_0h, e8:3, k=q8_0,v=e8:3\n"
            "  --temp T          temperature (default 0 = greedy)\n"
            "  --top-p P         nucleus sampling threshold (default 0.9)\n"
            "  --seed S          sampling seed (default: time)\n"
            "  --ctx N           context length (default: prompt + N, at most the model's); generation\n"
            "                    stops, with a message, when it is full\n"
            "  --threads N       threads, 1 to 64 (default 0: number of CPUs)\n"
            "  --tokens IDS      comma-separated token ids instead of -p (no BOS added)\n"
            "  --ignore-eos      keep generating past the end-of-text token\n"
            "  --dump-logits F   write the prompt tokens' logits to F (f32, (n_prompt, vocab))\n"
            "  --save-cache F    after the prompt, save the KV cache (and the prompt) to F\n"
            "  --calib FILE      calibration for the e8t formats (default: $E8KV_CALIB, else MODEL.e8cal)\n"
            "  --load-cache F    continue from a cache saved with --save-cache instead of running the\n"
            "                    prompt; -p/--tokens are optional and must equal the saved prompt;\n"
            "                    --kv defaults to the saved cache's spec\n");
}

/* The meta of a cache saved by --save-cache (doc/format.md §4.5): "E8KVGEN1", u32 n_prompt, the ids
 * (i32), u32 vocab, the last prompt token's logits (f32), all little-endian. */
#define GEN_META_MAGIC "E8KVGEN1"

static void put_u32le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int save_state(const e8kv_context *ctx, const char *path, const int32_t *ids, size_t n_prompt,
                      const float *logits, size_t vocab) {
    const size_t n = 8 + 4 + 4 * n_prompt + 4 + 4 * vocab;
    uint8_t *meta = malloc(n);
    if (!meta) return 0;
    memcpy(meta, GEN_META_MAGIC, 8);
    put_u32le(meta + 8, (uint32_t)n_prompt);
    for (size_t i = 0; i < n_prompt; i++) put_u32le(meta + 12 + 4 * i, (uint32_t)ids[i]);
    uint8_t *q = meta + 12 + 4 * n_prompt;
    put_u32le(q, (uint32_t)vocab);
    for (size_t i = 0; i < vocab; i++) {
        uint32_t u;
        memcpy(&u, &logits[i], 4);
        put_u32le(q + 4 + 4 * i, u);
    }
    const size_t r = e8kv_cache_save_file(e8kv_context_cache(ctx), path, meta, n);
    free(meta);
    if (e8kv_is_error(r)) {
        fprintf(stderr, "\ne8kv generate: cannot save the cache to %s: %s\n", path, e8kv_error_name(r));
        return 0;
    }
    fprintf(stderr, "e8kv generate: saved the cache after %zu prompt tokens to %s (%zu bytes)\n", n_prompt, path, r);
    return 1;
}

/* Parse the meta of a saved generate state; returns the prompt length or 0 when malformed. */
static size_t parse_state(const uint8_t *meta, size_t n, size_t vocab, const uint8_t **ids, const uint8_t **logits) {
    if (n < 12 || memcmp(meta, GEN_META_MAGIC, 8)) return 0;
    const size_t n_prompt = get_u32le(meta + 8);
    if (n_prompt == 0 || n_prompt > (n - 12) / 4) return 0;
    const uint8_t *q = meta + 12 + 4 * n_prompt;
    if ((size_t)(meta + n - q) < 4 || get_u32le(q) != vocab || (size_t)(meta + n - q - 4) / 4 != vocab ||
        (size_t)(meta + n - q - 4) % 4)
        return 0;
    *ids = meta + 12;
    *logits = q + 4;
    return n_prompt;
}

static void print_piece(const e8kv_model *m, int32_t id) {
    const char *piece = NULL;
    const size_t n = e8kv_tokenizer_piece(m->tokenizer, id, &piece);
    if (!e8kv_is_error(n) && n) fwrite(piece, 1, n, stdout);
    fflush(stdout);
}

int e8kv_cmd_generate(int argc, char **argv) {
    const char *model_arg = NULL, *prompt = NULL, *kv = NULL, *tokens_arg = NULL, *dump = NULL;
    const char *save_path = NULL, *load_path = NULL, *calib_arg = NULL;
    size_t n_gen = 128;
    size_t n_ctx_arg = 0;
    float temp = 0.0f, top_p = 0.9f;
    uint64_t seed = (uint64_t)time(NULL);
    int n_threads = 0, ignore_eos = 0;
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_STR("-m", &model_arg),
        E8KV_OPT_STR("-p", &prompt),
        E8KV_OPT_SIZE("-n", &n_gen, 0, 1u << 30),
        E8KV_OPT_STR("--kv", &kv),
        E8KV_OPT_FLOAT("--temp", &temp, 0.0, 1e6),
        E8KV_OPT_FLOAT("--top-p", &top_p, 1e-9, 1.0),
        E8KV_OPT_U64("--seed", &seed),
        E8KV_OPT_SIZE("--ctx", &n_ctx_arg, 1, 1u << 24),
        E8KV_OPT_THREADS(&n_threads),
        E8KV_OPT_STR("--tokens", &tokens_arg),
        E8KV_OPT_FLAG("--ignore-eos", &ignore_eos),
        E8KV_OPT_STR("--dump-logits", &dump),
        E8KV_OPT_STR("--save-cache", &save_path),
        E8KV_OPT_STR("--load-cache", &load_path),
        E8KV_OPT_STR("--calib", &calib_arg),
    };
    const int pr = e8kv_cli_parse(WHO, usage, argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (pr >= 0) return pr;
    if (!prompt && !tokens_arg && !load_path)
        return e8kv_cli_usage_error(WHO, "give -p PROMPT, --tokens IDS or --load-cache FILE");
    if (load_path && (save_path || dump))
        return e8kv_cli_usage_error(WHO, "--load-cache goes with neither --save-cache nor --dump-logits");
    if (kv && !e8kv_cli_check_spec(WHO, "--kv", kv)) return 2;
    /* --load-cache: the saved state, checked before the model is loaded */
    void *saved = NULL;
    size_t saved_size = 0;
    e8kv_cache_file_info sfi;
    if (load_path) {
        saved_size = e8kv_cache_read_file(&saved, load_path);
        if (!e8kv_is_error(saved_size)) saved_size = e8kv_cache_file_get_info(&sfi, saved, saved_size);
        if (e8kv_is_error(saved_size)) {
            fprintf(stderr, "e8kv generate: cannot load %s: %s\n", load_path, e8kv_error_name(saved_size));
            free(saved);
            return 1;
        }
        if (!kv) kv = sfi.spec;
    }
    if (!kv) kv = "f32";
    char path[4096];
    e8kv_model *m = e8kv_cli_load_model(model_arg, path, sizeof path);
    if (!m) {
        free(saved);
        return 1;
    }
    size_t r = 0;
    const e8kv_model_config *cfg = &m->cfg;
    int rc = 1, cal_failed = 0;
    /* a loaded e8t cache brings its own calibration; give the same one to the context that loads it */
    e8kv_calib *cal = NULL;
    if (load_path && sfi.calib_size && !calib_arg) { /* the calibration saved with the cache */
        cal = e8kv_calib_load((const uint8_t *)saved + sfi.calib_offset, sfi.calib_size, &r);
        cal_failed = !cal;
        if (!cal) fprintf(stderr, "e8kv generate: bad calibration in %s: %s\n", load_path, e8kv_error_name(r));
    } else {
        cal = e8kv_cli_load_calib(calib_arg, path, "e8kv generate", &cal_failed, NULL, 0);
    }
    e8kv_cli_note_presets("e8kv generate", &kv, 1, cal);
    if (cal_failed) {
        e8kv_model_free(m);
        free(saved);
        return 1;
    }
    int32_t *ids = NULL;
    float *logits = NULL;
    e8kv_context *ctx = NULL;
    e8kv_sampler smp = {0};
    size_t n_prompt = 0;
    const uint8_t *saved_ids = NULL, *saved_logits = NULL;
    size_t n_saved = 0;
    if (load_path) {
        n_saved = parse_state((const uint8_t *)saved + sfi.meta_offset, sfi.meta_size, cfg->vocab_size, &saved_ids,
                              &saved_logits);
        if (!n_saved) {
            fprintf(stderr, "e8kv generate: %s was not saved by generate --save-cache for this model\n", load_path);
            goto out;
        }
    }
    if (tokens_arg) {
        ids = malloc((strlen(tokens_arg) / 2 + 2) * sizeof *ids);
        if (!ids) goto out;
        for (const char *s = tokens_arg; *s;) {
            char *end;
            const long v = strtol(s, &end, 10);
            if (end == s || v < 0 || (size_t)v >= cfg->vocab_size) {
                fprintf(stderr, "e8kv generate: bad token id in --tokens at '%s'\n", s);
                goto out;
            }
            ids[n_prompt++] = (int32_t)v;
            s = *end == ',' ? end + 1 : end;
        }
    } else if (prompt) {
        if (!m->tokenizer) {
            fprintf(stderr, "e8kv generate: the model has no tokenizer (use --tokens)\n");
            goto out;
        }
        const size_t len = strlen(prompt), cap = len + 16;
        e8kv_cli_warn_unknown_bytes(m->tokenizer, prompt, len, WHO);
        ids = malloc(cap * sizeof *ids);
        if (!ids) goto out;
        n_prompt = e8kv_tokenizer_encode(m->tokenizer, ids, cap, prompt, len, -1);
        if (e8kv_is_error(n_prompt) || n_prompt > cap) {
            fprintf(stderr, "e8kv generate: tokenization failed\n");
            goto out;
        }
        if (n_prompt == 0) ids[n_prompt++] = e8kv_tokenizer_bos(m->tokenizer); /* start from BOS */
    }
    if (load_path) { /* the saved prompt, or the given one if it is the same */
        if (ids) {
            int same = n_prompt == n_saved;
            for (size_t i = 0; same && i < n_prompt; i++) same = (uint32_t)ids[i] == get_u32le(saved_ids + 4 * i);
            if (!same) {
                fprintf(stderr, "e8kv generate: the prompt differs from the one saved in %s\n", load_path);
                goto out;
            }
        }
        free(ids);
        ids = malloc(n_saved * sizeof *ids);
        if (!ids) goto out;
        for (size_t i = 0; i < n_saved; i++) {
            ids[i] = (int32_t)get_u32le(saved_ids + 4 * i);
            if (ids[i] < 0 || (size_t)ids[i] >= cfg->vocab_size) {
                fprintf(stderr, "e8kv generate: bad token id in %s\n", load_path);
                goto out;
            }
        }
        n_prompt = n_saved;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "e8kv generate: empty prompt\n");
        goto out;
    }
    size_t n_ctx = n_ctx_arg ? n_ctx_arg : n_prompt + n_gen;
    if (!n_ctx_arg && cfg->n_ctx_train && n_ctx > cfg->n_ctx_train) n_ctx = cfg->n_ctx_train;
    if (n_prompt > n_ctx) {
        fprintf(stderr, "e8kv generate: the prompt (%zu tokens) does not fit the context (%zu)\n", n_prompt,
                n_ctx);
        goto out;
    }
    const e8kv_context_params cp = {.n_ctx = n_ctx,
                                    .n_batch = 512,
                                    .kv_spec = kv,
                                    .seed = 0,
                                    .n_threads = e8kv_cli_threads(n_threads),
                                    .calib = cal};
    ctx = e8kv_context_create(m, &cp, &r);
    if (!ctx) {
        if (e8kv_get_error_code(r) == E8KV_ERROR_SPEC)
            e8kv_cli_spec_error(WHO, kv, r, cal != NULL);
        else
            fprintf(stderr, "e8kv generate: cannot create a context with --kv %s, ctx %zu: %s\n", kv, n_ctx,
                    e8kv_error_name(r));
        goto out;
    }
    r = e8kv_sampler_init(&smp, cfg->vocab_size, temp, top_p, seed);
    if (e8kv_is_error(r)) {
        fprintf(stderr, "e8kv generate: bad sampling options (--temp >= 0, 0 < --top-p <= 1)\n");
        goto out;
    }
    const size_t n_rows = dump ? n_prompt : 1;
    logits = malloc(n_rows * cfg->vocab_size * sizeof *logits);
    if (!logits) goto out;
    if (prompt) fputs(prompt, stdout);
    else if (load_path && m->tokenizer)
        for (size_t i = 0; i < n_prompt; i++) print_piece(m, ids[i]);
    fflush(stdout);
    double t0 = e8kv_cli_now_s();
    if (load_path) {
        r = e8kv_context_load_cache(ctx, saved, saved_size);
        if (!e8kv_is_error(r) && r != n_prompt) {
            fprintf(stderr, "\ne8kv generate: %s holds %zu tokens, its prompt %zu\n", load_path, r, n_prompt);
            goto out;
        }
        if (e8kv_is_error(r)) {
            fprintf(stderr, "\ne8kv generate: cannot continue from %s with --kv %s, ctx %zu: %s\n", load_path, kv,
                    n_ctx, e8kv_error_name(r));
            if (e8kv_get_error_code(r) == E8KV_ERROR_SPEC && kv != sfi.spec)
                fprintf(stderr,
                        "e8kv generate: %s was saved with the spec '%s', which --kv '%s' does not match;\n"
                        "      leave out --kv to continue with the saved one\n",
                        load_path, sfi.spec, kv);
            goto out;
        }
        for (size_t i = 0; i < cfg->vocab_size; i++) {
            const uint32_t u = get_u32le(saved_logits + 4 * i);
            memcpy(&logits[i], &u, 4);
        }
    } else {
        r = e8kv_context_eval(ctx, logits, n_rows * cfg->vocab_size, ids, n_prompt, n_prompt - n_rows);
    }
    const double t_prompt = e8kv_cli_now_s() - t0;
    if (e8kv_is_error(r)) {
        fprintf(stderr, "\ne8kv generate: forward pass failed: %s\n", e8kv_error_name(r));
        goto out;
    }
    if (dump) {
        r = e8kv_file_write(dump, logits, n_rows * cfg->vocab_size * sizeof(float)); /* atomic */
        if (e8kv_is_error(r)) {
            fprintf(stderr, "e8kv generate: cannot write %s: %s\n", dump, e8kv_error_name(r));
            goto out;
        }
    }
    const float *last = logits + (n_rows - 1) * cfg->vocab_size;
    if (save_path && !save_state(ctx, save_path, ids, n_prompt, last, cfg->vocab_size)) goto out;
    const int32_t eos = m->tokenizer ? e8kv_tokenizer_eos(m->tokenizer) : -1;
    size_t n_done = 0;
    t0 = e8kv_cli_now_s();
    for (; n_done < n_gen && e8kv_context_pos(ctx) < n_ctx; n_done++) {
        const int32_t next = e8kv_sampler_sample(&smp, last);
        if (next == eos && !ignore_eos) break;
        if (m->tokenizer)
            print_piece(m, next);
        else
            printf("%d ", next);
        r = e8kv_context_eval(ctx, logits, cfg->vocab_size, &next, 1, 0);
        if (e8kv_is_error(r)) {
            fprintf(stderr, "\ne8kv generate: forward pass failed: %s\n", e8kv_error_name(r));
            goto out;
        }
        last = logits;
    }
    const double t_gen = e8kv_cli_now_s() - t0;
    printf("\n");
    fflush(stdout);
    if (n_done < n_gen && e8kv_context_pos(ctx) >= n_ctx)
        fprintf(stderr,
                "e8kv generate: stopped after %zu of %zu tokens: the context of %zu tokens is full%s\n",
                n_done, n_gen, n_ctx, n_ctx_arg ? " (--ctx)" : " (the model's)");
    fprintf(stderr,
            "e8kv generate: --kv %s: prompt %zu tokens at %.1f tok/s, generated %zu tokens at %.1f tok/s\n",
            kv, n_prompt, t_prompt > 0 ? (double)n_prompt / t_prompt : 0.0, n_done,
            t_gen > 0 ? (double)n_done / t_gen : 0.0);
    rc = 0;
out:
    e8kv_sampler_free(&smp);
    e8kv_context_free(ctx);
    free(logits);
    free(ids);
    e8kv_model_free(m);
    e8kv_calib_free(cal);
    free(saved);
    return rc;
}
