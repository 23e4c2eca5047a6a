"""The experiment contract: what an investigation is, and the registry of them (see ``kit/README.md``).

An investigation is one :class:`Investigation` value, ``INVESTIGATION`` in its module:

* ``Config`` -- a dataclass deriving from :class:`kit.config.LaunchConfig`; allowed values are types
  (``Literal[...]``, ``list[Literal[...]]``), so :func:`kit.config.validate` rejects a bad value before
  anything runs; cross-field rules go in ``Config.check() -> list[str]``.
* ``run(cfg, ctx)`` -- the rank function, a generator of rows (dicts). Every row has the declared
  ``columns`` (at least ``kind``; the launcher adds ``rank``); the launcher rejects a row that lacks one.
* ``needs(cfg, machine) -> list[str]`` -- what this configuration needs that the machine lacks (empty: it
  can run). ``kit run`` asks every investigation before running any, and gives each one that cannot run a
  page that says why (see :mod:`kit.runner`).
* ``tables`` / ``figures`` -- named analyses of a :class:`kit.results.RunSet` (the rows of the chosen runs
  as one DataFrame, their directories and metadata): ``tables[name](runs) -> DataFrame``,
  ``figures[name](runs) -> matplotlib Figure``. An analysis given rows that lack what it needs (no CUDA
  rows, one rank, an empty run) returns an empty DataFrame / a figure that says so -- never raises.
* ``findings(runs) -> list[Observation]`` -- the measured statements the notebook prints, each with its value,
  so tests can check them on the recorded runs.
* ``after(cfg, run)`` -- optional launcher-side step once the ranks are done (e.g. nccl-tests).
* ``points(cfg, world_size, cuda) -> int`` -- the measurement points planned: how many ``ctx.step(name)`` calls
  rank 0 makes (finer steps say ``point=False``). The progress bar of a notebook, ``kit run`` and ``kit exp`` counts
  them against this plan (:mod:`kit.progress`, :func:`planned_points`); the tests check that a run keeps its plan.

The registry maps names (= notebook stems) to modules. Investigations outside the kit's tree are added
with ``KIT_INVESTIGATIONS="name=module[:notebook.ipynb],..."`` (a user's own investigation in their repo).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from .config import ConfigError, LaunchConfig, validate
from .results import REPO_ROOT

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .launch import Ctx
    from .results import Run, RunSet

NOTEBOOKS = REPO_ROOT / "notebooks"

# name -> module holding INVESTIGATION. Adding an investigation = one line here (see kit/README.md).
REGISTRY: dict[str, str] = {
    "collectives": "kit.investigations.collectives",
    "graph_gaps": "kit.investigations.graph_gaps",
    "collective_tracing": "kit.investigations.collective_tracing",
    "dataloader_sync": "kit.investigations.dataloader_sync",
    "p2p_transports": "kit.investigations.p2p_transports",
    "doctor": "kit.doctor.page",
}


# ------------------------------------------------------------------------------------------------ values
@dataclass(frozen=True)
class Observation:
    """One measured statement: ``text`` for people, ``key``/``value``/``unit`` for tests and JSON."""

    key: str
    text: str
    value: float | None = None
    unit: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Machine:
    """What this machine offers, as :func:`needs` functions see it (read once, without a CUDA context)."""

    gpus: int
    gpu_name: str = ""
    peer_access: bool | None = None
    """every GPU pair can access the other's memory (None: unknown, e.g. no GPU)"""
    nccl: bool = False
    """torch was built with NCCL"""
    world_size: int = 1
    """the ranks this configuration would start (resolved against the GPUs present)"""
    backend: str = "gloo"

    def describe(self) -> str:
        if not self.gpus:
            return "no CUDA GPU"
        return f"{self.gpus} x {self.gpu_name or 'GPU'}" + ("" if self.nccl else ", torch without NCCL")

    @classmethod
    def probe(cls, cfg: LaunchConfig | None = None) -> "Machine":
        from . import launch, sysinfo

        n = launch.cuda_device_count()
        info = sysinfo.collect()
        name = (info.get("gpus") or [{}])[0].get("name", "") if n else ""
        try:
            import torch.distributed as dist

            nccl = bool(n) and dist.is_available() and dist.is_nccl_available()
        except Exception:
            nccl = False
        world, backend = (1, "gloo")
        if cfg is not None:
            try:
                world, backend = launch.resolve(cfg)
            except ConfigError:
                world, backend = (cfg.world_size or max(n, 1), cfg.backend)
        return cls(gpus=n, gpu_name=name, peer_access=sysinfo.peer_access() if n > 1 else None, nccl=nccl,
                   world_size=world, backend=backend)


