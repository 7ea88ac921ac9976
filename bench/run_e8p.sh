#!/usr/bin/env bash
# e8p:2 kernel variants in one device call: each validated (test_cuda --quick), then timed on the bar's cases (bench_cuda
# --only, queued median of 30), PyTorch SDPA on the same cases, and an ncu stall breakdown of one variant.
# Copy build/test_cuda and build/bench_cuda of each variant as test_cuda.V / bench_cuda.V (V: a name) with this
# script and bench/bench_sdpa.py into one folder and run it there with OUT set. VARIANTS="V ...": the variants;
# FULL="V ...": those get the full test_cuda (else --quick); SAN="V ...": memcheck + racecheck on test_cuda --quick;
# NCU="V ...": an ncu stall breakdown of 8 x 32K; NCU_SRC=V: its per-instruction stall samples (src.csv.gz);
# CASES / CASES2: bench_cuda --only cases of pass 1 / pass 2; SDPA_CASES: bench_sdpa.py --only cases.
cd "$(dirname "$0")"
OUT=${OUT:-.}
LOG=$OUT/run.log
CASES=${CASES:-llama3-8b/e8p:2/8/32768,llama3-8b/e8p:2/1/131072,llama3-8b/e8p:2/32/32768,smollm2/e8p:2/8/32768}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee $LOG
for v in $VARIANTS; do
    echo "== test $v" | tee -a $LOG
    q=--quick; case " $FULL " in *" $v "*) q=;; esac
    timeout 120 ./test_cuda.$v $q > $OUT/t.tmp 2>&1; echo "rc=$? $q" | tee -a $LOG; tail -2 $OUT/t.tmp | tee -a $LOG
    grep -i "fail\|e8p" $OUT/t.tmp | grep -v " 0 failed" | tail -6 | tee -a $LOG; rm -f $OUT/t.tmp
done
for pass in 1 2; do
    for v in $VARIANTS; do
        echo "== bench $v pass $pass" >> $LOG
        c=$CASES; [ $pass = 2 ] && c=${CASES2:-$CASES}
        timeout 90 ./bench_cuda.$v --only $c --json $OUT/b.tmp >> $LOG 2>&1
        sed "s/^{/{\"variant\":\"$v\",\"pass\":$pass,/" $OUT/b.tmp >> $OUT/bench.jsonl; rm -f $OUT/b.tmp
    done
done
echo "== sdpa" >> $LOG
timeout 60 python3 bench_sdpa.py --only ${SDPA_CASES:-llama3-8b/8/32768,llama3-8b/1/131072,llama3-8b/32/32768,smollm2/8/32768} --json $OUT/sdpa.jsonl >> $LOG 2>&1
for v in $NCU; do
    echo "== ncu $v" >> $LOG
    timeout 90 ncu --clock-control none -k regex:attn_e8p -s 3 -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,smsp__inst_executed.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_op_shared_ld.sum \
        ./bench_cuda.$v --only llama3-8b/e8p:2/8/32768 > $OUT/ncu_$v.txt 2>&1; echo "ncu rc=$?" >> $LOG
done
if [ -n "$NCU_SRC" ]; then
    timeout 90 ncu --clock-control none -k regex:attn_e8p -s 3 -c 1 --section SourceCounters --page source --print-source sass --csv \
        ./bench_cuda.$NCU_SRC --only llama3-8b/e8p:2/8/32768 > $OUT/src.csv 2>&1; echo "ncu src rc=$?" >> $LOG
    gzip -f $OUT/src.csv
fi
for v in $SAN; do
    for tool in memcheck racecheck; do
        echo "== $tool $v" | tee -a $LOG
        timeout 120 compute-sanitizer --tool $tool ./test_cuda.$v --quick > $OUT/san.tmp 2>&1; echo "rc=$?" | tee -a $LOG
        tail -3 $OUT/san.tmp | tee -a $LOG; rm -f $OUT/san.tmp
    done
done
python3 - $OUT/bench.jsonl $OUT/sdpa.jsonl <<'PY' | tee $OUT/table.md
import json, sys, collections
rows = [r for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip()) if r.get("bench") == "e8kv_cuda"]
sd = {}
try:
    for l in open(sys.argv[2]):
        r = json.loads(l); sd[(r["shape"], r["batch"], r["ctx"])] = r["us"]
except OSError:
    pass
t = collections.defaultdict(dict)
for r in rows:
    k = (r.get("shape"), r.get("batch"), r.get("ctx"))
    t[k].setdefault(r["variant"], []).append(r.get("us"))
for k, vs in t.items():
    s = sd.get(k)
    print(k, "sdpa", s, " ".join(f"{v}: " + "/".join(f"{u:.1f}" for u in us) + (f" ({s / min(us):.2f}x)" if s else "") for v, us in vs.items()))
PY
