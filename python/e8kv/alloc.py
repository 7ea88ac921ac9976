"""Per-layer formats of the CUDA cache at a mean rate, from measured sensitivities (`auto=` for the GPU).

The CUDA cache takes a format per layer and stream (`layerL.k=`, `layerL.v=`), from e8box:4 (4.25 bits per
value at head_dim 64), e8box:3 (3.25) and e8p:2 (2.125; K and V of a layer both, or neither). Which layers
can take fewer bits is a property of the model, measured here rather than modelled: from a base where every
layer is e8box:4, one probe per layer and choice codes that layer alone with fewer bits and reads the rise
of the model's KL divergence against exact attention,

    layerL=e8p:2    layerL.k=e8box:3    layerL.v=e8box:3

(3 probes per layer, one forward of the probe text each). Contributions of different layers add (the model
of `auto=` in src/cache/alloc.c), so the choice per layer that minimises the summed rise within the bits
of the mean rate is a knapsack over the layers, solved exactly by dynamic programming over whole bytes per
vector. e8kv.hf.allocate runs the probes on your model through e8kv.hf.perplexity (on the GPU with the CUDA
cache itself) and returns the spec; bench/gpu_alloc.py does the same with `e8kv ppl` on a GGUF model.

    specs = alloc.probe_specs(n_layer, "sink=4,center=rope")           # base first, then 3 per layer
    kld = [...]                                                        # the KLD of each spec, same order
    choice = alloc.choose(kld, n_layer, head_dim, mean_bits=3.25)      # [(k_format, v_format)] per layer
    spec = alloc.spec_of(choice, "sink=4,center=rope")                 # "e8box:4,sink=4,...,layer3.k=e8box:3,..."
"""
from __future__ import annotations

from typing import Sequence

from .core import Codec, E8KVError, ErrorCode

TOP = "e8box:4"
# a layer's choices: (K format, V format); e8p:2 only as a pair (the CUDA cache's rule)
CHOICES = (("e8box:4", "e8box:4"), ("e8box:3", "e8box:4"), ("e8box:4", "e8box:3"), ("e8box:3", "e8box:3"),
           ("e8p:2", "e8p:2"))


def _opts(opts: str) -> str:
    opts = opts.strip(",")
    if not opts:
        return ""
    for item in opts.split(","):
        key = item.split("=", 1)[0]
        if "=" not in item or key in ("k", "v", "kv", "auto") or key.startswith("layer"):
            raise E8KVError(ErrorCode.SPEC, f"allocation options '{opts}': only cache options such as sink=N, "
                                            "center=...; the formats are what the allocation chooses")
    return "," + opts


def probe_specs(n_layer: int, opts: str = "") -> list[str]:
    """The base spec (every layer e8box:4, plus opts such as "sink=4,center=rope") and, for each layer L in
    turn, layer L with e8p:2, with K e8box:3, with V e8box:3: 1 + 3·n_layer specs."""
    if n_layer < 1:
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"allocation: n_layer {n_layer}")
    o = _opts(opts)
    base = TOP + o
    out = [base]
    for layer in range(n_layer):
        out += [f"{base},layer{layer}=e8p:2", f"{base},layer{layer}.k=e8box:3", f"{base},layer{layer}.v=e8box:3"]
    return out


