"""Point-to-point transports behind one interface: send a tensor from endpoint ``a`` to endpoint ``b`` and know
when it has arrived.

Every transport has the shape of ``torch.distributed``'s P2P API::

    w = T.isend(tensor, dst)        # returns a Work
    w = T.irecv(out, src)           # fills ``out`` (any shape/stride; same dtype and numel as what was sent)
    ws = T.exchange([("send", t, peer), ("recv", out, peer)])   # several at once, no ordering deadlock
    w.wait()                        # the transfer is complete for whatever the caller does next

``Work.wait()`` has CUDA semantics on GPUs: it orders the caller's *current stream* after the transfer and
does not block the host (like ``ProcessGroupNCCL``'s ``work.wait()``); on CPU it blocks until done.

Transports (``make(name, ctx)``; call it on every rank in the same order -- setting up is collective):

* ``copy`` -- ``dst.copy_(src)`` between two GPUs of *one process* (rank 0 drives every GPU of the node;
  endpoints are device indices). PyTorch enables peer access and, for contiguous tensors of one dtype, issues
  one ``cudaMemcpyAsync`` on the source device's current stream: a *copy engine* moves the bytes, no SM is
  used. PyTorch also makes the two devices' current streams wait for each other around the copy.
* ``ipc`` -- the same copy-engine transfer between *processes* of one node through CUDA IPC. At ``setup`` each
  receiver allocates a mailbox of ``slots`` buffers per sender and shares it through
  ``torch.multiprocessing.reductions`` (``cudaIpcGetMemHandle``); the sender maps it and ``copy_``-es into it.
  Completion travels as interprocess CUDA events (``cudaEventInterprocess``) plus two counters in a shared
  memory page: the sender records a *ready* event after its copy and bumps ``posted``; the receiver waits
  (host) until ``posted`` covers its message, makes its stream wait on that event, copies the slot into the
  caller's tensor (a local device copy, ~10x faster than the link), records a *consumed* event and bumps
  ``consumed``; a sender reuses a slot only after its stream waited on that slot's consumed event. So the
  host blocks only for flow control (all slots full) or until the peer has *issued* the matching call.
* ``nccl`` -- ``dist.isend``/``irecv`` (``exchange``: ``dist.batch_isend_irecv``, one NCCL group: sends and
  receives between the same ranks in opposite directions then cannot deadlock). NCCL's kernels run on SMs.
* ``gloo`` -- the same calls on CPU tensors (the default group when the job is gloo, else a gloo group):
  what the investigation runs on in CI.

The endpoint of ``ipc``/``nccl``/``gloo`` is the rank. Non-contiguous tensors are sent through a contiguous
copy and received through a contiguous buffer (NCCL needs contiguous memory; a strided peer copy would be an
SM kernel, not a copy engine).
"""

from __future__ import annotations

import mmap
import os
import socket
import tempfile
import time
import uuid
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

NAMES = ("copy", "ipc", "nccl", "gloo")
_SLOT_ALIGN = 512  # slot boundaries aligned for any dtype view and for full-speed copies
_SPIN_SLEEP_AFTER = 2000  # busy polls before yielding the CPU between polls (latency first, then be polite)


class TransportUnavailable(RuntimeError):
    """This transport cannot run here (no CUDA, ranks on different hosts, one GPU, ...); the message says why."""


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


def _event_work(ev, devices) -> Work:
    """Work that orders the current streams of ``devices`` after CUDA event ``ev``."""
    import torch

    def wait():
        for d in devices:
            torch.cuda.current_stream(d).wait_event(ev)

    return Work(wait, ev.query)


def _dist_work(w, after: Callable[[], None] | None = None) -> Work:
    def wait():
        w.wait()
        if after is not None:
            after()

    return Work(wait, w.is_completed)


def _flat_bytes(t):
    """A dense uint8 view of ``t``'s elements in logical order (copying it first when it is strided; a
    one-element view can be "contiguous" with a stride that is not 1)."""
    import torch

    f = t.reshape(-1)
    if f.numel() and f.stride(0) != 1:
        f = torch.empty(f.shape, dtype=f.dtype, device=f.device).copy_(f)
    return f.view(torch.uint8)


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


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


