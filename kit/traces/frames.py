"""One trace file -> one :class:`Trace` of typed frames, through a declared adapter.

``load_trace(path)`` decodes the file once (:mod:`kit.traces.parse`) and builds:

* ``gpu`` -- one row per GPU activity (``cat`` kernel / gpu_memcpy / gpu_memset), columns :data:`GPU_COLUMNS`:
  name, cat, device, stream, ts, dur, end (us), nccl, correlation, external_id, and the collective metadata
  Kineto puts on NCCL kernels (collective as the trace spells it, in/out elements, group size, dtype, process
  group name/description/ranks, seq);
* ``cpu`` -- the CPU events the analyses need, columns :data:`CPU_COLUMNS`: user annotations (``gloo:<op>``,
  ``nccl:<op>``, ``ProfilerStep#N``, ...), the runtime and driver calls (``cudaLaunchKernel``,
  ``cudaGraphLaunch``, ``cuLaunchKernelEx``, synchronisations) with their ``correlation`` -- the id their
  kernel carries -- the c10d / ``record_param_comms`` ops, DDP's reducer ops and CUPTI's ``overhead`` events (the
  profiler's own host time: :data:`CPU_CATS`); ``cpu="all"`` keeps every CPU op;
* ``collectives`` -- one row per NCCL kernel or gloo op with bytes and bandwidth (:mod:`kit.traces.comm`);
* ``info`` -- the header's ``distributedInfo``: rank, world size, backend, NCCL version (:class:`TraceInfo`).

**Adapters.** Raw ``args`` keys, categories and header keys differ between PyTorch versions. An
:class:`Adapter` declares, for one trace format, which raw ``args`` key fills which column (several raw keys
may fill one column: the first present wins), which raw ``cat`` is which frame category, and which
``distributedInfo`` key is which info field. Nothing else reads raw ``args``: a new torch version that
renames a key is one more :class:`Adapter` in :data:`ADAPTERS` (``Adapter.extend`` copies one and changes a
few entries). The adapter of a trace is the one that knows most of the raw categories of its first events
(:func:`adapter_for`; among equals the first whose ``detect(header)`` accepts it). Two are declared: ``kineto``
(read off PyTorch 2.11 traces, unchanged since 2.1 for these keys) and ``kineto-legacy`` (PyTorch 1.8-1.9:
capitalised categories ``Kernel``/``Runtime``/``Operator``, ``external id`` in lower case -- with or without
``schemaVersion`` in the header: 1.9 wrote ``schemaVersion: 1``), which is also the fallback for a file without
a ``schemaVersion`` header.

Just over the kit's ~400-line guide: the adapters, the Trace type and the one-pass frame builder belong together (the builder reads the adapters' declarations).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping


from .columns import Columns, concat, is_nccl_kernel, to_columns  # noqa: F401  (kit.traces.frames.is_nccl_kernel)
from .parse import arg_columns, names

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "overhead")
"""``overhead``: CUPTI's own events (``Activity Buffer Request``, ``Buffer Flush``: the profiler's host time;
``Command Buffer Full``: a launch waiting for the GPU's full queue), on their own lane (pid -1), a few per trace"""
ARG_COLUMNS = ("device", "stream", "correlation", "external_id", "collective", "in_nelems", "out_nelems",
               "group_size", "dtype", "pg_name", "pg_desc", "pg_ranks", "seq", "input_dims", "input_type")
GPU_COLUMNS = ("name", "cat", "device", "stream", "ts", "dur", "end", "nccl", "correlation", "external_id",
               "collective", "in_nelems", "out_nelems", "group_size", "dtype", "pg_name", "pg_desc", "seq",
               "pg_ranks")
CPU_COLUMNS = ("name", "cat", "pid", "tid", "ts", "dur", "end", "correlation", "external_id", "collective",
               "in_nelems", "out_nelems", "group_size", "dtype", "pg_name", "pg_desc", "pg_ranks", "seq",
               "input_dims", "input_type")

COMM_OPS = re.compile(r"^(gloo:|nccl:|c10d::|record_param_comms$)")
"""the CPU ops ``cpu="default"`` keeps besides annotations and runtime calls: collectives and c10d ops"""
GRAD_SYNC_OPS = ("torch::distributed::reducer::", "torch.distributed.ddp.reducer::")
"""DDP's reducer ops, also kept by ``cpu="default"``: the host's part of a gradient sync (a gradient copied into its
bucket and divided, ``mul_out``; the bucket copied back, ``copy_bucket_to_grad``), two per parameter and sync"""


RECORD_FUNCTIONS = ("ProfilerStep#", "enumerate(DataLoader)", "Optimizer.step#", "Optimizer.zero_grad#")
"""PyTorch's own ``record_function`` annotations: ``user_annotation`` in current traces, but ``Operator`` (a
cpu_op) in PyTorch 1.8-1.9 ones -- read as annotations whatever the trace calls them, and kept by ``cpu="default"``"""


