#!/usr/bin/env python3
"""Independent numpy implementation of the e8ball / e8nest / e8box DECODERS (doc/format.md section 2),
checked bit for bit against the library's decoder through ctypes on random code bytes.

It rebuilds, from the written specification only: the 65536-point E8 ball codebook (enumeration of E8
points of norm <= 12, order (norm, h(key), key)), the E8 generator matrix, the Voronoi coset
representatives r - m*Q_E8(r/m) with the documented closest-point tie rules (exact rational arithmetic),
and the reconstruction s/(2m) * (m*c + r) in float32; for e8box (section 2.4) the step byte, the coset
bits and the nibble groups, at head_dim 64, 128 and 40 (a last group of fewer than 32 values), and the
2-bit and 1-bit planes of e8box:3 and e8box:2 at head_dim 64, 128, 96 and 40; for e8p:2 (section 2.5) the
256-pattern table rebuilt from its definition, the sign parity and the quarter shift.

Environment: E8KV_LIB = path of the shared library. Exit 77 (skip) when numpy or the library is missing.
"""
import ctypes
import itertools
import os
import sys

try:
    import numpy as np
except ImportError:
    print("numpy missing: skip")
    sys.exit(77)

LIB = os.environ.get("E8KV_LIB", "")
if not LIB or not os.path.exists(LIB):
    print("E8KV_LIB not set or missing: skip")
    sys.exit(77)


# ---------------------------------------------------------------- E8 closest point (exact, integers)
def dn_nearest(X, unit):
    """D_n closest point of X/unit (X integer array (N, n)); ties of rounding toward +inf; parity fix on
    the first coordinate of largest |error|, toward the other side of x (up when x is on the integer)."""
    r = np.floor_divide(2 * X + unit, 2 * unit)  # floor(x + 1/2)
    e = X - r * unit
    odd = (r.sum(axis=1) & 1) == 1
    w = np.argmax(np.abs(e), axis=1)  # first maximum
    rows = np.nonzero(odd)[0]
    ew = e[rows, w[rows]]
    r[rows, w[rows]] += np.where(ew >= 0, 1, -1)
    return r


def e8_nearest2(X, unit):
    """E8 closest point of X/unit in doubled coordinates; D8 wins equal distances. unit must be even."""
    a = dn_nearest(X, unit)
    half = unit // 2
    b = dn_nearest(X - half, unit)
    da = ((X - a * unit) ** 2).sum(axis=1)
    db = ((X - half - b * unit) ** 2).sum(axis=1)
    return np.where((da <= db)[:, None], 2 * a, 2 * b + 1)


# generator rows in doubled coordinates: g0 = 2e0, g_i = e_i - e_{i-1} (i=1..6), g7 = (1/2,...,1/2)
G2 = np.zeros((8, 8), dtype=np.int64)
G2[0, 0] = 4
for i in range(1, 7):
    G2[i, i] = 2
    G2[i, i - 1] = -2
G2[7, :] = 1


def coset_reps(log2_m, digits):
    m = 1 << log2_m
    u = (digits[:, None] >> (np.arange(8) * log2_m)) & (m - 1)
    r2 = u.astype(np.int64) @ G2  # doubled coordinates of G u
    # r/m = r2 / (2m): quantize with unit 2m
    q2 = e8_nearest2(r2, 2 * m)
    return r2 - m * q2


# ---------------------------------------------------------------- the ball codebook
def ball_table():
    pts = []
    for vals in ([-6, -4, -2, 0, 2, 4, 6], [-5, -3, -1, 1, 3, 5]):
        g = np.array(list(itertools.product(vals, repeat=4)), dtype=np.int64)
        g = g[(g**2).sum(axis=1) <= 48]
        n4 = (g**2).sum(axis=1)
        # all pairs of half-vectors with total norm <= 48
        i, j = np.nonzero(n4[:, None] + n4[None, :] <= 48)
        p = np.concatenate([g[i], g[j]], axis=1)
        p = p[(p.sum(axis=1) % 4) == 0]
        pts.append(p)
    p = np.concatenate(pts)
    assert len(p) == 117361, len(p)
    norm2 = (p**2).sum(axis=1)
    key = ((p + 8) << (4 * np.arange(8))).sum(axis=1).astype(np.uint64)
    h = (key * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF)
    order = np.lexsort((key, h, norm2))  # last key is primary
    table = p[order[:65536]]
    n2 = (table**2).sum(axis=1)
    assert (n2 <= 40).sum() == 56881 and (n2 == 48).sum() == 8655
    return table


# ---------------------------------------------------------------- fp16
def fp16_to_f32(h):
    return np.array(h, dtype=np.uint16).view(np.float16).astype(np.float32)


from e8kv_testlib import load_library  # noqa: E402  (tests/ is on sys.path: the script's folder)


