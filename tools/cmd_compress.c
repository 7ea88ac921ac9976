/* Placeholder until this subcommand lands. */
#include "cli.h"

#include <stdio.h>

int e8kv_cmd_compress(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "e8kv %s: not built yet\n", argv[0]);
    return 1;
}

int e8kv_cmd_decompress(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "e8kv %s: not built yet\n", argv[0]);
    return 1;
}

int e8kv_cmd_info(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "e8kv %s: not built yet\n", argv[0]);
    return 1;
}
