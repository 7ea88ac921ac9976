"""Loading libe8kv and declaring the C signatures of include/e8kv.h for ctypes, and those of include/e8kv_cuda.h
in libe8kv_cuda.so (built beside libe8kv.so where CMake found nvcc).

The library is looked up in this order: $E8KV_LIB (a path, used by the test suite to load a build tree's
library), the libe8kv.so installed next to this file by `pip install .`, then the system's loader path. The
CUDA library: $E8KV_CUDA_LIB, else libe8kv_cuda.so in the directory of the libe8kv that was loaded (absent:
the CUDA cache is not built: `cuda_lib()` is None), loaded on first use.
"""
from __future__ import annotations

import ctypes
import os
import sys
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Optional

E8KV_CACHE_SPEC_MAX_LEN = 8191
E8KV_MAX_ROPE_FREQS = 256  # E8KV_MAX_HEAD_DIM / 2 (include/e8kv.h)


class CacheParams(ctypes.Structure):
    """e8kv_cache_params (include/e8kv.h), field for field."""

    _fields_ = [
        ("n_layer", c_size_t),
        ("n_head_kv", c_size_t),
        ("head_dim", c_size_t),
        ("n_ctx", c_size_t),
        ("spec", c_char_p),
        ("seed", c_uint64),
        ("n_threads", c_size_t),
        ("rope_theta", c_float),
        ("rope_neox", c_int),
        ("calib", c_void_p),
        ("rope_freqs", POINTER(c_float)),
    ]


class CacheFileInfo(ctypes.Structure):
    """e8kv_cache_file_info (include/e8kv.h), field for field."""

    _fields_ = [
        ("version", c_uint),
        ("n_layer", c_size_t),
        ("n_head_kv", c_size_t),
        ("head_dim", c_size_t),
        ("n_ctx", c_size_t),
        ("page_tokens", c_size_t),
        ("seed", c_uint64),
        ("rope_theta", c_float),
        ("rope_neox", c_int),
        ("spec", ctypes.c_char * (E8KV_CACHE_SPEC_MAX_LEN + 1)),
        ("meta_offset", c_size_t),
        ("meta_size", c_size_t),
        ("file_size", c_size_t),
        ("calib_offset", c_size_t),
        ("calib_size", c_size_t),
        ("n_rope_freqs", c_size_t),
        ("rope_freqs", c_float * E8KV_MAX_ROPE_FREQS),
    ]


class EvictItems(ctypes.Structure):
    """e8kv_evict_items (include/e8kv.h), field for field."""

    _fields_ = [
        ("scorer", ctypes.c_char * 8),
        ("frac", c_float),
        ("recent", c_size_t),
        ("obs", c_size_t),
        ("budget", c_size_t),
        ("n_rules", c_size_t),
    ]


class CudaCacheParams(ctypes.Structure):
    """e8kv_cuda_cache_params (include/e8kv_cuda.h), field for field."""

    _fields_ = [
        ("n_layer", c_size_t),
        ("n_head_kv", c_size_t),
        ("head_dim", c_size_t),
        ("block_size", c_size_t),
        ("n_blocks", c_size_t),
        ("spec", c_char_p),
        ("seed", c_uint64),
        ("max_ctx", c_size_t),
        ("max_seqs", c_size_t),
        ("max_batch", c_size_t),
        ("max_n_head", c_size_t),
        ("max_append", c_size_t),
        ("device", c_int),
        ("rope_theta", c_float),
        ("rope_freqs", POINTER(c_float)),
        ("rope_positions", c_size_t),
    ]


_SZ = POINTER(c_size_t)
_F = POINTER(c_float)

