/* RoPE, one implementation for the engine's queries and keys and the cache's rope=pre keys (include/e8kv.h
 * e8kv_rope_*): the per-row kernels, reference and AVX2 twins. */
#ifndef E8KV_ROPE_H
#define E8KV_ROPE_H

#include "common.h"

/* Functions whose float products and sums must not be fused into FMAs (twins that promise the same bits):
 * E8KV_NO_FP_CONTRACT before the definition, E8KV_NO_FP_CONTRACT_BODY first in its body. */
#if defined(__clang__)
#define E8KV_NO_FP_CONTRACT
#define E8KV_NO_FP_CONTRACT_BODY _Pragma("clang fp contract(off)")
#elif defined(__GNUC__)
#define E8KV_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#define E8KV_NO_FP_CONTRACT_BODY
#else
#define E8KV_NO_FP_CONTRACT
#define E8KV_NO_FP_CONTRACT_BODY
#endif

/* positions per base angle: position p turns by the base 64·floor(p / 64) (double) then offset p mod 64 */
#define E8KV_ROPE_BLOCK 64

/* n rows x (each n_vec head vectors of d floats, rows contiguous) at consecutive positions of one block:
 * row t's angle = base (cb, sb: cos and sin, d/2 each) turned by the offset table's row t (ct, st: rows of
 * d/2, the caller points them at the first row's offset), in double: C = (float)(cb·ct − sb·st), S =
 * (float)(sb·ct + cb·st) per pair, then (x0, x1) -> (x0·C − x1·S, x0·S + x1·C) in float; neox: pairs
 * (i, i + d/2), else (2i, 2i + 1). The twins do the same IEEE operations one by one (no FMA) and give the
 * same bits; _avx2 needs d % 16 == 0 and falls back to _ref otherwise. */
void e8kv_rope_rows_ref(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, const double *restrict cb,
                        const double *restrict sb, const double *restrict ct, const double *restrict st);
void e8kv_rope_rows_avx2(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, const double *restrict cb,
                         const double *restrict sb, const double *restrict ct, const double *restrict st);

#endif
