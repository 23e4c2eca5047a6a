"""Collectives in PyTorch profiler traces: one row per collective, matched across ranks, bandwidth, summary.

**Where the facts come from** (PyTorch 2.11, read off real traces; the raw keys are declared once in
:mod:`kit.traces.frames`' adapters, nothing here reads raw ``args``): a NCCL kernel carries the collective's
name, in/out element counts, group size, dtype and process group; there is *no* sequence number on the kernel.
The header's ``distributedInfo`` gives rank, world size, backend and NCCL version. Gloo runs no kernels: its work
appears as ``gloo:<collective>`` user annotations carrying the input's dims and type; group size comes from
``distributedInfo``. A trace without these fields (older PyTorch, another tool) still gives kernel-level rows:
the collective is read from the kernel name (``ncclDevKernel_AllReduce_...``), bytes stay empty.

**Bytes and bandwidth** follow nccl-tests (:mod:`kit.collective_ops`): ``bytes = max(in, out) elements x element
size``, ``algbw = bytes / duration`` (:func:`kit.stats.gbps`), ``busbw = algbw x bus_factor(collective, group
size)``; P2P and unknown ops use 1, and a one-rank group 0 for all_reduce/all_gather as nccl-tests does.

**Waiting for a late peer.** A collective kernel starts on each GPU when its rank launches it and spins until
every peer has arrived, so on an early rank it is long. Given the traces of several ranks, instances are matched
across ranks -- the k-th collective of the same (process group, collective, bytes) on each rank, which NCCL's
rule that all ranks of a communicator issue collectives in the same order makes the same operation -- and each
row gets ``instance_min_us`` (the shortest duration over the ranks: the rank that arrived last waited for no
one, so its kernel is the transfer) and ``wait_us = dur_us - instance_min_us``. The **summary uses
instance_min_us** when several ranks are given, so its busbw is the link's, not the launch skew's; with one
trace it can only use the raw durations (and says so in ``duration_basis``).

A trace without any collective gives an empty frame *with its columns*; :func:`explain_empty` says why (no
events, no GPU kernels, one rank -- NCCL launches no kernel for a group of one).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterable, NamedTuple

from .. import stats
from .collective_frame import (COLLECTIVE_COLUMNS, bandwidth, busbws, collective_frame,  # noqa: F401
                               _missing)
from .flight_recorder import dump_flight_recorder, fr_entries, fr_mismatches  # noqa: F401  (kit.traces.comm.*)
from .frames import Trace, load_trace
from .jobs import JobCheck, RankIdentity, rank_identity
from .overlap import overlap  # noqa: F401  (kit.traces.comm.overlap)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

MATCH_COLUMNS = ["match_key", "instance", "instance_min_us", "ranks_seen", "wait_us"]
ROW_KEYS = ["rank", "collective", "bytes", "dtype", "group_size", "dur_us", "algbw_gbps", "busbw_gbps"]
SUMMARY_KEYS = ["collective", "bytes", "group_size", "count", "dur_us_p50", "busbw_gbps_p50", "busbw_gbps_p90"]
SUMMARY_COLUMNS = SUMMARY_KEYS + ["wait_us_p50", "duration_basis"]


def collective_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of :func:`collective_frame` of one file as dicts (missing values None)."""
    df = load_trace(path, cpu="comm").collectives
    return [{k: (None if _missing(v) else v) for k, v in r.items()} for r in df.to_dict("records")]


def rank_collectives(path: str | Path, cache: bool | None = None) -> tuple["pd.DataFrame", dict[str, Any],
                                                                          RankIdentity, tuple[str, ...]]:
    """The per-rank part of :func:`collectives`: one rank trace's :func:`collective_frame` (one row per NCCL
    kernel or gloo op, a few hundred bytes each), :meth:`Trace.counts`, its
    :func:`~kit.traces.jobs.rank_identity` and its warnings -- what crosses to the matching step, never the
    events. Module-level so that worker processes and Dask can run it (:func:`kit.traces.jobs.map_ranks`)."""
    t = load_trace(path, cpu="comm", cache=cache)
    return _compact(t.collectives), t.counts(), rank_identity(t, path), t.warnings


def _compact(frame: "pd.DataFrame") -> "pd.DataFrame":
    """String columns as categoricals: a rank's ~10^4 rows repeat a few kernel names, dtypes and process
    groups, so this is ~1/4 of the bytes to pickle back from a worker and to hold for every rank at once."""
    import pandas as pd

    strs = [c for c in frame.columns if pd.api.types.is_string_dtype(frame[c].dtype)
            and not pd.api.types.is_object_dtype(frame[c].dtype)]
    return frame.astype({c: "category" for c in strs}) if strs else frame


