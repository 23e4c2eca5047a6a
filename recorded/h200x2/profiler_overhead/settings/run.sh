# ovh2 round s4r2, budget 250 s: the profiler's per-op cost on real jobs, by profiler setting (CUPTI only, ops only,
# both, + record_shapes, + with_stack), paired with unprofiled steps, 3 rounds; one-GPU and 2-rank jobs; a k-input op
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; lscpu | head -20; free -g
  python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count())"; } > $OUT_DIR/env.txt 2>&1
T0=$(date +%s)
step() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
Q="USDT\|warn"
step single
CUDA_VISIBLE_DEVICES=0 timeout -k 3 45 python3 probe.py $OUT_DIR --single gpt-host_sync gpt-launch_bound cnn-launch_bound gpt-control --budget-s 32 2>&1 | grep -v "$Q" | tail -20
step world2
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 68 python3 probe.py $OUT_DIR --world 2 --cases gpt-ddp-bf16-control cnn-ddp-fp32-hostbound --budget-s 42 2>&1 | grep -v "$Q" | tail -20
step p2p_off
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 35 python3 probe.py $OUT_DIR --world 2 --cases gpt-ddp-bf16-p2p_off --env NCCL_P2P_DISABLE=1 --budget-s 10 2>&1 | grep -v "$Q" | tail -20
step deep
CUDA_VISIBLE_DEVICES=0,1 timeout -k 3 45 python3 probe.py $OUT_DIR --world 2 --cases gpt-ddp-bf16-deep --rounds 2 --settings cuda,cpu,cpu_cuda_shapes --budget-s 10 2>&1 | grep -v "$Q" | tail -20
step inputs
timeout -k 3 22 python3 probe.py $OUT_DIR --inputs 2>&1 | grep -v "$Q" | tail -20
step done
ls -la $OUT_DIR; du -sh $OUT_DIR
