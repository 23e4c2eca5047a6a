#!/bin/bash
# p2p round 2 (4x H100): the recorded runs after the fixes and the GPU tests. Budget 200 s; every
# step has its own timeout and writes as it goes (a late step loses only itself).
set -u
O=${OUT_DIR:?OUT_DIR}
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
python3 -c "import pytest" 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/pylib  # pytest travels along
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi; nvidia-smi topo -m; lscpu | head -30; cat /proc/sys/kernel/numa_balancing;
  cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor; cat /sys/kernel/mm/transparent_hugepage/enabled;
  python3 -c "import torch;print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())";
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM)'; python3 -c "import pytest; print('pytest', pytest.__version__, pytest.__file__)";
  head -1 /proc/stat; } > $O/sysinfo.txt 2>&1
echo "sysinfo done at $(( $(date +%s) - T0 )) s"
PRESET="--config configs/gpu.yaml"
# one thing at a time (a host-driven pipeline is host-bound on this machine: nothing else may share its CPU)
# 1. the 2-GPU recorded run
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $(left 75) python3 -m kit exp p2p_transports $PRESET -p results_root=$O/h100x2 \
    > $O/kit2.log 2>&1
echo "kit2 rc=$? at $(( $(date +%s) - T0 )) s"
# 2. the 4-GPU recorded run
timeout -k 3 $(left 160) python3 -m kit exp p2p_transports $PRESET -p results_root=$O/h100x4 > $O/kit4.log 2>&1
echo "kit4 rc=$? at $(( $(date +%s) - T0 )) s"
# 3. the GPU tests with every GPU visible: the 2-rank tests and the 4-stage pipeline over every transport
timeout -k 3 $(left 197) python3 -m pytest -p no:cacheprovider -q -m gpu tests/test_p2p_transports.py \
    tests/test_ipc_direct.py > $O/pytest-gpu.log 2>&1
echo "pytest (4 GPUs visible) rc=$? at $(( $(date +%s) - T0 )) s"
head -1 /proc/stat >> $O/sysinfo.txt
du -sh $O
