"""Why the gap before NCCL kernels in a CUDA graph grows with N: the experiments that take it apart.

The finding (``kind=profile``) is that with NCCL's default ``NCCL_GRAPH_MIXING_SUPPORT=1`` the idle time before
each NCCL kernel of a replay grows with the number of layers N. NCCL's source says what it puts into the graph
(``src/misc/strongstream.cc`` at tag v2.28.9-1, ``ncclStrongStreamAcquire`` / ``ncclStrongStreamRelease``): with
mixing support, the first NCCL launch captured into a graph waits on NCCL's ``serialEvent`` with
``cudaEventWaitExternal`` (one EVENT_WAIT node), and *every* captured launch ends with an EVENT_RECORD node of
that same event on which the following NCCL launch depends -- so the mixing path adds a record node per
collective and a dependency from each record to the next NCCL kernel. These rows test what the gap depends on:

* ``kind=position`` -- the gap before every NCCL kernel of the profiled forwards with its position in the
  forward (0 .. N-1): does it grow along one replay (something accumulates) or is it uniform and set by N?
* ``kind=work``     -- at N = ``work_layers``, one factor at a time from the base model: the hidden size
  (``work_hidden``), TF32 (``work_tf32``), the dtype (``work_dtypes``) and a collective only every k-th layer
  (``work_every``): separates "NCCL nodes in the graph" from "graph duration" from "GEMM duration";
* ``kind=replay``   -- one replay at a time (the host synchronises after each) vs ``replays`` queued back to back,
  and the first replay of a fresh graph (it uploads the graph) vs the next: time per replay (CUDA events) and,
  ``kind=replay_gap``, the gaps before NCCL kernels in each way of replaying;
* ``kind=edge``     -- the dependency edges of the census graph (``census_layers`` layers, DOT dump), typed
  (``KERNEL:nccl``, ``KERNEL:other``, ``EVENT_RECORD``, ...): what each NCCL kernel and event node waits for;
* ``kind=launch_profile`` -- the launch benchmark's chain profiled per batch: kernels per forward, their sum, the
  heaviest kernel -- what makes one batch size GPU-bound where the others are launch-bound.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ... import gpu_profile, stats, timing, traces

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def gap_stats(g, calls: int) -> dict:
    """Count, median, p90 and sum per call of the gaps before NCCL and before other kernels (stalls left out)
    of a kit.traces.gaps frame -- the gap columns of every profile row (no NCCL kernel with one rank:
    ``gap_nccl_n`` 0, statistics NaN)."""
    import numpy as np

    ok = g[~g["stall"].astype(bool)] if len(g) else g
    out = {}
    for kind in ("nccl", "other"):
        v = ok[ok["before"] == kind]["gap_us"].to_numpy(dtype=float) if len(ok) else np.array([])
        st = stats.stats(v)
        out.update({f"gap_{kind}_n": st["n"], f"gap_{kind}_median_us": st["median"], f"gap_{kind}_p90_us": st["p90"],
                    f"gap_{kind}_sum_us": float(v.sum()) / calls})
    return out


def profile_gaps(fn, ctx, calls: int, threshold_us: float, export: str | None = None):
    """The GPU events of ``calls`` calls of ``fn`` and their gaps (kit.gpu_profile.profile_gpu, kit.traces.gaps);
    ``export``: also keep the trace there."""
    ev = gpu_profile.profile_gpu(fn, ctx, calls, export=export)
    return ev, traces.gaps(ev, threshold_us)


def position_rows(g, per_forward: int, **keys) -> list[dict]:
    """One row per NCCL kernel of the profiled forwards: its position inside its forward and the gap before
    it (a stall, above the threshold, is kept and flagged: the position analysis needs every kernel)."""
    n = g[g["before"] == "nccl"].sort_values("ts", kind="stable") if len(g) else g
    if not len(n) or per_forward < 1:
        return []
    idx = range(len(n))
    return [{"kind": "position", **keys, "forward": i // per_forward, "position": i % per_forward,
             "gap_us": float(gap), "stall": bool(st)} for i, gap, st in zip(idx, n["gap_us"], n["stall"])]


def _kernel_stats(ev, calls: int) -> dict:
    k = ev[ev["cat"] == "kernel"] if len(ev) else ev
    other, nccl = (k[~k["nccl"].astype(bool)], k[k["nccl"].astype(bool)]) if len(k) else (k, k)
    return {"kernels_per_forward": len(k) / calls,
            "compute_kernel_median_us": float(other["dur"].median()) if len(other) else None,
            "compute_sum_us": float(other["dur"].sum()) / calls if len(other) else 0.0,
            "nccl_kernel_median_us": float(nccl["dur"].median()) if len(nccl) else None}


def work_variants(cfg) -> list[tuple[str, dict]]:
    """The base model, then one factor changed at a time (so each row differs from the base in one thing)."""
    base = {"hidden": cfg.hidden, "dtype": cfg.dtype, "tf32": cfg.tf32, "every": 1}
    out = [("base", base)]
    out += [(f"hidden={h}", {**base, "hidden": h}) for h in cfg.work_hidden if h != cfg.hidden]
    if cfg.work_tf32 and not cfg.tf32 and cfg.dtype == "float32":
        out.append(("tf32", {**base, "tf32": True}))
    out += [(f"dtype={d}", {**base, "dtype": d}) for d in cfg.work_dtypes if d != cfg.dtype]
    out += [(f"every={k}", {**base, "every": k}) for k in cfg.work_every if k > 1]
    return out


def work(cfg, ctx, build_forward, capture, timed_rows):
    """``kind=work_time`` rows (every sample of the forward time) and ``kind=work`` rows (kernels, gaps before
    NCCL kernels) per variant, eager and graph."""
    import torch

    n = cfg.work_layers
    for label, v in work_variants(cfg):
        ctx.step(f"work {label}")
        torch.backends.cuda.matmul.allow_tf32 = v["tf32"]
        vcfg = replace(cfg, hidden=v["hidden"], dtype=v["dtype"], tf32=v["tf32"])
        fwd = build_forward(n, vcfg, ctx, comm=True, every=v["every"])
        g = capture(fwd, ctx)
        keys = dict(variant=label, layers=n, nccl_nodes=n // v["every"], world_size=ctx.world_size, **v)
        for mode, fn in (("eager", fwd), ("graph", g.replay)):
            s = timing.measure(fn, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup)
            yield from timed_rows(s, mode, kind="work_time", **keys)  # every sample kept
            ev, gaps = profile_gaps(fn, ctx, cfg.profile_forwards, cfg.gap_threshold_us)
            yield {"kind": "work", "mode": mode, **keys, **_kernel_stats(ev, cfg.profile_forwards),
                   **gap_stats(gaps, cfg.profile_forwards)}
        del g, fwd
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32


def replays(cfg, ctx, build_forward, capture):
    """``kind=replay`` / ``kind=replay_gap`` rows at N = ``work_layers`` (see the module docstring)."""
    import torch

    ctx.step("replays")
    fwd = build_forward(cfg.work_layers, cfg, ctx, comm=True)
    keys = dict(layers=cfg.work_layers, world_size=ctx.world_size)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(fn, calls: int = 1) -> float:
        ctx.barrier()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls

    g = capture(fwd, ctx)
    yield {"kind": "replay", "mode": "graph", "how": "first", "sample": 0, "time_us": timed(g.replay), **keys}
    yield {"kind": "replay", "mode": "graph", "how": "second", "sample": 0, "time_us": timed(g.replay), **keys}
    for i in range(cfg.replays):
        yield {"kind": "replay", "mode": "graph", "how": "synced", "sample": i, "time_us": timed(g.replay), **keys}
    for i in range(cfg.repeats):
        yield {"kind": "replay", "mode": "graph", "how": "queued", "sample": i,
               "time_us": timed(g.replay, cfg.replays), **keys}

    def synced():
        g.replay()
        torch.cuda.synchronize()

    fresh = capture(fwd, ctx)
    for how, fn, calls in (("first", fresh.replay, 1), ("second", fresh.replay, 1),
                           ("synced", synced, cfg.profile_forwards), ("queued", g.replay, cfg.profile_forwards)):
        ev, gaps = profile_gaps(fn, ctx, calls, cfg.gap_threshold_us)
        yield {"kind": "replay_gap", "mode": "graph", "how": how, "calls": calls, **keys, **gap_stats(gaps, calls)}
    del g, fresh, fwd
    torch.cuda.empty_cache()


def edge_rows(dot_text: str, **keys) -> list[dict]:
    """``kind=edge`` rows from a DOT dump (kit.traces.graph_edges)."""
    return [{"kind": "edge", "mode": "graph", **keys, **e} for e in traces.graph_edges(dot_text)]


def launch_profile(fwd, g, ctx, calls: int, threshold_us: float, **keys):
    """``kind=launch_profile`` rows: the chain's kernels per forward, eager and graphed."""
    for mode, fn in (("eager", fwd), ("graph", g.replay)):
        ev, gaps = profile_gaps(fn, ctx, calls, threshold_us)
        k = ev[ev["cat"] == "kernel"]
        top = k.groupby(k["name"].astype(str), observed=True)["dur"].agg(["sum", "median", "count"]) if len(k) else None
        heavy = top["sum"].idxmax() if top is not None and len(top) else ""
        span = float(ev["end"].max() - ev["ts"].min()) / calls if len(ev) else None
        yield {"kind": "launch_profile", "mode": mode, **keys, **_kernel_stats(ev, calls),
               "busy_share": (float(k["dur"].sum()) / calls / span) if span else None,
               "heaviest_kernel": heavy[:120], "heaviest_median_us": float(top.loc[heavy, "median"]) if heavy else None,
               "heaviest_per_forward": float(top.loc[heavy, "count"]) / calls if heavy else None,
               **gap_stats(gaps, calls)}


