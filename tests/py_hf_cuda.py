#!/usr/bin/env python3
"""pytest: the CUDA cache from Python and transformers (e8kv.CudaCache, torch.ops.e8kv.*, E8KVCache with
device="cuda") on a tiny random Llama (transformers LlamaConfig, bf16 and f32):
  - bf16 pages: the logits of a prefill + 16 decode steps equal DynamicCache's within fp tolerance, and
    so do those of a 4-token chunk after the prompt (one virtual attention row per token);
  - e8box:4 / e8box:3 / e8p:2: the bytes in the device pages equal e8kv.Codec.encode of the same K/V (the CPU
    library), and greedy decoding through the model runs;
  - eager and torch.compile(mode="reduce-overhead", fullgraph=True) steps give the same logits;
  - padded batches (left or right): each row's logits equal those of the row alone, generate() runs on them,
    and padding after the prompt is refused;
  - the device memory the cache takes (cudaMemGetInfo delta) equals its accounted bytes;
  - specs the CUDA cache cannot hold and NaN input are named errors;
  - models with sliding-window layers (tiny Qwen2 and Gemma 3): coded full-attention layers beside
    transformers' sliding layers, CPU and CUDA caches, against DynamicCache, padded, beams, compiled.
  - a model split over two GPUs (device_map-style hooks): the cache on one, logits as on one GPU.
Needs a GPU and a libe8kv built with nvcc: skipped otherwise, with the reason (CI has no GPU; there only
the check that a CUDA cache asked for without a usable device is a named error runs)."""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_skip  # noqa: E402  (E8KV_LIB and the package's path, as the other py_hf_ tests)
ROOT = hf_skip.ROOT
if __name__ == "__main__":
    sys.exit(hf_skip.run_as_script(__file__, model=False))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import e8kv  # noqa: E402
from hf_beams import check_beam_generate, check_plan, run_plan  # noqa: E402
from hf_padding import padded_batch, run_padded  # noqa: E402

GPU = e8kv.cuda_available() and torch.cuda.is_available()
WHY = ("libe8kv was built without nvcc" if not e8kv.cuda_built() else
       "no CUDA device usable by libe8kv" if not e8kv.cuda_available() else
       "torch has no CUDA" if not torch.cuda.is_available() else "")
needs_gpu = pytest.mark.skipif(not GPU, reason=f"needs a GPU: {WHY}")


def test_cuda_cache_without_gpu_is_a_named_error():
    if GPU:
        pytest.skip("a GPU is usable here: the GPU tests run instead")
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.CudaCache(2, 2, 64, 8, "e8box:4")
    assert e.value.code == e8kv.ErrorCode.UNSUPPORTED
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Cache(2, 2, 64, 64, "e8:4", device="cuda")
    assert e.value.code == e8kv.ErrorCode.UNSUPPORTED


# ------------------------------------------------------------------------------------------ helpers
def tiny_llama(dtype, n_layer=3):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=n_layer, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512, rope_theta=10000.0,
                      attn_implementation="sdpa")
    torch.manual_seed(1234)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return model


def run_steps(model, cache, prompt, tokens, step=None):
    """Prefill `prompt` (b, t), then one step per column of `tokens` (b, n) (teacher forcing): the last
    logits of every call, float32 (n + 1, b, vocab)."""
    step = step or model
    out = []
    with torch.no_grad():
        out.append(model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1].float().clone())
        for i in range(tokens.shape[1]):
            lg = step(input_ids=tokens[:, i:i + 1], past_key_values=cache, use_cache=True).logits[:, -1]
            out.append(lg.float().clone())
    return torch.stack(out)


def reference(model, prompt, n):
    """DynamicCache + SDPA: logits and the greedy tokens."""
    from transformers import DynamicCache
    model.config._attn_implementation = "sdpa"
    cache = DynamicCache(config=model.config)
    toks = []
    logits = []
    with torch.no_grad():
        lg = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1]
        for _ in range(n):
            logits.append(lg.float().clone())
            nxt = lg.argmax(-1, keepdim=True)
            toks.append(nxt)
            lg = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1]
        logits.append(lg.float().clone())
    return torch.stack(logits), torch.cat(toks, dim=1)


def gpu_cache(model, spec, batch, cap=128, dev="cuda"):
    return e8kv.hf.E8KVCudaCache(model.config, spec, device=dev, max_batch_size=batch, max_cache_len=cap)


def prompt_ids(batch, t, seed=7, dev="cuda"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1024, (batch, t), generator=g).to("cuda" if dev == "cuda" else "cpu")


# ------------------------------------------------------------------------------------------ tests
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bf16_pages_equal_dynamic_cache(dtype):
    import e8kv.hf  # noqa: F401
    model = tiny_llama(dtype)
    prompt = prompt_ids(2, 12)
    ref, toks = reference(model, prompt, 16)
    cache = gpu_cache(model, "bf16", 2)
    got = run_steps(model, cache, prompt, toks)
    cache.detach(model.config)
    cache.check()
    scale = float(ref.abs().max())
    err = float((got - ref).abs().max())
    # bf16 model: the same K/V, attention in f32 (kernel) vs bf16 SDPA; f32 model: K/V rounded to bf16
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
    print(f"bf16 pages, model {dtype}: max |logit diff| {err:.3g} (max |logit| {scale:.3g})")
    assert err <= tol * scale, (err, scale)
    assert torch.isfinite(got).all()
    # the decode tokens the reference chose are still the argmax almost everywhere (near ties aside)
    agree = float((got[:-1].argmax(-1) == toks.T).float().mean())
    assert agree >= 0.9, agree


@pytest.mark.parametrize("n", [4, 40])
@pytest.mark.parametrize("spec", ["bf16", "e8box:4,sink=64", "e8p:2,sink=64"])
def test_chunk_with_a_past_reads_the_pages(dev, spec, n):
    """A chunk of n tokens after the prompt; n = 4: attention through one virtual row per token (context =
    position + 1) over the pages, the chunk's own tokens included; n = 40 (past gather_from = 16): SDPA over
    the values gathered from the pages, causal from the bottom right. Logits = DynamicCache's steps'. With
    sink=64 every position is a sink row: exact K/V whatever the pages' format (each batch row reads its own
    sink rows, in the prompt's appends, the chunk's and the step's). Also on the CPU twin (PagesTwin)."""
    import e8kv.hf  # noqa: F401
    model = tiny_llama(torch.bfloat16) if dev == "cuda" else model_on(dev)
    prompt = prompt_ids(2, 12, dev=dev)
    ref, toks = reference(model, prompt, n + 2)
    cache = gpu_cache(model, spec, 2, dev=dev)
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        chunk = model(input_ids=toks[:, :n], past_key_values=cache, use_cache=True).logits.float()
        after = model(input_ids=toks[:, n:n + 1], past_key_values=cache, use_cache=True).logits[:, -1].float()
    cache.detach(model.config)
    cache.check()
    got = torch.cat((chunk.transpose(0, 1), after[None]))  # (n + 1, b, vocab): after tokens 0..n
    scale = float(ref.abs().max())
    err = float((got - ref[1:n + 2]).abs().max())
    print(f"chunk of {n} with a past, {spec}: max |logit diff| {err:.3g} (max |logit| {scale:.3g})")
    assert err <= 2e-2 * scale, (err, scale)
    assert int(cache.get_seq_length()) == 12 + n + 1


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", ["e8box:4", "e8p:2,sink=2", "k=e8box:4,v=bf16", "e8box:3,sink=2"])
def test_gathered_chunk_equals_the_decode_kernel(spec, dtype):
    """A chunk of 40 tokens after a 20-token prompt through the two paths over the same codes: SDPA over the
    gathered values (gather_from=2) and the decode kernel, one row per token (gather_from past the chunk);
    the chunk's logits, and those of the step after it, agree (f32 model: the gathered values are the
    decoded floats themselves; bf16 model: rounded to bf16 for SDPA). One layer, so that both caches hold
    the same codes: with more, the chunk's K/V of a later layer come from the earlier layers' attention, and
    a last-bit difference there can move a vector across a quantizer boundary (then the codes differ, as
    they may between any two attention kernels). (tests/test_cuda.cu checks the gathered floats against the
    CPU codec's decode + means bit for bit.)"""
    import e8kv.hf  # noqa: F401
    model = tiny_llama(dtype, n_layer=1)
    prompt, chunk = prompt_ids(1, 20), prompt_ids(1, 41, seed=9)
    got = {}
    for how, kw in (("gather", dict(gather_from=2)), ("kernel", dict(gather_from=10 ** 9))):
        cache = e8kv.hf.E8KVCache(model.config, spec, device="cuda", max_batch_size=1, max_cache_len=128, **kw)
        with torch.no_grad():
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
            lg = model(input_ids=chunk[:, :40], past_key_values=cache, use_cache=True).logits.float()
            st = model(input_ids=chunk[:, 40:], past_key_values=cache, use_cache=True).logits.float()
        cache.detach(model.config)
        cache.check()
        got[how] = torch.cat((lg, st), dim=1)
    scale = float(got["kernel"].abs().max())
    err = float((got["gather"] - got["kernel"]).abs().max())
    tol = 2e-4 if dtype == torch.float32 else 2e-2
    print(f"{spec}, model {dtype}: gathered chunk vs decode kernel max |logit diff| {err:.3g} (max {scale:.3g})")
    assert torch.isfinite(got["gather"]).all()
    assert err <= tol * scale, (err, scale)


@needs_gpu
@pytest.mark.parametrize("spec,kf,vf", [("e8box:4,sink=3", "e8box:4", "e8box:4"), ("e8p:2,sink=1", "e8p:2", "e8p:2"),
                                        ("k=e8box:4,v=bf16,sink=20", "e8box:4", "bf16")])
