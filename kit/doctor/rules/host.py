"""One rank's GPU and host timeline: the rules that read how the host feeds the GPU.

* ``graph_mixing_gap``      -- NCCL kernels replayed from a CUDA graph wait far longer before they start than the
  graph's other kernels (NCCL's graph-mixing support);
* ``pageable_h2d``          -- host-to-device copies from pageable memory: the host is blocked for each;
* ``h2d_on_compute_stream`` -- host-to-device copies on the stream that runs the step's kernels: compute waits;
* ``launch_bound``          -- the kernels are shorter than the host's time to launch them: the GPU starves;
* ``host_sync``             -- synchronising calls inside the step empty the GPU's queue.

**What every rule reads** (:func:`host_timeline`, built once per rank in the worker and shared by the five
extracts through :meth:`kit.doctor.model.RankView.shared`): each GPU activity joined to the host call that
issued it (:meth:`kit.doctor.model.RankView.issued`: Kineto's ``correlation`` id; every kernel of a replayed
graph carries its ``cudaGraphLaunch``'s), the idle time of the GPU before each kernel (:func:`kit.traces.gaps`:
start minus the latest end of any earlier activity on that GPU, all streams; gaps above 1 ms are host stalls or
step boundaries and are left out), which kernels were *starved* (issued only after the GPU had run dry), and the
synchronising host calls. A GPU activity counts for a step when the host call that issued it falls inside a
``ProfilerStep#N`` window; work still queued from before the trace began is not this step's; without step
annotations the traced span is one step.

**One microsecond, one cause.** The idle GPU time after a synchronising call and the catch-up that follows it
(``host_sync``, :func:`sync_costs`) are not counted again as launch starvation (``launch_bound``), and the host
time blocked in a pageable copy (``pageable_h2d``) is not a ``host_sync`` call. Two findings can still describe one stretch of time from two sides: a pageable copy on the
compute stream blocks the host (``pageable_h2d``) while the compute stream waits for it (``h2d_on_compute_stream``);
each finding's caveats say so.

What each extract returns is a small frozen dataclass of numbers (never events); each judge compares ranks and
reports the worst rank's cost per step, naming every rank where the rule fired.

Longer than the kit's ~400-line modules because the five host rules share one per-rank host timeline (launch calls paired with the GPU work they issued, sync costs); that timeline is the candidate to split out next.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...traces.gaps import DEFAULT_STALL_US, gaps
from ..model import GRAPH_LAUNCH, RULES, Finding, RankView, Rule, Skip, rule
from .comm import DATALOADER, covered, union_np

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

NCCL_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs"
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                        "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"})
"""host calls that block until the GPU (a stream, an event) is done"""
BLOCKING_COPY_CALLS = frozenset({"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyFromSymbol",
                                 "cudaMemcpyToSymbol", "cuMemcpy", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2",
                                 "cuMemcpyDtoD_v2"})
"""copy calls that are synchronous for the host whatever the memory (the CUDA runtime's 'synchronous' API)"""
MIN_GRAPH_NCCL = 3
"""graph-replayed NCCL kernels a rank needs before ``graph_mixing_gap`` judges its gaps"""
MIXING_RATIO, MIXING_EXCESS_US = 1.5, 1.0
"""``graph_mixing_gap`` fires when the median gap before graph-replayed NCCL kernels is at least 1.5x the median
gap before the same graphs' other kernels and at least 1 us above it. Measured on the recorded 2xH200 runs
(recorded/graph_gaps, NCCL 2.28): mixing on, 5.6-6.9 us vs 2.4-2.7 us at 10 layers (2.3-2.6x) and 50-62 us vs
2.6-2.9 us at 160 layers; mixing off (``NCCL_GRAPH_MIXING_SUPPORT=0``), 2.3 us vs 3.1-3.4 us (0.7x)."""
EXCERPT_PAD_US = 100.0
"""context on either side of a finding's timeline excerpt"""
MIN_KERNELS = 20
"""individually launched kernels a rank needs before ``launch_bound`` judges their launch rate"""
EXCERPT_KERNELS = 30
"""kernels a launch_bound excerpt shows from its first starved kernel"""
STARVED_SHARE = 0.25
"""``launch_bound`` fires when (1) the median kernel is shorter than the median interval between the host's
launch calls -- the GPU drains work faster than the host submits it, so no queue can build up -- and (2) at
least this share of the kernels was *starved* (their launch call ended after the GPU had gone idle), so the GPU
did wait for the host. On the recorded runs: collective_tracing's small DDP model, 12 us kernels launched every
25-49 us, 42-85% starved (fires); graph_gaps' eager loops of 160 layers, 53-183 us kernels launched every
22-108 us, at most 7% starved (silent: the host runs ahead, the 1.7-2.5 us gaps are the GPU's own dispatch);
dataloader_sync, 25-35 us kernels every 19-35 us, at most 2% starved (silent)."""


# ------------------------------------------------------------------------------------------- per rank
@dataclass(frozen=True)
class HostTimeline:
    """What the host rules read of one rank (module docstring); lives in the worker only."""

    kernels: "pd.DataFrame"
    """one row per kernel: :meth:`RankView.issued`'s columns + ``gap_us``, ``stall`` (kit.traces.gaps) and
    ``starved``: its host call ended after the GPU had finished everything before it (``call_end > ts - gap``,
    gap below 1 ms, not a graph replay) -- the GPU sat idle waiting for the host to issue it"""
    copies: "pd.DataFrame"
    """one row per memcpy, same added columns (no gap)"""
    calls: "pd.DataFrame"
    """the CUDA runtime/driver calls: name, ts, end, dur, tid, correlation"""
    blocking: "pd.DataFrame"
    """host calls that block inside the steps (``host_sync``'s): name, ts, end, dur, tid, correlation"""
    starts: "np.ndarray"
    """start of every GPU activity, sorted"""
    busy_until: "np.ndarray"
    """for the i-th start: the latest end of the activities started up to it (running max)"""
    data_a: "np.ndarray"
    data_b: "np.ndarray"
    """the host's waits for the DataLoader (``enumerate(DataLoader)...`` annotations), sorted and disjoint"""
    has_runtime: bool
    graph_launches: int


def _str(s: "pd.Series") -> "pd.Series":
    return s.astype(str)


def host_timeline(view: RankView) -> HostTimeline:
    """The rank's :class:`HostTimeline`, shared by the host rules (:meth:`RankView.shared`)."""
    return view.shared("host", _build)


def _build(view: RankView) -> HostTimeline:
    import numpy as np

    t = view.trace
    cpu, gpu = t.cpu, t.gpu
    calls = cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"])] if not cpu.empty else cpu
    calls = calls[["name", "ts", "end", "dur", "tid", "correlation"]].assign(name=lambda d: _str(d["name"]))
    issued = view.issued()
    kernels = gaps(issued, DEFAULT_STALL_US)  # the kernels' rows of issued, + gap_us, before, stall
    gap = kernels["gap_us"].to_numpy(dtype=float)
    kernels = kernels.astype({c: bool for c in ("nccl", "stall", "graph", "in_step")})  # typed even when empty
    kernels = kernels.assign(starved=(gap > 0) & ~kernels["stall"].to_numpy() & ~kernels["graph"].to_numpy()
                             & (kernels["call_end"].to_numpy(dtype=float) > kernels["ts"].to_numpy(dtype=float) - gap))
    copies = issued[issued["cat"] == "gpu_memcpy"]
    order = np.argsort(gpu["ts"].to_numpy(dtype=float), kind="stable")
    starts = gpu["ts"].to_numpy(dtype=float)[order]
    busy_until = np.maximum.accumulate(gpu["end"].to_numpy(dtype=float)[order]) if len(order) else starts
    # blocking host calls inside the steps, between the first and the last kernel the host issued: a
    # synchronize before the first launch or after the last one is the capture's own start/stop
    launched = kernels["call_ts"].dropna()
    first, last = (launched.min(), launched.max()) if len(launched) else (math.inf, -math.inf)
    d2h_pageable = set(copies.loc[_str(copies["name"]).str.contains("DtoH") &
                                  _str(copies["name"]).str.contains("Pageable"), "correlation"].dropna())
    h2d_pageable = set(copies.loc[_pageable_h2d_mask(copies), "correlation"].dropna())
    is_sync = calls["name"].isin(SYNC_CALLS)
    is_copy = (calls["name"].isin(BLOCKING_COPY_CALLS) & ~calls["correlation"].isin(h2d_pageable)) | \
        calls["correlation"].isin(d2h_pageable)
    b = calls[(is_sync | is_copy) & (calls["ts"] > first) & (calls["ts"] < last)]
    b = b[view.in_steps(b["ts"])]
    data = cpu[(cpu["cat"] == "user_annotation") & _str(cpu["name"]).str.startswith(DATALOADER)] \
        if not cpu.empty else cpu
    data_a, data_b = union_np(data["ts"], data["end"])
    return HostTimeline(kernels=kernels, copies=copies, calls=calls, blocking=b, starts=starts,
                        busy_until=busy_until, data_a=data_a, data_b=data_b, has_runtime=bool(len(calls)),
                        graph_launches=int(calls["name"].str.startswith(GRAPH_LAUNCH).sum()))


def _pageable_h2d_mask(copies: "pd.DataFrame") -> "pd.Series":
    """Kineto names a copy from pageable memory ``Memcpy HtoD (Pageable -> Device)``."""
    n = _str(copies["name"])
    return n.str.contains("HtoD") & n.str.contains("Pageable")


def cannot_read(h: HostTimeline, rid: str, runtime_for: str | None) -> Skip | None:
    """Why rule ``rid`` cannot run on this rank, or None: no GPU activity at all (nothing the host issued), or --
    when ``runtime_for`` says what the rule reads of them -- no CUDA runtime calls."""
    if len(h.starts) == 0:
        return Skip(rid, "no GPU activity in the trace (recorded with ProfilerActivity.CUDA?): nothing issued to "
                         "the GPU to look at")
    if runtime_for and not h.has_runtime:
        return Skip(rid, "no CUDA runtime events in the trace (profile with ProfilerActivity.CPU as well as CUDA): "
                         f"the host calls that issue and wait for GPU work are not there ({runtime_for})")
    return None


def host_extract(rid: str, runtime_for: str | None):
    """Decorates ``fn(view, timeline) -> summary`` into a rule's ``extract(view)``: the rank's
    :class:`HostTimeline`, or the :class:`Skip` of :func:`cannot_read` when the trace lacks what the rule reads."""

    def wrap(fn):
        def extract(view: RankView):
            h = host_timeline(view)
            return cannot_read(h, rid, runtime_for) or fn(view, h)

        extract.__name__, extract.__doc__ = fn.__name__, fn.__doc__
        return extract

    return wrap


def _median(s) -> float | None:
    import numpy as np

    a = np.asarray(s, dtype=float)
    a = a[~np.isnan(a)]
    return float(np.median(a)) if a.size else None


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), nd)


