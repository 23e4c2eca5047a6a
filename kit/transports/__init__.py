"""Point-to-point transports behind one interface, chosen by capability: send a tensor from endpoint ``a`` to
endpoint ``b`` and know when it has arrived.

Every transport has the shape of ``torch.distributed``'s P2P API (:class:`Transport`)::

    T = make("ipc", ctx, slots=4)   # collective: every rank, same order; TransportUnavailable if it cannot run
    w = T.isend(tensor, dst)        # returns a Work
    w = T.irecv(out, src)           # fills ``out`` (any shape/stride; same dtype and numel as what was sent)
    ws = T.exchange([("send", t, peer), ("recv", out, peer)])   # several at once, no ordering deadlock
    w.wait()                        # the transfer is complete for whatever the caller does next
    T.caps.copy_engine              # what it can do (Capabilities): experiments ask this, never the name

The built-in transports, one module each:

==========  ==========================================================  ===========  ==========  =========================
name        who moves the bytes                                         copy engine  in process  module
==========  ==========================================================  ===========  ==========  =========================
copy        a peer ``cuMemcpyDtoDAsync`` between GPUs of one process    yes          yes         copy.py
ipc         a peer copy into the receiver's CUDA-IPC mailbox            yes          no          ipc.py, mailbox.py
ipc-direct  the sender's peer copy straight into the receiver's tensor  yes          no          ipc_direct.py, mailbox.py
            (rendezvous: the receive hands out its destination)
nccl        NCCL send/recv kernels on SMs                               no           no          dist.py
gloo        CPU threads over TCP (CPU tensors; CI)                      no           no          dist.py
==========  ==========================================================  ===========  ==========  =========================

A new transport is one class deriving :class:`Transport` with its :class:`Capabilities` and one
``@register("name")`` line (:mod:`kit.transports.registry`); import its module before :func:`make` asks for it.
"""

from __future__ import annotations

from .base import (Capabilities, SideStreams, Transport, TransportUnavailable, Work, check, current_streams,
                   event_work, flat_bytes, nbytes, on_stream, pattern)
from .registry import capabilities, get, make, names, register

# the built-in transports register themselves on import
from .copy import CopyTransport  # noqa: E402
from .ipc import IpcTransport  # noqa: E402
from .dist import DistTransport, GlooTransport, NcclTransport  # noqa: E402
from .ipc_direct import IpcDirectTransport  # noqa: E402

__all__ = ["Capabilities", "CopyTransport", "DistTransport", "GlooTransport", "IpcDirectTransport", "IpcTransport",
           "NcclTransport", "SideStreams", "Transport", "TransportUnavailable", "Work", "capabilities", "check",
           "current_streams", "event_work", "flat_bytes", "get", "make", "names", "nbytes", "on_stream", "pattern",
           "register"]
