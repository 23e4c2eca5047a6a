"""Tables, the figure and the findings of the collective-bandwidth sweep, from a :class:`kit.results.RunSet`.

Every function reads runs recorded before rows had a ``kind`` (:func:`rows` fills it) and returns an empty
table / a figure that says what is missing for runs without the rows it needs -- never raises.
"""

from __future__ import annotations

from ... import plot, stats
from ...collective_ops import SWEEPABLE, bus_factor
from ...contract import Finding
from .sweep import NO_KERNEL

_human = stats.human_bytes

MiB = 1 << 20


def rows(df):
    """The rows with ``kind`` filled where a run recorded before rows had one left it empty (nccl-tests rows by
    their ``method``, the rest are samples) and ``placement`` present."""
    import pandas as pd

    if df is None or df.empty or "method" not in df.columns:
        return pd.DataFrame(columns=["kind", "collective", "bytes", "method", "sample", "time_us", "placement"])
    df = df.copy()
    external = df["method"].astype(str).str.startswith("nccl-tests")
    default = external.map({True: "nccl-tests", False: "sample"})
    df["kind"] = df["kind"].fillna(default) if "kind" in df.columns else default
    if "placement" not in df.columns:
        df["placement"] = None
    return df


def _keys(df) -> list[str]:
    return [k for k in ("label", "collective", "bytes", "method") if k in df.columns]


def summarize(df):
    """One row per (label, collective, bytes, method): per sample one time over ranks, then kit.stats.

    ``eager``/``graph``: a collective is finished when its slowest rank is, so a sample's time is the max over
    ranks (samples are barrier-aligned: sample i is the same round on every rank). ``kernel``: the min over
    ranks, the duration on the rank that arrived last (the others include waiting for it). nccl-tests rows
    are taken as printed (out-of-place). busbw/algbw come from the median time; ``host_us_median`` is the
    median host enqueue time of one call (eager). Empty in, empty out (with the columns).
    """
    import pandas as pd

    df = rows(df)
    keys = _keys(df)
    cols = keys + [f"time_us_{k}" for k in stats.STAT_KEYS] + ["host_us_median", "algbw_gbps", "busbw_gbps"]
    d = df[df["kind"] == "sample"]
    kern = d["method"] == "kernel"
    per = pd.concat([stats.per_sample(d[~kern], keys, how="max"), stats.per_sample(d[kern], keys, how="min")])
    s = stats.summarize(per, keys)
    if "host_us" in d.columns and not s.empty:
        host = d.groupby(keys, dropna=False)["host_us"].median().rename("host_us_median").reset_index()
        s = s.merge(host, on=keys, how="left")
    nt = df[(df["kind"] == "nccl-tests") & (df["placement"].fillna("out-of-place") == "out-of-place")]
    if not nt.empty:
        nts = nt.groupby(keys, dropna=False)["time_us"].agg(["median", "size"]).reset_index()
        s = pd.concat([s, nts.rename(columns={"median": "time_us_median", "size": "time_us_n"})], ignore_index=True)
    if s.empty:
        return pd.DataFrame(columns=cols)
    s = s.reindex(columns=cols)
    world = d.groupby("label")["world_size"].first() if {"label", "world_size"} <= set(d.columns) else {}
    n = s["label"].map(world) if "label" in s.columns and len(world) else pd.Series(2, index=s.index)
    s["algbw_gbps"] = stats.gbps(s["bytes"].astype(float), s["time_us_median"])
    s["busbw_gbps"] = s["algbw_gbps"] * [bus_factor(c, w) for c, w in zip(s["collective"], n.fillna(2))]
    return s.sort_values(keys).reset_index(drop=True)


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


def _size_findings(a, tag: str, sfx: str) -> list[Finding]:
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
            out.append(Finding(f"all_reduce_busbw_{_human(b).replace(' ', '')}_{m}{sfx}",
                               f"{tag}all_reduce busbw at {_human(b)}, {what}: {_gbps(at[m])} GB/s{vs}",
                               float(at[m]), "GB/s"))
    return out


def _small_findings(a, tag: str, sfx: str) -> list[Finding]:
    """Where one all_reduce call's time goes at 1 MiB, and the host enqueue time over all sizes."""
    out = []
    one = _at_1mib(a).set_index("method")
    what = {"eager": "a dist.all_reduce loop", "graph": "graph replay (device only)", "kernel": "the NCCL kernel"}
    for m, w in what.items():
        if m in one.index:
            v = float(one.loc[m, "time_us_median"])
            out.append(Finding(f"all_reduce_1MiB_{m}_us{sfx}", f"{tag}all_reduce at 1 MiB, {w}: {v:.1f} us per call",
                               v, "us"))
    host = a[a["method"] == "eager"].set_index("bytes")["host_us_median"].dropna()
    if "eager" in one.index and host.get(MiB) == host.get(MiB):
        v = float(host[MiB])
        out.append(Finding(f"all_reduce_1MiB_host_us{sfx}", f"{tag}all_reduce at 1 MiB, host enqueue of one call: "
                           f"{v:.1f} us", v, "us"))
    if len(host):
        q1, med, q3 = host.quantile([0.25, 0.5, 0.75])
        out.append(Finding(f"all_reduce_host_us{sfx}", f"{tag}host enqueue per all_reduce call over {len(host)} sizes: "
                           f"median {med:.1f} us (quartiles {q1:.1f}-{q3:.1f} us)", float(med), "us"))
        graph = a[a["method"] == "graph"].set_index("bytes")["time_us_median"]
        bound = [b for b in host.index if b in graph.index and host[b] >= graph[b]]
        if bound:
            out.append(Finding(f"all_reduce_host_bound_up_to_bytes{sfx}",
                               f"{tag}the host's enqueue time is at least the device time (graph replay) up to "
                               f"{_human(max(bound))}: there eager measures Python and ProcessGroupNCCL, not the "
                               f"link", float(max(bound)), "bytes"))
    return out


def findings(runs) -> list[Finding]:
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
        out.append(Finding("no_kernel" if r.note == NO_KERNEL else "note", f"{r.collective}: {r.note}"))
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


def regime_findings(runs) -> list[Finding]:
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
                out.append(Finding(f"regime_busbw_{_human(b).replace(' ', '')}",
                                   f"all_reduce busbw at {_human(b)}, {e} vs {o}: " + "; ".join(parts) +
                                   f" ({ratio:.0f}x less across the emulated nodes, {ref})",
                                   float(a[ref].iloc[0]), "GB/s"))
    return out
