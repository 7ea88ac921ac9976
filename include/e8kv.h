/* e8kv: E8 lattice compression of transformer key/value caches.
 *
 * The stable public API: version, errors, codecs (fixed-rate vector formats with random access per
 * vector), and the KV cache. Most users need only this header.
 *
 * Conventions (zstd style):
 *  - destination before source, each followed by its capacity or size;
 *  - fallible functions return size_t: a count, or an error code tested with e8kv_is_error() and named
 *    with e8kv_error_name(); constructors return NULL and, when `err` is not NULL, store the reason;
 *  - the library never prints and never exits; diagnostics go through e8kv_set_log_callback().
 *
 * Thread-safety: a codec is immutable after creation; its encode/decode functions may be called from any
 * number of threads at once. A cache is not internally locked: calls that modify one cache
 * (append, truncate, clear) must not run concurrently with any other call on the same cache;
 * e8kv_cache_attend on the same cache from several threads is allowed when nothing modifies it (the
 * calls take turns on the cache's threads). A pool (e8kv_pool_run) may be used from any thread.
 */
#ifndef E8KV_H
#define E8KV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define E8KV_VERSION_MAJOR 0
#define E8KV_VERSION_MINOR 1
#define E8KV_VERSION_PATCH 0
#define E8KV_VERSION_NUMBER (E8KV_VERSION_MAJOR * 10000 + E8KV_VERSION_MINOR * 100 + E8KV_VERSION_PATCH)

unsigned e8kv_version_number(void);
const char *e8kv_version_string(void);

/* ---------------------------------------------------------------- errors */

/* Error values are pinned: never renumber, only append. */
typedef enum {
    E8KV_ERROR_NO_ERROR = 0,
    E8KV_ERROR_GENERIC = 1,
    E8KV_ERROR_BAD_ARGUMENT = 2,  /* NULL pointer, zero count, inconsistent sizes */
    E8KV_ERROR_HEAD_DIM = 3,      /* head_dim not supported by the format (E8: multiple of 8) */
    E8KV_ERROR_RATE = 4,          /* bits per value out of the format's range */
    E8KV_ERROR_DST_TOO_SMALL = 5, /* destination capacity too small */
    E8KV_ERROR_NONFINITE = 6,     /* NaN or Inf in an input vector */
    E8KV_ERROR_OUT_OF_MEMORY = 7,
    E8KV_ERROR_CORRUPTED = 8,     /* bytes do not form a valid object */
    E8KV_ERROR_TRUNCATED = 9,     /* input ends early */
    E8KV_ERROR_VERSION = 10,      /* unsupported format version */
    E8KV_ERROR_CHECKSUM = 11,     /* checksum mismatch */
    E8KV_ERROR_SPEC = 12,         /* unparsable or impossible format spec string */
    E8KV_ERROR_CONTEXT_FULL = 13, /* append past the cache's maximum context */
    E8KV_ERROR_DIMENSION = 14,    /* dimensions disagree (layer, head count, position) */
    E8KV_ERROR_RANGE = 15,        /* finite value too large for the format's scale field */
    E8KV_ERROR_IO = 16,           /* file could not be opened, read or written */
    E8KV_ERROR_UNSUPPORTED = 17,  /* valid but not implemented (tensor type, architecture) */
    E8KV_ERROR_SRC_SIZE = 18,     /* source size does not match what the call needs */
    E8KV_ERROR_Q_RANGE = 19,      /* e8nest/d4nest q=R outside [1, sqrt(2*head_dim)] (see the codecs) */
    E8KV_ERROR_CUDA = 20,         /* a CUDA runtime call or kernel launch failed (no device, bad state) */
    E8KV_ERROR_NO_SPACE = 21,     /* a write found the file system full or the disk quota spent */
    E8KV_ERROR_MAX_CODE = 64
} e8kv_error_code;

/* 1 when `code` (a size_t returned by a fallible function) is an error. */
unsigned e8kv_is_error(size_t code);
/* The error enum value of `code` (E8KV_ERROR_NO_ERROR when it is not an error). */
e8kv_error_code e8kv_get_error_code(size_t code);
/* A stable, human-readable name, e.g. "head_dim not supported by this format". */
const char *e8kv_error_name(size_t code);
const char *e8kv_error_code_name(e8kv_error_code code);
/* The one way the library, and code built on it that answers in its error codes (the engine), makes and
 * passes on an error: E8KV_ERR(HEAD_DIM) is the size_t value of E8KV_ERROR_HEAD_DIM; E8KV_RETURN_IF_ERROR
 * returns the value of expr from the enclosing function when it is an error. */
#define E8KV_ERR(name) ((size_t) - (ptrdiff_t)E8KV_ERROR_##name)
#define E8KV_RETURN_IF_ERROR(expr)                                                                           \
    do {                                                                                                     \
        const size_t e8kv_r_ = (expr);                                                                       \
        if (e8kv_is_error(e8kv_r_)) return e8kv_r_;                                                          \
    } while (0)

/* Atomic file writes (every file the library and the CLI write goes through them): the bytes go to a new
 * file beside `path`, which at commit is flushed to disk and renamed over `path`; on any failure (open,
 * write, a full disk, a file size limit, fsync, rename) the new file is removed and `path` keeps its old
 * contents. A `path` that is a symbolic link is written through (its target is replaced, the link stays);
 * one that exists and is not a regular file (/dev/null, a terminal, a FIFO) is written in place.
 * Errors: E8KV_ERROR_BAD_ARGUMENT, E8KV_ERROR_NO_SPACE (a full file system or a spent disk quota),
 * E8KV_ERROR_IO (any other failure; also a directory or a dangling link), E8KV_ERROR_OUT_OF_MEMORY. */
typedef struct e8kv_file_writer e8kv_file_writer;
e8kv_file_writer *e8kv_file_writer_open(const char *path, size_t *err);
/* Returns n or an error; after an error the writer can only be aborted (commit answers the same error). */
size_t e8kv_file_writer_write(e8kv_file_writer *w, const void *src, size_t n);
/* Flush, fsync, rename over the path, fsync its directory; frees w. Returns the bytes written or
 * E8KV_ERROR_NO_SPACE / E8KV_ERROR_IO (the path then keeps its old contents). */
