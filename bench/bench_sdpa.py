"""PyTorch SDPA bf16 decode attention, the baseline of bench/bench_cuda.cu (same shapes, same run).

One query token per sequence, torch.nn.functional.scaled_dot_product_attention with enable_gqa, bf16
K/V of (batch, n_head_kv, ctx, head_dim); CUDA events, 5 warm-up calls, median of 30.
Usage: python3 bench/bench_sdpa.py [--json FILE] [--quick]"""
import argparse
import json

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    out = open(a.json, "w") if a.json else None
    dev = torch.cuda.get_device_name()
    shapes = [("llama3-8b", 8, 4, 128), ("smollm2", 3, 3, 64)]
    batches = (1, 8) if a.quick else (1, 8, 32)
    ctxs = (4096, 32768) if a.quick else (4096, 32768, 131072)
    for name, kv, g, d in shapes:
        for b in batches:
            for ctx in ctxs:
                q = torch.randn(b, kv * g, 1, d, dtype=torch.bfloat16, device="cuda")
                k = torch.randn(b, kv, ctx, d, dtype=torch.bfloat16, device="cuda")
                v = torch.randn(b, kv, ctx, d, dtype=torch.bfloat16, device="cuda")
                for _ in range(5):
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                times = []
                for _ in range(30):
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    e1.record()
                    e1.synchronize()
                    times.append(e0.elapsed_time(e1))
                us = sorted(times)[len(times) // 2] * 1e3
                nbytes = 2 * b * kv * ctx * d * 2
                row = dict(bench="sdpa", device=dev, torch=torch.__version__, shape=name, batch=b, ctx=ctx,
                           us=round(us, 2), gbps=round(nbytes / (us * 1e-6) / 1e9, 1))
                print(f"{name:9s} sdpa bf16 batch {b:2d} ctx {ctx:6d}: {us:9.1f} us {row['gbps']:7.1f} GB/s",
                      flush=True)
                if out:
                    out.write(json.dumps(row) + "\n")
                del q, k, v
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
