"""The profiler's own overhead in a traced step: what the step costs without the profiler, measured where the
trace carries it, else estimated -- so that a finding's cost is the user's problem, not the profiler's.

Recording every op costs the host time (an event per op and per CUDA runtime call, more with ``record_shapes`` and
``with_stack``); a job whose host was nearly as fast as its GPU becomes host-bound under the profiler, and the
host's share of every traced step grows. :func:`overhead` gives one rank's :class:`ProfilerOverhead`:

* **measured**: the trace's ``kitCapture`` header (or its sidecar) holds ``unprofiled_step_us`` -- every sample
  of the steps :mod:`kit.capture` timed without the profiler just before the recorded window; the unprofiled
  step is their median, the overhead is the traced step (median of the rank's step windows, the host model's
  ``dur``) minus it -- where the samples can carry it (:func:`unmeasurable`: else estimated, and ``note`` says why).
* **estimated**: recorded host events per step (CUDA runtime/driver calls; ``aten::`` ops -- every op where the
  frame holds every op, else the ops it kept plus the short ones the trace layer counted) x a per-event cost, plus
  the profiler's own time the trace shows (the host model's ``profiler`` kind: CUPTI's buffer requests and
  flushes). The per-op cost is the host session's (one job paid 2-3x more per op on one GPU host than on another:
  FINDINGS.md), so a GPU trace's ops are priced by the host's speed as the trace shows it: a factor per profiler
  setting (without ``record_shapes``, per kind of job too) x the rank's median kernel launch in its steps
  (:func:`pick_scaled`, ``jobs-launch.json``, fitted and judged held out by ``tests/corpus/overhead_eval.py``);
  without launches or a row for its settings, by :func:`pick`'s table (which one is stated). ``with_stack`` has a
  row for a multi-process rank with ``record_shapes``: (a + b x the rank's Python frames per op) x the launch
  (:func:`_frames_per_op`: the frames among the ops, a thread's stretch of Python without an op left out; fitted on
  10 GPT and CNN DDP jobs on 4x H200 whose stacks cost 1.44x the shapes-only overhead and, since session 12, an FSDP
  job's 10-11 frames per op, FINDINGS.md "The price of a trace recorded with stacks"), plus the frames of those stretches at the row's own price per frame off the ops x the
  launch (:func:`_off_ops`: a pure-Python loop's builtin calls; a loop that reads the clock as it goes, which runs to
  a deadline, left out; :attr:`ProfilerOverhead.off_ops_us`); any other trace with stacks takes its settings' row
  without them, and ``how`` says that is likely low. The settings are the kitCapture header's, else read in the trace -- Python frames and
  ``[memory]`` events as the trace layer counted them (:class:`kit.traces.TraceInfo`: the default frame keeps
  neither); ``profile_memory`` added nothing measurable on those jobs (0.99x) and is not a setting of the price. An estimate is within
  about 2x either way. The profiler's time is host time, and it lengthens the step only where the GPU waited for
  the host (:func:`_exposed`: between the host's waits for the GPU the step's GPU work is replayed without the
  profiler's time; a step with no such wait saves it up to its GPU's idle time, the host running ahead into the next
  step); the unprofiled estimate is
  ``max(traced - exposed host overhead, GPU busy outside collectives)``, and a job's ranks step at the pace of the
  rank that loses most (:func:`job_floor`).
* **none**: no step windows, or no table for the trace's kind of device.

``how`` says which, from what, in one sentence; :meth:`ProfilerOverhead.net` is a host-side cost net of it.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .model import SEVERITY_SHARE

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .model import RankView

TABLES = Path(__file__).resolve().parents[2] / "recorded" / "profiler_overhead"
"""the per-event costs ``benchmarks/bench_profiler_overhead.py`` recorded, one JSON per machine"""
ESTIMATE_RANGE = 2.0
"""an estimated overhead is within about this factor either way of the profiler's true cost (the per-op cost of
one host and job against another's: the module's docstring, FINDINGS.md)"""
MEDIAN_Z = 2.0
"""how many standard errors either side of kit.capture's median unprofiled step it may lie (about 95%):
:func:`unmeasurable`"""
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
"""the calls that launch one kernel: their median traced length in a rank's steps is the host's speed under the
profiler as the trace shows it (:func:`pick_scaled`)"""


@dataclass(frozen=True)
class ProfilerOverhead:
    """One rank's traced step against its step without the profiler (microseconds)."""

    traced_step_us: float | None
    unprofiled_step_us: float | None
    overhead_us: float
    basis: str
    """'measured', 'estimated' or 'none'"""
    how: str
    host_us: float | None = None
    """the profiler's own host time per step as this rank's recorded ops price it (recorded events x their cost,
    :func:`_priced`), whatever the basis: a measured overhead is the job's (traced less unprofiled step), which a
    host whose GPU or peers set the pace hides; this is that host's own. None without a price"""
    exposed_us: float | None = None
    """estimated: the part of :attr:`host_us` that lengthened the rank's step -- where its GPU waited for the host
    (:func:`_exposed`); the rest ran while the GPU worked"""
    own_work_us: float | None = None
    """in a job of several ranks (:func:`own_work`, set by :func:`job_floor`): measured, the most GPU work of its own
    any rank of the job does per step -- were every host instant, the job would still take that long; estimated, this
    rank's own GPU work per step (the job's most is a floor of its unprofiled step): its GPU idles at most the
    unprofiled step less that, whatever its host does"""
    launch_us: float | None = None
    """the rank's median kernel launch in its steps that :attr:`host_us` was priced by (:func:`pick_scaled`); None
    where the price is a table's. Read by :func:`kit.doctor.own_time.at_job_speed` to compare ranks at the job's
    reading"""
    data_wait_us: float | None = None
    """the part of the overhead recorded inside the DataLoader's waits (where they leave the GPU idle): the overhead
    less :attr:`off_ops_us` spread evenly over the recorded ops of the steps, the share of the ops recorded inside the
    waits (:func:`data_wait_share`), plus the frames off the ops that lie inside them (a transform run by the loader
    on the training thread, at the low end of their price, :func:`tracer_taken`); a loader fed by worker processes
    records none of its work there"""
    data_wait_tracer_us: float = 0.0
    """the whole price of the frames off the ops inside the DataLoader's waits, of which :attr:`data_wait_us` takes
    :func:`tracer_taken`"""
    off_ops_us: float = 0.0
    """the part of :attr:`host_us` in the rank's Python frames off its ops (:func:`_off_ops`: stretches of pure
    Python on a thread that records ops, a loop that reads the clock as it goes left out), per step at the with_stack
    row's price per frame; included in :attr:`host_us` (and, estimated, in the overhead where it lengthened the step).
    The tracer's cost there is the rank's own, not the profiler's uneven slowing of equal hosts: own-time comparisons
    take it off the rank's own time (:mod:`kit.doctor.own_time`, per step: :attr:`off_ops_steps`) rather than allow
    for it as noise"""
    off_ops_exposed_us: float = 0.0
    """the part of :attr:`off_ops_us` in :attr:`overhead_us`: estimated, what pricing those frames added to the time
    that lengthened the step (:func:`_exposed` with and without them); measured, at most the overhead"""
    off_ops_steps: tuple = ()
    """``((step, us), ...)``: the price of the frames off the ops on the rank's main thread in each step
    (:func:`_tracer_steps`): the time :data:`kit.doctor.own_time.TRACER` takes off its own time"""
    off_ops_in_wait_steps: tuple = ()
    """``((step, us), ...)``: the part of :attr:`off_ops_steps` inside the main thread's DataLoader waits"""
    note: str | None = None
    """why an overhead is not on the basis the trace offers (kit.capture's unprofiled steps too spread to measure it:
    :func:`unmeasurable`); None where it is"""

    @property
    def share(self) -> float | None:
        """The profiler's share of the traced step."""
        return self.overhead_us / self.traced_step_us if self.traced_step_us else None

    @property
    def unprofiled_high_us(self) -> float | None:
        """The longest the step can be without the profiler, as far as this overhead knows: measured, the unprofiled
        step; estimated, the traced step less the overhead at the low end of its range (:data:`ESTIMATE_RANGE`) --
        never below :attr:`unprofiled_step_us`. A bound from above on a cost net of the profiler must hold there: an
        estimate's point value can be off by its range, and a difference of two large numbers with it."""
        if self.unprofiled_step_us is None:
            return None
        if self.basis != "estimated" or self.traced_step_us is None:
            return self.unprofiled_step_us
        return max(self.unprofiled_step_us, float(self.traced_step_us) - float(self.overhead_us) / ESTIMATE_RANGE)

    @property
    def gain_cap_us(self) -> float | None:
        """The most GPU idle the job's issuing can cost net of the profiler: :attr:`unprofiled_high_us` less
        :attr:`own_work_us` -- measured, the job's gain were every host instant; estimated, the rank's own GPU idle
        at most, at the longest the estimate allows the step to be (the rank's own work, not the busiest GPU's). None
        where either is not known."""
        high = self.unprofiled_high_us
        if self.own_work_us is None or high is None:
            return None
        return max(0.0, high - self.own_work_us)

    @property
    def point_cap_us(self) -> float | None:
        """The one point cap: the most GPU idle a rank's issuing, its input waits or its lateness can cost at the
        overhead's point value -- :attr:`unprofiled_step_us` less :attr:`own_work_us` where that is known (measured:
        the busiest GPU's work, which the job would still do were every host instant; estimated: the rank's own),
        else the step itself. Read by the step accounting's input and launch slices
        (:func:`kit.doctor.reconcile.net_of_profiler`) and by late_rank (``tracer_range``) alike, through
        :func:`within_point`; :attr:`gain_cap_us` is its counterpart at the estimate's high end. A cost above it is
        one the point estimate contradicts. None where the step is not known."""
        if self.unprofiled_step_us is None:
            return None
        return max(0.0, float(self.unprofiled_step_us) - float(self.own_work_us or 0.0))

    @property
    def slow_window_us(self) -> float:
        """Measured only: the part of :attr:`overhead_us` beyond the rank's recorded events priced at the top of their
        range (:data:`ESTIMATE_RANGE` x :attr:`host_us`) -- host time the traced window ran slower than its unprofiled
        steps for reasons other than the profiler's events (the machine's pace: FINDINGS.md, "A slow traced
        window"), in every slice, stretches with no event among them. 0 for an estimate (nothing measured to
        compare) or without a price. ``host_stall`` is charged net of it."""
        if self.basis != "measured" or self.host_us is None:
            return 0.0
        return max(0.0, float(self.overhead_us) - ESTIMATE_RANGE * float(self.host_us))

    def net(self, cost_us: float, s: str | None = None, overhead_us: float | None = None) -> float:
        """A host-side cost net of the profiler's own host time (never below zero; ``overhead_us``: the part of
        :attr:`overhead_us` to take off, default all of it); one of the accounting's ``launch`` slice (``s``: the
        host's issuing) at most :attr:`gain_cap_us`."""
        net = max(0.0, float(cost_us) - (self.overhead_us if overhead_us is None else overhead_us))
        cap = self.gain_cap_us if s == "launch" else None
        return net if cap is None else min(net, cap)

    def as_dict(self) -> dict[str, Any]:
        return {"traced_step_us": _r(self.traced_step_us), "unprofiled_step_us": _r(self.unprofiled_step_us),
                "profiler_overhead_us": _r(self.overhead_us), "basis": self.basis, "how": self.how,
                **({"basis_note": self.note} if self.note else {}),
                **({"profiler_off_ops_us": _r(self.off_ops_us)} if self.off_ops_us >= 0.05 else {})}


