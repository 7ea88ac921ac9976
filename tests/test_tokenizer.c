/* engine/tokenizer: llama2.c tokenizer.bin against golden ids from sentencepiece / a Python port of
 * llama2.c (tests/data/tokenizer_golden.h, scripts/gen_tokenizer_golden.py), malformed tokenizer.bin files,
 * and small hand-built vocabularies for the byte-level BPE rules (merge order, added tokens, byte map). */
#include "test_util.h"

#include "tokenizer.h"

#include "data/tokenizer_golden.h"

#include <math.h>

/* ---------------------------------------------------------------- llama2.c tokenizer.bin */

static e8kv_tokenizer *load_tok512(void) {
    const char *path = test_data_path("stories260K/tok512.bin");
    if (!path) return NULL;
    e8kv_tokenizer *t = NULL;
    assert_ok(e8kv_tokenizer_from_llama2c(&t, path, 512));
    assert_non_null(t);
    return t;
}

static void test_llama2c_golden(void **state) {
    (void)state;
    e8kv_tokenizer *t = load_tok512();
    if (!t) skip();
    assert_int_equal(e8kv_tokenizer_vocab_size(t), 512);
    assert_int_equal(e8kv_tokenizer_bos(t), 1);
    assert_int_equal(e8kv_tokenizer_eos(t), 2);
    for (size_t c = 0; c < sizeof k_tok512_golden / sizeof k_tok512_golden[0]; c++) {
        const tok_golden *g = &k_tok512_golden[c];
        int32_t ids[128];
        const size_t n =
            e8kv_tokenizer_encode(t, ids, 128, g->text, strlen(g->text), -1); /* BOS by default */
        assert_ok(n);
        if (n != (size_t)g->n_ids) fail_msg("'%s': %zu tokens, expected %d", g->text, n, g->n_ids);
        for (int i = 0; i < g->n_ids; i++)
            if (ids[i] != g->ids[i])
                fail_msg("'%s': token %d is %d, expected %d", g->text, i, ids[i], g->ids[i]);
        /* without BOS: the same ids minus the first */
        const size_t m = e8kv_tokenizer_encode(t, ids, 128, g->text, strlen(g->text), 0);
        assert_int_equal(m, n - 1);
        for (size_t i = 0; i < m; i++)
            assert_int_equal(ids[i], g->ids[i + 1]);
        /* pieces concatenate back to the text with the dummy-prefix space */
        char buf[512];
        size_t len = 0;
        for (size_t i = 0; i < m; i++) {
            const char *p;
            const size_t pl = e8kv_tokenizer_piece(t, ids[i], &p);
            assert_ok(pl);
            assert_true(len + pl < sizeof buf);
            memcpy(buf + len, p, pl);
            len += pl;
        }
        assert_int_equal(len, strlen(g->text) + 1);
        assert_int_equal(buf[0], ' ');
        assert_memory_equal(buf + 1, g->text, len - 1);
    }
    e8kv_tokenizer_free(t);
}

