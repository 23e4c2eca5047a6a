"""Tables of graph_gaps, from the rows of a :class:`kit.results.RunSet` (and the traces its runs kept).

* ``forward`` -- time per forward (slowest rank per sample, kit.stats), graph/eager, kernel sum and overhead;
* ``gaps``    -- the gap before NCCL kernels (and before other kernels) per label, N and mode;
* ``census``  -- node types of the captured graph per label;
* ``launch``  -- the launch-overhead benchmarks, eager vs graph, and the speedup.

Rows recorded by earlier versions of the kit read the same (they already say ``mode``; ``world_size`` is
missing and taken as 2; ``stream`` is missing and is ``legacy``: those runs replayed with ``g.replay()`` on the
current stream, which they never set -- :mod:`.streams`). Every table keeps the replay stream apart. Every
function returns an empty frame when the rows it needs are absent: a CPU run has no profile, census or launch rows;
with one rank the ``allreduce`` model launches no NCCL kernel, and the gap columns say so (``nccl_kernels`` 0,
``note``) instead of showing numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import results, stats, traces

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

BY = ["label", "model", "layers", "mode", "stream"]
NO_NCCL = "no NCCL kernel: one rank (NCCL launches none); the gap before NCCL needs 2+ ranks"
GAP_COLUMNS = ["gap_nccl_median_us", "gap_nccl_p90_us", "gap_other_median_us"]
LEGACY = "legacy"


def rows(df) -> "pd.DataFrame":
    """The rows with ``kind``, ``label`` and ``mode`` present (rows written before ``mode`` was the one name
    carry it in ``method``)."""
    import pandas as pd

    if df is None or df.empty or "kind" not in df.columns:
        return pd.DataFrame(columns=["kind", "rank", "label", "model", "layers", "mode", "stream", "sample", "time_us"])
    df = df.copy()
    if "mode" not in df.columns:
        df["mode"] = df["method"] if "method" in df.columns else None
    if "label" not in df.columns:
        df["label"] = "run"
    # the stream a graph was replayed into; eager rows and rows from before the factor: the legacy default stream
    df["stream"] = df["stream"].fillna(LEGACY) if "stream" in df.columns else LEGACY
    return df


def _kind(df, kind: str) -> "pd.DataFrame":
    return df[df["kind"] == kind]


def forward_table(df) -> "pd.DataFrame":
    """Median time per forward by (label, model, layers, mode), graph/eager ratio and overhead over the
    kernel sum (time per forward minus the summed kernel durations of one forward), with the gap columns."""
    df = rows(df)
    s = stats.slowest_rank_stats(_kind(df, "time"), BY)
    if s.empty:
        return s
    s["layers"] = s["layers"].astype(int)
    p = _kind(df, "profile")
    if not p.empty:
        p = p.assign(layers=p["layers"].astype(int))
        ks = p.groupby(BY)[GAP_COLUMNS].median().reset_index()
        # kernel sum: the rank whose NCCL kernels waited least for a peer (min over ranks), as in collectives
        ks = ks.merge(p.groupby(BY)["kernel_sum_us"].min().reset_index(), on=BY)
        s = s.merge(ks, on=BY, how="left")
        s["overhead_us"] = s["time_us_median"] - s["kernel_sum_us"]
    eager = s[s["mode"] == "eager"].groupby(["label", "model", "layers"])["time_us_median"].first()
    s["graph_over_eager"] = [
        r.time_us_median / eager.get((r.label, r.model, r.layers), float("nan")) if r.mode == "graph" else float("nan")
        for r in s.itertuples()]
    return s


def gaps_table(df) -> "pd.DataFrame":
    """The gap before NCCL kernels of the ``allreduce`` model per (label, layers, mode): medians over ranks of
    each rank's median and p90, the gap before other kernels beside it, and how many NCCL kernels a rank saw
    per trace (``nccl_kernels``; 0 with one rank, then ``note`` says so)."""
    import pandas as pd

    p = rows(df)
    p = p[p["kind"] == "profile"]
    p = p[p["model"] == "allreduce"] if "model" in p.columns else p.iloc[0:0]
    if p.empty:
        return pd.DataFrame(columns=BY + GAP_COLUMNS + ["nccl_kernels", "note"])
    p = p.assign(layers=p["layers"].astype(int))
    g = p.groupby(BY)[GAP_COLUMNS + ["gap_nccl_n"]].median().reset_index()
    g = g.rename(columns={"gap_nccl_n": "nccl_kernels"})
    g["nccl_kernels"] = g["nccl_kernels"].fillna(0).round().astype(int)
    g["note"] = [NO_NCCL if not n else "" for n in g["nccl_kernels"].fillna(0)]
    return g


def census_table(df) -> "pd.DataFrame":
    """Node types of the captured graph (rank 0's), one column per label."""
    import pandas as pd

    c = rows(df)
    c = c[c["kind"] == "census"]
    if c.empty or not {"node_type", "count"} <= set(c.columns):
        return pd.DataFrame()
    if "rank" in c.columns:
        c = c[c["rank"] == c["rank"].min()]
    t = c.pivot_table(index="node_type", columns="label", values="count", aggfunc="first").fillna(0).astype(int)
    t.columns.name = None
    return t


def launch_table(df) -> "pd.DataFrame":
    """Time per call, eager and graph, and speedup = eager / graph per (bench, batch), rank 0. The benchmark
    has no collective, so every run analysed contributes samples (the env settings do not touch it)."""
    import pandas as pd

    d = rows(df)
    d = d[d["kind"] == "launch"]
    if "rank" in d.columns:
        d = d[d["rank"] == d["rank"].min()]
    s = stats.summarize(d, ["bench", "batch", "mode"])
    if s.empty or not {"eager", "graph"} <= set(s["mode"]):
        return pd.DataFrame(columns=["bench", "batch", "eager", "graph", "speedup"])
    w = s.pivot_table(index=["bench", "batch"], columns="mode", values="time_us_median")
    w["speedup"] = w["eager"] / w["graph"]
    w.columns.name = None
    w = w.reset_index()
    w["batch"] = w["batch"].astype(int)
    return w


def kept_trace_gaps(run_dirs, threshold_us: float = traces.DEFAULT_STALL_US, **tags) -> "pd.DataFrame":
    """Every kernel gap from the traces kept in ``run_dirs`` (kit.traces.find_traces; ``tags`` narrow it, e.g.
    ``model="allreduce"``): the columns of kit.traces.gaps plus label, model, layers, mode, rank, trace."""
    import pandas as pd

    frames = []
    for f in traces.find_traces(run_dirs, **tags):
        if not {"model", "layers", "mode"} <= set(f.tags):
            continue
        g = traces.gaps(traces.load_trace(f.path, cpu="none").gpu, threshold_us)
        label = results.run_label(results.read_meta(f.run_dir)) or f.run_dir.name
        frames.append(g.assign(label=label, model=f.tags["model"], layers=int(f.tags["layers"]), mode=f.tags["mode"],
                               rank=f.rank, trace=f.path.name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def one_layer_window(events, threshold_us: float = traces.DEFAULT_STALL_US) -> "pd.DataFrame":
    """The GPU events of one representative layer: the NCCL kernel whose gap before it is the median of all
    gaps before NCCL kernels in this trace, with what ran since the previous NCCL kernel ended (the GEMM,
    the gap, the NCCL kernel). Without NCCL kernels: every event."""
    g = traces.gaps(events, threshold_us)
    g = g[(g["before"] == "nccl") & ~g["stall"].astype(bool)].sort_values("gap_us").reset_index(drop=True)
    k = events.sort_values("ts")
    if g.empty:
        return k
    pick = g.iloc[len(g) // 2]
    nccl = k[k["nccl"].astype(bool)]
    prev = nccl[nccl["end"] <= pick["ts"]]
    t0 = prev["end"].iloc[-1] if len(prev) else pick["ts"] - 50
    return k[(k["end"] > t0 - 2) & (k["ts"] < pick["end"] + 2)]


def threshold(runs) -> float:
    """The runs' ``gap_threshold_us`` (from their config), else kit.traces' default."""
    return float((runs.meta.get("config") or {}).get("gap_threshold_us", traces.DEFAULT_STALL_US))


# ``tables`` of the investigation: RunSet -> DataFrame
def table_forward(runs):
    return forward_table(runs.df)


def table_gaps(runs):
    return gaps_table(runs.df)


def table_census(runs):
    return census_table(runs.df)


def table_launch(runs):
    return launch_table(runs.df)
