"""Collective-bandwidth sweeps as rows, for every layer that reads one: a kit ``collectives`` run's rows summarised
per (label, collective, bytes, method) with the per-sample conventions (:func:`summarize`), and nccl-tests'
printed table parsed into rows (:func:`parse_nccl_tests`). The ``collectives`` investigation records and draws the
sweeps; the doctor's ``low_busbw`` (:mod:`kit.doctor.sweep`) reads them as the machine's attainable bandwidth.
"""

from __future__ import annotations

import re

from . import stats
from .collective_ops import bus_factor


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


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


def parse_nccl_tests(text: str, collective: str) -> list[dict]:
    """Rows (``kind="nccl-tests"``) from nccl-tests' table: size, count, type, redop, root, then out-of-place
    and in-place (time us, algbw GB/s, busbw GB/s, #wrong). Both placements are kept (``placement`` column)."""
    rows = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _ROW.match(line)
        if not m:
            continue
        size = int(m.group(1))
        for placement, (t, a, b) in (("out-of-place", m.group(6, 7, 8)), ("in-place", m.group(10, 11, 12))):
            try:
                t, a, b = float(t), float(a), float(b)
            except ValueError:
                continue
            rows.append(dict(kind="nccl-tests", collective=collective, bytes=size, method="nccl-tests",
                             placement=placement, sample=0, time_us=t, algbw_gbps=a, busbw_gbps=b, rank=-1))
    return rows
