"""The pipeline's tables, figures and findings: time per iteration per transport and driver, the 1F1B model
beside the measurement, and from the profiled iterations where each stage's GPU sat idle and why.

**The model.** With ``p`` stages, ``m`` micro-batches, stage ``s`` taking ``F_s`` / ``B_s`` for one micro-batch's
forward / backward alone and ``c`` for one activation between neighbours, a 1F1B iteration takes

    T = sum_s (F_s + B_s) + (m - 1) * max_s (F_s + B_s) + 2 (p - 1) c

-- the first micro-batch's forward through every stage and the last one's backward back, the other ``m - 1``
micro-batches at the pace of the slowest stage, and one transfer per hop on the way in and out. With equal
stages this is ``(m + p - 1)(F + B) + 2(p - 1)c``: each stage idles the *bubble* fraction
``(p - 1)/(m + p - 1)`` of the iteration (Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", SC'21, section 2.2). A measured iteration above the model is time the model
does not know: the host, or a dependency that should not be there.

**Idle from the timeline.** Per profiled iteration and GPU: the span (first to last GPU activity of the
iteration on any GPU), the busy time (union of kernels and copies), and the idle gaps. A gap is *host-caused*
for as long as the activity that ends it had not even been launched: from the gap's start to the launch call
(the runtime/driver call the kernel's ``correlation`` names). The rest of a gap is a wait on something already
queued -- a transfer, a peer, the bubble. A device-bound driver has (almost) no host-caused idle.
"""

from __future__ import annotations

import pandas as pd

from ... import plot, stats, transports
from ...traces.overlap import length, union
from ...contract import Observation
from . import analysis as A
from .analysis import frame, rows_of


def _with_driver(d: pd.DataFrame) -> pd.DataFrame:
    """Recorded runs from before the drivers existed were host-driven."""
    return d.assign(driver=d["driver"].fillna("host") if "driver" in d.columns else "host")


def _one_thread(transport: str, driver: str) -> bool:
    """Does one host thread issue every stage (an in-process transport, host-driven)?"""
    caps = transports.capabilities(transport)
    return driver == "host" and caps is not None and caps.in_process


def _host_per_step(g: pd.DataFrame, col: str, one_thread: bool) -> float:
    """Median over steps of the host's time in the iteration of the thread that spends most (``col`` summed over
    the stages one thread drives, else the busiest stage's); NaN where not measured (a CUDA graph's replay, runs
    from before it was)."""
    if col not in g.columns or g[col].isna().all():
        return float("nan")
    per = g.dropna(subset=[col]).groupby("step")[col]
    return float((per.sum() if one_thread else per.max()).median())


def pipeline(data) -> pd.DataFrame:
    """Per transport, driver and number of stages (a run set may hold runs on 2 and on 4 GPUs): median iteration
    time (slowest rank per step), p10/p90, loss, gradient norms; ``host_ms``: the host's time inside the iteration
    of the thread that spends most (one thread driving every stage: the sum over them), ``host_compute_ms`` the
    part of it in the forward and backward calls (:func:`_host_per_step`); ``host_share`` = host_ms / time: near 1,
    the iteration is as long as the host takes to issue it."""
    d = rows_of(frame(data), "pipeline")
    if d.empty:
        return pd.DataFrame()
    d = _with_driver(d)
    if "world_size" not in d.columns:
        d = d.assign(world_size=d["stage"].max() + 1)
    rows = []
    for t in A._ordered(d["transport"]):
        for (drv, ws), g in d[d["transport"] == t].groupby(["driver", "world_size"], sort=False):
            st = stats.stats(g.groupby("step")["time_us"].max().to_numpy())
            one = _one_thread(t, drv)
            host, comp = _host_per_step(g, "host_us", one), _host_per_step(g, "host_compute_us", one)
            rows.append(dict(transport=t, driver=drv, stages=int(ws), how=g["how"].iloc[0] if "how" in g.columns else "host",
                             time_ms_median=st["median"] / 1e3, time_ms_p10=st["p10"] / 1e3,
                             time_ms_p90=st["p90"] / 1e3, steps=st["n"], loss=g["loss"].dropna().median(),
                             grad_norms=", ".join(f"{v:.4g}" for v in g.groupby("stage")["grad_norm"].median()),
                             host_ms=host / 1e3, host_compute_ms=comp / 1e3, host_share=host / st["median"]))
    return pd.DataFrame(rows)


