/* GPU decode-attention benchmark of the e8kv device cache (run on a device; validation is tests/test_cuda.cu,
 * which bench/run_cuda.sh runs first).
 *
 * For Llama-3-8B (32 q / 8 kv heads, d 128) and SmolLM2-135M (9 / 3, d 64), batch 1/8/32 × context
 * 4K/32K/128K, formats e8box:4, e8box:3, K e8box:4 with V e8box:3 (named k4v3 in --only), e8p:2 and bf16
 * (our own paged kernel): µs per decode-attention call of one layer (CUDA events around each call, 5
 * warm-up calls, median of 30; calls queued back to back, again with the host waiting for each call, and
 * 20 calls replayed as one CUDA graph, per call),
 * effective GB/s over the page bytes the call must read, encode GB/s over the bf16 K+V input bytes, device
 * bytes per token, measured vs accounted device memory, the largest batch × context whose cache (all
 * layers) fits in 80 GB; and the device-to-device copy bandwidth (1 GiB, read + write bytes) in the same
 * run. Pages of a sequence are scattered over the pool.
 *
 * --encode: the append kernels instead: for each shape and format, (a) 65536-token appends (bf16 K + V rows
 * into scattered slots): µs per e8kv_cuda_append_slots call, host-synchronised as the API is (wall clock,
 * median of 10), and the two kernels alone (e8kv_cu_launch_append for K and V, queued, CUDA events, median
 * of 20), as GB/s of bf16 input, on the pseudo-Gaussian rows and again with test_cuda's outliers (one value
 * in 640 ×12), which put more coordinates at the box's edge after the rotation; (b) a decode step, batch 8 ×
 * 1 token × 32 layers: µs per append_slots call (one layer) and the 64 kernels of a step alone (a CUDA graph,
 * median of 20 replays).
 *
 * Built with -DBOX_PROF (bench/build_prof.sh: bench_cuda_prof), each e8box:4 case runs one more call and
 * prints the spread over the blocks of each phase of attn_box_kernel (setup, loop, store, merge) from its
 * stamps.
 *
 * Usage: bench_cuda [--json FILE] [--quick] [--only SHAPE/SPEC/BATCH/CTX,...] [--block N] [--sink N]
 * [--encode]
 * (--only: those cases; --block: tokens per page, a multiple of 16, default 16 as vLLM's; --sink: every
 * format with sink=N) */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e8kv_cuda.h"
/* the append kernels alone (e8kv_cu_launch_append), to time them apart from the host-synchronised API */
#include "cuda/cuda_internal.cuh"

#include <time.h>

#define CU(x)                                                                                                \
    do {                                                                                                     \
        const cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* pseudo-Gaussian bf16 (sum of four uniforms from a hash), never zeros */
__global__ void fill_bf16(__nv_bfloat16 *x, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        float s = 0.0f;
        for (int j = 0; j < 4; j++) {
            h ^= h >> 31, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 29;
            s += (float)(h >> 40) * (1.0f / 16777216.0f);
        }
        x[i] = __float2bfloat16_rn((s - 2.0f) * 1.7f);
    }
}

/* one value in 640 (one vector in five at head_dim 128) ×12, as tests/test_cuda.cu's outliers */
__global__ void add_outliers(__nv_bfloat16 *x, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 7) * 0xD1B54A32D192ED03ull ^ seed;
        h ^= h >> 29, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 32;
        if (h % 640 == 0) x[i] = __float2bfloat16_rn(12.0f * __bfloat162float(x[i]));
    }
}

typedef struct {
    const char *name;
    size_t n_kv, G, d, n_layer_model;
} shape;

static FILE *g_json;
static char g_dev[256];

static float time_median(float *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_f);
    return t[n / 2];
}

