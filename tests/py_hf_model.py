#!/usr/bin/env python3
"""pytest: e8kv.hf on SmolLM2-135M-Instruct loaded by transformers from the GGUF: exact formats give
DynamicCache's logits; greedy generate with every preset (compress() and the explicit cache); the bytes
the cache holds (malloc's in-use bytes) = accounted bytes +-1%, <= 30% of bf16 at 4.25 bits; refusals."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    import hf_skip
    sys.exit(hf_skip.run_as_script(__file__))

import ctypes  # noqa: E402
import gc  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import DynamicCache, LlamaConfig  # noqa: E402

from hf_testlib import e8kv, ids, model, slice_file, tok  # noqa: E402,F401,F811  (e8kv.hf loaded; pytest fixtures)
from hf_beams import check_beam_generate, check_plan  # noqa: E402
from hf_padding import padded_batch, run_padded  # noqa: E402



# ------------------------------------------------------------------------------------------ exact formats
@pytest.mark.parametrize("spec", ["f32", "f32,rope=pre"])
@torch.no_grad()
def test_exact_format_logits_equal_dynamic_cache(model, ids, spec):
    """Prefill 40 tokens, then 8 single-token steps: logits equal DynamicCache's within fp tolerance. With
    rope=pre the keys go through RoPE undone (and the C cache's RoPE redone), in the GGUF pair layout."""
    x = torch.tensor([ids[:48]])
    ref_cache, cache = DynamicCache(config=model.config), e8kv.hf.E8KVCache(model.config, spec)
    assert cache.keys_pre_rope == ("rope=pre" in spec)
    steps = [(0, 40)] + [(i, i + 1) for i in range(40, 48)]
    for a, b in steps:
        ref = model(input_ids=x[:, a:b], cache=ref_cache, use_cache=True).logits
        out = model(input_ids=x[:, a:b], cache=cache, use_cache=True).logits
        err = (out - ref).abs().max().item()
        assert err < 1e-3 * ref.abs().max().item(), (spec, a, err)
    assert cache.get_seq_length() == 48


# ------------------------------------------------------------------------------------------ generate
@pytest.mark.parametrize("spec", ["near-lossless", "balanced", "aggressive", "k=e8:4,v=e8:3,sink=2",
                                  "e8:2,layers0-1=f16", "e8box:4", "q4_0h,window=8"])
@torch.no_grad()
def test_greedy_generate(model, tok, spec):
    inp = tok("The history of Rome", return_tensors="pt")
    n = inp["input_ids"].shape[1]
    ref = model.generate(**inp, max_new_tokens=12, do_sample=False, cache=DynamicCache(config=model.config))
    with e8kv.hf.compress(model, spec=spec):
        assert model.config._attn_implementation == "e8kv"
        out = model.generate(**inp, max_new_tokens=12, do_sample=False)
    assert out.shape == ref.shape
    assert (out[0, :n] == ref[0, :n]).all()
    if spec == "near-lossless":
        assert (out[0, : n + 4] == ref[0, : n + 4]).all(), tok.decode(out[0])
    # the explicit form
    cache = e8kv.hf.E8KVCache(model.config, spec=spec)
    out2 = model.generate(**inp, max_new_tokens=12, do_sample=False, cache=cache)
    assert (out2 == out).all()
    assert cache.get_seq_length() == n + 11 and cache.n_bytes > 0


def test_compress_restores_the_model(model, tok):
    before = model.config._attn_implementation
    with e8kv.hf.compress(model, "balanced"):
        pass
    assert model.config._attn_implementation == before
    assert "generate" not in vars(model) and "forward" not in vars(model)
    with pytest.raises(e8kv.E8KVError) as e:
        with e8kv.hf.compress(model, "e8tv:3"):  # needs a calibration
            pass
    assert "calibration" in str(e.value)


# ------------------------------------------------------------------------------------------ memory
def _malloc_in_use():
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ["arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost"]]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


