/* e8kv compress / decompress / info: K/V dump files (doc/format.md §1) to entropy-coded frames (§3) and
 * back. Two modes:
 *   --codec SPEC   encode with a fixed-rate codec, then code its bytes losslessly (rANS or zstd);
 *                  decompress gives back exactly what the codec would decode
 *   --step X       rotate and quantize to E8 at step X (entropy-coded lattice quantization), code the
 *                  points with the parity-aware E8 coder (or zstd)
 * The dump header and the mode travel in the frame's meta bytes as "key=value;" text. */
#include "cli.h"
#include "cli_util.h"
#include "e8kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KVD_HEADER 40
#define WHO_C "e8kv compress"
#define WHO_D "e8kv decompress"
#define WHO_I "e8kv info"

typedef struct {
    uint32_t head_dim, flags, n_layer, n_head_kv;
    uint64_t n_vec;
} kvd_header;

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void wr64(uint8_t *p, uint64_t v) { wr32(p, (uint32_t)v), wr32(p + 4, (uint32_t)(v >> 32)); }

/* a + b written atomically (e8kv_file_writer): a failure leaves an existing file as it was */
static size_t write_all(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    size_t r = 0;
    e8kv_file_writer *w = e8kv_file_writer_open(path, &r);
    if (!w) return r;
    r = e8kv_file_writer_write(w, a, na);
    if (!e8kv_is_error(r) && nb) r = e8kv_file_writer_write(w, b, nb);
    if (e8kv_is_error(r)) {
        e8kv_file_writer_abort(w);
        return r;
    }
    return e8kv_file_writer_commit(w);
}

/* Parse a .kvd; returns a message on failure. */
static const char *parse_kvd(kvd_header *h, const uint8_t *b, size_t size) {
    if (size < KVD_HEADER || memcmp(b, "E8KVDUMP", 8) != 0) return "not a K/V dump (bad magic or short)";
    if (rd32(b + 8) != 1) return "unsupported K/V dump version";
    h->head_dim = rd32(b + 12);
    h->n_vec = rd64(b + 16);
    h->flags = rd32(b + 24);
    h->n_layer = rd32(b + 28);
    h->n_head_kv = rd32(b + 32);
    if (h->head_dim == 0 || h->head_dim > E8KV_MAX_HEAD_DIM) return "bad head_dim";
    if (h->n_vec > (size - KVD_HEADER) / 4 / h->head_dim) return "truncated K/V dump";
    if (KVD_HEADER + h->n_vec * h->head_dim * 4 != size) return "K/V dump size does not match its header";
    return NULL;
}

static void make_kvd_header(uint8_t *b, const kvd_header *h) {
    memset(b, 0, KVD_HEADER);
    memcpy(b, "E8KVDUMP", 8);
    wr32(b + 8, 1);
    wr32(b + 12, h->head_dim);
    wr64(b + 16, h->n_vec);
    wr32(b + 24, h->flags);
    wr32(b + 28, h->n_layer);
    wr32(b + 32, h->n_head_kv);
}

static void usage_compress(FILE *f) {
    fprintf(f,
            "usage: e8kv compress IN.kvd OUT.e8f [--codec SPEC | --step X] [--method rans|zstd|stored]\n"
            "                     [--delta] [--page ROWS] [--seed S] [--level L]\n\n"
            "  --codec SPEC    a fixed-rate codec (include/e8kv.h), its bytes then coded losslessly\n"
            "  --step X        E8 lattice points at step X > 0, entropy-coded (lossy; no codec)\n"
            "  --method M      rans (default), zstd or stored\n"
            "  --delta         code each row's difference from the row before\n"
            "  --page ROWS     rows per independently decodable page, >= 1 (default 256)\n"
            "  --seed S        rotation seed (default 0x5eed)\n"
            "  --level L       zstd level, 1 to 22 (default 3)\n"
            "  default: --codec e8:4 --method rans --page 256. OUT must not be IN (also through links).\n");
}

