#!/usr/bin/env python3
"""Independent numpy references for the scalar codecs and the rotation, checked through ctypes.

- rotation: the library's e8kv_codec_rotate equals H·D/sqrt(n) built explicitly (Sylvester H, D = ±1
  diagonal; block diagonal for non-powers of two, e.g. 96 = 64 + 32), forward and inverse;
- q8_0 / q4_0 (plain, and h after the library's own rotation): bit-exact bytes from a numpy port of
  ggml's reference rule (f32 arithmetic, f16 scale RNE), and decode values;
- lloyd:B: levels re-derived by Lloyd iteration with numerical integration (trapezoid rule on a fine
  grid, no scipy), encoder indices and norm from an explicit-rotation numpy encoder, decode values.
Exits 77 (skip) when numpy or the library (env E8KV_LIB) is missing.
"""
import ctypes
import os
import sys

try:
    import numpy as np
except ImportError:
    print("numpy missing: skipped")
    sys.exit(77)

LIB = os.environ.get("E8KV_LIB")
if not LIB or not os.path.exists(LIB):
    print("E8KV_LIB not set or missing: skipped")
    sys.exit(77)



from e8kv_testlib import load_library  # noqa: E402  (tests/ is on sys.path: the script's folder)


lib = load_library(LIB)
c_size = ctypes.c_size_t
fptr = ctypes.POINTER(ctypes.c_float)
lib.e8kv_codec_create.restype = ctypes.c_void_p
lib.e8kv_codec_create.argtypes = [ctypes.c_char_p, c_size, ctypes.c_uint64, ctypes.POINTER(c_size)]
lib.e8kv_codec_free.argtypes = [ctypes.c_void_p]
lib.e8kv_codec_vector_bytes.restype = c_size
lib.e8kv_codec_vector_bytes.argtypes = [ctypes.c_void_p]
lib.e8kv_codec_encode.restype = c_size
lib.e8kv_codec_encode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, c_size, fptr, c_size]
lib.e8kv_codec_decode.restype = c_size
lib.e8kv_codec_decode.argtypes = [ctypes.c_void_p, fptr, c_size, ctypes.c_void_p, c_size, c_size]
lib.e8kv_codec_decode_rotated.restype = c_size
lib.e8kv_codec_decode_rotated.argtypes = lib.e8kv_codec_decode.argtypes
lib.e8kv_codec_rotate.restype = c_size
lib.e8kv_codec_rotate.argtypes = [ctypes.c_void_p, fptr, c_size, ctypes.c_int]
lib.e8kv_is_error.restype = ctypes.c_uint
lib.e8kv_is_error.argtypes = [c_size]

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


