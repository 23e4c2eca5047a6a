"""Communication across ranks: the rules that read a job's collectives.

* ``per_param_allreduce`` -- many small all-reduces per step, each paying the collective's latency;
* ``exposed_comm``        -- communication time during which no compute ran (what overlap would hide);
* ``late_rank``           -- the rank every other rank waits for at the collectives, and what it did before;
* ``comm_compute_contention`` -- NCCL kernels that run longer beside compute than alone at the same size;
* ``low_busbw``           -- traced busbw well below the same machine's sweep at the same size.

**What the per-rank phase keeps** (:func:`timeline`, one object per rank, a few KB to a few MB however large the
trace): the rank's collectives frame (:attr:`kit.traces.Trace.collectives`, one row per NCCL kernel or gloo op)
with, per row, the step it was launched in (by its launching runtime call, through the kernel's ``correlation``)
and the host time it was launched at; and the compute-kernel time inside the communication windows (the union
of non-NCCL kernels, cut to the union of NCCL kernels, per device). ``late_rank`` adds how much host time each
rank had spent waiting for data, blocked in synchronising calls or idle until each collective (:func:`activity`).
Everything that needs two ranks -- the same collective instance on every rank (:func:`by_step`,
:func:`kit.traces.comm.match_instances`), who arrived last, how long the others waited -- is done in the judges,
on these summaries.

**Waiting and transfer.** A collective's kernel starts when its rank reaches it and spins until every peer has
arrived, so on the early ranks it is long. Per instance, the shortest duration over ranks is the transfer
(``instance_min_us``); the rest of each rank's kernel is waiting (``wait_us``). The rules keep them apart:
``exposed_comm`` counts the transfer part of each kernel (its last ``instance_min_us``) that no compute hid,
``late_rank`` the waiting part -- so one microsecond is never blamed on two causes. ``per_param_allreduce``,
``comm_compute_contention`` and ``low_busbw`` time transfers, never waits.

**Per step.** With ``ProfilerStep#N`` annotations, a cost is the total over the kernels launched inside the
steps divided by the number of steps; without them the whole trace is one step (and the step time the traced
span: see :mod:`kit.doctor.model`).

Longer than the kit's ~400-line modules because the five rules share one cross-rank machinery (instances matched within ProfilerSteps, transfer vs waiting split, per-rank timelines); late_rank's attribution is the largest part and the candidate to split out next.
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...collective_ops import bus_factor
from ...traces.overlap import intersect
from ..model import Finding, RankView, Rule, Skip, rule

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

MiB = 1 << 20
SMALL_BYTES = 1 * MiB
"""all-reduces below this are latency-bound on any NVLink/InfiniBand link: their time is mostly fixed cost"""
BUCKET_BYTES = 25 * MiB
"""DDP's default ``bucket_cap_mb``: the size the bucketing estimate packs small gradients into"""
MANY_SMALL_PER_STEP = 8
"""small all-reduces per step from which ``per_param_allreduce`` speaks (DDP issues a handful of buckets)"""
LARGE_BYTES = 16 * MiB
"""all-reduces at or above this size give the trace's own bandwidth for the bucketing estimate"""
CONTENTION_RATIO = 1.2
"""overlapped / alone median duration from which a size counts as contended (run-to-run spread is ~5%)"""
OVERLAPPED_SHARE, ALONE_SHARE = 0.2, 0.02
"""a kernel is 'overlapped' when compute ran during >= 20% of it, 'alone' below 2%"""
LOW_BUSBW_RATIO = 0.5
"""traced busbw below this share of the sweep's at the same size is 'well below'"""
HOST_GAP_US = 200.0
"""a stretch without any CUDA runtime call longer than this is the host doing something else (sleep, Python)"""
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpy2D", "cudaMemcpyFromSymbol", "cudaMemcpyToSymbol", "cuStreamSynchronize",
              "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2")
"""host calls that block until the GPU (or a copy) is done"""
DATALOADER = "enumerate(DataLoader)"
"""the prefix of the annotation PyTorch puts around ``next(iter(loader))``"""
MIN_LATE, LATE_MIN_US, LATE_STEP_SHARE = 2, 20.0, 0.01
"""late_rank needs the rank to be last at 2+ collective instances by at least 20 us, 5% of the transfer and 1% of
the step: two ranks running the same step drift apart by less than that (0.4 ms in a 57 ms DDP step, 2xH200)"""
LATE_PATTERN = 0.10
"""... and materially late at this share of the matched instances or more: a rank late at 3 of 231 all-reduces
(the first one of each step, 2xH200 per-parameter example) is a once-per-step hiccup, not a late rank; the
planted late rank (a sleep before the step) is late at 21 of 33, collective_tracing's slow host at 22 of 25"""
LATE_EXPLAINED = 0.5
"""late_rank names a reason only when the rank's own excess over its peers (host activity, GPU still busy)
explains at least this share of the lateness it added; otherwise it says the lateness is not visible"""
LATE_DOMINANCE = 2 / 3
"""late_rank names a rank only when the waiting it caused is at least this share of all waiting for late ranks"""


# ------------------------------------------------------------------------------------------- intervals
def union_np(a, b) -> "tuple[np.ndarray, np.ndarray]":
    """Sorted disjoint intervals covering ``[a_i, b_i]`` (numpy; :func:`kit.traces.overlap.union` for lists)."""
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0:
        return a, b
    o = np.argsort(a, kind="stable")
    a, b = a[o], b[o]
    run_end = np.maximum.accumulate(b)
    new = np.r_[True, a[1:] > run_end[:-1]]
    idx = np.flatnonzero(new)
    ends = np.r_[idx[1:] - 1, a.size - 1]
    return a[idx], run_end[ends]


def covered(ua, ub, qa, qb) -> "np.ndarray":
    """For each query ``[qa_i, qb_i]``: how much of it the sorted disjoint intervals ``ua, ub`` cover."""
    import numpy as np

    qa, qb = np.asarray(qa, dtype=float), np.asarray(qb, dtype=float)
    if len(ua) == 0 or qa.size == 0:
        return np.zeros(qa.shape)
    cum = np.r_[0.0, np.cumsum(ub - ua)]

    def upto(x):
        i = np.searchsorted(ua, x, side="right") - 1
        ok = i >= 0
        j = np.clip(i, 0, None)
        part = np.clip(x - ua[j], 0.0, (ub - ua)[j])
        return np.where(ok, cum[j] + part, 0.0)

    return np.clip(upto(qb) - upto(qa), 0.0, None)


