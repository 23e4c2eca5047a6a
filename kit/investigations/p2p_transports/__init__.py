"""P2P transports for pipeline parallelism: peer copy vs CUDA IPC vs NCCL send/recv (vs gloo on CPU).

Every transport is a :mod:`kit.p2p` transport (one interface: ``isend``/``irecv``/``exchange`` and
``Work.wait()``), and every experiment below runs unchanged over each of them. Rows carry ``kind``:

* ``bandwidth`` -- one message of ``bytes`` from rank/GPU 0 to 1 (``direction`` ``one``), or one each way at
  once (``both``), ``iters`` messages per sample, CUDA events on each participating rank's stream (host
  clock on CPU), barrier-aligned samples. A sample's time is the slowest participant's (the receiver's
  stream ends when the data is there). ``copy_ loop`` is the reference: a bare ``dst.copy_(src)`` loop.
  ``matrix`` rows: every ordered GPU pair at ``matrix_bytes`` when the node has more than two.
* ``comm_comm`` -- two flows from 0 (to receivers 1 and 2, or both to 1 on a two-GPU node), issued on one
  stream / one NCCL communicator (``one_stream``) or on two streams / two communicators (``two_streams``);
  ``time_us`` is each flow's completion from the common start. Scenario ``small_behind_big``: a small
  message issued after a large one -- on one NCCL communicator it cannot finish before the large one.
* ``comm_compute`` -- ``compute_matmuls`` bf16 matmuls (``compute_n``^3) on a compute stream, and
  ``overlap_messages`` transfers of ``overlap_bytes`` 0 -> 1 on a communication stream: alone and together.
  ``compute_us`` per GPU (``device``; with ``copy`` rank 0 drives and computes on every GPU), ``comm_us``
  (ranks that take part), ``total_us``. One overlapped iteration per CUDA transport is also profiled
  (``traces/``) for the timeline.

Timing uses :class:`Sync` as its ``ctx``: for ``copy`` the ranks that drive nothing wait in a host barrier,
never in an NCCL kernel on a GPU the driving process uses (see its docstring for why that matters).
* ``semantics`` -- what blocks the host: rank 1 posts its receive ``recv_delay_ms`` late; each rank records
  the host time inside the call (``call_us``), inside ``wait()`` (``wait_us``), until the device is known done
  (``done_us``, a ``synchronize``) and the stream time (``device_us``, events around call + wait).
* ``pipeline`` -- a 1F1B pipeline (:mod:`kit.pipeline`) over the transport: wall-clock per iteration from a
  barrier to every GPU idle, the loss and each stage's gradient norm (equal across transports).
* ``skipped`` -- a transport or experiment that cannot run here, with the reason.

Sizes are bytes of a uint8 message (the transports are dtype-agnostic); bandwidth is ``bytes / time`` per
direction (``total_gbps`` counts both directions).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ... import timing, transports as p2p
from ..collectives import _human, sizes as size_range
from ...config import LaunchConfig

PARTS = ("bandwidth", "comm_comm", "comm_compute", "semantics", "pipeline")
DIRECTIONS = ("one", "both")
BARE = "copy_ loop"  # the reference transport name in rows


@dataclass
class Config(LaunchConfig):
    transports: list[str] = field(default_factory=lambda: ["copy", "ipc", "nccl", "gloo"])
    """Any of copy, ipc, nccl, gloo; those that cannot run here are skipped with the reason."""
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    """which experiments to run: any of bandwidth, comm_comm, comm_compute, semantics, pipeline"""
    min_bytes: int = 1024
    max_bytes: int = 1 << 30
    directions: list[str] = field(default_factory=lambda: ["one", "both"])
    iters: int = 10
    """messages per sample (back to back)"""
    repeats: int = 10
    """samples per point"""
    warmup: int = 3
    verify: bool = False
    """check every transfer's data at the receiver (timings then include the check); otherwise the first
    transfer of every point is checked"""
    matrix_bytes: int = 256 << 20
    flow_bytes: int = 64 << 20
    small_bytes: int = 64 << 10
    compute_n: int = 8192
    compute_matmuls: int = 3
    overlap_bytes: int = 64 << 20
    overlap_messages: int = 16
    semantics_bytes: list[int] = field(default_factory=lambda: [64 << 10, 64 << 20])
    recv_delay_ms: float = 20.0
    """semantics: the receiver posts its receive this late"""
    pipeline_micro_batches: int = 8
    pipeline_layers: int = 4
    """per stage"""
    pipeline_hidden: int = 4096
    pipeline_batch: int = 2048
    """rows per micro-batch: an activation is batch x hidden"""
    pipeline_steps: int = 5
    dtype: str = "bfloat16"
    """compute and pipeline dtype on GPUs (CPU runs use float32)"""
    ipc_slots: int = 4
    """ipc mailbox slots per sender (flow control: the sender waits when all are in use)"""
    profile: bool = True
    """profile one overlapped comm_compute iteration per CUDA transport (the timeline)"""

    def check(self) -> list[str]:
        errs = []
        bad = [t for t in self.transports if t not in p2p.NAMES]
        if bad:
            errs.append(f"unknown transport(s) {bad}; choose from {list(p2p.NAMES)}")
        bad = [e for e in self.parts if e not in PARTS]
        if bad:
            errs.append(f"unknown part(s) {bad}; choose from {list(PARTS)}")
        bad = [d for d in self.directions if d not in DIRECTIONS]
        if bad:
            errs.append(f"unknown direction(s) {bad}; choose from {list(DIRECTIONS)}")
        if self.min_bytes < 1 or self.max_bytes < self.min_bytes:
            errs.append(f"need 1 <= min_bytes <= max_bytes (got {self.min_bytes}, {self.max_bytes})")
        for k in ("iters", "repeats", "compute_n", "compute_matmuls", "overlap_messages", "pipeline_micro_batches",
                  "pipeline_layers", "pipeline_hidden", "pipeline_batch", "pipeline_steps", "ipc_slots",
                  "matrix_bytes", "flow_bytes", "small_bytes", "overlap_bytes"):
            if getattr(self, k) < 1:
                errs.append(f"{k} must be >= 1 (got {getattr(self, k)})")
        if self.warmup < 0 or self.recv_delay_ms < 0:
            errs.append("warmup and recv_delay_ms must be >= 0")
        if any(b < 1 for b in self.semantics_bytes):
            errs.append(f"semantics_bytes must be >= 1 (got {self.semantics_bytes})")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            errs.append(f"dtype {self.dtype!r} not one of bfloat16, float16, float32")
        return errs

    def check_world(self, world: int) -> list[str]:
        if world < 2:
            return [f"P2P needs at least 2 ranks (world_size {world})"]
        return []


# ----------------------------------------------------------------------------------------------- helpers
class Sync:
    """The ``ctx`` an experiment times transport ``T`` with: rank and device as ``ctx``, ``is_cuda`` when the
    transport's buffers are on GPUs, and a ``barrier`` that fits the transport.

    For an in-process transport (``copy``) the ranks other than 0 have nothing to do, and they must not wait
    in an NCCL barrier: that kernel would spin on their GPU, and a GPU time-slices between processes'
    contexts (slices of ~ms), so the driving process's work on that GPU -- the events ``copy_`` records
    on the destination device -- would wait for the slice (seen on 2xH200: every copy 2 ms late). They wait
    in a gloo (host) barrier instead, and rank 0 synchronises every GPU it drives."""

    def __init__(self, ctx, in_process: bool, cuda: bool, host_group=None):
        import torch

        self._ctx, self.rank, self.world_size, self.device = ctx, ctx.rank, ctx.world_size, ctx.device
        self.is_cuda = bool(cuda)
        self.host = in_process and host_group is not None
        self._group = host_group
        if not self.is_cuda:
            self.devices = []
        elif in_process:  # rank 0 drives every GPU of the node; the other ranks drive none
            self.devices = [torch.device("cuda", d) for d in range(torch.cuda.device_count())] if ctx.rank == 0 else []
        else:
            self.devices = [ctx.device]

    def sync(self) -> None:
        import torch

        for d in self.devices:
            torch.cuda.synchronize(d)

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.host:
            self.sync()
            dist.barrier(group=self._group)
        else:
            self._ctx.barrier()
            self.sync()


def sync_for(T, ctx, host_group=None) -> Sync:
    return Sync(ctx, T.in_process, ctx.is_cuda and T.device(0).type == "cuda", host_group)


def _endpoints(T, ctx) -> int:
    import torch

    return torch.cuda.device_count() if T.in_process else ctx.world_size


def _buffers(T, flows, seq0: int = 0):
    """Per flow (src, dst, nbytes): the send buffer where this process sends, the receive buffer where it
    receives (uint8; filled with the verification pattern of message ``seq0``)."""
    import torch

    bufs = []
    for src, dst, n in flows:
        b = {}
        if T.sends(src):
            b["send"] = p2p.pattern(n, T.device(src), seq0, src)
        if T.recvs(dst):
            b["recv"] = torch.empty(n, dtype=torch.uint8, device=T.device(dst))
        bufs.append(b)
    return bufs


def _ops(T, flows, bufs, only=None):
    ops = []
    for k, ((src, dst, _), b) in enumerate(zip(flows, bufs)):
        if only is not None and k != only:
            continue
        if "send" in b:
            ops.append(("send", b["send"], dst))
        if "recv" in b:
            ops.append(("recv", b["recv"], src))
    return ops


def _post(T, ops):
    if not ops:
        return []
    if len(ops) == 1:
        kind, t, peer = ops[0]
        return [T.isend(t, peer) if kind == "send" else T.irecv(t, peer)]
    return T.exchange(ops)


def _join(T, ctx, flows) -> None:
    """In one process, make this rank's current stream wait for every device a flow touched (so events on
    it time the whole transfer)."""
    import torch

    if T.in_process and ctx.is_cuda:
        main = torch.cuda.current_stream(ctx.device)
        for d in {d for f in flows for d in f[:2]}:
            if d != ctx.device.index:
                main.wait_stream(torch.cuda.current_stream(d))


def transfer(T, ctx, flows, bufs) -> None:
    """This process's part of one round of ``flows`` (every message posted at once, then waited for)."""
    for w in _post(T, _ops(T, flows, bufs)):
        w.wait()
    _join(T, ctx, flows)


