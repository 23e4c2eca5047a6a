#!/bin/bash
# p2p10 round s7r1: which part of copy's message path makes the one-thread pipeline's compute calls dearer
# (probe.py), 4 GPUs then GPUs 0,1. Budget 240 s: 5 + 130 + 88.
cd "$(dirname "$0")"
OUT_DIR=${OUT_DIR:-/tmp/p2p10-out}
mkdir -p "$OUT_DIR"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
{
  date -u; hostname; nproc; timeout 5 nvidia-smi; timeout 5 nvidia-smi topo -m
  lscpu | head -20
} > "$OUT_DIR/sysinfo.txt" 2>&1
echo "sysinfo done $(date -u +%T)"
timeout 130 $PY probe.py "$OUT_DIR" --budget 115 > "$OUT_DIR/probe-4.log" 2>&1; echo "4 stages rc=$? $(date -u +%T)"
CUDA_VISIBLE_DEVICES=0,1 timeout 88 $PY probe.py "$OUT_DIR" --budget 75 --alloc-s 0 > "$OUT_DIR/probe-2.log" 2>&1; echo "2 stages rc=$? $(date -u +%T)"
tail -n 45 "$OUT_DIR/probe-4.log" "$OUT_DIR/probe-2.log"
