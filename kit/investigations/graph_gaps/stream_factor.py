"""The replay stream as a factor (:mod:`.streams`): what a replay costs in each stream, with NCCL's mixing support
on and off, against eager -- the table, figure and statements the notebook opens with.

* :func:`stream_table` -- per (label, world size, N, replay): time per forward (slowest rank per sample, median
  and p10/p90 over every sample kept), its ratio to eager (``over_eager``), the median gap before NCCL kernels
  of the profiled replays, and the gap by position along the replay (first and last quarter, slope per layer:
  :func:`.mechanism.position_table`). ``replay`` is ``eager`` or ``graph@<stream>``.
* :func:`stream_figure` -- time per forward over eager against N, one panel per label, one line per stream; and
  the gap before each NCCL kernel by its position at the largest N, per stream.
* :func:`stream_findings` -- the statements: per label and stream, graph/eager at the largest N and the growth
  along the replay; and what replaying in a created stream costs against eager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import results, stats
from ...contract import Observation
from .analysis import LEGACY, rows
from .mechanism import position_table
from .streams import STREAMS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

SETS = ("graph_gaps@streams", "graph_gaps@streams-x4")
"""the recorded runs of the factor (kit.results.RECORDED_SETS): 2 GPUs, then 4 GPUs of the same machine"""
KEYS = ["label", "world_size", "layers", "mode", "stream"]
COLUMNS = ["label", "world_size", "layers", "replay", "time_ms_median", "time_ms_p10", "time_ms_p90", "samples",
           "over_eager", "gap_nccl_median_us", "gap_q1_us", "gap_q4_us", "slope_us_per_layer"]


def _replay(mode: str, stream: str) -> str:
    return "eager" if mode == "eager" else f"graph@{stream}"


def _order(replay: str) -> int:
    return 0 if replay == "eager" else 1 + (STREAMS.index(replay[6:]) if replay[6:] in STREAMS else len(STREAMS))


def stream_runs(made=None, analyse="auto") -> "results.RunSet":
    """The runs the notebook's replay-stream section shows: :func:`kit.results.choose` over the recorded 2-GPU
    set (so this run when it ran on CUDA GPUs), and beside recorded runs the recorded 4-GPU runs too."""
    runs = results.choose("graph_gaps", made, analyse, set_name=SETS[0])
    if not runs.source.startswith("recorded"):
        return runs
    dirs = runs.dirs + [d for name in SETS[1:] for d in results.recorded_set(name)]
    return results.RunSet(dirs, runs.source + (" (+ 4 GPUs)" if len(dirs) > len(runs.dirs) else ""))


def stream_table(df) -> "pd.DataFrame":
    """See the module docstring. Runs without the ``allreduce`` model's timing rows give an empty frame; runs
    recorded before the factor give their ``graph@legacy`` and ``eager`` rows."""
    import pandas as pd

    d = rows(df)
    t = d[(d["kind"] == "time") & (d.get("model", pd.Series(index=d.index, dtype=object)) == "allreduce")]
    if t.empty:
        return pd.DataFrame(columns=COLUMNS)
    t = t.assign(world_size=t["world_size"].fillna(2).astype(int) if "world_size" in t.columns else 2,
                 layers=t["layers"].astype(int))
    s = stats.slowest_rank_stats(t, KEYS)
    s["replay"] = [_replay(m, st) for m, st in zip(s["mode"], s["stream"])]
    for q in ("median", "p10", "p90"):
        s[f"time_ms_{q}"] = s[f"time_us_{q}"] / 1e3
    s["samples"] = s["time_us_n"].astype(int)
    eager = s[s["mode"] == "eager"].set_index(["label", "world_size", "layers"])["time_us_median"]
    s["over_eager"] = [r.time_us_median / eager.get((r.label, r.world_size, r.layers), float("nan"))
                       for r in s.itertuples()]
    p = d[(d["kind"] == "profile") & (d.get("model", pd.Series(index=d.index, dtype=object)) == "allreduce")]
    if not p.empty and "gap_nccl_median_us" in p.columns:
        p = p.assign(world_size=p["world_size"].fillna(2).astype(int) if "world_size" in p.columns else 2,
                     layers=p["layers"].astype(int))
        g = p.groupby(KEYS)["gap_nccl_median_us"].median().reset_index()
        s = s.merge(g, on=KEYS, how="left")
    pos = _positions(d)
    if not pos.empty:
        s = s.merge(pos, on=KEYS, how="left")
    for c in COLUMNS:
        if c not in s.columns:
            s[c] = float("nan")
    first = {lab: i for i, lab in enumerate(dict.fromkeys(d["label"]))}  # labels in the runs' order
    s = s.assign(_l=s["label"].map(first), _o=s["replay"].map(_order))
    return s.sort_values(["_l", "world_size", "layers", "_o"])[COLUMNS].reset_index(drop=True)


def _positions(d) -> "pd.DataFrame":
    """:func:`.mechanism.position_table` per world size (position rows carry it), renamed for the stream table."""
    import pandas as pd

    p = d[d["kind"] == "position"]
    if p.empty:
        return pd.DataFrame()
    p = p.assign(world_size=p["world_size"].fillna(2).astype(int) if "world_size" in p.columns else 2)
    frames = [position_table(g).assign(world_size=int(w)) for w, g in p.groupby("world_size")]
    t = pd.concat(frames, ignore_index=True)
    t = t.rename(columns={"q1_us": "gap_q1_us", "q4_us": "gap_q4_us"})
    t["layers"] = t["layers"].astype(int)
    return t[KEYS + ["gap_q1_us", "gap_q4_us", "slope_us_per_layer"]]


def stream_figure(runs):
    """One row per world size. Left: time per forward over eager against N, one line per (label, replay
    stream). Right: the gap before each NCCL kernel against its position at the largest N (median over forwards
    and ranks), per label and stream (log y)."""
    import matplotlib.pyplot as plt

    from ... import plot

    t = stream_table(runs.df)
    t = t[t["replay"] != "eager"]
    if t.empty:
        return plot.message("no graph replays of the allreduce model in these runs (CUDA, 2+ ranks)", runs.title)
    d = rows(runs.df)
    pos = d[(d["kind"] == "position") & (d["mode"] == "graph")]
    if not pos.empty:
        pos = pos.assign(world_size=pos["world_size"].fillna(2).astype(int) if "world_size" in pos.columns else 2)
    worlds = sorted(t["world_size"].unique())
    labels = list(dict.fromkeys(t["label"]))
    fig, axes = plt.subplots(len(worlds), 2, figsize=(12, 4 * len(worlds)), squeeze=False)
    for (a0, a1), w in zip(axes, worlds):
        for replay, g in t[t["world_size"] == w].groupby(["label", "replay"], sort=False):
            label, replay = replay
            a0.plot(g["layers"], g["over_eager"], marker="o", ls="-" if labels.index(label) == 0 else ":",
                    color=f"C{_order(replay)}", label=f"{replay} | {label}")
        a0.axhline(1, color="grey", lw=0.8)
        a0.set_xscale("log")
        a0.set_xlabel("layers N")
        a0.set_ylabel("time per forward / eager")
        a0.legend(fontsize=7)
        a0.set_title(f"{w} GPUs: graph replay over eager, per replay stream", fontsize=9)
        p = pos[pos["world_size"] == w] if not pos.empty else pos
        if p.empty:
            a1.axis("off")
            continue
        n = int(p["layers"].max())
        for (label, stream), g in p[p["layers"] == n].groupby(["label", "stream"], sort=False):
            m = g[g["position"] > 0].groupby("position")["gap_us"].median()
            a1.plot(m.index, m.values, lw=1, ls="-" if labels.index(label) == 0 else ":",
                    color=f"C{_order('graph@' + stream)}", label=f"{stream} | {label}")
        a1.set_yscale("log")
        a1.set_xlabel(f"position of the NCCL kernel in the forward (N={n})")
        a1.set_ylabel("gap before the NCCL kernel (us)")
        a1.legend(fontsize=7)
        a1.set_title(f"{w} GPUs: gap before each NCCL kernel along one replay", fontsize=9)
    fig.suptitle(runs.title, fontsize=9)
    fig.tight_layout()
    return fig


def stream_findings(runs) -> list[Observation]:
    """Per label, world size and stream: graph/eager and the slope of the gap at the largest N; then what a
    created stream costs against eager (its ratio, the spread of eager's samples beside it)."""
    t = stream_table(runs.df)
    out = []
    if t.empty:
        return out
    for (label, w), d in t.groupby(["label", "world_size"], sort=False):
        n = int(d["layers"].max())
        top = d[d["layers"] == n]
        eager = top[top["replay"] == "eager"]
        for r in top[top["replay"] != "eager"].itertuples():
            slope = "" if r.slope_us_per_layer != r.slope_us_per_layer else (
                f"; gap before NCCL kernels {r.gap_q1_us:.1f} -> {r.gap_q4_us:.1f} us from the first to the last "
                f"quarter ({r.slope_us_per_layer:.2f} us per layer)")
            out.append(Observation(f"stream[{r.replay}, {label}, {w} GPUs]",
                                   f"{r.replay} | {label} | {w} GPUs: {r.time_ms_median:.2f} ms per forward at N={n}, "
                                   f"{r.over_eager:.3f}x eager{slope}", float(r.over_eager), "x"))
        c = top[top["replay"] == "graph@created"]
        if len(c) and len(eager):
            c, e = c.iloc[0], eager.iloc[0]
            out.append(Observation(f"created_cost[{label}, {w} GPUs]",
                                   f"cost of a created stream | {label} | {w} GPUs: at N={n} {c.time_ms_median:.2f} ms "
                                   f"against eager {e.time_ms_median:.2f} ms (eager p10-p90 {e.time_ms_p10:.2f}-"
                                   f"{e.time_ms_p90:.2f} ms): {100 * (c.over_eager - 1):+.1f}%",
                                   float(c.over_eager - 1), "fraction"))
    return out