size_t e8kv_file_writer_commit(e8kv_file_writer *w);
/* Removes the new file and frees w; NULL is a no-op. */
void e8kv_file_writer_abort(e8kv_file_writer *w);
/* The three in one: returns n or an error. */
size_t e8kv_file_write(const char *path, const void *src, size_t n);

/* Optional log sink; level 0 = error, 1 = warning, 2 = info, 3 = debug. NULL restores silence. */
typedef void (*e8kv_log_fn)(int level, const char *msg, void *user);
void e8kv_set_log_callback(e8kv_log_fn fn, void *user);

/* ---------------------------------------------------------------- codecs
 *
 * A codec turns one head vector of `head_dim` floats into a fixed number of bytes (side information
 * included) and back. Vectors are independent: encoding n vectors writes n * e8kv_codec_vector_bytes()
 * bytes, and vector i can be decoded from its own bytes alone (random access per token).
 *
 * Spec strings (stable; used by scripts):
 *   f32, f16, bf16      plain storage (bf16: the GPU cache's raw pages)
 *   q8_0, q4_0          llama.cpp block formats (32 values + fp16 scale): 8.5 and 4.5 bits/value
 *   q8_0h, q4_0h        the same after the seeded random-sign Hadamard rotation
 *   lloyd:B             rotation + fp16 norm + Lloyd-Max scalar levels for the rotated coordinates, B=2,3,4
 *   e8:B                the default fixed-rate E8 code at B bits/value before side info, B=2,3,4
 *   e8ball:B            ball-shaped E8 codebook (16-bit index per 8 values), residual Voronoi stage for B=3,4
 *   e8nest:B[:q=R]      nested-lattice (Voronoi) E8 code with per-vector scale and clamp; R = q_range,
 *                       the clamp in multiples of the vector's RMS (step R*RMS/2^B), from 1 to
 *                       sqrt(2*head_dim) (11.3 at head_dim 64; above it nothing is ever clamped and the
 *                       step only coarsens), else E8KV_ERROR_Q_RANGE. Not KakeyaLattice's q_range (10 / 38
 *                       / 152): that counts lattice steps up to the largest coordinate, the role of 2^B
 *                       here, and sets its rate, about log2(2Q+1) bits per value
 *   d4nest:B[:q=R]      the same with the D4 lattice (head_dim multiple of 4)
 *   e8box:4             E8 points in a box: one nibble per value plus a coset bit per 8 values and a
 *                       1-byte log-step per vector (4.25 bits/value at head_dim 64), built for reading
 *                       speed: attention scores keys and sums values on the integers (kvcache.h)
 *   e8v:B               E8 points entropy-coded (prefix codes) inside the same 2 + B*head_dim/8 bytes as
 *                       e8:B, the step chosen per vector so the code just fits; B a multiple of 1/8 from
 *                       1 to 8 ("e8v:3.5") with B*head_dim/8 whole bytes, else E8KV_ERROR_RATE: every
 *                       1/8 at head_dim 64, 128 and above, every 1/4 at 32 and 96, every 1/2 at 16 and
 *                       48, whole bits at 8, 24 and 40; every accepted rate encodes any finite vector
 *                       of RMS up to 2^13 (larger ones may be E8KV_ERROR_RANGE); 1.5-2 dB better than
 *                       e8:B, slower to decode (BENCHMARKS.md)
 *   Peers' formats, for side-by-side measurement (BENCHMARKS.md):
 *   kivi:B              KIVI-style: keys per channel over groups of 32 tokens, values per token over groups
 *                       of 32 values, fp16 min and step each (B = 1..4; B + 1 bits/value; head_dim a
 *                       multiple of 32)
 *   kvquant:B           KVQuant-style: per-channel keys, per-token values, normalized by fp16 mean and
 *                       deviation to Gaussian Lloyd-Max levels, ~1% outliers kept as (index, fp16) (B = 2..4;
 *                       B + 0.875 bits/value at head_dim 64; head_dim a multiple of 64)
 *   e8r:B               relaxed-parity E8 (Z^8 u Z^8+1/2) in a box after the rotation, fp16 step (B = 2..6;
 *                       B + 1/8 + 16/head_dim bits/value)
 *   kakeya[:q=Q]        D4 within +-Q steps of max|x|/Q after the rotation, the q_range operating points of
 *                       the KakeyaLattice package (Q = 10 / 38 / 152; 832 bits per vector at head_dim 128,
 *                       Q = 38); Q an integer from 1 to 8192, else E8KV_ERROR_Q_RANGE
 *   kivi and kvquant are token-group formats: statistics span 32 (64) consecutive tokens, so encode and
 *   decode take whole groups (n_vec a multiple of the group, else E8KV_ERROR_SRC_SIZE) in the key layout;
 *   vectors are not independent. In a cache a page is coded once full (doc/format.md 2.9).
 * Options are appended with ':' (e.g. "e8nest:4:q=3.5"). See doc/format.md for every byte.
 */
typedef struct e8kv_codec e8kv_codec;

#define E8KV_MAX_HEAD_DIM 512

e8kv_codec *e8kv_codec_create(const char *spec, size_t head_dim, uint64_t seed, size_t *err);
void e8kv_codec_free(e8kv_codec *codec);

const char *e8kv_codec_spec(const e8kv_codec *codec);
/* The page format in which the CUDA cache (e8kv_cuda.h) holds this codec's vectors, byte for byte; NONE
 * when the GPU has no kernel for it. */
typedef enum {
    E8KV_GPU_NONE = 0,
    E8KV_GPU_E8BOX4,
    E8KV_GPU_E8P2,
    E8KV_GPU_F16,
    E8KV_GPU_BF16,
    E8KV_GPU_E8BOX3
} e8kv_gpu_format;
e8kv_gpu_format e8kv_codec_gpu_format(const e8kv_codec *codec);
size_t e8kv_codec_head_dim(const e8kv_codec *codec);
/* Bytes of one encoded vector, side information included. */
size_t e8kv_codec_vector_bytes(const e8kv_codec *codec);
/* 8 * vector_bytes / head_dim: every byte counted. */
double e8kv_codec_bits_per_value(const e8kv_codec *codec);
/* 1 when the codec applies the Hadamard rotation before quantizing. */
int e8kv_codec_is_rotated(const e8kv_codec *codec);

