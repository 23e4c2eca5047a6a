"""Experiment ``comm_compute``: ``compute_matmuls`` matmuls (``compute_n``^3, ``dtype``) on a compute stream,
and ``overlap_messages`` transfers of ``overlap_bytes`` 0 -> 1 on a communication stream: alone
(``phase`` ``compute`` / ``comm``) and together (``overlapped``).

Per sample and per device this process computes on: ``compute_us`` (the compute stream's time),
``comm_us`` (the communication stream's time, ranks that take part), ``total_us`` (from the start to both
streams done), timed with :class:`kit.timing.PhaseTimer` (CUDA events on those streams; the host clock for a
CPU transport). The process that drives a GPU computes on it: with an in-process transport rank 0 computes
on every GPU and the other ranks stay off the GPUs (see :class:`~.harness.Sync`). One overlapped iteration per
CUDA transport is also profiled for the timeline, kept as :func:`kit.traces.trace_path` names it
(tags ``experiment=comm_compute transport=<name>``; :func:`kit.traces.find_traces` also finds the older
``traces/comm_compute-<name>-rank<r>.json.gz`` of recorded runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ... import timing, traces, transports
from . import harness as H

PHASES = ("compute", "comm", "overlapped")


@dataclass
class Bench:
    """What this process does in the experiment: where it computes, the matrices, its part of the flow."""

    T: object
    ctx: object
    S: H.Sync
    matmuls: int
    messages: int
    comp_devs: list
    flows: list
    bufs: list
    comm_role: bool
    mats: dict = field(default_factory=dict)
    compute_streams: dict = field(default_factory=dict)
    comm_streams: dict = field(default_factory=dict)

    def compute(self, d) -> None:
        import torch

        a, b = self.mats[d]
        for _ in range(self.matmuls):
            torch.mm(a, b)

    def comm(self) -> None:
        for _ in range(self.messages):
            H.transfer(self.T, self.ctx, self.flows, self.bufs)


def prepare(cfg, ctx, T, S) -> Bench:
    """Matrices on every device this process computes on, the flow's buffers (one verified transfer), and
    the compute and communication streams."""
    import torch

    T.setup([(0, 1)], cfg.overlap_bytes)
    if T.caps.in_process:  # the driving process computes on every GPU it drives; the others stay off the GPUs
        comp_devs = S.devices
    else:
        comp_devs = [ctx.device] if ctx.is_cuda else [torch.device("cpu")]
    flows = [(0, 1, cfg.overlap_bytes)]
    b = Bench(T, ctx, S, cfg.compute_matmuls, cfg.overlap_messages, comp_devs, flows, H.buffers(T, flows),
              H.participates(T, flows))
    dt = H.compute_dtype(cfg, ctx)
    g = torch.Generator().manual_seed(1)
    for d in comp_devs:
        b.mats[d] = (torch.randn(cfg.compute_n, cfg.compute_n, generator=g).to(d, dt),
                     torch.randn(cfg.compute_n, cfg.compute_n, generator=g).to(d, dt))
    H.verified_transfer(T, ctx, flows, b.bufs, seq=0)
    if S.is_cuda:
        b.compute_streams = {d: torch.cuda.Stream(d) for d in comp_devs}
        comm_devs = sorted({ctx.device.index} | ({0, 1} if T.caps.in_process else set()))
        b.comm_streams = {d: torch.cuda.Stream(d) for d in comm_devs}
    return b


def sample(b: Bench, phase: str, barrier: bool = True) -> list[dict]:
    """One sample of ``phase``: a row per device this process computes on (one row if it computes nowhere);
    none for a process that drives nothing here."""
    if barrier:
        b.S.barrier()
    if not b.comp_devs and not b.comm_role:  # a rank that drives nothing here stays off the GPUs
        return []
    do_c, do_m = phase in ("compute", "overlapped"), phase in ("comm", "overlapped") and b.comm_role
    return (_sample_cuda if b.S.is_cuda else _sample_host)(b, do_c, do_m)


def _sample_host(b: Bench, do_c: bool, do_m: bool) -> list[dict]:
    """CPU transport: post every message first (gloo works in background threads), compute, then wait."""
    import torch

    timer, works = timing.PhaseTimer(cuda=False), []
    with timer.phase("total"):
        if do_m:
            for _ in range(b.messages):
                works += H.post(b.T, H.ops(b.T, b.flows, b.bufs))
        if do_c:
            with timer.phase("compute"):
                for d in b.comp_devs:
                    b.compute(d)
                    if d.type == "cuda":
                        torch.cuda.synchronize(d)
        for w in works:
            w.wait()
    us = timer.read()
    return [dict(device=str(d), compute_us=us.get("compute", math.nan), comm_us=us["total"] if do_m else math.nan,
                 total_us=us["total"]) for d in b.comp_devs or [None]]


def _sample_cuda(b: Bench, do_c: bool, do_m: bool) -> list[dict]:
    """CUDA transport: compute kernels queued first on their streams (before any host wait inside a
    transfer), the transfers on the communication streams, this device's stream joining both."""
    import torch

    me = b.ctx.device.index
    cs, ms = b.compute_streams, b.comm_streams
    main = torch.cuda.current_stream(b.ctx.device)
    timer = timing.PhaseTimer(cuda=True)
    with timer.phase("total", stream=main):
        for d in b.comp_devs:
            cs[d].wait_stream(torch.cuda.current_stream(d))
        for d, st in ms.items():
            st.wait_stream(torch.cuda.current_stream(d))
        if do_c:
            for d in b.comp_devs:
                with torch.cuda.stream(cs[d]), timer.phase(f"compute {d}", stream=cs[d]):
                    b.compute(d)
        if do_m:
            with transports.current_streams(ms.values()), timer.phase("comm", stream=ms[me]):
                b.comm()  # transfer() joins every device's comm stream into this device's
        for d in b.comp_devs:
            main.wait_stream(cs[d])
        main.wait_stream(ms[me])
    b.S.sync()
    us = timer.read()
    return [dict(device=str(d) if d is not None else str(b.ctx.device),
                 compute_us=us[f"compute {d}"] if (do_c and d is not None) else math.nan,
                 comm_us=us["comm"] if do_m else math.nan, total_us=us["total"]) for d in b.comp_devs or [None]]


