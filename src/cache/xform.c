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
 * query scores a rotated key as (Gᵀ q)·t: the query transform is P, ·W⁻¹, then the rotation.
 *
 * Keys in the score domain (a calibration with query energies, e8kv_calib_observe_q). What a key error e
 * costs is the error of the scores q·R_Δ·e (keys are coded before RoPE, R_Δ the rotation by the relative
 * position Δ), not |e|². Within a RoPE pair (a, b) turning by θ = Δω, with query energies E[q_a²] = α,
 * E[q_b²] = β: E[((R_θ e)·q)²] = e_a²·(α cos²θ + β sin²θ) + e_b²·(α sin²θ + β cos²θ) + (a cross term
 * in sin 2θ, left out), so averaged over Δ the weight of coordinate a is
 *     w_a = (α + β)/2 + κ·(α − β)/2,  κ = E_Δ[cos 2Δω]
 * and likewise w_b with α and β swapped; query covariances between different coordinates are left out
 * (they average out for pairs that turn). κ ≈ 0 for fast pairs (the energy spread evenly over the pair)
 * and ≈ 1 for slow ones, which barely turn over a context: there the score sees the coordinates
 * separately (SmolLM2's queries carry much of their energy in one slow pair, 50–150× more on one of its
 * coordinates than on the other). Δ is taken over causal attention in a context of XFORM_QW_SPAN
 * tokens, weighted by XFORM_QW_SPAN − Δ. Without RoPE, w_j = E[q_j²]. So the key is coded as x' = S·x,
 * S = diag(√w) (w normalised to mean 1 and raised to at least XFORM_QW_FLOOR of its largest, so S⁻¹ stays
 * bounded), where the squared error is the score error: the transform becomes P·S with P, λ the eigenbasis of
 * S·C·S (C = Pcᵀ·diag(λc)·Pc the calibration's key covariance), decode x̂ = S⁻¹·Pᵀ·ŷ, and a query scores a
 * coded key as (P·S⁻¹·q)·ŷ. Values keep the plain transform (what they cost is the output error, already
 * MSE). */
#include "kvcache.h"

#include "common/cpu.h"
#include "transform/klt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* λ_i below this fraction of the largest are raised to it (w stays bounded) */
#define XFORM_EIG_FLOOR 1e-6
/* score-domain key weights below this fraction of the largest are raised to it (S⁻¹ stays bounded) */
#define XFORM_QW_FLOOR 1e-3
/* the context over which relative positions are averaged for score-domain keys: that of e8kv calibrate
 * (--ctx) and of the perplexity protocol; a constant rather than the cache's n_ctx so that a saved cache
 * decodes the same in any cache it is loaded into (e8kv_cache_load_into) */
#define XFORM_QW_SPAN 512

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
 * gives each coordinate the bits its variance needs); score-domain keys are scaled by S first */
void e8kv_fmt_forward(const kv_format *f, size_t h, size_t d, float *x, size_t n) {
    if (f->xf) {
        if (f->xf->s) scale_rows(x, f->xf->s + 2 * h * d, d, n);
        basis_forward(f->xf->basis + h * d * d, d, x, n);
        if (f->xf->var_codec) return;
        scale_rows(x, f->xf->w + h * d, d, n);
    }
    if (f->codec->rotate) e8kv_rot_forward(&f->codec->rot, x, n);
}

void e8kv_fmt_inverse(const kv_format *f, size_t h, size_t d, float *x, size_t n) {
    if (f->xf && f->xf->var_codec) {
        basis_inverse(f->xf->basis + h * d * d, d, x, n);
        if (f->xf->s) scale_rows(x, f->xf->s + (2 * h + 1) * d, d, n);
        return;
    }
    if (f->codec->rotate) e8kv_rot_inverse(&f->codec->rot, x, n);
    if (f->xf) {
        scale_rows(x, f->xf->w_inv + h * d, d, n);
        basis_inverse(f->xf->basis + h * d * d, d, x, n);
        if (f->xf->s) scale_rows(x, f->xf->s + (2 * h + 1) * d, d, n);
    }
}

void e8kv_fmt_query(const kv_format *f, size_t h, size_t d, float *q, size_t n) {
    if (f->xf) {
        if (f->xf->s) scale_rows(q, f->xf->s + (2 * h + 1) * d, d, n); /* S⁻¹ where the keys have S */
        basis_forward(f->xf->basis + h * d * d, d, q, n);
        if (f->xf->var_codec) return; /* P orthonormal: the query takes P as the key does */
        scale_rows(q, f->xf->w_inv + h * d, d, n);
    }
    if (f->codec->rotate) e8kv_rot_forward(&f->codec->rot, q, n);
}

size_t e8kv_fmt_encode(const kv_format *f, size_t h, uint8_t *dst, const float *x) {
    if (!f->xf) return e8kv_codec_encode(f->codec, dst, f->vector_bytes, x, 1);
    const size_t d = f->codec->head_dim;
    float t[E8KV_MAX_HEAD_DIM];
    memcpy(t, x, d * sizeof(float));
    if (f->xf->s) scale_rows(t, f->xf->s + 2 * h * d, d, 1);
    basis_forward(f->xf->basis + h * d * d, d, t, 1);
    if (f->xf->var_codec) return f->xf->var_codec[h]->ops->encode(f->xf->var_codec[h], dst, t);
    scale_rows(t, f->xf->w + h * d, d, 1);
    return e8kv_codec_encode(f->codec, dst, f->vector_bytes, t, 1);
}