int e8kv_cmd_compress(int argc, char **argv) {
    const char *spec = NULL, *method = "rans", *pos[2];
    float step = 0.0f;
    int delta = 0;
    e8kv_frame_params p = {.content = E8KV_FRAME_BYTES, .coder = E8KV_FRAME_RANS, .rows_per_page = 256};
    uint64_t seed = 0x5eed;
    size_t n_pos = 0;
    const e8kv_cli_opt opts[] = {
        E8KV_OPT_STR("--codec", &spec),
        E8KV_OPT_FLOAT("--step", &step, 1e-30, 1e30),
        E8KV_OPT_STR("--method", &method),
        E8KV_OPT_FLAG("--delta", &delta),
        E8KV_OPT_SIZE("--page", &p.rows_per_page, 1, UINT32_MAX),
        E8KV_OPT_U64("--seed", &seed),
        E8KV_OPT_INT("--level", &p.zstd_level, 1, 22),
    };
    const int pr =
        e8kv_cli_parse(WHO_C, usage_compress, argc, argv, opts, sizeof opts / sizeof opts[0], pos, 2, &n_pos);
    if (pr >= 0) return pr;
    if (n_pos != 2) return e8kv_cli_usage_error(WHO_C, "give IN.kvd and OUT.e8f");
    const char *in = pos[0], *out = pos[1];
    if (e8kv_cli_same_file(in, out))
        return e8kv_cli_usage_error(WHO_C, "%s and %s are the same file: the input would be lost", in, out);
    p.delta = delta;
    if (!strcmp(method, "rans"))
        p.coder = E8KV_FRAME_RANS;
    else if (!strcmp(method, "zstd"))
        p.coder = E8KV_FRAME_ZSTD;
    else if (!strcmp(method, "stored"))
        p.coder = E8KV_FRAME_STORED;
    else
        return e8kv_cli_usage_error(WHO_C, "--method '%s': expected rans, zstd or stored", method);
    if (spec && step != 0.0f) return e8kv_cli_usage_error(WHO_C, "--codec and --step exclude each other");
    if (!spec && step == 0.0f) spec = "e8:4";

    size_t size;
    uint8_t *buf = (uint8_t *)e8kv_cli_read_all(in, &size);
    if (!buf) return fprintf(stderr, "e8kv compress: cannot read %s\n", in), 1;
    kvd_header h;
    const char *msg = parse_kvd(&h, buf, size);
    if (msg) return fprintf(stderr, "e8kv compress: %s: %s\n", in, msg), free(buf), 1;
    const float *x = (const float *)(buf + KVD_HEADER); /* 40-byte offset keeps 4-byte alignment */
    const size_t d = h.head_dim, n = (size_t)h.n_vec;

    char meta[256];
    uint8_t *rows = NULL;
    size_t row_bytes = 0, r;
    const double t0 = e8kv_cli_now_s();
    if (spec) {
        size_t err;
        e8kv_codec *c = e8kv_codec_create(spec, d, seed, &err);
        if (!c) return fprintf(stderr, "e8kv compress: codec %s: %s\n", spec, e8kv_error_name(err)), free(buf), 1;
        row_bytes = e8kv_codec_vector_bytes(c);
        rows = malloc(row_bytes * n + 1);
        if (!rows) return fprintf(stderr, "e8kv compress: out of memory\n"), e8kv_codec_free(c), free(buf), 1;
        r = e8kv_codec_encode(c, rows, row_bytes * n, x, n);
        e8kv_codec_free(c);
        snprintf(meta, sizeof meta, "mode=codec;spec=%s;", spec);
    } else {
        p.content = E8KV_FRAME_E8;
        row_bytes = 2 * d;
        rows = malloc(row_bytes * n + 1);
        if (!rows) return fprintf(stderr, "e8kv compress: out of memory\n"), free(buf), 1;
        r = e8kv_frame_e8_quantize((int16_t *)rows, d * n, x, n, d, step, seed);
        snprintf(meta, sizeof meta, "mode=e8;step=%.9g;", (double)step);
    }
    if (e8kv_is_error(r)) return fprintf(stderr, "e8kv compress: quantize: %s\n", e8kv_error_name(r)), free(rows), free(buf), 1;
    const double t1 = e8kv_cli_now_s();
    char *const m = meta + strlen(meta);
    snprintf(m, sizeof meta - (size_t)(m - meta), "seed=%llu;head_dim=%u;flags=%u;n_layer=%u;n_head_kv=%u;",
             (unsigned long long)seed, h.head_dim, h.flags, h.n_layer, h.n_head_kv);
    p.meta = meta;
    p.meta_size = strlen(meta);
    const size_t cap = e8kv_compress_bound(row_bytes, n, p.rows_per_page, p.meta_size);
    uint8_t *frame = e8kv_is_error(cap) ? NULL : malloc(cap);
    const size_t fs = frame ? e8kv_frame_encode(frame, cap, rows, row_bytes, n, &p) : cap;
    const double t2 = e8kv_cli_now_s();
    if (e8kv_is_error(fs)) return fprintf(stderr, "e8kv compress: %s\n", e8kv_error_name(fs)), free(frame), free(rows), free(buf), 1;
    const size_t wr = write_all(out, frame, fs, NULL, 0);
    if (e8kv_is_error(wr))
        return fprintf(stderr, "e8kv compress: cannot write %s: %s\n", out, e8kv_error_name(wr)), free(frame),
               free(rows), free(buf), 1;
    const double vals = (double)n * (double)d;
    char what[96];
    if (spec) snprintf(what, sizeof what, "codec %s", spec);
    else snprintf(what, sizeof what, "e8 step %g", (double)step);
    printf("%s: %zu vectors x %zu, %s, method %s%s\n", in, n, d, what,
           p.coder == E8KV_FRAME_RANS ? "rans" : p.coder == E8KV_FRAME_ZSTD ? "zstd" : "stored",
           p.delta ? "+delta" : "");
    printf("  f32 %zu B, quantized rows %zu B (%.4f bits/value), frame %zu B (%.4f bits/value, %.3fx of rows)\n",
           n * d * 4, row_bytes * n, 8.0 * (double)(row_bytes * n) / vals, fs, 8.0 * (double)fs / vals,
           (double)fs / (double)(row_bytes * n > 0 ? row_bytes * n : 1));
    printf("  quantize %.3f s, frame encode %.3f s (%.1f MB/s of rows)\n", t1 - t0, t2 - t1,
           (double)(row_bytes * n) / (t2 - t1) / 1e6);
    free(frame), free(rows), free(buf);
    return 0;
}

