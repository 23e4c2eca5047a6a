#!/bin/bash
# p2p3, session 3 round 3 if there is one (4x H100; written for 150 s; round 2 lost both runs to a bug fixed in b1ad49f): the final recorded runs -- kit exp p2p_transports at the GPU preset
# on 4 GPUs and on 2 (GPUs 0,1) with the parts' gradients accumulating as in the pipeline (commit in COMMIT) -- then,
# in the time left, the p2p GPU tests' pipeline case and the private-call check with GPUs 0,1 visible.
set -u
O=${OUT_DIR:?OUT_DIR}
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD GIT_CEILING_DIRECTORIES=$(dirname "$PWD")
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
{ date -u; cat COMMIT; nvidia-smi; nvidia-smi topo -m; lscpu | head -20; python3 -c "import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA)_'; } > $O/sysinfo.txt 2>&1
echo "sysinfo at $(( $(date +%s) - T0 )) s"
timeout -k 3 $(left 84) python3 -m kit exp p2p_transports --config configs/gpu.yaml -p results_root=$O/h100x4 > $O/kit4.log 2>&1
echo "kit4 rc=$? at $(( $(date +%s) - T0 )) s"
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $(left 140) python3 -m kit exp p2p_transports --config configs/gpu.yaml \
    -p results_root=$O/h100x2 > $O/kit2.log 2>&1
echo "kit2 rc=$? at $(( $(date +%s) - T0 )) s"
L=$(left 148); [ "$L" -gt 5 ] && { CUDA_VISIBLE_DEVICES=0,1 timeout -s INT -k 1 $L python3 -m pytest -m gpu -v -p no:cacheprovider -rA \
    --tb=short -k "private or pipeline_same_numbers" tests/test_p2p_transports.py > $O/pytest-gpu-2.log 2>&1; echo "pytest (2 GPUs visible) rc=$? at $(( $(date +%s) - T0 )) s"; }
find $O -name '*.json.gz' -size +3M -delete
du -sh $O
