/* Calibration for transform coding (include/e8kv.h, "calibration"): per layer, KV head and stream the
 * covariance of sequence-centred vectors, accumulated in double, then its eigenbasis by cyclic Jacobi
 * (transform/klt.c); optionally the queries' per-coordinate energies E[q_j²] per layer and KV head (what a
 * key error costs in attention scores, xform.c); serialization (doc/format.md §5) with every field read
 * through the little-endian helpers, the size implied by the header checked against the real size before
 * anything is allocated, and the bases checked orthonormal on load. */
#include "calib.h"

#include "transform/klt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#define CALIB_MAGIC "E8KVCALB"
#define CALIB_HEADER_BYTES 32
#define CALIB_MAX_LAYERS 4096
#define CALIB_MAX_HEADS 4096
/* a stored basis must be orthonormal within this (max |PPᵀ − I|) */
#define CALIB_ORTHO_TOL 1e-3
/* version 3 header flags: which optional sections follow the bases (versions 1 and 2: flags = 0) */
#define CALIB_FLAG_SENS 1u
#define CALIB_FLAG_QUERY 2u

_Static_assert(CALIB_HEADER_BYTES == 8 + 4 * 6, "§5 header size");

static size_t n_slots(const e8kv_calib *c) {
    return c->n_layer * 2 * c->n_head_kv;
}

e8kv_calib *e8kv_calib_create(size_t n_layer, size_t n_head_kv, size_t head_dim, size_t *err) {
    size_t e = 0;
    if (!n_layer || !n_head_kv || n_layer > CALIB_MAX_LAYERS || n_head_kv > CALIB_MAX_HEADS)
        e = E8KV_ERR(BAD_ARGUMENT);
    else if (!head_dim || head_dim % 8 || head_dim > E8KV_MAX_HEAD_DIM)
        e = E8KV_ERR(HEAD_DIM);
    e8kv_calib *c = NULL;
    if (!e) {
        c = calloc(1, sizeof *c);
        if (c && pthread_mutex_init(&c->score_mu, NULL)) {
            free(c);
            c = NULL;
        }
        if (c) {
            c->n_layer = n_layer;
            c->n_head_kv = n_head_kv;
            c->head_dim = head_dim;
            c->n_tok = calloc(n_layer, sizeof *c->n_tok);
            c->acc = calloc(n_slots(c) * head_dim * head_dim, sizeof *c->acc);
            c->eig = calloc(n_slots(c) * head_dim, sizeof *c->eig);
        }
        if (!c || !c->n_tok || !c->acc || !c->eig) {
            e8kv_calib_free(c);
            c = NULL;
            e = E8KV_ERR(OUT_OF_MEMORY);
        }
    }
    if (err) *err = e;
    return c;
}

void e8kv_calib_free(e8kv_calib *cal) {
    if (!cal) return;
    free(cal->n_tok);
    free(cal->acc);
    free(cal->basis);
    free(cal->eig);
    free(cal->sens);
    free(cal->q_acc);
    free(cal->q_n);
    free(cal->q_energy);
    e8kv_calib_score_free(cal->score);
    pthread_mutex_destroy(&cal->score_mu);
    free(cal);
}

/* S += Σ_t (x_t − μ)(x_t − μ)ᵀ (upper triangle) for one head's stream; x rows of `stride` floats. */
static void accumulate(double *S, const float *x, size_t stride, size_t n_tok, size_t d) {
    double mu[E8KV_MAX_HEAD_DIM] = {0}, t[E8KV_MAX_HEAD_DIM];
    for (size_t i = 0; i < n_tok; i++)
        for (size_t j = 0; j < d; j++)
            mu[j] += x[i * stride + j];
    for (size_t j = 0; j < d; j++)
        mu[j] /= (double)n_tok;
    for (size_t i = 0; i < n_tok; i++) {
        for (size_t j = 0; j < d; j++)
            t[j] = (double)x[i * stride + j] - mu[j];
        for (size_t a = 0; a < d; a++) {
            double *const row = S + a * d;
            const double ta = t[a];
            for (size_t b = a; b < d; b++)
                row[b] += ta * t[b];
        }
    }
}

