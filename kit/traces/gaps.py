"""Idle GPU time before each kernel (``kit trace gaps``).

For every kernel, the idle time of its GPU just before it:

    gap = start(kernel) - max(end(a) for every GPU activity a on the same device that started earlier)

over *all* streams of the device, so a kernel that starts while another stream is busy has gap 0 (overlap
is not idleness). memcpy/memset count as activity that ends idleness, but only kernels get a gap row. The
first activity on a device has no predecessor and no gap. Gaps longer than ``threshold_us`` are not launch
gaps but host stalls or iteration boundaries (the host stopped submitting work): they are flagged
``stall`` and kept out of the gap statistics, and counted separately.

**Many ranks** (``kit trace gaps DIR``, ``trace_gaps([paths])``): each rank is analysed on its own
(:func:`rank_gaps`, in parallel through :func:`kit.traces.jobs.map_ranks`) and sends back its result and its
gaps as counts per distinct ns value; :func:`combine_gaps` adds one summary over every kernel of every rank.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .. import stats
from .frames import GPU_COLUMNS, load_trace
from .jobs import RankIdentity, rank_identity
from .parse import TraceError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

DEFAULT_STALL_US = 1000.0  # 1 ms: far above any launch gap, far below an iteration boundary of a real step


def _device_codes(device: "np.ndarray") -> tuple["np.ndarray", "np.ndarray"]:
    """``(code per row, distinct devices sorted)``; code -1 for a row without a device (left out, as pandas'
    groupby leaves out NaN keys). Integer devices (Kineto's) by numpy; anything else through pandas."""
    import numpy as np

    if device.dtype.kind in "iu":
        labels, codes = np.unique(device, return_inverse=True)
        return codes.reshape(-1), labels
    import pandas as pd

    codes, labels = pd.factorize(pd.Series(device), sort=True)
    return codes, np.asarray(labels)


def _gap_rows(device: "np.ndarray", ts: "np.ndarray", end: "np.ndarray",
              kernel: "np.ndarray") -> tuple["np.ndarray", "np.ndarray", "np.ndarray"]:
    """The arithmetic of :func:`gaps` on arrays: ``(rows, gap_us, device code)`` of the kernels that have a
    predecessor, ``rows`` indexing the input, in the order device, ts, end (stable: ties keep the input's
    order). Per device the running maximum of the earlier activities' ends is ``np.maximum.accumulate`` over
    that device's rows alone."""
    import numpy as np

    codes, _ = _device_codes(device)
    ts, end = np.asarray(ts, dtype=float), np.asarray(end, dtype=float)
    order = np.lexsort((end, ts, codes))
    order = order[codes[order] >= 0]
    c, e = codes[order], end[order]
    prev = np.full(len(order), np.nan)
    cuts = np.flatnonzero(np.diff(c)) + 1
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(order)]):
        if b - a > 1:  # the first activity of a device has no predecessor: NaN
            prev[a + 1:b] = np.maximum.accumulate(e[a:b - 1])
    gap = np.clip(ts[order] - prev, 0, None)
    sel = np.asarray(kernel, dtype=bool)[order] & ~np.isnan(gap)
    return order[sel], gap[sel], c[sel]


def gaps(events: "pd.DataFrame", threshold_us: float = DEFAULT_STALL_US) -> "pd.DataFrame":
    """One row per kernel with ``gap_us`` (idle time of its GPU just before it, all streams), ``before``
    ("nccl" or "other") and ``stall`` (gap above ``threshold_us``), ordered by device, then start. See the
    module docstring. Empty in (or without the GPU columns), empty out with the columns."""
    import numpy as np
    import pandas as pd

    base = list(events.columns) if events is not None and len(events.columns) else list(GPU_COLUMNS)
    empty = pd.DataFrame(columns=base + ["gap_us", "before", "stall"])
    if events is None or events.empty or not {"device", "ts", "end", "cat", "nccl"} <= set(events.columns):
        return empty
    rows, gap, _ = _gap_rows(events["device"].to_numpy(), events["ts"].to_numpy(dtype=float),
                             events["end"].to_numpy(dtype=float), (events["cat"] == "kernel").to_numpy(dtype=bool))
    if not len(rows):
        return empty
    g = events.iloc[rows].reset_index(drop=True)
    g["gap_us"] = gap
    g["before"] = np.where(g["nccl"].astype(bool), "nccl", "other")
    g["stall"] = g["gap_us"] > threshold_us
    return g


