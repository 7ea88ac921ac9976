"""PyTorch custom operators over the CUDA cache (include/e8kv_cuda.h), for eager use and torch.compile
(fullgraph, mode "reduce-overhead" = CUDA graphs):

    torch.ops.e8kv.append(state, cache, layer, slots, k, v, sink_slots, rows, positions)  # mutates `state`
    out = torch.ops.e8kv.attend(state, cache, layer, q, block_tables, ctx_lens, max_ctx, rows)

(sink_slots: None, or with a sink=N cache the tokens' sink slots; rows: None, or each token's (append) or
sequence's (attend) row of sink rows and means; positions: None, or with a center=rope cache each token's index
in its sequence; CudaCache.append / attend say what they hold.)

`cache` is the number `register_cache` gave a CudaCache. `state` is the cache's device status word (an
int32 CUDA tensor of one element): append ORs its error bits into it (e8kv_cuda_append_slots_async: no host
synchronisation, so the step can be captured in a graph) and is declared as mutating it; attend reads it, so
the compiler keeps every append before the attends that follow (the pages themselves live in the C cache's
own allocation, which the compiler does not see). Read the word (CudaCache.check_status) when convenient,
e.g. after generation. Both run on the current stream. The fake (meta) implementations give the output
shapes for tracing. Slots and context lengths are tensors computed on the device, so nothing on the host
changes from one decode step to the next and a captured graph stays valid: attend's launch parameters
depend only on (n_seq, n_head, max_ctx).
"""
from __future__ import annotations

from typing import Optional

import torch

from .core import CudaCache, E8KVError, ErrorCode

_caches: dict[int, CudaCache] = {}


def register_cache(cache: CudaCache) -> int:
    """The number under which the operators find `cache` (kept alive until unregister_cache)."""
    key = len(_caches) + 1
    while key in _caches:
        key += 1
    _caches[key] = cache
    return key


def unregister_cache(key: int) -> None:
    _caches.pop(key, None)


def _get(key: int) -> CudaCache:
    c = _caches.get(key)
    if c is None:
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"e8kv operator: no cache registered as {key}")
    return c


@torch.library.custom_op("e8kv::append", mutates_args=("state",), device_types="cuda")
def append(state: torch.Tensor, cache: int, layer: int, slots: torch.Tensor, k: torch.Tensor,
           v: torch.Tensor, sink_slots: Optional[torch.Tensor] = None, rows: Optional[torch.Tensor] = None,
           positions: Optional[torch.Tensor] = None) -> None:
    """k, v (n_tok, n_head_kv * head_dim) into slots (int64, n_tok) and sink slots; errors into state."""
    _get(cache).append(layer, slots, k, v, status=state, sink_slots=sink_slots, rows=rows, positions=positions)


@append.register_fake
def _(state: torch.Tensor, cache: int, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
      sink_slots: Optional[torch.Tensor] = None, rows: Optional[torch.Tensor] = None,
      positions: Optional[torch.Tensor] = None) -> None:
    return None


@torch.library.custom_op("e8kv::attend", mutates_args=(), device_types="cuda")
def attend(state: torch.Tensor, cache: int, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
           ctx_lens: torch.Tensor, max_ctx: int, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q (n_seq, n_head * head_dim) -> float32 (n_seq, n_head * head_dim) over each row's first ctx_lens."""
    return _get(cache).attend(layer, q, block_tables, ctx_lens, max_ctx, rows=rows)


@attend.register_fake
def _(state: torch.Tensor, cache: int, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
      ctx_lens: torch.Tensor, max_ctx: int, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


def new_state(device: Optional[torch.device] = None) -> torch.Tensor:
    """A zeroed status word at a static address (what CUDA graphs of torch.compile need for a mutated input)."""
    s = torch.zeros(1, dtype=torch.int32, device=device or "cuda")
    torch._dynamo.mark_static_address(s)
    return s


__all__ = ["append", "attend", "new_state", "register_cache", "unregister_cache"]