def test_sink_rows_attend_exactly(spec, kf, vf):
    """sink=N and center=1 through the caller-owned calls (rows in reverse order of the sequences: means set
    from each sequence's tokens, tokens appended with their row, sink slots row * N + position): each
    sequence's attention within 1e-3 of float64 attention over the CPU codecs' decode of its K/V minus
    its mean (mean added back), with the first N rows exact; the reference without exact rows is further
    away on the sequence whose tokens are all sinks (the rows are used). (Not against e8kv.Cache: the CPU cache scores
    e8box:4 keys with int8 queries, ~1e-2 from exact on these scores.)"""
    n_kv, d, G, n = 2, 64, 4, int(spec.split("sink=")[1])
    lens, per = [2, 37, 150], 10
    kv = e8kv.CudaCache(1, n_kv, d, 3 * per, spec, max_seqs=3, max_batch=3, max_ctx=per * 16)
    assert kv.sink == n and kv.centered
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn((3, n_kv * G * d), generator=g, device="cuda")
    tables = torch.arange(3 * per, dtype=torch.int32, device="cuda").view(3, per)
    rows = torch.tensor([2, 1, 0], dtype=torch.int32, device="cuda")
    codecs = [e8kv.Codec(f, d, seed=0) for f in (kf, vf)]
    refs = []
    for s, L in enumerate(lens):
        k = (torch.randn((L, n_kv * d), generator=g, device="cuda") * 2).to(torch.bfloat16)
        v = torch.randn((L, n_kv * d), generator=g, device="cuda").to(torch.bfloat16)
        pos = torch.arange(L, dtype=torch.int64, device="cuda")
        slots = s * per * 16 + pos  # row s owns pages s*per .. s*per+per-1
        sink_slots = torch.where(pos < n, int(rows[s]) * n + pos, torch.full_like(pos, -1))
        if s == 0:  # a sink slot per row, and a sink row per sequence, or a named error
            with pytest.raises(e8kv.E8KVError) as e:
                kv.append(0, slots, k, v, sink_slots=sink_slots[:-1])
            assert e.value.code == e8kv.ErrorCode.SRC_SIZE
            with pytest.raises(e8kv.E8KVError) as e:
                kv.append(0, slots, k, v, rows=rows[:1])
            assert e.value.code == e8kv.ErrorCode.SRC_SIZE
        kv.set_means(0, int(rows[s]), k, v)
        kv.append(0, slots, k, v, sink_slots=sink_slots, rows=rows[s].repeat(L))
        exact = [x.double().cpu().numpy().reshape(L, n_kv, d) for x in (k, v)]
        coded = []
        for c, f, x in zip(codecs, (kf, vf), exact):
            x32 = x.reshape(L, n_kv * d).astype(np.float32)
            mu = np.zeros(n_kv * d, np.float32)
            if f != "bf16" and L >= 16:
                mu = (np.cumsum(x32.astype(np.float64), axis=0)[-1] / L).astype(np.float32)
            y = c.decode(c.encode((x32 - mu).reshape(L, n_kv, d))).reshape(L, n_kv * d)
            coded.append((y.astype(np.float64) + mu).reshape(L, n_kv, d))
        qs = q[s].double().cpu().numpy().reshape(n_kv * G, d)
        out = []
        for kd, vd in ((np.concatenate((exact[0][:n], coded[0][n:])), np.concatenate((exact[1][:n], coded[1][n:]))),
                       (coded[0], coded[1])):
            o = []
            for h in range(n_kv * G):
                sc = kd[:, h // G] @ qs[h] / np.sqrt(d)
                w = np.exp(sc - sc.max())
                o.append(w @ vd[:, h // G] / w.sum())
            out.append(np.concatenate(o))
        refs.append(out)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    with pytest.raises(e8kv.E8KVError) as e:
        kv.attend(0, q, tables, ctx, rows=rows[:2])
    assert e.value.code == e8kv.ErrorCode.SRC_SIZE
    got = kv.attend(0, q, tables, ctx, rows=rows).double().cpu().numpy()
    for s in range(3):
        want, plain = refs[s]
        rel = float(np.linalg.norm(got[s] - want) / np.linalg.norm(want))
        rel_plain = float(np.linalg.norm(got[s] - plain) / np.linalg.norm(plain))
        print(f"{spec} seq {s} (len {lens[s]}): rel err {rel:.2e}; against the codes alone {rel_plain:.2e}")
        assert rel <= 1e-3, (s, rel)
        if lens[s] <= n:
            assert rel_plain > 10 * max(rel, 1e-6), (s, rel, rel_plain)


@needs_gpu
@pytest.mark.parametrize("spec,layers", [
    ("e8box:4", {0: ("e8box:4", "e8box:4"), 2: ("e8box:4", "e8box:4")}),
    ("e8box:4,center=0", {0: ("e8box:4", "e8box:4")}),
    ("e8p:2", {0: ("e8p:2", "e8p:2"), 2: ("e8p:2", "e8p:2")}),
    ("k=e8box:4,v=bf16", {0: ("e8box:4", "bf16"), 2: ("e8box:4", "bf16")}),
    ("e8box:3", {0: ("e8box:3", "e8box:3"), 2: ("e8box:3", "e8box:3")}),
    ("k=e8box:4,v=e8box:3", {0: ("e8box:4", "e8box:3"), 2: ("e8box:4", "e8box:3")}),
    # a format per layer, in the library's grammar
    ("e8box:4,layer1=e8p:2,layer2.v=bf16", {0: ("e8box:4", "e8box:4"), 1: ("e8p:2", "e8p:2"),
                                            2: ("e8box:4", "bf16")}),
])
def test_codes_equal_cpu_encoding(spec, layers):
    import e8kv.hf  # noqa: F401
    model = tiny_llama(torch.bfloat16)
    cache = gpu_cache(model, spec, 2, cap=64)
    g = torch.Generator(device="cuda").manual_seed(3)
    b, h, t, d = 2, 2, 21, 64
    n_checked = 0
    for again in range(2):  # then reset: a new sequence's first tokens set new means
        if again:
            cache.reset()
        k = (torch.randn((b, h, t, d), generator=g, device="cuda") * 2 + again).to(torch.bfloat16)
        v = torch.randn((b, h, t, d), generator=g, device="cuda").to(torch.bfloat16)
        for layer in range(3):
            cache.update(k, v, layer)
        torch.cuda.synchronize()
        cache.check()
        n_checked += check_codes(cache, spec, layers, k, v, t, d)
    assert n_checked > 0
    cache.detach(model.config)


def check_codes(cache, spec, layers, k, v, t, d):
    """Every stored vector of `layers` against the CPU codec's bytes of the same rows (minus the rows'
    means where the stream is centred); returns how many were compared."""
    b, h = k.shape[:2]
    n_checked = 0
    for layer, fmts in layers.items():
        for stream, fmt, x in ((0, fmts[0], k), (1, fmts[1], v)):
            codec = e8kv.Codec(fmt, d, seed=0)
            if stream == 0 and cache.key_perm is not None:  # keys are stored in the CPU cache's pair layout
                x = x.index_select(-1, cache.key_perm)
            xf = x.float().cpu().numpy()
            if fmt != "bf16" and "center=0" not in spec:  # centred (the default): x - the row's mean over its
                # first append, summed as the CPU cache sums
                mu = (np.cumsum(xf.astype(np.float64), axis=2)[:, :, -1:] / t).astype(np.float32)
                xf = xf - mu
            want = codec.encode(xf)  # (b, h, t, vector_bytes)
            for bi in range(b):
                for hi in range(h):
                    for ti in range(t):
                        slot = bi * cache.capacity + ti
                        got = cache.kv.read_slot(layer, stream, slot, hi)
                        np.testing.assert_array_equal(got, want[bi, hi, ti],
                                                      err_msg=f"{spec} {layer} {stream} {bi} {hi} {ti}")
                        n_checked += 1
    return n_checked


@needs_gpu
@pytest.mark.parametrize("spec", ["e8box:4", "e8p:2", "e8box:3", "k=e8box:4,v=e8box:3"])
def test_greedy_decode_runs(spec):
    import e8kv.hf  # noqa: F401
    model = tiny_llama(torch.bfloat16)
    prompt = prompt_ids(3, 9)
    ref, toks = reference(model, prompt, 16)
    cache = gpu_cache(model, spec, 3)
    got = run_steps(model, cache, prompt, toks)
    cache.detach(model.config)
    cache.check()
    assert torch.isfinite(got).all()
    assert int(cache.get_seq_length()) == 9 + 16
    agree = float((got[:-1].argmax(-1) == toks.T).float().mean())
    print(f"{spec}: greedy top-1 agreement with DynamicCache over 16 steps (teacher-forced): {agree:.3f}")


def compiled_and_eager(model, spec, prompt, toks):
    """run_steps with eager steps, then with torch.compile(mode="reduce-overhead", fullgraph=True) steps, each
    into a fresh 2-row cache of `spec`: (the eager cache, the compiled one, the largest |logit difference|,
    the largest |logit| of the eager run, the CUDA-graph skips of the compile)."""
    import e8kv.hf  # noqa: F401
    from torch._dynamo.utils import counters
    eager_cache = gpu_cache(model, spec, 2)
    eager = run_steps(model, eager_cache, prompt, toks)
    eager_cache.detach(model.config)
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    cache = gpu_cache(model, spec, 2)
    compiled = run_steps(model, cache, prompt, toks, step=step)
    cache.detach(model.config)
    cache.check()
    skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    return (eager_cache, cache, float((compiled - eager).abs().max()), float(eager.abs().max()), skips)


@needs_gpu
@pytest.mark.parametrize("spec", ["e8box:4", "bf16", "e8box:4,sink=2"])
def test_compiled_equals_eager(spec):
    model = tiny_llama(torch.bfloat16)
    prompt = prompt_ids(2, 10)
    _, toks = reference(model, prompt, 12)
    _, _, err, scale, skips = compiled_and_eager(model, spec, prompt, toks)
    print(f"{spec}: compiled vs eager max |logit diff| {err:.3g} (max |logit| {scale:.3g}), cudagraph skips {skips}")
    assert skips == 0
    assert err <= 2e-2 * scale, (err, scale)


class PagesTwin:
    """A float64 twin of e8kv.CudaCache for the CPU: what hf.E8KVCudaCache's bookkeeping (slots, lengths,
    padding, chunks, sink rows, means) must produce, without the kernels. Pages hold each stored value as
    the CUDA cache reads it back: exact for bf16/f16, else (x − mean) rounded to a grid of 1/4 plus the mean
    (so a wrong mean or a wrong slot shows in the output); the attention and the gather read them by the
    caller's block tables and context lengths as the kernels do (sink=N: positions below N from the row's
    exact sink rows; set_means: the mean of a sequence's first tokens when there are 16 or more, else 0).
    center=rope: K's centre is the keys' mean before RoPE (set_means un-turns token i by position i) turned
    to each key's position, on every pair: the pages keep x − centre(append's position) rounded, and the
    reads add centre(the slot's index in the sequence), as the kernels do, so a position the append was
    given wrong shows. It is not a model of the codecs' error: the GPU run of these tests checks the kernels."""

    def __init__(self, n_layer, n_head_kv, head_dim, n_blocks, spec="e8box:4", *, block_size=16, max_seqs=1,
                 device=None, rope_theta=0.0, rope_freqs=None, **unused):
        import re
        self.n_layer, self.n_head_kv, self.head_dim, self.block_size = n_layer, n_head_kv, head_dim, block_size
        m = re.search(r"sink=(\d+)", spec)
        self.sink = int(m.group(1)) if m else 0
        self.lossy = not spec.startswith(("bf16", "f16"))
        self.centered = self.lossy and "center=0" not in spec
        w = n_head_kv * head_dim
        z = dict(dtype=torch.float64)
        self.pages = torch.zeros((2, n_layer, n_blocks * block_size, w), **z)
        self.sinks = torch.zeros((2, n_layer, max(1, max_seqs * self.sink), w), **z)
        self.means = torch.zeros((2, n_layer, max_seqs, w), **z)
        self.rope_centre = self.centered and "center=rope" in spec
        assert not self.rope_centre or rope_theta > 0 or rope_freqs is not None
        self.inv_freq = torch.tensor(rope_freqs, dtype=torch.float64) if rope_freqs is not None else \
            float(rope_theta or 1.0) ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.device_bytes = self.token_bytes = 0
        self.max_seqs, self.shifts = max_seqs, None
        self.lsinks = [None] * n_layer

    def set_layer_sinks(self, layer, sinks):
        self.lsinks[layer] = sinks  # read at each attend, as the kernel reads the device tensor

    def clone(self, stream=None):
        """As CudaCache.clone: the stored values copied, what the cache was pointed at (learned sinks, row
        shifts) not."""
        import copy
        new = copy.copy(self)
        new.pages, new.sinks, new.means = self.pages.clone(), self.sinks.clone(), self.means.clone()
        new.lsinks, new.shifts = [None] * self.n_layer, None
        return new

    def set_row_shifts(self, shifts):
        assert self.rope_centre and (shifts is None or tuple(shifts.shape) == (self.max_seqs, 2))
        self.shifts = shifts  # read at each attend and gather, as the kernels read the device tensor

    def _turn(self, x, pos, sign=1):
        """x (n, n_head_kv * head_dim), interleaved pairs, turned by positions pos (n) (sign -1: back)"""
        n = x.shape[0]
        a = pos.double()[:, None] * self.inv_freq[None, :] * sign
        c, s = torch.cos(a)[:, None, :], torch.sin(a)[:, None, :]
        y = x.double().reshape(n, self.n_head_kv, -1, 2)
        return torch.stack((y[..., 0] * c - y[..., 1] * s, y[..., 0] * s + y[..., 1] * c), -1).reshape(n, -1)

    @staticmethod
    def check_status(status):
        pass

    def set_means(self, layer, row, k, v):
        for s, x in enumerate((k, v)):
            x = x.reshape(-1, self.n_head_kv * self.head_dim).double()
            if s == 0 and self.rope_centre:  # the mean before RoPE of tokens at 0 .. n - 1
                x = self._turn(x, torch.arange(x.shape[0]), -1)
            self.means[s, layer, row] = x.mean(0) if x.shape[0] >= 16 else 0.0

    @staticmethod
    def _contiguous(**tensors):
        """The operators take contiguous rows, as e8kv.core's CUDA tensors do (the same error)."""
        for what, x in tensors.items():
            if not x.is_contiguous():
                raise e8kv.E8KVError(e8kv.ErrorCode.BAD_ARGUMENT, f"{what}: the tensor must be contiguous")

    def append(self, layer, slots, k, v, *, status=None, sink_slots=None, rows=None, positions=None):
        self._contiguous(k=k, v=v)
        for s, x in enumerate((k, v)):
            x = x.reshape(slots.numel(), -1).double()
            if s == 0 and self.rope_centre and rows is not None:  # the pages keep the rounded residual
                assert positions is not None and positions.numel() == slots.numel()
                at = slots >= 0
                c = self._turn(self.means[0, layer, rows.long()], positions.long())
                self.pages[0, layer, slots[at]] = (torch.round((x - c) * 4) / 4)[at]
            elif self.lossy:
                mean = self.means[s, layer, rows.long()] if rows is not None and self.centered else 0.0
                self.pages[s, layer, slots] = torch.round((x - mean) * 4) / 4 + mean
            else:
                self.pages[s, layer, slots] = x.to(torch.bfloat16).double() if k.dtype != torch.float16 else x
            if sink_slots is not None:
                at = sink_slots >= 0
                self.sinks[s, layer, sink_slots[at]] = x[at]
        return slots.numel()

    @staticmethod
    def _check_copies(src, dst, limit):
        src, dst = [int(x) for x in src], [int(x) for x in dst]
        assert len(src) == len(dst) and len(set(dst)) == len(dst) and not set(src) & set(dst), (src, dst)
        assert all(0 <= x < limit for x in src + dst), (src, dst)
        return src, dst

    def copy_pages(self, src, dst):
        bs = self.block_size
        for a, b in zip(*self._check_copies(src, dst, self.pages.shape[2] // bs)):
            self.pages[:, :, b * bs:(b + 1) * bs] = self.pages[:, :, a * bs:(a + 1) * bs]
        return len(dst)

    def copy_rows(self, src, dst):
        n = self.sink
        for a, b in zip(*self._check_copies(src, dst, self.means.shape[2])):
            self.means[:, :, b] = self.means[:, :, a]
            if n:
                self.sinks[:, :, b * n:(b + 1) * n] = self.sinks[:, :, a * n:(a + 1) * n]
        return len(dst)

    def _read(self, layer, tables, n, seq, row):
        pos = torch.arange(n)
        slot = tables[seq, pos // self.block_size].long() * self.block_size + pos % self.block_size
        k, v = self.pages[0, layer, slot].clone(), self.pages[1, layer, slot].clone()
        if self.rope_centre:  # + the centre turned to each slot's index in the sequence (shifted: set_row_shifts)
            at = pos
            if self.shifts is not None:
                frm, off = (int(x) for x in self.shifts[row])
                at = torch.where(pos >= frm, pos + off, pos)
            k += self._turn(self.means[0, layer, row].expand(n, -1), at)
        lo = min(self.sink, n)
        if lo:
            k[:lo], v[:lo] = self.sinks[0, layer, row * self.sink:row * self.sink + lo], \
                self.sinks[1, layer, row * self.sink:row * self.sink + lo]
        h, d = self.n_head_kv, self.head_dim
        return k.view(n, h, d).transpose(0, 1), v.view(n, h, d).transpose(0, 1)

    def attend(self, layer, q, tables, ctx, max_ctx=None, rows=None):
        self._contiguous(q=q)
        d = self.head_dim
        out = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32)
        for i in range(q.shape[0]):
            k, v = self._read(layer, tables, int(ctx[i]), i, int(rows[i]) if rows is not None else i)
            qi = q[i].double().view(-1, d)
            g = qi.shape[0] // self.n_head_kv
            k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
            sc = (k @ qi[:, :, None])[..., 0] / d ** 0.5
            if self.lsinks[layer] is not None:  # learned sinks: one more score per head, with a zero value
                sc = torch.cat((sc, self.lsinks[layer].double()[:, None]), -1)
            p = torch.softmax(sc, -1)[:, :k.shape[1]]
            out[i] = (p[:, None, :] @ v)[:, 0].reshape(-1).float()
        return out

    def gather(self, layer, n_tok, tables, *, rows=None, dtype=None):
        kv = [self._read(layer, tables, n_tok, i, int(rows[i]) if rows is not None else i)
              for i in range(tables.shape[0])]
        return tuple(torch.stack([x[j] for x in kv]).to(dtype or torch.bfloat16) for j in range(2))


@pytest.fixture(params=["cpu-twin", pytest.param("cuda", marks=needs_gpu)])
def dev(request, monkeypatch):
    """"cuda": the CUDA cache; "cpu-twin": the same hf.E8KVCudaCache over PagesTwin on the CPU (the
    operators' CPU kernels call the twin), which checks its bookkeeping wherever the tests run."""
    if request.param == "cuda":
        return "cuda"
    for obj, name, value in twin_patches():
        monkeypatch.setattr(obj, name, value)
    return torch.device("cpu", 0)


_TWIN_KERNELS = False


def twin_patches() -> list:
    """The CUDA cache's operators get CPU kernels that call the registered cache (once per process); returns
    the patches that put PagesTwin in place of e8kv.CudaCache: (object, attribute, value) each."""
    import e8kv.hf  # noqa: F401
    from e8kv import torch_ops
    global _TWIN_KERNELS
    if not _TWIN_KERNELS:
        torch.library.register_kernel("e8kv::append", "cpu")(
            lambda state, cache, layer, slots, k, v, sink_slots=None, rows=None, positions=None: torch_ops._get(
                cache).append(layer, slots, k, v, status=state, sink_slots=sink_slots, rows=rows,
                              positions=positions) and None)
        torch.library.register_kernel("e8kv::attend", "cpu")(
            lambda state, cache, layer, q, tables, ctx, max_ctx, rows=None: torch_ops._get(cache).attend(
                layer, q, tables, ctx, max_ctx, rows=rows))
        _TWIN_KERNELS = True
    return [(e8kv.core, "CudaCache", PagesTwin),
            (torch_ops, "new_state", lambda device=None: torch.zeros(1, dtype=torch.int32))]


def model_on(dev):
    if dev == "cuda":
        return tiny_llama(torch.float32)
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512, rope_theta=10000.0,
                      attn_implementation="sdpa")
    torch.manual_seed(1234)
    return LlamaForCausalLM(cfg).eval()


PAD_LENS = (24, 17, 5)  # 17 ≥ 16: that row's means come from its own tokens, not its pads


def pad_blocks(dev):
    """The prompts (lengths PAD_LENS) and the blocks after them: 6 single tokens, a 4-token chunk (one
    virtual attention row per token), a 20-token chunk (past gather_from: SDPA over gathered pages), 2 more
    single tokens."""
    g = torch.Generator().manual_seed(11)
    on = "cuda" if dev == "cuda" else "cpu"
    prompts = [torch.randint(0, 1024, (n,), generator=g).to(on) for n in PAD_LENS]
    sizes = [1] * 6 + [4, 20, 1, 1]
    return prompts, [torch.randint(0, 1024, (len(PAD_LENS), n), generator=g).to(on) for n in sizes]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("spec", ["bf16", "e8box:4", "e8box:4,sink=2", "e8p:2", "e8box:4,sink=2,center=rope",
                                  "e8p:2,sink=2,center=rope"])
def test_padded_batch_equals_each_row_alone(dev, spec, side):
    """Prompts of lengths 24, 17 and 5 padded to 24 (as generate() passes them): each row's logits over the
    prompt, single tokens and chunks after it equal those of the row alone in a cache of its own (no pads),
    within fp tolerance: the pads are not stored (the centring means and sink rows are each row's own) and
    every row attends over its own length. The same batch with no mask after the prompt gives the same; with
    no mask at all (pads taken as tokens) it does not (the test's control)."""
    import e8kv.hf
    model = model_on(dev)
    prompts, blocks = pad_blocks(dev)
    n_all = max(PAD_LENS) + sum(blk.shape[1] for blk in blocks)
    alone = []
    for i, p in enumerate(prompts):
        c = gpu_cache(model, spec, 1, dev=dev)
        alone.append(run_padded(model, c, [p], [blk[i:i + 1] for blk in blocks], "left")[0])
        c.detach(model.config)
        c.check()
    alone = torch.stack(alone)
    cache = gpu_cache(model, spec, 3, dev=dev)
    got = run_padded(model, cache, prompts, blocks, side)
    assert int(cache.get_seq_length()) == n_all  # transformers' padded length
    cache.detach(model.config)
    cache.check()
    cache = gpu_cache(model, spec, 3, dev=dev)
    got_nomask = run_padded(model, cache, prompts, blocks, side, masks=False)
    cache.detach(model.config)
    cache = gpu_cache(model, spec, 3, dev=dev)  # the control: no mask at all, the pads taken as tokens
    ids, _, _ = padded_batch(prompts, side)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        ctl = model(input_ids=blocks[0], past_key_values=cache, use_cache=True).logits[:, -1].float()
    cache.detach(model.config)
    scale = float(alone.abs().max())
    err = float((got - alone).abs().max())
    err_nomask = float((got_nomask - alone).abs().max())
    err_ctl = float((ctl[1:] - alone[1:, 1]).abs().max())  # the padded rows' first step
    print(f"padded ({side}) {spec} on {dev}: max |logit diff| vs each row alone {err:.3g}, no mask after the "
          f"prompt {err_nomask:.3g}, pads taken as tokens (control) {err_ctl:.3g} (max |logit| {scale:.3g})")
    assert torch.isfinite(got).all()
    assert err <= 5e-3 * scale and err_nomask <= 5e-3 * scale, (err, err_nomask, scale)
    assert err_ctl > 10 * max(err, 1e-4 * scale), (err_ctl, err)


BIAS = 16.0


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 10000.0}


def biased_keys_model(dev, rope_scaling=None):
    """model_on's model whose keys before RoPE share a large mean (k_proj's bias, |b| ~ BIAS per value where
    the keys' own spread is ~1): after RoPE that mean turns with the position, as real models' keys do."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=128 if dev != "cuda" else 512, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4 if dev != "cuda" else 8, num_key_value_heads=2, vocab_size=1024,
                      max_position_embeddings=512, rope_theta=10000.0, attention_bias=True,
                      rope_scaling=rope_scaling, attn_implementation="sdpa")
    torch.manual_seed(4321)
    with torch.device("cuda" if dev == "cuda" else "cpu"):
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                a = layer.self_attn
                a.k_proj.bias.copy_(BIAS * torch.randn_like(a.k_proj.bias))
                a.q_proj.bias.zero_(), a.v_proj.bias.zero_(), a.o_proj.bias.zero_()
    return model


def prompt_then_steps(model, batch, on, seed):
    """run(cache): the last logits of a 40-token prompt, then of 6 single tokens, a 20-token chunk and one more
    token (random ids, batch rows), through `cache`; stacked (9, batch, vocab)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 1024, (batch, 40), generator=g).to(on)
    later = [torch.randint(0, 1024, (batch, n), generator=g).to(on) for n in (1,) * 6 + (20, 1)]

    def run(cache):
        out = []
        with torch.no_grad():
            for x in [prompt] + later:
                out.append(model(input_ids=x, past_key_values=cache, use_cache=True).logits[:, -1].float())
        return torch.stack(out)
    return run


@pytest.mark.parametrize("scaling,fmt", [(None, "e8box:4"), ("llama3", "e8box:4"), (None, "e8p:2")])
def test_rope_centre_follows_the_turned_mean(dev, scaling, fmt):
    """center=rope against the exact cache (DynamicCache) on keys with a large mean before RoPE: a prompt of
    40 tokens, 6 single tokens and a 20-token chunk (past gather_from: the gather path adds the centre back
    too). Each key is coded minus its row's mean turned to the key's own index, and the attention adds the
    same back, so a wrong index anywhere (append, attention, gather) leaves an error of the size of that
    mean. On the GPU the turned centre must also code these keys better than the mean after RoPE, with plain
    RoPE and with Llama 3.1's scaled frequencies (the model's inv_freq, passed as rope_freqs), in e8box:4 and in
    e8p:2 (a kernel of its own)."""
    import e8kv.hf
    model = biased_keys_model(dev, LLAMA3_ROPE if scaling == "llama3" else None)
    run = prompt_then_steps(model, 2, "cuda" if dev == "cuda" else "cpu", seed=5)
    from transformers import DynamicCache
    ref = run(DynamicCache(config=model.config))
    errs = {}
    plain, turned = f"{fmt},sink=2", f"{fmt},sink=2,center=rope"
    for spec in (plain, turned):
        cache = gpu_cache(model, spec, 2, dev=dev)
        got = run(cache)
        cache.detach(model.config)
        cache.check()
        assert torch.isfinite(got).all()
        errs[spec] = float((got - ref).abs().max())
    scale = float(ref.abs().max())
    print(f"center=rope ({scaling or 'plain'} RoPE) on {dev}: max |logit diff| vs DynamicCache {errs} "
          f"(max |logit| {scale:.3g})")
    e_mean, e_rope = errs[plain], errs[turned]
    assert e_rope <= 1.5 * e_mean + 1e-4 * scale, errs  # the twin rounds x − centre to 1/4 either way
    if dev == "cuda":
        assert e_rope < e_mean, errs


@pytest.mark.parametrize("fmt", ["e8box:4", "e8box:3"])
def test_cpu_cache_rope_centre(fmt):
    """The CPU cache's center=rope (the CUDA cache's centre, src/cache/kvcache.h) through transformers: keys
    after RoPE in transformers' split-half layout (rope_neox), the biased-keys model above, a prompt, single
    tokens and a chunk against DynamicCache: the turned centre codes these keys better than the mean after
    RoPE (e8box:4 reads through the integer tiles' score bias, e8box:3 through the float path)."""
    import e8kv.hf
    from transformers import DynamicCache
    model = biased_keys_model("cpu")
    run = prompt_then_steps(model, 1, "cpu", seed=6)
    ref = run(DynamicCache(config=model.config))
    errs = {}
    for spec in (f"{fmt},sink=2", f"{fmt},sink=2,center=rope"):
        got = run(e8kv.hf.E8KVCache(model.config, spec, n_ctx=128))
        assert torch.isfinite(got).all()
        errs[spec] = float((got - ref).abs().max())
    print(f"CPU cache center=rope ({fmt}): max |logit diff| vs DynamicCache {errs}")
    assert errs[f"{fmt},sink=2,center=rope"] < 0.8 * errs[f"{fmt},sink=2"], errs


YARN_ROPE = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}


@pytest.mark.parametrize("scaling", ["llama3", "yarn"])
def test_scaled_rope_cpu_cache(scaling):
    """A scaled RoPE (Llama 3.1's llama3; yarn, whose attention factor also scales cos and sin) in the CPU
    cache: the model's frequencies go to the cache (rope_freqs), so keys taken before RoPE (rope=pre), the
    turned key centre (center=rope) and a calibration all follow the model's RoPE. Keys with a large mean
    before RoPE (the biased-keys model): rope=pre removes that mean before coding and center=rope its turned
    part, each against the same format after RoPE (against DynamicCache, a prompt, single tokens and a chunk);
    the control, a cache made from the same config without the scaling (plain RoPE's frequencies), loses that
    gain. f32,rope=pre is exact (turned back and forth), and e8tv:4 with a calibration made through
    transformers on this model beats e8:4 after RoPE."""
    import e8kv.hf
    from transformers import DynamicCache
    model = biased_keys_model("cpu", LLAMA3_ROPE if scaling == "llama3" else YARN_ROPE)
    plain_cfg = biased_keys_model("cpu").config
    s = e8kv.hf.ModelShape(model.config)
    assert s.rope_problem is None and s.rope_scaled and "rope_freqs" in s.cache_rope()
    run = prompt_then_steps(model, 1, "cpu", seed=7)
    ref = run(DynamicCache(config=model.config))
    scale = float(ref.abs().max())
    errs = {}
    for spec in ("f32,rope=pre", "e8:4,sink=2,rope=pre", "e8:4,sink=2,rope=post", "e8box:4,sink=2",
                 "e8box:4,sink=2,center=rope"):
        for name, cfg in (("model", model.config), ("control", plain_cfg)):
            got = run(e8kv.hf.E8KVCache(cfg, spec, n_ctx=128))
            assert torch.isfinite(got).all()
            errs[spec, name] = float((got - ref).abs().max())
    ids = torch.randint(0, 1024, (256,), generator=torch.Generator().manual_seed(8)).tolist()
    cal = e8kv.hf.calibrate(model, None, ids, n_ctx=64, n_chunks=4, sensitivity=False, progress=False)
    got = run(e8kv.hf.E8KVCache(model.config, "e8tv:4,sink=2", calib=cal, n_ctx=128))
    errs["e8tv:4,sink=2", "model"] = float((got - ref).abs().max())
    print(f"{scaling} RoPE, CPU cache: max |logit diff| vs DynamicCache (max |logit| {scale:.3g}): {errs}")
    assert errs["f32,rope=pre", "model"] < 1e-4 * scale
    for turned, plain in (("e8:4,sink=2,rope=pre", "e8:4,sink=2,rope=post"),
                          ("e8box:4,sink=2,center=rope", "e8box:4,sink=2")):
        assert errs[turned, "model"] < 0.6 * errs[plain, "model"], errs
        assert errs[turned, "model"] < 0.7 * errs[turned, "control"], errs
    assert errs["e8tv:4,sink=2", "model"] < errs["e8:4,sink=2,rope=post", "model"], errs


@pytest.mark.parametrize("fmt", ["e8box:4", "e8p:2"])
def test_rope_centre_with_budget(dev, fmt):
    """center=rope with budget=32 (a row holds at most 48 tokens; its first page stays, its oldest others are
    dropped): a 40-token prompt and 50 single tokens, keys with a large mean before RoPE, against a
    DynamicCache that drops the same tokens at the same steps (_budget_reference). The kept tokens after the
    first page keep their positions through the rows' shifts (set_row_shifts), so the turned centre codes
    these keys at least as well as the plain one (better on the GPU); the same cache with its shifts taken
    away after creation (the control: the centre turned to the tokens' new indices when read) is worse than
    both."""
    import e8kv.hf
    model = biased_keys_model(dev)
    arg = e8kv.hf.cache_arg(model)
    g = torch.Generator().manual_seed(41)
    on = "cuda" if dev == "cuda" else "cpu"
    ids = torch.randint(0, 1024, (2, 40), generator=g).to(on)
    steps = torch.randint(0, 1024, (2, 50), generator=g).to(on)
    want, _ = _budget_reference(model, ids, None, steps, 48, 16)
    plain = f"{fmt},sink=2,evict=stream:0,budget=32,recent=8"
    turned = f"{fmt},sink=2,center=rope,evict=stream:0,budget=32,recent=8"
    errs = {}
    for name, spec, shifts in (("plain", plain, True), ("rope", turned, True), ("control", turned, False)):
        cache = e8kv.hf.E8KVCudaCache(model.config, spec, device=dev, max_batch_size=2, max_cache_len=64)
        if name != "plain":
            assert cache._shifts is not None and cache.kv.rope_centre
        if not shifts:
            cache.kv.set_row_shifts(None)
        got = []
        with torch.no_grad():
            got.append(model(input_ids=ids, **{arg: cache}, use_cache=True).logits[:, -1].float())
            for i in range(steps.shape[1]):
                got.append(model(input_ids=steps[:, i:i + 1], **{arg: cache}, use_cache=True).logits[:, -1].float())
        cache.detach(model.config)
        cache.check()
        cache._sync_pads()
        assert cache._budget_dropped[:2] == [48, 48], cache._budget_dropped
        if name == "rope":
            assert cache._shifts[:2].tolist() == [[16, 48], [16, 48]], cache._shifts
        got = torch.stack(got)
        assert torch.isfinite(got).all()
        errs[name] = float((got - want).abs().max())
    scale = float(want.abs().max())
    print(f"center=rope with budget= ({fmt}) on {dev}: max |logit diff| vs DynamicCache dropping the same pages "
          f"{errs} (max |logit| {scale:.3g})")
    assert errs["rope"] <= 1.5 * errs["plain"] + 1e-4 * scale, errs
    assert errs["control"] > max(1.5 * errs["rope"], errs["plain"]), errs
    if dev == "cuda":
        assert errs["rope"] < errs["plain"], errs


def test_rope_centre_errors():
    """center=rope needs RoPE frequencies it can know (rope_theta, or linear/llama3/yarn scaling; a named SPEC
    error otherwise, e.g. dynamic scaling, and without a spec such a model gets the default less center=rope);
    the CPU cache (which has center=rope too: test_cpu_cache_rope_centre) refuses it without RoPE's
    parameters, or with keys coded before RoPE."""
    import e8kv.hf
    from transformers import LlamaConfig

    def config(rope_scaling=None):
        return LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512, rope_theta=10000.0,
                           rope_scaling=rope_scaling)
    cfg = config({"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(e8kv.E8KVError, match="center=rope turns the keys' centre by the model's RoPE frequencies"):
        e8kv.hf.E8KVCudaCache(cfg, "e8box:4,center=rope", device=torch.device("cpu", 0), max_cache_len=64)
    assert e8kv.hf.cuda_default_spec(cfg) == e8kv.hf.CUDA_DEFAULT_SPEC_UNTURNED == "e8box:4,sink=4"
    cfg = config()
    assert e8kv.hf.cuda_default_spec(cfg) == e8kv.hf.CUDA_DEFAULT_SPEC == "e8box:4,sink=4,center=rope"
    for scaling in ({"rope_type": "linear", "factor": 2.0}, LLAMA3_ROPE):  # known frequencies: the model's own
        c = config(dict(scaling))
        s = e8kv.hf.ModelShape(c)
        assert e8kv.hf.cuda_default_spec(c) == e8kv.hf.CUDA_DEFAULT_SPEC and len(s.rope_freqs) == 16
        plain = [10000.0 ** (-2.0 * i / 32) for i in range(16)]
        if scaling["rope_type"] == "linear":  # every frequency halved
            assert s.rope_freqs == pytest.approx([f / 2 for f in plain])
        else:  # llama3: the fast pairs as they are, the slow ones slowed
            assert s.rope_freqs[0] == pytest.approx(plain[0]) and s.rope_freqs[-1] < plain[-1] * 0.6
    for spec, theta in (("e8box:4,center=rope", 0.0), ("e8box:4,center=rope,rope=pre", 10000.0)):
        with pytest.raises(e8kv.E8KVError) as e:
            e8kv.Cache(1, 1, 64, 64, spec, rope_theta=theta)
        assert e.value.code == e8kv.ErrorCode.SPEC
    assert not e8kv.Cache(1, 1, 64, 64, "e8box:4,center=rope", rope_theta=10000.0).keys_pre_rope
    # the CPU cache: a scaled RoPE's own frequencies (rope_freqs) too, not a length-dependent one
    assert e8kv.hf.E8KVCache(config(dict(LLAMA3_ROPE)), "e8box:4,center=rope")._probe is not None
    with pytest.raises(e8kv.hf.UnsupportedModelError, match="center=rope turns the keys' centre by the model's RoPE"):
        e8kv.hf.E8KVCache(config({"rope_type": "dynamic", "factor": 2.0}), "e8box:4,center=rope")


@pytest.mark.parametrize("spec", ["bf16", "e8box:4,sink=20", "e8p:2"])
def test_batch_changes_equal_each_history_alone(dev, spec):
    """reorder_cache (beam search; a row taken twice, a row dropped), batch_select_indices and
    batch_repeat_interleave at partial pages, below and past sink=N: every row's next logits equal those of
    its history replayed in a cache of its own (the rows share the full pages of a common past; the page
    each appends into next, and its sink rows while it has fewer than N tokens, are its own)."""
    import e8kv.hf  # noqa: F401
    model = model_on(dev)
    check_plan(model, lambda b: gpu_cache(model, spec, b, dev=dev), "cuda" if dev == "cuda" else "cpu",
               f"{spec} on {dev}")


def test_batch_changes_compiled_equal_eager(dev):
    """The batch changes between compiled one-token steps (the block tables, rows and pads they change are
    updated in place, so CUDA graphs replay with them): the logits of the eager steps."""
    import e8kv.hf  # noqa: F401
    model = model_on(dev)
    on = "cuda" if dev == "cuda" else "cpu"
    spec = "e8box:4,sink=20"
    cache = gpu_cache(model, spec, 4, dev=dev)
    eager = run_plan(model, cache, on)
    cache.detach(model.config)
    torch._dynamo.reset()
    step = (torch.compile(model.forward, mode="reduce-overhead", fullgraph=True) if dev == "cuda" else
            torch.compile(model.forward, backend="aot_eager", fullgraph=True))
    cache = gpu_cache(model, spec, 4, dev=dev)
    compiled = run_plan(model, cache, on, step=step)
    cache.detach(model.config)
    cache.check()
    torch._dynamo.reset()
    err = max(float((c[1] - e[1]).abs().max()) for c, e in zip(compiled, eager))
    scale = max(float(e[1].abs().max()) for e in eager)
    print(f"batch changes on {dev}, compiled vs eager: max |logit diff| {err:.3g} (max |logit| {scale:.3g})")
    assert all(c[0] == e[0] for c, e in zip(compiled, eager))
    assert err <= 1e-3 * scale, (err, scale)


@pytest.mark.parametrize("spec", ["bf16", "e8box:4", "e8box:4,evict=snapkv:0.5,recent=4,obs=4"])
def test_beam_search_generate(dev, spec):
    """generate(num_beams=3, num_return_sequences=3) on a batch of 2 through the CUDA cache: each beam's
    score is the sum of its tokens' log-probabilities replayed alone (with evict=, every beam's prompt is
    evicted as the replay's is, and the rows' reorders carry their evicted pads)."""
    import e8kv.hf  # noqa: F401
    model = model_on(dev)
    check_beam_generate(model, lambda b: gpu_cache(model, spec, b, dev=dev), "cuda" if dev == "cuda" else "cpu",
                        f"{spec} on {dev}")


def test_batch_change_errors(dev):
    """Rows outside the batch, or more rows than max_batch_size: a named error, nothing changed."""
    import e8kv.hf  # noqa: F401
    model = model_on(dev)
    cache = gpu_cache(model, "e8box:4", 3, dev=dev)
    with torch.no_grad():
        model(input_ids=prompt_ids(2, 20, dev=dev), past_key_values=cache, use_cache=True)
    with pytest.raises(e8kv.E8KVError) as e:
        cache.reorder_cache(torch.tensor([0, 2]))
    assert e.value.code == e8kv.ErrorCode.BAD_ARGUMENT
    with pytest.raises(e8kv.E8KVError) as e:
        cache.batch_repeat_interleave(2)
    assert e.value.code == e8kv.ErrorCode.DIMENSION
    with pytest.raises(NotImplementedError):
        cache.layers[0].reorder_cache(torch.tensor([1, 0]))
    assert cache._tables_host.tolist() == torch.arange(3 * cache.pages_per_seq).view(3, -1).tolist()
    cache.detach(model.config)


def test_tokens_past_max_cache_len_are_refused(dev):
    """An eager forward past max_cache_len is CONTEXT_FULL before anything is stored (a padded row counts
    its own tokens); generate() asked for more tokens than fit gets the same error: from its eager steps,
    or from check() after the steps it compiles on a GPU (their tokens past the end are not stored)."""
    import e8kv.hf  # noqa: F401
    model = model_on(dev)
    cache = gpu_cache(model, "e8box:4", 1, cap=32, dev=dev)
    ids = prompt_ids(1, 33, dev=dev)
    with torch.no_grad():
        model(input_ids=ids[:, :20], past_key_values=cache, use_cache=True)
        for i in range(20, 32):
            model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True)
        with pytest.raises(e8kv.E8KVError) as e:
            model(input_ids=ids[:, 32:33], past_key_values=cache, use_cache=True)
        assert e.value.code == e8kv.ErrorCode.CONTEXT_FULL
        assert int(cache.get_seq_length()) == 32
        cache.detach(model.config)
        cache = gpu_cache(model, "e8box:4", 1, cap=32, dev=dev)
        with pytest.raises(e8kv.E8KVError) as e:  # eager steps raise; generate's compiled ones tell check()
            model.generate(ids[:, :20], past_key_values=cache, max_new_tokens=20, do_sample=False, pad_token_id=0)
            cache.check()
        assert e.value.code == e8kv.ErrorCode.CONTEXT_FULL
        cache.detach(model.config)


def test_generate_shape_sizes_a_static_cache():
    """compress() on a CUDA model sizes each generate()'s cache as generate will use it: batch x
    max(num_beams, num_return_sequences) rows, prompt + max_new_tokens (or max_length) tokens."""
    import e8kv.hf
    model = model_on("cpu-twin")
    ids = torch.zeros((2, 9), dtype=torch.long)
    shape = lambda *a, **kw: e8kv.hf.generate_shape(model, a, kw)  # noqa: E731
    assert shape(ids, max_new_tokens=5) == (2, 14)
    assert shape(input_ids=ids, max_new_tokens=5, num_beams=3) == (6, 14)
    assert shape(ids, max_new_tokens=5, do_sample=True, num_return_sequences=4) == (8, 14)
    assert shape(ids, max_length=30) == (2, 30)
    from transformers import GenerationConfig
    assert shape(ids, generation_config=GenerationConfig(max_new_tokens=7, num_beams=2)) == (4, 16)
    with pytest.raises(e8kv.E8KVError):
        shape(max_new_tokens=5)


@needs_gpu
def test_compress_on_a_cuda_model():
    """with e8kv.hf.compress(model): generate() (greedy, beam search) and forward() on a CUDA model go through
    an E8KVCudaCache (cuda_default_spec: CUDA_DEFAULT_SPEC "e8box:4,sink=4,center=rope" for this plain-RoPE
    model, as E8KVCache(config, device="cuda") with no spec) sized per call: the same tokens and logits as an
    explicit one; on exit the model's attention is as before."""
    import e8kv.hf
    model = tiny_llama(torch.float32)
    ids = prompt_ids(2, 20)
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    want = []
    default = e8kv.hf.CUDA_DEFAULT_SPEC
    assert e8kv.hf.cuda_default_spec(model.config) == default
    made = e8kv.hf.E8KVCache(model.config, device="cuda", max_cache_len=32)  # no spec: the same default
    assert made.spec == default
    made.detach(model.config)
    for beams in (1, 2):
        cache = gpu_cache(model, default, 2 * beams, cap=32)
        with torch.no_grad():
            want.append(model.generate(ids, past_key_values=cache, num_beams=beams, **kw))
        cache.detach(model.config)
    cache = gpu_cache(model, default, 2, cap=20)
    with torch.no_grad():
        want_logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
    cache.detach(model.config)
    with e8kv.hf.compress(model), torch.no_grad():
        assert model.config._attn_implementation == "sdpa"
        got = [model.generate(ids, num_beams=beams, **kw) for beams in (1, 2)]
        assert model.config._attn_implementation == e8kv.hf.ATTN_NAME
        got_logits = model(input_ids=ids).logits
    assert model.config._attn_implementation == "sdpa"
    assert getattr(model.config, "_e8kv_cuda_cache", None) is None
    for g, w in zip(got, want):
        assert g.tolist() == w.tolist()
    assert float((got_logits - want_logits).abs().max()) <= 1e-5 * float(want_logits.abs().max())
    with pytest.raises(e8kv.E8KVError):
        with e8kv.hf.compress(model, "e8:4"):  # not a CUDA format: refused at once
            pass
    assert model.config._attn_implementation == "sdpa"
    # with evict=, the cache is sized for the kept prompt: a 100-token prompt keeping 64, 12 new tokens
    spec, ids = "bf16,evict=snapkv:0.5,recent=8", prompt_ids(2, 100)
    cache = gpu_cache(model, spec, 2, cap=128)
    with torch.no_grad():
        want = model.generate(ids, past_key_values=cache, **kw)
    cache.detach(model.config)
    with e8kv.hf.compress(model, spec), torch.no_grad():
        got = model.generate(ids, **kw)
        made = model.config._e8kv_cuda_cache
        assert made.capacity == 80 and made._pad_host[:2] == [36, 36], (made.capacity, made._pad_host)
    assert got.tolist() == want.tolist()


def test_perplexity_reads_the_pages(dev, monkeypatch):
    """e8kv.hf.perplexity on a CUDA model: each chunk's scored tokens attend over the pages (the decode kernel,
    one virtual row per token), against "dynamic" (a DynamicCache) as the baseline. On the twin, bf16 pages
    hold the exact values: KLD below 1e-6 (float64 against float32 attention) against the baseline, while the twin's lossy pages (values rounded to 1/4)
    show a KLD that exact attention over the chunk's own K/V would not. On the GPU (the public call, the
    model's device), KLD grows as the rate falls: bf16 < e8box:4 < e8p:2, and each row has its rate. Every
    centred cache takes its means from a whole chunk (n_ctx tokens per layer), as the CPU protocol's one
    append does (the protocol once sent the first token alone as the prompt: means 0, fewer than 16 tokens,
    so the GPU rows measured uncentred caches). A padded prompt cannot be read from the codes."""
    import e8kv.core
    import e8kv.hf
    seen = []
    cls = e8kv.core.CudaCache  # PagesTwin on the twin
    real = cls.set_means

    def spy(self, layer, row, k, v, **kw):
        seen.append(k.numel() // (self.n_head_kv * self.head_dim))
        return real(self, layer, row, k, v, **kw)
    monkeypatch.setattr(cls, "set_means", spy)
    model = model_on(dev)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 1024, (3 * 64 + 7,), generator=g).tolist()
    if dev == "cuda":
        specs = ["bf16", "e8box:4", "e8p:2"]
        r = e8kv.hf.perplexity(model, ids, specs, n_ctx=64)
    else:
        specs = ["bf16", "e8box:4"]
        r = e8kv.hf._perplexity_cuda(model, ids, specs, dev, n_ctx=64, n_chunks=0, add_bos=False, bos_id=1,
                                     seed=0, progress=False, desc="")
    assert getattr(model.config, "_e8kv_cuda_cache", None) is None
    assert list(r) == ["dynamic", *specs]
    for spec, v in r.items():
        print(f"perplexity {dev} {spec}: ppl {v['ppl']:.4f} kld {v['kld']:.3g} top1 {v['top1']:.3f} "
              f"bits {v['bits_per_value']:.4f} bytes {v['n_bytes']}")
        assert v["count"] == 3 * 31 and math.isfinite(v["ppl"]) and v["n_bytes"] > 0
    assert r["dynamic"]["kld"] == 0.0 and r["dynamic"]["top1"] == 1.0
    centred = [s for s in specs if not s.startswith("bf16")]
    assert seen == [64] * (len(centred) * 3 * model.config.num_hidden_layers), seen
    if dev == "cuda":  # (the twin holds no bytes)
        assert r["bf16"]["bits_per_value"] == 16.0 and r["e8box:4"]["bits_per_value"] < 5.0
        assert r["bf16"]["kld"] < r["e8box:4"]["kld"] < r["e8p:2"]["kld"], r
    else:
        assert r["bf16"]["kld"] < 1e-6 and r["e8box:4"]["kld"] > 1e-4, r
    with pytest.raises(e8kv.E8KVError):
        e8kv.hf.perplexity(model, ids, ["e8box:4"], n_ctx=64, device="cuda", n_threads=2)
    cache = e8kv.hf.E8KVCudaCache(model.config, "e8box:4", device=dev, max_batch_size=2, max_cache_len=64,
                                  max_chunk=64, prompt_from_codes=True)
    x = torch.tensor([ids[:8], ids[:8]], device=model.device)
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    with pytest.raises(NotImplementedError, match="padded"):
        model(input_ids=x, attention_mask=mask, **{e8kv.hf.cache_arg(model): cache}, use_cache=True)
    cache.detach(model.config)


@needs_gpu
@pytest.mark.parametrize("hd", [64, 256])
def test_allocate_on_a_cuda_model(hd):
    """e8kv.hf.allocate on a CUDA model: 1 + 3 x layers probes through the CUDA cache, then per-layer formats
    within the mean rate: every layer e8p:2 at e8p:2's rate, the default at e8box:4's, between them a mix whose
    pages (the CUDA cache's own vector bytes per layer and stream; head_dim 256: both halves) are the formats
    of the spec, e8p:2 only in pairs, and that the kernels then decode (greedy steps with finite logits)."""
    import e8kv.hf
    from e8kv import alloc
    model = tiny_llama(torch.float32, n_layer=4) if hd == 64 else llama_hd256("cuda")
    n = model.config.num_hidden_layers
    default = e8kv.hf.cuda_default_spec(model.config)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 1024, (2 * 64,), generator=g).tolist()
    vb = alloc.vector_bytes(hd)
    lo, hi = 8 * vb["e8p:2"] / hd, 8 * vb["e8box:4"] / hd
    specs = e8kv.hf.allocate(model, None, ids, [lo, 3.25, 2.75, hi], n_ctx=64, probe_chunks=2, progress=False)
    assert specs[0] == f"{default},layers0-{n - 1}=e8p:2", specs
    assert specs[3] == default, specs
    prompt = prompt_ids(2, 20)
    _, toks = reference(model, prompt, 8)
    for spec, bits in zip(specs[1:3], (3.25, 2.75)):
        cache = e8kv.hf.E8KVCudaCache(model.config, spec, device="cuda", max_batch_size=2, max_cache_len=64)
        got = [(cache.kv.vector_bytes(layer, 0), cache.kv.vector_bytes(layer, 1)) for layer in range(n)]
        assert all(b in vb.values() for pair in got for b in pair), got
        assert all((k == vb["e8p:2"]) == (v == vb["e8p:2"]) for k, v in got), got
        mean = 8 * sum(k + v for k, v in got) / (2 * n * hd)
        assert bits - 0.6 < mean <= bits, (spec, got)
        out = run_steps(model, cache, prompt, toks)
        cache.detach(model.config)
        cache.check()
        assert torch.isfinite(out).all()
        print(f"allocate head_dim {hd}, {bits}: {spec} -> mean {mean:.4f} bits")


