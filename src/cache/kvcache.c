/* The KV cache store behind the public e8kv_cache_* API: the spec grammar (include/e8kv.h), codec set
 * per layer, paged storage with honest byte accounting, append with all-or-nothing semantics, the
 * full-precision window and sink tokens, truncate and clear. Reads live in attention.c. */
#include "kvcache.h"

#include "common/cpu.h"
#include "common/pool.h"
#include "common/rope.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- spec grammar */

typedef struct {
    size_t first, last; /* layer range, inclusive */
    int which;          /* 1 = K, 2 = V, 3 = both */
    char codec[E8KV_CODEC_SPEC_MAX + 1];
} layer_rule;

typedef struct {
    char k[E8KV_CODEC_SPEC_MAX + 1], v[E8KV_CODEC_SPEC_MAX + 1];
    size_t window, sink, page;
    int rope_pre;
    int center; /* -1 = default (1); 0 off, 1 e8kv's own formats, 2 = all coded formats */
    layer_rule rules[E8KV_CACHE_RULES_MAX];
    size_t n_rules;
    char auto_spec[E8KV_CODEC_SPEC_MAX + 1]; /* auto=FAMILY:B: streams of this spec share bits by sensitivity */
    kv_evict_cfg ev;                         /* evict=, recent=, obs=, budget=, evictA-B= (evict.c) */
    const e8kv_calib *calib;                 /* params.calib: which spec a preset means (preset_pick) */
} cache_config;

typedef struct {
    const char *name, *spec;
    const char *calibrated; /* what the name means when the cache has a calibration (NULL: spec always) */
} preset;

/* Presets (stable names; the specs behind them may be retuned as measurements improve). With a
 * calibration (params.calib: scripts/calibrate_model.sh makes the default model's, e8kv calibrate any
 * model's) near-lossless, balanced and aggressive mean their calibrated spec, chosen by measurement on
 * SmolLM2-135M with a calibration on Tiny Shakespeare (BENCHMARKS.md, "Presets with the default
 * calibration"); without one, the uncalibrated spec (e8kv_cache_preset_spec_calib says which). */
static const preset k_presets[] = {
    {"near-lossless", "k=q8_0h,v=e8:4,sink=1,center=all,rope=pre", "e8tv:5,sink=1"},
    {"balanced", "e8:4,sink=1", "auto=e8tv:3.875,sink=1"},
    {"aggressive", "k=e8:4,v=e8:3,sink=1", "auto=e8tv:3,sink=1"},
    /* eviction + calibrated E8 codes (evict.c; auto= needs e8kv calibrate), chosen by measurement at
     * 1600-token prefixes of SmolLM2-135M: 10.3x, 17.4x, 33.5x of f16 with every byte counted
     * (BENCHMARKS.md). snapkv wants the prefix's queries (e8kv_cache_evict); budget= falls back to keykey */
    {"evict-high", "auto=e8tv:4,sink=1,evict=snapkv:0.68", NULL},
    {"evict-balanced", "auto=e8tv:3.5,sink=1,evict=snapkv:0.84", NULL},
    {"evict-max", "auto=e8tv:4,sink=1,evict=snapkv:0.92", NULL},
    /* half the prefix evicted: 6.5x at a 1600-token prefix; of the presets the closest to f16's passkey
     * recall (65% / 75% of keys at 1K / 2K-token prompts against f16's 80%, lost at 25% depth;
     * BENCHMARKS.md) */
    {"evict-safe", "auto=e8tv:4,sink=1,evict=snapkv:0.5", NULL},
};

/* The spec a preset means with this calibration: its calibrated spec when there is one and the
 * calibration has what it needs (sensitivities for auto=), else its uncalibrated spec. */
static const char *preset_pick(const preset *p, const e8kv_calib *calib) {
    if (!p->calibrated || !calib) return p->spec;
    if (!strncmp(p->calibrated, "auto=", 5) && e8kv_calib_sensitivity(calib, 0, 0) < 0.0) return p->spec;
    return p->calibrated;
}

#if E8KV_CODEC_SPEC_MAX != E8KV_CODEC_SPEC_MAX_LEN
#error "the public bound of a codec spec is the registry's"
#endif

static int copy_codec_spec(char dst[E8KV_CODEC_SPEC_MAX + 1], const char *src, size_t len) {
    if (len == 0 || len > E8KV_CODEC_SPEC_MAX) return 0;
    memcpy(dst, src, len);
    dst[len] = 0;
    return 1;
}

static int parse_size(const char *s, size_t len, size_t *out) {
    if (len == 0 || len > 12) return 0;
    size_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) return 0;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    *out = v;
    return 1;
}

static size_t parse_item(cache_config *cfg, const char *it, size_t len, int depth, int first);

static size_t parse_list(cache_config *cfg, const char *spec, int depth) {
    const size_t n = strlen(spec);
    if (n == 0 || n > E8KV_CACHE_SPEC_MAX) return E8KV_ERR(SPEC);
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || spec[i] == ',') {
            E8KV_RETURN_IF_ERROR(parse_item(cfg, spec + start, i - start, depth, start == 0));
            start = i + 1;
        }
    }
    return 0;
}

/* A codec spec or a preset sets every stream's format: only as the first item, so that "f16,e8:4" (a list
 * of formats, not a format) is refused instead of meaning e8:4. */
static size_t parse_item(cache_config *cfg, const char *it, size_t len, int depth, int first) {
    if (len == 0) return E8KV_ERR(SPEC);
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (strlen(k_presets[i].name) == len && !memcmp(k_presets[i].name, it, len)) {
            if (depth > 0 || !first) return E8KV_ERR(SPEC);
            return parse_list(cfg, preset_pick(&k_presets[i], cfg->calib), depth + 1);
        }
    const char *eq = memchr(it, '=', len);
    const size_t klen = eq ? (size_t)(eq - it) : 0;
    const char *val = eq ? eq + 1 : NULL;
    const size_t vlen = eq ? len - klen - 1 : 0;
    /* a bare codec spec (its own options use ':' and may contain '=' after a ':') */
    if (!eq || memchr(it, ':', klen)) {
        if (!first || !copy_codec_spec(cfg->k, it, len)) return E8KV_ERR(SPEC);
        memcpy(cfg->v, cfg->k, sizeof cfg->v);
        return 0;
    }
#define KEY_IS(s) (klen == strlen(s) && !memcmp(it, s, klen))
    if (KEY_IS("k")) return copy_codec_spec(cfg->k, val, vlen) ? 0 : E8KV_ERR(SPEC);
    if (KEY_IS("v")) return copy_codec_spec(cfg->v, val, vlen) ? 0 : E8KV_ERR(SPEC);
    if (KEY_IS("kv")) {
        if (!copy_codec_spec(cfg->k, val, vlen)) return E8KV_ERR(SPEC);
        memcpy(cfg->v, cfg->k, sizeof cfg->v);
        return 0;
    }
    if (KEY_IS("auto")) { /* every stream in this family, rates from the calibration (expanded at create) */
        if (!copy_codec_spec(cfg->auto_spec, val, vlen)) return E8KV_ERR(SPEC);
        memcpy(cfg->k, cfg->auto_spec, sizeof cfg->k);
        memcpy(cfg->v, cfg->auto_spec, sizeof cfg->v);
        return 0;
    }
    size_t ev_err = 0;
    if (e8kv_evict_parse_item(&cfg->ev, it, klen, val, vlen, &ev_err)) return ev_err;
    if (KEY_IS("window")) return parse_size(val, vlen, &cfg->window) ? 0 : E8KV_ERR(SPEC);
    if (KEY_IS("sink")) return parse_size(val, vlen, &cfg->sink) ? 0 : E8KV_ERR(SPEC);
    if (KEY_IS("page")) {
        if (!parse_size(val, vlen, &cfg->page) || cfg->page == 0 || cfg->page > 65536) return E8KV_ERR(SPEC);
        return 0;
    }
    if (KEY_IS("center")) {
        if (vlen == 1 && (val[0] == '0' || val[0] == '1'))
            cfg->center = val[0] - '0';
        else if (vlen == 3 && !memcmp(val, "all", 3))
            cfg->center = 2;
        else if (vlen == 4 && !memcmp(val, "rope", 4))
            cfg->center = 3; /* the CUDA cache's turned key centre (kvcache.h, kv_rc) */
        else
            return E8KV_ERR(SPEC);
        return 0;
    }
    if (KEY_IS("rope")) {
        if (vlen == 3 && !memcmp(val, "pre", 3))
            cfg->rope_pre = 1;
        else if (vlen == 4 && !memcmp(val, "post", 4))
            cfg->rope_pre = 0;
        else
            return E8KV_ERR(SPEC);
        return 0;
    }
#undef KEY_IS
    /* layersA[-B][.k|.v]=CODEC  (also "layerA") */
    size_t p = 0;
    if (klen > 6 && !memcmp(it, "layers", 6))
        p = 6;
    else if (klen > 5 && !memcmp(it, "layer", 5))
        p = 5;
    else
        return E8KV_ERR(SPEC);
    if (cfg->n_rules >= E8KV_CACHE_RULES_MAX) return E8KV_ERR(SPEC);
    layer_rule *r = &cfg->rules[cfg->n_rules];
    size_t q = p;
    while (q < klen && isdigit((unsigned char)it[q]))
        q++;
    if (!parse_size(it + p, q - p, &r->first)) return E8KV_ERR(SPEC);
    r->last = r->first;
    if (q < klen && it[q] == '-') {
        const size_t s = ++q;
        while (q < klen && isdigit((unsigned char)it[q]))
            q++;
        if (!parse_size(it + s, q - s, &r->last) || r->last < r->first) return E8KV_ERR(SPEC);
    }
    r->which = 3;
    if (q + 2 == klen && it[q] == '.' && it[q + 1] == 'k')
        r->which = 1;
    else if (q + 2 == klen && it[q] == '.' && it[q + 1] == 'v')
        r->which = 2;
    else if (q != klen)
        return E8KV_ERR(SPEC);
    if (!copy_codec_spec(r->codec, val, vlen)) return E8KV_ERR(SPEC);
    cfg->n_rules++;
    return 0;
}

