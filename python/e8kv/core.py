"""The C library's objects in Python: codecs, the paged compressed KV cache, calibrations.

Zero copy: float32, C-contiguous numpy arrays and CPU torch tensors are handed to C by pointer
(`ndarray.ctypes.data`, `Tensor.data_ptr()`); other dtypes or layouts are converted once, as a whole
array (never element by element). Outputs come back in the kind of array the input was (numpy or torch).
Every C error code becomes an `E8KVError` carrying the library's error name (`e8kv_error_name`).

Devices: `Cache` lives in host memory. `CudaCache` is the device cache of include/e8kv_cuda.h (a library
built with nvcc; `cuda_available()` says whether it is there and a GPU is usable): torch CUDA tensors are
handed over by `data_ptr()` on the current stream; `e8kv.torch_ops` registers its append and attention as
PyTorch custom operators (eager and torch.compile / CUDA graphs).
"""
from __future__ import annotations

import ctypes
import enum
import os
from ctypes import POINTER, byref, c_double, c_float, c_size_t
from typing import Any, Optional, Sequence, Union

import numpy as np

from ._lib import CacheFileInfo, CacheParams, CudaCacheParams, EvictItems, cuda_lib, lib

try:  # torch is optional for the core binding
    import torch as _torch
except ImportError:  # pragma: no cover - exercised only without torch
    _torch = None

ArrayLike = Any  # numpy.ndarray or torch.Tensor
PathLike = Union[str, "os.PathLike[str]"]


class ErrorCode(enum.IntEnum):
    """e8kv_error_code (include/e8kv.h); values are pinned by the C header."""

    NO_ERROR = 0
    GENERIC = 1
    BAD_ARGUMENT = 2
    HEAD_DIM = 3
    RATE = 4
    DST_TOO_SMALL = 5
    NONFINITE = 6
    OUT_OF_MEMORY = 7
    CORRUPTED = 8
    TRUNCATED = 9
    VERSION = 10
    CHECKSUM = 11
    SPEC = 12
    CONTEXT_FULL = 13
    DIMENSION = 14
    RANGE = 15
    IO = 16
    UNSUPPORTED = 17
    SRC_SIZE = 18


class E8KVError(RuntimeError):
    """An error returned by the C library. `code` is the ErrorCode, `name` the library's error name
    (e8kv_error_name, e.g. "head_dim not supported by this format")."""

    def __init__(self, code: int, what: str = "") -> None:
        self.code = ErrorCode(code) if code in ErrorCode._value2member_map_ else code
        self.name: str = lib.e8kv_error_code_name(int(code)).decode()
        super().__init__(f"{what}: {self.name}" if what else self.name)


def _check(ret: int, what: str) -> int:
    """Raise E8KVError when `ret` (a size_t from C) is an error code, else return it."""
    if lib.e8kv_is_error(ret):
        raise E8KVError(lib.e8kv_get_error_code(ret), what)
    return ret


def version() -> str:
    """The C library's version string."""
    return lib.e8kv_version_string().decode()


def preset_spec(name: str) -> Optional[str]:
    """The cache spec a preset (near-lossless, balanced, aggressive) expands to; None when unknown."""
    r = lib.e8kv_cache_preset_spec(name.encode())
    return r.decode() if r else None


def spec_evict(spec: str) -> tuple[dict[str, Any], str]:
    """The eviction items of a cache spec as the C cache reads them (e8kv_cache_spec_evict): ({scorer ("" for
    none), frac, recent, obs, budget, n_rules}, the spec without them). E8KVError SPEC for a spec the grammar
    refuses (recent=, obs=, budget= or evictA-B= without evict= among them)."""
    items, b = EvictItems(), spec.encode()
    rest = ctypes.create_string_buffer(len(b) + 1)
    _check(lib.e8kv_cache_spec_evict(b, byref(items), rest, len(b) + 1), f"cache spec '{spec}'")
    return ({"scorer": items.scorer.decode(), "frac": items.frac, "recent": items.recent, "obs": items.obs,
             "budget": items.budget, "n_rules": items.n_rules}, rest.value.decode())


# ------------------------------------------------------------------------------------------ buffers
def _is_torch(x: Any) -> bool:
    return _torch is not None and isinstance(x, _torch.Tensor)


def _f32(x: ArrayLike) -> tuple[Any, Any, int]:
    """(array kept alive, float* to its data, number of floats) for a float32 C-contiguous view of x."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise E8KVError(ErrorCode.UNSUPPORTED, f"tensor on {x.device}: this cache lives on the CPU")
        t = x.detach()
        if t.dtype != _torch.float32:
            t = t.to(_torch.float32)
        t = t.contiguous()
        return t, ctypes.cast(t.data_ptr(), POINTER(c_float)), t.numel()
    a = np.ascontiguousarray(x, dtype=np.float32)
    return a, a.ctypes.data_as(POINTER(c_float)), a.size


def _bytes_in(x: Any) -> tuple[Any, int, int]:
    """(object kept alive, void* address, byte count) for bytes, bytearray, numpy uint8 or torch uint8."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        a = np.frombuffer(x, dtype=np.uint8)
        return a, a.ctypes.data, a.size
    if _is_torch(x):
        t = x.detach().contiguous()
        return t, t.data_ptr(), t.numel() * t.element_size()
    a = np.ascontiguousarray(x)
    return a, a.ctypes.data, a.nbytes


def _pickled(data: Union[bytes, np.ndarray]) -> Any:
    """Bytes (or a uint8 array, taken as it is) to pickle as a uint8 tensor: torch.save (pickle protocol 2)
    would write a bytes object through latin-1 text, ~1.5x its size and slow, where a tensor's storage goes in
    as it is."""
    if isinstance(data, np.ndarray):
        return _torch.from_numpy(data) if _torch is not None else data.tobytes()
    return _torch.frombuffer(bytearray(data), dtype=_torch.uint8) if _torch is not None and data else data


def _unpickled(data: Any) -> bytes:
    return data.numpy().tobytes() if _is_torch(data) else bytes(data)


