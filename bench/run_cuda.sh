#!/usr/bin/env bash
# One device run: validate (test_cuda), benchmark (bench_cuda + PyTorch SDPA, joined into a table; 64-token
# pages; the phase stamps of the e8box:4 kernel when bench_cuda_prof is there; one ncu case per code format,
# with the warp stall reasons), then compute-sanitizer memcheck and racecheck on the quick test.
# Copy this script, build/test_cuda, build/bench_cuda, bench/bench_sdpa.py and bench/bench_cuda_table.py (and
# build/bench_cuda_prof from bench/build_prof.sh, optional) into one folder and run it there with OUT set to where
# the logs go (the device machine's $OUT; 7 files: test.log, run.log with every other log, bench_cuda.jsonl,
# encode.jsonl, bench64.jsonl, sdpa.jsonl, table.md). QUICK=1: small sizes only. CASES=SHAPE/BATCH/CTX,...: those
# cases only (every format, and SDPA); ENCODE=0: no encode timings; NCU=0: no ncu cases; SINK=N: the same cases
# again with sink=N (sink.jsonl; the sink rows' cost against the rows without, same run); CENTER0=1: the cases and
# the encode timings again with center=0 (center0.jsonl, encode_center0.jsonl: what centring costs, same run);
# NO64=1: not the 64-token-page cases.
# One case alone (e.g. under ncu):
# ./bench_cuda --only llama3-8b/e8box:4/8/32768
cd "$(dirname "$0")"
OUT=${OUT:-.}
LOG=$OUT/run.log
ONLY=
if [ -n "$CASES" ]; then
    for c in ${CASES//,/ }; do
        for f in e8box:4 bf16 e8p:2 e8box:3 k4v3; do ONLY=$ONLY${ONLY:+,}${c%%/*}/$f/${c#*/}; done
    done
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee $LOG
echo "== test_cuda"; timeout ${TEST_TIMEOUT:-120} ./test_cuda > $OUT/test.log 2>&1; echo "rc=$?"; tail -8 $OUT/test.log
echo "== bench" | tee -a $LOG; timeout 240 ./bench_cuda ${QUICK:+--quick} ${ONLY:+--only $ONLY} --json $OUT/bench_cuda.jsonl >> $LOG 2>&1; echo "rc=$?"
if [ -n "$SINK" ]; then
    echo "== bench, sink=$SINK" | tee -a $LOG; timeout 240 ./bench_cuda --sink $SINK ${QUICK:+--quick} ${ONLY:+--only $ONLY} --json $OUT/sink.jsonl >> $LOG 2>&1; echo "rc=$?"
fi
if [ -n "$CENTER0" ]; then
    echo "== bench, center=0" | tee -a $LOG; timeout 240 ./bench_cuda --suffix ,center=0 ${QUICK:+--quick} ${ONLY:+--only $ONLY} --json $OUT/center0.jsonl >> $LOG 2>&1; echo "rc=$?"
fi
if [ "${ENCODE:-1}" != 0 ]; then
    echo "== encode" | tee -a $LOG; timeout 60 ./bench_cuda --encode --json $OUT/encode.jsonl > $OUT/enc.tmp 2>&1; echo "rc=$?"; grep -v decode $OUT/enc.tmp; cat $OUT/enc.tmp >> $LOG; rm -f $OUT/enc.tmp
    if [ -n "$CENTER0" ]; then
        echo "== encode, center=0" | tee -a $LOG; timeout 60 ./bench_cuda --encode --suffix ,center=0 --json $OUT/encode_center0.jsonl > $OUT/enc.tmp 2>&1; echo "rc=$?"; grep -v decode $OUT/enc.tmp; cat $OUT/enc.tmp >> $LOG; rm -f $OUT/enc.tmp
    fi
fi
echo "== sdpa" | tee -a $LOG; timeout 150 env PYTHONUNBUFFERED=1 python3 bench_sdpa.py ${QUICK:+--quick} ${CASES:+--only $CASES} --json $OUT/sdpa.jsonl >> $LOG 2>&1; echo "rc=$?"
python3 bench_cuda_table.py $OUT/bench_cuda.jsonl $OUT/sdpa.jsonl | tee $OUT/table.md
[ -n "$NO64" ] || { echo "== 64-token pages" | tee -a $LOG; timeout 60 ./bench_cuda --block 64 --json $OUT/bench64.jsonl --only llama3-8b/e8box:4/1/32768,llama3-8b/e8box:4/1/131072,llama3-8b/e8box:4/8/32768,llama3-8b/e8box:4/8/131072,llama3-8b/e8box:4/32/32768,llama3-8b/e8box:4/32/131072,llama3-8b/e8p:2/1/131072,llama3-8b/e8p:2/8/32768,llama3-8b/e8p:2/32/32768 >> $LOG 2>&1; echo "rc=$?"; }
if [ -x ./bench_cuda_prof ]; then
    echo "== phase stamps (bench_cuda_prof)" | tee -a $LOG
    timeout 60 ./bench_cuda_prof --only llama3-8b/e8box:4/1/4096,llama3-8b/e8box:4/1/131072,llama3-8b/e8box:4/8/32768,llama3-8b/e8box:4/8/131072 2>&1 | grep -v "^device" | tee -a $LOG
fi
M=gpu__time_duration.sum
for s in long_scoreboard short_scoreboard wait barrier no_instruction math_pipe_throttle mio_throttle not_selected selected dispatch_stall branch_resolving membar; do
    M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
for c in llama3-8b/e8box:4/8/32768 llama3-8b/e8p:2/8/32768; do
    [ "${NCU:-1}" = 0 ] && break
    echo "== ncu $c" | tee -a $LOG
    timeout 60 ncu --clock-control none -k regex:attn_ -s 3 -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --metrics $M ./bench_cuda --only $c > $OUT/ncu.tmp 2>&1; echo "rc=$?"
    cat $OUT/ncu.tmp >> $LOG; grep -E "Duration|DRAM Throughput|Issue Slots Busy|Achieved Active Warps|Warp Cycles Per Issued|stalled_(long|wait|selected|short)" $OUT/ncu.tmp; rm -f $OUT/ncu.tmp
done
echo "== memcheck" | tee -a $LOG; timeout 90 compute-sanitizer --tool memcheck ./test_cuda --quick > $OUT/san.tmp 2>&1; echo "rc=$?"; tail -2 $OUT/san.tmp; cat $OUT/san.tmp >> $LOG
echo "== racecheck" | tee -a $LOG; timeout 90 compute-sanitizer --tool racecheck ./test_cuda --quick > $OUT/san.tmp 2>&1; echo "rc=$?"; tail -2 $OUT/san.tmp; cat $OUT/san.tmp >> $LOG; rm -f $OUT/san.tmp
