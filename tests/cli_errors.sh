#!/usr/bin/env bash
# Bad input to the e8kv CLI: every case must end with the expected exit status and, for errors, a message
# naming the error ("[bad argument]" ...); nothing may crash (the sanitizer build runs this script too).
# Usage: tests/cli_errors.sh [path/to/e8kv]   (default $E8KV_CLI); model cases skip without stories260K.
set -u
unset E8KV_CALIB
CLI=${1:-${E8KV_CLI:-}}
DATA=${E8KV_SHARED_DATA:-$(dirname "$0")/../data}
if [ -z "$CLI" ] || [ ! -x "$CLI" ]; then
    echo "skip: no e8kv CLI (pass its path or set E8KV_CLI)"
    exit 77
fi
M=$DATA/stories260K/stories260K.bin
TXT=$DATA/tinyshakespeare/input.txt
have_model=0
[ -f "$M" ] && [ -f "$TXT" ] && have_model=1
# a sanitizer's own exit status must not pass for an expected 1
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:exitcode=86"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
n=0

# expect STATUS 'PATTERN' ARGS...: run the CLI, check its exit status and that stdout+stderr contain
# PATTERN (a fixed string; '' for none)
expect() {
    local want=$1 pat=$2
    shift 2
    n=$((n + 1))
    "$CLI" "$@" >"$TMP/out" 2>&1
    local got=$?
    if grep -qE "Sanitizer|runtime error:" "$TMP/out"; then
        echo "FAIL: e8kv $* -> sanitizer report:"
        head -c 2000 "$TMP/out" | sed 's/^/    /'
        fails=$((fails + 1))
    elif [ "$got" != "$want" ]; then
        echo "FAIL: e8kv $* -> exit $got, want $want"
        head -c 600 "$TMP/out" | sed 's/^/    /'
        fails=$((fails + 1))
    elif [ -n "$pat" ] && ! grep -qF -- "$pat" "$TMP/out"; then
        echo "FAIL: e8kv $* -> no '$pat' in:"
        head -c 600 "$TMP/out" | sed 's/^/    /'
        fails=$((fails + 1))
    fi
}
BAD="[bad argument]"

# ---- strict numbers, every subcommand (checked before any file is read)
for v in 0 abc -5 512abc 513 "" " 64" 99999999999999999999999; do
    expect 2 "$BAD" ppl -f x --ctx "$v"
done
expect 2 "--ctx '-5'" ppl -f x --ctx -5
expect 2 "$BAD" ppl -f x --chunks -1
expect 2 "$BAD" ppl -f x --threads -3
expect 2 "$BAD" ppl -f x --threads 65
expect 2 "$BAD" ppl -f x --threads 1000
expect 2 "$BAD" ppl -f x --seed abc
expect 2 "$BAD" ppl -f x --seed -1
expect 2 "needs a value" ppl -f x --ctx
expect 2 "unknown option '--bogus'" ppl -f x --bogus
expect 2 "-f TEXT is required" ppl
expect 2 "$BAD" generate -p a --ctx 0
expect 2 "$BAD" generate -p a -n -1
expect 2 "$BAD" generate -p a -n 5x
expect 2 "$BAD" generate -p a --threads -3
expect 2 "$BAD" generate -p a --threads 100
expect 2 "$BAD" generate -p a --seed abc
expect 2 "$BAD" generate -p a --temp x
expect 2 "$BAD" generate -p a --temp -1
expect 2 "$BAD" generate -p a --top-p 0
expect 2 "$BAD" generate -p a --top-p 1.5
expect 2 "unknown option '--nope'" generate -p a --nope
expect 2 "$BAD" calibrate -f x --ctx 8
expect 2 "$BAD" calibrate -f x --chunks -1
expect 2 "$BAD" calibrate -f x --threads 65
expect 2 "$BAD" calibrate -f x --probe-chunks 0
expect 2 "$BAD" calibrate -f x --probe-sink -1
expect 2 "$BAD" tokenize -p a --vocab-size 0
expect 2 "$BAD" tokenize -p a --vocab-size 12x
expect 2 "unknown option '-q'" tokenize -p a -q
expect 2 "$BAD" compress a b --page 0
expect 2 "$BAD" compress a b --page -1
expect 2 "$BAD" compress a b --step 0
expect 2 "$BAD" compress a b --step -1
expect 2 "$BAD" compress a b --step nan
expect 2 "$BAD" compress a b --level 99
expect 2 "$BAD" compress a b --level 0
expect 2 "$BAD" compress a b --seed 1.5
expect 2 "$BAD" compress a b --method lz4
expect 2 "$BAD" compress a
expect 2 "unexpected argument 'c'" compress a b c
expect 2 "unknown option '--zz'" compress a b --zz
expect 2 "$BAD" decompress a
expect 2 "$BAD" info
expect 2 "$BAD" info a b
expect 2 "$BAD" bench attn --reps 0
expect 2 "$BAD" bench attn --reps 65
expect 2 "$BAD" bench attn --threads 0
expect 2 "$BAD" bench attn --threads 65
expect 2 "$BAD" bench attn --ctx 4096,x
expect 2 "$BAD" bench attn --shape nope
expect 2 "$BAD" bench codec --reps 0
expect 2 "$BAD" bench codec --n-vec -4
expect 2 "$BAD" bench entropy --reps 0
expect 2 "$BAD" bench entropy --page 0
expect 2 "$BAD" bench entropy --n-vec abc
expect 2 "unknown benchmark" bench nope

