/* Subcommands of the e8kv CLI; each lives in its own file and returns a process exit status. */
#ifndef E8KV_CLI_H
#define E8KV_CLI_H

int e8kv_cmd_bench(int argc, char **argv);      /* bench/bench_main.c */
int e8kv_cmd_ppl(int argc, char **argv);        /* tools/cmd_ppl.c */
int e8kv_cmd_generate(int argc, char **argv);   /* tools/cmd_generate.c */
int e8kv_cmd_tokenize(int argc, char **argv);   /* tools/cmd_tokenize.c */
int e8kv_cmd_calibrate(int argc, char **argv);  /* tools/cmd_calibrate.c */
int e8kv_cmd_compress(int argc, char **argv);   /* tools/cmd_compress.c */
int e8kv_cmd_decompress(int argc, char **argv); /* tools/cmd_compress.c */
int e8kv_cmd_info(int argc, char **argv);       /* tools/cmd_compress.c */
int e8kv_cmd_recall(int argc, char **argv);     /* tools/cmd_recall.c */

#endif
