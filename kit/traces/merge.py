"""One clock for all ranks: offsets between the ranks' trace clocks, GPU events on rank 0's clock, and one
merged Chrome trace for Perfetto (``kit trace merge``).

Each rank's profiler stamps events with its own host clock. The end of a collective that every rank ran is
taken as simultaneous on all ranks -- a collective completes on every rank at nearly the same moment, whoever
arrived last -- so the offset of rank r is ``end_on_rank0 - end_on_rank_r`` of the first collective instance
every rank has (matched as in :func:`kit.traces.comm.collectives`). Without a common collective (one rank,
gloo traces without annotations) the offsets are 0: the traces stay on their own clocks.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .frames import Trace, load_trace

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def _ranks(traces: list[Trace]) -> list[int]:
    return [t.info.rank if t.info.rank is not None else i for i, t in enumerate(traces)]


def clock_offsets(traces: Iterable[Trace | str | Path]) -> dict[int, float]:
    """``{rank: offset_us}`` to add to each rank's timestamps to put them on the first rank's clock."""
    from .comm import collectives

    traces = [t if isinstance(t, Trace) else load_trace(t, cpu="comm") for t in traces]
    ranks = _ranks(traces)
    offsets = {r: 0.0 for r in ranks}
    df = collectives(traces)
    if df.empty or not df["rank"].nunique() == len(set(ranks)) > 1:
        return offsets
    common = df[df["ranks_seen"] == len(set(ranks))]
    if common.empty:
        return offsets
    first = common.sort_values("start_us").iloc[0]
    sel = common[(common["match_key"] == first["match_key"]) & (common["instance"] == first["instance"])]
    ends = {int(r): float(g["start_us"].iloc[0] + g["dur_us"].iloc[0]) for r, g in sel.groupby("rank")}
    ref = ends.get(ranks[0], next(iter(ends.values())))
    return {r: ref - ends.get(r, ref) for r in ranks}


def aligned_gpu(traces: Iterable[Trace | str | Path], offsets: dict[int, float] | None = None) -> "pd.DataFrame":
    """The ``gpu`` frames of several ranks' traces in one frame on one clock: a ``rank`` column, ``ts``/``end``
    shifted by :func:`clock_offsets` (or the ``offsets`` given). Empty (with the columns) without GPU events."""
    import pandas as pd

    from .frames import GPU_COLUMNS

    traces = [t if isinstance(t, Trace) else load_trace(t, cpu="comm") for t in traces]
    offsets = clock_offsets(traces) if offsets is None else offsets
    frames = []
    for r, t in zip(_ranks(traces), traces):
        if len(t.gpu):
            off = float(offsets.get(r, 0.0))
            frames.append(t.gpu.assign(rank=r, ts=t.gpu["ts"] + off, end=t.gpu["end"] + off))
    if not frames:
        return pd.DataFrame(columns=list(GPU_COLUMNS) + ["rank"])
    return pd.concat(frames, ignore_index=True)


def merge(paths: list[str | Path], out: str | Path) -> dict[str, Any]:
    """One Chrome trace with a process per (rank, original process), clocks aligned (:func:`clock_offsets`);
    each file is parsed once. Returns ``{"ranks", "offsets_us", "sources"}``."""
    loaded = [load_trace(p, cpu="all", raw=True) for p in paths]
    ranks = _ranks(loaded)
    offsets = clock_offsets(loaded)
    events, pid_map = [], {}
    for t, r in zip(loaded, ranks):
        for e in t.events or ():
            e = dict(e)
            key = (r, e.get("pid"))
            if key not in pid_map:
                pid_map[key] = len(pid_map) + 1
                pid = pid_map[key]
                events.append({"ph": "M", "name": "process_name", "pid": pid,
                               "args": {"name": f"rank {r} | {e.get('pid')}"}})
                events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index"):
                continue
            e["pid"] = pid_map[key]
            if "ts" in e:
                e["ts"] = float(e["ts"]) + offsets.get(r, 0.0)
            events.append(e)
    merged = {"traceEvents": events, "displayTimeUnit": "ms",
              "kit": {"ranks": ranks, "offsets_us": offsets, "sources": [str(p) for p in paths]}}
    out = Path(out)
    data = json.dumps(merged).encode()
    if out.suffix == ".gz":
        with gzip.open(out, "wb") as f:
            f.write(data)
    else:
        out.write_bytes(data)
    return merged["kit"]
