#!/bin/bash
# lead, session 6 round s6r2 (4x H100): every `-m gpu` test of main's tree as sent, one pytest per test, timed, so
# a slow test loses only itself. Stream 1: all GPUs visible (LEAD_VIS4, default 0,1,2,3); stream 2: 2 visible
# (CUDA_VISIBLE_DEVICES=0,1), run after stream 1. BUDGET (s) for both; STREAM2_FROM: the second stream starts
# no later than this many seconds in (what stream 1 has not reached by then is listed as not run).
cd ../.. && export PYTHONPATH=/tmp/site:$PWD
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'; } > $OUT_DIR/machine.txt 2>&1
cp .device/lead11/run.sh $OUT_DIR/run.sh
T0=$(date +%s); BUDGET=${BUDGET:-520}; S2=${STREAM2_FROM:-290}
git log --oneline -1 > $OUT_DIR/tree.txt 2>&1; git status --short >> $OUT_DIR/tree.txt 2>&1
TESTS=${LEAD_TESTS:-$(python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::')}
echo "$TESTS" > $OUT_DIR/tests.txt
stream() {  # stream NAME VISIBLE UNTIL_S TESTS...
  local name=$1 vis=$2 until=$3 t n left; shift 3
  for t in "$@"; do
    left=$(( until - ($(date +%s) - T0) - 3 ))
    [ $left -lt 15 ] && { echo "$name $t: not run (budget)" | tee -a $OUT_DIR/summary.txt; continue; }
    n=$name-$(basename "${t//::/-}"); n=${n//[\[\]]/_}
    local s=$(date +%s)
    CUDA_VISIBLE_DEVICES=$vis timeout -s INT -k 5 $left python3 -m pytest -m gpu -v -p no:cacheprovider -rA \
      --tb=short --durations=3 "$t" > $OUT_DIR/$n.txt 2>&1
    local rc=$?
    echo "$name $t rc=$rc in $(( $(date +%s) - s ))s at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/summary.txt
    for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do kill -9 $p 2>/dev/null; done
  done
}
# the 2-visible stream runs the list backwards (p2p, ipc_direct, then test_gpu.py last to first), so what a short
# budget leaves out differs from the 4-visible stream
stream 4visible ${LEAD_VIS4:-0,1,2,3} $S2 $TESTS
stream 2visible 0,1 $BUDGET $(echo $TESTS | tr " " "\n" | tac)
grep -hE "PASSED|FAILED|ERROR|SKIPPED|XFAIL" $OUT_DIR/*visible-*.txt | grep "::" | sort | uniq -c | sort -rn | head -60
