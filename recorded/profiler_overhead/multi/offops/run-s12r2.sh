#!/bin/bash
# (round s12r2 ran this as .device/price22/run.sh; probe.py is ../probe.py, features.py this folder's)
# price22 (round s12r2, BUDGET 100 s): the tracer's price per Python frame off the ops on 4 pure-Python workloads
# (PROBE_PYLOAD: gpt-ddp-bf16-control with ~5 ms of ord+append / dict.get / a recursive function / a sort with a Python
# key after each step, on every rank, outside any op; and the control without), record_shapes / +with_stack ABBA.
# (Round s12r1's version of this script, the input transform and FSDP: recorded/profiler_overhead/multi/offops/run.sh.)
# Two probes at once, each on 2 GPUs (.device/price22/probe.py = recorded/profiler_overhead/multi/probe.py with
# PROBE_ARMS=stack2: record_shapes / +with_stack, ABBA, each kit.capture window with its own 10 unprofiled steps):
#   A (GPUs 0,1): gpt-ddp-bf16-input_rank (rank 1's pure-Python transform on the main thread: frames off the ops, a
#       fixed amount of work), then gpt-ddp-bf16-control (the same job without it)
#   B (GPUs 2,3): gpt-fsdp-bf16-control (the FSDP family under stacks: never checked against the stack price), then
#       gpt-fsdp-bf16-stall_rank
# then each window's features on the device (features.py), a few traces xz'd back (< 5 MB).
# Dry mode: P22_DEVICE=cpu P22_NGPU=4 (gloo).
START=$(date +%s); BUDGET=${BUDGET:-100}; END=$((START + BUDGET - 4))
O=${OUT_DIR:?}
PY=${P22_PY:-python3}
D=${P22_DIR:-recorded/profiler_overhead/multi/offops}
left() { echo $(( END - $(date +%s) )); }
{ date -u; nvidia-smi; nproc; lscpu | head -20; free -g
  $PY -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count())'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; git log -1 --format=%H 2>/dev/null; } > $O/hw.txt 2>&1 &
HWPID=$!
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$NG" -gt 0 ] 2>/dev/null || NG=${P22_NGPU:-0}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=dry;; esac
echo "$HW x$NG ($GPU) at $(( $(date +%s) - START )) s, budget $BUDGET s"
P=$O/probe; mkdir -p $P
probe() {  # probe DEVS TAG JOBS SECONDS
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$1 PROBE_ARMS=stack2 timeout -k 2 $4 $PY $D/../probe.py $P/$2 --world 2 --device ${P22_DEVICE:-cuda} \
    --jobs $3 --budget-s $(( $4 - 8 )) 2>&1 | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn" | sed "s/^/[$2] /"
  echo "[$2] rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s, at $(( $(date +%s) - START )) s"
}
PB=$(( $(left) - ${P22_RESERVE:-34} ))
if [ $NG -ge 4 ]; then
  probe 0,1 ${HW}x2 ${P22_JA:-gpt-ddp-bf16-control,gpt-ddp-bf16-control+ord,gpt-ddp-bf16-control+fib} $PB & PA=$!
  probe 2,3 ${HW}x2-gpus23 ${P22_JB:-gpt-ddp-bf16-control+dict,gpt-ddp-bf16-control+sort} $PB & PB2=$!
  wait $PA $PB2
elif [ $NG -ge 2 ]; then
  probe 0,1 ${HW}x2 ${P22_JA:-gpt-ddp-bf16-control,gpt-ddp-bf16-control+ord,gpt-ddp-bf16-control+fib},${P22_JB:-gpt-ddp-bf16-control+dict,gpt-ddp-bf16-control+sort} $PB
else
  echo "no 2 GPUs: nothing to run"
fi
wait $HWPID 2>/dev/null
echo "probes done at $(( $(date +%s) - START )) s, $(du -sm $P | cut -f1) MB"
FB=$(( $(left) - 12 )); echo "features: $FB s"
[ $FB -gt 5 ] && timeout -k 2 $((FB + 2)) $PY $D/features.py $P $O/features.json $(nproc) $FB 2>&1 | grep -v "UserWarning\|warnings.warn"
[ -s $O/features.json ] && xz -6 $O/features.json
echo "features done at $(( $(date +%s) - START )) s: $(ls -la $O/features.json.xz 2>/dev/null)"
find $P -name 'capture_rank*.json' -o -name meta.json | tar -cf - -T - 2>/dev/null | xz -6 > $O/sidecars.tar.xz
K=$O/traces; mkdir -p $K
for f in $P/${HW}x2/gpt-ddp-bf16-control+fib/1-stack/trace_rank1.json.gz $P/${HW}x2-gpus23/gpt-ddp-bf16-control+sort/1-stack/trace_rank1.json.gz; do
  [ -f "$f" ] || continue; [ $(left) -lt 3 ] && break
  r=${f#$P/}; mkdir -p "$K/$(dirname "$r")"; zcat "$f" | xz -6 -T4 > "$K/${r%.gz}.xz"
  [ $(du -sk --exclude=probe $O | cut -f1) -gt 4000 ] && rm -f "$K/${r%.gz}.xz"
done
rm -rf $P
echo "all done $(( $(date +%s) - START )) s, $(du -sk $O | cut -f1) KB"; ls -laR $O | head -40
