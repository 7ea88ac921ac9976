/* The GPU cache against the CPU library (run on a device; exit 77 = skipped without one).
 *  1. codes: every vector the GPU appends has the bytes e8kv_codec_encode gives for the same input
 *     (e8box:4, e8box:3, e8p:2 and f16 through the CPU codec, bf16 against round-to-nearest-even),
 *     f32/f16/bf16 inputs;
 *  2. attention: ‖out − ref‖ / max(‖ref‖, 1e-6·max_t ‖v_t‖) ≤ 1e-3 per (sequence, head), ref = float64
 *     softmax attention over the CPU decode of the same bytes; variable context lengths, GQA 1/3/4/8,
 * head_dim 64 and 128, output poisoned (NaN) before each launch;
 *  3. isolation: poisoning every page outside a sequence's block table changes nothing in its output;
 *     fork shares pages and a write after the fork never reaches the parent;
 *     tied scores near 2000 on raw pages: q's rounding for the tensor cores keeps ~24 bits;
 *  4. errors: NaN input, a full pool, bad specs are named errors that leave the lengths unchanged; slots
 *     past the pool are RANGE; e8kv_cuda_check_tables_async finds bad page ids and contexts; a context past
 *     its table gives NaN for that sequence alone;
 *  5. the graph-safe decode step: async appends bit-identical to synchronous ones, append + attend captured
 *     in a CUDA graph and replayed with new context lengths gives the eager outputs; the status word.
 * Fresh random inputs each run (the seed is printed). `--quick`: small sizes for compute-sanitizer;
 * `--graph`: part 5 alone; `--precision`: the tied large scores alone. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "e8kv.h"
#include "e8kv_cuda.h"

/* tests/cuda_cpu_cache.c: the bytes a CPU cache holds for one coded vector (0: none there) */
extern "C" size_t e8kv_test_cpu_vector(const e8kv_cache *c, size_t layer, int is_v, size_t head, size_t slot,
                                       uint8_t *dst, size_t cap);

static int g_fail = 0, g_checks = 0;
static int g_rope_freqs = 0; /* run_case: a center=rope cache gets rope_freqs instead of rope_theta */
#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        g_checks++;                                                                                          \
        if (!(cond)) {                                                                                       \
            g_fail++;                                                                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                      \
            printf(__VA_ARGS__);                                                                             \
            printf("\n");                                                                                    \
        }                                                                                                    \
    } while (0)
