"""One row per collective of one trace (:func:`collective_frame`): what ``Trace.collectives`` is, with the
bytes and bandwidth of each (see :mod:`kit.traces.comm` for where the facts come from and for the matching
across ranks). A leaf of the trace layer: it reads a trace's frames and imports no other trace module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import stats
from ..collective_ops import bus_factor, canonical, from_kernel

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

_ESIZE = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8, "int": 4,
          "int32": 4, "long": 8, "int64": 8, "byte": 1, "uint8": 1, "char": 1, "int8": 1, "bool": 1, "short": 2,
          "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}

COLLECTIVE_COLUMNS = ["trace", "rank", "backend", "device", "stream", "kernel", "collective", "bytes", "dtype",
                      "group_size", "process_group", "pg_desc", "pg_ranks", "seq", "start_us", "dur_us",
                      "algbw_gbps", "busbw_gbps"]
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


def collective_frame(trace: Any) -> "pd.DataFrame":
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


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)
