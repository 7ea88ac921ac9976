/* e8kv on the GPU: a device-resident paged KV cache of fixed-rate codes and a fused decode attention that
 * reads the codes and decodes them in registers (built only when CMake finds a CUDA compiler).
 *
 * The cache is laid out as serving engines lay theirs out (vLLM's paged attention): one device pool per
 * (layer, stream K/V) of `n_blocks` pages, a page holding `block_size` tokens of every KV head; a
 * sequence is a block table (page ids) plus a length. Two ways to use it:
 *  - the cache owns the sequences: e8kv_cuda_seq_create / fork / free, e8kv_cuda_seq_append and
 *    e8kv_cuda_seq_attend (page allocation, copy-on-write of a forked partial page, block tables kept
 *    on the device);
 *  - the caller owns the block tables (a serving engine's scheduler): e8kv_cuda_append_slots writes
 *    token rows into slots (page * block_size + offset) and e8kv_cuda_attend reads with the caller's
 *    block tables and context lengths. The two must not be mixed on one cache.
 * Page bytes are specified in doc/format.md §6. All pages are allocated once at creation (one
 * cudaMalloc); e8kv_cuda_cache_device_bytes says exactly how many bytes the cache holds on the device.
 *
 * Formats: the library's cache spec grammar (e8kv.h: a format for K and V, k=/v=/kv=, layer rules such as
 * "k=e8box:4,v=bf16,layers0-1=bf16,layer31=e8p:2"), resolved by e8kv_cache_spec_layers, with formats whose
 * CPU codec has a GPU page format (e8kv_codec_gpu_format); each page holds that codec's bytes:
 *   e8box:4   the CPU codec e8box:4 (doc/format.md §2.4) after the seeded rotation, same bytes per vector
 *   e8box:3   the CPU codec e8box:3 (§2.4, 3.1875 bits per value at d = 128, 3.25 at d = 64) likewise; K
 *             and V with any format but e8p:2 (with e8box:4 through the pipelined e8box kernel, with
 *             bf16/f16 through the mixed-format kernel)
 *   e8p:2     the CPU codec e8p:2 (§2.5) after the seeded rotation, same bytes per vector; K and V of a
 *             layer both (a layer pairing it with another format is E8KV_ERROR_SPEC)
 *   bf16, f16 raw pages (no rotation), the CPU codecs bf16 and f16
 *   sink=N    (N ≤ E8KV_CUDA_SINK_MAX) the first N positions of every sequence are also kept exact, f32, in
 *             sink rows (as the CPU cache's sink=); attention reads them from there, not from the pages.
 *             The cache holds max_seqs sink rows per (layer, stream); an owned sequence's row is its id.
 *             A caller that owns the block tables writes its sequences' first N tokens with
 *             e8kv_cuda_append_sink_async (as well as into their slots) and names each sequence's row in
 *             e8kv_cuda_attend_rows.
 *   center=   as on the CPU, the default is center=1: the e8box and e8p streams code x − μ, μ the mean of
 *             the sequence's first append (E8KV_CUDA_CENTER_MIN_TOKENS or more tokens, else 0) per layer,
 *             stream and KV head, kept in f32 in the sequence's row (max_seqs rows, as for sink=); the
 *             attention adds μ back. The pages then hold the bytes of the CPU cache of the same spec (its
 *             codec's bytes of x − μ). center=0: uncentred, the codec's bytes of x. A caller that owns the
 *             block tables sets a row's means with e8kv_cuda_set_means_async, appends with
 *             e8kv_cuda_append_rows_async and attends with e8kv_cuda_attend_rows; rows never set hold 0.
 *             center=rope (params.rope_theta > 0 or params.rope_freqs; layers whose K and V are both e8box, or both
 *             e8p:2): keys arrive after RoPE, and a key's mean after RoPE misses the part of its mean that RoPE turns.
 *             So for each (sequence, layer, KV head) the first append also gives the keys' mean before RoPE (each key
 *             turned back by its position, interleaved pairs (x[2i], x[2i + 1]) at angle p·theta^(−2i/d), or
 *             p·rope_freqs[i]), and the 8 RoPE pairs where that mean and the one after RoPE differ most keep the mean
 *             before RoPE turned to each key's position p: K codes x − μ_post − R_p·μ_pre (μ_post 0 on those pairs),
 *             and the attention adds q·R_p·μ_pre back per key (one more tensor-core product per 16 keys). Positions are
 *             the tokens' indices in their sequence (any constant offset, e.g. the model's, cancels); a caller that
 *             owns the block tables appends with e8kv_cuda_append_pos_async. K and V both e8box, or both e8p:2
 *             (E8KV_ERROR_SPEC otherwise).
 * Not on the GPU yet, E8KV_ERROR_SPEC: window=, rope=pre (keys arrive after RoPE), auto=, eviction,
 * page= (block_size is the parameter), presets and the formats without a GPU page format.
 * head_dim 64, 128 or 256 (E8KV_ERROR_HEAD_DIM otherwise); query heads per KV head 1..8 (1..4 at 256).
 * head_dim 256 (Gemma 3 1B/4B/12B): each vector is kept as its two halves (coordinates 0..127, 128..255),
 * each coded by the head_dim-128 codec of the spec and seed, so its bytes are those of the two halves'
 * e8kv_codec_encode (e8kv_cuda_seq_read_vector returns them one after the other), and a page holds
 * 2 · n_head_kv heads of 128; the attention adds the halves' scores before its softmax (e8box and e8p:2 pages
 * on the tensor-core kernels of 128, raw pages on a simpler CUDA-core kernel). center=rope is
 * E8KV_ERROR_SPEC there (its RoPE pairs would straddle the halves); center=1 and the rest as above.
 *
 * Errors are the library's size_t codes (e8kv.h); a failing CUDA call is E8KV_ERROR_CUDA, a failed
 * allocation E8KV_ERROR_OUT_OF_MEMORY. A rejected append (NaN/Inf: E8KV_ERROR_NONFINITE, a value beyond
 * the format's range: E8KV_ERROR_RANGE) leaves every sequence's length unchanged.
 * Not thread-safe: one host thread per cache. Pointers named d_* are device pointers. */