@dataclass(frozen=True)
class Needs:
    """Requirements most investigations state the same way; :meth:`__call__` is a ``needs`` function."""

    ranks: int = 1
    """at least this many ranks"""
    cuda: bool = False
    """every rank on its own CUDA GPU with NCCL"""
    peer_access: bool = False
    """GPU pairs must reach each other's memory (copy engines between GPUs)"""

    def __call__(self, cfg: LaunchConfig, m: Machine) -> list[str]:
        missing = []
        if self.cuda and (m.gpus < max(self.ranks, 1) or not m.nccl):
            what = f"{max(self.ranks, 1)} CUDA GPU(s) in one node with NCCL"
            missing.append(f"needs {what}; this machine: {m.describe()}")
        elif m.world_size < self.ranks:
            missing.append(f"needs at least {self.ranks} ranks; this configuration starts {m.world_size} "
                           f"(world_size {cfg.world_size or 'auto'}; this machine: {m.describe()})")
        if self.peer_access and m.gpus > 1 and m.peer_access is False:
            missing.append(f"needs peer access between GPUs; this machine: {m.describe()}, peer access off")
        return missing


Analysis = Callable[["RunSet"], Any]


@dataclass(frozen=True)
class Investigation:
    """One investigation (see the module docstring). Built once per module as ``INVESTIGATION``."""

    name: str
    Config: type
    run: Callable[[Any, "Ctx"], Iterable[dict]] | None
    """the rank function; None for an analysis page (``kit doctor``): nothing is launched, the notebook
    analyses the inputs its Config names (traces), and ``kit run`` only renders it"""
    columns: tuple[str, ...]
    tables: Mapping[str, Analysis]
    figures: Mapping[str, Analysis]
    findings: Callable[["RunSet"], list[Observation]]
    needs: Callable[[Any, Machine], list[str]] = Needs()
    after: Callable[[Any, "Run"], None] | None = None
    points: Callable[[Any, int, bool], int] | None = None
    """``(cfg, world_size, cuda) -> int``: rank 0's planned measurement points (None: the bar counts without a
    total)"""
    question: str = ""
    """one line for the report index: what this investigation asks"""
    notebook: Path | None = None
    """default: notebooks/<name>.ipynb"""

    def __post_init__(self) -> None:
        if "kind" not in self.columns:
            raise TypeError(f"{self.name}: columns must include 'kind' (got {self.columns})")
        if not (isinstance(self.Config, type) and issubclass(self.Config, LaunchConfig)):
            raise TypeError(f"{self.name}: Config must derive from kit.config.LaunchConfig")

    # -- the calls a notebook makes -----------------------------------------------------------------
    def config(self, mapping: Mapping[str, Any] | None = None, **kw):
        """The validated Config from ``mapping`` and keyword overrides: an unknown key or a wrong type is one
        :class:`~kit.config.ConfigError` listing every problem."""
        return validate(self.Config, {**dict(mapping or {}), **kw}, where=self.name)

    def from_notebook(self, namespace: Mapping[str, Any]):
        """The validated Config from a notebook's parameters (its ``globals()``; other names are ignored)."""
        names = {f.name for f in dataclasses.fields(self.Config)}
        return self.config({k: v for k, v in namespace.items() if k in names})

    @property
    def notebook_path(self) -> Path:
        return self.notebook or NOTEBOOKS / f"{self.name}.ipynb"

    def table(self, name: str, runs: "RunSet") -> "pd.DataFrame":
        return _lookup(self.tables, name, self.name, "table")(runs)

    def figure(self, name: str, runs: "RunSet", save: bool = True) -> None:
        """Draw figure ``name``, show it (in a notebook) and save it (kit.plot.save) as ``<name>.png``. A figure
        function drawn from committed data rather than ``runs`` carries ``fn.source`` (kit.plot.note_source's
        arguments) for its caption.
        Returns nothing, so a notebook cell shows it once; ``figures[name](runs)`` gives the Figure."""
        from . import plot

        fn = _lookup(self.figures, name, self.name, "figure")
        fig = fn(runs)
        if save and fig is not None:  # a figure drawn from committed data, not the runs, says so (``fn.source``)
            plot.save(fig, name, source=getattr(fn, "source", None))

    def check_row(self, row: Mapping[str, Any]) -> None:
        missing = [c for c in self.columns if c not in row]
        if missing:
            raise KeyError(f"{self.name}: row without declared column(s) {missing}: {dict(row)!r:.200}")



