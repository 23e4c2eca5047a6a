"""The GPU activity of a few calls of a function, from a torch.profiler trace: :func:`profile_gpu`.

Above :mod:`kit.timing` (which runs the profiled loop, :func:`kit.timing.trace_steps`) and :mod:`kit.traces` (which
reads the trace): experiments that want kernel times rather than event times use it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from . import traces
from .timing import trace_steps


def profile_gpu(fn: Callable[[], object], ctx, calls: int, export: str | None = None):
    """GPU events (the ``gpu`` frame of kit.traces.load_trace) of ``calls`` calls of ``fn`` on this rank's device.

    Two things keep the window honest across ranks: the profiler is started once beforehand (CUPTI's first
    start-up takes long and would land inside a peer's collective, seen as a 290 ms "kernel" on 2xH200), and
    the ranks align with a barrier *inside* the profiled window, whose own NCCL kernel -- the first on the
    device -- and everything before it are cut away. ``export``: also keep the trace there (``.gz`` allowed).
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = export or str(Path(tmp) / "trace.json")
        trace_steps(fn, ctx, calls, path, record_shapes=False)
        ev = traces.load_trace(path, cpu="none").gpu
    if (ev["device"] == ctx.local_rank).any():
        ev = ev[ev["device"] == ctx.local_rank]
    if ctx.world_size > 1 and ev["nccl"].any():
        barrier_end = ev[ev["nccl"]].sort_values("ts")["end"].iloc[0]
        ev = ev[ev["ts"] >= barrier_end]
    return ev.reset_index(drop=True)
