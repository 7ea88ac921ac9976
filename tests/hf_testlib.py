"""Shared by tests/py_hf_*.py (under pytest): the pytest fixtures (the default model loaded by
transformers from the GGUF file the CLI uses, the wiki.test.raw slice and its token ids from the CLI)."""
import json
import os  # noqa: F401
import subprocess

from hf_skip import CLI, GGUF, MODEL_DIR, WIKI, missing  # noqa: F401  (hf_skip also sets E8KV_LIB, sys.path)

import pytest

if missing():
    pytest.skip(f"needs {missing()}", allow_module_level=True)

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import e8kv
import e8kv.hf  # noqa: F401

N_CTX, N_CHUNKS = 512, 2  # the perplexity slice: 2 chunks of 512 tokens, 510 scored
SLICE_BYTES = 30000       # the first bytes of wiki.test.raw (6908 tokens)


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def model():
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 8)))
    m = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=GGUF, dtype=torch.float32)
    m.eval()
    return m


@pytest.fixture(scope="session")
def tok():
    return AutoTokenizer.from_pretrained(MODEL_DIR, gguf_file=GGUF)


@pytest.fixture(scope="session")
def slice_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("wiki") / "slice.txt"
    with open(WIKI, "rb") as f:
        path.write_bytes(f.read(SLICE_BYTES))
    return str(path)


@pytest.fixture(scope="session")
def ids(slice_file):
    """The CLI's own token ids of the slice: both sides see exactly the same tokens."""
    out = subprocess.run([CLI, "tokenize", "-f", slice_file], capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


@pytest.fixture(scope="session")
def calib_py(model, ids, tmp_path_factory):
    """A calibration through transformers: 2 chunks of 512 tokens, no sensitivities."""
    path = str(tmp_path_factory.mktemp("cal") / "py.e8cal")
    e8kv.hf.calibrate(model, None, ids, path, n_ctx=N_CTX, n_chunks=2, sensitivity=False, progress=False)
    return path


def cli_json(*args):
    p = subprocess.run([CLI, *args, "--json"], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr
    return {d["spec"]: d for d in (json.loads(line) for line in p.stdout.splitlines() if line.startswith("{"))}


