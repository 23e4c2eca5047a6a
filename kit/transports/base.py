"""What every transport shares: the interface (:class:`Transport`), its :class:`Capabilities`, the :class:`Work`
a send or receive returns, and the helpers to make and check the bytes of a message.

A transport's *capabilities* are what an experiment may ask about it -- never its name:

* ``copy_engine`` -- the bytes are moved by the GPU's DMA copy engines (a ``cudaMemcpy``), no SM is used;
  the copy is issued on the caller's current stream, so a caller that wants it to overlap compute gives it a
  stream of its own. Otherwise the transport runs kernels (NCCL) or host threads (gloo).
* ``in_process`` -- one process drives every endpoint: the endpoints are the GPUs of that process (rank 0),
  the caller issues both the send and the matching receive, and the other ranks have nothing to do. Otherwise
  the endpoints are ranks and each process issues its own side.
* ``needs_peer_access`` -- the GPUs must reach each other's memory (NVLink or PCIe peer-to-peer).
* ``second_channel`` -- :meth:`Transport.second_channel` opens a channel whose transfers do not queue behind
  this one's (a second communicator for NCCL/gloo; for copy engines another CUDA stream suffices).
* ``cuda`` -- needs a CUDA job (buffers on GPUs).
* ``blocking_send`` -- has a host-blocking :meth:`Transport.send` / :meth:`Transport.recv` besides
  ``isend``/``irecv`` (``torch.distributed``'s ``send``/``recv``).
* ``cross_node`` -- works between ranks on different hosts. :func:`kit.transports.make` refuses a transport
  without it, with one message naming the reason, when the ranks are on more than one node -- emulated nodes
  (``NCCL_HOSTID`` per agent, :mod:`kit.launch.emulated`) included.
* ``graph_capture`` -- its transfers can be captured into a CUDA graph together with the compute around them
  (on replay the host issues nothing per message): NCCL's kernels can. A transport that hands messages over
  on the host (the IPC mailbox's shared-memory counters) or drives several GPUs from one process cannot.
* ``device_handoff`` -- a receive is queued on the GPU and waits for its sender there, not on the host: its issue
  does not wait for the sender's (NCCL's kernels). A transport whose receive is handed over on the host (the IPC
  mailbox's counters, gloo's blocking receive, one thread that yields until a message is posted) has it False.

``Work.wait()`` has CUDA semantics on GPUs: it orders the caller's *current stream* after the transfer and does
not block the host (like ``ProcessGroupNCCL``'s ``work.wait()``); on CPU it blocks until done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar


class TransportUnavailable(RuntimeError):
    """This transport cannot run here (no CUDA, ranks on different hosts, one GPU, ...); the message says why."""


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do (see the module docstring); experiments branch on these, never on names."""

    copy_engine: bool = False
    in_process: bool = False
    needs_peer_access: bool = False
    second_channel: bool = True
    cuda: bool = False
    blocking_send: bool = False
    cross_node: bool = False
    graph_capture: bool = False
    device_handoff: bool = False


# ------------------------------------------------------------------------------------------------- Work
@dataclass
class Work:
    """One send or receive. ``wait()`` -- see the module docstring; ``done()`` polls without blocking."""

    _wait: Callable[[], None] | None = None
    _done: Callable[[], bool] | None = None
    _waited: bool = False

    def wait(self) -> None:
        if not self._waited and self._wait is not None:
            self._wait()
        self._waited = True

    def done(self) -> bool:
        return self._done() if self._done is not None else self._waited


def event_work(ev, devices) -> Work:
    """Work that orders the current streams of ``devices`` after CUDA event ``ev``."""
    import torch

    def wait():
        for d in devices:
            torch.cuda.current_stream(d).wait_event(ev)

    return Work(wait, ev.query)


def flat_bytes(t):
    """A dense uint8 view of ``t``'s elements in logical order (copying it first when it is strided; a
    one-element view can be "contiguous" with a stride that is not 1)."""
    import torch

    f = t.reshape(-1)
    if f.numel() and f.stride(0) != 1:
        f = torch.empty(f.shape, dtype=f.dtype, device=f.device).copy_(f)
    return f.view(torch.uint8)


