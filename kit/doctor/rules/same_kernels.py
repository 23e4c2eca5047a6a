"""Does a rank run the same compute kernels more slowly than the others? Per rank, the heaviest compute kernels'
median durations (:func:`kernel_speeds`, kept by ``late_rank``'s extract); across ranks, the time-weighted ratio
(:func:`gpu_speed`) -- a slower GPU (clocks, power, temperature) rather than more work."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model import RankView

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

KERNEL_TOP = 20
"""late_rank compares the late rank's GPU with the others' on its 20 heaviest compute kernels (by total time):
enough to cover most of a step's compute, few enough to travel with the summary"""
SLOW_GPU = 0.02
"""the same kernels >= 2% slower (time-weighted geometric mean of median ratios) = the late rank's GPU is slower
at the same work: above the spread between two GPUs of one machine running the same kernels
(calibration: FINDINGS.md, "kit doctor's thresholds against the recorded runs")"""


SAME_COUNT = 0.10
"""two ranks run "the same kernel" when they launch it as many times per step, within this share: a kernel name
is a template, not a shape -- a rank that runs extra matmuls launches the same GEMM kernel more often, on other
shapes, and its median says nothing about its GPU's speed"""


def kernel_speeds(view: RankView) -> "pd.DataFrame | None":
    """Median and total duration and launches per step of each compute-kernel name (NCCL kernels and copies left
    out) that the traced steps issued (work queued before the trace began is the previous steps'), the heaviest
    :data:`KERNEL_TOP`; ``total_us`` and ``per_step`` are per step. None when the trace has no compute kernel."""
    g = view.issued() if not view.trace.gpu.empty else view.trace.gpu
    k = g[(g["cat"] == "kernel") & ~g["nccl"].astype(bool)] if not g.empty else g
    if len(k) and k["in_step"].any():
        k = k[k["in_step"]]
    if k.empty:
        return None
    n = max(1, len(view.steps)) if view.steps is not None else 1
    agg = k.groupby(k["name"].astype(str), observed=True)["dur"].agg(median_us="median", total_us="sum",
                                                                      per_step="count")
    agg[["total_us", "per_step"]] = agg[["total_us", "per_step"]] / n
    return agg.nlargest(KERNEL_TOP, "total_us")


def gpu_speed(late: int, kernels: dict[int, "pd.DataFrame | None"]) -> float | None:
    """How much slower the late rank ran the same compute kernels than the other ranks: the geometric mean,
    weighted by the late rank's time in each kernel, of (its median) / (the other ranks' median of medians),
    minus 1, over the kernels it launched as often per step as they did (:data:`SAME_COUNT`). None when fewer
    than 3 kernel names are shared."""
    import numpy as np

    mine = kernels.get(late)
    others = [k["median_us"] for r, k in kernels.items() if r != late and k is not None]
    if mine is None or not others:
        return None
    import pandas as pd

    ref = pd.concat(others, axis=1).median(axis=1)
    both = mine.join(ref.rename("ref"), how="inner")
    if "per_step" in mine:  # the same kernel: launched as often per step (:data:`SAME_COUNT`)
        counts = pd.concat([k["per_step"] for r, k in kernels.items() if r != late and k is not None and
                            "per_step" in k], axis=1).median(axis=1)
        both = both.join(counts.rename("ref_per_step"), how="inner")
        both = both[(both["per_step"] - both["ref_per_step"]).abs() <= SAME_COUNT * both["ref_per_step"]]
    both = both[(both["ref"] > 0) & (both["median_us"] > 0)]
    if len(both) < 3:
        return None
    w = both["total_us"] / both["total_us"].sum()
    return float(np.exp((w * np.log(both["median_us"] / both["ref"])).sum()) - 1)


def extra_work(late: int, kernels: dict[int, "pd.DataFrame | None"], n: int = 3) -> list[dict]:
    """The late rank's GPU work the other ranks do not have: its heaviest kernels that it launches more often per
    step than they do (beyond :data:`SAME_COUNT`; a kernel not among another rank's heaviest counts as not run
    there), with the extra launches and time per step, the ``n`` largest by extra time."""
    import pandas as pd

    mine = kernels.get(late)
    others = [k for r, k in kernels.items() if r != late and k is not None and "per_step" in k]
    if mine is None or "per_step" not in mine or not others:
        return []
    ref_n = pd.concat([k["per_step"] for k in others], axis=1).reindex(mine.index).fillna(0.0).median(axis=1)
    ref_t = pd.concat([k["total_us"] for k in others], axis=1).reindex(mine.index).fillna(0.0).median(axis=1)
    more = mine[mine["per_step"] > (1 + SAME_COUNT) * ref_n]
    out = [{"kernel": str(name), "extra_per_step": round(float(r["per_step"] - ref_n[name]), 1),
            "extra_us_per_step": round(float(r["total_us"] - ref_t[name]), 1)} for name, r in more.iterrows()]
    return sorted((x for x in out if x["extra_us_per_step"] > 0), key=lambda x: -x["extra_us_per_step"])[:n]
