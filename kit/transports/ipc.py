"""``ipc``: the copy-engine transfer of ``copy`` between *processes* of one node, through the CUDA-IPC mailbox of
:mod:`kit.transports.mailbox` (slots in the receiver's memory, interprocess events, shared-memory counters).

The sender copies its tensor straight into a slot of the receiver's mailbox (``cuMemcpyDtoDAsync`` on its own
stream: a copy engine); the receiver copies the slot into the caller's tensor, a local device copy several times
faster than the link. That second copy is the price of a buffered transport (its pass over the GPU's memory can
also slow the link beside it: FINDINGS.md). One way it hides behind the next
message's transfer (it runs on the other GPU); both ways at once it did not: each rank's copy-out queued on the
stream that carries its own outgoing copy, so every round was the transfer *then* the copy-out. So a message of at least :data:`PIECE_MIN_BYTES` moves in pieces
(:func:`pieces`), each signalled by its own ready event, on a send stream of its own (one per caller stream, so
flows a caller puts on two streams stay on two, and a receive's copy-out -- on the caller's stream -- never queues
behind this rank's own outgoing pieces), and the receiver copies piece ``k`` out while piece ``k + 1`` crosses
the link: only the last piece's copy-out remains. Each piece is a quarter of the one before (3/4 of the message,
3/16, ..., the last :data:`TAIL_BYTES` or less): a piece's copy-out (a local copy, several times the link's rate)
still hides behind the next piece's transfer, and the pieces are few -- every boundary between two pieces costs the
link time of its own (the copy engine drains one copy before the next starts, and an interprocess event is
recorded between them), so 256 MiB moves in 3 pieces where halving took 7. The measurements behind these choices: FINDINGS.md, "P2P transports for pipeline
parallelism". (``ipc-direct`` has no second copy at all.) The endpoint is the rank.
"""

from __future__ import annotations

from typing import Callable

from . import mailbox
from .base import Capabilities, SideStreams, Transport, Work, event_work, flat_bytes, nbytes
from .registry import register

MAX_PIECES = 16  # ready events per mailbox slot: a message moves in at most this many pieces
PIECE_MIN_BYTES = 64 << 20  # below this a message moves whole: its copy-out is a small part of its transfer, while
# each piece costs the link a boundary (FINDINGS.md)
TAIL_BYTES = 16 << 20  # the pieces shrink down to this: the last piece's copy-out is what stays exposed
SHRINK = 4  # each piece is this many times smaller than the one before: its predecessor's copy-out (a local copy,
# several times the link's rate: FINDINGS.md) must fit in its transfer


