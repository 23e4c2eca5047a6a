"""``copy``: a peer copy between two GPUs of *one process* -- rank 0 drives every GPU of the node and the
endpoints are device indices.

The bytes move as one peer copy on the source device's stream: a *copy engine* moves them, no SM is used.
Because one process issues both sides, the send only posts the tensor; the matching receive (which knows the
destination) issues the copy, a ``cuMemcpyDtoDAsync`` (:func:`kit.transports.mailbox.peer_memcpy`) ordered by
events as described below. When one :meth:`CopyTransport.exchange` holds a send and its own receive (the
bandwidth loop), the copy is ``out.copy_(t)`` at once: one C++ call, whose barrier then orders exactly the
two streams the caller posted from.

Why not ``dst.copy_(src)`` for every message (the bare loop the investigation compares against): for a copy
between devices, ``copy_`` makes the source's current stream wait for the destination's current stream *and* the
destination's for the source's (a two-way barrier, ``copy_device_to_device`` in
``aten/src/ATen/native/cuda/Copy.cu``); in a pipeline the destination's current stream is the receiving stage's
compute. Here the copy waits only for the data and for the destination buffer (the receiver's current stream
*at the receive*), and only the stream that waits on the Work is ordered after it. The copy runs on the stream
the data was produced on, or on a stream the receive names, which then waits only for the event recorded at the
send: the pipeline (:class:`kit.investigations.p2p_transports.pipeline.CommStreams`) names the receiving GPU's
receive stream -- a stream the sender made wait for its *next* send would otherwise hold the copy back -- and
allocates the buffer there, so neither side's later compute delays a copy. Peer access is enabled once per pair,
both ways (a one-byte ``copy_``: PyTorch enables and caches it), so the copy goes over NVLink/PCIe peer-to-peer.

The buffers a copy reads and writes are kept alive by the transport until the host sees the copy's event done
(:class:`_InFlight`), not handed to the caching allocator with ``record_stream``: a block recorded on another
stream (here another GPU's) is freed through events that every later allocation on its device queries until they
complete, which makes the next forward and backward calls of a pipeline driven by one thread dearer on the host
(FINDINGS.md, P2P transports, session 7).

Thread-safe: one driver thread per GPU may send and receive at once (the pipeline's device-bound driver);
:meth:`wait_posted` lets such a thread sleep until a message is posted.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from .base import Capabilities, SideStreams, Transport, Work, flat_bytes, nbytes
from .mailbox import peer_memcpy
from .registry import register



class _Events:
    """Events for the copies' ordering: a fresh event per record. (A ring of reused events saved a little host
    time but was unsafe: an event a Work keeps could be recorded again on *another* stream before the Work is
    waited, and the wait would then order against the wrong point.)"""

    @staticmethod
    def record(stream):
        import torch

        ev = torch.cuda.Event()
        ev.record(stream)
        return ev


class _InFlight:
    """The tensors of the copies issued and not yet seen done: ``add(done, *tensors)`` after a copy, ``sweep()``
    drops, oldest first, every entry whose event has completed (``Event.query()``), up to the first that has not.
    A tensor is freed only once no copy reads or writes it any more, whichever stream it was allocated on and
    whichever streams the caller goes on to use, so the caching allocator may hand its memory out at once -- what
    ``record_stream`` guarantees, without the allocator's deferred free (an event per stream the block was recorded
    on, queried by every later allocation on its device until it completes). Safe from several threads: an entry
    is dropped only after its own event said done, and one taken off that has not is put back in front."""

    __slots__ = ("q",)

    def __init__(self):
        self.q = deque()

    def add(self, done, *tensors) -> None:
        self.q.append((done, tensors))

    def sweep(self) -> None:
        q = self.q
        while q:
            try:
                e = q.popleft()
            except IndexError:  # another thread took the last one
                return
            if not e[0].query():
                q.appendleft(e)
                return

    def __len__(self) -> int:
        return len(self.q)


@dataclass
class _Msg:
    t: object
    data: object  # t's bytes, dense (packed at the send, on the stream t was produced on, when t is strided)
    produced: object  # event on the stream the data was produced on, after the packing
    stream: object  # that stream
    done: object = None  # event after the copy (set by the receive)


@register("copy")
class CopyTransport(Transport):
    """Peer copies between GPUs of one process; endpoints are device indices; rank 0 drives them."""

    caps = Capabilities(copy_engine=True, in_process=True, needs_peer_access=True, second_channel=True, cuda=True)

    def __init__(self, ctx, timeout_s: float = 300.0):
        super().__init__(ctx, timeout_s)
        self._box: dict[tuple[int, int], deque] = {}
        self._cv = threading.Condition()
        self._events = _Events()
        self._peers: set[tuple[int, int]] = set()
        self._side = SideStreams()  # (source device, op) -> a stream for one of several copies in one call
        self._inflight = _InFlight()  # the buffers of copies not yet seen done (instead of record_stream)
        self.posted = 0  # messages posted so far (lets a driver detect a deadlock or sleep until one arrives)

    def device(self, endpoint: int):
        import torch

        return torch.device("cuda", endpoint)

    def sends(self, src: int) -> bool:
        return self.ctx.rank == 0

    recvs = sends

    def poll(self, src: int, dst: int) -> bool:
        return bool(self._box.get((src, dst)))

    def wait_posted(self, seen: int, timeout: float | None = None) -> bool:
        """Block until more than ``seen`` messages were posted (False on timeout)."""
        with self._cv:
            return self._cv.wait_for(lambda: self.posted > seen, timeout if timeout is not None else self.timeout_s)

    def _peer(self, src: int, dst: int) -> None:
        """Enable peer access between ``src`` and ``dst`` once, both ways: PyTorch enables (and caches) it on a
        first ``copy_`` between them, and peer access is one-directional (``cuCtxEnablePeerAccess``: "a separate
        symmetric call ... is required"), while a copy here may run on either GPU's stream (pushed by the
        sender's, or pulled by the receiver's)."""
        if (src, dst) not in self._peers:
            import torch

            for a, b in ((src, dst), (dst, src)):
                torch.empty(1, device=f"cuda:{b}").copy_(torch.zeros(1, device=f"cuda:{a}"))
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            self._peers |= {(src, dst), (dst, src)}

    def isend(self, t, dst: int) -> Work:
        """Posts ``t``; the copy itself is issued by the matching ``irecv`` (the destination is known then).
        The Work's ``wait()`` orders the source device's current stream after that copy (buffer reusable)."""
        import torch

        src = t.get_device()
        s = torch.cuda.current_stream(src)
        data = t if t.is_contiguous() else flat_bytes(t)  # a strided t is packed here, on the stream it was produced on
        msg = _Msg(t, data, self._events.record(s), s)
        with self._cv:
            self._box.setdefault((src, dst), deque()).append(msg)
            self.posted += 1
            self._cv.notify_all()
        return self._send_work(msg, src)

    def _send_work(self, msg: _Msg, src: int) -> Work:
        """``wait()`` orders the source's current stream after the copy -- once the receive has issued it. In one
        process a send whose receive is not posted yet has no copy to wait for, and waiting on the host would
        deadlock a driver that runs every stage from one thread: ``wait()`` then returns at once. The box keeps
        the tensor alive, then the copy's :class:`_InFlight` until the copy is done, so its memory is not reused
        early; the caller must not *write* to it until the receive is posted (the pipeline never does)."""
        import torch

        def wait():
            if msg.done is not None:
                torch.cuda.current_stream(src).wait_event(msg.done)

        return Work(wait, lambda: msg.done is not None and msg.done.query())

    def irecv(self, out, src: int, stream=None) -> Work:
        """Issues the copy of the oldest message posted from ``src`` to ``out``'s device, on the stream the
        data was produced on, after the receiver's current stream (``out`` may be overwritten from there) -- or on
        ``stream``, which then waits for nothing but the data (the event recorded at the send): the caller
        guarantees ``out`` may be written in that stream's order (the pipeline allocates it there), and a stream
        the sender has made wait for more since (its next send) cannot hold the copy back. The pipeline passes
        the receiver's receive stream (a copy engine of the receiving GPU pulls the bytes; peer access is
        enabled in that direction, see :meth:`_peer`). The Work's ``wait()`` orders the destination device's
        current stream after the copy."""
        dst = out.get_device()
        with self._cv:
            box = self._box.get((src, dst))
            if not box:
                raise RuntimeError(f"copy: receive {src}->{dst} posted before its send (one process drives both ends)")
            msg = box.popleft()
        return self._copy(msg, out, src, dst, stream)

    def _copy(self, msg: _Msg, out, src: int, dst: int, stream=None) -> Work:
        import torch

        t = msg.t
        if t.dtype != out.dtype or t.numel() != out.numel():
            raise ValueError(f"copy: sent {t.dtype}[{t.numel()}], receiving into {out.dtype}[{out.numel()}]")
        self._peer(src, dst)
        cur = None
        if stream is not None:  # the caller's stream, ordered for out by the caller: only the data to wait for
            s = stream
            s.wait_event(msg.produced)
        else:
            s = msg.stream
            cur = torch.cuda.current_stream(dst)
            if s != cur:  # out may be overwritten once the receiver's current stream got here
                s.wait_event(self._events.record(cur))
        into = out
        if not out.is_contiguous():  # a temporary from the receiver's current stream, written on s: s waits for it
            cur = cur if cur is not None else torch.cuda.current_stream(dst)
            into = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            if s != cur:
                s.wait_stream(cur)
        inflight = self._inflight
        inflight.sweep()
        peer_memcpy(into, msg.data, nbytes(t), s)
        msg.done = self._events.record(s)
        inflight.add(msg.done, msg.data, into)  # neither buffer is freed before the copy is done (no record_stream)
        if into is out:
            return _recv_work(msg.done, dst)
        cur.wait_event(msg.done)  # a strided destination: written from the copy on its device
        out.copy_(into)
        return _recv_work(self._events.record(cur), dst)

    def exchange(self, ops):
        """Sends and receives of one process at once. A receive whose matching send is in the same call is
        issued at once; several copies in one call get a side stream each (per source device and op), so they
        run concurrently on the copy engines."""
        import torch

        pair = self._pair(ops)
        if pair is not None:
            return pair
        works: dict[int, Work] = {}
        pending = []
        for i, (kind, t, peer) in enumerate(ops):
            if kind == "send":
                works[i] = self.isend(t, peer)
            elif kind == "recv":
                pending.append(i)
            else:
                raise ValueError(f"op must be 'send' or 'recv', not {kind!r}")
        side = len(pending) > 1
        for i in pending:
            _, out, src = ops[i]
            s = None
            if side:  # a stream of the source device per op; out may be written once the receiver got here
                s = self._side.get(src, i)
                s.wait_stream(torch.cuda.current_stream(out.device))
            works[i] = self.irecv(out, src, stream=s)
        return [works[i] for i in range(len(ops))]

    def _pair(self, ops) -> list[Work] | None:
        """The fast path for one send and its own receive in one call (both ends known at once, contiguous, as
        the bandwidth loop posts them): ``out.copy_(t)`` -- one C++ call, the peer copy on the source's
        current stream with its two-way barrier (see the module docstring), which here orders exactly the
        two streams the caller posted from. The Works only order a *different* current stream after those.
        At 1 KiB the host's bookkeeping is the message's whole cost: every Python-level CUDA call costs
        microseconds (the same transfer built from events and a ctypes memcpy cost several times the bare
        ``copy_`` loop), so the streams are kept as the ids ``torch.cuda.current_stream`` is built from, and a
        Stream object is made only when a wait needs one (an id is an order of magnitude cheaper than a Stream;
        the measured costs: ``recorded/probes/host-cost-h200/``; the C function that reads them is bound once,
        :func:`_current_id`, not imported per call)."""
        if len(ops) != 2:
            return None
        (k0, t, to), (k1, out, frm) = ops
        if k0 != "send" or k1 != "recv":
            return None
        src, dst = t.get_device(), out.get_device()  # -1 off the GPU
        if src < 0 or dst < 0 or to != dst or frm != src or src == dst or not (t.is_contiguous() and out.is_contiguous()):
            return None
        if self._box and self._box.get((src, dst)):  # an earlier send of this pair still waits for its receive
            return None
        if t.dtype != out.dtype or t.numel() != out.numel():
            raise ValueError(f"copy: sent {t.dtype}[{t.numel()}], receiving into {out.dtype}[{out.numel()}]")
        cur = _current_id.get
        streams = cur(src), cur(dst)
        out.copy_(t)
        return [_After(streams[0], src), _After(streams[1], dst)]


def _recv_work(done, dst: int) -> Work:
    import torch

    return Work(lambda: torch.cuda.current_stream(dst).wait_event(done), done.query)


class _CurrentId:
    """``_current_id.get(device)``: the current stream of ``device`` as (stream id, device index, device type) --
    what ``torch.cuda.current_stream`` reads before it builds a Stream object (``torch/cuda/__init__.py``), which
    the 1 KiB fast path skips. ``get`` is that C function itself, bound on first use: four reads per 1 KiB message,
    where an ``import torch`` inside a function costs ~0.1 us a call. The function is private (``torch._C``): a
    CPU test fails by its name if a torch release drops it."""

    def __getattr__(self, name):  # first use only: then ``get`` is an attribute of the instance
        if name != "get":
            raise AttributeError(name)
        import torch

        self.get = torch._C._cuda_getCurrentStream
        return self.get


_current_id = _CurrentId()


class _After(Work):
    """Work for a copy already ordered on the stream ``ids`` (:func:`_current_id`): a *different* current stream
    of ``device`` waits for it. A class rather than closures around a Work: two of these per 1 KiB message."""

    _wait = _done = None  # the dataclass fields (its repr and eq read them)

    def __init__(self, ids: tuple, device: int):
        self.ids, self.device, self._waited = ids, device, False

    def _stream(self):
        import torch

        ids = self.ids
        return torch.cuda.Stream(stream_id=ids[0], device_index=ids[1], device_type=ids[2])

    def wait(self) -> None:
        if not self._waited and _current_id.get(self.device) != self.ids:
            import torch

            torch.cuda.current_stream(self.device).wait_stream(self._stream())
        self._waited = True

    def done(self) -> bool:
        return self._stream().query()

