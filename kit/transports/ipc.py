"""``ipc``: the copy-engine transfer of ``copy`` between *processes* of one node, through the CUDA-IPC mailbox of
:mod:`kit.transports.mailbox` (slots in the receiver's memory, interprocess events, shared-memory counters).

The sender copies its tensor straight into a slot of the receiver's mailbox (one ``cuMemcpyDtoDAsync`` on its
own stream: a copy engine); the receiver copies the slot into the caller's tensor, a local device copy about
10x faster than the link. The endpoint is the rank.
"""

from __future__ import annotations

from typing import Callable

from . import mailbox
from .base import Capabilities, Transport, Work, event_work, flat_bytes, nbytes
from .registry import register


@register("ipc")
class IpcTransport(Transport):
    """Copy-engine transfers between processes of one node through CUDA IPC."""

    caps = Capabilities(copy_engine=True, in_process=False, needs_peer_access=True, second_channel=True, cuda=True)

    def __init__(self, ctx, timeout_s: float = 300.0, slots: int = 4):
        super().__init__(ctx, timeout_s)
        mailbox.one_node(ctx, self.name)  # collective checks, so every rank reaches the same verdict
        self.slots = slots
        self._out: dict[int, mailbox.Channel] = {}  # dst -> channel (we send)
        self._in: dict[int, mailbox.Channel] = {}  # src -> channel (we receive)
        self._pairs: set = set()
        self._capacity = 0

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
        self._out, self._in = mailbox.open_channels(self.ctx, pairs, capacity, self.slots)
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
        import torch

        ch = self._channel(self._out, dst, "send")
        n = nbytes(t)
        if n > ch.capacity:
            raise ValueError(f"ipc: message of {n} B exceeds the mailbox slot ({ch.capacity} B); setup() a larger one")
        seq, slot = ch.seq, ch.seq % self.slots
        if seq >= self.slots:  # flow control: the receiver must have taken message seq - slots out of this slot
            self._spin(lambda: int(ch.counters[1]) > seq - self.slots, f"waiting for rank {dst} to free a slot")
        stream = torch.cuda.current_stream(t.device)
        stream.wait_event(ch.consumed[slot])
        mailbox.peer_memcpy(ch.slots[slot], flat_bytes(t), n, stream)  # one cudaMemcpy on our stream
        ch.ready[slot].record(stream)
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
        n = nbytes(out)
        if n > ch.capacity:
            raise ValueError(f"ipc: receive of {n} B exceeds the mailbox slot ({ch.capacity} B)")
        stream = torch.cuda.current_stream(out.device)
        stream.wait_event(ch.ready[slot])
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