void e8kv_fmt_decode(const kv_format *f, size_t h, float *y, const uint8_t *src) {
    if (f->xf && f->xf->var_codec)
        f->xf->var_codec[h]->ops->decode(f->xf->var_codec[h], y, src);
    else
        f->codec->ops->decode(f->codec, y, src);
}

/* ---------------------------------------------------------------- building */

int e8kv_xform_rate(const char *spec, int *is_var) {
    e8kv_spec sp;
    if (e8kv_is_error(e8kv_spec_parse(&sp, spec)) || sp.q_range > 0.0f) return 0;
    const e8kv_traits *t = e8kv_family_traits(spec);
    if (!t || !t->calibrated) return 0;
    if (is_var) {
        const e8kv_traits *base = e8kv_family_traits(t->base);
        *is_var = base && base->var_coded;
    }
    return sp.rate8;
}

/* E[cos 2Δω] over the relative positions Δ = 0 .. n − 1 of causal attention in a context of n tokens,
 * weighted by how many (query, key) pairs are Δ apart (n − Δ) */
static double mean_cos2(double omega, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t dl = 0; dl < n; dl++) {
        num += (double)(n - dl) * cos(2.0 * (double)dl * omega);
        den += (double)(n - dl);
    }
    return num / den;
}

/* The score weights of one KV head's keys (file comment): w_j from the query energies e over RoPE's pairs
 * when the cache applies RoPE, floored, normalised to mean 1; s = √w. */
static void score_weights(const e8kv_cache *c, const float *e, double *s) {
    const size_t d = c->head_dim, half = d / 2;
    double mx = 0.0, sum = 0.0, kappa[E8KV_MAX_HEAD_DIM / 2];
    for (size_t i = 0; i < half && kv_has_rope(c); i++)
        kappa[i] = mean_cos2(c->rope_inv_freq[i], XFORM_QW_SPAN);
    for (size_t j = 0; j < d; j++) {
        double w = e[j];
        if (kv_has_rope(c)) { /* pairs (2i, 2i+1), NeoX: (i, i + d/2) */
            const size_t mate = c->rope_neox ? (j < half ? j + half : j - half) : j ^ 1;
            const size_t pair = c->rope_neox ? j % half : j / 2;
            w = 0.5 * ((double)e[j] + e[mate]) + 0.5 * kappa[pair] * ((double)e[j] - e[mate]);
        }
        s[j] = w;
        if (w > mx) mx = w;
    }
    for (size_t j = 0; j < d; j++)
        sum += (s[j] = mx > 0.0 && s[j] < XFORM_QW_FLOOR * mx ? XFORM_QW_FLOOR * mx : s[j]);
    for (size_t j = 0; j < d; j++) /* all-zero energies: no weighting */
        s[j] = mx > 0.0 ? sqrt(s[j] * (double)d / sum) : 1.0;
}

/* Score-domain keys of every layer and head for the cache's RoPE setting (sc zeroed): per head S, and P, λ
 * the eigenbasis of S·C·S. */
static size_t build_score(const e8kv_cache *c, e8kv_calib_score *sc) {
    const size_t d = c->head_dim, H = c->n_head_kv, n_kh = c->n_layer * H;
    sc->rope = kv_has_rope(c);
    sc->neox = c->rope_neox;
    memcpy(sc->inv_freq, c->rope_inv_freq, sizeof sc->inv_freq);
    sc->basis = malloc(n_kh * d * d * sizeof *sc->basis);
    sc->eig = malloc(n_kh * d * sizeof *sc->eig);
    sc->s = malloc(2 * n_kh * d * sizeof *sc->s);
    double *a = malloc(d * d * sizeof *a), *vec = malloc(d * d * sizeof *vec), *ev = malloc(d * sizeof *ev),
           *s = malloc(d * sizeof *s);
    size_t r = sc->basis && sc->eig && sc->s && a && vec && ev && s ? 0 : E8KV_ERR(OUT_OF_MEMORY);
    for (size_t kh = 0; kh < n_kh && !e8kv_is_error(r); kh++) {
        const size_t layer = kh / H, h = kh % H;
        const float *const Pc = e8kv_calib_basis(c->calib, layer, 0, h);
        const float *const lc = e8kv_calib_eigenvalues(c->calib, layer, 0, h);
        score_weights(c, e8kv_calib_query_energy(c->calib, layer, h), s);
        memset(a, 0, d * d * sizeof *a);
        for (size_t i = 0; i < d; i++) /* C = Pcᵀ·diag(λc)·Pc, upper triangle */
            for (size_t p = 0; p < d; p++) {
                const double li = (double)lc[i] * Pc[i * d + p];
                for (size_t q = p; q < d; q++)
                    a[p * d + q] += li * Pc[i * d + q];
            }
        for (size_t p = 0; p < d; p++) /* S·C·S */
            for (size_t q = p; q < d; q++)
                a[p * d + q] = a[q * d + p] = a[p * d + q] * s[p] * s[q];
        r = e8kv_sym_eigen(a, d, ev, vec);
        for (size_t i = 0; i < d && !e8kv_is_error(r); i++) {
            sc->eig[kh * d + i] = ev[i] > 0.0 ? (float)ev[i] : 0.0f;
            for (size_t j = 0; j < d; j++)
                sc->basis[(kh * d + i) * d + j] = (float)vec[i * d + j];
            sc->s[2 * kh * d + i] = (float)s[i];
            sc->s[(2 * kh + 1) * d + i] = (float)(1.0 / s[i]);
        }
    }
    free(a);
    free(vec);
    free(ev);
    free(s);
    return r;
}