class Codec:
    def __init__(self, spec, d, seed=7):
        err = c_size(0)
        self.p = lib.e8kv_codec_create(spec.encode(), d, seed, ctypes.byref(err))
        if not self.p:
            raise RuntimeError(f"create {spec}/{d} failed ({err.value})")
        self.d = d
        self.vb = lib.e8kv_codec_vector_bytes(self.p)

    def __del__(self):
        lib.e8kv_codec_free(self.p)

    def encode(self, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        n = x.size // self.d
        out = np.zeros(n * self.vb, dtype=np.uint8)
        r = lib.e8kv_codec_encode(self.p, out.ctypes.data, out.size, x.ctypes.data_as(fptr), n)
        assert not lib.e8kv_is_error(r), "encode failed"
        return out

    def decode(self, b, rotated=False):
        n = b.size // self.vb
        y = np.zeros(n * self.d, dtype=np.float32)
        f = lib.e8kv_codec_decode_rotated if rotated else lib.e8kv_codec_decode
        r = f(self.p, y.ctypes.data_as(fptr), y.size, np.ascontiguousarray(b).ctypes.data, b.size, n)
        assert not lib.e8kv_is_error(r), "decode failed"
        return y.reshape(n, self.d)

    def rotate(self, x, inverse=False):
        y = np.ascontiguousarray(x, dtype=np.float32).copy()
        lib.e8kv_codec_rotate(self.p, y.ctypes.data_as(fptr), y.size // self.d, 1 if inverse else 0)
        return y.reshape(-1, self.d)


# ------------------------------------------------------------------ rotation

def sylvester(n):
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def blocks(d):
    out, rest = [], d
    while rest:
        b = 1 << (rest.bit_length() - 1)
        out.append(b)
        rest -= b
    return out


def explicit_rotation(d, signs):
    """H·D/sqrt(n) per power-of-two block, block diagonal."""
    m = np.zeros((d, d))
    off = 0
    for b in blocks(d):
        m[off:off + b, off:off + b] = sylvester(b) / np.sqrt(b)
        off += b
    return m @ np.diag(signs)


def library_signs(codec):
    """D read off the library: column j of the rotation is H·e_j·s_j/sqrt(n), so s_j = sign of its
    first nonzero entry relative to H's column (H's first row is all ones)."""
    d = codec.d
    cols = codec.rotate(np.eye(d, dtype=np.float32)).T  # column j = rotate(e_j)
    signs = np.zeros(d)
    off = 0
    for b in blocks(d):
        for j in range(off, off + b):
            signs[j] = np.sign(cols[off, j])
        off += b
    return signs


def test_rotation():
    rng = np.random.default_rng(1)
    for spec, d in [("lloyd:2", 8), ("lloyd:2", 16), ("q8_0h", 64), ("q8_0h", 96), ("q8_0h", 128),
                    ("q8_0h", 256), ("q8_0h", 512), ("lloyd:3", 72)]:
        c = Codec(spec, d, seed=12345)
        s = library_signs(c)
        check(np.all(np.abs(s) == 1), f"{spec}/{d}: signs not ±1")
        m = explicit_rotation(d, s)
        x = rng.standard_normal((20, d)).astype(np.float32)
        y = c.rotate(x)
        ref = x.astype(np.float64) @ m.T
        rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        check(rel < 1e-6, f"{spec}/{d}: rotation != H·D/sqrt(n) (rel {rel:.3g})")
        xi = c.rotate(y, inverse=True)
        ref_inv = y.astype(np.float64) @ m  # inverse = transpose
        rel = np.linalg.norm(xi - ref_inv) / np.linalg.norm(ref_inv)
        check(rel < 1e-6, f"{spec}/{d}: inverse rotation != (H·D/sqrt(n))^T (rel {rel:.3g})")
        check(np.allclose(m @ m.T, np.eye(d)), f"{d}: explicit matrix not orthonormal")
        s2 = library_signs(Codec(spec, d, seed=12346))
        check(np.sum(s != s2) > d // 8, f"{spec}/{d}: another seed gives nearly the same signs")
        check(np.array_equal(s, library_signs(Codec(spec, d, seed=12345))), f"{spec}/{d}: seed not reproducible")
    print("rotation: ok")


# ------------------------------------------------------------------ q8_0 / q4_0 (numpy port of ggml's rule)

F32 = np.float32


def round_half_away(v):
    v = v.astype(np.float64)  # exact; |v| + 0.5 is exact in double
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def safe_recip(d):
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.where(d != 0, F32(1.0) / np.where(d != 0, d, F32(1.0)), F32(0.0)).astype(F32)
    return np.where(np.isfinite(idv), idv, F32(0.0)).astype(F32)


def ref_q8_0(x):
    xb = x.reshape(-1, 32).astype(F32)
    amax = np.max(np.abs(xb), axis=1).astype(F32)
    d = (amax / F32(127.0)).astype(F32)
    idv = safe_recip(d)
    q = round_half_away((xb * idv[:, None]).astype(F32)).astype(np.int8)
    d16 = d.astype(np.float16)
    out = np.zeros((xb.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    dec = (q.astype(F32) * d16.astype(F32)[:, None]).astype(F32)
    return out.reshape(-1), dec.reshape(x.shape)


def ref_q4_0(x):
    xb = x.reshape(-1, 32).astype(F32)
    idx = np.argmax(np.abs(xb), axis=1)  # first index of the largest magnitude
    mx = xb[np.arange(xb.shape[0]), idx]
    d = (mx / F32(-8.0)).astype(F32)
    idv = safe_recip(d)
    t = ((xb * idv[:, None]).astype(F32) + F32(8.5)).astype(F32)
    q = np.minimum(15, np.trunc(t).astype(np.int64)).astype(np.uint8)
    d16 = d.astype(np.float16)
    out = np.zeros((xb.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    dec = ((q.astype(np.int64) - 8).astype(F32) * d16.astype(F32)[:, None]).astype(F32)
    return out.reshape(-1), dec.reshape(x.shape)


def scalar_test_data(rng, n, d):
    x = rng.standard_normal((n, d)).astype(F32)
    x *= (10.0 ** rng.uniform(-4, 3, size=(n, 1))).astype(F32)
    x[0] = 0.0                                   # zero vector
    x[1, :32] = 0.0                              # zero block
    x[2] = rng.integers(-127, 128, size=d)       # integer grid: exact ties at x*id = k + 0.5
    x[2, 0] = 127.0
    x[2, 5] = 2.5
    x[3] = rng.integers(-16, 17, size=d) * F32(0.5)  # q4_0 ties (id = ±1, ±0.5 ...)
    x[4] = 1.0                                   # constant
    x[5, :32] = -1e-3                            # negative max
    x[6] = 1e-41                                 # subnormal: scale underflows f16 (and 1/d overflows)
    x[7, 0], x[7, 1] = -3.0, 3.0                 # equal magnitudes: first wins in q4_0
    return x


def test_q_formats():
    rng = np.random.default_rng(2)
    for d in (32, 128, 96, 512):
        x = scalar_test_data(rng, 64, d)
        for spec, ref in (("q8_0", ref_q8_0), ("q4_0", ref_q4_0), ("q8_0h", ref_q8_0), ("q4_0h", ref_q4_0)):
            c = Codec(spec, d)
            got = c.encode(x)
            xin = c.rotate(x) if spec.endswith("h") else x  # the library's rotation, checked above
            want, dec = ref(xin)
            if not np.array_equal(got, want):
                bad = np.nonzero(got != want)[0]
                check(False, f"{spec}/{d}: {bad.size} bytes differ from numpy, first at {bad[0]}: "
                             f"{got[bad[0]]} vs {want[bad[0]]}")
            yr = c.decode(got, rotated=True)
            check(np.array_equal(yr.reshape(-1), dec.reshape(-1)), f"{spec}/{d}: decode != numpy")
            check(np.array_equal(c.encode(x), got), f"{spec}/{d}: encoding twice differs")
            check(np.all(c.decode(got)[0] == 0.0), f"{spec}/{d}: zero vector does not decode to zeros")
    print("q8_0 / q4_0 (plain and h): bit-exact")


# ------------------------------------------------------------------ lloyd:B

def lloyd_max_numeric(bits):
    """Lloyd iteration for N(0,1) with trapezoid-rule cell integrals on a fine grid."""
    n = 1 << bits
    grid = np.linspace(-12.0, 12.0, 480_001)
    h = grid[1] - grid[0]
    pdf = np.exp(-0.5 * grid * grid) / np.sqrt(2 * np.pi)
    # cumulative trapezoid integrals of pdf and x·pdf from -12, evaluated between nodes by interpolation
    cp = np.concatenate([[0], np.cumsum((pdf[1:] + pdf[:-1]) * h / 2)])
    xp = grid * pdf
    cxp = np.concatenate([[0], np.cumsum((xp[1:] + xp[:-1]) * h / 2)])
    c = np.linspace(-2, 2, n)
    for _ in range(100000):
        t = np.concatenate([[grid[0]], (c[:-1] + c[1:]) / 2, [grid[-1]]])
        m0 = np.diff(np.interp(t, grid, cp))
        m1 = np.diff(np.interp(t, grid, cxp))
        c_new = m1 / m0
        if np.max(np.abs(c_new - c)) < 1e-12:
            return c_new
        c = c_new
    return c


def library_levels(bits, d=64):
    c = Codec(f"lloyd:{bits}", d)
    n = 1 << bits
    idx = np.arange(d) % n
    bitstream = ((idx[:, None] >> np.arange(bits)) & 1).reshape(-1)  # LSB first
    payload = np.packbits(bitstream, bitorder="little")
    b = np.concatenate([np.frombuffer(np.float16(np.sqrt(d)).tobytes(), np.uint8), payload])
    check(b.size == c.vb, f"lloyd:{bits}: vector_bytes {c.vb} != 2 + B·d/8 = {b.size}")
    y = c.decode(b, rotated=True)[0]
    return y[:n].astype(np.float64)


def unpack(b, bits, d):
    stream = np.unpackbits(b[2:], bitorder="little")[: bits * d].reshape(d, bits)
    return (stream << np.arange(bits)).sum(axis=1)


def test_lloyd():
    rng = np.random.default_rng(3)
    for bits in (2, 3, 4):
        lev = library_levels(bits)
        ref = lloyd_max_numeric(bits)
        err = np.max(np.abs(lev - ref))
        check(err < 1e-5, f"lloyd:{bits}: levels differ from numerical Lloyd-Max by {err:.3g}")
        for d in (64, 96, 128):
            c = Codec(f"lloyd:{bits}", d, seed=99)
            s = library_signs(c)
            m = explicit_rotation(d, s)
            x = (rng.standard_normal((200, d)) * rng.uniform(0.01, 50, size=(200, 1))).astype(F32)
            got = c.encode(x).reshape(200, c.vb)
            r = x.astype(np.float64) @ m.T
            norm = np.linalg.norm(r, axis=1)
            n16 = norm.astype(np.float16).astype(np.float64)
            lib_n16 = got[:, :2].copy().view(np.float16).astype(np.float64).reshape(-1)
            # equal unless the norm sits on an f16 rounding boundary
            check(np.all(np.abs(lib_n16 - n16) <= n16 * 2.0 ** -10), f"lloyd:{bits}/{d}: norm field")
            u = r * np.sqrt(d) / lib_n16[:, None]
            thr = (lev[:-1] + lev[1:]) / 2
            want = np.searchsorted(thr, u, side="right")
            near = np.min(np.abs(u[..., None] - thr), axis=-1) < 1e-4
            got_idx = np.stack([unpack(got[i], bits, d) for i in range(200)])
            bad = (got_idx != want) & ~near
            check(not bad.any(), f"lloyd:{bits}/{d}: {bad.sum()} indices differ from numpy")
            check(near.mean() < 0.01, f"lloyd:{bits}/{d}: too many near-threshold coordinates")
            dec = c.decode(got.reshape(-1))
            ref_dec = (lev[got_idx] * (lib_n16[:, None] / np.sqrt(d))) @ m  # inverse rotation = m^T
            rel = np.linalg.norm(dec - ref_dec) / np.linalg.norm(ref_dec)
            check(rel < 1e-6, f"lloyd:{bits}/{d}: decode differs from numpy (rel {rel:.3g})")
    print("lloyd:2/3/4: levels, indices, norms and decode agree with numpy")


def main():
    test_rotation()
    test_q_formats()
    test_lloyd()
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("all ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