# ------------------------------------------------------------------------------------------------- base
class Transport:
    name = "?"
    in_process = False
    """True when one process drives both ends (``copy``): the caller issues the send and the receive."""

    def __init__(self, ctx, timeout_s: float = 300.0):
        self.ctx = ctx
        self.timeout_s = timeout_s

    def device(self, endpoint: int):
        """Where a buffer of ``endpoint`` lives."""
        return self.ctx.device

    def sends(self, src: int) -> bool:
        """Does this process issue the send side of a transfer from ``src``?"""
        return self.ctx.rank == src

    def recvs(self, dst: int) -> bool:
        return self.ctx.rank == dst

    def setup(self, pairs: list[tuple[int, int]], capacity: int) -> None:
        """Collective (every rank, same arguments): prepare directed ``pairs`` for messages up to
        ``capacity`` bytes. A no-op except for ``ipc``."""

    def poll(self, src: int, dst: int) -> bool:
        """Has a message from ``src`` to ``dst`` been posted? (Only meaningful in one process.)"""
        return True

    def isend(self, t, dst: int) -> Work:
        raise NotImplementedError

    def irecv(self, out, src: int) -> Work:
        raise NotImplementedError

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


# ------------------------------------------------------------------------------------------------- copy
class CopyTransport(Transport):
    """``copy_`` between GPUs of one process; endpoints are device indices; rank 0 drives them."""

    name = "copy"
    in_process = True

    def __init__(self, ctx, timeout_s: float = 300.0):
        import torch

        super().__init__(ctx, timeout_s)
        if not ctx.is_cuda:
            raise TransportUnavailable("copy needs CUDA")
        if torch.cuda.device_count() < 2:
            raise TransportUnavailable("copy needs two GPUs visible to one process")
        self._box: dict[tuple[int, int], deque] = {}
        self._streams: dict[tuple[int, int], tuple] = {}
        self.posted = 0  # messages posted so far (lets a cooperative driver detect a deadlock)

    def device(self, endpoint: int):
        import torch

        return torch.device("cuda", endpoint)

    def sends(self, src: int) -> bool:
        return self.ctx.rank == 0

    recvs = sends

    def peer_access(self, a: int, b: int) -> bool:
        import torch

        return bool(torch.cuda.can_device_access_peer(a, b))

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
        with (torch.cuda.stream(s_src) if streams else nullcontext()), (torch.cuda.stream(streams[1]) if streams else nullcontext()):
            if out.is_contiguous() and t.is_contiguous():
                out.view(-1).copy_(t.reshape(-1))
            else:
                out.copy_(t.contiguous().view(out.shape))
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(dst))  # torch made dst's stream wait for the copy
        holder["done"] = done
        return _event_work(done, [dst])

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


# ------------------------------------------------------------------------------------------------- ipc
@dataclass
class _Channel:
    peer: int
    slots: list  # slot tensors: on the receiver, its own memory; on the sender, the mapped remote memory
    ready: list  # interprocess events recorded by the sender after its copy
    consumed: list  # interprocess events recorded by the receiver after its copy-out
    counters: Any  # int64[2] in shared memory: posted, consumed
    mm: Any
    capacity: int
    seq: int = 0
    pending: deque = field(default_factory=deque)


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _map_counters(path: str, create: bool):
    import numpy as np

    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, mmap.PAGESIZE)
        mm = mmap.mmap(fd, mmap.PAGESIZE)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.int64, count=2), mm


_libcuda = None