def verified_transfer(T, ctx, flows, bufs, seq: int) -> None:
    """One round whose data is checked at every receiver against the pattern of message ``seq``."""
    for (src, dst, n), b in zip(flows, bufs):
        if "send" in b:
            b["send"].copy_(p2p.pattern(n, b["send"].device, seq, src))
    transfer(T, ctx, flows, bufs)
    for (src, dst, n), b in zip(flows, bufs):
        if "recv" in b:
            p2p.check(b["recv"], p2p.pattern(n, b["recv"].device, seq, src),
                      f"{T.name} {src}->{dst} {n} B message {seq}")


def _participates(T, flows) -> bool:
    return any(T.sends(a) or T.recvs(b) for a, b, _ in flows)


# ----------------------------------------------------------------------------------------------- run
def run(cfg: Config, ctx):
    """The rank function: every transport (collectively set up) through every experiment."""
    import torch

    import torch.distributed as dist

    torch.manual_seed(0)
    # a host-side barrier for in-process transports (see Sync); collective, so created on every rank
    host_group = dist.new_group(backend="gloo") if ctx.is_cuda and ctx.world_size > 1 else None
    for name in cfg.transports:
        ctx.step(f"set up {name}")
        try:
            T = p2p.make(name, ctx, cfg.timeout_s, **({"slots": cfg.ipc_slots} if name == "ipc" else {}))
        except p2p.TransportUnavailable as e:
            yield dict(kind="skipped", transport=name, reason=str(e), rank=ctx.rank)
            continue
        T.sync = sync_for(T, ctx, host_group)
        try:
            for exp in cfg.parts:
                ctx.step(f"{name} {exp}")
                yield from EXPERIMENT_FNS[exp](cfg, ctx, T)
        finally:
            ctx.sync()
            T.close()
    if "bandwidth" in cfg.parts and "copy" in cfg.transports and ctx.is_cuda and torch.cuda.device_count() >= 2:
        yield from _bare_copy(cfg, ctx, Sync(ctx, True, True, host_group))