# name: (restype, argtypes)
_SIGNATURES = {
    "e8kv_version_number": (c_uint, []),
    "e8kv_version_string": (c_char_p, []),
    "e8kv_is_error": (c_uint, [c_size_t]),
    "e8kv_get_error_code": (c_int, [c_size_t]),
    "e8kv_error_name": (c_char_p, [c_size_t]),
    "e8kv_error_code_name": (c_char_p, [c_int]),
    # RoPE (the library's one implementation)
    "e8kv_rope_create": (c_void_p, [c_size_t, c_float, c_int, _SZ]),
    "e8kv_rope_create_freqs": (c_void_p, [c_size_t, POINTER(c_double), c_int, _SZ]),
    "e8kv_rope_free": (None, [c_void_p]),
    "e8kv_rope_apply": (None, [c_void_p, _F, c_size_t, c_size_t, c_size_t]),
    # codecs
    "e8kv_codec_create": (c_void_p, [c_char_p, c_size_t, c_uint64, _SZ]),
    "e8kv_codec_free": (None, [c_void_p]),
    "e8kv_codec_spec": (c_char_p, [c_void_p]),
    "e8kv_codec_head_dim": (c_size_t, [c_void_p]),
    "e8kv_codec_vector_bytes": (c_size_t, [c_void_p]),
    "e8kv_codec_bits_per_value": (c_double, [c_void_p]),
    "e8kv_codec_is_rotated": (c_int, [c_void_p]),
    "e8kv_codec_encode": (c_size_t, [c_void_p, c_void_p, c_size_t, _F, c_size_t]),
    "e8kv_codec_decode": (c_size_t, [c_void_p, _F, c_size_t, c_void_p, c_size_t, c_size_t]),
    "e8kv_codec_decode_rotated": (c_size_t, [c_void_p, _F, c_size_t, c_void_p, c_size_t, c_size_t]),
    "e8kv_codec_rotate": (c_size_t, [c_void_p, _F, c_size_t, c_int]),
    # calibration
    "e8kv_calib_create": (c_void_p, [c_size_t, c_size_t, c_size_t, _SZ]),
    "e8kv_calib_free": (None, [c_void_p]),
    "e8kv_calib_observe": (c_size_t, [c_void_p, c_size_t, _F, _F, c_size_t]),
    "e8kv_calib_observe_q": (c_size_t, [c_void_p, c_size_t, _F, c_size_t, c_size_t]),
    "e8kv_calib_finalize": (c_size_t, [c_void_p]),
    "e8kv_calib_info": (c_size_t, [c_void_p, _SZ, _SZ, _SZ, _SZ]),
    "e8kv_calib_eigenvalues": (_F, [c_void_p, c_size_t, c_int, c_size_t]),
    "e8kv_calib_query_energy": (_F, [c_void_p, c_size_t, c_size_t]),
    "e8kv_calib_set_sensitivity": (c_size_t, [c_void_p, c_size_t, c_int, c_double]),
    "e8kv_calib_sensitivity": (c_double, [c_void_p, c_size_t, c_int]),
    "e8kv_calib_bytes": (c_size_t, [c_void_p]),
    "e8kv_calib_save_file": (c_size_t, [c_void_p, c_char_p]),
    "e8kv_calib_load_file": (c_void_p, [c_char_p, _SZ]),
    "e8kv_calib_save_bound": (c_size_t, [c_void_p]),
    "e8kv_calib_save": (c_size_t, [c_void_p, c_size_t, c_void_p]),
    "e8kv_calib_load": (c_void_p, [c_void_p, c_size_t, _SZ]),
    # cache
    "e8kv_cache_create": (c_void_p, [POINTER(CacheParams), _SZ]),
    "e8kv_cache_free": (None, [c_void_p]),
    "e8kv_cache_append": (c_size_t, [c_void_p, c_size_t, _F, _F, c_size_t]),
    "e8kv_cache_attend": (c_size_t, [c_void_p, _F, c_size_t, c_size_t, _F, c_size_t, c_size_t, c_size_t]),
    "e8kv_cache_attend_sinks": (c_size_t, [c_void_p, _F, c_size_t, c_size_t, _F, c_size_t, c_size_t, c_size_t, _F]),
    "e8kv_cache_n_tokens": (c_size_t, [c_void_p, c_size_t]),
    "e8kv_cache_truncate": (c_size_t, [c_void_p, c_size_t]),
    "e8kv_cache_evict": (c_size_t, [c_void_p, _F, c_size_t, c_size_t, c_size_t]),
    "e8kv_cache_evict_sinks": (c_size_t, [c_void_p, _F, c_size_t, c_size_t, c_size_t, _F]),
    "e8kv_cache_n_kept": (c_size_t, [c_void_p, c_size_t]),
    "e8kv_cache_spec_evict": (c_size_t, [c_char_p, POINTER(EvictItems), c_char_p, c_size_t]),
    "e8kv_cache_clear": (None, [c_void_p]),
    "e8kv_cache_bytes": (c_size_t, [c_void_p]),
    "e8kv_cache_fixed_bytes": (c_size_t, [c_void_p]),
    "e8kv_cache_page_tokens": (c_size_t, [c_void_p]),
    "e8kv_cache_bits_per_value": (c_double, [c_void_p]),
    "e8kv_cache_preset_spec": (c_char_p, [c_char_p]),
    "e8kv_cache_keys_pre_rope": (c_int, [c_void_p]),
    "e8kv_cache_save_bound": (c_size_t, [c_void_p, c_size_t]),
    "e8kv_cache_save": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_size_t]),
    "e8kv_cache_file_get_info": (c_size_t, [POINTER(CacheFileInfo), c_void_p, c_size_t]),
    "e8kv_cache_load": (c_void_p, [c_void_p, c_size_t, c_size_t, _SZ]),
    "e8kv_cache_load_into": (c_size_t, [c_void_p, c_void_p, c_size_t]),
    "e8kv_cache_save_file": (c_size_t, [c_void_p, c_char_p, c_void_p, c_size_t]),
    "e8kv_cache_load_file": (c_void_p, [c_char_p, c_size_t, _SZ]),
}

