"""Planted-fault corpus for ``kit doctor``: small training jobs that are not kit code, each
with one known fault (or none: a control), profiled the ways users profile, plus each job's step time measured
without the profiler.

Two model families, plain ``nn.Module``: a GPT-like transformer and a ResNet-like CNN. Faults:

* ``input_bound``   -- DataLoader with ``num_workers=0`` and a costly per-sample CPU transform;
* ``host_stall``    -- ~20 ms of synchronous Python per step ("logging": json.dumps in a loop), or
  ``gc.collect()`` over a large heap of Python objects (variant ``host_stall_gc``);
* ``allocator_churn`` -- ``torch.cuda.empty_cache()`` after every step and a scratch tensor of a different
  size every step (every allocation goes back to cudaMalloc/cudaFree);
* ``launch_bound``  -- the same batch run as micro-batches of one sample (gradient accumulation): the same
  math in kernels shorter than their launches;
* ``host_sync``     -- ``loss.item()`` after the forward, a per-parameter ``grad.norm().item()`` and a
  ``torch.cuda.synchronize()`` every step;
* ``late_rank``     -- gloo ranks on CPU, one rank sleeps before its backward (the all-reduce);
  ``input_bound`` on every rank is the multi-rank input-bound case.

Profilers: ``tb_handler`` (``torch.profiler`` with ``schedule(wait=1, warmup=1, active=3)`` and
``tensorboard_trace_handler(dir, use_gzip=True)``: its own file names), ``kit.capture`` (the kit's
defaults) and ``no_steps`` (a span of 3 steps profiled without ``prof.step()``, exported with
``export_chrome_trace``).

Each case writes ``<out>/<case>/`` with its traces and ``truth.json``; ``truth.json`` holds the unprofiled step
time (median, p10, p90 and every sample: CUDA events between step ends on a GPU, ``perf_counter`` on CPU) and
``added_us`` = median(case) - median(its control) when the control was run in the same invocation (or is
already in ``<out>``).

Usage (from the repository root)::

    python tests/corpus/planted.py --list
    python tests/corpus/planted.py --cases cpu --out tests/data/doctor/corpus      # CPU single process
    python tests/corpus/planted.py --cases gloo --out tests/data/doctor/corpus     # gloo ranks on CPU
    python tests/corpus/planted.py --cases gpu --out /tmp/corpus                   # one GPU
    python tests/corpus/planted.py --readme tests/data/doctor/corpus               # the README table

Exit status: 0 every case ran, 1 a case failed (its error printed), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import shutil
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------- sizes
SIZES = {
    "cuda": {"gpt": dict(vocab=8192, d=1024, layers=2, heads=16, seq=256, batch=8),
             "cnn": dict(width=64, blocks=1, img=64, batch=96, classes=100)},
    "cpu": {"gpt": dict(vocab=2048, d=128, layers=2, heads=4, seq=64, batch=8),
            "cnn": dict(width=16, blocks=1, img=32, batch=8, classes=10)},
}
FAULT_PARAMS = {
    "input_bound": {"num_workers": 0, "transform_ms_per_batch": 15.0},
    "host_stall": {"stall_ms": 20.0, "what": "json.dumps of a metrics record in a loop, after optimizer.step"},
    "host_stall_gc": {"heap_objects": 300_000, "what": "gc.collect() every step, heap of dicts+lists"},
    "allocator_churn": {"empty_cache": True, "scratch_mib": [32, 512], "what": "empty_cache after every step; "
                        "a scratch tensor of a random size in scratch_mib each step"},
    "launch_bound": {"what": "batch 1 (short inputs), eager: kernels shorter than their launch; its control "
                     "replays the same step as one CUDA graph"},
    "host_sync": {"what": "loss.item() after forward, grad.norm().item() per parameter, "
                  "torch.cuda.synchronize() at step end"},
    "late_rank": {"rank": 1, "sleep_ms": 30.0, "what": "time.sleep before backward (the all-reduce)"},
}
PROFILED_STEPS = 3
"""steps in each trace: the 3 active steps of tb_handler's and kit.capture's schedules, the 3 steps of the no_steps
span (one traced span: per-span costs are for 3 steps)"""
RULE = {"none": None, "input_bound": "input_bound", "host_stall": "host_stall", "host_stall_gc": "host_stall",
        "allocator_churn": "allocator_churn", "launch_bound": "launch_bound", "host_sync": "host_sync",
        "late_rank": "late_rank"}


# --------------------------------------------------------------------------------------------- cases
def _case(name, model, fault, profiler, device, world=1, control=None, **opts):
    return {"name": name, "model": model, "fault": fault, "profiler": profiler, "device": device,
            "world_size": world, "control": control or name, "record_shapes": opts.get("record_shapes", False),
            "with_stack": opts.get("with_stack", False), "graphed": opts.get("graphed", False),
            "sizes": opts.get("sizes", {})}


SMALL = {"gpt": {"batch": 1, "seq": 64}, "cnn": {"batch": 1, "img": 32}}
"""the launch-bound pair's sizes: one sample, short -- the same math eager (the fault) and as one CUDA graph
replayed per step (its control: the same kernels without a launch each)"""


def _cases() -> dict[str, dict]:
    out = []
    for m, prof in (("gpt", "tb_handler"), ("cnn", "kit.capture")):
        ctl = f"{m}-control"
        out.append(_case(ctl, m, "none", prof, "cuda", record_shapes=(m == "gpt")))
        for f in ("input_bound", "host_stall", "host_stall_gc", "allocator_churn", "host_sync"):
            out.append(_case(f"{m}-{f}", m, f, prof, "cuda", control=ctl,
                             record_shapes=(f == "host_sync" or prof == "kit.capture"),
                             with_stack=(m == "gpt" and f == "host_stall_gc")))
        out.append(_case(f"{m}-b1-graphed", m, "none", prof, "cuda", graphed=True, sizes=SMALL[m],
                         record_shapes=(prof == "kit.capture")))
        out.append(_case(f"{m}-launch_bound", m, "launch_bound", prof, "cuda", control=f"{m}-b1-graphed",
                         sizes=SMALL[m], record_shapes=(prof == "kit.capture")))
    out.append(_case("gpt-control-nosteps", "gpt", "none", "no_steps", "cuda"))
    out.append(_case("gpt-input_bound-nosteps", "gpt", "input_bound", "no_steps", "cuda",
                     control="gpt-control-nosteps"))
    out.append(_case("cpu-gpt-control", "gpt", "none", "tb_handler", "cpu"))
    out.append(_case("cpu-gpt-input_bound", "gpt", "input_bound", "tb_handler", "cpu", control="cpu-gpt-control"))
    out.append(_case("cpu-gpt-host_stall", "gpt", "host_stall", "tb_handler", "cpu", control="cpu-gpt-control"))
    out.append(_case("cpu-cnn-control", "cnn", "none", "kit.capture", "cpu", record_shapes=True))
    out.append(_case("cpu-cnn-host_stall_gc", "cnn", "host_stall_gc", "kit.capture", "cpu",
                     control="cpu-cnn-control", record_shapes=True))
    out.append(_case("gloo3-cnn-control", "cnn", "none", "kit.capture", "cpu", world=3, record_shapes=True))
    out.append(_case("gloo3-cnn-late_rank", "cnn", "late_rank", "tb_handler", "cpu", world=3,
                     control="gloo3-cnn-control"))
    out.append(_case("gloo3-cnn-input_bound", "cnn", "input_bound", "kit.capture", "cpu", world=3,
                     control="gloo3-cnn-control", record_shapes=True))
    return {c["name"]: c for c in out}


CASES = _cases()
GROUPS = {"gpu": [n for n, c in CASES.items() if c["device"] == "cuda"],
          "cpu": [n for n, c in CASES.items() if c["device"] == "cpu" and c["world_size"] == 1],
          "gloo": [n for n, c in CASES.items() if c["world_size"] > 1]}
GROUPS["all"] = [n for g in ("gpu", "cpu", "gloo") for n in GROUPS[g]]


# --------------------------------------------------------------------------------------------- models
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq, **_):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        for e in (self.tok, self.pos):  # GPT-2's init: N(0, 1) tied logits put denormals into the CPU backward
            nn.init.normal_(e.weight, std=0.02)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class ResBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))


class CNN(nn.Module):
    def __init__(self, width, blocks, classes, **_):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, c = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width)):
            for j in range(blocks):
                layers.append(ResBlock(c, cout, 2 if (i > 0 and j == 0) else 1))
                c = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x, targets):
        x = self.layers(self.stem(x))
        return F.cross_entropy(self.fc(x.mean((2, 3))), targets)


# --------------------------------------------------------------------------------------------- data
def _tokenize(text: str, vocab: int, rounds: int) -> list[int]:
    """A pure-Python byte-level "tokenizer": the costly per-sample transform of the GPT input-bound case."""
    ids: list[int] = []
    for _ in range(rounds):
        h, ids = 0, []
        for ch in text:
            h = (h * 131 + ord(ch)) % 1_000_003
            if ch == " ":
                ids.append(h % vocab)
                h = 0
    return ids


def _augment(img, rounds: int):
    """Per-sample CPU augmentation of the CNN input-bound case, in numpy as PIL/numpy pipelines do (no torch op
    to show in the trace): a 5-point blur and a colour jitter, ``rounds`` times."""
    import numpy as np

    x = img.numpy()
    for _ in range(rounds):
        x = (x + np.roll(x, 1, 1) + np.roll(x, -1, 1) + np.roll(x, 1, 2) + np.roll(x, -1, 2)) / 5
        m = x.mean(axis=(1, 2), keepdims=True)
        x = (x - m) * 1.01 + m
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


class Data(torch.utils.data.Dataset):
    """Synthetic samples from a small pool; with ``rounds`` > 0 each sample goes through the costly transform."""

    def __init__(self, model: str, size: dict, rounds: int = 0, pool: int = 64):
        g = torch.Generator().manual_seed(0)
        self.model, self.size, self.rounds, self.pool = model, size, rounds, pool
        if model == "gpt":
            self.x = torch.randint(size["vocab"], (pool, size["seq"] + 1), generator=g)
            rnd = random.Random(0)
            words = ["".join(rnd.choice("abcdefghij") for _ in range(rnd.randint(2, 8))) for _ in range(500)]
            self.text = " ".join(rnd.choice(words) for _ in range(size["seq"] * 2)) + " "
        else:
            self.x = torch.randn(pool, 3, size["img"], size["img"], generator=g)
            self.y = torch.randint(size["classes"], (pool,), generator=g)

    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        j = i % self.pool
        if self.model == "gpt":
            seq = self.x[j]
            if self.rounds:
                ids = _tokenize(self.text, self.size["vocab"], self.rounds)[: self.size["seq"] + 1]
                seq = seq.clone()
                seq[: len(ids)] = torch.tensor(ids)
            return seq[:-1], seq[1:]
        img = _augment(self.x[j], self.rounds) if self.rounds else self.x[j]
        return img, self.y[j]


def _calibrate(model: str, size: dict, ms_per_batch: float) -> int:
    """Rounds of the transform that cost ~``ms_per_batch`` per batch on this host."""
    d = Data(model, size, rounds=1)
    d[0]
    t = time.perf_counter()
    for i in range(4):
        d[i]
    per_round = (time.perf_counter() - t) / 4
    return max(1, round(ms_per_batch / 1e3 / size["batch"] / per_round))


# --------------------------------------------------------------------------------------------- the job
class Job:
    """One case's training loop: ``step()`` runs one training step with the case's fault."""

    def __init__(self, case: dict, dev: str, size: dict, rank: int = 0, world: int = 1):
        self.case, self.dev, self.size, self.rank, self.fault = case, dev, size, rank, case["fault"]
        torch.manual_seed(0)
        m = (GPT if case["model"] == "gpt" else CNN)(**size).to(dev)
        if world > 1:
            m = nn.parallel.DistributedDataParallel(m)
        self.model = m
        # SGD with momentum for both families: one multi-tensor update, and a CUDA graph captures it as it is
        self.opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, foreach=True)
        self.params_used = dict(FAULT_PARAMS.get(self.fault, {}))
        rounds = 0
        if self.fault == "input_bound":
            rounds = _calibrate(case["model"], size, FAULT_PARAMS["input_bound"]["transform_ms_per_batch"])
            self.params_used["transform_rounds"] = rounds
        self.loader = torch.utils.data.DataLoader(Data(case["model"], size, rounds), batch_size=size["batch"],
                                                  num_workers=0, pin_memory=(dev == "cuda"))
        self.it = iter(self.loader)
        self.heap = None
        if self.fault == "host_stall_gc":
            n = FAULT_PARAMS["host_stall_gc"]["heap_objects"]
            self.heap = [{"id": i, "tags": [i, i + 1]} for i in range(n)]
            t = time.perf_counter()
            gc.collect()
            self.params_used["gc_collect_ms_at_start"] = round((time.perf_counter() - t) * 1e3, 1)
        self.rng = random.Random(rank)
        self.record = {"step": 0, "loss": 0.0, "lr": 1e-4, "tokens": list(range(64)), "rank": rank}
        self.graph = self._capture() if case["graphed"] else None

    def _capture(self):
        """The whole training step (forward, backward, optimizer) captured as one CUDA graph (PyTorch's
        "whole network capture" recipe): warm-up on a side stream, then capture on static inputs."""
        x, y = next(self.it)
        self.sx, self.sy = x.to(self.dev), y.to(self.dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                self._loss(self.sx, self.sy).backward()
                self.opt.step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            self.sloss = self._loss(self.sx, self.sy)
            self.sloss.backward()
            self.opt.step()
        return g

    def close(self):
        self.heap = None
        self.it = None
        gc.collect()

    def _loss(self, x, y):
        return self.model(x, y)

    def step(self):
        x, y = next(self.it)
        if self.graph is not None:
            self.sx.copy_(x, non_blocking=True)
            self.sy.copy_(y, non_blocking=True)
            self.graph.replay()
            return
        x, y = x.to(self.dev, non_blocking=True), y.to(self.dev, non_blocking=True)
        loss = self._loss(x, y)
        if self.fault == "host_sync":
            self.record["loss"] = loss.item()
        if self.fault == "late_rank" and self.rank == FAULT_PARAMS["late_rank"]["rank"]:
            time.sleep(FAULT_PARAMS["late_rank"]["sleep_ms"] / 1e3)
        loss.backward()
        if self.fault == "host_sync":
            self.record["grad_norms"] = [p.grad.norm().item() for p in self.model.parameters()]
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.fault == "host_stall":
            t, end = time.perf_counter(), FAULT_PARAMS["host_stall"]["stall_ms"] / 1e3
            while time.perf_counter() - t < end:
                self.record["step"] += 1
                json.dumps(self.record)
        elif self.fault == "host_stall_gc":
            gc.collect()
        elif self.fault == "allocator_churn" and self.dev == "cuda":
            lo, hi = FAULT_PARAMS["allocator_churn"]["scratch_mib"]
            scratch = torch.empty(self.rng.randint(lo, hi) << 18, device=self.dev)  # float32: MiB * 2**18
            scratch.fill_(1.0)
            del scratch
            torch.cuda.empty_cache()
        elif self.fault == "host_sync" and self.dev == "cuda":
            torch.cuda.synchronize()


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def time_unprofiled(job: Job, warm: int, n: int) -> dict:
    """The step time without the profiler: ``warm`` steps, then ``n`` timed ones (CUDA events recorded at each
    step's end on a GPU -- no synchronisation inside the window; ``perf_counter`` on CPU). Microseconds. Also the
    host's period per step (``host_period_us``: ``perf_counter`` between the steps' ends, no synchronisation): where
    the host sets the pace it is the host's own time per step, else the step's (a host ahead of its GPU waits)."""
    for _ in range(warm):
        job.step()
    _sync(job.dev)
    t0 = time.perf_counter()
    ts = [t0]
    if job.dev == "cuda":
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        ev[0].record()
        for i in range(n):
            job.step()
            ev[i + 1].record()
            ts.append(time.perf_counter())
        torch.cuda.synchronize()
        samples = [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(n)]
    else:
        for _ in range(n):
            job.step()
            ts.append(time.perf_counter())
        samples = [(b - a) * 1e6 for a, b in zip(ts, ts[1:])]
    wall = (time.perf_counter() - t0) * 1e6
    return summarize(samples) | {"window_mean": round(wall / n, 1),
                                 "host_period_us": [round((b - a) * 1e6, 1) for a, b in zip(ts, ts[1:])]}


def summarize(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return {"median": round(statistics.median(samples), 1), "p10": round(q[0], 1), "p90": round(q[-1], 1),
            "samples": [round(s, 1) for s in samples]}


def profile_steps(job: Job, case: dict, out: Path) -> list[str]:
    """Profile the job the case's way into ``out``; the file names written."""
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if job.dev == "cuda" else [])
    opts = {"record_shapes": case["record_shapes"], "with_stack": case["with_stack"]}
    before = set(os.listdir(out))
    if case["profiler"] == "tb_handler":
        with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=PROFILED_STEPS),
                     on_trace_ready=tensorboard_trace_handler(str(out), use_gzip=True), **opts) as prof:
            for _ in range(2 + PROFILED_STEPS):
                job.step()
                prof.step()
    elif case["profiler"] == "kit.capture":
        from kit import capture

        with capture.profile(out, cuda=(job.dev == "cuda"), active=PROFILED_STEPS, **opts) as prof:
            while not prof.done:
                job.step()
                prof.step()
    else:  # no_steps: a span of 3 steps, no prof.step()
        with profile(activities=acts, **opts) as prof:
            for _ in range(PROFILED_STEPS):
                job.step()
            _sync(job.dev)
        prof.export_chrome_trace(str(out / "trace.json.gz"))
    _sync(job.dev)
    return sorted(set(os.listdir(out)) - before)


