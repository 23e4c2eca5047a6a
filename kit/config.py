"""Typed, validated configs.

Every experiment declares its parameters as a dataclass deriving from :class:`LaunchConfig`. The same field
names are the parameters cell of its notebook and the keys of its section in a YAML file under ``configs/``.
:func:`validate` turns a plain mapping into that dataclass and reports *every* problem (unknown key, wrong
type) in one :class:`ConfigError` before anything runs.

YAML layout (``configs/cpu-smoke.yaml``)::

    defaults:          # LaunchConfig keys, applied to every notebook
      world_size: 2
      backend: gloo
    collectives:       # one section per notebook / experiment, its Config's keys
      max_bytes: 65536
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


class ConfigError(ValueError):
    """A config that cannot run. The message lists every problem found."""


@dataclass
class LaunchConfig:
    """Parameters every experiment has: how many ranks, which backend, env overrides, fault bounds."""

    world_size: int = 0
    """Ranks to start. 0 = one rank per visible GPU (at least 1), or 2 ranks on a machine without CUDA."""
    backend: typing.Literal["auto", "nccl", "gloo"] = "auto"
    """``auto`` (nccl when every rank has its own GPU, else gloo), ``nccl`` or ``gloo``."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment set in every rank before any communicator exists, e.g. ``{"NCCL_ALGO": "Ring"}``."""
    env_sets: list[dict[str, str]] = field(default_factory=list)
    """Compare settings: one launch (fresh ranks, so NCCL reads the variables anew) per set, each merged over
    ``env``; ``[]`` = a single launch. E.g. ``[{}, {"NCCL_GRAPH_MIXING_SUPPORT": "0"}]``."""
    timeout_s: float = 300.0
    """Watchdog: a rank that reports no progress (a step or a row) for this long is declared hung."""
    teardown_s: float = 20.0
    """After a rank finished, how long it may take to exit before it is killed (results are already safe)."""
    results_root: str = "results"
    """Runs are written to ``<results_root>/<experiment>/<run-id>/``."""
    label: str = ""
    """Free-form label stored with the run (shown in plots when comparing runs)."""


# Parameters every notebook has besides its experiment's Config.
NOTEBOOK_EXTRAS: dict[str, tuple[type, Any]] = {
    "interactive": (bool, True),  # ipywidgets cells; `kit run` sets False
    # which runs the analyses show (kit.results.choose): "auto" = this run if it ran on GPUs, else the recorded
    # GPU runs; "this"; "recorded"; or a list of run directories
    "analyse": (typing.Union[typing.Literal["auto", "this", "recorded"], list[str]], "auto"),
}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}" if typing.get_args(tp) else "a list"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check(value: Any, tp: Any, where: str, problems: list[str]) -> Any:
    """Check ``value`` against annotation ``tp``; return the (possibly widened) value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        problems.append(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for a in inner:
            sub: list[str] = []
            v = _check(value, a, where, sub)
            if not sub:
                return v
        problems.append(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            problems.append(f"{where}: expected a list, got {type(value).__name__} {value!r}")
            return value
        return [_check(v, args[0] if args else Any, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            problems.append(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
            return value
        kt, vt = args if args else (Any, Any)
        out = {}
        for k, v in value.items():
            k2 = _check(k, kt, f"{where} key {k!r}", problems)
            # env values: accept numbers in YAML (NCCL_GRAPH_MIXING_SUPPORT: 0) and store them as strings
            if vt is str and isinstance(v, (int, float)) and not isinstance(v, bool):
                v = str(v)
            out[k2] = _check(v, vt, f"{where}[{k!r}]", problems)
        return out
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is bool or tp is str:
        if type(value) is tp:
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    problems.append(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def validate(cls: type, mapping: Mapping[str, Any] | None, where: str = "config", extras: dict | None = None):
    """Build ``cls`` from ``mapping``; raise one :class:`ConfigError` listing every unknown key and bad type.

    ``extras`` maps additional allowed keys to ``(type, default)``; their checked values are returned
    as a second dict. Without ``extras`` only the dataclass instance is returned.
    """
    mapping = dict(mapping or {})
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    extras = extras or {}
    problems: list[str] = []
    kwargs, extra_values = {}, {k: d for k, (_, d) in extras.items()}
    for key, value in mapping.items():
        if key in hints and key in names:
            kwargs[key] = _check(value, hints[key], f"{where}.{key}", problems)
        elif key in extras:
            extra_values[key] = _check(value, extras[key][0], f"{where}.{key}", problems)
        else:
            close = difflib.get_close_matches(str(key), names + list(extras), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{where}: unknown key {key!r}{hint}; known keys: {', '.join(names + list(extras))}")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        errs = check()
        if errs:
            raise ConfigError("invalid config:\n  " + "\n  ".join(f"{where}: {e}" for e in errs))
    return (obj, extra_values) if extras else obj


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def load_yaml(path: str | Path) -> dict:
    import yaml

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections (defaults:, collectives:, ...)")
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """``-p key=value``: value parsed as YAML (``sizes=[1024,2048]``, ``env={NCCL_ALGO: Ring}``)."""
    import yaml

    if "=" not in text:
        raise ConfigError(f"override {text!r} is not key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    return key.strip(), value