def _r(x):
    return None if x is None else round(float(x), 1)


# ------------------------------------------------------------------------------------------------ tables
@lru_cache(maxsize=4)
def tables(root: str = str(TABLES)) -> tuple[dict, ...]:
    """Every recorded per-event cost table under ``root`` (each with its ``file`` name)."""
    out = []
    for p in sorted(Path(root).glob("*.json")):
        try:
            t = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(t, dict) and t.get("settings"):
            out.append({**t, "file": p.name})
    return tuple(out)


def pick_scaled(gpu: bool, record_shapes: bool, with_stack: bool, root: str = str(TABLES),
                distributed: bool = False) -> tuple[dict | None, dict | None]:
    """The table and row (``"kind": "jobs-launch"``: ``us_per_op_per_launch_us`` x the rank's median kernel
    launch, :data:`LAUNCH_CALLS`) of a GPU trace's exact settings and, where a row says (``distributed``, as in
    :func:`pick`), its kind of job; a trace recorded ``with_stack`` whose settings have no stack row, the row of its
    settings without stacks (a floor: stacks only add events; the caller says so, :func:`_lower_bound`); (None, None)
    without one (:func:`pick` then)."""
    if not gpu:
        return None, None
    for stack in ((with_stack, False) if with_stack else (False,)):
        for t in reversed(tables(root)):
            if t.get("kind") == "jobs-launch":
                rows = [r for r in t["settings"] if r["record_shapes"] == record_shapes and r["with_stack"] == stack
                        and r.get("distributed", distributed) == distributed]
                if rows:
                    return t, rows[0]
    return None, None


def pick(device_name: str | None, gpu: bool, record_shapes: bool, with_stack: bool, distributed: bool = False,
         root: str = str(TABLES)) -> tuple[dict | None, dict | None]:
    """The table and row a trace is priced with where :func:`pick_scaled` has none: among the tables of the same GPU
    model (else any GPU's, else the CPU's), one fitted on real jobs (``"kind": "jobs"``: none is committed any more;
    ``tests/corpus/overhead_eval.py`` replays a retired one through this for its "today") with a row of the
    trace's exact settings and kind of job (``distributed``: a rank of a multi-process job) -- of the same GPU model
    only: real jobs' per-op cost differs between hosts -- else a loop table (``benchmarks/bench_profiler_overhead.py``)
    with its settings, else the group's last loop table's nearest row. A rank of a multi-process job pays more per
    recorded op than a one-GPU job of the same host (the measured costs: FINDINGS.md, "kit doctor's thresholds against
    the recorded runs")."""
    ts = [t for t in tables(root) if t.get("kind") != "jobs-launch"]  # that one is pick_scaled's
    same = [t for t in ts if gpu and device_name and t["machine"].get("device") == device_name]
    gpus = [t for t in ts if gpu and t["machine"].get("device") not in (None, "cpu")]
    cpus = [t for t in ts if not gpu and t["machine"].get("device") == "cpu"]
    for group in (same, gpus, cpus):
        if not group:
            continue
        for jobs in ((True, False) if group is same else (False,)):  # a jobs table prices its own GPU model only
            for t in reversed(group):
                if (t.get("kind") == "jobs") != jobs:
                    continue
                exact = [r for r in t["settings"] if bool(r["cuda"]) == gpu and r["record_shapes"] == record_shapes
                         and r["with_stack"] == with_stack and (not jobs or bool(r.get("distributed")) == distributed)]
                if exact:
                    return t, exact[0]
        t = ([x for x in group if x.get("kind") != "jobs"] or group)[-1]
        return t, _row(t, gpu, record_shapes, with_stack)
    return None, None