# --------------------------------------------------------------------------------------------- running a case
def _device_name(dev: str) -> str:
    return torch.cuda.get_device_name() if dev == "cuda" else "cpu"


def _host_cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _truth(case: dict, dev: str, size: dict, timing: dict, params: dict, files: list[str], extra: dict) -> dict:
    return {"case": case["name"], "fault": "host_stall" if case["fault"] == "host_stall_gc" else case["fault"],
            "expected_rule": RULE[case["fault"]], "expected_ranks": extra.pop("expected_ranks", None),
            "model": case["model"], "profiler": case["profiler"], "device": _device_name(dev),
            "torch": torch.__version__, "world_size": case["world_size"], "step_us_unprofiled": timing,
            "control": case["control"], "added_us": None, "fault_params": params,
            "profiled_steps": PROFILED_STEPS, "variant": case["fault"], "record_shapes": case["record_shapes"],
            "with_stack": case["with_stack"],
            "sizes": size, "host_cpu": _host_cpu(), "hostname_at_recording": socket.gethostname(),
            "files": files, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}


def run_single(case: dict, out: Path, warm: int, n: int, cpu_threads: int) -> dict:
    dev = case["device"]
    if (dev == "cuda" or case["graphed"]) and not torch.cuda.is_available():
        raise RuntimeError(f"{case['name']}: needs a GPU and torch.cuda.is_available() is False")
    size = {**SIZES[dev][case["model"]], **case["sizes"]}
    threads = torch.get_num_threads()
    if dev == "cpu":
        torch.set_num_threads(cpu_threads)
    job = Job(case, dev, size)
    try:
        timing = time_unprofiled(job, warm, n)
        files = profile_steps(job, case, out)
    finally:
        job.close()
        used = torch.get_num_threads()
        torch.set_num_threads(threads)
        if dev == "cuda":
            torch.cuda.empty_cache()
    return _truth(case, dev, size, timing, job.params_used, files, {"threads": used})