@pytest.mark.parametrize("on", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_bench_rows(on):
    """python -m e8kv.bench's rows (e8kv.bench.run): DynamicCache and each spec timed through generate() with
    a warm-up, the cache's bytes, and the perplexity protocol's figures; on the CPU with the CPU cache (the
    baseline of its KLD is the f32 cache, a row of its own), on a GPU with the CUDA cache."""
    import e8kv.bench
    model = tiny_llama(torch.bfloat16) if on == "cuda" else model_on("cpu")
    specs = ["bf16", "e8box:4,sink=2", "e8p:2"] if on == "cuda" else ["f32", "e8:4"]
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 1024, (1, 40), generator=g)
    ppl_ids = torch.randint(0, 1024, (2 * 64,), generator=g).tolist()
    rows = e8kv.bench.run(model, ids, specs, new=6, ppl_ids=ppl_ids, ppl_chunks=2, n_ctx=64)
    for r in rows:
        print("bench row", r)
    timed = [r for r in rows if "prefill_s" in r]
    assert [r["cache"] for r in timed] == ["DynamicCache", *["StaticCache"] * (on == "cuda"), *specs]
    for r in timed:
        assert r["new_tokens"] == 6 and r["decode_tokens_per_s"] > 0 and r["cache_bytes"] > 0
        assert r["device"].startswith(on)
    q = {r["cache"]: r for r in rows if "ppl" in r}
    if on == "cuda":
        assert q["DynamicCache"]["kld"] == 0.0 and q["bf16"]["kld"] < q["e8p:2"]["kld"]
    else:
        assert "ppl" not in q.get("DynamicCache", {}) and q["f32 (perplexity baseline)"]["kld"] == 0.0
        assert q["f32"]["kld"] == 0.0 and q["e8:4"]["kld"] > 0.0
    assert all(r["ppl_tokens"] == 2 * 31 for r in q.values())
    assert getattr(model.config, "_e8kv_cuda_cache", None) is None
    only = e8kv.bench.run(model, ids, specs, ppl_ids=ppl_ids, ppl_chunks=2, n_ctx=64, decode=False)
    assert [r for r in only if "prefill_s" in r] == [] and [r["cache"] for r in only] == [r["cache"] for r in
                                                                                          q.values()]
    # (the same protocol again: equal on the CPU; a GPU's sums need not repeat bit for bit)
    assert all(math.isclose(r["kld"], q[r["cache"]]["kld"], rel_tol=1e-3, abs_tol=1e-7) for r in only)
    if on == "cuda":  # an evicting cache through generate(), and the prefix protocol (--prefix)
        ev = "bf16,evict=snapkv:0.5,recent=8"
        rows = e8kv.bench.run(model, ids, ["bf16", ev], new=6, ppl_ids=ppl_ids, ppl_chunks=1, prefix=96, score=32)
        q = {r["cache"]: r for r in rows}
        print("bench prefix rows", q)
        assert q[ev]["new_tokens"] == 6 and q[ev]["kept"] == 48 and q["bf16"]["kept"] == 96
        assert 1.9 < q[ev]["compression"] <= 2.0 and q["bf16"]["kld"] < q[ev]["kld"]


