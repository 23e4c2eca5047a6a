"""Analyses of dataloader_sync runs (kit.contract): the tables and figures of a :class:`kit.results.RunSet`
(the findings, built on these tables: :mod:`.findings`).

Every step time is summarised the same way: per step index the slowest rank (:func:`kit.stats.per_sample`,
``max``), then the median over steps (:func:`kit.stats.summarize`). Rows recorded before the experiment contract
call the step index ``step`` (now ``sample``); :func:`rows` fills one from the other, so old runs read as new.

What each analysis needs, and what it says when it is missing (never an exception):

* ``breakdown``, ``buckets``, ``step-breakdown``, ``bucket-curve``: step rows -- any run, CPU and one rank
  included (without CUDA only ``pageable`` runs: a copy to the CPU is a no-op, so host blocking needs a GPU).
* ``event_vs_kernel``: per-parameter all-reduce timings (CUDA only) and, for the kernel column, the kept
  ``pageable+per_param`` traces of a run with 2+ ranks: with one rank NCCL launches no kernel.
* ``grad_sync``: the ``flat`` mode's all-reduce with 2+ ranks (busbw is 0 on one rank: nothing crosses a link);
  the sweep rows beside it come from the recorded ``collectives`` run, shown for CUDA runs only.
* ``overlap``: DDP's communication kernels in the profiler trace: CUDA and 2+ ranks.
"""

from __future__ import annotations

from kit import results, stats
from kit.collective_ops import bus_factor

from .config import CUDA_ONLY_H2D, DDP_DEFAULT_BUCKET_MB, H2D_MODES, SYNC_MODES

PARTS = ["data_wait_us", "h2d_us", "forward_us", "backward_us", "sync_us", "optimizer_us"]
"""the parts of a step, in the order they happen (stacked in step-breakdown)"""
TIMES = PARTS + ["step_us", "step_host_us", "h2d_host_us", "wall_per_step_us"]
KEYS = ["h2d", "sync", "bucket_cap_mb"]
ONE_RANK = "with one rank NCCL launches no kernel and nothing crosses a link"


# ------------------------------------------------------------------------------------------------ rows
def _frame(runs):
    import pandas as pd

    df = getattr(runs, "df", runs)
    return df if isinstance(df, pd.DataFrame) else pd.DataFrame()


def rows(runs, kind: str):
    """The rows of one ``kind`` (a RunSet or a DataFrame), with ``sample`` (old rows: ``step``) and the key
    columns present; an empty frame when there are none."""
    import pandas as pd

    df = _frame(runs)
    if df.empty or "kind" not in df.columns:
        return pd.DataFrame(columns=["kind", *KEYS, "sample"])
    d = df[df["kind"] == kind].copy()
    if "step" in d.columns:
        d["sample"] = d["sample"].fillna(d["step"]) if "sample" in d.columns else d["step"]
    for k in KEYS + ["sample"]:
        if k not in d.columns:
            d[k] = float("nan")
    return d


def ranks(runs) -> int:
    """How many ranks the step rows come from (0 without step rows)."""
    s = rows(runs, "step")
    return int(s["rank"].nunique()) if "rank" in s.columns and len(s) else 0


def on_cuda(runs) -> bool:
    """These runs ran on GPUs: their metadata says nccl, or a CUDA-only H2D mode has step rows."""
    if getattr(runs, "dirs", None) and getattr(runs, "cuda", False):
        return True
    return bool(set(rows(runs, "step")["h2d"].dropna()) & CUDA_ONLY_H2D)


def _ordered(df):
    """Rows in the modes' own order (pageable first, per_param first), buckets ascending."""
    if df.empty:
        return df
    order = {m: i for i, m in enumerate(H2D_MODES + SYNC_MODES)}
    return df.assign(_h=df["h2d"].map(order), _s=df["sync"].map(order)).sort_values(
        ["_h", "_s", "bucket_cap_mb"], na_position="first").drop(columns=["_h", "_s"]).reset_index(drop=True)


