"""The profiler's own overhead in a traced step: what the step costs without the profiler, measured where the
trace carries it, else estimated -- so that a finding's cost is the user's problem, not the profiler's.

Recording every op costs the host time (an event per op and per CUDA runtime call, more with ``record_shapes`` and
``with_stack``); a job whose host was nearly as fast as its GPU becomes host-bound under the profiler, and the
host's share of every traced step grows. :func:`overhead` gives one rank's :class:`ProfilerOverhead`:

* **measured**: the trace's ``kitCapture`` header (or its sidecar) holds ``unprofiled_step_us`` -- every sample
  of the steps :mod:`kit.capture` timed without the profiler just before the recorded window; the unprofiled
  step is their median, the overhead is the traced step (median of the rank's step windows, the host model's
  ``dur``) minus it.
* **estimated**: recorded host events per step (CUDA runtime/driver calls; ``aten::`` ops -- every op where the
  frame holds every op, else the ops it kept plus the short ones the trace layer counted) x the per-event cost that
  ``benchmarks/bench_profiler_overhead.py`` measured for the profiler settings the trace shows
  (``recorded/profiler_overhead/*.json``: the table of the same GPU model where there is one, else any GPU's, else
  the CPU table; which one is stated, and when it is another host's). The per-op cost is a property of the host and
  of the job together (the same job paid per op 2-3x more on one of the kit's GPU hosts than on the other, and two
  jobs of one host 3x apart: FINDINGS.md): an estimate is within about 2x either way. The profiler's time is host time: a step cannot get shorter than its GPU's
  own work, so the unprofiled estimate is ``max(traced - host overhead, GPU busy outside collectives)``.
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
    """estimated: the profiler's host time per step (recorded events x their cost)"""
    gpu_busy_us: float | None = None
    """estimated: the rank's GPU busy time per step (all activity, its collectives' kernels included)"""
    gpu_kernels_us: float | None = None
    """estimated: the rank's non-NCCL kernels' own time per step (beside NCCL kernels too): GPU work its step cannot
    do without, with or without the profiler"""
    data_wait_us: float | None = None
    """the part of the overhead recorded inside the DataLoader's waits (where they leave the GPU idle): the overhead
    spread evenly over the recorded ops of the steps, the share of the ops recorded inside the waits
    (:func:`data_wait_share`); a loader fed by worker processes records none of its work there"""

    @property
    def share(self) -> float | None:
        """The profiler's share of the traced step."""
        return self.overhead_us / self.traced_step_us if self.traced_step_us else None

    def net(self, cost_us: float) -> float:
        """A host-side cost net of the profiler's own host time (never below zero)."""
        return max(0.0, float(cost_us) - self.overhead_us)

    def as_dict(self) -> dict[str, Any]:
        return {"traced_step_us": _r(self.traced_step_us), "unprofiled_step_us": _r(self.unprofiled_step_us),
                "profiler_overhead_us": _r(self.overhead_us), "basis": self.basis, "how": self.how}


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


def pick_table(device_name: str | None, gpu: bool, root: str = str(TABLES)) -> dict | None:
    """The table for a trace: the same GPU model, else any GPU's (a GPU trace), else the CPU table."""
    ts = tables(root)
    same = [t for t in ts if gpu and device_name and t["machine"].get("device") == device_name]
    gpus = [t for t in ts if gpu and t["machine"].get("device") not in (None, "cpu")]
    cpus = [t for t in ts if not gpu and t["machine"].get("device") == "cpu"]
    for group in (same, gpus, cpus):
        if group:
            return group[-1]
    return None


def pick(device_name: str | None, gpu: bool, record_shapes: bool, with_stack: bool, distributed: bool = False,
         root: str = str(TABLES)) -> tuple[dict | None, dict | None]:
    """The table and row a trace is priced with: among the tables of the same GPU model (else any GPU's, else the
    CPU's), one fitted on real jobs (``"kind": "jobs"``: ``tests/corpus/overhead_fit.py``) with a row of the
    trace's exact settings and kind of job (``distributed``: a rank of a multi-process job) -- of the same GPU model
    only: real jobs' per-op cost differs between hosts -- else a loop table (``benchmarks/bench_profiler_overhead.py``)
    with its settings, else the group's last loop table's nearest row. A rank of a multi-process job pays more per
    recorded op than a one-GPU job of the same host (the measured costs: FINDINGS.md, "kit doctor's thresholds against
    the recorded runs")."""
    ts = tables(root)
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


