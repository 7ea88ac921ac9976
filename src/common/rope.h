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

/* positions per base angle: position p's angle is that of 64·floor(p / 64) turned p mod 64 times */
#define E8KV_ROPE_BLOCK 64

/* n rows x (each n_vec head vectors of d floats, rows contiguous) at consecutive positions: row t turns
 * pair i by the angle whose cos, sin are cc[i], ss[i] (double) rounded to float, (x0, x1) -> (x0·C − x1·S,
 * x0·S + x1·C) in float, then (cc, ss) advance one position by the step (dc, ds) in double; neox: pairs
 * (i, i + d/2), else (2i, 2i + 1). n_vec = 0 (x unused) only advances. The twins do the same IEEE operations
 * one by one (no FMA) and give the same bits; _avx2 needs d % 16 == 0 and falls back to _ref otherwise. */
void e8kv_rope_rows_ref(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, double *restrict cc,
                        double *restrict ss, const double *restrict dc, const double *restrict ds);
void e8kv_rope_rows_avx2(float *restrict x, size_t n, size_t n_vec, size_t d, int neox, double *restrict cc,
                         double *restrict ss, const double *restrict dc, const double *restrict ds);

#endif