/* ---------------------------------------------------------------- create / free */

static size_t get_codec(e8kv_cache *c, const char *spec, uint64_t seed, const e8kv_codec **out) {
    for (size_t i = 0; i < c->n_codecs; i++)
        if (!strcmp(e8kv_codec_spec(c->codecs[i]), spec)) {
            *out = c->codecs[i];
            return 0;
        }
    if (c->n_codecs >= E8KV_CACHE_MAX_CODECS) return E8KV_ERR(SPEC);
    size_t err = 0;
    e8kv_codec *codec = e8kv_codec_create(spec, c->head_dim, seed, &err);
    if (!codec) return e8kv_is_error(err) ? err : E8KV_ERR(SPEC);
    c->codecs[c->n_codecs++] = codec;
    *out = codec;
    return 0;
}

/* A calibrated format (e8t, e8tv: xform.c) */
static int is_calibrated(const char *spec) {
    const e8kv_traits *t = e8kv_family_traits(spec);
    return t && t->calibrated;
}

static void set_format(kv_format *f, const e8kv_codec *codec, int rope_pre_key, int center) {
    const e8kv_traits *t = e8kv_codec_traits(codec);
    f->codec = codec;
    f->xf = NULL;
    f->vector_bytes = e8kv_codec_vector_bytes(codec);
    f->rotated = e8kv_codec_is_rotated(codec) && !rope_pre_key;
    f->group = t->layout == E8KV_PAGE_TOKEN_GROUP ? codec->group_tokens : 0;
    /* token-group formats code groups as given */
    f->centered = t->center != E8KV_CENTER_NEVER && !f->group &&
                  (center == 2 || (center == 1 && t->center == E8KV_CENTER_DEFAULT));
    f->fast = (kv_fast_kind)t->reader;
}

/* The codec a stream spec uses: a calibrated format ("e8t:B") codes with its base (e8:B) after its
 * transform (xform.c). */
static const char *codec_of(const char *spec, char buf[E8KV_CODEC_SPEC_MAX + 1]) {
    if (!e8kv_xform_rate(spec, NULL))
        return spec; /* not calibrated, or a calibrated spec with options: SPEC from get_codec */
    return e8kv_codec_base_spec(spec, buf);
}
/* The attention's threads and scratch (kvcache.h); nonzero when something could not be had. */
static int attend_setup(e8kv_cache *c) {
    if (pthread_mutex_init(&c->attn_mu, NULL)) return 1;
    c->attn_mu_ready = 1;
    /* at least E8KV_ATTEND_SLICE_MIN keys per slice, whole tiles of 64, at most E8KV_ATTEND_SLICES_MAX */
    const size_t per = (c->n_ctx + E8KV_ATTEND_SLICES_MAX - 1) / E8KV_ATTEND_SLICES_MAX;
    const size_t slice = (per + 63) / 64 * 64;
    c->attn_slice = slice > E8KV_ATTEND_SLICE_MIN ? slice : E8KV_ATTEND_SLICE_MIN;
    const size_t n_slice = (c->n_ctx + c->attn_slice - 1) / c->attn_slice;
    if (n_slice > 1) { /* the slices' partials, then the prepared queries */
        c->attn_part = malloc((n_slice + 1) * E8KV_ATTEND_PART_MAX * sizeof(float));
        if (!c->attn_part) return 1;
    }
    if (c->n_threads > 1) {
        c->pool_owned = e8kv_pool_create(c->n_threads, NULL);
        if (!c->pool_owned) return 1;
    }
    c->pool = c->pool_owned;
    return 0;
}

size_t e8kv_cache_set_pool(e8kv_cache *cache, e8kv_pool *pool) {
    if (!cache) return E8KV_ERR(BAD_ARGUMENT);
    if (pool != cache->pool_owned) {
        e8kv_pool_free(cache->pool_owned);
        cache->pool_owned = NULL;
    }
    cache->pool = pool;
    return 0;
}

static size_t fail_create(e8kv_cache *c, size_t *err, size_t code) {
    e8kv_cache_free(c);
    if (err) *err = code;
    return code;
}

/* auto=FAMILY:B: the streams whose format is FAMILY:B (lspec, K of every layer then V) get rates on the
 * family's grid from the calibration's sensitivities with mean B (alloc.c); their names are written to
 * names (2·n_layer entries) and lspec points there. SPEC: not a family with auto_rates (e8v, e8tv), or no
 * calibration with
 * sensitivities; RATE: B off the grid or outside [1.5, 8]. */
#define AUTO_LO8 12 /* 1.5 bits: the lowest rate a stream is given */
#define AUTO_HI8 64
static size_t expand_auto(const e8kv_cache *c, const char *auto_spec, const char **lspec, char (*names)[24]) {
    e8kv_spec sp;
    const e8kv_traits *t = e8kv_family_traits(auto_spec);
    if (e8kv_is_error(e8kv_spec_parse(&sp, auto_spec)) || sp.q_range > 0.0f || !t || !t->auto_rates)
        return E8KV_ERR(SPEC);
    if (!c->calib || e8kv_calib_sensitivity(c->calib, 0, 0) < 0.0) {
        e8kv_log(0, "e8kv: auto= needs a calibration with sensitivities (e8kv calibrate)");
        return E8KV_ERR(SPEC);
    }
    size_t n_layer = 0;
    e8kv_calib_info(c->calib, &n_layer, NULL, NULL, NULL);
    if (n_layer != c->n_layer) return E8KV_ERR(DIMENSION);
    size_t g = 64, b = c->head_dim; /* step: the smallest rate with whole bytes per vector, 64/gcd(64, d) */
    while (b) {
        const size_t rem = g % b;
        g = b;
        b = rem;
    }
    const int step8 = (int)(64 / g), lo8 = (AUTO_LO8 + step8 - 1) / step8 * step8;
    if (sp.rate8 % step8 || sp.rate8 < lo8 || sp.rate8 > AUTO_HI8) return E8KV_ERR(RATE);
    const size_t n_s = 2 * c->n_layer;
    double *coef = malloc(n_s * sizeof *coef);
    int *rate8 = malloc(n_s * sizeof *rate8);
    size_t *idx = malloc(n_s * sizeof *idx), n = 0;
    size_t r = coef && rate8 && idx ? 0 : E8KV_ERR(OUT_OF_MEMORY);
    for (size_t i = 0; i < n_s && !r; i++)
        if (!strcmp(lspec[i], auto_spec)) {
            idx[n] = i;
            coef[n++] = e8kv_calib_sensitivity(c->calib, i % c->n_layer, i >= c->n_layer);
        }
    if (!r && n) r = e8kv_alloc_rates(rate8, coef, n, sp.rate8, lo8, AUTO_HI8, step8);
    for (size_t j = 0; j < n && !e8kv_is_error(r); j++) {
        /* "e8tv:2.375": a family of at most 15 characters, a rate of at most 8 with up to 3 decimals */
        snprintf(names[idx[j]], sizeof names[0], "%s:%.5g", t->family, rate8[j] / 8.0);
        lspec[idx[j]] = names[idx[j]];
    }
    free(coef);
    free(rate8);
    free(idx);
    return r;
}

static e8kv_cache *create_from(const e8kv_cache_params *params, cache_config *cfg, size_t *err);

/* The page allocator, one size class per distinct page size (every layer's coded K and V, and raw). */
static int init_pages(e8kv_cache *c) {
    const size_t n_size = 2 * c->n_layer + 1; /* size j: layer j / 2's coded K (even j) or V, then raw */
#define PAGE_SIZE_OF(j)                                                                                      \
    e8kv_aligned_size((j) == 2 * c->n_layer                                                                  \
                          ? kv_page_bytes(c, &c->layers[0].k, 1)                                             \
                          : kv_page_bytes(c, (j) % 2 ? &c->layers[(j) / 2].v : &c->layers[(j) / 2].k, 0))
    size_t n_cls = 0;
    for (size_t j = 0; j < n_size; j++) {
        size_t m = 0;
        while (m < j && PAGE_SIZE_OF(m) != PAGE_SIZE_OF(j))
            m++;
        n_cls += m == j;
    }
#undef PAGE_SIZE_OF
    return e8kv_pages_init(&c->pages, n_cls);
}

