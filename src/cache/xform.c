/* Calibrated transform coding of cache streams (cache spec "e8t:B"), and the format-level encode/decode/
 * transform helpers every cache path goes through.
 *
 * An e8t stream codes, for head h, t = W·P·(x − μ) with the standard E8 code e8:B (its Hadamard rotation,
 * per-vector scale and ball codebook): P the calibration's eigenbasis (rows = eigenvectors of the
 * covariance, eigenvalues λ_i), W = diag(λ_i^(−1/4)). Why this weighting: after e8:B's rotation every
 * coordinate of t gets the same quantization noise δ², so coordinate i of P·x gets δ²/w_i², and δ² is
 * proportional to the energy Σ w_i² λ_i the code has to cover. The total error Σ_i w_i⁻² · Σ_i w_i² λ_i
 * is smallest, by Cauchy–Schwarz, for w_i² ∝ λ_i^(−1/2), where it is (Σ √λ_i)² instead of d·Σ λ_i for a
 * plain rotation: a gain of AM(λ)/AM(√λ)² at the same rate (2–3 dB on LLM keys). A per-block bit
 * allocation in the eigenbasis would gain more on Gaussian data, but real K/V are token clusters whose
 * energy moves between eigen-directions from token to token, and one scale per vector then overloads
 * the blocks (measured: 10× the predicted error on SmolLM2 keys); mixed by the rotation, the per-vector
 * scale keeps working.
 *
 * Decode: ŷ (the codec's rotated domain) → inverse rotation → /w → Pᵀ; with x = G·t, G = Pᵀ·W⁻¹, so a
 * query scores a rotated key as (Gᵀ q)·t: the query transform is P, ·W⁻¹, then the rotation. */
#include "kvcache.h"

#include "../common/cpu.h"
#include "../transform/klt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* λ_i below this fraction of the largest are raised to it (w stays bounded) */
#define XFORM_EIG_FLOOR 1e-6

/* ---------------------------------------------------------------- basis helpers */

static void basis_forward(const float *P, size_t d, float *x, size_t n) {
    if (e8kv_cpu_has_avx2())
        e8kv_klt_forward_avx2(P, d, x, n);
    else
        e8kv_klt_forward_ref(P, d, x, n);
}

static void basis_inverse(const float *P, size_t d, float *x, size_t n) {
    if (e8kv_cpu_has_avx2())
        e8kv_klt_inverse_avx2(P, d, d, x, n);
    else
        e8kv_klt_inverse_ref(P, d, d, x, n);
}

static void scale_rows(float *x, const float *w, size_t d, size_t n) {
    for (size_t v = 0; v < n; v++)
        for (size_t i = 0; i < d; i++)
            x[v * d + i] *= w[i];
}

/* ---------------------------------------------------------------- format helpers */

/* e8tv streams code the eigenbasis coordinates themselves (no weights, no rotation: the entropy code
 * gives each coordinate the bits its variance needs) */
void e8kv_fmt_forward(const kv_format *f, size_t h, size_t d, float *x, size_t n) {
    if (f->xf) {
        basis_forward(f->xf->basis + h * d * d, d, x, n);
        if (f->xf->vlc) return;
        scale_rows(x, f->xf->w + h * d, d, n);
    }
    if (f->codec->rotate) e8kv_rot_forward(&f->codec->rot, x, n);
}

void e8kv_fmt_inverse(const kv_format *f, size_t h, size_t d, float *x, size_t n) {
    if (f->xf && f->xf->vlc) {
        basis_inverse(f->xf->basis + h * d * d, d, x, n);
        return;
    }
    if (f->codec->rotate) e8kv_rot_inverse(&f->codec->rot, x, n);
    if (f->xf) {
        scale_rows(x, f->xf->w_inv + h * d, d, n);
        basis_inverse(f->xf->basis + h * d * d, d, x, n);
    }
}

void e8kv_fmt_query(const kv_format *f, size_t h, size_t d, float *q, size_t n) {
    if (f->xf) {
        basis_forward(f->xf->basis + h * d * d, d, q, n);
        if (f->xf->vlc) return; /* orthonormal: the query map is the forward map */
        scale_rows(q, f->xf->w_inv + h * d, d, n);
    }
    if (f->codec->rotate) e8kv_rot_forward(&f->codec->rot, q, n);
}

size_t e8kv_fmt_encode(const kv_format *f, size_t h, uint8_t *dst, const float *x) {
    if (!f->xf) return e8kv_codec_encode(f->codec, dst, f->vector_bytes, x, 1);
    const size_t d = f->codec->head_dim;
    float t[E8KV_MAX_HEAD_DIM];
    memcpy(t, x, d * sizeof(float));
    basis_forward(f->xf->basis + h * d * d, d, t, 1);
    if (f->xf->vlc) return e8kv_vlc_encode(&f->xf->vlc[h], dst, t);
    scale_rows(t, f->xf->w + h * d, d, 1);
    return e8kv_codec_encode(f->codec, dst, f->vector_bytes, t, 1);
}

