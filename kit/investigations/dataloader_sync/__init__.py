"""Why a gradient all-reduce looks slower in training than in nccl-tests: host-to-device copies, stream
synchronisation, and how gradients are synchronised.

A data-parallel VGG11 (:mod:`.model`; ``width`` scales it down for CPU) trains with SGD on a real
``torch.utils.data.DataLoader`` over a synthetic on-disk dataset (:mod:`.data`). Every combination of

* **H2D mode** -- ``pageable``: ``.to(device)`` from pageable memory on the default stream (blocks the host for
  the copy); ``pinned``: pinned memory, ``non_blocking=True``, default stream; ``side_stream``: pinned,
  ``non_blocking`` on a side stream, then ``wait_stream`` + ``record_stream``; ``prefetch``: the next batch's copy
  issued on the side stream before the current step runs;
* **sync mode** -- ``per_param``: ``dist.all_reduce`` on each parameter's gradient after backward (the report's
  loop); ``flat``: one all-reduce of all gradients flattened into one buffer; ``ddp``: DistributedDataParallel
  (buckets all-reduced while backward runs), bucket size ``bucket_cap_mb``; ``ddp_one_bucket``: DDP with a single
  bucket, i.e. no overlap with backward,

is timed per step (:mod:`.train`, rows ``kind=step``): data wait, H2D on the copy's stream and the host time
blocked in the copy call, forward, backward, sync, optimizer (kit.timing.PhaseTimer phases on the default
stream), the step on the device and on the host, and the wall-clock time per step. The loop never waits for the
GPU inside the timed steps -- the timers are read after them -- so the host runs ahead as in a real training
loop, and whatever blocks it (a pageable copy) shows up. For DDP, synchronisation happens inside backward (the
reducer's hooks); its exposed part comes from the profiler trace (``kind=overlap``).

``per_param`` also times each parameter's all-reduce the report's way (``kind=param_allreduce``) and keeps the
profiler traces, whose kernel durations of the same all-reduces show how much of the "slow all-reduce" is the
all-reduce. ``flat`` gives the gradient sync's effective bandwidth (``kind=grad_sync``) to set beside the
collective-bandwidth sweep at the same byte count. Without CUDA only ``pageable`` runs (the other modes are about
CUDA streams and pinned memory; rows ``kind=skipped`` say so); the sync-mode comparison holds on gloo.

**One GPU.** The H2D half is meaningful with one rank (host blocking of a pageable copy, event vs step timing,
bucket sizes); the all-reduce half is not -- with one rank NCCL launches no kernel -- and the analyses
(:mod:`.analysis`, :mod:`.findings`) say so instead of showing numbers.

Package layout: :mod:`.config` (Config, modes), :mod:`.data`, :mod:`.model`, :mod:`.train` (the rank function),
:mod:`.analysis` (tables, figures), :mod:`.findings`.
"""

from __future__ import annotations

from kit.contract import Investigation, Needs
from kit import regimes as kit_regimes

from .analysis import (PARTS, breakdown, fig_bucket_curve, fig_event_vs_kernel, fig_step_breakdown, rows,
                       table_breakdown, table_buckets, table_event_vs_kernel, table_grad_sync, table_overlap,
                       table_skipped)
from .config import CUDA_ONLY_H2D, DDP_DEFAULT_BUCKET_MB, H2D_MODES, ONE_BUCKET_MB, SYNC_MODES, Config
from .data import RawImageFolder, make_dataset, make_loader
from .findings import findings
from .regimes import fig_regimes, table_regime_breakdown, table_regime_buckets, table_regime_event_vs_kernel
from .model import build, sync_gradients, vgg11
from .train import H2DMover, points, run, train

INVESTIGATION = Investigation(
    name="dataloader_sync",
    Config=Config,
    run=run,
    columns=("kind", "h2d", "sync"),
    tables={"breakdown": table_breakdown, "buckets": table_buckets, "event_vs_kernel": table_event_vs_kernel,
            "grad_sync": table_grad_sync, "overlap": table_overlap, "skipped": table_skipped,
            "regime_breakdown": table_regime_breakdown, "regime_buckets": table_regime_buckets,
            "regime_event_vs_kernel": table_regime_event_vs_kernel, "nccl_transports": kit_regimes.transports_table},
    figures={"step-breakdown": fig_step_breakdown, "event-vs-kernel": fig_event_vs_kernel,
             "bucket-curve": fig_bucket_curve, "regimes": fig_regimes},
    findings=findings,
    needs=Needs(ranks=1),
    points=points,
    question="why a gradient all-reduce looks slow in training: H2D copies, stream sync, per-parameter vs "
             "flat vs DDP gradient sync",
)

__all__ = ["CUDA_ONLY_H2D", "Config", "DDP_DEFAULT_BUCKET_MB", "H2DMover", "H2D_MODES", "INVESTIGATION", "ONE_BUCKET_MB",
           "PARTS", "RawImageFolder", "SYNC_MODES", "breakdown", "build", "findings", "make_dataset",
           "make_loader", "rows", "run", "sync_gradients", "train", "vgg11"]
