"""Step accounting: every microsecond of every step of a rank, said as what its GPU did or why it sat idle.

The backbone of ``kit doctor``: the rules explain slices of this account, and a slice no rule explains is a
finding of its own, so "no finding" is only said of a step that is accounted for.

**Steps.** One window per ``ProfilerStep#N`` annotation. Kineto's step annotation is the host's side of a
step; its GPU work may end later (the host runs ahead). As in torch-tb-profiler's step-time breakdown, a window
starts at its annotation's start or at the previous window's end, whichever is later, and ends at its
annotation's end or at the end of the last GPU work the step issued, whichever is later -- so the windows tile the
traced steps without overlap. Without step annotations the traced span of the GPU work is one window. Work
outside every window (the profiler's own start and stop, and the one-time work :func:`kit.doctor.steps.steady`
leaves out) is not accounted.

**Busy time** (the union of the GPU activities, all streams): ``compute`` (any kernel other than a collective's)
> ``comm`` (NCCL kernels: transfer and waiting for peers; the doctor splits them across ranks) > ``memory``
(memcpy / memset). A microsecond with a compute kernel running is compute even if a collective ran beside it: the
communication was hidden.

**Idle time** (no GPU activity): each idle stretch ends when the next GPU activity starts; that activity was
issued by a host call (Kineto's ``correlation``) on some host thread -- the thread that had to issue it. If that
call had already returned when the stretch began, the work was queued and the GPU did not start it: ``queued``
(the GPU's own dispatch gaps, waits between streams, CUDA-graph internals). Otherwise the GPU waited for that
thread, and the stretch is split by what the thread was doing, in this precedence (first match wins):

1. ``input``      -- inside ``enumerate(DataLoader)...`` (waiting for the next batch);
2. ``sync``       -- in a synchronising call (:data:`kit.doctor.calls.SYNC_CALLS`, a blocking copy such as the
   device-to-host copy behind ``.item()``);
3. ``pageable``   -- in a copy call from pageable host memory to the device (the host model's ``pageable_h2d``
   calls): the host is blocked while CUDA stages the data, whatever ``non_blocking`` says;
4. ``allocator``  -- in the caching allocator's device calls (:data:`kit.doctor.calls.ALLOC_CALLS`;
   ``empty_cache()`` is a run of ``cudaFree``);
5. ``host_stall`` -- in a stretch of at least :data:`kit.doctor.host_model.STALL_US` in which no thread of the
   process issued GPU work (a launch, copy, memset or graph replay whose activity is in the trace; the
   backward's kernels come from the autograd thread while the main thread waits in ``backward()``), outside
   every recorded op (the host model's ``stall``, :mod:`kit.doctor.host_model`) -- on a rank whose quiet time shows
   its core taken away (:func:`kit.doctor.contended.lost_cores`), only one stall of its own code a step (the host
   model's :data:`~kit.doctor.host_model.ONE_STALL`: each step's longest stretch and the backward hooks'; its other
   stretches are the core taken in slices, its issuing done more slowly: ``launch``; :attr:`Account.split`): Python or
   C++ work that issues nothing (logging, checkpointing, garbage collection, ``time.sleep``, a loop polling
   ``cudaEventQuery``); inside a long recorded op (kept by the trace layer, :data:`kit.traces.frames.
   LONG_CPU_OP_US`) or the dispatch before the first launch of one of PyTorch's own regions of issuing code
   (:data:`kit.doctor.calls.FRAMEWORK_REGIONS`: the optimizer's step) it is the host's own cost of issuing work:
   ``launch``;
6. ``launch``     -- anything else: the thread was issuing work (ops, launches, the framework's per-op cost
   between them) and could not keep up with the kernels.

**Catch-up (the queue-drain attribution).** A thread that was blocked (1-5) when the GPU ran dry let the queue
drain; after it returns the GPU idles while the host refills the queue, although the thread is "issuing" (or
waiting for its DataLoader, a wait the queued work would have hidden). A host blocked D us is D us behind where it
would have been without the block: of the host-caused idle that follows on that thread, the first D us are the
block's (:func:`owed_idle`: without the block the host's later work would have been issued D us earlier and the
GPU would have run it in that idle instead; the GPU running, and its queued gaps, pay nothing of the debt) -- what
the step would save without the block, and no more. The oldest block still owed takes an idle microsecond, so a
DataLoader wait that a ``.item()`` per parameter exposed is the syncs', and the wait's own debt counts after
theirs; a wait that ends when something else is done (a synchronising call or a device free: the GPU; a
request to the DataLoader's worker processes: the workers) ends the other blocks' debts, the lead used up there,
and its own idle is its own. A block that begins after the GPU already ran dry (a host that was behind anyway: launch-bound)
keeps only its own time. ``step_start``: a ``launch`` part before the first GPU
work a window issued (the host runs a step's Python before issuing anything). ``unexplained``: idle before which
no issuing call is in the trace (no CUDA runtime events; work issued before the trace began). Idle after the last
GPU work of the trace is split by what the thread that issued that work did next.

The slices of a window sum to the window (a test checks it on every committed trace).

**CPU-only traces** (gloo jobs): no GPU activity; the main thread (the one holding the step annotations) plays
the device, split by the host model's kinds in the host model's precedence (:data:`CPU_SLICES`: one order,
derived once in :mod:`kit.doctor.host_model`): ``input`` (``data_wait``: its DataLoader requests), ``comm``
(``comm_wait``: a collective running on any thread of the process -- gloo runs it on its own thread while the
main thread waits), ``host_stall`` (``stall``: >= :data:`kit.doctor.host_model.STALL_US` without a recorded op),
``compute`` (the rest: its CPU ops and its time between them -- Python, dispatch -- on a CPU-only job the host is
the device). This needs every CPU op, so such a trace is
read once more with ``cpu="all"`` (CPU-only traces are small).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..traces.intervals import cover, partition, union_np
from .calls import STEP_PREFIX, WORKER_LOADER
from .host_model import HostModel, host_model, name_mask, names_str

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

    from .model import RankView

BUSY = ("compute", "comm", "memory")
HOST = ("input", "sync", "pageable", "allocator", "host_stall", "launch")
IDLE = HOST + ("step_start", "queued", "unexplained")
SLICES = BUSY + IDLE
BLOCKING = ("input", "sync", "pageable", "allocator", "host_stall")
ISSUING = ("launch", "step_start")
"""the host-caused slices in which the thread was issuing (not blocked): a block's catch-up is taken from them"""
HOST_KIND = {"input": "data_wait", "sync": "sync", "allocator": "alloc", "host_stall": "stall"}
"""the host model's kind (:data:`kit.doctor.host_model.KINDS`) behind each blocking slice; ``pageable`` is the host
model's ``pageable_h2d`` calls (:func:`pageable_spans`)"""
TOP_STALLS = 5


