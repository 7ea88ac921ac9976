"""Passkey recall through transformers (the prompts of `e8kv recall`, tools/cmd_recall.c): a 5-digit key
hidden at a depth of 0..100% of a filler text of about --ctx tokens, the question at the end; the prompt is
prefilled into the cache (on a GPU an E8KVCudaCache, which evicts there when the spec says evict=SCORER:F),
and the greedy answer's first run of digits must be the key. Accuracy per spec and depth, against
transformers' own DynamicCache ("dynamic") on the same prompts.

    python -m e8kv.recall [--model ID_OR_DIR | --gguf PATH] [--ctx 1024] [--depths 5] [--trials 4]
                          [--specs 'dynamic;e8box:4,sink=4;e8box:4,sink=4,evict=snapkv:0.5'] [--json]

The prompts are those of `e8kv recall` for the same --ctx, --depths, --trials and --seed (same text, same
keys), tokenised by the model's tokenizer; SmolLM2's tokenizer gives the engine's token ids.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any, Iterator, Optional, Sequence

import torch

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
         "you about the important information there.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = " What is the pass key? The pass key is"
ANSWER_TOKENS = 8
_M64 = (1 << 64) - 1


def passkey(seed: int, depth_index: int, trial: int) -> str:
    """The key of (seed, depth, trial): 10000..99999, the mixing of tools/cmd_recall.c in 64-bit arithmetic."""
    x = (seed * 0x9E3779B97F4A7C15 + depth_index * 0xBF58476D1CE4E5B9 + trial * 0x94D049BB133111EB) & _M64
    x ^= x >> 31
    x = (x * 0xD6E8FEB86659FD93) & _M64
    x ^= x >> 29
    return f"{10000 + x % 90000:05d}"


def depths(n: int) -> list[float]:
    return [i / (n - 1) if n > 1 else 0.0 for i in range(n)]


def prompt_ids(tok: Any, ctx: int, depth: float, key: str, bos_id: Optional[int]) -> list[int]:
    """BOS, the intro, filler before the needle (depth x the filler count), the needle, the rest of the filler,
    the question: about ctx tokens, as `e8kv recall` builds them."""
    def enc(s: str) -> list[int]:
        return tok(s, add_special_tokens=False)["input_ids"]
    intro, fill, ques = enc(INTRO), enc(FILLER), enc(QUESTION)
    needle = enc(f" The pass key is {key}. Remember it. {key} is the pass key.")
    fixed = 1 + len(intro) + len(needle) + len(ques)
    n_fill = (ctx - fixed) // len(fill) if ctx > fixed else 0
    before = int(depth * n_fill + 0.5)
    ids = ([bos_id] if bos_id is not None else []) + intro + fill * before + needle + fill * (n_fill - before)
    return ids + ques


def found(answer: str, key: str) -> bool:
    """The answer's first run of digits is the key."""
    m = re.search(r"[0-9]+", answer)
    return bool(m) and m.group(0) == key


def run(model: Any, tok: Any, specs: Sequence[str], *, ctx: int = 1024, n_depths: int = 5, trials: int = 4,
        seed: int = 1, cuda_cache: Optional[bool] = None, cache_device: Any = None) -> Iterator[dict]:
    """One row per (spec, depth): {spec, ctx, depth, trials, correct, accuracy, kept}. "dynamic" is
    transformers' DynamicCache; other specs are e8kv caches (E8KVCudaCache on a GPU model, sized to the
    prompt and the answer; cuda_cache and cache_device override that choice and its device). kept: the tokens
    a KV head kept of the last prompt (eviction), else its length."""
    from transformers import DynamicCache

    from . import hf
    dev = hf._model_device(model)
    arg = hf.cache_arg(model)
    bos = tok.bos_token_id
    gpu = dev.type == "cuda" if cuda_cache is None else cuda_cache
    on = cache_device if cache_device is not None else dev
    for spec in specs:
        for di, depth in enumerate(depths(n_depths)):
            ok, kept = 0, 0
            for t in range(trials):
                key = passkey(seed, di, t)
                ids = torch.tensor([prompt_ids(tok, ctx, depth, key, bos)], device=dev)
                n = ids.shape[1]
                if spec == "dynamic":
                    cache = DynamicCache(config=model.config)
                elif gpu:
                    # one size for every prompt of the run (the prompts differ by a few tokens)
                    cache = hf.E8KVCudaCache(model.config, spec, device=on, max_batch_size=1,
                                             max_cache_len=ctx + ANSWER_TOKENS + 64)
                else:
                    cache = hf.E8KVCache(model.config, spec, n_ctx=ctx + ANSWER_TOKENS + 64)
                try:
                    with torch.no_grad():
                        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **{arg: cache},
                                             max_new_tokens=ANSWER_TOKENS, do_sample=False,
                                             disable_compile=True)  # 8 steps: eager, no compilation per spec
                finally:
                    if isinstance(cache, hf.E8KVCudaCache):
                        cache.detach(model.config)
                if isinstance(cache, hf.E8KVCudaCache):
                    cache.check()
                    kept = n - cache._pad_host[0]
                elif isinstance(cache, hf.E8KVCache):  # the row's C cache: its slots less the answer's tokens
                    row = cache.rows[0]
                    kept = row.n_kept(0) - (row.n_tokens(0) - n)
                else:
                    kept = n
                ok += found(tok.decode(out[0, n:], skip_special_tokens=True), key)
            yield {"spec": spec, "ctx": ctx, "depth": round(depth, 4), "trials": trials, "correct": ok,
                   "accuracy": ok / trials, "kept": kept, "prompt_tokens": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/e8kv/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--model", help="a transformers model id or directory (from_pretrained) instead of --gguf")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when a GPU is usable")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--depths", type=int, default=5)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--specs", default="dynamic;e8box:4,sink=4;e8box:4,sink=4,evict=snapkv:0.5",
                    help="';' between specs; 'dynamic' is transformers' DynamicCache")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from . import core
    from .bench import load_model
    device = a.device or ("cuda" if torch.cuda.is_available() and core.cuda_available() else "cpu")
    tok, model = load_model(a.gguf, a.model, device, torch.bfloat16 if device == "cuda" else torch.float32)
    rows: dict[str, list[dict]] = {}
    for r in run(model, tok, a.specs.split(";"), ctx=a.ctx, n_depths=a.depths, trials=a.trials, seed=a.seed):
        if a.json:
            print(json.dumps(r), flush=True)
        rows.setdefault(r["spec"], []).append(r)
    if not a.json:
        print(f"passkey recall, ~{a.ctx}-token prompts, {a.trials} trials per depth ({device})")
        print(f"{'spec':44s}" + "".join(f" {100 * d:5.0f}%" for d in depths(a.depths)) + "   all  kept")
        for spec, rs in rows.items():
            acc = sum(r["correct"] for r in rs) / sum(r["trials"] for r in rs)
            print(f"{spec:44s}" + "".join(f" {100 * r['accuracy']:5.0f}%" for r in rs) +
                  f" {100 * acc:5.1f}% {rs[-1]['kept']:5d}")


if __name__ == "__main__":
    main()
