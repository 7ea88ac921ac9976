/* Placeholder until the engine lands. */
#include "cli.h"

#include <stdio.h>

int e8kv_cmd_ppl(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "e8kv ppl: not built yet\n");
    return 1;
}
