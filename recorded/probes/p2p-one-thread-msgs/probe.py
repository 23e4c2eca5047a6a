"""Which part of copy's message path makes the one-thread pipeline's next forward/backward calls dearer on the host:
``record_stream`` (the caching allocator's deferred frees), fresh CUDA events, the stream waits, or the rest.

    python probe.py OUT_DIR [--stages N] [--budget S] [--cpu] [--no-pin]

One process, no process group, the kit's own pipeline code (``kit.investigations.p2p_transports.pipeline``,
``kit.transports.copy``) at the GPU preset's sizes (``configs/gpu.yaml``; 4 layers, bf16), every thread on one core
(the kit's ``one_core`` rule). Per repetition, in a rotating order, one iteration of each variant (every GPU
synchronised before and after it, nothing kept across it):

* ``p``  the model's parts as the kit times them (``_compute_times``: m samples = one iteration);
* ``b``  the pipeline's compute steps in the order its one thread takes them, no message;
* ``c``  the pipeline as the kit runs it (``drive`` over ``Stage.iteration``, the copy transport, its streams);
* ``nrs``  ``c`` without any ``record_stream`` (the transport's two per message and the pipeline's one per received
  buffer): each tensor it would have recorded is kept alive by reference until after the iteration's sync instead;
* ``nrsT`` only the transport's two taken out (same keeping); ``nrsP`` only the pipeline's one;
* ``ev``  the transport's fresh ``torch.cuda.Event()`` per record replaced by events made before the run (a pool per
  device, none used twice in an iteration);
* ``nw``  every ``Stream.wait_event`` of the iteration skipped (timing only: the data may race);
* ``all3`` ``nrs`` + ``ev`` + ``nw``: what is left is the message path's Python, buffers and memcpy;
* ``fix`` the candidate: the transport keeps the two tensors of each copy (no ``record_stream``) until the host
  sees the copy's event done (swept at every later copy), the pipeline keeps each received buffer (no
  ``record_stream``) until its iteration's end, where each receive stream waits for its device's compute stream.

Per variant and repetition: the iteration's wall time, the thread's time in each stage's program (``drive``'s
``host``), the step blocks (``Stage.iteration``'s ``host_compute_s``; ``b``: the same window) and the host in every
forward / backward call (summed per stage and kind). Ratios are taken within a repetition. Then, on GPU 0, the
caching allocator alone (``alloc``): the host per ``torch.empty`` + free of a pipeline-sized block with no event
pending, with events pending on a stream of the same GPU and of other GPUs (tensors recorded there with
``record_stream`` and freed while those streams are held), and the host per free of a recorded tensor.
``--cpu``: tiny sizes on the CPU with an in-process stand-in transport (a dry run of the plumbing).
Writes ``probe-<N>.json.gz`` (every repetition's sums) and ``probe-<N>.txt`` (medians, ratios) to OUT_DIR as it goes.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import statistics as stat
import sys
import time
from collections import deque
from contextlib import nullcontext
from types import SimpleNamespace

import torch

from kit.investigations.p2p_transports import pipeline as P
from kit.investigations.p2p_transports import pipeline_run as PR
from kit.transports.base import Capabilities, Transport, Work

clock = time.perf_counter
T_START = clock()


def arg(name, default, cast=str):
    return cast(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


OUT = sys.argv[1]
CPU = "--cpu" in sys.argv or not torch.cuda.is_available()
PIN = "--no-pin" not in sys.argv
CPU_N = len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) if os.environ.get("CUDA_VISIBLE_DEVICES") else 4
N = arg("--stages", CPU_N if CPU else torch.cuda.device_count(), int)
BUDGET = arg("--budget", 60.0, float)  # seconds for the whole script, start to end
MAX_REPS = arg("--reps", 400, int)
ALLOC_S = 0.0 if CPU else arg("--alloc-s", 6.0, float)  # kept at the end for the allocator probe
os.makedirs(OUT, exist_ok=True)
if CPU:
    torch.set_num_threads(1)


def sizes():
    if CPU:
        return dict(layers=2, hidden=64, batch=32, micro_batches=8, dtype="float32")
    import yaml

    here = os.path.dirname(os.path.abspath(__file__))
    for path in ("configs/gpu.yaml", os.path.join(here, "configs/gpu.yaml")):
        if os.path.exists(path):
            c = yaml.safe_load(open(path))["p2p_transports"]
            return dict(layers=c.get("pipeline_layers", 4), hidden=c["pipeline_hidden"], batch=c["pipeline_batch"],
                        micro_batches=c["pipeline_micro_batches"], dtype="bfloat16")
    raise SystemExit("probe: configs/gpu.yaml not found (run from the kit's root)")


SZ = sizes()
L, HID, B, M = SZ["layers"], SZ["hidden"], SZ["batch"], SZ["micro_batches"]
DT = getattr(torch, SZ["dtype"])
res = dict(stages=N, cpu=CPU, sizes=SZ, torch=torch.__version__, python=platform.python_version(),
           cuda=torch.version.cuda, gpus=[torch.cuda.get_device_name(d) for d in range(N)] if not CPU else [],
           nccl=(".".join(map(str, torch.cuda.nccl.version())) if not CPU else None), host=platform.node(),
           cpus=os.cpu_count(), argv=sys.argv[1:], started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           reps={}, counts={}, notes=[])


def save():
    with gzip.open(os.path.join(OUT, f"probe-{N}.json.gz"), "wt") as f:
        json.dump(res, f)


def left():
    return BUDGET - (clock() - T_START)


def dev(s):
    return torch.device("cpu") if CPU else torch.device("cuda", s)


def on(d):
    return torch.cuda.device(d) if d.type == "cuda" else nullcontext()


def sync():
    if not CPU:
        for d in range(N):
            torch.cuda.synchronize(d)


# ------------------------------------------------------------------------------------------ what a variant removes
MODE = dict(rs_t="real", rs_p="real", ev="fresh", waits=True)
KEEP: list = []  # tensors whose record_stream was skipped: alive until after the iteration's sync
KEEP_P: list = []  # fix: received buffers kept to the iteration's end
COUNT = dict(rs_t=0, rs_p=0, wait_event=0, event=0)
IN_T = [False]
_rs = torch.Tensor.record_stream


def rs(self, s):
    where = "rs_t" if IN_T[0] else "rs_p"
    COUNT[where] += 1
    mode = MODE[where]
    if mode == "real":
        return _rs(self, s)
    (KEEP_P if mode == "end" else KEEP).append(self)


torch.Tensor.record_stream = rs
if not CPU:
    _we = torch.cuda.Stream.wait_event

    def we(self, ev):
        COUNT["wait_event"] += 1
        if MODE["waits"]:
            return _we(self, ev)

    torch.cuda.Stream.wait_event = we


class CpuCopyT(Transport):
    """In-process stand-in for the copy transport on the CPU (dry runs): boxes by (sender, receiver)."""

    caps = Capabilities(in_process=True)
    name = "cpu-copy"

    def __init__(self, ctx):
        super().__init__(ctx)
        self._box, self.posted = {}, 0
        self.sender = None

    def device(self, endpoint):
        return torch.device("cpu")

    def poll(self, src, dst):
        return bool(self._box.get((src, dst)))

    def isend(self, t, dst):
        self._box.setdefault((self.sender, dst), deque()).append(t)
        self.posted += 1
        return Work()

    def irecv(self, out, src, stream=None):
        out.copy_(self._box[(src, self.sender)].popleft())
        return Work()


def cpu_programs(T, progs):
    def wrap(s, g):
        while True:
            T.sender = s
            try:
                next(g)
            except StopIteration:
                return
            yield
    return [wrap(s, g) for s, g in enumerate(progs)]


# ------------------------------------------------------------------------------------------ per-call clocks
ACC: dict | None = None  # the current iteration's {"F<s>" / "B<s>": host us summed}
W_STAGE: dict = {}
Y_STAGE: dict = {}
_fwd, _loss, _bwd = P.forward, P.loss_of, torch.Tensor.backward


def t_forward(weights, x):
    t0 = clock()
    y = _fwd(weights, x)
    dt = clock() - t0
    s = W_STAGE.get(id(weights), -1)
    Y_STAGE[id(y)] = s
    if ACC is not None:
        ACC[f"F{s}"] = ACC.get(f"F{s}", 0.0) + dt * 1e6
    return y


def t_loss(y, m):
    t0 = clock()
    out = _loss(y, m)
    dt = clock() - t0
    s = Y_STAGE.get(id(y), -1)
    Y_STAGE[id(out)] = s
    if ACC is not None:
        ACC[f"F{s}"] = ACC.get(f"F{s}", 0.0) + dt * 1e6
    return out


def t_backward(self, *a, **k):
    s = Y_STAGE.pop(id(self), -1)
    t0 = clock()
    try:
        return _bwd(self, *a, **k)
    finally:
        if ACC is not None:
            ACC[f"B{s}"] = ACC.get(f"B{s}", 0.0) + (clock() - t0) * 1e6


P.forward = PR.forward = t_forward
P.loss_of = PR.loss_of = t_loss
torch.Tensor.backward = t_backward

# ------------------------------------------------------------------------------------------ set-up
ctx = SimpleNamespace(rank=0, world_size=N, device=dev(0), is_cuda=not CPU)
if CPU:
    T = TF = CpuCopyT(ctx)
else:
    import kit.transports.copy as KC

    _orig_copy = KC.CopyTransport._copy

    def _copy_tagged(self, *a, **k):  # tells rs() which record_stream calls are the transport's
        IN_T[0] = True
        try:
            return _orig_copy(self, *a, **k)
        finally:
            IN_T[0] = False

    KC.CopyTransport._copy = _copy_tagged

    class FixCopy(KC.CopyTransport):
        """The candidate: no record_stream; the copy's two tensors kept until the host sees its event done."""

        def __init__(self, ctx):
            super().__init__(ctx)
            self._live = deque()

        def _copy(self, msg, out, src, dst, stream=None):
            t = msg.t
            if t.dtype != out.dtype or t.numel() != out.numel():
                raise ValueError("copy: size")
            self._peer(src, dst)
            live = self._live
            while live and live[0][0].query():
                live.popleft()
            cur = None
            if stream is not None:
                s = stream
                s.wait_event(msg.produced)
            else:
                s = msg.stream
                cur = torch.cuda.current_stream(dst)
                if s != cur:
                    s.wait_event(self._events.record(cur))
            into = out
            KC.peer_memcpy(into, msg.data, KC.nbytes(t), s)
            msg.done = self._events.record(s)
            live.append((msg.done, msg.data, into))
            return KC._recv_work(msg.done, dst)

    T = KC.CopyTransport(ctx)
    TF = FixCopy(ctx)
    for s in range(N - 1):
        T._peer(s, s + 1)
        TF._peer(s, s + 1)
    _fresh_record = KC._Events.record
    POOL = {d: [torch.cuda.Event() for _ in range(512)] for d in range(N)}
    for d, evs in POOL.items():
        for e in evs:
            e.record(torch.cuda.current_stream(d))
    CUR = {d: 0 for d in range(N)}

    def pooled_record(stream):
        d = stream.device_index
        i = CUR[d]
        CUR[d] = i + 1
        ev = POOL[d][i]
        ev.record(stream)
        return ev

    def counted_fresh(stream):
        COUNT["event"] += 1
        return _fresh_record(stream)