def breakdown(runs):
    """Per configuration (h2d, sync, bucket): the median over steps of the slowest rank, every time column
    (microseconds). Empty (with the key columns) without step rows."""
    import pandas as pd

    s = rows(runs, "step")
    cols = [c for c in TIMES if c in s.columns and s[c].notna().any()]
    if s.empty or not cols:
        return pd.DataFrame(columns=KEYS + TIMES)
    out = None
    for c in cols:
        m = stats.slowest_rank_stats(s, KEYS, value=c)[KEYS + [f"{c}_median"]].rename(columns={f"{c}_median": c})
        out = m if out is None else out.merge(m, on=KEYS, how="outer")
    return _ordered(out)


def _default_buckets(b):
    """The configurations at PyTorch's default bucket size (plus one bucket): one row per (h2d, sync)."""
    ddp_default = (b["sync"] == "ddp") & (b["bucket_cap_mb"] == DDP_DEFAULT_BUCKET_MB)
    return b[b["bucket_cap_mb"].isna() | ddp_default | (b["sync"] == "ddp_one_bucket")].reset_index(drop=True)


def _ms(df):
    """The same table with every ``*_us`` column in milliseconds, renamed ``*_ms``."""
    us = [c for c in df.columns if c.endswith("_us")]
    return df.assign(**{c: df[c] / 1e3 for c in us}).rename(columns={c: c[:-3] + "_ms" for c in us})


# ------------------------------------------------------------------------------------------------ tables
def table_breakdown(runs):
    """Step time part by part (ms), one row per (h2d, sync) at the default bucket size."""
    b = _default_buckets(breakdown(runs))
    return _ms(b[[c for c in ["h2d", "sync"] + TIMES if c in b.columns]])


def _sweep_h2d(dd) -> str | None:
    swept = dd[(dd["sync"] == "ddp") & (dd["bucket_cap_mb"] != DDP_DEFAULT_BUCKET_MB)]
    if len(swept):
        return swept["h2d"].iloc[0]
    return "prefetch" if "prefetch" in set(dd["h2d"]) else (dd["h2d"].iloc[0] if len(dd) else None)


def table_buckets(runs):
    """DDP step time against bucket_cap_mb (ms), for the H2D mode the sweep ran with, and one bucket."""
    b = breakdown(runs)
    dd = b[b["sync"].isin(["ddp", "ddp_one_bucket"])]
    h = _sweep_h2d(dd)
    dd = dd[dd["h2d"] == h].sort_values("bucket_cap_mb")
    return _ms(dd[[c for c in ["h2d", "sync", "bucket_cap_mb", "backward_us", "step_us"] if c in dd.columns]])


def _kernel_times(dirs, h2d: str):
    """Median NCCL all-reduce kernel duration per byte count in the kept ``<h2d>+per_param`` traces of each run
    (per instance the minimum over ranks: the transfer itself); empty when no trace has one (one rank: NCCL
    launches no kernel; or no trace kept)."""
    import pandas as pd

    from kit.traces import collectives, find_traces

    parts = []
    for d in dirs:
        c = collectives([f.path for f in find_traces(d, h2d=h2d, sync="per_param")])
        c = c[(c["collective"] == "all_reduce") & (c["bytes"].fillna(0) > 64)]  # drop the 4-byte barriers
        parts.append(c[["bytes", "instance_min_us"]].astype(float))
    if not any(len(p) for p in parts):
        return pd.DataFrame(columns=["bytes", "kernel_us"], dtype=float)
    return pd.concat(parts).groupby("bytes")["instance_min_us"].median().rename("kernel_us").reset_index()