def nbytes(t) -> int:
    return t.numel() * t.element_size()


class SideStreams:
    """CUDA streams a transport makes on first use and keeps, one per key: ``get(device, key)``. A transport that
    issues copies on streams of its own keys them by what must stay apart -- the caller's stream (so flows a
    caller puts on two streams stay on two: ``caps.second_channel``), a destination, an op of one call."""

    def __init__(self):
        self._streams: dict = {}

    def get(self, device, key):
        import torch

        index = device if isinstance(device, int) else device.index
        s = self._streams.get((index, key))
        if s is None:
            s = self._streams[(index, key)] = torch.cuda.Stream(index)
        return s


class on_stream:
    """Make CUDA stream ``s`` current on its device for a block (e.g. to allocate there), restoring that device's
    stream and the current device after. The same as ``with torch.cuda.stream(s)``, through the C calls that
    context manager ends in: one thread driving every stage allocates a receive buffer this way each step, and
    the Python around those calls costs it more than the calls (the probe in
    ``recorded/probes/p2p-host-h100x4/``)."""

    __slots__ = ("s", "prev", "dev")

    def __init__(self, s):
        self.s = s

    def __enter__(self):
        import torch

        s, C = self.s, torch._C
        self.dev = C._cuda_getDevice()
        self.prev = C._cuda_getCurrentStream(s.device_index)
        C._cuda_setStream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)
        return s

    def __exit__(self, *a):
        import torch

        C, (sid, idx, typ) = torch._C, self.prev
        C._cuda_setStream(stream_id=sid, device_index=idx, device_type=typ)  # switches to idx's device
        if self.dev != idx:
            C._cuda_setDevice(self.dev)
        return False


class current_streams:
    """Make the given CUDA streams current (each on its own device) for the duration of the block."""

    def __init__(self, streams):
        self.streams = [s for s in streams if s is not None]

    def __enter__(self):
        import torch

        self._ctxs = [torch.cuda.stream(s) for s in self.streams]
        for c in self._ctxs:
            c.__enter__()

    def __exit__(self, *a):
        for c in reversed(self._ctxs):
            c.__exit__(*a)
        return False