size_t e8kv_calib_observe(e8kv_calib *cal, size_t layer, const float *k, const float *v, size_t n_tok) {
    if (!cal || !k || !v || n_tok < 2 || cal->finalized) return E8KV_ERR(BAD_ARGUMENT);
    if (layer >= cal->n_layer) return E8KV_ERR(DIMENSION);
    const size_t d = cal->head_dim, stride = cal->n_head_kv * d;
    if (!e8kv_all_finite(k, n_tok * stride) || !e8kv_all_finite(v, n_tok * stride))
        return E8KV_ERR(NONFINITE);
    for (size_t h = 0; h < cal->n_head_kv; h++)
        for (int is_v = 0; is_v < 2; is_v++)
            accumulate(cal->acc + e8kv_calib_slot(cal, layer, is_v, h) * d * d, (is_v ? v : k) + h * d,
                       stride, n_tok, d);
    cal->n_tok[layer] += n_tok;
    return cal->n_tok[layer];
}

size_t e8kv_calib_observe_q(e8kv_calib *cal, size_t layer, const float *q, size_t n_head, size_t n_tok) {
    if (!cal || !q || !n_tok || cal->finalized) return E8KV_ERR(BAD_ARGUMENT);
    if (layer >= cal->n_layer || !n_head || n_head % cal->n_head_kv) return E8KV_ERR(DIMENSION);
    const size_t d = cal->head_dim, g = n_head / cal->n_head_kv;
    if (cal->q_group && cal->q_group != g) return E8KV_ERR(DIMENSION);
    if (!e8kv_all_finite(q, n_tok * n_head * d)) return E8KV_ERR(NONFINITE);
    if (!cal->q_acc) {
        cal->q_acc = calloc(cal->n_layer * cal->n_head_kv * d, sizeof *cal->q_acc);
        cal->q_n = calloc(cal->n_layer, sizeof *cal->q_n);
        if (!cal->q_acc || !cal->q_n) {
            free(cal->q_acc);
            free(cal->q_n);
            cal->q_acc = NULL;
            cal->q_n = NULL;
            return E8KV_ERR(OUT_OF_MEMORY);
        }
    }
    cal->q_group = g;
    /* query head hq scores the keys of KV head hq / g (GQA) */
    for (size_t t = 0; t < n_tok; t++)
        for (size_t hq = 0; hq < n_head; hq++) {
            const float *const x = q + (t * n_head + hq) * d;
            double *const acc = cal->q_acc + (layer * cal->n_head_kv + hq / g) * d;
            for (size_t j = 0; j < d; j++)
                acc[j] += (double)x[j] * x[j];
        }
    cal->q_n[layer] += n_tok;
    return cal->q_n[layer];
}

size_t e8kv_calib_finalize(e8kv_calib *cal) {
    if (!cal || cal->finalized) return E8KV_ERR(BAD_ARGUMENT);
    for (size_t l = 0; l < cal->n_layer; l++)
        if (cal->n_tok[l] < 2 || (cal->q_n && !cal->q_n[l])) return E8KV_ERR(BAD_ARGUMENT);
    const size_t d = cal->head_dim;
    if (cal->q_acc) {
        const size_t nq = cal->n_layer * cal->n_head_kv * d;
        cal->q_energy = malloc(nq * sizeof *cal->q_energy);
        if (!cal->q_energy) return E8KV_ERR(OUT_OF_MEMORY);
        for (size_t i = 0; i < nq; i++)
            cal->q_energy[i] =
                (float)(cal->q_acc[i] / ((double)cal->q_n[i / (cal->n_head_kv * d)] * cal->q_group));
    }
    float *basis = malloc(n_slots(cal) * d * d * sizeof *basis);
    double *a = malloc(d * d * sizeof *a), *w = malloc(d * sizeof *w), *vec = malloc(d * d * sizeof *vec);
    size_t r = (!basis || !a || !w || !vec) ? E8KV_ERR(OUT_OF_MEMORY) : 0;
    for (size_t s = 0; s < n_slots(cal) && !e8kv_is_error(r); s++) {
        const double *S = cal->acc + s * d * d;
        const double n = (double)cal->n_tok[s / (2 * cal->n_head_kv)];
        for (size_t i = 0; i < d; i++)
            for (size_t j = i; j < d; j++)
                a[i * d + j] = a[j * d + i] = S[i * d + j] / n;
        r = e8kv_sym_eigen(a, d, w, vec);
        for (size_t i = 0; i < d && !e8kv_is_error(r); i++) {
            cal->eig[s * d + i] = w[i] > 0.0 ? (float)w[i] : 0.0f;
            for (size_t j = 0; j < d; j++)
                basis[(s * d + i) * d + j] = (float)vec[i * d + j];
        }
    }
    free(a);
    free(w);
    free(vec);
    if (e8kv_is_error(r)) {
        free(basis);
        free(cal->q_energy);
        cal->q_energy = NULL;
        return r;
    }
    cal->basis = basis;
    free(cal->acc);
    free(cal->q_acc);
    cal->acc = NULL;
    cal->q_acc = NULL;
    cal->finalized = 1;
    return 0;
}

