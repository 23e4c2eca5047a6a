"""``low_busbw``: traced busbw well below the same machine's sweep (:mod:`kit.doctor.sweep`) at the same size."""

from __future__ import annotations

from ...collective_ops import bus_factor
from ..collectives import Timeline, gloo_only, per_step_divisor
from ..findings import make
from ..model import Finding, Rule, Skip, rule
from .comm import extract_timeline
from .evidence import excerpt, num, size_text

LOW_BUSBW_RATIO = 0.5
"""traced busbw below this share of the sweep's at the same size is 'well below'"""


def judge_low_busbw(summaries: list[tuple[int, Timeline]], ctx) -> list[Finding] | Skip:
    from ...traces import summary as comm_summary
    from ..sweep import attainable

    if gloo_only(summaries):
        return Skip("low_busbw", "no NCCL collective in the traces, only gloo ops: a sweep measures NCCL kernels")
    df = ctx.collectives("nccl")
    if df is None:
        return []
    if df["bytes"].isna().all():
        return Skip("low_busbw", "the NCCL kernels carry no collective metadata (bytes unknown: torch < 2.3?); "
                                 "busbw cannot be computed")
    s = comm_summary(df[df["bytes"].notna()])
    tl_of = dict(summaries)
    rows, outside, missing = [], [], set()
    for r in s.itertuples():
        if r.busbw_gbps_p50 is None or r.busbw_gbps_p50 != r.busbw_gbps_p50:
            continue
        ref = attainable(ctx.sweep, r.collective, float(r.bytes))
        if ref is None:
            if (ctx.sweep["collective"] == r.collective).any():
                outside.append(f"{r.collective} {size_text(r.bytes)}")
            else:
                missing.add(r.collective)
            continue
        rows.append({"collective": r.collective, "bytes": int(r.bytes), "count": int(r.count),
                     "busbw_gbps": float(r.busbw_gbps_p50), "sweep_busbw_gbps": ref,
                     "ratio": float(r.busbw_gbps_p50) / ref, "dur_us_p50": float(r.dur_us_p50),
                     "group_size": r.group_size})
    notes = {"outside_sweep_sizes": outside, "not_in_sweep": sorted(missing)}
    low = [r for r in rows if r["ratio"] < LOW_BUSBW_RATIO]
    if not rows:
        return Skip("low_busbw", "the sweep covers none of the traced collectives at their sizes "
                                 f"({', '.join(sorted(missing) + outside) or 'none'})")
    if not low:
        return []
    # cost: per step, each slow instance's transfer time minus the time at the sweep's busbw
    n = max(per_step_divisor(tl) for tl in tl_of.values())
    cost = 0.0
    one = df.drop_duplicates(["match_key", "instance"]) if df["ranks_seen"].max() > 1 else df
    for r in low:
        g = one[(one["collective"] == r["collective"]) & (one["bytes"] == r["bytes"])]
        g = g[g["step"].notna()] if any(tl.steps for tl in tl_of.values()) else g
        f = bus_factor(r["collective"], int(r["group_size"])) if r["group_size"] else 1.0
        t_ref = r["bytes"] * f / (r["sweep_busbw_gbps"] * 1e3)  # us
        t = g["instance_min_us"].where(g["instance_min_us"].notna(), g["dur_us"]).astype(float)
        cost += float((t - t_ref).clip(lower=0).sum())
        r["sweep_us"] = t_ref
    cost /= n
    top = min(low, key=lambda r: r["ratio"])
    ex = df[(df["collective"] == top["collective"]) & (df["bytes"] == top["bytes"])].iloc[0]
    ev = {"sizes": [{k: (num(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in low],
          "checked_sizes": len(rows), **notes, "sweep_source": sorted(set(ctx.sweep["source"].astype(str))),
          "excerpt": excerpt(int(ex["rank"]), float(ex["start_us"]), float(ex["end_us"]))}
    summary = (f"{len(low)} of {len(rows)} traced (collective, size) pairs reach under "
               f"{100 * LOW_BUSBW_RATIO:.0f}% of the sweep's busbw; worst: {top['collective']} of "
               f"{size_text(top['bytes'])} at {top['busbw_gbps']:.1f} GB/s against {top['sweep_busbw_gbps']:.1f} GB/s "
               f"({100 * top['ratio']:.0f}%)")
    return [make("low_busbw", cost, sorted(tl_of), ev, summary)]


rule(Rule(id="low_busbw", title="collectives slower than this machine can do", extract=extract_timeline,
          judge=judge_low_busbw, needs_sweep=True,
          order=50, cross_rank=True,
          cause=("The job's collectives reach a fraction of the bandwidth the same machine reaches at the same size: "
                 "NCCL is configured differently in the job (an NCCL_* variable forcing a protocol, algorithm or fewer"
                 " channels), the traffic takes another path (a process group across nodes, P2P disabled, wrong NIC), "
                 "or the kernels share the GPU with compute."),
          fix=("Compare the job's NCCL environment with the sweep's (NCCL_DEBUG=INFO prints the chosen algorithm, "
               "protocol, channels and transport per communicator); unset NCCL_ALGO/NCCL_PROTO/NCCL_MAX_NCHANNELS "
               "overrides; check NCCL_P2P_DISABLE, NCCL_IB_HCA/NCCL_SOCKET_IFNAME; run the sweep with the job's "
               "environment to confirm."),
          caveats=("Traced durations are the per-instance minimum over ranks (the transfer, not the waiting) when 2+ "
                   "ranks are given; with one rank they include waiting and understate busbw. The sweep must come from "
                   "the same machine and group size; sizes outside the sweep's range are not judged."),
          notebook="collectives"))
