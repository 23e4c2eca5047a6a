#!/bin/bash
# lead, session 2 round 1: every GPU-marked test of main's tree, 4 GPUs visible; per-test timeout with tracebacks
cd ../.. && export PYTHONPATH=/tmp/site:$PWD
N=${GPUS_VISIBLE:-4}
timeout -k 5 ${BUDGET_TESTS:-225} python3 -m pytest -m gpu -v -p no:cacheprovider -rA --tb=short --timeout=100 \
  --durations=20 > $OUT_DIR/pytest-gpu-$N.txt 2>&1
echo "rc=$?" >> $OUT_DIR/pytest-gpu-$N.txt
grep -E "PASSED|FAILED|ERROR|SKIPPED|XFAIL|rc=|passed|failed" $OUT_DIR/pytest-gpu-$N.txt | tail -40
