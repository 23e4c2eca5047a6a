"""The measured statements of graph_gaps, stated from the rows (never pre-written): the gap before NCCL kernels
per mode and setting across N, graph/eager at the largest N, the graph census's event nodes, and the speedup
graphs give where launches dominate. Runs without CUDA or with one rank get a statement of what they lack."""

from __future__ import annotations

from ...contract import Observation
from .analysis import LEGACY, NO_NCCL, census_table, forward_table, gaps_table, launch_table, rows
from .mechanism import edges_table, launch_profile_table, position_table, replay_table, work_table
from .stream_factor import stream_findings
from .streams import STREAMS


def _fmt(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.0f}"


_ORDER = {"graph": 0, "eager": 1, **{s: i for i, s in enumerate(STREAMS)}}


def _at(stream: str) -> str:
    """The suffix a statement about a graph replayed into ``stream`` carries (none for the legacy stream: the
    statements of runs recorded before the stream factor keep their keys)."""
    return "" if stream == LEGACY else f" @{stream}"


def _ordered(groups, labels: list[str]) -> list:
    """``list(df.groupby(...))`` sorted: labels in the runs' order (the first run's first), graph before eager,
    streams in :data:`.streams.STREAMS` order."""
    rank = {lab: i for i, lab in enumerate(labels)}

    def order(item):
        key = item[0] if isinstance(item[0], tuple) else (item[0],)
        return tuple(rank[x] if x in rank else _ORDER.get(x, len(_ORDER)) for x in key)

    return sorted(groups, key=order)


def _gap_findings(df, labels: list[str]) -> list[Observation]:
    out = []
    gp = gaps_table(df)
    if gp.empty:
        return out
    if not (gp["nccl_kernels"].fillna(0) > 0).any():
        return [Observation("no_nccl_kernel", NO_NCCL + "; launch overhead and graph replay above are measured")]
    groups = gp[gp["nccl_kernels"].fillna(0) > 0].groupby(["label", "mode", "stream"])
    for (label, mode, stream), d in _ordered(groups, labels):
        d = d.sort_values("layers")
        per_n = ", ".join(f"{_fmt(g)} us at N={n}" for n, g in zip(d["layers"], d["gap_nccl_median_us"]))
        med = float(d["gap_nccl_median_us"].median())
        out.append(Observation(f"gap_before_nccl_us[{mode}{_at(stream)}, {label}]",
                               f"{mode}{_at(stream)} | {label}: median gap before NCCL kernels {per_n} (median over N: "
                               f"{med:.2f} us)", med, "us"))
    return out


def _ratio_findings(df, labels: list[str]) -> list[Observation]:
    ft = forward_table(df)
    out = []
    if ft.empty:
        return out
    g = ft[(ft["model"] == "allreduce") & (ft["mode"] == "graph")]
    for (label, stream), d in _ordered(g.groupby(["label", "stream"]), labels):
        top = d[d["layers"] == d["layers"].max()].iloc[0]
        if top["graph_over_eager"] == top["graph_over_eager"]:
            out.append(Observation(f"graph_over_eager[{label}{_at(stream)}]",
                                   f"graph{_at(stream)} | {label}: time per forward graph/eager at N={int(top['layers'])}: "
                                   f"{top['graph_over_eager']:.2f}", float(top["graph_over_eager"])))
    if g.empty:  # no graph mode (CPU): the eager time per forward at the largest N
        e = ft[(ft["model"] == "allreduce") & (ft["mode"] == "eager")]
        for label, d in _ordered(e.groupby("label"), labels):
            top = d[d["layers"] == d["layers"].max()].iloc[0]
            out.append(Observation(f"eager_forward_us[{label}]",
                                   f"eager | {label}: time per forward at N={int(top['layers'])}: "
                                   f"{top['time_us_median']:.0f} us (no CUDA graph without CUDA)",
                                   float(top["time_us_median"]), "us"))
    return out


def _census_findings(df, labels: list[str]) -> list[Observation]:
    ct = census_table(df)
    out = []
    for label in sorted(ct.columns, key=lambda x: labels.index(x) if x in labels else len(labels)):
        c = ct[label]
        ev = int(c.get("EVENT_RECORD", 0) + c.get("EVENT_WAIT", 0))
        nccl = int(c.get("KERNEL:nccl", 0))
        out.append(Observation(f"census_event_nodes[{label}]",
                               f"census | {label}: {nccl} captured NCCL kernels bring {int(c.get('EVENT_RECORD', 0))} "
                               f"EVENT_RECORD + {int(c.get('EVENT_WAIT', 0))} EVENT_WAIT nodes", float(ev)))
    return out