def _rank_main(rank: int, case: dict, out: str, warm: int, n: int, port: int, threads: int, res: str):
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(case["world_size"]), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=case["world_size"])
    size = SIZES["cpu"][case["model"]]
    job = Job(case, "cpu", size, rank, case["world_size"])
    timing = time_unprofiled(job, warm, n)
    dist.barrier()
    files = profile_steps(job, case, Path(out))
    timings = [None] * case["world_size"]
    dist.all_gather_object(timings, timing)
    params = [None] * case["world_size"]
    dist.all_gather_object(params, job.params_used)
    if rank == 0:
        Path(res).write_text(json.dumps({"timings": timings, "params": params, "files": files}))
    job.close()
    dist.destroy_process_group()


def run_ranks(case: dict, out: Path, warm: int, n: int, threads: int) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = out / ".ranks.json"
    mp.spawn(_rank_main, args=(case, str(out), warm, n, port, threads, str(res)), nprocs=case["world_size"])
    got = json.loads(res.read_text())
    res.unlink()
    t = got["timings"]
    # the job's step: the slowest rank's step, step by step (the ranks wait for each other at the all-reduce)
    job_samples = [max(r["samples"][i] for r in t) for i in range(len(t[0]["samples"]))]
    timing = summarize(job_samples) | {"per_rank": t}
    params = got["params"][0]
    files = sorted(os.listdir(out))
    files = [f for f in files if f != "truth.json"]
    if case["fault"] == "late_rank":
        ranks = [FAULT_PARAMS["late_rank"]["rank"]]
    elif case["fault"] == "input_bound":
        ranks = list(range(case["world_size"]))
    else:
        ranks = None
    return _truth(case, "cpu", SIZES["cpu"][case["model"]], timing, params, files,
                  {"expected_ranks": ranks, "threads": threads, "backend": "gloo",
                   "ddp": True})


