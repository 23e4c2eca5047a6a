"""P2P transports for pipeline parallelism: peer copy vs CUDA IPC vs NCCL send/recv (vs gloo on CPU).

Every transport is a :mod:`kit.transports` transport (one interface: ``isend``/``irecv``/``exchange`` and
``Work.wait()``), and every experiment runs unchanged over each of them, asking the transport's
capabilities (copy engine or SMs, in-process or cross-process, a second channel, a blocking send), never its
name. Rows carry ``kind`` (one module per experiment):

* ``bandwidth`` / ``matrix`` (:mod:`.bandwidth`) -- one message 0 -> 1, or one each way at once, per size;
  every ordered GPU pair when there are more than two; a bare ``dst.copy_(src)`` loop as the copy-engine
  reference (``transport = "copy_ loop"``), timed in turn with the in-process copy transport.
* ``comm_comm`` (:mod:`.comm_comm`) -- two flows on one channel or two; a small message behind a large one.
* ``comm_compute`` (:mod:`.comm_compute`) -- matmuls and transfers alone and overlapped; ``trace`` rows name
  the profiled overlapped iteration (``traces/``).
* ``semantics`` (:mod:`.semantics`) -- what blocks the host while the receiver is late.
* ``pipeline`` / ``pipeline_part`` (:mod:`.pipeline_run`, the pipeline itself in :mod:`.pipeline`) -- a 1F1B
  pipeline over the transport, host-driven and device-bound: time per iteration, loss, gradients; each
  stage's forward/backward and one activation transfer alone, for the model (:mod:`.pipeline_analysis`).
* ``skipped`` -- a transport (or one experiment of it) that cannot run here, with the reason.

:mod:`.harness` holds what they share (flows, buffers, a verified transfer, the timing ``ctx`` :class:`Sync`
whose barrier keeps idle ranks off the GPUs of an in-process transport); :mod:`.analysis` the tables and
findings, :mod:`.figures` the figures. Sizes are bytes of a uint8 message (the transports are dtype-agnostic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ... import transports
from ...config import LaunchConfig
from ...contract import Investigation, Needs
from ... import regimes as kit_regimes
from . import (analysis, bandwidth, comm_comm, comm_compute, figures, harness, pipeline, pipeline_analysis,
               pipeline_run, regimes, semantics)
from .bandwidth import BARE
from .harness import Sync

Part = Literal["bandwidth", "comm_comm", "comm_compute", "semantics", "pipeline"]
PARTS: tuple[str, ...] = Part.__args__
EXPERIMENTS = {"bandwidth": bandwidth.experiment, "comm_comm": comm_comm.experiment,
               "comm_compute": comm_compute.experiment, "semantics": semantics.experiment,
               "pipeline": pipeline_run.experiment}


@dataclass
class Config(LaunchConfig):
    transports: list[str] = field(default_factory=lambda: ["copy", "ipc", "nccl", "gloo"])
    """Registered transports (``kit.transports.names()``: copy, ipc, nccl, gloo and any you register); those
    that cannot run here are skipped with the reason."""
    parts: list[Part] = field(default_factory=lambda: list(PARTS))
    """which experiments to run"""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """compute and pipeline dtype on GPUs (CPU runs use float32)"""
    ipc_slots: int = 4
    """mailbox slots per sender for transports that have one (flow control: the sender waits when all are in use)"""
    # -- bandwidth
    min_bytes: int = 1024
    """smallest message of the size sweep (sizes double up to ``max_bytes``)"""
    max_bytes: int = 1 << 30
    """largest message of the size sweep"""
    directions: list[Literal["one", "both"]] = field(default_factory=lambda: ["one", "both"])
    """``one``: 0 -> 1; ``both``: one message each way at once"""
    iters: int = 10
    """messages per sample (back to back)"""
    latency_iters: int = 0
    """messages per sample for messages up to 64 KiB (``bandwidth.LATENCY_MAX_BYTES``; 0: ``iters``), where a message
    costs the host tens of microseconds: a sample of a few of them, right after a barrier, times the loop's cold
    start more than a message (FINDINGS.md, P2P transports; configs/gpu.yaml: 100)"""
    repeats: int = 10
    """samples per point"""
    warmup: int = 3
    """untimed rounds before the samples"""
    verify: bool = False
    """check every transfer's data at the receiver (timings then include the check); otherwise the first
    transfer of every point is checked"""
    matrix_bytes: int = 256 << 20
    """message size of the GPU-pair matrix (nodes with more than two GPUs)"""
    # -- comm_comm
    flow_bytes: int = 64 << 20
    """the large flow"""
    small_bytes: int = 64 << 10
    """the small message issued behind it (``small_behind_big``)"""
    # -- comm_compute
    compute_n: int = 8192
    """matmul size (n x n times n x n)"""
    compute_matmuls: int = 3
    """matmuls per GPU per sample"""
    overlap_bytes: int = 64 << 20
    """bytes per transfer"""
    overlap_messages: int = 16
    """transfers 0 -> 1 per sample"""
    profile: bool = True
    """profile one overlapped comm_compute iteration and one pipeline iteration per driver, per CUDA transport
    (the timelines)"""
    # -- semantics
    recv_delay_ms: float = 20.0
    """the receiver posts its receive this late"""
    semantics_bytes: list[int] = field(default_factory=lambda: [64 << 10, 64 << 20])
    """message sizes"""
    # -- pipeline
    pipeline_micro_batches: int = 8
    """micro-batches per iteration"""
    pipeline_layers: int = 4
    """tanh layers per stage"""
    pipeline_hidden: int = 4096
    """width of a layer"""
    pipeline_batch: int = 2048
    """rows per micro-batch: an activation is batch x hidden"""
    pipeline_steps: int = 5
    """timed iterations (after two untimed ones)"""
    pipeline_drivers: list[Literal["host", "device"]] = field(default_factory=lambda: ["host", "device"])
    """``host``: each process issues its stages' work from Python step by step; ``device``: the host out of
    the way where the transport allows it (a thread per stage in one process, or the iteration as one CUDA
    graph for a capturable transport) -- see :mod:`.pipeline_run`"""
    pipeline_one_core: bool = True
    """where one thread drives every stage (an in-process transport, ``host`` driver), keep this process's threads
    on one CPU core while it runs and while its parts are timed (:class:`.pipeline.one_core`: the hand-offs between
    the driving thread and the autograd engine's thread per GPU stay on that core; rows get ``core``); False:
    wherever the OS puts them"""
    pipeline_core: int = -1
    """the core of ``pipeline_one_core`` (-1: the one this process may use that was idle the longest and
    interrupted the least just before, not core 0: ``pipeline.one_core.idlest``)"""

    def check(self) -> list[str]:
        errs = []
        bad = [t for t in self.transports if t not in transports.names()]
        if bad:
            errs.append(f"unknown transport(s) {bad}; choose from {transports.names()}")
        if self.min_bytes < 1 or self.max_bytes < self.min_bytes:
            errs.append(f"need 1 <= min_bytes <= max_bytes (got {self.min_bytes}, {self.max_bytes})")
        for k in ("iters", "repeats", "compute_n", "compute_matmuls", "overlap_messages", "pipeline_micro_batches",
                  "pipeline_layers", "pipeline_hidden", "pipeline_batch", "pipeline_steps", "ipc_slots",
                  "matrix_bytes", "flow_bytes", "small_bytes", "overlap_bytes"):
            if getattr(self, k) < 1:
                errs.append(f"{k} must be >= 1 (got {getattr(self, k)})")
        if self.pipeline_core < -1:
            errs.append(f"pipeline_core must be a core number or -1 (got {self.pipeline_core})")
        if self.warmup < 0 or self.recv_delay_ms < 0 or self.latency_iters < 0:
            errs.append("warmup, latency_iters and recv_delay_ms must be >= 0")
        if any(b < 1 for b in self.semantics_bytes):
            errs.append(f"semantics_bytes must be >= 1 (got {self.semantics_bytes})")
        return errs

    def check_world(self, world: int) -> list[str]:
        """A job started outside ``kit`` (torchrun) is not asked ``needs`` first: the same rule here."""
        return [f"P2P needs at least 2 ranks (world_size {world})"] if world < 2 else []


def points(cfg: Config, world: int, cuda: bool) -> int:
    """The measurement points (kit.contract): per transport its set-up and each part (a transport unavailable
    here passes its parts as skipped); the steps inside a part are finer (``point=False``)."""
    return len(cfg.transports) * (1 + len(cfg.parts))


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
            T = transports.make(name, ctx, cfg.timeout_s, slots=cfg.ipc_slots)
        except transports.TransportUnavailable as e:
            yield dict(kind="skipped", transport=name, reason=str(e), rank=ctx.rank)
            for part in cfg.parts:  # its planned points pass, said as skipped
                ctx.step(f"{name} {part}: skipped ({name} unavailable)")
            continue
        S = harness.sync_for(T, ctx, host_group)
        try:
            for part in cfg.parts:
                ctx.step(f"{name} {part}")
                yield from EXPERIMENTS[part](cfg, ctx, T, S)
        finally:
            ctx.sync()
            T.close()


def _findings(runs) -> list:
    """What the rows show (:func:`.analysis.findings`, :func:`.pipeline_analysis.findings`), then what the
    profiled pipeline iterations show (:func:`.pipeline_analysis.idle_findings`)."""
    pa = pipeline_analysis
    out = analysis.findings(runs)
    skipped = [f for f in out if f.key.startswith("skipped.")]
    return ([f for f in out if not f.key.startswith("skipped.")] + pa.findings(analysis.frame(runs))
            + pa.idle_findings(runs) + skipped)


def findings(runs) -> list:
    """:func:`_findings`; for runs of two regimes (one node beside emulated nodes) per regime, then their
    comparison (:func:`.regimes.regime_findings`)."""
    if getattr(runs, "dirs", None) and len(kit_regimes.split(runs)) > 1:
        return kit_regimes.per_regime_findings(_findings, runs) + regimes.regime_findings(runs)
    return _findings(runs)


INVESTIGATION = Investigation(
    name="p2p_transports", Config=Config, run=run, columns=("kind", "transport"),
    tables={**analysis.TABLES, **pipeline_analysis.TABLES, "regime_256mib": regimes.table_regime_256mib,
            "regime_overlap": regimes.table_regime_overlap, "regime_pipeline": regimes.table_regime_pipeline,
            "nccl_transports": kit_regimes.transports_table},
    figures={**figures.FIGURES, **pipeline_analysis.FIGURES, "bandwidth-regimes": regimes.fig_bandwidth_regimes}, findings=findings,
    needs=Needs(ranks=2),
    points=points,
    question="peer copy, CUDA IPC or NCCL send/recv: which P2P transport serves pipeline parallelism best, and "
             "what does each cost the compute beside it?")

__all__ = ["BARE", "Config", "EXPERIMENTS", "INVESTIGATION", "PARTS", "Sync", "analysis", "figures", "findings",
           "harness", "pipeline", "regimes", "run"]
