#!/usr/bin/env python3
"""Which transformers model types the e8kv caches serve: each model type of a list (default: tests/py_hf_archs.py's
served and refused types and a few more decoders of transformers 5) as the tiny random model of that test
(2 layers: the type's first layer kind and a full-attention one; hidden 128, 4 query / 2 KV heads, head_dim
32, small MoE sizes where the config has them), on the CPU: transformers' DynamicCache, then the CPU cache
with f32 codes (the same logits within float rounding when the model is served), with e8:4, and the CUDA
cache's Python over its CPU twin (tests/py_hf_cuda.py's PagesTwin, exact bf16 pages) with bf16 pages; per
cache the largest |logit difference| against DynamicCache, or the error it raised (a refusal names its
reason; "build" / "DynamicCache": the shrunken config itself did not run). Random weights: agreement, not
quality. tests/py_hf_archs.py asserts the same for its lists; this prints the figures for any type.
Usage: python3 bench/survey_hf_models.py [MODEL_TYPE ...]"""
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "python"), os.path.join(os.path.dirname(HERE), "tests")]
import e8kv.hf  # noqa: E402
import py_hf_archs  # noqa: E402  (tiny: the test's model of each type)
import py_hf_cuda  # noqa: E402  (PagesTwin, run_steps)
from transformers import DynamicCache  # noqa: E402

MORE = ["glm", "internlm2", "lfm2", "minimax", "llama4_text", "cohere2", "granitemoehybrid", "bamba", "falcon_h1",
        "jamba"]
MODEL_TYPES = py_hf_archs.SERVED + sorted(py_hf_archs.REFUSED) + MORE


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
            model = py_hf_archs.tiny(kind)
        except (Exception, py_hf_archs.pytest.skip.Exception) as e:  # (skip: a type this transformers lacks)
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
