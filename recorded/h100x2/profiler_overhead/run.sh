# ovh, budget 60 s: (1) the corpus DataLoader's next() timed without / under the profiler on this host (item: is the
# CNN fp32 control's input wait real?); (2) examples/train_ddp.py --tiny-kernels on 2 GPUs with kit.capture's
# unprofiled timing (the per-op profiler cost of the tiny-kernels job on this host, against the 2xH200 run's).
export CUDA_VISIBLE_DEVICES=0,1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; lscpu | grep -i "model name"; nproc
  python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > $OUT_DIR/env.txt 2>&1
timeout 22 python3 loader_next.py $OUT_DIR/loader_next.json cuda 2>&1 | grep -v USDT
echo "loader rc=$?"
timeout 34 python3 -m torch.distributed.run --standalone --nproc-per-node 2 examples/train_ddp.py \
  --out $OUT_DIR/tiny-kernels --tiny-kernels --active 2 > $OUT_DIR/tiny-kernels.log 2>&1
echo "tiny rc=$?"; grep '^train_ddp:' $OUT_DIR/tiny-kernels.log | tail -1; tail -3 $OUT_DIR/tiny-kernels.log
ls -la $OUT_DIR/tiny-kernels
