/* Internal layout of a calibration (e8kv_calib, include/e8kv.h) shared by calib.c (statistics, eigen-
 * decomposition, serialization) and xform.c (what a cache derives from it). */
#ifndef E8KV_CALIB_H
#define E8KV_CALIB_H

#include "common/common.h"

#include <pthread.h>

/* Score-domain key transforms (xform.c) derived for one RoPE setting: built by the first cache that needs
 * them and shared, like the bases, by every later cache with the same setting. */
typedef struct {
    int rope, neox;                         /* the setting they were built for */
    double inv_freq[E8KV_MAX_HEAD_DIM / 2]; /* RoPE frequencies (rope only) */
    float *basis;                           /* (n_layer, n_head_kv, d, d) eigenbases of S·C·S (rows) */
    float *eig;                             /* (n_layer, n_head_kv, d) their eigenvalues */
    float *s;                               /* (n_layer, n_head_kv, 2, d): s, then 1/s */
} e8kv_calib_score;

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
    /* derived, not serialized: a calibration is shared by caches and threads, so built under the lock */
    pthread_mutex_t score_mu;
    e8kv_calib_score *score; /* NULL until a cache with score-domain keys asks (xform.c) */
};

void e8kv_calib_score_free(e8kv_calib_score *sc);

/* Index of the (layer, stream, head) slot; is_v 0 = K, 1 = V. */
static inline size_t e8kv_calib_slot(const struct e8kv_calib *c, size_t layer, int is_v, size_t head) {
    return (layer * 2 + (size_t)(is_v != 0)) * c->n_head_kv + head;
}

static inline const float *e8kv_calib_basis(const struct e8kv_calib *c, size_t layer, int is_v, size_t head) {
    return c->basis + e8kv_calib_slot(c, layer, is_v, head) * c->head_dim * c->head_dim;
}

#endif
