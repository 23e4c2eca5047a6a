"""Collectives in PyTorch profiler traces: one row per collective, bandwidth, one timeline, overlap, and
the Flight Recorder.

**Where the facts come from** (PyTorch 2.11, read off real traces): a NCCL kernel event (``cat: kernel``) carries
``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``Group size``, ``dtype``, ``In/Out split size``,
``Process Group Name``, ``Process Group Description`` and ``Process Group Ranks``; there is *no* sequence
number on the kernel. The trace header's ``distributedInfo`` gives ``rank``, ``world_size``, ``backend`` and the
NCCL version. Gloo runs no kernels: its work appears as ``gloo:<collective>`` user annotations carrying the
input's ``Input Dims``/``Input type``; group size comes from ``distributedInfo``. A trace without these
fields (older PyTorch, another tool) still gives kernel-level rows: the collective is read from the kernel name
(``ncclDevKernel_AllReduce_...`` / ``ncclKernel_AllReduce_...``), bytes stay empty.

**Bytes and bandwidth** follow nccl-tests (kit.collectives): ``bytes = max(in, out) elements x element size``,
``algbw = bytes / duration``, ``busbw = algbw x factor(collective, group size)``; P2P and unknown ops use 1.

**Waiting for a late peer.** A collective kernel starts on each GPU when its rank launches it and spins until
every peer has arrived, so on an early rank it is long. Given the traces of several ranks, instances are matched
across ranks -- the k-th collective of the same (process group, collective, bytes) on each rank, which NCCL's
rule that all ranks of a communicator issue collectives in the same order makes the same operation -- and each
row gets ``instance_min_us`` (the shortest duration over the ranks: the rank that arrived last waited for no
one, so its kernel is the transfer) and ``wait_us = dur_us - instance_min_us``. The **summary uses
instance_min_us** when several ranks are given, so its busbw is the link's, not the launch skew's; with one
trace it can only use the raw durations (and says so in ``duration_basis``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

from .. import traces
from ..investigations.collectives import bus_factor

_CANON = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "_allgather_base": "all_gather", "allgather": "all_gather", "all_gather": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all", "all_to_all_single": "all_to_all",
    "send": "send", "recv": "recv", "sendrecv": "send_recv", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier",
}
_KERNEL_COLL = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
                "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "send_recv", "AllToAll": "all_to_all"}
_KNAME = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\()")
_ESIZE = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8, "int": 4,
          "int32": 4, "long": 8, "int64": 8, "byte": 1, "uint8": 1, "char": 1, "int8": 1, "bool": 1, "short": 2,
          "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}

ROW_KEYS = ["rank", "collective", "bytes", "dtype", "group_size", "dur_us", "algbw_gbps", "busbw_gbps"]
SUMMARY_KEYS = ["collective", "bytes", "group_size", "count", "dur_us_p50", "busbw_gbps_p50", "busbw_gbps_p90"]


def canonical(name: str | None) -> str | None:
    if not name:
        return None
    n = name.split(":")[-1].strip()
    return _CANON.get(n, _CANON.get(n.lower(), n.lower()))


def _kernel_collective(name: str) -> str | None:
    m = _KNAME.search(name or "")
    return _KERNEL_COLL.get(m.group(1), m.group(1).lower()) if m else None


def _esize(dtype: str | None) -> int | None:
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


def _keep(e: dict) -> bool:
    c = e.get("cat")
    return c == "kernel" or (c == "user_annotation" and str(e.get("name", "")).startswith("gloo:"))


def collective_rows(path: str | Path) -> list[dict[str, Any]]:
    """One row per NCCL collective/P2P kernel (or gloo collective) in one trace file."""
    t = traces.load(path, keep=_keep)
    info = t.get("distributedInfo") or {}
    rank = info.get("rank")
    rows = []
    for e in t["traceEvents"]:
        if e.get("ph") != "X":
            continue
        a = e.get("args") or {}
        name = e.get("name", "")
        if e.get("cat") == "kernel":
            if not traces.is_nccl_kernel(name):
                continue
            coll = canonical(a.get("Collective name")) or _kernel_collective(name)
            n_in, n_out = a.get("In msg nelems"), a.get("Out msg nelems")
            dtype, group = a.get("dtype"), a.get("Group size")
            backend, stream, device = "nccl", a.get("stream"), a.get("device")
        else:  # gloo annotation
            coll = canonical(name)
            dtype = (a.get("Input type") or [None])[0]
            n_in = _nelems(a.get("Input Dims"))
            group = info.get("world_size")
            n_out = n_in * group if (coll == "all_gather" and n_in and group) else n_in
            if coll == "reduce_scatter" and n_in and group:  # gloo records the output shard as its input
                n_in = n_in * group
            backend, stream, device = "gloo", e.get("tid"), "cpu"
        es = _esize(dtype)
        nbytes = max(int(n_in or 0), int(n_out or 0)) * es if (es and (n_in or n_out)) else None
        dur = float(e.get("dur", 0.0))
        row = {"trace": Path(path).name, "rank": rank, "backend": backend, "device": device, "stream": stream,
               "kernel": name, "collective": coll, "bytes": nbytes, "dtype": dtype, "group_size": group,
               "process_group": a.get("Process Group Name"), "pg_desc": a.get("Process Group Description"),
               "pg_ranks": a.get("Process Group Ranks"), "seq": a.get("Seq", a.get("Sequence number")),
               "start_us": float(e.get("ts", 0.0)), "dur_us": dur}
        rows.append(row)
    rows.sort(key=lambda r: r["start_us"])
    for r in rows:
        _bandwidth(r, r["dur_us"])
    return rows


def _bandwidth(row: dict, dur_us: float, prefix: str = "") -> None:
    b, n, c = row.get("bytes"), row.get("group_size"), row.get("collective")
    if not b or not dur_us or dur_us <= 0:
        row[prefix + "algbw_gbps"] = row[prefix + "busbw_gbps"] = None
        return
    alg = b / (dur_us * 1e-6) / 1e9
    try:
        f = bus_factor(c, int(n)) if n and int(n) > 1 else 1.0
    except ValueError:  # p2p, barrier, reduce...: no bus factor
        f = 1.0
    row[prefix + "algbw_gbps"] = alg
    row[prefix + "busbw_gbps"] = alg * f


def collectives(paths: Iterable[str | Path]):
    """Rows of every trace, matched across ranks (see the module docstring): a DataFrame."""
    import pandas as pd

    rows = []
    for i, p in enumerate(paths):
        rs = collective_rows(p)
        for r in rs:
            if r["rank"] is None:
                r["rank"] = i  # a trace without distributedInfo: its position in the list
        rows += rs
    df = pd.DataFrame(rows)
    if df.empty:
        return df
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
    return df.sort_values(["rank", "start_us"]).reset_index(drop=True)


def summary(df):
    """Per (collective, bytes, group size): count, p50 duration, p50 and p90 busbw. Durations are the
    per-instance minimum over ranks when several ranks' traces were given (``duration_basis``)."""
    import numpy as np
    import pandas as pd

    if df.empty:
        return pd.DataFrame(columns=SUMMARY_KEYS)
    multi = df["rank"].nunique() > 1
    out = []
    d = df.assign(bytes=df["bytes"].fillna(-1), group_size=df["group_size"].fillna(-1))
    for (c, b, n), g in d.groupby(["collective", "bytes", "group_size"], dropna=False):
        wait = g["wait_us"].to_numpy(dtype=float)
        if multi:  # one duration per instance: the rank that arrived last
            g = g.drop_duplicates(["match_key", "instance"])
            durs = g["instance_min_us"].to_numpy(dtype=float)
        else:
            durs = g["dur_us"].to_numpy(dtype=float)
        bws = []
        for t in durs:
            r = {"bytes": None if b < 0 else b, "group_size": None if n < 0 else n, "collective": c}
            _bandwidth(r, t)
            bws.append(r["busbw_gbps"])
        bws = np.array([x for x in bws if x is not None], dtype=float)
        out.append({"collective": c, "bytes": None if b < 0 else int(b), "group_size": None if n < 0 else int(n),
                    "count": int(len(durs)), "dur_us_p50": float(np.median(durs)),
                    "busbw_gbps_p50": float(np.median(bws)) if bws.size else None,
                    "busbw_gbps_p90": float(np.percentile(bws, 90)) if bws.size else None,
                    "wait_us_p50": float(np.nanmedian(wait)) if multi else None,
                    "duration_basis": "min over ranks per instance" if multi else "raw kernel durations (one rank)"})
    return pd.DataFrame(out)


