#!/usr/bin/env python3
"""pytest: the ctypes binding of python/e8kv (codecs, cache, errors carrying the library's name,
save/load). Run through ctest (scripts/test.sh) or `pytest tests/py_hf_binding.py`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    import hf_skip
    sys.exit(hf_skip.run_as_script(__file__))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hf_testlib import e8kv  # noqa: E402



# ------------------------------------------------------------------------------------------ binding
def test_codec_roundtrip_and_errors():
    c = e8kv.Codec("e8:4", 64)
    assert c.vector_bytes == 34 and abs(c.bits_per_value - 4.25) < 1e-12
    x = np.random.default_rng(1).standard_normal((100, 64)).astype(np.float32)
    codes = c.encode(x)
    assert codes.shape == (100, 34) and codes.dtype == np.uint8
    y = c.decode(codes)
    assert y.shape == x.shape
    mse = float(((x - y) ** 2).mean())
    assert 0 < mse < 0.02, mse  # E8 at 4 bits: ~1.2x the Shannon bound 2^-8 = 0.0039
    np.testing.assert_array_equal(c.encode(torch.from_numpy(x)), codes)  # torch by pointer, same bytes
    np.testing.assert_array_equal(c.encode(x), codes)  # encoding twice gives identical bytes
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Codec("e8:4", 60)
    assert e.value.code == e8kv.ErrorCode.HEAD_DIM and "head_dim" in e.value.name
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Codec("e8:9", 64)
    assert e.value.code in (e8kv.ErrorCode.SPEC, e8kv.ErrorCode.RATE)
    bad = x.copy()
    bad[3, 5] = np.nan
    with pytest.raises(e8kv.E8KVError) as e:
        c.encode(bad)
    assert e.value.code == e8kv.ErrorCode.NONFINITE


def test_rope_is_the_library_one():
    """e8kv.Rope (the engine's and the cache's RoPE) against RoPE in double, both layouts, numpy and torch,
    and split calls giving the same bits; bad arrays are named errors."""
    rng = np.random.default_rng(5)
    d, n, h, pos0, theta = 64, 130, 3, 70001, 100000.0
    x = rng.standard_normal((n, h, d)).astype(np.float32)
    i = np.arange(d // 2)
    ang = (pos0 + np.arange(n))[:, None] * theta ** (-2.0 * i / d)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    for neox in (True, False):
        r = e8kv.Rope(d, theta, neox=neox)
        y = r.apply_(x.copy(), pos0)
        i0, i1 = (i, i + d // 2) if neox else (2 * i, 2 * i + 1)
        x0, x1 = x[..., i0].astype(np.float64), x[..., i1].astype(np.float64)
        want = np.empty((n, h, d))
        want[..., i0], want[..., i1] = x0 * c - x1 * s, x0 * s + x1 * c
        assert np.abs(y - want).max() < 1e-6
        t = torch.from_numpy(x.copy())
        r.apply_(t[:50], pos0)  # rows 0..49, then 50.. as a second call
        r.apply_(t[50:], pos0 + 50)
        assert np.array_equal(t.numpy(), y)
    with pytest.raises(e8kv.E8KVError) as e:
        r.apply_(x.astype(np.float64), 0)
    assert e.value.code == e8kv.ErrorCode.BAD_ARGUMENT
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Rope(7, theta)
    assert e.value.code == e8kv.ErrorCode.HEAD_DIM


def test_cache_rope_freqs_save_load(tmp_path):
    """A cache given a scaled RoPE's frequencies (rope_freqs: keys before RoPE turn by them) saves them
    (version 3), loads back to the same attention, `e8kv info` names them, and a cache of other
    frequencies refuses the file (SPEC)."""
    import subprocess
    import hf_skip
    rng = np.random.default_rng(3)
    freqs = [10000.0 ** (-2 * i / 64) / (8.0 if i >= 16 else 1.0) for i in range(32)]
    kv = e8kv.Cache(1, 3, 64, 128, "e8:4,sink=1,rope=pre", rope_freqs=freqs)
    k = rng.standard_normal((40, 192)).astype(np.float32)
    assert kv.append(0, k, k) == 40
    q = rng.standard_normal((4, 9 * 64)).astype(np.float32)
    out = kv.attend(0, q, 36)
    path = tmp_path / "f.e8kc"
    kv.save(path)
    info = e8kv.Cache.file_info(path.read_bytes())
    assert info["version"] == 3 and info["rope_freqs"] == pytest.approx(freqs, rel=1e-7)
    np.testing.assert_array_equal(e8kv.Cache.load(path).attend(0, q, 36), out)
    other = e8kv.Cache(1, 3, 64, 128, "e8:4,sink=1,rope=pre", rope_theta=10000.0)
    with pytest.raises(e8kv.E8KVError) as e:
        other.load_into(path)
    assert e.value.code == e8kv.ErrorCode.SPEC
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Cache(1, 3, 64, 128, "e8:4", rope_freqs=freqs[:31])
    assert e.value.code == e8kv.ErrorCode.BAD_ARGUMENT
    if os.path.exists(hf_skip.CLI):
        p = subprocess.run([hf_skip.CLI, "info", str(path)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "saved cache v3" in p.stdout and "RoPE frequencies inside: 32" in p.stdout, p


def test_cache_append_attend_save_load(tmp_path):
    rng = np.random.default_rng(2)
    kv = e8kv.Cache(2, 3, 64, 256, "e8:4,sink=1", rope_theta=10000.0)
    k = rng.standard_normal((40, 192)).astype(np.float32)
    v = rng.standard_normal((40, 192)).astype(np.float32)
    assert kv.append(0, k, v) == 40 and kv.append(1, torch.from_numpy(k), torch.from_numpy(v)) == 40
    q = rng.standard_normal((40, 9 * 64)).astype(np.float32)
    o0, o1 = kv.attend(0, q, 0), kv.attend(1, torch.from_numpy(q), 0)
    assert isinstance(o0, np.ndarray) and isinstance(o1, torch.Tensor)
    np.testing.assert_array_equal(o0, o1.numpy())  # same bytes in, same codes, same attention
    path = tmp_path / "c.e8kc"
    assert kv.save(path) > 0
    back = e8kv.Cache.load(path)
    np.testing.assert_array_equal(back.attend(0, q, 0), o0)  # bit-identical after save/load
    assert e8kv.Cache.file_info(kv.save())["n_layer"] == 2
    with pytest.raises(e8kv.E8KVError) as e:
        kv.attend(0, q, 10)  # positions 10..49 are not stored
    assert e.value.code in (e8kv.ErrorCode.DIMENSION, e8kv.ErrorCode.BAD_ARGUMENT)
    # learned sinks (e8kv_cache_attend_sinks): -inf for every head changes no bit; the wrong count, NaN or +inf
    # are named errors
    np.testing.assert_array_equal(kv.attend(0, q, 0, sinks=np.full(9, -np.inf, np.float32)), o0)
    for bad, code in ((np.zeros(8, np.float32), e8kv.ErrorCode.SRC_SIZE),
                      (np.array([0.0] * 8 + [np.nan], np.float32), e8kv.ErrorCode.NONFINITE),
                      (np.array([np.inf] + [0.0] * 8, np.float32), e8kv.ErrorCode.NONFINITE)):
        with pytest.raises(e8kv.E8KVError) as e:
            kv.attend(0, q, 0, sinks=bad)
        assert e.value.code == code
    raw = bytearray(kv.save())
    raw[len(raw) // 2] ^= 0x55
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Cache.load(bytes(raw))
    assert e.value.code in (e8kv.ErrorCode.CHECKSUM, e8kv.ErrorCode.CORRUPTED)


def test_pickled_cache_rope_and_calibration():
    """pickle of the C objects (what torch.save of a transformers cache holding them does): a cache comes back
    bit-identical in attention, a calibration with the same file bytes (shared by the caches that use it),
    a RoPE with the same rotation."""
    import pickle
    rng = np.random.default_rng(3)
    cal = e8kv.Calib(2, 3, 64)
    for layer in range(2):
        x = rng.standard_normal((300, 192)).astype(np.float32)
        cal.observe(layer, x, x * 0.5)
    cal.finalize()
    kv = e8kv.Cache(2, 3, 64, 256, "e8tv:3,sink=1", rope_theta=10000.0, calib=cal)
    k = rng.standard_normal((40, 192)).astype(np.float32)
    for layer in range(2):
        kv.append(layer, k, k * 0.5)
    q = rng.standard_normal((40, 9 * 64)).astype(np.float32)
    back_kv, back_cal = pickle.loads(pickle.dumps((kv, cal)))
    np.testing.assert_array_equal(back_kv.attend(1, q, 0), kv.attend(1, q, 0))
    assert back_cal.to_bytes() == cal.to_bytes() and back_kv._calib is back_cal
    rope = e8kv.Rope(64, 10000.0, neox=False)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(rope)).apply_(x.copy(), 7), rope.apply_(x.copy(), 7))


# ------------------------------------------------------------------------------------------ allocation
def rise_of(choice, kld):
    """The summed KLD rise of a choice per layer over the probes' base (negative rises count as zero)."""
    r = 0.0
    for layer, (k, v) in enumerate(choice):
        dp, dk, dv = (max(0.0, kld[1 + 3 * layer + j] - kld[0]) for j in range(3))
        r += dp if k == "e8p:2" else (dk if k == "e8box:3" else 0.0) + (dv if v == "e8box:3" else 0.0)
    return r


