/* Placeholder until this subcommand lands. */
#include "bench.h"

#include <stdio.h>

int e8kv_bench_codec(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "e8kv %s: not built yet\n", argv[0]);
    return 1;
}
