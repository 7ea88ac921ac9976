/* ggml tensor types: block geometry of every type id the GGUF spec pins, and dequantization to float of
 * the types the engine reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q6_K, Q4_K).
 * Block layouts follow ggml's ggml-common.h (block_q4_0 ... block_q6_k); see dequant.c. */
#ifndef E8KV_DEQUANT_H
#define E8KV_DEQUANT_H

#include "e8kv.h"

#include <stddef.h>
#include <stdint.h>

/* Elements per block of a ggml type id (1 for plain types); 0 when the id is unknown. */
size_t e8kv_ggml_block_elems(uint32_t type);
/* Bytes per block of a ggml type id; 0 when the id is unknown. */
size_t e8kv_ggml_block_bytes(uint32_t type);
/* Short name ("Q4_K", "F32", ...); "unknown" for ids not in the table. */
const char *e8kv_ggml_type_name(uint32_t type);
/* 1 when e8kv_ggml_dequant handles the type. */
int e8kv_ggml_can_dequant(uint32_t type);

/* Bytes of n_elems values of `type` stored in whole blocks; 0 when the type is unknown, n_elems is not
 * a multiple of the block, or the byte count overflows size_t. */
size_t e8kv_ggml_row_bytes(uint32_t type, uint64_t n_elems);

/* Dequantize n_elems values (a multiple of the block size) of `type` from src (n_bytes) into dst.
 * Returns n_elems, or E8KV_ERROR_UNSUPPORTED (type not handled), E8KV_ERROR_BAD_ARGUMENT (n_elems not a
 * multiple of the block), E8KV_ERROR_SRC_SIZE (src_size != row bytes), E8KV_ERROR_DST_TOO_SMALL. */
size_t e8kv_ggml_dequant(float *dst, size_t dst_capacity, const void *src, size_t src_size, uint32_t type,
                         uint64_t n_elems);

/* IEEE half and bfloat16 bit patterns to float (exact; NaN payloads kept as far as float allows). */
float e8kv_ggml_fp16_to_f32(uint16_t h);
float e8kv_ggml_bf16_to_f32(uint16_t h);

#endif