size_t e8kv_calib_info(const e8kv_calib *cal, size_t *n_layer, size_t *n_head_kv, size_t *head_dim,
                       size_t *n_tokens) {
    if (!cal) return E8KV_ERR(BAD_ARGUMENT);
    if (n_layer) *n_layer = cal->n_layer;
    if (n_head_kv) *n_head_kv = cal->n_head_kv;
    if (head_dim) *head_dim = cal->head_dim;
    if (n_tokens) *n_tokens = cal->n_tok[0];
    return 0;
}

const float *e8kv_calib_eigenvalues(const e8kv_calib *cal, size_t layer, int is_v, size_t head) {
    if (!cal || !cal->finalized || layer >= cal->n_layer || head >= cal->n_head_kv) return NULL;
    return cal->eig + e8kv_calib_slot(cal, layer, is_v, head) * cal->head_dim;
}

size_t e8kv_calib_set_sensitivity(e8kv_calib *cal, size_t layer, int is_v, double c) {
    if (!cal || !cal->finalized || !(c >= 0.0) || !isfinite(c)) return E8KV_ERR(BAD_ARGUMENT);
    if (layer >= cal->n_layer) return E8KV_ERR(DIMENSION);
    if (!cal->sens) {
        cal->sens = calloc(2 * cal->n_layer, sizeof *cal->sens);
        if (!cal->sens) return E8KV_ERR(OUT_OF_MEMORY);
    }
    cal->sens[2 * layer + (is_v != 0)] = c;
    return 0;
}

const float *e8kv_calib_query_energy(const e8kv_calib *cal, size_t layer, size_t head) {
    if (!cal || !cal->q_energy || layer >= cal->n_layer || head >= cal->n_head_kv) return NULL;
    return cal->q_energy + (layer * cal->n_head_kv + head) * cal->head_dim;
}

double e8kv_calib_sensitivity(const e8kv_calib *cal, size_t layer, int is_v) {
    if (!cal || !cal->sens || layer >= cal->n_layer) return -1.0;
    return cal->sens[2 * layer + (is_v != 0)];
}

void e8kv_calib_score_free(e8kv_calib_score *sc) {
    if (!sc) return;
    free(sc->basis);
    free(sc->eig);
    free(sc->s);
    free(sc);
}

size_t e8kv_calib_bytes(const e8kv_calib *cal) {
    if (!cal || !cal->finalized) return 0;
    const size_t d = cal->head_dim, n_kh = cal->n_layer * cal->n_head_kv;
    pthread_mutex_t *const mu = &((e8kv_calib *)(uintptr_t)cal)->score_mu; /* the lock is not state */
    pthread_mutex_lock(mu);
    const size_t score = cal->score ? sizeof *cal->score + n_kh * d * (d + 3) * sizeof(float) : 0;
    pthread_mutex_unlock(mu);
    return sizeof *cal + n_slots(cal) * d * (d + 1) * sizeof(float) + cal->n_layer * sizeof(size_t) +
           (cal->sens ? 2 * cal->n_layer * sizeof(double) : 0) +
           (cal->q_energy ? n_kh * d * sizeof(float) : 0) + score;
}

/* ---------------------------------------------------------------- serialization (doc/format.md §5) */

/* The optional sections of a file: version 2 has the sensitivities, version 3 says in its flags. */
static unsigned sections_of(int version, unsigned flags) {
    return version == 3 ? flags : version == 2 ? CALIB_FLAG_SENS : 0u;
}

/* Total serialized size for these dimensions (no overflow: dims bounded by the create/load checks): the
 * sensitivities are 2·n_layer f64, the query energies n_layer·n_head_kv·d f32. */
static size_t serialized_size(size_t n_layer, size_t n_head_kv, size_t d, unsigned sections) {
    const size_t slots = n_layer * 2 * n_head_kv;
    return CALIB_HEADER_BYTES + 8 * n_layer + slots * 4 * d * (d + 1) +
           (sections & CALIB_FLAG_SENS ? 16 * n_layer : 0) +
           (sections & CALIB_FLAG_QUERY ? 4 * n_layer * n_head_kv * d : 0) + 8;
}

/* files without query energies keep versions 1 and 2 (and their bytes) */
static int version_of(const e8kv_calib *cal) {
    return cal->q_energy ? 3 : cal->sens ? 2 : 1;
}

static unsigned flags_of(const e8kv_calib *cal) {
    return cal->q_energy ? CALIB_FLAG_QUERY | (cal->sens ? CALIB_FLAG_SENS : 0u) : 0u;
}