AFTER = {"F": "F after message", "B": "B after message"}  # a step's host right after a message into its stage


def parts(data) -> pd.DataFrame:
    """Per transport, part (F, B, transfer) and stage or hop: median and spread of the time alone (us)."""
    d = rows_of(frame(data), "pipeline_part")
    if "part" in d.columns:
        d = d[~d["part"].isin(["message host", *AFTER.values()])]  # host times only (in _host_model)
    if d.empty:
        return pd.DataFrame()
    d = d.assign(where=[f"{int(a)}->{int(b)}" if p == "transfer" else f"stage {int(s)}"
                        for p, s, a, b in zip(d["part"], d.get("stage", pd.Series(index=d.index, dtype=float)),
                                              d.get("src", pd.Series(index=d.index, dtype=float)),
                                              d.get("dst", pd.Series(index=d.index, dtype=float)))])
    return stats.slowest_rank_stats(d, ["transport", "part", "where"])


def simulate(F, B, c, m: int, hF=None, hB=None, shared_host: bool = False, hsend=None, hrecv=None,
             host_handoff: bool = True) -> float:
    """The 1F1B iteration (the time the last stage finishes) of stages with forward ``F[s]`` and backward ``B[s]``
    per micro-batch and ``c[s]`` per transfer between stage ``s`` and ``s + 1`` (either way), ``m`` micro-batches:
    every stage runs :func:`.pipeline.schedule` in order, a step starting when its stage is free and its input has
    arrived (a forward: the previous stage's forward of that micro-batch plus the hop; a backward: the next stage's
    backward plus the hop). Raises on a schedule that cannot finish.

    With the host's time to issue each step (``hF[s]``, ``hB[s]``: a host-driven pipeline) a step is also issued
    by a host -- one per stage, or one for every stage (``shared_host``: one thread driving every GPU, taking turns
    as :func:`.pipeline.drive` does: a stage issues what it can, then the next) -- after that host's previous step
    and after the host that issues its input's step (a message is posted when its sender issued it); its GPU work
    starts no earlier than its issue begins and ends no earlier than its issue ends. ``hsend[k]`` / ``hrecv[k]``:
    the host's time per message over hop ``k`` on the sending / receiving side, added to the step that sends /
    receives it. ``host_handoff``: a receive waits on the host until its message was posted (a mailbox on the host,
    or one thread that yields until then), so its step's issue follows the sender's; False for a transport whose
    receive is queued on the GPU without waiting on the host (NCCL: only the GPU waits for the peer)."""
    from .pipeline import schedule

    p = len(F)
    if len(B) != p or len(c) != p - 1:
        raise ValueError(f"simulate: {p} forwards, {len(B)} backwards and {len(c)} hops (need p, p and p - 1)")
    host = hF is not None and hB is not None
    prog = [schedule(s, p, m) for s in range(p)]
    nxt, free, end, issued = [0] * p, [0.0] * p, {}, {}
    hfree = [0.0] * (1 if shared_host else p)
    left = sum(len(x) for x in prog)
    while left:
        moved = False
        for s in range(p):
            while nxt[s] < len(prog[s]):
                kind, i = prog[s][nxt[s]]
                if kind == "F":
                    src = ("F", s - 1, i) if s > 0 else None
                    hop = c[s - 1] if s > 0 else 0.0
                else:
                    src = ("B", s + 1, i) if s < p - 1 else None
                    hop = c[s] if s < p - 1 else 0.0
                if src is not None and src not in end:
                    break
                dep = end[src] + hop if src is not None else 0.0
                start = max(free[s], dep)
                dur = F[s] if kind == "F" else B[s]
                if host:
                    h = 0 if shared_host else s
                    hs = max(hfree[h], issued[src] if src is not None and host_handoff else 0.0)
                    cost = hF[s] if kind == "F" else hB[s]
                    if src is not None and hrecv is not None:  # this step receives over the hop it came by
                        cost += hrecv[s - 1 if kind == "F" else s]
                    out_hop = (s if s < p - 1 else None) if kind == "F" else (s - 1 if s > 0 else None)
                    if out_hop is not None and hsend is not None:  # and sends its output on
                        cost += hsend[out_hop]
                    hfree[h] = issued[(kind, s, i)] = hs + cost
                    start = max(start, hs)
                    free[s] = end[(kind, s, i)] = max(start + dur, hfree[h])
                else:
                    free[s] = end[(kind, s, i)] = start + dur
                nxt[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("simulate: no stage can proceed (schedule deadlock)")
    return max(free)


def model(data) -> pd.DataFrame:
    """Per transport, driver and number of stages: the 1F1B model's iteration time beside the measured one.

    The model is :func:`simulate` on the parts measured alone: ``F_s`` / ``B_s`` pooled over every transport of the
    runs (median of all samples of stage ``s``: the stages compute the same GEMMs whichever transport carries their
    messages, and alone their times spread -- FINDINGS.md -- so a per-transport median would give each transport
    its own model from that spread alone), each hop's ``c`` the transport's own (one activation alone). ``predicted_p10_ms`` /
    ``predicted_p90_ms``: the same with every part at its p10 / p90 -- the model's spread; a transport below
    ``predicted_p10_ms`` beats the model by more than its spread (the model is missing something).
    ``host_model_ms``: :func:`_host_model` (the host's time to issue each step and message, measured alone, in
    the simulation), ``host_model_p10_ms`` the same with every part and host time at its p10 (its lower spread
    bound: a measurement below it beats the model with the host); ``host_in_iteration_ms``: the host's time measured inside the iteration (:func:`pipeline`'s
    ``host_ms``) -- where one thread issues every stage, an iteration cannot be shorter;
    ``measured_vs_host_model_paired``: each step against the parts timed next to it (:func:`_paired`).
    ``formula_ms``: the closed form ``sum_s (F_s + B_s) + (m - 1) max_s (F_s + B_s) + 2 (p - 1) max c`` (see the
    module docstring), which counts the transfers of the first and last micro-batch only; the simulation also
    finds a transfer on the critical path in the steady state when no stage has the slack to hide it."""
    pp = pipeline(data)
    raw = rows_of(frame(data), "pipeline_part")
    if pp.empty or raw.empty:
        return pd.DataFrame()
    out = []
    for r in pp.itertuples():
        same = raw[raw["world_size"] == r.stages] if "world_size" in raw.columns else raw
        comp = same[same["part"].isin(["F", "B"])]
        if comp.empty:
            continue
        g = rows_of(frame(data), "pipeline")
        g = g[(g["transport"] == r.transport)]
        g = g[g["world_size"] == r.stages] if "world_size" in g.columns else g  # runs of 2 and 4 stages side by side
        p, m = r.stages, int(g["micro_batches"].max())
        hops = same[(same["transport"] == r.transport) & (same["part"] == "transfer")]
        pred = {}
        for name, qq in (("median", 0.5), ("p10", 0.1), ("p90", 0.9)):
            fb = comp.groupby(["stage", "part"])["time_us"].quantile(qq).unstack()
            if not {"F", "B"} <= set(fb.columns) or len(fb) != p:
                break
            c = [_hop(hops, s, qq) for s in range(p - 1)]
            pred[name] = simulate(list(fb["F"]), list(fb["B"]), c, m)
        if "median" not in pred:
            continue
        msg = same[(same["transport"] == r.transport) & (same["part"].isin(["message host", *AFTER.values()]))]
        hosted = _host_model(comp, hops, p, m, r, msg)
        hosted_p10 = _host_model(comp, hops, p, m, r, msg, qq=0.1)
        paired = _paired(comp, hops, p, m, r, msg, _with_driver(g).query("driver == @r.driver"))
        per_stage = comp.groupby(["stage", "part"])["time_us"].median().groupby("stage").sum()
        b = comp[comp["part"] == "B"]["time_us"]
        cmax = max([_hop(hops, s, 0.5) for s in range(p - 1)] or [0.0])
        formula = float(per_stage.sum() + (m - 1) * per_stage.max() + 2 * (p - 1) * cmax)
        out.append(dict(transport=r.transport, driver=r.driver, how=getattr(r, "how", "host"), stages=p, micro_batches=m,
                        stage_f_plus_b_ms=float(per_stage.max()) / 1e3, backward_p10_ms=float(b.quantile(0.1)) / 1e3,
                        backward_p90_ms=float(b.quantile(0.9)) / 1e3, transfer_ms=cmax / 1e3,
                        bubble_fraction=(p - 1) / (m + p - 1), predicted_ms=pred["median"] / 1e3,
                        predicted_p10_ms=pred.get("p10", float("nan")) / 1e3,
                        predicted_p90_ms=pred.get("p90", float("nan")) / 1e3, formula_ms=formula / 1e3,
                        host_model_ms=hosted / 1e3, host_model_p10_ms=hosted_p10 / 1e3, host_in_iteration_ms=getattr(r, "host_ms", float("nan")),
                        measured_ms=r.time_ms_median,
                        measured_vs_model=r.time_ms_median * 1e3 / pred["median"],
                        measured_vs_host_model=r.time_ms_median * 1e3 / hosted,
                        measured_vs_host_model_paired=paired))
    return pd.DataFrame(out)


def _next_to(d: pd.DataFrame, driver: str, step=None) -> pd.DataFrame:
    """The part rows timed next to ``driver``'s pipeline steps (:class:`.pipeline_run.Parts`; only step ``step``'s
    where given); all of them in a run from before the parts were timed next to the steps (no ``driver`` column)."""
    if "driver" not in d.columns or not (d["driver"] == driver).any():
        return d
    d = d[d["driver"] == driver]
    return d[d["step"] == step] if step is not None and "step" in d.columns else d


def _host_model(comp: pd.DataFrame, hops: pd.DataFrame, p: int, m: int, r, msg: pd.DataFrame | None = None,
                qq: float = 0.5, step=None) -> float:
    """:func:`simulate` with the host's time to issue each stage's forward and backward alone (the parts'
    ``host_us``, the transport's own run's: one process measures its stages one after another, several processes
    theirs at once, and the host's time per step differs between the two) and each message's (``msg``, the
    ``message host`` part, posted as the pipeline posts it after a compute step, where the run has it -- else the
    transfer part's ``host_us``, back to back: per message, each rank's own side; one process issues both sides of
    an in-process transport's message, counted once, on the receiving step): one
    host for every stage where one thread drives them all (an in-process transport, host-driven), one per stage
    otherwise; a device-bound CUDA graph has none (the device model). Every part (device and host times, each
    message's) at its quantile ``qq``: 0.5 the model, 0.1 its lower spread bound. A thread per stage (``how``
    "threads"): each step's host time as measured with every stage's thread issuing its own at once
    (``host_threads_us``, :func:`.pipeline_run._concurrent_host_times`: the threads share the interpreter lock),
    where the run has it. A transport whose receive waits for its sender on the GPU (``caps.device_handoff``: NCCL)
    hands nothing over on the host, so a receive's issue does not wait for its sender's (``simulate``'s ``host_handoff``);
    the IPC mailboxes and one thread that yields until a message is posted do wait. The host times are those timed
    next to this driver's steps (:func:`_next_to`; ``step``: next to that step only). NaN without host times (runs
    from before they were measured). One thread for every stage: a step that receives (every forward of a stage
    after the first, every backward of a stage before the last) is issued right after its message's host path, and
    where the run timed such calls (``msg``'s ``F after message`` / ``B after message`` rows, :data:`AFTER`) those
    host times are that stage's, in place of the part's alone: what a message path costs the next compute call on
    that thread is the pipeline's, measured beside its steps (FINDINGS.md, P2P transports, session 7)."""
    if "host_us" not in comp.columns or comp["host_us"].isna().all():
        return float("nan")
    msg = _next_to(msg, r.driver, step) if msg is not None else comp.iloc[:0]
    after = msg[msg["part"].isin(AFTER.values())] if len(msg) and "part" in msg.columns else msg.iloc[:0]
    if len(msg) and "part" in msg.columns:
        msg = msg[msg["part"] == "message host"]
    fb = comp.groupby(["stage", "part"])["time_us"].quantile(qq).unstack()
    how = getattr(r, "how", "host")
    col = "host_us"  # a thread per stage: each step's issue while every stage's thread issues its own (GIL shared)
    if how == "threads" and "host_threads_us" in comp.columns and comp["host_threads_us"].notna().any():
        col = "host_threads_us"
    own = _next_to(comp[comp["transport"] == r.transport], r.driver, step).dropna(subset=[col])  # as this run issues
    h = (own if len(own) else comp.dropna(subset=[col])).groupby(["stage", "part"])[col].quantile(qq).unstack()
    c = [_hop(hops, s, qq) for s in range(p - 1)]
    if how == "graph":
        return simulate(list(fb["F"]), list(fb["B"]), c, m)
    caps = transports.capabilities(r.transport)
    shared = how == "host" and caps is not None and caps.in_process
    if shared and len(after):
        h = h.copy()
        for part, name in AFTER.items():
            by = after[after["part"] == name].dropna(subset=["host_us"]).groupby("stage")["host_us"].quantile(qq)
            for s, v in by.items():
                if s in h.index:
                    h.loc[s, part] = v
    hsend, hrecv = [], []
    for k in range(p - 1):  # the host's time per message alone, each side's own (one process: both in one)
        t = hops[(hops["src"] == k) & (hops["dst"] == k + 1)] if "src" in hops.columns else hops.iloc[:0]
        ctx_ = msg[(msg["src"] == k) & (msg["dst"] == k + 1)] if len(msg) and "src" in msg.columns else msg.iloc[:0]
        if len(ctx_):  # as the pipeline posts it (one thread: both sides; a process per stage: each its own)
            t = ctx_
        hu = t.dropna(subset=["host_us"]) if "host_us" in t.columns else t.iloc[:0]
        if caps is not None and caps.in_process:
            hsend.append(0.0)
            hrecv.append(float(hu["host_us"].quantile(qq)) if len(hu) else 0.0)
        else:
            by = hu.groupby("rank")["host_us"].quantile(qq) if len(hu) else pd.Series(dtype=float)
            hsend.append(float(by.get(k, 0.0)))
            hrecv.append(float(by.get(k + 1, 0.0)))
    return simulate(list(fb["F"]), list(fb["B"]), c, m, list(h["F"]), list(h["B"]), shared_host=shared,
                    hsend=hsend, hrecv=hrecv, host_handoff=caps is None or not caps.device_handoff)


def _paired(comp, hops, p: int, m: int, r, msg, steps: pd.DataFrame) -> float:
    """Median over the timed steps of each step's time (slowest rank) over the model with the host from the parts
    timed next to that step only (:func:`_host_model` with ``step``): each sample against the parts measured beside
    it. NaN for a CUDA graph's replay (no host) and for runs whose parts were not timed next to the steps."""
    if getattr(r, "how", "host") == "graph" or "step" not in comp.columns or "driver" not in comp.columns:
        return float("nan")
    if "world_size" in steps.columns:
        steps = steps[steps["world_size"] == r.stages]
    own = comp[(comp["transport"] == r.transport) & (comp["driver"] == r.driver)]
    ratios = []
    for k, t in steps.groupby("step")["time_us"].max().items():
        if (own["step"] == k).any():
            ratios.append(t / _host_model(comp, hops, p, m, r, msg, step=k))
    return float(pd.Series(ratios).median()) if ratios else float("nan")


def _hop(hops: pd.DataFrame, s: int, qq: float) -> float:
    """Quantile ``qq`` of one activation's time from stage ``s`` to ``s + 1`` alone (slowest participant per
    sample; 0 when the hop was not measured)."""
    h = hops[(hops["src"] == s) & (hops["dst"] == s + 1)] if "src" in hops.columns else hops.iloc[:0]
    if h.empty:
        return 0.0
    keys = [k for k in ("sample", "label", "run_id") if k in h.columns]
    per = h.groupby(keys)["time_us"].max() if keys else h["time_us"]
    return float(per.quantile(qq))


# ------------------------------------------------------------------------------------------------ timelines
def _with_launch(ev: pd.DataFrame, cpu: pd.DataFrame) -> pd.DataFrame:
    """``launch_ts``: when the host call that launched each GPU activity began, and ``launch_exact``.

    The runtime/driver call with the activity's ``correlation`` gives it exactly. A call the profiler does not
    record (the transports' peer copies are ``cuMemcpyDtoDAsync`` through ctypes, a driver call Kineto does not
    trace) still has a correlation id, and ids are handed out in call order: the recorded call with the
    largest smaller id began before it, so its start is a lower bound of the launch (``launch_exact`` False) --
    and the host-caused idle computed from it is a lower bound too."""
    import numpy as np

    if cpu is None or cpu.empty or "correlation" not in cpu.columns or "correlation" not in ev.columns:
        return ev.assign(launch_ts=float("nan"), launch_exact=False)
    calls = cpu.dropna(subset=["correlation"]).groupby("correlation")["ts"].min().sort_index()
    exact = ev["correlation"].map(calls)
    ids, starts = calls.index.to_numpy(dtype=float), calls.to_numpy(dtype=float)
    corr = ev["correlation"].to_numpy(dtype=float)
    k = np.searchsorted(ids, np.nan_to_num(corr, nan=-1.0)) - 1
    before = np.where((k >= 0) & ~np.isnan(corr), starts[np.clip(k, 0, None)], np.nan)
    return ev.assign(launch_ts=exact.fillna(pd.Series(before, index=ev.index)), launch_exact=exact.notna())


def _iteration(trace) -> pd.DataFrame:
    """One profiled iteration's GPU events with ``launch_ts`` (:func:`_with_launch`), cut after the aligning
    barrier's NCCL kernel when there is one."""
    ev = trace.gpu
    if ev.empty:
        return ev
    bar = ev[ev["nccl"] & ev["name"].astype(str).str.contains("AllReduce")]
    if len(bar):
        ev = ev[ev["ts"] >= bar["end"].min()]
    return _with_launch(ev, trace.cpu)


def traced(runs) -> dict[tuple[str, str], pd.DataFrame]:
    """{(transport, driver): GPU events} of the profiled pipeline iterations of the first run that has any, the
    host-driven one of a transport first."""
    ev = A.traced(runs, "pipeline", ("transport", "driver"), _iteration)
    order = A._ordered(t for t, _ in ev)
    return dict(sorted(ev.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1] != "host")))


