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

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .. import stats
from ..collective_ops import bus_factor, canonical, from_kernel
from .flight_recorder import dump_flight_recorder, fr_entries, fr_mismatches  # noqa: F401  (kit.traces.comm.*)
from .frames import Trace, load_trace
from .merge import merge  # noqa: F401
from .overlap import overlap  # noqa: F401

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

_ESIZE = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8, "int": 4,
          "int32": 4, "long": 8, "int64": 8, "byte": 1, "uint8": 1, "char": 1, "int8": 1, "bool": 1, "short": 2,
          "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}

COLLECTIVE_COLUMNS = ["trace", "rank", "backend", "device", "stream", "kernel", "collective", "bytes", "dtype",
                      "group_size", "process_group", "pg_desc", "pg_ranks", "seq", "start_us", "dur_us",
                      "algbw_gbps", "busbw_gbps"]
MATCH_COLUMNS = ["match_key", "instance", "instance_min_us", "ranks_seen", "wait_us"]
ROW_KEYS = ["rank", "collective", "bytes", "dtype", "group_size", "dur_us", "algbw_gbps", "busbw_gbps"]
SUMMARY_KEYS = ["collective", "bytes", "group_size", "count", "dur_us_p50", "busbw_gbps_p50", "busbw_gbps_p90"]
SUMMARY_COLUMNS = SUMMARY_KEYS + ["wait_us_p50", "duration_basis"]


def _esize(dtype: Any) -> int | None:
    return _ESIZE.get(str(dtype).lower()) if dtype else None


def _nelems(dims) -> int | None:
    """Elements of the first tensor in a record_shapes ``Input Dims`` entry ([[65536]] or [[[65536]]])."""
    try:
        d = dims[0]
        while d and isinstance(d[0], list):
            d = d[0]
        out = 1
        for x in d:
            out *= int(x)
        return out
    except (TypeError, ValueError, IndexError):
        return None


def _num(x) -> int | None:
    try:
        return None if x is None or x != x else int(x)
    except (TypeError, ValueError):
        return None


def bandwidth(nbytes, dur_us, collective, group_size) -> tuple[float | None, float | None]:
    """``(algbw, busbw)`` in GB/s of one collective (None where bytes or duration are unknown)."""
    b = _num(nbytes)
    if not b or dur_us is None or not dur_us > 0:
        return None, None
    alg = stats.gbps(b, dur_us)
    n = _num(group_size)
    return alg, alg * (bus_factor(collective, n) if n else 1.0)


def collective_frame(trace: Trace) -> "pd.DataFrame":
    """One row per NCCL collective/P2P kernel (or gloo op) of one :class:`Trace`, by start time."""
    import pandas as pd

    info, rows = trace.info, []
    for e in trace.gpu[trace.gpu["nccl"]].itertuples(index=False):
        rows.append(dict(backend="nccl", device=e.device, stream=e.stream, kernel=e.name,
                         collective=canonical(e.collective) or from_kernel(e.name), n_in=_num(e.in_nelems),
                         n_out=_num(e.out_nelems), dtype=e.dtype, group_size=_num(e.group_size),
                         process_group=e.pg_name, pg_desc=e.pg_desc, pg_ranks=e.pg_ranks, seq=e.seq,
                         start_us=e.ts, dur_us=e.dur))
    cpu = trace.cpu
    gloo = cpu[(cpu["cat"] == "user_annotation") & cpu["name"].astype(str).str.startswith("gloo:")]
    for e in gloo.itertuples(index=False):
        coll, group = canonical(e.name), info.world_size
        n_in = _nelems(e.input_dims)
        n_out = n_in * group if (coll == "all_gather" and n_in and group) else n_in
        if coll == "reduce_scatter" and n_in and group:  # gloo records the output shard as its input
            n_in = n_in * group
        rows.append(dict(backend="gloo", device="cpu", stream=e.tid, kernel=e.name, collective=coll, n_in=n_in,
                         n_out=n_out, dtype=(e.input_type or [None])[0] if isinstance(e.input_type, list) else None,
                         group_size=group, process_group=e.pg_name, pg_desc=e.pg_desc, pg_ranks=e.pg_ranks,
                         seq=e.seq, start_us=e.ts, dur_us=e.dur))
    for r in rows:
        es = _esize(r["dtype"])
        r["bytes"] = max(r.pop("n_in") or 0, r.pop("n_out") or 0) * es if es else None
        r["bytes"] = r["bytes"] or None
        r["algbw_gbps"], r["busbw_gbps"] = bandwidth(r["bytes"], r["dur_us"], r["collective"], r["group_size"])
        r["trace"], r["rank"] = trace.name, info.rank
    rows.sort(key=lambda r: r["start_us"])
    return pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)