static void test_llama2c_edges(void **state) {
    (void)state;
    e8kv_tokenizer *t = load_tok512();
    if (!t) skip();
    int32_t ids[16];
    /* empty text: only BOS (or nothing); NULL is fine for zero bytes */
    assert_int_equal(e8kv_tokenizer_encode(t, ids, 16, "", 0, 1), 1);
    assert_int_equal(ids[0], 1);
    assert_int_equal(e8kv_tokenizer_encode(t, ids, 16, NULL, 0, 0), 0);
    assert_int_equal(e8kv_tokenizer_encode(t, NULL, 0, NULL, 0, 0), 0);
    /* capacity too small: the full count comes back, nothing is written past capacity */
    for (int i = 0; i < 16; i++)
        ids[i] = -7;
    const char *text = "Once upon a time";
    assert_int_equal(e8kv_tokenizer_encode(t, ids, 2, text, strlen(text), 1), 5);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 403);
    assert_int_equal(ids[2], -7);
    assert_int_equal(e8kv_tokenizer_encode(t, NULL, 0, text, strlen(text), 1), 5);
    /* bytes that are no UTF-8 become <0xXX> tokens (llama2.c: id = byte + 3) */
    assert_int_equal(e8kv_tokenizer_encode(t, ids, 16, "\xff\xc3", 2, 0), 3);
    assert_int_equal(ids[0], 410);
    assert_int_equal(ids[1], 0xff + 3);
    assert_int_equal(ids[2], 0xc3 + 3);
    const char *p;
    assert_int_equal(e8kv_tokenizer_piece(t, 0xff + 3, &p), 1);
    assert_int_equal((unsigned char)p[0], 0xff);
    assert_int_equal(e8kv_tokenizer_piece(t, 13, &p), 1); /* <0x0A> */
    assert_int_equal(p[0], '\n');
    /* bad arguments */
    assert_error(e8kv_tokenizer_piece(t, 512, &p), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_piece(t, -1, &p), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_encode(t, NULL, 4, "a", 1, 0), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_encode(t, ids, 16, NULL, 1, 0), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_encode(NULL, ids, 16, "a", 1, 0), BAD_ARGUMENT);
    e8kv_tokenizer_free(t);
    e8kv_tokenizer_free(NULL);
}

/* A well-formed tokenizer.bin: max_len, then (score, len, bytes) records. */
static size_t put_record(uint8_t *dst, float score, int32_t len, const char *bytes) {
    memcpy(dst, &score, 4);
    memcpy(dst + 4, &len, 4);
    if (len > 0) memcpy(dst + 8, bytes, (size_t)len);
    return 8 + (size_t)(len > 0 ? len : 0);
}

static size_t small_bin(uint8_t *buf) {
    const int32_t max_len = 5;
    memcpy(buf, &max_len, 4);
    size_t n = 4;
    n += put_record(buf + n, 0.0f, 5, "<unk>");
    n += put_record(buf + n, 0.0f, 3, "<s>");
    n += put_record(buf + n, 0.0f, 4, "</s>");
    n += put_record(buf + n, -1.0f, 1, "a");
    n += put_record(buf + n, -2.0f, 1, "b");
    n += put_record(buf + n, -3.0f, 1, " ");
    n += put_record(buf + n, -0.5f, 2, "ab");
    n += put_record(buf + n, -0.25f, 2, " a");
    return n;
}

static void test_llama2c_small_vocab(void **state) {
    (void)state;
    uint8_t buf[256];
    const size_t n = small_bin(buf);
    e8kv_tokenizer *t = NULL;
    assert_ok(e8kv_tokenizer_from_llama2c_buffer(&t, buf, n, 8));
    int32_t ids[8];
    /* " ab": ' '+'a' (-0.25) beats 'a'+'b' (-0.5); then " a"+"b" is no token */
    assert_int_equal(e8kv_tokenizer_encode(t, ids, 8, "ab", 2, 0), 2);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 4);
    /* no byte tokens here: an unknown character is one <unk> */
    assert_int_equal(e8kv_tokenizer_encode(t, ids, 8, "b\xc3\xa9", 3, 0), 3);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 4);
    assert_int_equal(ids[2], 0);
    e8kv_tokenizer_free(t);
    /* vocab_size 0 reads every record */
    assert_ok(e8kv_tokenizer_from_llama2c_buffer(&t, buf, n, 0));
    assert_int_equal(e8kv_tokenizer_vocab_size(t), 8);
    e8kv_tokenizer_free(t);
}

