"""Round-1 probe of the P2P transports on one host with several GPUs, in ONE process (no torch.distributed), so
nothing else has a context on the GPUs. Sections (each writes into probe.json as it finishes; one failing does
not stop the others):

* ``small``     -- per message at 1 KiB GPU0 -> GPU1, host and device time, samples interleaved: the bare
                   ``copy_`` loop, the CUDA floor (``cuMemcpyDtoDAsync`` / ``cudaMemcpyPeerAsync`` loops with no
                   ordering, an event round trip GPU0 -> GPU1 -> GPU0), the two-way barrier of ``copy_`` built from
                   raw calls with reused events, the copy transport's ``exchange`` and the harness's transfer.
* ``call``      -- the host time *in the call* of one 64 KiB message (what the semantics part measures) after
                   different idle states (GPUs synchronised, then: nothing / sleep / spin), for ``copy_`` and the
                   copy transport, with the transport's sub-calls timed; a torch.profiler trace of a few.
* ``pipeline``  -- the copy pipeline (kit code) at 2 and 4 stages, host- and thread-driven, the host's issue
                   time apart from the GPU time; the same schedule *without any transfer* (compute only); the
                   parts of the 1F1B model; a profiled iteration of each at 4 stages.

    OUT_DIR=... python p2p_probe.py [sections...]
"""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import shutil
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

OUT = Path(os.environ.get("OUT_DIR", "."))
RES: dict = {}


def save():
    (OUT / "probe.json").write_text(json.dumps(RES, indent=1, default=str))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p * (len(xs) - 1)))))] if xs else float("nan")


def summary(xs):
    return dict(median=med(xs), p10=q(xs, 0.1), p90=q(xs, 0.9), n=len(xs), samples=[round(x, 3) for x in xs])


class Ctx:
    """A stand-in for kit.launch.Ctx in one process: rank 0 of ``world`` (the stage count), no process group."""

    rank = 0
    local_rank = 0
    backend = "nccl"
    is_cuda = True

    def __init__(self, world):
        self.world_size = world
        self.device = torch.device("cuda", 0)
        self.run_dir = OUT

    def step(self, *a, **k):
        pass

    def log(self, *a):
        print(*a, flush=True)

    def sync(self):
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)

    def barrier(self):
        self.sync()


def cudart():
    """libcudart as loaded by torch (for cudaMemcpyPeerAsync), or None."""
    for line in open("/proc/self/maps"):
        if "libcudart" in line:
            path = line.split()[-1]
            lib = ctypes.CDLL(path)
            lib.cudaMemcpyPeerAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                                ctypes.c_size_t, ctypes.c_void_p]
            return path, lib
    return None, None


