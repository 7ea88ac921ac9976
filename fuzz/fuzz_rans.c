/* libFuzzer target for the rANS decoder: input = serialized table, 2-byte symbol count, then a block.
 * Any bytes must give a result or a named error, never a fault; the reference and fast decoders must
 * agree on both. Also replayed over fuzz/corpus/rans by tests/test_rans.c. */
#include "entropy/rans.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static e8kv_rans_table t;
    static e8kv_rans_dtable d;
    static uint8_t a[65536], b[65536];
    const size_t r = e8kv_rans_table_read(&t, data, size);
    if (e8kv_is_error(r) || size - r < 2) return 0;
    data += r, size -= r;
    const size_t n = e8kv_load_le16(data);
    data += 2, size -= 2;
    e8kv_rans_dtable_init(&d, &t);
    const size_t ra = e8kv_rans_decode_ref(a, n, data, size, &d, 1, NULL);
    const size_t rb = e8kv_rans_decode(b, n, data, size, &d, 1, NULL);
    if (ra != rb) abort();
    if (!e8kv_is_error(ra)) {
        if (memcmp(a, b, n) != 0) abort();
        /* a stream that decodes is canonical: re-encoding the symbols gives back the same bytes,
         * unless it used a symbol the table gives no probability (only possible with empty tables) */
        static uint8_t enc[4 * E8KV_RANS_STREAMS + 2 * 65536];
        const size_t re = e8kv_rans_encode(enc, sizeof enc, a, n, &t, 1, NULL);
        if (!e8kv_is_error(re) && (re != size || memcmp(enc, data, size) != 0)) abort();
    }
    return 0;
}