def analysis_page(name: str, Config: type, question: str, notebook: Path | None = None) -> Investigation:
    """An analysis page (``kit doctor``'s report): an entry of the registry that launches nothing, needs nothing of
    the machine and has no runs to analyse -- its notebook reads the inputs its Config names (trace files);
    ``kit run <name>`` renders it and the report index lists it."""
    return Investigation(name=name, Config=Config, run=None, columns=("kind",), tables={}, figures={},
                         findings=lambda runs: [], needs=lambda cfg, machine: [], question=question,
                         notebook=notebook)

def _lookup(d: Mapping[str, Analysis], key: str, inv: str, what: str) -> Analysis:
    if key not in d:
        raise KeyError(f"{inv} has no {what} {key!r}; it has: {', '.join(d)}")
    return d[key]


# ------------------------------------------------------------------------------------------------ registry
def registry() -> dict[str, tuple[str, Path | None]]:
    """name -> (module, notebook or None): the built-in investigations plus ``KIT_INVESTIGATIONS``."""
    out: dict[str, tuple[str, Path | None]] = {k: (v, None) for k, v in REGISTRY.items()}
    for item in filter(None, (s.strip() for s in os.environ.get("KIT_INVESTIGATIONS", "").split(","))):
        name, _, rest = item.partition("=")
        module, _, nb = rest.partition(":")
        if not name or not module:
            raise ConfigError(f"KIT_INVESTIGATIONS entry {item!r} is not name=module[:notebook.ipynb]")
        out[name.strip()] = (module.strip(), Path(nb.strip()) if nb.strip() else None)
    return out


def make_config(name: str, mapping: Mapping[str, Any] | None = None, **kw):
    """``get(name).config(mapping, **kw)``."""
    return get(name).config(mapping, **kw)


def names() -> list[str]:
    return list(registry())


def get(name: str) -> Investigation:
    reg = registry()
    if name not in reg:
        raise ConfigError(f"unknown investigation {name!r}; known: {', '.join(reg)}")
    module, nb = reg[name]
    inv = getattr(importlib.import_module(module), "INVESTIGATION", None)
    if not isinstance(inv, Investigation):
        raise ConfigError(f"{module} has no INVESTIGATION = kit.contract.Investigation(...)")
    if nb is not None and inv.notebook is None:
        inv = dataclasses.replace(inv, notebook=nb)
    return inv


