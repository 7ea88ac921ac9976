/* GGUF v2/v3 reader (spec: ggml docs/gguf.md).
 *
 * File layout, all little-endian:
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 value_type | value }        string = u64 length + bytes (no NUL)
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
 *   padding to `alignment` (general.alignment, default 32) | tensor data
 * An array value is { u32 element_type | u64 count | elements }, elements may themselves be arrays.
 *
 * Trust model: the bytes are untrusted. Every length and count is checked against the bytes left before
 * anything is read or allocated, so memory use is bounded by a small multiple of the file size; reading
 * past the end is E8KV_ERROR_TRUNCATED, impossible structure is E8KV_ERROR_CORRUPTED. Tensor data must
 * be laid out as ggml writes it and llama.cpp requires it: in tensor-info order, each tensor at the
 * running offset rounded up to the alignment. That makes every tensor's range checkable, excludes
 * overlaps, and lets a file that ends inside the data be told apart (TRUNCATED) from wild offsets
 * (CORRUPTED). Tensor types with unknown ids are kept (metadata stays readable) but have no size, so
 * the tensors after one are only checked for alignment and order; converting them is UNSUPPORTED. */
#define _GNU_SOURCE
#include "gguf.h"

#include "dequant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>


#define GGUF_MAGIC 0x46554747u          /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ALIGNMENT (1u << 30)
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64                /* ggml's GGML_MAX_NAME, terminator included */
#define GGUF_MAX_ARRAY_DEPTH 8          /* nesting of arrays in arrays */
/* Counts above these are nonsense whatever the file size (CORRUPTED); smaller ones that do not fit the
 * bytes left are TRUNCATED. */
#define GGUF_MAX_KV (1u << 24)
#define GGUF_MAX_TENSORS (1u << 24)
/* Smallest serialized sizes, used to bound counts by the bytes left. */
#define MIN_KV_BYTES 13     /* empty key (8) + type (4) + one byte value */
#define MIN_TENSOR_BYTES 24 /* empty name (8) + n_dims (4) + type (4) + offset (8) */
/* Element count limit: ggml keeps ne in int64. */
#define GGUF_MAX_ELEMS ((uint64_t)INT64_MAX)

typedef struct {
    char *key;               /* NUL-terminated copy */
    uint32_t type;           /* e8kv_gguf_type */
    const uint8_t *val;      /* scalar value bytes; string bytes; array elements */
    uint64_t len;            /* string length; array element count */
    uint32_t elem_type;      /* arrays: element type */
    const uint8_t **elems;   /* arrays of strings: each element's u64 length field (else NULL) */
} gguf_kv;

struct e8kv_gguf {
    const uint8_t *base;
    size_t size;
    void *map;               /* mmap'ed region (NULL for open_buffer) */
    size_t map_size;
    uint32_t version;
    size_t alignment;
    size_t data_offset;      /* start of the tensor data section */
    size_t n_kv;
    gguf_kv *kv;
    size_t *kv_sorted;       /* kv indices sorted by key */
    size_t n_tensors;
    e8kv_gguf_tensor *tensors;
    size_t *t_sorted;        /* tensor indices sorted by name */
};

/* ---------------------------------------------------------------- cursor over untrusted bytes */

typedef struct {
    const uint8_t *p;
    size_t size;
    size_t pos;
} cursor;

static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

static inline size_t left(const cursor *c) { return c->size - c->pos; }

/* Consume n bytes; *at points to them. */
static size_t take(cursor *c, uint64_t n, const uint8_t **at) {
    if (n > left(c)) return E8KV_ERR(TRUNCATED);
    if (at) *at = c->p + c->pos;
    c->pos += (size_t)n;
    return 0;
}
static size_t rd_u32(cursor *c, uint32_t *v) {
    const uint8_t *p = NULL;
    E8KV_RETURN_IF_ERROR(take(c, 4, &p));
    *v = ld32(p);
    return 0;
}
static size_t rd_u64(cursor *c, uint64_t *v) {
    const uint8_t *p = NULL;
    E8KV_RETURN_IF_ERROR(take(c, 8, &p));
    *v = ld64(p);
    return 0;
}
static size_t rd_str(cursor *c, const uint8_t **s, uint64_t *len) {
    E8KV_RETURN_IF_ERROR(rd_u64(c, len));
    return take(c, *len, s);
}

