# issue 14, call 2: nccl-tests (MPI=1, all_reduce_perf only) under mpirun on the emulated nodes, via the kit's step
source .scratch/gpu_setup.sh
NCCL_HOME=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
[ -e $NCCL_HOME/lib/libnccl.so ] || ln -sf $(ls $NCCL_HOME/lib/libnccl.so.* | head -1) $NCCL_HOME/lib/libnccl.so
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$LD_LIBRARY_PATH
B=/tmp/ntm; M=$(dirname $(mpicc --showme:incdirs | cut -d' ' -f1)); s=$(date +%s)
(cd .nccl-tests/src && timeout 65 make -j32 MPI=1 MPI_HOME=$M NCCL_HOME=$NCCL_HOME CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR=$B $B/all_reduce_perf) > $OUT/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - s ))s MPI_HOME=$M"; ldd $B/all_reduce_perf 2>&1 | grep -i "mpi\|not found" | head -3
timeout 58 python .scratch/emu_nccl_tests.py $B > $OUT/after.log 2>&1; echo "after rc=$? $(( $(date +%s) - s ))s"; tail -3 $OUT/after.log
cd /tmp/emu2 && tar czf $OUT/run2.tgz collectives; grep -h "via NET\|nNodes\|NCCL_HOSTID set" collectives/*/nccl-tests.log | sort | uniq -c | head
