"""Why a gradient all-reduce looks slower in training than in nccl-tests: host-to-device copies, stream
synchronisation, and how gradients are synchronised.

A data-parallel VGG11 (defined here; ``width`` scales it down for CPU) trains with SGD on a real
``torch.utils.data.DataLoader`` over a synthetic on-disk dataset (raw float32 samples in class folders, made
once in a cache directory). Every combination of

* **H2D mode** -- ``pageable``: ``.to(device)`` from pageable memory on the default stream (blocks the host for
  the copy); ``pinned``: pinned memory, ``non_blocking=True``, default stream; ``side_stream``: pinned,
  ``non_blocking`` on a side stream, then ``wait_stream`` + ``record_stream``; ``prefetch``: the next batch's copy
  issued on the side stream before the current step runs;
* **sync mode** -- ``per_param``: ``dist.all_reduce`` on each parameter's gradient after backward (the report's
  loop); ``flat``: one all-reduce of all gradients flattened into one buffer; ``ddp``: DistributedDataParallel
  (buckets all-reduced while backward runs), bucket size ``bucket_cap_mb``; ``ddp_one_bucket``: DDP with a single
  bucket, i.e. no overlap with backward,

is timed per step (rows ``kind=step``): data wait (host time in ``next(loader)``), H2D (CUDA events on the copy's
stream) and the host time blocked in the copy call, forward, backward, sync, optimizer (CUDA events on the default
stream), the step on the device, and ``wall_per_step_us`` (wall-clock time of the timed steps / steps). The loop never
waits for the GPU inside the timed steps -- events are read after them -- so the host runs ahead as in a real
training loop, and whatever blocks it (a pageable copy) shows up. For DDP, synchronisation happens inside backward (the reducer's hooks); its exposed
part comes from the profiler trace (``kind=overlap``: communication-kernel time and the part not hidden by compute).

``per_param`` also times each parameter's all-reduce the report's way (``kind=param_allreduce``: CUDA events on
the default stream around the call) and keeps the profiler traces, whose kernel durations of the same
all-reduces show how much of the "slow all-reduce" is the all-reduce. ``flat`` gives the gradient sync's
effective bandwidth (``kind=grad_sync``) to set beside the collective-bandwidth sweep at the same byte count.
Without CUDA only ``pageable`` runs (the other modes are about CUDA streams and pinned memory; rows
``kind=skipped`` say so); the sync-mode comparison holds on gloo.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import timing, traces
from ..traces import comm as comm_trace
from ..config import LaunchConfig

H2D_MODES = ["pageable", "pinned", "side_stream", "prefetch"]
SYNC_MODES = ["per_param", "flat", "ddp", "ddp_one_bucket"]
CUDA_ONLY_H2D = {"pinned", "side_stream", "prefetch"}
DDP_DEFAULT_BUCKET_MB = 25.0  # torch.nn.parallel.DistributedDataParallel's default bucket_cap_mb
ONE_BUCKET_MB = 1e6  # larger than any model here: every gradient lands in one bucket, reduced after backward


@dataclass
class Config(LaunchConfig):
    data_dir: str = ""
    """dataset cache; '' = <results_root>/_data"""
    samples: int = 512
    image_size: int = 224
    classes: int = 10
    batch: int = 32
    num_workers: int = 4
    pin_memory: bool = True
    width: int = 64
    """VGG11's first conv width (64 = the real VGG11; channels and classifier scale with it)"""
    h2d_modes: list[str] = field(default_factory=lambda: list(H2D_MODES))
    sync_modes: list[str] = field(default_factory=lambda: list(SYNC_MODES))
    bucket_caps_mb: list[float] = field(default_factory=lambda: [1.0, 5.0, 25.0, 100.0])
    """DDP bucket sweep (prefetch H2D), 25 = PyTorch's default"""
    steps: int = 12
    warmup: int = 3
    profile_steps: int = 2
    keep_traces: list[str] = field(default_factory=lambda: ["pageable+per_param", "prefetch+ddp"])
    lr: float = 0.01

    def check(self) -> list[str]:
        errs = []
        bad = [m for m in self.h2d_modes if m not in H2D_MODES] + [m for m in self.sync_modes if m not in SYNC_MODES]
        if bad:
            errs.append(f"unknown mode(s) {bad}; h2d modes: {H2D_MODES}, sync modes: {SYNC_MODES}")
        if min(self.samples, self.image_size, self.classes, self.batch, self.width, self.steps) < 1:
            errs.append("samples, image_size, classes, batch, width, steps must be >= 1")
        if self.image_size < 32:
            errs.append("image_size must be >= 32 (VGG11 halves it five times)")
        if self.num_workers < 0 or self.warmup < 0 or self.profile_steps < 0:
            errs.append("num_workers, warmup, profile_steps must be >= 0")
        if any(b <= 0 for b in self.bucket_caps_mb):
            errs.append("bucket_caps_mb must be positive")
        return errs

    def check_world(self, world: int) -> list[str]:
        per_rank = self.samples // max(world, 1)
        if self.batch > per_rank:
            return [f"batch {self.batch} is larger than the dataset's share per rank ({self.samples} samples / "
                    f"{world} ranks = {per_rank}); lower batch or raise samples"]
        return []


