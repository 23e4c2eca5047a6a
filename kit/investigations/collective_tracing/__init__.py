"""Tracing collectives in a real training step: what each collective moved, how fast, how much of it the
compute hid -- and, with the Flight Recorder, which rank a hang waits for.

The run, on every rank (2 ranks at least; gloo on CPU works, CUDA shows the kernels):

* ``ddp`` -- an MLP of ``ddp_layers`` Linear(hidden, hidden) layers under DistributedDataParallel (gradient
  buckets of ``bucket_cap_mb``, all-reduced while backward runs), SGD;
* ``tp``  -- a tensor/sequence-parallel style forward: per layer, all_gather of the sequence shards, a column-
  parallel and a row-parallel matmul, reduce_scatter back to shards.

Each part is timed (``kind=step``), then profiled for ``profile_steps`` steps (one gzipped trace per rank,
``kit.traces.trace_path(ctx, part=...)``: ``trace_part=ddp_rank0.json.gz``); from its own trace each rank
yields ``kind=overlap`` (communication-kernel time, the share compute kernels ran beside, exposed time;
CUDA only) and ``kind=collective`` rows. After the parts, ``kind=fr`` rows (``tag=run``) hold the Flight
Recorder buffer (``TORCH_FR_BUFFER_SIZE`` is in the default env). With ``fr_demo`` the run ends with the
Flight Recorder demo (``tag=mismatch``): three all_reduces everywhere, then one more on rank 0 only, never
joined; both dump their buffers and the sequence number rank 1 lacks names it. Rank 0's pending collective
never completes, so its process is stopped by the launcher's bounded teardown (``teardown_s``, 5 s here): the
run's warning about it is expected and its results are complete. Once the ranks are done, the launcher merges
each part's traces into one Perfetto trace with a process per rank, clocks aligned (``merged_<part>.json.gz``).

With ``nccl_profiler`` (NCCL's profiler plugin, :mod:`kit.nccl_profiler`): the plugin is loaded at launch with
its events off; each part is timed with it idle (``kind=nccl_cost``, ``plugin=idle``) and on (``plugin=on``),
then traced with it on, and a small all_reduce sweep is timed both ways. The dumps
(``nccl_profiler_<commHash>_<rank>.json.gz``, written when the communicator is destroyed at the end of the
rank) and ``nccl_profiler.json`` (plugin, interface version, event mask) land in the run directory; the
merged traces then carry NCCL's events under each NCCL kernel. A launch with ``NCCL_PROFILER_PLUGIN: none``
(``env_sets``) gives the same rows with ``plugin=off``: the baseline of the cost.

The analyses (``tables``/``figures``/``findings``) match every collective across ranks from the kept traces
(kit.traces.collectives: the summary times each instance on the rank that arrived last), put the traced busbw
next to the recorded bandwidth sweep (kit.investigations.collectives) at the same sizes, draw one step of all
ranks on one clock, and line up the Flight Recorder dumps. Runs recorded before the demo was part of the run
kept it apart, in ``collective_tracing_fr/`` beside them: the FR table reads it from there.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Literal

from ... import timing, traces
from ...config import LaunchConfig
from ...contract import Investigation, Needs
from ...nccl_profiler import PluginError, find, runtime
from ...nccl_profiler.merge import merge as merge_with_nccl
from .analysis import FIGURES, PARTS, TABLES, findings
from .nccl_events import NCCL_FIGURES, NCCL_TABLES, nccl_findings

FR_ENV = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}  # new and old name


@dataclass
class Config(LaunchConfig):
    env: dict[str, str] = field(default_factory=lambda: dict(FR_ENV))
    teardown_s: float = 5.0
    """the FR demo leaves rank 0 with a collective that never completes: its exit is cut short after this"""
    ddp_layers: int = 8
    hidden: int = 4096
    batch: int = 64
    bucket_cap_mb: float = 25.0
    tp_layers: int = 4
    tp_tokens: int = 4096
    tp_hidden: int = 4096
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """on CUDA; CPU runs use float32 (bf16 matmuls are slow there)"""
    warmup_steps: int = 3
    timed_steps: int = 10
    profile_steps: int = 3
    fr_demo: bool = True
    """end the run with the Flight Recorder demo (rank 0 issues one all_reduce rank 1 never joins)"""
    nccl_profiler: str = ""
    """NCCL's profiler plugin on the traced steps: '' off; 'auto' the one ``kit nccl-profiler build`` made
    ($KIT_NCCL_PROFILER_DIR, else .nccl-profiler); or the path of its plugin.json, folder or library. Loaded
    at launch with its events off and turned on for the traced steps and the 'on' cost timings."""
    nccl_event_mask: int = 4095
    """the plugin's events while on (NCCL_PROFILE_EVENT_MASK bits; 4095 = all of interface v5)"""
    nccl_cost_sizes: list[int] = field(default_factory=lambda: [4096, 65536, 1048576, 16777216, 67108864])
    """all_reduce sizes (bytes) of the cost sweep, timed with the plugin off / idle / on"""
    nccl_cost_iters: int = 10

    def __post_init__(self) -> None:
        # the plugin must be in the environment the ranks start with (NCCL loads it when the communicator is
        # created); one that cannot be found here is reported by needs(), not here
        if self.nccl_profiler and "NCCL_PROFILER_PLUGIN" not in self.env:
            try:
                plugin = find(None if self.nccl_profiler == "auto" else self.nccl_profiler)
            except PluginError:
                return
            self.env = {**runtime.launch_env(plugin), **self.env}

    def check(self) -> list[str]:
        errs = []
        if self.nccl_profiler and self.fr_demo:
            errs.append("nccl_profiler needs fr_demo: false (the demo leaves rank 0's communicator hung, so NCCL "
                        "never destroys it and the plugin writes no dump)")
        if not 0 <= self.nccl_event_mask <= 4095:
            errs.append("nccl_event_mask must be in 0..4095 (NCCL_PROFILE_EVENT_MASK bits)")
        if min(self.nccl_cost_sizes or [4]) < 4 or self.nccl_cost_iters < 1:
            errs.append("nccl_cost_sizes must be >= 4 bytes and nccl_cost_iters >= 1")
        if min(self.ddp_layers, self.hidden, self.batch, self.tp_layers, self.tp_tokens, self.tp_hidden,
               self.timed_steps, self.profile_steps) < 1:
            errs.append("layer counts, sizes and step counts must be >= 1")
        if self.bucket_cap_mb <= 0:
            errs.append("bucket_cap_mb must be > 0")
        return errs


