"""The figures of p2p_transports (names as in ``figures/h200x2/p2p_transports-<name>.png``): ``bandwidth``,
``latency``, ``comm-comm``, ``overlap``, ``timeline`` (the pipeline's: :mod:`.pipeline_analysis`). Each takes a :class:`kit.results.RunSet`
and returns a matplotlib Figure -- one that says what is missing when the runs lack its rows."""

from __future__ import annotations

from ... import plot
from . import analysis as A


def _title(runs) -> str:
    return getattr(runs, "title", "") or ""


def _curves(runs, y: str, ylabel: str, logy: bool):
    b = A.bandwidth(runs)
    bw = b[b["kind"] == "bandwidth"] if len(b) else b
    if bw.empty:
        return plot.message("no bandwidth rows in these runs", _title(runs))
    return plot.size_curves(bw, y=y, hue="transport", col="direction", title=_title(runs), ylabel=ylabel, logy=logy)


def bandwidth(runs):
    """GB/s per direction against message size, one line per transport, one panel per direction."""
    return _curves(runs, "gbps", "GB/s per direction", logy=False)


def latency(runs):
    """Time per message against message size (log scale)."""
    return _curves(runs, "time_us_median", "us per message", logy=True)


def comm_comm(runs):
    """Each flow's completion time, per transport and mode, one panel per scenario."""
    import matplotlib.pyplot as plt

    cc = A.comm_comm(runs)
    if cc.empty:
        return plot.message("no comm_comm rows in these runs", _title(runs))
    scen = list(dict.fromkeys(cc["scenario"]))
    fig, axes = plt.subplots(1, len(scen), figsize=(6 * len(scen), 4), squeeze=False)
    for ax, s in zip(axes[0], scen):
        p = cc[cc["scenario"] == s].pivot_table(index=["transport", "mode"], columns="flow_name",
                                                values="time_us_median", sort=False)
        (p / 1e3).plot.bar(ax=ax)
        ax.set_ylabel("ms to completion")
        ax.set_title(s)
        ax.set_xlabel("")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(_title(runs), fontsize=9)
    fig.tight_layout()
    return fig


def _panel(runs, rows, missing: str, figsize, draw):
    """One axes drawn by ``draw(rows, ax)`` under the runs' title, or a figure that says ``missing``."""
    import matplotlib.pyplot as plt

    if rows.empty:
        return plot.message(missing, _title(runs))
    fig, ax = plt.subplots(figsize=figsize)
    draw(rows, ax)
    ax.set_title(_title(runs), fontsize=9)
    return fig


def overlap(runs):
    """Compute alone, transfers alone, both overlapped and the serial sum, per transport."""

    def draw(co, ax):
        cols = ["compute_alone_us", "comm_alone_us", "overlapped_us", "serial_sum_us"]
        (co.set_index("transport")[cols] / 1e3).plot.bar(ax=ax, width=0.8)
        ax.set_ylabel("ms")
        ax.legend(["compute alone", "comm alone", "overlapped", "serial sum"], fontsize=8)

    return _panel(runs, A.comm_compute(runs), "no comm_compute rows in these runs", (8, 4), draw)


def timeline(runs):
    """One profiled overlapped iteration per transport: compute kernels, NCCL kernels, memcpys per stream."""
    import matplotlib.pyplot as plt

    shown = A.traced(runs)
    if not shown:
        return plot.message("no profiler traces in these runs (CUDA transports only)", _title(runs))
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 2.2 * len(shown)), squeeze=False)
    for ax, (t, ev) in zip(axes[:, 0], shown.items()):
        plot.timeline(ev[ev["dur"] > 0], ax=ax, title=f"{t}: one overlapped iteration")
    fig.suptitle(_title(runs), fontsize=9)
    fig.tight_layout()
    return fig


FIGURES = {"bandwidth": bandwidth, "latency": latency, "comm-comm": comm_comm, "overlap": overlap,
           "timeline": timeline}