def _empty_like_kind(template: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """A float32 output array of the same kind (torch/numpy) as template, and its float*."""
    if _is_torch(template):
        t = _torch.empty(shape, dtype=_torch.float32)
        return t, ctypes.cast(t.data_ptr(), POINTER(c_float))
    a = np.empty(shape, dtype=np.float32)
    return a, a.ctypes.data_as(POINTER(c_float))


# ------------------------------------------------------------------------------------------ codec
class Rope:
    """RoPE as the library applies it (include/e8kv.h e8kv_rope_*: the engine's queries and keys, the cache's
    rope=pre keys): pair i at position p turns by p * theta^(-2i/head_dim), or by p * freqs[i] when freqs
    (head_dim/2 frequencies, e.g. a scaled RoPE's inv_freq) are given; neox: pairs (i, i + head_dim/2)
    (transformers' layout), else (2i, 2i+1)."""

    def __init__(self, head_dim: int, theta: float = 0.0, neox: bool = True,
                 freqs: Optional[Sequence[float]] = None) -> None:
        err = c_size_t(0)
        if freqs is not None:
            f = (c_double * len(freqs))(*[float(x) for x in freqs])
            if len(freqs) != head_dim // 2:
                raise E8KVError(ErrorCode.BAD_ARGUMENT, f"RoPE: {len(freqs)} freqs for head_dim {head_dim}")
            self._p = lib.e8kv_rope_create_freqs(head_dim, f, int(bool(neox)), byref(err))
        else:
            self._p = lib.e8kv_rope_create(head_dim, theta, int(bool(neox)), byref(err))
        if not self._p:
            raise E8KVError(lib.e8kv_get_error_code(err.value), f"RoPE at head_dim {head_dim}, theta {theta}"
                                                                + (" (freqs given)" if freqs is not None else ""))
        self.head_dim = head_dim
        self._args = (head_dim, theta, neox, None if freqs is None else [float(x) for x in freqs])

    def __reduce__(self) -> tuple:  # (pickling: the same rotation made again)
        return Rope, self._args

    def __del__(self) -> None:
        if getattr(self, "_p", None):
            lib.e8kv_rope_free(self._p)
            self._p = None

    def apply_(self, x: Any, pos0: int) -> Any:
        """In place on x (n, head_dim) or (n, n_vec, head_dim): row t at position pos0 + t. x must be a
        C-contiguous float32 CPU tensor or numpy array (it is written through its pointer); returns x."""
        ok = (x.dtype == _torch.float32 and x.device.type == "cpu" and x.is_contiguous()) if _is_torch(x) else (
            isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags["C_CONTIGUOUS"])
        if not ok or x.ndim not in (2, 3) or x.shape[-1] != self.head_dim:
            raise E8KVError(ErrorCode.BAD_ARGUMENT, f"Rope.apply_: expected a C-contiguous float32 CPU array "
                                                    f"(n, [n_vec,] {self.head_dim})")
        n, n_vec = x.shape[0], (x.shape[1] if x.ndim == 3 else 1)
        ptr = ctypes.cast(x.data_ptr(), POINTER(c_float)) if _is_torch(x) else x.ctypes.data_as(POINTER(c_float))
        lib.e8kv_rope_apply(self._p, ptr, n, n_vec, pos0)
        return x


class Codec:
    """A fixed-rate vector format: `head_dim` floats <-> `vector_bytes` bytes (side information included),
    each vector decodable from its own bytes. `spec` as in include/e8kv.h ("e8:4", "e8box:4", "q4_0h")."""

    def __init__(self, spec: str, head_dim: int, seed: int = 0) -> None:
        err = c_size_t(0)
        self._p = lib.e8kv_codec_create(spec.encode(), head_dim, seed, byref(err))
        if not self._p:
            raise E8KVError(lib.e8kv_get_error_code(err.value), f"codec '{spec}' at head_dim {head_dim}")

    def __del__(self) -> None:
        if getattr(self, "_p", None):
            lib.e8kv_codec_free(self._p)
            self._p = None

    @property
    def spec(self) -> str:
        return lib.e8kv_codec_spec(self._p).decode()

    @property
    def head_dim(self) -> int:
        return lib.e8kv_codec_head_dim(self._p)

    @property
    def vector_bytes(self) -> int:
        """Bytes of one encoded vector, side information included."""
        return lib.e8kv_codec_vector_bytes(self._p)

    @property
    def bits_per_value(self) -> float:
        """8 * vector_bytes / head_dim: every byte counted."""
        return lib.e8kv_codec_bits_per_value(self._p)

    rate = bits_per_value

    @property
    def rotated(self) -> bool:
        return bool(lib.e8kv_codec_is_rotated(self._p))

    def encode(self, x: ArrayLike) -> np.ndarray:
        """Encode vectors x (..., head_dim) into uint8 codes (..., vector_bytes)."""
        keep, ptr, n = _f32(x)
        hd = self.head_dim
        if n % hd or n == 0:
            raise E8KVError(ErrorCode.SRC_SIZE, f"{n} floats are not whole vectors of {hd}")
        n_vec = n // hd
        out = np.empty(n_vec * self.vector_bytes, dtype=np.uint8)
        _check(lib.e8kv_codec_encode(self._p, out.ctypes.data, out.nbytes, ptr, n_vec), "encode")
        shape = tuple(keep.shape[:-1]) if keep.shape and keep.shape[-1] == hd else (n_vec,)
        return out.reshape(*shape, self.vector_bytes)

    def decode(self, codes: Any, rotated: bool = False) -> np.ndarray:
        """Decode uint8 codes (..., vector_bytes) into float32 vectors (..., head_dim). rotated=True keeps
        the codec's Hadamard domain (what the attention kernels work in)."""
        keep, addr, nb = _bytes_in(codes)
        vb = self.vector_bytes
        if nb % vb or nb == 0:
            raise E8KVError(ErrorCode.SRC_SIZE, f"{nb} bytes are not whole vectors of {vb}")
        n_vec = nb // vb
        out = np.empty((n_vec, self.head_dim), dtype=np.float32)
        fn = lib.e8kv_codec_decode_rotated if rotated else lib.e8kv_codec_decode
        _check(fn(self._p, out.ctypes.data_as(POINTER(c_float)), out.size, addr, nb, n_vec), "decode")
        shape = np.shape(keep)
        lead = tuple(shape[:-1]) if len(shape) >= 2 and shape[-1] == vb else (n_vec,)
        return out.reshape(*lead, self.head_dim)

    def __repr__(self) -> str:
        return f"Codec('{self.spec}', head_dim={self.head_dim}, {self.bits_per_value:.3f} bits/value)"


# ------------------------------------------------------------------------------------------ calibration
class Calib:
    """A calibration of a model for the e8t/e8tv formats and auto= allocation (include/e8kv.h):
    K (before RoPE) and V covariances, query energies, sensitivities. Same file format as `e8kv calibrate`."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, *, _ptr: Optional[int] = None) -> None:
        if _ptr is not None:
            self._p = _ptr
            return
        err = c_size_t(0)
        self._p = lib.e8kv_calib_create(n_layer, n_head_kv, head_dim, byref(err))
        if not self._p:
            raise E8KVError(lib.e8kv_get_error_code(err.value), "calibration")

    def __del__(self) -> None:
        if getattr(self, "_p", None):
            lib.e8kv_calib_free(self._p)
            self._p = None

    def to_bytes(self) -> bytes:
        """The calibration file's bytes (doc/format.md §5)."""
        cap = _check(lib.e8kv_calib_save_bound(self._p), "calibration save bound")
        buf = np.empty(cap, dtype=np.uint8)
        n = _check(lib.e8kv_calib_save(buf.ctypes.data, cap, self._p), "save calibration")
        return buf[:n].tobytes()

    @classmethod
    def from_bytes(cls, src: bytes) -> "Calib":
        keep, addr, nb = _bytes_in(src)
        err = c_size_t(0)
        p = lib.e8kv_calib_load(addr, nb, byref(err))
        if not p:
            raise E8KVError(lib.e8kv_get_error_code(err.value), "load calibration from bytes")
        return cls(0, 0, 0, _ptr=p)

    def __reduce__(self) -> tuple:  # (pickling: the file's bytes)
        return _calib_from_pickled, (_pickled(self.to_bytes()),)

    @classmethod
    def load(cls, path: PathLike) -> "Calib":
        err = c_size_t(0)
        p = lib.e8kv_calib_load_file(os.fsencode(path), byref(err))
        if not p:
            raise E8KVError(lib.e8kv_get_error_code(err.value), f"load calibration {os.fspath(path)}")
        return cls(0, 0, 0, _ptr=p)

    def save(self, path: PathLike) -> int:
        """Write the calibration file (doc/format.md §5); returns the bytes written."""
        return _check(lib.e8kv_calib_save_file(self._p, os.fsencode(path)), f"save {os.fspath(path)}")

    def info(self) -> tuple[int, int, int, int]:
        """(n_layer, n_head_kv, head_dim, tokens observed in layer 0)."""
        v = [c_size_t(0) for _ in range(4)]
        _check(lib.e8kv_calib_info(self._p, *[byref(x) for x in v]), "calibration info")
        return tuple(x.value for x in v)  # type: ignore[return-value]

    def observe(self, layer: int, k: ArrayLike, v: ArrayLike) -> int:
        """One sequence of one layer: k (before RoPE) and v, (n_tok, n_head_kv * head_dim)."""
        kk, kp, kn = _f32(k)
        vk, vp, vn = _f32(v)
        _, n_head_kv, head_dim, _ = self.info()
        row = n_head_kv * head_dim
        if kn != vn or kn % row:
            raise E8KVError(ErrorCode.SRC_SIZE, f"observe: k has {kn} floats, v {vn}, rows of {row}")
        return _check(lib.e8kv_calib_observe(self._p, layer, kp, vp, kn // row), f"observe layer {layer}")

    def observe_q(self, layer: int, q: ArrayLike, n_head: int) -> int:
        """The queries (before RoPE) of one layer, (n_tok, n_head * head_dim)."""
        qk, qp, qn = _f32(q)
        head_dim = self.info()[2]
        row = n_head * head_dim
        if qn % row:
            raise E8KVError(ErrorCode.SRC_SIZE, f"observe_q: {qn} floats are not rows of {row}")
        return _check(lib.e8kv_calib_observe_q(self._p, layer, qp, n_head, qn // row), f"observe_q layer {layer}")

    def finalize(self) -> None:
        _check(lib.e8kv_calib_finalize(self._p), "finalize calibration")

    def eigenvalues(self, layer: int, is_v: bool, head: int) -> np.ndarray:
        p = lib.e8kv_calib_eigenvalues(self._p, layer, int(is_v), head)
        if not p:
            raise E8KVError(ErrorCode.BAD_ARGUMENT, "eigenvalues: not finalized or out of range")
        return np.ctypeslib.as_array(p, shape=(self.info()[2],)).copy()

    def set_sensitivity(self, layer: int, is_v: bool, c: float) -> None:
        _check(lib.e8kv_calib_set_sensitivity(self._p, layer, int(is_v), float(c)), "set_sensitivity")

    def sensitivity(self, layer: int, is_v: bool) -> float:
        """KLD coefficient c of the stream (KLD ~ c * 4^-B), or -1.0 when the calibration has none."""
        return lib.e8kv_calib_sensitivity(self._p, layer, int(is_v))

    @property
    def n_bytes(self) -> int:
        return lib.e8kv_calib_bytes(self._p)


# ------------------------------------------------------------------------------------------ cache
class Cache:
    """The paged compressed KV cache of include/e8kv.h: per layer and KV head, K and V of up to n_ctx tokens
    as codes in pages; attention reads the codes (no decoded copy of the context exists).

    spec: a cache spec ("e8:4", "balanced", "k=e8:4,v=e8:3,sink=1", "auto=e8tv:3" with calib=...).
    rope_theta > 0 enables rope=pre caches (keys appended before RoPE, queries passed with RoPE);
    `keys_pre_rope` says which keys the cache wants. rope_freqs (head_dim/2 values) are a scaled RoPE's own
    frequencies (transformers' inv_freq of rope_type llama3, linear, yarn), used instead of rope_theta's.
    rope_neox: the RoPE pair layout (False: interleaved pairs (x[2i], x[2i+1]); True: split halves, the
    Hugging Face layout).
    """

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int, spec: str = "e8:4", *,
                 seed: int = 0, n_threads: int = 0, rope_theta: float = 0.0, rope_neox: bool = False,
                 calib: Optional[Calib] = None, device: str = "cpu", rope_freqs: Optional[Sequence[float]] = None,
                 _ptr: Optional[int] = None) -> None:
        if str(device) != "cpu":
            what = ("the CUDA cache is e8kv.CudaCache (or e8kv.hf.E8KVCache(..., device='cuda'))" if cuda_built()
                    else "this build of e8kv has the CPU cache only (no libe8kv_cuda.so: built without nvcc)")
            raise E8KVError(ErrorCode.UNSUPPORTED, f"Cache(device='{device}'): {what}")
        self.device = "cpu"
        self._calib = calib  # the C cache borrows it: keep it alive as long as the cache
        if _ptr is not None:
            self._p = _ptr
        else:
            err = c_size_t(0)
            self._spec_bytes = spec.encode()
            params = CacheParams(n_layer=n_layer, n_head_kv=n_head_kv, head_dim=head_dim, n_ctx=n_ctx,
                                 spec=self._spec_bytes, seed=seed, n_threads=n_threads,
                                 rope_theta=float(rope_theta), rope_neox=int(bool(rope_neox)),
                                 calib=calib._p if calib is not None else None)
            if rope_freqs is not None:  # (copied by the cache at creation)
                if len(rope_freqs) != head_dim // 2:
                    raise E8KVError(ErrorCode.BAD_ARGUMENT, f"Cache: {len(rope_freqs)} rope_freqs for head_dim "
                                                            f"{head_dim}")
                freqs = (c_float * len(rope_freqs))(*[float(x) for x in rope_freqs])
                params.rope_freqs = ctypes.cast(freqs, POINTER(c_float))
            self._p = lib.e8kv_cache_create(byref(params), byref(err))
            if not self._p:
                raise E8KVError(lib.e8kv_get_error_code(err.value),
                                f"cache '{spec}' (n_layer {n_layer}, n_head_kv {n_head_kv}, head_dim {head_dim})")
        self.n_layer, self.n_head_kv, self.head_dim, self.n_ctx = n_layer, n_head_kv, head_dim, n_ctx
        self.n_threads = n_threads  # (what a loaded copy runs on: pickling)
        self.spec = spec

    def __del__(self) -> None:
        if getattr(self, "_p", None):
            lib.e8kv_cache_free(self._p)
            self._p = None

    # -- storing and reading
    def append(self, layer: int, k: ArrayLike, v: ArrayLike) -> int:
        """Store K and V of n_tok tokens at the layer's next positions: k, v (n_tok, n_head_kv * head_dim)
        (or (n_tok, n_head_kv, head_dim)). Returns the layer's token count."""
        kk, kp, kn = _f32(k)
        vk, vp, vn = _f32(v)
        row = self.n_head_kv * self.head_dim
        if kn != vn or kn % row or kn == 0:
            raise E8KVError(ErrorCode.SRC_SIZE, f"append: k has {kn} floats, v {vn}, rows of {row}")
        return _check(lib.e8kv_cache_append(self._p, layer, kp, vp, kn // row), f"append layer {layer}")

    def attend(self, layer: int, q: ArrayLike, pos0: Optional[int] = None, out: Optional[ArrayLike] = None,
               sinks: Optional[ArrayLike] = None) -> Any:
        """Causal attention of n_tok queries q (n_tok, n_head * head_dim) at positions pos0 .. pos0+n_tok-1
        (default: the layer's last n_tok positions) over the stored codes. Returns (n_tok, n_head*head_dim)
        float32 of the same kind as q (or writes into `out`, a float32 contiguous array of that size).
        sinks: learned attention sinks (gpt-oss), n_head logits in the scores' units joining each softmax
        with a zero value (e8kv_cache_attend_sinks); None: none."""
        qk, qp, qn = _f32(q)
        n_tok = qk.shape[0] if len(qk.shape) >= 2 else 1
        if qn % (n_tok * self.head_dim):
            raise E8KVError(ErrorCode.SRC_SIZE, f"attend: {qn} floats in {n_tok} rows of whole heads")
        n_head = qn // (n_tok * self.head_dim)
        if pos0 is None:
            pos0 = self.n_tokens(layer) - n_tok
        if out is None:
            out, op = _empty_like_kind(q, (n_tok, n_head * self.head_dim))
        else:
            _, op, on = _f32(out)
            if on < qn or not (out.is_contiguous() if _is_torch(out) else out.flags.c_contiguous):
                raise E8KVError(ErrorCode.DST_TOO_SMALL, "attend: out must be float32, contiguous, as large as q")
        if sinks is None:
            _check(lib.e8kv_cache_attend(self._p, op, qn, layer, qp, n_head, n_tok, pos0), f"attend layer {layer}")
            return out
        sk, sp, sn = _f32(sinks)
        if sn != n_head:
            raise E8KVError(ErrorCode.SRC_SIZE, f"attend: {sn} sinks for {n_head} query heads")
        _check(lib.e8kv_cache_attend_sinks(self._p, op, qn, layer, qp, n_head, n_tok, pos0, sp),
               f"attend layer {layer}")
        return out

    def n_tokens(self, layer: int = 0) -> int:
        return lib.e8kv_cache_n_tokens(self._p, layer)

    def truncate(self, n_keep: int) -> int:
        return _check(lib.e8kv_cache_truncate(self._p, n_keep), "truncate")

    def evict(self, q: Optional[ArrayLike] = None, n_head: int = 0, q_pos0: int = 0,
              sinks: Optional[ArrayLike] = None) -> int:
        """Evict every layer by the spec's evict=SCORER:F (e8kv_cache_evict): q, for snapkv and h2o, the
        queries of n_q tokens before RoPE, (n_layer, n_q, n_head * head_dim) at positions q_pos0 ...; sinks,
        with q: learned attention sinks (n_layer, n_head), -inf where a layer has none
        (e8kv_cache_evict_sinks). Returns the largest number of tokens a layer keeps."""
        if q is None:
            if sinks is not None:
                raise E8KVError(ErrorCode.BAD_ARGUMENT, "evict: sinks weigh queries; none given")
            return _check(lib.e8kv_cache_evict(self._p, None, 0, 0, 0), "evict")
        qk, qp, qn = _f32(q)
        if n_head <= 0 or qn % (self.n_layer * n_head * self.head_dim):
            raise E8KVError(ErrorCode.SRC_SIZE, f"evict: {qn} floats are not n_layer x n_q rows of {n_head} heads")
        n_q = qn // (self.n_layer * n_head * self.head_dim)
        if sinks is None:
            return _check(lib.e8kv_cache_evict(self._p, qp, n_head, n_q, q_pos0), "evict")
        sk, sp, sn = _f32(sinks)
        if sn != self.n_layer * n_head:
            raise E8KVError(ErrorCode.SRC_SIZE, f"evict: {sn} sinks, not n_layer x n_head = {self.n_layer * n_head}")
        return _check(lib.e8kv_cache_evict_sinks(self._p, qp, n_head, n_q, q_pos0, sp), "evict")

    def n_kept(self, layer: int = 0) -> int:
        """Tokens the layer holds: n_tokens less those evicted."""
        return lib.e8kv_cache_n_kept(self._p, layer)

    def clear(self) -> None:
        lib.e8kv_cache_clear(self._p)

    # -- accounting
    @property
    def n_bytes(self) -> int:
        """Bytes the cache has allocated (every live page at its aligned size + the fixed part)."""
        return lib.e8kv_cache_bytes(self._p)

    @property
    def fixed_bytes(self) -> int:
        return lib.e8kv_cache_fixed_bytes(self._p)

    @property
    def page_tokens(self) -> int:
        return lib.e8kv_cache_page_tokens(self._p)

    @property
    def bits_per_value(self) -> float:
        return lib.e8kv_cache_bits_per_value(self._p)

    @property
    def keys_pre_rope(self) -> bool:
        """True: append keys before RoPE and pass queries with RoPE (rope=pre); False: keys with RoPE."""
        return bool(lib.e8kv_cache_keys_pre_rope(self._p))

    # -- persistence
    def save(self, path: Optional[PathLike] = None, meta: bytes = b"") -> Union[bytes, int]:
        """Serialize the whole cache (doc/format.md §4): to `path` (returns bytes written) or to bytes."""
        m = np.frombuffer(meta, dtype=np.uint8) if meta else None
        mp, ms = (m.ctypes.data, m.size) if m is not None else (None, 0)
        if path is not None:
            return _check(lib.e8kv_cache_save_file(self._p, os.fsencode(path), mp, ms), f"save {os.fspath(path)}")
        cap = _check(lib.e8kv_cache_save_bound(self._p, ms), "save bound")
        buf = np.empty(cap, dtype=np.uint8)
        n = _check(lib.e8kv_cache_save(buf.ctypes.data, cap, self._p, mp, ms), "save")
        return buf[:n].tobytes()

    @classmethod
    def load(cls, src: Union[PathLike, bytes], n_threads: int = 0, calib: Optional[Calib] = None) -> "Cache":
        """A new cache from a saved file (path) or buffer (bytes), bit-identical in attention."""
        if not isinstance(src, (bytes, bytearray, memoryview)):
            with open(src, "rb") as f:
                src = f.read()
        keep, addr, nb = _bytes_in(src)
        info = cls.file_info(src)
        err = c_size_t(0)
        p = lib.e8kv_cache_load(addr, nb, n_threads, byref(err))
        if not p:
            raise E8KVError(lib.e8kv_get_error_code(err.value), "load cache")
        return cls(info["n_layer"], info["n_head_kv"], info["head_dim"], info["n_ctx"], info["spec"],
                   n_threads=n_threads, calib=calib, _ptr=p)

    def load_into(self, src: Union[PathLike, bytes]) -> int:
        """Replace the contents by saved ones (same configuration). Returns the largest layer token count."""
        if not isinstance(src, (bytes, bytearray, memoryview)):
            with open(src, "rb") as f:
                src = f.read()
        keep, addr, nb = _bytes_in(src)
        return _check(lib.e8kv_cache_load_into(self._p, addr, nb), "load_into")

    def __reduce__(self) -> tuple:  # (pickling: the saved cache, bit-identical in attention, and its calibration)
        return _cache_from_saved, (_pickled(self.save()), self._calib, self.n_threads)

    @staticmethod
    def file_info(src: bytes) -> dict:
        """The header of a saved cache (e8kv_cache_file_get_info) as a dict."""
        keep, addr, nb = _bytes_in(src)
        info = CacheFileInfo()
        _check(lib.e8kv_cache_file_get_info(byref(info), addr, nb), "cache file")
        d = {name: getattr(info, name) for name, _ in CacheFileInfo._fields_}
        d["spec"] = info.spec.decode()
        d["rope_freqs"] = list(info.rope_freqs[:info.n_rope_freqs])  # a scaled RoPE's (version 3), else []
        return d

    def __repr__(self) -> str:
        return (f"Cache('{self.spec}', n_layer={self.n_layer}, n_head_kv={self.n_head_kv}, "
                f"head_dim={self.head_dim}, n_ctx={self.n_ctx}, {self.n_bytes} bytes)")


# ------------------------------------------------------------------------------------------ CUDA cache
def _cache_from_saved(data: Any, calib: Optional[Calib], n_threads: int = 0) -> "Cache":
    return Cache.load(_unpickled(data), n_threads=n_threads, calib=calib)


def _calib_from_pickled(data: Any) -> "Calib":
    return Calib.from_bytes(_unpickled(data))


def cuda_built() -> bool:
    """True when libe8kv_cuda.so (the CUDA cache, built where CMake found nvcc) was found and loaded."""
    return cuda_lib() is not None


def cuda_available() -> bool:
    """True when the CUDA cache is built and a CUDA device is usable."""
    return cuda_built() and bool(cuda_lib().e8kv_cuda_available())


_DTYPES: dict = {}


def _cuda_dtype(t: Any) -> int:
    """e8kv_dtype of a torch tensor (E8KV_DTYPE_F32 / F16 / BF16)."""
    if not _DTYPES and _torch is not None:
        _DTYPES.update({_torch.float32: 0, _torch.float16: 1, _torch.bfloat16: 2})
    if t.dtype not in _DTYPES:
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"dtype {t.dtype}: the CUDA cache takes float32, float16, bfloat16")
    return _DTYPES[t.dtype]


def _dev(t: Any, what: str, dtype: Any = None) -> int:
    """data_ptr of a contiguous CUDA tensor (no copy: a wrong layout is the caller's error)."""
    if not _is_torch(t) or t.device.type != "cuda":
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"{what}: a torch CUDA tensor is expected")
    if not t.is_contiguous():
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"{what}: the tensor must be contiguous")
    if dtype is not None and t.dtype != dtype:
        raise E8KVError(ErrorCode.BAD_ARGUMENT, f"{what}: dtype {t.dtype}, expected {dtype}")
    return t.data_ptr()


def _stream(t: Any, stream: Any) -> int:
    """The cudaStream_t to launch on: `stream`, or the current stream of the device of `t` (a tensor or a
    device)."""
    if stream is None:
        return _torch.cuda.current_stream(getattr(t, "device", t)).cuda_stream
    return stream.cuda_stream if hasattr(stream, "cuda_stream") else int(stream)


CUDA_GROUP_MAX = 8  # query heads per KV head that one attention call of the CUDA cache takes
CUDA_GROUP_MAX_256 = 4  # ... at head_dim 256 (e8kv_cuda.h)


def cuda_group_max(head_dim: int) -> int:
    """Query heads per KV head that one attention call of the CUDA cache takes at this head_dim."""
    return CUDA_GROUP_MAX_256 if head_dim == 256 else CUDA_GROUP_MAX


def _group_split(g: int, head_dim: int = 128) -> int:
    """The fewest calls k (g % k == 0) that cut a group of g query heads into groups of at most
    cuda_group_max(head_dim)."""
    return next(k for k in range(1, g + 1) if g % k == 0 and g // k <= cuda_group_max(head_dim))


class CudaCache:
    """The device cache of include/e8kv_cuda.h with caller-owned block tables (the way serving engines own
    theirs): `n_blocks` pages of `block_size` tokens per (layer, K/V), all allocated at creation.
    spec: "e8box:4", "e8box:3", "e8p:2", "bf16", "f16", or the library's grammar over them (k=/v=/kv=, layer rules,
    sink=N, center=; keys after RoPE: no rope=pre, window=, auto= or eviction in this cache: the transformers
    cache E8KVCudaCache evicts a prompt before storing it). Each sequence
    may have a row (0 .. max_seqs - 1, the caller's choice) holding its sink rows (sink=N: its exact first N
    tokens, append's sink_slots = row * N + position, attended instead of their codes) and its means
    (`centered`: center=1, the default, with e8box or e8p streams: set_means from the sequence's first
    tokens, then append(rows=) codes x - mean and attend(rows=) adds it back, as the CPU cache does).
    center=rope (rope_theta > 0 or the model's rope_freqs, K and V e8box, or both e8p:2): keys arrive after RoPE;
    for 8 RoPE pairs per (row, layer, KV head) the centre is the keys' mean before RoPE turned to each key's
    position, so append(rows=) needs positions= (int32 (n_tok), each token's index in its sequence;
    `rope_centre` says when).
    Tensors are torch CUDA tensors, passed by pointer on the current stream (or `stream`)."""

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, n_blocks: int, spec: str = "e8box:4", *,
                 block_size: int = 16, seed: int = 0, max_ctx: int = 0, max_batch: int = 0, max_n_head: int = 0,
                 max_seqs: int = 1, max_append: int = 0, device: int = 0, rope_theta: float = 0.0,
                 rope_freqs: Optional[Sequence[float]] = None, rope_positions: int = 0) -> None:
        if not cuda_built():
            raise E8KVError(ErrorCode.UNSUPPORTED, "CudaCache: this build of e8kv has no CUDA cache (no "
                                                   "libe8kv_cuda.so: built without nvcc)")
        self._lib = cuda_lib()
        if not self._lib.e8kv_cuda_available():
            raise E8KVError(ErrorCode.UNSUPPORTED, "CudaCache: no usable CUDA device")
        self._spec_bytes = spec.encode()
        self._args = dict(n_layer=n_layer, n_head_kv=n_head_kv, head_dim=head_dim, n_blocks=n_blocks, spec=spec,
                          block_size=block_size, seed=seed, max_ctx=max_ctx, max_batch=max_batch,
                          max_n_head=max_n_head, max_seqs=max_seqs, max_append=max_append, device=device,
                          rope_theta=rope_theta, rope_freqs=None if rope_freqs is None else list(rope_freqs),
                          rope_positions=rope_positions)  # (clone makes another of the same parameters)
        g = max_n_head // n_head_kv if max_n_head and max_n_head % n_head_kv == 0 else 0
        if g > cuda_group_max(head_dim):  # attend() takes such groups in calls of g / k: the workspace is for one
            max_n_head = n_head_kv * (g // _group_split(g, head_dim))
        params = CudaCacheParams(n_layer=n_layer, n_head_kv=n_head_kv, head_dim=head_dim, block_size=block_size,
                                 n_blocks=n_blocks, spec=self._spec_bytes, seed=seed, max_ctx=max_ctx,
                                 max_seqs=max_seqs, max_batch=max_batch, max_n_head=max_n_head,
                                 max_append=max_append, device=int(device), rope_theta=float(rope_theta),
                                 rope_positions=int(rope_positions))
        if rope_freqs is not None:  # (copied into the cache's table at creation)
            if len(rope_freqs) != head_dim // 2:
                raise E8KVError(ErrorCode.BAD_ARGUMENT,
                                f"CudaCache: {len(rope_freqs)} rope_freqs for head_dim {head_dim}")
            freqs = (c_float * len(rope_freqs))(*[float(x) for x in rope_freqs])
            params.rope_freqs = ctypes.cast(freqs, POINTER(c_float))
        err = c_size_t(0)
        self._p = self._lib.e8kv_cuda_cache_create(byref(params), byref(err))
        if not self._p:
            raise E8KVError(lib.e8kv_get_error_code(err.value),
                            f"CUDA cache '{spec}' (n_layer {n_layer}, n_head_kv {n_head_kv}, head_dim {head_dim}, "
                            f"{n_blocks} pages of {block_size})")
        self.n_layer, self.n_head_kv, self.head_dim, self.n_blocks = n_layer, n_head_kv, head_dim, n_blocks
        self.block_size, self.spec, self.seed, self.device = block_size, spec, seed, int(device)
        self.max_ctx = max_ctx or n_blocks * block_size
        self.sink = int(self._lib.e8kv_cuda_cache_sink(self._p))
        self.centered = bool(self._lib.e8kv_cuda_cache_centered(self._p))
        self.rope_centre = bool(self._lib.e8kv_cuda_cache_rope_centred(self._p))  # append(rows=) needs positions=
        self.max_seqs = max_seqs
        self._shifts = None
        self._sinks: dict[int, Any] = {}  # set_layer_sinks' tensors per layer (the C cache reads them)

    def set_row_shifts(self, shifts: Any) -> None:
        """center=rope caches whose rows drop whole pages from the middle (a token budget): shifts, an int32
        CUDA tensor (max_seqs, 2), row r's (from, off): a key at index i >= from of its row's block table is
        at position i + off (from a multiple of 16); the appends pass those positions. The cache keeps the
        tensor (not its values): update it in place, in CUDA graphs too. None: no shifts."""
        if shifts is not None and (shifts.dtype != _torch.int32 or tuple(shifts.shape) != (self.max_seqs, 2)
                                   or not shifts.is_cuda or not shifts.is_contiguous()):
            raise E8KVError(ErrorCode.BAD_ARGUMENT, f"set_row_shifts: an int32 CUDA tensor ({self.max_seqs}, 2)")
        _check(self._lib.e8kv_cuda_set_row_shifts(self._p, shifts.data_ptr() if shifts is not None else None),
               "set_row_shifts")
        self._shifts = shifts  # kept alive while the cache reads it

    def set_layer_sinks(self, layer: int, sinks: Any) -> None:
        """Learned attention sinks (gpt-oss) of one layer: sinks, a float32 CUDA tensor of n_head logits in the
        scores' units, each joining its head's softmax with a zero value (e8kv_cuda_set_layer_sinks); the
        layer's attention must then be called with that n_head. The cache keeps the tensor (not its values):
        update it in place, in CUDA graphs too. None: none."""
        if sinks is not None and (sinks.dtype != _torch.float32 or sinks.dim() != 1 or not sinks.is_cuda
                                  or not sinks.is_contiguous()):
            raise E8KVError(ErrorCode.BAD_ARGUMENT, "set_layer_sinks: a float32 contiguous CUDA vector (n_head)")
        _check(self._lib.e8kv_cuda_set_layer_sinks(self._p, layer, sinks.data_ptr() if sinks is not None else None,
                                                   0 if sinks is None else sinks.numel()),
               f"set_layer_sinks layer {layer}")
        self._sinks[layer] = sinks  # kept alive while the cache reads it

    def __del__(self) -> None:
        if getattr(self, "_p", None):
            self._lib.e8kv_cuda_cache_free(self._p)
            self._p = None

    @property
    def handle(self) -> int:
        """The C pointer (what the custom operators of e8kv.torch_ops are given)."""
        return int(self._p)

    @property
    def device_bytes(self) -> int:
        """Every byte the cache holds on the device (one cudaMalloc: pages, tables, workspace)."""
        return self._lib.e8kv_cuda_cache_device_bytes(self._p)

    @property
    def token_bytes(self) -> int:
        """Bytes of one token in the pages: all layers, K and V, all KV heads."""
        return self._lib.e8kv_cuda_cache_token_bytes(self._p)

    def vector_bytes(self, layer: int = 0, stream: int = 0) -> int:
        return _check(self._lib.e8kv_cuda_cache_vector_bytes(self._p, layer, stream), "vector_bytes")

    def set_means(self, layer: int, row: int, k: Any, v: Any, *, stream: Any = None) -> None:
        """centered caches: the means of `row` for this layer from a sequence's first tokens k, v (n_tok,
        n_head_kv * head_dim): their mean when n_tok >= 16, else 0 (the CPU cache's rule). Asynchronous."""
        row_len = self.n_head_kv * self.head_dim
        n_tok = k.numel() // row_len
        if k.numel() != n_tok * row_len or v.numel() != k.numel() or k.dtype != v.dtype or n_tok == 0:
            raise E8KVError(ErrorCode.SRC_SIZE, f"set_means: k {tuple(k.shape)}, v {tuple(v.shape)}, rows of {row_len}")
        _check(self._lib.e8kv_cuda_set_means_async(self._p, layer, row, _dev(k, "k"), _dev(v, "v"), n_tok,
                                                   _cuda_dtype(k), _stream(k, stream)), f"set_means layer {layer}")

    def append(self, layer: int, slots: Any, k: Any, v: Any, *, status: Any = None, stream: Any = None,
               sink_slots: Any = None, rows: Any = None, positions: Any = None) -> int:
        """Write rows k, v (n_tok, n_head_kv * head_dim) into slots (int64 (n_tok), page * block_size +
        offset; negative: skipped). status=None: synchronous, a NaN/Inf or out-of-range value is an
        E8KVError. status: an int32 CUDA tensor of one element: asynchronous on the stream (graph-safe), the
        error bits are OR-ed into it (e8kv_cuda_status_error / check_status). sink_slots (int64 (n_tok),
        sink=N caches): the rows whose entry is row * N + position (not negative) also go to the sink rows.
        rows (int32 (n_tok), centered caches): each token's row, whose means its centred streams subtract
        (None: no means). positions (int32 (n_tok), center=rope caches with rows): each token's index in its
        sequence."""
        n_tok = slots.numel()
        row = self.n_head_kv * self.head_dim
        if k.numel() != n_tok * row or v.numel() != n_tok * row or k.dtype != v.dtype:
            raise E8KVError(ErrorCode.SRC_SIZE, f"append: {n_tok} slots, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                                                f"rows of {row}")
        sp, kp, vp = _dev(slots, "slots", _torch.int64), _dev(k, "k"), _dev(v, "v")
        dt = _cuda_dtype(k)
        if sink_slots is not None and sink_slots.numel() != n_tok:
            raise E8KVError(ErrorCode.SRC_SIZE, f"append: {n_tok} slots, {sink_slots.numel()} sink slots")
        if rows is not None and rows.numel() != n_tok:
            raise E8KVError(ErrorCode.SRC_SIZE, f"append: {n_tok} slots, {rows.numel()} rows")
        if positions is not None and positions.numel() != n_tok:
            raise E8KVError(ErrorCode.SRC_SIZE, f"append: {n_tok} slots, {positions.numel()} positions")
        sync = status is None  # then one status word of its own, read back at the end
        st = _torch.zeros(1, dtype=_torch.int32, device=k.device) if sync else status
        if st.numel() != 1:
            raise E8KVError(ErrorCode.BAD_ARGUMENT, "append: status is one int32 element")
        sw, cs = _dev(st, "status", _torch.int32), _stream(k, stream)
        if rows is not None or sink_slots is not None:  # codes, means and sink rows in one launch per stream
            rp = None if rows is None else _dev(rows, "rows", _torch.int32)
            ssp = None if sink_slots is None else _dev(sink_slots, "sink_slots", _torch.int64)
            pp = None if positions is None else _dev(positions, "positions", _torch.int32)
            n = _check(self._lib.e8kv_cuda_append_pos_async(self._p, layer, sp, rp, ssp, pp, kp, vp, n_tok, dt, sw,
                                                            cs), f"append layer {layer}")
        else:
            n = _check(self._lib.e8kv_cuda_append_slots_async(self._p, layer, sp, kp, vp, n_tok, dt, sw, cs),
                       f"append layer {layer}")
        if sync:
            self.check_status(st)
        return n

    @staticmethod
    def check_status(status: Any) -> None:
        """Raise the E8KVError that a status word (int32 tensor, read back: a synchronisation) names."""
        _check(cuda_lib().e8kv_cuda_status_error(int(status.item()) & 0xffffffff), "append (status word)")

    def attend(self, layer: int, q: Any, block_tables: Any, ctx_lens: Any, max_ctx: Optional[int] = None,
               out: Any = None, *, stream: Any = None, rows: Any = None) -> Any:
        """Decode attention of one query row per sequence: q (n_seq, n_head * head_dim) (f32/f16/bf16),
        block_tables int32 (n_seq, max_blocks), ctx_lens int32 (n_seq), each at most max_ctx (default: the
        cache's); rows int32 (n_seq): each sequence's row of sink rows and means (None: row s for sequence s).
        Asynchronous on the
        stream; returns float32 (n_seq, n_head * head_dim)."""
        n_seq = q.shape[0]
        width = q.numel() // n_seq
        if width % self.head_dim or block_tables.dim() != 2 or block_tables.shape[0] != n_seq or \
                ctx_lens.numel() != n_seq:
            raise E8KVError(ErrorCode.SRC_SIZE, f"attend: q {tuple(q.shape)}, tables {tuple(block_tables.shape)}, "
                                                f"ctx_lens {tuple(ctx_lens.shape)}")
        if out is None:
            out = _torch.empty((n_seq, width), dtype=_torch.float32, device=q.device)
        elif out.numel() != n_seq * width:
            raise E8KVError(ErrorCode.DST_TOO_SMALL, "attend: out must hold (n_seq, n_head * head_dim) floats")
        if rows is not None and rows.numel() != n_seq:
            raise E8KVError(ErrorCode.SRC_SIZE, f"attend: {n_seq} sequences, {rows.numel()} rows")
        g = width // self.head_dim // self.n_head_kv if width % (self.head_dim * self.n_head_kv) == 0 else 0
        if g > cuda_group_max(self.head_dim):  # more than the kernels take (8, or 4 at 256): k calls of g / k
            k = _group_split(g, self.head_dim)
            qv = q.reshape(n_seq, self.n_head_kv, k, g // k, self.head_dim)
            ov = out.view(n_seq, self.n_head_kv, k, g // k, self.head_dim)
            for j in range(k):
                qj = qv[:, :, j].reshape(n_seq, -1).contiguous()
                ov[:, :, j] = self.attend(layer, qj, block_tables, ctx_lens, max_ctx, stream=stream,
                                          rows=rows).view(n_seq, self.n_head_kv, g // k, -1)
            return out
        rp = None if rows is None else _dev(rows, "rows", _torch.int32)
        _check(self._lib.e8kv_cuda_attend_rows(self._p, layer, _dev(out, "out", _torch.float32), _dev(q, "q"),
                                               _cuda_dtype(q), n_seq, width // self.head_dim,
                                               _dev(block_tables, "block_tables", _torch.int32),
                                               block_tables.shape[1], _dev(ctx_lens, "ctx_lens", _torch.int32),
                                               self.max_ctx if max_ctx is None else max_ctx, rp, None, 0,
                                               _stream(q, stream)),
               f"attend layer {layer}")
        return out

    def gather(self, layer: int, n_tok: int, block_tables: Any, *, rows: Any = None, dtype: Any = None,
               stream: Any = None) -> tuple:
        """The values the attention reads at positions 0 .. n_tok-1 of each sequence (block_tables int32
        (n_seq, max_blocks); rows int32 (n_seq) as in attend): the pages decoded and un-rotated, the means
        added back, the sink rows' exact values below sink=N; (k, v), each (n_seq, n_head_kv, n_tok,
        head_dim) of dtype (torch.bfloat16 by default; float32 gives the CPU codec's decode + mean bit for
        bit). For a chunk of many queries after a past: a dense attention kernel over these reads each
        value once for all the chunk's queries. Asynchronous on the stream."""
        if block_tables.dim() != 2:
            raise E8KVError(ErrorCode.SRC_SIZE, f"gather: tables {tuple(block_tables.shape)}")
        n_seq = block_tables.shape[0]
        if rows is not None and rows.numel() != n_seq:
            raise E8KVError(ErrorCode.SRC_SIZE, f"gather: {n_seq} sequences, {rows.numel()} rows")
        dtype = dtype or _torch.bfloat16
        shape = (n_seq, self.n_head_kv, n_tok, self.head_dim)
        k = _torch.empty(shape, dtype=dtype, device=block_tables.device)
        v = _torch.empty(shape, dtype=dtype, device=block_tables.device)
        if n_tok == 0:
            return k, v
        rp = None if rows is None else _dev(rows, "rows", _torch.int32)
        _check(self._lib.e8kv_cuda_gather_async(self._p, layer, _dev(k, "k"), _dev(v, "v"), _cuda_dtype(k), n_seq,
                                                n_tok, _dev(block_tables, "block_tables", _torch.int32),
                                                block_tables.shape[1], rp, _stream(k, stream)),
               f"gather layer {layer}")
        return k, v

    def copy_pages(self, src: Any, dst: Any, *, stream: Any = None) -> int:
        """Copy-on-write for forked sequences (beam search, several samples of one prompt): page src[i] to
        page dst[i] in every layer's K and V pools (host sequences of page ids; no destination twice or also
        a source: E8KVError BAD_ARGUMENT, nothing copied). Asynchronous on the stream (default: the current
        stream of the cache's device), after the work queued there. Returns the number of pages."""
        return self._copy("e8kv_cuda_copy_pages_async", "copy_pages", src, dst, stream)

    def copy_rows(self, src: Any, dst: Any, *, stream: Any = None) -> int:
        """The same for rows: row src[i]'s sink rows and means, every layer, to row dst[i]."""
        return self._copy("e8kv_cuda_copy_rows_async", "copy_rows", src, dst, stream)

    def _copy(self, fn: str, what: str, src: Any, dst: Any, stream: Any) -> int:
        s, d = np.ascontiguousarray(src, dtype=np.int32), np.ascontiguousarray(dst, dtype=np.int32)
        if s.ndim != 1 or s.shape != d.shape:
            raise E8KVError(ErrorCode.SRC_SIZE, f"{what}: {s.shape} sources, {d.shape} destinations")
        return _check(getattr(self._lib, fn)(self._p, s.ctypes.data, d.ctypes.data, s.size,
                                             _stream(self.device, stream)), what)

    def clone(self, *, stream: Any = None) -> "CudaCache":
        """A new cache of the same parameters holding a copy of everything this one stores (pages, sink rows,
        means, the owned sequences: e8kv_cuda_cache_copy_async, asynchronous on the stream, after the work
        queued there); the two then change independently. What this cache was pointed at (set_layer_sinks,
        set_row_shifts) is not copied: point the copy at its own tensors."""
        new = CudaCache(**self._args)
        new.copy_from(self, stream=stream)
        return new

    def state(self, ranges: Optional[Sequence[tuple[int, int]]] = None) -> bytes:
        """Everything the cache stores as bytes (doc/format.md §7: e8kv_cuda_cache_export): the pages of the
        (first, count) ranges of page ids (None: every page), sink rows, means, the owned sequences, and an
        XXH64 of it all. Waits for the device."""
        return self._export(ranges).tobytes()

    def _export(self, ranges: Optional[Sequence[tuple[int, int]]] = None) -> np.ndarray:
        r = None
        if ranges is not None:
            r = np.ascontiguousarray(np.asarray(ranges, dtype=np.int64).reshape(-1, 2))
        rp, nr = (r.ctypes.data, r.shape[0]) if r is not None else (None, 0)
        need = _check(self._lib.e8kv_cuda_cache_export(self._p, rp, nr, None, 0), "state")
        buf = np.empty(need, dtype=np.uint8)
        _check(self._lib.e8kv_cuda_cache_export(self._p, rp, nr, buf.ctypes.data, need), "state")
        return buf

    def load_state(self, data: Any) -> None:
        """Load state() bytes of a cache of the same parameters (e8kv_cuda_cache_import): bad bytes are an
        E8KVError (TRUNCATED, CORRUPTED, CHECKSUM, VERSION; another layout: BAD_ARGUMENT) and change nothing;
        pages outside the saved ranges keep their bytes. What set_layer_sinks / set_row_shifts pointed the
        cache at is not part of the state."""
        if _is_torch(data) and data.device.type != "cpu":  # (torch.load's map_location may have moved it)
            data = data.cpu()
        keep, addr, nb = _bytes_in(data)
        _check(self._lib.e8kv_cuda_cache_import(self._p, addr, nb), "load_state")

    def __reduce__(self) -> tuple:  # (pickling: the parameters and state())
        return _cuda_cache_from_state, (self._args, _pickled(self._export()))

    def copy_from(self, src: "CudaCache", *, stream: Any = None) -> None:
        """Make this cache a copy of src, a cache of the same parameters on the same device (else E8KVError
        BAD_ARGUMENT, nothing copied): e8kv_cuda_cache_copy_async."""
        _check(self._lib.e8kv_cuda_cache_copy_async(self._p, src._p, _stream(self.device, stream)), "copy_from")

    def read_slot(self, layer: int, stream: int, slot: int, head: int) -> np.ndarray:
        """The bytes of one stored vector in the CPU codec's order (what e8kv.Codec.encode gives)."""
        vb = self.vector_bytes(layer, stream)
        buf = np.empty(vb, dtype=np.uint8)
        _check(self._lib.e8kv_cuda_read_slot(self._p, buf.ctypes.data, vb, layer, stream, slot, head), "read_slot")
        return buf

    def __repr__(self) -> str:
        return (f"CudaCache('{self.spec}', n_layer={self.n_layer}, n_head_kv={self.n_head_kv}, "
                f"head_dim={self.head_dim}, {self.n_blocks} pages of {self.block_size}, "
                f"{self.device_bytes} device bytes)")


def _cuda_cache_from_state(args: dict, data: Any) -> CudaCache:
    c = CudaCache(**args)
    c.load_state(data)  # (a uint8 tensor or bytes: read in place)
    return c
