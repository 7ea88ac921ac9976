/* Placeholder until the codec benchmark lands. */
#include "cli.h"

#include <stdio.h>

int e8kv_cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "e8kv bench: not built yet\n");
    return 1;
}
