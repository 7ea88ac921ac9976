/* Tokenizers: GGUF vocabularies (GPT-2 byte-level BPE with merges and the model's pre-tokenizer;
 * SentencePiece-style BPE with scores) and llama2.c's tokenizer.bin. */
#ifndef E8KV_TOKENIZER_H
#define E8KV_TOKENIZER_H

#include "gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct e8kv_tokenizer e8kv_tokenizer;

/* Token types (GGUF tokenizer.ggml.token_type; 0 is read as normal). */
enum {
    E8KV_TOKEN_NORMAL = 1,
    E8KV_TOKEN_UNKNOWN = 2,
    E8KV_TOKEN_CONTROL = 3,
    E8KV_TOKEN_USER_DEFINED = 4,
    E8KV_TOKEN_UNUSED = 5,
    E8KV_TOKEN_BYTE = 6
};

/* A vocabulary given as arrays: what the loaders below build, and what tests build by hand. Texts are as
 * the model stores them: GPT-2 byte-mapped for "gpt2"; SentencePiece pieces for "llama", with U+2581 for a
 * space when spm_escaped is 1 (GGUF) or plain spaces when 0 (llama2.c). Everything is copied.
 *  - "gpt2": byte-level BPE with ranked merges ("left right"), after the pre-tokenizer `pre`: "gpt2" or
 *    "gpt-2" (the GPT-2 regex) or "smollm" (every \p{N} character on its own, then the GPT-2 regex, as
 *    Hugging Face's Sequence[Digits(individual_digits), ByteLevel]); other names are
 *    E8KV_ERROR_UNSUPPORTED. CONTROL and USER_DEFINED tokens are matched in the text as whole tokens
 *    (leftmost, longest first).
 *  - "llama": SentencePiece BPE: merge the adjacent pair whose piece has the highest score (leftmost on
 *    ties) until none is in the vocabulary; characters left unknown become <0xXX> byte tokens (or unk).
 *    USER_DEFINED tokens are matched whole; a space is prepended when add_space_prefix (no whitespace
 *    normalization: runs of spaces are kept, as llama2.c and llama.cpp do). */
typedef struct {
    const char *model; /* "gpt2" or "llama" */
    const char *pre;   /* gpt2 only */
    size_t n_vocab;
    const char *const *tokens; /* n_vocab texts, not NUL-terminated */
    const size_t *token_lens;
    const float *scores;        /* n_vocab; required for "llama", ignored for "gpt2" */
    const int32_t *token_types; /* n_vocab E8KV_TOKEN_*; NULL = all normal */
    size_t n_merges;            /* gpt2: merges in rank order */
    const char *const *merges;
    const size_t *merge_lens;
    int32_t bos, eos, unk; /* -1 when the vocabulary has none */
    int add_bos;           /* default for encode(add_bos = -1) */
    int add_space_prefix;  /* llama */
    int spm_escaped;       /* llama: texts use U+2581 for a space */
} e8kv_tokenizer_vocab;

/* Errors: E8KV_ERROR_BAD_ARGUMENT (missing arrays, zero vocabulary), _UNSUPPORTED (model or pre-tokenizer
 * name), _CORRUPTED (special id out of range, a merge without a space, a SentencePiece vocabulary with
 * neither byte tokens nor unk), _OUT_OF_MEMORY. Bytes a byte-level vocabulary has no token for are dropped
 * from the text (as Hugging Face does without an unk token). */
size_t e8kv_tokenizer_create(e8kv_tokenizer **out, const e8kv_tokenizer_vocab *v);
/* Reads tokenizer.ggml.{model, pre, tokens, scores, token_type, merges, bos_token_id, eos_token_id,
 * unknown_token_id, add_bos_token, add_space_prefix}. A missing pre-tokenizer for "gpt2" is
 * E8KV_ERROR_UNSUPPORTED (no silent fallback). */
size_t e8kv_tokenizer_from_gguf(e8kv_tokenizer **out, const e8kv_gguf *g);
/* llama2.c tokenizer.bin: int32 max_token_length, then per token float32 score, int32 len, len bytes (all
 * little-endian). vocab_size must match the file exactly (0 = as many as the file holds). BOS = 1, EOS = 2,
 * unk = 0, BOS added by default, a space prepended. Errors: E8KV_ERROR_IO, _TRUNCATED (file ends inside a
 * record or before vocab_size tokens), _CORRUPTED (negative or over-long length, non-finite score,
 * max_token_length <= 0), _SRC_SIZE (bytes left after vocab_size tokens). */
size_t e8kv_tokenizer_from_llama2c(e8kv_tokenizer **out, const char *path, size_t vocab_size);
/* The same over a buffer. */
size_t e8kv_tokenizer_from_llama2c_buffer(e8kv_tokenizer **out, const void *data, size_t n_bytes,
                                          size_t vocab_size);
void e8kv_tokenizer_free(e8kv_tokenizer *t);

/* Encode UTF-8 text (n_bytes) into token ids. Invalid UTF-8 is accepted (each bad byte is a character of
 * its own). The tokenizer is not modified: calls from several threads at once are fine (scratch is
 * allocated per call, about 21 bytes per input byte; E8KV_ERROR_OUT_OF_MEMORY when that fails). add_bos: prepend BOS when the model wants it (-1 = use
 * the vocabulary's own add_bos setting). Returns the token count (may exceed capacity: then nothing
 * past capacity is written and the caller retries with a larger buffer). */
size_t e8kv_tokenizer_encode(const e8kv_tokenizer *t, int32_t *ids, size_t capacity, const char *text,
                             size_t n_bytes, int add_bos);
/* How many bytes of the text a byte-level vocabulary has no token for (encode drops them, as Hugging Face
 * does without an unk token); 0 for SentencePiece vocabularies, where byte tokens or unk stand in. Lets
 * callers warn that text was lost. */
size_t e8kv_tokenizer_unknown_bytes(const e8kv_tokenizer *t, const char *text, size_t n_bytes);
/* Bytes of one token's text (raw bytes, GPT-2 byte mapping undone, U+2581 turned back into a space,
 * <0xXX> byte tokens to their byte; a leading space is NOT stripped). Returns length; *piece points into
 * the tokenizer's storage (not NUL-terminated). Bad id: E8KV_ERROR_BAD_ARGUMENT. */
size_t e8kv_tokenizer_piece(const e8kv_tokenizer *t, int32_t id, const char **piece);
size_t e8kv_tokenizer_vocab_size(const e8kv_tokenizer *t);
int32_t e8kv_tokenizer_bos(const e8kv_tokenizer *t);
int32_t e8kv_tokenizer_eos(const e8kv_tokenizer *t);

#endif
