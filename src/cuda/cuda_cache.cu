/* The device paged cache: one cudaMalloc holding every page pool, the owned sequences' block tables, the
 * split-K workspace and the small staging buffers (so the device bytes are exactly the accounted bytes),
 * the host-side page allocator (free list + reference counts, copy-on-write of shared pages) and the
 * argument checks of the public API (e8kv_cuda.h). Page bytes: doc/format.md §6. */
#include "cuda_internal.cuh"

#include "common/common.h"

#include <math.h>
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>

struct e8kv_cuda_cache {
    /* n_head_kv, d: the pages' heads and their dimension; hkv, hd: the caller's. Equal, but at head_dim 256
     * (pair = 1): each KV head is two heads of 128 in the pages (its halves, as head_dim 128 codes them) */
    size_t n_layer, n_head_kv, d, bs, n_blocks, max_ctx, width, max_seqs, max_batch, max_n_head, max_append;
    size_t hkv, hd;
    int pair;
    size_t sink;     /* sink=N: exact f32 rows of the first N positions, max_seqs rows per (layer, stream) */
    float *d_sink;   /* (n_layer, 2, max_seqs, sink, n_head_kv, d) */
    int32_t *d_rows; /* (max_batch): the rows (sequence ids) of one seq_attend call */
    int64_t *d_sslots; /* (max_append): sink slots of an owned append */
    int64_t *sslots;   /* host twin */
    int centered;      /* some stream has means (center=1): sd[].mu, (max_seqs, n_head_kv, d) each */
    int32_t *d_arows;  /* (max_append): the rows of an owned append's tokens */
    int32_t *arows;    /* host twin */
    int rope;          /* center=rope: the K streams' sd[].rc, the table d_cs; d_apos / apos: an owned
                        * append's positions */
    float *d_cs;       /* (n_pos, d): cos, sin of each position and pair, as e8kv_rope_apply has them */
    size_t n_pos;      /* center=rope: positions of d_cs (params.rope_positions, at least max_ctx and 16) */
    int32_t *d_apos, *apos;
    int device, n_sm;
    int *occ;            /* (n_layer) resident attention blocks per SM of the layer's kernel */
    const float **lsink; /* (n_layer) the caller's learned sinks per layer (e8kv_cuda_set_layer_sinks) */
    size_t *lsink_n;     /* (n_layer) their count: the n_head the attention must be called with */
    float rot_scale;
    uint8_t *dev; /* the one allocation */
    size_t dev_bytes;
    size_t o_sink, o_state; /* offsets: the end of the pools (sink rows, means, RoPE table follow), the owned
                             * tables (the end of what a copy or a saved state holds besides them) */
    stream_desc *sd;    /* (n_layer, 2) */
    int32_t *d_tables;  /* (max_seqs, width) */
    int32_t *d_btables; /* (max_batch, width): the tables of one seq_attend call */
    int32_t *d_ctx;     /* (max_batch) */
    int64_t *d_slots;   /* (max_append) */
    float *d_signs;     /* (d) */
    unsigned *d_flags;
    float *d_work;
    size_t work_bytes;
    /* host side */
    int32_t *tables;     /* (max_seqs, width) */
    size_t *lens;        /* (max_seqs, n_layer) */
    size_t *n_pages;     /* (max_seqs) pages in each owned table */
    unsigned char *live; /* (max_seqs) */
    int32_t *refs;       /* (n_blocks) */
    int32_t *free_list;  /* stack of free page ids */
    size_t n_free;
    int64_t *slots;   /* (max_append) */
    int32_t *btables; /* (max_batch, width) */
    int32_t *ctx;     /* (max_batch) */
    int32_t *rows;    /* (max_batch) */
};

int e8kv_cuda_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/* The page format of a GPU codec (e8kv_codec_gpu_format), -1 for one the GPU cannot hold. */
static int page_format(e8kv_gpu_format g) {
    switch (g) {
    case E8KV_GPU_E8BOX4:
        return FMT_BOX4;
    case E8KV_GPU_E8BOX3:
        return FMT_BOX3;
    case E8KV_GPU_E8P2:
        return FMT_E8P2;
    case E8KV_GPU_F16:
        return FMT_F16;
    case E8KV_GPU_BF16:
        return FMT_BF16;
    default:
        return -1;
    }
}

/* Each stream's page format (fmt[2 * l + s], s 0 = K, 1 = V) and the rotation's signs, from the library's
 * cache spec grammar (e8kv_cache_spec_layers: a format, k=/v=/kv=, layer rules). Each stream's codec is
 * created as the CPU cache would create it, and the registry says which GPU page format holds its bytes.
 * Items the GPU cache does not implement are SPEC: sink= beyond E8KV_CUDA_SINK_MAX, window=, rope=pre (keys
 * come after RoPE), auto=, evict=/budget=, page= (block_size is the parameter), presets (their formats are
 * not GPU formats). *center: 0 none, 1 center=1 (the default) or all, as the CPU cache has it, 2 center=rope. */
static size_t resolve_formats(const e8kv_cuda_cache_params *p, size_t d, int *fmt, float signs[128],
                              size_t *sink, int *center) {
    if (!p->spec) return E8KV_ERR(SPEC);
    const size_t n = 2 * p->n_layer;
    char(*specs)[E8KV_CODEC_SPEC_MAX_LEN + 1] =
        (char(*)[E8KV_CODEC_SPEC_MAX_LEN + 1])malloc(n * sizeof *specs);
    if (!specs) return E8KV_ERR(OUT_OF_MEMORY);
    e8kv_cache_spec_items it;
    size_t r = e8kv_cache_spec_layers(p->spec, p->n_layer, NULL, &it, specs);
    if (!r &&
        (it.sink > E8KV_CUDA_SINK_MAX || it.window || it.page || it.rope == 1 || it.auto_rates || it.evicts))
        r = E8KV_ERR(SPEC);
    if (!r) *sink = it.sink, *center = it.center == 3 ? 2 : it.center != 0;
    int have_signs = 0;
    for (size_t i = 0; i < n && !r; i++) {
        size_t same = 0; /* a stream with the same spec before this one */
        while (same < i && strcmp(specs[same], specs[i]))
            same++;
        if (same < i) {
            fmt[i] = fmt[same];
            continue;
        }
        size_t e = 0;
        e8kv_codec *codec = e8kv_codec_create(specs[i], d, p->seed, &e);
        if (!codec) {
            r = e8kv_is_error(e) ? e : E8KV_ERR(SPEC);
            break;
        }
        fmt[i] = page_format(e8kv_codec_gpu_format(codec));
        if (fmt_is_box(fmt[i]) || fmt[i] == FMT_E8P2) {
            /* column i of H·D/√d has first entry sign_i/√d; every rotating format shares one seed, so
             * one table must serve all of them */
            float x[128], sg[128];
            for (size_t j = 0; j < d; j++) {
                memset(x, 0, sizeof x);
                x[j] = 1.0f;
                e8kv_codec_rotate(codec, x, 1, 0);
                sg[j] = x[0] < 0.0f ? -1.0f : 1.0f;
            }
            if (!have_signs) memcpy(signs, sg, d * sizeof(float));
            if (memcmp(signs, sg, d * sizeof(float))) r = E8KV_ERR(SPEC);
            have_signs = 1;
        }
        e8kv_codec_free(codec);
        if (fmt[i] < 0) r = E8KV_ERR(SPEC);
    }
    /* e8p:2 only for both streams of a layer (its attention kernel decodes K and V from one table) */
    for (size_t l = 0; l < p->n_layer && !r; l++)
        if ((fmt[2 * l] == FMT_E8P2) != (fmt[2 * l + 1] == FMT_E8P2)) r = E8KV_ERR(SPEC);
    for (size_t j = 0; j < d && !have_signs; j++)
        signs[j] = 1.0f;
    free(specs);
    return r;
}

static size_t align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* query heads per KV head one attention call takes */
static size_t group_max(const e8kv_cuda_cache *c) {
    return c->pair ? E8KV_CU_PAIR_G : 8;
}

/* The split counters at the start of a workspace: max_batch sequences' worth (n_seq's when more), whatever
 * the call's n_seq, so that the partial states of a call with fewer sequences never land on counters that a
 * later call with more expects at zero (calls of different batch sizes share one workspace) */
static size_t counter_bytes(const e8kv_cuda_cache *c, size_t n_seq) {
    return align256((n_seq > c->max_batch ? n_seq : c->max_batch) * c->n_head_kv * sizeof(unsigned));
}

/* The splits of layer l's attention for n_seq sequences of up to max_ctx tokens: what a call launches and
 * what the workspace bound provides for, from one place */
static size_t layer_splits(const e8kv_cuda_cache *c, size_t l, size_t n_seq, size_t max_ctx) {
    return e8kv_cu_n_split(n_seq, c->hkv, max_ctx, c->n_sm, c->occ[l],
                           e8kv_cu_split_min(c->hd, c->sd[2 * l].fmt, c->sd[2 * l + 1].fmt));
}

size_t e8kv_cuda_attend_workspace_bytes(const e8kv_cuda_cache *c, size_t n_seq, size_t n_head,
                                        size_t max_ctx) {
    if (!c || !n_seq || !n_head) return 0;
    size_t ns = 0; /* the most splits of any layer */
    for (size_t l = 0; l < c->n_layer; l++) {
        const size_t n = layer_splits(c, l, n_seq, max_ctx);
        ns = n > ns ? n : ns;
    }
    return counter_bytes(c, n_seq) + align256(n_seq * n_head * ns * c->hd * sizeof(float)) +
           align256(n_seq * n_head * ns * 2 * sizeof(float)) +
           (c->sink ? align256(n_seq * n_head * c->hd * sizeof(float)) + n_seq * n_head * 2 * sizeof(float)
                    : 0);
}

static size_t max_workspace(const e8kv_cuda_cache *c) {
    size_t most = 0;
    for (size_t b = 1; b <= c->max_batch; b++) {
        const size_t w = e8kv_cuda_attend_workspace_bytes(c, b, c->max_n_head, c->max_ctx);
        most = w > most ? w : most;
    }
    return most;
}

