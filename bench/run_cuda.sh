#!/usr/bin/env bash
# One device run: validate (test_cuda), benchmark (bench_cuda + PyTorch SDPA, joined into a table), then
# compute-sanitizer memcheck and racecheck on the quick test. Copy this script, build/test_cuda,
# build/bench_cuda, bench/bench_sdpa.py and bench/bench_cuda_table.py into one folder and run it there with
# OUT set to where the logs go (the device machine's $OUT). QUICK=1: small sizes only.
cd "$(dirname "$0")"
OUT=${OUT:-.}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
echo "== test_cuda"; timeout 90 ./test_cuda 2>&1 | tee $OUT/test.log | tail -40
echo "== bench"; timeout 170 ./bench_cuda ${QUICK:+--quick} --json $OUT/bench_cuda.jsonl 2>&1 | tee $OUT/bench.log
echo "== sdpa"; timeout 130 env PYTHONUNBUFFERED=1 python3 bench_sdpa.py ${QUICK:+--quick} --json $OUT/sdpa.jsonl 2>&1 | tail -20
python3 bench_cuda_table.py $OUT/bench_cuda.jsonl $OUT/sdpa.jsonl | tee $OUT/table.md
echo "== memcheck"; timeout 80 compute-sanitizer --tool memcheck ./test_cuda --quick > $OUT/memcheck.log 2>&1; echo "rc=$?"; tail -4 $OUT/memcheck.log
echo "== racecheck"; timeout 80 compute-sanitizer --tool racecheck ./test_cuda --quick > $OUT/racecheck.log 2>&1; echo "rc=$?"; tail -4 $OUT/racecheck.log
