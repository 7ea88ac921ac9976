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
    print("| shape | batch × ctx | SDPA bf16 µs | our bf16 µs (÷SDPA) | e8box:4 µs (speed-up) | e8box:4 GB/s (% of copy) "
          "| e8p:2 µs (speed-up) | e8p:2 GB/s (% of copy) | e8box:3 µs (speed-up) | e8box:3 GB/s (% of copy) "
          "| k=e8box:4,v=e8box:3 µs (speed-up) | its GB/s (% of copy) "
          "| CUDA graph µs: SDPA / e8box:4 / e8p:2 / e8box:3 (speed-ups) "
          "| host-synced µs: SDPA / e8box:4 / e8p:2 / e8box:3 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def us(r, key="us"):
        return f"{r[key]:.1f}" if r and key in r else "–"

    def ratio(s, r, key="us"):
        return f"{s[key] / r[key]:.2f}×" if s and r and key in s and key in r else "–"

    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2])):
        f = rows[key]
        s = ref.get(key)
        b, e, p, e3 = f.get("bf16"), f.get("e8box:4"), f.get("e8p:2"), f.get("e8box:3")
        m = f.get("k=e8box:4,v=e8box:3")
        bu = f"{b['us']:.1f} ({b['us'] / s['us']:.2f})" if b and s else us(b)
        cells = [key[0], f"{key[1]} × {key[2] // 1024}K", us(s), bu]
        for r in (e, p, e3, m):
            cells.append(f"{us(r)} ({ratio(s, r)})")
            cells.append(f"{r['gbps']:.0f} ({100 * r['gbps'] / copy:.0f}%)" if r else "–")
        cells.append(f"{us(s, 'us_graph')} / {us(e, 'us_graph')} / {us(p, 'us_graph')} / {us(e3, 'us_graph')} "
                     f"({ratio(s, e, 'us_graph')}, {ratio(s, p, 'us_graph')}, {ratio(s, e3, 'us_graph')})")
        cells.append(f"{us(s, 'us_sync')} / {us(e, 'us_sync')} / {us(p, 'us_sync')} / {us(e3, 'us_sync')}")
        print("| " + " | ".join(cells) + " |")
    print()
    for r in ours:
        if r["bench"] == "e8kv_cuda" and r["batch"] == 32 and r["ctx"] == 131072:
            print(f"{r['shape']} {r['format']}: {r['bytes_per_token_layer']} B/token/layer, encode "
                  f"{r['encode_gbps']:.0f} GB/s of bf16 input ({100 * r['encode_gbps'] / copy:.0f}% of copy), "
                  f"device {r['dev_bytes_measured'] / 1e6:.1f} MB measured vs {r['dev_bytes_accounted'] / 1e6:.1f} "
                  f"MB accounted, {r['tokens_in_80GB'] / 1e6:.2f} M tokens fit in 80 GB ({r['n_layer_model']} layers)")


if __name__ == "__main__":
    main()
