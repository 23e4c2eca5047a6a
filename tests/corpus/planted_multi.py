"""Multi-GPU planted-fault corpus for ``kit doctor``: small data-parallel training jobs (DDP and FSDP) on 2 or 4
ranks, launched with ``torch.multiprocessing.spawn`` as users launch them, each with one known fault (or none: a
control), profiled the ways users profile, plus each job's step time measured without the profiler.

The models, the synthetic data, the input transform and the timing summary are ``planted.py``'s (beside this
file): a GPT-like transformer and a ResNet-like CNN. What is multi-rank here:

* parallelism: ``ddp`` (``DistributedDataParallel``; bf16 = ``torch.autocast`` over the forward) or ``fsdp``
  (FSDP2 ``fully_shard`` per block and the root; bf16 = ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``);
* controls: ``control`` (balanced: every rank the same work), ``hostbound`` (small CNN batch: every rank's host
  issues slower than its GPU runs), ``gpubound`` (GPT in fp32, larger batch; under FSDP a larger one still, sizes
  ``fsdp_gpubound``: FSDP's host is slow to issue a step, so the GPU's work must be well above that);
* one-rank faults (rank :data:`ONE_RANK` only): ``input_rank`` (that rank's DataLoader runs a ~15 ms/batch CPU
  transform in the training process), ``stall_rank`` (~20 ms of synchronous Python after its optimizer step),
  ``gpu_rank`` (~8 ms of extra matmuls on that rank's GPU before its backward; the bf16 FSDP control is host-bound,
  its GPU idle most of the step, so there they are 30 ms, :data:`FSDP_HOSTBOUND_EXTRA_GPU_MS`, and
  ``gpt-fsdp-fp32-gpu_rank`` plants 8 ms in the GPU-bound FSDP job; ``gpt-ddp-bf16-gpu_rank20`` plants
  :data:`DDP_HEAVY_EXTRA_GPU_MS` in the host-bound bf16 DDP job, whose GPU also idles part of its step),
  ``cpu_rank`` (that rank's host slowed by CPU contention, :class:`Contention`: every thread of its process pinned
  to one core that busy-looping processes share; the same code, its host issuing it more slowly);
* job-level faults: ``accum_no_sync`` (gradient accumulation over 4 micro-batches that all-reduces after every
  micro-batch; its control ``accum`` wraps the first 3 in ``no_sync()``), ``tiny_buckets`` (DDP
  ``bucket_cap_mb`` = 0.05: about one all-reduce per parameter), ``slow_comm`` (the control job with NCCL's
  environment changed: ``NCCL_P2P_DISABLE=1`` -- variant ``p2p_off``, the GPUs talk through host memory instead of
  NVLink -- or ``NCCL_PROTO=LL`` -- variant ``proto_ll``); NCCL reads these once per process, so each environment
  is its own spawn (a *session*).

Profilers: ``kit.capture`` (the kit's defaults: it also times 5 unprofiled steps and writes them into the trace
header) and ``tb_handler`` (``torch.profiler`` with ``schedule(wait=1, warmup=1, active=3)`` and
``tensorboard_trace_handler(dir, use_gzip=True)``: files ``<host>_<pid>.<ts>.pt.trace.json.gz``, the rank only
inside the trace). ``record_shapes`` on, no stacks: traces stay small. CUPTI is detached when each trace ends
(``TEARDOWN_CUPTI=1`` unless set: :data:`PROFILER_ENV`), so a step timed after a trace is timed as before any.

``--pair`` (:data:`PAIRS`) records a fault and its control interleaved in one process instead: one job built
for the fault, blocks of unprofiled steps in ABBA order (:func:`time_interleaved`: a drift within a round biases
each round's difference one way, the next round's the other), then each arm traced in that process; the fault's
``truth.json`` adds ``paired_control`` (its control arm's samples), ``added_us_by_alternation`` (per round, the
fault's block median less the control's) and ``added_us_over_rounds`` (:func:`paired_added`: their median, which
is ``added_us``, and an interval for it over the rounds).

Held out (group ``held_out``, never in ``all``: recorded to judge the doctor on a job it was not built around):
the ``rec`` family (:class:`Rec`, an embedding-bag + MLP recommender) under DDP with ``static_graph`` and
``gradient_as_bucket_view``, a DataLoader with :data:`REC_WORKERS` persistent workers yielding whole batches
(``input_rank``: the feature hashing in that rank's workers), profiled by ``json_handler``: ``schedule(wait=1,
warmup=2, active=5)``, shapes, stacks and memory, and an ``on_trace_ready`` of its own writing plain
``trainer-<pid>-<n>.json`` (``--profiler json_handler`` puts any case under it). A *set* in :data:`PAIRS` (a
control and several faults that toggle in one job) is timed by turns like a pair (ABCD DCBA ...), each fault
against the one control; where the job's loader has workers, each block settles for the batches they prefetched.
Later held-out rounds put the corpus's own jobs under that profiler as sets (``cnn_set``, ``gpt_set``) and change its
settings (:data:`JSON_SETTINGS_ENV`: e.g. stacks without memory, another schedule); session 12's: a set named on
the command line (``--pair`` with case names, :func:`arms_of`), the stall at another place in the step
(:data:`STALL_AT`), the CNN's extra GPU work and tiny buckets, accumulation in fp32.

Each case writes ``<out>/<case>/`` with every rank's trace and ``truth.json``: the unprofiled step time of the job
(per step, the slowest rank's CUDA-event step time; median, p10, p90 and every sample; every rank's samples under
``per_rank``), ``added_us`` against its control, the fault's parameters as measured (e.g. the extra GPU work's
time), the NCCL environment, and hardware/software. A case runs only if the session's deadline leaves room for it
(rank 0 decides, every rank follows), so a late case loses only itself.

Usage (from the repository root)::

    python tests/corpus/planted_multi.py --list
    python tests/corpus/planted_multi.py --world 2 --out tests/data/doctor/corpus-h100x2 --budget-s 120
    python tests/corpus/planted_multi.py --world 2 --device cpu --out /tmp/mc --cases gpt-ddp-bf16-control  # gloo
    python tests/corpus/planted_multi.py --world 2 --out /tmp/pairs --pair accum --steps 40 --alternations 8
    TEARDOWN_CUPTI=0 python tests/corpus/planted_multi.py --world 2 --out /tmp/pairs --pair accum --after-rounds 4
    python tests/corpus/planted_multi.py --world 2 --out /tmp/pairs --pair p2p_off --steps 80 --alternations 3  # by sessions
    python tests/corpus/planted_multi.py --readme tests/data/doctor/corpus-h100x2

Exit status: 0 every case ran, 1 a case failed or was left out for time, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn as nn

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # planted.py beside it, also where this file is loaded by its path (the tests)
    sys.path.insert(0, str(HERE))
import planted as P  # noqa: E402

ONE_RANK = int(os.environ.get("PLANTED_MULTI_RANK", "1"))
"""the rank a one-rank fault is planted on (1; the environment variable ``PLANTED_MULTI_RANK`` moves it, read by the
spawned ranks too; truth.json names it in ``expected_ranks``)"""
SIZES = {
    "cuda": {"gpt": dict(vocab=8192, d=1024, layers=2, heads=16, seq=256, batch=8),
             "cnn": dict(width=64, blocks=1, img=64, batch=96, classes=100),
             "rec": dict(tables=8, rows=50000, dim=64, dense=13, mlp=512, batch=2048),
             "moe": dict(vocab=4096, d=512, hidden=1024, experts=4, blocks=6, seq=128, batch=16),
             "vit": dict(img=64, patch=8, d=384, depth=6, heads=6, batch=128, classes=100),
             "lstm": dict(vocab=50000, emb=512, hidden=512, layers=2, seq=64, batch=64, classes=1000)},
    "cpu": {"gpt": dict(vocab=2048, d=128, layers=2, heads=4, seq=64, batch=8),
            "cnn": dict(width=16, blocks=1, img=32, batch=8, classes=10),
            "rec": dict(tables=4, rows=1000, dim=16, dense=13, mlp=64, batch=64),
            "moe": dict(vocab=512, d=64, hidden=128, experts=4, blocks=3, seq=32, batch=8),
            "vit": dict(img=32, patch=8, d=64, depth=2, heads=4, batch=8, classes=10),
            "lstm": dict(vocab=2000, emb=64, hidden=64, layers=2, seq=16, batch=8, classes=10)},
}
VARIANT_SIZES = {
    "cuda": {"hostbound": {"batch": 8, "img": 32}, "gpubound": {"batch": 24},
             "deep": {"d": 256, "layers": 12, "heads": 4}, "fsdp_gpubound": {"batch": 48},
             "vit_hostbound": {"batch": 4}, "vit_gpubound": {"batch": 512}, "vit_wide": {"d": 768, "heads": 12}},
    "cpu": {"hostbound": {"batch": 2, "img": 16}, "gpubound": {"batch": 16},
            "deep": {"d": 64, "layers": 6, "heads": 2}, "fsdp_gpubound": {"batch": 16},
            "vit_hostbound": {"batch": 2}, "vit_gpubound": {"batch": 16}, "vit_wide": {"d": 96, "heads": 4}},
}
"""``vit_*``: session 13's held-out ViT at a small batch (host-bound), in fp32 at a large one (GPU-bound), wide
(d 768) for its accumulation pair; ``hostbound``: the CNN at a small batch; ``gpubound``: the GPT at a larger batch (in fp32); ``deep``: a narrow
12-layer GPT (150 parameter tensors: one all-reduce each with tiny buckets) for the bucket pair; ``fsdp_gpubound``:
the GPT in fp32 at twice ``gpubound``'s batch (GPU work per step well above FSDP's host issue; the measured times
are in FINDINGS.md)"""
FSDP_HOSTBOUND_EXTRA_GPU_MS = 30.0
"""``gpt-fsdp-bf16-gpu_rank``'s matmuls: the bf16 FSDP job is host-bound, its GPU idle most of the step, so 8 ms of
them ran in rank 1's idle GPU time and added nothing measurable (the times: FINDINGS.md, FSDP gpu_rank); 30 ms
outlast that idle"""
DDP_HEAVY_EXTRA_GPU_MS = 20.0
"""``gpt-ddp-bf16-gpu_rank20``'s matmuls: the 8 ms of ``gpt-ddp-bf16-gpu_rank`` added +2.4 ms to the host-bound
bf16 DDP job on 2 H200s (FINDINGS.md, DDP gpu_rank on H200), most of them running in its GPU's idle time"""
REC_EXTRA_GPU_MS = 20.0
"""``rec-ddp-bf16-gpu_rank``'s matmuls: the recommender's GPU idles most of its step (small MLPs and embedding
lookups issued one by one), so the extra work must outlast that idle to add time, as ``gpu_rank20``'s"""
CNN_EXTRA_GPU_MS = 12.0
"""``cnn-ddp-fp32-gpu_rank``'s matmuls (fp32): a held-out case (session 12), the CNN's own extra-GPU-work fault"""
VIT_EXTRA_GPU_MS = 15.0
"""``vit-ddp-bf16-gpu_rank``'s matmuls (bf16; session 13's held-out round)"""
VIT_EXTRA_GPU_MS_TOPUP = 40.0
"""``vit-ddp-bf16-gpu_rank40`` (the top-up round s13r1c): more GPU work than the host-bound ViT's idle GPU time"""
LSTM_IO_MS = 15.0
"""``lstm-ddp-fp32-input_rank-io``: each batch's read waits this long (:class:`SlowCollate`) on that rank"""
STALL_AT = ("after_step", "in_forward", "before_backward")
"""where ``stall_rank``'s stall runs in the step (a case's ``stall_at``; default ``after_step``, after the optimizer
step): ``in_forward`` in a forward hook of the model's first block (its output computed, the next block not yet
issued), ``before_backward`` between the loss and its backward -- later held-out rounds move the stall"""
REC_WORKERS = 2
"""the recommender's DataLoader: worker processes (each yields whole batches: ``batch_size=None``), persistent"""
REC_INPUT_MS = 60.0
"""``rec-ddp-bf16-input_rank``'s per-batch transform (feature hashing in pure Python) in each of the rank's
:data:`REC_WORKERS` workers: its loader supplies a batch every ~30 ms, slower than the job's step"""
JSON_ACTIVE = 5
"""``json_handler``'s active steps (``schedule(wait=1, warmup=2, active=5)``)"""
JSON_SETTINGS_ENV = "PLANTED_MULTI_JSON"
"""an environment variable that changes ``json_handler``'s settings for every case (read by the spawned ranks too):
comma-separated ``key=value`` of ``wait``, ``warmup``, ``active`` (the schedule), ``stack``, ``memory``, ``shapes``
(0 or 1), e.g. ``memory=0,wait=2,warmup=1,active=4``: another user's settings for a later held-out round; each
truth.json names the settings in force (``json_settings``)"""


