# issues 12/14, call 2 (2x H200): (1) graph_gaps' teardown with the census out of debug mode (every graph kind,
# both env sets, small sizes): does destroy_process_group return? (2) emulated collectives with nccl-tests on torch's NCCL
source .scratch/gpu_setup.sh
L=$OUT/log.txt; T0=$SECONDS
say() { echo "[$((SECONDS-T0))s] $*" | tee -a $L; }
NCCL_HOME=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
[ -e $NCCL_HOME/lib/libnccl.so ] || ln -sf $(ls $NCCL_HOME/lib/libnccl.so.* | head -1) $NCCL_HOME/lib/libnccl.so
B=/tmp/ntm; M=$(dirname $(mpicc --showme:incdirs | cut -d' ' -f1))
( cd .nccl-tests/src && timeout 120 make -j16 MPI=1 MPI_HOME=$M NCCL_HOME=$NCCL_HOME CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR=$B $B/all_reduce_perf > /tmp/ntm-build.log 2>&1; echo "rc=$?" >> /tmp/ntm-build.log ) &
BUILD1=$!
P="-p layers=[10,40] -p launch_batches=[1,16] -p work_layers=40 -p work_hidden=[1024] -p work_every=[4] -p work_dtypes=[] -p work_tf32=false -p replays=3 -p keep_traces=[]"
s=$SECONDS
timeout 200 python3 -m kit exp graph_gaps --config configs/gpu.yaml $P -p results_root=/tmp/gg2 > /tmp/gg2.log 2>&1
say "graph_gaps small rc=$? wall=$((SECONDS-s))s"; tail -3 /tmp/gg2.log >> $L
grep -H "kit: teardown" /tmp/gg2/graph_gaps/*/logs/rank*.log >> $L
python3 -c "import json,glob;[print(f, json.load(open(f)).get('warnings')) for f in sorted(glob.glob('/tmp/gg2/graph_gaps/*/meta.json'))]" >> $L
cp /tmp/gg2.log /tmp/gg2/; (cd /tmp && tar czf $OUT/gg2.tgz --exclude='*.json.gz' gg2)
wait $BUILD1; say "build: $(tail -1 /tmp/ntm-build.log)"
s=$SECONDS
timeout 200 python3 -m kit exp collectives --config configs/emulated-nodes.yaml --nodes 2 -p repeats=3 -p nccl_tests=$B/all_reduce_perf \
  -p results_root=/tmp/emu2 > /tmp/emu2.log 2>&1
say "emulated collectives rc=$? wall=$((SECONDS-s))s"; tail -2 /tmp/emu2.log >> $L
grep -h "nccl-library" /tmp/emu2/collectives/*/nccl-tests.log >> $L
nvidia-smi --query-compute-apps=pid,process_name --format=csv >> $L
cp /tmp/emu2.log /tmp/emu2/; (cd /tmp && tar czf $OUT/emu2.tgz emu2)
say "all done"
