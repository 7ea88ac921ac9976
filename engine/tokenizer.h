/* Tokenizers: GGUF vocabularies (GPT-2 byte-level BPE with merges and the model's pre-tokenizer;
 * SentencePiece-style BPE with scores) and llama2.c's tokenizer.bin. */
#ifndef E8KV_TOKENIZER_H
#define E8KV_TOKENIZER_H

#include "gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct e8kv_tokenizer e8kv_tokenizer;

size_t e8kv_tokenizer_from_gguf(e8kv_tokenizer **out, const e8kv_gguf *g);
size_t e8kv_tokenizer_from_llama2c(e8kv_tokenizer **out, const char *path, size_t vocab_size);
void e8kv_tokenizer_free(e8kv_tokenizer *t);

/* Encode UTF-8 text (n_bytes) into token ids. add_bos: prepend BOS when the model wants it (-1 = use
 * the vocabulary's own add_bos setting). Returns the token count (may exceed capacity: then nothing
 * past capacity is written and the caller retries with a larger buffer). */
size_t e8kv_tokenizer_encode(const e8kv_tokenizer *t, int32_t *ids, size_t capacity, const char *text,
                             size_t n_bytes, int add_bos);
/* Bytes of one token's text (raw bytes, GPT-2 byte mapping undone). Returns length; *piece points into
 * the tokenizer's storage. */
size_t e8kv_tokenizer_piece(const e8kv_tokenizer *t, int32_t id, const char **piece);
size_t e8kv_tokenizer_vocab_size(const e8kv_tokenizer *t);
int32_t e8kv_tokenizer_bos(const e8kv_tokenizer *t);
int32_t e8kv_tokenizer_eos(const e8kv_tokenizer *t);

#endif