def _peer_memcpy(dst, src, nbytes: int, stream) -> None:
    """``nbytes`` from ``src`` to ``dst`` (device pointers, any GPUs, peer access enabled) as one
    ``cuMemcpyDtoDAsync`` on ``stream``. Unlike ``dst.copy_(src)`` this queues nothing on the destination
    GPU in this process: ``copy_`` makes the destination device's current stream and the copy wait for each
    other, which for memory mapped from *another* process means work in this process's context on the peer
    GPU -- and a GPU time-slices between processes' contexts (~ms slices), so every copy would wait for the
    peer process's kernels (seen on 2xH200: 64 MiB copies taking 2.4 ms instead of 0.17 ms)."""
    import ctypes

    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    import torch

    with torch.cuda.device(stream.device):  # the stream's device context is the current one for the call
        rc = _libcuda.cuMemcpyDtoDAsync_v2(dst.data_ptr(), src.data_ptr(), nbytes, stream.cuda_stream)
    if rc != 0:
        raise RuntimeError(f"cuMemcpyDtoDAsync failed with CUresult {rc}")


class IpcTransport(Transport):
    """Copy-engine transfers between processes of one node through CUDA IPC (see the module docstring)."""

    name = "ipc"

    def __init__(self, ctx, timeout_s: float = 300.0, slots: int = 4):
        import torch
        import torch.distributed as dist

        super().__init__(ctx, timeout_s)
        if not ctx.is_cuda:
            raise TransportUnavailable("ipc needs CUDA")
        # collective checks first, so every rank reaches the same verdict
        hosts = [None] * ctx.world_size
        dist.all_gather_object(hosts, (socket.gethostname(), torch.cuda.device_count()))
        if len({h for h, _ in hosts}) > 1:
            raise TransportUnavailable("ipc needs every rank on one node (CUDA IPC does not cross hosts)")
        if min(n for _, n in hosts) < ctx.world_size:
            raise TransportUnavailable("ipc needs every GPU of the node visible to each rank "
                                       "(CUDA_VISIBLE_DEVICES restricts each rank to one)")
        self.slots = slots
        self._out: dict[int, _Channel] = {}  # dst -> channel (we send)
        self._in: dict[int, _Channel] = {}  # src -> channel (we receive)
        self._pairs: set = set()
        self._capacity = 0

    def setup(self, pairs, capacity: int) -> None:
        import torch
        import torch.distributed as dist
        from torch.multiprocessing.reductions import reduce_tensor

        pairs = {(int(a), int(b)) for a, b in pairs}
        capacity = -(-max(int(capacity), 1) // _SLOT_ALIGN) * _SLOT_ALIGN
        if pairs <= self._pairs and capacity <= self._capacity:
            return
        pairs |= self._pairs
        capacity = max(capacity, self._capacity)
        self.close()
        me, dev = self.ctx.rank, self.ctx.device
        mine: dict = {}
        keep: dict = {}
        for a, b in sorted(pairs):
            if b == me:  # receiver owns the mailbox, its consumed events and the counter page
                buf = torch.empty(self.slots * capacity, dtype=torch.uint8, device=dev)
                with torch.cuda.device(dev):
                    consumed = [torch.cuda.Event(interprocess=True) for _ in range(self.slots)]
                    handles = [e.ipc_handle() for e in consumed]
                path = os.path.join(_shm_dir(), f"kit-p2p-{os.getpid()}-{a}-{b}-{uuid.uuid4().hex[:8]}")
                ctr, mm = _map_counters(path, create=True)
                ctr[:] = 0
                _, args = reduce_tensor(buf)
                mine[("recv", a, b)] = dict(buf=args, consumed=handles, path=path)
                keep[("recv", a, b)] = (buf, consumed, ctr, mm, path)
            if a == me:  # sender owns the ready events
                with torch.cuda.device(dev):
                    ready = [torch.cuda.Event(interprocess=True) for _ in range(self.slots)]
                    handles = [e.ipc_handle() for e in ready]
                mine[("send", a, b)] = dict(ready=handles, device=dev.index)
                keep[("send", a, b)] = ready
        everyone = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, mine)
        shared = {k: v for d in everyone for k, v in d.items()}
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        for a, b in sorted(pairs):
            if b == me:
                buf, consumed, ctr, mm, path = keep[("recv", a, b)]
                with torch.cuda.device(dev):
                    ready = [torch.cuda.Event.from_ipc_handle(dev, h) for h in shared[("send", a, b)]["ready"]]
                slots = [buf[i * capacity:(i + 1) * capacity] for i in range(self.slots)]
                self._in[a] = _Channel(a, slots, ready, consumed, ctr, mm, capacity)
            if a == me:
                info = shared[("recv", a, b)]
                # Map the peer's mailbox into *our* GPU's context (argument 6 of torch's rebuild is the
                # device whose context opens the handle; cudaIpcOpenMemHandle enables peer access lazily).
                # Opened under the owner's device index instead, the mapping would belong to a context of
                # ours on the peer GPU, the driver would run our copies there, and that GPU would time-slice
                # between our context and the peer process's (seen on 2xH200: both directions at once fell
                # to 37 GB/s each way). The tensor reports our device; its memory is on GPU b.
                args = list(info["buf"])
                args[6] = dev.index
                try:
                    remote = rebuild_cuda_tensor(*args)
                except RuntimeError:  # a driver that will not map it here: the owner's device, as torch does
                    remote = rebuild_cuda_tensor(*info["buf"])
                with torch.cuda.device(dev):
                    consumed = [torch.cuda.Event.from_ipc_handle(dev, h) for h in info["consumed"]]
                ctr, mm = _map_counters(info["path"], create=False)
                slots = [remote[i * capacity:(i + 1) * capacity] for i in range(self.slots)]
                self._out[b] = _Channel(b, slots, keep[("send", a, b)], consumed, ctr, mm, capacity)
        dist.barrier()
        for key, v in keep.items():  # both ends have the page mapped: unlink now, nothing can leak
            if key[0] == "recv":
                try:
                    os.unlink(v[4])
                except OSError:
                    pass
        self._pairs, self._capacity = pairs, capacity

    def _spin(self, cond: Callable[[], bool], what: str) -> None:
        n, deadline = 0, None
        while not cond():
            n += 1
            if n > _SPIN_SLEEP_AFTER:
                time.sleep(0)
                if deadline is None:
                    deadline = time.monotonic() + self.timeout_s
                elif n % 1000 == 0 and time.monotonic() > deadline:
                    raise TimeoutError(f"ipc rank {self.ctx.rank}: {what} for {self.timeout_s:g} s")

    def _channel(self, table, peer, role):
        ch = table.get(peer)
        if ch is None:
            raise RuntimeError(f"ipc: no {role} channel with rank {peer}; call setup() with that pair first")
        return ch

    def isend(self, t, dst: int) -> Work:
        import torch

        ch = self._channel(self._out, dst, "send")
        n = _nbytes(t)
        if n > ch.capacity:
            raise ValueError(f"ipc: message of {n} B exceeds the mailbox slot ({ch.capacity} B); setup() a larger one")
        seq, slot = ch.seq, ch.seq % self.slots
        if seq >= self.slots:  # flow control: the receiver must have taken message seq - slots out of this slot
            self._spin(lambda: int(ch.counters[1]) > seq - self.slots, f"waiting for rank {dst} to free a slot")
        stream = torch.cuda.current_stream(t.device)
        stream.wait_event(ch.consumed[slot])
        src = _flat_bytes(t)
        _peer_memcpy(ch.slots[slot], src, n, stream)  # one cudaMemcpy on our stream: a copy engine
        ch.ready[slot].record(stream)
        ch.counters[0] = seq + 1
        ch.seq += 1
        done = torch.cuda.Event()
        done.record(stream)
        return _event_work(done, [t.device])

    def irecv(self, out, src: int) -> Work:
        ch = self._channel(self._in, src, "receive")
        item = {"out": out, "done": None}
        ch.pending.append(item)

        def wait():
            while item["done"] is None:  # complete earlier receives from src first (messages arrive in order)
                self._complete(ch, ch.pending[0])

        def done():
            return item["done"] is not None and item["done"].query()

        return Work(wait, done)

    def _complete(self, ch: _Channel, item: dict) -> None:
        import torch

        out = item["out"]
        seq, slot = ch.seq, ch.seq % self.slots
        self._spin(lambda: int(ch.counters[0]) > seq, f"waiting for message {seq} from rank {ch.peer}")
        n = _nbytes(out)
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
            ch.counters = None
            try:
                ch.mm.close()
            except BufferError:  # a numpy view still alive somewhere: the mapping goes with the process
                pass
        self._out.clear()
        self._in.clear()
        self._pairs, self._capacity = set(), 0


