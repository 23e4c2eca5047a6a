"""The host model of one rank: what the host threads that issue GPU work were doing, every microsecond -- the one
view of the host that the step accounting (:mod:`kit.doctor.accounting`), the host rules
(:mod:`kit.doctor.rules.host`) and ``late_rank`` (:mod:`kit.doctor.rules.late_arrival`) all read.

**Kinds** (:data:`KINDS`, in precedence order: where two overlap, the first wins):

* ``data_wait`` -- inside ``enumerate(DataLoader)...`` (the host waiting for its next batch);
* ``sync``      -- in a host call that waits for the GPU (:data:`kit.doctor.calls.SYNC_CALLS`, a blocking copy
  such as the device-to-host copy behind ``.item()``, a ``cudaMemcpyAsync`` from pageable memory to the host);
* ``comm_wait`` -- blocked on a collective or a peer (:data:`COMM_WAIT_OPS` on the thread; on a CPU-only job a
  collective op (:data:`kit.traces.frames.COMM_OPS`) on any thread of the process: gloo runs it on its own
  thread while the main thread waits, up to :data:`WAKE_US` after it ends);
* ``alloc``     -- in the caching allocator's device calls (:data:`kit.doctor.calls.ALLOC_CALLS`);
* ``profiler``  -- the profiler's own host time: a stretch that would be a stall or idle, inside one of CUPTI's
  :data:`PROFILER_EVENTS` (the trace layer's ``overhead`` events) -- not the job's, so neither a stall nor the rank's
  own time; the accounting leaves the GPU idle under it to ``launch``, which is stated net of the profiler's overhead
  (:mod:`kit.doctor.overhead` adds it to the profiler's estimated host time);
* ``stall``     -- a stretch of at least :data:`STALL_US` in which no thread of the process issued GPU work (a call
  whose GPU activity is in the trace, or one that orders a stream, :data:`kit.doctor.calls.STREAM_ORDER_CALLS`) and
  the thread was in none of the above, outside every recorded op of its own (an autograd node's op only where the
  thread records progress in it, :func:`autograd_nodes`: the user's backward hooks run there -- or where the trace
  does not make a hole there a hook's, :func:`_first_node_alone`), FSDP2's post-backward
  regions on any
  issuing thread where their thread records an event at least every :data:`STALL_US` (:func:`_framework_only`:
  FSDP's own code; a user's hook sleeping there stays a stall), the ops that led an issuing thread
  into a launch, at most :data:`STALL_US` of them (:func:`_leading_ops`: the autograd thread's first op of the backward
  after ``backward()`` handed it over is the rank issuing, not the main thread stalling)
  and the framework's dispatch before the first launch
  of PyTorch's own regions of issuing code (:func:`_dispatch`), itself at least that long (on a CPU-only job: without any recorded op);
* ``issue``     -- the host issuing GPU work or running ops (a recorded event, or a gap between them shorter than
  :data:`IDLE_US`); on a CPU-only job the main thread's ops;
* ``idle``      -- the rest: short host time no event accounts for.

**GPU jobs**: the threads are those that issued GPU work in the trace (the autograd thread issues the backward
while the main thread waits in ``backward()``); **CPU-only jobs** (no GPU activity; read with every CPU op): the
main thread, the one holding the step annotations.

**Per step** (:attr:`HostModel.per_step`, the small frame shipped to the judges): one row per step window
(:func:`kit.doctor.steps.step_windows`), the main thread's time split by kind (``<kind>_us``, summing to
``dur``), and the GPU's busy time (``gpu_busy_us``: union of all activity; ``gpu_comm_us``: NCCL kernels;
``gpu_compute_us``: busy time outside NCCL kernels; ``gpu_kernels_us``: the other kernels' own time, beside NCCL
kernels too -- the GPU work the step cannot do without). ``issue_us`` is the rank's own host time: it excludes time
blocked on data, the GPU, collectives and the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..traces.frames import COMM_OPS
from ..traces.gaps import DEFAULT_STALL_US
from ..traces.intervals import cover, gaps_between, partition, subtract, union_np
from .calls import (ALLOC_CALLS, AUTOGRAD_NODE, BLOCKING_COPY_CALLS, DATALOADER, FRAMEWORK_ONLY_REGIONS,
                    FRAMEWORK_REGIONS, FREE_CALLS, STEP_PREFIX, STREAM_ORDER_CALLS, SYNC_CALLS, base_name)

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

    from .model import RankView

KINDS = ("data_wait", "sync", "comm_wait", "alloc", "profiler", "stall", "issue", "idle")
"""what a host thread can be doing, in precedence order (the module docstring)"""
STALL_US = DEFAULT_STALL_US
"""a stretch of host time at least this long without a call that issues GPU work is a stall: no single op's
dispatch (the framework's per-op cost between launches is 5-50 us) takes a millisecond; the same bound the trace
layer uses to call a GPU gap a stall"""
IDLE_US = 200.0
"""a gap of at least this long between a thread's recorded events (runtime calls, kept ops, annotations) is idle
host time, not issuing: the recorded calls of a thread issuing work come every 5-50 us"""
WAKE_US = STALL_US
"""on a CPU-only job, how long after a collective ends the thread that waited for it still counts as waiting (its
wake-up): gloo's waiting thread ran its next op 0.02-0.14 ms after the all-reduce ended wherever the host had a core
free (FINDINGS, thresholds table); a thread that resumes later is the host not running it (a loaded host) or Python
work without a recorded op, which the trace cannot tell apart: past one stall's length it is the rank's own stall"""
PROFILER_EVENTS = ("Activity Buffer Request", "Buffer Flush")
"""CUPTI's events (category ``overhead``) of the profiler's own host time: allocating an activity buffer, flushing
one -- stretches with no op inside them are the profiler's, not a host stall (FINDINGS.md). Not ``Command Buffer
Full``: a launch waiting for the GPU's full queue is the job's"""
COMM_WAIT_OPS = ("c10d::wait", "c10d::barrier", "c10d::monitored_barrier", "gloo:")
"""op names (prefixes) of a thread blocked on a collective or a peer in a GPU job: a ``wait()`` on a work
handle, a barrier, a gloo op run on the thread itself"""
ALL = "*"
HOOK = "hook"
"""the key of :attr:`HostModel.sets` [:data:`ALL`] holding the stall spans that lie inside an autograd node's op with
no progress on its thread (:func:`autograd_nodes`): where the user's backward hooks run -- a stall however many pieces
it comes in (a hook per module or parameter), not a core's slices (:data:`ONE_STALL` counts them as one stall's). Not one of :data:`KINDS`: a part of ``stall``"""
"""the key of :attr:`HostModel.sets` holding a kind's union over every thread of the process"""
HOOK_OR_GIL = "hook_or_gil"
"""the key of :attr:`HostModel.sets` [:data:`ALL`] holding the :data:`HOOK` spans whose node does not hold a hole in
every traced step (:func:`_first_node_alone`): a hook that stalls in some steps only, or the process waiting for the
GIL there -- said as either (``host_stall``'s sentence). A part of :data:`HOOK`"""
ONE_STALL = "one_stall"
"""the key of :attr:`HostModel.sets` [:data:`ALL`] holding the stall spans that are one stall of the rank's own code
where its core is taken away (:func:`one_stall_a_step`): each step's longest stall stretch (stall spans less than
:data:`STALL_US` apart taken as one: a moment's work, a launch, does not end a stall), any longer than a slice can be
(:data:`SLICE_MAX_US`), and the :data:`HOOK` spans. A core the scheduler shares with another process is taken in
slices of milliseconds, many to a step, between ops as well as inside them -- the rank's issuing done more slowly, not
a stall; a sleep, a blocking call, a pause is one stretch with no event. But a rank's code can stall twice a step (a
log line and a checkpoint, a forward hook and a gc pass), so the split is read only for a rank whose quiet time shows
its core lost (:func:`kit.doctor.contended.lost_cores`, in the job phase: the step accounting's ``host_stall`` slice,
:attr:`kit.doctor.accounting.Account.split`, and ``late_rank``'s
:data:`kit.doctor.rules.late_arrival.SINGLE_STALL`); elsewhere every stretch stays a stall. Not one of
:data:`KINDS`: a part of ``stall``"""
SLICE_MAX_US = 24_000.0
"""a heuristic bound on how long a core shared with other runnable work is taken from a thread at a time: Linux CFS's
default scheduling period on a host of 8 CPUs or more (``sched_latency_ns``: 6 ms x (1 + log2 of the CPUs, counted up
to 8) = 24 ms), within which every runnable task gets its turn. Not a law on every kernel: the period is 12 ms on 2
CPUs, grows with more than 8 runnable tasks (the minimum granularity times their count), and EEVDF schedulers (Linux
6.6 on) have none. A stretch with no event longer than this is taken for a stall, not a slice
(:func:`one_stall_a_step`)"""
OWN_KINDS = ("data_wait", "stall", "alloc", "issue")
"""a rank's own host time: waiting for its DataLoader, stalling (no op, no call: Python work, a sleep), the
allocator's device calls, issuing its work -- not the time blocked on collectives, peers or the GPU, nor its short
idle gaps (under the profiler mostly the profiler's own time between the events it records)"""
PER_STEP = ("step", "ts", "end", "dur") + tuple(f"{k}_us" for k in KINDS) + ("gpu_busy_us", "gpu_comm_us",
                                                                            "gpu_compute_us", "gpu_kernels_us",
                                                                            "own_host_us", "own_stall_us",
                                                                            "own_data_wait_us", "own_quiet_us",
                                                                            "own_stall_longest_us", "own_quiet_in_ops_us",
                                                                            "own_quiet_in_nodes_us")