def idle_of(ev: pd.DataFrame) -> pd.DataFrame:
    """Per GPU (rank and device: ranks that each see one GPU all call it device 0) of one iteration's events:
    span, busy (union of every activity, :func:`kit.traces.overlap.union`), busy without NCCL kernels (an NCCL
    kernel also "runs" while it spins waiting for its peer), idle, and host-caused idle -- for each gap, from its
    start to the launch of the activity that ends it, when that launch came later (see the module docstring; a
    lower bound where launches are bracketed, :func:`_with_launch`)."""
    if ev.empty:
        return pd.DataFrame()
    t0, t1 = float(ev["ts"].min()), float(ev["end"].max())
    if "rank" not in ev.columns:
        ev = ev.assign(rank=0)
    if "launch_ts" not in ev.columns:
        ev = ev.assign(launch_ts=float("nan"))
    rows = []
    for (rank, dev), g in ev.sort_values("ts", kind="stable").groupby(["rank", "device"]):
        busy = union(list(zip(g["ts"], g["end"])))
        launch = g.drop_duplicates("ts").set_index("ts")["launch_ts"]  # of the first activity starting there
        host = sum(min(max(launch[b] - a, 0.0), b - a)
                   for (_, a), (b, _) in zip(busy, busy[1:]) if launch[b] == launch[b])
        is_nccl = g.get("nccl")  # the trace frame's flag: an NCCL kernel
        c = g if is_nccl is None else g[~is_nccl.astype(bool)]
        rows.append(dict(rank=int(rank), device=int(dev), span_us=t1 - t0, busy_us=length(busy),
                         busy_no_nccl_us=length(union(list(zip(c["ts"], c["end"])))),
                         idle_us=(t1 - t0) - length(busy), host_idle_us=host, gaps=len(busy) - 1))
    return pd.DataFrame(rows)