def json_settings() -> dict:
    """``json_handler``'s settings: the defaults, changed by :data:`JSON_SETTINGS_ENV`."""
    out = {"wait": 1, "warmup": 2, "active": JSON_ACTIVE, "stack": 1, "memory": 1, "shapes": 1}
    for kv in filter(None, os.environ.get(JSON_SETTINGS_ENV, "").split(",")):
        k, _, v = kv.partition("=")
        if k.strip() not in out:
            raise ValueError(f"{JSON_SETTINGS_ENV}: unknown setting {k!r} (known: {', '.join(out)})")
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise ValueError(f"{JSON_SETTINGS_ENV}: {k.strip()}={v!r} is not an integer") from None
    if out["active"] < 1 or min(out["wait"], out["warmup"]) < 0:
        raise ValueError(f"{JSON_SETTINGS_ENV}: the schedule needs active >= 1, wait and warmup >= 0 ({out})")
    return out

MICRO = 4
"""micro-batches per optimizer step in the accumulation cases (each batch/MICRO samples)"""
FAULT_PARAMS = {
    "input_rank": {"rank": ONE_RANK, "transform_ms_per_batch": 15.0, "num_workers": 0},
    "stall_rank": {"rank": ONE_RANK, "stall_ms": 20.0, "what": "json.dumps of a metrics record in a loop, after "
                   "optimizer.step, on one rank"},
    "gpu_rank": {"rank": ONE_RANK, "extra_gpu_ms": 8.0, "what": "square matmuls on that rank's GPU before its "
                 "backward (count calibrated to extra_gpu_ms at start)"},
    "cpu_rank": {"rank": ONE_RANK, "cores": 1, "spinners": int(os.environ.get("PLANTED_MULTI_SPINNERS", "1")),
                 "what": "every thread of that rank's process pinned to one core (os.sched_setaffinity) shared with "
                 "``spinners`` busy-looping processes pinned there (PLANTED_MULTI_SPINNERS sets how many)"},
    "accum_no_sync": {"micro_batches": MICRO, "what": "loss.backward() per micro-batch, every one all-reduced"},
    "accum": {"micro_batches": MICRO, "what": "the first MICRO-1 backwards under DDP.no_sync()"},
    "tiny_buckets": {"bucket_cap_mb": 0.05},
    "p2p_off": {"env": {"NCCL_P2P_DISABLE": "1"}},
    "proto_ll": {"env": {"NCCL_PROTO": "LL"}},
    "nchan1": {"env": {"NCCL_MAX_NCHANNELS": "1", "NCCL_PROTO": "Simple"}},
}
PROFILER_ENV = ("TEARDOWN_CUPTI", "DISABLE_CUPTI_LAZY_REINIT")
"""the environment variables by which Kineto decides whether CUPTI is detached (``cuptiFinalize``) when a trace
ends: left attached, CUPTI's callbacks keep costing the host on every CUDA call after the profiler stopped (the
accumulation job ran 30-37% slower after its pair's traces: ``recorded/h100x2/doctor_pairs/s6``), so every step
timed after a first trace in a process -- the next case's, kit.capture's own unprofiled steps of the arm traced
second -- would be timed with it. :func:`main` sets ``TEARDOWN_CUPTI=1`` unless the environment sets it (no case
here uses CUDA graphs, with which teardown crashed on CUDA before 12.6); each truth records the values in force"""


EXPECTED = {
    # fault: (rule the doctor should put first, ranks it should name (None: the job), the reason on that rank)
    "none": (None, None, None),
    "input_rank": ("late_rank", [ONE_RANK], "data_wait"),
    "stall_rank": ("late_rank", [ONE_RANK], "host_stall"),
    "gpu_rank": ("late_rank", [ONE_RANK], "gpu_busy"),
    "cpu_rank": ("late_rank", [ONE_RANK], "host_busy"),
    "accum_no_sync": ("repeated_grad_sync", None, None),
    "tiny_buckets": ("per_param_allreduce", None, None),
    "slow_comm": ("low_busbw", None, None),
}


# --------------------------------------------------------------------------------------------- the recommender
class Rec(nn.Module):
    """An embedding + MLP recommender (DLRM's shape): dense features through a bottom MLP, ``tables`` sparse
    features pooled by ``nn.EmbeddingBag`` (sum, dense gradients: DDP all-reduces them), their pairwise dot products
    and the bottom output through a top MLP, a click-through loss."""

    def __init__(self, tables, rows, dim, dense, mlp, **_):
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(dense, mlp), nn.ReLU(), nn.Linear(mlp, mlp // 2), nn.ReLU(),
                                 nn.Linear(mlp // 2, dim), nn.ReLU())
        self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        n = tables + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, mlp), nn.ReLU(), nn.Linear(mlp, mlp // 2),
                                 nn.ReLU(), nn.Linear(mlp // 2, 1))

    def forward(self, x, y):
        dense, idx = x
        b = self.bot(dense)
        f = torch.stack([b] + [e(idx[:, i]) for i, e in enumerate(self.emb)], 1)
        iu = torch.triu_indices(f.shape[1], f.shape[1], 1, device=f.device)  # made there: no copy, no sync
        z = torch.bmm(f, f.transpose(1, 2))[:, iu[0], iu[1]]
        out = self.top(torch.cat([b, z], 1)).squeeze(1)
        return nn.functional.binary_cross_entropy_with_logits(out.float(), y)


class RecData(torch.utils.data.Dataset):
    """Whole synthetic batches (a DataLoader with ``batch_size=None``): dense features, ``bag`` ids per table, a
    label; with ``rounds`` > 0 each batch's ids are re-hashed in pure Python (feature hashing) ``rounds`` times."""

    def __init__(self, size: dict, rounds: int = 0, pool: int = 8, bag: int = 4):
        g = torch.Generator().manual_seed(0)
        b, self.size, self.rounds = size["batch"], size, rounds
        self.dense = torch.randn(pool, b, size["dense"], generator=g)
        self.idx = torch.randint(size["rows"], (pool, b, size["tables"], bag), generator=g)
        self.y = torch.randint(2, (pool, b), generator=g).float()

    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        j = i % len(self.idx)
        idx = self.idx[j]
        if self.rounds:
            ids, rows = idx.flatten().tolist(), self.size["rows"]
            for _ in range(self.rounds):
                ids = [(v * 2654435761 + 97) % rows for v in ids]
            idx = torch.tensor(ids).view_as(idx)
        return (self.dense[j], idx), self.y[j]


def _calibrate_rec(size: dict, ms_per_batch: float) -> int:
    """Rounds of the recommender's hashing that cost ~``ms_per_batch`` per batch on this host."""
    d = RecData(size, rounds=1)
    d[0]
    t = time.perf_counter()
    for i in range(3):
        d[i]
    return max(1, round(ms_per_batch / 1e3 / ((time.perf_counter() - t) / 3)))


# --------------------------------------------------------------------------------------------- session 13's models
class MoE(nn.Module):
    """An MoE-ish block stack (held out, session 13): token embedding, ``blocks`` blocks of a LayerNorm, a softmax
    gate and ``experts`` two-layer GELU experts mixed densely by the gate (every expert sees every token: no
    routing, no all-to-all: data parallel like the rest), a tied head. Many parameter tensors (20 per block)."""

    def __init__(self, vocab, d, hidden, experts, blocks, seq, **_):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.blocks = nn.ModuleList(MoEBlock(d, hidden, experts) for _ in range(blocks))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln(x) @ self.tok.weight.t()
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class MoEBlock(nn.Module):
    def __init__(self, d, hidden, experts):
        super().__init__()
        self.ln, self.gate = nn.LayerNorm(d), nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
                                     for _ in range(experts))

    def forward(self, x):
        h = self.ln(x)
        g = torch.softmax(self.gate(h), -1)
        return x + sum(g[..., i:i + 1] * e(h) for i, e in enumerate(self.experts))


class ViT(nn.Module):
    """A small ViT (held out, session 13): a conv patch embedding, a learned position embedding, ``depth``
    pre-norm ``nn.TransformerEncoderLayer`` blocks (non-causal), mean pooling, a linear classifier."""

    def __init__(self, img, patch, d, depth, heads, classes, **_):
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, patch)
        self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2, d) * 0.02)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                                               batch_first=True, norm_first=True)
                                    for _ in range(depth))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x, targets):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        for b in self.blocks:
            x = b(x)
        return nn.functional.cross_entropy(self.head(self.ln(x).mean(1)).float(), targets)


