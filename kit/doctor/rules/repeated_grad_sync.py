"""``repeated_grad_sync``: the gradients are synchronised after every micro-batch of a gradient-accumulation step
(DDP without ``no_sync()``, FSDP without ``set_requires_gradient_sync(False)``), where once per optimizer step
would give the same update.

**How it is read.** Each forward of the wrapped model leaves an annotation in the trace
(``DistributedDataParallel.forward``; FSDP2's ``FSDP::root_pre_forward``). Per rank and step, every gradient
collective (all-reduce, reduce-scatter) launched inside the step is assigned to the forward it follows; a step
whose gradient collectives follow k >= 2 of its forwards synchronised k times. Only the last round is needed:
the cost is what the other k-1 rounds took from the step -- their kernels' transfer and waiting time that no
compute hid (:func:`kit.doctor.collectives.exposed_parts`; a round hidden behind the backward costs nothing), per
step, the median over ranks (every rank syncs alike: one job-level finding). The rounds' full transfer time is
in the evidence (an upper bound: what it would cost on a link too slow to hide it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..findings import make
from ..model import Finding, Rule, Skip, rule
from .evidence import num

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..model import RankView

FORWARD_MARKS = ("DistributedDataParallel.forward", "FSDP::root_pre_forward")
"""the annotations PyTorch's data-parallel wrappers record once per forward of the wrapped model"""
GRAD_COLLECTIVES = ("all_reduce", "reduce_scatter")
"""the collectives that synchronise gradients (DDP's bucket all-reduces; FSDP's reduce-scatters)"""
MIN_STEPS_SHARE = 0.5
"""the rule speaks when at least this share of a rank's steps synchronised more than once"""

CAUSE = ("With gradient accumulation, each micro-batch's backward() synchronises the gradients again unless told "
         "not to: DDP all-reduces every bucket after every backward, FSDP reduce-scatters after every backward. "
         "Only the last round, after the last micro-batch, is needed for the optimizer step; the earlier rounds "
         "move the same bytes for nothing, and what of them the backward does not hide lengthens the step.")
FIX = ("Skip the synchronisation on all micro-batches but the last: `with model.no_sync(): loss.backward()` for "
       "DDP (the last backward outside it), `model.set_requires_gradient_sync(False)` before the first and "
       "`True` before the last backward for FSDP2 (FSDP1: `model.no_sync()`).")
CAVEATS = ("The cost counts only the extra rounds' time that no compute hid on the GPU; where the backward hides "
           "them, skipping them still frees the links and the SMs they used (the full transfer time is in the "
           "evidence). A job that syncs on purpose after every micro-batch (e.g. to clip per micro-batch) is "
           "named too.")


def extract_forwards(view: "RankView") -> "pd.DataFrame | Skip":
    """The rank's wrapped-model forwards: ``ts`` of each :data:`FORWARD_MARKS` annotation."""
    cpu = view.trace.cpu
    if cpu.empty:
        return Skip("repeated_grad_sync", "no CPU events in the trace")
    names = cpu["name"].astype(str)
    fw = cpu[(cpu["cat"] == "user_annotation") & names.str.startswith(FORWARD_MARKS)]
    return fw[["ts"]].sort_values("ts").reset_index(drop=True)


def judge_repeated(summaries: list[tuple[int, "pd.DataFrame"]], ctx) -> list[Finding] | Skip:
    import numpy as np

    df = ctx.collectives()
    if df is None or df.empty or not len(summaries):
        return []
    grad = df[df["collective"].isin(GRAD_COLLECTIVES) & df["step"].notna() & df["launch_us"].notna()]
    if grad.empty:
        return []
    per_rank: dict[str, dict] = {}
    for rank, fw in summaries:
        g = grad[grad["rank"] == rank]
        starts = np.sort(fw["ts"].to_numpy(dtype=float))
        if g.empty or len(starts) < 2:
            continue
        rounds, extra_exposed, extra_full = [], [], []
        for _, gs in g.groupby("step", sort=True):
            idx = np.searchsorted(starts, gs["launch_us"].to_numpy(dtype=float), side="right") - 1
            ok = idx >= 0
            seen = np.unique(idx[ok])
            rounds.append(len(seen))
            if len(seen) < 2:
                extra_exposed.append(0.0)
                extra_full.append(0.0)
                continue
            extra = gs[ok & (idx != seen.max())]
            exposed = extra.get("exposed_transfer_us", 0.0) + extra.get("exposed_wait_us", 0.0)
            extra_exposed.append(float(np.nansum(np.asarray(exposed, dtype=float))))
            extra_full.append(float(np.nansum(extra["instance_min_us"].to_numpy(dtype=float))))
        repeated = [r for r in rounds if r >= 2]
        if not rounds or len(repeated) < MIN_STEPS_SHARE * len(rounds):
            continue
        per_rank[str(int(rank))] = {
            "rounds_per_step": num(float(np.median(repeated)), 1), "steps_repeated": f"{len(repeated)} of {len(rounds)}",
            "extra_rounds_exposed_us_per_step": num(float(np.mean(extra_exposed))),
            "extra_rounds_transfer_us_per_step": num(float(np.mean(extra_full)))}
    if not per_rank:
        return []
    ranks = sorted(int(r) for r in per_rank)
    cost = float(np.median([v["extra_rounds_exposed_us_per_step"] or 0.0 for v in per_rank.values()]))
    full = float(np.median([v["extra_rounds_transfer_us_per_step"] or 0.0 for v in per_rank.values()]))
    k = float(np.median([v["rounds_per_step"] for v in per_rank.values()]))
    kinds = sorted(set(grad["collective"].astype(str)))
    ev = {"rounds_per_step": num(k, 1), "extra_rounds_exposed_us_per_step": num(cost),
          "extra_rounds_transfer_us_per_step": num(full), "collectives": kinds, "job_level": True,
          "per_rank": per_rank}
    summary = (f"the gradients were synchronised {k:g} times per optimizer step ({', '.join(kinds)} after each of "
               f"{k:g} forwards) on {len(ranks)} of {len(summaries)} ranks; only the last round is needed: the "
               f"{k - 1:g} others took {cost:.0f} us per step that compute did not hide ({full:.0f} us of transfer "
               f"in all)")
    return [make("repeated_grad_sync", cost, ranks, ev, summary)]


rule(Rule(id="repeated_grad_sync", title="gradients synchronised after every micro-batch", extract=extract_forwards,
          judge=judge_repeated, cause=CAUSE, fix=FIX, caveats=CAVEATS, needs_ranks=2, order=15, cross_rank=True))
