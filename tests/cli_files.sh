#!/usr/bin/env bash
# The CLI's files end to end on stories260K: ppl --dump-kv -> compress -> info -> decompress (bit-exact with
# a lossless codec), saved caches, calibrations; and data safety: a write that fails (RLIMIT_FSIZE via
# `ulimit -f`) leaves the old file intact and no temporary behind, and compress/decompress refuse to
# overwrite their input (also through symbolic and hard links).
# Usage: tests/cli_files.sh [path/to/e8kv]   (default $E8KV_CLI); skips (77) without the CLI or the model.
set -u
CLI=${1:-${E8KV_CLI:-}}
DATA=${E8KV_SHARED_DATA:-$(dirname "$0")/../data}
M=$DATA/stories260K/stories260K.bin
TXT=$DATA/tinyshakespeare/input.txt
if [ -z "$CLI" ] || [ ! -x "$CLI" ] || [ ! -f "$M" ] || [ ! -f "$TXT" ]; then
    echo "skip: needs the e8kv CLI and stories260K"
    exit 77
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:exitcode=86"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
n=0
fail() {
    echo "FAIL: $*"
    sed 's/^/    /' "$TMP/log" | head -c 1500
    fails=$((fails + 1))
}
# run STATUS ARGS...: the CLI must exit with STATUS and no sanitizer report
run() {
    local want=$1
    shift
    n=$((n + 1))
    "$CLI" "$@" >"$TMP/log" 2>&1
    local got=$?
    if grep -qE "Sanitizer|runtime error:" "$TMP/log"; then fail "e8kv $*: sanitizer report"
    elif [ "$got" != "$want" ]; then fail "e8kv $*: exit $got, want $want"; fi
}
has() { grep -qF -- "$1" "$TMP/log" || fail "no '$1' in the output of the last command"; }
# limited STATUS ARGS...: as run, with files limited to 8 KiB (SIGXFSZ ignored: writes fail with EFBIG)
limited() {
    local want=$1
    shift
    n=$((n + 1))
    (ulimit -f 8; trap '' XFSZ; exec "$CLI" "$@") >"$TMP/log" 2>&1
    local got=$?
    [ "$got" = "$want" ] || fail "e8kv $* under ulimit -f 8: exit $got, want $want"
}
# intact FILE COPY: FILE still equals COPY and no temporary file is left beside it
intact() {
    n=$((n + 1))
    cmp -s "$1" "$2" || fail "$1 was changed by a failed or refused write"
    local left
    left=$(find "$(dirname "$1")" -name "$(basename "$1").tmp*" | head -1)
    [ -z "$left" ] || fail "temporary file $left left behind"
}
cd "$TMP" || exit 1
old() { head -c 20000 /dev/urandom >"$1"; cp "$1" "$1.orig"; }

# ---- a dump, its frames and back
run 0 ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --threads 1 --dump-kv d.kvd
run 0 info d.kvd
has "K/V dump v1, 2560 vectors x head_dim 8"
for args in "--codec f32 --method stored" "--codec f32 --method rans --delta" "--codec f32 --method zstd --level 19"; do
    # shellcheck disable=SC2086
    run 0 compress d.kvd f.e8f $args
    run 0 info f.e8f
    has "e8kv frame v"
    run 0 decompress f.e8f back.kvd
    cmp -s d.kvd back.kvd || fail "compress $args / decompress is not bit-exact"
done
for args in "--codec e8:4" "--codec e8:2 --page 7" "--step 0.25" "--step 0.5 --method zstd"; do
    # shellcheck disable=SC2086
    run 0 compress d.kvd f.e8f $args
    run 0 decompress f.e8f back.kvd
    run 0 info back.kvd
    has "2560 vectors x head_dim 8"
    [ "$(stat -c %s back.kvd)" = "$(stat -c %s d.kvd)" ] || fail "compress $args: size differs after decompress"
done
# a codec spec of 63 characters (the codec limit) travels in the frame's meta and back; 64 is refused by name
C63="e8:$(printf '%59s' '' | tr ' ' 0)4"
run 0 compress d.kvd f.e8f --codec "$C63"
run 0 info f.e8f
has "spec=$C63;"
run 0 decompress f.e8f back.kvd
run 0 compress d.kvd f4.e8f --codec e8:4
run 0 decompress f4.e8f back4.kvd
cmp -s back.kvd back4.kvd || fail "--codec $C63 decodes differently from e8:4"
run 1 compress d.kvd f.e8f --codec "e8:0${C63#e8:}"
has "invalid format spec"
run 1 info "$M"
run 1 decompress d.kvd x.kvd
run 1 compress f.e8f x.e8f

# ---- never the input as output
cp d.kvd same.kvd
ln -s same.kvd link.kvd
ln same.kvd hard.kvd
for out in same.kvd link.kvd hard.kvd "$TMP/./same.kvd"; do
    run 2 compress same.kvd "$out"
    has "same file"
    intact same.kvd d.kvd
done
run 0 compress d.kvd g.e8f --codec f32
cp g.e8f g.e8f.orig
ln -s g.e8f glink.e8f
run 2 decompress g.e8f glink.e8f
intact g.e8f g.e8f.orig

# ---- failed writes keep the old file: compress, decompress, --dump-kv, --dump-logits, --save-cache,
# calibrate -o
old out.e8f
limited 1 compress d.kvd out.e8f --codec f32 --method stored
intact out.e8f out.e8f.orig
old out.kvd
limited 1 decompress g.e8f out.kvd
intact out.kvd out.kvd.orig
old dump.kvd
limited 1 ppl -m "$M" -f "$TXT" --ctx 64 --chunks 1 --threads 1 --dump-kv dump.kvd
intact dump.kvd dump.kvd.orig
old logits.f32
limited 1 generate -m "$M" -p "Once upon a time" -n 1 --threads 1 --dump-logits logits.f32
intact logits.f32 logits.f32.orig
old saved.e8kc
limited 1 generate -m "$M" -p "Once upon a time there was a girl who liked to play in the park" -n 1 --ctx 512 \
    --threads 1 --kv f32 --save-cache saved.e8kc
intact saved.e8kc saved.e8kc.orig
old cal.e8cal
limited 1 calibrate -m "$M" -f "$TXT" --ctx 64 --chunks 40 --threads 1 --no-sensitivity -o cal.e8cal
intact cal.e8cal cal.e8cal.orig
# and the same writes succeed without the limit, through a symbolic link too (the link stays a link)
ln -s out.e8f olink.e8f
run 0 compress d.kvd olink.e8f --codec f32 --method stored
[ -L olink.e8f ] || fail "writing through a symbolic link replaced the link"
run 0 decompress out.e8f out.kvd
cmp -s out.kvd d.kvd || fail "compress through a link / decompress is not bit-exact"
run 0 calibrate -m "$M" -f "$TXT" --ctx 64 --chunks 4 --threads 1 --no-sensitivity -o cal.e8cal
n_left=$(find . -name "*.tmp.*" | wc -l)
[ "$n_left" = 0 ] || fail "$n_left temporary files left"

echo "cli_files: $n checks, $fails failed"
[ "$fails" = 0 ]
