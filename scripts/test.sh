#!/usr/bin/env bash
# Build and run the test suite; on a fresh Debian/Ubuntu machine the only command needed (scripts/setup.sh
# installs what is missing first, scripts/fetch_model.sh fetches the default model once for the checks
# against the real model, which skip with a message if it cannot be had).
# Usage: scripts/test.sh [--sanitize]
#   (default)    Release build in build/, all tests under ctest
#   --sanitize   AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/, tests labelled slow skipped
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "" | --sanitize) ;;
    *)
        echo "usage: scripts/test.sh [--sanitize]" >&2
        exit 2
        ;;
esac
scripts/setup.sh "$@"
scripts/fetch_model.sh >/dev/null || echo "test.sh: default model not fetched: the tests that need it will skip" >&2
jobs=$(nproc 2>/dev/null || echo 2)
# ctest runs the Python checks with the interpreter setup.sh installed their packages for
python=()
py=$(command -v python3 || true)
[ -z "$py" ] || python=(-DPython3_EXECUTABLE="$py")
if [ "${1:-}" = "--sanitize" ]; then
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DE8KV_SANITIZE=ON -DCMAKE_C_COMPILER=clang \
        "${python[@]}"
    cmake --build build-asan -j"$jobs"
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow
else
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${python[@]}"
    cmake --build build -j"$jobs"
    # the default model's calibration, made once (~3 min) as a user's first run makes it
    scripts/calibrate_model.sh build/e8kv >/dev/null ||
        echo "test.sh: default model not calibrated: the checks that need it will skip" >&2
    ctest --test-dir build --output-on-failure -j"$jobs"
fi
