#!/usr/bin/env python3
"""End-to-end decode through transformers on the GPU: a Llama-3-8B-shaped model (32 layers, hidden 4096,
32 query / 8 KV heads, head_dim 128, intermediate 14336, vocab 128256) with random bf16 weights built on
the device, its cache pre-filled with random K/V (no prefill is run), one new token per sequence per step.
--model gemma3-4b: a Gemma-3-4B-shaped one instead (34 layers, 5 of full attention and 29 sliding-window
layers of 1024 tokens, hidden 2560, 8 query / 4 KV heads, head_dim 256, intermediate 10240, vocab 262208),
its cache filled by a prefill of random tokens (the sliding-window layers keep their window), logits of the
last position only.
Caches: DynamicCache (eager), StaticCache (eager and torch.compile mode "reduce-overhead", fullgraph), and
e8kv's CUDA cache (e8kv.hf.E8KVCache(device="cuda")) with e8box:4 and e8p:2 (eager and compiled).
Per case: ms per decode step (median of --steps steps after warm-up, the host waiting for each), tokens/s
over the batch, peak device memory = torch's allocator peak (weights, activations, torch caches, CUDA graph
pools) + the e8kv cache's own cudaMalloc (E8KVCudaCache.n_bytes). Then the largest batch that fits at
the long context for each cache (batches tried in increasing order until one runs out of memory; eager
steps), with a compiled step at that batch, then batch 1 and the short context.
One JSON object per line to --json (written as it goes: a cut-off run keeps what it measured).
With --profile, each compiled case of the main and floor parts also records the GPU kernel time of 3 steps
by group (attention, append, matmul, other; torch.profiler), their wall time and the host's busiest
operations, to say where a step's time goes.
Usage: python3 bench/bench_hf_cuda.py [--json FILE] [--quick] [--budget SECONDS] [--parts ...] [--profile]"""
import argparse
import gc
import json
import os
import re
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import e8kv  # noqa: E402
import e8kv.hf  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache  # noqa: E402

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def build(quick, name="llama3-8b"):
    if name == "gemma3-4b":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        n = 6 if quick else 34
        cfg = Gemma3TextConfig(vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=n,
                               num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                               query_pre_attn_scalar=256, max_position_embeddings=131072, sliding_window=1024,
                               layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                            for i in range(n)], attn_implementation="sdpa")
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda"):
            model = Gemma3ForCausalLM(cfg).eval()
        torch.set_default_dtype(torch.float32)
        return model
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4 if quick else 32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                      max_position_embeddings=131072, rope_theta=500000.0, attn_implementation="sdpa",
                      tie_word_embeddings=False)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    return model


