"""Why copy's one-thread pipeline costs the host more inside its forward/backward calls than the same calls timed
as the model's parts: the order the calls are taken in, the transfers between them, or the GPU's state.

    python probe.py OUT_DIR [--stages N] [--budget S] [--cpu] [--no-pin]

One process, no process group, the kit's own pipeline code (``kit.investigations.p2p_transports``) at the GPU
preset's sizes (``configs/gpu.yaml``: pipeline_hidden / batch / micro_batches; 4 layers, bf16). Per repetition, in a
rotating order, one iteration of each variant (every GPU synchronised only before and after it):

* ``a`` grouped: each stage's 1F1B steps back to back on its GPU, stage after stage, no transfer;
* ``b`` interleaved: the same steps in the order the pipeline's one thread takes them (read off variant ``c``'s
  warm-up), no transfer;
* ``bh`` as ``b``, each step's GPU held first (outside the timed window) as the parts hold it;
* ``c`` the pipeline: ``drive`` over ``Stage.iteration`` with the copy transport, as the kit runs it;
* ``c0`` the pipeline with the copy transport's memcpy taken out (buffers, events, waits, record_stream kept);
* ``p`` the model's parts as the kit times them beside each step (``_compute_times``: every stage's forward, then
  every backward in reverse, a GPU hold before each part, a sync per sample; ``m`` samples = one iteration);
* ``p0`` the same with holds of one cycle (the GPU idle while the host issues, as in the host-bound pipeline).

Every forward (``forward`` + ``loss_of``) and backward (``Tensor.backward``) call is timed on the host (perf_counter
per call) and kept, tagged with its stage; ``a``/``b`` also time the pipeline's whole step block (the window of the
kit's ``host_compute_us``), ``c``/``c0`` keep the kit's own ``host_compute_s`` per stage. Then the bare cost of a
device switch: ``torch.cuda.set_device`` round trips, a ``with torch.cuda.device`` block, and a tiny kernel's launch
(``add_`` on one element; an ``mm`` of 512x512) on one device vs taking the devices in turn vs right after a switch
round trip. ``--cpu``: tiny sizes on the CPU with an in-process stand-in transport, no CUDA part (a dry run).
Writes ``probe-<N>.json.gz`` (every sample) and ``probe-<N>.txt`` (medians) to OUT_DIR as it goes.
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
N = arg("--stages", CPU_N if CPU else torch.cuda.device_count(), int)  # a dry run: as many as the GPU run would
BUDGET = arg("--budget", 60.0, float)  # seconds for the whole script, start to end
MAX_REPS = arg("--reps", 200, int)
os.makedirs(OUT, exist_ok=True)
if CPU:
    torch.set_num_threads(1)  # a dry run on a shared box: no intra-op threads spinning on the pinned core


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
           cpus=os.cpu_count(), argv=sys.argv[1:], started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), reps={}, notes=[])


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


# ------------------------------------------------------------------------------------------ the transports
class CpuCopyT(Transport):
    """In-process stand-in for the copy transport on the CPU (dry runs). Endpoints are stage numbers; the sender is
    told by the pipeline's ``_issue`` (``me``) only for receives, so a send is boxed under every pair that ends at
    ``dst`` from its one neighbour that can send there (the pipeline's sends go to a neighbour)."""

    caps = Capabilities(in_process=True)
    name = "cpu-copy"

    def __init__(self, ctx, copy=True):
        super().__init__(ctx)
        self._box, self.posted, self.copy = {}, 0, copy
        self.sender = None  # set by the stage wrapper before a stage's program is resumed

    def device(self, endpoint):
        return torch.device("cpu")

    def poll(self, src, dst):
        return bool(self._box.get((src, dst)))

    def isend(self, t, dst):
        self._box.setdefault((self.sender, dst), deque()).append(t)
        self.posted += 1
        return Work()

    def irecv(self, out, src, stream=None):
        t = self._box[(src, self.sender)].popleft()
        if self.copy:
            out.copy_(t)
        return Work()


def cpu_programs(T, progs):
    """On the CPU, tell the stand-in transport which stage runs (its sends carry no device index)."""
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
LOG: list | None = None  # the current iteration's [kind, stage, host us] per forward / backward call
W_STAGE: dict = {}  # id(weights) -> stage
Y_STAGE: dict = {}  # id(output of a forward / loss) -> stage
_fwd, _loss, _bwd = P.forward, P.loss_of, torch.Tensor.backward


def t_forward(weights, x):
    t0 = clock()
    y = _fwd(weights, x)
    dt = clock() - t0
    s = W_STAGE.get(id(weights), -1)
    Y_STAGE[id(y)] = s
    if LOG is not None:
        LOG.append(["F", s, dt * 1e6])
    return y


def t_loss(y, m):
    t0 = clock()
    out = _loss(y, m)
    dt = clock() - t0
    s = Y_STAGE.get(id(y), -1)
    Y_STAGE[id(out)] = s
    if LOG is not None:
        LOG.append(["L", s, dt * 1e6])
    return out


def t_backward(self, *a, **k):
    s = Y_STAGE.pop(id(self), -1)
    t0 = clock()
    try:
        return _bwd(self, *a, **k)
    finally:
        if LOG is not None:
            LOG.append(["B", s, (clock() - t0) * 1e6])


P.forward = PR.forward = t_forward
P.loss_of = PR.loss_of = t_loss
torch.Tensor.backward = t_backward

# ------------------------------------------------------------------------------------------ set-up
ctx = SimpleNamespace(rank=0, world_size=N, device=dev(0), is_cuda=not CPU)
if CPU:
    T, T0 = CpuCopyT(ctx), CpuCopyT(ctx, copy=False)
else:
    import kit.transports.copy as KC

    T = KC.CopyTransport(ctx)
    for s in range(N - 1):
        T._peer(s, s + 1)
    _memcpy = KC.peer_memcpy
stages = [P.Stage(s, N, L, HID, B, M, dev(s), DT) for s in range(N)]
for st in stages:
    W_STAGE[id(st.weights)] = st.stage
comm = P.CommStreams.make(list(range(N)), separate=True) if not CPU else None
g = torch.Generator().manual_seed(1)
xin = {(s, i): torch.randn(B, HID, generator=g).to(dev(s), DT) for s in range(1, N) for i in range(M)}
gin = {s: torch.randn(B, HID, generator=g).to(dev(s), DT) for s in range(N - 1)}
holds: dict = {}
ORDER: list = []  # [(stage, kind, i)] as the pipeline's one thread takes them


def it_pipeline(nocopy=False):
    """One iteration of the kit's pipeline (``Pipeline.host``): host per stage, host in the compute calls per stage."""
    Tr = T0 if (CPU and nocopy) else T
    if not CPU:
        KC.peer_memcpy = (lambda *a, **k: None) if nocopy else _memcpy
    progs = []
    for s, st in enumerate(stages):
        st.zero_grad()
        progs.append(st.iteration(Tr, s - 1 if s > 0 else None, s + 1 if s < N - 1 else None, comm))
    if CPU:
        progs = cpu_programs(Tr, progs)
    h = [0.0] * N
    try:
        P.drive(progs, Tr, host=h)
    finally:
        if not CPU:
            KC.peer_memcpy = _memcpy
    return dict(host_us=[x * 1e6 for x in h], block_us=[st.host_compute_s * 1e6 for st in stages])


def it_steps(order, hold=False):
    """The pipeline's compute steps in ``order`` (no transfer): each step's block as ``Stage.iteration`` runs it
    (inputs from fixed tensors instead of receive buffers), the block's host time per stage. ``hold``: the step's GPU
    held (``torch.cuda._sleep``, the parts' hold of that stage and part) before its block, outside the timed window,
    so the block's launches queue behind a busy GPU as the parts' do."""
    acts, outs = {}, {}
    block = [0.0] * N
    for st in stages:
        st.zero_grad()
        st.loss = torch.zeros((), device=st.device, dtype=torch.float32)
    for s, kind, i in order:
        st = stages[s]
        first, last = s == 0, s == N - 1
        x_in = None if (kind == "B" or first) else xin[(s, i)].detach()
        if hold and not CPU:
            with on(st.device):
                torch.cuda._sleep(holds[(s, kind)])
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
                    _carry = y.detach()
            else:
                y = outs.pop((s, i))
                if last:
                    y.backward()
                else:
                    y.backward(gin[s])
                x = acts.pop((s, i))
                if not first:
                    _carry = x.grad
        block[s] += clock() - h0
    return dict(block_us=[x * 1e6 for x in block])


def it_parts(hold=True):
    """The model's parts as the kit times them beside each step: ``m`` samples, every stage, forward and backward."""
    hs = holds if hold else {k: 1 for k in holds}
    times = PR._compute_times(stages, N, 0, M, not CPU, hs)
    return dict(parts_host_us={s: [[u["F host"], u["B host"]] for u in us] for s, us in times.items()},
                parts_dev_us={s: [[u.get("F", float("nan")), u.get("B", float("nan"))] for u in us]
                              for s, us in times.items()})


GROUPED = [(s, k, i) for s in range(N) for k, i in P.schedule(s, N, M)]
VARIANTS = {
    "a": lambda: it_steps(GROUPED),
    "b": lambda: it_steps(ORDER),
    "bh": lambda: it_steps(ORDER, hold=True),
    "c": lambda: it_pipeline(False),
    "c0": lambda: it_pipeline(True),
    "p": lambda: it_parts(True),
    "p0": lambda: it_parts(False),
}


def one(name):
    global LOG
    LOG = []
    sync()
    t0 = clock()
    extra = VARIANTS[name]()
    t_issue = clock() - t0
    sync()
    t = clock() - t0
    calls, LOG = LOG, None
    return dict(time_us=t * 1e6, issue_us=t_issue * 1e6, calls=calls, **extra)


def order_from(calls):
    """[(stage, kind, i)] from one pipeline iteration's call log (each stage's k-th call is its schedule's k-th step;
    a forward's loss is part of its step)."""
    nxt = [0] * N
    sched = [P.schedule(s, N, M) for s in range(N)]
    out = []
    for kind, s, _us in calls:
        if kind == "L":
            continue
        k, i = sched[s][nxt[s]]
        if k != kind:
            raise RuntimeError(f"probe: stage {s}'s call {nxt[s]} is {kind}, its schedule says {k}")
        nxt[s] += 1
        out.append((s, k, i))
    if any(nxt[s] != len(sched[s]) for s in range(N)):
        raise RuntimeError(f"probe: the pipeline made {nxt} calls per stage, the schedule has {[len(x) for x in sched]}")
    return out


# ------------------------------------------------------------------------------------------ warm-up
print(f"probe: {N} stages, {'CPU' if CPU else res['gpus']}, sizes {SZ}, budget {BUDGET:.0f} s", flush=True)
PR._compute_times(stages, N, PR.PART_WARMUP, 0, not CPU, holds)  # sizes the holds, as the kit's warm-up does
for _ in range(3):
    r = one("c")
ORDER[:] = order_from(r["calls"])
res["order"] = ORDER
for name in ("a", "b", "bh", "c0", "p", "p0"):
    for _ in range(2):
        one(name)
res["warmup_s"] = clock() - T_START
print(f"warm-up done at {res['warmup_s']:.1f} s; the one thread's order: "
      + " ".join(f"{k}{s}.{i}" for s, k, i in ORDER), flush=True)


# ------------------------------------------------------------------------------------------ device switch
def switch_probe(reps=10, calls=400):
    """Host us per call: set_device round trip, a device block, a tiny launch on one device / in turn / after a
    switch round trip, an mm of 512x512 on one device / in turn. Every sample's per-call times kept."""
    out = {}
    ts = [torch.zeros(1, device=dev(d)) for d in range(N)]
    mm = [(torch.randn(512, 512, device=dev(d), dtype=DT), torch.randn(512, 512, device=dev(d), dtype=DT))
          for d in range(N)]
    other = 1 % N

    def per_call(fn):
        us = []
        for k in range(calls):
            t0 = clock()
            fn(k)
            us.append((clock() - t0) * 1e6)
        return us

    def set_rt(k):
        torch.cuda.set_device(other)
        torch.cuda.set_device(0)

    def block(k):
        with torch.cuda.device(other):
            pass

    cases = {
        "set_device round trip": set_rt,
        "device block": block,
        "add_ one device": lambda k: ts[0].add_(1),
        "add_ devices in turn": lambda k: ts[k % N].add_(1),
        "add_ devices in turn, device block": lambda k: _blk_add(ts, k),
        "add_ after a switch round trip": lambda k: (set_rt(k), ts[0].add_(1)),
        "mm one device": lambda k: torch.mm(*mm[0]),
        "mm devices in turn": lambda k: torch.mm(*mm[k % N]),
    }
    torch.cuda.set_device(0)
    for r in range(-2, reps):
        for name, fn in cases.items():
            sync()
            us = per_call(fn)
            sync()
            if r >= 0:
                out.setdefault(name, []).append(us)
    return out


def _blk_add(ts, k):
    with torch.cuda.device(k % N):
        ts[k % N].add_(1)


# ------------------------------------------------------------------------------------------ measurement
def summary():
    lines = [f"probe-{N}: {N} stages, {'CPU dry run' if CPU else res['gpus'][0] + ' x' + str(N)}, sizes {SZ}, "
             f"core {res.get('core')}, {len(res['reps'].get('c', []))} reps, torch {res['torch']}"]
    names = [n for n in VARIANTS if res["reps"].get(n)]

    def q(xs):
        xs = sorted(xs)
        return (stat.median(xs), xs[len(xs) // 10], xs[(9 * len(xs)) // 10]) if xs else (float("nan"),) * 3

    med = {}
    lines.append("variant | iteration ms (p10-p90) | host in F/B calls per iteration ms (p10-p90) | step blocks ms | "
                 "per call us F / B (stage: median)")
    for n in names:
        rs = res["reps"][n]
        it = q([r["time_us"] / 1e3 for r in rs])
        calls = q([sum(c[2] for c in r["calls"]) / 1e3 for r in rs])
        blocks = q([sum(r["block_us"]) / 1e3 for r in rs]) if "block_us" in rs[0] else None
        parts = q([sum(sum(fb) for us in r["parts_host_us"].values() for fb in us) / 1e3 for r in rs]) \
            if "parts_host_us" in rs[0] else None
        per = {}
        for kind in "FB":
            for s in range(N):
                xs = [c[2] for r in rs for c in r["calls"] if c[0] == kind and c[1] == s]
                per[f"{kind}{s}"] = stat.median(xs) if xs else float("nan")
        med[n] = dict(iteration_ms=it, calls_ms=calls, blocks_ms=blocks, parts_host_ms=parts, per_call_us=per)
        blk = f"{blocks[0]:.2f} ({blocks[1]:.2f}-{blocks[2]:.2f})" if blocks else (
            f"parts' own F+B host {parts[0]:.2f} ({parts[1]:.2f}-{parts[2]:.2f})" if parts else "-")
        lines.append(f"{n:3s} | {it[0]:.2f} ({it[1]:.2f}-{it[2]:.2f}) | {calls[0]:.2f} ({calls[1]:.2f}-{calls[2]:.2f}) | "
                     f"{blk} | " + " ".join(f"{k} {v:.0f}" for k, v in per.items()))
    # paired ratios per repetition (same rep, adjacent in time): host in the calls, variant / p
    for n in names:
        if n == "p" or "p" not in names:
            continue
        pairs = [sum(c[2] for c in a["calls"]) / sum(c[2] for c in b["calls"])
                 for a, b in zip(res["reps"][n], res["reps"]["p"]) if b["calls"]]
        if pairs:
            qq = q(pairs)
            med[n]["calls_over_p"] = qq
            lines.append(f"host in the calls, {n} / p per rep: {qq[0]:.3f} ({qq[1]:.3f}-{qq[2]:.3f})")
    for n in names:  # the kit's comparison: the step blocks (host_compute_us) against the parts' F + B host
        if "block_us" not in res["reps"][n][0] or "p" not in names:
            continue
        pairs = [sum(a["block_us"]) / sum(sum(fb) for us in b["parts_host_us"].values() for fb in us)
                 for a, b in zip(res["reps"][n], res["reps"]["p"])]
        qq = q(pairs)
        med[n]["blocks_over_parts"] = qq
        lines.append(f"step blocks of {n} / the parts' F+B host (p) per rep: {qq[0]:.3f} ({qq[1]:.3f}-{qq[2]:.3f})")
    if "switch" in res:
        lines.append("device switch (host us per call, median of per-sample medians; range of those):")
        for name, samples in res["switch"].items():
            ms = [stat.median(s) for s in samples]
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
            r = one(name)
            r["rep"] = rep
            res["reps"].setdefault(name, []).append(r)
        rep += 1
        per_rep = clock() - t_rep
        if rep % 10 == 0:
            save()
        if left() < (0.0 if CPU else 8.0) + 2 * per_rep:  # keep time for the switch probe and the writing
            break
    res["rep_s"] = per_rep
    save()
    if not CPU and left() > 4.0:
        res["switch"] = switch_probe(reps=10 if left() > 6 else 3)
    elif CPU:
        res["notes"].append("switch probe skipped: no CUDA")
    res["elapsed_s"] = clock() - T_START
    summary()
    save()
print(f"probe: done in {clock() - T_START:.1f} s", flush=True)