/* Bytes of one scalar of value type t; 0 for string, array and unknown types. */
static size_t scalar_size(uint32_t t) {
    switch (t) {
    case E8KV_GGUF_UINT8: case E8KV_GGUF_INT8: case E8KV_GGUF_BOOL: return 1;
    case E8KV_GGUF_UINT16: case E8KV_GGUF_INT16: return 2;
    case E8KV_GGUF_UINT32: case E8KV_GGUF_INT32: case E8KV_GGUF_FLOAT32: return 4;
    case E8KV_GGUF_UINT64: case E8KV_GGUF_INT64: case E8KV_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Skip one array body (after its element type and count were read), validating nested arrays. */
static size_t skip_array(cursor *c, uint32_t elem_type, uint64_t n, int depth) {
    const size_t ss = scalar_size(elem_type);
    if (ss) return n > left(c) / ss ? E8KV_ERR(TRUNCATED) : take(c, n * ss, NULL);
    if (elem_type == E8KV_GGUF_STRING) {
        if (n > left(c) / 8) return E8KV_ERR(TRUNCATED);
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *s = NULL;
            uint64_t len = 0;
            E8KV_RETURN_IF_ERROR(rd_str(c, &s, &len));
        }
        return 0;
    }
    if (elem_type == E8KV_GGUF_ARRAY) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH) return E8KV_ERR(CORRUPTED);
        if (n > left(c) / 12) return E8KV_ERR(TRUNCATED);
        for (uint64_t i = 0; i < n; i++) {
            uint32_t et;
            uint64_t en;
            E8KV_RETURN_IF_ERROR(rd_u32(c, &et));
            E8KV_RETURN_IF_ERROR(rd_u64(c, &en));
            if (et > E8KV_GGUF_FLOAT64) return E8KV_ERR(CORRUPTED);
            E8KV_RETURN_IF_ERROR(skip_array(c, et, en, depth + 1));
        }
        return 0;
    }
    return E8KV_ERR(CORRUPTED);
}

static size_t parse_kv(cursor *c, gguf_kv *kv) {
    const uint8_t *key = NULL;
    uint64_t key_len = 0;
    E8KV_RETURN_IF_ERROR(rd_str(c, &key, &key_len));
    if (memchr(key, 0, (size_t)key_len)) return E8KV_ERR(CORRUPTED);
    kv->key = malloc((size_t)key_len + 1);
    if (!kv->key) return E8KV_ERR(OUT_OF_MEMORY);
    memcpy(kv->key, key, (size_t)key_len);
    kv->key[key_len] = 0;
    E8KV_RETURN_IF_ERROR(rd_u32(c, &kv->type));
    const size_t ss = scalar_size(kv->type);
    if (ss) return take(c, ss, &kv->val);
    if (kv->type == E8KV_GGUF_STRING) return rd_str(c, &kv->val, &kv->len);
    if (kv->type != E8KV_GGUF_ARRAY) return E8KV_ERR(CORRUPTED);
    E8KV_RETURN_IF_ERROR(rd_u32(c, &kv->elem_type));
    E8KV_RETURN_IF_ERROR(rd_u64(c, &kv->len));
    if (kv->elem_type > E8KV_GGUF_FLOAT64) return E8KV_ERR(CORRUPTED);
    kv->val = c->p + c->pos;
    if (kv->elem_type == E8KV_GGUF_STRING) {
        /* index the strings once so element access is O(1); the count is bounded by the bytes left */
        if (kv->len > left(c) / 8) return E8KV_ERR(TRUNCATED);
        kv->elems = malloc(kv->len ? (size_t)kv->len * sizeof *kv->elems : 1);
        if (!kv->elems) return E8KV_ERR(OUT_OF_MEMORY);
        for (uint64_t i = 0; i < kv->len; i++) {
            const uint8_t *s = NULL;
            uint64_t len = 0;
            kv->elems[i] = c->p + c->pos;
            E8KV_RETURN_IF_ERROR(rd_str(c, &s, &len));
        }
        return 0;
    }
    return skip_array(c, kv->elem_type, kv->len, 1);
}