def table_event_vs_kernel(runs, h2d: str = "pageable"):
    """Per parameter of the per_param loop: its all-reduce timed with CUDA events on the default stream (the
    report's way; median over steps and ranks) and the NCCL kernel's duration from the kept traces
    (``kernel_us``: NaN where no trace has it -- one rank, or traces not kept)."""
    import pandas as pd

    p = rows(runs, "param_allreduce")
    p = p[p["h2d"] == h2d]
    if p.empty or "event_us" not in p.columns:
        return pd.DataFrame(columns=["param", "bytes", "bytes_MB", "event_us", "kernel_us"])
    ev = p.groupby("param").agg(bytes=("bytes", "first"), event_us=("event_us", "median")).reset_index()
    ev = ev.merge(_kernel_times(getattr(runs, "dirs", []) or [], h2d), on="bytes", how="left")
    ev.insert(2, "bytes_MB", ev["bytes"] / 1e6)
    return ev


def _sweep_rows(nbytes: int, emulated_nodes: bool = False) -> list[dict]:
    """The recorded collectives sweep's all_reduce at the size nearest ``nbytes``, summarised the sweep's own
    way (kit.investigations.collectives: eager the slowest rank per sample, kernel the rank that waited least,
    nccl-tests as printed; medians) -- from the same regime: the emulated-nodes sweep for runs on emulated
    nodes (kit.launch.emulated), else the one-node sweep."""
    from kit.investigations.collectives.analysis import summarize
    from kit import regimes as kit_regimes

    rec = kit_regimes.recorded("collectives", emulated=emulated_nodes).dirs
    s = summarize(results.load(*rec)) if rec else None
    if s is None or s.empty:
        return []
    s = s[s["collective"] == "all_reduce"]
    near = s.iloc[(s["bytes"] - nbytes).abs().argsort()]["bytes"].iloc[0] if len(s) else None
    return [{"h2d": f"sweep {m} @ {near / 2**20:.0f} MiB", "bytes": int(near), "sync_ms": q["time_us_median"] / 1e3,
             "algbw_gbps": q["algbw_gbps"], "busbw_gbps": q["busbw_gbps"]}
            for m in ("eager", "kernel", "nccl-tests") for _, q in s[(s["bytes"] == near) & (s["method"] == m)].iterrows()]


def table_grad_sync(runs):
    """The flat mode's one all-reduce of every gradient: its busbw in training (sync time: CUDA events on the
    default stream), beside the collectives sweep at the nearest size. Needs 2+ ranks."""
    import pandas as pd

    gs, n = rows(runs, "grad_sync"), ranks(runs)
    flat = breakdown(runs)
    flat = flat[flat["sync"] == "flat"]
    if gs.empty or n < 2 or flat.empty or "sync_us" not in flat.columns:
        return pd.DataFrame(columns=["h2d", "bytes", "sync_ms", "algbw_gbps", "busbw_gbps"])
    nbytes = int(gs["bytes"].iloc[0])
    alg = stats.gbps(nbytes, flat["sync_us"].to_numpy())
    g = pd.DataFrame({"h2d": flat["h2d"].to_numpy(), "bytes": nbytes, "sync_ms": flat["sync_us"].to_numpy() / 1e3,
                      "algbw_gbps": alg, "busbw_gbps": alg * bus_factor("all_reduce", n)})
    from kit import regimes as kit_regimes

    emu = any(kit_regimes.is_emulated(m) for m in getattr(runs, "metas", []))
    return pd.concat([g, pd.DataFrame(_sweep_rows(nbytes, emu) if on_cuda(runs) else [])], ignore_index=True)


def table_overlap(runs):
    """DDP's communication vs compute in the profiled steps: NCCL-kernel time, the part overlapped by other
    kernels, the exposed part and the share hidden (median over ranks). Needs CUDA and 2+ ranks."""
    import pandas as pd

    cols = ["comm_us", "overlapped_us", "exposed_us", "overlap_share"]
    ov = rows(runs, "overlap")
    if ov.empty or "comm_us" not in ov.columns:
        return pd.DataFrame(columns=KEYS + cols)
    ov = ov[ov["comm_us"] > 0]  # one rank: NCCL ran no kernel, nothing to overlap
    if ov.empty:
        return pd.DataFrame(columns=KEYS + cols)
    return _ordered(ov.groupby(KEYS, dropna=False)[cols].median().reset_index())


