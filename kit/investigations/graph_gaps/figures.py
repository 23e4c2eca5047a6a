"""Figures of graph_gaps, each ``fn(runs) -> matplotlib Figure`` (saved by ``inv.figure`` under the same names as
always: ``graph_gaps-<name>.png``). Given runs without the rows or traces a figure needs (a CPU run, one rank, no
kept traces), the figure says what is missing instead of raising."""

from __future__ import annotations

from ... import plot, results, traces
from .analysis import (census_table, forward_table, gaps_table, kept_trace_gaps, launch_table, one_layer_window,
                       threshold)


def _against_layers(runs, d, by: list[str], y: str, ylabel: str, scale: float = 1.0, logy: bool = False,
                    style=None, figsize=(7.5, 4), legend: int = 8, what: str = ""):
    """One line per ``by`` group: ``y / scale`` against N (log x), labelled ``a | b | ...``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    for key, g in d.groupby(by):
        ax.plot(g["layers"], g[y] / scale, marker="o", ls=style(key) if style else "-", label=" | ".join(map(str, key)))
    ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("layers N")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=legend, title=" | ".join(by), title_fontsize=legend, loc="upper left",
              bbox_to_anchor=(1.01, 1))  # outside the data
    ax.set_title((what + "\n" if what else "") + runs.title, fontsize=9)
    return fig


def forward_time(runs):
    """Time per forward against N, per mode, label and model (log-log; the matmul-only control dotted)."""
    ft = forward_table(runs.df)
    if ft.empty:
        return plot.message("no timing rows in these runs", runs.title)
    return _against_layers(runs, ft, ["mode", "stream", "label", "model"], "time_us_median", "time per forward (ms)",
                           scale=1e3,
                           logy=True, style=lambda k: "-" if k[3] == "allreduce" else ":", figsize=(7.5, 4.5),
                           legend=7, what="time per forward vs layers, eager and graph replay (dotted: matmuls only)")


def gap_vs_layers(runs):
    """Median gap before NCCL kernels against N, per mode and label."""
    gp = gaps_table(runs.df)
    gp = gp[gp["nccl_kernels"] > 0]
    if gp.empty:
        return plot.message("no gaps before NCCL kernels: needs profiler rows from CUDA GPUs and 2+ ranks "
                            "(with one rank NCCL launches no kernel)", runs.title)
    return _against_layers(runs, gp, ["mode", "stream", "label"], "gap_nccl_median_us", "median gap before NCCL kernel (us)",
                           what="median idle gap before each NCCL kernel vs layers")


def gap_distribution(runs):
    """Every gap of the kept traces (all ranks), per mode, label and what the kernel after the gap is."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    kg = kept_trace_gaps(runs, threshold(runs))
    kg = kg[~kg["stall"].astype(bool)] if not kg.empty else kg
    if kg.empty:
        return plot.message("no kept profiler traces in these runs (keep_traces; CUDA only)", runs.title)
    fig, ax = plt.subplots(figsize=(8, 4))
    sns.boxplot(data=kg, x="mode", y="gap_us", hue=kg["label"] + " / before " + kg["before"], ax=ax, fliersize=2)
    ax.set_ylabel("gap before kernel (us)")
    ax.set_title(f"idle gap before each kernel, kept traces (N={sorted(set(kg.layers))}), all ranks\n" + runs.title,
                 fontsize=9)
    ax.legend(fontsize=7, title="run / kernel after the gap", title_fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1))
    return fig


def timeline(runs):
    """One layer on the GPU timeline (rank 0, the allreduce model at the largest kept N), one panel per kept
    trace (label x mode)."""
    import matplotlib.pyplot as plt

    kept = [f for f in traces.find_traces(runs, rank=0, model="allreduce") if "layers" in f.tags]
    if not kept:
        return plot.message("no kept traces of the allreduce model on rank 0 (keep_traces; CUDA only)", runs.title)
    n_max = max(int(f.tags["layers"]) for f in kept)  # the largest kept N: where the gap is widest
    tr = [f for f in kept if int(f.tags["layers"]) == n_max]
    fig, axes = plt.subplots(len(tr), 1, figsize=(10, 1.6 * len(tr)), squeeze=False)
    for ax, f in zip(axes.flat, tr):
        ev = traces.load_trace(f.path, cpu="none").gpu
        lab = results.run_label(results.read_meta(f.run_dir))
        if ev.empty:
            ax.axis("off")
            ax.text(0.5, 0.5, f"{f.path.name}: no GPU activity", ha="center", va="center")
            continue
        what = ", ".join(f"{k} {v}" for k, v in f.tags.items() if k not in ("rank", "model"))
        plot.timeline(one_layer_window(ev, threshold(runs)), ax=ax,
                      title=f"one layer on rank 0's GPU timeline: {what} ({lab})")
    fig.tight_layout()
    return fig


def census(runs):
    """Node types of the captured graph per label (edges left out)."""
    import matplotlib.pyplot as plt

    ct = census_table(runs.df)
    if ct.empty:
        return plot.message("no graph census: CUDA graphs need CUDA", runs.title)
    n = sorted({int(x) for x in runs.df.loc[runs.df["kind"] == "census", "layers"].dropna()})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ct.drop(index=[i for i in ct.index if i == "edges"]).plot.bar(ax=ax)
    ax.set_ylabel("nodes in captured graph")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(f"nodes of the captured CUDA graph by type, N={','.join(map(str, n))} layers\n" + runs.title,
                 fontsize=9)
    return fig


def launch_speedup(runs):
    """Speedup of graph over eager per batch size, per launch benchmark."""
    import matplotlib.pyplot as plt

    lt = launch_table(runs.df)
    if lt.empty:
        return plot.message("no launch-overhead rows: the benchmark needs CUDA", runs.title)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for bench, d in lt.groupby("bench"):
        ax.plot(d["batch"], d["speedup"], marker="o", label=bench)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup of graph over eager")
    ax.legend()
    ax.set_title("what a CUDA graph buys: speedup of graph replay over eager launches\n" + runs.title, fontsize=9)
    return fig


FIGURES = {"forward-time": forward_time, "gap-vs-layers": gap_vs_layers, "gap-distribution": gap_distribution,
           "timeline": timeline, "census": census, "launch-speedup": launch_speedup}
