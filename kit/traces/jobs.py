"""Many rank traces at once: which files, and per-rank work in parallel with bounded memory.

A real job has 8 to 1,000 ranks and 50-500 MB of trace per rank: no process can hold them all. Every
multi-rank analysis of the kit is therefore split in two:

1. **per rank** -- a module-level function ``fn(path) -> summary`` parses one rank's trace and returns a
   *small* result (the rank's collectives frame: one row per NCCL kernel; its gap statistics): never the
   event list. :func:`map_ranks` runs it over every rank;
2. **across ranks** -- matching collective instances, late ranks, clock offsets -- works on those summaries
   in the calling process (:mod:`kit.traces.comm`, :mod:`kit.traces.merge`).

**Where the per-rank work runs.**

* ``workers=1``: in this process, one rank after another (no pool; what tests and debuggers want).
* ``workers=N`` (``None``: the machine's cores, or this process when the traces total under
  :data:`SMALL_INPUT` on disk): a :class:`concurrent.futures.ProcessPoolExecutor` of N
  processes -- the standard library, no extra dependency, and real parallelism for the parse (pure Python
  work under the GIL would not run in threads). ``forkserver`` (else ``spawn``) start method: no copy of the
  parent's memory (the parent may already hold results), and the server imports the trace layer (and what the
  caller names in ``preload``: pandas, for the doctor) once, so a worker starts without re-importing them. Never
  more workers than ranks. As with any process pool, a *script* calling this must guard its entry point with
  ``if __name__ == "__main__":`` (notebooks and ``kit`` commands need nothing).
* ``client=``: a :class:`dask.distributed.Client` (or a scheduler address, ``"tcp://host:8786"``): the same
  ``fn`` through ``client.map``, results gathered on the client. This is the way beyond one machine -- a Dask
  cluster spans nodes, and on SLURM ``dask-jobqueue`` starts one -- with the files on a file system every
  worker sees. Dask is optional (``pip install kit[cluster]``); a clear error says so when it is missing.

**Memory is bounded** because each worker holds one rank at a time: the pool gets one task per rank and a
worker takes the next only when it has returned the previous result, so the peak is ``workers`` x (one
rank's parse) in the workers + the summaries in the caller. A worker process is replaced after
``MAX_TASKS_PER_CHILD`` ranks, so a fragmented heap does not grow over hundreds of ranks. Measured
(``benchmarks/bench_trace_tools.py``, 64 ranks x 100 MB, ``kit trace collectives``): each worker ~0.4 GB, the
caller ~0.45 GB with the 800,000 matched collectives of the whole job.

**A bad rank does not sink the job.** ``fn`` raising in one rank (a truncated file: :class:`TraceError`;
anything else: ``ExcType: message``) makes a :class:`RankFailure` in :attr:`RankResults.failed`, never a
traceback; the other ranks' results are in :attr:`RankResults.ok` and :attr:`RankResults.partial` says the
result is incomplete (``kit trace ...`` exits 3). A worker process that dies (killed for memory) fails the
ranks it held the same way (``BrokenProcessPool``, Dask's ``KilledWorker``).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Sequence, TypeVar

from .names import parse_name
from .parse import TraceError

if TYPE_CHECKING:  # pragma: no cover
    from .frames import Trace

T = TypeVar("T")

TRACE_SUFFIX = re.compile(r"(\.pt\.trace)?\.json(\.gz)?\Z")
MAX_TASKS_PER_CHILD = 32
"""ranks a pool worker parses before it is replaced by a fresh process"""
SMALL_INPUT = 64 * 2**20
"""with ``workers=None``, traces totalling less than this on disk are parsed in this process: starting
worker processes (~0.5 s: each imports pandas) would cost more than it saves"""


# ------------------------------------------------------------------------------------------------ inputs
NOT_TRACES = frozenset({"meta.json", "report.json", "config.json"})
"""JSON files a kit run or report directory holds beside its traces"""


def _is_rank_trace(p: Path) -> bool:
    """A file in a directory that is a rank trace: ``.json``/``.json.gz``/``.pt.trace.json[.gz]`` that
    :func:`_not_a_rank` does not rule out."""
    return p.is_file() and bool(TRACE_SUFFIX.search(p.name)) and _not_a_rank(p) is None


SIDECARS = ("capture_", "summary_")
"""name prefixes of the JSON written beside traces (:mod:`kit.capture`'s ``capture_rank<r>.json``): not a rank
when they hold no ``traceEvents`` -- told by their content, as their names carry a rank too"""


def _not_a_rank(p: Path) -> str | None:
    """Why a trace-like file of a directory is not one of its rank traces (None when it is one): a merged output
    (``merged*``), a Flight Recorder dump (``fr_*``), an NCCL profiler-plugin dump or its ``nccl_profiler.json``,
    a hidden file (a merge in progress), a file inside a ``.kitcache``, a run's or report's own JSON
    (:data:`NOT_TRACES`), a sidecar (:data:`SIDECARS`) without ``traceEvents``, other JSON with neither a rank nor
    'trace' in its name and without ``traceEvents`` (:func:`_has_trace_events`)."""
    n = p.name
    if ".kitcache" in p.parts:
        return "in the trace cache"
    for prefix, why in ((".", "hidden"), ("merged", "a merged trace"), ("fr_", "a Flight Recorder dump"),
                        ("nccl_profiler", "an NCCL profiler-plugin dump")):
        if n.startswith(prefix):
            return why
    if n in NOT_TRACES:
        return "a run's or report's own JSON"
    if n.startswith(SIDECARS):
        return None if _has_trace_events(p) else (
            "kit.capture's sidecar, not a trace: no traceEvents" if n.startswith("capture_") else "no traceEvents")
    if parse_name(n) is not None or "trace" in n.lower() or _has_trace_events(p):
        return None
    return f"no rank or 'trace' in its name, no traceEvents in its first {SNIFF_BYTES // 1024} KB"


SNIFF_BYTES = 1 << 16
"""how much of a JSON file without a rank or 'trace' in its name is read to tell a trace from other JSON"""


def _has_trace_events(p: Path) -> bool:
    """Whether the file's first :data:`SNIFF_BYTES` name ``traceEvents``: a directory's ``config.json``,
    ``metrics.json`` or a corpus' ``truth.json`` is not a rank of the job (a Kineto trace names its events after a
    header of a few KB). Only asked of sidecars and of files whose name says neither rank nor trace; unreadable, empty (a
    profiler stopped before it wrote: ``rank0.json`` of 0 bytes) or not JSON at all (no ``{`` or ``[`` first):
    kept, so that reading it names the problem."""
    import gzip

    try:
        with (gzip.open(p, "rb") if p.name.endswith(".gz") else open(p, "rb")) as f:
            head = f.read(SNIFF_BYTES)
    except (OSError, EOFError):
        return True
    return b'"traceEvents"' in head or head.lstrip()[:1] not in (b"{", b"[")


def _rank_key(p: Path) -> tuple:
    parsed = parse_name(p.name)
    rank = parsed[1] if parsed else None
    return (rank is None, rank if rank is not None else 0, p.name, str(p))


def expand(inputs: Iterable[str | Path] | str | Path) -> list[Path]:
    """The rank trace files named by ``inputs``: files (kept as given, even under another name), directories
    (their rank traces, not recursively: ``*.json``, ``*.json.gz``, ``*.pt.trace.json[.gz]``, without
    ``merged*`` outputs, ``fr_*`` dumps, hidden files, ``.kitcache`` files, sidecars and other JSON:
    :func:`_not_a_rank`, whose reasons the error names when nothing is left) and glob patterns
    (``runs/job/*rank*.json.gz``).
    Sorted by rank (:func:`kit.traces.names.parse_name`; files without a rank in their name come last, by
    name), each file once. A directory or pattern that matches nothing is a :class:`TraceError` naming it; a
    file that does not exist is passed on (its rank fails when read, naming it)."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    out: dict[Path, None] = {}
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = [f for f in p.iterdir() if _is_rank_trace(f)]
            if not found:
                other = sorted(f for f in p.iterdir() if f.is_file() and TRACE_SUFFIX.search(f.name))
                why = "; ".join(f"{f.name} ({_not_a_rank(f)})" for f in other[:5])
                why = f" (other JSON skipped: {why}{'; ...' if len(other) > 5 else ''})" if other else ""
                raise TraceError(f"{p}: no rank trace (*.json, *.json.gz) in this directory{why}")
        elif not p.exists() and glob.has_magic(str(item)):
            found = [Path(f) for f in glob.glob(str(item)) if _is_rank_trace(Path(f))]
            if not found:
                raise TraceError(f"{item}: no trace file matches this pattern")
        else:
            found = [p]
        for f in sorted(found, key=_rank_key):
            out.setdefault(f, None)
    if not out:
        raise TraceError("no trace file given")
    return sorted(out, key=_rank_key) if len(out) > 1 else list(out)


# ------------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class RankFailure:
    """One rank whose work failed: the file and a one-line reason (never a traceback)."""

    path: Path
    error: str

    def to_json(self) -> dict[str, str]:
        return {"trace": str(self.path), "error": self.error}


@dataclass
class RankResults(Generic[T]):
    """What :func:`map_ranks` returns: the ranks that worked, in input order, and those that failed."""

    ok: list[tuple[Path, T]] = field(default_factory=list)
    failed: list[RankFailure] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        """Some ranks failed, some worked: the analysis covers only part of the job."""
        return bool(self.failed) and bool(self.ok)

    def values(self) -> list[T]:
        return [v for _, v in self.ok]

    def paths(self) -> list[Path]:
        return [p for p, _ in self.ok]

    def raise_if_all_failed(self) -> None:
        """A TraceError with one line per file when no rank worked (nothing to analyse)."""
        if self.failed and not self.ok:
            raise TraceError("\n".join(f.error if str(f.path) in f.error else f"{f.path}: {f.error}"
                                       for f in self.failed))


def _message(e: BaseException) -> str:
    return str(e) if isinstance(e, TraceError) else f"{type(e).__name__}: {e}"


def _guarded(fn: Callable[[Path], T], path: Path) -> tuple[bool, Any]:
    """Run ``fn(path)``, turning an exception into its one-line message (runs in the worker)."""
    try:
        return True, fn(path)
    except Exception as e:  # noqa: BLE001 - any failure of one rank is reported, never raised
        return False, _message(e)


def _pool_context(fn: Callable, preload: Iterable[str] = ()):
    """forkserver where there is one (Linux): the server imports ``fn``'s module and ``preload`` once and forks
    each worker from it, so a worker starts in milliseconds with them imported; else spawn."""
    import multiprocessing  # here, not at the top: most commands never start a pool (0.02 s of CPU to import)

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    module = getattr(getattr(fn, "func", fn), "__module__", None)
    ctx.set_forkserver_preload([m for m in ("kit.traces.frames", module, *preload) if m and m != "__main__"])
    return ctx


def _size(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total


def get_client(client: Any):
    """A :class:`dask.distributed.Client` from a Client or a scheduler address."""
    if not isinstance(client, str):
        return client
    try:
        from dask.distributed import Client
    except ImportError:
        raise ImportError("--scheduler / client= needs dask.distributed: pip install 'kit[cluster]' "
                          "(or pip install 'dask[distributed]')") from None
    try:
        return Client(client, timeout="20s")
    except (OSError, TimeoutError) as e:
        raise TraceError(f"cannot reach the Dask scheduler at {client} ({type(e).__name__}: {e})") from None


def _collect(futures: list) -> list[tuple[bool, Any]]:
    """Each future's ``(ok, value)``; a worker that died (killed for memory: ``BrokenProcessPool``, Dask's
    ``KilledWorker``) fails its rank(s) with that message instead of raising."""
    out = []
    for f in futures:
        try:
            out.append(f.result())
        except Exception as e:  # noqa: BLE001
            out.append((False, f"{type(e).__name__}: {e} (the worker process died: out of memory?)"))
    return out


class JobError(TraceError):
    """The traces given are not one job: one line per problem. CLI exit code 2 (bad input, nothing analysed)."""


@dataclass(frozen=True)
class RankIdentity:
    """Who one trace says it is: what :func:`check_job` compares across the traces given as one job."""

    path: str
    rank: int | None
    """``distributedInfo``'s rank, else from the file name (:func:`kit.traces.names.parse_name`), else None"""
    world_size: int | None
    """``distributedInfo``'s world size"""
    device: str | None
    """the GPU's name from the header (``deviceProperties[*].name``, e.g. 'NVIDIA H100 80GB HBM3'); None if absent"""
    span: tuple[float, float] | None
    """first/last event, Unix time in us (``baseTimeNanoseconds``/1e3 + trace clock, or the trace clock where it
    is Unix time already: older Kineto); None without either, or without events"""
    host: str | None = None
    """the host that recorded it: the header's ``host_name`` (torch >= 2.12), :mod:`kit.capture`'s
    ``kitCapture.hostname``, or the ``<host>_<pid>`` of ``tensorboard_trace_handler``'s file name; None if none"""
    pid: int | None = None
    """the profiled process: ``kitCapture.pid``, or the file name's ``<host>_<pid>``; None if neither"""
    base_ns: int | None = None
    """the header's ``baseTimeNanoseconds`` (the trace clock's zero in Unix ns)"""

    @property
    def name(self) -> str:
        return Path(self.path).name


def device_family(device: str | None) -> str | None:
    """The GPU family of a device name: its model token (``H100`` of 'NVIDIA H100 80GB HBM3', ``V100`` of
    'Tesla V100-SXM2-16GB', ``A100`` of 'NVIDIA A100-SXM4-40GB', ``L40S``), else the name itself."""
    if not device:
        return None
    m = _MODEL.search(device)
    return m.group(1) if m else device.strip()


_MODEL = re.compile(r"\b([A-Z]{1,2}\d{1,4}[A-Z]?)(?![A-Za-z0-9])")


EPOCH_US = 1e15
"""trace times above this (2001-09-09 in Unix us) are Unix time already: traces written without
``baseTimeNanoseconds``"""


_HANDLER_NAME = re.compile(r"(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json(\.gz)?\Z")
"""``tensorboard_trace_handler``'s default file name: ``<host>_<pid>.<time>.pt.trace.json[.gz]``"""


def _process(header: dict, name: str) -> tuple[str | None, int | None]:
    """``(host, pid)`` of the process that wrote a trace (see :class:`RankIdentity`)."""
    cap = header.get("kitCapture") if isinstance(header.get("kitCapture"), dict) else {}
    host = header.get("host_name") or cap.get("hostname")
    pid = cap.get("pid")
    m = _HANDLER_NAME.match(name)
    if m:
        host = host or m["host"]
        pid = pid if pid is not None else int(m["pid"])
    return (host if isinstance(host, str) and host else None,
            pid if isinstance(pid, int) and not isinstance(pid, bool) else None)


def rank_identity(trace: "Trace", path: str | Path | None = None) -> RankIdentity:
    """The :class:`RankIdentity` of a loaded trace (from its header and its frames' first and last event)."""
    import numpy as np

    where = str(path if path is not None else (trace.path or trace.name))
    rank = trace.info.rank
    if rank is None:
        parsed = parse_name(Path(where).name)
        rank = parsed[1] if parsed else None
    props = trace.header.get("deviceProperties")
    names = [d.get("name") for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    device = next((n for n in names if isinstance(n, str) and n.strip()), None)
    base = trace.header.get("baseTimeNanoseconds")
    base = base if isinstance(base, (int, float)) and not isinstance(base, bool) else None
    span = None
    starts = [trace.array(w, "ts") for w in ("gpu", "cpu")]
    if any(len(a) for a in starts):
        ends = [trace.array(w, "end") for w in ("gpu", "cpu")]
        lo = min(float(np.min(a)) for a in starts if len(a))
        hi = max(float(np.max(a)) for a in ends if len(a))
        if base is not None:
            span = (base / 1e3 + lo, base / 1e3 + hi)
        elif lo > EPOCH_US:  # before baseTimeNanoseconds (torch < 2.0), Kineto wrote Unix time in us
            span = (lo, hi)
    host, pid = _process(trace.header, Path(where).name)
    return RankIdentity(path=where, rank=rank, world_size=trace.info.world_size, device=device, span=span,
                        host=host, pid=pid, base_ns=int(base) if base is not None else None)


def ranges(ranks: Iterable[int]) -> str:
    """``0-3, 5, 7-9``: sorted ranks as runs."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


@dataclass(frozen=True)
class JobCheck:
    """What :func:`check_job` found: the traces are one job; which ranks of it were given."""

    ranks: tuple[RankIdentity, ...]
    """in input order, rank filled in (file order for traces that say nothing)"""
    world_size: int | None
    missing: tuple[int, ...]
    """ranks of ``range(world_size)`` not given"""
    warnings: tuple[str, ...] = ()
    """non-fatal, one line each"""

    @property
    def partial(self) -> bool:
        """Some ranks of the world size are missing: cross-rank results are partial (CLI exit 3)."""
        return bool(self.missing)

    def note(self) -> str | None:
        """e.g. ``2 of 8 ranks given; missing 2-7: cross-rank results are partial``; None when complete."""
        if not self.partial:
            return None
        given = self.world_size - len(self.missing) if self.world_size else len(self.ranks)
        return (f"{given} of {self.world_size} ranks given; missing {ranges(self.missing)}: cross-rank results "
                f"are partial")

    def to_json(self) -> dict[str, Any]:
        """What a result says of its job: ``{"world_size", "ranks", "missing", "partial", "note"}``."""
        return {"world_size": self.world_size, "ranks": [r.rank for r in self.ranks], "missing": list(self.missing),
                "partial": self.partial, "note": self.note()}


def _at(us: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(us / 1e6, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _why_apart(i: RankIdentity, others: Sequence[RankIdentity], gap_s: float) -> str:
    """Which it is, for a trace whose span does not overlap the others': another run (one host: one clock), the
    same process's other profiling window (one pid), or -- on other hosts, or hosts unknown -- another run or
    clocks that disagree by at least the gap."""
    hosts = sorted({o.host for o in others if o.host})
    pids = sorted({o.pid for o in others if o.pid is not None})
    bases = sorted({o.base_ns for o in others if o.base_ns is not None})
    base = (f"; baseTimeNanoseconds {i.base_ns} vs {', '.join(map(str, bases))}"
            if i.base_ns is not None and bases and bases != [i.base_ns] else "")
    if i.host and hosts == [i.host]:
        if i.pid is not None and pids == [i.pid]:
            return (f"recorded by their process (host {i.host}, pid {i.pid}): another profiling window of it, not "
                    f"another rank -- a trace of another job (or window){base}")
        pid = (f"; pid {i.pid}, theirs {', '.join(map(str, pids))}" if i.pid is not None and pids else "")
        return f"recorded on their host {i.host} (one clock{pid}): a trace of another job (another run){base}"
    where = (f"host {i.host}, the others on {', '.join(hosts)}" if i.host and hosts else
             "the traces do not name their hosts")
    return (f"{where}: a trace of another job (another run), or the hosts' clocks disagree by at least "
            f"{gap_s:.3g} s{base}")


def apart_in_time(idents: Sequence[RankIdentity]) -> list[str]:
    """One line per trace recorded at another time than the others: the ranks of one job are profiled together
    and wait for each other in their collectives, so their traced spans overlap. The traces are grouped into runs
    of overlapping spans; every trace outside the largest group is named, with which it is: another run (on the
    same host: one clock), another profiling window of the same process, or -- across hosts, or hosts unknown --
    another run or clocks that disagree (its host, pid and ``baseTimeNanoseconds`` against the others')."""
    timed = sorted(((i.span, i) for i in idents if i.span is not None), key=lambda t: t[0])
    if len(timed) < 2:
        return []
    groups: list[list] = [[timed[0]]]
    end = timed[0][0][1]
    for span, i in timed[1:]:
        if span[0] > end:  # starts after every earlier trace ended: no overlap
            groups.append([])
        groups[-1].append((span, i))
        end = max(end, span[1])
    if len(groups) == 1:
        return []
    main = max(groups, key=len)
    lo, hi = min(s[0] for s, _ in main), max(s[1] for s, _ in main)
    ref = (f"the {len(main)} traced {_at(lo)} to {_at(hi)[11:]}" if len(main) > 1 else
           f"traced {_at(lo)} to {_at(hi)[11:]}")
    out = []
    for g in groups:
        if g is main:
            continue
        for span, i in g:
            gap = (lo - span[1]) if span[1] <= lo else (span[0] - hi)
            out.append(f"{i.name}: traced {_at(span[0])} to {_at(span[1])[11:]} UTC, not with the others ({ref}): "
                       f"{gap / 1e6:.3g} s {'before' if span[1] <= lo else 'after'} them, no overlap; "
                       f"{_why_apart(i, [o for _, o in main], gap / 1e6)}")
    return out


def not_one_job(ranks: Iterable[tuple[str, int | None, int | None]]) -> list[str]:
    """One line per reason the traces ``(name, rank, world size)`` are not the ranks of one job: world sizes
    that differ (from each trace's ``distributedInfo``), one rank twice. [] when they can be one job. Part of
    :func:`check_job`, which also compares devices and when each trace was recorded."""
    ranks = list(ranks)
    problems = []
    ws = {w for _, _, w in ranks if w is not None}
    if len(ws) > 1:
        problems += [f"{name}: world size {w}, others {sorted(ws - {w})}: traces of different jobs"
                     for name, _, w in ranks if w is not None]
    seen: dict[int, str] = {}
    for name, r, _ in ranks:
        if r is not None and r in seen:
            problems.append(f"{name}: rank {r} again (also {seen[r]}): give one trace per rank")
        elif r is not None:
            seen[r] = name
    return problems


def _other_devices(idents: Sequence[RankIdentity]) -> list[str]:
    """One line per trace whose GPU family differs from the most common one among the traces (ranks of one
    job run on one kind of GPU)."""
    fam = {i.path: device_family(i.device) for i in idents}
    counts: dict[str, int] = {}
    for f in fam.values():
        if f is not None:
            counts[f] = counts.get(f, 0) + 1
    if len(counts) < 2:
        return []
    main = max(counts, key=lambda f: (counts[f], -list(counts).index(f)))
    return [f"{i.name}: recorded on {i.device} ({fam[i.path]}), the others on {main}: traces of different jobs"
            for i in idents if fam[i.path] not in (None, main)]


def check_job(idents: Sequence[RankIdentity]) -> JobCheck:
    """Raises :class:`JobError` (one line per problem) when the traces are not one job: different world sizes,
    one rank twice, a rank outside the world size, different GPU families (H100 vs A100, V100...), spans that do
    not overlap (:func:`apart_in_time`). Returns the :class:`JobCheck` otherwise:
    ranks filled in (traces that say nothing take the free ranks in file order, with a warning), the ranks of
    the world size that were not given."""
    idents = list(idents)
    problems = not_one_job((i.name, i.rank, i.world_size) for i in idents)
    ws_set = {i.world_size for i in idents if i.world_size is not None}
    world = next(iter(ws_set)) if len(ws_set) == 1 else None
    if world is not None:
        problems += [f"{i.name}: rank {i.rank} outside the world size {world}" for i in idents
                     if i.rank is not None and not 0 <= i.rank < world]
    problems += _other_devices(idents)
    problems += apart_in_time(idents)
    if problems:
        raise JobError("\n".join(problems))
    seen = {i.rank for i in idents if i.rank is not None}
    free = iter(r for r in range(len(idents) + len(seen)) if r not in seen)
    warnings, out = [], []
    for i in idents:
        if i.rank is None:
            i = replace(i, rank=next(free))
            if len(idents) > 1:
                warnings.append(f"{i.name}: no rank in the trace or its name: taken as rank {i.rank} (file order)")
        out.append(i)
    given = {i.rank for i in out}
    missing = tuple(r for r in range(world) if r not in given) if world is not None else ()
    return JobCheck(ranks=tuple(out), world_size=world, missing=missing, warnings=tuple(warnings))


def map_ranks(paths: Iterable[str | Path], fn: Callable[[Path], T], *, workers: int | None = None,
              client: Any = None, preload: Iterable[str] = ()) -> RankResults[T]:
    """``fn(path)`` for every path -- in this process (``workers=1``), in a local process pool (``workers=N``,
    default ``os.cpu_count()``) or on a Dask cluster (``client``: a Client or a scheduler address). See the
    module docstring. ``fn``: a module-level (picklable) function returning a small picklable result.
    ``preload``: modules ``fn`` imports, imported once by the local pool's forkserver, not by each worker."""
    paths = [Path(p) for p in paths]
    if client is not None:
        own = isinstance(client, str)
        c = get_client(client)
        try:
            done = _collect(c.map(_guarded, [fn] * len(paths), paths, pure=False))
        finally:
            if own:
                c.close()
    else:
        n = min(workers or os.cpu_count() or 1, len(paths))
        if workers is None and _size(paths) < SMALL_INPUT:
            n = 1
        if n <= 1:
            done = [_guarded(fn, p) for p in paths]
        else:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(n, mp_context=_pool_context(fn, preload),
                                     max_tasks_per_child=MAX_TASKS_PER_CHILD) as ex:
                done = _collect([ex.submit(_guarded, fn, p) for p in paths])
    res: RankResults[T] = RankResults()
    for p, (good, value) in zip(paths, done):
        if good:
            res.ok.append((p, value))
        else:
            res.failed.append(RankFailure(p, value))
    return res