LONG_CPU_OP_US = 1000.0
"""``cpu="default"`` also keeps every CPU op at least this long: what the host did in a long stretch without CUDA
calls (an op's own host cost -- a foreach op over hundreds of tensors, a CPU tensor op -- is not a stall); a few
per step, so the frame stays small"""
CLOCK_CALLS = frozenset(f"<built-in function {f}>" for f in ("perf_counter", "perf_counter_ns", "time", "time_ns",
                                                               "monotonic", "monotonic_ns", "process_time",
                                                               "process_time_ns", "thread_time", "thread_time_ns"))
"""the names ``with_stack`` gives the clock reads of Python's ``time`` module (:attr:`TraceInfo.python_off_ops_stretches`)"""


def _cat(c: str, name: str) -> str:
    return "user_annotation" if c == "cpu_op" and name.startswith(RECORD_FUNCTIONS) else c


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


def adapter_for(header: Mapping[str, Any], cats: Iterable[str | None] | None = None) -> Adapter:
    """The adapter of a trace: by its events' raw categories when given (the one that knows most of them;
    among equals, the first whose ``detect`` accepts the header) -- a header says little: PyTorch 1.9 wrote
    ``schemaVersion: 1`` with the legacy categories ``Kernel``/``Runtime``/``Operator`` -- else by the header."""
    seen = {c for c in cats or () if c}
    if seen:
        score = {a.name: len(seen & a.cats.keys()) for a in ADAPTERS}
        best = max(score.values())
        if best:
            tied = [a for a in ADAPTERS if score[a.name] == best]
            return next((a for a in tied if a.detect(header)), tied[0])
    return next(a for a in ADAPTERS if a.detect(header))


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
    short_ops: int = 0
    """``cpu_op`` events of the file that the default CPU frame left out (shorter than :data:`LONG_CPU_OP_US`, not
    kept by name): counted, not kept -- the profiler's own overhead grows with every op it recorded
    (:mod:`kit.doctor.overhead`); where they ran is :attr:`Trace.short_spans`"""
    python_frames: int = 0
    """``python_function`` events of the file (recorded with ``with_stack=True``), counted, not kept: what the
    profiler recorded sets its own overhead (:mod:`kit.doctor.overhead` reads its settings here). Counted where the
    whole file was decoded (``cpu="default"`` or ``"all"``), else 0"""
    memory_events: int = 0
    """``[memory]`` instant events of the file (recorded with ``profile_memory=True``), counted as
    :attr:`python_frames`"""
    python_frames_off_ops: int = 0
    """those of :attr:`python_frames` that start on a thread that records ops, but more than
    :data:`LONG_CPU_OP_US` from any of its ops: a stretch of Python without an op (a loop of ``json.dumps``), not the
    model code's frames (``_frames_off``)"""
    python_off_ops_stretches: tuple = ()
    """where :attr:`python_frames_off_ops` lie: per stretch of them on one thread (frames that start less than
    :data:`LONG_CPU_OP_US` apart), ``(first start, last start, tid, frames, clock reads, frames from the first clock
    read to the last)`` -- clock reads: the frames of :data:`CLOCK_CALLS` (a loop that runs to a deadline reads the
    clock as it goes)"""


CpuMode = Literal["none", "comm", "default", "all"]


