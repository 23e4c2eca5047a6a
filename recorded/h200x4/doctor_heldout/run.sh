#!/bin/bash
# held16's device script (PLAN=s10r1: round s10r1b, 280 s, ran on 2x H200 at world 2 as 4 GPUs were not lent;
# PLAN=s10r2: round s10r2, 250 s, ran on 2x H200 at world 2 again; PLAN=s10r3: 240 s, the 3- and 4-GPU runs, on 4
# GPUs only): jobs the doctor was not built around, recorded to judge `kit doctor` blind (the doctor of main
# 23f7b9c, carried in the snapshot, reads every case whole on the machine at the end).
# Held out on purpose: the "rec" family (embedding-bag + MLP recommender), DDP static_graph + gradient_as_bucket_view,
# a DataLoader with 2 persistent workers, torch.profiler with schedule(wait=1, warmup=2, active=5), shapes + stacks +
# memory, an on_trace_ready of its own writing trainer-<pid>-<n>.json; 3 GPUs (0,1,2) and 4; faults on rank 3 / rank 0.
#  rec_set:   rec, control + stall_rank + gpu_rank + cpu_rank timed by turns in one job (ABCD DCBA)
#  fsdp_set:  GPT FSDP2 bf16 under that profiler: control + stall_rank + gpu_rank by turns
#  rec_input: rec, control vs input_rank (the hashing in one rank's 2 workers), interleaved
#  rec_accum: rec, accumulation with no_sync vs without, interleaved
#  rec_tiny:  rec, tiny buckets (bucket_cap_mb 0.05) after its control, one spawn (a DDP option: not a toggle)
# Each run its own timeout; then kit doctor --json on every case (whole traces), then pack.py (lzma, cut to 2 steps
# if big). On a machine of 2 GPUs every run is at world 2. Dry mode: CORP_DEVICE=cpu CORP_NGPU=4 CORP_HW=dry
# CORP_STEPS=3 CORP_ALT=2 CORP_PY=python.
PLAN=${PLAN:-s10r1}
TOTAL=272; [ $PLAN = s10r2 ] && TOTAL=242; [ $PLAN = s10r3 ] && TOTAL=232
START=$(date +%s); END=$((START + ${CORP_TOTAL:-$TOTAL}))
O=${OUT_DIR:?}
left() { echo $(( END - $(date +%s) )); }
min() { echo $(( $1 < $2 ? $1 : $2 )); }
PY=${CORP_PY:-python3}
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; free -g; lscpu | head -30
  $PY -c 'import torch,sys,os; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else None, torch.cuda.device_count()); print("affinity", sorted(os.sched_getaffinity(0)))'
  $PY -c 'import torchvision; print("torchvision", torchvision.__version__)'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|TEARDOWN)_' ; } > $O/hw.txt 2>&1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