def test_padding_after_the_prompt_is_refused(dev):
    """A 0 in the mask of tokens after the prompt, or a mask whose padding differs from the prompt's, is
    refused (NotImplementedError), before anything is stored."""
    import e8kv.hf
    model = model_on(dev)
    prompts, blocks = pad_blocks(dev)
    ids, mask, pos = padded_batch(prompts, "left")
    cache = gpu_cache(model, "e8box:4", 3, dev=dev)
    one = torch.ones((3, 1), dtype=mask.dtype, device=ids.device)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        bad = torch.cat((mask, torch.tensor([[1], [0], [1]], device=ids.device)), 1)
        with pytest.raises(NotImplementedError):
            model(input_ids=blocks[0], attention_mask=bad, past_key_values=cache, use_cache=True)
        with pytest.raises(NotImplementedError):
            model(input_ids=blocks[0], attention_mask=torch.cat((torch.ones_like(mask), one), 1),
                  past_key_values=cache, use_cache=True)
        assert int(cache.get_seq_length()) == ids.shape[1]
        model(input_ids=blocks[0], attention_mask=torch.cat((mask, one), 1), past_key_values=cache, use_cache=True)
    cache.detach(model.config)
    assert int(cache.get_seq_length()) == ids.shape[1] + 1


def test_generate_on_a_padded_batch(dev):
    """generate() on a left-padded batch gives each row the greedy tokens of the row alone (bf16 pages, f32
    model: near ties aside)."""
    import e8kv.hf
    from transformers import DynamicCache
    model = model_on(dev)
    prompts, _ = pad_blocks(dev)
    ids, mask, _ = padded_batch(prompts, "left")
    n = 8
    with torch.no_grad():
        ref = [model.generate(input_ids=p[None], max_new_tokens=n, do_sample=False,
                              past_key_values=DynamicCache(config=model.config))[0, len(p):] for p in prompts]
        cache = gpu_cache(model, "bf16", 3, dev=dev)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                             past_key_values=cache)[:, ids.shape[1]:]
    cache.detach(model.config)
    cache.check()
    agree = float((out == torch.stack(ref)).float().mean())
    print(f"generate on a left-padded batch, bf16 pages: greedy agreement with each row alone {agree:.3f}")
    assert out.shape == (3, n)
    assert agree >= 0.9, (out, ref)


def test_padded_compiled_equals_eager(dev):
    """A padded prompt (eager), then compiled one-token steps (no mask): the logits of the eager steps."""
    import e8kv.hf
    from torch._dynamo.utils import counters
    model = model_on(dev)
    prompts, blocks = pad_blocks(dev)
    blocks = blocks[:6]
    cache = gpu_cache(model, "e8box:4,sink=2", 3, dev=dev)
    eager = run_padded(model, cache, prompts, blocks, "left", masks=False)
    cache.detach(model.config)
    torch._dynamo.reset()
    counters.clear()
    # on the CPU twin: dynamo's graph (fullgraph, guards) without inductor's C++ code, which needs Python.h
    step = (torch.compile(model.forward, mode="reduce-overhead", fullgraph=True) if dev == "cuda" else
            torch.compile(model.forward, backend="aot_eager", fullgraph=True))
    cache = gpu_cache(model, "e8box:4,sink=2", 3, dev=dev)
    compiled = run_padded(model, cache, prompts, blocks, "left", masks=False, step=step)
    cache.detach(model.config)
    cache.check()
    skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    err = float((compiled - eager).abs().max())
    scale = float(eager.abs().max())
    print(f"padded on {dev}, compiled vs eager: max |logit diff| {err:.3g} (max |logit| {scale:.3g}), "
          f"cudagraph skips {skips}")
    assert skips == 0
    assert err <= 1e-3 * scale, (err, scale)


@needs_gpu
def test_device_bytes_are_accounted():
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    kv = e8kv.CudaCache(32, 8, 128, 8 * 1024 // 16 * 4, "e8box:4", max_ctx=4096, max_batch=8, max_n_head=32)
    torch.cuda.synchronize()
    taken = free0 - torch.cuda.mem_get_info()[0]
    acc = kv.device_bytes
    print(f"CudaCache: accounted {acc} bytes, cudaMemGetInfo delta {taken} bytes")
    assert acc > 256 << 20
    assert abs(taken - acc) <= max(0.01 * acc, 2 << 20), (taken, acc)
    # pages: exactly token_bytes per token slot, 67 bytes per e8box:4 vector of 128 (doc/format.md §2.4)
    assert kv.vector_bytes(0, 0) == 67 and kv.token_bytes == 32 * 2 * 8 * 67
    assert acc >= kv.token_bytes * 8 * 1024 // 16 * 4 * 16


@needs_gpu
def test_errors_are_named():
    import e8kv.hf
    model = tiny_llama(torch.bfloat16)
    for spec in ["e8:4", "balanced", "e8box:4,rope=pre", "k=e8box:4,v=e8:3", "auto=e8tv:3", "e8box:4,sink=65",
                 "e8box:4,window=16", "e8box:4,layer1.k=e8p:2"]:
        with pytest.raises(e8kv.E8KVError) as e:
            e8kv.hf.E8KVCache(model.config, spec, device="cuda", max_batch_size=1, max_cache_len=64)
        assert e.value.code == e8kv.ErrorCode.SPEC, spec
    with pytest.raises(e8kv.E8KVError) as e:  # e8p:2 pairs only with itself (the C cache says so)
        e8kv.hf.E8KVCache(model.config, "k=e8p:2,v=bf16", device="cuda", max_batch_size=1, max_cache_len=64)
    assert e.value.code == e8kv.ErrorCode.SPEC
    cache = gpu_cache(model, "e8box:4", 1, cap=64)
    k = torch.randn((1, 2, 3, 64), device="cuda", dtype=torch.bfloat16)
    k[0, 1, 2, 5] = float("nan")
    cache.update(k, k.clone(), 0)  # asynchronous: the status word records it
    with pytest.raises(e8kv.E8KVError) as e:
        cache.check()
    assert e.value.code == e8kv.ErrorCode.NONFINITE
    cache.detach(model.config)
    # the synchronous call of the binding raises at once
    kv = e8kv.CudaCache(1, 2, 64, 4, "e8box:4")
    slots = torch.arange(3, dtype=torch.int64, device="cuda")
    rows = k[0].transpose(0, 1).reshape(3, 128).contiguous()
    with pytest.raises(e8kv.E8KVError) as e:
        kv.append(0, slots, rows, rows)
    assert e.value.code == e8kv.ErrorCode.NONFINITE
    # learned sinks: a float32 contiguous CUDA vector (the binding); a layer past the cache's (the C cache)
    for bad in (torch.zeros(4), torch.zeros(4, dtype=torch.float64, device="cuda"),
                torch.zeros(2, 4, device="cuda"), torch.zeros(8, device="cuda")[::2]):
        with pytest.raises(e8kv.E8KVError) as e:
            kv.set_layer_sinks(0, bad)
        assert e.value.code == e8kv.ErrorCode.BAD_ARGUMENT, bad
    with pytest.raises(e8kv.E8KVError) as e:
        kv.set_layer_sinks(1, torch.zeros(4, device="cuda"))
    assert e.value.code == e8kv.ErrorCode.BAD_ARGUMENT
    kv.set_layer_sinks(0, torch.zeros(4, device="cuda"))
    kv.set_layer_sinks(0, None)


def test_short_first_append_warns(dev):
    """A batch row whose first append has fewer than 16 tokens keeps means 0 for the whole sequence (the CPU
    cache's rule): the cache says so once, since such a row is coded uncentred (SmolLM2, e8box:4: KLD 0.044
    against 0.035). 16 tokens, or center=0, raise nothing."""
    import warnings as w

    import e8kv.hf
    model = model_on(dev)
    arg = e8kv.hf.cache_arg(model)
    ids = torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(3)).to(model.device)
    for spec, n, warns in (("e8box:4", 5, True), ("e8box:4", 16, False), ("e8box:4,center=0", 5, False),
                           ("bf16", 5, False)):
        cache = e8kv.hf.E8KVCudaCache(model.config, spec, device=dev, max_cache_len=64)
        with w.catch_warnings(record=True) as got:
            w.simplefilter("always")
            model(input_ids=ids[:, :n], **{arg: cache}, use_cache=True)
        cache.detach(model.config)
        said = [str(x.message) for x in got if "fewer than 16" in str(x.message)]
        assert len(said) == warns, (spec, n, said)


def test_keys_in_the_cpu_caches_layout(dev):
    """A Llama's keys go to the pages in GGUF's interleaved RoPE pair layout (key_perm: index 2i <- i,
    2i+1 <- i + d/2), the layout E8KVCache codes them in, and the queries follow: bf16 pages hold the
    permuted keys and unpermuted values, and the logits still equal DynamicCache's (on the twin, exactly
    stored pages: within float tolerance)."""
    from transformers import DynamicCache

    import e8kv.hf
    model = model_on(dev)
    arg = e8kv.hf.cache_arg(model)
    d = model.config.hidden_size // model.config.num_attention_heads
    ids = torch.randint(0, 1024, (1, 24), generator=torch.Generator().manual_seed(4)).to(model.device)
    cache = e8kv.hf.E8KVCudaCache(model.config, "bf16", device=dev, max_cache_len=64)
    perm = cache.key_perm.cpu()
    assert perm.tolist()[:4] == [0, d // 2, 1, d // 2 + 1] and sorted(perm.tolist()) == list(range(d))
    seen = {}
    real = e8kv.hf.E8KVCudaCache._append

    def spy(self, layer, k, v, *a, **kw):
        seen.setdefault(layer, (k.detach().clone(), v.detach().clone()))
        return real(self, layer, k, v, *a, **kw)
    e8kv.hf.E8KVCudaCache._append = spy
    try:
        with torch.no_grad():
            got = [model(input_ids=ids[:, :20], **{arg: cache}, use_cache=True).logits]
            for i in range(20, 24):  # decode steps: the queries read the permuted pages
                got.append(model(input_ids=ids[:, i:i + 1], **{arg: cache}, use_cache=True).logits)
    finally:
        e8kv.hf.E8KVCudaCache._append = real
    if dev != "cuda":  # the twin's pages: permuted keys, values as given
        twin = cache.kv
        k, v = seen[0]
        h = k.shape[1]
        stored_k = twin.pages[0, 0, :20].view(20, h, d).transpose(0, 1)
        stored_v = twin.pages[1, 0, :20].view(20, h, d).transpose(0, 1)
        want_k = k[0, :, :20].index_select(-1, perm).to(torch.bfloat16).double()
        assert torch.equal(stored_k, want_k) and torch.equal(stored_v, v[0, :, :20].to(torch.bfloat16).double())
    cache.detach(model.config)
    ref = DynamicCache(config=model.config)
    with torch.no_grad():
        want = [model(input_ids=ids[:, :20], **{arg: ref}, use_cache=True).logits]
        for i in range(20, 24):
            want.append(model(input_ids=ids[:, i:i + 1], **{arg: ref}, use_cache=True).logits)
    err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want))
    scale = max(float(b.float().abs().max()) for b in want)
    print(f"keys in GGUF layout, {dev}: max |logit diff| against DynamicCache {err:.3g} (max |logit| {scale:.3g})")
    # K rounded to bf16 in the pages (queries left unpermuted: 0.026 on the twin, against 0.0007)
    assert err <= 5e-3 * scale, (err, scale)


# ------------------------------------------------------------------------------------------ eviction
@pytest.mark.parametrize("scorer", ["snapkv", "h2o", "keykey", "stream"])
@pytest.mark.parametrize("sink", [0, 3])
@pytest.mark.parametrize("learned", [False, True])
def test_evict_selects_what_the_c_library_keeps(scorer, sink, learned):
    """e8kv.evict.select (what the CUDA cache keeps of a prompt) against the C library's e8kv_cache_evict on
    the same keys and queries (an f32 cache: exact keys, no RoPE): as many tokens kept, and a query's
    attention over the C cache after its eviction equals float64 attention over the tokens select() chose
    for each KV head (a different choice changes the output). learned: gpt-oss's learned attention sinks in
    the scorers' softmax (e8kv_cache_evict_sinks): h2o keeps other tokens with them than without (snapkv's 8
    max-pooled queries may keep the same)."""
    import e8kv.evict as ev
    n, H, n_head, d = 150, 2, 4, 64
    g = torch.Generator().manual_seed(5 + sink)
    k = torch.randn(n, H * d, generator=g) * torch.linspace(0.2, 2.0, n)[:, None]
    v = torch.randn(n, H * d, generator=g)
    q = torch.randn(n, n_head * d, generator=g)
    spec = f"f32,evict={scorer}:0.5,recent=8,obs=8" + (f",sink={sink}" if sink else "")
    c = e8kv.Cache(1, H, d, 256, spec)
    c.append(0, k.numpy(), v.numpy())
    queries = scorer in ("snapkv", "h2o")
    if learned and not queries:
        pytest.skip("keykey and stream take no queries, so no sinks")
    ls = torch.tensor([4.0, -4.0, 6.0, -1.0]) if learned else None  # logits in the scores' units
    c.evict(q[None].numpy() if queries else None, n_head=n_head, q_pos0=0,
            sinks=ls[None].numpy() if learned else None)
    cfg, rest = ev.parse(spec)
    assert rest == "f32" + (f",sink={sink}" if sink else "") and cfg == ev.EvictConfig(scorer, 0.5, 8, 8)
    kh, vh = k.view(n, H, d).transpose(0, 1), v.view(n, H, d).transpose(0, 1)
    qh = q.view(n, n_head, d).transpose(0, 1)
    sel = ev.select(cfg, qh if cfg.needs_queries else None, kh, sink=sink, block=c.page_tokens, sinks=ls)
    if learned and scorer == "h2o":  # the sinks matter: without them h2o (every query's weight) keeps others
        assert not torch.equal(sel, ev.select(cfg, qh, kh, sink=sink, block=c.page_tokens))
    assert sel.shape[1] == c.n_kept(0) < n, (sel.shape, c.n_kept(0))
    assert sel[:, :max(sink, 1)].tolist() == [list(range(max(sink, 1)))] * H
    assert sel[:, -8:].tolist() == [list(range(n - 8, n))] * H
    qn = torch.randn(1, n_head * d, generator=g)
    got = torch.from_numpy(c.attend(0, qn.numpy(), pos0=n - 1)).double().view(n_head, d)

    def attend(keep):
        out = torch.empty(n_head, d, dtype=torch.float64)
        for hq in range(n_head):
            h = hq // (n_head // H)
            kk, vv = kh[h, keep[h]].double(), vh[h, keep[h]].double()
            w = torch.softmax(kk @ qn.view(n_head, d)[hq].double() / d ** 0.5, 0)
            out[hq] = w @ vv
        return out
    want = attend(sel)
    # the control: one chosen token swapped for the one before it
    other = attend(torch.cat((sel[:, :-9], sel[:, -9:-8] - 1, sel[:, -8:]), 1))
    err, moved = float((got - want).abs().max()), float((other - want).abs().max())
    print(f"evict={scorer} sink={sink} learned={learned}: kept {sel.shape[1]} of {n}; |C - select| {err:.2e} (another choice: {moved:.2e})")
    assert err <= 1e-4 and moved > 100 * max(err, 1e-6), (err, moved)