static double copy_bandwidth(void) {
    const size_t n = (size_t)1 << 30;
    void *a, *b;
    CU(cudaMalloc(&a, n));
    CU(cudaMalloc(&b, n));
    CU(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float t[20];
    for (int i = -3; i < 20; i++) {
        CU(cudaEventRecord(e0));
        CU(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
        CU(cudaEventRecord(e1));
        CU(cudaEventSynchronize(e1));
        if (i >= 0) CU(cudaEventElapsedTime(&t[i], e0, e1));
    }
    const double ms = time_median(t, 20);
    CU(cudaFree(a));
    CU(cudaFree(b));
    return 2.0 * (double)n / (ms * 1e-3) / 1e9;
}

#ifdef BOX_PROF
static int cmp_u64(const void *a, const void *b) {
    const unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}
/* percentile p (0..100) of n values (sorted in place) */
static double pct(unsigned long long *v, size_t n, int p) {
    qsort(v, n, sizeof *v, cmp_u64);
    return n ? (double)v[(n - 1) * (size_t)p / 100] : 0.0;
}
/* One more call of the case with the kernel's stamps (a -DBOX_PROF build): where a call's time goes, in µs
 * from the first block's entry (0 = median, 100 = max over the blocks) */
static void box_prof(e8kv_cuda_cache *c, float *out, const void *q, size_t batch, size_t n_head,
                     const int32_t *d_tables, size_t per, const int32_t *d_ctx, size_t ctx) {
    static unsigned long long st[BOX_PROF_MAX][8], v[BOX_PROF_MAX];
    CU(cudaDeviceSynchronize());
    if (e8kv_cu_box_prof(NULL, 0, 1)) exit(1);
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaEventRecord(e0));
    e8kv_cuda_attend(c, 0, out, q, E8KV_DTYPE_BF16, batch, n_head, d_tables, per, d_ctx, ctx, NULL, 0, NULL);
    CU(cudaEventRecord(e1));
    CU(cudaEventSynchronize(e1));
    float ms;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    if (e8kv_is_error(e8kv_cu_box_prof(&st[0][0], BOX_PROF_MAX, 0))) exit(1);
    size_t n = 0;
    unsigned long long t0 = ~0ull, end = 0, loop_end = 0;
    for (size_t b = 0; b < BOX_PROF_MAX && st[b][0]; b++, n++) {
        t0 = st[b][0] < t0 ? st[b][0] : t0;
        end = st[b][4] > end ? st[b][4] : end;
        loop_end = st[b][2] > loop_end ? st[b][2] : loop_end;
    }
    int sms[256] = {0};
    for (size_t b = 0; b < n; b++)
        sms[st[b][5] & 255]++;
    int sm_max = 0, sm_used = 0;
    for (int i = 0; i < 256; i++)
        sm_max = sms[i] > sm_max ? sms[i] : sm_max, sm_used += sms[i] > 0;
    /* phases between stamps (entry offset, issue, query, fragments, loop, store, merge) */
    const int from[7] = {-1, 0, 6, 7, 1, 2, 3}, to[7] = {0, 6, 7, 1, 2, 3, 4};
    const char *name[7] = {"entry", "issue", "query", "frags", "loop", "store", "merge"};
    printf(
        "  prof: %zu blocks on %d SMs (<= %d per SM), event %.1f us, first entry -> last end %.1f us, last "
        "loop end %.1f us; min/median/max us:",
        n, sm_used, sm_max, ms * 1e3, (end - t0) * 1e-3, (loop_end - t0) * 1e-3);
    for (int k = 0; k < 7; k++) {
        double r[3];
        const int ps[3] = {0, 50, 100};
        for (int j = 0; j < 3; j++) {
            for (size_t b = 0; b < n; b++)
                v[b] = st[b][to[k]] - (from[k] < 0 ? t0 : st[b][from[k]]);
            r[j] = pct(v, n, ps[j]) * 1e-3;
        }
        printf("  %s %.1f/%.1f/%.1f", name[k], r[0], r[1], r[2]);
    }
    printf("\n");
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
}
#endif

static size_t g_bs = 16, g_sink = 0;

/* the page format of stream 0 (K) or 1 (V) of one of main's specs ("k=e8box:4,v=e8box:3": K, then V) */
static int spec_fmt(const char *spec, int stream) {
    if (!strncmp(spec, "k=", 2)) spec = stream ? strstr(spec, "v=") + 2 : spec + 2;
    return !strncmp(spec, "e8box:4", 7)   ? FMT_BOX4
           : !strncmp(spec, "e8box:3", 7) ? FMT_BOX3
           : !strncmp(spec, "e8p:2", 5)   ? FMT_E8P2
                                          : FMT_BF16;
}

static const char *g_suffix = ""; /* --suffix S: appended to every spec (",center=0": uncentred pages) */
static void run(const shape *sh, const char *spec, size_t batch, size_t ctx, double copy_gbps) {
    char spec_sink[96];
    /* --sink N: the format with sink=N (its sink rows left zero: what is timed is the same); the means of a
     * centred cache (the default) stay zero too: the merge adds them all the same */
    if (g_sink)
        snprintf(spec_sink, sizeof spec_sink, "%s,sink=%zu%s", spec, g_sink, g_suffix);
    else
        snprintf(spec_sink, sizeof spec_sink, "%s%s", spec, g_suffix);
    spec = spec_sink;
    const size_t bs = g_bs, pages = batch * ctx / bs, n_head = sh->n_kv * sh->G, d = sh->d;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 1, p.n_head_kv = sh->n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = pages;
    p.spec = spec, p.seed = 42, p.max_ctx = ctx, p.max_batch = 32, p.max_n_head = n_head;
    p.max_seqs = batch; /* a sink=N spec's rows: one per sequence (e8kv_cuda_attend: row = batch index) */
    p.max_append = 65536;
    p.rope_theta = 500000.0f; /* --suffix ,center=rope: Llama-3's base (its centre pairs stay zero: the same
                               * work is timed) */
    size_t free0, total;
    CU(cudaMemGetInfo(&free0, &total));
    const size_t vb = fmt_vector_bytes(spec_fmt(spec, 0), d) + fmt_vector_bytes(spec_fmt(spec, 1), d);
    const size_t need = pages * bs * sh->n_kv * vb + ((size_t)1 << 30);
    if (need > free0) {
        printf("%-8s %-8s batch %2zu ctx %6zu: does not fit (%zu MB needed)\n", sh->name, spec, batch, ctx,
               need >> 20);
        return;
    }
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    if (!c) {
        printf("create: %s\n", e8kv_error_name(err));
        return;
    }
    size_t free1;
    CU(cudaMemGetInfo(&free1, &total));
    const size_t measured = free0 - free1, accounted = e8kv_cuda_cache_device_bytes(c);
    /* pages scattered: a random permutation of the pool split into the sequences' tables */
    int32_t *perm = (int32_t *)malloc(pages * sizeof(int32_t));
    for (size_t i = 0; i < pages; i++)
        perm[i] = (int32_t)i;
    uint64_t r = 0x1234567ull;
    for (size_t i = pages - 1; i > 0; i--) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const size_t j = r % (i + 1);
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const size_t per = ctx / bs, n_tok = batch * ctx;
    int64_t *slots = (int64_t *)malloc(n_tok * sizeof(int64_t));
    for (size_t t = 0; t < n_tok; t++)
        slots[t] = (int64_t)perm[t / bs] * (int64_t)bs + (int64_t)(t % bs);
    int32_t *d_tables, *d_ctx;
    int64_t *d_slots;
    CU(cudaMalloc((void **)&d_tables, pages * sizeof(int32_t)));
    CU(cudaMemcpy(d_tables, perm, pages * sizeof(int32_t), cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&d_slots, n_tok * sizeof(int64_t)));
    CU(cudaMemcpy(d_slots, slots, n_tok * sizeof(int64_t), cudaMemcpyHostToDevice));
    int32_t *ctxs = (int32_t *)malloc(batch * sizeof(int32_t));
    for (size_t s = 0; s < batch; s++)
        ctxs[s] = (int32_t)ctx;
    CU(cudaMalloc((void **)&d_ctx, batch * sizeof(int32_t)));
    CU(cudaMemcpy(d_ctx, ctxs, batch * sizeof(int32_t), cudaMemcpyHostToDevice));
    /* fill through the append kernels, timed */
    const size_t chunk = 65536 < n_tok ? 65536 : n_tok, row = sh->n_kv * d;
    __nv_bfloat16 *kin, *vin;
    CU(cudaMalloc((void **)&kin, chunk * row * 2));
    CU(cudaMalloc((void **)&vin, chunk * row * 2));
    fill_bf16<<<1024, 256>>>(kin, chunk * row, 1);
    fill_bf16<<<1024, 256>>>(vin, chunk * row, 2);
    CU(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaEventRecord(e0));
    for (size_t t0 = 0; t0 < n_tok; t0 += chunk) {
        const size_t n = n_tok - t0 < chunk ? n_tok - t0 : chunk;
        const size_t a = e8kv_cuda_append_slots(c, 0, d_slots + t0, kin, vin, n, E8KV_DTYPE_BF16);
        if (e8kv_is_error(a)) {
            printf("append: %s\n", e8kv_error_name(a));
            exit(1);
        }
    }
    CU(cudaEventRecord(e1));
    CU(cudaEventSynchronize(e1));
    float enc_ms;
    CU(cudaEventElapsedTime(&enc_ms, e0, e1));
    const double enc_gbps = (double)n_tok * row * 2 * 2 / (enc_ms * 1e-3) / 1e9;
    /* queries */
    __nv_bfloat16 *q;
    float *out;
    CU(cudaMalloc((void **)&q, batch * n_head * d * 2));
    CU(cudaMalloc((void **)&out, batch * n_head * d * 4));
    fill_bf16<<<64, 256>>>(q, batch * n_head * d, 3);
    /* two timings of one call: "us" with the calls queued back to back (an event pair around each, one
     * synchronisation at the end: the GPU time of a call in a decode loop, launch latency hidden), and
     * "us_sync" with the host waiting for each call before launching the next (launch latency included) */
    enum { N_WARM = 5, N_REP = 30 };
    cudaEvent_t ev[2 * (N_WARM + N_REP)];
    for (int i = 0; i < 2 * (N_WARM + N_REP); i++)
        CU(cudaEventCreate(&ev[i]));
    float t[N_REP], ts[N_REP];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N_WARM + N_REP; i++) {
            CU(cudaEventRecord(ev[2 * i]));
            const size_t a = e8kv_cuda_attend(c, 0, out, q, E8KV_DTYPE_BF16, batch, n_head, d_tables, per,
                                              d_ctx, ctx, NULL, 0, NULL);
            CU(cudaEventRecord(ev[2 * i + 1]));
            if (e8kv_is_error(a)) {
                printf("attend: %s\n", e8kv_error_name(a));
                exit(1);
            }
            if (pass == 1) CU(cudaEventSynchronize(ev[2 * i + 1]));
        }
        CU(cudaDeviceSynchronize());
        for (int i = 0; i < N_REP; i++)
            CU(cudaEventElapsedTime(pass ? &ts[i] : &t[i], ev[2 * (N_WARM + i)], ev[2 * (N_WARM + i) + 1]));
    }
    /* "us_graph": N_G calls captured into one CUDA graph on a stream of ours, the graph replayed (2 warm-up
     * replays, median of 10) and its time divided by N_G: the GPU time of a call with no launch gaps */
    enum { N_G = 20 };
    float tg[10];
    {
        cudaStream_t st;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < N_G; i++)
            if (e8kv_is_error(e8kv_cuda_attend(c, 0, out, q, E8KV_DTYPE_BF16, batch, n_head, d_tables, per,
                                               d_ctx, ctx, NULL, 0, st))) {
                printf("attend (capture) failed\n");
                exit(1);
            }
        CU(cudaStreamEndCapture(st, &graph));
        CU(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = -2; i < 10; i++) {
            CU(cudaEventRecord(ev[0], st));
            CU(cudaGraphLaunch(exec, st));
            CU(cudaEventRecord(ev[1], st));
            CU(cudaEventSynchronize(ev[1]));
            if (i >= 0) CU(cudaEventElapsedTime(&tg[i], ev[0], ev[1]));
        }
        CU(cudaGraphExecDestroy(exec));
        CU(cudaGraphDestroy(graph));
        CU(cudaStreamDestroy(st));
    }
