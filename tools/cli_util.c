/* Helpers shared by the CLI subcommands and benchmarks: a monotonic clock, a whole-file reader, model,
 * text and calibration loading with the messages every command prints alike. */
#include "cli_util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int e8kv_cli_usage_error(const char *who, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", who);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " [%s]\n", e8kv_error_code_name(E8KV_ERROR_BAD_ARGUMENT));
    va_end(ap);
    return 2;
}

/* A whole unsigned number: decimal digits only, or "0x" and hex digits when hex is allowed; no sign, no
 * space, no overflow. */
static int parse_u64(const char *s, int hex, uint64_t *out) {
    int base = 10;
    if (hex && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    if (!s[0]) return 0;
    for (const char *c = s; *c; c++)
        if (base == 10 ? !(*c >= '0' && *c <= '9') : !isxdigit((unsigned char)*c)) return 0;
    errno = 0;
    char *end = NULL;
    const unsigned long long v = strtoull(s, &end, base);
    if (errno || *end) return 0;
    *out = (uint64_t)v;
    return 1;
}

static int number_error(const char *who, const char *what, const char *s, uint64_t lo, uint64_t hi) {
    if (hi == UINT64_MAX || hi == SIZE_MAX)
        return e8kv_cli_usage_error(who, "%s '%s': expected a whole number >= %llu", what, s,
                                    (unsigned long long)lo);
    return e8kv_cli_usage_error(who, "%s '%s': expected a whole number from %llu to %llu", what, s,
                                (unsigned long long)lo, (unsigned long long)hi);
}

int e8kv_cli_parse_size(const char *who, const char *what, const char *s, size_t lo, size_t hi, size_t *out) {
    uint64_t v = 0;
    if (!parse_u64(s, 0, &v) || v < lo || v > hi) return number_error(who, what, s, lo, hi), 0;
    *out = (size_t)v;
    return 1;
}

int e8kv_cli_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void e8kv_cli_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

int e8kv_cli_threads(int n_threads) {
    if (n_threads > 0) return n_threads;
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > E8KV_MAX_THREADS ? E8KV_MAX_THREADS : (int)n;
}

void e8kv_cli_list_free(e8kv_cli_list *l) {
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

static int set_value(const char *who, const e8kv_cli_opt *o, const char *val) {
    uint64_t u = 0;
    switch (o->kind) {
    case E8KV_OPT_STR:
        *(const char **)o->dst = val;
        return 1;
    case E8KV_OPT_LIST: {
        e8kv_cli_list *l = o->dst;
        if (l->n == l->cap) {
            const size_t cap = l->cap ? 2 * l->cap : 8;
            const char **nv = realloc(l->v, cap * sizeof *nv);
            if (!nv) return e8kv_cli_usage_error(who, "out of memory"), 0;
            l->v = nv;
            l->cap = cap;
        }
        l->v[l->n++] = val;
        return 1;
    }
    case E8KV_OPT_SIZE:
    case E8KV_OPT_U64:
    case E8KV_OPT_INT:
        if (!parse_u64(val, o->kind == E8KV_OPT_U64, &u) || u < o->lo || u > o->hi)
            return number_error(who, o->name, val, o->lo, o->hi), 0;
        if (o->kind == E8KV_OPT_SIZE)
            *(size_t *)o->dst = (size_t)u;
        else if (o->kind == E8KV_OPT_U64)
            *(uint64_t *)o->dst = u;
        else
            *(int *)o->dst = (int)u;
        return 1;
    case E8KV_OPT_FLOAT: {
        char *end = NULL;
        errno = 0;
        const double v = strtod(val, &end);
        if (!val[0] || isspace((unsigned char)val[0]) || *end || errno || !isfinite(v) || v < o->flo ||
            v > o->fhi)
            return e8kv_cli_usage_error(who, "%s '%s': expected a number from %g to %g", o->name, val, o->flo,
                                        o->fhi),
                   0;
        *(float *)o->dst = (float)v;
        return 1;
    }
    case E8KV_OPT_FLAG:
        break;
    }
    return 0;
}

int e8kv_cli_parse(const char *who, void (*usage)(FILE *), int argc, char **argv, const e8kv_cli_opt *opts,
                   size_t n_opts, const char **pos, size_t max_pos, size_t *n_pos) {
    size_t np = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            usage(stdout);
            return 0;
        }
        if (!only_pos && !strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (only_pos || a[0] != '-' || !a[1]) {
            if (np == max_pos) {
                e8kv_cli_usage_error(who, "unexpected argument '%s'", a);
                fprintf(stderr, "(`%s --help` lists the options)\n", who);
                return 2;
            }
            pos[np++] = a;
            continue;
        }
        const e8kv_cli_opt *o = NULL;
        for (size_t k = 0; k < n_opts && !o; k++)
            if (!strcmp(a, opts[k].name) || (opts[k].alias && !strcmp(a, opts[k].alias))) o = &opts[k];
        if (!o) {
            e8kv_cli_usage_error(who, "unknown option '%s'", a);
            fprintf(stderr, "(`%s --help` lists the options)\n", who);
            return 2;
        }
        if (o->kind == E8KV_OPT_FLAG) {
            *(int *)o->dst = 1;
            continue;
        }
        if (i + 1 >= argc) return e8kv_cli_usage_error(who, "%s needs a value", a);
        if (!set_value(who, o, argv[++i])) return 2;
    }
    if (n_pos) *n_pos = np;
    return -1;
}

void e8kv_cli_specs_free(e8kv_cli_specs *s) {
    free(s->v);
    free(s->buf);
    memset(s, 0, sizeof *s);
}

int e8kv_cli_specs_add(e8kv_cli_specs *s, const char *spec) {
    const char **nv = realloc(s->v, (s->n + 1) * sizeof *nv);
    if (!nv) return 0;
    s->v = nv;
    s->v[s->n++] = spec;
    return 1;
}

int e8kv_cli_split_specs(e8kv_cli_specs *out, const char *who, const char *const *vals, size_t n_vals,
                         const char *dflt) {
    memset(out, 0, sizeof *out);
    size_t total = 1;
    for (size_t i = 0; i < n_vals; i++)
        total += strlen(vals[i]) + 1;
    if (!(out->buf = malloc(total))) return fprintf(stderr, "%s: out of memory\n", who), 0;
    char *p = out->buf;
    for (size_t i = 0; i < n_vals; i++) {
        const size_t len = strlen(vals[i]);
        memcpy(p, vals[i], len + 1);
        char *const end = p + len;
        for (char *part = p; part <= end;) {
            char *semi = memchr(part, ';', (size_t)(end - part));
            if (!semi) semi = end;
            *semi = 0;
            const int whole = strchr(part, '=') != NULL;
            for (char *item = part; item <= semi;) {
                char *comma = whole ? NULL : memchr(item, ',', (size_t)(semi - item));
                if (!comma) comma = semi;
                *comma = 0;
                if (!*item) {
                    e8kv_cli_usage_error(who,
                                         "empty format in '%s' (formats are separated by ';', or by ','"
                                         " when none has '=')",
                                         vals[i]);
                    return e8kv_cli_specs_free(out), 0;
                }
                if (!e8kv_cli_specs_add(out, item))
                    return fprintf(stderr, "%s: out of memory\n", who), e8kv_cli_specs_free(out), 0;
                item = comma + 1;
            }
            part = semi + 1;
        }
        p = end + 1;
    }
    if (out->n == 0 && dflt && !e8kv_cli_specs_add(out, dflt))
        return fprintf(stderr, "%s: out of memory\n", who), e8kv_cli_specs_free(out), 0;
    return 1;
}

int e8kv_cli_check_spec(const char *who, const char *opt, const char *spec) {
    const size_t n = strlen(spec);
    if (n <= E8KV_CACHE_SPEC_MAX_LEN) return 1;
    fprintf(stderr, "%s: %s: a spec of %zu characters; the longest the library takes is %d [%s]\n", who, opt,
            n, E8KV_CACHE_SPEC_MAX_LEN, e8kv_error_code_name(E8KV_ERROR_SPEC));
    return 0;
}

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
    e8kv_cli_warn_unknown_bytes(m->tokenizer, text, n_bytes, who);
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

void e8kv_cli_warn_unknown_bytes(const e8kv_tokenizer *t, const char *text, size_t n_bytes, const char *who) {
    const size_t n = e8kv_tokenizer_unknown_bytes(t, text, n_bytes);
    if (n)
        fprintf(stderr,
                "%s: warning: %zu byte%s of the text ha%s no token in the vocabulary and %s left out\n", who,
                n, n == 1 ? "" : "s", n == 1 ? "s" : "ve", n == 1 ? "is" : "are");
}

void e8kv_cli_spec_error(const char *who, const char *spec, size_t err, int have_calib) {
    fprintf(stderr, "%s: cannot use --kv '%s': %s\n", who, spec, e8kv_error_name(err));
    /* e8t, e8tv and auto= formats code in a calibrated basis (include/e8kv.h) */
    if (!have_calib && e8kv_get_error_code(err) == E8KV_ERROR_SPEC && strstr(spec, "e8t"))
        fprintf(stderr,
                "%s: the e8t/e8tv formats need a calibration of the model: run `e8kv calibrate -f TEXT`\n"
                "      (it writes MODEL.e8cal, used by default) or pass --calib FILE\n",
                who);
    /* center=rope turns K's centre by the RoPE the keys already carry (include/e8kv.h): keys after RoPE, so
     * neither rope=pre nor the calibrated K formats (calibrated before RoPE), and the model's RoPE */
    if (e8kv_get_error_code(err) == E8KV_ERROR_SPEC && strstr(spec, "center=rope"))
        fprintf(stderr,
                "%s: center=rope centres keys coded after RoPE (rope=post) on 8 RoPE pairs: it needs a model\n"
                "      with RoPE and head_dim >= 16, and does not go with rope=pre or calibrated K formats\n"
                "      (e8t/e8tv, auto=)\n",
                who);
}

void e8kv_cli_calib_path(char *dst, size_t cap, const char *model_path) {
    snprintf(dst, cap, "%s.e8cal", model_path);
}

/* The 8-byte checksum that ends a calibration file (doc/format.md §5), as 16 hex digits: what its
 * .info names it by. 0 when the file cannot be read. */
static int calib_tag(const char *path, char hex[17]) {
    FILE *f = fopen(path, "rb");
    unsigned char t[8];
    const int ok = f && fseek(f, -8, SEEK_END) == 0 && fread(t, 1, 8, f) == 8;
    if (f) fclose(f);
    for (int i = 0; ok && i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", t[7 - i]);
    return ok;
}

int e8kv_cli_calib_info_write(const char *calib_path, const char *body) {
    char hex[17], path[4200], tmp[4300];
    if (!calib_tag(calib_path, hex)) return 0;
    snprintf(path, sizeof path, "%s.info", calib_path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return 0;
    const int ok = fprintf(f, "e8kv calibration info 1\nfile_xxh64=%s\n%s", hex, body) > 0;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        remove(tmp);
        return 0;
    }
    return 1;
}

/* The value of "key=" in an .info text, copied to dst (cap bytes); 0 when absent. */
static int info_value(const char *info, const char *key, char *dst, size_t cap) {
    const size_t kl = strlen(key);
    for (const char *l = info; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, key, kl) && l[kl] == '=') {
            const char *v = l + kl + 1, *e = strchr(v, '\n');
            const size_t n = e ? (size_t)(e - v) : strlen(v);
            snprintf(dst, cap, "%.*s", (int)(n < cap ? n : cap - 1), v);
            return 1;
        }
    return 0;
}

int e8kv_cli_calib_source(const char *calib_path, char *dst, size_t cap) {
    char path[4200], hex[17], tag[32], text[1024], ctx[32], chunks[32], probe[80];
    snprintf(path, sizeof path, "%s.info", calib_path);
    size_t n = 0;
    char *info = e8kv_cli_read_all(path, &n);
    if (!info) {
        snprintf(dst, cap, "the text it was made from is not recorded (no %s)", path);
        return 0;
    }
    int ok =
        calib_tag(calib_path, hex) && info_value(info, "file_xxh64", tag, sizeof tag) && !strcmp(tag, hex);
    if (!ok)
        snprintf(dst, cap, "%s belongs to another file: the text it was made from is unknown", path);
    else if (!info_value(info, "text", text, sizeof text))
        snprintf(dst, cap, "the text it was made from is not recorded in %s", path), ok = 0;
    else {
        if (!info_value(info, "ctx", ctx, sizeof ctx)) snprintf(ctx, sizeof ctx, "?");
        if (!info_value(info, "chunks", chunks, sizeof chunks)) snprintf(chunks, sizeof chunks, "?");
        if (!info_value(info, "probe", probe, sizeof probe)) snprintf(probe, sizeof probe, "?");
        snprintf(dst, cap, "made from %s, %s chunks of %s tokens, probes %s", text, chunks, ctx, probe);
    }
    free(info);
    return ok;
}

e8kv_calib *e8kv_cli_load_calib(const char *arg, const char *model_path, const char *who, int *failed,
                                char *used, size_t used_cap) {
    *failed = 0;
    if (used && used_cap) used[0] = 0;
    char path[4200];
    const char *env = getenv("E8KV_CALIB");
    int explicit_path = 1;
    if (arg)
        snprintf(path, sizeof path, "%s", arg);
    else if (env && env[0])
        snprintf(path, sizeof path, "%s", env);
    else {
        e8kv_cli_calib_path(path, sizeof path, model_path);
        explicit_path = 0;
        if (access(path, R_OK) != 0) {
            fprintf(stderr,
                    "%s: calibration: none (no --calib, no $E8KV_CALIB, no %s; scripts/calibrate_model.sh "
                    "makes the default model's, e8kv calibrate any model's)\n",
                    who, path);
            return NULL;
        }
    }
    size_t err = 0;
    e8kv_calib *cal = e8kv_calib_load_file(path, &err);
    if (!cal) {
        fprintf(stderr, "%s: %s calibration %s: %s%s\n", who,
                explicit_path ? "cannot load the" : "calibration: none; ignoring the", path,
                e8kv_error_name(err),
                explicit_path ? "" : " (scripts/calibrate_model.sh or e8kv calibrate makes it again)");
        *failed = explicit_path;
        return NULL;
    }
    size_t n_layer = 0, n_tok = 0;
    e8kv_calib_info(cal, &n_layer, NULL, NULL, &n_tok);
    char src[1400];
    e8kv_cli_calib_source(path, src, sizeof src);
    fprintf(stderr, "%s: calibration %s (%zu layers, %zu tokens per layer; %s)\n", who, path, n_layer, n_tok,
            src);
    if (used && used_cap) snprintf(used, used_cap, "%s", path);
    return cal;
}

void e8kv_cli_note_presets(const char *who, const char *const *specs, size_t n_specs, const e8kv_calib *cal) {
    for (size_t i = 0; i < n_specs; i++) {
        const size_t len = strcspn(specs[i], ",");
        char name[32];
        if (len >= sizeof name) continue;
        snprintf(name, sizeof name, "%.*s", (int)len, specs[i]);
        const char *plain = e8kv_cache_preset_spec(name), *mine = e8kv_cache_preset_spec_calib(name, cal);
        if (!plain || !mine) continue;
        if (mine != plain)
            fprintf(stderr, "%s: preset %s = %s (calibrated)\n", who, name, mine);
        else if (strstr(plain, "e8t"))
            continue; /* a calibrated preset with no fallback (evict-*): the spec error says why */
        else
            fprintf(stderr, "%s: preset %s = %s, the uncalibrated fallback: %s\n", who, name, plain,
                    cal ? "the calibration has no sensitivities (auto= needs them)" : "no calibration");
    }
}
