"""Tables, the figure and the findings of the collective-bandwidth sweep, from a :class:`kit.results.RunSet`.

Every function reads runs recorded before rows had a ``kind`` (:func:`rows` fills it) and returns an empty
table / a figure that says what is missing for runs without the rows it needs -- never raises.
"""

from __future__ import annotations

from ... import plot, stats
from ...collective_ops import SWEEPABLE
from ...contract import Observation
from ...sweeps import rows, summarize
from .sweep import NO_KERNEL

_human = stats.human_bytes

MiB = 1 << 20


def busbw_table(runs):
    """:func:`summarize` of the runs: time statistics, host enqueue, algbw and busbw per method and size."""
    return summarize(runs.df)


def times_table(runs):
    """Median time per call (us) by method, one row per (label, collective, bytes), with the host enqueue time
    of one eager call beside it (``host_enqueue_us``): where it exceeds ``graph`` the GPU waits for Python."""
    import pandas as pd

    s = summarize(runs.df)
    if s.empty:
        return pd.DataFrame()
    idx = [k for k in ("label", "collective", "bytes") if k in s.columns]
    t = s.pivot_table(index=idx, columns="method", values="time_us_median")
    eager = s[s["method"] == "eager"].set_index(idx)["host_us_median"]
    t["host_enqueue_us"] = eager.reindex(t.index)
    t.columns.name = None
    return t.reset_index()


def _at_1mib(s):
    return s[(s["collective"] == "all_reduce") & (s["bytes"] == MiB)]


def at_1mib_table(runs):
    """Where a ``dist.all_reduce`` call's time goes at 1 MiB: per method the per-call time, its spread, busbw
    and (eager) the host's enqueue time."""
    s = _at_1mib(summarize(runs.df))
    cols = [c for c in ("label", "method", "time_us_median", "time_us_p10", "time_us_p90", "busbw_gbps",
                        "host_us_median") if c in s.columns]
    return s[cols].reset_index(drop=True)


def notes_table(runs):
    """What the runs could not measure and why (e.g. no NCCL kernel with one rank), per collective."""
    import pandas as pd

    df = rows(runs.df)
    n = df[df["kind"] == "note"] if "note" in df.columns else df.iloc[0:0]
    if n.empty:
        return pd.DataFrame(columns=["label", "collective", "method", "note", "sizes"])
    by = [k for k in ("label", "collective", "method", "note") if k in n.columns]
    return n.groupby(by, dropna=False)["bytes"].nunique().rename("sizes").reset_index()


def busbw_figure(runs):
    """busbw against message size, one panel per collective, one line per method (and label)."""
    s = summarize(runs.df)
    s = s[s["busbw_gbps"].notna()] if not s.empty else s
    if s.empty:
        return plot.message("no collective samples in these runs", runs.title)
    hue = "method"
    if s["label"].nunique() > 1:
        s = s.assign(series=s["method"] + " | " + s["label"])
        hue = "series"
    order = [c for c in SWEEPABLE if c in set(s["collective"])]
    return plot.size_curves(s, y="busbw_gbps", hue=hue, col="collective", title=runs.title, col_order=order)


