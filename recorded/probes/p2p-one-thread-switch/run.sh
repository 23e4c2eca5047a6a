#!/bin/bash
# p2p9 round s6r4: where copy's one-thread pipeline spends its extra host time (probe.py), 4 then 2 GPUs. <= 120 s.
cd "$(dirname "$0")"
OUT_DIR=${OUT_DIR:-/tmp/p2p9-out}
mkdir -p "$OUT_DIR"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
{
  date -u; hostname; nproc; timeout 5 nvidia-smi; timeout 5 nvidia-smi topo -m
  lscpu | head -20
} > "$OUT_DIR/sysinfo.txt" 2>&1
echo "sysinfo done $(date -u +%T)"
timeout 60 $PY probe.py "$OUT_DIR" --budget 46 > "$OUT_DIR/probe-4.log" 2>&1; echo "4 stages rc=$? $(date -u +%T)"
CUDA_VISIBLE_DEVICES=0,1 timeout 32 $PY probe.py "$OUT_DIR" --budget 24 > "$OUT_DIR/probe-2.log" 2>&1; echo "2 stages rc=$? $(date -u +%T)"
tail -n 25 "$OUT_DIR/probe-4.log" "$OUT_DIR/probe-2.log"