def _verify_or_time(cfg, ctx, T, flows, keys, kind="bandwidth"):
    bufs = _buffers(T, flows)
    verified_transfer(T, ctx, flows, bufs, seq=0)  # always: the first transfer of every point is checked
    if cfg.verify:
        seq = [1]

        def fn():
            verified_transfer(T, ctx, flows, bufs, seq[0])
            seq[0] += 1
    else:
        def fn():
            transfer(T, ctx, flows, bufs)
    s = timing.measure(fn, T.sync, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup)
    if not _participates(T, flows):
        return []
    return [dict(r, kind=kind) for r in s.rows(**keys, verified=cfg.verify)]


def _bandwidth(cfg: Config, ctx, T):
    n_end = _endpoints(T, ctx)
    matrix = n_end > 2
    pairs = [(0, 1), (1, 0)] + ([(a, b) for a in range(n_end) for b in range(n_end) if a != b] if matrix else [])
    T.setup(pairs, max(cfg.max_bytes, cfg.matrix_bytes if matrix else 0))
    for direction in cfg.directions:
        for n in size_range(cfg.min_bytes, cfg.max_bytes):
            ctx.step(f"{T.name} {direction} {_human(n)}")
            flows = [(0, 1, n)] + ([(1, 0, n)] if direction == "both" else [])
            keys = dict(transport=T.name, direction=direction, src=0, dst=1, bytes=n, iters=cfg.iters,
                        world_size=ctx.world_size, backend=ctx.backend)
            yield from _verify_or_time(cfg, ctx, T, flows, keys)
            _free(ctx)
    if matrix:
        for a, b in pairs[2:]:
            ctx.step(f"{T.name} matrix {a}->{b}")
            keys = dict(transport=T.name, direction="one", src=a, dst=b, bytes=cfg.matrix_bytes, iters=cfg.iters,
                        world_size=ctx.world_size, backend=ctx.backend)
            yield from _verify_or_time(cfg, ctx, T, [(a, b, cfg.matrix_bytes)], keys, kind="matrix")


