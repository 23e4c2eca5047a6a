"""One trace file -> one :class:`Trace` of typed frames, through a declared adapter.

``load_trace(path)`` decodes the file once (:mod:`kit.traces.parse`) and builds:

* ``gpu`` -- one row per GPU activity (``cat`` kernel / gpu_memcpy / gpu_memset), columns :data:`GPU_COLUMNS`:
  name, cat, device, stream, ts, dur, end (us), nccl, correlation, external_id, and the collective metadata
  Kineto puts on NCCL kernels (collective as the trace spells it, in/out elements, group size, dtype, process
  group name/description/ranks, seq);
* ``cpu`` -- the CPU events the analyses need, columns :data:`CPU_COLUMNS`: user annotations (``gloo:<op>``,
  ``nccl:<op>``, ``ProfilerStep#N``, ...), the runtime and driver calls (``cudaLaunchKernel``,
  ``cudaGraphLaunch``, ``cuLaunchKernelEx``, synchronisations) with their ``correlation`` -- the id their
  kernel carries -- and the c10d / ``record_param_comms`` ops; ``cpu="all"`` keeps every CPU op;
* ``collectives`` -- one row per NCCL kernel or gloo op with bytes and bandwidth (:mod:`kit.traces.comm`);
* ``info`` -- the header's ``distributedInfo``: rank, world size, backend, NCCL version (:class:`TraceInfo`).

**Adapters.** Raw ``args`` keys, categories and header keys differ between PyTorch versions. An
:class:`Adapter` declares, for one trace format, which raw ``args`` key fills which column (several raw keys
may fill one column: the first present wins), which raw ``cat`` is which frame category, and which
``distributedInfo`` key is which info field. Nothing else reads raw ``args``: a new torch version that
renames a key is one more :class:`Adapter` in :data:`ADAPTERS` (``Adapter.extend`` copies one and changes a
few entries; ``detect(header)`` says when it applies, the first match wins). Two are declared: ``kineto``
(read off PyTorch 2.11 traces, unchanged since 2.1 for these keys) and ``kineto-legacy`` (PyTorch 1.8-1.9:
capitalised categories ``Kernel``/``Runtime``/``Operator``, ``external id`` in lower case), which is also the
fallback for a file without a ``schemaVersion`` header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping

from .parse import load

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
ARG_COLUMNS = ("device", "stream", "correlation", "external_id", "collective", "in_nelems", "out_nelems",
               "group_size", "dtype", "pg_name", "pg_desc", "pg_ranks", "seq", "input_dims", "input_type")
GPU_COLUMNS = ("name", "cat", "device", "stream", "ts", "dur", "end", "nccl", "correlation", "external_id",
               "collective", "in_nelems", "out_nelems", "group_size", "dtype", "pg_name", "pg_desc", "seq",
               "pg_ranks")
CPU_COLUMNS = ("name", "cat", "pid", "tid", "ts", "dur", "end", "correlation", "external_id", "collective",
               "in_nelems", "out_nelems", "group_size", "dtype", "pg_name", "pg_desc", "pg_ranks", "seq",
               "input_dims", "input_type")
_FLOAT = ("ts", "dur", "end")

_NCCL = re.compile(r"(^|_Z\d+)nccl(Dev)?Kernel", re.IGNORECASE)
COMM_OPS = re.compile(r"^(gloo:|nccl:|c10d::|record_param_comms$)")
"""the CPU ops ``cpu="default"`` keeps besides annotations and runtime calls: collectives and c10d ops"""


def is_nccl_kernel(name: str) -> bool:
    """NCCL kernels under both the old (``ncclKernel_*``) and the new (``ncclDevKernel_*``) naming, with or
    without a C++ mangling prefix (``_Z39ncclDevKernel_...``)."""
    return bool(_NCCL.search(name or "")) or (name or "").startswith("nccl")


# ------------------------------------------------------------------------------------------------ adapters
@dataclass(frozen=True)
class Adapter:
    """The declared mapping of one trace format (see the module docstring)."""

    name: str
    args: Mapping[str, str]
    """raw ``args`` key -> column (one of :data:`ARG_COLUMNS`)"""
    cats: Mapping[str, str]
    """raw ``cat`` -> frame category (one of :data:`GPU_CATS` or :data:`CPU_CATS`)"""
    info: Mapping[str, str] = field(default_factory=lambda: {
        "rank": "rank", "world_size": "world_size", "backend": "backend", "nccl_version": "nccl_version",
        "pg_config": "pg_config"})
    """raw ``distributedInfo`` key -> :class:`TraceInfo` field"""
    info_key: str = "distributedInfo"
    detect: Callable[[Mapping[str, Any]], bool] = lambda header: True
    """does this adapter apply to a trace with these top-level keys?"""

    def __post_init__(self) -> None:
        bad = sorted(set(self.args.values()) - set(ARG_COLUMNS)) + sorted(
            set(self.cats.values()) - set(GPU_CATS + CPU_CATS))
        if bad:
            raise ValueError(f"adapter {self.name}: unknown column(s)/category(ies) {bad}")
        by_col: dict[str, list[str]] = {}
        for raw, col in self.args.items():
            by_col.setdefault(col, []).append(raw)
        object.__setattr__(self, "_by_col", {c: tuple(r) for c, r in by_col.items()})

    def extend(self, name: str, args: Mapping[str, str] | None = None, cats: Mapping[str, str] | None = None,
               **kw) -> "Adapter":
        """A copy with more (or changed) entries: the way to declare the next torch version."""
        return replace(self, name=name, args={**self.args, **(args or {})}, cats={**self.cats, **(cats or {})}, **kw)

    def columns(self, a: Mapping[str, Any], cols: Iterable[str]) -> list[Any]:
        """The values of ``cols`` from one event's raw ``args``."""
        by_col = self._by_col  # type: ignore[attr-defined]
        out = []
        for c in cols:
            v = None
            for raw in by_col.get(c, ()):
                v = a.get(raw)
                if v is not None:
                    break
            out.append(v)
        return out