static size_t parse_tensor(cursor *c, e8kv_gguf_tensor *t, uint64_t *offset) {
    const uint8_t *name = NULL;
    uint64_t name_len = 0;
    E8KV_RETURN_IF_ERROR(rd_str(c, &name, &name_len));
    if (name_len >= GGUF_MAX_NAME || memchr(name, 0, (size_t)name_len)) return E8KV_ERR(CORRUPTED);
    char *copy = malloc((size_t)name_len + 1);
    if (!copy) return E8KV_ERR(OUT_OF_MEMORY);
    memcpy(copy, name, (size_t)name_len);
    copy[name_len] = 0;
    t->name = copy;
    E8KV_RETURN_IF_ERROR(rd_u32(c, &t->n_dims));
    if (t->n_dims > GGUF_MAX_DIMS) return E8KV_ERR(CORRUPTED);
    uint64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        E8KV_RETURN_IF_ERROR(rd_u64(c, &t->ne[d]));
        if (t->ne[d] == 0 || t->ne[d] > GGUF_MAX_ELEMS / n) return E8KV_ERR(CORRUPTED);
        n *= t->ne[d];
    }
    t->n_elements = n;
    E8KV_RETURN_IF_ERROR(rd_u32(c, &t->type));
    E8KV_RETURN_IF_ERROR(rd_u64(c, offset));
    const size_t be = e8kv_ggml_block_elems(t->type);
    if (be) {
        /* ggml stores whole blocks per row */
        if (t->ne[0] % be != 0) return E8KV_ERR(CORRUPTED);
        t->n_bytes = e8kv_ggml_row_bytes(t->type, n);
        if (t->n_bytes == 0) return E8KV_ERR(CORRUPTED); /* does not fit size_t */
    } else {
        t->n_bytes = 0; /* unknown type: size unknown */
    }
    t->data = NULL;
    return 0;
}

/* ---------------------------------------------------------------- sorting for duplicate checks and lookup */

/* Bottom-up merge sort of an index array (qsort has no context argument in C11; this stays reentrant). */
static void merge_sort(size_t *idx, size_t *tmp, size_t n, int (*cmp)(const e8kv_gguf *, size_t, size_t),
                       const e8kv_gguf *g) {
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            const size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = cmp(g, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
}
static int cmp_kv_at(const e8kv_gguf *g, size_t a, size_t b) { return strcmp(g->kv[a].key, g->kv[b].key); }
static int cmp_t_at(const e8kv_gguf *g, size_t a, size_t b) {
    return strcmp(g->tensors[a].name, g->tensors[b].name);
}

static size_t sorted_index(size_t **out, size_t n, int (*cmp)(const e8kv_gguf *, size_t, size_t),
                           const e8kv_gguf *g) {
    size_t *idx = malloc((n ? n : 1) * sizeof *idx), *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!idx || !tmp) {
        free(idx);
        free(tmp);
        return E8KV_ERR(OUT_OF_MEMORY);
    }
    for (size_t i = 0; i < n; i++) idx[i] = i;
    merge_sort(idx, tmp, n, cmp, g);
    free(tmp);
    *out = idx;
    for (size_t i = 1; i < n; i++)
        if (cmp(g, idx[i - 1], idx[i]) == 0) return E8KV_ERR(CORRUPTED);
    return 0;
}

/* ---------------------------------------------------------------- open */