/* Encode n_vec vectors (n_vec * head_dim floats, row-major). Returns bytes written.
 * NaN/Inf anywhere in src: E8KV_ERROR_NONFINITE and nothing written. Zero vectors decode to zeros. */
size_t e8kv_codec_encode(const e8kv_codec *codec, void *dst, size_t dst_capacity, const float *src,
                         size_t n_vec);
/* Decode n_vec vectors from exactly n_vec * vector_bytes bytes. Returns floats written. Bytes from an
 * encode always decode to finite values; bytes that would decode to NaN or Inf (an f32 or f16 payload, or
 * a scale field, that is NaN or Inf: never written by encode) answer E8KV_ERROR_CORRUPTED, and dst then
 * holds the vectors before the bad one. Any other bytes decode to some finite vector, so this also
 * validates untrusted codes. */
size_t e8kv_codec_decode(const e8kv_codec *codec, float *dst, size_t dst_capacity, const void *src,
                         size_t src_size, size_t n_vec);
/* Decode without undoing the rotation (the rotated domain the attention kernels work in). For codecs
 * that do not rotate this equals e8kv_codec_decode. Same errors. */
size_t e8kv_codec_decode_rotated(const e8kv_codec *codec, float *dst, size_t dst_capacity, const void *src,
                                 size_t src_size, size_t n_vec);
/* Apply the codec's rotation (forward or inverse) in place to n_vec vectors; identity if not rotated. */
size_t e8kv_codec_rotate(const e8kv_codec *codec, float *x, size_t n_vec, int inverse);

/* ---------------------------------------------------------------- calibration (transform coding)
 *
 * What the "e8t" cache formats need from a model, measured once on calibration text and shared by every
 * cache (and every sequence) of that model: per layer, KV head and stream (K before RoPE, V), the
 * covariance of the centred vectors, its eigenbasis (the Karhunen–Loève transform) and eigenvalues.
 *
 * Usage: create, observe every layer of several sequences (the K/V a cache with rope=pre receives),
 * finalize, then pass it in e8kv_cache_params.calib or save it. A finalized calibration is immutable and
 * may be shared by any number of caches and threads; it must outlive the caches created with it.
 * Serialized layout: doc/format.md §5 (versioned, XXH64-checked; bad bytes are E8KV_ERROR_CORRUPTED /
 * _TRUNCATED / _CHECKSUM / _VERSION, a basis that is not orthonormal is CORRUPTED). */
typedef struct e8kv_calib e8kv_calib;

/* 3: written with query energies; without them, 2 with sensitivities and 1 with neither (bytes unchanged) */
#define E8KV_CALIB_FORMAT_VERSION 3

e8kv_calib *e8kv_calib_create(size_t n_layer, size_t n_head_kv, size_t head_dim, size_t *err);
void e8kv_calib_free(e8kv_calib *cal);
/* One sequence of one layer: k (before RoPE) and v, (n_tok, n_head_kv * head_dim), n_tok >= 2. Each call
 * is centred by its own mean, as the cache centres a sequence. NaN/Inf: E8KV_ERROR_NONFINITE, nothing
 * recorded. E8KV_ERROR_BAD_ARGUMENT after finalize. Returns the layer's observed token count. */
size_t e8kv_calib_observe(e8kv_calib *cal, size_t layer, const float *k, const float *v, size_t n_tok);
/* Optional, for the e8tv formats' keys: the queries of one layer that score the keys observed, before
 * RoPE, q (n_tok, n_head * head_dim), n_head a multiple of n_head_kv (query head hq scores KV head
 * hq / (n_head / n_head_kv), GQA) and the same in every call. Accumulates Σ q_j² per layer, KV head and
 * coordinate (the scale of q does not matter). Calibrations with them store them (format version 3) and
 * e8tv key streams then code in a domain where the squared error is the error of attention scores
 * (src/cache/xform.c). Errors: BAD_ARGUMENT (NULL, n_tok 0, after finalize), DIMENSION (layer out of
 * range, n_head not a positive multiple of n_head_kv or different from earlier calls), NONFINITE (nothing
 * recorded). Returns the layer's observed query token count. */
size_t e8kv_calib_observe_q(e8kv_calib *cal, size_t layer, const float *q, size_t n_head, size_t n_tok);
/* Eigendecomposition of every accumulated covariance. Every layer must have been observed with at least
 * 2 tokens, and with queries when any layer was (E8KV_ERROR_BAD_ARGUMENT otherwise). Returns 0. */
size_t e8kv_calib_finalize(e8kv_calib *cal);
/* Dimensions and the number of tokens observed in layer 0 (any pointer may be NULL). */
size_t e8kv_calib_info(const e8kv_calib *cal, size_t *n_layer, size_t *n_head_kv, size_t *head_dim,
                       size_t *n_tokens);
/* Eigenvalues (head_dim, decreasing) of one head's stream (is_v: 0 = K, 1 = V); NULL before finalize or
 * out of range. */
const float *e8kv_calib_eigenvalues(const e8kv_calib *cal, size_t layer, int is_v, size_t head);
/* Mean query energy E[q_j²] (head_dim) of the queries scoring one KV head's keys, over tokens and the
 * head's GQA group; NULL when the calibration has none (no e8kv_calib_observe_q), before finalize or out
 * of range. */
const float *e8kv_calib_query_energy(const e8kv_calib *cal, size_t layer, size_t head);
/* Sensitivity of one stream (is_v: 0 = K, 1 = V) of a layer: the coefficient c of the model
 * KLD ≈ c · 4^(−B), in nats per token, of that stream alone coded at B bits per value (all others exact),
 * which the cache spec item auto=FAMILY:B uses to spread bits over the streams (reverse water-filling,
 * src/cache/alloc.c). e8kv calibrate measures it (engine/calibrate.h). Set it on a finalized calibration
 * before sharing it: c >= 0 and finite (E8KV_ERROR_BAD_ARGUMENT otherwise, or DIMENSION out of range).
 * A calibration with any sensitivity set stores all of them (0 for the unset ones). */