def to_json(df, s) -> dict[str, Any]:
    def clean(records):
        return [{k: (None if (isinstance(v, float) and v != v) else v) for k, v in r.items()} for r in records]

    return {"collectives": clean(df.to_dict("records")), "summary": clean(s.to_dict("records")),
            "notes": "summary durations: " + (s["duration_basis"].iloc[0] if len(s) else "n/a")}


def format_text(df, s) -> str:
    if df.empty:
        return "no collective kernels found"
    lines = [f"{len(df)} collective kernels on rank(s) {sorted(df['rank'].dropna().unique().tolist())}; "
             f"summary durations: {s['duration_basis'].iloc[0]}",
             f"{'collective':<16}{'bytes':>12}{'n':>4}{'count':>7}{'p50 us':>10}{'busbw p50':>11}{'busbw p90':>11}  GB/s"]
    for r in s.itertuples():
        fmt = lambda x: f"{x:>11.2f}" if x is not None and x == x else f"{'-':>11}"
        b = "-" if r.bytes is None or r.bytes != r.bytes else str(int(r.bytes))
        n = "-" if r.group_size is None or r.group_size != r.group_size else str(int(r.group_size))
        lines.append(f"{str(r.collective):<16}{b:>12}{n:>4}{r.count:>7}{r.dur_us_p50:>10.1f}"
                     f"{fmt(r.busbw_gbps_p50)}{fmt(r.busbw_gbps_p90)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ merge
def merge(paths: list[str | Path], out: str | Path) -> dict[str, Any]:
    """One Chrome trace with a process per (rank, original process), clocks aligned.

    Alignment: the end of the first collective that every rank ran (matched as in :func:`collectives`) is
    taken as simultaneous on all ranks -- a collective completes on every rank at nearly the same moment --
    and each rank's timestamps are shifted so those ends coincide with rank 0's (the offsets are returned).
    Without a common collective the traces are left on their own clocks.
    """
    import gzip

    loaded = [traces.load(p) for p in paths]
    ranks = [(t.get("distributedInfo") or {}).get("rank", i) for i, t in enumerate(loaded)]
    df = collectives(paths)
    offsets = {r: 0.0 for r in ranks}
    if not df.empty and df["rank"].nunique() == len(set(ranks)) > 1:
        common = df[df["ranks_seen"] == len(set(ranks))]
        if len(common):
            first = common.sort_values("start_us").iloc[0]
            sel = common[(common["match_key"] == first["match_key"]) & (common["instance"] == first["instance"])]
            ends = {r: float(g["start_us"].iloc[0] + g["dur_us"].iloc[0]) for r, g in sel.groupby("rank")}
            ref = ends.get(ranks[0], next(iter(ends.values())))
            offsets = {r: ref - ends.get(r, ref) for r in ranks}
    events, pid_map = [], {}
    for t, r in zip(loaded, ranks):
        for e in t["traceEvents"]:
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


# ------------------------------------------------------------------------------------------------ overlap
def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(iv) -> float:
    return sum(b - a for a, b in iv)


def _intersect(x, y) -> list[tuple[float, float]]:
    i = j = 0
    out = []
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap(events):
    """Per device: communication-kernel time (union of NCCL kernel intervals), the part of it overlapped by
    compute kernels (any other kernel), the share, and the exposed communication time (not overlapped)."""
    import pandas as pd

    rows = []
    k = events[events["cat"] == "kernel"]
    for dev, d in k.groupby("device"):
        comm = _union(list(zip(d[d["nccl"]]["ts"], d[d["nccl"]]["end"])))
        comp = _union(list(zip(d[~d["nccl"]]["ts"], d[~d["nccl"]]["end"])))
        c, o = _length(comm), _length(_intersect(comm, comp))
        rows.append({"device": dev, "comm_us": c, "overlapped_us": o, "exposed_us": c - o,
                     "overlap_share": o / c if c else float("nan"), "compute_us": _length(comp)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ flight recorder
def dump_flight_recorder() -> dict[str, Any]:
    """This process's Flight Recorder buffer (needs TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE > 0
    before the process group exists). Works for NCCL and, in recent PyTorch, gloo."""
    import pickle

    import torch._C._distributed_c10d as c10d

    # NCCL process groups keep their own recorder (_dump_nccl_trace); gloo's is the generic one
    # (_dump_fr_trace), which on a CUDA build of torch 2.11 is empty for NCCL jobs: keep the fuller dump.
    dumps = []
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        fn = getattr(c10d, name, None)
        if fn is not None:
            try:
                dumps.append(pickle.loads(fn()))
            except Exception:
                continue
    if not dumps:
        raise RuntimeError("this PyTorch build exposes no Flight Recorder dump (_dump_nccl_trace / _dump_fr_trace)")
    return max(dumps, key=lambda d: len(d.get("entries", [])))


def fr_entries(dump: dict[str, Any], rank: int):
    import pandas as pd

    rows = []
    for e in dump.get("entries", []):
        pg = e.get("process_group") or ("", "")
        rows.append({"rank": rank, "pg_name": pg[0], "pg_desc": pg[1], "seq": e.get("collective_seq_id"),
                     "p2p_seq": e.get("p2p_seq_id"), "is_p2p": e.get("is_p2p"), "op": e.get("profiling_name"),
                     "state": e.get("state"), "retired": e.get("retired"),
                     "input_sizes": json.dumps(e.get("input_sizes")), "output_sizes": json.dumps(e.get("output_sizes")),
                     "dtype": (e.get("input_dtypes") or [None])[0], "duration_ms": e.get("duration_ms"),
                     "time_created_ns": e.get("time_created_ns")})
    return pd.DataFrame(rows)


def fr_mismatches(df):
    """Per (process group, sequence number) of collectives: which ranks recorded it and which did not. A rank
    missing from a sequence number that others reached is the one that never issued that collective (the
    one a hang is waiting for); differing ops at one sequence number are a desync."""
    import pandas as pd

    if df.empty:
        return df
    c = df[~df["is_p2p"].astype(bool)]
    all_ranks = sorted(int(r) for r in df["rank"].unique())
    out = []
    for (pg, seq), g in c.groupby(["pg_name", "seq"]):
        present = sorted(int(r) for r in g["rank"].unique())
        ops = sorted(set(g["op"]))
        out.append({"pg_name": pg, "seq": int(seq), "ops": ", ".join(ops), "present": present,
                    "missing": [r for r in all_ranks if r not in present],
                    "states": ", ".join(f"{r}:{s}" for r, s in zip(g["rank"], g["state"])),
                    "problem": "missing rank(s)" if len(present) < len(all_ranks) else ("op mismatch" if len(ops) > 1 else "")})
    return pd.DataFrame(out)