def _free(ctx) -> None:
    if ctx.is_cuda:
        import torch

        torch.cuda.empty_cache()


def _bare_copy(cfg: Config, ctx, S):
    """The reference for ``copy``: a bare ``dst.copy_(src)`` loop from GPU 0 to GPU 1 in rank 0."""
    import torch

    for n in size_range(cfg.min_bytes, cfg.max_bytes):
        ctx.step(f"{BARE} {_human(n)}")
        if ctx.rank == 0:
            src = p2p.pattern(n, torch.device("cuda", 0), 0, 0)
            dst = torch.empty(n, dtype=torch.uint8, device="cuda:1")
            fn = lambda: dst.copy_(src)  # noqa: E731
        else:
            fn = lambda: None  # noqa: E731
        s = timing.measure(fn, S, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup)
        if ctx.rank == 0:
            yield from (dict(r, kind="bandwidth") for r in s.rows(
                transport=BARE, direction="one", src=0, dst=1, bytes=n, iters=cfg.iters,
                world_size=ctx.world_size, backend=ctx.backend, verified=False))
            del src, dst
        _free(ctx)


# ----------------------------------------------------------------------------------------------- comm-comm
def _second_channel(T, ctx):
    """What 'a second stream' means per transport: NCCL and gloo need a second communicator (one group
    runs its operations in one order); copy and ipc just use another CUDA stream."""
    import torch.distributed as dist

    if T.name == "nccl":
        return p2p.NcclTransport(ctx, T.timeout_s, group=dist.new_group(backend="nccl"))
    if T.name == "gloo":
        return p2p.GlooTransport(ctx, T.timeout_s, group=dist.new_group(backend="gloo"))
    return T


def _comm_comm(cfg: Config, ctx, T):
    import torch

    n_end = _endpoints(T, ctx)
    r1, r2 = 1, (2 if n_end > 2 else 1)
    T.setup([(0, r1), (0, r2)], cfg.flow_bytes)
    T2 = _second_channel(T, ctx)
    cuda = T.sync.is_cuda
    scenarios = {"two_flows": [(0, r1, cfg.flow_bytes), (0, r2, cfg.flow_bytes)],
                 "small_behind_big": [(0, r1, cfg.flow_bytes), (0, r2, cfg.small_bytes)]}
    streams = {}
    if cuda:
        devs = sorted({ctx.device.index} | ({0, r1, r2} if T.in_process else set()))
        streams = {k: {d: torch.cuda.Stream(d) for d in devs} for k in (0, 1)}
    for scen, flows in scenarios.items():
        bufs = _buffers(T, flows)
        verified_transfer(T, ctx, flows, bufs, seq=0)
        for mode in ("one_stream", "two_streams"):
            ctx.step(f"{T.name} comm_comm {scen} {mode}")
            chans = [T, T2 if mode == "two_streams" else T]
            for sample in range(-max(cfg.warmup, 1), cfg.repeats):  # >= 1: a new communicator starts lazily
                times = _flows_once(ctx, chans, flows, bufs, streams, mode, cuda)
                if sample < 0:
                    continue
                for k, t in times.items():
                    yield dict(kind="comm_comm", transport=T.name, scenario=scen, mode=mode, flow=k,
                               src=flows[k][0], dst=flows[k][1], bytes=flows[k][2], sample=sample, time_us=t,
                               world_size=ctx.world_size)
        del bufs
    if T2 is not T:
        T2.close()