def _row(table: dict, cuda: bool, record_shapes: bool, with_stack: bool) -> dict | None:
    rows = [r for r in table["settings"] if bool(r["cuda"]) == cuda]
    exact = [r for r in rows if r["record_shapes"] == record_shapes and r["with_stack"] == with_stack]
    return (exact or rows or [None])[0]


# ------------------------------------------------------------------------------------------------ the rank
def _view(trace_or_view: Any) -> "RankView":
    """A RankView with its host model, from a view (as is), a Trace or a path."""
    if hasattr(trace_or_view, "host") and hasattr(trace_or_view, "trace"):
        return trace_or_view
    from dataclasses import replace

    from .. import traces
    from .host_model import host_model
    from .model import RankView
    from .steps import find_steps

    t = traces.load_trace(trace_or_view) if isinstance(trace_or_view, (str, Path)) else trace_or_view
    cpu_all = None
    if t.gpu.empty and t.path is not None:
        cpu_all = traces.load_trace(t.path, cpu="all").cpu
    view = RankView(trace=t, steps=find_steps(t.cpu, cpu_all, t.gpu), rank=t.info.rank if t.info.rank is not None else -1)
    view.memo["cpu_all"] = cpu_all
    return replace(view, host=host_model(view, cpu_all))


def _per_step(view: "RankView") -> "pd.DataFrame | None":
    ps = getattr(view.host, "per_step", None) if view.host is not None else None
    if ps is None or ps.empty:
        return None
    return ps[ps["step"] >= 0] if (ps["step"] >= 0).any() else ps


def _events(view: "RankView", per_step: "pd.DataFrame") -> dict:
    """The host's recorded events placed in the steps, once for :func:`_counts`, :func:`_exposed` and
    :func:`data_wait_share`: per CPU event of the frame (every one where the view holds every CPU event,
    ``memo["cpu_all"]``; else the ones it kept), its start ``ts``, ``rt`` (a CUDA runtime or driver call), ``op``
    (an ``aten::`` op) and ``inside`` (in a step's host side: the steps' annotations, else the windows,
    :func:`_windows`); ``n``: the steps; ``full``: every op is in the frame, else ``short``: the short ops the trace
    layer counted and left out (:attr:`kit.traces.TraceInfo.short_ops`); ``launch_us``: the median length of the
    steps' kernel launches (:data:`LAUNCH_CALLS`; None without one), the host's speed under the profiler as the
    trace shows it."""
    import numpy as np

    from .host_model import name_mask, names_str

    cpu_all = view.memo.get("cpu_all")
    full = cpu_all is not None and not cpu_all.empty
    cpu = cpu_all if full else view.trace.cpu
    a, b = _windows(view, per_step)
    ts = cpu["ts"].to_numpy(float)
    i = np.searchsorted(a, ts, side="right") - 1
    cats = names_str(cpu["cat"]).to_numpy()
    inside = (i >= 0) & (ts < b[np.clip(i, 0, len(b) - 1)])
    rt = np.isin(cats, ["cuda_runtime", "cuda_driver"])
    launch = rt & inside & name_mask(cpu["name"], lambda s: s.isin(LAUNCH_CALLS)).to_numpy()
    return {"ts": ts, "inside": inside, "rt": rt, "op": cats == "cpu_op", "n": max(1, len(a)),
            "full": full, "short": 0 if full else int(getattr(view.trace.info, "short_ops", 0) or 0),
            "launch_us": float(np.median(cpu["dur"].to_numpy(float)[launch])) if launch.any() else None}


def _price(ev: dict, c_op: float, c_rt: float) -> "np.ndarray":
    """Each of :func:`_events`' events at its cost to the host under the profiler (0 outside the steps): ``c_op`` an
    op, ``c_rt`` a runtime call; the short ops the frame left out go with the runtime calls (ops and the calls they
    make go together)."""
    import numpy as np

    rt, short = ev["rt"], ev["short"]
    per_rt = c_rt + (c_op * short / float(rt.sum()) if short and rt.any() else 0.0)
    return np.where(rt, per_rt, np.where(ev["op"], c_op, 0.0)) * ev["inside"]


def _counts(ev: dict) -> tuple[float, float, str]:
    """Recorded ops and runtime/driver calls per step, inside the steps' annotations (the host's side of each
    step; the windows where there are none: :func:`_events`), and how the ops were counted: every op where the frame
    holds every op; else the ops it kept plus the short ops the trace layer counted and left out, of which the steps
    hold the share of the trace's runtime calls that fall inside them (ops and the calls they make go together)."""
    inside, is_rt, n = ev["inside"], ev["rt"], ev["n"]
    runtime = float(is_rt[inside].sum()) / n
    ops = float(ev["op"][inside].sum()) / n
    if ev["full"]:
        return ops, runtime, "every recorded op counted"
    short = ev["short"]
    share = float(is_rt[inside].sum()) / float(is_rt.sum()) if is_rt.any() else 1.0
    return (ops + short * share / n, runtime,
            f"the ops the frame kept plus the {short} short ops the trace layer counted, {100 * share:.0f}% of them "
            f"in the steps (their share of the runtime calls)")


def _settings(view: "RankView", capture: dict | None) -> tuple[bool, bool, str]:
    """record_shapes, with_stack, and where they were read."""
    from .host_model import name_mask

    if capture and "record_shapes" in capture:
        return bool(capture.get("record_shapes")), bool(capture.get("with_stack")), "the kitCapture header"
    cpu = view.memo.get("cpu_all")
    cpu = cpu if cpu is not None else view.trace.cpu
    shapes = bool("input_dims" in cpu and cpu["input_dims"].notna().any())
    # the default frame keeps no Python frame: the trace layer counts them (TraceInfo.python_frames)
    stack = bool(getattr(view.trace.info, "python_frames", 0)) or bool(
        name_mask(cpu["cat"], lambda c: c == "python_function").any())
    return shapes, stack, "the trace (record_shapes from Input Dims on its kept ops, with_stack from Python frames)"


def _frames_per_op(view: "RankView") -> float:
    """The rank's recorded Python frames per recorded op, over its file (:class:`kit.traces.TraceInfo`'s counts): the
    frames among the ops -- those of a thread's stretch of Python without an op (a loop timed to a deadline, whose
    frames cost nothing) left out -- over every ``aten::`` op, kept or counted."""
    info = view.trace.info
    cpu = view.memo.get("cpu_all")
    full = cpu is not None and not cpu.empty
    ops = int((cpu if full else view.trace.cpu)["cat"].astype(str).eq("cpu_op").sum()) + (
        0 if full else int(getattr(info, "short_ops", 0) or 0))
    frames = int(getattr(info, "python_frames", 0) or 0) - int(getattr(info, "python_frames_off_ops", 0) or 0)
    return max(0, frames) / ops if ops else 0.0


TIMED_CLOCK_READS = 2
"""a stretch of Python off the ops that reads the clock more than this many times polls it: a loop that runs to a
deadline (``while perf_counter() - t < x: ...``), which the tracer does not lengthen -- it records fewer rounds
(a start and an end reading only time the stretch)"""