static int score_matches(const e8kv_cache *c, const e8kv_calib_score *sc) {
    const int rope = kv_has_rope(c);
    return sc->rope == rope && (!rope || (sc->neox == c->rope_neox &&
                                          !memcmp(sc->inv_freq, c->rope_inv_freq, sizeof sc->inv_freq)));
}

/* The score-domain transforms for this cache: the calibration's shared set (built now, under its lock,
 * if it has none yet), or, when that set was built for another RoPE setting, the cache's own. */
static size_t score_set(e8kv_cache *c, const e8kv_calib_score **out) {
    e8kv_calib *const cal = (e8kv_calib *)(uintptr_t)c->calib; /* derived data only, under the lock */
    size_t r = 0;
    pthread_mutex_lock(&cal->score_mu);
    if (!cal->score) {
        e8kv_calib_score *sc = calloc(1, sizeof *sc);
        r = sc ? build_score(c, sc) : E8KV_ERR(OUT_OF_MEMORY);
        if (e8kv_is_error(r))
            e8kv_calib_score_free(sc);
        else
            cal->score = sc;
    }
    const e8kv_calib_score *shared = cal->score;
    pthread_mutex_unlock(&cal->score_mu);
    if (e8kv_is_error(r)) return r;
    if (score_matches(c, shared)) {
        *out = shared;
        return 0;
    }
    if (!c->score_owned) {
        c->score_owned = calloc(1, sizeof *c->score_owned);
        r = c->score_owned ? build_score(c, c->score_owned) : E8KV_ERR(OUT_OF_MEMORY);
        if (e8kv_is_error(r)) return r; /* freed with the cache */
    }
    *out = c->score_owned;
    return 0;
}

static size_t build_stream(e8kv_cache *c, kv_xform *xf, size_t layer, int is_v, const char *spec) {
    const size_t d = c->head_dim, H = c->n_head_kv;
    snprintf(xf->spec, sizeof xf->spec, "%s", spec);
    xf->basis = e8kv_calib_basis(c->calib, layer, is_v, 0);
    int var_coded = 0;
    (void)e8kv_xform_rate(spec, &var_coded);
    const float *eig_s = NULL; /* score-domain keys: (H, d) the eigenvalues of S·C·S */
    if (!is_v && e8kv_calib_query_energy(c->calib, layer, 0)) {
        const e8kv_calib_score *sc = NULL;
        E8KV_RETURN_IF_ERROR(score_set(c, &sc));
        xf->basis = sc->basis + layer * H * d * d;
        eig_s = sc->eig + layer * H * d;
        xf->s = sc->s + 2 * layer * H * d; /* head h: s at 2hd, 1/s at (2h + 1)d */
    }
    size_t r = 0;
    if (var_coded) { /* the same bytes as the base codec */
        char buf[E8KV_CODEC_SPEC_MAX + 1];
        const char *base = e8kv_codec_base_spec(spec, buf);
        xf->var_codec = calloc(H, sizeof *xf->var_codec);
        if (!xf->var_codec) r = E8KV_ERR(OUT_OF_MEMORY);
        for (size_t h = 0; h < H && !e8kv_is_error(r); h++) {
            const float *var = eig_s ? eig_s + h * d : e8kv_calib_eigenvalues(c->calib, layer, is_v, h);
            xf->var_codec[h] = e8kv_codec_create_var(base, d, var, &r);
        }
        return r;
    }
    xf->w = malloc(2 * H * d * sizeof *xf->w);
    if (!xf->w) return E8KV_ERR(OUT_OF_MEMORY);
    xf->w_inv = xf->w + H * d;
    for (size_t h = 0; h < H; h++) {
        const float *eig = eig_s ? eig_s + h * d : e8kv_calib_eigenvalues(c->calib, layer, is_v, h);
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
    e8kv_calib_score_free(c->score_owned);
    c->score_owned = NULL;
    if (!c->xforms) return;
    for (size_t i = 0; i < 2 * c->n_layer; i++) {
        free(c->xforms[i].w);
        for (size_t h = 0; c->xforms[i].var_codec && h < c->n_head_kv; h++)
            e8kv_codec_free(c->xforms[i].var_codec[h]);
        free(c->xforms[i].var_codec);
    }
    free(c->xforms);
    c->xforms = NULL;
}