"""the columns of :attr:`HostModel.per_step`; ``own_host_us``: the time any issuing thread spent in :data:`OWN_KINDS`
inside the step's own annotation (the host's side of the step, not the window extended to its GPU work: a host that runs
ahead of its GPU did its step's work before the window's GPU part); ``own_stall_us``, ``own_data_wait_us``: the main
thread's stall and data_wait inside it, on the same basis (the rest of ``own_host_us`` is issuing and the allocator);
``own_quiet_us``: the part of ``own_host_us`` outside collective calls, DataLoader waits and waits for the GPU (a
thread waiting is not preempted) in stretches of :data:`STALL_US` or longer in which no recorded CPU event
(annotations, runtime calls, ops -- the short ops the default frame leaves out too, through
:attr:`kit.traces.Trace.short_spans`) began or ended on any thread of the process -- the host idle or descheduled,
inside an op or between ops (GPU jobs; 0 on a CPU-only one, whose ops themselves run for milliseconds);
``own_stall_longest_us``: the longest of the main thread's stall stretches in the step (no issuing call, no op of the
frame) inside the host model's one-stall reading (:data:`ONE_STALL`: not a hole the trace makes a node's own time),
those less than :data:`STALL_US` apart taken as one: a stall is one such stretch, however many short ops or
single launches it holds; a contended core's lost time lies in many, with its work between them
(:mod:`kit.doctor.contended`); ``own_quiet_in_ops_us``: the part of ``own_quiet_us`` in which a thread of the
process was inside a recorded op or runtime call (the innermost event covering the stretch on that thread,
:data:`OP_CATS`): the scheduler takes a core wherever its thread is, inside the framework's ops too; a stall (the
user's Python, a sleep) lies between them; ``own_quiet_in_nodes_us``: the part of that inside an autograd node's ops
alone (:func:`autograd_nodes`: no recorded op of the node covers the stretch) -- where the user's backward hooks run,
the core taken away there or a hook holding the thread (a sleep, Python work, a lock), which the trace does not tell
apart (:mod:`kit.doctor.contended` asks for the contention elsewhere too)"""
OP_CATS = ("cpu_op", "cuda_runtime", "cuda_driver")
"""the event categories of ops and runtime calls (not annotations: a region the user or the framework named holds
Python between its ops)"""


@dataclass(frozen=True)
class HostModel:
    """One rank's host model (module docstring). Lives in the worker; :attr:`per_step` is what travels."""

    mode: str
    """'gpu' or 'cpu' (a CPU-only trace: the main thread plays the device)"""
    activity: "pd.DataFrame"
    """one row per classified stretch of each thread's time (precedence applied, adjacent stretches of a kind
    merged): ``tid, ts, end, kind, name`` (``name``: the call or annotation behind it, '' for stall/issue/idle)"""
    per_step: "pd.DataFrame"
    """one row per step window: :data:`PER_STEP`"""
    windows: "pd.DataFrame"
    """the step windows: step, start, end (-1 and the traced span without step annotations)"""
    main_tid: Any
    """the thread the per-step split is of: the one holding the step annotations (else the busiest issuer)"""
    threads: tuple
    """the threads that issued GPU work (GPU mode) or the main thread (CPU mode)"""
    calls: "pd.DataFrame"
    """the CUDA runtime/driver calls: name, ts, end, dur, tid, correlation, ``base`` (name without version
    suffix), ``pageable_d2h`` (a copy from device to pageable host memory), ``pageable_h2d`` (a copy from pageable
    host memory to the device: the host is blocked while it is staged), ``issues`` (its GPU activity is in the
    trace), ``kind`` ('sync', 'alloc', 'issue' or '')"""
    sets: dict = field(default_factory=dict, repr=False)
    """per thread (and :data:`ALL`), per kind, the sorted disjoint spans of the raw classification (before
    precedence): what the accounting splits idle GPU time by"""

    def spans(self, kind: str, tid: Any = ALL) -> "tuple[np.ndarray, np.ndarray]":
        """The spans of one kind on one thread (or on any thread, :data:`ALL`); empty arrays when none."""
        import numpy as np

        return self.sets.get(tid, {}).get(kind, (np.empty(0), np.empty(0)))

    def one_stall(self, tid: Any = ALL) -> "tuple[np.ndarray, np.ndarray]":
        """Thread ``tid``'s (or the process's, :data:`ALL`) ``stall`` spans that are one stall of the rank's own code
        (:data:`ONE_STALL`: each step's longest stretch and the hooks'); the rest of its stall time is its issuing
        done more slowly (a core taken in slices). The ``stall`` spans where the model has no such set."""
        st = self.spans("stall", tid)
        one = self.sets.get(ALL, {}).get(ONE_STALL)
        return st if one is None else subtract(st, subtract(st, one))

    def splits(self) -> bool:
        """Whether :meth:`one_stall` leaves out any of the process's or a thread's stall time (a step with more than
        one stall stretch): only then does a rank whose core is shown lost read differently."""
        import numpy as np

        if self.sets.get(ALL, {}).get(ONE_STALL) is None:
            return False
        return any(float(np.sum(b - a)) > float(np.sum(d - c)) for t in self.sets
                   for (a, b), (c, d) in [(self.spans("stall", t), self.one_stall(t))])

    def gpu_waits(self, tid: Any = ALL) -> "dict[str, tuple[np.ndarray, np.ndarray]]":
        """Thread ``tid``'s (or every thread's, :data:`ALL`) waits for the GPU, by the accounting slice they block
        in, as sorted disjoint spans: its synchronising calls (``sync``) and device frees (``allocator``,
        :data:`kit.doctor.calls.FREE_CALLS`: a free synchronises the device) -- the queue is drained when they return.
        The one view of them for the accounting (:func:`kit.doctor.accounting.waiting_calls`) and the profiler
        overhead's replay (:func:`kit.doctor.overhead._exposed`)."""
        c = self.calls
        free = c[c["base"].isin(FREE_CALLS)]
        if tid != ALL:
            free = free[free["tid"] == tid]
        return {"sync": self.spans("sync", tid), "allocator": union_np(free["ts"], free["end"])}


