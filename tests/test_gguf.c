/* engine/gguf.c and engine/dequant.c: a synthetic GGUF built in memory round-trips its metadata and
 * tensors; malformed variants (every prefix, bad magic, versions, counts, lengths, offsets, dims, types,
 * duplicates, alignment) get their named error; the fuzz corpus replays without a crash.
 *
 * Also a helper mode for tests/py_gguf_ref.py (independent check against the gguf Python package):
 *   test_gguf --dump FILE.gguf OUT.f32 [TENSOR[@N_ROWS] ...]
 * writes the dequantized floats of the named tensors (default: all, in file order) back to back; with
 * @N_ROWS only the first N_ROWS rows (through e8kv_gguf_tensor_rows_to_f32). */
#define _GNU_SOURCE /* memmem */
#include "test_util.h"

#include "dequant.h"
#include "gguf.h"

#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- a tiny GGUF writer */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(buf *b, uint16_t v) {
    const uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(b, x, 2);
}
static void put_u32(buf *b, uint32_t v) {
    for (int i = 0; i < 4; i++) put_u8(b, (uint8_t)(v >> (8 * i)));
}
static void put_u64(buf *b, uint64_t v) {
    for (int i = 0; i < 8; i++) put_u8(b, (uint8_t)(v >> (8 * i)));
}
static void put_f32(buf *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void patch_u32(buf *b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[at + i] = (uint8_t)(v >> (8 * i));
}
static void patch_u64(buf *b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[at + i] = (uint8_t)(v >> (8 * i));
}

typedef struct {
    uint32_t version;
    uint32_t alignment;     /* 0: no general.alignment key (default 32) */
    int dup_key;            /* repeat a key */
    int dup_tensor;         /* second tensor named like the first */
    uint64_t q8_ne0;        /* ne[0] of the Q8_0 tensor (64) */
    int nest_depth;         /* depth of the nested array value (2) */
} opts;

/* Byte positions of interesting fields in the built file. */
typedef struct {
    size_t n_tensors, n_kv, first_key_len, alignment_val, arch_type;
    size_t t_name_len[3], t_n_dims[3], t_ne0[3], t_type[3], t_offset[3];
    size_t data;
} marks;

static const opts default_opts = {3, 0, 0, 0, 64, 2};

enum { N_T = 3 };
static const float t_f32[8] = {1.0f, -2.5f, 3.25f, 0.0f, -0.0f, 1e-30f, 65504.0f, -7.0f};
static const uint16_t t_f16[6] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000, 0x3555}; /* 1, -2, 2^-24, 65504, -0, 0.333 */

