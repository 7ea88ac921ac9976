"""Decode speed and cache bytes of transformers generate(): DynamicCache against e8kv caches.

    python -m e8kv.bench [--gguf PATH] [--prompt-tokens 512] [--new 64] [--specs f32,e8:4,e8box:4] [--json]

Greedy generation from a prompt of --prompt-tokens tokens of wiki.test.raw (or a repeated sentence when it
is not found); one row per cache: prefill seconds, decode tokens/s (new tokens / the seconds of generate()
from the prefilled cache), and the bytes the cache holds at the end (DynamicCache: its tensors; e8kv:
e8kv_cache_bytes).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch


def _cache_bytes(cache) -> int:
    from .hf import E8KVCache
    if isinstance(cache, E8KVCache):
        return cache.n_bytes
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/e8kv/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
                                                   "wikitext-2-raw", "wiki.test.raw"))
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--specs", default="f32,balanced,e8:4,e8box:4,aggressive")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from . import hf
    if a.threads:
        torch.set_num_threads(a.threads)
    d, f = os.path.split(a.gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=getattr(torch, a.dtype)).eval()
    text = open(a.text, encoding="utf-8").read(200000) if os.path.exists(a.text) else "The cat sat on the mat. " * 4000
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"][:, : a.prompt_tokens]
    rows, arg = [], hf.cache_arg(model)  # "cache" or "past_key_values", as this transformers calls it
    for spec in ["DynamicCache", *a.specs.split(",")]:
        def make():
            return DynamicCache(config=model.config) if spec == "DynamicCache" else hf.E8KVCache(model.config, spec)
        # the prompt but its last token (prefill), then generate from that cache: only decode steps are timed
        with torch.no_grad():
            cache = make()
            t0 = time.perf_counter()
            model(input_ids=ids[:, :-1], **{arg: cache}, use_cache=True, logits_to_keep=1)
            t_prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **{arg: cache},
                                 max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False)
            t_decode = time.perf_counter() - t0
        n_new = out.shape[1] - ids.shape[1]
        r = {"cache": spec, "prompt_tokens": ids.shape[1], "new_tokens": n_new, "prefill_s": round(t_prefill, 3),
             "decode_tokens_per_s": round(n_new / t_decode, 3),
             "cache_bytes": _cache_bytes(cache), "torch_threads": torch.get_num_threads(), "dtype": a.dtype}
        rows.append(r)
        if a.json:
            print(json.dumps(r), flush=True)
        else:
            print(f"{spec:14s} prefill {r['prefill_s']:7.2f} s  decode {r['decode_tokens_per_s']:7.2f} tok/s  "
                  f"cache {r['cache_bytes'] / 2**20:8.2f} MiB", flush=True)


if __name__ == "__main__":
    main()
