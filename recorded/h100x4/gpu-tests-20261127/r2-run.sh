#!/bin/bash
# lead, session 2 round 2 (4 GPUs visible): the three GPU tests that failed or hung in round 1, each in its own
# pytest with its traceback and output (-s); then the GPU tests round 1 never reached.
cd ../.. && export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
for t in tests/test_dataloader_sync.py::test_timed_steps_never_wait_for_the_gpu \
         tests/test_gpu.py::test_graph_gaps_one_gpu tests/test_gpu.py::test_dataloader_sync_one_gpu; do
  n=${t##*::}
  timeout -k 5 70 python3 -m pytest -m gpu -v -s -p no:cacheprovider -rA --tb=long --timeout=60 $t \
    > $OUT_DIR/$n.txt 2>&1
  echo "$n rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/$n.txt
done
timeout -k 5 $(left 235) python3 -m pytest -m gpu -v -p no:cacheprovider -rA --tb=short --timeout=80 --durations=20 \
  tests/test_gpu.py::test_capture_and_doctor_name_the_planted_sync_on_gpus \
  > $OUT_DIR/pytest-rest-4.txt 2>&1
echo "rest rc=$? at $(( $(date +%s) - T0 ))s" | tee -a $OUT_DIR/pytest-rest-4.txt
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT_DIR/pytest-rest-4.txt | tail -20