static void build(buf *b, const opts *o, marks *m) {
    memset(b, 0, sizeof *b);
    put_u32(b, 0x46554747u);
    put_u32(b, o->version);
    m->n_tensors = b->n;
    put_u64(b, N_T);
    m->n_kv = b->n;
    put_u64(b, 0); /* patched below */
    uint64_t n_kv = 0;

    m->first_key_len = b->n;
    put_str(b, "general.architecture"), put_u32(b, E8KV_GGUF_STRING), put_str(b, "llama"), n_kv++;
    m->arch_type = m->first_key_len + 8 + strlen("general.architecture");
    if (o->alignment) {
        put_str(b, "general.alignment"), put_u32(b, E8KV_GGUF_UINT32);
        m->alignment_val = b->n;
        put_u32(b, o->alignment), n_kv++;
    }
    put_str(b, "t.u8"), put_u32(b, E8KV_GGUF_UINT8), put_u8(b, 200), n_kv++;
    put_str(b, "t.i8"), put_u32(b, E8KV_GGUF_INT8), put_u8(b, 0xfe), n_kv++;
    put_str(b, "t.u16"), put_u32(b, E8KV_GGUF_UINT16), put_u16(b, 65535), n_kv++;
    put_str(b, "t.i16"), put_u32(b, E8KV_GGUF_INT16), put_u16(b, 0x8000), n_kv++;
    put_str(b, "t.u32"), put_u32(b, E8KV_GGUF_UINT32), put_u32(b, 4000000000u), n_kv++;
    put_str(b, "t.i32"), put_u32(b, E8KV_GGUF_INT32), put_u32(b, (uint32_t)-5), n_kv++;
    put_str(b, "t.f32"), put_u32(b, E8KV_GGUF_FLOAT32), put_f32(b, 1e-5f), n_kv++;
    put_str(b, "t.bool"), put_u32(b, E8KV_GGUF_BOOL), put_u8(b, 1), n_kv++;
    put_str(b, "t.u64"), put_u32(b, E8KV_GGUF_UINT64), put_u64(b, UINT64_MAX), n_kv++;
    put_str(b, "t.i64"), put_u32(b, E8KV_GGUF_INT64), put_u64(b, (uint64_t)INT64_MIN), n_kv++;
    {
        const double d = 10000.0;
        uint64_t u;
        memcpy(&u, &d, 8);
        put_str(b, "t.f64"), put_u32(b, E8KV_GGUF_FLOAT64), put_u64(b, u), n_kv++;
    }
    put_str(b, "t.empty"), put_u32(b, E8KV_GGUF_STRING), put_str(b, ""), n_kv++;
    put_str(b, "t.strs"), put_u32(b, E8KV_GGUF_ARRAY), put_u32(b, E8KV_GGUF_STRING), put_u64(b, 3);
    put_str(b, "<s>"), put_str(b, ""), put_str(b, "\xc4\xa0the"), n_kv++;
    put_str(b, "t.i32s"), put_u32(b, E8KV_GGUF_ARRAY), put_u32(b, E8KV_GGUF_INT32), put_u64(b, 4);
    put_u32(b, 1), put_u32(b, (uint32_t)-2), put_u32(b, 3), put_u32(b, 0x7fffffff), n_kv++;
    put_str(b, "t.f32s"), put_u32(b, E8KV_GGUF_ARRAY), put_u32(b, E8KV_GGUF_FLOAT32), put_u64(b, 2);
    put_f32(b, 0.5f), put_f32(b, -1.5f), n_kv++;
    /* nested: depth-1 arrays of arrays ending in a u8 array [7, 8] */
    put_str(b, "t.nested"), put_u32(b, E8KV_GGUF_ARRAY);
    for (int d = 1; d < o->nest_depth; d++) put_u32(b, E8KV_GGUF_ARRAY), put_u64(b, 1);
    put_u32(b, E8KV_GGUF_UINT8), put_u64(b, 2), put_u8(b, 7), put_u8(b, 8), n_kv++;
    if (o->dup_key) put_str(b, "t.u8"), put_u32(b, E8KV_GGUF_UINT8), put_u8(b, 1), n_kv++;
    patch_u64(b, m->n_kv, n_kv);

    /* tensors: "a" F32 (4, 2), "b" Q8_0 (q8_ne0, 2), "c" F16 (6) */
    const char *names[N_T] = {"a", o->dup_tensor ? "a" : "b", "c"};
    const uint32_t types[N_T] = {E8KV_GGML_F32, E8KV_GGML_Q8_0, E8KV_GGML_F16};
    const uint64_t ne0[N_T] = {4, o->q8_ne0, 6}, ne1[N_T] = {2, 2, 1};
    const uint32_t n_dims[N_T] = {2, 2, 1};
    const size_t align = o->alignment ? o->alignment : 32;
    size_t bytes[N_T], off = 0;
    for (int i = 0; i < N_T; i++) {
        bytes[i] = i == 0 ? 32 : i == 1 ? (size_t)(o->q8_ne0 / 32 * 2 * 34) : 12;
        m->t_name_len[i] = b->n;
        put_str(b, names[i]);
        m->t_n_dims[i] = b->n;
        put_u32(b, n_dims[i]);
        m->t_ne0[i] = b->n;
        put_u64(b, ne0[i]);
        if (n_dims[i] > 1) put_u64(b, ne1[i]);
        m->t_type[i] = b->n;
        put_u32(b, types[i]);
        m->t_offset[i] = b->n;
        put_u64(b, off);
        off += (bytes[i] + align - 1) / align * align;
    }
    while (b->n % align) put_u8(b, 0);
    m->data = b->n;
    /* a: F32 */
    for (int i = 0; i < 8; i++) put_f32(b, t_f32[i]);
    while ((b->n - m->data) % align) put_u8(b, 0);
    /* b: Q8_0 blocks with d = 0.5 (fp16 0x3800) or 0.25 (0x3400), q = j - 16 + block */
    for (size_t blk = 0; blk < o->q8_ne0 / 32 * 2; blk++) {
        put_u16(b, blk % 2 ? 0x3400 : 0x3800);
        for (int j = 0; j < 32; j++) put_u8(b, (uint8_t)(int8_t)(j - 16 + (int)blk));
    }
    while ((b->n - m->data) % align) put_u8(b, 0);
    /* c: F16, last: no trailing padding so that every strict prefix is short */
    for (int i = 0; i < 6; i++) put_u16(b, t_f16[i]);
}

static size_t open_buf(e8kv_gguf **g, const buf *b) { return e8kv_gguf_open_buffer(g, b->p, b->n); }

/* Open must fail with `code`, and must not leave a reader behind. */
#define expect_open_error(b, name)                                                                     \
    do {                                                                                               \
        e8kv_gguf *g_ = (e8kv_gguf *)1;                                                                \
        assert_error(open_buf(&g_, (b)), name);                                                        \
        assert_null(g_);                                                                               \
    } while (0)

/* ---------------------------------------------------------------- valid file */

