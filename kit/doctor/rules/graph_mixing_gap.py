"""``graph_mixing_gap``: NCCL kernels replayed from a CUDA graph wait far longer before they start than the graph's
other kernels -- NCCL's graph-mixing support puts extra dependencies in front of each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model import RankView, Rule, rule
from .evidence import num
from .host import EXCERPT_PAD_US, HostSummary, HostTimeline, host_extract, judge_fired, median

MIN_GRAPH_NCCL = 3
"""graph-replayed NCCL kernels a rank needs before ``graph_mixing_gap`` judges its gaps"""
MIXING_RATIO, MIXING_EXCESS_US = 1.5, 1.0
"""``graph_mixing_gap`` fires when the median gap before graph-replayed NCCL kernels is at least 1.5x the median
gap before the same graphs' other kernels and at least 1 us above it: between the ratio with NCCL's graph mixing
off and on (calibration: FINDINGS.md, "kit doctor's thresholds against the recorded runs")."""


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
        return {"graph_nccl_kernels_per_step": num(self.nccl / self.steps),
                "gap_before_graph_nccl_median_us": num(self.gap_nccl_us, 2),
                "gap_before_other_median_us": num(self.baseline_us, 2), "baseline": self.baseline_of,
                "excess_idle_us_per_step": num(self.cost)}

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
        base, of = median(go["gap_us"]), "the other kernels of the same graphs"
    else:
        base, of = median(k.loc[~k["graph"] & ~k["nccl"], "gap_us"]), "kernels launched outside graphs"
    excess = float((gn["gap_us"] - (base or 0.0)).clip(lower=0).sum()) if base is not None else 0.0
    med, window = median(gn["gap_us"]), None
    if len(gn):  # the NCCL kernel whose gap is the median one, with the kernel before it
        x = gn.iloc[int((gn["gap_us"] - med).abs().to_numpy().argmin())]
        window = (float(x["ts"] - x["gap_us"]) - EXCERPT_PAD_US, float(x["end"]) + EXCERPT_PAD_US)
    return GraphGaps(graph_launches=h.graph_launches, nccl=len(gn), gap_nccl_us=med, baseline_us=base,
                     baseline_of=of, excess_us=excess, steps=view.n_steps, window=window)


rule(Rule(id="graph_mixing_gap", title="idle gap before NCCL kernels replayed from CUDA graphs", extract=graph_extract,
          judge=judge_fired("graph_mixing_gap"),
          order=60,
          cause=("NCCL's graph-mixing support (on by default) makes every captured NCCL call bring event "
                 "record/wait nodes into the graph that serialise it against NCCL's internal stream; in the "
                 "replayed graph they are extra dependencies in front of each NCCL kernel, and the GPU idles "
                 "before it."),
          fix=("Set NCCL_GRAPH_MIXING_SUPPORT=0 (NCCL >= 2.13) in the environment of every rank before the "
               "communicator is created -- only where the condition in the caveats holds."),
          caveats=("Only safe when no communicator ever has (1) CUDA-graph launches outstanding in parallel (graphs "
                   "replayed on different streams with nothing ordering them) or (2) a graph launch outstanding "
                   "while a non-captured NCCL call is issued on it: stream ordering is not sufficient, the replay "
                   "must have completed (the host synchronised) before an eager collective -- e.g. every collective "
                   "of that communicator inside the graph, or a synchronize between a replay and eager NCCL calls. "
                   "With it on, NCCL notes its mechanism has been seen to deadlock CUDA when graphs of several "
                   "communicators are cudaGraphLaunch()ed from one thread. Sources: "
                   "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-graph-mixing-support, "
                   "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/cudagraph.html"),
          notebook="graph_gaps"))
