"""One row per collective of one trace (:func:`collective_frame`): what ``Trace.collectives`` is, with the
bytes and bandwidth of each (see :mod:`kit.traces.comm` for where the facts come from and for the matching
across ranks). A leaf of the trace layer: it reads a trace's frames and imports no other trace module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import stats
from ..collective_ops import bus_factor, canonical, from_kernel

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
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


def busbws(nbytes, durs_us: "np.ndarray", collective, group_size) -> "np.ndarray":
    """:func:`bandwidth`'s busbw of each duration (one collective, size and group) at once, its Nones left out."""
    import numpy as np

    b = _num(nbytes)
    t = np.asarray(durs_us, dtype=float)
    if not b:
        return t[:0]
    n = _num(group_size)
    return stats.gbps(b, t[t > 0]) * (bus_factor(collective, n) if n else 1.0)


def collective_frame(trace: Any) -> "pd.DataFrame":
    """One row per NCCL collective/P2P kernel (or gloo op) of one :class:`Trace`, by start time.

    Column-wise: a job's trace holds thousands of NCCL kernels, so the names are mapped once per distinct value
    and the bytes and bandwidths computed as arrays (the same float operations as :func:`bandwidth`, element by
    element); the cells are the Python values a row-by-row build gives, so the frame (values, dtypes, order)
    is the same."""
    import numpy as np
    import pandas as pd

    info = trace.info
    g = trace.gpu[trace.gpu["nccl"]]
    names = g["name"].tolist()
    cols: dict[str, list] = dict(backend=["nccl"] * len(g), device=g["device"].tolist(), stream=g["stream"].tolist(),
                                 kernel=names, dtype=g["dtype"].tolist(), process_group=g["pg_name"].tolist(),
                                 pg_desc=g["pg_desc"].tolist(), pg_ranks=g["pg_ranks"].tolist(),
                                 seq=g["seq"].tolist(), start_us=g["ts"].tolist(), dur_us=g["dur"].tolist())
    memo: dict = {}

    def coll(c, k):
        key = (c, k)
        if key not in memo:
            memo[key] = canonical(c) or from_kernel(k)
        return memo[key]

    cols["collective"] = [coll(c, k) for c, k in zip(g["collective"].tolist(), names)]
    cols["n_in"] = [_num(x) for x in g["in_nelems"].tolist()]
    cols["n_out"] = [_num(x) for x in g["out_nelems"].tolist()]
    cols["group_size"] = [_num(x) for x in g["group_size"].tolist()]
    cpu = trace.cpu
    gloo = cpu[(cpu["cat"] == "user_annotation") & cpu["name"].astype(str).str.startswith("gloo:")]
    for e in gloo.itertuples(index=False):  # a few per step at most: CPU-side ops
        op, group = canonical(e.name), info.world_size
        n_in = _nelems(e.input_dims)
        n_out = n_in * group if (op == "all_gather" and n_in and group) else n_in
        if op == "reduce_scatter" and n_in and group:  # gloo records the output shard as its input
            n_in = n_in * group
        for k, v in dict(backend="gloo", device="cpu", stream=e.tid, kernel=e.name, collective=op, n_in=n_in,
                         n_out=n_out, dtype=(e.input_type or [None])[0] if isinstance(e.input_type, list) else None,
                         group_size=group, process_group=e.pg_name, pg_desc=e.pg_desc, pg_ranks=e.pg_ranks,
                         seq=e.seq, start_us=e.ts, dur_us=e.dur).items():
            cols[k].append(v)
    n = len(cols["backend"])
    if not n:
        return pd.DataFrame([], columns=COLLECTIVE_COLUMNS)
    sizes: dict = {}
    es = [sizes[d] if d in sizes else sizes.setdefault(d, _esize(d)) for d in cols["dtype"]]
    nbytes = [(max(a or 0, b or 0) * s or None) if s else None
              for a, b, s in zip(cols.pop("n_in"), cols.pop("n_out"), es)]
    cols["bytes"] = nbytes
    # bandwidth(): None unless bytes and a positive duration are known; busbw scales by the bus factor
    dur = np.array([np.nan if d is None else d for d in cols["dur_us"]], dtype=float)
    b = np.array([x or 0 for x in nbytes], dtype=float)
    with np.errstate(invalid="ignore"):
        ok = (b != 0) & (dur > 0)
    alg = np.where(ok, b / (np.where(ok, dur, 1.0) * 1e-6) / 1e9, np.nan)
    factors: dict = {}
    fac = [(factors[k] if k in factors else factors.setdefault(k, bus_factor(*k))) if k[1] else 1.0
           for k in zip(cols["collective"], cols["group_size"])]
    bus = alg * np.array(fac, dtype=float)
    cols["algbw_gbps"] = [v if o else None for v, o in zip(alg.tolist(), ok.tolist())]
    cols["busbw_gbps"] = [v if o else None for v, o in zip(bus.tolist(), ok.tolist())]
    cols["trace"], cols["rank"] = [trace.name] * n, [info.rank] * n
    order = np.argsort(np.array(cols["start_us"], dtype=float), kind="stable").tolist()
    return pd.DataFrame({c: [cols[c][i] for i in order] for c in COLLECTIVE_COLUMNS}, columns=COLLECTIVE_COLUMNS)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)