# ------------------------------------------------------------------------------------------------ analyses
def _rows(df, kind: str) -> "pd.DataFrame":
    from .analysis import rows

    d = rows(df)
    return d[d["kind"] == kind].dropna(axis=1, how="all")


def position_table(df, bins: int = 4) -> "pd.DataFrame":
    """The gap before NCCL kernels by position along the forward, per (label, layers, mode, stream): the median gap in
    each quarter of the forward (``q1`` first layers .. ``q4`` last), the first kernel's own gap (it follows the
    previous replay, or the barrier), and the slope of a least-squares line through all gaps (us per layer)."""
    import numpy as np
    import pandas as pd

    d = _rows(df, "position")
    cols = ["label", "layers", "mode", "stream", "first_us"] + [f"q{i + 1}_us" for i in range(bins)] + [
        "slope_us_per_layer", "kernels"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for (label, n, mode, stream), g in d.groupby(["label", "layers", "mode", "stream"]):
        n = int(n)
        first = g[g["position"] == 0]
        g = g[g["position"] > 0]  # position 0: waits for whatever came before the forward
        q = np.minimum((g["position"].to_numpy() * bins) // max(n, 1), bins - 1)
        med = g.groupby(q)["gap_us"].median()
        slope = float(np.polyfit(g["position"], g["gap_us"], 1)[0]) if g["position"].nunique() > 2 else float("nan")
        out.append({"label": label, "layers": n, "mode": mode, "stream": stream,
                    "first_us": float(first["gap_us"].median()),
                    **{f"q{i + 1}_us": float(med.get(i, float("nan"))) for i in range(bins)},
                    "slope_us_per_layer": slope, "kernels": len(g)})
    return pd.DataFrame(out, columns=cols)


WORK_COLUMNS = ["nccl_nodes", "hidden", "dtype", "tf32", "every"]


def work_table(df) -> "pd.DataFrame":
    """Per (label, variant): forward time eager and graph (slowest rank per sample, median), graph/eager, the
    compute kernels' median duration, and the median gap before NCCL and before other kernels in each mode."""
    import pandas as pd

    w, t = _rows(df, "work"), _rows(df, "work_time")
    if w.empty:
        return pd.DataFrame()
    keys = ["label", "variant"]
    # one rank (one GPU) has no NCCL kernel and so no gap before one: those columns are absent, not an error
    gaps = [c for c in ("gap_nccl_median_us", "gap_other_median_us") if c in w.columns]
    prof = w.groupby(keys + ["mode"]).agg(
        **{c: (c, "first") for c in WORK_COLUMNS if c in w.columns},
        **{c: (c, "median") for c in ["compute_kernel_median_us"] + gaps if c in w.columns}).reset_index()
    base = prof[prof["mode"] == "graph"].set_index(keys)[[c for c in WORK_COLUMNS + ["compute_kernel_median_us"]
                                                          if c in prof.columns]]
    out = base
    if gaps:
        wide = prof.pivot_table(index=keys, columns="mode", values=gaps)
        wide.columns = [f"{a.replace('_median_us', '')}_{b}_us" for a, b in wide.columns]
        out = base.join(wide)
    if not t.empty:
        s = stats.slowest_rank_stats(t, keys + ["mode"])
        ft = s.pivot_table(index=keys, columns="mode", values="time_us_median")
        ft.columns = [f"forward_{c}_us" for c in ft.columns]
        out = out.join(ft)
        if {"forward_graph_us", "forward_eager_us"} <= set(out.columns):
            out["graph_over_eager"] = out["forward_graph_us"] / out["forward_eager_us"]
    return out.reset_index()


def replay_table(df) -> "pd.DataFrame":
    """Per (label, how): time per replay (median and p90 over samples, slowest rank) and the gaps before NCCL
    kernels in that way of replaying (``first`` = the first replay of a fresh graph, with its upload)."""
    import pandas as pd

    r, g = _rows(df, "replay"), _rows(df, "replay_gap")
    if r.empty:
        return pd.DataFrame()
    s = stats.slowest_rank_stats(r, ["label", "how"])[["label", "how", "time_us_median", "time_us_p90"]]
    gaps = [c for c in ("gap_nccl_median_us", "gap_nccl_p90_us", "gap_other_median_us") if c in g.columns]
    if not g.empty and gaps:  # one rank has no NCCL kernel, so no gap before one
        s = s.merge(g.groupby(["label", "how"])[gaps].median().reset_index(), on=["label", "how"], how="left")
    order = {"first": 0, "second": 1, "synced": 2, "queued": 3}
    return s.sort_values(["label", "how"], key=lambda c: c.map(order) if c.name == "how" else c).reset_index(drop=True)


def edges_table(df) -> "pd.DataFrame":
    """Dependency edges of the census graph by (source type -> destination type), rank 0, one column per label:
    e.g. ``EVENT_RECORD -> KERNEL:nccl`` counts NCCL kernels that wait for an event-record node."""
    import pandas as pd

    e = _rows(df, "edge")
    if e.empty:
        return pd.DataFrame()
    if "rank" in e.columns:
        e = e[e["rank"] == e["rank"].min()]
    e = e.assign(edge=e["src_type"] + " -> " + e["dst_type"])
    t = e.pivot_table(index="edge", columns="label", values="src", aggfunc="count").fillna(0).astype(int)
    t.columns.name = None
    return t


def launch_profile_table(df) -> "pd.DataFrame":
    """The launch chain per batch and mode (rank 0): kernels per forward, their summed time, the GPU's busy share
    of the profiled span, the heaviest kernel (name, median, per forward) and the median gap between kernels."""
    d = _rows(df, "launch_profile")
    if d.empty:
        return d
    if "rank" in d.columns:
        d = d[d["rank"] == d["rank"].min()]
    cols = ["batch", "mode", "kernels_per_forward", "compute_sum_us", "busy_share", "heaviest_kernel",
            "heaviest_median_us", "heaviest_per_forward", "gap_other_median_us"]
    d = d.groupby(["batch", "mode"], as_index=False).first()
    d["batch"] = d["batch"].astype(int)
    d["heaviest_kernel"] = d["heaviest_kernel"].astype(str).str.slice(0, 60)
    return d[[c for c in cols if c in d.columns]].sort_values(["batch", "mode"]).reset_index(drop=True)


def gap_by_position(runs):
    """The gap before each NCCL kernel of the replays against its layer index, one line per N (median over
    the profiled forwards and ranks), per label; eager dotted."""
    import matplotlib.pyplot as plt

    from ... import plot

    d = _rows(runs.df, "position")
    if d.empty:
        return plot.message("no per-position gaps: needs the mechanism rows (CUDA, 2+ ranks)", runs.title)
    labels = sorted(d["label"].unique())
    fig, axes = plt.subplots(1, len(labels), figsize=(5.5 * len(labels), 4), squeeze=False, sharey=True)
    for ax, label in zip(axes[0], labels):
        for (n, mode, stream), g in d[d["label"] == label].groupby(["layers", "mode", "stream"]):
            m = g.groupby("position")["gap_us"].median()
            ax.plot(m.index, m.values, ls="-" if mode == "graph" else ":", lw=1,
                    label=f"N={int(n)} {mode}" + (f" @{stream}" if mode == "graph" and stream != "legacy" else ""))
        ax.set_yscale("log")
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(left=0)
        ax.set_xlabel("position of the NCCL kernel in the forward (layer index)")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7, ncol=2)
    axes[0][0].set_ylabel("gap before the NCCL kernel (us)")
    fig.suptitle(runs.title, fontsize=9)
    fig.tight_layout()
    return fig


def gap_vs_work(runs):
    """Median gap before NCCL kernels in graph replay against the compute kernels' median duration, one point
    per work variant and label (eager as hollow markers)."""
    import matplotlib.pyplot as plt

    from ... import plot

    w = work_table(runs.df)
    if w.empty or "gap_nccl_graph_us" not in w.columns:
        return plot.message("no work rows: needs the mechanism rows (CUDA, 2+ ranks)", runs.title)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (label, g) in enumerate(w.groupby("label")):
        c = f"C{i}"
        ax.scatter(g["compute_kernel_median_us"], g["gap_nccl_graph_us"], color=c, label=f"{label} graph")
        ax.scatter(g["compute_kernel_median_us"], g["gap_nccl_eager_us"], facecolors="none", edgecolors=c,
                   label=f"{label} eager")
        for r in g.itertuples():
            ax.annotate(r.variant, (r.compute_kernel_median_us, r.gap_nccl_graph_us), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("median compute (GEMM) kernel (us)")
    ax.set_ylabel("median gap before NCCL kernel (us)")
    ax.legend(fontsize=7)
    ax.set_title(runs.title, fontsize=9)
    return fig
