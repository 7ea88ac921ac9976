/* Tokenizers that reproduce their references token for token.
 *
 *  - Byte-level BPE ("gpt2"): GPT-2's bytes_to_unicode mapping and pre-tokenizer regex
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *    matched by hand (no regex engine), optionally preceded by Hugging Face's Digits(individual_digits)
 *    split ("smollm"); then per word the merge with the lowest rank is applied first, leftmost on ties (the
 *    order of Hugging Face's BPE Word::merge_all). Added tokens (CONTROL, USER_DEFINED) are cut out of the
 *    raw text first, leftmost-longest, like Hugging Face's added-token matcher.
 *    "llama-bpe" (also "llama3", "llama-v3": llama.cpp's names for LLAMA_VOCAB_PRE_TYPE_LLAMA3) uses
 *    Llama 3's regex instead, also matched by hand:
 *      (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *      \s*[\r\n]+|\s+(?!\S)|\s+
 *    and "qwen2" the same with \p{N} for \p{N}{1,3}. The reference is Hugging Face's Split(Regex, Isolated),
 *    whose Oniguruma engine folds case by Unicode (U+017F LONG S matches s). Llama 3 also sets
 *    ignore_merges (its tokenizer.json; llama.cpp likewise): a word whose whole text is a token is that
 *    token, merges or not.
 *  - SentencePiece BPE ("llama", llama2.c): symbols are UTF-8 characters; the adjacent pair whose
 *    concatenation is a piece with the highest score is merged, leftmost on ties (sentencepiece
 *    bpe_model.cc, llama2.c encode()); characters that end up outside the vocabulary become <0xXX> tokens.
 *
 * Both merge loops keep candidate pairs in a binary heap and drop stale entries when popped, so a text of
 * n bytes costs O(n log n) rather than llama2.c's O(n^2) rescans. */
#include "tokenizer.h"

#include "unicode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_BAD_UTF8 0xFFFFFFFFu

enum { KIND_SPM = 1, KIND_BPE = 2 };
enum { PRE_GPT2 = 1, PRE_SMOLLM = 2, PRE_LLAMA3 = 3, PRE_QWEN2 = 4 };

struct e8kv_tokenizer {
    int kind, pre;
    size_t n_vocab;
    char *text; /* matching texts, concatenated: SPM with spaces, BPE byte-mapped */
    size_t *text_off;
    uint32_t *text_len;
    char *piece; /* decoded bytes, concatenated */
    size_t *piece_off;
    uint32_t *piece_len;
    float *scores;  /* n_vocab */
    uint8_t *types; /* n_vocab */
    int32_t *slots; /* open-addressing hash text -> first id with that text, -1 empty */
    size_t slot_mask;
    uint64_t *merge_key; /* BPE: (left << 32 | right) -> rank, result; UINT64_MAX empty */
    uint32_t *merge_rank;
    int32_t *merge_id;
    size_t merge_mask;
    int32_t byte_id[256];  /* BPE: the token of each byte; SPM: the <0xXX> fallback (or unk, or -1) */
    uint16_t byte_cp[256]; /* BPE: the code point standing for each byte (gpt2_byte_map) */
    size_t max_text;       /* the longest matching text, in bytes */
    int ignore_merges;     /* BPE: a word that is a token whole is that token (Llama 3's ignore_merges) */
    int32_t bos, eos, unk;
    int add_bos, add_space_prefix;
    int32_t *specials; /* ids matched whole in the text, grouped by first byte, longest first */
    uint32_t special_start[257];
};

/* ---------------------------------------------------------------- helpers */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) { /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

/* Id of the first token whose matching text is s[0, n), or -1. */
static int32_t lookup_text(const e8kv_tokenizer *t, const char *s, size_t n) {
    for (size_t h = hash_bytes(s, n) & t->slot_mask;; h = (h + 1) & t->slot_mask) {
        const int32_t id = t->slots[h];
        if (id < 0) return -1;
        if (t->text_len[id] == n && memcmp(t->text + t->text_off[id], s, n) == 0) return id;
    }
}

static int lookup_merge(const e8kv_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    const uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t h = hash_u64(key) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        if (t->merge_key[h] == UINT64_MAX) return 0;
        if (t->merge_key[h] == key) {
            *rank = t->merge_rank[h];
            *id = t->merge_id[h];
            return 1;
        }
    }
}

/* One strictly valid UTF-8 sequence at s (n > 0 bytes left): its length and code point, or length 1 and
 * TOK_BAD_UTF8 for a byte that does not start one (overlong, surrogate, past U+10FFFF, cut short). */
static size_t utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    const uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0)
        len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        len = 4, v = c & 0x07, min = 0x10000;
    else {
        *cp = TOK_BAD_UTF8;
        return 1;
    }
    if (len > n) {
        *cp = TOK_BAD_UTF8;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = TOK_BAD_UTF8;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = TOK_BAD_UTF8;
        return 1;
    }
    *cp = v;
    return len;
}