def _stats(x) -> dict[str, float | None]:
    s = stats.stats(x)
    if not s["n"]:
        return {"count": 0, "median": None, "p90": None, "max": None}
    return {"count": s["n"], "median": s["median"], "p90": s["p90"], "max": float(max(x))}


def _summary(device: "np.ndarray", gap: "np.ndarray", nccl: "np.ndarray", stall: "np.ndarray") -> dict[str, Any]:
    """:func:`gap_summary` on the kernels' arrays."""
    import numpy as np

    def block(m):
        ok = m & ~stall
        return {"before_nccl_us": _stats(gap[ok & nccl].tolist()), "before_other_us": _stats(gap[ok & ~nccl].tolist()),
                "stalls": int((m & stall).sum())}

    codes, labels = _device_codes(device)
    return {"summary": block(np.ones(len(gap), dtype=bool)),
            "per_gpu": {str(dev): block(codes == i) for i, dev in enumerate(labels.tolist())}}


def gap_summary(g: "pd.DataFrame") -> dict[str, Any]:
    """``{"summary": {"before_nccl_us": {count, median, p90, max}, "before_other_us": {...}, "stalls": n},
    "per_gpu": {device: {...same...}}}`` -- stalls (gaps above the threshold) excluded from the statistics."""
    return _summary(g["device"].to_numpy(), g["gap_us"].to_numpy(dtype=float), (g["before"] == "nccl").to_numpy(bool),
                    g["stall"].to_numpy(dtype=bool))


def _one_rank(path: str | Path, threshold_us: float, cache: bool | None) -> tuple[dict[str, Any], tuple, RankIdentity]:
    """One file's result (what ``kit trace gaps FILE`` prints, with the trace's ``warnings``), its kernels'
    ``(gap_us, nccl, stall)`` arrays and its :func:`~kit.traces.jobs.rank_identity`. Works on the trace's
    columns as arrays (:meth:`kit.traces.Trace.array`): no DataFrame is built, and a parse without the cache
    never imports pandas."""
    t = load_trace(path, cpu="none", cache=cache)
    device, ts, end, cat, nccl = (t.array("gpu", c) for c in ("device", "ts", "end", "cat", "nccl"))
    kernel = cat == "kernel"
    if not kernel.any():
        raise TraceError(f"{path}: the trace has no GPU kernels (was it recorded with ProfilerActivity.CUDA?)")
    rows, gap, _ = _gap_rows(device, ts, end, kernel)
    k_nccl = nccl.astype(bool)[rows]
    stall = gap > threshold_us
    out = _summary(device[rows], gap, k_nccl, stall)
    out.update(trace=str(path), threshold_us=threshold_us, kernels=int(kernel.sum()),
               nccl_kernels=int(nccl.sum()), world_size=t.info.world_size, warnings=list(t.warnings))
    return out, (gap, k_nccl, stall), rank_identity(t, path)


def _ns_counts(x) -> tuple["np.ndarray", "np.ndarray"]:
    """Gap values rounded to the ns (Kineto writes timestamps in us with 3 decimals; float64 epoch-us values
    resolve ~1 ns) as (distinct values, how often each): what a rank sends for the combined statistics -- one
    pair per distinct gap, not one value per kernel, so the client's memory does not grow with kernels x
    ranks (at most one pair per ns below the stall threshold: 1e6 for 1 ms)."""
    import numpy as np

    return np.unique(np.rint(np.asarray(x, dtype=float) * 1000).astype(np.int64), return_counts=True)


