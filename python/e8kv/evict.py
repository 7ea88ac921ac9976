"""Token eviction for the transformers caches: which tokens of a prompt each KV head keeps, with the scorers
and the spec items of the C library's eviction (src/cache/evict.c, include/e8kv.h "token eviction"):

    evict=SCORER:F   remove the fraction F (0 <= F < 1) of the prompt's tokens, chosen per KV head by
                     snapkv (the attention of the last `obs` prompt queries, max-pooled over 7 neighbours),
                     h2o (attention summed over every prompt query), keykey (the centred keys stand in for
                     queries: no queries needed) or stream (sinks and the newest tokens only)
    recent=W         the newest W tokens are never evicted (default 32)
    obs=W            snapkv's observation window (default 32)
    budget=N         also keep each row within about N tokens while it grows (the CUDA cache: N + a page at
                     most; the prompt keeps at most N, rounded up to a page, by SCORER; then, at decode, the
                     oldest whole pages after the sink's are dropped, StreamingLLM's choice at page grain)

The first max(sink, 1) tokens are never evicted, and the count kept is rounded up to whole pages, as in the
C library: select() returns the same tokens as e8kv_cache_evict for the same keys and queries (tested
against it). The one difference of use: the C cache scores the keys it decoded from its codes, the CUDA cache
scores the prompt's exact keys and queries before coding (the prompt is attended exactly anyway).

    cfg, rest = evict.parse("e8box:4,sink=4,evict=snapkv:0.5")     # rest = "e8box:4,sink=4"
    keep = evict.select(cfg, q, k, sink=4, block=16)               # (n_head_kv, m) token indices, ascending
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from . import core
from .core import E8KVError, ErrorCode

SCORERS = ("keykey", "snapkv", "h2o", "stream")
QUERY_SCORERS = ("snapkv", "h2o")  # the scorers that read the prompt's queries
DEFAULT_RECENT = 32  # E8KV_EVICT_DEFAULT_RECENT (what parse() gives when recent= is not in the spec)
DEFAULT_OBS = 32  # E8KV_EVICT_DEFAULT_OBS
SNAPKV_POOL = 7
KEYKEY_OBSERVERS = 256


@dataclass(frozen=True)
class EvictConfig:
    scorer: str
    frac: float
    recent: int = DEFAULT_RECENT
    obs: int = DEFAULT_OBS
    budget: int = 0  # budget=N (0: none)

    @property
    def needs_queries(self) -> bool:
        return self.scorer in QUERY_SCORERS

    def kept(self, n: int, sink: int, block: int) -> int:
        """Tokens a KV head keeps of n: n minus the fraction, at least the protected ones, rounded up to whole
        pages of `block` tokens (which cost the same), never more than n. With budget=N, a prompt of more
        than N + block tokens keeps at most max(N, protected) rounded up to a page (the C cache's budget
        eviction: down to N once past N + a page)."""
        lo = max(sink, 1)
        if lo >= n or self.recent >= n - lo:
            return n
        m = max(n - math.floor(self.frac * n), lo + self.recent)
        if self.budget and n > self.budget + block:
            m = min(m, max(self.budget, lo + self.recent))
        m = (m + block - 1) // block * block
        return min(m, n)

    def hold(self, sink: int, block: int) -> int:
        """budget=N: the most tokens a row holds, max(N, protected, a page past the sink's) rounded up to a page,
        plus a page (0 without budget=)."""
        if not self.budget:
            return 0
        lo = max(sink, 1)
        m = max(self.budget, lo + self.recent, (lo + block - 1) // block * block + block)
        return (m + block - 1) // block * block + block


def parse(spec: str) -> tuple[Optional[EvictConfig], str]:
    """(the eviction items of a cache spec, the spec without them), read by the C library's own grammar
    (e8kv_cache_spec_evict: what a C cache would make of them). SPEC error for a spec it refuses (a bad
    item; recent=, obs=, budget= without evict=), and for per-layer evictA-B= (the transformers caches
    evict by one fraction for every layer)."""
    try:
        items, rest = core.spec_evict(spec)
    except E8KVError as e:
        if e.code != ErrorCode.SPEC:
            raise
        raise E8KVError(ErrorCode.SPEC, f"cache spec '{spec}': refused by the cache grammar (include/e8kv.h); its "
                                        f"eviction items are evict=SCORER:F with SCORER one of {', '.join(SCORERS)} "
                                        "and 0 <= F < 1, then recent=W, obs=W (at least 1) and budget=N, which "
                                        "need evict=") from None
    if items["n_rules"]:
        raise E8KVError(ErrorCode.SPEC, f"cache spec '{spec}': per-layer evictA-B= is not supported by the "
                                        "transformers caches: evict=SCORER:F evicts every layer by F")
    if not items["scorer"]:
        return None, spec
    return EvictConfig(items["scorer"], float(items["frac"]), int(items["recent"]), int(items["obs"]),
                       int(items["budget"])), rest


def _group_attention(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, scale: float,
                     exclude_self: bool = False, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Softmax weights of queries q (g, t, d) at positions q_pos (t,) over keys k (n, d) at 0 .. n-1, causal
    (key position <= query position; and not the key at the query's own position when exclude_self), summed
    over the queries and the g heads: (n,) float64. A query that sees no key adds nothing. sinks: the g
    heads' learned attention sinks, logits that join each softmax with no key (gpt-oss)."""
    n = k.shape[0]
    s = (q @ k.T) * scale  # (g, t, n)
    pos = torch.arange(n, device=k.device)
    hide = pos[None, :] > q_pos[:, None]
    if exclude_self:
        hide = hide | (pos[None, :] == q_pos[:, None])
    s = s.masked_fill(hide[None], float("-inf"))
    seen = (~hide).any(1)  # (t,)
    s = s[:, seen]
    if sinks is not None:  # one more column per query, dropped after the softmax
        col = sinks.to(s.dtype).reshape(-1, 1, 1).expand(s.shape[0], s.shape[1], 1)
        return torch.softmax(torch.cat((s, col), dim=-1), dim=-1)[..., :n].sum((0, 1))
    return torch.softmax(s, dim=-1).sum((0, 1))


def scores(cfg: EvictConfig, q: Optional[torch.Tensor], k: torch.Tensor, scale: float,
           sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Importance of each of the n tokens for each KV head: q (n_head, n_q, d) the prompt's last n_q queries
    (at positions n - n_q .. n - 1, after RoPE), k (n_head_kv, n, d) its keys (after RoPE); float64
    (n_head_kv, n). Computed in float64, in chunks of queries: snapkv reads its `obs` queries, keykey at most
    256 observers, h2o every query (n² per head: minutes for a 32K prompt of a large model). sinks: the
    layer's learned attention sinks (n_head logits, gpt-oss), in the softmax of every query snapkv and h2o
    observe, as e8kv_cache_evict_sinks does (keykey and stream take no queries)."""
    H, n, d = k.shape
    k = k.double()
    out = torch.zeros((H, n), dtype=torch.float64, device=k.device)
    if cfg.scorer == "stream":
        return out + torch.arange(n, dtype=torch.float64, device=k.device)[None]
    if cfg.scorer == "keykey":
        kc = k - k.mean(1, keepdim=True)  # centred: the component every key shares would decide all scores
        scale = 1.0 / math.sqrt(d)  # keys as queries: the C library's scale
        stride = -(-n // KEYKEY_OBSERVERS) if n > KEYKEY_OBSERVERS else 1
        obs = torch.arange(n - 1, -1, -stride, device=k.device)
        cnt = (obs[None, :] > torch.arange(n, device=k.device)[:, None]).sum(1).double()  # observers after key j
        for h in range(H):
            w = _group_attention(kc[h, obs][None], kc[h], obs, scale, exclude_self=True)
            out[h] = torch.where(cnt > 0, w / cnt.clamp(min=1.0), torch.zeros_like(w))
        return out
    if q is None:
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"evict={cfg.scorer}: needs the prompt's queries")
    n_head, n_q = q.shape[0], q.shape[1]
    g = n_head // H
    t0 = n_q - cfg.obs if cfg.scorer == "snapkv" and n_q > cfg.obs else 0
    q = q[:, t0:].double()  # snapkv: the observation window alone
    n_q, t0 = n_q - t0, 0
    q_pos = torch.arange(n - n_q, n, device=k.device)
    step = max(1, (1 << 24) // max(1, g * n))  # queries per chunk: about 128 MB of float64 weights
    for h in range(H):
        for a in range(t0, n_q, step):
            b = min(n_q, a + step)
            out[h] += _group_attention(q[h * g:(h + 1) * g, a:b], k[h], q_pos[a:b], scale,
                                       sinks=None if sinks is None else sinks[h * g:(h + 1) * g].double())
    if cfg.scorer == "snapkv":  # the largest of SNAPKV_POOL neighbours, clipped at the ends
        out = torch.nn.functional.max_pool1d(out[:, None], SNAPKV_POOL, stride=1, padding=SNAPKV_POOL // 2)[:, 0]
    return out


def select(cfg: EvictConfig, q: Optional[torch.Tensor], k: torch.Tensor, *, sink: int, block: int,
           scale: Optional[float] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The tokens each KV head keeps: (n_head_kv, m) int64 indices into the n tokens, ascending, m =
    cfg.kept(n, sink, block); the first max(sink, 1) and the newest cfg.recent always among them, the rest
    by score (ties: the newer token first). q, k, sinks as for scores()."""
    H, n, d = k.shape
    m = cfg.kept(n, sink, block)
    dev = k.device
    if m >= n:
        return torch.arange(n, device=dev)[None].expand(H, n).clone()
    lo, hi = max(sink, 1), n - cfg.recent
    s = scores(cfg, q, k, scale if scale is not None else 1.0 / math.sqrt(d), sinks=sinks)
    cand = s[:, lo:hi].flip(-1)  # newest first, so that a stable sort ranks ties newer first
    order = torch.argsort(cand, dim=-1, descending=True, stable=True)[:, :m - lo - cfg.recent]
    chosen = (hi - 1) - order
    fixed = torch.cat((torch.arange(lo, device=dev), torch.arange(hi, n, device=dev)))[None].expand(H, -1)
    return torch.sort(torch.cat((fixed, chosen), dim=1), dim=1).values