static void test_llama2c_malformed(void **state) {
    (void)state;
    uint8_t buf[256];
    const size_t n = small_bin(buf);
    e8kv_tokenizer *t = (e8kv_tokenizer *)&t; /* must be reset to NULL on failure */
    /* every truncation */
    for (size_t k = 0; k < n; k++) {
        assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, buf, k, 8), TRUNCATED);
        assert_null(t);
    }
    /* fewer records than the model's vocabulary / bytes left over */
    assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, buf, n, 9), TRUNCATED);
    assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, buf, n, 7), SRC_SIZE);
    /* negative length */
    uint8_t bad[256];
    memcpy(bad, buf, n);
    const int32_t neg = -1;
    memcpy(bad + 4 + 4, &neg, 4);
    assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, bad, n, 8), CORRUPTED);
    /* a length past the end of the file (but within max_token_length) */
    memcpy(bad, buf, n);
    const int32_t max_len = 1 << 20, past = (int32_t)n;
    memcpy(bad, &max_len, 4);
    memcpy(bad + 4 + 4, &past, 4);
    assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, bad, n, 8), TRUNCATED);
    /* a length over max_token_length */
    memcpy(bad, buf, n);
    const int32_t six = 6;
    memcpy(bad + 4 + 4, &six, 4);
    assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, bad, n, 8), CORRUPTED);
    /* max_token_length <= 0 */
    memcpy(bad, buf, n);
    const int32_t zero = 0;
    memcpy(bad, &zero, 4);
    assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, bad, n, 8), CORRUPTED);
    /* NaN score */
    memcpy(bad, buf, n);
    const float nan = NAN;
    memcpy(bad + 4, &nan, 4);
    assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, bad, n, 8), CORRUPTED);
    /* arguments and files */
    assert_error(e8kv_tokenizer_from_llama2c_buffer(NULL, buf, n, 8), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_from_llama2c_buffer(&t, NULL, 4, 8), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_from_llama2c(&t, "/nonexistent/tok.bin", 8), IO);
    assert_null(t);
    /* the real file with the wrong vocabulary size */
    const char *path = test_data_path("stories260K/tok512.bin");
    if (path) {
        assert_error(e8kv_tokenizer_from_llama2c(&t, path, 513), TRUNCATED);
        assert_error(e8kv_tokenizer_from_llama2c(&t, path, 511), SRC_SIZE);
    }
}

/* ---------------------------------------------------------------- hand-built vocabularies */