def _counts(view: "RankView", per_step: "pd.DataFrame") -> tuple[float, float, str]:
    """Recorded ops and runtime/driver calls per step, inside the steps' annotations (the host's side of each
    step; the windows where there are none), and how the ops were counted: every op where the frame holds every
    op; else the ops it kept plus the short ops the trace layer counted and left out
    (:attr:`kit.traces.TraceInfo.short_ops`), of which the steps hold the share of the trace's runtime calls that
    fall inside them (ops and the calls they make go together)."""
    import numpy as np

    from .host_model import names_str

    cpu_all = view.memo.get("cpu_all")
    full = cpu_all is not None and not cpu_all.empty
    cpu = cpu_all if full else view.trace.cpu
    a, b = _windows(view, per_step)
    ts = cpu["ts"].to_numpy(float)
    i = np.searchsorted(a, ts, side="right") - 1
    inside = (i >= 0) & (ts < b[np.clip(i, 0, len(b) - 1)])
    cats = names_str(cpu["cat"]).to_numpy()
    n = max(1, len(a))
    is_rt = np.isin(cats, ["cuda_runtime", "cuda_driver"])
    runtime = float(is_rt[inside].sum()) / n
    ops = float((cats[inside] == "cpu_op").sum()) / n
    if full:
        return ops, runtime, "every recorded op counted"
    short = int(getattr(view.trace.info, "short_ops", 0) or 0)
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
    stack = bool(name_mask(cpu["cat"], lambda c: c == "python_function").any())
    return shapes, stack, "the trace (record_shapes from Input Dims on its kept ops, with_stack from Python frames)"


def overhead(view_or_trace: Any, capture: dict | None = None, *, cpu_all: "pd.DataFrame | None" = None,
             root: str | Path = TABLES) -> ProfilerOverhead:
    """One rank's :class:`ProfilerOverhead` (module docstring). ``view_or_trace``: a :class:`RankView` with its host
    model, a :class:`kit.traces.Trace` or a path; ``capture``: the kitCapture facts (default: the trace's own,
    :func:`kit.capture.capture_info`); ``cpu_all``: every CPU event of a CPU-only trace, where the caller read it.
    Where the rank's account charges GPU idle of at least the 'low' share of its step to its DataLoader waits, the part
    of the overhead recorded inside them (:attr:`ProfilerOverhead.data_wait_us`; a GPU trace is read again with every
    CPU event for it)."""
    from dataclasses import replace

    view = _view(view_or_trace)
    o = _overhead(view, capture, cpu_all, root)
    acct = getattr(view, "account", None)
    step = getattr(acct, "step_us", None) or getattr(acct, "window_us", None)
    # below 'low' an input finding is information whatever its share: not worth reading the trace again for
    if o.basis == "none" or acct is None or not hasattr(acct, "cost") or not step or \
            acct.cost("input") < SEVERITY_SHARE["low"] * step:
        return o
    share = data_wait_share(view, _per_step(view))
    return replace(o, data_wait_us=share * (o.host_us if o.host_us is not None else o.overhead_us))


