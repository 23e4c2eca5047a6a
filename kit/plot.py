"""One way to plot: a shared style and one place figures are saved (hardware-labelled titles:
:func:`kit.results.describe` with ``title=True``).

:func:`save` writes ``<name>.png`` into ``$KIT_FIGURES_DIR`` (set by ``kit run`` to the report's figures
folder, prefixed with the notebook name) or else ``figures/`` at the repository root.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import results


def style() -> None:
    import matplotlib

    if not os.environ.get("DISPLAY") and "ipykernel" not in str(matplotlib.get_backend()).lower():
        try:
            import IPython

            if IPython.get_ipython() is None:
                matplotlib.use("Agg")
        except ImportError:
            matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")


def save(fig, name: str, source: dict | None = None) -> Path:
    """Write ``fig`` as ``<prefix>-<name>.png``; ``source``: what this one figure shows when it is not the runs
    the notebook chose (e.g. a committed probe matrix), for its caption in the report (:func:`note_source`)."""
    d = Path(os.environ.get("KIT_FIGURES_DIR") or (results.REPO_ROOT / "figures"))
    d.mkdir(parents=True, exist_ok=True)
    prefix = os.environ.get("KIT_FIGURE_PREFIX")
    fname = f"{prefix}-{name}.png" if prefix and not name.startswith(prefix + "-") else f"{name}.png"
    path = d / fname
    fig.savefig(path, dpi=120, bbox_inches="tight", metadata={"Title": title_of(fig)})
    if source:
        note_source(figure=fname, **source)
    return path


_RUN_LINE = re.compile(r"( \| torch |^\S+ run \d{4}-\d\d-\d\d$)")
"""the lines of a suptitle that name the runs' hardware and date (:func:`kit.results.describe`): the index's
caption says them already"""


def title_of(fig) -> str:
    """The figure's title as text: its suptitle without the lines naming the runs' hardware and date, else its
    axes' titles (each once, joined by " | "), else "". Kept in the PNG (``Title``) so that the report index
    prints it legibly above the thumbnail."""
    def own(text: str) -> str:
        return " ".join(ln for ln in text.strip().splitlines() if ln.strip() and not _RUN_LINE.search(ln.strip()))

    sup = getattr(fig, "_suptitle", None)
    text = own(sup.get_text()) if sup is not None else ""
    if not text.strip():
        text = " | ".join(dict.fromkeys(t for ax in fig.axes if (t := own(ax.get_title()))))
    return " ".join(text.split())


def note_source(source: str, hardware: str = "", dates: list[str] | tuple[str, ...] = (), what: str = "",
                figure: str | None = None) -> None:
    """Under ``kit run``: what the figures saved from now on show -- ``source`` ("this run", "recorded: ..." or
    "traces"), the hardware, the dates, and for inputs that are not runs (the doctor's traces, a probe matrix)
    ``what`` they are; with ``figure`` for that one figure only. One line of ``<prefix>.provenance.jsonl`` beside
    the figures; :func:`kit.runner.figure_sources` turns them into the index's captions."""
    import json
    import time

    d, prefix = os.environ.get("KIT_FIGURES_DIR"), os.environ.get("KIT_FIGURE_PREFIX")
    if not d or not prefix:
        return
    note = {"t": time.time(), "source": source, "hardware": hardware, "dates": list(dates)}
    if what:
        note["what"] = what
    if figure:
        note["figure"] = figure
    with open(Path(d) / f"{prefix}.provenance.jsonl", "a") as f:
        f.write(json.dumps(note) + "\n")


def message(text: str, title: str = ""):
    """A figure that says why there is nothing to draw (e.g. "no NCCL kernel: one rank"), so a report shows the
    reason where the plot would be."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=10, wrap=True)
    if title:
        fig.suptitle(title, fontsize=8)
    return fig


def log2_bytes_axis(ax) -> None:
    """x axis in bytes on a log2 scale with KiB/MiB/GiB tick labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4, numticks=20))  # 1K, 4K, 16K, ...: readable on a small panel

    def fmt(x, _):
        for unit, div in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
            if x >= div:
                return f"{x / div:g}{unit}"
        return f"{x:g}"

    ax.xaxis.set_major_formatter(FuncFormatter(fmt))
    for label in ax.get_xticklabels():
        label.set_rotation(45)


def size_curves(summary, y: str = "busbw_gbps", hue: str = "method", col: str = "collective", title: str = "",
                ylabel: str = "busbw (GB/s)", logy: bool = False, col_order=None):
    """One panel per ``col`` value, ``y`` against message size (log2 x), one line per ``hue`` value."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    cols = col_order or list(dict.fromkeys(summary[col]))
    n = len(cols)
    ncols = min(n, 3)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False, sharey=not logy)
    hues = list(dict.fromkeys(summary[hue]))
    palette = dict(zip(hues, sns.color_palette("tab10", len(hues))))
    for ax, c in zip(axes.flat, cols):
        d = summary[summary[col] == c]
        for h in hues:
            dh = d[d[hue] == h].sort_values("bytes")
            if dh.empty:
                continue
            ax.plot(dh["bytes"], dh[y], marker="o", ms=3, label=str(h), color=palette[h])
        ax.set_title(str(c))
        log2_bytes_axis(ax)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        if logy and (d[y] > 0).any():  # a log axis of a panel with no positive value is an empty panel
            ax.set_yscale("log")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    drawn = {ln.get_label() for ax in list(axes.flat)[:n] for ln in ax.get_lines()}
    seen = {h: palette[h] for h in hues if str(h) in drawn}
    if seen:  # one legend for every panel, outside the data (a hue may exist in one panel only)
        from matplotlib.lines import Line2D

        fig.legend(handles=[Line2D([], [], color=c, marker="o", ms=3, label=str(h)) for h, c in seen.items()],
                   title=hue, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 0.95))
    return fig


def timeline(events, ax=None, title: str = "", t0: float | None = None, legend: bool = True):
    """Kernel timeline: one row per (device, stream), a bar per GPU activity; NCCL kernels in red, other
    kernels blue, memcpy/memset grey, said by a colour legend right of the panel. ``events``:
    kit.traces.gpu_events rows (times in us)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1.0 + 0.35 * max(events[["device", "stream"]].drop_duplicates().shape[0], 1)))
    t0 = events["ts"].min() if t0 is None else t0
    lanes = sorted(events[["device", "stream"]].drop_duplicates().itertuples(index=False, name=None))
    y = {lane: i for i, lane in enumerate(lanes)}
    # one collection per lane and colour (matplotlib's broken_barh), not one bar artist per activity: a pipeline
    # timeline holds thousands, and a bar each cost ~2 ms to add (12 s for the p2p notebook's recorded timeline)
    color = [("#d62728" if n else ("#1f77b4" if c == "kernel" else "#999999"))
             for n, c in zip(events["nccl"], events["cat"])]
    bars = events.assign(_lane=[y[k] for k in zip(events["device"], events["stream"])], _color=color,
                         _left=events["ts"] - t0)
    for (lane, c), g in bars.groupby(["_lane", "_color"], sort=False):
        coll = ax.broken_barh(list(zip(g["_left"], g["dur"])), (lane - 0.3, 0.6), facecolors=c)
        coll.sticky_edges.x.append(float(g["_left"].min()))  # as barh's bars: the axis starts at the first bar
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"GPU {d} · stream {s}" for d, s in lanes], fontsize=8)
    ax.set_xlabel("time (us)")
    if legend:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color="#d62728", label="NCCL kernel"), Patch(color="#1f77b4", label="other kernel"),
                           Patch(color="#999999", label="memcpy / memset")], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1), frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    return ax