e8kv_rope *kv_rope_create(const e8kv_cache *c, size_t *err) {
    return c->rope_freqs ? e8kv_rope_create_freqs(c->head_dim, c->rope_inv_freq, c->rope_neox, err)
                         : e8kv_rope_create(c->head_dim, c->rope_theta, c->rope_neox, err);
}

e8kv_cache *e8kv_cache_create(const e8kv_cache_params *params, size_t *err) {
    if (err) *err = 0;
    if (!params || !params->spec || !params->n_layer || !params->n_head_kv || !params->n_ctx) {
        if (err) *err = E8KV_ERR(BAD_ARGUMENT);
        return NULL;
    }
    if (params->head_dim == 0 || params->head_dim > E8KV_MAX_HEAD_DIM) {
        if (err) *err = E8KV_ERR(HEAD_DIM);
        return NULL;
    }
    cache_config *cfg = calloc(1, sizeof *cfg); /* ~45 KB of rules: not on a caller's thread stack */
    if (!cfg) {
        if (err) *err = E8KV_ERR(OUT_OF_MEMORY);
        return NULL;
    }
    e8kv_cache *c = create_from(params, cfg, err);
    free(cfg);
    return c;
}

/* Parse a whole spec for n_layer layers into cfg (zeroed by the caller): the grammar's defaults, the
 * items, and the checks that need no codec. 0 or SPEC. */
static size_t parse_spec(cache_config *cfg, const char *spec, size_t n_layer, const e8kv_calib *calib) {
    cfg->center = -1;
    cfg->rope_pre = -1;
    cfg->ev.recent = E8KV_EVICT_DEFAULT_RECENT;
    cfg->ev.obs = E8KV_EVICT_DEFAULT_OBS;
    cfg->calib = calib;
    size_t r = parse_list(cfg, spec, 0);
    /* eviction compacts coded pages: not with the exact window's raw pages; and its tuning items mean
     * nothing without a scorer (budget= alone evicted nothing) */
    if (cfg->ev.scorer && cfg->window) r = E8KV_ERR(SPEC);
    if (!cfg->ev.scorer && cfg->ev.tuned) r = E8KV_ERR(SPEC);
    for (size_t i = 0; i < cfg->ev.n_rules; i++)
        if (cfg->ev.last[i] >= n_layer) r = E8KV_ERR(SPEC);
    for (size_t i = 0; i < cfg->n_rules; i++)
        if (cfg->rules[i].last >= n_layer) r = E8KV_ERR(SPEC);
    return e8kv_is_error(r) || !cfg->k[0] || !cfg->v[0] ? E8KV_ERR(SPEC) : 0;
}

/* The spec of stream s (0 = K, 1 = V) of layer l: the K/V format, then the layer rules (later ones win). */
static const char *layer_spec(const cache_config *cfg, size_t l, int s) {
    const char *spec = s ? cfg->v : cfg->k;
    for (size_t i = 0; i < cfg->n_rules; i++)
        if (l >= cfg->rules[i].first && l <= cfg->rules[i].last && (cfg->rules[i].which & (1 << s)))
            spec = cfg->rules[i].codec;
    return spec;
}

size_t e8kv_cache_spec_layers(const char *spec, size_t n_layer, const e8kv_calib *calib,
                              e8kv_cache_spec_items *items, char (*layer_specs)[E8KV_CODEC_SPEC_MAX_LEN + 1]) {
    if (!spec || !n_layer) return E8KV_ERR(BAD_ARGUMENT);
    cache_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return E8KV_ERR(OUT_OF_MEMORY);
    const size_t r = parse_spec(cfg, spec, n_layer, calib);
    if (!r && items) {
        items->sink = cfg->sink, items->window = cfg->window, items->page = cfg->page;
        items->rope = cfg->rope_pre, items->center = cfg->center;
        items->auto_rates = cfg->auto_spec[0] != 0;
        items->evicts = cfg->ev.scorer != KV_EVICT_NONE || cfg->ev.budget != 0;
    }
    for (size_t l = 0; l < n_layer && !r && layer_specs; l++)
        for (int s = 0; s < 2; s++)
            memcpy(layer_specs[2 * l + s], layer_spec(cfg, l, s), E8KV_CODEC_SPEC_MAX_LEN + 1);
    free(cfg);
    return r;
}

size_t e8kv_cache_spec_evict(const char *spec, e8kv_evict_items *items, char *rest, size_t cap) {
    if (!spec || !items || (rest && !cap)) return E8KV_ERR(BAD_ARGUMENT);
    cache_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return E8KV_ERR(OUT_OF_MEMORY);
    size_t r = parse_spec(cfg, spec, SIZE_MAX, NULL);
    if (!r) {
        memset(items, 0, sizeof *items);
        snprintf(items->scorer, sizeof items->scorer, "%s", e8kv_evict_scorer_name(cfg->ev.scorer));
        items->frac = cfg->ev.frac;
        items->recent = cfg->ev.recent, items->obs = cfg->ev.obs, items->budget = cfg->ev.budget;
        items->n_rules = cfg->ev.n_rules;
    }
    free(cfg);
    if (r || !rest) return r;
    /* the other items in order: an item is eviction's when e8kv_evict_parse_item takes its key (a codec
     * spec, whose options use ':' before any '=', never is) */
    size_t n = 0, start = 0;
    const size_t len = strlen(spec);
    for (size_t i = 0; i <= len; i++) {
        if (i < len && spec[i] != ',') continue;
        const char *it = spec + start, *eq = memchr(it, '=', i - start);
        const size_t klen = eq ? (size_t)(eq - it) : 0;
        kv_evict_cfg scratch = {0};
        size_t e = 0;
        const int ours = eq && !memchr(it, ':', klen) &&
                         e8kv_evict_parse_item(&scratch, it, klen, eq + 1, i - start - klen - 1, &e);
        if (!ours) {
            const size_t w = (n ? 1 : 0) + (i - start);
            if (n + w + 1 > cap) return E8KV_ERR(DST_TOO_SMALL);
            if (n) rest[n++] = ',';
            memcpy(rest + n, it, i - start);
            n += i - start;
        }
        start = i + 1;
    }
    rest[n] = 0;
    return 0;
}

/* center=rope: RoPE's own cos, sin of positions [p0, p0 + n): rows of e8kv_rope_apply of (1, 0) in every
 * pair, as (n, head_dim / 2, 2) into cs: the floats a key at those positions was turned by, which its code
 * subtracts the centre with (the CUDA cache's table holds the same). */
void e8kv_cache_rc_exact(const e8kv_cache *c, size_t p0, size_t n, float *cs) {
    const size_t d = c->head_dim, half = d / 2;
    for (size_t t = 0; t < n; t++) /* (1, 0) in every pair, in the keys' layout */
        for (size_t i = 0; i < half; i++) {
            cs[t * d + (c->rope_neox ? i : 2 * i)] = 1.0f;
            cs[t * d + (c->rope_neox ? i + half : 2 * i + 1)] = 0.0f;
        }
    e8kv_rope_apply(c->rope, cs, n, 1, p0); /* one pass: positions advance by RoPE's own steps */
    for (size_t t = 0; c->rope_neox && t < n; t++) { /* split halves to pairs */
        float row[E8KV_MAX_HEAD_DIM];
        memcpy(row, cs + t * d, d * sizeof *row);
        for (size_t i = 0; i < half; i++)
            cs[t * d + 2 * i] = row[i], cs[t * d + 2 * i + 1] = row[i + half];
    }
}

/* The reads' tables (kvcache.h, rc_tab): RoPE's cos, sin at positions 0 .. RC_FINE − 1 (transposed: a row
 * per pair and cos/sin), then at each block start RC_FINE·b for b < rc_n_coarse (covering n_ctx):
 * (RC_FINE + rc_n_coarse)·head_dim floats, counted in fixed_bytes, instead of a row per position. */
static size_t rc_tables(e8kv_cache *c) {
    const size_t d = c->head_dim;
    int any = 0;
    for (size_t l = 0; l < c->n_layer; l++)
        any |= c->layers[l].k_rc != NULL;
    if (!any) return 0;
    c->rc_n_coarse = (c->n_ctx + RC_FINE - 1) / RC_FINE;
    c->rc_tab = malloc((RC_FINE + c->rc_n_coarse) * d * sizeof *c->rc_tab);
    if (!c->rc_tab) return E8KV_ERR(OUT_OF_MEMORY);
    float *fine = malloc(RC_FINE * d * sizeof *fine);
    if (!fine) return E8KV_ERR(OUT_OF_MEMORY);
    e8kv_cache_rc_exact(c, 0, RC_FINE, fine);
    for (size_t r = 0; r < RC_FINE; r++)
        for (size_t i = 0; i < d; i++)
            c->rc_tab[i * RC_FINE + r] = fine[r * d + i];
    free(fine);
    for (size_t b = 0; b < c->rc_n_coarse; b++)
        e8kv_cache_rc_exact(c, RC_FINE * b, 1, c->rc_tab + (RC_FINE + b) * d);
    c->fixed_bytes += (RC_FINE + c->rc_n_coarse) * d * sizeof *c->rc_tab;
    return 0;
}

