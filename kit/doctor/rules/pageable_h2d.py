"""``pageable_h2d``: host-to-device copies from pageable memory -- the host is blocked for each; the cost is the
GPU idle time that block leaves (the accounting's ``pageable`` slice: the idle GPU while the host is in the copy
call, and its catch-up after it), not the host's blocked time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...traces.intervals import covered, union_np
from ..accounting import Account
from ..model import Explains, RankView, Rule, rule
from .evidence import num
from .host import EXCERPT_PAD_US, HostSummary, HostTimeline, host_extract, judge_fired, pageable_h2d_mask, step_scale


@dataclass(frozen=True)
class PageableCopies(HostSummary):
    copies: int
    host_us: float
    """host time in the calls that issued them (the host is blocked for the whole call)"""
    gpu_us: float
    idle_per_step: float
    """the GPU idle time they cost per step: the accounting's ``pageable`` slice (the idle GPU while the host was in
    those calls, and its catch-up after them); without an account, the idle GPU time inside the calls"""
    without_call: int
    """copies whose host call is not in the trace (their host time is missing from host_us)"""
    calls: dict[str, int]

    @property
    def fires(self) -> bool:
        return self.copies > 0

    @property
    def cost(self) -> float:
        return self.idle_per_step

    def evidence(self) -> dict[str, Any]:
        return {"copies_per_step": num(self.copies / self.steps),
                "host_blocked_us_per_step": num(self.host_us / self.steps),
                "gpu_idle_us_per_step": num(self.cost),
                "gpu_copy_us_per_step": num(self.gpu_us / self.steps), "host_calls": dict(self.calls),
                "copies_without_host_call": self.without_call}

    def sentence(self, who: str) -> str:
        return (f"{self.copies / self.steps:.1f} host-to-device copies per step from pageable memory block the "
                f"host {self.host_us / self.steps:.0f} us per step (their GPU time: {self.gpu_us / self.steps:.0f} us); "
                f"the GPU sat idle {self.cost:.0f} us per step for them on {who}")


@host_extract("pageable_h2d", "the host time blocked in a copy is the issuing call's")
def pageable_extract(view: RankView, h: HostTimeline) -> PageableCopies:
    c = h.copies[h.copies["in_step"] & pageable_h2d_mask(h.copies)]
    known = c[c["call"] != ""]
    blocked = known["call_end"] - known["call_ts"]
    window = None
    if len(known):  # the copy that blocked the host longest: its call and the copy
        x = known.loc[blocked.idxmax()]
        window = (float(min(x["call_ts"], x["ts"])) - EXCERPT_PAD_US,
                  float(max(x["call_end"], x["end"])) + EXCERPT_PAD_US)
    scale = step_scale(view)
    if isinstance(view.account, Account):  # whole us: the sentence and the reconcile stage round the same way
        idle = float(round(view.account.cost("pageable")))
    else:  # no account: the idle GPU time inside the calls
        ca, cb = union_np(known["call_ts"], known["call_end"])
        idle = float((cb - ca).sum() - covered(*union_np(h.starts, h.busy_until), ca, cb).sum()) if len(ca) else 0.0
        idle = idle / view.n_steps * scale
    return PageableCopies(copies=len(c), host_us=float(blocked.sum()), gpu_us=float(c["dur"].sum()),
                          idle_per_step=idle,
                          without_call=int(len(c) - len(known)),
                          calls={str(k): int(v) for k, v in known["call"].value_counts().items()},
                          steps=view.n_steps, window=window, scale=scale)


def slice_sentence(a: Account, c: float, sh: float, who: str) -> str:
    """Said from the accounting's ``pageable`` slice when the signature above stays silent."""
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) while the host was blocked in copies "
            f"from pageable memory to the device, and then refilled the GPU's queue, on {who}"
            + (f": {a.calls_text('pageable')}" if a.calls.get("pageable") else ""))


rule(Rule(id="pageable_h2d", title="host-to-device copies from pageable memory", extract=pageable_extract,
          judge=judge_fired("pageable_h2d"),
          explains=Explains(("pageable",), slice_sentence, lambda a: {"pageable_calls": a.calls.get("pageable", {})},
                            signature=True),
          order=70,
          cause=("A copy from pageable (not page-locked) host memory is staged by CUDA through a pinned bounce "
                 "buffer: the call returns only when the data is staged, so the host is blocked for the copy "
                 "whatever non_blocking says, cannot queue further work, and the copy runs below the link's "
                 "bandwidth."),
          fix=("Pin the source: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, "
               "non_blocking=True); better, copy the next batch on a side stream while this step computes "
               "(dataloader_sync's 'prefetch')."),
          caveats=("The cost is the GPU's idle time while the host is blocked (and its catch-up after), not the host's "
                   "blocked time: while the GPU still runs queued work the block costs nothing. "
                   "Pinned memory is page-locked host RAM taken from the OS: pin batches, not whole datasets. "
                   "non_blocking=True on a pageable tensor changes nothing. The copy's GPU time, when it runs on the"
                   " compute stream, is also h2d_on_compute_stream's: one stretch of time seen from the host and the"
                   " GPU."),
          notebook="dataloader_sync"))