def _evicting_reference(model, ids, kept, steps):
    """DynamicCache holding, after the prompt ids (b, t), only the K/V kept[layer][row] (per KV head) of each
    layer; then the tokens steps (b, n) one by one at their true positions. Logits of every call."""
    from transformers import DynamicCache
    import e8kv.hf
    arg = e8kv.hf.cache_arg(model)
    model.config._attn_implementation = "sdpa"
    ref = DynamicCache(config=model.config)
    b, t = ids.shape
    with torch.no_grad():
        out = [model(input_ids=ids, **{arg: ref}, use_cache=True).logits[:, -1].float()]
        for layer, lay in enumerate(ref.layers):
            idx = torch.stack(kept[layer]).to(lay.keys.device)  # (b, H, m)
            at = idx[..., None].expand(-1, -1, -1, lay.keys.shape[-1])
            lay.keys, lay.values = torch.gather(lay.keys, 2, at), torch.gather(lay.values, 2, at)
        for i in range(steps.shape[1]):
            pos = torch.full((b, 1), t + i, device=ids.device)
            out.append(model(input_ids=steps[:, i:i + 1], position_ids=pos, **{arg: ref},
                             use_cache=True).logits[:, -1].float())
    return torch.stack(out)


@pytest.mark.parametrize("spec", ["bf16,evict=snapkv:0.5,recent=8,obs=8", "bf16,sink=4,evict=h2o:0.6,recent=8",
                                  "bf16,evict=keykey:0.7,recent=16"])
def test_evicted_prompt_attends_over_the_kept_tokens(dev, spec):
    """A prompt of 100 tokens (2 batch rows) into a cache with evict=: each row and KV head keeps
    e8kv.evict.select's tokens (the count its kept() says, the first and newest always), the row's later
    tokens take the slots after them while their positions stay the prompt's, and every decode step's logits
    equal those of a DynamicCache holding exactly the kept K/V (bf16 pages: within bf16 tolerance), against
    which the full prompt's logits differ (the control)."""
    _check_evicted_prompt(model_on(dev), dev, spec)


def test_evicted_prompt_at_head_dim_256(dev):
    """The same at head_dim 256 (each head two halves of 128 in the CUDA cache): each KV head's kept tokens
    keep both halves together."""
    _check_evicted_prompt(llama_hd256(dev), dev, "bf16,sink=4,evict=snapkv:0.5,recent=8,obs=8")


def llama_hd256(dev):
    """A tiny random Llama of head_dim 256 (4 query heads over 2 KV heads), float32, on dev's device."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=256, vocab_size=1024, max_position_embeddings=512,
                      rope_theta=10000.0, attn_implementation="sdpa")
    torch.manual_seed(256)
    with torch.device("cuda" if dev == "cuda" else "cpu"):
        return LlamaForCausalLM(cfg).float().eval()


def _check_evicted_prompt(model, dev, spec):
    import e8kv.evict as ev
    import e8kv.hf
    arg = e8kv.hf.cache_arg(model)
    g = torch.Generator().manual_seed(21)
    ids = torch.randint(0, 1024, (2, 100), generator=g).to(model.device)
    steps = torch.randint(0, 1024, (2, 6), generator=g).to(model.device)
    cache = e8kv.hf.E8KVCudaCache(model.config, spec, device=dev, max_batch_size=2, max_cache_len=128)
    cfg, _ = ev.parse(spec)
    got = []
    with torch.no_grad():
        got.append(model(input_ids=ids, **{arg: cache}, use_cache=True).logits[:, -1].float())
        m = cfg.kept(100, cache.sink, cache.block_size)
        assert m < 100 and int(cache.get_seq_length()) == 100 and cache._pad_host[:2] == [100 - m] * 2
        for layer in range(model.config.num_hidden_layers):
            for row in cache.kept[layer]:
                assert row.shape == (model.config.num_key_value_heads, m)
                assert row[:, :max(cache.sink, 1)].eq(torch.arange(max(cache.sink, 1), device=row.device)).all()
                assert row[:, -cfg.recent:].eq(torch.arange(100 - cfg.recent, 100, device=row.device)).all()
        for i in range(steps.shape[1]):
            got.append(model(input_ids=steps[:, i:i + 1], **{arg: cache}, use_cache=True).logits[:, -1].float())
    cache.detach(model.config)
    cache.check()
    got = torch.stack(got)
    want = _evicting_reference(model, ids, cache.kept, steps)
    from transformers import DynamicCache
    ctl_cache = DynamicCache(config=model.config)  # the control: nothing evicted
    with torch.no_grad():
        full = model(input_ids=ids, **{arg: ctl_cache}, use_cache=True).logits[:, -1].float()
        ctl = model(input_ids=steps[:, :1], **{arg: ctl_cache}, use_cache=True).logits[:, -1].float()
    scale = float(want.abs().max())
    err = float((got - want).abs().max())
    err_ctl = float((ctl - want[1]).abs().max())
    print(f"{spec} on {dev}: kept {m} of 100; max |logit diff| vs DynamicCache of the kept K/V {err:.3g}, "
          f"vs the full prompt (control) {err_ctl:.3g} (max |logit| {scale:.3g})")
    assert torch.isfinite(got).all() and float((got[0] - full).abs().max()) <= 5e-3 * scale
    assert err <= 5e-3 * scale, (err, scale)
    assert err_ctl > 10 * max(err, 1e-4 * scale), (err_ctl, err)


@pytest.mark.parametrize("side", ["left", "right"])
def test_evicting_padded_batch_equals_each_row_alone(dev, side):
    """Prompts of 70, 45 and 30 tokens padded to 70, with evict=snapkv: each row is scored and evicted over
    its own tokens (pads are never candidates), so its logits over the prompt, single tokens, a 4-token chunk
    and a 20-token chunk (gathered pages) equal those of the row alone in an evicting cache of its own."""
    import e8kv.hf
    spec = "e8box:4,sink=2,evict=snapkv:0.6,recent=8,obs=8"
    model = model_on(dev)
    g = torch.Generator().manual_seed(12)
    on = "cuda" if dev == "cuda" else "cpu"
    lens = (70, 45, 30)
    prompts = [torch.randint(0, 1024, (n,), generator=g).to(on) for n in lens]
    blocks = [torch.randint(0, 1024, (3, n), generator=g).to(on) for n in [1, 1, 1, 4, 20, 1, 1]]
    alone, kept = [], []
    for i, p in enumerate(prompts):
        c = gpu_cache(model, spec, 1, dev=dev)
        alone.append(run_padded(model, c, [p], [blk[i:i + 1] for blk in blocks], "left")[0])
        kept.append([c.kept[layer][0].cpu() for layer in range(len(c.kept))])
        c.detach(model.config)
        c.check()
    alone = torch.stack(alone)
    cache = gpu_cache(model, spec, 3, dev=dev)
    got = run_padded(model, cache, prompts, blocks, side)
    cache.detach(model.config)
    cache.check()
    for i, n in enumerate(lens):
        off = 70 - n if side == "left" else 0
        for layer in range(len(cache.kept)):
            assert torch.equal(cache.kept[layer][i].cpu() - off, kept[i][layer]), (i, layer)
    scale = float(alone.abs().max())
    err = float((got - alone).abs().max())
    print(f"evicting padded batch ({side}) on {dev}: kept {[k[0].shape[1] for k in kept]} of {list(lens)}; "
          f"max |logit diff| vs each row alone {err:.3g} (max |logit| {scale:.3g})")
    assert err <= 5e-3 * scale, (err, scale)


def test_eviction_errors(dev):
    """Bad eviction items are SPEC errors; a prompt whose kept tokens exceed max_cache_len is CONTEXT_FULL
    before anything is stored, while a prompt longer than the cache that evicts down into it is taken; crop
    into an evicted prompt and prompt_from_codes with evict= are refused; so is a bad scorer on the CPU."""
    import e8kv.hf
    model = model_on(dev)
    arg = e8kv.hf.cache_arg(model)
    for bad in ["e8box:4,evict=snapkv:1.5", "e8box:4,evict=nope:0.5", "e8box:4,recent=8", "e8box:4,budget=64",
                "e8box:4,evict0-1=0.5,evict=snapkv:0.5", "e8box:4,evict=snapkv:0.5,obs=0"]:
        with pytest.raises(e8kv.E8KVError) as e:
            e8kv.hf.E8KVCudaCache(model.config, bad, device=dev, max_cache_len=64)
        assert e.value.code == e8kv.ErrorCode.SPEC, bad
    with pytest.raises(e8kv.E8KVError) as e:  # the CPU cache: the C library's spec parser says it
        e8kv.hf.E8KVCache(model.config, "e8:4,evict=nope:0.5")
    assert e.value.code == e8kv.ErrorCode.SPEC
    with pytest.raises(e8kv.E8KVError):
        e8kv.hf.E8KVCudaCache(model.config, "e8box:4,evict=snapkv:0.5", device=dev, prompt_from_codes=True)
    ids = torch.randint(0, 1024, (1, 96), generator=torch.Generator().manual_seed(3)).to(model.device)
    cache = e8kv.hf.E8KVCudaCache(model.config, "e8box:4,evict=snapkv:0.5,recent=8", device=dev, max_cache_len=32)
    with pytest.raises(e8kv.E8KVError) as e, torch.no_grad():
        model(input_ids=ids, **{arg: cache}, use_cache=True)
    assert e.value.code == e8kv.ErrorCode.CONTEXT_FULL
    assert all(s is None for s in cache._stash) and not int(cache.get_seq_length())
    cache.detach(model.config)
    cache = e8kv.hf.E8KVCudaCache(model.config, "e8box:4,evict=snapkv:0.6,recent=8", device=dev, max_cache_len=64)
    with torch.no_grad():  # 96 tokens, 48 kept (3 pages) in a cache of 64: then 16 more fit
        model(input_ids=ids, **{arg: cache}, use_cache=True)
        model(input_ids=ids[:, :16], **{arg: cache}, use_cache=True)
    assert int(cache.get_seq_length()) == 112 and cache._pad_host[0] == 48
    with pytest.raises(NotImplementedError):
        cache.crop(-22)  # to 90: inside the 96-token prompt
    cache.crop(-12)  # to 100: after it
    cache.detach(model.config)
    cache.check()


def test_evict_items_are_read_by_the_c_grammar():
    """e8kv.evict.parse reads a spec's eviction items with the C library's parser (e8kv_cache_spec_evict), so
    the transformers caches take what e8kv_cache_create takes: the items and their defaults, the rest of
    the spec in order (a codec's own '=' options kept), and the same refusals."""
    import e8kv.evict as ev
    cfg, rest = ev.parse("k=e8box:4,v=bf16,sink=4,evict=snapkv:0.62,layers0-1=bf16,recent=8,budget=4096")
    assert rest == "k=e8box:4,v=bf16,sink=4,layers0-1=bf16"
    assert (cfg.scorer, cfg.recent, cfg.obs, cfg.budget) == ("snapkv", 8, ev.DEFAULT_OBS, 4096)
    assert cfg.frac == float(np.float32(0.62))  # the C cache's float fraction, so kept() counts as it does
    assert ev.parse("e8nest:4:q=38,sink=1") == (None, "e8nest:4:q=38,sink=1")
    cfg, rest = ev.parse("e8box:4,evict=h2o:0.5,obs=16")
    assert rest == "e8box:4" and (cfg.scorer, cfg.recent, cfg.obs, cfg.budget) == ("h2o", 32, 16, 0)
    for bad in ["e8box:4,budget=64", "e8box:4,obs=8", "e8box:4,evict=keykey:1", "e8box:4,evict=snapkv:0.5,evict1=0.2"]:
        with pytest.raises(e8kv.E8KVError) as e:
            ev.parse(bad)
        assert e.value.code == e8kv.ErrorCode.SPEC, bad
        if "evict1=" in bad:  # per-layer fractions: the C cache's own, refused by the transformers caches only
            assert e8kv.Cache(2, 1, 64, 64, "e8:4,evict=snapkv:0.5,evict1=0.2").n_bytes > 0
            continue
        with pytest.raises(e8kv.E8KVError) as e:  # the C cache refuses the same
            e8kv.Cache(2, 1, 64, 64, bad.replace("e8box:4", "e8:4"))
        assert e.value.code == e8kv.ErrorCode.SPEC, bad


def _budget_reference(model, ids, kept, steps, hold, keep0, bs=16):
    """DynamicCache after the prompt ids (b, t) holding kept[layer][row] (None: every token), then the tokens
    steps (b, n) one by one at their true positions, with budget='s rule applied before each: a cache that
    would pass `hold` tokens drops its oldest whole pages of `bs` tokens after the first `keep0` tokens, as
    few as make room (what E8KVCudaCache._make_room does to its block tables). Logits of every call, and how
    many tokens each call's cache held."""
    from transformers import DynamicCache
    import e8kv.hf
    arg = e8kv.hf.cache_arg(model)
    model.config._attn_implementation = "sdpa"
    ref = DynamicCache(config=model.config)
    b, t = ids.shape
    held = []
    with torch.no_grad():
        out = [model(input_ids=ids, **{arg: ref}, use_cache=True).logits[:, -1].float()]
        if kept is not None:
            for layer, lay in enumerate(ref.layers):
                idx = torch.stack(kept[layer]).to(lay.keys.device)  # (b, H, m)
                at = idx[..., None].expand(-1, -1, -1, lay.keys.shape[-1])
                lay.keys, lay.values = torch.gather(lay.keys, 2, at), torch.gather(lay.values, 2, at)
        held.append(ref.layers[0].keys.shape[2])
        for i in range(steps.shape[1]):
            n = ref.layers[0].keys.shape[2]
            if n + 1 > hold:
                k = min(-(-(n + 1 - hold) // bs), n // bs - keep0 // bs)
                for lay in ref.layers:
                    cut = lambda x: torch.cat((x[:, :, :keep0], x[:, :, keep0 + k * bs:]), dim=2)  # noqa: E731
                    lay.keys, lay.values = cut(lay.keys), cut(lay.values)
            pos = torch.full((b, 1), t + i, device=ids.device)
            out.append(model(input_ids=steps[:, i:i + 1], position_ids=pos, **{arg: ref},
                             use_cache=True).logits[:, -1].float())
            held.append(ref.layers[0].keys.shape[2])
    return torch.stack(out), held


@pytest.mark.parametrize("spec,t,hd", [("bf16,sink=2,evict=stream:0,budget=32,recent=8", 40, 0),
                                       ("bf16,evict=snapkv:0.2,budget=32,recent=8", 100, 0),
                                       ("bf16,evict=snapkv:0.2,budget=32,recent=8", 100, 256)])
def test_budget_drops_the_oldest_pages(dev, spec, t, hd):
    """budget=32 (16-token pages: a row holds at most 48 tokens): a prompt of t tokens (100: more than the
    budget, so it keeps 32 by snapkv) and 50 decode steps into a cache of 64 tokens per row. Before a step
    would take a row past 48 its oldest page after the first is dropped (the block table turned, no K/V
    moved): every step's logits equal those of a DynamicCache that drops the same tokens at the same steps
    (bf16 pages: within bf16 tolerance), positions keep counting (get_seq_length = t + 50), what the cache
    holds never passes 48, and the control (nothing dropped) differs. hd 256: a model of head_dim 256 (two
    halves of 128 per head in the CUDA cache)."""
    import e8kv.evict as ev
    import e8kv.hf
    model = llama_hd256(dev) if hd == 256 else model_on(dev)
    arg = e8kv.hf.cache_arg(model)
    g = torch.Generator().manual_seed(31)
    ids = torch.randint(0, 1024, (2, t), generator=g).to(model.device)
    steps = torch.randint(0, 1024, (2, 50), generator=g).to(model.device)
    cache = e8kv.hf.E8KVCudaCache(model.config, spec, device=dev, max_batch_size=2, max_cache_len=64)
    cfg, _ = ev.parse(spec)
    assert cache._hold == cfg.hold(cache.sink, 16) == 48 and cache.capacity == 64
    got, held = [], []
    with torch.no_grad():
        got.append(model(input_ids=ids, **{arg: cache}, use_cache=True).logits[:, -1].float())
        held.append(t - cache._pad_host[0])
        for i in range(steps.shape[1]):
            got.append(model(input_ids=steps[:, i:i + 1], **{arg: cache}, use_cache=True).logits[:, -1].float())
            held.append(t + i + 1 - cache._pad_host[0])
    cache.detach(model.config)
    cache.check()
    got = torch.stack(got)
    want, want_held = _budget_reference(model, ids, cache.kept if t > 48 else None, steps, 48, 16)
    assert held == want_held and max(held) == 48 and min(held[1:]) == 33, held
    assert int(cache.get_seq_length()) == t + 50 and cache._budget_dropped[:2] == [cache._budget_dropped[0]] * 2
    assert cache._budget_dropped[0] > 0
    ctl, _ = _budget_reference(model, ids, cache.kept if t > 48 else None, steps, 10 ** 6, 16)
    scale = float(want.abs().max())
    err = float((got - want).abs().max())
    err_ctl = float((ctl - want).abs().max())
    print(f"{spec} on {dev}: held {held[0]} .. {max(held)}, dropped {cache._budget_dropped[0]}; max |logit diff| "
          f"vs DynamicCache dropping the same pages {err:.3g}, vs nothing dropped (control) {err_ctl:.3g} "
          f"(max |logit| {scale:.3g})")
    assert err <= 5e-3 * scale, (err, scale)
    assert err_ctl > 10 * max(err, 1e-4 * scale), (err_ctl, err)


@pytest.mark.parametrize("side", ["left", "right"])
def test_budget_padded_batch_equals_each_row_alone(dev, side):
    """Prompts of 40, 30 and 12 tokens padded to 40, then 36 single tokens, a 4-token chunk and 4 more, into a
    cache of budget=32 (a row holds at most 48): each row drops its pages when its own tokens pass 48 (at other
    steps than its neighbours), and its logits equal those of the row alone in a budget cache of its own."""
    import e8kv.hf
    model = model_on(dev)
    spec = "bf16,sink=2,evict=stream:0,budget=32,recent=4"
    g = torch.Generator().manual_seed(17)
    on = "cuda" if dev == "cuda" else "cpu"
    prompts = [torch.randint(0, 1024, (n,), generator=g).to(on) for n in (40, 30, 12)]
    blocks = [torch.randint(0, 1024, (3, n), generator=g).to(on) for n in [1] * 36 + [4] + [1] * 4]
    alone = []
    for i, p in enumerate(prompts):
        c = gpu_cache(model, spec, 1, cap=64, dev=dev)
        alone.append(run_padded(model, c, [p], [blk[i:i + 1] for blk in blocks], "left")[0])
        c.detach(model.config)
        c.check()
    alone = torch.stack(alone)
    cache = gpu_cache(model, spec, 3, cap=64, dev=dev)
    got = run_padded(model, cache, prompts, blocks, side)
    cache.detach(model.config)
    cache.check()
    cache._sync_pads()
    dropped = cache._budget_dropped[:3]
    assert dropped == [48, 32, 16], dropped  # 84, 74 and 56 tokens, held 48 at most
    scale = float(alone.abs().max())
    err = float((got - alone).abs().max())
    print(f"budget, padded ({side}) on {dev}: dropped {dropped}; max |logit diff| vs each row alone {err:.3g} "
          f"(max |logit| {scale:.3g})")
    assert err <= 5e-3 * scale, (err, scale)


def test_budget_limits_and_errors(dev):
    """budget= needs evict=; compress() sizes a generate()'s cache to what budget= lets a row hold; beam
    search, crop after a drop and a chunk too large to fit beside the kept pages are refused by name, and
    reset gives the rows their own tables back."""
    import e8kv.hf
    model = model_on(dev)
    arg = e8kv.hf.cache_arg(model)
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.hf.E8KVCudaCache(model.config, "bf16,budget=64", device=dev, max_cache_len=128)
    assert e.value.code == e8kv.ErrorCode.SPEC
    for bad in ["bf16,evict=stream:0,budget=-1", "bf16,evict=stream:0,budget=x"]:
        with pytest.raises(e8kv.E8KVError) as e:
            e8kv.hf.E8KVCudaCache(model.config, bad, device=dev, max_cache_len=128)
        assert e.value.code == e8kv.ErrorCode.SPEC, bad
    none = e8kv.hf.E8KVCudaCache(model.config, "bf16,evict=stream:0,budget=0", device=dev, max_cache_len=128)
    assert none._hold == 0  # budget=0: no budget, as in the C cache
    none.detach(model.config)
    small = e8kv.hf.E8KVCudaCache(model.config, "bf16,evict=stream:0,budget=512", device=dev, max_cache_len=32)
    assert small._hold == 0  # no page to drop before it is full: it never drops
    small.detach(model.config)
    cache = e8kv.hf.E8KVCudaCache(model.config, "bf16,evict=stream:0,budget=32,recent=8", device=dev, max_batch_size=2,
                                  max_cache_len=64)
    ids = torch.randint(0, 1024, (2, 40), generator=torch.Generator().manual_seed(5)).to(model.device)
    with torch.no_grad():
        model(input_ids=ids, **{arg: cache}, use_cache=True)
        with pytest.raises(e8kv.E8KVError) as e:  # 17 > 48 - 2 pages
            model(input_ids=ids[:, :17], **{arg: cache}, use_cache=True)
        assert e.value.code == e8kv.ErrorCode.CONTEXT_FULL
        model(input_ids=ids[:, :1], **{arg: cache}, use_cache=True)
        cache.crop(-1)  # nothing dropped yet: allowed
        for i in range(12):
            model(input_ids=ids[:, i:i + 1], **{arg: cache}, use_cache=True)
    assert cache._budget_dropped[:2] == [16, 16] and int(cache.get_seq_length()) == 52
    with pytest.raises(NotImplementedError):
        cache.crop(-1)
    with pytest.raises(NotImplementedError):
        cache.reorder_cache(torch.tensor([1, 0], device=model.device))
    cache.reset()
    assert cache._budget_dropped[:2] == [0, 0]
    assert cache._tables.cpu().eq(torch.arange(8, dtype=torch.int32).view(2, 4)).all()
    cache.detach(model.config)
    if dev == "cuda":  # compress(): a generate of 40 + 100 tokens gets 48 per row
        sizes = []
        orig = e8kv.hf.E8KVCudaCache.__init__

        def spy(self, *a, **kw):
            sizes.append(kw.get("max_cache_len"))
            orig(self, *a, **kw)
        e8kv.hf.E8KVCudaCache.__init__ = spy
        try:
            with e8kv.hf.compress(model, "bf16,evict=stream:0,budget=32,recent=8"), torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=100,
                                     min_new_tokens=100, do_sample=False)
        finally:
            e8kv.hf.E8KVCudaCache.__init__ = orig
        assert out.shape == (2, 140) and sizes[-1] == 48, sizes


@needs_gpu
def test_budget_compiled_equals_eager():
    """The pages a budget= cache drops are chosen on the device: compiled steps (CUDA graphs, as generate()
    compiles them) drop the same ones as eager steps, so their logits agree; the host learns of it when it
    next looks (crop refused, _budget_dropped)."""
    model = tiny_llama(torch.bfloat16)
    prompt = prompt_ids(2, 40)
    _, toks = reference(model, prompt, 60)
    spec = "e8box:4,sink=4,evict=stream:0,budget=32,recent=8"
    eager_cache, cache, err, scale, skips = compiled_and_eager(model, spec, prompt, toks)
    with pytest.raises(NotImplementedError):
        cache.crop(-1)
    print(f"{spec}: 40 + 60 tokens, dropped {eager_cache._budget_dropped[0]} (eager) / "
          f"{cache._budget_dropped[0]} (compiled); compiled vs eager max |logit diff| {err:.3g} "
          f"(max |logit| {scale:.3g}), cudagraph skips {skips}")
    assert skips == 0 and eager_cache._budget_dropped[:2] == cache._budget_dropped[:2] == [64, 64]
    assert err <= 2e-2 * scale, (err, scale)


def test_perplexity_prefix_mode(dev):
    """perplexity(prefix=P, score=S), the protocol of eviction: each chunk's prefix is the prompt (exact
    attention, then evicted and coded), then the S tokens in one forward over the compressed prefix, S - 1
    logits scored. bf16 pages keep every token (kept = P) and stay near the baseline; evict=snapkv:0.5 keeps
    what kept() says, halves what the cache holds for the prefix (compression) and costs KLD."""
    import e8kv.hf
    model = model_on(dev)
    ids = torch.randint(0, 1024, (400,), generator=torch.Generator().manual_seed(8)).tolist()
    specs = ["bf16", "bf16,evict=snapkv:0.5,recent=8"]
    if dev == "cuda":
        r = e8kv.hf.perplexity(model, ids, specs, prefix=96, score=32, n_chunks=2)
    else:
        r = e8kv.hf._perplexity_cuda(model, ids, specs, dev, n_ctx=0, n_chunks=2, add_bos=False, bos_id=1, seed=0,
                                     progress=False, desc="", prefix=96, score=32)
    print({k: {f: round(v, 5) for f, v in x.items()} for k, x in r.items()})
    assert r["dynamic"]["count"] == r["bf16"]["count"] == 2 * 31
    assert r["bf16"]["kept"] == 96 and r[specs[1]]["kept"] == 48
    assert r["bf16"]["kld"] < 1e-3 < r[specs[1]]["kld"]
    if dev == "cuda":  # (the twin holds no bytes)
        assert 0.95 < r["bf16"]["compression"] <= 1.0
        assert 1.9 < r[specs[1]]["compression"] <= 2.0
    if dev != "cuda":  # the CPU cache (E8KVCache, baseline f32): its own eviction, its allocated bytes
        cpu = ["e8:4", "e8:4,evict=snapkv:0.5,recent=8"]
        r = e8kv.hf.perplexity(model, ids, cpu, prefix=96, score=32, n_chunks=2, device="cpu")
        print({k: {f: round(v, 5) for f, v in x.items()} for k, x in r.items()})
        assert r["f32"]["kept"] == r["e8:4"]["kept"] == 96 and r[cpu[1]]["kept"] == 64  # (pages of 64)
        assert r["e8:4"]["compression"] < r[cpu[1]]["compression"] and r["e8:4"]["kld"] < r[cpu[1]]["kld"]
        with pytest.raises(e8kv.E8KVError):
            e8kv.hf.perplexity(model, ids, ["e8:4"], prefix=1, score=32, n_chunks=1, device="cpu")


def test_generate_with_eviction(dev):
    """generate() from an 80-token prompt into an evicting cache of 64 tokens (the prompt is longer than the
    cache; what it keeps fits): each new token's logits equal those of a DynamicCache holding exactly the kept
    K/V, stepped with the same tokens at their true positions (bf16 pages: within bf16 tolerance)."""
    import e8kv.hf
    model = model_on(dev)
    arg = e8kv.hf.cache_arg(model)
    ids = torch.randint(0, 1024, (2, 80), generator=torch.Generator().manual_seed(13)).to(model.device)
    cache = e8kv.hf.E8KVCudaCache(model.config, "bf16,sink=2,evict=snapkv:0.6,recent=8", device=dev,
                                  max_batch_size=2, max_cache_len=64)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **{arg: cache}, max_new_tokens=8,
                             min_new_tokens=8, do_sample=False, return_dict_in_generate=True, output_logits=True)
    cache.detach(model.config)
    cache.check()
    new = out.sequences[:, 80:]
    assert new.shape == (2, 8) and cache._pad_host[:2] == [80 - 32] * 2  # 80 - 48 = 32 kept (2 pages)
    got = torch.stack([lg.float() for lg in out.logits])
    want = _evicting_reference(model, ids, cache.kept, new[:, :-1])
    scale = float(want.abs().max())
    err = float((got - want).abs().max())
    print(f"generate with eviction on {dev}: kept 32 of 80, 8 new tokens; max |logit diff| {err:.3g} (max {scale:.3g})")
    assert err <= 5e-3 * scale, (err, scale)


def test_recall_harness(dev):
    """python -m e8kv.recall (e8kv.recall.run): the keys are those of tools/cmd_recall.c (values printed by
    its formula compiled in C), the prompt holds the needle at its depth between whole fillers and is about
    --ctx tokens, and a run over DynamicCache and an evicting e8kv cache gives one row per (spec, depth), the
    evicting cache keeping fewer tokens than the prompt. (A tiny random model with SmolLM2's vocabulary: this
    checks the harness, not recall; the recall figures are BENCHMARKS.md's.)"""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    import e8kv.recall as rc
    c_keys = [(1, 0, 0, "75377"), (1, 0, 1, "51692"), (1, 1, 0, "74497"), (1, 1, 1, "26823"), (1, 2, 0, "42630"),
              (2, 0, 0, "82033"), (2, 2, 1, "83462")]
    assert all(rc.passkey(s, d, t) == k for s, d, t, k in c_keys)
    assert rc.found(" 75377. Remember", "75377") and not rc.found(" 7537 7", "75377")
    data = os.environ.get("E8KV_SHARED_DATA", os.path.join(ROOT, "data"))
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(data, "smollm2-135m", "tokenizer.json"))
    ids = rc.prompt_ids(tok, 400, 0.5, "75377", 1)
    needle = tok(" The pass key is 75377.", add_special_tokens=False)["input_ids"]
    at = next(i for i in range(len(ids)) if ids[i:i + len(needle)] == needle)
    assert 300 < len(ids) <= 400 and 0.35 < at / len(ids) < 0.65, (len(ids), at)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=1024,  # head_dim 64
                      rope_theta=10000.0, attn_implementation="sdpa", bos_token_id=1, eos_token_id=2)
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg).eval().to("cuda" if dev == "cuda" else "cpu")
    ev = "bf16,evict=snapkv:0.5,recent=8"
    # (on the twin: the CUDA cache's code over PagesTwin, on the CPU)
    rows = list(rc.run(model, tok, ["dynamic", ev], ctx=200, n_depths=2, trials=1, cuda_cache=True, cache_device=dev))
    print("recall rows", rows)
    assert [(r["spec"], r["depth"]) for r in rows] == [("dynamic", 0.0), ("dynamic", 1.0), (ev, 0.0), (ev, 1.0)]
    assert all(r["trials"] == 1 and r["correct"] in (0, 1) for r in rows)
    assert rows[0]["kept"] == rows[0]["prompt_tokens"] and rows[2]["kept"] < rows[2]["prompt_tokens"]
    if dev != "cuda":  # the CPU cache's rows: kept = the prompt's tokens its C cache holds (pages of 64)
        cpu = list(rc.run(model, tok, ["f32,evict=snapkv:0.5,recent=8"], ctx=200, n_depths=1, trials=1,
                          cuda_cache=False))
        assert cpu[0]["kept"] == 128 < cpu[0]["prompt_tokens"] == 184, cpu