#ifndef E8KV_CUDA_H
#define E8KV_CUDA_H

#include "e8kv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { E8KV_DTYPE_F32 = 0, E8KV_DTYPE_F16 = 1, E8KV_DTYPE_BF16 = 2 } e8kv_dtype;

typedef struct {
    size_t n_layer;
    size_t n_head_kv;
    size_t head_dim;   /* 64, 128 or 256 */
    size_t block_size; /* tokens per page, a multiple of 16 (0: 16) */
    size_t n_blocks;   /* pages per (layer, stream) */
    const char *spec;  /* "e8box:4", "e8box:3", "e8p:2", "bf16", "f16", "k=e8box:4,v=bf16", ... (above) */
    uint64_t seed;     /* rotation seed: the same bytes as e8kv_codec_create(spec, head_dim, seed) */
    size_t max_ctx;    /* longest sequence (0: n_blocks * block_size); sizes block tables and workspace */
    size_t max_seqs;   /* sequences the cache may own at once (0: 256) */
    size_t max_batch;  /* sequences per attend call (0: 256); sizes the split-K workspace */
    size_t max_n_head; /* query heads per attend call (0: 8 * n_head_kv; 4 * n_head_kv at head_dim 256) */
    size_t max_append; /* tokens per append call before it is cut into pieces (0: 4096) */
    int device;        /* CUDA device ordinal */
    float rope_theta;  /* RoPE base frequency, needed by center=rope (0: none) ... */
    const float *rope_freqs; /* ... or the model's own frequencies (head_dim/2 values, finite, >= 0; NULL: from
                              * rope_theta), e.g. a scaled RoPE's inv_freq (Llama 3.1's llama3, linear, yarn) */
    size_t rope_positions;   /* center=rope: positions [0, rope_positions) have a cos/sin table (at least
                              * max_ctx; more for sequences whose positions pass their context, as with
                              * e8kv_cuda_set_row_shifts) */
} e8kv_cuda_cache_params;

typedef struct e8kv_cuda_cache e8kv_cuda_cache;

/* 1 when a CUDA device is usable (the tests skip otherwise). */
int e8kv_cuda_available(void);

e8kv_cuda_cache *e8kv_cuda_cache_create(const e8kv_cuda_cache_params *params, size_t *err);
void e8kv_cuda_cache_free(e8kv_cuda_cache *cache);