static size_t utf8_put(char *dst, uint32_t cp) {
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    dst[0] = (char)(0xE0 | (cp >> 12));
    dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 map to U+0100.. in
 * byte order, so every byte is a visible character. */
static void gpt2_byte_map(uint32_t cp_of_byte[256]) {
    uint32_t extra = 0;
    for (int b = 0; b < 256; b++) {
        const int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp_of_byte[b] = printable ? (uint32_t)b : 256 + extra++;
    }
}

static int parse_byte_token(const char *s, size_t n) { /* "<0xXX>" -> XX, else -1 */
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        const char c = s[i];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ---------------------------------------------------------------- construction */

void e8kv_tokenizer_free(e8kv_tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->types);
    free(t->slots);
    free(t->merge_key);
    free(t->merge_rank);
    free(t->merge_id);
    free(t->specials);
    free(t);
}

static int is_special(const e8kv_tokenizer *t, size_t id) {
    const int ty = t->types[id];
    if (t->kind == KIND_BPE) return ty == E8KV_TOKEN_CONTROL || ty == E8KV_TOKEN_USER_DEFINED;
    return ty == E8KV_TOKEN_USER_DEFINED;
}

static size_t build_specials(e8kv_tokenizer *t) {
    size_t count[256] = {0}, n = 0;
    for (size_t i = 0; i < t->n_vocab; i++)
        if (is_special(t, i) && t->text_len[i] > 0) count[(uint8_t)t->text[t->text_off[i]]]++, n++;
    t->specials = malloc((n ? n : 1) * sizeof *t->specials);
    if (!t->specials) return E8KV_ERR(OUT_OF_MEMORY);
    t->special_start[0] = 0;
    for (int b = 0; b < 256; b++)
        t->special_start[b + 1] = t->special_start[b] + (uint32_t)count[b];
    uint32_t fill[256];
    memcpy(fill, t->special_start, sizeof fill);
    for (size_t i = 0; i < t->n_vocab; i++)
        if (is_special(t, i) && t->text_len[i] > 0)
            t->specials[fill[(uint8_t)t->text[t->text_off[i]]]++] = (int32_t)i;
    for (int b = 0; b < 256; b++) { /* longest first within each group (insertion sort: groups are tiny) */
        int32_t *g = t->specials + t->special_start[b];
        const size_t m = t->special_start[b + 1] - t->special_start[b];
        for (size_t i = 1; i < m; i++) {
            const int32_t v = g[i];
            size_t j = i;
            while (j > 0 && t->text_len[g[j - 1]] < t->text_len[v])
                g[j] = g[j - 1], j--;
            g[j] = v;
        }
    }
    return 0;
}

static size_t build_merges(e8kv_tokenizer *t, const e8kv_tokenizer_vocab *v) {
    t->merge_mask = pow2_at_least(2 * v->n_merges + 1) - 1;
    t->merge_key = malloc((t->merge_mask + 1) * sizeof *t->merge_key);
    t->merge_rank = malloc((t->merge_mask + 1) * sizeof *t->merge_rank);
    t->merge_id = malloc((t->merge_mask + 1) * sizeof *t->merge_id);
    if (!t->merge_key || !t->merge_rank || !t->merge_id) return E8KV_ERR(OUT_OF_MEMORY);
    memset(t->merge_key, 0xFF, (t->merge_mask + 1) * sizeof *t->merge_key);
    char *buf = NULL;
    size_t buf_cap = 0;
    for (size_t r = 0; r < v->n_merges; r++) {
        const char *m = v->merges[r];
        const size_t n = v->merge_lens[r];
        if (!m && n) return free(buf), E8KV_ERR(BAD_ARGUMENT);
        /* "left right": the separator is the first space after the first byte (as llama.cpp reads it) */
        const char *sp = n > 1 ? memchr(m + 1, ' ', n - 1) : NULL;
        if (!sp) return free(buf), E8KV_ERR(CORRUPTED);
        const size_t nl = (size_t)(sp - m), nr = n - nl - 1;
        const int32_t a = lookup_text(t, m, nl), b = lookup_text(t, sp + 1, nr);
        if (nl + nr > buf_cap) {
            free(buf);
            buf_cap = 2 * (nl + nr);
            buf = malloc(buf_cap);
            if (!buf) return E8KV_ERR(OUT_OF_MEMORY);
        }
        memcpy(buf, m, nl);
        memcpy(buf + nl, sp + 1, nr);
        const int32_t ab = lookup_text(t, buf, nl + nr);
        if (a < 0 || b < 0 || ab < 0) continue; /* can never apply: its parts or result are not tokens */
        uint32_t rank;
        int32_t id;
        if (lookup_merge(t, a, b, &rank, &id)) continue; /* a repeated pair keeps its first (lowest) rank */
        const uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        size_t h = hash_u64(key) & t->merge_mask;
        while (t->merge_key[h] != UINT64_MAX)
            h = (h + 1) & t->merge_mask;
        t->merge_key[h] = key;
        t->merge_rank[h] = (uint32_t)r;
        t->merge_id[h] = ab;
    }
    free(buf);
    return 0;
}

static size_t create(e8kv_tokenizer *t, const e8kv_tokenizer_vocab *v) {
    const size_t n = v->n_vocab;
    if (!strcmp(v->model, "gpt2"))
        t->kind = KIND_BPE;
    else if (!strcmp(v->model, "llama"))
        t->kind = KIND_SPM;
    else
        return E8KV_ERR(UNSUPPORTED);
    if (t->kind == KIND_BPE) {
        if (!v->pre) return E8KV_ERR(UNSUPPORTED);
        if (!strcmp(v->pre, "gpt2") || !strcmp(v->pre, "gpt-2"))
            t->pre = PRE_GPT2; /* llama.cpp: "gpt-2" */
        else if (!strcmp(v->pre, "smollm"))
            t->pre = PRE_SMOLLM;
        else if (!strcmp(v->pre, "llama-bpe") || !strcmp(v->pre, "llama3") || !strcmp(v->pre, "llama-v3")) {
            /* llama.cpp's names for LLAMA_VOCAB_PRE_TYPE_LLAMA3, whose tokenizer.json sets ignore_merges */
            t->pre = PRE_LLAMA3;
            t->ignore_merges = 1;
        } else if (!strcmp(v->pre, "qwen2"))
            t->pre = PRE_QWEN2;
        else
            return E8KV_ERR(UNSUPPORTED);
        if (v->n_merges && (!v->merges || !v->merge_lens)) return E8KV_ERR(BAD_ARGUMENT);
    } else if (!v->scores) {
        return E8KV_ERR(BAD_ARGUMENT);
    }
    const int32_t specials[3] = {v->bos, v->eos, v->unk};
    for (int i = 0; i < 3; i++)
        if (specials[i] < -1 || (specials[i] >= 0 && (size_t)specials[i] >= n)) return E8KV_ERR(CORRUPTED);
    t->n_vocab = n;
    t->bos = v->bos;
    t->eos = v->eos;
    t->unk = v->unk;
    t->add_bos = v->add_bos != 0;
    t->add_space_prefix = t->kind == KIND_SPM && v->add_space_prefix;

    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!v->tokens[i] && v->token_lens[i]) return E8KV_ERR(BAD_ARGUMENT);
        if (v->token_lens[i] > UINT32_MAX) return E8KV_ERR(CORRUPTED);
        total += v->token_lens[i];
    }
    t->text = malloc(total + 1);
    t->piece = malloc(total + 1);
    t->text_off = malloc(n * sizeof *t->text_off);
    t->piece_off = malloc(n * sizeof *t->piece_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->piece_len = malloc(n * sizeof *t->piece_len);
    t->scores = calloc(n, sizeof *t->scores);
    t->types = malloc(n);
    t->slot_mask = pow2_at_least(2 * n + 1) - 1;
    t->slots = malloc((t->slot_mask + 1) * sizeof *t->slots);
    if (!t->text || !t->piece || !t->text_off || !t->piece_off || !t->text_len || !t->piece_len ||
        !t->scores || !t->types || !t->slots)
        return E8KV_ERR(OUT_OF_MEMORY);
    if (t->kind == KIND_SPM) memcpy(t->scores, v->scores, n * sizeof *t->scores);
    for (size_t i = 0; i < n; i++) {
        const int32_t ty = v->token_types ? v->token_types[i] : E8KV_TOKEN_NORMAL;
        t->types[i] = (uint8_t)(ty >= 1 && ty <= 6 ? ty : E8KV_TOKEN_NORMAL);
    }

    /* matching texts (SPM: U+2581 -> space) and decoded pieces */
    uint32_t cp_of_byte[256];
    int byte_of_cp[324];
    gpt2_byte_map(cp_of_byte);
    for (int i = 0; i < 324; i++)
        byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++)
        byte_of_cp[cp_of_byte[b]] = b;
    size_t to = 0, po = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = v->tokens[i];
        const size_t len = v->token_lens[i];
        t->text_off[i] = to;
        if (t->kind == KIND_SPM && v->spm_escaped) {
            for (size_t k = 0; k < len;) {
                if (k + 3 <= len && !memcmp(s + k, "\xE2\x96\x81", 3))
                    t->text[to++] = ' ', k += 3;
                else
                    t->text[to++] = s[k++];
            }
        } else if (len) {
            memcpy(t->text + to, s, len);
            to += len;
        }
        t->text_len[i] = (uint32_t)(to - t->text_off[i]);
        if (t->text_len[i] > t->max_text) t->max_text = t->text_len[i];
        const char *txt = t->text + t->text_off[i];
        const size_t tl = t->text_len[i];
        t->piece_off[i] = po;
        if (t->kind == KIND_SPM) {
            const int b = parse_byte_token(txt, tl);
            if (b >= 0 && (t->types[i] == E8KV_TOKEN_BYTE || !v->token_types)) {
                if (!v->token_types) t->types[i] = E8KV_TOKEN_BYTE;
                t->piece[po++] = (char)b;
            } else {
                memcpy(t->piece + po, txt, tl);
                po += tl;
            }
        } else {
            /* undo the byte mapping when every character is a mapped byte (added tokens are stored raw) */
            size_t k = 0, q = po;
            int mapped = t->types[i] == E8KV_TOKEN_NORMAL || t->types[i] == E8KV_TOKEN_BYTE;
            while (mapped && k < tl) {
                uint32_t cp;
                k += utf8_next((const uint8_t *)txt + k, tl - k, &cp);
                if (cp >= 324 || byte_of_cp[cp] < 0)
                    mapped = 0;
                else
                    t->piece[q++] = (char)byte_of_cp[cp];
            }
            if (mapped) {
                po = q;
            } else {
                memcpy(t->piece + po, txt, tl);
                po += tl;
            }
        }
        t->piece_len[i] = (uint32_t)(po - t->piece_off[i]);
    }

    for (size_t h = 0; h <= t->slot_mask; h++)
        t->slots[h] = -1;
    for (size_t i = 0; i < n; i++) {
        const char *s = t->text + t->text_off[i];
        const size_t len = t->text_len[i];
        if (lookup_text(t, s, len) >= 0) continue; /* duplicate text: the first id wins */
        size_t h = hash_bytes(s, len) & t->slot_mask;
        while (t->slots[h] >= 0)
            h = (h + 1) & t->slot_mask;
        t->slots[h] = (int32_t)i;
    }

    for (int b = 0; b < 256; b++) {
        char buf[8];
        if (t->kind == KIND_BPE) {
            t->byte_cp[b] = (uint16_t)cp_of_byte[b];
            const size_t len = utf8_put(buf, cp_of_byte[b]);
            t->byte_id[b] = lookup_text(t, buf, len); /* -1: the byte is dropped, as Hugging Face does */
        } else {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            const int32_t id = lookup_text(t, buf, 6);
            t->byte_id[b] = id >= 0 && t->types[id] == E8KV_TOKEN_BYTE ? id : t->unk;
        }
    }
    if (t->kind == KIND_SPM && t->unk < 0) /* an unknown character needs byte tokens or unk */
        for (int b = 0; b < 256; b++)
            if (t->byte_id[b] < 0) return E8KV_ERR(CORRUPTED);
    if (t->kind == KIND_BPE) E8KV_RETURN_IF_ERROR(build_merges(t, v));
    return build_specials(t);
}

