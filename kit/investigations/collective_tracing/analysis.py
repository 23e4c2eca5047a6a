"""collective_tracing's analyses of a :class:`kit.results.RunSet`: tables, figures, findings.

Everything is read from the run directories: the kept traces (``kit.traces.find_traces(run, part=...)``, old
names included) for the collectives matched across ranks, the rows for steps, overlap and the Flight Recorder.
Each analysis copes with what a run lacks -- no traces, one rank, a CPU (gloo) run without kernels, a run
recorded before the FR demo was part of it -- by returning an empty table or a figure that says what is missing.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ... import plot, results, stats, traces
from ...collective_ops import bus_factor
from ...contract import Observation
from .nccl_events import files_stamp

PARTS = ("ddp", "tp")


def _rows(runs, kind: str):
    df = runs.df
    if df.empty or "kind" not in df.columns:
        return df.iloc[0:0]
    return df[df["kind"] == kind]


@lru_cache(maxsize=32)
def _traced(run_dir: str, part: str, stamp: tuple):
    """The collectives of one part of one run, matched across ranks (cached: several analyses ask)."""
    return traces.collectives([f.path for f in traces.find_traces(run_dir, part=part)])




_FIRST = ["label", "part", "rank", "collective", "bytes", "dtype", "group_size", "process_group", "dur_us",
          "instance_min_us", "wait_us", "busbw_gbps", "start_us"]


def _tidy(df):
    """The columns people read first; ``label`` only when the runs differ by it."""
    if "label" in df.columns and df["label"].nunique() <= 1:
        df = df.drop(columns="label")
    first = [c for c in _FIRST if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)


def collectives_table(runs):
    """Every collective of every part, matched across ranks (from the kept traces; a run without traces
    gives its ``kind=collective`` rows, unmatched)."""
    import pandas as pd

    frames, seen = [], []
    for d in runs.dirs:
        label = results.run_label(results.read_meta(d)) or d.name
        for part in PARTS:
            df = _traced(str(d), part, files_stamp(d.glob("*.json.gz")))
            seen += df.attrs.get("traces", [])
            if len(df):
                frames.append(df.assign(part=part, label=label, run_id=d.name))
    if frames:
        df = pd.concat(frames, ignore_index=True).drop(columns=["match_key", "pg_desc", "pg_ranks", "seq", "device"])
        df = _tidy(df.drop(columns="run_id") if df["run_id"].nunique() == 1 else df)
    else:  # no traces: the rows each rank computed from its own trace (no cross-rank matching)
        rows = _rows(runs, "collective")
        df = _tidy(rows.assign(instance_min_us=rows["dur_us"], wait_us=float("nan"))) if len(rows) else rows.copy()
    df.attrs["traces"] = seen  # what the traces held: kit.traces.explain_empty says why there is nothing
    return df


def summary_table(runs):
    """Per part: count, p50 duration, p50/p90 busbw, p50 wait per (collective, bytes, group size)."""
    import pandas as pd

    df = collectives_table(runs)
    if df.empty:
        return traces.summary(df)
    keys = [k for k in ("label", "part") if k in df.columns]
    out = [traces.summary(g).assign(**dict(zip(keys, key if isinstance(key, tuple) else (key,))))
           for key, g in df.groupby(keys, sort=False)]
    return _tidy(pd.concat(out, ignore_index=True))


def _sweep(runs):
    """busbw of the recorded bandwidth sweep on the same GPU: per (collective, method, bytes); kernel time =
    min over ranks per sample, eager = max (kit.stats.per_sample)."""
    import pandas as pd

    gpu = (runs.meta.get("sysinfo") or {}).get("gpus") or [{}]
    rec = [d for d in results.choose("collectives", None, "recorded").dirs
           if ((results.read_meta(d).get("sysinfo") or {}).get("gpus") or [{}])[0].get("name") == gpu[0].get("name")]
    df = results.load(*rec) if rec and gpu[0].get("name") else pd.DataFrame()
    if df.empty:
        return pd.DataFrame(columns=["collective", "method", "bytes", "busbw_gbps"])
    world = int(df["world_size"].dropna().iloc[0]) if "world_size" in df.columns else 2
    out = []
    for m, how in (("kernel", "min"), ("eager", "max")):
        s = stats.slowest_rank_stats(df[df["method"] == m], ["collective", "bytes"], how=how)
        s["busbw_gbps"] = stats.gbps(s["bytes"], s["time_us_median"]) * s["collective"].map(lambda c: bus_factor(c, world))
        out.append(s.assign(method=m)[["collective", "method", "bytes", "busbw_gbps"]])
    return pd.concat(out, ignore_index=True)


def traced_vs_sweep(runs):
    """Traced busbw (p50, per-instance minimum over ranks) next to the sweep's kernel and eager busbw at the
    same size (log-log interpolation between the sweep's sizes); empty without traced collectives."""
    import numpy as np

    s = summary_table(runs)
    if s.empty:
        return s
    s = s[s["bytes"].notna() & (s["bytes"].astype(float) > 64)].copy()
    sw = _sweep(runs)
    for m in ("kernel", "eager"):
        vals = []
        for c, b in zip(s["collective"], s["bytes"].astype(float)):
            q = sw[(sw["collective"] == c) & (sw["method"] == m)].sort_values("bytes")
            ok = len(q) > 1 and q["bytes"].min() <= b <= q["bytes"].max()
            vals.append(float(np.interp(np.log2(b), np.log2(q["bytes"].astype(float)), q["busbw_gbps"])) if ok else np.nan)
        s[f"sweep_{m}_busbw_gbps"] = vals
    s["traced_vs_kernel"] = s["busbw_gbps_p50"].astype(float) / s["sweep_kernel_busbw_gbps"]
    keep = [c for c in ("label", "part", "collective", "bytes", "count", "busbw_gbps_p50", "sweep_kernel_busbw_gbps",
                        "sweep_eager_busbw_gbps", "traced_vs_kernel") if c in s.columns]
    return s[keep].reset_index(drop=True)


def overlap_table(runs):
    cols = ["label", "part", "rank", "comm_us", "overlapped_us", "exposed_us", "overlap_share", "compute_us", "steps"]
    o = _rows(runs, "overlap")
    return _tidy(o[[c for c in cols if c in o.columns]])


def steps_table(runs):
    """Time per step of each part: the slowest rank per sample, then stats (kit.stats)."""
    return _tidy(stats.slowest_rank_stats(_rows(runs, "step"), ["label", "part"]))


def _started(run_dir: Path) -> float:
    """Seconds since the epoch at which a run started, from its id (YYYYmmdd-HHMMSS-...); -inf if unreadable."""
    import calendar
    import time

    try:
        return float(calendar.timegm(time.strptime(run_dir.name[:15], "%Y%m%d-%H%M%S")))
    except ValueError:
        return float("-inf")


def _fr_demo_rows(runs):
    """The Flight Recorder demo's rows: ``kind=fr, tag=mismatch`` of these runs, else (runs recorded before the
    demo was part of the run) of the ``collective_tracing_fr`` run recorded next to each of them."""
    import pandas as pd

    fr = _rows(runs, "fr")
    if "tag" in fr.columns and (fr["tag"] == "mismatch").any():
        return fr[fr["tag"] == "mismatch"]
    found = []
    for d in runs.dirs:
        sib = [p for p in sorted((d.parent.parent / "collective_tracing_fr").glob("*"))
               if (p / "meta.json").exists() and 0 <= _started(p) - _started(d) <= 3600]
        if sib:  # the demo run started within the hour after this one
            df = results.load(sib[0])
            found.append(df[df["kind"] == "fr"] if "kind" in df.columns else df.iloc[0:0])
    return pd.concat(found, ignore_index=True) if found else fr.iloc[0:0]


def fr_table(runs):
    """Per (process group, sequence number) of the FR demo: the ranks that recorded it and those missing."""
    return traces.fr_mismatches(_fr_demo_rows(runs))


# ------------------------------------------------------------------------------------------------ figures
def traced_vs_sweep_figure(runs):
    import matplotlib.pyplot as plt

    from ... import plot

    s = summary_table(runs)
    s = s[s["bytes"].notna() & (s["bytes"].astype(float) > 64)] if len(s) else s
    if s.empty:
        return plot.message("no traced collective with a known size in these runs", runs.title)
    sw = _sweep(runs)
    colls = [c for c in ("all_reduce", "all_gather", "reduce_scatter") if c in set(s["collective"])]
    fig, axes = plt.subplots(1, len(colls), figsize=(5.2 * len(colls), 4), squeeze=False)
    for ax, coll in zip(axes.flat, colls):
        for m in ("kernel", "eager"):
            q = sw[(sw["collective"] == coll) & (sw["method"] == m)].sort_values("bytes")
            if len(q):
                ax.plot(q["bytes"], q["busbw_gbps"], label=f"sweep {m}", alpha=0.7)
        for part, marker in zip(PARTS, "os"):
            q = s[(s["collective"] == coll) & (s["part"] == part)]
            if len(q):
                ax.scatter(q["bytes"].astype(float), q["busbw_gbps_p50"], s=40, marker=marker,
                           label=f"traced {part} (p50)", zorder=3)
        plot.log2_bytes_axis(ax)
        ax.set_title(coll if len(sw) else f"{coll} (no recorded sweep on this GPU)")
        ax.set_ylabel("busbw (GB/s)")
        ax.legend(fontsize=7)
    fig.suptitle(runs.title, fontsize=9)
    fig.tight_layout()
    return fig


def timeline_figure(runs):
    """One DDP step (the last profiled one) of every rank on one clock: NCCL kernels red, compute blue."""
    from ... import plot

    found = traces.find_traces(runs, part="ddp")
    if not found:
        return plot.message("no DDP traces kept in these runs", runs.title)
    run_dir = found[0].run_dir
    ev = traces.aligned_gpu([f.path for f in found if f.run_dir == run_dir])
    k = ev[ev["cat"] == "kernel"]
    if k.empty:
        return plot.message("no GPU kernels in these traces (a gloo run): open them in Perfetto for the CPU view",
                     runs.title)
    steps = int((results.read_meta(run_dir).get("config") or {}).get("profile_steps") or 1)
    t0 = k["ts"].min() + (k["end"].max() - k["ts"].min()) * (1 - 1 / max(steps, 1))
    w = ev[ev["end"] > t0].assign(device=lambda x: "r" + x["rank"].astype(str))
    ax = plot.timeline(w, title="one DDP step, all ranks (NCCL red, compute blue)\n" + runs.title)
    return ax.figure


def overlap_figure(runs):
    import matplotlib.pyplot as plt

    ov = overlap_table(runs)
    if ov.empty:
        return plot.message("no overlap rows: they come from CUDA kernels (a CPU/gloo run has none)", runs.title)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    p = ov.pivot_table(index=["part", "rank"], values=["exposed_us", "overlapped_us"])
    p[["exposed_us", "overlapped_us"]].plot.barh(stacked=True, ax=ax, color=["#d62728", "#2ca02c"])
    steps = ov["steps"].dropna().iloc[0] if "steps" in ov.columns and ov["steps"].notna().any() else "the profiled"
    ax.set_xlabel(f"communication-kernel time over {steps:g} steps (us)" if not isinstance(steps, str)
                  else "communication-kernel time (us)")
    ax.set_title(runs.title, fontsize=9)
    return fig


# ------------------------------------------------------------------------------------------------ findings
def late_peer(df) -> Observation | None:
    """The instance that waited longest for a late peer, as a statement (None with one rank)."""
    if df.empty or "wait_us" not in df.columns or not df["wait_us"].notna().any():
        return None
    r = df.loc[df["wait_us"].astype(float).idxmax()]
    return Observation("late_peer_wait",
                       f"In a raw trace one rank's {r['collective']} took {r['dur_us']:.0f} us: it waited "
                       f"{r['wait_us']:.0f} us for its peer; the transfer itself, on the rank that arrived last, took "
                       f"{r['instance_min_us']:.0f} us", float(r["wait_us"]), "us")


def _busbw(s, part: str, coll: str, key: str, what: str) -> list[Observation]:
    q = s[(s["part"] == part) & (s["collective"] == coll) & s["bytes"].notna()] if len(s) else s
    q = q[q["busbw_gbps_p50"].notna()] if len(q) else q
    if q.empty:
        return []
    b = q.sort_values("bytes").iloc[-1]
    return [Observation(key, f"{what}: {int(b['count'])} x {coll} of {stats.human_bytes(float(b['bytes']), 3)} reach "
                         f"{b['busbw_gbps_p50']:.3g} GB/s busbw (p50; each instance timed on the rank that arrived "
                         f"last)", float(b["busbw_gbps_p50"]), "GB/s")]


def findings(runs) -> list[Observation]:
    s, c = summary_table(runs), collectives_table(runs)
    out: list[Observation] = []
    if s.empty:
        why = traces.explain_empty(c) if c.attrs.get("traces") else "no traces kept"
        out.append(Observation("no_collectives", f"no collective in these runs' traces: {why}"))
    out += _busbw(s, "ddp", "all_reduce", "ddp_bucket_busbw", "DDP gradient buckets")
    out += _busbw(s, "tp", "all_gather", "tp_all_gather_busbw", "TP forward")
    out += _busbw(s, "tp", "reduce_scatter", "tp_reduce_scatter_busbw", "TP forward")
    tvs = traced_vs_sweep(runs)
    q = tvs[(tvs["part"] == "ddp") & tvs["traced_vs_kernel"].notna()] if len(tvs) else tvs
    if len(q):
        r = q.sort_values("bytes").iloc[-1]
        out.append(Observation("ddp_vs_sweep", f"the DDP buckets reach {r['traced_vs_kernel']:.0%} of the bandwidth "
                                           f"sweep's kernel busbw at that size ({r['sweep_kernel_busbw_gbps']:.0f} GB/s)",
                               float(r["traced_vs_kernel"]), ""))
    ov = overlap_table(runs)
    for part, what in (("ddp", "backward compute"), ("tp", "the matmuls")):
        o = ov[ov["part"] == part] if len(ov) else ov
        if len(o):
            share = o["overlapped_us"].sum() / o["comm_us"].sum() if o["comm_us"].sum() else float("nan")
            out.append(Observation(f"{part}_overlap_share",
                                   f"{part.upper()}: {share:.0%} of the communication-kernel time ran beside {what} "
                                   f"({o['overlapped_us'].mean() / 1e3:.2f} of {o['comm_us'].mean() / 1e3:.2f} ms per "
                                   f"rank over the profiled steps); {o['exposed_us'].mean() / 1e3:.2f} ms exposed",
                                   float(share), ""))
    wait = late_peer(c)
    if wait is not None:
        out.append(wait)
    st = steps_table(runs)
    if len(st):
        out.append(Observation("step_ms", "time per step (median, slowest rank): " + ", ".join(
            f"{r.part} {r.time_us_median / 1e3:.2f} ms" for r in st.itertuples()), float(st["time_us_median"].iloc[0]) / 1e3, "ms"))
    mm = fr_table(runs)
    for text, (_, r) in zip(traces.fr_statements(mm), mm[mm["problem"] != ""].iterrows()):
        out.append(Observation("fr_missing_rank", "Flight Recorder: " + text,
                               float(r["missing"][0]) if r["missing"] else None, "rank"))
    return out


TABLES = {"collectives": collectives_table, "summary": summary_table, "traced_vs_sweep": traced_vs_sweep,
          "overlap": overlap_table, "steps": steps_table, "fr_mismatches": fr_table}
FIGURES = {"traced-vs-sweep": traced_vs_sweep_figure, "timeline-ranks": timeline_figure, "overlap": overlap_figure}