void e8kv_cuda_cache_free(e8kv_cuda_cache *c) {
    if (!c) return;
    if (c->dev) cudaFree(c->dev);
    free(c->sd);
    free(c->occ);
    free(c->lsink);
    free(c->lsink_n);
    free(c->tables);
    free(c->lens);
    free(c->n_pages);
    free(c->live);
    free(c->refs);
    free(c->free_list);
    free(c->slots);
    free(c->btables);
    free(c->ctx);
    free(c->sslots);
    free(c->rows);
    free(c->arows);
    free(c->apos);
    free(c);
}

static e8kv_cuda_cache *fail(e8kv_cuda_cache *c, size_t *err, size_t code) {
    if (err) *err = code;
    e8kv_cuda_cache_free(c);
    return NULL;
}

#define E8KV_CU_RETURN_NULL(expr, c, err)                                                                    \
    do {                                                                                                     \
        const size_t e8kv_cu_r_ = (expr);                                                                    \
        if (e8kv_is_error(e8kv_cu_r_)) return fail(c, err, e8kv_cu_r_);                                      \
    } while (0)

/* center=rope: the cos and sin of every position below n_pos and RoPE pair (interleaved pairs, the layout the
 * pages code), as the library's RoPE has them (of theta, or of the given frequencies): e8kv_rope_apply on
 * (1, 0) pairs gives (C, S) */