static void check_valid(const e8kv_gguf *g, size_t align) {
    assert_int_equal(e8kv_gguf_version(g), 3);
    assert_int_equal(e8kv_gguf_alignment(g), align);
    assert_int_equal(e8kv_gguf_data_offset(g) % align, 0);

    const char *s;
    size_t len;
    assert_ok(e8kv_gguf_get_str(g, "general.architecture", &s, &len));
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    assert_ok(e8kv_gguf_get_str(g, "t.empty", &s, &len));
    assert_int_equal(len, 0);
    assert_int_equal(e8kv_gguf_kv_type(g, e8kv_gguf_find(g, "t.f64")), E8KV_GGUF_FLOAT64);
    assert_int_equal(e8kv_gguf_find(g, "nope"), -1);

    uint64_t u;
    assert_ok(e8kv_gguf_get_u64(g, "t.u8", &u)); assert_int_equal(u, 200);
    assert_ok(e8kv_gguf_get_u64(g, "t.u16", &u)); assert_int_equal(u, 65535);
    assert_ok(e8kv_gguf_get_u64(g, "t.u32", &u)); assert_int_equal(u, 4000000000u);
    assert_ok(e8kv_gguf_get_u64(g, "t.u64", &u)); assert_true(u == UINT64_MAX);
    assert_ok(e8kv_gguf_get_u64(g, "t.f64", &u)); assert_int_equal(u, 10000);
    assert_ok(e8kv_gguf_get_u64(g, "t.bool", &u)); assert_int_equal(u, 1);
    assert_error(e8kv_gguf_get_u64(g, "t.i8", &u), RANGE);
    assert_error(e8kv_gguf_get_u64(g, "t.i64", &u), RANGE);
    assert_error(e8kv_gguf_get_u64(g, "t.f32", &u), RANGE); /* 1e-5 is not an integer */
    assert_error(e8kv_gguf_get_u64(g, "general.architecture", &u), CORRUPTED);
    assert_error(e8kv_gguf_get_u64(g, "t.strs", &u), CORRUPTED);
    assert_error(e8kv_gguf_get_u64(g, "missing", &u), BAD_ARGUMENT);

    float f;
    assert_ok(e8kv_gguf_get_f32(g, "t.f32", &f)); assert_true(f == 1e-5f);
    assert_ok(e8kv_gguf_get_f32(g, "t.i16", &f)); assert_true(f == -32768.0f);
    assert_ok(e8kv_gguf_get_f32(g, "t.i32", &f)); assert_true(f == -5.0f);
    assert_ok(e8kv_gguf_get_f32(g, "t.f64", &f)); assert_true(f == 10000.0f);
    int bo;
    assert_ok(e8kv_gguf_get_bool(g, "t.bool", &bo)); assert_int_equal(bo, 1);
    assert_error(e8kv_gguf_get_bool(g, "t.empty", &bo), CORRUPTED);
    assert_error(e8kv_gguf_get_str(g, "t.u8", &s, &len), CORRUPTED);

    e8kv_gguf_type et;
    uint64_t n;
    assert_ok(e8kv_gguf_get_arr(g, "t.strs", &et, &n));
    assert_int_equal(et, E8KV_GGUF_STRING); assert_int_equal(n, 3);
    assert_ok(e8kv_gguf_get_arr_str(g, "t.strs", 0, &s, &len));
    assert_int_equal(len, 3), assert_memory_equal(s, "<s>", 3);
    assert_ok(e8kv_gguf_get_arr_str(g, "t.strs", 1, &s, &len)); assert_int_equal(len, 0);
    assert_ok(e8kv_gguf_get_arr_str(g, "t.strs", 2, &s, &len));
    assert_int_equal(len, 5), assert_memory_equal(s, "\xc4\xa0the", 5);
    assert_error(e8kv_gguf_get_arr_str(g, "t.strs", 3, &s, &len), BAD_ARGUMENT);
    assert_error(e8kv_gguf_get_arr_str(g, "t.i32s", 0, &s, &len), CORRUPTED);
    assert_error(e8kv_gguf_get_arr(g, "t.u8", &et, &n), CORRUPTED);

    int64_t i64;
    const int64_t want_i[4] = {1, -2, 3, 0x7fffffff};
    for (int i = 0; i < 4; i++) {
        assert_ok(e8kv_gguf_get_arr_i64(g, "t.i32s", (uint64_t)i, &i64));
        assert_true(i64 == want_i[i]);
    }
    assert_error(e8kv_gguf_get_arr_i64(g, "t.i32s", 4, &i64), BAD_ARGUMENT);
    assert_error(e8kv_gguf_get_arr_i64(g, "t.f32s", 0, &i64), RANGE); /* 0.5 */
    assert_ok(e8kv_gguf_get_arr_f32(g, "t.f32s", 1, &f)); assert_true(f == -1.5f);
    assert_ok(e8kv_gguf_get_arr_f32(g, "t.i32s", 1, &f)); assert_true(f == -2.0f);
    assert_error(e8kv_gguf_get_arr_f32(g, "t.strs", 0, &f), CORRUPTED);
    assert_ok(e8kv_gguf_get_arr(g, "t.nested", &et, &n));
    assert_int_equal(et, E8KV_GGUF_ARRAY); assert_int_equal(n, 1);

    /* enumeration reaches every key exactly once */
    assert_int_equal(e8kv_gguf_n_kv(g), align == 32 ? 17 : 18);
    for (long i = 0; i < (long)e8kv_gguf_n_kv(g); i++)
        assert_int_equal(e8kv_gguf_find(g, e8kv_gguf_kv_key(g, i)), i);
    assert_null(e8kv_gguf_kv_key(g, (long)e8kv_gguf_n_kv(g)));

    /* tensors */
    assert_int_equal(e8kv_gguf_n_tensors(g), 3);
    const e8kv_gguf_tensor *a = e8kv_gguf_find_tensor(g, "a"), *b = e8kv_gguf_find_tensor(g, "b"),
                           *c = e8kv_gguf_find_tensor(g, "c");
    assert_non_null(a), assert_non_null(b), assert_non_null(c);
    assert_null(e8kv_gguf_find_tensor(g, "d"));
    assert_ptr_equal(a, e8kv_gguf_tensor_at(g, 0));
    assert_null(e8kv_gguf_tensor_at(g, 3));
    assert_int_equal(a->n_dims, 2), assert_int_equal(a->ne[0], 4); assert_int_equal(a->ne[1], 2);
    assert_int_equal(a->ne[2], 1), assert_int_equal(a->n_elements, 8); assert_int_equal(a->n_bytes, 32);
    assert_int_equal(b->type, E8KV_GGML_Q8_0); assert_int_equal(b->n_bytes, 4 * 34);
    assert_int_equal(c->n_dims, 1); assert_int_equal(c->n_elements, 6);

    float out[128];
    assert_int_equal(e8kv_gguf_tensor_to_f32(out, 128, a), 8);
    assert_memory_equal(out, t_f32, sizeof t_f32); /* bit-exact, -0 included */
    assert_int_equal(e8kv_gguf_tensor_to_f32(out, 128, b), 128);
    for (int blk = 0; blk < 4; blk++)
        for (int j = 0; j < 32; j++)
            assert_true(out[32 * blk + j] == (float)(j - 16 + blk) * (blk % 2 ? 0.25f : 0.5f));
    assert_int_equal(e8kv_gguf_tensor_to_f32(out, 128, c), 6);
    const float want_c[6] = {1.0f, -2.0f, 0x1p-24f, 65504.0f, -0.0f, 0.333251953125f};
    assert_memory_equal(out, want_c, sizeof want_c);
    assert_error(e8kv_gguf_tensor_to_f32(out, 5, c), DST_TOO_SMALL);
    assert_error(e8kv_gguf_tensor_to_f32(out, 5, NULL), BAD_ARGUMENT);

    /* row access equals the matching slice of the whole tensor */
    float rows[64];
    assert_int_equal(e8kv_gguf_tensor_to_f32(out, 128, b), 128);
    assert_int_equal(e8kv_gguf_tensor_rows_to_f32(rows, 64, b, 1, 1), 64);
    assert_memory_equal(rows, out + 64, 64 * sizeof(float));
    assert_error(e8kv_gguf_tensor_rows_to_f32(rows, 64, b, 1, 2), BAD_ARGUMENT);
    assert_error(e8kv_gguf_tensor_rows_to_f32(rows, 64, b, 3, 0), BAD_ARGUMENT);
}

