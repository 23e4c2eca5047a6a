#!/bin/bash
# lead, session 6 round s6r4: the two tests s6r2/s6r3 did not reach with 2 visible (GPUs 0,1). Written from s6r3 (4x H100): the `-m gpu` tests round s6r2 did not reach, one pytest per test, two
# streams side by side on the same machine: "4visible" (all four GPUs visible: the 2-rank tests use GPUs 0 and 1,
# the 4-stage pipeline all four) and "2visible" (CUDA_VISIBLE_DEVICES=2,3). BUDGET (s) for both.
cd ../.. && export PYTHONPATH=/tmp/site:$PWD
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'; } > $OUT_DIR/machine.txt 2>&1
cp .device/lead13/run.sh $OUT_DIR/run.sh
T0=$(date +%s); BUDGET=${BUDGET:-45}
git log --oneline -1 > $OUT_DIR/tree.txt 2>&1; git status --short >> $OUT_DIR/tree.txt 2>&1
I=tests/test_ipc_direct.py; P=tests/test_p2p_transports.py; G=tests/test_gpu.py
T4="$P::test_gpu_pipeline_same_numbers_over_every_transport[4] $I::test_gpu_late_receiver_does_not_block_isend
 $I::test_gpu_receiver_runs_nothing_on_its_gpu $I::test_gpu_size_mismatch_is_one_error_on_both_ranks
 $P::test_gpu_private_torch_calls_exist $P::test_gpu_transports_keep_data_intact
 $P::test_gpu_pipeline_same_numbers_over_every_transport[2]"
T2="$G::test_dataloader_sync_one_gpu $G::test_graph_gaps_one_gpu $G::test_collective_tracing_nccl_metadata
 $G::test_graph_gaps_replay_streams $G::test_graph_gaps_census_and_profile $G::test_collectives_gpu_methods
 $G::test_teardown_with_profiler_and_graph_is_bounded $G::test_nccl_rows_and_env_override
 tests/test_dataloader_sync.py::test_timed_steps_never_wait_for_the_gpu"
stream() {  # stream NAME VISIBLE TESTS...
  local name=$1 vis=$2 t n left s rc; shift 2
  for t in "$@"; do
    left=$(( BUDGET - ($(date +%s) - T0) - 3 ))
    [ $left -lt 15 ] && { echo "$name $t: not run (budget)" | tee -a $OUT_DIR/summary.txt; continue; }
    n=$name-$(basename "${t//::/-}"); n=${n//[\[\]]/_}
    s=$(date +%s)
    CUDA_VISIBLE_DEVICES=$vis timeout -s INT -k 5 $left python3 -m pytest -m gpu -v -p no:cacheprovider -rA \
      --tb=short --durations=3 "$t" > $OUT_DIR/$n.txt 2>&1
    rc=$?
    echo "$name $t rc=$rc in $(( $(date +%s) - s ))s at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/summary.txt
  done
}
stream 2visible 0,1 $G::test_nccl_rows_and_env_override tests/test_dataloader_sync.py::test_timed_steps_never_wait_for_the_gpu
grep -hE "PASSED|FAILED|ERROR|SKIPPED|XFAIL" $OUT_DIR/*visible-*.txt | grep "::" | sort | uniq -c | sort -rn | head -40
