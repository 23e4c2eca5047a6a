# ovh round 3, budget 40 s: the 2-GPU corpus controls run unprofiled with each DataLoader next() timed on the host and
# the GPU idle it leaves measured with CUDA events (is the CNN fp32 control's input wait real without the profiler?)
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > $OUT_DIR/env.txt 2>&1
CUDA_VISIBLE_DEVICES=0,1 timeout 34 python3 -m torch.distributed.run --standalone --nproc-per-node 2 loader_idle.py \
  $OUT_DIR/x2 cnn-ddp-fp32-control gpt-ddp-bf16-control 2>&1 | grep -v USDT | grep "rank\|Error\|error" | tail -20
echo "x2 rc=${PIPESTATUS[0]}"
ls -la $OUT_DIR
