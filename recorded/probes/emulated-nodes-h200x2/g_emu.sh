# issue 14: (1) why nccl-tests under mpirun got no numbers: a 1 MiB probe, then 64 MiB + 1 GiB, each timed;
# (2) the emulated collectives through the CLI with the MPI build as reference; (3) the launcher SIGKILLed mid-run:
# does any worker survive holding a GPU?
D=/tmp/emu; mkdir -p $D/notes; N=$D/notes
NT=/tmp/ntm/all_reduce_perf
MPI="mpirun --allow-run-as-root -np 2 --bind-to none -x NCCL_DEBUG=INFO -x NCCL_NET=Socket -x NCCL_SOCKET_IFNAME=lo"
HID='NCCL_HOSTID=probe-kit-node$OMPI_COMM_WORLD_RANK exec "$@"'
ldd $NT | grep -i -E "mpi|nccl" > $N/ldd.txt 2>&1
s=$(date +%s.%N)
timeout 40 $MPI sh -c "$HID" sh $NT -b 1048576 -e 1048576 -g 1 -w 2 -n 5 -c 0 > $N/mpirun-1MiB.log 2>&1
echo "rc=$? wall=$(python3 -c "import time;print(round(time.time()-$s,1))") s" >> $N/mpirun-1MiB.log
HUNG=$(grep -c "^rc=124" $N/mpirun-1MiB.log)
[ "$HUNG" = 0 ] || NT="''"   # mpirun hangs even at 1 MiB: no reference from it in the kit run either
s=$(date +%s.%N)
[ "$HUNG" = 0 ] && timeout 90 $MPI sh -c "$HID" sh $NT -b 67108864 -e 1073741824 -f 16 -g 1 -w 5 -n 20 -c 0 > $N/mpirun-64MiB-1GiB.log 2>&1
echo "rc=$? wall=$(python3 -c "import time;print(round(time.time()-$s,1))") s" >> $N/mpirun-64MiB-1GiB.log
# (2) the kit's path: sweep + launcher-side nccl-tests (plain and -G) at the same sizes, same env
s=$SECONDS
timeout 200 python3 -m kit exp collectives --config configs/emulated-nodes.yaml --nodes 2 -p repeats=3 -p nccl_tests=$NT \
  -p results_root=$D > $N/collectives.log 2>&1
echo "rc=$? wall=$((SECONDS-s)) s" >> $N/collectives.log
sleep 2; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > $N/gpu-apps-after-run.txt 2>&1
ps -eo pid,ppid,cmd | grep -E "torch.distributed.run|kit exp|multiprocessing" | grep -v grep >> $N/gpu-apps-after-run.txt
# (3) SIGKILL the launcher while the ranks run
python3 -m kit exp collectives --config configs/emulated-nodes.yaml --nodes 2 -p max_bytes=268435456 -p repeats=50 -p "nccl_tests=''" \
  -p results_root=/tmp/emukill > $N/kill-test-launcher.log 2>&1 &
LP=$!
for i in $(seq 1 40); do sleep 1; [ $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l) -ge 2 ] && break; done
sleep 3
{ echo "before kill (launcher $LP, $i s):"; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv;
  ps -eo pid,ppid,pgid,sid,cmd | grep -E "torch.distributed.run|kit exp|kit.launch" | grep -v grep; } > $N/kill-test.txt 2>&1
kill -9 $LP; t=$SECONDS
for i in $(seq 1 20); do sleep 1; [ $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l) -eq 0 ] && break; done
{ echo "after kill -9 of the launcher: $((SECONDS-t)) s"; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv;
  ps -eo pid,ppid,pgid,sid,cmd | grep -E "torch.distributed.run|kit exp|kit.launch" | grep -v grep; } >> $N/kill-test.txt 2>&1
for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do kill -9 $p; done  # leftovers (mine) before the next GPU step
ls /tmp/emukill/collectives/*/logs/ >> $N/kill-test.txt 2>&1; tail -3 /tmp/emukill/collectives/*/logs/*.log >> $N/kill-test.txt 2>&1
(cd /tmp && tar czf $OUT/emu.tgz emu)
