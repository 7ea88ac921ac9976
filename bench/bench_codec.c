/* `e8kv bench codec`: rate–distortion and single-core speed of every codec, at matched bits per value.
 *
 * Fixed-rate rows go through the public API (e8kv_codec_encode / e8kv_codec_decode, rotation included)
 * and count every byte (e8kv_codec_bits_per_value). Entropy-coded rows ("<lattice>-ecq(H):R") have no
 * coder yet: they quantize the rotated data with one global step chosen so that the parity-aware
 * empirical entropy (src/quant/eclq.h) hits R, and report that ideal rate; the step is one float for the
 * whole data set, negligible side information. Definitions are printed by --help and in BENCHMARKS.md. */
#include "bench.h"
#include "cli_util.h"
#include "kvdump.h"

#include "common/common.h"
#include "common/rng.h"
#include "eclq.h"
#include "transform/fwht.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_QUERY 16
#define MAX_ROWS 128

static const char *const k_default_fixed[] = {
    "f16",      "q8_0",     "q8_0h",    "q4_0",     "q4_0h",    "lloyd:2",  "lloyd:3",
    "lloyd:4",  "e8:2",     "e8:3",     "e8:4",     "e8ball:2", "e8ball:3", "e8ball:4",
    "e8nest:2", "e8nest:3", "e8nest:4", "d4nest:2", "d4nest:3", "d4nest:4",
};
static const char *const k_default_ecq[] = {
    "e8-ecq:2", "e8-ecq:3", "e8-ecq:4", "d8star-ecq:2", "d8star-ecq:3", "d8star-ecq:4",
    "d4-ecq:2", "d4-ecq:3", "d4-ecq:4", "z-ecq:2",      "z-ecq:3",      "z-ecq:4",
};
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: e8kv bench codec [--data gauss|FILE] [--n-vec N] [--head-dim D] [--seed S]\n"
        "                        [--codecs LIST] [--reps N] [--json]\n\n"
        "One row per (quantizer, rate), all at bits per value with every byte counted.\n\n"
        "  --data gauss   i.i.d. N(0,1) vectors from --seed (default)\n"
        "  --data FILE    real K/V vectors from a dump (doc/format.md section 1)\n"
        "  --n-vec N      vectors (default 65536 for gauss; all of FILE, or its first N)\n"
        "  --head-dim D   head dimension for gauss (default 64); must match FILE when given\n"
        "  --seed S       data seed and rotation seed of every codec (default 1)\n"
        "  --codecs LIST  comma-separated codec specs (f16, q8_0, lloyd:3, e8:4, ...), entropy-coded\n"
        "                 rows LAT-ecq:R with LAT in e8, d8star, d4, z and R the target bits/value, or\n"
        "                 the groups 'fixed', 'ecq', 'all' (default: all)\n"
        "  --reps N       timing repetitions; the fastest is reported (default 5)\n"
        "  --json         one JSON object per row instead of the table\n\n"
        "Columns:\n"
        "  bits/val   fixed rate: 8 * vector_bytes / head_dim (side information included);\n"
        "             LAT-ecq(H): parity-aware empirical entropy per value (the rate an ideal rANS coder\n"
        "             with per-coordinate tables reaches; no coder runs), one global step as side info\n"
        "  MSE        mean over values of (x - x_hat)^2\n"
        "  MSE/D(R)   MSE / (sigma^2 * 2^(-2R)), sigma^2 = mean over coordinates of the empirical\n"
        "             per-coordinate variance, R = bits/val (1.0 = Shannon bound of a Gaussian source)\n"
        "  SNR dB     10 log10(mean(x^2) / MSE)\n"
        "  ip_rel     relative error of q.k over %d random unit queries q (seeded) and every vector k:\n"
        "             sqrt(mean((q.(k - k_hat))^2)) / sqrt(mean((q.k)^2))\n"
        "  enc/dec    one thread, public API e8kv_codec_encode / e8kv_codec_decode (rotation included),\n"
        "             best of --reps runs over all vectors (on a shared machine interference only adds\n"
        "             time, so the fastest run is the closest to a quiet one); GB/s of float32\n"
        "             input/output, ns/value\n"
        "d8star-ecq rows are matched to the measured rate of the e8-ecq row of the same R when it ran.\n",
        N_QUERY);
}

