"""``repeated_grad_sync``: the gradients are synchronised after every micro-batch of a gradient-accumulation step
(DDP without ``no_sync()``, FSDP without ``set_requires_gradient_sync(False)``), where once per optimizer step
would give the same update.

**How it is read.** Each forward of the wrapped model leaves an annotation in the trace
(``DistributedDataParallel.forward``; FSDP2's ``FSDP::root_pre_forward``). Per rank and step, every gradient
collective (all-reduce, reduce-scatter) launched inside the step is assigned to the forward it follows; a step
whose gradient collectives follow k >= 2 of its forwards synchronised k times. Only the last round is needed.

**What the k-1 other rounds cost** is what they add to the step, per rank: (1) the host's own work of each sync
(:data:`SYNC_HOST_OPS`: the c10d collective calls, DDP's reducer copying each gradient into its bucket and back,
FSDP's post-backward reduce), the union of those ops' time on the rank's threads, net of the profiler's own
overhead in proportion and never more than the GPU idle for the hosts' issuing (:func:`kit.doctor.rules.comm.
host_work`); (2) the rounds' transfer that no compute hid on the GPU -- each
kernel's transfer part (the last arriver's duration: :func:`kit.doctor.collectives.exposed_parts`), never the
time a rank's kernel waited for a peer's host to reach it: ranks whose hosts differ wait for each other at every
round, but without the extra rounds they would wait as long at the last one. The job's cost is the median over
ranks (every rank syncs alike: one job-level finding). The waiting and the rounds' full transfer time are in the
evidence. The host part is issuing time: ``host_work_us_per_step`` in the evidence, which a job-level
``launch_bound`` gives up (:func:`kit.doctor.reconcile.host_work_first`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...traces.frames import GRAD_SYNC_OPS
from ..findings import make
from ..calls import ALLREDUCE_OP
from ..host_model import name_mask
from ..model import Finding, Rule, Skip, rule
from .comm import host_work
from .evidence import num

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..model import RankView

FORWARD_MARKS = ("DistributedDataParallel.forward", "FSDP::root_pre_forward")
"""the annotations PyTorch's data-parallel wrappers record once per forward of the wrapped model"""
GRAD_COLLECTIVES = ("all_reduce", "reduce_scatter")
"""the collectives that synchronise gradients (DDP's bucket all-reduces; FSDP's reduce-scatters)"""
SYNC_HOST_OPS = (ALLREDUCE_OP, "c10d::reduce_scatter", "c10d::_reduce_scatter", "FSDP::post_backward_reduce",
                 *GRAD_SYNC_OPS)
"""the host's own work of a gradient sync: the c10d calls that launch the gradient collectives, DDP's reducer ops
(the trace layer keeps them), FSDP2's post-backward reduce annotation"""
MIN_STEPS_SHARE = 0.5
"""the rule speaks when at least this share of a rank's steps synchronised more than once"""

CAUSE = ("With gradient accumulation, each micro-batch's backward() synchronises the gradients again unless told "
         "not to: DDP all-reduces every bucket after every backward, FSDP reduce-scatters after every backward. "
         "Only the last round, after the last micro-batch, is needed for the optimizer step; the earlier rounds "
         "move the same bytes for nothing, and the host work of each (copying every gradient into its bucket and "
         "back, launching the collectives) and what of their transfer the backward does not hide lengthen the "
         "step.")
FIX = ("Skip the synchronisation on all micro-batches but the last: `with model.no_sync(): loss.backward()` for "
       "DDP (the last backward outside it), `model.set_requires_gradient_sync(False)` before the first and "
       "`True` before the last backward for FSDP2 (FSDP1: `model.no_sync()`).")
CAVEATS = ("The cost counts the extra rounds' host work (net of the profiler's overhead in proportion: an estimate) "
           "and their transfer that no compute hid, not a rank's waiting for a slower peer at each round (it would "
           "wait as long at the last one); where the backward hides the transfer, skipping the rounds still frees "
           "the links and the SMs they used (the full transfer time is in the evidence). A job that syncs on purpose "
           "after every micro-batch (e.g. to clip per micro-batch) is named too.")


def extract_forwards(view: "RankView") -> "pd.DataFrame | Skip":
    """The rank's wrapped-model forwards (``kind`` 'forward': ``ts`` of each :data:`FORWARD_MARKS` annotation) and
    its gradient syncs' host work (``kind`` 'sync': each :data:`SYNC_HOST_OPS` op's ``ts``, ``end``)."""
    import pandas as pd

    cpu = view.trace.cpu
    if cpu.empty:
        return Skip("repeated_grad_sync", "no CPU events in the trace")
    fw = cpu[(cpu["cat"] == "user_annotation") & name_mask(cpu["name"], lambda s: s.str.startswith(FORWARD_MARKS))]
    sync = cpu[cpu["cat"].isin(["cpu_op", "user_annotation"]) &
               name_mask(cpu["name"], lambda s: s.str.startswith(SYNC_HOST_OPS))]
    return pd.concat([fw[["ts", "end"]].assign(kind="forward"), sync[["ts", "end"]].assign(kind="sync")],
                     ignore_index=True).sort_values("ts", kind="stable").reset_index(drop=True)


