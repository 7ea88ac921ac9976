/* IEEE 754 binary16 and bfloat16 conversions, round to nearest even, exact for every input
 * (subnormals, infinities and NaN included). Portable C; no F16C dependency so results are bit-exact
 * on every platform. */
#ifndef E8KV_FP16_H
#define E8KV_FP16_H

#include <stdint.h>

#define E8KV_FP16_MAX 65504.0f

uint16_t e8kv_fp32_to_fp16(float f);
float e8kv_fp16_to_fp32(uint16_t h);
uint16_t e8kv_fp32_to_bf16(float f);
float e8kv_bf16_to_fp32(uint16_t h);

#endif
