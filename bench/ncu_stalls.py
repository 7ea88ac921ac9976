"""Warp-stall samples per SASS instruction from `ncu --section SourceCounters --page source --print-source sass
--csv` (bench/run_e8p.sh NCU_SRC=V writes it as src.csv.gz): the totals per stall reason, the instructions with
the most samples of one reason, and the share of samples per straight-line stretch (cut at branches), with the
instructions each stretch executes per 16-token sub-tile of Llama-3-8B 8 x 32K (131,072 sub-tiles).
Usage: python3 bench/ncu_stalls.py src.csv.gz [REASON (e.g. stall_long_sb; default all samples)] [N]"""
import csv
import gzip
import io
import sys


def main():
    lines = gzip.open(sys.argv[1], "rt").read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"Address"'))
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    ix = {k: i for i, k in enumerate(rows[0])}
    rows = rows[1:]
    all_s = ix["Warp Stall Sampling (All Samples)"]
    key = ix[sys.argv[2]] if len(sys.argv) > 2 else all_s
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    ex = ix["Instructions Executed"]
    tot = sum(int(r[all_s]) for r in rows)
    print("samples", tot, "instructions executed", sum(int(r[ex] or 0) for r in rows))
    for c in sorted(k for k in ix if k.startswith("stall_") and "Not Issued" not in k):
        v = sum(int(r[ix[c]]) for r in rows)
        if v:
            print(f"  {c:24s} {v:7d} {100 * v / tot:5.1f}%")
    for i in sorted(range(len(rows)), key=lambda i: -int(rows[i][key]))[:n]:
        r = rows[i]
        print(f"{i:5d} {r[ix['Source']].strip()[:60]:60s} {r[key]:>6s} exec {r[ex]}")
    s = e = first = 0
    for i, r in enumerate(rows):
        s += int(r[all_s])
        e += int(r[ex] or 0)
        src = r[ix["Source"]].strip()
        if "BRA" in src or "BSYNC" in src or i == len(rows) - 1:
            if s > tot / 100:
                print(f"[{first:5d}, {i:5d}] {100 * s / tot:5.1f}% of samples, {e / 131072:6.1f} instructions per sub-tile")
            first, s, e = i + 1, 0, 0


if __name__ == "__main__":
    main()
