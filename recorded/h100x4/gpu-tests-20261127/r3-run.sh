#!/bin/bash
# lead, session 2 round 3 (4 GPUs visible): the two dataloader_sync GPU tests that passed 60 s in round 2, given
# time (no per-test limit below 140 s), timed.
cd ../.. && export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
for t in tests/test_dataloader_sync.py::test_timed_steps_never_wait_for_the_gpu tests/test_gpu.py::test_dataloader_sync_one_gpu; do
  n=${t##*::}
  timeout -k 5 150 python3 -m pytest -m gpu -v -p no:cacheprovider -rA --tb=short --timeout=140 --durations=5 $t \
    > $OUT_DIR/$n.txt 2>&1
  echo "$n rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/$n.txt
done
# the p2p GPU tests with only 2 GPUs visible (round 2 ran them with 4)
CUDA_VISIBLE_DEVICES=0,1 timeout -k 5 100 python3 -m pytest -m gpu -v -p no:cacheprovider -rA --tb=short --timeout=80 \
  tests/test_p2p_transports.py tests/test_ipc_direct.py > $OUT_DIR/pytest-p2p-2.txt 2>&1
echo "p2p-2 rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/pytest-p2p-2.txt
# test_gpu.py with only 2 GPUs visible, in what time is left
CUDA_VISIBLE_DEVICES=0,1 timeout -k 5 $(( 465 - ($(date +%s) - T0) )) python3 -m pytest -m gpu -v -p no:cacheprovider -rA --tb=short \
  --timeout=90 tests/test_gpu.py > $OUT_DIR/pytest-gpu-2.txt 2>&1
echo "gpu-2 rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/pytest-gpu-2.txt
grep -E "PASSED|FAILED|ERROR" $OUT_DIR/pytest-gpu-2.txt | tail -12
