/* e8kv: the command-line tool. Dispatches to subcommands; see `e8kv help`. */
#include "cli.h"
#include "e8kv.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "e8kv %s: E8 lattice compression of transformer KV caches\n\n"
            "usage: e8kv <command> [options]\n\n"
            "commands:\n"
            "  ppl       perplexity / KLD / top-1 of a model with a given KV-cache format\n"
            "  generate  streaming text generation\n"
            "  recall    passkey retrieval through a compressed (evicted) cache\n"
            "  calibrate measure a model's K/V statistics for the e8t formats (transform coding)\n"
            "  tokenize  print the token ids of a text (checked against the reference tokenizer)\n"
            "  bench     benchmarks: `e8kv bench codec`, `e8kv bench attn`, `e8kv bench entropy`\n"
            "  compress / decompress / info   entropy-coded frames of K/V dumps and saved caches\n"
            "  version   print the version\n\n"
            "`e8kv <command> --help` shows a command's options.\n",
            e8kv_version_string());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "ppl")) return e8kv_cmd_ppl(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return e8kv_cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return e8kv_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return e8kv_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "calibrate")) return e8kv_cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(cmd, "compress")) return e8kv_cmd_compress(argc - 1, argv + 1);
    if (!strcmp(cmd, "decompress")) return e8kv_cmd_decompress(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return e8kv_cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "recall")) return e8kv_cmd_recall(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("e8kv %s\n", e8kv_version_string());
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "e8kv: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