def pieces(n: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the pieces an ``n``-byte message moves in (both ends compute the same): whole below
    :data:`PIECE_MIN_BYTES`; else each piece ``1 - 1/SHRINK`` of what is left (3/4 of the message, then 3/4 of the
    rest, ...) until the rest is at most :data:`TAIL_BYTES`, which is the last piece (at most :data:`MAX_PIECES`;
    boundaries aligned). 256 MiB: 192, 48 and 16 MiB."""
    if n < PIECE_MIN_BYTES:
        return [(0, n)]
    out, o = [], 0
    while n - o > TAIL_BYTES and len(out) < MAX_PIECES - 1:
        m = (n - o) * (SHRINK - 1) // SHRINK // mailbox.SLOT_ALIGN * mailbox.SLOT_ALIGN
        out.append((o, m))
        o += m
    return out + [(o, n - o)]


@register("ipc")
class IpcTransport(Transport):
    """Copy-engine transfers between processes of one node through CUDA IPC."""

    caps = Capabilities(copy_engine=True, in_process=False, needs_peer_access=True, second_channel=True, cuda=True)

    def __init__(self, ctx, timeout_s: float = 300.0, slots: int = 4):
        super().__init__(ctx, timeout_s)
        if not 1 <= slots <= mailbox.COUNTERS - 2:
            raise ValueError(f"ipc: slots must be 1..{mailbox.COUNTERS - 2} (got {slots})")
        mailbox.one_node(ctx, self.name)  # collective checks, so every rank reaches the same verdict
        self.slots = slots
        self._out: dict[int, mailbox.Channel] = {}  # dst -> channel (we send)
        self._in: dict[int, mailbox.Channel] = {}  # src -> channel (we receive)
        self._pairs: set = set()
        self._capacity = 0
        self._side = SideStreams()  # (device, caller stream) -> the send stream of pieced messages

    def setup(self, pairs, capacity: int) -> None:
        """Collective: mailboxes for ``pairs`` with slots of ``capacity`` bytes (kept when already large
        enough; otherwise every channel is reopened with the union of the pairs)."""
        pairs = {(int(a), int(b)) for a, b in pairs}
        capacity = -(-max(int(capacity), 1) // mailbox.SLOT_ALIGN) * mailbox.SLOT_ALIGN
        if pairs <= self._pairs and capacity <= self._capacity:
            return
        pairs |= self._pairs
        capacity = max(capacity, self._capacity)
        self.close()
        self._out, self._in = mailbox.open_channels(self.ctx, pairs, capacity, self.slots, MAX_PIECES)
        self._pairs, self._capacity = pairs, capacity

    def _spin(self, cond: Callable[[], bool], what: str) -> None:
        mailbox.spin(cond, self.timeout_s, f"ipc rank {self.ctx.rank}: {what}")

    @staticmethod
    def _channel(table, peer, role) -> mailbox.Channel:
        ch = table.get(peer)
        if ch is None:
            raise RuntimeError(f"ipc: no {role} channel with rank {peer}; call setup() with that pair first")
        return ch

    def isend(self, t, dst: int) -> Work:
        """Copies ``t`` into the peer's mailbox (a message of :data:`PIECE_MIN_BYTES` or more in pieces, on a
        send stream: then ``t`` is read *after* this call in stream order too, so it must not be written before
        the Work is waited -- the interface's rule for every transport). Blocks the host only while every slot
        to ``dst`` is full."""
        import torch

        ch = self._channel(self._out, dst, "send")
        n = nbytes(t)
        if n > ch.capacity:
            raise ValueError(f"ipc: message of {n} B exceeds the mailbox slot ({ch.capacity} B); setup() a larger one")
        seq, slot = ch.seq, ch.seq % self.slots
        if seq >= self.slots:  # flow control: the receiver must have taken message seq - slots out of this slot
            self._spin(lambda: int(ch.counters[1]) > seq - self.slots, f"waiting for rank {dst} to free a slot")
        cur = torch.cuda.current_stream(t.device)
        data = flat_bytes(t)  # a strided t is packed on the current stream, where it was produced
        parts = pieces(n)
        stream = cur if len(parts) == 1 else self._side.get(cur.device, cur.cuda_stream)
        if stream is not cur:  # the pieces go out on a send stream of their own, after the data was produced
            stream.wait_stream(cur)
            data.record_stream(stream)
        stream.wait_event(ch.consumed[slot])
        dst, src = ch.slots[slot].data_ptr(), data.data_ptr()
        for k, (o, m) in enumerate(parts):  # a cudaMemcpy per piece, each then signalled
            mailbox.memcpy_dtod(dst + o, src + o, m, stream)
            ch.ready[slot * MAX_PIECES + k].record(stream)
        ch.counters[2 + slot] = n  # the receiver checks its size against it (and so cuts the same pieces)
        ch.counters[0] = seq + 1
        ch.seq += 1
        done = torch.cuda.Event()
        done.record(stream)
        return event_work(done, [t.device])

    def irecv(self, out, src: int) -> Work:
        """Queues the receive; its ``wait()`` completes it (and every earlier receive from ``src``, messages
        arrive in order)."""
        ch = self._channel(self._in, src, "receive")
        item = {"out": out, "done": None}
        ch.pending.append(item)

        def wait():
            while item["done"] is None:
                self._complete(ch, ch.pending[0])

        def done():
            return item["done"] is not None and item["done"].query()

        return Work(wait, done)

    def _complete(self, ch: mailbox.Channel, item: dict) -> None:
        import torch

        out = item["out"]
        seq, slot = ch.seq, ch.seq % self.slots
        self._spin(lambda: int(ch.counters[0]) > seq, f"waiting for message {seq} from rank {ch.peer}")
        n, sent = nbytes(out), int(ch.counters[2 + slot])
        if n != sent:
            raise ValueError(f"ipc: rank {ch.peer} sent {sent} B, receiving into {n} B (message {seq})")
        stream = torch.cuda.current_stream(out.device)
        parts = pieces(n)
        if len(parts) > 1 and out.is_contiguous():  # piece k copied out while piece k + 1 crosses the link
            into, box = flat_bytes(out), ch.slots[slot]
            for k, (o, m) in enumerate(parts):
                stream.wait_event(ch.ready[slot * MAX_PIECES + k])
                into[o:o + m].copy_(box[o:o + m])
        else:
            stream.wait_event(ch.ready[slot * MAX_PIECES + len(parts) - 1])
            out.copy_(ch.slots[slot][:n].view(out.dtype).view(out.shape))
        ch.consumed[slot].record(stream)
        ch.counters[1] = seq + 1
        ch.seq += 1
        ev = torch.cuda.Event()
        ev.record(stream)
        item["done"] = ev
        ch.pending.popleft()

    def close(self) -> None:
        import torch

        if self._out or self._in:
            torch.cuda.synchronize(self.ctx.device)
        for ch in list(self._out.values()) + list(self._in.values()):
            ch.close()
        self._out.clear()
        self._in.clear()
        self._pairs, self._capacity = set(), 0
