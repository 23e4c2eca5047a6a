#!/bin/bash
# cost16 (round s10r1, 240 s): how the kernel shares a CPU-contended rank's core, unprofiled and traced.
# tests/corpus/schedstat_probe.py records planted_multi's cpu_rank pairs (control and fault arm by turns, ABBA, then each
# arm traced with tensorboard_trace_handler) reading every step's /proc schedstat (run, run-queue wait) of the main and
# autograd threads, context switches, and the busy loops' run time; per block every thread. Also how CUDA waits
# (cuCtxGetFlags, the CPU a synchronize / a full launch queue costs). 2 GPUs (CUDA_VISIBLE_DEVICES=0,1):
#  1. GPT DDP bf16, rank 0 contended   (the committed rank0-tb case: 4.21x)
#  2. CNN DDP fp32, rank 1 contended   (the committed cnn cpu_rank case: 3.22x)
#  3. GPT DDP bf16, rank 1 contended
#  4./5. repeats of 1 and 2 if time is left (one configuration's added time varies 2-6x between recordings)
# Every step its own timeout; traces trimmed to 3 steps. Dry mode: CORP_DEVICE=cpu CORP_PY=python.
START=$(date +%s); END=$((START + ${CORP_TOTAL:-232}))
O=${OUT_DIR:?}
left() { echo $(( END - $(date +%s) )); }
min() { echo $(( $1 < $2 ? $1 : $2 )); }
PY=${CORP_PY:-python3}
{ date -u; uname -a; nvidia-smi; nvidia-smi topo -m; nproc; free -g; lscpu | head -30; cat /proc/sys/kernel/sched_autogroup_enabled
  grep -s . /sys/kernel/debug/sched/features /sys/kernel/debug/sched/base_slice_ns /sys/kernel/debug/sched/latency_ns /sys/kernel/debug/sched/min_granularity_ns /sys/kernel/debug/sched/wakeup_granularity_ns /proc/sys/kernel/sched_*; cat /proc/cmdline
  $PY -c 'import torch,sys,os; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count()); print("affinity", sorted(os.sched_getaffinity(0)))'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; } > $O/hw.txt 2>&1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=${CORP_HW:-dry};; esac
echo "$HW ($GPU)" > $O/hw_kind.txt
echo "hw $HW ($GPU) done $(( $(date +%s) - START )) s"
mb() { du -sm $O | cut -f1; }
run() {  # run SUB CAP RANK PAIR: the probe on 2 GPUs into $O/${HW}x2/SUB
  local sub=$1 cap=$2 rank=$3 pair=$4
  local B=$(min $cap $(left)) dir=$O/${HW}x2/$sub
  [ $B -lt 25 ] && { echo "skip $sub: $B s"; return; }
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=0,1 PLANTED_MULTI_RANK=$rank PLANTED_MULTI_SPINNERS=1 timeout -k 3 $B \
    $PY tests/corpus/schedstat_probe.py --device ${CORP_DEVICE:-cuda} --pair $pair --out $dir \
    --steps ${CORP_STEPS:-30} --alternations ${CORP_ALT:-6} --warm 5 2>&1 \
    | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn"
  echo "$sub rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s, done at $(( $(date +%s) - START )) s (budget $B s)"
  timeout 20 $PY tests/corpus/trim.py $dir --keep 3 > /dev/null 2>&1
  if [ $(mb) -gt 10 ]; then find $dir -name "*.json.gz" -delete; echo "  traces of $sub dropped: $(mb) MB"; fi
  echo "  out $(mb) MB"
}
run ddp_r0_a 45 0 ddp_cpu
run cnn_r1_a 45 1 cnn_cpu
run ddp_r1 45 1 ddp_cpu
run ddp_r0_b 45 0 ddp_cpu
run cnn_r1_b 45 1 cnn_cpu
pgrep -af "while os.getppid" | head -3
echo "all done $(( $(date +%s) - START )) s, $(mb) MB"