def make_cache(model, kind, batch, ctx, pad, max_chunk=1, gather_from=16):
    """A cache of `kind` holding `ctx` random tokens per sequence, room for `pad` more (e8kv: chunks of up to
    max_chunk tokens with a past through the decode kernel, those of gather_from tokens or more through SDPA
    over the gathered values)."""
    cfg = model.config
    L, H, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        return prefilled(model, kind, batch, ctx, pad, max_chunk, gather_from)
    if kind == "dynamic":
        cfg._attn_implementation = "sdpa"
        cache = DynamicCache(config=cfg)
        for layer in range(L if ctx else 0):
            k = torch.randn((batch, H, ctx, D), generator=g, device="cuda", dtype=torch.bfloat16)
            cache.update(k, torch.randn_like(k), layer)
        return cache
    if kind == "static":
        cfg._attn_implementation = "sdpa"
        cache = StaticCache(config=cfg, max_cache_len=ctx + pad)
        for layer in range(L):
            k = torch.randn((batch, H, ctx, D), generator=g, device="cuda", dtype=torch.bfloat16)
            cache.update(k, torch.randn_like(k), layer)
        return cache
    cache = e8kv.hf.E8KVCache(cfg, kind, device="cuda", max_batch_size=batch, max_cache_len=ctx + pad,
                              max_chunk=max_chunk, gather_from=gather_from)
    if ctx == 0:
        return cache
    rows = max(1, min(batch, (1 << 28) // (H * ctx * D)))  # ~0.5 GB of bf16 per piece
    for layer in range(L):
        for r0 in range(0, batch, rows):
            b = min(rows, batch - r0)
            k = torch.randn((b, H, ctx, D), generator=g, device="cuda", dtype=torch.bfloat16)
            cache.fill(layer, k, torch.randn_like(k), r0)
    cache.set_length(ctx)
    return cache


def prefilled(model, kind, batch, ctx, pad, max_chunk, gather_from):
    """A hybrid model's cache (sliding-window layers beside full ones) after a prefill of ctx random tokens per
    sequence (one forward of the batch's prompts; logits of the last position only)."""
    cfg = model.config
    cfg._attn_implementation = "sdpa"
    if kind == "dynamic":
        cache = DynamicCache(config=cfg)
    elif kind == "static":
        cache = StaticCache(config=cfg, max_cache_len=ctx + pad)
    else:
        cache = e8kv.hf.E8KVCache(cfg, kind, device="cuda", max_batch_size=batch, max_cache_len=ctx + pad,
                                  max_chunk=max_chunk, gather_from=gather_from)
    if ctx:
        g = torch.Generator(device="cuda").manual_seed(0)
        ids = torch.randint(0, cfg.vocab_size, (batch, ctx), generator=g, device="cuda")
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        torch.cuda.synchronize()
    return cache


def measure_copy(model, kind, batch, ctx, out, reps=5):
    """copy.deepcopy of a cache holding batch x ctx tokens (transformers' way to reuse a prompt's cache): ms
    (the host waiting for the device; median of reps copies, each freed before the next) and the copy's own
    device bytes (e8kv: its cudaMalloc, the whole pool; DynamicCache: the bytes its tensors hold)."""
    import copy
    gc.collect()
    torch.cuda.empty_cache()
    cache = make_cache(model, kind, batch, ctx, 16)
    torch.cuda.synchronize()
    times, held = [], 0
    for _ in range(reps):
        t = time.perf_counter()
        c = copy.deepcopy(cache)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
        held = c.n_bytes if isinstance(c, e8kv.hf.E8KVCudaCache) else sum(
            x.numel() * x.element_size() for layer in c.layers for x in (layer.keys, layer.values))
        del c
    times.sort()
    rec = {"part": "copy", "cache": kind, "batch": batch, "ctx": ctx, "ms": round(times[len(times) // 2], 3),
           "ms_all": [round(x, 3) for x in times], "copy_gb": round(held / 1e9, 3),
           "device": torch.cuda.get_device_name()}
    emit(rec, out)
    del cache


def measure_save(model, kind, batch, ctx, out, reps=3):
    """torch.save of a cache holding batch x ctx tokens into host memory, and torch.load back onto the device
    (weights_only=False; e8kv: its state, every page of the pool, and attach): ms each (median of reps) and the
    saved bytes."""
    import io
    gc.collect()
    torch.cuda.empty_cache()
    cache = make_cache(model, kind, batch, ctx, 16)
    torch.cuda.synchronize()
    ts, tl, size = [], [], 0
    for _ in range(reps):
        buf = io.BytesIO()
        t = time.perf_counter()
        torch.save(cache, buf)
        ts.append((time.perf_counter() - t) * 1e3)
        size = buf.tell()
        buf.seek(0)
        t = time.perf_counter()
        back = torch.load(buf, weights_only=False)
        if isinstance(back, e8kv.hf.E8KVCudaCache):
            back.attach(model.config)
        torch.cuda.synchronize()
        tl.append((time.perf_counter() - t) * 1e3)
        del back, buf
    ts.sort()
    tl.sort()
    rec = {"part": "save", "cache": kind, "batch": batch, "ctx": ctx, "save_ms": round(ts[len(ts) // 2], 1),
           "load_ms": round(tl[len(tl) // 2], 1), "saved_gb": round(size / 1e9, 3),
           "device": torch.cuda.get_device_name()}
    emit(rec, out)
    del cache


def cache_bytes(cache):
    return cache.n_bytes if isinstance(cache, e8kv.hf.E8KVCudaCache) else 0


def release(model, cache):
    if isinstance(cache, e8kv.hf.E8KVCudaCache):
        cache.detach(model.config)
    model.config._attn_implementation = "sdpa"


def out_of_memory(rec, e):
    """A case that ran out of device memory is recorded as such; any other error goes on."""
    if not (isinstance(e, torch.OutOfMemoryError) or e.code == e8kv.ErrorCode.OUT_OF_MEMORY):
        raise e
    rec.update(ok=False, error="out of memory")


def finish(model, cache, compiled=False):
    """After a case: the cache released, torch.compile's state reset (compiled cases), device memory freed."""
    if cache is not None:
        release(model, cache)
    if compiled:
        torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


KERNEL_GROUPS = (("attention", re.compile(r"attn_|flash|fmha|sdpa|softmax|efficient_attention")),
                 ("append", re.compile(r"append|encode|e8kv_(?!attn)")),
                 ("matmul", re.compile(r"gemm|gemv|nvjet|cutlass|splitk|sm90_xmma|cublas", re.I)))


def profile_steps(step, n=3):
    """n calls of step() (one decode step each) under torch.profiler: GPU kernel time summed per group
    (attention, append, matmul, other) in ms per step, the 8 kernels that took longest, the step's wall time,
    and the host operations with the most self CPU time (guards, graph replay: what the host does per step)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(n):
            step()
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
    groups, kernels, host = {}, [], []
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CPU:  # a host operation (its kernels are counted below)
            if ev.self_cpu_time_total:
                host.append((ev.self_cpu_time_total, ev.count, ev.key[:90]))
            continue
        us = getattr(ev, "self_device_time_total", None)
        if us is None:
            us = getattr(ev, "self_cuda_time_total", 0)
        if not us:
            continue
        g = next((name for name, rx in KERNEL_GROUPS if rx.search(ev.key)), "other")
        groups[g] = groups.get(g, 0.0) + us
        kernels.append((us, ev.count, ev.key[:90]))
    kernels.sort(reverse=True)
    host.sort(reverse=True)
    return {"steps": n, "ms_per_step": {g: round(us / n / 1e3, 3) for g, us in sorted(groups.items())},
            "gpu_ms_per_step": round(sum(groups.values()) / n / 1e3, 3),
            "wall_ms_per_step": round(wall / n * 1e3, 3),
            "top": [{"ms_per_step": round(us / n / 1e3, 3), "calls_per_step": c / n, "kernel": k}
                    for us, c, k in kernels[:8]],
            "host_top": [{"ms_per_step": round(us / n / 1e3, 3), "calls_per_step": c / n, "op": k}
                         for us, c, k in host[:8]]}


def emit(rec, out):
    """Log one result and append it to the JSON-lines file (written as it goes)."""
    log(json.dumps(rec))
    if out:
        out.write(json.dumps(rec) + "\n")
        out.flush()
    return rec


def fresh_device():
    """Free what the last case left and reset the peak-memory counter."""
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def measure(model, kind, mode, batch, ctx, steps, out, prof=False):
    warm = 4 if mode == "compiled" else 2
    fresh_device()
    cache = None
    rec = {"cache": kind, "mode": mode, "batch": batch, "ctx": ctx, "device": torch.cuda.get_device_name(),
           "model": model.config.model_type}
    try:
        cache = make_cache(model, kind, batch, ctx, warm + steps + (3 if prof else 0) + 8)
        fn = model.forward
        if mode == "compiled":
            torch._dynamo.reset()
            fn = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        tok = torch.full((batch, 1), 17, dtype=torch.long, device="cuda")
        t_compile = time.time()
        with torch.no_grad():
            for _ in range(warm):
                fn(input_ids=tok, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
            rec["warmup_s"] = round(time.time() - t_compile, 1)
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                fn(input_ids=tok, past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            if prof:
                rec["profile"] = profile_steps(lambda: fn(input_ids=tok, past_key_values=cache, use_cache=True))
        times.sort()
        ms = 1e3 * times[len(times) // 2]
        rec.update(ms=round(ms, 3), tok_s=round(batch / ms * 1e3, 1),
                   peak_gb=round((torch.cuda.max_memory_allocated() + cache_bytes(cache)) / 1e9, 2),
                   cache_gb=round(cache_bytes(cache) / 1e9, 3), ok=True)
        if isinstance(cache, e8kv.hf.E8KVCudaCache):
            cache.check()
    except (torch.OutOfMemoryError, e8kv.E8KVError) as e:
        out_of_memory(rec, e)
    finally:
        finish(model, cache, compiled=mode == "compiled")
        del cache
    return emit(rec, out)


def measure_beam(model, kind, batch, beams, ctx, steps, out):
    """Beam search's decode step, eager: a forward of batch x beams rows, then reorder_cache with random
    beam indices (each row continues a random beam of its own batch item, as beam search picks them). ms
    per step (forward + reorder, the host waiting for each) and ms of the reorder alone, medians."""
    rows = batch * beams
    fresh_device()
    cache = None
    rec = {"part": "beam", "cache": kind, "mode": "eager", "batch": batch, "beams": beams, "ctx": ctx,
           "device": torch.cuda.get_device_name()}
    try:
        cache = make_cache(model, kind, rows, ctx, 2 + steps + 8)
        g = torch.Generator().manual_seed(1)
        base = torch.arange(batch)[:, None] * beams
        tok = torch.full((rows, 1), 17, dtype=torch.long, device="cuda")
        step, reorder = [], []
        with torch.no_grad():
            for i in range(2 + steps):
                idx = (torch.randint(0, beams, (batch, beams), generator=g) + base).reshape(-1).to("cuda")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(input_ids=tok, past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                cache.reorder_cache(idx)
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                if i >= 2:
                    step.append(t2 - t0)
                    reorder.append(t2 - t1)
        step.sort()
        reorder.sort()
        ms = 1e3 * step[len(step) // 2]
        rec.update(ms=round(ms, 3), reorder_ms=round(1e3 * reorder[len(reorder) // 2], 3),
                   tok_s=round(rows / ms * 1e3, 1),
                   peak_gb=round((torch.cuda.max_memory_allocated() + cache_bytes(cache)) / 1e9, 2),
                   cache_gb=round(cache_bytes(cache) / 1e9, 3), ok=True)
        if isinstance(cache, e8kv.hf.E8KVCudaCache):
            cache.check()
    except (torch.OutOfMemoryError, e8kv.E8KVError) as e:
        out_of_memory(rec, e)
    finally:
        finish(model, cache)
        del cache
    return emit(rec, out)


def measure_prefill(model, kind, ctx, chunk, out, reps=3, path="gather"):
    """Eager prefill, batch 1: chunk == 0, a ctx-token prompt on an empty cache (e8kv: SDPA over the prompt's
    exact K/V, then its append); chunk > 0, chunks of `chunk` tokens after a ctx-token past (random K/V;
    e8kv: path "gather", SDPA over the values gathered from the pages (the default from 16 tokens), or
    "kernel", one attention row per token through the decode kernel). ms = median of reps after one
    warm-up; only the last position's logits are computed (logits_to_keep=1)."""
    rec = {"cache": kind, "mode": "prefill" if chunk == 0 else "chunk", "batch": 1, "ctx": ctx, "chunk": chunk,
           "device": torch.cuda.get_device_name()}
    if chunk and kind not in ("dynamic", "static"):
        rec["path"] = path
    fresh_device()
    cache = None
    times = []
    try:
        n_tok = ctx if chunk == 0 else chunk
        ids = torch.full((1, n_tok), 17, dtype=torch.long, device="cuda")
        if chunk:
            cache = make_cache(model, kind, 1, ctx, chunk * (reps + 1) + 8, max_chunk=chunk,
                               gather_from=2 if path == "gather" else 10 ** 9)
        with torch.no_grad():
            for r in range(reps + 1):
                if chunk == 0:
                    if cache is not None:
                        release(model, cache)
                    cache = make_cache(model, kind, 1, 0, ctx + 8, max_chunk=64)
                torch.cuda.synchronize()
                t = time.perf_counter()
                model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                torch.cuda.synchronize()
                if r:
                    times.append(time.perf_counter() - t)
        times.sort()
        ms = 1e3 * times[len(times) // 2]
        rec.update(ms=round(ms, 3), tok_s=round(n_tok / ms * 1e3, 1),
                   peak_gb=round((torch.cuda.max_memory_allocated() + cache_bytes(cache)) / 1e9, 2), ok=True)
        if isinstance(cache, e8kv.hf.E8KVCudaCache):
            cache.check()
    except (torch.OutOfMemoryError, e8kv.E8KVError) as e:
        rec.update(ok=False, error=str(e)[:200])
    finally:
        finish(model, cache)
        del cache
    return emit(rec, out)


def measure_gather(model, kind, ctx, out, batch=1, reps=20):
    """CudaCache.gather of one layer (ctx positions, bf16 out) against a device copy of a bf16 tensor of the
    same size (torch copy_), CUDA events, median of reps after 3 warm-ups, same run: µs, GB/s of bf16
    written, and the page bytes read."""
    rec = {"cache": kind, "mode": "gather", "batch": batch, "ctx": ctx, "device": torch.cuda.get_device_name()}
    fresh_device()
    cache = None
    try:
        cache = make_cache(model, kind, batch, ctx, 8)
        kv = cache.kv

        def timed(fn):
            for _ in range(3):
                fn()
            ts = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1e3)
            ts.sort()
            return ts[len(ts) // 2]

        rows = cache._batch_rows[:batch] if cache._use_rows else None
        us = timed(lambda: kv.gather(0, ctx, cache._tables[:batch], rows=rows, dtype=torch.bfloat16))
        n = 2 * batch * kv.n_head_kv * ctx * kv.head_dim
        src, dst = torch.empty(n, dtype=torch.bfloat16, device="cuda"), torch.empty(n, dtype=torch.bfloat16, device="cuda")
        cp = timed(lambda: dst.copy_(src))
        read = batch * ctx * (kv.vector_bytes(0, 0) + kv.vector_bytes(0, 1)) * kv.n_head_kv
        rec.update(us=round(us, 1), copy_us=round(cp, 1), gb_s_written=round(2 * n / us / 1e3, 1),
                   page_bytes_read=read, ok=True)
    except (torch.OutOfMemoryError, e8kv.E8KVError) as e:
        rec.update(ok=False, error=str(e)[:200])
    finally:
        finish(model, cache)
        del cache
    return emit(rec, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="4 layers, short contexts: a smoke test of every path")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", default="llama3-8b", choices=["llama3-8b", "gemma3-4b"],
                    help="the model's shape (gemma3-4b: caches filled by a prefill; parts main, fit and small)")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: stop starting new cases after this")
    ap.add_argument("--parts", default="main,fit,small",
                    help="main (8 x long, every cache and mode), floor (compiled at 8 x 64), prefill (eager, batch 1: a short and a long "
                         "prompt on an empty cache, 64-token chunks after a long past), chunks (eager, batch 1: --chunks after a long "
                         "past, e8kv by both paths), gather (the gather kernel of one layer against a copy, batch 1 and 8 at long), fit (largest batch at long), small (batch 1, "
                         "short context), again (DynamicCache and e8box:4 eager at 8 x long once more), beam (eager beam-search steps: "
                         "2 x 4 beams at short and long, a forward then reorder_cache), copy (copy.deepcopy of a cache at 1 and 8 x long), save (torch.save / torch.load of a cache at 1 x long)")
    ap.add_argument("--kinds", default="dynamic,static,e8box:4,e8p:2",
                    help="caches of the main and small parts, comma-separated; or ';'-separated when a spec holds "
                         "commas ('dynamic;e8box:4;e8box:4,sink=4')")
    ap.add_argument("--fit-kinds", default="dynamic,static,e8box:4,e8p:2", help="as --kinds")
    ap.add_argument("--fit-from", type=int, default=8, help="first batch tried by the fit search")
    ap.add_argument("--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 512, 2048],
                    help="part chunks: chunk lengths after a past of the long context")
    ap.add_argument("--chunk-ctx", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="part chunks: the pasts (default: the long context)")
    ap.add_argument("--profile", action="store_true",
                    help="main part's compiled cases: GPU kernel time per step by group (torch.profiler), and a "
                         "part 'floor' (every kind compiled at 8 x 64 tokens: the step without long attention)")
    args = ap.parse_args()
    out = open(args.json, "a") if args.json else None
    model = build(args.quick, args.model)
    log("model built:", sum(p.numel() for p in model.parameters()) / 1e9, "G params,",
        torch.cuda.memory_allocated() / 1e9, "GB")
    big, small = (2048, 512) if args.quick else (32768, 8192)
    def kind_list(s):
        return s.split(";") if ";" in s else s.split(",")

    kinds = kind_list(args.kinds)
    parts = args.parts.split(",")

    def go(kind, mode, b, c, steps=args.steps, prof=False):
        if time.time() - T0 > args.budget:
            log("budget spent: skipped", kind, mode, b, c)
            return None
        return measure(model, kind, mode, b, c, steps, out, prof and args.profile)

    if "again" in parts:
        for kind in ("dynamic", "e8box:4"):
            go(kind, "eager", 8, big)
    if "main" in parts:  # the bars' case first: 8 x 32K, every cache and mode
        for kind in kinds:
            go(kind, "eager", 8, big)
        for kind in kinds:
            if kind != "dynamic":
                go(kind, "compiled", 8, big, prof=True)
    if "floor" in parts:  # the compiled step over a short cache: weights, launches, and little attention
        for kind in kinds:
            if kind != "dynamic":
                go(kind, "compiled", 8, 64, prof=True)
    if "fit" in parts:  # the largest batch at `big` (eager steps), then a compiled step at that batch
        tries = [b for b in (8, 12, 16, 20, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 160, 192, 224, 256)
                 if b >= args.fit_from]
        for kind in kind_list(args.fit_kinds):
            last = r = None
            for b in tries:
                r = go(kind, "eager", b, big, steps=5)
                if r is None or not r["ok"]:
                    break
                last = r
            if last is not None:
                rec = {"cache": kind, "largest_batch": last["batch"], "ctx": big, "ms": last["ms"],
                       "tok_s": last["tok_s"], "peak_gb": last["peak_gb"], "device": last["device"],
                       "next_tried_failed": r is not None and not r["ok"]}
                emit(rec, out)
                if kind != "dynamic" and last["batch"] != 8:
                    go(kind, "compiled", last["batch"], big)
    if "small" in parts:
        for b, c in ((1, big), (1, small), (8, small)):
            for kind in kinds:
                go(kind, "eager", b, c)
        for kind in kinds:
            if kind != "dynamic":
                go(kind, "compiled", 1, big)
    if "prefill" in parts:  # eager prefill of a prompt, then 64-token chunks after a long past
        for kind in kinds:
            if kind == "static" or time.time() - T0 > args.budget:
                continue
            for c in (small, big):
                measure_prefill(model, kind, c, 0, out)
            measure_prefill(model, kind, big, 64, out)
    if "gather" in parts:  # the gather kernel alone against a copy: one layer at batch 1 and 8
        for kind in kinds:
            if kind not in ("dynamic", "static"):
                for b in (1, 8):
                    measure_gather(model, kind, big, out, batch=b)
    if "chunks" in parts:  # chunks of 16 .. 2048 tokens after a long past: e8kv's two paths against bf16
        for kind in kinds:
            if kind not in ("dynamic", "static"):
                measure_gather(model, kind, big, out)
        for kind in [k for k in kinds if k not in ("dynamic", "static")][:1]:  # unrecorded: the first use of each path in the process (module loads)
            for path in ("gather", "kernel"):
                measure_prefill(model, kind, big, args.chunks[0], None, reps=1, path=path)
        for ctx in args.chunk_ctx or [big]:
            for chunk in args.chunks:
                for kind in kinds:
                    if kind == "static" or time.time() - T0 > args.budget:
                        continue
                    measure_prefill(model, kind, ctx, chunk, out, reps=5)
                    if kind != "dynamic" and chunk <= 512:
                        measure_prefill(model, kind, ctx, chunk, out, reps=5, path="kernel")
    if "beam" in parts:  # beam search: 2 prompts x 4 beams, a forward and a reorder per step
        for c in (small, big):
            for kind in kinds:
                if kind != "static" and time.time() - T0 <= args.budget:
                    measure_beam(model, kind, 2, 4, c, args.steps, out)
    if "copy" in parts:
        for b in (1, 8):
            for kind in kinds:
                if kind != "static" and time.time() - T0 <= args.budget:
                    measure_copy(model, kind, b, big, out)
    if "save" in parts:  # torch.save / torch.load of a cache at 1 x long, through host memory
        for kind in kinds:
            if kind != "static" and time.time() - T0 <= args.budget:
                measure_save(model, kind, 1, big, out)
    if "again" in parts:
        go("dynamic", "eager", 8, big)
    log("done")


if __name__ == "__main__":
    main()
