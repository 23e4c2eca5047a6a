"""``graph_mixing_gap``: NCCL kernels replayed from a CUDA graph wait far longer before they start than the graph's
other kernels -- NCCL's graph-mixing support puts extra dependencies in front of each, and a graph launched into the
legacy default stream waits longer at each the further its replay has run.

Which stream the graph was launched into shows in the trace: a replayed graph runs its NCCL kernels on the stream
it was launched into (the graph's other branches get streams of their own), so the stream of the graph-replayed
NCCL kernels names it, :data:`LEGACY_STREAM` being the legacy default stream."""

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


LEGACY_STREAM = 7
"""CUPTI's id for the legacy default stream (CUDA stream 0, PyTorch's default stream): the stream of every
default-stream kernel in the kit's traces, and of the NCCL kernels of a graph replayed without a stream context;
replayed inside ``torch.cuda.stream(s)`` (a created, the per-thread or a blocking stream) they carry that stream's
id (graph_gaps' kept replay-stream traces)"""


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
    stream: int | None = None
    """the stream those NCCL kernels ran on (most of them): the stream the graphs were launched into; None when
    the trace names no stream"""

    @property
    def launched_into(self) -> str:
        if self.stream is None:
            return ""
        if self.stream == LEGACY_STREAM:
            return f"stream {self.stream}, the legacy default stream (replayed without a stream context)"
        return f"stream {self.stream}, not the legacy default stream ({LEGACY_STREAM})"

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
                "excess_idle_us_per_step": num(self.cost),
                **({"graph_launched_into": self.launched_into} if self.stream is not None else {})}

    def sentence(self, who: str) -> str:
        return (f"{self.nccl / self.steps:.0f} NCCL kernels per step replayed from CUDA graphs wait a median "
                f"{self.gap_nccl_us:.1f} us before they start, against {self.baseline_us:.1f} us before "
                f"{self.baseline_of}: the GPU idles {self.cost:.0f} us per step longer before them on {who}"
                + (f"; the graphs ran their NCCL kernels on {self.launched_into}" if self.stream is not None else ""))


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
    stream = int(gn["stream"].mode().iloc[0]) if len(gn) and "stream" in gn and gn["stream"].notna().any() else None
    return GraphGaps(graph_launches=h.graph_launches, nccl=len(gn), gap_nccl_us=med, baseline_us=base,
                     baseline_of=of, excess_us=excess, steps=view.n_steps, window=window, stream=stream)


rule(Rule(id="graph_mixing_gap", title="idle gap before NCCL kernels replayed from CUDA graphs", extract=graph_extract,
          judge=judge_fired("graph_mixing_gap"),
          order=60,
          cause=("NCCL's graph-mixing support (on by default) makes every captured NCCL call bring event "
                 "record/wait nodes into the graph that serialise it against NCCL's internal stream; in the "
                 "replayed graph they are extra dependencies in front of each NCCL kernel, and the GPU idles "
                 "before it. Launched into the legacy default stream -- where g.replay(), torch.compile's "
                 "CUDA-graph trees and make_graphed_callables replay when no stream is entered -- the wait grows "
                 "with every NCCL call the replay has passed (the CUDA driver's doing: a CUDA-only graph of the "
                 "same shape shows it, in no other stream); in any other stream it is a fixed few us."),
          fix=("Replay the graph from a created stream, not the legacy default stream: s = torch.cuda.Stream(); "
               "s.wait_stream(torch.cuda.current_stream()); with torch.cuda.stream(s): g.replay(); then "
               "torch.cuda.current_stream().wait_stream(s) -- and call a torch.compile(mode='reduce-overhead') "
               "model or a make_graphed_callables module inside such a stream context (they replay into the "
               "current stream). This keeps NCCL's mixing support and removes the growth. The fixed remainder "
               "(or the gap in any stream) goes with NCCL_GRAPH_MIXING_SUPPORT=0 (NCCL >= 2.13) in the "
               "environment of every rank before the communicator is created -- only where the condition in the "
               "caveats holds."),
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
