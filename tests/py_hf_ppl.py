#!/usr/bin/env python3
"""pytest: perplexity through transformers against `e8kv ppl` on the same token ids (f32, e8:4, e8box:4,
a calibrated e8tv:4): on the same codes (the CLI's cache replayed by transformers, the 0.2% bar) and as two
independent passes (within their noise); a calibration through transformers against `e8kv calibrate`,
sensitivities driving auto=e8tv:3."""
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
SPECS = ["e8:4", "e8box:4", "e8tv:4"]


@pytest.fixture(scope="module")
def cli_ppl(slice_file, calib_py):
    return cli_json("ppl", "-f", slice_file, "--ctx", str(N_CTX), "--chunks", str(N_CHUNKS), "--calib", calib_py,
                    *sum([["--kv", s] for s in ["f32", *SPECS]], []))


class _ReplayLayer(e8kv.hf.E8KVLayer):
    """A layer whose codes were loaded: the forward's own K/V go to the shadow caches only, and the queries
    attend over the loaded codes from position 0."""

    def update(self, key_states, value_states, *args, **kwargs):
        p = self.parent
        if p.shadow is not None:
            p.shadow._append(self.layer_idx, key_states, value_states)
            p.exact._append(self.layer_idx, key_states, value_states)
        e8kv.hf._tls.pending = (p, self.layer_idx, [0], None)  # (cache, layer, each row's pos0, kept tokens)
        e8kv.hf._tls.handed = (key_states, value_states)  # (what the attention is given: checked there)
        return key_states, value_states

    def get_seq_length(self):
        return 0

    def get_mask_sizes(self, query_length):
        return query_length, 0


class _ReplayCache(e8kv.hf.E8KVCache):
    """An E8KVCache holding a whole chunk's codes saved by `e8kv generate --save-cache`, replayed by one
    transformers forward over the same tokens: the queries of transformers read the CLI's codes, so both
    passes attend over the same lossy K/V and their logits must agree to float precision. The K/V that
    transformers computes on the way (from a residual stream that equals the CLI's within float precision)
    are coded into `shadow` (same spec) and stored exactly into `exact` (f32): per layer, attention over
    `shadow` must match attention over the loaded codes far more closely than attention over `exact` does,
    which checks what the cache is handed (RoPE undone/redone, pair layout, centring) against the CLI."""

    def __init__(self, config, spec, path, shadow=True, **kw):
        super().__init__(config, spec, **kw)
        self.shadow = self.exact = None
        if shadow:
            self.shadow, self.exact = e8kv.hf.E8KVCache(config, spec, **kw), e8kv.hf.E8KVCache(config, "f32", **kw)
            self.shadow._ensure_rows(1)
            self.exact._ensure_rows(1)
        self.layers = [_ReplayLayer(self, i) for i in range(len(self.layers))]
        self.load(path)
        self.err = []  # per layer: (|shadow - loaded|, |exact - loaded|) of the attention outputs

    def _attend(self, layer, pos0, query, scaling, keep=None, sinks=None):
        out = super()._attend(layer, pos0, query, scaling, keep, sinks)
        if self.shadow is None:
            return out
        sh, ex = (c._attend(layer, pos0, query, scaling, keep, sinks) for c in (self.shadow, self.exact))
        self.err.append((float((sh - out).norm()), float((ex - out).norm())))
        return out


def _nll_kld(logits, base, chunk):
    """Scored half of one chunk (the ppl protocol): nll of the text's tokens and KLD against base."""
    first = N_CTX // 2
    lsm = torch.log_softmax(logits[first:N_CTX - 1].to(torch.float64), dim=-1)
    target = torch.tensor(chunk[first + 1:])
    nll = -lsm.gather(1, target[:, None])[:, 0]
    if base is None:
        return nll, None, lsm
    return nll, (base.exp() * (base - lsm)).sum(-1), lsm


