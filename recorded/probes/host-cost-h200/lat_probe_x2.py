"""1 KiB on 2 GPUs in one process: per-message wall time (N messages then sync both GPUs) and host time
(enqueue only) of the bare copy_ loop and the copy transport's steps, variants taken in turn."""
import json, statistics, sys, time
import torch
from kit import transports
from kit.investigations.p2p_transports import harness as H

class Ctx:  # enough of kit.launch.Ctx for the transport and the harness
    rank, world_size, is_cuda, backend = 0, 1, True, "nccl"
    device = torch.device("cuda", 0)
    def barrier(self): pass
    def sync(self):
        for d in (0, 1): torch.cuda.synchronize(d)

ctx = Ctx()
T = transports.get("copy")(ctx)
flows = [(0, 1, 1024)]
bufs = H.buffers(T, flows)
src, dst = bufs[0]["send"], bufs[0]["recv"]
ops = H.ops(T, flows, bufs)

def exchange_only():
    T.exchange(ops)

def no_join():
    for w in H.post(T, ops):
        w.wait()

cases = {"bare copy_": lambda: dst.copy_(src), "exchange only": exchange_only,
         "exchange + waits": no_join, "transfer (harness)": lambda: H.transfer(T, ctx, flows, bufs)}
N, R = 2000, 9
res = {k: {"wall": [], "host": []} for k in cases}
for fn in cases.values():
    for _ in range(200): fn()
ctx.sync()
for _ in range(R):
    for k, fn in cases.items():
        ctx.sync()
        t0 = time.perf_counter()
        for _ in range(N): fn()
        t1 = time.perf_counter()
        ctx.sync()
        t2 = time.perf_counter()
        res[k]["host"].append((t1 - t0) / N * 1e6)
        res[k]["wall"].append((t2 - t0) / N * 1e6)
out = {}
for k, v in res.items():
    out[k] = {m: dict(median=statistics.median(x), min=min(x), max=max(x)) for m, x in v.items()}
    print(f"{k:22s} wall {out[k]['wall']['median']:6.2f} us ({out[k]['wall']['min']:.2f}-{out[k]['wall']['max']:.2f})"
          f"  host {out[k]['host']['median']:6.2f} us", flush=True)
json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, N=N, R=R, results=out),
          open(sys.argv[1], "w"), indent=1)
