"""Idle GPU time before each kernel (``kit trace gaps``).

For every kernel, the idle time of its GPU just before it:

    gap = start(kernel) - max(end(a) for every GPU activity a on the same device that started earlier)

over *all* streams of the device, so a kernel that starts while another stream is busy has gap 0 (overlap
is not idleness). memcpy/memset count as activity that ends idleness, but only kernels get a gap row. The
first activity on a device has no predecessor and no gap. Gaps longer than ``threshold_us`` are not launch
gaps but host stalls or iteration boundaries (the host stopped submitting work): they are flagged
``stall`` and kept out of the gap statistics, and counted separately.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import stats
from .frames import GPU_COLUMNS, load_trace
from .parse import TraceError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

DEFAULT_STALL_US = 1000.0  # 1 ms: far above any launch gap, far below an iteration boundary of a real step


def gaps(events: "pd.DataFrame", threshold_us: float = DEFAULT_STALL_US) -> "pd.DataFrame":
    """One row per kernel with ``gap_us`` (idle time of its GPU just before it, all streams), ``before``
    ("nccl" or "other") and ``stall`` (gap above ``threshold_us``). See the module docstring. Empty in (or
    without the GPU columns), empty out with the columns."""
    import numpy as np
    import pandas as pd

    base = list(events.columns) if events is not None and len(events.columns) else list(GPU_COLUMNS)
    empty = pd.DataFrame(columns=base + ["gap_us", "before", "stall"])
    if events is None or events.empty or not {"device", "ts", "end", "cat", "nccl"} <= set(events.columns):
        return empty
    out = []
    for _, d in events.groupby("device", sort=True):
        d = d.sort_values(["ts", "end"], kind="stable")
        prev_end = np.maximum.accumulate(d["end"].to_numpy(dtype=float))
        prev_end = np.concatenate([[np.nan], prev_end[:-1]])
        g = d.assign(gap_us=np.clip(d["ts"].to_numpy(dtype=float) - prev_end, 0, None))
        out.append(g[(g["cat"] == "kernel") & g["gap_us"].notna()])
    g = pd.concat(out, ignore_index=True)
    if g.empty:
        return empty
    g["before"] = np.where(g["nccl"].astype(bool), "nccl", "other")
    g["stall"] = g["gap_us"] > threshold_us
    return g


def _stats(x) -> dict[str, float | None]:
    s = stats.stats(x)
    if not s["n"]:
        return {"count": 0, "median": None, "p90": None, "max": None}
    return {"count": s["n"], "median": s["median"], "p90": s["p90"], "max": float(max(x))}


def gap_summary(g: "pd.DataFrame") -> dict[str, Any]:
    """``{"summary": {"before_nccl_us": {count, median, p90, max}, "before_other_us": {...}, "stalls": n},
    "per_gpu": {device: {...same...}}}`` -- stalls (gaps above the threshold) excluded from the statistics."""
    def block(d):
        ok = d[~d["stall"].astype(bool)]
        return {"before_nccl_us": _stats(ok[ok["before"] == "nccl"]["gap_us"].tolist()),
                "before_other_us": _stats(ok[ok["before"] == "other"]["gap_us"].tolist()),
                "stalls": int(d["stall"].astype(bool).sum())}

    return {"summary": block(g), "per_gpu": {str(dev): block(d) for dev, d in g.groupby("device", sort=True)}}


def trace_gaps(path: str | Path, threshold_us: float = DEFAULT_STALL_US) -> dict[str, Any]:
    """``kit trace gaps``: gap statistics of one trace file. A trace without GPU kernels is a TraceError
    that says so."""
    t = load_trace(path, cpu="none")
    ev = t.gpu
    if not (ev["cat"] == "kernel").any():
        raise TraceError(f"{path}: the trace has no GPU kernels (was it recorded with ProfilerActivity.CUDA?)")
    out = gap_summary(gaps(ev, threshold_us))
    out.update(trace=str(path), threshold_us=threshold_us, kernels=int((ev["cat"] == "kernel").sum()),
               nccl_kernels=int(ev["nccl"].sum()), world_size=t.info.world_size)
    return out


def format_gaps(res: dict[str, Any]) -> str:
    def line(label, s):
        if not s["count"]:
            return f"  {label:<14} count      0"
        return (f"  {label:<14} count {s['count']:>6}  median {s['median']:>8.2f} us  p90 {s['p90']:>8.2f} us  "
                f"max {s['max']:>9.2f} us")

    lines = [f"{res['trace']}: {res['kernels']} kernels ({res['nccl_kernels']} NCCL); gaps = idle GPU time before "
             f"each kernel, all streams; gaps > {res['threshold_us']:g} us counted as stalls"]
    if not res["nccl_kernels"]:
        one = res.get("world_size") == 1
        lines.append("  no NCCL kernel in this trace" + (": with one rank NCCL launches none" if one else ""))
    for dev, b in [("all GPUs", res["summary"])] + [(f"GPU {k}", v) for k, v in res["per_gpu"].items()]:
        lines.append(f"{dev}  (stalls: {b['stalls']})")
        lines.append(line("before NCCL", b["before_nccl_us"]))
        lines.append(line("before other", b["before_other_us"]))
    return "\n".join(lines)