size_t e8kv_calib_set_sensitivity(e8kv_calib *cal, size_t layer, int is_v, double c);
/* The coefficient, or -1.0 when the calibration has none (or layer is out of range). */
double e8kv_calib_sensitivity(const e8kv_calib *cal, size_t layer, int is_v);
/* The rates (bits per value) the cache spec item auto=e8tv:B gives the 2·n_layer streams of a cache
 * with this calibration, B = mean_bits: rates[s] for K of layer s (s < n_layer), then V of layer
 * s − n_layer; reverse water-filling of the sensitivities (src/cache/alloc.c) on the grid e8tv has at the
 * calibration's head_dim, each stream within [1.5, 8]. BAD_ARGUMENT without sensitivities, RATE for a B
 * off the grid. */
size_t e8kv_calib_auto_rates(const e8kv_calib *cal, double mean_bits, double *rates);
/* Bytes a finalized calibration occupies in memory (bases and eigenvalues; shared, not per cache). */
size_t e8kv_calib_bytes(const e8kv_calib *cal);
size_t e8kv_calib_save_bound(const e8kv_calib *cal);
size_t e8kv_calib_save(void *dst, size_t dst_capacity, const e8kv_calib *cal);
e8kv_calib *e8kv_calib_load(const void *src, size_t src_size, size_t *err);
size_t e8kv_calib_save_file(const e8kv_calib *cal, const char *path);
e8kv_calib *e8kv_calib_load_file(const char *path, size_t *err);

/* ---------------------------------------------------------------- threads
 * A pool of persistent worker threads. A cache's e8kv_cache_attend runs on one (the cache's own, made
 * from e8kv_cache_params.n_threads, or one given with e8kv_cache_set_pool), and a caller may run its own
 * parallel loops on the same threads (the engine's forward pass does), so that one set of threads serves
 * everything and none is created per call. Jobs of one pool run one at a time: a caller that finds the
 * pool busy waits its turn. An item that calls e8kv_pool_run on the pool it runs on has those items run
 * on its own thread. */
#define E8KV_POOL_MAX_THREADS 256
typedef struct e8kv_pool e8kv_pool;
typedef void (*e8kv_pool_fn)(void *args, size_t i);

/* A pool of n_threads threads, the caller's included (n_threads - 1 workers). NULL with *err
 * BAD_ARGUMENT when n_threads is 0 or above E8KV_POOL_MAX_THREADS, OUT_OF_MEMORY when a thread or the
 * memory could not be had. */
e8kv_pool *e8kv_pool_create(size_t n_threads, size_t *err);
/* Stops and joins the workers; NULL is a no-op. No job may be running and no cache may still use it. */
void e8kv_pool_free(e8kv_pool *pool);
/* Threads of the pool, the caller's included; 1 for NULL. */
size_t e8kv_pool_threads(const e8kv_pool *pool);
/* fn(args, i) for every i in [0, n), each exactly once, on the pool's workers and the calling thread,
 * in no fixed order and on no fixed thread (items that write disjoint outputs give the same results at
 * any thread count); returns n when all are done. pool NULL: all on the calling thread. BAD_ARGUMENT
 * when fn is NULL. */
size_t e8kv_pool_run(e8kv_pool *pool, e8kv_pool_fn fn, void *args, size_t n);

/* ---------------------------------------------------------------- KV cache
 *
 * Per layer and KV head, keys and values of up to n_ctx tokens stored through codecs, in pages of a fixed
 * number of tokens allocated on first use. Attention reads the codes directly (one vector at a time, in
 * the codec's rotated domain; the query is rotated once instead), never a decoded copy of the context.
 *
 * Cache spec grammar (params.spec): comma-separated items, later items override earlier ones.
 *   SPEC                 a codec spec (see above) for both K and V, e.g. "e8:4", "f16", "e8nest:4:q=3.5",
 *                        or "e8t:B" (B = 2, 3, 4): calibrated transform coding, the e8:B code (same bytes
 *                        per vector) applied to w ⊙ (P·(x − mean)) with P the calibration's eigenbasis of
 *                        the stream and w_i = λ_i^(−1/4) (needs params.calib; keys before RoPE, so with
 *                        RoPE an e8t K needs rope=pre, the default); doc/format.md §5
 *   e8tv:B               calibrated transform coding with entropy-coded E8 (doc/format.md §2.3): the
 *                        e8v:B code of P·(x − mean) with the head's eigenvalues as the variance profile,
 *                        so each eigen-coordinate gets the bits its variance needs (needs params.calib); when
 *                        the calibration has query energies (e8kv_calib_observe_q), keys are coded in the
 *                        domain where squared error is attention-score error (doc/format.md §5)
 *   auto=FAMILY:B        FAMILY e8tv or e8v: every stream (each layer's K and V) in that family with its
 *                        own rate, mean B, spread by the calibration's sensitivities (reverse water-
 *                        filling, e8kv_calib_sensitivity); later items may still override streams
 *   k=SPEC, v=SPEC       the K or the V format; kv=SPEC sets both
 *   layersA-B=SPEC       both formats for layers A..B (inclusive); "layerA=SPEC" for one layer;
 *   layersA-B.k=SPEC     ... or only K (".v" only V). Example: "k=e8:4,v=e8:3,layers0-1=f16"
 *   window=W             the newest W tokens stay exact (f32): a page is encoded once all its tokens are
 *                        older than the window (so up to W + page - 1 tokens are exact); 0 = off (default)
 *   sink=S               the first S positions stay exact forever (attention sinks); 0 = off (default)
 *   page=P               tokens per page (default 64)
 *   center=1|all|0       centering (default 1): each coded stream's per-head mean over the first append
 *                        of a sequence (>= 16 tokens) is subtracted before coding and added back exactly on
 *                        read; LLM keys share a large per-channel component, so this lowers the coding
 *                        error at the cost of head_dim floats per layer and head (counted in the bytes).
 *                        1: e8kv's formats (e8*, d4nest, lloyd); the llama.cpp formats (q8_0, q4_0 and
 *                        their h variants) keep llama.cpp's semantics unless center=all. f32/f16: never.
 *                        center=rope: as 1, for keys coded after RoPE (rope=post; the CUDA cache's default,
 *                        e8kv_cuda.h, the same bytes): K's centre is partly turned by RoPE. On the 8 RoPE
 *                        pairs whose mean before RoPE (each key of the first append turned back by its
 *                        position) has the most energy beyond the mean after RoPE, a key at position p
 *                        codes x − R_p·m (m: that mean), read back with R_p·m at the key's own position
 *                        (after eviction too). Costs 24 floats per layer and KV head and a cos/sin table
 *                        of n_ctx·head_dim floats (counted in the bytes). Needs params.rope_theta or
 *                        params.rope_freqs, the layout in rope_neox and head_dim >= 16; rope=pre or
 *                        calibrated K formats with it are E8KV_ERROR_SPEC
 *   rope=pre|post        (default: pre when params.rope_theta > 0 (or params.rope_freqs is given) and K is
 *                        one of e8kv's formats (e8*, d4nest, lloyd) other than e8box, else post, as
 *                        llama.cpp does for q8_0/q4_0 and
 *                        as e8box's integer-domain attention needs;
 *                        callers ask e8kv_cache_keys_pre_rope() which keys to append)
 *                        keys arrive before RoPE (pre: stored un-rotated, RoPE applied to each decoded
 *                        key at attention time with params.rope_theta or rope_freqs, and rope_neox) or
 *                        after it (post,
 *                        default: keys are stored as given and q must carry RoPE too)
 *   near-lossless, balanced, aggressive
 *                        presets, expanded in place: calibrated e8tv formats when params.calib is given,
 *                        uncalibrated ones otherwise (see e8kv_cache_preset_spec_calib()).
 * A codec spec or preset may only be the first item (later items refine it), so "f16,e8:4" is not a
 * spec (tools split such lists into formats, README). A spec is at most E8KV_CACHE_SPEC_MAX_LEN bytes.
 * A spec the grammar or a codec rejects is E8KV_ERROR_SPEC (a codec may also answer HEAD_DIM, RATE,
 * Q_RANGE or UNSUPPORTED).
 */
