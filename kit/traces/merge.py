"""One clock for all ranks: offsets between the ranks' trace clocks, GPU events on rank 0's clock, and one
merged Chrome trace for Perfetto (``kit trace merge``).

Each rank's profiler stamps events with its own host clock. The end of a collective that every rank ran is
taken as simultaneous on all ranks -- a collective completes on every rank at nearly the same moment, whoever
arrived last -- so the offset of rank r is ``end_on_rank0 - end_on_rank_r`` of the first collective instance
every rank has (matched as in :func:`kit.traces.comm.collectives`). Without a common collective (one rank,
gloo traces without annotations) the offsets are 0: the traces stay on their own clocks.

NCCL's own events: when dumps of NCCL's profiler plugin lie beside the traces (or are given among them:
``nccl_profiler*_<commHash>_<rank>.json[.gz]``), each rank's dump is aligned with that rank's trace
(:mod:`kit.nccl_profiler.align`: its GPU clock on the NCCL kernels, its host clock on their launch calls) and
written under that rank's kernels -- a thread per channel in the rank's GPU process, NCCL's host events in
its host process -- then shifted by the rank's offset like every other event of the rank. ``info["nccl"]``
gives per dump the offsets, the matched collectives and the alignment error.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

import msgspec

from .frames import Trace, load_trace
from .parse import TraceError, event_dicts, values

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

_NULL, _M = msgspec.Raw(b"null"), msgspec.Raw(b'"M"')
_PROCESS_META = (msgspec.Raw(b'"process_name"'), msgspec.Raw(b'"process_sort_index"'))
"""the raw JSON of the values merge compares (an event's own process metadata is replaced by the merged one)"""


def _offsets(df: "pd.DataFrame", ranks: list[int]) -> dict[int, float]:
    """The offsets from matched collectives (:func:`kit.traces.comm.match_instances`): the first instance
    that every rank has; the first rank in ``ranks`` is the reference."""
    offsets = {r: 0.0 for r in ranks}
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


def _rank_offsets(traces, **jobs) -> tuple[list[tuple[Any, int]], dict[int, float], list, dict[str, Any]]:
    """``([(item, rank)], offsets, failures, {"job", "warnings"})``: the per-rank collective frames
    (:func:`kit.traces.comm.per_rank_collectives`, in parallel with ``jobs``; the traces checked to be one
    job) matched, then the offsets."""
    from .comm import match_instances, per_rank_collectives, warnings_of

    per_rank, failed, job = per_rank_collectives(traces, **jobs)
    offsets = _offsets(match_instances([r.frame for r in per_rank]), [r.rank for r in per_rank])
    return ([(r.item, r.rank) for r in per_rank], offsets, failed,
            {"job": job.to_json(), "warnings": warnings_of(per_rank, job)})


def clock_offsets(traces: Iterable[Trace | str | Path], *, workers: int | None = 1, client: Any = None,
                  cache: bool | None = None) -> dict[int, float]:
    """``{rank: offset_us}`` to add to each rank's timestamps to put them on the first rank's clock. Only the
    ranks' collective frames are needed: paths are summarised one rank at a time (``workers``/``client`` as
    in :func:`kit.traces.comm.collectives`); a rank that cannot be read is left out."""
    return _rank_offsets(traces, workers=workers, client=client, cache=cache)[1]


def aligned_gpu(traces: Iterable[Trace | str | Path], offsets: dict[int, float] | None = None) -> "pd.DataFrame":
    """The ``gpu`` frames of several ranks' traces in one frame on one clock: a ``rank`` column, ``ts``/``end``
    shifted by :func:`clock_offsets` (or the ``offsets`` given). Empty (with the columns) without GPU events.
    Holds every rank's GPU frame: for a handful of ranks (a figure), not for a whole job."""
    import pandas as pd

    from .frames import GPU_COLUMNS

    traces = [t if isinstance(t, Trace) else load_trace(t, cpu="comm") for t in traces]
    offsets = clock_offsets(traces) if offsets is None else offsets
    frames = []
    for i, t in enumerate(traces):
        r = t.info.rank if t.info.rank is not None else i
        if len(t.gpu):
            off = float(offsets.get(r, 0.0))
            frames.append(t.gpu.assign(rank=r, ts=t.gpu["ts"] + off, end=t.gpu["end"] + off))
    if not frames:
        return pd.DataFrame(columns=list(GPU_COLUMNS) + ["rank"])
    return pd.concat(frames, ignore_index=True)


class Source(Protocol):
    """Events of another tool to write into the merged trace beside each rank's (NCCL's profiler-plugin dumps:
    :class:`kit.nccl_profiler.merge.NcclDumps`). The trace layer knows no such tool; a caller above it passes
    the sources to :func:`merge`."""

    key: str
    """``info[key]``: the list of the source's per-rank info dicts"""
    label: str
    """how the merged trace names a process the source adds (``rank 0 | 12 (NCCL profiler)``)"""

    def split(self, items: list[Path]) -> list[Path]:
        """The rank traces among ``items`` (the source keeps its own files: found, read); TraceError, one line,
        when one of its files cannot be read."""

    def events(self, path: Path, rank: int, pid_of: Callable[[int, Any], int],
               cache: bool | None) -> tuple[list[dict], list[dict]]:
        """``(events, info dicts)`` of ``rank`` (its trace at ``path``), on that trace's clock; ``pid_of(rank,
        raw pid)`` is the merged pid of a process of the rank (a new one is named in the merged trace)."""


def merge(paths: Iterable[str | Path] | str | Path, out: str | Path, *, workers: int | None = 1,
          client: Any = None, cache: bool | None = None, sources: Iterable[Source] = ()) -> dict[str, Any]:
    """One Chrome trace with a process per (rank, original process), clocks aligned (:func:`clock_offsets`).
    Returns ``{"ranks", "offsets_us", "sources", "job", "warnings"}`` (+ ``"failed"``: ``[{"trace", "error"}]``
    when some rank could not be read and was left out; TraceError, one line per file, when none could; the
    traces checked to be one job first, :class:`~kit.traces.jobs.JobError` otherwise -- ``"job"`` is
    :meth:`kit.traces.jobs.JobCheck.to_json`).

    Two passes, so that no process holds more than one rank's events: (1) the offsets from each rank's
    collective frame (per rank, in parallel with ``workers``/``client``; from the trace cache when
    ``kit trace collectives`` already parsed the file); (2) the merged file written rank by rank in this
    process, each rank's events decoded a chunk at a time (only their pid and ts: every other value is copied as
    its JSON text), shifted, renumbered and encoded straight to the output (gzipped when ``out`` ends in
    ``.gz``; written to a temporary file beside it, renamed when complete). ``paths``: rank traces, or a directory/glob of them. ``sources``: other tools'
    events to write under each rank's (:class:`Source`; ``kit trace merge`` passes NCCL's profiler-plugin
    dumps, :func:`kit.nccl_profiler.merge.merge`)."""
    from .jobs import expand

    sources = list(sources)
    items = expand(paths) if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    for src in sources:
        items = src.split(items)
    if not items:
        raise TraceError("no Kineto trace among the files given")
    extra: dict[str, list[dict]] = {src.key: [] for src in sources}
    ranked, offsets, failed, checked = _rank_offsets(items, workers=workers, client=client, cache=cache)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.part")
    pid_map: dict[tuple, int] = {}
    try:
        with (gzip.open(tmp, "wb", compresslevel=6) if out.suffix == ".gz" else open(tmp, "wb")) as f:
            f.write(b'{"traceEvents": [')
            first = True

            def pids(label: str) -> Callable[[int, Any], int]:
                def pid_of(r, raw_pid):  # the merged pid of a rank's process; a new one gets its name
                    key = (r, raw_pid)
                    if key not in pid_map:
                        pid_map[key] = len(pid_map) + 1
                        new_meta.append({"ph": "M", "name": "process_name", "pid": pid_map[key],
                                         "args": {"name": f"rank {r} | {raw_pid} ({label})"}})
                    return pid_map[key]
                return pid_of

            new_meta: list[dict] = []

            for path, r in ranked:
                off = offsets.get(r, 0.0)
                for events in event_dicts(path, raw_values=True):  # values raw: only pid and ts are decoded
                    timed = [e for e in events if "ts" in e]
                    for e, ts in zip(timed, values([e["ts"] for e in timed])):
                        e["ts"] = float(ts) + off
                    kept = []
                    for e, raw_pid in zip(events, values([e.get("pid", _NULL) for e in events])):
                        key = (r, raw_pid)
                        if key not in pid_map:
                            pid = pid_map[key] = len(pid_map) + 1
                            kept.append({"ph": "M", "name": "process_name", "pid": pid,
                                         "args": {"name": f"rank {r} | {raw_pid}"}})
                            kept.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                                         "args": {"sort_index": pid}})
                        if e.get("ph") == _M and e.get("name") in _PROCESS_META:
                            continue
                        e["pid"] = pid_map[key]
                        kept.append(e)
                    if kept:
                        f.write((b"" if first else b",") + msgspec.json.encode(kept)[1:-1])
                        first = False
                    del events, kept
                for src in sources:
                    evs, inf = src.events(path, r, pids(src.label), cache)
                    evs, new_meta[:] = new_meta + evs, []
                    for e in evs:
                        if "ts" in e:
                            e["ts"] += off
                    extra[src.key] += inf
                    if evs:
                        f.write((b"" if first else b",") + msgspec.json.encode(evs)[1:-1])
                        first = False
            info: dict[str, Any] = {"ranks": [r for _, r in ranked], "offsets_us": offsets,
                                    "sources": [str(p) for p, _ in ranked]}
            info.update({k: v for k, v in extra.items()})
            if failed:
                info["failed"] = [x.to_json() for x in failed]
            info.update(checked)
            f.write(b'], "displayTimeUnit": "ms", "kit": ' + json.dumps(info).encode() + b"}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return info
