"""Experiment ``bandwidth``: one message of ``bytes`` from endpoint 0 to 1 (``direction`` ``one``), or one each
way at once (``both``), ``iters`` messages per sample (``latency_iters``, where set, up to :data:`LATENCY_MAX_BYTES`: there a
message costs the host tens of microseconds, and a sample of a few, right after a barrier, times mostly the
loop's cold start), barrier-aligned samples timed by
:func:`.harness.timed_rows` (CUDA events on each participating rank's stream, host clock on CPU). A sample's
time is the slowest participant's (the receiver's stream ends when the data is there).

``matrix`` rows: every ordered endpoint pair at ``matrix_bytes`` one way, and every pair both ways at once, when
there are more than two endpoints (as ``p2pBandwidthLatencyTest`` does).

References, timed in turn with the transport's own samples (:func:`references`), rows with their name as
``transport``:

* an in-process copy-engine transport's one-way points: the bare ``dst.copy_(src)`` loop from GPU 0 to GPU 1
  (:data:`BARE`) and the CUDA floor under it -- ``cuMemcpyDtoDAsync`` issued in a loop with nothing ordering
  the copies (:data:`FLOOR_COPY`) and an event round trip GPU 0 -> GPU 1 -> GPU 0 (:data:`FLOOR_EVENTS`: a
  copy that must wait for the destination's stream and order it after the copy pays two such hops);
* a cross-process copy-engine transport's both-ways points: a copy of the message inside each GPU
  (:data:`LOCAL`), what a buffered receive's copy-out costs on its own;
* an in-process copy-engine transport's both-ways point at :data:`AT` (or the largest size below it), and only
  there: the same rounds with a local ``copy_`` of the message beside them on each receiving GPU
  (:data:`BESIDE`, :func:`_beside_reference`) -- the link both ways with a buffered receive's copy-out traffic
  (a second pass over the receiving GPU's memory) running at the same time, timed in turn with the transport's
  own rounds, so that a run carries the interference its own GPUs show (the analysis' ``copy_out_limit``).

With ``profile`` the both-ways point at the largest size of every CUDA transport is profiled (``trace`` rows,
``experiment=bandwidth``): where the time of a round goes (pieces on the link, copy-outs).
"""

from __future__ import annotations

from ... import stats, timing, traces
from . import harness as H

BARE = "copy_ loop"  # the reference transport name in rows
FLOOR_COPY = "cuMemcpy loop"
FLOOR_EVENTS = "event round trip"
LOCAL = "local copy_"
BESIDE = "copy + local copy_"  # the in-process transport both ways, a local copy_ of the message beside it
REFERENCES = (BARE, FLOOR_COPY, FLOOR_EVENTS, LOCAL, BESIDE)
AT = 256 << 20  # the size the headline bandwidth is stated at (and BESIDE is timed at)
LATENCY_MAX_BYTES = 64 << 10  # messages up to this size are timed ``cfg.latency_iters`` to a sample (their cost is the host's)


def experiment(cfg, ctx, T, S):
    n_end = T.endpoints()
    matrix = n_end > 2
    pairs = [(0, 1), (1, 0)] + ([(a, b) for a in range(n_end) for b in range(n_end) if a != b] if matrix else [])
    T.setup(pairs, max(cfg.max_bytes, cfg.matrix_bytes if matrix else 0))
    sizes = stats.pow2_sizes(cfg.min_bytes, cfg.max_bytes)
    at = beside_size(sizes)
    for direction in cfg.directions:
        for n in sizes:
            ctx.step(f"{T.name} {direction} {stats.human_bytes(n)}", point=False)
            flows = [(0, 1, n)] + ([(1, 0, n)] if direction == "both" else [])
            iters = cfg.latency_iters if cfg.latency_iters and n <= LATENCY_MAX_BYTES else cfg.iters
            keys = dict(transport=T.name, direction=direction, src=0, dst=1, bytes=n, iters=iters,
                        world_size=ctx.world_size, backend=ctx.backend)
            ref = references(T, S, direction, flows if n == at else None)
            yield from H.timed_rows(cfg, ctx, T, S, flows, keys, kind="bandwidth", reference=ref, iters=iters)
            if direction == "both" and n == sizes[-1] and cfg.profile and S.is_cuda:
                yield from profiled(ctx, T, S, flows)
            H.free(ctx)
    if matrix:
        for direction in cfg.directions:
            for a, b in pairs[2:]:
                if direction == "both" and a > b:
                    continue
                ctx.step(f"{T.name} matrix {direction} {a}->{b}", point=False)
                flows = [(a, b, cfg.matrix_bytes)] + ([(b, a, cfg.matrix_bytes)] if direction == "both" else [])
                keys = dict(transport=T.name, direction=direction, src=a, dst=b, bytes=cfg.matrix_bytes,
                            iters=cfg.iters, world_size=ctx.world_size, backend=ctx.backend)
                yield from H.timed_rows(cfg, ctx, T, S, flows, keys, kind="matrix")
            H.free(ctx)