/* GPT-2 byte -> character (bytes_to_unicode), written out independently of the library's table. */
static size_t gpt2_char(char *dst, int b) {
    int cp = b, extra = 0;
    for (int x = 0; x < 256; x++) {
        const int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
        if (!printable) {
            if (x == b) cp = 256 + extra;
            extra++;
        }
    }
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    dst[0] = (char)(0xC0 | (cp >> 6));
    dst[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* ids 0..255: byte tokens; then added tokens and merged tokens. */
typedef struct {
    char store[4096];
    size_t used;
    const char *tokens[300];
    size_t lens[300];
    int32_t types[300];
    size_t n;
    const char *merges[16];
    size_t merge_lens[16];
    size_t n_merges;
} mini_vocab;

static void add_token(mini_vocab *m, const char *s, size_t len, int32_t type) {
    memcpy(m->store + m->used, s, len);
    m->tokens[m->n] = m->store + m->used;
    m->lens[m->n] = len;
    m->types[m->n] = type;
    m->used += len;
    m->n++;
}

static void add_merge(mini_vocab *m, const char *s) {
    m->merges[m->n_merges] = s;
    m->merge_lens[m->n_merges] = strlen(s);
    m->n_merges++;
}

static e8kv_tokenizer_vocab mini_bpe(mini_vocab *m, const char *pre) {
    memset(m, 0, sizeof *m);
    for (int b = 0; b < 256; b++) {
        char c[2];
        add_token(m, c, gpt2_char(c, b), E8KV_TOKEN_NORMAL);
    }
    add_token(m, "<|x|>", 5, E8KV_TOKEN_CONTROL);       /* 256 */
    add_token(m, "<|x|>y", 6, E8KV_TOKEN_USER_DEFINED); /* 257: longer, same start */
    add_token(m, "ab", 2, E8KV_TOKEN_NORMAL);           /* 258 */
    add_token(m, "bc", 2, E8KV_TOKEN_NORMAL);           /* 259 */
    add_token(m, "abc", 3, E8KV_TOKEN_NORMAL);          /* 260 */
    add_token(m,
              "\xc4\xa0"
              "a",
              3, E8KV_TOKEN_NORMAL);          /* 261: " a" */
    add_token(m, "aa", 2, E8KV_TOKEN_NORMAL); /* 262 */
    add_merge(m, "b c");                      /* rank 0 */
    add_merge(m, "a b");                      /* rank 1 */
    add_merge(m, "a bc");                     /* rank 2 */
    add_merge(m, "\xc4\xa0 a");
    add_merge(m, "a a");
    e8kv_tokenizer_vocab v = {
        .model = "gpt2",
        .pre = pre,
        .n_vocab = m->n,
        .tokens = m->tokens,
        .token_lens = m->lens,
        .token_types = m->types,
        .n_merges = m->n_merges,
        .merges = m->merges,
        .merge_lens = m->merge_lens,
        .bos = 256,
        .eos = 256,
        .unk = -1,
    };
    return v;
}

static size_t enc(const e8kv_tokenizer *t, const char *s, int32_t *ids) {
    return e8kv_tokenizer_encode(t, ids, 32, s, strlen(s), 0);
}

static void test_bpe_rules(void **state) {
    (void)state;
    mini_vocab m;
    e8kv_tokenizer_vocab v = mini_bpe(&m, "gpt2");
    e8kv_tokenizer *t = NULL;
    assert_ok(e8kv_tokenizer_create(&t, &v));
    int32_t ids[32];
    /* "abc": b+c has rank 0 so it merges first, then a+bc -> abc (a+b never happens) */
    assert_int_equal(enc(t, "abc", ids), 1);
    assert_int_equal(ids[0], 260);
    /* "aaa": equal ranks merge leftmost first: (aa)(a) */
    assert_int_equal(enc(t, "aaa", ids), 2);
    assert_int_equal(ids[0], 262);
    assert_int_equal(ids[1], 'a');
    /* the pre-tokenizer keeps " a" together, ", " splits off */
    assert_int_equal(enc(t, "c a", ids), 2);
    assert_int_equal(ids[0], 'c');
    assert_int_equal(ids[1], 261);
    /* added tokens: leftmost-longest match in the raw text, never merged with neighbours */
    assert_int_equal(enc(t, "a<|x|>yab<|x|>", ids), 4);
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], 257);
    assert_int_equal(ids[2], 258);
    assert_int_equal(ids[3], 256);
    /* pieces: byte tokens map back to their byte, added tokens are raw */
    const char *p;
    assert_int_equal(e8kv_tokenizer_piece(t, ' ', &p), 1);
    assert_int_equal(p[0], ' ');
    assert_int_equal(e8kv_tokenizer_piece(t, 0xA0, &p), 1);
    assert_int_equal((unsigned char)p[0], 0xA0);
    assert_int_equal(e8kv_tokenizer_piece(t, 261, &p), 2);
    assert_memory_equal(p, " a", 2);
    assert_int_equal(e8kv_tokenizer_piece(t, 256, &p), 5);
    assert_memory_equal(p, "<|x|>", 5);
    /* every byte value round-trips, invalid UTF-8 included */
    char all[256];
    for (int b = 0; b < 256; b++)
        all[b] = (char)(b ? b : 1);
    int32_t many[512];
    const size_t n = e8kv_tokenizer_encode(t, many, 512, all, 256, 0);
    assert_true(n <= 256);
    char back[256];
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t pl = e8kv_tokenizer_piece(t, many[i], &p);
        assert_true(len + pl <= 256);
        memcpy(back + len, p, pl);
        len += pl;
    }
    assert_int_equal(len, 256);
    assert_memory_equal(back, all, 256);
    /* a byte the vocabulary has no token for is dropped, and counted so that callers can warn */
    assert_int_equal(e8kv_tokenizer_unknown_bytes(t, "aqbq", 4), 0);
    e8kv_tokenizer_free(t);
    v = mini_bpe(&m, "gpt2");
    m.tokens['q'] = "qq"; /* no token is "q" any more */
    m.lens['q'] = 2;
    assert_ok(e8kv_tokenizer_create(&t, &v));
    assert_int_equal(e8kv_tokenizer_unknown_bytes(t, "aqbq", 4), 2);
    assert_int_equal(enc(t, "aqcq", ids), 2);
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], 'c');
    e8kv_tokenizer_free(t);

    /* smollm: digits are single tokens even inside a number run */
    v = mini_bpe(&m, "smollm");
    assert_ok(e8kv_tokenizer_create(&t, &v));
    assert_int_equal(enc(t, "a12", ids), 3);
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], '1');
    assert_int_equal(ids[2], '2');
    e8kv_tokenizer_free(t);
}