def host_model(view: "RankView", cpu_all: "pd.DataFrame | None" = None) -> HostModel | None:
    """The rank's :class:`HostModel`; ``cpu_all``: every CPU event of a CPU-only trace (the default frame keeps only
    long ops). None when there is nothing to model: no GPU activity of any length, and no CPU ops."""
    if not view.trace.gpu.empty:
        return _gpu_model(view)
    if cpu_all is None or cpu_all.empty or not (cpu_all["cat"] == "cpu_op").any():
        return None
    return _cpu_model(view, cpu_all)


# ------------------------------------------------------------------------------------------------ names
def names_str(names: "pd.Series") -> "pd.Series":
    """A name column as strings, what ``names.astype(str)`` gives: for the trace layer's categorical columns the
    distinct names are converted once and taken by code (``astype(str)`` converts every row: ~20 ms per 100k rows,
    about 25 times per rank)."""
    import pandas as pd

    if not isinstance(names.dtype, pd.CategoricalDtype):
        return names.astype(str)
    cats = names.cat.categories.astype(str)
    return pd.Series(cats.take(names.cat.codes.to_numpy(), allow_fill=True), index=names.index, name=names.name)


def name_mask(names: "pd.Series", test) -> "pd.Series":
    """``test`` (of a string Index or Series, e.g. ``lambda s: s.str.startswith(P)``) for each row's name, as
    ``test(names.astype(str))`` gives it (a missing name: False), evaluated once per distinct name of a categorical
    column."""
    import numpy as np
    import pandas as pd

    if not isinstance(names.dtype, pd.CategoricalDtype):
        return pd.Series(np.asarray(test(names.astype(str)), dtype=bool), index=names.index)
    hit = np.r_[np.asarray(test(names.cat.categories.astype(str)), dtype=bool), False]  # code -1: missing
    return pd.Series(hit[names.cat.codes.to_numpy()], index=names.index)


def _starts(names: "pd.Series", prefix) -> "pd.Series":
    return name_mask(names, lambda s: s.str.startswith(prefix))


# ------------------------------------------------------------------------------------------------ GPU jobs
def pageable_mask(copies: "pd.DataFrame", direction: str) -> "pd.Series":
    """Which GPU copies are between the device and pageable host memory, in ``direction`` ('HtoD' or 'DtoH'):
    Kineto names them ``Memcpy HtoD (Pageable -> Device)`` and ``Memcpy DtoH (Device -> Pageable)``."""
    return name_mask(copies["name"], lambda n: n.str.contains(direction) & n.str.contains("Pageable"))


def pageable_h2d_mask(copies: "pd.DataFrame") -> "pd.Series":
    """Which GPU copies are from pageable host memory to the device (:func:`pageable_mask`): the one test the host
    model's ``pageable_h2d`` calls and the host rules read."""
    return pageable_mask(copies, "HtoD")


def runtime_calls(view: "RankView") -> "pd.DataFrame":
    """The rank's CUDA runtime/driver calls, classified once (:attr:`HostModel.calls`)."""
    import numpy as np

    cpu, gpu = view.trace.cpu, view.trace.gpu
    calls = cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"])] if not cpu.empty else cpu
    calls = calls[["name", "ts", "end", "dur", "tid", "correlation"]].assign(name=lambda d: names_str(d["name"]))
    pageable, pageable_in = set(), set()
    if not gpu.empty:
        copies = gpu[gpu["cat"] == "gpu_memcpy"]
        pageable = set(copies.loc[pageable_mask(copies, "DtoH"), "correlation"].dropna())
        pageable_in = set(copies.loc[pageable_h2d_mask(copies), "correlation"].dropna())
    issued = set(gpu["correlation"].dropna()) if not gpu.empty else set()
    base = calls["name"].map({n: base_name(n) for n in calls["name"].unique()})
    pd2h = calls["correlation"].isin(pageable)
    issues = calls["correlation"].isin(issued)
    sync = base.isin(SYNC_CALLS) | base.isin(BLOCKING_COPY_CALLS) | pd2h
    kind = np.where(sync, "sync", np.where(base.isin(ALLOC_CALLS), "alloc", np.where(issues, "issue", "")))
    return calls.assign(base=base, pageable_d2h=pd2h, pageable_h2d=calls["correlation"].isin(pageable_in),
                        issues=issues, kind=kind)