def idle(runs) -> pd.DataFrame:
    """Per transport, driver and GPU of the profiled iterations: span, busy share (also without NCCL kernels),
    idle, host-caused idle (a lower bound where a launch is bracketed, :func:`_with_launch`)."""
    out = []
    for (t, drv), ev in traced(runs).items():
        i = idle_of(ev)
        if len(i):
            out.append(i.assign(transport=t, driver=drv, busy_share=i["busy_us"] / i["span_us"],
                                busy_no_nccl_share=i["busy_no_nccl_us"] / i["span_us"]))
    if not out:
        return pd.DataFrame()
    cols = ["transport", "driver", "rank", "device", "span_us", "busy_us", "busy_share", "busy_no_nccl_share",
            "idle_us", "host_idle_us", "gaps"]
    return pd.concat(out, ignore_index=True)[cols]


# ------------------------------------------------------------------------------------------------ figures
def _title(runs) -> str:
    return getattr(runs, "title", "") or ""


def fig_pipeline(runs):
    """Median ms per 1F1B iteration per transport and driver (p10-p90 bars), the model's prediction as a dash."""
    import matplotlib.pyplot as plt

    pp = pipeline(runs)
    if pp.empty:
        return plot.message("no pipeline rows in these runs", _title(runs))
    mo = model(runs)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels = [f"{r.transport}\n{r.driver}" for r in pp.itertuples()]
    colors = ["#1f77b4" if d == "host" else "#2ca02c" for d in pp["driver"]]
    ax.bar(labels, pp["time_ms_median"], color=colors, capsize=4,
           yerr=[pp["time_ms_median"] - pp["time_ms_p10"], pp["time_ms_p90"] - pp["time_ms_median"]])
    if len(mo):
        pred = mo.set_index(["transport", "driver"])["predicted_ms"]
        for i, r in enumerate(pp.itertuples()):
            v = pred.get((r.transport, r.driver))
            if v is not None:
                ax.plot([i - 0.4, i + 0.4], [v, v], color="black", lw=1.5, ls="--",
                        label="1F1B model" if i == 0 else None)
        ax.legend(fontsize=8)
    ax.set_ylabel("ms per iteration")
    ax.set_title(_title(runs) + "  (blue: host-driven, green: device-bound)", fontsize=9)
    fig.tight_layout()
    return fig