def _added(truth: dict, root: Path) -> None:
    """Fill ``added_us`` from the control's truth.json under ``root`` (a control: None) -- or, where the case was
    recorded interleaved with its control in one process, from that control's samples (``paired_control``)."""
    if truth["control"] == truth["case"]:
        truth["added_us"] = None
        return
    if truth.get("paired_control"):
        c = truth["paired_control"]["median"]
        truth["added_us"], truth["control_median_us"] = round(truth["step_us_unprofiled"]["median"] - c, 1), c
        return
    ctl = root / truth["control"] / "truth.json"
    if ctl.is_file():
        c = json.loads(ctl.read_text())
        truth["added_us"] = round(truth["step_us_unprofiled"]["median"] - c["step_us_unprofiled"]["median"], 1)
        truth["control_median_us"] = c["step_us_unprofiled"]["median"]


def run_case(name: str, root: Path, warm: int, n: int, threads: int) -> dict:
    case = CASES[name]
    out = root / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t = time.perf_counter()
    truth = (run_ranks(case, out, warm, n, threads) if case["world_size"] > 1 else run_single(case, out, warm, n, threads))
    truth["wall_s"] = round(time.perf_counter() - t, 1)
    _added(truth, root)
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def refresh_added(root: Path) -> None:
    """Recompute every case's ``added_us`` against its control's truth.json (run after all cases exist)."""
    for p in sorted(root.glob("*/truth.json")):
        truth = json.loads(p.read_text())
        truth["profiled_steps"] = PROFILED_STEPS
        _added(truth, root)
        p.write_text(json.dumps(truth, indent=1) + "\n")


