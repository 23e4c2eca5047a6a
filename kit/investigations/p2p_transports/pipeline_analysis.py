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

from ... import plot, stats, traces
from ...contract import Finding
from .analysis import _ordered, frame, rows_of


def _with_driver(d: pd.DataFrame) -> pd.DataFrame:
    """Recorded runs from before the drivers existed were host-driven."""
    return d.assign(driver=d["driver"].fillna("host") if "driver" in d.columns else "host")


def pipeline(data) -> pd.DataFrame:
    """Per transport and driver: median iteration time (slowest rank per step), p10/p90, loss, gradient norms."""
    d = rows_of(frame(data), "pipeline")
    if d.empty:
        return pd.DataFrame()
    d = _with_driver(d)
    rows = []
    for t in _ordered(d["transport"]):
        for drv, g in d[d["transport"] == t].groupby("driver", sort=False):
            st = stats.stats(g.groupby("step")["time_us"].max().to_numpy())
            rows.append(dict(transport=t, driver=drv, how=g["how"].iloc[0] if "how" in g.columns else "host",
                             time_ms_median=st["median"] / 1e3, time_ms_p10=st["p10"] / 1e3,
                             time_ms_p90=st["p90"] / 1e3, steps=st["n"], loss=g["loss"].dropna().median(),
                             grad_norms=", ".join(f"{v:.4g}" for v in g.groupby("stage")["grad_norm"].median())))
    return pd.DataFrame(rows)


def parts(data) -> pd.DataFrame:
    """Per transport, part (F, B, transfer) and stage or hop: median and spread of the time alone (us)."""
    d = rows_of(frame(data), "pipeline_part")
    if d.empty:
        return pd.DataFrame()
    d = d.assign(where=[f"{int(a)}->{int(b)}" if p == "transfer" else f"stage {int(s)}"
                        for p, s, a, b in zip(d["part"], d.get("stage", pd.Series(index=d.index, dtype=float)),
                                              d.get("src", pd.Series(index=d.index, dtype=float)),
                                              d.get("dst", pd.Series(index=d.index, dtype=float)))])
    return stats.slowest_rank_stats(d, ["transport", "part", "where"])


def model(data) -> pd.DataFrame:
    """Per transport and driver: the model's iteration time from the parts beside the measured one."""
    pp, pa = pipeline(data), parts(data)
    if pp.empty or pa.empty:
        return pd.DataFrame()
    d = rows_of(frame(data), "pipeline")
    out = []
    for r in pp.itertuples():
        a = pa[pa["transport"] == r.transport]
        comp = a[a["part"].isin(["F", "B"])].groupby("where")["time_us_median"].sum()
        if comp.empty:
            continue
        hop = a.loc[a["part"] == "transfer", "time_us_median"]
        c = float(hop.max()) if len(hop) else 0.0
        g = d[d["transport"] == r.transport]
        p, m = int(g["world_size"].max()), int(g["micro_batches"].max())
        pred = float(comp.sum() + (m - 1) * comp.max() + 2 * (p - 1) * c)
        out.append(dict(transport=r.transport, driver=r.driver, stages=p, micro_batches=m,
                        stage_f_plus_b_ms=float(comp.max()) / 1e3, transfer_ms=c / 1e3,
                        bubble_fraction=(p - 1) / (m + p - 1), predicted_ms=pred / 1e3,
                        measured_ms=r.time_ms_median, measured_vs_model=r.time_ms_median * 1e3 / pred))
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------------ timelines
def _trace_events(files) -> tuple[pd.DataFrame, pd.DataFrame]:
    """GPU events (with the launch call's start ``launch_ts`` where known) of one profiled iteration, every
    rank together, cut after the aligning barrier's NCCL kernel when there is one."""
    out = []
    for f in files:
        try:
            t = traces.load_trace(f.path)
        except traces.TraceError as e:
            print(f"{f.path}: unreadable trace ({e})")
            continue
        ev = t.gpu
        if ev.empty:
            continue
        bar = ev[ev["nccl"] & ev["name"].astype(str).str.contains("AllReduce")]
        if len(bar):
            ev = ev[ev["ts"] >= bar["end"].min()]
        cpu = t.cpu
        if len(cpu) and "correlation" in cpu.columns:
            launch = cpu.dropna(subset=["correlation"]).groupby("correlation")["ts"].min()
            ev = ev.assign(launch_ts=ev["correlation"].map(launch))
        else:
            ev = ev.assign(launch_ts=float("nan"))
        out.append(ev.assign(rank=f.rank))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def traced(runs) -> dict[tuple[str, str], pd.DataFrame]:
    """{(transport, driver): GPU events} of the profiled pipeline iterations of the first run that has any."""
    for d in getattr(runs, "dirs", []):
        files = traces.find_traces(d, experiment="pipeline")
        keys = list(dict.fromkeys((f.tags.get("transport"), f.tags.get("driver")) for f in files))
        keys = sorted(keys, key=lambda k: (_ordered([x for x, _ in keys]).index(k[0]), k[1] != "host"))
        ev = {k: _trace_events([f for f in files if (f.tags.get("transport"), f.tags.get("driver")) == k])
              for k in keys}
        ev = {k: e for k, e in ev.items() if len(e)}
        if ev:
            return ev
    return {}


