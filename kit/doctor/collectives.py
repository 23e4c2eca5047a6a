"""Communication across ranks: the per-rank collectives timeline (a stage of the per-rank phase, shipped in
:attr:`kit.doctor.rank_phase.RankSummary.comm`) and the cross-rank match that :class:`kit.doctor.context.JobContext`
computes once for every judge (the comm rules in :mod:`kit.doctor.rules` and the accounting's comm split).

**What the per-rank phase keeps** (:func:`timeline`, one object per rank, a few KB to a few MB however large the
trace): the rank's collectives frame (:attr:`kit.traces.Trace.collectives`, one row per NCCL kernel or gloo op)
with, per row, the step it was launched in (by its launching runtime call, through the kernel's ``correlation``)
and the host time it was launched at; and the compute-kernel time inside the communication windows (the union
of non-NCCL kernels, cut to the union of NCCL kernels, per device). ``late_rank`` adds how much host time each
rank had spent waiting for data, blocked in synchronising calls or stalled until each collective
(:func:`kit.doctor.rules.late_arrival.host_time_until`). What needs two ranks -- the same collective instance on
every rank (:func:`matched`, :func:`by_step`, :func:`kit.traces.comm.match_instances`) and how long the others waited --
is done on the caller, once per job (:meth:`kit.doctor.context.JobContext.collectives`); the judges read that.

**Waiting and transfer.** A collective's kernel starts when its rank reaches it and spins until every peer has
arrived, so on the early ranks it is long. Per instance, the shortest duration over ranks is the transfer
(``instance_min_us``); the rest of each rank's kernel is waiting (``wait_us``). The rules keep them apart:
``exposed_comm`` counts the transfer part of each kernel (its last ``instance_min_us``) that no compute hid,
``late_rank`` the waiting part -- so one microsecond is never blamed on two causes. Who arrived last at each
instance (``last``) and whether a row was launched inside a step (``in_step``) are columns of the matched frame
(:func:`arrivals`), derived once. The shortest duration is the transfer only where the rank that arrived last is
among the ranks given: ``whole`` says an instance was seen on every rank of its process group (or its group's size is
unknown); a subset of a bigger job's traces leaves every given rank possibly waiting for one not given, and such an
instance's transfer is not known (``low_busbw`` judges whole instances only, ``exposed_comm`` counts none of a part
of a group). ``per_param_allreduce``,
``comm_compute_contention`` and ``low_busbw`` time transfers, never waits.

**Per step.** With ``ProfilerStep#N`` annotations, a cost is the total over the kernels launched inside the
steps divided by the number of steps; without them the whole trace is one step (and the step time the traced
span: see :mod:`kit.doctor.model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..traces.intervals import covered, union_np
from ..traces.overlap import intersect

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

    from .model import RankView


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
    held: "pd.DataFrame | None" = None
    """``device, a, b``: time inside the communication windows when GPU work already launched had not started and
    no compute kernel ran (sorted, disjoint per device): work held back behind the collectives (or behind the
    GPU's queue), not a GPU waiting for its host. None when the trace has no launch calls to tell"""


def timeline(view: "RankView") -> Timeline:
    """The rank's :class:`Timeline` (computed once per rank)."""
    return view.shared("collectives", _build_timeline)


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


def _last(values, keys: list) -> "pd.Series":
    """``values`` indexed by ``keys`` (one array, or several: a MultiIndex), the last of a repeated key kept."""
    import pandas as pd

    idx = pd.Index(keys[0]) if len(keys) == 1 else pd.MultiIndex.from_arrays(keys)
    s = pd.Series(values, index=idx)
    return s[~s.index.duplicated(keep="last")]


def _build_timeline(view: "RankView") -> Timeline:
    import numpy as np
    import pandas as pd

    t = view.trace
    rows = t.collectives.copy()
    gpu = t.gpu
    kernels = gpu[gpu["cat"] == "kernel"]
    comp_cols = ["device", "a", "b"]
    if rows.empty:
        return Timeline(view.rank, "", rows.assign(step=[], launch_us=[], end_us=[], overlap_us=[]),
                        pd.DataFrame(columns=comp_cols), len(view.steps), view.step_us, len(kernels),
                        pd.DataFrame(columns=comp_cols))
    rows["rank"] = view.rank
    rows["end_us"] = rows["start_us"] + rows["dur_us"]
    for c in ("trace", "kernel", "dtype", "pg_desc"):  # a few distinct strings, repeated: keep the summary small
        rows[c] = rows[c].astype("category")
    launch = rows["start_us"].to_numpy(dtype=float).copy()
    known = np.ones(len(rows), dtype=bool)
    nccl_mask = (rows["backend"] == "nccl").to_numpy()
    if nccl_mask.any():  # the launching runtime call, through the kernel's correlation id
        nk = gpu[gpu["nccl"]]
        calls = t.cpu[t.cpu["cat"].isin(["cuda_runtime", "cuda_driver"]) & t.cpu["correlation"].notna()]
        n = rows[nccl_mask]
        # (device, stream, start) -> the kernel's correlation -> its call's start; the last of a repeated key wins,
        # as in a dict (indexes, not Python dicts: 5,000 kernels and 68,000 calls a rank in ~8 ms, not ~90)
        corr = _last(nk["correlation"].to_numpy(dtype=float), [nk["device"].astype(str).to_numpy(),
                                                               nk["stream"].astype(str).to_numpy(), nk["ts"].to_numpy()])
        at = _last(calls["ts"].to_numpy(dtype=float), [calls["correlation"].to_numpy(dtype=float)])
        key = pd.MultiIndex.from_arrays([n["device"].astype(str).to_numpy(), n["stream"].astype(str).to_numpy(),
                                         n["start_us"].to_numpy()])
        launch_n = at.reindex(corr.reindex(key).to_numpy(dtype=float)).to_numpy(dtype=float)
        known[nccl_mask] = ~np.isnan(launch_n)
        launch[nccl_mask] = np.where(known[nccl_mask], launch_n, n["start_us"].to_numpy(dtype=float))
    rows["launch_us"] = launch
    # a kernel whose launch is not in the trace was launched before the profiled window (a GPU running behind
    # its host): it belongs to no profiled step
    rows["step"] = np.where(known, step_of(launch, view.steps), np.nan)
    # compute kernels inside the communication windows, per device; and the time there when launched work waited
    comp, held, overlap = [], [], np.zeros(len(rows))
    issued = view.issued() if known.any() else None
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
        if issued is not None:
            held.append(_held(issued[issued["device"] == dev], ua, ub, ca, cb).assign(device=dev))
        sel = (rows["device"].astype(str) == str(dev)).to_numpy() & nccl_mask
        overlap[sel] = covered(ca, cb, rows.loc[sel, "start_us"], rows.loc[sel, "end_us"])
    rows["overlap_us"] = overlap
    compute = pd.concat(comp, ignore_index=True) if comp else pd.DataFrame(columns=comp_cols)
    backend = "nccl" if nccl_mask.any() else "gloo"
    held_df = None if issued is None else (pd.concat(held, ignore_index=True)[comp_cols] if held
                                           else pd.DataFrame(columns=comp_cols))
    return Timeline(view.rank, backend, rows.reset_index(drop=True), compute, len(view.steps), view.step_us,
                    len(kernels), held_df)


def _held(g: "pd.DataFrame", ua, ub, ca, cb) -> "pd.DataFrame":
    """One device's time inside the communication windows ``ua, ub`` when some activity of ``g`` (:meth:`RankView.
    issued`) had been launched (its call returned; one whose call is not in the trace was queued before the trace
    began) and had not started, less the compute time ``ca, cb``."""
    import numpy as np
    import pandas as pd

    from ..traces.intervals import subtract

    start = g["ts"].to_numpy(dtype=float)
    launched = g["call_end"].to_numpy(dtype=float)
    launched = np.where(np.isnan(launched), -np.inf, launched)
    w = launched < start
    pa, pb = union_np(np.maximum(launched[w], ua[0] if len(ua) else 0.0), start[w])
    pa, pb = subtract((pa, pb), (ca, cb))
    cut = intersect(list(zip(ua, ub)), list(zip(pa, pb)))
    return pd.DataFrame({"a": np.array([x[0] for x in cut], dtype=float),
                         "b": np.array([x[1] for x in cut], dtype=float)})


def matched(summaries: list[tuple[int, Timeline]]) -> "pd.DataFrame":
    """Every rank's rows matched across ranks (:func:`kit.traces.comm.match_instances`: ``instance``,
    ``instance_min_us``, ``ranks_seen``, ``wait_us``; 0 with one rank), with the Timeline's own columns."""
    import pandas as pd

    from ..traces.comm import match_instances

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


def arrivals(df: "pd.DataFrame", tl_of: dict[int, Timeline]) -> "pd.DataFrame":
    """``df`` (:func:`matched`) with ``last`` -- the row of each instance seen on 2+ ranks whose kernel is shortest:
    the rank that arrived last and waited for no one (the first such row on a tie); False on rows seen on one rank
    only --, ``in_step``: launched inside a profiled step of its rank (every row of a rank whose trace has no
    steps) --, ``whole``: the instance was seen on every rank of its process group, or its group's size is not
    known (the module docstring: only then is its shortest kernel the transfer) -- and ``part_of_group``: seen on 2+
    ranks but not whole (its ranks given may have waited for one not given), or ``unmatched`` (:func:`unmatched`,
    also a column of its own).
    Derived here once for every reader (:meth:`kit.doctor.context.JobContext.collectives`)."""
    import numpy as np

    size = df["group_size"].to_numpy(dtype=float)
    whole = np.isnan(size) | (df["ranks_seen"].to_numpy(dtype=float) >= size)
    lone = unmatched(df)

    multi = df[df["ranks_seen"] > 1]
    last = np.zeros(len(df), dtype=bool)
    if len(multi):
        last[df.index.get_indexer(multi.groupby(["match_key", "instance"])["dur_us"].idxmin())] = True
    stepped = df["rank"].map(lambda r: bool(tl_of[int(r)].steps)).to_numpy(dtype=bool)
    return df.assign(last=last, in_step=~stepped | df["step"].notna().to_numpy(), whole=whole,
                     part_of_group=((df["ranks_seen"].to_numpy() > 1) & ~whole) | lone, unmatched=lone)


P2P = ("send", "recv", "send_recv")
"""point-to-point operations (:mod:`kit.collective_ops`): one side's row has no counterpart of its own name"""


def unmatched(df: "pd.DataFrame") -> "np.ndarray":
    """Rows of a collective seen on one rank only although other ranks given ran the same collective of the same
    process group (its match key less the step: group, collective, bytes): its counterparts fell outside what was
    matched -- a step one rank's steps leave out and the others' keep (:func:`kit.doctor.steps.steady`: a first step
    that is start-up on one rank only), a window cut at different points. Its rank may have waited for them (a
    kernel held 42.7 ms by the peer whose step was left out: FINDINGS.md, "Held-out jobs, judged blind"), so its
    transfer is not known, as for an instance seen on part of its group. Point-to-point rows (:data:`P2P`) and a
    collective no other rank given ran are not: seen on one rank is all there is to see of them."""
    import numpy as np

    n = len(df)
    lone = df["ranks_seen"].to_numpy(dtype=float) <= 1 if n else np.zeros(0, dtype=bool)
    if not lone.any() or df["rank"].nunique() < 2:  # the usual job: every row matched, nothing to look up
        return np.zeros(n, dtype=bool)
    p2p = df["collective"].astype(str).isin(P2P).to_numpy()
    # ranks that ran each (group, collective, bytes): a lone row's rank is one of them, so 2+ means another did
    keys = [df[c].astype(str) for c in ("process_group", "collective", "bytes")]
    ranks = df.groupby(keys, sort=False)["rank"].transform("nunique").to_numpy()
    return lone & ~p2p & (ranks > 1)


def no_collectives(summaries: list[tuple[int, Timeline]]) -> bool:
    """No rank traced any collective."""
    return all(tl.rows.empty for _, tl in summaries)


def gloo_only(summaries: list[tuple[int, Timeline]]) -> bool:
    """Every collective traced is a gloo op (none ran as a GPU kernel)."""
    return all(tl.backend in ("gloo", "") for _, tl in summaries) and not no_collectives(summaries)


# ------------------------------------------------------------------------------------------- waiting and transfer
def kernel_parts(df: "pd.DataFrame", part: str) -> "tuple[np.ndarray, np.ndarray]":
    """Per kernel, its ``transfer`` part (the last instance_min_us) or its ``wait`` part (the rest)."""
    import numpy as np

    start, end = df["start_us"].to_numpy(dtype=float), df["end_us"].to_numpy(dtype=float)
    t = df["instance_min_us"].to_numpy(dtype=float)
    t = np.where(np.isnan(t), end - start, np.minimum(t, end - start))
    return (end - t, end) if part == "transfer" else (start, end - t)


def exposed_parts(df: "pd.DataFrame", tl_of: dict[int, Timeline]) -> "pd.DataFrame":
    """``df`` with, per row, ``exposed_transfer_us`` and ``exposed_wait_us``: the transfer and waiting parts of
    the kernel (:func:`kernel_parts`) during which no compute kernel ran on its GPU. A gloo op blocks its CPU thread
    for all of it: nothing hides it."""
    import numpy as np

    t, w = kernel_parts(df, "transfer"), kernel_parts(df, "wait")
    df = df.assign(exposed_transfer_us=t[1] - t[0], exposed_wait_us=np.clip(w[1] - w[0], 0, None))
    nccl = df[df["backend"] == "nccl"]
    for (rank, dev), d in nccl.groupby([nccl["rank"], nccl["device"].astype(str)]):
        c = tl_of[int(rank)].compute
        c = c[c["device"].astype(str) == dev]
        ca, cb = c["a"].to_numpy(dtype=float), c["b"].to_numpy(dtype=float)
        for part in ("transfer", "wait"):
            a, b = kernel_parts(d, part)
            df.loc[d.index, f"exposed_{part}_us"] = np.clip((b - a) - covered(ca, cb, a, b), 0, None)
    return df
