#!/usr/bin/env python3
"""The markdown table of bench/bench_hf_cuda.py's JSON lines (BENCHMARKS.md).
Usage: python3 bench/bench_hf_table.py bench_hf.jsonl [more.jsonl ...]"""
import json
import sys


def table(path):
    """One row per measured case: cache, mode, batch x context, ms per step, tokens/s, peak GB."""
    print("| cache | mode | batch × context | ms per step | tokens/s | peak GB (e8kv's own) |")
    print("|---|---|---|---|---|---|")
    for line in open(path):
        r = json.loads(line)
        if "largest_batch" in r:
            continue
        bc = f"{r['batch']} × {r['ctx'] // 1024}K"
        if not r["ok"]:
            print(f"| {r['cache']} | {r['mode']} | {bc} | out of memory | | |")
            continue
        own = f" ({r['cache_gb']:.2f})" if r["cache_gb"] else ""
        print(f"| {r['cache']} | {r['mode']} | {bc} | {r['ms']:.1f} | {r['tok_s']:.0f} | {r['peak_gb']:.1f}{own} |")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        table(path)