def judge_repeated(summaries: list[tuple[int, "pd.DataFrame"]], ctx) -> list[Finding] | Skip:
    import numpy as np

    from ...traces.intervals import union_np

    df = ctx.collectives()
    if df is None or df.empty or not len(summaries):
        return []
    grad = df[df["collective"].isin(GRAD_COLLECTIVES) & df["step"].notna() & df["launch_us"].notna()]
    if grad.empty:
        return []
    per_rank: dict[str, dict] = {}
    for rank, ev in summaries:
        g = grad[grad["rank"] == rank]
        starts = np.sort(ev.loc[ev["kind"] == "forward", "ts"].to_numpy(dtype=float))
        if g.empty or len(starts) < 2:
            continue
        sy = ev[ev["kind"] == "sync"]
        ua, ub = union_np(sy["ts"].to_numpy(dtype=float), sy["end"].to_numpy(dtype=float))
        rounds, host, wait, exposed, full = [], [], [], [], []
        for _, gs in g.groupby("step", sort=True):
            idx = np.searchsorted(starts, gs["launch_us"].to_numpy(dtype=float), side="right") - 1
            ok = idx >= 0
            seen = np.unique(idx[ok])
            rounds.append(len(seen))
            extra = gs[ok & (idx != seen.max())] if len(seen) >= 2 else gs.iloc[0:0]
            # the host work of the extra rounds: from each extra round's forward to the next round's forward
            h = 0.0
            for i in seen[:-1] if len(seen) >= 2 else []:
                a, b = starts[i], starts[i + 1] if i + 1 < len(starts) else np.inf
                h += float(np.clip(np.minimum(ub, b) - np.maximum(ua, a), 0, None).sum())
            host.append(h)
            exposed.append(float(np.nansum(extra["exposed_transfer_us"].to_numpy(dtype=float))))
            wait.append(float(np.nansum(extra["exposed_wait_us"].to_numpy(dtype=float))))
            full.append(float(np.nansum(extra["instance_min_us"].to_numpy(dtype=float))))
        repeated = [r for r in rounds if r >= 2]
        if not rounds or len(repeated) < MIN_STEPS_SHARE * len(rounds):
            continue
        host_us = float(np.mean(host))
        host_net, scale = host_work(ctx, int(rank), host_us)
        cost = host_net + float(np.mean(exposed))
        per_rank[str(int(rank))] = {
            "rounds_per_step": num(float(np.median(repeated)), 1), "steps_repeated": f"{len(repeated)} of {len(rounds)}",
            "cost_us_per_step": num(cost), "cost_traced_us_per_step": num(host_us + float(np.mean(exposed))),
            "host_traced_us_per_step": num(host_us),
            "host_us_per_step": num(host_net), "profiler_scale": num(scale, 3),
            "exposed_transfer_us_per_step": num(float(np.mean(exposed))),
            "transfer_us_per_step": num(float(np.mean(full))), "waiting_us_per_step": num(float(np.mean(wait)))}
    if not per_rank:
        return []
    ranks = sorted(int(r) for r in per_rank)

    def med(key: str) -> float:
        return float(np.median([v[key] or 0.0 for v in per_rank.values()]))

    cost, host, exp, full, k = (med(x) for x in ("cost_us_per_step", "host_us_per_step", "exposed_transfer_us_per_step",
                                                 "transfer_us_per_step", "rounds_per_step"))
    kinds = sorted(set(grad["collective"].astype(str)))
    ev = {"rounds_per_step": num(k, 1), "cost_traced_us_per_step": num(med("cost_traced_us_per_step")),
          "host_work_us_per_step": num(host),
          "host_traced_us_per_step": num(med("host_traced_us_per_step")), "exposed_transfer_us_per_step": num(exp),
          "transfer_us_per_step": num(full), "waiting_us_per_step": num(med("waiting_us_per_step")),
          "collectives": kinds, "job_level": True, "per_rank": per_rank}
    summary = (f"the gradients were synchronised {k:g} times per optimizer step ({', '.join(kinds)} after each of "
               f"{k:g} forwards) on {len(ranks)} of {len(summaries)} ranks; only the last round is needed: the "
               f"{k - 1:g} others cost {cost:.0f} us per step -- {host:.0f} us of the host's sync work (net of the "
               f"profiler) and {exp:.0f} us of transfer no compute hid ({full:.0f} us of transfer in all)")
    return [make("repeated_grad_sync", cost, ranks, ev, summary)]


rule(Rule(id="repeated_grad_sync", title="gradients synchronised after every micro-batch", extract=extract_forwards,
          judge=judge_repeated, cause=CAUSE, fix=FIX, caveats=CAVEATS, needs_ranks=2, order=15, cross_rank=True))