def data_wait_share(view: "RankView", per_step: "pd.DataFrame") -> float:
    """The share of the recorded ``aten::`` ops of the steps (as :func:`_counts` places them) that lie inside the
    host model's DataLoader waits: a loader running in the main process records every sample's indexing, the collate
    and the pinning there (hundreds of ops per batch). Reads every CPU event (the trace again with ``cpu="all"``
    where the caller did not)."""
    import numpy as np

    from .host_model import ALL, names_str

    if view.memo.get("cpu_all") is None:
        if view.trace.path is None:
            return 0.0
        from .. import traces

        view.memo["cpu_all"] = traces.load_trace(view.trace.path, cpu="all").cpu
    cpu = view.memo["cpu_all"]
    if cpu is None or cpu.empty:
        return 0.0
    ops = cpu[(names_str(cpu["cat"]) == "cpu_op").to_numpy()]
    a, b = _windows(view, per_step)
    ts = ops["ts"].to_numpy(float)
    i = np.searchsorted(a, ts, side="right") - 1
    inside = (i >= 0) & (ts < b[np.clip(i, 0, len(b) - 1)])
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
    if samples:
        unprof = statistics.median(samples)
        q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else [unprof, unprof]
        return ProfilerOverhead(traced, unprof, max(0.0, traced - unprof), "measured",
                                f"median of {len(samples)} steps kit.capture timed without the profiler just before "
                                f"the window ({capture.get('unprofiled_clock', 'clock not stated')}; p10-p90 "
                                f"{q[0]:.0f}-{q[-1]:.0f} us) against the median traced step ({len(ps)} steps)")
    gpu = not view.trace.gpu.empty
    device = None
    props = view.trace.header.get("deviceProperties") if isinstance(view.trace.header, dict) else None
    if isinstance(props, list) and props and isinstance(props[0], dict):
        device = props[0].get("name")
    shapes, stack, where = _settings(view, capture)
    table, row = pick(device, gpu, shapes, stack, (view.trace.info.world_size or 1) > 1, str(root))
    if table is None:
        return ProfilerOverhead(traced, None, 0.0, "none", f"no per-event cost table for a {'GPU' if gpu else 'CPU'}"
                                f" trace under {Path(root).name}/: run benchmarks/bench_profiler_overhead.py")
    ops, runtime, basis_ops = _counts(view, ps)
    # a least-squares split of a noisy measurement can come out below zero: no event makes the host faster
    c_op, c_rt = max(0.0, float(row["us_per_op"])), max(0.0, float(row["us_per_runtime"]))
    host_us = ops * c_op + runtime * c_rt
    # the GPU's own work bounds the step from below; not its collectives' kernels, which spin while they wait
    # for a peer (a waiting rank's GPU is "busy" for most of the step)
    busy = float(ps["gpu_compute_us"].median()) if gpu and "gpu_compute_us" in ps else 0.0
    unprof = min(traced, max(traced - host_us, busy))
    source = (f"fitted on {row.get('cases', '?')} host-bound multi-process jobs whose overhead kit.capture measured "
              f"(traced minus unprofiled step; runtime calls folded into the per-op cost)" if table.get("kind") == "jobs"
              else "measured by benchmarks/bench_profiler_overhead.py's isolated-op loops")
    how = (f"estimated: {ops:.0f} ops and {runtime:.0f} runtime calls per step ({basis_ops}) x "
           f"{c_op:.2f} / {c_rt:.2f} us each, {source} on {table['machine'].get('device')} ({table['file']}, "
           f"record_shapes={row['record_shapes']}, with_stack={row['with_stack']}; settings read from {where}) = "
           f"{host_us:.0f} us of host time per step"
           + (f" (another host's table: this trace's GPU is {device or 'not named'}; the per-op cost differs between "
              f"hosts and jobs, about 2x either way)" if gpu and table["machine"].get("device") != device else "")
           + (f"; the step cannot be shorter than the GPU's own work (outside collectives), {busy:.0f} us" if unprof == busy and gpu else ""))
    return ProfilerOverhead(traced, unprof, traced - unprof, "estimated", how, host_us=host_us,
                            gpu_busy_us=float(ps["gpu_busy_us"].median()) if gpu and "gpu_busy_us" in ps else None,
                            gpu_kernels_us=float(ps["gpu_kernels_us"].median()) if gpu and "gpu_kernels_us" in ps
                            else None)


def job_floor(overhead: dict, waits: dict) -> dict:
    """The estimated overheads of one job's ranks, bounded by the job: no rank steps faster than the job, and the
    job not faster than the GPU with the most work of its own -- each rank's busy time less what its collectives'
    kernels spent waiting for peers (``waits``: rank -> us per step, :meth:`kit.doctor.context.JobContext.comm_waits`),
    at most its kernels other than NCCL's (:attr:`ProfilerOverhead.gpu_kernels_us`): the transfer a collective adds to
    the traced busy time may overlap the backward without the profiler (FINDINGS.md). Measured overheads and ranks
    without the numbers are returned as they are."""
    from dataclasses import replace

    own = {r: min(o.gpu_busy_us - float(waits.get(r, 0.0)),
                  o.gpu_kernels_us if o.gpu_kernels_us is not None else float("inf"))
           for r, o in overhead.items() if o.basis == "estimated" and o.gpu_busy_us is not None}
    if not own:
        return overhead
    top = max(own, key=own.get)
    floor = own[top]
    out = dict(overhead)
    for r, o in overhead.items():
        if r not in own or o.traced_step_us is None or o.host_us is None:
            continue
        unprof = min(o.traced_step_us, max(o.traced_step_us - o.host_us, floor, o.unprofiled_step_us or 0.0))
        if unprof != o.unprofiled_step_us:
            out[r] = replace(o, unprofiled_step_us=unprof, overhead_us=o.traced_step_us - unprof,
                             how=f"{o.how}; the job's step cannot be shorter than the GPU with the most work of its "
                                 f"own (rank {top}: {floor:.0f} us busy per step, not counting its collectives' "
                                 f"waiting for peers)")
    return out