typedef struct {
    const char *data; /* "gauss" or a path */
    size_t n_vec, head_dim;
    int n_vec_set, head_dim_set;
    uint64_t seed;
    int reps, json;
    const char *rows[MAX_ROWS];
    size_t n_rows;
} options;

static int add_row(options *o, const char *spec) {
    if (o->n_rows >= MAX_ROWS) return 0;
    o->rows[o->n_rows++] = spec;
    return 1;
}

static int add_list(options *o, char *list) {
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const int all = !strcmp(tok, "all");
        int ok = 1;
        if (all || !strcmp(tok, "fixed"))
            for (size_t i = 0; i < N_ELEMS(k_default_fixed); i++)
                ok &= add_row(o, k_default_fixed[i]);
        if (all || !strcmp(tok, "ecq"))
            for (size_t i = 0; i < N_ELEMS(k_default_ecq); i++)
                ok &= add_row(o, k_default_ecq[i]);
        if (!all && strcmp(tok, "fixed") && strcmp(tok, "ecq")) ok &= add_row(o, tok);
        if (!ok) return 0;
    }
    return 1;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* fastest and median of n timings (sorts v) */
static double best(double *v, int n, double *med) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return v[0];
}

/* ---------------------------------------------------------------- data and metrics */

typedef struct {
    float *x; /* (n_vec, head_dim) */
    size_t n_vec, head_dim;
    double var;                           /* mean over coordinates of the per-coordinate variance */
    double power;                         /* mean(x^2) */
    float q[N_QUERY * E8KV_MAX_HEAD_DIM]; /* unit queries */
    double qk2;                           /* mean over (q, k) of (q.k)^2 */
} dataset;

static void dataset_stats(dataset *d, uint64_t seed) {
    const size_t n = d->n_vec, hd = d->head_dim;
    double var = 0.0, power = 0.0;
    for (size_t j = 0; j < hd; j++) {
        double m = 0.0;
        for (size_t i = 0; i < n; i++)
            m += d->x[i * hd + j];
        m /= (double)n;
        double v = 0.0;
        for (size_t i = 0; i < n; i++) {
            const double e = (double)d->x[i * hd + j] - m;
            v += e * e;
            power += (double)d->x[i * hd + j] * d->x[i * hd + j];
        }
        var += v / (double)n;
    }
    d->var = var / (double)hd;
    d->power = power / ((double)n * (double)hd);
    e8kv_rng rng;
    e8kv_rng_seed(&rng, seed ^ 0x9e3779b97f4a7c15ull); /* queries independent of the data stream */
    for (int k = 0; k < N_QUERY; k++) {
        float *q = d->q + (size_t)k * hd;
        double norm = 0.0;
        for (size_t j = 0; j < hd; j++) {
            q[j] = (float)e8kv_rng_normal(&rng);
            norm += (double)q[j] * q[j];
        }
        const double inv = 1.0 / sqrt(norm);
        for (size_t j = 0; j < hd; j++)
            q[j] = (float)(q[j] * inv);
    }
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < N_QUERY; k++) {
            double dot = 0.0;
            for (size_t j = 0; j < hd; j++)
                dot += (double)d->q[(size_t)k * hd + j] * d->x[i * hd + j];
            s += dot * dot;
        }
    d->qk2 = s / ((double)n * N_QUERY);
}

typedef struct {
    char name[48];
    int entropy; /* 1 for LAT-ecq(H) rows */
    double bits, mse, ratio, snr_db, ip_rel, step;
    double enc_ns, dec_ns; /* per value, fastest run; < 0 when not measured */
    double enc_ns_median, dec_ns_median;
    int reps;
} row_result;

