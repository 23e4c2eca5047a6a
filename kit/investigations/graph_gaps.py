"""CUDA-graph gaps before NCCL kernels, and what CUDA graphs buy.

The reported setup: N layers of ``Linear(hidden, hidden, bias=False)``, each followed by ``all_reduce``, in
inference mode (batch 1024, hidden 2048, fp32, TF32 a parameter), plus a matmul-only control model. For every
N, model and mode (``eager`` = the Python loop; ``graph`` = the same forward captured once in a CUDA graph,
warm-up on a side stream first, and replayed), on every rank:

* ``kind=time``    -- time per forward, ``iters`` forwards per sample, every sample kept (kit.timing);
* ``kind=profile`` -- from a torch.profiler (CUPTI) trace of ``profile_forwards`` forwards: the sum of kernel
  durations per forward (the pure device work: time above it is overhead) and the gaps before NCCL kernels and
  before other kernels (kit.traces.gaps: start minus the latest end of any earlier activity on that GPU, all
  streams; gaps above ``gap_threshold_us`` count as stalls). Traces for N in ``keep_traces`` are kept, gzipped;
* ``kind=census``  -- node types of the captured graph at N = ``census_layers`` (``CUDAGraph.debug_dump``,
  kit.traces.graph_census): the structural evidence of what NCCL inserts, and proof the variable reached NCCL;
* ``kind=launch``  -- why graphs exist: a chain of ``launch_layers`` small Linear layers, eager vs graphed, and
  a small training step eager vs ``torch.cuda.make_graphed_callables``, per batch size.

Settings: ``env_sets`` (default: NCCL's default and ``NCCL_GRAPH_MIXING_SUPPORT=0``) -- one launch per set, since
NCCL reads the variable when the communicator is created. Without CUDA only the eager timing runs (gloo).
Weights differ per rank (like tensor-parallel shards) and are drawn with variance 1/(hidden * world): the
all-reduced sum of the ranks' outputs then keeps E|y|^2 constant through any number of layers, so the timing
is of real numbers, neither inf nor underflowed zeros (each profile row records the output's RMS as proof).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .. import timing, traces
from ..config import LaunchConfig


@dataclass
class Config(LaunchConfig):
    env_sets: list[dict[str, str]] = field(default_factory=lambda: [{}, {"NCCL_GRAPH_MIXING_SUPPORT": "0"}])
    layers: list[int] = field(default_factory=lambda: [10, 40, 160, 640])
    batch: int = 1024
    hidden: int = 2048
    dtype: str = "float32"
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

    def check(self) -> list[str]:
        errs = []
        if not self.layers or min(self.layers) < 1:
            errs.append("layers must be a non-empty list of positive layer counts")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            errs.append(f"dtype {self.dtype!r} not one of float32, float16, bfloat16")
        if min(self.batch, self.hidden, self.iters, self.repeats, self.profile_forwards) < 1:
            errs.append("batch, hidden, iters, repeats, profile_forwards must be >= 1")
        if any(b < 1 for b in self.launch_batches) or self.launch_layers < 1 or self.launch_hidden < 1:
            errs.append("launch_batches, launch_layers, launch_hidden must be positive")
        return errs


def build_forward(n_layers: int, cfg: Config, ctx, comm: bool, hidden: int | None = None, batch: int | None = None):
    """The model's forward as a zero-argument function (input and weights are fixed tensors)."""
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
        for w in weights:
            y = torch.nn.functional.linear(y, w)
            if do_comm:
                dist.all_reduce(y)
        return y

    return forward


