"""The rank function: every H2D mode x sync mode (and the DDP bucket sweep) trained for a few timed steps.

**How a step is timed.** Each step has a :class:`kit.timing.PhaseTimer`: ``forward``, ``backward`` (with
``zero_grad``), ``sync`` and ``optimizer`` are CUDA-event phases on the default stream (``<part>_us``), each with
the host's own time in the same block (``<part>_host_us``); ``step_us`` spans the four on the device,
``step_host_us`` the whole step on the host from the moment it asks for its batch. The batch's copy is timed on
the stream it runs on (``h2d_us``, a timer per copy, since a prefetched batch is copied during the step before the
one that uses it); the host time blocked in the copy call (``h2d_host_us``) and in ``next(loader)``
(``data_wait_us``) go to the step in which the host spent it. Nothing inside the timed steps waits for the GPU:
the timers are read after all of them, so the host runs ahead as in a real training loop and whatever blocks it
(a pageable copy) shows as host time. ``wall_per_step_us`` is the wall-clock time of the timed steps / steps.

``per_param`` also times each parameter's all-reduce the report's way (a PhaseTimer phase per parameter on the
default stream, rows ``kind=param_allreduce``); profiled steps afterwards give the traces whose NCCL kernels show
what the all-reduce itself took, and DDP's overlap of communication with backward (rows ``kind=overlap``).
"""

from __future__ import annotations

import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

from kit import timing, traces
from kit.timing import PhaseTimer

from .config import CUDA_ONLY_H2D, DDP_DEFAULT_BUCKET_MB, ONE_BUCKET_MB, Config
from .data import RawImageFolder, make_dataset, make_loader
from .model import build, sync_gradients


class H2DMover:
    """Moves CPU batches to the device in one H2D mode.

    ``get(timer) -> (x, y, copy)``: this step's device batch (the default stream made to wait for its copy where
    the copy ran on the side stream) and the PhaseTimer of that batch's copy (``h2d_us``). The host time spent in
    ``next(loader)`` and in the copy call is recorded in ``timer`` (the step's): for ``prefetch`` that is the next
    batch's copy, issued during this step so that it overlaps it."""

    def __init__(self, mode: str, ctx, loader):
        import torch

        self.mode, self.ctx, self.loader, self.it = mode, ctx, loader, iter(loader)
        self.side = torch.cuda.Stream(ctx.device) if mode in ("side_stream", "prefetch") else None
        self.next = None

    def _fetch(self, timer: PhaseTimer):
        with timer.phase("data_wait_us", host=True):
            try:
                return next(self.it)
            except StopIteration:
                self.it = iter(self.loader)
                return next(self.it)

    def _copy(self, batch, timer: PhaseTimer):
        import torch

        xb, yb = batch
        copy, dev, nb = PhaseTimer(self.ctx.is_cuda), self.ctx.device, self.mode != "pageable"
        stream = self.side or (torch.cuda.current_stream(dev) if self.ctx.is_cuda else None)
        with torch.cuda.stream(stream) if self.side is not None else nullcontext():
            with copy.phase("h2d_us", stream=stream), timer.phase("h2d_host_us", host=True):
                x, y = xb.to(dev, non_blocking=nb), yb.to(dev, non_blocking=nb)
        return x, y, copy

    def _wait(self, *tensors) -> None:
        import torch

        cur = torch.cuda.current_stream(self.ctx.device)
        cur.wait_stream(self.side)
        for t in tensors:
            t.record_stream(cur)  # allocated on the side stream, used on the default stream now

    def get(self, timer: PhaseTimer):
        if self.mode == "prefetch":
            if self.next is None:
                self.next = self._copy(self._fetch(timer), timer)
            x, y, copy = self.next
            self._wait(x, y)
            self.next = self._copy(self._fetch(timer), timer)  # the next batch's copy overlaps this step
            return x, y, copy
        x, y, copy = self._copy(self._fetch(timer), timer)
        if self.side is not None:
            self._wait(x, y)
        return x, y, copy


def _part(timer: PhaseTimer, name: str) -> ExitStack:
    """One part of a step: device time (``<name>_us``, events on the current stream) and host time
    (``<name>_host_us``) of the same block."""
    stack = ExitStack()
    stack.enter_context(timer.phase(f"{name}_us"))
    stack.enter_context(timer.phase(f"{name}_host_us", host=True))
    return stack


def trace_file(ctx, h2d: str, sync: str, keep: bool) -> Path:
    """Where a configuration's profiler trace goes: kept under the trace layer's name
    (``trace_h2d=<h2d>_sync=<sync>_rank<r>.json.gz``, found again with ``kit.traces.find_traces(dirs, h2d=...,
    sync=...)``, which also reads the older ``trace_<h2d>_<sync>_rank<r>.json.gz``), else a temporary file."""
    if keep:
        return traces.trace_path(ctx, h2d=h2d, sync=sync)
    return Path(ctx.run_dir) / f".trace_tmp_rank{ctx.rank}.json"


def _overlap_rows(path: Path, ctx) -> list[dict]:
    """Communication vs compute overlap on this rank's GPU in a trace (kit.traces.overlap)."""
    gpu = traces.load_trace(path, cpu="none").gpu
    return traces.overlap(gpu[gpu["device"] == ctx.local_rank]).to_dict("records")