static void quality(row_result *r, const dataset *d, const float *y) {
    const size_t n = d->n_vec, hd = d->head_dim;
    double se = 0.0, ip = 0.0;
    for (size_t i = 0; i < n; i++) {
        float e[E8KV_MAX_HEAD_DIM];
        for (size_t j = 0; j < hd; j++) {
            e[j] = d->x[i * hd + j] - y[i * hd + j];
            se += (double)e[j] * e[j];
        }
        for (int k = 0; k < N_QUERY; k++) {
            double dot = 0.0;
            for (size_t j = 0; j < hd; j++)
                dot += (double)d->q[(size_t)k * hd + j] * e[j];
            ip += dot * dot;
        }
    }
    r->mse = se / ((double)n * (double)hd);
    r->ratio = r->mse / (d->var * exp2(-2.0 * r->bits));
    r->snr_db = 10.0 * log10(d->power / r->mse);
    r->ip_rel = sqrt(ip / ((double)n * N_QUERY)) / sqrt(d->qk2);
}

/* ---------------------------------------------------------------- rows */

static size_t run_fixed(row_result *r, const dataset *d, const char *spec, uint64_t seed, int reps, float *y,
                        void *buf, size_t buf_cap) {
    size_t err = 0;
    e8kv_codec *c = e8kv_codec_create(spec, d->head_dim, seed, &err);
    if (!c) return err;
    snprintf(r->name, sizeof r->name, "%s", spec);
    r->entropy = 0;
    r->step = 0.0;
    r->bits = e8kv_codec_bits_per_value(c);
    const size_t n = d->n_vec, nv = n * d->head_dim, enc_bytes = n * e8kv_codec_vector_bytes(c);
    if (enc_bytes > buf_cap) {
        e8kv_codec_free(c);
        return E8KV_ERR(DST_TOO_SMALL);
    }
    double te[64], td[64];
    int done = 0;
    for (; done < reps; done++) {
        double t0 = e8kv_cli_now_s();
        size_t w = e8kv_codec_encode(c, buf, buf_cap, d->x, n);
        te[done] = e8kv_cli_now_s() - t0;
        if (e8kv_is_error(w)) {
            e8kv_codec_free(c);
            return w;
        }
        t0 = e8kv_cli_now_s();
        w = e8kv_codec_decode(c, y, nv, buf, enc_bytes, n);
        td[done] = e8kv_cli_now_s() - t0;
        if (e8kv_is_error(w)) {
            e8kv_codec_free(c);
            return w;
        }
        if (done >= 2 && te[0] + td[0] > 2.0) { /* slow codec: three runs are enough */
            done++;
            break;
        }
    }
    double med_e, med_d;
    r->enc_ns = 1e9 * best(te, done, &med_e) / (double)nv;
    r->dec_ns = 1e9 * best(td, done, &med_d) / (double)nv;
    r->enc_ns_median = 1e9 * med_e / (double)nv;
    r->dec_ns_median = 1e9 * med_d / (double)nv;
    r->reps = done;
    quality(r, d, y);
    e8kv_codec_free(c);
    return 0;
}

/* "LAT-ecq:R" -> lattice and R; 0 when `spec` is not an entropy-coded row. */
static int parse_ecq(const char *spec, e8kv_eclq_lattice *lat, double *bits) {
    const char *colon = strchr(spec, ':');
    if (!colon) return 0;
    static const e8kv_eclq_lattice lats[4] = {E8KV_ECLQ_E8, E8KV_ECLQ_D8STAR, E8KV_ECLQ_D4, E8KV_ECLQ_Z};
    for (int i = 0; i < 4; i++) {
        char prefix[24];
        snprintf(prefix, sizeof prefix, "%s-ecq:", e8kv_eclq_name(lats[i]));
        if (strncmp(spec, prefix, strlen(prefix)) == 0) {
            char *end = NULL;
            *bits = strtod(colon + 1, &end);
            *lat = lats[i];
            return (end && *end == 0) ? 1 : -1;
        }
    }
    return 0;
}

typedef struct {
    double target, bits; /* measured e8-ecq rates, for matching d8star-ecq */
} e8_rate;