@dataclass(frozen=True)
class Account:
    """One rank's step accounting (see the module docstring). Small and picklable: per-step totals, never events."""

    rank: int
    mode: str
    """'gpu' (the GPU's timeline) or 'cpu' (a CPU-only trace: the main thread's timeline)"""
    per_step: "pd.DataFrame"
    """one row per window: step (-1 without step annotations), start, end, dur and one column per slice (us)"""
    stalls: tuple[dict, ...] = ()
    """the longest host stalls that left the GPU idle: start_us, dur_us, idle_us, before/after (the CUDA calls
    around the stretch), within (annotations overlapping it)"""
    calls: dict = field(default_factory=dict)
    """per slice, the host calls/annotations behind it: {'allocator': {'cudaFree': n, ...}, 'sync': {...},
    'input': {'enumerate(DataLoader)#...': n}}"""
    launch: dict = field(default_factory=dict)
    """kernels issued inside the windows, their median duration and the median interval between launch calls"""
    queued: dict = field(default_factory=dict)
    """the queued idle gaps: count per step, median, and ``above_median_share``: the part of the queued time
    above the median gap (the median is the GPU's own dispatch gap between kernels on this trace: a cost of the
    kernel count, not a wait; what exceeds it is waits between streams and graph dependencies)"""
    threads: int = 1
    """host threads that issued GPU work"""
    step_us: float | None = None
    """the rank's step time (:func:`kit.doctor.steps.step_time`): a slice's cost is its share of the window
    times this, so no cost exceeds a step"""
    caught_up: dict = field(default_factory=dict)
    """per blocking slice, the part of it (us, summed over the windows) that is the host's catch-up after its
    blocks (module docstring, *Catch-up*): GPU idle while the thread was issuing (:data:`ISSUING`), moved to the block
    that drained the queue. The host issued it at its own pace -- the profiler's, where it slows the issuing: the
    profiler's overhead lands there as it does in ``launch`` (:mod:`kit.doctor.reconcile`)"""
    one_stall: bool = False
    """whether ``host_stall`` holds only the host model's one stall a step (:func:`account`'s ``split``: the rank's
    core shown lost), the rest of its stall time in ``launch``"""
    split: "Account | None" = None
    """the same rank's account with only the host model's one stall a step in ``host_stall`` (:func:`account`'s
    ``split``), where that differs: the job phase takes it in this one's place for a rank whose quiet time shows its
    core taken away (:func:`kit.doctor.contended.lost_cores`); None elsewhere"""

    @property
    def steps(self) -> int:
        return max(1, len(self.per_step))

    @property
    def total(self) -> dict[str, float]:
        """Each slice summed over the windows (us)."""
        return {s: float(self.per_step[s].sum()) for s in SLICES}

    def per_step_us(self, s: str) -> float:
        """A slice's mean per window (us)."""
        return float(self.per_step[s].sum()) / self.steps

    @property
    def window_us(self) -> float:
        return float(self.per_step["dur"].sum()) / self.steps

    @property
    def idle_us(self) -> float:
        return sum(self.per_step_us(s) for s in IDLE)

    def cost(self, s: str) -> float:
        """A slice's cost per step: its share of the mean window times the rank's step time."""
        w = self.window_us
        if not w:
            return 0.0
        return self.per_step_us(s) / w * (self.step_us or w)

    def caught_up_cost(self, s: str) -> float:
        """The cost per step of the catch-up part of slice ``s`` (:attr:`caught_up`), as :meth:`cost` states it."""
        w = self.window_us
        if not w:
            return 0.0
        return float(self.caught_up.get(s, 0.0)) / self.steps / w * (self.step_us or w)

    def share(self, s: str) -> float:
        return self.per_step_us(s) / self.window_us if self.window_us else 0.0

    def charged(self, s: str, whole: bool = False) -> float:
        """The part of slice ``s`` a finding charges (:data:`CHARGED`; all of it when ``whole``)."""
        return 1.0 if whole or s not in CHARGED else CHARGED[s](self)

    def calls_text(self, key: str, n: int = 3) -> str:
        """The ``n`` costliest calls behind slice ``key`` (:attr:`calls`): 'cudaFree x2/step (0.31 ms), ...'."""
        got = self.calls.get(key) or {}
        top = sorted(got.items(), key=lambda kv: -kv[1]["host_us"])[:n]
        return ", ".join(f"{name} x{v['calls'] / self.steps:.3g}/step ({v['host_us'] / self.steps / 1e3:.2f} ms)"
                         for name, v in top)

    def table(self) -> "pd.DataFrame":
        """One row per slice: us per step and share of the window."""
        import pandas as pd

        w = self.window_us or float("nan")
        return pd.DataFrame({"slice": SLICES, "us_per_step": [self.per_step_us(s) for s in SLICES],
                             "share": [self.per_step_us(s) / w for s in SLICES]})