static size_t parse(e8kv_gguf *g) {
    cursor c = {g->base, g->size, 0};
    uint32_t magic;
    E8KV_RETURN_IF_ERROR(rd_u32(&c, &magic));
    if (magic != GGUF_MAGIC) return E8KV_ERR(CORRUPTED);
    E8KV_RETURN_IF_ERROR(rd_u32(&c, &g->version));
    if (g->version != 2 && g->version != 3) return E8KV_ERR(VERSION);
    uint64_t n_tensors, n_kv;
    E8KV_RETURN_IF_ERROR(rd_u64(&c, &n_tensors));
    E8KV_RETURN_IF_ERROR(rd_u64(&c, &n_kv));
    if (n_tensors > GGUF_MAX_TENSORS || n_kv > GGUF_MAX_KV) return E8KV_ERR(CORRUPTED);
    if (n_kv > left(&c) / MIN_KV_BYTES) return E8KV_ERR(TRUNCATED);

    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    if (!g->kv) return E8KV_ERR(OUT_OF_MEMORY);
    while (g->n_kv < n_kv) {
        /* counted before parsing so close() frees what a failing entry allocated (the array is zeroed) */
        gguf_kv *kv = &g->kv[g->n_kv++];
        E8KV_RETURN_IF_ERROR(parse_kv(&c, kv));
    }
    E8KV_RETURN_IF_ERROR(sorted_index(&g->kv_sorted, g->n_kv, cmp_kv_at, g));

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const long ai = e8kv_gguf_find(g, "general.alignment");
    if (ai >= 0) {
        uint64_t a;
        const uint32_t at = g->kv[ai].type;
        if (at != E8KV_GGUF_UINT8 && at != E8KV_GGUF_UINT16 && at != E8KV_GGUF_UINT32 && at != E8KV_GGUF_UINT64)
            return E8KV_ERR(CORRUPTED);
        if (e8kv_is_error(e8kv_gguf_get_u64(g, "general.alignment", &a))) return E8KV_ERR(CORRUPTED);
        if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGNMENT) return E8KV_ERR(CORRUPTED);
        g->alignment = (size_t)a;
    }

    if (n_tensors > left(&c) / MIN_TENSOR_BYTES) return E8KV_ERR(TRUNCATED);
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    uint64_t *offsets = malloc((n_tensors ? (size_t)n_tensors : 1) * sizeof *offsets);
    if (!g->tensors || !offsets) {
        free(offsets);
        return E8KV_ERR(OUT_OF_MEMORY);
    }
    size_t r = 0;
    while (g->n_tensors < n_tensors && !e8kv_is_error(r)) {
        const size_t i = g->n_tensors++; /* counted first so close() frees a failing entry's name */
        r = parse_tensor(&c, &g->tensors[i], &offsets[i]);
    }
    if (!e8kv_is_error(r)) r = sorted_index(&g->t_sorted, g->n_tensors, cmp_t_at, g);
    if (e8kv_is_error(r)) {
        free(offsets);
        return r;
    }

    /* data section: header end rounded up to the alignment (no overflow: header_end <= size, pad < 2^30) */
    const size_t header_end = c.pos;
    const size_t pad = (g->alignment - header_end % g->alignment) % g->alignment;
    g->data_offset = header_end + pad;

    /* tensor ranges, in info order, each at the running offset rounded up to the alignment */
    uint64_t expect = 0;
    int known = 1; /* every tensor so far has a known size */
    for (size_t i = 0; i < g->n_tensors; i++) {
        e8kv_gguf_tensor *t = &g->tensors[i];
        const uint64_t off = offsets[i];
        if (off % g->alignment != 0) r = E8KV_ERR(CORRUPTED);
        else if (known ? off != expect : off < expect) r = E8KV_ERR(CORRUPTED);
        if (e8kv_is_error(r)) break;
        /* the file must hold [data_offset + off, + n_bytes); an unknown type holds at least one byte */
        const uint64_t avail = g->size > g->data_offset ? g->size - g->data_offset : 0;
        const uint64_t need = t->n_bytes ? t->n_bytes : 1;
        if (off > avail || need > avail - off) {
            /* a consistent layout that runs past the end is a short file; an offset beyond the end
             * after an unknown-size tensor cannot be told from a wild one */
            r = known ? E8KV_ERR(TRUNCATED) : E8KV_ERR(CORRUPTED);
            break;
        }
        if (t->n_bytes == 0) { /* unknown type: the next tensor only has to come later */
            known = 0;
            expect = off + 1; /* off < avail: no overflow */
            continue;
        }
        t->data = g->base + g->data_offset + off;
        const uint64_t end = off + t->n_bytes; /* <= avail: no overflow */
        expect = end + (g->alignment - end % g->alignment) % g->alignment;
    }
    free(offsets);
    return r;
}