/* value of key in "k=v;k=v;" meta text, copied into out */
static int meta_get(char *out, size_t cap, const char *meta, size_t meta_size, const char *key) {
    const size_t kl = strlen(key);
    size_t i = 0;
    while (i < meta_size) {
        size_t j = i;
        while (j < meta_size && meta[j] != ';') j++;
        if (j - i > kl && !memcmp(meta + i, key, kl) && meta[i + kl] == '=') {
            const size_t vl = j - i - kl - 1;
            if (vl + 1 > cap) return -1;
            memcpy(out, meta + i + kl + 1, vl);
            out[vl] = 0;
            return 0;
        }
        i = j + 1;
    }
    return -1;
}

static void usage_decompress(FILE *f) {
    fprintf(f,
            "usage: e8kv decompress IN.e8f OUT.kvd\n\n"
            "Decodes a frame written by e8kv compress back to a K/V dump (doc/format.md §1). OUT must not\n"
            "be IN (also through links).\n");
}

int e8kv_cmd_decompress(int argc, char **argv) {
    const char *pos[2];
    size_t n_pos = 0;
    const int pr = e8kv_cli_parse(WHO_D, usage_decompress, argc, argv, NULL, 0, pos, 2, &n_pos);
    if (pr >= 0) return pr;
    if (n_pos != 2) return e8kv_cli_usage_error(WHO_D, "give IN.e8f and OUT.kvd");
    const char *in = pos[0], *out = pos[1];
    if (e8kv_cli_same_file(in, out))
        return e8kv_cli_usage_error(WHO_D, "%s and %s are the same file: the input would be lost", in, out);
    size_t size;
    uint8_t *buf = (uint8_t *)e8kv_cli_read_all(in, &size);
    if (!buf) return fprintf(stderr, "e8kv decompress: cannot read %s\n", in), 1;
    e8kv_frame_info fi;
    size_t r = e8kv_frame_get_info(&fi, buf, size);
    if (e8kv_is_error(r))
        return fprintf(stderr, "e8kv decompress: %s: %s\n", in, e8kv_error_name(r)), free(buf), 1;
    const char *meta = (const char *)buf + fi.meta_offset;
    char mode[16], v[64];
    kvd_header h;
    uint64_t seed;
    if (meta_get(mode, sizeof mode, meta, fi.meta_size, "mode") || meta_get(v, sizeof v, meta, fi.meta_size, "seed"))
        return fprintf(stderr, "e8kv decompress: %s: not a K/V frame (meta)\n", in), free(buf), 1;
    seed = strtoull(v, NULL, 10);
    const char *keys[4] = {"head_dim", "flags", "n_layer", "n_head_kv"};
    uint32_t *dst[4] = {&h.head_dim, &h.flags, &h.n_layer, &h.n_head_kv};
    for (int k = 0; k < 4; k++) {
        if (meta_get(v, sizeof v, meta, fi.meta_size, keys[k]))
            return fprintf(stderr, "e8kv decompress: meta lacks %s\n", keys[k]), free(buf), 1;
        *dst[k] = (uint32_t)strtoul(v, NULL, 10);
    }
    if (h.head_dim == 0 || h.head_dim > E8KV_MAX_HEAD_DIM)
        return fprintf(stderr, "e8kv decompress: bad head_dim in meta\n"), free(buf), 1;
    const size_t n = fi.n_rows, d = h.head_dim;
    h.n_vec = n;
    if (n > ((size_t)1 << 40) / (fi.row_bytes + 4 * d))
        return fprintf(stderr, "e8kv decompress: frame too large\n"), free(buf), 1;
    uint8_t *rows = malloc(fi.row_bytes * n + 1);
    float *x = malloc(n * d * sizeof *x + 1);
    if (!rows || !x)
        return fprintf(stderr, "e8kv decompress: out of memory\n"), free(rows), free(x), free(buf), 1;
    const double t0 = e8kv_cli_now_s();
    r = e8kv_frame_decode(rows, fi.row_bytes * n, buf, size);
    const double t1 = e8kv_cli_now_s();
    const char *bad_meta = NULL; /* the frame decodes, but its meta does not describe K/V rows */
    if (!e8kv_is_error(r)) {
        if (!strcmp(mode, "codec")) {
            size_t err = 0;
            e8kv_codec *c = NULL;
            if (meta_get(v, sizeof v, meta, fi.meta_size, "spec"))
                bad_meta = "no codec spec in its meta";
            else if (!(c = e8kv_codec_create(v, d, seed, &err)))
                r = err;
            else
                r = e8kv_codec_decode(c, x, n * d, rows, fi.row_bytes * n, n);
            e8kv_codec_free(c);
        } else if (!strcmp(mode, "e8") && !meta_get(v, sizeof v, meta, fi.meta_size, "step") &&
                   fi.row_bytes == 2 * d) {
            r = e8kv_frame_e8_dequantize(x, n * d, (const int16_t *)rows, n, d, strtof(v, NULL), seed);
        } else {
            bad_meta = "an unknown mode or row size in its meta";
        }
    }
    const double t2 = e8kv_cli_now_s();
    int rc = 0;
    if (bad_meta) {
        fprintf(stderr, "e8kv decompress: %s: %s [%s]\n", in, bad_meta,
                e8kv_error_code_name(E8KV_ERROR_CORRUPTED));
        rc = 1;
    } else if (e8kv_is_error(r)) {
        fprintf(stderr, "e8kv decompress: %s: %s\n", in, e8kv_error_name(r));
        rc = 1;
    } else {
        uint8_t hdr[KVD_HEADER];
        make_kvd_header(hdr, &h);
        const size_t wr = write_all(out, hdr, KVD_HEADER, x, n * d * sizeof *x);
        if (e8kv_is_error(wr)) {
            fprintf(stderr, "e8kv decompress: cannot write %s: %s\n", out, e8kv_error_name(wr));
            rc = 1;
        } else {
            printf("%s: %zu vectors x %zu; frame decode %.3f s (%.1f MB/s of rows), dequantize %.3f s\n", out,
                   n, d, t1 - t0, (double)(fi.row_bytes * n) / (t1 - t0) / 1e6, t2 - t1);
        }
    }
    free(rows), free(x), free(buf);
    return rc;
}

