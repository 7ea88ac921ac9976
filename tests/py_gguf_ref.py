#!/usr/bin/env python3
"""Dequantization of engine/gguf.c + engine/dequant.c against the gguf Python package (independent
reference: gguf.GGUFWriter writes the file, gguf.quants.dequantize gives the expected floats).

For every supported type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K) the file holds a
tensor quantized by gguf.quants.quantize where the package can, and one of random raw blocks with
random finite fp16 scales (negative and subnormal included) that exercise every bit pattern of the
payload. `test_gguf --dump` writes our floats; F32/F16/BF16 must agree bit for bit, the block formats
within 1e-6 relative (they are expected, and reported, to be bit-exact too). When the default model is
cached, real tensors are compared as well (token_embd Q8_0, Q4_1 weights, an F32 norm).

Exit 77 (skip) when numpy/gguf or the test binary location are missing."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

BUILD = os.environ.get("E8KV_BUILD_DIR")
if not BUILD:
    print("skip: E8KV_BUILD_DIR not set (run through ctest)")
    sys.exit(77)
EXE = os.path.join(BUILD, "test_gguf")
if not os.path.exists(EXE):
    print(f"FAIL: {EXE} not built")
    sys.exit(1)

EXACT = {T.F32, T.F16, T.BF16}
BLOCK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K]
# byte offsets of fp16 scale fields inside one block (ggml-common.h)
FP16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q4_K: [0, 2],
               T.Q6_K: [208]}

rng = np.random.default_rng(20240607)


def random_fp16(n):
    """Finite half values: normal, subnormal, zero, negative."""
    bits = rng.integers(0, 0x7C00, size=n, dtype=np.uint16)  # exponent < 31: finite
    bits |= (rng.integers(0, 2, size=n, dtype=np.uint16) << 15).astype(np.uint16)
    return bits


def raw_blocks(qtype, n_rows, n_cols):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = n_rows * n_cols // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        raw[:, off:off + 2] = random_fp16(nb).view(np.uint8).reshape(nb, 2)
    return raw.reshape(n_rows, n_cols // block * size)


def build_cases():
    cases = []  # (name, qtype, payload for the writer, raw bytes for the reference)
    x = rng.standard_normal((3, 512)).astype(np.float32) * 3
    x[0, :3] = [0.0, -0.0, 1e-40]
    xs = x.copy()
    xs[1, :2] = [-np.inf, np.inf]  # subnormal and infinities pass through bit-exactly
    cases.append(("f32", T.F32, xs, xs))
    h = random_fp16(3 * 64).reshape(3, 64)
    h[0, :4] = [0x7C00, 0xFC00, 0x0001, 0x8000]  # +-inf, smallest subnormal, -0
    cases.append(("f16", T.F16, h.view(np.float16), h.view(np.uint8)))
    b16 = quantize(x, T.BF16)
    cases.append(("bf16", T.BF16, b16, b16))
    for qt in BLOCK_TYPES:
        try:
            q = quantize(x, qt)
            cases.append((f"q_{qt.name}", qt, q, q))
        except (NotImplementedError, gguf.quants.QuantError):
            pass  # the package only dequantizes the K types
        r = raw_blocks(qt, 3, 512)
        cases.append((f"raw_{qt.name}", qt, r, r))
    return cases


def run_dump(path, names=()):
    with tempfile.NamedTemporaryFile(suffix=".f32", delete=False) as f:
        out = f.name
    try:
        p = subprocess.run([EXE, "--dump", path, out, *names], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"FAIL: test_gguf --dump {path}: {p.stderr.strip()}")
            sys.exit(1)
        return np.fromfile(out, dtype=np.float32)
    finally:
        os.unlink(out)


def compare(name, qtype, ours, ref):
    ref = np.asarray(ref, dtype=np.float32).reshape(-1)
    if ours.shape != ref.shape:
        return f"{name}: {ours.size} values, reference {ref.size}"
    if qtype in EXACT:
        ok = np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
        if ok:
            print(f"  {name:12s} {qtype.name:5s} {ref.size:6d} values, all bit-exact")
        return None if ok else f"{name}: not bit-exact ({np.sum(ours.view(np.uint32) != ref.view(np.uint32))} differ)"
    if not np.all(np.isfinite(ref)):
        return f"{name}: reference not finite"
    err = np.abs(ours.astype(np.float64) - ref.astype(np.float64))
    bad = err > 1e-6 * np.abs(ref.astype(np.float64))
    if np.any(bad):
        i = int(np.argmax(bad))
        return f"{name}: {int(bad.sum())} values off, e.g. [{i}] {ours[i]!r} vs {ref[i]!r}"
    exact = int(np.sum(ours.view(np.uint32) == ref.view(np.uint32)))
    print(f"  {name:12s} {qtype.name:5s} {ref.size:6d} values, {exact} bit-exact")
    return None


def main():
    failures = []
    cases = build_cases()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "all_types.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_uint32("test.n", len(cases))
        for name, qt, payload, _ in cases:
            w.add_tensor(name, payload, raw_dtype=None if qt == T.F32 or qt == T.F16 else qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        # the package's own reader confirms what was written
        rd = gguf.GGUFReader(path)
        written = {t.name: t for t in rd.tensors}
        ours = run_dump(path)
        pos = 0
        for name, qt, _, raw in cases:
            t = written[name]
            assert t.tensor_type == qt, (name, t.tensor_type, qt)
            n = int(t.n_elements)
            ref = dequantize(np.asarray(raw), qt)
            err = compare(name, qt, ours[pos:pos + n], ref)
            if err:
                failures.append(err)
            pos += n
        if pos != ours.size:
            failures.append(f"dump has {ours.size} values, expected {pos}")

    model = os.path.expanduser("~/.cache/e8kv/SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(model):
        rd = gguf.GGUFReader(model)
        byname = {t.name: t for t in rd.tensors}
        # (name, rows): the first rows of token_embd (Q8_0, 49152 rows) keep the test short
        want = [("token_embd.weight", 2048), ("blk.0.attn_q.weight", 0), ("blk.29.ffn_down.weight", 0),
                ("output_norm.weight", 0)]
        want = [(n, r) for n, r in want if n in byname]
        ours = run_dump(model, [f"{n}@{r}" if r else n for n, r in want])
        pos = 0
        for n, rows in want:
            t = byname[n]
            data = t.data[:rows] if rows else t.data  # t.data is (rows, row bytes) for block types
            ref = dequantize(np.asarray(data), t.tensor_type)
            k = ref.size
            err = compare(n, T(t.tensor_type), ours[pos:pos + k], ref)
            if err:
                failures.append(err)
            pos += k
    else:
        print(f"note: {model} not cached, real-model check skipped")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
