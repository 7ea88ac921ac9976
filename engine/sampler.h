/* Next-token sampling: greedy (temperature 0), or temperature + nucleus (top-p) sampling with a seeded
 * xorshift64* generator, after llama2.c's sampler. */
#ifndef E8KV_SAMPLER_H
#define E8KV_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    size_t vocab_size;
    float temperature; /* 0 = greedy */
    float top_p;       /* in (0, 1]; 1 = plain temperature sampling */
    uint64_t state;    /* rng */
    float *probs;      /* (vocab_size) scratch */
    int32_t *index;    /* (vocab_size) scratch */
} e8kv_sampler;

/* 0 or E8KV_ERROR_BAD_ARGUMENT (vocab 0, temperature < 0, top_p outside (0, 1]) / _OUT_OF_MEMORY. */
size_t e8kv_sampler_init(e8kv_sampler *s, size_t vocab_size, float temperature, float top_p, uint64_t seed);
void e8kv_sampler_free(e8kv_sampler *s);
/* Pick the next token from one row of logits (not modified). */
int32_t e8kv_sampler_sample(e8kv_sampler *s, const float *logits);

#endif