static size_t open_common(e8kv_gguf **out, e8kv_gguf *g) {
    const size_t r = parse(g);
    if (e8kv_is_error(r)) {
        e8kv_gguf_close(g);
        return r;
    }
    *out = g;
    return 0;
}

size_t e8kv_gguf_open_buffer(e8kv_gguf **out, const void *data, size_t n_bytes) {
    if (!out || (!data && n_bytes)) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    e8kv_gguf *g = calloc(1, sizeof *g);
    if (!g) return E8KV_ERR(OUT_OF_MEMORY);
    g->base = data;
    g->size = n_bytes;
    return open_common(out, g);
}

size_t e8kv_gguf_open(e8kv_gguf **out, const char *path) {
    if (!out || !path) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return E8KV_ERR(IO);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return E8KV_ERR(IO);
    }
    if (st.st_size < 4) {
        close(fd);
        return E8KV_ERR(TRUNCATED);
    }
    const size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return E8KV_ERR(IO);
    e8kv_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        munmap(map, size);
        return E8KV_ERR(OUT_OF_MEMORY);
    }
    g->base = map;
    g->size = size;
    g->map = map;
    g->map_size = size;
    return open_common(out, g);
}

void e8kv_gguf_close(e8kv_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].elems);
    }
    free(g->kv);
    free(g->kv_sorted);
    for (size_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->tensors);
    free(g->t_sorted);
    if (g->map) munmap(g->map, g->map_size);
    free(g);
}

/* ---------------------------------------------------------------- metadata */

size_t e8kv_gguf_n_kv(const e8kv_gguf *g) { return g ? g->n_kv : 0; }
const char *e8kv_gguf_kv_key(const e8kv_gguf *g, long idx) {
    return g && idx >= 0 && (size_t)idx < g->n_kv ? g->kv[idx].key : NULL;
}
uint32_t e8kv_gguf_version(const e8kv_gguf *g) { return g ? g->version : 0; }
size_t e8kv_gguf_alignment(const e8kv_gguf *g) { return g ? g->alignment : 0; }
size_t e8kv_gguf_data_offset(const e8kv_gguf *g) { return g ? g->data_offset : 0; }