class LSTMClassifier(nn.Module):
    """An embedding-heavy LSTM (held out, session 13): a large token embedding (dense gradients: DDP all-reduces
    the whole table), a ``layers``-layer LSTM, a classifier on the last hidden state; ``blocks`` names its stages
    (the embedding first) for a forward hook."""

    def __init__(self, vocab, emb, hidden, layers, classes, **_):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    @property
    def blocks(self):
        return [self.emb, self.lstm, self.head]

    def forward(self, idx, targets):
        out, _ = self.lstm(self.emb(idx))
        return nn.functional.cross_entropy(self.head(out[:, -1]).float(), targets)


HELD_MODELS = {"moe": MoE, "vit": ViT, "lstm": LSTMClassifier}


class HeldData(torch.utils.data.Dataset):
    """Synthetic samples from a small pool for :data:`HELD_MODELS`: tokens and next tokens (moe), an image and a
    label (vit), tokens and a label (lstm)."""

    def __init__(self, model: str, size: dict, pool: int = 64):
        g = torch.Generator().manual_seed(0)
        self.model = model
        if model == "vit":
            self.x = torch.randn(pool, 3, size["img"], size["img"], generator=g)
            self.y = torch.randint(size["classes"], (pool,), generator=g)
        elif model == "moe":
            self.x = torch.randint(size["vocab"], (pool, size["seq"] + 1), generator=g)
        else:
            self.x = torch.randint(size["vocab"], (pool, size["seq"]), generator=g)
            self.y = torch.randint(size["classes"], (pool,), generator=g)

    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        j = i % len(self.x)
        if self.model == "moe":
            return self.x[j][:-1], self.x[j][1:]
        return self.x[j], self.y[j]


class SlowCollate:
    """The held-out input fault of session 13 (``io_ms``): each batch's collation first waits ``io_ms`` in
    ``time.sleep`` -- a slow read, the host idle (not a CPU transform) -- in the process that loads (the training
    process with ``num_workers=0``)."""

    def __init__(self, io_ms: float):
        self.io_ms = io_ms

    def __call__(self, batch):
        if self.io_ms:
            time.sleep(self.io_ms / 1e3)
        return torch.utils.data.default_collate(batch)


PROFILER_OVERRIDE = "PLANTED_MULTI_PROFILER"
"""an environment variable naming the profiler for every case (``--profiler``; the spawned ranks read it as they
build :data:`CASES`)"""


def _c(model, par, dtype, kind, profiler, control=None, variant=None, fault=None, sizes=None, extra_gpu_ms=None,
       suffix="", item=False, **held):
    name = f"{model}-{par}-{dtype}-{kind}{suffix}"
    profiler = os.environ.get(PROFILER_OVERRIDE) or profiler
    fault = fault or ("none" if kind in ("control", "hostbound", "gpubound", "accum", "deep") else kind)
    env = dict(FAULT_PARAMS.get(variant, {}).get("env", {}))
    shapes = True
    if profiler == "json_handler":  # that user's settings: stacks and memory too (JSON_SETTINGS_ENV changes them)
        js = json_settings()
        held = {"with_stack": bool(js["stack"]), "profile_memory": bool(js["memory"]), **held}
        shapes = bool(js["shapes"])
    return {"name": name, "model": model, "parallel": par, "dtype": dtype, "kind": kind, "fault": fault,
            "variant": variant or kind, "profiler": profiler, "control": control or name, "nccl_env": env,
            "record_shapes": shapes, "with_stack": False, "sizes_variant": sizes,
            **({"extra_gpu_ms": extra_gpu_ms} if extra_gpu_ms else {}), **({"item": True} if item else {}), **held}


def _rec(kind, control=None, **kw):
    """A held-out case: the recommender (:class:`Rec`), DDP with ``static_graph`` and ``gradient_as_bucket_view``
    (accumulation: the bucket view only; ``no_sync`` is not for a static graph), a DataLoader with
    :data:`REC_WORKERS` persistent workers, profiled by ``json_handler`` (stacks and memory on, 5 active steps, plain
    ``trainer-<pid>-<n>.json`` files)."""
    ddp = {"gradient_as_bucket_view": True, **({} if kind.startswith("accum") else {"static_graph": True})}
    return _c("rec", "ddp", "bf16", kind, "json_handler", control, held_out=True, workers=REC_WORKERS, ddp_opts=ddp,
              **kw)


def _cases() -> dict[str, dict]:
    gpt, cnn, fsdp = "gpt-ddp-bf16-control", "cnn-ddp-fp32-control", "gpt-fsdp-bf16-control"
    out = [
        # controls first: a fault's added time needs its control
        _c("gpt", "ddp", "bf16", "control", "kit.capture"),
        _c("cnn", "ddp", "fp32", "control", "tb_handler"),
        _c("gpt", "fsdp", "bf16", "control", "tb_handler"),
        # one rank
        _c("gpt", "ddp", "bf16", "input_rank", "kit.capture", gpt),
        _c("cnn", "ddp", "fp32", "stall_rank", "tb_handler", cnn),
        _c("gpt", "ddp", "bf16", "gpu_rank", "kit.capture", gpt),
        _c("gpt", "fsdp", "bf16", "stall_rank", "tb_handler", fsdp),
        # job level
        _c("gpt", "ddp", "bf16", "accum", "kit.capture"),
        _c("gpt", "ddp", "bf16", "accum_no_sync", "kit.capture", "gpt-ddp-bf16-accum"),
        _c("gpt", "ddp", "bf16", "deep", "kit.capture", sizes="deep"),
        _c("gpt", "ddp", "bf16", "tiny_buckets", "kit.capture", "gpt-ddp-bf16-deep", sizes="deep"),
        # the other controls
        _c("cnn", "ddp", "fp32", "hostbound", "kit.capture", sizes="hostbound"),
        _c("gpt", "ddp", "fp32", "gpubound", "tb_handler", sizes="gpubound"),
        _c("cnn", "ddp", "fp32", "input_rank", "tb_handler", cnn),
        # the host-bound FSDP job's GPU idles most of its step: the matmuls must outlast that idle to add time
        _c("gpt", "fsdp", "bf16", "gpu_rank", "tb_handler", fsdp, extra_gpu_ms=FSDP_HOSTBOUND_EXTRA_GPU_MS),
        # FSDP with its GPU the bottleneck: the extra GPU work lengthens the job's step
        _c("gpt", "fsdp", "fp32", "gpubound", "kit.capture", sizes="fsdp_gpubound"),
        _c("gpt", "fsdp", "fp32", "gpu_rank", "kit.capture", "gpt-fsdp-fp32-gpubound", sizes="fsdp_gpubound"),
        # NCCL's environment: one spawn each
        _c("gpt", "ddp", "bf16", "p2p_off", "kit.capture", gpt, variant="p2p_off", fault="slow_comm"),
        _c("gpt", "fsdp", "bf16", "p2p_off", "tb_handler", fsdp, variant="p2p_off", fault="slow_comm"),
        _c("gpt", "ddp", "bf16", "proto_ll", "kit.capture", gpt, variant="proto_ll", fault="slow_comm"),
        # the host-bound bf16 DDP job's GPU idles part of its step too: 8 ms of matmuls added +2.4 ms on 2 H200s;
        # 20 ms outlast that idle, so the job pays clearly for rank 1's GPU
        _c("gpt", "ddp", "bf16", "gpu_rank", "kit.capture", gpt, extra_gpu_ms=DDP_HEAVY_EXTRA_GPU_MS,
           suffix=f"{DDP_HEAVY_EXTRA_GPU_MS:.0f}"),
        # every step ends with loss.item() (a logging line): the host waits there for the step's GPU work, peers' too
        _c("gpt", "ddp", "bf16", "control", "kit.capture", suffix="-item", item=True),
        _c("gpt", "ddp", "bf16", "gpu_rank", "kit.capture", "gpt-ddp-bf16-control-item", suffix="-item", item=True),
        # one rank's CPU contended: its launches slow too, so the profiler's estimated price of its ops grows
        _c("gpt", "ddp", "bf16", "cpu_rank", "kit.capture", gpt),
        _c("cnn", "ddp", "fp32", "cpu_rank", "tb_handler", cnn),
        _c("gpt", "fsdp", "bf16", "cpu_rank", "tb_handler", fsdp),
        # held out: another family, loader, DDP options and profiler (:func:`_rec`), recorded after the doctor
        _rec("control"),
        _rec("stall_rank", "rec-ddp-bf16-control"),
        _rec("gpu_rank", "rec-ddp-bf16-control", extra_gpu_ms=REC_EXTRA_GPU_MS),
        _rec("cpu_rank", "rec-ddp-bf16-control"),
        _rec("input_rank", "rec-ddp-bf16-control", input_ms=REC_INPUT_MS),
        _rec("accum"),
        _rec("accum_no_sync", "rec-ddp-bf16-accum"),
        _rec("tiny_buckets", "rec-ddp-bf16-control"),
        # held out, session 12: the stall at other places in the step, the CNN's extra GPU work and tiny buckets,
        # accumulation in fp32 (recorded after the doctor; profiled as the round's script says)
        _c("gpt", "fsdp", "bf16", "stall_rank", "tb_handler", fsdp, suffix="-fwd", stall_at="in_forward",
           held_out=True),
        _c("cnn", "ddp", "fp32", "stall_rank", "tb_handler", cnn, suffix="-bwd", stall_at="before_backward",
           held_out=True),
        _c("cnn", "ddp", "fp32", "gpu_rank", "tb_handler", cnn, extra_gpu_ms=CNN_EXTRA_GPU_MS, held_out=True),
        _c("cnn", "ddp", "fp32", "tiny_buckets", "tb_handler", cnn, held_out=True),
        _c("gpt", "ddp", "fp32", "accum", "kit.capture", held_out=True),
        _c("gpt", "ddp", "fp32", "accum_no_sync", "kit.capture", "gpt-ddp-fp32-accum", held_out=True),
    ]
    out += _held13()
    return {c["name"]: c for c in out}