stages = [P.Stage(s, N, L, HID, B, M, dev(s), DT) for s in range(N)]
for st in stages:
    W_STAGE[id(st.weights)] = st.stage
comm = P.CommStreams.make(list(range(N)), separate=True) if not CPU else None
g = torch.Generator().manual_seed(1)
xin = {(s, i): torch.randn(B, HID, generator=g).to(dev(s), DT) for s in range(1, N) for i in range(M)}
gin = {s: torch.randn(B, HID, generator=g).to(dev(s), DT) for s in range(N - 1)}
holds: dict = {}
ORDER: list = []


def set_mode(rs_t="real", rs_p="real", ev="fresh", waits=True):
    MODE.update(rs_t=rs_t, rs_p=rs_p, ev=ev, waits=waits)
    if not CPU:
        KC._Events.record = staticmethod(pooled_record if ev == "pool" else counted_fresh)
        for d in CUR:
            CUR[d] = 0


def it_pipeline(fix=False):
    Tr = TF if fix else T
    progs = []
    for s, st in enumerate(stages):
        st.zero_grad()
        progs.append(st.iteration(Tr, s - 1 if s > 0 else None, s + 1 if s < N - 1 else None, comm))
    if CPU:
        progs = cpu_programs(Tr, progs)
    h = [0.0] * N
    P.drive(progs, Tr, host=h)
    if MODE["rs_p"] == "end":  # the fix's end of the iteration: each receive stream waits for its compute stream
        if not CPU:
            for d in range(N):
                comm.recv[d].wait_stream(torch.cuda.current_stream(d))
        KEEP_P.clear()
    return dict(host_us=[x * 1e6 for x in h], block_us=[st.host_compute_s * 1e6 for st in stages])


