/* Placeholder until this subcommand lands. */
#include "cli.h"

#include <stdio.h>

int e8kv_cmd_tokenize(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "e8kv %s: not built yet\n", argv[0]);
    return 1;
}