def _flows_once(ctx, chans, flows, bufs, streams, mode, cuda) -> dict[int, float]:
    """Post every flow, each on its channel/stream; return {flow: completion time from the start (us)} for
    the flows this process takes part in."""
    import torch

    T = chans[0]
    mine = [k for k, (a, b, _) in enumerate(flows) if T.sends(a) or T.recvs(b)]
    T.sync.barrier()
    if not cuda:
        t0 = time.perf_counter()
        works = {k: _post(chans[k], _ops(T, flows, bufs, only=k)) for k in mine}
        # gloo's send/recv Works learn they are complete only inside wait(): one waiting thread per flow
        done: dict[int, float] = {}

        def finish(k):
            for w in works[k]:
                w.wait()
            done[k] = (time.perf_counter() - t0) * 1e6

        threads = [threading.Thread(target=finish, args=(k,)) for k in works]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return done
    main = torch.cuda.current_stream(ctx.device)
    start = torch.cuda.Event(enable_timing=True)
    start.record(main)
    for k in (0, 1):
        for d, s in streams[k].items():
            s.wait_stream(torch.cuda.current_stream(d))
    ends = {}
    for k in mine:
        lane = streams[k if mode == "two_streams" else 0]
        with p2p.current_streams(lane.values()):
            for w in _post(chans[k], _ops(T, flows, bufs, only=k)):
                w.wait()
            if T.in_process:
                for d, s in lane.items():
                    if d != ctx.device.index:
                        lane[ctx.device.index].wait_stream(s)
            e = torch.cuda.Event(enable_timing=True)
            e.record(lane[ctx.device.index])
            ends[k] = e
    for k in (0, 1):
        main.wait_stream(streams[k][ctx.device.index])
    T.sync.sync()
    return {k: start.elapsed_time(e) * 1e3 for k, e in ends.items()}


# ----------------------------------------------------------------------------------------------- comm-compute
def _compute_dtype(cfg, ctx):
    import torch

    return getattr(torch, cfg.dtype) if ctx.is_cuda else torch.float32


def _comm_compute(cfg: Config, ctx, T):
    """Compute alone, transfers alone, both at once (see the module docstring). The process that drives a
    GPU computes on it: with ``copy`` rank 0 computes on every GPU, the other ranks idle on the host."""
    import torch

    T.setup([(0, 1)], cfg.overlap_bytes)
    S = T.sync
    cuda = S.is_cuda
    dt = _compute_dtype(cfg, ctx)
    if T.in_process:  # the driving process computes on every GPU it drives; the others stay off the GPUs
        comp_devs = S.devices
    else:
        comp_devs = [ctx.device] if ctx.is_cuda else [torch.device("cpu")]
    g = torch.Generator().manual_seed(1)
    mats = {}
    for d in comp_devs:
        mats[d] = (torch.randn(cfg.compute_n, cfg.compute_n, generator=g).to(d, dt),
                   torch.randn(cfg.compute_n, cfg.compute_n, generator=g).to(d, dt))
    flows = [(0, 1, cfg.overlap_bytes)]
    bufs = _buffers(T, flows)
    verified_transfer(T, ctx, flows, bufs, seq=0)
    comm_role = _participates(T, flows)
    cs = {d: torch.cuda.Stream(d) for d in comp_devs} if cuda else {}
    comm_devs = sorted({ctx.device.index} | ({0, 1} if T.in_process else set())) if cuda else []
    ms = {d: torch.cuda.Stream(d) for d in comm_devs}

    def compute(d):
        a, b = mats[d]
        for _ in range(cfg.compute_matmuls):
            torch.mm(a, b)

    def comm():
        for _ in range(cfg.overlap_messages):
            transfer(T, ctx, flows, bufs)

    def once(phase: str, barrier: bool = True) -> list[dict]:
        """One sample: a row per device this process computes on (or one row if it computes nowhere)."""
        if barrier:
            S.barrier()
        if not comp_devs and not comm_role:  # a rank that drives nothing here stays off the GPUs
            return []
        do_c, do_m = phase in ("compute", "overlapped"), phase in ("comm", "overlapped") and comm_role
        devs = comp_devs or [None]
        if not cuda:
            t0 = time.perf_counter()
            works = []
            if do_m:  # post every message first (gloo works in background threads), then compute
                for _ in range(cfg.overlap_messages):
                    works += _post(T, _ops(T, flows, bufs))
            tc = time.perf_counter()
            if do_c:
                for d in comp_devs:
                    compute(d)
                    if d.type == "cuda":
                        torch.cuda.synchronize(d)
            c_us = (time.perf_counter() - tc) * 1e6 if do_c else math.nan
            for w in works:
                w.wait()
            total = (time.perf_counter() - t0) * 1e6
            return [dict(device=str(d), compute_us=c_us, comm_us=total if do_m else math.nan, total_us=total)
                    for d in devs]
        E = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        main = torch.cuda.current_stream(ctx.device)
        s, e, m0, m1 = E(), E(), E(), E()
        c0 = {d: E() for d in comp_devs}
        c1 = {d: E() for d in comp_devs}
        s.record(main)
        for d in comp_devs:
            cs[d].wait_stream(torch.cuda.current_stream(d))
        for d, st in ms.items():
            st.wait_stream(torch.cuda.current_stream(d))
        if do_c:  # compute first: its kernels are queued before any host wait inside a transfer
            for d in comp_devs:
                with torch.cuda.stream(cs[d]):
                    c0[d].record(cs[d])
                    compute(d)
                    c1[d].record(cs[d])
        if do_m:
            with p2p.current_streams(ms.values()):
                m0.record(ms[ctx.device.index])
                comm()  # transfer() joins every device's comm stream into this device's
                m1.record(ms[ctx.device.index])
        for d in comp_devs:
            main.wait_stream(cs[d])
        main.wait_stream(ms[ctx.device.index])
        e.record(main)
        S.sync()
        total = s.elapsed_time(e) * 1e3
        comm_us = m0.elapsed_time(m1) * 1e3 if do_m else math.nan
        return [dict(device=str(d) if d is not None else str(ctx.device),
                     compute_us=c0[d].elapsed_time(c1[d]) * 1e3 if (do_c and d is not None) else math.nan,
                     comm_us=comm_us, total_us=total) for d in devs]

    keys = dict(kind="comm_compute", transport=T.name, bytes=cfg.overlap_bytes, messages=cfg.overlap_messages,
                compute_n=cfg.compute_n, matmuls=cfg.compute_matmuls, dtype=str(dt).replace("torch.", ""),
                comm_role=comm_role, world_size=ctx.world_size)
    for phase in ("compute", "comm", "overlapped"):
        ctx.step(f"{T.name} comm_compute {phase}")
        for sample in range(-cfg.warmup, cfg.repeats):
            rows = once(phase)
            if sample >= 0:
                for r in rows:
                    yield dict(keys, phase=phase, sample=sample, **r)
    if cfg.profile and cuda:
        ctx.step(f"{T.name} comm_compute profile")
        d = Path(ctx.run_dir) / "traces"
        d.mkdir(exist_ok=True)
        path = d / f"comm_compute-{T.name}-rank{ctx.rank}.json.gz"
        timing.trace_steps(lambda: once("overlapped", barrier=False), S, 1, path, record_shapes=False)
        if comp_devs or comm_role:
            yield dict(kind="trace", transport=T.name, path=str(path.relative_to(ctx.run_dir)), rank=ctx.rank)
        else:
            path.unlink(missing_ok=True)
    mats.clear()
    bufs.clear()
    _free(ctx)