def rank_account(view: "RankView", host: "HostModel | None", cpu_all: "pd.DataFrame | None" = None) -> Any:
    """The accounting stage of one rank: its :class:`Account` from its host model, or a Skip saying why there is
    none (``cpu_all``: every CPU event of a CPU-only trace). On a GPU trace whose host model splits its stall time
    (:meth:`kit.doctor.host_model.HostModel.splits`) the account carries the split's reading too (:attr:`Account.split`:
    the job phase takes it for a rank whose core it shows lost, :func:`kit.doctor.contended.lost_cores`)."""
    import dataclasses

    from .model import Skip

    if not view.trace.gpu.empty:
        a = account(view, host) if host is not None else None
        if a is not None and host.splits():
            a = dataclasses.replace(a, split=account(view, host, split=True))
        return a or Skip(
            "step_accounting", "every GPU activity in the trace lasts 0 us: nothing to account the step by")
    if host is None or cpu_all is None:
        return Skip("step_accounting", "no GPU activity and no CPU ops in the trace: nothing to account the step "
                                       "by (the capture notes say what to record)")
    return account_cpu(view, cpu_all, host) or Skip("step_accounting", "no step annotations and no CPU ops on any "
                                                                       "thread to place a window on")


CHARGED = {"queued": lambda a: float(a.queued.get("above_median_share") or 0.0)}
"""the part of a slice a finding charges: of ``queued``, only what exceeds the GPU's own dispatch gap (the
median queued gap of the rank): the dispatch floor is the price of the kernel count (``launch``-side findings
and fusion address it), not a wait anything could remove; it stays in the accounting table"""


def slice_extract(rid: str):
    """The extract of a rule that reads the rank's accounting (:attr:`kit.doctor.model.RankView.account`)."""
    from .model import Skip

    def extract(view: "RankView"):
        a = view.account
        return Skip(rid, a.why) if isinstance(a, Skip) else a

    return extract