def idle_of(ev: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: span, busy, idle and host-caused idle (us) of one iteration's events (see the module docstring)."""
    if ev.empty:
        return pd.DataFrame()
    t0, t1 = float(ev["ts"].min()), float(ev["end"].max())
    rows = []
    for dev, g in ev.sort_values("ts").groupby("device"):
        busy, host, end, gaps = 0.0, 0.0, None, 0
        for ts, e, launch in zip(g["ts"], g["end"], g["launch_ts"]):
            if end is None or ts > end:
                if end is not None:
                    gaps += 1
                    if launch == launch:  # not NaN
                        host += min(max(launch - end, 0.0), ts - end)
                busy += e - ts
                end = e
            elif e > end:
                busy += e - end
                end = e
        lead = float(g["ts"].min()) - t0  # before this GPU's first activity
        rows.append(dict(device=int(dev), span_us=t1 - t0, busy_us=busy, idle_us=(t1 - t0) - busy,
                         host_idle_us=host, lead_us=lead, gaps=gaps))
    return pd.DataFrame(rows)


def idle(runs) -> pd.DataFrame:
    """Per transport, driver and GPU of the profiled iterations: span, busy share, idle, host-caused idle."""
    out = []
    for (t, drv), ev in traced(runs).items():
        i = idle_of(ev)
        if len(i):
            out.append(i.assign(transport=t, driver=drv, busy_share=i["busy_us"] / i["span_us"]))
    if not out:
        return pd.DataFrame()
    cols = ["transport", "driver", "device", "span_us", "busy_us", "busy_share", "idle_us", "host_idle_us", "gaps"]
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
    """One profiled iteration per transport and driver: every GPU's kernels and copies; host-caused idle in
    orange under each GPU's lanes."""
    import matplotlib.pyplot as plt

    shown = traced(runs)
    if not shown:
        return plot.message("no profiled pipeline iterations in these runs (CUDA transports only)", _title(runs))
    fig, axes = plt.subplots(len(shown), 1, figsize=(12, 1.6 + 1.2 * len(shown) * 1.4), squeeze=False)
    for ax, ((t, drv), ev) in zip(axes[:, 0], shown.items()):
        ev = ev[ev["dur"] > 0]
        t0 = ev["ts"].min()
        plot.timeline(ev, ax=ax, t0=t0)
        i = idle_of(ev).set_index("device")
        lanes = sorted(ev[["device", "stream"]].drop_duplicates().itertuples(index=False, name=None))
        for dev, r in i.iterrows():
            ys = [k for k, lane in enumerate(lanes) if lane[0] == dev]
            _shade_host_gaps(ax, ev[ev["device"] == dev], t0, min(ys) - 0.45)
        ax.set_title(f"{t}, {drv}-driven: one iteration "
                     + "; ".join(f"GPU{d} busy {r.busy_us / r.span_us:.0%}, host-caused idle {r.host_idle_us / 1e3:.2f} ms"
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
def findings(df) -> list[Finding]:
    pp = pipeline(df)
    out = [Finding(f"pipeline.{r.transport}.{r.driver}.ms",
                   f"{r.transport} ({r.driver}-driven{'' if r.how in ('host', r.driver) else ', ' + r.how}): 1F1B "
                   f"pipeline {r.time_ms_median:.2f} ms / iteration, loss {r.loss:.5f}", float(r.time_ms_median), "ms")
           for r in pp.itertuples()]
    for r in model(df).itertuples():
        out.append(Finding(f"pipeline.{r.transport}.{r.driver}.vs_model",
                           f"{r.transport} ({r.driver}): measured {r.measured_ms:.2f} ms vs 1F1B model "
                           f"{r.predicted_ms:.2f} ms ({r.measured_vs_model:.2f}x; p={r.stages}, m={r.micro_batches}, "
                           f"bubble {r.bubble_fraction:.0%}, slowest stage F+B {r.stage_f_plus_b_ms:.3f} ms, "
                           f"transfer {r.transfer_ms:.3f} ms)", float(r.measured_vs_model)))
    losses = pp["loss"].dropna() if len(pp) else pd.Series(dtype=float)
    if len(losses):
        spread = float((losses.max() - losses.min()) / abs(losses.median())) if losses.median() else float("nan")
        if len(pp) > 1:
            same = "identical" if len(set(pp["grad_norms"])) == 1 else "differ"
            how = f"relative spread {spread:.1e}, gradient norms {same} across transports and drivers"
        else:
            how = "one run, nothing to compare"
        out.append(Finding("pipeline.loss", f"pipeline loss {losses.median():.5f} over "
                                            f"{', '.join(f'{t}/{d}' for t, d in zip(pp['transport'], pp['driver']))}: {how}",
                           float(losses.median())))
    return out


def idle_findings(runs) -> list[Finding]:
    out = []
    i = idle(runs)
    for (t, drv), g in i.groupby(["transport", "driver"], sort=False) if len(i) else []:
        out.append(Finding(f"pipeline.{t}.{drv}.host_idle_ms",
                           f"{t} ({drv}): profiled iteration {g['span_us'].max() / 1e3:.2f} ms, GPUs busy "
                           + ", ".join(f"{b:.0%}" for b in g["busy_share"]) + "; idle because the host had not "
                           "launched the next work yet: " + ", ".join(f"{h / 1e3:.2f} ms" for h in g["host_idle_us"]),
                           float(g["host_idle_us"].max() / 1e3), "ms"))
    return out


TABLES = {"pipeline": pipeline, "pipeline_parts": parts, "pipeline_model": model, "pipeline_idle": idle}
FIGURES = {"pipeline": fig_pipeline, "pipeline-timeline": fig_timeline}