# ------------------------------------------------------------------------------------------- per rank
@dataclass(frozen=True)
class Timeline:
    """One rank's communication, as the judges need it (see the module docstring). Picklable and small."""

    rank: int
    backend: str
    """'nccl', 'gloo' or '' (no collective in the trace)"""
    rows: "pd.DataFrame"
    """:data:`kit.traces.comm.COLLECTIVE_COLUMNS` + ``step`` (NaN: launched outside every step), ``launch_us``
    (host time of the launching call; the op's start for gloo), ``end_us``, ``overlap_us`` (compute time
    during the kernel)"""
    compute: "pd.DataFrame"
    """``device, a, b``: compute-kernel time inside the communication windows (sorted, disjoint per device)"""
    steps: int
    """profiled steps on this rank (0: no ProfilerStep annotation)"""
    step_us: float | None
    gpu_kernels: int


_CACHE: list = []  # [(weakref to the Trace, Timeline)]: the rules of one rank share one Timeline


def timeline(view: RankView) -> Timeline:
    """The rank's :class:`Timeline` (computed once per trace, shared by the rules' extracts)."""
    if _CACHE and _CACHE[0][0]() is view.trace:
        return _CACHE[0][1]
    tl = _build_timeline(view)
    _CACHE[:] = [(weakref.ref(view.trace), tl)]
    return tl


def step_of(ts, steps: "pd.DataFrame") -> "np.ndarray":
    """The step number each host time falls in (``ProfilerStep#N`` windows), NaN outside every step."""
    import numpy as np

    ts = np.asarray(ts, dtype=float)
    if steps is None or steps.empty:
        return np.full(ts.shape, np.nan)
    st = steps.sort_values("ts")
    starts, ends, num = (st[c].to_numpy(dtype=float) for c in ("ts", "end", "step"))
    i = np.searchsorted(starts, ts, side="right") - 1
    j = np.clip(i, 0, None)
    return np.where((i >= 0) & (ts < ends[j]), num[j], np.nan)


def _build_timeline(view: RankView) -> Timeline:
    import numpy as np
    import pandas as pd

    t = view.trace
    rows = t.collectives.copy()
    gpu = t.gpu
    kernels = gpu[gpu["cat"] == "kernel"]
    comp_cols = ["device", "a", "b"]
    if rows.empty:
        return Timeline(view.rank, "", rows.assign(step=[], launch_us=[], end_us=[], overlap_us=[]),
                        pd.DataFrame(columns=comp_cols), len(view.steps), view.step_us, len(kernels))
    rows["rank"] = view.rank
    rows["end_us"] = rows["start_us"] + rows["dur_us"]
    for c in ("trace", "kernel", "dtype", "pg_desc"):  # a few distinct strings, repeated: keep the summary small
        rows[c] = rows[c].astype("category")
    launch = rows["start_us"].to_numpy(dtype=float).copy()
    known = np.ones(len(rows), dtype=bool)
    nccl_mask = (rows["backend"] == "nccl").to_numpy()
    if nccl_mask.any():  # the launching runtime call, through the kernel's correlation id
        nk = gpu[gpu["nccl"]]
        corr = dict(zip(zip(nk["device"].astype(str), nk["stream"].astype(str), nk["ts"]), nk["correlation"]))
        calls = t.cpu[t.cpu["cat"].isin(["cuda_runtime", "cuda_driver"]) & t.cpu["correlation"].notna()]
        at = dict(zip(calls["correlation"], calls["ts"]))
        n = rows[nccl_mask]
        launch_n = np.array([at.get(corr.get(k), np.nan) for k in zip(n["device"].astype(str), n["stream"].astype(str),
                                                                       n["start_us"])], dtype=float)
        known[nccl_mask] = ~np.isnan(launch_n)
        launch[nccl_mask] = np.where(known[nccl_mask], launch_n, n["start_us"].to_numpy(dtype=float))
    rows["launch_us"] = launch
    # a kernel whose launch is not in the trace was launched before the profiled window (a GPU running behind
    # its host): it belongs to no profiled step
    rows["step"] = np.where(known, step_of(launch, view.steps), np.nan)
    # compute kernels inside the communication windows, per device
    comp, overlap = [], np.zeros(len(rows))
    for dev, d in kernels.groupby("device", sort=True):
        nc = d[d["nccl"]]
        if nc.empty:
            continue
        ua, ub = union_np(nc["ts"], nc["end"])
        ca, cb = union_np(d.loc[~d["nccl"], "ts"], d.loc[~d["nccl"], "end"])
        # compute cut to the communication windows: all the judges ever ask about
        cut = intersect(list(zip(ua, ub)), list(zip(ca, cb)))
        ca, cb = (np.array([x[0] for x in cut], dtype=float), np.array([x[1] for x in cut], dtype=float))
        comp.append(pd.DataFrame({"device": dev, "a": ca, "b": cb}))
        sel = (rows["device"].astype(str) == str(dev)).to_numpy() & nccl_mask
        overlap[sel] = covered(ca, cb, rows.loc[sel, "start_us"], rows.loc[sel, "end_us"])
    rows["overlap_us"] = overlap
    compute = pd.concat(comp, ignore_index=True) if comp else pd.DataFrame(columns=comp_cols)
    backend = "nccl" if nccl_mask.any() else "gloo"
    return Timeline(view.rank, backend, rows.reset_index(drop=True), compute, len(view.steps), view.step_us,
                    len(kernels))


def matched(summaries: list[tuple[int, Timeline]]) -> "pd.DataFrame":
    """Every rank's rows matched across ranks (:func:`kit.traces.comm.match_instances`: ``instance``,
    ``instance_min_us``, ``ranks_seen``, ``wait_us``; 0 with one rank), with the Timeline's own columns."""
    import pandas as pd

    from ...traces.comm import match_instances

    # the judge's rank, not the trace's: a trace without distributedInfo gets its rank from the job check
    rows = [tl.rows.assign(rank=rk) for rk, tl in summaries if len(tl.rows)]
    if rows and all(tl.steps for _, tl in summaries):
        rows = by_step(rows)
    if not rows:  # nothing (inside the steps): the columns, no rows
        return pd.concat([tl.rows for _, tl in summaries], ignore_index=True).iloc[0:0].assign(
            match_key=[], instance=[], instance_min_us=[], ranks_seen=[], wait_us=[])
    m = match_instances(rows)
    m["process_group"] = m["process_group"].map(lambda pg: pg.split(STEP_TAG)[0] if isinstance(pg, str) else pg)
    rows = pd.concat(rows, ignore_index=True)
    extra = [c for c in rows.columns if c not in m.columns]
    m = m.merge(rows[["rank", "stream", "start_us"] + extra], on=["rank", "stream", "start_us"], how="left")
    m["wait_us"] = m["wait_us"].fillna(0.0)
    return m


STEP_TAG = "#step"