void e8kv_fmt_decode(const kv_format *f, size_t h, float *y, const uint8_t *src) {
    if (f->xf && f->xf->vlc)
        e8kv_vlc_decode(&f->xf->vlc[h], y, src);
    else
        f->codec->ops->decode(f->codec, y, src);
}

/* ---------------------------------------------------------------- building */

/* "e8t:B" / "e8tv:B" → the rate in eighths of a bit, 0 when spec is neither (or has options) */
int e8kv_xform_rate(const char *spec, int *is_vlc) {
    e8kv_spec sp;
    if (e8kv_is_error(e8kv_spec_parse(&sp, spec)) || sp.q_range > 0.0f) return 0;
    const int vlc = !strcmp(sp.family, "e8tv");
    if (!vlc && strcmp(sp.family, "e8t")) return 0;
    if (is_vlc) *is_vlc = vlc;
    return sp.rate8;
}

static size_t build_stream(e8kv_cache *c, kv_xform *xf, size_t layer, int is_v, const char *spec) {
    const size_t d = c->head_dim, H = c->n_head_kv;
    snprintf(xf->spec, sizeof xf->spec, "%s", spec);
    xf->basis = e8kv_calib_basis(c->calib, layer, is_v, 0);
    int vlc = 0;
    const int rate = e8kv_xform_rate(spec, &vlc);
    if (vlc) { /* the same bytes as e8:B */
        xf->vlc = calloc(H, sizeof *xf->vlc);
        if (!xf->vlc) return E8KV_ERR(OUT_OF_MEMORY);
        for (size_t h = 0; h < H; h++)
            E8KV_RETURN_IF_ERROR(e8kv_vlc_init(&xf->vlc[h], d, 2 + (size_t)rate * d / 64,
                                               e8kv_calib_eigenvalues(c->calib, layer, is_v, h)));
        return 0;
    }
    xf->w = malloc(2 * H * d * sizeof *xf->w);
    if (!xf->w) return E8KV_ERR(OUT_OF_MEMORY);
    xf->w_inv = xf->w + H * d;
    for (size_t h = 0; h < H; h++) {
        const float *eig = e8kv_calib_eigenvalues(c->calib, layer, is_v, h);
        const double fl = XFORM_EIG_FLOOR * (eig[0] > 0.0f ? (double)eig[0] : 1.0);
        for (size_t i = 0; i < d; i++) {
            const double lam = eig[i] > fl ? (double)eig[i] : fl;
            xf->w[h * d + i] = (float)pow(lam, -0.25);
            xf->w_inv[h * d + i] = (float)pow(lam, 0.25);
        }
    }
    return 0;
}

size_t e8kv_xform_build(e8kv_cache *c, const char *const *ks, const char *const *vs) {
    size_t n_u = 0;
    for (size_t l = 0; l < c->n_layer; l++)
        n_u += (e8kv_xform_rate(ks[l], NULL) > 0) + (e8kv_xform_rate(vs[l], NULL) > 0);
    if (n_u == 0) return 0;
    if (!c->calib) {
        e8kv_log(0, "e8kv: the e8t formats need a calibration (e8kv_cache_params.calib, e8kv calibrate)");
        return E8KV_ERR(SPEC);
    }
    size_t cl = 0, ch = 0, cd = 0;
    e8kv_calib_info(c->calib, &cl, &ch, &cd, NULL);
    if (cl != c->n_layer || ch != c->n_head_kv || cd != c->head_dim ||
        !e8kv_calib_eigenvalues(c->calib, 0, 0, 0))
        return E8KV_ERR(DIMENSION);
    c->xforms = calloc(2 * c->n_layer, sizeof *c->xforms);
    if (!c->xforms) return E8KV_ERR(OUT_OF_MEMORY);
    for (size_t l = 0; l < c->n_layer; l++)
        for (int is_v = 0; is_v < 2; is_v++) {
            const char *spec = is_v ? vs[l] : ks[l];
            if (!e8kv_xform_rate(spec, NULL)) continue;
            E8KV_RETURN_IF_ERROR(build_stream(c, &c->xforms[2 * l + (size_t)is_v], l, is_v, spec));
        }
    return 0;
}

void e8kv_xform_free(e8kv_cache *c) {
    if (!c->xforms) return;
    for (size_t i = 0; i < 2 * c->n_layer; i++) {
        free(c->xforms[i].w);
        for (size_t h = 0; c->xforms[i].vlc && h < c->n_head_kv; h++) e8kv_vlc_free(&c->xforms[i].vlc[h]);
        free(c->xforms[i].vlc);
    }
    free(c->xforms);
    c->xforms = NULL;
}