#define E8KV_CACHE_SPEC_MAX_LEN 8191
typedef struct e8kv_cache e8kv_cache;

typedef struct {
    size_t n_layer;
    size_t n_head_kv;
    size_t head_dim;
    size_t n_ctx;        /* maximum number of tokens */
    const char *spec;    /* cache spec, see the grammar above */
    uint64_t seed;       /* rotation seed */
    /* optional (0 = default) */
    size_t n_threads;    /* attend threads, the caller's included: a pool of its own made at create (a
                            larger count makes E8KV_CACHE_MAX_THREADS); 0/1 = the caller's alone. Results
                            are the same bits at any thread count (see e8kv_cache_attend) */
    float rope_theta;    /* RoPE base frequency, needed with rope=pre (e.g. 10000, 100000, 500000) */
    int rope_neox;       /* RoPE layout with rope=pre or center=rope: 0 = interleaved pairs (x[2i], x[2i+1]),
                            1 = split halves (x[i], x[i + head_dim/2]; NeoX / Llama HF layout) */
    const e8kv_calib *calib; /* finalized calibration for the e8t formats (borrowed: it must outlive the
                                cache); NULL when no e8t format is used */
    const float *rope_freqs; /* optional: RoPE's own frequencies, head_dim/2 values (finite, >= 0; copied at
                                create), for a scaled RoPE whose frequencies do not change with the length
                                (transformers' inv_freq of rope_type llama3, linear, yarn): pair i of a key at
                                position p turns by p·rope_freqs[i] instead of p·rope_theta^(−2i/head_dim)
                                (rope_theta may then be 0). Wherever the cache applies or follows RoPE
                                (rope=pre, center=rope, the e8tv keys' score domain, the snapkv/h2o scorers'
                                queries) it uses these; saved caches carry them (doc/format.md §4.1). The
                                CUDA cache's params.rope_freqs, the same turns: the same bytes */
} e8kv_cache_params;

#define E8KV_CACHE_MAX_THREADS 64
e8kv_cache *e8kv_cache_create(const e8kv_cache_params *params, size_t *err);
void e8kv_cache_free(e8kv_cache *cache);
/* Run the cache's attention on `pool` (borrowed: it must outlive the cache, or be replaced first)
 * instead of its own threads (params.n_threads), which are stopped; NULL: on the calling thread alone.
 * Several caches, and the caller's own work, may share one pool. Must not run concurrently with any
 * other call on the cache. Returns 0, or BAD_ARGUMENT for a NULL cache. */
size_t e8kv_cache_set_pool(e8kv_cache *cache, e8kv_pool *pool);

/* Store K and V of n_tok consecutive tokens starting at position cache->n_tokens, for one layer.
 * k, v: (n_tok, n_head_kv * head_dim). Positions must be appended in order within each layer.
 * Returns the layer's token count after the call. A rejected call (any error, NaN/Inf included) leaves
 * the cache unchanged. */
size_t e8kv_cache_append(e8kv_cache *cache, size_t layer, const float *k, const float *v, size_t n_tok);

/* Causal attention for n_tok query tokens at positions pos0 .. pos0 + n_tok - 1 against the layer's
 * stored tokens: query i sees positions 0 .. pos0 + i, which must already be stored.
 * q: (n_tok, n_head * head_dim); out: same shape. n_head must be a multiple of n_head_kv (GQA).
 * Scores are scaled by 1/sqrt(head_dim). Returns floats written. NaN or Inf anywhere in q:
 * E8KV_ERROR_NONFINITE, nothing written.
 * The work is cut into pieces that depend on the shapes, the cache's n_ctx and the call alone (a few
 * query tokens: context slices, merged in slice order; more: KV head x query chunk), never on
 * the thread count, and runs on the cache's pool: any number of threads gives the same bits. No
 * allocation and no thread creation per call (the slices' scratch is the cache's, made at create). */
size_t e8kv_cache_attend(e8kv_cache *cache, float *out, size_t out_capacity, size_t layer, const float *q,
                         size_t n_head, size_t n_tok, size_t pos0);
/* e8kv_cache_attend with learned attention sinks (gpt-oss): sinks (n_head floats; NULL: none) holds one logit
 * per query head, in the scores' units (q·k / sqrt(head_dim)), that joins every softmax of that head with a
 * value of zero: out = Σ_j e^(s_j) v_j / (e^sink + Σ_j e^(s_j)). -inf: no sink for that head; NaN or +inf:
 * E8KV_ERROR_NONFINITE, nothing written. */
size_t e8kv_cache_attend_sinks(e8kv_cache *cache, float *out, size_t out_capacity, size_t layer,
                               const float *q, size_t n_head, size_t n_tok, size_t pos0, const float *sinks);

