#!/usr/bin/env bash
# The calibration a user gets without asking (scripts/calibrate_model.sh, presets, messages) and the
# diagnostics of e8kv calibrate, on the small stories260K model: the script makes the calibration once,
# reuses it while its stamp matches, makes it again (the same bytes) when it is damaged or its recipe
# changed; ppl says which calibration it uses and what the presets mean with it and without it;
# calibrate --from / --json / --check report the sensitivities and the rank check.
# Usage: tests/cli_calib.sh [path/to/e8kv]   (default $E8KV_CLI)
set -u
unset E8KV_CALIB E8KV_MODEL
CLI=${1:-${E8KV_CLI:-}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=${E8KV_SHARED_DATA:-$ROOT/data}
if [ -z "$CLI" ] || [ ! -x "$CLI" ]; then
    echo "skip: no e8kv CLI (pass its path or set E8KV_CLI)"
    exit 77
fi
M=$DATA/stories260K/stories260K.bin
TXT=$DATA/tinyshakespeare/input.txt
W=$DATA/wikitext-2-raw/wiki.test.raw
if [ ! -f "$M" ] || [ ! -f "$TXT" ] || [ ! -f "$W" ]; then
    echo "skip: no stories260K / Tiny Shakespeare / wikitext-2 in $DATA"
    exit 77
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:exitcode=86"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
# has FILE PATTERN: the file contains the fixed string
has() { grep -qF -- "$2" "$1" || { fail "no '$2' in $1:"; head -c 800 "$1" | sed 's/^/    /'; }; }
hasnt() { ! grep -qF -- "$2" "$1" || fail "'$2' in $1"; }

# ---- the script: made once, reused, made again when damaged or of another recipe
C=$TMP/s.e8cal
mk() { E8KV_MODEL=$M E8KV_CALIB=$C "$ROOT/scripts/calibrate_model.sh" "$CLI" >"$TMP/mk.out" 2>"$TMP/mk.err"; }
mk || fail "calibrate_model.sh failed: $(tail -3 "$TMP/mk.err")"
[ "$(cat "$TMP/mk.out")" = "$C" ] || fail "calibrate_model.sh printed '$(cat "$TMP/mk.out")', not $C"
has "$TMP/mk.err" "calibrating"
for f in "$C" "$C.info" "$C.sha256"; do [ -s "$f" ] || fail "no $f"; done
has "$C.info" "text=data/tinyshakespeare/input.txt"
cp "$C" "$TMP/first.e8cal"
mk || fail "calibrate_model.sh (second call) failed"
hasnt "$TMP/mk.err" "calibrating"
[ -s "$TMP/mk.err" ] && fail "the second call said something: $(cat "$TMP/mk.err")"
# one byte of the eigenvalues changed: the stamp no longer matches, the file is made again, identical
printf '\x55' | dd of="$C" bs=1 seek=100 conv=notrunc 2>/dev/null
mk || fail "calibrate_model.sh (after damage) failed"
has "$TMP/mk.err" "is stale or damaged"
cmp -s "$C" "$TMP/first.e8cal" || fail "the calibration made again differs from the first"
sed -i 's/^recipe=.*/recipe=older/' "$C.sha256"
mk || fail "calibrate_model.sh (another recipe) failed"
has "$TMP/mk.err" "does not match its stamp"
rm -f "$C.info"
mk || fail "calibrate_model.sh (no .info) failed"
has "$TMP/mk.err" "a file of it is missing"

# a calibration the user made from another text at the same place is kept, not replaced
"$CLI" calibrate -m "$M" -f "$W" --ctx 64 --chunks 4 --threads 1 --no-sensitivity -o "$TMP/u.e8cal" >/dev/null 2>&1 ||
    fail "calibrate -o u.e8cal"
E8KV_MODEL=$M E8KV_CALIB=$TMP/u.e8cal "$ROOT/scripts/calibrate_model.sh" "$CLI" >/dev/null 2>"$TMP/u.err" ||
    fail "calibrate_model.sh over the user's calibration"
has "$TMP/u.err" "keeping $TMP/u.e8cal, made by e8kv calibrate from $W"
has "$TMP/u.e8cal.info" "text=$W"

# ---- ppl: which calibration, what the presets mean
P=(ppl -m "$M" -f "$W" --ctx 64 --chunks 1 --threads 1)
E8KV_CALIB=$C "$CLI" "${P[@]}" --kv balanced --kv aggressive --json >"$TMP/p.out" 2>"$TMP/p.err" || fail "ppl with the calibration"
has "$TMP/p.err" "calibration $C (5 layers"
has "$TMP/p.err" "made from data/tinyshakespeare/input.txt, 32 chunks of 512 tokens, probes e8tv:2"
has "$TMP/p.err" "preset balanced = auto=e8tv:3.875,sink=1 (calibrated)"
has "$TMP/p.err" "(calibrated)"
has "$TMP/p.out" "\"calib\":\"$C\""
"$CLI" "${P[@]}" --kv balanced --json >"$TMP/n.out" 2>"$TMP/n.err" || fail "ppl without a calibration"
has "$TMP/n.err" "calibration: none"
has "$TMP/n.err" "preset balanced = e8:4,sink=1, the uncalibrated fallback: no calibration"
has "$TMP/n.out" '"calib":null'
# a calibration without sensitivities: near-lossless (e8tv) calibrated, balanced (auto=) falls back
"$CLI" calibrate -m "$M" -f "$TXT" --ctx 64 --chunks 4 --threads 1 --no-sensitivity -o "$TMP/ns.e8cal" >/dev/null 2>&1 ||
    fail "calibrate --no-sensitivity"
"$CLI" "${P[@]}" --calib "$TMP/ns.e8cal" --kv near-lossless --kv balanced >/dev/null 2>"$TMP/ns.err" || fail "ppl --calib ns"
has "$TMP/ns.err" "preset near-lossless = e8tv:5,sink=1 (calibrated)"
has "$TMP/ns.err" "preset balanced = e8:4,sink=1, the uncalibrated fallback: the calibration has no sensitivities"
# a damaged calibration at the default place is named and not used
cp -r "$DATA/stories260K" "$TMP/st" # the model with its tokenizer beside it
M2=$TMP/st/stories260K.bin
cp "$TMP/first.e8cal" "$M2.e8cal"
printf '\x55' | dd of="$M2.e8cal" bs=1 seek=100 conv=notrunc 2>/dev/null
"$CLI" ppl -m "$M2" -f "$W" --ctx 64 --chunks 1 --threads 1 --kv balanced >/dev/null 2>"$TMP/d.err" ||
    fail "ppl with a damaged default calibration"
has "$TMP/d.err" "calibration: none; ignoring the calibration $M2.e8cal: checksum mismatch"
has "$TMP/d.err" "the uncalibrated fallback: no calibration"
# an .info that belongs to another file is not believed
cp "$TMP/first.e8cal" "$M2.e8cal"
printf 'e8kv calibration info 1\nfile_xxh64=0000000000000000\ntext=elsewhere\n' >"$M2.e8cal.info"
"$CLI" ppl -m "$M2" -f "$W" --ctx 64 --chunks 1 --threads 1 --kv f16 >/dev/null 2>"$TMP/i.err" || fail "ppl (info)"
has "$TMP/i.err" "belongs to another file"
hasnt "$TMP/i.err" "elsewhere"

# ---- diagnostics
"$CLI" calibrate -m "$M" --from "$C" >"$TMP/r.out" 2>"$TMP/r.err" || fail "calibrate --from"
has "$TMP/r.out" "AM/GM of the layers' sensitivities (K + V): "
"$CLI" calibrate -m "$M" --from "$C" -f "$W" --ctx 128 --check --check-chunks 1 --threads 1 --json >"$TMP/j.out" \
    2>"$TMP/j.err" || fail "calibrate --check --json: $(tail -2 "$TMP/j.err")"
python3 - "$TMP/j.out" <<'PY' || fail "calibrate --check --json: bad report"
import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["n_layer"] == 5 and len(d["layers"]) == 5
for l in d["layers"]:
    assert abs(l["k_share"] - l["sens_k"] / (l["sens_k"] + l["sens_v"])) < 1e-4
s = [l["sens_k"] + l["sens_v"] for l in d["layers"]]
am, gm = sum(s) / 5, math.exp(sum(math.log(x) for x in s) / 5)
assert abs(d["am_gm_layers"] - am / gm) < 1e-3 * am / gm
c = d["check"]
assert len(c["allocations"]) == 9 and -1 <= c["spearman"] <= 1
names = [a["name"] for a in c["allocations"]]
assert names[:2] == ["uniform", "auto"]
for a in c["allocations"]:
    assert a["kld"] >= 0 and len(a["rates"]) == 10
    assert abs(sum(a["rates"]) / 10 - a["mean_rate"]) < 1e-3
# the predicted KLD is the sensitivities' model of the rates
for a in c["allocations"]:
    p = sum((d["layers"][i % 5]["sens_k"] if i < 5 else d["layers"][i % 5]["sens_v"]) * 4 ** -r
            for i, r in enumerate(a["rates"]))
    assert abs(p - a["predicted_kld"]) < 1e-4 * p, (p, a)
PY
"$CLI" calibrate -m "$M" --from "$C" --check >/dev/null 2>"$TMP/e.err"
[ $? = 2 ] || fail "calibrate --check without -f: not a usage error"
has "$TMP/e.err" "--check measures on -f TEXT"
"$CLI" calibrate -m "$M" --from "$C" -f "$W" --check --check-rate x >/dev/null 2>"$TMP/e.err"
[ $? = 2 ] || fail "--check-rate x: not a usage error"
"$CLI" calibrate -m "$M" --from "$TMP/none.e8cal" >/dev/null 2>"$TMP/e.err"
[ $? = 1 ] || fail "--from a missing file: not an error"
has "$TMP/e.err" "--from $TMP/none.e8cal"
"$CLI" calibrate -m "$M" --from "$TMP/ns.e8cal" -f "$W" --check >/dev/null 2>"$TMP/e.err"
[ $? = 1 ] || fail "--check without sensitivities: not an error"
has "$TMP/e.err" "--check needs sensitivities"

# ---- the default model, when scripts/test.sh (or the user) fetched and calibrated it: a plain
# `ppl --kv balanced` gets the calibrated spec
DM=${E8KV_CACHE_DIR:-$HOME/.cache/e8kv}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$DM" ] && [ -f "$DM.e8cal" ]; then
    "$CLI" ppl -f "$W" --ctx 64 --chunks 1 --threads 1 --kv balanced >/dev/null 2>"$TMP/dm.err" ||
        fail "ppl --kv balanced on the default model"
    has "$TMP/dm.err" "calibration $DM.e8cal"
    has "$TMP/dm.err" "made from data/tinyshakespeare/input.txt"
    has "$TMP/dm.err" "(calibrated)"
else
    echo "note: no calibrated default model ($DM.e8cal; scripts/calibrate_model.sh): its check skipped"
fi

if [ $fails -gt 0 ]; then
    echo "cli_calib: $fails failure(s)"
    exit 1
fi
echo "cli_calib: all passed"