def _off_ops(view: "RankView", per_step: "pd.DataFrame") -> dict:
    """The rank's stretches of Python frames off its ops (:attr:`kit.traces.TraceInfo.python_off_ops_stretches`), each
    counted by its share inside the host's side of its steps (:func:`_windows`; its frames spread evenly over it, so
    one that begins in the profiler's ``step()`` call just before a step's annotation is that step's): per stretch
    kept, ``ts`` (its start, clipped to the first window it overlaps), ``x0``/``x1`` (its first and last frame's
    start), ``tid``, ``all`` (the frames the tracer lengthens) and ``frames`` (those times its share inside the
    windows). The frames the tracer lengthens are all of a stretch's but, where it reads the clock more than
    :data:`TIMED_CLOCK_READS` times, those from its first clock read to its last: a loop that runs to a deadline runs as
    long whatever it records. ``timed``, ``timed_frames``: how many stretches held such a loop, and its frames. A
    limit of the rule: a pure-Python loop that reads the clock per item (progress, rate limiting) is left unpriced (the
    safe side: its cost stays the user's), and a deadline loop that polls something else (``datetime``, an event's
    ``wait(timeout)``) is priced."""
    import numpy as np

    st = np.asarray(getattr(view.trace.info, "python_off_ops_stretches", ()) or (), dtype=float).reshape(-1, 6)
    a, b = _windows(view, per_step)
    x0, x1 = st[:, 0], st[:, 1]
    share, start = np.zeros(len(st)), x0.copy()
    for k in range(len(st)):
        j = np.flatnonzero((b > x0[k]) & (a <= x1[k]))
        share[k] = _share(x0[k], x1[k], a, b)
        if len(j):
            start[k] = max(x0[k], float(a[j[0]]))
    timed = (share > 0) & (st[:, 4] > TIMED_CLOCK_READS)
    every = st[:, 3] - np.where(timed, st[:, 5], 0.0)
    frames = every * share
    keep = frames > 0
    return {"ts": start[keep], "x0": x0[keep], "x1": x1[keep], "tid": st[keep, 2], "all": every[keep],
            "frames": frames[keep], "timed": int(timed.sum()),
            "timed_frames": int(round(float((st[:, 5] * share)[timed].sum())))}


def _share(x0: float, x1: float, a, b) -> float:
    """The share of a stretch from ``x0`` to ``x1`` (its frames spread evenly over it) inside the spans ``a``-``b``
    (sorted, disjoint); a stretch of one instant: 1 inside one, else 0."""
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x1 > x0:
        return min(1.0, float(np.clip(np.minimum(x1, b) - np.maximum(x0, a), 0.0, None).sum()) / (x1 - x0))
    return float(bool(((a <= x0) & (x0 < b)).any()))


def _tracer_steps(view: "RankView", off: dict | None, c_frame: float) -> tuple[tuple, tuple]:
    """The tracer's price of the rank's Python off its ops on its main thread (the one whose time
    :data:`kit.doctor.own_time.OWN_HOST` counts as the rank's own, :attr:`kit.doctor.host_model.HostModel.main_tid`),
    per step: ``((step, us), ...)`` by the step's annotation (the host model's windows without any), and the part of
    it inside the main thread's DataLoader waits. ``((), ())`` without stretches."""
    import numpy as np

    if off is None or not len(off["ts"]) or view.host is None:
        return (), ()
    main = view.host.main_tid
    mine = np.array([main is not None and t == t and float(t) == float(main) for t in off["tid"]], dtype=bool) \
        if _numeric_tid(main) else np.zeros(len(off["tid"]), bool)
    if not mine.any():
        return (), ()
    st = view.steps
    if st is not None and not st.empty and "step" in st:
        wins = [(int(r.step), float(r.ts), float(r.end)) for r in st.itertuples()]
    else:
        ps = view.host.per_step
        wins = [(int(r.step), float(r.ts), float(r.end)) for r in ps.itertuples()]
    da, db = view.host.spans("data_wait", main)
    steps, waits = [], []
    for n, wa, wb in wins:
        us = wait = 0.0
        for x0, x1, f in zip(off["x0"][mine], off["x1"][mine], off["all"][mine]):
            part = _share(x0, x1, [wa], [wb])
            if part <= 0:
                continue
            us += f * part * c_frame
            lo, hi = max(x0, wa), min(x1, wb)
            inside = _share(lo, hi, da, db) if hi >= lo else 0.0
            wait += f * part * inside * c_frame
        steps.append((n, round(float(us), 1)))
        waits.append((n, round(float(wait), 1)))
    return tuple(steps), tuple(waits)


TRACER_TAKEN = 0.5
"""the share of the tracer's price of a rank's Python frames off its ops (:attr:`ProfilerOverhead.off_ops_us`,
:data:`kit.doctor.own_time.TRACER`) taken off a cost that holds them: the low end of the price's range
(:data:`ESTIMATE_RANGE`), as the price per frame off the ops differs between workloads by about that much
(FINDINGS.md, "The price of a trace recorded with stacks"): a price too high would take a real fault's time away with
the tracer's. Every reading that takes the frames' price off a cost takes it through :func:`tracer_taken`."""


def tracer_taken(price, whole: bool = False):
    """The tracer's price of Python frames off the ops taken off a cost that holds it (``price``: a number or a
    column, us): :data:`TRACER_TAKEN` of it, the low end, so the subtraction cannot eat a fault (own time,
    :mod:`kit.doctor.own_time`; the DataLoader waits' part, :attr:`ProfilerOverhead.data_wait_us`; a late rank's
    excess, ``late_rank.tracer_excess``); ``whole``: all of it, the other end of the range a cost read with it is
    said in where the low end's cost is one the point estimate contradicts (:func:`within_point`)."""
    return price if whole else TRACER_TAKEN * price


def within_point(cost_us: float, other_us: float, point_us: float | None) -> float:
    """A cost read at one end of a price's range (``cost_us``: the end that cannot eat a fault -- the tracer's price
    at its low end, :func:`tracer_taken`, or an estimated overhead's point value) where ``other_us`` is the same cost
    at the range's other end: the largest cost between the two that the point estimate of the step does not
    contradict (``point_us``: :attr:`ProfilerOverhead.point_cap_us`). The read cost where it is within that bound (or
    no bound is known); never below ``other_us``, as the point estimate is no better a bound than the range it sits
    in. Where the answer is the bound itself it is a maximum, not an estimate: the caller says it as one ("at most"),
    with the range."""
    if point_us is None or cost_us <= point_us:
        return cost_us
    return min(cost_us, max(other_us, point_us))


def _numeric_tid(t) -> bool:
    try:
        float(t)
        return True
    except (TypeError, ValueError):
        return False


def _lower_bound(stack: bool, row: dict | None) -> str:
    """The how's clause for a with_stack trace priced by a row without stacks (:func:`pick_scaled`); '' else."""
    if not stack or row is None or row.get("with_stack"):
        return ""
    return ("; the trace was recorded with_stack, which no fitted row covers for its other settings: priced as "
            "without stacks, so likely low (Python frames cost 0.5-4 us more per op: "
            "recorded/h200x2/profiler_overhead/settings)")