/* Positions covered in `layer`: the position the next appended token takes (tokens stored, when nothing
 * was evicted; see e8kv_cache_n_kept). */
size_t e8kv_cache_n_tokens(const e8kv_cache *cache, size_t layer);
/* Keep only positions [0, n_keep) in every layer; returns the largest token count left in a layer.
 * Tokens already encoded stay encoded even if they fall back inside the window. */
size_t e8kv_cache_truncate(e8kv_cache *cache, size_t n_keep);
/* Remove positions [pos, pos + n) of every layer (positions a layer does not hold are ignored) and move
 * the later tokens down by n, so they take the positions pos, pos + 1, ... (sequence reuse: drop a span,
 * keep the rest without recomputing it). Keys shift with their positions only when the cache applies
 * RoPE itself (rope=pre) or has none (rope_theta = 0): a cache of keys that already carry RoPE answers
 * E8KV_ERROR_UNSUPPORTED, and so does a range inside the sink positions. Codes move as bytes; an exact
 * (window) token that moves into a page of coded tokens is coded. Returns the largest token count of any
 * layer; on an error (OUT_OF_MEMORY, or a codec's error coding a moved window token) nothing changed. */
size_t e8kv_cache_remove(e8kv_cache *cache, size_t pos, size_t n);
void e8kv_cache_clear(e8kv_cache *cache);
/* Bytes the cache has allocated for its storage (real, not nominal): every live page (at the aligned
 * size the allocator reserves) plus e8kv_cache_fixed_bytes(). */
size_t e8kv_cache_bytes(const e8kv_cache *cache);
/* The part of e8kv_cache_bytes() that does not grow with tokens: page tables, sink buffers, structs. */
size_t e8kv_cache_fixed_bytes(const e8kv_cache *cache);
/* Tokens per page. */
size_t e8kv_cache_page_tokens(const e8kv_cache *cache);
/* Bits per value of the K and V formats, all side information counted (mean over layers and K/V;
 * exact window/sink tokens not included). */
double e8kv_cache_bits_per_value(const e8kv_cache *cache);
/* The spec a preset name expands to without a calibration, or NULL for an unknown name. */
const char *e8kv_cache_preset_spec(const char *name);
/* The spec a preset name expands to in a cache created with params.calib = calib: near-lossless, balanced
 * and aggressive have a calibrated spec (e8tv formats), used when calib is not NULL and has what it needs
 * (sensitivities for auto=); otherwise, and for calib NULL, the same as e8kv_cache_preset_spec(name). */
const char *e8kv_cache_preset_spec_calib(const char *name, const e8kv_calib *calib);
/* How a cache spec resolves for a model of n_layer layers, without creating a cache: for other caches on
 * the same grammar (the CUDA cache, e8kv_cuda.h). layer_specs (2 * n_layer entries, may be NULL) receives
 * each stream's codec spec, layer_specs[2 * l] the K of layer l and [2 * l + 1] its V, after presets
 * (expanded with calib as e8kv_cache_create would), k=/v=/kv= and the layer rules; an auto= stream keeps
 * the spec written (its rate comes from the calibration at create). The grammar's other items go to
 * items. 0, SPEC (a spec the grammar refuses; codecs are not checked), BAD_ARGUMENT or OUT_OF_MEMORY. */
#define E8KV_CODEC_SPEC_MAX_LEN 63 /* bytes of a codec spec */
typedef struct {
    size_t sink, window, page; /* 0 when not given */
    int rope;                  /* rope=: 1 pre, 0 post, -1 not given */
    int center;                /* center=: 0, 1, 2 (all), -1 not given */
    int auto_rates;            /* auto= was given */
    int evicts;                /* evict= or budget= was given */
} e8kv_cache_spec_items;
size_t e8kv_cache_spec_layers(const char *spec, size_t n_layer, const e8kv_calib *calib,
                              e8kv_cache_spec_items *items, char (*layer_specs)[E8KV_CODEC_SPEC_MAX_LEN + 1]);
/* The eviction items of a cache spec (evict=, recent=, obs=, budget=, evictA-B=; "token eviction" below) as
 * a cache reads them, for caches that evict outside the C cache (the transformers CUDA cache, e8kv.evict):
 * scorer "" when the spec has no evict=, recent and obs their defaults when not given, budget 0 when not
 * given. rest (cap bytes; may be NULL) receives the spec without its eviction items: its other items in
 * their order, joined by ','. 0, SPEC (a spec the grammar refuses, e.g. recent=, obs=, budget= or
 * evictA-B= without evict=), BAD_ARGUMENT, OUT_OF_MEMORY, or DST_TOO_SMALL (rest too small). */
typedef struct {
    char scorer[8]; /* "keykey", "snapkv", "h2o", "stream" or "" */
    float frac;     /* evict=SCORER:F */
    size_t recent, obs, budget;
    size_t n_rules; /* evictA-B=F items */
} e8kv_evict_items;
size_t e8kv_cache_spec_evict(const char *spec, e8kv_evict_items *items, char *rest, size_t cap);
/* 1 when the cache wants keys BEFORE RoPE (rope=pre, explicit or by default): append un-rotated keys
 * and pass queries WITH RoPE; the cache rotates each decoded key at attention time. 0: keys with RoPE. */
int e8kv_cache_keys_pre_rope(const e8kv_cache *cache);

/* ---------------------------------------------------------------- RoPE
 *
 * RoPE as e8kv applies it: the engine's queries and keys and the cache's rope=pre keys go through this one
 * implementation (src/common/rope.c). Pair i of a head vector at position p turns by p·theta^(-2i/head_dim);
 * pairs (i, i + head_dim/2) when neox (GPT-NeoX / Hugging Face Llama layout), else (2i, 2i+1) (GGUF /
 * Meta layout). Each position's cos and sin are those of 64·floor(p/64) (computed in double) turned by those
 * of p mod 64 (a table made in double at create): about two float roundings, no drift along the context,
 * and the same bits for a position however the rows are split. */
typedef struct e8kv_rope e8kv_rope;
/* head_dim even, at most E8KV_MAX_HEAD_DIM (HEAD_DIM); theta > 0 and finite (BAD_ARGUMENT). */
e8kv_rope *e8kv_rope_create(size_t head_dim, float theta, int neox, size_t *err);
/* The same with the model's own frequencies: pair i turns by p·inv_freq[i] (head_dim/2 values, finite and
 * >= 0, else BAD_ARGUMENT), e.g. the inv_freq of a scaled RoPE (Llama 3.1's rope_type llama3, linear, yarn).
 * inv_freq[i] = theta^(-2i/head_dim) gives e8kv_rope_create's rotation bit for bit. */