def _held13() -> list[dict]:
    """Session 13's held-out cases (round s13r1; recorded after the doctor, profiled as the round's script says):
    three new model families under DDP with their own loaders -- ``moe`` bf16 (no workers, pageable), ``vit`` bf16
    (4 persistent workers, pinned), ``lstm`` fp32 (no workers, pinned) -- the input fault as a slow read
    (:class:`SlowCollate`), NCCL with one channel and the Simple protocol (``nchan1``)."""
    moe = dict(held_out=True, workers=0, pin=False)
    vit = dict(held_out=True, workers=4, pin=True)
    lstm = dict(held_out=True, workers=0, pin=True)
    mc, vc, lc = "moe-ddp-bf16-control", "vit-ddp-bf16-control", "lstm-ddp-fp32-control"
    return [
        _c("moe", "ddp", "bf16", "control", "json_handler", **moe),
        _c("moe", "ddp", "bf16", "stall_rank", "json_handler", mc, suffix="-fwd", stall_at="in_forward", **moe),
        _c("moe", "ddp", "bf16", "cpu_rank", "json_handler", mc, **moe),
        _c("moe", "ddp", "bf16", "tiny_buckets", "json_handler", mc, **moe),
        _c("moe", "ddp", "bf16", "nchan1", "json_handler", mc, variant="nchan1", fault="slow_comm", **moe),
        _c("vit", "ddp", "bf16", "control", "json_handler", **vit),
        _c("vit", "ddp", "bf16", "gpu_rank", "json_handler", vc, extra_gpu_ms=VIT_EXTRA_GPU_MS, **vit),
        # the ViT at d 768 (~43M parameters, ~170 MB of fp32 gradients: each extra all-reduce measurable)
        _c("vit", "ddp", "bf16", "accum", "json_handler", sizes="vit_wide", **vit),
        _c("vit", "ddp", "bf16", "accum_no_sync", "json_handler", "vit-ddp-bf16-accum", sizes="vit_wide", **vit),
        _c("vit", "ddp", "bf16", "hostbound", "json_handler", sizes="vit_hostbound", **vit),
        _c("vit", "ddp", "fp32", "gpubound", "json_handler", sizes="vit_gpubound", **vit),
        # the top-up round s13r1c (added to TRUTH.md before it was recorded): s13r1's ViT is host-bound (22 ms a
        # step), its 15 ms of GPU work hid in the GPU's idle; one NCCL channel barely slowed the host-bound MoE
        _c("vit", "ddp", "bf16", "gpu_rank", "json_handler", vc, extra_gpu_ms=VIT_EXTRA_GPU_MS_TOPUP, suffix="40",
           **vit),
        _c("vit", "ddp", "fp32", "control", "json_handler", sizes="vit_wide", suffix="-wide", **vit),
        _c("vit", "ddp", "fp32", "p2p_off", "json_handler", "vit-ddp-fp32-control-wide", variant="p2p_off",
           fault="slow_comm", sizes="vit_wide", suffix="-wide", **vit),
        _c("lstm", "ddp", "fp32", "control", "tb_handler", **lstm),
        _c("lstm", "ddp", "fp32", "input_rank", "tb_handler", lc, io_ms=LSTM_IO_MS, suffix="-io", **lstm),
    ]


CASES = _cases()
PAIRS = {
    "accum": ("gpt-ddp-bf16-accum", "gpt-ddp-bf16-accum_no_sync"),
    "fsdp_gpu": ("gpt-fsdp-bf16-control", "gpt-fsdp-bf16-gpu_rank"),
    "ddp_gpu": ("gpt-ddp-bf16-control", "gpt-ddp-bf16-gpu_rank"),
    "ddp_gpu20": ("gpt-ddp-bf16-control", "gpt-ddp-bf16-gpu_rank20"),
    "ddp_gpu_item": ("gpt-ddp-bf16-control-item", "gpt-ddp-bf16-gpu_rank-item"),
    "ddp_cpu": ("gpt-ddp-bf16-control", "gpt-ddp-bf16-cpu_rank"),
    "cnn_cpu": ("cnn-ddp-fp32-control", "cnn-ddp-fp32-cpu_rank"),
    "fsdp_cpu": ("gpt-fsdp-bf16-control", "gpt-fsdp-bf16-cpu_rank"),
    "cnn_stall": ("cnn-ddp-fp32-control", "cnn-ddp-fp32-stall_rank"),
    "p2p_off": ("gpt-ddp-bf16-control", "gpt-ddp-bf16-p2p_off"),
    "proto_ll": ("gpt-ddp-bf16-control", "gpt-ddp-bf16-proto_ll"),
    # a control and several faults that toggle in one job, timed by turns (ABCD DCBA ...)
    "rec_set": ("rec-ddp-bf16-control", "rec-ddp-bf16-stall_rank", "rec-ddp-bf16-gpu_rank", "rec-ddp-bf16-cpu_rank"),
    "rec_input": ("rec-ddp-bf16-control", "rec-ddp-bf16-input_rank"),
    "rec_accum": ("rec-ddp-bf16-accum", "rec-ddp-bf16-accum_no_sync"),
    "fsdp_set": ("gpt-fsdp-bf16-control", "gpt-fsdp-bf16-stall_rank", "gpt-fsdp-bf16-gpu_rank"),
    # later held-out rounds (session 11): the corpus's own jobs toggled as sets (with ``--profiler json_handler``)
    "cnn_set": ("cnn-ddp-fp32-control", "cnn-ddp-fp32-stall_rank", "cnn-ddp-fp32-input_rank"),
    "gpt_set": ("gpt-ddp-bf16-control", "gpt-ddp-bf16-input_rank", "gpt-ddp-bf16-gpu_rank20"),
}
"""a fault and its control that one job runs by turns (:meth:`MultiJob.arm`), recorded interleaved in one process
(``--pair``): the fault's added time without what differs between processes and minutes (one recording's host ran
~30% slower throughout than its control's). A pair whose arms differ in NCCL's environment (``p2p_off``, ``proto_ll``), which
NCCL reads once per process, is interleaved by *sessions* instead (:func:`run_session_pair`): each block a fresh
spawn of the arm's environment, the blocks in ABBA order"""


def arms_of(pair: str) -> tuple:
    """A pair's or set's case names, control first: a :data:`PAIRS` name, or the names themselves comma-separated
    (a set made for one round, e.g. ``cnn-ddp-fp32-control,cnn-ddp-fp32-gpu_rank``)."""
    return PAIRS[pair] if pair in PAIRS else tuple(pair.split(","))


_CORPUS = {n: c for n, c in CASES.items() if not c.get("held_out")}
GROUPS = {"controls": [n for n, c in _CORPUS.items() if c["fault"] == "none"],
          "one_rank": [n for n, c in _CORPUS.items() if c["kind"] in ("input_rank", "stall_rank", "gpu_rank",
                                                                       "cpu_rank")],
          "job": [n for n, c in _CORPUS.items() if c["kind"] in ("accum_no_sync", "tiny_buckets")],
          "env": [n for n, c in _CORPUS.items() if c["nccl_env"]],
          "all": list(_CORPUS),
          "held_out": [n for n, c in CASES.items() if c.get("held_out")]}


# --------------------------------------------------------------------------------------------- the job
SPIN = ("import ctypes, os, sys\n"
        "try:\n    ctypes.CDLL(None).prctl(1, 9)\n"  # PR_SET_PDEATHSIG = SIGKILL: it ends with the rank
        "except Exception:\n    pass\n"
        "os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\n"
        "ppid = os.getppid()\n"
        "while os.getppid() == ppid:\n    for _ in range(100000):\n        pass\n")
"""a busy loop on the given cores until its parent ends"""


class Contention:
    """``cpu_rank``'s fault on one rank: ``spinners`` busy-looping processes pinned to ``cores`` of the process's
    allowed cores (its highest-numbered ones), stopped (SIGSTOP) until :meth:`on`; :meth:`on` pins every thread of
    this process (``/proc/self/task``: ``sched_setaffinity`` of pid 0 pins the calling thread only; the autograd
    engine's device threads, NCCL's and the driver's run beside it) to those cores and lets the spinners run;
    :meth:`off` stops them and gives every thread back its allowed cores (the control arm of a pair).
    :meth:`slowdown` times a pure-Python loop on the main thread off and on: what the contention does to this host."""

    def __init__(self, cores: int, spinners: int):
        import subprocess

        self.allowed = sorted(os.sched_getaffinity(0))
        self.cores = set(self.allowed[-cores:])
        arg = ",".join(map(str, sorted(self.cores)))
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN, arg]) for _ in range(spinners)]
        self.active = True
        self.off()

    def _pin(self, cores) -> None:
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cores)

    def on(self) -> None:
        if not self.active:
            self._pin(self.cores)
            for p in self.procs:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGCONT)
            self.active = True

    def off(self) -> None:
        if self.active:
            for p in self.procs:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGSTOP)
            self._pin(set(self.allowed))
            self.active = False

    def slowdown(self, loops: int = 300000) -> dict:
        def loop() -> float:
            t = time.perf_counter()
            x = 0
            for i in range(loops):
                x += i
            return (time.perf_counter() - t) * 1e6

        was = self.active
        self.off()
        alone = statistics.median(loop() for _ in range(5))
        self.on()
        shared = statistics.median(loop() for _ in range(5))
        self.on() if was else self.off()
        return {"cores_used": sorted(self.cores), "python_loop_us_alone": round(alone, 1),
                "python_loop_us_contended": round(shared, 1), "host_slowdown_measured": round(shared / alone, 2)}

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                p.kill()
                os.kill(p.pid, signal.SIGCONT)
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
        self.procs = []