size_t e8kv_tokenizer_create(e8kv_tokenizer **out, const e8kv_tokenizer_vocab *v) {
    if (!out) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    if (!v || !v->model || !v->n_vocab || !v->tokens || !v->token_lens) return E8KV_ERR(BAD_ARGUMENT);
    if (v->n_vocab >= (size_t)INT32_MAX) return E8KV_ERR(UNSUPPORTED);
    e8kv_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return E8KV_ERR(OUT_OF_MEMORY);
    const size_t r = create(t, v);
    if (e8kv_is_error(r)) {
        e8kv_tokenizer_free(t);
        return r;
    }
    *out = t;
    return 0;
}

/* ---------------------------------------------------------------- encoding */

typedef struct {
    float key; /* pops lowest first: BPE merge rank (exact below 2^24), SPM minus the piece score */
    uint32_t left, right;
    int32_t a;      /* BPE: id of the left symbol when pushed; SPM: byte length of the merged piece */
    int32_t merged; /* the token the pair becomes */
} cand;

typedef struct {
    int32_t *ids;
    size_t capacity, n;
    int oom;
    /* scratch sized for the whole text; SPM reuses cp as symbol length and off as symbol start */
    uint32_t *cp, *off;
    uint8_t *flg;
    int32_t *sym_id, *prev, *next;
    cand *heap;
    size_t n_heap, heap_cap;
} enc;