class Trace:
    """One parsed trace file (see the module docstring). ``events`` holds the raw kept events only when
    loaded with ``raw=True`` (what :func:`kit.traces.merge` writes back out).

    ``gpu`` and ``cpu`` may be given as :class:`Columns` (what the frame builder makes): each becomes its
    DataFrame on first access, so a caller that needs only a few columns as arrays (:meth:`array`: ``kit trace
    gaps``) never builds the frames -- nor imports pandas (0.3-0.4 s of a command on a 2-core box)."""

    def __init__(self, path: Path | None, gpu: "pd.DataFrame | Columns", cpu: "pd.DataFrame | Columns",
                 info: TraceInfo, adapter: str, header: dict | None = None, events: list[dict] | None = None,
                 warnings: Iterable[str] = (),
                 short_threads: "tuple[np.ndarray, np.ndarray, np.ndarray] | None" = None):
        import numpy as np

        from .intervals import union_np

        self.path, self.info, self.adapter = path, info, adapter
        self.short_threads: tuple[np.ndarray, np.ndarray, np.ndarray] = tuple(  # type: ignore[assignment]
            np.asarray(x, dtype=float) for x in (short_threads or ((), (), ())))
        """where each thread ran the ops the default frame left out (:attr:`TraceInfo.short_ops`): ``(start, end,
        tid)``, one row per stretch of one thread's short ops less than :data:`LONG_CPU_OP_US` apart
        (:func:`short_threads`; a tid that is not a number: NaN, one unknown thread). The host model reads which ops
        led a thread into its launches (:meth:`short_spans_of`)"""
        self.short_spans = union_np(*self.short_threads[:2], LONG_CPU_OP_US)
        """where the ops the default frame left out ran on any thread, merged where less than :data:`LONG_CPU_OP_US`
        apart: those ops being shorter, a stretch that long or longer holds none of their ends exactly where it lies
        outside these few spans (the host model's quiet time)"""
        self.header = {} if header is None else header
        self.events = events
        self.warnings: tuple[str, ...] = tuple(warnings)
        """non-fatal problems found while building the frames, one line each, the file named (events with a
        negative or zero duration dropped, with their count; a zero-duration ProfilerStep; a subsampled trace)"""
        self._frames: dict[str, Any] = {"gpu": gpu, "cpu": cpu}

    def short_spans_of(self, tids: Iterable) -> "tuple[np.ndarray, np.ndarray]":
        """The sorted disjoint spans in which any of threads ``tids`` ran short ops (:attr:`short_threads`)."""
        import numpy as np

        from .intervals import union_np

        a, b, t = self.short_threads
        want = [float(x) for x in tids if _numeric(x)]  # the short ops of a thread named otherwise are not kept apart
        m = np.isin(t, np.asarray(want, dtype=float)) if len(t) and want else np.zeros(len(t), dtype=bool)
        return union_np(a[m], b[m])

    def _frame(self, which: str) -> "pd.DataFrame":
        f = self._frames[which]
        if isinstance(f, Columns):
            f = self._frames[which] = f.frame()
        return f

    @property
    def gpu(self) -> "pd.DataFrame":
        """One row per GPU activity, columns :data:`GPU_COLUMNS`."""
        return self._frame("gpu")

    @property
    def cpu(self) -> "pd.DataFrame":
        """The kept CPU events, columns :data:`CPU_COLUMNS`."""
        return self._frame("cpu")

    def array(self, which: str, column: str) -> "np.ndarray":
        """One column of the ``gpu`` or ``cpu`` frame as a numpy array (a categorical column: an object array
        of its values), read off the :class:`Columns` while the DataFrame is not built."""
        f = self._frames[which]
        return f.array(column) if isinstance(f, Columns) else f[column].to_numpy()

    @cached_property
    def collectives(self) -> "pd.DataFrame":
        """One row per NCCL kernel or gloo op (:data:`kit.traces.collective_frame.COLLECTIVE_COLUMNS`); empty, with those
        columns, when the trace has none (:func:`kit.traces.comm.explain_empty` says why)."""
        from .collective_frame import collective_frame

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


def raw_arg_keys() -> tuple[str, ...]:
    """Every raw ``args`` key some adapter declares: the only ``args`` keys the decoder materialises."""
    return tuple(sorted({k for a in ADAPTERS for k in a.args}))


def _cpu_filter(cpu: CpuMode) -> Callable[[str, str], bool]:
    """``keep(frame_cat, name)`` for CPU events under ``cpu`` (GPU activity is always kept)."""
    if cpu == "none":
        return lambda c, n: False
    if cpu == "all":
        return lambda c, n: True
    if cpu == "comm":
        return lambda c, n: c == "user_annotation" and n.startswith(("gloo:", "nccl:"))
    kept = RECORD_FUNCTIONS + GRAD_SYNC_OPS
    return lambda c, n: c != "cpu_op" or bool(COMM_OPS.match(n)) or n.startswith(kept)


