/* Dequantization of ggml block formats to float.
 *
 * Every block is read byte by byte through little-endian loads (no struct overlay), following ggml's
 * block definitions (ggml-common.h) and reference dequantizers (ggml-quants.c, dequantize_row_*):
 *
 *   Q4_0  (32 values, 18 B): fp16 d | 16 B nibbles        x = (q - 8) * d
 *   Q4_1  (32 values, 20 B): fp16 d, fp16 m | 16 B        x = q * d + m
 *   Q5_0  (32 values, 22 B): fp16 d | u32 qh | 16 B       x = (q | hbit << 4) - 16) * d
 *   Q5_1  (32 values, 24 B): fp16 d, fp16 m | u32 qh | 16 B   x = (q | hbit << 4) * d + m
 *   Q8_0  (32 values, 34 B): fp16 d | 32 x int8           x = q * d
 *   Q4_K (256 values, 144 B): fp16 d, fp16 dmin | 12 B packed 6-bit scales and mins (8 sub-blocks of 32) |
 *                            128 B nibbles                 x = d * sc_j * q - dmin * m_j
 *   Q6_K (256 values, 210 B): 128 B low nibbles | 64 B high 2-bit pairs | 16 x int8 scales | fp16 d
 *                                                         x = d * sc_j * (q - 32), 16 sub-blocks of 16
 *
 * In the 32-value formats byte j holds value j in its low nibble and value j + 16 in its high nibble;
 * bit j of qh is the fifth bit of value j, bit j + 16 that of value j + 16. The float operation order
 * is ggml's, so results agree with ggml bit for bit (no FMA contraction on baseline x86-64). */
#include "dequant.h"

#include <assert.h>
#include <string.h>


#define QK 32   /* values per block of the legacy formats */
#define QK_K 256 /* values per super-block of the K formats */

/* byte offsets inside each block */
enum {
    Q4_0_D = 0, Q4_0_QS = 2, Q4_0_BYTES = Q4_0_QS + QK / 2,
    Q4_1_D = 0, Q4_1_M = 2, Q4_1_QS = 4, Q4_1_BYTES = Q4_1_QS + QK / 2,
    Q5_0_D = 0, Q5_0_QH = 2, Q5_0_QS = 6, Q5_0_BYTES = Q5_0_QS + QK / 2,
    Q5_1_D = 0, Q5_1_M = 2, Q5_1_QH = 4, Q5_1_QS = 8, Q5_1_BYTES = Q5_1_QS + QK / 2,
    Q8_0_D = 0, Q8_0_QS = 2, Q8_0_BYTES = Q8_0_QS + QK,
    Q4_K_D = 0, Q4_K_DMIN = 2, Q4_K_SCALES = 4, Q4_K_QS = 16, Q4_K_BYTES = Q4_K_QS + QK_K / 2,
    Q6_K_QL = 0, Q6_K_QH = QK_K / 2, Q6_K_SC = Q6_K_QH + QK_K / 4, Q6_K_D = Q6_K_SC + QK_K / 16,
    Q6_K_BYTES = Q6_K_D + 2
};
static_assert(Q4_0_BYTES == 18, "block_q4_0 is 18 bytes");
static_assert(Q4_1_BYTES == 20, "block_q4_1 is 20 bytes");
static_assert(Q5_0_BYTES == 22, "block_q5_0 is 22 bytes");
static_assert(Q5_1_BYTES == 24, "block_q5_1 is 24 bytes");
static_assert(Q8_0_BYTES == 34, "block_q8_0 is 34 bytes");
static_assert(Q4_K_BYTES == 144, "block_q4_K is 144 bytes");
static_assert(Q6_K_BYTES == 210, "block_q6_K is 210 bytes");

typedef struct {
    const char *name;
    uint16_t block_elems;
    uint16_t block_bytes;
} ggml_type_info;

