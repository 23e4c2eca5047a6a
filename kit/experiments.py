"""The registry: experiment name (= notebook stem) -> module with ``Config``, ``run(cfg, ctx)`` and optionally
``after(cfg, run)`` (launcher-side work once the ranks are done, e.g. running nccl-tests)."""

from __future__ import annotations

import importlib
from typing import Any

from .config import ConfigError, LaunchConfig, validate

EXPERIMENTS: dict[str, str] = {
    "collectives": "kit.collectives",
    "graph_gaps": "kit.graph_gaps",
    "collective_tracing": "kit.collective_tracing",
    "dataloader_sync": "kit.dataloader_sync",
    "p2p_transports": "kit.p2p_transports",
}


def get(name: str):
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[name])


def make_config(name: str, mapping: dict[str, Any] | None, where: str | None = None):
    return validate(get(name).Config, mapping, where=where or name)


def check_world(cfg: LaunchConfig, where: str = "config") -> None:
    """Checks that need the world size (e.g. a batch larger than each rank's share of the data): one
    ConfigError before anything runs."""
    import os

    from .launch import launched_externally, resolve

    fn = getattr(cfg, "check_world", None)
    if fn is None:
        return
    world = int(os.environ["WORLD_SIZE"]) if launched_externally() and "WORLD_SIZE" in os.environ else resolve(cfg)[0]
    errs = fn(world)
    if errs:
        raise ConfigError("invalid config:\n  " + "\n  ".join(f"{where}: {e}" for e in errs))


def execute(name: str, cfg: LaunchConfig, **kw):
    """Launch experiment ``name`` with ``cfg`` on all ranks, then its launcher-side step. Returns the Run."""
    from .launch import launch, launched_externally

    mod = get(name)
    check_world(cfg, name)
    run = launch(mod.run, cfg, name, **kw)
    after = getattr(mod, "after", None)
    if after is not None and not launched_externally():
        after(cfg, run)
    return run


def execute_all(name: str, cfg: LaunchConfig, **kw) -> list:
    """One run per entry of ``cfg.env_sets`` (fresh ranks each: NCCL reads its variables once per process),
    labelled by the variables of the set; a single run when ``env_sets`` is empty. Returns the Runs."""
    import dataclasses

    if not cfg.env_sets:
        return [execute(name, cfg, **kw)]
    runs = []
    for env in cfg.env_sets:
        label = " ".join(f"{k}={v}" for k, v in env.items()) or "default env"
        sub = dataclasses.replace(cfg, env={**cfg.env, **env}, env_sets=[],
                                  label=f"{cfg.label} {label}".strip())
        runs.append(execute(name, sub, **kw))
    return runs