static void test_valid_roundtrip(void **state) {
    (void)state;
    buf b;
    marks m;
    build(&b, &default_opts, &m);
    e8kv_gguf *g = NULL;
    assert_ok(open_buf(&g, &b));
    check_valid(g, 32);
    e8kv_gguf_close(g);
    free(b.p);

    /* a 64-byte alignment moves the data, and the reader follows it */
    opts o = default_opts;
    o.alignment = 64;
    build(&b, &o, &m);
    assert_ok(open_buf(&g, &b));
    check_valid(g, 64);
    e8kv_gguf_close(g);
    /* version 2 has the same layout */
    patch_u32(&b, 4, 2);
    assert_ok(open_buf(&g, &b));
    assert_int_equal(e8kv_gguf_version(g), 2);
    e8kv_gguf_close(g);
    free(b.p);
}

static void test_open_file(void **state) {
    (void)state;
    buf b;
    marks m;
    build(&b, &default_opts, &m);
    char path[] = "/tmp/e8kv_test_gguf_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    e8kv_gguf *g = NULL;
    assert_ok(e8kv_gguf_open(&g, path));
    check_valid(g, 32);
    e8kv_gguf_close(g);
    assert_int_equal(truncate(path, (off_t)b.n - 1), 0);
    assert_error(e8kv_gguf_open(&g, path), TRUNCATED);
    assert_null(g);
    assert_int_equal(truncate(path, 0), 0);
    assert_error(e8kv_gguf_open(&g, path), TRUNCATED);
    unlink(path);
    assert_error(e8kv_gguf_open(&g, path), IO);
    assert_error(e8kv_gguf_open(&g, "/tmp"), IO);
    assert_error(e8kv_gguf_open(NULL, path), BAD_ARGUMENT);
    assert_error(e8kv_gguf_open_buffer(&g, NULL, 10), BAD_ARGUMENT);
    e8kv_gguf_close(NULL);
    free(b.p);
}