const float *e8kv_cache_rc_coarse(const e8kv_cache *c, size_t b, float *buf) {
    if (b < c->rc_n_coarse) return c->rc_tab + (RC_FINE + b) * c->head_dim;
    e8kv_cache_rc_exact(c, RC_FINE * b, 1, buf); /* past n_ctx (positions grow past it under a budget) */
    return buf;
}

void e8kv_cache_rc_cos_sin(const e8kv_cache *c, size_t pos, float *cs) {
    const size_t d = c->head_dim, r = pos % RC_FINE;
    float row[E8KV_MAX_HEAD_DIM];
    const float *g = e8kv_cache_rc_coarse(c, pos / RC_FINE, row), *f = c->rc_tab + r;
    for (size_t i = 0; i < d; i += 2) { /* the angle of RC_FINE·b plus that of r */
        const float fc = f[i * RC_FINE], fs = f[(i + 1) * RC_FINE];
        cs[i] = g[i] * fc - g[i + 1] * fs;
        cs[i + 1] = g[i + 1] * fc + g[i] * fs;
    }
}

/* (a, b) turned by (C, S) as RoPE turns a pair (src/common/rope.h: float products, no FMA) */
E8KV_NO_FP_CONTRACT
static void rc_turn(float a, float b, float C, float S, float *x0, float *x1) {
    E8KV_NO_FP_CONTRACT_BODY
    *x0 = a * C - b * S;
    *x1 = a * S + b * C;
}

void e8kv_cache_rc_turned(const e8kv_cache *c, const kv_layer *L, size_t h, const float *cs, float *x) {
    const size_t d = c->head_dim, half = d / 2;
    const kv_rc *rc = &L->k_rc[h];
    memset(x, 0, d * sizeof *x);
    for (size_t k = 0; k < E8KV_RC_PAIRS; k++) {
        const size_t i = rc->pair[k];
        rc_turn(rc->m[2 * k], rc->m[2 * k + 1], cs[2 * i], cs[2 * i + 1], &x[c->rope_neox ? i : 2 * i],
                &x[c->rope_neox ? i + half : 2 * i + 1]);
    }
}

static e8kv_cache *create_from(const e8kv_cache_params *params, cache_config *cfg, size_t *err) {
    if (parse_spec(cfg, params->spec, params->n_layer, params->calib)) {
        if (err) *err = E8KV_ERR(SPEC);
        return NULL;
    }
    size_t r = 0;
    const int has_rope = params->rope_theta > 0.0f || params->rope_freqs;
    if (params->rope_freqs) { /* finite, >= 0, and a pair each: e8kv_rope_create_freqs's own checks */
        int ok = params->head_dim % 2 == 0 && params->head_dim <= E8KV_MAX_HEAD_DIM;
        for (size_t i = 0; ok && i < params->head_dim / 2; i++)
            ok = params->rope_freqs[i] >= 0.0f && isfinite(params->rope_freqs[i]);
        if (!ok) {
            if (err) *err = E8KV_ERR(BAD_ARGUMENT);
            return NULL;
        }
    }
    /* center=rope: keys arrive after RoPE (its turns are what the centre follows), so rope=post */
    if (cfg->center == 3 &&
        (cfg->rope_pre == 1 || !has_rope || params->head_dim % 2 || params->head_dim < 2 * E8KV_RC_PAIRS)) {
        if (err) *err = E8KV_ERR(SPEC);
        return NULL;
    }
    if (cfg->center == 3) cfg->rope_pre = 0;
    if (cfg->rope_pre < 0) {
        /* default: keys coded before RoPE when the caller gives RoPE's parameters and K's family says
         * so (traits.rope_pre: e8kv's formats, measured better at every rate on SmolLM2, BENCHMARKS.md) */
        e8kv_spec ks;
        const e8kv_traits *kt = e8kv_family_traits(cfg->k);
        const int pre = !e8kv_is_error(e8kv_spec_parse(&ks, cfg->k)) && kt && kt->rope_pre;
        cfg->rope_pre = has_rope && params->head_dim % 2 == 0 && pre;
    }
    /* calibrated keys are calibrated before RoPE: with RoPE they must be coded before it */
    int e8t_k = is_calibrated(cfg->k);
    for (size_t i = 0; i < cfg->n_rules; i++)
        e8t_k |= (cfg->rules[i].which & 1) && is_calibrated(cfg->rules[i].codec);
    if (e8t_k && !cfg->rope_pre && has_rope) {
        if (err) *err = E8KV_ERR(SPEC);
        return NULL;
    }
    if (cfg->rope_pre && (!has_rope || params->head_dim % 2)) {
        if (err) *err = E8KV_ERR(SPEC);
        return NULL;
    }
    if (params->n_layer > SIZE_MAX / 2 / sizeof(kv_layer) || params->n_head_kv > 4096) {
        if (err) *err = E8KV_ERR(BAD_ARGUMENT);
        return NULL;
    }

    e8kv_cache *c = calloc(1, sizeof *c);
    if (!c) {
        if (err) *err = E8KV_ERR(OUT_OF_MEMORY);
        return NULL;
    }
    c->n_layer = params->n_layer;
    c->n_head_kv = params->n_head_kv;
    c->head_dim = params->head_dim;
    c->n_ctx = params->n_ctx;
    c->page_tokens = cfg->page ? cfg->page : E8KV_CACHE_DEFAULT_PAGE;
    c->n_page_max = (c->n_ctx + c->page_tokens - 1) / c->page_tokens;
    c->window = cfg->window;
    c->n_sink = cfg->sink < c->n_ctx ? cfg->sink : c->n_ctx;
    c->n_threads = params->n_threads ? params->n_threads : 1;
    if (c->n_threads > E8KV_CACHE_MAX_THREADS) c->n_threads = E8KV_CACHE_MAX_THREADS;
    c->rope_pre = cfg->rope_pre;
    c->center = cfg->center < 0 ? 1 : cfg->center;
    c->seed = params->seed;
    c->ev = cfg->ev;
    c->calib = params->calib;
    c->use_avx2 = e8kv_cpu_has_avx2() && c->head_dim % 8 == 0;
    c->use_vnni = c->use_avx2 && e8kv_cpu_has_avxvnni();
    c->rope_theta = params->rope_theta;
    c->rope_neox = params->rope_neox ? 1 : 0;
    if (params->rope_freqs) {
        if (!(c->rope_freqs = malloc(c->head_dim / 2 * sizeof *c->rope_freqs))) {
            fail_create(c, err, E8KV_ERR(OUT_OF_MEMORY));
            return NULL;
        }
        memcpy(c->rope_freqs, params->rope_freqs, c->head_dim / 2 * sizeof *c->rope_freqs);
    }
    for (size_t i = 0; i < c->head_dim / 2 && has_rope; i++)
        c->rope_inv_freq[i] = c->rope_freqs
                                  ? (double)c->rope_freqs[i]
                                  : pow((double)c->rope_theta, -2.0 * (double)i / (double)c->head_dim);
    if ((c->rope_pre || c->center == 3) && !(c->rope = kv_rope_create(c, &r))) {
        fail_create(c, err, r);
        return NULL;
    }
    c->layers = calloc(c->n_layer, sizeof *c->layers);
    if (!c->layers || attend_setup(c)) {
        fail_create(c, err, E8KV_ERR(OUT_OF_MEMORY));
        return NULL;
    }
    c->fixed_bytes = sizeof *c + c->n_layer * sizeof *c->layers + e8kv_rope_bytes(c->rope) +
                     kv_n_rope_freqs(c) * sizeof *c->rope_freqs;
    const size_t n_tab = c->n_head_kv * c->n_page_max;
    const char **lspec = calloc(2 * c->n_layer, sizeof *lspec); /* per layer: K spec, then V spec */
    if (!lspec) {
        fail_create(c, err, E8KV_ERR(OUT_OF_MEMORY));
        return NULL;
    }
    for (size_t l = 0; l < c->n_layer; l++) {
        lspec[l] = layer_spec(cfg, l, 0);
        lspec[c->n_layer + l] = layer_spec(cfg, l, 1);
    }
    char(*auto_names)[24] = NULL; /* the per-stream specs of auto= */
    if (cfg->auto_spec[0]) {
        auto_names = calloc(2 * c->n_layer, sizeof *auto_names);
        r = auto_names ? expand_auto(c, cfg->auto_spec, lspec, auto_names) : E8KV_ERR(OUT_OF_MEMORY);
    }
    if (!e8kv_is_error(r)) r = e8kv_xform_build(c, lspec, lspec + c->n_layer);
    for (size_t l = 0; l < c->n_layer && !e8kv_is_error(r); l++) {
        kv_layer *L = &c->layers[l];
        L->evict_frac = c->ev.frac;
        for (size_t i = 0; i < c->ev.n_rules; i++)
            if (l >= c->ev.first[i] && l <= c->ev.last[i]) L->evict_frac = c->ev.rule_frac[i];
        const char *ks = lspec[l], *vs = lspec[c->n_layer + l];
        char kbuf[E8KV_CODEC_SPEC_MAX + 1], vbuf[E8KV_CODEC_SPEC_MAX + 1];
        const e8kv_codec *kc = NULL, *vc = NULL;
        r = get_codec(c, codec_of(ks, kbuf), params->seed, &kc);
        if (!e8kv_is_error(r)) r = get_codec(c, codec_of(vs, vbuf), params->seed, &vc);
        if (e8kv_is_error(r)) break;
        set_format(&L->k, kc, c->rope_pre, c->center == 3 ? 1 : c->center);
        set_format(&L->v, vc, 0, c->center == 3 ? 1 : c->center);
        L->k.is_key = 1;
        if ((L->k.group && c->page_tokens % L->k.group) || (L->v.group && c->page_tokens % L->v.group)) {
            r = E8KV_ERR(SPEC); /* a token group never straddles pages */
            break;
        }
        if (c->ev.scorer && (!e8kv_codec_traits(kc)->evictable || !e8kv_codec_traits(vc)->evictable)) {
            r = E8KV_ERR(UNSUPPORTED); /* eviction moves single tokens; a token group is coded together */
            break;
        }
        if (e8kv_xform_rate(ks, NULL)) L->k.xf = &c->xforms[2 * l];
        if (e8kv_xform_rate(vs, NULL)) L->v.xf = &c->xforms[2 * l + 1];
        L->k_pages = calloc(n_tab, sizeof *L->k_pages);
        L->v_pages = calloc(n_tab, sizeof *L->v_pages);
        if (!L->k_pages || !L->v_pages) {
            r = E8KV_ERR(OUT_OF_MEMORY);
            break;
        }
        c->fixed_bytes += 2 * n_tab * sizeof(kv_page);
        if (c->n_sink) {
            const size_t n = c->n_head_kv * c->n_sink * c->head_dim;
            L->k_sink = calloc(n, sizeof(float));
            L->v_sink = calloc(n, sizeof(float));
            if (!L->k_sink || !L->v_sink) {
                r = E8KV_ERR(OUT_OF_MEMORY);
                break;
            }
            c->fixed_bytes += 2 * n * sizeof(float);
        }
        if (L->k.centered || L->v.centered) {
            const size_t n = c->n_head_kv * c->head_dim;
            L->k_mu = calloc(4 * n, sizeof(float));
            if (!L->k_mu) {
                r = E8KV_ERR(OUT_OF_MEMORY);
                break;
            }
            L->v_mu = L->k_mu + n;
            L->k_mu_read = L->k_mu + 2 * n;
            L->v_mu_read = L->k_mu + 3 * n;
            c->fixed_bytes += 4 * n * sizeof(float);
        }
        if (L->k.centered && c->center == 3) {
            if (!(L->k_rc = calloc(c->n_head_kv, sizeof *L->k_rc))) {
                r = E8KV_ERR(OUT_OF_MEMORY);
                break;
            }
            c->fixed_bytes += c->n_head_kv * sizeof *L->k_rc;
        }
    }
    free(lspec);
    if (!e8kv_is_error(r) && c->center == 3) r = rc_tables(c);
    free(auto_names);
    if (!e8kv_is_error(r) && init_pages(c)) r = E8KV_ERR(OUT_OF_MEMORY);
    if (e8kv_is_error(r)) {
        fail_create(c, err, r);
        return NULL;
    }
    /* e8box keys: their prepared integer queries for sliced attention (attention.c) */
    int box = 0;
    for (size_t l = 0; l < c->n_layer; l++)
        box |= c->layers[l].k.fast == KV_FAST_E8BOX;
    if (box && c->attn_part) {
        c->attn_boxq = malloc(E8KV_ATTEND_PART_MAX / (c->head_dim + 2) * sizeof *c->attn_boxq);
        if (!c->attn_boxq) {
            fail_create(c, err, E8KV_ERR(OUT_OF_MEMORY));
            return NULL;
        }
    }
    /* the transforms' weights or entropy-code tables; their bases and score weights belong to the shared
     * calibration (e8kv_calib_bytes), unless built for this cache alone (score_owned) */
    for (size_t i = 0; c->xforms && i < 2 * c->n_layer; i++)
        c->fixed_bytes += sizeof(kv_xform) +
                          (c->xforms[i].w ? 2 * c->n_head_kv * c->head_dim * sizeof(float) : 0) +
                          (c->xforms[i].var_codec ? c->n_head_kv * c->xforms[i].var_codec[0]->state_bytes : 0);
    if (c->score_owned)
        c->fixed_bytes += sizeof *c->score_owned +
                          c->n_layer * c->n_head_kv * c->head_dim * (c->head_dim + 3) * sizeof(float);
    return c;
}

