"""``ipc-direct``: the copy-engine transfer of ``ipc`` without the mailbox -- the sender's copy engine writes
straight into the receiver's destination tensor, so a receive runs nothing on the receiver's SMs.

``ipc`` and ``ipc-direct`` are the two classic protocols of a point-to-point transport (NCCL's *simple*/LL
buffered protocols vs a rendezvous): ``ipc`` is *eager* -- the sender copies into a slot of the receiver's
mailbox whenever a slot is free, and the receiver copies the slot out into its tensor (a device copy, on SMs);
``ipc-direct`` is a *rendezvous* -- the receiver first hands out where the message goes, then the sender copies
there once (a ``cuMemcpyDtoDAsync``, a copy engine) and nothing is copied again.

The handshake, per directed pair (sender ``a``, receiver ``b``): a :class:`Ring` of ``slots`` descriptors in a
shared-memory page with two counters, ``announced`` (written by ``b``) and ``posted`` (written by ``a``).

* ``irecv(out, a)`` on ``b`` -- message ``seq``: writes descriptor ``seq % slots`` (the 64-byte CUDA IPC handle
  of the allocation that holds ``out``, ``out``'s byte offset in it, its size), records the slot's *free*
  interprocess event on the current stream (``out`` may be written after this point) and sets
  ``announced = seq + 1``. The host waits only when the ring is full: the receive ``slots`` messages back has
  not been completed yet (its Work not waited): it completes that one first (below, on a private stream).
* ``isend(t, b)`` on ``a`` -- records a *produced* event on the current stream and returns at once. The send
  is *issued* as soon as its descriptor is announced -- right away, or later by the progress function, which
  every entry point runs (``isend``, ``irecv``, ``exchange``, every spin of ``Work.wait``/``done``, ``close``):
  on a side stream of this (destination, caller's stream), wait for *produced* and the receiver's *free* event,
  ``cuMemcpyDtoDAsync`` into (the mapped allocation + offset), record the slot's *ready* interprocess event,
  set ``posted = seq + 1``. The sender maps each allocation once (``cuIpcOpenMemHandle`` in its *own* GPU's
  context; :func:`kit.transports.mailbox.open_handle`) and keeps the mappings, least recently used first out,
  up to :data:`MAX_MAPPINGS`; ``close()`` unmaps them.
* the receiver's ``Work.wait()`` -- waits (host) until ``posted`` covers its message, checks the size the
  sender wrote, and makes the current stream wait on the *ready* event: no copy. A receive and a send of
  different sizes is one clear ``ValueError`` on both ranks.

What changes against ``ipc`` (and ``copy``):

* The sender's host never blocks in ``isend``, but its copy cannot start before the receiver has posted the
  matching ``irecv`` (a rendezvous); a sender that waits on its Work blocks its host until then (NCCL's
  ``send`` is the same: it completes only with its matching ``recv``). ``exchange`` posts every receive
  first, then the sends, so two neighbours exchanging cannot deadlock.
* The copy is issued on a side stream, not on the caller's: it waits for the caller's stream as it was at
  ``isend`` (the *produced* event), and ``Work.wait()`` orders the caller's stream after the copy. A second
  CUDA stream is a second channel (each caller stream gets its own side stream per destination).
* ``out`` must stay allocated until its Work was waited (as for NCCL); a non-contiguous ``out`` receives into
  a contiguous temporary and ``Work.wait()`` copies it into ``out`` (that copy runs on the receiver's SMs).
* ``setup(pairs, capacity)`` opens the rings; ``capacity`` is irrelevant: there are no slots of data.
* ``slots`` (an option of :func:`~kit.transports.make`, shared with ``ipc``) is the ring's depth: how many
  receives a receiver may post ahead of completing them.
* Buffers from ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` cannot be shared by ``cuIpcGetMemHandle``:
  such a receive is one clear error.

What to expect (measured numbers: FINDINGS.md, P2P transports, and ``recorded/NOTES.md``): beside compute it keeps
its time where ``ipc``'s copy-out competes for SMs, and both directions at once it keeps the bandwidth of one; small
messages both ways at once cost more per round than ``ipc``: each rank's send waits for the peer's announce, so the
host work of both ends adds up on every round.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from . import mailbox
from .base import Capabilities, SideStreams, Transport, Work, flat_bytes, nbytes
from .registry import register

HEADER_BYTES = 64  # announced, posted (int64 each), padded so the descriptors start on a cache line
MAX_MAPPINGS = 64  # opened peer allocations kept per transport (receivers' freed segments leave stale ones)


def _entry_dtype():
    import numpy as np

    return np.dtype([("handle", "u1", 64), ("offset", "<i8"), ("nbytes", "<i8"), ("sent", "<i8"), ("seq", "<i8")])


@dataclass(frozen=True)
class Descriptor:
    """Where message ``seq`` goes: the allocation (its CUDA IPC handle), the offset in it, the bytes expected."""

    seq: int
    handle: bytes
    offset: int
    nbytes: int


class Ring:
    """The descriptors of one directed pair in a shared-memory page: ``announced``/``posted`` counters, then
    ``slots`` entries (handle, offset, nbytes, sent, seq). The receiver writes entry ``seq % slots`` and then
    ``announced``; the sender reads it, and writes ``sent`` (its message's size) and then ``posted`` (x86
    keeps stores in order, as the ``ipc`` mailbox's counters rely on)."""

    def __init__(self, mm, slots: int):
        import numpy as np

        if self.size(slots) > len(mm):
            raise ValueError(f"a ring of {slots} descriptors needs {self.size(slots)} B, the page has {len(mm)}")
        self.mm, self.slots = mm, slots
        self.counters = np.frombuffer(mm, dtype=np.int64, count=2)
        self.entries = np.frombuffer(mm, dtype=_entry_dtype(), count=slots, offset=HEADER_BYTES)

    @staticmethod
    def size(slots: int) -> int:
        return HEADER_BYTES + slots * _entry_dtype().itemsize

    @property
    def announced(self) -> int:
        return int(self.counters[0])

    @property
    def posted(self) -> int:
        return int(self.counters[1])

    def announce(self, seq: int, handle: bytes, offset: int, n: int) -> None:
        """Receiver: descriptor of message ``seq`` (the next one), then ``announced``."""
        import numpy as np

        if seq != self.announced or seq - self.posted >= self.slots:
            raise RuntimeError(f"ring: cannot announce message {seq} (announced {self.announced}, "
                               f"posted {self.posted}, {self.slots} slots)")
        i, e = seq % self.slots, self.entries
        e["handle"][i] = np.frombuffer(handle, dtype=np.uint8)
        e["offset"][i], e["nbytes"][i], e["sent"][i], e["seq"][i] = offset, n, -1, seq
        self.counters[0] = seq + 1

    def descriptor(self, seq: int) -> Descriptor | None:
        """Sender: the descriptor of message ``seq``, None while the receiver has not announced it."""
        if self.announced <= seq:
            return None
        i, e = seq % self.slots, self.entries
        if int(e["seq"][i]) != seq:
            raise RuntimeError(f"ring: slot {i} holds message {int(e['seq'][i])}, expected {seq}")
        return Descriptor(seq, e["handle"][i].tobytes(), int(e["offset"][i]), int(e["nbytes"][i]))

    def post(self, seq: int, sent: int) -> None:
        """Sender: message ``seq`` (``sent`` bytes) is issued, its ready event recorded."""
        if seq != self.posted or seq >= self.announced:
            raise RuntimeError(f"ring: cannot post message {seq} (announced {self.announced}, posted {self.posted})")
        self.entries["sent"][seq % self.slots] = sent
        self.counters[1] = seq + 1

    def sent(self, seq: int) -> int | None:
        """Receiver: the size the sender issued for message ``seq`` (None: not posted yet)."""
        return int(self.entries["sent"][seq % self.slots]) if self.posted > seq else None

    def close(self) -> None:
        self.counters = self.entries = None
        try:
            self.mm.close()
        except BufferError:  # a numpy view still alive somewhere: the mapping goes with the process
            pass


def size_error(src: int, dst: int, seq: int, sent: int, wanted: int) -> str | None:
    """The one message for a send and a receive of different sizes (None when they match)."""
    if sent == wanted:
        return None
    return (f"ipc-direct: message {seq} from rank {src} to rank {dst} has {sent} B but rank {dst} posted a "
            f"receive of {wanted} B (a send and its receive must have the same size)")


# ------------------------------------------------------------------------------------------------- the two ends
@dataclass
class Send:
    """One send on the sender: queued until its descriptor is announced, then issued."""

    seq: int
    src: Any
    """the message's bytes (kept alive until issued; then ``record_stream`` on the side stream)"""
    nbytes: int
    produced: Any = None
    stream: Any = None
    done: Any = None
    issued: bool = False
    error: str | None = None


@dataclass
class Recv:
    """One receive on the receiver: announced, then completed (its ready event waited on)."""

    seq: int
    out: Any
    dst: Any
    """where the bytes land: ``out`` itself, or a contiguous temporary when ``out`` is strided"""
    nbytes: int
    arrived: Any = None
    """a local event, when the receive was completed on the private stream to free its ring slot"""
    completed: bool = False
    error: str | None = None


@dataclass
class End:
    """One end of a directed pair: the ring, the ready events (the sender's, recorded after its copies), the
    free events (the receiver's, recorded when it announces), the next sequence number."""

    peer: int
    ring: Ring
    ready: list
    free: list
    seq: int = 0


@dataclass
class SendEnd(End):
    """The sender's end, with the queue of sends whose descriptors have not been announced yet (issued strictly
    in order)."""

    queue: deque = field(default_factory=deque)

    def post(self, item: Send) -> None:
        self.queue.append(item)
        self.seq += 1

    def issuable(self):
        """The queued sends whose descriptors are announced, in order, with their descriptors."""
        while self.queue:
            d = self.ring.descriptor(self.queue[0].seq)
            if d is None:
                return
            yield self.queue.popleft(), d


@dataclass
class RecvEnd(End):
    """The receiver's end, with the receives not completed yet and a private stream to complete one early when
    its ring slot is needed."""

    stream: Any = None
    live: dict = field(default_factory=dict)

    def blocking(self) -> Recv | None:
        """The receive that must be completed before the next one can be announced (None: the ring has room)."""
        old = self.seq - self.ring.slots
        return self.live.get(old) if old >= 0 else None

    def announce(self, item: Recv, handle: bytes, offset: int) -> None:
        self.ring.announce(item.seq, handle, offset, item.nbytes)
        self.live[item.seq] = item
        self.seq += 1

    def complete(self, item: Recv) -> None:
        item.completed = True
        self.live.pop(item.seq, None)


def open_rings(ctx, pairs: set[tuple[int, int]], slots: int):
    """Collective: the rings and interprocess events of every directed pair. Returns ``({dst: SendEnd},
    {src: RecvEnd})`` for this rank. The receiver owns the page and the free events, the sender the ready
    events; handles travel by ``all_gather_object``; the pages are unlinked once both ends mapped them."""
    import torch
    import torch.distributed as dist

    me, dev = ctx.rank, ctx.device
    mine, keep = {}, {}
    with torch.cuda.device(dev):
        for a, b in sorted(pairs):
            for role, owner in (("recv", b), ("send", a)):
                if owner != me:
                    continue
                evs = [torch.cuda.Event(interprocess=True) for _ in range(slots)]
                page = None
                if role == "recv":
                    page = mailbox.shm_path(a, b)
                    keep[(role, a, b, "ring")] = Ring(mailbox.map_shared(page, True, Ring.size(slots)), slots)
                mine[(role, a, b)] = dict(events=[e.ipc_handle() for e in evs], page=page)
                keep[(role, a, b)] = evs
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    shared = {k: v for d in everyone for k, v in d.items()}

    def peer_events(key):
        with torch.cuda.device(dev):
            return [torch.cuda.Event.from_ipc_handle(dev, h) for h in shared[key]["events"]]

    out, inn = {}, {}
    for a, b in sorted(pairs):
        if b == me:
            inn[a] = RecvEnd(a, keep[("recv", a, b, "ring")], peer_events(("send", a, b)), keep[("recv", a, b)],
                             stream=torch.cuda.Stream(dev))
        if a == me:
            ring = Ring(mailbox.map_shared(shared[("recv", a, b)]["page"], False), slots)
            out[b] = SendEnd(b, ring, keep[("send", a, b)], peer_events(("recv", a, b)))
    dist.barrier()
    for a, b in sorted(pairs):
        if b == me:
            mailbox.unlink(shared[("recv", a, b)]["page"])
    return out, inn


# ------------------------------------------------------------------------------------------------- the transport
@register("ipc-direct")
class IpcDirectTransport(Transport):
    """Copy-engine transfers between processes of one node, straight into the receiver's tensor (rendezvous)."""

    caps = Capabilities(copy_engine=True, in_process=False, needs_peer_access=True, second_channel=True, cuda=True)

    def __init__(self, ctx, timeout_s: float = 300.0, slots: int = 16):
        super().__init__(ctx, timeout_s)
        mailbox.one_node(ctx, self.name)  # the same collective checks as ipc
        if slots < 1:
            raise ValueError(f"ipc-direct needs slots >= 1, got {slots}")
        self.slots = slots
        self._out: dict[int, SendEnd] = {}
        self._in: dict[int, RecvEnd] = {}
        self._pairs: set = set()
        self._maps: OrderedDict = OrderedDict()  # handle -> [base address here, last copy's event]
        self._side = SideStreams()  # (dst, caller stream) -> side stream

    def setup(self, pairs, capacity: int = 0) -> None:
        """Collective: rings for ``pairs`` (kept when they exist; otherwise every ring is reopened for the union
        of the pairs). ``capacity`` is not used: messages go straight to the receivers' tensors."""
        pairs = {(int(a), int(b)) for a, b in pairs}
        if pairs <= self._pairs:
            return
        pairs |= self._pairs
        self._close_rings()
        self._out, self._in = open_rings(self.ctx, pairs, self.slots)
        self._pairs = pairs

    # -- progress -------------------------------------------------------------------------------------------
    def _progress(self) -> None:
        """Issue every queued send whose descriptor has arrived."""
        for end in self._out.values():
            for item, d in end.issuable():
                self._issue(end, item, d)

    def _spin(self, cond: Callable[[], bool], what: str) -> None:
        def step():
            self._progress()
            return cond()

        mailbox.spin(step, self.timeout_s, f"ipc-direct rank {self.ctx.rank}: {what}")

    @staticmethod
    def _end(table, peer, role):
        end = table.get(peer)
        if end is None:
            raise RuntimeError(f"ipc-direct: no {role} ring with rank {peer}; call setup() with that pair first")
        return end

    def _check_tensor(self, t, what: str) -> None:
        if not t.is_cuda or t.device != self.ctx.device:
            raise ValueError(f"ipc-direct: the {what} tensor must be on this rank's GPU ({self.ctx.device}), "
                             f"not {t.device}")

    # -- sending ---------------------------------------------------------------------------------------------
    def isend(self, t, dst: int) -> Work:
        """Never blocks the host: the send is issued now if rank ``dst`` has posted its receive, else later."""
        import torch

        end = self._end(self._out, dst, "send")
        self._check_tensor(t, "send")
        caller = torch.cuda.current_stream(t.device)
        side = self._side.get(self.ctx.device, (dst, caller.cuda_stream))
        item = Send(end.seq, flat_bytes(t), nbytes(t), torch.cuda.Event(), side)
        item.produced.record(caller)
        end.post(item)
        self._progress()

        def wait():
            self._spin(lambda: item.issued, f"waiting for rank {dst} to post the receive of message {item.seq}")
            if item.error:
                raise ValueError(item.error)
            torch.cuda.current_stream(self.ctx.device).wait_event(item.done)

        def done():
            self._progress()
            return item.issued and (item.done is None or item.done.query())

        return Work(wait, done)

    def _issue(self, end: SendEnd, item: Send, d: Descriptor) -> None:
        import torch

        item.issued = True
        item.error = size_error(self.ctx.rank, end.peer, item.seq, item.nbytes, d.nbytes)
        if item.error:
            item.src = None
            end.ring.post(item.seq, item.nbytes)  # the receiver finds the size and raises the same error
            return
        slot, st = item.seq % self.slots, item.stream
        st.wait_event(item.produced)
        st.wait_event(end.free[slot])
        item.done = torch.cuda.Event()
        if item.nbytes:
            base = self._mapping(d.handle, item.done)
            mailbox.memcpy_dtod(base + d.offset, item.src.data_ptr(), item.nbytes, st)
            item.src.record_stream(st)
        end.ready[slot].record(st)
        item.done.record(st)
        item.src = None
        end.ring.post(item.seq, item.nbytes)

    def _mapping(self, handle: bytes, done) -> int:
        """The base address here of the peer allocation behind ``handle`` (opened once, then cached; the least
        recently used mapping is closed, after its last copy, beyond MAX_MAPPINGS)."""
        m = self._maps.get(handle)
        if m is None:
            m = self._maps[handle] = [mailbox.open_handle(handle, self.ctx.device), None]
            while len(self._maps) > MAX_MAPPINGS:
                self._unmap(*self._maps.popitem(last=False)[1])
        else:
            self._maps.move_to_end(handle)
        m[1] = done
        return m[0]

    def _unmap(self, ptr: int, last) -> None:
        if last is not None:
            last.synchronize()
        mailbox.close_handle(ptr, self.ctx.device)

    # -- receiving -------------------------------------------------------------------------------------------
    def irecv(self, out, src: int) -> Work:
        """Announces ``out`` to rank ``src`` (the host waits only when ``slots`` receives from ``src`` are
        announced and not completed); ``wait()`` orders the current stream after the arrival, copying nothing
        (unless ``out`` is strided)."""
        import torch

        end = self._end(self._in, src, "receive")
        self._check_tensor(out, "receive")
        self._progress()
        while (old := end.blocking()) is not None:
            self._arrive(end, old)
            end.stream.wait_event(end.ready[old.seq % self.slots])
            old.arrived = torch.cuda.Event()
            old.arrived.record(end.stream)
            end.complete(old)
        dst = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        item = Recv(end.seq, out, dst, nbytes(out))
        handle, offset = mailbox.export(dst) if item.nbytes else (bytes(64), 0)
        end.free[item.seq % self.slots].record(torch.cuda.current_stream(out.device))
        end.announce(item, handle, offset)
        self._progress()  # a send to the same peer may be waiting for its own descriptor

        def wait():
            stream = torch.cuda.current_stream(out.device)
            if item.error:
                raise ValueError(item.error)
            if not item.completed:
                self._arrive(end, item)
                stream.wait_event(end.ready[item.seq % self.slots])
                end.complete(item)
            else:
                stream.wait_event(item.arrived)
            if item.dst is not item.out:
                item.out.copy_(item.dst)
            item.dst = None

        def done():
            self._progress()
            if item.completed:
                return item.dst is None or (item.dst is item.out and item.arrived.query())
            return item.dst is item.out and end.ring.posted > item.seq and end.ready[item.seq % self.slots].query()

        return Work(wait, done)

    def _arrive(self, end: RecvEnd, item: Recv) -> None:
        """Wait (host, running progress) until the sender posted ``item``; raise if the sizes differ."""
        self._spin(lambda: end.ring.posted > item.seq, f"waiting for message {item.seq} from rank {end.peer}")
        err = size_error(end.peer, self.ctx.rank, item.seq, end.ring.sent(item.seq), item.nbytes)
        if err:
            item.error = err
            end.complete(item)
            raise ValueError(err)

    def exchange(self, ops: list[tuple[str, Any, int]]) -> list[Work]:
        """Every receive first (announced), then the sends: two neighbours exchanging cannot deadlock."""
        bad = [k for k, _, _ in ops if k not in ("send", "recv")]
        if bad:
            raise ValueError(f"op must be 'send' or 'recv', not {bad[0]!r}")
        works = {i: self.irecv(t, p) for i, (k, t, p) in enumerate(ops) if k == "recv"}
        works.update({i: self.isend(t, p) for i, (k, t, p) in enumerate(ops) if k == "send"})
        return [works[i] for i in range(len(ops))]

    # -- closing ---------------------------------------------------------------------------------------------
    def _close_rings(self) -> None:
        import torch

        self._progress()
        if self._out or self._in:
            torch.cuda.synchronize(self.ctx.device)
        for end in self._out.values():
            for item in end.queue:  # a receive that was never posted: its Work raises instead of hanging
                item.issued, item.error = True, (f"ipc-direct: closed before rank {end.peer} posted the receive "
                                                 f"of message {item.seq}")
            end.ring.close()
        for end in self._in.values():
            end.ring.close()
        self._out, self._in, self._pairs, self._side = {}, {}, set(), SideStreams()

    def close(self) -> None:
        self._close_rings()
        while self._maps:
            self._unmap(*self._maps.popitem(last=False)[1])


__all__ = ["Descriptor", "IpcDirectTransport", "Ring", "RecvEnd", "SendEnd", "open_rings", "size_error"]