static void test_create_errors(void **state) {
    (void)state;
    mini_vocab m;
    e8kv_tokenizer *t = NULL;
    e8kv_tokenizer_vocab v = mini_bpe(&m, "deepseek-llm");
    assert_error(e8kv_tokenizer_create(&t, &v), UNSUPPORTED); /* unknown pre-tokenizer: no fallback */
    assert_null(t);
    const char *const known[] = {"llama-bpe", "llama3", "llama-v3", "qwen2", "smollm"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        v = mini_bpe(&m, known[i]);
        assert_ok(e8kv_tokenizer_create(&t, &v));
        e8kv_tokenizer_free(t);
        t = NULL;
    }
    v = mini_bpe(&m, NULL);
    assert_error(e8kv_tokenizer_create(&t, &v), UNSUPPORTED);
    v = mini_bpe(&m, "gpt-2"); /* llama.cpp's name for the plain GPT-2 regex */
    assert_ok(e8kv_tokenizer_create(&t, &v));
    e8kv_tokenizer_free(t);
    t = NULL;
    v = mini_bpe(&m, "gpt2");
    v.model = "bert";
    assert_error(e8kv_tokenizer_create(&t, &v), UNSUPPORTED);
    v = mini_bpe(&m, "gpt2");
    v.bos = (int32_t)v.n_vocab;
    assert_error(e8kv_tokenizer_create(&t, &v), CORRUPTED);
    v = mini_bpe(&m, "gpt2");
    m.merges[0] = "bc"; /* no separator */
    m.merge_lens[0] = 2;
    assert_error(e8kv_tokenizer_create(&t, &v), CORRUPTED);
    v = mini_bpe(&m, "gpt2");
    v.n_vocab = 0;
    assert_error(e8kv_tokenizer_create(&t, &v), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_create(&t, NULL), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_create(NULL, &v), BAD_ARGUMENT);
    v = mini_bpe(&m, "gpt2");
    v.model = "llama"; /* SentencePiece needs scores */
    assert_error(e8kv_tokenizer_create(&t, &v), BAD_ARGUMENT);
    assert_error(e8kv_tokenizer_from_gguf(&t, NULL), BAD_ARGUMENT);
    assert_null(t);
}