class MultiJob:
    """One case's training loop on one rank: ``step()`` runs one optimizer step with the case's fault."""

    def __init__(self, case: dict, dev: str, rank: int, world: int, arms: tuple = ()):
        import torch.distributed as dist

        self.case, self.dev, self.rank, self.world = case, dev, rank, world
        self.kind, self.bf16 = case["kind"], case["dtype"] == "bf16"
        kinds = {self.kind} | {c["kind"] for c in arms}  # the arms of a pair or set (PAIRS): built for every fault
        self.size = {**SIZES["cuda" if dev.startswith("cuda") else "cpu"][case["model"]],
                     **(VARIANT_SIZES["cuda" if dev.startswith("cuda") else "cpu"].get(case["sizes_variant"]) or {})}
        torch.manual_seed(0)
        m = {"gpt": P.GPT, "cnn": P.CNN, "rec": Rec, **HELD_MODELS}[case["model"]](**self.size).to(dev)
        self.params_used = {k: v for k, v in FAULT_PARAMS.get(case["variant"], {}).items()}
        for c in (case, *arms):
            if c.get("extra_gpu_ms"):
                self.params_used["extra_gpu_ms"] = c["extra_gpu_ms"]
        if case["parallel"] == "ddp":
            kw = {"device_ids": [torch.device(dev).index]} if dev.startswith("cuda") else {}
            kw.update(case.get("ddp_opts") or {})
            if self.kind == "tiny_buckets":
                kw["bucket_cap_mb"] = FAULT_PARAMS["tiny_buckets"]["bucket_cap_mb"]
            m = nn.parallel.DistributedDataParallel(m, **kw)
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16
                  else MixedPrecisionPolicy())
            for blk in (m.blocks if case["model"] == "gpt" else m.layers):
                fully_shard(blk, mp_policy=mp)
            fully_shard(m, mp_policy=mp)
        self.model = m
        self.opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, foreach=True)
        mine = self.rank == ONE_RANK
        stall = next((c for c in (case, *arms) if c["kind"] == "stall_rank"), None)
        if stall is not None:  # where the stall runs (STALL_AT), in the parameters of the arm that has it
            self.params_used["stall_at"] = stall.get("stall_at", "after_step")
            if self.kind != "stall_rank":
                self.params_used["stall_ms"] = FAULT_PARAMS["stall_rank"]["stall_ms"]
        if stall is not None and stall.get("stall_at") == "in_forward" and mine:
            inner = m.module if isinstance(m, nn.parallel.DistributedDataParallel) else m
            first = (inner.layers if case["model"] == "cnn" else inner.blocks)[0]
            first.register_forward_hook(lambda *_: self._stall("in_forward"))
        rounds = 0
        # the input fault's transform for any arm that has it: a set is built for its first fault, and its input arm
        # (cnn_set's third) had none before session 11's fix (s11r2's CNN input_rank added +0.60 ms: no fault)
        inp = next((c for c in (case, *arms) if c["kind"] == "input_rank"), None)
        if inp is not None and mine and inp.get("io_ms"):  # a slow read: ms of sleep per batch (SlowCollate)
            rounds = int(inp["io_ms"])
        elif inp is not None and mine:
            rounds = (_calibrate_rec(self.size, inp["input_ms"]) if inp["model"] == "rec" else
                      P._calibrate(inp["model"], self.size, FAULT_PARAMS["input_rank"]["transform_ms_per_batch"]))
        rounds_all = [None] * world
        dist.all_gather_object(rounds_all, rounds)
        if inp is not None:
            if self.kind != "input_rank":  # built for another fault of the set: the input arm's parameters too
                self.params_used.update({k: v for k, v in FAULT_PARAMS["input_rank"].items() if k != "rank"})
            self.params_used["transform_rounds"] = rounds_all[ONE_RANK]
            if inp.get("input_ms"):
                self.params_used.update(transform_ms_per_batch=inp["input_ms"], num_workers=inp["workers"])
            if inp.get("io_ms"):
                self.params_used.pop("transform_rounds", None)
                self.params_used.update(transform_ms_per_batch=0.0, io_ms_per_batch=inp["io_ms"],
                                        num_workers=inp["workers"], what="time.sleep in the batch's collation "
                                        "(a slow read) on that rank")
        batch = self.size["batch"] // MICRO if self.kind.startswith("accum") else self.size["batch"]
        self.loader = self._loader(rounds, batch)
        self.it = iter(self.loader)
        self.settle = 1
        if case.get("workers"):  # what a switch of arms leaves prefetched is used up before a block is timed
            self.settle += case["workers"] * 2
            self.params_used.update(num_workers=case["workers"], ddp_opts=case.get("ddp_opts"))
        self._plain = iter(self._loader(0, batch)) if arms and rounds else self.it  # the other arms' loader
        self._fault_it = self.it
        self.record = {"step": 0, "loss": 0.0, "lr": 1e-4, "tokens": list(range(64)), "rank": rank}
        self.extra = self.contention = None
        if "cpu_rank" in kinds:
            if mine:
                prm = FAULT_PARAMS["cpu_rank"]
                self.contention = Contention(prm["cores"], prm["spinners"])
            got = [None] * world
            dist.all_gather_object(got, self.contention.slowdown() if mine else None)
            self.params_used.update(got[ONE_RANK])
            if mine and self.kind == "cpu_rank":
                self.contention.on()
        if "gpu_rank" in kinds:
            n = self._calibrate_gpu() if mine else 0
            got = [None] * world
            dist.all_gather_object(got, n)
            self.params_used.update(got[ONE_RANK])
            self.extra = got[rank] if mine else None

    def _loader(self, rounds: int, batch: int):
        pin = self.dev.startswith("cuda")
        if self.case["model"] in HELD_MODELS:
            w = self.case.get("workers", 0)
            return torch.utils.data.DataLoader(HeldData(self.case["model"], self.size), batch_size=max(1, batch),
                                               num_workers=w, persistent_workers=w > 0,
                                               pin_memory=pin and self.case.get("pin", True),
                                               collate_fn=SlowCollate(rounds))
        if self.case["model"] == "rec":
            w = self.case.get("workers", 0)
            return torch.utils.data.DataLoader(RecData({**self.size, "batch": max(1, batch)}, rounds), batch_size=None,
                                               num_workers=w, persistent_workers=w > 0, pin_memory=pin)
        return torch.utils.data.DataLoader(P.Data(self.case["model"], self.size, rounds), batch_size=max(1, batch),
                                           num_workers=0, pin_memory=pin)

    def arm(self, case: dict) -> None:
        """Run ``case`` from the next step on: one of a pair (:data:`PAIRS`) that share this job's model, data and
        sizes and differ only in what the step does (the fault's toggle). The job was built for the pair's fault."""
        if not hasattr(self, "_fault_extra"):
            self._fault_extra = self.extra
        self.case, self.kind = case, case["kind"]
        self.extra = self._fault_extra if self.kind == "gpu_rank" else None
        self.it = self._fault_it if self.kind == "input_rank" else self._plain
        if self.contention is not None:
            self.contention.on() if self.kind == "cpu_rank" else self.contention.off()

    def _calibrate_gpu(self) -> dict:
        """How many square matmuls make ``extra_gpu_ms`` on this rank's device (timed with CUDA events)."""
        n = 4096 if self.dev.startswith("cuda") else 256
        dt = torch.bfloat16 if self.bf16 and self.dev.startswith("cuda") else torch.float32
        a = torch.randn(n, n, device=self.dev, dtype=dt)
        self._a = a
        for _ in range(3):
            a @ a
        t = self._time(lambda: [a @ a for _ in range(10)]) / 10
        count = max(1, round(self.params_used["extra_gpu_ms"] * 1e3 / t))
        return {"matmul_n": n, "matmul_dtype": str(dt).replace("torch.", ""), "matmuls": count,
                "matmul_us": round(t, 1), "extra_gpu_us_measured": round(self._time(self._extra_work(count)), 1)}

    def _extra_work(self, count):
        a = self._a
        return lambda: [a @ a for _ in range(count)]

    def _time(self, fn) -> float:
        if self.dev.startswith("cuda"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) * 1e3
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6

    def close(self):
        if self.contention is not None:
            self.contention.close()
            self.contention = None
        self.it = self._plain = self._fault_it = self.loader = None
        self.model = self.opt = None
        self._a = None

    def _micro(self, sync: bool):
        x, y = next(self.it)
        if isinstance(x, (tuple, list)):
            x = tuple(t.to(self.dev, non_blocking=True) for t in x)
        else:
            x = x.to(self.dev, non_blocking=True)
        y = y.to(self.dev, non_blocking=True)
        ctx = (torch.autocast(self.dev.split(":")[0], dtype=torch.bfloat16)
               if self.bf16 and self.case["parallel"] == "ddp" else contextlib.nullcontext())
        # DDP decides in its forward whether the backward will all-reduce: no_sync() must hold both
        nosync = self.model.no_sync() if not sync and self.case["parallel"] == "ddp" else contextlib.nullcontext()
        scale = MICRO if self.kind.startswith("accum") else 1
        with nosync:
            with ctx:
                loss = self.model(x, y)
            self._stall("before_backward")
            if self.extra:
                self._extra_work(self.extra["matmuls"])()
            (loss / scale).backward()
        self._loss = loss.detach()

    def step(self):
        if self.kind.startswith("accum"):
            for i in range(MICRO):
                self._micro(sync=(self.kind == "accum_no_sync" or i == MICRO - 1))
        else:
            self._micro(sync=True)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.case.get("item"):  # a logging line: the host waits for the step's GPU work (and its peers')
            self.record["loss"] = self._loss.item()
        self._stall("after_step")

    def _stall(self, where: str) -> None:
        """``stall_rank``'s stall if this step runs it here (:data:`STALL_AT`): ~20 ms of synchronous Python (json.dumps
        of a metrics record in a loop) on :data:`ONE_RANK`."""
        if self.kind != "stall_rank" or self.rank != ONE_RANK or self.case.get("stall_at", "after_step") != where:
            return
        t, end = time.perf_counter(), FAULT_PARAMS["stall_rank"]["stall_ms"] / 1e3
        while time.perf_counter() - t < end:
            self.record["step"] += 1
            json.dumps(self.record)


def time_unprofiled(job: MultiJob, warm: int, n: int) -> dict:
    """``planted.time_unprofiled`` for one rank of a job (CUDA events at each step's end on a GPU)."""
    job.dev_kind = "cuda" if job.dev.startswith("cuda") else "cpu"
    shim = type("J", (), {"step": job.step, "dev": job.dev_kind})()
    return P.time_unprofiled(shim, warm, n)


def profile_steps(job: MultiJob, case: dict, out: Path) -> list[str]:
    shim = type("J", (), {"step": job.step, "dev": "cuda" if job.dev.startswith("cuda") else "cpu"})()
    if case["profiler"] == "json_handler":
        return _json_handler(shim, case, out)
    return P.profile_steps(shim, case, out)


