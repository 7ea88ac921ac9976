/* Small helpers shared by the CLI subcommands and benchmarks (tools/ and bench/). */
#ifndef E8KV_CLI_UTIL_H
#define E8KV_CLI_UTIL_H

#include "e8kv.h"
#include "model.h"

#include <stddef.h>
#include <stdint.h>

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
/* Where the calibration of the model at model_path lives by default: "<model_path>.e8cal". */
void e8kv_cli_calib_path(char *dst, size_t cap, const char *model_path);
/* The calibration for the e8t formats: --calib `arg` if given (a failure to load it is an error: *failed
 * = 1), else $E8KV_CALIB, else the model's default path when that file exists (unreadable: a warning).
 * NULL when there is none. */
e8kv_calib *e8kv_cli_load_calib(const char *arg, const char *model_path, const char *who, int *failed);

#endif
