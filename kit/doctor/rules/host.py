"""One rank's GPU and host timeline: what the host rules (:mod:`.graph_mixing_gap`, :mod:`.pageable_h2d`,
:mod:`.h2d_on_compute_stream`, :mod:`.launch_bound`, :mod:`.host_sync`) share -- how the host feeds the GPU.

**What every rule reads** (:func:`host_timeline`, built once per rank in the worker and shared by the five
extracts through :meth:`kit.doctor.model.RankView.shared`): each GPU activity joined to the host call that
issued it (:meth:`kit.doctor.model.RankView.issued`: Kineto's ``correlation`` id; every kernel of a replayed
graph carries its ``cudaGraphLaunch``'s), the idle time of the GPU before each kernel (:func:`kit.traces.gaps`:
start minus the latest end of any earlier activity on that GPU, all streams; gaps above 1 ms are host stalls or
step boundaries and are left out), which kernels were *starved* (issued only after the GPU had run dry), and the
synchronising host calls (:mod:`kit.doctor.calls`). A GPU activity counts for a step when the host call that
issued it falls inside a ``ProfilerStep#N`` window; work still queued from before the trace began is not this
step's; without step annotations the traced span is one step.

**One microsecond, one cause.** The idle GPU time after a synchronising call and the catch-up that follows it
(``host_sync``, :func:`kit.doctor.rules.sync_costs.sync_costs`) are not counted again as launch starvation
(``launch_bound``), and the host time blocked in a pageable copy (``pageable_h2d``) is not a ``host_sync`` call.
Two findings can still describe one stretch of time from two sides: a pageable copy on the compute stream blocks
the host (``pageable_h2d``) while the compute stream waits for it (``h2d_on_compute_stream``); each finding's
caveats say so.

What each extract returns is a small frozen dataclass of numbers (never events, :class:`HostSummary`); each
judge (:func:`judge_fired`) compares ranks and reports the worst rank's cost per step, naming every rank where
the rule fired.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...traces.gaps import DEFAULT_STALL_US, gaps
from ..calls import GRAPH_LAUNCH
from ..findings import worst_rank
from ..host_model import pageable_h2d_mask
from ..model import Finding, RankView, Skip

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

EXCERPT_PAD_US = 100.0
"""context on either side of a finding's timeline excerpt"""


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


def host_timeline(view: RankView) -> HostTimeline:
    """The rank's :class:`HostTimeline`, shared by the host rules (:meth:`RankView.shared`)."""
    return view.shared("host", _build)


def as_str(s: "pd.Series") -> "pd.Series":
    """A column as strings (names may come as categoricals or objects)."""
    from ..host_model import names_str

    return names_str(s)


def _build(view: RankView) -> HostTimeline:
    import numpy as np

    from ..host_model import ALL

    gpu = view.trace.gpu
    calls = view.host.calls  # classified once, by the host model
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
    # the host model's synchronising calls, less the blocking copies from pageable memory (pageable_h2d's)
    h2d_pageable = set(copies.loc[pageable_h2d_mask(copies), "correlation"].dropna())
    b = calls[(calls["kind"] == "sync") & ~calls["correlation"].isin(h2d_pageable) & (calls["ts"] > first)
              & (calls["ts"] < last)]
    b = b[view.in_steps(b["ts"])][["name", "ts", "end", "dur", "tid", "correlation"]]
    data_a, data_b = view.host.spans("data_wait", ALL)
    return HostTimeline(kernels=kernels, copies=copies, calls=calls, blocking=b, starts=starts,
                        busy_until=busy_until, data_a=data_a, data_b=data_b, has_runtime=bool(len(calls)),
                        graph_launches=int(calls["name"].str.startswith(GRAPH_LAUNCH).sum()))


def cannot_read(h: HostTimeline, rid: str, runtime_for: str | None) -> Skip | None:
    """Why rule ``rid`` cannot run on this rank, or None: no GPU activity at all (nothing the host issued), or --
    when ``runtime_for`` says what the rule reads of them -- no CUDA runtime calls."""
    if len(h.starts) == 0:
        return Skip(rid, "no GPU activity in the trace: nothing issued to a GPU to look at")
    if runtime_for and not h.has_runtime:
        return Skip(rid, "no CUDA runtime events in the trace (profile with ProfilerActivity.CPU as well as CUDA): "
                         f"the host calls that issue and wait for GPU work are not there ({runtime_for})")
    return None


def host_extract(rid: str, runtime_for: str | None):
    """Decorates ``fn(view, timeline) -> summary`` into a rule's ``extract(view)``: the rank's
    :class:`HostTimeline`, or a :class:`Skip` when the rank has no host model (:attr:`RankView.host`) or the trace
    lacks what the rule reads (:func:`cannot_read`)."""

    def wrap(fn):
        def extract(view: RankView):
            if view.host is None:  # the one view of the host is the host model: without it, no second one
                return Skip(rid, "no GPU activity in the trace: nothing issued to a GPU to look at"
                            if view.trace.gpu.empty else "no host model for this rank (every GPU activity lasts "
                            "0 us, or the step accounting's skip line says why)")
            h = host_timeline(view)
            return cannot_read(h, rid, runtime_for) or fn(view, h)

        extract.__name__, extract.__doc__ = fn.__name__, fn.__doc__
        return extract

    return wrap


def median(s) -> float | None:
    """The median of the values that are not NaN; None when there is none."""
    import numpy as np

    a = np.asarray(s, dtype=float)
    a = a[~np.isnan(a)]
    return float(np.median(a)) if a.size else None


# ------------------------------------------------------------------------------------------- judging
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
    scale: float = field(default=1.0, kw_only=True)
    """what turns a mean per step window into a cost per step as the accounting states it (:func:`step_scale`);
    counts per step are not scaled"""

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
        """A time summed over the steps as a cost per step (:attr:`scale`)."""
        return float(x) / max(1, self.steps) * self.scale


def step_scale(view: RankView) -> float:
    """The rank's step time (a median) over its mean step window (2+ steps: the windows tile them, so that is the
    mean step): a time summed over the steps, divided by their count and multiplied by this, is its share of the
    traced steps times the step -- as the accounting states a cost (:meth:`kit.doctor.accounting.Account.cost`), so
    that the costs of one step, summed, stay within it when a few slow steps pull the mean above the median. 1 with
    one step (its own work is the step's) or without an account."""
    a = view.account
    w = getattr(a, "window_us", None)
    return float(view.step_us) / w if len(view.steps) >= 2 and w and view.step_us else 1.0


def judge_fired(rid: str):
    """The judge every host rule shares: one finding naming every rank where the rule fired
    (:func:`kit.doctor.findings.worst_rank`); the cost is the worst rank's, the evidence that rank's numbers plus
    every firing rank's."""

    def judge(summaries: list[tuple[int, HostSummary]], ctx) -> list[Finding]:
        fired = [(rk, x.cost, x.evidence()) for rk, x in summaries if x.fires]
        if not fired:
            return []
        of = dict(summaries)

        def excerpt(rk: int):
            w = of[rk].window
            return None if w is None else {"rank": rk, "ranks": [rk], "t0_us": w[0], "t1_us": w[1]}

        return [worst_rank(rid, fired, len(summaries), lambda rk, who: of[rk].sentence(who),
                           lambda rk: of[rk].evidence(), excerpt)]

    return judge


__all__ = ["HostSummary", "HostTimeline", "as_str", "step_scale", "cannot_read", "host_extract", "host_timeline", "judge_fired",
           "median", "pageable_h2d_mask"]