/* Every byte the cache holds on the device (pages, sink rows, block tables, workspace), as allocated. */
size_t e8kv_cuda_cache_device_bytes(const e8kv_cuda_cache *cache);
/* Bytes of one token in the pages: all layers, K and V, all KV heads. */
size_t e8kv_cuda_cache_token_bytes(const e8kv_cuda_cache *cache);
/* Bytes of one vector (one token, one head) of a stream (0 = K, 1 = V) of a layer (head_dim 256: of its two
 * halves). */
size_t e8kv_cuda_cache_vector_bytes(const e8kv_cuda_cache *cache, size_t layer, int stream);
/* The page pool of (layer, stream): its device address and the bytes of one page. For zero-copy use by a
 * serving engine and for tests (doc/format.md §6). Returns the page size or an error. */
size_t e8kv_cuda_cache_pages(const e8kv_cuda_cache *cache, size_t layer, int stream, void **d_pool);

/* ---- caller-owned block tables (serving-engine style) ----
 * Write n_tok token rows into slots: d_slots[i] = page * block_size + offset (device int64; a negative
 * slot skips the row; a slot of n_blocks * block_size or more is not written and is E8KV_ERROR_RANGE).
 * d_k, d_v: (n_tok, n_head_kv * head_dim) of `dtype`, device memory. Synchronous:
 * returns n_tok or an error. A rejected call (NaN/Inf, out of range) may have written some of its slots:
 * the engine treats them as unwritten, as it would after any failed step. */
size_t e8kv_cuda_append_slots(e8kv_cuda_cache *cache, size_t layer, const int64_t *d_slots, const void *d_k,
                              const void *d_v, size_t n_tok, e8kv_dtype dtype);
/* Graph-safe append: the same writes as e8kv_cuda_append_slots, launched on `stream` (a cudaStream_t,
 * NULL = default) with no host synchronisation, no allocation and no host state that changes between
 * calls, so that a decode step (append, then attend) can be captured in a CUDA graph and replayed with new
 * slots, rows and context lengths in the same device buffers. A rejected row (NaN/Inf, out of range) sets
 * bits in the caller's device word *d_status (atomic OR; the call never clears it): the caller reads it
 * when it likes (after many steps) and turns it into an error with e8kv_cuda_status_error. Returns n_tok
 * or an argument error; launch errors are E8KV_ERROR_CUDA. Bytes written: bit-identical to the
 * synchronous call. The first append or attend of a cache is not special (tables are uploaded at
 * creation). */
#define E8KV_CUDA_STATUS_NONFINITE 1u /* a NaN or Inf value */
#define E8KV_CUDA_STATUS_RANGE 2u     /* a value beyond the format's range, a slot past the pool */
size_t e8kv_cuda_append_slots_async(e8kv_cuda_cache *cache, size_t layer, const int64_t *d_slots,
                                    const void *d_k, const void *d_v, size_t n_tok, e8kv_dtype dtype,
                                    unsigned *d_status, void *stream);
/* 0 for a status word of 0, else E8KV_ERROR_NONFINITE or E8KV_ERROR_RANGE (NONFINITE first). */
size_t e8kv_cuda_status_error(unsigned status);
/* Bytes of the workspace e8kv_cuda_attend needs for these sizes. */
size_t e8kv_cuda_attend_workspace_bytes(const e8kv_cuda_cache *cache, size_t n_seq, size_t n_head,
                                        size_t max_ctx);
/* Decode attention: one query token per sequence against its first d_ctx_lens[s] tokens.
 * d_q: (n_seq, n_head * head_dim) of `dtype`; d_out: (n_seq, n_head * head_dim) f32;
 * d_block_tables: (n_seq, max_blocks_per_seq) int32 page ids; d_ctx_lens: (n_seq) int32, each at most
 * max_ctx; scores scaled by 1/sqrt(head_dim). A context past the table's max_blocks_per_seq pages gives that
 * sequence NaN output (nothing past its table is read). Page ids are not checked by the kernels (a check
 * there costs ~10% of the call): they must be pages of the pool, in [0, n_blocks);
 * e8kv_cuda_check_tables_async checks them. Asynchronous on `stream` (a cudaStream_t, NULL = default);
 * d_workspace of e8kv_cuda_attend_workspace_bytes (NULL: the cache's own, for n_seq <= max_batch); a
 * caller's workspace must be zeroed (cudaMemset) before its first use: it starts with the split counters
 * (room for max_batch sequences, or n_seq when more), which every call leaves at zero again, so calls that
 * share one workspace must be ordered (one stream); calls of up to max_batch sequences share one whatever
 * their n_seq (calls of more, only with calls of the same n_seq).
 * Returns n_seq * n_head * head_dim or an argument error; launch errors are E8KV_ERROR_CUDA. */
