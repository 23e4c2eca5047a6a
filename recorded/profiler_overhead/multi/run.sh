#!/bin/bash
# price10 (round s7r2, 90 s): the profiler's overhead on DDP/FSDP jobs without record_shapes, ABBA against with it, each
# kit.capture window with its own unprofiled steps; 2 GPUs (CUDA_VISIBLE_DEVICES=0,1) then 4. Each step its own timeout.
# Dry mode: P10_DEVICE=cpu P10_NGPU=4 (gloo, the CPU sizes).
START=$(date +%s); END=$((START + ${P10_TOTAL:-87}))
O=${OUT_DIR:?}
PY=${P10_PY:-python3}
left() { echo $(( END - $(date +%s) )); }
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; lscpu | head -20; free -g
  $PY -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count())'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; } > $O/hw.txt 2>&1 &
HWPID=$!
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$NG" -gt 0 ] 2>/dev/null || NG=${P10_NGPU:-0}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=dry;; esac
echo "$HW x$NG ($GPU) at $(( $(date +%s) - START )) s"
run() {  # run WORLD CAP RESERVE: probe.py on WORLD GPUs into $O/${HW}xWORLD for at most CAP s, leaving RESERVE s
  local w=$1 B=$(( $2 < $(left) - $3 ? $2 : $(left) - $3 )) dev=0,1 t0=$(date +%s)
  [ $w = 4 ] && dev=0,1,2,3
  [ $w -gt $NG ] && { echo "skip x$w: $NG GPUs"; return; }
  [ $B -lt 15 ] && { echo "skip x$w: $B s"; return; }
  CUDA_VISIBLE_DEVICES=$dev timeout -k 2 $B $PY probe.py $O/${HW}x$w --world $w --device ${P10_DEVICE:-cuda} \
    --budget-s $((B - 6)) ${P10_ARGS} 2>&1 | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn"
  echo "x$w rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s (budget $B s), at $(( $(date +%s) - START )) s, $(du -sm $O | cut -f1) MB"
  # the upload cap: the second with-shapes window's traces go first, then the first's
  for k in 2 1; do [ $(du -sm $O | cut -f1) -gt 10 ] && find $O -path "*/$k-shapes/*.json.gz" -delete; done
}
run 2 40 0
run 4 60 0
wait $HWPID
echo "all done $(( $(date +%s) - START )) s, $(du -sm $O | cut -f1) MB"
