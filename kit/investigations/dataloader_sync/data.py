"""The input pipeline: a synthetic on-disk dataset (raw float32 samples in class folders, written once into a
cache directory), a map-style dataset over it, and the ``torch.utils.data.DataLoader`` each configuration trains
on (a ``DistributedSampler`` gives every rank its share; ``pin_memory`` only for the H2D modes that use it).

The files are real files read by worker processes, so the data wait a training loop sees (``data_wait_us``) is
the one of a real loader, not of tensors already in memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


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


def make_loader(cfg, ctx, dataset, pinned: bool):
    """The DataLoader of one configuration: this rank's shuffled share, ``cfg.batch`` per batch, pinned batches
    (pinned in the loader's background thread) only when ``pinned`` and on CUDA.

    Its workers are forked, as in a training script that torchrun starts on Linux: a rank that kit.launch spawned
    inherits ``spawn`` as its default start method, and spawned workers import torch again, every configuration
    (the workers persist only within one). What that cost, measured: FINDINGS.md, "Why the gradient all-reduce
    looks slow in training"."""
    import multiprocessing

    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0,
                                 drop_last=True)
    fork = cfg.num_workers > 0 and "fork" in multiprocessing.get_all_start_methods()
    return DataLoader(dataset, batch_size=cfg.batch, sampler=sampler, num_workers=cfg.num_workers,
                      pin_memory=pinned and ctx.is_cuda, drop_last=True, persistent_workers=cfg.num_workers > 0,
                      generator=torch.Generator().manual_seed(0), multiprocessing_context="fork" if fork else None)