# --------------------------------------------------------------------------------------------------- dataset
def make_dataset(root: str | Path, samples: int, image_size: int, classes: int, seed: int = 0) -> Path:
    """Write ``samples`` raw float32 images (3 x image_size x image_size) into ``root/<params>/class_<c>/``
    once; later calls with the same parameters reuse it (``manifest.json`` marks a complete dataset)."""
    import numpy as np

    d = Path(root) / f"raw-{samples}x3x{image_size}x{image_size}-c{classes}-s{seed}"
    if (d / "manifest.json").exists():
        return d
    tmp = d.with_name(d.name + f".tmp{os.getpid()}")
    rng = np.random.default_rng(seed)
    for i in range(samples):
        c = i % classes
        (tmp / f"class_{c}").mkdir(parents=True, exist_ok=True)
        rng.standard_normal((3, image_size, image_size), dtype=np.float32).tofile(tmp / f"class_{c}" / f"{i:06d}.bin")
    (tmp / "manifest.json").write_text(json.dumps({"samples": samples, "shape": [3, image_size, image_size],
                                                   "dtype": "float32", "classes": classes, "seed": seed}))
    try:
        os.replace(tmp, d)  # atomic: another rank or process may have finished first
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return d


class RawImageFolder:
    """A map-style dataset over the class folders: (float32 tensor 3 x S x S, class index)."""

    def __init__(self, root: str | Path):
        root = Path(root)
        m = json.loads((root / "manifest.json").read_text())
        self.shape = tuple(m["shape"])
        self.files = sorted(root.glob("class_*/*.bin"))
        self.labels = [int(f.parent.name.split("_")[1]) for f in self.files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        import numpy as np
        import torch

        x = torch.from_numpy(np.fromfile(self.files[i], dtype=np.float32).reshape(self.shape))
        return x, self.labels[i]


# --------------------------------------------------------------------------------------------------- model
def vgg11(width: int = 64, classes: int = 1000):
    """VGG11 (configuration "A"): 8 conv layers 64-128-256-256-512-512-512-512 with 5 max-pools, adaptive
    average pool to 7x7, classifier 4096-4096-classes. ``width`` scales every width by width/64."""
    import torch.nn as nn

    s = width / 64
    cfg = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]
    layers, c_in = [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            c = max(int(v * s), 1)
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(inplace=True)]
            c_in = c
    hidden = max(int(4096 * s), 1)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(),
                         nn.Linear(c_in * 49, hidden), nn.ReLU(inplace=True), nn.Dropout(),
                         nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(hidden, classes))


# --------------------------------------------------------------------------------------------------- sync
def sync_gradients(model, mode: str, world: int, on_param=None) -> None:
    """Average gradients across ranks for the non-DDP modes (DDP averages inside backward)."""
    import torch
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.grad is not None]
    if mode == "per_param":
        for i, p in enumerate(params):
            if on_param:
                on_param(i, p, "before")
            dist.all_reduce(p.grad)
            if on_param:
                on_param(i, p, "after")
            p.grad.div_(world)
    elif mode == "flat":
        flat = torch._utils._flatten_dense_tensors([p.grad for p in params])
        dist.all_reduce(flat)
        flat.div_(world)
        for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, [p.grad for p in params])):
            p.grad.copy_(g)
    elif mode not in ("ddp", "ddp_one_bucket"):
        raise ValueError(mode)


