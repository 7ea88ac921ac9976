#!/usr/bin/env python3
"""Per-layer GPU formats by measured sensitivity (e8kv.alloc) on a GGUF model, with `e8kv ppl`:

1. probes on a text that is not evaluated (default Tiny Shakespeare): every layer e8box:4, then each layer
   alone with e8p:2, with K e8box:3, with V e8box:3 (e8kv.alloc.probe_specs), the KLD of each;
2. for each mean rate asked, the choice per layer with the least summed KLD rise (e8kv.alloc.choose);
3. the evaluation on another text (default wiki.test.raw): the allocated specs beside the uniform ones of
   nearby rates, every spec in one `e8kv ppl` run.

The CPU library's e8box and e8p codes are bit for bit the CUDA cache's, so `e8kv ppl` measures the quality
the GPU gets from a spec. Usage:

    python3 bench/gpu_alloc.py --e8kv build/e8kv --bits 2.5,2.75,3.25,3.75 [--opts sink=4,center=rope]
        [--probe-text data/tinyshakespeare/input.txt --probe-chunks 4] [--eval-text ... --eval-chunks 16]
        [--ctx 512] [--json OUT.json] [--probes-json FILE (reuse the probes of an earlier run)]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from e8kv import alloc  # noqa: E402

MAX_SPECS = 31  # E8KV_PPL_MAX_SPECS (32) less the f32 baseline


def ppl(e8kv: str, text: str, ctx: int, chunks: int, threads: int, specs: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for i in range(0, len(specs), MAX_SPECS):
        cmd = [e8kv, "ppl", "-f", text, "--ctx", str(ctx), "--chunks", str(chunks), "--threads", str(threads),
               "--json"]
        for s in specs[i:i + MAX_SPECS]:
            cmd += ["--kv", s]
        t = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        for line in r.stdout.splitlines():
            if line.strip():
                rec = json.loads(line)
                out[rec["spec"]] = rec
        print(f"  e8kv ppl: {min(len(specs), i + MAX_SPECS)}/{len(specs)} specs, {time.time() - t:.0f} s",
              file=sys.stderr)
    return out


def check_shape(res: dict[str, dict], specs: list[str], n_layer: int, head_dim: int) -> None:
    """The model `e8kv ppl` ran is the one --n-layer and --head-dim describe: the base's rate is e8box:4's at
    head_dim, and the last layer's e8p:2 probe moves the mean rate by 1/n_layer of the difference (its rate,
    printed to 4 decimals, tells n_layer apart from n_layer +- 1 at any head_dim)."""
    top, low = alloc.CHOICES[0], alloc.CHOICES[-1]
    for spec, choice in ((specs[0], [top] * n_layer), (specs[-3], [top] * (n_layer - 1) + [low])):
        want, got = alloc.mean_bits(choice, head_dim), res[spec]["bits_per_value"]
        if abs(got - want) > 5e-4:
            raise SystemExit(f"gpu_alloc: '{spec}' measured {got} bits per value, {want:.4f} for --n-layer {n_layer} "
                             f"--head-dim {head_dim}: give the model's own")


def main() -> int:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--e8kv", default=os.path.join(root, "build", "e8kv"))
    ap.add_argument("--bits", default="2.5,2.75,3.25,3.75")
    ap.add_argument("--opts", default="sink=4,center=rope", help="cache options of every spec")
    ap.add_argument("--probe-text", default=os.path.join(root, "data", "tinyshakespeare", "input.txt"))
    ap.add_argument("--probe-chunks", type=int, default=4)
    ap.add_argument("--eval-text", default=os.path.join(root, "data", "wikitext-2-raw", "wiki.test.raw"))
    ap.add_argument("--eval-chunks", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--probe-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64, help="the model's head_dim (SmolLM2: 64; checked)")
    ap.add_argument("--n-layer", type=int, default=30, help="the model's layers (SmolLM2: 30; checked)")
    ap.add_argument("--probes-json", help="reuse the probe KLDs of an earlier --json")
    ap.add_argument("--json", help="write probes, choices and evaluation here")
    a = ap.parse_args()

    specs = alloc.probe_specs(a.n_layer, a.opts)
    if a.probes_json:
        kld = json.load(open(a.probes_json))["probe_kld"]
    else:
        print(f"probes: {len(specs)} specs on {a.probe_text}, {a.probe_chunks} chunks of {a.probe_ctx}",
              file=sys.stderr)
        res = ppl(a.e8kv, a.probe_text, a.probe_ctx, a.probe_chunks, a.threads, specs)
        check_shape(res, specs, a.n_layer, a.head_dim)
        kld = [res[s]["kld"] for s in specs]
    base = kld[0]
    print(f"probe base (every layer e8box:4) KLD {base:.5f}; rise per layer (e8p:2 / K e8box:3 / V e8box:3):")
    for layer in range(a.n_layer):
        r = [kld[1 + 3 * layer + j] - base for j in range(3)]
        print(f"  layer {layer:2d}: {r[0]:+.5f} {r[1]:+.5f} {r[2]:+.5f}")
    o = "," + a.opts if a.opts else ""
    uniform = [f"e8p:2{o}", f"e8box:3{o}", f"k=e8box:4,v=e8box:3{o}", f"e8box:4{o}"]
    chosen = {}
    for b in (float(x) for x in a.bits.split(",")):
        ch = alloc.choose(kld, a.n_layer, a.head_dim, b)
        chosen[b] = {"choice": ch, "spec": alloc.spec_of(ch, a.opts), "bits": alloc.mean_bits(ch, a.head_dim)}
        print(f"mean {b}: {chosen[b]['bits']:.4f} bits, {chosen[b]['spec']}")
    ev_specs = ["f16", *uniform, *(c["spec"] for c in chosen.values())]
    print(f"evaluation: {len(ev_specs)} specs on {a.eval_text}, {a.eval_chunks} chunks of {a.ctx}", file=sys.stderr)
    ev = ppl(a.e8kv, a.eval_text, a.ctx, a.eval_chunks, a.threads, ev_specs)
    print("\n| spec | bits/value | eff. bits | PPL | KLD | top-1 % |\n|---|---:|---:|---:|---:|---:|")
    for s in ev_specs:
        r = ev[s]
        name = next((f"auto {b}" for b, c in chosen.items() if c["spec"] == s), s)
        print(f"| {name} | {r['bits_per_value']:.4f} | {r['eff_bits_per_value']:.4f} | {r['ppl']:.4f} | "
              f"{r['kld']:.5f} | {100 * r['top1']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"probe_specs": specs, "probe_kld": kld, "chosen": {str(b): c for b, c in chosen.items()},
                       "eval": ev, "args": vars(a)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
