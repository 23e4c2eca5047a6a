# teardown probe for graph_gaps (issue 12): each variant under timeout; prints the destroy time per rank
for v in nccl graph profiler graph_profiler graph_profiler_freed debug_graph; do
  s=$(date +%s.%N)
  timeout 40 python3 -m torch.distributed.run --standalone --nproc-per-node 2 .scratch/gg_teardown_probe.py $v > $OUT/probe_$v.log 2>&1
  echo "$v rc=$? wall=$(python3 -c "import time;print(round(time.time()-$s,1))")" >> $OUT/probe.txt
done
cat $OUT/probe.txt; grep -h "destroy\|graph freed" $OUT/probe_*.log