#ifdef BOX_PROF
    if (!strcmp(spec, "e8box:4")) box_prof(c, out, q, batch, n_head, d_tables, per, d_ctx, ctx);
#endif
    for (int i = 0; i < 2 * (N_WARM + N_REP); i++)
        CU(cudaEventDestroy(ev[i]));
    CU(cudaGetLastError());
    const double us = time_median(t, N_REP) * 1e3, us_sync = time_median(ts, N_REP) * 1e3,
                 us_graph = time_median(tg, 10) * 1e3 / N_G;
    const size_t tok_bytes = e8kv_cuda_cache_token_bytes(c); /* one layer, K + V, all kv heads */
    const double read = (double)n_tok * tok_bytes, gbps = read / (us * 1e-6) / 1e9;
    const double fit_tokens = 80e9 / ((double)tok_bytes * sh->n_layer_model);
    printf(
        "%-8s %-8s batch %2zu ctx %6zu: %9.1f us (%7.1f synced, %7.1f graph)  %7.1f GB/s (%4.1f%% of copy)  "
        "encode %6.1f GB/s  %4zu B/token/layer  dev %.1f MB (accounted %.1f MB)  page %zu\n",
        sh->name, spec, batch, ctx, us, us_sync, us_graph, gbps, 100.0 * gbps / copy_gbps, enc_gbps,
        tok_bytes, measured / 1e6, accounted / 1e6, bs);
    if (g_json)
        fprintf(
            g_json,
            "{\"bench\":\"e8kv_cuda\",\"device\":\"%s\",\"shape\":\"%s\",\"format\":\"%s\",\"batch\":%zu,"
            "\"ctx\":%zu,\"n_head\":%zu,\"n_head_kv\":%zu,\"head_dim\":%zu,\"us\":%.2f,\"us_sync\":%.2f,"
            "\"us_graph\":%.2f,"
            "\"gbps\":%.1f,"
            "\"copy_gbps\":%.1f,\"encode_gbps\":%.1f,\"bytes_per_token_layer\":%zu,\"dev_bytes_"
            "measured\":%zu,"
            "\"dev_bytes_accounted\":%zu,\"tokens_in_80GB\":%.0f,\"n_layer_model\":%zu,\"block_size\":%zu}\n",
            g_dev, sh->name, spec, batch, ctx, n_head, sh->n_kv, d, us, us_sync, us_graph, gbps, copy_gbps,
            enc_gbps, tok_bytes, measured, accounted, fit_tokens, sh->n_layer_model, bs);
    free(perm), free(slots), free(ctxs);
    CU(cudaFree(d_tables));
    CU(cudaFree(d_slots));
    CU(cudaFree(d_ctx));
    CU(cudaFree(kin));
    CU(cudaFree(vin));
    CU(cudaFree(q));
    CU(cudaFree(out));
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    e8kv_cuda_cache_free(c);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* Encode timings of one shape and format (see the header): n_tok tokens per call, n_layer layers. */
static void run_encode(const shape *sh, const char *spec, size_t n_tok, size_t n_layer, int outliers,
                       double copy_gbps) {
    char spec_sfx[96];
    snprintf(spec_sfx, sizeof spec_sfx, "%s%s", spec, g_suffix);
    spec = spec_sfx;
    const size_t bs = g_bs, d = sh->d, row = sh->n_kv * d, pages = n_tok; /* one page per token at most */
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = n_layer, p.n_head_kv = sh->n_kv, p.head_dim = d, p.block_size = bs;
    p.n_blocks = n_tok == 8 ? 64 : n_tok / bs, p.spec = spec, p.seed = 42, p.max_append = n_tok;
    p.max_seqs = 8, p.max_batch = 8, p.rope_theta = 500000.0f;
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    if (!c) {
        printf("create: %s\n", e8kv_error_name(err));
        return;
    }
    (void)pages;
    /* slots: a decode step puts each token in its own page; a long append fills scattered pages */
    int64_t *slots = (int64_t *)malloc(n_tok * sizeof(int64_t));
    uint64_t r = 0x9e3779b97f4a7c15ull;
    const size_t np = p.n_blocks;
    int32_t *perm = (int32_t *)malloc(np * sizeof(int32_t));
    for (size_t i = 0; i < np; i++)
        perm[i] = (int32_t)i;
    for (size_t i = np - 1; i > 0; i--) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const size_t j = r % (i + 1);
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (size_t t = 0; t < n_tok; t++)
        slots[t] = n_tok == 8 ? (int64_t)perm[t] * (int64_t)bs : (int64_t)perm[t / bs] * (int64_t)bs + (int64_t)(t % bs);
    int64_t *d_slots;
    CU(cudaMalloc((void **)&d_slots, n_tok * sizeof(int64_t)));
    CU(cudaMemcpy(d_slots, slots, n_tok * sizeof(int64_t), cudaMemcpyHostToDevice));
    __nv_bfloat16 *kin, *vin;
    CU(cudaMalloc((void **)&kin, n_tok * row * 2));
    CU(cudaMalloc((void **)&vin, n_tok * row * 2));
    fill_bf16<<<1024, 256>>>(kin, n_tok * row, 11);
    fill_bf16<<<1024, 256>>>(vin, n_tok * row, 12);
    if (outliers) {
        add_outliers<<<1024, 256>>>(kin, n_tok * row, 13);
        add_outliers<<<1024, 256>>>(vin, n_tok * row, 14);
    }
    CU(cudaDeviceSynchronize());
    const double in_bytes = (double)n_tok * row * 2 * 2; /* bf16 K + V */
    /* a centred cache (the default for e8box, e8p) is appended with rows (row 0 for every token: the encode
     * kernels subtract its means), as a serving engine's centred appends are; uncentred: append_slots */
    const int centered = e8kv_cuda_cache_centered(c);
    int32_t *d_rows = NULL;
    unsigned *d_stat = NULL;
    CU(cudaMalloc((void **)&d_rows, n_tok * sizeof(int32_t)));
    CU(cudaMemset(d_rows, 0, n_tok * sizeof(int32_t)));
    int32_t *d_pos = NULL, *pos = (int32_t *)malloc(n_tok * sizeof(int32_t)); /* center=rope: t */
    for (size_t t = 0; t < n_tok; t++)
        pos[t] = (int32_t)t;
    CU(cudaMalloc((void **)&d_pos, n_tok * sizeof(int32_t)));
    CU(cudaMemcpy(d_pos, pos, n_tok * sizeof(int32_t), cudaMemcpyHostToDevice));
    free(pos);
    CU(cudaMalloc((void **)&d_stat, sizeof(unsigned)));
    CU(cudaMemset(d_stat, 0, sizeof(unsigned)));
    /* (a) the API, host-synchronised */
    enum { N_API = 10, N_KER = 20 };
    const int n_api = n_tok == 8 ? 32 * N_API : N_API;
    float *ta = (float *)malloc((size_t)(n_api + 3) * sizeof(float));
    for (int i = -3; i < n_api; i++) {
        const double t0 = now_us();
        size_t a;
        if (centered) {
            a = e8kv_cuda_append_pos_async(c, (size_t)(i + 3) % n_layer, d_slots, d_rows, NULL, d_pos, kin, vin,
                                           n_tok, E8KV_DTYPE_BF16, d_stat, NULL);
            CU(cudaDeviceSynchronize());
        } else {
            a = e8kv_cuda_append_slots(c, (size_t)(i + 3) % n_layer, d_slots, kin, vin, n_tok,
                                       E8KV_DTYPE_BF16);
        }
        const double t1 = now_us();
        if (e8kv_is_error(a)) {
            printf("append: %s\n", e8kv_error_name(a));
            exit(1);
        }
        if (i >= 0) ta[i] = (float)(t1 - t0);
    }
    const double api_us = time_median(ta, n_api);
    /* (b) the kernels alone: random ±1 signs (the timing does not depend on which) */
    float hs[128], *d_signs;
    for (size_t i = 0; i < d; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        hs[i] = r >> 63 ? -1.0f : 1.0f;
    }
    unsigned *d_flags;
    CU(cudaMalloc((void **)&d_signs, d * sizeof(float)));
    CU(cudaMemcpy(d_signs, hs, d * sizeof(float), cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&d_flags, sizeof(unsigned)));
    CU(cudaMemset(d_flags, 0, sizeof(unsigned)));
    const int fmt = spec_fmt(spec, 0);
    stream_desc *sd = (stream_desc *)malloc(2 * n_layer * sizeof(stream_desc));
    for (size_t l = 0; l < n_layer; l++)
        for (int s = 0; s < 2; s++) {
            void *pool;
            const size_t pb = e8kv_cuda_cache_pages(c, l, s, &pool);
            sd[2 * l + s].pool = (uint8_t *)pool, sd[2 * l + s].page_bytes = pb, sd[2 * l + s].n_blocks = np;
            sd[2 * l + s].head_bytes = pb / sh->n_kv, sd[2 * l + s].fmt = fmt;
            sd[2 * l + s].mu = NULL; /* the kernels alone: uncentred (the API timing above has the means) */
        }
    const float rot = 1.0f / sqrtf((float)d);
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t ev[2 * (N_KER + 3)];
    for (int i = 0; i < 2 * (N_KER + 3); i++)
        CU(cudaEventCreate(&ev[i]));
    float tk[N_KER];
    double ker_us;
    if (n_tok == 8) { /* a decode step: 32 layers × (K, V) in one graph */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (size_t l = 0; l < n_layer; l++)
            for (int s = 0; s < 2; s++)
                if (e8kv_cu_launch_append(&sd[2 * l + s], d_slots, s ? (void *)vin : (void *)kin, n_tok,
                                          sh->n_kv, d, bs, E8KV_DTYPE_BF16, d_signs, rot, d_flags, st, NULL))
                    printf("launch failed\n"), exit(1);
        CU(cudaStreamEndCapture(st, &g));
        CU(cudaGraphInstantiate(&ge, g, 0));
        for (int i = 0; i < N_KER + 3; i++) {
            CU(cudaEventRecord(ev[2 * i], st));
            CU(cudaGraphLaunch(ge, st));
            CU(cudaEventRecord(ev[2 * i + 1], st));
        }
        CU(cudaStreamSynchronize(st));
        for (int i = 0; i < N_KER; i++)
            CU(cudaEventElapsedTime(&tk[i], ev[2 * (i + 3)], ev[2 * (i + 3) + 1]));
        ker_us = time_median(tk, N_KER) * 1e3;
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
    } else {
        for (int i = 0; i < N_KER + 3; i++) {
            CU(cudaEventRecord(ev[2 * i], st));
            for (int s = 0; s < 2; s++)
                if (e8kv_cu_launch_append(&sd[s], d_slots, s ? (void *)vin : (void *)kin, n_tok, sh->n_kv, d,
                                          bs, E8KV_DTYPE_BF16, d_signs, rot, d_flags, st, NULL))
                    printf("launch failed\n"), exit(1);
            CU(cudaEventRecord(ev[2 * i + 1], st));
        }
        CU(cudaStreamSynchronize(st));
        for (int i = 0; i < N_KER; i++)
            CU(cudaEventElapsedTime(&tk[i], ev[2 * (i + 3)], ev[2 * (i + 3) + 1]));
        ker_us = time_median(tk, N_KER) * 1e3;
    }
    CU(cudaGetLastError());
    unsigned flags;
    CU(cudaMemcpy(&flags, d_flags, sizeof flags, cudaMemcpyDeviceToHost));
    if (flags) printf("encode flags %u\n", flags);
    if (n_tok == 8)
        printf("encode %-9s %-8s decode step 8 x 1 token x %zu layers: %7.1f us per append_slots call (one "
               "layer, host-synced); kernels alone %6.1f us per step (%5.2f us per layer)\n",
               sh->name, spec, n_layer, api_us, ker_us, ker_us / (double)n_layer);
    else
        printf("encode %-9s %-8s %6zu tokens%s: %8.1f us per append_slots call (%6.1f GB/s, host-synced); "
               "kernels alone %8.1f us (%6.1f GB/s, %4.1f%% of copy)\n",
               sh->name, spec, n_tok, outliers ? " +outliers" : "", api_us, in_bytes / (api_us * 1e-6) / 1e9, ker_us,
               in_bytes / (ker_us * 1e-6) / 1e9, 100.0 * in_bytes / (ker_us * 1e-6) / 1e9 / copy_gbps);
    if (g_json)
        fprintf(g_json,
                "{\"bench\":\"e8kv_cuda_encode\",\"device\":\"%s\",\"shape\":\"%s\",\"format\":\"%s\",\"n_tok\":%zu,"
                "\"n_layer\":%zu,\"outliers\":%d,\"api_us\":%.2f,\"kernel_us\":%.2f,\"input_bytes\":%.0f,"
                "\"copy_gbps\":%.1f}\n",
                g_dev, sh->name, spec, n_tok, n_layer, outliers, api_us, ker_us, in_bytes, copy_gbps);
    for (int i = 0; i < 2 * (N_KER + 3); i++)
        CU(cudaEventDestroy(ev[i]));
    CU(cudaStreamDestroy(st));
    free(sd), free(ta), free(slots), free(perm);
    void *const dev[] = {d_slots, kin, vin, d_signs, d_flags, d_rows, d_stat, d_pos};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        CU(cudaFree(dev[i]));
    e8kv_cuda_cache_free(c);
}

