"""Hugging Face transformers (>= 5) integration: a Cache that holds only e8kv codes, and an attention
function (registered as attn_implementation "e8kv" through transformers' AttentionInterface) that computes
attention over the past with e8kv_cache_attend, from the codes. No full-precision copy of the past exists:
each layer's update appends the new tokens' K/V to the C cache (where they are coded as they arrive, within
the same forward pass too) and hands only those new tokens on.

    with e8kv.hf.compress(model, spec="balanced"):
        model.generate(**inputs)
    model.generate(**inputs, past_key_values=e8kv.hf.E8KVCache(model.config, spec="e8:4"))

On the GPU, E8KVCache(config, "e8box:4", device="cuda", max_batch_size=..., max_cache_len=...) makes an
E8KVCudaCache: the pages live in the CUDA cache of include/e8kv_cuda.h, append and attention are the custom
operators of e8kv.torch_ops, and the decode step compiles (torch.compile, mode "reduce-overhead").

RoPE. transformers applies RoPE before the cache update, so keys arrive with RoPE. A cache whose formats
want keys before RoPE (rope=pre, the default of e8kv's own formats and required by the calibrated e8t/e8tv
keys: e8kv_cache_keys_pre_rope) gets them with the rotation undone, exactly (the inverse rotation of the
same angles, in float32), and the queries with RoPE as transformers made them; the C cache re-applies RoPE
to each decoded key at attention time. Caches with rope=post (e8box, q4_0, f16...) get the keys as they are.
The angles are the model's own: rope_theta's, or a scaled RoPE's fixed frequencies (linear, llama3, yarn:
transformers' inv_freq, handed to the C cache as rope_freqs); a RoPE whose frequencies change with the
length (dynamic, longrope) allows only keys after RoPE (ModelShape.rope_problem says why).
Llama and Mistral checkpoints use split-half RoPE pairs in transformers but interleaved pairs in GGUF
(llama.cpp permutes Wq/Wk); the cache sees keys and queries in the GGUF layout (the same permutation on
both leaves q.k unchanged), so K/V vectors, calibrations and saved caches are the ones `e8kv ppl`,
`e8kv calibrate` and `e8kv generate` see for the same model.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import os
import sys
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import (Cache, CacheLayerMixin, DynamicSlidingWindowLayer,
                                      StaticSlidingWindowLayer)
from transformers.masking_utils import (ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, causal_mask_function,
                                        sdpa_mask)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from . import alloc, core
from . import evict as evict_mod
from .core import Calib, E8KVError, ErrorCode

ATTN_NAME = "e8kv"

# RoPE pair layout in which the cache sees keys and queries, by transformers model_type: "interleaved"
# (GGUF/Meta layout, transformers' split halves permuted back, as llama.cpp's converter does) or "split"
# (transformers' own layout, as llama.cpp keeps it for these architectures). Every one turns its keys by
# transformers' split-half rotation (tests/py_hf_archs.py checks keys handed over before RoPE against
# DynamicCache for each); a model_type not listed codes its keys after RoPE only.
ROPE_LAYOUTS = {"llama": "interleaved", "mistral": "interleaved", "mixtral": "interleaved", "granite": "interleaved",
                "granitemoe": "interleaved", "qwen2": "split", "qwen2_moe": "split", "qwen3": "split",
                "qwen3_moe": "split", "gemma3_text": "split", "ministral": "split", "olmo2": "split",
                "olmo3": "split", "olmoe": "split", "phi3": "split", "starcoder2": "split", "exaone4": "split",
                "gpt_oss": "split"}


class UnsupportedModelError(ValueError):
    """The model cannot use the e8kv cache; the message names what is missing."""


def _check_kv_shape(shape: "ModelShape", layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
    """A layer's first K/V against what the cache was sized from (the config): a model whose attention does
    not follow its config's num_key_value_heads / head_dim (multi-query variants of old architectures, MLA's
    other V width) is named here instead of failing deep in the C cache."""
    k, v = tuple(key.shape[1::2]), tuple(value.shape[1::2])
    if k != (shape.n_head_kv, shape.head_dim) or v != k:
        raise UnsupportedModelError(
            f"{shape.model_type}: layer {shape.coded_layers[layer]} gives K of {k[0]} heads x {k[1]} and V of "
            f"{v[0]} x {v[1]}; its config says {shape.n_head_kv} KV heads x head_dim {shape.head_dim} (e8kv takes "
            "K and V of the config's KV heads and head_dim)")


# ------------------------------------------------------------------------------------------ model facts
class ModelShape:
    """What the cache needs to know about a transformers config, checked once."""

    def __init__(self, config: Any) -> None:
        cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        self.model_type: str = getattr(cfg, "model_type", "?")
        self.n_head: int = cfg.num_attention_heads
        self.n_head_kv: int = getattr(cfg, "num_key_value_heads", None) or self.n_head
        self.head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_head
        self.n_ctx: int = getattr(cfg, "max_position_embeddings", 0) or 4096
        if self.head_dim % 8:
            raise UnsupportedModelError(
                f"{self.model_type}: head_dim {self.head_dim} is not a multiple of 8 (the E8 lattice codes 8 "
                "values at a time; e8kv needs head_dim % 8 == 0)")
        if self.n_head % self.n_head_kv:
            raise UnsupportedModelError(f"{self.model_type}: {self.n_head} query heads are not a multiple of "
                                        f"{self.n_head_kv} KV heads")
        # the layers e8kv codes: full attention. Sliding-window layers (hybrid models: Gemma 3, Qwen2 with
        # use_sliding_window, Ministral, OLMo 3, ...) hold at most a window of tokens and keep their exact K/V
        # in transformers' own sliding layers beside the codes; other kinds are refused
        self.n_model_layer: int = cfg.num_hidden_layers
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        types = list(getattr(cfg, "layer_types", None) or [])
        if not types:
            types = ["sliding_attention" if window else "full_attention"] * self.n_model_layer
        other = sorted(set(types) - {"full_attention", "sliding_attention"})
        if other or len(types) != self.n_model_layer:
            raise UnsupportedModelError(
                f"{self.model_type}: layers of type {other or types} (e8kv codes full-attention layers and keeps "
                "sliding-window ones exact; linear, chunked and shared-KV attention layers are not supported)")
        if "full_attention" not in types:
            raise UnsupportedModelError(
                f"{self.model_type}: every layer is sliding-window attention (window {window}): a cache of at "
                "most a window of tokens per layer, with no full-attention layer for e8kv to code")
        if "sliding_attention" in types and not (isinstance(window, int) and window > 0):
            raise UnsupportedModelError(f"{self.model_type}: sliding-window layers without a sliding_window")
        self.layer_types: list[str] = types
        self.sliding_window: Optional[int] = window if "sliding_attention" in types else None
        self.coded_layers: list[int] = [i for i, t in enumerate(types) if t == "full_attention"]
        self.n_layer = len(self.coded_layers)  # the layers of the e8kv caches: the model's coded layers
        try:  # a causal LM that computes attention in its own code never calls attn_implementation "e8kv": its
            # modeling module does not even import transformers' table of attention functions
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
            own = not hasattr(sys.modules[MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)].__module__], "ALL_ATTENTION_FUNCTIONS")
        except (KeyError, ImportError, AttributeError, ValueError):  # (remote code: not known here)
            own = False
        if own:
            raise UnsupportedModelError(f"{self.model_type}: its attention does not go through transformers' "
                                        "attention interface (attn_implementation), which e8kv's attention is")
        if getattr(cfg, "cross_attention_layers", None):
            raise UnsupportedModelError(
                f"{self.model_type}: cross-attention layers {list(cfg.cross_attention_layers)} (Llama 3.2 Vision: "
                "their K/V are an image's, computed once, not the sequence's tokens; e8kv codes self-attention)")
        if getattr(cfg, "attn_logit_softcapping", None):
            raise UnsupportedModelError(f"{self.model_type}: attention logit soft-capping (e8kv's attention is "
                                        "plain softmax attention)")
        rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        self.rope_layer_type: Optional[str] = None
        if isinstance(rope.get("full_attention"), dict):  # one RoPE per layer type: the coded layers' own
            self.rope_layer_type = "full_attention"
            rope = dict(rope["full_attention"])
        self.rope_theta: float = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 0.0)) or 0.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        partial = float(rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0)) or 1.0)
        self.rope_layout: Optional[str] = ROPE_LAYOUTS.get(self.model_type)
        # the frequencies the model turns its keys by: of rope_theta, or of a scaled RoPE whose frequencies do
        # not change with the length (linear, llama3, yarn: transformers' own inv_freq; the e8kv caches get
        # them as rope_freqs); None, and why in rope_centre_problem, when e8kv cannot know them
        self.rope_freqs: Optional[list[float]] = None
        self.rope_scaled = rope_type != "default"  # the caches take rope_freqs, not rope_theta
        self.rope_centre_problem: Optional[str] = None
        if partial != 1.0:
            self.rope_centre_problem = f"partial rotary factor {partial} (e8kv turns the whole head)"
        elif rope_type == "default":
            if self.rope_theta > 0:
                self.rope_freqs = [self.rope_theta ** (-2.0 * i / self.head_dim) for i in range(self.head_dim // 2)]
            else:
                self.rope_centre_problem = "no rope_theta in the config"
        elif rope_type in ("linear", "llama3", "yarn"):
            try:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
                kw = {"layer_type": self.rope_layer_type} if self.rope_layer_type else {}
                inv = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", **kw)[0]
                self.rope_freqs = [float(x) for x in inv.double().reshape(-1)]
            except Exception as e:  # (the transformers version's own error, named)
                self.rope_centre_problem = f"the frequencies of RoPE type '{rope_type}' ({type(e).__name__}: {e})"
            if self.rope_freqs is not None and len(self.rope_freqs) != self.head_dim // 2:
                self.rope_centre_problem = (f"RoPE type '{rope_type}' has {len(self.rope_freqs)} frequencies for "
                                            f"head_dim {self.head_dim}")
                self.rope_freqs = None
        else:
            self.rope_centre_problem = (f"RoPE type '{rope_type}' (e8kv turns keys by fixed frequencies: default, "
                                        "linear, llama3, yarn)")
        # why keys cannot be handed over before RoPE (rope=pre, calibrated formats, calibration), or None
        self.rope_problem: Optional[str] = self.rope_centre_problem
        if self.rope_layout is None:
            self.rope_problem = (f"model_type '{self.model_type}' has no known RoPE pair layout (known: "
                                 f"{', '.join(sorted(ROPE_LAYOUTS))})")
            self.rope_layout = "split"
        # the cos, sin transformers turns keys by (float32), without a yarn attention factor: turning back by
        # them gives the keys before RoPE times that factor, which RoPE's turns then give back exactly
        self.inv_freq_f32: Optional[torch.Tensor] = None
        if self.rope_freqs is not None:
            self.inv_freq_f32 = (torch.tensor(self.rope_freqs, dtype=torch.float32) if self.rope_scaled else
                                 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64)
                                                            .to(torch.float32) / self.head_dim)))

    def cache_rope(self) -> dict:
        """The RoPE arguments of a CPU cache (core.Cache) for this model: rope_theta for plain RoPE, the
        frequencies for a scaled one; none when the keys cannot be handed over before RoPE."""
        if self.rope_problem is not None:
            return {"rope_theta": 0.0}
        if self.rope_scaled:
            return {"rope_theta": 0.0, "rope_freqs": self.rope_freqs}
        return {"rope_theta": self.rope_theta}


def _configs(config: Any) -> list:
    """The config and, when it is another object, its text config (a multimodal model's decoder layers hold
    that one)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return [config] if text is config else [config, text]


def _route(config: Any) -> None:
    """attn_implementation "e8kv" for the config and its text config (Gemma 3's Gemma3ForConditionalGeneration,
    what AutoModelForCausalLM loads for gemma-3-4b and larger, keeps the text config in its decoder layers),
    each remembering its previous implementation as the fallback of the layers e8kv does not code. Read before
    any is set: setting a composite config's implementation sets its text config's too."""
    register()
    cfgs = _configs(config)
    for cfg, current in [(c, getattr(c, "_attn_implementation", None)) for c in cfgs]:
        if current != ATTN_NAME:
            cfg._e8kv_fallback = current or "sdpa"
            cfg._attn_implementation = ATTN_NAME


