"""``nccl`` and ``gloo``: ``torch.distributed`` point-to-point on a process group.

* ``nccl`` -- ``dist.isend``/``irecv`` (``exchange``: ``dist.batch_isend_irecv``, one NCCL group: sends and
  receives between the same ranks in opposite directions then cannot deadlock). NCCL's kernels run on SMs.
* ``gloo`` -- the same calls on CPU tensors (the default group when the job is gloo, else a gloo group): what
  the investigation runs on in CI.

The endpoint is the rank. Non-contiguous tensors are sent through a contiguous copy and received through a
contiguous buffer (NCCL needs contiguous memory). A *second channel* is a second communicator
(``dist.new_group``): a group runs its operations in one order, two groups run independently.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .base import Capabilities, Transport, TransportUnavailable, Work
from .registry import register


def _work(w, after: Callable[[], None] | None = None) -> Work:
    def wait():
        w.wait()
        if after is not None:
            after()

    return Work(wait, w.is_completed)


class DistTransport(Transport):
    """``torch.distributed`` send/recv on a process group (``group``: None = the default group)."""

    caps = Capabilities(copy_engine=False, in_process=False, needs_peer_access=False, second_channel=True,
                        cuda=False, blocking_send=True, cross_node=True)
    group_backend = "?"
    """the backend a second channel's group is created with"""

    def __init__(self, ctx, timeout_s: float = 300.0, group=None):
        super().__init__(ctx, timeout_s)
        self.group = group

    def second_channel(self) -> "DistTransport":
        """A new communicator (collective: every rank creates it)."""
        import torch.distributed as dist

        return type(self)(self.ctx, self.timeout_s, group=dist.new_group(backend=self.group_backend))

    def isend(self, t, dst: int) -> Work:
        import torch.distributed as dist

        return _work(dist.isend(t if t.is_contiguous() else t.contiguous(), dst, group=self.group))

    def irecv(self, out, src: int) -> Work:
        import torch.distributed as dist

        if out.is_contiguous():
            return _work(dist.irecv(out, src, group=self.group))
        tmp = out.new_empty(out.shape)
        return _work(dist.irecv(tmp, src, group=self.group), after=lambda: out.copy_(tmp))

    def send(self, t, dst: int) -> None:
        import torch.distributed as dist

        dist.send(t if t.is_contiguous() else t.contiguous(), dst, group=self.group)

    def recv(self, out, src: int) -> None:
        import torch.distributed as dist

        if out.is_contiguous():
            dist.recv(out, src, group=self.group)
        else:
            tmp = out.new_empty(out.shape)
            dist.recv(tmp, src, group=self.group)
            out.copy_(tmp)

    def exchange(self, ops):
        import torch.distributed as dist

        if not ops:
            return []
        p2p, fix = [], {}
        for i, (kind, t, peer) in enumerate(ops):
            if kind == "send":
                p2p.append(dist.P2POp(dist.isend, t if t.is_contiguous() else t.contiguous(), peer, group=self.group))
            elif kind == "recv":
                buf = t if t.is_contiguous() else t.new_empty(t.shape)
                if buf is not t:
                    fix[i] = (t, buf)
                p2p.append(dist.P2POp(dist.irecv, buf, peer, group=self.group))
            else:
                raise ValueError(f"op must be 'send' or 'recv', not {kind!r}")
        works = dist.batch_isend_irecv(p2p)
        if len(works) != len(ops):  # NCCL coalesces the whole batch into one Work: every op completes with it
            works = works[:1] * len(ops)
        return [_work(w, (lambda o=fix[i]: o[0].copy_(o[1])) if i in fix else None) for i, w in enumerate(works)]


@register("nccl")
class NcclTransport(DistTransport):
    """NCCL kernels on SMs move the bytes; one GPU per rank."""

    caps = dataclasses.replace(DistTransport.caps, cuda=True, graph_capture=True, device_handoff=True)
    group_backend = "nccl"

    def __init__(self, ctx, timeout_s: float = 300.0, group=None):
        if ctx.backend != "nccl":
            raise TransportUnavailable("nccl needs the job's backend to be NCCL (one GPU per rank)")
        super().__init__(ctx, timeout_s, group)


@register("gloo")
class GlooTransport(DistTransport):
    """CPU tensors over TCP (the job's group when it is gloo, else a gloo group of its own)."""

    group_backend = "gloo"  # caps: DistTransport's (no CUDA)

    def __init__(self, ctx, timeout_s: float = 300.0, group=None):
        import torch.distributed as dist

        if group is None and ctx.backend != "gloo":
            group = dist.new_group(backend="gloo")  # collective: every rank creates it
        super().__init__(ctx, timeout_s, group)

    def device(self, endpoint: int):
        import torch

        return torch.device("cpu")