def collective_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of :func:`collective_frame` of one file as dicts (missing values None)."""
    df = load_trace(path, cpu="comm").collectives
    return [{k: (None if _missing(v) else v) for k, v in r.items()} for r in df.to_dict("records")]


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def collectives(traces: Iterable[str | Path | Trace]) -> "pd.DataFrame":
    """Rows of every trace (paths or loaded :class:`Trace`\\ s, one per rank), matched across ranks (see the
    module docstring). Always has :data:`COLLECTIVE_COLUMNS` + :data:`MATCH_COLUMNS`; ``df.attrs["traces"]``
    says what each trace held (:meth:`Trace.counts`), for :func:`explain_empty`."""
    import pandas as pd

    loaded = [t if isinstance(t, Trace) else load_trace(t, cpu="comm") for t in traces]
    frames = []
    for i, t in enumerate(loaded):
        f = t.collectives
        if len(f):
            frames.append(f.assign(rank=i) if t.info.rank is None else f)  # no distributedInfo: list position
    cols = COLLECTIVE_COLUMNS + MATCH_COLUMNS
    counts = [t.counts() for t in loaded]
    if not frames:
        df = pd.DataFrame(columns=cols)
        df.attrs["traces"] = counts
        return df
    df = pd.concat(frames, ignore_index=True)
    # match key: the same (process group, collective, bytes); the k-th such op on each rank is one instance
    df["match_key"] = [f"{pg}|{c}|{b}" for pg, c, b in zip(df["process_group"], df["collective"], df["bytes"])]
    df = df.sort_values(["rank", "start_us"])
    df["instance"] = df.groupby(["rank", "match_key"]).cumcount()
    if df["rank"].nunique() > 1:
        inst = df.groupby(["match_key", "instance"])["dur_us"].agg(["min", "count"]).rename(
            columns={"min": "instance_min_us", "count": "ranks_seen"}).reset_index()
        df = df.merge(inst, on=["match_key", "instance"], how="left")
        df["wait_us"] = df["dur_us"] - df["instance_min_us"]
    else:
        df["instance_min_us"], df["ranks_seen"], df["wait_us"] = df["dur_us"], 1, float("nan")
    df = df.sort_values(["rank", "start_us"]).reset_index(drop=True)[cols]
    df.attrs["traces"] = counts
    return df


def summary(df: "pd.DataFrame") -> "pd.DataFrame":
    """Per (collective, bytes, group size): count, p50 duration, p50 and p90 busbw, p50 wait. Durations are the
    per-instance minimum over ranks when several ranks' traces were given (``duration_basis``)."""
    import numpy as np
    import pandas as pd

    if df is None or df.empty or "dur_us" not in df.columns or "collective" not in df.columns:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    df = df.reindex(columns=list(dict.fromkeys([*df.columns, *COLLECTIVE_COLUMNS, *MATCH_COLUMNS])))  # any rows
    multi = df["rank"].nunique() > 1 and df["instance_min_us"].notna().any()
    out = []
    d = df.assign(bytes=df["bytes"].fillna(-1), group_size=df["group_size"].fillna(-1))
    for (c, b, n), g in d.groupby(["collective", "bytes", "group_size"], dropna=False):
        wait = g["wait_us"].to_numpy(dtype=float)
        if multi:  # one duration per instance: the rank that arrived last
            durs = g.drop_duplicates(["match_key", "instance"])["instance_min_us"].to_numpy(dtype=float)
        else:
            durs = g["dur_us"].to_numpy(dtype=float)
        bws = [bandwidth(None if b < 0 else b, t, c, None if n < 0 else n)[1] for t in durs]
        bw = stats.stats([x for x in bws if x is not None])
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


def to_json(df: "pd.DataFrame", s: "pd.DataFrame") -> dict[str, Any]:
    def clean(records):
        return [{k: (None if _missing(v) else v) for k, v in r.items()} for r in records]

    out = {"collectives": clean(df.to_dict("records")), "summary": clean(s.to_dict("records")),
           "notes": "summary durations: " + (s["duration_basis"].iloc[0] if len(s) else "n/a")}
    if df.empty:
        out["notes"] = explain_empty(df)
    return out


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