# ----------------------------------------------------------------------------------------------- semantics
def _semantics(cfg: Config, ctx, T):
    """Host time in each call while the receiver is late (see the module docstring)."""
    import torch
    import torch.distributed as dist

    T.setup([(0, 1)], max(cfg.semantics_bytes))
    S = T.sync
    cuda = S.is_cuda
    apis = ["copy_"] if T.in_process else (["isend"] if T.name == "ipc" else ["send", "isend"])
    rounds = [(n, api, s) for n in cfg.semantics_bytes for api in apis for s in range(-1, min(cfg.repeats, 5))]
    active = ctx.rank == 0 if T.in_process else ctx.rank in (0, 1)
    for n, api, sample in rounds:
        if not active:  # same barriers as the active ranks
            S.barrier()
            S.barrier()
            continue
        role = "send" if ctx.rank == 0 else "recv"
        if T.in_process:
            src = p2p.pattern(n, T.device(0), sample, 0)
            out = torch.empty(n, dtype=torch.uint8, device=T.device(1))
        else:
            buf = p2p.pattern(n, T.device(ctx.rank), sample, 0) if role == "send" else \
                torch.empty(n, dtype=torch.uint8, device=T.device(ctx.rank))
        S.barrier()
        if role == "recv" and cfg.recv_delay_ms:
            time.sleep(cfg.recv_delay_ms / 1e3)
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        h0 = time.perf_counter()
        if T.in_process:
            T.isend(src, 1)
            w = T.irecv(out, 0)
        elif api == "send":
            (dist.send if role == "send" else dist.recv)(buf, 1 - ctx.rank, group=T.group)
            w = None
        else:
            w = T.isend(buf, 1) if role == "send" else T.irecv(buf, 0)
        h1 = time.perf_counter()
        if w is not None:
            w.wait()
        if T.in_process:
            _join(T, ctx, [(0, 1)])
        h2 = time.perf_counter()
        if cuda:
            e1.record()
            torch.cuda.synchronize()
        h3 = time.perf_counter()
        if role == "recv" or T.in_process:
            got = out if T.in_process else buf
            p2p.check(got, p2p.pattern(n, got.device, sample, 0), f"{T.name} semantics {api} {n} B")
        S.barrier()
        if sample < 0:
            continue
        yield dict(kind="semantics", transport=T.name, api=api, role="copy" if T.in_process else role, bytes=n,
                   sample=sample, call_us=(h1 - h0) * 1e6, wait_us=(h2 - h1) * 1e6, done_us=(h3 - h0) * 1e6,
                   device_us=e0.elapsed_time(e1) * 1e3 if cuda else math.nan,
                   delay_ms=0.0 if T.in_process else (cfg.recv_delay_ms if role == "recv" else 0.0),
                   peer_delay_ms=0.0 if T.in_process else (cfg.recv_delay_ms if role == "send" else 0.0),
                   world_size=ctx.world_size)