def load_trace(path: str | Path, *, cpu: CpuMode = "default", raw: bool = False,
               adapter: Adapter | None = None, cache: bool | None = None) -> Trace:
    """Parse one trace file once into a :class:`Trace`. Raises :class:`~kit.traces.TraceError` for a missing,
    truncated or foreign file.

    ``cpu``: which CPU events the ``cpu`` frame holds -- ``"default"`` (annotations, runtime/driver calls,
    c10d ops, ``record_param_comms`` and CUPTI's ``overhead`` events), ``"comm"`` (only the ``gloo:``/``nccl:``
    collective annotations: what ``collectives`` needs), ``"none"``, ``"all"`` (every CPU op; memory grows with the trace).
    ``raw``: also keep the raw events as dicts (``Trace.events``; every event with ``cpu="all"``, else the
    ones the frames hold) -- decoded as plain dicts (slower, all in memory), never cached.
    ``adapter``: force one instead of detecting it from the header.
    ``cache``: read/write the parsed frames in the trace cache (:mod:`kit.traces.cache`); None = the default
    (on, unless ``KIT_TRACE_CACHE=0``).
    """
    from . import cache as _cache
    from .parse import decode, load, paused_gc

    p = Path(path)
    use_cache = not raw and _cache.enabled(cache)
    if use_cache:
        hit = _cache.read(p, cpu, _parser(adapter))
        if hit is not None:
            return _cached_trace(p, *hit)
    if raw:  # one generic decode: the dicts are kept, the frames built from them
        data = load(p)
        n = len(data["traceEvents"])
        if cpu != "all":
            keep = keep_predicate(cpu)
            data["traceEvents"] = [e for e in data["traceEvents"] if keep(e)]
        return from_dict(data, path=p, adapter=adapter, raw=True, n_events=n, cpu=cpu)
    # a first pass picks the events of the kept categories when few are (GPU only, or GPU + annotations);
    # with the default CPU events most of a trace is a candidate and one pass is faster
    cats = None
    if cpu in ("none", "comm"):
        cats = {r for a in ADAPTERS for r, c in a.cats.items() if c in GPU_CATS or (cpu == "comm" and c == "user_annotation")}
        cats.add(WINDOW_CAT)
    with paused_gc():
        header, n_events, chunks = decode(p, cats)
        t = _build(header, chunks, path=p, adapter=adapter, cpu=cpu, n_events=n_events)
    if use_cache:
        meta = {"header": t.header, "adapter": t.adapter, "events": t.info.events, "short_ops": t.info.short_ops,
                "python_frames": t.info.python_frames, "memory_events": t.info.memory_events,
                "python_frames_off_ops": t.info.python_frames_off_ops,
                "python_off_ops_stretches": [list(x) for x in t.info.python_off_ops_stretches],
                "short_threads": [x.tolist() for x in t.short_threads], "warnings": list(t.warnings)}
        _cache.write(p, cpu, _parser(adapter), t._frames["gpu"], t._frames["cpu"], meta)
    return t


def _parser(adapter: Adapter | None) -> str:
    """A digest of the adapters in force (the forced one, else :data:`ADAPTERS`): part of the cache key, so
    that a changed or added adapter re-parses the traces cached before it."""
    import hashlib

    ads = [adapter] if adapter else ADAPTERS
    return hashlib.blake2b(repr([(a.name, sorted(a.args.items()), sorted(a.cats.items())) for a in ads]).encode(),
                           digest_size=6).hexdigest()


def _cached_trace(path: Path, gpu: Columns, cpu: Columns, meta: dict[str, Any]) -> Trace:
    """The Trace of frames read back from the cache (:func:`kit.traces.cache.read`)."""
    header = meta.get("header") or {}
    ad = next((a for a in ADAPTERS if a.name == meta.get("adapter")), None) or adapter_for(header)
    return Trace(path=path, gpu=gpu, cpu=cpu, info=trace_info(header, ad, int(meta.get("events") or 0),
                                                             int(meta.get("short_ops") or 0),
                                                             int(meta.get("python_frames") or 0),
                                                             int(meta.get("memory_events") or 0),
                                                             int(meta.get("python_frames_off_ops") or 0),
                                                             meta.get("python_off_ops_stretches") or ()),
                 adapter=ad.name, header=header, warnings=meta.get("warnings") or (),
                 short_threads=meta.get("short_threads") or None)


def keep_predicate(cpu: CpuMode = "default") -> Callable[[dict], bool]:
    """The raw event dicts a Trace of this ``cpu`` mode holds (for ``raw=True``)."""
    cats = {raw: c for a in ADAPTERS for raw, c in a.cats.items()}
    keep_cpu = _cpu_filter(cpu)

    def keep(e: dict) -> bool:
        c = cats.get(e.get("cat"))
        if c is None or e.get("ph") != "X":
            return False
        return c in GPU_CATS or keep_cpu(c, str(e.get("name", "")))

    return keep


def from_dict(data: Mapping[str, Any], path: Path | None = None, adapter: Adapter | None = None,
              raw: bool = False, n_events: int | None = None, cpu: CpuMode = "all") -> Trace:
    """A :class:`Trace` from an already decoded ``{"traceEvents": [...], ...}`` (``cpu="all"``: every CPU
    event is used)."""
    import msgspec

    from .parse import Event, TraceError

    header = {k: v for k, v in data.items() if k != "traceEvents"}
    try:  # back to JSON and decoded as the file would be: one path for files and dicts
        events = msgspec.json.decode(msgspec.json.encode(list(data.get("traceEvents") or [])), type=list[Event])
    except (msgspec.ValidationError, msgspec.EncodeError) as e:
        raise TraceError(f"{path or '(trace)'}: not a PyTorch profiler trace (traceEvents: {e})") from None
    t = _build(header, [events], path=path, adapter=adapter, cpu=cpu)
    if n_events is not None:
        t.info = replace(t.info, events=n_events)
    if raw:
        t.events = list(data.get("traceEvents") or [])
    return t