static void usage_info(FILE *f) {
    fprintf(f,
            "usage: e8kv info FILE\n\n"
            "Describes a K/V dump (.kvd, ppl --dump-kv), an entropy-coded frame (.e8f, e8kv compress) or a\n"
            "saved cache (generate --save-cache, e8kv_cache_save_file).\n");
}

/* A saved cache (doc/format.md §4): its configuration, and the prompt when generate --save-cache wrote it. */
static int info_cache(const char *in, const uint8_t *buf, size_t size) {
    e8kv_cache_file_info *fi = malloc(sizeof *fi);
    const size_t r = fi ? e8kv_cache_file_get_info(fi, buf, size) : 0;
    if (!fi || e8kv_is_error(r)) {
        fprintf(stderr, "e8kv info: %s: a saved cache, but %s\n", in,
                fi ? e8kv_error_name(r) : e8kv_error_code_name(E8KV_ERROR_OUT_OF_MEMORY));
        free(fi);
        return 1;
    }
    printf(
        "%s: e8kv saved cache v%u, %zu layers x %zu KV heads, head_dim %zu, n_ctx %zu, pages of %zu tokens, "
        "seed %llu, RoPE theta %g%s, %zu bytes\n",
        in, fi->version, fi->n_layer, fi->n_head_kv, fi->head_dim, fi->n_ctx, fi->page_tokens,
        (unsigned long long)fi->seed, (double)fi->rope_theta, fi->rope_neox ? " (NeoX)" : "", fi->file_size);
    printf("  spec: %s\n", fi->spec);
    if (fi->n_rope_freqs) /* a scaled RoPE's own frequencies (version 3): theta's are not the keys' turns */
        printf("  RoPE frequencies inside: %zu (pair 0 %g, pair %zu %g)\n", fi->n_rope_freqs,
               (double)fi->rope_freqs[0], fi->n_rope_freqs - 1, (double)fi->rope_freqs[fi->n_rope_freqs - 1]);
    if (fi->calib_size) printf("  calibration inside: %zu bytes\n", fi->calib_size);
    const uint8_t *meta = buf + fi->meta_offset;
    if (fi->meta_size >= 12 && !memcmp(meta, "E8KVGEN1", 8)) /* generate --save-cache (doc/format.md §4.5) */
        printf("  meta: generate --save-cache state, prompt of %u tokens (%zu bytes)\n", rd32(meta + 8),
               fi->meta_size);
    else
        printf("  meta: %zu bytes\n", fi->meta_size);
    free(fi);
    return 0;
}

