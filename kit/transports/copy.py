"""``copy``: ``dst.copy_(src)`` between two GPUs of *one process* -- rank 0 drives every GPU of the node and the
endpoints are device indices.

PyTorch enables peer access and, for contiguous tensors of one dtype, issues one ``cudaMemcpyAsync`` on the
source device's current stream: a *copy engine* moves the bytes, no SM is used. PyTorch also makes the two
devices' current streams wait for each other around the copy. Because one process issues both sides, the send
only posts the tensor; the matching receive (which knows the destination) issues the copy.
"""

from __future__ import annotations

from collections import deque
from contextlib import nullcontext

from .base import Capabilities, Transport, Work, event_work
from .registry import register


@register("copy")
class CopyTransport(Transport):
    """``copy_`` between GPUs of one process; endpoints are device indices; rank 0 drives them."""

    caps = Capabilities(copy_engine=True, in_process=True, needs_peer_access=True, second_channel=True, cuda=True)

    def __init__(self, ctx, timeout_s: float = 300.0):
        super().__init__(ctx, timeout_s)
        self._box: dict[tuple[int, int], deque] = {}
        self._streams: dict[tuple[int, int, int], tuple] = {}
        self.posted = 0  # messages posted so far (lets a cooperative driver detect a deadlock)

    def device(self, endpoint: int):
        import torch

        return torch.device("cuda", endpoint)

    def sends(self, src: int) -> bool:
        return self.ctx.rank == 0

    recvs = sends

    def poll(self, src: int, dst: int) -> bool:
        return bool(self._box.get((src, dst)))

    def isend(self, t, dst: int) -> Work:
        """Posts ``t``; the copy itself is issued by the matching ``irecv`` (the destination is known then).
        The Work's ``wait()`` orders the source device's current stream after that copy (buffer reusable)."""
        import torch

        src = t.device.index
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(src))
        holder: dict = {}
        self._box.setdefault((src, dst), deque()).append((t, ev, holder))
        self.posted += 1

        def wait():
            if "done" in holder:
                torch.cuda.current_stream(src).wait_event(holder["done"])

        return Work(wait, lambda: "done" in holder and holder["done"].query())

    def irecv(self, out, src: int, streams: tuple | None = None) -> Work:
        """Issues the copy of the oldest message posted from ``src`` to ``out``'s device. The Work's ``wait()``
        orders the destination device's current stream after it."""
        import torch

        dst = out.device.index
        box = self._box.get((src, dst))
        if not box:
            raise RuntimeError(f"copy: receive {src}->{dst} posted before its send (one process drives both ends)")
        t, ev, holder = box.popleft()
        if t.dtype != out.dtype or t.numel() != out.numel():
            raise ValueError(f"copy: sent {t.dtype}[{t.numel()}], receiving into {out.dtype}[{out.numel()}]")
        s_src = streams[0] if streams else torch.cuda.current_stream(src)
        s_src.wait_event(ev)
        if streams:  # the side streams now use both tensors: keep the allocator from reusing them early
            t.record_stream(streams[0])
            out.record_stream(streams[1])
        with (torch.cuda.stream(s_src) if streams else nullcontext()), \
                (torch.cuda.stream(streams[1]) if streams else nullcontext()):
            if out.is_contiguous() and t.is_contiguous():
                out.view(-1).copy_(t.reshape(-1))
            else:
                out.copy_(t.contiguous().view(out.shape))
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(dst))  # torch made dst's stream wait for the copy
        holder["done"] = done
        return event_work(done, [dst])

    def exchange(self, ops):
        """Several copies at once each get their own pair of streams, so they can run concurrently."""
        import torch

        if sum(o[0] == "recv" for o in ops) <= 1:
            return super().exchange(ops)
        works: dict[int, Work] = {}
        for i, (kind, t, peer) in enumerate(ops):
            if kind == "send":
                works[i] = self.isend(t, peer)
        for i, (kind, out, src) in enumerate(ops):
            if kind != "recv":
                continue
            dst = out.device.index
            key = (src, dst, i)
            if key not in self._streams:
                self._streams[key] = (torch.cuda.Stream(src), torch.cuda.Stream(dst))
            ss, sd = self._streams[key]
            sd.wait_stream(torch.cuda.current_stream(dst))  # out is free to overwrite
            works[i] = self.irecv(out, src, streams=(ss, sd))
        return [works[i] for i in range(len(ops))]
