"""The benchmark harness every p2p experiment uses, for any transport: flows, their buffers, one round of
transfers (optionally verified), the timing ``ctx`` (:class:`Sync`) and a timed point.

A *flow* is ``(src, dst, nbytes)`` between endpoints (ranks, or GPUs of one process for an in-process
transport). Buffers are uint8 (the transports are dtype-agnostic) and carry :func:`kit.transports.pattern`,
so a receiver can check what arrived. Nothing here knows a transport's name: it asks ``T.caps``, ``T.sends``,
``T.recvs`` and ``T.device``.
"""

from __future__ import annotations

from ... import timing, transports


class Sync:
    """The ``ctx`` an experiment times transport ``T`` with: rank and device as ``ctx``, ``is_cuda`` when the
    transport's buffers are on GPUs, ``devices`` this process drives, and a ``barrier`` that fits the transport.

    For an in-process transport the ranks other than 0 have nothing to do, and they must not wait in an NCCL
    barrier: that kernel would spin on their GPU, and a GPU time-slices between processes' contexts (slices of
    ~ms), so the driving process's work on that GPU -- the events ``copy_`` records on the destination device
    -- would wait for the slice (seen on 2xH200: every copy 2 ms late). They wait in a gloo (host) barrier
    instead, and rank 0 synchronises every GPU it drives."""

    def __init__(self, ctx, in_process: bool, cuda: bool, host_group=None):
        import torch

        self._ctx, self.rank, self.world_size, self.device = ctx, ctx.rank, ctx.world_size, ctx.device
        self.is_cuda = bool(cuda)
        self.host = in_process and host_group is not None
        self._group = host_group
        if not self.is_cuda:
            self.devices = []
        elif in_process:  # rank 0 drives every GPU of the node; the other ranks drive none
            self.devices = [torch.device("cuda", d) for d in range(torch.cuda.device_count())] if ctx.rank == 0 else []
        else:
            self.devices = [ctx.device]

    def sync(self) -> None:
        import torch

        for d in self.devices:
            torch.cuda.synchronize(d)

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.host:
            self.sync()
            dist.barrier(group=self._group)
        else:
            self._ctx.barrier()
            self.sync()


    def host_barrier(self) -> None:
        """The processes meet on the host only through the gloo group: no GPU is synchronised or given a kernel, so a
        transfer already queued on a GPU (an NCCL send waiting for its receive) is left as it is. Without that group
        (a CPU run, whose default group is gloo already) it is the context's barrier, which on a CUDA run would go
        through NCCL and synchronise: every CUDA run with more than one process makes the group (``sync_for``'s
        caller), so that case does not arise."""
        import torch.distributed as dist

        if self._group is not None:
            dist.barrier(group=self._group)
        else:
            self._ctx.barrier()


def sync_for(T, ctx, host_group=None) -> Sync:
    return Sync(ctx, T.caps.in_process, ctx.is_cuda and T.caps.cuda, host_group)


def buffers(T, flows, seq0: int = 0) -> list[dict]:
    """Per flow: ``send`` where this process sends (the pattern of message ``seq0``), ``recv`` where it receives."""
    import torch

    bufs = []
    for src, dst, n in flows:
        b = {}
        if T.sends(src):
            b["send"] = transports.pattern(n, T.device(src), seq0, src)
        if T.recvs(dst):
            b["recv"] = torch.empty(n, dtype=torch.uint8, device=T.device(dst))
        bufs.append(b)
    return bufs


def ops(T, flows, bufs, only: int | None = None) -> list[tuple]:
    """This process's ``(kind, tensor, peer)`` operations for ``flows`` (or for flow ``only``)."""
    out = []
    for k, ((src, dst, _), b) in enumerate(zip(flows, bufs)):
        if only is not None and k != only:
            continue
        if "send" in b:
            out.append(("send", b["send"], dst))
        if "recv" in b:
            out.append(("recv", b["recv"], src))
    return out


def post(T, op_list) -> list:
    """Post ``op_list`` (one op: ``isend``/``irecv``; several: ``exchange``); returns the Works."""
    if not op_list:
        return []
    if len(op_list) == 1:
        kind, t, peer = op_list[0]
        return [T.isend(t, peer) if kind == "send" else T.irecv(t, peer)]
    return T.exchange(op_list)


_JOIN_EVENTS: dict = {}  # device index -> the event join records there (see join)


def join(T, ctx, flows) -> None:
    """In one process, make this rank's current stream wait for every device a flow touched (so events on it
    time the whole transfer). One event per device, reused: each is recorded and waited for at once, in this
    thread, so no wait can see a later record (a fresh event per round -- ``Stream.wait_stream`` -- adds its
    creation and destruction to every 1 KiB message: 4.7 us per join on an H200 host, 3.2 reused --
    ``recorded/probes/host-cost-h200/``)."""
    import torch

    if T.caps.in_process and ctx.is_cuda:
        main = torch.cuda.current_stream(ctx.device)
        for d in {d for f in flows for d in f[:2]}:
            if d != ctx.device.index:
                ev = _JOIN_EVENTS.get(d)
                if ev is None:
                    ev = _JOIN_EVENTS[d] = torch.cuda.Event()
                ev.record(torch.cuda.current_stream(d))
                main.wait_event(ev)


