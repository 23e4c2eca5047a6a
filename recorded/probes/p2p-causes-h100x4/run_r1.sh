#!/bin/bash
# p2p round 1 (4x H100): measure to find causes. Budget 140 s; every step has its own timeout, results as they come.
set -u
O=${OUT_DIR:?OUT_DIR}
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi; nvidia-smi topo -m; python3 -c "import torch;print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"; env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM)' ; } > $O/sysinfo.txt 2>&1
echo "sysinfo done at $(( $(date +%s) - T0 )) s"
# phase 1, in parallel on disjoint GPUs: the 2-stage pipelines of every transport (GPUs 0,1) | ipc both ways (GPUs 2,3)
( CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 40 python3 -m kit exp p2p_transports \
    -p 'transports=[copy, ipc, ipc-direct, nccl]' -p 'parts=[pipeline]' -p results_root=$O/kit2 \
    > $O/kit2.log 2>&1; echo "kit2 rc=$? at $(( $(date +%s) - T0 )) s" ) &
( mkdir -p $O/ipc; CUDA_VISIBLE_DEVICES=2,3 OUT_DIR=$O/ipc timeout -k 3 40 python3 -c "import p2p_ipc_probe as m; m.main()" \
    > $O/ipc_probe.log 2>&1; echo "ipc probe rc=$? at $(( $(date +%s) - T0 )) s" ) &
wait
# phase 2: one process, every GPU: the copy pipeline's causes, 1 KiB floors, the host time in a call
mkdir -p $O/probe
OUT_DIR=$O/probe timeout -k 3 $(left 75) python3 p2p_probe.py pipeline small call > $O/probe.log 2>&1
echo "probe rc=$? at $(( $(date +%s) - T0 )) s"
# phase 3: the kit on 4 GPUs: bandwidth (1 KiB .. 256 MiB, floors, both-ways trace, pair matrix one and both ways)
# and the 4-stage pipeline of every transport
timeout -k 3 $(left 136) python3 -m kit exp p2p_transports \
    -p 'transports=[copy, ipc, nccl, ipc-direct]' -p 'parts=[pipeline, bandwidth]' -p max_bytes=268435456 \
    -p results_root=$O/kit4 > $O/kit4.log 2>&1
echo "kit4 rc=$? at $(( $(date +%s) - T0 )) s"
du -sh $O
