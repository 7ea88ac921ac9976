/* Contents of the golden frames in tests/data/golden_frames/, defined by formulas that do not use the
 * library, so the pinned frames check the decoder against an independent definition of their bytes. */
#ifndef E8KV_GOLDEN_FRAMES_H
#define E8KV_GOLDEN_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#define GOLDEN_BYTES_ROWS 300
#define GOLDEN_BYTES_ROW 34
#define GOLDEN_E8_ROWS 200
#define GOLDEN_E8_ROW 32 /* two E8 points of int16 doubled coordinates */

static inline void golden_bytes(uint8_t *out) {
    for (size_t r = 0; r < GOLDEN_BYTES_ROWS; r++)
        for (size_t b = 0; b < GOLDEN_BYTES_ROW; b++)
            out[r * GOLDEN_BYTES_ROW + b] = (uint8_t)((r * 31 + b * 7 + (r * b) % 13) % 23 + (b == 0 ? 200 : 0));
}

/* point k: coset c = k mod 2, v_j = (5k + 3j) mod 7 - 3 for j < 7, v_7 fixes the sum of v to be even,
 * y2 = 2v + c (then sum y2 = 2·sum v + 8c ≡ 0 mod 4: a point of E8) */
static inline void golden_e8(uint8_t *out) {
    for (size_t k = 0; k < GOLDEN_E8_ROWS * GOLDEN_E8_ROW / 16; k++) {
        int v[8], s = 0;
        for (int j = 0; j < 7; j++) v[j] = (int)((5 * k + 3 * (size_t)j) % 7) - 3, s += v[j];
        v[7] = (s & 1) ? 1 : 0;
        for (int j = 0; j < 8; j++) {
            const uint16_t y = (uint16_t)(int16_t)(2 * v[j] + (int)(k & 1));
            out[16 * k + 2 * j] = (uint8_t)y;
            out[16 * k + 2 * j + 1] = (uint8_t)(y >> 8);
        }
    }
}

#endif