def _json_handler(job, case: dict, out: Path) -> list[str]:
    """``torch.profiler`` as another user writes it: ``schedule(wait=1, warmup=2, active=JSON_ACTIVE)``, shapes,
    stacks and memory recorded, and an ``on_trace_ready`` of its own that writes a plain ``trainer-<pid>-<n>.json``
    (no rank in the name: only inside the trace)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if job.dev == "cuda" else [])
    before, n = set(os.listdir(out)), []

    def ready(prof):
        prof.export_chrome_trace(str(out / f"trainer-{os.getpid()}-{len(n)}.json"))
        n.append(1)

    js = json_settings()
    with profile(activities=acts, schedule=schedule(wait=js["wait"], warmup=js["warmup"], active=js["active"]),
                 on_trace_ready=ready, record_shapes=case["record_shapes"], with_stack=case["with_stack"],
                 profile_memory=case.get("profile_memory", False)) as prof:
        for _ in range(js["wait"] + js["warmup"] + js["active"]):
            job.step()
            prof.step()
    P._sync(job.dev)
    return sorted(set(os.listdir(out)) - before)


# --------------------------------------------------------------------------------------------- the ranks
def _versions(dev: str) -> dict:
    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    with contextlib.suppress(Exception):
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if dev.startswith("cuda") else None
    return out


def _mib(root: Path) -> float:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20


def _rank_main(rank: int, world: int, names: list[str], root: str, warm: int, n: int, port: int, threads: int,
               deadline: float, device: str, env: dict, max_mib: float, pair: tuple | None = None,
               block: dict | None = None):
    import torch.distributed as dist

    os.environ.update(env)
    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    cuda = device == "cuda"
    dev = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            **({"device_id": torch.device(dev)} if cuda else {}))
    est = 15.0  # seconds a case takes, until one has been timed
    status = {}
    if pair is not None:  # (name, alternations): one interleaved pair, then done
        _run_pair(pair[0], rank, world, Path(root), warm, n, pair[1], device, dev, env, *pair[2:])
        status = {name: "ok" for name in names}
        names = []
    if block is not None:  # one block of a pair interleaved by sessions (run_session_pair), then done
        _run_block(block, rank, world, Path(root), warm, n, dev)
        status = {name: "ok" for name in names}
        names = []
    for name in names:
        case = CASES[name]
        go = [time.time() + est < deadline, rank == 0 and _mib(Path(root)) < max_mib]
        dist.broadcast_object_list(go, src=0)
        if not all(go):
            status[name] = "skipped: " + ("the session's deadline" if not go[0] else f"over {max_mib} MiB written")
            if rank == 0:
                print(f"{name:32s} {status[name]} ({deadline - time.time():.0f} s left, ~{est:.0f} s needed)",
                      flush=True)
            continue
        t0 = time.time()
        out = Path(root) / name
        if rank == 0:
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
        dist.barrier()
        try:
            job = MultiJob(case, dev, rank, world)
            timing = time_unprofiled(job, warm, n)
            dist.barrier()
            files = profile_steps(job, case, out)
            dist.barrier()
            timings = [None] * world
            dist.all_gather_object(timings, timing)
            if rank == 0:
                truth = _truth(case, world, device, timings, job.params_used, out, env)
                truth["wall_s"] = round(time.time() - t0, 1)
                _added(truth, Path(root))
                (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
                s = truth["step_us_unprofiled"]
                added = "" if truth["added_us"] is None else f" added {truth['added_us'] / 1e3:+.2f} ms"
                print(f"{name:32s} {s['median'] / 1e3:8.2f} ms (p10 {s['p10'] / 1e3:.2f} p90 {s['p90'] / 1e3:.2f})"
                      f"{added}  [{truth['wall_s']} s] {len(truth['files'])} files", flush=True)
            job.close()
            del job
            status[name] = "ok"
        except Exception:
            status[name] = "failed"
            print(f"{name} (rank {rank}): FAILED\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            raise  # the other ranks would wait at the next collective: end the session
        finally:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        est = max(est * 0.5, (time.time() - t0) * 1.3)
    if rank == 0:
        (Path(root) / f".session-{os.getpid()}.json").write_text(json.dumps(status))
    dist.barrier()
    dist.destroy_process_group()


def round_order(arms: list, r: int) -> list:
    """The arms of round ``r`` in the order they run: ABBA (A then B in even rounds, B then A in odd ones), so that
    a drift within a round adds to one round's difference what it takes from the next's."""
    return list(arms) if r % 2 == 0 else list(arms)[::-1]


def time_interleaved(job: MultiJob, arms: list[dict], warm: int, n: int, alternations: int) -> dict:
    """Each arm of a pair timed by turns in one process: ``warm`` steps of each, then ``alternations`` rounds in
    :func:`round_order` (ABBA...), each arm's turn a block of one settling step after the switch (untimed) and
    ``n`` timed ones (:func:`planted.time_unprofiled`: CUDA events at each step's end, no synchronisation inside
    the block). Per arm every sample in order, each block's boundaries and its place in its round (0 first)."""
    for c in arms:
        job.arm(c)
        time_unprofiled(job, warm, 3)
    out = {c["name"]: {"samples": [], "blocks": [], "position": [], "host": []} for c in arms}
    for r in range(alternations):
        for i, c in enumerate(round_order(arms, r)):
            job.arm(c)
            t = time_unprofiled(job, getattr(job, "settle", 1), n)
            o = out[c["name"]]
            o["blocks"].append([len(o["samples"]), len(o["samples"]) + n])
            o["position"].append(i)
            o["samples"] += t["samples"]
            o["host"] += t["host_period_us"]
    return {k: P.summarize(v["samples"]) | {"blocks": v["blocks"], "position": v["position"],
                                            "host_period_us": v["host"]} for k, v in out.items()}


