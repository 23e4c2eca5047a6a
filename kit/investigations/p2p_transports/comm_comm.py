"""Experiment ``comm_comm``: two flows from endpoint 0 (to receivers 1 and 2, or both to 1 with two endpoints),
issued on one channel (``one_stream``: one CUDA stream / one communicator) or on two (``two_streams``: two CUDA
streams for copy engines, two communicators for NCCL/gloo -- :meth:`Transport.second_channel`).
``time_us`` is each flow's completion from the common start.

Scenarios: ``two_flows`` (two large messages) and ``small_behind_big`` (a small message issued after a large
one -- on one NCCL communicator it cannot finish before the large one).
"""

from __future__ import annotations

import threading
import time

from ... import transports
from . import harness as H


def experiment(cfg, ctx, T, S):
    import torch

    r1, r2 = 1, (2 if T.endpoints() > 2 else 1)
    T.setup([(0, r1), (0, r2)], cfg.flow_bytes)
    T2 = T.second_channel() if T.caps.second_channel else None
    modes = ["one_stream"] + (["two_streams"] if T2 is not None else [])
    if T2 is None:
        yield dict(kind="skipped", transport=T.name, experiment="comm_comm", rank=ctx.rank,
                   reason=f"{T.name} has no second channel: two_streams not measured")
    scenarios = {"two_flows": [(0, r1, cfg.flow_bytes), (0, r2, cfg.flow_bytes)],
                 "small_behind_big": [(0, r1, cfg.flow_bytes), (0, r2, cfg.small_bytes)]}
    streams = {}
    if S.is_cuda:
        devs = sorted({ctx.device.index} | ({0, r1, r2} if T.caps.in_process else set()))
        streams = {k: {d: torch.cuda.Stream(d) for d in devs} for k in (0, 1)}
    for scen, flows in scenarios.items():
        bufs = H.buffers(T, flows)
        H.verified_transfer(T, ctx, flows, bufs, seq=0)
        for mode in modes:
            ctx.step(f"{T.name} comm_comm {scen} {mode}", point=False)
            chans = [T, T2 if mode == "two_streams" else T]
            for sample in range(-max(cfg.warmup, 1), cfg.repeats):  # >= 1: a new communicator starts lazily
                times = flows_once(ctx, S, chans, flows, bufs, streams, mode)
                if sample < 0:
                    continue
                for k, t in times.items():
                    yield dict(kind="comm_comm", transport=T.name, scenario=scen, mode=mode, flow=k,
                               src=flows[k][0], dst=flows[k][1], bytes=flows[k][2], sample=sample, time_us=t,
                               world_size=ctx.world_size)
        del bufs
    if T2 is not None and T2 is not T:
        T2.close()


def flows_once(ctx, S, chans, flows, bufs, streams, mode) -> dict[int, float]:
    """Post every flow, each on its channel/stream; return {flow: completion time from the start (us)} for
    the flows this process takes part in."""
    T = chans[0]
    mine = [k for k, (a, b, _) in enumerate(flows) if T.sends(a) or T.recvs(b)]
    S.barrier()
    if not S.is_cuda:
        return _host_flows(chans, flows, bufs, mine)
    import torch

    main = torch.cuda.current_stream(ctx.device)
    # Raw events, not kit.timing.PhaseTimer: every flow's completion is measured on its own stream from ONE
    # common start event, which PhaseTimer's per-phase start/end pairs cannot express.
    start = torch.cuda.Event(enable_timing=True)
    start.record(main)
    for k in (0, 1):
        for d, s in streams[k].items():
            s.wait_stream(torch.cuda.current_stream(d))
    ends = {}
    for k in mine:
        lane = streams[k if mode == "two_streams" else 0]
        with transports.current_streams(lane.values()):
            for w in H.post(chans[k], H.ops(T, flows, bufs, only=k)):
                w.wait()
            if T.caps.in_process:
                for d, s in lane.items():
                    if d != ctx.device.index:
                        lane[ctx.device.index].wait_stream(s)
            e = torch.cuda.Event(enable_timing=True)
            e.record(lane[ctx.device.index])
            ends[k] = e
    for k in (0, 1):
        main.wait_stream(streams[k][ctx.device.index])
    S.sync()
    return {k: start.elapsed_time(e) * 1e3 for k, e in ends.items()}


def _host_flows(chans, flows, bufs, mine) -> dict[int, float]:
    """CPU transports: the host clock. gloo's send/recv Works learn they are complete only inside wait(): one
    waiting thread per flow."""
    T = chans[0]
    t0 = time.perf_counter()
    works = {k: H.post(chans[k], H.ops(T, flows, bufs, only=k)) for k in mine}
    done: dict[int, float] = {}

    def finish(k):
        for w in works[k]:
            w.wait()
        done[k] = (time.perf_counter() - t0) * 1e6

    threads = [threading.Thread(target=finish, args=(k,)) for k in works]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return done