e8kv_rope *e8kv_rope_create_freqs(size_t head_dim, const double *inv_freq, int neox, size_t *err);
void e8kv_rope_free(e8kv_rope *rope);
/* In place: n rows at positions pos0 .. pos0 + n - 1, each row n_vec head vectors of head_dim floats. */
void e8kv_rope_apply(const e8kv_rope *rope, float *x, size_t n, size_t n_vec, size_t pos0);
/* Bytes the object holds (its offset tables: 64 x head_dim floats). */
size_t e8kv_rope_bytes(const e8kv_rope *rope);

/* ---------------------------------------------------------------- token eviction
 *
 * Cache spec items (src/cache/evict.c):
 *   evict=SCORER:F       each eviction removes the fraction F (0 <= F < 1) of a layer's tokens, chosen per
 *                        KV head by SCORER: keykey (key-key attention: the keys stand in for queries; no
 *                        queries needed), snapkv (attention of the last `obs` queries given, max-pooled
 *                        over 7 neighbours: attended spans are kept whole), h2o (attention accumulated over every query given), stream (sinks and
 *                        the newest tokens only, StreamingLLM). Not with window=.
 *   recent=W             the newest W tokens are never evicted (default 32)
 *   obs=W                snapkv's observation window: the last W queries (default 32)
 *   budget=N             also evict at append when a layer holds more than N + page tokens, down to N (the
 *                        appending call's tokens are kept; scorers needing queries use keykey there)
 *   evictA-B=F           the fraction of layers A..B ("evictA=F" one layer)
 *                        (recent=, obs=, budget= and evictA-B= without evict=: E8KV_ERROR_SPEC)
 *   evict-high, evict-balanced, evict-max, evict-safe
 *                        presets of eviction + calibrated E8 codes, measured at 10.2x, 17.4x, 33.3x and 6.5x
 *                        of f16 on 1600-token prefixes of SmolLM2-135M (e8kv_cache_preset_spec;
 *                        BENCHMARKS.md); passkey recall: evict-safe (half evicted) 65% / 75% of keys at 1K /
 *                        2K-token prompts and evict-high 55% / 75%, against f16's 80% / 80%, with the loss at
 *                        25% depth; they use auto=e8tv (params.calib with sensitivities) and snapkv (queries)
 * The first max(sink, 1) positions are never evicted. Kept tokens keep their positions (RoPE phases):
 * the cache stores each kept slot's position per KV head (4 bytes, in e8kv_cache_bytes), and slots are
 * compacted into the first pages so that the pages after them are freed. Positions stay the caller's:
 * e8kv_cache_n_tokens is the position the next token takes, attend's pos0 is a position; a truncate
 * inside the evicted span and e8kv_cache_remove on an evicted cache answer E8KV_ERROR_UNSUPPORTED.
 */
/* Evict every layer by the spec's scorer and fraction (after a prefill). q: the queries of the last n_q
 * tokens, before RoPE, (n_layer, n_q, n_head * head_dim) at positions q_pos0 .. q_pos0 + n_q - 1, for
 * snapkv and h2o (NULL otherwise). Each layer keeps at least max(sink, 1) + recent tokens and, since
 * pages are whole, up to the end of its last page. Returns the largest number of tokens a layer keeps;
 * BAD_ARGUMENT without evict= in the spec or without queries for snapkv/h2o, DIMENSION, NONFINITE,
 * OUT_OF_MEMORY (layers before the failing one are evicted). */
size_t e8kv_cache_evict(e8kv_cache *cache, const float *q, size_t n_head, size_t n_q, size_t q_pos0);
/* e8kv_cache_evict for a model with learned attention sinks (gpt-oss; e8kv_cache_attend_sinks): sinks,
 * (n_layer, n_head) logits in the scores' units, -INFINITY for a head or layer without one, join the softmax
 * of each query snapkv and h2o observe (a query whose attention goes to its sink adds less to every key;
 * keykey and stream take no queries and ignore them). NULL: e8kv_cache_evict. NONFINITE: a NaN or +inf
 * sink; BAD_ARGUMENT: sinks without queries. */
size_t e8kv_cache_evict_sinks(e8kv_cache *cache, const float *q, size_t n_head, size_t n_q, size_t q_pos0,
                              const float *sinks);
/* Tokens the layer holds (slots); e8kv_cache_n_tokens minus those evicted. */
size_t e8kv_cache_n_kept(const e8kv_cache *cache, size_t layer);

/* ---------------------------------------------------------------- frames (cold tier)
 *
 * A frame stores n_rows rows of row_bytes bytes (codec vectors, or E8 points) losslessly, entropy-coded
 * in pages of rows_per_page rows that can be decoded one at a time; XXH64 over header, tables and page
 * index, XXH32 per page. Layout: doc/format.md §3. Frames of another format version fail with
 * E8KV_ERROR_VERSION; bad bytes with E8KV_ERROR_CORRUPTED / _TRUNCATED / _CHECKSUM, never a fault.
 */
#define E8KV_FRAME_VERSION 1

typedef enum {
    E8KV_FRAME_BYTES = 0,  /* opaque rows (fixed-rate codec vectors): per-byte-position models */
    E8KV_FRAME_E8 = 1      /* rows of E8 points as int16 LE doubled coordinates (row_bytes % 16 == 0) */
} e8kv_frame_content;

typedef enum {
    E8KV_FRAME_STORED = 0, /* raw */
    E8KV_FRAME_RANS = 1,   /* rANS; E8 content uses parity-aware E8 coding */
    E8KV_FRAME_ZSTD = 2    /* zstd, optionally after a delta along rows (the token axis) */
} e8kv_frame_coder;

typedef struct {
    e8kv_frame_content content;
    e8kv_frame_coder coder;
    size_t rows_per_page;  /* 0: one page */
    int delta;             /* ZSTD coder: delta-code each column along rows first */
    int zstd_level;        /* 0: default (3) */
    const void *meta;      /* opaque bytes stored with the frame (e.g. the codec spec), may be NULL */
    size_t meta_size;      /* at most 65535 */
} e8kv_frame_params;