# ------------------------------------------------------------------------------------------------ small
def section_small(iters=100, repeats=15, warmup=20, n=1024):
    from kit.investigations.p2p_transports import harness as H
    from kit.transports import mailbox
    from kit.transports.copy import CopyTransport

    ctx = Ctx(2)
    T = CopyTransport(ctx)
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(n, dtype=torch.uint8, device="cuda:1")
    dst.copy_(src)  # peer access on, both ways below
    torch.empty(1, device="cuda:0").copy_(torch.zeros(1, device="cuda:1"))
    torch.cuda.set_device(0)
    s0, s1 = torch.cuda.current_stream(0), torch.cuda.current_stream(1)
    lib = mailbox.libcuda()
    dp, sp, h0 = dst.data_ptr(), src.data_ptr(), s0.cuda_stream
    path, rt = cudart()
    RES["small_cudart"] = path
    e0, e1 = torch.cuda.Event(), torch.cuda.Event()
    ed, es = torch.cuda.Event(), torch.cuda.Event()
    flows = [(0, 1, n)]
    bufs = [dict(send=src, recv=dst)]

    def roundtrip():
        e0.record(s0)
        s1.wait_event(e0)
        e1.record(s1)
        s0.wait_event(e1)

    def raw_barrier_copy():  # what copy_ does between devices, with reused events and a ctypes memcpy
        ed.record(s1)
        s0.wait_event(ed)
        lib.cuMemcpyDtoDAsync_v2(dp, sp, n, h0)
        es.record(s0)
        s1.wait_event(es)

    def raw_copy():
        if lib.cuMemcpyDtoDAsync_v2(dp, sp, n, h0):
            raise RuntimeError("cuMemcpyDtoDAsync failed")

    def exchange():
        for w in T.exchange([("send", src, 1), ("recv", dst, 0)]):
            w.wait()

    fns = {
        "copy_ loop": lambda: dst.copy_(src),
        "cuMemcpyDtoDAsync (ctypes)": raw_copy,
        "memcpy_dtod (kit helper)": lambda: mailbox.memcpy_dtod(dp, sp, n, s0),
        "event round trip": roundtrip,
        "two-way barrier + memcpy (raw)": raw_barrier_copy,
        "copy exchange + waits": exchange,
        "copy harness transfer": lambda: H.transfer(T, ctx, flows, bufs, joined=False),
    }
    if rt is not None:
        fns["cudaMemcpyPeerAsync"] = lambda: rt.cudaMemcpyPeerAsync(dp, 1, sp, 0, n, h0)
    ev_a, ev_b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    jn = torch.cuda.Event()
    for f in fns.values():
        for _ in range(warmup):
            f()
    ctx.sync()
    out = {k: dict(device=[], host=[]) for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            ctx.sync()
            t0 = time.perf_counter()
            ev_a.record(s0)
            for _ in range(iters):
                f()
            jn.record(s1)  # whatever the loop left on GPU1 joins the timed stream once per sample
            s0.wait_event(jn)
            ev_b.record(s0)
            t1 = time.perf_counter()
            ev_b.synchronize()
            out[k]["device"].append(ev_a.elapsed_time(ev_b) * 1e3 / iters)
            out[k]["host"].append((t1 - t0) * 1e6 / iters)
    RES["small"] = {k: dict(device_us=summary(v["device"]), host_us=summary(v["host"])) for k, v in out.items()}
    # the GPU time of one isolated copy_ and of one memcpy (nothing queued before), from a profiler trace
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for k in ("copy_ loop", "cuMemcpyDtoDAsync (ctypes)", "two-way barrier + memcpy (raw)", "copy exchange + waits"):
            for _ in range(5):
                with torch.profiler.record_function(k):
                    fns[k]()
            ctx.sync()
            time.sleep(0.001)
    p = OUT / "trace_small.json"
    prof.export_chrome_trace(str(p))
    _gz(p)
    save()


def _gz(p: Path):
    with open(p, "rb") as f, gzip.open(str(p) + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    p.unlink()


# ------------------------------------------------------------------------------------------------ call
def section_call(n=64 << 10, reps=12):
    """Host time in the call of one message after an idle state, as the semantics part sees it."""
    from kit.investigations.p2p_transports import harness as H
    from kit.transports import copy as C
    from kit.transports import pattern
    from kit.transports.copy import CopyTransport

    ctx = Ctx(2)
    T = CopyTransport(ctx)
    torch.cuda.set_device(0)
    # sub-call timers: wrap the copy module's helpers
    acc: dict = {}

    def timed(name, fn):
        def w(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + (time.perf_counter() - t) * 1e6
        return w

    C.peer_memcpy = timed("peer_memcpy", C.peer_memcpy)
    C.flat_bytes = timed("flat_bytes", C.flat_bytes)
    C._Events.record = staticmethod(timed("event create+record", C._Events.record.__func__
                                          if hasattr(C._Events.record, "__func__") else C._Events.record))
    T._peer = timed("_peer", T._peer)
    T._copy = timed("_copy (whole)", T._copy)

    warm = torch.empty(16, device="cuda:0")

    def idle(state):
        ctx.sync()
        if state == "sleep 5 ms":
            time.sleep(0.005)
        elif state == "spin 5 ms":
            t = time.perf_counter()
            while time.perf_counter() - t < 0.005:
                pass
        elif state == "spin 5 ms in torch":  # keeps PyTorch's CPU code and data hot, touches no GPU
            t = time.perf_counter()
            while time.perf_counter() - t < 0.005:
                warm.reshape(-1).view(torch.uint8).is_contiguous()
        elif state == "sleep 50 ms":
            time.sleep(0.05)

    out = {}
    import resource

    def faults():
        r = resource.getrusage(resource.RUSAGE_THREAD)
        return r.ru_minflt, r.ru_majflt, r.ru_nvcsw, r.ru_nivcsw

    for state in ("hot (no sync)", "sync only", "sleep 5 ms", "spin 5 ms", "spin 5 ms in torch", "sleep 50 ms"):
        for api in ("copy_", "copy isend+irecv", "copy_ same-device"):
            calls, waits, subs, flt = [], [], [], []
            for i in range(-2, reps):
                src = pattern(n, torch.device("cuda", 0), i, 0)
                got = torch.empty(n, dtype=torch.uint8, device="cuda:1" if api != "copy_ same-device" else "cuda:0")
                if state != "hot (no sync)":
                    idle(state)
                acc.clear()
                f0 = faults()
                h0 = time.perf_counter()
                if api == "copy isend+irecv":
                    T.isend(src, 1)
                    w = T.irecv(got, 0)
                else:
                    got.copy_(src)
                    w = None
                h1 = time.perf_counter()
                f1 = faults()
                if w is not None:
                    w.wait()
                    H.join(T, ctx, [(0, 1)])
                h2 = time.perf_counter()
                if i >= 0:
                    flt.append([b - a for a, b in zip(f0, f1)])
                    calls.append((h1 - h0) * 1e6)
                    waits.append((h2 - h1) * 1e6)
                    subs.append(dict(acc))
            out[f"{state} | {api}"] = dict(call_us=summary(calls), wait_us=summary(waits),
                                           faults_in_call=dict(zip(("minor", "major", "voluntary_cs", "involuntary_cs"),
                                                                   [med([f[k] for f in flt]) for k in range(4)])),
                                           sub_us={k: med([s.get(k, 0.0) for s in subs]) for k in subs[0]} if subs else {})
    RES["call"] = out
    save()
    # a profiler trace of a few calls after a sleep (what each CUDA call costs there)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(4):
            src = pattern(n, torch.device("cuda", 0), i, 0)
            got = torch.empty(n, dtype=torch.uint8, device="cuda:1")
            idle("sleep 5 ms")
            with torch.profiler.record_function("copy_ after sleep"):
                got.copy_(src)
            idle("sleep 5 ms")
            with torch.profiler.record_function("copy isend+irecv after sleep"):
                T.isend(src, 1)
                w = T.irecv(got, 0)
            w.wait()
            idle("spin 5 ms")
            with torch.profiler.record_function("copy_ after spin"):
                got.copy_(src)
    p = OUT / "trace_call.json"
    prof.export_chrome_trace(str(p))
    _gz(p)


# ------------------------------------------------------------------------------------------------ pipeline
def _compute_programs(P):
    """Per stage, a generator that runs the stage's 1F1B steps on local data (no transfer), yielding after every
    step (so the host driver interleaves the stages step by step, as it does with transfers)."""
    from kit.investigations.p2p_transports.pipeline import forward, loss_of, schedule

    def prog(st, s, n):
        x0 = torch.randn(st.batch, st.hidden, device=st.device, dtype=st.dtype)
        g = torch.randn(st.batch, st.hidden, device=st.device, dtype=st.dtype)
        outs = {}
        with torch.cuda.device(st.device):
            for kind, i in schedule(s, n, st.m):
                if kind == "F":
                    x = x0.detach().requires_grad_(s > 0)
                    y = forward(st.weights, x)
                    outs[i] = loss_of(y, st.m) if s == n - 1 else y
                else:
                    y = outs.pop(i)
                    y.backward(None if s == n - 1 else g)
                yield

    for s, st in P.stages.items():
        st.zero_grad()
        yield prog(st, s, P.n)


def _round_robin(progs):
    live = list(progs)
    while live:
        for g in list(live):
            try:
                next(g)
            except StopIteration:
                live.remove(g)


def _threads(progs, devices):
    def run(g, d):
        torch.cuda.set_device(d)
        for _ in g:
            pass

    ts = [threading.Thread(target=run, args=(g, d)) for g, d in zip(progs, devices)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def _with_comm(P, how, fn):
    """Run ``fn`` with the pipeline's communication streams replaced: ``"shared"`` one stream per GPU for sends
    and receives, None: every transfer on the compute streams."""
    from kit.investigations.p2p_transports.pipeline import CommStreams

    keep = P.comm
    P.comm = CommStreams.make(P.devs, separate=False) if how == "shared" else None
    try:
        return fn()
    finally:
        P.comm = keep


def _no_gc(fn):
    """Run ``fn`` with Python's cyclic garbage collector off (Megatron-LM's ``--manual-gc``: a collection
    in the middle of a step stalls the thread that triggers it)."""
    import gc

    gc.disable()
    try:
        return fn()
    finally:
        gc.enable()


def _lean(fn):
    """Run ``fn`` with the pipeline's ``_on_streams`` making current only the comm streams of the devices its
    ops touch (the kit makes every device's comm stream current: a StreamContext enter and exit per device)."""
    from kit.investigations.p2p_transports import pipeline as PL

    keep = PL._on_streams

    class Lean(keep):
        def __init__(self, ops, streams):
            super().__init__(ops, streams)
            devs = {t.device.index for _k, t, _p in ops if getattr(t, "is_cuda", False)}
            self.streams = {d: s for d, s in self.streams.items() if d in devs}

    PL._on_streams = Lean
    try:
        return fn()
    finally:
        PL._on_streams = keep


def section_pipeline(stages=(2, 4), steps=5):
    from kit.investigations import p2p_transports as X
    from kit.investigations.p2p_transports import harness as H
    from kit.investigations.p2p_transports import pipeline_run as R
    from kit.investigations.p2p_transports.pipeline import drive, drive_threads
    from kit.transports.copy import CopyTransport

    out = RES.setdefault("pipeline", {})
    cfg = X.Config(transports=["copy"], parts=["pipeline"], repeats=10, iters=10)
    for n in stages:
        if torch.cuda.device_count() < n:
            out[str(n)] = "not enough GPUs"
            continue
        ctx = Ctx(n)
        T = CopyTransport(ctx)
        S = H.Sync(ctx, True, True, None)
        P = R.Pipeline(cfg, ctx, T, S, torch.bfloat16)
        act = cfg.pipeline_batch * cfg.pipeline_hidden * 2
        res = out.setdefault(str(n), {})
        # model parts
        fb = {}
        for s, st in P.stages.items():
            ts = R._compute_times(st, s == n - 1, 20, 10, True)
            fb[s] = dict(F=summary([t["F"] for t in ts]), B=summary([t["B"] for t in ts]))
        res["parts_us"] = fb
        hops = {}
        for s in range(n - 1):
            rows = H.timed_rows(cfg, ctx, T, S, [(s, s + 1, act)], dict(part="transfer"), kind="x")
            hops[f"{s}->{s + 1}"] = summary([r["time_us"] for r in rows if r["transport"] == "copy"])
        res["transfer_us"] = hops
        per = [fb[s]["F"]["median"] + fb[s]["B"]["median"] for s in range(n)]
        c = max(h["median"] for h in hops.values())
        m = cfg.pipeline_micro_batches
        res["model_ms"] = (sum(per) + (m - 1) * max(per) + 2 * (n - 1) * c) / 1e3
        save()
        devices = [st.device for st in P.stages.values()]
        variants = {
            "copy host": (lambda: drive(list(P.programs()), T)),
            "copy threads": (lambda: drive_threads(list(P.programs()), T, devices)),
            "compute-only host": (lambda: _round_robin(list(_compute_programs(P)))),
            "compute-only threads": (lambda: _threads(list(_compute_programs(P)), devices)),
            "copy threads, GC off": (lambda: _no_gc(lambda: drive_threads(list(P.programs()), T, devices))),
        }
        for name, fn in variants.items():
            issue, total = [], []
            try:
                for k in range(-2, steps):
                    ctx.sync()
                    t0 = time.perf_counter()
                    fn()
                    t1 = time.perf_counter()
                    ctx.sync()
                    t2 = time.perf_counter()
                    if k >= 0:
                        issue.append((t1 - t0) * 1e3)
                        total.append((t2 - t0) * 1e3)
                res[name] = dict(issue_ms=summary(issue), total_ms=summary(total),
                                 vs_model=med(total) / res["model_ms"])
            except Exception as e:  # noqa: BLE001
                res[name] = f"failed: {type(e).__name__}: {e}"
            save()
        if n == max(stages):
            from torch.profiler import ProfilerActivity, profile

            for name in ("copy host", "copy threads"):
                ctx.sync()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    variants[name]()
                    ctx.sync()
                p = OUT / f"trace_pipeline_{n}_{name.replace(' ', '_')}.json"
                prof.export_chrome_trace(str(p))
                _gz(p)
        P.stages.clear()
        torch.cuda.empty_cache()


SECTIONS = {"small": section_small, "call": section_call, "pipeline": section_pipeline}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    RES["env"] = dict(torch=torch.__version__, cuda=torch.version.cuda, gpus=torch.cuda.device_count(),
                      names=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    for name in (sys.argv[1:] or list(SECTIONS)):
        t = time.perf_counter()
        try:
            SECTIONS[name]()
        except Exception as e:  # noqa: BLE001
            RES[f"{name}_error"] = traceback.format_exc()
            print(f"section {name} failed: {e}", flush=True)
        RES[f"{name}_s"] = time.perf_counter() - t
        save()
        print(f"section {name}: {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