/* ---------------------------------------------------------------- malformed files */

static void test_every_prefix_truncated(void **state) {
    (void)state;
    buf b;
    marks m;
    build(&b, &default_opts, &m);
    for (size_t n = 0; n < b.n; n++) {
        /* a fresh copy of exactly n bytes, so ASan sees any read past the end */
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, b.p, n);
        e8kv_gguf *g = (e8kv_gguf *)1;
        const size_t r = e8kv_gguf_open_buffer(&g, copy, n);
        if (!e8kv_is_error(r) || e8kv_get_error_code(r) != E8KV_ERROR_TRUNCATED)
            fail_msg("prefix of %zu / %zu bytes: %s", n, b.n, e8kv_is_error(r) ? e8kv_error_name(r) : "opened");
        assert_null(g);
        free(copy);
    }
    free(b.p);
}

static void test_header_errors(void **state) {
    (void)state;
    buf b;
    marks m;
    build(&b, &default_opts, &m);
    b.p[0] = 'X';
    expect_open_error(&b, CORRUPTED);
    b.p[0] = 'G';
    const uint32_t bad_versions[] = {0, 1, 4, 0x03000000u /* big-endian v3 */};
    for (size_t i = 0; i < sizeof bad_versions / sizeof *bad_versions; i++) {
        patch_u32(&b, 4, bad_versions[i]);
        expect_open_error(&b, VERSION);
    }
    patch_u32(&b, 4, 3);
    /* counts: absurd ones are corrupt, plausible ones that the bytes cannot hold are truncation */
    patch_u64(&b, m.n_tensors, 1ull << 40);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.n_tensors, UINT64_MAX);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.n_tensors, 100000);
    expect_open_error(&b, TRUNCATED);
    patch_u64(&b, m.n_tensors, N_T);
    patch_u64(&b, m.n_kv, 1ull << 40);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.n_kv, 100000);
    expect_open_error(&b, TRUNCATED);
    free(b.p);
}

static void test_length_errors(void **state) {
    (void)state;
    buf b;
    marks m;
    build(&b, &default_opts, &m);
    const uint64_t lens[] = {b.n, b.n - m.first_key_len - 8 + 1, 1ull << 62, UINT64_MAX};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        patch_u64(&b, m.first_key_len, lens[i]); /* key string past EOF */
        expect_open_error(&b, TRUNCATED);
    }
    patch_u64(&b, m.first_key_len, strlen("general.architecture"));
    patch_u64(&b, m.t_name_len[2], UINT64_MAX); /* tensor name past EOF */
    expect_open_error(&b, TRUNCATED);
    patch_u64(&b, m.t_name_len[2], 64); /* longer than ggml's 63-byte names: fits the file, still bad */
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.t_name_len[2], 1);
    /* unknown value type */
    patch_u32(&b, m.arch_type, 13);
    expect_open_error(&b, CORRUPTED);
    patch_u32(&b, m.arch_type, E8KV_GGUF_STRING);
    /* a NUL inside a key */
    b.p[m.first_key_len + 8 + 3] = 0;
    expect_open_error(&b, CORRUPTED);
    b.p[m.first_key_len + 8 + 3] = 'e';
    e8kv_gguf *g = NULL;
    assert_ok(open_buf(&g, &b)); /* all patches undone */
    e8kv_gguf_close(g);
    free(b.p);
}

