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


DISTINCT_HOST = ("data_wait_us", "stall_us", "alloc_us", "issue_us")
"""a rank's own host time (the host model's kinds): waiting for its DataLoader, stalling (no op, no call: Python
work, a sleep), the allocator's device calls, issuing its work. Not its short idle gaps: under the profiler they
are mostly the profiler's own time between the events it records"""
OWN_GPU = "gpu_compute_us"
"""a rank's own GPU time: busy outside the collectives"""
MIN_OWN_EXCESS_SHARE = 0.05
"""a late rank's own excess must reach this share of the step"""
PROFILER_NOISE = 0.5
"""... and this share of the profiler's own overhead on the late rank's step (:mod:`kit.doctor.overhead`): the
profiler slows every rank's host by about that much, unevenly -- in the multi-GPU corpus's controls (every rank the
same code) the slowest host issued 2-5 ms more per step than the others under 10-40 ms of profiler overhead"""


def own_excess(host_steps: dict, late: int, step_us: float | None, gpu_us: dict | None = None,
               overhead_us: float = 0.0) -> dict | None:
    """Does rank ``late`` have time of its own -- :data:`DISTINCT_HOST` on its host, or GPU compute (``gpu_us``:
    rank -> its compute kernels' summed time per step, where given: kernels that overlap a collective count too;
    else :data:`OWN_GPU`) -- beyond
    every other rank's, by more than their spread, :data:`MIN_OWN_EXCESS_SHARE` of the step and
:data:`PROFILER_NOISE` of the profiler's overhead on its step (``overhead_us``)? ``confirmed``,
    ``excess_us`` (per step: what the job would gain were the rank as fast as the next slowest), ``kind`` ('host' or
    'gpu'), ``spread_us`` and per rank the medians. None when the ranks' host steps are not all there."""
    import numpy as np

    have = {int(r): ps[ps["step"] >= 0] if (ps["step"] >= 0).any() else ps for r, ps in host_steps.items()
            if ps is not None and not ps.empty}
    if late not in have or len(have) < 2:
        return None
    per = {}
    for r, ps in have.items():
        host = ps[list(DISTINCT_HOST)].sum(axis=1).to_numpy(dtype=float)
        gpu = ps[OWN_GPU].to_numpy(dtype=float)
        if gpu_us and r in gpu_us and gpu_us[r] is not None:
            gpu = np.array([float(gpu_us[r])])
        per[r] = {"host_us": float(np.median(host)), "gpu_us": float(np.median(gpu)),
                  "host_spread_us": float(np.ptp(np.percentile(host, [10, 90]))),
                  "gpu_spread_us": float(np.ptp(np.percentile(gpu, [10, 90])))}
    others = [p for r, p in per.items() if r != late]
    out = {}
    for kind in ("host", "gpu"):
        vals = [p[f"{kind}_us"] for p in others]
        spread = (max(vals) - min(vals)) + max(p[f"{kind}_spread_us"] for p in others)
        out[kind] = (per[late][f"{kind}_us"] - max(vals), spread)
    kind = max(out, key=lambda k: out[k][0] - out[k][1])
    excess, spread = out[kind]
    step = step_us or float(np.median([ps["dur"].median() for ps in have.values()]))
    floor = max(spread, MIN_OWN_EXCESS_SHARE * step, PROFILER_NOISE * overhead_us)
    return {"confirmed": bool(excess > floor), "excess_us": round(excess, 1), "kind": kind,
            "spread_us": round(spread, 1), "floor_us": round(floor, 1),
            "per_rank": {str(r): {k: round(v, 1) for k, v in p.items()} for r, p in sorted(per.items())}}
