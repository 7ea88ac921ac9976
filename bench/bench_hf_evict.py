#!/usr/bin/env python3
"""Decode after a real prefill, with and without eviction, through transformers on the GPU: the
Llama-3-8B-shaped model of bench_hf_cuda.py (random bf16 weights), a prompt of random token ids (batch x
ctx) prefilled in one eager forward (so an evicting cache scores and evicts it), then compiled decode steps
(torch.compile mode "reduce-overhead", fullgraph), one new token per sequence per step.
Caches: StaticCache (ctx + room), e8kv's CUDA cache without eviction (ctx + room), and evicting ones sized
for the tokens they keep (kept + room: the memory the eviction saves is not allocated); with budget=N, at
most what a row may hold (N + a page: e8kv.evict's hold), so that the decode steps timed drop pages.
Per case: prefill seconds, ms per decode step (median of --steps after 4 warm-up steps, the host waiting
for each), the cache's bytes (StaticCache: its tensors; e8kv: its device allocation), tokens kept.
Random weights: the figures are the speed and memory of the shapes, not a quality.
--profile N: then N more steps under torch.profiler (bench_hf_cuda.profile_steps): per step the GPU kernel
time by group and its longest kernels, the wall time, and the host's busiest operations.
Usage: python3 bench/bench_hf_evict.py [--batch 8] [--ctx 32768] [--kinds 'static;e8box:4;e8box:4,evict=snapkv:0.75']
       [--profile 5]"""
import argparse
import gc
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_hf_cuda import build, log, profile_steps  # noqa: E402
import e8kv.evict  # noqa: E402
import e8kv.hf  # noqa: E402
from transformers import StaticCache  # noqa: E402


def case(model, kind, batch, ctx, steps, room=64, n_prof=0):
    cfg = model.config
    rec = {"cache": kind, "batch": batch, "ctx": ctx, "device": torch.cuda.get_device_name()}
    ids = torch.randint(0, cfg.vocab_size, (batch, ctx), generator=torch.Generator().manual_seed(0)).cuda()
    cache = None
    try:
        if kind == "static":
            cfg._attn_implementation = "sdpa"
            cache = StaticCache(config=cfg, max_cache_len=ctx + room)
            kept = ctx
        else:
            ev, _ = e8kv.evict.parse(kind)
            kept = ev.kept(ctx, 0, 16) if ev else ctx
            cap = kept + room
            if ev is not None and ev.budget:
                cap = min(cap, ev.hold(0, 16))
            cache = e8kv.hf.E8KVCudaCache(cfg, kind, device="cuda", max_batch_size=batch, max_cache_len=cap)
        arg = e8kv.hf.cache_arg(model)
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids, **{arg: cache}, use_cache=True, logits_to_keep=1)
        torch.cuda.synchronize()
        rec["prefill_s"] = round(time.perf_counter() - t, 3)
        del ids
        gc.collect()
        torch.cuda.empty_cache()
        torch._dynamo.reset()
        fn = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        tok = torch.full((batch, 1), 17, dtype=torch.long, device="cuda")
        with torch.no_grad():
            t = time.time()
            for _ in range(4):
                fn(input_ids=tok, **{arg: cache}, use_cache=True)
            torch.cuda.synchronize()
            rec["warmup_s"] = round(time.time() - t, 1)
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                fn(input_ids=tok, **{arg: cache}, use_cache=True)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            if n_prof:
                rec["profile"] = profile_steps(lambda: fn(input_ids=tok, **{arg: cache}, use_cache=True), n_prof)
        times.sort()
        ms = 1e3 * times[len(times) // 2]
        nbytes = e8kv.hf.cache_sizes(cache)[0]
        rec.update(ms=round(ms, 3), tok_s=round(batch / ms * 1e3, 1), cache_gb=round(nbytes / 1e9, 3), kept=kept,
                   ok=True)
        if isinstance(cache, e8kv.hf.E8KVCudaCache):
            cache.check()
            if cache._hold:
                cache._sync_pads()
                rec.update(hold=cache._hold, dropped=cache._budget_dropped[0])
    except torch.OutOfMemoryError:
        rec.update(ok=False, error="out of memory")
    finally:
        if isinstance(cache, e8kv.hf.E8KVCudaCache):
            cache.detach(cfg)
        cfg._attn_implementation = "sdpa"
        del cache
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kinds", default="static;e8box:4;e8box:4,evict=snapkv:0.75")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: stop starting new cases after this")
    ap.add_argument("--json")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="N more steps under torch.profiler")
    a = ap.parse_args()
    t0 = time.time()
    model = build(False)
    log("model built", torch.cuda.get_device_name())
    for kind in a.kinds.split(";"):
        if time.time() - t0 > a.budget:
            log("budget spent: not run", kind)
            continue
        rec = case(model, kind, a.batch, a.ctx, a.steps, n_prof=a.profile)
        log(json.dumps(rec))
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