@pytest.mark.parametrize("spec", ["f32,evict=snapkv:0.5,recent=8,obs=8", "f32,sink=2,evict=keykey:0.6,recent=8"])
def test_cpu_cache_evicts_through_transformers(spec):
    """The CPU transformers cache (E8KVCache) with evict=: after the prompt's last layer each row's C cache
    evicts (e8kv_cache_evict) with the prompt's queries; the decode steps' logits then equal those of a
    DynamicCache holding the K/V that e8kv.evict.select keeps for the same queries and keys (f32 codes:
    within float tolerance), and the cache holds fewer bytes than without eviction."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import e8kv.evict as ev
    import e8kv.hf
    model = model_on("cpu")
    arg = e8kv.hf.cache_arg(model)
    g = torch.Generator().manual_seed(31)
    ids = torch.randint(0, 1024, (1, 100), generator=g)
    steps = torch.randint(0, 1024, (1, 5), generator=g)
    seen = {}

    def capture(module, query, key, value, attention_mask, **kw):  # the prompt's q and k after RoPE
        seen.setdefault(module.layer_idx, (query.detach().float(), key.detach().float()))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    AttentionInterface.register("e8kv_test_capture", capture)
    model.config._attn_implementation = "e8kv_test_capture"
    with torch.no_grad():
        model(input_ids=ids)
    model.config._attn_implementation = "sdpa"
    cfg, _ = ev.parse(spec)
    sink = 2 if "sink=2" in spec else 0
    cache = e8kv.hf.E8KVCache(model.config, spec)
    plain = e8kv.hf.E8KVCache(model.config, spec.split(",evict")[0])
    got = []
    with torch.no_grad():
        got.append(model(input_ids=ids, **{arg: cache}, use_cache=True).logits[:, -1].float())
        model(input_ids=ids, **{arg: plain}, use_cache=True)
        P = cache.rows[0].page_tokens
        kept = [[ev.select(cfg, seen[layer][0][0], seen[layer][1][0], sink=sink, block=P)]
                for layer in range(model.config.num_hidden_layers)]
        held = (cache.n_bytes, plain.n_bytes)  # after the prompt: 64 kept tokens take one page, 100 two
        assert cache.rows[0].n_kept(0) == kept[0][0].shape[1] < 100 and held[0] < held[1]
        assert int(cache.get_seq_length()) == 100
        for i in range(steps.shape[1]):
            got.append(model(input_ids=steps[:, i:i + 1], **{arg: cache}, use_cache=True).logits[:, -1].float())
    got = torch.stack(got)
    want = _evicting_reference(model, ids, kept, steps)
    scale = float(want.abs().max())
    err = float((got - want).abs().max())
    print(f"CPU cache {spec}: kept {kept[0][0].shape[1]} of 100 (page {P}); {held[0]} bytes against "
          f"{held[1]}; max |logit diff| vs DynamicCache of the kept K/V {err:.3g} (max |logit| {scale:.3g})")
    assert err <= 1e-3 * scale, (err, scale)


# ------------------------------------------------------------------------------------------ hybrid models
def hybrid_model(kind, on="cpu", window=8, dtype=torch.float32):
    """A tiny random model with full-attention and sliding-window layers (head_dim 64): "qwen2" (layers 0-1
    full, 2-3 sliding: use_sliding_window with max_window_layers 2), "gemma3" (Gemma3 text: sliding, full,
    sliding, full; its own query scaling and one RoPE per layer type) or "exaone4" (EXAONE 4: sliding, full,
    sliding, full; every attention module keeps the window, the full layers pass none and skip RoPE)."""
    from transformers import (Exaone4Config, Exaone4ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, Qwen2Config,
                              Qwen2ForCausalLM)
    common = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, sliding_window=window)
    if kind == "qwen2":
        cfg, cls = Qwen2Config(use_sliding_window=True, max_window_layers=2, **common), Qwen2ForCausalLM
    elif kind == "exaone4":  # its attention modules all hold the window; its full layers have no RoPE (NoPE)
        cfg, cls = Exaone4Config(sliding_window_pattern=2, **common), Exaone4ForCausalLM
    else:
        cfg = Gemma3TextConfig(head_dim=64, query_pre_attn_scalar=48, layer_types=[
            "sliding_attention", "full_attention", "sliding_attention", "full_attention"], **common)
        cls = Gemma3ForCausalLM
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(4321)
    with torch.device("cuda" if on == "cuda" else "cpu"):
        model = cls(cfg).to(dtype).eval()
    return model


def _generate_as_dynamic(model, prompt):
    """generate() of a left-padded batch and beam search under e8kv.hf.compress(model, "f32") give the tokens
    of transformers' own cache."""
    import e8kv.hf
    model.generation_config.pad_token_id = 0
    ids, mask = prompt.clone(), torch.ones_like(prompt)
    ids[0, :6], mask[0, :6] = 0, 0
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
        refb = model.generate(input_ids=prompt[1:], max_new_tokens=8, num_beams=3, do_sample=False)
        with e8kv.hf.compress(model, "f32"):
            got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
            gotb = model.generate(input_ids=prompt[1:], max_new_tokens=8, num_beams=3, do_sample=False)
    assert torch.equal(ref, got) and torch.equal(refb, gotb)


def _steps_then_chunks(model, cache, prompt, tokens, n_steps, chunks):
    """run_steps over the first n_steps columns of `tokens`, then each (a, b) slice of them as one chunk: the
    last logits of every call; an e8kv CUDA cache is detached and checked after."""
    out = run_steps(model, cache, prompt, tokens[:, :n_steps])
    with torch.no_grad():
        for a, b in chunks:
            out = torch.cat((out, model(input_ids=tokens[:, a:b], past_key_values=cache,
                                        use_cache=True).logits[:, -1].float()[None]))
    if hasattr(cache, "detach"):
        cache.detach(model.config)
        cache.check()
    return out


def _padded_row_as_alone(model, prompt, steps, dev):
    """Row 0 of `prompt` left-padded by 6 in a 2-row e8box:4 CUDA cache (each row's tokens at its own positions,
    as generate() gives them), then 4 steps, against the row alone in a cache of its own: the largest |logit
    difference|."""
    ids, mask = prompt.clone(), torch.ones_like(prompt)
    ids[0, :6], mask[0, :6] = 0, 0
    both = gpu_cache(model, "e8box:4", 2, dev=dev)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        a = [model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=both,
                   use_cache=True).logits[:, -1].float()]
        for i in range(4):
            mask, pos = torch.cat((mask, torch.ones_like(mask[:, :1])), 1), pos[:, -1:] + 1
            a.append(model(input_ids=steps[:, i:i + 1], attention_mask=mask, position_ids=pos, past_key_values=both,
                           use_cache=True).logits[:, -1].float())
        both.detach(model.config)
        alone = gpu_cache(model, "e8box:4", 1, dev=dev)
        b = [model(input_ids=prompt[:1, 6:], past_key_values=alone, use_cache=True).logits[:, -1].float()]
        for i in range(4):
            b.append(model(input_ids=steps[:1, i:i + 1], past_key_values=alone, use_cache=True).logits[:, -1].float())
        alone.detach(model.config)
    return float((torch.stack(a)[:, 0] - torch.stack(b)[:, 0]).abs().max())