size_t e8kv_calib_save_bound(const e8kv_calib *cal) {
    if (!cal || !cal->finalized) return E8KV_ERR(BAD_ARGUMENT);
    return serialized_size(cal->n_layer, cal->n_head_kv, cal->head_dim,
                           sections_of(version_of(cal), flags_of(cal)));
}

size_t e8kv_calib_save(void *dst, size_t dst_capacity, const e8kv_calib *cal) {
    if (!dst || !cal || !cal->finalized) return E8KV_ERR(BAD_ARGUMENT);
    const int version = version_of(cal);
    const unsigned flags = flags_of(cal), sections = sections_of(version, flags);
    const size_t d = cal->head_dim, total = serialized_size(cal->n_layer, cal->n_head_kv, d, sections);
    if (dst_capacity < total) return E8KV_ERR(DST_TOO_SMALL);
    uint8_t *const out = dst, *p = out;
    memcpy(p, CALIB_MAGIC, 8);
    e8kv_store_le32(p + 8, (uint32_t)version);
    e8kv_store_le32(p + 12, (uint32_t)cal->n_layer);
    e8kv_store_le32(p + 16, (uint32_t)cal->n_head_kv);
    e8kv_store_le32(p + 20, (uint32_t)d);
    e8kv_store_le32(p + 24, flags);
    e8kv_store_le32(p + 28, 0);
    p += CALIB_HEADER_BYTES;
    for (size_t l = 0; l < cal->n_layer; l++, p += 8)
        e8kv_store_le64(p, cal->n_tok[l]);
    for (size_t s = 0; s < n_slots(cal); s++) {
        for (size_t i = 0; i < d; i++, p += 4)
            e8kv_store_lef32(p, cal->eig[s * d + i]);
        for (size_t i = 0; i < d * d; i++, p += 4)
            e8kv_store_lef32(p, cal->basis[s * d * d + i]);
    }
    for (size_t i = 0; (sections & CALIB_FLAG_SENS) && i < 2 * cal->n_layer; i++, p += 8) {
        uint64_t u;
        memcpy(&u, &cal->sens[i], 8);
        e8kv_store_le64(p, u);
    }
    for (size_t i = 0; (sections & CALIB_FLAG_QUERY) && i < cal->n_layer * cal->n_head_kv * d; i++, p += 4)
        e8kv_store_lef32(p, cal->q_energy[i]);
    e8kv_store_le64(p, XXH64(out, (size_t)(p - out), 0));
    return total;
}

/* max |P Pᵀ − I| over the entries, in double */
static double ortho_error(const float *P, size_t d) {
    double worst = 0.0;
    for (size_t i = 0; i < d; i++)
        for (size_t j = i; j < d; j++) {
            double s = 0.0;
            for (size_t k = 0; k < d; k++)
                s += (double)P[i * d + k] * P[j * d + k];
            const double e = fabs(s - (i == j ? 1.0 : 0.0));
            if (e > worst) worst = e;
        }
    return worst;
}

