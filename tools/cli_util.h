/* Small helpers shared by the CLI subcommands and benchmarks (tools/ and bench/). */
#ifndef E8KV_CLI_UTIL_H
#define E8KV_CLI_UTIL_H

#include <stddef.h>

/* Seconds on the monotonic clock. */
double e8kv_cli_now_s(void);
/* The whole file ("-" = standard input) in a malloc'd buffer with one extra NUL byte after the
 * n_bytes read; NULL when it cannot be opened or read. */
char *e8kv_cli_read_all(const char *path, size_t *n_bytes);

#endif