static size_t run_ecq(row_result *r, const dataset *d, const float *x_rot, const e8kv_rot *rot,
                      e8kv_eclq_lattice lat, double target, int32_t *y2, float *y) {
    const size_t nv = d->n_vec * d->head_dim;
    e8kv_eclq_point p = {0.0, 0.0, 0.0};
    const size_t err = e8kv_eclq_step_for_rate(&p, y2, x_rot, nv, lat, d->var, target, 2e-5);
    /* with few vectors the empirical rate jumps across the target: keep the closest point if it is
     * within 0.01 bit (the printed rate shows how close) */
    if (e8kv_is_error(err) && !(e8kv_get_error_code(err) == E8KV_ERROR_RATE && p.step > 0.0 &&
                                fabs(p.bits_per_value - target) <= 0.01))
        return err;
    if (e8kv_is_error(err)) E8KV_RETURN_IF_ERROR(e8kv_eclq_measure(&p, y2, x_rot, nv, p.step, lat));
    r->entropy = 1;
    r->step = p.step;
    r->bits = p.bits_per_value;
    r->enc_ns = r->dec_ns = -1.0;
    for (size_t i = 0; i < nv; i++)
        y[i] = (float)(0.5 * p.step * (double)y2[i]);
    e8kv_rot_inverse(rot, y, d->n_vec); /* errors and q.k measured in the original domain */
    quality(r, d, y);
    return 0;
}

/* ---------------------------------------------------------------- output */

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static void print_header(const options *o, const dataset *d) {
    printf("# e8kv bench codec: data %s, %zu vectors x head_dim %zu (%.1f MB float32), sigma^2 %.6g, "
           "seed %llu, timing best of %d, 1 thread\n",
           o->data, d->n_vec, d->head_dim, 4e-6 * (double)d->n_vec * (double)d->head_dim, d->var,
           (unsigned long long)o->seed, o->reps);
    printf("# ip_rel = sqrt(mean((q.(k-k_hat))^2)) / sqrt(mean((q.k)^2)) over %d random unit queries; "
           "MSE/D(R) = MSE / (sigma^2 2^(-2R)); (H) rows: ideal rate = parity-aware empirical entropy, no "
           "coder\n",
           N_QUERY);
    printf("%-18s %8s %11s %8s %7s %8s %8s %8s %8s %8s\n", "codec", "bits/val", "MSE", "MSE/D(R)", "SNR dB",
           "ip_rel", "enc GB/s", "dec GB/s", "enc ns/v", "dec ns/v");
}

static void print_row(const options *o, const dataset *d, const row_result *r) {
    if (o->json) {
        printf("{\"codec\":");
        json_string(r->name);
        printf(",\"kind\":\"%s\",\"bits_per_value\":%.6f,\"mse\":%.8g,\"mse_over_dr\":%.6f,\"snr_db\":%.4f,"
               "\"ip_rel_err\":%.6g",
               r->entropy ? "entropy_ideal" : "fixed", r->bits, r->mse, r->ratio, r->snr_db, r->ip_rel);
        if (r->enc_ns >= 0.0)
            printf(",\"encode_ns_per_value\":%.4f,\"decode_ns_per_value\":%.4f,\"encode_gb_per_s\":%.4f,"
                   "\"decode_gb_per_s\":%.4f,\"encode_ns_per_value_median\":%.4f,"
                   "\"decode_ns_per_value_median\":%.4f,\"timing_runs\":%d",
                   r->enc_ns, r->dec_ns, 4.0 / r->enc_ns, 4.0 / r->dec_ns, r->enc_ns_median, r->dec_ns_median,
                   r->reps);
        else
            printf(",\"encode_ns_per_value\":null,\"decode_ns_per_value\":null");
        if (r->entropy) printf(",\"step\":%.8g", r->step);
        printf(",\"data\":");
        json_string(o->data);
        printf(",\"n_vec\":%zu,\"head_dim\":%zu,\"seed\":%llu}\n", d->n_vec, d->head_dim,
               (unsigned long long)o->seed);
        return;
    }
    printf("%-18s %8.4f %11.5g %8.4f %7.3f %8.5f", r->name, r->bits, r->mse, r->ratio, r->snr_db, r->ip_rel);
    if (r->enc_ns >= 0.0)
        printf(" %8.3f %8.3f %8.2f %8.2f\n", 4.0 / r->enc_ns, 4.0 / r->dec_ns, r->enc_ns, r->dec_ns);
    else
        printf(" %8s %8s %8s %8s\n", "-", "-", "-", "-");
}

