#!/bin/bash
# ctl14, round s9r1 (budget 120 s): the balanced GPT FSDP bf16 control (planted_multi's gpt-fsdp-bf16-control), windows
# of 20 plain steps + one kit.capture window (record_shapes), every step instrumented (schedstat, steal, GC, probe),
# odd windows gc.disable(): is the traced host stall the job's or the profiler's? 2 GPUs (0,1), then 4.
export TEARDOWN_CUPTI=${TEARDOWN_CUPTI:-1}
s=$(date +%s)
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'; env | grep -E '^(NCCL|TORCH|TEARDOWN|CUDA)' ; } > $OUT_DIR/hw.txt 2>&1
echo "hw done $(( $(date +%s) - s )) s"
CUDA_VISIBLE_DEVICES=0,1 timeout -k 5 50 python3 hoststall.py --world 2 --windows 10 --deadline 24 --out $OUT_DIR/x2 --port 29611 > $OUT_DIR/x2.log 2>&1
echo "x2 rc=$? at $(( $(date +%s) - s )) s"
timeout -k 5 50 python3 hoststall.py --world 4 --windows 8 --deadline 20 --out $OUT_DIR/x4 --port 29612 > $OUT_DIR/x4.log 2>&1
echo "x4 rc=$? at $(( $(date +%s) - s )) s"
timeout 10 python3 slim.py $OUT_DIR/x2 $OUT_DIR/x4
echo "slim rc=$? at $(( $(date +%s) - s )) s; $(du -sh $OUT_DIR | cut -f1)"