/* Geometry of every type id pinned by the GGUF spec (ids 4, 5, 31-33, 36-38 are retired). */
static const ggml_type_info type_table[] = {
    [0] = {"F32", 1, 4},          [1] = {"F16", 1, 2},           [2] = {"Q4_0", QK, Q4_0_BYTES},
    [3] = {"Q4_1", QK, Q4_1_BYTES}, [6] = {"Q5_0", QK, Q5_0_BYTES}, [7] = {"Q5_1", QK, Q5_1_BYTES},
    [8] = {"Q8_0", QK, Q8_0_BYTES}, [9] = {"Q8_1", 32, 40},       [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},    [12] = {"Q4_K", QK_K, Q4_K_BYTES}, [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", QK_K, Q6_K_BYTES}, [15] = {"Q8_K", 256, 292}, [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},   [18] = {"IQ3_XXS", 256, 98},   [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},    [21] = {"IQ3_S", 256, 110},    [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136},  [24] = {"I8", 1, 1},           [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},         [27] = {"I64", 1, 8},          [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},    [30] = {"BF16", 1, 2},         [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},    [39] = {"MXFP4", 32, 17},
};
#define N_TYPES (sizeof type_table / sizeof type_table[0])

size_t e8kv_ggml_block_elems(uint32_t type) { return type < N_TYPES ? type_table[type].block_elems : 0; }
size_t e8kv_ggml_block_bytes(uint32_t type) { return type < N_TYPES ? type_table[type].block_bytes : 0; }
const char *e8kv_ggml_type_name(uint32_t type) {
    return type < N_TYPES && type_table[type].name ? type_table[type].name : "unknown";
}

int e8kv_ggml_can_dequant(uint32_t type) {
    switch (type) {
    case 0: case 1: case 2: case 3: case 6: case 7: case 8: case 12: case 14: case 30: return 1;
    default: return 0;
    }
}

size_t e8kv_ggml_row_bytes(uint32_t type, uint64_t n_elems) {
    const size_t be = e8kv_ggml_block_elems(type), bb = e8kv_ggml_block_bytes(type);
    if (be == 0 || n_elems % be != 0) return 0;
    const uint64_t n_blocks = n_elems / be;
    if (n_blocks > SIZE_MAX / bb) return 0;
    return (size_t)n_blocks * bb;
}

static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float e8kv_ggml_fp16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* Inf, NaN */
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        const float f = (float)mant * 0x1p-24f;
        return sign ? -f : f;
    }
    return bits_f32(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

float e8kv_ggml_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline float ldh(const uint8_t *p) { return e8kv_ggml_fp16_to_f32(ld16(p)); }

/* ---------------------------------------------------------------- kernels: nb blocks each */

static void deq_f32(float *restrict y, const uint8_t *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = bits_f32(ld32(x + 4 * i));
}
static void deq_f16(float *restrict y, const uint8_t *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = ldh(x + 2 * i);
}
static void deq_bf16(float *restrict y, const uint8_t *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = e8kv_ggml_bf16_to_f32(ld16(x + 2 * i));
}

static void deq_q4_0(float *restrict y, const uint8_t *restrict x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += Q4_0_BYTES, y += QK) {
        const float d = ldh(x + Q4_0_D);
        const uint8_t *qs = x + Q4_0_QS;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)((int)(qs[j] & 0x0f) - 8) * d;
            y[j + QK / 2] = (float)((int)(qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(float *restrict y, const uint8_t *restrict x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += Q4_1_BYTES, y += QK) {
        const float d = ldh(x + Q4_1_D), m = ldh(x + Q4_1_M);
        const uint8_t *qs = x + Q4_1_QS;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)(qs[j] & 0x0f) * d + m;
            y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

static void deq_q5_0(float *restrict y, const uint8_t *restrict x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += Q5_0_BYTES, y += QK) {
        const float d = ldh(x + Q5_0_D);
        const uint32_t qh = ld32(x + Q5_0_QH);
        const uint8_t *qs = x + Q5_0_QS;
        for (int j = 0; j < QK / 2; j++) {
            const int h0 = (int)((qh >> j) & 1u) << 4, h1 = (int)((qh >> (j + 16)) & 1u) << 4;
            y[j] = (float)(((qs[j] & 0x0f) | h0) - 16) * d;
            y[j + QK / 2] = (float)(((qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

static void deq_q5_1(float *restrict y, const uint8_t *restrict x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += Q5_1_BYTES, y += QK) {
        const float d = ldh(x + Q5_1_D), m = ldh(x + Q5_1_M);
        const uint32_t qh = ld32(x + Q5_1_QH);
        const uint8_t *qs = x + Q5_1_QS;
        for (int j = 0; j < QK / 2; j++) {
            const int h0 = (int)((qh >> j) & 1u) << 4, h1 = (int)((qh >> (j + 16)) & 1u) << 4;
            y[j] = (float)((qs[j] & 0x0f) | h0) * d + m;
            y[j + QK / 2] = (float)((qs[j] >> 4) | h1) * d + m;
        }
    }
}

static void deq_q8_0(float *restrict y, const uint8_t *restrict x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += Q8_0_BYTES, y += QK) {
        const float d = ldh(x + Q8_0_D);
        const int8_t *qs = (const int8_t *)(x + Q8_0_QS);
        for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
    }
}

/* The 12 scale bytes of Q4_K pack 8 six-bit scales and 8 six-bit mins: sub-blocks 0-3 keep theirs in
 * the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take their low 4 bits from a
 * nibble of bytes 8-11 and their high 2 bits from the top of bytes 0-3 (scales) or 4-7 (mins). */
static inline void q4k_scale_min(int j, const uint8_t *restrict s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void deq_q4_k(float *restrict y, const uint8_t *restrict x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += Q4_K_BYTES) {
        const float d = ldh(x + Q4_K_D), dmin = ldh(x + Q4_K_DMIN);
        const uint8_t *scales = x + Q4_K_SCALES, *q = x + Q4_K_QS;
        /* 64 values per 32 bytes of q: low nibbles are sub-block 2i, high nibbles sub-block 2i + 1 */
        for (int i = 0; i < 4; i++, q += 32, y += 64) {
            uint8_t sc, m;
            q4k_scale_min(2 * i, scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            q4k_scale_min(2 * i + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) y[32 + l] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void deq_q6_k(float *restrict y, const uint8_t *restrict x, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += Q6_K_BYTES) {
        const float d = ldh(x + Q6_K_D);
        const uint8_t *ql = x + Q6_K_QL, *qh = x + Q6_K_QH;
        const int8_t *sc = (const int8_t *)(x + Q6_K_SC);
        /* two halves of 128 values; in each, 64 ql bytes give low nibbles for 4 groups of 32 and 32 qh
         * bytes give their high 2 bits (bits 0-1, 2-3, 4-5, 6-7 for groups 0..3) */
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * (float)q1;
                y[l + 32] = d * sc[is + 2] * (float)q2;
                y[l + 64] = d * sc[is + 4] * (float)q3;
                y[l + 96] = d * sc[is + 6] * (float)q4;
            }
        }
    }
}

size_t e8kv_ggml_dequant(float *dst, size_t dst_capacity, const void *src, size_t src_size, uint32_t type,
                         uint64_t n_elems) {
    if (!e8kv_ggml_can_dequant(type)) return E8KV_ERR(UNSUPPORTED);
    if ((!dst && n_elems) || (!src && src_size)) return E8KV_ERR(BAD_ARGUMENT);
    const size_t be = e8kv_ggml_block_elems(type);
    if (n_elems % be != 0) return E8KV_ERR(BAD_ARGUMENT);
    const size_t need = e8kv_ggml_row_bytes(type, n_elems);
    if (n_elems && need == 0) return E8KV_ERR(SRC_SIZE); /* overflow */
    if (src_size != need) return E8KV_ERR(SRC_SIZE);
    if (n_elems > dst_capacity) return E8KV_ERR(DST_TOO_SMALL);
    const uint8_t *x = src;
    const size_t n = (size_t)n_elems, nb = n / be;
    switch (type) {
    case 0: deq_f32(dst, x, n); break;
    case 1: deq_f16(dst, x, n); break;
    case 30: deq_bf16(dst, x, n); break;
    case 2: deq_q4_0(dst, x, nb); break;
    case 3: deq_q4_1(dst, x, nb); break;
    case 6: deq_q5_0(dst, x, nb); break;
    case 7: deq_q5_1(dst, x, nb); break;
    case 8: deq_q8_0(dst, x, nb); break;
    case 12: deq_q4_k(dst, x, nb); break;
    case 14: deq_q6_k(dst, x, nb); break;
    default: assert(0); return E8KV_ERR(UNSUPPORTED);
    }
    return n;
}