def rank_gaps(path: str | Path, threshold_us: float = DEFAULT_STALL_US,
              cache: bool | None = None) -> tuple[dict[str, Any], dict[str, tuple], RankIdentity]:
    """The per-rank part of :func:`trace_gaps` over many ranks: the rank's result (as for one file, with its
    ``rank``), its non-stall gaps as ns counts per class (``nccl``/``other``) for the combined summary, and
    its :func:`~kit.traces.jobs.rank_identity` for the job check. Module-level so that worker processes and
    Dask can run it (:func:`kit.traces.jobs.map_ranks`)."""
    res, (gap, nccl, stall), ident = _one_rank(path, threshold_us, cache)
    hist = {"nccl": _ns_counts(gap[nccl & ~stall]), "other": _ns_counts(gap[~nccl & ~stall])}
    return {"rank": ident.rank, **res}, hist, ident


def _fold(acc: tuple | None, vc: tuple) -> tuple:
    """Two (values, counts) histograms -> one."""
    import numpy as np

    if acc is None:
        return vc
    u, inv = np.unique(np.concatenate([acc[0], vc[0]]), return_inverse=True)
    return u, np.bincount(inv, weights=np.concatenate([acc[1], vc[1]])).astype(np.int64)


def _quantile(values, counts, q: float) -> float:
    """``np.percentile(np.repeat(values, counts), 100 q)`` (linear interpolation) without the repeat."""
    import numpy as np

    cum = np.cumsum(counts)
    h = (cum[-1] - 1) * q
    lo = int(np.floor(h))
    at = lambda k: float(values[np.searchsorted(cum, k, side="right")])  # noqa: E731 - the k-th sorted value
    a = at(lo)
    return float(a + (h - lo) * (at(min(lo + 1, cum[-1] - 1)) - a))


def _hist_stats(vc: tuple | None) -> dict[str, float | None]:
    if vc is None or not len(vc[0]):
        return {"count": 0, "median": None, "p90": None, "max": None}
    v, c = vc
    return {"count": int(c.sum()), "median": _quantile(v, c, 0.5) / 1000, "p90": _quantile(v, c, 0.9) / 1000,
            "max": float(v[-1]) / 1000}


def combine_gaps(per_rank: list[tuple], threshold_us: float) -> dict[str, Any]:
    """One summary over every rank from the per-rank results of :func:`rank_gaps`: count, median, p90 and max
    of every kernel's gap on every rank (stalls excluded, as per rank), from the gaps rounded to the ns
    (within 0.5 ns of the statistics of the pooled gaps); kernels and stalls summed."""
    acc: dict[str, tuple | None] = {"nccl": None, "other": None}
    for _, hist, *_ in per_rank:
        for b in acc:
            acc[b] = _fold(acc[b], hist[b])
    res = [r[0] for r in per_rank]
    return {"summary": {"before_nccl_us": _hist_stats(acc["nccl"]), "before_other_us": _hist_stats(acc["other"]),
                        "stalls": sum(r["summary"]["stalls"] for r in res)},
            "ranks": len(res), "kernels": sum(r["kernels"] for r in res),
            "nccl_kernels": sum(r["nccl_kernels"] for r in res), "threshold_us": threshold_us}


def _is_one_file(path: Any) -> bool:
    import glob

    return isinstance(path, (str, Path)) and not Path(path).is_dir() and (
        Path(path).exists() or not glob.has_magic(str(path)))