def overhead(view_or_trace: Any, capture: dict | None = None, *, cpu_all: "pd.DataFrame | None" = None,
             root: str | Path = TABLES) -> ProfilerOverhead:
    """One rank's :class:`ProfilerOverhead` (module docstring). ``view_or_trace``: a :class:`RankView` with its host
    model, a :class:`kit.traces.Trace` or a path; ``capture``: the kitCapture facts (default: the trace's own,
    :func:`kit.capture.capture_info`); ``cpu_all``: every CPU event of a CPU-only trace, where the caller read it.
    Where the rank's account charges GPU idle of at least the 'low' share of its step to its DataLoader waits, the part
    of the overhead recorded inside them (:attr:`ProfilerOverhead.data_wait_us`: the ops' part by their share inside
    the waits, the frames off the ops by where they lie, :attr:`ProfilerOverhead.off_ops_in_wait_steps`; a GPU trace
    is read again with every CPU event for it)."""
    from dataclasses import replace

    view = _view(view_or_trace)
    o = _overhead(view, capture, cpu_all, root)
    acct = getattr(view, "account", None)
    step = getattr(acct, "step_us", None) or getattr(acct, "window_us", None)
    # below 'low' an input finding is information whatever its share: not worth reading the trace again for
    if o.basis == "none" or acct is None or not hasattr(acct, "cost") or not step or \
            acct.cost("input") < SEVERITY_SHARE["low"] * step:
        return o
    ps = _per_step(view)
    share = data_wait_share(view, ps)
    base = float((o.host_us if o.basis == "estimated" else o.overhead_us) or 0.0)
    # the ops' part spread over the recorded ops; the frames off the ops where they lie (the main thread's waits)
    off = min(base, float(o.off_ops_us or 0.0))
    in_wait = dict(o.off_ops_in_wait_steps)
    waits = [in_wait.get(int(n), 0.0) for n in ps["step"]] if in_wait and "step" in ps else []
    off_in_wait = min(off, statistics.mean(waits)) if waits else 0.0
    return replace(o, data_wait_us=min(base, share * (base - off) + tracer_taken(off_in_wait)),
                   data_wait_tracer_us=off_in_wait)


def _priced(view: "RankView", ps: "pd.DataFrame", capture: dict | None, root: str | Path) -> dict | None:
    """The recorded ops' price per step on this rank, derived once for :func:`overhead` (its ``host_us``):
    the table :func:`pick` takes for the trace's device and profiler settings, the ops and runtime calls per step
    (:func:`_counts`) at its costs (a least-squares split of a noisy measurement can come out below zero: no event
    makes the host faster, so they are floored at 0), plus the profiler's own events shown (:func:`_shown_us`).
    None without a table."""
    gpu = not view.trace.gpu.empty
    props = view.trace.header.get("deviceProperties") if isinstance(view.trace.header, dict) else None
    device = props[0].get("name") if isinstance(props, list) and props and isinstance(props[0], dict) else None
    shapes, stack, where = _settings(view, capture)
    ev = _events(view, ps)
    table, row = (pick_scaled(gpu, shapes, stack, str(root), (view.trace.info.world_size or 1) > 1)
                  if ev["launch_us"] else (None, None))
    frames, off, c_frame = None, None, 0.0
    if row is not None:  # the host's own speed, read in the trace, x the price per unit of it
        per_frame = float(row.get("us_per_frame_per_launch_us") or 0.0)
        frames = _frames_per_op(view) if per_frame else None
        c_op = max(0.0, (float(row["us_per_op_per_launch_us"]) + per_frame * (frames or 0.0)) * ev["launch_us"])
        c_rt = 0.0
        per_off = float(row.get("us_per_off_frame_per_launch_us") or 0.0)
        if per_off:  # a frame off the ops: its own price (a builtin call of a pure-Python loop, not a module's frame)
            off, c_frame = _off_ops(view, ps), max(0.0, per_off * ev["launch_us"])
    else:
        table, row = pick(device, gpu, shapes, stack, (view.trace.info.world_size or 1) > 1, str(root))
        if table is None or row is None:
            return None
        c_op, c_rt = max(0.0, float(row["us_per_op"])), max(0.0, float(row["us_per_runtime"]))
    ops, runtime, basis_ops = _counts(ev)
    shown = _shown_us(ps)
    off_us = c_frame * float(off["frames"].sum()) / ev["n"] if off is not None else 0.0
    return {"gpu": gpu, "device": device, "where": where, "stack": stack, "frames": frames, "table": table, "row": row,
            "ops": ops,
            "runtime": runtime, "basis_ops": basis_ops, "c_op": c_op, "c_rt": c_rt, "shown": shown,
            "off": off, "c_frame": c_frame, "off_us": off_us,
            "host_us": ops * c_op + runtime * c_rt + shown + off_us, "events": ev}


def _off_text(p: dict) -> str:
    """The how's clause for the Python frames off the ops (:func:`_off_ops`); '' where none was priced or left out."""
    off = p.get("off")
    if off is None or (not len(off["ts"]) and not off["timed"]):
        return ""
    n = p["events"]["n"]
    said = (f" + {p['off_us']:.0f} us for {float(off['frames'].sum()) / n:.0f} Python frames per step off the ops "
            f"({len(off['ts'])} stretches of pure Python on a thread that records ops, at {p['c_frame']:.2f} us a "
            f"frame: the row's {float(p['row']['us_per_off_frame_per_launch_us']):.4f} x the launch reading)"
            if len(off["ts"]) else "")
    return said + (f" (not counted: {off['timed']} stretches of {off['timed_frames'] / n:.0f} frames per step that "
                   f"read the clock as they go, a loop that runs to a deadline, which the tracer does not lengthen)"
                   if off["timed"] else "")


def _factor(row: dict, frames: float | None) -> str:
    """A scaled row's factor as the sentence says it: one number, or with its term per Python frame."""
    a = float(row["us_per_op_per_launch_us"])
    if frames is None:
        return f"{a:.3f}"
    b = float(row["us_per_frame_per_launch_us"])
    return (f"({a:.3f} + {b:.3f} x {frames:.2f} Python frames per op among the ops, as the trace counts them "
            f"= {a + b * frames:.3f})")


FEW_JOBS = 3
"""a family of jobs (FSDP) whose windows among a row's fitted ones come from fewer jobs than this is said in the
estimate's ``how`` (:func:`_few_jobs`)"""


def _fitted_on(table: dict, row: dict, distributed: bool) -> str:
    """The jobs a scaled row was fitted on, read from its table's ``points`` of the row's settings: how many, on which
    GPUs, how many multi-process; for a multi-process trace priced from one-GPU jobs alone, that it is likely low."""
    pts = _fitted_points(table, row)
    multi = sum(q.get("world_size", 1) > 1 for q in pts)
    gpus = " and ".join(sorted({str(q.get("gpu")) for q in pts})) or "unnamed"
    return (f"{len(pts)} jobs of {gpus} hosts ({multi} multi-process)"
            + ("; one-GPU jobs only, so likely low for this multi-process trace" if distributed and pts and not multi
               else ""))


def _fitted_points(table: dict, row: dict) -> list[dict]:
    """A scaled row's fitted ``points`` in its table (the row's settings)."""
    return [q for q in table.get("points") or [] if q.get("fitted", True)
            and q.get("record_shapes") == row["record_shapes"] and q.get("with_stack") == row["with_stack"]
            and ("distributed" not in row or (q.get("world_size", 1) > 1) == bool(row["distributed"]))]


def _few_jobs(table: dict, row: dict, view: "RankView") -> str:
    """The how's clause for an FSDP trace priced by a with_stack row whose fitted FSDP windows come from fewer than
    :data:`FEW_JOBS` jobs (its term per frame then rests on those jobs alone; other FSDP jobs check it held out:
    FINDINGS.md); '' elsewhere."""
    if not row.get("with_stack") or not _fsdp(view):
        return ""
    jobs = {str(q.get("case", "")).rsplit("/", 1)[0] for q in _fitted_points(table, row)
            if "fsdp" in str(q.get("case", ""))}
    if len(jobs) >= FEW_JOBS:
        return ""
    return (f"; its FSDP windows from {len(jobs) or 'no'} FSDP job{'' if len(jobs) == 1 else 's'} (held out on "
            f"others: FINDINGS.md, \"The price of a trace recorded with stacks\")")