def it_steps(order):
    acts, outs = {}, {}
    block = [0.0] * N
    for st in stages:
        st.zero_grad()
        st.loss = torch.zeros((), device=st.device, dtype=torch.float32)
    for s, kind, i in order:
        st = stages[s]
        first, last = s == 0, s == N - 1
        x_in = None if (kind == "B" or first) else xin[(s, i)].detach()
        h0 = clock()
        with on(st.device):
            if kind == "F":
                x = st.inputs[i] if first else x_in.requires_grad_()
                y = P.forward(st.weights, x)
                acts[(s, i)] = x
                if last:
                    loss = P.loss_of(y, M)
                    st.loss += loss.detach()
                    outs[(s, i)] = loss
                else:
                    outs[(s, i)] = y
            else:
                y = outs.pop((s, i))
                if last:
                    y.backward()
                else:
                    y.backward(gin[s])
                acts.pop((s, i))
        block[s] += clock() - h0
    return dict(block_us=[x * 1e6 for x in block])


def it_parts():
    times = PR._compute_times(stages, N, 0, M, not CPU, holds)
    return dict(parts_host_us=sum(u["F host"] + u["B host"] for us in times.values() for u in us))


VARIANTS = {
    "p": (dict(), it_parts),
    "b": (dict(), lambda: it_steps(ORDER)),
    "c": (dict(), it_pipeline),
    "nrs": (dict(rs_t="keep", rs_p="keep"), it_pipeline),
    "nrsT": (dict(rs_t="keep"), it_pipeline),
    "nrsP": (dict(rs_p="keep"), it_pipeline),
    "ev": (dict(ev="pool"), it_pipeline),
    "nw": (dict(waits=False), it_pipeline),
    "all3": (dict(rs_t="keep", rs_p="keep", ev="pool", waits=False), it_pipeline),
    "fix": (dict(rs_p="end"), lambda: it_pipeline(fix=True)),
}


