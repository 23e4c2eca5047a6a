#!/bin/bash
# stack17 (round s11r1b on 4x H200, BUDGET 300 s; ran as .device/stack17/run.sh): the profiler's overhead on DDP jobs (GPT and CNN families; not rec, not FSDP:
# the held-out families) recorded with record_shapes / +with_stack / +with_stack+profile_memory, each kit.capture window
# with its own unprofiled steps (../probe.py with PROBE_ARMS=stack: ABCCBA); 2 GPUs then 4; then each window's features on the device
# (features.py: overhead_eval.rank_features per rank, in parallel); a few traces xz'd back.
# Dry mode: S17_DEVICE=cpu S17_NGPU=2 (gloo).
START=$(date +%s); BUDGET=${BUDGET:-270}; END=$((START + BUDGET - 4))
O=${OUT_DIR:?}
PY=${S17_PY:-python3}
D=${S17_DIR:-recorded/profiler_overhead/multi/stack}
left() { echo $(( END - $(date +%s) )); }
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; lscpu | head -20; free -g
  $PY -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count())'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; } > $O/hw.txt 2>&1 &
HWPID=$!
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$NG" -gt 0 ] 2>/dev/null || NG=${S17_NGPU:-0}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=dry;; esac
echo "$HW x$NG ($GPU) at $(( $(date +%s) - START )) s, budget $BUDGET s"
P=$O/probe; mkdir -p $P
run() {  # run WORLD CAP RESERVE JOBS: probe.py on WORLD GPUs into $P/${HW}xWORLD for at most CAP s, leaving RESERVE s
  local w=$1 B=$(( $2 < $(left) - $3 ? $2 : $(left) - $3 )) dev=0,1 t0=$(date +%s)
  [ $w = 4 ] && dev=0,1,2,3
  [ $w -gt $NG ] && { echo "skip x$w: $NG GPUs"; return; }
  [ $B -lt 15 ] && { echo "skip x$w: $B s"; return; }
  CUDA_VISIBLE_DEVICES=$dev PROBE_ARMS=stack timeout -k 2 $B $PY $D/../probe.py $P/${HW}x$w --world $w --device ${S17_DEVICE:-cuda} \
    --jobs $4 --budget-s $((B - 8)) ${S17_ARGS} 2>&1 | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn"
  echo "x$w rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s (budget $B s), at $(( $(date +%s) - START )) s, $(du -sm $P | cut -f1) MB"
}
J2=${S17_J2:-gpt-ddp-bf16-control,cnn-ddp-fp32-hostbound,gpt-ddp-bf16-accum,cnn-ddp-fp32-control,gpt-ddp-bf16-deep,cnn-ddp-fp32-stall_rank}
J4=${S17_J4:-gpt-ddp-bf16-control,cnn-ddp-fp32-hostbound,gpt-ddp-bf16-accum,cnn-ddp-fp32-stall_rank}
if [ "$NG" -ge 4 ]; then run 2 80 150 $J2; run 4 70 95 $J4; else run 2 130 100 $J2; fi
wait $HWPID
# features, with what is left (less ~25 s for the xz of a few traces)
FB=$(( $(left) - 25 )); echo "features: $FB s at $(( $(date +%s) - START )) s"
[ $FB -gt 10 ] && timeout -k 2 $((FB + 3)) $PY $D/features.py $P $O/features.json $(nproc) $FB 2>&1 | grep -v "UserWarning\|warnings.warn"
[ -s $O/features.json ] && xz -6 $O/features.json
echo "features done at $(( $(date +%s) - START )) s: $(ls -la $O/features.json.xz 2>/dev/null)"
# bring back: every window's sidecars and meta, and traces by priority until ~10 MB
find $P -name 'capture_rank*.json' -o -name meta.json | tar -cf - -T - 2>/dev/null | xz -6 > $O/sidecars.tar.xz
K=$O/traces; mkdir -p $K
for pat in "${HW}x2/gpt-ddp-bf16-control/1-stack/trace_rank0" "${HW}x2/gpt-ddp-bf16-control/2-stackmem/trace_rank0" \
           "${HW}x2/cnn-ddp-fp32-hostbound/1-stack/trace_rank0" "${HW}x2/gpt-ddp-bf16-control/0-shapes/trace_rank0" \
           "${HW}x2/gpt-ddp-bf16-control/1-stack/trace_rank1" "${HW}x2/cnn-ddp-fp32-hostbound/2-stackmem/trace_rank0" \
           "${HW}x2/gpt-ddp-bf16-accum/1-stack/trace_rank" "${HW}x2/cnn-ddp-fp32-hostbound/1-stack/trace_rank1" ; do
  [ $(left) -lt 4 ] && break
  [ $(du -sm --exclude=probe $O | cut -f1) -gt 9 ] && break
  for f in $P/$pat*.json.gz; do [ -f "$f" ] || continue
    r=${f#$P/}; mkdir -p $K/$(dirname $r); zcat "$f" | xz -6 > $K/${r%.gz}.xz; done
done
rm -rf $P
echo "all done $(( $(date +%s) - START )) s, $(du -sm $O | cut -f1) MB"; ls -la $O