e8kv_calib *e8kv_calib_load(const void *src, size_t src_size, size_t *err) {
    const uint8_t *const in = src;
    size_t e = 0;
    e8kv_calib *c = NULL;
    if (!src)
        e = E8KV_ERR(BAD_ARGUMENT);
    else if (src_size < 12)
        e = E8KV_ERR(TRUNCATED);
    else if (memcmp(in, CALIB_MAGIC, 8))
        e = E8KV_ERR(CORRUPTED);
    else if (e8kv_load_le32(in + 8) < 1 || e8kv_load_le32(in + 8) > E8KV_CALIB_FORMAT_VERSION)
        e = E8KV_ERR(VERSION);
    else if (src_size < CALIB_HEADER_BYTES + 8)
        e = E8KV_ERR(TRUNCATED);
    if (!e) {
        const size_t n_layer = e8kv_load_le32(in + 12), n_head_kv = e8kv_load_le32(in + 16),
                     d = e8kv_load_le32(in + 20);
        const int version = (int)e8kv_load_le32(in + 8);
        const unsigned flags = e8kv_load_le32(in + 24);
        /* version 3 has the query energies, and the sensitivities when its flags say so */
        const int flags_ok = version == 3 ? (flags & ~CALIB_FLAG_SENS) == CALIB_FLAG_QUERY : flags == 0;
        if (!n_layer || n_layer > CALIB_MAX_LAYERS || !n_head_kv || n_head_kv > CALIB_MAX_HEADS || !d ||
            d % 8 || d > E8KV_MAX_HEAD_DIM || !flags_ok || e8kv_load_le32(in + 28))
            e = E8KV_ERR(CORRUPTED);
        const unsigned sections = sections_of(version, flags);
        const size_t total = e ? 0 : serialized_size(n_layer, n_head_kv, d, sections);
        if (!e && src_size < total)
            e = E8KV_ERR(TRUNCATED);
        else if (!e && src_size > total)
            e = E8KV_ERR(CORRUPTED);
        if (!e && XXH64(in, total - 8, 0) != e8kv_load_le64(in + total - 8)) e = E8KV_ERR(CHECKSUM);
        if (!e) {
            c = e8kv_calib_create(n_layer, n_head_kv, d, &e);
            if (c) {
                free(c->acc);
                c->acc = NULL;
                c->basis = malloc(n_slots(c) * d * d * sizeof *c->basis);
                if (!c->basis) e = E8KV_ERR(OUT_OF_MEMORY);
            }
        }
        const uint8_t *p = in + CALIB_HEADER_BYTES;
        for (size_t l = 0; !e && l < n_layer; l++, p += 8) {
            const uint64_t n = e8kv_load_le64(p);
            if (n < 2 || n > SIZE_MAX / 2)
                e = E8KV_ERR(CORRUPTED);
            else
                c->n_tok[l] = (size_t)n;
        }
        for (size_t s = 0; !e && s < n_slots(c); s++) {
            float *const ev = c->eig + s * d, *const P = c->basis + s * d * d;
            for (size_t i = 0; i < d; i++, p += 4)
                ev[i] = e8kv_load_lef32(p);
            for (size_t i = 0; i < d * d; i++, p += 4)
                P[i] = e8kv_load_lef32(p);
            if (!e8kv_all_finite(ev, d) || !e8kv_all_finite(P, d * d)) e = E8KV_ERR(CORRUPTED);
            for (size_t i = 0; !e && i < d; i++)
                if (ev[i] < 0.0f || (i && ev[i] > ev[i - 1])) e = E8KV_ERR(CORRUPTED);
            if (!e && ortho_error(P, d) > CALIB_ORTHO_TOL) e = E8KV_ERR(CORRUPTED);
        }
        if (!e && (sections & CALIB_FLAG_SENS)) {
            c->sens = malloc(2 * n_layer * sizeof *c->sens);
            if (!c->sens) e = E8KV_ERR(OUT_OF_MEMORY);
        }
        for (size_t i = 0; !e && (sections & CALIB_FLAG_SENS) && i < 2 * n_layer; i++, p += 8) {
            const uint64_t u = e8kv_load_le64(p);
            memcpy(&c->sens[i], &u, 8);
            if (!(c->sens[i] >= 0.0) || !isfinite(c->sens[i])) e = E8KV_ERR(CORRUPTED);
        }
        const size_t nq = n_layer * n_head_kv * d;
        if (!e && (sections & CALIB_FLAG_QUERY)) {
            c->q_energy = malloc(nq * sizeof *c->q_energy);
            if (!c->q_energy) e = E8KV_ERR(OUT_OF_MEMORY);
        }
        for (size_t i = 0; !e && (sections & CALIB_FLAG_QUERY) && i < nq; i++, p += 4) {
            c->q_energy[i] = e8kv_load_lef32(p);
            if (!(c->q_energy[i] >= 0.0f) || !isfinite(c->q_energy[i])) e = E8KV_ERR(CORRUPTED);
        }
        if (c && !e) c->finalized = 1;
    }
    if (e) {
        e8kv_calib_free(c);
        c = NULL;
    }
    if (err) *err = e;
    return c;
}

size_t e8kv_calib_save_file(const e8kv_calib *cal, const char *path) {
    if (!cal || !path) return E8KV_ERR(BAD_ARGUMENT);
    const size_t cap = e8kv_calib_save_bound(cal);
    E8KV_RETURN_IF_ERROR(cap);
    uint8_t *buf = malloc(cap);
    if (!buf) return E8KV_ERR(OUT_OF_MEMORY);
    size_t r = e8kv_calib_save(buf, cap, cal);
    if (!e8kv_is_error(r)) r = e8kv_file_write(path, buf, r); /* atomic: the old file survives a failure */
    free(buf);
    return r;
}

e8kv_calib *e8kv_calib_load_file(const char *path, size_t *err) {
    void *buf = NULL;
    const size_t n = e8kv_cache_read_file(&buf, path);
    if (e8kv_is_error(n)) {
        if (err) *err = n;
        return NULL;
    }
    e8kv_calib *c = e8kv_calib_load(buf, n, err);
    free(buf);
    return c;
}