def one(name):
    global ACC
    mode, fn = VARIANTS[name]
    set_mode(**mode)
    ACC = {}
    for k in COUNT:
        COUNT[k] = 0
    sync()
    t0 = clock()
    extra = fn()
    t_issue = clock() - t0
    sync()
    t = clock() - t0
    acc, ACC = ACC, None
    KEEP.clear()
    set_mode()
    return dict(time_us=t * 1e6, issue_us=t_issue * 1e6, calls=acc, **extra), dict(COUNT)


def order_from_blocks():
    """The one thread's step order, from a pipeline iteration with a step logger on Stage.iteration's calls."""
    log = []
    f0, b0 = P.forward, torch.Tensor.backward

    def lf(w, x):
        log.append((W_STAGE[id(w)], "F"))
        return f0(w, x)

    def lb(self, *a, **k):
        log.append((Y_STAGE.get(id(self), -1), "B"))
        return b0(self, *a, **k)

    P.forward, torch.Tensor.backward = lf, lb
    try:
        one("c")
    finally:
        P.forward, torch.Tensor.backward = f0, b0
    nxt = [0] * N
    sched = [P.schedule(s, N, M) for s in range(N)]
    out = []
    for s, kind in log:
        k, i = sched[s][nxt[s]]
        if k != kind:
            raise RuntimeError(f"probe: stage {s}'s call {nxt[s]} is {kind}, its schedule says {k}")
        nxt[s] += 1
        out.append((s, k, i))
    return out


