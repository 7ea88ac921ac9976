/* `e8kv bench <what>`: dispatch to the benchmark families. */
#include "bench.h"
#include "cli.h"

#include <stdio.h>
#include <string.h>

int e8kv_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: e8kv bench codec [options]   rate-distortion and speed of every codec\n"
                "       e8kv bench attn  [options]   decode attention over the KV cache\n"
                "       e8kv bench entropy [options] cold tier: rANS/zstd frames, ECLQ at e8:4's MSE\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "codec")) return e8kv_bench_codec(argc - 1, argv + 1);
    if (!strcmp(argv[1], "attn")) return e8kv_bench_attn(argc - 1, argv + 1);
    if (!strcmp(argv[1], "entropy")) return e8kv_bench_entropy(argc - 1, argv + 1);
    fprintf(stderr, "e8kv bench: unknown benchmark '%s'\n", argv[1]);
    return 2;
}