# ------------------------------------------------------------------------------------------------ GPU mode
def account(view: "RankView", host: "HostModel | None" = None, split: bool = False) -> "Account | None":
    """The rank's :class:`Account` (GPU mode; see :func:`account_cpu` for CPU-only traces) from its host model
    (:mod:`kit.doctor.host_model`, built here when not given); None when no GPU activity lasts any time. ``split``:
    the ``host_stall`` slice holds only the host model's one stall a step (:meth:`~kit.doctor.host_model.HostModel.
    one_stall`), the rest of the stall time ``launch`` (a rank whose core is shown lost); else every stall stretch."""
    import numpy as np
    import pandas as pd

    g = view.issued()
    g = g[(g["end"] > g["ts"])]
    if g.empty:  # GPU activity of no length (or none): nothing to account the step by
        return None
    if host is None:
        host = host_model(view)
    calls = host.calls
    ts_all, end_all = g["ts"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float)
    win = host.windows
    kern = (g["cat"] == "kernel").to_numpy()
    nccl = g["nccl"].astype(bool).to_numpy()
    sets = {"compute": union_np(ts_all[kern & ~nccl], end_all[kern & ~nccl]),
            "comm": union_np(ts_all[kern & nccl], end_all[kern & nccl]),
            "memory": union_np(ts_all[~kern], end_all[~kern])}
    wa, wb = win["start"].to_numpy(dtype=float), win["end"].to_numpy(dtype=float)

    # the next GPU activity after each point: its start, its issuing call's end and thread
    order = np.argsort(ts_all, kind="stable")
    starts = ts_all[order]
    call_end = g["call_end"].to_numpy(dtype=float)[order]
    tid = g["tid"].to_numpy()[order]
    # each window's first own GPU work (issued inside the window)
    call_ts = g["call_ts"].to_numpy(dtype=float)[order]
    kw = np.searchsorted(wa, call_ts, side="right") - 1
    own = (kw >= 0) & (call_ts < wb[np.clip(kw, 0, None)])
    first_own = np.full(len(wa), np.inf)
    np.minimum.at(first_own, kw[own], starts[own])

    threads, model = list(host.threads), host
    host = {t: {**{s: host.spans(k, t) for s, k in HOST_KIND.items()}, "host_stall": host.one_stall(t) if split else host.spans("stall", t),
                "pageable": pageable_spans(model, t)} for t in threads}
    extra = [wa, wb, call_end[~np.isnan(call_end)]]
    pts = partition(list(sets.values()) + [s for h in host.values() for s in h.values()], extra=np.concatenate(extra))
    pts = pts[(pts >= wa.min()) & (pts <= wb.max())] if len(wa) else pts
    s, e = pts[:-1], pts[1:]
    w = np.searchsorted(wa, s, side="right") - 1
    inwin = (w >= 0) & (s < wb[np.clip(w, 0, None)])
    s, e, w = s[inwin], e[inwin], w[inwin]
    cls = np.full(s.shape, "", dtype=object)
    c_comp, c_comm, c_mem = (cover(*sets[k], s) for k in BUSY)
    cls[c_comp] = "compute"
    cls[~c_comp & c_comm] = "comm"
    cls[~c_comp & ~c_comm & c_mem] = "memory"
    idle = cls == ""
    nxt = np.searchsorted(starts, e, side="left")  # first activity starting at or after the segment's end
    has_next = nxt < len(starts)
    j = np.clip(nxt, 0, max(len(starts) - 1, 0))
    # after the last GPU work of the trace nothing was issued: the thread that issued that work is the one the
    # GPU waited for (a step's trailing stall: a gc.collect after the optimizer), its next call never came
    last_tid = tid[len(starts) - 1] if len(starts) else None
    ce = np.where(has_next, call_end[j] if len(starts) else np.nan, np.inf)
    t_next = np.where(has_next, tid[j] if len(starts) else None, last_tid)
    unknown = idle & (np.isnan(ce) | pd.isna(t_next))
    queued = idle & ~unknown & (ce <= s)
    hostpart = idle & ~unknown & ~queued
    cls[unknown] = "unexplained"
    cls[queued] = "queued"
    for t in threads:
        m = hostpart & (t_next == t)
        if not m.any():
            continue
        sub = np.full(int(m.sum()), "launch", dtype=object)
        ss = s[m]
        for k in reversed(BLOCKING):  # first in precedence wins: assign in reverse
            sub[cover(*host[t][k], ss)] = k
        cls[m] = sub
    dur = e - s
    # step_start: launch time before the window's first own GPU work
    cls[(cls == "launch") & (e <= first_own[w])] = "step_start"
    per = pd.DataFrame({"w": w, "cls": cls, "dur": dur}).pivot_table(index="w", columns="cls", values="dur",
                                                                         aggfunc="sum", fill_value=0.0)
    per = per.reindex(index=range(len(win)), columns=list(SLICES), fill_value=0.0)
    stride = len(starts) + 1
    grp = np.where(idle, w * stride + nxt, -1)
    waits = {t: waiting_calls(model, t) for t in threads}
    caught_up: dict[str, float] = {}
    for (wi, cause, k), amount in owed_idle(grp, w, cls, dur, s, t_next, host, waits, stride).items():
        per.loc[wi, k] -= amount
        per.loc[wi, cause] += amount
        if k in ISSUING:
            caught_up[cause] = caught_up.get(cause, 0.0) + amount
    per_step = pd.concat([win.reset_index(drop=True).assign(dur=wb - wa), per.reset_index(drop=True)], axis=1)

    in_win = (kw >= 0) & own
    k_in = kern[order] & in_win
    launch_calls = calls[calls["correlation"].isin(set(g["correlation"].dropna()))]
    lts = np.sort(launch_calls["ts"].to_numpy(dtype=float))
    kdur = (end_all[order] - starts)[k_in]
    launch = {"kernels_per_step": int(k_in.sum()) / max(1, len(win)),
              "kernel_median_us": float(np.median(kdur)) if kdur.size else None,
              "launch_interval_median_us": float(np.median(np.diff(lts))) if lts.size > 1 else None}
    qm = cls == "queued"
    qd = pd.Series(dur[qm]).groupby(grp[qm]).sum()
    floor = float(qd.median()) if len(qd) >= 3 else 0.0
    above = float((qd - floor).clip(lower=0).sum()) if len(qd) else 0.0
    return Account(rank=view.rank, mode="gpu", per_step=per_step,
                   stalls=in_step(_stalls(view, calls, host, s, e, cls, model), win),
                   calls=_behind(view, model, s, e, threads), launch=launch,
                   queued={"gaps_per_step": len(qd) / max(1, len(win)),
                           "median_us": float(qd.median()) if len(qd) else None,
                           "above_median_share": above / float(qd.sum()) if len(qd) and qd.sum() > 0 else 0.0},
                   threads=len(threads), step_us=view.step_us, caught_up=caught_up, one_stall=split)


