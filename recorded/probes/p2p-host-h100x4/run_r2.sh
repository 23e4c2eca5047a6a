#!/bin/bash
# p2p, session 2 round 2 (4x H100): the recorded runs -- kit exp p2p_transports at the GPU preset on 4 GPUs and on
# 2 (GPUs 0,1) -- then the p2p GPU tests with the 4 GPUs visible, then (if time is left) the host probe on 4 stages.
set -u
O=${OUT_DIR:?OUT_DIR}
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi; nvidia-smi topo -m; lscpu | head -20; python3 -c "import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > $O/sysinfo.txt 2>&1
echo "sysinfo at $(( $(date +%s) - T0 )) s"
timeout -k 3 $(left 105) python3 -m kit exp p2p_transports --config configs/gpu.yaml -p results_root=$O/h100x4 > $O/kit4.log 2>&1
echo "kit4 rc=$? at $(( $(date +%s) - T0 )) s"
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $(left 170) python3 -m kit exp p2p_transports --config configs/gpu.yaml \
    -p results_root=$O/h100x2 > $O/kit2.log 2>&1
echo "kit2 rc=$? at $(( $(date +%s) - T0 )) s"
timeout -k 3 $(left 238) python3 -m pytest -m gpu -v -p no:cacheprovider -rA --tb=short --durations=10 \
    tests/test_p2p_transports.py tests/test_ipc_direct.py > $O/pytest-gpu-4.log 2>&1
echo "pytest (4 GPUs visible) rc=$? at $(( $(date +%s) - T0 )) s"
L=$(left 246); [ "$L" -gt 8 ] && { timeout -k 2 $L python3 probe.py $O/probe4.json --stages 4 > $O/probe4.log 2>&1; echo "probe4 rc=$? at $(( $(date +%s) - T0 )) s"; }
find $O -name '*.json.gz' -size +3M -delete
du -sh $O
