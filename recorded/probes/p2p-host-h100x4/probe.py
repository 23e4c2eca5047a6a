"""Where the host time of the in-process (``copy``) 1F1B pipeline goes, one process driving every GPU.

    python probe.py OUT.json [--stages 4] [--iters 15]

Measures, in one process (no process group), on the kit's pipeline code (kit.investigations.p2p_transports):

* ``parts``: each stage's forward and backward alone (GPU time by CUDA events, host time to issue), as the
  pipeline experiment's parts;
* ``pipeline``: iterations of the 1F1B pipeline per variant -- wall time per iteration (synchronised), the host's
  time per stage (:func:`drive`'s ``host``), in the forward/backward calls, and in the transfer path's functions
  (``isend``, ``irecv``, ``Stage._buffer``, ``_issue``) -- variants: ``lib`` (as the kit does it), ``gc_off``
  (Python's collector off during the iteration), ``null`` (the transport's bookkeeping without a CUDA call: no
  copy, no event; timing only), ``old_buffer`` (the receive buffer allocated in a ``torch.cuda.stream`` block, as
  before ``kit.transports.on_stream``), ``threads`` (a thread per stage; also with the GIL's switch
  interval at 50 us instead of 5 ms: a thread back from a C call waits that long at most for one in Python);
* ``calls``: the host time of single calls the transfer path makes, hot (back to back), median of batches;
* ``message``: one 16 MiB activation through the pipeline's path (``post_in_process`` + waits) vs ``out.copy_``.
"""

import gc
import json
import statistics as st
import sys
import threading
import time
from types import SimpleNamespace

import torch

from kit.investigations.p2p_transports import pipeline as P
from kit.investigations.p2p_transports import pipeline_run as PR
from kit.transports.base import Work
from kit.transports.copy import CopyTransport

clock = time.perf_counter
out_path = sys.argv[1]
n = int(sys.argv[sys.argv.index("--stages") + 1]) if "--stages" in sys.argv else torch.cuda.device_count()
iters = int(sys.argv[sys.argv.index("--iters") + 1]) if "--iters" in sys.argv else 15
L, H, B, M, DT = 4, 4096, 2048, 8, torch.bfloat16
res = dict(stages=n, layers=L, hidden=H, batch=B, micro_batches=M, torch=torch.__version__,
           gpus=[torch.cuda.get_device_name(d) for d in range(n)])


def save():
    json.dump(res, open(out_path, "w"), indent=1)


def sync():
    for d in range(n):
        torch.cuda.synchronize(d)


ctx = SimpleNamespace(rank=0, world_size=n, device=torch.device("cuda", 0), is_cuda=True)
T = CopyTransport(ctx)
stages = [P.Stage(s, n, L, H, B, M, torch.device("cuda", s), DT) for s in range(n)]
comm = P.CommStreams.make(list(range(n)), separate=True)

# ---------------------------------------------------------------- parts alone
res["parts"] = {}
for s, us in PR._compute_times(stages, n, 20, 20, True).items():  # taking turns over the stages, as the kit
    res["parts"][s] = {k: st.median(u[k] for u in us) for k in ("F", "B", "F host", "B host")}
for s, stg in enumerate(stages):  # and one stage at a time
    us = PR._compute_times([stg], n, 20, 20, True)[s]
    res["parts"][s].update({k + " one stage": st.median(u[k] for u in us) for k in ("F", "B", "F host", "B host")})
save()
print("parts", json.dumps(res["parts"]), flush=True)

# ---------------------------------------------------------------- instrumentation
acc = {}


def timed(name, fn):
    def w(*a, **k):
        t0 = clock()
        try:
            return fn(*a, **k)
        finally:
            acc[name] = acc.get(name, 0.0) + clock() - t0
    return w


orig_issue = P._issue


def timed_issue(*a, **k):
    g = orig_issue(*a, **k)
    while True:
        t0 = clock()
        try:
            v = next(g)
        except StopIteration as e:
            acc["_issue"] = acc.get("_issue", 0.0) + clock() - t0
            return e.value
        acc["_issue"] = acc.get("_issue", 0.0) + clock() - t0
        yield v


class NullT(CopyTransport):
    """The copy transport's bookkeeping without any CUDA call (no event, no copy): timing only."""

    def isend(self, t, dst):
        from kit.transports.copy import _Msg
        msg = _Msg(t, t, None, None)
        with self._cv:
            self._box.setdefault((t.get_device(), dst), __import__("collections").deque()).append(msg)
            self.posted += 1
            self._cv.notify_all()
        return Work()

    def _copy(self, msg, out, src, dst, stream=None):
        return Work()