def _profile(fn, ctx, forwards: int, keep: Path | None, threshold_us: float) -> dict:
    """Kernel-time sum per forward and gap statistics from a profiler trace of ``forwards`` calls."""
    import numpy as np

    ev = timing.profile_gpu(fn, ctx, forwards, export=str(keep) if keep else None)
    k = ev[ev["cat"] == "kernel"]
    g = traces.gaps(ev, threshold_us)
    ok = g[~g["stall"]]
    out = {"kernel_sum_us": float(k["dur"].sum()) / forwards, "nccl_kernel_sum_us": float(k[k["nccl"]]["dur"].sum()) / forwards,
           "kernels_per_forward": len(k) / forwards, "stalls": int(g["stall"].sum())}
    for kind in ("nccl", "other"):
        v = ok[ok["before"] == kind]["gap_us"].to_numpy()
        out[f"gap_{kind}_n"] = int(v.size)
        out[f"gap_{kind}_median_us"] = float(np.median(v)) if v.size else float("nan")
        out[f"gap_{kind}_p90_us"] = float(np.percentile(v, 90)) if v.size else float("nan")
        out[f"gap_{kind}_sum_us"] = float(v.sum()) / forwards
    return out


def capture(fn, ctx, debug_dot: Path | None = None):
    """A CUDA graph of one call of ``fn`` (kit.timing.capture_graph), optionally dumped as DOT for the census.
    Newer PyTorch drops the captured graph after instantiation unless ``keep_graph=True``."""
    import torch

    if debug_dot is None:
        return timing.capture_graph(fn, ctx, iters=1, warmup=3)
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:  # older torch: the graph is kept in debug mode
        g = torch.cuda.CUDAGraph()
    g.enable_debug_mode()
    return timing.capture_graph(fn, ctx, iters=1, warmup=3, graph=g, debug_dot=debug_dot)


def run(cfg: Config, ctx):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    models = [("allreduce", True)] + ([("matmul-only", False)] if cfg.control else [])
    with torch.inference_mode():
        if ctx.is_cuda:
            yield from _census(cfg, ctx)
        for n in cfg.layers:
            for model, comm in models:
                ctx.step(f"{model} N={n}")
                fwd = build_forward(n, cfg, ctx, comm)
                modes = [("eager", fwd)]
                if ctx.is_cuda:
                    g = capture(fwd, ctx)
                    modes.append(("graph", g.replay))
                keys = dict(model=model, layers=n, batch=cfg.batch, hidden=cfg.hidden, dtype=cfg.dtype, tf32=cfg.tf32)
                for mode, fn in modes:
                    s = timing.measure(fn, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup)
                    s.method = mode
                    for r in s.rows(kind="time", **keys):
                        r["mode"] = r.pop("method")
                        yield r
                    if ctx.is_cuda:
                        keep = (ctx.run_dir / f"trace_{model}_N{n}_{mode}_rank{ctx.rank}.json.gz"
                                if n in cfg.keep_traces else None)
                        yield {"kind": "profile", "mode": mode, **keys, "output_rms": _rms(fwd()),
                               **_profile(fn, ctx, cfg.profile_forwards, keep, cfg.gap_threshold_us)}
                if not ctx.is_cuda:
                    yield {"kind": "check", "model": model, "layers": n, "output_rms": _rms(fwd())}
                del modes, fwd
                if ctx.is_cuda:
                    del g
                    torch.cuda.empty_cache()
    if ctx.is_cuda:
        yield from _launch_overhead(cfg, ctx)


def _rms(y) -> float:
    return float(y.float().pow(2).mean().sqrt())


def _census(cfg: Config, ctx):
    ctx.step(f"census N={cfg.census_layers}")
    fwd = build_forward(cfg.census_layers, cfg, ctx, comm=True)
    dot = ctx.run_dir / f"graph_N{cfg.census_layers}_rank{ctx.rank}.dot"
    g = capture(fwd, ctx, debug_dot=dot)
    counts = traces.graph_census(dot.read_text()) if dot.exists() else {"dump_missing": 1}
    for node, count in sorted(counts.items()):
        yield {"kind": "census", "layers": cfg.census_layers, "node_type": node, "count": count}
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
            for r in s.rows(kind="launch", bench="chain", batch=b, layers=cfg.launch_layers, hidden=h):
                r.pop("method")
                r["mode"] = mode
                yield r
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
        for r in s.rows(kind="launch", bench="train_step", batch=batch, layers=depth, hidden=h):
            r["mode"] = mode
            r.pop("method")
            yield r


