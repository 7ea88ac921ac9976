"""Joins bench_cuda.cu and bench_sdpa.py JSON lines of one device run into the table of BENCHMARKS.md.
Usage: python3 bench/bench_cuda_table.py CUDA.jsonl SDPA.jsonl"""
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ours, sdpa = load(sys.argv[1]), load(sys.argv[2])
    copy = next(r["copy_gbps"] for r in ours if r["bench"] == "copy")
    dev = ours[0]["device"]
    ref = {(r["shape"], r["batch"], r["ctx"]): r for r in sdpa}
    rows = {}
    for r in ours:
        if r["bench"] == "e8kv_cuda":
            rows.setdefault((r["shape"], r["batch"], r["ctx"]), {})[r["format"]] = r
    print(f"device {dev}; device-to-device copy {copy:.0f} GB/s (read + write)")
    print("| shape | batch × ctx | SDPA bf16 µs | our bf16 µs (÷SDPA) | e8box:4 µs | e8box:4 speed-up vs SDPA "
          "| e8box:4 GB/s (% of copy) | host-synced: SDPA / e8box:4 µs (speed-up) |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2])):
        f = rows[key]
        s = ref.get(key)
        b, e = f.get("bf16"), f.get("e8box:4")
        su = f"{s['us']:.1f}" if s else "–"
        bu = f"{b['us']:.1f} ({b['us'] / s['us']:.2f})" if b and s else (f"{b['us']:.1f}" if b else "–")
        eu = f"{e['us']:.1f}" if e else "–"
        sp = f"{s['us'] / e['us']:.2f}×" if e and s else "–"
        gb = f"{e['gbps']:.0f} ({100 * e['gbps'] / copy:.0f}%)" if e else "–"
        sy = (f"{s['us_sync']:.1f} / {e['us_sync']:.1f} ({s['us_sync'] / e['us_sync']:.2f}×)"
              if e and s and "us_sync" in s and "us_sync" in e else "–")
        print(f"| {key[0]} | {key[1]} × {key[2] // 1024}K | {su} | {bu} | {eu} | {sp} | {gb} | {sy} |")
    print()
    for r in ours:
        if r["bench"] == "e8kv_cuda" and r["batch"] == 32 and r["ctx"] == 131072:
            print(f"{r['shape']} {r['format']}: {r['bytes_per_token_layer']} B/token/layer, encode "
                  f"{r['encode_gbps']:.0f} GB/s of bf16 input ({100 * r['encode_gbps'] / copy:.0f}% of copy), "
                  f"device {r['dev_bytes_measured'] / 1e6:.1f} MB measured vs {r['dev_bytes_accounted'] / 1e6:.1f} "
                  f"MB accounted, {r['tokens_in_80GB'] / 1e6:.2f} M tokens fit in 80 GB ({r['n_layer_model']} layers)")


if __name__ == "__main__":
    main()