int main(int argc, char **argv) {
    int quick = 0, encode = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            g_json = fopen(argv[++i], "w");
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--block") && i + 1 < argc)
            g_bs = (size_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sink") && i + 1 < argc)
            g_sink = (size_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--suffix") && i + 1 < argc)
            g_suffix = argv[++i];
        else if (!strcmp(argv[i], "--encode"))
            encode = 1;
    }
    if (!e8kv_cuda_available()) {
        printf("bench_cuda: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    snprintf(g_dev, sizeof g_dev, "%s", prop.name);
    const double copy = copy_bandwidth();
    printf("device %s, %d SMs; device-to-device copy %.1f GB/s (read + write, 1 GiB, median of 20)\n", g_dev,
           prop.multiProcessorCount, copy);
    if (g_json) fprintf(g_json, "{\"bench\":\"copy\",\"device\":\"%s\",\"copy_gbps\":%.1f}\n", g_dev, copy);
    /* Gemma 3 (head_dim 256, its full-attention layers: the ones e8kv codes) only when --only names them */
    const shape shapes[] = {{"llama3-8b", 8, 4, 128, 32},
                            {"smollm2", 3, 3, 64, 30},
                            {"gemma3-1b", 1, 4, 256, 4},
                            {"gemma3-4b", 4, 2, 256, 5},
                            {"gemma3-12b", 8, 2, 256, 8}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    const size_t batches[] = {1, 8, 32}, ctxs[] = {4096, 32768, 131072};
    /* the spec, and its name in --only (a spec's commas would split the list) */
    const char *specs[] = {"e8box:4", "bf16", "e8p:2", "e8box:3", "k=e8box:4,v=e8box:3"};
    const char *names[] = {"e8box:4", "bf16", "e8p:2", "e8box:3", "k4v3"};
    if (encode) {
        for (int sh = 0; sh < 2; sh++)
            for (int f = 0; f < 4; f++) {
                run_encode(&shapes[sh], specs[f], 65536, 1, 0, copy);
                if (f != 1) run_encode(&shapes[sh], specs[f], 65536, 1, 1, copy);
                run_encode(&shapes[sh], specs[f], 8, 32, 0, copy);
            }
        if (g_json) fclose(g_json);
        return 0;
    }
    for (int s = 0; s < (only ? n_shapes : 2); s++)
        for (int b = 0; b < 3; b++)
            for (int x = 0; x < 3; x++)
                for (int f = 0; f < 5; f++) {
                    if (quick && (b == 2 || x == 2)) continue;
                    if (only) {
                        char name[96];
                        snprintf(name, sizeof name, "%s/%s/%zu/%zu", shapes[s].name, names[f], batches[b],
                                 ctxs[x]);
                        const size_t nl = strlen(name);
                        const char *hit = strstr(only, name);
                        while (hit && !((hit == only || hit[-1] == ',') && (hit[nl] == ',' || !hit[nl])))
                            hit = strstr(hit + 1, name);
                        if (!hit) continue;
                    }
                    run(&shapes[s], specs[f], batches[b], ctxs[x], copy);
                }
    if (g_json) fclose(g_json);
    return 0;
}