# --------------------------------------------------------------------------------------------------- the loop
class _H2D:
    """Moves a CPU batch to the device in one of the H2D modes; ``get()`` returns the device batch for this
    step (making the default stream wait for the copy where one is needed)."""

    def __init__(self, mode: str, ctx, loader):
        import torch

        self.mode, self.ctx, self.it = mode, ctx, iter(loader)
        self.loader = loader
        self.side = torch.cuda.Stream(ctx.device) if mode in ("side_stream", "prefetch") else None
        self.next = None
        self.stats = {}

    def _fetch(self):
        t = time.perf_counter()
        try:
            xb, yb = next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            xb, yb = next(self.it)
        self.stats["data_wait_us"] = (time.perf_counter() - t) * 1e6
        return xb, yb

    def _copy(self, xb, yb):
        import torch

        if not self.ctx.is_cuda:
            t = time.perf_counter()
            out = xb.to(self.ctx.device), yb.to(self.ctx.device)
            self.stats["h2d_host_us"] = self.stats["h2d_us"] = (time.perf_counter() - t) * 1e6
            return out
        stream = self.side or torch.cuda.current_stream(self.ctx.device)
        nb = self.mode != "pageable"
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # one pair per copy
        with torch.cuda.stream(stream):
            ev[0].record(stream)
            t = time.perf_counter()
            x, y = xb.to(self.ctx.device, non_blocking=nb), yb.to(self.ctx.device, non_blocking=nb)
            self.stats["h2d_host_us"] = (time.perf_counter() - t) * 1e6
            ev[1].record(stream)
        self._pending = ev
        return x, y

    def get(self):
        import torch

        if self.mode == "prefetch":
            if self.next is None:
                self.next = self._copy(*self._fetch())
            x, y = self.next
            cur = torch.cuda.current_stream(self.ctx.device)
            cur.wait_stream(self.side)
            x.record_stream(cur)  # the side stream's allocation is used on the default stream now
            y.record_stream(cur)
            pend = self._pending
            self.next = self._copy(*self._fetch())  # the next batch's copy overlaps this step
            self._step_pending = pend
            return x, y
        x, y = self._copy(*self._fetch())
        self._step_pending = getattr(self, "_pending", None)
        if self.side is not None:
            cur = torch.cuda.current_stream(self.ctx.device)
            cur.wait_stream(self.side)
            x.record_stream(cur)
            y.record_stream(cur)
        return x, y



def _loader(cfg: Config, ctx, dataset, pinned: bool):
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0,
                                 drop_last=True)
    return DataLoader(dataset, batch_size=cfg.batch, sampler=sampler, num_workers=cfg.num_workers,
                      pin_memory=pinned and ctx.is_cuda, drop_last=True, persistent_workers=cfg.num_workers > 0,
                      generator=torch.Generator().manual_seed(0))


