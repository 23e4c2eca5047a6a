#!/bin/bash
# cost16 (round s10r2, 150 s): HELD-OUT scoring of the contended-host rule written before this round
# (/work/team/ROUND10-cost16.txt: the model applies only where the late rank's quiet time inside ops also clears the
# quiet floor). 2 GPUs (CUDA_VISIBLE_DEVICES=0,1), tensorboard_trace_handler, each pair interleaved with its control:
#  1. GPT FSDP bf16, rank 1 contended   (schedstat_probe: slices in FSDP's Python hooks -> own excess?)
#  2. GPT DDP bf16, rank 0 contended    (schedstat_probe: the committed rank0-tb configuration)
#  3. CNN DDP fp32 stall_rank            (planted_multi --pair cnn_stall: a real stall must keep its own excess)
#  4. CNN DDP fp32, rank 1 contended    (schedstat_probe: the committed cnn cpu_rank configuration)
# Every step its own timeout; traces trimmed to 3 steps. Dry mode: CORP_DEVICE=cpu CORP_PY=python.
START=$(date +%s); END=$((START + ${CORP_TOTAL:-144}))
O=${OUT_DIR:?}
left() { echo $(( END - $(date +%s) )); }
min() { echo $(( $1 < $2 ? $1 : $2 )); }
PY=${CORP_PY:-python3}
{ date -u; uname -a; nvidia-smi; nvidia-smi topo -m; nproc; free -g; lscpu | head -30
  $PY -c 'import torch,sys,os; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count()); print("affinity", sorted(os.sched_getaffinity(0)))'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; } > $O/hw.txt 2>&1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=${CORP_HW:-dry};; esac
echo "$HW ($GPU)" > $O/hw_kind.txt
echo "hw $HW ($GPU) done $(( $(date +%s) - START )) s"
mb() { du -sm $O | cut -f1; }
fin() {  # fin SUB T0 B RC
  echo "$1 rc=$4 in $(( $(date +%s) - $2 )) s, done at $(( $(date +%s) - START )) s (budget $3 s)"
  timeout 15 $PY tests/corpus/trim.py $O/${HW}x2/$1 --keep 3 > /dev/null 2>&1
  if [ $(mb) -gt 10 ]; then find $O/${HW}x2/$1 -name "*.json.gz" -delete; echo "  traces of $1 dropped: $(mb) MB"; fi
  echo "  out $(mb) MB"
}
probe() {  # probe SUB CAP RANK PAIR
  local sub=$1 cap=$2 rank=$3 pair=$4
  local B=$(min $cap $(left)) t0=$(date +%s)
  [ $B -lt 25 ] && { echo "skip $sub: $B s"; return; }
  CUDA_VISIBLE_DEVICES=0,1 PLANTED_MULTI_RANK=$rank PLANTED_MULTI_SPINNERS=1 timeout -k 3 $B \
    $PY tests/corpus/schedstat_probe.py --device ${CORP_DEVICE:-cuda} --pair $pair --out $O/${HW}x2/$sub \
    --steps ${CORP_STEPS:-30} --alternations ${CORP_ALT:-6} --warm 5 2>&1 \
    | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn"
  fin $sub $t0 $B ${PIPESTATUS[0]}
}
pair() {  # pair SUB CAP PAIR: planted_multi --pair, tb_handler
  local sub=$1 cap=$2 p=$3
  local B=$(min $cap $(left)) t0=$(date +%s)
  [ $B -lt 25 ] && { echo "skip $sub: $B s"; return; }
  CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 $B $PY tests/corpus/planted_multi.py --device ${CORP_DEVICE:-cuda} \
    --world 2 --out $O/${HW}x2/$sub --budget-s $((B - 3)) --warm 5 --pair $p --steps ${CORP_STEPS:-30} \
    --alternations ${CORP_ALT:-6} --profiler tb_handler 2>&1 | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn"
  fin $sub $t0 $B ${PIPESTATUS[0]}
}
probe fsdp_r1 38 1 fsdp_cpu
probe ddp_r0 34 0 ddp_cpu
pair cnn_stall 34 cnn_stall
probe cnn_r1 34 1 cnn_cpu
pgrep -af "while os.getppid" | head -3
echo "all done $(( $(date +%s) - START )) s, $(mb) MB"