orig_buffer = P.Stage._buffer


def old_buffer(self, comm_):
    """The receive buffer as the kit allocated it before on_stream (a torch.cuda.stream block)."""
    with torch.cuda.stream(comm_.recv[self.device.index]):
        return torch.empty(self.batch, self.hidden, device=self.device, dtype=self.dtype)


def iteration(Tr, driver):
    for stg in stages:
        stg.zero_grad()
    progs = [stg.iteration(Tr, s - 1 if s > 0 else None, s + 1 if s < n - 1 else None, comm)
             for s, stg in enumerate(stages)]
    h = [0.0] * n
    if driver == "threads":
        P.drive_threads(progs, Tr, [stg.device for stg in stages], host=h)
    else:
        P.drive(progs, Tr, host=h)
    return h


def run_variant(name, Tr, driver="host", gc_off=False, buffer=None, instrument=True, switch=None):
    P.Stage._buffer = buffer or orig_buffer
    old_switch = sys.getswitchinterval()
    if switch is not None:
        sys.setswitchinterval(switch)
    if instrument:
        P._issue = timed_issue
        Tr.isend = timed("isend", Tr.isend)
        Tr.irecv = timed("irecv", Tr.irecv)
        P.Stage._buffer = timed("_buffer", P.Stage._buffer)
    rows = []
    try:
        for i in range(-3, iters):
            acc.clear()
            sync()
            if gc_off:
                gc.disable()
            t0 = clock()
            h = iteration(Tr, driver)
            t_issue = clock() - t0
            sync()
            t = clock() - t0
            if gc_off:
                gc.enable()
            if i >= 0:
                rows.append(dict(time_us=t * 1e6, issue_us=t_issue * 1e6, host_us=[x * 1e6 for x in h],
                                 compute_us=[stg.host_compute_s * 1e6 for stg in stages],
                                 loss=float(stages[-1].loss), **{k + "_us": v * 1e6 for k, v in acc.items()}))
    finally:
        sys.setswitchinterval(old_switch)
        P._issue = orig_issue
        P.Stage._buffer = orig_buffer
        for k in ("isend", "irecv"):
            Tr.__dict__.pop(k, None)
    keys = {k for r in rows for k, v in r.items() if not isinstance(v, list)}
    med = {k: st.median(r.get(k, 0.0) for r in rows) for k in sorted(keys)}
    med["host_us"] = [st.median(r["host_us"][s] for r in rows) for s in range(n)]
    med["compute_us"] = [st.median(r["compute_us"][s] for r in rows) for s in range(n)]
    med["time_us_min"], med["time_us_max"] = min(r["time_us"] for r in rows), max(r["time_us"] for r in rows)
    res.setdefault("pipeline", {})[name] = dict(median=med, samples=rows)
    save()
    print(f"{name:12s} {med['time_us'] / 1e3:7.2f} ms (min {med['time_us_min'] / 1e3:.2f} max "
          f"{med['time_us_max'] / 1e3:.2f}), issue {med['issue_us'] / 1e3:.2f}, host/stage "
          f"{[round(x / 1e3, 2) for x in med['host_us']]}, compute {[round(x / 1e3, 2) for x in med['compute_us']]}, "
          + ", ".join(f"{k} {v / 1e3:.2f}" for k, v in med.items() if k.endswith("_us") and k not in
                      ("time_us", "issue_us", "host_us", "compute_us", "time_us_min", "time_us_max")), flush=True)


T._peer(0, 1)
for s in range(n - 1):
    T._peer(s, s + 1)
run_variant("lib", T)
run_variant("lib_noinstr", T, instrument=False)
run_variant("gc_off", T, gc_off=True)
run_variant("old_buffer", T, buffer=old_buffer)
run_variant("null", NullT(ctx))
run_variant("threads", T, driver="threads")
run_variant("threads_noinstr", T, driver="threads", instrument=False)
run_variant("threads_switch_50us", T, driver="threads", instrument=False, switch=50e-6)
run_variant("lib_again", T, instrument=False)

# ---------------------------------------------------------------- single calls, hot
R = 400