# ------------------------------------------------------------------------------------------- judging
PER_RANK_LIMIT = 16
"""evidence lists every firing rank's numbers up to this many ranks, else the 8 costliest"""


@dataclass(frozen=True)
class HostSummary(ABC):
    """The base of what each host rule's extract returns (a frozen dataclass of numbers): its cost per step, whether
    the rule fires on this rank, the evidence numbers and the one-sentence summary, which :func:`judge_fired`
    reads."""

    steps: int
    """what the per-step numbers are divided by (:attr:`RankView.n_steps`)"""
    window: tuple[float, float] | None
    """where on the rank's trace clock the notebook's timeline excerpt should look (one representative instance:
    the median gap, the longest copy, the costliest call); None when there is none"""

    @property
    @abstractmethod
    def cost(self) -> float: ...

    @property
    def fires(self) -> bool:
        return self.cost > 0

    @abstractmethod
    def evidence(self) -> dict[str, Any]: ...

    @abstractmethod
    def sentence(self, who: str) -> str: ...

    def per_step(self, x: float) -> float:
        return float(x) / max(1, self.steps)


def judge_fired(rid: str):
    """The judge every host rule shares: one finding naming every rank where the rule fired; the cost is the
    worst rank's, the evidence that rank's numbers plus every firing rank's (up to :data:`PER_RANK_LIMIT`)."""

    def judge(summaries: list[tuple[int, HostSummary]], ctx) -> list[Finding]:
        fired = sorted(((rk, x) for rk, x in summaries if x.fires), key=lambda rx: -rx[1].cost)
        if not fired:
            return []
        r = RULES[rid]
        worst_rank, worst = fired[0]
        shown = fired if len(fired) <= PER_RANK_LIMIT else fired[:8]
        ev = {"rank": worst_rank, **worst.evidence(),
              "per_rank": {str(rk): {"cost_us_per_step": _r(x.cost), **x.evidence()} for rk, x in shown}}
        if len(shown) < len(fired):
            ev["per_rank_note"] = f"the 8 costliest of {len(fired)} ranks"
        if worst.window is not None:  # kit.doctor.notebook draws it
            ev["excerpt"] = {"rank": worst_rank, "ranks": [worst_rank], "t0_us": worst.window[0],
                             "t1_us": worst.window[1]}
        ranks = tuple(sorted(rk for rk, _ in fired))
        listed = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
        who = f"rank {worst_rank}" if len(ranks) == 1 else f"rank {worst_rank} (worst of {len(ranks)}: {listed})"
        return [Finding(rule=rid, cost_us_per_step=round(worst.cost, 1), ranks=ranks, evidence=ev,
                        summary=worst.sentence(who), cause=r.cause, fix=r.fix, caveats=r.caveats,
                        notebook=r.notebook)]

    return judge