static void emit(enc *e, int32_t id) {
    if (e->n < e->capacity) e->ids[e->n] = id;
    e->n++;
}

static int cand_less(const cand *x, const cand *y) {
    return x->key < y->key || (x->key == y->key && x->left < y->left);
}

static void heap_push(enc *e, cand c) {
    if (e->n_heap == e->heap_cap) {
        const size_t cap = e->heap_cap ? 2 * e->heap_cap : 1024;
        cand *h = realloc(e->heap, cap * sizeof *h);
        if (!h) {
            e->oom = 1;
            return;
        }
        e->heap = h;
        e->heap_cap = cap;
    }
    size_t i = e->n_heap++;
    while (i > 0) {
        const size_t p = (i - 1) / 2;
        if (!cand_less(&c, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = c;
}

static cand heap_pop(enc *e) {
    const cand top = e->heap[0];
    const cand last = e->heap[--e->n_heap];
    const size_t n = e->n_heap;
    size_t i = 0;
    for (;;) {
        const size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t m = l;
        if (l + 1 < n && cand_less(&e->heap[l + 1], &e->heap[l])) m = l + 1;
        if (!cand_less(&e->heap[m], &last)) break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* ---- byte-level BPE */

static void bpe_try(const e8kv_tokenizer *t, enc *e, int32_t l, int32_t r) {
    uint32_t rank;
    int32_t id;
    if (lookup_merge(t, e->sym_id[l], e->sym_id[r], &rank, &id))
        heap_push(e, (cand){(float)rank, (uint32_t)l, (uint32_t)r, e->sym_id[l], id});
}

/* One pre-tokenized word of m bytes: start from its byte tokens, apply the lowest-ranked merge first. */
static void bpe_word(const e8kv_tokenizer *t, enc *e, const uint8_t *w, size_t n_bytes) {
    /* ignore_merges (Hugging Face's BPE): the whole word's byte-mapped text first; a word of more bytes than
     * the longest token's text (each byte maps to 1 or 2 UTF-8 bytes: code points below 0x200) is none */
    if (t->ignore_merges && n_bytes > 1 && n_bytes <= t->max_text) {
        char local[512], *text = 2 * n_bytes <= sizeof local ? local : malloc(2 * n_bytes);
        if (!text) {
            e->oom = 1;
            return;
        }
        size_t len = 0;
        for (size_t k = 0; k < n_bytes; k++)
            len += utf8_put(text + len, t->byte_cp[w[k]]);
        const int32_t id = lookup_text(t, text, len);
        if (text != local) free(text);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    size_t m = 0; /* bytes without a token are left out (Hugging Face's BPE without unk does the same) */
    for (size_t k = 0; k < n_bytes; k++)
        if (t->byte_id[w[k]] >= 0) e->sym_id[m++] = t->byte_id[w[k]];
    if (m <= 1) {
        if (m) emit(e, e->sym_id[0]);
        return;
    }
    for (size_t k = 0; k < m; k++) {
        e->prev[k] = (int32_t)k - 1;
        e->next[k] = k + 1 < m ? (int32_t)k + 1 : -1;
    }
    e->n_heap = 0;
    for (size_t k = 0; k + 1 < m; k++)
        bpe_try(t, e, (int32_t)k, (int32_t)k + 1);
    while (e->n_heap) {
        const cand c = heap_pop(e);
        const int32_t l = (int32_t)c.left, r = (int32_t)c.right;
        /* stale when the left symbol changed or no longer borders r (merged symbols only grow, so an
         * unchanged id at an unchanged neighbour means the same pair) */
        if (e->sym_id[l] != c.a || e->next[l] != r) continue;
        uint32_t rank;
        int32_t id;
        if (!lookup_merge(t, e->sym_id[l], e->sym_id[r], &rank, &id) || id != c.merged) continue;
        e->sym_id[l] = c.merged;
        e->sym_id[r] = -1;
        e->next[l] = e->next[r];
        if (e->next[r] >= 0) e->prev[e->next[r]] = l;
        if (e->prev[l] >= 0) bpe_try(t, e, e->prev[l], l);
        if (e->next[l] >= 0) bpe_try(t, e, l, e->next[l]);
    }
    for (int32_t k = 0; k >= 0; k = e->next[k])
        emit(e, e->sym_id[k]);
}

static unsigned char_flags(uint32_t cp) {
    if (cp < 128) {
        if ((uint32_t)((cp | 32) - 'a') < 26) return E8KV_UNICODE_LETTER;
        if ((uint32_t)(cp - '0') < 10) return E8KV_UNICODE_NUMBER;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return E8KV_UNICODE_SPACE;
        return 0;
    }
    return cp == TOK_BAD_UTF8 ? 0 : e8kv_unicode_flags(cp);
}

enum { CL_L = E8KV_UNICODE_LETTER, CL_N = E8KV_UNICODE_NUMBER, CL_S = E8KV_UNICODE_SPACE };

/* 's|'t|'re|'ve|'m|'ll|'d at i: the end of the match, or 0. fold: the (?i:...) form, which in Oniguruma (the
 * regex engine of Hugging Face tokenizers) also takes U+017F LONG S for s; no other code point folds to one
 * of these letters (checked over all of Unicode against tokenizers 0.23). */
static size_t contraction_end(const uint32_t *cp, size_t i, size_t b, int fold) {
    if (cp[i] != '\'' || i + 1 >= b) return 0;
    uint32_t c1 = cp[i + 1], c2 = i + 2 < b ? cp[i + 2] : 0;
    if (fold) {
        c1 = c1 == 0x17F ? 's' : (uint32_t)(c1 - 'A') < 26 ? c1 | 32 : c1;
        c2 = (uint32_t)(c2 - 'A') < 26 ? c2 | 32 : c2;
    }
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
    return 0;
}

/* '\s+(?!\S)|\s+' at the space i: the whole run, less its last character when a non-space follows (that one
 * starts the next word), unless the run is that one character. */
static size_t space_run_end(const uint8_t *f, size_t i, size_t b) {
    size_t k = i + 1;
    while (k < b && (f[k] & CL_S))
        k++;
    return k < b && k - i >= 2 ? k - 1 : k;
}

/* The GPT-2 regex over characters [a, b) of the current fragment, each match handed to bpe_word. */
static void gpt2_split(const e8kv_tokenizer *t, enc *e, const uint8_t *s, size_t a, size_t b) {
    const uint8_t *f = e->flg;
    size_t i = a;
    while (i < b) {
        size_t k = contraction_end(e->cp, i, b, 0);
        if (!k) {
            const size_t j = e->cp[i] == ' ' && i + 1 < b ? i + 1 : i; /* the optional leading space */
            const unsigned fj = f[j];
            if (fj & CL_L) { /* ' ?\p{L}+' */
                for (k = j + 1; k < b && (f[k] & CL_L); k++) {
                }
            } else if (fj & CL_N) { /* ' ?\p{N}+' */
                for (k = j + 1; k < b && (f[k] & CL_N); k++) {
                }
            } else if (!(fj & CL_S)) { /* ' ?[^\s\p{L}\p{N}]+' */
                for (k = j + 1; k < b && !(f[k] & (CL_L | CL_N | CL_S)); k++) {
                }
            } else {
                k = space_run_end(f, i, b);
            }
        }
        bpe_word(t, e, s + e->off[i], e->off[k] - e->off[i]);
        i = k;
    }
}

/* The Llama 3 regex (qwen2: max_digits 1, i.e. \p{N} for \p{N}{1,3}) over characters [a, b):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
 *   \s+(?!\S)|\s+
 * Alternatives are tried in order, as the regex engine does; no match needs backtracking across them, only
 * \s*[\r\n]+ inside itself (it ends after the last \r or \n of the space run). */
static void llama3_split(const e8kv_tokenizer *t, enc *e, const uint8_t *s, size_t a, size_t b,
                         size_t max_digits) {
    const uint32_t *cp = e->cp;
    const uint8_t *f = e->flg;
    size_t i = a;
    while (i < b) {
        size_t k = contraction_end(cp, i, b, 1);
        if (!k) {
            const unsigned fi = f[i];
            /* [^\r\n\p{L}\p{N}] may lead a letter run: one character of any other kind (space, tab, mark,
             * punctuation), not \r or \n */
            const int lead = !(fi & (CL_L | CL_N)) && cp[i] != '\r' && cp[i] != '\n';
            const size_t j = cp[i] == ' ' && i + 1 < b ? i + 1 : i; /* ' ?' before punctuation */
            if ((fi & CL_L) || (lead && i + 1 < b && (f[i + 1] & CL_L))) {
                for (k = (fi & CL_L ? i : i + 1) + 1; k < b && (f[k] & CL_L); k++) {
                }
            } else if (fi & CL_N) { /* '\p{N}{1,max_digits}' */
                for (k = i + 1; k < b && k - i < max_digits && (f[k] & CL_N); k++) {
                }
            } else if (!(f[j] & (CL_L | CL_N | CL_S))) { /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
                for (k = j + 1; k < b && !(f[k] & (CL_L | CL_N | CL_S)); k++) {
                }
                while (k < b && (cp[k] == '\r' || cp[k] == '\n'))
                    k++;
            } else { /* a space: '\s*[\r\n]+' if its run holds a line break, else '\s+(?!\S)|\s+' */
                size_t after_break = 0;
                for (size_t r = i; r < b && (f[r] & CL_S); r++)
                    if (cp[r] == '\r' || cp[r] == '\n') after_break = r + 1;
                k = after_break ? after_break : space_run_end(f, i, b);
            }
        }
        bpe_word(t, e, s + e->off[i], e->off[k] - e->off[i]);
        i = k;
    }
}

static void bpe_fragment(const e8kv_tokenizer *t, enc *e, const uint8_t *s, size_t n) {
    size_t m = 0;
    for (size_t i = 0; i < n; m++) {
        uint32_t c;
        const size_t len = utf8_next(s + i, n - i, &c);
        e->cp[m] = c;
        e->off[m] = (uint32_t)i;
        e->flg[m] = (uint8_t)char_flags(c);
        i += len;
    }
    e->off[m] = (uint32_t)n;
    if (t->pre == PRE_SMOLLM) { /* Digits(individual_digits): every \p{N} character is a word by itself */
        size_t seg = 0;
        for (size_t k = 0; k < m; k++) {
            if (!(e->flg[k] & E8KV_UNICODE_NUMBER)) continue;
            gpt2_split(t, e, s, seg, k);
            bpe_word(t, e, s + e->off[k], e->off[k + 1] - e->off[k]);
            seg = k + 1;
        }
        gpt2_split(t, e, s, seg, m);
    } else if (t->pre == PRE_LLAMA3 || t->pre == PRE_QWEN2) {
        llama3_split(t, e, s, 0, m, t->pre == PRE_QWEN2 ? 1 : 3);
    } else {
        gpt2_split(t, e, s, 0, m);
    }
}

/* ---- SentencePiece BPE */

static void spm_try(const e8kv_tokenizer *t, enc *e, const uint8_t *s, int32_t l, int32_t r) {
    const uint32_t start = e->off[l], len = e->cp[l] + e->cp[r];
    const int32_t id = lookup_text(t, (const char *)s + start, len);
    if (id < 0 || (t->types[id] != E8KV_TOKEN_NORMAL && t->types[id] != E8KV_TOKEN_USER_DEFINED)) return;
    heap_push(e, (cand){-t->scores[id], (uint32_t)l, (uint32_t)r, (int32_t)len, id});
}

static void spm_fragment(const e8kv_tokenizer *t, enc *e, const uint8_t *s, size_t n) {
    uint32_t *start = e->off, *len = e->cp; /* len 0 marks a symbol merged into its left neighbour */
    size_t m = 0;
    for (size_t i = 0; i < n; m++) {
        uint32_t c;
        const size_t l = utf8_next(s + i, n - i, &c);
        start[m] = (uint32_t)i;
        len[m] = (uint32_t)l;
        e->prev[m] = (int32_t)m - 1;
        e->next[m] = i + l < n ? (int32_t)m + 1 : -1;
        i += l;
    }
    e->n_heap = 0;
    for (size_t k = 0; k + 1 < m; k++)
        spm_try(t, e, s, (int32_t)k, (int32_t)k + 1);
    while (e->n_heap) {
        const cand c = heap_pop(e);
        const int32_t l = (int32_t)c.left, r = (int32_t)c.right;
        /* stale unless both symbols still span exactly the bytes the candidate was made of */
        if (!len[l] || e->next[l] != r || len[l] + len[r] != (uint32_t)c.a) continue;
        len[l] = (uint32_t)c.a;
        len[r] = 0;
        e->next[l] = e->next[r];
        if (e->next[r] >= 0) e->prev[e->next[r]] = l;
        if (e->prev[l] >= 0) spm_try(t, e, s, e->prev[l], l);
        if (e->next[l] >= 0) spm_try(t, e, s, l, e->next[l]);
    }
    for (int32_t k = 0; m && k >= 0; k = e->next[k]) {
        const int32_t id = lookup_text(t, (const char *)s + start[k], len[k]);
        if (id >= 0 && t->types[id] != E8KV_TOKEN_UNUSED) {
            emit(e, id);
        } else if (t->byte_id[s[start[k]]] >= 0 && t->types[t->byte_id[s[start[k]]]] == E8KV_TOKEN_BYTE) {
            for (uint32_t q = 0; q < len[k]; q++)
                emit(e, t->byte_id[s[start[k] + q]]);
        } else {
            emit(e, t->unk); /* no byte tokens: the whole unknown character is one unk */
        }
    }
}

static void encode_fragment(const e8kv_tokenizer *t, enc *e, const uint8_t *s, size_t n) {
    if (!n) return;
    if (t->kind == KIND_BPE)
        bpe_fragment(t, e, s, n);
    else
        spm_fragment(t, e, s, n);
}

size_t e8kv_tokenizer_unknown_bytes(const e8kv_tokenizer *t, const char *text, size_t n_bytes) {
    size_t n = 0;
    if (!t || !text || t->kind != KIND_BPE) return 0;
    for (size_t i = 0; i < n_bytes; i++)
        n += t->byte_id[(uint8_t)text[i]] < 0;
    return n;
}

size_t e8kv_tokenizer_encode(const e8kv_tokenizer *t, int32_t *ids, size_t capacity, const char *text,
                             size_t n_bytes, int add_bos) {
    if (!t || (!ids && capacity) || (!text && n_bytes)) return E8KV_ERR(BAD_ARGUMENT);
    if (n_bytes >= UINT32_MAX - 2) return E8KV_ERR(SRC_SIZE);
    enc e = {0};
    e.ids = ids;
    e.capacity = capacity;
    if (add_bos < 0) add_bos = t->add_bos;
    if (add_bos && t->bos >= 0) emit(&e, t->bos);
    if (!n_bytes) return e.n;

    const uint8_t *s = (const uint8_t *)text;
    size_t n = n_bytes;
    uint8_t *prefixed = NULL;
    if (t->add_space_prefix) { /* SentencePiece's dummy prefix; llama2.c adds it for non-empty text */
        prefixed = malloc(n + 1);
        if (!prefixed) return E8KV_ERR(OUT_OF_MEMORY);
        prefixed[0] = ' ';
        memcpy(prefixed + 1, text, n);
        s = prefixed;
        n++;
    }
    e.cp = malloc((n + 1) * sizeof *e.cp);
    e.off = malloc((n + 2) * sizeof *e.off);
    e.flg = malloc(n + 1);
    e.sym_id = malloc((n + 1) * sizeof *e.sym_id);
    e.prev = malloc((n + 1) * sizeof *e.prev);
    e.next = malloc((n + 1) * sizeof *e.next);
    if (!e.cp || !e.off || !e.flg || !e.sym_id || !e.prev || !e.next) {
        e.oom = 1;
    } else { /* cut added tokens out of the raw text (leftmost, longest), encode the text between them */
        size_t frag = 0, i = 0;
        while (i < n) {
            int32_t hit = -1;
            for (uint32_t k = t->special_start[s[i]]; k < t->special_start[s[i] + 1]; k++) {
                const int32_t id = t->specials[k];
                const size_t len = t->text_len[id];
                if (len <= n - i && !memcmp(s + i, t->text + t->text_off[id], len)) {
                    hit = id;
                    break;
                }
            }
            if (hit < 0) {
                i++;
                continue;
            }
            encode_fragment(t, &e, s + frag, i - frag);
            emit(&e, hit);
            i += t->text_len[hit];
            frag = i;
        }
        encode_fragment(t, &e, s + frag, n - frag);
    }
    free(prefixed);
    free(e.cp);
    free(e.off);
    free(e.flg);
    free(e.sym_id);
    free(e.prev);
    free(e.next);
    free(e.heap);
    return e.oom ? E8KV_ERR(OUT_OF_MEMORY) : e.n;
}

/* ---------------------------------------------------------------- queries */

size_t e8kv_tokenizer_piece(const e8kv_tokenizer *t, int32_t id, const char **piece) {
    if (!t || !piece || id < 0 || (size_t)id >= t->n_vocab) return E8KV_ERR(BAD_ARGUMENT);
    *piece = t->piece + t->piece_off[id];
    return t->piece_len[id];
}

size_t e8kv_tokenizer_vocab_size(const e8kv_tokenizer *t) {
    return t ? t->n_vocab : 0;
}
int32_t e8kv_tokenizer_bos(const e8kv_tokenizer *t) {
    return t ? t->bos : -1;
}
int32_t e8kv_tokenizer_eos(const e8kv_tokenizer *t) {
    return t ? t->eos : -1;
}

/* ---------------------------------------------------------------- loaders */

size_t e8kv_tokenizer_from_llama2c_buffer(e8kv_tokenizer **out, const void *data, size_t n_bytes,
                                          size_t vocab_size) {
    if (!out) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    if (!data && n_bytes) return E8KV_ERR(BAD_ARGUMENT);
    const uint8_t *p = data;
    if (n_bytes < 4) return E8KV_ERR(TRUNCATED);
    const int32_t max_len = (int32_t)(p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24));
    if (max_len <= 0) return E8KV_ERR(CORRUPTED);
    /* first pass: validate every record and count them */
    size_t pos = 4, count = 0;
    while (vocab_size ? count < vocab_size : pos < n_bytes) {
        if (n_bytes - pos < 8) return E8KV_ERR(TRUNCATED);
        uint32_t u = (uint32_t)p[pos] | ((uint32_t)p[pos + 1] << 8) | ((uint32_t)p[pos + 2] << 16) |
                     ((uint32_t)p[pos + 3] << 24);
        float score;
        memcpy(&score, &u, 4);
        if (!isfinite(score)) return E8KV_ERR(CORRUPTED);
        u = (uint32_t)p[pos + 4] | ((uint32_t)p[pos + 5] << 8) | ((uint32_t)p[pos + 6] << 16) |
            ((uint32_t)p[pos + 7] << 24);
        const int32_t len = (int32_t)u;
        if (len < 0 || len > max_len) return E8KV_ERR(CORRUPTED);
        pos += 8;
        if (n_bytes - pos < (size_t)len) return E8KV_ERR(TRUNCATED);
        pos += (size_t)len;
        count++;
    }
    if (pos != n_bytes) return E8KV_ERR(SRC_SIZE);
    if (count == 0) return E8KV_ERR(CORRUPTED);

    const char **tokens = malloc(count * sizeof *tokens);
    size_t *lens = malloc(count * sizeof *lens);
    float *scores = malloc(count * sizeof *scores);
    int32_t *types = malloc(count * sizeof *types);
    size_t r = E8KV_ERR(OUT_OF_MEMORY);
    if (tokens && lens && scores && types) {
        pos = 4;
        for (size_t i = 0; i < count; i++) {
            uint32_t u = (uint32_t)p[pos] | ((uint32_t)p[pos + 1] << 8) | ((uint32_t)p[pos + 2] << 16) |
                         ((uint32_t)p[pos + 3] << 24);
            memcpy(&scores[i], &u, 4);
            u = (uint32_t)p[pos + 4] | ((uint32_t)p[pos + 5] << 8) | ((uint32_t)p[pos + 6] << 16) |
                ((uint32_t)p[pos + 7] << 24);
            lens[i] = u;
            tokens[i] = (const char *)p + pos + 8;
            pos += 8 + lens[i];
            /* llama2.c's export: 0 <unk>, 1 BOS, 2 EOS, then <0xXX> byte pieces, spaces already unescaped */
            types[i] = i == 0                                      ? E8KV_TOKEN_UNKNOWN
                       : i <= 2                                    ? E8KV_TOKEN_CONTROL
                       : parse_byte_token(tokens[i], lens[i]) >= 0 ? E8KV_TOKEN_BYTE
                                                                   : E8KV_TOKEN_NORMAL;
        }
        const e8kv_tokenizer_vocab v = {
            .model = "llama",
            .n_vocab = count,
            .tokens = tokens,
            .token_lens = lens,
            .scores = scores,
            .token_types = types,
            .bos = count > 1 ? 1 : -1,
            .eos = count > 2 ? 2 : -1,
            .unk = 0,
            .add_bos = 1,
            .add_space_prefix = 1,
            .spm_escaped = 0,
        };
        r = e8kv_tokenizer_create(out, &v);
    }
    free(tokens);
    free(lens);
    free(scores);
    free(types);
    return r;
}

size_t e8kv_tokenizer_from_llama2c(e8kv_tokenizer **out, const char *path, size_t vocab_size) {
    if (!out) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    if (!path) return E8KV_ERR(BAD_ARGUMENT);
    FILE *f = fopen(path, "rb");
    if (!f) return E8KV_ERR(IO);
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t r = 0;
    while (buf) {
        if (n == cap) {
            uint8_t *nb = cap < ((size_t)1 << 30) ? realloc(buf, 2 * cap) : NULL;
            if (!nb) {
                r = cap < ((size_t)1 << 30) ? E8KV_ERR(OUT_OF_MEMORY) : E8KV_ERR(SRC_SIZE);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        const size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) r = E8KV_ERR(IO);
            break;
        }
    }
    fclose(f);
    if (!buf) return E8KV_ERR(OUT_OF_MEMORY);
    if (!e8kv_is_error(r)) r = e8kv_tokenizer_from_llama2c_buffer(out, buf, n, vocab_size);
    free(buf);
    return r;
}

/* Optional integer key: -1 when absent. */
static size_t gguf_token_id(const e8kv_gguf *g, const char *key, int32_t *out) {
    *out = -1;
    if (e8kv_gguf_find(g, key) < 0) return 0;
    uint64_t v;
    E8KV_RETURN_IF_ERROR(e8kv_gguf_get_u64(g, key, &v));
    if (v > (uint64_t)INT32_MAX) return E8KV_ERR(CORRUPTED);
    *out = (int32_t)v;
    return 0;
}

static size_t gguf_flag(const e8kv_gguf *g, const char *key, int dflt, int *out) {
    *out = dflt;
    if (e8kv_gguf_find(g, key) < 0) return 0;
    return e8kv_gguf_get_bool(g, key, out);
}

/* Array of n strings or numbers at key; E8KV_ERROR_CORRUPTED for another element type or count. */
static size_t gguf_array(const e8kv_gguf *g, const char *key, int want_string, uint64_t *n) {
    e8kv_gguf_type et;
    E8KV_RETURN_IF_ERROR(e8kv_gguf_get_arr(g, key, &et, n));
    if ((et == E8KV_GGUF_STRING) != (want_string != 0) || et == E8KV_GGUF_ARRAY) return E8KV_ERR(CORRUPTED);
    return 0;
}

typedef struct {
    const char **tokens, **merges;
    size_t *token_lens, *merge_lens;
    float *scores;
    int32_t *types;
} gguf_arrays;

static size_t gguf_fill(const e8kv_gguf *g, e8kv_tokenizer_vocab *v, gguf_arrays *a) {
    uint64_t n;
    E8KV_RETURN_IF_ERROR(gguf_array(g, "tokenizer.ggml.tokens", 1, &n));
    if (n == 0 || n >= (uint64_t)INT32_MAX) return E8KV_ERR(CORRUPTED);
    v->n_vocab = (size_t)n;
    a->tokens = malloc(n * sizeof *a->tokens);
    a->token_lens = malloc(n * sizeof *a->token_lens);
    if (!a->tokens || !a->token_lens) return E8KV_ERR(OUT_OF_MEMORY);
    for (uint64_t i = 0; i < n; i++)
        E8KV_RETURN_IF_ERROR(
            e8kv_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &a->tokens[i], &a->token_lens[i]));
    v->tokens = a->tokens;
    v->token_lens = a->token_lens;

    uint64_t m;
    if (e8kv_gguf_find(g, "tokenizer.ggml.scores") >= 0) {
        E8KV_RETURN_IF_ERROR(gguf_array(g, "tokenizer.ggml.scores", 0, &m));
        if (m != n) return E8KV_ERR(CORRUPTED);
        a->scores = malloc(n * sizeof *a->scores);
        if (!a->scores) return E8KV_ERR(OUT_OF_MEMORY);
        for (uint64_t i = 0; i < n; i++)
            E8KV_RETURN_IF_ERROR(e8kv_gguf_get_arr_f32(g, "tokenizer.ggml.scores", i, &a->scores[i]));
        v->scores = a->scores;
    }
    if (e8kv_gguf_find(g, "tokenizer.ggml.token_type") >= 0) {
        E8KV_RETURN_IF_ERROR(gguf_array(g, "tokenizer.ggml.token_type", 0, &m));
        if (m != n) return E8KV_ERR(CORRUPTED);
        a->types = malloc(n * sizeof *a->types);
        if (!a->types) return E8KV_ERR(OUT_OF_MEMORY);
        for (uint64_t i = 0; i < n; i++) {
            int64_t ty;
            E8KV_RETURN_IF_ERROR(e8kv_gguf_get_arr_i64(g, "tokenizer.ggml.token_type", i, &ty));
            a->types[i] = ty >= 0 && ty <= 6 ? (int32_t)ty : E8KV_TOKEN_NORMAL;
        }
        v->token_types = a->types;
    }
    if (e8kv_gguf_find(g, "tokenizer.ggml.merges") >= 0) {
        E8KV_RETURN_IF_ERROR(gguf_array(g, "tokenizer.ggml.merges", 1, &m));
        if (m >= (uint64_t)1 << 24) return E8KV_ERR(UNSUPPORTED); /* ranks are kept exactly in a float */
        a->merges = malloc((m ? m : 1) * sizeof *a->merges);
        a->merge_lens = malloc((m ? m : 1) * sizeof *a->merge_lens);
        if (!a->merges || !a->merge_lens) return E8KV_ERR(OUT_OF_MEMORY);
        for (uint64_t i = 0; i < m; i++)
            E8KV_RETURN_IF_ERROR(
                e8kv_gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &a->merges[i], &a->merge_lens[i]));
        v->n_merges = (size_t)m;
        v->merges = a->merges;
        v->merge_lens = a->merge_lens;
    }
    E8KV_RETURN_IF_ERROR(gguf_token_id(g, "tokenizer.ggml.bos_token_id", &v->bos));
    E8KV_RETURN_IF_ERROR(gguf_token_id(g, "tokenizer.ggml.eos_token_id", &v->eos));
    E8KV_RETURN_IF_ERROR(gguf_token_id(g, "tokenizer.ggml.unknown_token_id", &v->unk));
    /* llama.cpp's defaults when a key is absent: SentencePiece vocabularies add BOS and the space prefix */
    const int spm = !strcmp(v->model, "llama");
    E8KV_RETURN_IF_ERROR(gguf_flag(g, "tokenizer.ggml.add_bos_token", spm, &v->add_bos));
    E8KV_RETURN_IF_ERROR(gguf_flag(g, "tokenizer.ggml.add_space_prefix", 1, &v->add_space_prefix));
    v->spm_escaped = 1;
    return 0;
}

size_t e8kv_tokenizer_from_gguf(e8kv_tokenizer **out, const e8kv_gguf *g) {
    if (!out) return E8KV_ERR(BAD_ARGUMENT);
    *out = NULL;
    if (!g) return E8KV_ERR(BAD_ARGUMENT);
    const char *s;
    size_t len;
    if (e8kv_gguf_find(g, "tokenizer.ggml.model") < 0) return E8KV_ERR(UNSUPPORTED); /* no tokenizer */
    E8KV_RETURN_IF_ERROR(e8kv_gguf_get_str(g, "tokenizer.ggml.model", &s, &len));
    char model[32], pre[64];
    if (len >= sizeof model) return E8KV_ERR(UNSUPPORTED);
    memcpy(model, s, len);
    model[len] = 0;
    e8kv_tokenizer_vocab v = {.model = model};
    if (e8kv_gguf_find(g, "tokenizer.ggml.pre") >= 0) {
        E8KV_RETURN_IF_ERROR(e8kv_gguf_get_str(g, "tokenizer.ggml.pre", &s, &len));
        if (len >= sizeof pre) return E8KV_ERR(UNSUPPORTED);
        memcpy(pre, s, len);
        pre[len] = 0;
        v.pre = pre;
    }
    gguf_arrays a = {0};
    size_t r = gguf_fill(g, &v, &a);
    if (!e8kv_is_error(r)) r = e8kv_tokenizer_create(out, &v);
    free(a.tokens);
    free(a.token_lens);
    free(a.merges);
    free(a.merge_lens);
    free(a.scores);
    free(a.types);
    return r;
}