typedef struct {
    unsigned version;
    e8kv_frame_content content;
    e8kv_frame_coder coder;
    int delta;
    size_t row_bytes, n_rows, rows_per_page, n_pages;
    size_t meta_offset, meta_size; /* meta bytes are src[meta_offset .. meta_offset + meta_size) */
    size_t header_size;            /* bytes before the first page */
    size_t frame_size;             /* total bytes of the frame */
} e8kv_frame_info;

/* Largest frame e8kv_frame_encode can write for these sizes. */
size_t e8kv_compress_bound(size_t row_bytes, size_t n_rows, size_t rows_per_page, size_t meta_size);
/* Encode n_rows rows; returns the frame size. A page whose coded form is not smaller is stored raw. */
size_t e8kv_frame_encode(void *dst, size_t dst_capacity, const void *src, size_t row_bytes, size_t n_rows,
                         const e8kv_frame_params *params);
/* Parse and check the header, tables and page index (not the pages). Returns the frame size. */
size_t e8kv_frame_get_info(e8kv_frame_info *info, const void *src, size_t src_size);
/* Decode every row (n_rows * row_bytes bytes); src_size must be the exact frame size. Returns bytes. */
size_t e8kv_frame_decode(void *dst, size_t dst_capacity, const void *src, size_t src_size);
/* Decode one page (random access). Returns bytes written (rows of that page * row_bytes). */
size_t e8kv_frame_decode_page(void *dst, size_t dst_capacity, const void *src, size_t src_size, size_t page);

/* Entropy-coded lattice quantization (ECLQ) of head vectors for E8 frames: the seeded Hadamard rotation,
 * then the closest E8 point to x / step, as int16 doubled coordinates (head_dim / 8 points per vector).
 * E8KV_ERROR_RANGE when a coordinate would not fit int16; NONFINITE for NaN/Inf. Returns values written. */
size_t e8kv_frame_e8_quantize(int16_t *dst, size_t dst_capacity, const float *src, size_t n_vec,
                              size_t head_dim, float step, uint64_t seed);
size_t e8kv_frame_e8_dequantize(float *dst, size_t dst_capacity, const int16_t *src, size_t n_vec,
                                size_t head_dim, float step, uint64_t seed);

/* ---------------------------------------------------------------- saved caches (persistence)
 *
 * A whole cache (parameters as a canonical spec, seed, n_ctx, RoPE options, per-layer token counts, the
 * exact sink and window tokens, every coded page) in one versioned, XXH64-checksummed buffer or file,
 * coded pages losslessly entropy-coded through frames. Layout: doc/format.md §4. A loaded cache gives
 * bit-identical attention output and accepts further appends. Untrusted bytes answer E8KV_ERROR_CORRUPTED
 * / _TRUNCATED / _CHECKSUM / _VERSION, never a fault; so do codes that would decode to NaN or Inf, and
 * non-finite exact tokens or means, whatever their checksums. `meta` is opaque caller data kept in the file
 * (the CLI stores the prompt's token ids there).
 */
/* 3: written for caches made with params.rope_freqs (the frequencies inside, a calibration too when it has
 * e8t streams); 2: with e8t streams (calibration inside); 1 otherwise (each version's bytes unchanged) */
#define E8KV_CACHE_FORMAT_VERSION 3
#define E8KV_MAX_ROPE_FREQS (E8KV_MAX_HEAD_DIM / 2)

typedef struct {
    unsigned version;
    size_t n_layer, n_head_kv, head_dim, n_ctx, page_tokens;
    uint64_t seed;
    float rope_theta;
    int rope_neox;
    char spec[E8KV_CACHE_SPEC_MAX_LEN + 1]; /* the canonical cache spec that recreates the configuration */
    size_t meta_offset, meta_size; /* meta bytes are src[meta_offset .. meta_offset + meta_size) */
    size_t file_size;
    size_t calib_offset, calib_size; /* the saved calibration (version 2, e8t streams); size 0 when absent */
    size_t n_rope_freqs;             /* version 3: the cache's params.rope_freqs (head_dim/2), else 0 */
    float rope_freqs[E8KV_MAX_ROPE_FREQS];
} e8kv_cache_file_info;

/* Largest e8kv_cache_save output for the cache as it is now. */
size_t e8kv_cache_save_bound(const e8kv_cache *cache, size_t meta_size);
/* Returns bytes written. E8KV_ERROR_UNSUPPORTED when the per-layer formats need more than 32 layer rules. */
size_t e8kv_cache_save(void *dst, size_t dst_capacity, const e8kv_cache *cache, const void *meta,
                       size_t meta_size);
/* Check the header and the XXH64 (not the layers). Returns the saved size (must equal src_size). */
size_t e8kv_cache_file_get_info(e8kv_cache_file_info *info, const void *src, size_t src_size);
/* A new cache with the saved parameters and contents (n_threads as in e8kv_cache_params). */
e8kv_cache *e8kv_cache_load(const void *src, size_t src_size, size_t n_threads, size_t *err);
/* Replace the contents of an existing cache by the saved ones. Its n_layer / n_head_kv / head_dim must equal
 * the saved ones (E8KV_ERROR_DIMENSION), its formats, seed, window, sink, page and RoPE options too
 * (E8KV_ERROR_SPEC), its n_ctx must hold every saved token (E8KV_ERROR_CONTEXT_FULL). Returns the largest
 * layer token count; on any error the cache is left empty. */
size_t e8kv_cache_load_into(e8kv_cache *cache, const void *src, size_t src_size);
/* File helpers: save_file returns bytes written (E8KV_ERROR_IO when the file cannot be written);
 * read_file reads a whole file into *dst (malloc'd, free() it) and returns its size, E8KV_ERROR_IO when
 * the path cannot be opened or read or is not a regular file (a directory, a FIFO, a device); load_file
 * reads with it (so does e8kv_calib_load_file). */
size_t e8kv_cache_save_file(const e8kv_cache *cache, const char *path, const void *meta, size_t meta_size);
size_t e8kv_cache_read_file(void **dst, const char *path);
e8kv_cache *e8kv_cache_load_file(const char *path, size_t n_threads, size_t *err);

#ifdef __cplusplus
}
#endif
#endif /* E8KV_H */
