/* Benchmarks behind `e8kv bench <what>`: each prints a table, or one JSON object per row with --json. */
#ifndef E8KV_BENCH_H
#define E8KV_BENCH_H

int e8kv_bench_codec(int argc, char **argv); /* bench/bench_codec.c */
int e8kv_bench_attn(int argc, char **argv);  /* bench/bench_attn.c */
int e8kv_bench_entropy(int argc, char **argv); /* bench/bench_entropy.c */

#endif
