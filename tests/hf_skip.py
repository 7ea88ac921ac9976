"""Paths and the skip rule of tests/py_hf_*.py, without importing anything heavy: ctest runs those files
as scripts, which exit 77 (skipped) through run_as_script when a dependency or the model is missing."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL_DIR = os.environ.get("E8KV_CACHE_DIR", os.path.expanduser("~/.cache/e8kv"))
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DATA = os.environ.get("E8KV_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
WIKI = os.path.join(DATA, "wikitext-2-raw", "wiki.test.raw")
CLI = os.environ.get("E8KV_CLI") or os.path.join(ROOT, "build", "e8kv")
if not os.environ.get("E8KV_LIB") and os.path.exists(os.path.join(ROOT, "build", "libe8kv.so")):
    os.environ["E8KV_LIB"] = os.path.join(ROOT, "build", "libe8kv.so")
sys.path.insert(0, os.path.join(ROOT, "python"))


def missing(model=True):
    """Why the tests cannot run, or None; model=False: tests of tiny random models (no GGUF, text or CLI)."""
    for mod in ["pytest", "numpy", "torch", "transformers"] + (["gguf", "accelerate"] if model else []):
        try:
            __import__(mod)
        except ImportError:
            return f"python module {mod} (pip install -r requirements-dev.txt)"
    if not model:
        return None
    for path, what in [(os.path.join(MODEL_DIR, GGUF), "the default model (scripts/fetch_model.sh)"),
                       (WIKI, "wiki.test.raw (../shared/data)"), (CLI, "the e8kv CLI (build it)")]:
        if not os.path.exists(path):
            return f"{what}: {path}"
    return None


def run_as_script(path, model=True):
    """ctest runs the files as scripts: skip (77) when something is missing, else run pytest on the file."""
    why = missing(model)
    if why:
        print(f"skip: needs {why}")
        return 77
    import pytest
    return pytest.main([os.path.abspath(path), "-q", "-rA", "-p", "no:cacheprovider"])