def _concat(frames: list["pd.DataFrame"]) -> "pd.DataFrame":
    """``pd.concat`` of per-rank frames with their string columns as categoricals (joined with
    ``union_categoricals``): 64 ranks x 12,500 collectives are ~90 MB this way, ~260 MB as strings."""
    import pandas as pd
    from pandas.api.types import union_categoricals

    frames = [_compact(f) for f in frames]
    cols = list(dict.fromkeys(c for f in frames for c in f.columns))
    cats = [c for c in cols if all(c in f.columns and isinstance(f[c].dtype, pd.CategoricalDtype) for f in frames)]
    df = pd.concat([f.drop(columns=cats) for f in frames], ignore_index=True)
    for c in cats:
        df[c] = pd.Series(union_categoricals([f[c] for f in frames], sort_categories=True), index=df.index)
    return df[cols]


class RankCollectives(NamedTuple):
    """One rank's part of :func:`collectives`, from :func:`per_rank_collectives`."""

    item: Any
    """the path or :class:`Trace` given"""
    rank: int
    """``distributedInfo``'s rank, else the position in the input"""
    frame: "pd.DataFrame"
    """:func:`collective_frame` with that rank"""
    counts: dict[str, Any]
    """:meth:`Trace.counts`"""
    identity: RankIdentity | None = None
    """:func:`kit.traces.jobs.rank_identity`, its rank filled in by :func:`kit.traces.jobs.check_job`"""
    warnings: tuple[str, ...] = ()
    """:attr:`Trace.warnings`"""


def per_rank_collectives(traces: Iterable[str | Path | Trace] | str | Path, *, workers: int | None = 1,
                         client: Any = None, cache: bool | None = None
                         ) -> tuple[list[RankCollectives], list, JobCheck]:
    """The per-rank step of :func:`collectives` (and of :func:`kit.traces.merge.clock_offsets`): a
    :class:`RankCollectives` for each trace that could be read, in input order, the
    :class:`~kit.traces.jobs.RankFailure`\\ s of those that could not, and the
    :class:`~kit.traces.jobs.JobCheck` of the traces read. Paths go through :func:`rank_collectives` on
    :func:`kit.traces.jobs.map_ranks`; a loaded :class:`Trace` is used as it is. Ranks are
    :func:`kit.traces.jobs.check_job`'s: ``distributedInfo``'s, else the file name's, else the free ranks in
    input order. TraceError, one line per file, when no trace could be read; :class:`~kit.traces.jobs.JobError`
    when the traces are not one job (matching collectives across them would pair unrelated kernels)."""
    from .jobs import RankResults, check_job, expand, map_ranks

    items = expand(traces) if isinstance(traces, (str, Path)) else list(traces)
    paths = [t for t in items if not isinstance(t, Trace)]
    res: RankResults = map_ranks(paths, partial(rank_collectives, cache=cache), workers=workers,
                                 client=client) if paths else RankResults()
    res.raise_if_all_failed()
    done = {str(p): v for p, v in res.ok}
    read = []
    for t in items:
        if isinstance(t, Trace):
            read.append((t, t.collectives, t.counts(), rank_identity(t), t.warnings))
        elif str(Path(t)) in done:
            read.append((t, *done[str(Path(t))]))
    job = check_job([r[3] for r in read])
    out = []
    for (t, frame, counts, _, warns), ident in zip(read, job.ranks):
        rank = ident.rank
        if len(frame) and counts["rank"] != rank:
            frame = frame.assign(rank=rank)
        out.append(RankCollectives(t, rank, frame, counts, ident, tuple(warns)))
    return out, res.failed, job


def warnings_of(ranks: list[RankCollectives], job: JobCheck) -> list[str]:
    """Every trace's warnings, then the job check's, each once."""
    return list(dict.fromkeys([w for r in ranks for w in r.warnings] + list(job.warnings)))


