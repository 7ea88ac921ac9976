#!/usr/bin/env bash
# Build and run the test suite. Usage: scripts/test.sh [--sanitize]
#   (default)    Release build in build/, all tests under ctest
#   --sanitize   AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/, tests labelled slow skipped
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
if [ "${1:-}" = "--sanitize" ]; then
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DE8KV_SANITIZE=ON -DCMAKE_C_COMPILER=clang
    cmake --build build-asan -j"$jobs"
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow
else
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
    cmake --build build -j"$jobs"
    ctest --test-dir build --output-on-failure -j"$jobs"
fi
