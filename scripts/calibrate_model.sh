#!/usr/bin/env bash
# Make the calibration of the default model once, check it on every later call, and print its path.
# The presets near-lossless, balanced and aggressive use calibrated formats when the model has one
# (README, "KV formats"); ppl and generate find it beside the model (MODEL.e8cal) or at $E8KV_CALIB.
#
# Text: Tiny Shakespeare (data/tinyshakespeare/input.txt), never the wikitext-2 text the README and
# BENCHMARKS.md evaluate on. Recipe: e8kv calibrate --ctx 512 --chunks 32 --threads 2, default probes:
# about 3 minutes on 2 idle cores for SmolLM2-135M; with a fixed thread count the same binary makes the
# same bytes. A stamp beside it (MODEL.e8cal.sha256) holds the recipe and the SHA-256 of the model, the
# text, the calibration and its .info; when any of them differs, or the binary cannot load the file, the
# calibration is made again (never used as it is). A calibration the user made from another text with
# `e8kv calibrate` (its .info says which) is kept as long as it loads.
# Usage: scripts/calibrate_model.sh [E8KV]   (default: $BUILD_DIR/e8kv, BUILD_DIR defaulting to build)
# Environment: E8KV_MODEL (a model other than the fetched default), E8KV_CALIB (where the calibration
# goes instead of MODEL.e8cal; ppl and generate read it from there too), E8KV_CACHE_DIR (fetch_model.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
e8kv="${1:-${BUILD_DIR:-build}/e8kv}"
if [ ! -x "$e8kv" ]; then
    echo "calibrate_model.sh: no e8kv binary at $e8kv (build it first: cmake --build build --target e8kv_cli)" >&2
    exit 1
fi
if [ -n "${E8KV_MODEL:-}" ]; then
    model=$E8KV_MODEL
else
    model=$(scripts/fetch_model.sh)
fi
cal="${E8KV_CALIB:-$model.e8cal}"
stamp="$cal.sha256"
text=data/tinyshakespeare/input.txt
args=(--ctx 512 --chunks 32 --threads 2)
recipe="e8kv calibrate -f $text ${args[*]} (recipe 1)"

# the stamp a calibration made by this recipe from these files has
expected() {
    echo "recipe=$recipe"
    echo "model=$(sha256sum "$model" | cut -d" " -f1)"
    echo "text=$(sha256sum "$text" | cut -d" " -f1)"
    echo "calibration=$(sha256sum "$cal" | cut -d" " -f1)"
    echo "info=$(sha256sum "$cal.info" | cut -d" " -f1)"
}

# a calibration the user made with e8kv calibrate from another text (it writes MODEL.e8cal by default) is
# theirs: kept while it loads, never replaced by this one
if [ -e "$cal" ] && [ -e "$cal.info" ] && ! grep -qxF "text=$text" "$cal.info" &&
    "$e8kv" calibrate -m "$model" --from "$cal" >/dev/null 2>&1; then
    echo "e8kv: keeping $cal, made by e8kv calibrate from $(sed -n 's/^text=//p' "$cal.info") (not this" \
        "script's Tiny Shakespeare recipe; remove it and its .info to get the default)" >&2
    echo "$cal"
    exit 0
fi
if [ -e "$cal" ] || [ -e "$stamp" ]; then
    why=""
    if [ ! -e "$cal" ] || [ ! -e "$cal.info" ] || [ ! -e "$stamp" ]; then
        why="a file of it is missing"
    elif ! expected | cmp -s - "$stamp"; then
        why="it does not match its stamp $stamp (another recipe, model or text, or a damaged file)"
    elif ! "$e8kv" calibrate -m "$model" --from "$cal" >/dev/null 2>&1; then
        why="$e8kv cannot load it"
    fi
    if [ -z "$why" ]; then
        echo "$cal"
        exit 0
    fi
    echo "e8kv: the calibration $cal is stale or damaged ($why): making it again" >&2
    rm -f "$cal" "$cal.info" "$stamp"
fi
echo "e8kv: calibrating $model on $text (once; about 3 minutes on 2 cores) ..." >&2
mkdir -p "$(dirname "$cal")"
"$e8kv" calibrate -m "$model" -f "$text" -o "$cal.part" "${args[@]}" >/dev/null
# the .info names the file by its checksum, not its path: both move as they are
mv "$cal.part.info" "$cal.info"
mv "$cal.part" "$cal"
expected >"$stamp.part"
mv "$stamp.part" "$stamp"
echo "$cal"