def collectives(traces: Iterable[str | Path | Trace] | str | Path, *, workers: int | None = 1, client: Any = None,
                cache: bool | None = None) -> "pd.DataFrame":
    """Rows of every trace (one per rank: paths, loaded :class:`Trace`\\ s, or one directory/glob of rank
    traces), matched across ranks (see the module docstring). Always has :data:`COLLECTIVE_COLUMNS` +
    :data:`MATCH_COLUMNS`; ``df.attrs["traces"]`` says what each trace held (:meth:`Trace.counts`), for
    :func:`explain_empty`.

    **Many ranks.** Each path is parsed by :func:`rank_collectives` through :func:`kit.traces.jobs.map_ranks`:
    ``workers=1`` (default) in this process, ``workers=N`` (None: every core) in N worker processes,
    ``client=`` a ``dask.distributed.Client`` or scheduler address; only the per-rank frames come back, and
    the matching (:func:`match_instances`) runs on them here. A rank that cannot be read is left out and
    named in ``df.attrs["failed"]`` (``[{"trace", "error"}]``); when no rank can be read, :class:`TraceError`
    with one line per file. The traces are checked to be one job (:func:`kit.traces.jobs.check_job`:
    :class:`~kit.traces.jobs.JobError` otherwise); ``df.attrs["job"]`` says which ranks of it were given
    (``partial`` and a ``note`` when some are missing), ``df.attrs["warnings"]`` the traces' warnings."""
    ranks, failed, job = per_rank_collectives(traces, workers=workers, client=client, cache=cache)
    df = match_instances([r.frame for r in ranks], [r.counts for r in ranks])
    df.attrs["failed"] = [f.to_json() for f in failed]
    df.attrs["job"] = job.to_json()
    df.attrs["warnings"] = warnings_of(ranks, job)
    return df


def match_instances(frames: list["pd.DataFrame"], counts: list[dict[str, Any]] | None = None) -> "pd.DataFrame":
    """The cross-rank step of :func:`collectives` on per-rank collective frames (one per rank, each with its
    ``rank``): the k-th op of the same (process group, collective, bytes) on each rank is one instance;
    ``instance_min_us``, ``ranks_seen``, ``wait_us`` (see the module docstring). ``counts``: what each trace
    held, kept in ``df.attrs["traces"]`` for :func:`explain_empty`. String columns come out categorical
    (:func:`_concat`): a job's frame holds every collective of every rank."""
    import pandas as pd

    cols = COLLECTIVE_COLUMNS + MATCH_COLUMNS
    counts = list(counts or [])
    frames = [f for f in frames if len(f)]
    if not frames:
        df = pd.DataFrame(columns=cols)
        df.attrs["traces"] = counts
        return df
    df = _concat(frames)
    del frames
    by_rank = df.groupby("rank", observed=True)["start_us"]
    if not (df["rank"].is_monotonic_increasing and by_rank.is_monotonic_increasing.all()):
        df = df.sort_values(["rank", "start_us"], kind="stable", ignore_index=True)
    # match key: the same (process group, collective, bytes); the k-th such op on each rank is one instance
    df["match_key"] = pd.Categorical([f"{pg}|{c}|{b}" for pg, c, b in zip(df["process_group"], df["collective"],
                                                                           df["bytes"])])
    df["instance"] = df.groupby(["rank", "match_key"], observed=True).cumcount()
    if df["rank"].nunique() > 1:  # per instance, in place (no merge: a copy of a 10^6-row frame)
        inst = df.groupby(["match_key", "instance"], observed=True)["dur_us"]
        df["instance_min_us"], df["ranks_seen"] = inst.transform("min"), inst.transform("count")
        df["wait_us"] = df["dur_us"] - df["instance_min_us"]
    else:
        df["instance_min_us"], df["ranks_seen"], df["wait_us"] = df["dur_us"], 1, float("nan")
    df = df[cols]
    df.attrs["traces"] = counts
    return df


def summary(df: "pd.DataFrame") -> "pd.DataFrame":
    """Per (collective, bytes, group size): count, p50 duration, p50 and p90 busbw, p50 wait. Durations are the
    per-instance minimum over ranks when several ranks' traces were given (``duration_basis``)."""
    import numpy as np
    import pandas as pd

    if df is None or df.empty or "dur_us" not in df.columns or "collective" not in df.columns:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    df = df.reindex(columns=["rank", "collective", "bytes", "group_size", "dur_us", *MATCH_COLUMNS])  # any rows
    multi = df["rank"].nunique() > 1 and df["instance_min_us"].notna().any()
    out = []
    d = df.assign(bytes=df["bytes"].fillna(-1), group_size=df["group_size"].fillna(-1))
    for (c, b, n), g in d.groupby(["collective", "bytes", "group_size"], dropna=False, observed=True):
        wait = g["wait_us"].to_numpy(dtype=float)
        if multi:  # one duration per instance: the rank that arrived last
            durs = g.drop_duplicates(["match_key", "instance"])["instance_min_us"].to_numpy(dtype=float)
        else:
            durs = g["dur_us"].to_numpy(dtype=float)
        bw = stats.stats(busbws(None if b < 0 else b, durs, c, None if n < 0 else n))
        out.append({"collective": c, "bytes": None if b < 0 else int(b), "group_size": None if n < 0 else int(n),
                    "count": int(len(durs)), "dur_us_p50": stats.stats(durs)["median"],
                    "busbw_gbps_p50": bw["median"] if bw["n"] else None,
                    "busbw_gbps_p90": bw["p90"] if bw["n"] else None,
                    "wait_us_p50": float(np.nanmedian(wait)) if multi else None,
                    "duration_basis": "min over ranks per instance" if multi else "raw kernel durations (one rank)"})
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def explain_empty(df: "pd.DataFrame") -> str:
    """Why a :func:`collectives` frame is empty, from what its traces held."""
    ts = df.attrs.get("traces") if df is not None else None
    if not ts:
        return "no trace given"
    if not any(t["events"] for t in ts):
        return "the trace(s) hold no events at all"
    ranks = {t["world_size"] for t in ts}
    if ranks == {1}:
        if any(t["backend"] == "gloo" for t in ts):
            return "no gloo collective in this trace (one rank)"
        return "no NCCL kernel in this trace: with one rank NCCL launches none"
    if not any(t["gpu_kernels"] for t in ts) and not any(t["gloo_ops"] for t in ts):
        if any(t["backend"] == "nccl" for t in ts):
            return "no GPU kernel in the trace(s): was it recorded with ProfilerActivity.CUDA?"
        return "no GPU kernel and no gloo:<op> annotation in the trace(s): no collective was profiled"
    return "no NCCL kernel and no gloo:<op> annotation in the trace(s): no collective ran in the profiled window"


