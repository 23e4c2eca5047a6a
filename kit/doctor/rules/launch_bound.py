"""``launch_bound``: the kernels are shorter than the host's time to launch them -- the GPU drains its queue and
waits for the host (the catch-up after a synchronising call is ``host_sync``'s, :mod:`.sync_costs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...traces.gaps import DEFAULT_STALL_US
from ..accounting import Account
from ..model import Explains, RankView, Rule, rule
from .evidence import num
from .host import EXCERPT_PAD_US, HostSummary, HostTimeline, host_extract, judge_fired, median, pageable_h2d_mask
from .sync_costs import sync_costs

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

MIN_KERNELS = 20
"""individually launched kernels a rank needs before ``launch_bound`` judges their launch rate"""
EXCERPT_KERNELS = 30
"""kernels a launch_bound excerpt shows from its first starved kernel"""
STARVED_SHARE = 0.25
"""``launch_bound`` fires when (1) the median kernel is shorter than the median interval between the host's
launch calls -- the GPU drains work faster than the host submits it, so no queue can build up -- and (2) at
least this share of the kernels was *starved* (their launch call ended after the GPU had gone idle), so the GPU
did wait for the host (calibration: FINDINGS.md, "kit doctor's thresholds against the recorded runs")."""


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
        return {"kernels_per_step": num(self.kernels / self.steps), "kernel_median_us": num(self.kernel_median_us, 2),
                "launch_interval_median_us": num(self.launch_interval_median_us, 2),
                "launch_call_median_us": num(self.launch_call_median_us, 2),
                "starved_share": num(self.starved_share, 3), "idle_us_per_step": num(self.cost)}

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
                                   h.copies.loc[pageable_h2d_mask(h.copies), "call_end"].dropna()
                                   .to_numpy(dtype=float)]))
    after_block = np.searchsorted(ends, k["ts"].to_numpy(dtype=float)) > np.searchsorted(ends, idle_from)
    counted = starved & ~after_block & ~k.index.isin(list(sync_costs(view).catch_up))
    window = None
    if counted.any():  # the first starved kernel and the next EXCERPT_KERNELS kernels
        order = np.argsort(k["ts"].to_numpy(dtype=float), kind="stable")
        first = int(np.flatnonzero(counted[order])[0])
        last = order[min(first + EXCERPT_KERNELS, len(order) - 1)]
        window = (float(idle_from[order[first]]) - EXCERPT_PAD_US, float(k["end"].to_numpy()[last]) + EXCERPT_PAD_US)
    return LaunchRate(kernels=len(k), kernel_median_us=median(k["dur"]),
                      launch_interval_median_us=median(iv),
                      launch_call_median_us=median(issued["call_end"] - issued["call_ts"]),
                      starved=int(starved.sum()), idle_us=float(gap[counted].sum()), steps=view.n_steps,
                      window=window)


def issuing_calls(h: HostTimeline) -> "pd.DataFrame":
    """The host calls that issued GPU work (one row per call, not per activity), inside the steps, not graph
    replays: ``call_ts``, ``call_end``, ``tid``."""
    import pandas as pd

    cols = ["correlation", "call_ts", "call_end", "tid"]
    both = pd.concat([d.loc[d["in_step"] & ~d["graph"] & (d["call"] != ""), cols] for d in (h.kernels, h.copies)])
    return both.drop_duplicates("correlation")


def slice_sentence(a: Account, c: float, sh: float, who: str) -> str:
    """Said from the accounting's ``launch`` and ``step_start`` slices when the signature above stays silent."""
    L = a.launch or {}
    rate = ("" if L.get("kernel_median_us") is None or L.get("launch_interval_median_us") is None else
            f"; {L['kernels_per_step']:.0f} kernels per step, median {L['kernel_median_us']:.1f} us each, "
            f"launched every {L['launch_interval_median_us']:.1f} us (median)")
    start = (f"; {a.cost('step_start') / 1e3:.2f} ms of it before the step's first GPU work"
             if a.cost("step_start") > 0 else "")
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) waiting for the host to issue its next "
            f"work on {who}{rate}{start}")


rule(Rule(id="launch_bound", title="GPU starved by the host's kernel launches", extract=launch_extract,
          judge=judge_fired("launch_bound"),
          explains=Explains(("launch", "step_start"), slice_sentence,
                            lambda a: {"launch": dict(a.launch),
                                       "step_start_us": None if a.cost("step_start") is None
                                       else round(a.cost("step_start"), 1)},
                            signature=True),
          order=90,
          cause=("The kernels are shorter than the time the host needs to issue each one (Python, the dispatcher, "
                 "the launch call): the GPU finishes a kernel before the next is submitted and idles in between."),
          fix=("Give the GPU more work per launch: capture the step in a CUDA graph (torch.cuda.graphs, "
               "torch.compile(mode='reduce-overhead')), fuse kernels (torch.compile, fused/foreach optimizers), "
               "or grow the batch."),
          caveats=("CUDA graphs need static shapes and addresses; with NCCL inside the graph, see graph_mixing_gap. "
                   "The graph_gaps notebook's launch-overhead section measures what graphs give on this machine."),
          notebook="graph_gaps"))