# include/e8kv_cuda.h: present when the library was built with a CUDA compiler
_CUDA_SIGNATURES = {
    "e8kv_cuda_available": (c_int, []),
    "e8kv_cuda_cache_create": (c_void_p, [POINTER(CudaCacheParams), _SZ]),
    "e8kv_cuda_cache_free": (None, [c_void_p]),
    "e8kv_cuda_cache_device_bytes": (c_size_t, [c_void_p]),
    "e8kv_cuda_cache_token_bytes": (c_size_t, [c_void_p]),
    "e8kv_cuda_cache_vector_bytes": (c_size_t, [c_void_p, c_size_t, c_int]),
    "e8kv_cuda_cache_pages": (c_size_t, [c_void_p, c_size_t, c_int, POINTER(c_void_p)]),
    "e8kv_cuda_append_slots": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_size_t, c_int]),
    "e8kv_cuda_append_slots_async": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_size_t, c_int,
                                                c_void_p, c_void_p]),
    "e8kv_cuda_status_error": (c_size_t, [c_uint]),
    "e8kv_cuda_attend_workspace_bytes": (c_size_t, [c_void_p, c_size_t, c_size_t, c_size_t]),
    "e8kv_cuda_attend": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_int, c_size_t, c_size_t, c_void_p,
                                    c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p]),
    "e8kv_cuda_read_slot": (c_size_t, [c_void_p, c_void_p, c_size_t, c_size_t, c_int, ctypes.c_int64, c_size_t]),
    "e8kv_cuda_append_sink_async": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_size_t, c_int,
                                               c_void_p, c_void_p]),
    "e8kv_cuda_attend_rows": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_int, c_size_t, c_size_t,
                                         c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_void_p, c_size_t,
                                         c_void_p]),
    "e8kv_cuda_cache_sink": (c_size_t, [c_void_p]),
    "e8kv_cuda_set_means_async": (c_size_t, [c_void_p, c_size_t, c_size_t, c_void_p, c_void_p, c_size_t, c_int,
                                             c_void_p]),
    "e8kv_cuda_append_rows_async": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                               c_size_t, c_int, c_void_p, c_void_p]),
    "e8kv_cuda_append_pos_async": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                              c_void_p, c_size_t, c_int, c_void_p, c_void_p]),
    "e8kv_cuda_cache_centered": (c_int, [c_void_p]),
    "e8kv_cuda_cache_rope_centred": (c_int, [c_void_p]),
    "e8kv_cuda_set_row_shifts": (c_size_t, [c_void_p, c_void_p]),
    "e8kv_cuda_set_layer_sinks": (c_size_t, [c_void_p, c_size_t, c_void_p, c_size_t]),
    "e8kv_cuda_gather_async": (c_size_t, [c_void_p, c_size_t, c_void_p, c_void_p, c_int, c_size_t, c_size_t,
                                         c_void_p, c_size_t, c_void_p, c_void_p]),
    "e8kv_cuda_copy_pages_async": (c_size_t, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p]),
    "e8kv_cuda_copy_rows_async": (c_size_t, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p]),
    "e8kv_cuda_cache_copy_async": (c_size_t, [c_void_p, c_void_p, c_void_p]),
    "e8kv_cuda_cache_export": (c_size_t, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t]),
    "e8kv_cuda_cache_import": (c_size_t, [c_void_p, c_void_p, c_size_t]),
}


def _candidates() -> list[str]:
    env = os.environ.get("E8KV_LIB")
    here = os.path.dirname(os.path.abspath(__file__))
    names = ["libe8kv.so", "libe8kv.dylib"] if sys.platform != "win32" else ["e8kv.dll"]
    out = [env] if env else []
    out += [os.path.join(here, n) for n in names]
    out += names
    return out


def _load() -> ctypes.CDLL:
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        lib._e8kv_path = path
        return lib
    raise ImportError("e8kv: cannot load the C library libe8kv (install the package with `pip install .` from "
                      "the repository, or set E8KV_LIB to a built libe8kv.so):\n  " + "\n  ".join(errors))


def _load_cuda(cpu: ctypes.CDLL) -> Optional[ctypes.CDLL]:
    """libe8kv_cuda.so ($E8KV_CUDA_LIB, else beside the loaded libe8kv), or None: built only with nvcc."""
    env = os.environ.get("E8KV_CUDA_LIB")
    path = env or os.path.join(os.path.dirname(os.path.abspath(cpu._e8kv_path)), "libe8kv_cuda.so")
    if not env and not os.path.exists(path):
        return None
    try:
        cuda = ctypes.CDLL(path)
    except OSError as e:
        if env:
            raise ImportError(f"e8kv: cannot load the CUDA library {path} ($E8KV_CUDA_LIB): {e}") from None
        return None
    for name, (res, args) in _CUDA_SIGNATURES.items():
        fn = getattr(cuda, name)
        fn.restype = res
        fn.argtypes = args
    return cuda


lib = _load()
_cuda: list = []  # [the CUDA library or None] once looked up


def cuda_lib() -> Optional[ctypes.CDLL]:
    """libe8kv_cuda.so, loaded on first use (a CPU-only user never maps the CUDA runtime), or None."""
    if not _cuda:
        _cuda.append(_load_cuda(lib))
    return _cuda[0]