def _clean(records: list[dict]) -> list[dict]:
    return [{k: (None if _missing(v) else v) for k, v in r.items()} for r in records]


def to_json(df: "pd.DataFrame", s: "pd.DataFrame", rows: bool = True) -> dict[str, Any]:
    """``{"collectives": [rows], "summary": [rows], "notes"}`` (+ ``"failed"`` when some rank could not be
    read); ``rows=False``: without the collectives' rows (what :func:`write_json` streams)."""
    out = {"collectives": _clean(df.to_dict("records")) if rows else [], "summary": _clean(s.to_dict("records")),
           "notes": "summary durations: " + (s["duration_basis"].iloc[0] if len(s) else "n/a")}
    if df.empty:
        out["notes"] = explain_empty(df)
    if df is not None and df.attrs.get("failed"):  # some ranks could not be read: the result is partial
        out["failed"] = df.attrs["failed"]
    for k in ("job", "warnings"):
        if df is not None and df.attrs.get(k):
            out[k] = df.attrs[k]
    return out


def write_json(df: "pd.DataFrame", s: "pd.DataFrame", f: IO[str], chunk: int = 20000) -> None:
    """Write exactly ``json.dumps(to_json(df, s), indent=1, default=str)`` to ``f``, the collectives' rows a
    ``chunk`` at a time: a 64-rank job has ~10^6 rows, ~0.5 GB of JSON text and ~2 GB as Python dicts, which
    no process should hold at once. (A row dumped alone with ``indent=1`` and every line shifted by two
    spaces is the row as ``json.dumps`` nests it in the list of the top-level object.)"""
    import json

    marker = "\x00kit-rows\x00"
    head = to_json(df, s, rows=False)
    head["collectives"] = marker
    before, after = json.dumps(head, indent=1, default=str).split(json.dumps(marker), 1)
    f.write(before)
    if df.empty:
        f.write("[]")
    else:
        enc = json.JSONEncoder(indent=1, default=str).encode
        f.write("[")
        for i in range(0, len(df), chunk):
            rows = _clean(df.iloc[i:i + chunk].to_dict("records"))
            f.write(("\n  " if i == 0 else ",\n  ") + ",\n  ".join(enc(r).replace("\n", "\n  ") for r in rows))
        f.write("\n ]")
    f.write(after)


def format_text(df: "pd.DataFrame", s: "pd.DataFrame") -> str:
    if df is None or df.empty:
        return explain_empty(df)
    lines = [f"{len(df)} collective kernels on rank(s) {sorted(df['rank'].dropna().unique().tolist())}; "
             f"summary durations: {s['duration_basis'].iloc[0]}",
             f"{'collective':<16}{'bytes':>12}{'n':>4}{'count':>7}{'p50 us':>10}{'busbw p50':>11}{'busbw p90':>11}  GB/s"]
    for r in s.itertuples():
        def fmt(x):
            return f"{x:>11.2f}" if not _missing(x) else f"{'-':>11}"

        b = "-" if _missing(r.bytes) else str(int(r.bytes))
        n = "-" if _missing(r.group_size) else str(int(r.group_size))
        lines.append(f"{str(r.collective):<16}{b:>12}{n:>4}{r.count:>7}{r.dur_us_p50:>10.1f}"
                     f"{fmt(r.busbw_gbps_p50)}{fmt(r.busbw_gbps_p90)}")
    return "\n".join(lines)
