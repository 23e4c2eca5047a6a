"""Round-1 probe (one process, every visible GPU, the kit's pipeline code): what the model with the host over-counts
(one thread driving every stage), the thread-per-stage driver under the GIL, and the 1 KiB copy path.

    python probe3.py OUT.json [--iters 15]

(run from a snapshot of the kit at b6377f1, with oldcopy.py beside it: kit/transports/copy.py of 71f725b with its
imports absolute and registered as copy-old -- see README.md)

* ``parts``: per stage, F/B host time (us, median of samples) issued in turns over the stages, in variants:
  ``kit`` (pipeline_run._compute_times as it is now: events outside the host window), ``events_in`` (the start and
  end events inside the window, as before), ``bare`` (no hold, no events), ``bare_gc_off``, ``in_a_row`` (m
  micro-batches per sample: every stage's F of micro-batch j in turn, ..., then the backwards in reverse, gradients
  accumulating over the m, one sync per sample -- the pipeline's order of compute steps without its transfers),
  ``threads`` (pipeline_run._concurrent_host_times);
* ``pipeline``: iterations of the 1F1B pipeline (copy): one thread (``host``) and a thread per stage (``threads``),
  each with the host's time per stage and in the forward/backward calls; and the pipeline without transfer work
  (``null``: the transport's bookkeeping, no CUDA call);
* ``kib``: 1 KiB per message in turns: bare ``copy_`` loop, the harness path with the kit's copy transport, and the
  same with the previous copy.py (``oldcopy.py``, registered as copy-old).
"""

import gc
import json
import statistics as st
import sys
import time
from types import SimpleNamespace

import torch

from kit.investigations.p2p_transports import pipeline as P
from kit.investigations.p2p_transports import pipeline_run as PR
from kit.investigations.p2p_transports import harness as HN
from kit.transports.base import Work
from kit.transports.copy import CopyTransport

clock = time.perf_counter
out_path = sys.argv[1]
n = torch.cuda.device_count()
iters = int(sys.argv[sys.argv.index("--iters") + 1]) if "--iters" in sys.argv else 15
L, H, B, M, DT = 4, 4096, 2048, 8, torch.bfloat16
res = dict(stages=n, layers=L, hidden=H, batch=B, micro_batches=M, torch=torch.__version__,
           python=sys.version, gpus=[torch.cuda.get_device_name(d) for d in range(n)])


def save():
    json.dump(res, open(out_path, "w"), indent=1)


def sync():
    for d in range(n):
        torch.cuda.synchronize(d)


ctx = SimpleNamespace(rank=0, world_size=n, device=torch.device("cuda", 0), is_cuda=True)
T = CopyTransport(ctx)
stages = [P.Stage(s, n, L, H, B, M, torch.device("cuda", s), DT) for s in range(n)]
comm = P.CommStreams.make(list(range(n)), separate=True)
for s in range(n - 1):
    T._peer(s, s + 1)
med = st.median


def summary(name, per_stage):
    res.setdefault("parts", {})[name] = per_stage
    save()
    print(f"parts {name:12s} " + "  ".join(f"s{s}: F {v['F host']:6.1f} B {v['B host']:6.1f}" for s, v in per_stage.items()),
          flush=True)


# ---------------------------------------------------------------- parts' host time, variants
t0 = clock()
kit = PR._compute_times(stages, n, 20, 20, True)
summary("kit", {s: {k: med(u[k] for u in us) for k in ("F", "B", "F host", "B host")} | {
    "short": sum(u["F hold short"] + u["B hold short"] for u in us), "F hold": med(u["F hold"] for u in us),
    "B hold": med(u["B hold"] for u in us), "F host all": [u["F host"] for u in us],
    "B host all": [u["B host"] for u in us]} for s, us in kit.items()})
print(f"  ({clock() - t0:.1f} s)", flush=True)


def variant(events_in=False, hold=False, gc_off=False, m=1, samples=20, warm=10):
    prep = {}
    for stg in stages:
        x0 = stg.inputs[0] if stg.inputs is not None else torch.randn(B, H, device=stg.device, dtype=DT)
        prep[stg.stage] = (x0, torch.randn(B, H, device=stg.device, dtype=DT))
    got = {stg.stage: {"F host": [], "B host": []} for stg in stages}
    for i in range(-warm, samples):
        if gc_off:
            gc.disable()
        ys = {}
        for j in range(m):
            for stg in stages:
                s = stg.stage
                with torch.cuda.device(stg.device):
                    x = prep[s][0].detach().requires_grad_(s > 0)
                    if hold:
                        torch.cuda._sleep(1 << 21)
                    if events_in:
                        h0 = clock()
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record(torch.cuda.current_stream())
                        ys[(s, j)] = PR._run_part("F", stg, x, None)
                        b.record(torch.cuda.current_stream())
                    else:
                        h0 = clock()
                        ys[(s, j)] = PR._run_part("F", stg, x, None)
                    if i >= 0:
                        got[s]["F host"].append((clock() - h0) * 1e6)
        for j in range(m):
            for stg in reversed(stages):
                s = stg.stage
                with torch.cuda.device(stg.device):
                    if hold:
                        torch.cuda._sleep(1 << 21)
                    g = None if s == n - 1 else prep[s][1]
                    if events_in:
                        h0 = clock()
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record(torch.cuda.current_stream())
                        PR._run_part("B", stg, ys[(s, j)], g)
                        b.record(torch.cuda.current_stream())
                    else:
                        h0 = clock()
                        PR._run_part("B", stg, ys[(s, j)], g)
                    if i >= 0:
                        got[s]["B host"].append((clock() - h0) * 1e6)
        if gc_off:
            gc.enable()
        sync()
        for stg in stages:
            stg.zero_grad()
    return {s: {k: med(v) for k, v in d.items()} | {k + " all": v for k, v in d.items()} for s, d in got.items()}