# ------------------------------------------------------------------------------------------------- nccl / gloo
class DistTransport(Transport):
    """``torch.distributed`` send/recv on a process group (NCCL on GPUs, gloo on CPU)."""

    def __init__(self, ctx, timeout_s: float = 300.0, group=None):
        super().__init__(ctx, timeout_s)
        self.group = group

    def isend(self, t, dst: int) -> Work:
        import torch.distributed as dist

        return _dist_work(dist.isend(t if t.is_contiguous() else t.contiguous(), dst, group=self.group))

    def irecv(self, out, src: int) -> Work:
        import torch.distributed as dist

        if out.is_contiguous():
            return _dist_work(dist.irecv(out, src, group=self.group))
        tmp = out.new_empty(out.shape)
        return _dist_work(dist.irecv(tmp, src, group=self.group), after=lambda: out.copy_(tmp))

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
        return [_dist_work(w, (lambda o=fix[i]: o[0].copy_(o[1])) if i in fix else None) for i, w in enumerate(works)]


class NcclTransport(DistTransport):
    name = "nccl"

    def __init__(self, ctx, timeout_s: float = 300.0, group=None):
        if ctx.backend != "nccl":
            raise TransportUnavailable("nccl needs the job's backend to be NCCL (one GPU per rank)")
        super().__init__(ctx, timeout_s, group)