static void print_skip(const options *o, const char *spec, size_t err) {
    if (o->json) {
        printf("{\"codec\":");
        json_string(spec);
        printf(",\"skipped\":true,\"error\":");
        json_string(e8kv_error_name(err));
        printf("}\n");
    } else {
        printf("%-18s skipped: %s\n", spec, e8kv_error_name(err));
    }
}

/* A clear message for each way a dump can be malformed. */
static const char *dump_problem(size_t err) {
    switch (e8kv_get_error_code(err)) {
    case E8KV_ERROR_IO:
        return "cannot open or read the file";
    case E8KV_ERROR_TRUNCATED:
        return "file is shorter than its header announces (truncated)";
    case E8KV_ERROR_CORRUPTED:
        return "not a valid K/V dump (bad magic, reserved field set, or size does not match the header)";
    case E8KV_ERROR_VERSION:
        return "unsupported dump version (this build reads version 1)";
    case E8KV_ERROR_HEAD_DIM:
        return "head_dim is 0 or larger than E8KV_MAX_HEAD_DIM";
    case E8KV_ERROR_NONFINITE:
        return "the vectors contain NaN or Inf";
    case E8KV_ERROR_OUT_OF_MEMORY:
        return "out of memory";
    default:
        return "cannot load";
    }
}

/* ---------------------------------------------------------------- main */

static int load_data(dataset *d, const options *o) {
    if (!strcmp(o->data, "gauss")) {
        d->n_vec = o->n_vec_set ? o->n_vec : 65536;
        d->head_dim = o->head_dim_set ? o->head_dim : 64;
        if (d->n_vec == 0 || d->head_dim == 0 || d->head_dim > E8KV_MAX_HEAD_DIM ||
            d->n_vec > SIZE_MAX / sizeof(float) / d->head_dim / 4) {
            fprintf(stderr, "e8kv bench codec: --n-vec and --head-dim must be in 1..huge and 1..%d\n",
                    E8KV_MAX_HEAD_DIM);
            return 0;
        }
        d->x = malloc(d->n_vec * d->head_dim * sizeof(float));
        if (!d->x) return 0;
        e8kv_rng rng;
        e8kv_rng_seed(&rng, o->seed);
        for (size_t i = 0; i < d->n_vec * d->head_dim; i++)
            d->x[i] = (float)e8kv_rng_normal(&rng);
        return 1;
    }
    e8kv_kvdump dump;
    const size_t r = e8kv_kvdump_read(&dump, o->data);
    if (e8kv_is_error(r)) {
        fprintf(stderr, "e8kv bench codec: %s: %s (%s)\n", o->data, dump_problem(r), e8kv_error_name(r));
        return 0;
    }
    if (dump.n_vec == 0) {
        fprintf(stderr, "e8kv bench codec: %s: the dump holds no vectors\n", o->data);
        e8kv_kvdump_free(&dump);
        return 0;
    }
    if (o->head_dim_set && o->head_dim != dump.head_dim) {
        fprintf(stderr, "e8kv bench codec: %s has head_dim %zu, not %zu\n", o->data, dump.head_dim,
                o->head_dim);
        e8kv_kvdump_free(&dump);
        return 0;
    }
    d->x = dump.data;
    d->head_dim = dump.head_dim;
    d->n_vec = (o->n_vec_set && o->n_vec > 0 && o->n_vec < dump.n_vec) ? o->n_vec : dump.n_vec;
    return 1;
}

