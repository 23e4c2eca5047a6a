"""Which resource holds a rank in destroy_process_group after graph_gaps-like work? torchrun --nproc-per-node 2.
argv[1]: variant = nccl | graph | graph_profiler | graph_profiler_freed | profiler | debug_graph"""
import gc, os, sys, time
import torch, torch.distributed as dist

v = sys.argv[1]
rank = int(os.environ["RANK"]); torch.cuda.set_device(rank)
dev = torch.device("cuda", rank)
dist.init_process_group("nccl", device_id=dev)
t0 = time.time()
def log(*a): print(f"[{v} r{rank} +{time.time()-t0:.2f}s]", *a, flush=True)
ws = [torch.randn(1024, 1024, device=dev) / 32 for _ in range(4)]
x = torch.randn(256, 1024, device=dev)
def fwd():
    y = x
    for w in ws:
        y = y @ w; dist.all_reduce(y)
    return y
g = None
with torch.inference_mode():
    fwd(); torch.cuda.synchronize()
    if "graph" in v:
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fwd()
        torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph(keep_graph=True) if "debug" in v else torch.cuda.CUDAGraph()
        if "debug" in v: g.enable_debug_mode()
        with torch.cuda.graph(g):
            fwd()
        if "debug" in v: g.debug_dump(f"/tmp/probe_{rank}.dot")
        run = g.replay
    else:
        run = fwd
    for _ in range(5): run()
    torch.cuda.synchronize()
    if "profiler" in v:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(3): run()
            torch.cuda.synchronize()
        p.export_chrome_trace(f"/tmp/probe_{v}_{rank}.json")
        del p
log("work done")
if "freed" in v:
    del run, g; gc.collect(); torch.cuda.synchronize(); log("graph freed")
t = time.time(); dist.destroy_process_group(); log(f"destroy_process_group {time.time()-t:.2f}s")
sys.stdout.flush(); os._exit(0)