def _launch_findings(df) -> list[Observation]:
    lt = launch_table(df)
    out = []
    for bench, d in lt.groupby("bench"):
        d = d.sort_values("batch")
        first = d.iloc[0]
        out.append(Observation(f"launch_speedup[{bench}, batch={int(first['batch'])}]",
                               f"launch | {bench}: graph {first['speedup']:.1f}x faster than eager at batch "
                               f"{int(first['batch'])} ({d['speedup'].min():.1f}-{d['speedup'].max():.1f}x over batches "
                               f"{', '.join(map(str, d['batch']))})", float(first["speedup"]), "x"))
    return out


def _mechanism_findings(df, labels: list[str]) -> list[Observation]:
    """Gap along the replay (first vs last quarter, slope) at the largest N; the work variants' gaps in graph
    mode against their GEMM time; first/queued replays; what each NCCL kernel waits for in the census graph;
    the launch benchmark's slowest batch and its heaviest kernel."""
    out = []
    pt = position_table(df)
    g = pt[pt["mode"] == "graph"]
    for (label, stream), d in _ordered(g.groupby(["label", "stream"]), labels):
        top = d[d["layers"] == d["layers"].max()].iloc[0]
        out.append(Observation(f"gap_by_position[{label}{_at(stream)}]",
                               f"position{_at(stream)} | {label}: at N={int(top['layers'])} the gap before NCCL kernels is "
                               f"{_fmt(top['q1_us'])} us in the first quarter of the replay and {_fmt(top['q4_us'])} us "
                               f"in the last ({top['slope_us_per_layer']:.2f} us more per layer)",
                               float(top["slope_us_per_layer"]), "us/layer"))
    wt = work_table(df)
    if not wt.empty and "gap_nccl_graph_us" in wt.columns:
        for label, d in _ordered(wt.groupby("label"), labels):
            d = d.sort_values("compute_kernel_median_us")
            parts = ", ".join(f"{r.variant} {_fmt(r.gap_nccl_graph_us)} us (GEMM {_fmt(r.compute_kernel_median_us)} "
                              f"us, {int(r.nccl_nodes)} NCCL nodes)" for r in d.itertuples())
            out.append(Observation(f"gap_vs_work[{label}]", f"work | {label}: median gap before NCCL kernels in graph "
                                                        f"replay per variant: {parts}",
                                   float(d["gap_nccl_graph_us"].max()), "us"))
    rt = replay_table(df)
    if not rt.empty and "gap_nccl_median_us" in rt.columns:
        for label, d in _ordered(rt.groupby("label"), labels):
            v = dict(zip(d["how"], d["gap_nccl_median_us"]))
            out.append(Observation(f"replay_gaps[{label}]", f"replays | {label}: gap before NCCL kernels "
                                   + ", ".join(f"{h} {_fmt(x)} us" for h, x in v.items()), float(max(v.values())), "us"))
    et = edges_table(df)
    for label in et.columns:
        n = int(et[label].get("EVENT_RECORD -> KERNEL:nccl", 0))
        direct = int(et[label].get("KERNEL:nccl -> KERNEL:nccl", 0))
        out.append(Observation(f"edges[{label}]", f"edges | {label}: {n} NCCL kernels wait for an EVENT_RECORD node "
                                              f"of the previous NCCL call, {direct} directly for the previous NCCL "
                                              f"kernel", float(n)))
    lp = launch_profile_table(df)
    lt = launch_table(df)
    chain = lt[lt["bench"] == "chain"] if not lt.empty else lt
    if not chain.empty and not lp.empty:
        worst = chain.loc[chain["speedup"].idxmin()]
        k = lp[(lp["batch"] == int(worst["batch"])) & (lp["mode"] == "graph")]
        if len(k):
            k = k.iloc[0]
            out.append(Observation(f"launch_outlier[batch={int(worst['batch'])}]",
                                   f"launch | chain: smallest speedup {worst['speedup']:.2f}x at batch "
                                   f"{int(worst['batch'])}: {k['kernels_per_forward']:.0f} kernels per forward summing "
                                   f"to {k['compute_sum_us']:.0f} us; heaviest {k['heaviest_kernel']} "
                                   f"({k['heaviest_median_us']:.1f} us each, {k['heaviest_per_forward']:.0f} per forward)",
                                   float(worst["speedup"]), "x"))
    return out


def findings(runs) -> list[Observation]:
    df = rows(runs.df)
    if df.empty:
        return []
    labels = list(dict.fromkeys(df["label"].dropna()))
    out = _gap_findings(df, labels) + _ratio_findings(df, labels) + _census_findings(df, labels) + _launch_findings(df)
    out += _mechanism_findings(df, labels) + stream_findings(runs)
    if not (df["kind"] == "profile").any():
        out.append(Observation("no_profile", "no profiler rows: these runs had no CUDA, so no gaps, census or launch "
                                         "benchmark (see the recorded GPU runs)"))
    return out
