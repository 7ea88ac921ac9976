/* Small helpers shared by the CLI subcommands and benchmarks (tools/ and bench/). */
#ifndef E8KV_CLI_UTIL_H
#define E8KV_CLI_UTIL_H

#include "e8kv.h"
#include "model.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------- the option parser of every subcommand
 * Options are looked up in a table; a value is the next argument (whatever it starts with). Numbers are
 * parsed strictly: the whole argument, decimal digits only (seeds also 0x hex), no sign, no spaces, no
 * overflow, inside the option's range; anything else is a named error and exit status 2, never a
 * silent default or a wrapped unsigned. Arguments that do not start with '-' (and "-" itself, and every
 * argument after "--") are positional. */
typedef enum {
    E8KV_OPT_FLAG,  /* int *: set to 1 */
    E8KV_OPT_STR,   /* const char **: the next argument */
    E8KV_OPT_LIST,  /* e8kv_cli_list *: the next argument appended (repeatable option) */
    E8KV_OPT_SIZE,  /* size_t *: a whole number in [lo, hi] */
    E8KV_OPT_U64,   /* uint64_t *: a whole number (decimal or 0x hex) in [lo, hi] */
    E8KV_OPT_INT,   /* int *: a whole number in [lo, hi] (hi <= INT_MAX) */
    E8KV_OPT_FLOAT, /* float *: a finite decimal number in [flo, fhi] */
} e8kv_opt_kind;

typedef struct {
    const char *name;  /* "--ctx" */
    const char *alias; /* another spelling ("-h"), or NULL */
    e8kv_opt_kind kind;
    void *dst;
    uint64_t lo, hi; /* integer kinds */
    double flo, fhi; /* E8KV_OPT_FLOAT */
} e8kv_cli_opt;

#define E8KV_OPT_FLAG(n, d)                                                                                  \
    { n, NULL, E8KV_OPT_FLAG, d, 0, 0, 0, 0 }
#define E8KV_OPT_STR(n, d)                                                                                   \
    { n, NULL, E8KV_OPT_STR, d, 0, 0, 0, 0 }
#define E8KV_OPT_LIST(n, d)                                                                                  \
    { n, NULL, E8KV_OPT_LIST, d, 0, 0, 0, 0 }
#define E8KV_OPT_SIZE(n, d, lo, hi)                                                                          \
    { n, NULL, E8KV_OPT_SIZE, d, lo, hi, 0, 0 }
#define E8KV_OPT_U64(n, d)                                                                                   \
    { n, NULL, E8KV_OPT_U64, d, 0, UINT64_MAX, 0, 0 }
#define E8KV_OPT_INT(n, d, lo, hi)                                                                           \
    { n, NULL, E8KV_OPT_INT, d, lo, hi, 0, 0 }
#define E8KV_OPT_FLOAT(n, d, lo, hi)                                                                         \
    { n, NULL, E8KV_OPT_FLOAT, d, 0, 0, lo, hi }
/* --threads N: 0 = every online CPU (at most E8KV_MAX_THREADS), else 1 .. E8KV_MAX_THREADS */
#define E8KV_OPT_THREADS(d) E8KV_OPT_INT("--threads", d, 0, E8KV_MAX_THREADS)

/* The values of a repeatable option, in order (malloc'd; e8kv_cli_list_free). */
typedef struct {
    const char **v;
    size_t n, cap;
} e8kv_cli_list;
void e8kv_cli_list_free(e8kv_cli_list *l);

/* A command's table, name ("e8kv ppl") and usage text printer; pos receives at most max_pos positional
 * arguments (their count in *n_pos). "-h"/"--help" print the usage on stdout. Returns -1 to go on, else
 * the exit status: 0 after --help, 2 after an error (printed on stderr with the option named). */
int e8kv_cli_parse(const char *who, void (*usage)(FILE *), int argc, char **argv, const e8kv_cli_opt *opts,
                   size_t n_opts, const char **pos, size_t max_pos, size_t *n_pos);
/* The same strict number rules for a value found some other way (one item of a list): 1 if s is a
 * whole decimal number in [lo, hi], else 0 with a message naming `what`. */
int e8kv_cli_parse_size(const char *who, const char *what, const char *s, size_t lo, size_t hi, size_t *out);
/* The formats of a list option (ppl --kv, bench attn --kv). The one rule: the values of a repeated option
 * and the parts of a value between ';' are separate formats; a part without '=' is a list of codec specs
 * and preset names separated by ',' ("f16,q4_0h,e8:4"); a part with '=' is one cache spec, passed to the
 * library unchanged ("k=e8:4,v=e8:3,sink=1"). The cache grammar takes a codec spec or preset only as its
 * first item, so a comma-separated list of them is never one valid spec and no valid spec is ever split;
 * "f16,e8:4,sink=1" is an error, never read as something else. dflt (may be NULL) when no value is given.
 * Returns 1 or 0 with a message. */
