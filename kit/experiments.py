"""The registry: experiment name (= notebook stem) -> module with ``Config``, ``run(cfg, ctx)`` and optionally
``after(cfg, run)`` (launcher-side work once the ranks are done, e.g. running nccl-tests)."""

from __future__ import annotations

import importlib
from typing import Any

from .config import ConfigError, LaunchConfig, validate

EXPERIMENTS: dict[str, str] = {
    "collectives": "kit.collectives",
}


def get(name: str):
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[name])


def make_config(name: str, mapping: dict[str, Any] | None, where: str | None = None):
    return validate(get(name).Config, mapping, where=where or name)


def execute(name: str, cfg: LaunchConfig, **kw):
    """Launch experiment ``name`` with ``cfg`` on all ranks, then its launcher-side step. Returns the Run."""
    from .launch import launch, launched_externally

    mod = get(name)
    run = launch(mod.run, cfg, name, **kw)
    after = getattr(mod, "after", None)
    if after is not None and not launched_externally():
        after(cfg, run)
    return run