# ------------------------------------------------------------------------------------------- graph_mixing_gap
@dataclass(frozen=True)
class GraphGaps(HostSummary):
    graph_launches: int
    nccl: int
    """NCCL kernels replayed from graphs, inside the steps"""
    gap_nccl_us: float | None
    """median idle time before them"""
    baseline_us: float | None
    """median idle time before the other kernels of the graphs (eager kernels when the graphs hold none)"""
    baseline_of: str
    excess_us: float
    """sum over those NCCL kernels of (gap - baseline), clipped at 0"""

    @property
    def fires(self) -> bool:
        return (self.nccl >= MIN_GRAPH_NCCL and self.gap_nccl_us is not None and self.baseline_us is not None
                and self.gap_nccl_us >= MIXING_RATIO * self.baseline_us
                and self.gap_nccl_us - self.baseline_us >= MIXING_EXCESS_US)

    @property
    def cost(self) -> float:
        return self.per_step(self.excess_us)

    def evidence(self) -> dict[str, Any]:
        return {"graph_nccl_kernels_per_step": _r(self.nccl / self.steps),
                "gap_before_graph_nccl_median_us": _r(self.gap_nccl_us, 2),
                "gap_before_other_median_us": _r(self.baseline_us, 2), "baseline": self.baseline_of,
                "excess_idle_us_per_step": _r(self.cost)}

    def sentence(self, who: str) -> str:
        return (f"{self.nccl / self.steps:.0f} NCCL kernels per step replayed from CUDA graphs wait a median "
                f"{self.gap_nccl_us:.1f} us before they start, against {self.baseline_us:.1f} us before "
                f"{self.baseline_of}: {self.cost:.0f} us of idle GPU per step on {who}")