def main():
    lib = load_library(LIB)
    lib.e8kv_codec_create.restype = ctypes.c_void_p
    lib.e8kv_codec_create.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64,
                                      ctypes.POINTER(ctypes.c_size_t)]
    lib.e8kv_codec_free.argtypes = [ctypes.c_void_p]
    lib.e8kv_codec_vector_bytes.restype = ctypes.c_size_t
    lib.e8kv_codec_vector_bytes.argtypes = [ctypes.c_void_p]
    lib.e8kv_codec_decode_rotated.restype = ctypes.c_size_t
    lib.e8kv_codec_decode_rotated.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]

    ball = ball_table()
    res = {1: coset_reps(1, np.arange(256)), 2: coset_reps(2, np.arange(65536))}
    rng = np.random.default_rng(12345)
    d, n = 64, 2000
    failures = 0

    def lib_decode(spec, raw, dim=d):
        err = ctypes.c_size_t(0)
        c = lib.e8kv_codec_create(spec.encode(), dim, 1, ctypes.byref(err))
        assert c, spec
        vb = lib.e8kv_codec_vector_bytes(c)
        assert raw.shape[1] == vb, (spec, vb)
        out = np.zeros((n, dim), dtype=np.float32)
        src = np.ascontiguousarray(raw)
        r = lib.e8kv_codec_decode_rotated(c, out.ctypes.data, out.size, src.ctypes.data, src.size, n)
        lib.e8kv_codec_free(c)
        assert r == n * dim, r
        return out

    def random_bytes(vb):
        raw = rng.integers(0, 256, size=(n, vb), dtype=np.uint8)
        raw[:, 1] &= 0x7B  # finite, positive fp16 scale
        return raw

    for bits in (2, 3, 4):
        L = bits - 2
        m = 1 << L
        vb = 2 + d // 8 * bits
        raw = random_bytes(vb)
        s = fp16_to_f32(raw[:, 0].astype(np.uint16) | (raw[:, 1].astype(np.uint16) << 8))
        blocks = raw[:, 2:].reshape(n, d // 8, bits).astype(np.int64)
        idx = blocks[:, :, 0] | (blocks[:, :, 1] << 8)
        v = m * ball[idx]  # (n, d/8, 8)
        if L == 1:
            v = v + res[1][blocks[:, :, 2]]
        elif L == 2:
            v = v + res[2][blocks[:, :, 2] | (blocks[:, :, 3] << 8)]
        k = (s / np.float32(2 * m)).astype(np.float32)
        ref = (v.reshape(n, d).astype(np.float32) * k[:, None]).astype(np.float32)
        got = lib_decode("e8ball:%d" % bits, raw)
        bad = np.count_nonzero(ref.view(np.uint32) != got.view(np.uint32))
        print("e8ball:%d  %d vectors, %d values differ" % (bits, n, bad))
        failures += bad != 0

    # e8nest:B: B bits per value, 8·B bits per block little-endian, canonical reps of m = 2^B
    for bits in (2, 3):
        vb = 2 + d * bits // 8
        raw = random_bytes(vb)
        s = fp16_to_f32(raw[:, 0].astype(np.uint16) | (raw[:, 1].astype(np.uint16) << 8))
        blocks = raw[:, 2:].reshape(n, d // 8, bits).astype(np.int64)
        dig = np.zeros((n, d // 8), dtype=np.int64)
        for j in range(bits):
            dig |= blocks[:, :, j] << (8 * j)
        reps = coset_reps(bits, dig.reshape(-1)).reshape(n, d)
        ref = (reps.astype(np.float32) * (s * np.float32(0.5))[:, None]).astype(np.float32)
        got = lib_decode("e8nest:%d" % bits, raw)
        bad = np.count_nonzero(ref.view(np.uint32) != got.view(np.uint32))
        print("e8nest:%d  %d vectors, %d values differ" % (bits, n, bad))
        failures += bad != 0

    # e8box:4: u8 e, ceil(d/64) coset bytes, nibble groups of m = min(32, d - 32g) values in m/2 bytes
    for dd in (64, 128, 40):
        n_cos = (dd + 63) // 64
        vb = 1 + n_cos + dd // 2
        raw = rng.integers(0, 256, size=(n, vb), dtype=np.uint8)
        raw[::7, 0] = 0  # the zero vector
        e = raw[:, 0].astype(np.int64)
        frac = np.array([2.0 ** (j / 8) for j in range(8)]).astype(np.float32)
        half = (np.ldexp(frac[e % 8].astype(np.float64), e // 8 - 20) / 2).astype(np.float32)
        half[e == 0] = 0
        nib = np.zeros((n, dd), dtype=np.int64)
        area = raw[:, 1 + n_cos:].astype(np.int64)
        for g in range((dd + 31) // 32):
            m = min(32, dd - 32 * g)
            b = area[:, 16 * g:16 * g + m // 2]
            nib[:, 32 * g:32 * g + m // 2] = b & 15
            nib[:, 32 * g + m // 2:32 * g + m] = b >> 4
        blk = np.arange(dd) // 8
        k = (raw[:, 1 + blk // 8].astype(np.int64) >> (blk % 8)) & 1
        ref = ((2 * nib - 16 + k).astype(np.float32) * half[:, None]).astype(np.float32)
        got = lib_decode("e8box:4", raw, dd)
        bad = np.count_nonzero(ref.view(np.uint32) != got.view(np.uint32))
        print("e8box:4 d=%d  %d vectors, %d values differ" % (dd, n, bad))
        failures += bad != 0

    def box_half(e):
        frac = np.array([2.0 ** (j / 8) for j in range(8)]).astype(np.float32)
        half = (np.ldexp(frac[e % 8].astype(np.float64), e // 8 - 20) / 2).astype(np.float32)
        half[e == 0] = 0
        return half

    def plane(area, dd, w):
        """the w-bit fields of a plane, value order: 16-byte groups of G = 128/w values, group g holds
        m = min(G, dd - G*g) values in m*w/8 bytes; value G*g + r + j*(m*w/8) in byte r, bits [w*j, w*j+w)"""
        G = 128 // w
        out = np.zeros((area.shape[0], dd), dtype=np.int64)
        for g in range((dd + G - 1) // G):
            m = min(G, dd - G * g)
            nb = m * w // 8
            for j in range(8 // w):
                for r in range(nb):
                    v = G * g + r + j * nb
                    if v < G * g + m:
                        out[:, v] = (area[:, 16 * g + r] >> (w * j)) & ((1 << w) - 1)
        return out

    # e8box:3, e8box:2: u8 e, ceil(d/64) coset bytes, a 2-bit plane (d/4 bytes), for B = 3 a 1-bit plane
    for bits in (3, 2):
        for dd in (64, 128, 96, 40):
            n_cos = (dd + 63) // 64
            vb = 1 + n_cos + dd * bits // 8
            raw = rng.integers(0, 256, size=(n, vb), dtype=np.uint8)
            raw[::7, 0] = 0
            half = box_half(raw[:, 0].astype(np.int64))
            area = raw[:, 1 + n_cos:].astype(np.int64)
            nv = plane(area[:, :dd // 4], dd, 2)
            if bits == 3:
                nv = nv | (plane(area[:, dd // 4:], dd, 1) << 2)
            blk = np.arange(dd) // 8
            k = (raw[:, 1 + blk // 8].astype(np.int64) >> (blk % 8)) & 1
            ref = ((2 * nv - (1 << bits) + k).astype(np.float32) * half[:, None]).astype(np.float32)
            got = lib_decode("e8box:%d" % bits, raw, dd)
            bad = np.count_nonzero(ref.view(np.uint32) != got.view(np.uint32))
            print("e8box:%d d=%d  %d vectors, %d values differ" % (bits, dd, n, bad))
            failures += bad != 0

    # e8p:2: u8 e, d/8 u16 codes; patterns: words W = sum c_i 4^i, c_i in {0,1,2}, with
    # sum (2c+1)^2 <= 40, or six c = 0 and two c = 2, or all c = 1; increasing W
    pats = []
    for cs in itertools.product(range(3), repeat=8):
        q = sum((2 * c + 1) ** 2 for c in cs)
        if q <= 40 or (cs.count(0) == 6 and cs.count(2) == 2) or cs.count(1) == 8:
            pats.append(sum(c << (2 * i) for i, c in enumerate(cs)))
    pats = np.array(sorted(pats), dtype=np.int64)
    assert len(pats) == 256, len(pats)
    for dd in (64, 128, 40):
        vb = 1 + dd // 4
        raw = rng.integers(0, 256, size=(n, vb), dtype=np.uint8)
        raw[::7, 0] = 0
        quarter = box_half(raw[:, 0].astype(np.int64)) / np.float32(2)
        code = raw[:, 1::2].astype(np.int64) | (raw[:, 2::2].astype(np.int64) << 8)  # (n, dd/8)
        w = pats[code & 255]
        c = np.stack([(w >> (2 * i)) & 3 for i in range(8)], axis=-1)  # (n, dd/8, 8)
        sg = np.stack([(code >> (8 + i)) & 1 for i in range(7)], axis=-1)
        s7 = (sg.sum(-1) + c.sum(-1)) & 1
        sg = np.concatenate([sg, s7[..., None]], axis=-1)
        sh = np.where((code >> 15) & 1, 1, -1)[..., None]
        qv = np.where(sg == 1, -(4 * c + 2), 4 * c + 2) + sh
        ref = (qv.reshape(n, dd).astype(np.float32) * quarter[:, None]).astype(np.float32)
        got = lib_decode("e8p:2", raw, dd)
        bad = np.count_nonzero(ref.view(np.uint32) != got.view(np.uint32))
        print("e8p:2 d=%d  %d vectors, %d values differ" % (dd, n, bad))
        failures += bad != 0

    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
