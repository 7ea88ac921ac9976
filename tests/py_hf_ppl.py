#!/usr/bin/env python3
"""pytest: perplexity through transformers against `e8kv ppl` on the same token ids (f32, e8:4, e8box:4,
a calibrated e8tv:4), a calibration through transformers against `e8kv calibrate`, sensitivities driving
auto=e8tv:3."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    import hf_skip
    sys.exit(hf_skip.run_as_script(__file__))

import os  # noqa: E402
import subprocess  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from hf_testlib import (CLI, N_CHUNKS, N_CTX, calib_py, cli_json, e8kv, ids, model, slice_file,  # noqa: E402,F401,F811
                        tok)



# ------------------------------------------------------------------------------------------ perplexity
@torch.no_grad()
def test_perplexity_agrees_with_cli(model, ids, slice_file, calib_py):
    specs = ["e8:4", "e8box:4", "e8tv:4"]
    cli = cli_json("ppl", "-f", slice_file, "--ctx", str(N_CTX), "--chunks", str(N_CHUNKS), "--calib", calib_py,
                   *sum([["--kv", s] for s in ["f32", *specs]], []))
    py = e8kv.hf.perplexity(model, ids, specs, n_ctx=N_CTX, n_chunks=N_CHUNKS, calib=calib_py)
    for s in ["f32", *specs]:
        c, p = cli[s], py[s]
        print(f"{s:8s} ppl transformers {p['ppl']:.6f} cli {c['ppl']:.6f} ({100 * (p['ppl'] / c['ppl'] - 1):+.3f}%)"
              f"  kld {p['kld']:.5f} / {c['kld']:.5f}  bytes {p['n_bytes']} / {c['kv_bytes']}")
        assert p["count"] == c["tokens_scored"]
        assert p["n_bytes"] == c["kv_bytes"]  # the same cache holding the same chunk: the same allocation
    # exact: two forward passes that agree to ~1e-6 give the same perplexity
    assert abs(py["f32"]["ppl"] / cli["f32"]["ppl"] - 1) < 1e-4
    # lossy: a perturbation of 1e-6 in K/V moves some values across quantizer cells and the 30 layers carry
    # it on, so the two runs are two noise realizations of the same code; `e8kv ppl` itself moves by 1.6% (e8:4)
    # and 3.4% (e8box:4) between rotation seeds on this slice, and measured here: PPL -1.9%, +1.8%, -0.4%,
    # KLD -0.4%, +0.2%, +15% for e8:4, e8box:4, e8tv:4 (BENCHMARKS.md). The 0.2% of the issue is below that
    # noise on 510 scored tokens. The pair layout and RoPE handling are checked exactly by py_hf_model.py
    # (f32,rope=pre logits equal DynamicCache's), the cache bytes above exactly.
    for s in specs:
        assert abs(py[s]["ppl"] / cli[s]["ppl"] - 1) < 0.035, s
        assert abs(py[s]["kld"] / cli[s]["kld"] - 1) < 0.25, s
        assert py[s]["kld"] > 1e-3  # the codes really are lossy


# ------------------------------------------------------------------------------------------ calibration
def test_calibration_matches_cli(calib_py, slice_file, tmp_path):
    cli_path = str(tmp_path / "cli.e8cal")
    p = subprocess.run([CLI, "calibrate", "-f", slice_file, "--ctx", str(N_CTX), "--chunks", "2", "--no-sensitivity",
                        "-o", cli_path], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr
    a, b = e8kv.Calib.load(calib_py), e8kv.Calib.load(cli_path)
    assert a.info() == b.info() == (30, 3, 64, 2 * N_CTX)
    assert os.path.getsize(calib_py) == os.path.getsize(cli_path)  # same format, same content sizes
    for layer in [0, 7, 29]:
        for is_v in (0, 1):
            for h in range(3):
                ea, eb = a.eigenvalues(layer, is_v, h), b.eigenvalues(layer, is_v, h)
                np.testing.assert_allclose(ea[:16], eb[:16], rtol=2e-3, atol=1e-6 * eb[0])
    assert a.sensitivity(0, 0) == -1.0  # none measured


@torch.no_grad()
def test_calibrate_sensitivities_drive_auto(model, tok, ids, tmp_path):
    """Sensitivity probes through transformers (short chunks to keep the test fast), then auto=e8tv:3."""
    path = tmp_path / "auto.e8cal"
    cal = e8kv.hf.calibrate(model, tok, ids, path, n_ctx=64, n_chunks=4, probe="e8tv:2", probe_chunks=1,
                            progress=False)
    sens = np.array([[cal.sensitivity(layer, v) for v in (0, 1)] for layer in range(30)])
    assert (sens >= 0).all() and (sens > 0).sum() > 40, sens
    back = e8kv.Calib.load(path)
    assert back.sensitivity(3, 1) == pytest.approx(cal.sensitivity(3, 1), rel=1e-6)
    inp = torch.tensor([ids[:20]])
    with e8kv.hf.compress(model, "auto=e8tv:3,sink=1", calib=path):
        out = model.generate(input_ids=inp, max_new_tokens=8, do_sample=False)
    assert out.shape == (1, 28)
    c = e8kv.hf.E8KVCache(model.config, "auto=e8tv:3", calib=cal)
    assert c.bits_per_value == pytest.approx(3.25, abs=0.02)