def _rope_cos_sin(inv_freq: torch.Tensor, pos0: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (n, head_dim) of positions pos0 .. pos0+n-1 in transformers' split-half layout, computed the
    way transformers' rotary embedding computes them (float32 angles) from its inv_freq (head_dim/2)."""
    pos = torch.arange(pos0, pos0 + n, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _unrope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Undo transformers' RoPE (x*cos + rotate_half(x)*sin) on x (b, h, t, d): rotate by the opposite angle."""
    return x * cos - _rotate_half(x) * sin


# ------------------------------------------------------------------------------------------ the cache
_WHOLE_CACHE = ("e8kv caches change their batch rows all layers at once: call the cache's reorder_cache, "
                "batch_repeat_interleave or batch_select_indices")


def _index_list(idx: Any) -> list[int]:
    return [int(i) for i in (idx.tolist() if hasattr(idx, "tolist") else idx)]


class _BatchChanges:
    """transformers' batch changes, all layers at once, for both caches: the rows of the batch become old
    rows idx. A cache gives its batch size (_batch_size; 0: nothing stored, nothing to change) and applies a
    checked, non-identity idx (_take)."""

    _who = "e8kv cache"

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: batch row i continues old row beam_idx[i]."""
        self._select(_index_list(beam_idx), "reorder_cache")

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row repeated `repeats` times in place (row i becomes rows i*repeats .. i*repeats+repeats-1)."""
        rows = [i for i in range(self._batch_size()) for _ in range(int(repeats))]
        self._select(rows, "batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Only rows `indices` stay, in that order."""
        self._select(_index_list(indices), "batch_select_indices")

    def _select(self, idx: list[int], who: str) -> None:
        n = self._batch_size()
        if not n:
            return
        if not idx or any(not 0 <= i < n for i in idx):
            raise E8KVError(ErrorCode.BAD_ARGUMENT, f"{self._who} {who}: rows {idx} of a batch of {n}")
        if idx != list(range(n)):
            self._take(idx, who)
            _take_sliding(self, idx)  # a hybrid model's sliding-window layers follow

    def _batch_size(self) -> int:
        raise NotImplementedError

    def _take(self, idx: list[int], who: str) -> None:
        raise NotImplementedError


def _cpu_evict_items(spec: str) -> Optional[tuple[str, int]]:
    """(scorer, obs) of a CPU cache spec that evicts after the prompt (evict=SCORER:F, directly or through an
    evict-* preset, as the C library's grammar reads it), else None (a spec it refuses included: the C cache
    says why when it is made)."""
    try:
        items, _ = core.spec_evict(spec)
    except E8KVError:
        return None
    return (items["scorer"], int(items["obs"])) if items["scorer"] else None


def _check_later_mask(mask: torch.Tensor, past: int, pads: Sequence[int], who: str) -> None:
    """A 2-D attention mask over `past` stored positions and new tokens, after a prompt whose rows had `pads`:
    the new tokens must be real and the earlier part must have the prompt's padding (NotImplementedError)."""
    if not bool(mask[:, past:].all()):
        raise NotImplementedError(f"{who}: padding after the prompt (a 0 in the attention mask of new tokens) is "
                                  "not supported; pad the prompt only")
    if (~mask[:, :past].to(torch.bool)).sum(1).tolist() != list(pads):
        raise NotImplementedError(f"{who}: the attention mask's padding differs from the padding of the prompt "
                                  "this cache holds")


_tls = threading.local()  # pending: (cache, layer, pos0 per row, kept tokens per row or None) of the last
# update, read by the attention function; mask: the forward's 2-D attention mask (the mask function's);
# handed: the K/V the last update returned, which the attention call must be given (_check_handed);
# owner: the e8kv cache whose get_mask_sizes ran last (eager: transformers asks the forward's cache for the mask
# sizes just before it calls the mask function), read by the mask function; cuda: the E8KVCudaCache whose
# coded layer's update ran last, read by the attention function


def _claim(cache: Any) -> None:
    """Eager, before a forward of this cache makes its masks (Cache.get_mask_sizes): the model's attention is
    routed to e8kv, the config points at this cache when it is a CUDA one (at no CUDA cache when not), and
    the mask function knows whose forward it is. So a cache can be used after a compress() block ended, after
    another e8kv cache was made for the same model (several conversations, a copy.deepcopy of a prompt's
    cache), and a cache of another kind (DynamicCache) after an e8kv one. In a compiled step (torch.compile
    traces this too) the config is pointed at the cache, which the step's attention then reads."""
    _check_attached(cache)
    gpu = cache if isinstance(cache, E8KVCudaCache) else None
    cfgs = _configs(cache._config)
    if torch.compiler.is_compiling():  # (a compiled step: the pointer alone, a side effect the graph replays)
        for c in cfgs:
            if getattr(c, "_e8kv_cuda_cache", None) is not gpu:
                c._e8kv_cuda_cache = gpu
        return
    _tls.owner = cache
    if any(getattr(c, "_attn_implementation", None) != ATTN_NAME or getattr(c, "_e8kv_cuda_cache", None) is not gpu
           for c in cfgs):
        _route(cache._config)
        for c in cfgs:
            c._e8kv_cuda_cache = gpu


def _check_attached(cache: Any) -> None:
    if cache._config is None:
        raise E8KVError(ErrorCode.BAD_ARGUMENT, "e8kv cache loaded by pickle (torch.load) does not know its model: "
                                                "call cache.attach(model.config) before its first forward")


def _attach_checked(cache: Any, config: Any) -> None:
    """attach(config): the model's shape must be the one the cache was made for."""
    s, t = ModelShape(config), cache.shape
    key = lambda x: (x.model_type, x.n_head, x.n_head_kv, x.head_dim, x.coded_layers, x.sliding_window)  # noqa: E731
    if key(s) != key(t):
        raise UnsupportedModelError(f"e8kv cache made for {key(t)} (model type, heads, KV heads, head_dim, coded "
                                    f"layers, window) attached to a model of {key(s)}")
    cache._config = config
    cache._attach(config)


def _deepcopy_cache(cache: Any, memo: dict, shared: Iterable[Any], replaced: dict) -> Any:
    """copy.deepcopy of an e8kv cache: a new object whose attributes are deep copies of the cache's, but for
    `shared` objects (kept: the model's config, its shape, a calibration, objects that hold no tokens) and the
    C caches in `replaced` (id of the original -> its copy)."""
    new = object.__new__(type(cache))
    memo[id(cache)] = new
    for x in shared:
        memo[id(x)] = x
    for i, c in replaced.items():
        memo[i] = c
    for k, v in cache.__dict__.items():
        setattr(new, k, copy.deepcopy(v, memo))
    return new


def _model_layers(shape: ModelShape, coded: Callable[[int], Any], sliding: Callable[[], Any]) -> list:
    """A cache's layers, one per model layer: coded(i) for the model's i-th full-attention layer (layer i of
    the e8kv caches), sliding() for a sliding-window layer (transformers' own, exact K/V of the window)."""
    coded_idx = iter(range(shape.n_layer))
    return [coded(next(coded_idx)) if t == "full_attention" else sliding() for t in shape.layer_types]


def _sliding_bytes(cache: Cache) -> int:
    """Bytes of the exact K/V tensors a hybrid model's sliding-window layers hold in an e8kv cache."""
    return sum(t.numel() * t.element_size() for layer in cache.layers if layer.is_sliding
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
               if isinstance(t, torch.Tensor))


def _other_device(a: torch.device, b: torch.device) -> bool:
    """Whether a tensor on a must be moved to b (an index left out, as the CPU's, matches any)."""
    return a.type != b.type or (a.index is not None and b.index is not None and a.index != b.index)


def _take_sliding(cache: Cache, idx: list[int]) -> None:
    """A batch change (_BatchChanges) in a hybrid model's sliding-window layers: row i becomes old row idx[i].
    Static layers (the CUDA cache's: fixed addresses for CUDA graphs) are rewritten in place, their rows past
    len(idx) left as they were; dynamic ones get new tensors."""
    for layer in cache.layers:
        if not layer.is_sliding or not layer.is_initialized or getattr(layer, "keys", None) is None:
            continue
        sel = torch.tensor(idx, dtype=torch.long, device=layer.keys.device)
        if isinstance(layer, StaticSlidingWindowLayer):
            for t in (layer.keys, layer.values):
                t[:len(idx)].copy_(t.index_select(0, sel))
        else:
            layer.keys, layer.values = layer.keys.index_select(0, sel), layer.values.index_select(0, sel)


class E8KVLayer(CacheLayerMixin):
    """One model layer of an E8KVCache; its storage is the layer of the C caches (one per batch row)."""

    is_compileable = False
    is_sliding = False
    is_croppable = True

    def __init__(self, parent: "E8KVCache", layer_idx: int) -> None:
        super().__init__()
        self.parent = parent
        self.layer_idx = layer_idx  # the C caches' layer (the model's layer: shape.coded_layers[layer_idx])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.parent._ensure_rows(key_states.shape[0])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            _check_kv_shape(self.parent.shape, self.layer_idx, key_states, value_states)
            self.lazy_initialization(key_states, value_states)
        _check_attached(self.parent)
        self.parent._append(self.layer_idx, key_states, value_states)
        _tls.handed = (key_states, value_states)  # what the attention must be given (_check_handed)
        # only the new tokens go on (the attention function reads the past from the codes)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        rows = self.parent.rows
        return rows[0].n_tokens(self.layer_idx) + self.parent.pads[0] if rows else 0

    def get_max_length(self) -> int:
        return self.parent.n_ctx

    def reset(self) -> None:
        self.parent._clear()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("e8kv cache: a row's C cache drops tokens from all layers at once: call the "
                                  "cache's crop")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError(_WHOLE_CACHE)

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError(_WHOLE_CACHE)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError(_WHOLE_CACHE)

    def offload(self) -> None:  # codes already live in host memory
        pass

    def prefetch(self) -> None:
        pass


class E8KVCache(_BatchChanges, Cache):
    """A transformers Cache that stores K/V only as e8kv codes: one C cache (include/e8kv.h) per sequence of
    the batch, whose layers are the model's layers. `spec` is any cache spec the CLI takes ("balanced",
    "e8:4", "k=e8:4,v=e8:3,sink=1", "layers0-1=f16" ..., "auto=e8tv:3" with a calibration); `calib` an
    e8kv.Calib or the path of a calibration file (`e8kv calibrate` or e8kv.hf.calibrate).

    Creating it switches the config's attention to "e8kv" (the previous implementation stays the fallback
    for caches of other kinds); attention over the past is e8kv_cache_attend on the codes.

    Padded batches: the prompt's 2-D attention mask (noted by the "e8kv" mask function) says which tokens
    are pads; they are not stored, and each row's C cache holds its own tokens at positions 0 .. n - 1 (keys
    in and out of RoPE at those positions). Later tokens must be real (mask 1); get_seq_length() is the
    padded length transformers counts.

    Eviction (evict=SCORER:F in the spec, or an evict-* preset): the attention keeps the queries of the
    prompt (the first forward of empty rows) that the scorer needs, and after the last layer each row's C
    cache evicts with them (e8kv_cache_evict); the kept tokens keep their positions.

    device="cuda" makes the GPU variant (E8KVCudaCache: the CUDA cache of include/e8kv_cuda.h, static
    shapes for torch.compile; see there)."""

    def __new__(cls, config: Any = None, spec: Optional[str] = None, *args: Any, device: Any = "cpu",
                **kwargs: Any) -> Any:  # (config None: pickle's and deepcopy's reconstruction)
        if cls is E8KVCache and torch.device(device).type == "cuda":
            return E8KVCudaCache(config, spec, *args, device=device, **kwargs)
        return super().__new__(cls)

    def __init__(self, config: Any, spec: Optional[str] = None, *, calib: Union[Calib, str, os.PathLike, None] = None,
                 n_ctx: Optional[int] = None, seed: int = 0, n_threads: int = 0,
                 observer: Optional[Any] = None, device: Any = "cpu") -> None:
        self.shape = ModelShape(config)
        spec = spec or "balanced"
        # evict=SCORER:F (and the evict-* presets): after the prompt's last layer, each row's C cache evicts
        # (e8kv_cache_evict) with the prompt's queries, captured by the attention (_attend); budget= evicts
        # at append inside the C cache
        self._evict = _cpu_evict_items(spec)
        self._qcap: dict[tuple[int, int], torch.Tensor] = {}  # (row, layer) -> queries before RoPE
        self._qsinks: dict[int, torch.Tensor] = {}  # layer -> its learned attention sinks (gpt-oss), for evict
        if isinstance(calib, (str, os.PathLike)):
            calib = Calib.load(calib)
        self.calib = calib
        self.spec = spec
        self.n_ctx = n_ctx or self.shape.n_ctx
        self.seed, self.n_threads = seed, n_threads
        self.observer = observer  # calibration hooks: on_kv(layer, k, v), on_q(layer, q) (GGUF layout, pre-RoPE)
        self.rows: list[core.Cache] = []
        self.pads: list[int] = [0]  # per row: the pads of its prompt (not stored; transformers counts them)
        s = self.shape
        self._perm = None
        self._rope: Optional[core.Rope] = None  # for keys the cache takes with RoPE: e8kv's own rotation
        if s.rope_layout == "interleaved":  # GGUF index 2i <- i, 2i+1 <- i + d/2
            h = s.head_dim // 2
            self._perm = torch.stack((torch.arange(h), torch.arange(h) + h), dim=1).reshape(-1)
        super().__init__(layers=_model_layers(s, lambda i: E8KVLayer(self, i),
                                              lambda: DynamicSlidingWindowLayer(sliding_window=s.sliding_window)))
        probe = self._new_row()  # checks the spec now (a bad spec fails here, not inside generate)
        self._config = config
        self._attach(config)  # (only then: a refused spec leaves the model's attention as it was)
        self.keys_pre_rope = probe.keys_pre_rope
        self._probe: Optional[core.Cache] = probe

    # -- C caches, one per batch row
    def _new_row(self) -> core.Cache:
        s = self.shape
        pre_ok = s.rope_problem is None
        if not pre_ok and ("rope=pre" in self.spec or "e8t" in self.spec or "auto=" in self.spec):
            raise UnsupportedModelError(f"e8kv cache '{self.spec}' codes keys before RoPE, which {s.model_type} "
                                        f"does not allow: {s.rope_problem}")
        if not pre_ok and "center=rope" in self.spec:  # the C cache turns the centre by the model's RoPE
            raise UnsupportedModelError(f"e8kv cache '{self.spec}': center=rope turns the keys' centre by the "
                                        f"model's RoPE, which the CPU cache cannot follow here: {s.rope_problem}")
        try:
            c = core.Cache(s.n_layer, s.n_head_kv, s.head_dim, self.n_ctx, self.spec, seed=self.seed,
                           n_threads=self.n_threads, rope_neox=s.rope_layout == "split", calib=self.calib,
                           **s.cache_rope())
        except E8KVError as e:
            hint = ""
            head = self.spec.split(",")[0]
            named = core.preset_spec(head) if "=" not in head else None  # a preset's spec without a calibration
            if e.code == ErrorCode.SPEC and self.calib is None and any(
                    "e8t" in x or "auto=" in x for x in (self.spec, named or "")):
                hint = " (e8t/e8tv formats, auto= and the presets made of them need a calibration: " \
                       "calib=e8kv.hf.calibrate(...) or a file from `e8kv calibrate`)"
            raise E8KVError(e.code, f"e8kv cache '{self.spec}' for {s.model_type}{hint}") from None
        return c

    def _ensure_rows(self, batch: int) -> None:
        if self.rows:
            if len(self.rows) != batch:
                raise ValueError(f"e8kv cache holds {len(self.rows)} sequences, got a batch of {batch}")
            return
        self.rows = [self._probe] if self._probe is not None else []
        self._probe = None
        while len(self.rows) < batch:
            self.rows.append(self._new_row())

    def _clear(self) -> None:
        for r in self.rows:
            r.clear()
        self.pads = [0] * max(1, len(self.rows))

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove tokens of every row, every layer (assisted decoding's rollback)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count (tokens to remove from the end)")
        for r in self.rows if tokens_to_remove else ():
            r.truncate(max(r.n_tokens(0) + tokens_to_remove, 0))
        for layer in self.layers:  # a hybrid model's sliding-window layers (transformers' own crop)
            if layer.is_sliding and tokens_to_remove and layer.is_initialized:
                layer.crop(tokens_to_remove)

    # -- beam search and batch changes (_BatchChanges): a row taken once moves, a row taken twice is copied
    def _batch_size(self) -> int:
        return len(self.rows)  # 0: nothing stored yet, the next forward's batch makes the rows

    def _take(self, idx: list[int], who: str) -> None:
        n = len(self.rows)
        taken: set[int] = set()
        rows = []
        for i in idx:  # the first use of a row moves it; a later one copies it (every layer, bit for bit)
            if i in taken:
                rows.append(self._copy_row(self.rows[i]))
            else:
                taken.add(i)
                rows.append(self.rows[i])
        pads = self.pads + [0] * (n - len(self.pads))
        self.rows, self.pads = rows, [pads[i] for i in idx]

    def __deepcopy__(self, memo: dict) -> "E8KVCache":
        """copy.deepcopy (transformers' way to reuse a prompt's cache: fill it once, copy it for each request):
        every row's C cache copied (saved and loaded, bit for bit), a hybrid model's sliding layers too; the
        copy and this cache then change independently and either can run the next forward. The model's
        config, the calibration and the observer are shared, not copied."""
        rows = {id(r): self._copy_row(r) for r in self.rows + ([self._probe] if self._probe is not None else [])}
        shared = [self._config, *_configs(self._config), self.shape, self.calib, self.observer, self._rope]
        return _deepcopy_cache(self, memo, [x for x in shared if x is not None], rows)

    def _copy_row(self, row: core.Cache) -> core.Cache:
        c = self._new_row()
        c.load_into(row.save())
        return c

    def __getstate__(self) -> dict:
        """pickle / torch.save (torch.load(..., weights_only=False) loads it): every row's C cache as its saved
        bytes (doc/format.md §4; core.Cache's pickling), a hybrid model's sliding layers as tensors, the
        calibration as its file's bytes; not the model's config nor the observer: attach(model.config) the
        loaded cache before its first forward (a forward before that is an E8KVError)."""
        d = dict(self.__dict__)
        d["_probe"], d["_config"], d["observer"] = None, None, None
        return d

    def attach(self, config: Any) -> None:
        """Route the model's attention to e8kv for this cache (a cache loaded by pickle does not know its model);
        the config must be of the shape the cache was made for."""
        _attach_checked(self, config)

    def _to_cache_layout(self, x: torch.Tensor, pos0: int, rope: str) -> torch.Tensor:
        """(b, h, t, d) with transformers' RoPE, in its layout -> (b, t, h*d) float32 contiguous in the
        cache's layout. rope: "none" (RoPE undone: the vectors before RoPE) or "exact" (RoPE redone with
        e8kv's own angles, which transformers' float32 angles differ from by up to ~1e-7 * position)."""
        x = x.detach().to(torch.float32)
        if self.shape.rope_problem is None:
            s, d, t = self.shape, self.shape.head_dim, x.shape[2]
            x = _unrope(x, *_rope_cos_sin(s.inv_freq_f32, pos0, t))
            if rope == "exact":  # the library's own RoPE (e8kv.Rope), the one the engine and cache use
                if self._rope is None:  # (a scaled RoPE's frequencies as the cache has them: float32)
                    self._rope = (core.Rope(d, freqs=s.inv_freq_f32.tolist(), neox=True) if s.rope_scaled
                                  else core.Rope(d, s.rope_theta, neox=True))
                xt = x.transpose(1, 2).contiguous()  # (b, t, h, d): rows at consecutive positions
                for row in xt:
                    self._rope.apply_(row, pos0)
                x = xt.transpose(1, 2)
        elif rope == "none":
            raise UnsupportedModelError(f"keys before RoPE needed: {self.shape.rope_problem}")
        if self._perm is not None:
            x = x.index_select(-1, self._perm)
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d).contiguous()

    def _padding(self, layer: int, b: int, t: int) -> Optional[list]:
        """The kept tokens of each row for the t new tokens (None: all of them), from the forward's 2-D
        attention mask (_tls.mask, noted by the mask function). A padded prompt (an empty cache) sets each
        row's pads, which are then never stored; after it, new tokens must be real and the mask's earlier
        part must have the prompt's padding."""
        mask = getattr(_tls, "mask", None)
        fresh = all(r.n_tokens(layer) == 0 for r in self.rows)
        if fresh and layer == 0:
            self.pads = [0] * b
        past = 0 if fresh else self.rows[0].n_tokens(layer) + self.pads[0]
        if mask is None or mask.shape[0] != b or mask.shape[1] != past + t:
            return None
        if fresh:
            if bool(mask.all()):
                return None
            keep = [torch.nonzero(m).reshape(-1) for m in mask.to(torch.bool).cpu()]
            if layer == 0:
                self.pads = [t - len(x) for x in keep]
            elif self.pads != [t - len(x) for x in keep]:
                raise ValueError("e8kv cache: the layers of one forward saw different padding")
            return keep
        if layer == 0:  # one forward, one mask: checked once
            _check_later_mask(mask, past, self.pads, "e8kv cache")
        return None

    def _append(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.device.type != "cpu":
            raise E8KVError(ErrorCode.UNSUPPORTED, f"e8kv cache: tensors on {key_states.device}; this build has "
                                                   "the CPU cache only")
        b, t = key_states.shape[0], key_states.shape[2]
        keep = self._padding(layer, b, t)
        pos0 = [r.n_tokens(layer) for r in self.rows]
        if keep is None and len(set(p + pad for p, pad in zip(pos0, self.pads))) > 1:
            raise ValueError("e8kv cache: sequences of the batch at different lengths")
        for i, row in enumerate(self.rows):  # each row at its own positions (its pads are not tokens)
            ks, vs = key_states[i:i + 1], value_states[i:i + 1]
            if keep is not None:
                ks, vs = ks[:, :, keep[i]], vs[:, :, keep[i]]
            k = self._to_cache_layout(ks, pos0[i], "none" if self.keys_pre_rope else "exact")[0]
            v = vs.detach().to(torch.float32).transpose(1, 2)
            v = v.reshape(v.shape[1], -1).contiguous()
            if k.shape[0]:
                row.append(layer, k, v)
            if self.observer is not None:
                kk = k if self.keys_pre_rope else self._to_cache_layout(ks, pos0[i], "none")[0]
                self.observer.on_kv(layer, kk[None], v[None])
        _tls.pending = (self, layer, pos0, keep)

    def _attend(self, layer: int, pos0: list, query: torch.Tensor, scaling: Optional[float],
                keep: Optional[list] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """query (b, n_head, t, d) with RoPE -> attention output (b, t, n_head, d); row i's queries at its
        own positions pos0[i] ..; keep: a padded prompt's kept tokens per row (the pads' outputs are 0);
        sinks: learned attention sinks (gpt-oss), n_head logits in the scores' units.
        An evicting cache's prompt (t > 1 tokens into empty rows): the queries its scorer needs are kept, and
        after the last layer's attention every row evicts (_evict_rows)."""
        b, n_head, t, d = query.shape
        out = torch.zeros((b, t, n_head * d), dtype=torch.float32)
        evicting = self._evict is not None and t > 1 and all(p == 0 for p in pos0)
        for i, row in enumerate(self.rows):
            qs = query[i:i + 1] if keep is None else query[i:i + 1, :, keep[i]]
            if qs.shape[2] == 0:
                continue
            if evicting and self._evict[0] in evict_mod.QUERY_SCORERS:
                n_q = min(qs.shape[2], self._evict[1]) if self._evict[0] == "snapkv" else qs.shape[2]
                n = qs.shape[2]
                self._qcap[(i, layer)] = self._to_cache_layout(qs[:, :, n - n_q:], n - n_q, "none")[0]
                if sinks is not None:  # the learned sinks join the scorer's softmax (e8kv_cache_evict_sinks)
                    self._qsinks[layer] = sinks.detach().float().reshape(-1).cpu()
            q = self._to_cache_layout(qs, pos0[i], "exact")[0]
            if scaling is not None and abs(scaling * math.sqrt(d) - 1.0) > 1e-6:
                q = q * (scaling * math.sqrt(d))  # the C kernel scales scores by 1/sqrt(head_dim)
            if self.observer is not None:
                self.observer.on_q(layer, self._to_cache_layout(qs, pos0[i], "none"))
            if keep is None:
                row.attend(layer, q, pos0[i], out=out[i], sinks=sinks)
            else:
                out[i, keep[i]] = row.attend(layer, q, pos0[i], sinks=sinks)
        if evicting and layer == self.shape.n_layer - 1:
            self._evict_rows(n_head)
        return out.view(b, t, n_head, d)  # values are never permuted: the model's own layout

    def _evict_rows(self, n_head: int) -> None:
        """Each row's C cache evicts by its spec's scorer (e8kv_cache_evict), with the prompt's queries
        captured per layer (before RoPE, in the cache's layout) when the scorer needs them."""
        for i, row in enumerate(self.rows):
            n = row.n_tokens(0)
            if n == 0:
                continue
            if self._evict[0] in evict_mod.QUERY_SCORERS:
                q = torch.stack([self._qcap.pop((i, layer)) for layer in range(self.shape.n_layer)])
                sinks = None
                if self._qsinks:
                    none = torch.full((n_head,), float("-inf"))
                    sinks = torch.stack([self._qsinks.get(layer, none) for layer in range(self.shape.n_layer)])
                row.evict(q.contiguous(), n_head=n_head, q_pos0=n - q.shape[1], sinks=sinks)
            else:
                row.evict()
        self._qcap.clear()
        self._qsinks.clear()

    # -- accounting
    @property
    def n_bytes(self) -> int:
        """Bytes the C caches have allocated (real, not nominal): e8kv_cache_bytes summed over sequences, plus
        the exact K/V of a hybrid model's sliding-window layers."""
        return sum(r.n_bytes for r in (self.rows or [self._probe]) if r is not None) + _sliding_bytes(self)

    @property
    def bits_per_value(self) -> float:
        r = self.rows[0] if self.rows else self._probe
        return r.bits_per_value

    def save(self, path: Union[str, os.PathLike], row: int = 0, meta: bytes = b"") -> int:
        """Save one sequence's C cache (doc/format.md §4; `e8kv generate --load-cache` reads it)."""
        self._whole_model("save")
        return self.rows[row].save(path, meta)

    def _whole_model(self, what: str) -> None:
        if self.shape.sliding_window is not None:
            raise NotImplementedError(f"e8kv cache: {what} on a model with sliding-window layers (their exact K/V "
                                      "are transformers' and not in e8kv's cache file)")

    def load(self, path: Union[str, os.PathLike], row: int = 0) -> int:
        """Replace one sequence's contents by a saved cache of the same configuration."""
        self._whole_model("load")
        self._ensure_rows(max(row + 1, len(self.rows) or 1))
        for layer in self.layers:
            layer.is_initialized = True
        return self.rows[row].load_into(path)

    # -- attention implementation
    def _attach(self, config: Any) -> None:
        _route(config)

    def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        _claim(self)  # (transformers asks before it makes a forward's masks)
        return super().get_mask_sizes(*args, **kwargs)



# ------------------------------------------------------------------------------------------ the GPU cache
CUDA_FORMATS = ("e8box:4", "e8box:3", "e8p:2", "bf16", "f16")
# what a CUDA cache holds when no spec is given: sink=4 halves e8box:4's loss on the default model (GPU, SmolLM2,
# ctx 512: KLD 0.0223 against 0.0333) for 4 exact tokens per row, and center=rope lowers it by another quarter
# (0.0207 -> 0.0153; ctx 4096: 0.0254 -> 0.0170) for ~1.5-3% of a decode step (BENCHMARKS.md). Models whose
# RoPE frequencies it cannot know (ModelShape.rope_centre_problem: partial rotary, dynamic or longrope
# scaling) and models of head_dim 256 (Gemma 3 1B/4B/12B: the CUDA cache keeps such a head as two halves of 128,
# which center=rope's pairs would straddle) get CUDA_DEFAULT_SPEC_UNTURNED.
CUDA_DEFAULT_SPEC = "e8box:4,sink=4,center=rope"
CUDA_DEFAULT_SPEC_UNTURNED = "e8box:4,sink=4"


def cuda_default_spec(config: Any) -> str:
    """The CUDA cache's spec when none is given, for this model (a config, or its ModelShape): CUDA_DEFAULT_SPEC
    when center=rope knows the frequencies of its RoPE (rope_theta, or a linear, llama3 or yarn scaling) and the
    head_dim is not 256, else CUDA_DEFAULT_SPEC_UNTURNED."""
    s = config if isinstance(config, ModelShape) else ModelShape(config)
    return CUDA_DEFAULT_SPEC if _cuda_rope_centre_problem(s) is None else CUDA_DEFAULT_SPEC_UNTURNED


def _cuda_rope_centre_problem(s: ModelShape) -> Optional[str]:
    """Why the CUDA cache cannot keep center=rope for this model, or None."""
    if s.head_dim == 256:
        return "head_dim 256 (the CUDA cache keeps each head as two halves of 128, and RoPE's pairs straddle them)"
    return s.rope_centre_problem


class E8KVCudaLayer(CacheLayerMixin):
    """One model layer of an E8KVCudaCache: its length is a device tensor (like transformers' StaticLayer),
    so the slots of an update and the context lengths of the attention are computed on the device."""

    is_compileable = True
    is_sliding = False
    is_croppable = True

    def __init__(self, parent: "E8KVCudaCache", layer_idx: int) -> None:
        super().__init__()
        self.parent = parent
        self.layer_idx = layer_idx
        self.cumulative_length = torch.zeros((), dtype=torch.int64, device=parent.device)
        torch._dynamo.mark_static_address(self.cumulative_length)
        # the same on the host, counted by eager updates alone (compiled steps run no Python): never more
        # than the real length, so the check it makes (an eager update past the capacity) never errs
        self.host_length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            _check_kv_shape(self.parent.shape, self.layer_idx, key_states, value_states)
            self.lazy_initialization(key_states, value_states)
        b, t = key_states.shape[0], key_states.shape[2]
        p = self.parent
        if not torch.compiler.is_compiling():
            _check_attached(p)
            p._updated = self.layer_idx  # the attention checks it reads the cache of its own forward
            _tls.handed = (key_states, value_states)  # and that it is given what update returns
            _tls.cuda = p  # (the attention of this layer attends this cache)
        if (p.evict is not None and t > 1 and not torch.compiler.is_compiling() and self.host_length == 0
                and not int(self.cumulative_length)):
            # the prompt of an evicting cache: held back until the attention, which evicts with its queries
            if self.layer_idx == 0:
                p._n_active = max(p._n_active, b)
            need = max(p.evict.kept(t - pad, p.sink, p.block_size) for pad in p._pad_host[:b])
            if need > p.capacity:
                raise E8KVError(ErrorCode.CONTEXT_FULL, f"e8kv CUDA cache: a prompt of {t} tokens keeps {need} after "
                                                        f"evict= ({p.evict.scorer}:{p.evict.frac:g}), more than "
                                                        f"max_cache_len {p.capacity}")
            p._stash[self.layer_idx] = (key_states, value_states)
            self.host_length += t
            self.cumulative_length.add_(t)
            return key_states, value_states
        if not torch.compiler.is_compiling():
            if self.layer_idx == 0:
                self.parent._n_active = max(self.parent._n_active, b)
            if p._hold:  # budget=: old pages make room; a chunk must fit beside the pages that stay
                most = p._hold - (p._s0 + 1) * p.block_size
                if t > most:
                    raise E8KVError(ErrorCode.CONTEXT_FULL, f"e8kv CUDA cache: a chunk of {t} tokens into a cache "
                                                            f"of budget={p.evict.budget} (at most {most} at once)")
            else:
                room = self.parent.capacity + min(self.parent._pad_host[:b])  # a row's pads are not stored
                if self.host_length + t > room:
                    raise E8KVError(ErrorCode.CONTEXT_FULL, f"e8kv CUDA cache: {t} new tokens after "
                                                            f"{self.host_length} exceed max_cache_len "
                                                            f"{self.parent.capacity}")
            self.host_length += t
        if p._hold and self.layer_idx == 0:  # once per step, before any layer appends
            p._make_room(b, t, self.cumulative_length)
        self.parent._append(self.layer_idx, key_states, value_states,
                            self.parent._positions(self.cumulative_length, b, t),
                            first=self.parent._fresh[self.layer_idx])
        self.cumulative_length.add_(key_states.shape[2])
        return key_states, value_states  # the attention reads the past from the pages

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.parent.capacity, 0

    def get_seq_length(self) -> Any:
        return self.cumulative_length if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.parent.capacity

    def reset(self) -> None:
        self.cumulative_length.zero_()
        self.host_length = 0
        self.parent._stash[self.layer_idx] = None
        self.parent.kept[self.layer_idx] = None
        self.parent._evicted_at = 0
        self.parent._full.zero_()
        self.parent._fresh[self.layer_idx] = True
        self.parent._pad.zero_()
        self.parent._pad_host = [0] * self.parent.batch_rows
        self.parent._evicted_host = [0] * self.parent.batch_rows
        self.parent._budget_dropped = [0] * self.parent.batch_rows
        if self.parent._shifts is not None:
            self.parent._shifts[:, 1].zero_()
        self.parent._valid = None
        self.parent._unshare()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count (tokens to remove from the end)")
        if tokens_to_remove and self.parent._hold:
            self.parent._sync_pads()
            if any(self.parent._budget_dropped):
                raise NotImplementedError("e8kv CUDA cache: crop after budget= dropped tokens (the pages at the end "
                                          "of a row's ring no longer follow its positions)")
        if tokens_to_remove and self.parent._evicted_at and \
                int(self.cumulative_length) + tokens_to_remove < self.parent._evicted_at:
            raise NotImplementedError(f"e8kv CUDA cache: crop into a prompt of {self.parent._evicted_at} tokens that "
                                      "was evicted (evict=): its tokens no longer sit at their positions")
        self.cumulative_length.add_(tokens_to_remove).clamp_(min=0)
        n = int(self.cumulative_length)
        self.host_length = min(self.host_length, n)
        if self.parent.kv.centered and n == 0:
            self.parent._fresh[self.layer_idx] = True
        if self.parent._shared and tokens_to_remove:  # the pages appended next must be the row's own again
            self.parent._own_tails(n)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError(_WHOLE_CACHE)

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError(_WHOLE_CACHE)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError(_WHOLE_CACHE)

    def offload(self) -> None:
        pass

    def prefetch(self) -> None:
        pass


class E8KVCudaCache(_BatchChanges, Cache):
    """The GPU variant of E8KVCache (E8KVCache(config, spec, device="cuda", ...) makes one): the pages of
    every layer live in one CUDA cache (include/e8kv_cuda.h, caller-owned block tables: batch row b owns
    pages b*W .. b*W+W-1, W = max_cache_len / block_size), all allocated at creation like StaticCache, so
    shapes are static and the decode step compiles (torch.compile fullgraph, mode "reduce-overhead").

    spec: "e8box:4", "e8box:3", "e8p:2", "bf16", "f16" (CUDA_FORMATS), or any spec of the library's grammar made of them:
    k=/v=/kv= and layer rules ("k=e8box:4,v=bf16,layers0-1=bf16"), and sink=N (N <= 64: the first N tokens
    of each batch row also kept exact and attended from there, as the CPU cache's sink=), center= (as on the
    CPU, e8box and e8p streams are centred by default: each batch row's means are set, per layer, by its
    first tokens appended in eager mode; center=0 turns it off; center=rope, the default where the model's RoPE
    frequencies are known (cuda_default_spec), turns the keys' centre to each key's position on 8 RoPE pairs,
    with K and V both e8box or both e8p:2: after evict= a kept key's centre turns to its slot index, and with
    budget= a shift per row keeps the kept keys' positions). The GPU formats take keys after RoPE
    (rope=post), in the RoPE pair layout E8KVCache codes them in (GGUF's interleaved pairs for Llama and
    Mistral, key_perm; queries follow), so that the pages hold the CPU cache's codes; specs the CUDA cache cannot hold (rope=pre, e8t/e8tv, auto=, presets,
    window=) are an E8KVError (SPEC). evict=SCORER:F (recent=W, obs=W; e8kv.evict) evicts the prompt:
    its K/V wait in update() until the layer's attention, which attends the prompt exactly and then stores
    only the tokens each (batch row, KV head) keeps (kept: which), in slots 0 .. m - 1; the rows' pads grow
    by what was evicted, so later tokens follow at their true positions (see _evict_prompt). budget=N also
    bounds what a row holds while it grows (long generations): the prompt keeps at most N (rounded up to a
    page) by SCORER, and before a step would take a row past N + a page (e8kv.evict's hold), its oldest
    whole pages after the sink's are dropped, on the device, in compiled steps too (_make_room): StreamingLLM's
    choice at page grain, where the C cache's budget= scores each token (keykey for snapkv and h2o) (a cache whose max_cache_len is
    below N + a page drops when it is full). Not with beam search or other batch changes, and no crop once
    something was dropped. update() appends the new tokens through torch.ops.e8kv.append (slots
    computed on the device from the layer's length); the "e8kv" attention attends through
    torch.ops.e8kv.attend: one query row per (batch row, token) with context length position + 1, so a
    chunk with a past reads its own new tokens from the pages too. Two exceptions in eager mode: a chunk of
    several tokens appended to an empty cache (the prompt) is attended by SDPA over its exact K/V (causal,
    GQA), which costs what SDPA costs and sees the prompt's keys uncoded; and a chunk of gather_from tokens
    or more after a past (a long turn of a chat, chunked prefill) is attended by SDPA (flash, causal from the
    bottom right) over the layer's values gathered from the pages in the model's dtype (CudaCache.gather:
    decoded, means added, sink rows exact), which reads the past once for all the chunk's queries where the
    decode kernel reads it once per query; such chunks have no max_chunk limit. Every token after the
    prompt reads codes. prompt_from_codes=True (for measuring quality: what perplexity() uses) sends the
    prompt through the decode kernel too, one virtual row per token (max_chunk must cover its tokens; an
    unpadded prompt), so that every token reads coded K/V, as in the CPU cache, whose first append sets the
    means from the same K/V.

    Padded batches (prompts of different lengths, left- or right-padded, as generate() passes them): the
    attention mask of the prompt (the first forward of an empty cache, eager) says which tokens are pads;
    they are not stored: each row keeps its own tokens at positions 0 .. n - 1 of its pages and attends
    over them alone (the kernel's context length is per row), and the prompt's SDPA masks them. Tokens after
    the prompt must be real (mask 1): padding inside a later chunk is refused (NotImplementedError), and a
    mask whose earlier part disagrees with the padding recorded at the prompt is refused. The lengths seen
    by transformers (get_seq_length, cache_position) stay the padded ones.

    Beam search (generate(num_beams=...); max_batch_size counts batch x beams) and the other batch changes
    (reorder_cache, batch_select_indices, batch_repeat_interleave; called eager, between eager or compiled
    steps: what they change is updated in place, so CUDA graphs replay with it): the rows' block tables share the
    full pages of a common past; the page a row appends into next, and its row of sink rows while it has
    fewer than sink=N tokens, are made its own (copied when another row holds them)."""

    def __init__(self, config: Any, spec: Optional[str] = None, *, max_batch_size: int = 1, max_cache_len: Optional[int] = None,
                 device: Any = "cuda", seed: int = 0, block_size: int = 16, max_chunk: int = 64,
                 gather_from: int = 16, prompt_from_codes: bool = False, **unused: Any) -> None:
        from . import torch_ops  # registers the operators
        bad = [k for k, v in unused.items() if v is not None and k not in ("n_threads",)]
        if bad:
            raise E8KVError(ErrorCode.BAD_ARGUMENT, f"e8kv CUDA cache: unsupported arguments {bad}")
        self.shape = s = ModelShape(config)
        spec = spec or cuda_default_spec(s)
        self.spec, self.seed = spec, seed
        # evict=SCORER:F (recent=, obs=): the prompt's tokens each KV head keeps are chosen after its exact
        # attention, and only they are coded (e8kv.evict)
        self.evict, spec = evict_mod.parse(spec)
        if self.evict is not None and prompt_from_codes:
            raise E8KVError(ErrorCode.BAD_ARGUMENT, "e8kv CUDA cache: evict= with prompt_from_codes (the prompt "
                                                    "is attended exactly, then evicted; perplexity(prefix=P) "
                                                    "measures an evicting cache)")
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.block_size = block_size
        cap = max_cache_len or s.n_ctx
        self.pages_per_seq = (cap + block_size - 1) // block_size
        self.capacity = self.pages_per_seq * block_size
        self.batch_rows = max_batch_size
        self.max_chunk = max_chunk
        self.gather_from = gather_from
        self.prompt_from_codes = prompt_from_codes
        rope_centre = "center=rope" in spec
        why = _cuda_rope_centre_problem(s)
        if rope_centre and why is not None:
            raise E8KVError(ErrorCode.SPEC, f"e8kv CUDA cache '{spec}': center=rope turns the keys' centre by the "
                                            f"model's RoPE frequencies, which it cannot here: {why}")
        # center=rope with budget=: a dropped page moves the later tokens to other indices, so each row's kept
        # tokens after its first pages get a position shift (CudaCache.set_row_shifts), and their positions
        # pass the capacity: the cos/sin table covers the model's positions
        rope_shift = rope_centre and self.evict is not None and bool(self.evict.budget)
        try:
            self.kv = core.CudaCache(s.n_layer, s.n_head_kv, s.head_dim, max_batch_size * self.pages_per_seq, spec,
                                     block_size=block_size, seed=seed, max_ctx=self.capacity,
                                     max_batch=max_batch_size * max(1, max_chunk), max_n_head=s.n_head,
                                     max_seqs=max_batch_size, device=self.device.index,
                                     rope_freqs=s.rope_freqs if rope_centre else None,
                                     rope_positions=max(self.capacity, s.n_ctx) if rope_shift else 0)
        except E8KVError as e:
            why = (f": the CUDA cache holds {', '.join(CUDA_FORMATS)} (k=/v=/kv= and layer rules of them; default "
                   f"{CUDA_DEFAULT_SPEC}), keys "
                   "after RoPE, sink=N up to 64, evict=SCORER:F (recent=, obs=, budget=); not rope=pre, e8t/e8tv, "
                   "auto=, presets, window="
                   if e.code == ErrorCode.SPEC else "")
            raise E8KVError(e.code, f"e8kv CUDA cache '{spec}' for {s.model_type} ({max_batch_size} x "
                                    f"{self.capacity} tokens){why}") from None
        with torch.device(self.device):
            self._state = torch_ops.new_state()
            self._tables = torch.arange(max_batch_size * self.pages_per_seq, dtype=torch.int32).view(
                max_batch_size, self.pages_per_seq)
            self._arange = torch.arange(max(max_chunk, 1), dtype=torch.int64)
            self._batch_rows = torch.arange(max_batch_size, dtype=torch.int32)  # each row's sink rows and means
            self._pad = torch.zeros(max_batch_size, dtype=torch.int64)  # per row: pads dropped from its prompt
            self._full = torch.zeros(1, dtype=torch.int32)  # set when a step went past max_cache_len (check())
            self._page_ids = torch.arange(self.pages_per_seq, dtype=torch.int64)  # budget=: a row's table index
            # keys (and the queries that score them) in the layout E8KVCache codes them in: GGUF's interleaved
            # RoPE pairs for Llama/Mistral, so that the pages hold the CPU cache's codes (a layout is a
            # different rotation of the codec's input: SmolLM2 e8p:2 KLD 0.60 interleaved, 0.80 split)
            self.key_perm: Optional[torch.Tensor] = None
            if s.rope_layout == "interleaved" or rope_centre:  # (center=rope turns interleaved pairs)
                h = s.head_dim // 2
                self.key_perm = torch.stack((torch.arange(h), torch.arange(h) + h), dim=1).reshape(-1)
        self._pad_host = [0] * max_batch_size  # the same on the host (the gather path groups rows by it)
        self._evicted_host = [0] * max_batch_size  # per row: of _pad_host, the prompt tokens evict= removed
        # beam search: rows may share the full pages of a common past (reorder_cache); the host twins of the
        # block tables and of each batch row's row of sink rows and means say who holds what
        self._tables_host = np.arange(max_batch_size * self.pages_per_seq, dtype=np.int32).reshape(
            max_batch_size, self.pages_per_seq)
        self._rows_host = list(range(max_batch_size))
        self._shared = False  # some page or row is no longer where creation put it
        self._n_active = 0  # batch rows in use (the last forward's batch, or a reorder's)
        self._updated: Optional[int] = None  # eager: the layer whose update ran last (the attention's check)
        self._valid: Optional[torch.Tensor] = None  # (b, t) bool: which prompt tokens are kept (a padded prompt)
        self._valid_todo: list[bool] = []  # per layer: its append has still to drop the pads of _valid
        self.sink = self.kv.sink
        self._use_rows = bool(self.sink) or self.kv.centered
        # budget=N: a row holds at most _hold tokens. Its first _s0 pages (those of the sink=, or of the first
        # token) stay; before an append would pass _hold, its oldest other pages are dropped (_make_room).
        # A cache too small to drop a page before it is full (max_cache_len below the sink's pages + 2 pages)
        # never drops: it is sized for all its tokens.
        self._s0 = (max(self.sink, 1) + block_size - 1) // block_size
        hold = min(self.evict.hold(self.sink, block_size), self.capacity) if self.evict is not None else 0
        self._hold = hold if hold // block_size - self._s0 >= 2 else 0
        self._budget_dropped = [0] * max_batch_size  # per row: tokens budget= dropped (known to the host)
        # center=rope with budget=: per row of sink rows and means (from, off): its tokens at index >= from (after
        # its first _s0 pages) are at position index + off, off the tokens it dropped (_make_room)
        self._shifts: Optional[torch.Tensor] = None
        if rope_shift and self._hold:
            self._shifts = torch.zeros((max_batch_size, 2), dtype=torch.int32, device=self.device)
            self._shifts[:, 0] = self._s0 * block_size
        self._fresh = [True] * s.n_layer  # per layer: no token since creation or reset (the host's own record)
        # eviction: per layer, the prompt's K/V held back by update() until the attention has its queries;
        # then which tokens each (batch row, KV head) kept (e8kv.evict.select: indices into the row's prompt)
        self._stash: list[Optional[tuple[torch.Tensor, torch.Tensor]]] = [None] * s.n_layer
        self.kept: list[Optional[list[torch.Tensor]]] = [None] * s.n_layer
        # learned attention sinks (gpt-oss) per layer: float32 copies the kernel reads (set_layer_sinks)
        self._sinks: list[Optional[torch.Tensor]] = [None] * s.n_layer
        self._evicted_at = 0  # the padded prompt length an eviction happened at (crop cannot go below it)
        self._adopt()  # (the operators find self.kv; its row shifts; fixed addresses for CUDA graphs)
        self._config = config
        self._attach(config)
        # a hybrid model's sliding-window layers: transformers' static ones (exact K/V of the window, fixed
        # addresses for CUDA graphs), attended by SDPA with transformers' sliding mask
        # (a row under evict= or budget= sees more tokens than the capacity: its sliding layers keep their window)
        slide_len = max(self.capacity, s.sliding_window or 0) if self.evict is not None else self.capacity
        super().__init__(layers=_model_layers(s, lambda i: E8KVCudaLayer(self, i), lambda: StaticSlidingWindowLayer(
            max_cache_len=slide_len, sliding_window=s.sliding_window)))
        self._lead = self.layers[s.coded_layers[0]]  # the first coded layer: its length is the rows' length

    def __del__(self) -> None:
        key = getattr(self, "_key", None)
        ops = sys.modules.get(__package__ + ".torch_ops")  # no import here: it may run at interpreter exit
        if key is not None and ops is not None:
            ops.unregister_cache(key)

    def _attach(self, config: Any) -> None:
        """Route the model's attention to this cache (_route), the config and its text config pointing here."""
        _route(config)
        for cfg in _configs(config):
            cfg._e8kv_cuda_cache = self

    def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        _claim(self)  # (transformers asks before it makes a forward's masks)
        return super().get_mask_sizes(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> "E8KVCudaCache":
        """copy.deepcopy (transformers' way to reuse a prompt's cache: fill it once, copy it for each request):
        a new CUDA cache of the same parameters holding a copy of the pages, sink rows, means and lengths
        (CudaCache.clone: the whole pool, device to device, on the current stream) and of the small tensors
        around them, sliding layers included; the copy and this cache then change independently and either
        can run the next forward (it attaches itself: _claim). Its device memory is this cache's again. The
        model's config and shape are shared, not copied."""
        if torch.compiler.is_compiling():
            raise E8KVError(ErrorCode.BAD_ARGUMENT, "e8kv CUDA cache: copy.deepcopy inside a compiled region")
        kv = self.kv.clone()
        shared = [self.shape] + ([self._config, *_configs(self._config)] if self._config is not None else [])
        new = _deepcopy_cache(self, memo, shared, {id(self.kv): kv})
        new._adopt()
        return new

    def _adopt(self) -> None:
        """The cache's C cache (self.kv: made at creation, by a copy or by loading) registered for the operators
        and pointed at this cache's tensors (learned sinks, row shifts), which keep fixed addresses for CUDA
        graphs."""
        from . import torch_ops
        self._key = torch_ops.register_cache(self.kv)
        if self._shifts is not None:
            self.kv.set_row_shifts(self._shifts)
        for layer, t in enumerate(self._sinks):
            if t is not None:
                torch._dynamo.mark_static_address(t)
                self.kv.set_layer_sinks(layer, t)
        for t in (self._tables, self._arange, self._batch_rows, self._pad, self._full, self.key_perm,
                  self._page_ids, self._shifts):
            if t is not None:
                torch._dynamo.mark_static_address(t)

    def __getstate__(self) -> dict:
        """pickle / torch.save (torch.load(..., weights_only=False) loads it on the same device): the CUDA
        cache as its parameters and state (CudaCache.state: every page of the pool, sink rows, means, XXH64),
        the tensors around it as tensors; not the model's config: attach(model.config) the loaded cache before
        its first forward (a forward before that is an E8KVError)."""
        d = dict(self.__dict__)
        d.pop("_key", None)
        d["_config"] = None
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._adopt()

    def attach(self, config: Any) -> None:
        """Route the model's attention to this cache (a cache loaded by pickle does not know its model); the
        config must be of the shape the cache was made for."""
        _attach_checked(self, config)

    def detach(self, config: Any) -> None:
        """Give the config back its previous attention implementation (the cache's next forward attaches it
        again)."""
        for cfg in _configs(config):
            if getattr(cfg, "_e8kv_cuda_cache", None) is self:
                cfg._e8kv_cuda_cache = None
                cfg._attn_implementation = getattr(cfg, "_e8kv_fallback", None) or "sdpa"

    # -- padding
    def _note_mask(self, mask: Optional[torch.Tensor], t: int) -> None:
        """The 2-D attention mask of a forward of t new tokens about to run (eager; called by the mask
        interface before any layer). On an empty cache it sets each row's padding, which the prompt's appends
        then drop; later, its new part must be all ones and its earlier part must agree with the padding
        recorded."""
        if mask is not None and mask.dim() != 2:
            return
        padded = mask is not None and not bool(mask.all())
        past = int(self._lead.cumulative_length) if self._lead.is_initialized else 0
        if mask is None:
            # the new tokens are real. generate() makes the mask before the forward (then the forward sees
            # none): the padding it noted for this prompt stands
            if past == 0 and not (self._valid is not None and self._valid.shape[1] == t):
                self._valid, self._valid_todo = None, []
                if any(self._pad_host):
                    self._pad.zero_()
                    self._pad_host = [0] * self.batch_rows
            return
        self._valid, self._valid_todo = None, []
        if padded and mask.shape[1] != past + t:
            raise NotImplementedError(f"e8kv CUDA cache: an attention mask of {mask.shape[1]} positions for {t} new "
                                      f"tokens after {past}: a padded mask must cover exactly the tokens seen")
        if past == 0:
            pads = [0] * self.batch_rows
            if padded:
                b = mask.shape[0]
                if b > self.batch_rows:
                    raise E8KVError(ErrorCode.DIMENSION, f"e8kv CUDA cache: a batch of {b} rows exceeds "
                                                         f"max_batch_size {self.batch_rows}")
                valid = mask.to(torch.bool)
                pads[:b] = (~valid).sum(1).tolist()
                self._valid, self._valid_todo = valid, [True] * self.shape.n_layer
            if pads != self._pad_host:
                self._pad.copy_(torch.tensor(pads, dtype=torch.int64))
                self._pad_host = pads
            return
        pads = [p - e for p, e in zip(self._pad_host[:mask.shape[0]], self._evicted_host)]
        if padded or any(pads):
            _check_later_mask(mask, past, pads, "e8kv CUDA cache")

    def _positions(self, length: torch.Tensor, b: int, t: int, row0: int = 0) -> torch.Tensor:
        """(b, t): the positions in their rows' pages of t new tokens after `length` (padded) positions."""
        return (length - self._pad[row0:row0 + b])[:, None] + self._steps(t)[None, :]

    def _make_room(self, b: int, t: int, length: torch.Tensor) -> None:
        """budget=: before t new tokens of rows 0 .. b-1 are stored (called by layer 0, so once per step and
        before any layer appends), each row that would hold more than _hold tokens drops its oldest whole
        pages after its first _s0 (StreamingLLM's choice: sinks and the newest tokens, at page grain): its
        block table's ring of pages _s0 .. _hold/block_size - 1 turns by that many pages, on the device (static
        shapes, no host value: the same in compiled steps), so the dropped pages come last, to be written next,
        and no K/V moves; its pad grows by the tokens dropped, so that later tokens keep their positions
        (RoPE phases, cache_position) while the attention reads only what is held. length: the layer's
        (padded) length before the step."""
        bs, s0 = self.block_size, self._s0
        ring = self._hold // bs - s0
        held = length - self._pad[:b]
        k = torch.minimum((held + t - self._hold + bs - 1).clamp(min=0) // bs, (held // bs - s0).clamp(min=0))
        j = self._page_ids[None, :]
        idx = torch.where((j >= s0) & (j < s0 + ring), s0 + (j - s0 + k[:, None]) % ring, j)
        self._tables[:b].copy_(torch.gather(self._tables[:b], 1, idx))
        self._pad[:b].add_(k * bs)
        if self._shifts is not None:  # center=rope: the kept tokens keep their positions
            self._shifts[:, 1].index_add_(0, self._batch_rows[:b].long(), (k * bs).to(torch.int32))
        if not torch.compiler.is_compiling():
            self._sync_pads()

    def _sync_pads(self) -> None:
        """budget=: the host's twins of the rows' pads after drops made on the device (by compiled steps too):
        what grew was dropped (synchronises)."""
        pads = self._pad.tolist()
        for i, (new, old) in enumerate(zip(pads, self._pad_host)):
            self._evicted_host[i] += new - old
            self._budget_dropped[i] += new - old
        self._pad_host = pads

    def _steps(self, n: int) -> torch.Tensor:
        """0 .. n - 1 (int64, on the cache's device): the static _arange when it is long enough."""
        return self._arange[:n] if n <= self._arange.shape[0] else torch.arange(n, dtype=torch.int64,
                                                                                device=self._arange.device)

    # -- beam search and batch changes (_BatchChanges): rows share the full pages of their common past (block
    # tables, as serving engines fork sequences); the page each row appends into next is made its own (copied
    # when it holds tokens), and so is its row of sink rows while it has fewer than sink=N tokens: a change
    # costs one page per (layer, K/V) per row that changes, not the whole cache
    _who = "e8kv CUDA cache"

    def _batch_size(self) -> int:
        return self._n_active

    def _take(self, idx: list[int], who: str) -> None:
        if self._hold:
            raise NotImplementedError(f"e8kv CUDA cache {who} with budget=: rows that share pages cannot drop "
                                      "them (beam search and batch changes need a cache without budget=)")
        if len(idx) > self.batch_rows:
            raise E8KVError(ErrorCode.DIMENSION, f"e8kv CUDA cache {who}: {len(idx)} rows exceed max_batch_size "
                                                 f"{self.batch_rows}")
        B, m = self.batch_rows, len(idx)
        rest = [0] * (B - m)
        self._tables_host = np.concatenate((self._tables_host[idx], self._tables_host[:B - m]))
        self._rows_host = [self._rows_host[i] for i in idx] + [-1] * (B - m)
        self._pad_host = [self._pad_host[i] for i in idx] + rest
        self._evicted_host = [self._evicted_host[i] for i in idx] + rest
        self._pad.copy_(torch.tensor(self._pad_host, dtype=torch.int64))
        self._n_active, self._shared = m, True
        self._own_tails(int(self._lead.cumulative_length) if self._lead.is_initialized else 0)

    def _own_tails(self, length: int) -> None:
        """After rows were made to share pages and rows (_select) or shortened (crop): every batch row gets
        pages of its own from the page it appends into next to the end of its table (the first row to hold a
        page keeps it; the others get free pages, the tokens of a partial page copied), and a row of sink
        rows of its own while it has fewer than sink=N tokens (copied likewise). `length`: the padded length
        of the active rows; inactive rows count as empty."""
        B, W, bs = self.batch_rows, self.pages_per_seq, self.block_size
        lens = np.array([max(length - p, 0) if r < self._n_active else 0 for r, p in enumerate(self._pad_host)])
        t = self._tables_host.copy()
        tail = np.arange(W)[None, :] >= (lens // bs)[:, None]  # (B, W): the pages still to be written
        flat = t.reshape(-1)
        claimed = np.zeros(B * W, dtype=bool)
        claimed[flat[~tail.reshape(-1)]] = True  # full pages: shared freely (never written again)
        at = np.flatnonzero(tail.reshape(-1))  # row-major: a lower row keeps a page first
        vals = flat[at]
        keep = np.zeros(at.size, dtype=bool)
        keep[np.unique(vals, return_index=True)[1]] = True
        keep &= ~claimed[vals]
        claimed[vals[keep]] = True
        need = at[~keep]
        free = np.flatnonzero(~claimed)[:need.size]
        assert free.size == need.size  # B*W pages always suffice: each row holds W entries
        r, j = need // W, need % W
        partial = (j == lens[r] // bs) & (lens[r] % bs != 0) & (r < self._n_active)
        if partial.any():
            self.kv.copy_pages(flat[need[partial]], free[partial])
        flat[need] = free
        self._tables_host = t
        self._tables.copy_(torch.from_numpy(t))
        if not self._use_rows:
            return
        rows = list(self._rows_host)
        own = [r >= self._n_active or lens[r] < self.sink for r in range(B)]  # rows whose sink rows change
        held = {rows[r] for r in range(B) if not own[r] and rows[r] >= 0}
        src, dst, wants = [], [], []
        for r in range(B):
            if own[r]:
                if rows[r] >= 0 and rows[r] not in held:
                    held.add(rows[r])
                else:
                    wants.append(r)
        spare = iter(x for x in range(B) if x not in held)
        for r in wants:
            x = next(spare)
            if rows[r] >= 0 and r < self._n_active:
                src.append(rows[r])
                dst.append(x)
            rows[r] = x
        if src:
            self.kv.copy_rows(src, dst)
        self._rows_host = rows
        self._batch_rows.copy_(torch.tensor(rows, dtype=torch.int32))

    def _unshare(self) -> None:
        """Creation's layout again (reset): row b holds pages b*W .. b*W+W-1 and row b of sink rows."""
        self._n_active = 0
        if self._shared or self._hold:  # (budget= turns each row's table: _make_room)
            B, W = self.batch_rows, self.pages_per_seq
            self._tables_host = np.arange(B * W, dtype=np.int32).reshape(B, W)
            self._rows_host = list(range(B))
            self._tables.copy_(torch.from_numpy(self._tables_host))
            self._batch_rows.copy_(torch.arange(B, dtype=torch.int32))
            self._shared = False

    # -- storing and reading
    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """(b, h, t, d) -> (b * t, h * d) contiguous, rows b-major. (K/V sliced from a fused projection, Phi-3's
        qkv_proj, keep its row stride through the reshape: the operators take contiguous rows.)"""
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b * t, h * d).contiguous()

    def _append(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor, pos: torch.Tensor,
                row0: int = 0, first: bool = True) -> None:
        """Store K/V (b, n_head_kv, t, head_dim) of batch rows row0 .. row0+b-1 at positions pos (b, t) of
        their pages; a padded prompt's pads (_valid) are dropped and its tokens stored at 0 .. n - 1. K/V of a
        layer on another device (a model split by device_map) are copied to the cache's device first."""
        if _other_device(key_states.device, self.device):
            key_states, value_states = key_states.to(self.device), value_states.to(self.device)
        b, h, t, d = key_states.shape
        keep = None
        if (not torch.compiler.is_compiling() and self._valid is not None and self._valid_todo[layer]
                and tuple(self._valid.shape) == (b, t)):  # (compiled steps never look at _valid)
            self._valid_todo[layer] = False
            keep = self._valid.to(key_states.device)
            pos = keep.to(torch.int64).cumsum(1) - 1
        # slot = the page of the row's block table holding pos; a pad (pos -1) or past the capacity: -1 (none,
        # and check() says CONTEXT_FULL: compiled steps, e.g. those generate() compiles, cannot raise)
        if layer == 0:
            self._full.bitwise_or_((pos >= self.capacity).any().to(torch.int32))
        bs = self.block_size
        page = torch.gather(self._tables[row0:row0 + b], 1, (pos // bs).clamp(0, self.pages_per_seq - 1))
        slots = torch.where((pos >= 0) & (pos < self.capacity), page.to(torch.int64) * bs + pos % bs,
                            torch.full_like(pos, -1)).reshape(-1)
        sink_slots = None
        if self.sink:  # positions below sink=N also into the row's sink rows
            row = self._batch_rows[row0:row0 + b, None].to(torch.int64)
            sink_slots = torch.where(pos < self.sink, row * self.sink + pos, torch.full_like(pos, -1)).reshape(-1)
        if self.key_perm is not None:
            key_states = key_states.index_select(-1, self.key_perm)
        kr, vr = self._rows(key_states), self._rows(value_states)
        rows = positions = None
        if self.kv.centered:
            rows = self._batch_rows[row0:row0 + b].repeat_interleave(t) if t > 1 else self._batch_rows[row0:row0 + b]
        if self.kv.rope_centre:  # center=rope: each token's index in its row (the centre is turned to it)
            at = pos
            if self._shifts is not None:  # ... shifted past the row's first pages by what budget= dropped
                sh = self._shifts[self._batch_rows[row0:row0 + b].long()].to(torch.int64)
                at = torch.where(pos >= sh[:, :1], pos + sh[:, 1:], pos)
            positions = at.reshape(-1).to(torch.int32)
        if keep is not None:
            flat = keep.reshape(-1)
            slots, kr, vr = slots[flat], kr[flat], vr[flat]
            sink_slots = sink_slots[flat] if sink_slots is not None else None
            rows = rows[flat] if rows is not None else None
            positions = positions[flat] if positions is not None else None
            if slots.numel() == 0:
                return
        if self.kv.centered and first and not torch.compiler.is_compiling():
            # a row's first tokens set its means (the CPU cache's rule); a first append inside a compiled step
            # keeps the row's previous means, which its encode and attention then share. A row of pads only
            # keeps its means (they are never read before it has a token).
            counts = keep.sum(1).tolist() if keep is not None else [t] * b
            o = 0
            for i in range(b):
                if counts[i]:
                    self.kv.set_means(layer, self._rows_host[row0 + i], kr[o:o + counts[i]], vr[o:o + counts[i]])
                o += counts[i]
            short = [c for c in counts if 0 < c < 16]
            if short and layer == 0:
                warnings.warn(f"e8kv CUDA cache: a batch row's first append has {short[0]} tokens (fewer than 16): "
                              "its means stay 0 and its streams are coded uncentred for the whole sequence "
                              "(SmolLM2, e8box:4: KLD 0.044 instead of 0.035); start from a prompt of 16 tokens "
                              "or more, or say center=0", stacklevel=2)
            self._fresh[layer] = False
        torch.ops.e8kv.append(self._state, self._key, layer, slots, kr, vr, sink_slots, rows, positions)

    def fill(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor, row0: int = 0) -> None:
        """Write K/V (b, n_head_kv, t, head_dim) of batch rows row0 .. row0+b-1 at positions 0 .. t-1 of a
        layer without changing its length (pre-filling by pieces; then set_length)."""
        b, t = key_states.shape[0], key_states.shape[2]
        pos = torch.arange(t, dtype=torch.int64, device=key_states.device)[None, :].expand(b, t)
        self._append(layer, key_states, value_states, pos, row0)

    def set_length(self, n: int) -> None:
        """Set every coded layer's length to n (after fill; a hybrid model's sliding-window layers are not
        filled this way)."""
        for layer in self.layers:
            if layer.is_sliding:
                continue
            layer.is_initialized = True
            layer.cumulative_length.fill_(n)
            layer.host_length = n

    def check(self) -> None:
        """Raise the error an append reported (NaN/Inf or out-of-range input, or tokens past max_cache_len in
        compiled steps, which were not stored) since creation; synchronises."""
        core.CudaCache.check_status(self._state)
        if int(self._full.item()):
            raise E8KVError(ErrorCode.CONTEXT_FULL, f"e8kv CUDA cache: tokens past max_cache_len {self.capacity} "
                                                    "were not stored")

    def _attend(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                scaling: Optional[float], sinks: Optional[torch.Tensor] = None,
                model_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, None]:
        """model_mask: the model's own mask when it is not the causal one (_e8kv_mask: else None); taken in the
        prompt of an empty cache (SDPA over the exact K/V), refused elsewhere."""
        b, n_head, t, d = query.shape
        lead = self.layers[module.layer_idx]
        layer = lead.layer_idx  # the CUDA cache's layer
        if not torch.compiler.is_compiling():
            if self._updated != layer:  # the update that ran last was another layer's
                raise UnsupportedModelError(
                    f"e8kv CUDA cache: layer {module.layer_idx}'s attention does not follow its own cache update "
                    f"(the last update was of the cache's layer {self._updated}, this is its layer {layer}): "
                    "e8kv attends a layer's pages right after the update that appended to them")
            self._updated = None
            _check_handed(module, key, value)
        length = lead.cumulative_length  # after this step's update
        self._set_sinks(layer, sinks, n_head)  # (the prompt's eager call sets them for compiled steps)
        prompt = t > 1 and not torch.compiler.is_compiling() and int(length) == t
        if prompt and self.prompt_from_codes and self._valid is not None:
            raise NotImplementedError("e8kv CUDA cache: prompt_from_codes with a padded prompt")
        own = _not_causal(model_mask)
        if own and not (prompt and not self.prompt_from_codes):
            _refuse_not_causal(module, "after the prompt" if not prompt else "with prompt_from_codes")
        if prompt and not self.prompt_from_codes:
            # the prompt of an empty cache: SDPA over the exact K/V of the chunk; pads are masked as keys (a
            # pad's query sees itself, so that no row of the mask is empty); the model's own mask (its first t
            # columns: the prompt's tokens) when it is not the causal one
            mask = None
            if own:
                m = model_mask[..., :t].to(query.device)
                mask = (m if m.dtype == torch.bool else m == 0) | torch.eye(t, dtype=torch.bool, device=query.device)
            elif self._valid is not None and tuple(self._valid.shape) == (b, t):
                ar = torch.arange(t, device=query.device)
                mask = ((ar[None, :] <= ar[:, None])[None] & self._valid.to(query.device)[:, None, :]) | (
                    ar[None, :] == ar[:, None])[None]
                mask = mask[:, None]
            out = _sdpa(query, key, value, attn_mask=mask, is_causal=mask is None, scale=scaling,
                        enable_gqa=n_head != key.shape[1], sinks=sinks)
            if self._stash[layer] is not None:
                self._evict_prompt(layer, query, scaling, sinks)
            return out.transpose(1, 2), None
        home = query.device  # a layer on another device than the cache (device_map): its query goes over and back
        moved = _other_device(home, self.device)
        if moved:
            query = query.to(self.device)
        if t > 1 and t >= self.gather_from and not torch.compiler.is_compiling() and not prompt:
            out = self._attend_gathered(layer, query, int(length), scaling, sinks)
            return (out.to(home) if moved else out), None
        q = self._rows(query if self.key_perm is None else query.index_select(-1, self.key_perm))
        if scaling is not None and abs(scaling * math.sqrt(d) - 1.0) > 1e-6:
            q = q * (scaling * math.sqrt(d))  # the kernel scales scores by 1/sqrt(head_dim)
        if t == 1:
            tables = self._tables[:b]
            # past max_cache_len nothing is stored (slot -1): the kernel never reads past the row's table
            ctx = (length - self._pad[:b]).clamp(max=self.capacity).to(torch.int32)
            rows = self._batch_rows[:b] if self._use_rows else None
        else:  # one virtual row per (batch row, token): context = its position + 1
            if b * t > self.batch_rows * max(1, self.max_chunk):
                raise E8KVError(ErrorCode.DIMENSION, f"e8kv CUDA cache: a chunk of {t} tokens x {b} rows with a "
                                                     f"past exceeds max_chunk {self.max_chunk}")
            tables = self._tables[:b].repeat_interleave(t, dim=0)
            ctx = (self._positions(length, b, t) - (t - 1)).clamp(max=self.capacity).to(torch.int32).reshape(-1)
            rows = self._batch_rows[:b].repeat_interleave(t) if self._use_rows else None
        out = torch.ops.e8kv.attend(self._state, self._key, layer, q, tables, ctx, self.capacity, rows)
        out = out.view(b, t, n_head, d).to(query.dtype)
        return (out.to(home) if moved else out), None

    def _evict_prompt(self, layer: int, query: torch.Tensor, scaling: Optional[float],
                      sinks: Optional[torch.Tensor] = None) -> None:
        """Store the layer's held-back prompt less what evict= removes: per batch row (its real tokens: a
        padded prompt's pads are never candidates) and KV head, e8kv.evict.select's tokens, in position order,
        at 0 .. m - 1 of the row's pages (keys keep their RoPE phases: they are stored after RoPE). A head's
        slot i may hold another token than the next head's: attention reads each head's slots as a set. The
        rows' pads grow by what was evicted, so later tokens go to m, m + 1, ... of their pages while their
        positions (cache_position, RoPE) stay the prompt's. sinks: the layer's learned attention sinks, which
        join the scorer's softmax (e8kv.evict.scores)."""
        key, value = self._stash[layer]
        self._stash[layer] = None
        b, h, t, d = key.shape
        valid = self._valid if self._valid is not None and tuple(self._valid.shape) == (b, t) else None
        if valid is not None:
            self._valid_todo[layer] = False  # the pads are dropped here
            valid = valid.to(key.device)
        cfg, kept = self.evict, []
        pads = [p - e for p, e in zip(self._pad_host, self._evicted_host)]  # the prompt's own pads
        for i in range(b):
            idx = valid[i].nonzero()[:, 0] if valid is not None else None
            k, v, q = (key[i], value[i], query[i]) if idx is None else (key[i][:, idx], value[i][:, idx], query[i][:, idx])
            sel = evict_mod.select(cfg, q if cfg.needs_queries else None, k, sink=self.sink, block=self.block_size,
                                   scale=scaling, sinks=sinks if cfg.needs_queries else None)
            m = sel.shape[1]
            at = sel[..., None].expand(-1, -1, d)
            self._append(layer, torch.gather(k, 1, at)[None], torch.gather(v, 1, at)[None], self._steps(m)[None],
                         row0=i, first=True)
            kept.append(sel if idx is None else idx[sel])
            self._evicted_host[i] = t - m - pads[i]
            pads[i] = t - m  # pads and evicted tokens: what is not stored
        self.kept[layer] = kept
        if pads != self._pad_host:  # every layer keeps as many: the first one sets the rows' pads
            self._pad.copy_(torch.tensor(pads, dtype=torch.int64))
            self._pad_host = pads
        self._evicted_at = t

    def _set_sinks(self, layer: int, sinks: Optional[torch.Tensor], n_head: int) -> None:
        """The kernel's copy of a layer's learned sinks (float32, on the cache's device, a fixed address for
        CUDA graphs): made and refreshed by eager calls (the prompt's always is one)."""
        have = self._sinks[layer]
        if sinks is None:
            if have is not None:  # (another model on this cache: its layers have no sinks)
                if torch.compiler.is_compiling():
                    raise UnsupportedModelError("e8kv CUDA cache: learned sinks set by an eager call and absent here")
                self.kv.set_layer_sinks(layer, None)
                self._sinks[layer] = None
            return
        if torch.compiler.is_compiling():
            if have is None or have.numel() != n_head:
                raise UnsupportedModelError("e8kv CUDA cache: a compiled step of a model with learned attention sinks "
                                            "before any eager forward (the prompt's) set them")
            return
        if have is None or have.numel() != n_head:
            have = torch.empty(n_head, dtype=torch.float32, device=self.device)
            torch._dynamo.mark_static_address(have)
            self.kv.set_layer_sinks(layer, have)
            self._sinks[layer] = have
        have.copy_(sinks.detach().reshape(-1))

    def _attend_gathered(self, layer: int, query: torch.Tensor, length: int, scaling: Optional[float],
                         sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """A chunk of t queries (the last t positions of each row's `length` less its pads) over the layer's
        gathered values: SDPA with the causal mask aligned to the bottom right, batch rows in groups of one
        length whose gathered K/V stay under 1 GiB. Returns (b, t, n_head, d)."""
        from torch.nn.attention.bias import causal_lower_right
        b, n_head, t, d = query.shape
        s = self.shape
        dt = query.dtype if query.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32
        g = n_head // s.n_head_kv
        lens = [length - p for p in self._pad_host[:b]]
        groups, r0 = [], 0  # consecutive rows of one length, at most `per` of them
        while r0 < b:
            per = max(1, (1 << 30) // max(1, 2 * lens[r0] * s.n_head_kv * d * (torch.finfo(dt).bits // 8)))
            r1 = r0 + 1
            while r1 < b and r1 - r0 < per and lens[r1] == lens[r0]:
                r1 += 1
            groups.append((r0, r1))
            r0 = r1
        outs = []
        for r0, r1 in groups:
            length = lens[r0]
            mask = causal_lower_right(t, length)
            rows = self._batch_rows[r0:r1] if self._use_rows else None
            k, v = self.kv.gather(layer, length, self._tables[r0:r1], rows=rows, dtype=dt)
            q = query[r0:r1].to(dt)
            if self.key_perm is not None:  # the pages' keys are in key_perm's layout
                q = q.index_select(-1, self.key_perm)
            out = None
            if dt != torch.float32:
                try:  # flash: GQA and the bottom-right causal mask without materialising either
                    out = _sdpa(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=g > 1, sinks=sinks)
                except (RuntimeError, ValueError):  # no flash here (e.g. head_dim): K/V heads repeated below
                    out = None
            if out is None:
                if g > 1:
                    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
                out = _sdpa(q, k, v, attn_mask=mask, scale=scaling, sinks=sinks)
            outs.append(out)
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.transpose(1, 2).to(query.dtype)

    # -- accounting
    @property
    def n_bytes(self) -> int:
        """Device bytes the cache holds: the C cache's one allocation (pages, tables, workspace) plus its
        small torch tensors (block tables, lengths, status word), plus the exact K/V of a hybrid model's
        sliding-window layers."""
        extra = sum(x.numel() * x.element_size() for x in (self._state, self._tables, self._arange, self._pad,
                                                                self._full, self._batch_rows, self.key_perm)
                    if x is not None)
        return self.kv.device_bytes + extra + 8 * self.shape.n_layer + _sliding_bytes(self)

    @property
    def bits_per_value(self) -> float:
        s = self.shape
        return 8.0 * self.kv.token_bytes / (2 * s.n_layer * s.n_head_kv * s.head_dim)

# ------------------------------------------------------------------------------------------ attention
def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, attn_mask: Any = None,
          is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False,
          sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """scaled_dot_product_attention, with learned attention sinks (gpt-oss: a logit per query head that joins
    each softmax with a zero value) as one more key that every query sees, first: the queries take the sink
    over the scale in two more coordinates (a hi and a lo part in the queries' dtype), that key 1 in both and
    0 elsewhere, its value 0; coordinates padded to a multiple of 8 (what the fused kernels take), the output
    cut back. The mask gets the sink's column: a bottom-right causal bias one key wider, a tensor one more
    column; is_causal (square: the prompt) one more query first, so that the mask stays square and causal
    (flash attention, GQA) and sees the sink alone."""
    f = torch.nn.functional.scaled_dot_product_attention
    if sinks is None:
        return f(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    from torch.nn.attention.bias import CausalBias, causal_lower_right
    b, h, t, d = query.shape
    hk, n = key.shape[1], key.shape[2]
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    x = sinks.detach().to(device=query.device, dtype=torch.float32).reshape(1, h, 1, 1) / sc
    hi = x.to(query.dtype)
    lo = (x - hi.float()).to(query.dtype)
    e = 2 + (-(d + 2)) % 8
    q2 = torch.cat([query, hi.expand(b, h, t, 1), lo.expand(b, h, t, 1), query.new_zeros((b, h, t, e - 2))], -1)
    sink_k = key.new_zeros((b, hk, 1, d + e))
    sink_k[..., d:d + 2] = 1
    k2 = torch.cat([sink_k, torch.cat([key, key.new_zeros((b, hk, n, e))], -1)], 2)
    v2 = torch.cat([value.new_zeros((b, hk, 1, d + e)), torch.cat([value, value.new_zeros((b, hk, n, e))], -1)], 2)
    if attn_mask is None and is_causal:  # a square causal mask stays one: a first query that sees the sink alone
        if t != n:
            raise ValueError("e8kv: a causal SDPA with sinks over another number of keys than queries")
        q2 = torch.cat([q2.new_zeros((b, h, 1, d + e)), q2], 2)
        return f(q2, k2, v2, is_causal=True, scale=sc, enable_gqa=enable_gqa)[:, :, 1:, :d]
    if attn_mask is None:
        mask = None
    elif isinstance(attn_mask, CausalBias):
        mask = causal_lower_right(t, n + 1)
    else:
        col = torch.ones_like(attn_mask[..., :1]) if attn_mask.dtype == torch.bool else \
            torch.zeros_like(attn_mask[..., :1])
        mask = torch.cat([col, attn_mask], -1)
    return f(q2, k2, v2, attn_mask=mask, scale=sc, enable_gqa=enable_gqa)[..., :d]


def _e8kv_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
               mask_function: Optional[Callable] = None, attention_mask: Optional[torch.Tensor] = None,
               local_size: Optional[int] = None, **kwargs: Any) -> Optional[torch.Tensor]:
    """Mask interface for "e8kv": remembers the batch's padding (the CPU cache's rows drop the pads) and
    builds the SDPA mask that the fallback (caches of other kinds, a hybrid model's sliding-window layers:
    local_size) needs. With a CUDA cache no mask is made for the coded layers (the kernel bounds each row by
    its context length); the cache reads the 2-D mask's padding.
    A mask function of the model's own (transformers composes it: an image's tokens that see each other,
    Gemma 3's multimodal model; a sliding window given as an and-mask instead of local_size) is always made,
    and a made mask that is not the causal one of the same call is marked: a fallback layer (sliding window)
    attends with it, a coded layer with it in the CUDA cache's prompt of an empty cache and refuses elsewhere
    (its attention over the codes is causal)."""
    cfg = kwargs.get("config")
    if torch.compiler.is_compiling():  # (a compiled step: the cache its eager forwards attached)
        gpu = getattr(cfg, "_e8kv_cuda_cache", None)
    else:  # the forward's own cache (_claim): a DynamicCache's forward gets the fallback's mask
        owner, _tls.owner = getattr(_tls, "owner", None), None
        gpu = owner if isinstance(owner, E8KVCudaCache) else None
        if owner is None:  # another kind of cache (or none): compiled steps after it must not read a CUDA cache
            for c in _configs(cfg) if cfg is not None else ():
                if getattr(c, "_e8kv_cuda_cache", None) is not None:
                    c._e8kv_cuda_cache = None
    own = mask_function is not None and mask_function is not causal_mask_function
    if gpu is not None:
        if local_size is None:
            if not torch.compiler.is_compiling():
                gpu._note_mask(attention_mask, q_length)
            if not own:
                return None
    else:
        _tls.mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
    kw = dict(kwargs)
    # the mask the fallback attention takes (eager: an additive float mask; sdpa: a boolean one)
    make = ALL_MASK_ATTENTION_FUNCTIONS.get(getattr(cfg, "_e8kv_fallback", None) or "sdpa", sdpa_mask)
    mask = make(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset, attention_mask=attention_mask,
                local_size=local_size, **kw, **({"mask_function": mask_function} if mask_function is not None else {}))
    if own and local_size is None and mask is not None and not torch.compiler.is_compiling():
        kw["allow_is_causal_skip"] = False
        causal = make(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                      attention_mask=attention_mask, mask_function=causal_mask_function, **kw)
        if causal is None or causal.shape != mask.shape or not torch.equal(causal, mask):
            mask._e8kv_not_causal = True
    return mask


def _check_coded_call(module: torch.nn.Module, kwargs: dict) -> None:
    """A coded layer's call must be plain causal softmax attention over the whole past: a sliding window the
    layer passes (which its config's layer types do not declare; what the layer passes decides: EXAONE 4 keeps
    the window on every attention module and passes it from its sliding layers alone), soft-capping or
    non-causal attention (an encoder's) is refused."""
    layer = getattr(module, "layer_idx", "?")
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise UnsupportedModelError(
            f"e8kv cache: layer {layer} passes a sliding window "
            f"({kwargs.get('sliding_window')}) its config's layer types do not declare, or soft-capping "
            f"({kwargs.get('softcap')}): e8kv codes full-attention layers with plain softmax attention")
    if getattr(module, "is_causal", True) is False or kwargs.get("is_causal", True) is False:
        raise UnsupportedModelError(f"e8kv cache: layer {layer} attends non-causally (e8kv's attention is causal: "
                                    "each query sees the tokens up to its own)")


def _not_causal(mask: Any) -> bool:
    """The model's own attention mask for this call is not the causal one (marked by _e8kv_mask)."""
    return getattr(mask, "_e8kv_not_causal", False)


def _refuse_not_causal(module: torch.nn.Module, where: str) -> None:
    raise UnsupportedModelError(
        f"e8kv cache: layer {getattr(module, 'layer_idx', '?')}'s attention mask is not causal {where} (e.g. an "
        "image's tokens that see each other: Gemma 3 with images); e8kv attends causally over its codes (the CUDA "
        "cache takes such a mask in the prompt of an empty cache, whose attention is over the exact K/V)")


def _check_handed(module: torch.nn.Module, key: torch.Tensor, value: torch.Tensor) -> None:
    """The attention must be given the K/V the cache's update returned (eager calls; a compiled step replays
    what they checked). It reads the past from the codes, with query head h on KV head h // (query heads per
    KV head): a model that splits V (differential attention: DiffLlama) or repeats the KV heads in another
    order (mixture of attention heads: JetMoE) between its update and its attention call would get attention
    over other K/V than its own, silently; it is refused by name."""
    kv = getattr(_tls, "handed", None)
    _tls.handed = None
    if kv is None or key is not kv[0] or value is not kv[1]:
        raise UnsupportedModelError(
            f"e8kv cache: layer {getattr(module, 'layer_idx', '?')} ({type(module).__name__}) calls its attention "
            "with other K/V than the cache's update returned (e.g. V split in halves: differential attention; KV "
            "heads repeated in its own order: mixture of attention heads); e8kv's attention reads the cache's "
            "codes, so it cannot be that attention")


def e8kv_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None,
                   dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """attn_implementation "e8kv": causal attention of the new queries over the layer's stored codes.
    Layers whose cache is not an E8KVCache run the config's previous implementation."""
    if torch.compiler.is_compiling():  # (a compiled step: the cache its eager forwards attached)
        gpu = getattr(module.config, "_e8kv_cuda_cache", None)
    else:  # the cache whose update ran for this layer: none when the forward's cache is of another kind
        gpu, _tls.cuda = getattr(_tls, "cuda", None), None  # (its _attend checks the update was this layer's)
    sinks = kwargs.get("s_aux")  # learned attention sinks (gpt-oss): a logit per query head
    if gpu is not None and query.device.type == gpu.device.type and not gpu.layers[module.layer_idx].is_sliding:
        _check_coded_call(module, kwargs)
        return gpu._attend(module, query, key, value, scaling, sinks, attention_mask)
    pending = getattr(_tls, "pending", None)
    layer = getattr(module, "layer_idx", None)
    if pending is None or pending[0].shape.coded_layers[pending[1]] != layer:
        fallback = getattr(module.config, "_e8kv_fallback", None) or "sdpa"
        if fallback == "eager":
            fn = sys.modules[type(module).__module__].eager_attention_forward
        else:
            fn = ALL_ATTENTION_FUNCTIONS[fallback if fallback != ATTN_NAME else "sdpa"]
        return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    _tls.pending = None
    cache, layer, pos0, keep = pending
    _check_coded_call(module, kwargs)
    _check_handed(module, key, value)
    if _not_causal(attention_mask):
        _refuse_not_causal(module, "(the CPU cache)")
    if dropout and module.training:
        raise NotImplementedError("e8kv cache: attention dropout (training) is not supported")
    out = cache._attend(layer, pos0, query, scaling, keep, sinks)
    return out.to(query.dtype), None


_registered = False


def register() -> None:
    """Register attn_implementation "e8kv" (attention and mask functions) with transformers; idempotent."""
    global _registered
    if not _registered:
        AttentionInterface.register(ATTN_NAME, e8kv_attention)
        AttentionMaskInterface.register(ATTN_NAME, _e8kv_mask)
        _registered = True


# ------------------------------------------------------------------------------------------ one line
@contextlib.contextmanager
def compress(model: Any, spec: Optional[str] = None, *, calib: Union[Calib, str, os.PathLike, None] = None,
             n_ctx: Optional[int] = None, seed: int = 0, n_threads: int = 0, device: Any = None) -> Iterator[Any]:
    """Within the block, generate() and forward calls that bring no cache of their own use a fresh e8kv cache
    with `spec` (attention "e8kv" from the codes); on exit the model is as before.

    On a model whose parameters are on a CUDA device (or device="cuda"), the cache is an E8KVCudaCache
    (spec: one of its formats, default cuda_default_spec: "e8box:4,sink=4,center=rope"; calib and n_ctx do not apply) sized for each call:
    max_batch_size = batch x max(num_beams, num_return_sequences), max_cache_len = prompt + max_new_tokens
    (or generate's max_length), where with evict=SCORER:F the prompt counts as the tokens it keeps, so the
    device memory allocated is that of the evicted cache; a forward's cache holds its input. Elsewhere an
    E8KVCache (default spec "balanced")."""
    register()
    ModelShape(model.config)  # refuse unsupported models at once
    dev = torch.device(device) if device is not None else _model_device(model)
    gpu = dev.type == "cuda"
    spec = spec or (cuda_default_spec(model.config) if gpu else "balanced")
    if gpu and (calib is not None or n_ctx is not None):
        raise E8KVError(ErrorCode.BAD_ARGUMENT, "compress on a CUDA model: calib and n_ctx are CPU-cache "
                                                "arguments (the CUDA cache is sized per call)")
    if isinstance(calib, (str, os.PathLike)):
        calib = Calib.load(calib)
    previous = model.config._attn_implementation

    def make(args: Sequence[Any], kw: dict, gen: bool) -> Cache:
        if not gpu:
            return E8KVCache(model.config, spec, calib=calib, n_ctx=n_ctx, seed=seed, n_threads=n_threads)
        rows, cap = generate_shape(model, args, kw) if gen else _input_shape(args, kw)
        if gen and evict is not None:  # the prompt takes the slots of the tokens it keeps
            t = _input_shape(args, kw)[1]
            cap = evict.kept(t, *kept_args) + cap - t
            if evict.budget:  # budget=N: a row never holds more than N + a page
                cap = min(cap, evict.hold(*kept_args))
        return E8KVCudaCache(model.config, spec, device=dev, max_batch_size=rows, max_cache_len=cap, seed=seed)

    evict = None
    probe = make((), {"input_ids": torch.zeros((1, 16))}, False)  # a bad spec fails here
    if gpu:  # its eviction, sink rows and page size size the caches of generate calls
        evict, kept_args = probe.evict, (probe.sink, probe.block_size)
        probe.detach(model.config)
    del probe
    orig_generate, orig_forward = model.generate, model.forward
    # transformers 5 renamed past_key_values to cache: give the cache under the name this version's forward has
    name = cache_arg(model)

    def has_cache(kw: dict) -> bool:
        return kw.get("cache") is not None or kw.get("past_key_values") is not None

    # functools.wraps keeps the signatures: generate() passes position_ids (padded batches) only to a forward
    # whose signature has them
    @functools.wraps(orig_generate)
    def generate(*args: Any, **kw: Any) -> Any:
        if not has_cache(kw):
            kw[name] = make(args, kw, True)
        return orig_generate(*args, **kw)

    @functools.wraps(orig_forward)
    def forward(*args: Any, **kw: Any) -> Any:
        if not has_cache(kw) and kw.get("use_cache", True) is not False:
            kw[name] = make(args, kw, False)
        return orig_forward(*args, **kw)

    model.generate, model.forward = generate, forward
    try:
        yield model
    finally:
        del model.generate, model.forward
        gpu_cache = getattr(model.config, "_e8kv_cuda_cache", None)
        if gpu_cache is not None:
            gpu_cache.detach(model.config)
        model.config._attn_implementation = previous


def _model_device(model: Any) -> torch.device:
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def cache_arg(model: Any) -> str:
    """The name under which this transformers version's forward takes a cache: "cache" (recent 5.x) or
    "past_key_values" (earlier ones, where a `cache=` keyword would be swallowed by **kwargs and ignored)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _input_shape(args: Sequence[Any], kw: dict) -> tuple[int, int]:
    """(batch, tokens) of a generate() or forward() call's input (input_ids / inputs / inputs_embeds)."""
    x = next((kw[k] for k in ("input_ids", "inputs", "inputs_embeds") if kw.get(k) is not None),
             args[0] if args else None)
    if x is None or not hasattr(x, "shape") or x.dim() < 2:
        raise E8KVError(ErrorCode.BAD_ARGUMENT, "compress: no input_ids / inputs_embeds to size the cache by")
    return int(x.shape[0]), int(x.shape[1])


def generate_shape(model: Any, args: Sequence[Any], kw: dict) -> tuple[int, int]:
    """The (max_batch_size, max_cache_len) a generate(*args, **kw) call needs of a static cache: batch x
    max(num_beams, num_return_sequences) rows (generate repeats the prompt that often before the first
    forward), prompt + max_new_tokens tokens (or max_length, as generate reads its generation config)."""
    b, t = _input_shape(args, kw)
    gc = copy.deepcopy(kw.get("generation_config") or model.generation_config)
    gc.update(**{k: v for k, v in kw.items() if k != "generation_config"})
    rows = b * max(int(gc.num_beams or 1), int(gc.num_return_sequences or 1))
    cap = t + int(gc.max_new_tokens) if gc.max_new_tokens is not None else max(int(gc.max_length or 20), t + 1)
    return rows, cap


# ------------------------------------------------------------------------------------------ measurements
def _chunks(ids: Sequence[int], n_ctx: int, n_chunks: int) -> list[list[int]]:
    n = len(ids) // n_ctx
    if n == 0:
        raise E8KVError(ErrorCode.SRC_SIZE, f"{len(ids)} tokens: fewer than one chunk of {n_ctx}")
    n = min(n, n_chunks) if n_chunks else n
    return [list(ids[c * n_ctx:(c + 1) * n_ctx]) for c in range(n)]


def _progress(total: int, desc: str, enabled: bool) -> Any:
    try:
        from tqdm.auto import tqdm
        return tqdm(total=total, desc=desc, disable=not enabled)
    except ImportError:  # a minimal stand-in with the same calls
        class _P:
            n = 0

            def update(self, k: int = 1) -> None:
                self.n += k
                if enabled:
                    print(f"\r{desc}: {self.n}/{total}", end="", flush=True)

            def close(self) -> None:
                if enabled:
                    print()
        return _P()


@torch.no_grad()
def perplexity(model: Any, ids: Sequence[int], specs: Sequence[str], *, n_ctx: int = 512, n_chunks: int = 0,
               calib: Union[Calib, str, None] = None, add_bos: bool = False, bos_id: int = 1, seed: int = 0,
               n_threads: int = 0, progress: bool = False, desc: str = "e8kv ppl",
               device: Any = None, prefix: int = 0, score: int = 512) -> dict[str, dict[str, float]]:
    """The `e8kv ppl` protocol (engine/ppl.h, llama-perplexity) through transformers: chunks of n_ctx token
    ids, each from an empty cache (first token BOS when add_bos), second half scored; every spec against the
    "f32" e8kv cache as the baseline. Returns {spec: {ppl, ppl_se, kld, top1, n_bytes, bits_per_value, count}}.

    On a model whose parameters are on a CUDA device (or device="cuda"), the caches are E8KVCudaCaches (specs:
    CUDA_FORMATS and the grammar over them; calib and n_threads do not apply) and the baseline, "dynamic", is
    the model's own attention over a DynamicCache. There each chunk is one forward, as in the CPU protocol:
    the cache's prompt (prompt_from_codes: every query row attends through the decode kernel over the pages
    up to its own position, one virtual row per token), so that every key and value a scored token sees is
    read from the codes, and each layer's first append, the chunk, sets the means of its centred streams
    from the K/V that layer computed. n_bytes is the device memory the cache allocated (its pages and the
    workspace of n_ctx virtual rows); bits_per_value the pages' rate.

    prefix > 0 (the protocol of eviction, `e8kv ppl --prefix P --score S`): chunks of prefix +
    score tokens; the prefix is the prompt (attended exactly, then evicted when the spec says evict=, and
    coded), then the score tokens are one forward over the compressed prefix (SDPA over the decoded pages),
    and the logits of positions prefix .. prefix + score - 2 are scored. Each result then also has
    "compression": f16 bytes of the prefix's K and V / the bytes the cache holds for it after eviction (CPU:
    what the C cache allocated; CUDA: the kept tokens' codes, each row's means and sink rows), and "kept": the
    tokens a KV head keeps."""
    dev = torch.device(device) if device is not None else _model_device(model)
    if dev.type == "cuda":
        if calib is not None or n_threads:
            raise E8KVError(ErrorCode.BAD_ARGUMENT, "perplexity on a CUDA model: calib and n_threads are "
                                                    "CPU-cache arguments")
        return _perplexity_cuda(model, ids, specs, dev, n_ctx=n_ctx, n_chunks=n_chunks, add_bos=add_bos,
                                bos_id=bos_id, seed=seed, progress=progress, desc=desc, prefix=prefix, score=score)
    if prefix and (prefix < 2 or score < 2):
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"perplexity: prefix {prefix} and score {score} must be >= 2")
    if isinstance(calib, (str, os.PathLike)):
        calib = Calib.load(calib)
    n = prefix + score if prefix else n_ctx
    return _ppl_loop(model, ids, ["f32", *specs],
                     lambda spec: E8KVCache(model.config, spec, calib=calib, n_ctx=n, seed=seed,
                                            n_threads=n_threads),
                     n_ctx=n, n_chunks=n_chunks, add_bos=add_bos, bos_id=bos_id, progress=progress, desc=desc,
                     prefix=prefix)


def _perplexity_cuda(model: Any, ids: Sequence[int], specs: Sequence[str], dev: torch.device, *, n_ctx: int,
                     n_chunks: int, add_bos: bool, bos_id: int, seed: int, progress: bool,
                     desc: str, prefix: int = 0, score: int = 512) -> dict[str, dict[str, float]]:
    """perplexity() with E8KVCudaCaches against "dynamic" (see there); dev: where the caches live."""
    from transformers import DynamicCache

    def make(spec: str) -> Any:
        if spec == "dynamic":
            return DynamicCache(config=model.config)
        if prefix:  # the prefix is the prompt (exact attention, then evicted and coded); the rest reads codes
            return E8KVCudaCache(model.config, spec, device=dev, max_batch_size=1, max_cache_len=prefix + score,
                                 seed=seed)
        # the whole chunk is the prompt, every query row through the decode kernel
        return E8KVCudaCache(model.config, spec, device=dev, max_batch_size=1, max_cache_len=n_ctx, seed=seed,
                             max_chunk=n_ctx, prompt_from_codes=True)
    if prefix and (prefix < 2 or score < 2):
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"perplexity: prefix {prefix} and score {score} must be >= 2")
    return _ppl_loop(model, ids, ["dynamic", *specs], make, n_ctx=prefix + score if prefix else n_ctx,
                     n_chunks=n_chunks, add_bos=add_bos, bos_id=bos_id, progress=progress, desc=desc, prefix=prefix)


@torch.no_grad()
def _ppl_loop(model: Any, ids: Sequence[int], names: Sequence[str], make: Callable[[str], Any], *, n_ctx: int,
              n_chunks: int, add_bos: bool, bos_id: int, progress: bool, desc: str,
              prefix: int = 0) -> dict[str, dict[str, float]]:
    """The perplexity protocol's loop: each chunk of n_ctx ids is one forward per name through the cache
    make(name) returns (names[0], the baseline, once per chunk), its second half scored. prefix > 0: two
    forwards, the first `prefix` ids then the rest, whose logits but the last are scored."""
    first, arg = (prefix if prefix else n_ctx // 2), cache_arg(model)
    chunks = _chunks(ids, n_ctx, n_chunks)
    acc = _PplAcc(list(names))
    bar = _progress(len(chunks) * len(names), desc, progress)
    on = _model_device(model)
    for chunk in chunks:
        x, target = _chunk_input(chunk, first, add_bos, bos_id)
        x = x.to(on)
        for name in acc.specs:
            if name == names[0] and acc.has_base:
                continue
            cache = make(name)
            try:
                if prefix:
                    model(input_ids=x[:, :prefix], **{arg: cache}, use_cache=True, logits_to_keep=1)
                    held = prefix_bytes(cache, prefix)
                    logits = model(input_ids=x[:, prefix:], **{arg: cache}, use_cache=True).logits[:, :-1]
                else:
                    logits = model(input_ids=x, **{arg: cache}, use_cache=True, logits_to_keep=n_ctx - first).logits
            finally:
                if isinstance(cache, E8KVCudaCache):
                    cache.detach(model.config)
            if isinstance(cache, E8KVCudaCache):
                cache.check()
            elif not isinstance(cache, E8KVCache) and not dynamic_kv(cache):
                raise E8KVError(ErrorCode.BAD_ARGUMENT, "perplexity: the model's forward did not fill the "
                                                        f"{type(cache).__name__} given as {arg}=")
            acc.add(name, logits, target, *cache_sizes(cache))
            if prefix:
                acc.add_prefix(name, *held)
            bar.update(1)
        acc.end_chunk()
    bar.close()
    return acc.result()


def prefix_bytes(cache: Any, n: int) -> tuple[float, int]:
    """(f16 bytes of n tokens' K and V / the bytes a cache holds for them, tokens a KV head keeps) right
    after a prompt of n tokens. An E8KVCudaCache's allocation is made for max_cache_len at creation; what it
    holds for the prompt is the kept tokens' codes at the pages' rate plus each row's means (f32, centred
    streams) and sink rows (f32). A transformers cache holds its K/V tensors."""
    if isinstance(cache, (E8KVCache, E8KVCudaCache)):
        s = cache.shape
        row = 2 * s.n_layer * s.n_head_kv * s.head_dim
        # f16 bytes of the prefix as a DynamicCache holds it: every coded layer's n tokens, and a hybrid model's
        # sliding layers' window (held exact beside the codes: n_bytes and _sliding_bytes count them)
        n_sliding = s.n_model_layer - s.n_layer
        f16 = 2.0 * (n * row + n_sliding * min(n, s.sliding_window or 0) * 2 * s.n_head_kv * s.head_dim)
        if isinstance(cache, E8KVCache):  # what the C cache allocated, as `e8kv ppl --prefix` counts it
            return f16 / cache.n_bytes, cache.rows[0].n_kept(0)
        m = n - cache._pad_host[0]
        held = (m * cache.kv.token_bytes + (row * 4 if cache.kv.centered else 0) + cache.sink * row * 4
                + _sliding_bytes(cache))
        return (f16 / held if held else 0.0), m
    kv = dynamic_kv(cache)
    held = sum(t.numel() * t.element_size() for t in kv)
    return (2.0 * sum(t.numel() for t in kv) / held if held else 0.0), (kv[0].shape[2] if kv else 0)


def cache_sizes(cache: Any) -> tuple[int, float]:
    """(bytes, bits per value) of a cache: what an e8kv cache allocated (host or device), or the K/V tensors
    a transformers cache (DynamicCache, StaticCache) holds and their element width."""
    if isinstance(cache, (E8KVCache, E8KVCudaCache)):
        return cache.n_bytes, cache.bits_per_value
    kv = dynamic_kv(cache)
    return sum(t.numel() * t.element_size() for t in kv), float(torch.finfo(kv[0].dtype).bits) if kv else 0.0


def dynamic_kv(cache: Any) -> list[torch.Tensor]:
    """The K and V tensors a transformers DynamicCache (or StaticCache) holds (layers not filled yet left out)."""
    return [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]


def _chunk_input(chunk: list[int], first: int, add_bos: bool, bos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids (1, n), targets of the scored positions first + 1 .. n − 1) of one chunk"""
    target = torch.tensor(chunk[first + 1:], dtype=torch.long)
    if add_bos:
        chunk = [bos_id] + chunk[1:]
    return torch.tensor([chunk], dtype=torch.long), target


class _PplAcc:
    """Sums of the perplexity protocol per spec; the first spec of each chunk is the baseline of the others'
    KLD and top-1."""

    def __init__(self, specs: list[str]) -> None:
        self.specs = specs
        self.acc = {s: {"nll": 0.0, "nll2": 0.0, "kld": 0.0, "top1": 0, "count": 0, "n_bytes": 0, "bpv": 0.0}
                    for s in specs}
        self.base: Optional[torch.Tensor] = None

    @property
    def has_base(self) -> bool:
        return self.base is not None

    def add(self, spec: str, logits: torch.Tensor, target: torch.Tensor, n_bytes: int, bpv: float) -> None:
        n = target.shape[0]
        lsm = torch.log_softmax(logits[0, :n].to(torch.float64).cpu(), dim=-1)
        if self.base is None:
            self.base = lsm
        a = self.acc[spec]
        nll = -lsm.gather(1, target[:, None])[:, 0]
        a["nll"] += float(nll.sum())
        a["nll2"] += float((nll * nll).sum())
        a["kld"] += float((self.base.exp() * (self.base - lsm)).sum())
        a["top1"] += int((lsm.argmax(-1) == self.base.argmax(-1)).sum())
        a["count"] += n
        a["n_bytes"], a["bpv"] = n_bytes, bpv

    def add_prefix(self, spec: str, compression: float, kept: int) -> None:
        """prefix mode: the compression of this chunk's prefix (averaged over chunks) and the tokens kept."""
        a = self.acc[spec]
        a["compression"] = a.get("compression", 0.0) + compression
        a["chunks"] = a.get("chunks", 0) + 1
        a["kept"] = kept

    def end_chunk(self) -> None:
        self.base = None

    def result(self) -> dict[str, dict[str, float]]:
        out = {}
        for spec, a in self.acc.items():
            n = a["count"]
            mean = a["nll"] / n
            var = a["nll2"] / n - mean * mean
            ppl = math.exp(mean)
            out[spec] = {"ppl": ppl, "ppl_se": math.sqrt(max(var, 0.0) / (n - 1)) * ppl if n > 1 else 0.0,
                         "kld": a["kld"] / n, "top1": a["top1"] / n, "n_bytes": a["n_bytes"],
                         "bits_per_value": a["bpv"], "count": n}
            if "chunks" in a:
                out[spec].update(compression=a["compression"] / a["chunks"], kept=a["kept"])
        return out


class _CalibObserver:
    """Hands every layer's K (before RoPE), V and queries (before RoPE) of one sequence to a Calib."""

    def __init__(self, cal: Calib, n_head: int) -> None:
        self.cal, self.n_head = cal, n_head

    def on_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for i in range(k.shape[0]):
            self.cal.observe(layer, k[i], v[i])

    def on_q(self, layer: int, q: torch.Tensor) -> None:
        for i in range(q.shape[0]):
            self.cal.observe_q(layer, q[i], self.n_head)


def _ids_of(tok: Any, texts: Union[str, Iterable[str], Sequence[int]]) -> list[int]:
    if isinstance(texts, str):
        return list(tok(texts, add_special_tokens=False)["input_ids"])
    texts = list(texts)
    if texts and isinstance(texts[0], int):
        return [int(t) for t in texts]
    out: list[int] = []
    for t in texts:
        out += tok(t, add_special_tokens=False)["input_ids"]
    return out


@torch.no_grad()
def calibrate(model: Any, tok: Any, texts: Union[str, Iterable[str], Sequence[int]], out: Union[str, os.PathLike, None] = None,
              *, n_ctx: int = 512, n_chunks: int = 16, sensitivity: bool = True, probe: str = "e8tv:2",
              probe_chunks: int = 1, probe_sink: int = 1, add_bos: bool = False, bos_id: int = 1,
              n_threads: int = 0, progress: bool = True) -> Calib:
    """`e8kv calibrate` through transformers (same defaults, same file): each chunk of n_ctx tokens of
    `texts` (a string, strings, or token ids) is one sequence whose K (before RoPE), V and queries (before
    RoPE) every layer observes; then the eigenbases; then, with sensitivity=True, every stream (each layer's
    K and V) alone coded with `probe` (others exact, `probe_sink` exact first positions) over probe_chunks
    chunks, c = KLD * 4^rate (engine/calibrate.c). Writes `out` when given; returns the Calib."""
    shape = ModelShape(model.config)
    if shape.rope_problem is not None:
        raise UnsupportedModelError(f"calibration needs keys before RoPE: {shape.rope_problem}")
    colon = probe.find(":")
    rate = float(probe[colon + 1:]) if colon > 0 else 0.0
    if sensitivity and (not 0 < rate <= 16 or "," in probe or "=" in probe):
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"probe '{probe}': expected FAMILY:RATE, e.g. e8tv:2")
    ids = _ids_of(tok, texts)
    chunks = _chunks(ids, n_ctx, n_chunks)
    cal = Calib(shape.n_layer, shape.n_head_kv, shape.head_dim)
    obs = _CalibObserver(cal, shape.n_head)
    arg = cache_arg(model)
    bar = _progress(len(chunks), "e8kv calibrate: covariances", progress)
    for chunk in chunks:
        cache = E8KVCache(model.config, "f32,rope=pre", n_ctx=n_ctx, n_threads=n_threads, observer=obs)
        model(input_ids=torch.tensor([chunk]), **{arg: cache}, use_cache=True, logits_to_keep=1)
        bar.update(1)
    bar.close()
    cal.finalize()
    if sensitivity:
        n_s = 2 * shape.n_layer
        specs = [f"f32,sink={probe_sink},rope=pre,layer{i % shape.n_layer}.{'k' if i < shape.n_layer else 'v'}={probe}"
                 for i in range(n_s)]
        res = perplexity(model, ids, specs, n_ctx=n_ctx, n_chunks=probe_chunks, calib=cal, add_bos=add_bos,
                         bos_id=bos_id, n_threads=n_threads, progress=progress,
                         desc="e8kv calibrate: sensitivity probes")
        for i, spec in enumerate(specs):
            cal.set_sensitivity(i % shape.n_layer, i >= shape.n_layer, max(res[spec]["kld"], 0.0) * 4.0 ** rate)
    if out is not None:
        cal.save(out)
    return cal


def allocate(model: Any, tok: Any, texts: Union[str, Iterable[str], Sequence[int]],
             mean_bits: Union[float, Sequence[float]], *, opts: Optional[str] = None, n_ctx: int = 512,
             probe_chunks: int = 4, add_bos: bool = False, bos_id: int = 1, progress: bool = True,
             device: Any = None) -> Union[str, list[str]]:
    """The CUDA cache's formats per layer at a mean rate, by measured sensitivity (e8kv.alloc): every coded
    layer e8box:4, then each layer alone with e8p:2, with K e8box:3, with V e8box:3 (1 + 3 x layers probes
    of `perplexity`, probe_chunks chunks of n_ctx tokens of `texts` each: on the GPU with the CUDA cache
    when the model is there), and the per-layer choice with the least summed KLD rise whose mean rate over
    every layer's K and V is at most mean_bits (between e8p:2's and e8box:4's). Returns the spec
    (e8box:4 + opts + layer rules; a list of specs for a list of rates, from one set of probes), for
    compress(), E8KVCache(..., device="cuda") or perplexity(). opts: the cache options of every spec
    (default those of cuda_default_spec: "sink=4,center=rope"). Use a text you will not evaluate on."""
    shape = ModelShape(model.config)
    if opts is None:
        opts = cuda_default_spec(model.config).partition(",")[2]
    specs = alloc.probe_specs(shape.n_layer, opts)
    ids = _ids_of(tok, texts)
    res = perplexity(model, ids, specs, n_ctx=n_ctx, n_chunks=probe_chunks, add_bos=add_bos, bos_id=bos_id,
                     progress=progress, desc="e8kv allocate: probes", device=device)
    kld = [res[s]["kld"] for s in specs]
    many = not isinstance(mean_bits, (int, float))
    out = [alloc.spec_of(alloc.choose(kld, shape.n_layer, shape.head_dim, float(b)), opts)
           for b in (mean_bits if many else [mean_bits])]
    return out if many else out[0]


__all__ = ["CUDA_DEFAULT_SPEC", "CUDA_DEFAULT_SPEC_UNTURNED", "CUDA_FORMATS", "E8KVCache", "E8KVCudaCache", "E8KVCudaLayer", "E8KVLayer", "ModelShape", "UnsupportedModelError", "allocate", "cache_arg", "calibrate", "compress",
           "cuda_default_spec", "cache_sizes", "dynamic_kv", "e8kv_attention", "perplexity", "register"]
