/* e8kv tokenize: print the token ids of a text with a GGUF model's tokenizer or a llama2.c tokenizer.bin.
 * Ids go to stdout, one per line; with -0 every NUL-separated part of the input is tokenized on its own
 * and printed as one line of space-separated ids (how tests/py_tokenizer.py checks many strings in one
 * run). The token count and speed go to stderr. */
#include "cli.h"
#include "cli_util.h"
#include "model.h"
#include "e8kv.h"
#include "gguf.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WHO "e8kv tokenize"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: e8kv tokenize [-m MODEL.gguf | --llama2c-tokenizer TOK.bin [--vocab-size N]]\n"
        "                     (-f FILE | -p TEXT) [options]\n\n"
        "  -m MODEL.gguf          tokenizer of a GGUF model (only its metadata is read); default\n"
        "                         $E8KV_MODEL, else $E8KV_CACHE_DIR or ~/.cache/e8kv/" E8KV_DEFAULT_MODEL_NAME
        "\n"
        "  --llama2c-tokenizer F  llama2.c tokenizer.bin (SentencePiece BPE with scores)\n"
        "  --vocab-size N         tokens in that file (must match it; default: all it holds)\n"
        "  -f FILE                text to tokenize (UTF-8; '-' reads stdin)\n"
        "  -p TEXT                text given on the command line\n"
        "  --no-bos / --bos       never / always prepend BOS (default: the vocabulary's own setting;\n"
        "                         SmolLM2: none, llama2.c: BOS)\n"
        "  -0                     the input holds NUL-separated texts: one output line per text,\n"
        "                         ids separated by spaces\n"
        "  --pieces               print 'id<TAB>piece' per token (piece bytes C-escaped: \\\\, \\n, \\t,\n"
        "                         other bytes below 32 or above 126 as \\xNN)\n\n"
        "Output: token ids on stdout, one per line; count and tokens/s on stderr.\n");
}

static void print_piece(const e8kv_tokenizer *t, int32_t id) {
    const char *p;
    const size_t n = e8kv_tokenizer_piece(t, id, &p);
    printf("%d\t", (int)id);
    if (e8kv_is_error(n)) {
        printf("?\n");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)p[i];
        if (c == '\\')
            printf("\\\\");
        else if (c == '\n')
            printf("\\n");
        else if (c == '\t')
            printf("\\t");
        else if (c < 32 || c >= 127) /* control and high bytes: pieces may be parts of a UTF-8 character */
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('\n');
}

/* Tokenize one text into *ids (grown as needed). Returns the count or the tokenizer's error; *oom is set
 * (and 0 returned) when the ids cannot grow. */
static size_t encode(const e8kv_tokenizer *t, int32_t **ids, size_t *cap, const char *text, size_t n,
                     int add_bos, int *oom) {
    for (;;) {
        const size_t r = e8kv_tokenizer_encode(t, *ids, *cap, text, n, add_bos);
        if (e8kv_is_error(r) || r <= *cap) return r;
        int32_t *nb = realloc(*ids, r * sizeof *nb);
        if (!nb) return *oom = 1, 0;
        *ids = nb;
        *cap = r;
    }
}

