"""Collective bandwidth: what a PyTorch program gets from each collective, next to what the hardware does.

For every collective and size, on every rank, three timings (all samples kept):

* ``eager``  -- CUDA events around ``iters`` queued ``torch.distributed`` calls on the current stream: what a
  PyTorch program gets. The host time to enqueue one call is kept beside it (``host_us``): when it exceeds the
  device time, the GPU waits for Python and the eager number measures the host, not the network.
* ``graph``  -- the same ``iters`` calls captured in one CUDA graph and replayed: device-only time without
  per-call host work (CUDA only).
* ``kernel`` -- the durations of the NCCL kernels of one profiled eager loop (torch.profiler / CUPTI), CUDA
  only. A collective kernel starts on each GPU when that rank launches it and spins until its peers arrive,
  so on every rank but the last to arrive it includes waiting for a late peer (seen on 2xH200 at 1 MiB:
  12 us on one rank, 63 us on the other, whose host was ahead). The summary therefore takes, per call, the
  *shortest* duration over ranks: the last rank to arrive waits for no one, its kernel is the transfer.
* ``nccl-tests`` / ``nccl-tests-graph`` -- when the nccl-tests binaries are available (``nccl_tests``
  parameter), their out-of-place time for the same sizes, plain and with ``-G`` (its own CUDA-graph mode,
  the like-for-like reference for ``graph``), run by the launcher process after the ranks have finished.

Sizes follow nccl-tests: ``bytes`` is the larger of the send and receive buffers (for all_gather the gathered
output, for reduce_scatter the input), rounded down so each rank's part is a whole number of 16-byte aligned
elements. ``algbw = bytes / time``; ``busbw = algbw * factor`` with nccl-tests' factors for n ranks:
all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast 1. busbw is comparable
across collectives and to the link speed; algbw is what the caller sees per byte of its buffer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from .. import timing
from ..config import LaunchConfig

ALL = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
NCCL_TESTS_BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
                       "reduce_scatter": "reduce_scatter_perf", "broadcast": "broadcast_perf",
                       "all_to_all": "alltoall_perf"}
_NCCL_TESTS_DTYPE = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double",
                     "int32": "int32", "int8": "int8"}


@dataclass
class Config(LaunchConfig):
    collectives: list[str] = field(default_factory=lambda: list(ALL))
    min_bytes: int = 1024
    max_bytes: int = 1 << 30
    dtype: str = "float32"
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
        bad = [c for c in self.collectives if c not in ALL]
        if bad:
            errs.append(f"unknown collective(s) {bad}; choose from {ALL}")
        if self.min_bytes < 1 or self.max_bytes < self.min_bytes:
            errs.append(f"need 1 <= min_bytes <= max_bytes (got {self.min_bytes}, {self.max_bytes})")
        if self.dtype not in _NCCL_TESTS_DTYPE:
            errs.append(f"dtype {self.dtype!r} not one of {list(_NCCL_TESTS_DTYPE)}")
        if min(self.iters, self.repeats) < 1 or self.warmup < 0:
            errs.append("iters and repeats must be >= 1, warmup >= 0")
        return errs


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw factor for ``n`` ranks."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise ValueError(collective)


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, b = [], min_bytes
    while b <= max_bytes:
        out.append(b)
        b *= 2
    return out


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
    """Seconds per NCCL kernel over one profiled loop of ``iters`` calls (kit.timing.profile_gpu)."""
    ev = timing.profile_gpu(fn, ctx, iters)
    return (ev[ev["nccl"]]["dur"] / 1e6).tolist()


def _human(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def _with_bw(rows: list[dict], collective: str, world: int) -> list[dict]:
    f = bus_factor(collective, world)
    for r in rows:
        t = r["time_us"] * 1e-6
        r["algbw_gbps"] = r["bytes"] / t / 1e9 if t > 0 else float("nan")
        r["busbw_gbps"] = r["algbw_gbps"] * f
    return rows


def run(cfg: Config, ctx):
    """The rank function: yields one row per sample per (collective, size, method)."""
    import torch

    dtype = getattr(torch, cfg.dtype)
    for coll in cfg.collectives:
        for nbytes in sizes(cfg.min_bytes, cfg.max_bytes):
            ctx.step(f"{coll} {_human(nbytes)}")
            op, actual = _make_op(coll, nbytes, ctx, dtype)
            keys = dict(collective=coll, bytes=actual, dtype=cfg.dtype, world_size=ctx.world_size,
                        backend=ctx.backend, iters=cfg.iters)
            rows = timing.measure(op, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=cfg.warmup).rows(**keys)
            if ctx.is_cuda and cfg.device_time:
                try:
                    rows += timing.measure_graph(op, ctx, iters=cfg.iters, repeats=cfg.repeats, warmup=2).rows(**keys)
                except Exception as e:  # a capture failure is a finding, not a crash of the sweep
                    ctx.log(f"graph timing failed for {coll} {nbytes} B: {type(e).__name__}: {e}")
            if ctx.is_cuda and cfg.kernel_time:
                ks = kernel_durations(op, ctx, cfg.iters)
                rows += timing.Samples("kernel", ks).rows(**keys)
            yield from _with_bw(rows, coll, ctx.world_size)
            del op
            if ctx.is_cuda:
                torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------- nccl-tests
def find_nccl_tests(setting: str) -> dict[str, str]:
    """Map collective -> nccl-tests binary. ``setting``: 'auto' (PATH, $NCCL_TESTS_DIR), a directory, a binary."""
    if not setting:
        return {}
    dirs: list[str] = []
    if setting == "auto":
        if os.environ.get("NCCL_TESTS_DIR"):
            dirs.append(os.environ["NCCL_TESTS_DIR"])
    elif os.path.isfile(setting):
        dirs.append(os.path.dirname(setting) or ".")
    else:
        dirs.append(setting)
    found = {}
    for coll, exe in NCCL_TESTS_BINARIES.items():
        for d in dirs:
            for cand in (os.path.join(d, exe), os.path.join(d, "build", exe)):
                if os.access(cand, os.X_OK):
                    found[coll] = cand
                    break
            if coll in found:
                break
        if coll not in found and setting == "auto":
            p = shutil.which(exe)
            if p:
                found[coll] = p
    return found


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


def parse_nccl_tests(text: str, collective: str) -> list[dict]:
    """Rows from nccl-tests' table: size, count, type, redop, root, then out-of-place and in-place
    (time us, algbw GB/s, busbw GB/s, #wrong). Both placements are kept (``placement`` column)."""
    rows = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _ROW.match(line)
        if not m:
            continue
        size = int(m.group(1))
        for placement, (t, a, b) in (("out-of-place", m.group(6, 7, 8)), ("in-place", m.group(10, 11, 12))):
            try:
                t, a, b = float(t), float(a), float(b)
            except ValueError:
                continue
            rows.append(dict(collective=collective, bytes=size, method="nccl-tests", placement=placement,
                             sample=0, time_us=t, algbw_gbps=a, busbw_gbps=b, rank=-1))
    return rows


def run_nccl_tests(binaries: dict[str, str], cfg: Config, ngpus: int, timeout_s: float = 600) -> tuple[list[dict], list[str]]:
    """Run each binary over the configured sizes on ``ngpus`` GPUs of this node (one process, -g ngpus)."""
    rows, logs = [], []
    env = {**os.environ, **cfg.env}
    # as many timed calls as one of our points (iters x repeats); a longer warm-up than ours because each
    # binary is a fresh process whose GPU clocks and NCCL connections start cold
    n, w = cfg.iters * cfg.repeats, max(cfg.warmup, 20)
    for coll in cfg.collectives:
        exe = binaries.get(coll)
        if not exe:
            continue
        base = [exe, "-b", str(cfg.min_bytes), "-e", str(cfg.max_bytes), "-f", "2", "-g", str(ngpus),
                "-w", str(w), "-d", _NCCL_TESTS_DTYPE[cfg.dtype], "-c", "0"]
        for method, extra in (("nccl-tests", ["-n", str(n)]), ("nccl-tests-graph", ["-n", str(cfg.iters), "-G", str(cfg.repeats)])):
            cmd = base + extra
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logs.append(f"$ {' '.join(cmd)}\n(timed out after {timeout_s:g} s)")
                continue
            logs.append(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
            for r in parse_nccl_tests(p.stdout, coll):
                r.update(method=method, world_size=ngpus, iters=cfg.iters, dtype=cfg.dtype)
                rows.append(r)
    return rows, logs


def after(cfg: Config, run) -> None:
    """Launcher-side step once the ranks are done: nccl-tests at the same sizes, into the same run."""
    from .. import results

    meta = run.meta
    if meta.get("backend") != "nccl" or meta.get("mode") != "spawn":
        return
    binaries = find_nccl_tests(cfg.nccl_tests)
    meta["nccl_tests"] = {"binaries": binaries}
    if not binaries:
        return
    rows, logs = run_nccl_tests(binaries, cfg, meta["world_size"])
    (run.dir / "nccl-tests.log").write_text("\n\n".join(logs))
    run.add_rows(rows)
    results.write_json(run.dir / "meta.json", meta)


# ----------------------------------------------------------------------------------------------- analysis
def summarize(df):
    """One row per (label, collective, bytes, method): per sample one time over ranks, then stats.

    ``eager``/``graph``: a collective is finished when its slowest rank is, so a sample's time is the max over
    ranks (samples are barrier-aligned: sample i is the same round on every rank). ``kernel``: the min over
    ranks, the duration on the rank that arrived last (the others include waiting for it). nccl-tests rows
    are taken as printed (out-of-place). busbw/algbw come from the median time.
    """
    import pandas as pd

    if df.empty:
        return df
    keys = [k for k in ("label", "collective", "bytes", "method") if k in df.columns]
    external = df["method"].astype(str).str.startswith("nccl-tests")
    d = df[~external]
    # eager/graph: a call ends when its slowest rank does -> max over ranks. kernel: the last rank to arrive
    # does not wait for peers, its kernel is the transfer -> min over ranks (see the module docstring).
    agg = d.groupby(keys + ["sample"], dropna=False)["time_us"]
    per_sample = agg.max().reset_index()
    kmin = agg.min().reset_index()
    is_kernel = per_sample["method"] == "kernel"
    per_sample.loc[is_kernel, "time_us"] = kmin.loc[is_kernel, "time_us"].to_numpy()
    if "host_us" in d.columns:
        host = d.groupby(keys, dropna=False)["host_us"].median().rename("host_us_median").reset_index()
    s = timing.summarize(per_sample, keys)
    if "host_us" in d.columns:
        s = s.merge(host, on=keys, how="left")
    nt = df[external & (df.get("placement", "out-of-place") == "out-of-place")]
    if not nt.empty:
        nts = nt.groupby(keys, dropna=False)["time_us"].median().rename("time_us_median").reset_index()
        nts["time_us_n"] = 1
        s = pd.concat([s, nts], ignore_index=True)
    world = int(df["world_size"].dropna().iloc[0]) if "world_size" in df.columns else 2
    s["algbw_gbps"] = s["bytes"] / (s["time_us_median"] * 1e-6) / 1e9
    s["busbw_gbps"] = [a * bus_factor(c, world) for a, c in zip(s["algbw_gbps"], s["collective"])]
    return s.sort_values(keys).reset_index(drop=True)
