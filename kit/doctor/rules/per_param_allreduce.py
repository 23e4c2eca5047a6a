"""``per_param_allreduce``: many small all-reduces per step (per-parameter sync, or DDP with a tiny
``bucket_cap_mb``), each paying the collective's latency and the host's call. The saving of bucketing them is what
the step would lose: (1) the kernels' time below the bucket size against the same bytes in 25 MiB buckets at the
trace's own bandwidth at large sizes (else the sweep's), and (2) the host's time in the calls bucketing removes --
the c10d all-reduce ops' time per step (:data:`HOST_OPS`) x (1 - buckets / calls), net of the profiler's overhead
in proportion and never more than the GPU idle for the hosts' issuing (:func:`kit.doctor.rules.comm.host_work`). The host part is issuing time:
``host_work_us_per_step`` in the evidence, which a job-level ``launch_bound`` gives up
(:func:`kit.doctor.reconcile.host_work_first`)."""

from __future__ import annotations

import math

import numpy as np

from ...collective_ops import bus_factor
from ..collectives import Timeline, per_step_divisor
from ..findings import make
from ..calls import ALLREDUCE_OP
from ..host_model import name_mask
from ..model import Finding, Rule, Skip, rule
from .comm import extract_timeline, host_work
from .evidence import MiB, excerpt, num, size_text

SMALL_BYTES = 1 * MiB
"""all-reduces below this are latency-bound on any NVLink/InfiniBand link: their time is mostly fixed cost"""
BUCKET_BYTES = 25 * MiB
"""DDP's default ``bucket_cap_mb``: the size the bucketing estimate packs small gradients into"""
MANY_SMALL_PER_STEP = 8
"""small all-reduces per step from which ``per_param_allreduce`` speaks (DDP issues a handful of buckets)"""
LARGE_BYTES = 16 * MiB
"""all-reduces at or above this size give the trace's own bandwidth for the bucketing estimate"""
HOST_OPS = (ALLREDUCE_OP,)
"""the host's call behind each all-reduce (:data:`kit.doctor.calls.ALLREDUCE_OP`)"""


def extract_per_param(view) -> "tuple[Timeline, float] | Skip":
    """The rank's collectives :class:`Timeline` and its host time in :data:`HOST_OPS` inside its steps (us)."""
    from ..collectives import step_of

    tl = extract_timeline(view)
    if isinstance(tl, Skip):
        return tl
    cpu = view.trace.cpu
    ops = cpu[name_mask(cpu["name"], lambda s: s.str.startswith(HOST_OPS))] if not cpu.empty else cpu
    if len(ops) and tl.steps:
        ops = ops[~np.isnan(step_of(ops["ts"], view.steps))]
    return tl, float(ops["dur"].sum()) if len(ops) else 0.0


