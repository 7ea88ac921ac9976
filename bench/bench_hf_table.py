#!/usr/bin/env python3
"""The markdown table of bench/bench_hf_cuda.py's JSON lines (BENCHMARKS.md).
Then, for the cases run with --profile, where a step's time goes: the GPU kernel time per step by group
(torch.profiler) and the rest of the wall time (host work and gaps between kernels).
Usage: python3 bench/bench_hf_table.py bench_hf.jsonl [more.jsonl ...]"""
import json
import sys


def ctx_str(n):
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def table(path):
    """One row per measured case: cache, mode, batch x context, ms per step, tokens/s, peak GB."""
    print("| cache | mode | batch × context | ms per step | tokens/s | peak GB (e8kv's own) |")
    print("|---|---|---|---|---|---|")
    for line in open(path):
        r = json.loads(line)
        if "largest_batch" in r or r.get("mode") == "gather":
            continue
        bc = f"{r['batch']} × {ctx_str(r['ctx'])}"
        if r.get("chunk"):  # the prefill part's chunk rows: `chunk` new tokens after ctx of past
            bc += f" + {r['chunk']}"
        mode = f"{r['mode']} ({r['path']})" if r.get("path") else r["mode"]  # e8kv chunk rows: gather / kernel
        if not r["ok"]:
            print(f"| {r['cache']} | {mode} | {bc} | {r.get('error', 'out of memory')[:60]} | | |")
            continue
        own = f" ({r['cache_gb']:.2f})" if r.get("cache_gb") else ""  # prefill rows have none
        print(f"| {r['cache']} | {mode} | {bc} | {r['ms']:.1f} | {r['tok_s']:.0f} | {r['peak_gb']:.1f}{own} |")


def gather_table(path):
    rows = [json.loads(line) for line in open(path)]
    rows = [r for r in rows if r.get("mode") == "gather" and r.get("ok")]
    if not rows:
        return
    print()
    print("| cache | batch × context | gather µs (one layer, bf16 out) | copy of the same bf16 bytes µs | gather ÷ copy | "
          "GB/s written | page MB read |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cache']} | {r['batch']} × {ctx_str(r['ctx'])} | {r['us']:.1f} | {r['copy_us']:.1f} | "
              f"{r['us'] / r['copy_us']:.2f} | {r['gb_s_written']:.0f} | {r['page_bytes_read'] / 1e6:.1f} |")


def profile_table(path):
    rows = [json.loads(line) for line in open(path)]
    rows = [r for r in rows if r.get("ok") and "profile" in r]
    if not rows:
        return
    print()
    print("| cache | mode | batch × context | wall ms per step | GPU kernels ms | attention | append | matmul | "
          "other kernels | wall − kernels |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["profile"]
        g = p["ms_per_step"]
        cells = " | ".join(f"{g.get(k, 0.0):.2f}" for k in ("attention", "append", "matmul", "other"))
        print(f"| {r['cache']} | {r['mode']} | {r['batch']} × {ctx_str(r['ctx'])} | {r['ms']:.2f} | "
              f"{p['gpu_ms_per_step']:.2f} | {cells} | {r['ms'] - p['gpu_ms_per_step']:.2f} |")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        table(path)
        gather_table(path)
        profile_table(path)