def by_step(frames: list["pd.DataFrame"]) -> list["pd.DataFrame"]:
    """The rows launched inside a profiled step, with the step put into the process group, so that
    :func:`kit.traces.comm.match_instances` pairs the k-th collective *of the same step* on every rank.

    Matching by order alone assumes every rank's trace begins at the same collective. A profiled window does not
    quite: the GPU of a rank that runs behind its host still executes the previous step's collectives inside the
    window, and how many differs between ranks -- k-th by k-th, every later pair would be two different
    collectives. The steps are the same on every rank (one schedule), so pairing within a step is exact. Step
    numbers are used when the ranks share them, else each rank's steps in order."""
    import numpy as np

    frames = [f[f["step"].notna()] for f in frames]
    frames = [f for f in frames if len(f)]
    nums = [set(f["step"].astype(int)) for f in frames]
    shared = bool(nums) and bool(set.intersection(*nums))
    out = []
    for f in frames:
        step = f["step"].astype(int)
        if not shared:
            step = step.map({s: i for i, s in enumerate(sorted(set(step)))})
        pg = np.where(f["process_group"].isna(), "", f["process_group"].astype(str))
        out.append(f.assign(process_group=[f"{p}{STEP_TAG}{s}" for p, s in zip(pg, step)]))
    return out


def per_step_divisor(tl: Timeline) -> int:
    return tl.steps if tl.steps else 1


def in_steps(rows: "pd.DataFrame", tl: Timeline) -> "pd.DataFrame":
    """The rows launched inside a profiled step (all rows when the trace has no steps)."""
    return rows[rows["step"].notna()] if tl.steps else rows


def collected(summaries: list[tuple[int, Timeline]], backend: str | None = None) -> "pd.DataFrame | None":
    """Every rank's rows matched across ranks (:func:`matched`), only ``backend``'s when given; None when there is
    no such collective at all (the rule was checked and has nothing to look at)."""
    if _no_collectives(summaries):
        return None
    df = matched(summaries)
    if backend is not None:
        df = df[df["backend"] == backend]
    return None if df.empty else df


def _no_collectives(summaries: list[tuple[int, Timeline]]) -> bool:
    return all(tl.rows.empty for _, tl in summaries)


def _gloo_only(summaries: list[tuple[int, Timeline]]) -> bool:
    return all(tl.backend in ("gloo", "") for _, tl in summaries) and not _no_collectives(summaries)


def _r(x: float | None, nd: int = 1) -> float | None:
    """A plain, rounded float for evidence (None for NaN/None)."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else round(x, nd)


def _excerpt(rank: int, a: float, b: float, ranks=None, pad: float = 0.15) -> dict[str, Any]:
    """Where the notebook's timeline excerpt looks (times on ``rank``'s clock, us)."""
    w = max(b - a, 1.0)
    return {"rank": int(rank), "ranks": [int(r) for r in (ranks or [rank])], "t0_us": float(a - pad * w),
            "t1_us": float(b + pad * w)}


def _size(b: float) -> str:
    """'25 MiB', '6.8 KiB', '4 B' (three significant digits)."""
    for unit, div in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"


# ------------------------------------------------------------------------------------------- per_param_allreduce
def extract_timeline(view: RankView) -> Timeline | Skip:
    return timeline(view)


def judge_per_param(summaries: list[tuple[int, Timeline]], ctx) -> list[Finding] | Skip:
    import numpy as np

    df = collected(summaries)
    ar = df[df["collective"] == "all_reduce"] if df is not None else None
    if ar is None or ar.empty:
        return []
    if ar["bytes"].isna().all():
        return Skip("per_param_allreduce", "the all-reduces carry no collective metadata (bytes unknown: torch < "
                                           "2.3 or a trace without record_shapes?); sizes cannot be judged")
    ar = ar[ar["bytes"].notna()]
    tl_of = dict(summaries)
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
        g = in_steps(g, tl)
        n = per_step_divisor(tl)
        small = g[g["bytes"] < SMALL_BYTES]
        sub = g[g["bytes"] < BUCKET_BYTES]
        actual = float(sub["t_us"].sum()) / n
        sub_bytes = float(sub["bytes"].sum()) / n
        buckets = math.ceil(sub_bytes / BUCKET_BYTES) if sub_bytes else 0
        bucketed = buckets * latency + sub_bytes / algbw if algbw > 0 else actual
        ev = {"all_reduces_per_step": _r(len(g) / n), "small_per_step": _r(len(small) / n),
              "time_us_per_step": _r(g["t_us"].sum() / n), "small_time_us_per_step": _r(small["t_us"].sum() / n),
              "latency_bound_share": _r(small["t_us"].sum() / g["t_us"].sum(), 3) if g["t_us"].sum() else None,
              "bytes_p10": _r(np.percentile(g["bytes"], 10), 0) if len(g) else None,
              "bytes_p50": _r(np.median(g["bytes"]), 0) if len(g) else None,
              "bytes_p90": _r(np.percentile(g["bytes"], 90), 0) if len(g) else None,
              "below_bucket_us_per_step": _r(actual), "bucketed_estimate_us_per_step": _r(bucketed),
              "saving_us_per_step": _r(max(actual - bucketed, 0.0))}
        per_rank[str(int(rank))] = ev
        if len(small) / n >= MANY_SMALL_PER_STEP:
            fired.append(int(rank))
    if not fired:
        return []
    worst = max(fired, key=lambda r: per_rank[str(r)]["saving_us_per_step"] or 0.0)
    w = per_rank[str(worst)]
    g0 = in_steps(ar[(ar["rank"] == worst) & (ar["bytes"] < SMALL_BYTES)], tl_of[worst]).sort_values("start_us")
    first_step = g0[g0["step"] == g0["step"].min()] if tl_of[worst].steps else g0
    first_step = first_step.iloc[:2 * MANY_SMALL_PER_STEP]  # a run of them, readable on a timeline
    ev = {**w, "latency_us": _r(latency, 2), "reference_algbw_gbps": _r(algbw / 1e3, 1),
          "reference_source": bw_source, "bucket_bytes": BUCKET_BYTES, "small_bytes": SMALL_BYTES,
          "per_rank": per_rank,
          "excerpt": _excerpt(worst, float(first_step["start_us"].min()), float(first_step["end_us"].max()))}
    summary = (f"{w['all_reduces_per_step']:g} all-reduces per step, {w['small_per_step']:g} of them below "
               f"{_size(SMALL_BYTES)} (median {_size(w['bytes_p50'])}): {w['small_time_us_per_step']:.0f} us per "
               f"step at ~{latency:.0f} us each, {100 * (w['latency_bound_share'] or 0):.0f}% of the all-reduce "
               f"time; {_size(BUCKET_BYTES)} buckets would take ~{w['bucketed_estimate_us_per_step']:.0f} us instead "
               f"of {w['below_bucket_us_per_step']:.0f} us")
    return finding("per_param_allreduce", w["saving_us_per_step"] or 0.0, fired, ev, summary)


def _sweep_algbw(sweep, nbytes: float, group: float) -> float | None:
    """The sweep's all_reduce algbw at ``nbytes`` in bytes/us (= MB/s), from its busbw and the bus factor."""
    from ..sweep import attainable

    bw = attainable(sweep, "all_reduce", nbytes)
    f = bus_factor("all_reduce", int(group)) if group else 1.0
    return bw * 1e3 / f if bw and f else None


