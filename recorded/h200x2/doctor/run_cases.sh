# The device script that made this folder (nvidia-h200-x2, run from the repository root with $OUT set):
# every case of examples/train_ddp.py on 2 ranks, a collectives sweep, and check_traces.py's table.
# .scratch/gpu_setup.sh installs the wheels the node lacks (msgspec) and puts the checkout on PYTHONPATH.
source .scratch/gpu_setup.sh
D=/tmp/doc; mkdir -p $D
python3 -c "import torch, socket; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count(), socket.gethostname())"
nvidia-smi topo -m
T0=$SECONDS
case_() {  # case_ NAME [VAR=VALUE ...] [train_ddp flags ...]
  local name=$1; shift; local envs=(); while [[ $# -gt 0 && $1 == *=* ]]; do envs+=("$1"); shift; done
  local t=$SECONDS
  timeout ${CASE_TIMEOUT:-60} env "${envs[@]}" python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    examples/train_ddp.py --out $D/$name "$@" > $D/$name.log 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS-t))s env=[${envs[*]}] flags=[$*]: $(grep '^train_ddp:' $D/$name.log | tail -1)"
  [ $rc -eq 0 ] || tail -15 $D/$name.log
  cp $D/$name.log $D/$name/ 2>/dev/null
}
pack() { local tn=$1; shift; (cd $D && tar czf $OUT/$tn "$@" 2>/dev/null); ls -la $OUT/$tn | awk '{print $5, $9}'; }
case_ clean --flight-recorder
case_ p2p-disabled NCCL_P2P_DISABLE=1
case_ per-param-allreduce --per-param-allreduce
case_ item --item
case_ late-rank --late-rank 1 --late-ms 200 --flight-recorder
pack cases_a.tgz clean p2p-disabled per-param-allreduce item late-rank
case_ tiny-kernels --tiny-kernels --active 2
case_ pageable --pageable
case_ h2d-on-compute-stream --h2d-on-compute-stream
case_ contention --contention
pack cases_b.tgz tiny-kernels pageable h2d-on-compute-stream contention
echo "cases so far: $((SECONDS-T0))s"
t=$SECONDS
timeout 120 python3 -m kit exp collectives --config configs/gpu.yaml -p results_root=/tmp/res > /tmp/sweep.log 2>&1
echo "sweep rc=$? $((SECONDS-t))s"; tail -2 /tmp/sweep.log
for d in /tmp/res/collectives/*/; do python3 -c "from kit import results; print(results.record('$d', root='/tmp/rec'))"; done
cp /tmp/sweep.log /tmp/rec/; (cd /tmp && tar czf $OUT/sweep.tgz rec) && ls -la $OUT/sweep.tgz | awk '{print $5, $9}'
case_ cuda-graph-per-param --cuda-graph --per-param-allreduce
case_ cuda-graph-per-param-mixing0 NCCL_GRAPH_MIXING_SUPPORT=0 --cuda-graph --per-param-allreduce
pack cases_c.tgz cuda-graph-per-param cuda-graph-per-param-mixing0
echo "all: $((SECONDS-T0))s"
python3 recorded/doctor/h200x2-20261123/check_traces.py $D --json $OUT/checks.json > $OUT/checks.txt 2>&1; cat $OUT/checks.txt