case "$GPU" in *H100*) HW=h100;; *H200*) HW=h200;; *) HW=${CORP_HW:-dry}; NG=${CORP_NGPU:-4};; esac
echo "$HW x$NG ($GPU)" > $O/hw_kind.txt
echo "hw $HW x$NG ($GPU) done $(( $(date +%s) - START )) s"
mb() { du -sm $O | cut -f1; }
TAIL=${CORP_TAIL:-40}  # kept for the doctor and the packing
run() {  # run WORLD SUB CAP RANK ARGS...: planted_multi on GPUs 0..WORLD-1 into $O/<hw tag>/SUB
  local w=$1 sub=$2 cap=$3 rank=$4; shift 4
  # a machine of 2 GPUs (4 not lent): every run at world 2, the fault on rank 1 (rank 0 where it was 0)
  [ $NG -lt 4 ] && { w=2; rank=$(min $rank 1); }
  local B=$(min $cap $(( $(left) - TAIL ))) dev=0,1,2,3 tag=${HW}x4
  [ $w = 3 ] && { dev=0,1,2; tag=${HW}x3-of-$NG; }
  [ $w = 2 ] && { dev=0,1; tag=${HW}x2; }
  local dir=$O/$tag/$sub
  [ $w -gt $NG ] && { echo "skip x$w $sub: $NG GPUs"; return; }
  [ $B -lt 25 ] && { echo "skip x$w $sub: $B s"; return; }
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$dev PLANTED_MULTI_RANK=$rank timeout -k 3 $B \
    $PY tests/corpus/planted_multi.py --device ${CORP_DEVICE:-cuda} \
    --world $w --out $dir --budget-s $((B - 3)) --warm ${CORP_WARM:-5} "$@" 2>&1 \
    | grep -v "^USDT\|^$\|_warn_once\|UserWarning\|warnings.warn\|CPUAllocator\|profiler results will not"
  echo "x$w $sub rc=${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s, done at $(( $(date +%s) - START )) s (budget $B s), $(mb) MB"
}
S=${CORP_STEPS:-30}; A=${CORP_ALT:-6}
if [ $PLAN = s10r3 ]; then  # only on 4 GPUs: the 3- and 4-GPU runs, the most telling first
  run 4 rec_set 50 3 --pair rec_set --steps $(( S > 4 ? S * 4 / 5 : S )) --alternations $A
  run 3 fsdp_set 45 0 --pair fsdp_set --steps $(( S > 4 ? S * 4 / 5 : S )) --alternations $A --profiler json_handler
  run 3 rec_set_r0 45 0 --pair rec_set --steps $(( S > 4 ? S * 4 / 5 : S )) --alternations $A
  run 3 rec_accum 42 1 --pair rec_accum --steps $(( S > 4 ? S * 4 / 5 : S )) --alternations $A
  run 4 rec_input 40 1 --pair rec_input --steps $S --alternations $A
elif [ $PLAN = s10r2 ]; then
  run 4 rec_set 50 3 --pair rec_set --steps $(( S > 4 ? S * 4 / 5 : S )) --alternations $A
  run 3 fsdp_set 45 0 --pair fsdp_set --steps $(( S > 4 ? S * 4 / 5 : S )) --alternations $A --profiler json_handler
  run 4 rec_input 40 1 --pair rec_input --steps $S --alternations $A
  run 3 rec_set_r0 45 0 --pair rec_set --steps $(( S > 4 ? S * 4 / 5 : S )) --alternations $A
  run 3 rec_accum 40 1 --pair rec_accum --steps $S --alternations $A
else
  run 4 rec_set 62 3 --pair rec_set --steps $S --alternations $A
  run 3 fsdp_set 55 0 --pair fsdp_set --steps $(( S > 4 ? S * 4 / 5 : S )) --alternations $A --profiler json_handler
  run 4 rec_input 45 1 --pair rec_input --steps $S --alternations $A
  run 3 rec_accum 45 1 --pair rec_accum --steps $S --alternations $A
  run 4 rec_tiny 45 3 --cases rec-ddp-bf16-control,rec-ddp-bf16-tiny_buckets --steps $(( S * 2 ))
fi
pgrep -af "while os.getppid" | head -3  # no spinner outlives its rank (a check)
# a case left without truth.json (its run cut by the timeout) is of no use: its traces go
for d in $(find $O -mindepth 3 -maxdepth 3 -type d); do [ -e $d/truth.json ] || { echo "incomplete: $d"; rm -rf $d; }; done
echo "recording done $(( $(date +%s) - START )) s, $(mb) MB"
# the doctor of this snapshot on every case, whole traces, in parallel (nothing else runs now); its JSON beside
doc() {  # doc CASE_DIR: $O/doctor/<tag>/<sub>/<case>.json
  local rel=${1#$O/} out=$O/doctor/${1#$O/}
  mkdir -p $(dirname $out)
  timeout 30 $PY -m kit doctor --json --no-cache --workers 4 $1/trainer-*.json > $out.json 2> $out.err; echo "rc=$?" > $out.rc; }
export -f doc; export PY O
find $O -name truth.json -printf '%h\n' | xargs -P $(( $(nproc) / 5 > 1 ? $(nproc) / 5 : 1 )) -I{} bash -c 'doc {}'
echo "doctor done $(( $(date +%s) - START )) s"
timeout $(( $(left) + 2 )) $PY recorded/h200x4/doctor_heldout/pack.py $O ${CORP_MAX_MB:-10} $(( END - 4 ))
find $O -name "trainer-*.json" -delete
echo "all done $(( $(date +%s) - START )) s, $(mb) MB"