KINETO = Adapter(
    name="kineto",
    args={"device": "device", "stream": "stream", "correlation": "correlation", "External id": "external_id",
          "Collective name": "collective", "In msg nelems": "in_nelems", "Out msg nelems": "out_nelems",
          "Group size": "group_size", "dtype": "dtype", "Process Group Name": "pg_name",
          "Process Group Description": "pg_desc", "Process Group Ranks": "pg_ranks",
          # 'Seq' on collective events; 'Sequence number' is autograd's on cpu ops (kept for older traces)
          "Seq": "seq", "Sequence number": "seq", "Input Dims": "input_dims", "Input type": "input_type"},
    cats={**{c: c for c in GPU_CATS + CPU_CATS}},
    detect=lambda header: "schemaVersion" in header,
)
KINETO_LEGACY = KINETO.extend(
    "kineto-legacy",
    args={"external id": "external_id", "Input dims": "input_dims"},
    cats={"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Operator": "cpu_op",
          "Runtime": "cuda_runtime", "Driver": "cuda_driver"},
    detect=lambda header: True,
)
ADAPTERS: list[Adapter] = [KINETO, KINETO_LEGACY]
"""tried in order on a trace's top-level keys; the first whose ``detect`` is true parses it"""


def adapter_for(header: Mapping[str, Any]) -> Adapter:
    return next(a for a in ADAPTERS if a.detect(header))


def _raw_cats(frame_cats: Iterable[str]) -> frozenset[str]:
    want = set(frame_cats)
    return frozenset(raw for a in ADAPTERS for raw, c in a.cats.items() if c in want)


# ------------------------------------------------------------------------------------------------ the Trace
@dataclass(frozen=True)
class TraceInfo:
    """The header's ``distributedInfo`` (None where the trace has none) and how many events the file held."""

    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    nccl_version: str | None = None
    pg_config: tuple = ()
    events: int = 0
    """events in the file, kept or not"""


CpuMode = Literal["none", "comm", "default", "all"]


@dataclass(repr=False)
class Trace:
    """One parsed trace file (see the module docstring). ``events`` holds the raw kept events only when
    loaded with ``raw=True`` (what :func:`kit.traces.merge` writes back out)."""

    path: Path | None
    gpu: "pd.DataFrame"
    cpu: "pd.DataFrame"
    info: TraceInfo
    adapter: str
    header: dict = field(default_factory=dict)
    events: list[dict] | None = None

    @cached_property
    def collectives(self) -> "pd.DataFrame":
        """One row per NCCL kernel or gloo op (:data:`kit.traces.comm.COLLECTIVE_COLUMNS`); empty, with those
        columns, when the trace has none (:func:`kit.traces.comm.explain_empty` says why)."""
        from .comm import collective_frame

        return collective_frame(self)

    @property
    def rank(self) -> int | None:
        return self.info.rank

    @property
    def name(self) -> str:
        return self.path.name if self.path else "(trace)"

    def __repr__(self) -> str:
        i = self.info
        return (f"Trace({self.name}: rank {i.rank} of {i.world_size} ({i.backend}), {len(self.gpu)} GPU events "
                f"({int(self.gpu['nccl'].sum())} NCCL kernels), {len(self.cpu)} CPU events, adapter {self.adapter})")

    def counts(self) -> dict[str, Any]:
        """What the trace holds, for statements about what it lacks."""
        k = self.gpu[self.gpu["cat"] == "kernel"]
        gloo = self.cpu["name"].astype(str).str.startswith("gloo:") & (self.cpu["cat"] == "user_annotation")
        return {"trace": self.name, "rank": self.info.rank, "world_size": self.info.world_size,
                "backend": self.info.backend, "events": self.info.events, "gpu_kernels": int(len(k)),
                "nccl_kernels": int(k["nccl"].sum()), "gloo_ops": int(gloo.sum())}


class _Counting:
    """A keep predicate that counts every event it is asked about (the file's event count)."""

    def __init__(self, keep: Callable[[dict], bool]):
        self.keep, self.n = keep, 0

    def reset(self) -> None:
        self.n = 0

    def __call__(self, e: dict) -> bool:
        self.n += 1
        return self.keep(e)


