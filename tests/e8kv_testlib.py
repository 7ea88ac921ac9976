"""Helpers shared by the Python reference checks (tests/py_*.py)."""
import ctypes
import os
import sys


def load_library(path):
    """Load the e8kv shared library. A sanitizer build cannot be dlopen'ed into an uninstrumented python:
    then re-exec the calling script once with clang's ASan runtime preloaded (leak checks off: the
    interpreter itself is not instrumented), or skip (exit 77) when there is no runtime to preload."""
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        if "asan" not in str(e).lower() or os.environ.get("E8KV_PY_PRELOADED"):
            raise
    import subprocess
    try:
        rt = subprocess.run(["clang", "-print-file-name=libclang_rt.asan-x86_64.so"], capture_output=True,
                            text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        rt = ""
    if not os.path.isabs(rt) or not os.path.exists(rt):
        print("sanitizer build of the library and no ASan runtime to preload: skipped")
        sys.exit(77)
    env = dict(os.environ, LD_PRELOAD=rt, E8KV_PY_PRELOADED="1",
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