def test_gpu_alloc_checks_the_model_shape():
    """bench/gpu_alloc.py's check: the rates of the base and last-layer probes, as the C cache gives them for a
    model of n layers and head_dim d (what `e8kv ppl` prints to 4 decimals), pass for (n, d) and stop the run
    for a neighbouring layer count or the other head_dim."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import gpu_alloc

    from e8kv import alloc
    for n, d in ((30, 64), (32, 128), (2, 64)):
        specs = alloc.probe_specs(n, "sink=4")
        res = {s: {"bits_per_value": round(e8kv.Cache(n, 1, d, 64, s).bits_per_value, 4)}
               for s in (specs[0], specs[-3])}
        gpu_alloc.check_shape(res, specs, n, d)
        for n2, d2 in ((n + 1, d), (n - 1, d), (n, 192 - d)):
            if n2 < 1:
                continue
            s2 = alloc.probe_specs(n2, "sink=4")
            res2 = {s2[0]: res[specs[0]], s2[-3]: res[specs[-3]]}  # the model's rates under the other names
            with pytest.raises(SystemExit, match="give the model's own"):
                gpu_alloc.check_shape(res2, s2, n2, d2)


def test_allocation_is_the_least_rise_within_the_rate():
    """e8kv.alloc.choose (dynamic programming over the layers) against brute force over every choice of 4
    layers, at head_dim 64 and 128 and rates from e8p:2's to e8box:4's; the spec it writes resolves in the C
    cache to the mean rate of the choice."""
    import itertools

    from e8kv import alloc
    rng = np.random.default_rng(7)
    n = 4
    for d in (64, 128):
        vb = alloc.vector_bytes(d)
        for trial in range(12):
            kld = [0.05] + list(0.05 + rng.exponential(0.01, 3 * n) * (rng.random(3 * n) > 0.1))
            kld[1 + 3 * int(rng.integers(n))] = 0.049  # a rise below zero counts as zero
            for bits in (8 * vb["e8p:2"] / d, 2.6, 3.0, 3.25, 3.6, 4.0, 8 * vb["e8box:4"] / d):
                budget = int(bits * d / 8 * 2 * n + 1e-9)
                best = None
                for pick in itertools.product(range(len(alloc.CHOICES)), repeat=n):
                    ch = [alloc.CHOICES[c] for c in pick]
                    if sum(vb[k] + vb[v] for k, v in ch) <= budget:
                        best = rise_of(ch, kld) if best is None else min(best, rise_of(ch, kld))
                got = alloc.choose(kld, n, d, bits)
                assert alloc.mean_bits(got, d) <= bits + 1e-9
                assert rise_of(got, kld) == pytest.approx(best, abs=1e-12), (d, trial, bits, got)
                spec = alloc.spec_of(got, "sink=2")
                kv = e8kv.Cache(n, 1, d, 64, spec)
                assert kv.bits_per_value == pytest.approx(alloc.mean_bits(got, d), abs=1e-9), spec
    # the two ends: every layer e8box:4 at its rate, every layer e8p:2 at its rate
    kld = [0.1] + [0.2, 0.15, 0.12] * n
    assert alloc.choose(kld, n, 64, 4.25) == [("e8box:4", "e8box:4")] * n
    assert alloc.choose(kld, n, 64, 2.125) == [("e8p:2", "e8p:2")] * n
    flat = [0.1] + [0.09] * (3 * n)  # every probe below its base: nothing measured, so the bits are spent
    assert alloc.choose(flat, n, 64, 4.25) == [("e8box:4", "e8box:4")] * n
    assert alloc.mean_bits(alloc.choose(flat, n, 64, 3.25), 64) == 3.25
    assert alloc.spec_of([("e8box:4", "e8box:4")] * 2) == "e8box:4"
    assert (alloc.spec_of([("e8p:2", "e8p:2"), ("e8p:2", "e8p:2"), ("e8box:3", "e8box:4"), ("e8box:4", "e8box:3")],
                          "sink=4,center=rope")
            == "e8box:4,sink=4,center=rope,layers0-1=e8p:2,layer2.k=e8box:3,layer3.v=e8box:3")
    assert len(alloc.probe_specs(3, "sink=4")) == 10 and alloc.probe_specs(3, "sink=4")[4] == "e8box:4,sink=4,layer1=e8p:2"
    for bad, code in (((kld[:-1], n, 64, 3.0), e8kv.ErrorCode.BAD_ARGUMENT),
                      ((kld[:-1] + [float("nan")], n, 64, 3.0), e8kv.ErrorCode.BAD_ARGUMENT),
                      ((kld, n, 64, 2.0), e8kv.ErrorCode.RATE), ((kld, n, 64, 4.5), e8kv.ErrorCode.RATE)):
        with pytest.raises(e8kv.E8KVError) as e:
            alloc.choose(*bad)
        assert e.value.code == code
    for bad in ("k=e8box:3", "layer0=f16", "sink"):
        with pytest.raises(e8kv.E8KVError) as e:
            alloc.probe_specs(2, bad)
        assert e.value.code == e8kv.ErrorCode.SPEC
