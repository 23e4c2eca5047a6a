"""Issue 12, open question: does the growing gap need NCCL, or only NCCL's graph structure?
No NCCL: per layer a GEMM on the capture stream, a tiny kernel on a side stream (the 'collective'), joined back;
with external=True the side stream also records ONE shared external event after every tiny kernel (what NCCL's
ncclStrongStreamRelease adds with mixing support: cudaGraphAddEventRecordNode of serialEvent). One GPU."""
import gzip, json, os, shutil, time
import torch
from torch.profiler import ProfilerActivity, profile

torch.backends.cuda.matmul.allow_tf32 = False
out = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
res = {}


def build(N, hidden, external):
    a = torch.randn(1024, hidden, device=dev)
    w = torch.randn(hidden, hidden, device=dev) / hidden ** 0.5
    small = torch.zeros(1, device=dev)
    side = torch.cuda.Stream()
    E = torch.cuda.Event(external=True) if external else None

    def body():
        x = a
        for _ in range(N):
            x = torch.tanh(x @ w)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                small.add_(1.0)
                if E is not None:
                    E.record(side)
            torch.cuda.current_stream().wait_stream(side)
        return x

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    torch.cuda.synchronize()
    return g, (a, w, small, side, E)


for hidden in (2048, 4096):
    for N in (160, 640):
        for external in (False, True):
            key = f"h{hidden}_n{N}_{'ext' if external else 'plain'}"
            try:
                g, keep = build(N, hidden, external)
                g.replay(); torch.cuda.synchronize()
                st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ts = []
                for _ in range(5):
                    st.record(); g.replay(); en.record(); en.synchronize()
                    ts.append(st.elapsed_time(en) * 1e3)
                res[key] = dict(replay_us=sorted(ts)[2], per_layer_us=sorted(ts)[2] / N)
                if N == 640 or hidden == 2048:
                    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                        g.replay(); torch.cuda.synchronize()
                    p = f"/tmp/{key}.json"
                    prof.export_chrome_trace(p)
                    with open(p, "rb") as fi, gzip.open(f"{out}/{key}.json.gz", "wb") as fo:
                        shutil.copyfileobj(fi, fo)
                del g, keep
            except Exception as e:  # noqa: BLE001
                res[key] = dict(error=repr(e)[:300])
            print(key, res[key], flush=True)
json.dump(res, open(f"{out}/nonccl.json", "w"), indent=1)