def profiled(ctx, T, S, flows, rounds: int = 3):
    """One profiled window of ``rounds`` rounds of ``flows`` (after one untimed round); a ``trace`` row where this
    process takes part."""
    bufs = H.buffers(T, flows)
    H.transfer(T, ctx, flows, bufs)
    path = traces.trace_path(ctx, experiment="bandwidth", transport=T.name, direction="both")

    def step():
        for _ in range(rounds):
            H.transfer(T, ctx, flows, bufs)

    timing.trace_steps(step, S, 1, path, record_shapes=False)
    if H.participates(T, flows) and S.devices:
        yield dict(kind="trace", experiment="bandwidth", transport=T.name, direction="both",
                   path=str(path.relative_to(ctx.run_dir)), rank=ctx.rank)
    else:
        path.unlink(missing_ok=True)


def beside_size(sizes) -> int | None:
    """The swept size :data:`BESIDE` is timed at: :data:`AT`, or the largest size below it (None if none is)."""
    below = [n for n in sizes if n <= AT]
    return max(below) if below else None


def references(T, S, direction: str = "one", flows=None):
    """The loops ``T``'s point is compared with (see the module docstring), or None. ``flows``: the point's flows
    where :data:`BESIDE` is timed (an in-process transport both ways at :func:`beside_size`), else None.

    The floor loops issue the raw calls with objects made once (a stream handle, two reused events): what is
    left is what CUDA itself costs per message, on the host and on the GPU."""
    if not S.is_cuda or not T.caps.copy_engine:
        return None
    if T.caps.in_process and direction == "one":
        return _copy_references
    if T.caps.in_process and direction == "both" and flows:
        def beside(bufs):
            return _beside_reference(T, S, flows, bufs)

        beside.joined = (BESIDE,)  # joined once per sample, as the transport's own rounds (harness.timed_rows)
        return beside
    if not T.caps.in_process and direction == "both":
        return _local_reference
    return None


def _copy_references(bufs):
    import torch

    from ...transports import mailbox

    b = bufs[0]
    if "send" not in b:  # the ranks that drive no GPU join the barriers only
        return {k: (lambda: None) for k in (BARE, FLOOR_COPY, FLOOR_EVENTS)}
    src, dst = b["send"], b["recv"]
    s0, s1 = torch.cuda.current_stream(src.device), torch.cuda.current_stream(dst.device)
    memcpy = mailbox.libcuda().cuMemcpyDtoDAsync_v2
    d, s, n, h = dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size(), s0.cuda_stream
    e0, e1 = torch.cuda.Event(), torch.cuda.Event()

    def floor_copy():  # the timed stream is the source's (this rank's device, current while it runs)
        if memcpy(d, s, n, h):
            raise RuntimeError("cuMemcpyDtoDAsync failed (is the source's device current?)")

    def round_trip():
        e0.record(s0)
        s1.wait_event(e0)
        e1.record(s1)
        s0.wait_event(e1)

    return {BARE: lambda: dst.copy_(src), FLOOR_COPY: floor_copy, FLOOR_EVENTS: round_trip}


def _local_reference(bufs):
    import torch

    mine = [b["recv"] for b in bufs if "recv" in b]
    if not mine:
        return {LOCAL: lambda: None}
    into = torch.empty_like(mine[0])
    return {LOCAL: lambda: into.copy_(mine[0])}


def _beside_reference(T, S, flows, bufs):
    """:data:`BESIDE`: one round of ``flows`` posted as the transport's own timed rounds post them, with a local
    ``copy_`` of the message (its bytes read and written once more inside the GPU, as a buffered receive's copy-out
    does) on its own stream on each receiving GPU, started with the round (an event on the GPU's current stream)
    and waited for by that stream at the round's end; the sample is joined once, as the transport's
    (:func:`references` marks it ``joined``): the two differ by the local copies and their events only."""
    import torch

    mine = [b["recv"] for b in bufs if "recv" in b]
    if not mine:  # the ranks that drive no GPU join the barriers only
        return {BESIDE: lambda: None}
    side = []  # per receiving GPU: its current stream, a side stream, two events, the copy's source and destination
    for r in mine:
        d = r.device
        side.append((torch.cuda.current_stream(d), torch.cuda.Stream(d), torch.cuda.Event(), torch.cuda.Event(),
                     torch.empty_like(r), torch.empty_like(r)))
    op_list = H.ops(T, flows, bufs)

    def beside():
        for cur, s, start, end, a, b in side:
            start.record(cur)
            s.wait_event(start)
            with torch.cuda.stream(s):
                b.copy_(a)
            end.record(s)
        H.transfer(T, S, flows, bufs, joined=False, op_list=op_list)
        for cur, s, start, end, a, b in side:
            cur.wait_event(end)

    return {BESIDE: beside}
