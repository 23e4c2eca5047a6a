"""Reading PyTorch profiler traces (Chrome trace JSON, plain or gzipped) into DataFrames.

Works on any trace ``torch.profiler`` (Kineto) writes, not only the kit's: a user points it at a trace of
their own job. GPU activity is the events whose ``cat`` is ``kernel``, ``gpu_memcpy`` or ``gpu_memset``;
each carries ``ts``/``dur`` in microseconds and ``args.device``/``args.stream``. NCCL kernels are recognised
by name under both the old (``ncclKernel_*``) and the new (``ncclDevKernel_*``) naming, with or without a
C++ mangling prefix (``_Z39ncclDevKernel_...``).

Gaps (:func:`gaps`). For every kernel, the idle time of its GPU just before it:

    gap = start(kernel) - max(end(a) for every GPU activity a on the same device that started earlier)

over *all* streams of the device, so a kernel that starts while another stream is busy has gap 0 (overlap
is not idleness). memcpy/memset count as activity that ends idleness, but only kernels get a gap row. The
first activity on a device has no predecessor and no gap. Gaps longer than ``threshold_us`` are not launch
gaps but host stalls or iteration boundaries (the host stopped submitting work): they are flagged
``stall`` and kept out of the gap statistics, and counted separately.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_NCCL = re.compile(r"(^|_Z\d+)nccl(Dev)?Kernel", re.IGNORECASE)
DEFAULT_STALL_US = 1000.0  # 1 ms: far above any launch gap, far below an iteration boundary of a real step


class TraceError(ValueError):
    """A file that is not a readable PyTorch profiler trace (message is meant for the user, no traceback)."""


def is_nccl_kernel(name: str) -> bool:
    return bool(_NCCL.search(name or "")) or (name or "").startswith("nccl")


def _read_text(p: Path) -> str:
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    try:
        opener = gzip.open if p.suffix == ".gz" or _is_gzip(p) else open
        with opener(p, "rb") as f:
            return f.read().decode("utf-8")
    except (EOFError, gzip.BadGzipFile, OSError) as e:
        raise TraceError(f"{p}: cannot read ({type(e).__name__}: {e}); is the file complete?") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not a text/JSON file") from None


def load(path: str | Path, keep=None) -> dict[str, Any]:
    """The parsed trace ``{"traceEvents": [...], ...top-level keys}``. Raises TraceError for a missing,
    truncated or foreign file.

    ``keep``: a predicate on events. Then the ``traceEvents`` array is decoded one event at a time and only
    kept events are held, so a 100 MB trace needs memory for what is kept, not for every CPU op in it.
    """
    p = Path(path)
    text = _read_text(p)
    if keep is not None:
        data = _stream(text, keep)
        if data is not None:
            return data
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{p}: not valid JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                         f"the trace looks truncated or is not a Chrome trace") from None
    if isinstance(data, list):  # the bare-array variant of the Chrome trace format
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p}: not a PyTorch profiler trace (no 'traceEvents' list)")
    if not all(isinstance(e, dict) for e in data["traceEvents"]):
        raise TraceError(f"{p}: not a PyTorch profiler trace (trace events are not JSON objects)")
    if keep is not None:
        data["traceEvents"] = [e for e in data["traceEvents"] if keep(e)]
    return data


_TE = re.compile(r'"traceEvents"\s*:\s*\[')
_WS = re.compile(r"[\s,]*")


def _stream(text: str, keep) -> dict[str, Any] | None:
    """Decode the traceEvents array event by event; other top-level keys are decoded whole. Returns None
    when the text is not laid out as expected (the caller then parses it in one piece)."""
    m = _TE.search(text)
    if not m or not text.lstrip().startswith("{"):
        return None
    dec = json.JSONDecoder()
    i, n, events = m.end(), len(text), []
    while True:
        i = _WS.match(text, i).end()
        if i >= n:
            return None  # truncated inside the array: let json.loads produce the precise error
        if text[i] == "]":
            break
        try:
            e, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        if not isinstance(e, dict):
            return None  # the one-piece parse reports it
        if keep(e):
            events.append(e)
    try:  # the other top-level keys: the object with the events array emptied
        rest = json.loads(text[: m.end()] + text[i:])
    except json.JSONDecodeError:
        return None
    rest["traceEvents"] = events
    return rest


def _is_gzip(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def gpu_events(trace: dict[str, Any]):
    """One row per GPU activity: name, cat, device, stream, ts, dur, end (us), nccl, plus kernel metadata
    that Kineto records for collectives (``Collective name``, ``In msg nelems``, ...) where present."""
    import pandas as pd

    rows = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATS:
            continue
        a = e.get("args") or {}
        name = e.get("name", "")
        ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        rows.append({"name": name, "cat": e["cat"], "device": a.get("device", e.get("pid")),
                     "stream": a.get("stream", e.get("tid")), "ts": ts, "dur": dur, "end": ts + dur,
                     "nccl": e["cat"] == "kernel" and is_nccl_kernel(name),
                     "correlation": a.get("correlation"), "external_id": a.get("External id"),
                     "collective": a.get("Collective name"), "in_nelems": a.get("In msg nelems"),
                     "out_nelems": a.get("Out msg nelems"), "group_size": a.get("Group size"),
                     "dtype": a.get("dtype"), "pg_name": a.get("Process Group Name"),
                     "pg_desc": a.get("Process Group Description"), "seq": a.get("Seq")})
    cols = ["name", "cat", "device", "stream", "ts", "dur", "end", "nccl", "correlation", "external_id",
            "collective", "in_nelems", "out_nelems", "group_size", "dtype", "pg_name", "pg_desc", "seq"]
    return pd.DataFrame(rows, columns=cols)


def gaps(events, threshold_us: float = DEFAULT_STALL_US):
    """One row per kernel with ``gap_us`` (idle time of its GPU just before it, all streams), ``before``
    ("nccl" or "other") and ``stall`` (gap above ``threshold_us``). See the module docstring."""
    import numpy as np
    import pandas as pd

    out = []
    for dev, d in events.groupby("device", sort=True):
        d = d.sort_values(["ts", "end"], kind="stable")
        prev_end = np.maximum.accumulate(d["end"].to_numpy())
        prev_end = np.concatenate([[np.nan], prev_end[:-1]])
        g = d.assign(gap_us=np.clip(d["ts"].to_numpy() - prev_end, 0, None))
        out.append(g[(g["cat"] == "kernel") & g["gap_us"].notna()])
    if not out:
        return pd.DataFrame(columns=list(events.columns) + ["gap_us", "before", "stall"])
    g = pd.concat(out, ignore_index=True)
    g["before"] = np.where(g["nccl"], "nccl", "other")
    g["stall"] = g["gap_us"] > threshold_us
    return g


def _stats(x) -> dict[str, float]:
    import numpy as np

    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return {"count": 0, "median": None, "p90": None, "max": None}
    return {"count": int(x.size), "median": float(np.median(x)), "p90": float(np.percentile(x, 90)),
            "max": float(x.max())}


def gap_summary(g) -> dict[str, Any]:
    """``{"summary": {"before_nccl_us": {count, median, p90, max}, "before_other_us": {...}, "stalls": n},
    "per_gpu": {device: {...same...}}}`` -- stalls (gaps above the threshold) excluded from the statistics."""
    def block(d):
        ok = d[~d["stall"]]
        return {"before_nccl_us": _stats(ok[ok["before"] == "nccl"]["gap_us"]),
                "before_other_us": _stats(ok[ok["before"] == "other"]["gap_us"]),
                "stalls": int(d["stall"].sum())}

    return {"summary": block(g), "per_gpu": {str(dev): block(d) for dev, d in g.groupby("device", sort=True)}}


def trace_gaps(path: str | Path, threshold_us: float = DEFAULT_STALL_US) -> dict[str, Any]:
    """``kit trace gaps``: gap statistics of one trace file."""
    ev = gpu_events(load(path, keep=lambda e: e.get("cat") in GPU_CATS))
    if ev.empty:
        raise TraceError(f"{path}: the trace has no GPU kernels (was it recorded with ProfilerActivity.CUDA?)")
    out = gap_summary(gaps(ev, threshold_us))
    out.update(trace=str(path), threshold_us=threshold_us, kernels=int((ev["cat"] == "kernel").sum()),
               nccl_kernels=int(ev["nccl"].sum()))
    return out


def format_gaps(res: dict[str, Any]) -> str:
    def line(label, s):
        if not s["count"]:
            return f"  {label:<14} count      0"
        return (f"  {label:<14} count {s['count']:>6}  median {s['median']:>8.2f} us  p90 {s['p90']:>8.2f} us  "
                f"max {s['max']:>9.2f} us")

    lines = [f"{res['trace']}: {res['kernels']} kernels ({res['nccl_kernels']} NCCL); gaps = idle GPU time before "
             f"each kernel, all streams; gaps > {res['threshold_us']:g} us counted as stalls"]
    for dev, b in [("all GPUs", res["summary"])] + [(f"GPU {k}", v) for k, v in res["per_gpu"].items()]:
        lines.append(f"{dev}  (stalls: {b['stalls']})")
        lines.append(line("before NCCL", b["before_nccl_us"]))
        lines.append(line("before other", b["before_other_us"]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- CUDA-graph census
NODE_TYPES = ("KERNEL", "MEMCPY", "MEMSET", "HOST", "GRAPH", "EMPTY", "EVENT_WAIT", "EVENT_RECORD",
              "EXT_SEMAS_SIGNAL", "EXT_SEMAS_WAIT", "MEM_ALLOC", "MEM_FREE", "BATCH_MEM_OP", "CONDITIONAL")
_NODE = re.compile(r'^"(graph_\d+_node_\d+)"\[(.*?)\];\s*$', re.DOTALL | re.MULTILINE)
_LABEL = re.compile(r'label="(.*)"', re.DOTALL)
_TYPE = re.compile(r"\b(" + "|".join(sorted(NODE_TYPES, key=len, reverse=True)) + r")\b")


def graph_census(dot_text: str) -> dict[str, int]:
    """Count node types in a ``cudaGraphDebugDotPrint`` dump (``CUDAGraph.debug_dump``). Kernels are split
    into ``KERNEL:nccl`` and ``KERNEL:other``; ``edges`` counts dependencies."""
    counts: dict[str, int] = {}
    for m in _NODE.finditer(dot_text):
        lab = _LABEL.search(m.group(2))
        text = lab.group(1) if lab else m.group(2)
        t = _TYPE.search(text)
        kind = t.group(1) if t else "UNKNOWN"
        if kind == "KERNEL":
            kind = "KERNEL:nccl" if "nccl" in text.lower() else "KERNEL:other"
        counts[kind] = counts.get(kind, 0) + 1
    counts["edges"] = len(re.findall(r"->", dot_text))
    return counts
