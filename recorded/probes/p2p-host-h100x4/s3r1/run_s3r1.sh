#!/bin/bash
# p2p3, session 3 round 1 (4x H100): kit exp p2p_transports at the GPU preset on 4 GPUs and on 2 (GPUs 0,1) -- the
# new parts (F/B host time without event records, the thread-per-stage host times) and 20 pipeline steps -- then the
# host probe on 4 stages (probe3.py), then pytest -m gpu of test_p2p_transports.py with 2 GPUs visible.
# (snapshot: git archive b6377f1 kit configs benchmarks pyproject.toml tests/..., plus probe3.py and oldcopy.py)
set -u
O=${OUT_DIR:?OUT_DIR}
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi; nvidia-smi topo -m; lscpu | head -20; python3 -c "import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA)_' ; } > $O/sysinfo.txt 2>&1
echo "sysinfo at $(( $(date +%s) - T0 )) s"
timeout -k 3 $(left 82) python3 -m kit exp p2p_transports --config configs/gpu.yaml -p results_root=$O/h100x4 > $O/kit4.log 2>&1
echo "kit4 rc=$? at $(( $(date +%s) - T0 )) s"
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $(left 138) python3 -m kit exp p2p_transports --config configs/gpu.yaml \
    -p results_root=$O/h100x2 > $O/kit2.log 2>&1
echo "kit2 rc=$? at $(( $(date +%s) - T0 )) s"
timeout -k 2 $(left 168) python3 probe3.py $O/probe4.json > $O/probe4.log 2>&1
echo "probe4 rc=$? at $(( $(date +%s) - T0 )) s"
L=$(left 196); [ "$L" -gt 10 ] && { CUDA_VISIBLE_DEVICES=0,1 timeout -k 2 $L python3 -m pytest -m gpu -v -p no:cacheprovider -rA --tb=short \
    --durations=10 tests/test_p2p_transports.py > $O/pytest-gpu-2.log 2>&1; echo "pytest (2 GPUs visible) rc=$? at $(( $(date +%s) - T0 )) s"; }
find $O -name '*.json.gz' -size +3M -delete
du -sh $O
