#!/usr/bin/env python3
"""Writes tiny saved caches byte by byte from doc/format.md sections 3.1 and 4 alone (no e8kv code; the
hashes come from the system's libxxhash), for tests/test_persist.c to load and compare with caches built
by appending the same K/V. Values: K[l][t][h][i] = l + t/8 + h/64 + i/1024, V = -K (exact in f32).

  f32_window.e8kc   2 layers, 1 KV head, head_dim 8, n_ctx 16, spec f32 with window=2,sink=1,page=4;
                    layer 0 holds 7 tokens (page 0 coded, page 1 raw), layer 1 holds 5 (both pages raw).
  f32_freqs.e8kc    the same tokens with rope=pre and RoPE frequencies FREQS (format version 3: flag 2, the
                    frequencies after the meta, section 4.1).
Run from this directory: python3 make_golden.py"""
import ctypes
import ctypes.util
import struct

xx = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
xx.XXH64.restype = ctypes.c_uint64
xx.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
xx.XXH32.restype = ctypes.c_uint32
xx.XXH32.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32]

N_LAYER, N_HEAD, D, N_CTX, P, SINK, WINDOW = 2, 1, 8, 16, 4, 1, 2
TOKENS = [7, 5]
SPEC = b"k=f32,v=f32,window=2,sink=1,page=4,center=1,rope=post"
FREQS = [1.0, 0.25, 0.0625, 0.001953125]  # exact in f32; pair i of a key at position p turns by p * FREQS[i]


def val(l, t, h, i, is_k):
    x = l + t / 8 + h / 64 + i / 1024
    return x if is_k else -x


def vec(l, t, h, is_k):
    return struct.pack("<8f", *[val(l, t, h, i, is_k) for i in range(D)])


def stored_frame(rows, row_bytes):
    """§3.1: content 0 (bytes), coder 0 (stored), one page holding every row."""
    n = len(rows) // row_bytes
    head = b"E8KF" + struct.pack("<HBBIIQIIHHI", 1, 0, 0, 0, row_bytes, n, n, 1, 0, 0, 0)
    head += struct.pack("<II", len(rows) | 0x80000000, xx.XXH32(rows, len(rows), 0))
    head += struct.pack("<Q", xx.XXH64(head, len(head), 0))
    return head + rows


def page_state(l, i):
    t = TOKENS[l]
    last = min(t, (i + 1) * P)  # stored tokens [iP, last)
    if last <= SINK:
        return 0
    # a page is encoded once all its positions are older than the window
    return 2 if (i + 1) * P <= t - WINDOW else 1


def write(name, spec, version, flags, sections):
    """One file: header, spec, meta, the sections after the meta, then the layers and the group."""
    layers, coded = records()
    groups = struct.pack("<I", len(stored_frame(coded, 4 * D))) + stored_frame(coded, 4 * D)
    meta = b"golden"
    body = spec + meta + sections + layers + groups
    total = 64 + len(body) + 8
    head = b"E8KC" + struct.pack("<HHQIIIIQQfIII", version, len(spec), total, N_LAYER, N_HEAD, D, P, N_CTX, 0,
                                 10000.0, 0, len(meta), flags)
    assert len(head) == 64
    data = head + body
    data += struct.pack("<Q", xx.XXH64(data, len(data), 0))
    open(name, "wb").write(data)
    print(name, len(data), "bytes")


def main():
    write("f32_window.e8kc", SPEC, 1, 0, b"")
    write("f32_freqs.e8kc", SPEC.replace(b"rope=post", b"rope=pre"), 3, 2, struct.pack("<4f", *FREQS))


def records():
    layers, coded = b"", b""
    for l in range(N_LAYER):
        t = TOKENS[l]
        u = (t + P - 1) // P
        rec = struct.pack("<I", t)
        for is_k in (1, 0):
            for h in range(N_HEAD):
                rec += bytes(page_state(l, i) for i in range(u))
        ns = min(t, SINK)
        for is_k in (1, 0):
            for h in range(N_HEAD):
                rec += b"".join(vec(l, p, h, is_k) for p in range(ns))
        for want, out in ((1, "raw"), (2, "coded")):
            for is_k in (1, 0):
                for h in range(N_HEAD):
                    for i in range(u):
                        if page_state(l, i) != want:
                            continue
                        for p in range(i * P, min(t, (i + 1) * P)):
                            # sink slots of a page hold zeros (the sink buffer has them)
                            b = bytes(4 * D) if p < SINK else vec(l, p, h, is_k)
                            if out == "raw":
                                rec += b
                            else:
                                coded += b
        layers += rec
    return layers, coded  # one codec (f32): one group of the coded pages


if __name__ == "__main__":
    main()
