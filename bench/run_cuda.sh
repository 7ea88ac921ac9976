#!/usr/bin/env bash
# One device run: validate (test_cuda), benchmark (bench_cuda + PyTorch SDPA, joined into a table), then
# compute-sanitizer memcheck and racecheck on the quick test. Copy this script, build/test_cuda,
# build/bench_cuda, bench/bench_sdpa.py and bench/bench_cuda_table.py into one folder and run it there with
# OUT set to where the logs go (the device machine's $OUT). QUICK=1: small sizes only.
# One case alone (e.g. under ncu): ./bench_cuda --only llama3-8b/e8box:4/8/32768
cd "$(dirname "$0")"
OUT=${OUT:-.}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
echo "== test_cuda"; timeout 120 ./test_cuda > $OUT/test.log 2>&1; echo "rc=$?"; tail -8 $OUT/test.log
echo "== bench"; timeout 240 ./bench_cuda ${QUICK:+--quick} --json $OUT/bench_cuda.jsonl > $OUT/bench.log 2>&1; echo "rc=$?"
echo "== encode"; timeout 60 ./bench_cuda --encode --json $OUT/encode.jsonl > $OUT/encode.log 2>&1; echo "rc=$?"; grep -v decode $OUT/encode.log
echo "== sdpa"; timeout 150 env PYTHONUNBUFFERED=1 python3 bench_sdpa.py ${QUICK:+--quick} --json $OUT/sdpa.jsonl > $OUT/sdpa.log 2>&1; echo "rc=$?"
python3 bench_cuda_table.py $OUT/bench_cuda.jsonl $OUT/sdpa.jsonl | tee $OUT/table.md
echo "== 64-token pages"; timeout 60 ./bench_cuda --block 64 --json $OUT/bench64.jsonl --only llama3-8b/e8box:4/1/32768,llama3-8b/e8box:4/1/131072,llama3-8b/e8box:4/8/32768,llama3-8b/e8box:4/8/131072,llama3-8b/e8box:4/32/32768,llama3-8b/e8box:4/32/131072 > $OUT/bench64.log 2>&1; echo "rc=$?"
echo "== memcheck"; timeout 90 compute-sanitizer --tool memcheck ./test_cuda --quick > $OUT/memcheck.log 2>&1; echo "rc=$?"; tail -2 $OUT/memcheck.log
echo "== racecheck"; timeout 90 compute-sanitizer --tool racecheck ./test_cuda --quick > $OUT/racecheck.log 2>&1; echo "rc=$?"; tail -2 $OUT/racecheck.log
