#!/usr/bin/env python3
"""What budget= costs a long generation: a text streamed token by token through transformers into e8kv's CPU
caches (E8KVCache, the C cache: budget=N evicts at append once a layer holds more than N + a page), each
spec in lockstep with the f32 cache of the same model, which keeps every token. After a prompt of --prompt
tokens, every later token is one forward of one token; its next-token NLL and KLD against the f32 cache
are summed over the tokens at positions --from and later (where the budget caches have dropped tokens).

    python3 bench/stream_ppl.py [--tokens 2048] [--prompt 256] [--from 1024] [--specs 'f32,sink=4,evict=stream:0,budget=512;...']
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import e8kv.hf as hf  # noqa: E402
from e8kv.bench import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/e8kv/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(HERE, "..", "data", "wikitext-2-raw", "wiki.test.raw"))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--from", dest="start", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--specs", default="f32,sink=4,evict=stream:0,budget=512;f32,sink=4,evict=keykey:0,budget=512;"
                                       "e8:4,sink=4,evict=keykey:0,budget=512;e8:4,sink=4")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tok, model = load_model(a.gguf, None, "cpu", torch.float32)
    ids = tok(open(a.text, encoding="utf-8").read(400_000), add_special_tokens=False)["input_ids"][:a.tokens]
    specs = a.specs.split(";")
    arg = hf.cache_arg(model)
    caches = {s: hf.E8KVCache(model.config, s, n_ctx=a.tokens) for s in ["f32", *specs]}
    acc = hf._PplAcc(list(caches))  # the f32 cache, first, is each token's baseline
    t0 = time.time()
    with torch.no_grad():
        x = torch.tensor([ids[:a.prompt]])
        logits = {s: model(input_ids=x, **{arg: c}, use_cache=True).logits[:, -1:] for s, c in caches.items()}
        for p in range(a.prompt, len(ids)):
            if p >= a.start:
                for s, c in caches.items():
                    acc.add(s, logits[s], torch.tensor([ids[p]]), c.n_bytes, c.bits_per_value)
                acc.end_chunk()
            if p + 1 == len(ids):
                break
            x = torch.tensor([[ids[p]]])
            logits = {s: model(input_ids=x, **{arg: c}, use_cache=True).logits[:, -1:] for s, c in caches.items()}
            if p % 256 == 0:
                print(f"[{time.time() - t0:6.1f} s] position {p}", file=sys.stderr, flush=True)
    res = acc.result()
    for s, c in caches.items():
        r = res[s]
        print(json.dumps({"spec": s, "tokens": len(ids), "prompt": a.prompt, "scored_from": a.start,
                          "count": r["count"], "ppl": round(r["ppl"], 4), "kld": round(r["kld"], 5),
                          "top1": round(r["top1"], 4), "held_layer0": c.rows[0].n_kept(0), "n_bytes": c.n_bytes}))


if __name__ == "__main__":
    main()
