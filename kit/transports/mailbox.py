"""The CUDA-IPC mailbox the ``ipc`` transport sends through: per directed pair (sender ``a``, receiver ``b``) a
:class:`Channel` of ``slots`` buffers in the receiver's GPU memory, mapped into the sender's process.

At :func:`open_channels` (collective) each receiver allocates its mailbox and shares it through
``torch.multiprocessing.reductions`` (``cudaIpcGetMemHandle``); the sender maps it. Completion travels as
interprocess CUDA events (``cudaEventInterprocess``) plus two counters in a shared-memory page (``posted``,
``consumed``):

* the sender copies into slot ``seq % slots``, records that slot's *ready* event and sets ``posted = seq + 1``
  (a large message in pieces, a ready event after each);
* the receiver waits (host) until ``posted`` covers its message, makes its stream wait on the ready event,
  copies the slot out (piece by piece, each after its event), records the slot's *consumed* event and sets
  ``consumed = seq + 1``;
* a sender reuses a slot only after ``consumed`` passed it and its stream waited on that consumed event.

So the host blocks only for flow control (all slots full) or until the peer has *issued* the matching call.

It also holds what ``ipc-direct`` (:mod:`kit.transports.ipc_direct`) shares with ``ipc``: the one-node check
(:func:`one_node`), the host spin (:func:`spin`), shared pages (:func:`map_shared`) and the driver calls
(:func:`memcpy_dtod`, :func:`export` / :func:`open_handle` / :func:`close_handle` of CUDA IPC handles).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

SLOT_ALIGN = 512  # slot boundaries aligned for any dtype view and for full-speed copies


@dataclass
class Channel:
    """One direction between two ranks, as one end sees it."""

    peer: int
    slots: list
    """slot tensors: on the receiver, its own memory; on the sender, the mapped remote memory"""
    ready: list
    """interprocess events recorded by the sender after its copy (``chunks`` per slot: after each piece)"""
    consumed: list
    """interprocess events recorded by the receiver after its copy-out"""
    counters: Any
    """int64 words in shared memory: posted, consumed, one per slot (:func:`map_counters`)"""
    mm: Any
    capacity: int
    seq: int = 0
    pending: deque = field(default_factory=deque)

    def close(self) -> None:
        self.counters = None
        try:
            self.mm.close()
        except BufferError:  # a numpy view still alive somewhere: the mapping goes with the process
            pass


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def map_shared(path: str, create: bool, size: int = 0):
    """A shared-memory mapping of the file at ``path``: created (zero-filled, ``size`` bytes rounded up to whole
    pages) when ``create``, else the existing file mapped whole."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, -(-max(size, 1) // mmap.PAGESIZE) * mmap.PAGESIZE)
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


COUNTERS = mmap.PAGESIZE // 8  # int64 words in a counter page: posted, consumed, then one per slot (ipc: bytes sent)


def map_counters(path: str, create: bool):
    """The int64 words of the shared page at ``path`` (created, zeroed, when ``create``): ``[0]`` posted,
    ``[1]`` consumed, ``[2 + slot]`` free for the transport (ipc: the size of the message in that slot)."""
    import numpy as np

    mm = map_shared(path, create, mmap.PAGESIZE)
    return np.frombuffer(mm, dtype=np.int64, count=COUNTERS), mm


def shm_path(a: int, b: int) -> str:
    """A fresh name for the shared page of directed pair ``a -> b``."""
    return os.path.join(_shm_dir(), f"kit-p2p-{os.getpid()}-{a}-{b}-{uuid.uuid4().hex[:8]}")


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def one_node(ctx, name: str) -> None:
    """Collective: raise :class:`~kit.transports.base.TransportUnavailable` on every rank unless every rank is on
    one host and sees every GPU of it (CUDA IPC does not cross hosts; a peer's memory is addressed by its GPU)."""
    import socket

    import torch
    import torch.distributed as dist

    from .base import TransportUnavailable

    hosts = [None] * ctx.world_size
    dist.all_gather_object(hosts, (socket.gethostname(), torch.cuda.device_count()))
    if len({h for h, _ in hosts}) > 1:
        raise TransportUnavailable(f"{name} needs every rank on one node (CUDA IPC does not cross hosts)")
    if min(n for _, n in hosts) < ctx.world_size:
        raise TransportUnavailable(f"{name} needs every GPU of the node visible to each rank "
                                   "(CUDA_VISIBLE_DEVICES restricts each rank to one)")


