"""``host_sync``: synchronising calls inside the step (stream/device/event synchronize, blocking copies such as
``.item()``) empty the GPU's queue; the cost is the idle GPU inside and after each until the host is ahead again,
the accounting's ``sync`` slice (:func:`kit.doctor.reconcile.accounted`); the rule's own estimate
(:func:`kit.doctor.rules.sync_costs.sync_costs`) stays in its evidence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..accounting import Account
from ..calls import WORKER_LOADER
from ..model import Explains, RankView, Rule, rule
from .evidence import num
from .host import HostSummary, HostTimeline, host_extract, judge_fired
from .sync_costs import sync_costs


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
        return {"calls_per_step": num(self.count / self.steps),
                "host_blocked_us_per_step": num(self.host_us / self.steps),
                "gpu_idle_after_us_per_step": num(self.cost), "calls": {k: dict(v) for k, v in self.calls.items()}}

    def sentence(self, who: str) -> str:
        return (f"{self.count / self.steps:.1f} synchronising calls per step ({', '.join(sorted(self.calls))}) "
                f"block the host {self.host_us / self.steps:.0f} us per step; after they return the GPU idles "
                f"{self.cost:.0f} us per step until the host is ahead again, on {who}")


@host_extract("host_sync", "synchronising calls are host calls")
def sync_extract(view: RankView, h: HostTimeline) -> HostSyncs:
    """The calls' count and host time, and their cost (:func:`sync_costs`)."""
    b = h.blocking
    per = b.groupby("name")["dur"].agg(["size", "sum"])
    sc = sync_costs(view)
    return HostSyncs(count=len(b), host_us=float(b["dur"].sum()), idle_after_us=sc.cost_us,
                     calls={str(nm): {"count": int(r["size"]), "host_us": round(float(r["sum"]), 1)}
                            for nm, r in per.iterrows()}, steps=view.n_steps, window=sc.window)


def slice_sentence(a: Account, c: float, sh: float, who: str) -> str:
    """Said from the accounting's ``sync`` slice, which is the cost (:func:`kit.doctor.reconcile.accounted`): the
    GPU's idle inside the calls and after them until the host was ahead again -- while it issued its next work, or
    loaded its next batch in the training process with the queue drained (the DataLoader's wait that queued work
    would have hidden)."""
    loads = any(WORKER_LOADER not in str(name) for name in a.calls.get("input") or {})
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) while the host was blocked in "
            f"synchronising calls and then, with the GPU's queue they drained empty, issued its next work"
            + (" or loaded its next batch" if loads else "") + f" on {who}"
            + (f": {a.calls_text('sync')}" if a.calls.get("sync") else ""))


rule(Rule(id="host_sync", title="synchronising host calls inside the step", extract=sync_extract,
          judge=judge_fired("host_sync"),
          explains=Explains(("sync",), slice_sentence, lambda a: {"sync_calls": a.calls.get("sync", {})},
                            signature=True),
          order=100,
          cause=("A call that blocks the host until the GPU is done (stream/device/event synchronize; a copy to "
                 "host memory such as .item(), .cpu(), .tolist() or printing a CUDA tensor) empties the GPU's "
                 "queue: when it returns nothing is queued, the GPU idles while the host issues the next work, "
                 "then runs each kernel as soon as it is launched until the host is ahead again."),
          fix=("Take the synchronising call out of the step or make it rare: keep losses and metrics on the GPU "
               "and read them every N steps; avoid .item()/.cpu()/print of CUDA tensors and data-dependent "
               "shapes (nonzero, boolean masks) inside the step; torch.cuda.set_sync_debug_mode('warn') names "
               "each call in the code."),
          caveats=("Some synchronisation is needed (a value the host branches on, an early stop): move it out of the"
                   " hot loop rather than remove it. The host time blocked in the call is mostly the GPU's own "
                   "queued work and is not the cost; the idle GPU after it is, until the host has rebuilt its lead -- "
                   "including a wait for a DataLoader that loads in the training process (num_workers=0) while the "
                   "queue is empty: with work queued, the GPU would have run through that wait."),
          notebook="dataloader_sync"))