def paired_added(by_round: list[float], level: float = 0.9) -> dict:
    """A pair's added time from its per-round differences (each round's fault block median less the control's):
    their median, and a distribution-free interval for it over the rounds -- the k-th smallest to the k-th largest
    round, k the largest whose binomial coverage (the chance that the true median lies inside) is at least
    ``level``: 8 rounds give the 2nd to the 7th at 93.0%; below 5 rounds no k reaches 0.9, and the interval is
    the whole range at its coverage (``scipy.stats.quantile_test(...).confidence_interval`` gives the same
    interval; it is written out here because the GPU machines that record the pairs have no scipy). The rounds,
    not the steps, are the samples: steps of one block share its round's drift, so resampling steps would
    understate how far rounds differ."""
    xs, n = sorted(by_round), len(by_round)

    def cover(k):
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = max([k for k in range(1, n // 2 + 1) if cover(k) >= level], default=1)
    return {"median": round(statistics.median(xs), 1), "low": xs[k - 1], "high": xs[n - k],
            "coverage": round(cover(k), 3), "rounds": n, "min": xs[0], "max": xs[-1],
            "method": "median of the per-round differences; interval: order statistics over rounds (binomial)"}


def against_next_control(truth: dict) -> list[float]:
    """A paired fault's block medians less its control's of the *next* round, per round but the last: where every
    round ran the control first (``control_first_by_round`` all true: the recordings before ABBA), each of these
    control blocks ran after the fault block, so a drift within the run biases these differences the other way
    from ``added_us_by_alternation``'s; how far their medians differ bounds what the order did."""
    n = truth["interleaved"]["block_steps"]

    def blocks(xs):
        return [statistics.median(xs[i:i + n]) for i in range(0, len(xs), n)]

    f, c = blocks(truth["step_us_unprofiled"]["samples"]), blocks(truth["paired_control"]["samples"])
    return [round(f[r] - c[r + 1], 1) for r in range(len(f) - 1)]


def _pair_truths(arms: list[dict], world: int, device: str, timings: list[dict], params: dict, root: Path,
                 env: dict, alternations: int, n: int, device_name: str | None = None,
                 sessions: bool = False, settle: int = 1) -> dict[str, dict]:
    """The pair's truth.json contents: each arm's as :func:`_truth` gives it, from its interleaved samples, plus how
    they were interleaved (``order``, A the control; ``control_first_by_round``) and per block the job's median;
    the fault's ``paired_control`` (its control arm's summary and samples) and ``added_us_by_alternation`` (its
    block median less the control's, per round, in the order the rounds ran); ``added_us``: :func:`_added`."""
    out, job_blocks = {}, {}
    first = [p == 0 for p in timings[0][arms[0]["name"]]["position"]]  # the control ran first in that round
    for c in arms:
        per = [t[c["name"]] for t in timings]
        truth = _truth(c, world, device, per, params if c["fault"] != "none" else {}, root / c["name"],
                       c["nccl_env"] if sessions else env, device_name)
        job = [max(p["samples"][i] for p in per) for i in range(len(per[0]["samples"]))]
        job_blocks[c["name"]] = [statistics.median(job[a:b]) for a, b in per[0]["blocks"]]
        truth["interleaved"] = {"with": [a["name"] for a in arms],
                                "order": " ".join("AB" if f else "BA" for f in first),  # A: the control
                                "control_first_by_round": first, "alternations": alternations,
                                "block_steps": n, "settle_steps_per_block": settle,
                                "block_median_us": [round(x, 1) for x in job_blocks[c["name"]]],
                                "same_process_as_trace": not sessions,
                                "profiler_env": {k: os.environ[k] for k in PROFILER_ENV if k in os.environ},
                                **({"by": "sessions: each block a fresh spawn in its arm's NCCL environment, each "
                                          "arm traced after its timed steps in the last round"} if sessions else {})}
        out[c["name"]] = truth
    ctl, *faults = arms  # a pair, or a control and several faults timed by turns
    cs = out[ctl["name"]]["step_us_unprofiled"]
    for fault in faults:
        t = out[fault["name"]]
        t["paired_control"] = {"case": ctl["name"], **{k: cs[k] for k in ("median", "p10", "p90", "samples")}}
        t["added_us_by_alternation"] = [round(f - c, 1)
                                        for f, c in zip(job_blocks[fault["name"]], job_blocks[ctl["name"]])]
    return out


def _run_pair(pair: str, rank: int, world: int, root: Path, warm: int, n: int, alternations: int, device: str,
              dev: str, env: dict, after_rounds: int = 0) -> None:
    """One pair (:data:`PAIRS`) on this rank: built once for its fault, timed by turns (:func:`time_interleaved`),
    then each arm profiled its case's way in this same process; rank 0 writes both truth.json files. With
    ``after_rounds``, that many more rounds are timed after both arms were traced (:func:`after_tracing`: what the
    profiler left behind in the process, e.g. CUPTI still attached, does to the unprofiled step)."""
    import torch.distributed as dist

    t0 = time.time()
    arms = [CASES[x] for x in arms_of(pair)]
    for c in arms:
        if rank == 0:
            shutil.rmtree(root / c["name"], ignore_errors=True)
            (root / c["name"]).mkdir(parents=True)
    dist.barrier()
    job = MultiJob(arms[1], dev, rank, world, arms=tuple(arms))
    timing = time_interleaved(job, arms, warm, n, alternations)
    dist.barrier()
    paces = {}
    for c in arms:
        job.arm(c)
        if c["profiler"] == "json_handler":  # held out: how fast each rank's host runs plain Python just now
            paces[c["name"]] = [None] * world
            dist.all_gather_object(paces[c["name"]], host_pace())
        profile_steps(job, c, root / c["name"])
        dist.barrier()
    timings = [None] * world
    dist.all_gather_object(timings, timing)
    afters = [None] * world
    if after_rounds:
        dist.all_gather_object(afters, time_interleaved(job, arms, 1, n, after_rounds))
    if rank == 0:
        truths = _pair_truths(arms, world, device, timings, job.params_used, root, env, alternations, n,
                              settle=getattr(job, "settle", 1))
        if after_rounds:
            after_tracing(truths, arms, afters)
        for name, pace in paces.items():
            truths[name]["host_pace_before_trace_us"] = pace
        for name, truth in truths.items():
            truth["wall_s"] = round(time.time() - t0, 1)
            _added(truth, root)
            (root / name / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
            s = truth["step_us_unprofiled"]
            by = truth.get("added_us_by_alternation")
            added = "" if truth["added_us"] is None else (
                f" added {truth['added_us'] / 1e3:+.2f} ms (median of rounds; by round {min(by) / 1e3:+.2f}.."
                f"{max(by) / 1e3:+.2f})")
            print(f"{name:32s} {s['median'] / 1e3:8.2f} ms (p10 {s['p10'] / 1e3:.2f} p90 {s['p90'] / 1e3:.2f})"
                  f"{added}  [{truth['wall_s']} s]", flush=True)
    job.close()


def host_pace(loops: int = 200_000, repeat: int = 7) -> dict:
    """A fixed pure-Python loop timed on this rank's main thread (``repeat`` times): its median and range in
    microseconds. The ranks' unprofiled step times are equal by construction (they wait for each other at the
    all-reduce), so they cannot show one host running slower than another; this can, just before a trace."""
    ts = []
    for _ in range(repeat):
        t, x = time.perf_counter(), 0
        for i in range(loops):
            x += i
        ts.append((time.perf_counter() - t) * 1e6)
    return {"median": round(statistics.median(ts), 1), "min": round(min(ts), 1), "max": round(max(ts), 1)}


def after_tracing(truths: dict, arms: list[dict], afters: list[dict]) -> None:
    """Into each arm's ``truth["interleaved"]["after_tracing"]``: its job block medians (per step the slowest rank)
    in the rounds timed after both arms were traced, the same arm's block medians before (the timed rounds) for
    comparison, and :data:`PROFILER_ENV` as set; the fault's gains ``added_us_by_alternation`` of those rounds."""
    med = {}
    for c in arms:
        per = [a[c["name"]] for a in afters]
        job = [max(p["samples"][i] for p in per) for i in range(len(per[0]["samples"]))]
        med[c["name"]] = [round(statistics.median(job[a:b]), 1) for a, b in per[0]["blocks"]]
        inter = truths[c["name"]]["interleaved"]
        inter["after_tracing"] = {
            "block_median_us": med[c["name"]], "position": per[0]["position"],
            "median_of_blocks_before_us": round(statistics.median(inter["block_median_us"]), 1),
            "median_of_blocks_after_us": round(statistics.median(med[c["name"]]), 1),
            "profiler_env": {k: os.environ[k] for k in PROFILER_ENV if k in os.environ}}
    ctl, *faults = (c["name"] for c in arms)
    for fault in faults:
        truths[fault]["interleaved"]["after_tracing"]["added_us_by_alternation"] = [
            round(f - c, 1) for f, c in zip(med[fault], med[ctl])]


def _run_block(block: dict, rank: int, world: int, root: Path, warm: int, n: int, dev: str) -> None:
    """One block of a pair interleaved by sessions on this rank: the arm's job built and timed (``warm`` steps, then
    ``n``), traced if ``block["trace"]``; rank 0 writes every rank's timing to ``root/block["file"]``."""
    import torch.distributed as dist

    case = CASES[block["arm"]]
    job = MultiJob(case, dev, rank, world)
    timing = time_unprofiled(job, warm, n)
    dist.barrier()
    if block["trace"]:
        profile_steps(job, case, root / case["name"])
        dist.barrier()
    timings = [None] * world
    dist.all_gather_object(timings, timing)
    if rank == 0:
        name = torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu"
        (root / block["file"]).write_text(json.dumps({"timings": timings, "params": job.params_used,
                                                      "device_name": name, "pid": os.getpid()}))
    job.close()


def run_session_pair(pair: str, world: int, root: Path, warm: int, n: int, threads: int, deadline: float,
                     device: str, alternations: int) -> dict:
    """A pair whose arms differ in NCCL's environment (read once per process), interleaved by sessions: per round
    (:func:`round_order`: ABBA...) each arm's block is a fresh spawn in its environment (``warm`` steps, ``n`` timed),
    each arm traced after its timed steps in the last round; the truths as :func:`_pair_truths` makes them for an
    in-process pair, ``interleaved.by`` saying how. The rounds end early (at 2 or more) where the deadline leaves
    no room for another."""
    t0 = time.time()
    arms = [CASES[x] for x in arms_of(pair)]
    for c in arms:
        shutil.rmtree(root / c["name"], ignore_errors=True)
        (root / c["name"]).mkdir(parents=True)
    per_block, est, done = {}, 20.0, 0
    for r in range(alternations):
        # the last round traces each arm after its timed steps; it is the last when the deadline leaves no room
        # for one more (each round at least 2)
        last = r == alternations - 1 or (r >= 1 and time.time() + 4 * est > deadline)
        for i, c in enumerate(round_order(arms, r)):
            b0 = time.time()
            blk = {"arm": c["name"], "trace": last, "file": f".block-{r}-{i}.json"}
            st = run_session([c["name"]], world, root, warm, n, threads, deadline + (30 if last else 0), device,
                             dict(c["nccl_env"]), block=blk)
            if st[c["name"]] != "ok":
                return {x["name"]: "failed" for x in arms}
            per_block[(r, c["name"])] = (i, json.loads((root / blk["file"]).read_text()))
            (root / blk["file"]).unlink()
            est = max(est * 0.5, time.time() - b0)
        done = r + 1
        if last:
            break
    timings = []
    for rank in range(world):
        per = {}
        for c in arms:
            samples, blocks, position = [], [], []
            for r in range(done):
                i, b = per_block[(r, c["name"])]
                xs = b["timings"][rank]["samples"]
                blocks.append([len(samples), len(samples) + len(xs)])
                position.append(i)
                samples += xs
            per[c["name"]] = P.summarize(samples) | {"blocks": blocks, "position": position}
        timings.append(per)
    first = per_block[(0, arms[1]["name"])][1]
    truths = _pair_truths(arms, world, device, timings, first["params"], root, {}, done, n,
                          device_name=first["device_name"], sessions=True)
    for name, truth in truths.items():
        truth["wall_s"] = round(time.time() - t0, 1)
        truth["interleaved"]["pids_by_round"] = [per_block[(r, name)][1]["pid"] for r in range(done)]
        truth["interleaved"]["settle_steps_per_block"] = warm  # each block's session warms up anew
        _added(truth, root)
        (root / name / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
        s, by = truth["step_us_unprofiled"], truth.get("added_us_by_alternation")
        added = "" if truth["added_us"] is None else (
            f" added {truth['added_us'] / 1e3:+.2f} ms (median of rounds; by round {min(by) / 1e3:+.2f}.."
            f"{max(by) / 1e3:+.2f})")
        print(f"{name:32s} {s['median'] / 1e3:8.2f} ms (p10 {s['p10'] / 1e3:.2f} p90 {s['p90'] / 1e3:.2f})"
              f"{added}  [{truth['wall_s']} s, {done} rounds by sessions]", flush=True)
    return {x["name"]: "ok" for x in arms}


def _truth(case: dict, world: int, device: str, timings: list[dict], params: dict, out: Path, env: dict,
           device_name: str | None = None) -> dict:
    # the job's step: the slowest rank's step, step by step (the ranks wait for each other at the collectives)
    job = [max(t["samples"][i] for t in timings) for i in range(len(timings[0]["samples"]))]
    rule, ranks, reason = EXPECTED[case["fault"]]
    name = device_name or (torch.cuda.get_device_name() if device == "cuda" else "cpu")
    files = sorted(f.name for f in out.iterdir() if f.name != "truth.json")
    return {"case": case["name"], "fault": case["fault"], "variant": case["variant"], "expected_rule": rule,
            "expected_ranks": ranks, "expected_reason": reason, "model": case["model"],
            "parallel": case["parallel"], "dtype": case["dtype"], "profiler": case["profiler"], "device": name,
            "world_size": world, "backend": "nccl" if device == "cuda" else "gloo",
            "step_us_unprofiled": P.summarize(job) | {"per_rank": timings}, "control": case["control"],
            "added_us": None, "fault_params": params, "nccl_env": env,
            "profiled_steps": json_settings()["active"] if case["profiler"] == "json_handler" else P.PROFILED_STEPS,
            **({"json_settings": json_settings()} if case["profiler"] == "json_handler" else {}),
            "record_shapes": case["record_shapes"], "with_stack": case["with_stack"],
            **{k: case[k] for k in ("held_out", "profile_memory", "workers", "ddp_opts", "input_ms", "stall_at",
                                    "pin", "io_ms")
               if k in case},
            "sizes": {**SIZES["cuda" if device == "cuda" else "cpu"][case["model"]],
                      **(VARIANT_SIZES["cuda" if device == "cuda" else "cpu"].get(case["sizes_variant"]) or {})},
            **_versions(device), "host_cpu": P._host_cpu(), "hostname_at_recording": socket.gethostname(),
            "files": files, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "profiler_env": {k: os.environ[k] for k in PROFILER_ENV if k in os.environ}}


def _added(truth: dict, root: Path) -> None:
    """``added_us``: for a pair recorded interleaved, the median of its per-round differences (:func:`paired_added`,
    kept whole in ``added_us_over_rounds``); otherwise against the control's truth.json (:func:`planted._added`)."""
    by = truth.get("added_us_by_alternation")
    if truth.get("paired_control") and by:
        over = paired_added(by)
        truth["added_us"], truth["added_us_over_rounds"] = over["median"], over
        truth["control_median_us"] = truth["paired_control"]["median"]
        return
    P._added(truth, root)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_session(names: list[str], world: int, root: Path, warm: int, n: int, threads: int, deadline: float,
                device: str, env: dict, max_mib: float = 1e9, pair: tuple | None = None,
                block: dict | None = None) -> dict:
    """One spawn of ``world`` ranks running ``names`` in order; killed at ``deadline`` + 20 s if still running."""
    import torch.multiprocessing as mp

    root.mkdir(parents=True, exist_ok=True)
    for p in root.glob(".session-*.json"):
        p.unlink()
    ctx = mp.start_processes(_rank_main, args=(world, names, str(root), warm, n, _free_port(), threads, deadline,
                                               device, env, max_mib, pair, block), nprocs=world, join=False, start_method="spawn")

    def kill(*_):
        for p in ctx.processes:
            if p.is_alive():
                p.kill()

    old = signal.signal(signal.SIGTERM, lambda *a: (kill(), sys.exit(143)))
    err = None
    try:
        while True:
            try:
                if ctx.join(timeout=1):
                    break
            except Exception as e:  # a rank failed: the others are ended by join
                err = e
                break
            if time.time() > deadline + 20:
                err = TimeoutError("session past its deadline: ranks killed")
                kill()
                break
    finally:
        kill()
        signal.signal(signal.SIGTERM, old)
    status = {}
    for p in root.glob(".session-*.json"):
        status = json.loads(p.read_text())
        p.unlink()
    if err is not None:
        print(f"session {env or '(default environment)'}: {type(err).__name__}: {str(err)[-2000:]}", file=sys.stderr,
              flush=True)
    return {name: status.get(name, "failed" if err else "not run") for name in names}


def readme(root: Path) -> str:
    rows = []
    for p in sorted(root.glob("*/truth.json")):
        t = json.loads(p.read_text())
        s = t["step_us_unprofiled"]
        size = sum(f.stat().st_size for f in p.parent.iterdir() if f.is_file())
        added = "--" if t["added_us"] is None else f"{t['added_us'] / 1e3:+.2f}"
        if t.get("added_us_over_rounds"):
            o = t["added_us_over_rounds"]
            added += f" ({o['low'] / 1e3:+.2f}..{o['high'] / 1e3:+.2f}, {o['coverage']:.0%})"
        ranks = "" if not t.get("expected_ranks") else f" {t['expected_ranks']}"
        variant = "" if t["variant"] == t["fault"] else f" ({t['variant']})"
        rows.append(f"| {t['case']} | {t['fault']}{variant} | {t['expected_rule'] or '--'}{ranks} | {t['model']} "
                    f"{t['parallel']} {t['dtype']} | {t['profiler']} | {t['device']} x{t['world_size']} | "
                    f"{s['median'] / 1e3:.2f} ({s['p10'] / 1e3:.2f}-{s['p90'] / 1e3:.2f}) | {added} | "
                    f"{size // 1024} |")
    rel = root.resolve().relative_to(HERE.parents[1]).as_posix() if root.resolve().is_relative_to(HERE.parents[1]) \
        else root.name
    head = (f"# Multi-GPU planted-fault corpus for `kit doctor` ({root.name})\n\n"
            f"Generated by `python tests/corpus/planted_multi.py --readme {rel}` from each case's\n"
            "`truth.json`; the jobs and how each was recorded: `tests/corpus/planted_multi.py` (its docstring).\n"
            "Step time: the job's step without the profiler (per step the slowest rank's CUDA-event time), median\n"
            "(p10-p90) over the timed steps, in ms; added: median minus the control's median, in ms (a case\n"
            "recorded interleaved with its control in one process, `--pair`: the median over the rounds of its\n"
            "block median less its control arm's of the same round, `added_us_by_alternation`, and in brackets an\n"
            "interval for it over the rounds with its coverage, truth.json's `added_us_over_rounds`). Each case's\n"
            "directory holds every rank's trace as the profiler named it and `truth.json`.\n\n"
            "| case | fault (variant) | expected rule [ranks] | job | profiler | device x ranks | "
            "step ms, median (p10-p90) | added ms | KiB |\n|---|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", default="all", help="comma-separated case names or groups "
                    f"({', '.join(GROUPS)}; default all)")
    ap.add_argument("--world", type=int, default=2, help="ranks (GPUs) per job (default 2)")
    ap.add_argument("--out", type=Path, default=None, help="corpus directory (default tests/data/doctor/"
                    "corpus-gloo<world> with --device cpu, else a path is required)")
    ap.add_argument("--steps", type=int, default=40, help="timed unprofiled steps (default 40)")
    ap.add_argument("--warm", type=int, default=5, help="warm-up steps before the timed ones (default 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda: NCCL, one GPU per rank; "
                    "cpu: gloo ranks on CPU with the CPU sizes (a dry run)")
    ap.add_argument("--budget-s", type=float, default=600.0, help="wall-clock seconds for all sessions; a case "
                    "starts only if the time left covers it (default 600)")
    ap.add_argument("--max-mib", type=float, default=1e9, help="start no case once the output directory holds "
                    "this many MiB (default: no limit)")
    ap.add_argument("--pair", help="record one fault and its control interleaved in one process instead of "
                    f"--cases: a pair or set of PAIRS ({', '.join(sorted(PAIRS))}) or case names, the control first, "
                    "comma-separated: --steps per block, --alternations rounds of each")
    ap.add_argument("--alternations", type=int, default=6, help="--pair: rounds, ABBA (default 6)")
    ap.add_argument("--after-rounds", type=int, default=0, help="--pair in one process: rounds timed again "
                    "after both arms were traced (truth.json's interleaved.after_tracing; default 0)")
    ap.add_argument("--profiler", choices=("kit.capture", "tb_handler", "json_handler"), help="profile every case this way "
                    "instead of its own (default: each case's)")
    ap.add_argument("--cupti-env-to-capture", action="store_true", help="leave TEARDOWN_CUPTI as the environment "
                    "has it (default: 1 unless set), so that kit.capture's own default is what a kit.capture case "
                    "runs with (with --after-rounds: whether it takes effect in the process)")
    ap.add_argument("--list", action="store_true", help="list the cases")
    ap.add_argument("--readme", type=Path, help="write README.md for the corpus in this directory and stop")
    a = ap.parse_args(argv)
    if a.profiler:
        os.environ[PROFILER_OVERRIDE] = a.profiler
        for c in CASES.values():
            c["profiler"] = a.profiler
            if a.profiler == "json_handler":  # as :func:`_c` gives it in the ranks, which read the override
                js = json_settings()
                c.update(with_stack=bool(js["stack"]), profile_memory=bool(js["memory"]), record_shapes=bool(js["shapes"]))
    if a.list:
        for n, c in CASES.items():
            print(f"{n:30s} {c['fault']:14s} {c['variant']:14s} {c['profiler']:12s} control={c['control']}")
        return 0
    if a.readme:
        for p in sorted(a.readme.glob("*/truth.json")):
            t = json.loads(p.read_text())
            _added(t, a.readme)
            p.write_text(json.dumps(t, indent=1) + "\n")
        (a.readme / "README.md").write_text(readme(a.readme))
        print(f"wrote {a.readme / 'README.md'}")
        return 0
    names = []
    if a.pair:
        a.cases = ""
        names = list(arms_of(a.pair))
        if a.pair not in PAIRS and (len(names) < 2 or not set(names) <= set(CASES)
                                    or len({CASES[n]["model"] for n in names}) > 1):
            print(f"planted_multi: --pair {a.pair!r}: neither a pair of PAIRS nor 2+ cases of one model",
                  file=sys.stderr)
            return 2
        if a.alternations < 2:
            print("planted_multi: a pair needs --alternations >= 2", file=sys.stderr)
            return 2
    for tok in filter(None, a.cases.split(",")):
        if tok in GROUPS:
            names += [n for n in GROUPS[tok] if n not in names]
        elif tok in CASES:
            names.append(tok) if tok not in names else None
        else:
            print(f"planted_multi: unknown case or group {tok!r} (see --list)", file=sys.stderr)
            return 2
    if not names or a.world < 2 or a.steps < 3:
        print("planted_multi: no case given, or --world < 2, or --steps < 3", file=sys.stderr)
        return 2
    if a.device == "cuda" and torch.cuda.device_count() < a.world:
        print(f"planted_multi: --world {a.world} needs {a.world} GPUs, {torch.cuda.device_count()} visible "
              "(--device cpu runs gloo ranks on CPU)", file=sys.stderr)
        return 2
    out = a.out or Path(f"tests/data/doctor/corpus-gloo{a.world}")
    sys.path.insert(0, str(HERE.parents[1]))  # kit, for kit.capture, without installing it
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parents[1]), os.environ.get("PYTHONPATH")]))
    if not a.cupti_env_to_capture:
        os.environ.setdefault("TEARDOWN_CUPTI", "1")  # PROFILER_ENV: each case timed as before any trace
    deadline = time.time() + a.budget_s
    if a.pair and len({tuple(sorted(CASES[x]["nccl_env"].items())) for x in names}) > 1:
        out.mkdir(parents=True, exist_ok=True)
        status = run_session_pair(a.pair, a.world, out, a.warm, a.steps, a.threads, deadline, a.device, a.alternations)
        bad = {n: s for n, s in status.items() if s != "ok"}
        for n, s in bad.items():
            print(f"{n:32s} {s}", flush=True)
        return 1 if bad else 0
    sessions: dict[tuple, list[str]] = {}
    for n in names:  # one spawn per NCCL environment, in the order the cases were given
        sessions.setdefault(tuple(sorted(CASES[n]["nccl_env"].items())), []).append(n)
    status = {}
    for env, group in sessions.items():
        if time.time() + 20 > deadline:
            status.update({n: "skipped: the deadline" for n in group})
            continue
        status.update(run_session(group, a.world, out, a.warm, a.steps, a.threads, deadline, a.device, dict(env),
                                  a.max_mib, (a.pair, a.alternations, a.after_rounds) if a.pair else None))
    for p in sorted(out.glob("*/truth.json")):  # a control recorded after its case
        t = json.loads(p.read_text())
        _added(t, out)
        p.write_text(json.dumps(t, indent=1) + "\n")
    bad = {n: s for n, s in status.items() if s != "ok"}
    for n, s in bad.items():
        print(f"{n:32s} {s}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
