"""Each rank's own time per step -- the step it would run if no peer made it wait -- and whether one rank or the
whole job sets the pace. Read by ``late_rank`` before it names a rank, and by the job-level verdict.

Per rank and step, from the host model's per-step frame (:data:`kit.doctor.host_model.PER_STEP`, one row per
step window, shipped as ``JobContext.host_steps``) and the collectives matched across ranks
(``JobContext.collectives()``):

* ``own_host_us`` -- the host's time in the step not spent blocked on peers, collectives or the GPU:
  ``dur - comm_wait_us - sync_us`` (issuing, data loading, stalls, allocator calls, short idle);
* ``own_gpu_us`` -- the GPU's busy time outside collectives plus the collectives' transfer part (each instance's
  shortest kernel over ranks, ``instance_min_us``): ``gpu_compute_us + transfer_us``; 0 on a CPU-only job;
* ``own_us = max(own_host_us, own_gpu_us)`` and ``bound``: 'host' or 'gpu', whichever sets it;
* ``wait_us = dur - own_us`` (at least 0): the rest of the step -- waiting for peers, directly or through the GPU.

**Who sets the pace** (:func:`pace`). Per rank the median over steps of ``own_us``. The slowest rank is *late*
only when its own time exceeds every other rank's by more than those ranks' spread -- the larger of the range of
their medians and their step-to-step spread (p90 - p10 of each one's per-step own time) -- and by at least
:data:`MIN_EXCESS_SHARE` of the step: ranks that run the same code drift by their spread, and under the
profiler the slowest host among equals always looks a little late. Its cost is that excess: what the job's step
would lose were the rank as fast as the next slowest. Otherwise the job sets the pace, bound by what bounds most of
its ranks (``job_bound``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

MIN_EXCESS_SHARE = 0.03
"""a rank's own time must exceed the next slowest rank's by at least this share of the step to be late: below it
the waiting it causes is within what ranks running the same code drift by (DDP on 2 ranks under the profiler)"""
OWN_COLUMNS = ("rank", "step", "dur", "own_host_us", "own_gpu_us", "own_us", "bound", "wait_us")


def transfer_per_step(collectives: "pd.DataFrame | None") -> dict[tuple[int, int], float]:
    """(rank, step) -> the transfer part of its collectives (sum of each instance's shortest duration over ranks)."""
    if collectives is None or collectives.empty or "instance_min_us" not in collectives:
        return {}
    c = collectives[collectives["step"].notna()]
    t = c.groupby([c["rank"].astype(int), c["step"].astype(int)])["instance_min_us"].sum()
    return {(int(r), int(s)): float(v) for (r, s), v in t.items()}


def own_times(host_steps: dict[int, "pd.DataFrame | None"], collectives: "pd.DataFrame | None" = None
              ) -> "pd.DataFrame":
    """One row per rank and step: :data:`OWN_COLUMNS` (module docstring)."""
    import numpy as np
    import pandas as pd

    tr = transfer_per_step(collectives)
    rows = []
    for rank, ps in sorted(host_steps.items()):
        if ps is None or ps.empty:
            continue
        ps = ps[ps["step"] >= 0] if (ps["step"] >= 0).any() else ps
        host = ps["dur"] - ps["comm_wait_us"] - ps["sync_us"]
        gpu = ps["gpu_compute_us"] + np.array([tr.get((int(rank), int(s)), 0.0) for s in ps["step"]])
        gpu = gpu.where(ps["gpu_busy_us"] > 0, 0.0)
        own = np.maximum(host, gpu)
        rows.append(pd.DataFrame({"rank": int(rank), "step": ps["step"].astype(int), "dur": ps["dur"],
                                  "own_host_us": host, "own_gpu_us": gpu, "own_us": own,
                                  "bound": np.where(gpu > host, "gpu", "host"),
                                  "wait_us": np.maximum(ps["dur"] - own, 0.0)}))
    if not rows:
        return pd.DataFrame(columns=list(OWN_COLUMNS))
    return pd.concat(rows, ignore_index=True)[list(OWN_COLUMNS)]


def pace(own: "pd.DataFrame", step_us: float | None = None) -> dict[str, Any]:
    """Who sets the job's pace (module docstring): ``late`` (the late rank or None), ``excess_us`` (its own time
    over the next slowest rank's), ``spread_us`` (the others' spread it had to exceed), ``job_bound`` ('host',
    'gpu' or 'mixed'), and per rank ``own_us``, ``own_host_us``, ``own_gpu_us``, ``wait_us`` (medians over steps)
    and ``spread_us`` (p90 - p10 over steps)."""
    import numpy as np

    out: dict[str, Any] = {"late": None, "excess_us": 0.0, "spread_us": None, "job_bound": None, "per_rank": {}}
    if own.empty or own["rank"].nunique() < 2:
        return out
    per = {}
    for rank, g in own.groupby("rank", sort=True):
        q = np.percentile(g["own_us"], [10, 90])
        per[int(rank)] = {"own_us": float(g["own_us"].median()), "own_host_us": float(g["own_host_us"].median()),
                          "own_gpu_us": float(g["own_gpu_us"].median()), "wait_us": float(g["wait_us"].median()),
                          "spread_us": float(q[1] - q[0]), "bound": str(g["bound"].mode().iloc[0])}
    out["per_rank"] = {str(r): {k: (round(v, 1) if isinstance(v, float) else v) for k, v in p.items()}
                       for r, p in per.items()}
    bounds = {p["bound"] for p in per.values()}
    out["job_bound"] = bounds.pop() if len(bounds) == 1 else "mixed"
    slow = max(per, key=lambda r: per[r]["own_us"])
    others = [p for r, p in per.items() if r != slow]
    top = max(p["own_us"] for p in others)
    spread = max(top - min(p["own_us"] for p in others), max(p["spread_us"] for p in others))
    excess = per[slow]["own_us"] - top
    step = step_us or float(own["dur"].median())
    out.update(excess_us=round(excess, 1), spread_us=round(spread, 1), slowest=slow)
    if excess > spread and excess >= MIN_EXCESS_SHARE * step:
        out["late"] = slow
    return out