def _gpu_model(view: "RankView") -> HostModel | None:
    import numpy as np
    import pandas as pd

    from .steps import rank_windows

    g = view.issued()
    g = g[g["end"] > g["ts"]]
    if g.empty:
        return None
    g = g.sort_values("ts", kind="stable")
    win = rank_windows(view)
    lo, hi = float(win["start"].min()), float(win["end"].max())
    if view.steps is not None and not view.steps.empty:  # the host's side of the steps too (:func:`_own_host`)
        lo, hi = min(lo, float(view.steps["ts"].min())), max(hi, float(view.steps["end"].max()))
    cpu = view.trace.cpu
    calls = runtime_calls(view)
    threads = tuple(pd.unique(g["tid"].dropna()))
    main = _main_tid(cpu, g)
    # what breaks a stall (below): a call whose GPU activity is in the trace (any thread's), or one of the issuing
    # threads' calls that order their streams
    issuing = calls[calls["issues"] | (calls["base"].isin(STREAM_ORDER_CALLS) & calls["tid"].isin(threads))]
    lead = _leading_ops(view.trace, calls[calls["issues"]], threads)
    prof = _profiler_spans(cpu)
    fsdp = _framework_only(view.trace, cpu, threads)
    node = autograd_nodes(cpu)
    node_busy = _progress_within(view.trace, cpu, cpu[node]) if len(cpu) else {}
    first, unsure = _first_node_alone(view.trace, cpu, node, node_busy, view.steps)  # the node's own time
    node_busy = {t: union_np(np.r_[a, first[0]], np.r_[b, first[1]]) for t, (a, b) in node_busy.items()}
    sets: dict = {}
    for t in dict.fromkeys(threads + ((main,) if main is not None else ())):
        mine = calls[calls["tid"] == t]
        own = cpu[cpu["tid"] == t] if not cpu.empty else cpu
        ann = own[own["cat"] == "user_annotation"]
        data = ann[_starts(ann["name"], DATALOADER)]
        sync, alloc = mine[mine["kind"] == "sync"], mine[mine["kind"] == "alloc"]
        ops = own[own["cat"] == "cpu_op"]
        comm = ops[_starts(ops["name"], COMM_WAIT_OPS)]
        # an autograd node's op covers a stall only where its thread makes progress in it (:func:`autograd_nodes`)
        cov = ops[~node.reindex(ops.index, fill_value=False)] if len(ops) else ops
        na, nb = node_busy.get(t, (np.empty(0), np.empty(0)))
        # a stall is a stretch with neither an issuing call (any thread's: the autograd thread's backward; an event
        # record or a wait on one: FSDP's and DDP's stream ordering -- a host slowed down spaces them out, a stalled
        # one makes none) nor a blocking call/annotation of this thread -- the blocks are their own kinds, so a DataLoader wait of 3 ms
        # is data_wait, not a stall around it -- and outside every recorded op of the thread: a long op that issues
        # nothing for a while (a foreach op over hundreds of tensors, a CPU tensor op) is the host's own cost of
        # issuing the step's work (another thread's op, a pin-memory copy, does not make it this thread's)
        act = [issuing, data, sync, alloc]
        ca, cb = union_np(np.concatenate([[lo - 1e-3, hi]] + [x["ts"].to_numpy(dtype=float) for x in act]),
                          np.concatenate([[lo, hi + 1e-3]] + [np.maximum(x["end"].to_numpy(dtype=float),
                                                                         x["ts"].to_numpy(dtype=float) + 1e-3)
                                                              for x in act]))
        # (and outside the dispatch of PyTorch's own regions of issuing code, :func:`_dispatch`, FSDP2's
        # post-backward regions on any issuing thread while it records events there, :func:`_framework_only`, and the ops that led an issuing thread
        # into a launch, :func:`_leading_ops`: the autograd thread taking over the backward while this one waits in
        # backward()); what is left must
        # itself be a stretch of STALL_US: a shorter rest between them is the host's per-op cost, not a stall
        da, db = _dispatch(ann[_starts(ann["name"], FRAMEWORK_REGIONS)], mine[mine["issues"]])
        stall = subtract(gaps_between(ca, cb, STALL_US),
                         union_np(np.r_[cov["ts"].to_numpy(dtype=float), na, da, lead[0], fsdp[0]],
                                  np.r_[cov["end"].to_numpy(dtype=float), nb, db, lead[1], fsdp[1]]))
        rec = pd.concat([mine[["ts", "end"]], ops[["ts", "end"]],
                         ann.loc[~_starts(ann["name"], STEP_PREFIX), ["ts", "end"]]])
        ra, rb = union_np(np.r_[lo - 1e-3, rec["ts"].to_numpy(dtype=float), hi],
                          np.r_[lo, np.maximum(rec["end"].to_numpy(dtype=float),
                                               rec["ts"].to_numpy(dtype=float) + 1e-3), hi + 1e-3])
        idle = gaps_between(ra, rb, IDLE_US)
        # the profiler's own time: where a stall or idle stretch lies inside one of its events (what is left of a
        # stall outside them is a stall only if it is itself STALL_US)
        quiet = union_np(np.r_[stall[0], idle[0]], np.r_[stall[1], idle[1]])
        theirs = subtract(quiet, subtract(quiet, prof))
        sa, sb = subtract(stall, prof)
        sets[t] = {"data_wait": union_np(data["ts"], data["end"]), "sync": union_np(sync["ts"], sync["end"]),
                   "comm_wait": union_np(comm["ts"], comm["end"]), "alloc": union_np(alloc["ts"], alloc["end"]),
                   "profiler": theirs, "stall": (sa[sb - sa >= STALL_US], sb[sb - sa >= STALL_US]), "idle": idle}
    sets[ALL] = _all_threads(cpu, calls, sets, threads, main)
    sets[ALL][HOOK] = _in_hooks(cpu, node, node_busy, threads, sets[ALL]["stall"])
    sets[ALL][HOOK_OR_GIL] = subtract(sets[ALL][HOOK], subtract(sets[ALL][HOOK], unsure))
    # (the main thread waits in backward() through the backward's start: its stall there is not one of its own)
    sets[ALL][ONE_STALL] = one_stall_a_step(subtract(sets[ALL]["stall"], first), view.steps, sets[ALL][HOOK])
    kern = g["cat"] == "kernel"
    nccl = kern & g["nccl"].astype(bool)
    gpu = {"busy": union_np(g["ts"], g["end"]), "comm": union_np(g.loc[nccl, "ts"], g.loc[nccl, "end"]),
           "kernels": union_np(g.loc[kern & ~nccl, "ts"], g.loc[kern & ~nccl, "end"])}
    return _finish(view, "gpu", win, main, threads, calls, sets, default="issue", gpu=gpu)


def _leading_ops(trace, launches: "pd.DataFrame", threads: tuple) -> "tuple[np.ndarray, np.ndarray]":
    """The ops that led each issuing thread into each of its launches, as sorted disjoint spans: from where its run of
    short ops (:meth:`kit.traces.Trace.short_spans_of`: the ops the frame leaves out, less than :data:`STALL_US`
    apart) around the launch began, at most :data:`STALL_US` before it, to the launch -- the launch's dispatch (the
    autograd thread's first op of a backward, which issues its first kernel). Issuing, not a stall, on every thread
    (the main thread waits in ``backward()`` meanwhile); no longer than :data:`STALL_US`: no single op's dispatch takes
    that long, so ops running longer without a launch (CPU tensor work in the user's code) stay a stall."""
    import numpy as np

    parts = []
    for u in threads:
        a, b = trace.short_spans_of([u])
        lt = np.sort(launches.loc[launches["tid"] == u, "ts"].to_numpy(dtype=float))
        if not len(a) or not len(lt):
            continue
        i = np.searchsorted(a, lt, side="right") - 1
        ok = (i >= 0) & (lt <= b[np.clip(i, 0, None)])
        parts.append((np.maximum(a[np.clip(i, 0, None)], lt - STALL_US)[ok], lt[ok]))
    return union_np(np.concatenate([p[0] for p in parts]) if parts else [],
                    np.concatenate([p[1] for p in parts]) if parts else [])


