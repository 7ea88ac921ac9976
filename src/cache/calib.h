/* Internal layout of a calibration (e8kv_calib, include/e8kv.h) shared by calib.c (statistics, eigen-
 * decomposition, serialization) and xform.c (what a cache derives from it). */
#ifndef E8KV_CALIB_H
#define E8KV_CALIB_H

#include "../common/common.h"

struct e8kv_calib {
    size_t n_layer, n_head_kv, head_dim;
    int finalized;
    size_t *n_tok; /* (n_layer) tokens observed */
    double
        *acc; /* (n_layer, 2, n_head_kv, d, d) Σ (x − μ_seq)(x − μ_seq)ᵀ, upper triangle; NULL once final */
    float *basis; /* (n_layer, 2, n_head_kv, d, d) row i = eigenvector i (klt.h); NULL until final */
    float *eig;   /* (n_layer, 2, n_head_kv, d) eigenvalues, decreasing, clamped at 0 */
    double *sens; /* (n_layer, 2) sensitivity coefficients (e8kv_calib_set_sensitivity); NULL: none */
    /* Query energies (e8kv_calib_observe_q): what a key error costs in attention scores, per coordinate */
    double *q_acc;   /* (n_layer, n_head_kv, d) Σ q_j² over tokens and group heads; NULL: none observed */
    size_t *q_n;     /* (n_layer) query tokens observed; NULL with q_acc */
    size_t q_group;  /* query heads per KV head of the observed queries (0: none yet) */
    float *q_energy; /* (n_layer, n_head_kv, d) mean q_j² once final; NULL: the calibration has none */
};

/* Index of the (layer, stream, head) slot; is_v 0 = K, 1 = V. */
static inline size_t e8kv_calib_slot(const struct e8kv_calib *c, size_t layer, int is_v, size_t head) {
    return (layer * 2 + (size_t)(is_v != 0)) * c->n_head_kv + head;
}

static inline const float *e8kv_calib_basis(const struct e8kv_calib *c, size_t layer, int is_v, size_t head) {
    return c->basis + e8kv_calib_slot(c, layer, is_v, head) * c->head_dim * c->head_dim;
}

#endif
