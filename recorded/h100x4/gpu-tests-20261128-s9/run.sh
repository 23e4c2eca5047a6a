#!/bin/bash
# lead, session 9 round s9r3 (was s8r1): every `-m gpu` test (make test-gpu) on main, one pytest per test, two
# streams side by side on the same machine: "4visible" (all four GPUs visible: the 2-rank tests use GPUs 0 and 1,
# the 4-stage pipeline all four) and "2visible" (CUDA_VISIBLE_DEVICES=2,3). BUDGET (s) for both.
cd ../.. && export PYTHONPATH=/tmp/site:$PWD
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'; } > $OUT_DIR/machine.txt 2>&1
cp .device/lead16/run.sh $OUT_DIR/run.sh
T0=$(date +%s); BUDGET=${BUDGET:-500}
git log --oneline -1 > $OUT_DIR/tree.txt 2>&1; git status --short >> $OUT_DIR/tree.txt 2>&1
P=tests/test_p2p_transports.py; G=tests/test_gpu.py; I=tests/test_ipc_direct.py
FIRST="$P::test_gpu_pipeline_same_numbers_over_every_transport[2] $G::test_capture_and_doctor_name_the_planted_sync_on_gpus
 $P::test_gpu_transports_keep_data_intact $I::test_gpu_many_messages_both_ways_keep_their_data $P::test_gpu_private_torch_calls_exist"
REST=$(python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::' | grep -v -e 'transport\[' -e capture_and_doctor -e keep_data_intact -e many_messages_both -e private_torch)
T4="$P::test_gpu_pipeline_same_numbers_over_every_transport[4] $FIRST $REST"
T2="$FIRST $REST"
stream() {  # stream NAME VISIBLE TESTS...
  local name=$1 vis=$2 t n left s rc; shift 2
  for t in "$@"; do
    left=$(( BUDGET - ($(date +%s) - T0) - 3 ))
    [ $left -lt 15 ] && { echo "$name $t: not run (budget)" | tee -a $OUT_DIR/summary.txt; continue; }
    n=$name-$(basename "${t//::/-}"); n=${n//[\[\]]/_}
    s=$(date +%s)
    CUDA_VISIBLE_DEVICES=$vis timeout -s INT -k 5 $(( left < 150 ? left : 150 )) python3 -m pytest -m gpu -v -p no:cacheprovider -rA \
      --tb=short --durations=3 "$t" > $OUT_DIR/$n.txt 2>&1
    rc=$?
    echo "$name $t rc=$rc in $(( $(date +%s) - s ))s at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/summary.txt
  done
}
stream 4visible 0,1,2,3 $T4 &
stream 2visible 2,3 $T2 &
wait
grep -hE "PASSED|FAILED|ERROR|SKIPPED|XFAIL" $OUT_DIR/*visible-*.txt | grep "::" | sort | uniq -c | sort -rn | head -40
