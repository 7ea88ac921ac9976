/* Helpers shared by the CLI subcommands and benchmarks: a monotonic clock and a whole-file reader. */
#include "cli_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