def profile(b: Bench) -> list[dict]:
    """Profile one overlapped iteration on every rank; a ``trace`` row where this rank did something."""
    ctx = b.ctx
    path = traces.trace_path(ctx, experiment="comm_compute", transport=b.T.name)
    timing.trace_steps(lambda: sample(b, "overlapped", barrier=False), b.S, 1, path, record_shapes=False)
    if b.comp_devs or b.comm_role:
        return [dict(kind="trace", transport=b.T.name, path=str(path.relative_to(ctx.run_dir)), rank=ctx.rank)]
    path.unlink(missing_ok=True)
    return []


def experiment(cfg, ctx, T, S):
    b = prepare(cfg, ctx, T, S)
    keys = dict(kind="comm_compute", transport=T.name, bytes=cfg.overlap_bytes, messages=cfg.overlap_messages,
                compute_n=cfg.compute_n, matmuls=cfg.compute_matmuls,
                dtype=str(H.compute_dtype(cfg, ctx)).replace("torch.", ""), comm_role=b.comm_role,
                world_size=ctx.world_size)
    for phase in PHASES:
        ctx.step(f"{T.name} comm_compute {phase}", point=False)
        for i in range(-cfg.warmup, cfg.repeats):
            rows = sample(b, phase)
            if i >= 0:
                yield from (dict(keys, phase=phase, sample=i, **r) for r in rows)
    if cfg.profile and S.is_cuda:
        ctx.step(f"{T.name} comm_compute profile", point=False)
        yield from profile(b)
    b.mats.clear()
    b.bufs.clear()
    H.free(ctx)
