"""The model and the ways its gradients are synchronised.

* :func:`vgg11` -- VGG11 (configuration "A", 132.9 M parameters at ``width=64``); ``width`` scales it down for CPU.
* :func:`build` -- the model as one sync mode trains it: plain (``per_param``, ``flat``: gradients averaged after
  backward by :func:`sync_gradients`) or wrapped in ``DistributedDataParallel`` (``ddp``: buckets all-reduced
  while backward runs; ``ddp_one_bucket``: one bucket, reduced after backward, i.e. no overlap).
* :func:`sync_gradients` -- ``per_param``: one ``dist.all_reduce`` per parameter's gradient (the report's loop);
  ``flat``: one all-reduce of all gradients flattened into one buffer.
"""

from __future__ import annotations

from contextlib import nullcontext

from .config import ONE_BUCKET_MB


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


def build(cfg, ctx, sync: str, bucket_mb: float):
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


def sync_gradients(model, mode: str, world: int, around=None) -> None:
    """Average gradients across ranks for the non-DDP modes (DDP averages inside backward).

    ``around(i, param)``: a context manager entered around the ``per_param`` loop's i-th all-reduce -- how the
    loop times each one the report's way (:class:`kit.timing.PhaseTimer` phases on the default stream)."""
    import torch
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.grad is not None]
    if mode == "per_param":
        for i, p in enumerate(params):
            with around(i, p) if around else nullcontext():
                dist.all_reduce(p.grad)
            p.grad.div_(world)
    elif mode == "flat":
        flat = torch._utils._flatten_dense_tensors([p.grad for p in params])
        dist.all_reduce(flat)
        flat.div_(world)
        for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, [p.grad for p in params])):
            p.grad.copy_(g)
    elif mode not in ("ddp", "ddp_one_bucket"):
        raise ValueError(mode)