@host_extract("graph_mixing_gap", "graph replays are recognised by their cudaGraphLaunch")
def graph_extract(view: RankView, h: HostTimeline) -> GraphGaps:
    k = h.kernels[h.kernels["in_step"] & ~h.kernels["stall"].astype(bool)]
    g = k[k["graph"]]
    gn, go = g[g["nccl"]], g[~g["nccl"]]
    if len(go) >= MIN_GRAPH_NCCL:
        base, of = _median(go["gap_us"]), "the other kernels of the same graphs"
    else:
        base, of = _median(k.loc[~k["graph"] & ~k["nccl"], "gap_us"]), "kernels launched outside graphs"
    excess = float((gn["gap_us"] - (base or 0.0)).clip(lower=0).sum()) if base is not None else 0.0
    med, window = _median(gn["gap_us"]), None
    if len(gn):  # the NCCL kernel whose gap is the median one, with the kernel before it
        x = gn.iloc[int((gn["gap_us"] - med).abs().to_numpy().argmin())]
        window = (float(x["ts"] - x["gap_us"]) - EXCERPT_PAD_US, float(x["end"]) + EXCERPT_PAD_US)
    return GraphGaps(graph_launches=h.graph_launches, nccl=len(gn), gap_nccl_us=med, baseline_us=base,
                     baseline_of=of, excess_us=excess, steps=view.n_steps, window=window)



# ------------------------------------------------------------------------------------------- pageable_h2d
@dataclass(frozen=True)
class PageableCopies(HostSummary):
    copies: int
    host_us: float
    """host time in the calls that issued them (the host is blocked for the whole call)"""
    gpu_us: float
    without_call: int
    """copies whose host call is not in the trace (their host time is missing from host_us)"""
    calls: dict[str, int]

    @property
    def fires(self) -> bool:
        return self.copies > 0

    @property
    def cost(self) -> float:
        return self.per_step(self.host_us)

    def evidence(self) -> dict[str, Any]:
        return {"copies_per_step": _r(self.copies / self.steps), "host_blocked_us_per_step": _r(self.cost),
                "gpu_copy_us_per_step": _r(self.gpu_us / self.steps), "host_calls": dict(self.calls),
                "copies_without_host_call": self.without_call}

    def sentence(self, who: str) -> str:
        return (f"{self.copies / self.steps:.1f} host-to-device copies per step from pageable memory block the "
                f"host {self.cost:.0f} us per step (their GPU time: {self.gpu_us / self.steps:.0f} us) on {who}")


@host_extract("pageable_h2d", "the host time blocked in a copy is the issuing call's")
def pageable_extract(view: RankView, h: HostTimeline) -> PageableCopies:
    c = h.copies[h.copies["in_step"] & _pageable_h2d_mask(h.copies)]
    known = c[c["call"] != ""]
    blocked = known["call_end"] - known["call_ts"]
    window = None
    if len(known):  # the copy that blocked the host longest: its call and the copy
        x = known.loc[blocked.idxmax()]
        window = (float(min(x["call_ts"], x["ts"])) - EXCERPT_PAD_US,
                  float(max(x["call_end"], x["end"])) + EXCERPT_PAD_US)
    return PageableCopies(copies=len(c), host_us=float(blocked.sum()), gpu_us=float(c["dur"].sum()),
                          without_call=int(len(c) - len(known)),
                          calls={str(k): int(v) for k, v in known["call"].value_counts().items()},
                          steps=view.n_steps, window=window)



# ------------------------------------------------------------------------------------------- h2d_on_compute_stream
@dataclass(frozen=True)
class ComputeStreamCopies(HostSummary):
    device: int | None
    stream: int | None
    """the compute stream: the one with the most non-NCCL kernel time on its device"""
    copies: int
    pageable: int
    gpu_us: float
    exposed_us: float
    """copy time during which no compute kernel ran on the device"""

    @property
    def cost(self) -> float:
        return self.per_step(self.exposed_us)

    def evidence(self) -> dict[str, Any]:
        return {"device": self.device, "compute_stream": self.stream, "copies_per_step": _r(self.copies / self.steps),
                "pageable_copies_per_step": _r(self.pageable / self.steps),
                "copy_us_per_step": _r(self.gpu_us / self.steps), "compute_waits_us_per_step": _r(self.cost)}

    def sentence(self, who: str) -> str:
        return (f"{self.copies / self.steps:.1f} host-to-device copies per step run on the compute stream (stream "
                f"{self.stream}): {self.cost:.0f} us per step with no compute kernel running beside them on {who}")