def pageable_spans(host: HostModel, tid: Any) -> "tuple[np.ndarray, np.ndarray]":
    """The sorted disjoint spans of thread ``tid``'s copy calls from pageable host memory to the device."""
    c = host.calls
    c = c[(c["tid"] == tid) & c["pageable_h2d"]] if "pageable_h2d" in c.columns else c.iloc[:0]
    return union_np(c["ts"], c["end"])


def owed_idle(grp, w, cls, dur, s, t_next, host, waits, stride) -> dict[tuple[int, str, str], float]:
    """The queue-drain attribution (module docstring, *Catch-up*): ``{(window, cause, slice): us}`` to move from
    a host-caused slice to the block whose drained queue left the GPU idle. ``waits``: per thread, per blocking
    slice, the spans of its waits that end when something else is done (:func:`waiting_calls`). ``grp``: per idle
    segment, its window times ``stride`` plus the index of the GPU activity that ends it (-1 on busy segments).

    A block that drained the GPU (an idle stretch begins inside it) left its thread ``D`` us (its duration) behind
    where it would have been without it. Had the host not blocked, its work after the block would have been issued
    ``D`` us earlier and the GPU would have run it in the idle stretches that follow, until it had run ``D`` us of
    them: each microsecond of host-caused idle GPU time after the block, on that thread, pays ``D`` down (the
    block's *debt*), whatever the host was doing (issuing, or waiting for its DataLoader: a drained queue no longer
    hides the wait). The GPU running without idling pays nothing (its kernels run as late with the block as
    without), and neither do queued gaps (the GPU's own). Every debt of the thread is paid by every such
    microsecond (each block's own what-if), and the microsecond goes to the oldest block still owed. Blocks of one
    kind on one thread share one debt (a ``.item()`` per parameter adds its ``D`` each time) until it is paid off;
    the kind's next block owes anew, from its own start. A wait that ends when
    something else is done (``waits``: the GPU, the DataLoader's workers) ends the other kinds' debts begun before
    it (the lead they cost the host would have been spent waiting in it), and the idle inside it is its own."""
    import numpy as np

    m = np.flatnonzero(grp >= 0)
    if not len(m):
        return {}
    # an idle stretch that a window's start cuts in two: its second part did not drain the GPU (it was dry already).
    # Two idle pieces of consecutive windows are one stretch when the same GPU activity ends them (``grp`` is
    # window * stride + the index of that activity): the GPU ran nothing between them, whatever time lies between
    # the windows -- not a tolerance on timestamps (~1e12 us: np.isclose's relative one spans ~49 s)
    cont = np.r_[False, (grp[:-1] >= 0) & (grp[1:] >= 0) & (grp[1:] != grp[:-1])
                 & (grp[:-1] % stride == grp[1:] % stride)]
    m = m[np.lexsort((s[m], grp[m]))]
    g_, w_, c_, d_, s_, t_, k_ = grp[m], w[m], cls[m], dur[m], s[m], t_next[m], cont[m]
    own = np.zeros(len(m), dtype=bool)  # idle inside a wait that ends when something else is done: its own
    for t, by_kind in waits.items():
        mt = t_ == t
        for k, (a, b) in by_kind.items():
            mk = mt & (c_ == k)
            own[mk] = cover(a, b, s_[mk])
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(g_)) + 1, [len(m)]])
    host_classes = ("launch", "step_start") + BLOCKING
    moves: dict[tuple[int, str, str], float] = {}
    debts: dict = {}  # thread -> {kind: [us owed, start of its first block since it was last paid off]}, oldest first
    seen: dict = {}  # (thread, kind) -> the block whose drain was counted last (one block, two windows: once)
    for j in np.argsort(s_[bounds[:-1]], kind="stable"):  # the idle stretches in time order
        lo, hi = int(bounds[j]), int(bounds[j + 1])
        c0, t, s0, wi = c_[lo], t_[lo], float(s_[lo]), int(w_[lo])
        if c0 not in host_classes:  # the next work was already queued: the GPU's own gap
            continue
        mine = debts.setdefault(t, {})
        waited = waits.get(t, {})
        if c0 in BLOCKING:
            a, b = host[t][c0]
            i = int(np.searchsorted(a, s0, side="right")) - 1
            if i >= 0 and seen.get((t, c0)) != i and not k_[lo]:  # it drained the GPU: its debt starts (or grows)
                seen[(t, c0)] = i
                mine.setdefault(c0, [0.0, float(a[i])])[0] += float(b[i] - a[i])
        for q in range(lo, hi):
            k, amount = c_[q], float(d_[q])
            if k not in host_classes or amount <= 0 or not mine:
                continue
            for x, (a, _) in waited.items():  # such a wait since another kind's block began
                if len(mine) > (x in mine):
                    i = int(np.searchsorted(a, s_[q], side="right")) - 1
                    for y in [y for y, v in mine.items() if i >= 0 and y != x and v[1] < a[i]]:
                        del mine[y]
            if own[q]:  # such a wait's own idle pays its own kind's debt only
                if k in mine:
                    mine[k][0] -= amount
            else:
                taken = 0.0
                for x, v in mine.items():  # the oldest debt still owed takes the microsecond ...
                    share = max(0.0, min(amount, v[0]) - taken)
                    if share > 0 and x != k:
                        moves[(wi, x, k)] = moves.get((wi, x, k), 0.0) + share
                    taken += share
                for v in mine.values():  # ... and every debt is paid down by it
                    v[0] -= amount
            for x in [x for x, v in mine.items() if v[0] <= 0]:  # paid off: the kind's next block owes anew
                del mine[x]  # (from its own start, the newest debt: a wait since an old paid block ends nothing)
    return moves