def needs(cfg: Config, machine) -> list[str]:
    """2 ranks; with ``nccl_profiler`` also NCCL on GPUs and a built plugin."""
    missing = Needs(ranks=2)(cfg, machine)
    if cfg.nccl_profiler and not missing:
        missing = Needs(ranks=2, cuda=True)(cfg, machine)
        if not missing and "NCCL_PROFILER_PLUGIN" not in cfg.env:
            try:
                find(None if cfg.nccl_profiler == "auto" else cfg.nccl_profiler)
            except PluginError as e:
                missing.append(f"nccl_profiler: {e}")
    return missing


# ------------------------------------------------------------------------------------------------ the run
def _dtype(cfg: Config, ctx):
    import torch

    return getattr(torch, cfg.dtype) if ctx.is_cuda else torch.float32


def _ddp_step(cfg: Config, ctx):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    dtype = _dtype(cfg, ctx)
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

    dtype = _dtype(cfg, ctx)
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


def _plugin(cfg: Config, ctx) -> str | None:
    """The plugin library this rank runs with (None: off, or not NCCL)."""
    return runtime.loaded_path() if (cfg.nccl_profiler and ctx.is_cuda) else None


def _plugin_on(cfg: Config, ctx) -> None:
    """Turn NCCL's events on; rank 0 writes ``nccl_profiler.json`` (which plugin, interface, mask) once."""
    from ...nccl_profiler import dump as ncd
    from ...nccl_profiler.plugin import describe

    manifest = ctx.run_dir / ncd.MANIFEST
    if ctx.rank == 0 and not manifest.exists():
        import torch

        manifest.write_text(json.dumps({"plugin": describe(_plugin(cfg, ctx)).to_json(),
                                        "event_mask": cfg.nccl_event_mask, "dump_prefix": runtime.DUMP_STEM,
                                        "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))}, indent=1))
    runtime.start(ctx.run_dir / runtime.DUMP_STEM, cfg.nccl_event_mask)


def _cost(fn, cfg: Config, ctx, iters: int, repeats: int, warmup: int, **keys):
    """``fn`` timed with the plugin as launched (``off`` / ``idle``) and, when loaded, on: kind=nccl_cost rows.
    Leaves the plugin on."""
    state = "idle" if _plugin(cfg, ctx) else "off"
    s = timing.measure(fn, ctx, iters=iters, repeats=repeats, warmup=warmup)
    yield from s.rows(kind="nccl_cost", plugin=state, **keys)
    if state == "idle":
        _plugin_on(cfg, ctx)
        s = timing.measure(fn, ctx, iters=iters, repeats=repeats, warmup=warmup)
        yield from s.rows(kind="nccl_cost", plugin="on", **keys)


def _cost_sweep(cfg: Config, ctx):
    """The plugin's cost on single all_reduces (float32, ``nccl_cost_sizes``), off/idle vs on."""
    import torch
    import torch.distributed as dist

    for size in cfg.nccl_cost_sizes:
        ctx.step(f"nccl profiler cost: all_reduce {size} B")
        t = torch.ones(max(size // 4, 1), device=ctx.device)
        yield from _cost(lambda: dist.all_reduce(t), cfg, ctx, cfg.nccl_cost_iters, 5, 3, what="all_reduce",
                         bytes=size)
        if _plugin(cfg, ctx):
            runtime.stop()


def points(cfg: Config, world: int, cuda: bool) -> int:
    """The measurement points (kit.contract): per part (ddp, tp) its timing, profiler cost (``nccl_profiler``) and
    profiling; the plugin's cost per size; the Flight Recorder demo (two on rank 0: the demo, the unmatched op)."""
    plugin = bool(cfg.nccl_profiler)
    per_part = 2 + (1 if plugin else 0)
    return (len(PARTS) * per_part + (len(cfg.nccl_cost_sizes) if plugin else 0)
            + (2 if cfg.fr_demo and world > 1 else 0))


def run(cfg: Config, ctx):
    import torch

    parts = [("ddp", _ddp_step(cfg, ctx))]
    with torch.no_grad():
        parts.append(("tp", _tp_forward(cfg, ctx)))
    for part, fn in parts:
        ctx.step(f"{part}: warm-up and timing")
        with torch.enable_grad() if part == "ddp" else torch.no_grad():
            s = timing.measure(fn, ctx, iters=1, repeats=cfg.timed_steps, warmup=cfg.warmup_steps)
            yield from s.rows(kind="step", part=part)
            if cfg.nccl_profiler:
                ctx.step(f"{part}: timing with NCCL's profiler plugin idle and on")
                yield from _cost(fn, cfg, ctx, 1, cfg.timed_steps, cfg.warmup_steps, what="step", part=part)
            ctx.step(f"{part}: profiling {cfg.profile_steps} steps")
            path = timing.trace_steps(fn, ctx, cfg.profile_steps, traces.trace_path(ctx, part=part))
            if _plugin(cfg, ctx):
                runtime.stop()
        t = traces.load_trace(path, cpu="comm")  # parsed once: overlap and collectives from the same frames
        if ctx.is_cuda:
            for r in traces.overlap(t.gpu[t.gpu["device"] == ctx.local_rank]).to_dict("records"):
                yield {"kind": "overlap", "part": part, **r, "steps": cfg.profile_steps}
        for r in t.collectives.to_dict("records"):
            yield {"kind": "collective", "part": part, **{k: r[k] for k in traces.comm.ROW_KEYS if k != "rank"},
                   "start_us": r["start_us"]}
    if cfg.nccl_profiler:
        yield from _cost_sweep(cfg, ctx)
    yield from _fr_rows(ctx, "run")
    if cfg.fr_demo and ctx.world_size > 1:
        yield from mismatch(cfg, ctx)


def _fr_rows(ctx, tag: str):
    try:
        dump = traces.dump_flight_recorder()
    except Exception as e:  # no buffer configured, or a build without it: say so in the rows
        yield {"kind": "fr_unavailable", "tag": tag, "reason": f"{type(e).__name__}: {e}"}
        return
    (ctx.run_dir / f"fr_{tag}_rank{ctx.rank}.json").write_text(json.dumps(dump, default=str))
    for r in traces.fr_entries(dump, ctx.rank).to_dict("records"):
        yield {"kind": "fr", "tag": tag, **r}


def mismatch(cfg: Config, ctx):
    """Flight Recorder demo: 3 all_reduces everywhere, then a 4th on rank 0 only (async, never completes)."""
    import torch
    import torch.distributed as dist

    ctx.step("Flight Recorder demo")
    t = torch.ones(1024, device=ctx.device)
    for _ in range(3):
        dist.all_reduce(t)
    ctx.sync()
    if ctx.rank == 0:
        ctx.step("rank 0 issues an all_reduce rank 1 never joins")
        dist.all_reduce(t, async_op=True)
    time.sleep(2.0)  # let the pending op be recorded as scheduled/started
    yield from _fr_rows(ctx, "mismatch")


def after(cfg: Config, run) -> None:
    """Launcher side, once the ranks are done: the NCCL profiler's dumps gzipped, then one merged trace per part
    for Perfetto, ``merged_<part>.json.gz`` (kit.traces.merge: a process per rank, clocks aligned; NCCL's events
    under the kernels when the dumps are there)."""
    import gzip
    import shutil

    for f in run.dir.glob("nccl_profiler*_*_*.json"):
        with open(f, "rb") as src, gzip.open(f.with_name(f.name + ".gz"), "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        f.unlink()
    for part in PARTS:
        paths = [f.path for f in traces.find_traces(run.dir, part=part)]
        if len(paths) > 1:
            try:
                info = merge_with_nccl(paths, run.dir / f"merged_{part}.json.gz")
            except traces.TraceError as e:
                print(f"collective_tracing: no merged {part} trace: {e}")
                continue
            for n in info.get("nccl", []):
                print(f"collective_tracing: {part} rank {n['rank']}: {n['matched']} NCCL profiler collectives under "
                      f"the kernels, alignment error GPU {n['gpu_error_us']} us, host {n['host_error_us']} us")


INVESTIGATION = Investigation(
    name="collective_tracing",
    Config=Config,
    run=run,
    columns=("kind",),
    tables={**TABLES, **NCCL_TABLES},
    figures={**FIGURES, **NCCL_FIGURES},
    findings=lambda runs: findings(runs) + nccl_findings(runs),
    needs=needs,
    after=after,
    points=points,
    question="what each collective of a DDP step and a TP forward moved, how fast, how much compute hid it; "
             "which rank a hang waits for",
)