@host_extract("h2d_on_compute_stream", None)
def compute_stream_extract(view: RankView, h: HostTimeline) -> ComputeStreamCopies | Skip:
    issued = view.issued()
    comp = issued[(issued["cat"] == "kernel") & ~issued["nccl"].astype(bool)]
    if comp.empty:
        return Skip("h2d_on_compute_stream", "no compute kernels in the trace: no compute stream to look at")
    dev, stream = comp.groupby(["device", "stream"])["dur"].sum().idxmax()
    c = h.copies[(h.copies["device"] == dev) & (h.copies["stream"] == stream) & h.copies["in_step"]
                 & _str(h.copies["name"]).str.contains("HtoD")]
    d = comp[comp["device"] == dev]
    ua, ub = union_np(d["ts"], d["end"])
    alone = (c["dur"].to_numpy(dtype=float) - covered(ua, ub, c["ts"], c["end"])).clip(min=0)
    window = None
    if len(c):  # the copy the compute waited longest for
        x = c.iloc[int(alone.argmax())]
        window = (float(x["ts"]) - EXCERPT_PAD_US, float(x["end"]) + EXCERPT_PAD_US)
    return ComputeStreamCopies(device=int(dev), stream=int(stream), copies=len(c),
                               pageable=int(_pageable_h2d_mask(c).sum()), gpu_us=float(c["dur"].sum()),
                               exposed_us=float(alone.sum()), steps=view.n_steps, window=window)



# ------------------------------------------------------------------------------------------- launch_bound
@dataclass(frozen=True)
class LaunchRate(HostSummary):
    kernels: int
    """kernels launched one host call each (not graph replays), inside the steps"""
    kernel_median_us: float | None
    launch_interval_median_us: float | None
    """median time between consecutive host calls that issue GPU work, per host thread"""
    launch_call_median_us: float | None
    starved: int
    """kernels whose host call ended after the GPU had gone idle (the GPU waited for it)"""
    idle_us: float
    """the idle time before those kernels (gaps < 1 ms, not after a blocking host call)"""

    @property
    def starved_share(self) -> float:
        return self.starved / self.kernels if self.kernels else 0.0

    @property
    def fires(self) -> bool:
        return (self.kernels >= MIN_KERNELS and self.idle_us > 0 and self.starved_share >= STARVED_SHARE
                and self.kernel_median_us is not None and self.launch_interval_median_us is not None
                and self.kernel_median_us < self.launch_interval_median_us)

    @property
    def cost(self) -> float:
        return self.per_step(self.idle_us)

    def evidence(self) -> dict[str, Any]:
        return {"kernels_per_step": _r(self.kernels / self.steps), "kernel_median_us": _r(self.kernel_median_us, 2),
                "launch_interval_median_us": _r(self.launch_interval_median_us, 2),
                "launch_call_median_us": _r(self.launch_call_median_us, 2),
                "starved_share": _r(self.starved_share, 3), "idle_us_per_step": _r(self.cost)}

    def sentence(self, who: str) -> str:
        return (f"{self.kernels / self.steps:.0f} kernels per step of median {self.kernel_median_us:.1f} us against "
                f"one launch every {self.launch_interval_median_us:.1f} us from the host: "
                f"{100 * self.starved_share:.0f}% of them start on an idle GPU, {self.cost:.0f} us of idle GPU per "
                f"step on {who}")