static_assert(sizeof(kv_page) == sizeof(uint8_t *) + 8, "the slab id sits in kv_page's padding");

static void free_page(e8kv_cache *c, kv_page *pg) {
    if (!pg->data) return;
    e8kv_pages_free(&c->pages, pg->data, pg->slab);
    pg->data = NULL;
    pg->raw = 0;
}

/* A zeroed page for pg (raw: f32 vectors, else f's codes); 0 or OUT_OF_MEMORY (pg unchanged). */
size_t e8kv_cache_alloc_page(e8kv_cache *c, const kv_format *f, kv_page *pg, int raw) {
    uint32_t slab = 0;
    uint8_t *data = e8kv_pages_alloc(&c->pages, kv_page_bytes(c, f, raw), &slab);
    if (!data) return E8KV_ERR(OUT_OF_MEMORY);
    pg->data = data;
    pg->slab = slab;
    pg->raw = (uint8_t)raw;
    return 0;
}

/* The allocator names the slabs to empty; every table entry pointing into one moves (kvcache.h). */
void e8kv_cache_compact_pages(e8kv_cache *c) {
    if (!c->layers || !e8kv_pages_compact_begin(&c->pages)) return;
    const size_t n_tab = c->n_head_kv * c->n_page_max;
    for (size_t l = 0; l < c->n_layer; l++)
        for (int is_k = 0; is_k < 2; is_k++) {
            kv_page *tab = is_k ? c->layers[l].k_pages : c->layers[l].v_pages;
            for (size_t i = 0; tab && i < n_tab; i++)
                if (tab[i].data && e8kv_pages_moving(&c->pages, tab[i].slab))
                    e8kv_pages_move(&c->pages, &tab[i].data, &tab[i].slab);
        }
    e8kv_pages_compact_end(&c->pages);
}

/* Free every page whose first position is >= n_keep, in every head of both streams of L. */
static void free_pages_from(e8kv_cache *c, kv_layer *L, size_t n_keep) {
    const size_t first = (n_keep + c->page_tokens - 1) / c->page_tokens;
    for (size_t h = 0; h < c->n_head_kv; h++)
        for (size_t i = first; i < c->n_page_max; i++) {
            free_page(c, &L->k_pages[h * c->n_page_max + i]);
            free_page(c, &L->v_pages[h * c->n_page_max + i]);
        }
}

void e8kv_cache_free_pages_from(e8kv_cache *c, kv_layer *L, size_t n_keep) {
    free_pages_from(c, L, n_keep);
}

void e8kv_cache_free(e8kv_cache *cache) {
    if (!cache) return;
    e8kv_pool_free(cache->pool_owned);
    free(cache->attn_part);
    free(cache->attn_boxq);
    free(cache->rc_tab);
    e8kv_rope_free(cache->rope);
    free(cache->rope_freqs);
    if (cache->attn_mu_ready) pthread_mutex_destroy(&cache->attn_mu);
    if (cache->layers) {
        for (size_t l = 0; l < cache->n_layer; l++) {
            kv_layer *L = &cache->layers[l];
            free(L->pos);
            if (L->k_pages && L->v_pages) free_pages_from(cache, L, 0);
            free(L->k_pages);
            free(L->v_pages);
            free(L->k_sink);
            free(L->k_mu);
            free(L->k_rc);
            free(L->v_sink);
        }
        free(cache->layers);
    }
    e8kv_pages_release(&cache->pages);
    for (size_t i = 0; i < cache->n_codecs; i++)
        e8kv_codec_free(cache->codecs[i]);
    e8kv_xform_free(cache);
    e8kv_calib_free(cache->calib_owned);
    free(cache);
}

/* ---------------------------------------------------------------- append */

/* A raw page that the window has left behind, encoded into a fresh buffer not yet swapped in. */
typedef struct {
    kv_page *page;
    kv_page coded;
} pending_conv;

/* Encode one stream (K or V) of one head for tokens [n0, n1). Pages first touched here are allocated
 * (raw when a window is configured); rollback is the caller's free_pages_from(n0). */
/* Code one vector of head h's stream, minus the head's mean when the stream is centered (mu != NULL), and
 * minus the turned part of K's centre at its position with center=rope (turned != NULL: (x − mu) − turned,
 * the CUDA cache's order). */
static size_t encode_vector(const kv_format *f, size_t h, uint8_t *dst, const float *x, const float *mu,
                            const float *turned, size_t d) {
    if (!mu) return e8kv_fmt_encode(f, h, dst, x);
    float t[E8KV_MAX_HEAD_DIM];
    for (size_t i = 0; i < d; i++)
        t[i] = x[i] - mu[i];
    for (size_t i = 0; turned && i < d; i++)
        t[i] = t[i] - turned[i];
    return e8kv_fmt_encode(f, h, dst, t);
}

