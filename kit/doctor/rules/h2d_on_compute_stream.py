"""``h2d_on_compute_stream``: host-to-device copies on the stream that runs the step's kernels -- the compute waits
for each although the copy engine could run it beside the kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...traces.intervals import covered, union_np
from ..model import RankView, Rule, Skip, rule
from .evidence import num
from .host import (EXCERPT_PAD_US, HostSummary, HostTimeline, as_str, host_extract, judge_fired, pageable_h2d_mask,
                   step_scale)


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
        return {"device": self.device, "compute_stream": self.stream, "copies_per_step": num(self.copies / self.steps),
                "pageable_copies_per_step": num(self.pageable / self.steps),
                "copy_us_per_step": num(self.gpu_us / self.steps), "compute_waits_us_per_step": num(self.cost)}

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
                 & as_str(h.copies["name"]).str.contains("HtoD")]
    d = comp[comp["device"] == dev]
    ua, ub = union_np(d["ts"], d["end"])
    alone = (c["dur"].to_numpy(dtype=float) - covered(ua, ub, c["ts"], c["end"])).clip(min=0)
    window = None
    if len(c):  # the copy the compute waited longest for
        x = c.iloc[int(alone.argmax())]
        window = (float(x["ts"]) - EXCERPT_PAD_US, float(x["end"]) + EXCERPT_PAD_US)
    return ComputeStreamCopies(device=int(dev), stream=int(stream), copies=len(c),
                               pageable=int(pageable_h2d_mask(c).sum()), gpu_us=float(c["dur"].sum()),
                               exposed_us=float(alone.sum()), steps=view.n_steps, window=window,
                               scale=step_scale(view))


rule(Rule(id="h2d_on_compute_stream", title="host-to-device copies serialised with the compute",
          extract=compute_stream_extract, judge=judge_fired("h2d_on_compute_stream"),
          order=80,
          cause=("The batch is copied to the GPU on the stream that runs the step's kernels; a stream executes in "
                 "order, so the compute waits for each copy although the copy engine could run it beside the "
                 "kernels."),
          fix=("Copy the next batch on a side stream (torch.cuda.Stream) from pinned memory with "
               "non_blocking=True while this step computes; make the compute stream wait for it "
               "(current_stream().wait_stream(side)) and call batch.record_stream(current_stream()) -- or use a "
               "prefetching loader."),
          caveats=("Only a copy from pinned memory overlaps anything: a pageable copy blocks the host as well "
                   "(pageable_h2d, fix that first; one stretch of time may appear in both findings). Without "
                   "record_stream the caching allocator may reuse the batch's memory while the compute stream reads "
                   "it."),
          notebook="dataloader_sync"))