def judge_per_param(summaries: list[tuple[int, Timeline]], ctx) -> list[Finding] | Skip:
    import numpy as np

    df = ctx.collectives()
    ar = df[df["collective"] == "all_reduce"] if df is not None else None
    if ar is None or ar.empty:
        return []
    if ar["bytes"].isna().all():
        return Skip("per_param_allreduce", "the all-reduces carry no collective metadata (bytes unknown: torch < "
                                           "2.3 or a trace without record_shapes?); sizes cannot be judged")
    ar = ar[ar["bytes"].notna()]
    tl_of = {rk: tl for rk, (tl, _) in summaries}
    host_of = {rk: h for rk, (_, h) in summaries}
    dur = ar["instance_min_us"].where(ar["instance_min_us"].notna(), ar["dur_us"]).astype(float)
    ar = ar.assign(t_us=dur, bytes=ar["bytes"].astype(float))
    # the link's reference: the trace's own large all-reduces, else the sweep at the bucket size, else the
    # trace's largest all-reduce (a lower bound on what bucketing gives back)
    group = float(ar["group_size"].dropna().median()) if ar["group_size"].notna().any() else 2.0
    big = ar[ar["bytes"] >= LARGE_BYTES]
    if len(big):
        algbw, bw_source = float(np.median(big["bytes"] / big["t_us"])), "trace"  # bytes/us = MB/s
    elif ctx.sweep is not None and _sweep_algbw(ctx.sweep, BUCKET_BYTES, group):
        algbw, bw_source = _sweep_algbw(ctx.sweep, BUCKET_BYTES, group), "sweep"
    else:
        top = ar[ar["bytes"] == ar["bytes"].max()]
        algbw, bw_source = float(np.median(top["bytes"] / top["t_us"])), "trace (largest all-reduce)"
    tiny = ar[ar["bytes"] <= 64 * 1024]
    latency = float(np.median(tiny["t_us"])) if len(tiny) else float(ar["t_us"].min())
    per_rank, fired = {}, []
    for rank, g in ar.groupby("rank", sort=True):
        tl = tl_of[int(rank)]
        g = g[g["in_step"]]
        n = per_step_divisor(tl)
        small = g[g["bytes"] < SMALL_BYTES]
        sub = g[g["bytes"] < BUCKET_BYTES]
        actual = float(sub["t_us"].sum()) / n
        sub_bytes = float(sub["bytes"].sum()) / n
        buckets = math.ceil(sub_bytes / BUCKET_BYTES) if sub_bytes else 0
        bucketed = buckets * latency + sub_bytes / algbw if algbw > 0 else actual
        calls = len(g) / n
        host_traced = host_of.get(int(rank), 0.0) / n
        fewer = max(0.0, 1.0 - max(buckets, 1) / calls) if calls else 0.0
        host, scale = host_work(ctx, int(rank), host_traced * fewer)
        ev = {"all_reduces_per_step": num(len(g) / n), "small_per_step": num(len(small) / n),
              "time_us_per_step": num(g["t_us"].sum() / n), "small_time_us_per_step": num(small["t_us"].sum() / n),
              "latency_bound_share": num(small["t_us"].sum() / g["t_us"].sum(), 3) if g["t_us"].sum() else None,
              "bytes_p10": num(np.percentile(g["bytes"], 10), 0) if len(g) else None,
              "bytes_p50": num(np.median(g["bytes"]), 0) if len(g) else None,
              "bytes_p90": num(np.percentile(g["bytes"], 90), 0) if len(g) else None,
              "below_bucket_us_per_step": num(actual), "bucketed_estimate_us_per_step": num(bucketed),
              "kernel_saving_us_per_step": num(max(actual - bucketed, 0.0)),
              "host_calls_traced_us_per_step": num(host_traced), "host_work_us_per_step": num(host),
              "profiler_scale": num(scale, 3), "saving_us_per_step": num(max(actual - bucketed, 0.0) + host),
              "cost_traced_us_per_step": num(max(actual - bucketed, 0.0) + host_traced * fewer)}
        per_rank[str(int(rank))] = ev
        if len(small) / n >= MANY_SMALL_PER_STEP:
            fired.append(int(rank))
    if not fired:
        return []
    worst = max(fired, key=lambda r: per_rank[str(r)]["saving_us_per_step"] or 0.0)
    w = per_rank[str(worst)]
    g0 = ar[(ar["rank"] == worst) & (ar["bytes"] < SMALL_BYTES) & ar["in_step"]].sort_values("start_us")
    first_step = g0[g0["step"] == g0["step"].min()] if tl_of[worst].steps else g0
    first_step = first_step.iloc[:2 * MANY_SMALL_PER_STEP]  # a run of them, readable on a timeline
    ev = {**w, "latency_us": num(latency, 2), "reference_algbw_gbps": num(algbw / 1e3, 1),
          "reference_source": bw_source, "bucket_bytes": BUCKET_BYTES, "small_bytes": SMALL_BYTES,
          "per_rank": per_rank,
          "excerpt": excerpt(worst, float(first_step["start_us"].min()), float(first_step["end_us"].max()))}
    summary = (f"{w['all_reduces_per_step']:g} all-reduces per step, {w['small_per_step']:g} of them below "
               f"{size_text(SMALL_BYTES)} (median {size_text(w['bytes_p50'])}): fewer, larger ones would save "
               f"about {w['saving_us_per_step'] or 0.0:.0f} us per step -- "
               f"{w['kernel_saving_us_per_step'] or 0.0:.0f} us of all-reduce time ({size_text(BUCKET_BYTES)} buckets "
               f"would take ~{w['bucketed_estimate_us_per_step']:.0f} us instead of "
               f"{w['below_bucket_us_per_step']:.0f} us) and {w['host_work_us_per_step']:.0f} us of the host's "
               f"all-reduce calls (net of the profiler; none where the host runs ahead of a busy GPU; the calls took "
               f"{w['host_calls_traced_us_per_step']:.0f} us per step as traced); the small ones take "
               f"{w['small_time_us_per_step']:.0f} us per step at ~{latency:.0f} us each, "
               f"{100 * (w['latency_bound_share'] or 0):.0f}% of the all-reduce time")
    return [make("per_param_allreduce", w["saving_us_per_step"] or 0.0, fired, ev, summary)]


def _sweep_algbw(sweep, nbytes: float, group: float) -> float | None:
    """The sweep's all_reduce algbw at ``nbytes`` in bytes/us (= MB/s), from its busbw and the bus factor."""
    from ..sweep import attainable

    bw = attainable(sweep, "all_reduce", nbytes)
    f = bus_factor("all_reduce", int(group)) if group else 1.0
    return bw * 1e3 / f if bw and f else None


rule(Rule(id="per_param_allreduce", title="many small all-reduces per step", extract=extract_per_param,
          judge=judge_per_param,
          order=10, cross_rank=True,
          cause=("Gradients are all-reduced one tensor at a time: every call pays the collective's fixed latency "
                 "(launch, NCCL's protocol handshake, a few us even for 4 bytes) and its host overhead, so dozens of "
                 "small tensors cost far more than the same bytes in a few large buffers."),
          fix=("Let DistributedDataParallel bucket the gradients (bucket_cap_mb, default 25 MB; its buckets also "
               "overlap with backward), or flatten them yourself (torch._utils._flatten_dense_tensors, or "
               "torch.distributed's all_reduce_coalesced) into a few all-reduces of >= 25 MB."),
          caveats=("The saving is estimated from the trace's own bandwidth at large sizes (or the sweep's) and the "
                   "host's time in the calls bucketing removes (net of the profiler in proportion: an estimate); not "
                   "the overlap with backward that DDP adds on top. Bucketing holds gradients until a bucket is full, and changes the reduction order "
                   "(bitwise results may differ). Small all-reduces of activations (tensor parallelism: each waits for "
                   "the layer before it) cannot be bucketed; the rule cannot tell them from gradients."),
          notebook="dataloader_sync"))
