"""The statistics every investigation shares: one ``stats``, one ``summarize``, the slowest (or fastest) rank
per sample, and one bandwidth function.

Samples are barrier-aligned across ranks (kit.timing): sample *i* is the same round on every rank, so a
collective or a transfer "took" the time of its slowest participant in that round (:func:`per_sample` with
``how="max"``). A NCCL kernel's duration is the exception: a kernel starts when its rank launches it and spins
until its peers arrive, so on every rank but the last to arrive it includes waiting; the rank that arrived last
waited for no one (``how="min"``). Medians, not means, summarise samples: a single preempted sample must not
move the headline number; p10/p90 give the spread and every sample stays in the rows.
"""

from __future__ import annotations

from typing import Sequence

STAT_KEYS = ("n", "median", "p10", "p90", "min", "mean", "std")


def stats(values: Sequence[float]) -> dict[str, float]:
    """n, median, p10, p90, min, mean, std (NaN for an empty input, std 0 for one value)."""
    import numpy as np

    a = np.asarray(values, dtype=float)
    a = a[~np.isnan(a)]
    if a.size == 0:
        return {"n": 0, **{k: float("nan") for k in STAT_KEYS[1:]}}
    return {"n": int(a.size), "median": float(np.median(a)), "p10": float(np.percentile(a, 10)),
            "p90": float(np.percentile(a, 90)), "min": float(a.min()), "mean": float(a.mean()),
            "std": float(a.std(ddof=1)) if a.size > 1 else 0.0}


def summarize(df, by: Sequence[str], value: str = "time_us"):
    """Per group of ``by``: :func:`stats` of ``value`` as columns ``<value>_<stat>``. Empty in, empty out
    (with those columns)."""
    import pandas as pd

    by = list(by)
    cols = by + [f"{value}_{k}" for k in STAT_KEYS]
    if df is None or df.empty or value not in df.columns or any(b not in df.columns for b in by):
        return pd.DataFrame(columns=cols)
    rows = []
    for key, g in df.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        st = stats(g[value].to_numpy(dtype=float))
        rows.append({**dict(zip(by, key)), **{f"{value}_{k}": v for k, v in st.items()}})
    return pd.DataFrame(rows, columns=cols)


def per_sample(df, keys: Sequence[str], value: str = "time_us", how: str = "max"):
    """One value per (``keys``, ``sample``) over ranks: ``max`` = the slowest participant (a collective or
    transfer ends when its last rank does), ``min`` = the rank that waited least (kernel durations)."""
    import pandas as pd

    if df is None:
        import pandas as pd

        return pd.DataFrame(columns=list(keys) + ["sample", value])
    keys = [k for k in keys if k in df.columns] + ["sample"]
    if df.empty or value not in df.columns or "sample" not in df.columns:
        return pd.DataFrame(columns=keys + [value])
    return df.groupby(keys, dropna=False)[value].agg(how).reset_index()


def slowest_rank_stats(df, keys: Sequence[str], value: str = "time_us", how: str = "max"):
    """:func:`per_sample` then :func:`summarize` by ``keys``: the table most investigations print."""
    keys = [k for k in keys if k in df.columns]
    return summarize(per_sample(df, keys, value, how), keys, value)


def gbps(nbytes, time_us):
    """Bandwidth in GB/s (1e9 bytes per second) of ``nbytes`` moved in ``time_us`` microseconds; NaN where
    the time is not positive. Scalars or array-likes (pandas Series keep their index)."""
    import numpy as np

    t = np.asarray(time_us, dtype=float)
    b = np.asarray(nbytes, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(t > 0, b / (t * 1e-6) / 1e9, np.nan)
    if hasattr(time_us, "index"):
        import pandas as pd

        return pd.Series(out, index=time_us.index)
    if hasattr(nbytes, "index"):
        import pandas as pd

        return pd.Series(out, index=nbytes.index)
    return float(out) if out.ndim == 0 else out


def pow2_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """``min_bytes``, doubled up to ``max_bytes`` (nccl-tests' ``-f 2``)."""
    out, b = [], max(int(min_bytes), 1)
    while b <= max_bytes:
        out.append(b)
        b *= 2
    return out


def human_bytes(n: float, digits: int | None = None) -> str:
    """'64 MiB', '1 GiB', '512 B'; with ``digits``, that many significant digits ('32 MiB' for 33.6e6 at 3). The
    kit's one byte formatter: binary units everywhere."""
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.{digits}g} {unit}" if digits else f"{n / div:g} {unit}"
    return f"{int(n)} B"