# ------------------------------------------------------------------------------------------------- analysis
def forward_table(df):
    """Median time per forward by (label, model, layers, mode), graph/eager ratio and overhead over the
    kernel sum (time per forward minus the summed kernel durations of one forward)."""
    t = df[df["kind"] == "time"]
    per = t.groupby(["label", "model", "layers", "mode", "sample"])["time_us"].max().reset_index()  # slowest rank
    s = timing.summarize(per, ["label", "model", "layers", "mode"])
    p = df[df["kind"] == "profile"]
    if not p.empty:
        by = ["label", "model", "layers", "mode"]
        # kernel sum: the rank whose NCCL kernels waited least for a peer (min over ranks), as in collectives
        ks = p.groupby(by)[["gap_nccl_median_us", "gap_other_median_us", "gap_nccl_p90_us"]].median().reset_index()
        ks = ks.merge(p.groupby(by)["kernel_sum_us"].min().reset_index(), on=by)
        s = s.merge(ks, on=["label", "model", "layers", "mode"], how="left")
        s["overhead_us"] = s["time_us_median"] - s["kernel_sum_us"]
    eager = s[s["mode"] == "eager"].set_index(["label", "model", "layers"])["time_us_median"]
    s["graph_over_eager"] = [
        row.time_us_median / eager.get((row.label, row.model, row.layers), float("nan")) if row.mode == "graph" else float("nan")
        for row in s.itertuples()]
    return s


def census_table(df):
    c = df[df["kind"] == "census"]
    if c.empty:
        return c
    return c[c["rank"] == c["rank"].min()].pivot_table(index="node_type", columns="label", values="count", aggfunc="first").fillna(0).astype(int)


def launch_table(df):
    d = df[df["kind"] == "launch"]
    if d.empty:
        return d
    s = timing.summarize(d[d["rank"] == 0], ["bench", "batch", "mode"])
    w = s.pivot_table(index=["bench", "batch"], columns="mode", values="time_us_median")
    w["speedup"] = w["eager"] / w["graph"]
    return w.reset_index()


def kept_trace_gaps(run_dirs, threshold_us: float = 1000.0):
    """Every kernel gap from the traces kept in ``run_dirs`` (columns of kit.traces.gaps plus label, model,
    layers, mode, rank), for distributions."""
    import re

    import pandas as pd

    from .. import results

    frames = []
    for d in map(Path, run_dirs):
        label = results.run_label(results.read_meta(d)) or d.name
        for f in sorted(d.glob("trace_*_N*_*_rank*.json.gz")):
            m = re.match(r"trace_(.+)_N(\d+)_(\w+)_rank(\d+)\.json\.gz", f.name)
            if not m:
                continue
            g = traces.gaps(traces.gpu_events(traces.load(f)), threshold_us)
            frames.append(g.assign(label=label, model=m.group(1), layers=int(m.group(2)), mode=m.group(3),
                                   rank=int(m.group(4)), trace=f.name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def one_layer_window(events, threshold_us: float = 1000.0):
    """The GPU events of one representative layer: the NCCL kernel whose gap before it is the median of all
    gaps before NCCL kernels in this trace, with what ran since the previous NCCL kernel ended (the GEMM,
    the gap, the NCCL kernel)."""
    g = traces.gaps(events, threshold_us)
    g = g[(g["before"] == "nccl") & ~g["stall"]].sort_values("gap_us").reset_index(drop=True)
    k = events.sort_values("ts")
    if g.empty:
        return k
    pick = g.iloc[len(g) // 2]
    nccl = k[k["nccl"]]
    prev = nccl[nccl["end"] <= pick["ts"]]
    t0 = prev["end"].iloc[-1] if len(prev) else pick["ts"] - 50
    return k[(k["end"] > t0 - 2) & (k["ts"] < pick["end"] + 2)]