for name, kw in (("events_in", dict(events_in=True, hold=True)), ("hold_only", dict(hold=True)),
                 ("bare", {}), ("bare_gc_off", dict(gc_off=True)), ("in_a_row", dict(m=M, samples=5, warm=2)),
                 ("in_a_row_gc_off", dict(m=M, samples=5, warm=2, gc_off=True)), ("kit_again", None)):
    t0 = clock()
    if kw is None:
        kit = PR._compute_times(stages, n, 20, 20, True)
        summary(name, {s: {k: med(u[k] for u in us) for k in ("F host", "B host")} for s, us in kit.items()})
    else:
        summary(name, variant(**kw))
    print(f"  ({clock() - t0:.1f} s)", flush=True)

t0 = clock()
thr = PR._concurrent_host_times(stages, 5, 20, True)
summary("threads", {s: {"F host": med(u["F host threads"] for u in us), "B host": med(u["B host threads"] for u in us),
                        "F host all": [u["F host threads"] for u in us], "B host all": [u["B host threads"] for u in us]}
                    for s, us in thr.items()})
print(f"  ({clock() - t0:.1f} s)", flush=True)


# ---------------------------------------------------------------- the pipeline itself
class NullT(CopyTransport):
    """The copy transport's bookkeeping without any CUDA call (no event, no copy): timing only."""

    def isend(self, t, dst):
        from collections import deque

        from kit.transports.copy import _Msg
        msg = _Msg(t, t, None, None)
        with self._cv:
            self._box.setdefault((t.get_device(), dst), deque()).append(msg)
            self.posted += 1
            self._cv.notify_all()
        return Work()

    def _copy(self, msg, out, src, dst, stream=None):
        return Work()


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


def run_pipe(name, Tr, driver="host", gc_off=False):
    rows = []
    t00 = clock()
    for i in range(-3, iters):
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
                             compute_us=[stg.host_compute_s * 1e6 for stg in stages]))
    m = {"time_us": med(r["time_us"] for r in rows), "issue_us": med(r["issue_us"] for r in rows),
         "host_us": [med(r["host_us"][s] for r in rows) for s in range(n)],
         "compute_us": [med(r["compute_us"][s] for r in rows) for s in range(n)]}
    res.setdefault("pipeline", {})[name] = dict(median=m, samples=rows)
    save()
    print(f"pipe {name:14s} {m['time_us'] / 1e3:7.2f} ms, issue {m['issue_us'] / 1e3:.2f}, host/stage "
          f"{[round(x / 1e3, 2) for x in m['host_us']]}, in F/B calls {[round(x / 1e3, 2) for x in m['compute_us']]} "
          f"({clock() - t00:.1f} s)", flush=True)


run_pipe("host", T)
run_pipe("host_gc_off", T, gc_off=True)
run_pipe("null", NullT(ctx))
run_pipe("threads", T, driver="threads")
run_pipe("threads_gc_off", T, driver="threads", gc_off=True)
run_pipe("host_again", T)

# ---------------------------------------------------------------- 1 KiB per message, the kit's copy vs the previous one
import oldcopy  # the previous copy.py, registered as copy-old

Old = oldcopy.CopyTransport
To = Old(ctx)
flows = [(0, 1, 1024)]


def loop_of(Tr):
    bufs = HN.buffers(Tr, flows)
    o = HN.ops(Tr, flows, bufs)
    order = HN._wait_order(o)
    return (lambda: HN.transfer(Tr, ctx, flows, bufs, joined=False, op_list=o, order=order)), bufs


new_fn, bufs = loop_of(T)
old_fn, _ = loop_of(To)
src_, dst_ = bufs[0]["send"], bufs[0]["recv"]


def cost(fn, reps=2000, batches=3):
    out = []
    for _ in range(batches):
        t0 = clock()
        for _ in range(reps):
            fn()
        out.append((clock() - t0) / reps * 1e6)
        sync()
    return med(out)


kib = {"bare dst.copy_(src)": lambda: dst_.copy_(src_), "copy (kit now)": new_fn, "copy (before)": old_fn}
res["kib_us"] = {}
for rep in range(5):  # in turn: the host drifts
    for k, fn in kib.items():
        res["kib_us"].setdefault(k, []).append(cost(fn))
for k, v in res["kib_us"].items():
    print(f"  1 KiB {k:24s} {[round(x, 2) for x in v]}", flush=True)
save()
print("done", flush=True)