static void test_array_errors(void **state) {
    (void)state;
    buf b;
    marks m;
    opts o = default_opts;
    o.nest_depth = 8; /* the deepest allowed */
    build(&b, &o, &m);
    e8kv_gguf *g = NULL;
    assert_ok(open_buf(&g, &b));
    e8kv_gguf_close(g);
    free(b.p);
    o.nest_depth = 9;
    build(&b, &o, &m);
    expect_open_error(&b, CORRUPTED);
    free(b.p);

    /* array counts past EOF: strings, numbers, nested arrays */
    build(&b, &default_opts, &m);
    const char *keys[] = {"t.strs", "t.i32s", "t.nested"};
    for (int k = 0; k < 3; k++) {
        const uint8_t *hit = memmem(b.p, b.n, keys[k], strlen(keys[k]));
        assert_non_null(hit);
        const size_t count_at = (size_t)(hit - b.p) + strlen(keys[k]) + 4 + 4;
        const uint64_t saved = b.p[count_at];
        const uint64_t counts[] = {b.n, 1ull << 61, UINT64_MAX};
        for (int c = 0; c < 3; c++) {
            patch_u64(&b, count_at, counts[c]);
            expect_open_error(&b, TRUNCATED);
        }
        patch_u64(&b, count_at, saved);
        /* element type out of range */
        patch_u32(&b, count_at - 4, 13);
        expect_open_error(&b, CORRUPTED);
        patch_u32(&b, count_at - 4, k == 0 ? E8KV_GGUF_STRING : k == 1 ? E8KV_GGUF_INT32 : E8KV_GGUF_ARRAY);
    }
    assert_ok(open_buf(&g, &b));
    e8kv_gguf_close(g);
    free(b.p);
}

static void test_tensor_errors(void **state) {
    (void)state;
    buf b;
    marks m;
    build(&b, &default_opts, &m);
    e8kv_gguf *g = NULL;
    /* data layout: a at 0 (32 B), b at 32 (136 B, padded to 160), c at 192 (12 B) */
    /* offsets: past EOF, wrapping, misaligned, overlapping, leaving a gap (not the layout ggml writes) */
    const uint64_t offs[] = {1ull << 40, UINT64_MAX - 31, 32 + 8, 0, 64};
    for (size_t i = 0; i < sizeof offs / sizeof *offs; i++) {
        patch_u64(&b, m.t_offset[1], offs[i]);
        expect_open_error(&b, CORRUPTED);
    }
    patch_u64(&b, m.t_offset[1], 32);
    patch_u64(&b, m.t_offset[2], 1ull << 40);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.t_offset[2], 224);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.t_offset[2], 192);
    assert_ok(open_buf(&g, &b));
    e8kv_gguf_close(g);

    /* dims: too many, zero, product overflowing int64, one dim absurd for the file */
    patch_u32(&b, m.t_n_dims[0], 5);
    expect_open_error(&b, CORRUPTED);
    patch_u32(&b, m.t_n_dims[0], 2);
    patch_u64(&b, m.t_ne0[0], 0);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.t_ne0[0], 1ull << 62); /* times ne1 = 2 overflows int64 */
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.t_ne0[0], UINT64_MAX);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.t_ne0[0], 1ull << 40); /* fits int64, not the file */
    expect_open_error(&b, TRUNCATED);
    patch_u64(&b, m.t_ne0[0], 4);
    /* Q8_0 row of 48 values is not whole blocks */
    patch_u64(&b, m.t_ne0[1], 48);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.t_ne0[1], 64);
    /* a known but block-incompatible type for a (4, 2) tensor */
    patch_u32(&b, m.t_type[0], E8KV_GGML_Q4_K);
    expect_open_error(&b, CORRUPTED);
    patch_u32(&b, m.t_type[0], E8KV_GGML_F32);
    assert_ok(open_buf(&g, &b));
    e8kv_gguf_close(g);
    free(b.p);

    opts o = default_opts;
    o.dup_tensor = 1;
    build(&b, &o, &m);
    expect_open_error(&b, CORRUPTED);
    free(b.p);
    o = default_opts;
    o.dup_key = 1;
    build(&b, &o, &m);
    expect_open_error(&b, CORRUPTED);
    free(b.p);
}

static void test_unknown_type(void **state) {
    (void)state;
    buf b;
    marks m;
    build(&b, &default_opts, &m);
    /* unknown id on the last tensor: metadata and other tensors stay readable */
    patch_u32(&b, m.t_type[2], 200);
    e8kv_gguf *g = NULL;
    assert_ok(open_buf(&g, &b));
    const char *s;
    size_t len;
    assert_ok(e8kv_gguf_get_str(g, "general.architecture", &s, &len));
    const e8kv_gguf_tensor *c = e8kv_gguf_find_tensor(g, "c");
    assert_non_null(c);
    float out[128];
    assert_error(e8kv_gguf_tensor_to_f32(out, 128, c), UNSUPPORTED);
    assert_error(e8kv_gguf_tensor_rows_to_f32(out, 128, c, 0, 1), UNSUPPORTED);
    assert_int_equal(e8kv_gguf_tensor_to_f32(out, 128, e8kv_gguf_find_tensor(g, "b")), 128);
    e8kv_gguf_close(g);
    /* a known type the engine does not dequantize (I8, 1 byte per value: 6 bytes fit) */
    patch_u32(&b, m.t_type[2], 24);
    assert_ok(open_buf(&g, &b));
    assert_error(e8kv_gguf_tensor_to_f32(out, 128, e8kv_gguf_find_tensor(g, "c")), UNSUPPORTED);
    e8kv_gguf_close(g);
    /* unknown id in the middle: later tensors only need aligned, increasing offsets */
    patch_u32(&b, m.t_type[2], E8KV_GGML_F16);
    patch_u32(&b, m.t_type[1], 200);
    assert_ok(open_buf(&g, &b));
    assert_int_equal(e8kv_gguf_tensor_to_f32(out, 128, e8kv_gguf_find_tensor(g, "c")), 6);
    e8kv_gguf_close(g);
    patch_u64(&b, m.t_offset[2], 1ull << 40);
    expect_open_error(&b, CORRUPTED);
    patch_u64(&b, m.t_offset[2], 0);
    expect_open_error(&b, CORRUPTED); /* before the unknown tensor */
    patch_u64(&b, m.t_offset[2], 32);
    expect_open_error(&b, CORRUPTED); /* at the unknown tensor, which holds at least one byte */
    free(b.p);
}