long e8kv_gguf_find(const e8kv_gguf *g, const char *key) {
    if (!g || !key || !g->kv_sorted) return -1;
    size_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(g->kv[g->kv_sorted[mid]].key, key);
        if (c == 0) return (long)g->kv_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

e8kv_gguf_type e8kv_gguf_kv_type(const e8kv_gguf *g, long idx) {
    if (!g || idx < 0 || (size_t)idx >= g->n_kv) return (e8kv_gguf_type)-1;
    return (e8kv_gguf_type)g->kv[idx].type;
}

/* A numeric scalar at p of type t, as both an exact integer (when it is one) and a double. */
typedef struct {
    int is_int;      /* integer or bool type */
    int is_neg;      /* signed integer below zero */
    uint64_t u;      /* value when is_int and !is_neg */
    int64_t i;       /* value when is_int */
    double f;
} num;

static size_t load_num(const uint8_t *p, uint32_t t, num *v) {
    memset(v, 0, sizeof *v);
    v->is_int = 1;
    switch (t) {
    case E8KV_GGUF_UINT8: case E8KV_GGUF_BOOL: v->u = p[0]; break;
    case E8KV_GGUF_UINT16: v->u = ld16(p); break;
    case E8KV_GGUF_UINT32: v->u = ld32(p); break;
    case E8KV_GGUF_UINT64: v->u = ld64(p); break;
    case E8KV_GGUF_INT8: v->i = (int8_t)p[0]; break;
    case E8KV_GGUF_INT16: v->i = (int16_t)ld16(p); break;
    case E8KV_GGUF_INT32: v->i = (int32_t)ld32(p); break;
    case E8KV_GGUF_INT64: v->i = (int64_t)ld64(p); break;
    case E8KV_GGUF_FLOAT32: {
        const uint32_t u = ld32(p);
        float f;
        memcpy(&f, &u, 4);
        v->is_int = 0;
        v->f = f;
        return 0;
    }
    case E8KV_GGUF_FLOAT64: {
        const uint64_t u = ld64(p);
        memcpy(&v->f, &u, 8);
        v->is_int = 0;
        return 0;
    }
    default: return E8KV_ERR(CORRUPTED);
    }
    if (t == E8KV_GGUF_INT8 || t == E8KV_GGUF_INT16 || t == E8KV_GGUF_INT32 || t == E8KV_GGUF_INT64) {
        v->is_neg = v->i < 0;
        v->u = (uint64_t)v->i;
        v->f = (double)v->i;
    } else {
        v->i = (int64_t)v->u;
        v->f = (double)v->u;
    }
    return 0;
}

static const gguf_kv *lookup(const e8kv_gguf *g, const char *key, size_t *err) {
    const long i = e8kv_gguf_find(g, key);
    if (i < 0) {
        *err = E8KV_ERR(BAD_ARGUMENT);
        return NULL;
    }
    return &g->kv[i];
}

static size_t num_to_u64(const num *v, uint64_t *out) {
    if (v->is_int) {
        if (v->is_neg) return E8KV_ERR(RANGE);
        *out = v->u;
        return 0;
    }
    /* floats: only exact non-negative integers below 2^64 */
    if (!(v->f >= 0.0 && v->f < 18446744073709551616.0) || v->f != (double)(uint64_t)v->f) return E8KV_ERR(RANGE);
    *out = (uint64_t)v->f;
    return 0;
}

/* The numeric scalar stored under key (errors in this order: missing key, NULL out, not a scalar). */
static size_t lookup_scalar(const e8kv_gguf *g, const char *key, const void *out, num *v) {
    size_t err = 0;
    const gguf_kv *kv = lookup(g, key, &err);
    if (!kv) return err;
    if (!out) return E8KV_ERR(BAD_ARGUMENT);
    if (!scalar_size(kv->type)) return E8KV_ERR(CORRUPTED);
    return load_num(kv->val, kv->type, v);
}

size_t e8kv_gguf_get_u64(const e8kv_gguf *g, const char *key, uint64_t *out) {
    num v;
    E8KV_RETURN_IF_ERROR(lookup_scalar(g, key, out, &v));
    return num_to_u64(&v, out);
}

size_t e8kv_gguf_get_f32(const e8kv_gguf *g, const char *key, float *out) {
    num v;
    E8KV_RETURN_IF_ERROR(lookup_scalar(g, key, out, &v));
    *out = (float)v.f;
    return 0;
}

size_t e8kv_gguf_get_bool(const e8kv_gguf *g, const char *key, int *out) {
    num v;
    E8KV_RETURN_IF_ERROR(lookup_scalar(g, key, out, &v));
    *out = v.is_int ? v.u != 0 : v.f != 0.0;
    return 0;
}

size_t e8kv_gguf_get_str(const e8kv_gguf *g, const char *key, const char **s, size_t *len) {
    size_t err = 0;
    const gguf_kv *kv = lookup(g, key, &err);
    if (!kv) return err;
    if (!s || !len) return E8KV_ERR(BAD_ARGUMENT);
    if (kv->type != E8KV_GGUF_STRING) return E8KV_ERR(CORRUPTED);
    *s = (const char *)kv->val;
    *len = (size_t)kv->len;
    return 0;
}

size_t e8kv_gguf_get_arr(const e8kv_gguf *g, const char *key, e8kv_gguf_type *elem_type, uint64_t *n) {
    size_t err = 0;
    const gguf_kv *kv = lookup(g, key, &err);
    if (!kv) return err;
    if (kv->type != E8KV_GGUF_ARRAY) return E8KV_ERR(CORRUPTED);
    if (elem_type) *elem_type = (e8kv_gguf_type)kv->elem_type;
    if (n) *n = kv->len;
    return 0;
}

size_t e8kv_gguf_get_arr_str(const e8kv_gguf *g, const char *key, uint64_t i, const char **s, size_t *len) {
    size_t err = 0;
    const gguf_kv *kv = lookup(g, key, &err);
    if (!kv) return err;
    if (!s || !len) return E8KV_ERR(BAD_ARGUMENT);
    if (kv->type != E8KV_GGUF_ARRAY || kv->elem_type != E8KV_GGUF_STRING) return E8KV_ERR(CORRUPTED);
    if (i >= kv->len) return E8KV_ERR(BAD_ARGUMENT);
    const uint8_t *p = kv->elems[i]; /* validated at open */
    *len = (size_t)ld64(p);
    *s = (const char *)p + 8;
    return 0;
}

static size_t arr_num(const e8kv_gguf *g, const char *key, uint64_t i, num *v) {
    size_t err = 0;
    const gguf_kv *kv = lookup(g, key, &err);
    if (!kv) return err;
    const size_t ss = scalar_size(kv->elem_type);
    if (kv->type != E8KV_GGUF_ARRAY || !ss) return E8KV_ERR(CORRUPTED);
    if (i >= kv->len) return E8KV_ERR(BAD_ARGUMENT);
    return load_num(kv->val + (size_t)i * ss, kv->elem_type, v); /* i * ss is inside the file */
}

size_t e8kv_gguf_get_arr_f32(const e8kv_gguf *g, const char *key, uint64_t i, float *out) {
    if (!out) return E8KV_ERR(BAD_ARGUMENT);
    num v;
    E8KV_RETURN_IF_ERROR(arr_num(g, key, i, &v));
    *out = (float)v.f;
    return 0;
}

size_t e8kv_gguf_get_arr_i64(const e8kv_gguf *g, const char *key, uint64_t i, int64_t *out) {
    if (!out) return E8KV_ERR(BAD_ARGUMENT);
    num v;
    E8KV_RETURN_IF_ERROR(arr_num(g, key, i, &v));
    if (v.is_int) {
        if (!v.is_neg && v.u > (uint64_t)INT64_MAX) return E8KV_ERR(RANGE);
        *out = v.i;
        return 0;
    }
    if (!(v.f >= -9223372036854775808.0 && v.f < 9223372036854775808.0) || v.f != (double)(int64_t)v.f)
        return E8KV_ERR(RANGE);
    *out = (int64_t)v.f;
    return 0;
}

/* ---------------------------------------------------------------- tensors */

size_t e8kv_gguf_n_tensors(const e8kv_gguf *g) { return g ? g->n_tensors : 0; }

const e8kv_gguf_tensor *e8kv_gguf_tensor_at(const e8kv_gguf *g, size_t i) {
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const e8kv_gguf_tensor *e8kv_gguf_find_tensor(const e8kv_gguf *g, const char *name) {
    if (!g || !name || !g->t_sorted) return NULL;
    size_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const e8kv_gguf_tensor *t = &g->tensors[g->t_sorted[mid]];
        const int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

size_t e8kv_gguf_tensor_to_f32(float *dst, size_t dst_capacity, const e8kv_gguf_tensor *t) {
    if (!t) return E8KV_ERR(BAD_ARGUMENT);
    if (!e8kv_ggml_can_dequant(t->type) || !t->data) return E8KV_ERR(UNSUPPORTED);
    return e8kv_ggml_dequant(dst, dst_capacity, t->data, (size_t)t->n_bytes, t->type, t->n_elements);
}

size_t e8kv_gguf_tensor_rows_to_f32(float *dst, size_t dst_capacity, const e8kv_gguf_tensor *t, uint64_t row0,
                                    uint64_t n_rows) {
    if (!t) return E8KV_ERR(BAD_ARGUMENT);
    if (!e8kv_ggml_can_dequant(t->type) || !t->data) return E8KV_ERR(UNSUPPORTED);
    const uint64_t total_rows = t->n_elements / t->ne[0];
    if (row0 > total_rows || n_rows > total_rows - row0) return E8KV_ERR(BAD_ARGUMENT);
    const size_t row_bytes = e8kv_ggml_row_bytes(t->type, t->ne[0]); /* divides n_bytes */
    const uint64_t n = n_rows * t->ne[0]; /* <= n_elements */
    return e8kv_ggml_dequant(dst, dst_capacity, (const uint8_t *)t->data + row0 * row_bytes,
                             (size_t)(n_rows * row_bytes), t->type, n);
}