@host_extract("launch_bound", "launch starvation is read from the launch calls")
def launch_extract(view: RankView, h: HostTimeline) -> LaunchRate:
    """When it fires: :data:`STARVED_SHARE`. A kernel is *starved* when the host call that issued it ended after
    the GPU had finished everything before it (``call_end > start - gap``): the GPU sat idle waiting for the host.
    The cost is the idle time before the starved kernels, except gaps above 1 ms (host stalls, step boundaries),
    gaps in which a blocking host call returned and the catch-up after a synchronising call (``host_sync``'s and
    ``pageable_h2d``'s: :func:`sync_costs`)."""
    import numpy as np

    k = h.kernels[h.kernels["in_step"] & ~h.kernels["graph"] & (h.kernels["call"] != "")]
    issued = issuing_calls(h)
    intervals = []
    for _, ts in issued.groupby("tid")["call_ts"]:
        d = np.diff(np.sort(ts.to_numpy(dtype=float)))
        intervals.append(d[d < DEFAULT_STALL_US])
    iv = np.concatenate(intervals) if intervals else np.zeros(0)
    gap = k["gap_us"].to_numpy(dtype=float)
    idle_from = k["ts"].to_numpy(dtype=float) - gap
    starved = k["starved"].to_numpy(dtype=bool)
    # an idle stretch in which a blocking host call returned, and the catch-up after it, are that call's
    # (host_sync / pageable_h2d)
    ends = np.sort(np.concatenate([h.blocking["end"].to_numpy(dtype=float),
                                   h.copies.loc[_pageable_h2d_mask(h.copies), "call_end"].dropna()
                                   .to_numpy(dtype=float)]))
    after_block = np.searchsorted(ends, k["ts"].to_numpy(dtype=float)) > np.searchsorted(ends, idle_from)
    counted = starved & ~after_block & ~k.index.isin(list(sync_costs(view).catch_up))
    window = None
    if counted.any():  # the first starved kernel and the next EXCERPT_KERNELS kernels
        order = np.argsort(k["ts"].to_numpy(dtype=float), kind="stable")
        first = int(np.flatnonzero(counted[order])[0])
        last = order[min(first + EXCERPT_KERNELS, len(order) - 1)]
        window = (float(idle_from[order[first]]) - EXCERPT_PAD_US, float(k["end"].to_numpy()[last]) + EXCERPT_PAD_US)
    return LaunchRate(kernels=len(k), kernel_median_us=_median(k["dur"]),
                      launch_interval_median_us=_median(iv),
                      launch_call_median_us=_median(issued["call_end"] - issued["call_ts"]),
                      starved=int(starved.sum()), idle_us=float(gap[counted].sum()), steps=view.n_steps,
                      window=window)


def issuing_calls(h: HostTimeline) -> "pd.DataFrame":
    """The host calls that issued GPU work (one row per call, not per activity), inside the steps, not graph
    replays: ``call_ts``, ``call_end``, ``tid``."""
    import pandas as pd

    cols = ["correlation", "call_ts", "call_end", "tid"]
    both = pd.concat([d.loc[d["in_step"] & ~d["graph"] & (d["call"] != ""), cols] for d in (h.kernels, h.copies)])
    return both.drop_duplicates("correlation")



# ------------------------------------------------------------------------------------------- host_sync
@dataclass(frozen=True)
class HostSyncs(HostSummary):
    count: int
    host_us: float
    """host time blocked in the calls"""
    idle_after_us: float
    """the GPU time they cost: bubble + catch-up after each, bounded by its blocked time (:func:`sync_costs`)"""
    calls: dict[str, dict[str, float]]
    """per call name: count and host time"""

    @property
    def cost(self) -> float:
        return self.per_step(self.idle_after_us)

    def evidence(self) -> dict[str, Any]:
        return {"calls_per_step": _r(self.count / self.steps),
                "host_blocked_us_per_step": _r(self.host_us / self.steps),
                "gpu_idle_after_us_per_step": _r(self.cost), "calls": {k: dict(v) for k, v in self.calls.items()}}

    def sentence(self, who: str) -> str:
        return (f"{self.count / self.steps:.1f} synchronising calls per step ({', '.join(sorted(self.calls))}) "
                f"block the host {self.host_us / self.steps:.0f} us per step; after they return the GPU idles "
                f"{self.cost:.0f} us per step until the host is ahead again, on {who}")


@dataclass(frozen=True)
class SyncCosts:
    """What the blocking calls of one rank cost (:func:`sync_costs`)."""

    cost_us: float
    catch_up: frozenset
    """labels (in ``HostTimeline.kernels``) of the starved kernels counted as a call's catch-up"""
    window: tuple[float, float] | None = None
    """the costliest call: the end of its wait, the bubble and the catch-up that follows"""


def sync_costs(view: RankView) -> SyncCosts:
    """The GPU time the blocking calls cost: the lead of queued work each destroyed.

    Before the call the host was ahead of the GPU; while it waits the GPU drains its queue. When it returns
    nothing is queued: the GPU idles until the host issues the next work (the *bubble*, from the later of the
    call's start and the GPU's last work to the next GPU work), and then runs each kernel as soon as it is
    launched until the host is ahead again -- the run of starved kernels that follows (the *catch-up*). A call
    that is the last thing its step issues (``loss.item()`` at the end of the step) is followed by the next step,
    which a trace of one step does not hold: its catch-up is then the starved run that opens its own step, the
    previous step having ended the same way (steady state). A call counts when the GPU was still busy as it was
    made (else it waited for nothing); its cost is bubble + catch-up but at most the time it blocked (without
    the call the host would have been that much further ahead, no more), less any wait for the DataLoader in
    the bubble (the batch arrives when the loader has it: a host that got there earlier would only have waited
    longer, and lost its lead all the same). Successive calls followed by the same kernels (``.item()``: a copy,
    then a stream synchronize) count once."""
    return view.shared("sync_costs", _sync_costs)