@pytest.mark.parametrize("page", [64, 256])
@torch.no_grad()
def test_resident_bytes_equal_accounted(model, ids, page):
    """Prefill 1024 tokens into an e8:4 cache; malloc's in-use bytes grow by the accounted bytes +-1%."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("needs glibc's mallinfo2")
    n_tok = 1024
    x = torch.tensor([ids[:n_tok]])
    cache = e8kv.hf.E8KVCache(model.config, f"e8:4,page={page}", n_ctx=n_tok)
    # warm-up with the same prefill: torch keeps some buffers of its first large forward for the process
    model(input_ids=x, cache=e8kv.hf.E8KVCache(model.config, "e8:4", n_ctx=n_tok), logits_to_keep=1)
    gc.collect()
    before_cache = cache.n_bytes
    before = _malloc_in_use()
    model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
    measured = _malloc_in_use() - before
    accounted = cache.n_bytes - before_cache  # the pages (the fixed part existed before)
    s = e8kv.hf.ModelShape(model.config)
    bf16 = 2 * n_tok * s.n_layer * s.n_head_kv * s.head_dim * 2
    print(f"e8:4,page={page}, {n_tok} tokens: measured {measured} B, accounted {accounted} B (+{cache.n_bytes - accounted} fixed), "
          f"total {cache.n_bytes} B = {100 * cache.n_bytes / bf16:.1f}% of bf16 ({bf16} B)")
    # pages come from slabs (src/cache/pages.c) and the accounting counts whole slabs, so what malloc holds
    # beyond it is its header per slab, not per page (BENCHMARKS.md "Bytes held")
    print(f"  {measured - accounted} B more than accounted ({100 * (measured / accounted - 1):+.2f}%)")
    assert abs(measured / accounted - 1) < 0.01
    assert cache.n_bytes <= 0.30 * bf16


# ------------------------------------------------------------------------------------------ padded batches
@pytest.mark.parametrize("spec,side", [("f32", "left"), ("e8:4,sink=1", "right"), ("k=e8:4,v=e8:3,rope=pre", "left")])
@torch.no_grad()
def test_padded_batch_equals_each_row_alone(model, ids, spec, side):
    """Prompts of 24, 17 and 5 tokens padded to 24: each row's logits over the prompt, 3 single tokens, a
    4-token chunk and 2 more single tokens equal those of the row alone in a cache of its own (the pads are
    never stored; each row's keys go in and out of RoPE at its own positions), within fp tolerance (lossy
    formats: a batch's float rounding differs from a row's, which moves a few codes); with no mask (the pads
    taken as tokens) they do not (the control). A 0 in the mask after the prompt is refused."""
    lens = (24, 17, 5)
    prompts = [torch.tensor(ids[200 * i:200 * i + n]) for i, n in enumerate(lens)]
    blocks = [torch.tensor([ids[1000 + 50 * i + j:1000 + 50 * i + j + n] for i in range(3)])
              for j, n in ((0, 1), (1, 1), (2, 1), (3, 4), (7, 1), (8, 1))]
    alone = torch.stack([run_padded(model, e8kv.hf.E8KVCache(model.config, spec), [p],
                                    [blk[i:i + 1] for blk in blocks], "left")[0] for i, p in enumerate(prompts)])
    cache = e8kv.hf.E8KVCache(model.config, spec)
    got = run_padded(model, cache, prompts, blocks, side)
    assert cache.get_seq_length() == 24 + sum(blk.shape[1] for blk in blocks)  # transformers' padded length
    assert [r.n_tokens(0) for r in cache.rows] == [n + 9 for n in lens]  # the pads are not stored
    ctl_cache = e8kv.hf.E8KVCache(model.config, spec)
    pad_ids, mask, _ = padded_batch(prompts, side)
    model(input_ids=pad_ids, cache=ctl_cache, use_cache=True)
    ctl = model(input_ids=blocks[0], cache=ctl_cache, use_cache=True).logits[:, -1]
    scale = float(alone.abs().max())
    err = float((got - alone).abs().max())
    err_ctl = float((ctl[1:] - alone[1:, 1]).abs().max())
    print(f"padded ({side}) {spec}: max |logit diff| vs each row alone {err:.3g}, pads taken as tokens "
          f"(control) {err_ctl:.3g} (max |logit| {scale:.3g})")
    assert err <= (1e-3 if spec == "f32" else 5e-3) * scale, (err, scale)
    assert err_ctl > 10 * max(err, 1e-4 * scale), (err_ctl, err)
    bad = torch.cat((mask, torch.ones((3, 9), dtype=mask.dtype), torch.tensor([[1], [0], [1]])), 1)
    with pytest.raises(NotImplementedError):
        model(input_ids=blocks[0], attention_mask=bad, cache=cache, use_cache=True)


@torch.no_grad()
def test_compress_generate_on_a_padded_batch(model, tok):
    """e8kv.hf.compress + generate on a left-padded batch of two texts: each row's new tokens are those of the
    text alone (generate gives the forward the rows' own positions: compress keeps forward's signature)."""
    texts = ["The history of Rome", "Once upon a time in a small village near the sea, there lived"]
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        inp = tok(texts, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = side
    assert not bool(inp["attention_mask"].all())
    with e8kv.hf.compress(model, spec="e8:4,sink=1"):
        out = model.generate(**inp, max_new_tokens=8, do_sample=False)[:, inp["input_ids"].shape[1]:]
        alone = [model.generate(**tok([t], return_tensors="pt"), max_new_tokens=8, do_sample=False)[0, -8:]
                 for t in texts]
    for i in range(2):
        assert out[i].tolist() == alone[i].tolist(), (i, tok.decode(out[i]), tok.decode(alone[i]))


# ------------------------------------------------------------------------------------------ beam search
def test_batch_changes_equal_each_history_alone(model):
    """reorder_cache (beam search), batch_select_indices and batch_repeat_interleave on the CPU cache (a row
    taken twice is a copy of its C cache): every row's next logits equal its history replayed alone. f16:
    a lattice format would make the comparison one of rounding, not of bookkeeping (the batch's matmuls
    differ from a row's alone in the last bits, and a code can flip: e8:4 moves the logits by up to ~2 so,
    before any reorder)."""
    check_plan(model, lambda b: e8kv.hf.E8KVCache(model.config, "f16,sink=20"), "cpu", "f16,sink=20 (CPU cache)")


def test_beam_search_generate(model):
    """generate(num_beams=3, num_return_sequences=3) on a batch of 2 with the CPU cache: each beam's score is
    the sum of its tokens' log-probabilities replayed alone (f16, as above)."""
    check_beam_generate(model, lambda b: e8kv.hf.E8KVCache(model.config, "f16"), "cpu", "f16 (CPU cache)")