def keep_predicate(cpu: CpuMode = "default") -> Callable[[dict], bool]:
    """The events :func:`load_trace` keeps: GPU activity, plus the CPU events ``cpu`` asks for."""
    gpu = _raw_cats(GPU_CATS)
    runtime = _raw_cats(("cuda_runtime", "cuda_driver"))
    annot = _raw_cats(("user_annotation",))
    cpu_cats = _raw_cats(CPU_CATS)

    def keep(e: dict) -> bool:
        c = e.get("cat")
        if c in gpu:
            return True
        if cpu == "none" or e.get("ph") != "X":
            return False
        if cpu == "all":
            return c is not None
        if cpu == "comm":
            return c in annot and str(e.get("name", "")).startswith(("gloo:", "nccl:"))
        return c in runtime or c in annot or (c in cpu_cats and bool(COMM_OPS.match(str(e.get("name", "")))))

    return keep


def load_trace(path: str | Path, *, cpu: CpuMode = "default", raw: bool = False,
               adapter: Adapter | None = None) -> Trace:
    """Parse one trace file once into a :class:`Trace`. Raises :class:`~kit.traces.TraceError` for a missing,
    truncated or foreign file.

    ``cpu``: which CPU events the ``cpu`` frame holds -- ``"default"`` (annotations, runtime/driver calls,
    c10d ops and ``record_param_comms``), ``"comm"`` (only the ``gloo:``/``nccl:`` collective annotations: what
    ``collectives`` needs), ``"none"``, ``"all"`` (every CPU op; memory grows with the trace). Events not kept
    are never held in memory.
    ``raw``: also keep the raw kept events (``Trace.events``) -- with ``cpu="all"``, every event.
    ``adapter``: force one instead of detecting it from the header.
    """
    keep = _Counting(keep_predicate(cpu))
    data = load(path, keep=keep if not (raw and cpu == "all") else None)
    n = keep.n if (not raw or cpu != "all") else len(data["traceEvents"])
    return from_dict(data, path=Path(path), adapter=adapter, raw=raw, n_events=n)


def from_dict(data: Mapping[str, Any], path: Path | None = None, adapter: Adapter | None = None,
              raw: bool = False, n_events: int | None = None) -> Trace:
    """A :class:`Trace` from an already decoded ``{"traceEvents": [...], ...}`` (every event is used)."""
    header = {k: v for k, v in data.items() if k != "traceEvents"}
    ad = adapter or adapter_for(header)
    events = data.get("traceEvents") or []
    arg_gpu = [c for c in GPU_COLUMNS if c in ARG_COLUMNS and c not in ("device", "stream")]
    arg_cpu = [c for c in CPU_COLUMNS if c in ARG_COLUMNS]
    gpu_rows, cpu_rows = [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = ad.cats.get(e.get("cat"))
        if cat is None:
            continue
        a = e.get("args") or {}
        name = e.get("name", "")
        ts, dur = float(e.get("ts", 0) or 0), float(e.get("dur", 0) or 0)
        if cat in GPU_CATS:
            dev, stream = ad.columns(a, ("device", "stream"))
            gpu_rows.append((name, cat, e.get("pid") if dev is None else dev, e.get("tid") if stream is None else stream,
                             ts, dur, ts + dur, cat == "kernel" and is_nccl_kernel(name), *ad.columns(a, arg_gpu)))
        else:
            cpu_rows.append((name, cat, e.get("pid"), e.get("tid"), ts, dur, ts + dur, *ad.columns(a, arg_cpu)))
    gpu = _frame(gpu_rows, ("name", "cat", "device", "stream", "ts", "dur", "end", "nccl", *arg_gpu), GPU_COLUMNS)
    cpu = _frame(cpu_rows, ("name", "cat", "pid", "tid", "ts", "dur", "end", *arg_cpu), CPU_COLUMNS)
    d = header.get(ad.info_key) or {}
    fields = {f: d.get(raw_key) for raw_key, f in ad.info.items()}
    fields["pg_config"] = tuple(fields.get("pg_config") or ())
    info = TraceInfo(**fields, events=len(events) if n_events is None else n_events)
    return Trace(path=path, gpu=gpu, cpu=cpu, info=info, adapter=ad.name, header=header,
                 events=list(events) if raw else None)


def _frame(rows: list[tuple], built: tuple[str, ...], columns: tuple[str, ...]) -> "pd.DataFrame":
    import pandas as pd

    df = pd.DataFrame.from_records(rows, columns=list(built)) if rows else pd.DataFrame(columns=list(built))
    df = df.reindex(columns=list(columns))
    for c in _FLOAT:
        df[c] = df[c].astype(float)
    if "nccl" in df.columns:
        df["nccl"] = df["nccl"].astype(bool)
    return df


def gpu_events(trace: Mapping[str, Any] | Trace) -> "pd.DataFrame":
    """The ``gpu`` frame of an already decoded trace dict (``kit.traces.load(path)``) or of a Trace: one row
    per GPU activity, columns :data:`GPU_COLUMNS`. Prefer ``load_trace(path).gpu``."""
    if isinstance(trace, Trace):
        return trace.gpu
    return from_dict(trace).gpu