# ------------------------------------------------------------------------------------------ warm-up
print(f"probe: {N} stages, {'CPU' if CPU else res['gpus']}, sizes {SZ}, budget {BUDGET:.0f} s", flush=True)
PR._compute_times(stages, N, PR.PART_WARMUP, 0, not CPU, holds)
res["setup_s"] = clock() - T_START
for _ in range(2):
    one("c")
ORDER[:] = order_from_blocks()
res["order"] = ORDER
for name in list(VARIANTS):
    try:
        one(name)
        _, cnt = one(name)
        res["counts"][name] = cnt
    except Exception as e:  # noqa: BLE001 -- a variant that breaks is dropped and named, the others go on
        res["notes"].append(f"variant {name} dropped in the warm-up: {e!r}")
        print(res["notes"][-1], flush=True)
        set_mode()
        sync()
        VARIANTS.pop(name)
if not CPU:  # mallocs per iteration per device (the allocator's own count), full pipeline and without record_stream
    for name in ("c", "nrs", "fix"):
        a = [torch.cuda.memory_stats(d).get("allocation.all.allocated", 0) for d in range(N)]
        one(name)
        b_ = [torch.cuda.memory_stats(d).get("allocation.all.allocated", 0) for d in range(N)]
        res["counts"][name]["mallocs"] = [y - x for x, y in zip(a, b_)]
res["warmup_s"] = clock() - T_START
print(f"warm-up done at {res['warmup_s']:.1f} s (set-up {res['setup_s']:.1f} s); counts per iteration: "
      f"{res['counts']}", flush=True)


# ------------------------------------------------------------------------------------------ the allocator alone
def alloc_probe(calls=300, samples=5):
    """Host us per torch.empty + free of a (batch, hidden) block on GPU 0's current stream: none pending; K
    recorded-and-freed tensors whose events are pending on a held stream of GPU 0 / of each other GPU; and the host
    us per free of a tensor recorded on another stream (insert_events) against a plain free."""
    out = {}
    d0 = 0
    cur = torch.cuda.current_stream(d0)
    side = {d: torch.cuda.Stream(d) for d in range(N)}
    hold = int(4e7)  # ~20 ms of GPU clock: the events stay pending while the loop runs

    def loop():
        us = []
        with torch.cuda.device(d0):
            for _ in range(calls):
                t0 = clock()
                x = torch.empty(B, HID, device=dev(d0), dtype=DT)
                del x
                us.append((clock() - t0) * 1e6)
        return us

    def pend(streams, k=8):
        ts = [torch.empty(B, HID, device=dev(d0), dtype=DT) for _ in range(k)]
        for s in streams:
            with torch.cuda.stream(s):
                torch.cuda._sleep(hold)
        frees = []
        for i, t in enumerate(ts):
            _rs(t, streams[i % len(streams)])
        for i in range(k):
            t0 = clock()
            ts.pop()
            frees.append((clock() - t0) * 1e6)
        return frees

    cases = {"none": [], "pending, a stream of GPU 0": [side[d0]],
             "pending, a stream of GPU 1": [side[1 % N]],
             "pending, a stream of each other GPU": [side[d] for d in range(1, N)] or [side[d0]]}
    for r in range(-1, samples):
        for name, streams in cases.items():
            sync()
            frees = pend(streams) if streams else []
            us = loop()
            if streams:
                plain = []
                for _ in range(8):
                    t = torch.empty(B, HID, device=dev(d0), dtype=DT)
                    t0 = clock()
                    del t
                    plain.append((clock() - t0) * 1e6)
            sync()
            if r >= 0:
                out.setdefault(name, []).append(us)
                if streams:
                    out.setdefault(name + ": free of a recorded tensor", []).append(frees)
                    out.setdefault(name + ": plain free", []).append(plain)
    del cur
    return out