def cost(fn, reps=R, batches=5):
    out = []
    for _ in range(batches):
        t0 = clock()
        for _ in range(reps):
            fn()
        out.append((clock() - t0) / reps * 1e6)
    sync()
    return st.median(out)


d0, d1 = 0, 1
s1 = comm.recv[d1]
a = torch.empty(1024, dtype=torch.uint8, device="cuda:0")
b = torch.empty(1024, dtype=torch.uint8, device="cuda:1")
ev = torch.cuda.Event()
ev.record(torch.cuda.current_stream(0))
from kit.transports.mailbox import peer_memcpy
calls = {
    "torch.cuda.current_stream(d)": lambda: torch.cuda.current_stream(d1),
    "torch._C._cuda_getCurrentStream(d)": lambda: torch._C._cuda_getCurrentStream(d1),
    "torch.cuda.Event()": lambda: torch.cuda.Event(),
    "Event().record(s)": lambda: torch.cuda.Event().record(s1),
    "s.wait_event(ev)": lambda: s1.wait_event(ev),
    "t.record_stream(s)": lambda: b.record_stream(s1),
    "with torch.cuda.stream(s): empty": lambda: old_buffer(stages[1], comm),
    "with on_stream(s): empty (Stage._buffer)": lambda: orig_buffer(stages[1], comm),
    "torch.empty(device=d)": lambda: torch.empty(B, H, device="cuda:1", dtype=DT),
    "with torch.cuda.device(d)": lambda: torch.cuda.device(d1).__enter__() and None,
    "peer_memcpy 1 KiB on s (other device current)": lambda: peer_memcpy(b, a, 1024, s1),
    "b.copy_(a) 1 KiB": lambda: b.copy_(a),
    "Work() + closure": lambda: Work(lambda: None, lambda: True),
    "Condition notify_all": lambda: (T._cv.acquire(), T._cv.notify_all(), T._cv.release()),
    "t.get_device()": lambda: b.get_device(),
    "t.is_contiguous()": lambda: b.is_contiguous(),
}
torch.cuda.set_device(0)
res["calls_us"] = {}
for k, fn in calls.items():
    try:
        res["calls_us"][k] = cost(fn)
    except Exception as e:  # noqa: BLE001
        res["calls_us"][k] = repr(e)
    torch.cuda.set_device(0)
    print(f"  {k:48s} {res['calls_us'][k]}", flush=True)
save()

# ---------------------------------------------------------------- one activation through the pipeline's path
x = torch.randn(B, H, device="cuda:0", dtype=DT)
with torch.cuda.stream(comm.recv[1]):
    y = torch.empty(B, H, device="cuda:1", dtype=DT)


def msg():
    ws = P.post_in_process(T, [("send", x, 1), ("recv", y, 0)], comm)
    ws[1].wait()
    ws[0].wait()


res["message_us"] = {"pipeline path (host per message)": cost(msg, 50), "y.copy_(x) (host)": cost(lambda: y.copy_(x), 50)}
print("message", res["message_us"], flush=True)
save()

# ---------------------------------------------------------------- 1 KiB: where the transport's time per message goes
from kit.investigations.p2p_transports import harness as HN
flows = [(0, 1, 1024)]
bufs = HN.buffers(T, flows)
o = HN.ops(T, flows, bufs)
src_, dst_ = bufs[0]["send"], bufs[0]["recv"]


def ex_wait():
    for w in T.exchange(o):
        w.wait()


kib = {"bare dst.copy_(src)": lambda: dst_.copy_(src_), "T.exchange only": lambda: T.exchange(o),
       "T.exchange + waits": ex_wait, "harness transfer": lambda: HN.transfer(T, ctx, flows, bufs, joined=False, op_list=o),
       "_current_id x1": lambda: torch._C._cuda_getCurrentStream(1), "t.get_device() x1": lambda: src_.get_device(),
       "t.is_contiguous() x1": lambda: src_.is_contiguous(), "t.is_cuda x1": lambda: src_.is_cuda,
       "t.dtype x1": lambda: src_.dtype, "t.numel() x1": lambda: src_.numel()}
res["kib_us"] = {}
for rep in range(3):  # in turn, three times: the host drifts
    for k, fn in kib.items():
        res["kib_us"].setdefault(k, []).append(cost(fn, 2000, 3))
for k, v in res["kib_us"].items():
    print(f"  1 KiB {k:28s} {[round(x, 2) for x in v]}", flush=True)
save()
print("done", flush=True)