int e8kv_bench_codec(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.data = "gauss";
    o.seed = 1;
    o.reps = 5;
    const char *list = NULL;
    int reps = 5;
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_FLAG("--json", &o.json),
        E8KV_OPT_STR("--data", &o.data),
        E8KV_OPT_SIZE("--n-vec", &o.n_vec, 1, SIZE_MAX),
        E8KV_OPT_SIZE("--head-dim", &o.head_dim, 1, 65536),
        E8KV_OPT_U64("--seed", &o.seed),
        E8KV_OPT_INT("--reps", &reps, 1, 64),
        E8KV_OPT_STR("--codecs", &list),
    };
    const int pr = e8kv_cli_parse("e8kv bench codec", usage, argc, argv, opts, sizeof opts / sizeof opts[0],
                                  NULL, 0, NULL);
    if (pr >= 0) return pr;
    o.reps = reps;
    o.n_vec_set = o.n_vec != 0;
    o.head_dim_set = o.head_dim != 0;
    char list_buf[4096]; /* MAX_ROWS specs of up to 63 characters fit; a longer list is refused, not cut */
    if (list && strlen(list) >= sizeof list_buf)
        return e8kv_cli_usage_error("e8kv bench codec", "--codecs: a list of %zu characters (at most %zu)",
                                    strlen(list), sizeof list_buf - 1);
    snprintf(list_buf, sizeof list_buf, "%s", list ? list : "all");
    if (!add_list(&o, list_buf) || o.n_rows == 0) {
        fprintf(stderr, "e8kv bench codec: --codecs: empty or more than %d rows\n", MAX_ROWS);
        return 2;
    }
    for (size_t i = 0; i < o.n_rows; i++) {
        e8kv_eclq_lattice lat;
        double bits;
        if (parse_ecq(o.rows[i], &lat, &bits) < 0) {
            fprintf(stderr, "e8kv bench codec: bad entropy-coded row '%s' (want LAT-ecq:R)\n", o.rows[i]);
            return 2;
        }
    }

    dataset *d = calloc(1, sizeof *d);
    if (!d) return 1;
    if (!load_data(d, &o)) {
        free(d);
        return 1;
    }
    dataset_stats(d, o.seed);
    const size_t nv = d->n_vec * d->head_dim;
    const size_t buf_cap = nv * sizeof(float) + 64; /* no codec is larger than f32 */
    float *y = malloc(nv * sizeof(float));
    void *buf = malloc(buf_cap);
    float *x_rot = NULL;
    int32_t *y2 = NULL;
    e8kv_rot rot;
    size_t rot_err = 0;
    int status = 0;
    if (!y || !buf) {
        fprintf(stderr, "e8kv bench codec: out of memory\n");
        status = 1;
        goto done;
    }
    if (!o.json) print_header(&o, d);
    e8_rate e8_rates[MAX_ROWS];
    size_t n_e8_rates = 0;
    for (size_t i = 0; i < o.n_rows; i++) {
        row_result r;
        memset(&r, 0, sizeof r);
        e8kv_eclq_lattice lat;
        double target;
        size_t err;
        if (parse_ecq(o.rows[i], &lat, &target) > 0) {
            if (!x_rot && !rot_err) { /* rotate once, with the codecs' seed */
                rot_err = e8kv_rot_init(&rot, d->head_dim, o.seed);
                if (!e8kv_is_error(rot_err)) {
                    x_rot = malloc(nv * sizeof(float));
                    y2 = malloc(nv * sizeof(int32_t));
                    if (!x_rot || !y2) {
                        fprintf(stderr, "e8kv bench codec: out of memory\n");
                        status = 1;
                        goto done;
                    }
                    memcpy(x_rot, d->x, nv * sizeof(float));
                    e8kv_rot_forward(&rot, x_rot, d->n_vec);
                }
            }
            const double nominal = target;
            if (lat == E8KV_ECLQ_D8STAR) /* matched rate: E8's measured entropy at the same R */
                for (size_t k = 0; k < n_e8_rates; k++)
                    if (e8_rates[k].target == nominal) target = e8_rates[k].bits;
            err = e8kv_is_error(rot_err) ? rot_err : run_ecq(&r, d, x_rot, &rot, lat, target, y2, y);
            if (!e8kv_is_error(err)) {
                snprintf(r.name, sizeof r.name, "%s-ecq(H):%g", e8kv_eclq_name(lat), nominal);
                if (lat == E8KV_ECLQ_E8 && n_e8_rates < MAX_ROWS)
                    e8_rates[n_e8_rates++] = (e8_rate){nominal, r.bits};
            }
        } else {
            err = run_fixed(&r, d, o.rows[i], o.seed, o.reps, y, buf, buf_cap);
        }
        if (e8kv_is_error(err))
            print_skip(&o, o.rows[i], err);
        else
            print_row(&o, d, &r);
        fflush(stdout);
    }
done:
    free(y2);
    free(x_rot);
    free(buf);
    free(y);
    free(d->x);
    free(d);
    return status;
}
