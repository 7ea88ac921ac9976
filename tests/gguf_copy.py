"""A GGUF file written again with changes (the gguf package's reader and writer), for the tests that need a
variant of the default model: py_gguf_ref.py (RoPE scaling keys and a rope_freqs tensor) and py_tokenizer.py
(another pre-tokenizer, extra tokens and merges)."""
import gguf
import numpy as np


def copy_gguf(src, dst, set_keys=(), extend_keys=None, extra_tensors=()):
    """Write src again to dst with every key and tensor, then: set_keys ((key, value, GGUFValueType)) replace
    a key's value or add the key; extend_keys ({key: values}) are appended to an array key's values;
    extra_tensors ((name, float32 array)) are added. src's data alignment is kept."""
    rd = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, rd.fields["general.architecture"].contents())  # writes general.architecture
    new = {key: (val, vt) for key, val, vt in set_keys}
    extend = extend_keys or {}
    for f in rd.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in new:
            continue
        vt = f.types[0]
        val = f.contents() + list(extend[f.name]) if f.name in extend else f.contents()
        w.add_key_value(f.name, val, vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for key, (val, vt) in new.items():
        w.add_key_value(key, val, vt)
    if "general.alignment" in rd.fields:
        w.data_alignment = rd.fields["general.alignment"].contents()
    for t in rd.tensors:  # block types as raw bytes (rows, row bytes), F32 as floats: numpy shape either way
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, data in extra_tensors:
        w.add_tensor(name, np.asarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