size_t e8kv_cuda_attend(e8kv_cuda_cache *cache, size_t layer, float *d_out, const void *d_q, e8kv_dtype dtype,
                        size_t n_seq, size_t n_head, const int32_t *d_block_tables, size_t max_blocks_per_seq,
                        const int32_t *d_ctx_lens, size_t max_ctx, void *d_workspace, size_t workspace_bytes,
                        void *stream);

/* Checks caller-owned block tables and context lengths as e8kv_cuda_attend reads them: every entry a context
 * reads (entries 0 .. ⌈ctx_lens[s] / block_size⌉ − 1 of row s) must be a page of the pool, [0, n_blocks), and
 * each context in [0, max_blocks_per_seq · block_size]; otherwise E8KV_CUDA_STATUS_RANGE is ORed into
 * *d_status (read it as in e8kv_cuda_append_slots_async). Asynchronous on `stream`, graph-safe; one small
 * kernel over the tables (for an engine's debug builds, or once per step). Returns n_seq or an argument
 * error. */
size_t e8kv_cuda_check_tables_async(const e8kv_cuda_cache *cache, const int32_t *d_block_tables, size_t n_seq,
                                    size_t max_blocks_per_seq, const int32_t *d_ctx_lens, unsigned *d_status,
                                    void *stream);

/* Each sequence of a caller-owned cache may have a row (0 .. max_seqs − 1, the caller's choice): its sink
 * rows (sink=N) and its means (center=1) live there. */
/* center=1 caches (e8kv_cuda_cache_centered): sets the means of `row` for this layer from n_tok K/V rows (as
 * in append_slots; a sequence's first append, the CPU cache's rule): their mean, summed in double in token
 * order, when n_tok ≥ E8KV_CUDA_CENTER_MIN_TOKENS, else 0. Asynchronous on `stream`. row ≥ max_seqs:
 * E8KV_ERROR_BAD_ARGUMENT; an uncentred cache: E8KV_ERROR_SPEC. NaN/Inf make the means NaN, and the
 * appends that use them are then refused (NONFINITE). */
size_t e8kv_cuda_set_means_async(e8kv_cuda_cache *cache, size_t layer, size_t row, const void *d_k,
                                 const void *d_v, size_t n_tok, e8kv_dtype dtype, void *stream);
/* e8kv_cuda_append_slots_async with each token's row and sink slot, in one launch per stream. d_rows (n_tok
 * int32; NULL: none; negative: no mean): centred streams code x − μ of that row; a row of max_seqs or more
 * is E8KV_CUDA_STATUS_RANGE (the token is coded uncentred); an uncentred cache ignores it. d_sink_slots
 * (n_tok int64; NULL: none; sink=N caches, else E8KV_ERROR_SPEC): the token's exact values also go to sink
 * slot row * N + position, as e8kv_cuda_append_sink_async writes them (negative: none; max_seqs * N or
 * more: not written, RANGE). Graph-safe. e8kv_cuda_append_slots(_async) code every token uncentred. */
size_t e8kv_cuda_append_rows_async(e8kv_cuda_cache *cache, size_t layer, const int64_t *d_slots,
                                   const int32_t *d_rows, const int64_t *d_sink_slots, const void *d_k,
                                   const void *d_v, size_t n_tok, e8kv_dtype dtype, unsigned *d_status,
                                   void *stream);
/* e8kv_cuda_append_rows_async with each token's position in its sequence (d_pos, n_tok int32, in
 * [0, max(max_ctx, rope_positions)); else the token is coded uncentred and E8KV_CUDA_STATUS_RANGE is set): a center=rope cache
 * needs them with d_rows (E8KV_ERROR_BAD_ARGUMENT without), any other ignores them. Graph-safe. */
