"""What this node offers a launch: how many GPUs, which backend, a free port, and whether this process
already is one rank of a job started by someone else (torchrun, srun)."""

from __future__ import annotations

import os
import socket

from ..config import LaunchConfig


def launched_externally() -> bool:
    """True under torchrun / torch.distributed.run or srun: this process already is one rank."""
    e = os.environ
    if "RANK" in e and "WORLD_SIZE" in e:
        return True
    return "SLURM_PROCID" in e and "SLURM_NTASKS" in e and int(e.get("SLURM_NTASKS", "1")) > 1


def node_id() -> str:
    """The node this process is on, as NCCL tells hosts apart: ``NCCL_HOSTID`` when set (emulated nodes set
    one per agent, :mod:`kit.launch.emulated`), else the host name."""
    return os.environ.get("NCCL_HOSTID") or socket.gethostname()


def cuda_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def resolve(cfg: LaunchConfig, local_world_size: int | None = None) -> tuple[int, str]:
    """(world_size, backend) for a spawn launch on this node; raises ConfigError when impossible."""
    from ..config import ConfigError

    ngpu = cuda_device_count()
    world = cfg.world_size or (max(ngpu, 1) if ngpu else 2)
    local = local_world_size or world
    backend = cfg.backend
    if backend == "auto":
        backend = "nccl" if ngpu >= local and ngpu > 0 else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ConfigError(f"backend must be auto, nccl or gloo, not {backend!r}")
    if backend == "nccl" and local > ngpu:
        raise ConfigError(f"world_size {local} needs {local} GPUs (one per rank) but {ngpu} are visible")
    return world, backend


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
