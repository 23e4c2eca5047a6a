#!/bin/bash
# fix14 (s9r3-extra, 60 s): a kit.capture CNN stall_rank pair (planted_multi --pair cnn_stall --profiler kit.capture,
# 2 GPUs): does kit.capture's measured host excess cap a real 20 ms stall's cost low (REVIEW_S9b item C)?
# Dry mode: CORP_DEVICE=cpu CORP_NGPU=2 CORP_PY=python.
START=$(date +%s); END=$((START + ${CORP_TOTAL:-58}))
O=${OUT_DIR:?}
left() { echo $(( END - $(date +%s) )); }
min() { echo $(( $1 < $2 ? $1 : $2 )); }
PY=${CORP_PY:-python3}
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; free -g; lscpu | head -30
  $PY -c 'import torch,sys,os; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count()); print("affinity", sorted(os.sched_getaffinity(0)))'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; } > $O/hw.txt 2>&1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=${CORP_HW:-dry}; NG=${CORP_NGPU:-2};; esac
echo "$HW x$NG ($GPU)" > $O/hw_kind.txt
echo "hw $HW x$NG ($GPU) done $(( $(date +%s) - START )) s"
mb() { du -sm $O | cut -f1; }
run() {  # run WORLD SUB CAP RESERVE RANK SPINNERS ARGS...: planted_multi on WORLD GPUs into $O/${HW}xWORLD/SUB, trimmed to 2 steps
  local w=$1 sub=$2 cap=$3 reserve=$4 rank=$5 spin=$6; shift 6
  local B=$(min $cap $(( $(left) - reserve ))) dev=0,1 dir=$O/${HW}x$w/$sub
  [ $w = 4 ] && dev=0,1,2,3
  [ $w -gt $NG ] && { echo "skip x$w $sub: $NG GPUs"; return; }
  [ $B -lt 25 ] && { echo "skip x$w $sub: $B s"; return; }
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$dev PLANTED_MULTI_RANK=$rank PLANTED_MULTI_SPINNERS=$spin timeout -k 3 $B \
    $PY tests/corpus/planted_multi.py --device ${CORP_DEVICE:-cuda} \
    --world $w --out $dir --budget-s $((B - 3)) --warm ${CORP_WARM:-5} "$@" 2>&1 \
    | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn"
  echo "x$w $sub rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s, done at $(( $(date +%s) - START )) s (budget $B s)"
  timeout 20 $PY tests/corpus/trim.py $dir --keep 2 > /dev/null 2>&1
  if [ $(mb) -gt 10 ]; then find $dir -name "*.json.gz" -delete; echo "  traces of $sub dropped: $(mb) MB"; fi
  echo "  out $(mb) MB"
}
S=${CORP_STEPS:-30}; A=${CORP_ALT:-6}
run 2 cnn_stall_kit 50 0 1 0 --pair cnn_stall --steps $S --alternations $A --profiler kit.capture
find $O -name "capture_*.json" -size +200k -delete
echo "all done $(( $(date +%s) - START )) s, $(mb) MB"
