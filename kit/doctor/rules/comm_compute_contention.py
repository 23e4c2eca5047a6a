"""``comm_compute_contention``: NCCL kernels that run longer beside compute than alone, at the same collective and
size (transfer-only kernels: the last-arriving rank's, so waiting does not pass for slowness)."""

from __future__ import annotations

from ..collectives import Timeline, per_step_divisor
from ..findings import make
from ..model import Finding, Rule, Skip, rule
from .comm import gpu_extract
from .evidence import excerpt, num, size_text

CONTENTION_RATIO = 1.2
"""overlapped / alone median duration from which a size counts as contended (run-to-run spread is ~5%)"""
OVERLAPPED_SHARE, ALONE_SHARE = 0.2, 0.02
"""a kernel is 'overlapped' when compute ran during >= 20% of it, 'alone' below 2%"""


def judge_contention(summaries: list[tuple[int, Timeline]], ctx) -> list[Finding] | Skip:
    df = ctx.collectives("nccl")
    if df is None:
        return []
    tl_of = dict(summaries)
    # transfer-only kernels: the rank that arrived last (its kernel waited for no one), or kernels seen on one rank
    # with nothing else to see (point-to-point, one rank given; not one whose counterparts were not matched: part_of_group)
    pure = df[((df["ranks_seen"] <= 1) & ~df["part_of_group"]) | df["last"]].copy()
    pure["share"] = pure["overlap_us"] / pure["dur_us"].where(pure["dur_us"] > 0)
    known = pure["bytes"].notna() & (pure["bytes"] > 0)
    if not known.any():  # like with like only: kernels of unknown size may be of any size
        return Skip("comm_compute_contention", "the collectives' sizes are unknown (no collective metadata on the "
                                               "NCCL kernels, no input shapes): durations of different sizes "
                                               "cannot be compared")
    pure = pure[known]
    pure["size"] = pure["bytes"]
    out = []
    for (coll, size), g in pure.groupby(["collective", "size"], sort=True):
        over = g[g["share"] >= OVERLAPPED_SHARE]
        alone = g[g["share"] < ALONE_SHARE]
        if len(over) < 2 or len(alone) < 2:
            continue
        mo, ma = float(over["dur_us"].median()), float(alone["dur_us"].median())
        if ma <= 0 or mo / ma < CONTENTION_RATIO:
            continue
        extra = {}
        for rank, gr in over.groupby("rank"):
            tl = tl_of[int(rank)]
            extra[int(rank)] = float((gr.loc[gr["in_step"], "dur_us"] - ma).clip(lower=0).sum()) / per_step_divisor(tl)
        out.append({"collective": coll, "bytes": None if size < 0 else int(size), "overlapped": len(over),
                    "alone": len(alone), "overlapped_us_p50": mo, "alone_us_p50": ma, "ratio": mo / ma,
                    "overlap_share_p50": float(over["share"].median()), "extra": extra,
                    "example": over.loc[over["dur_us"].idxmax()]})
    if not out:
        return []
    ranks = sorted({r for o in out for r in o["extra"]})
    per_rank = {r: sum(o["extra"].get(r, 0.0) for o in out) for r in ranks}
    worst = max(per_rank, key=per_rank.get)
    cost = per_rank[worst]
    top = max(out, key=lambda o: o["ratio"])
    ex = top["example"]
    ev = {"sizes": [{k: (num(v, 3) if isinstance(v, float) else v) for k, v in o.items()
                     if k not in ("extra", "example")}
                    for o in out],
          "extra_us_per_step": {str(r): num(v) for r, v in per_rank.items()},
          "ratio_max": num(top["ratio"], 3), "excerpt": excerpt(int(ex["rank"]), float(ex["start_us"]),
                                                                float(ex["end_us"]))}
    what = top["collective"] + (f" of {size_text(top['bytes'])}" if top["bytes"] else "")
    summary = (f"{what} took {top['overlapped_us_p50']:.0f} us (median of {top['overlapped']}) beside compute "
               f"against {top['alone_us_p50']:.0f} us alone ({top['ratio']:.2f}x); the stretch costs rank {worst} "
               f"{cost:.0f} us of communication per step")
    return [make("comm_compute_contention", cost, ranks, ev, summary)]


rule(Rule(id="comm_compute_contention", title="NCCL kernels slowed down by the compute beside them",
          extract=gpu_extract("comm_compute_contention"), judge=judge_contention,
          order=40, cross_rank=True,
          cause=("NCCL moves data with kernels on the GPU's SMs: beside large compute kernels (GEMMs that fill "
                 "every SM) they get fewer SMs and less memory bandwidth, so the same transfer takes longer -- and"
                 " the compute beside it slows down too."),
          fix=("Give NCCL fewer, dedicated resources or move bytes without SMs: "
               "NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS to bound its SMs, copy-engine transfers for point-to-point"
               " (CUDA IPC / peer copies between GPUs of one node), or schedule the large transfers beside "
               "lighter kernels."),
          caveats=("Compares transfer-only kernels (the last-arriving rank's, so waiting does not pass for slowness)"
                   " of the same collective and size; point-to-point kernels are not matched across ranks, so a "
                   "receive may include waiting for its sender. A stretched transfer that stays hidden behind "
                   "compute costs no step time by itself; the compute it slows is not counted here."),
          notebook="p2p_transports"))