# ------------------------------------------------------------------------------------------- exposed_comm
def gpu_extract(rule_id: str):
    """The extract of a rule that needs collectives on GPU kernels: the Timeline, or a Skip saying why not."""

    def extract(view: RankView) -> Timeline | Skip:
        tl = timeline(view)
        if tl.gpu_kernels == 0:
            return Skip(rule_id, "gloo collectives run on CPU threads and the trace has no GPU kernels: nothing to "
                                 "overlap" if tl.backend == "gloo" else
                                 "no GPU kernels in the trace (was it recorded with ProfilerActivity.CUDA?)")
        return tl

    extract.__name__ = f"extract_{rule_id}"
    return extract


def _windows(df: "pd.DataFrame", part: str) -> "tuple[np.ndarray, np.ndarray]":
    """Per kernel, its ``transfer`` part (the last instance_min_us) or its ``wait`` part (the rest)."""
    import numpy as np

    start, end = df["start_us"].to_numpy(dtype=float), df["end_us"].to_numpy(dtype=float)
    t = df["instance_min_us"].to_numpy(dtype=float)
    t = np.where(np.isnan(t), end - start, np.minimum(t, end - start))
    return (end - t, end) if part == "transfer" else (start, end - t)


def exposed_parts(df: "pd.DataFrame", tl_of: dict[int, Timeline]) -> "pd.DataFrame":
    """``df`` with, per row, ``exposed_transfer_us`` and ``exposed_wait_us``: the transfer and waiting parts of
    the kernel (:func:`_windows`) during which no compute kernel ran on its GPU. A gloo op blocks its CPU thread
    for all of it: nothing hides it."""
    import numpy as np

    t, w = _windows(df, "transfer"), _windows(df, "wait")
    df = df.assign(exposed_transfer_us=t[1] - t[0], exposed_wait_us=np.clip(w[1] - w[0], 0, None))
    nccl = df[df["backend"] == "nccl"]
    for (rank, dev), d in nccl.groupby([nccl["rank"], nccl["device"].astype(str)]):
        c = tl_of[int(rank)].compute
        c = c[c["device"].astype(str) == dev]
        ca, cb = c["a"].to_numpy(dtype=float), c["b"].to_numpy(dtype=float)
        for part in ("transfer", "wait"):
            a, b = _windows(d, part)
            df.loc[d.index, f"exposed_{part}_us"] = np.clip((b - a) - covered(ca, cb, a, b), 0, None)
    return df


def judge_exposed(summaries, ctx) -> list[Finding] | Skip:
    tl_of = dict(summaries)
    df = collected(summaries, "nccl")
    if df is None:
        return []
    df = exposed_parts(df, tl_of)
    steps = any(tl.steps for tl in tl_of.values())
    df = df[df["step"].notna()] if steps else df
    n = max(per_step_divisor(tl) for tl in tl_of.values())
    multi = bool(df["ranks_seen"].max() > 1)
    per_rank = {}
    for rank, tl in summaries:
        d = df[df["rank"] == rank]
        a, b = _windows(d, "transfer")
        tr, ex = float((b - a).sum()) / n, float(d["exposed_transfer_us"].sum()) / n
        per_rank[str(rank)] = {"comm_us_per_step": _r(d["dur_us"].sum() / n), "transfer_us_per_step": _r(tr),
                               "exposed_transfer_us_per_step": _r(ex),
                               "exposed_wait_us_per_step": _r(d["exposed_wait_us"].sum() / n),
                               "hidden_share": _r(1 - ex / tr, 3) if tr else None}
    # the job's cost: per collective instance, the exposure on the rank that arrived last (the others were
    # waiting for it anyway); collectives seen on one rank only (point-to-point) count on their own rank
    m = df[df["ranks_seen"] > 1]
    last = m.loc[m.groupby(["match_key", "instance"])["dur_us"].idxmin()] if len(m) else m
    single = df[df["ranks_seen"] <= 1].groupby("rank")["exposed_transfer_us"].sum()
    cost = (float(last["exposed_transfer_us"].sum()) + float(single.max() if len(single) else 0.0)) / n
    if cost <= 0:
        return []
    worst = int(max(per_rank, key=lambda r: per_rank[r]["exposed_transfer_us_per_step"] or 0.0))
    d = df[df["rank"] == worst]
    step_d = d[d["step"] == d["step"].min()] if steps else d
    w = per_rank[str(worst)]
    ev = {"exposed_us_per_step": _r(cost), "rank": worst, **w, "per_rank": per_rank, "matched_across_ranks": multi,
          "excerpt": _excerpt(worst, float(step_d["start_us"].min()), float(step_d["end_us"].max()))}
    summary = (f"{cost:.0f} us per step of communication ran with no compute beside it on the rank that arrived "
               f"last; rank {worst} hid {100 * (w['hidden_share'] or 0):.0f}% of its "
               f"{w['transfer_us_per_step']:.0f} us "
               f"of transfers per step"
               + ("" if multi else " (one rank only: waiting for peers is not separated from the transfer)"))
    ranks = tuple(sorted(int(r) for r, v in per_rank.items() if (v["exposed_transfer_us_per_step"] or 0) > 0))
    return finding("exposed_comm", cost, ranks, ev, summary)


# ------------------------------------------------------------------------------------------- late_rank
HOST = ("data_wait", "host_sync", "host_idle")
"""the host activities :func:`activity` counts (the rest of the host time is ``host_busy``)"""


@dataclass(frozen=True)
class Before:
    """A :class:`Timeline` and, per collective row, the rank's cumulative host time in each of :data:`HOST` at
    the row's launch and at its end (:func:`activity`)."""

    tl: Timeline
    cum: "pd.DataFrame"
    """same index as ``tl.rows``: ``<activity>@launch`` and ``<activity>@end`` (us since the trace began)"""
    kernels: "pd.DataFrame | None" = None
    """the rank's heaviest compute kernels (:data:`KERNEL_TOP` by total time): per name ``median_us`` and
    ``total_us`` (:func:`kernel_speeds`) -- to tell a slower GPU from more work"""


