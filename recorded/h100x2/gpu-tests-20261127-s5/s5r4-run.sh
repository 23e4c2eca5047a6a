#!/bin/bash
# lead, session 5 round s5r4 (2 GPUs visible, the whole machine): every `-m gpu` test outside p2p/ipc_direct
# (helper p2p7 runs those in its own slots), the ones never finished with 2 visible first, one pytest per test,
# timed, so a slow test loses only itself.
cd ../.. && export PYTHONPATH=/tmp/site:$PWD
{ date -u; nvidia-smi; nvidia-smi topo -m; } > $OUT_DIR/machine.txt 2>&1; cp .device/lead9/run.sh $OUT_DIR/s5r4-run.sh
T0=$(date +%s); BUDGET=${BUDGET:-215}
git log --oneline -1 > $OUT_DIR/tree.txt 2>&1; git status --short >> $OUT_DIR/tree.txt 2>&1
for t in tests/test_gpu.py::test_graph_gaps_one_gpu \
         tests/test_gpu.py::test_capture_and_doctor_name_the_planted_sync_on_gpus \
         tests/test_dataloader_sync.py \
         tests/test_gpu.py::test_nccl_rows_and_env_override tests/test_gpu.py::test_teardown_with_profiler_and_graph_is_bounded \
         tests/test_gpu.py::test_collectives_gpu_methods tests/test_gpu.py::test_graph_gaps_census_and_profile \
         tests/test_gpu.py::test_graph_gaps_replay_streams tests/test_gpu.py::test_collective_tracing_nccl_metadata \
         tests/test_gpu.py::test_dataloader_sync_one_gpu; do
  left=$(( BUDGET - ($(date +%s) - T0) - 5 ))
  [ $left -lt 20 ] && { echo "$t: not run (budget)" | tee -a $OUT_DIR/summary.txt; continue; }
  n=$(basename ${t//::/-})
  timeout -s INT -k 5 $left python3 -m pytest -m gpu -v -p no:cacheprovider -rA --tb=short --durations=3 $t \
    > $OUT_DIR/$n.txt 2>&1
  echo "$t rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/summary.txt
done
grep -hE "PASSED|FAILED|ERROR|SKIPPED" $OUT_DIR/*.txt | grep "::" | sort | uniq