def fig_timeline(runs):
    """One profiled iteration per transport and driver: every GPU's kernels and copies; host-caused idle (its
    lower bound) in orange under each GPU's lanes."""
    import matplotlib.pyplot as plt

    shown = traced(runs)
    if not shown:
        return plot.message("no profiled pipeline iterations in these runs (CUDA transports only)", _title(runs))
    # each panel as tall as its lanes (a device-bound run has a lane per stream): row names never overlap
    lanes_of = [max(ev[ev["dur"] > 0][["device", "stream"]].drop_duplicates().shape[0], 1) for ev in shown.values()]
    fig, axes = plt.subplots(len(shown), 1, figsize=(12, 1.0 + sum(0.9 + 0.28 * n for n in lanes_of)), squeeze=False,
                             gridspec_kw={"height_ratios": [0.9 + 0.28 * n for n in lanes_of]})
    for ax, ((t, drv), ev) in zip(axes[:, 0], shown.items()):
        ev = ev[ev["dur"] > 0]
        if ev.groupby("device")["rank"].nunique().max() > 1:  # one GPU per rank: tell them apart by rank
            ev = ev.assign(device=ev["rank"])
        t0 = ev["ts"].min()
        plot.timeline(ev, ax=ax, t0=t0)
        i = idle_of(ev).set_index("device")
        lanes = sorted(ev[["device", "stream"]].drop_duplicates().itertuples(index=False, name=None))
        for dev, r in i.iterrows():
            ys = [k for k, lane in enumerate(lanes) if lane[0] == dev]
            _shade_host_gaps(ax, ev[ev["device"] == dev], t0, min(ys) - 0.45)
        ax.set_title(f"{t}, {drv}-driven: one iteration "
                     + "; ".join(f"GPU{d} busy {r.busy_us / r.span_us:.0%} ({r.busy_no_nccl_us / r.span_us:.0%} "
                                 f"without NCCL), host-caused idle >= {r.host_idle_us / 1e3:.2f} ms"
                                 for d, r in i.iterrows()), fontsize=8)
    fig.suptitle(_title(runs), fontsize=9)
    fig.tight_layout()
    return fig