size_t e8kv_cuda_append_pos_async(e8kv_cuda_cache *cache, size_t layer, const int64_t *d_slots,
                                  const int32_t *d_rows, const int64_t *d_sink_slots, const int32_t *d_pos,
                                  const void *d_k, const void *d_v, size_t n_tok, e8kv_dtype dtype,
                                  unsigned *d_status, void *stream);
/* 1 when some stream is centred (center=1, the default, and an e8box or e8p stream). */
int e8kv_cuda_cache_centered(const e8kv_cuda_cache *cache);
/* 1 when some key stream has the centre of center=rope (its appends with rows need positions). */
int e8kv_cuda_cache_rope_centred(const e8kv_cuda_cache *cache);
/* center=rope: the attention and the gather take a key's position to be its index in its sequence's block
 * table. A caller that drops whole pages from the middle of a sequence (as a token budget does: the first
 * pages kept, the oldest after them dropped, the table closed up) keeps the kept keys' positions with a
 * shift per row: d_shifts (max_seqs, 2) int32, caller-owned device memory, row r's (from, off): index i ≥ from
 * is at position i + off (from a multiple of 16, off ≥ 0; the caller's appends pass those positions). The
 * cache keeps the pointer (not the values) until it is set again (NULL: no shifts), so the caller updates
 * the values in place on its stream, in CUDA graphs too. A cache without center=rope: E8KV_ERROR_SPEC. */
size_t e8kv_cuda_set_row_shifts(e8kv_cuda_cache *cache, const int32_t *d_shifts);
#define E8KV_CUDA_CENTER_MIN_TOKENS 16

/* Learned attention sinks (gpt-oss) of one layer: d_sinks, caller-owned device memory of n_head floats, one
 * logit per query head in the scores' units (q·k / sqrt(head_dim)) that joins every softmax of that head
 * with a value of zero: out = Σ_j e^(s_j) v_j / (e^sink + Σ_j e^(s_j)), as e8kv_cache_attend_sinks on the
 * CPU (-inf: no sink for that head; a NaN gives that head NaN outputs). The cache keeps the pointer (not the
 * values) until it is set again (NULL: none), so the caller may update the values in place on its stream,
 * in CUDA graphs too; the layer's attention must then be called with this n_head (else
 * E8KV_ERROR_DIMENSION). Returns 0 or an error (layer out of range: E8KV_ERROR_BAD_ARGUMENT; n_head not a
 * multiple of n_head_kv, or more than 8 per KV head: E8KV_ERROR_DIMENSION). */
size_t e8kv_cuda_set_layer_sinks(e8kv_cuda_cache *cache, size_t layer, const float *d_sinks, size_t n_head);

/* sink=N caches (e8kv_cuda_cache_sink > 0): the exact rows of positions 0..N-1. Writes n_tok K/V rows (as
 * in append_slots) into sink slots d_sink_slots[i] = row * N + position (row < max_seqs, position < N;
 * negative: skipped). Graph-safe like e8kv_cuda_append_slots_async; NaN/Inf set E8KV_CUDA_STATUS_NONFINITE
 * in *d_status, a slot of max_seqs * N or more is not written and sets E8KV_CUDA_STATUS_RANGE. The same
 * tokens must also be appended to their slots (the pages keep every position's codes). A cache without sink
 * rows: E8KV_ERROR_SPEC. */
size_t e8kv_cuda_append_sink_async(e8kv_cuda_cache *cache, size_t layer, const int64_t *d_sink_slots,
                                   const void *d_k, const void *d_v, size_t n_tok, e8kv_dtype dtype,
                                   unsigned *d_status, void *stream);
/* e8kv_cuda_attend with each sequence's row (its sink rows and means): d_rows (n_seq) int32 in
 * [0, max_seqs); a row outside that range makes the sequence's output NaN. NULL: row s for batch entry s
 * (what e8kv_cuda_attend does; then n_seq ≤ max_seqs on a cache with sink rows or means). A cache with
 * neither ignores it. */
size_t e8kv_cuda_attend_rows(e8kv_cuda_cache *cache, size_t layer, float *d_out, const void *d_q,
                             e8kv_dtype dtype, size_t n_seq, size_t n_head, const int32_t *d_block_tables,
                             size_t max_blocks_per_seq, const int32_t *d_ctx_lens, size_t max_ctx,
                             const int32_t *d_rows, void *d_workspace, size_t workspace_bytes, void *stream);