def _hybrid_inputs(on, t=20, n=14, seed=5):
    g = torch.Generator().manual_seed(seed)
    dev = "cuda" if on == "cuda" else "cpu"
    return torch.randint(0, 1024, (2, t), generator=g).to(dev), torch.randint(0, 1024, (2, n), generator=g).to(dev)


@pytest.mark.parametrize("kind", ["qwen2", "gemma3", "exaone4"])
def test_hybrid_model_cpu_cache(kind):
    """CPU cache on a model with sliding-window layers: the full-attention layers are coded, the sliding ones
    keep transformers' own window; f32 codes give DynamicCache's logits, e8:4 near them; a window the
    reference does not apply (the control) gives other logits; padded generate and beam search as
    DynamicCache; the sliding layers' bytes are counted."""
    import e8kv.hf
    from transformers import DynamicCache
    model = hybrid_model(kind)
    prompt, steps = _hybrid_inputs("cpu")
    s = e8kv.hf.ModelShape(model.config)
    assert s.n_layer == 2 and len(s.coded_layers) == 2 and s.sliding_window == 8
    want = run_steps(model, DynamicCache(config=model.config), prompt, steps)
    wide = hybrid_model(kind, window=4096)
    control = float((run_steps(wide, DynamicCache(config=wide.config), prompt, steps) - want).abs().max())
    scale = float(want.abs().max())
    errs = {}
    for spec in ("f32", "e8:4,sink=1"):
        cache = e8kv.hf.E8KVCache(model.config, spec)
        got = run_steps(model, cache, prompt, steps)
        errs[spec] = float((got - want).abs().max())
        kinds = [type(x).__name__ for x in cache.layers]
        assert kinds.count("E8KVLayer") == 2, kinds
        held = sum(t.numel() * t.element_size() for x in cache.layers if x.is_sliding for t in (x.keys, x.values))
        assert all(x.keys.shape[2] <= 8 for x in cache.layers if x.is_sliding)
        assert cache.n_bytes == sum(r.n_bytes for r in cache.rows) + held
        assert int(cache.get_seq_length()) == prompt.shape[1] + steps.shape[1]
        with pytest.raises(NotImplementedError):
            cache.save("/nonexistent/never-written.e8kc")
        model.config._attn_implementation = "sdpa"
    print(f"{kind}: max |logit diff| vs DynamicCache: f32 {errs['f32']:.3g}, e8:4,sink=1 {errs['e8:4,sink=1']:.3g}; "
          f"without the window {control:.3g} (max |logit| {scale:.3g})")
    assert errs["f32"] <= 1e-5 * scale and control > 1e-2 * scale and errs["e8:4,sink=1"] < control
    _generate_as_dynamic(model, prompt)


@pytest.mark.parametrize("kind", ["qwen2", "gemma3", "exaone4"])
def test_hybrid_model_cuda_cache(dev, kind):
    """The CUDA cache (and its CPU twin) on a model with sliding-window layers: bf16 pages for the full
    layers, transformers' static sliding layers beside them: logits as DynamicCache's within bf16's
    rounding, the window applied (control as above), its bytes counted; a padded batch row by row equals
    each row alone."""
    import e8kv.hf
    from transformers import DynamicCache, StaticSlidingWindowLayer
    on = "cuda" if dev == "cuda" else "cpu"
    model = hybrid_model(kind, on)
    prompt, steps = _hybrid_inputs(on)
    want = run_steps(model, DynamicCache(config=model.config), prompt, steps)
    wide = hybrid_model(kind, on, window=4096)
    control = float((run_steps(wide, DynamicCache(config=wide.config), prompt, steps) - want).abs().max())
    cache = gpu_cache(model, "bf16", 2, dev=dev)
    assert sum(isinstance(x, StaticSlidingWindowLayer) for x in cache.layers) == 2
    got = run_steps(model, cache, prompt, steps)
    cache.detach(model.config)
    scale, err = float(want.abs().max()), float((got - want).abs().max())
    held = sum(x.keys.numel() * x.keys.element_size() * 2 for x in cache.layers if x.is_sliding)
    assert held and cache.n_bytes >= cache.kv.device_bytes + held
    print(f"{kind} on {dev}: bf16 pages max |logit diff| vs DynamicCache {err:.3g}, without the window "
          f"{control:.3g} (max |logit| {scale:.3g})")
    assert err <= 1e-2 * scale < control, (err, control, scale)
    # padded batch: each row as alone (its pads never stored in the pages, masked in the sliding layers)
    perr = _padded_row_as_alone(model, prompt, steps, dev)
    print(f"{kind} on {dev}: padded row vs alone max |logit diff| {perr:.3g}")
    assert perr <= 1e-3 * scale, perr


@needs_gpu
def test_hybrid_compiled_equals_eager():
    # an f32 model: in bf16 the compiled graph's own rounding (Gemma 3's norms) moves e8box:4 codes
    model = hybrid_model("gemma3", "cuda", dtype=torch.float32)
    prompt, steps = _hybrid_inputs("cuda", t=10, n=12)
    _, _, err, scale, skips = compiled_and_eager(model, "e8box:4,sink=2", prompt, steps)
    print(f"gemma3 hybrid e8box:4,sink=2: compiled vs eager max |logit diff| {err:.3g} (max |logit| {scale:.3g}), "
          f"cudagraph skips {skips}")
    assert skips == 0
    assert err <= 2e-2 * scale, (err, scale)


def test_calibrated_specs_without_a_calibration_say_so():
    """A spec that needs a calibration (e8tv, auto=, an evict-* preset made of them) without one: SPEC, and
    the message says a calibration is missing."""
    import e8kv.hf
    model = hybrid_model("qwen2")
    for spec in ("e8tv:4", "auto=e8tv:3,sink=1", "evict-high", "evict-safe,recent=16"):
        with pytest.raises(e8kv.E8KVError) as e:
            e8kv.hf.E8KVCache(model.config, spec)
        assert e.value.code == e8kv.ErrorCode.SPEC and "need a calibration" in str(e.value), (spec, str(e.value))
        assert model.config._attn_implementation == "sdpa"  # the refused cache left the model as it was


def test_unsupported_layer_kinds_are_named():
    import e8kv.hf
    from transformers import Gemma2Config, MistralConfig, Qwen2Config
    common = dict(vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1)
    cases = {"every layer is sliding": MistralConfig(sliding_window=64, **common),
             "soft-capping": Gemma2Config(head_dim=64, **common),
             "chunked": Qwen2Config(layer_types=["full_attention", "chunked_attention"], **common)}
    for why, cfg in cases.items():
        with pytest.raises(e8kv.hf.UnsupportedModelError, match=why):
            e8kv.hf.ModelShape(cfg)


@torch.no_grad()
def _steps(model, cache, ids, a, b):
    """Logits of ids[:, a:b] through the cache: the prompt in one forward when a is 0, then one token each."""
    out = []
    if a == 0:
        out.append(model(input_ids=ids[:, :PROMPT_T], past_key_values=cache, use_cache=True).logits.float())
        a = PROMPT_T
    for i in range(a, b):
        out.append(model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits.float())
    return torch.cat(out, 1)


PROMPT_T = 20


def _reuse_checks(model, make, ids, tol):
    """Several e8kv caches of one model used in any order, a DynamicCache after them, a cache after its
    model was routed elsewhere, copy.deepcopy of a prompt's cache (transformers' recipe for reusing a
    prompt) and a pickled one (torch.save / torch.load): every forward's logits are those of the cache's own
    sequence."""
    import copy
    import io
    import e8kv.hf
    from transformers import DynamicCache
    n = ids.shape[1]
    ref = _steps(model, DynamicCache(config=model.config), ids, 0, n)
    rel = lambda x, y: float((x - y).abs().max() / y.abs().max())  # noqa: E731
    alone = _steps(model, make(), ids, 0, n)  # one cache, nothing else: the figure the others must repeat
    assert rel(alone, ref) < tol, rel(alone, ref)
    a, b = make(), make()  # b made (and attached) after a
    pa, pb = _steps(model, a, ids, 0, PROMPT_T), _steps(model, b, ids, 0, PROMPT_T)
    steps_a, steps_b = [], []
    for i in range(PROMPT_T, n - 2):  # a and b in turn
        steps_a.append(_steps(model, a, ids, i, i + 1))
        steps_b.append(_steps(model, b, ids, i, i + 1))
    for got in (torch.cat([pa] + steps_a, 1), torch.cat([pb] + steps_b, 1)):
        assert torch.equal(got, alone[:, :n - 2]), rel(got, alone[:, :n - 2])
    # a DynamicCache after them (no detach): the model's own attention, its own mask
    assert torch.equal(_steps(model, DynamicCache(config=model.config), ids, 0, n), ref)
    # a copy of a: both go on from the same past and then apart, neither disturbs the other
    c = copy.deepcopy(a)
    assert c.get_seq_length() == a.get_seq_length() and c.n_bytes == a.n_bytes
    other = ids.clone()
    other[:, n - 2:] = (ids[:, n - 2:] + 1) % model.config.vocab_size
    got_c = _steps(model, c, other, n - 2, n)
    got_a = _steps(model, a, ids, n - 2, n)
    assert torch.equal(got_a, alone[:, n - 2:]), rel(got_a, alone[:, n - 2:])
    fresh = make()  # the sequence the copy went on with, from scratch
    want_c = _steps(model, fresh, other, 0, n)[:, n - 2:]
    assert torch.equal(got_c, want_c), rel(got_c, want_c)
    # pickled (torch.save / torch.load): a forward before attach() is refused and stores nothing, then the
    # loaded cache's next step is its source's
    buf = io.BytesIO()
    torch.save(a, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with pytest.raises(e8kv.E8KVError, match="attach"):
        _steps(model, loaded, ids, n - 1, n)
    assert loaded.get_seq_length() == a.get_seq_length()
    loaded.attach(model.config)
    got_l, got_a = _steps(model, loaded, ids, n - 1, n), _steps(model, a, ids, n - 1, n)
    assert torch.equal(got_l, got_a), rel(got_l, got_a)
    from transformers import LlamaConfig
    with pytest.raises(e8kv.hf.UnsupportedModelError, match="attached to a model"):
        loaded.attach(LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, vocab_size=64))
    # a cache used after the model's attention went back to its own (detach, a compress() block's end)
    d = make()
    pd = _steps(model, d, ids, 0, n - 2)
    model.config._attn_implementation = "sdpa"
    for cfg in (model.config,):
        if getattr(cfg, "_e8kv_cuda_cache", None) is not None:
            cfg._e8kv_cuda_cache.detach(cfg)
    got_d = torch.cat([pd, _steps(model, d, ids, n - 2, n)], 1)
    assert torch.equal(got_d, alone), rel(got_d, alone)


def test_caches_of_one_model_in_any_order(dev):
    """The CUDA cache: several caches of one model in turn, DynamicCache after them, copy.deepcopy, and a
    cache after detach() (each cache's forward attaches it; the attention reads the cache whose update ran)."""
    model = model_on(dev)
    ids = prompt_ids(2, PROMPT_T + 8, dev=dev)
    for spec in ("bf16", "e8box:4,sink=4,center=rope"):
        _reuse_checks(model, lambda: gpu_cache(model, spec, 2, dev=dev), ids, 2e-2 if spec == "bf16" else 1.0)


