#!/bin/bash
# price12 (round s8r2, 110 s): session 7's price10 probe again (recorded/profiler_overhead/multi: the profiler's
# overhead on DDP/FSDP jobs without record_shapes, ABBA against with it, each kit.capture window with its own unprofiled
# steps), on the machine that lands (meant: 4x H100); 2 GPUs (CUDA_VISIBLE_DEVICES=0,1) then 4. The same three jobs as
# on 4x H200, then on 2 GPUs only the narrow 12-layer GPT (gpt-ddp-bf16-deep, ~4x the ops and trace) last: a job shape
# never fitted on.
# Each step its own timeout. The traces are re-compressed gz -> xz at the end (~30% smaller: the 12 MB upload cap).
# Dry mode: P12_DEVICE=cpu P12_NGPU=4 (gloo, the CPU sizes).
START=$(date +%s); END=$((START + ${P12_TOTAL:-104}))
O=${OUT_DIR:?}
PY=${P12_PY:-python3}
JOBS=${P12_JOBS:-gpt-ddp-bf16-control,gpt-fsdp-bf16-control,cnn-ddp-fp32-hostbound}
left() { echo $(( END - $(date +%s) )); }
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; lscpu | head -20; free -g
  $PY -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count())'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; } > $O/hw.txt 2>&1 &
HWPID=$!
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$NG" -gt 0 ] 2>/dev/null || NG=${P12_NGPU:-0}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=dry;; esac
echo "$HW x$NG ($GPU) at $(( $(date +%s) - START )) s"
run() {  # run WORLD CAP RESERVE [,MORE_JOBS]: probe.py on WORLD GPUs into $O/${HW}xWORLD for at most CAP s, leaving RESERVE s
  local w=$1 B=$(( $2 < $(left) - $3 ? $2 : $(left) - $3 )) dev=0,1 t0=$(date +%s)
  [ $w = 4 ] && dev=0,1,2,3
  [ $w -gt $NG ] && { echo "skip x$w: $NG GPUs"; return; }
  [ $B -lt 15 ] && { echo "skip x$w: $B s"; return; }
  CUDA_VISIBLE_DEVICES=$dev timeout -k 2 $B $PY probe.py $O/${HW}x$w --world $w --device ${P12_DEVICE:-cuda} \
    --jobs $JOBS$4 --budget-s $((B - 6)) ${P12_ARGS} 2>&1 | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn"
  echo "x$w rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s (budget $B s), at $(( $(date +%s) - START )) s, $(du -sm $O | cut -f1) MB"
}
run 2 48 8 ,gpt-ddp-bf16-deep
run 4 70 6
wait $HWPID
# gz -> xz (the same JSON; each file replaced only once its .xz is whole), 16 at a time
find $O -name '*.json.gz' -print0 | timeout -k 1 $(( $(left) > 3 ? $(left) : 3 )) xargs -0 -P 16 -n 8 sh -c \
  'for f; do zcat "$f" | xz -6 > "${f%.gz}.xz.part" && mv "${f%.gz}.xz.part" "${f%.gz}.xz" && rm "$f"; done' sh
find $O -name '*.part' -delete
echo "xz done at $(( $(date +%s) - START )) s, $(du -sm $O | cut -f1) MB"
# the upload cap, if still over: the deep job's with-shapes traces go first (second window, then first), then the others'
for p in "*deep/2-shapes" "*deep/1-shapes" "*/2-shapes" "*/1-shapes"; do
  [ $(du -sm $O | cut -f1) -gt 11 ] && find $O -path "$p/*.json.*" -delete; done
echo "all done $(( $(date +%s) - START )) s, $(du -sm $O | cut -f1) MB"