KERNEL_TOP = 20
"""late_rank compares the late rank's GPU with the others' on its 20 heaviest compute kernels (by total time):
enough to cover most of a step's compute, few enough to travel with the summary"""
SLOW_GPU = 0.02
"""the same kernels >= 2% slower (time-weighted geometric mean of median ratios) = the late rank's GPU is slower
at the same work. Between the two H200s of the example job's runs (recorded/doctor/h200x2-20261123) the ratio
was within +-0.9% in 5 of 10 runs (clean, tiny-kernels, contention, both graph cases), and rank 0 was 2.6-8.3%
slower in the others (item, pageable, p2p-disabled, h2d-on-compute-stream, per-param-allreduce): a difference
of that machine from run to run, which the doctor then names (see that folder's README)"""


def kernel_speeds(view: RankView) -> "pd.DataFrame | None":
    """Median and total duration per compute-kernel name (NCCL kernels and copies left out), the heaviest
    :data:`KERNEL_TOP`; None when the trace has no compute kernel."""
    g = view.trace.gpu
    k = g[(g["cat"] == "kernel") & ~g["nccl"].astype(bool)] if not g.empty else g
    if k.empty:
        return None
    agg = k.groupby(k["name"].astype(str), observed=True)["dur"].agg(median_us="median", total_us="sum")
    return agg.nlargest(KERNEL_TOP, "total_us")


def gpu_speed(late: int, kernels: dict[int, "pd.DataFrame | None"]) -> float | None:
    """How much slower the late rank ran the same compute kernels than the other ranks: the geometric mean,
    weighted by the late rank's time in each kernel, of (its median) / (the other ranks' median of medians),
    minus 1. None when fewer than 3 kernel names are shared."""
    import numpy as np

    mine = kernels.get(late)
    others = [k["median_us"] for r, k in kernels.items() if r != late and k is not None]
    if mine is None or not others:
        return None
    import pandas as pd

    ref = pd.concat(others, axis=1).median(axis=1)
    both = mine.join(ref.rename("ref"), how="inner")
    both = both[(both["ref"] > 0) & (both["median_us"] > 0)]
    if len(both) < 3:
        return None
    w = both["total_us"] / both["total_us"].sum()
    return float(np.exp((w * np.log(both["median_us"] / both["ref"])).sum()) - 1)


def activity(view: RankView, tl: Timeline) -> "pd.DataFrame":
    """Per collective row, how much host time the rank had spent, from the trace's start until the row's launch,
    until its end and until the start of its step (``step_ts``), in

    * ``data_wait`` -- ``enumerate(DataLoader)`` annotations (the host waiting for the next batch);
    * ``host_sync`` -- synchronising calls (:data:`SYNC_CALLS`);
    * ``host_idle`` -- stretches over :data:`HOST_GAP_US` without any CUDA call, outside DataLoader waits
      (``time.sleep``, Python work, a blocked GIL).

    Differences between two moments give the activity in between (:func:`arrival_parts`)."""
    import numpy as np
    import pandas as pd

    rows = tl.rows
    moments = ("launch", "end", "step")
    cols = ["step_ts"] + [f"{c}@{w}" for c in HOST for w in moments]
    if rows.empty:
        return pd.DataFrame(columns=cols, index=rows.index, dtype=float)
    cpu = view.trace.cpu
    names = cpu["name"].astype(str)
    data = cpu[(cpu["cat"] == "user_annotation") & names.str.startswith(DATALOADER)]
    calls = cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"])]
    sync = calls[names[calls.index].isin(SYNC_CALLS)]
    ca, cb = union_np(calls["ts"], calls["end"])
    keep = (ca[1:] - cb[:-1]) > HOST_GAP_US
    iv = {"data_wait": union_np(data["ts"], data["end"]), "host_sync": union_np(sync["ts"], sync["end"]),
          "gap": (cb[:-1][keep], ca[1:][keep])}
    both = intersect(list(zip(*iv["gap"])), list(zip(*iv["data_wait"])))
    iv["gap_in_data"] = union_np([x for x, _ in both], [y for _, y in both])
    step_ts = rows["step"].map(dict(zip(view.steps["step"], view.steps["ts"]))).to_numpy(dtype=float)
    out = {"step_ts": step_ts}
    for w, t in (("launch", rows["launch_us"].to_numpy(dtype=float)), ("end", rows["end_us"].to_numpy(dtype=float)),
                 ("step", np.nan_to_num(step_ts, nan=-np.inf))):
        lo = np.full(t.shape, -np.inf)
        c = {k: covered(*v, lo, t) for k, v in iv.items()}
        out[f"data_wait@{w}"], out[f"host_sync@{w}"] = c["data_wait"], c["host_sync"]
        out[f"host_idle@{w}"] = np.clip(c["gap"] - c["gap_in_data"], 0, None)
    return pd.DataFrame(out, index=rows.index)[cols]


def extract_late(view: RankView) -> Before:
    tl = timeline(view)
    return Before(tl, activity(view, tl), kernel_speeds(view))


REASONS = ("data_wait", "host_sync", "host_idle", "host_busy", "gpu_busy")
REASON_TEXT = {"data_wait": "waiting for its DataLoader", "host_sync": "blocked in synchronising calls",
               "host_idle": "on the host without issuing any GPU work", "host_busy": "issuing work more slowly on "
               "the host", "gpu_busy": "with its GPU still busy (longer compute) when it launched the collective"}


def arrival_parts(row: dict, origin: dict) -> dict:
    """How a rank got from ``origin`` (the end of an earlier collective every rank ran: the same moment on all
    ranks) to the start of ``row``'s kernel: host time until the launch split into :data:`HOST` and
    ``host_busy`` (the rest: issuing work), then ``gpu_busy`` (launched, but the GPU was still busy with earlier
    work). The parts add up to ``row.start - origin.end``, so their difference between two ranks adds up to how
    much later one arrived. Values may be numpy arrays (one entry per instance)."""
    import numpy as np

    o_end, launch, start = origin["end_us"], row["launch_us"], row["start_us"]
    host_end = np.maximum(launch, o_end)
    after = launch > o_end
    parts = {c: np.where(after, np.clip(row[f"{c}@launch"] - origin[f"{c}@end"], 0, None), 0.0) for c in HOST}
    parts["host_busy"] = np.clip(host_end - o_end - sum(parts.values()), 0, None)
    parts["gpu_busy"] = np.clip(start - host_end, 0, None)
    return parts


