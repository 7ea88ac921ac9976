/* Quantization for E8 frames (entropy-coded lattice quantization, ECLQ, with int16 output): the codec's seeded random-sign Hadamard
 * rotation (transform/fwht.h), then the closest E8 point to x / step (quant/lattice.h), stored as int16
 * doubled coordinates for the parity-aware rANS coder. A uniform step is the optimal entropy-coded
 * quantizer at high rate (Gish & Pierce 1968); E8's normalized second moment puts it at 1.224x D(R).
 * It lives in quant/ (which may use transform/ and entropy/), so that entropy/ needs nothing but common/. */
#include "lattice.h"

#include "transform/fwht.h"

#include <math.h>

static size_t check_args(const void *dst, const void *src, size_t n_vec, size_t head_dim, float step) {
    if ((!dst || !src) && n_vec) return E8KV_ERR(BAD_ARGUMENT);
    if (!(step > 0.0f) || !isfinite(step)) return E8KV_ERR(BAD_ARGUMENT);
    if (head_dim == 0 || head_dim % 8 || head_dim > E8KV_MAX_HEAD_DIM) return E8KV_ERR(HEAD_DIM);
    if (n_vec > SIZE_MAX / head_dim / sizeof(float)) return E8KV_ERR(BAD_ARGUMENT);
    return 0;
}

size_t e8kv_frame_e8_quantize(int16_t *dst, size_t dst_capacity, const float *src, size_t n_vec,
                              size_t head_dim, float step, uint64_t seed) {
    E8KV_RETURN_IF_ERROR(check_args(dst, src, n_vec, head_dim, step));
    if (dst_capacity < n_vec * head_dim) return E8KV_ERR(DST_TOO_SMALL);
    if (!e8kv_all_finite(src, n_vec * head_dim)) return E8KV_ERR(NONFINITE);
    e8kv_rot rot;
    E8KV_RETURN_IF_ERROR(e8kv_rot_init(&rot, head_dim, seed));
    const float inv = 1.0f / step;
    float x[E8KV_MAX_HEAD_DIM];
    for (size_t v = 0; v < n_vec; v++) {
        memcpy(x, src + v * head_dim, head_dim * sizeof(float));
        e8kv_rot_forward(&rot, x, 1);
        for (size_t b = 0; b < head_dim; b += 8) {
            float xs[8];
            int32_t y2[8];
            for (int j = 0; j < 8; j++) xs[j] = x[b + j] * inv;
            for (int j = 0; j < 8; j++)
                if (fabsf(xs[j]) > 16000.0f) return E8KV_ERR(RANGE); /* keeps 2·y within int16 */
            e8kv_e8_nearest(y2, xs);
            for (int j = 0; j < 8; j++) dst[v * head_dim + b + j] = (int16_t)y2[j];
        }
    }
    return n_vec * head_dim;
}

size_t e8kv_frame_e8_dequantize(float *dst, size_t dst_capacity, const int16_t *src, size_t n_vec,
                                size_t head_dim, float step, uint64_t seed) {
    E8KV_RETURN_IF_ERROR(check_args(dst, src, n_vec, head_dim, step));
    if (dst_capacity < n_vec * head_dim) return E8KV_ERR(DST_TOO_SMALL);
    e8kv_rot rot;
    E8KV_RETURN_IF_ERROR(e8kv_rot_init(&rot, head_dim, seed));
    const float half = 0.5f * step;
    for (size_t k = 0; k < n_vec * head_dim; k++) dst[k] = half * (float)src[k];
    e8kv_rot_inverse(&rot, dst, n_vec);
    return n_vec * head_dim;
}