def _sync_costs(view: RankView) -> SyncCosts:
    import numpy as np

    h = host_timeline(view)
    b, n = h.blocking, len(h.starts)
    if b.empty or not n:
        return SyncCosts(0.0, frozenset(), None)
    k = h.kernels[h.kernels["in_step"]].sort_values("ts", kind="stable")
    kts, kgap, kstarved = (k[c].to_numpy(dtype=float) for c in ("ts", "gap_us", "starved"))
    kcall = k["call_ts"].to_numpy(dtype=float)
    labels = k.index.to_numpy()

    fed = np.flatnonzero(kstarved == 0)  # positions of the kernels the host had issued in time

    def run_from(j: int) -> "np.ndarray":  # positions j, j+1, ... while starved
        i = int(np.searchsorted(fed, j))
        return np.arange(j, int(fed[i]) if i < len(fed) else len(k))

    step_start = view.steps["ts"].to_numpy(dtype=float) if len(view.steps) else np.array([-np.inf])
    best: dict[int, tuple[float, "np.ndarray"]] = {}
    for call, ret, dur in b[["ts", "end", "dur"]].itertuples(index=False):
        i = int(np.searchsorted(h.starts, call, side="right"))
        busy_call = h.busy_until[i - 1] if i > 0 else -np.inf
        i = int(np.searchsorted(h.starts, ret, side="right"))
        busy_ret = h.busy_until[i - 1] if i > 0 else -np.inf
        if busy_call <= call or busy_ret > ret:
            continue  # the GPU was idle when it was called, or still busy when it returned: it drained nothing
        a = max(busy_ret, call)
        nxt = h.starts[i] if i < n else np.nan
        bubble = waited = 0.0
        if nxt == nxt and nxt > a:
            bubble, waited = nxt - a, float(covered(h.data_a, h.data_b, [a], [nxt])[0])
        step = int(np.searchsorted(step_start, call, side="right"))
        in_step = np.searchsorted(step_start, kcall, side="right") == step  # kernels issued in the call's step
        j = int(np.searchsorted(kts, ret))
        run = run_from(j) if j < len(k) else np.arange(0)
        run = run[in_step[run]] if len(run) else run
        key = j
        if j >= len(k) or not in_step[j:].any() or (len(run) and not in_step[run[-1] + 1:].any()):
            # a step-end call: nothing after it in its step but its catch-up, cut off by the step's end; the
            # catch-up goes on in the next step -- in steady state the starved run that opens this one
            first = int(np.argmax(in_step)) if in_step.any() else len(k)
            run = np.concatenate([run, run_from(first)]) if first < len(k) else run
        catch_up = float(kgap[run[1:] if len(run) and run[0] == j else run].sum())  # j's own gap is the bubble
        cost = max(0.0, min(dur, bubble + catch_up) - waited)
        if key not in best or cost > best[key][0]:
            after = [kts[r] + k["dur"].to_numpy()[r] for r in run[-1:] if r > j] or [nxt if nxt == nxt else ret]
            best[key] = (cost, run, (ret - min(dur, 2 * EXCERPT_PAD_US) - EXCERPT_PAD_US,
                                     float(after[0]) + EXCERPT_PAD_US))
    top = max(best.values(), key=lambda x: x[0]) if best else None
    return SyncCosts(float(sum(x[0] for x in best.values())),
                     frozenset(labels[np.concatenate([x[1] for x in best.values()])]) if best else frozenset(),
                     top[2] if top and top[0] > 0 else None)


@host_extract("host_sync", "synchronising calls are host calls")
def sync_extract(view: RankView, h: HostTimeline) -> HostSyncs:
    """The calls' count and host time, and their cost (:func:`sync_costs`)."""
    b = h.blocking
    per = b.groupby("name")["dur"].agg(["size", "sum"])
    sc = sync_costs(view)
    return HostSyncs(count=len(b), host_us=float(b["dur"].sum()), idle_after_us=sc.cost_us,
                     calls={str(nm): {"count": int(r["size"]), "host_us": round(float(r["sum"]), 1)}
                            for nm, r in per.iterrows()}, steps=view.n_steps, window=sc.window)


