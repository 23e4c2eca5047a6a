"""One way to time, used by every experiment.

A *sample* is the time of ``iters`` back-to-back calls divided by ``iters``; an experiment takes ``repeats``
samples after ``warmup`` untimed calls and keeps every sample (rows carry ``sample`` and ``time_us``).

* :func:`measure` -- the path a PyTorch program gets (:func:`measure_interleaved`: several functions compared,
  their samples taken in turn). On CUDA: CUDA events recorded on the current stream
  around the calls; the host clock around the same loop (without synchronising) gives the host cost of
  enqueueing one call. On CPU: the host clock, the calls being synchronous.
* :func:`measure_graph` -- device-only time: the same ``iters`` calls captured once in a CUDA graph (warm-up on
  a side stream first, as PyTorch documents) and replayed; launch overhead is gone, what remains is the
  kernels and the gaps the graph itself contains.
* Every sample starts barrier-aligned across ranks (:meth:`kit.launch.Ctx.barrier`: all ranks arrive and the
  device is idle), so a collective's time is not inflated by a peer that started late.
* :func:`trace_steps` -- ``calls`` calls under torch.profiler, the Chrome trace written to a file (read as GPU
  events by :func:`kit.gpu_profile.profile_gpu`, a layer up: timing does not read traces).
* :class:`PhaseTimer` -- named phases on their streams (CUDA events), read after the work.

Statistics over the samples live in :mod:`kit.stats`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class Samples:
    """Per-call seconds, one value per sample. ``host_s`` is the host time to enqueue one call (CUDA only)."""

    method: str
    device_s: list[float] = field(default_factory=list)
    host_s: list[float] = field(default_factory=list)

    def rows(self, **keys) -> list[dict]:
        out = []
        for i, t in enumerate(self.device_s):
            r = {**keys, "method": self.method, "sample": i, "time_us": t * 1e6}
            if self.host_s:
                r["host_us"] = self.host_s[i] * 1e6
            out.append(r)
        return out


def measure(fn: Callable[[], object], ctx, *, iters: int = 10, repeats: int = 10, warmup: int = 3,
            aligned: bool = True) -> Samples:
    """Time ``fn`` the way a program calls it: ``repeats`` samples of ``iters`` calls each."""
    return measure_interleaved({"": fn}, ctx, iters=iters, repeats=repeats, warmup=warmup, aligned=aligned)[""]


def measure_interleaved(fns: dict[str, Callable[[], object]], ctx, *, iters: int = 10, repeats: int = 10,
                        warmup: int = 3, aligned: bool = True,
                        finish: dict[str, Callable[[], object]] | None = None) -> dict[str, Samples]:
    """:func:`measure` for several functions whose times are compared, their samples taken in turn (sample
    ``i`` of every function, then sample ``i + 1``): a drift of the machine during the point (clocks, another
    process) then reaches each of them alike instead of whichever ran last. (On 2xH200 a bare 1 KiB ``copy_``
    loop timed on its own after the transports drifted from 22.8 to 52.4 us within one run.) ``finish[name]``
    runs once after each sample's calls of that function, before the sample's end is recorded: it orders the
    timed stream after work the calls left on other streams (inside the sample, once, not per call)."""
    finish = finish or {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        if name in finish:
            finish[name]()
    ctx.sync()
    out = {name: Samples("eager") for name in fns}
    if ctx.is_cuda:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        for name, fn in fns.items():
            s = out[name]
            if aligned:
                ctx.barrier()
            h0 = time.perf_counter()
            if ctx.is_cuda:
                start.record()
            for _ in range(iters):
                fn()
            if name in finish:
                finish[name]()
            if ctx.is_cuda:
                end.record()
                h1 = time.perf_counter()
                end.synchronize()
                s.device_s.append(start.elapsed_time(end) / 1e3 / iters)
                s.host_s.append((h1 - h0) / iters)
            else:
                s.device_s.append((time.perf_counter() - h0) / iters)
    return out


def capture_graph(fn: Callable[[], object], ctx, *, iters: int = 1, warmup: int = 3, graph=None, debug_dot=None):
    """Capture ``iters`` calls of ``fn`` into a ``torch.cuda.CUDAGraph`` (warm-up on a side stream first).
    ``graph``: a CUDAGraph to capture into (e.g. one in debug mode); ``debug_dot``: dump it there as DOT."""
    import torch

    side = torch.cuda.Stream(device=ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(ctx.device).wait_stream(side)
    ctx.sync()
    g = graph if graph is not None else torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    ctx.sync()
    if debug_dot is not None:
        g.debug_dump(str(debug_dot))
    return g


def measure_graph(fn: Callable[[], object], ctx, *, iters: int = 10, repeats: int = 10, warmup: int = 3,
                  aligned: bool = True, graph=None) -> Samples:
    """Device-only time per call: ``iters`` calls captured in one CUDA graph, replayed ``repeats`` times."""
    import torch

    g = graph or capture_graph(fn, ctx, iters=iters, warmup=warmup)
    g.replay()  # first replay uploads the graph
    ctx.sync()
    s = Samples("graph")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        if aligned:
            ctx.barrier()
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        s.device_s.append(start.elapsed_time(end) / 1e3 / iters)
    del g
    return s


_profiler_warm = False


def trace_steps(step: Callable[[], object], ctx, steps: int, path, record_shapes: bool = True):
    """Profile ``steps`` calls of ``step`` on this rank (CPU + CUDA activity, shapes recorded) and write the
    Chrome trace to ``path`` (``.json.gz`` is written gzipped). The ranks start together: a barrier inside
    the window, after a profiler start-up done once beforehand (CUPTI's first start is slow). Returns path."""
    from torch.profiler import ProfilerActivity, profile

    global _profiler_warm
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.is_cuda else [])
    if not _profiler_warm:
        with profile(activities=acts):
            ctx.sync()
        _profiler_warm = True
    ctx.sync()
    with profile(activities=acts, record_shapes=record_shapes) as prof:
        ctx.barrier()
        for _ in range(steps):
            step()
        ctx.sync()
    prof.export_chrome_trace(str(path))
    return path


class PhaseTimer:
    """Named phases of a step, timed on the stream each runs on, read after the work.

    ``with timer.phase("forward"):`` records a CUDA event before and after on ``stream`` (default: the current
    stream) -- nothing waits for the GPU inside a step, so a loop timed this way runs ahead of the device as a
    real training loop does; :meth:`read` synchronises on the recorded events afterwards and returns
    microseconds per phase (a phase entered several times is summed). On CPU the host clock is used. ``host``
    phases (``host=True``) time the host's own time in the block, e.g. a ``.to(device)`` that blocks.
    """

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._events: list[tuple[str, object, object]] = []
        self._host: dict[str, float] = {}

    def phase(self, name: str, stream=None, host: bool = False):
        from contextlib import contextmanager

        @contextmanager
        def block():
            h0 = time.perf_counter()
            if self.cuda and not host:
                import torch

                s = stream or torch.cuda.current_stream()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(s)
                yield
                b.record(s)
                self._events.append((name, a, b))
            else:
                yield
            if host or not self.cuda:
                self._host[name] = self._host.get(name, 0.0) + (time.perf_counter() - h0) * 1e6

        return block()

    def read(self) -> dict[str, float]:
        """Microseconds per phase (device phases after their events completed); clears the timer."""
        out = dict(self._host)
        for name, a, b in self._events:
            b.synchronize()
            out[name] = out.get(name, 0.0) + a.elapsed_time(b) * 1e3
        self._events, self._host = [], {}
        return out