def build(cfg: Config, ctx, sync: str, bucket_mb: float):
    """(model as trained, the underlying module, optimizer) for one sync mode."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)  # same initial weights on every rank, as DDP would broadcast
    model = vgg11(cfg.width, cfg.classes).to(ctx.device)
    module = model
    if sync in ("ddp", "ddp_one_bucket"):
        cap = ONE_BUCKET_MB if sync == "ddp_one_bucket" else bucket_mb
        model = DDP(model, device_ids=[ctx.local_rank] if ctx.is_cuda else None, bucket_cap_mb=cap)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    return model, module, opt


def train(cfg: Config, ctx, h2d: str, sync: str, bucket_mb: float, dataset, trace_path: Path | None = None):
    """Warm-up, ``cfg.steps`` timed steps and (optionally) profiled steps of one configuration; yields rows."""
    import torch
    import torch.nn.functional as F

    model, module, opt = build(cfg, ctx, sync, bucket_mb)
    loader = _loader(cfg, ctx, dataset, pinned=cfg.pin_memory and h2d != "pageable")
    mover = _H2D(h2d, ctx, loader)
    keys = dict(h2d=h2d, sync=sync, bucket_cap_mb=bucket_mb if sync == "ddp" else (ONE_BUCKET_MB if sync == "ddp_one_bucket" else None))
    cuda = ctx.is_cuda
    E = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else None
    param_events: list = []

    def on_param(i, p, when):
        if cuda and when == "before":
            e0 = E()
            e0.record()
            param_events.append([i, p.numel() * p.element_size(), e0, None])
        elif cuda:
            e1 = E()
            e1.record()
            param_events[-1][3] = e1

    def one_step(record: bool):
        """One training step. Nothing here waits for the GPU: events are read after the timed steps, so the
        host runs ahead as in a real loop (and a blocking pageable copy shows as host time)."""
        t_host = time.perf_counter()
        ev = [E() for _ in range(5)] if cuda else None
        host = {}
        x, y = mover.get()
        if cuda:
            ev[0].record()
        t = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        if cuda:
            ev[1].record()
        host["forward_host_us"] = (time.perf_counter() - t) * 1e6
        opt.zero_grad(set_to_none=True)
        t = time.perf_counter()
        loss.backward()
        if cuda:
            ev[2].record()
        host["backward_host_us"] = (time.perf_counter() - t) * 1e6
        t = time.perf_counter()
        params = None
        if record and sync == "per_param":
            param_events.clear()
        sync_gradients(module, sync, ctx.world_size, on_param if (record and sync == "per_param") else None)
        if cuda:
            ev[3].record()
        host["sync_host_us"] = (time.perf_counter() - t) * 1e6
        t = time.perf_counter()
        opt.step()
        if cuda:
            ev[4].record()
        host["optimizer_host_us"] = (time.perf_counter() - t) * 1e6
        host["step_host_us"] = (time.perf_counter() - t_host) * 1e6
        host.update(data_wait_us=mover.stats.get("data_wait_us"), h2d_host_us=mover.stats.get("h2d_host_us"))
        pend = getattr(mover, "_step_pending", None)
        if record and sync == "per_param":
            params = list(param_events)
        return host, ev, pend, loss.detach(), params

    def resolve(host, ev, pend, loss):
        """Turn one step's events into times (after a device synchronize)."""
        times = dict(host)
        if cuda:
            times.update(forward_us=ev[0].elapsed_time(ev[1]) * 1e3, backward_us=ev[1].elapsed_time(ev[2]) * 1e3,
                         sync_us=ev[2].elapsed_time(ev[3]) * 1e3, optimizer_us=ev[3].elapsed_time(ev[4]) * 1e3,
                         step_us=ev[0].elapsed_time(ev[4]) * 1e3,
                         h2d_us=pend[0].elapsed_time(pend[1]) * 1e3 if pend else None)
        else:
            times.update(forward_us=host["forward_host_us"], backward_us=host["backward_host_us"],
                         sync_us=host["sync_host_us"], optimizer_us=host["optimizer_host_us"],
                         step_us=host["step_host_us"], h2d_us=mover.stats.get("h2d_us"))
        times["loss"] = float(loss)
        return times

    ctx.step(f"{h2d}+{sync} bucket={bucket_mb}: warm-up")
    for _ in range(cfg.warmup):
        one_step(False)
    ctx.barrier()
    ctx.step(f"{h2d}+{sync} bucket={bucket_mb}: {cfg.steps} steps")
    t0 = time.perf_counter()
    recorded = [one_step(True) for _ in range(cfg.steps)]
    ctx.sync()
    wall_us = (time.perf_counter() - t0) * 1e6
    for s, (host, ev, pend, loss, params) in enumerate(recorded):
        yield {"kind": "step", **keys, "step": s, **resolve(host, ev, pend, loss), "wall_per_step_us": wall_us / cfg.steps}
        for i, nbytes, e0, e1 in params or []:
            yield {"kind": "param_allreduce", **keys, "step": s, "param": i, "bytes": nbytes,
                   "event_us": e0.elapsed_time(e1) * 1e3}
    if sync == "flat":
        nbytes = sum(p.numel() * p.element_size() for p in module.parameters())
        yield {"kind": "grad_sync", **keys, "bytes": nbytes}
    if cfg.profile_steps and trace_path is not None:
        ctx.step(f"{h2d}+{sync}: profiling")
        timing.trace_steps(lambda: one_step(False), ctx, cfg.profile_steps, trace_path)
        if cuda:
            ev = traces.gpu_events(traces.load(trace_path, keep=lambda e: e.get("cat") in traces.GPU_CATS))
            for r in comm_trace.overlap(ev[ev["device"] == ctx.local_rank]).to_dict("records"):
                yield {"kind": "overlap", **keys, **r, "steps": cfg.profile_steps}
    del mover, loader, model, module, opt  # free this configuration's model and pinned buffers before the next
    if cuda:
        torch.cuda.empty_cache()