/* A chunk of many new tokens after a past (chunked prefill, a long turn of a chat): the decode kernel reads
 * the whole past once per query row, so such a chunk is better served by a dense attention kernel (flash /
 * SDPA, many query rows per K/V read) over the values this writes. For n_seq sequences (block tables and
 * rows as in e8kv_cuda_attend_rows), the values the attention reads at positions 0 .. n_tok − 1: the pages
 * decoded as the CPU codec decodes them, un-rotated, plus the means (center=1), and the sink rows' exact
 * values at positions below N (sink=N); written in `dtype` to d_k and d_v as (n_seq, n_head_kv, n_tok,
 * head_dim), row-major (f32 output: bit-identical to the CPU codec's decode + μ). A page id outside the
 * pool, or a row outside [0, max_seqs) on a cache with sink rows or means, makes the vectors it covers NaN.
 * Asynchronous on `stream`; graph-safe. Returns n_seq * n_head_kv * n_tok * head_dim or an argument error
 * (n_tok > max_blocks_per_seq * block_size, or 2^27 vectors n_seq * n_head_kv * n_tok or more:
 * E8KV_ERROR_DIMENSION). */
size_t e8kv_cuda_gather_async(const e8kv_cuda_cache *cache, size_t layer, void *d_k, void *d_v,
                              e8kv_dtype dtype, size_t n_seq, size_t n_tok, const int32_t *d_block_tables,
                              size_t max_blocks_per_seq, const int32_t *d_rows, void *stream);
/* Copy-on-write for a caller that forks sequences (beam search, several samples of one prompt): page
 * src[i] is copied to page dst[i] in every (layer, stream) pool (host arrays of n page ids in [0, n_blocks)),
 * asynchronously on `stream`, after the work already queued there. No destination may appear twice or also be
 * a source (so that the order of the copies does not matter): E8KV_ERROR_BAD_ARGUMENT, nothing copied.
 * Returns n. Full pages shared by several block tables need no copy (the appends never write them again);
 * the page a sequence appends into next must be its own. */
size_t e8kv_cuda_copy_pages_async(e8kv_cuda_cache *cache, const int32_t *src, const int32_t *dst, size_t n,
                                  void *stream);
/* The same for rows (0 .. max_seqs − 1): row src[i]'s sink rows (sink=N) and means (center=1), every layer
 * and stream, to row dst[i]. A row may be shared by sequences that no longer write their sink rows (each
 * has N tokens or more). A cache with neither sink rows nor means copies nothing. Returns n. */
size_t e8kv_cuda_copy_rows_async(e8kv_cuda_cache *cache, const int32_t *src, const int32_t *dst, size_t n,
                                 void *stream);
/* Make dst a copy of src: every page, sink row and mean (and the RoPE table and rotation signs they were made
 * with), and the owned sequences' tables, lengths and page allocation, so that dst attends and appends as src
 * would from here on and the two then change independently (a saved prompt reused by several requests:
 * transformers' copy.deepcopy of a cache). Both must have been created with the same parameters (formats,
 * shapes, block size, n_blocks, max_ctx, max_seqs, max_batch, max_n_head, max_append, sink, centring, RoPE
 * positions; the seed and RoPE frequencies may differ: dst takes src's) on the same device:
 * E8KV_ERROR_BAD_ARGUMENT otherwise, nothing copied. Asynchronous on `stream`,
 * after the work already queued there (the host bookkeeping is copied at once). What the caller points the
 * cache at (learned sinks: e8kv_cuda_set_layer_sinks; row shifts) is not copied: set it on dst. Returns 0. */
size_t e8kv_cuda_cache_copy_async(e8kv_cuda_cache *dst, const e8kv_cuda_cache *src, void *stream);
/* The cache's state as bytes (doc/format.md §7), for saving it to host memory or a file: a header naming
 * its layout, the pages of the given ranges of page ids in every (layer, stream) pool (ranges[2i]: first
 * page, ranges[2i + 1]: count, in [0, n_blocks), not overlapping; NULL: every page), the sink rows, means,
 * RoPE table and rotation signs, the owned sequences' tables and bookkeeping, and an XXH64 of it all.
 * dst NULL: the bytes it needs. Synchronous (waits for the device). Returns the bytes written or an error
 * (E8KV_ERROR_BAD_ARGUMENT for bad ranges, E8KV_ERROR_DST_TOO_SMALL when dst is too small). */