def _fsdp(view: "RankView") -> bool:
    """Whether the rank's trace records FSDP2's regions (``FSDP::``)."""
    cpu = view.trace.cpu
    return cpu is not None and not cpu.empty and bool(cpu["name"].str.startswith("FSDP::").any())


def _shown_us(per_step: "pd.DataFrame") -> float:
    """The profiler's own host time per step that the trace shows (the host model's ``profiler`` kind on the main
    thread: CUPTI's buffer requests and flushes where the host would otherwise stall or idle), mean over the
    steps."""
    return float(per_step["profiler_us"].mean()) if "profiler_us" in per_step and len(per_step) else 0.0


def data_wait_share(view: "RankView", per_step: "pd.DataFrame") -> float:
    """The share of the recorded ``aten::`` ops of the steps (as :func:`_events` places them) that lie inside the
    host model's DataLoader waits: a loader running in the main process records every sample's indexing, the collate
    and the pinning there (hundreds of ops per batch). Reads every CPU event (the trace again with ``cpu="all"``
    where the caller did not)."""
    import numpy as np

    from .host_model import ALL

    if view.memo.get("cpu_all") is None:
        if view.trace.path is None:
            return 0.0
        from .. import traces

        view.memo["cpu_all"] = traces.load_trace(view.trace.path, cpu="all").cpu
    cpu = view.memo["cpu_all"]
    if cpu is None or cpu.empty:
        return 0.0
    ev = _events(view, per_step)
    ts, inside = ev["ts"], ev["op"] & ev["inside"]
    da, db = view.host.spans("data_wait", ALL)
    if not inside.any() or not len(da):
        return 0.0
    j = np.searchsorted(da, ts, side="right") - 1
    in_data = inside & (j >= 0) & (ts < db[np.clip(j, 0, len(db) - 1)])
    return float(in_data.sum()) / float(inside.sum())


def _windows(view: "RankView", per_step: "pd.DataFrame") -> "tuple[np.ndarray, np.ndarray]":
    """The host's side of the steps: their annotations, else the windows (:func:`_counts`)."""
    st = view.steps
    if st is not None and not st.empty and (per_step["step"] >= 0).any():
        st = st.sort_values("ts")
        return st["ts"].to_numpy(float), st["end"].to_numpy(float)
    return per_step["ts"].to_numpy(float), per_step["end"].to_numpy(float)


def _overhead(view: "RankView", capture: dict | None, cpu_all, root) -> ProfilerOverhead:
    if cpu_all is not None and view.memo.get("cpu_all") is None:
        view.memo["cpu_all"] = cpu_all
    if capture is None:
        from ..capture import capture_info

        capture = capture_info(view.trace)
    ps = _per_step(view)
    if ps is None:
        return ProfilerOverhead(None, None, 0.0, "none", "no step windows with GPU or host work: nothing to compare")
    traced = float(ps["dur"].median())
    samples = [float(s) for s in (capture or {}).get("unprofiled_step_us") or [] if s is not None]
    p = _priced(view, ps, capture, root)
    why = unmeasurable(samples, traced, p["host_us"]) if samples and p is not None else None
    tracer = _tracer_steps(view, p["off"], p["c_frame"]) if p is not None else ((), ())
    if samples and why is None:
        unprof = statistics.median(samples)
        q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else [unprof, unprof]
        off_us = 0.0 if p is None else p["off_us"]
        return ProfilerOverhead(traced, unprof, max(0.0, traced - unprof), "measured",
                                f"median of {len(samples)} steps kit.capture timed without the profiler just before "
                                f"the window ({capture.get('unprofiled_clock', 'clock not stated')}; p10-p90 "
                                f"{q[0]:.0f}-{q[-1]:.0f} us) against the median traced step ({len(ps)} steps)",
                                host_us=None if p is None else p["host_us"], launch_us=_launch(p),
                                off_ops_us=off_us, off_ops_exposed_us=min(off_us, max(0.0, traced - unprof)),
                                off_ops_steps=tracer[0], off_ops_in_wait_steps=tracer[1])
    gpu = not view.trace.gpu.empty
    if p is None:
        return ProfilerOverhead(traced, None, 0.0, "none", f"no per-event cost table for a {'GPU' if gpu else 'CPU'}"
                                f" trace under {Path(root).name}/: run benchmarks/bench_profiler_overhead.py")
    device, where, table, row = p["device"], p["where"], p["table"], p["row"]
    ops, runtime, basis_ops, c_op, c_rt, shown, host_us = (p[k] for k in ("ops", "runtime", "basis_ops", "c_op",
                                                                          "c_rt", "shown", "host_us"))
    exposed, segments = _exposed(view, ps, p["events"], c_op, c_rt, p["off"], p["c_frame"]) if gpu else (host_us, 0)
    exposed = min(exposed, host_us)
    off_exposed = 0.0
    if p["off_us"] > 0:  # what pricing the frames off the ops added to the time that lengthened the step
        without = min(_exposed(view, ps, p["events"], c_op, c_rt)[0], host_us - p["off_us"]) if gpu else \
            host_us - p["off_us"]
        off_exposed = min(p["off_us"], max(0.0, exposed - without))
    # the GPU's own work bounds the step from below; not its collectives' kernels, which spin while they wait
    # for a peer (a waiting rank's GPU is "busy" for most of the step)
    busy = float(ps["gpu_compute_us"].median()) if gpu and "gpu_compute_us" in ps else 0.0
    unprof = min(traced, max(traced - exposed, busy))
    scaled = table.get("kind") == "jobs-launch"
    source = (f"fitted on {row.get('cases', '?')} multi-process jobs whose overhead was measured (traced minus "
              f"unprofiled step, against the time their recorded ops lengthen the step; runtime calls folded into the "
              f"per-op cost)" if table.get("kind") == "jobs"
              else "measured by benchmarks/bench_profiler_overhead.py's isolated-op loops")
    how = (f"estimated: {ops:.0f} ops and {runtime:.0f} runtime calls per step ({basis_ops}) x "
           + (f"{c_op:.2f} us per op, runtime calls folded in: {_factor(row, p['frames'])} x this "
              f"rank's median kernel launch in its steps, {p['events']['launch_us']:.2f} us (the host's speed under "
              f"the profiler, read in the trace; the factor fitted by tests/corpus/overhead_eval.py on "
              f"{_fitted_on(table, row, (view.trace.info.world_size or 1) > 1)} whose overhead was measured: "
              f"{table['file']}, "
              f"record_shapes={row['record_shapes']}, with_stack={row['with_stack']}; settings read from {where}; "
              f"within about {ESTIMATE_RANGE:g}x either way{_few_jobs(table, row, view)})" if scaled else
              f"{c_op:.2f} / {c_rt:.2f} us each, {source} on {table['machine'].get('device')} ({table['file']}, "
              f"record_shapes={row['record_shapes']}, with_stack={row['with_stack']}; settings read from {where})")
           + (f" + {shown:.0f} us of the profiler's own buffer requests and flushes shown in the trace" if shown >= 0.5
              else "") + _off_text(p) + f" = {host_us:.0f} us of host time per step"
           + (f", {exposed:.0f} us of it where the GPU waited for the host (the rest ran while the GPU worked: "
              f"{segments} stretches between the host's waits for the GPU)" if gpu and exposed < host_us - 0.5 else "")
           + (f" (another host's table: this trace's GPU is {device or 'not named'}; the per-op cost differs between "
              f"hosts and jobs, about {ESTIMATE_RANGE:g}x either way)" if gpu and not scaled
              and table["machine"].get("device") != device else "")
           + (_lower_bound(p["stack"], row) if scaled else "")
           + (f"; the step cannot be shorter than the GPU's own work (outside collectives), {busy:.0f} us" if unprof == busy and gpu else "")
           + (f"; {why}" if why else ""))
    return ProfilerOverhead(traced, unprof, traced - unprof, "estimated", how, host_us=host_us, exposed_us=exposed,
                            launch_us=_launch(p), note=why, off_ops_us=p["off_us"], off_ops_exposed_us=off_exposed,
                            off_ops_steps=tracer[0], off_ops_in_wait_steps=tracer[1])


