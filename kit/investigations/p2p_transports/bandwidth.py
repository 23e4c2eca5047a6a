"""Experiment ``bandwidth``: one message of ``bytes`` from endpoint 0 to 1 (``direction`` ``one``), or one each
way at once (``both``), ``iters`` messages per sample, barrier-aligned samples timed by
:func:`kit.timing.measure` (CUDA events on each participating rank's stream, host clock on CPU). A sample's
time is the slowest participant's (the receiver's stream ends when the data is there).

``matrix`` rows: every ordered endpoint pair at ``matrix_bytes`` when there are more than two endpoints (as
``p2pBandwidthLatencyTest`` does). :func:`bare_copy` is the reference for an in-process copy-engine transport:
a bare ``dst.copy_(src)`` loop from GPU 0 to GPU 1 (rows with ``transport`` = :data:`BARE`).
"""

from __future__ import annotations

from ... import stats, timing, transports
from . import harness as H

BARE = "copy_ loop"  # the reference transport name in rows


def experiment(cfg, ctx, T, S):
    n_end = T.endpoints()
    matrix = n_end > 2
    pairs = [(0, 1), (1, 0)] + ([(a, b) for a in range(n_end) for b in range(n_end) if a != b] if matrix else [])
    T.setup(pairs, max(cfg.max_bytes, cfg.matrix_bytes if matrix else 0))
    for direction in cfg.directions:
        for n in stats.pow2_sizes(cfg.min_bytes, cfg.max_bytes):
            ctx.step(f"{T.name} {direction} {stats.human_bytes(n)}")
            flows = [(0, 1, n)] + ([(1, 0, n)] if direction == "both" else [])
            keys = dict(transport=T.name, direction=direction, src=0, dst=1, bytes=n, iters=cfg.iters,
                        world_size=ctx.world_size, backend=ctx.backend)
            yield from H.timed_rows(cfg, ctx, T, S, flows, keys, kind="bandwidth")
            H.free(ctx)
    if matrix:
        for a, b in pairs[2:]:
            ctx.step(f"{T.name} matrix {a}->{b}")
            keys = dict(transport=T.name, direction="one", src=a, dst=b, bytes=cfg.matrix_bytes, iters=cfg.iters,
                        world_size=ctx.world_size, backend=ctx.backend)
            yield from H.timed_rows(cfg, ctx, T, S, [(a, b, cfg.matrix_bytes)], keys, kind="matrix")


def bare_copy(cfg, ctx, S):
    """The reference for in-process copy engines: a bare ``dst.copy_(src)`` loop from GPU 0 to GPU 1 in rank 0
    (``S``: an in-process :class:`~harness.Sync`; the other ranks only join its barriers)."""
    import torch

    for n in stats.pow2_sizes(cfg.min_bytes, cfg.max_bytes):
        ctx.step(f"{BARE} {stats.human_bytes(n)}")
        if ctx.rank == 0:
            src = transports.pattern(n, torch.device("cuda", 0), 0, 0)
            dst = torch.empty(n, dtype=torch.uint8, device="cuda:1")
            fn = lambda: dst.copy_(src)  # noqa: E731
        else:
            fn = lambda: None  # noqa: E731
        s = timing.measure(fn, S, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup)
        if ctx.rank == 0:
            yield from (dict(r, kind="bandwidth") for r in s.rows(
                transport=BARE, direction="one", src=0, dst=1, bytes=n, iters=cfg.iters,
                world_size=ctx.world_size, backend=ctx.backend, verified=False))
            del src, dst
        H.free(ctx)
