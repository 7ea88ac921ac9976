#!/usr/bin/env python3
"""Which transformers model types the e8kv caches serve: each model type of a list (default: 43 decoders of
transformers 5) as a tiny random config (4 layers, hidden 128, 4 query / 2 KV heads, head_dim 32, window 8
and small MoE sizes where the config has them), on the CPU: transformers' DynamicCache, then the CPU cache
with f32 codes (the same logits within float rounding when the model is served), with e8:4, and the CUDA
cache's Python over its CPU twin (tests/py_hf_cuda.py's PagesTwin, exact bf16 pages) with bf16 pages; per
cache the largest |logit difference| against DynamicCache, or the error it raised (a refusal names its
reason; "build" / "DynamicCache": the shrunken config itself did not run). Random weights: agreement, not
quality.
Usage: python3 bench/survey_hf_models.py [MODEL_TYPE ...]"""
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "python"), os.path.join(os.path.dirname(HERE), "tests")]
import e8kv.hf  # noqa: E402
import py_hf_cuda  # noqa: E402  (PagesTwin, run_steps)
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache  # noqa: E402

MODEL_TYPES = ["llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3", "granite", "cohere", "starcoder2", "olmo2",
               "glm", "gemma", "stablelm", "phi", "qwen3_moe", "mixtral", "falcon", "gpt_neox", "internlm2",
               "deepseek_v3", "exaone4", "ernie4_5", "seed_oss", "hunyuan_v1_dense", "glm4", "helium", "arcee",
               "apertus", "lfm2", "minimax", "ministral", "olmo3", "gpt_oss", "gemma3_text", "gemma2", "qwen3_next",
               "llama4_text", "cohere2", "granitemoehybrid", "bamba", "falcon_h1", "nemotron", "jamba"]
SMALL = dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=256, moe_intermediate_size=64, num_experts=4,
             num_local_experts=4, n_routed_experts=4, sliding_window=8, kv_lora_rank=32, q_lora_rank=32,
             qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, linear_num_value_heads=2,
             linear_num_key_heads=2, pad_token_id=0, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
             topk_group=1, num_kv_heads=2)


def small_model(kind: str) -> torch.nn.Module:
    cfg = AutoConfig.for_model(kind)
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    for k, v in SMALL.items():
        if hasattr(text, k):
            try:
                setattr(text, k, v)
            except Exception:  # (a derived attribute)
                pass
    types = getattr(text, "layer_types", None)
    if types and len(types) != 4:
        text.layer_types = types[:4] if len(types) >= 4 else None
    if getattr(text, "no_rope_layers", None):
        text.no_rope_layers = [1, 1, 1, 0]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).float().eval()


def main() -> None:
    warnings.filterwarnings("ignore")
    for obj, name, value in py_hf_cuda.twin_patches():  # the CUDA cache's Python over PagesTwin
        setattr(obj, name, value)
    g = torch.Generator().manual_seed(5)
    prompt, steps = torch.randint(0, 512, (2, 20), generator=g), torch.randint(0, 512, (2, 8), generator=g)
    caches = {"cpu f32": lambda m: e8kv.hf.E8KVCache(m.config, "f32"),
              "cpu e8:4": lambda m: e8kv.hf.E8KVCache(m.config, "e8:4"),
              "twin bf16": lambda m: e8kv.hf.E8KVCudaCache(m.config, "bf16", device=torch.device("cpu", 0),
                                                           max_batch_size=2, max_cache_len=64)}
    for kind in sys.argv[1:] or MODEL_TYPES:
        try:
            model = small_model(kind)
        except Exception as e:
            print(f"{kind:18s} build: {type(e).__name__}: {e!s:.100}", flush=True)
            continue
        impl = model.config._attn_implementation
        try:
            want = py_hf_cuda.run_steps(model, DynamicCache(config=model.config), prompt, steps)
        except Exception as e:
            print(f"{kind:18s} DynamicCache: {type(e).__name__}: {e!s:.100}", flush=True)
            continue
        res = []
        for name, make in caches.items():
            cache = None
            try:
                cache = make(model)
                got = py_hf_cuda.run_steps(model, cache, prompt, steps)
                res.append(f"{name} {float((got - want).abs().max()):.2g}")
            except Exception as e:
                res.append(f"{name} {type(e).__name__}: {str(e)[:90]}")
            if hasattr(cache, "detach"):
                cache.detach(model.config)
            model.config._attn_implementation = impl
        print(f"{kind:18s} [{impl}] max |logit| {float(want.abs().max()):.2g} | " + " | ".join(res), flush=True)


if __name__ == "__main__":
    main()