# ------------------------------------------------------------------------------------------------- Transport
class Transport:
    """One point-to-point transport (the interface every experiment uses)::

        w = T.isend(tensor, dst)        # returns a Work
        w = T.irecv(out, src)           # fills ``out`` (any shape/stride; same dtype and numel as sent)
        ws = T.exchange([("send", t, peer), ("recv", out, peer)])   # several at once, no ordering deadlock
        w.wait()                        # the transfer is complete for whatever the caller does next

    A subclass sets ``caps`` and is registered with ``@register("name")`` (:mod:`kit.transports.registry`),
    which also sets ``name``. Build one with :func:`kit.transports.make` (collective: every rank, same order).
    """

    name: ClassVar[str] = "?"
    caps: ClassVar[Capabilities] = Capabilities()

    def __init__(self, ctx, timeout_s: float = 300.0):
        self.ctx = ctx
        self.timeout_s = timeout_s

    @property
    def in_process(self) -> bool:
        return self.caps.in_process

    # -- where things are --------------------------------------------------------------------------
    def endpoints(self) -> int:
        """How many endpoints there are: the GPUs of this process (in-process) or the ranks."""
        if self.caps.in_process:
            import torch

            return torch.cuda.device_count()
        return self.ctx.world_size

    def device(self, endpoint: int):
        """Where a buffer of ``endpoint`` lives."""
        return self.ctx.device

    def sends(self, src: int) -> bool:
        """Does this process issue the send side of a transfer from ``src``?"""
        return self.ctx.rank == src

    def recvs(self, dst: int) -> bool:
        return self.ctx.rank == dst

    # -- setting up ----------------------------------------------------------------------------------
    @classmethod
    def unavailable(cls, ctx) -> str | None:
        """Why this transport cannot run in ``ctx`` as far as its capabilities tell (None: it may). Checked by
        :func:`kit.transports.make` on every rank before any constructor runs; a subclass's constructor raises
        :class:`TransportUnavailable` for what only it can tell."""
        if cls.caps.cuda and not ctx.is_cuda:
            return f"{cls.name} needs CUDA"
        if cls.caps.in_process and ctx.rank != 0:
            return None  # rank 0 drives every endpoint; the other ranks need nothing
        if not (cls.caps.cuda and (cls.caps.in_process or cls.caps.needs_peer_access)):
            return None
        import torch

        n = torch.cuda.device_count()
        if cls.caps.in_process and n < 2:
            return f"{cls.name} needs two GPUs visible to one process"
        if cls.caps.needs_peer_access:
            devs = range(n if cls.caps.in_process else min(n, ctx.world_size))
            bad = [(a, b) for a in devs for b in devs if a != b and not torch.cuda.can_device_access_peer(a, b)]
            if bad:
                return (f"{cls.name} needs peer access between the GPUs (copy engines write the peer's memory); "
                        f"GPU pairs without it: {bad}")
        return None

    def setup(self, pairs: list[tuple[int, int]], capacity: int) -> None:
        """Collective (every rank, same arguments): prepare directed ``pairs`` for messages up to
        ``capacity`` bytes. A no-op unless the transport keeps per-pair state (the IPC mailbox)."""

    def second_channel(self) -> "Transport":
        """A channel whose transfers do not queue behind this one's (collective). Default: this transport
        itself -- its copies are issued on the caller's stream, so another CUDA stream is another channel."""
        if not self.caps.second_channel:
            raise TransportUnavailable(f"{self.name} has no second channel")
        return self

    def poll(self, src: int, dst: int) -> bool:
        """Has a message from ``src`` to ``dst`` been posted? (Only meaningful in one process.)"""
        return True

    # -- moving bytes --------------------------------------------------------------------------------
    def isend(self, t, dst: int) -> Work:
        raise NotImplementedError

    def irecv(self, out, src: int) -> Work:
        raise NotImplementedError

    def send(self, t, dst: int) -> None:
        """Blocking send (``caps.blocking_send``)."""
        raise TransportUnavailable(f"{self.name} has no blocking send")

    def recv(self, out, src: int) -> None:
        """Blocking receive (``caps.blocking_send``)."""
        raise TransportUnavailable(f"{self.name} has no blocking receive")

    def exchange(self, ops: list[tuple[str, Any, int]]) -> list[Work]:
        """Post several sends/receives at once: sends first, then receives (so neighbours that both send and
        receive cannot wait on each other). Returns one Work per op, in the order given."""
        works: dict[int, Work] = {}
        for i, (kind, t, peer) in enumerate(ops):
            if kind == "send":
                works[i] = self.isend(t, peer)
        for i, (kind, t, peer) in enumerate(ops):
            if kind == "recv":
                works[i] = self.irecv(t, peer)
            elif kind != "send":
                raise ValueError(f"op must be 'send' or 'recv', not {kind!r}")
        return [works[i] for i in range(len(ops))]

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{self.name} transport, rank {self.ctx.rank}>"


# ------------------------------------------------------------------------------------------------- checking
def pattern(n: int, device, seq: int, src: int):
    """The bytes a verified message carries: position, sequence number and sender mixed, so a stale slot, a
    message from the wrong sender or a shifted copy all differ from what the receiver expects."""
    import torch

    base = (torch.arange(n, device=device, dtype=torch.int64) % 251).to(torch.uint8)
    return base.add_((seq * 31 + src * 7 + 1) % 256)


def check(out, expected, what: str) -> None:
    """Raise AssertionError unless ``out``'s bytes equal ``expected`` (a uint8 tensor)."""
    import torch

    got = flat_bytes(out)
    want = expected.reshape(-1).to(got.device)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError(f"{what}: received data differs from what was sent "
                             f"({len(bad)} of {got.numel()} bytes, first at byte {int(bad[0]) if len(bad) else -1})")