#define CU(x)                                                                                                \
    do {                                                                                                     \
        const cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                             \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);                  \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static uint64_t g_rng;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static double unif(void) {
    return (double)(rnd() >> 11) * 0x1.0p-53;
}
static float gauss(void) {
    const double u = unif() + 1e-300, v = unif();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* random rows: per vector a random scale (1e-3 .. 30), an outlier now and then, a zero vector now and then */
static void fill_rows(float *x, size_t n_vec, size_t d) {
    for (size_t v = 0; v < n_vec; v++) {
        const float s = (float)exp(log(1e-3) + unif() * (log(30.0) - log(1e-3)));
        const int zero = rnd() % 97 == 0;
        for (size_t i = 0; i < d; i++)
            x[v * d + i] = zero ? 0.0f : s * gauss();
        if (!zero && rnd() % 5 == 0) x[v * d + rnd() % d] *= 12.0f;
    }
}

/* the rows in `dtype` on the device, and the floats they hold on the host (in place) */
static void *to_device(float *x, size_t n, e8kv_dtype dt) {
    void *d = NULL;
    if (dt == E8KV_DTYPE_F32) {
        CU(cudaMalloc(&d, n * 4));
        CU(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice));
    } else if (dt == E8KV_DTYPE_F16) {
        __half *h = (__half *)malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            h[i] = __float2half_rn(x[i]), x[i] = __half2float(h[i]);
        CU(cudaMalloc(&d, n * 2));
        CU(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
        free(h);
    } else {
        __nv_bfloat16 *h = (__nv_bfloat16 *)malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            h[i] = __float2bfloat16_rn(x[i]), x[i] = __bfloat162float(h[i]);
        CU(cudaMalloc(&d, n * 2));
        CU(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
        free(h);
    }
    return d;
}

static uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* CPU bytes of one vector in a GPU format, and its decode (unrotated) */
typedef struct {
    const char *name;
    e8kv_codec *codec; /* NULL for bf16 */
    size_t vb, d;
} cpu_fmt;
static cpu_fmt cpu_fmt_make(const char *name, size_t d, uint64_t seed) {
    cpu_fmt f = {name, NULL, 0, d};
    size_t err = 0;
    f.codec = e8kv_codec_create(name, d, seed, &err);
    if (!f.codec) {
        printf("codec %s: %s\n", name, e8kv_error_name(err));
        exit(1);
    }
    f.vb = e8kv_codec_vector_bytes(f.codec);
    return f;
}
static void cpu_encode(const cpu_fmt *f, uint8_t *dst, const float *x) {
    const size_t r = e8kv_codec_encode(f->codec, dst, f->vb, x, 1);
    if (e8kv_is_error(r)) printf("cpu encode: %s\n", e8kv_error_name(r)), exit(1);
}
static void cpu_decode(const cpu_fmt *f, float *y, const uint8_t *src) {
    e8kv_codec_decode(f->codec, y, f->d, src, f->vb, 1);
}

/* float64 softmax attention of q (d values, scale 1/√d) over n tokens: token t's K and V vectors at
 * k_exact / v_exact + t·stride for t < sink (exact rows), else at k_dec / v_dec + t·stride (the CPU decode);
 * lsink: a learned sink's logit joining the softmax with a zero value (-inf: none); ref = the output (0 when
 * n = 0), sc = n doubles of scratch. Returns the largest ‖v_t‖. */
static double ref_attention_ls(const float *q, size_t d, size_t n, size_t stride, size_t sink,
                               const float *k_exact, const float *k_dec, const float *v_exact,
                               const float *v_dec, double lsink, double *sc, double *ref) {
    double mx = -INFINITY, sum = 0.0, vmax = 0.0;
    for (size_t t = 0; t < n; t++) {
        const float *const kk = (t < sink ? k_exact : k_dec) + t * stride;
        double dot = 0.0;
        for (size_t i = 0; i < d; i++)
            dot += (double)q[i] * kk[i];
        sc[t] = dot / sqrt((double)d);
        mx = sc[t] > mx ? sc[t] : mx;
    }
    for (size_t t = 0; t < n; t++) {
        const float *const vv = (t < sink ? v_exact : v_dec) + t * stride;
        double n2 = 0.0;
        for (size_t i = 0; i < d; i++)
            n2 += (double)vv[i] * vv[i];
        vmax = fmax(vmax, sqrt(n2));
    }
    for (size_t i = 0; i < d; i++)
        ref[i] = 0.0;
    if (lsink > mx) mx = lsink;
    if (lsink > -INFINITY) sum = exp(lsink - mx);
    for (size_t t = 0; t < n; t++) {
        const float *const vv = (t < sink ? v_exact : v_dec) + t * stride;
        const double w = exp(sc[t] - mx);
        sum += w;
        for (size_t i = 0; i < d; i++)
            ref[i] += w * vv[i];
    }
    for (size_t i = 0; i < d; i++)
        ref[i] = n ? ref[i] / sum : 0.0;
    return vmax;
}
static double ref_attention(const float *q, size_t d, size_t n, size_t stride, size_t sink,
                            const float *k_exact, const float *k_dec, const float *v_exact,
                            const float *v_dec, double *sc, double *ref) {
    return ref_attention_ls(q, d, n, stride, sink, k_exact, k_dec, v_exact, v_dec, -INFINITY, sc, ref);
}

/* ‖out − ref‖ / max(‖ref‖, floor) over d values; INFINITY when out holds a non-finite value (*finite = 0) */
static double rel_error(const float *out, const double *ref, size_t d, double floor, int *finite) {
    double e2 = 0.0, r2 = 0.0;
    *finite = 1;
    for (size_t i = 0; i < d; i++) {
        const double o = out[i];
        *finite &= isfinite(o);
        e2 += (o - ref[i]) * (o - ref[i]);
        r2 += ref[i] * ref[i];
    }
    return *finite ? sqrt(e2) / fmax(sqrt(r2), floor) : INFINITY;
}

/* ---------------------------------------------------------------- 1 + 2: codes and attention */

typedef struct {
    const char *spec, *kname, *vname;
    size_t sink; /* the spec's sink=N: positions below it are exact in the reference */
} spec_case;

static void run_case(const spec_case *sc, size_t d, size_t n_kv, size_t G, const size_t *lens, size_t n_seq,
                     e8kv_dtype dt, size_t n_layer, size_t bs) {
    const uint64_t seed = rnd();
    const size_t n_head = n_kv * G;
    size_t total_pages = 0;
    for (size_t s = 0; s < n_seq; s++)
        total_pages += (lens[s] + bs - 1) / bs + 1;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = n_layer, p.n_head_kv = n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = total_pages;
    p.spec = sc->spec, p.seed = seed, p.max_seqs = n_seq + 2, p.max_batch = n_seq, p.max_append = 333;
    /* center=rope: keys carry a mean turned by RoPE (pairs of norm up to 4 at random pairs) */
    const int rope = strstr(sc->spec, "center=rope") != NULL;
    e8kv_rope *rp = NULL;
    float freqs[64]; /* g_rope_freqs: the model's own frequencies, theta's with the low half slowed 8x */
    if (rope) {
        p.rope_theta = unif() < 0.5 ? 10000.0f : 500000.0f;
        size_t e = 0;
        double f[64];
        for (size_t i = 0; i < d / 2; i++) {
            freqs[i] = (float)(pow((double)p.rope_theta, -2.0 * (double)i / (double)d) / (i >= d / 4 ? 8.0 : 1.0));
            f[i] = freqs[i];
        }
        if (g_rope_freqs) p.rope_freqs = freqs, p.rope_theta = 0.0f;
        rp = g_rope_freqs ? e8kv_rope_create_freqs(d, f, 0, &e) : e8kv_rope_create(d, p.rope_theta, 0, &e);
        CHECK(rp, "rope: %s", e8kv_error_name(e));
        if (!rp) return;
    }
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "create %s: %s", sc->spec, e8kv_error_name(err));
    if (!c) return;
    /* head_dim 256: each vector is its two halves of 128, each the head_dim-128 codec's (e8kv_cuda.h) */
    const size_t cd = d == 256 ? 128 : d, nh = d / cd;
    cpu_fmt kf = cpu_fmt_make(sc->kname, cd, seed), vf = cpu_fmt_make(sc->vname, cd, seed);
    /* center=1 unless the spec says center=0: the e8box and e8p streams code x − μ, μ the mean of the
     * sequence's first append (here its prefill, or one token: 0) as the CPU cache computes it */
    const int cen[2] = {
        !strstr(sc->spec, "center=0") && strcmp(sc->kname, "bf16") && strcmp(sc->kname, "f16"),
        !strstr(sc->spec, "center=0") && strcmp(sc->vname, "bf16") && strcmp(sc->vname, "f16")};
    CHECK(e8kv_cuda_cache_centered(c) == (cen[0] || cen[1]), "%s: centered %d", sc->spec,
          e8kv_cuda_cache_centered(c));
    size_t *ids = (size_t *)malloc(n_seq * sizeof *ids);
    for (size_t s = 0; s < n_seq; s++)
        ids[s] = e8kv_cuda_seq_create(c);
    const size_t layer = n_layer - 1;
    size_t max_len = 0;
    for (size_t s = 0; s < n_seq; s++)
        max_len = lens[s] > max_len ? lens[s] : max_len;
    /* host copies of what went in: (seq, pos, head, d) */
    float **K = (float **)malloc(n_seq * sizeof *K), **V = (float **)malloc(n_seq * sizeof *V);
    const size_t row = n_kv * d;
    float *MU = (float *)calloc(n_seq * 2 * row, sizeof(float)); /* (seq, K/V, head, d) */
    /* center=rope: each (seq, head)'s chosen pairs and their means before RoPE (zero: pairs 0..7, means 0) */
    int *RI = (int *)calloc(n_seq * n_kv * 8, sizeof(int));
    float *RM = (float *)calloc(n_seq * n_kv * 16, sizeof(float));
    for (size_t i = 0; i < n_seq * n_kv * 8; i++)
        RI[i] = (int)(i % 8);
    /* prefill: the first 2/3 of each sequence in one or two appends; the rest by batched decode steps */
    for (size_t s = 0; s < n_seq; s++) {
        K[s] = (float *)malloc((lens[s] + 1) * row * sizeof(float));
        V[s] = (float *)malloc((lens[s] + 1) * row * sizeof(float));
        fill_rows(K[s], lens[s] * n_kv, d);
        fill_rows(V[s], lens[s] * n_kv, d);
        const size_t pre = 2 * lens[s] / 3;
        if (rope) { /* + R_t·m_h, m_h a mean before RoPE with a few large pairs; rounded to the dtype */
            float *m = (float *)malloc(row * sizeof(float)), *tmp = (float *)malloc(row * sizeof(float));
            for (size_t j = 0; j < row; j++)
                m[j] = unif() < 0.15 ? 4.0f * gauss() : 0.3f * gauss();
            for (size_t t = 0; t < lens[s]; t++) {
                memcpy(tmp, m, row * sizeof(float));
                e8kv_rope_apply(rp, tmp, 1, n_kv, t);
                for (size_t j = 0; j < row; j++)
                    K[s][t * row + j] += tmp[j]; /* to_device rounds to the dtype */
            }
            free(m), free(tmp);
        }
        void *dk = to_device(K[s], lens[s] * row, dt), *dv = to_device(V[s], lens[s] * row, dt);
        for (int st = 0; st < 2; st++)
            for (size_t j = 0; j < row && cen[st] && pre >= E8KV_CUDA_CENTER_MIN_TOKENS; j++) {
                double sum = 0.0;
                for (size_t t = 0; t < pre; t++)
                    sum += (st ? V[s] : K[s])[t * row + j];
                MU[(s * 2 + st) * row + j] = (float)(sum / (double)pre);
            }
        if (rope && pre >= E8KV_CUDA_CENTER_MIN_TOKENS) /* as rope_means_kernel: means before RoPE, 8 pairs */
            for (size_t h = 0; h < n_kv; h++) {
                double e[64], sx[64] = {0}, sy[64] = {0}; /* each pair's sums, in token order */
                float a[64], b[64], cs[128];
                for (size_t t = 0; t < pre; t++) {
                    for (size_t j = 0; j < d; j++)
                        cs[j] = j % 2 ? 0.0f : 1.0f;
                    e8kv_rope_apply(rp, cs, 1, 1, t); /* position t's cos, sin of every pair */
                    for (size_t i = 0; i < d / 2; i++) {
                        const double x = K[s][t * row + h * d + 2 * i], y = K[s][t * row + h * d + 2 * i + 1];
                        sx[i] += x * cs[2 * i] + y * cs[2 * i + 1];
                        sy[i] += y * cs[2 * i] - x * cs[2 * i + 1];
                    }
                }
                for (size_t i = 0; i < d / 2; i++) {
                    a[i] = (float)(sx[i] / (double)pre), b[i] = (float)(sy[i] / (double)pre);
                    const double ma = MU[s * 2 * row + h * d + 2 * i], mb = MU[s * 2 * row + h * d + 2 * i + 1];
                    e[i] = ((double)a[i] * a[i] + (double)b[i] * b[i]) - (ma * ma + mb * mb);
                }
                for (int c8 = 0; c8 < 8; c8++) {
                    size_t best = 0;
                    for (size_t i = 1; i < d / 2; i++)
                        if (e[i] > e[best]) best = i;
                    e[best] = -INFINITY;
                    RI[(s * n_kv + h) * 8 + c8] = (int)best;
                    RM[(s * n_kv + h) * 16 + 2 * c8] = a[best], RM[(s * n_kv + h) * 16 + 2 * c8 + 1] = b[best];
                    MU[s * 2 * row + h * d + 2 * best] = MU[s * 2 * row + h * d + 2 * best + 1] = 0.0f;
                }
            }
        if (pre) {
            const size_t r = e8kv_cuda_seq_append(c, layer, ids[s], dk, dv, pre, dt);
            CHECK(r == pre, "prefill append: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
        }
        CU(cudaFree(dk));
        CU(cudaFree(dv));
    }
    /* decode steps: every sequence that still needs tokens gets one per step */
    for (size_t step = 0; step < max_len; step++) {
        size_t batch[64], nb = 0;
        for (size_t s = 0; s < n_seq; s++)
            if (e8kv_cuda_seq_length(c, ids[s], layer) < lens[s]) batch[nb++] = s;
        if (!nb) break;
        float *hk = (float *)malloc(nb * row * sizeof(float)),
              *hv = (float *)malloc(nb * row * sizeof(float));
        size_t sid[64];
        for (size_t i = 0; i < nb; i++) {
            const size_t s = batch[i], pos = e8kv_cuda_seq_length(c, ids[s], layer);
            memcpy(hk + i * row, K[s] + pos * row, row * sizeof(float));
            memcpy(hv + i * row, V[s] + pos * row, row * sizeof(float));
            sid[i] = ids[s];
        }
        /* the host copies already hold the dtype-rounded values: converting again is exact */
        void *dk = to_device(hk, nb * row, dt), *dv = to_device(hv, nb * row, dt);
        const size_t r = e8kv_cuda_seq_append_batch(c, layer, sid, nb, dk, dv, dt);
        CHECK(r == nb, "batch append: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
        CU(cudaFree(dk));
        CU(cudaFree(dv));
        free(hk);
        free(hv);
        if (e8kv_is_error(r)) break;
    }
    /* 1: bytes, and the decoded cache for the reference */
    size_t mism = 0, n_vec = 0;
    uint8_t gb[1024], cb[1024];
    float **DK = (float **)malloc(n_seq * sizeof *DK), **DV = (float **)malloc(n_seq * sizeof *DV);
    /* 1a: the same rows through a CPU cache of the same spec (keys after RoPE; theta's RoPE or the same
     * rope_freqs), appended as this test appended them (the prefill, then one token at a time): its pages must
     * hold the same bytes */
    const int with_cpu = !strncmp(sc->kname, "e8", 2) && !strncmp(sc->vname, "e8", 2);
    size_t cpu_mism = 0, cpu_vec = 0;
    for (size_t s = 0; s < n_seq; s++) {
        e8kv_cache *cpu = NULL;
        if (with_cpu) {
            char cspec[160];
            snprintf(cspec, sizeof cspec, "%s,rope=post", sc->spec);
            e8kv_cache_params cp;
            memset(&cp, 0, sizeof cp);
            cp.n_layer = 1, cp.n_head_kv = n_kv * nh, cp.head_dim = cd, cp.n_ctx = lens[s], cp.spec = cspec,
            cp.seed =
                seed; /* head_dim 256: a CPU cache of the halves (the same rows, twice the heads of 128) */
            cp.rope_theta = rope ? p.rope_theta : 0.0f;
            cp.rope_freqs = rope ? p.rope_freqs : NULL;
            size_t e = 0;
            cpu = e8kv_cache_create(&cp, &e);
            CHECK(cpu, "CPU cache '%s': %s", cspec, e8kv_error_name(e));
            const size_t pre = 2 * lens[s] / 3;
            for (size_t t = 0; cpu && t < lens[s]; t += t < pre ? pre : 1) {
                const size_t n = t < pre ? pre : 1;
                CHECK(e8kv_cache_append(cpu, 0, K[s] + t * row, V[s] + t * row, n) == t + n, "CPU append");
            }
        }
        /* the device copy was made from the dtype-rounded floats, so K[s] holds exactly the input */
        DK[s] = (float *)malloc((lens[s] + 1) * row * sizeof(float));
        DV[s] = (float *)malloc((lens[s] + 1) * row * sizeof(float));
        for (size_t pos = 0; pos < lens[s]; pos++)
            for (size_t h = 0; h < n_kv; h++)
                for (int st = 0; st < 2; st++) {
                    const cpu_fmt *f = st ? &vf : &kf;
                    const float *const mu = MU + (s * 2 + st) * row + h * d;
                    float x[256], turned[256]; /* center=rope: R_pos·μ at the chosen pairs, else 0 */
                    memset(turned, 0, sizeof turned);
                    if (rope && st == 0) {
                        for (int c8 = 0; c8 < 8; c8++) {
                            const int i = RI[(s * n_kv + h) * 8 + c8];
                            turned[2 * i] = RM[(s * n_kv + h) * 16 + 2 * c8];
                            turned[2 * i + 1] = RM[(s * n_kv + h) * 16 + 2 * c8 + 1];
                        }
                        e8kv_rope_apply(rp, turned, 1, 1, pos); /* 0 stays 0 at the other pairs */
                    }
                    for (size_t i = 0; i < d; i++)
                        x[i] = ((st ? V[s] : K[s])[pos * row + h * d + i] - mu[i]) - turned[i];
                    const size_t r = e8kv_cuda_seq_read_vector(c, gb, sizeof gb, ids[s], layer, st, pos, h);
                    CHECK(r == nh * f->vb, "read_vector: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "size");
                    for (size_t hh = 0; hh < nh; hh++)
                        cpu_encode(f, cb + hh * f->vb, x + hh * cd);
                    n_vec++;
                    uint8_t pb[1024];
                    if (cpu && pos >= sc->sink) {
                        size_t vb = 0;
                        for (size_t hh = 0; hh < nh; hh++)
                            vb += e8kv_test_cpu_vector(cpu, 0, st, h * nh + hh, pos, pb + hh * f->vb, f->vb);
                        cpu_vec++;
                        if (vb != nh * f->vb || memcmp(gb, pb, nh * f->vb)) {
                            if (cpu_mism < 3)
                                printf("  differs from the CPU cache: %s seq %zu pos %zu head %zu %s\n", sc->spec, s,
                                       pos, h, st ? "V" : "K");
                            cpu_mism++;
                        }
                    }
                    if (memcmp(gb, cb, nh * f->vb)) {
                        if (mism < 3) {
                            printf("  bytes differ: %s seq %zu pos %zu head %zu %s:", sc->spec, s, pos, h,
                                   st ? "V" : "K");
                            for (size_t i = 0; i < nh * f->vb && i < 12; i++)
                                printf(" %02x/%02x", gb[i], cb[i]);
                            printf("\n");
                        }
                        mism++;
                    }
                    float *const y = (st ? DV[s] : DK[s]) + pos * row + h * d;
                    for (size_t hh = 0; hh < nh; hh++)
                        cpu_decode(f, y + hh * cd, gb + hh * f->vb);
                    for (size_t i = 0; i < d; i++)
                        y[i] = (y[i] + mu[i]) + turned[i];
                }
        e8kv_cache_free(cpu);
    }
    CHECK(mism == 0, "%s d=%zu dtype %d: %zu of %zu vectors differ from the CPU codec", sc->spec, d, (int)dt,
          mism, n_vec);
    CHECK(!with_cpu || (cpu_mism == 0 && cpu_vec > 0), "%s d=%zu dtype %d: %zu of %zu vectors differ from the CPU cache's",
          sc->spec, d, (int)dt, cpu_mism, cpu_vec);
    /* 1b: gather = the reference's decoded cache (f32: the same floats; f16/bf16: those rounded to nearest
     * even), each sequence alone, then all of them to the shortest length in one call */
    size_t gmism = 0, gn = 0;
    for (size_t s = 0; s <= n_seq; s++) {
        const size_t ns = s < n_seq ? 1 : n_seq, *const sq = s < n_seq ? ids + s : ids;
        size_t nt = s < n_seq ? lens[s] : max_len;
        for (size_t i = 0; s == n_seq && i < n_seq; i++)
            nt = lens[i] < nt ? lens[i] : nt;
        if (!nt) continue;
        const e8kv_dtype odt = (e8kv_dtype)((s + (size_t)dt) % 3);
        const size_t esz = odt == E8KV_DTYPE_F32 ? 4 : 2, nv = ns * n_kv * nt * d;
        void *gk, *gv;
        CU(cudaMalloc(&gk, nv * esz));
        CU(cudaMalloc(&gv, nv * esz));
        CU(cudaMemset(gk, 0xff, nv * esz));
        CU(cudaMemset(gv, 0xff, nv * esz));
        const size_t r = e8kv_cuda_seq_gather(c, layer, gk, gv, odt, sq, ns, nt);
        CHECK(r == nv, "seq_gather: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
        uint8_t *hk = (uint8_t *)malloc(nv * esz), *hv = (uint8_t *)malloc(nv * esz);
        CU(cudaMemcpy(hk, gk, nv * esz, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(hv, gv, nv * esz, cudaMemcpyDeviceToHost));
        for (size_t j = 0; j < ns; j++) {
            const size_t sj = s < n_seq ? s : j;
            for (size_t h = 0; h < n_kv; h++)
                for (size_t t = 0; t < nt; t++)
                    for (int st = 0; st < 2; st++) {
                        const float *ref =
                            (t < sc->sink ? (st ? V : K) : (st ? DV : DK))[sj] + t * row + h * d;
                        const uint8_t *got = (st ? hv : hk) + (((j * n_kv + h) * nt + t) * d) * esz;
                        int same = 1;
                        for (size_t i = 0; i < d; i++) {
                            if (odt == E8KV_DTYPE_F32) {
                                float g;
                                memcpy(&g, got + 4 * i, 4);
                                same &= g == ref[i];
                            } else {
                                uint16_t g, w;
                                memcpy(&g, got + 2 * i, 2);
                                if (odt == E8KV_DTYPE_BF16) {
                                    w = bf16_rne(ref[i]);
                                } else {
                                    const __half hh = __float2half_rn(ref[i]);
                                    memcpy(&w, &hh, 2);
                                }
                                same &= g == w || ((g & 0x7fffu) == 0 && (w & 0x7fffu) == 0);
                            }
                        }
                        gn++;
                        if (!same && gmism++ < 3)
                            printf("  gather differs: %s seq %zu pos %zu head %zu %s dtype %d\n", sc->spec,
                                   sj, t, h, st ? "V" : "K", (int)odt);
                    }
        }
        free(hk), free(hv);
        CU(cudaFree(gk));
        CU(cudaFree(gv));
    }
    CHECK(gmism == 0, "%s d=%zu: %zu of %zu gathered vectors differ from the CPU decode", sc->spec, d, gmism,
          gn);
    /* 2: attention */
    float *q = (float *)malloc(n_seq * n_head * d * sizeof(float));
    for (size_t i = 0; i < n_seq * n_head * d; i++)
        q[i] = gauss() * (0.5f + (float)unif() * 2.0f);
    void *dq = to_device(q, n_seq * n_head * d, dt);
    float *dout, *out = (float *)malloc(n_seq * n_head * d * sizeof(float));
    CU(cudaMalloc((void **)&dout, n_seq * n_head * d * sizeof(float)));
    CU(cudaMemset(dout, 0xff, n_seq * n_head * d * sizeof(float))); /* NaN */
    const size_t r = e8kv_cuda_seq_attend(c, layer, dout, dq, dt, ids, n_seq, n_head);
    CHECK(r == n_seq * n_head * d, "attend: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
    CU(cudaMemcpy(out, dout, n_seq * n_head * d * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0.0;
    int n_bad_print = 0;
    double *sc_ = (double *)malloc((max_len + 1) * sizeof(double));
    for (size_t s = 0; s < n_seq; s++)
        for (size_t h = 0; h < n_head; h++) {
            const size_t kh = h / G;
            double ref[256];
            const double vmax =
                ref_attention(q + (s * n_head + h) * d, d, lens[s], row, sc->sink, K[s] + kh * d,
                              DK[s] + kh * d, V[s] + kh * d, DV[s] + kh * d, sc_, ref);
            /* relative to ‖ref‖, floored at 1e-6 of the largest value vector: when one zero V vector takes
             * nearly all the weight the exact output is ~1e-72, and float32 softmax weights (like SDPA's)
             * underflow below 2^-149, so only an absolute comparison means anything there */
            int finite;
            const double rel = rel_error(out + (s * n_head + h) * d, ref, d, 1e-6 * vmax, &finite);
            worst = rel > worst ? rel : worst;
            if (rel > 1e-3 && n_bad_print < 6) { /* say where, to tell a race from a formula */
                n_bad_print++;
                printf("    seq %zu (len %zu) head %zu: rel %.3g finite %d out[0..2] %g %g %g ref %g %g %g\n",
                       s, lens[s], h, rel, finite, out[(s * n_head + h) * d], out[(s * n_head + h) * d + 1],
                       out[(s * n_head + h) * d + 2], ref[0], ref[1], ref[2]);
            }
        }
    CHECK(worst <= 1e-3, "%s d=%zu G=%zu dtype %d block %zu: attention relative error %.3g > 1e-3", sc->spec,
          d, G, (int)dt, bs, worst);
    /* 2b: learned sinks (e8kv_cuda_set_layer_sinks): one logit per head, 2.2 below or above in turn the
     * log-sum-exp of its scores in the longest sequence (there the sink takes ~10% or ~90% of the weight),
     * one head without (-inf), one with a sink 40 above (all but ~e^-40) */
    float *ls = (float *)malloc(n_head * sizeof(float)), *d_ls;
    size_t s_long = 0;
    for (size_t s = 1; s < n_seq; s++)
        s_long = lens[s] > lens[s_long] ? s : s_long;
    for (size_t h = 0; h < n_head; h++) {
        double ref[256], lse = 0.0;
        if (lens[s_long]) {
            const size_t kh = h / G;
            ref_attention(q + (s_long * n_head + h) * d, d, lens[s_long], row, sc->sink, K[s_long] + kh * d,
                          DK[s_long] + kh * d, V[s_long] + kh * d, DV[s_long] + kh * d, sc_, ref);
            double mx = -INFINITY, z = 0.0;
            for (size_t t = 0; t < lens[s_long]; t++)
                mx = fmax(mx, sc_[t]);
            for (size_t t = 0; t < lens[s_long]; t++)
                z += exp(sc_[t] - mx);
            lse = mx + log(z);
        }
        ls[h] = (float)(lse + (h % 2 ? 2.2 : -2.2));
        if (h + 1 == n_head && n_head > 2) ls[h] = (float)(lse + 40.0);
    }
    ls[0] = -INFINITY;
    CU(cudaMalloc((void **)&d_ls, n_head * sizeof(float)));
    CU(cudaMemcpy(d_ls, ls, n_head * sizeof(float), cudaMemcpyHostToDevice));
    const size_t g_max = d == 256 ? 4 : 8; /* query heads per KV head the cache takes */
    CHECK(e8kv_cuda_set_layer_sinks(c, layer, d_ls, n_head + n_kv) == 0 || n_head / n_kv == g_max,
          "set_layer_sinks with a larger n_head");
    CHECK(e8kv_cuda_seq_attend(c, layer, dout, dq, dt, ids, n_seq, n_head) == E8KV_ERR(DIMENSION) ||
              n_head / n_kv == g_max,
          "attend with another n_head than the sinks'");
    CHECK(e8kv_cuda_set_layer_sinks(c, layer, d_ls, n_head) == 0, "set_layer_sinks");
    CU(cudaMemset(dout, 0xff, n_seq * n_head * d * sizeof(float)));
    const size_t r2 = e8kv_cuda_seq_attend(c, layer, dout, dq, dt, ids, n_seq, n_head);
    CHECK(r2 == n_seq * n_head * d, "attend with sinks: %s",
          e8kv_is_error(r2) ? e8kv_error_name(r2) : "count");
    CU(cudaMemcpy(out, dout, n_seq * n_head * d * sizeof(float), cudaMemcpyDeviceToHost));
    /* With a sink the output's scale is e^S / (e^S + e^sink) for the dominant scores S, no longer a ratio of
     * scores alone: an error δ common to them moves the output by w·δ (w the sink's share), where plain
     * attention cancels it. The scores keep q to ~22 bits (f16 hi + lo parts), an error up to ~2^-21 of
     * Σ|q_i k_i| / √d, which the heavy-tailed rows here (norms up to 30·12) make ~1e-3: the bound per
     * (sequence, head) is 1e-3 + w · 2^-20 · max_t Σ|q_i k_ti| / √d. */
    double worst_ls = 0.0, worst_ratio = 0.0, wmin = 1.0, wmax = 0.0;
    for (size_t s = 0; s < n_seq; s++)
        for (size_t h = 0; h < n_head; h++) {
            const size_t kh = h / G;
            double ref[256], ref0[256];
            const double vmax =
                ref_attention_ls(q + (s * n_head + h) * d, d, lens[s], row, sc->sink, K[s] + kh * d,
                                 DK[s] + kh * d, V[s] + kh * d, DV[s] + kh * d, ls[h], sc_, ref);
            ref_attention(q + (s * n_head + h) * d, d, lens[s], row, sc->sink, K[s] + kh * d, DK[s] + kh * d,
                          V[s] + kh * d, DV[s] + kh * d, sc_, ref0);
            double n0 = 0.0, n1 = 0.0, w = 0.0; /* the sink's share of the weight: 1 − ‖ref‖ / ‖ref0‖ */
            for (size_t i = 0; i < d; i++)
                n0 += ref0[i] * ref0[i], n1 += ref[i] * ref[i];
            if (lens[s] && n0 > 0.0) w = 1.0 - sqrt(n1 / n0);
            if (lens[s] && n0 > 0.0 && h && h + 1 < n_head) wmin = fmin(wmin, w), wmax = fmax(wmax, w);
            double qk = 0.0; /* max_t Σ|q_i k_ti| / √d */
            for (size_t t = 0; t < lens[s]; t++) {
                const float *const kk = (t < sc->sink ? K[s] : DK[s]) + t * row + kh * d;
                double a = 0.0;
                for (size_t i = 0; i < d; i++)
                    a += fabs((double)q[(s * n_head + h) * d + i] * kk[i]);
                qk = fmax(qk, a / sqrt((double)d));
            }
            const double tol = 1e-3 + w * ldexp(qk, -20);
            int finite;
            const double rel = rel_error(out + (s * n_head + h) * d, ref, d, 1e-6 * vmax, &finite);
            worst_ls = rel > worst_ls ? rel : worst_ls;
            worst_ratio = rel / tol > worst_ratio ? rel / tol : worst_ratio;
        }
    CHECK(worst_ratio <= 1.0,
          "%s d=%zu G=%zu dtype %d: attention with learned sinks: relative error %.3g, %.3g of its bound",
          sc->spec, d, G, (int)dt, worst_ls, worst_ratio);
    CHECK(n_head < 4 || (wmin < 0.5 && wmax > 0.5),
          "learned sinks of this test take %.3g .. %.3g of the weight", wmin, wmax);
    CHECK(e8kv_cuda_set_layer_sinks(c, layer, NULL, 0) == 0, "clear the sinks");
    CHECK(e8kv_cuda_set_layer_sinks(c, n_layer, d_ls, n_head) == E8KV_ERR(BAD_ARGUMENT),
          "sinks of layer n_layer");
    CU(cudaFree(d_ls));
    free(ls);
    printf("  %-18s%s d=%3zu kv=%zu G=%zu dtype=%d seqs=%zu block=%zu: %zu vectors bit-exact=%s, gather=%s, "
           "attention max rel err %.2e (learned sinks %.2e, %.2f of its bound)\n",
           sc->spec, rope && g_rope_freqs ? " (rope_freqs)" : "", d, n_kv, G, (int)dt, n_seq, bs, n_vec,
           mism ? "NO" : "yes", gmism ? "NO" : "yes", worst, worst_ls, worst_ratio);
    for (size_t s = 0; s < n_seq; s++)
        free(K[s]), free(V[s]), free(DK[s]), free(DV[s]);
    free(K), free(V), free(DK), free(DV), free(q), free(out), free(sc_), free(ids), free(MU), free(RI), free(RM);
    e8kv_rope_free(rp);
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    e8kv_codec_free(kf.codec);
    e8kv_codec_free(vf.codec);
    e8kv_cuda_cache_free(c);
}

/* ---------------------------------------------------------------- 3: isolation, fork */

static void test_isolation(const char *spec, size_t d) {
    const size_t bs = 16, n_kv = 2, G = 4, n_head = n_kv * G, n_blocks = 40, len = 150;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 1, p.n_head_kv = n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = n_blocks,
    p.spec = spec;
    p.seed = rnd(), p.max_batch = 2;
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "create: %s", e8kv_error_name(err));
    if (!c) return;
    /* caller-owned: sequence 0 gets pages scattered over the pool (a random permutation), sequence 1
     * (the victim of the poison, which nobody attends) the rest */
    int32_t perm[40];
    for (int i = 0; i < 40; i++)
        perm[i] = i;
    for (int i = 39; i > 0; i--) {
        const int j = (int)(rnd() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const size_t np = (len + bs - 1) / bs;
    int32_t table[2][40];
    memset(table, 0, sizeof table);
    for (size_t i = 0; i < np; i++)
        table[0][i] = perm[i];
    int64_t slots[150];
    for (size_t t = 0; t < len; t++)
        slots[t] = (int64_t)table[0][t / bs] * (int64_t)bs + (int64_t)(t % bs);
    float *k = (float *)malloc(len * n_kv * d * 4), *v = (float *)malloc(len * n_kv * d * 4);
    fill_rows(k, len * n_kv, d);
    fill_rows(v, len * n_kv, d);
    void *dk = to_device(k, len * n_kv * d, E8KV_DTYPE_F32),
         *dv = to_device(v, len * n_kv * d, E8KV_DTYPE_F32);
    int64_t *dslots;
    CU(cudaMalloc((void **)&dslots, sizeof slots));
    CU(cudaMemcpy(dslots, slots, sizeof slots, cudaMemcpyHostToDevice));
    size_t r = e8kv_cuda_append_slots(c, 0, dslots, dk, dv, len, E8KV_DTYPE_F32);
    CHECK(r == len, "append_slots: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
    float q[n_head * 256];
    for (size_t i = 0; i < n_head * d; i++)
        q[i] = gauss();
    void *dq = to_device(q, n_head * d, E8KV_DTYPE_F32);
    int32_t *dt, *dctx, ctx[1] = {(int32_t)len};
    CU(cudaMalloc((void **)&dt, sizeof table));
    CU(cudaMemcpy(dt, table, sizeof table, cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&dctx, sizeof ctx));
    CU(cudaMemcpy(dctx, ctx, sizeof ctx, cudaMemcpyHostToDevice));
    float *dout, o1[n_head * 256], o2[n_head * 256];
    CU(cudaMalloc((void **)&dout, sizeof o1));
    CU(cudaMemset(dout, 0xff, sizeof o1));
    r = e8kv_cuda_attend(c, 0, dout, dq, E8KV_DTYPE_F32, 1, n_head, dt, 40, dctx, len, NULL, 0, NULL);
    CHECK(!e8kv_is_error(r), "attend: %s", e8kv_error_name(r));
    CU(cudaMemcpy(o1, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
    /* poison every page outside the table (0xff: NaN in bf16/f16, the largest step in e8box) */
    for (int st = 0; st < 2; st++) {
        void *pool;
        const size_t pb = e8kv_cuda_cache_pages(c, 0, st, &pool);
        for (size_t i = np; i < 40; i++)
            CU(cudaMemset((uint8_t *)pool + (size_t)perm[i] * pb, 0xff, pb));
    }
    CU(cudaMemset(dout, 0xff, sizeof o1));
    r = e8kv_cuda_attend(c, 0, dout, dq, E8KV_DTYPE_F32, 1, n_head, dt, 40, dctx, len, NULL, 0, NULL);
    CU(cudaMemcpy(o2, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
    int finite = 1;
    for (size_t i = 0; i < n_head * d; i++)
        finite &= isfinite(o1[i]);
    CHECK(finite && !memcmp(o1, o2, n_head * d * 4),
          "%s: output changed when pages of another sequence changed", spec);
    printf("  isolation %-8s d=%zu: %s\n", spec, d,
           finite && !memcmp(o1, o2, n_head * d * 4) ? "ok" : "FAILED");
    /* a caller's workspace, zeroed once: the split counters at its start are left at zero by each call, so
     * two calls in a row give the cache's own result; one byte short is refused */
    {
        const size_t wb = e8kv_cuda_attend_workspace_bytes(c, 1, n_head, len);
        void *ws;
        CU(cudaMalloc(&ws, wb));
        CU(cudaMemset(ws, 0, wb));
        int same = 1;
        for (int rep = 0; rep < 2; rep++) {
            CU(cudaMemset(dout, 0xff, sizeof o1));
            r = e8kv_cuda_attend(c, 0, dout, dq, E8KV_DTYPE_F32, 1, n_head, dt, 40, dctx, len, ws, wb, NULL);
            CHECK(!e8kv_is_error(r), "attend with a workspace: %s", e8kv_error_name(r));
            CU(cudaMemcpy(o1, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
            same &= !memcmp(o1, o2, n_head * d * 4);
        }
        CHECK(same, "%s: a caller's workspace gave another result", spec);
        r = e8kv_cuda_attend(c, 0, dout, dq, E8KV_DTYPE_F32, 1, n_head, dt, 40, dctx, len, ws, wb - 1, NULL);
        CHECK(e8kv_get_error_code(r) == E8KV_ERROR_DST_TOO_SMALL, "%s: a short workspace: %s", spec,
              e8kv_error_name(r));
        CU(cudaFree(ws));
    }
    /* slots past the pool (the first one past it, and one far beyond): RANGE, synchronous and async, and
     * nothing attended changes (memcheck sees any write outside the pool) */
    {
        const int64_t past[2] = {(int64_t)(n_blocks * bs), (int64_t)1 << 40};
        unsigned *dstat, stat = 0;
        CU(cudaMalloc((void **)&dstat, sizeof(unsigned)));
        CU(cudaMemset(dstat, 0, sizeof(unsigned)));
        CU(cudaMemcpy(dslots, past, sizeof past, cudaMemcpyHostToDevice));
        r = e8kv_cuda_append_slots(c, 0, dslots, dk, dv, 2, E8KV_DTYPE_F32);
        CHECK(e8kv_get_error_code(r) == E8KV_ERROR_RANGE, "%s: a slot past the pool: %s", spec,
              e8kv_is_error(r) ? e8kv_error_name(r) : "accepted");
        r = e8kv_cuda_append_slots_async(c, 0, dslots, dk, dv, 2, E8KV_DTYPE_F32, dstat, NULL);
        CU(cudaMemcpy(&stat, dstat, sizeof stat, cudaMemcpyDeviceToHost));
        CHECK(r == 2 && e8kv_get_error_code(e8kv_cuda_status_error(stat)) == E8KV_ERROR_RANGE,
              "%s: a slot past the pool (async): status %u", spec, stat);
        CU(cudaMemset(dout, 0xff, sizeof o1));
        e8kv_cuda_attend(c, 0, dout, dq, E8KV_DTYPE_F32, 1, n_head, dt, 40, dctx, len, NULL, 0, NULL);
        CU(cudaMemcpy(o1, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(o1, o2, n_head * d * 4), "%s: a refused slot changed what is attended", spec);
        CU(cudaFree(dstat));
    }
    /* caller-owned tables: e8kv_cuda_check_tables_async finds a page id outside the pool (past it, negative)
     * at a position a context reads, and a context past the table, and nothing in good tables (entries past
     * the context are not read: garbage there is fine). The attention with a context past the table gives
     * that sequence NaN and the other the output of the same call with good tables, bit for bit. */
    {
        int32_t t2[2][40], c2[2] = {(int32_t)len, (int32_t)len};
        memcpy(t2[0], table[0], sizeof t2[0]);
        memcpy(t2[1], table[0], sizeof t2[1]);
        const size_t n2 = 2 * n_head * d;
        int32_t *dc2;
        unsigned *dstat, stat = 0;
        float *dout2, *good = (float *)malloc(n2 * 4), *got = (float *)malloc(n2 * 4), q2[2 * n_head * 256];
        for (size_t i = 0; i < n2; i++)
            q2[i] = gauss();
        void *dq2 = to_device(q2, n2, E8KV_DTYPE_F32);
        CU(cudaMalloc((void **)&dc2, sizeof c2));
        CU(cudaMalloc((void **)&dout2, n2 * 4));
        CU(cudaMalloc((void **)&dstat, sizeof(unsigned)));
        for (int bi = 0; bi < 4;
             bi++) { /* 0: good tables; 1: past the pool; 2: negative; 3: past the table */
            t2[1][3] = bi == 1 ? (int32_t)n_blocks : bi == 2 ? -5 : table[0][3];
            t2[1][39] = bi < 3 ? -7 : table[0][39]; /* past a context of len: never read (case 3 reads it) */
            c2[1] = bi == 3 ? (int32_t)(40 * bs + 1) : (int32_t)len;
            CU(cudaMemcpy(dt, t2, sizeof t2, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(dc2, c2, sizeof c2, cudaMemcpyHostToDevice));
            CU(cudaMemset(dstat, 0, sizeof(unsigned)));
            r = e8kv_cuda_check_tables_async(c, dt, 2, 40, dc2, dstat, NULL);
            CU(cudaMemcpy(&stat, dstat, sizeof stat, cudaMemcpyDeviceToHost));
            CHECK(r == 2 && stat == (bi ? E8KV_CUDA_STATUS_RANGE : 0u),
                  "%s d=%zu: check_tables case %d: status %u", spec, d, bi, stat);
            if (bi == 1 || bi == 2) continue; /* the kernels do not check page ids: not attended */
            CU(cudaMemset(dout2, bi ? 0 : 0xff, n2 * 4));
            r = e8kv_cuda_attend(c, 0, dout2, dq2, E8KV_DTYPE_F32, 2, n_head, dt, 40, dc2, 40 * bs, NULL, 0,
                                 NULL);
            CHECK(!e8kv_is_error(r), "attend: %s", e8kv_error_name(r));
            CU(cudaMemcpy(bi ? got : good, dout2, n2 * 4, cudaMemcpyDeviceToHost));
            if (!bi) continue;
            int nan1 = 1, fin0 = 1;
            for (size_t i = 0; i < n2 / 2; i++)
                nan1 &= isnan(got[n2 / 2 + i]), fin0 &= isfinite(good[i]) && isfinite(good[n2 / 2 + i]);
            CHECK(nan1 && fin0 && !memcmp(good, got, n2 / 2 * 4),
                  "%s d=%zu: a context past the table: NaN for that sequence alone", spec, d);
        }
        CHECK(e8kv_get_error_code(e8kv_cuda_check_tables_async(c, dt, 2, 40, dc2, NULL, NULL)) ==
                  E8KV_ERROR_BAD_ARGUMENT,
              "check_tables without a status word");
        CU(cudaMemcpy(dt, table, sizeof table, cudaMemcpyHostToDevice));
        free(good), free(got);
        CU(cudaFree(dq2));
        CU(cudaFree(dc2));
        CU(cudaFree(dout2));
        CU(cudaFree(dstat));
    }
    free(k), free(v);
    CU(cudaFree(dk));
    CU(cudaFree(dv));
    CU(cudaFree(dq));
    CU(cudaFree(dt));
    CU(cudaFree(dctx));
    CU(cudaFree(dout));
    CU(cudaFree(dslots));
    e8kv_cuda_cache_free(c);
}

/* One workspace, attend calls of different batch sizes: 63 sequences, then 32, then 63 again give the first
 * call's floats bit for bit (the split counters of sequences 32..62 must not lie where the 32-sequence call
 * puts its partial states; with 2 KV heads their offsets cross a 256-byte step at 32 sequences) */
static void test_workspace_reuse(const char *spec, size_t d) {
    const size_t n_kv = 2, G = 4, n_head = n_kv * G, bs = 16, len = 64, n_big = 63, n_small = 32;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 1, p.n_head_kv = n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = len / bs,
    p.spec = spec;
    p.seed = rnd(), p.max_batch = 64, p.max_ctx = len;
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "create %s: %s", spec, e8kv_error_name(err));
    if (!c) return;
    float *k = (float *)malloc(len * n_kv * d * 4), *v = (float *)malloc(len * n_kv * d * 4);
    float *q = (float *)malloc(n_big * n_head * d * 4), *oa = (float *)malloc(n_big * n_head * d * 4),
          *ob = (float *)malloc(n_big * n_head * d * 4);
    fill_rows(k, len * n_kv, d);
    fill_rows(v, len * n_kv, d);
    for (size_t i = 0; i < n_big * n_head * d; i++)
        q[i] = gauss();
    void *dk = to_device(k, len * n_kv * d, E8KV_DTYPE_F32),
         *dv = to_device(v, len * n_kv * d, E8KV_DTYPE_F32),
         *dq = to_device(q, n_big * n_head * d, E8KV_DTYPE_F32);
    int64_t slots[64];
    int32_t tables[63 * 4], ctx[63];
    for (size_t t = 0; t < len; t++)
        slots[t] = (int64_t)t;
    for (size_t s = 0; s < n_big; s++) {
        for (size_t i = 0; i < 4; i++)
            tables[s * 4 + i] = (int32_t)i;
        ctx[s] = (int32_t)(s % 2 ? len : len - s); /* full and shorter contexts */
    }
    int64_t *dslots;
    int32_t *dt, *dc;
    float *dout;
    CU(cudaMalloc((void **)&dslots, sizeof slots));
    CU(cudaMalloc((void **)&dt, sizeof tables));
    CU(cudaMalloc((void **)&dc, sizeof ctx));
    CU(cudaMalloc((void **)&dout, n_big * n_head * d * 4));
    CU(cudaMemcpy(dslots, slots, sizeof slots, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dt, tables, sizeof tables, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dc, ctx, sizeof ctx, cudaMemcpyHostToDevice));
    CHECK(e8kv_cuda_append_slots(c, 0, dslots, dk, dv, len, E8KV_DTYPE_F32) == len, "append_slots");
    const size_t nb[3] = {n_big, n_small, n_big};
    int finite = 1;
    for (int call = 0; call < 3; call++) {
        CU(cudaMemset(dout, 0xff, n_big * n_head * d * 4));
        const size_t r =
            e8kv_cuda_attend(c, 0, dout, dq, E8KV_DTYPE_F32, nb[call], n_head, dt, 4, dc, len, NULL, 0, NULL);
        CHECK(r == nb[call] * n_head * d, "attend of %zu sequences: %s", nb[call],
              e8kv_is_error(r) ? e8kv_error_name(r) : "count");
        if (call != 1) CU(cudaMemcpy(call ? ob : oa, dout, n_big * n_head * d * 4, cudaMemcpyDeviceToHost));
    }
    for (size_t i = 0; i < n_big * n_head * d; i++)
        finite &= isfinite(oa[i]);
    const int same = !memcmp(oa, ob, n_big * n_head * d * 4);
    CHECK(finite && same, "%s d=%zu: 63 sequences after 32 in one workspace differ from the first call", spec,
          d);
    printf("  workspace reuse %-8s d=%zu: %s\n", spec, d, finite && same ? "ok" : "FAILED");
    free(k), free(v), free(q), free(oa), free(ob);
    CU(cudaFree(dk));
    CU(cudaFree(dv));
    CU(cudaFree(dq));
    CU(cudaFree(dslots));
    CU(cudaFree(dt));
    CU(cudaFree(dc));
    CU(cudaFree(dout));
    e8kv_cuda_cache_free(c);
}

/* A gather over more (sequence, KV head) pairs than a grid has z blocks (65535): 32800 sequences of 2 KV
 * heads whose tables all name page 0, each gathered equal to the one sequence gathered alone, bit for bit */
static void test_gather_many(size_t d) {
    const size_t bs = 16, n_kv = 2, n_seq = 32800, n_tok = 2;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 1, p.n_head_kv = n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = 1;
    p.spec = "e8box:4,center=0", p.seed = rnd(), p.max_batch = 1;
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "create: %s", e8kv_error_name(err));
    if (!c) return;
    float *k = (float *)malloc(bs * n_kv * d * 4), *v = (float *)malloc(bs * n_kv * d * 4);
    fill_rows(k, bs * n_kv, d);
    fill_rows(v, bs * n_kv, d);
    void *dk = to_device(k, bs * n_kv * d, E8KV_DTYPE_F32), *dv = to_device(v, bs * n_kv * d, E8KV_DTYPE_F32);
    int64_t slots[16];
    for (size_t t = 0; t < bs; t++)
        slots[t] = (int64_t)t;
    int64_t *dslots;
    int32_t *dtab;
    CU(cudaMalloc((void **)&dslots, sizeof slots));
    CU(cudaMemcpy(dslots, slots, sizeof slots, cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&dtab, n_seq * sizeof(int32_t)));
    CU(cudaMemset(dtab, 0, n_seq * sizeof(int32_t)));
    size_t r = e8kv_cuda_append_slots(c, 0, dslots, dk, dv, bs, E8KV_DTYPE_F32);
    CHECK(r == bs, "append_slots: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
    const size_t one = n_kv * n_tok * d, nv = n_seq * one;
    float *g1, *gn, *h1 = (float *)malloc(2 * one * 4), *hn = (float *)malloc(2 * nv * 4);
    CU(cudaMalloc((void **)&g1, 2 * one * 4));
    CU(cudaMalloc((void **)&gn, 2 * nv * 4));
    CU(cudaMemset(gn, 0xff, 2 * nv * 4));
    r = e8kv_cuda_gather_async(c, 0, g1, g1 + one, E8KV_DTYPE_F32, 1, n_tok, dtab, 1, NULL, NULL);
    CHECK(r == one, "gather_async, one sequence: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
    r = e8kv_cuda_gather_async(c, 0, gn, gn + nv, E8KV_DTYPE_F32, n_seq, n_tok, dtab, 1, NULL, NULL);
    CHECK(r == nv, "gather_async, %zu sequences: %s", n_seq, e8kv_is_error(r) ? e8kv_error_name(r) : "count");
    CU(cudaMemcpy(h1, g1, 2 * one * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hn, gn, 2 * nv * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (int st = 0; st < 2; st++)
        for (size_t q = 0; q < n_seq; q++)
            bad += memcmp(hn + st * nv + q * one, h1 + st * one, one * 4) != 0;
    CHECK(bad == 0, "d=%zu: %zu of %zu sequences gathered unlike one alone", d, bad, 2 * n_seq);
    printf("  gather of %zu sequences x %zu KV heads d=%zu: %s\n", n_seq, n_kv, d, bad ? "FAILED" : "ok");
    free(k), free(v), free(h1), free(hn);
    CU(cudaFree(dk));
    CU(cudaFree(dv));
    CU(cudaFree(dslots));
    CU(cudaFree(dtab));
    CU(cudaFree(g1));
    CU(cudaFree(gn));
    e8kv_cuda_cache_free(c);
}

/* Large scores that tie: 32 keys each hold a big value on their own coordinate (and a small one on the next,
 * which makes the 32 scores equal to ~0.02), the query's coordinates differ (8 .. 16), so each key's score
 * carries the rounding of another coordinate of q·log2(e)/√d. At scores near 2000 a weight moves by that
 * rounding times the score: q split into two bf16 parts (~16 bits) put the output ~3e-3 from float64 (a
 * host emulation gave 1.9e-3 .. 4.2e-3 over 16 draws); with its third part (~24 bits) ~5e-5. Raw pages of
 * `dt`, input of the same type (stored exactly), G = 4 and 8 query heads (the query fragment's rows half
 * and wholly used) with one query for all heads. */
static float round_to(float x, e8kv_dtype dt) {
    if (dt == E8KV_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(x));
    if (dt == E8KV_DTYPE_F16) return __half2float(__float2half_rn(x));
    return x;
}
static void test_score_precision(const char *spec, e8kv_dtype dt, size_t d, size_t G) {
    const size_t bs = 16, n_head = G, len = 64, n_tie = 32, n_blocks = len / bs;
    const double S = 2000.0; /* the tied score, q·k/√d */
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 1, p.n_head_kv = 1, p.head_dim = d, p.block_size = bs, p.n_blocks = n_blocks, p.spec = spec;
    p.seed = rnd(), p.max_batch = 1;
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "create %s: %s", spec, e8kv_error_name(err));
    if (!c) return;
    float q[128], *k = (float *)calloc(len * d, 4), *v = (float *)malloc(len * d * 4);
    for (size_t i = 0; i < d; i++)
        q[i] = round_to((8.0f + 8.0f * (float)unif()) * (rnd() & 1 ? -1.0f : 1.0f), E8KV_DTYPE_BF16);
    for (size_t t = 0; t < len; t++) {
        float *kt = k + t * d;
        if (t < n_tie) {
            const size_t i = (2 * t) % d, j = i + 1;
            kt[i] = round_to((float)(S * sqrt((double)d) / q[i]), dt);
            kt[j] = round_to((float)((S * sqrt((double)d) - (double)kt[i] * q[i]) / q[j]), dt);
        } else {
            for (size_t i = 0; i < d; i++)
                kt[i] = gauss();
        }
        for (size_t i = 0; i < d; i++)
            v[t * d + i] = gauss();
    }
    void *dk = to_device(k, len * d, dt), *dv = to_device(v, len * d, dt); /* rounds k, v in place */
    int64_t slots[64];
    int32_t table[4] = {0, 1, 2, 3}, ctx[1] = {(int32_t)len};
    for (size_t t = 0; t < len; t++)
        slots[t] = (int64_t)t;
    int64_t *dslots;
    int32_t *dtab, *dctx;
    CU(cudaMalloc((void **)&dslots, sizeof slots));
    CU(cudaMemcpy(dslots, slots, sizeof slots, cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&dtab, sizeof table));
    CU(cudaMemcpy(dtab, table, sizeof table, cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&dctx, sizeof ctx));
    CU(cudaMemcpy(dctx, ctx, sizeof ctx, cudaMemcpyHostToDevice));
    size_t r = e8kv_cuda_append_slots(c, 0, dslots, dk, dv, len, dt);
    CHECK(r == len, "append_slots: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
    float qh[8 * 128], out[8 * 128];
    for (size_t h = 0; h < n_head; h++)
        memcpy(qh + h * d, q, d * 4);
    void *dq = to_device(qh, n_head * d, E8KV_DTYPE_F32);
    float *dout;
    CU(cudaMalloc((void **)&dout, sizeof out));
    CU(cudaMemset(dout, 0xff, sizeof out));
    r = e8kv_cuda_attend(c, 0, dout, dq, E8KV_DTYPE_F32, 1, n_head, dtab, n_blocks, dctx, len, NULL, 0, NULL);
    CHECK(!e8kv_is_error(r), "attend: %s", e8kv_error_name(r));
    CU(cudaMemcpy(out, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
    double sc[64], ref[128], worst = 0.0;
    ref_attention(q, d, len, d, 0, k, k, v, v, sc, ref);
    for (size_t h = 0; h < n_head; h++) {
        int finite;
        const double rel = rel_error(out + h * d, ref, d, 0.0, &finite);
        worst = rel > worst ? rel : worst;
    }
    CHECK(worst <= 1e-3, "%s d=%zu G=%zu: tied scores near %.0f, relative error %.3g > 1e-3", spec, d, G, S,
          worst);
    printf("  tied large scores %-5s d=%3zu G=%zu: %zu keys at q·k/√d = %.0f, attention max rel err %.2e\n",
           spec, d, G, n_tie, S, worst);
    free(k), free(v);
    CU(cudaFree(dk));
    CU(cudaFree(dv));
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    CU(cudaFree(dslots));
    CU(cudaFree(dtab));
    CU(cudaFree(dctx));
    e8kv_cuda_cache_free(c);
}

static void test_fork_and_errors(const char *spec, size_t d) {
    const size_t n_kv = 2, G = 2, n_head = n_kv * G;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 2, p.n_head_kv = n_kv, p.head_dim = d, p.n_blocks = 8, p.spec = spec, p.seed = rnd();
    p.max_seqs = 4, p.max_batch = 4, p.max_ctx = 1024; /* the pool (8 pages), not the context, runs out */
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "create: %s", e8kv_error_name(err));
    if (!c) return;
    const size_t row = n_kv * d;
    float *x = (float *)malloc(200 * row * 4), *y = (float *)malloc(200 * row * 4);
    fill_rows(x, 200 * n_kv, d);
    fill_rows(y, 200 * n_kv, d);
    void *dx = to_device(x, 200 * row, E8KV_DTYPE_F32), *dy = to_device(y, 200 * row, E8KV_DTYPE_F32);
    const size_t a = e8kv_cuda_seq_create(c);
    for (size_t l = 0; l < 2; l++)
        CHECK(e8kv_cuda_seq_append(c, l, a, dx, dy, 40, E8KV_DTYPE_F32) == 40, "append");
    float q[4 * 128];
    for (size_t i = 0; i < n_head * d; i++)
        q[i] = gauss();
    void *dq = to_device(q, n_head * d, E8KV_DTYPE_F32);
    float *dout, o1[4 * 128], o2[4 * 128];
    CU(cudaMalloc((void **)&dout, sizeof o1));
    CU(cudaMemset(dout, 0xff, sizeof o1));
    e8kv_cuda_seq_attend(c, 1, dout, dq, E8KV_DTYPE_F32, &a, 1, n_head);
    CU(cudaMemcpy(o1, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
    const size_t free0 = e8kv_cuda_cache_free_pages(c);
    const size_t b = e8kv_cuda_seq_fork(c, a);
    CHECK(!e8kv_is_error(b) && e8kv_cuda_cache_free_pages(c) == free0, "fork shares pages");
    CU(cudaMemset(dout, 0xff, sizeof o1));
    e8kv_cuda_seq_attend(c, 1, dout, dq, E8KV_DTYPE_F32, &b, 1, n_head);
    CU(cudaMemcpy(o2, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(o1, o2, n_head * d * 4), "%s: the fork attends unlike its parent", spec);
    /* b writes into the shared partial page: it must be copied, a unchanged */
    for (size_t l = 0; l < 2; l++)
        CHECK(e8kv_cuda_seq_append(c, l, b, (uint8_t *)dx + 40 * row * 4, (uint8_t *)dy + 40 * row * 4, 30,
                                   E8KV_DTYPE_F32) == 70,
              "append after fork");
    CU(cudaMemset(dout, 0xff, sizeof o1));
    e8kv_cuda_seq_attend(c, 1, dout, dq, E8KV_DTYPE_F32, &a, 1, n_head);
    CU(cudaMemcpy(o2, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(o1, o2, n_head * d * 4), "%s: parent changed by a write of its fork", spec);
    /* the fork sees the parent's 40 tokens and its own 30: the same bytes as a fresh sequence given all 70 */
    uint8_t b1[1024], b2[1024];
    int same = 1;
    for (size_t pos = 0; pos < 70; pos += 7) {
        e8kv_cuda_seq_read_vector(c, b1, sizeof b1, b, 1, 0, pos, 1);
        if (pos < 40) {
            e8kv_cuda_seq_read_vector(c, b2, sizeof b2, a, 1, 0, pos, 1);
            same &= !memcmp(b1, b2, e8kv_cuda_cache_vector_bytes(c, 1, 0));
        }
    }
    CHECK(same, "fork holds the parent's bytes");
    /* errors: NaN → NONFINITE, length unchanged */
    x[5] = NAN;
    void *dn = to_device(x, 200 * row, E8KV_DTYPE_F32);
    size_t r = e8kv_cuda_seq_append(c, 0, a, dn, dy, 10, E8KV_DTYPE_F32);
    CHECK(e8kv_get_error_code(r) == E8KV_ERROR_NONFINITE && e8kv_cuda_seq_length(c, a, 0) == 40, "NaN: %s",
          e8kv_error_name(r));
    /* pool exhaustion: OUT_OF_MEMORY, nothing lost */
    r = e8kv_cuda_seq_append(c, 0, b, dx, dy, 200, E8KV_DTYPE_F32);
    CHECK(e8kv_get_error_code(r) == E8KV_ERROR_OUT_OF_MEMORY && e8kv_cuda_seq_length(c, b, 0) == 70,
          "full: %s", e8kv_error_name(r));
    CU(cudaMemset(dout, 0xff, sizeof o1));
    e8kv_cuda_seq_attend(c, 1, dout, dq, E8KV_DTYPE_F32, &a, 1, n_head);
    CU(cudaMemcpy(o2, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(o1, o2, n_head * d * 4), "failed appends changed stored data");
    CHECK(!e8kv_is_error(e8kv_cuda_seq_free(c, b)) && !e8kv_is_error(e8kv_cuda_seq_free(c, a)) &&
              e8kv_cuda_cache_free_pages(c) == 8,
          "free returns every page");
    printf("  fork/errors %-8s d=%zu: done\n", spec, d);
    free(x), free(y);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    CU(cudaFree(dn));
    e8kv_cuda_cache_free(c);
    /* bad arguments */
    e8kv_cuda_cache_params bad = p;
    bad.spec = "e8box:2"; /* no GPU page format */
    CHECK(!e8kv_cuda_cache_create(&bad, &err) && e8kv_get_error_code(err) == E8KV_ERROR_SPEC, "bad spec");
    bad.spec = "k=e8p:2,v=bf16"; /* e8p:2 pairs with itself only */
    CHECK(!e8kv_cuda_cache_create(&bad, &err) && e8kv_get_error_code(err) == E8KV_ERROR_SPEC, "mixed e8p");
    bad.spec = spec, bad.head_dim = 96;
    CHECK(!e8kv_cuda_cache_create(&bad, &err) && e8kv_get_error_code(err) == E8KV_ERROR_HEAD_DIM, "head_dim");
}

/* e8kv_cuda_cache_copy_async: a cache of the same parameters (another seed: the copy takes the source's
 * rotation) that held other tokens becomes the source's copy: the same attention bit for bit, the same bytes
 * for the same later appends, the same free pages; then the two change independently. Caches of other
 * parameters are refused and keep what they hold. */
static void test_cache_copy(const char *spec, size_t d) {
    const size_t n_kv = 2, G = 2, n_head = n_kv * G;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 2, p.n_head_kv = n_kv, p.head_dim = d, p.n_blocks = 16, p.spec = spec, p.seed = rnd();
    p.max_seqs = 4, p.max_batch = 4, p.max_ctx = 256, p.rope_theta = 10000.0f;
    size_t err = 0;
    e8kv_cuda_cache *a = e8kv_cuda_cache_create(&p, &err);
    p.seed = rnd();
    e8kv_cuda_cache *b = e8kv_cuda_cache_create(&p, &err);
    CHECK(a && b, "create: %s", e8kv_error_name(err));
    if (!a || !b) return;
    const size_t row = n_kv * d;
    float *x = (float *)malloc(120 * row * 4), *y = (float *)malloc(120 * row * 4);
    fill_rows(x, 120 * n_kv, d);
    fill_rows(y, 120 * n_kv, d);
    void *dx = to_device(x, 120 * row, E8KV_DTYPE_F32), *dy = to_device(y, 120 * row, E8KV_DTYPE_F32);
    const size_t sa = e8kv_cuda_seq_create(a), sb0 = e8kv_cuda_seq_create(b), sb1 = e8kv_cuda_seq_create(b);
    for (size_t l = 0; l < 2; l++) {
        CHECK(e8kv_cuda_seq_append(a, l, sa, dx, dy, 70, E8KV_DTYPE_F32) == 70, "append a");
        CHECK(e8kv_cuda_seq_append(b, l, sb1, dy, dx, 33, E8KV_DTYPE_F32) == 33,
              "append b"); /* to be replaced */
    }
    CHECK(sa == sb0, "the first sequence of each cache has the same id");
    float q[4 * 256], o1[4 * 256], o2[4 * 256];
    for (size_t i = 0; i < n_head * d; i++)
        q[i] = gauss();
    void *dq = to_device(q, n_head * d, E8KV_DTYPE_F32);
    float *dout;
    CU(cudaMalloc((void **)&dout, sizeof o1));
#define ATTEND_INTO(c, o)                                                                                    \
    do {                                                                                                     \
        CU(cudaMemset(dout, 0xff, sizeof o1));                                                               \
        CHECK(!e8kv_is_error(e8kv_cuda_seq_attend(c, 1, dout, dq, E8KV_DTYPE_F32, &sa, 1, n_head)),          \
              "attend");                                                                                     \
        CU(cudaMemcpy(o, dout, n_head *d * 4, cudaMemcpyDeviceToHost));                                      \
    } while (0)
    ATTEND_INTO(a, o1);
    CHECK(e8kv_cuda_cache_copy_async(b, a, NULL) == 0, "copy");
    CU(cudaDeviceSynchronize());
    ATTEND_INTO(b, o2);
    CHECK(!memcmp(o1, o2, n_head * d * 4), "%s d=%zu: the copy attends unlike its source", spec, d);
    CHECK(e8kv_cuda_cache_free_pages(a) == e8kv_cuda_cache_free_pages(b) &&
              e8kv_cuda_seq_length(b, sa, 1) == 70 &&
              e8kv_is_error(e8kv_cuda_seq_length(b, sb1, 0)) ==
                  e8kv_is_error(e8kv_cuda_seq_length(a, sb1, 0)),
          "%s: the copy's sequences and free pages are the source's", spec);
    /* the copy goes on alone: its source is unchanged */
    for (size_t l = 0; l < 2; l++)
        CHECK(e8kv_cuda_seq_append(b, l, sa, (uint8_t *)dx + 70 * row * 4, (uint8_t *)dy + 70 * row * 4, 30,
                                   E8KV_DTYPE_F32) == 100,
              "append to the copy");
    ATTEND_INTO(a, o2);
    CHECK(!memcmp(o1, o2, n_head * d * 4), "%s: the source changed by an append to its copy", spec);
    /* the same tokens to the source: the same bytes and attention as the copy (the copy's rotation is the
     * source's, not its own seed's) */
    for (size_t l = 0; l < 2; l++)
        CHECK(e8kv_cuda_seq_append(a, l, sa, (uint8_t *)dx + 70 * row * 4, (uint8_t *)dy + 70 * row * 4, 30,
                                   E8KV_DTYPE_F32) == 100,
              "append to the source");
    ATTEND_INTO(a, o1);
    ATTEND_INTO(b, o2);
    uint8_t v1[1024], v2[1024];
    int same = 1;
    for (size_t pos = 0; pos < 100; pos += 9)
        for (int st = 0; st < 2; st++) {
            CHECK(!e8kv_is_error(e8kv_cuda_seq_read_vector(a, v1, sizeof v1, sa, 0, st, pos, 1)) &&
                      !e8kv_is_error(e8kv_cuda_seq_read_vector(b, v2, sizeof v2, sa, 0, st, pos, 1)),
                  "read_vector");
            same &= !memcmp(v1, v2, e8kv_cuda_cache_vector_bytes(a, 0, st));
        }
    CHECK(same && !memcmp(o1, o2, n_head * d * 4), "%s d=%zu: the same appends give other bytes", spec, d);
    /* refusals: other parameters, NULL; nothing copied */
    e8kv_cuda_cache_params q2 = p;
    q2.n_blocks = 17;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&q2, &err);
    CHECK(c && e8kv_get_error_code(e8kv_cuda_cache_copy_async(c, a, NULL)) == E8KV_ERROR_BAD_ARGUMENT &&
              e8kv_cuda_cache_free_pages(c) == 17,
          "copy between caches of other pools is refused");
    e8kv_cuda_cache_free(c);
    q2 = p;
    q2.spec = strstr(spec, "bf16") ? "f16" : "bf16";
    c = e8kv_cuda_cache_create(&q2, &err);
    CHECK(c && e8kv_get_error_code(e8kv_cuda_cache_copy_async(c, a, NULL)) == E8KV_ERROR_BAD_ARGUMENT,
          "copy between caches of other formats is refused");
    e8kv_cuda_cache_free(c);
    CHECK(e8kv_get_error_code(e8kv_cuda_cache_copy_async(NULL, a, NULL)) == E8KV_ERROR_BAD_ARGUMENT &&
              e8kv_get_error_code(e8kv_cuda_cache_copy_async(a, NULL, NULL)) == E8KV_ERROR_BAD_ARGUMENT &&
              e8kv_cuda_cache_copy_async(a, a, NULL) == 0,
          "copy: NULL refused, a cache onto itself nothing");
    ATTEND_INTO(a, o2);
    CHECK(!memcmp(o1, o2, n_head * d * 4), "%s: a refused copy changed the source", spec);
    /* the saved state (e8kv_cuda_cache_export / _import): into a fresh cache of another seed, the source's
     * attention and later bytes; bad bytes refused by name, the cache unchanged */
    const size_t need = e8kv_cuda_cache_export(a, NULL, 0, NULL, 0);
    uint8_t *st = (uint8_t *)malloc(need + 1);
    CHECK(!e8kv_is_error(need) && e8kv_cuda_cache_export(a, NULL, 0, st, need) == need, "export");
    CHECK(e8kv_get_error_code(e8kv_cuda_cache_export(a, NULL, 0, st, need - 1)) == E8KV_ERROR_DST_TOO_SMALL,
          "export: dst too small");
    const int64_t overlap[4] = {0, 4, 3, 2}, past[2] = {10, 7};
    CHECK(e8kv_get_error_code(e8kv_cuda_cache_export(a, overlap, 2, NULL, 0)) == E8KV_ERROR_BAD_ARGUMENT &&
              e8kv_get_error_code(e8kv_cuda_cache_export(a, past, 1, NULL, 0)) == E8KV_ERROR_BAD_ARGUMENT,
          "export: overlapping or out-of-pool ranges refused");
    p.seed = rnd();
    e8kv_cuda_cache *e = e8kv_cuda_cache_create(&p, &err);
    CHECK(e && e8kv_cuda_cache_import(e, st, need) == 0, "import");
    ATTEND_INTO(e, o2);
    CHECK(!memcmp(o1, o2, n_head * d * 4), "%s d=%zu: the imported cache attends unlike its source", spec, d);
    const size_t sc = e8kv_cuda_seq_create(a); /* a new sequence in both: the same id, pages and bytes */
    CHECK(e && e8kv_cuda_seq_create(e) == sc, "the imported cache's next sequence id");
    for (size_t l = 0; l < 2; l++)
        CHECK(e8kv_cuda_seq_append(a, l, sc, dy, dx, 20, E8KV_DTYPE_F32) == 20 &&
                  e8kv_cuda_seq_append(e, l, sc, dy, dx, 20, E8KV_DTYPE_F32) == 20,
              "append after import");
    same = 1;
    for (size_t pos = 0; pos < 20; pos += 3) {
        e8kv_cuda_seq_read_vector(a, v1, sizeof v1, sc, 1, 1, pos, 0);
        e8kv_cuda_seq_read_vector(e, v2, sizeof v2, sc, 1, 1, pos, 0);
        same &= !memcmp(v1, v2, e8kv_cuda_cache_vector_bytes(a, 1, 1));
    }
    CHECK(same && e8kv_cuda_cache_free_pages(a) == e8kv_cuda_cache_free_pages(e), "%s: imported bookkeeping",
          spec);
    struct {
        size_t at;
        uint8_t x;
        size_t size;
        int fix;
        e8kv_error_code want;
    } bad[] = {{need / 2, 1, need, 0, E8KV_ERROR_CHECKSUM},
               {0, 1, need, 0, E8KV_ERROR_CORRUPTED},
               {8, 1, need, 0, E8KV_ERROR_VERSION},
               {0, 0, need - 1, 0, E8KV_ERROR_TRUNCATED},
               {0, 0, 40, 0, E8KV_ERROR_TRUNCATED},
               {16, 1, need, 1, E8KV_ERROR_BAD_ARGUMENT},
               {need - 16, 0x40, need, 1, E8KV_ERROR_CORRUPTED}}; /* n_free past the pool, checksum fixed */
    for (size_t i = 0; e && i < sizeof bad / sizeof *bad; i++) {
        uint8_t *m = (uint8_t *)malloc(need);
        memcpy(m, st, need);
        m[bad[i].at] ^= bad[i].x;
        if (bad[i].fix) {
            const uint64_t h = XXH64(m, need - 8, 0);
            for (int k = 0; k < 8; k++)
                m[need - 8 + k] = (uint8_t)(h >> (8 * k));
        }
        const size_t r = e8kv_cuda_cache_import(e, m, bad[i].size);
        CHECK(e8kv_get_error_code(r) == bad[i].want, "import of bad bytes %zu: %s", i, e8kv_error_name(r));
        free(m);
    }
    if (e) {
        ATTEND_INTO(e, o2);
        CHECK(!memcmp(o1, o2, n_head * d * 4), "%s: a refused import changed the cache", spec);
    }
    free(st);
    e8kv_cuda_cache_free(e);
#undef ATTEND_INTO
    printf("  cache copy/save %-23s d=%zu: done\n", spec, d);
    free(x), free(y);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    e8kv_cuda_cache_free(a);
    e8kv_cuda_cache_free(b);
}

/* ---------------------------------------------------------------- 4a: sink rows, caller-owned */

/* sink=N (and center=1) through the serving-engine calls: each sequence gets a row of the caller's choosing
 * (here in reverse order): its means set from its rows (e8kv_cuda_set_means_async), its rows appended to
 * its slots with that row (e8kv_cuda_append_rows_async) and its first N rows to the row's sink rows,
 * attended with e8kv_cuda_attend_rows; the same rows in an owned-sequence cache (row = its id) must give
 * the same bytes and floats, bit for bit. A row out of range makes that sequence's output NaN, and the
 * others are untouched; appended with a row out of range, a token is RANGE in the status word. */
static void test_sink_slots(const char *spec, size_t d, size_t sink) {
    const size_t n_kv = 2, G = 4, n_head = n_kv * G, bs = 16, n_seq = 3, row = n_kv * d;
    const size_t max_rows = n_seq + 1; /* row 3: a spare row for the copy-on-write check */
    const size_t lens[3] = {sink > 1 ? sink - 1 : 1, 300, 1100}, width = (1100 + bs - 1) / bs;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 1, p.n_head_kv = n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = n_seq * width;
    p.spec = spec, p.seed = rnd(), p.max_seqs = max_rows, p.max_batch = n_seq, p.max_ctx = width * bs;
    size_t err = 0;
    e8kv_cuda_cache *a = e8kv_cuda_cache_create(&p, &err), *b = e8kv_cuda_cache_create(&p, &err);
    CHECK(a && b && e8kv_cuda_cache_sink(a) == sink, "create %s: %s", spec, e8kv_error_name(err));
    if (!a || !b) {
        e8kv_cuda_cache_free(a), e8kv_cuda_cache_free(b);
        return;
    }
    unsigned *dstat;
    CU(cudaMalloc((void **)&dstat, sizeof(unsigned)));
    CU(cudaMemset(dstat, 0, sizeof(unsigned)));
    int32_t tables[3 * 69], ctx[3], rows[3];
    size_t ids[3];
    float *x = (float *)malloc(1100 * row * sizeof(float)), *y = (float *)malloc(1100 * row * sizeof(float));
    int64_t *slots = (int64_t *)malloc(1100 * sizeof(int64_t)), *sslots = (int64_t *)malloc(1100 * sizeof(int64_t));
    int64_t *dslots, *dsslots;
    int32_t *trows = (int32_t *)malloc(1100 * sizeof(int32_t)), *dtrows;
    CU(cudaMalloc((void **)&dslots, 1100 * sizeof(int64_t)));
    CU(cudaMalloc((void **)&dsslots, 1100 * sizeof(int64_t)));
    CU(cudaMalloc((void **)&dtrows, 1100 * sizeof(int32_t)));
    const int centered = e8kv_cuda_cache_centered(a);
    for (size_t s = 0; s < n_seq; s++) {
        for (size_t i = 0; i < width; i++)
            tables[s * width + i] = (int32_t)(i * n_seq + (n_seq - 1 - s)); /* interleaved pages */
        ctx[s] = (int32_t)lens[s], rows[s] = (int32_t)(n_seq - 1 - s);
        fill_rows(x, lens[s] * n_kv, d);
        fill_rows(y, lens[s] * n_kv, d);
        void *dx = to_device(x, lens[s] * row, E8KV_DTYPE_BF16), *dy = to_device(y, lens[s] * row, E8KV_DTYPE_BF16);
        for (size_t t = 0; t < lens[s]; t++) {
            slots[t] = (int64_t)tables[s * width + t / bs] * (int64_t)bs + (int64_t)(t % bs);
            sslots[t] = t < sink ? (int64_t)(rows[s] * sink + t) : -1;
            trows[t] = rows[s];
        }
        CU(cudaMemcpy(dslots, slots, lens[s] * sizeof(int64_t), cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dsslots, sslots, lens[s] * sizeof(int64_t), cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dtrows, trows, lens[s] * sizeof(int32_t), cudaMemcpyHostToDevice));
        if (centered)
            CHECK(!e8kv_is_error(e8kv_cuda_set_means_async(a, 0, (size_t)rows[s], dx, dy, lens[s],
                                                           E8KV_DTYPE_BF16, NULL)),
                  "set_means_async");
        if (s % 2 == 0) { /* codes, means and sink rows in one call */
            CHECK(e8kv_cuda_append_rows_async(a, 0, dslots, dtrows, dsslots, dx, dy, lens[s], E8KV_DTYPE_BF16,
                                              dstat, NULL) == lens[s],
                  "append_rows_async with sink slots");
        } else { /* the sink rows by a call of their own */
            CHECK(e8kv_cuda_append_rows_async(a, 0, dslots, dtrows, NULL, dx, dy, lens[s], E8KV_DTYPE_BF16,
                                              dstat, NULL) == lens[s],
                  "append_rows_async");
            CHECK(e8kv_cuda_append_sink_async(a, 0, dsslots, dx, dy, lens[s], E8KV_DTYPE_BF16, dstat, NULL) ==
                      lens[s],
                  "append_sink_async");
        }
        ids[s] = e8kv_cuda_seq_create(b);
        CHECK(e8kv_cuda_seq_append(b, 0, ids[s], dx, dy, lens[s], E8KV_DTYPE_BF16) == lens[s], "seq_append");
        CU(cudaFree(dx));
        CU(cudaFree(dy));
    }
    unsigned stat = 1;
    CU(cudaMemcpy(&stat, dstat, sizeof stat, cudaMemcpyDeviceToHost));
    CHECK(stat == 0, "sink append status %u", stat);
    int same_bytes = 1; /* the pages: the same bytes at each sequence's slots */
    for (size_t s = 0; s < n_seq; s++)
        for (size_t t = 0; t < lens[s]; t += 13)
            for (int st = 0; st < 2; st++) {
                uint8_t ga[1024], gb[1024];
                const int64_t slot = (int64_t)tables[s * width + t / bs] * (int64_t)bs + (int64_t)(t % bs);
                const size_t r1 = e8kv_cuda_read_slot(a, ga, sizeof ga, 0, st, slot, 1);
                const size_t r2 = e8kv_cuda_seq_read_vector(b, gb, sizeof gb, ids[s], 0, st, t, 1);
                same_bytes &= r1 == r2 && !e8kv_is_error(r1) && !memcmp(ga, gb, r1);
            }
    CHECK(same_bytes, "%s d=%zu: caller-owned pages unlike owned ones", spec, d);
    float *q = (float *)malloc(n_seq * n_head * d * sizeof(float));
    for (size_t i = 0; i < n_seq * n_head * d; i++)
        q[i] = gauss();
    void *dq = to_device(q, n_seq * n_head * d, E8KV_DTYPE_F32);
    const size_t n_out = n_seq * n_head * d;
    float *dout, *oa = (float *)malloc(n_out * 4), *ob = (float *)malloc(n_out * 4);
    int32_t *dt, *dc, *dr;
    CU(cudaMalloc((void **)&dout, n_out * 4));
    CU(cudaMalloc((void **)&dt, sizeof tables));
    CU(cudaMalloc((void **)&dc, sizeof ctx));
    CU(cudaMalloc((void **)&dr, sizeof rows));
    CU(cudaMemcpy(dt, tables, sizeof tables, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dc, ctx, sizeof ctx, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dr, rows, sizeof rows, cudaMemcpyHostToDevice));
    CU(cudaMemset(dout, 0xff, n_out * 4));
    size_t r = e8kv_cuda_attend_rows(a, 0, dout, dq, E8KV_DTYPE_F32, n_seq, n_head, dt, width, dc, 1100, dr,
                                     NULL, 0, NULL);
    CHECK(r == n_out, "attend_rows: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
    CU(cudaMemcpy(oa, dout, n_out * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemset(dout, 0xff, n_out * 4));
    r = e8kv_cuda_seq_attend(b, 0, dout, dq, E8KV_DTYPE_F32, ids, n_seq, n_head);
    CHECK(r == n_out, "seq_attend: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
    CU(cudaMemcpy(ob, dout, n_out * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(oa, ob, n_out * 4), "%s d=%zu: caller-owned sink rows attend unlike owned ones", spec, d);
    { /* gather with the caller's tables and rows (sequences 1 and 2, 300 positions) = the owned cache's, bit
       * for bit; a page id past the pool makes its 16 positions NaN and nothing else */
        const size_t nt = 300, nv = 2 * n_kv * nt * d;
        float *ga, *gb, *ha = (float *)malloc(2 * nv * 4), *hb = (float *)malloc(2 * nv * 4);
        CU(cudaMalloc((void **)&ga, 2 * nv * 4));
        CU(cudaMalloc((void **)&gb, 2 * nv * 4));
        r = e8kv_cuda_gather_async(a, 0, ga, ga + nv, E8KV_DTYPE_F32, 2, nt, dt + width, width, dr + 1, NULL);
        CHECK(r == nv, "gather_async: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
        r = e8kv_cuda_seq_gather(b, 0, gb, gb + nv, E8KV_DTYPE_F32, ids + 1, 2, nt);
        CHECK(r == nv, "seq_gather: %s", e8kv_is_error(r) ? e8kv_error_name(r) : "count");
        CU(cudaMemcpy(ha, ga, 2 * nv * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(hb, gb, 2 * nv * 4, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(ha, hb, 2 * nv * 4), "%s d=%zu: caller-owned gather unlike owned", spec, d);
        CHECK(e8kv_get_error_code(e8kv_cuda_seq_gather(b, 0, gb, gb + nv, E8KV_DTYPE_F32, ids + 1, 2, 301)) ==
                  E8KV_ERROR_DIMENSION,
              "seq_gather past a sequence's length: DIMENSION");
        const int32_t keep = tables[2 * width + 3];
        tables[2 * width + 3] = (int32_t)p.n_blocks;
        CU(cudaMemcpy(dt, tables, sizeof tables, cudaMemcpyHostToDevice));
        e8kv_cuda_gather_async(a, 0, ga, ga + nv, E8KV_DTYPE_F32, 2, nt, dt + width, width, dr + 1, NULL);
        CU(cudaMemcpy(hb, ga, 2 * nv * 4, cudaMemcpyDeviceToHost));
        int ok = 1;
        for (size_t i = 0; i < 2 * nv; i++) {
            const size_t t = i / d % nt, seq = i / (n_kv * nt * d) % 2; /* (stream, seq, head, pos, d) */
            ok &= seq == 1 && t >= 3 * bs && t < 4 * bs && t >= sink
                      ? isnan(hb[i])
                      : hb[i] == ha[i] || (isnan(hb[i]) && isnan(ha[i]));
        }
        CHECK(ok, "%s d=%zu: a page id past the pool: NaN at its positions alone", spec, d);
        tables[2 * width + 3] = keep;
        CU(cudaMemcpy(dt, tables, sizeof tables, cudaMemcpyHostToDevice));
        free(ha), free(hb);
        CU(cudaFree(ga));
        CU(cudaFree(gb));
    }
    { /* copy-on-write (beam search): sequence 2's first three pages copied into pages nobody reads (past
       * sequence 0's tokens), its row into the spare row; attending with the copies in its table and row
       * gives the same floats, bit for bit. Then the copies the cache refuses. */
        int32_t src[3], dst[3], t2[3 * 69], r2[3];
        memcpy(t2, tables, sizeof tables);
        memcpy(r2, rows, sizeof rows);
        for (int j = 0; j < 3; j++)
            src[j] = tables[2 * width + j], dst[j] = tables[4 + j], t2[2 * width + j] = dst[j];
        const int32_t rsrc = rows[2], rdst = (int32_t)n_seq;
        r2[2] = rdst;
        CHECK(e8kv_cuda_copy_pages_async(a, src, dst, 3, NULL) == 3, "copy_pages_async");
        CHECK(e8kv_cuda_copy_rows_async(a, &rsrc, &rdst, 1, NULL) == 1, "copy_rows_async");
        CU(cudaMemcpy(dt, t2, sizeof t2, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dr, r2, sizeof r2, cudaMemcpyHostToDevice));
        CU(cudaMemset(dout, 0xff, n_out * 4));
        e8kv_cuda_attend_rows(a, 0, dout, dq, E8KV_DTYPE_F32, n_seq, n_head, dt, width, dc, 1100, dr, NULL, 0,
                              NULL);
        CU(cudaMemcpy(ob, dout, n_out * 4, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(oa, ob, n_out * 4), "%s d=%zu: attention over copied pages and row differs", spec, d);
        CU(cudaMemcpy(dt, tables, sizeof tables, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dr, rows, sizeof rows, cudaMemcpyHostToDevice));
        const int32_t twice[2] = {dst[0], dst[0]}, chain[2] = {dst[1], dst[2]}, past = (int32_t)p.n_blocks,
                      past_row = (int32_t)max_rows, neg = -1;
        CHECK(e8kv_get_error_code(e8kv_cuda_copy_pages_async(a, src, twice, 2, NULL)) ==
                  E8KV_ERROR_BAD_ARGUMENT,
              "copy_pages: a destination twice is refused");
        CHECK(e8kv_get_error_code(e8kv_cuda_copy_pages_async(a, dst, chain, 2, NULL)) ==
                  E8KV_ERROR_BAD_ARGUMENT,
              "copy_pages: a destination that is also a source is refused");
        CHECK(e8kv_get_error_code(e8kv_cuda_copy_pages_async(a, src, &past, 1, NULL)) ==
                  E8KV_ERROR_BAD_ARGUMENT,
              "copy_pages: a page past the pool is refused");
        CHECK(e8kv_get_error_code(e8kv_cuda_copy_pages_async(a, &neg, dst, 1, NULL)) ==
                  E8KV_ERROR_BAD_ARGUMENT,
              "copy_pages: a negative page is refused");
        CHECK(e8kv_get_error_code(e8kv_cuda_copy_rows_async(a, &rsrc, &past_row, 1, NULL)) ==
                  E8KV_ERROR_BAD_ARGUMENT,
              "copy_rows: a row past max_seqs is refused");
        CHECK(e8kv_cuda_copy_pages_async(a, NULL, NULL, 0, NULL) == 0, "copy_pages: nothing to copy");
    }
    /* sequence 1 names a row past max_seqs: its output is NaN, the others' unchanged */
    rows[1] = (int32_t)max_rows;
    CU(cudaMemcpy(dr, rows, sizeof rows, cudaMemcpyHostToDevice));
    CU(cudaMemset(dout, 0, n_out * 4));
    e8kv_cuda_attend_rows(a, 0, dout, dq, E8KV_DTYPE_F32, n_seq, n_head, dt, width, dc, 1100, dr, NULL, 0,
                          NULL);
    CU(cudaMemcpy(ob, dout, n_out * 4, cudaMemcpyDeviceToHost));
    int nan1 = 1;
    for (size_t i = n_head * d; i < 2 * n_head * d; i++)
        nan1 &= isnan(ob[i]);
    CHECK(nan1 && !memcmp(oa, ob, n_head * d * 4) && !memcmp(oa + 2 * n_head * d, ob + 2 * n_head * d, n_head * d * 4),
          "a bad sink row: NaN for its sequence alone");
    /* a sink slot past the rows: RANGE, nothing written (the outputs stay those of the first call) */
    void *dfin = to_device(x, row, E8KV_DTYPE_F32);
    sslots[0] = (int64_t)(max_rows * sink);
    CU(cudaMemcpy(dsslots, sslots, sizeof(int64_t), cudaMemcpyHostToDevice));
    e8kv_cuda_append_sink_async(a, 0, dsslots, dfin, dfin, 1, E8KV_DTYPE_F32, dstat, NULL);
    CU(cudaMemcpy(&stat, dstat, sizeof stat, cudaMemcpyDeviceToHost));
    CHECK(e8kv_get_error_code(e8kv_cuda_status_error(stat)) == E8KV_ERROR_RANGE, "sink slot past the rows: status %u",
          stat);
    rows[1] = 1;
    CU(cudaMemcpy(dr, rows, sizeof rows, cudaMemcpyHostToDevice));
    CU(cudaMemset(dout, 0xff, n_out * 4));
    e8kv_cuda_attend_rows(a, 0, dout, dq, E8KV_DTYPE_F32, n_seq, n_head, dt, width, dc, 1100, dr, NULL, 0,
                          NULL);
    CU(cudaMemcpy(ob, dout, n_out * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(oa, ob, n_out * 4), "a refused sink slot changed what is attended");
    if (centered) { /* a token appended with a row past max_seqs (to no slot): RANGE */
        CU(cudaMemset(dstat, 0, sizeof(unsigned)));
        trows[0] = (int32_t)max_rows;
        slots[0] = -1;
        CU(cudaMemcpy(dtrows, trows, sizeof(int32_t), cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dslots, slots, sizeof(int64_t), cudaMemcpyHostToDevice));
        e8kv_cuda_append_rows_async(a, 0, dslots, dtrows, NULL, dfin, dfin, 1, E8KV_DTYPE_F32, dstat, NULL);
        CU(cudaMemcpy(&stat, dstat, sizeof stat, cudaMemcpyDeviceToHost));
        CHECK(e8kv_get_error_code(e8kv_cuda_status_error(stat)) == E8KV_ERROR_RANGE,
              "row past max_seqs: status %u", stat);
    }
    { /* a sink slot past the rows in the one-call append (to no page slot): RANGE, nothing written */
        CU(cudaMemset(dstat, 0, sizeof(unsigned)));
        trows[0] = -1, slots[0] = -1, sslots[0] = (int64_t)(max_rows * sink);
        CU(cudaMemcpy(dtrows, trows, sizeof(int32_t), cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dslots, slots, sizeof(int64_t), cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dsslots, sslots, sizeof(int64_t), cudaMemcpyHostToDevice));
        e8kv_cuda_append_rows_async(a, 0, dslots, dtrows, dsslots, dfin, dfin, 1, E8KV_DTYPE_F32, dstat,
                                    NULL);
        CU(cudaMemcpy(&stat, dstat, sizeof stat, cudaMemcpyDeviceToHost));
        CHECK(e8kv_get_error_code(e8kv_cuda_status_error(stat)) == E8KV_ERROR_RANGE,
              "sink slot past the rows (one-call append): status %u", stat);
        CU(cudaMemset(dout, 0xff, n_out * 4));
        e8kv_cuda_attend_rows(a, 0, dout, dq, E8KV_DTYPE_F32, n_seq, n_head, dt, width, dc, 1100, dr, NULL, 0,
                              NULL);
        CU(cudaMemcpy(ob, dout, n_out * 4, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(oa, ob, n_out * 4), "a refused sink slot (one-call append) changed what is attended");
    }
    CU(cudaFree(dfin));
    CU(cudaMemset(dstat, 0, sizeof(unsigned)));
    /* NaN into a sink row: the status says so */
    x[3] = NAN;
    void *dn = to_device(x, row, E8KV_DTYPE_F32);
    sslots[0] = 0;
    CU(cudaMemcpy(dsslots, sslots, sizeof(int64_t), cudaMemcpyHostToDevice));
    e8kv_cuda_append_sink_async(a, 0, dsslots, dn, dn, 1, E8KV_DTYPE_F32, dstat, NULL);
    CU(cudaMemcpy(&stat, dstat, sizeof stat, cudaMemcpyDeviceToHost));
    CHECK(e8kv_get_error_code(e8kv_cuda_status_error(stat)) == E8KV_ERROR_NONFINITE, "NaN sink row: status %u", stat);
    printf("  sink rows %-22s d=%zu: caller-owned = owned %s\n", spec, d, memcmp(oa, ob, n_head * d * 4) ? "NO" : "yes");
    free(x), free(y), free(slots), free(sslots), free(q), free(oa), free(ob), free(trows);
    CU(cudaFree(dtrows));
    CU(cudaFree(dn));
    CU(cudaFree(dslots));
    CU(cudaFree(dsslots));
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    CU(cudaFree(dt));
    CU(cudaFree(dc));
    CU(cudaFree(dr));
    CU(cudaFree(dstat));
    e8kv_cuda_cache_free(a);
    e8kv_cuda_cache_free(b);
}

/* ---------------------------------------------------------------- 4b: a format per layer */

/* One cache whose layers have different formats (the library's spec grammar: k=/v=, layer rules) against
 * one single-format cache per layer, same seed, same rows: the pages must hold the same bytes and attention
 * give the same floats, bit for bit, layer by layer. Then the specs the GPU cache refuses. */
static void test_layers(size_t d) {
    const size_t n_kv = 2, G = 4, n_head = n_kv * G, len = 150, bs = 16, n_layer = 4, row = n_kv * d;
    const char *spec = "k=e8box:4,v=bf16,layer1=e8p:2,layers2-3.v=f16,layer3.k=e8box:3";
    const char *per_layer[4] = {"k=e8box:4,v=bf16", "e8p:2", "k=e8box:4,v=f16", "k=e8box:3,v=f16"};
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = n_layer, p.n_head_kv = n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = 12;
    p.spec = spec, p.seed = rnd(), p.max_batch = 1, p.max_seqs = 1;
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "create %s: %s", spec, e8kv_error_name(err));
    if (!c) return;
    float *x = (float *)malloc(len * row * 4), *y = (float *)malloc(len * row * 4), q[8 * 128];
    fill_rows(x, len * n_kv, d);
    fill_rows(y, len * n_kv, d);
    for (size_t i = 0; i < n_head * d; i++)
        q[i] = gauss();
    void *dx = to_device(x, len * row, E8KV_DTYPE_F32), *dy = to_device(y, len * row, E8KV_DTYPE_F32);
    void *dq = to_device(q, n_head * d, E8KV_DTYPE_F32);
    float *dout, o1[8 * 128], o2[8 * 128];
    CU(cudaMalloc((void **)&dout, sizeof o1));
    const size_t a = e8kv_cuda_seq_create(c);
    int ok = 1;
    size_t token_bytes = 0;
    for (size_t l = 0; l < n_layer; l++) {
        e8kv_cuda_cache_params p1 = p;
        p1.n_layer = 1, p1.spec = per_layer[l];
        e8kv_cuda_cache *c1 = e8kv_cuda_cache_create(&p1, &err);
        CHECK(c1, "create %s: %s", per_layer[l], e8kv_error_name(err));
        if (!c1) {
            ok = 0;
            continue;
        }
        token_bytes += e8kv_cuda_cache_token_bytes(c1);
        const size_t b = e8kv_cuda_seq_create(c1);
        CHECK(e8kv_cuda_seq_append(c, l, a, dx, dy, len, E8KV_DTYPE_F32) == len, "append layer %zu", l);
        CHECK(e8kv_cuda_seq_append(c1, 0, b, dx, dy, len, E8KV_DTYPE_F32) == len, "append %s", per_layer[l]);
        for (int st = 0; st < 2; st++) {
            CHECK(e8kv_cuda_cache_vector_bytes(c, l, st) == e8kv_cuda_cache_vector_bytes(c1, 0, st),
                  "layer %zu stream %d: vector bytes", l, st);
            uint8_t g1[1024], g2[1024];
            for (size_t pos = 0; pos < len; pos += 7)
                for (size_t h = 0; h < n_kv; h++) {
                    const size_t r1 = e8kv_cuda_seq_read_vector(c, g1, sizeof g1, a, l, st, pos, h);
                    const size_t r2 = e8kv_cuda_seq_read_vector(c1, g2, sizeof g2, b, 0, st, pos, h);
                    if (r1 != r2 || e8kv_is_error(r1) || memcmp(g1, g2, r1)) ok = 0;
                }
        }
        CU(cudaMemset(dout, 0xff, sizeof o1));
        CHECK(e8kv_cuda_seq_attend(c, l, dout, dq, E8KV_DTYPE_F32, &a, 1, n_head) == n_head * d, "attend %zu", l);
        CU(cudaMemcpy(o1, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemset(dout, 0xff, sizeof o1));
        CHECK(e8kv_cuda_seq_attend(c1, 0, dout, dq, E8KV_DTYPE_F32, &b, 1, n_head) == n_head * d, "attend %s",
              per_layer[l]);
        CU(cudaMemcpy(o2, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
        if (memcmp(o1, o2, n_head * d * 4)) ok = 0;
        e8kv_cuda_cache_free(c1);
    }
    CHECK(ok, "%s d=%zu: a layer differs from the cache of its own format", spec, d);
    CHECK(e8kv_cuda_cache_token_bytes(c) == token_bytes, "token bytes %zu, layers' sum %zu",
          e8kv_cuda_cache_token_bytes(c), token_bytes);
    printf("  layers %s d=%zu: %s\n", spec, d, ok ? "bit-exact with each layer's own cache" : "FAILED");
    /* what the GPU cache does not do: a named error, never another cache */
    const char *refused[] = {"e8box:4,sink=65",
                             "e8box:4,window=16",
                             "e8box:4,rope=pre",
                             "e8box:4,page=32",
                             "e8box:4,evict=snapkv:0.5",
                             "balanced",
                             "e8tv:4",
                             "auto=e8tv:3",
                             "e8box:2",
                             "e8:4",
                             "e8box:4,layer1.k=e8p:2",
                             "e8box:4,layers0-4=bf16",
                             "k=e8p:2,v=f16",
                             "e8box:4,,v=bf16",
                             /* center=rope: without rope_theta (below: with it), or K/V not both e8box (or e8p:2) */
                             "e8box:4,center=rope",
                             "e8p:2,center=rope",
                             "k=e8box:4,v=bf16,center=rope,rope_theta",
                             "k=bf16,v=e8box:4,center=rope,rope_theta",
                             "e8box:4,layer3.v=bf16,center=rope,rope_theta"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        e8kv_cuda_cache_params b = p;
        b.spec = refused[i];
        char bare[128];
        const char *th = strstr(refused[i], ",rope_theta");
        if (th) { /* the spec less this marker, with params.rope_theta set */
            snprintf(bare, sizeof bare, "%.*s", (int)(th - refused[i]), refused[i]);
            b.spec = bare, b.rope_theta = 10000.0f;
        }
        e8kv_cuda_cache *r = e8kv_cuda_cache_create(&b, &err);
        CHECK(!r && e8kv_get_error_code(err) == E8KV_ERROR_SPEC, "%s: %s", refused[i],
              r ? "accepted" : e8kv_error_name(err));
        e8kv_cuda_cache_free(r);
    }
    const char *accepted[] = {"e8box:4,center=0,rope=post", "e8box:4,center=1", "e8p:2,center=all",
                              "e8box:4,layer0=bf16,center=rope"};
    for (size_t i = 0; i < 4; i++) {
        e8kv_cuda_cache_params b = p;
        b.spec = accepted[i];
        b.rope_theta = i == 3 ? 500000.0f : 0.0f;
        e8kv_cuda_cache *r = e8kv_cuda_cache_create(&b, &err);
        CHECK(r && e8kv_cuda_cache_centered(r) == (i > 0), "%s: %s", accepted[i],
              r ? "centering" : e8kv_error_name(err));
        if (r && i == 3) { /* center=rope: rows without positions are refused, with them accepted */
            int64_t *ds;
            int32_t *dr;
            unsigned *dst;
            CU(cudaMalloc((void **)&ds, 8));
            CU(cudaMalloc((void **)&dr, 8));
            CU(cudaMalloc((void **)&dst, 4));
            CU(cudaMemset(ds, 0, 8));
            CU(cudaMemset(dr, 0, 8));
            CU(cudaMemset(dst, 0, 4));
            const size_t r1 = e8kv_cuda_append_rows_async(r, 1, ds, dr, NULL, dx, dy, 1, E8KV_DTYPE_F32, dst, NULL);
            const size_t r2 =
                e8kv_cuda_append_pos_async(r, 1, ds, dr, NULL, dr + 1, dx, dy, 1, E8KV_DTYPE_F32, dst, NULL);
            unsigned st = 1;
            CU(cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost));
            CHECK(e8kv_get_error_code(r1) == E8KV_ERROR_BAD_ARGUMENT && r2 == 1 && st == 0,
                  "center=rope appends: without positions %s, with them %s, status %u", e8kv_error_name(r1),
                  e8kv_error_name(r2), st);
            /* a position outside [0, max_ctx) (max_ctx 0: n_blocks · block_size): RANGE in the status word */
            const int32_t bad_pos[2] = {(int32_t)(p.n_blocks * bs), -1};
            for (int j = 0; j < 2; j++) {
                CU(cudaMemcpy(dr + 1, &bad_pos[j], 4, cudaMemcpyHostToDevice));
                CU(cudaMemset(dst, 0, 4));
                const size_t r3 =
                    e8kv_cuda_append_pos_async(r, 1, ds, dr, NULL, dr + 1, dx, dy, 1, E8KV_DTYPE_F32, dst, NULL);
                CU(cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost));
                CHECK(r3 == 1 && e8kv_get_error_code(e8kv_cuda_status_error(st)) == E8KV_ERROR_RANGE,
                      "center=rope append at position %d: %s, status %u", bad_pos[j], e8kv_error_name(r3), st);
            }
            CU(cudaFree(ds));
            CU(cudaFree(dr));
            CU(cudaFree(dst));
        }
        e8kv_cuda_cache_free(r);
    }
    { /* center=rope with the model's frequencies: one not finite, or negative, is BAD_ARGUMENT */
        float freqs[64];
        for (size_t i = 0; i < d / 2; i++)
            freqs[i] = powf(10000.0f, -2.0f * (float)i / (float)d);
        for (int j = 0; j < 2; j++) {
            freqs[d / 4] = j ? -1.0f : NAN;
            e8kv_cuda_cache_params b = p;
            b.spec = "e8box:4,center=rope", b.rope_freqs = freqs;
            e8kv_cuda_cache *r = e8kv_cuda_cache_create(&b, &err);
            CHECK(!r && e8kv_get_error_code(err) == E8KV_ERROR_BAD_ARGUMENT, "rope_freqs with %g: %s",
                  (double)freqs[d / 4], r ? "accepted" : e8kv_error_name(err));
            e8kv_cuda_cache_free(r);
        }
    }
    free(x), free(y);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    e8kv_cuda_cache_free(c);
}

/* center=rope with pages dropped from the middle of a row (what a token budget does): 7 pages of 16 tokens of
 * row 1, the first page at positions 0 .. 15, the others at 56 .. 151 (40 tokens already dropped: the row's
 * shift (16, 40), e8kv_cuda_set_row_shifts; keys with a large mean before RoPE, turned to their positions).
 * Then a block table closed up without pages 1 and 2 and the shift (16, 72): the gather of the 80 kept tokens
 * equals the whole row's gather at 0 .. 15 and 48 .. 111 bit for bit, and the attention over them is within
 * 1e-3 of float64 over those values; the same table with the shift of before (the test's control) gathers
 * other keys: their centre turned to the wrong positions. The cos/sin table covers 160 positions
 * (rope_positions), past max_ctx (128). */
static void test_row_shifts(const char *spec, size_t d) {
    const size_t bs = 16, n_kv = 2, G = 4, n_head = n_kv * G, n = 112, kept = 80, row = 1, vals = n * n_kv * d;
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 1, p.n_head_kv = n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = 8;
    p.spec = spec, p.seed = rnd(), p.max_seqs = 2, p.max_batch = 1;
    p.rope_theta = 10000.0f, p.rope_positions = 160;
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "create %s: %s", spec, e8kv_error_name(err));
    if (!c) return;
    e8kv_rope *rp = e8kv_rope_create(d, p.rope_theta, 0, &err);
    float *k = (float *)malloc(vals * 4), *v = (float *)malloc(vals * 4), bias[2 * 128];
    fill_rows(k, n * n_kv, d);
    fill_rows(v, n * n_kv, d);
    for (size_t i = 0; i < n_kv * d; i++)
        bias[i] = 4.0f * gauss();
    for (size_t t = 0; t < n; t++) { /* keys after RoPE: (bias + noise) turned to their positions */
        for (size_t i = 0; i < n_kv * d; i++)
            k[t * n_kv * d + i] += bias[i];
        e8kv_rope_apply(rp, k + t * n_kv * d, 1, n_kv, t < bs ? t : t + 40);
    }
    e8kv_rope_free(rp);
    void *dk = to_device(k, vals, E8KV_DTYPE_F32), *dv = to_device(v, vals, E8KV_DTYPE_F32);
    const int32_t pages[7] = {5, 0, 6, 1, 4, 2, 3}, tab_b[5] = {5, 1, 4, 2, 3}; /* B: pages 0, 3 .. 6 of A */
    int64_t slots[112];
    int32_t rows[112], pos[112], shifts[4] = {0, 0, 16, 40}, ctx_b = (int32_t)kept, rid = (int32_t)row;
    for (size_t t = 0; t < n; t++)
        slots[t] = (int64_t)pages[t / bs] * (int64_t)bs + (int64_t)(t % bs), rows[t] = (int32_t)row,
        pos[t] = (int32_t)(t < bs ? t : t + 40);
    int64_t *ds;
    int32_t *dr, *dp, *dta, *dtb, *dsh, *dctx, *drid;
    unsigned *dst;
    CU(cudaMalloc((void **)&ds, sizeof slots));
    CU(cudaMalloc((void **)&dr, sizeof rows));
    CU(cudaMalloc((void **)&dp, sizeof pos));
    CU(cudaMalloc((void **)&dta, sizeof pages));
    CU(cudaMalloc((void **)&dtb, sizeof tab_b));
    CU(cudaMalloc((void **)&dsh, sizeof shifts));
    CU(cudaMalloc((void **)&dctx, 4));
    CU(cudaMalloc((void **)&drid, 4));
    CU(cudaMalloc((void **)&dst, 4));
    CU(cudaMemcpy(ds, slots, sizeof slots, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dr, rows, sizeof rows, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dp, pos, sizeof pos, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dta, pages, sizeof pages, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dtb, tab_b, sizeof tab_b, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dsh, shifts, sizeof shifts, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dctx, &ctx_b, 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(drid, &rid, 4, cudaMemcpyHostToDevice));
    CU(cudaMemset(dst, 0, 4));
    size_t r = e8kv_cuda_set_means_async(c, 0, row, dk, dv, n, E8KV_DTYPE_F32, NULL);
    CHECK(r == 0, "set_means: %s", e8kv_error_name(r));
    r = r ? r : e8kv_cuda_set_row_shifts(c, dsh);
    CHECK(r == 0, "set_row_shifts: %s", e8kv_error_name(r));
    r = e8kv_cuda_append_pos_async(c, 0, ds, dr, NULL, dp, dk, dv, n, E8KV_DTYPE_F32, dst, NULL);
    unsigned st = 1;
    CU(cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost));
    CHECK(r == n && st == 0, "append: %s, status %u", e8kv_error_name(r), st);
    const size_t one_a = n_kv * n * d, one_b = n_kv * kept * d;
    float *ga, *gb, *dq, *dout, *ha = (float *)malloc(2 * one_a * 4), *hb = (float *)malloc(2 * one_b * 4),
                              *hc = (float *)malloc(2 * one_b * 4);
    CU(cudaMalloc((void **)&ga, 2 * one_a * 4));
    CU(cudaMalloc((void **)&gb, 2 * one_b * 4));
    r = e8kv_cuda_gather_async(c, 0, ga, ga + one_a, E8KV_DTYPE_F32, 1, n, dta, 7, drid, NULL);
    CHECK(r == one_a, "gather A: %s", e8kv_error_name(r));
    shifts[3] = 72; /* pages 1 and 2 dropped: 32 more tokens */
    CU(cudaMemcpy(dsh, shifts, sizeof shifts, cudaMemcpyHostToDevice));
    r = e8kv_cuda_gather_async(c, 0, gb, gb + one_b, E8KV_DTYPE_F32, 1, kept, dtb, 5, drid, NULL);
    CHECK(r == one_b, "gather B: %s", e8kv_error_name(r));
    CU(cudaMemcpy(ha, ga, 2 * one_a * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hb, gb, 2 * one_b * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t s = 0; s < 2; s++) /* (stream, head, token, d) */
        for (size_t h = 0; h < n_kv; h++)
            for (size_t t = 0; t < kept; t++)
                bad += memcmp(hb + s * one_b + (h * kept + t) * d,
                              ha + s * one_a + (h * n + (t < bs ? t : t + 2 * bs)) * d, d * 4) != 0;
    CHECK(bad == 0, "%s d=%zu: %zu kept vectors gathered unlike the whole row's", spec, d, bad);
    /* the attention over B against float64 over its gathered values */
    float q[8 * 128], out[8 * 128];
    for (size_t i = 0; i < n_head * d; i++)
        q[i] = gauss();
    CU(cudaMalloc((void **)&dq, sizeof q));
    CU(cudaMalloc((void **)&dout, sizeof out));
    CU(cudaMemcpy(dq, q, n_head * d * 4, cudaMemcpyHostToDevice));
    CU(cudaMemset(dout, 0xff, sizeof out));
    r = e8kv_cuda_attend_rows(c, 0, dout, dq, E8KV_DTYPE_F32, 1, n_head, dtb, 5, dctx, kept, drid, NULL, 0, NULL);
    CHECK(r == n_head * d, "attend B: %s", e8kv_error_name(r));
    CU(cudaMemcpy(out, dout, n_head * d * 4, cudaMemcpyDeviceToHost));
    double worst = 0.0, scale = 0.0;
    for (size_t hq = 0; hq < n_head; hq++) {
        const size_t h = hq / G;
        double sc[80], m = -1e300, l = 0.0, o[128] = {0};
        for (size_t t = 0; t < kept; t++) {
            double s = 0.0;
            for (size_t i = 0; i < d; i++)
                s += (double)q[hq * d + i] * hb[(h * kept + t) * d + i];
            sc[t] = s / sqrt((double)d);
            m = sc[t] > m ? sc[t] : m;
        }
        for (size_t t = 0; t < kept; t++) {
            const double w = exp(sc[t] - m);
            l += w;
            for (size_t i = 0; i < d; i++)
                o[i] += w * hb[one_b + (h * kept + t) * d + i];
        }
        for (size_t i = 0; i < d; i++) {
            const double ref = o[i] / l, e = fabs(ref - out[hq * d + i]);
            worst = e > worst ? e : worst;
            scale = fabs(ref) > scale ? fabs(ref) : scale;
        }
    }
    CHECK(worst <= 1e-3 * scale, "%s d=%zu: attention with row shifts %.3g from float64 (scale %.3g)", spec, d,
          worst, scale);
    /* the control: the shift of before the drop, the kept keys' centre turned to other positions */
    shifts[3] = 40;
    CU(cudaMemcpy(dsh, shifts, sizeof shifts, cudaMemcpyHostToDevice));
    r = e8kv_cuda_gather_async(c, 0, gb, gb + one_b, E8KV_DTYPE_F32, 1, kept, dtb, 5, drid, NULL);
    CU(cudaMemcpy(hc, gb, one_b * 4, cudaMemcpyDeviceToHost));
    CHECK(r == one_b && memcmp(hc, hb, one_b * 4) != 0,
          "%s d=%zu: the keys gathered with the wrong shift are the same", spec, d);
    printf("  row shifts %s d=%zu: kept vectors %s, attention %.2e of float64\n", spec, d,
           bad ? "DIFFER" : "bit-exact", worst / (scale > 0 ? scale : 1));
    e8kv_cuda_cache_free(c);
    /* rope_positions below max_ctx: the table still covers every index of a sequence, so the row at
     * positions 0 .. 111 (means, codes, gather) is that of a cache with the default table */
    for (size_t t = 0; t < n; t++)
        pos[t] = (int32_t)t;
    CU(cudaMemcpy(dp, pos, sizeof pos, cudaMemcpyHostToDevice));
    for (int j = 0; j < 2; j++) {
        p.rope_positions = j ? 16 : 0;
        c = e8kv_cuda_cache_create(&p, &err);
        CU(cudaMemset(dst, 0, 4));
        r = c ? e8kv_cuda_set_means_async(c, 0, row, dk, dv, n, E8KV_DTYPE_F32, NULL) : err;
        r = r ? r : e8kv_cuda_append_pos_async(c, 0, ds, dr, NULL, dp, dk, dv, n, E8KV_DTYPE_F32, dst, NULL);
        r = r == n ? e8kv_cuda_gather_async(c, 0, ga, ga + one_a, E8KV_DTYPE_F32, 1, n, dta, 7, drid, NULL) : r;
        CU(cudaMemcpy(j ? hb : ha, ga, one_a * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost));
        CHECK(r == one_a && st == 0, "%s: rope_positions %zu: %s, status %u", spec, p.rope_positions,
              e8kv_error_name(r), st);
        e8kv_cuda_cache_free(c);
    }
    CHECK(!memcmp(ha, hb, one_a * 4), "%s d=%zu: rope_positions 16 (below max_ctx) codes other keys", spec, d);
    c = NULL;
    free(k), free(v), free(ha), free(hb), free(hc);
    void *const fr[] = {dk, dv, ds, dr, dp, dta, dtb, dsh, dctx, drid, dst, ga, gb, dq, dout};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        CU(cudaFree(fr[i]));
    e8kv_cuda_cache_free(c);
    /* a cache without center=rope has no shifts */
    p.spec = "e8box:4", p.rope_positions = 0;
    c = e8kv_cuda_cache_create(&p, &err);
    r = c ? e8kv_cuda_set_row_shifts(c, NULL) : err;
    CHECK(e8kv_get_error_code(r) == E8KV_ERROR_SPEC, "set_row_shifts without center=rope: %s", e8kv_error_name(r));
    e8kv_cuda_cache_free(c);
}

/* ---------------------------------------------------------------- 5: graph-safe decode step */

/* how the first replayed step that differed from eager looked */
static const char *step_how[] = {"", "output untouched", "the previous step's output", "other values"};

/* Two caches of one spec and seed, two sequences with caller-owned pages. Cache A is written by the
 * synchronous e8kv_cuda_append_slots and read by eager attends; cache B by e8kv_cuda_append_slots_async,
 * and its decode step (append one token per sequence, then attend) is captured once in a CUDA graph with a
 * fixed max_ctx and replayed for every step with new rows, slots and context lengths copied into the same
 * device buffers. Every page byte and every output must be identical; a NaN sets the status word. */
static void test_graph(const char *spec, size_t d) {
    const size_t bs = 16, n_kv = 2, G = 4, n_head = n_kv * G, n_seq = 2, W = 8, max_ctx = W * bs, steps = 24;
    const size_t len0[2] = {40, 17};
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 2, p.n_head_kv = n_kv, p.head_dim = d, p.block_size = bs, p.n_blocks = n_seq * W, p.spec = spec;
    p.seed = rnd(), p.max_batch = n_seq, p.max_ctx = max_ctx;
    size_t err = 0;
    e8kv_cuda_cache *ca = e8kv_cuda_cache_create(&p, &err), *cb = e8kv_cuda_cache_create(&p, &err);
    CHECK(ca && cb, "create: %s", e8kv_error_name(err));
    if (!ca || !cb) return;
    const size_t row = n_kv * d, n_rows = 64;
    float *k = (float *)malloc(n_rows * row * 4), *v = (float *)malloc(n_rows * row * 4), q[8 * 256];
    int32_t table[2][8], ctx[2];
    for (size_t s = 0; s < n_seq; s++)
        for (size_t i = 0; i < W; i++)
            table[s][i] = (int32_t)((n_seq - 1 - s) * W + i); /* sequence 0 on the upper pages */
    int64_t slots[64];
    int32_t *dt, *dctx;
    int64_t *dslots;
    unsigned *dstatus, status = 0;
    float *dq, *douta, *doutb, oa[2 * 8 * 256], ob[2 * 8 * 256];
    void *dk, *dv;
    CU(cudaMalloc((void **)&dt, sizeof table));
    CU(cudaMemcpy(dt, table, sizeof table, cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&dctx, sizeof ctx));
    CU(cudaMalloc((void **)&dslots, sizeof slots));
    CU(cudaMalloc((void **)&dstatus, sizeof status));
    CU(cudaMemset(dstatus, 0, sizeof status));
    CU(cudaMalloc((void **)&dq, sizeof q));
    CU(cudaMalloc((void **)&douta, sizeof oa));
    CU(cudaMalloc((void **)&doutb, sizeof ob));
    CU(cudaMalloc(&dk, n_rows * row * 4));
    CU(cudaMalloc(&dv, n_rows * row * 4));
    /* prefill: each sequence's first tokens, both layers */
    const int prefill_nosync =
        getenv("E8KV_GRAPH_PREFILL") && !strcmp(getenv("E8KV_GRAPH_PREFILL"), "nosync");
    for (size_t s = 0; s < n_seq; s++) {
        fill_rows(k, len0[s] * n_kv, d);
        fill_rows(v, len0[s] * n_kv, d);
        for (size_t t = 0; t < len0[s]; t++)
            slots[t] = (int64_t)table[s][t / bs] * (int64_t)bs + (int64_t)(t % bs);
        CU(cudaMemcpy(dk, k, len0[s] * row * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dv, v, len0[s] * row * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dslots, slots, len0[s] * 8, cudaMemcpyHostToDevice));
        for (size_t l = 0; l < 2; l++) {
            const size_t ra = e8kv_cuda_append_slots(ca, l, dslots, dk, dv, len0[s], E8KV_DTYPE_F32);
            const size_t rb =
                e8kv_cuda_append_slots_async(cb, l, dslots, dk, dv, len0[s], E8KV_DTYPE_F32, dstatus, NULL);
            CHECK(ra == len0[s] && rb == len0[s], "%s: prefill appends: %s / %s", spec, e8kv_error_name(ra),
                  e8kv_error_name(rb));
        }
        /* cache B's last append (queued on the legacy stream) may still be reading dk / dv: wait for it
         * before the next sequence's rows overwrite them. Without the wait the test leaned on the stream
         * order of the cudaMemcpy that follows; under compute-sanitizer 2025.3.1's racecheck (H100) that
         * order did not hold: 10-12 graph-step checks failed with 0 hazards, and pass with the wait.
         * E8KV_GRAPH_PREFILL=nosync leaves the wait out (the reproduction). */
        if (!prefill_nosync) CU(cudaDeviceSynchronize());
    }
    /* the decode step of layer 1 on cache B, captured once */
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    size_t r1 = e8kv_cuda_append_slots_async(cb, 1, dslots, dk, dv, n_seq, E8KV_DTYPE_BF16, dstatus, st);
    size_t r2 = e8kv_cuda_attend(cb, 1, doutb, dq, E8KV_DTYPE_BF16, n_seq, n_head, dt, W, dctx, max_ctx, NULL, 0,
                                 st);
    CU(cudaStreamEndCapture(st, &graph));
    CHECK(r1 == n_seq && !e8kv_is_error(r2), "%s: capture: %s / %s", spec, e8kv_error_name(r1),
          e8kv_error_name(r2));
    CU(cudaGraphInstantiate(&exec, graph, 0));
    int same_out = 1, finite = 1, bad_steps = 0, first_bad = -1, first_how = 0;
    static float oprev[2 * 8 * 256];
    for (size_t step = 0; step < steps; step++) {
        fill_rows(k, n_seq * n_kv, d);
        fill_rows(v, n_seq * n_kv, d);
        for (size_t i = 0; i < n_seq * n_head * d; i++)
            q[i] = gauss();
        for (size_t s = 0; s < n_seq; s++) {
            const size_t pos = len0[s] + step;
            slots[s] = (int64_t)table[s][pos / bs] * (int64_t)bs + (int64_t)(pos % bs);
            ctx[s] = (int32_t)(pos + 1);
        }
        /* the bf16 inputs both caches read */
        uint16_t kb[2 * 2 * 256], vb[2 * 2 * 256], qb[2 * 8 * 256];
        for (size_t i = 0; i < n_seq * row; i++)
            kb[i] = bf16_rne(k[i]), vb[i] = bf16_rne(v[i]);
        for (size_t i = 0; i < n_seq * n_head * d; i++)
            qb[i] = bf16_rne(q[i]);
        CU(cudaMemcpyAsync(dk, kb, n_seq * row * 2, cudaMemcpyHostToDevice, st));
        CU(cudaMemcpyAsync(dv, vb, n_seq * row * 2, cudaMemcpyHostToDevice, st));
        CU(cudaMemcpyAsync(dq, qb, n_seq * n_head * d * 2, cudaMemcpyHostToDevice, st));
        CU(cudaMemcpyAsync(dslots, slots, n_seq * 8, cudaMemcpyHostToDevice, st));
        CU(cudaMemcpyAsync(dctx, ctx, sizeof ctx, cudaMemcpyHostToDevice, st));
        CU(cudaMemsetAsync(doutb, 0xff, sizeof ob, st));
        CU(cudaGraphLaunch(exec, st));
        CU(cudaStreamSynchronize(st));
        const size_t ra = e8kv_cuda_append_slots(ca, 1, dslots, dk, dv, n_seq, E8KV_DTYPE_BF16);
        CU(cudaMemset(douta, 0xff, sizeof oa));
        const size_t rb = e8kv_cuda_attend(ca, 1, douta, dq, E8KV_DTYPE_BF16, n_seq, n_head, dt, W, dctx, max_ctx,
                                           NULL, 0, NULL);
        CHECK(ra == n_seq && !e8kv_is_error(rb), "%s: eager step: %s / %s", spec, e8kv_error_name(ra),
              e8kv_error_name(rb));
        CU(cudaMemcpy(oa, douta, n_seq * n_head * d * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(ob, doutb, n_seq * n_head * d * 4, cudaMemcpyDeviceToHost));
        const int same = !memcmp(oa, ob, n_seq * n_head * d * 4);
        if (!same) { /* how (step_how): the poison untouched, the previous step's eager output, other values
                      */
            uint32_t w0;
            memcpy(&w0, ob, 4);
            bad_steps++;
            if (first_bad < 0) {
                first_bad = (int)step;
                first_how = w0 == 0xffffffffu                                    ? 1
                            : step && !memcmp(oprev, ob, n_seq * n_head * d * 4) ? 2
                                                                                 : 3;
            }
        }
        memcpy(oprev, oa, n_seq * n_head * d * 4);
        same_out &= same;
        for (size_t i = 0; i < n_seq * n_head * d; i++)
            finite &= isfinite(ob[i]);
    }
    CHECK(same_out && finite,
          "%s: the replayed graph's outputs differ from eager ones (or are not finite): %d of %zu steps, the "
          "first at "
          "step %d: %s",
          spec, bad_steps, steps, first_bad, step_how[first_how]);
    /* every page byte of both layers identical */
    int same_pages = 1;
    for (size_t l = 0; l < 2; l++)
        for (int s = 0; s < 2; s++) {
            void *pa, *pb;
            const size_t pgb = e8kv_cuda_cache_pages(ca, l, s, &pa);
            e8kv_cuda_cache_pages(cb, l, s, &pb);
            const size_t n = pgb * n_seq * W;
            uint8_t *ha = (uint8_t *)malloc(n), *hb = (uint8_t *)malloc(n);
            CU(cudaMemcpy(ha, pa, n, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(hb, pb, n, cudaMemcpyDeviceToHost));
            same_pages &= !memcmp(ha, hb, n);
            free(ha), free(hb);
        }
    CHECK(same_pages, "%s: async appends wrote other bytes than synchronous ones", spec);
    CU(cudaMemcpy(&status, dstatus, sizeof status, cudaMemcpyDeviceToHost));
    CHECK(status == 0 && e8kv_cuda_status_error(status) == 0, "%s: status %u after finite rows", spec, status);
    /* a NaN row: the status word says so (the call itself succeeds), the synchronous call names it */
    k[3] = NAN;
    CU(cudaMemcpy(dk, k, n_seq * row * 4, cudaMemcpyHostToDevice));
    for (size_t s = 0; s < n_seq; s++)
        slots[s] = (int64_t)table[s][W - 1] * (int64_t)bs + (int64_t)(bs - 1);
    CU(cudaMemcpy(dslots, slots, n_seq * 8, cudaMemcpyHostToDevice));
    const size_t rn = e8kv_cuda_append_slots_async(cb, 0, dslots, dk, dv, n_seq, E8KV_DTYPE_F32, dstatus, NULL);
    CU(cudaMemcpy(&status, dstatus, sizeof status, cudaMemcpyDeviceToHost));
    CHECK(rn == n_seq && (status & E8KV_CUDA_STATUS_NONFINITE) &&
              e8kv_get_error_code(e8kv_cuda_status_error(status)) == E8KV_ERROR_NONFINITE,
          "%s: NaN: status %u", spec, status);
    const size_t rs = e8kv_cuda_append_slots(ca, 0, dslots, dk, dv, n_seq, E8KV_DTYPE_F32);
    CHECK(e8kv_get_error_code(rs) == E8KV_ERROR_NONFINITE, "%s: NaN (synchronous): %s", spec, e8kv_error_name(rs));
    CHECK(e8kv_get_error_code(e8kv_cuda_append_slots_async(cb, 0, dslots, dk, dv, n_seq, E8KV_DTYPE_F32, NULL,
                                                          NULL)) == E8KV_ERROR_BAD_ARGUMENT,
          "%s: no status word", spec);
    printf("  graph step %-8s d=%zu: %s\n", spec, d, same_out && same_pages && finite ? "ok" : "FAILED");
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    CU(cudaStreamDestroy(st));
    free(k), free(v);
    CU(cudaFree(dt));
    CU(cudaFree(dctx));
    CU(cudaFree(dslots));
    CU(cudaFree(dstatus));
    CU(cudaFree(dq));
    CU(cudaFree(douta));
    CU(cudaFree(doutb));
    CU(cudaFree(dk));
    CU(cudaFree(dv));
    e8kv_cuda_cache_free(ca);
    e8kv_cuda_cache_free(cb);
}

/* head_dim 256: what it refuses by name (center=rope, more than 4 query heads per KV head, another head_dim),
 * and the sizes it reports (a vector's bytes are its two halves') */
static void test_pair_refusals(void) {
    e8kv_cuda_cache_params p;
    memset(&p, 0, sizeof p);
    p.n_layer = 1, p.n_head_kv = 2, p.head_dim = 256, p.n_blocks = 8, p.spec = "e8box:4,center=rope";
    p.rope_theta = 10000.0f;
    size_t err = 0;
    e8kv_cuda_cache *c = e8kv_cuda_cache_create(&p, &err);
    CHECK(!c && err == E8KV_ERR(SPEC), "head_dim 256 with center=rope: %s",
          c ? "created" : e8kv_error_name(err));
    e8kv_cuda_cache_free(c);
    p.spec = "e8box:4", p.max_n_head = 10; /* 5 per KV head */
    c = e8kv_cuda_cache_create(&p, &err);
    CHECK(!c && err == E8KV_ERR(DIMENSION), "head_dim 256, max_n_head 5 per KV head: %s",
          c ? "created" : e8kv_error_name(err));
    e8kv_cuda_cache_free(c);
    p.max_n_head = 0, p.head_dim = 192;
    c = e8kv_cuda_cache_create(&p, &err);
    CHECK(!c && err == E8KV_ERR(HEAD_DIM), "head_dim 192: %s", c ? "created" : e8kv_error_name(err));
    e8kv_cuda_cache_free(c);
    p.head_dim = 256;
    c = e8kv_cuda_cache_create(&p, &err);
    CHECK(c, "head_dim 256: %s", e8kv_error_name(err));
    if (!c) return;
    CHECK(e8kv_cuda_cache_vector_bytes(c, 0, 0) == 2 * (1 + 2 + 64), "e8box:4 vector of 256: %zu bytes",
          e8kv_cuda_cache_vector_bytes(c, 0, 0));
    CHECK(e8kv_cuda_cache_token_bytes(c) == 2 * 2 * 2 * (1 + 2 + 64), "token bytes %zu",
          e8kv_cuda_cache_token_bytes(c));
    float *dq, *dout;
    int32_t *dt, *dctx;
    CU(cudaMalloc((void **)&dq, 10 * 256 * 4));
    CU(cudaMalloc((void **)&dout, 10 * 256 * 4));
    CU(cudaMalloc((void **)&dt, 4));
    CU(cudaMalloc((void **)&dctx, 4));
    CU(cudaMemset(dt, 0, 4));
    CU(cudaMemset(dctx, 0, 4));
    CHECK(e8kv_cuda_attend(c, 0, dout, dq, E8KV_DTYPE_F32, 1, 10, dt, 1, dctx, 0, NULL, 0, NULL) ==
              E8KV_ERR(DIMENSION),
          "head_dim 256: attend with 5 query heads per KV head");
    CHECK(e8kv_cuda_set_layer_sinks(c, 0, dq, 10) == E8KV_ERR(DIMENSION),
          "head_dim 256: 5 sinks per KV head");
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    CU(cudaFree(dt));
    CU(cudaFree(dctx));
    e8kv_cuda_cache_free(c);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    const int graph_only = argc > 1 && !strcmp(argv[1], "--graph"); /* the graph step alone */
    const int prec_only = argc > 1 && !strcmp(argv[1], "--precision"); /* the tied large scores alone */
    if (!e8kv_cuda_available()) {
        printf("test_cuda: no CUDA device, skipped\n");
        return 77;
    }
    g_rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)clock();
    if (getenv("E8KV_TEST_SEED")) g_rng = strtoull(getenv("E8KV_TEST_SEED"), NULL, 0);
    if (!g_rng) g_rng = 1;
    printf("test_cuda: seed 0x%llx\n", (unsigned long long)g_rng);
    if (prec_only) {
        for (size_t d = 64; d <= 128; d += 64) {
            for (size_t G = 4; G <= 8; G += 4) {
                test_score_precision("bf16", E8KV_DTYPE_BF16, d, G);
                test_score_precision("f16", E8KV_DTYPE_F16, d, G);
            }
        }
        printf("test_cuda: %d checks, %d failed\n", g_checks, g_fail);
        return g_fail ? 1 : 0;
    }
    const spec_case cases[] = {{"e8box:4", "e8box:4", "e8box:4", 0},
                               {"bf16", "bf16", "bf16", 0},
                               {"f16", "f16", "f16", 0},
                               {"k=e8box:4,v=bf16", "e8box:4", "bf16", 0},
                               {"e8p:2", "e8p:2", "e8p:2", 0},
                               {"e8box:4,sink=1", "e8box:4", "e8box:4", 1},
                               {"e8p:2,sink=4", "e8p:2", "e8p:2", 4},
                               {"k=e8box:4,v=bf16,sink=40", "e8box:4", "bf16", 40},
                               {"f16,sink=64", "f16", "f16", 64},
                               {"e8box:4,center=0", "e8box:4", "e8box:4", 0},
                               {"e8p:2,sink=2,center=0", "e8p:2", "e8p:2", 2},
                               /* e8box:3 (11..): with itself, raw pages and e8box:4 on either side */
                               {"e8box:3", "e8box:3", "e8box:3", 0},
                               {"k=e8box:3,v=bf16", "e8box:3", "bf16", 0},
                               {"k=e8box:4,v=e8box:3,sink=4", "e8box:4", "e8box:3", 4},
                               {"k=e8box:3,v=e8box:4", "e8box:3", "e8box:4", 0},
                               {"k=f16,v=e8box:3,sink=1", "f16", "e8box:3", 1},
                               {"e8box:3,sink=2,center=0", "e8box:3", "e8box:3", 2},
                               /* center=rope (17..) */
                               {"e8box:4,sink=4,center=rope", "e8box:4", "e8box:4", 4},
                               {"e8box:3,center=rope", "e8box:3", "e8box:3", 0},
                               {"k=e8box:4,v=e8box:3,center=rope", "e8box:4", "e8box:3", 0},
                               {"e8p:2,sink=4,center=rope", "e8p:2", "e8p:2", 4},
                               {"e8p:2,center=rope", "e8p:2", "e8p:2", 0}};
    const size_t lens_full[] = {1, 15, 16, 17, 100, 777, 3000, 9001};
    const size_t lens_quick[] = {1, 17, 40, 130, 600}; /* 600: more than one split (SPLIT_MIN) */
    const size_t *lens = quick ? lens_quick : lens_full;
    const size_t n_seq = quick ? 5 : 8;
    const size_t ds[] = {64, 128}, Gs[] = {1, 3, 4, 8};
    const e8kv_dtype dts[] = {E8KV_DTYPE_F32, E8KV_DTYPE_BF16, E8KV_DTYPE_F16};
    for (size_t ci = 0; ci < 5 && !graph_only; ci++)
        for (size_t di = 0; di < 2; di++) {
            if (quick && ci == 2) continue;
            const size_t G = Gs[(ci + di) % 4], n_kv = 1 + (size_t)(rnd() % 3);
            run_case(&cases[ci], ds[di], n_kv, G, lens, n_seq, dts[(ci + di) % 3], quick ? 1 : 2, 16);
        }
    if (!quick && !graph_only) { /* every G with e8box at both head dims; pages of 32 and 48 tokens (a tile
                                  * starts inside a page; 48: the page index by division) */
        for (size_t gi = 0; gi < 4; gi++)
            run_case(&cases[0], ds[gi % 2], 2, Gs[gi], lens, 6, dts[gi % 3], 1, 16);
        run_case(&cases[0], 128, 2, 4, lens, 6, E8KV_DTYPE_BF16, 1, 32);
        run_case(&cases[0], 64, 3, 3, lens, 6, E8KV_DTYPE_F16, 1, 48);
        run_case(&cases[0], 128, 1, 8, lens, 6, E8KV_DTYPE_F32, 1, 48);
        run_case(&cases[1], 128, 2, 4, lens, 6, E8KV_DTYPE_BF16, 1, 48);
        /* e8p:2: every G at both head dims, pages of 32 and 48 */
        for (size_t gi = 0; gi < 4; gi++)
            run_case(&cases[4], ds[(gi + 1) % 2], 2, Gs[gi], lens, 6, dts[(gi + 1) % 3], 1, 16);
        run_case(&cases[4], 128, 2, 4, lens, 6, E8KV_DTYPE_BF16, 1, 32);
        run_case(&cases[4], 64, 3, 3, lens, 6, E8KV_DTYPE_F16, 1, 48);
        /* e8box:3: every G at both head dims, pages of 32 and 48 */
        for (size_t gi = 0; gi < 4; gi++)
            run_case(&cases[11], ds[gi % 2], 2, Gs[gi], lens, 6, dts[(gi + 2) % 3], 1, 16);
        run_case(&cases[11], 128, 2, 4, lens, 6, E8KV_DTYPE_BF16, 1, 32);
        run_case(&cases[11], 64, 3, 3, lens, 6, E8KV_DTYPE_F16, 1, 48);
        /* e8box:4 with e8box:3 (both orders, the pipelined kernel's mixed stages): every G at both head
         * dims, pages of 32 and 48 */
        for (size_t gi = 0; gi < 4; gi++) {
            run_case(&cases[13], ds[gi % 2], 2, Gs[gi], lens, 6, dts[gi % 3], 1, 16);
            run_case(&cases[14], ds[(gi + 1) % 2], 2, Gs[gi], lens, 6, dts[(gi + 1) % 3], 1, 16);
        }
        run_case(&cases[13], 128, 2, 4, lens, 6, E8KV_DTYPE_BF16, 1, 32);
        run_case(&cases[14], 64, 3, 3, lens, 6, E8KV_DTYPE_F16, 1, 48);
    }
    for (size_t ci = 11; ci < 17 && !graph_only; ci++)
        for (size_t di = 0; di < 2; di++) {
            if (quick && (ci + di) % 2) continue;
            const size_t n_kv = 1 + (size_t)(rnd() % 3);
            run_case(&cases[ci], ds[di], n_kv, Gs[(ci + di) % 4], lens, n_seq, dts[(ci + di) % 3], 1, 16);
        }
    /* center=rope: every G at both head dims (quick: one each), pages of 16, 32 and 48 */
    for (size_t ci = 17; ci < 22 && !graph_only; ci++)
        for (size_t gi = 0; gi < (quick ? 1u : 4u); gi++) {
            /* (e8p:2: G = 4, its own score layout, at head_dim 128 in both cases) */
            const size_t di = ci >= 20 ? (gi + 21 - ci) % 2 : (ci + gi) % 2, bs = gi == 1 ? 32 : gi == 2 ? 48 : 16;
            /* e8box:3 and e8p:2 without sinks (and every fourth case): the model's frequencies */
            g_rope_freqs = ci == 18 || ci == 21 || gi == 3;
            run_case(&cases[ci], ds[di], 1 + (size_t)(rnd() % 3), Gs[(ci + gi) % 4], lens, n_seq,
                     dts[(ci + gi) % 3], 1, bs);
            g_rope_freqs = 0;
        }
    /* sink=N: every kernel, N past a tile, a split and a whole sequence (lens 1, 15, 16, 17) */
    for (size_t ci = 5; ci < 11 && !graph_only; ci++)
        for (size_t di = 0; di < 2; di++) {
            if (quick && (ci + di) % 2) continue;
            run_case(&cases[ci], ds[di], 2, Gs[(ci + di) % 4], lens, n_seq, dts[(ci + di) % 3], 1, 16);
        }
    for (size_t di = 0; di < 2; di++) {
        if (!graph_only) {
            test_sink_slots("e8box:4,sink=4", ds[di], 4);
            test_sink_slots(di ? "e8p:2,sink=1" : "bf16,sink=20", ds[di], di ? 1 : 20);
            test_fork_and_errors("e8box:4,sink=2", ds[di]);
            test_isolation("e8box:4", ds[di]);
            test_isolation("bf16", ds[di]);
            test_workspace_reuse(di ? "e8box:4,center=0" : "bf16", ds[di]);
            test_workspace_reuse(di ? "e8p:2,center=0" : "e8box:3,center=0", ds[di]);
            test_gather_many(ds[di]);
            for (size_t G = 4; G <= 8; G += 4) {
                test_score_precision("bf16", E8KV_DTYPE_BF16, ds[di], G);
                test_score_precision("f16", E8KV_DTYPE_F16, ds[di], G);
            }
            test_fork_and_errors("e8box:4", ds[di]);
            test_isolation("e8p:2", ds[di]);
            test_fork_and_errors("e8p:2", ds[di]);
            test_sink_slots("e8box:3,sink=3", ds[di], 3);
            test_isolation("e8box:3", ds[di]);
            test_fork_and_errors("e8box:3", ds[di]);
            test_cache_copy(di ? "e8box:4,sink=4,center=rope" : "e8p:2,sink=2", ds[di]);
            test_cache_copy(di ? "k=e8box:4,v=e8box:3" : "bf16,sink=3", ds[di]);
        }
        test_graph("e8box:4", ds[di]);
        test_graph("e8p:2", ds[di]);
        test_graph("k=e8box:4,v=bf16", ds[di]);
        test_graph("e8box:3", ds[di]);
        test_layers(ds[di]);
        test_row_shifts(di ? "e8box:4,sink=2,center=rope" : "e8p:2,center=rope", ds[di]);
        test_row_shifts(di ? "e8p:2,sink=2,center=rope" : "e8box:3,center=rope", ds[di]);
    }
    /* head_dim 256 (each vector two halves of 128, attn_pair_kernel): every format pair but center=rope's
     * (refused there), G = 1..4, pages of 16, 32 and 48 */
    for (size_t ci = 0; ci < 17 && !graph_only; ci++) {
        if (quick && ci % 3) continue;
        const size_t G = 1 + ci % 4, bs = ci % 5 == 3 ? 32 : ci % 5 == 4 ? 48 : 16;
        run_case(&cases[ci], 256, 1 + (size_t)(rnd() % 3), G, lens, n_seq, dts[ci % 3], 1, bs);
    }
    /* e8p:2 at head_dim 256 with 4 and 2 query heads per KV head (its score product takes every G ≤ 4 in
     * the columns of 4 heads; the loop above gives it G = 1 and 3) */
    for (size_t G = 2; G <= 4 && !graph_only; G += 2)
        run_case(&cases[G == 4 ? 4 : 6], 256, 1 + (size_t)(rnd() % 3), G, lens, n_seq, dts[G / 2], 1, 16);
    if (!graph_only) {
        test_isolation("e8box:4", 256);
        test_isolation("bf16", 256);
        test_pair_refusals();
    }
    test_graph("e8box:4", 256);
    test_graph("e8p:2", 256);
    printf("test_cuda: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
