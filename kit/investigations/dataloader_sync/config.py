"""The parameters of the dataloader_sync investigation and the names of its modes.

Allowed values are types (``Literal``), so :func:`kit.config.validate` rejects an unknown H2D or sync mode, or a
kept-trace tag that names none, with the allowed values before anything runs. :meth:`Config.check` keeps the rules
a type cannot state (sizes that must be positive); :meth:`Config.check_world` the one that needs the world size
(every rank's share of the dataset must fill a batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from kit.config import LaunchConfig

H2D = Literal["pageable", "pinned", "side_stream", "prefetch"]
"""how a batch reaches the GPU (see the package docstring)"""
SYNC = Literal["per_param", "flat", "ddp", "ddp_one_bucket"]
"""how gradients are averaged across ranks"""
H2D_MODES: list[str] = list(get_args(H2D))
SYNC_MODES: list[str] = list(get_args(SYNC))
TRACE_TAG = Literal[tuple(f"{h}+{s}" for h in H2D_MODES for s in SYNC_MODES)]  # type: ignore[valid-type]
"""'<h2d>+<sync>': a configuration whose profiler traces are kept"""

CUDA_ONLY_H2D = {"pinned", "side_stream", "prefetch"}
"""modes about pinned memory and CUDA streams: skipped (rows kind=skipped) without CUDA"""
DDP_DEFAULT_BUCKET_MB = 25.0
"""torch.nn.parallel.DistributedDataParallel's default bucket_cap_mb"""
ONE_BUCKET_MB = 1e6
"""larger than any model here: every gradient lands in one bucket, reduced after backward"""


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
    h2d_modes: list[H2D] = field(default_factory=lambda: list(H2D_MODES))
    sync_modes: list[SYNC] = field(default_factory=lambda: list(SYNC_MODES))
    bucket_caps_mb: list[float] = field(default_factory=lambda: [1.0, 5.0, 25.0, 100.0])
    """DDP bucket sweep (prefetch H2D), 25 = PyTorch's default"""
    steps: int = 12
    warmup: int = 3
    profile_steps: int = 2
    keep_traces: list[TRACE_TAG] = field(default_factory=lambda: ["pageable+per_param", "prefetch+ddp"])
    """configurations ('<h2d>+<sync>', default bucket size) whose profiler traces stay in the run directory"""
    lr: float = 0.01

    def check(self) -> list[str]:
        errs = []
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