static void test_alignment(void **state) {
    (void)state;
    const uint32_t bad[] = {0, 3, 48, 1u << 31};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        buf b;
        marks m;
        opts o = default_opts;
        o.alignment = 64;
        build(&b, &o, &m);
        patch_u32(&b, m.alignment_val, bad[i]);
        expect_open_error(&b, CORRUPTED);
        free(b.p);
    }
}

/* ---------------------------------------------------------------- dequant kernels (spec examples) */

static void test_dequant_blocks(void **state) {
    (void)state;
    float y[256];
    uint8_t x[256];
    /* Q4_0: d = 2 (0x4000); byte j = (hi << 4) | lo -> values lo - 8 and hi - 8 at j and j + 16 */
    memset(x, 0, sizeof x);
    x[0] = 0x00, x[1] = 0x40;
    for (int j = 0; j < 16; j++) x[2 + j] = (uint8_t)((15 - j) << 4 | j);
    assert_int_equal(e8kv_ggml_dequant(y, 32, x, 18, E8KV_GGML_Q4_0, 32), 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 2.0f * (float)(j - 8));
        assert_true(y[j + 16] == 2.0f * (float)(7 - j));
    }
    /* Q5_0: the fifth bit of value j is qh bit j; qh = 0x80000001 sets it for values 0 and 31 */
    memset(x, 0, sizeof x);
    x[1] = 0x3c; /* d = 1 */
    x[2] = 0x01, x[5] = 0x80;
    assert_int_equal(e8kv_ggml_dequant(y, 32, x, 22, E8KV_GGML_Q5_0, 32), 32);
    assert_true(y[0] == 0.0f && y[1] == -16.0f && y[31] == 0.0f && y[30] == -16.0f);
    /* error paths */
    assert_error(e8kv_ggml_dequant(y, 32, x, 22, E8KV_GGML_Q5_0, 31), BAD_ARGUMENT);
    assert_error(e8kv_ggml_dequant(y, 32, x, 21, E8KV_GGML_Q5_0, 32), SRC_SIZE);
    assert_error(e8kv_ggml_dequant(y, 31, x, 22, E8KV_GGML_Q5_0, 32), DST_TOO_SMALL);
    assert_error(e8kv_ggml_dequant(y, 32, x, 22, 10 /* Q2_K */, 256), UNSUPPORTED);
    assert_error(e8kv_ggml_dequant(y, 32, x, 22, 1000, 32), UNSUPPORTED);
    assert_int_equal(e8kv_ggml_row_bytes(E8KV_GGML_Q6_K, 512), 420);
    assert_int_equal(e8kv_ggml_row_bytes(E8KV_GGML_Q6_K, 500), 0);
    assert_int_equal(e8kv_ggml_row_bytes(E8KV_GGML_Q8_0, UINT64_MAX / 32 * 32), 0); /* overflow */
    assert_string_equal(e8kv_ggml_type_name(E8KV_GGML_Q4_K), "Q4_K");
    assert_string_equal(e8kv_ggml_type_name(4), "unknown");
}

static void test_fp16_exhaustive(void **state) {
    (void)state;
#if defined(__FLT16_MAX__)
    /* every half against the compiler's own conversion */
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 r;
        const uint16_t hh = (uint16_t)h;
        memcpy(&r, &hh, 2);
        const float want = (float)r, got = e8kv_ggml_fp16_to_f32(hh);
        if (isnan(want)) assert_true(isnan(got));
        else assert_memory_equal(&got, &want, 4);
    }
#else
    skip();
#endif
}

/* ---------------------------------------------------------------- fuzz corpus replay */

