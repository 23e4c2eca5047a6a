"""Host cost per call (us) of the pieces of the 1 KiB copy path, on one GPU: old vs new Work/join variants."""
import json, statistics, sys, time
import torch
from kit.transports import copy as C
from kit.transports.base import Work

d = 0
torch.cuda.set_device(d)
a = torch.ones(256, device="cuda:0")
b = torch.empty(256, device="cuda:0")
side = torch.cuda.Stream(0)
main = torch.cuda.current_stream(0)
ev = torch.cuda.Event()

def old_after(stream, device):
    def wait():
        cur = torch.cuda.current_stream(device)
        if cur != stream:
            cur.wait_stream(stream)
    return Work(wait, stream.query)

def old_pair():
    s = torch.cuda.current_stream(0), torch.cuda.current_stream(0)
    ws = [old_after(s[0], 0), old_after(s[1], 0)]
    for w in ws: w.wait()

def new_pair():
    s = C._current_id(0), C._current_id(0)
    ws = [C._after(s[0], 0), C._after(s[1], 0)]
    for w in ws: w.wait()

def old_join():
    m = torch.cuda.current_stream(0)
    m.wait_stream(side)

def new_join():
    m = torch.cuda.current_stream(0)
    ev.record(side)
    m.wait_event(ev)

cases = {
    "copy_ 1KiB same device": lambda: b.copy_(a),
    "torch.cuda.current_stream": lambda: torch.cuda.current_stream(0),
    "_cuda_getCurrentStream": lambda: torch._C._cuda_getCurrentStream(0),
    "old pair bookkeeping (2 Works + waits)": old_pair,
    "new pair bookkeeping (2 Works + waits)": new_pair,
    "old join (wait_stream, fresh event)": old_join,
    "new join (reused event)": new_join,
}
N, R = 5000, 7
out = {}
for name, fn in cases.items():
    for _ in range(500): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(R):
        t0 = time.perf_counter()
        for _ in range(N): fn()
        ts.append((time.perf_counter() - t0) / N * 1e6)
        torch.cuda.synchronize()
    out[name] = dict(median_us=statistics.median(ts), min_us=min(ts), max_us=max(ts))
    print(f"{name:45s} {statistics.median(ts):7.2f} us  ({min(ts):.2f}-{max(ts):.2f})", flush=True)
json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, results=out), open(sys.argv[1], "w"), indent=1)