def waiting_calls(host: HostModel, tid: Any) -> "dict[str, tuple[np.ndarray, np.ndarray]]":
    """Thread ``tid``'s waits that end when something else is done, whenever they begin, by the slice they block
    in, as sorted disjoint spans: its synchronising calls (``sync``) and device frees (``allocator``) end when the
    GPU is done (:meth:`kit.doctor.host_model.HostModel.gpu_waits`), its requests to a DataLoader's worker processes
    (``input``, :data:`WORKER_LOADER`) when the workers have the batch -- a host that came earlier would have waited longer.
    (An in-process DataLoader loads the batch when asked: that wait is the host's own work, and moves with it.)"""
    act = host.activity
    data = act[(act["tid"] == tid) & (act["kind"] == "data_wait")]
    data = data[data["name"].astype(str).str.contains(WORKER_LOADER, regex=False)]
    return {**host.gpu_waits(tid), "input": union_np(data["ts"], data["end"])}


def _stalls(view, calls, host, s, e, cls, model=None) -> tuple[dict, ...]:
    """The longest host-stall stretches that left the GPU idle, with the CUDA calls around them and the
    annotations inside them (what the host was doing, where the trace says); ``maybe``, where part of one lies in
    an autograd node whose hole is not at that node every step (``model``'s :data:`kit.doctor.host_model.
    HOOK_OR_GIL`): what it may be."""
    import numpy as np

    from ..traces.intervals import covered
    from .host_model import ALL, HOOK_OR_GIL

    unsure = (model.sets.get(ALL, {}).get(HOOK_OR_GIL) if model is not None else None) or ((), ())

    out = []
    idle = cls == "host_stall"
    cpu = view.trace.cpu
    ann = cpu[(cpu["cat"] == "user_annotation") & ~name_mask(cpu["name"], lambda n: n.str.startswith(STEP_PREFIX))] \
        if not cpu.empty else cpu
    for t, sets in host.items():
        a, b = sets["host_stall"]
        if not len(a):
            continue
        idle_in = np.array([float(((e - s) * (idle & (s >= x) & (e <= y))).sum()) for x, y in zip(a, b)])
        for i in np.argsort(-idle_in)[:TOP_STALLS]:
            if idle_in[i] <= 0:
                break
            x, y = float(a[i]), float(b[i])
            mine = calls[calls["tid"] == t]
            before = mine[mine["issues"] & (mine["end"] <= x + 1e-3)].tail(1)["name"].tolist()
            after = mine[mine["issues"] & (mine["ts"] >= y - 1e-3)].head(1)["name"].tolist()
            inside = ann[(ann["tid"] == t) & (ann["ts"] < y) & (ann["end"] > x)]["name"].astype(str).unique().tolist()[:5]
            polled = mine[(mine["ts"] >= x) & (mine["end"] <= y)]["name"].value_counts().head(3)
            inside += [f"{n} x{c}" for n, c in polled.items()]
            d = {"start_us": round(x, 1), "dur_us": round(y - x, 1), "idle_us": round(float(idle_in[i]), 1),
                 "before": before[0] if before else None, "after": after[0] if after else None, "within": inside}
            if len(unsure[0]) and covered(*unsure, np.array([x]), np.array([y]))[0] > 0:
                d["maybe"] = "a backward hook or a wait for the GIL (not at the same autograd node every step)"
            out.append(d)
    # a stretch with no thread issuing is (nearly) the same stretch on every thread that issues GPU work: one entry
    # per stretch -- of overlapping ones the one that left the GPU idle longest, then the one whose thread names
    # the calls around it
    out.sort(key=lambda d: (-d["idle_us"], -((d["before"] is not None) + (d["after"] is not None))))
    kept: list[dict] = []
    for d in out:
        x, y = d["start_us"], d["start_us"] + d["dur_us"]
        if not any(x < k["start_us"] + k["dur_us"] and k["start_us"] < y for k in kept):
            kept.append(d)
    return tuple(kept[:TOP_STALLS])