def median_error(samples: list[float]) -> float:
    """The standard error of the median of ``samples``: 1.2533 sigma / sqrt(n) (the median's large-sample variance,
    pi/2 that of the mean, for a normal spread), sigma read robustly as 1.4826 x the median absolute deviation --
    kit.capture's few unprofiled steps can hold a step-long outlier (a garbage collection after the trace) that a
    standard deviation would take for the spread. 0 for fewer than two samples (no spread to read)."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    mad = statistics.median(abs(x - med) for x in samples)
    return 1.2533 * 1.4826 * mad / len(samples) ** 0.5


def unmeasurable(samples: list[float], traced_us: float, host_us: float) -> str | None:
    """Why kit.capture's unprofiled steps (``samples``) cannot measure the profiler's overhead on a rank whose median
    traced step is ``traced_us`` and whose recorded events price at ``host_us`` per step; None where they can. The
    measurement (traced less their median) is within :data:`MEDIAN_Z` standard errors of the median
    (:func:`median_error`) of the truth; it says nothing where that interval holds both answers it is there to tell
    apart -- no overhead (0) and the profiler's whole host time (``host_us``): the steps spread more than the overhead
    they would measure. Then the estimate (within :data:`ESTIMATE_RANGE` either way) is the better reading. A
    measurement that tells them apart stands, whatever the spread (a contended host's traced step far above its
    noisy unprofiled ones; a GPU-bound step equal to its steady unprofiled ones)."""
    err = MEDIAN_Z * median_error(samples)
    d = traced_us - statistics.median(samples)
    if not host_us or abs(d) >= err or abs(d - host_us) >= err:
        return None
    return (f"kit.capture's {len(samples)} unprofiled steps ({', '.join(f'{x / 1e3:.1f}' for x in samples)} ms) "
            f"spread too widely to measure the profiler's overhead: traced less their median is {d / 1e3:.2f} ms "
            f"+- {err / 1e3:.2f} ms ({MEDIAN_Z:g} standard errors of the median), which cannot tell no overhead from "
            f"the profiler's whole host time ({host_us / 1e3:.2f} ms per step as its recorded events price it); "
            f"estimated instead")


def _launch(p: dict | None) -> float | None:
    """The launch reading a price of :func:`_priced` scaled with (:attr:`ProfilerOverhead.launch_us`)."""
    return p["events"]["launch_us"] if p is not None and p["table"].get("kind") == "jobs-launch" else None


QUEUED_US = 5.0
"""a GPU activity that starts within this long after its stream's previous work ended was queued behind it (under
the profiler back-to-back kernels of one stream start 1-4 us apart: the multi-GPU corpus's CNN and GPT steps)"""
LAUNCH_GATED_US = 50.0
"""a GPU activity that starts within this long after its launch call returns, with its queue idle before it, was
waiting for the host to launch it (under the profiler a launch reaches an idle GPU in ~5-20 us); one that starts
later than that after an idle queue waited for something else (another stream's work, a collective, an event)"""


def _exposed(view: "RankView", per_step: "pd.DataFrame", ev: dict, c_op: float, c_rt: float, off: dict | None = None,
             c_frame: float = 0.0) -> tuple[float, int]:
    """The profiler's host time per step that lengthened the step, and the number of stretches it was judged in.
    The profiler slows the host, not the GPU: its time (the host's recorded events as :func:`_events` places them,
    each at its cost, :func:`_price`; ``off``: the stretches of Python off the ops, :func:`_off_ops`, at ``c_frame``
    a frame) shortens the step only where the GPU waited for the host. The host's waits for
    the GPU (:meth:`kit.doctor.host_model.HostModel.gpu_waits`: ``.item()``, synchronize, a blocking copy, a device
    free) cut the steps into stretches:

    * a stretch that ends in such a wait is replayed: its GPU work (kernels, copies, memsets, collectives) in
      order, per stream, with the profiler's time taken out of the host -- an activity that waited for its launch
      (:data:`LAUNCH_GATED_US`) starts earlier by the profiler's time before that launch, one queued behind its
      stream's work (:data:`QUEUED_US`) when that now ends, one that waited for another stream (an event, a
      collective) as much earlier as the work that ended just before it; the stretch ends when both the host
      (less its profiler time) and the GPU are done. The host cannot run ahead past the wait, so the profiler's
      time spent while the GPU still had work hides behind it (a per-parameter ``.item()`` loop exposes its time;
      a forward that queues ahead of its GPU does not);
    * the stretch that runs into the next step (no wait at its end: a whole step of a job that never waits for its
      GPU) saves the profiler's time in it up to the GPU's idle time there (any activity, a collective's kernel
      included: on the rank whose host sets the pace it is the transfer) -- without the profiler its host may run
      ahead of the GPU into the next step, which a replay of the traced steps alone cannot show.

    The step's saving is the sum over its stretches."""
    import bisect

    import numpy as np

    from ..traces.intervals import covered, union_np
    from .host_model import ALL

    a, b = _windows(view, per_step)
    n = ev["n"]
    ts, cost = ev["ts"], _price(ev, c_op, c_rt)
    # the profiler's own time the trace shows (the host model's ``profiler`` kind), at its start
    pa, pb = view.host.spans("profiler", ALL)
    k = np.searchsorted(a, pa, side="right") - 1
    ts, cost = np.r_[ts, pa], np.r_[cost, (pb - pa) * ((k >= 0) & (pa < b[np.clip(k, 0, len(b) - 1)]))]
    if off is not None and len(off["ts"]):  # the Python frames off the ops (_off_ops), at each stretch's start
        ts, cost = np.r_[ts, off["ts"]], np.r_[cost, off["frames"] * c_frame]
    o = np.argsort(ts, kind="stable")
    ets, cum = ts[o], np.r_[0.0, np.cumsum(cost[o])]

    def spent(t):  # the profiler's host time recorded before t
        return cum[np.searchsorted(ets, t, side="left")]

    g = view.issued()
    # the steps' GPU side: from where the work queued before the first step ends (the windows' start) to the end
    lo = float(per_step["ts"].min())
    hi = max(float(per_step["end"].max()), float(b.max()))
    g = g[(g["end"] > g["ts"]) & (g["end"] > lo)].sort_values("ts", kind="stable")
    w = view.host.gpu_waits(ALL)  # synchronising calls and device frees (a free waits for the whole device too)
    sa, sb = union_np(np.r_[w["sync"][0], w["allocator"][0]], np.r_[w["sync"][1], w["allocator"][1]])
    keep = (sb > lo) & (sb < hi)
    sa, sb = sa[keep], sb[keep]
    cuts = np.unique(np.r_[lo, sb, hi])
    ends = set(sb.tolist())
    gs, ge = g["ts"].to_numpy(float), g["end"].to_numpy(float)
    call_end = g["call_end"].to_numpy(float) if "call_end" in g else np.full(len(g), np.nan)
    streams = g["stream"].to_numpy() if "stream" in g else np.zeros(len(g))
    seg = np.clip(np.searchsorted(cuts, gs, side="right") - 1, 0, len(cuts) - 2)

    def since(j: int) -> float:  # the profiler's time before stretch j (the first one's: from the host's step start)
        return spent(min(cuts[0], float(a.min())) if j == 0 else cuts[j])

    def replay(j: int) -> float:
        """Stretch ``j`` (ending in a wait for the GPU) replayed: when the host and the GPU are both done."""
        x, y = cuts[j], cuts[j + 1]
        base = since(j)
        host_end = sa[np.searchsorted(sb, y, side="left")]  # where the host began waiting
        new_end = host_end - (spent(host_end) - base)
        traced_end = host_end
        last: dict = {}  # stream -> (traced end, replayed end) of its latest work
        done: list = []  # (traced end, how much earlier it now ends) of every replayed activity, by end
        for q in np.flatnonzero(seg == j):
            s0, e0, ce = gs[q], ge[q], call_end[q]
            pe, pn = last.get(streams[q], (x, x))
            pull = spent(ce) - base if ce == ce else 0.0
            if s0 <= pe + QUEUED_US:  # queued behind its stream's earlier work: as far after it, or its launch returns
                s1 = max(pn + (s0 - pe), ce - pull) if ce == ce else pn + (s0 - pe)
            elif ce == ce and s0 - ce <= LAUNCH_GATED_US:  # waited for its launch
                s1 = max(pn, s0 - pull)
            else:  # waited for another stream's work (an event, a collective): as much earlier as that now ends
                k = bisect.bisect_right(done, (s0 + 1.0, float("inf"))) - 1
                s1 = max(pn, s0 - (done[k][1] if k >= 0 else 0.0))
            e1 = s1 + (e0 - s0)
            last[streams[q]] = (max(pe, e0), max(pn, e1))
            bisect.insort(done, (e0, e0 - e1))
            new_end = max(new_end, e1)
            traced_end = max(traced_end, e0)
        # the wait's own time after the host and the GPU were done (a free's work, a sync's return) stays
        return new_end + max(0.0, y - traced_end)

    ba, bb = union_np(gs, ge)
    saving = 0.0
    for j in range(len(cuts) - 1):
        x, y = cuts[j], cuts[j + 1]
        if y in ends:  # ends where the host waits for the GPU: it cannot run ahead of that wait
            saving += max(0.0, y - replay(j))
        else:  # runs into the next step: the host may run ahead of its GPU, up to the GPU's idle time here
            idle = (y - x) - float(covered(ba, bb, np.array([x]), np.array([y]))[0])
            saving += min(spent(y) - since(j), max(0.0, idle))
    return float(saving) / n, len(cuts) - 1