def run(cfg: Config, ctx):
    import torch.distributed as dist

    errs = cfg.check_world(ctx.world_size)
    if errs:
        raise ValueError("; ".join(errs))
    root = Path(cfg.data_dir or Path(cfg.results_root) / "_data")
    ctx.step("dataset")
    if ctx.rank == 0:
        make_dataset(root, cfg.samples, cfg.image_size, cfg.classes)
    ctx.barrier()
    dataset = RawImageFolder(make_dataset(root, cfg.samples, cfg.image_size, cfg.classes))
    combos = [(h, s, DDP_DEFAULT_BUCKET_MB) for h in cfg.h2d_modes for s in cfg.sync_modes]
    if "ddp" in cfg.sync_modes:
        h_best = "prefetch" if ("prefetch" in cfg.h2d_modes and ctx.is_cuda) else cfg.h2d_modes[0]
        combos += [(h_best, "ddp", b) for b in cfg.bucket_caps_mb if b != DDP_DEFAULT_BUCKET_MB]
    for h2d, sync, bucket in combos:
        if h2d in CUDA_ONLY_H2D and not ctx.is_cuda:
            yield {"kind": "skipped", "h2d": h2d, "sync": sync, "reason": f"{h2d} needs CUDA (pinned memory, streams)"}
            continue
        tag = f"{h2d}+{sync}"
        keep = tag in cfg.keep_traces and bucket == DDP_DEFAULT_BUCKET_MB
        path = ctx.run_dir / (f"trace_{h2d}_{sync}_rank{ctx.rank}.json.gz" if keep else f".trace_tmp_rank{ctx.rank}.json")
        yield from train(cfg, ctx, h2d, sync, bucket, dataset, trace_path=path if cfg.profile_steps else None)
        if not keep and path.exists():
            path.unlink()
    dist.barrier()


# --------------------------------------------------------------------------------------------------- analysis
PARTS = ["data_wait_us", "h2d_us", "forward_us", "backward_us", "sync_us", "optimizer_us"]


def breakdown(df):
    """Median per (h2d, sync, bucket) of each part of a step and of the step, slowest rank per step."""
    s = df[df["kind"] == "step"].copy()
    s["bucket_cap_mb"] = s["bucket_cap_mb"].fillna(-1)
    keys = ["h2d", "sync", "bucket_cap_mb"]
    cols = PARTS + ["step_us", "step_host_us", "h2d_host_us"] + (["wall_per_step_us"] if "wall_per_step_us" in s else [])
    per = s.groupby(keys + ["step"])[cols].max().reset_index()
    out = per.groupby(keys)[cols].median().reset_index()
    out["bucket_cap_mb"] = out["bucket_cap_mb"].where(out["bucket_cap_mb"] >= 0)
    return out


def event_vs_kernel(df, run_dir, h2d: str = "pageable"):
    """Per parameter of the per_param loop: the all-reduce timed with CUDA events on the default stream (the
    report's way, median over steps and ranks) next to the NCCL kernel's duration from the kept traces
    (per-instance minimum over ranks: the transfer itself)."""
    import pandas as pd

    p = df[(df["kind"] == "param_allreduce") & (df["h2d"] == h2d)]
    if p.empty:
        return pd.DataFrame()
    ev = p.groupby("param").agg(bytes=("bytes", "first"), event_us=("event_us", "median")).reset_index()
    tr = sorted(Path(run_dir).glob(f"trace_{h2d}_per_param_rank*.json.gz"))
    if tr:
        c = comm_trace.collectives(tr)
        c = c[(c["collective"] == "all_reduce") & (c["bytes"].fillna(0) > 64)]  # drop the 4-byte barriers
        k = c.groupby("bytes")["instance_min_us"].median().rename("kernel_us").reset_index()
        ev = ev.merge(k, on="bytes", how="left")
    return ev
