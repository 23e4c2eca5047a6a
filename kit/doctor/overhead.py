"""The profiler's own overhead in a traced step: what the step costs without the profiler, measured where the
trace carries it, else estimated -- so that a finding's cost is the user's problem, not the profiler's.

Recording every op costs the host time (an event per op and per CUDA runtime call, more with ``record_shapes`` and
``with_stack``); a job whose host was nearly as fast as its GPU becomes host-bound under the profiler, and the
host's share of every traced step grows. :func:`overhead` gives one rank's :class:`ProfilerOverhead`:

* **measured**: the trace's ``kitCapture`` header (or its sidecar) holds ``unprofiled_step_us`` -- every sample
  of the steps :mod:`kit.capture` timed without the profiler just before the recorded window; the unprofiled
  step is their median, the overhead is the traced step (median of the rank's step windows, the host model's
  ``dur``) minus it.
* **estimated**: recorded host events per step (CUDA runtime/driver calls; ``aten::`` ops where the frame holds
  every op, else one op per call that launched GPU work) x the per-event cost that
  ``benchmarks/bench_profiler_overhead.py`` measured for the profiler settings the trace shows
  (``recorded/profiler_overhead/*.json``: the table of the same GPU model where there is one, else any GPU's, else
  the CPU table; which one is stated). The profiler's time is host time: a step cannot get shorter than its GPU's
  busy time, so the unprofiled estimate is ``max(traced - host overhead, GPU busy)``.
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

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .model import RankView

TABLES = Path(__file__).resolve().parents[2] / "recorded" / "profiler_overhead"
"""the per-event costs ``benchmarks/bench_profiler_overhead.py`` recorded, one JSON per machine"""
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync",
                "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")
"""runtime/driver calls that launch GPU work: one ``aten::`` op each where the frame does not hold every op"""


@dataclass(frozen=True)
class ProfilerOverhead:
    """One rank's traced step against its step without the profiler (microseconds)."""

    traced_step_us: float | None
    unprofiled_step_us: float | None
    overhead_us: float
    basis: str
    """'measured', 'estimated' or 'none'"""
    how: str

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


def _counts(view: "RankView", per_step: "pd.DataFrame") -> tuple[float, float, bool]:
    """Recorded ops and runtime/driver calls per step inside the step windows; whether ops were counted (the
    frame holds every op) or taken as one per launching call."""
    import numpy as np

    cpu_all = view.memo.get("cpu_all")
    full = cpu_all is not None and not cpu_all.empty
    cpu = cpu_all if full else view.trace.cpu
    a, b = per_step["ts"].to_numpy(float), per_step["end"].to_numpy(float)
    ts = cpu["ts"].to_numpy(float)
    i = np.searchsorted(a, ts, side="right") - 1
    inside = (i >= 0) & (ts < b[np.clip(i, 0, len(b) - 1)])
    cats = cpu["cat"].astype(str).to_numpy()
    n = max(1, len(per_step))
    runtime = float(np.isin(cats[inside], ["cuda_runtime", "cuda_driver"]).sum()) / n
    if full:
        ops = float((cats[inside] == "cpu_op").sum()) / n
    else:
        names = cpu["name"].astype(str).to_numpy()[inside]
        ops = float(np.isin(names, LAUNCH_CALLS).sum()) / n
    return ops, runtime, full


def _settings(view: "RankView", capture: dict | None) -> tuple[bool, bool, str]:
    """record_shapes, with_stack, and where they were read."""
    if capture and "record_shapes" in capture:
        return bool(capture.get("record_shapes")), bool(capture.get("with_stack")), "the kitCapture header"
    cpu = view.memo.get("cpu_all")
    cpu = cpu if cpu is not None else view.trace.cpu
    shapes = bool("input_dims" in cpu and cpu["input_dims"].notna().any())
    stack = bool((cpu["cat"].astype(str) == "python_function").any())
    return shapes, stack, "the trace (record_shapes from Input Dims on its kept ops, with_stack from Python frames)"


def overhead(view_or_trace: Any, capture: dict | None = None, *, cpu_all: "pd.DataFrame | None" = None,
             root: str | Path = TABLES) -> ProfilerOverhead:
    """One rank's :class:`ProfilerOverhead` (module docstring). ``view_or_trace``: a :class:`RankView` with its host
    model, a :class:`kit.traces.Trace` or a path; ``capture``: the kitCapture facts (default: the trace's own,
    :func:`kit.capture.capture_info`); ``cpu_all``: every CPU event of a CPU-only trace, where the caller read it."""
    view = _view(view_or_trace)
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
    table = pick_table(device, gpu, str(root))
    if table is None:
        return ProfilerOverhead(traced, None, 0.0, "none", f"no per-event cost table for a {'GPU' if gpu else 'CPU'}"
                                f" trace under {Path(root).name}/: run benchmarks/bench_profiler_overhead.py")
    shapes, stack, where = _settings(view, capture)
    row = _row(table, gpu, shapes, stack)
    ops, runtime, full = _counts(view, ps)
    # a least-squares split of a noisy measurement can come out below zero: no event makes the host faster
    c_op, c_rt = max(0.0, float(row["us_per_op"])), max(0.0, float(row["us_per_runtime"]))
    host_us = ops * c_op + runtime * c_rt
    busy = float(ps["gpu_busy_us"].median()) if gpu and "gpu_busy_us" in ps else 0.0
    unprof = min(traced, max(traced - host_us, busy))
    basis_ops = "ops counted" if full else "ops taken as one per launching call (the frame keeps only long ops)"
    how = (f"estimated: {ops:.0f} ops and {runtime:.0f} runtime calls per step ({basis_ops}) x "
           f"{c_op:.2f} / {c_rt:.2f} us each, measured by "
           f"benchmarks/bench_profiler_overhead.py on {table['machine'].get('device')} ({table['file']}, "
           f"record_shapes={row['record_shapes']}, with_stack={row['with_stack']}; settings read from {where}) = "
           f"{host_us:.0f} us of host time per step"
           + (f"; the step cannot be shorter than the GPU's busy time, {busy:.0f} us" if unprof == busy and gpu else ""))
    return ProfilerOverhead(traced, unprof, traced - unprof, "estimated", how)