static size_t upload_rope_table(e8kv_cuda_cache *c, float theta, const float *freqs) {
    size_t e = 0;
    double f[64];
    for (size_t i = 0; freqs && i < c->d / 2; i++)
        f[i] = freqs[i];
    e8kv_rope *rope = freqs ? e8kv_rope_create_freqs(c->d, f, 0, &e) : e8kv_rope_create(c->d, theta, 0, &e);
    if (!rope) return e;
    const size_t chunk = 4096;
    float *x = (float *)malloc(chunk * c->d * sizeof(float));
    for (size_t p0 = 0; p0 < c->n_pos && x && !e; p0 += chunk) {
        const size_t n = c->n_pos - p0 < chunk ? c->n_pos - p0 : chunk;
        for (size_t i = 0; i < n * c->d; i++)
            x[i] = i % 2 ? 0.0f : 1.0f;
        e8kv_rope_apply(rope, x, n, 1, p0);
        if (cudaMemcpy(c->d_cs + p0 * c->d, x, n * c->d * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
            e = E8KV_ERR(CUDA);
    }
    if (!x) e = E8KV_ERR(OUT_OF_MEMORY);
    free(x);
    e8kv_rope_free(rope);
    return e;
}

/* One append (a skipped row: slot -1) and one attend (one token of a zeroed page) at creation, outside any
 * stream capture: the launchers upload their constant tables and set kernel attributes on their first
 * call, synchronously, which a CUDA graph capture would refuse. Nothing in the cache changes. */
static size_t warm_up(e8kv_cuda_cache *c) {
    const size_t row = c->max_n_head * c->hd * sizeof(float);
    uint8_t *tmp = NULL;
    if (cudaMalloc((void **)&tmp, 2 * row) != cudaSuccess) {
        cudaGetLastError();
        return E8KV_ERR(OUT_OF_MEMORY);
    }
    const int32_t one = 1;
    size_t r = 0;
    if (cudaMemset(tmp, 0, 2 * row) != cudaSuccess || cudaMemset(c->d_slots, 0xff, sizeof(int64_t)) != cudaSuccess ||
        cudaMemset(c->d_btables, 0, c->width * sizeof(int32_t)) != cudaSuccess ||
        cudaMemcpy(c->d_ctx, &one, sizeof one, cudaMemcpyHostToDevice) != cudaSuccess)
        r = E8KV_ERR(CUDA);
    if (!r) r = e8kv_cuda_append_slots(c, 0, c->d_slots, tmp, tmp, 1, E8KV_DTYPE_F32);
    if (!e8kv_is_error(r))
        r = e8kv_cuda_attend(c, 0, (float *)(tmp + row), tmp, E8KV_DTYPE_F32, 1, c->hkv, c->d_btables,
                             c->width, c->d_ctx, 1, NULL, 0, NULL);
    if (!e8kv_is_error(r) && cudaDeviceSynchronize() != cudaSuccess) r = E8KV_ERR(CUDA);
    cudaFree(tmp);
    return e8kv_is_error(r) ? r : 0;
}

e8kv_cuda_cache *e8kv_cuda_cache_create(const e8kv_cuda_cache_params *p, size_t *err) {
    if (err) *err = 0;
    if (!p || !p->n_layer || !p->n_head_kv || !p->n_blocks) return fail(NULL, err, E8KV_ERR(BAD_ARGUMENT));
    if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        return fail(NULL, err, E8KV_ERR(HEAD_DIM));
    const size_t bs = p->block_size ? p->block_size : 16;
    if (bs % 16 || p->n_blocks > INT32_MAX / bs) return fail(NULL, err, E8KV_ERR(BAD_ARGUMENT));
    if (p->n_layer > ((size_t)1 << 20)) return fail(NULL, err, E8KV_ERR(BAD_ARGUMENT));
    e8kv_cuda_cache *c = (e8kv_cuda_cache *)calloc(1, sizeof *c);
    if (!c) return fail(NULL, err, E8KV_ERR(OUT_OF_MEMORY));
    c->pair = p->head_dim == 256;
    c->hkv = p->n_head_kv, c->hd = p->head_dim;
    c->n_layer = p->n_layer, c->n_head_kv = p->n_head_kv << c->pair, c->d = p->head_dim >> c->pair,
    c->bs = bs;
    c->n_blocks = p->n_blocks, c->device = p->device;
    c->max_ctx = p->max_ctx ? p->max_ctx : p->n_blocks * bs;
    c->width = (c->max_ctx + bs - 1) / bs;
    c->max_seqs = p->max_seqs ? p->max_seqs : 256;
    c->max_batch = p->max_batch ? p->max_batch : 256;
    c->max_n_head = p->max_n_head ? p->max_n_head : group_max(c) * p->n_head_kv;
    c->max_append = p->max_append ? p->max_append : 4096;
    c->rot_scale = 1.0f / sqrtf((float)c->d); /* as src/transform/fwht.c */
    if (c->max_n_head % c->hkv || c->max_n_head / c->hkv > group_max(c))
        return fail(c, err, E8KV_ERR(DIMENSION));
    c->sd = (stream_desc *)calloc(2 * c->n_layer, sizeof *c->sd);
    c->occ = (int *)calloc(c->n_layer, sizeof *c->occ);
    c->lsink = (const float **)calloc(c->n_layer, sizeof *c->lsink);
    c->lsink_n = (size_t *)calloc(c->n_layer, sizeof *c->lsink_n);
    int *fmt = (int *)calloc(2 * c->n_layer, sizeof *fmt);
    float signs[128];
    int center = 0;
    size_t r = c->sd && c->occ && c->lsink && c->lsink_n && fmt
                   ? resolve_formats(p, c->d, fmt, signs, &c->sink, &center)
                   : E8KV_ERR(OUT_OF_MEMORY);
    for (size_t i = 0; i < 2 * c->n_layer && !r; i++) {
        c->sd[i].fmt = fmt[i];
        /* the e8kv codes are centred by default, raw pages never (the CPU cache's traits) */
        c->sd[i].mu = center && (fmt_is_box(fmt[i]) || fmt[i] == FMT_E8P2) ? (float *)1 : NULL;
        c->centered |= c->sd[i].mu != NULL;
        /* center=rope: the e8box and e8p:2 K streams (their attention kernels add the turned centre back;
         * an e8box K needs an e8box V, e8p:2 pairs with itself: resolve_formats) */
        if (center == 2 && i % 2 == 0 && (fmt_is_box(fmt[i]) || fmt[i] == FMT_E8P2)) {
            c->sd[i].rc = (float *)1;
            c->rope = 1;
        }
        if (center == 2 && i % 2 == 1 && fmt[i - 1] != FMT_E8P2 && fmt_is_box(fmt[i - 1]) != fmt_is_box(fmt[i]))
            r = E8KV_ERR(SPEC);
    }
    free(fmt);
    if (!r && c->rope && !p->rope_freqs && !(p->rope_theta > 0.0f && isfinite(p->rope_theta))) r = E8KV_ERR(SPEC);
    if (!r && c->rope && c->pair) r = E8KV_ERR(SPEC); /* center=rope's pairs are not within the halves */
    /* every index of a sequence has a row (the means read 0 .. n_tok − 1, n_tok ≤ max_ctx), and the
     * attention's table of a sub-tile's 16 offsets */
    c->n_pos = p->rope_positions > c->max_ctx ? p->rope_positions : c->max_ctx;
    if (c->n_pos < 16) c->n_pos = 16;
    if (!r && c->rope && (c->max_ctx > INT32_MAX / c->d || c->n_pos > INT32_MAX / c->d)) r = E8KV_ERR(DIMENSION);
    if (r) return fail(c, err, r);
    if (cudaSetDevice(p->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, p->device) != cudaSuccess)
        return fail(c, err, E8KV_ERR(CUDA));
    for (size_t l = 0; l < c->n_layer; l++)
        c->occ[l] =
            e8kv_cu_ctas_per_sm(c->hd, c->sd[2 * l].fmt, c->sd[2 * l + 1].fmt, c->sd[2 * l].rc != NULL);

    /* one allocation: pools, then tables, workspace, staging */
    size_t off = 0;
    for (size_t l = 0; l < c->n_layer; l++)
        for (int s = 0; s < 2; s++) {
            stream_desc *const sd = &c->sd[2 * l + s];
            sd->head_bytes = bs * fmt_vector_bytes(sd->fmt, c->d);
            sd->n_blocks = c->n_blocks;
            sd->page_bytes = c->n_head_kv * sd->head_bytes;
            if (sd->page_bytes > 0xffffffffu)
                return fail(c, err, E8KV_ERR(DIMENSION)); /* 32-bit page math */
            sd->pool = (uint8_t *)off;
            off = align256(off + c->n_blocks * sd->page_bytes);
        }
    const size_t o_sink = off, sink_floats = 2 * c->n_layer * c->max_seqs * c->sink * c->n_head_kv * c->d;
    off = align256(off + sink_floats * sizeof(float));
    for (size_t i = 0; i < 2 * c->n_layer; i++) /* the means of the centred streams */
        if (c->sd[i].mu) {
            c->sd[i].mu = (float *)off;
            off = align256(off + c->max_seqs * c->n_head_kv * c->d * sizeof(float));
            if (c->sd[i].rc) {
                c->sd[i].rc = (float *)off;
                off = align256(off + c->max_seqs * c->n_head_kv * RC_FLOATS * sizeof(float));
            }
        }
    const size_t o_cs = off;
    off = align256(off + (c->rope ? c->n_pos * c->d * sizeof(float) : 0));
    const size_t pools = off;
    const size_t o_tables = off;
    off = align256(off + c->max_seqs * c->width * sizeof(int32_t));
    const size_t o_btables = off;
    off = align256(off + c->max_batch * c->width * sizeof(int32_t));
    const size_t o_ctx = off;
    off = align256(off + c->max_batch * sizeof(int32_t));
    const size_t o_slots = off;
    off = align256(off + c->max_append * sizeof(int64_t));
    const size_t o_sslots = off;
    off = align256(off + (c->sink ? c->max_append * sizeof(int64_t) : 0));
    const size_t o_rows = off;
    off = align256(off + c->max_batch * sizeof(int32_t));
    const size_t o_arows = off;
    off = align256(off + (c->centered ? c->max_append * sizeof(int32_t) : 0));
    const size_t o_apos = off;
    off = align256(off + (c->rope ? c->max_append * sizeof(int32_t) : 0));

    const size_t o_signs = off;
    off = align256(off + c->d * sizeof(float));
    const size_t o_flags = off;
    off = align256(off + sizeof(unsigned));
    const size_t o_work = off;
    c->work_bytes = max_workspace(c);
    off = align256(off + c->work_bytes);
    c->dev_bytes = off;
    c->o_sink = o_sink, c->o_state = o_tables;
    const cudaError_t ce = cudaMalloc((void **)&c->dev, c->dev_bytes);
    if (ce != cudaSuccess) {
        c->dev = NULL;
        cudaGetLastError();
        return fail(c, err, ce == cudaErrorMemoryAllocation ? E8KV_ERR(OUT_OF_MEMORY) : E8KV_ERR(CUDA));
    }
    for (size_t i = 0; i < 2 * c->n_layer; i++) {
        c->sd[i].pool = c->dev + (size_t)c->sd[i].pool;
        if (c->sd[i].mu) c->sd[i].mu = (float *)(c->dev + (size_t)c->sd[i].mu);
        if (c->sd[i].rc) {
            c->sd[i].rc = (float *)(c->dev + (size_t)c->sd[i].rc);
            c->sd[i].cs = (const float *)(c->dev + o_cs);
            c->sd[i].n_pos = (int)c->n_pos;
        }
    }
    c->d_arows = c->centered ? (int32_t *)(c->dev + o_arows) : NULL;
    c->d_cs = c->rope ? (float *)(c->dev + o_cs) : NULL;
    c->d_apos = c->rope ? (int32_t *)(c->dev + o_apos) : NULL;

    c->d_tables = (int32_t *)(c->dev + o_tables);
    c->d_btables = (int32_t *)(c->dev + o_btables);
    c->d_ctx = (int32_t *)(c->dev + o_ctx);
    c->d_slots = (int64_t *)(c->dev + o_slots);
    c->d_sink = c->sink ? (float *)(c->dev + o_sink) : NULL;
    c->d_sslots = (int64_t *)(c->dev + o_sslots);
    c->d_rows = (int32_t *)(c->dev + o_rows);
    c->d_signs = (float *)(c->dev + o_signs);
    c->d_flags = (unsigned *)(c->dev + o_flags);
    c->d_work = (float *)(c->dev + o_work);
    /* zero pages decode to finite values (raw formats too), so a stale slot can never inject NaN */
    if (cudaMemset(c->dev, 0, pools) != cudaSuccess ||
        cudaMemset(c->d_work, 0, c->work_bytes) != cudaSuccess ||
        cudaMemcpy(c->d_signs, signs, c->d * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        return fail(c, err, E8KV_ERR(CUDA));
    if (c->rope) E8KV_CU_RETURN_NULL(upload_rope_table(c, p->rope_theta, p->rope_freqs), c, err);

    c->tables = (int32_t *)calloc(c->max_seqs * c->width, sizeof(int32_t));
    c->lens = (size_t *)calloc(c->max_seqs * c->n_layer, sizeof(size_t));
    c->n_pages = (size_t *)calloc(c->max_seqs, sizeof(size_t));
    c->live = (unsigned char *)calloc(c->max_seqs, 1);
    c->refs = (int32_t *)calloc(c->n_blocks, sizeof(int32_t));
    c->free_list = (int32_t *)malloc(c->n_blocks * sizeof(int32_t));
    c->slots = (int64_t *)malloc(c->max_append * sizeof(int64_t));
    c->btables = (int32_t *)calloc(c->max_batch * c->width, sizeof(int32_t));
    c->ctx = (int32_t *)calloc(c->max_batch, sizeof(int32_t));
    c->sslots = (int64_t *)malloc(c->max_append * sizeof(int64_t));
    c->rows = (int32_t *)calloc(c->max_batch, sizeof(int32_t));
    c->arows = (int32_t *)malloc(c->max_append * sizeof(int32_t));
    c->apos = (int32_t *)malloc(c->max_append * sizeof(int32_t));
    if (!c->tables || !c->lens || !c->n_pages || !c->live || !c->refs || !c->free_list || !c->slots ||
        !c->btables || !c->ctx || !c->sslots || !c->rows || !c->arows || !c->apos)
        return fail(c, err, E8KV_ERR(OUT_OF_MEMORY));
    for (size_t i = 0; i < c->n_blocks; i++)
        c->free_list[i] = (int32_t)(c->n_blocks - 1 - i);
    c->n_free = c->n_blocks;
    E8KV_CU_RETURN_NULL(warm_up(c), c, err);
    return c;
}

size_t e8kv_cuda_cache_device_bytes(const e8kv_cuda_cache *c) {
    return c ? c->dev_bytes : 0;
}

size_t e8kv_cuda_cache_vector_bytes(const e8kv_cuda_cache *c, size_t layer, int stream) {
    if (!c || layer >= c->n_layer || (stream != 0 && stream != 1)) return E8KV_ERR(BAD_ARGUMENT);
    return fmt_vector_bytes(c->sd[2 * layer + stream].fmt, c->d) << c->pair;
}

size_t e8kv_cuda_cache_token_bytes(const e8kv_cuda_cache *c) {
    if (!c) return 0;
    size_t n = 0;
    for (size_t i = 0; i < 2 * c->n_layer; i++)
        n += c->sd[i].page_bytes / c->bs;
    return n;
}

size_t e8kv_cuda_cache_pages(const e8kv_cuda_cache *c, size_t layer, int stream, void **d_pool) {
    if (!c || !d_pool || layer >= c->n_layer || (stream != 0 && stream != 1))
        return E8KV_ERR(BAD_ARGUMENT);
    *d_pool = c->sd[2 * layer + stream].pool;
    return c->sd[2 * layer + stream].page_bytes;
}

size_t e8kv_cuda_cache_sink(const e8kv_cuda_cache *c) {
    return c ? c->sink : 0;
}

/* the sink rows of (layer, stream): (max_seqs, sink, n_head_kv, d) f32 */
static float *sink_pool(const e8kv_cuda_cache *c, size_t layer, int s) {
    return c->d_sink + (2 * layer + (size_t)s) * c->max_seqs * c->sink * c->n_head_kv * c->d;
}

size_t e8kv_cuda_cache_free_pages(const e8kv_cuda_cache *c) {
    return c ? c->n_free : 0;
}

/* One stream's append, one launch: a centred stream with rows codes x − μ of each token's row (in the
 * encode kernels, the CPU cache's values), any other the rows as they are; with sink slots (NULL: none)
 * the tokens' exact values also go to the sink rows; d_pos: the tokens' positions (center=rope) */
static size_t append_stream(e8kv_cuda_cache *c, size_t layer, int s, const int64_t *d_slots,
                            const int32_t *d_rows, const int64_t *d_sink_slots, const int32_t *d_pos,
                            const void *src, size_t n, e8kv_dtype dtype, unsigned *d_flags,
                            cudaStream_t stream) {
    token_args ta = {d_rows, NULL, c->max_seqs, NULL, NULL, 0, d_pos, NULL, NULL, 0};
    if (d_sink_slots && c->sink)
        ta.sink_slots = d_sink_slots, ta.sink = sink_pool(c, layer, s),
        ta.n_sink_slots = c->max_seqs * c->sink;
    return e8kv_cu_launch_append(&c->sd[2 * layer + (size_t)s], d_slots, src, n, c->n_head_kv, c->d, c->bs,
                                 (int)dtype, c->d_signs, c->rot_scale, d_flags, stream, &ta);
}

/* writes n_tok rows whose slots are in host_slots, in pieces of max_append; the rows whose host_sink_slots
 * (NULL: none) are not negative also into the sink rows; host_rows (NULL: none): each token's row of means;
 * host_pos: their positions (center=rope) */
static size_t append_rows(e8kv_cuda_cache *c, size_t layer, const int64_t *host_slots,
                          const int64_t *host_sink_slots, const int32_t *host_rows, const int32_t *host_pos,
                          const void *k, const void *v, size_t n_tok, e8kv_dtype dtype) {
    const size_t esz = dtype == E8KV_DTYPE_F32 ? 4 : 2, row = c->n_head_kv * c->d * esz;
    if (cudaMemset(c->d_flags, 0, sizeof(unsigned)) != cudaSuccess) return E8KV_ERR(CUDA);
    for (size_t t0 = 0; t0 < n_tok; t0 += c->max_append) {
        const size_t n = n_tok - t0 < c->max_append ? n_tok - t0 : c->max_append;
        if (cudaMemcpy(c->d_slots, host_slots + t0, n * sizeof(int64_t), cudaMemcpyHostToDevice) !=
            cudaSuccess)
            return E8KV_ERR(CUDA);
        const int rows = c->centered && host_rows;
        if (rows && cudaMemcpy(c->d_arows, host_rows + t0, n * sizeof(int32_t), cudaMemcpyHostToDevice) !=
                        cudaSuccess)
            return E8KV_ERR(CUDA);
        if (host_sink_slots && cudaMemcpy(c->d_sslots, host_sink_slots + t0, n * sizeof(int64_t),
                                          cudaMemcpyHostToDevice) != cudaSuccess)
            return E8KV_ERR(CUDA);
        const int pos = c->rope && host_pos;
        if (pos && cudaMemcpy(c->d_apos, host_pos + t0, n * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess)
            return E8KV_ERR(CUDA);
        for (int s = 0; s < 2; s++) {
            const uint8_t *const src = (const uint8_t *)(s ? v : k) + t0 * row;
            E8KV_RETURN_IF_ERROR(append_stream(c, layer, s, c->d_slots, rows ? c->d_arows : NULL,
                                               host_sink_slots ? c->d_sslots : NULL, pos ? c->d_apos : NULL,
                                               src, n, dtype, c->d_flags, 0));
        }
    }
    unsigned flags = 0;
    if (cudaMemcpy(&flags, c->d_flags, sizeof flags, cudaMemcpyDeviceToHost) != cudaSuccess)
        return E8KV_ERR(CUDA);
    E8KV_RETURN_IF_ERROR(e8kv_cuda_status_error(flags));
    return n_tok;
}

static int bad_dtype(e8kv_dtype t) {
    return t != E8KV_DTYPE_F32 && t != E8KV_DTYPE_F16 && t != E8KV_DTYPE_BF16;
}

#if FLAG_NONFINITE != E8KV_CUDA_STATUS_NONFINITE || FLAG_RANGE != E8KV_CUDA_STATUS_RANGE
#error "the append kernels' flags are the public status bits"
#endif

size_t e8kv_cuda_status_error(unsigned status) {
    if (status & FLAG_NONFINITE) return E8KV_ERR(NONFINITE);
    if (status & FLAG_RANGE) return E8KV_ERR(RANGE);
    return 0;
}

size_t e8kv_cuda_append_slots_async(e8kv_cuda_cache *c, size_t layer, const int64_t *d_slots, const void *d_k,
                                    const void *d_v, size_t n_tok, e8kv_dtype dtype, unsigned *d_status,
                                    void *stream) {
    return e8kv_cuda_append_rows_async(c, layer, d_slots, NULL, NULL, d_k, d_v, n_tok, dtype, d_status,
                                       stream);
}

size_t e8kv_cuda_append_rows_async(e8kv_cuda_cache *c, size_t layer, const int64_t *d_slots,
                                   const int32_t *d_rows, const int64_t *d_sink_slots, const void *d_k,
                                   const void *d_v, size_t n_tok, e8kv_dtype dtype, unsigned *d_status,
                                   void *stream) {
    return e8kv_cuda_append_pos_async(c, layer, d_slots, d_rows, d_sink_slots, NULL, d_k, d_v, n_tok, dtype,
                                      d_status, stream);
}

size_t e8kv_cuda_append_pos_async(e8kv_cuda_cache *c, size_t layer, const int64_t *d_slots,
                                  const int32_t *d_rows, const int64_t *d_sink_slots, const int32_t *d_pos,
                                  const void *d_k, const void *d_v, size_t n_tok, e8kv_dtype dtype,
                                  unsigned *d_status, void *stream) {
    if (!c || layer >= c->n_layer || bad_dtype(dtype) || !d_status || (n_tok && (!d_slots || !d_k || !d_v)))
        return E8KV_ERR(BAD_ARGUMENT);
    if (d_sink_slots && !c->sink) return E8KV_ERR(SPEC);
    if (c->rope && d_rows && n_tok && !d_pos) return E8KV_ERR(BAD_ARGUMENT); /* center=rope needs them */
    for (int s = 0; s < 2; s++)
        E8KV_RETURN_IF_ERROR(append_stream(c, layer, s, d_slots, d_rows, d_sink_slots, d_pos, s ? d_v : d_k,
                                           n_tok, dtype, d_status, (cudaStream_t)stream));
    return n_tok;
}

int e8kv_cuda_cache_centered(const e8kv_cuda_cache *c) {
    return c ? c->centered : 0;
}

int e8kv_cuda_cache_rope_centred(const e8kv_cuda_cache *c) {
    return c ? c->rope : 0;
}

size_t e8kv_cuda_set_row_shifts(e8kv_cuda_cache *c, const int32_t *d_shifts) {
    if (!c) return E8KV_ERR(BAD_ARGUMENT);
    if (!c->rope) return E8KV_ERR(SPEC);
    for (size_t i = 0; i < 2 * c->n_layer; i++)
        if (c->sd[i].rc) c->sd[i].shift = d_shifts;
    return 0;
}

size_t e8kv_cuda_set_layer_sinks(e8kv_cuda_cache *c, size_t layer, const float *d_sinks, size_t n_head) {
    if (!c || layer >= c->n_layer) return E8KV_ERR(BAD_ARGUMENT);
    if (d_sinks && (!n_head || n_head % c->hkv || n_head / c->hkv > group_max(c))) return E8KV_ERR(DIMENSION);
    c->lsink[layer] = d_sinks, c->lsink_n[layer] = d_sinks ? n_head : 0;
    return 0;
}

/* the means of (layer, stream) of one row: n_head_kv * d floats */
static float *mean_row(const e8kv_cuda_cache *c, size_t layer, int s, size_t row) {
    return c->sd[2 * layer + (size_t)s].mu + row * c->n_head_kv * c->d;
}

/* a row's means of (layer, stream), and its centre pairs (center=rope), copied to row dst on `st` */
static size_t copy_mean_row(e8kv_cuda_cache *c, size_t layer, int s, size_t dst, size_t src, cudaStream_t st) {
    const stream_desc *const sd = &c->sd[2 * layer + (size_t)s];
    const size_t rcn = c->n_head_kv * RC_FLOATS;
    if (sd->mu && cudaMemcpyAsync(mean_row(c, layer, s, dst), mean_row(c, layer, s, src),
                                  c->n_head_kv * c->d * sizeof(float), cudaMemcpyDeviceToDevice, st) != cudaSuccess)
        return E8KV_ERR(CUDA);
    if (sd->rc && cudaMemcpyAsync(sd->rc + dst * rcn, sd->rc + src * rcn, rcn * sizeof(float),
                                  cudaMemcpyDeviceToDevice, st) != cudaSuccess)
        return E8KV_ERR(CUDA);
    return 0;
}

size_t e8kv_cuda_set_means_async(e8kv_cuda_cache *c, size_t layer, size_t row, const void *d_k,
                                 const void *d_v, size_t n_tok, e8kv_dtype dtype, void *stream) {
    if (!c || layer >= c->n_layer || bad_dtype(dtype) || row >= c->max_seqs || !n_tok || !d_k || !d_v)
        return E8KV_ERR(BAD_ARGUMENT);
    if (!c->centered) return E8KV_ERR(SPEC);
    for (int s = 0; s < 2; s++) {
        const stream_desc *const sd = &c->sd[2 * layer + (size_t)s];
        if (sd->mu)
            E8KV_RETURN_IF_ERROR(e8kv_cu_launch_means(mean_row(c, layer, s, row), s ? d_v : d_k, n_tok,
                                                      c->n_head_kv * c->d, (int)dtype, (cudaStream_t)stream));
        if (sd->rc) { /* center=rope: the first append is at positions 0 .. n_tok − 1 */
            if (n_tok > c->max_ctx) return E8KV_ERR(CONTEXT_FULL);
            E8KV_RETURN_IF_ERROR(e8kv_cu_launch_rope_means(mean_row(c, layer, s, row),
                                                           sd->rc + row * c->n_head_kv * RC_FLOATS, sd->cs, d_k,
                                                           n_tok, c->n_head_kv, c->d, (int)dtype,
                                                           (cudaStream_t)stream));
        }
    }
    return 0;
}

/* n ids src[i] → dst[i], each below `limit`, no destination repeated or also a source: 0, else BAD_ARGUMENT
 */
static size_t check_copies(const int32_t *src, const int32_t *dst, size_t n, size_t limit) {
    if (!n) return 0;
    if (!src || !dst) return E8KV_ERR(BAD_ARGUMENT);
    unsigned char *role =
        (unsigned char *)calloc(limit ? limit : 1, 1); /* bit 0: source, bit 1: destination */
    if (!role) return E8KV_ERR(OUT_OF_MEMORY);
    size_t err = 0;
    for (size_t i = 0; i < n && !err; i++) {
        if (src[i] < 0 || dst[i] < 0 || (size_t)src[i] >= limit || (size_t)dst[i] >= limit ||
            (role[dst[i]] & 2))
            err = E8KV_ERR(BAD_ARGUMENT);
        else
            role[src[i]] |= 1, role[dst[i]] |= 2;
    }
    for (size_t i = 0; i < n && !err; i++)
        if (role[src[i]] & 2) err = E8KV_ERR(BAD_ARGUMENT);
    free(role);
    return err;
}

size_t e8kv_cuda_copy_pages_async(e8kv_cuda_cache *c, const int32_t *src, const int32_t *dst, size_t n,
                                  void *stream) {
    if (!c) return E8KV_ERR(BAD_ARGUMENT);
    E8KV_RETURN_IF_ERROR(check_copies(src, dst, n, c->n_blocks));
    for (size_t i = 0; i < 2 * c->n_layer; i++) {
        const stream_desc *sd = &c->sd[i];
        for (size_t j = 0; j < n; j++)
            if (cudaMemcpyAsync(sd->pool + (size_t)dst[j] * sd->page_bytes,
                                sd->pool + (size_t)src[j] * sd->page_bytes, sd->page_bytes,
                                cudaMemcpyDeviceToDevice, (cudaStream_t)stream) != cudaSuccess)
                return E8KV_ERR(CUDA);
    }
    return n;
}

size_t e8kv_cuda_copy_rows_async(e8kv_cuda_cache *c, const int32_t *src, const int32_t *dst, size_t n,
                                 void *stream) {
    if (!c) return E8KV_ERR(BAD_ARGUMENT);
    E8KV_RETURN_IF_ERROR(check_copies(src, dst, n, c->max_seqs));
    const cudaStream_t st = (cudaStream_t)stream;
    const size_t srow = c->sink * c->n_head_kv * c->d; /* floats of one row's sink rows */
    for (size_t l = 0; l < c->n_layer; l++)
        for (int s = 0; s < 2; s++)
            for (size_t j = 0; j < n; j++) {
                if (srow && cudaMemcpyAsync(sink_pool(c, l, s) + (size_t)dst[j] * srow,
                                            sink_pool(c, l, s) + (size_t)src[j] * srow, srow * sizeof(float),
                                            cudaMemcpyDeviceToDevice, st) != cudaSuccess)
                    return E8KV_ERR(CUDA);
                E8KV_RETURN_IF_ERROR(copy_mean_row(c, l, s, (size_t)dst[j], (size_t)src[j], st));
            }
    return n;
}

/* The parameters that decide a cache's layout and meaning as a little-endian u64 image (malloc'd, *n bytes;
 * NULL: out of memory): two caches of equal images can copy each other's state (e8kv_cuda_cache_copy_async),
 * and a saved state names its cache by the image's XXH64 (doc/format.md §7). */
static uint8_t *layout_image(const e8kv_cuda_cache *c, size_t *n) {
    const size_t f[] = {c->n_layer,    c->n_head_kv,        c->d,
                        c->bs,         c->n_blocks,         c->max_ctx,
                        c->width,      c->max_seqs,         c->max_batch,
                        c->max_n_head, c->max_append,       (size_t)c->pair,
                        c->sink,       (size_t)c->centered, (size_t)c->rope,
                        c->n_pos,      c->dev_bytes,        c->o_sink,
                        c->o_state};
    const size_t nf = sizeof f / sizeof *f;
    *n = 8 * (nf + 4 * 2 * c->n_layer);
    uint8_t *img = (uint8_t *)malloc(*n);
    if (!img) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < nf; i++, o += 8)
        e8kv_store_le64(img + o, f[i]);
    for (size_t i = 0; i < 2 * c->n_layer; i++, o += 32) {
        const stream_desc *sd = &c->sd[i];
        e8kv_store_le64(img + o, (uint64_t)sd->fmt), e8kv_store_le64(img + o + 8, sd->mu != NULL);
        e8kv_store_le64(img + o + 16, sd->rc != NULL),
            e8kv_store_le64(img + o + 24, (uint64_t)(sd->pool - c->dev));
    }
    return img;
}

/* 0 when a and b (on the same device) have the same layout, else BAD_ARGUMENT (OUT_OF_MEMORY) */
static size_t same_layout(const e8kv_cuda_cache *a, const e8kv_cuda_cache *b) {
    size_t na, nb;
    uint8_t *ia = layout_image(a, &na), *ib = layout_image(b, &nb);
    const size_t r = !ia || !ib                                                 ? E8KV_ERR(OUT_OF_MEMORY)
                     : a->device != b->device || na != nb || memcmp(ia, ib, na) ? E8KV_ERR(BAD_ARGUMENT)
                                                                                : 0;
    free(ia), free(ib);
    return r;
}

/* XXH64 of the layout image into *h, or OUT_OF_MEMORY */
static size_t layout_hash(const e8kv_cuda_cache *c, uint64_t *h) {
    size_t n;
    uint8_t *img = layout_image(c, &n);
    if (!img) return E8KV_ERR(OUT_OF_MEMORY);
    *h = XXH64(img, n, 0);
    free(img);
    return 0;
}

size_t e8kv_cuda_cache_copy_async(e8kv_cuda_cache *dst, const e8kv_cuda_cache *src, void *stream) {
    if (!dst || !src) return E8KV_ERR(BAD_ARGUMENT);
    E8KV_RETURN_IF_ERROR(same_layout(dst, src));
    if (dst == src) return 0;
    const cudaStream_t st = (cudaStream_t)stream;
    /* the state region: pools, sink rows, means and turned centres, the RoPE table (the allocation's first
     * bytes, up to the owned tables: e8kv_cuda_cache_create's layout), the owned tables and the signs */
    const size_t state = src->o_state;
    if (cudaMemcpyAsync(dst->dev, src->dev, state, cudaMemcpyDeviceToDevice, st) != cudaSuccess ||
        cudaMemcpyAsync(dst->d_tables, src->d_tables, src->max_seqs * src->width * sizeof(int32_t),
                        cudaMemcpyDeviceToDevice, st) != cudaSuccess ||
        cudaMemcpyAsync(dst->d_signs, src->d_signs, src->d * sizeof(float), cudaMemcpyDeviceToDevice, st) !=
            cudaSuccess)
        return E8KV_ERR(CUDA);
    memcpy(dst->tables, src->tables, src->max_seqs * src->width * sizeof(int32_t));
    memcpy(dst->lens, src->lens, src->max_seqs * src->n_layer * sizeof(size_t));
    memcpy(dst->n_pages, src->n_pages, src->max_seqs * sizeof(size_t));
    memcpy(dst->live, src->live, src->max_seqs);
    memcpy(dst->refs, src->refs, src->n_blocks * sizeof(int32_t));
    memcpy(dst->free_list, src->free_list, src->n_blocks * sizeof(int32_t));
    dst->n_free = src->n_free;
    return 0;
}

/* ---- the saved state (doc/format.md §7) ---- */
#define STATE_MAGIC "E8KVGPUS"
#define STATE_VERSION 1u
#define STATE_HEADER 64u

/* bytes of the host bookkeeping of owned sequences in a saved state */
static size_t host_state_bytes(const e8kv_cuda_cache *c) {
    return c->max_seqs * c->width * 4 + c->max_seqs * c->n_layer * 8 + c->max_seqs * 8 + c->max_seqs +
           c->n_blocks * 4 * 2 + 8;
}

/* ranges (first, count) pairs in [0, n_blocks), not overlapping: the pages they hold, or an error */
static size_t check_ranges(const e8kv_cuda_cache *c, const int64_t *r, size_t n, size_t err) {
    unsigned char *seen = (unsigned char *)calloc(c->n_blocks ? c->n_blocks : 1, 1);
    if (!seen) return E8KV_ERR(OUT_OF_MEMORY);
    size_t pages = 0, bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        const int64_t a = r[2 * i], k = r[2 * i + 1];
        if (a < 0 || k < 0 || (uint64_t)a > c->n_blocks || (uint64_t)k > c->n_blocks - (uint64_t)a) {
            bad = 1;
            break;
        }
        for (int64_t j = a; j < a + k && !bad; j++)
            bad = seen[j]++ != 0;
        pages += (size_t)k;
    }
    free(seen);
    return bad ? err : pages;
}

static size_t state_bytes(const e8kv_cuda_cache *c, size_t n_ranges, size_t pages) {
    size_t page_sum = 0;
    for (size_t i = 0; i < 2 * c->n_layer; i++)
        page_sum += c->sd[i].page_bytes;
    return STATE_HEADER + 16 * n_ranges + pages * page_sum + (c->o_state - c->o_sink) +
           c->max_seqs * c->width * 4 + c->d * 4 + host_state_bytes(c) + 8;
}

/* the current device made the cache's for the call, restored after */
struct device_scope {
    int prev, ok;
};
static device_scope enter_device(const e8kv_cuda_cache *c) {
    device_scope s = {0, 0};
    s.ok = cudaGetDevice(&s.prev) == cudaSuccess && cudaSetDevice(c->device) == cudaSuccess;
    return s;
}
static void leave_device(const device_scope &s) {
    if (s.ok) cudaSetDevice(s.prev);
}

size_t e8kv_cuda_cache_export(const e8kv_cuda_cache *c, const int64_t *ranges, size_t n_ranges, void *dst,
                              size_t dst_capacity) {
    if (!c || (n_ranges && !ranges)) return E8KV_ERR(BAD_ARGUMENT);
    const int64_t all[2] = {0, (int64_t)c->n_blocks};
    if (!ranges) ranges = all, n_ranges = 1;
    const size_t pages = check_ranges(c, ranges, n_ranges, E8KV_ERR(BAD_ARGUMENT));
    if (e8kv_is_error(pages)) return pages;
    const size_t total = state_bytes(c, n_ranges, pages);
    if (!dst) return total;
    if (dst_capacity < total) return E8KV_ERR(DST_TOO_SMALL);
    uint64_t hash = 0;
    E8KV_RETURN_IF_ERROR(layout_hash(c, &hash));
    uint8_t *const out = (uint8_t *)dst;
    memset(out, 0, STATE_HEADER);
    memcpy(out, STATE_MAGIC, 8);
    e8kv_store_le32(out + 8, STATE_VERSION), e8kv_store_le32(out + 12, STATE_HEADER);
    e8kv_store_le64(out + 16, hash), e8kv_store_le64(out + 24, n_ranges);
    e8kv_store_le64(out + 32, total), e8kv_store_le64(out + 40, c->o_state - c->o_sink);
    e8kv_store_le64(out + 48, pages);
    uint8_t *p = out + STATE_HEADER;
    for (size_t i = 0; i < n_ranges; i++, p += 16)
        e8kv_store_le64(p, (uint64_t)ranges[2 * i]), e8kv_store_le64(p + 8, (uint64_t)ranges[2 * i + 1]);
    const device_scope ds = enter_device(c);
    size_t r = ds.ok && cudaDeviceSynchronize() == cudaSuccess ? 0 : E8KV_ERR(CUDA);
    for (size_t i = 0; i < 2 * c->n_layer && !r; i++)
        for (size_t j = 0; j < n_ranges && !r; j++) {
            const size_t pb = c->sd[i].page_bytes, n = (size_t)ranges[2 * j + 1] * pb;
            if (n && cudaMemcpy(p, c->sd[i].pool + (size_t)ranges[2 * j] * pb, n, cudaMemcpyDeviceToHost) !=
                         cudaSuccess)
                r = E8KV_ERR(CUDA);
            p += n;
        }
    const size_t small = c->o_state - c->o_sink, tb = c->max_seqs * c->width * 4;
    if (!r && (cudaMemcpy(p, c->dev + c->o_sink, small, cudaMemcpyDeviceToHost) != cudaSuccess ||
               cudaMemcpy(p + small, c->d_tables, tb, cudaMemcpyDeviceToHost) != cudaSuccess ||
               cudaMemcpy(p + small + tb, c->d_signs, c->d * 4, cudaMemcpyDeviceToHost) != cudaSuccess))
        r = E8KV_ERR(CUDA);
    leave_device(ds);
    if (r) return r;
    p += small + tb + c->d * 4;
    /* the owned sequences' bookkeeping (little-endian hosts: the arrays as they are) */
    memcpy(p, c->tables, tb), p += tb;
    for (size_t i = 0; i < c->max_seqs * c->n_layer; i++, p += 8)
        e8kv_store_le64(p, c->lens[i]);
    for (size_t i = 0; i < c->max_seqs; i++, p += 8)
        e8kv_store_le64(p, c->n_pages[i]);
    memcpy(p, c->live, c->max_seqs), p += c->max_seqs;
    memcpy(p, c->refs, c->n_blocks * 4), p += c->n_blocks * 4;
    memcpy(p, c->free_list, c->n_blocks * 4), p += c->n_blocks * 4;
    e8kv_store_le64(p, c->n_free), p += 8;
    e8kv_store_le64(p, XXH64(out, total - 8, 0));
    return total;
}

size_t e8kv_cuda_cache_import(e8kv_cuda_cache *c, const void *src, size_t src_size) {
    if (!c || !src) return E8KV_ERR(BAD_ARGUMENT);
    const uint8_t *const in = (const uint8_t *)src;
    if (src_size < STATE_HEADER + 8) return E8KV_ERR(TRUNCATED);
    if (memcmp(in, STATE_MAGIC, 8)) return E8KV_ERR(CORRUPTED);
    if (e8kv_load_le32(in + 8) != STATE_VERSION) return E8KV_ERR(VERSION);
    const uint64_t total = e8kv_load_le64(in + 32), n_ranges = e8kv_load_le64(in + 24);
    if (e8kv_load_le32(in + 12) != STATE_HEADER) return E8KV_ERR(CORRUPTED);
    if (total > src_size) return E8KV_ERR(TRUNCATED);
    if (total != src_size) return E8KV_ERR(CORRUPTED);
    if (XXH64(in, src_size - 8, 0) != e8kv_load_le64(in + src_size - 8)) return E8KV_ERR(CHECKSUM);
    uint64_t hash = 0;
    E8KV_RETURN_IF_ERROR(layout_hash(c, &hash));
    if (e8kv_load_le64(in + 16) != hash) return E8KV_ERR(BAD_ARGUMENT); /* another cache's layout */
    if (n_ranges > c->n_blocks || e8kv_load_le64(in + 40) != c->o_state - c->o_sink)
        return E8KV_ERR(CORRUPTED);
    int64_t *ranges = (int64_t *)malloc((n_ranges ? n_ranges : 1) * 16);
    if (!ranges) return E8KV_ERR(OUT_OF_MEMORY);
    const uint8_t *p = in + STATE_HEADER;
    for (size_t i = 0; i < n_ranges; i++, p += 16)
        ranges[2 * i] = (int64_t)e8kv_load_le64(p), ranges[2 * i + 1] = (int64_t)e8kv_load_le64(p + 8);
    const size_t pages = check_ranges(c, ranges, n_ranges, E8KV_ERR(CORRUPTED));
    size_t r = e8kv_is_error(pages) ? pages
               : state_bytes(c, n_ranges, pages) != total || e8kv_load_le64(in + 48) != pages
                   ? E8KV_ERR(CORRUPTED)
                   : 0;
    /* the bookkeeping must be one a cache can hold: checked before anything is written */
    const size_t tb = c->max_seqs * c->width * 4, small = c->o_state - c->o_sink;
    size_t dev_part = 0;
    for (size_t i = 0; i < 2 * c->n_layer; i++)
        dev_part += pages * c->sd[i].page_bytes;
    const uint8_t *const host = p + dev_part + small + tb + c->d * 4;
    const uint8_t *const h_live = host + tb + c->max_seqs * c->n_layer * 8 + c->max_seqs * 8;
    const uint8_t *const h_refs = h_live + c->max_seqs, *const h_free = h_refs + c->n_blocks * 4;
    const uint64_t n_free = r ? 0 : e8kv_load_le64(h_free + c->n_blocks * 4);
    for (size_t i = 0; i < c->max_seqs && !r; i++)
        if (h_live[i] > 1) r = E8KV_ERR(CORRUPTED);
    if (!r && n_free > c->n_blocks) r = E8KV_ERR(CORRUPTED);
    for (size_t i = 0; i < c->n_blocks && !r; i++) {
        const int32_t ref = (int32_t)e8kv_load_le32(h_refs + 4 * i),
                      fr = (int32_t)e8kv_load_le32(h_free + 4 * i);
        if (ref < 0 || (i < n_free && (fr < 0 || (size_t)fr >= c->n_blocks))) r = E8KV_ERR(CORRUPTED);
    }
    for (size_t i = 0; i < c->max_seqs * c->n_layer && !r; i++)
        if (e8kv_load_le64(host + tb + 8 * i) > c->max_ctx) r = E8KV_ERR(CORRUPTED);
    for (size_t i = 0; i < c->max_seqs && !r; i++)
        if (e8kv_load_le64(host + tb + c->max_seqs * c->n_layer * 8 + 8 * i) > c->width)
            r = E8KV_ERR(CORRUPTED);
    for (size_t i = 0; i < c->max_seqs * c->width && !r; i++) {
        const int32_t t = (int32_t)e8kv_load_le32(host + 4 * i);
        if (t < 0 || (size_t)t >= c->n_blocks) r = E8KV_ERR(CORRUPTED);
    }
    if (r) {
        free(ranges);
        return r;
    }
    const device_scope ds = enter_device(c);
    r = ds.ok ? 0 : E8KV_ERR(CUDA);
    for (size_t i = 0; i < 2 * c->n_layer && !r; i++)
        for (size_t j = 0; j < n_ranges && !r; j++) {
            const size_t pb = c->sd[i].page_bytes, n = (size_t)ranges[2 * j + 1] * pb;
            if (n && cudaMemcpy(c->sd[i].pool + (size_t)ranges[2 * j] * pb, p, n, cudaMemcpyHostToDevice) !=
                         cudaSuccess)
                r = E8KV_ERR(CUDA);
            p += n;
        }
    free(ranges);
    if (!r && (cudaMemcpy(c->dev + c->o_sink, p, small, cudaMemcpyHostToDevice) != cudaSuccess ||
               cudaMemcpy(c->d_tables, p + small, tb, cudaMemcpyHostToDevice) != cudaSuccess ||
               cudaMemcpy(c->d_signs, p + small + tb, c->d * 4, cudaMemcpyHostToDevice) != cudaSuccess))
        r = E8KV_ERR(CUDA);
    leave_device(ds);
    if (r) return r;
    p = host;
    memcpy(c->tables, p, tb), p += tb;
    for (size_t i = 0; i < c->max_seqs * c->n_layer; i++, p += 8)
        c->lens[i] = (size_t)e8kv_load_le64(p);
    for (size_t i = 0; i < c->max_seqs; i++, p += 8)
        c->n_pages[i] = (size_t)e8kv_load_le64(p);
    memcpy(c->live, p, c->max_seqs), p += c->max_seqs;
    memcpy(c->refs, p, c->n_blocks * 4), p += c->n_blocks * 4;
    memcpy(c->free_list, p, c->n_blocks * 4);
    c->n_free = (size_t)n_free;
    return 0;
}

size_t e8kv_cuda_append_sink_async(e8kv_cuda_cache *c, size_t layer, const int64_t *d_sink_slots,
                                   const void *d_k, const void *d_v, size_t n_tok, e8kv_dtype dtype,
                                   unsigned *d_status, void *stream) {
    if (!c || layer >= c->n_layer || bad_dtype(dtype) || !d_status || (n_tok && (!d_sink_slots || !d_k || !d_v)))
        return E8KV_ERR(BAD_ARGUMENT);
    if (!c->sink) return E8KV_ERR(SPEC);
    for (int s = 0; s < 2; s++) /* the append kernels with no page slots */
        E8KV_RETURN_IF_ERROR(append_stream(c, layer, s, NULL, NULL, d_sink_slots, NULL, s ? d_v : d_k, n_tok, dtype,
                                           d_status, (cudaStream_t)stream));
    return n_tok;
}

size_t e8kv_cuda_append_slots(e8kv_cuda_cache *c, size_t layer, const int64_t *d_slots, const void *d_k,
                              const void *d_v, size_t n_tok, e8kv_dtype dtype) {
    if (!c) return E8KV_ERR(BAD_ARGUMENT);
    if (cudaMemset(c->d_flags, 0, sizeof(unsigned)) != cudaSuccess) return E8KV_ERR(CUDA);
    E8KV_RETURN_IF_ERROR(e8kv_cuda_append_slots_async(c, layer, d_slots, d_k, d_v, n_tok, dtype, c->d_flags, NULL));
    unsigned flags = 0;
    if (cudaMemcpy(&flags, c->d_flags, sizeof flags, cudaMemcpyDeviceToHost) != cudaSuccess)
        return E8KV_ERR(CUDA);
    E8KV_RETURN_IF_ERROR(e8kv_cuda_status_error(flags));
    return n_tok;
}

size_t e8kv_cuda_attend(e8kv_cuda_cache *c, size_t layer, float *d_out, const void *d_q, e8kv_dtype dtype,
                        size_t n_seq, size_t n_head, const int32_t *d_block_tables, size_t max_blocks_per_seq,
                        const int32_t *d_ctx_lens, size_t max_ctx, void *d_workspace, size_t workspace_bytes,
                        void *stream) {
    return e8kv_cuda_attend_rows(c, layer, d_out, d_q, dtype, n_seq, n_head, d_block_tables,
                                 max_blocks_per_seq, d_ctx_lens, max_ctx, NULL, d_workspace, workspace_bytes,
                                 stream);
}

size_t e8kv_cuda_attend_rows(e8kv_cuda_cache *c, size_t layer, float *d_out, const void *d_q,
                             e8kv_dtype dtype, size_t n_seq, size_t n_head, const int32_t *d_block_tables,
                             size_t max_blocks_per_seq, const int32_t *d_ctx_lens, size_t max_ctx,
                             const int32_t *d_rows, void *d_workspace, size_t workspace_bytes, void *stream) {
    if (!c || layer >= c->n_layer || bad_dtype(dtype) || !n_seq || !d_out || !d_q || !d_block_tables ||
        !d_ctx_lens || n_seq > 65535 || ((c->sink || c->centered) && !d_rows && n_seq > c->max_seqs))
        return E8KV_ERR(BAD_ARGUMENT);
    if (!n_head || n_head % c->hkv || n_head / c->hkv > group_max(c)) return E8KV_ERR(DIMENSION);
    if (max_ctx > max_blocks_per_seq * c->bs || max_ctx > (size_t)INT32_MAX) return E8KV_ERR(DIMENSION);
    if (c->lsink[layer] && n_head != c->lsink_n[layer]) return E8KV_ERR(DIMENSION);
    const size_t need = e8kv_cuda_attend_workspace_bytes(c, n_seq, n_head, max_ctx);
    if (!d_workspace) {
        if (need > c->work_bytes) return E8KV_ERR(DST_TOO_SMALL);
        d_workspace = c->d_work;
    } else if (workspace_bytes < need) {
        return E8KV_ERR(DST_TOO_SMALL);
    }
    attn_launch a;
    memset(&a, 0, sizeof a);
    a.k = c->sd[2 * layer], a.v = c->sd[2 * layer + 1];
    a.n_head_kv = c->hkv, a.n_head = n_head, a.d = c->hd, a.block_size = c->bs, a.n_seq = n_seq;
    a.max_blocks = max_blocks_per_seq;
    a.table_ctx =
        max_blocks_per_seq * c->bs > (size_t)INT32_MAX ? INT32_MAX : (int)(max_blocks_per_seq * c->bs);
    a.n_split = layer_splits(c, layer, n_seq, max_ctx);
    a.q = d_q, a.q_dtype = (int)dtype, a.block_tables = d_block_tables, a.ctx_lens = d_ctx_lens;
    a.signs = c->d_signs, a.rot_scale = c->rot_scale;
    a.done = (unsigned *)d_workspace;
    a.part_o = (float *)((uint8_t *)d_workspace + counter_bytes(c, n_seq));
    a.part_ml = (float *)((uint8_t *)a.part_o + align256(n_seq * n_head * a.n_split * c->hd * sizeof(float)));
    a.out = d_out;
    a.rows = d_rows, a.rows_max = (int)c->max_seqs;
    a.lsink = c->lsink[layer];
    if (c->sink) { /* the sink rows' state after the splits' in the workspace */
        a.sink_n = (int)c->sink;
        a.sink_k = sink_pool(c, layer, 0), a.sink_v = sink_pool(c, layer, 1);
        a.sink_o = (float *)((uint8_t *)a.part_ml + align256(n_seq * n_head * a.n_split * 2 * sizeof(float)));
        a.sink_ml = (float *)((uint8_t *)a.sink_o + align256(n_seq * n_head * c->hd * sizeof(float)));
    }
    const size_t r = e8kv_cu_launch_attend(&a, (cudaStream_t)stream);
    return r ? r : n_seq * n_head * c->hd;
}

size_t e8kv_cuda_check_tables_async(const e8kv_cuda_cache *c, const int32_t *d_block_tables, size_t n_seq,
                                    size_t max_blocks_per_seq, const int32_t *d_ctx_lens, unsigned *d_status,
                                    void *stream) {
    if (!c || !d_block_tables || !d_ctx_lens || !d_status || n_seq > 65535) return E8KV_ERR(BAD_ARGUMENT);
    const size_t r = e8kv_cu_launch_check_tables(d_block_tables, d_ctx_lens, n_seq, max_blocks_per_seq, c->bs,
                                                 c->n_blocks, d_status, (cudaStream_t)stream);
    return r ? r : n_seq;
}

size_t e8kv_cuda_gather_async(const e8kv_cuda_cache *c, size_t layer, void *d_k, void *d_v, e8kv_dtype dtype,
                              size_t n_seq, size_t n_tok, const int32_t *d_block_tables,
                              size_t max_blocks_per_seq, const int32_t *d_rows, void *stream) {
    if (!c || layer >= c->n_layer || bad_dtype(dtype) || !n_seq || !d_k || !d_v || !d_block_tables ||
        ((c->sink || c->centered) && !d_rows && n_seq > c->max_seqs))
        return E8KV_ERR(BAD_ARGUMENT);
    if (n_tok > max_blocks_per_seq * c->bs) return E8KV_ERR(DIMENSION);
    gather_launch g;
    memset(&g, 0, sizeof g);
    g.sd[0] = c->sd[2 * layer], g.sd[1] = c->sd[2 * layer + 1];
    g.out[0] = d_k, g.out[1] = d_v, g.out_dtype = (int)dtype;
    g.tables = d_block_tables, g.rows = d_rows, g.max_blocks = max_blocks_per_seq, g.n_blocks = c->n_blocks;
    g.rows_max = c->max_seqs, g.n_seq = n_seq, g.n_tok = n_tok, g.n_head_kv = c->n_head_kv, g.d = c->d;
    g.block_size = c->bs, g.signs = c->d_signs, g.rot_scale = c->rot_scale, g.pair = c->pair;
    if (c->sink)
        g.sink_n = (int)c->sink, g.sink[0] = sink_pool(c, layer, 0), g.sink[1] = sink_pool(c, layer, 1);
    E8KV_RETURN_IF_ERROR(e8kv_cu_launch_gather(&g, (cudaStream_t)stream));
    return n_seq * c->n_head_kv * n_tok * c->d;
}

/* ---------------------------------------------------------------- owned sequences */

static int seq_ok(const e8kv_cuda_cache *c, size_t seq) {
    return c && seq < c->max_seqs && c->live[seq];
}

size_t e8kv_cuda_seq_create(e8kv_cuda_cache *c) {
    if (!c) return E8KV_ERR(BAD_ARGUMENT);
    for (size_t s = 0; s < c->max_seqs; s++)
        if (!c->live[s]) {
            c->live[s] = 1;
            c->n_pages[s] = 0;
            memset(c->lens + s * c->n_layer, 0, c->n_layer * sizeof(size_t));
            return s;
        }
    return E8KV_ERR(CONTEXT_FULL);
}

size_t e8kv_cuda_seq_fork(e8kv_cuda_cache *c, size_t seq) {
    if (!seq_ok(c, seq)) return E8KV_ERR(BAD_ARGUMENT);
    const size_t n = e8kv_cuda_seq_create(c);
    if (e8kv_is_error(n)) return n;
    memcpy(c->tables + n * c->width, c->tables + seq * c->width, c->n_pages[seq] * sizeof(int32_t));
    memcpy(c->lens + n * c->n_layer, c->lens + seq * c->n_layer, c->n_layer * sizeof(size_t));
    c->n_pages[n] = c->n_pages[seq];
    for (size_t i = 0; i < c->n_pages[n]; i++)
        c->refs[c->tables[n * c->width + i]]++;
    if (c->n_pages[n] && cudaMemcpy(c->d_tables + n * c->width, c->tables + n * c->width,
                                    c->n_pages[n] * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess)
        return E8KV_ERR(CUDA);
    const size_t srow = c->sink * c->n_head_kv * c->d; /* floats of one sequence's sink rows */
    for (size_t l = 0; l < c->n_layer && c->sink; l++)
        for (int s = 0; s < 2; s++)
            if (cudaMemcpy(sink_pool(c, l, s) + n * srow, sink_pool(c, l, s) + seq * srow, srow * sizeof(float),
                           cudaMemcpyDeviceToDevice) != cudaSuccess)
                return E8KV_ERR(CUDA);
    for (size_t l = 0; l < c->n_layer; l++)
        for (int s = 0; s < 2; s++)
            E8KV_RETURN_IF_ERROR(copy_mean_row(c, l, s, n, seq, 0));
    return n;
}

size_t e8kv_cuda_seq_free(e8kv_cuda_cache *c, size_t seq) {
    if (!seq_ok(c, seq)) return E8KV_ERR(BAD_ARGUMENT);
    for (size_t i = 0; i < c->n_pages[seq]; i++) {
        const int32_t p = c->tables[seq * c->width + i];
        if (--c->refs[p] == 0) c->free_list[c->n_free++] = p;
    }
    c->n_pages[seq] = 0;
    c->live[seq] = 0;
    return 0;
}

size_t e8kv_cuda_seq_length(const e8kv_cuda_cache *c, size_t seq, size_t layer) {
    if (!seq_ok(c, seq) || layer >= c->n_layer) return E8KV_ERR(BAD_ARGUMENT);
    return c->lens[seq * c->n_layer + layer];
}

/* Makes pages [first, last] of seq writable: allocates missing ones, copies shared ones (every layer and
 * stream, so the other layers' tokens follow). Nothing changes when the pool cannot supply them all. */
static size_t make_writable(e8kv_cuda_cache *c, size_t seq, size_t first, size_t last) {
    if (last >= c->width) return E8KV_ERR(CONTEXT_FULL);
    size_t need = 0;
    for (size_t i = first; i <= last; i++)
        need += i >= c->n_pages[seq] || c->refs[c->tables[seq * c->width + i]] > 1;
    if (need > c->n_free) return E8KV_ERR(OUT_OF_MEMORY);
    int32_t *const t = c->tables + seq * c->width;
    for (size_t i = first; i <= last; i++) {
        if (i < c->n_pages[seq] && c->refs[t[i]] == 1) continue;
        const int32_t np = c->free_list[--c->n_free];
        c->refs[np] = 1;
        if (i < c->n_pages[seq]) {
            const int32_t old = t[i];
            for (size_t s = 0; s < 2 * c->n_layer; s++) {
                const stream_desc *const sd = &c->sd[s];
                if (cudaMemcpy(sd->pool + (size_t)np * sd->page_bytes,
                               sd->pool + (size_t)old * sd->page_bytes, sd->page_bytes,
                               cudaMemcpyDeviceToDevice) != cudaSuccess)
                    return E8KV_ERR(CUDA);
            }
            c->refs[old]--;
        }
        t[i] = np;
    }
    if (last + 1 > c->n_pages[seq]) c->n_pages[seq] = last + 1;
    if (cudaMemcpy(c->d_tables + seq * c->width + first, t + first, (last + 1 - first) * sizeof(int32_t),
                   cudaMemcpyHostToDevice) != cudaSuccess)
        return E8KV_ERR(CUDA);
    return 0;
}

size_t e8kv_cuda_seq_append(e8kv_cuda_cache *c, size_t layer, size_t seq, const void *d_k, const void *d_v,
                            size_t n_tok, e8kv_dtype dtype) {
    if (!seq_ok(c, seq) || layer >= c->n_layer || bad_dtype(dtype) || (n_tok && (!d_k || !d_v)))
        return E8KV_ERR(BAD_ARGUMENT);
    size_t *const len = &c->lens[seq * c->n_layer + layer];
    if (!n_tok) return *len;
    if (*len + n_tok > c->max_ctx) return E8KV_ERR(CONTEXT_FULL);
    E8KV_RETURN_IF_ERROR(make_writable(c, seq, *len / c->bs, (*len + n_tok - 1) / c->bs));
    const int32_t *const t = c->tables + seq * c->width;
    const size_t esz = dtype == E8KV_DTYPE_F32 ? 4 : 2, row = c->n_head_kv * c->d * esz;
    if (c->centered && *len == 0) /* the sequence's first append fixes its means (the CPU cache's rule) */
        E8KV_RETURN_IF_ERROR(e8kv_cuda_set_means_async(c, layer, seq, d_k, d_v, n_tok, dtype, NULL));
    for (size_t t0 = 0; t0 < n_tok; t0 += c->max_append) {
        const size_t n = n_tok - t0 < c->max_append ? n_tok - t0 : c->max_append;
        int sinks = 0;
        for (size_t i = 0; i < n; i++) {
            const size_t pos = *len + t0 + i;
            c->slots[i] = (int64_t)t[pos / c->bs] * (int64_t)c->bs + (int64_t)(pos % c->bs);
            c->sslots[i] = pos < c->sink ? (int64_t)(seq * c->sink + pos) : -1;
            c->arows[i] = (int32_t)seq;
            c->apos[i] = (int32_t)pos;
            sinks |= pos < c->sink;
        }
        const size_t r =
            append_rows(c, layer, c->slots, sinks ? c->sslots : NULL, c->arows, c->apos,
                        (const uint8_t *)d_k + t0 * row, (const uint8_t *)d_v + t0 * row, n, dtype);
        if (e8kv_is_error(r)) return r;
    }
    *len += n_tok;
    return *len;
}

size_t e8kv_cuda_seq_append_batch(e8kv_cuda_cache *c, size_t layer, const size_t *seqs, size_t n_seq,
                                  const void *d_k, const void *d_v, e8kv_dtype dtype) {
    if (!c || layer >= c->n_layer || bad_dtype(dtype) || !seqs || !d_k || !d_v || n_seq > c->max_append)
        return E8KV_ERR(BAD_ARGUMENT);
    for (size_t i = 0; i < n_seq; i++) {
        if (!seq_ok(c, seqs[i])) return E8KV_ERR(BAD_ARGUMENT);
        for (size_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return E8KV_ERR(BAD_ARGUMENT);
        if (c->lens[seqs[i] * c->n_layer + layer] + 1 > c->max_ctx) return E8KV_ERR(CONTEXT_FULL);
    }
    int sinks = 0;
    const size_t row = c->n_head_kv * c->d * (dtype == E8KV_DTYPE_F32 ? 4 : 2);
    for (size_t i = 0; i < n_seq; i++) {
        const size_t pos = c->lens[seqs[i] * c->n_layer + layer];
        E8KV_RETURN_IF_ERROR(make_writable(c, seqs[i], pos / c->bs, pos / c->bs));
        c->slots[i] =
            (int64_t)c->tables[seqs[i] * c->width + pos / c->bs] * (int64_t)c->bs + (int64_t)(pos % c->bs);
        c->sslots[i] = pos < c->sink ? (int64_t)(seqs[i] * c->sink + pos) : -1;
        c->arows[i] = (int32_t)seqs[i];
        c->apos[i] = (int32_t)pos;
        sinks |= pos < c->sink;
        if (c->centered && pos == 0) /* a first append of one token: means of 0 */
            E8KV_RETURN_IF_ERROR(e8kv_cuda_set_means_async(c, layer, seqs[i], (const uint8_t *)d_k + i * row,
                                                           (const uint8_t *)d_v + i * row, 1, dtype, NULL));
    }
    const size_t r =
        append_rows(c, layer, c->slots, sinks ? c->sslots : NULL, c->arows, c->apos, d_k, d_v, n_seq, dtype);
    if (e8kv_is_error(r)) return r;
    for (size_t i = 0; i < n_seq; i++)
        c->lens[seqs[i] * c->n_layer + layer]++;
    return n_seq;
}

/* The block tables, lengths and rows (their ids) of n_seq owned sequences at this layer, into d_btables,
 * d_ctx and d_rows for one call over them (seq_attend, seq_gather); *min_len and *max_len: the shortest and
 * longest of them */
static size_t stage_owned(e8kv_cuda_cache *c, size_t layer, const size_t *seqs, size_t n_seq, size_t *min_len,
                          size_t *max_len) {
    if (!c || layer >= c->n_layer || !seqs || !n_seq || n_seq > c->max_batch) return E8KV_ERR(BAD_ARGUMENT);
    *min_len = SIZE_MAX, *max_len = 0;
    for (size_t i = 0; i < n_seq; i++) {
        if (!seq_ok(c, seqs[i])) return E8KV_ERR(BAD_ARGUMENT);
        const size_t len = c->lens[seqs[i] * c->n_layer + layer];
        c->ctx[i] = (int32_t)len;
        *max_len = len > *max_len ? len : *max_len;
        *min_len = len < *min_len ? len : *min_len;
        memcpy(c->btables + i * c->width, c->tables + seqs[i] * c->width,
               c->n_pages[seqs[i]] * sizeof(int32_t));
        c->rows[i] = (int32_t)seqs[i];
    }
    if (cudaMemcpy(c->d_btables, c->btables, n_seq * c->width * sizeof(int32_t), cudaMemcpyHostToDevice) !=
            cudaSuccess ||
        cudaMemcpy(c->d_ctx, c->ctx, n_seq * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(c->d_rows, c->rows, n_seq * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess)
        return E8KV_ERR(CUDA);
    return 0;
}

size_t e8kv_cuda_seq_attend(e8kv_cuda_cache *c, size_t layer, float *d_out, const void *d_q, e8kv_dtype dtype,
                            const size_t *seqs, size_t n_seq, size_t n_head) {
    size_t min_len = 0, max_ctx = 0;
    E8KV_RETURN_IF_ERROR(stage_owned(c, layer, seqs, n_seq, &min_len, &max_ctx));
    const size_t r = e8kv_cuda_attend_rows(c, layer, d_out, d_q, dtype, n_seq, n_head, c->d_btables, c->width,
                                           c->d_ctx, max_ctx, c->d_rows, NULL, 0, NULL);
    if (e8kv_is_error(r)) return r;
    return cudaDeviceSynchronize() == cudaSuccess ? r : E8KV_ERR(CUDA);
}

size_t e8kv_cuda_seq_gather(e8kv_cuda_cache *c, size_t layer, void *d_k, void *d_v, e8kv_dtype dtype,
                            const size_t *seqs, size_t n_seq, size_t n_tok) {
    size_t min_len = 0, max_len = 0;
    E8KV_RETURN_IF_ERROR(stage_owned(c, layer, seqs, n_seq, &min_len, &max_len));
    if (n_tok > min_len) return E8KV_ERR(DIMENSION);
    const size_t r = e8kv_cuda_gather_async(c, layer, d_k, d_v, dtype, n_seq, n_tok, c->d_btables, c->width,
                                            c->d_rows, NULL);
    if (e8kv_is_error(r)) return r;
    return cudaDeviceSynchronize() == cudaSuccess ? r : E8KV_ERR(CUDA);
}

/* the bytes of the vector of page head `head` (of n_head_kv) at a checked slot, vb of them, into out */
static size_t read_vector(const e8kv_cuda_cache *c, uint8_t *out, size_t layer, int stream, int64_t slot,
                          size_t head) {
    const stream_desc *const sd = &c->sd[2 * layer + stream];
    const size_t vb = fmt_vector_bytes(sd->fmt, c->d), off = (size_t)slot % c->bs;
    const uint8_t *const area = sd->pool + (size_t)slot / c->bs * sd->page_bytes + head * sd->head_bytes;
    cudaError_t e;
    if (fmt_is_box(sd->fmt)) { /* the planes of the page's tokens (e8box:3: the 2-bit, then the 1-bit), their
                                * steps, their coset bytes */
        const size_t n_cos = (c->d + 63) / 64, nb = vb - 1 - n_cos, n2 = sd->fmt == FMT_BOX3 ? c->d / 4 : nb;
        e = cudaMemcpy(out, area + c->bs * nb + off, 1, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            e = cudaMemcpy(out + 1, area + c->bs * nb + c->bs + off * n_cos, n_cos, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) e = cudaMemcpy(out + 1 + n_cos, area + off * n2, n2, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess && nb > n2)
            e = cudaMemcpy(out + 1 + n_cos + n2, area + c->bs * n2 + off * (nb - n2), nb - n2,
                           cudaMemcpyDeviceToHost);
    } else if (sd->fmt == FMT_E8P2) { /* codes of the page's tokens, then their steps */
        const size_t nb = c->d / 4;
        e = cudaMemcpy(out, area + c->bs * nb + off, 1, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) e = cudaMemcpy(out + 1, area + off * nb, nb, cudaMemcpyDeviceToHost);
    } else {
        e = cudaMemcpy(out, area + off * vb, vb, cudaMemcpyDeviceToHost);
    }
    return e == cudaSuccess ? vb : E8KV_ERR(CUDA);
}

size_t e8kv_cuda_read_slot(const e8kv_cuda_cache *c, void *dst, size_t cap, size_t layer, int stream,
                           int64_t slot, size_t head) {
    if (!c || !dst || layer >= c->n_layer || (stream != 0 && stream != 1) || slot < 0 || head >= c->hkv ||
        (size_t)slot >= c->n_blocks * c->bs)
        return E8KV_ERR(BAD_ARGUMENT);
    const size_t vb = fmt_vector_bytes(c->sd[2 * layer + stream].fmt, c->d);
    if (cap < vb << c->pair) return E8KV_ERR(DST_TOO_SMALL);
    for (size_t h = 0; h <= (size_t)c->pair; h++) /* head_dim 256: its halves' bytes, one after the other */
        E8KV_RETURN_IF_ERROR(
            read_vector(c, (uint8_t *)dst + h * vb, layer, stream, slot, (head << c->pair) + h));
    return vb << c->pair;
}

size_t e8kv_cuda_seq_read_vector(const e8kv_cuda_cache *c, void *dst, size_t cap, size_t seq, size_t layer,
                                 int stream, size_t pos, size_t head) {
    if (!seq_ok(c, seq) || layer >= c->n_layer || pos >= c->lens[seq * c->n_layer + layer])
        return E8KV_ERR(BAD_ARGUMENT);
    const int64_t slot =
        (int64_t)c->tables[seq * c->width + pos / c->bs] * (int64_t)c->bs + (int64_t)(pos % c->bs);
    return e8kv_cuda_read_slot(c, dst, cap, layer, stream, slot, head);
}