def in_step(stalls: tuple[dict, ...], win: "pd.DataFrame") -> tuple[dict, ...]:
    """Each stall with where it is in words: ``step`` (the window it starts in; -1 without step annotations) and
    ``into_step_us`` (how far into that window it starts)."""
    import numpy as np

    wa = win["start"].to_numpy(dtype=float)
    out = []
    for d in stalls:
        i = int(np.clip(np.searchsorted(wa, d["start_us"], side="right") - 1, 0, len(wa) - 1))
        out.append({**d, "step": int(win["step"].iloc[i]), "into_step_us": round(float(d["start_us"] - wa[i]), 1)})
    return tuple(out)


def _behind(view, host: HostModel, s, e, threads) -> dict:
    """Per blocking slice, the calls (or annotations) behind it, counted inside the windows: what to look at. The
    calls' kinds and the DataLoader waits are the host model's (:attr:`HostModel.calls`, :attr:`HostModel.activity`)."""
    out: dict[str, dict] = {}
    lo, hi = (float(s.min()), float(e.max())) if len(s) else (0.0, 0.0)
    calls = host.calls
    c = calls[(calls["ts"] >= lo) & (calls["ts"] < hi) & calls["tid"].isin(threads)]
    for k, sel in (("sync", c[c["kind"] == "sync"]), ("allocator", c[c["kind"] == "alloc"]),
                   ("pageable", c[c["pageable_h2d"]] if "pageable_h2d" in c.columns else c.iloc[:0])):
        if len(sel):
            agg = sel.groupby("name")["ts"].count()
            us = (sel["end"] - sel["ts"]).groupby(sel["name"]).sum()
            out[k] = {n: {"calls": int(agg[n]), "host_us": round(float(us[n]), 1)} for n in agg.index}
    d = _data_waits(host, lo, hi)
    if len(d):
        out["input"] = _by_name(d)
        inside = _inside(view.trace.cpu, d) if not view.trace.cpu.empty else {}
        if inside:
            out["input_inside"] = inside
    return out