# ----------------------------------------------------------------------------------------------- pipeline
def _pipeline(cfg: Config, ctx, T):
    import torch

    from . import pipeline as P

    n = ctx.world_size
    if T.in_process and torch.cuda.device_count() < n:
        yield dict(kind="skipped", transport=T.name, experiment="pipeline", rank=ctx.rank,
                   reason=f"{n} stages need {n} GPUs in one process")
        return
    dt = _compute_dtype(cfg, ctx) if T.device(0).type == "cuda" else torch.float32
    elem = torch.tensor([], dtype=dt).element_size()
    T.setup([(s, s + 1) for s in range(n - 1)] + [(s + 1, s) for s in range(n - 1)],
            cfg.pipeline_batch * cfg.pipeline_hidden * elem)
    mine = list(range(n)) if (T.in_process and ctx.rank == 0) else ([] if T.in_process else [ctx.rank])
    stages = {s: P.Stage(s, n, cfg.pipeline_layers, cfg.pipeline_hidden, cfg.pipeline_batch,
                         cfg.pipeline_micro_batches, T.device(s), dt) for s in mine}
    devs = sorted({st.device.index for st in stages.values()}) if T.device(0).type == "cuda" else []
    # copy engines get their own stream per GPU, so a transfer overlaps the stage's next compute; NCCL
    # already runs on an internal stream of its own
    comm = {d: torch.cuda.Stream(d) for d in devs} if T.name in ("copy", "ipc") else None

    def iteration():
        progs = []
        for s, st in stages.items():
            st.zero_grad()
            progs.append(st.iteration(T, s - 1 if s > 0 else None, s + 1 if s < n - 1 else None, comm))
        P.drive(progs, T)
        for d in devs:
            torch.cuda.synchronize(d)

    for step in range(-2, cfg.pipeline_steps):
        ctx.step(f"{T.name} pipeline step {step}")
        T.sync.barrier()
        t0 = time.perf_counter()
        iteration()
        t = (time.perf_counter() - t0) * 1e6
        if step < 0:
            continue
        for s, st in stages.items():
            gn = math.sqrt(sum(float(w.grad.float().pow(2).sum()) for w in st.weights))
            yield dict(kind="pipeline", transport=T.name, step=step, stage=s, time_us=t,
                       loss=float(st.loss) if s == n - 1 else math.nan, grad_norm=gn,
                       micro_batches=cfg.pipeline_micro_batches, layers=cfg.pipeline_layers,
                       hidden=cfg.pipeline_hidden, batch=cfg.pipeline_batch, dtype=str(dt).replace("torch.", ""),
                       world_size=n)
    stages.clear()
    _free(ctx)


EXPERIMENT_FNS = {"bandwidth": _bandwidth, "comm_comm": _comm_comm, "comm_compute": _comm_compute,
                  "semantics": _semantics, "pipeline": _pipeline}


# ----------------------------------------------------------------------------------------------- analysis
def _per_sample_max(d, keys, value="time_us"):
    return d.groupby(keys + ["sample"], dropna=False)[value].max().reset_index()


def bandwidth(df):
    """Per (transport, direction, src, dst, bytes): the time per message (slowest participant per sample,
    then median/p10/p90 over samples), ``gbps`` per direction and ``total_gbps`` over both directions."""
    d = df[df["kind"].isin(["bandwidth", "matrix"])] if "kind" in df else df.iloc[0:0]
    if d.empty:
        return d
    keys = [k for k in ("label", "kind", "transport", "direction", "src", "dst", "bytes") if k in d.columns]
    s = timing.summarize(_per_sample_max(d, keys), keys)
    s["gbps"] = s["bytes"] / (s["time_us_median"] * 1e-6) / 1e9
    s["total_gbps"] = s["gbps"] * s["direction"].map({"one": 1, "both": 2})
    return s.sort_values(keys).reset_index(drop=True)


