"""Experiment ``bandwidth``: one message of ``bytes`` from endpoint 0 to 1 (``direction`` ``one``), or one each
way at once (``both``), ``iters`` messages per sample, barrier-aligned samples timed by
:func:`.harness.timed_rows` (CUDA events on each participating rank's stream, host clock on CPU). A sample's
time is the slowest participant's (the receiver's stream ends when the data is there).

``matrix`` rows: every ordered endpoint pair at ``matrix_bytes`` when there are more than two endpoints (as
``p2pBandwidthLatencyTest`` does). :func:`references`: an in-process copy-engine transport's one-way points are
timed in turn with a bare ``dst.copy_(src)`` loop from GPU 0 to GPU 1 (rows with ``transport`` = :data:`BARE`).
"""

from __future__ import annotations

from ... import stats
from . import harness as H

BARE = "copy_ loop"  # the reference transport name in rows


def experiment(cfg, ctx, T, S):
    n_end = T.endpoints()
    matrix = n_end > 2
    pairs = [(0, 1), (1, 0)] + ([(a, b) for a in range(n_end) for b in range(n_end) if a != b] if matrix else [])
    T.setup(pairs, max(cfg.max_bytes, cfg.matrix_bytes if matrix else 0))
    for direction in cfg.directions:
        for n in stats.pow2_sizes(cfg.min_bytes, cfg.max_bytes):
            ctx.step(f"{T.name} {direction} {stats.human_bytes(n)}", point=False)
            flows = [(0, 1, n)] + ([(1, 0, n)] if direction == "both" else [])
            keys = dict(transport=T.name, direction=direction, src=0, dst=1, bytes=n, iters=cfg.iters,
                        world_size=ctx.world_size, backend=ctx.backend)
            ref = references(T, S) if direction == "one" else None
            yield from H.timed_rows(cfg, ctx, T, S, flows, keys, kind="bandwidth", reference=ref)
            H.free(ctx)
    if matrix:
        for a, b in pairs[2:]:
            ctx.step(f"{T.name} matrix {a}->{b}", point=False)
            keys = dict(transport=T.name, direction="one", src=a, dst=b, bytes=cfg.matrix_bytes, iters=cfg.iters,
                        world_size=ctx.world_size, backend=ctx.backend)
            yield from H.timed_rows(cfg, ctx, T, S, [(a, b, cfg.matrix_bytes)], keys, kind="matrix")


def references(T, S):
    """The loops ``T``'s one-way point is compared with: for a transport that is copy engines driven in one
    process, the bare ``dst.copy_(src)`` loop from GPU 0 to GPU 1 (:data:`BARE`) on the point's own buffers,
    its samples taken in turn with the transport's (:func:`kit.timing.measure_interleaved`: a drift of the
    machine reaches both; timed after the transports, on 2xH200 the bare loop once drifted 22.8-52.4 us at
    1 KiB within one run). ``None`` for any other transport."""
    if not (T.caps.in_process and T.caps.copy_engine and S.is_cuda):
        return None

    def loops(bufs):
        b = bufs[0]
        if "send" not in b:  # the ranks that drive no GPU join the barriers only
            return {BARE: lambda: None}
        src, dst = b["send"], b["recv"]
        return {BARE: lambda: dst.copy_(src)}

    return loops
