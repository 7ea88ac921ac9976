#!/usr/bin/env python3
"""Dequantization of engine/gguf.c + engine/dequant.c against the gguf Python package (independent
reference: gguf.GGUFWriter writes the file, gguf.quants.dequantize gives the expected floats).

For every supported type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K) the file holds a
tensor quantized by gguf.quants.quantize where the package can, and one of random raw blocks with
random finite fp16 scales (negative and subnormal included) that exercise every bit pattern of the
payload. `test_gguf --dump` writes our floats; F32/F16/BF16 must agree bit for bit, the block formats
within 1e-6 relative (they are expected, and reported, to be bit-exact too). When the default model is
cached, real tensors are compared as well (token_embd Q8_0, Q4_1 weights, an F32 norm).

RoPE scaling (check_rope_scaling, default model and the CLI needed): copies of the model written with
gguf.GGUFWriter carry `llama.rope.scaling.type` linear (factor 2) or a `rope_freqs.weight` tensor (Llama 3.1's
freq factors). The engine's logits (`e8kv generate --dump-logits`, keys rotated by the engine and, with
`--kv f32,rope=pre`, by the cache) must match py_forward_ref.py's float64 forward pass run with the scaled
frequencies theta^(-2i/d) / factor / ff_i, within its tolerance, and differ clearly from the unscaled model's;
type yarn must be refused as unsupported, an invalid factor or factor tensor as corrupted.

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


def rope_freqs(x, pos, freq, split_half):
    """x: (T, H, D); pair i of the row at position p turns by p * freq[i] (interleaved or split halves)."""
    d = x.shape[-1]
    ang = pos[:, None] * np.asarray(freq, dtype=np.float64)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = (x[..., : d // 2], x[..., d // 2:]) if split_half else (x[..., 0::2], x[..., 1::2])
    out = np.empty_like(x)
    if split_half:
        out[..., : d // 2], out[..., d // 2:] = a * c - b * s, a * s + b * c
    else:
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


def check_rope_scaling(model, cli):
    """Scaled copies of the default model: engine vs the numpy reference, scaled vs unscaled, refusals."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import py_forward_ref as fwd  # the float64 forward pass of the engine's own reference test
    from gguf_copy import copy_gguf

    failures = []
    w, cfg = fwd.load_gguf(model)
    arch = gguf.GGUFReader(model).fields["general.architecture"].contents()
    hd, theta = cfg["head_dim"], cfg["theta"]
    base = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    toks = [(i * 7919 + 17) % cfg["vocab"] for i in range(12)]
    tol = fwd.REL_TOL

    def engine(path, kv="f32"):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "logits.f32")
            cmd = [cli, "generate", "-m", path, "--tokens", ",".join(map(str, toks)), "-n", "0", "--ctx", "64",
                   "--threads", "2", "--kv", kv, "--dump-logits", out]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                return None, p
            return np.fromfile(out, dtype="<f4").reshape(len(toks), cfg["vocab"]).astype(np.float64), p

    def reference(freq):
        saved = fwd.rope
        fwd.rope = lambda x, pos, _theta, split_half: rope_freqs(x, pos, freq, split_half)
        try:
            return fwd.forward(w, cfg, toks)
        finally:
            fwd.rope = saved

    plain, p = engine(model)
    if plain is None:
        return [f"rope scaling: unscaled model: {p.stderr.strip()}"]
    # 1 and 4 alternating: every band moves (a Llama 3.1 pattern, low frequencies alone slowed, hardly turns
    # them in 12 positions), and reversed or misplaced factors would show
    ff = np.where(np.arange(hd // 2) % 2 == 1, 4.0, 1.0)
    F32, STR = gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    cases = [  # (name, set_keys, extra tensors, frequencies)
        ("linear x2", [(f"{arch}.rope.scaling.type", "linear", STR), (f"{arch}.rope.scaling.factor", 2.0, F32)],
         [], base / 2.0),
        ("rope_freqs 1,4,..", [], [("rope_freqs.weight", ff)], base / ff),
    ]
    with tempfile.TemporaryDirectory() as d:
        for name, keys, tensors, freq in cases:
            path = os.path.join(d, "scaled.gguf")
            copy_gguf(model, path, set_keys=keys, extra_tensors=tensors)
            ref = reference(freq)
            scale = np.abs(ref).max()
            for kv in ("f32", "f32,rope=pre"):  # keys turned by the engine, then by the cache
                got, p = engine(path, kv)
                if got is None:
                    failures.append(f"rope scaling {name} --kv {kv}: {p.stderr.strip()}")
                    continue
                diff = np.abs(got - ref).max()
                moved = np.abs(got - plain).max()
                ok = diff <= tol * scale and moved > 10 * tol * scale  # ignoring the scaling cannot pass
                print(f"  rope scaling {name:17s} --kv {kv:12s}: max|engine - ref| {diff:.3g} "
                      f"(rel {diff / scale:.3g}, tol {tol:g}), max|scaled - unscaled| {moved:.3g} "
                      f"(rel {moved / scale:.3g}) -> {'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"rope scaling {name} --kv {kv}: diff {diff:.3g}, vs unscaled {moved:.3g}")
        refusals = [  # (name, set_keys, extra tensors, error name, message part)
            ("yarn", [(f"{arch}.rope.scaling.type", "yarn", STR), (f"{arch}.rope.scaling.factor", 4.0, F32)], [],
             "unsupported", "rope scaling type 'yarn' is not supported"),
            ("linear x-1", [(f"{arch}.rope.scaling.type", "linear", STR), (f"{arch}.rope.scaling.factor", -1.0, F32)],
             [], "data corrupted", "rope scaling factor"),
            ("rope_freqs with a 0", [], [("rope_freqs.weight", np.where(np.arange(hd // 2) == 3, 0.0, 1.0))],
             "data corrupted", "rope_freqs.weight"),
        ]
        for name, keys, tensors, err, part in refusals:
            path = os.path.join(d, "refused.gguf")
            copy_gguf(model, path, set_keys=keys, extra_tensors=tensors)
            got, p = engine(path)
            ok = got is None and p.returncode == 1 and f"[{err}]" in p.stderr and part in p.stderr
            print(f"  rope scaling {name:20s} refused: exit {p.returncode}, {p.stderr.strip()!r} "
                  f"-> {'ok' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"rope scaling {name}: exit {p.returncode}, stderr {p.stderr.strip()!r}")
    return failures


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
        cli = os.environ.get("E8KV_CLI", os.path.join(BUILD, "e8kv"))
        if os.path.exists(cli):
            failures += check_rope_scaling(model, cli)
        else:
            print(f"note: {cli} not built, RoPE scaling check skipped")
    else:
        print(f"note: {model} not cached, real-model check skipped")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