SPIN_SLEEP_AFTER = 2000  # busy polls before yielding the CPU between polls (latency first, then be polite)


def spin(cond, timeout_s: float, what: str) -> None:
    """Poll ``cond()`` until it is true: busy at first (the peer is usually microseconds away), then yielding
    the CPU between polls; ``TimeoutError(what ...)`` after ``timeout_s`` of yielding."""
    n, deadline = 0, None
    while not cond():
        n += 1
        if n > SPIN_SLEEP_AFTER:
            time.sleep(0)
            if deadline is None:
                deadline = time.monotonic() + timeout_s
            elif n % 1000 == 0 and time.monotonic() > deadline:
                raise TimeoutError(f"{what} for {timeout_s:g} s")


_libcuda = None


def libcuda():
    """The CUDA driver library (ctypes), its entry points typed on first use."""
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        u64, p = ctypes.c_uint64, ctypes.POINTER
        lib.cuMemcpyDtoDAsync_v2.argtypes = [u64, u64, ctypes.c_size_t, ctypes.c_void_p]
        lib.cuMemGetAddressRange_v2.argtypes = [p(u64), p(ctypes.c_size_t), u64]
        lib.cuIpcGetMemHandle.argtypes = [p(IpcMemHandle), u64]
        lib.cuIpcOpenMemHandle_v2.argtypes = [p(u64), IpcMemHandle, ctypes.c_uint]
        lib.cuIpcCloseMemHandle.argtypes = [u64]
        _libcuda = lib
    return _libcuda


class IpcMemHandle(ctypes.Structure):
    """``CUipcMemHandle``: 64 opaque bytes, passed by value to ``cuIpcOpenMemHandle``."""

    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1


def _cu(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUresult {rc}")


def memcpy_dtod(dst: int, src: int, n: int, stream) -> None:
    """``n`` bytes between device addresses as one ``cuMemcpyDtoDAsync`` on ``stream`` (the stream's device
    context current for the call: switched to and back only when another device is current -- a
    ``torch.cuda.device`` block costs ~20 us of host time per call on a slow host, the call itself ~10)."""
    import torch

    C = torch._C  # torch.cuda.current_device / set_device are these calls behind Python argument handling
    idx, here = stream.device_index, C._cuda_getDevice()
    if idx != here:
        C._cuda_setDevice(idx)
    try:
        _cu(libcuda().cuMemcpyDtoDAsync_v2(dst, src, n, stream.cuda_stream), "cuMemcpyDtoDAsync")
    finally:
        if idx != here:
            C._cuda_setDevice(here)


def peer_memcpy(dst, src, n: int, stream) -> None:
    """``n`` bytes from ``src`` to ``dst`` (device pointers, any GPUs, peer access enabled) as one
    ``cuMemcpyDtoDAsync`` on ``stream``. Unlike ``dst.copy_(src)`` this queues nothing on the destination
    GPU in this process: ``copy_`` makes the destination device's current stream and the copy wait for each
    other, which for memory mapped from *another* process means work in this process's context on the peer
    GPU -- and a GPU time-slices between processes' contexts (~ms slices), so every copy would wait for the
    peer process's kernels (seen on 2xH200: 64 MiB copies taking 2.4 ms instead of 0.17 ms)."""
    memcpy_dtod(dst.data_ptr(), src.data_ptr(), n, stream)


def export(t) -> tuple[bytes, int]:
    """``(handle, offset)``: the 64-byte CUDA IPC handle of the allocation that holds tensor ``t``
    (``cuMemGetAddressRange`` finds its base: a caching-allocator segment, so many tensors share one handle)
    and ``t``'s byte offset in it. A new allocation gets a new handle, also at a reused address."""
    import torch

    lib, base, size, h = libcuda(), ctypes.c_uint64(), ctypes.c_size_t(), IpcMemHandle()
    with torch.cuda.device(t.device):
        _cu(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), t.data_ptr()),
            "cuMemGetAddressRange")
        rc = lib.cuIpcGetMemHandle(ctypes.byref(h), base.value)
    if rc != 0:
        raise RuntimeError(f"cuIpcGetMemHandle failed with CUresult {rc}: the receive buffer cannot be shared "
                           "through CUDA IPC (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True allocates it so)")
    return bytes(h), t.data_ptr() - base.value