size_t e8kv_cuda_cache_export(const e8kv_cuda_cache *cache, const int64_t *ranges, size_t n_ranges, void *dst,
                              size_t dst_capacity);
/* Loads such bytes into a cache of the same parameters (as e8kv_cuda_cache_copy_async: the seed and RoPE
 * frequencies may differ, it takes the saved ones); pages outside the saved ranges keep their bytes.
 * Untrusted bytes: E8KV_ERROR_TRUNCATED, _CORRUPTED, _CHECKSUM, _VERSION; a cache of another layout:
 * E8KV_ERROR_BAD_ARGUMENT; on any of these nothing is changed. Synchronous. Returns 0 or an error. */
size_t e8kv_cuda_cache_import(e8kv_cuda_cache *cache, const void *src, size_t src_size);
/* N of the spec's sink=N (0: none). */
size_t e8kv_cuda_cache_sink(const e8kv_cuda_cache *cache);
#define E8KV_CUDA_SINK_MAX 64

/* ---- sequences owned by the cache ---- */
/* A new empty sequence: its id, or an error (E8KV_ERROR_CONTEXT_FULL when max_seqs are live). */
size_t e8kv_cuda_seq_create(e8kv_cuda_cache *cache);
/* A copy of `seq` sharing its full pages (its partial last page is copied): the new id or an error. */
size_t e8kv_cuda_seq_fork(e8kv_cuda_cache *cache, size_t seq);
/* Releases the sequence's pages (those no other sequence shares). */
size_t e8kv_cuda_seq_free(e8kv_cuda_cache *cache, size_t seq);
/* Tokens stored for (seq, layer). */
size_t e8kv_cuda_seq_length(const e8kv_cuda_cache *cache, size_t seq, size_t layer);
/* Pages free in the pool. */
size_t e8kv_cuda_cache_free_pages(const e8kv_cuda_cache *cache);
/* Append n_tok tokens to one sequence (prefill) for one layer; d_k, d_v device rows as in append_slots.
 * Returns the new length or an error (E8KV_ERROR_OUT_OF_MEMORY when the pool is full: nothing stored
 * is lost, the sequence keeps its length). */
size_t e8kv_cuda_seq_append(e8kv_cuda_cache *cache, size_t layer, size_t seq, const void *d_k,
                            const void *d_v, size_t n_tok, e8kv_dtype dtype);
/* One token for each of n_seq sequences (a decode step): d_k, d_v (n_seq, n_head_kv * head_dim). */
size_t e8kv_cuda_seq_append_batch(e8kv_cuda_cache *cache, size_t layer, const size_t *seqs, size_t n_seq,
                                  const void *d_k, const void *d_v, e8kv_dtype dtype);
/* Decode attention for n_seq owned sequences (host ids) over each one's tokens of this layer; d_q and
 * d_out as in e8kv_cuda_attend. Synchronous. */
size_t e8kv_cuda_seq_attend(e8kv_cuda_cache *cache, size_t layer, float *d_out, const void *d_q,
                            e8kv_dtype dtype, const size_t *seqs, size_t n_seq, size_t n_head);
/* e8kv_cuda_gather_async for owned sequences (host ids): positions 0 .. n_tok − 1 of each (n_tok at most
 * every one's length, else E8KV_ERROR_DIMENSION). Synchronous. */
size_t e8kv_cuda_seq_gather(e8kv_cuda_cache *cache, size_t layer, void *d_k, void *d_v, e8kv_dtype dtype,
                            const size_t *seqs, size_t n_seq, size_t n_tok);
/* Copies the bytes of vector (seq, layer, stream, pos, head) back to the host in the CPU codec's order
 * (e8kv_codec_encode of the same spec; head_dim 256: the halves' codes, half 0 first): what the tests
 * compare. Returns the vector bytes or an error. */
size_t e8kv_cuda_seq_read_vector(const e8kv_cuda_cache *cache, void *dst, size_t dst_capacity, size_t seq,
                                 size_t layer, int stream, size_t pos, size_t head);
/* The same for a caller-owned slot. */
size_t e8kv_cuda_read_slot(const e8kv_cuda_cache *cache, void *dst, size_t dst_capacity, size_t layer,
                           int stream, int64_t slot, size_t head);

#ifdef __cplusplus
}
#endif

#endif
