"""call-1 probe (not kit code): a DDP step + all_reduce sweep on 2 ranks, Kineto traces, the NCCL profiler plugin.
mode off: no plugin (timing only); idle: plugin loaded mask 0 -> timing, then start(4095) for the traced window;
on: plugin with NCCL_PROFILE_EVENT_MASK=4095 from the start (timing only)."""
import gzip, json, os, shutil, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

mode, out = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])); torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
os.makedirs(out, exist_ok=True)
x = torch.ones(1, device=dev); dist.all_reduce(x); torch.cuda.synchronize()
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(2048, 2048), torch.nn.ReLU())]).to(dev, torch.bfloat16)
ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=25)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
inp = torch.randn(64, 2048, device=dev, dtype=torch.bfloat16)
def step():
    opt.zero_grad(set_to_none=True); ddp(inp).float().square().mean().backward(); opt.step()
SIZES = [4096, 65536, 1 << 20, 16 << 20, 64 << 20]
bufs = {s: torch.ones(s // 4, device=dev) for s in SIZES}
def timing():
    rows = []
    for _ in range(5): step()
    torch.cuda.synchronize(); dist.barrier()
    for rep in range(3):
        t = time.perf_counter()
        for _ in range(20): step()
        torch.cuda.synchronize(); rows.append({"what": "ddp_step", "rep": rep, "us": (time.perf_counter() - t) / 20 * 1e6})
    for s in SIZES:
        b = bufs[s]
        for _ in range(5): dist.all_reduce(b)
        for rep in range(3):
            torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(50): dist.all_reduce(b)
            e1.record(); torch.cuda.synchronize()
            rows.append({"what": "all_reduce", "bytes": s, "rep": rep, "us": e0.elapsed_time(e1) / 50 * 1e3})
    return rows
res = {"mode": mode, "rank": rank, "rows": timing()}
if mode == "idle":
    sys.path.insert(0, os.getcwd())
    from kit.nccl_profiler import runtime
    from torch.profiler import profile, ProfilerActivity
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=acts): step()
    torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
    res["mono_before_start"] = time.clock_gettime(time.CLOCK_MONOTONIC)
    runtime.start(os.path.join(out, "nccl_profiler"), 4095)
    with profile(activities=acts, record_shapes=True) as prof:
        for _ in range(3): step()
        for s in SIZES:
            for _ in range(3): dist.all_reduce(bufs[s])
        torch.cuda.synchronize()
        if rank == 1: time.sleep(0.002)   # a late peer: rank 0's kernel waits ~2 ms
        dist.all_reduce(bufs[1 << 20]); torch.cuda.synchronize()
        ag = torch.empty(world * 65536, device=dev); dist.all_gather_into_tensor(ag, bufs[1 << 20][:65536])
        torch.cuda.synchronize()
    runtime.stop()
    p = os.path.join(out, f"kineto_rank{rank}.json"); prof.export_chrome_trace(p)
    with open(p, "rb") as f, gzip.open(p + ".gz", "wb") as g: shutil.copyfileobj(f, g)
    os.remove(p)
dist.destroy_process_group()
json.dump(res, open(os.path.join(out, f"timing_{mode}_rank{rank}.json"), "w"))
