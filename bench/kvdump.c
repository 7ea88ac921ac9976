/* K/V dump reader (doc/format.md section 1). Fields are read one by one through the little-endian
 * helpers (never a struct read), and the announced size is checked against the real file size before any
 * allocation, so a lying header cannot make us allocate or read past the end. */
#include "kvdump.h"

#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>

size_t e8kv_kvdump_parse_header(e8kv_kvdump *out, const uint8_t *header, size_t header_size,
                                uint64_t file_size) {
    if (!out || (!header && header_size)) return E8KV_ERR(BAD_ARGUMENT);
    memset(out, 0, sizeof *out);
    if (header_size < E8KV_KVDUMP_HEADER_BYTES || file_size < E8KV_KVDUMP_HEADER_BYTES)
        return E8KV_ERR(TRUNCATED);
    if (memcmp(header, E8KV_KVDUMP_MAGIC, 8) != 0) return E8KV_ERR(CORRUPTED);
    if (e8kv_load_le32(header + 8) != E8KV_KVDUMP_VERSION) return E8KV_ERR(VERSION);
    const uint32_t head_dim = e8kv_load_le32(header + 12);
    const uint64_t n_vec = e8kv_load_le64(header + 16);
    const uint32_t flags = e8kv_load_le32(header + 24);
    const uint32_t n_layer = e8kv_load_le32(header + 28);
    const uint32_t n_head_kv = e8kv_load_le32(header + 32);
    if (e8kv_load_le32(header + 36) != 0) return E8KV_ERR(CORRUPTED);
    if (head_dim == 0 || head_dim > E8KV_MAX_HEAD_DIM) return E8KV_ERR(HEAD_DIM);
    /* payload = n_vec·head_dim·4 bytes, with overflow checked in 64 bits and in size_t */
    const uint64_t max_payload = UINT64_MAX - E8KV_KVDUMP_HEADER_BYTES;
    if (n_vec > max_payload / ((uint64_t)head_dim * 4u)) return E8KV_ERR(CORRUPTED);
    const uint64_t expected = E8KV_KVDUMP_HEADER_BYTES + n_vec * head_dim * 4u;
    if (file_size < expected) return E8KV_ERR(TRUNCATED);
    if (file_size > expected) return E8KV_ERR(CORRUPTED);
    if (n_vec > SIZE_MAX / 4 / head_dim) return E8KV_ERR(OUT_OF_MEMORY);
    out->n_vec = (size_t)n_vec;
    out->head_dim = head_dim;
    out->flags = flags;
    out->n_layer = n_layer;
    out->n_head_kv = n_head_kv;
    return 0;
}

static size_t read_fail(e8kv_kvdump *out, FILE *f, size_t err) {
    if (f) fclose(f);
    e8kv_kvdump_free(out);
    return err;
}

size_t e8kv_kvdump_read(e8kv_kvdump *out, const char *path) {
    if (!out) return E8KV_ERR(BAD_ARGUMENT);
    memset(out, 0, sizeof *out);
    if (!path) return E8KV_ERR(BAD_ARGUMENT);
    FILE *f = fopen(path, "rb");
    if (!f) return E8KV_ERR(IO);
    if (fseeko(f, 0, SEEK_END) != 0) return read_fail(out, f, E8KV_ERR(IO));
    const off_t end = ftello(f);
    if (end < 0 || fseeko(f, 0, SEEK_SET) != 0) return read_fail(out, f, E8KV_ERR(IO));
    uint8_t header[E8KV_KVDUMP_HEADER_BYTES];
    const size_t got = fread(header, 1, sizeof header, f);
    if (got < sizeof header && ferror(f)) return read_fail(out, f, E8KV_ERR(IO));
    const size_t r = e8kv_kvdump_parse_header(out, header, got, (uint64_t)end);
    if (e8kv_is_error(r)) return read_fail(out, f, r);
    const size_t n = out->n_vec * out->head_dim;
    if (n) {
        out->data = malloc(n * sizeof(float));
        if (!out->data) return read_fail(out, f, E8KV_ERR(OUT_OF_MEMORY));
        /* the file may shrink between the size check and the read: a short read is TRUNCATED */
        if (fread(out->data, sizeof(float), n, f) != n)
            return read_fail(out, f, ferror(f) ? E8KV_ERR(IO) : E8KV_ERR(TRUNCATED));
        uint8_t *const bytes = (uint8_t *)out->data;
        for (size_t i = 0; i < n; i++)
            out->data[i] = e8kv_load_lef32(bytes + 4 * i); /* in place: LE -> host */
        if (!e8kv_all_finite(out->data, n)) return read_fail(out, f, E8KV_ERR(NONFINITE));
    }
    fclose(f);
    return 0;
}

void e8kv_kvdump_free(e8kv_kvdump *dump) {
    if (!dump) return;
    free(dump->data);
    memset(dump, 0, sizeof *dump);
}