def _replay(model, chunk, spec, calib, tmp_path, shadow=True):
    """`e8kv generate --save-cache --dump-logits` runs the CLI's pass over one chunk (the ppl pass: one batch of
    N_CTX tokens, K/V coded before attention reads them); transformers replays the chunk over the saved codes.
    Returns (transformers' logits, the CLI's logits, the replay cache)."""
    path, lpath = tmp_path / "replay.e8kc", tmp_path / "replay.logits"
    p = subprocess.run([CLI, "generate", "--tokens", ",".join(map(str, chunk)), "--kv", spec, "--calib", calib,
                        "--ctx", str(N_CTX), "-n", "0", "--save-cache", str(path), "--dump-logits", str(lpath)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    cli = torch.from_numpy(np.fromfile(lpath, dtype=np.float32).reshape(N_CTX, -1))
    lpath.unlink()  # ~100 MB a chunk: the suite should not fill a small /tmp
    cache = _ReplayCache(model.config, spec, path, calib=calib, n_ctx=N_CTX, shadow=shadow)
    py = model(input_ids=torch.tensor([chunk]), cache=cache, use_cache=True).logits[0]
    err = (py - cli).abs().max().item()
    assert err < 1e-4 * cli.abs().max().item(), (spec, err)  # float rounding only
    return py, cli, cache


@pytest.fixture(scope="module")
def replay_f32(model, ids, calib_py, tmp_path_factory):
    """Per chunk: the f32 baselines' log-softmax of the scored half, (transformers, CLI)."""
    out = []
    for c in range(N_CHUNKS):
        chunk = ids[c * N_CTX:(c + 1) * N_CTX]
        with torch.no_grad():
            py, cli, _ = _replay(model, chunk, "f32", calib_py, tmp_path_factory.mktemp("f32"), shadow=False)
        out.append((_nll_kld(py, None, chunk)[2], _nll_kld(cli, None, chunk)[2]))
    return out


@pytest.mark.parametrize("spec", SPECS)
@torch.no_grad()
def test_perplexity_equals_cli_on_the_same_codes(model, ids, calib_py, cli_ppl, replay_f32, spec, tmp_path):
    """Issue 14's bar (PPL through transformers = `e8kv ppl` within 0.2%), on the same codes. Two independent
    lossy passes are two noise realizations of the code (see the next test), so only this protocol can
    resolve 0.2%; its own error is float rounding (measured ~1e-7 of the PPL)."""
    nll_py, nll_cli, kld_py, kld_cli, ratios = [], [], [], [], []
    for c in range(N_CHUNKS):
        chunk = ids[c * N_CTX:(c + 1) * N_CTX]
        py, cli, cache = _replay(model, chunk, spec, calib_py, tmp_path)
        ratios += [a / b for a, b in cache.err]
        for logits, base, nll, kld in ((py, replay_f32[c][0], nll_py, kld_py),
                                       (cli, replay_f32[c][1], nll_cli, kld_cli)):
            n, k, _ = _nll_kld(logits, base, chunk)
            nll.append(n)
            kld.append(k)
    ppl_py, ppl_cli = (float(torch.cat(x).mean().exp()) for x in (nll_py, nll_cli))
    kld_py, kld_cli = (float(torch.cat(x).mean()) for x in (kld_py, kld_cli))
    ref = cli_ppl[spec]
    ratios = np.array(ratios)
    print(f"{spec:8s} replayed codes: ppl transformers {ppl_py:.6f} cli {ref['ppl']:.6f} "
          f"({100 * (ppl_py / ref['ppl'] - 1):+.5f}%), kld {kld_py:.6f} / {ref['kld']:.6f}; transformers' own K/V "
          f"coded: attention error / quantization error median {np.median(ratios):.3g} max {ratios.max():.3g} "
          f"(layer {int(ratios.argmax()) % len(cache.layers)})")
    # the bar, met with room: transformers on the same codes
    assert abs(ppl_py / ref["ppl"] - 1) < 0.002, (ppl_py, ref["ppl"])
    assert abs(kld_py / ref["kld"] - 1) < 0.002, (kld_py, ref["kld"])
    # and the generate pass is the ppl pass: the numbers of `e8kv ppl` (printed to 6 digits)
    assert ppl_cli == pytest.approx(ref["ppl"], rel=2e-6)
    assert kld_cli == pytest.approx(ref["kld"], rel=1e-4, abs=1e-7)
    # what transformers hands the cache is coded like the CLI's K/V: only the few values a ~1e-6 difference
    # moves across a cell differ, far below the quantization error itself (measured: median 0.0003-0.005,
    # max 0.26 where the first token's key flips in e8tv:4's last layer; keys handed over with RoPE undone
    # one position off: median 0.99)
    assert np.median(ratios) < 0.05 and ratios.max() < 0.5, ratios


@torch.no_grad()
def test_perplexity_agrees_with_cli(model, ids, calib_py, cli_ppl):
    """Two independent passes (each its own lossy cache): the same token ids and bytes; the numbers agree
    only as two noise realizations of the same code do."""
    cli = cli_ppl
    py = e8kv.hf.perplexity(model, ids, SPECS, n_ctx=N_CTX, n_chunks=N_CHUNKS, calib=calib_py)
    for s in ["f32", *SPECS]:
        c, p = cli[s], py[s]
        print(f"{s:8s} ppl transformers {p['ppl']:.6f} cli {c['ppl']:.6f} ({100 * (p['ppl'] / c['ppl'] - 1):+.3f}%)"
              f"  kld {p['kld']:.5f} / {c['kld']:.5f}  bytes {p['n_bytes']} / {c['kv_bytes']}")
        assert p["count"] == c["tokens_scored"]
        assert p["n_bytes"] == c["kv_bytes"]  # the same cache holding the same chunk: the same allocation
    # exact: two forward passes that agree to ~1e-6 give the same perplexity
    assert abs(py["f32"]["ppl"] / cli["f32"]["ppl"] - 1) < 1e-4
    # lossy: a perturbation of 1e-6 in K/V moves some values across quantizer cells and the 30 layers carry
    # it on, so the two runs are two noise realizations of the same code (BENCHMARKS.md: on this slice
    # `e8kv ppl` moves by 1.6% (e8:4) and 3.4% (e8box:4) between rotation seeds; e8tv has no seed, and
    # transformers' own e8tv:4 run under three 1e-6 relative perturbations of its K/V gave KLD 0.0096-0.0117,
    # sd 8%, PPL sd 0.43%, with the CLI's 0.0101 and 21.908 inside). The same-codes test above holds the
    # 0.2% bar; this one checks that independent runs stay within that noise.
    for s in SPECS:
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




# ------------------------------------------------------------------------------------------ allocation
@torch.no_grad()
def test_allocate_gpu_formats_on_the_cpu_cache(model, ids):
    """e8kv.hf.allocate on the default model through the CPU cache (the GPU formats' bytes are the CUDA
    cache's): the probes are e8kv.alloc.probe_specs' (short chunks to keep the test fast), the ends of the
    range are uniform, and a mean rate between them gives a spec the cache resolves to that rate or less."""
    from e8kv import alloc
    specs = e8kv.hf.allocate(model, None, ids, [2.125, 3.25, 4.25], n_ctx=64, probe_chunks=2, progress=False)
    assert specs[0] == "e8box:4,sink=4,center=rope,layers0-29=e8p:2"
    assert specs[2] == "e8box:4,sink=4,center=rope"
    c = e8kv.hf.E8KVCache(model.config, specs[1])
    assert 3.0 < c.bits_per_value <= 3.25, (specs[1], c.bits_per_value)
    assert len(alloc.probe_specs(30, "sink=4,center=rope")) == 91