def table_skipped(runs):
    """The configurations a run could not measure, and why (e.g. CUDA-only H2D modes on CPU)."""
    import pandas as pd

    sk = rows(runs, "skipped")
    if sk.empty or "reason" not in sk.columns:
        return pd.DataFrame(columns=["h2d", "reason"])
    return sk.drop_duplicates(["h2d"])[["h2d", "reason"]].reset_index(drop=True)


# ------------------------------------------------------------------------------------------------ figures
def _axes(runs, size: tuple[float, float], missing: str | None, title: str = ""):
    """``(fig, ax)`` of a figure titled with the runs' hardware; when ``missing`` is a text, the axes say it
    instead of holding a plot (the figure keeps its size, so a report's layout does not jump)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    ax.set_title((title + "\n" if title else "") + (getattr(runs, "title", "") or ""), fontsize=9)
    if missing:
        ax.axis("off")
        ax.text(0.5, 0.5, missing, ha="center", va="center", wrap=True, fontsize=10, transform=ax.transAxes)
    return fig, ax


def fig_step_breakdown(runs):
    """Stacked parts of a step (ms, median of the slowest rank), per (h2d, sync) at the default bucket size."""
    t = table_breakdown(runs)
    parts = [p[:-3] + "_ms" for p in PARTS if p[:-3] + "_ms" in t.columns]
    empty = t.empty or not parts
    fig, ax = _axes(runs, (10, 4.5), "no step rows in these runs: nothing to break down" if empty else None)
    if not empty:
        t.set_index(["h2d", "sync"])[parts].plot.bar(stacked=True, ax=ax, width=0.8)
        ax.set_ylabel("ms per step (median)")
        ax.set_xlabel("H2D mode, sync mode")
        ax.legend([p[:-3] for p in parts], fontsize=8)
    return fig


def fig_event_vs_kernel(runs):
    """Per-parameter all-reduce: CUDA events on the default stream vs the NCCL kernel, against gradient bytes."""
    evk = table_event_vs_kernel(runs)
    fig, ax = _axes(runs, (7, 4), "no per-parameter all-reduce timings in these runs: they are taken with CUDA "
                    "events (pageable + per_param on GPUs)" if evk.empty else None)
    if evk.empty:
        return fig
    ax.scatter(evk["bytes"], evk["event_us"], label="CUDA events on the default stream (the report's way)")
    if evk["kernel_us"].notna().any():
        ax.scatter(evk["bytes"], evk["kernel_us"], label="NCCL kernel (profiler)", marker="x")
    else:
        ax.text(0.02, 0.97, "no NCCL kernel in the kept traces:\nwith one rank NCCL launches none (or no trace was kept)",
                transform=ax.transAxes, fontsize=8, va="top")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("gradient bytes")
    ax.set_ylabel("us")
    ax.legend(fontsize=8)
    return fig


def fig_bucket_curve(runs):
    """DDP step time against bucket_cap_mb, with the one-bucket (no overlap) step as a line."""
    dd = table_buckets(runs)
    x = dd[dd["sync"] == "ddp"] if "sync" in dd.columns else dd
    empty = x.empty or "step_ms" not in x.columns
    fig, ax = _axes(runs, (6.5, 4), "no DDP step rows in these runs: no bucket curve" if empty else None,
                    "" if empty else f"{x['h2d'].iloc[0]} H2D")
    if empty:
        return fig
    ax.plot(x["bucket_cap_mb"], x["step_ms"], marker="o", label="ddp")
    one = dd[dd["sync"] == "ddp_one_bucket"]
    if len(one):
        ax.axhline(one["step_ms"].iloc[0], color="grey", ls="--", label="one bucket (no overlap)")
    ax.set_xscale("log")
    ax.set_xlabel("bucket_cap_mb")
    ax.set_ylabel("ms per step")
    ax.legend()
    return fig
