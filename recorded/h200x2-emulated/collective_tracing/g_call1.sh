# issues 12/14/15 verification, call 1 (2x H200). Sections log to $OUT/log.txt; each result dir is tarred into $OUT.
source .scratch/gpu_setup.sh
L=$OUT/log.txt; T0=$SECONDS
say() { echo "[$((SECONDS-T0))s] $*" | tee -a $L; }
NCCL_HOME=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
[ -e $NCCL_HOME/lib/libnccl.so ] || ln -sf $(ls $NCCL_HOME/lib/libnccl.so.* | head -1) $NCCL_HOME/lib/libnccl.so
(which mpirun mpicc cuda-gdb gdb eu-stack gcore py-spy; ls /usr/local/cuda/bin/cuda-gdb) > $OUT/which.txt 2>&1
# --- background CPU builds: nccl-tests MPI=1 all_reduce_perf, the NCCL profiler plugin
B=/tmp/ntm; M=$(dirname $(mpicc --showme:incdirs | cut -d' ' -f1))
( cd .nccl-tests/src && timeout 120 make -j16 MPI=1 MPI_HOME=$M NCCL_HOME=$NCCL_HOME CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR=$B $B/all_reduce_perf > /tmp/ntm-build.log 2>&1; echo "rc=$?" >> /tmp/ntm-build.log ) &
BUILD1=$!
( timeout 120 python3 -m kit.nccl_profiler build --nccl-src .nccl-profiler/src > /tmp/ncp-build.log 2>&1; echo "rc=$?" >> /tmp/ncp-build.log ) &
BUILD2=$!
# --- 12: native stack of a hanging teardown (small graph_gaps, destroy wait 100 s), cuda-gdb attached to rank 0
bash .scratch/g_stack.sh > /tmp/probe-driver.log 2>&1; say "stack probe done"
wait $BUILD1 $BUILD2; say "builds: $(tail -1 /tmp/ntm-build.log) / $(tail -1 /tmp/ncp-build.log)"
# --- 12: the whole graph_gaps notebook
s=$SECONDS
timeout 290 python3 -m kit run graph_gaps --config configs/gpu.yaml --results-root /tmp/gg > /tmp/gg-run.log 2>&1
say "graph_gaps kit run rc=$? wall=$((SECONDS-s))s"
grep -h "kit: teardown" /tmp/gg/graph_gaps/*/logs/rank*.log >> $L; python3 -c "import json,glob;[print(f, json.load(open(f)).get('warnings')) for f in sorted(glob.glob('/tmp/gg/graph_gaps/*/meta.json'))]" >> $L
mkdir -p /tmp/gg/figs && cp figures/graph_gaps-*.png /tmp/gg/figs/ 2>/dev/null; cp /tmp/gg-run.log /tmp/gg/
(cd /tmp && tar czf $OUT/gg.tgz gg); nvidia-smi --query-compute-apps=pid,process_name --format=csv >> $L
# --- 15: collective_tracing on 2 emulated nodes with the NCCL profiler plugin
s=$SECONDS
timeout 150 python3 -m kit exp collective_tracing --config configs/gpu.yaml --nodes 2 -p nccl_profiler=auto -p fr_demo=false \
  -p ddp_layers=4 -p hidden=2048 -p tp_layers=2 -p tp_tokens=2048 -p tp_hidden=2048 -p warmup_steps=2 -p timed_steps=5 \
  -p profile_steps=2 -p 'nccl_cost_sizes=[65536,1048576,16777216]' -p label=emulated-nccl-profiler -p results_root=/tmp/ncp > /tmp/ncp-exp.log 2>&1
say "collective_tracing emulated rc=$? wall=$((SECONDS-s))s"; tail -3 /tmp/ncp-exp.log >> $L
nvidia-smi --query-compute-apps=pid,process_name --format=csv >> $L
cp /tmp/ncp-build.log /tmp/ncp-exp.log /tmp/ncp/ 2>/dev/null; cp .nccl-profiler/plugin.json /tmp/ncp/ 2>/dev/null
(cd /tmp && tar czf $OUT/ncp.tgz ncp)
# --- 14: nccl-tests under mpirun, one cheap probe (1 MiB, NCCL_HOSTID per rank), then the emulated collectives via the CLI
bash .scratch/g_emu.sh > /tmp/emu-driver.log 2>&1; say "emulated done"
say "all done"; ls -la $OUT