def test_compiled_steps_of_caches_in_turn(dev):
    """Compiled one-token steps (torch.compile fullgraph; CUDA graphs on a GPU) of two caches and a
    copy.deepcopy of one, in turn with no eager forward between them: each step reads its own cache's pages
    (the step points the config at its cache), the logits of the same steps in eager mode."""
    import copy
    model = model_on(dev)
    on = "cuda" if dev == "cuda" else "cpu"
    ids = prompt_ids(2, PROMPT_T + 6, dev=dev)
    spec = "e8box:4,sink=4,center=rope"

    def run(step):
        a, b = gpu_cache(model, spec, 2, dev=dev), gpu_cache(model, spec, 2, dev=dev)
        _steps(model, a, ids, 0, PROMPT_T)
        _steps(model, b, ids.flip(1), 0, PROMPT_T)  # (another prompt: b's pages differ from a's)
        c = copy.deepcopy(a)
        out = []
        with torch.no_grad():
            for i in range(PROMPT_T, PROMPT_T + 6):
                for cache, x in ((a, ids), (b, ids.flip(1)), (c, ids.flip(0))):
                    out.append(step(input_ids=x[:, i:i + 1], past_key_values=cache, use_cache=True).logits.clone())
        return out

    def compiled(fn):  # fn(step) with fullgraph-compiled steps (CUDA graphs on a GPU), then the eager twin's check
        torch._dynamo.reset()
        out = fn(torch.compile(model.forward, mode="reduce-overhead", fullgraph=True) if on == "cuda" else
                 torch.compile(model.forward, backend="aot_eager", fullgraph=True))
        torch._dynamo.reset()
        return out

    eager = run(model.forward)
    scale = max(float(e.abs().max()) for e in eager)
    err = max(float((c - e).abs().max()) for c, e in zip(compiled(run), eager))
    assert err <= 1e-3 * scale, (err, scale)
    assert float((eager[0] - eager[1]).abs().max()) > 1e-2 * scale  # (the caches' steps do differ)

    # a StaticCache's compiled steps after them (its prompt eager): the model's own attention, not a CUDA cache's
    from transformers import StaticCache

    def static_run(step):
        cache = StaticCache(config=model.config, max_cache_len=64)
        _steps(model, cache, ids, 0, PROMPT_T)
        with torch.no_grad():
            return [step(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits.clone()
                    for i in range(PROMPT_T, PROMPT_T + 6)]

    alone = static_run(model.forward)
    run(model.forward)  # (the e8kv caches again: the config points at one of them)
    err = max(float((c - e).abs().max()) for c, e in zip(compiled(static_run), alone))
    assert err <= 1e-3 * scale, (err, scale)


@needs_gpu
def test_cuda_state_bad_bytes_are_named_errors():
    """CudaCache.state / load_state (e8kv_cuda_cache_export / _import): a changed byte is CHECKSUM, a cut state
    TRUNCATED, a cache of other parameters BAD_ARGUMENT, and the cache that refused them attends as before."""
    import e8kv
    a = e8kv.CudaCache(2, 2, 64, 8, "e8box:4,sink=2", max_seqs=2, max_batch=2)
    slots = torch.arange(20, dtype=torch.int64, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    for layer in range(2):
        k = torch.randn((20, 128), generator=g, device="cuda")
        a.set_means(layer, 0, k, k * 0.5)
        a.append(layer, slots, k, k * 0.5, rows=torch.zeros(20, dtype=torch.int32, device="cuda"),
                 sink_slots=torch.where(slots < 2, slots, -1))
    q = torch.randn((1, 4, 64), generator=g, device="cuda")
    tables = torch.arange(8, dtype=torch.int32, device="cuda").view(1, 8)
    ctx = torch.tensor([20], dtype=torch.int32, device="cuda")
    rows = torch.zeros(1, dtype=torch.int32, device="cuda")
    want = a.attend(1, q, tables, ctx, rows=rows)
    data = a.state([(0, 2)])
    b = e8kv.CudaCache(2, 2, 64, 8, "e8box:4,sink=2", max_seqs=2, max_batch=2, seed=5)
    b.load_state(data)
    assert torch.equal(b.attend(1, q, tables, ctx, rows=rows), want)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 1
    for src, code in ((bytes(bad), e8kv.ErrorCode.CHECKSUM), (data[:-1], e8kv.ErrorCode.TRUNCATED)):
        with pytest.raises(e8kv.E8KVError) as e:
            b.load_state(src)
        assert e.value.code == code
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.CudaCache(2, 2, 64, 9, "e8box:4,sink=2", max_seqs=2, max_batch=2).load_state(data)
    assert e.value.code == e8kv.ErrorCode.BAD_ARGUMENT
    assert torch.equal(b.attend(1, q, tables, ctx, rows=rows), want)


def test_cpu_caches_of_one_model_in_any_order():
    """The same for the CPU cache (E8KVCache), and a cache kept after its compress() block ended (it gave
    wrong logits silently before: the model's SDPA over the new tokens alone)."""
    import e8kv.hf
    model = model_on("cpu")
    ids = prompt_ids(2, PROMPT_T + 8, dev="cpu")
    for spec in ("f32", "e8:4,sink=1"):
        _reuse_checks(model, lambda: e8kv.hf.E8KVCache(model.config, spec), ids, 1e-4 if spec == "f32" else 1.0)
    model.config._attn_implementation = "sdpa"  # (the caches above routed it to e8kv: compress() restores this)
    with e8kv.hf.compress(model, "f32"):
        kept = e8kv.hf.E8KVCache(model.config, "f32")
        first = _steps(model, kept, ids, 0, PROMPT_T + 4)
    assert model.config._attn_implementation == "sdpa"
    got = torch.cat([first, _steps(model, kept, ids, PROMPT_T + 4, PROMPT_T + 8)], 1)
    from transformers import DynamicCache
    ref = _steps(model, DynamicCache(config=model.config), ids, 0, PROMPT_T + 8)
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4


def _split_layers(model, dev1, first):
    """Layers first.. of a Llama on dev1, their inputs moved there and their outputs back (what accelerate's
    device_map hooks do)."""
    def mv(x, to):
        if isinstance(x, torch.Tensor):
            return x.to(to)
        if isinstance(x, (tuple, list)):
            return type(x)(mv(y, to) for y in x)
        return x
    home = next(model.parameters()).device
    for layer in model.model.layers[first:]:
        layer.to(dev1)
        layer.register_forward_pre_hook(lambda m, a, kw: (mv(a, dev1), {k: mv(v, dev1) for k, v in kw.items()}),
                                        with_kwargs=True)
        layer.register_forward_hook(lambda m, a, out: mv(out, home))
    return model


@pytest.mark.skipif(not GPU or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("spec", ["bf16", "e8box:4,sink=2", "e8p:2,sink=2,evict=snapkv:0.5,recent=8,obs=8"])
def test_layers_on_two_devices(spec):
    """A model split over two GPUs (layers 2.. on cuda:1): the cache on cuda:0 takes every layer's K/V and
    answers every layer's attention on the layer's device; the logits equal those of the same model on one
    GPU with the same cache (prompt, a gathered 20-token chunk, single steps)."""
    import e8kv.hf
    from transformers import DynamicCache
    prompt = prompt_ids(2, 24)
    steps = prompt_ids(2, 26, seed=9)
    one = tiny_llama(torch.float32, n_layer=4)
    two = _split_layers(tiny_llama(torch.float32, n_layer=4), torch.device("cuda", 1), 2)

    def run(model, cache):
        out = run_steps(model, cache, prompt, steps[:, :4])
        with torch.no_grad():  # a chunk past gather_from: SDPA over the gathered pages
            out2 = model(input_ids=steps[:, 4:24], past_key_values=cache, use_cache=True).logits[:, -1].float()
            out3 = model(input_ids=steps[:, 24:25], past_key_values=cache, use_cache=True).logits[:, -1].float()
        if hasattr(cache, "detach"):
            cache.detach(model.config)
            cache.check()
        return torch.cat((out, out2[None], out3[None]))
    want = run(one, gpu_cache(one, spec, 2))
    got = run(two, gpu_cache(two, spec, 2))
    ref = run(two, DynamicCache(config=two.config))
    err, scale = float((got - want).abs().max()), float(ref.abs().max())
    print(f"{spec}: two GPUs vs one, max |logit diff| {err:.3g}; vs DynamicCache {float((got - ref).abs().max()):.3g} "
          f"(max |logit| {scale:.3g})")
    assert err <= 1e-4 * scale, (err, scale)


def test_hybrid_eviction_keeps_the_window(dev):
    """evict= sizes the CUDA cache for the tokens it keeps (here 20 per row), fewer than the prompt's 64: a
    hybrid model's sliding layers still hold their whole window (39 tokens, as transformers keeps it), not
    the cache's capacity."""
    import e8kv.hf
    on = "cuda" if dev == "cuda" else "cpu"
    model = hybrid_model("qwen2", on, window=40)
    prompt, steps = _hybrid_inputs(on, t=64, n=4)
    cache = e8kv.hf.E8KVCudaCache(model.config, "bf16,evict=snapkv:0.75,recent=8,obs=8", device=dev,
                                  max_batch_size=2, max_cache_len=16 + 4)
    run_steps(model, cache, prompt, steps)
    cache.detach(model.config)
    held = [x.keys.shape[2] for x in cache.layers if x.is_sliding]
    assert held and all(h >= 40 - 1 for h in held), held


def oss_model(on="cpu", dtype=torch.float32, sinks=True):
    """A tiny random gpt-oss: sliding (window 8), full, sliding, full; head_dim 64, 8 query heads over 2 KV
    heads, YaRN RoPE, 4 experts. Its learned sinks are drawn N(2, 2²) so that they take a visible share of the
    weight (the initialiser's are ~0.02); sinks=False: -1e4 (no sink: the control). transformers runs gpt-oss
    with eager attention (no SDPA path)."""
    from transformers import GptOssConfig, GptOssForCausalLM
    cfg = GptOssConfig(vocab_size=1024, hidden_size=256, intermediate_size=256, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=8, max_position_embeddings=512,
                       rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                        "truncate": False, "original_max_position_embeddings": 64,
                                        "rope_theta": 150000.0})
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    with torch.device("cuda" if on == "cuda" else "cpu"):
        model = GptOssForCausalLM(cfg).to(dtype).eval()
    g = torch.Generator().manual_seed(3)
    for layer in model.model.layers:
        x = torch.randn(8, generator=g) * 2 + 2 if sinks else torch.full((8,), -1e4)
        layer.self_attn.sinks.data = x.to(layer.self_attn.sinks)
    return model


def test_learned_sinks_cpu_cache():
    """gpt-oss's learned attention sinks with the CPU cache (e8kv_cache_attend_sinks): f32 codes give
    DynamicCache's logits (eager attention with the sinks), e8:4 near them, and the same model without sinks
    (the control) far from them; padded generate and beam search give DynamicCache's tokens."""
    import e8kv.hf
    from transformers import DynamicCache
    model = oss_model()
    prompt, steps = _hybrid_inputs("cpu")
    want = run_steps(model, DynamicCache(config=model.config), prompt, steps)
    plain = oss_model(sinks=False)
    control = float((run_steps(plain, DynamicCache(config=plain.config), prompt, steps) - want).abs().max())
    scale, errs = float(want.abs().max()), {}
    for spec in ("f32", "e8:4,sink=1"):
        cache = e8kv.hf.E8KVCache(model.config, spec)
        errs[spec] = float((run_steps(model, cache, prompt, steps) - want).abs().max())
        assert model.config._e8kv_fallback == "eager"  # the sliding layers: gpt-oss's own eager attention
        model.config._attn_implementation = "eager"
    # what the same codes cost on the same model without sinks (reported: a sink makes score errors common
    # to all of a query's keys show)
    plain_want = run_steps(plain, DynamicCache(config=plain.config), prompt, steps)
    plain_err = float((run_steps(plain, e8kv.hf.E8KVCache(plain.config, "e8:4,sink=1"), prompt, steps)
                       - plain_want).abs().max())
    print(f"gpt-oss CPU cache: max |logit diff| vs DynamicCache: f32 {errs['f32']:.3g}, e8:4,sink=1 "
          f"{errs['e8:4,sink=1']:.3g} ({plain_err:.3g} on the model without sinks); without the sinks "
          f"{control:.3g} (max |logit| {scale:.3g})")
    assert errs["f32"] <= 1e-5 * scale and control > 0.1 * scale and errs["e8:4,sink=1"] < control
    _generate_as_dynamic(model, prompt)


def test_learned_sinks_cuda_cache(dev):
    """gpt-oss's learned sinks with the CUDA cache (and its CPU twin): the prompt (SDPA over the chunk with the
    sinks as one more key), single steps (the kernel's merge, e8kv_cuda_set_layer_sinks), a 3-token chunk
    (the kernel's virtual rows) and a 24-token chunk (SDPA over the gathered pages) give DynamicCache's
    logits within bf16's rounding, far closer than the model without sinks; e8box:4 near them."""
    import e8kv.hf
    from transformers import DynamicCache
    on = "cuda" if dev == "cuda" else "cpu"
    model = oss_model(on)
    prompt, steps = _hybrid_inputs(on, t=20, n=34)

    def run(cache):
        return _steps_then_chunks(model, cache, prompt, steps, 6, ((6, 9), (9, 33), (33, 34)))
    want = run(DynamicCache(config=model.config))
    plain = oss_model(on, sinks=False)
    control = float((run_steps(plain, DynamicCache(config=plain.config), prompt, steps[:, :6]) - want[:7]).abs().max())
    scale, errs = float(want.abs().max()), {}
    for spec in ("bf16", "e8box:4"):
        cache = gpu_cache(model, spec, 2, dev=dev)
        assert 3 < cache.gather_from <= 24
        errs[spec] = float((run(cache) - want).abs().max())
        model.config._attn_implementation = "eager"
    print(f"gpt-oss on {dev}: max |logit diff| vs DynamicCache: bf16 pages {errs['bf16']:.3g}, e8box:4 "
          f"{errs['e8box:4']:.3g}; without the sinks {control:.3g} (max |logit| {scale:.3g})")
    assert errs["bf16"] <= 1e-2 * scale and control > 0.1 * scale and errs["e8box:4"] < control
    # a padded batch (the prompt's boolean mask gets the sink's column): row 0 as alone
    perr = _padded_row_as_alone(model, prompt, steps, dev)
    print(f"gpt-oss on {dev}: padded row vs alone max |logit diff| {perr:.3g}")
    assert perr <= 1e-3 * scale, perr


def test_learned_sinks_reach_the_eviction(dev, monkeypatch):
    """evict= on gpt-oss: the scorers get each coded layer's learned sinks (the CPU cache through
    e8kv_cache_evict_sinks, an (n_layer, n_head) array; the CUDA cache and its twin through e8kv.evict.select
    per layer), the model's own values, and the prompt is evicted (kept < prompt)."""
    import e8kv.core
    import e8kv.evict as ev
    import e8kv.hf
    on = "cuda" if dev == "cuda" else "cpu"
    model = oss_model(on)
    want = [layer.self_attn.sinks.detach().float().cpu() for layer, kind in
            zip(model.model.layers, model.config.layer_types) if kind == "full_attention"]
    prompt, _ = _hybrid_inputs(on, t=160)
    arg = e8kv.hf.cache_arg(model)
    got = []
    if dev != "cuda":  # the CPU cache, once
        real_evict = e8kv.core.Cache.evict

        def spy_evict(self, q=None, n_head=0, q_pos0=0, sinks=None):
            got.append(torch.as_tensor(sinks))
            return real_evict(self, q, n_head, q_pos0, sinks=sinks)
        monkeypatch.setattr(e8kv.core.Cache, "evict", spy_evict)
        cache = e8kv.hf.E8KVCache(model.config, "f32,evict=h2o:0.5,recent=4")
        with torch.no_grad():
            model(input_ids=prompt, **{arg: cache}, use_cache=True)
        assert len(got) == 2 and all(torch.equal(x, torch.stack(want)) for x in got), got  # one per row
        assert all(r.n_kept(0) < 160 for r in cache.rows)
        model.config._attn_implementation = "eager"
        got.clear()
    real_select = ev.select

    def spy_select(*a, **kw):
        got.append(kw.get("sinks"))
        return real_select(*a, **kw)
    monkeypatch.setattr(ev, "select", spy_select)
    cache = gpu_cache(model, "bf16,evict=h2o:0.5,recent=4", 2, cap=192, dev=dev)
    with torch.no_grad():
        model(input_ids=prompt, **{arg: cache}, use_cache=True)
    cache.detach(model.config)
    assert len(got) == 4, got  # 2 coded layers x 2 rows
    for i, x in enumerate(got):
        assert torch.equal(x.float().cpu(), want[i // 2]), (i, x)
    assert all(k.shape[1] < 160 for layer in cache.kept if layer for k in layer)


def test_sdpa_with_sinks():
    """hf._sdpa's sink key against softmax with the sink's column written out, float64: a square causal
    prompt (one more query first), a bottom-right causal bias over a longer past (the gathered chunk) and a
    boolean mask (a padded prompt), with GQA; bf16 within its rounding."""
    import e8kv.hf
    from torch.nn.attention.bias import causal_lower_right
    g = torch.Generator().manual_seed(11)
    b, h, hk, d = 2, 8, 2, 64
    sinks = torch.randn(h, generator=g) * 2 + 1

    def ref(q, k, v, allowed, scale):
        k, v = k.repeat_interleave(h // hk, 1).double(), v.repeat_interleave(h // hk, 1).double()
        sc = (q.double() @ k.transpose(-1, -2)) * scale
        sc = sc.masked_fill(~allowed, float("-inf"))
        sc = torch.cat((sc, sinks.double().view(1, h, 1, 1).expand(*sc.shape[:3], 1)), -1)
        return torch.softmax(sc, -1)[..., :-1] @ v

    for t, n, kind in ((12, 12, "causal"), (5, 30, "bias"), (12, 12, "mask")):
        q, k, v = (torch.randn(b, x, y, d, generator=g) for x, y in ((h, t), (hk, n), (hk, n)))
        allowed = torch.ones(t, n, dtype=torch.bool).tril(n - t)[None, None].expand(b, 1, t, n)
        kw = {}
        if kind == "causal":
            kw["is_causal"] = True
        elif kind == "bias":
            kw["attn_mask"] = causal_lower_right(t, n)
        else:
            allowed = allowed.clone()
            allowed[0, :, :, :4] = False
            allowed[0, :, :4, :4] = torch.eye(4, dtype=torch.bool)  # a pad's query sees itself
            kw["attn_mask"] = allowed
        want = ref(q, k, v, allowed, 0.3)
        got = e8kv.hf._sdpa(q, k, v, scale=0.3, enable_gqa=True, sinks=sinks, **kw)
        assert float((got.double() - want).abs().max()) <= 1e-5, kind
        got16 = e8kv.hf._sdpa(q.bfloat16(), k.bfloat16(), v.bfloat16(), scale=0.3, enable_gqa=True, sinks=sinks, **kw)
        assert float((got16.double() - want).abs().max()) <= 3e-2, kind
        plain = e8kv.hf._sdpa(q, k, v, scale=0.3, enable_gqa=True, **kw)  # the control: no sinks
        assert float((plain.double() - want).abs().max()) > 0.05, kind


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])
def test_hybrid_model_eager_fallback(kind):
    """A hybrid model loaded with attn_implementation="eager": its sliding layers run the model's eager
    attention, which adds the mask to the scores, so the "e8kv" mask function hands them the eager (float)
    mask, not SDPA's boolean one (added as 0/1 it masked nothing: 1.07 of max |logit| 1.38 on this Gemma 3
    before). f32 codes give DynamicCache's logits."""
    import e8kv.hf
    from transformers import DynamicCache
    model = hybrid_model(kind)
    model.config._attn_implementation = "eager"
    prompt, steps = _hybrid_inputs("cpu")
    want = run_steps(model, DynamicCache(config=model.config), prompt, steps)
    got = run_steps(model, e8kv.hf.E8KVCache(model.config, "f32"), prompt, steps)
    assert model.config._e8kv_fallback == "eager"
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


@needs_gpu
def test_learned_sinks_compiled_equals_eager():
    """gpt-oss's compiled decode steps (torch.compile, CUDA graphs) replay the sinks the eager prompt set
    (e8kv_cuda_set_layer_sinks keeps the pointer): the logits equal the eager steps'."""
    model = oss_model("cuda")
    prompt, steps = _hybrid_inputs("cuda", t=10, n=12)
    _, _, err, scale, skips = compiled_and_eager(model, "e8box:4,sink=2", prompt, steps)
    model.config._attn_implementation = "eager"
    print(f"gpt-oss e8box:4,sink=2: compiled vs eager max |logit diff| {err:.3g} (max |logit| {scale:.3g}), "
          f"cudagraph skips {skips}")
    assert skips == 0
    assert err <= 2e-2 * scale, (err, scale)


def test_models_the_cache_cannot_serve_are_named():
    """A model whose attention does not go through transformers' attention interface (Falcon computes its
    own) would attend over the new tokens alone: refused by name. A config that says otherwise than its
    layers give is named with both shapes, not an error deep in the C cache."""
    import e8kv.hf
    from transformers import FalconConfig, LlamaConfig, LlamaForCausalLM
    with pytest.raises(e8kv.hf.UnsupportedModelError, match="does not go through transformers' attention interface"):
        e8kv.hf.ModelShape(FalconConfig(vocab_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=4))
    prompt, steps = _hybrid_inputs("cpu")
    torch.manual_seed(3)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    llama.config.num_key_value_heads = 4  # the config now says 4 KV heads; the layers were built with 2
    with pytest.raises(e8kv.hf.UnsupportedModelError, match="gives K of 2 heads x 64"):
        run_steps(llama, e8kv.hf.E8KVCache(llama.config, "f32"), prompt, steps)


@needs_gpu
@pytest.mark.parametrize("n_head,n_kv", [(16, 1), (24, 2)])
def test_more_than_8_query_heads_per_kv_head(n_head, n_kv):
    """Groups of more than 8 query heads per KV head (Llama-3.1-405B and Qwen3-235B: 16, Mistral Large and
    GLM-4.5: 12): the kernels take 8 at most, so CudaCache.attend cuts each group into the fewest equal calls
    (16: 2 × 8, 12: 2 × 6). bf16 pages give DynamicCache's logits within bf16's rounding through the prompt,
    steps, a 3-token chunk (virtual rows) and compiled steps; e8box:4 near them."""
    import e8kv.hf
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=64 * n_head, intermediate_size=512, num_hidden_layers=2, num_attention_heads=n_head,
                      num_key_value_heads=n_kv, head_dim=64, vocab_size=1024, max_position_embeddings=512,
                      attn_implementation="sdpa")
    torch.manual_seed(5)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).float().eval()
    prompt, steps = _hybrid_inputs("cuda", t=20, n=12)

    def run(cache):
        return _steps_then_chunks(model, cache, prompt, steps, 8, ((8, 11),))
    want = run(DynamicCache(config=model.config))
    scale = float(want.abs().max())
    errs = {spec: float((run(gpu_cache(model, spec, 2)) - want).abs().max()) for spec in ("bf16", "e8box:4")}
    _, _, cerr, _, skips = compiled_and_eager(model, "bf16", prompt, steps[:, :8])
    print(f"{n_head} query heads over {n_kv}: vs DynamicCache bf16 {errs['bf16']:.3g}, e8box:4 {errs['e8box:4']:.3g} "
          f"(max |logit| {scale:.3g}); compiled vs eager {cerr:.3g}, cudagraph skips {skips}")
    assert errs["bf16"] <= 1e-2 * scale and errs["e8box:4"] <= 0.2 * scale
    assert skips == 0 and cerr <= 1e-2 * scale


def test_a_window_the_config_does_not_declare_is_refused(dev):
    """A layer that passes a sliding window its config's layer types do not declare (a Qwen3-MoE config whose
    sliding_window was set after use_sliding_window=False nulled it: its modules and masks apply the window
    to every layer) is refused by both caches, not attended over its whole past."""
    import e8kv.hf
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(vocab_size=1024, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=4,
                         num_experts_per_tok=2, max_position_embeddings=512)
    cfg.sliding_window = 8
    on = "cuda" if dev == "cuda" else "cpu"
    torch.manual_seed(2)
    with torch.device(on):
        model = Qwen3MoeForCausalLM(cfg).eval()
    prompt, steps = _hybrid_inputs(on)
    assert e8kv.hf.ModelShape(model.config).sliding_window is None  # use_sliding_window is False
    caches = [lambda: e8kv.hf.E8KVCache(model.config, "f32")] if on == "cpu" else []
    for make in caches + [lambda: gpu_cache(model, "bf16", 2, dev=dev)]:
        cache = make()
        with pytest.raises(e8kv.hf.UnsupportedModelError, match="sliding"):
            run_steps(model, cache, prompt, steps)
        if hasattr(cache, "detach"):
            cache.detach(model.config)
        model.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("n_head,n_kv", [(4, 1), (8, 2), (8, 1)])
def test_head_dim_256(dev, n_head, n_kv):
    """head_dim 256 (Gemma 3 1B: 4 query heads over 1 KV head, 4B and 12B: 2 per KV head), kept by the CUDA cache as
    two halves of 128: the default spec is e8box:4,sink=4 (center=rope refused by name: its RoPE pairs straddle
    the halves); bf16 pages give DynamicCache's logits within bf16's rounding through the prompt, steps, a
    3-token chunk (virtual rows) and a 20-token chunk (SDPA over the gathered pages, written as heads of 256);
    e8box:4 near them; 8 query heads per KV head go through two calls of 4 (the kernel takes 4 at 256); on
    the GPU compiled steps equal eager ones."""
    import e8kv.hf
    from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig
    on = "cuda" if dev == "cuda" else "cpu"
    cfg = Gemma3TextConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                           num_attention_heads=n_head, num_key_value_heads=n_kv, head_dim=256,
                           query_pre_attn_scalar=256, max_position_embeddings=512, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(256)
    with torch.device(on):
        model = Gemma3ForCausalLM(cfg).float().eval()
    assert e8kv.hf.cuda_default_spec(model.config) == "e8box:4,sink=4"
    with pytest.raises(e8kv.E8KVError, match="center=rope.*head_dim 256"):
        gpu_cache(model, "e8box:4,center=rope", 2, dev=dev)
    prompt, steps = _hybrid_inputs(on, t=20, n=31)

    def run(cache):
        return _steps_then_chunks(model, cache, prompt, steps, 8, ((8, 11), (11, 31)))
    want = run(DynamicCache(config=model.config))
    scale = float(want.abs().max())
    errs = {spec: float((run(gpu_cache(model, spec, 2, dev=dev)) - want).abs().max())
            for spec in ("bf16", "e8box:4,sink=4", "e8p:2")}
    print(f"head_dim 256, {n_head} query heads over {n_kv} on {dev}: vs DynamicCache bf16 {errs['bf16']:.3g}, "
          f"e8box:4,sink=4 {errs['e8box:4,sink=4']:.3g}, e8p:2 {errs['e8p:2']:.3g} (max |logit| {scale:.3g})")
    assert errs["bf16"] <= 1e-2 * scale and errs["e8box:4,sink=4"] <= 0.2 * scale and errs["e8p:2"] <= 0.5 * scale
    if dev == "cuda":
        _, _, cerr, _, skips = compiled_and_eager(model, "e8box:4,sink=4", prompt, steps[:, :8])
        print(f"  compiled vs eager {cerr:.3g}, cudagraph skips {skips}")
        assert skips == 0 and cerr <= 1e-2 * scale