/* Open, read every metadata value and every tensor through the API; errors are fine, crashes are not. */
static void touch_all(const uint8_t *data, size_t n) {
    e8kv_gguf *g = NULL;
    if (e8kv_is_error(e8kv_gguf_open_buffer(&g, data, n))) return;
    for (long i = 0; i < (long)e8kv_gguf_n_kv(g); i++) {
        const char *key = e8kv_gguf_kv_key(g, i), *s;
        size_t len;
        uint64_t u, na;
        float f;
        int bo;
        int64_t v;
        e8kv_gguf_type et;
        (void)e8kv_gguf_get_u64(g, key, &u), (void)e8kv_gguf_get_f32(g, key, &f);
        (void)e8kv_gguf_get_bool(g, key, &bo), (void)e8kv_gguf_get_str(g, key, &s, &len);
        if (!e8kv_is_error(e8kv_gguf_get_arr(g, key, &et, &na)))
            for (uint64_t j = 0; j < na && j < 64; j++) {
                (void)e8kv_gguf_get_arr_str(g, key, j, &s, &len);
                (void)e8kv_gguf_get_arr_f32(g, key, j, &f), (void)e8kv_gguf_get_arr_i64(g, key, j, &v);
            }
    }
    for (size_t i = 0; i < e8kv_gguf_n_tensors(g); i++) {
        const e8kv_gguf_tensor *t = e8kv_gguf_tensor_at(g, i);
        assert_ptr_equal(e8kv_gguf_find_tensor(g, t->name), t);
        if (t->n_elements > (1u << 20)) continue;
        float *y = malloc((size_t)t->n_elements * sizeof *y);
        (void)e8kv_gguf_tensor_to_f32(y, (size_t)t->n_elements, t);
        free(y);
    }
    e8kv_gguf_close(g);
}

static void test_fuzz_corpus(void **state) {
    (void)state;
    const char *src = getenv("E8KV_SOURCE_DIR");
    if (!src) skip();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/gguf", src);
    DIR *d = opendir(dir);
    if (!d) skip();
    int n_files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        const long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *data = malloc(n > 0 ? (size_t)n : 1);
        assert_int_equal(fread(data, 1, (size_t)n, f), (size_t)n);
        fclose(f);
        touch_all(data, (size_t)n);
        free(data);
        n_files++;
    }
    closedir(d);
    print_message("replayed %d corpus files\n", n_files);
}

/* ---------------------------------------------------------------- --dump helper for py_gguf_ref.py */

static int dump(int argc, char **argv) {
    e8kv_gguf *g = NULL;
    size_t r = e8kv_gguf_open(&g, argv[2]);
    if (e8kv_is_error(r)) {
        fprintf(stderr, "%s: %s\n", argv[2], e8kv_error_name(r));
        return 1;
    }
    FILE *out = fopen(argv[3], "wb");
    if (!out) return 1;
    const size_t n_out = argc > 4 ? (size_t)(argc - 4) : e8kv_gguf_n_tensors(g);
    int rc = 0;
    for (size_t i = 0; i < n_out && rc == 0; i++) {
        char name[256] = "";
        uint64_t n_rows = 0; /* 0: whole tensor */
        if (argc > 4) {
            snprintf(name, sizeof name, "%s", argv[4 + i]);
            char *at = strchr(name, '@');
            if (at) *at = 0, n_rows = strtoull(at + 1, NULL, 10);
        }
        const e8kv_gguf_tensor *t = argc > 4 ? e8kv_gguf_find_tensor(g, name) : e8kv_gguf_tensor_at(g, i);
        if (!t) {
            fprintf(stderr, "no tensor %s\n", name);
            rc = 1;
            break;
        }
        const uint64_t n = n_rows ? n_rows * t->ne[0] : t->n_elements;
        float *y = malloc((size_t)n * sizeof *y);
        r = n_rows ? e8kv_gguf_tensor_rows_to_f32(y, (size_t)n, t, 0, n_rows)
                   : e8kv_gguf_tensor_to_f32(y, (size_t)n, t);
        if (e8kv_is_error(r)) {
            fprintf(stderr, "%s: %s\n", t->name, e8kv_error_name(r));
            rc = 1;
        } else if (fwrite(y, sizeof *y, (size_t)n, out) != n) {
            rc = 1;
        }
        free(y);
    }
    if (fclose(out) != 0) rc = 1;
    e8kv_gguf_close(g);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "--dump") == 0) return dump(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_roundtrip),   cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_every_prefix_truncated), cmocka_unit_test(test_header_errors),
        cmocka_unit_test(test_length_errors),     cmocka_unit_test(test_array_errors),
        cmocka_unit_test(test_tensor_errors),     cmocka_unit_test(test_unknown_type),
        cmocka_unit_test(test_alignment),         cmocka_unit_test(test_dequant_blocks),
        cmocka_unit_test(test_fp16_exhaustive),   cmocka_unit_test(test_fuzz_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
