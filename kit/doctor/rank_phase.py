"""The per-rank phase (in a worker: :func:`kit.traces.jobs.map_ranks`, local processes or a Dask cluster):
parse the rank's trace once, then its stages in one direction --

    parse (kit.traces) -> steps (:mod:`.steps`) -> host model (:mod:`.host_model`) -> step accounting
    (:mod:`.accounting`) -> collectives timeline (:mod:`.collectives`) -> every rule's ``extract``

-- each stage reading the ones before it through one :class:`kit.doctor.model.RankView`, and send back a small
:class:`RankSummary` (never the events)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .model import RULES, RankView, Skip
from .notes import capture_notes
from .steps import find_steps, step_time


@dataclass(frozen=True)
class RankSummary:
    """What a worker sends back for one rank: identity, step facts, capture notes, each rule's summary."""

    path: str
    rank: int | None
    world_size: int | None
    step_us: float | None
    steps: int
    notes: tuple[str, ...]
    per_rule: dict[str, Any]
    """rule id -> extract's summary, or a Skip"""
    identity: Any = None
    """who the trace says it is (:class:`kit.traces.jobs.RankIdentity`): what the job check compares"""
    warnings: tuple[str, ...] = ()
    """what the trace layer dropped or doubted while reading it (:attr:`kit.traces.Trace.warnings`)"""
    account: Any = None
    """the rank's step accounting (:class:`kit.doctor.accounting.Account`), or a Skip saying why there is none"""
    span: tuple[float, float] | None = None
    """first and last GPU activity in Unix time (us: the header's ``baseTimeNanoseconds`` + the trace clock);
    None when the trace has no GPU activity or no base time. The ranks of one job are traced at the same time."""
    host_steps: Any = None
    """the rank's host model per step (:attr:`kit.doctor.host_model.HostModel.per_step`), None without one"""
    capture: dict | None = None
    """how :mod:`kit.capture` recorded the trace (its ``kitCapture`` header), None when it did not"""
    comm: Any = None
    """the rank's collectives (:class:`kit.doctor.collectives.Timeline`), None when they could not be read"""
    overhead: Any = None
    """the profiler's own overhead on the rank's step (:class:`kit.doctor.overhead.ProfilerOverhead`), or None"""
    stage_errors: tuple[Skip, ...] = ()
    """a stage that failed on this rank (a kit bug; its ``rule`` is the stage's name): listed with the skipped rules"""


def rank_summary(path: str | Path) -> RankSummary:
    """The per-rank phase, in a worker (module-level, picklable): parse once -> steps -> the host model -> the
    step accounting -> the collectives timeline -> every rule's extract (each gets the same :class:`RankView`)."""
    from .. import traces
    from ..capture import capture_info
    from ..traces.jobs import rank_identity
    from ..traces.names import parse_name
    from . import rules  # noqa: F401  (registers the rules in this process)
    from .accounting import rank_account
    from .collectives import timeline
    from .host_model import host_model
    from .overhead import overhead

    t = traces.load_trace(path)
    # a CPU-only job: the host model reads every CPU op (small traces)
    cpu_all = traces.load_trace(path, cpu="all").cpu if t.gpu.empty and not t.cpu.empty else None
    st = find_steps(t.cpu, cpu_all, t.gpu)
    rank = t.info.rank
    if rank is None:
        parsed = parse_name(Path(path).name)
        rank = parsed[1] if parsed else None
    view = RankView(trace=t, steps=st, rank=rank if rank is not None else -1)
    view = replace(view, step_us=step_time(view))  # the same memo: what step_time computed is shared
    name = Path(path).name
    host = _stage(lambda: host_model(view, cpu_all), "step_accounting", name)
    acct = host if isinstance(host, Skip) else _stage(lambda: rank_account(view, host, cpu_all), "step_accounting",
                                                      name)
    view = replace(view, host=host if not isinstance(host, Skip) else None, account=acct)
    comm = _stage(lambda: timeline(view), "collectives", name)
    cap = capture_info(t)
    ovh = (_stage(lambda: overhead(view, cap, cpu_all=cpu_all), "profiler_overhead", name)
           if view.host is not None else None)
    per_rule: dict[str, Any] = {rid: _stage(lambda: r.extract(view), rid, name) for rid, r in RULES.items()}
    base = t.header.get("baseTimeNanoseconds")
    span = None
    if isinstance(base, (int, float)) and not t.gpu.empty:
        span = (base / 1e3 + float(t.gpu["ts"].min()), base / 1e3 + float(t.gpu["end"].max()))
    return RankSummary(path=str(path), rank=rank, world_size=t.info.world_size, step_us=view.step_us,
                       steps=int(len(st)), notes=tuple(capture_notes(t, st)), per_rule=per_rule, span=span,
                       account=acct, identity=rank_identity(t, path),
                       warnings=tuple(getattr(t, "warnings", ()) or ()),
                       host_steps=_with_tracer(view.host.per_step if view.host is not None else None, ovh),
                       capture=cap, comm=None if isinstance(comm, Skip) else comm,
                       overhead=None if isinstance(ovh, Skip) else ovh,
                       stage_errors=tuple(x for x in (comm, ovh) if isinstance(x, Skip)))


def _with_tracer(per_step, ovh):
    """The host model's per-step frame with the tracer's price of the rank's Python off its ops on its main thread, per
    step (:data:`kit.doctor.own_time.TRACER`, :data:`~kit.doctor.own_time.TRACER_IN_WAIT`:
    :attr:`kit.doctor.overhead.ProfilerOverhead.off_ops_steps`) where it has any."""
    from .own_time import TRACER, TRACER_IN_WAIT

    steps = dict(getattr(ovh, "off_ops_steps", ()) or ()) if ovh is not None and not isinstance(ovh, Skip) else {}
    if per_step is None or not steps or not any(steps.values()):
        return per_step
    waits = dict(getattr(ovh, "off_ops_in_wait_steps", ()) or ())
    n = per_step["step"].astype(int)
    return per_step.assign(**{TRACER: n.map(lambda k: steps.get(k, 0.0)).astype(float),
                              TRACER_IN_WAIT: n.map(lambda k: waits.get(k, 0.0)).astype(float)})


def _stage(fn, rid: str, name: str):
    """``fn()``; a bug in it becomes a Skip (of rule or stage ``rid``) so that it does not lose the other rules'
    findings of this rank, unless ``KIT_DOCTOR_STRICT`` is set."""
    try:
        return fn()
    except Exception as e:
        if strict():
            raise
        return Skip(rid, f"internal error on {name} (a kit bug: please report it with the trace): "
                               f"{type(e).__name__}: {e}")




def strict() -> bool:
    """Rule errors raise instead of becoming a skip line (``KIT_DOCTOR_STRICT=1``; the tests set it)."""
    import os

    return os.environ.get("KIT_DOCTOR_STRICT", "") not in ("", "0")