def train(cfg: Config, ctx, h2d: str, sync: str, bucket_mb: float, dataset, trace_path: Path | None = None):
    """Warm-up, ``cfg.steps`` timed steps and (optionally) profiled steps of one configuration; yields rows."""
    import torch
    import torch.nn.functional as F

    model, module, opt = build(cfg, ctx, sync, bucket_mb)
    loader = make_loader(cfg, ctx, dataset, pinned=cfg.pin_memory and h2d != "pageable")
    mover = H2DMover(h2d, ctx, loader)
    bucket = bucket_mb if sync == "ddp" else (ONE_BUCKET_MB if sync == "ddp_one_bucket" else None)
    keys = dict(h2d=h2d, sync=sync, bucket_cap_mb=bucket)
    cuda = ctx.is_cuda
    param_bytes = [p.numel() * p.element_size() for p in module.parameters()]

    def one_step(record: bool):
        """One training step; nothing here waits for the GPU (the timers are read after the timed steps)."""
        timer = PhaseTimer(cuda)
        params = PhaseTimer(cuda) if (record and cuda and sync == "per_param") else None
        with timer.phase("step_host_us", host=True):
            x, y, copy = mover.get(timer)
            with timer.phase("step_us"):
                with _part(timer, "forward"):
                    loss = F.cross_entropy(model(x), y)
                with _part(timer, "backward"):
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                with _part(timer, "sync"):
                    sync_gradients(module, sync, ctx.world_size, (lambda i, p: params.phase(str(i))) if params else None)
                with _part(timer, "optimizer"):
                    opt.step()
        return timer, copy, params, loss.detach()

    ctx.step(f"{h2d}+{sync} bucket={bucket_mb}: warm-up")
    for _ in range(cfg.warmup):
        one_step(False)
    ctx.barrier()
    ctx.step(f"{h2d}+{sync} bucket={bucket_mb}: {cfg.steps} steps")
    t0 = time.perf_counter()
    recorded = [one_step(True) for _ in range(cfg.steps)]
    ctx.sync()
    wall_us = (time.perf_counter() - t0) * 1e6
    for s, (timer, copy, params, loss) in enumerate(recorded):
        yield {"kind": "step", **keys, "sample": s, **timer.read(), **copy.read(), "loss": float(loss),
               "wall_per_step_us": wall_us / cfg.steps}
        for i, us in (params.read() if params else {}).items():
            yield {"kind": "param_allreduce", **keys, "sample": s, "param": int(i), "bytes": param_bytes[int(i)],
                   "event_us": us}
    if sync == "flat":
        yield {"kind": "grad_sync", **keys, "bytes": sum(param_bytes)}
    if cfg.profile_steps and trace_path is not None:
        ctx.step(f"{h2d}+{sync}: profiling")
        timing.trace_steps(lambda: one_step(False), ctx, cfg.profile_steps, trace_path)
        if cuda:
            for r in _overlap_rows(trace_path, ctx):
                yield {"kind": "overlap", **keys, **r, "steps": cfg.profile_steps}
    del mover, loader, model, module, opt  # free this configuration's model and pinned buffers before the next
    if cuda:
        torch.cuda.empty_cache()


def combos(cfg: Config, cuda: bool) -> list[tuple[str, str, float]]:
    """(h2d, sync, bucket MB) in the order they run: every H2D mode with every sync mode at DDP's default
    bucket, then the other bucket caps with the best H2D mode this machine has."""
    out = [(h, s, DDP_DEFAULT_BUCKET_MB) for h in cfg.h2d_modes for s in cfg.sync_modes]
    if "ddp" in cfg.sync_modes:
        h_best = "prefetch" if ("prefetch" in cfg.h2d_modes and cuda) else cfg.h2d_modes[0]
        out += [(h_best, "ddp", b) for b in cfg.bucket_caps_mb if b != DDP_DEFAULT_BUCKET_MB]
    return out


def points(cfg: Config, world: int, cuda: bool) -> int:
    """The measurement points (kit.contract): the dataset, then per configuration that runs here its warm-up,
    its timed steps and (``profile_steps``) its profiled steps."""
    runs = [c for c in combos(cfg, cuda) if cuda or c[0] not in CUDA_ONLY_H2D]
    return 1 + len(runs) * (3 if cfg.profile_steps else 2)


def run(cfg: Config, ctx):
    """The rank function (kit.contract): the dataset once, then every configuration in turn."""
    import torch.distributed as dist

    errs = cfg.check_world(ctx.world_size)
    if errs:
        raise ValueError("; ".join(errs))
    root = Path(cfg.data_dir or Path(cfg.results_root) / "_data")
    ctx.step("dataset")
    if ctx.rank == 0:
        make_dataset(root, cfg.samples, cfg.image_size, cfg.classes)
    ctx.barrier()
    dataset = RawImageFolder(make_dataset(root, cfg.samples, cfg.image_size, cfg.classes))
    for h2d, sync, bucket in combos(cfg, ctx.is_cuda):
        if h2d in CUDA_ONLY_H2D and not ctx.is_cuda:
            yield {"kind": "skipped", "h2d": h2d, "sync": sync, "reason": f"{h2d} needs CUDA (pinned memory, streams)"}
            continue
        keep = f"{h2d}+{sync}" in cfg.keep_traces and bucket == DDP_DEFAULT_BUCKET_MB
        path = trace_file(ctx, h2d, sync, keep)
        yield from train(cfg, ctx, h2d, sync, bucket, dataset, trace_path=path if cfg.profile_steps else None)
        if not keep and path.exists():
            path.unlink()
    dist.barrier()
