#!/usr/bin/env python3
"""Independent reference for the engine's forward pass: a float64 numpy Llama written from the equations
(RMSNorm, RoPE, causal GQA attention, SwiGLU), reading the weights with its own code:
  - stories260K (llama2.c checkpoint, parsed here with numpy) from the repository's data/;
  - the default GGUF model (SmolLM2-135M-Instruct Q4_1) read with the `gguf` package
    (gguf.GGUFReader + gguf.quants.dequantize), when it has been fetched.
The engine's logits come from `e8kv generate --tokens IDS -n 0 --dump-logits FILE` (f32 cache). With
wikitext-2 and the Hugging Face tokenizer.json in data/, `e8kv ppl --json` is also checked against
the llama-perplexity protocol computed here from the reference logits (check_ppl).

Pass: for every position, max |engine - ref| <= 1e-3 * max |ref| over the whole logit matrix, and the same
argmax wherever the reference's top-2 margin exceeds that tolerance (a near-tie may flip legitimately).
Skips (77) when numpy, gguf, the CLI or every model is missing."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy missing: skipped")
    sys.exit(77)

REL_TOL = 1e-3


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, theta, split_half):
    """x: (T, H, D). Rotates pairs (2i, 2i+1) (interleaved) or (i, i + D/2) (split halves) by pos * theta^(-2i/D)."""
    d = x.shape[-1]
    freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (D/2)
    ang = pos[:, None] * freq[None, :]  # (T, D/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if split_half:
        a, b = x[..., : d // 2], x[..., d // 2 :]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * c - b * s, a * s + b * c
    out = np.empty_like(x)
    if split_half:
        out[..., : d // 2], out[..., d // 2 :] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def forward(w, cfg, tokens):
    """w: dict of float64 arrays, matrices (out, in). Returns logits (T, vocab)."""
    T = len(tokens)
    nh, nkv, hd = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    pos = np.arange(T, dtype=np.float64)
    x = w["tok_embd"][np.array(tokens)]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["n_layer"]):
        L = w["layers"][l]
        h = rmsnorm(x, L["attn_norm"], cfg["eps"])
        q = h @ L["wq"].T + L.get("bq", 0.0)
        k = h @ L["wk"].T + L.get("bk", 0.0)
        v = h @ L["wv"].T + L.get("bv", 0.0)
        q = rope(q.reshape(T, nh, hd), pos, cfg["theta"], cfg["split_half"])
        k = rope(k.reshape(T, nkv, hd), pos, cfg["theta"], cfg["split_half"])
        v = v.reshape(T, nkv, hd)
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh, :] @ k[:, g, :].T / np.sqrt(hd) + mask
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att[:, hh, :] = p @ v[:, g, :]
        x = x + att.reshape(T, nh * hd) @ L["wo"].T
        h = rmsnorm(x, L["ffn_norm"], cfg["eps"])
        gate, up = h @ L["w_gate"].T, h @ L["w_up"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ L["w_down"].T
    return rmsnorm(x, w["out_norm"], cfg["eps"]) @ w["output"].T


def load_llama2c(path):
    raw = open(path, "rb").read()
    dim, hidden, n_layer, n_head, n_kv, vocab, seq_len = np.frombuffer(raw[:28], "<i4")
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // n_head
    f = np.frombuffer(raw[28:], "<f4").astype(np.float64)
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = f[off : off + n].reshape(shape)
        off += n
        return a

    emb = take(vocab, dim)
    rms_att = take(n_layer, dim)
    wq = take(n_layer, dim, dim)
    wk = take(n_layer, n_kv * hd, dim)
    wv = take(n_layer, n_kv * hd, dim)
    wo = take(n_layer, dim, dim)
    rms_ffn = take(n_layer, dim)
    w1 = take(n_layer, hidden, dim)
    w2 = take(n_layer, dim, hidden)
    w3 = take(n_layer, hidden, dim)
    out_norm = take(dim)
    take(seq_len, hd)  # freq_cis real + imag
    output = emb if shared else take(vocab, dim)
    assert off == f.size, "llama2.c size mismatch"
    layers = [
        dict(attn_norm=rms_att[l], wq=wq[l], wk=wk[l], wv=wv[l], wo=wo[l], ffn_norm=rms_ffn[l],
             w_gate=w1[l], w_down=w2[l], w_up=w3[l])
        for l in range(n_layer)
    ]
    cfg = dict(n_layer=int(n_layer), n_head=int(n_head), n_head_kv=int(n_kv), head_dim=int(hd), eps=1e-5,
               theta=10000.0, split_half=False, vocab=int(vocab))
    return dict(tok_embd=emb, out_norm=out_norm, output=output, layers=layers), cfg


def load_gguf(path):
    import gguf

    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields[key]
        return f.parts[f.data[0]]

    arch = bytes(field("general.architecture")).decode()
    if arch not in ("llama", "mistral", "qwen2"):
        raise SystemExit(f"unexpected architecture {arch}")
    n_layer = int(field(f"{arch}.block_count")[0])
    dim = int(field(f"{arch}.embedding_length")[0])
    n_head = int(field(f"{arch}.attention.head_count")[0])
    n_kv = int(field(f"{arch}.attention.head_count_kv")[0])
    theta = float(field(f"{arch}.rope.freq_base")[0])
    eps = float(field(f"{arch}.attention.layer_norm_rms_epsilon")[0])
    tensors = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = np.asarray(a, dtype=np.float64).reshape([int(n) for n in reversed(t.shape)])
    names = dict(attn_norm="attn_norm.weight", wq="attn_q.weight", wk="attn_k.weight", wv="attn_v.weight",
                 wo="attn_output.weight", ffn_norm="ffn_norm.weight", w_gate="ffn_gate.weight",
                 w_up="ffn_up.weight", w_down="ffn_down.weight", bq="attn_q.bias", bk="attn_k.bias",
                 bv="attn_v.bias")
    layers = []
    for l in range(n_layer):
        layers.append({k: tensors[f"blk.{l}.{v}"].reshape(-1) if "norm" in k or k.startswith("b")
                       else tensors[f"blk.{l}.{v}"] for k, v in names.items() if f"blk.{l}.{v}" in tensors})
    emb = tensors["token_embd.weight"]
    w = dict(tok_embd=emb, out_norm=tensors["output_norm.weight"].reshape(-1),
             output=tensors.get("output.weight", emb), layers=layers)
    cfg = dict(n_layer=n_layer, n_head=n_head, n_head_kv=n_kv, head_dim=dim // n_head, eps=eps, theta=theta,
               split_half=(arch == "qwen2"), vocab=emb.shape[0])
    return w, cfg


def engine_logits(cli, model, tokens, vocab):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        cmd = [cli, "generate", "-m", model, "--tokens", ",".join(map(str, tokens)), "-n", "0",
               "--threads", "2", "--dump-logits", out]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"FAIL: {' '.join(cmd)}\n{p.stderr}")
        return np.fromfile(out, dtype="<f4").reshape(len(tokens), vocab).astype(np.float64)


def compare(name, got, ref):
    scale = np.abs(ref).max()
    diff = np.abs(got - ref).max()
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > REL_TOL * scale
    same = got.argmax(1) == ref.argmax(1)
    ok = diff <= REL_TOL * scale and bool(np.all(same[clear]))
    print(f"{name}: {ref.shape[0]} tokens, max|diff| {diff:.3g}, max|ref| {scale:.3g}, rel {diff / scale:.3g} "
          f"(tol {REL_TOL:g}); argmax equal {int(same.sum())}/{len(same)} "
          f"({int(clear.sum())} with a clear margin) -> {'ok' if ok else 'FAIL'}")
    return ok


def check_ppl(cli, model, w, cfg, text, tokenizer_json):
    """`e8kv ppl --ctx 64 --chunks 2 --json` against the protocol computed here: chunks of 64 tokens from an
    empty cache, positions 32..62 predicting tokens 33..63 (no BOS for this vocabulary), PPL = exp(mean NLL),
    std error ppl * sqrt((E[nll^2] - E[nll]^2) / (n - 1)). Tolerance: 1e-4 relative (logits agree to ~1e-6)."""
    import json
    from tokenizers import Tokenizer

    ctx, n_chunks = 64, 2
    toks = Tokenizer.from_file(tokenizer_json).encode(text).ids
    nll = []
    for c in range(n_chunks):
        chunk = toks[c * ctx:(c + 1) * ctx]
        lg = forward(w, cfg, chunk)
        lg = lg - lg.max(axis=1, keepdims=True)
        lsm = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
        nll += [-lsm[j, chunk[j + 1]] for j in range(ctx // 2, ctx - 1)]
    nll = np.array(nll)
    ppl = float(np.exp(nll.mean()))
    se = float(np.sqrt((np.mean(nll ** 2) - nll.mean() ** 2) / (len(nll) - 1)) * ppl)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "text.txt")
        open(path, "w", encoding="utf-8").write(text)
        p = subprocess.run([cli, "ppl", "-m", model, "-f", path, "--ctx", str(ctx), "--chunks", str(n_chunks),
                            "--threads", "2", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL: e8kv ppl: {p.stderr}")
        return False
    row = json.loads(p.stdout.strip().splitlines()[0])
    good = (row["tokens_scored"] == len(nll) and abs(row["ppl"] / ppl - 1) < 1e-4 and
            abs(row["ppl_se"] / se - 1) < 1e-3 and row["kld"] == 0.0)
    print(f"ppl protocol: engine {row['ppl']:.5f} +/- {row['ppl_se']:.5f} over {row['tokens_scored']} tokens, "
          f"reference {ppl:.5f} +/- {se:.5f} over {len(nll)} -> {'ok' if good else 'FAIL'}")
    return good


def main():
    build = os.environ.get("E8KV_BUILD_DIR", "build")
    cli = os.environ.get("E8KV_CLI", os.path.join(build, "e8kv"))
    if not os.path.exists(cli):
        print(f"CLI {cli} missing: skipped")
        return 77
    data = os.environ.get("E8KV_SHARED_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
    ran, ok = 0, True

    stories = os.path.join(data, "stories260K", "stories260K.bin")
    if os.path.exists(stories):
        w, cfg = load_llama2c(stories)
        toks = [1] + [(i * 37 + 11) % cfg["vocab"] for i in range(47)]
        ok &= compare("stories260K", engine_logits(cli, stories, toks, cfg["vocab"]), forward(w, cfg, toks))
        ran += 1
    else:
        print("stories260K missing: that part skipped")

    model = os.environ.get("E8KV_MODEL") or os.path.join(
        os.environ.get("E8KV_CACHE_DIR", os.path.expanduser("~/.cache/e8kv")), "SmolLM2-135M-Instruct.Q4_1.gguf")
    try:
        import gguf  # noqa: F401
        have_gguf = True
    except ImportError:
        have_gguf = False
    if have_gguf and os.path.exists(model):
        w, cfg = load_gguf(model)
        text = ("The tower is 324 metres (1,063 ft) tall, about the same height as an 81-storey building, "
                "and the tallest structure in Paris.")
        toks = None
        tj = os.path.join(data, "smollm2-135m", "tokenizer.json")
        try:
            from tokenizers import Tokenizer
            if os.path.exists(tj):
                toks = Tokenizer.from_file(tj).encode(text).ids[:32]
        except ImportError:
            pass
        if not toks:
            toks = [(i * 7919 + 17) % cfg["vocab"] for i in range(32)]
        ok &= compare("SmolLM2 GGUF", engine_logits(cli, model, toks, cfg["vocab"]), forward(w, cfg, toks))
        ran += 1
        wiki = os.path.join(data, "wikitext-2-raw", "wiki.test.raw")
        if os.path.exists(wiki) and os.path.exists(tj):
            ok &= check_ppl(cli, model, w, cfg, open(wiki, encoding="utf-8").read()[:4000], tj)
        else:
            print("wiki.test.raw or tokenizer.json missing: ppl protocol check skipped")
    else:
        print("gguf package or default model missing: that part skipped")
    if ran == 0:
        return 77
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