def _framework_only(trace, cpu: "pd.DataFrame", threads: tuple) -> "tuple[np.ndarray, np.ndarray]":
    """The sorted disjoint spans of FSDP2's post-backward regions (:data:`kit.doctor.calls.FRAMEWORK_ONLY_REGIONS`) on
    the issuing threads ``threads`` in which that thread made progress (:func:`_progress_within`) -- the framework's
    Python between its ops, issuing, not a stall, on every thread (the main thread waits in ``backward()`` while the
    autograd thread runs them, as for :func:`_leading_ops`). A stretch of :data:`STALL_US` or longer with no recorded
    event on that thread stays uncovered: FSDP2 runs the user's hooks there (a parameter's post-accumulate-grad hooks,
    from its reduce), and the framework's own code records an op well inside that (FINDINGS.md, "FSDP2's post-backward
    regions")."""
    import numpy as np

    if cpu.empty:
        return union_np([], [])
    r = cpu[(cpu["cat"] == "user_annotation") & cpu["tid"].isin(threads)]
    parts = list(_progress_within(trace, cpu, r[_starts(r["name"], FRAMEWORK_ONLY_REGIONS)]).values())
    if not parts:
        return union_np([], [])
    return union_np(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _first_node_alone(trace, cpu, node, busy: dict, steps) -> "tuple[tuple, tuple]":
    """The stretches of :data:`STALL_US` or longer inside autograd nodes' ops without progress on an issuing thread
    (``busy``: per thread, the parts of its nodes' ops in which it made progress, :func:`_progress_within`) that the
    trace does not make a user's hook (:data:`HOOK`), as sorted disjoint spans: the node's own time, the rank issuing;
    and those it keeps as a hook's whose node does not hold one in every traced step (:data:`HOOK_OR_GIL`). A hook
    runs at its node whenever the backward reaches it -- in every step, or in some (one that logs every few steps) --
    so a hole recurs where a hook stalls: at its node in two or more traced steps, or as two or more holes in a step.
    Of the rest,

    * on a trace of three steps or more, a hole seen once in the window (its node, the innermost node evaluation
      around it, holds no other; the frame keeps long ops only, so a step may record none of a node's evaluations)
      and alone in its step is not a hook's: the process not running there (a wait for the GIL or for the core);
    * in a step whose nodes hold one hole alone, at a node that holds none in another step, where it lies in the
      step's first node (a node evaluation before which that thread recorded nothing in the step: no op, runtime call
      or short op the frame leaves out, :meth:`kit.traces.Trace.short_spans_of`) -- the backward's start, where the
      autograd thread takes over from the main thread -- it is taken for that start (a trace of one or two steps:
      the recurrence above cannot be read).

    Covered on the issuing threads; the main thread, waiting in ``backward()``, keeps it as its ``stall``, but not as
    its :data:`ONE_STALL`. A single hook on the backward's first node that stalls in one step of a short trace is
    taken for the framework's: the trace does not tell them apart."""
    import numpy as np

    parts, unsure = [], []
    if cpu.empty or steps is None or steps.empty or not busy:
        return union_np([], []), union_np([], [])
    evals = node.to_numpy() & _starts(cpu["name"], AUTOGRAD_NODE).to_numpy()
    starts = np.sort(steps["ts"].to_numpy(dtype=float))
    n_steps = len(starts)
    for t, (ba, bb) in busy.items():
        on = (cpu["tid"] == t).to_numpy()
        mine = cpu[node.to_numpy() & on]
        ha, hb = subtract(union_np(mine["ts"], mine["end"]), (ba, bb))
        long = (hb - ha) >= STALL_US
        ha, hb = ha[long], hb[long]
        ev = cpu[evals & on]
        if not len(ha) or not len(ev):
            continue
        ea, eb = ev["ts"].to_numpy(dtype=float), ev["end"].to_numpy(dtype=float)
        names = names_str(ev["name"]).to_numpy()
        es, hs = np.searchsorted(starts, ea, side="right"), np.searchsorted(starts, ha, side="right")
        # each stretch's node: the innermost (latest-starting) evaluation around it
        at = [np.flatnonzero((ea <= x) & (eb >= y)) for x, y in zip(ha, hb)]
        of = np.array([names[j[np.argmax(ea[j])]] if len(j) else "" for j in at], dtype=object)
        per_step = np.bincount(hs, minlength=n_steps + 1)  # the thread's holes in nodes, per step
        seen = {name: set(hs[of == name]) for name in set(of) - {""}}  # the steps each node holds a hole in
        for name in seen:
            m = of == name
            if n_steps >= 3 and m.sum() == 1 and per_step[hs[m][0]] == 1:  # seen once in the window, alone in its step
                parts += list(zip(ha[m], hb[m]))
            elif n_steps >= 2 and len(seen[name] & set(range(1, n_steps + 1))) < n_steps:  # not its node every step
                unsure += list(zip(ha[m], hb[m]))
        # every moment the thread recorded something: its events' starts, its short ops' (the frame keeps long ops)
        rec = np.sort(np.r_[cpu.loc[on, "ts"].to_numpy(dtype=float), trace.short_spans_of([t])[0]])
        for g in np.unique(hs):
            i, j = np.flatnonzero(hs == g), np.flatnonzero(es == g)
            if len(i) == 1 and len(j) and len(seen.get(of[i[0]], ())) < 2:  # a node's hole in 2+ steps recurs
                k = j[np.argmin(ea[j])]
                lo = starts[g - 1] if g > 0 else -np.inf
                before = np.searchsorted(rec, ea[k], side="left") - np.searchsorted(rec, lo, side="left")
                if before == 0 and ea[k] <= ha[i[0]] and hb[i[0]] <= eb[k]:
                    parts.append((ha[i[0]], hb[i[0]]))
    own = union_np([p[0] for p in parts], [p[1] for p in parts])
    return own, subtract(union_np([p[0] for p in unsure], [p[1] for p in unsure]), own)


def _in_hooks(cpu, node, busy: dict, threads: tuple, stall: tuple) -> "tuple[np.ndarray, np.ndarray]":
    """The part of the process's ``stall`` spans that lies where an issuing thread is inside an autograd node's op
    without progress (:func:`autograd_nodes`, ``busy``: :func:`_progress_within` of those ops) for :data:`STALL_US` or
    longer, and not inside a region named within the node (the innermost event there is the node's, as
    :func:`_in_ops` reads it): the user's backward hooks (:data:`HOOK`)."""
    import numpy as np

    parts = []
    for t in threads:
        ops = cpu[node.to_numpy() & (cpu["tid"] == t).to_numpy()] if len(cpu) else cpu
        if not len(ops):
            continue
        reg = union_np(ops["ts"], ops["end"])
        ha, hb = subtract(reg, busy.get(t, (np.empty(0), np.empty(0))))
        # not inside a region named within a node (FSDP2's post-backward: a framework's, its slices a core's as likely)
        ann = cpu[(cpu["cat"] == "user_annotation").to_numpy() & (cpu["tid"] == t).to_numpy()]
        xa, xb = ann["ts"].to_numpy(dtype=float), ann["end"].to_numpy(dtype=float)
        i = np.clip(np.searchsorted(reg[0], xa, side="right") - 1, 0, None)
        nested = (xa >= reg[0][i]) & (xb <= reg[1][i]) if len(reg[0]) else np.zeros(len(xa), dtype=bool)
        ha, hb = subtract((ha, hb), union_np(xa[nested], xb[nested]))
        long = (hb - ha) >= STALL_US
        parts.append((ha[long], hb[long]))
    if not parts:
        return np.empty(0), np.empty(0)
    holes = union_np(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return subtract(stall, subtract(stall, holes))


def one_stall_a_step(stall: tuple, steps: "pd.DataFrame | None", hook: tuple | None = None) -> tuple:
    """Of the ``stall`` spans, those that are one stall of the rank's own code (:data:`ONE_STALL`): each step's
    longest stretch -- the spans less than :data:`STALL_US` apart taken as one -- every stretch longer than a core's
    slice can be (:data:`SLICE_MAX_US`), and the ``hook`` spans (:data:`HOOK`: a stall however many pieces it comes
    in). A step runs from one step annotation's start
    (``steps["ts"]``) to the next, the stretches before the first one together; without step annotations every
    stall span is kept (the trace is one step: nothing to tell its stretches apart by)."""
    import numpy as np

    a, b = (np.asarray(x, dtype=float) for x in stall)
    if len(a) and steps is not None and not steps.empty:
        xa, xb = union_np(a, b, gap=STALL_US)  # a moment's work (a launch) does not end a stall
        g = np.searchsorted(np.sort(steps["ts"].to_numpy(dtype=float)), xa, side="right")
        o = np.lexsort((-(xb - xa), g))  # by step, the longest first
        keep = np.union1d(o[np.r_[True, g[o][1:] != g[o][:-1]]], np.flatnonzero(xb - xa > SLICE_MAX_US))
        a, b = subtract((a, b), subtract((a, b), (xa[keep], xb[keep])))
    if hook is not None and len(hook[0]):
        a, b = union_np(np.r_[a, hook[0]], np.r_[b, hook[1]])
    return a, b


def autograd_nodes(cpu: "pd.DataFrame") -> "pd.Series":
    """Which events of ``cpu`` are autograd's node evaluations (:data:`kit.doctor.calls.AUTOGRAD_NODE`: the engine's
    op around a node, and the node's own op inside it, named as the node): ops that run the user's backward hooks
    between their recorded ops, so they cover a stretch only where their thread records progress in it
    (:func:`_progress_within`) -- a node's own work is its recorded ops (aten ops, their launches), and a stretch of
    :data:`STALL_US` with none is a hook's (a sleep, Python work, a lock) or the core taken away, not the framework
    issuing. A boolean Series on ``cpu``'s index."""
    import pandas as pd

    if cpu.empty:
        return pd.Series(False, index=cpu.index)
    op = (cpu["cat"] == "cpu_op").to_numpy()
    ev = _starts(cpu["name"], AUTOGRAD_NODE).to_numpy() & op
    if not ev.any():
        return pd.Series(False, index=cpu.index)
    own = {n[len(AUTOGRAD_NODE):] for n in names_str(cpu.loc[ev, "name"]).unique()}
    return pd.Series(ev | (name_mask(cpu["name"], lambda s: s.isin(own)).to_numpy() & op), index=cpu.index)


def _progress_within(trace, cpu: "pd.DataFrame", regions: "pd.DataFrame") -> dict:
    """Per thread of ``regions`` (rows of ``cpu``: FSDP2's post-backward annotations, autograd's node ops), the sorted
    disjoint parts of the union of its regions in which that thread made progress: within :data:`STALL_US` of a
    recorded event of its thread -- an op or runtime call inside a region while it runs, a short-op stretch
    (:meth:`kit.traces.Trace.short_spans_of`: the ops the frame leaves out) throughout (its ops less than
    LONG_CPU_OP_US apart), any other event at its bounds only: an annotation (a region the user or the framework
    named holds Python), the regions themselves, an event around a region (autograd's node that runs FSDP's
    post-backward runs the user's hooks too). What lies less than :data:`STALL_US` between two of them is the
    framework's Python between its ops; a longer stretch with no event is not covered."""
    import numpy as np

    out = {}
    for u in dict.fromkeys(regions["tid"]):
        reg = union_np(regions.loc[regions["tid"] == u, "ts"], regions.loc[regions["tid"] == u, "end"])
        own = cpu[cpu["tid"] == u]
        ts, end = own["ts"].to_numpy(dtype=float), own["end"].to_numpy(dtype=float)
        i = np.clip(np.searchsorted(reg[0], ts, side="right") - 1, 0, None)
        run = ((own["cat"] != "user_annotation").to_numpy() & ~own.index.isin(regions.index)
               & (ts >= reg[0][i]) & (end <= reg[1][i]))
        sa, sb = trace.short_spans_of([u])
        pa, pb = union_np(np.r_[ts[run], sa, ts[~run], end[~run]], np.r_[end[run], sb, ts[~run], end[~run]], STALL_US)
        out[u] = subtract(reg, subtract(reg, (pa, pb)))
    return out


def _profiler_spans(cpu: "pd.DataFrame") -> "tuple[np.ndarray, np.ndarray]":
    """The sorted disjoint spans of the profiler's own events (:data:`PROFILER_EVENTS`)."""
    if cpu.empty:
        return union_np([], [])
    ev = cpu[(cpu["cat"] == "overhead") & name_mask(cpu["name"], lambda s: s.isin(PROFILER_EVENTS))]
    return union_np(ev["ts"], ev["end"])


def _dispatch(region: "pd.DataFrame", issuing: "pd.DataFrame") -> "tuple[np.ndarray, np.ndarray]":
    """The framework's own dispatch in PyTorch's regions of issuing code (:data:`kit.doctor.calls.FRAMEWORK_REGIONS`):
    per region, the stretch before its first issuing call on the thread (the whole region without one) -- its
    Python and dispatch before the first launch: an FSDP2 optimizer's DTensor dispatch (~0.5 ms), SGD's grouping of
    a GPT's parameters by device and dtype (1.3 ms on the 4x tiny-bucket job; FINDINGS.md). The region after its
    first launch is not exempt: user code runs there too (``Optimizer.step#`` wraps the step post-hooks and a custom
    optimizer's Python), so a stall there stays a stall. A stall in a step *pre*-hook lies before the first launch
    and is taken for dispatch: the hooks carry no annotation of their own, so the trace does not tell them apart."""
    import numpy as np

    ra, rb = region["ts"].to_numpy(dtype=float), region["end"].to_numpy(dtype=float)
    ts = np.r_[np.sort(issuing["ts"].to_numpy(dtype=float)), np.inf]
    return union_np(ra, np.minimum(ts[np.searchsorted(ts, ra, side="left")], rb))


def _main_tid(cpu: "pd.DataFrame", g: "pd.DataFrame"):
    """The thread holding the step annotations, else the one that issued the most GPU work."""
    if not cpu.empty:
        st = cpu[(cpu["cat"] == "user_annotation") & _starts(cpu["name"], STEP_PREFIX)]
        if len(st):
            return st["tid"].mode().iloc[0]
    tids = g["tid"].dropna()
    return tids.mode().iloc[0] if len(tids) else None


def _all_threads(cpu: "pd.DataFrame", calls: "pd.DataFrame", sets: dict, threads: tuple, main) -> dict:
    """The process's view: DataLoader waits and synchronising calls of any thread, the allocator and collective
    waits of the issuing threads, and the main thread's stalls (another thread that issues nothing while the main
    thread waits for its DataLoader is not stalled for the step)."""
    import numpy as np

    data = cpu[(cpu["cat"] == "user_annotation") & _starts(cpu["name"], DATALOADER)] \
        if not cpu.empty else cpu
    sync = calls[calls["kind"] == "sync"]
    out = {"data_wait": union_np(data["ts"], data["end"]), "sync": union_np(sync["ts"], sync["end"])}
    for k in ("comm_wait", "alloc", "idle"):
        parts = [sets[t][k] for t in threads if t in sets]
        out[k] = union_np(np.concatenate([p[0] for p in parts]) if parts else [],
                          np.concatenate([p[1] for p in parts]) if parts else [])
    blocks = union_np(np.r_[out["data_wait"][0], out["sync"][0]], np.r_[out["data_wait"][1], out["sync"][1]])
    out["stall"] = subtract(sets[main]["stall"], blocks) if main in sets else (np.empty(0), np.empty(0))
    out["profiler"] = sets[main]["profiler"] if main in sets else (np.empty(0), np.empty(0))
    return out


# ------------------------------------------------------------------------------------------------ CPU-only jobs
def _cpu_model(view: "RankView", cpu: "pd.DataFrame") -> HostModel | None:
    import numpy as np
    import pandas as pd

    from .steps import step_windows

    steps = cpu[(cpu["cat"] == "user_annotation") & _starts(cpu["name"], STEP_PREFIX)]
    with_ops = cpu[cpu["cat"] == "cpu_op"]
    main = steps["tid"].mode().iloc[0] if len(steps) else with_ops["tid"].mode().iloc[0]
    mine = cpu[cpu["tid"] == main]
    ops = mine[mine["cat"] == "cpu_op"]
    comm = cpu[name_mask(cpu["name"], lambda s: s.str.match(COMM_OPS))]  # the trace layer's collective ops, on any thread
    data = mine[(mine["cat"] == "user_annotation") & _starts(mine["name"], DATALOADER)]
    win = step_windows(view.steps, None)
    if win["start"].isna().all():
        if ops.empty:
            return None
        win = pd.DataFrame({"step": [-1], "start": [float(ops["ts"].min())], "end": [float(ops["end"].max())]})
    lo, hi = float(win["start"].min()), float(win["end"].max())
    # sentinels: a stall may run from the window's start or to its end
    rec = union_np(np.r_[lo - 1e-3, ops["ts"], data["ts"], hi], np.r_[lo, ops["end"], data["end"], hi + 1e-3])
    empty = (np.empty(0), np.empty(0))
    comm_wait, stall = _blocked_on_peers(union_np(comm["ts"], comm["end"]), gaps_between(*rec, STALL_US))
    sets = {main: {"data_wait": union_np(data["ts"], data["end"]), "sync": empty,
                   "comm_wait": comm_wait, "alloc": empty,
                   "stall": stall, "issue": union_np(ops["ts"], ops["end"])}}
    sets[ALL] = dict(sets[main])
    calls = runtime_calls(view)
    return _finish(view, "cpu", win, main, (main,), calls, sets, default="idle", gpu=None, cpu=cpu)


def _blocked_on_peers(comm: tuple, gaps: tuple) -> tuple[tuple, tuple]:
    """A CPU-only job's collective waits and stalls: in a gap of the main thread's ops that a collective overlaps,
    the thread is blocked in the call that waits for it (DDP's ``backward()`` waiting for its buckets' all-reduce on
    gloo's thread) from the collective's start to :data:`WAKE_US` after its end -- waiting for a peer
    (``comm_wait``), not a stall of its own; a stretch of the gap outside those, at least :data:`STALL_US` long, is
    a stall (Python work after the wait), a shorter one part of the wait (the hand-off to gloo's thread); the gaps
    no collective overlaps stay stalls. Returns (comm_wait spans, stall spans)."""
    import numpy as np

    from ..traces.intervals import covered

    ga, gb = gaps
    hit = covered(*comm, ga, gb) > 0 if len(ga) else np.zeros(0, dtype=bool)
    waits = (ga[hit], gb[hit])
    ra, rb = subtract(waits, union_np(comm[0], comm[1] + WAKE_US))
    own = (rb - ra) >= STALL_US
    wa, wb = subtract(waits, (ra[own], rb[own]))
    return (union_np(np.r_[comm[0], wa], np.r_[comm[1], wb]),
            union_np(np.r_[ga[~hit], ra[own]], np.r_[gb[~hit], rb[own]]))


# ------------------------------------------------------------------------------------------------ both
def _finish(view, mode, win, main, threads, calls, sets, default: str, gpu, cpu=None) -> HostModel:
    """The activity rows (precedence applied per thread) and the per-step split of the main thread."""
    import numpy as np
    import pandas as pd

    wa, wb = win["start"].to_numpy(dtype=float), win["end"].to_numpy(dtype=float)
    lo, hi = float(wa.min()), float(wb.max())
    rows, per = [], None
    for t in [x for x in sets if x != ALL]:
        s, e, cls = _classify(sets[t], lo, hi, default, extra=np.r_[wa, wb])
        if t == main:
            w = np.searchsorted(wa, s, side="right") - 1
            ok = (w >= 0) & (s < wb[np.clip(w, 0, None)])
            per = pd.DataFrame({"w": w[ok], "cls": cls[ok], "dur": (e - s)[ok]}).pivot_table(
                index="w", columns="cls", values="dur", aggfunc="sum", fill_value=0.0)
        keep = np.r_[True, (cls[1:] != cls[:-1]) | (s[1:] != e[:-1])] if len(s) else np.zeros(0, dtype=bool)
        grp = np.cumsum(keep) - 1
        if len(s):
            a = pd.DataFrame({"g": grp, "ts": s, "end": e, "kind": cls}).groupby("g").agg(
                ts=("ts", "min"), end=("end", "max"), kind=("kind", "first"))
            rows.append(a.assign(tid=t))
    act = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["ts", "end", "kind", "tid"])
    act = act.assign(name=_names(act, calls, view.trace.cpu if cpu is None else cpu))
    per_step = win.rename(columns={"start": "ts"}).reset_index(drop=True).assign(dur=wb - wa)
    per = (per if per is not None else pd.DataFrame()).reindex(index=range(len(win)), columns=list(KINDS),
                                                                 fill_value=0.0)
    for k in KINDS:
        per_step[f"{k}_us"] = per[k].to_numpy(dtype=float)
    for c, key in (("gpu_busy_us", "busy"), ("gpu_comm_us", "comm"), ("gpu_kernels_us", "kernels")):
        per_step[c] = _per_window(gpu[key], wa, wb) if gpu else 0.0
    per_step["gpu_compute_us"] = per_step["gpu_busy_us"] - per_step["gpu_comm_us"]
    own = _own_host(view, sets, win, default, main, calls)
    for k in ("host", "stall", "data_wait", "quiet", "stall_longest", "quiet_in_ops", "quiet_in_nodes"):
        per_step[f"own_{k}_us"] = own[k]
    if mode != "gpu":  # a CPU-only job's ops run long with no event inside: no quiet time to tell from them
        per_step["own_quiet_us"] = per_step["own_quiet_in_ops_us"] = per_step["own_quiet_in_nodes_us"] = 0.0
    return HostModel(mode=mode, activity=act[["tid", "ts", "end", "kind", "name"]], per_step=per_step[list(PER_STEP)],
                     windows=win.reset_index(drop=True), main_tid=main, threads=tuple(threads), calls=calls, sets=sets)


def _own_host(view, sets: dict, win: "pd.DataFrame", default: str, main, calls) -> "dict[str, np.ndarray]":
    """Per window, the time inside its step annotation (the window's own bounds without step annotations) in which
    the main thread was in one of :data:`OWN_KINDS`, or another thread that issues the rank's work was issuing it or
    in the allocator (the autograd thread issuing the backward while the main thread waits in ``backward()``; a
    helper thread's long quiet stretches are its waiting for work, not the rank's time) -- less its calls that issue
    work and block :data:`STALL_US` or longer: the GPU's queue is full, the host waits for the GPU. Returns that time
    (``host``), the main thread's ``stall`` and ``data_wait`` in it, and its ``quiet`` part (:data:`PER_STEP`), per
    window."""
    import numpy as np

    from ..traces.intervals import covered

    st = view.steps
    if st is None or st.empty or (win["step"] < 0).all():
        a, b = win["start"].to_numpy(dtype=float), win["end"].to_numpy(dtype=float)
    else:
        by = st.drop_duplicates("step").set_index("step")
        a = by["ts"].reindex(win["step"]).to_numpy(dtype=float)
        b = by["end"].reindex(win["step"]).to_numpy(dtype=float)
    ok = ~np.isnan(a) & ~np.isnan(b) & (b > a)
    out = {k: np.zeros(len(win)) for k in ("host", "stall", "data_wait", "quiet", "stall_longest", "quiet_in_ops",
                                            "quiet_in_nodes")}
    if not ok.any():
        return out
    lo, hi = float(a[ok].min()), float(b[ok].max())
    sa, sb, mine = [], [], {}
    for t, spans in sets.items():
        if t == ALL:
            continue
        s, e, cls = _classify(spans, lo, hi, default, extra=np.r_[a[ok], b[ok]])
        m = np.isin(cls, OWN_KINDS if t == main else ("issue", "alloc"))
        sa.append(s[m])
        sb.append(e[m])
        if t == main:
            mine = {k: union_np(s[cls == k], e[cls == k]) for k in ("stall", "data_wait")}
    if sa:
        ua, ub = union_np(np.concatenate(sa), np.concatenate(sb))
        if calls is not None and len(calls) and "issues" in calls:
            full = calls[calls["issues"] & ((calls["end"] - calls["ts"]) >= STALL_US)]
            if len(full):
                blocked = union_np(full["ts"].to_numpy(dtype=float), full["end"].to_numpy(dtype=float))
                ua, ub = subtract((ua, ub), blocked)
                mine = {k: subtract(v, blocked) for k, v in mine.items()}
        out["host"][ok] = covered(ua, ub, a[ok], b[ok])
        waits = [sets.get(ALL, {}).get(k, ((), ())) for k in ("data_wait", "sync")]  # waiting, not preempted
        waits = union_np(np.r_[waits[0][0], waits[1][0]], np.r_[waits[0][1], waits[1][1]])
        qa, qb = _quiet(view.trace.cpu, *subtract((ua, ub), waits), view.trace.short_spans)
        out["quiet"][ok] = covered(qa, qb, a[ok], b[ok])
        inside, in_node = _in_ops(view.trace.cpu, qa, qb)
        out["quiet_in_ops"][ok] = covered(qa[inside], qb[inside], a[ok], b[ok])
        out["quiet_in_nodes"][ok] = covered(qa[in_node], qb[in_node], a[ok], b[ok])
        for k, v in mine.items():
            out[k][ok] = covered(*v, a[ok], b[ok])
        if "stall" in mine:  # the longest stretch of the host model's one-stall reading (ONE_STALL), where it has one
            one = sets.get(ALL, {}).get(ONE_STALL)
            st = mine["stall"] if one is None else subtract(mine["stall"], subtract(mine["stall"], one))
            xa, xb = union_np(*st, gap=STALL_US)  # a moment's work (a launch) does not end a stall
            out["stall_longest"][ok] = [float(np.max(np.minimum(xb, y) - np.maximum(xa, x), initial=0.0))
                                        for x, y in zip(a[ok], b[ok])]
    return out


def _quiet(cpu, ua, ub, short=((), ())) -> "tuple[np.ndarray, np.ndarray]":
    """The stretches of :data:`STALL_US` or longer inside the spans ``ua``-``ub``, less the spans of the collective ops
    (:data:`kit.traces.frames.COMM_OPS`, any thread: a thread in a collective's call waits for it, as ``comm_wait``
    does), in which no event of ``cpu`` (every thread) begins or ends, nor a short op the frame left out (outside
    ``short``, :attr:`kit.traces.Trace.short_spans`: exact while :data:`STALL_US` >= their merging gap)."""
    import numpy as np

    from ..traces.intervals import cover

    sa, sb = (np.asarray(x, dtype=float) for x in short)
    if cpu is not None and len(cpu):
        comm = cpu[name_mask(cpu["name"], lambda n: n.str.match(COMM_OPS))]
        if len(comm):
            ua, ub = subtract((ua, ub), union_np(comm["ts"].to_numpy(dtype=float), comm["end"].to_numpy(dtype=float)))
    if not len(ua):
        return ua, ub
    pts = np.unique(np.r_[ua, ub, sa, sb, cpu["ts"].to_numpy(dtype=float), cpu["end"].to_numpy(dtype=float)]
                    if cpu is not None and len(cpu) else np.r_[ua, ub, sa, sb])
    s, e = pts[:-1], pts[1:]
    m = ((e - s) >= STALL_US) & cover(ua, ub, s) & ~cover(sa, sb, s)
    return s[m], e[m]


def _in_ops(cpu, qa, qb) -> "tuple[np.ndarray, np.ndarray]":
    """Which quiet stretches ``qa``-``qb`` (no event begins or ends in them) lie inside an op or runtime call
    (:data:`OP_CATS`) on some thread: the innermost event covering the stretch on that thread is one; and which of
    those lie inside an autograd node's ops on every such thread (:func:`autograd_nodes`: the innermost op is a node's,
    none of its recorded ops covers the stretch) -- where the user's backward hooks run as well as where the core was
    taken. Two boolean arrays over the stretches."""
    import numpy as np

    inside = np.zeros(len(qa), dtype=bool)
    if cpu is None or not len(cpu) or not len(qa):
        return inside, inside.copy()
    long = cpu[(cpu["end"] - cpu["ts"]) >= float(np.min(np.asarray(qb) - np.asarray(qa)))]  # only these can cover one
    ts, end = long["ts"].to_numpy(dtype=float), long["end"].to_numpy(dtype=float)
    op = long["cat"].isin(OP_CATS).to_numpy()
    node = autograd_nodes(long).to_numpy()
    in_node = np.zeros(len(qa), dtype=bool)
    tid = long["tid"].to_numpy()
    for i, (a, b) in enumerate(zip(qa, qb)):
        m = np.flatnonzero((ts <= a) & (end >= b))
        if len(m):
            last = {}
            for j in m[np.argsort(ts[m], kind="stable")]:  # each thread's latest-starting covering event: innermost
                last[tid[j]] = j
            j = list(last.values())
            inside[i] = bool(op[j].any())
            in_node[i] = inside[i] and not (op[j] & ~node[j]).any()
    return inside, in_node


def _classify(sets: dict, lo: float, hi: float, default: str, extra) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
    """The segments of ``[lo, hi]`` and their kind: the first of :data:`KINDS` whose spans cover it, else
    ``default``."""
    import numpy as np

    pts = partition(list(sets.values()), extra=np.r_[lo, hi, extra])
    pts = pts[(pts >= lo) & (pts <= hi)]
    s, e = pts[:-1], pts[1:]
    cls = np.full(s.shape, default, dtype=object)
    for k in reversed(KINDS):  # first in precedence wins: assign in reverse
        if k in sets and k != default:
            cls[cover(*sets[k], s)] = k
    return s, e, cls


def _per_window(spans, wa, wb) -> "np.ndarray":
    from ..traces.intervals import covered

    return covered(spans[0], spans[1], wa, wb)


def _names(act: "pd.DataFrame", events: "pd.DataFrame", cpu: "pd.DataFrame") -> list[str]:
    """Per activity row, the call or annotation behind it (the latest event of its kind's source on its thread
    that started at or before it); '' for stall, issue and idle."""
    import numpy as np

    src = {"sync": events, "alloc": events}
    if not cpu.empty:
        ann = cpu[(cpu["cat"] == "user_annotation") & _starts(cpu["name"], DATALOADER)]
        src["data_wait"] = ann
        src["comm_wait"] = cpu[name_mask(cpu["name"], lambda n: n.str.match(COMM_OPS) | n.str.startswith(COMM_WAIT_OPS))]
    out = [""] * len(act)
    for kind, ev in src.items():
        sel = np.flatnonzero((act["kind"] == kind).to_numpy())
        if not len(sel) or ev.empty:
            continue
        for tid, idx in _by(act.iloc[sel]["tid"], sel):
            mine = ev[ev["tid"] == tid] if kind != "comm_wait" else ev
            if kind in ("sync", "alloc") and "kind" in mine.columns:
                mine = mine[mine["kind"] == kind]
            mine = mine.sort_values("ts", kind="stable")
            if mine.empty:
                continue
            j = np.searchsorted(mine["ts"].to_numpy(dtype=float), act["ts"].to_numpy(dtype=float)[idx] + 1e-6,
                                side="right") - 1
            names = names_str(mine["name"]).to_numpy()
            for i, k in zip(idx, j):
                out[i] = names[k] if k >= 0 else ""
    return out


def _by(tids, idx):
    import pandas as pd

    s = pd.Series(idx, index=tids.to_numpy())
    return [(t, s.loc[[t]].to_numpy()) for t in pd.unique(tids)]