def _build(header: dict, chunks: Iterable[list], *, path: Path | None, adapter: Adapter | None,
           cpu: CpuMode, n_events: int | None = None) -> Trace:
    """Frames from decoded events, chunk by chunk (:func:`kit.traces.parse.decode`): in each chunk two list
    comprehensions pick the GPU and the kept CPU events, their names and args are decoded in one call each
    (:func:`kit.traces.parse.names`/``arg_columns``), and every column grows by one comprehension -- no per-event
    dict or row tuple, and a chunk's events are dropped before the next is decoded. Each chunk's columns are made
    compact (:func:`to_columns`) before the next, and joined at the end (:func:`kit.traces.columns.concat`)."""
    import numpy as np

    from .intervals import union_np

    rest, head, n_head = iter(chunks), [], 0
    while n_head < ADAPTER_WINDOW and (c := next(rest, None)) is not None:
        head.append(c)
        n_head += len(c)
    head = head or [[]]
    ad = adapter or adapter_for(header, {e.cat for c in head for e in c})

    def every() -> Iterable[list]:
        while head:
            yield head.pop(0)  # no reference kept here (itertools.chain's would hold them to the end)
        yield from rest
    keys = tuple(sorted({*raw_arg_keys(), *ad.args}))  # a forced adapter may declare keys ADAPTERS do not
    raw_of = lambda *cs: {r for r, c in ad.cats.items() if c in cs}  # noqa: E731
    gpu_raw = raw_of(*GPU_CATS)
    whole = {"none": set(), "all": raw_of(*CPU_CATS), "comm": set(),
             "default": raw_of("user_annotation", "cuda_runtime", "cuda_driver", "overhead")}[cpu]
    by_name = {"comm": raw_of("user_annotation"), "default": raw_of("cpu_op")}.get(cpu, set())
    """CPU events kept whole, and those kept only when their name says so (decoded only for these)"""
    keep_cpu = _cpu_filter(cpu)
    by_col = ad._by_col  # type: ignore[attr-defined]
    g_cols = [c for c in GPU_COLUMNS if c in ARG_COLUMNS and c not in ("device", "stream")]
    c_cols = [c for c in CPU_COLUMNS if c in ARG_COLUMNS]
    g_parts: list[Columns] = []
    c_parts: list[Columns] = []

    def arg(a: dict[str, tuple], col: str, n: int) -> list:
        """A column from the args columns: its first raw key's values, where None the next key's, ..."""
        raws = by_col.get(col, ())
        if not raws:
            return [None] * n
        out = list(a[raws[0]])
        for r in raws[1:]:
            out = [y if x is None else x for x, y in zip(out, a[r])]
        return out

    def raw_keys(cols) -> tuple[str, ...]:
        """The raw args keys that fill ``cols``: the only ones a frame's events have decoded (msgspec skips the
        others, and each decoded key is one more value per event to transpose)."""
        return tuple(sorted({r for c in cols for r in by_col.get(c, ()) if r in keys}))

    g_keys, c_keys = raw_keys(("device", "stream", *g_cols)), raw_keys(c_cols)
    cats = ad.cats

    def add(into: dict[str, list], evs: list, nm: list, gpu: bool) -> dict[str, tuple]:
        into["name"] += nm
        # a GPU event's category is its adapter's; only a cpu_op's may change with its name (_cat)
        into["cat"] += [cats[e.cat] for e in evs] if gpu else [_cat(cats[e.cat], n) for e, n in zip(evs, nm)]
        into["ts"] += [e.ts for e in evs]
        into["dur"] += [e.dur for e in evs]
        return arg_columns(evs, g_keys if gpu else c_keys)

    def chunk(events: list) -> tuple[Columns, Columns, list[tuple[float, float]], "np.ndarray"]:
        """One chunk's GPU and CPU columns, its profiler windows and its dropped short ops' (ts, dur): every list
        of its events is local, so they all go when it returns."""
        g: dict[str, list] = {c: [] for c in ("name", "cat", "ts", "dur", "device", "stream", *g_cols)}
        cc: dict[str, list] = {c: [] for c in ("name", "cat", "ts", "dur", "pid", "tid", *c_cols)}
        w = [e for e in events if e.cat == WINDOW_CAT and e.ph == "X" and e.ts is not None and e.dur]
        if cpu in ("default", "all"):  # the profiler's settings as recorded: Python frames, [memory] instants
            pf = [e for e in events if e.cat == "python_function" and e.ts is not None]
            counts[0] += len(pf)
            if pf:
                frames.append(np.array([[e.ts for e in pf], [_tid(e.tid) for e in pf],
                                        [n in CLOCK_CALLS for n in names(pf)]], dtype=float))
            inst = [e for e in events if e.cat == "cpu_instant_event"]
            counts[1] += sum(1 for n in names(inst) if n == "[memory]") if inst else 0
        wins = [(e.ts, e.ts + e.dur) for e, n in zip(w, names(w)) if n.startswith(WINDOW_NAME)]
        g_ev = [e for e in events if e.cat in gpu_raw and e.ph == "X"]
        a = add(g, g_ev, names(g_ev), True)
        g["device"] += [e.pid if d is None else d for e, d in zip(g_ev, arg(a, "device", len(g_ev)))]
        g["stream"] += [e.tid if s is None else s for e, s in zip(g_ev, arg(a, "stream", len(g_ev)))]
        for c in g_cols:
            g[c] += arg(a, c, len(g_ev))
        c_ev = [e for e in events if e.cat in whole and e.ph == "X"]
        c_names = names(c_ev)
        short = np.empty((3, 0))
        if by_name:
            cand = [e for e in events if e.cat in by_name and e.ph == "X"]
            nm = names(cand)
            kept = [keep_cpu(ad.cats[e.cat], n) or (cpu == "default" and (e.dur or 0) >= LONG_CPU_OP_US)
                    for e, n in zip(cand, nm)]
            c_ev += [e for e, k in zip(cand, kept) if k]
            c_names += [n for n, k in zip(nm, kept) if k]
            if cpu == "default":
                left = [e for e, k in zip(cand, kept) if not k]
                # no ts: NaN, dropped; no dur: an instant; the thread as a number (a non-numeric tid: NaN, one thread)
                tids = [e.tid for e in left]
                tid = np.array(tids)
                tid = (tid.astype(float) if tid.dtype.kind in "iuf" else
                       np.array([t if _numeric(t) else np.nan for t in tids], dtype=float))
                short = np.array([[e.ts for e in left], [e.dur or 0.0 for e in left], tid], dtype=float).reshape(3, -1)
        if cpu in ("default", "all"):  # where the ops ran, for the frames off them (often written after them)
            op_ev = [e for e in (cand if by_name else c_ev) if e.cat in op_raw and e.ts is not None]
            ops.append(np.array([[e.ts for e in op_ev], [e.ts + (e.dur or 0.0) for e in op_ev],
                                 [_tid(e.tid) for e in op_ev]], dtype=float).reshape(3, -1))
        a = add(cc, c_ev, c_names, False)
        cc["pid"] += [e.pid for e in c_ev]
        cc["tid"] += [e.tid for e in c_ev]
        for c in c_cols:
            cc[c] += arg(a, c, len(c_ev))
        return to_columns(g, GPU_COLUMNS), to_columns(cc, CPU_COLUMNS), wins, short

    seen = 0
    counts: list = [0, 0, 0, ()]  # python_function events, [memory] instants, Python frames off the ops, their stretches
    op_raw = raw_of("cpu_op")
    frames: list = []  # (ts, tid, clock read) of the Python frames, per chunk
    ops: list = [np.empty((3, 0))]  # (start, end, tid) of the ops, per chunk
    windows: list[tuple[float, float]] = []
    short = [np.empty((3, 0))]
    for events in every():
        seen += len(events)
        gp, cp, wins, sh = chunk(events)
        del events  # before the next chunk is decoded
        g_parts.append(gp)
        c_parts.append(cp)
        windows += wins
        short.append(sh)
    cpu_cols = concat(c_parts)
    if by_name and cpu_cols.n:  # the name-selected events were appended: back to time order
        cpu_cols = cpu_cols.take(np.argsort(cpu_cols.values["ts"], kind="stable"))
    ts, dur, tid = np.concatenate(short, axis=1)
    spans = short_threads(ts, ts + dur, tid)
    name = path.name if path else "(trace)"
    (gpu_cols, cpu_cols), warnings = _valid(concat(g_parts), cpu_cols, name, windows)
    if frames:
        counts[2], counts[3] = _frames_off(np.concatenate(frames, axis=1), np.concatenate(ops, axis=1))
    info = trace_info(header, ad, seen if n_events is None else n_events, len(ts), *counts)
    return Trace(path=path, gpu=gpu_cols, cpu=cpu_cols, info=info, adapter=ad.name, header=header, warnings=warnings,
                 short_threads=spans)