def open_handle(handle: bytes, device) -> int:
    """Map the allocation behind ``handle`` (from :func:`export` in another process) into ``device``'s context
    of this process, enabling peer access lazily; returns its base address here. Opened in *our* GPU's context
    (not the owner's device index): see the comment in :func:`open_channels` for why that matters."""
    import torch

    h, ptr = IpcMemHandle.from_buffer_copy(handle), ctypes.c_uint64()
    with torch.cuda.device(device):
        _cu(libcuda().cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
            "cuIpcOpenMemHandle")
    return ptr.value


def close_handle(ptr: int, device) -> None:
    import torch

    with torch.cuda.device(device):
        _cu(libcuda().cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")


def open_channels(ctx, pairs: set[tuple[int, int]], capacity: int, slots: int, chunks: int = 1):
    """Collective: the mailboxes of every directed pair. Returns ``(out, inn)``: ``{dst: Channel}`` for the
    pairs this rank sends on, ``{src: Channel}`` for those it receives on. ``capacity``: bytes per slot
    (already aligned); ``chunks``: ready events per slot (``ready[slot * chunks + k]``: a message sent in
    pieces signals each)."""
    import torch
    import torch.distributed as dist
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    me, dev = ctx.rank, ctx.device
    mine: dict = {}
    keep: dict = {}
    for a, b in sorted(pairs):
        if b == me:  # receiver owns the mailbox, its consumed events and the counter page
            buf = torch.empty(slots * capacity, dtype=torch.uint8, device=dev)
            with torch.cuda.device(dev):
                consumed = [torch.cuda.Event(interprocess=True) for _ in range(slots)]
                handles = [e.ipc_handle() for e in consumed]
            path = shm_path(a, b)
            ctr, mm = map_counters(path, create=True)
            ctr[:] = 0
            _, args = reduce_tensor(buf)
            mine[("recv", a, b)] = dict(buf=args, consumed=handles, path=path)
            keep[("recv", a, b)] = (buf, consumed, ctr, mm, path)
        if a == me:  # sender owns the ready events
            with torch.cuda.device(dev):
                ready = [torch.cuda.Event(interprocess=True) for _ in range(slots * chunks)]
                handles = [e.ipc_handle() for e in ready]
            mine[("send", a, b)] = dict(ready=handles, device=dev.index)
            keep[("send", a, b)] = ready
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    shared = {k: v for d in everyone for k, v in d.items()}

    out: dict[int, Channel] = {}
    inn: dict[int, Channel] = {}
    for a, b in sorted(pairs):
        if b == me:
            buf, consumed, ctr, mm, path = keep[("recv", a, b)]
            with torch.cuda.device(dev):
                ready = [torch.cuda.Event.from_ipc_handle(dev, h) for h in shared[("send", a, b)]["ready"]]
            inn[a] = Channel(a, [buf[i * capacity:(i + 1) * capacity] for i in range(slots)], ready, consumed,
                             ctr, mm, capacity)
        if a == me:
            info = shared[("recv", a, b)]
            # Map the peer's mailbox into *our* GPU's context (argument 6 of torch's rebuild is the device whose
            # context opens the handle; cudaIpcOpenMemHandle enables peer access lazily). Opened under the
            # owner's device index instead, the mapping would belong to a context of ours on the peer GPU, the
            # driver would run our copies there, and that GPU would time-slice between our context and the peer
            # process's (seen on 2xH200: both directions at once fell to 37 GB/s each way). The tensor reports
            # our device; its memory is on GPU b.
            args = list(info["buf"])
            args[6] = dev.index
            try:
                remote = rebuild_cuda_tensor(*args)
            except RuntimeError:  # a driver that will not map it here: the owner's device, as torch does
                remote = rebuild_cuda_tensor(*info["buf"])
            with torch.cuda.device(dev):
                consumed = [torch.cuda.Event.from_ipc_handle(dev, h) for h in info["consumed"]]
            ctr, mm = map_counters(info["path"], create=False)
            out[b] = Channel(b, [remote[i * capacity:(i + 1) * capacity] for i in range(slots)],
                             keep[("send", a, b)], consumed, ctr, mm, capacity)
    dist.barrier()
    for key, v in keep.items():  # both ends have the page mapped: unlink now, nothing can leak
        if key[0] == "recv":
            unlink(v[4])
    return out, inn