def _shade_host_gaps(ax, ev, t0, y) -> None:
    end = None
    ev = ev.sort_values("ts")
    for ts, e, launch in zip(ev["ts"], ev["end"], ev["launch_ts"]):
        if end is not None and ts > end and launch == launch and launch > end:
            ax.barh(y, min(launch, ts) - end, left=end - t0, height=0.12, color="#ff7f0e")
        end = e if end is None else max(end, e)


# ------------------------------------------------------------------------------------------------ findings
def findings(df) -> list[Observation]:
    pp = pipeline(df)
    out = [Observation(f"pipeline.{r.transport}.{r.driver}.ms",
                       f"{r.transport} ({r.driver}-driven{'' if r.how in ('host', r.driver) else ', ' + r.how}): 1F1B "
                       f"pipeline {r.time_ms_median:.2f} ms / iteration, loss {r.loss:.5f}", float(r.time_ms_median), "ms")
           for r in pp.itertuples()]
    for r in model(df).itertuples():
        out.append(Observation(f"pipeline.{r.transport}.{r.driver}.vs_model",
                               f"{r.transport} ({r.driver}): measured {r.measured_ms:.2f} ms vs 1F1B model "
                               f"{r.predicted_ms:.2f} ms ({r.measured_vs_model:.2f}x; p={r.stages}, m={r.micro_batches}, "
                               f"bubble {r.bubble_fraction:.0%}, slowest stage F+B {r.stage_f_plus_b_ms:.3f} ms, "
                               f"transfer {r.transfer_ms:.3f} ms)"
                               + (f"; with the host's time to issue each step {r.host_model_ms:.2f} ms "
                                  f"({r.measured_vs_host_model:.2f}x"
                                  + (f"; each step against the parts timed beside it {r.measured_vs_host_model_paired:.2f}x"
                                     if r.measured_vs_host_model_paired == r.measured_vs_host_model_paired else "")
                                  + ")" if r.host_model_ms == r.host_model_ms else "")
                               + (f"; the host's time inside the iteration {r.host_in_iteration_ms:.2f} ms"
                                  if r.host_in_iteration_ms == r.host_in_iteration_ms else ""),
                               float(r.measured_vs_model)))
    losses = pp["loss"].dropna() if len(pp) else pd.Series(dtype=float)
    if len(losses):
        spread = float((losses.max() - losses.min()) / abs(losses.median())) if losses.median() else float("nan")
        if len(pp) > 1:
            same = "identical" if len(set(pp["grad_norms"])) == 1 else "differ"
            how = f"relative spread {spread:.1e}, gradient norms {same} across transports and drivers"
        else:
            how = "one run, nothing to compare"
        out.append(Observation("pipeline.loss", f"pipeline loss {losses.median():.5f} over "
                                            f"{', '.join(f'{t}/{d}' for t, d in zip(pp['transport'], pp['driver']))}: {how}",
                               float(losses.median())))
    return out


def idle_findings(runs) -> list[Observation]:
    out = []
    i = idle(runs)
    for (t, drv), g in i.groupby(["transport", "driver"], sort=False) if len(i) else []:
        out.append(Observation(f"pipeline.{t}.{drv}.host_idle_ms",
                               f"{t} ({drv}): profiled iteration {g['span_us'].max() / 1e3:.2f} ms, GPUs busy "
                               + ", ".join(f"{b:.0%}" + (f" ({c:.0%} without NCCL kernels)" if c < b else "")
                                       for b, c in zip(g["busy_share"], g["busy_no_nccl_share"]))
                               + "; idle because the host had not launched the next work yet (at least): "
                               + ", ".join(f"{h / 1e3:.2f} of {i / 1e3:.2f} ms idle"
                                       for h, i in zip(g["host_idle_us"], g["idle_us"])),
                               float(g["host_idle_us"].max() / 1e3), "ms"))
    return out


TABLES = {"pipeline": pipeline, "pipeline_parts": parts, "pipeline_model": model, "pipeline_idle": idle}
FIGURES = {"pipeline": fig_pipeline, "pipeline-timeline": fig_timeline}
