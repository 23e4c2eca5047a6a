#!/bin/bash
# p2p11, session 7 round s7r1 (budget 110 s; this script stops itself by ~105 s). Code: COMMIT from this snapshot.
# The copy-out limit measured in kit's own bandwidth part: at 256 MiB both ways only, copy / ipc / ipc-direct, with
# the new reference "copy + local copy_" (copy both ways with a local copy_ of 256 MiB beside it on each receiving
# GPU, timed in turn with copy's own rounds) -- 1. on the 4 GPUs, 2. on GPUs 0,1 -- and benchmarks/bench_p2p.py on
# each result. 20 samples of 10 rounds, no profile; the 4-GPU pair matrix at 1 KiB (it runs with >2 GPUs; cheap).
# Each step has its own timeout and writes into $OUT_DIR as it goes.
set -u
O=${OUT_DIR:?OUT_DIR}
cd "$(dirname "$0")"
HERE=$PWD
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD GIT_CEILING_DIRECTORIES=$(dirname "$PWD")
T0=$(date +%s); now() { echo $(( $(date +%s) - T0 )); }; left() { echo $(( $1 - $(now) )); }
PY=${P2P11_PY:-python3}
GPU=1; command -v nvidia-smi > /dev/null || GPU=0
cleanup() {  # any process of this snapshot left holding a GPU (never this script or its parents)
  local me=$$ p cwd
  for p in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$p" = "$me" ] && continue
    cwd=$(readlink /proc/$p/cwd 2>/dev/null) || continue
    case "$cwd" in "$HERE"*) ;; *) continue;; esac
    if grep -qa -e multiprocessing -e torch.distributed /proc/$p/cmdline 2>/dev/null; then
      kill -9 $p 2>/dev/null && echo "cleanup: killed $p $(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-80)"
    fi
  done
}
{ date -u; cat COMMIT 2>/dev/null; [ $GPU = 1 ] && { nvidia-smi -L; nvidia-smi topo -m;
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.memory,clocks.max.sm --format=csv; }
  nproc; $PY -c 'import torch,sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None, "gpus", torch.cuda.device_count())'
  env | grep -E '^(NCCL|TORCH|CUDA|NVSHMEM|PYTHONPATH)' | sort; } > $O/machine.txt 2>&1
echo "machine at $(now) s"

if [ $GPU = 1 ]; then
  CFG=configs/gpu.yaml
  BW="-p transports=[copy,ipc,ipc-direct] -p parts=[bandwidth] -p min_bytes=268435456 -p max_bytes=268435456 -p directions=[both] -p repeats=20 -p iters=10 -p profile=false -p matrix_bytes=1024"
else  # CPU dry run: the same script end to end (gloo; no references on CPU)
  CFG=configs/cpu-smoke.yaml
  BW="-p transports=[gloo] -p parts=[bandwidth] -p min_bytes=1024 -p max_bytes=4096 -p directions=[both] -p repeats=3"
fi
step() {  # name, visible GPUs, seconds
  local name=$1 vis=$2 secs=$3 L
  L=$(left 100); [ "$L" -lt "$secs" ] && secs=$L
  [ "$secs" -ge 15 ] || { echo "skip $name: ${L} s left"; return; }
  CUDA_VISIBLE_DEVICES=$vis timeout -k 3 $secs $PY -m kit exp p2p_transports --config $CFG $BW -p label=$name \
    -p results_root=$O/$name > $O/$name.log 2>&1
  echo "kit bandwidth $name rc=$? at $(now) s"; cleanup
  local run; run=$(ls -d $O/$name/p2p_transports/*/ 2>/dev/null | head -1)
  if [ -n "$run" ]; then
    timeout -k 2 12 $PY benchmarks/bench_p2p.py --run $run > $O/bench-$name.txt 2>&1
    echo "bench $name rc=$? at $(now) s"
  fi
}
step x4 0,1,2,3 55
step x2 0,1 45
find $O -name '*.json.gz' -size +2M -print -delete
du -sh $O; echo "done at $(now) s"