def readme(root: Path) -> str:
    rows = []
    for p in sorted(root.glob("*/truth.json")):
        t = json.loads(p.read_text())
        s = t["step_us_unprofiled"]
        size = sum(f.stat().st_size for f in p.parent.iterdir() if f.is_file())
        added = "--" if t["added_us"] is None else f"{t['added_us'] / 1e3:+.2f}"
        ranks = "" if not t.get("expected_ranks") else f" {t['expected_ranks']}"
        variant = "" if t.get("variant", t["fault"]) == t["fault"] else f" ({t['variant']})"
        rows.append(f"| {t['case']} | {t['fault']}{variant} | {t['expected_rule'] or '--'}"
                    f"{ranks} | {t['model']} | {t['profiler']} | {t['device']} x{t['world_size']} | "
                    f"{s['median'] / 1e3:.2f} ({s['p10'] / 1e3:.2f}-{s['p90'] / 1e3:.2f}) | {added} | "
                    f"{size // 1024} |")
    head = ("# Planted-fault corpus for `kit doctor`\n\n"
            "Generated by `python tests/corpus/planted.py --readme tests/data/doctor/corpus` from each case's\n"
            "`truth.json`; the jobs and how each was recorded: `tests/corpus/planted.py` (its docstring).\n"
            "Step time: the job's step without the profiler, median (p10-p90) over the timed steps, in ms;\n"
            "added: median minus the control's median, in ms. Each case's directory holds its traces as the\n"
            "profiler named them and `truth.json`.\n\n"
            "| case | fault (variant) | expected rule [ranks] | model | profiler | device x ranks | "
            "step ms, median (p10-p90) | added ms | KiB |\n|---|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", default="", help="comma-separated case names or groups (gpu, cpu, gloo, all)")
    ap.add_argument("--out", type=Path, default=Path("tests/data/doctor/corpus"))
    ap.add_argument("--steps", type=int, default=30, help="timed unprofiled steps (default 30)")
    ap.add_argument("--warm", type=int, default=5, help="warm-up steps before the timed ones (default 5)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of a CPU case, per rank (default 2)")
    ap.add_argument("--device", choices=("cpu",), help="run the GPU cases on the CPU (CPU sizes; to debug)")
    ap.add_argument("--list", action="store_true", help="list the cases")
    ap.add_argument("--readme", type=Path, help="write README.md for the corpus in this directory and stop")
    a = ap.parse_args(argv)
    if a.list:
        for n, c in CASES.items():
            print(f"{n:28s} {c['fault']:16s} {c['model']} {c['profiler']:12s} {c['device']} x{c['world_size']}")
        return 0
    if a.readme:
        refresh_added(a.readme)
        (a.readme / "README.md").write_text(readme(a.readme))
        print(f"wrote {a.readme / 'README.md'}")
        return 0
    names = []
    for tok in filter(None, a.cases.split(",")):
        if tok in GROUPS:
            names += GROUPS[tok]
        elif tok in CASES:
            names.append(tok)
        else:
            print(f"planted: unknown case or group {tok!r} (see --list)", file=sys.stderr)
            return 2
    if not names:
        print("planted: no case given (--cases, see --list)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # kit, for kit.capture, without installing it
    failed = 0
    for n in names:
        if a.device:
            CASES[n]["device"] = a.device
        try:
            t = run_case(n, a.out, a.warm, a.steps, a.threads)
            s = t["step_us_unprofiled"]
            added = "" if t["added_us"] is None else f" added {t['added_us'] / 1e3:+.2f} ms"
            print(f"{n:28s} {s['median'] / 1e3:8.2f} ms (p10 {s['p10'] / 1e3:.2f} p90 {s['p90'] / 1e3:.2f})"
                  f"{added}  [{t['wall_s']} s] {t['files']}", flush=True)
        except Exception:
            failed += 1
            print(f"{n}: FAILED\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    refresh_added(a.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