int e8kv_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *l2c = NULL, *file = NULL, *prompt = NULL;
    size_t vocab_size = 0;
    int add_bos = -1, nul_split = 0, pieces = 0, bos = 0, no_bos = 0;
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_STR("-m", &model),
        E8KV_OPT_STR("--llama2c-tokenizer", &l2c),
        E8KV_OPT_SIZE("--vocab-size", &vocab_size, 1, INT32_MAX),
        E8KV_OPT_STR("-f", &file),
        E8KV_OPT_STR("-p", &prompt),
        E8KV_OPT_FLAG("--no-bos", &no_bos),
        E8KV_OPT_FLAG("--bos", &bos),
        E8KV_OPT_FLAG("-0", &nul_split),
        E8KV_OPT_FLAG("--pieces", &pieces),
    };
    const int pr = e8kv_cli_parse(WHO, usage, argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (pr >= 0) return pr;
    if (bos && no_bos) return e8kv_cli_usage_error(WHO, "--bos and --no-bos exclude each other");
    if (bos || no_bos) add_bos = bos;
    if ((!file) == (!prompt) || (model && l2c)) {
        return e8kv_cli_usage_error(
            WHO, "give exactly one of -f / -p, and at most one of -m / --llama2c-tokenizer");
    }

    /* the tokenizer */
    const double t_load = e8kv_cli_now_s();
    e8kv_tokenizer *tok = NULL;
    e8kv_gguf *g = NULL;
    size_t r;
    char path[4096];
    if (l2c) {
        r = e8kv_tokenizer_from_llama2c(&tok, l2c, vocab_size);
        snprintf(path, sizeof path, "%s", l2c);
    } else {
        if (model) {
            snprintf(path, sizeof path, "%s", model);
        } else if (e8kv_is_error(e8kv_model_default_path(path, sizeof path))) {
            fprintf(stderr, "e8kv tokenize: the default model path is too long\n");
            return 1;
        }
        FILE *probe = fopen(path, "rb");
        if (!probe) {
            if (model) {
                fprintf(stderr, "e8kv tokenize: cannot open model '%s'\n", path);
            } else {
                fprintf(stderr,
                        "e8kv tokenize: no model given and the default model is missing (%s).\n"
                        "      Run scripts/fetch_model.sh to download it, or pass -m MODEL.gguf.\n",
                        path);
            }
            return 1;
        }
        fclose(probe);
        r = e8kv_gguf_open(&g, path);
        if (!e8kv_is_error(r)) r = e8kv_tokenizer_from_gguf(&tok, g);
    }
    if (e8kv_is_error(r)) {
        fprintf(stderr, "e8kv tokenize: cannot load the tokenizer of '%s': %s\n", path, e8kv_error_name(r));
        e8kv_gguf_close(g);
        return 1;
    }
    const double load_s = e8kv_cli_now_s() - t_load;

    /* the text */
    size_t n_text = 0;
    char *text = NULL;
    if (file) {
        text = e8kv_cli_read_all(file, &n_text);
        if (!text) {
            fprintf(stderr, "e8kv tokenize: cannot read '%s'\n", file);
            e8kv_tokenizer_free(tok);
            e8kv_gguf_close(g);
            return 1;
        }
    } else {
        n_text = strlen(prompt);
        text = malloc(n_text + 1);
        if (text) memcpy(text, prompt, n_text + 1);
    }

    int status = 0;
    int32_t *ids = NULL;
    size_t cap = 0, total = 0, n_texts = 0;
    double enc_s = 0;
    for (size_t start = 0; text && start <= n_text;) {
        size_t end = n_text;
        if (nul_split) {
            const char *z = memchr(text + start, 0, n_text - start);
            if (z) end = (size_t)(z - text);
        }
        e8kv_cli_warn_unknown_bytes(tok, text + start, end - start, WHO);
        const double t0 = e8kv_cli_now_s();
        int oom = 0;
        r = encode(tok, &ids, &cap, text + start, end - start, add_bos, &oom);
        enc_s += e8kv_cli_now_s() - t0;
        if (oom || e8kv_is_error(r)) {
            fprintf(stderr, "e8kv tokenize: %s\n",
                    oom ? e8kv_error_code_name(E8KV_ERROR_OUT_OF_MEMORY) : e8kv_error_name(r));
            status = 1;
            break;
        }
        for (size_t i = 0; i < r; i++) {
            if (pieces)
                print_piece(tok, ids[i]);
            else if (nul_split)
                printf(i ? " %d" : "%d", (int)ids[i]);
            else
                printf("%d\n", (int)ids[i]);
        }
        if (nul_split && !pieces) putchar('\n');
        total += r;
        n_texts++;
        if (!nul_split || end == n_text) break;
        start = end + 1;
    }
    if (!text) {
        fprintf(stderr, "e8kv tokenize: out of memory\n");
        status = 1;
    }
    if (!status)
        fprintf(stderr,
                "e8kv tokenize: %zu tokens from %zu bytes (%zu text%s) in %.3f s = %.0f tokens/s "
                "(tokenizer load %.3f s)\n",
                total, n_text, n_texts, n_texts == 1 ? "" : "s", enc_s,
                enc_s > 0 ? (double)total / enc_s : 0.0, load_s);
    free(ids);
    free(text);
    e8kv_tokenizer_free(tok);
    e8kv_gguf_close(g);
    return status;
}
