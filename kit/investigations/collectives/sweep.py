"""The rank function: the Config, the buffers of each collective, and the three timings per point (eager,
graph, kernel) -- see the package docstring."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from ... import gpu_profile, stats, timing
from ...collective_ops import SWEEPABLE, bus_factor
from ...config import LaunchConfig

Sweepable = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
assert list(get_args(Sweepable)) == SWEEPABLE, "keep Sweepable in step with kit.collective_ops.SWEEPABLE"
Dtype = Literal["float32", "float16", "bfloat16", "float64", "int32", "int8"]
NO_KERNEL = "no NCCL kernel: with one rank NCCL launches none"


@dataclass
class Config(LaunchConfig):
    collectives: list[Sweepable] = field(default_factory=lambda: list(SWEEPABLE))
    min_bytes: int = 1024
    max_bytes: int = 1 << 30
    dtype: Dtype = "float32"
    iters: int = 20
    """calls per sample (queued back to back, like nccl-tests' -n)"""
    repeats: int = 10
    """samples per point"""
    warmup: int = 5
    device_time: bool = True
    """also time a CUDA-graph replay of the same calls (CUDA only)"""
    kernel_time: bool = True
    """also profile one loop and keep the NCCL kernel durations (CUDA only)"""
    nccl_tests: str = "auto"
    """nccl-tests: 'auto' (binaries on PATH or in $NCCL_TESTS_DIR), '' (don't), or a directory / binary"""

    def check(self) -> list[str]:
        errs = []
        if self.min_bytes < 1 or self.max_bytes < self.min_bytes:
            errs.append(f"need 1 <= min_bytes <= max_bytes (got {self.min_bytes}, {self.max_bytes})")
        if min(self.iters, self.repeats) < 1 or self.warmup < 0:
            errs.append("iters and repeats must be >= 1, warmup >= 0")
        return errs



# ------------------------------------------------------------------------------------------------ the sweep
def per_rank_count(nbytes: int, world: int, elem: int) -> int:
    """Elements in each rank's part, rounded down to 16-byte alignment as nccl-tests does (at least 1)."""
    align = max(16 // elem, 1)
    return max((nbytes // world // elem) // align * align, 1)


def _make_op(collective: str, nbytes: int, ctx, dtype):
    """Buffers and a zero-argument call for one collective; returns (call, actual_bytes)."""
    import torch
    import torch.distributed as dist

    n = ctx.world_size
    elem = torch.tensor([], dtype=dtype).element_size()
    part = per_rank_count(nbytes, n, elem)
    dev = ctx.device
    # random data: never time on zeros (they can run faster than real data)
    rand = lambda k: torch.randn(k, device=dev).to(dtype) if dtype.is_floating_point else torch.randint(0, 100, (k,), device=dev, dtype=dtype)
    if collective == "all_reduce":
        t = rand(part * n)
        return (lambda: dist.all_reduce(t)), t.numel() * elem
    if collective == "broadcast":
        t = rand(part * n)
        return (lambda: dist.broadcast(t, src=0)), t.numel() * elem
    if collective == "all_gather":
        inp, out = rand(part), torch.empty(part * n, device=dev, dtype=dtype)
        return (lambda: dist.all_gather_into_tensor(out, inp)), out.numel() * elem
    if collective == "reduce_scatter":
        inp, out = rand(part * n), torch.empty(part, device=dev, dtype=dtype)
        return (lambda: dist.reduce_scatter_tensor(out, inp)), inp.numel() * elem
    if collective == "all_to_all":
        inp, out = rand(part * n), torch.empty(part * n, device=dev, dtype=dtype)
        return (lambda: dist.all_to_all_single(out, inp)), inp.numel() * elem
    raise ValueError(collective)


def kernel_durations(fn, ctx, iters: int) -> list[float]:
    """Seconds per NCCL kernel over one profiled loop of ``iters`` calls (kit.gpu_profile.profile_gpu); ``[]`` when
    the trace has no NCCL kernel (one rank: NCCL launches none)."""
    ev = gpu_profile.profile_gpu(fn, ctx, iters)
    if ev.empty or "nccl" not in ev.columns or "dur" not in ev.columns:
        return []
    return (ev[ev["nccl"].astype(bool)]["dur"] / 1e6).tolist()


def _with_bw(rows: list[dict], collective: str, world: int) -> list[dict]:
    f = bus_factor(collective, world)
    for r in rows:
        r["algbw_gbps"] = stats.gbps(r["bytes"], r["time_us"])
        r["busbw_gbps"] = r["algbw_gbps"] * f
    return rows


def points(cfg: Config, world: int, cuda: bool) -> int:
    """The measurement points (kit.contract): one per (collective, size)."""
    return len(cfg.collectives) * len(stats.pow2_sizes(cfg.min_bytes, cfg.max_bytes))


def run(cfg: Config, ctx):
    """The rank function: yields one row per sample per (collective, size, method)."""
    import torch

    dtype = getattr(torch, cfg.dtype)
    for coll in cfg.collectives:
        for nbytes in stats.pow2_sizes(cfg.min_bytes, cfg.max_bytes):
            ctx.step(f"{coll} {stats.human_bytes(nbytes)}")
            op, actual = _make_op(coll, nbytes, ctx, dtype)
            keys = dict(kind="sample", collective=coll, bytes=actual, dtype=cfg.dtype, world_size=ctx.world_size,
                        backend=ctx.backend, iters=cfg.iters)
            rows = timing.measure(op, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup).rows(**keys)
            if ctx.is_cuda and cfg.device_time:
                try:
                    rows += timing.measure_graph(op, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=2).rows(**keys)
                except Exception as e:  # a capture failure is a finding, not a crash of the sweep
                    ctx.log(f"graph timing failed for {coll} {nbytes} B: {type(e).__name__}: {e}")
            if ctx.is_cuda and cfg.kernel_time:
                ks = kernel_durations(op, ctx, cfg.iters)
                if ks:
                    rows += timing.Samples("kernel", ks).rows(**keys)
                else:
                    yield {**keys, "kind": "note", "method": "kernel", "note": NO_KERNEL}
            yield from _with_bw(rows, coll, ctx.world_size)
            del op
            if ctx.is_cuda:
                torch.cuda.empty_cache()
