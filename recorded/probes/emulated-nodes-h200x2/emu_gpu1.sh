# issue 14: the three investigations on 2 emulated nodes (2 agents x 1 GPU), one batch
source .scratch/gpu_setup.sh
(which mpirun mpicc; ls -d /usr/lib/x86_64-linux-gnu/openmpi /opt/hpcx 2>&1; ip -brief addr; ls /sys/class/infiniband 2>&1) > $OUT/host.txt 2>&1
C=configs/emulated-nodes.yaml
R=/tmp/emu
for n in collectives dataloader_sync p2p_transports; do
  s=$(date +%s)
  timeout $([ $n = dataloader_sync ] && echo 230 || echo 160) python -m kit exp $n --config $C -p results_root=$R > $OUT/$n.log 2>&1
  echo "rc=$? wall=$(( $(date +%s) - s ))s" >> $OUT/$n.log
  tail -2 $OUT/$n.log
done
cd $R && tar czf $OUT/runs.tgz --exclude=_data --exclude='*.pkl' collectives dataloader_sync p2p_transports
ls -la $OUT
