"""``exposed_comm``: communication time during which no compute ran (what overlap would hide), counted on the rank
that arrived last at each collective (its transfer part: waiting for a late peer is ``late_rank``'s)."""

from __future__ import annotations

from ..collectives import kernel_parts, per_step_divisor
from ..findings import make
from ..model import Finding, Rule, Skip, rule
from .comm import gpu_extract
from .evidence import excerpt, num


def judge_exposed(summaries, ctx) -> list[Finding] | Skip:
    tl_of = dict(summaries)
    df = ctx.collectives("nccl")
    if df is None:
        return []
    steps = any(tl.steps for tl in tl_of.values())
    df = df[df["in_step"]]
    n = max(per_step_divisor(tl) for tl in tl_of.values())
    multi = bool(df["ranks_seen"].max() > 1)
    per_rank = {}
    for rank, tl in summaries:
        mine = df[df["rank"] == rank]
        d = mine[~mine["unmatched"]]  # transfer not known (kit.doctor.collectives.unmatched): not the rank's transfer
        a, b = kernel_parts(d, "transfer")
        tr, ex = float((b - a).sum()) / n, float(d["exposed_transfer_us"].sum()) / n
        per_rank[str(rank)] = {"comm_us_per_step": num(mine["dur_us"].sum() / n), "transfer_us_per_step": num(tr),
                               "exposed_transfer_us_per_step": num(ex),
                               "exposed_wait_us_per_step": num(d["exposed_wait_us"].sum() / n),
                               "hidden_share": num(1 - ex / tr, 3) if tr else None}
    # the job's cost: per collective instance, the exposure on the rank that arrived last (the others were
    # waiting for it anyway); collectives seen on one rank only (point-to-point) count on their own rank
    # an instance seen on 2+ ranks but not on every rank of its group: the rank given that arrived last may have
    # waited for one not given, so its transfer is not known (kit.doctor.collectives: ``part_of_group``): none counts;
    # nor a collective seen on one rank whose counterparts on the other ranks given were not matched (``unmatched``)
    part = df["part_of_group"]
    last = df[df["last"] & ~part]
    single = df[(df["ranks_seen"] <= 1) & ~part].groupby("rank")["exposed_transfer_us"].sum()
    cost = (float(last["exposed_transfer_us"].sum()) + float(single.max() if len(single) else 0.0)) / n
    if cost <= 0:
        return []
    worst = int(max(per_rank, key=lambda r: per_rank[r]["exposed_transfer_us_per_step"] or 0.0))
    d = df[df["rank"] == worst]
    step_d = d[d["step"] == d["step"].min()] if steps else d
    w = per_rank[str(worst)]
    ev = {"exposed_us_per_step": num(cost), "rank": worst, **w, "per_rank": per_rank, "matched_across_ranks": multi,
          **({"not_counted_part_of_group_us_per_step": num(float(df[(df["last"] | (df["ranks_seen"] <= 1)) & part][
              "exposed_transfer_us"].sum()) / n)} if part.any() else {}),
          "excerpt": excerpt(worst, float(step_d["start_us"].min()), float(step_d["end_us"].max()))}
    summary = (f"{cost:.0f} us per step of communication ran with no compute beside it on the rank that arrived "
               f"last; rank {worst} hid {100 * (w['hidden_share'] or 0):.0f}% of its "
               f"{w['transfer_us_per_step']:.0f} us "
               f"of transfers per step"
               + ("" if multi else " (one rank only: waiting for peers is not separated from the transfer)"))
    ranks = tuple(sorted(int(r) for r, v in per_rank.items() if (v["exposed_transfer_us_per_step"] or 0) > 0))
    return [make("exposed_comm", cost, ranks, ev, summary)]


rule(Rule(id="exposed_comm", title="communication not hidden behind compute", judge=judge_exposed,
          extract=gpu_extract("exposed_comm"),
          order=20, cross_rank=True,
          cause=("Collective kernels run while no compute kernel runs beside them: the step waits for the network."
                 " In data parallelism this is the gradient sync that starts after backward (or one large final "
                 "bucket); in tensor/sequence parallelism, collectives that the next layer depends on."),
          fix=("Overlap communication with compute: DDP's bucketed all-reduce during backward (a smaller "
               "bucket_cap_mb starts the first buckets earlier), FSDP's backward_prefetch/forward_prefetch, "
               "async tensor parallelism (torch.compile's micro-pipelining, symmetric memory); otherwise send "
               "fewer bytes (bf16 gradients, a compression comm hook) or use a faster interconnect."),
          caveats=("Counts the transfer part of each kernel (its duration on the rank that arrived last) on the rank"
                   " that arrived last at each collective (the critical path); waiting for a late peer is "
                   "late_rank's. A collective seen on some ranks of its group but not all (a subset of a job's "
                   "traces) is not counted: the rank given that arrived last may have waited for one not given "
                   "(evidence: not_counted_part_of_group_us_per_step). Kernels of several process groups running at "
                   "once are each counted. Overlapped "
                   "communication is not free either: it competes with compute for SMs and memory bandwidth "
                   "(comm_compute_contention)."),
          notebook="collective_tracing"))