/* SentencePiece vocabulary as GGUF stores it: U+2581 for spaces, typed byte tokens, user-defined tokens. */
static void test_spm_escaped(void **state) {
    (void)state;
    const char *tokens[] = {"<unk>", "<s>", "</s>",          "<0x0A>",         "\xe2\x96\x81",
                            "h",     "i",   "\xe2\x96\x81h", "\xe2\x96\x81hi", "<tool>"};
    const int32_t types[] = {2, 3, 3, 6, 1, 1, 1, 1, 1, 4};
    const float scores[] = {0, 0, 0, 0, -5, -5, -5, -2, -1, 0};
    size_t lens[10];
    for (int i = 0; i < 10; i++)
        lens[i] = strlen(tokens[i]);
    const e8kv_tokenizer_vocab v = {
        .model = "llama",
        .n_vocab = 10,
        .tokens = tokens,
        .token_lens = lens,
        .scores = scores,
        .token_types = types,
        .bos = 1,
        .eos = 2,
        .unk = 0,
        .add_bos = 1,
        .add_space_prefix = 1,
        .spm_escaped = 1,
    };
    e8kv_tokenizer *t = NULL;
    assert_ok(e8kv_tokenizer_create(&t, &v));
    int32_t ids[16];
    /* "hi<tool>\nx": BOS, "▁hi", <tool> matched whole, <0x0A>, x unknown -> unk (only one byte token) */
    const char *s = "hi<tool>\nx";
    assert_int_equal(e8kv_tokenizer_encode(t, ids, 16, s, strlen(s), -1), 5);
    const int32_t want[] = {1, 8, 9, 3, 0};
    assert_memory_equal(ids, want, sizeof want);
    /* "<s>" is control, so it is text here: characters unknown to this vocabulary */
    const char *p;
    assert_int_equal(e8kv_tokenizer_piece(t, 8, &p), 3);
    assert_memory_equal(p, " hi", 3);
    assert_int_equal(e8kv_tokenizer_piece(t, 3, &p), 1);
    assert_int_equal(p[0], '\n');
    e8kv_tokenizer_free(t);
}

/* Random bytes (valid or not as UTF-8, with spaces, digits and added-token fragments mixed in): pieces
 * concatenate back to exactly the input, for the byte-level BPE and for llama2.c after its dummy space. */
static void test_random_round_trip(void **state) {
    (void)state;
    mini_vocab m;
    e8kv_tokenizer_vocab v = mini_bpe(&m, "smollm");
    e8kv_tokenizer *bpe = NULL;
    assert_ok(e8kv_tokenizer_create(&bpe, &v));
    e8kv_tokenizer *l2c = load_tok512(); /* NULL when the data is missing: that half is skipped */
    static const char *const frags[] = {" ",     "  ",  "\n", "12",       "'s",
                                        "<|x|>", "<|x", "ab", "\xc3\xa9", "\xf0\x9f\x98\x80"};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int iter = 0; iter < 2000; iter++) {
        char text[256];
        size_t n = 0;
        const size_t target = (size_t)(iter % 97);
        while (n < target) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char *f = frags[(x >> 8) % 10];
            if ((x & 3) == 0 && n + strlen(f) <= sizeof text) {
                memcpy(text + n, f, strlen(f));
                n += strlen(f);
            } else {
                text[n++] = (char)(x >> 32);
            }
        }
        const e8kv_tokenizer *tks[2] = {bpe, l2c};
        for (int k = 0; k < 2; k++) {
            if (!tks[k]) continue;
            int32_t ids[512];
            const size_t c = e8kv_tokenizer_encode(tks[k], ids, 512, text, n, 0);
            assert_ok(c);
            assert_true(c <= 512);
            char back[300];
            size_t len = 0;
            for (size_t i = 0; i < c; i++) {
                const char *p;
                const size_t pl = e8kv_tokenizer_piece(tks[k], ids[i], &p);
                assert_ok(pl);
                assert_true(len + pl <= sizeof back);
                memcpy(back + len, p, pl);
                len += pl;
            }
            const size_t skip = k == 1 && n > 0; /* llama2.c's dummy-prefix space */
            assert_int_equal(len, n + skip);
            if (skip) assert_int_equal(back[0], ' ');
            assert_memory_equal(back + skip, text, n);
        }
    }
    e8kv_tokenizer_free(bpe);
    e8kv_tokenizer_free(l2c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2c_golden),      cmocka_unit_test(test_llama2c_edges),
        cmocka_unit_test(test_llama2c_small_vocab), cmocka_unit_test(test_llama2c_malformed),
        cmocka_unit_test(test_bpe_rules),           cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_spm_escaped),         cmocka_unit_test(test_random_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
