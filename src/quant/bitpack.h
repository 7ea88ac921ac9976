/* Little-endian bit fields of up to 57 bits: field k of width w occupies bits [w·k, w·k + w) of a byte
 * stream, bit j being bit j % 8 of byte j / 8, least significant bit first (the layout of lloyd:B's
 * indices, doc/format.md §2.1). Used by the peers' formats (kivi.c, kvquant.c, e8_relaxed_box.c,
 * kakeya.c). Writers OR into zeroed bytes; readers touch only the bytes the field spans. */
#ifndef E8KV_BITPACK_H
#define E8KV_BITPACK_H

#include <stddef.h>
#include <stdint.h>

static inline void e8kv_bits_put(uint8_t *buf, size_t bit, unsigned width, uint64_t v) {
    for (unsigned done = 0; done < width;) {
        const size_t b = (bit + done) >> 3;
        const unsigned off = (unsigned)((bit + done) & 7u),
                       take = 8 - off < width - done ? 8 - off : width - done;
        buf[b] |= (uint8_t)(((v >> done) & ((1u << take) - 1u)) << off);
        done += take;
    }
}

static inline uint64_t e8kv_bits_get(const uint8_t *buf, size_t bit, unsigned width) {
    uint64_t v = 0;
    for (unsigned done = 0; done < width;) {
        const size_t b = (bit + done) >> 3;
        const unsigned off = (unsigned)((bit + done) & 7u),
                       take = 8 - off < width - done ? 8 - off : width - done;
        v |= (uint64_t)((buf[b] >> off) & ((1u << take) - 1u)) << done;
        done += take;
    }
    return v;
}

#endif
