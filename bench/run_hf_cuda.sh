#!/usr/bin/env bash
# One device run of the Python/transformers GPU path: versions, test_cuda --quick, the pytest suite
# tests/py_hf_cuda.py, then bench/bench_hf_cuda.py. Lay out a folder as the repository is (python/e8kv,
# tests/py_hf_cuda.py with its helpers tests/hf_*.py and tests/e8kv_testlib.py, bench/bench_hf_cuda.py, this script) plus libe8kv.so, libe8kv_cuda.so (built with
# nvcc), libxxhash.so.0 and test_cuda at its top, and run it (bench/run_hf_cuda.sh) with OUT set to where the logs go.
# PARTS: which benchmark parts (main,fit,small,again; default main,fit,small), BENCH_ARGS: more arguments
# of bench_hf_cuda.py, QUICK=1: the 4-layer smoke benchmark, SKIP_TESTS=1 / SKIP_BENCH=1: the benchmark /
# the tests alone.
cd "$(dirname "$0")/.."
OUT=${OUT:-.}
export E8KV_LIB=$PWD/libe8kv.so LD_LIBRARY_PATH=$PWD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)" | tee -a $OUT/gpu.txt
if [ -z "$SKIP_TESTS" ]; then
  echo "== test_cuda --quick"; timeout 90 ./test_cuda --quick > $OUT/test_cuda.log 2>&1; echo "rc=$?"; grep -E "graph|checks|FAIL" $OUT/test_cuda.log | head -20
  echo "== pytest"; timeout ${PYTEST_TIMEOUT:-150} python3 -m pytest tests/py_hf_cuda.py -q -rA -s -p no:cacheprovider > $OUT/pytest.log 2>&1; echo "rc=$?"; grep -E "passed|failed|PASS|FAIL|Error|error|diff|agreement|accounted" $OUT/pytest.log | tail -30
fi
[ -n "$SKIP_BENCH" ] && exit 0
echo "== bench"; timeout ${BENCH_TIMEOUT:-200} python3 bench/bench_hf_cuda.py ${QUICK:+--quick} --json $OUT/bench_hf.jsonl ${PARTS:+--parts $PARTS} --budget ${BUDGET:-170} $BENCH_ARGS > $OUT/bench.log 2>&1; echo "rc=$?"; tail -25 $OUT/bench.log
