# issue 12, call 3: (1) the teardown bound on a small graph_gaps (both env sets); (2) where destroy_process_group waits
source .scratch/gpu_setup.sh
D=/tmp/dbg; mkdir -p $D
P="-p layers=[10,40] -p launch_batches=[1] -p work_hidden=[] -p work_every=[] -p work_dtypes=[] -p work_tf32=false -p work_layers=40 -p control=false -p replays=3"
s=$(date +%s); timeout 200 python3 -m kit exp graph_gaps --config configs/gpu.yaml $P -p results_root=/tmp/r1 > $D/small.log 2>&1; echo "exit $? after $(( $(date +%s) - s )) s" >> $D/small.log
which gdb > $D/gdb.txt 2>&1
( KIT_DESTROY_WAIT_S=90 timeout 200 python3 -m kit exp graph_gaps --config configs/gpu.yaml $P -p env_sets=[] -p teardown_s=200 -p results_root=/tmp/r2 > $D/hang.log 2>&1 ) &
for i in $(seq 1 150); do sleep 1; grep -qs "gc + synchronize" /tmp/r2/graph_gaps/*/logs/rank0.log && break; done
sleep 3; ps -eo pid,ppid,cmd | grep -E "spawn|kit exp" | grep -v grep > $D/ps.txt
for pid in $(pgrep -f "multiprocessing.spawn"); do
  echo "=== pid $pid" >> $D/stacks.txt
  for t in /proc/$pid/task/*; do echo "--- $(cat $t/comm) wchan=$(cat $t/wchan)" >> $D/stacks.txt; cat $t/stack >> $D/stacks.txt 2>/dev/null; done
  [ -x "$(which gdb 2>/dev/null)" ] && timeout 60 gdb -p $pid -batch -ex "thread apply all bt 25" > $D/gdb_$pid.txt 2>&1
  kill -USR1 $pid
done
sleep 2; cp /tmp/r2/graph_gaps/*/logs/rank*.stacks $D/ 2>/dev/null; grep -h -A5 teardown /tmp/r2/graph_gaps/*/logs/rank*.log > $D/teardown2.txt 2>&1
wait; tail -5 $D/small.log; grep -h teardown /tmp/r1/graph_gaps/*/logs/rank*.log; grep -ho '"warnings": \[[^]]*\]' /tmp/r1/graph_gaps/*/meta.json
tar czf $OUT/dbg.tgz -C $D . ; ls $D
