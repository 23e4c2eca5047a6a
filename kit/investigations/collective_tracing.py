"""Tracing collectives in a real training step: what each collective moved, how fast, and how much of it
the compute hid.

Two workloads, each profiled for ``profile_steps`` steps on every rank (torch.profiler, CUDA activity and
``record_shapes``; one gzipped trace per rank in the run directory, ``trace_<part>_rank<r>.json.gz``):

* ``ddp`` -- an MLP of ``ddp_layers`` Linear(hidden, hidden) layers under DistributedDataParallel (gradient
  buckets of ``bucket_cap_mb``, all-reduced while backward runs), SGD;
* ``tp``  -- a tensor/sequence-parallel style forward: per layer, all_gather of the sequence shards, a column-
  parallel and a row-parallel matmul, reduce_scatter back to shards.

Rows: ``kind=step`` (time per step, kit.timing), ``kind=overlap`` (per rank, from its own trace:
communication-kernel time, the share overlapped by compute kernels, exposed communication), ``kind=fr`` (the
Flight Recorder buffer after the run, when ``TORCH_FR_BUFFER_SIZE`` is set -- the default env here does).
The per-collective table is built from the traces of *all* ranks (kit.comm_trace.collectives) in the notebook
or with ``kit trace collectives``. :func:`mismatch` is the Flight Recorder demo: rank 0 issues one
collective more than rank 1; both dump their buffers, and the missing sequence number names rank 1.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .. import timing, traces
from ..traces import comm as comm_trace
from ..config import LaunchConfig

FR_ENV = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}  # old and new name


@dataclass
class Config(LaunchConfig):
    env: dict[str, str] = field(default_factory=lambda: dict(FR_ENV))
    ddp_layers: int = 8
    hidden: int = 4096
    batch: int = 64
    bucket_cap_mb: float = 25.0
    tp_layers: int = 4
    tp_tokens: int = 4096
    tp_hidden: int = 4096
    dtype: str = "bfloat16"
    warmup_steps: int = 3
    timed_steps: int = 10
    profile_steps: int = 3

    def check(self) -> list[str]:
        errs = []
        if self.dtype not in ("float32", "bfloat16", "float16"):
            errs.append(f"dtype {self.dtype!r} not one of float32, bfloat16, float16")
        if min(self.ddp_layers, self.hidden, self.batch, self.tp_layers, self.tp_tokens, self.tp_hidden,
               self.timed_steps, self.profile_steps) < 1:
            errs.append("layer counts, sizes and step counts must be >= 1")
        if self.bucket_cap_mb <= 0:
            errs.append("bucket_cap_mb must be > 0")
        return errs


def _ddp_step(cfg: Config, ctx):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    dtype = getattr(torch, cfg.dtype) if ctx.is_cuda else torch.float32  # CPU: bf16 matmuls are slow there
    torch.manual_seed(0)
    layers = []
    for _ in range(cfg.ddp_layers):
        layers += [torch.nn.Linear(cfg.hidden, cfg.hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(ctx.device, dtype)
    ddp = DDP(model, device_ids=[ctx.local_rank] if ctx.is_cuda else None, bucket_cap_mb=cfg.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    g = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
    x = torch.randn(cfg.batch, cfg.hidden, device=ctx.device, dtype=dtype, generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        ddp(x).float().square().mean().backward()
        opt.step()

    return step


def _tp_forward(cfg: Config, ctx):
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, cfg.dtype) if ctx.is_cuda else torch.float32
    n, h = ctx.world_size, cfg.tp_hidden
    g = torch.Generator(device=ctx.device).manual_seed(100 + ctx.rank)
    shard_tokens = max(cfg.tp_tokens // n, 1)
    x = torch.randn(shard_tokens, h, device=ctx.device, dtype=dtype, generator=g)
    w1 = [torch.randn(h, 4 * h // n, device=ctx.device, dtype=dtype, generator=g) / h ** 0.5 for _ in range(cfg.tp_layers)]
    w2 = [torch.randn(4 * h // n, h, device=ctx.device, dtype=dtype, generator=g) / (4 * h) ** 0.5 for _ in range(cfg.tp_layers)]
    full = torch.empty(shard_tokens * n, h, device=ctx.device, dtype=dtype)
    out = torch.empty(shard_tokens, h, device=ctx.device, dtype=dtype)

    def forward():
        y = x
        for a, b in zip(w1, w2):
            dist.all_gather_into_tensor(full, y)                       # sequence shards -> full sequence
            z = torch.nn.functional.gelu(full @ a) @ b                  # column- then row-parallel matmul
            dist.reduce_scatter_tensor(out, z.contiguous())             # partial sums -> summed shards
            y = out
        return y

    return forward


def run(cfg: Config, ctx):
    import torch

    parts = [("ddp", _ddp_step(cfg, ctx))]
    with torch.no_grad():
        parts.append(("tp", _tp_forward(cfg, ctx)))
    for part, fn in parts:
        ctx.step(f"{part}: warm-up and timing")
        grad = torch.enable_grad() if part == "ddp" else torch.no_grad()
        with grad:
            s = timing.measure(fn, ctx, iters=1, repeats=cfg.timed_steps, warmup=cfg.warmup_steps)
            for r in s.rows(kind="step", part=part):
                yield r
            ctx.step(f"{part}: profiling {cfg.profile_steps} steps")
            path = ctx.run_dir / f"trace_{part}_rank{ctx.rank}.json.gz"
            timing.trace_steps(fn, ctx, cfg.profile_steps, path)
        if ctx.is_cuda:
            ev = traces.gpu_events(traces.load(path, keep=lambda e: e.get("cat") in traces.GPU_CATS))
            for r in comm_trace.overlap(ev[ev["device"] == ctx.local_rank]).to_dict("records"):
                yield {"kind": "overlap", "part": part, **r, "steps": cfg.profile_steps}
        for r in comm_trace.collective_rows(path):
            yield {"kind": "collective", "part": part, **{k: r[k] for k in comm_trace.ROW_KEYS if k != "rank"},
                   "start_us": r["start_us"]}
    yield from _fr_rows(ctx, "run")


def _fr_rows(ctx, tag: str):
    try:
        dump = comm_trace.dump_flight_recorder()
    except Exception as e:  # no buffer configured, or a build without it: say so in the rows
        yield {"kind": "fr_unavailable", "reason": f"{type(e).__name__}: {e}"}
        return
    (ctx.run_dir / f"fr_{tag}_rank{ctx.rank}.json").write_text(json.dumps(dump, default=str))
    for r in comm_trace.fr_entries(dump, ctx.rank).to_dict("records"):
        yield {"kind": "fr", "tag": tag, **r}


def mismatch(cfg: Config, ctx):
    """Flight Recorder demo: 3 all_reduces everywhere, then a 4th on rank 0 only (async, never completes)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1024, device=ctx.device)
    for _ in range(3):
        dist.all_reduce(t)
    ctx.sync()
    if ctx.rank == 0:
        ctx.step("rank 0 issues an all_reduce rank 1 never joins")
        dist.all_reduce(t, async_op=True)
    time.sleep(2.0)  # let the pending op be recorded as scheduled/started
    yield from _fr_rows(ctx, "mismatch")
