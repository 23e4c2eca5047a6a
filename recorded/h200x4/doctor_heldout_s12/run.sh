#!/bin/bash
# held22's device script, round s12r1 (BUDGET s, 4 GPUs; 2 GPUs: every run at world 2): issue 39's THIRD blind
# held-out set for `kit doctor` (truth and criteria written before recording: recorded/h200x4/doctor_heldout_s12/
# TRUTH.md, committed with the round). NO doctor here: the doctor of main at ~09:10 reads the traces (blind).
#  A fsdp4   GPUs 0-3 world 4: GPT FSDP2 bf16, json_handler WITH STACKS, no memory, no shapes, schedule(wait=1,
#            warmup=3, active=3); control + stall IN FORWARD (a forward hook of block 0) + CPU contention, by turns;
#            faults on rank 3
#  B cnn13   GPUs 1,3 world 2 (beside C): CNN fp32 DDP, tensorboard_trace_handler (gz, <host>_<pid> names, no
#            stacks); control + stall BEFORE BACKWARD + 12 ms GPU work (fp32 matmuls) + in-process input transform;
#            faults on rank 1
#  C gacc02  GPUs 0,2 world 2 (beside B): GPT DDP FP32 accumulation over 4 micro-batches with vs without no_sync,
#            json_handler without stacks (wait=2, warmup=2, active=3); then hb02: the host-bound CNN control alone,
#            json_handler with stacks + memory
#  D tiny4   GPUs 0-3 world 4: CNN fp32 DDP control then bucket_cap_mb=0.05 (one spawn, in turn), json_handler
#            without stacks or memory, active=3
#  E gpt4    (if time) GPUs 0-3 world 4: GPT DDP bf16 control + input transform + 20 ms GPU work by turns,
#            json_handler without stacks, shapes off, wait=0 warmup=1 active=3; faults on rank 0
# then pack (.device/held22/pack.py: xz; while over CORP_MAX_MB (9.5) cases are cut to 3 steps (2 where they have
# 3), the least new runs first: E, D, C', C, A).
# Dry run here: OUT_DIR=/tmp/h22dry BUDGET=900 CORP_DEVICE=cpu CORP_NGPU=4 CORP_HW=dry CORP_STEPS=3 CORP_ALT=2 CORP_PY=python bash .device/held22/run.sh
START=$(date +%s); END=$((START + ${BUDGET:-340} - 6))
O=${OUT_DIR:?}
left() { echo $(( END - $(date +%s) )); }
min() { echo $(( $1 < $2 ? $1 : $2 )); }
PY=${CORP_PY:-python3}
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; free -g; lscpu | head -30
  $PY -c 'import torch,sys,os; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count()); print("affinity", sorted(os.sched_getaffinity(0)))'
  git log -1 --format='%H %s' 2>&1; git status --short tests/corpus | head
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; } > $O/hw.txt 2>&1 &
HWPID=$!
sha256sum tests/corpus/planted_multi.py tests/corpus/planted.py > $O/recorder_sha.txt
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=${CORP_HW:-dry}; NG=${CORP_NGPU:-4};; esac
echo "$HW x$NG ($GPU)" > $O/hw_kind.txt
echo "hw $HW x$NG ($GPU) at $(( $(date +%s) - START )) s"
mb() { du -sm $O | cut -f1; }
TAIL=${CORP_TAIL:-45}  # kept for the packing
run() {  # run DEVS SUB CAP RANK JSONSET ARGS...: planted_multi on GPUs DEVS (world = their count) into $O/<tag>/SUB
  local dev=$1 sub=$2 cap=$3 rank=$4 js=$5; shift 5
  local w=$(echo $dev | tr ',' '\n' | wc -l)
  local B=$(min $cap $(( $(left) - TAIL ))) tag=${HW}x$w
  [ $w -lt $NG ] && tag=${HW}x$w-of-$NG
  [ ${dev%%,*} != 0 ] && tag=$tag-gpus${dev//,/}
  [ $w = 2 ] && [ $dev = 0,2 ] && tag=$tag-gpus02
  local dir=$O/$tag/$sub
  [ $B -lt 25 ] && { echo "skip x$w $sub: $B s"; return; }
  local t0=$(date +%s)
  mkdir -p $dir
  CUDA_VISIBLE_DEVICES=$dev PLANTED_MULTI_RANK=$rank PLANTED_MULTI_JSON=$js timeout -k 3 $B \
    $PY tests/corpus/planted_multi.py --device ${CORP_DEVICE:-cuda} \
    --world $w --out $dir --budget-s $((B - 3)) --warm ${CORP_WARM:-5} "$@" 2>&1 \
    | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn\|CPUAllocator\|profiler results will not" \
    | sed "s/^/[$sub] /"
  echo "x$w $sub rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s, done at $(( $(date +%s) - START )) s (budget $B s), $(mb) MB"
}
S=${CORP_STEPS:-24}; A=${CORP_ALT:-8}
FS="gpt-fsdp-bf16-control,gpt-fsdp-bf16-stall_rank-fwd,gpt-fsdp-bf16-cpu_rank"
CS="cnn-ddp-fp32-control,cnn-ddp-fp32-stall_rank-bwd,cnn-ddp-fp32-gpu_rank,cnn-ddp-fp32-input_rank"
GS="gpt-ddp-bf16-control,gpt-ddp-bf16-input_rank,gpt-ddp-bf16-gpu_rank20"
if [ $NG -ge 4 ]; then
  run 0,1,2,3 fsdp4 75 3 memory=0,shapes=0,warmup=3,active=3 --pair $FS --steps $S --alternations $A --profiler json_handler
  run 1,3 cnn13 75 1 "" --pair $CS --steps $(( S + 6 )) --alternations $A &
  { run 0,2 gacc02 48 1 stack=0,memory=0,wait=2,warmup=2,active=3 --pair gpt-ddp-fp32-accum,gpt-ddp-fp32-accum_no_sync \
      --steps $S --alternations $A --profiler json_handler
    run 0,2 hb02 30 1 "" --cases cnn-ddp-fp32-hostbound --steps $(( S * 2 )) --profiler json_handler; }
  wait
  run 0,1,2,3 tiny4 45 1 stack=0,memory=0,active=3 --cases cnn-ddp-fp32-control,cnn-ddp-fp32-tiny_buckets --steps $(( S * 3 )) --profiler json_handler
  run 0,1,2,3 gpt4 55 0 stack=0,shapes=0,wait=0,warmup=1,active=3 --pair $GS --steps $S --alternations $A --profiler json_handler
else  # 2 GPUs: the same jobs at world 2, faults on rank 1 (E: rank 0)
  run 0,1 fsdp4 65 1 memory=0,shapes=0,warmup=3,active=3 --pair $FS --steps $S --alternations $A --profiler json_handler
  run 0,1 cnn13 60 1 "" --pair $CS --steps $(( S + 6 )) --alternations $A
  run 0,1 gacc02 45 1 stack=0,memory=0,wait=2,warmup=2,active=3 --pair gpt-ddp-fp32-accum,gpt-ddp-fp32-accum_no_sync \
    --steps $S --alternations $A --profiler json_handler
  run 0,1 tiny4 40 1 stack=0,memory=0,active=3 --cases cnn-ddp-fp32-control,cnn-ddp-fp32-tiny_buckets --steps $(( S * 3 )) --profiler json_handler
  run 0,1 hb02 30 1 "" --cases cnn-ddp-fp32-hostbound --steps $(( S * 2 )) --profiler json_handler
  run 0,1 gpt4 50 0 stack=0,shapes=0,wait=0,warmup=1,active=3 --pair $GS --steps $S --alternations $A --profiler json_handler
fi
wait $HWPID 2>/dev/null
pgrep -af "while os.getppid" | head -3  # no spinner outlives its rank (a check)
for d in $(find $O -mindepth 3 -maxdepth 3 -type d); do [ -e $d/truth.json ] || { echo "incomplete: $d $(ls $d | wc -l) files"; rm -rf $d; }; done
echo "recording done $(( $(date +%s) - START )) s, $(mb) MB"
find $O -name truth.json | sort | while read t; do echo "$t $(ls $(dirname $t) | grep -vc truth.json) traces"; done
timeout $(( $(left) + 1 )) $PY .device/held22/pack.py $O ${CORP_MAX_MB:-9.5} $(( END - 4 ))
for f in $(find $O -name "trainer-*.json"); do [ -s $f.xz ] && rm -f $f; done  # pack cut short: no plain file back
find $O -name "trainer-*.json" -print0 | timeout 6 xargs -0 -r -P 32 xz -0 -f
find $O -name "trainer-*.json" -delete; find $O -name "*.xz.tmp" -delete
echo "all done $(( $(date +%s) - START )) s, $(mb) MB"