# ------------------------------------------------------------------------------------------- the rules
TEXT: dict[str, dict[str, str]] = {
    "graph_mixing_gap": dict(
        cause=("NCCL's graph-mixing support (on by default) makes every captured NCCL call bring event record/wait "
               "nodes into the graph that serialise it against NCCL's internal stream; in the replayed graph they "
               "are extra dependencies in front of each NCCL kernel, and the GPU idles before it."),
        fix=("Set NCCL_GRAPH_MIXING_SUPPORT=0 (NCCL >= 2.13) in the environment of every rank before the "
             "communicator is created -- only where the condition in the caveats holds."),
        caveats=("Only safe when no communicator ever has (1) CUDA-graph launches outstanding in parallel (graphs "
                 "replayed on different streams with nothing ordering them) or (2) a graph launch outstanding while "
                 "a non-captured NCCL call is issued on it: stream ordering is not sufficient, the replay must have "
                 "completed (the host synchronised) before an eager collective -- e.g. every collective of that "
                 "communicator inside the graph, or a synchronize between a replay and eager NCCL calls. With it on, "
                 "NCCL notes its mechanism has been seen to deadlock CUDA when graphs of several communicators are "
                 f"cudaGraphLaunch()ed from one thread. Sources: {NCCL_DOCS}/env.html#nccl-graph-mixing-support, "
                 f"{NCCL_DOCS}/usage/cudagraph.html")),
    "pageable_h2d": dict(
        cause=("A copy from pageable (not page-locked) host memory is staged by CUDA through a pinned bounce buffer: "
               "the call returns only when the data is staged, so the host is blocked for the copy whatever "
               "non_blocking says, cannot queue further work, and the copy runs below the link's bandwidth."),
        fix=("Pin the source: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, non_blocking=True); "
             "better, copy the next batch on a side stream while this step computes (dataloader_sync's 'prefetch')."),
        caveats=("Pinned memory is page-locked host RAM taken from the OS: pin batches, not whole datasets. "
                 "non_blocking=True on a pageable tensor changes nothing. The copy's GPU time, when it runs on "
                 "the compute stream, is also h2d_on_compute_stream's: one stretch of time seen from the host and "
                 "the GPU.")),
    "h2d_on_compute_stream": dict(
        cause=("The batch is copied to the GPU on the stream that runs the step's kernels; a stream executes in "
               "order, so the compute waits for each copy although the copy engine could run it beside the kernels."),
        fix=("Copy the next batch on a side stream (torch.cuda.Stream) from pinned memory with non_blocking=True while "
             "this step computes; make the compute stream wait for it (current_stream().wait_stream(side)) and call "
             "batch.record_stream(current_stream()) -- or use a prefetching loader."),
        caveats=("Only a copy from pinned memory overlaps anything: a pageable copy blocks the host as well "
                 "(pageable_h2d, fix that first; one stretch of time may appear in both findings). Without "
                 "record_stream the caching allocator may reuse the batch's memory while the compute stream "
                 "reads it.")),
    "launch_bound": dict(
        cause=("The kernels are shorter than the time the host needs to issue each one (Python, the dispatcher, the "
               "launch call): the GPU finishes a kernel before the next is submitted and idles in between."),
        fix=("Give the GPU more work per launch: capture the step in a CUDA graph (torch.cuda.graphs, "
             "torch.compile(mode='reduce-overhead')), fuse kernels (torch.compile, fused/foreach optimizers), or "
             "grow the batch."),
        caveats=("CUDA graphs need static shapes and addresses; with NCCL inside the graph, see graph_mixing_gap. The "
                 "graph_gaps notebook's launch-overhead section measures what graphs give on this machine.")),
    "host_sync": dict(
        cause=("A call that blocks the host until the GPU is done (stream/device/event synchronize; a copy to host "
               "memory such as .item(), .cpu(), .tolist() or printing a CUDA tensor) empties the GPU's queue: when it "
               "returns nothing is queued, the GPU idles while the host issues the next work, then runs each "
               "kernel as soon as it is launched until the host is ahead again."),
        fix=("Take the synchronising call out of the step or make it rare: keep losses and metrics on the GPU and read "
             "them every N steps; avoid .item()/.cpu()/print of CUDA tensors and data-dependent shapes (nonzero, "
             "boolean masks) inside the step; torch.cuda.set_sync_debug_mode('warn') names each call in the code."),
        caveats=("Some synchronisation is needed (a value the host branches on, an early stop): move it out of the hot "
                 "loop rather than remove it. The host time blocked in the call is mostly the GPU's own queued work "
                 "and is not the cost; the idle GPU after it is, until the host has rebuilt its lead.")),
}
"""each rule's fixed cause, fix and caveats (a finding repeats them)"""

for _id, _title, _extract, _notebook in (
        ("graph_mixing_gap", "idle gap before NCCL kernels replayed from CUDA graphs", graph_extract, "graph_gaps"),
        ("pageable_h2d", "host-to-device copies from pageable memory", pageable_extract, "dataloader_sync"),
        ("h2d_on_compute_stream", "host-to-device copies serialised with the compute", compute_stream_extract,
         "dataloader_sync"),
        ("launch_bound", "GPU starved by the host's kernel launches", launch_extract, "graph_gaps"),
        ("host_sync", "synchronising host calls inside the step", sync_extract, "dataloader_sync"),
):
    rule(Rule(id=_id, title=_title, extract=_extract, judge=judge_fired(_id), notebook=_notebook, **TEXT[_id]))


__all__ = ["BLOCKING_COPY_CALLS", "SYNC_CALLS", "ComputeStreamCopies", "GraphGaps", "HostSyncs", "HostTimeline",
           "LaunchRate", "PageableCopies", "host_timeline"]