class GlooTransport(DistTransport):
    name = "gloo"

    def __init__(self, ctx, timeout_s: float = 300.0, group=None):
        import torch.distributed as dist

        if group is None and ctx.backend != "gloo":
            group = dist.new_group(backend="gloo")  # collective: every rank creates it
        super().__init__(ctx, timeout_s, group)

    def device(self, endpoint: int):
        import torch

        return torch.device("cpu")


def make(name: str, ctx, timeout_s: float = 300.0, **kw) -> Transport:
    """The transport ``name`` for this rank. Collective: call on every rank in the same order. Raises
    :class:`TransportUnavailable` (on every rank alike) when it cannot run here."""
    if name == "copy":
        import torch.distributed as dist

        # decided on rank 0 (which drives the copies) and shared, so every rank skips or runs alike
        try:
            t = CopyTransport(ctx, timeout_s)
            why = None
        except TransportUnavailable as e:
            t, why = None, str(e)
        verdict = [why]
        if ctx.world_size > 1:
            dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is not None:
            raise TransportUnavailable(verdict[0])
        return t
    if name == "ipc":
        return IpcTransport(ctx, timeout_s, **kw)
    if name == "nccl":
        return NcclTransport(ctx, timeout_s, **kw)
    if name == "gloo":
        return GlooTransport(ctx, timeout_s, **kw)
    raise ValueError(f"unknown transport {name!r}; choose from {NAMES}")


# ------------------------------------------------------------------------------------------------- checking
def pattern(nbytes: int, device, seq: int, src: int):
    """The bytes a verified message carries: position, sequence number and sender mixed, so a stale slot, a
    message from the wrong sender or a shifted copy all differ from what the receiver expects."""
    import torch

    base = (torch.arange(nbytes, device=device, dtype=torch.int64) % 251).to(torch.uint8)
    return base.add_((seq * 31 + src * 7 + 1) % 256)


def check(out, expected, what: str) -> None:
    """Raise AssertionError unless ``out``'s bytes equal ``expected`` (a uint8 tensor)."""
    import torch

    got = _flat_bytes(out)
    want = expected.reshape(-1).to(got.device)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError(f"{what}: received data differs from what was sent "
                             f"({len(bad)} of {got.numel()} bytes, first at byte {int(bad[0]) if len(bad) else -1})")
