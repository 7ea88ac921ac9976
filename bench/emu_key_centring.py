#!/usr/bin/env python3
"""Which centre should a key coded after RoPE have? An emulation on the CPU, through transformers, of the
GPU cache's key path (keys after RoPE, in GGUF's interleaved pair layout, coded by the library's own codec,
e8kv.Codec), with the centre chosen per mode:

  none      uncoded mean: the key itself is coded (center=0)
  post      k - mean(k): the mean of the chunk's keys after RoPE (center=1)
  rope      k_t - R_t mu: mu the mean of the chunk's keys before RoPE (each key's rotation undone), turned to
            each key's own position t (a RoPE-aware centre; what the attention would add back is q . R_t mu)
  page:P    k_t - (the mean of R_j mu over the P positions j of t's page): the RoPE-aware centre averaged over
            each page of P tokens, one centre per page
  pre       keys coded before RoPE: R_t (code(k_pre - mu) + mu) (the CPU cache's rope=pre, for reference)
  top:K     rope on the K RoPE pairs of largest |mu|^2 - |mean after RoPE|^2, post on the others (the CUDA
            cache's center=rope has K = 8)

Values are centred by their mean and coded in every mode; the first --sink tokens keep their exact K and V.
Each chunk of --ctx tokens of the text is one forward whose attention reads the coded K/V of all its tokens
(the protocol of e8kv.hf.perplexity on a CUDA model, prompt_from_codes); the second half is scored, KLD and
top-1 against the same forward with exact K/V. An emulation: the codes are the library's, the model's
arithmetic is transformers' f32.

    python3 bench/emu_key_centring.py [--codec e8box:4] [--ctx 512] [--chunks 8] [--modes post,rope,...]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import e8kv  # noqa: E402
import e8kv.hf as hf  # noqa: E402
from e8kv.bench import load_model  # noqa: E402


def rot(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in transformers' split-halves layout: x (..., t, d), cos/sin (t, d/2); sin negated undoes it."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class Emu:
    def __init__(self, codec: str, d: int, inv_freq: torch.Tensor, sink: int) -> None:
        self.codec = e8kv.Codec(codec, d)
        self.d, self.sink = d, sink
        self.inv_freq = inv_freq.double()
        h = d // 2
        self.perm = torch.stack((torch.arange(h), torch.arange(h) + h), dim=1).reshape(-1)  # GGUF pairs
        self.inv = torch.argsort(self.perm)
        self.mode = "post"

    def code(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, d) float64 -> decoded through the codec, in the interleaved layout the GPU cache codes."""
        y = x[:, self.perm].float().numpy()
        z = self.codec.decode(self.codec.encode(np.ascontiguousarray(y)))
        return torch.from_numpy(np.asarray(z, dtype=np.float32)).double()[:, self.inv]

    def keys(self, k: torch.Tensor) -> torch.Tensor:
        """k (t, d) after RoPE at positions 0 .. t-1 (float64) -> what the attention reads."""
        t = k.shape[0]
        ang = torch.arange(t, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        m = self.mode
        if m == "none":
            return self.code(k)
        if m == "post":
            mu = k.mean(0, keepdim=True).float().double()
            return self.code(k - mu) + mu
        pre = rot(k, cos, -sin)  # the keys before RoPE
        mu = pre.mean(0, keepdim=True).float().double()
        if m == "pre":
            return rot(self.code(pre - mu) + mu, cos, sin)
        centre = rot(mu.expand(t, -1), cos, sin)  # R_t mu
        if m.startswith("page:"):
            p = int(m[5:])
            c = torch.empty_like(centre)
            for a in range(0, t, p):
                j = torch.arange(a, a + p, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
                c[a:a + p] = rot(mu.expand(p, -1), torch.cos(j), torch.sin(j)).mean(0, keepdim=True)
            centre = c.float().double()
        elif m.startswith("top:"):
            # the turned centre on the K pairs whose mean the mean after RoPE misses most (|μ_pre|² − |μ_post|²,
            # the CUDA cache's center=rope), that mean elsewhere
            h = self.d // 2
            post = k.mean(0, keepdim=True).float().double()
            e = (mu[0, :h] ** 2 + mu[0, h:] ** 2) - (post[0, :h] ** 2 + post[0, h:] ** 2)
            sel = torch.zeros(h, dtype=torch.bool)
            sel[torch.topk(e, int(m[4:])).indices] = True
            post = post.expand(t, -1)
            s2 = torch.cat((sel, sel))
            centre = torch.where(s2[None, :], centre, post)
        elif m != "rope":
            raise ValueError(m)
        centre = centre.float().double()
        return self.code(k - centre) + centre

    def values(self, v: torch.Tensor) -> torch.Tensor:
        mu = v.mean(0, keepdim=True).float().double()
        return self.code(v - mu) + mu

    def kv(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, t, d = key.shape
        ko, vo = key.clone(), value.clone()
        for i in range(b):
            for j in range(h):
                k, v = key[i, j].double(), value[i, j].double()
                kq, vq = self.keys(k), self.values(v)
                s = min(self.sink, t)
                kq[:s], vq[:s] = k[:s], v[:s]
                ko[i, j], vo[i, j] = kq.to(key.dtype), vq.to(value.dtype)
        return ko, vo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/e8kv/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(HERE, "..", "data", "wikitext-2-raw", "wiki.test.raw"))
    ap.add_argument("--codec", default="e8box:4")
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--modes", default="none,post,rope,page:16,page:64,pre")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tok, model = load_model(a.gguf, None, "cpu", torch.float32)
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    emu = Emu(a.codec, model.config.head_dim if getattr(model.config, "head_dim", None) else
              model.config.hidden_size // model.config.num_attention_heads,
              model.model.rotary_emb.inv_freq.detach().cpu(), a.sink)

    def attn(module, query, key, value, attention_mask, **kw):
        k, v = emu.kv(key, value)
        return sdpa_attention_forward(module, query, k, v, attention_mask, **kw)

    AttentionInterface.register("e8kv_emu", attn)
    text = open(a.text, encoding="utf-8").read(4_000_000)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    chunks = hf._chunks(ids, a.ctx, a.chunks)
    modes = a.modes.split(",")
    acc = hf._PplAcc(["exact", *modes])
    first = a.ctx // 2
    t0 = time.time()
    for c in chunks:
        x, target = hf._chunk_input(c, first, False, 1)
        for name in acc.specs:
            model.config._attn_implementation = "sdpa" if name == "exact" else "e8kv_emu"
            emu.mode = name
            with torch.no_grad():
                logits = model(input_ids=x, use_cache=False, logits_to_keep=a.ctx - first).logits
            acc.add(name, logits, target, 0, 0.0)
        acc.end_chunk()
        print(f"[{time.time() - t0:6.1f} s] chunk done", file=sys.stderr, flush=True)
    res = acc.result()
    base = res["exact"]["ppl"]
    for name in modes:
        r = res[name]
        print(json.dumps({"codec": a.codec, "sink": a.sink, "mode": name, "ctx": a.ctx, "chunks": len(chunks),
                          "ppl": round(r["ppl"], 4), "dppl_pct": round(100 * (r["ppl"] / base - 1), 2),
                          "kld": round(r["kld"], 5), "top1": round(r["top1"], 4), "tokens": r["count"]}))
    print(json.dumps({"mode": "exact", "ppl": round(base, 4)}))


if __name__ == "__main__":
    main()
