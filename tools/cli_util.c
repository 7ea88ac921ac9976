/* Helpers shared by the CLI subcommands and benchmarks: a monotonic clock, a whole-file reader, model,
 * text and calibration loading with the messages every command prints alike. */
#include "cli_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double e8kv_cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *e8kv_cli_read_all(const char *path, size_t *n_bytes) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) { /* keep room for the terminating NUL */
            char *nb = realloc(buf, 2 * cap);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        const size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                free(buf);
                buf = NULL;
            }
            break;
        }
    }
    if (f != stdin) fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    *n_bytes = n;
    return buf;
}

e8kv_model *e8kv_cli_load_model(const char *arg, char *path, size_t cap) {
    if (arg) {
        snprintf(path, cap, "%s", arg);
    } else if (e8kv_is_error(e8kv_model_default_path(path, cap)) || access(path, R_OK) != 0) {
        fprintf(stderr,
                "e8kv: no model given and the default model is missing (%s).\n"
                "      Run scripts/fetch_model.sh to download it (about 93 MB), or pass -m MODEL.\n",
                path);
        return NULL;
    }
    char msg[512];
    e8kv_model *m = NULL;
    const size_t r = e8kv_model_load(&m, path, msg, sizeof msg);
    if (e8kv_is_error(r)) {
        fprintf(stderr, "e8kv: cannot load model: %s [%s]\n", msg, e8kv_error_name(r));
        return NULL;
    }
    return m;
}

int32_t *e8kv_cli_tokenize(const e8kv_model *m, const char *text, size_t n_bytes, size_t *n_tok,
                           const char *who) {
    if (!m->tokenizer) {
        fprintf(stderr, "%s: the model has no tokenizer\n", who);
        return NULL;
    }
    size_t cap = n_bytes + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    n = ids ? e8kv_tokenizer_encode(m->tokenizer, ids, cap, text, n_bytes, -1) : 0;
    if (ids && !e8kv_is_error(n) && n > cap) { /* cannot happen for byte-level vocabularies; be safe */
        free(ids);
        cap = n;
        ids = malloc(cap * sizeof *ids);
        n = ids ? e8kv_tokenizer_encode(m->tokenizer, ids, cap, text, n_bytes, -1) : 0;
    }
    if (!ids || e8kv_is_error(n)) {
        fprintf(stderr, "%s: tokenization failed: %s\n", who, ids ? e8kv_error_name(n) : "out of memory");
        free(ids);
        return NULL;
    }
    *n_tok = n;
    return ids;
}

void e8kv_cli_calib_path(char *dst, size_t cap, const char *model_path) {
    snprintf(dst, cap, "%s.e8cal", model_path);
}

e8kv_calib *e8kv_cli_load_calib(const char *arg, const char *model_path, const char *who, int *failed) {
    *failed = 0;
    char path[4200];
    const char *env = getenv("E8KV_CALIB");
    int explicit_path = 1;
    if (arg)
        snprintf(path, sizeof path, "%s", arg);
    else if (env && env[0])
        snprintf(path, sizeof path, "%s", env);
    else {
        e8kv_cli_calib_path(path, sizeof path, model_path);
        if (access(path, R_OK) != 0) return NULL;
        explicit_path = 0;
    }
    size_t err = 0;
    e8kv_calib *cal = e8kv_calib_load_file(path, &err);
    if (!cal) {
        fprintf(stderr, "%s: %s calibration %s: %s%s\n", who,
                explicit_path ? "cannot load the" : "ignoring the", path, e8kv_error_name(err),
                explicit_path ? "" : " (run e8kv calibrate again)");
        *failed = explicit_path;
        return NULL;
    }
    size_t n_layer = 0, n_tok = 0;
    e8kv_calib_info(cal, &n_layer, NULL, NULL, &n_tok);
    fprintf(stderr, "%s: calibration %s (%zu layers, %zu tokens per layer)\n", who, path, n_layer, n_tok);
    return cal;
}