def attribute(df: "pd.DataFrame", inst: "pd.DataFrame", late: int) -> tuple[dict[str, float], int]:
    """Why ``late`` arrived last, per reason (us, summed over the collectives it was last at).

    Lateness carries over: a rank that started a step late arrives late at every collective of that step, and
    between two of them it is the one still computing -- that compute is the consequence, not the cause. So each
    instance contributes only the lateness it *adds* (its lateness minus this rank's lateness at the previous
    instance), explained by how each rank got from that previous instance's end (the same moment on every rank)
    to this one (:func:`arrival_parts`): the late rank's parts minus the other ranks' median parts. The first
    instance of a trace is counted from each rank's start of its step instead. Returns the excess per reason and
    how many instances added lateness that could be explained."""
    import numpy as np

    cols = ["launch_us", "start_us", "end_us", "step_ts"] + [f"{c}@{w}" for c in HOST
                                                              for w in ("launch", "end", "step")]
    wide = df.set_index(["match_key", "instance", "rank"])[cols].unstack("rank")
    inst = inst.set_index(["match_key", "instance"]).reindex(wide.index)
    t = wide[("end_us", late)].to_numpy(dtype=float)  # order on the late rank's own clock
    keep = ~np.isnan(t)
    wide, inst = wide[keep], inst[keep]
    order = np.argsort(t[keep], kind="stable")
    wide, inst = wide.iloc[order], inst.iloc[order]
    late_by = inst["late_by_us"].to_numpy(dtype=float)
    mine = inst["rank"].to_numpy() == late
    prev_late = np.r_[0.0, np.where(mine, late_by, 0.0)[:-1]]
    added = np.where(mine, np.clip(late_by - prev_late, 0, None), 0.0)
    total = {c: 0.0 for c in REASONS}
    k = np.flatnonzero(added > 0)
    if k.size == 0:
        return total, 0
    ranks = list(wide["end_us"].columns)

    def row(i, r):
        return {c: wide[(c, r)].to_numpy(dtype=float)[i] for c in cols}

    def origin(i, r):  # the previous instance's end, or (for the first) the rank's step start
        prev, here = row(np.clip(i - 1, 0, None), r), row(i, r)
        first = i == 0
        o = {"end_us": np.where(first, here["step_ts"], prev["end_us"])}
        o.update({f"{c}@end": np.where(first, here[f"{c}@step"], prev[f"{c}@end"]) for c in HOST})
        return o

    parts = {r: arrival_parts(row(k, r), origin(k, r)) for r in ranks}
    with warnings.catch_warnings():  # an instance some rank did not see: NaN, left out
        warnings.simplefilter("ignore", RuntimeWarning)
        ex = {c: parts[late][c] - np.nanmedian(np.vstack([parts[r][c] for r in ranks if r != late]), axis=0)
              for c in REASONS}
    pos = np.nansum(np.vstack([np.clip(ex[c], 0, None) for c in REASONS]), axis=0)
    ok = pos > 0
    # each instance's added lateness is explained only as far as the rank's own excess over its peers reaches:
    # a 56 us excess does not explain 9 ms of lateness (the rest stays unexplained, not shared out)
    expl = np.minimum(pos, added[k])
    for c in REASONS:
        total[c] = float(np.nansum(expl[ok] * np.clip(ex[c][ok], 0, None) / pos[ok]))
    total["_added"] = float(np.nansum(added[k]))
    return total, int(ok.sum())


def judge_late(summaries: list[tuple[int, Before]], ctx) -> list[Finding] | Skip:
    import numpy as np
    import pandas as pd

    tls = [(r, b.tl) for r, b in summaries]
    df = collected(tls)
    if df is None:
        return []
    cum = pd.concat([b.tl.rows[["stream", "start_us"]].assign(rank=r).join(b.cum) for r, b in summaries
                     if len(b.tl.rows)], ignore_index=True)
    df = df.merge(cum, on=["rank", "stream", "start_us"], how="left")
    df = df[df["ranks_seen"] > 1]
    if df.empty:
        return Skip("late_rank", "no collective instance was found on 2+ ranks (different process groups, or "
                                 "traces of different windows of the job)")
    tl_of = dict(tls)
    df = exposed_parts(df, tl_of)  # per kernel, the waiting part that no compute hid
    keys = ["match_key", "instance"]
    last = df.loc[df.groupby(keys)["dur_us"].idxmin()]
    inst = last[keys + ["rank", "start_us", "end_us"]].assign(
        rank=last["rank"].astype(int), dur_min_us=last["dur_us"].to_numpy(dtype=float))
    inst = inst.merge(df.groupby(keys)["wait_us"].max().rename("late_by_us").reset_index(), on=keys)
    # what the last rank alone cost: how much later it arrived than the next-latest rank (the smallest wait of the
    # other ranks); the rest of the others' waiting was for the next-latest one too
    lead = df[df["wait_us"] > 0].groupby(keys)["wait_us"].min().rename("lead_us").reset_index()
    inst = inst.merge(lead, on=keys, how="left").fillna({"lead_us": 0.0})
    # late enough to be more than jitter: LATE_MIN_US, 5% of the transfer, LATE_STEP_SHARE of the step
    floor = np.maximum(np.maximum(LATE_MIN_US, 0.05 * inst["dur_min_us"]), LATE_STEP_SHARE * (ctx.step_us or 0.0))
    inst["material"] = inst["lead_us"] >= floor
    # what each rank's lateness cost the others: their exposed waiting at the instances it was materially last at
    if any(tl.steps for tl in tl_of.values()):
        df = df.assign(exposed_wait_us=df["exposed_wait_us"].where(df["step"].notna(), 0.0))
    df = df.merge(inst[keys + ["lead_us"]], on=keys, how="left")
    df["charged_us"] = np.minimum(df["exposed_wait_us"], df["lead_us"].fillna(0.0))
    waits = df.pivot_table(index=keys, columns="rank", values="charged_us", aggfunc="sum", fill_value=0.0)
    inst = inst.join(waits, on=keys)
    cost_of = {}
    for rank, g in inst[inst["material"]].groupby("rank"):
        cost_of[int(rank)] = max((float(g[r].sum()) / per_step_divisor(tl_of[int(r)]) for r in waits.columns
                                  if int(r) != int(rank)), default=0.0)
    total = sum(cost_of.values())
    if total <= 0:
        return []
    late = max(cost_of, key=cost_of.get)
    cost = cost_of[late]
    if cost < LATE_DOMINANCE * total:  # ranks take turns arriving last: jitter, not one late rank
        return []
    mine = inst[inst["rank"] == late]
    if mine["material"].sum() < max(MIN_LATE, LATE_PATTERN * len(inst)):
        return []  # late once or rarely (e.g. the first collective after start-up): no pattern
    excess, explained = attribute(df, inst, late)
    added = excess.pop("_added", 0.0)
    seen = sum(excess.values())
    visible = added > 0 and seen >= LATE_EXPLAINED * added
    reason = max(excess, key=excess.get) if explained and visible and max(excess.values()) > 0 else None
    n = per_step_divisor(tl_of[late])
    late_at = mine[mine["material"]]
    worst = late_at.loc[late_at["late_by_us"].idxmax()]
    ev = {"late_rank": late, "last_at": len(mine), "late_at": len(late_at), "instances": len(inst),
          "late_floor_us": _r(float(floor.min())), "late_by_us_median": _r(late_at["late_by_us"].median()),
          "late_by_us_max": _r(late_at["late_by_us"].max()), "others_wait_us_per_step": _r(cost),
          "after_next_latest_us_median": _r(late_at["lead_us"].median()),
          "cost_by_late_rank": {str(r): _r(v) for r, v in cost_of.items()}, "reason": reason,
          "explained_instances": explained, "reason_us_per_step": {c: _r(v / n) for c, v in excess.items()},
          "excerpt": _excerpt(late, float(worst["start_us"]) - 2 * float(worst["late_by_us"]), float(worst["end_us"]),
                              ranks=sorted(tl_of))}
    slower = gpu_speed(late, {r: b.kernels for r, b in summaries})
    ev["same_kernels_slower_pct"] = _r(100 * slower) if slower is not None else None
    ev["lateness_explained_share"] = _r(seen / added, 3) if added > 0 else None
    why = (f"; {REASON_TEXT[reason]} ({100 * excess[reason] / added:.0f}% of its lateness)" if reason else
           f"; what made it late is not visible in the trace (its own activity explains "
           f"{100 * seen / added if added else 0:.0f}% of its lateness: it may have begun before the traced "
           f"window, or lie in work the trace does not record)")
    if reason == "gpu_busy" and slower is not None:
        reason = "gpu_slow" if slower >= SLOW_GPU else reason
        why += (f": its GPU ran the same kernels {100 * slower:.1f}% slower than the other ranks' (its "
                f"{KERNEL_TOP} heaviest, median durations) -- the same work taking longer on that GPU (its "
                f"clocks, power or thermal limits, or other work on it), not more work" if slower >= SLOW_GPU
                else f": its GPU ran the same kernels at the others' speed ({100 * slower:+.1f}%) -- more work")
    ev["reason"] = reason
    summary = (f"rank {late} arrived last, by more than {ev['late_floor_us']:.0f} us, at {len(late_at)} of "
               f"{len(inst)} collectives (median {ev['late_by_us_median']:.0f} us, max {ev['late_by_us_max']:.0f} "
               f"us after the first rank; median {ev['after_next_latest_us_median']:.0f} us after the next-latest)"
               f"{why}; the other ranks waited {cost:.0f} us per step for it alone with nothing else to do")
    fix = TEXT["late_rank"]["fix"]
    return finding("late_rank", cost, [late], ev, summary, fix=f"{FIX_BY_REASON[reason]} {fix}"
                   if reason else None)


