#!/usr/bin/env python3
"""pytest: the ctypes binding of python/e8kv (codecs, cache, errors carrying the library's name,
save/load). Run through ctest (scripts/test.sh) or `pytest tests/py_hf_binding.py`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    import hf_skip
    sys.exit(hf_skip.run_as_script(__file__))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hf_testlib import e8kv  # noqa: E402



# ------------------------------------------------------------------------------------------ binding
def test_codec_roundtrip_and_errors():
    c = e8kv.Codec("e8:4", 64)
    assert c.vector_bytes == 34 and abs(c.bits_per_value - 4.25) < 1e-12
    x = np.random.default_rng(1).standard_normal((100, 64)).astype(np.float32)
    codes = c.encode(x)
    assert codes.shape == (100, 34) and codes.dtype == np.uint8
    y = c.decode(codes)
    assert y.shape == x.shape
    mse = float(((x - y) ** 2).mean())
    assert 0 < mse < 0.02, mse  # E8 at 4 bits: ~1.2x the Shannon bound 2^-8 = 0.0039
    np.testing.assert_array_equal(c.encode(torch.from_numpy(x)), codes)  # torch by pointer, same bytes
    np.testing.assert_array_equal(c.encode(x), codes)  # encoding twice gives identical bytes
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Codec("e8:4", 60)
    assert e.value.code == e8kv.ErrorCode.HEAD_DIM and "head_dim" in e.value.name
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Codec("e8:9", 64)
    assert e.value.code in (e8kv.ErrorCode.SPEC, e8kv.ErrorCode.RATE)
    bad = x.copy()
    bad[3, 5] = np.nan
    with pytest.raises(e8kv.E8KVError) as e:
        c.encode(bad)
    assert e.value.code == e8kv.ErrorCode.NONFINITE


def test_cache_append_attend_save_load(tmp_path):
    rng = np.random.default_rng(2)
    kv = e8kv.Cache(2, 3, 64, 256, "e8:4,sink=1", rope_theta=10000.0)
    k = rng.standard_normal((40, 192)).astype(np.float32)
    v = rng.standard_normal((40, 192)).astype(np.float32)
    assert kv.append(0, k, v) == 40 and kv.append(1, torch.from_numpy(k), torch.from_numpy(v)) == 40
    q = rng.standard_normal((40, 9 * 64)).astype(np.float32)
    o0, o1 = kv.attend(0, q, 0), kv.attend(1, torch.from_numpy(q), 0)
    assert isinstance(o0, np.ndarray) and isinstance(o1, torch.Tensor)
    np.testing.assert_array_equal(o0, o1.numpy())  # same bytes in, same codes, same attention
    path = tmp_path / "c.e8kc"
    assert kv.save(path) > 0
    back = e8kv.Cache.load(path)
    np.testing.assert_array_equal(back.attend(0, q, 0), o0)  # bit-identical after save/load
    assert e8kv.Cache.file_info(kv.save())["n_layer"] == 2
    with pytest.raises(e8kv.E8KVError) as e:
        kv.attend(0, q, 10)  # positions 10..49 are not stored
    assert e.value.code in (e8kv.ErrorCode.DIMENSION, e8kv.ErrorCode.BAD_ARGUMENT)
    raw = bytearray(kv.save())
    raw[len(raw) // 2] ^= 0x55
    with pytest.raises(e8kv.E8KVError) as e:
        e8kv.Cache.load(bytes(raw))
    assert e.value.code in (e8kv.ErrorCode.CHECKSUM, e8kv.ErrorCode.CORRUPTED)


