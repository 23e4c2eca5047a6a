#!/bin/bash
# p2p round 3 (4x H100, a rerun): the pipeline part alone on 4 and on 2 GPUs, now with the host's time to issue each
# stage's forward and backward (host_us of the parts) for the model with the host; copy at 1 KiB. ~110 s.
set -u
O=${OUT_DIR:?OUT_DIR}
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi -L; lscpu | head -20; } > $O/sysinfo.txt 2>&1
timeout -k 3 $(left 55) python3 -m kit exp p2p_transports --config configs/gpu.yaml -p 'parts=[pipeline]' \
    -p results_root=$O/h100x4 > $O/kit4.log 2>&1
echo "kit4 rc=$? at $(( $(date +%s) - T0 )) s"
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $(left 95) python3 -m kit exp p2p_transports --config configs/gpu.yaml \
    -p 'parts=[pipeline]' -p results_root=$O/h100x2 > $O/kit2.log 2>&1
echo "kit2 rc=$? at $(( $(date +%s) - T0 )) s"
# copy at 1 KiB after trimming its Python (the Works, the harness's ops made once), with the bare loop and the floor
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $(left 115) python3 -m kit exp p2p_transports -p 'transports=[copy]' \
    -p 'parts=[bandwidth]' -p min_bytes=1024 -p max_bytes=1024 -p 'directions=[one]' -p repeats=20 \
    -p results_root=$O/lat > $O/lat.log 2>&1
echo "1 KiB rc=$? at $(( $(date +%s) - T0 )) s"
du -sh $O
