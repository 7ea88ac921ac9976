/* Random-sign Sylvester–Hadamard rotation (see fwht.h). The butterfly is the textbook in-place fast
 * Walsh–Hadamard transform; the AVX2 twin lives in fwht_avx2.c and is selected at run time. */
#include "fwht.h"

#include "common/cpu.h"
#include "common/rng.h"

#include <math.h>

void e8kv_fwht_ref(float *x, size_t n) {
    for (size_t h = 1; h < n; h *= 2) {
        for (size_t i = 0; i < n; i += 2 * h) {
            for (size_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
}

static void fwht(float *x, size_t n) {
    if (n >= 8 && e8kv_cpu_has_avx2())
        e8kv_fwht_avx2(x, n);
    else
        e8kv_fwht_ref(x, n);
}

size_t e8kv_rot_init(e8kv_rot *rot, size_t head_dim, uint64_t seed) {
    if (!rot) return E8KV_ERR(BAD_ARGUMENT);
    if (head_dim == 0 || head_dim % 8 != 0 || head_dim > E8KV_MAX_HEAD_DIM) return E8KV_ERR(HEAD_DIM);
    memset(rot, 0, sizeof *rot);
    rot->head_dim = head_dim;
    size_t rest = head_dim;
    while (rest) {
        size_t b = 1;
        while (b * 2 <= rest) b *= 2;
        assert(rot->n_block < E8KV_ROT_MAX_BLOCKS); /* at most popcount(512 - 8) blocks */
        rot->block_len[rot->n_block++] = b;
        rest -= b;
    }
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed ^ 0x8e8e8e8e8e8e8e8eull);
    for (size_t i = 0; i < head_dim; i++) rot->signs[i] = (e8kv_rng_next(&rng) >> 63) ? -1.0f : 1.0f;
    return 0;
}

/* The normalized Hadamard transform of every power-of-two block of one vector (its own inverse). */
static void hadamard_blocks(const e8kv_rot *rot, float *xv) {
    size_t off = 0;
    for (size_t b = 0; b < rot->n_block; b++) {
        const size_t n = rot->block_len[b];
        fwht(xv + off, n);
        const float s = 1.0f / sqrtf((float)n);
        for (size_t i = 0; i < n; i++) xv[off + i] *= s;
        off += n;
    }
}

void e8kv_rot_forward(const e8kv_rot *rot, float *x, size_t n_vec) {
    for (size_t v = 0; v < n_vec; v++) {
        float *const xv = x + v * rot->head_dim;
        for (size_t i = 0; i < rot->head_dim; i++) xv[i] *= rot->signs[i];
        hadamard_blocks(rot, xv);
    }
}

void e8kv_rot_inverse(const e8kv_rot *rot, float *x, size_t n_vec) {
    /* the block's 1/sqrt(n) and the sign in one multiply: x * (s * ±1) = (x * s) * ±1 exactly */
    float scale[E8KV_MAX_HEAD_DIM];
    for (size_t b = 0, off = 0; b < rot->n_block; off += rot->block_len[b++]) {
        const float s = 1.0f / sqrtf((float)rot->block_len[b]);
        for (size_t i = 0; i < rot->block_len[b]; i++) scale[off + i] = s * rot->signs[off + i];
    }
    if (e8kv_cpu_has_avx2()) {
        e8kv_rot_inverse_avx2(rot, x, n_vec, scale);
        return;
    }
    for (size_t v = 0; v < n_vec; v++) {
        float *const xv = x + v * rot->head_dim;
        for (size_t b = 0, off = 0; b < rot->n_block; off += rot->block_len[b++])
            e8kv_fwht_ref(xv + off, rot->block_len[b]);
        for (size_t i = 0; i < rot->head_dim; i++) xv[i] *= scale[i];
    }
}
