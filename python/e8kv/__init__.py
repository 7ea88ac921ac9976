"""e8kv: E8 lattice compression of transformer key/value caches (Python binding of the C library).

    import e8kv
    c = e8kv.Codec("e8:4", 64); codes = c.encode(x); y = c.decode(codes)
    kv = e8kv.Cache(n_layer, n_head_kv, head_dim, n_ctx, "e8:4,sink=1"); kv.append(0, k, v); kv.attend(0, q)

The Hugging Face transformers integration is `e8kv.hf` (needs torch and transformers >= 5). On a GPU (a
library built with nvcc): `e8kv.CudaCache`, the custom operators of `e8kv.torch_ops`, and
`e8kv.hf.E8KVCache(config, "e8box:4", device="cuda", max_batch_size=..., max_cache_len=...)`.
"""
from .core import (Cache, Calib, Codec, CudaCache, E8KVError, ErrorCode, Rope, cuda_available, cuda_built,
                   preset_spec, version)

__all__ = ["Cache", "Calib", "Codec", "CudaCache", "E8KVError", "ErrorCode", "Rope", "cuda_available",
           "cuda_built", "preset_spec", "version"]
__version__ = "0.1.0"