def _gbps(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _size_findings(a, tag: str, sfx: str) -> list[Observation]:
    """busbw of all_reduce at 64 MiB and 1 GiB (else the largest size), graph and eager against nccl-tests."""
    big = [b for b in (64 * MiB, 1 << 30) if b in set(a["bytes"])] or [int(a["bytes"].max())]
    out = []
    for b in big:
        at = a[a["bytes"] == b].set_index("method")["busbw_gbps"]
        ref = at.get("nccl-tests")
        for m, what in (("graph", "graph replay"), ("eager", "eager"), ("nccl-tests", "nccl-tests")):
            if m not in at or at[m] != at[m]:
                continue
            vs = f" ({100 * (at[m] / ref - 1):+.1f}% vs nccl-tests {ref:.0f})" if ref and m != "nccl-tests" else ""
            out.append(Observation(f"all_reduce_busbw_{_human(b).replace(' ', '')}_{m}{sfx}",
                                   f"{tag}all_reduce busbw at {_human(b)}, {what}: {_gbps(at[m])} GB/s{vs}",
                                   float(at[m]), "GB/s"))
    return out


def _small_findings(a, tag: str, sfx: str) -> list[Observation]:
    """Where one all_reduce call's time goes at 1 MiB, and the host enqueue time over all sizes."""
    out = []
    one = _at_1mib(a).set_index("method")
    what = {"eager": "a dist.all_reduce loop", "graph": "graph replay (device only)", "kernel": "the NCCL kernel"}
    for m, w in what.items():
        if m in one.index:
            v = float(one.loc[m, "time_us_median"])
            out.append(Observation(f"all_reduce_1MiB_{m}_us{sfx}", f"{tag}all_reduce at 1 MiB, {w}: {v:.1f} us per call",
                                   v, "us"))
    host = a[a["method"] == "eager"].set_index("bytes")["host_us_median"].dropna()
    if "eager" in one.index and host.get(MiB) == host.get(MiB):
        v = float(host[MiB])
        out.append(Observation(f"all_reduce_1MiB_host_us{sfx}", f"{tag}all_reduce at 1 MiB, host enqueue of one call: "
                               f"{v:.1f} us", v, "us"))
    if len(host):
        q1, med, q3 = host.quantile([0.25, 0.5, 0.75])
        out.append(Observation(f"all_reduce_host_us{sfx}", f"{tag}host enqueue per all_reduce call over {len(host)} sizes: "
                               f"median {med:.1f} us (quartiles {q1:.1f}-{q3:.1f} us)", float(med), "us"))
        graph = a[a["method"] == "graph"].set_index("bytes")["time_us_median"]
        bound = [b for b in host.index if b in graph.index and host[b] >= graph[b]]
        if bound:
            out.append(Observation(f"all_reduce_host_bound_up_to_bytes{sfx}",
                                   f"{tag}the host's enqueue time is at least the device time (graph replay) up to "
                                   f"{_human(max(bound))}: there eager measures Python and ProcessGroupNCCL, not the "
                                   f"link", float(max(bound)), "bytes"))
    return out


def findings(runs) -> list[Observation]:
    """The measured statements: all_reduce busbw at 64 MiB / 1 GiB (graph, eager, nccl-tests), the 1 MiB
    per-call times (eager, graph, kernel, host enqueue), host enqueue over sizes, and what could not be
    measured (one rank: no NCCL kernel)."""
    s = summarize(runs.df)
    out = []
    labels = sorted(s["label"].dropna().unique()) if "label" in s.columns and not s.empty else [None]
    for label in labels:
        a = s[s["collective"] == "all_reduce"]
        if label is not None:
            a = a[a["label"] == label]
        if a.empty:
            continue
        tag, sfx = (f"[{label}] ", f"[{label}]") if len(labels) > 1 else ("", "")
        out += _size_findings(a, tag, sfx) + _small_findings(a, tag, sfx)
    for r in notes_table(runs).itertuples():
        out.append(Observation("no_kernel" if r.note == NO_KERNEL else "note", f"{r.collective}: {r.note}"))
    return out + (regime_findings(runs) if getattr(runs, "dirs", None) else [])


# ------------------------------------------------------------------------------------------------ two regimes
def _all_reduce_busbw(runs):
    """all_reduce busbw (GB/s) per size, one column per method."""
    import pandas as pd

    s = summarize(runs.df)
    s = s[(s["collective"] == "all_reduce") & s["busbw_gbps"].notna()] if not s.empty else s
    if s.empty:
        return pd.DataFrame()
    t = s.pivot_table(index="bytes", columns="method", values="busbw_gbps").reset_index()
    t.columns.name = None
    return t


def regimes_table(runs):
    """all_reduce busbw (GB/s) against size per regime (one node over NVLink, emulated nodes over NCCL's
    network transport: :func:`kit.regimes.beside`), one column per method."""
    from ... import regimes as kit_regimes

    return kit_regimes.per_regime(_all_reduce_busbw, runs)


def regimes_figure(runs):
    """all_reduce busbw against size, one line per method and regime, log y (the regimes differ ~80x)."""
    t = regimes_table(runs)
    if t.empty:
        return plot.message("no all_reduce samples in these runs", runs.title)
    long = t.melt(id_vars=["regime", "bytes"], var_name="method", value_name="busbw_gbps").dropna()
    long = long.assign(series=long["method"] + " | " + long["regime"], collective="all_reduce")
    return plot.size_curves(long, y="busbw_gbps", hue="series", col="collective", logy=True,
                            title="one node (NVLink) vs emulated nodes (NCCL NET/Socket over loopback)")


def regime_findings(runs) -> list[Observation]:
    """all_reduce busbw at 64 MiB and 1 GiB across emulated nodes against one node, per method measured in
    both (graph replay, NCCL kernel, eager, nccl-tests: on emulated nodes its ``MPI=1`` build under ``mpirun``,
    one process per rank with its agent's ``NCCL_HOSTID``, the same network variables and NCCL)."""
    t = regimes_table(runs)
    if t.empty or t["regime"].nunique() < 2:
        return []
    emu = [r for r in t["regime"].unique() if "emulated" in r]
    one = [r for r in t["regime"].unique() if r.startswith("1 node")]
    out = []
    for e in emu[:1]:
        for o in one[:1]:
            for b in (64 * MiB, 1 << 30):
                a, n = t[(t["regime"] == e) & (t["bytes"] == b)], t[(t["regime"] == o) & (t["bytes"] == b)]
                if a.empty or n.empty:
                    continue
                parts = [f"{m} {a[m].iloc[0]:.2f} vs {n[m].iloc[0]:.0f} GB/s"
                         for m in ("graph", "kernel", "eager", "nccl-tests")
                         if m in a and m in n and a[m].iloc[0] == a[m].iloc[0]]
                if not parts:
                    continue
                ref = "graph" if "graph" in a else parts[0].split()[0]
                ratio = n[ref].iloc[0] / a[ref].iloc[0]
                out.append(Observation(f"regime_busbw_{_human(b).replace(' ', '')}",
                                       f"all_reduce busbw at {_human(b)}, {e} vs {o}: " + "; ".join(parts) +
                                       f" ({ratio:.0f}x less across the emulated nodes, {ref})",
                                       float(a[ref].iloc[0]), "GB/s"))
    return out