# ------------------------------------------------------------------------------------------ measurement
def q(xs):
    xs = sorted(xs)
    return (stat.median(xs), xs[len(xs) // 10], xs[(9 * len(xs)) // 10]) if xs else (float("nan"),) * 3


def fmt(t):
    return f"{t[0]:.3f} ({t[1]:.3f}-{t[2]:.3f})"


def summary():
    reps = res["reps"]
    names = [n for n in VARIANTS if reps.get(n)]
    lines = [f"probe-{N}: {N} stages, {'CPU dry run' if CPU else res['gpus'][0] + ' x' + str(N)}, sizes {SZ}, "
             f"core {res.get('core')}, {len(reps.get('c', []))} reps, torch {res['torch']}",
             "variant | iteration ms | thread in programs ms | step blocks ms | host in F/B calls ms (median, p10-p90)"]

    def blocks(r):
        return sum(r["block_us"]) / 1e3 if "block_us" in r else r.get("parts_host_us", float("nan")) / 1e3

    def calls(r):
        return sum(r["calls"].values()) / 1e3

    med = {}
    for n in names:
        rs_ = reps[n]
        it = q([r["time_us"] / 1e3 for r in rs_])
        prog = q([sum(r["host_us"]) / 1e3 for r in rs_]) if "host_us" in rs_[0] else (float("nan"),) * 3
        bl, ca = q([blocks(r) for r in rs_]), q([calls(r) for r in rs_])
        med[n] = dict(iteration_ms=it, programs_ms=prog, blocks_ms=bl, calls_ms=ca)
        lines.append(f"{n:4s} | {fmt(it)} | {fmt(prog)} | {fmt(bl)} | {fmt(ca)}")
    lines.append("ratios within a repetition, median (p10-p90) [share of reps > 1]:")
    for ref, what, f in (("p", "step blocks / the parts' F+B host", blocks), ("b", "step blocks / b's", blocks),
                         ("c", "step blocks / c's", blocks), ("c", "thread in programs / c's",
                                                              lambda r: sum(r["host_us"])),
                         ("c", "iteration / c's", lambda r: r["time_us"])):
        if ref not in names:
            continue
        for n in names:
            if n == ref or (f is not blocks and "host_us" not in reps[n][0] and what != "iteration / c's"):
                continue
            try:
                pairs = [f(a) / f(b) for a, b in zip(reps[n], reps[ref])]
            except (KeyError, ZeroDivisionError):
                continue
            qq = q(pairs)
            med[n][f"{what}"] = qq
            lines.append(f"  {what:36s} {n:4s}: {fmt(qq)} [{sum(x > 1 for x in pairs)}/{len(pairs)}]")
    if "alloc" in res:
        lines.append("the allocator alone, GPU 0 (host us per call: median of per-sample medians, range of those):")
        for name, samples in res["alloc"].items():
            ms = [stat.median(s) for s in samples if s]
            if ms:
                lines.append(f"  {name}: {stat.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f})")
    res["summary"] = med
    with open(os.path.join(OUT, f"probe-{N}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


pin = P.one_core() if PIN else nullcontext()
with pin as core:
    res["core"] = core
    names = list(VARIANTS)
    rep = 0
    per_rep = None
    while rep < MAX_REPS:
        t_rep = clock()
        rot = rep % len(names)
        for name in names[rot:] + names[:rot]:
            try:
                r, _ = one(name)
            except Exception as e:  # noqa: BLE001
                res["notes"].append(f"variant {name} dropped at rep {rep}: {e!r}")
                print(res["notes"][-1], flush=True)
                set_mode()
                names.remove(name)
                continue
            r["rep"] = rep
            r["calls"] = {k: round(v, 1) for k, v in r["calls"].items()}
            res["reps"].setdefault(name, []).append(r)
        rep += 1
        per_rep = clock() - t_rep
        if rep % 25 == 0:
            save()
            print(f"{rep} reps at {clock() - T_START:.1f} s", flush=True)
        if left() < ALLOC_S + 3.0 + 1.5 * per_rep:
            break
    res["rep_s"] = per_rep
    save()
    if not CPU and left() > 3.0:
        try:
            res["alloc"] = alloc_probe(samples=5 if left() > 5 else 2)
        except Exception as e:  # noqa: BLE001 -- the main result is saved; say what broke
            res["notes"].append(f"alloc probe failed: {e!r}")
    res["elapsed_s"] = clock() - T_START
    for n in res["reps"]:
        for r in res["reps"][n]:
            for k in ("time_us", "issue_us", "parts_host_us"):
                if k in r:
                    r[k] = round(r[k], 1)
            for k in ("host_us", "block_us"):
                if k in r:
                    r[k] = [round(x, 1) for x in r[k]]
    summary()
    save()
print(f"probe: done in {clock() - T_START:.1f} s", flush=True)