def matrix(df, transport: str):
    """src x dst GB/s at the matrix size for ``transport`` (empty on two-GPU nodes)."""
    b = bandwidth(df)
    b = b[(b["kind"] == "matrix") & (b["transport"] == transport)] if len(b) else b
    if b.empty:
        return b
    return b.pivot(index="src", columns="dst", values="gbps")


def at_size(df, nbytes: int, direction: str = "one"):
    """GB/s per transport at ``nbytes`` (nearest measured size at or below)."""
    b = bandwidth(df)
    b = b[(b["kind"] == "bandwidth") & (b["direction"] == direction)]
    if b.empty:
        return b
    size = b.loc[b["bytes"] <= nbytes, "bytes"].max()
    return b[b["bytes"] == size].set_index("transport")[["bytes", "time_us_median", "gbps", "total_gbps"]]


def comm_comm(df):
    """Per (transport, scenario, mode, flow): completion time of the flow (slowest participant, median)."""
    d = df[df["kind"] == "comm_comm"] if "kind" in df else df.iloc[0:0]
    if d.empty:
        return d
    keys = [k for k in ("label", "transport", "scenario", "mode", "flow", "bytes") if k in d.columns]
    return timing.summarize(_per_sample_max(d, keys), keys)


def comm_compute(df):
    """Per transport: compute alone / comm alone / overlapped (median over samples of the slowest rank),
    the compute slowdown under overlap (per rank, worst rank) and the overlapped total vs the serial sum."""
    import pandas as pd

    d = df[df["kind"] == "comm_compute"] if "kind" in df else df.iloc[0:0]
    if d.empty:
        return d
    rows = []
    for t, g in d.groupby("transport", sort=False):
        med = lambda phase, col: g[g.phase == phase].groupby("sample")[col].max().median()  # noqa: E731
        # per sample the slowest device/rank; then the median over samples
        by = "device" if "device" in g.columns else "rank"
        comp_alone = g[g.phase == "compute"].groupby(by)["compute_us"].median()
        comp_over = g[g.phase == "overlapped"].groupby(by)["compute_us"].median()
        slow = (comp_over / comp_alone).max()
        c, m, o = med("compute", "total_us"), med("comm", "total_us"), med("overlapped", "total_us")
        rows.append(dict(transport=t, compute_alone_us=c, comm_alone_us=m, overlapped_us=o, serial_sum_us=c + m,
                         overlapped_vs_serial=o / (c + m), compute_slowdown=slow,
                         comm_in_overlap_us=med("overlapped", "comm_us"),
                         compute_in_overlap_us=med("overlapped", "compute_us")))
    return pd.DataFrame(rows)


def semantics(df):
    """Per (transport, api, role, bytes): median host time in the call, in wait(), until done; stream time."""
    d = df[df["kind"] == "semantics"] if "kind" in df else df.iloc[0:0]
    if d.empty:
        return d
    keys = ["transport", "api", "role", "bytes"]
    return d.groupby(keys, sort=False)[["call_us", "wait_us", "done_us", "device_us", "delay_ms"]].median().reset_index()


def pipeline(df):
    """Per transport: median iteration time (slowest rank per step), p10/p90, the loss and gradient norms."""
    import pandas as pd

    d = df[df["kind"] == "pipeline"] if "kind" in df else df.iloc[0:0]
    if d.empty:
        return d
    rows = []
    for t, g in d.groupby("transport", sort=False):
        per = g.groupby("step")["time_us"].max()
        st = timing.stats(per.to_numpy())
        rows.append(dict(transport=t, time_ms_median=st["median"] / 1e3, time_ms_p10=st["p10"] / 1e3,
                         time_ms_p90=st["p90"] / 1e3, steps=st["n"], loss=g["loss"].dropna().median(),
                         grad_norms=", ".join(f"{v:.4g}" for v in g.groupby("stage")["grad_norm"].median())))
    return pd.DataFrame(rows)


def trace_events(run_dir, transport: str):
    """GPU events of the profiled overlapped iteration of ``transport``, every rank's trace together."""
    import pandas as pd

    from ... import traces

    d = Path(run_dir) / "traces"
    frames = []
    for p in sorted(d.glob(f"comm_compute-{transport}-rank*.json.gz")):
        ev = traces.gpu_events(traces.load(p))
        ev["rank"] = int(p.name.split("rank")[-1].split(".")[0])
        frames.append(ev)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
