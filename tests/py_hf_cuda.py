#!/usr/bin/env python3
"""pytest: the CUDA cache from Python and transformers (e8kv.CudaCache, torch.ops.e8kv.*, E8KVCache with
device="cuda") on a tiny random Llama (transformers LlamaConfig, bf16 and f32):
  - bf16 pages: the logits of a prefill + 16 decode steps equal DynamicCache's within fp tolerance, and
    so do those of a 4-token chunk after the prompt (one virtual attention row per token);
  - e8box:4 / e8box:3 / e8p:2: the bytes in the device pages equal e8kv.Codec.encode of the same K/V (the CPU
    library), and greedy decoding through the model runs;
  - eager and torch.compile(mode="reduce-overhead", fullgraph=True) steps give the same logits;
  - the device memory the cache takes (cudaMemGetInfo delta) equals its accounted bytes;
  - specs the CUDA cache cannot hold and NaN input are named errors.
Needs a GPU and a libe8kv built with nvcc: skipped otherwise, with the reason (CI has no GPU; there only
the check that a CUDA cache asked for without a usable device is a named error runs)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if not os.environ.get("E8KV_LIB") and os.path.exists(os.path.join(ROOT, "build", "libe8kv.so")):
    os.environ["E8KV_LIB"] = os.path.join(ROOT, "build", "libe8kv.so")
sys.path.insert(0, os.path.join(ROOT, "python"))


def _missing():
    for mod in ["pytest", "numpy", "torch", "transformers"]:
        try:
            __import__(mod)
        except ImportError:
            return f"python module {mod} (pip install -r requirements-dev.txt)"
    return None


if __name__ == "__main__":
    why = _missing()
    if why:
        print(f"skip: needs {why}")
        sys.exit(77)
    import pytest
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-rA", "-p", "no:cacheprovider"]))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import e8kv  # noqa: E402

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


def gpu_cache(model, spec, batch, cap=128):
    return e8kv.hf.E8KVCache(model.config, spec, device="cuda", max_batch_size=batch, max_cache_len=cap)


def prompt_ids(batch, t, seed=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1024, (batch, t), generator=g).cuda()


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


@needs_gpu
@pytest.mark.parametrize("n", [4, 40])
@pytest.mark.parametrize("spec", ["bf16", "e8box:4,sink=64", "e8p:2,sink=64"])
def test_chunk_with_a_past_reads_the_pages(spec, n):
    """A chunk of n tokens after the prompt; n = 4: attention through one virtual row per token (context =
    position + 1) over the pages, the chunk's own tokens included; n = 40 (past gather_from = 16): SDPA over
    the values gathered from the pages, causal from the bottom right. Logits = DynamicCache's steps'. With
    sink=64 every position is a sink row: exact K/V whatever the pages' format (each batch row reads its own
    sink rows, in the prompt's appends, the chunk's and the step's)."""
    import e8kv.hf  # noqa: F401
    model = tiny_llama(torch.bfloat16)
    prompt = prompt_ids(2, 12)
    ref, toks = reference(model, prompt, n + 2)
    cache = gpu_cache(model, spec, 2)
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


@needs_gpu
@pytest.mark.parametrize("spec", ["e8box:4", "bf16", "e8box:4,sink=2"])
def test_compiled_equals_eager(spec):
    import e8kv.hf  # noqa: F401
    from torch._dynamo.utils import counters
    model = tiny_llama(torch.bfloat16)
    prompt = prompt_ids(2, 10)
    _, toks = reference(model, prompt, 12)
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
    err = float((compiled - eager).abs().max())
    scale = float(eager.abs().max())
    print(f"{spec}: compiled vs eager max |logit diff| {err:.3g} (max |logit| {scale:.3g}), cudagraph skips {skips}")
    assert skips == 0
    assert err <= 2e-2 * scale, (err, scale)


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
