#!/usr/bin/env python3
"""Decode through transformers on a model with sliding-window layers: a slice of Gemma-3-27B's shape (hidden
5376, 32 query / 16 KV heads, head_dim 128, intermediate 21504, vocab 262144, sliding window 1024, five
sliding layers to one full-attention layer, full layers with RoPE theta 1e6 scaled linearly by 8) with
random bf16 weights built on the device, --layers layers (default 12: 2 full, 10 sliding).
e8kv codes the full-attention layers and keeps the sliding ones exact (transformers' own layers); this
measures what that saves and costs against transformers' caches: the rows of `python -m e8kv.bench`
(e8kv.bench.run: DynamicCache, StaticCache and each spec; prefill of the prompt, then generate() of --new
tokens, compiled for the static-shaped caches; the bytes each cache holds), on a random prompt of --ctx
tokens, then the largest |logit difference| of each spec against DynamicCache at the prompt's end and over
16 teacher-forced steps after it; the same for transformers' StaticCache, the control: what two of
transformers' own caches differ by in this model's bf16 arithmetic (other SDPA kernels, other masks).
Usage: python3 bench/bench_hf_hybrid.py [--ctx N] [--new N] [--layers N] [--specs 'A;B'] [--json FILE]"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import e8kv.bench  # noqa: E402
import e8kv.hf  # noqa: E402
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, StaticCache  # noqa: E402


def build(n_layer: int) -> Gemma3ForCausalLM:
    cfg = Gemma3TextConfig(hidden_size=5376, intermediate_size=21504, num_hidden_layers=n_layer,
                           num_attention_heads=32, num_key_value_heads=16, head_dim=128, vocab_size=262144,
                           query_pre_attn_scalar=168, sliding_window=1024, max_position_embeddings=131072,
                           layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                        for i in range(n_layer)],
                           rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                               "rope_theta": 1000000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Gemma3ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    return model


def logit_error(model, ids, spec, steps=16):
    """Largest |logit difference| against DynamicCache at the prompt's last position (no code read yet: the
    prompt attends over its exact K/V) and over `steps` tokens fed one at a time after it (the same tokens
    for both caches), and the largest |logit| of the reference."""
    arg = e8kv.hf.cache_arg(model)
    feed = torch.randint(0, model.config.vocab_size, (1, steps), device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(1))
    out = []
    cap = ids.shape[1] + steps
    for make in (lambda: DynamicCache(config=model.config),  # (an E8KVCudaCache attaches itself when made)
                 lambda: StaticCache(config=model.config, max_cache_len=cap) if spec == "StaticCache" else
                 e8kv.hf.E8KVCudaCache(model.config, spec, max_cache_len=cap)):
        cache = make()
        with torch.no_grad():
            lg = [model(input_ids=ids, **{arg: cache}, use_cache=True, logits_to_keep=1).logits[:, -1].float()]
            for i in range(steps):
                lg.append(model(input_ids=feed[:, i:i + 1], **{arg: cache}, use_cache=True).logits[:, -1].float())
        if isinstance(cache, e8kv.hf.E8KVCudaCache):
            cache.detach(model.config)
            cache.check()
        out.append(torch.stack(lg))
    diff = (out[1] - out[0]).abs()
    return float(diff[0].max()), float(diff[1:].max()), float(out[0].abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--specs", default="bf16;e8box:4,sink=4,center=rope;e8p:2,sink=4,center=rope",
                    help="';'-separated CUDA cache specs")
    ap.add_argument("--json")
    a = ap.parse_args()
    t0 = time.time()
    model = build(a.layers)
    s = e8kv.hf.ModelShape(model.config)
    head = {"device": torch.cuda.get_device_name(), "layers": a.layers, "coded_layers": s.coded_layers,
            "sliding_window": s.sliding_window, "ctx": a.ctx, "new": a.new,
            "cuda_default_spec": e8kv.hf.cuda_default_spec(model.config)}
    print(json.dumps(head), flush=True)
    ids = torch.randint(0, model.config.vocab_size, (1, a.ctx), generator=torch.Generator().manual_seed(0))
    specs = [x for x in a.specs.split(";") if x]
    rows = e8kv.bench.run(model, ids, specs, new=a.new)
    for spec in ["StaticCache", *specs]:  # transformers' StaticCache against its DynamicCache: the control
        at_prompt, steps, scale = logit_error(model, ids.cuda(), spec)
        next(r for r in rows if r["cache"] == spec).update(
            max_logit_diff_prompt=round(at_prompt, 5), max_logit_diff_steps=round(steps, 5), max_logit=round(scale, 3))
    for r in rows:
        print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"head": head, "rows": rows, "seconds": round(time.time() - t0, 1)}, f, indent=1)


if __name__ == "__main__":
    main()