# ------------------------------------------------------------------------------------------- comm_compute_contention
def judge_contention(summaries: list[tuple[int, Timeline]], ctx) -> list[Finding] | Skip:
    import numpy as np

    df = collected(summaries, "nccl")
    if df is None:
        return []
    tl_of = dict(summaries)
    # transfer-only kernels: the rank that arrived last (its kernel waited for no one), or unmatched kernels
    pure = df[(df["ranks_seen"] <= 1) | (df["wait_us"] <= np.maximum(2.0, 0.05 * df["dur_us"]))].copy()
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
            extra[int(rank)] = float((in_steps(gr, tl)["dur_us"] - ma).clip(lower=0).sum()) / per_step_divisor(tl)
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
    ev = {"sizes": [{k: (_r(v, 3) if isinstance(v, float) else v) for k, v in o.items()
                     if k not in ("extra", "example")}
                    for o in out],
          "extra_us_per_step": {str(r): _r(v) for r, v in per_rank.items()},
          "ratio_max": _r(top["ratio"], 3), "excerpt": _excerpt(int(ex["rank"]), float(ex["start_us"]),
                                                                float(ex["end_us"]))}
    what = top["collective"] + (f" of {_size(top['bytes'])}" if top["bytes"] else "")
    summary = (f"{what} took {top['overlapped_us_p50']:.0f} us (median of {top['overlapped']}) beside compute "
               f"against {top['alone_us_p50']:.0f} us alone ({top['ratio']:.2f}x); the stretch costs rank {worst} "
               f"{cost:.0f} us of communication per step")
    return finding("comm_compute_contention", cost, ranks, ev, summary)