def transfer(T, ctx, flows, bufs, joined: bool = True, op_list=None, post_fn=None, order=None) -> None:
    """This process's part of one round of ``flows`` (every message posted at once, then waited for: what a
    program does). ``joined``: then :func:`join` (the timed loop joins once per sample instead). ``op_list``: the
    round's :func:`ops`, made once by a loop that repeats the round (at 1 KiB every microsecond is the message's).
    ``post_fn(T, op_list) -> Works``: how the ops are posted (default :func:`post`); ``order``: the op list's
    :func:`_wait_order`, made once with it."""
    o = op_list if op_list is not None else ops(T, flows, bufs)
    works = (post_fn or post)(T, o)
    # receives first, as a program waits for the data it needs and for its sends later: a send's wait orders the
    # current stream after the whole outgoing copy, and a receive completed after it (ipc: its copy-out queued on
    # that stream) could then not overlap the transfer
    for i in order if order is not None else _wait_order(o):
        works[i].wait()
    if joined:
        join(T, ctx, flows)


def _wait_order(o) -> list[int]:
    """The receives' indices, then the sends'."""
    return [i for i, op in enumerate(o) if op[0] == "recv"] + [i for i, op in enumerate(o) if op[0] != "recv"]


def verified_transfer(T, ctx, flows, bufs, seq: int, post_fn=None) -> None:
    """One round whose data is checked at every receiver against the pattern of message ``seq``."""
    for (src, dst, n), b in zip(flows, bufs):
        if "send" in b:
            b["send"].copy_(transports.pattern(n, b["send"].device, seq, src))
    transfer(T, ctx, flows, bufs, post_fn=post_fn)
    for (src, dst, n), b in zip(flows, bufs):
        if "recv" in b:
            transports.check(b["recv"], transports.pattern(n, b["recv"].device, seq, src),
                             f"{T.name} {src}->{dst} {n} B message {seq}")


def participates(T, flows) -> bool:
    return any(T.sends(a) or T.recvs(b) for a, b, _ in flows)


def timed_rows(cfg, ctx, T, S, flows, keys: dict, kind: str, reference=None, post=None, iters: int | None = None) -> list[dict]:
    """One timed point: the first round verified, then ``repeats`` samples of ``iters`` rounds
    (:func:`kit.timing.measure_interleaved` with ``S`` as its ctx; every round verified when ``cfg.verify``),
    the rounds posted and waited for as a program does, and joined into the timed stream once per sample
    (:func:`join`: a bare ``copy_`` loop needs no join, so a join per round would be harness cost the transport
    is charged for). Rows for the processes that take part. ``reference(bufs)`` -> ``{transport name: fn}``:
    loops the transport is compared with, on the same buffers, their samples taken in turn with the
    transport's; their rows carry that name as ``transport``; the names in ``reference.joined`` (rounds of the
    transport itself with something beside them) are joined once per sample as the transport's are. ``post``: how a round's ops are posted
    (:func:`transfer`'s ``post_fn``). ``iters``: rounds per sample (default ``cfg.iters``)."""
    bufs = buffers(T, flows)
    verified_transfer(T, ctx, flows, bufs, seq=0, post_fn=post)  # always: the first transfer of every point is checked
    if cfg.verify:
        seq = [1]

        def fn():
            verified_transfer(T, ctx, flows, bufs, seq[0], post_fn=post)
            seq[0] += 1
    else:
        op_list = ops(T, flows, bufs)
        order = _wait_order(op_list)

        def fn():
            transfer(T, ctx, flows, bufs, joined=False, op_list=op_list, post_fn=post, order=order)
    refs = reference(bufs) if reference is not None else {}
    joined = (T.name, *getattr(reference, "joined", ()))  # references whose rounds are the transport's, joined alike
    joins = {n: (lambda: join(T, ctx, flows)) for n in joined} if participates(T, flows) else {}  # the others stay off the GPUs
    s = timing.measure_interleaved({T.name: fn, **refs}, S, iters=iters or cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup,
                                   finish=joins)
    if not participates(T, flows):
        return []
    return [dict(r, kind=kind) for name, samples in s.items()
            for r in samples.rows(**{**keys, "transport": name}, verified=cfg.verify and name == T.name)]


def free(ctx) -> None:
    """Give cached GPU memory back between points (the largest buffers are 1 GiB)."""
    if ctx.is_cuda:
        import torch

        torch.cuda.empty_cache()


def compute_dtype(cfg, ctx, cuda: bool | None = None):
    """``cfg.dtype`` on GPUs, float32 on CPU (``cuda``: override whether the buffers are on GPUs)."""
    import torch

    return getattr(torch, cfg.dtype) if (ctx.is_cuda if cuda is None else cuda) else torch.float32
