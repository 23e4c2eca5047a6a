# issue 12: a native stack of the graph_gaps teardown hang. A small graph_gaps (N = 10, default env) whose ranks
# wait up to 100 s in destroy_process_group; cuda-gdb (on the node; gdb is not) attached to each rank.
D=/tmp/probe; mkdir -p $D
P="-p layers=[10] -p launch_batches=[1] -p work_hidden=[] -p work_every=[] -p work_dtypes=[] -p work_tf32=false -p work_layers=10 -p control=false -p replays=3 -p env_sets=[] -p teardown_s=240"
GDB=$(which cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
s=$SECONDS
KIT_DESTROY_WAIT_S=100 timeout 200 python3 -m kit exp graph_gaps --config configs/gpu.yaml $P -p results_root=/tmp/r2 > $D/hang.log 2>&1 &
EXP=$!
for i in $(seq 1 90); do sleep 1; [ $(grep -ls "gc + synchronize" /tmp/r2/graph_gaps/*/logs/rank*.log 2>/dev/null | wc -l) -ge 2 ] && break; done
echo "ranks in teardown after $((SECONDS-s)) s" >> $D/hang.log
sleep 4
grep -h "kit: teardown" /tmp/r2/graph_gaps/*/logs/rank*.log > $D/teardown-lines.txt 2>&1
PIDS=$(pgrep -P $EXP -f "multiprocessing.spawn"; pgrep -f "multiprocessing.spawn" | sort -u)
PIDS=$(echo $PIDS | tr ' ' '\n' | sort -u)
ps -o pid,ppid,etimes,cmd -p $(echo $PIDS | tr ' ' ',') > $D/ps.txt 2>&1
GP=""
for pid in $PIDS; do
  ( timeout 60 $GDB -p $pid -batch -ex "set pagination off" -ex "info threads" -ex "thread apply all bt 40" > $D/gdb_$pid.txt 2>&1; echo "gdb rc=$?" >> $D/gdb_$pid.txt ) &
  GP="$GP $!"
done
wait $GP
for pid in $PIDS; do kill -USR1 $pid 2>/dev/null; done; sleep 1
grep -h "kit: teardown" /tmp/r2/graph_gaps/*/logs/rank*.log > $D/teardown-lines-after.txt 2>&1
cp /tmp/r2/graph_gaps/*/logs/rank*.stacks $D/ 2>/dev/null
for pid in $PIDS; do kill -9 $pid 2>/dev/null; done
wait $EXP; echo "kit exp rc=$? after $((SECONDS-s)) s" >> $D/hang.log
(cd /tmp && tar czf $OUT/probe.tgz probe)
