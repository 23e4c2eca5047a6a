"""A small 1F1B pipeline over any :mod:`kit.transports` transport (the ``pipeline`` experiment that times it
is :mod:`.pipeline_run`).

``n`` stages (stage ``s`` on rank ``s``, or on GPU ``s`` of one process for the in-process ``copy``
transport), ``m`` micro-batches. Each stage is ``layers`` matrices ``W`` (hidden x hidden) applied as
``x = tanh(x @ W)``; the last stage's loss is ``sum_i mean(y_i ** 2) / m``. Weights and inputs come from seeded
generators, so any run -- any transport, any number of processes -- computes the same numbers, and
:func:`reference` recomputes them in one process for checking.

Schedule (:func:`schedule`): one-forward-one-backward. Stage ``s`` first runs ``min(n - s - 1, m)`` warm-up
forwards, then alternates forward/backward, then drains the remaining backwards, so at most ``n - s``
activations are alive per stage.

Communication follows Megatron-LM's pairing: the send that ends one step and the receive that starts the
next are posted together (``Transport.exchange``) when they go to the same neighbour -- "send activation to
the next stage + receive its gradient", "send gradient to the previous stage + receive its next activation".
With NCCL this matters: P2P operations between a pair of ranks run in one order on one stream, so if both
neighbours posted their *send* first as separate operations, each would wait for the other's receive
(for messages above NCCL's buffer size: a deadlock). Posted as one group they proceed together.

Drivers: :func:`drive` runs every stage of one process from one thread, taking turns; :func:`drive_threads`
gives each stage its own thread. The experiment that times them, and the CUDA-graph driver, are in
:mod:`.pipeline_run`.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterator


@dataclass
class CommStreams:
    """The communication streams of the stages of one process (device index -> CUDA stream).

    ``send``: a cross-process device's transfers; it waits for that device's compute when a transfer is posted
    (the data is produced there). ``recv``: where receive buffers are allocated and, for an in-process transport,
    where the receive's copy runs (``T.irecv(out, src, stream=...)``); it waits for nothing but each message's
    own send event, so a copy waits only for its data and its buffer -- not for what the receiving stage has
    queued since, nor for what the sending stage queued after the send (an in-process send is posted from the
    compute stream that produced it: it records an event there and nothing else). With one stream for both (as the kit had
    until 2026-11-23), a receive posted together with a send (Megatron's pairing) waited, through that stream,
    for the compute that produced the send's data; and a copy issued on the sender's stream waited for every
    later send the sender had posted before the receive came (the host driver posts the next gradient before
    the previous stage receives the last one). A cross-process transport posts a send and a receive of one
    device in one ``exchange`` on one current stream, so it gets one stream for both (:meth:`make` with
    ``separate=False``)."""

    send: dict
    recv: dict

    @classmethod
    def make(cls, devices, separate: bool) -> "CommStreams":
        import torch

        send = {d: torch.cuda.Stream(d) for d in devices}
        return cls(send, {d: torch.cuda.Stream(d) for d in devices} if separate else send)


def schedule(stage: int, n: int, m: int) -> list[tuple[str, int]]:
    """The 1F1B order of ("F", i) / ("B", i) steps for ``stage`` of ``n`` with ``m`` micro-batches."""
    if not (0 <= stage < n) or m < 1:
        raise ValueError(f"need 0 <= stage < n and m >= 1 (stage {stage}, n {n}, m {m})")
    warm = min(n - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    f = warm
    b = 0
    for _ in range(m - warm):
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops += [("B", i) for i in range(b, m)]
    return ops


def make_weights(stage: int, layers: int, hidden: int, device, dtype, seed: int = 0) -> list:
    import torch

    g = torch.Generator().manual_seed(10_000 + 97 * seed + stage)
    return [(torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)).to(device=device, dtype=dtype).requires_grad_()
            for _ in range(layers)]


def make_inputs(m: int, batch: int, hidden: int, device, dtype, seed: int = 0) -> list:
    import torch

    g = torch.Generator().manual_seed(20_000 + seed)
    return [torch.randn(batch, hidden, generator=g).to(device=device, dtype=dtype) for _ in range(m)]


def forward(weights, x):
    import torch

    for w in weights:
        x = torch.tanh(x @ w)
    return x


def loss_of(y, m: int):
    return y.float().pow(2).mean() / m


class Stage:
    """One stage's parameters and its part of an iteration (a generator: it yields only while waiting for a
    message that one process has not posted yet, which happens with in-process transports)."""

    def __init__(self, stage: int, n: int, layers: int, hidden: int, batch: int, m: int, device, dtype, seed: int = 0):
        self.stage, self.n, self.m = stage, n, m
        self.batch, self.hidden = batch, hidden
        self.device, self.dtype = device, dtype
        self.weights = make_weights(stage, layers, hidden, device, dtype, seed)
        self.inputs = make_inputs(m, batch, hidden, device, dtype, seed) if stage == 0 else None

    def _buffer(self, comm: CommStreams | None):
        """A receive buffer, allocated on this device's receive stream when there is one: the caching
        allocator then orders its reuse on that stream, and the copy into it need not wait for the compute
        this stage has queued (only the consumer, after ``Work.wait()``, uses it on the compute stream)."""
        import torch

        from ...transports import on_stream

        s = comm.recv.get(self.device.index) if comm is not None and self.device.type == "cuda" else None
        with on_stream(s) if s is not None else nullcontext():
            return torch.empty(self.batch, self.hidden, device=self.device, dtype=self.dtype)

    def zero_grad(self) -> None:
        for w in self.weights:
            w.grad = None

    def iteration(self, T, prev: int | None, nxt: int | None, comm_streams: CommStreams | None = None) -> Iterator[None]:
        """Run this stage's 1F1B steps for one iteration over transport ``T``; ``prev``/``nxt`` are the
        neighbouring endpoints. ``comm_streams``: post copy-engine transfers there, so they overlap this
        stage's compute (NCCL has its own stream). Leaves the loss (last stage) in ``self.loss`` and
        gradients in the weights."""
        import torch

        first, last = self.stage == 0, self.stage == self.n - 1
        acts_in, outs = {}, {}
        self.host_compute_s = 0.0  # the host's time inside this iteration's forward and backward calls
        self.loss = torch.zeros((), device=self.device, dtype=torch.float32)
        carry: list = []  # the send that ends the previous step, merged with the next receive if same peer
        sends = []
        kept = []  # receive buffers allocated on a comm stream and used on the compute stream: _release
        for kind, i in schedule(self.stage, self.n, self.m):
            recv = None
            if kind == "F" and not first:
                recv = ("recv", self._buffer(comm_streams), prev)
            elif kind == "B" and not last:
                recv = ("recv", self._buffer(comm_streams), nxt)
            if carry and recv and carry[0][2] != recv[2]:
                sends += yield from _issue(T, carry, comm_streams, self.stage)
                carry = []
            works = yield from _issue(T, carry + ([recv] if recv else []), comm_streams, self.stage)
            sends += works[:len(carry)]
            carry = []
            if recv:
                works[-1].wait()
                if comm_streams and self.device.type == "cuda":  # allocated on the comm stream, used here
                    kept.append(recv[1])
            h0 = time.perf_counter()
            with torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext():
                if kind == "F":
                    x = self.inputs[i] if first else recv[1].requires_grad_()
                    y = forward(self.weights, x)
                    acts_in[i] = x
                    if last:
                        loss = loss_of(y, self.m)
                        self.loss += loss.detach()
                        outs[i] = loss
                    else:
                        outs[i] = y
                        carry = [("send", y.detach(), nxt)]
                else:
                    y = outs.pop(i)
                    if last:
                        y.backward()
                    else:
                        y.backward(recv[1])
                    x = acts_in.pop(i)
                    if not first:
                        carry = [("send", x.grad, prev)]
            self.host_compute_s += time.perf_counter() - h0
        if carry:
            sends += yield from _issue(T, carry, comm_streams, self.stage)
        for w in sends:
            w.wait()
        self._release(kept, comm_streams)

    def _release(self, kept: list, comm: CommStreams | None) -> None:
        """Free the iteration's receive buffers safely without ``record_stream``: each was allocated on this
        device's receive stream (its memory goes back to that stream's pool) and read on the compute stream, all
        within the iteration; the receive stream first waits for the compute stream, so whatever it is given next
        -- the next iteration's buffers, written by their copies -- comes after every read. Kept to here instead of
        recorded on the compute stream as each arrives: the caching allocator frees a recorded block through an
        event that every later allocation on its device queries until it completes, and in the pipeline driven by
        one thread that made its next forward and backward calls dearer (FINDINGS.md, P2P transports, session 7).
        The cost: a stage holds its iteration's receive buffers (2m at most) to the iteration's end."""
        if kept:
            import torch

            comm.recv[self.device.index].wait_stream(torch.cuda.current_stream(self.device))
            kept.clear()


def _issue(T, ops, comm: CommStreams | None = None, me: int | None = None) -> Iterator[None]:
    """Post ``ops`` on ``T``; in one process (``T.caps.in_process``) post the sends, then yield until every receive
    has a posted message. A cross-process transport's ops are posted on the device's comm stream (``comm.send``,
    which first waits for the device's current stream: the data was produced there). In one process a send is
    posted from the stream its data was produced on (it only records an event there) and a receive's copy runs
    on the receiving device's receive stream (``irecv(..., stream=)``: it waits for nothing but its message's
    event; the buffer was allocated on that stream) -- no stream is made current, which costs a device switch
    and back per device in Python, twice per step of the one thread that may drive every stage.
    ``Work.wait()`` later orders the compute stream after them. Returns the Works (a generator's return value)."""
    if not ops:
        return []
    send, recv = (comm.send, comm.recv) if comm is not None else (None, None)
    if not T.caps.in_process:
        with _on_streams(ops, send):
            return T.exchange(ops)
    # one process: post the sends first (the neighbour's matching exchange may be waiting for them), then
    # yield until every receive's message is there
    works = {i: T.isend(t, p) for i, (k, t, p) in enumerate(ops) if k == "send"}
    recvs = [(i, t, p) for i, (k, t, p) in enumerate(ops) if k == "recv"]
    for _i, t, p in recvs:
        while not T.poll(p, me if me is not None else t.get_device()):
            yield
    for i, t, p in recvs:
        s = recv.get(t.device.index) if recv and t.is_cuda else None
        works[i] = T.irecv(t, p) if s is None else T.irecv(t, p, stream=s)
    return [works[i] for i in range(len(ops))]


def post_ops(T, ops, comm: CommStreams | None):
    """Post ``ops`` as the pipeline does (:func:`_issue`): a cross-process transport's in one ``exchange`` on the
    comm streams of the devices they touch (:class:`_on_streams`); an in-process transport's sends, then each receive
    on its device's receive stream, when every receive's message is posted by then (the sends among ``ops``). The
    Works in op order."""
    g = _issue(T, ops, comm)
    try:
        next(g)
    except StopIteration as done:
        return done.value
    raise RuntimeError("post_ops: a receive whose message is not posted (post its send first)")


class _on_streams:
    """Make the comm streams of the devices the ops touch current (after waiting, where a device sends, for its
    current stream) and tell the caching allocator the op tensors are used there. Only those devices: making a
    stream current is a Python context (a device switch and back) per device, and one thread driving every stage
    posts two such blocks per step."""

    def __init__(self, ops, streams):
        devs = {t.device.index for _k, t, _p in ops if t.is_cuda}
        self.ops, self.streams = ops, {d: s for d, s in (streams or {}).items() if d in devs}

    def __enter__(self):
        import torch

        from ...transports import current_streams

        # a comm stream waits for the compute of its device only where that device sends (the data is produced
        # there); a receive's buffer is allocated on the receive stream (Stage._buffer, CommStreams)
        for d in {t.device.index for k, t, _p in self.ops if k == "send" and t.is_cuda}:
            if d in self.streams:
                self.streams[d].wait_stream(torch.cuda.current_stream(d))
        for _, t, _p in self.ops:
            if t.is_cuda and t.device.index in self.streams:
                t.record_stream(self.streams[t.device.index])
        self._cur = current_streams(self.streams.values())
        self._cur.__enter__()

    def __exit__(self, *a):
        return self._cur.__exit__(*a)


def drive(programs: list[Iterator[None]], T=None, host: list | None = None) -> None:
    """Run stage generators to completion, round-robin (one process driving several stages). A stage yields
    only while its next message has not been posted. If a whole round passes in which no stage finished and
    ``T.posted`` (messages posted so far) did not grow, no stage can ever proceed: a schedule deadlock,
    raised as an error instead of spinning forever. ``host``: a list of one float per program, to which the
    host's seconds inside each program are added (the time between resuming it and its next yield: what
    issuing that stage's part of the iteration costs the thread)."""
    live = list(enumerate(programs))
    clock = time.perf_counter
    while live:
        before = getattr(T, "posted", None)
        n_live = len(live)
        for k, g in list(live):
            t0 = clock()
            try:
                next(g)
            except StopIteration:
                live.remove((k, g))
            if host is not None:
                host[k] += clock() - t0
        if live and len(live) == n_live and before is not None and T.posted == before:
            raise RuntimeError("pipeline: every stage is waiting for a message that no stage will post "
                               "(schedule deadlock)")


class one_core:
    """Keep every thread of this process -- and any it starts meanwhile -- on one CPU core for a block (``with
    one_core() as core``: the core the process may use that is idle the longest and interrupted the least over
    0.2 s on entry, :meth:`idlest`; or ``core``), then give each thread back the CPUs it had (a thread started in the
    block: the process's). For one thread that drives every stage (:func:`drive`): each forward and backward call
    hands work to other threads of the process and waits for them -- the autograd engine runs a backward on a worker
    thread per GPU -- and on some VMs a wake-up across cores costs that thread far more than a switch on its own
    core; on others it changes nothing, and on a core another process keeps busy it gains nothing (measured, host by
    host: FINDINGS.md, P2P transports). A no-op (``core`` None) where the OS has no thread affinity."""

    def __init__(self, core: int | None = None):
        self.want, self.core, self.saved = core, None, {}

    @staticmethod
    def cpu_times() -> dict[int, tuple[int, int]]:
        """{cpu: (idle ticks, all ticks)} from ``/proc/stat`` (empty where there is none). Read here, not through
        psutil: psutil is not a runtime dependency of the kit, and it has no per-CPU interrupt counts (below)."""
        out = {}
        try:
            with open("/proc/stat") as f:
                for line in f:
                    name, *ticks = line.split()
                    if name.startswith("cpu") and name[3:].isdigit():
                        t = [int(x) for x in ticks]
                        out[int(name[3:])] = (t[3] + (t[4] if len(t) > 4 else 0), sum(t))
        except (OSError, ValueError, IndexError):
            return {}
        return out

    @staticmethod
    def cpu_interrupts() -> dict[int, int]:
        """{cpu: interrupts served so far, every source summed} from ``/proc/interrupts`` (empty where there is
        none)."""
        out: dict[int, int] = {}
        try:
            with open("/proc/interrupts") as f:
                cpus = [int(c[3:]) for c in f.readline().split() if c.startswith("CPU") and c[3:].isdigit()]
                for line in f:
                    counts = line.split(":", 1)[-1].split()[:len(cpus)]
                    if len(counts) == len(cpus) and all(c.isdigit() for c in counts):
                        for cpu, c in zip(cpus, counts):
                            out[cpu] = out.get(cpu, 0) + int(c)
        except (OSError, ValueError):
            return {}
        return out

    @classmethod
    def idlest(cls, cores, wait_s: float = 0.2, times=None, interrupts=None) -> int:
        """The core of ``cores`` idle the longest over ``wait_s`` (``times``: a function returning
        :meth:`cpu_times`, called twice) and, of those within a tick of it, the one interrupted the least meanwhile
        (``interrupts``: :meth:`cpu_interrupts`; on an idle host most cores are idle every tick of the window, and
        a core that serves a device's or the timer's interrupts takes the driving thread's turns: FINDINGS.md, P2P
        transports), then the highest-numbered; core 0 only when it is the only one; the highest-numbered one
        where ``/proc/stat`` says nothing."""
        import time

        times, interrupts = times or cls.cpu_times, interrupts or cls.cpu_interrupts
        cores = sorted(cores)
        pool = [c for c in cores if c != 0] or cores
        a, ia = times(), interrupts()
        time.sleep(wait_s)
        b, ib = times(), interrupts()
        idle = {c: b[c][0] - a[c][0] for c in pool if c in a and c in b}
        if not idle:
            return pool[-1]
        most = max(idle.values())
        near = [c for c in idle if idle[c] >= most - 1]
        return min(near, key=lambda c: (ib.get(c, 0) - ia.get(c, 0), -c))

    @staticmethod
    def _threads() -> list[int]:
        import os

        try:
            return [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            return []

    def __enter__(self):
        import os

        if not hasattr(os, "sched_setaffinity") or not self._threads():
            return None
        self.process = os.sched_getaffinity(0)
        if self.want is not None and self.want not in self.process:
            raise ValueError(f"one_core: core {self.want} is not one this process may use ({sorted(self.process)})")
        self.core = self.idlest(self.process) if self.want is None else self.want
        for tid in self._threads():
            try:
                self.saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {self.core})
            except OSError:  # a thread that ended meanwhile
                pass
        return self.core

    def __exit__(self, *a):
        import os

        if self.core is not None:
            for tid in self._threads():
                try:
                    os.sched_setaffinity(tid, self.saved.get(tid, self.process))
                except OSError:
                    pass
        return False


def drive_threads(programs: list[Iterator[None]], T, devices: list, host: list | None = None) -> None:
    """Run stage generators to completion, one host thread per stage (the device-bound driver of an in-process
    transport): a stage's thread issues its kernels while the others issue theirs -- PyTorch releases the GIL
    while it dispatches an op and the autograd engine has a worker thread per GPU -- instead of one Python
    thread taking turns over every stage. A stage that yields (its next message is not posted yet) sleeps in
    ``T.wait_posted`` until some stage posts one. ``devices``: each stage's device (made current in its
    thread: the current device and stream are per thread). A stage that waits ``T.timeout_s`` without any
    message being posted is a schedule deadlock; an error in one stage stops the others and is raised.
    ``host``: as for :func:`drive` (here the thread's time in its stage, waits for the GIL included; not the
    sleeps between)."""
    import threading

    programs, devices = list(programs), list(devices)
    if len(programs) != len(devices):
        raise ValueError(f"drive_threads: {len(programs)} stage programs but {len(devices)} devices")
    failed = threading.Event()
    timeout = getattr(T, "timeout_s", 300.0)

    def run(k, g):
        clock = time.perf_counter
        while not failed.is_set():
            seen = T.posted
            t0 = clock()
            try:
                next(g)
            except StopIteration:
                return
            finally:
                if host is not None:
                    host[k] += clock() - t0
            waited = 0.0
            while not T.wait_posted(seen, 0.5):
                waited += 0.5
                if failed.is_set():
                    return
                if waited >= timeout:
                    raise RuntimeError(f"pipeline: a stage waited {timeout:g} s for a message no stage posted "
                                       "(schedule deadlock)")

    run_in_threads([lambda k=k, g=g: run(k, g) for k, g in enumerate(programs)], devices, on_error=failed.set,
                   name="stage")


def run_in_threads(fns: list, devices: list, on_error=None, name: str = "thread") -> list:
    """Call each of ``fns`` in its own host thread (named ``<name><i>``) with its device (``devices[i]``, or None)
    current in it -- the current device and stream are per thread -- and join them all; their return values in
    order. A thread that raises calls ``on_error()`` (so the others stop instead of waiting for it: set an event
    they poll, abort a barrier they wait at); the first error that is not a broken barrier (the one the failing
    thread left the others) is raised in the caller."""
    import threading

    import torch

    out: list = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i, fn, dev):
        try:
            if dev is not None and dev.type == "cuda":
                torch.cuda.set_device(dev)
            out[i] = fn()
        except BaseException as e:  # noqa: BLE001 -- raised again in the caller
            errors.append(e)
            if on_error is not None:
                on_error()

    threads = [threading.Thread(target=run, args=(i, fn, d), name=f"{name}{i}", daemon=True)
               for i, (fn, d) in enumerate(zip(fns, devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return out


def reference(n: int, layers: int, hidden: int, batch: int, m: int, device="cpu", dtype=None, seed: int = 0):
    """(loss, [per-stage list of weight gradients]) of the same model and data, in one process, no pipeline."""
    import torch

    dtype = dtype or torch.float32
    ws = [make_weights(s, layers, hidden, device, dtype, seed) for s in range(n)]
    xs = make_inputs(m, batch, hidden, device, dtype, seed)
    total = torch.zeros((), device=device)
    for x in xs:
        for s in range(n):
            x = forward(ws[s], x)
        loss = loss_of(x, m)
        loss.backward()
        total += loss.detach()
    return float(total), [[w.grad for w in stage] for stage in ws]