def _data_waits(host: HostModel, lo: float, hi: float, tid: Any = None) -> "pd.DataFrame":
    """The host model's DataLoader waits (``data_wait`` stretches, named by their annotation) starting in
    ``[lo, hi)`` (of thread ``tid``; of any modelled thread when None)."""
    act = host.activity
    m = (act["kind"] == "data_wait") & (act["ts"] >= lo) & (act["ts"] < hi)
    return act[m & (act["tid"] == tid)] if tid is not None else act[m]


def _by_name(rows: "pd.DataFrame") -> dict:
    return {n: {"calls": int(len(x)), "host_us": round(float((x["end"] - x["ts"]).sum()), 1)}
            for n, x in rows.groupby(rows["name"].astype(str))}


def _inside(cpu: "pd.DataFrame", spans: "pd.DataFrame", n: int = 3) -> dict:
    """The long CPU ops the trace kept (>= :data:`kit.traces.frames.LONG_CPU_OP_US`) inside ``spans`` (the
    DataLoader's requests), on the span's thread, outermost only (an op inside a kept op is its part), summed by
    name, the ``n`` longest: where a slow ``next()`` spends its time -- pinning the batch, collating, a transform."""
    ops = cpu[(cpu["cat"] == "cpu_op")] if "cat" in cpu.columns else cpu.iloc[:0]
    if ops.empty:
        return {}
    got: dict[str, list[float]] = {}
    for tid, ts, end in zip(spans["tid"], spans["ts"], spans["end"]):
        o = ops[(ops["tid"] == tid) & (ops["ts"] >= ts) & (ops["end"] <= end)].sort_values(["ts", "end"],
                                                                                          ascending=[True, False])
        reach = -float("inf")
        for name, a, b in zip(names_str(o["name"]), o["ts"], o["end"]):
            if a < reach:  # inside an outer kept op
                continue
            reach = float(b)
            got.setdefault(name, []).append(float(b - a))
    top = sorted(got.items(), key=lambda kv: -sum(kv[1]))[:n]
    return {k: {"calls": len(v), "host_us": round(sum(v), 1)} for k, v in top}


# ------------------------------------------------------------------------------------------------ CPU mode
CPU_SLICES = {"input": ("data_wait",), "comm": ("comm_wait",), "host_stall": ("stall",),
              "compute": ("issue", "idle", "sync", "alloc", "profiler")}
"""the slices of a CPU-only trace, each the sum of the host model's per-step kinds of the main thread (module
docstring)"""


def account_cpu(view: "RankView", cpu_all: "pd.DataFrame", host: "HostModel | None" = None) -> "Account | None":
    """The account of a CPU-only trace (module docstring): the main thread plays the device; None without CPU ops
    to place a window on. The split is the host model's per-step kinds (:data:`CPU_SLICES`); ``cpu_all`` names the
    ops around a stall."""
    import pandas as pd

    if host is None:
        host = host_model(view, cpu_all)
    if host is None:
        return None
    main = host.main_tid
    ops = cpu_all[(cpu_all["tid"] == main) & (cpu_all["cat"] == "cpu_op")]
    win = host.windows
    wa, wb = win["start"].to_numpy(dtype=float), win["end"].to_numpy(dtype=float)
    lo, hi = float(wa.min()), float(wb.max())
    # every stall stretch: a CPU-only job has no quiet time to show a core taken away (kit.doctor.contended)
    stall = host.spans("stall", main)
    hs = host.per_step
    per = pd.DataFrame({sl: sum(hs[f"{k}_us"].to_numpy(dtype=float) for k in kinds)
                        for sl, kinds in CPU_SLICES.items()})
    per = per.reindex(columns=list(SLICES), fill_value=0.0)
    per_step = pd.concat([win.reset_index(drop=True).assign(dur=wb - wa), per], axis=1)
    stalls = []
    inside = [(x, y) for x, y in zip(*stall) if x >= lo and y <= hi]
    for x, y in sorted(inside, key=lambda p: p[0] - p[1])[:TOP_STALLS]:
        before = ops[ops["end"] <= x + 1e-3].tail(1)["name"].astype(str).tolist()
        after = ops[ops["ts"] >= y - 1e-3].head(1)["name"].astype(str).tolist()
        stalls.append({"start_us": round(float(x), 1), "dur_us": round(float(y - x), 1),
                       "idle_us": round(float(y - x), 1), "before": before[0] if before else None,
                       "after": after[0] if after else None, "within": []})
    data = _data_waits(host, lo, hi, main)
    behind = {"input": _by_name(data)} if len(data) else {}
    return Account(rank=view.rank, mode="cpu", per_step=per_step, stalls=in_step(tuple(stalls), win), calls=behind,
                   threads=1, step_us=view.step_us)
