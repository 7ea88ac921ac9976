"""Decode speed, cache bytes and (optionally) quality of transformers generate() on your model: DynamicCache
against e8kv caches, on the CPU or on a GPU.

    python -m e8kv.bench [--model ID_OR_DIR | --gguf PATH] [--device cpu|cuda] [--prompt-tokens 512]
                         [--new 64] [--specs f32,e8:4,e8box:4] [--ppl-chunks N [--no-decode]]
                         [--prefix P [--score S]] [--allocate B[,B...]] [--json]

Greedy generation from a prompt of --prompt-tokens tokens of wiki.test.raw (or --text; a repeated sentence
when it is not found); one row per cache (on a GPU also transformers' StaticCache: generate() compiles the
steps of static-shaped caches, e8kv's and StaticCache, not those of a DynamicCache, so StaticCache is the
baseline of a GPU's decode speeds): prefill seconds, decode tokens/s (new tokens / the seconds of
generate() from the prefilled cache, after an untimed warm-up generate of the same kind of cache, two on a
GPU: there generate() compiles the decode steps of e8kv's static-shaped cache, and torch.compile compiles
again at its second call), and the bytes the cache
holds at the end (DynamicCache: its tensors; e8kv: the bytes it allocated, host or device). --device cuda
(default when --model is given and a GPU is usable) puts the model on the GPU in bf16 and the caches in
E8KVCudaCache (specs: e8box:4, e8box:3, e8p:2, bf16, f16 and the grammar over them; separate specs that
hold commas with ';'). --ppl-chunks N adds e8kv.hf.perplexity over N chunks of --ctx tokens of the same
text: PPL, KLD and top-1 against the baseline (CPU: the f32 e8kv cache; GPU: the model's own attention over
a DynamicCache). --prefix P makes that the protocol of eviction: chunks of P + --score tokens, the
prefix prompted (attended exactly, then evicted when a spec says evict=SCORER:F, and coded), the score
tokens read the compressed prefix; each row also gets the compression of the prefix (f16 bytes / bytes held)
and the tokens a KV head kept. --allocate 2.5,3.0 adds e8kv.hf.allocate's specs at those mean rates (per-layer
e8box:4 / e8box:3 / e8p:2 by measured sensitivity, probed on the end of the text) as rows of their own.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional, Sequence

import torch

CPU_SPECS = "f32,balanced,e8:4,e8box:4,aggressive"
# the default spec (hf.CUDA_DEFAULT_SPEC) first; a model whose RoPE center=rope cannot turn by (hf.ModelShape's
# rope_centre_problem) gets these less center=rope
CUDA_SPECS = ("bf16;e8box:4,sink=4,center=rope;e8box:4,sink=4;e8box:3,sink=4,center=rope;e8box:3,sink=4;"
              "e8p:2,sink=4,center=rope;e8p:2,sink=4")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(model: Any, ids: torch.Tensor, specs: Sequence[str], *, new: int = 64, warmup: bool = True,
        ppl_ids: Optional[Sequence[int]] = None, ppl_chunks: int = 0, n_ctx: int = 512,
        decode: bool = True, prefix: int = 0, score: int = 512) -> list[dict]:
    """The rows of the table for `model` (on the CPU or a CUDA device) and a prompt `ids` (1, n): DynamicCache
    first, then each spec. With ppl_ids and ppl_chunks, each row also gets the perplexity protocol's ppl, kld
    and top1 (e8kv.hf.perplexity over ppl_chunks chunks of n_ctx tokens). decode=False: no generate(), the
    rows hold the perplexity alone. prefix > 0: the perplexity in prefix mode (hf.perplexity's prefix=, score=),
    with the compression of the prefix and the tokens kept per row."""
    from transformers import DynamicCache, StaticCache

    from . import hf
    dev = hf._model_device(model)
    gpu = dev.type == "cuda"
    ids = ids.to(dev)
    arg = hf.cache_arg(model)  # "cache" or "past_key_values", as this transformers calls it
    cap = ids.shape[1] + new

    def make(spec: str) -> Any:
        if spec == "DynamicCache":
            return DynamicCache(config=model.config)
        if spec == "StaticCache":
            return StaticCache(config=model.config, max_cache_len=cap)
        if gpu:
            return hf.E8KVCudaCache(model.config, spec, device=dev, max_batch_size=1, max_cache_len=cap)
        return hf.E8KVCache(model.config, spec)

    def generate(cache: Any, n: int) -> torch.Tensor:
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **{arg: cache},
                              max_new_tokens=n, min_new_tokens=n, do_sample=False)

    # on a GPU generate() compiles the steps of a static-shaped cache (e8kv's, StaticCache) and not those of a
    # DynamicCache: StaticCache (bf16, compiled the same way) is the baseline of the decode speeds there
    names = ["DynamicCache", *["StaticCache"] * gpu, *specs]
    # the rows perplexity scores: the specs, and on a GPU DynamicCache (its baseline, "dynamic"); the CPU
    # protocol's baseline is the f32 e8kv cache, a row of its own below
    scored = [n for n in names if n != "StaticCache" and (gpu or n != "DynamicCache")]
    rows = [] if decode else [{"cache": n, "device": str(dev)} for n in scored]
    for spec in names if decode else ():
        with torch.no_grad():
            # untimed: module loads, and on a GPU the compilation of the decode steps (torch.compile compiles
            # again at its second call, with dynamic shapes: two warm-ups there)
            for _ in range((2 if gpu else 1) if warmup else 0):
                cache = make(spec)
                model(input_ids=ids[:, :-1], **{arg: cache}, use_cache=True, logits_to_keep=1)
                generate(cache, min(new, 4))
                if isinstance(cache, hf.E8KVCudaCache):
                    cache.detach(model.config)
            # the prompt but its last token (prefill), then generate from that cache: only decode steps
            cache = make(spec)
            _sync(dev)
            t0 = time.perf_counter()
            model(input_ids=ids[:, :-1], **{arg: cache}, use_cache=True, logits_to_keep=1)
            _sync(dev)
            t_prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = generate(cache, new)
            _sync(dev)
            t_decode = time.perf_counter() - t0
        if isinstance(cache, hf.E8KVCudaCache):
            cache.detach(model.config)
            cache.check()  # a NaN/Inf or out-of-range value appended: an E8KVError
        n_new = out.shape[1] - ids.shape[1]
        rows.append({"cache": spec, "device": str(dev), "prompt_tokens": ids.shape[1], "new_tokens": n_new,
                     "prefill_s": round(t_prefill, 4), "decode_tokens_per_s": round(n_new / t_decode, 3),
                     "cache_bytes": hf.cache_sizes(cache)[0], "dtype": str(next(model.parameters()).dtype)})
    if ppl_ids is not None and ppl_chunks:
        q = hf.perplexity(model, ppl_ids, list(specs), n_ctx=n_ctx, n_chunks=ppl_chunks, prefix=prefix, score=score)
        for r in rows:
            if r["cache"] not in scored:
                continue
            v = q["dynamic" if r["cache"] == "DynamicCache" else r["cache"]]
            r.update(ppl=round(v["ppl"], 4), kld=round(v["kld"], 6), top1=round(v["top1"], 4),
                     bits_per_value=round(v["bits_per_value"], 4), ppl_tokens=v["count"])
            if "compression" in v:
                r.update(compression=round(v["compression"], 3), kept=v["kept"])
        if not gpu:
            rows.append({"cache": "f32 (perplexity baseline)", "device": str(dev), "ppl": round(q["f32"]["ppl"], 4),
                         "kld": 0.0, "top1": 1.0, "ppl_tokens": q["f32"]["count"]})
    return rows


def load_model(gguf: str, model_id: Optional[str], device: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode on `device`) of a transformers id or directory, else of a GGUF file (the
    command-line tools' --model / --gguf)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if model_id:
        tok = AutoTokenizer.from_pretrained(model_id)
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype)
    else:
        d, f = os.path.split(gguf)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype)
    return tok, model.to(device).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/e8kv/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--model", help="a transformers model id or directory (from_pretrained) instead of --gguf")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda with --model when a GPU is usable")
    ap.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
                                                   "wikitext-2-raw", "wiki.test.raw"))
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--specs", help=f"default: {CPU_SPECS} (CPU), {CUDA_SPECS} (GPU); ';' between specs that "
                                    "hold commas")
    ap.add_argument("--ppl-chunks", type=int, default=0, help="also the perplexity protocol over N chunks")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per perplexity chunk")
    ap.add_argument("--prefix", type=int, default=0, help="perplexity in prefix mode: P prefix tokens")
    ap.add_argument("--score", type=int, default=512, help="prefix mode: tokens scored after the prefix")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                    help="default: float32 on the CPU, bfloat16 on a GPU")
    ap.add_argument("--no-warmup", action="store_true", help="time the first generate() of each cache")
    ap.add_argument("--no-decode", action="store_true", help="no generate(): the perplexity rows alone")
    ap.add_argument("--allocate", help="mean rates B[,B...] (bits per value): also e8kv.hf.allocate's per-layer "
                                       "GPU formats at each, probed on the text's last 4 x --ctx tokens (where "
                                       "the perplexity chunks, from its start, do not reach)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.no_decode and not a.ppl_chunks:
        ap.error("--no-decode needs --ppl-chunks N")
    if a.prefix and not a.ppl_chunks:
        ap.error("--prefix needs --ppl-chunks N")
    from . import core
    if a.threads:
        torch.set_num_threads(a.threads)
    device = a.device or ("cuda" if a.model and torch.cuda.is_available() and core.cuda_available() else "cpu")
    dtype = getattr(torch, a.dtype or ("bfloat16" if device == "cuda" else "float32"))
    tok, model = load_model(a.gguf, a.model, device, dtype)
    text = open(a.text, encoding="utf-8").read(4_000_000 if a.ppl_chunks or a.allocate else 200_000) \
        if os.path.exists(a.text) else "The cat sat on the mat. " * 4000
    all_ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    ids = all_ids[:, : a.prompt_tokens]
    spec_text = a.specs or (CUDA_SPECS if device == "cuda" else CPU_SPECS)
    specs = spec_text.split(";") if ";" in spec_text else spec_text.split(",")
    if not a.specs and device == "cuda":
        from . import hf
        if hf.ModelShape(model.config).rope_centre_problem is not None:
            specs = list(dict.fromkeys(s.replace(",center=rope", "") for s in specs))
    if a.allocate:
        from . import hf
        n_probe = 4 * a.ctx
        if all_ids.shape[1] < (a.ppl_chunks + 4) * a.ctx:
            ap.error(f"--allocate: the text has {all_ids.shape[1]} tokens, fewer than the perplexity chunks and "
                     f"the probes need apart ({(a.ppl_chunks + 4) * a.ctx})")
        rates = [float(x) for x in a.allocate.split(",")]
        got = hf.allocate(model, None, all_ids[0, -n_probe:].tolist(), rates, n_ctx=a.ctx, probe_chunks=4,
                          progress=not a.json)
        for b, spec in zip(rates, got):
            print(f"allocate {b:g} bits per value: {spec}", file=sys.stderr if a.json else sys.stdout, flush=True)
        specs = [*specs, *got]
    rows = run(model, ids, specs, new=a.new, warmup=not a.no_warmup, ppl_ids=all_ids[0].tolist(),
               ppl_chunks=a.ppl_chunks, n_ctx=a.ctx, decode=not a.no_decode, prefix=a.prefix, score=a.score)
    for r in rows:
        if a.json:
            print(json.dumps(r), flush=True)
            continue
        line = f"{r['cache']:26s}"
        if "prefill_s" in r:
            line += (f" prefill {r['prefill_s']:8.3f} s  decode {r['decode_tokens_per_s']:8.2f} tok/s  "
                     f"cache {r['cache_bytes'] / 2**20:9.2f} MiB")
        if "ppl" in r:
            line += f"  ppl {r['ppl']:9.4f}  kld {r['kld']:.5f}  top1 {100 * r['top1']:6.2f}%"
        if "compression" in r:
            line += f"  compression {r['compression']:6.2f}x  kept {r['kept']}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