/* The turned centre of a K vector of head h at slot `slot` (its position: kv_slot_pos) into buf, with
 * RoPE's own cos, sin at that position (cs: a row of e8kv_cache_rc_exact there, or NULL to compute it), or
 * NULL when the stream has none (V, or no center=rope). */
static const float *turned_at(const e8kv_cache *c, const kv_layer *L, const kv_format *f, size_t h,
                              size_t slot, const float *cs, float *buf) {
    if (f != &L->k || !L->k_rc) return NULL;
    float row[E8KV_MAX_HEAD_DIM];
    if (!cs) e8kv_cache_rc_exact(c, kv_slot_pos(L, h, slot), 1, row);
    e8kv_cache_rc_turned(c, L, h, cs ? cs : row, buf);
    return buf;
}

/* Token-group formats (kvcache.h): tokens [slot, slot + n) of a coded page. */
void e8kv_cache_read_group(const kv_format *f, const uint8_t *page, size_t slot, size_t n,
                           float *restrict dst) {
    const size_t G = f->group, d = f->codec->head_dim;
    for (size_t t = 0; t < n;) {
        const size_t g = (slot + t) / G, t0 = (slot + t) % G, m = G - t0 < n - t ? G - t0 : n - t;
        f->codec->group->decode(f->codec, dst + t * d, page + g * G * f->vector_bytes, t0, m, f->is_key);
        t += m;
    }
}

/* An append into a coded page of a token-group format (after a truncate): back to raw, the decoded values
 * of its tokens in place of the originals; it is coded again once full. */
static size_t reopen_group_page(e8kv_cache *c, const kv_format *f, kv_page *pg) {
    kv_page raw = {0};
    E8KV_RETURN_IF_ERROR(e8kv_cache_alloc_page(c, f, &raw, 1));
    e8kv_cache_read_group(f, pg->data, 0, c->page_tokens, (float *)(void *)raw.data);
    free_page(c, pg);
    *pg = raw;
    return 0;
}

/* rc_rows: with center=rope, RoPE's cos, sin at the positions of slots [n0, n1) (e8kv_cache_rc_exact) */
static size_t append_stream(e8kv_cache *c, const kv_layer *L, const kv_format *f, size_t h, kv_page *tab,
                            float *sink, const float *src, size_t stride, size_t n0, size_t n1, const float *mu,
                            const float *rc_rows) {
    const size_t d = c->head_dim, P = c->page_tokens;
    float turned[E8KV_MAX_HEAD_DIM];
    for (size_t pos = n0; pos < n1; pos++) {
        const float *x = src + (pos - n0) * stride;
        if (pos < c->n_sink) {
            memcpy(sink + pos * d, x, d * sizeof(float));
            continue;
        }
        kv_page *pg = &tab[pos / P];
        if (pg->data && !pg->raw && f->group) E8KV_RETURN_IF_ERROR(reopen_group_page(c, f, pg));
        if (!pg->data) E8KV_RETURN_IF_ERROR(e8kv_cache_alloc_page(c, f, pg, c->window > 0 || f->group));
        const size_t slot = pos % P;
        if (pg->raw) {
            memcpy((float *)(void *)pg->data + slot * d, x, d * sizeof(float));
        } else {
            E8KV_RETURN_IF_ERROR(encode_vector(f, h, pg->data + slot * f->vector_bytes, x, mu,
                                               turned_at(c, L, f, h, pos,
                                                         rc_rows ? rc_rows + (pos - n0) * d : NULL, turned),
                                               d));
        }
    }
    return 0;
}

/* Encode raw pages of one stream whose last position is older than the window at n_tokens = n. */
static size_t convert_stream(e8kv_cache *c, const kv_layer *L, const kv_format *f, size_t h, kv_page *tab,
                             size_t n0, size_t n, pending_conv *pend, size_t *n_pend, size_t cap,
                             const float *mu) {
    const size_t P = c->page_tokens, d = c->head_dim;
    float turned[E8KV_MAX_HEAD_DIM];
    if (n < c->window) return 0;
    const size_t n_old = n - c->window; /* positions < n_old are outside the window */
    /* pages already outside the window at n0 were converted by earlier calls (truncate only shrinks) */
    const size_t i0 = n0 >= c->window ? (n0 - c->window) / P : 0;
    for (size_t i = i0; (i + 1) * P <= n_old; i++) {
        kv_page *pg = &tab[i];
        if (!pg->data || !pg->raw) continue;
        /* cannot happen: bounded by the pages an append can complete */
        if (*n_pend >= cap) return E8KV_ERR(GENERIC);
        kv_page cp = {0};
        E8KV_RETURN_IF_ERROR(e8kv_cache_alloc_page(c, f, &cp, 0));
        pend[(*n_pend)++] = (pending_conv){pg, cp};
        uint8_t *const coded = cp.data;
        float *raw = (float *)(void *)pg->data;
        if (f->group) {
            /* sink slots are unused: give them a neighbour's values so they do not widen the statistics */
            for (size_t s = 0; s < P && i * P + s < c->n_sink && c->n_sink < (i + 1) * P; s++)
                memcpy(raw + s * d, raw + (c->n_sink - i * P) * d, d * sizeof(float));
            for (size_t g = 0; g < P; g += f->group)
                E8KV_RETURN_IF_ERROR(
                    f->codec->group->encode(f->codec, coded + g * f->vector_bytes, raw + g * d, f->is_key));
            continue;
        }
        for (size_t s = 0; s < P; s++) {
            if (i * P + s < c->n_sink) continue;
            E8KV_RETURN_IF_ERROR(encode_vector(f, h, coded + s * f->vector_bytes, raw + s * d, mu,
                                               turned_at(c, L, f, h, i * P + s, NULL, turned), d));
        }
    }
    return 0;
}

/* Pages of one stream table (every head) that an append of [n0, n1) allocates: the absent ones past the
 * sink, and the coded pages of a token-group format that it reopens as raw. */
static size_t new_pages(const e8kv_cache *c, const kv_layer *L, const kv_page *tab, size_t n0, size_t n1) {
    const size_t P = c->page_tokens, lo = n0 > c->n_sink ? n0 : c->n_sink;
    const int group = (tab == L->k_pages ? L->k.group : L->v.group) != 0;
    size_t n = 0;
    for (size_t h = 0; h < c->n_head_kv && lo < n1; h++)
        for (size_t i = lo / P; i <= (n1 - 1) / P; i++) {
            const kv_page *pg = &tab[h * c->n_page_max + i];
            n += !pg->data || (group && !pg->raw);
        }
    return n;
}

/* Raw pages of one stream table (every head) that leave the window in an append of [n0, n1): coded
 * copies are made for them (convert_stream's loop). */
static size_t raw_pages_leaving(const e8kv_cache *c, const kv_page *tab, size_t n0, size_t n1) {
    const size_t P = c->page_tokens;
    if (n1 < c->window) return 0;
    const size_t n_old = n1 - c->window, i0 = n0 >= c->window ? (n0 - c->window) / P : 0;
    size_t n = 0;
    for (size_t h = 0; h < c->n_head_kv; h++)
        for (size_t i = i0; (i + 1) * P <= n_old; i++) {
            const kv_page *pg = &tab[h * c->n_page_max + i];
            n += pg->data && pg->raw;
        }
    return n;
}

int e8kv_cache_reserve_pages(e8kv_cache *c, const kv_format *fk, int rk, size_t nk, const kv_format *fv,
                             int rv, size_t nv) {
    const size_t bk = kv_page_bytes(c, fk, rk), bv = kv_page_bytes(c, fv, rv);
    if (e8kv_aligned_size(bk) == e8kv_aligned_size(bv))
        return nk + nv && e8kv_pages_reserve(&c->pages, bk, nk + nv);
    return (nk && e8kv_pages_reserve(&c->pages, bk, nk)) || (nv && e8kv_pages_reserve(&c->pages, bv, nv));
}

/* The mean subtracted from head h's K (is_k) or V stream before coding; NULL when not centered. */
static const float *mean_of(const kv_layer *L, int is_k, size_t h, size_t d) {
    const kv_format *f = is_k ? &L->k : &L->v;
    if (!f->centered) return NULL;
    return (is_k ? L->k_mu : L->v_mu) + h * d;
}

/* Fix the means of a new sequence from its first append (k, v: (n_tok, n_head_kv * head_dim)), summed
 * in double so the result does not depend on the order of anything but the tokens. */
void e8kv_cache_means_to_read_domain(const e8kv_cache *c, kv_layer *L) {
    const size_t d = c->head_dim, n = c->n_head_kv * d;
    memcpy(L->k_mu_read, L->k_mu, n * sizeof(float));
    memcpy(L->v_mu_read, L->v_mu, n * sizeof(float));
    for (size_t h = 0; h < c->n_head_kv; h++) {
        if (L->k.rotated) e8kv_fmt_forward(&L->k, h, d, L->k_mu_read + h * d, 1);
        if (L->v.rotated) e8kv_fmt_forward(&L->v, h, d, L->v_mu_read + h * d, 1);
    }
}

/* center=rope, head h: each RoPE pair's mean before RoPE over the first append's n_tok keys (k: rows of
 * n_head_kv·head_dim; the keys at positions 0 ..), the E8KV_RC_PAIRS pairs whose energy beyond k_mu's is
 * largest (NaN last, ties to the lower pair), and k_mu zeroed there; n_tok 0 (no means): pairs 0 .. 7 with
 * mean 0. The CUDA cache's rope_means_kernel does the same operations: exact products in double, sums in
 * token order. */