def _numeric(x) -> bool:
    """Whether a tid is a number (Kineto's are; the Chrome trace format allows strings: such a thread's short ops are
    kept as one unknown thread's, NaN)."""
    import numbers

    return isinstance(x, numbers.Real) and not isinstance(x, bool) and x == x


def _tid(t) -> float:
    """A thread id as a number (NaN for one named otherwise)."""
    return float(t) if _numeric(t) else float("nan")


def _frames_off(frames: "np.ndarray", ops: "np.ndarray") -> tuple[int, tuple]:
    """How many Python frames (``(ts, tid, clock read)`` columns) start on a thread that records ops but outside its
    ``cpu_op`` spans merged where less than :data:`LONG_CPU_OP_US` apart (:func:`short_threads`): a stretch of Python
    that records no op (:attr:`TraceInfo.python_frames_off_ops`); and their stretches
    (:attr:`TraceInfo.python_off_ops_stretches`)."""
    import numpy as np

    sa, sb, st = short_threads(*ops)
    n, out = 0, []
    ft, tt, clock = frames
    for t in np.unique(tt[~np.isnan(tt)]):
        m, k = tt == t, st == t
        if not k.any():
            continue
        a, b = sa[k], sb[k]
        o = np.argsort(ft[m], kind="stable")
        x, c = ft[m][o], clock[m][o]
        i = np.searchsorted(a, x, side="right") - 1
        off = ~((i >= 0) & (x < b[np.clip(i, 0, len(b) - 1)]))
        n += int(off.sum())
        x, c = x[off], c[off]
        if not len(x):
            continue
        cut = np.flatnonzero(np.diff(x) >= LONG_CPU_OP_US) + 1
        for lo, hi in zip(np.r_[0, cut], np.r_[cut, len(x)]):
            k = np.flatnonzero(c[lo:hi])  # the clock reads: the frames from the first to the last one are timed
            out.append((float(x[lo]), float(x[hi - 1]), float(t), int(hi - lo), int(len(k)),
                        int(k[-1] - k[0] + 1) if len(k) else 0))
    return n, tuple(out)


