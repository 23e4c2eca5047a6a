"""The rank function of graph_gaps: the Config, the model, and what each rank measures (see the package
docstring for the rows). Every row says its ``mode`` (``eager`` or ``graph``) in a column of that name."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ... import timing, traces
from ...config import LaunchConfig
from . import mechanism, streams


@dataclass
class Config(LaunchConfig):
    env_sets: list[dict[str, str]] = field(default_factory=lambda: [{}, {"NCCL_GRAPH_MIXING_SUPPORT": "0"}])
    layers: list[int] = field(default_factory=lambda: [10, 40, 160, 640])
    batch: int = 1024
    hidden: int = 2048
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    tf32: bool = False
    control: bool = True
    """also run the matmul-only model (no all_reduce)"""
    iters: int = 5
    """forwards per timed sample"""
    repeats: int = 5
    warmup: int = 3
    profile_forwards: int = 3
    keep_traces: list[int] = field(default_factory=lambda: [10])
    """layer counts whose profiler traces are kept in the run directory (gzipped)"""
    gap_threshold_us: float = 1000.0
    census_layers: int = 4
    launch_batches: list[int] = field(default_factory=lambda: [1, 4, 16, 64, 256, 1024])
    launch_layers: int = 64
    launch_hidden: int = 256
    mechanism: bool = True
    """the mechanism experiments (:mod:`.mechanism`): gap by position, gap vs work, replays, graph edges"""
    work_layers: int = 160
    """N for the work and replay experiments"""
    work_hidden: list[int] = field(default_factory=lambda: [1024, 4096])
    work_tf32: bool = True
    work_dtypes: list[Literal["float32", "float16", "bfloat16"]] = field(default_factory=lambda: ["bfloat16"])
    work_every: list[int] = field(default_factory=lambda: [4, 16])
    """a collective only after every k-th layer"""
    replays: int = 20
    replay_streams: list[Literal["legacy", "created", "per_thread", "blocking"]] = field(
        default_factory=lambda: ["legacy", "created"])
    """the streams each graph is replayed into (:mod:`.streams`): ``legacy`` is what ``g.replay()`` uses in a plain
    loop; every graph row says its ``stream``"""

    def check(self) -> list[str]:
        errs = []
        if not self.layers or min(self.layers) < 1:
            errs.append("layers must be a non-empty list of positive layer counts")
        if min(self.batch, self.hidden, self.iters, self.repeats, self.profile_forwards) < 1:
            errs.append("batch, hidden, iters, repeats, profile_forwards must be >= 1")
        if any(b < 1 for b in self.launch_batches) or self.launch_layers < 1 or self.launch_hidden < 1:
            errs.append("launch_batches, launch_layers, launch_hidden must be positive")
        if not self.replay_streams:
            errs.append("replay_streams must name at least one stream (legacy: what g.replay() uses)")
        if self.work_layers < 1 or self.replays < 1 or min(self.work_hidden + self.work_every + [1]) < 1:
            errs.append("work_layers, work_hidden, work_every, replays must be positive")
        return errs


def build_forward(n_layers: int, cfg: Config, ctx, comm: bool, hidden: int | None = None, batch: int | None = None,
                  every: int = 1):
    """The model's forward as a zero-argument function (input and weights are fixed tensors); ``every``: an
    all_reduce after every k-th layer only (the mechanism experiments)."""
    import torch
    import torch.distributed as dist

    h, b = hidden or cfg.hidden, batch or cfg.batch
    dtype = getattr(torch, cfg.dtype)
    g = torch.Generator(device=ctx.device).manual_seed(1234 + ctx.rank)
    # Var(w) = 1/(h * world): sum over ranks of W_r y has E|.|^2 = world * |y|^2 / world = |y|^2
    scale = 1.0 / math.sqrt(h * (ctx.world_size if comm else 1))
    weights = [torch.randn(h, h, device=ctx.device, dtype=dtype, generator=g) * scale for _ in range(n_layers)]
    x = torch.randn(b, h, device=ctx.device, dtype=dtype, generator=g)
    do_comm = comm and ctx.world_size > 1

    def forward():
        y = x
        for i, w in enumerate(weights):
            y = torch.nn.functional.linear(y, w)
            if do_comm and (i + 1) % every == 0:
                dist.all_reduce(y)
        return y

    return forward


def _profile(fn, ctx, forwards: int, keep: Path | None, threshold_us: float):
    """``(row fields, gaps)``: kernel-time sums per forward and the gap statistics (:func:`.mechanism.gap_stats`)
    from a profiler trace of ``forwards`` calls, and its kit.traces.gaps frame."""
    ev, g = mechanism.profile_gaps(fn, ctx, forwards, threshold_us, export=str(keep) if keep else None)
    k = ev[ev["cat"] == "kernel"]
    out = {"kernel_sum_us": float(k["dur"].sum()) / forwards,
           "nccl_kernel_sum_us": float(k[k["nccl"].astype(bool)]["dur"].sum()) / forwards,
           "kernels_per_forward": len(k) / forwards, "stalls": int(g["stall"].astype(bool).sum()) if len(g) else 0,
           **mechanism.gap_stats(g, forwards)}
    return out, g


def capture(fn, ctx, debug_dot: Path | None = None):
    """A CUDA graph of one call of ``fn`` (kit.timing.capture_graph), optionally dumped as DOT for the census.

    Newer PyTorch drops the captured graph after instantiation unless ``keep_graph=True``, and with it
    ``debug_dump`` works without debug mode -- which must stay off: ``CUDAGraph.enable_debug_mode()`` sets a
    process-wide flag (``static bool _cuda_graphs_debug`` in ``aten/src/ATen/cuda/CUDAGraph.cpp``) under which
    every *later* graph's ``capture_end`` instantiates it but skips ``cudaGraphDestroy`` of the captured graph
    and forgets it (``has_graph_ = false``), so ``reset()`` never frees it either. A leaked graph that captured
    NCCL kernels keeps NCCL's user object (its persistent plans) alive, and ``ncclCommDestroy`` /
    ``ncclCommFinalize`` wait for those forever (``commDestroySync``: "keep polling until all graphs
    referencing us die", ``src/init.cc`` of NCCL v2.28.9-1): that was graph_gaps' teardown hang
    (``recorded/probes/graph_gaps-teardown-h200x2/``). Only a torch without ``keep_graph`` needs debug mode for
    the dump; there the graphs captured after the census leak and the rank's bounded teardown ends it."""
    import torch

    if debug_dot is None:
        return timing.capture_graph(fn, ctx, iters=1, warmup=3)
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # older torch: the graph is kept in debug mode only (see above for what that costs)
        g = torch.cuda.CUDAGraph()
        g.enable_debug_mode()
    return timing.capture_graph(fn, ctx, iters=1, warmup=3, graph=g, debug_dot=debug_dot)


def points(cfg: Config, world: int, cuda: bool) -> int:
    """The measurement points (kit.contract): the census, one per (model, N), each mechanism variant and the
    replays, one per launch batch and benchmark -- on CPU only the (model, N) points run."""
    per_n = len(cfg.layers) * (2 if cfg.control else 1)
    if not cuda:
        return per_n
    mech = len(mechanism.work_variants(cfg)) + 1 if cfg.mechanism else 0
    return 1 + per_n + mech + 2 * len(cfg.launch_batches)


def run(cfg: Config, ctx):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    models = [("allreduce", True)] + ([("matmul-only", False)] if cfg.control else [])
    replay_streams = {}
    with torch.inference_mode():
        if ctx.is_cuda:
            for name in cfg.replay_streams:  # made once: every N replays into the same streams
                st, why = streams.make_stream(name, ctx.device)
                replay_streams[name] = st
                yield {"kind": "stream", "mode": "graph", "stream": name, "stream_handle": streams.handle(st),
                       "available": st is not None, "why": why, "world_size": ctx.world_size}
            yield from _census(cfg, ctx)
        for n in cfg.layers:
            for model, comm in models:
                ctx.step(f"{model} N={n}")
                fwd = build_forward(n, cfg, ctx, comm)
                modes = [("eager", "legacy", fwd, "")]
                if ctx.is_cuda:
                    g = capture(fwd, ctx)
                    modes += [("graph", name, streams.replay_on(g, st, ctx.device), streams.handle(st))
                              for name, st in replay_streams.items() if st is not None]
                keys = dict(model=model, layers=n, batch=cfg.batch, hidden=cfg.hidden, dtype=cfg.dtype, tf32=cfg.tf32,
                            world_size=ctx.world_size)
                for mode, stream, fn, handle in modes:
                    skeys = dict(keys, stream=stream)
                    s = timing.measure(fn, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup)
                    yield from timed_rows(s, mode, kind="time", **skeys)
                    if ctx.is_cuda:
                        tags = dict(model=model, layers=n, mode=mode, **({"stream": stream} if stream != "legacy" else {}))
                        keep = traces.trace_path(ctx, **tags) if n in cfg.keep_traces else None
                        prof, gaps = _profile(fn, ctx, cfg.profile_forwards, keep, cfg.gap_threshold_us)
                        yield {"kind": "profile", "mode": mode, **skeys, "stream_handle": handle,
                               "output_rms": _rms(fwd()), **prof}
                        if comm:
                            yield from mechanism.position_rows(gaps, n, model=model, mode=mode, layers=n,
                                                               world_size=ctx.world_size, stream=stream)
                if not ctx.is_cuda:
                    yield {"kind": "check", "mode": "eager", "model": model, "layers": n, "output_rms": _rms(fwd())}
                del modes, fwd
                if ctx.is_cuda:
                    del g
                    torch.cuda.empty_cache()
    if ctx.is_cuda:
        if cfg.mechanism:
            with torch.inference_mode():
                yield from mechanism.work(cfg, ctx, build_forward, capture, timed_rows)
                yield from mechanism.replays(cfg, ctx, build_forward, capture)
        yield from _launch_overhead(cfg, ctx)


def timed_rows(s: timing.Samples, mode: str, **keys) -> list[dict]:
    """The rows of one timing, its mode in the ``mode`` column (kit.timing names it ``method``; graph_gaps' rows,
    recorded ones included, say ``mode``): the one place the name changes."""
    s.method = mode
    return [{**{k: v for k, v in r.items() if k != "method"}, "mode": r["method"]} for r in s.rows(**keys)]


def _rms(y) -> float:
    return float(y.float().pow(2).mean().sqrt())


def _census(cfg: Config, ctx):
    ctx.step(f"census N={cfg.census_layers}")
    fwd = build_forward(cfg.census_layers, cfg, ctx, comm=True)
    dot = ctx.run_dir / f"graph_N{cfg.census_layers}_rank{ctx.rank}.dot"
    g = capture(fwd, ctx, debug_dot=dot)
    text = dot.read_text() if dot.exists() else ""
    counts = traces.graph_census(text) if dot.exists() else {"dump_missing": 1}
    for node, count in sorted(counts.items()):
        yield {"kind": "census", "mode": "graph", "layers": cfg.census_layers, "node_type": node, "count": count,
               "world_size": ctx.world_size}
    if cfg.mechanism:
        yield from mechanism.edge_rows(text, layers=cfg.census_layers, world_size=ctx.world_size)
    del g


def _launch_overhead(cfg: Config, ctx):
    """Many small kernels: the host's launch cost dominates and a graph removes it."""
    h = cfg.launch_hidden
    for b in cfg.launch_batches:
        ctx.step(f"launch chain batch={b}")
        fwd = build_forward(cfg.launch_layers, cfg, ctx, comm=False, hidden=h, batch=b)
        g = capture(fwd, ctx)
        for mode, fn in (("eager", fwd), ("graph", g.replay)):
            s = timing.measure(fn, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup, aligned=False)
            yield from timed_rows(s, mode, kind="launch", bench="chain", batch=b, layers=cfg.launch_layers, hidden=h)
        if cfg.mechanism:
            yield from mechanism.launch_profile(fwd, g, ctx, cfg.profile_forwards, cfg.gap_threshold_us,
                                                bench="chain", batch=b, layers=cfg.launch_layers, hidden=h)
        del g
    for b in cfg.launch_batches:
        ctx.step(f"launch train_step batch={b}")
        yield from _train_step(cfg, ctx, b)


def _train_step(cfg: Config, ctx, batch: int):
    """A small MLP training step, eager vs its forward/backward graphed by make_graphed_callables."""
    import torch

    h, depth = cfg.launch_hidden, max(cfg.launch_layers // 4, 1)
    dtype = getattr(torch, cfg.dtype)

    def mlp():
        torch.manual_seed(0)
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(h, h), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).to(ctx.device, dtype)

    x = torch.randn(batch, h, device=ctx.device, dtype=dtype)
    for mode in ("eager", "graph"):
        model = mlp()
        if mode == "graph":
            model = torch.cuda.make_graphed_callables(model, (x,))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()

        s = timing.measure(step, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup, aligned=False)
        yield from timed_rows(s, mode, kind="launch", bench="train_step", batch=batch, layers=depth, hidden=h)