static void rc_means(const e8kv_cache *c, kv_layer *L, size_t h, const float *k, size_t n_tok,
                     const float *rc_rows) {
    const size_t d = c->head_dim, half = d / 2, stride = c->n_head_kv * d;
    double sx[E8KV_MAX_HEAD_DIM / 2] = {0}, sy[E8KV_MAX_HEAD_DIM / 2] = {0}, e[E8KV_MAX_HEAD_DIM / 2];
    float a[E8KV_MAX_HEAD_DIM / 2], b[E8KV_MAX_HEAD_DIM / 2];
    float *const mu = L->k_mu + h * d;
    for (size_t t = 0; t < n_tok; t++) {
        const float *cs = rc_rows + t * d; /* RoPE's own, at positions 0 .. */
        const float *x = k + t * stride + h * d;
        for (size_t i = 0; i < half; i++) {
            const double x0 = x[c->rope_neox ? i : 2 * i], x1 = x[c->rope_neox ? i + half : 2 * i + 1];
            const double C = cs[2 * i], S = cs[2 * i + 1];
            const double p0 = x0 * C, p1 = x1 * S, p2 = x1 * C, p3 = x0 * S; /* exact: 24-bit factors */
            sx[i] += p0 + p1;
            sy[i] += p2 - p3;
        }
    }
    for (size_t i = 0; i < half; i++) {
        a[i] = n_tok ? (float)(sx[i] / (double)n_tok) : 0.0f;
        b[i] = n_tok ? (float)(sy[i] / (double)n_tok) : 0.0f;
        const double ma = mu[c->rope_neox ? i : 2 * i], mb = mu[c->rope_neox ? i + half : 2 * i + 1];
        const double ea = (double)a[i] * a[i], eb = (double)b[i] * b[i], fa = ma * ma, fb = mb * mb;
        e[i] = n_tok ? (ea + eb) - (fa + fb) : -(double)i;
        if (e[i] != e[i]) e[i] = -INFINITY; /* NaN: last */
    }
    kv_rc *rc = &L->k_rc[h];
    uint8_t taken[E8KV_MAX_HEAD_DIM / 2] = {0};
    for (size_t k8 = 0; k8 < E8KV_RC_PAIRS; k8++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < half; i++)
            if (!taken[i] && (best == SIZE_MAX || e[i] > e[best])) best = i;
        taken[best] = 1;
        rc->pair[k8] = (uint32_t)best;
        rc->m[2 * k8] = a[best], rc->m[2 * k8 + 1] = b[best];
        mu[c->rope_neox ? best : 2 * best] = 0.0f;
        mu[c->rope_neox ? best + half : 2 * best + 1] = 0.0f;
    }
}

static void set_means(const e8kv_cache *c, kv_layer *L, const float *k, const float *v, size_t n_tok,
                      const float *rc_rows) {
    const size_t d = c->head_dim, stride = c->n_head_kv * d;
    const int on = n_tok >= E8KV_CACHE_CENTER_MIN_TOKENS;
    for (size_t i = 0; i < stride; i++) {
        double sk = 0.0, sv = 0.0;
        for (size_t t = 0; on && t < n_tok; t++) {
            sk += k[t * stride + i];
            sv += v[t * stride + i];
        }
        L->k_mu[i] = L->k.centered ? (float)(sk / (double)n_tok) : 0.0f;
        L->v_mu[i] = L->v.centered ? (float)(sv / (double)n_tok) : 0.0f;
    }
    for (size_t h = 0; L->k_rc && h < c->n_head_kv; h++)
        rc_means(c, L, h, k, on ? n_tok : 0, rc_rows);
    e8kv_cache_means_to_read_domain(c, L);
    L->mu_set = 1;
}

size_t e8kv_cache_append(e8kv_cache *cache, size_t layer, const float *k, const float *v, size_t n_tok) {
    if (!cache || !k || !v || n_tok == 0) return E8KV_ERR(BAD_ARGUMENT);
    if (layer >= cache->n_layer) return E8KV_ERR(DIMENSION);
    kv_layer *L = &cache->layers[layer];
    const size_t n0 = L->n_tokens;
    if (n_tok > cache->n_ctx - n0) return E8KV_ERR(CONTEXT_FULL);
    const size_t d = cache->head_dim, stride = cache->n_head_kv * d;
    /* screen everything first: a rejected call changes nothing */
    if (!e8kv_all_finite(k, n_tok * stride) || !e8kv_all_finite(v, n_tok * stride))
        return E8KV_ERR(NONFINITE);
    const size_t n1 = n0 + n_tok;
    const size_t M = cache->n_page_max;
    /* the pages this call opens, in as few slabs as the allocator allows (pages.h) */
    const int raw = cache->window > 0;
    if (e8kv_cache_reserve_pages(cache, &L->k, L->k.group || raw, new_pages(cache, L, L->k_pages, n0, n1),
                                 &L->v, L->v.group || raw, new_pages(cache, L, L->v_pages, n0, n1)))
        return E8KV_ERR(OUT_OF_MEMORY);
    size_t r = 0;
    /* center=rope: RoPE's cos, sin at the new tokens' positions (slots past every evicted one's map) */
    float rc_local[4 * E8KV_MAX_HEAD_DIM], *rc_rows = NULL;
    if (L->k_rc) {
        rc_rows = n_tok * d <= sizeof rc_local / sizeof *rc_local ? rc_local : malloc(n_tok * d * sizeof *rc_rows);
        if (!rc_rows) {
            e8kv_cache_compact_pages(cache);
            return E8KV_ERR(OUT_OF_MEMORY);
        }
        e8kv_cache_rc_exact(cache, n0 + L->n_evicted, n_tok, rc_rows);
    }
    if (n0 == 0 && !L->mu_set && L->k_mu) set_means(cache, L, k, v, n_tok, rc_rows);
    for (size_t h = 0; h < cache->n_head_kv && !e8kv_is_error(r); h++) {
        float *ks = L->k_sink ? L->k_sink + h * cache->n_sink * d : NULL;
        float *vs = L->v_sink ? L->v_sink + h * cache->n_sink * d : NULL;
        r = append_stream(cache, L, &L->k, h, L->k_pages + h * M, ks, k + h * d, stride, n0, n1,
                          mean_of(L, 1, h, d), rc_rows);
        if (!e8kv_is_error(r))
            r = append_stream(cache, L, &L->v, h, L->v_pages + h * M, vs, v + h * d, stride, n0, n1,
                              mean_of(L, 0, h, d), NULL);
    }
    if (rc_rows != rc_local) free(rc_rows);
    /* a decode step of a model with up to 16 KV heads converts on the stack: no allocation per token */
    pending_conv pend_local[64], *pend = NULL;
    size_t n_pend = 0;
    if (!e8kv_is_error(r) && (cache->window > 0 || L->k.group || L->v.group)) {
        /* pages that leave the window in this call: at most n_tok / P + 1 per stream and head */
        const size_t cap = 2 * cache->n_head_kv * (n_tok / cache->page_tokens + 2);
        pend = cap <= sizeof pend_local / sizeof pend_local[0] ? pend_local : malloc(cap * sizeof *pend);
        if (!pend || e8kv_cache_reserve_pages(cache, &L->k, 0, raw_pages_leaving(cache, L->k_pages, n0, n1),
                                              &L->v, 0, raw_pages_leaving(cache, L->v_pages, n0, n1)))
            r = E8KV_ERR(OUT_OF_MEMORY);
        for (size_t h = 0; h < cache->n_head_kv && !e8kv_is_error(r); h++) {
            r = convert_stream(cache, L, &L->k, h, L->k_pages + h * M, n0, n1, pend, &n_pend, cap,
                               mean_of(L, 1, h, d));
            if (!e8kv_is_error(r))
                r = convert_stream(cache, L, &L->v, h, L->v_pages + h * M, n0, n1, pend, &n_pend, cap,
                                   mean_of(L, 0, h, d));
        }
    }
    if (e8kv_is_error(r)) {
        for (size_t i = 0; i < n_pend; i++)
            free_page(cache, &pend[i].coded);
        if (pend != pend_local) free(pend);
        free_pages_from(cache, L, n0);
        e8kv_cache_compact_pages(cache);
        return r;
    }
    for (size_t i = 0; i < n_pend; i++) {
        free_page(cache, pend[i].page);
        *pend[i].page = pend[i].coded;
    }
    if (pend != pend_local) free(pend);
    /* the raw pages just freed leave holes in slabs that stay live (a page that is still inside the window
     * shares its slab with ones that left it): compact when that adds up (pages.h) */
    if (n_pend && e8kv_pages_wasteful(&cache->pages)) e8kv_cache_compact_pages(cache);
    L->n_tokens = n1;
    E8KV_RETURN_IF_ERROR(e8kv_evict_after_append(cache, layer, n_tok));
    return L->n_tokens + L->n_evicted;
}

/* ---------------------------------------------------------------- queries and maintenance */