def short_threads(a, b, tid) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
    """Per thread (``tid``; NaN: one unknown thread), its spans ``a``-``b`` merged where less than
    :data:`LONG_CPU_OP_US` apart (:func:`kit.traces.intervals.union_np`), as ``(start, end, tid)`` sorted by thread
    then start (:attr:`Trace.short_threads`): a few spans per thread and step, where the ops are thousands; merged
    over every thread they are :attr:`Trace.short_spans` (the same merge, in any order)."""
    import numpy as np

    from .intervals import union_np

    a, b, tid = (np.asarray(x, dtype=float) for x in (a, b, tid))
    out = [np.empty((3, 0))]
    unknown = np.isnan(tid)
    for t in [*np.unique(tid[~unknown]), *([np.nan] if unknown.any() else [])]:
        m = unknown if np.isnan(t) else tid == t
        sa, sb = union_np(a[m], b[m], LONG_CPU_OP_US)
        out.append(np.array([sa, sb, np.full(sa.shape, t)]))
    sa, sb, st = np.concatenate(out, axis=1)
    return sa, sb, st


ADAPTER_WINDOW = 65536
"""events whose categories pick the adapter (:func:`adapter_for`): the file's first ones, over as many of the
parse's chunks as it takes -- a PyTorch 1.9 trace may open with thousands of ``python_function`` events"""
WINDOW_CAT, WINDOW_NAME = "Trace", "PyTorch Profiler"
"""the event Kineto writes for the profiler's window (``"cat": "Trace", "name": "PyTorch Profiler (0)"``): every
GPU event of a trace lies inside it (all of tests/data, recorded/ and the public traces of HTA, kineto and param)"""
WINDOW_SLACK_US = 1.0


def _valid(gpu: Columns, cpu: Columns, name: str,
           windows: list[tuple[float, float]] = ()) -> tuple[tuple[Columns, Columns], list[str]]:
    """The frames without the events no analysis can use, and one warning line per kind dropped: GPU activity
    with a negative duration, or zero in a trace whose times have sub-us digits (a GPU kernel takes time: a
    lost or corrupt timestamp, that would count as idle time or more than 100% of a step; in traces of whole us
    -- PyTorch <= 1.9 -- a zero is a kernel shorter than 1 us, and kept), CPU events with a negative duration,
    ``ProfilerStep#N`` annotations of zero duration (a step without length would divide its costs by zero),
    GPU activity wholly outside the profiler's windows (``windows``: its ``Trace`` events; a corrupt timestamp
    would stretch every span and step it falls in; CPU ops are not checked: a long one may straddle the
    window's edges)."""
    import numpy as np

    warnings = []
    gd = gpu.values["dur"]
    n_neg = int((gd < 0).sum())
    # zero: a lost end where times have sub-us digits; where they are whole us (PyTorch <= 1.9) a kernel < 1 us
    zero = (gd == 0) if bool((gd % 1 != 0).any()) else np.zeros(len(gd), dtype=bool)
    n_zero = int(zero.sum())
    if n_neg or n_zero:
        what = " and ".join(x for x in (f"{n_neg} with a negative duration" if n_neg else "",
                                        f"{n_zero} with zero duration" if n_zero else "") if x)
        warnings.append(f"{name}: {n_neg + n_zero} GPU event(s) dropped, {what} (lost or corrupt timestamps)")
        gpu = gpu.take(np.flatnonzero((gd >= 0) & ~zero))
    cd = cpu.values["dur"]
    neg = cd < 0
    drop = neg
    if neg.any():
        warnings.append(f"{name}: {int(neg.sum())} CPU event(s) with a negative duration dropped (corrupt timestamps)")
    step_codes = [i for i, n in enumerate(cpu.categories.get("name", [])) if n.startswith("ProfilerStep")]
    if cpu.n and step_codes:
        zero_steps = np.isin(cpu.values["name"], step_codes) & (cd == 0)
        if zero_steps.any():
            names = sorted({cpu.categories["name"][i] for i in cpu.values["name"][zero_steps].tolist()})
            warnings.append(f"{name}: {int(zero_steps.sum())} ProfilerStep annotation(s) of zero duration dropped "
                            f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): a step without length")
            drop = drop | zero_steps
    from .intervals import union_np

    w_lo, w_hi = union_np([lo for lo, _ in windows], [hi for _, hi in windows])  # windows of no length: none
    if len(w_lo) and gpu.n:  # GPU activity only: a long CPU op may straddle the window's edges
        los, his = w_lo - WINDOW_SLACK_US, w_hi + WINDOW_SLACK_US
        k = np.searchsorted(los, gpu.values["end"], side="right") - 1  # the last window starting before the end
        g_out = (k < 0) | (his[np.maximum(k, 0)] < gpu.values["ts"])
        if g_out.any():
            warnings.append(f"{name}: {int(g_out.sum())} GPU event(s) wholly outside the profiler's window "
                            f"({w_hi[0] - w_lo[0]:.0f} us) dropped (corrupt timestamps)")
            gpu = gpu.take(np.flatnonzero(~g_out))
    if drop.any():
        cpu = cpu.take(np.flatnonzero(~drop))
    sampled = subsampled(gpu.values["external_id"])
    if sampled:
        warnings.append(f"{name}: {sampled}")
    return (gpu, cpu), warnings