# ---- --help of every command exits 0 and prints its usage
for c in ppl generate calibrate tokenize compress decompress info "bench codec" "bench attn" "bench entropy"; do
    # shellcheck disable=SC2086
    expect 0 "usage: e8kv $c" $c --help
done
expect 0 "bench entropy" --help
expect 0 "usage: e8kv bench" bench --help
expect 2 "" bench
expect 2 "unknown command" nope

# ---- specs are never cut: one of 8191 characters (the library's limit) goes through unchanged, 8192 is
# a named error before anything runs
pad() { printf '%*s' "$1" '' | tr ' ' 0; }
C63="e8:$(pad 59)4" # a codec spec of 63 characters, the codec limit: e8:4
SPEC="e8:4"
for _ in $(seq 110); do SPEC="$SPEC,layers0-0=$C63"; done
SPEC="$SPEC,layers0-0=e8:$(pad 25)4,sink=2"
LONG="${SPEC%,sink=2},sink=22"
[ ${#SPEC} = 8191 ] && [ ${#LONG} = 8192 ] || { echo "FAIL: test specs of ${#SPEC}/${#LONG} characters"; fails=$((fails + 1)); }
expect 2 "the longest the library takes is 8191 [invalid format spec]" ppl -f x --kv "$LONG"
expect 2 "the longest the library takes is 8191 [invalid format spec]" ppl -f x --kv f16 --kv "$LONG"
expect 2 "the longest the library takes is 8191 [invalid format spec]" ppl -f x --kv-k "$LONG" --kv-v f16
expect 2 "the longest the library takes is 8191 [invalid format spec]" generate -p a --kv "$LONG"
expect 2 "the longest the library takes is 8191 [invalid format spec]" bench attn --kv "$LONG"
expect 0 "\"kv\":\"$SPEC\"" bench attn --kv "$SPEC" --ctx 64 --shape smollm2-135m --reps 1 --no-baseline --json
# a list is split by ';' (or repeated options), by ',' only where no part has '='; "f16,e8:4,sink=1" is
# not one spec (a codec only as the first item), so it is refused, not read as e8:4
expect 0 "\"kv\":\"e8:4,sink=1\"" bench attn --kv "f16;e8:4,sink=1" --ctx 64 --shape smollm2-135m --reps 1 --no-baseline --json
expect 2 "empty format" bench attn --kv "f16;" --ctx 64 --shape smollm2-135m
# codec specs: 63 characters work end to end, 64 are refused by name
if [ $have_model = 1 ]; then
    expect 0 "\"spec\":\"$SPEC\",\"available\":true" ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --threads 1 --kv "$SPEC" --json
    expect 0 "\"spec\":\"k=$C63,v=f16\",\"available\":true" ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --threads 1 --kv-k "$C63" --kv-v f16 --json
    expect 0 "--kv $SPEC: prompt" generate -m "$M" -p "Once" -n 4 --temp 0 --threads 1 --kv "$SPEC"
    expect 1 "unavailable: invalid format spec" ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --threads 1 --kv "f16,e8:4,sink=1"
    # the JSON stays JSON whatever the spec holds
    expect 1 '"spec":"a\"b\\c","available":false' ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --kv 'a"b\c' --json
    expect 1 "none of the 2 formats requested is available" ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --kv bogus --kv e8:99
fi

# ---- messages
if [ $have_model = 1 ]; then
    G=(generate -m "$M" --temp 0 --threads 1)
    # calibrated formats without a calibration point to e8kv calibrate / --calib
    expect 1 "run \`e8kv calibrate -f TEXT\`" ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --kv e8tv:4
    expect 1 "or pass --calib FILE" "${G[@]}" -p Once -n 2 --kv e8tv:4
    expect 1 "e8kv calibrate" "${G[@]}" -p Once -n 2 --kv "auto=e8tv:3,sink=1"
    # center=rope (the CUDA cache's default, on the CPU too: tests/test_cache.c) says what it needs: this
    # model's heads (head_dim 8) are too small for its 8 RoPE pairs, and it never goes with rope=pre
    expect 1 "head_dim >= 16" ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --kv "e8box:4,sink=4,center=rope"
    expect 1 "does not go with rope=pre" "${G[@]}" -p Once -n 2 --kv "e8:4,center=rope,rope=pre"
    # a bad probe fails before the covariance pass, with its name
    expect 2 "--probe 'bogus': invalid format spec" calibrate -m "$M" -f "$TXT" --probe bogus -o "$TMP/c.e8cal"
    expect 2 "--probe 'e8tv'" calibrate -m "$M" -f "$TXT" --probe e8tv -o "$TMP/c.e8cal"
    [ -e "$TMP/c.e8cal" ] && { echo "FAIL: calibrate --probe bogus wrote a file"; fails=$((fails + 1)); }
    # generate says when the context is full
    expect 0 "stopped after 5 of 50 tokens: the context of 8 tokens is full (--ctx)" "${G[@]}" -p "Once upon" -n 50 --ctx 8 --ignore-eos
    # a saved cache: info describes it; loading it with another --kv names the saved spec
    expect 0 "saved the cache" "${G[@]}" -p "Once upon a time" -n 2 --kv e8:4 --save-cache "$TMP/s.e8kc"
    expect 0 "e8kv saved cache v1, 5 layers x 4 KV heads, head_dim 8" info "$TMP/s.e8kc"
    expect 0 "generate --save-cache state, prompt of" info "$TMP/s.e8kc"
    expect 1 "was saved with the spec 'k=e8:4,v=e8:4" "${G[@]}" -n 2 --load-cache "$TMP/s.e8kc" --kv f16
    expect 0 "" "${G[@]}" -n 2 --load-cache "$TMP/s.e8kc"
    expect 2 "--load-cache goes with neither" "${G[@]}" -n 2 --load-cache "$TMP/s.e8kc" --save-cache "$TMP/t.e8kc"
    printf 'E8KCxxxx' >"$TMP/bad.e8kc"
    expect 1 "a saved cache, but" info "$TMP/bad.e8kc"
    expect 1 "not a K/V dump, frame, saved cache or calibration" info "$TXT"
    # tokenize --pieces escapes high bytes (UTF-8 pieces of a character) as \xNN
    expect 0 '\xc3' tokenize --llama2c-tokenizer "$DATA/stories260K/tok512.bin" -p "caf$(printf '\303\251')" --pieces
fi

echo "cli_errors: $n cases, $fails failed"
[ "$fails" = 0 ]