size_t e8kv_cache_n_tokens(const e8kv_cache *cache, size_t layer) {
    if (!cache) return E8KV_ERR(BAD_ARGUMENT);
    if (layer >= cache->n_layer) return E8KV_ERR(DIMENSION);
    return cache->layers[layer].n_tokens + cache->layers[layer].n_evicted;
}

size_t e8kv_cache_n_kept(const e8kv_cache *cache, size_t layer) {
    if (!cache) return E8KV_ERR(BAD_ARGUMENT);
    if (layer >= cache->n_layer) return E8KV_ERR(DIMENSION);
    return cache->layers[layer].n_tokens;
}

int e8kv_cache_keys_pre_rope(const e8kv_cache *cache) {
    return cache ? cache->rope_pre : 0;
}

/* Move one stream of one head: positions [pos + n, n_tok) to [pos, n_tok − n). Source and destination
 * slots are either both coded (bytes copied), both raw (floats copied), or a raw source into a coded
 * page (encoded: enc holds those codes, made beforehand). A coded source never lands in a raw page: raw
 * pages hold the newest positions and everything moves toward older ones. */
static void move_stream(const e8kv_cache *c, const kv_format *f, kv_page *tab, size_t pos, size_t n,
                        size_t n_tok, const uint8_t *enc) {
    const size_t d = c->head_dim, P = c->page_tokens, vb = f->vector_bytes;
    size_t e = 0;
    for (size_t dst = pos; dst + n < n_tok; dst++) {
        const size_t src = dst + n;
        const kv_page *sp = &tab[src / P];
        kv_page *dp = &tab[dst / P];
        assert(sp->data && dp->data && !(dp->raw && !sp->raw));
        if (dp->raw)
            memcpy((float *)(void *)dp->data + (dst % P) * d,
                   (const float *)(const void *)sp->data + (src % P) * d, d * sizeof(float));
        else if (!sp->raw)
            memmove(dp->data + (dst % P) * vb, sp->data + (src % P) * vb, vb);
        else
            memcpy(dp->data + (dst % P) * vb, enc + vb * e++, vb);
    }
}

/* Codes of the raw sources that move into coded pages (move_stream's order), or NULL when none. */
static size_t encode_moves(const e8kv_cache *c, const kv_layer *L, const kv_format *f, int is_k, size_t h,
                           const kv_page *tab, size_t pos, size_t n, size_t n_tok, uint8_t **out) {
    const size_t d = c->head_dim, P = c->page_tokens, vb = f->vector_bytes;
    size_t cnt = 0;
    for (size_t dst = pos; dst + n < n_tok; dst++)
        cnt += tab[(dst + n) / P].raw && !tab[dst / P].raw;
    *out = NULL;
    if (!cnt) return 0;
    uint8_t *enc = malloc(cnt * vb);
    if (!enc) return E8KV_ERR(OUT_OF_MEMORY);
    size_t e = 0;
    for (size_t dst = pos; dst + n < n_tok; dst++) {
        const size_t src = dst + n;
        if (!tab[src / P].raw || tab[dst / P].raw) continue;
        const float *x = (const float *)(const void *)tab[src / P].data + (src % P) * d;
        /* no turned centre: remove() refuses keys coded after RoPE, and center=rope's are */
        const size_t r = encode_vector(f, h, enc + vb * e++, x, mean_of(L, is_k, h, d), NULL, d);
        if (e8kv_is_error(r)) {
            free(enc);
            return r;
        }
    }
    *out = enc;
    return 0;
}

size_t e8kv_cache_remove(e8kv_cache *cache, size_t pos, size_t n) {
    if (!cache) return E8KV_ERR(BAD_ARGUMENT);
    /* keys stored with the caller's RoPE would keep their old positions: only pre-RoPE keys (RoPE applied
     * at attention time) or a cache told there is no RoPE can shift */
    if (!cache->rope_pre && kv_has_rope(cache)) return E8KV_ERR(UNSUPPORTED);
    if (pos < cache->n_sink && n) return E8KV_ERR(UNSUPPORTED); /* sink positions stay exact forever */
    for (size_t l = 0; l < cache->n_layer; l++) /* positions of an evicted layer are not contiguous */
        if (cache->layers[l].n_map) return E8KV_ERR(UNSUPPORTED);
    for (size_t l = 0; l < cache->n_layer; l++) /* token groups are coded together: no token moves alone */
        if (n && (!e8kv_codec_traits(cache->layers[l].k.codec)->evictable ||
                  !e8kv_codec_traits(cache->layers[l].v.codec)->evictable))
            return E8KV_ERR(UNSUPPORTED);
    const size_t H = cache->n_head_kv, M = cache->n_page_max;
    /* every encode first, so a failure changes nothing */
    uint8_t **enc = calloc(2 * H * cache->n_layer, sizeof *enc);
    if (!enc) return E8KV_ERR(OUT_OF_MEMORY);
    size_t r = 0;
    for (size_t l = 0; l < cache->n_layer && !e8kv_is_error(r); l++) {
        const kv_layer *L = &cache->layers[l];
        if (pos >= L->n_tokens || !n) continue;
        const size_t cut = n < L->n_tokens - pos ? n : L->n_tokens - pos;
        for (size_t h = 0; h < H && !e8kv_is_error(r); h++) {
            r = encode_moves(cache, L, &L->k, 1, h, L->k_pages + h * M, pos, cut, L->n_tokens,
                             &enc[(l * H + h) * 2]);
            if (!e8kv_is_error(r))
                r = encode_moves(cache, L, &L->v, 0, h, L->v_pages + h * M, pos, cut, L->n_tokens,
                                 &enc[(l * H + h) * 2 + 1]);
        }
    }
    size_t n_max = 0;
    for (size_t l = 0; l < cache->n_layer; l++) {
        kv_layer *L = &cache->layers[l];
        if (!e8kv_is_error(r) && pos < L->n_tokens && n) {
            const size_t cut = n < L->n_tokens - pos ? n : L->n_tokens - pos;
            for (size_t h = 0; h < H; h++) {
                move_stream(cache, &L->k, L->k_pages + h * M, pos, cut, L->n_tokens, enc[(l * H + h) * 2]);
                move_stream(cache, &L->v, L->v_pages + h * M, pos, cut, L->n_tokens,
                            enc[(l * H + h) * 2 + 1]);
            }
            L->n_tokens -= cut;
            free_pages_from(cache, L, L->n_tokens);
        }
        for (size_t i = 0; i < 2 * H; i++)
            free(enc[l * 2 * H + i]);
        if (L->n_tokens > n_max) n_max = L->n_tokens;
    }
    free(enc);
    e8kv_cache_compact_pages(cache);
    return e8kv_is_error(r) ? r : n_max;
}

size_t e8kv_cache_truncate(e8kv_cache *cache, size_t n_keep) {
    if (!cache) return E8KV_ERR(BAD_ARGUMENT);
    /* an evicted layer is cut only after its mapped slots (their heads hold different positions) */
    for (size_t l = 0; l < cache->n_layer && n_keep; l++) {
        const kv_layer *L = &cache->layers[l];
        if (L->n_map && n_keep < L->n_map + L->n_evicted) return E8KV_ERR(UNSUPPORTED);
    }
    size_t n_max = 0;
    for (size_t l = 0; l < cache->n_layer; l++) {
        kv_layer *L = &cache->layers[l];
        if (n_keep == 0) {
            L->mu_set = 0; /* a new sequence measures its own means */
            e8kv_evict_reset(cache, L);
        }
        const size_t slots = n_keep - L->n_evicted; /* n_keep >= n_evicted (checked above) */
        if (slots < L->n_tokens) {
            L->n_tokens = slots;
            free_pages_from(cache, L, slots);
        }
        if (L->n_tokens + L->n_evicted > n_max) n_max = L->n_tokens + L->n_evicted;
    }
    e8kv_cache_compact_pages(cache);
    return n_max;
}

void e8kv_cache_clear(e8kv_cache *cache) {
    if (cache) e8kv_cache_truncate(cache, 0);
}

size_t e8kv_cache_bytes(const e8kv_cache *cache) {
    if (!cache) return 0;
    return e8kv_pages_bytes(&cache->pages) + cache->fixed_bytes + cache->index_bytes;
}

size_t e8kv_cache_fixed_bytes(const e8kv_cache *cache) {
    return cache ? cache->fixed_bytes : 0;
}

double e8kv_cache_bits_per_value(const e8kv_cache *cache) {
    if (!cache) return 0.0;
    size_t bytes = 0; /* per token and head, over layers and K/V */
    for (size_t l = 0; l < cache->n_layer; l++)
        bytes += cache->layers[l].k.vector_bytes + cache->layers[l].v.vector_bytes;
    return 8.0 * (double)bytes / (2.0 * (double)cache->n_layer * (double)cache->head_dim);
}

size_t e8kv_cache_page_tokens(const e8kv_cache *cache) {
    return cache ? cache->page_tokens : 0;
}

const char *e8kv_cache_preset_spec_calib(const char *name, const e8kv_calib *calib) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(k_presets[i].name, name)) return preset_pick(&k_presets[i], calib);
    return NULL;
}

const char *e8kv_cache_preset_spec(const char *name) {
    return e8kv_cache_preset_spec_calib(name, NULL);
}