def trace_gaps(path: str | Path | Iterable[str | Path], threshold_us: float = DEFAULT_STALL_US, *,
               workers: int | None = 1, client: Any = None, cache: bool | None = None) -> dict[str, Any]:
    """``kit trace gaps``: gap statistics of one trace file, or of many rank traces.

    One file (a path): ``{"summary", "per_gpu", "trace", "threshold_us", "kernels", "nccl_kernels",
    "world_size"}``; a trace without GPU kernels is a TraceError that says so.

    Many (a list of paths, a directory, a glob): each rank through :func:`rank_gaps` on
    :func:`kit.traces.jobs.map_ranks` (``workers``/``client`` as there), then ``{"per_rank": [each rank's
    result with its "rank"], "combined": {"summary", "ranks", "kernels", "nccl_kernels", "threshold_us"},
    "failed": [{"trace", "error"}], "job", "warnings"}`` -- ``combined`` over every kernel of every rank that
    could be read (:func:`combine_gaps`); a TraceError with one line per file when none could. The traces
    read are checked to be one job (:func:`kit.traces.jobs.check_job`: :class:`~kit.traces.jobs.JobError`
    otherwise); ``"job"`` says which ranks of it were given (:meth:`~kit.traces.jobs.JobCheck.to_json`:
    ``partial`` and a ``note`` when some are missing) and each rank's ``"rank"`` is the check's. One file is a
    per-rank analysis: it has its ``"warnings"``, no job."""
    from .jobs import check_job, expand, map_ranks

    if _is_one_file(path):
        return _one_rank(path, threshold_us, cache)[0]
    res = map_ranks(expand(path) if isinstance(path, (str, Path)) else path,
                    partial(rank_gaps, threshold_us=threshold_us, cache=cache), workers=workers, client=client)
    res.raise_if_all_failed()
    values = res.values()
    job = check_job([ident for _, _, ident in values])
    per_rank = [{**r, "rank": ident.rank} for (r, _, _), ident in zip(values, job.ranks)]
    warnings = list(dict.fromkeys([w for r in per_rank for w in r["warnings"]] + list(job.warnings)))
    return {"per_rank": per_rank, "combined": combine_gaps(values, threshold_us),
            "failed": [f.to_json() for f in res.failed], "job": job.to_json(), "warnings": warnings}


def _line(label: str, s: dict[str, Any]) -> str:
    if not s["count"]:
        return f"  {label:<14} count      0"
    return (f"  {label:<14} count {s['count']:>6}  median {s['median']:>8.2f} us  p90 {s['p90']:>8.2f} us  "
            f"max {s['max']:>9.2f} us")


def _block(label: str, b: dict[str, Any]) -> list[str]:
    return [f"{label}  (stalls: {b['stalls']})", _line("before NCCL", b["before_nccl_us"]),
            _line("before other", b["before_other_us"])]


def format_gaps(res: dict[str, Any]) -> str:
    """The text of ``kit trace gaps``: one file's blocks, or for many ranks one line per rank, the combined
    summary and the ranks that could not be read."""
    if "per_rank" in res:
        return _format_many(res)
    lines = [f"{res['trace']}: {res['kernels']} kernels ({res['nccl_kernels']} NCCL); gaps = idle GPU time before "
             f"each kernel, all streams; gaps > {res['threshold_us']:g} us counted as stalls"]
    if not res["nccl_kernels"]:
        one = res.get("world_size") == 1
        lines.append("  no NCCL kernel in this trace" + (": with one rank NCCL launches none" if one else ""))
    for dev, b in [("all GPUs", res["summary"])] + [(f"GPU {k}", v) for k, v in res["per_gpu"].items()]:
        lines += _block(dev, b)
    return "\n".join(lines)


def _format_many(res: dict[str, Any]) -> str:
    c = res["combined"]
    med = lambda s: "-" if s["median"] is None else f"{s['median']:.2f}"  # noqa: E731
    lines = [f"{c['ranks']} ranks, {c['kernels']} kernels ({c['nccl_kernels']} NCCL); gaps = idle GPU time before "
             f"each kernel, all streams; gaps > {c['threshold_us']:g} us counted as stalls",
             f"{'rank':>6}{'kernels':>9}{'NCCL':>7}{'median before NCCL us':>23}{'median before other us':>24}"
             f"{'stalls':>8}  trace"]
    for r in res["per_rank"]:
        s = r["summary"]
        lines.append(f"{'-' if r['rank'] is None else r['rank']:>6}{r['kernels']:>9}{r['nccl_kernels']:>7}"
                     f"{med(s['before_nccl_us']):>23}{med(s['before_other_us']):>24}{s['stalls']:>8}  {r['trace']}")
    lines += _block("all ranks, all GPUs", c["summary"])
    return "\n".join(lines)
