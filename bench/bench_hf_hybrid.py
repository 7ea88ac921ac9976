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
--model gpt_oss: a slice of gpt-oss-20b's shape instead (hidden 2880, 64 query / 8 KV heads, head_dim 64, 32
experts of 2880 with 4 per token, vocab 201088, sliding window 128 on every other layer, YaRN RoPE (theta
150000, factor 32 over 4096), learned attention sinks on every layer, drawn N(1, 1) here: the initialiser's
are ~0.02); transformers runs gpt-oss with eager attention, which holds the scores of the whole prompt
(64 heads x ctx^2), so its reference caches limit --ctx (8192 by default for it); every cache decodes
eagerly (generate()'s compilation off); its random MoE routes each token by a top-4 of 32, so small
differences in attention move the logits far (StaticCache against DynamicCache shows how far): a second
control, a DynamicCache under SDPA with the sinks as one more key, is a row of its own and each cache is
also compared with it (vs_control_*).
Usage: python3 bench/bench_hf_hybrid.py [--model gemma3|gpt_oss] [--ctx N] [--new N] [--layers N]
       [--specs 'A;B'] [--json FILE]"""
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
    return on_device(Gemma3ForCausalLM, cfg)


def on_device(cls, cfg):
    """cls(cfg) built in bf16 on the device from seed 0, in eval mode."""
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = cls(cfg).eval()
    torch.set_default_dtype(torch.float32)
    return model


def build_gpt_oss(n_layer: int):
    from transformers import GptOssConfig, GptOssForCausalLM
    cfg = GptOssConfig(hidden_size=2880, intermediate_size=2880, num_hidden_layers=n_layer, num_attention_heads=64,
                       num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                       vocab_size=201088, sliding_window=128, max_position_embeddings=131072,
                       layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layer)],
                       rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                        "truncate": False, "original_max_position_embeddings": 4096,
                                        "rope_theta": 150000.0})
    cfg._attn_implementation = "eager"
    model = on_device(GptOssForCausalLM, cfg)
    # every cache decodes eagerly here (generate() would compile the static-shaped ones): what the steps cost
    # with gpt-oss's MoE under torch.compile is not measured
    model.generation_config.disable_compile = True
    g = torch.Generator().manual_seed(2)
    for layer in model.model.layers:
        layer.self_attn.sinks.data = (torch.randn(64, generator=g) + 1).to(layer.self_attn.sinks)
    return model


def sdpa_sinks_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """The control of --model gpt_oss: SDPA with gpt-oss's sinks as one more key (e8kv.hf._sdpa, what
    the e8kv caches' prompts use), over a DynamicCache: what another correct attention kernel moves the
    logits by in this model, beside transformers' eager attention."""
    t, n = query.shape[2], key.shape[2]
    kw2 = {"is_causal": True} if attention_mask is None and t == n and t > 1 else {"attn_mask": attention_mask}
    out = e8kv.hf._sdpa(query, key, value, scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
                        sinks=kw.get("s_aux"), **kw2)
    return out.transpose(1, 2), None


def logits(model, ids, feed, cache):
    """The last logits of the prompt and of each token of `feed` after it, one at a time."""
    arg = e8kv.hf.cache_arg(model)
    with torch.no_grad():
        lg = [model(input_ids=ids, **{arg: cache}, use_cache=True, logits_to_keep=1).logits[:, -1].float()]
        for i in range(feed.shape[1]):
            lg.append(model(input_ids=feed[:, i:i + 1], **{arg: cache}, use_cache=True).logits[:, -1].float())
    if isinstance(cache, e8kv.hf.E8KVCudaCache):
        cache.detach(model.config)
        cache.check()
    return torch.stack(lg)


def logit_errors(model, ids, specs, rows, control=False, steps=16):
    """Largest |logit difference| of each cache against DynamicCache at the prompt's last position (no code
    read yet: the prompt attends over its exact K/V) and over `steps` tokens fed one at a time after it (the
    same tokens for all), into its row; StaticCache is transformers' own control. control: also a
    DynamicCache under sdpa_sinks_attention (a row of its own), and each cache against it."""
    feed = torch.randint(0, model.config.vocab_size, (1, steps), device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(1))
    cap = ids.shape[1] + steps
    ref = logits(model, ids, feed, DynamicCache(config=model.config))
    ctrl = None
    if control:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        AttentionInterface.register("sdpa_sinks", sdpa_sinks_attention)
        AttentionMaskInterface.register("sdpa_sinks", sdpa_mask)
        impl, model.config._attn_implementation = model.config._attn_implementation, "sdpa_sinks"
        ctrl = logits(model, ids, feed, DynamicCache(config=model.config))
        model.config._attn_implementation = impl
        d = (ctrl - ref).abs()
        rows.append({"cache": "DynamicCache, SDPA with the sinks as a key (control)", "max_logit_diff_prompt":
                     round(float(d[0].max()), 5), "max_logit_diff_steps": round(float(d[1:].max()), 5)})
    for spec in ["StaticCache", *specs]:
        cache = StaticCache(config=model.config, max_cache_len=cap) if spec == "StaticCache" else \
            e8kv.hf.E8KVCudaCache(model.config, spec, max_cache_len=cap)  # (attaches itself when made)
        out = logits(model, ids, feed, cache)
        d = (out - ref).abs()
        r = next(r for r in rows if r["cache"] == spec)
        r.update(max_logit_diff_prompt=round(float(d[0].max()), 5), max_logit_diff_steps=round(float(d[1:].max()), 5),
                 max_logit=round(float(ref.abs().max()), 3))
        if ctrl is not None:
            d = (out - ctrl).abs()
            r.update(vs_control_prompt=round(float(d[0].max()), 5), vs_control_steps=round(float(d[1:].max()), 5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("gemma3", "gpt_oss"), default="gemma3")
    ap.add_argument("--ctx", type=int, help="prompt tokens (gemma3: 32768, gpt_oss: 8192)")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--layers", type=int, help="layers of the slice (gemma3: 12, gpt_oss: 8)")
    ap.add_argument("--specs", default="bf16;e8box:4,sink=4,center=rope;e8p:2,sink=4,center=rope",
                    help="';'-separated CUDA cache specs")
    ap.add_argument("--json")
    a = ap.parse_args()
    oss = a.model == "gpt_oss"
    a.ctx = a.ctx or (8192 if oss else 32768)
    a.layers = a.layers or (8 if oss else 12)
    t0 = time.time()
    model = build_gpt_oss(a.layers) if oss else build(a.layers)
    s = e8kv.hf.ModelShape(model.config)
    head = {"device": torch.cuda.get_device_name(), "model": a.model, "layers": a.layers,
            "coded_layers": s.coded_layers,
            "sliding_window": s.sliding_window, "ctx": a.ctx, "new": a.new,
            "cuda_default_spec": e8kv.hf.cuda_default_spec(model.config)}
    print(json.dumps(head), flush=True)
    ids = torch.randint(0, model.config.vocab_size, (1, a.ctx), generator=torch.Generator().manual_seed(0))
    specs = [x for x in a.specs.split(";") if x]
    rows = e8kv.bench.run(model, ids, specs, new=a.new)
    logit_errors(model, ids.cuda(), specs, rows, control=oss)
    for r in rows:
        print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"head": head, "rows": rows, "seconds": round(time.time() - t0, 1)}, f, indent=1)


if __name__ == "__main__":
    main()