typedef struct {
    const char **v; /* n formats, pointing into buf */
    size_t n;
    char *buf;
} e8kv_cli_specs;
int e8kv_cli_split_specs(e8kv_cli_specs *out, const char *who, const char *const *vals, size_t n_vals,
                         const char *dflt);
/* Appends one more format (not copied); 1 or 0 when out of memory. */
int e8kv_cli_specs_add(e8kv_cli_specs *s, const char *spec);
void e8kv_cli_specs_free(e8kv_cli_specs *s);
/* 1 when spec fits the library's limit (E8KV_CACHE_SPEC_MAX_LEN characters), else 0 with a message
 * naming the option; specs are never cut. */
int e8kv_cli_check_spec(const char *who, const char *opt, const char *spec);

/* 1 when a and b name the same existing file (same device and inode: also through symbolic or hard
 * links). */
int e8kv_cli_same_file(const char *a, const char *b);

/* s as a JSON string (quotes included, '"', '\\' and control bytes escaped) on f. */
void e8kv_cli_json_string(FILE *f, const char *s);

/* --threads as given, or the online CPUs (at most E8KV_MAX_THREADS) for 0. */
int e8kv_cli_threads(int n_threads);
/* Prints "WHO: MESSAGE [error name]" on stderr and returns 2 (a usage error: a bad option or value). */
int e8kv_cli_usage_error(const char *who, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Seconds on the monotonic clock. */
double e8kv_cli_now_s(void);
/* The whole file ("-" = standard input) in a malloc'd buffer with one extra NUL byte after the
 * n_bytes read; NULL when it cannot be opened or read. */
char *e8kv_cli_read_all(const char *path, size_t *n_bytes);

/* The model at `arg`, or the default model when arg is NULL; its path goes to path (capacity cap). Prints
 * the reason (and how to fetch the default) and returns NULL on failure. */
e8kv_model *e8kv_cli_load_model(const char *arg, char *path, size_t cap);
/* Token ids of a whole text (BOS in front when the vocabulary adds it), malloc'd; NULL with a message. */
int32_t *e8kv_cli_tokenize(const e8kv_model *m, const char *text, size_t n_bytes, size_t *n_tok, const char *who);
/* Warns on stderr when bytes of the text have no token in the vocabulary (the tokenizer drops them). */
void e8kv_cli_warn_unknown_bytes(const e8kv_tokenizer *t, const char *text, size_t n_bytes, const char *who);
/* Prints why a cache spec could not be used (err from context or cache creation), with a hint at
 * e8kv calibrate / --calib when the spec names a calibrated format and no calibration was loaded. */
void e8kv_cli_spec_error(const char *who, const char *spec, size_t err, int have_calib);
/* Where the calibration of the model at model_path lives by default: "<model_path>.e8cal". */
void e8kv_cli_calib_path(char *dst, size_t cap, const char *model_path);
/* The calibration for the e8t formats: --calib `arg` if given (a failure to load it is an error: *failed
 * = 1), else $E8KV_CALIB, else the model's default path when that file exists (unreadable: a warning).
 * NULL when there is none. Says on stderr which calibration it uses (path and the text it was made from,
 * e8kv_cli_calib_source) or that there is none; its path goes to `used` (capacity used_cap; "" for none;
 * used may be NULL). */
e8kv_calib *e8kv_cli_load_calib(const char *arg, const char *model_path, const char *who, int *failed,
                                char *used, size_t used_cap);
/* Writes "<calib_path>.info": a header line, file_xxh64= (the checksum that ends the calibration file, so
 * that the info is known to describe that file), then `body` (key=value lines: text=, ctx=, chunks=,
 * probe= ...). Atomic. 1 on success. */
int e8kv_cli_calib_info_write(const char *calib_path, const char *body);
/* What "<calib_path>.info" says of the calibration's text, in words, to dst; 1 when the info is there and
 * describes this very file, 0 otherwise (dst then says why it is unknown). */
int e8kv_cli_calib_source(const char *calib_path, char *dst, size_t cap);
/* For each spec that starts with a preset which has a calibrated form: prints on stderr what it means
 * here, the calibrated spec, or its uncalibrated fallback and why. */
void e8kv_cli_note_presets(const char *who, const char *const *specs, size_t n_specs, const e8kv_calib *cal);

#endif