def own_work(host_steps: dict, waits: dict) -> dict:
    """Per rank whose GPU worked (``host_steps``: rank -> the host model's per-step frame), the GPU work of its own per
    step, which no host makes shorter: its busy time less what its collectives' kernels spent waiting for peers
    (``waits``: rank -> us per step, :meth:`kit.doctor.context.JobContext.comm_waits`, or per step number,
    :meth:`~kit.doctor.context.JobContext.comm_waits_by_step`: each step's busy less its own waiting), at most its
    kernels other than NCCL's -- the transfer a collective adds to the traced busy time may overlap the backward
    without the profiler (FINDINGS.md); medians over the rank's step windows (all of its span without any)."""
    import numpy as np

    out = {}
    for r, ps in host_steps.items():
        if ps is None or ps.empty or not {"gpu_busy_us", "gpu_kernels_us"} <= set(ps.columns):
            continue
        ps = ps[ps["step"] >= 0] if (ps["step"] >= 0).any() else ps
        busy = float(ps["gpu_busy_us"].median())
        if busy > 0:
            w = waits.get(r, 0.0)
            if isinstance(w, dict):  # per step: each step's busy less its own waiting, the median of those
                per = ps["gpu_busy_us"].to_numpy(float) - ps["step"].map(lambda k: w.get(int(k), 0.0)).to_numpy(float)
                mine = float(np.median(per))
            else:
                mine = busy - float(w)
            # at least 0: the waits can exceed the median busy where the collectives' kernels straddle step windows
            out[r] = max(0.0, min(mine, float(ps["gpu_kernels_us"].median())))
    return out


def job_floor(overhead: dict, waits: dict, host_steps: dict) -> dict:
    """The overheads of one job's ranks, as the job pays them. The job is not faster than the GPU with the most work
    of its own (:func:`own_work`: ``waits`` and ``host_steps``, rank -> the host model's per-step frame). A measured
    overhead stays as measured and, in a job of several ranks, keeps that work (:attr:`ProfilerOverhead.own_work_us`),
    which bounds what the job's issuing can cost net of the profiler (:meth:`ProfilerOverhead.net`); an estimated one
    keeps its own rank's work, which bounds that rank's GPU idle at the estimated unprofiled step. An estimated
    overhead is paid as the job paces it: its ranks step together, at the pace of the host that loses most to the
    profiler -- a rank that waits for a peer does not see its own profiler time (:attr:`ProfilerOverhead.exposed_us`
    near zero: its GPU waited for the peer, not for its host) but waits for the peer's, so every rank's step is
    shortened by the largest exposed overhead of the job -- to no less than that work (FINDINGS.md, "The job floor caps a
    measured launch gain only": an estimate is capped by its rank's own work instead,
    :attr:`ProfilerOverhead.gain_cap_us`). Ranks without the numbers are returned as they are."""
    from dataclasses import replace

    own = own_work(host_steps, waits)
    top = max(own, key=own.get) if own else None
    floor = own[top] if own else 0.0
    if own and len(overhead) > 1:
        # measured: the job's gain is at most its unprofiled step less the busiest GPU's work; estimated (within
        # ESTIMATE_RANGE either way), the rank's own bound only: its GPU idles at most that step less its own work
        overhead = {r: replace(o, own_work_us=floor) if o is not None and o.basis == "measured" else
                    replace(o, own_work_us=own[r]) if o is not None and o.basis == "estimated" and r in own else o
                    for r, o in overhead.items()}
    est = {r: o for r, o in overhead.items() if o is not None and o.basis == "estimated"
           and o.traced_step_us is not None and o.host_us is not None}
    if not est:
        return overhead
    lost = {r: o.exposed_us if o.exposed_us is not None else o.host_us for r, o in est.items()}
    pace = max(lost, key=lost.get)
    out = dict(overhead)
    for r, o in est.items():
        unprof = min(o.traced_step_us, max(o.traced_step_us - lost[pace], floor))
        if unprof != o.unprofiled_step_us:
            why = []
            if pace != r and lost[pace] > lost[r] + 0.5 and o.traced_step_us - lost[pace] >= floor:
                why.append(f"the job steps at the pace of the host that loses most to the profiler (rank {pace}: "
                           f"{lost[pace]:.0f} us per step, which the other ranks wait for)")
            if own and unprof == floor and floor > o.traced_step_us - lost[pace]:
                why.append(f"the job's step cannot be shorter than the GPU with the most work of its own (rank {top}: "
                           f"{floor:.0f} us busy per step, not counting its collectives' waiting for peers)")
            out[r] = replace(o, unprofiled_step_us=unprof, overhead_us=o.traced_step_us - unprof,
                             how=o.how + "".join(f"; {w}" for w in why))
    return out
