/* Greedy and top-p sampling (see sampler.h). Top-p keeps the most probable tokens whose cumulative
 * probability first exceeds p (Holtzman et al. 2019), renormalizes, and draws one. */
#include "sampler.h"

#include "e8kv.h"

#include <math.h>
#include <stdlib.h>


size_t e8kv_sampler_init(e8kv_sampler *s, size_t vocab_size, float temperature, float top_p, uint64_t seed) {
    if (!s || vocab_size == 0 || !(temperature >= 0.0f) || !(top_p > 0.0f && top_p <= 1.0f))
        return E8KV_ERR(BAD_ARGUMENT);
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->top_p = top_p;
    s->state = seed ? seed : 0x9E3779B97F4A7C15ull;
    s->probs = malloc(vocab_size * sizeof *s->probs);
    s->index = malloc(vocab_size * sizeof *s->index);
    if (!s->probs || !s->index) {
        e8kv_sampler_free(s);
        return E8KV_ERR(OUT_OF_MEMORY);
    }
    return 0;
}

void e8kv_sampler_free(e8kv_sampler *s) {
    if (!s) return;
    free(s->probs);
    free(s->index);
    s->probs = NULL;
    s->index = NULL;
}

static float next_uniform(e8kv_sampler *s) { /* xorshift64*, top 24 bits -> [0, 1) */
    s->state ^= s->state >> 12;
    s->state ^= s->state << 25;
    s->state ^= s->state >> 27;
    return (float)((s->state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static const float *g_probs; /* qsort has no context argument; sampling is single-threaded */
static int by_prob_desc(const void *a, const void *b) {
    const float pa = g_probs[*(const int32_t *)a], pb = g_probs[*(const int32_t *)b];
    return (pa < pb) - (pa > pb);
}

int32_t e8kv_sampler_sample(e8kv_sampler *s, const float *logits) {
    const size_t n = s->vocab_size;
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->temperature == 0.0f) return (int32_t)best;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        s->probs[i] = expf((logits[i] - logits[best]) / s->temperature);
        sum += s->probs[i];
    }
    for (size_t i = 0; i < n; i++)
        s->probs[i] = (float)(s->probs[i] / sum);
    /* candidates: drop tokens that cannot be in the nucleus, (1 - p) / (n - 1) as llama2.c does */
    const float cutoff = s->top_p < 1.0f ? (1.0f - s->top_p) / (float)(n - 1) : 0.0f;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (s->probs[i] >= cutoff) s->index[m++] = (int32_t)i;
    g_probs = s->probs;
    qsort(s->index, m, sizeof *s->index, by_prob_desc);
    double cum = 0.0;
    size_t last = m - 1;
    for (size_t i = 0; i < m; i++) {
        cum += s->probs[s->index[i]];
        if (cum > s->top_p) {
            last = i;
            break;
        }
    }
    const double r = next_uniform(s) * cum;
    double acc = 0.0;
    for (size_t i = 0; i <= last; i++) {
        acc += s->probs[s->index[i]];
        if (r < acc) return s->index[i];
    }
    return s->index[last];
}
