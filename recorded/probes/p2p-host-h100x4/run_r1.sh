#!/bin/bash
# p2p, session 2 round 1 (4x H100): where the host time of the in-process 4-stage pipeline goes (probe.py, 4 and 2
# stages), and the pipeline part of the kit on 4 and 2 GPUs with the host's time per stage in the pipeline
# (host_us / host_compute_us of the pipeline rows) and the transfer part posted as the pipeline posts it. ~150 s.
set -u
O=${OUT_DIR:?OUT_DIR}
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi; nvidia-smi topo -m; lscpu | head -20; python3 -c "import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > $O/sysinfo.txt 2>&1
echo "sysinfo at $(( $(date +%s) - T0 )) s"
timeout -k 3 $(left 60) python3 probe.py $O/probe4.json --stages 4 > $O/probe4.log 2>&1
echo "probe4 rc=$? at $(( $(date +%s) - T0 )) s"
timeout -k 3 $(left 125) python3 -m kit exp p2p_transports --config configs/gpu.yaml -p 'parts=[pipeline]' \
    -p results_root=$O/h100x4 > $O/kit4.log 2>&1
echo "kit4 rc=$? at $(( $(date +%s) - T0 )) s"
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $(left 185) python3 -m kit exp p2p_transports --config configs/gpu.yaml \
    -p 'parts=[pipeline]' -p results_root=$O/h100x2 > $O/kit2.log 2>&1
echo "kit2 rc=$? at $(( $(date +%s) - T0 )) s"
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $(left 270) python3 probe.py $O/probe2.json --stages 2 > $O/probe2.log 2>&1
echo "probe2 rc=$? at $(( $(date +%s) - T0 )) s"
find $O -name '*.json.gz' -size +3M -delete
du -sh $O