SAMPLED_DENSITY = 0.02
"""below this share of the launching ops' ids between the first and the last GPU event's, a trace looks
subsampled. Every CPU op gets the next External id and a GPU event carries its launching op's: in complete
traces 6-46% of the ids in that range are on GPU events (HTA's test traces, param's DLRM ranks, the kit's
recorded runs), in HTA's ``trace_filter/sampled_rank-*`` 0.4-0.5%."""


def subsampled(external_ids: "np.ndarray", min_ids: int = 200) -> str | None:
    """A line saying the trace looks subsampled (events dropped before it was written: a sampling exporter, a
    filter) when the GPU events' launching-op ids are sparse (:data:`SAMPLED_DENSITY`); None otherwise, or
    with fewer than ``min_ids`` distinct ids (CUDA-graph replays carry none)."""
    import numpy as np

    ids = np.unique(external_ids[np.isfinite(external_ids) & (external_ids > 0)])
    if len(ids) < min_ids:
        return None
    share = len(ids) / (ids[-1] - ids[0] + 1)
    if share >= SAMPLED_DENSITY:
        return None
    return (f"looks subsampled: its GPU events come from {len(ids)} of the {int(ids[-1] - ids[0] + 1)} ops between "
            f"their first and last launching op ({share:.1%}; complete traces: 6% or more), so events were dropped "
            f"before it was written -- gaps, idle time and per-step costs are not those of the run")


def trace_info(header: Mapping[str, Any], ad: Adapter, events: int, short_ops: int = 0, python_frames: int = 0,
               memory_events: int = 0, python_frames_off_ops: int = 0, python_off_ops_stretches=()) -> TraceInfo:
    """The header's distributed info through the adapter's declared keys (``events``, ``short_ops``,
    ``python_frames``, ``memory_events``: counts of the file's events, :class:`TraceInfo`)."""
    d = header.get(ad.info_key)
    d = d if isinstance(d, dict) else {}
    fields = {f: d.get(raw_key) for raw_key, f in ad.info.items()}
    for f in ("rank", "world_size"):  # a foreign header may say anything: an int or nothing
        v = fields.get(f)
        fields[f] = int(v) if isinstance(v, (int, float)) or (isinstance(v, str) and v.isdigit()) else None
    pg = fields.get("pg_config")
    fields["pg_config"] = tuple(pg) if isinstance(pg, (list, tuple)) else ()
    return TraceInfo(**fields, events=events, short_ops=short_ops, python_frames=python_frames,
                     memory_events=memory_events, python_frames_off_ops=python_frames_off_ops,
                     python_off_ops_stretches=tuple(tuple(x) for x in python_off_ops_stretches))


def gpu_events(trace: Mapping[str, Any] | Trace) -> "pd.DataFrame":
    """The ``gpu`` frame of an already decoded trace dict (``kit.traces.load(path)``) or of a Trace: one row
    per GPU activity, columns :data:`GPU_COLUMNS`. Prefer ``load_trace(path).gpu``."""
    if isinstance(trace, Trace):
        return trace.gpu
    return from_dict(trace).gpu