int e8kv_cmd_info(int argc, char **argv) {
    const char *pos[1];
    size_t n_pos = 0;
    const int pr = e8kv_cli_parse(WHO_I, usage_info, argc, argv, NULL, 0, pos, 1, &n_pos);
    if (pr >= 0) return pr;
    if (n_pos != 1) return e8kv_cli_usage_error(WHO_I, "give one FILE");
    const char *in = pos[0];
    size_t size;
    uint8_t *buf = (uint8_t *)e8kv_cli_read_all(in, &size);
    if (!buf) return fprintf(stderr, "e8kv info: cannot read %s\n", in), 1;
    int rc = 0;
    if (size >= 8 && !memcmp(buf, "E8KVDUMP", 8)) {
        kvd_header h;
        const char *msg = parse_kvd(&h, buf, size);
        if (msg) {
            fprintf(stderr, "e8kv info: %s: %s\n", in, msg);
            rc = 1;
        } else {
            printf("%s: K/V dump v1, %llu vectors x head_dim %u, flags %u (%s%s%s), n_layer %u, n_head_kv "
                   "%u, %zu bytes\n",
                   in, (unsigned long long)h.n_vec, h.head_dim, h.flags, h.flags & 1 ? "keys " : "",
                   h.flags & 2 ? "values " : "", h.flags & 4 ? "pre-RoPE" : "", h.n_layer, h.n_head_kv, size);
        }
    } else if (size >= 4 && !memcmp(buf, "E8KC", 4)) {
        rc = info_cache(in, buf, size);
    } else if (size >= 8 && !memcmp(buf, "E8KVCALB", 8)) {
        size_t err = 0;
        e8kv_calib *cal = e8kv_calib_load(buf, size, &err);
        if (!cal) {
            fprintf(stderr, "e8kv info: %s: a calibration, but %s\n", in, e8kv_error_name(err));
            rc = 1;
        } else {
            size_t n_layer = 0, n_head_kv = 0, head_dim = 0, n_tok = 0;
            e8kv_calib_info(cal, &n_layer, &n_head_kv, &head_dim, &n_tok);
            printf(
                "%s: e8kv calibration (e8kv calibrate), %zu layers x %zu KV heads, head_dim %zu, %zu tokens "
                "per layer observed, %s, %s, %zu bytes\n",
                in, n_layer, n_head_kv, head_dim, n_tok,
                e8kv_calib_query_energy(cal, 0, 0) ? "query energies (score-domain keys)"
                                                   : "no query energies",
                e8kv_calib_sensitivity(cal, 0, 0) >= 0.0 ? "sensitivities (auto=)" : "no sensitivities",
                size);
            e8kv_calib_free(cal);
        }
    } else {
        e8kv_frame_info fi;
        const size_t r = e8kv_frame_get_info(&fi, buf, size);
        if (e8kv_is_error(r)) {
            fprintf(stderr, "e8kv info: %s: %s%s\n", in, e8kv_error_name(r),
                    size >= 4 && memcmp(buf, "E8KF", 4)
                        ? " (not a K/V dump, frame, saved cache or calibration)"
                        : "");
            rc = 1;
        } else {
            static const char *coder[] = {"stored", "rans", "zstd"};
            printf("%s: e8kv frame v%u, %s rows, coder %s%s, %zu rows x %zu bytes, %zu pages of %zu rows\n",
                   in, fi.version, fi.content == E8KV_FRAME_E8 ? "E8 point" : "byte", coder[fi.coder],
                   fi.delta ? "+delta" : "", fi.n_rows, fi.row_bytes, fi.n_pages, fi.rows_per_page);
            printf("  header %zu B (tables and page index included), frame %zu B%s, raw rows %zu B (%.3fx)\n",
                   fi.header_size, fi.frame_size, size == fi.frame_size ? "" : " (FILE SIZE DIFFERS)",
                   fi.n_rows * fi.row_bytes, (double)fi.frame_size / (double)(fi.n_rows * fi.row_bytes > 0 ? fi.n_rows * fi.row_bytes : 1));
            printf("  meta: %.*s\n", (int)fi.meta_size, (const char *)buf + fi.meta_offset);
            if (size != fi.frame_size) rc = 1;
        }
    }
    free(buf);
    return rc;
}