def vector_bytes(head_dim: int) -> dict[str, int]:
    """Bytes per vector of each format at head_dim (256: two halves of 128, as the CUDA cache stores them)."""
    d = 128 if head_dim == 256 else head_dim
    return {f: Codec(f, d).vector_bytes * (head_dim // d) for f in ("e8box:4", "e8box:3", "e8p:2")}


def choose(kld: Sequence[float], n_layer: int, head_dim: int, mean_bits: float) -> list[tuple[str, str]]:
    """Each layer's (K, V) formats with the least summed KLD rise and a mean rate over every layer's K and V
    of at most mean_bits (bits of the formats, every byte of a vector counted). kld: the KLDs of
    probe_specs(n_layer, ...), same order. A rise below zero (noise around a layer that does not matter)
    counts as zero; between choices of equal summed rise, the one with more bytes. BAD_ARGUMENT: a count that does not match, a KLD that is not finite; RATE: mean_bits
    below e8p:2's or above e8box:4's."""
    if len(kld) != 1 + 3 * n_layer:
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"allocation: {len(kld)} KLDs for {n_layer} layers "
                                                f"(probe_specs gives {1 + 3 * n_layer})")
    if any(not (x == x and abs(x) != float("inf")) for x in kld):
        raise E8KVError(ErrorCode.BAD_ARGUMENT, "allocation: a probe's KLD is not finite")
    vb = vector_bytes(head_dim)
    lo, hi = 8 * vb["e8p:2"] / head_dim, 8 * vb[TOP] / head_dim
    if not lo - 1e-9 <= mean_bits <= hi + 1e-9:
        raise E8KVError(ErrorCode.RATE, f"allocation: mean {mean_bits} bits per value outside "
                                        f"[{lo:g}, {hi:g}] (e8p:2 .. e8box:4 at head_dim {head_dim})")
    base = kld[0]
    budget = int(mean_bits * head_dim / 8 * 2 * n_layer + 1e-9)  # bytes per token over every K and V vector
    # best[b] = (summed rise, choices) with b bytes spent so far; ties keep the first (fewest layers cut)
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
    for layer in range(n_layer):
        dp, dk, dv = (max(0.0, kld[1 + 3 * layer + j] - base) for j in range(3))
        rise = (0.0, dk, dv, dk + dv, dp)
        nxt: dict[int, tuple[float, list[int]]] = {}
        for spent in sorted(best):
            cost, picks = best[spent]
            for c, (fk, fv) in enumerate(CHOICES):
                b = spent + vb[fk] + vb[fv]
                if b + (n_layer - 1 - layer) * 2 * vb["e8p:2"] > budget:
                    continue
                r = cost + rise[c]
                if b not in nxt or r < nxt[b][0]:
                    nxt[b] = (r, picks + [c])
        best = nxt
    # the least rise; between equal rises (probes that measured nothing), the one that spends more bytes
    _, (_, picks) = min(best.items(), key=lambda t: (t[1][0], -t[0]))
    return [CHOICES[c] for c in picks]


def mean_bits(choice: Sequence[tuple[str, str]], head_dim: int) -> float:
    """The formats' mean bits per value over every layer's K and V."""
    vb = vector_bytes(head_dim)
    return 8 * sum(vb[k] + vb[v] for k, v in choice) / (2 * len(choice) * head_dim)


def spec_of(choice: Sequence[tuple[str, str]], opts: str = "") -> str:
    """The cache spec of a choice: e8box:4 and opts, then layer rules for the layers that differ, runs of
    layers with the same rule as one range ("layers3-5.k=e8box:3")."""
    o = _opts(opts)
    rules: list[tuple[int, int, str]] = []
    for layer, (fk, fv) in enumerate(choice):
        if (fk, fv) not in CHOICES:
            raise E8KVError(ErrorCode.SPEC, f"allocation: layer {layer} ({fk}, {fv}) is not a choice")
        items = []
        if fk == fv and fk != TOP:
            items.append(f"={fk}")
        else:
            items += [f".k={fk}"] if fk != TOP else []
            items += [f".v={fv}"] if fv != TOP else []
        for it in items:
            last = rules[-1] if rules else None
            if last and last[2] == it and last[1] == layer - 1:
                rules[-1] = (last[0], layer, it)
            else:
                rules.append((layer, layer, it))
    # rules of one stream apart may interleave; order does not matter as they never overlap
    parts = [f"layer{a}{it}" if a == b else f"layers{a}-{b}{it}" for a, b, it in sorted(rules)]
    return ",".join([TOP + o] + parts)


__all__ = ["CHOICES", "choose", "mean_bits", "probe_specs", "spec_of", "vector_bytes"]
