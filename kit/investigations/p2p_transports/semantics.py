"""Experiment ``semantics``: what blocks the host. Rank 1 posts its receive ``recv_delay_ms`` late; each rank
records the host time inside the call (``call_us``), inside ``wait()`` (``wait_us``), until the device is known
done (``done_us``, a ``synchronize``) and the stream time (``device_us``, CUDA events around call + wait).

APIs measured: ``isend``/``irecv``, plus the blocking ``send``/``recv`` where the transport has them
(``caps.blocking_send``); an in-process transport issues both sides in one call sequence (``copy_``, role
``copy``, no receiver delay: one process cannot be late for itself).
"""

from __future__ import annotations

import math
import time

from ... import transports
from . import harness as H


def apis(T) -> list[str]:
    if T.caps.in_process:
        return ["copy_"]
    return ["send", "isend"] if T.caps.blocking_send else ["isend"]


def experiment(cfg, ctx, T, S):
    T.setup([(0, 1)], max(cfg.semantics_bytes))
    in_proc = T.caps.in_process
    rounds = [(n, api, s) for n in cfg.semantics_bytes for api in apis(T) for s in range(-1, min(cfg.repeats, 5))]
    active = ctx.rank == 0 if in_proc else ctx.rank in (0, 1)
    for n, api, i in rounds:
        if not active:  # same barriers as the active ranks
            S.barrier()
            S.barrier()
            continue
        # an in-process transport issues both sides: its row's role is "copy" (the rows' schema)
        role = "send" if in_proc or ctx.rank == 0 else "recv"
        t = _one_call(cfg, ctx, T, S, n, api, i, role)
        role = "copy" if in_proc else role
        if i < 0:
            continue
        yield dict(kind="semantics", transport=T.name, api=api, role=role, bytes=n, sample=i, **t,
                   delay_ms=cfg.recv_delay_ms if role == "recv" else 0.0,
                   peer_delay_ms=cfg.recv_delay_ms if role == "send" else 0.0, world_size=ctx.world_size)


def _one_call(cfg, ctx, T, S, n: int, api: str, seq: int, role: str) -> dict[str, float]:
    """One message 0 -> 1 through ``api`` (this process's side of it; both sides for an in-process transport),
    checked where it is received; host and stream times of the call."""
    import torch

    both = T.caps.in_process
    if both or role == "send":
        src = transports.pattern(n, T.device(0 if both else ctx.rank), seq, 0)
    if both or role == "recv":
        got = torch.empty(n, dtype=torch.uint8, device=T.device(1 if both else ctx.rank))
    S.barrier()
    if role == "recv" and cfg.recv_delay_ms:
        time.sleep(cfg.recv_delay_ms / 1e3)
    if S.is_cuda:  # one event pair spans call + wait + join while host clocks split them: not PhaseTimer phases
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    h0 = time.perf_counter()
    w = None
    if both:
        T.isend(src, 1)
        w = T.irecv(got, 0)
    elif api == "send":
        T.send(src, 1) if role == "send" else T.recv(got, 0)
    else:
        w = T.isend(src, 1) if role == "send" else T.irecv(got, 0)
    h1 = time.perf_counter()
    if w is not None:
        w.wait()
    if both:
        H.join(T, ctx, [(0, 1)])
    h2 = time.perf_counter()
    if S.is_cuda:
        e1.record()
        torch.cuda.synchronize()
    h3 = time.perf_counter()
    if both or role == "recv":
        transports.check(got, transports.pattern(n, got.device, seq, 0), f"{T.name} semantics {api} {n} B")
    S.barrier()
    return dict(call_us=(h1 - h0) * 1e6, wait_us=(h2 - h1) * 1e6, done_us=(h3 - h0) * 1e6,
                device_us=e0.elapsed_time(e1) * 1e3 if S.is_cuda else math.nan)