# ------------------------------------------------------------------------------------------ refusals
def test_unsupported_models_say_what_is_missing():
    small = dict(vocab_size=64, hidden_size=240, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(e8kv.hf.UnsupportedModelError, match="head_dim 60 is not a multiple of 8"):
        e8kv.hf.E8KVCache(LlamaConfig(**small), "e8:4")
    # a RoPE whose frequencies change with the length: keys can only be taken as they are, after RoPE
    cfg = LlamaConfig(**dict(small, hidden_size=256, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                      "rope_theta": 10000.0}))
    assert "RoPE type 'dynamic'" in e8kv.hf.ModelShape(cfg).rope_problem
    e8kv.hf.E8KVCache(cfg, "e8box:4")  # keys with RoPE: fine
    with pytest.raises(e8kv.hf.UnsupportedModelError, match="before RoPE.*RoPE type 'dynamic'"):
        e8kv.hf.E8KVCache(cfg, "e8:4,rope=pre")
    with pytest.raises(e8kv.hf.UnsupportedModelError, match="center=rope.*RoPE type 'dynamic'"):
        e8kv.hf.E8KVCache(cfg, "e8box:4,center=rope")
    # fixed scaled frequencies (linear, llama3, yarn) are the model's own: rope=pre, center=rope and the
    # calibrated formats take them (tests/py_hf_cuda.py test_scaled_rope_cpu_cache checks the logits)
    cfg = LlamaConfig(**dict(small, hidden_size=256, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                      "rope_theta": 10000.0}))
    s = e8kv.hf.ModelShape(cfg)
    assert s.rope_problem is None and s.cache_rope()["rope_freqs"][1] == pytest.approx(10000.0 ** (-2 / 64) / 2)
    assert e8kv.hf.E8KVCache(cfg, "e8:4,rope=pre").keys_pre_rope
