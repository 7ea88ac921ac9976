"""PyTorch SDPA bf16 decode attention, the baseline of bench/bench_cuda.cu (same shapes, same run).

One query token per sequence, torch.nn.functional.scaled_dot_product_attention with enable_gqa, bf16
K/V of (batch, n_head_kv, ctx, head_dim); CUDA events around each call, 5 warm-up calls, median of 30, calls
queued back to back (us), with the host waiting for each call (us_sync), and 20 calls captured into one CUDA
graph and replayed (us_graph: the graph's time / 20, median of 10 replays after 2 warm-up replays).
Usage: python3 bench/bench_sdpa.py [--json FILE] [--quick] [--only SHAPE/BATCH/CTX,...]"""
import argparse
import json

import torch
import torch.nn.functional as F


def timed(fn, sync, warm=5, rep=30):
    """median µs of one call: CUDA events around each call; queued back to back (sync=False) or with the
    host waiting for each call (sync=True), as bench/bench_cuda.cu does"""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(warm + rep)]
    for e0, e1 in ev:
        e0.record()
        fn()
        e1.record()
        if sync:
            e1.synchronize()
    torch.cuda.synchronize()
    times = sorted(e0.elapsed_time(e1) for e0, e1 in ev[warm:])
    return times[len(times) // 2] * 1e3


def graphed(fn, n=20, rep=10):
    """median µs of one call inside a CUDA graph of n calls (as bench/bench_cuda.cu's us_graph)"""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    times = []
    for i in range(rep + 2):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        if i >= 2:
            times.append(e0.elapsed_time(e1))
    times.sort()
    return times[len(times) // 2] * 1e3 / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="these cases only, e.g. llama3-8b/8/32768,llama3-8b/1/131072")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    out = open(a.json, "w") if a.json else None
    dev = torch.cuda.get_device_name()
    shapes = [("llama3-8b", 8, 4, 128), ("smollm2", 3, 3, 64)]
    if only is not None:  # Gemma 3's head_dim 256 when asked for
        shapes += [("gemma3-1b", 1, 4, 256), ("gemma3-4b", 4, 2, 256), ("gemma3-12b", 8, 2, 256)]
    batches = (1, 8) if a.quick else (1, 8, 32)
    ctxs = (4096, 32768) if a.quick else (4096, 32768, 131072)
    for name, kv, g, d in shapes:
        for b in batches:
            for ctx in ctxs:
                if only is not None and f"{name}/{b}/{ctx}" not in only:
                    continue
                q = torch.randn(b, kv * g, 1, d, dtype=torch.bfloat16, device="cuda")
                k = torch.randn(b, kv, ctx, d, dtype=torch.bfloat16, device="cuda")
                v = torch.randn(b, kv, ctx, d, dtype=torch.bfloat16, device="cuda")
                fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                us, us_sync = (timed(fn, sync) for sync in (False, True))
                us_graph = graphed(fn)
                nbytes = 2 * b * kv * ctx * d * 2
                row = dict(bench="sdpa", device=dev, torch=torch.__version__, shape=name, batch=b, ctx=ctx,
                           us=round(us, 2), us_sync=round(us_sync, 2), us_graph=round(us_graph, 2), gbps=round(nbytes / (us * 1e-6) / 1e9, 1))
                print(f"{name:9s} sdpa bf16 batch {b:2d} ctx {ctx:6d}: {us:9.1f} us ({us_sync:7.1f} synced, {us_graph:7.1f} graph) {row['gbps']:7.1f} GB/s",
                      flush=True)
                if out:
                    out.write(json.dumps(row) + "\n")
                del q, k, v
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
