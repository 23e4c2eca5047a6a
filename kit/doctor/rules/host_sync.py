"""``host_sync``: synchronising calls inside the step (stream/device/event synchronize, blocking copies such as
``.item()``) empty the GPU's queue; the cost is the idle GPU after each until the host is ahead again
(:func:`kit.doctor.rules.sync_costs.sync_costs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model import RankView, Rule, rule
from ..texts import TEXT
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


rule(Rule(id="host_sync", title="synchronising host calls inside the step", extract=sync_extract,
          judge=judge_fired("host_sync"), **TEXT["host_sync"]))