# ------------------------------------------------------------------------------------------------ running
class _Checked:
    """The rank function the launcher runs: the investigation's ``run`` with every row checked against its
    declared columns. A module-level class so spawned ranks can unpickle it (by name, not by closure)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, cfg, ctx):
        inv = get(self.name)
        for row in inv.run(cfg, ctx) or ():
            inv.check_row(row)
            yield row


def check_world(name: str, cfg: LaunchConfig) -> None:
    """Config checks that need the world size (``Config.check_world(world) -> list[str]``)."""
    from .launch import launched_externally, resolve

    fn = getattr(cfg, "check_world", None)
    if fn is None:
        return
    world = int(os.environ["WORLD_SIZE"]) if launched_externally() and "WORLD_SIZE" in os.environ else resolve(cfg)[0]
    errs = fn(world)
    if errs:
        raise ConfigError("invalid config:\n  " + "\n  ".join(f"{name}: {e}" for e in errs))


def missing(name: str, cfg: LaunchConfig, machine: Machine | None = None) -> list[str]:
    """What ``cfg`` of investigation ``name`` needs that this machine lacks ([] = it can run here): more ranks
    than GPUs for NCCL, the investigation's ``needs``, and the Config's rules that depend on the world size
    (``check_world``: with ``world_size: 0`` the world is the machine's GPU count)."""
    from .launch import resolve

    inv = get(name)
    if inv.run is None:  # an analysis page launches nothing: only its own needs count
        return list(inv.needs(cfg, machine or Machine.probe(None)))
    try:
        resolve(cfg)
    except ConfigError as e:
        return [str(e)]
    reasons = list(inv.needs(cfg, machine or Machine.probe(cfg)))
    if not reasons:
        try:
            check_world(name, cfg)
        except ConfigError as e:
            reasons = [line.strip() for line in str(e).splitlines()[1:]] or [str(e)]
    return reasons


class Skipped(RuntimeError):
    """The investigation cannot run on this machine; ``reasons`` says what is missing."""

    def __init__(self, name: str, reasons: list[str]):
        super().__init__(f"{name} cannot run here: " + "; ".join(reasons))
        self.name, self.reasons = name, reasons


def execute(name: str, cfg: LaunchConfig, **kw) -> "Run":
    """Launch investigation ``name`` with ``cfg`` on all ranks, then its launcher-side step. Raises
    :class:`Skipped` when this machine cannot run it, before anything starts."""
    from .launch import launch, launched_externally

    inv = get(name)
    if inv.run is None:
        raise ConfigError(f"{name} is an analysis page: it launches nothing (see its notebook)")
    if launched_externally():  # torchrun / srun chose the world already: a world-size rule is a config error
        check_world(name, cfg)
    else:
        why = missing(name, cfg)  # includes the world-size rules (check_world)
        if why:
            raise Skipped(name, why)
    run = launch(_Checked(name), cfg, name, **kw)
    if inv.after is not None and not launched_externally():
        inv.after(cfg, run)
    return run


def planned_points(name: str, cfg: LaunchConfig) -> int | None:
    """The measurement points a run of ``cfg`` plans, over all its ``env_sets`` (:mod:`kit.progress`): the
    investigation's ``points`` at the world size and backend this configuration gets here (or the job's, under
    torchrun/SLURM); None when it plans none or the world cannot be resolved (the run then says why itself)."""
    from .launch import launched_externally, resolve

    inv = get(name)
    if inv.points is None or inv.run is None:
        return None
    try:
        world, backend = resolve(cfg)
    except ConfigError:
        return None
    if launched_externally() and "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
    return int(inv.points(cfg, world, backend == "nccl")) * max(len(cfg.env_sets), 1)


def execute_all(name: str, cfg: LaunchConfig, **kw) -> list["Run"]:
    """One run per entry of ``cfg.env_sets`` (fresh ranks each: NCCL reads its variables once per process),
    labelled by the variables of the set; a single run when ``env_sets`` is empty."""
    if not cfg.env_sets:
        return [execute(name, cfg, **kw)]
    runs = []
    for env in cfg.env_sets:
        label = " ".join(f"{k}={v}" for k, v in env.items()) or "default env"
        sub = dataclasses.replace(cfg, env={**cfg.env, **env}, env_sets=[], label=f"{cfg.label} {label}".strip())
        runs.append(execute(name, sub, **kw))
    return runs


__all__ = ["Observation", "Investigation", "Machine", "Needs", "REGISTRY", "Skipped", "execute", "execute_all", "get",
           "missing", "names", "planned_points", "registry"]
