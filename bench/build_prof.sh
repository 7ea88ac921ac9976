#!/usr/bin/env bash
# bench_cuda_prof: bench_cuda with the phase stamps of attn_box_kernel (-DBOX_PROF: %globaltimer at entry,
# copies issued, query rotated, first tile, last tile, split stored, end; bench_cuda prints min/median/max of
# each phase per e8box:4 case). A measurement build, never the library's: cuda_attn.cu is rebuilt with the
# flag into a copy of the CMake build's libe8kv_cuda.a. Usage (after the CMake build of bench_cuda):
#   bench/build_prof.sh [BUILD_DIR=build]   → BUILD_DIR/bench_cuda_prof
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
ARCH=$(sed -n 's/^CUDA_FLAGS = .*\(--generate-code=[^ ]*\).*/\1/p' "$B/CMakeFiles/e8kv_cuda_objects.dir/flags.make")
F="-O3 -DNDEBUG $ARCH -std=c++17 -Iinclude -Isrc -DBOX_PROF -Xcompiler=-fPIC"
nvcc $F -c src/cuda/cuda_attn.cu -o "$T/cuda_attn.cu.o"
cp "$B/libe8kv_cuda.a" "$T/libe8kv_cuda.a"
(cd "$T" && ar r libe8kv_cuda.a cuda_attn.cu.o)
nvcc $F -c bench/bench_cuda.cu -o "$T/bench_cuda.o"
# the CMake link line of bench_cuda with the stamped library in place of the plain one
LIBS=$(sed "s#libe8kv_cuda.a#$T/libe8kv_cuda.a#; s#\(^\| \)libe8kv.a# $B/libe8kv.a#" "$B/CMakeFiles/bench_cuda.dir/linkLibs.rsp")
eval g++ "$T/bench_cuda.o" -o "$B/bench_cuda_prof" $LIBS -L/usr/local/cuda/targets/x86_64-linux/lib
echo "$B/bench_cuda_prof"