# ------------------------------------------------------------------------------------------- low_busbw
def judge_low_busbw(summaries: list[tuple[int, Timeline]], ctx) -> list[Finding] | Skip:
    from ...traces import summary as comm_summary
    from ..sweep import attainable

    if _gloo_only(summaries):
        return Skip("low_busbw", "no NCCL collective in the traces, only gloo ops: a sweep measures NCCL kernels")
    df = collected(summaries, "nccl")
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
                outside.append(f"{r.collective} {_size(r.bytes)}")
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
    ev = {"sizes": [{k: (_r(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in low],
          "checked_sizes": len(rows), **notes, "sweep_source": sorted(set(ctx.sweep["source"].astype(str))),
          "excerpt": _excerpt(int(ex["rank"]), float(ex["start_us"]), float(ex["end_us"]))}
    summary = (f"{len(low)} of {len(rows)} traced (collective, size) pairs reach under "
               f"{100 * LOW_BUSBW_RATIO:.0f}% of the sweep's busbw; worst: {top['collective']} of "
               f"{_size(top['bytes'])} at {top['busbw_gbps']:.1f} GB/s against {top['sweep_busbw_gbps']:.1f} GB/s "
               f"({100 * top['ratio']:.0f}%)")
    return finding("low_busbw", cost, sorted(tl_of), ev, summary)


# ------------------------------------------------------------------------------------------- what the rules say
TEXT: dict[str, dict[str, str]] = {
    "per_param_allreduce": dict(
        cause="Gradients are all-reduced one tensor at a time: every call pays the collective's fixed latency "
              "(launch, NCCL's protocol handshake, a few us even for 4 bytes) and its host overhead, so dozens of "
              "small tensors cost far more than the same bytes in a few large buffers.",
        fix="Let DistributedDataParallel bucket the gradients (bucket_cap_mb, default 25 MB; its buckets also "
            "overlap with backward), or flatten them yourself (torch._utils._flatten_dense_tensors, or "
            "torch.distributed's all_reduce_coalesced) into a few all-reduces of >= 25 MB.",
        caveats="The saving is estimated from the trace's own bandwidth at large sizes (or the sweep's): it counts "
                "the kernels' time, not the host time of issuing each call, nor the overlap with backward that DDP "
                "adds on top. Bucketing holds gradients until a bucket is full, and changes the reduction order "
                "(bitwise results may differ). Small all-reduces of activations (tensor parallelism: each waits "
                "for the layer before it) cannot be bucketed; the rule cannot tell them from gradients."),
    "exposed_comm": dict(
        cause="Collective kernels run while no compute kernel runs beside them: the step waits for the network. In "
              "data parallelism this is the gradient sync that starts after backward (or one large final bucket); "
              "in tensor/sequence parallelism, collectives that the next layer depends on.",
        fix="Overlap communication with compute: DDP's bucketed all-reduce during backward (a smaller bucket_cap_mb "
            "starts the first buckets earlier), FSDP's backward_prefetch/forward_prefetch, async tensor parallelism "
            "(torch.compile's micro-pipelining, symmetric memory); otherwise send fewer bytes (bf16 gradients, a "
            "compression comm hook) or use a faster interconnect.",
        caveats="Counts the transfer part of each kernel (its duration on the rank that arrived last) on the rank "
                "that arrived last at each collective (the critical path); waiting for a late peer is late_rank's. "
                "Kernels of several process groups running at once are each counted. Overlapped communication is "
                "not free either: it competes with compute for SMs and memory bandwidth (comm_compute_contention)."),
    "late_rank": dict(
        cause="A collective finishes only when its last rank arrives: every other rank's kernel spins, holding its "
              "GPU, until then. One slow rank sets the pace of the whole job.",
        fix="Then re-profile: the late rank should change or disappear.",
        caveats="'Arrived last' is read off kernel durations (the rank whose kernel is shortest waited for no one), "
                "so no clock alignment is needed. The reason compares how each rank got from the last collective at "
                "which all ranks arrived together to this one (host activity until the launch, then the GPU still "
                "busy), so a lag created once is blamed on what created it. The cost is the other ranks' waiting "
                "that no compute hid, at the collectives this rank was last at; fixing the rank may move some of it "
                "elsewhere. Arriving less than 1% of a step late is jitter, not counted; no finding when ranks take "
                "turns arriving last. Telling an idle host from a "
                "busy one needs CUDA runtime events (a CPU-only trace has none)."),
    "comm_compute_contention": dict(
        cause="NCCL moves data with kernels on the GPU's SMs: beside large compute kernels (GEMMs that fill every "
              "SM) they get fewer SMs and less memory bandwidth, so the same transfer takes longer -- and the "
              "compute beside it slows down too.",
        fix="Give NCCL fewer, dedicated resources or move bytes without SMs: NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS "
            "to bound its SMs, copy-engine transfers for point-to-point (CUDA IPC / peer copies between GPUs of one "
            "node), or schedule the large transfers beside lighter kernels.",
        caveats="Compares transfer-only kernels (the last-arriving rank's, so waiting does not pass for slowness) of "
                "the same collective and size; point-to-point kernels are not matched across ranks, so a receive "
                "may include waiting for its sender. A stretched transfer that stays hidden behind compute costs no "
                "step time by itself; the compute it slows is not counted here."),
    "low_busbw": dict(
        cause="The job's collectives reach a fraction of the bandwidth the same machine reaches at the same size: "
              "NCCL is configured differently in the job (an NCCL_* variable forcing a protocol, algorithm or fewer "
              "channels), the traffic takes another path (a process group across nodes, P2P disabled, wrong NIC), "
              "or the kernels share the GPU with compute.",
        fix="Compare the job's NCCL environment with the sweep's (NCCL_DEBUG=INFO prints the chosen algorithm, "
            "protocol, channels and transport per communicator); unset NCCL_ALGO/NCCL_PROTO/NCCL_MAX_NCHANNELS "
            "overrides; check NCCL_P2P_DISABLE, NCCL_IB_HCA/NCCL_SOCKET_IFNAME; run the sweep with the job's "
            "environment to confirm.",
        caveats="Traced durations are the per-instance minimum over ranks (the transfer, not the waiting) when 2+ "
                "ranks are given; with one rank they include waiting and understate busbw. The sweep must come "
                "from the same machine and group size; sizes outside the sweep's range are not judged."),
}
"""each rule's fixed text: the cause, the fix, its caveats (a finding may refine the fix)"""

FIX_BY_REASON = {
    "data_wait": ("That rank's input pipeline is the bottleneck: more DataLoader workers, pin_memory=True with "
                  "prefetching (prefetch_factor), faster storage or pre-processed shards on that node."),
    "host_sync": ("Remove the synchronising calls from the step on that rank (.item(), .cpu(), printing or "
                  "logging tensors, torch.cuda.synchronize()); log asynchronously every N steps."),
    "host_idle": ("Find what that rank's host does between steps without launching work (sleep, checkpointing, "
                  "logging, garbage collection, another process on its cores): py-spy dump on that rank."),
    "host_busy": ("That rank's host issues the same work more slowly: check its CPU binding and NUMA node "
                  "(one core per rank near its GPU), CPU frequency and other load on the host; CUDA graphs "
                  "take the per-kernel launch cost off the host."),
    "gpu_busy": ("That rank does more GPU work per step: balance the work (sequence lengths, experts, "
                 "pipeline stages) or check that GPU for throttling (nvidia-smi -q -d PERFORMANCE)."),
    "gpu_slow": ("That rank's GPU runs the same kernels more slowly: check its clocks and throttle reasons "
                 "(nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE,POWER) while the job runs; a GPU held at lower "
                 "clocks by power or temperature limits slows every rank of a synchronous job to its pace."),
}
"""late_rank's fix, by what the late rank was doing (:data:`REASONS`)"""


def finding(rule_id: str, cost: float, ranks, evidence: dict, summary: str, fix: str | None = None) -> list[Finding]:
    """A rule's one finding, with the rule's fixed text (:data:`TEXT`)."""
    t = TEXT[rule_id]
    return [Finding(rule_id, float(cost), tuple(int(r) for r in ranks), evidence, summary, t["cause"],
                    fix or t["fix"], t["caveats"])]


rule(Rule(id="per_param_allreduce", title="many small all-reduces per step", extract=extract_timeline,
          judge=judge_per_param, notebook="dataloader_sync", **TEXT["per_param_allreduce"]))
rule(Rule(id="exposed_comm", title="communication not hidden behind compute", judge=judge_exposed,
          extract=gpu_extract("exposed_comm"), notebook="collective_tracing", **TEXT["exposed_comm"]))
rule(Rule(id="late_rank", title="one rank arrives late at the collectives", extract=extract_late, judge=judge_late,
          notebook="collective_tracing", needs_ranks=2, **TEXT["late_rank"]))
rule(Rule(id="comm_compute_contention", title="NCCL kernels slowed down by the compute beside them",
          extract=gpu_extract("comm_compute_contention"), judge=judge_contention, notebook="p2p_transports",
          **TEXT["comm_compute_contention"]))
rule(Rule(id="low_busbw", title="collectives slower than this machine can do", extract=extract_timeline,
          judge=judge_low_busbw, notebook="collectives", needs_sweep=True, **TEXT["low_busbw"]))
