/* Placeholder until the engine lands. */
#include "cli.h"

#include <stdio.h>

int e8kv_cmd_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "e8kv generate: not built yet\n");
    return 1;
}
