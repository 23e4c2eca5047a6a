"""The doctor's types: a :class:`Rule` is two small typed functions over the trace layer, a :class:`Finding` is
what a rule says about a job, a :class:`Skip` is a rule that could not run on these traces and why.

**Why two functions per rule.** A job has 8 to 1,000 ranks of 50-500 MB traces. ``extract(rank)`` runs where
the rank's trace is parsed (a local worker process or a Dask worker, :func:`kit.traces.jobs.map_ranks`) and
returns a small picklable summary (a few numbers, or a frame of one row per collective/step -- never the event
list). ``judge(summaries, ctx)`` runs once, on the client, over the summaries of every rank: what crosses ranks
(the late rank of a collective instance, the same kernel on every rank) is decided there. So no process ever
holds more than one rank's events, and a rule written for two ranks runs unchanged on 512.

**Cost and severity.** Every finding says how much time it costs per training step (``cost_us_per_step``:
the time a fix could give back, on the worst rank unless the rule says otherwise). Findings are ranked by it.
Severity is not chosen by the rule: it is the cost's share of the step (:func:`severity`), so severities are
comparable across rules and a clean job gives nothing above ``low``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from .calls import GRAPH_LAUNCH

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

    from ..traces import Trace

Severity = Literal["high", "medium", "low", "info"]
SEVERITY_SHARE: dict[str, float] = {"high": 0.10, "medium": 0.03, "low": 0.005}
"""cost / step time at or above which a finding gets that severity (below ``low``: ``info``). 10% of a step is
worth stopping for; 3% is worth a ticket; under 0.5% is within the run-to-run spread of a step time (the kit's
recorded runs move by 1-3% between identical runs), so it is only information."""
REPORTED: tuple[str, ...] = ("high", "medium", "low")
"""severities the text report and the exit status count as a problem"""


def severity(cost_us_per_step: float, step_us: float | None) -> Severity:
    """The severity of a cost, from its share of the step (see :data:`SEVERITY_SHARE`). Without a step time
    (a trace with no ``ProfilerStep`` annotation) the share is taken of the whole traced GPU time."""
    if not step_us or step_us <= 0 or cost_us_per_step is None or cost_us_per_step <= 0:
        return "info"
    share = cost_us_per_step / step_us
    for name, lo in SEVERITY_SHARE.items():
        if share >= lo:
            return name  # type: ignore[return-value]
    return "info"


@dataclass(frozen=True)
class Skip:
    """A rule that could not run on these traces, and why (listed in the report, never silently passed)."""

    rule: str
    why: str


@dataclass(frozen=True)
class Finding:
    """What one rule found in the job. ``evidence`` holds the numbers from the traces (plain JSON values);
    ``summary`` says them in one sentence; ``cause``/``fix``/``caveats`` come from the rule."""

    rule: str
    cost_us_per_step: float
    ranks: tuple[int, ...]
    evidence: Mapping[str, Any]
    summary: str
    cause: str
    fix: str
    caveats: str = ""
    notebook: str | None = None
    severity: Severity = "info"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = list(self.ranks)
        d["evidence"] = dict(self.evidence)
        return d


@dataclass(frozen=True)
class RankView:
    """What every rule's ``extract`` gets for one rank: the parsed trace and the step windows.

    ``steps``: one row per ``ProfilerStep#N`` annotation (columns ``step``, ``ts``, ``end``, ``dur``; CPU clock,
    which is the GPU clock in Kineto traces); empty when the trace has none -- then rules treat the whole trace
    as one step and ``step_us`` is the traced span."""

    trace: "Trace"
    steps: "pd.DataFrame"
    rank: int
    step_us: float | None = None
    """the rank's step time (us, :func:`kit.doctor.steps.step_time`); the traced span without step annotations"""
    host: Any = None
    """the rank's host model (:class:`kit.doctor.host_model.HostModel`), None when there is nothing to model"""
    account: Any = None
    """the rank's step accounting (:class:`kit.doctor.accounting.Account`), or a Skip saying why there is none"""
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    """what several rules of this rank share (:meth:`shared`), computed once"""

    @property
    def n_steps(self) -> int:
        """Steps the per-step costs divide by: the ``ProfilerStep`` windows, or 1 (the traced span is one step)."""
        return max(1, len(self.steps))

    def in_steps(self, ts) -> "np.ndarray":
        """For each host time in ``ts``: inside a ``ProfilerStep`` window? (All true without step annotations:
        then the whole trace is the step.) Work between steps (the profiler's own start/stop, a final
        synchronize) is not the training step's, so rules count only what falls inside."""
        import numpy as np

        ts = np.asarray(ts, dtype=float)
        if self.steps.empty:
            return np.ones(ts.shape, dtype=bool)
        st = self.steps.sort_values("ts")
        a, b = st["ts"].to_numpy(dtype=float), st["end"].to_numpy(dtype=float)
        i = np.searchsorted(a, ts, side="right") - 1
        return (i >= 0) & (ts < b[np.clip(i, 0, None)])

    def issued(self) -> "pd.DataFrame":
        """The ``gpu`` frame with, per activity, the host call that issued it (Kineto gives a kernel, a copy or a
        memset the ``correlation`` id of its ``cudaLaunchKernel`` / ``cuLaunchKernelEx`` / ``cudaMemcpyAsync``
        call, and every kernel of a replayed CUDA graph the id of its ``cudaGraphLaunch``): ``call`` (name, ''
        when the call is not in the trace), ``call_ts``, ``call_end``, ``tid``, ``graph`` (replayed from a graph)
        and ``in_step``: issued inside a ``ProfilerStep`` window. An activity whose call is not in a trace that
        has runtime calls was issued before the trace began (the previous step's work, still queued): not this
        step's. In a trace without runtime calls the activity's own start decides. Computed once per rank."""
        return self.shared("issued", _issued)

    def shared(self, key: str, build: "Callable[[RankView], Any]") -> Any:
        """``build(self)`` once per rank for every rule that asks with the same ``key`` (e.g. the host
        timeline the host rules all read), then the stored result."""
        if key not in self.memo:
            self.memo[key] = build(self)
        return self.memo[key]


def _issued(view: RankView) -> "pd.DataFrame":
    import numpy as np

    gpu, cpu = view.trace.gpu, view.trace.cpu
    calls = cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"])] if not cpu.empty else cpu
    names = calls["name"].astype(str)
    graph = set(calls.loc[names.str.startswith(GRAPH_LAUNCH), "correlation"].dropna())
    by_corr = calls.assign(name=names)[calls["correlation"].notna()].drop_duplicates("correlation") \
        .set_index("correlation")
    j = by_corr.reindex(gpu["correlation"].to_numpy())
    call_ts = j["ts"].to_numpy(dtype=float)
    known = ~np.isnan(call_ts)
    in_step = view.in_steps(np.where(known, call_ts, gpu["ts"].to_numpy(dtype=float)))
    if len(calls):
        in_step &= known
    return gpu.assign(call=j["name"].fillna("").to_numpy(dtype=object), call_ts=call_ts,
                      call_end=j["end"].to_numpy(dtype=float), tid=j["tid"].to_numpy(),
                      graph=gpu["correlation"].isin(graph).to_numpy(), in_step=in_step)


Extract = Callable[[RankView], Any]
Judge = Callable[[list[tuple[int, Any]], Any], "list[Finding] | Skip"]
"""(rank, summary) of the ranks that did not skip, and the job (:class:`kit.doctor.context.JobContext`)"""


@dataclass(frozen=True)
class Explains:
    """The slices of the step accounting (:data:`kit.doctor.accounting.SLICES`) a rule explains: a finding for
    them is said under the rule's id, with ``sentence(account, cost_us, share, who)`` and ``evidence(account)``
    (:func:`kit.doctor.findings.slice_finding`)."""

    slices: tuple[str, ...]
    sentence: Callable[..., str]
    evidence: Callable[[Any], dict] = lambda a: {}
    signature: bool = False
    """the rule finds its cause by its own signature (its own judge); the accounting's slice is then its cost, and
    when it stays silent while the slice costs at least 'low', the slice is said from the accounting
    (:mod:`kit.doctor.reconcile`)"""


@dataclass(frozen=True)
class Rule:
    """One diagnosis, declared in one module (``kit/doctor/rules/<id>.py``). ``extract`` runs per rank (in a
    worker), returns a small picklable summary or a :class:`Skip`; ``judge`` gets ``[(rank, summary), ...]`` of the
    ranks that did not skip and the :class:`kit.doctor.context.JobContext`, and returns findings (possibly none:
    checked, nothing found) or a Skip. ``cause``/``fix``/``caveats``/``notebook`` are the rule's fixed text; a
    finding may refine the fix."""

    id: str
    title: str
    extract: Extract
    judge: Judge
    cause: str
    fix: str
    caveats: str = ""
    notebook: str | None = None
    needs_ranks: int = 1
    """fewer ranks than this: skipped with the reason (e.g. late_rank needs 2)"""
    needs_sweep: bool = False
    cross_rank: bool = False
    """its cost compares ranks: its evidence says 'partial' when ranks of the job are missing"""
    explains: Explains | None = None
    """the accounting slices it explains (:class:`Explains`), if any"""
    order: int = 1000
    """where it comes in :data:`RULES` (the order rules run, are listed and break ties between equal costs)"""


RULES: dict[str, Rule] = {}
"""every registered rule, by id, in :attr:`Rule.order`"""


def rule(r: Rule) -> Rule:
    """Register a rule (``RULES[r.id] = r``, kept in :attr:`Rule.order`); returns it. Rule modules call this at
    import."""
    if r.id in RULES and RULES[r.id] is not r:
        raise ValueError(f"rule {r.id!r} registered twice")
    RULES[r.id] = r
    ordered = sorted(RULES.values(), key=lambda x: (x.order, x.id))
    RULES.clear()
    RULES.update((x.id, x) for x in ordered)
    return r


def slice_rules() -> dict[str, str]:
    """Which rule explains which accounting slice (from the rules' :attr:`Rule.explains`)."""
    return {s: r.id for r in RULES.values() if r.explains for s in r.explains.slices}


@dataclass
class Diagnosis:
    """The doctor's answer for one job (``--json`` prints :meth:`to_json`)."""

    findings: list[Finding]
    checked: list[str]
    skipped: list[Skip]
    traces: list[str]
    ranks: list[int]
    step_us: float | None
    steps: int
    failed: list[dict[str, str]] = field(default_factory=list)
    """rank traces that could not be read: [{"trace", "error"}] (the result is then partial)"""
    notes: list[str] = field(default_factory=list)
    """what the traces lack for a full diagnosis (how they were captured), one sentence each"""
    missing: list[int] = field(default_factory=list)
    """ranks of the job's world size whose traces were not given (cross-rank costs are then partial)"""
    world_size: int | None = None
    accounting: dict[str, dict[str, Any]] = field(default_factory=dict)
    """per rank (str), the step accounting: mode, steps, window_us, step_us, ``us_per_step`` and ``share`` per
    slice (:data:`kit.doctor.accounting.SLICES`; the shares of a rank sum to 1)"""
    devices: list[str] = field(default_factory=list)
    """the GPU names the traces' headers give (``deviceProperties``); [] when they give none"""
    dates: list[str] = field(default_factory=list)
    """the UTC days (YYYY-MM-DD) the traces' events span; [] without a base time"""
    flight_recorder: list[str] = field(default_factory=list)
    """what the Flight Recorder dumps (``--fr``) show across ranks: a collective some rank never issued (what a
    hang waits for), ranks issuing different collectives at one sequence number; one sentence each"""
    overhead: dict[int, Any] = field(default_factory=dict)
    """per rank, the profiler's own overhead the costs are stated net of (:class:`kit.doctor.overhead.
    ProfilerOverhead`, as the job pays it: :func:`kit.doctor.overhead.job_floor`); {} where none was derived"""

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity in REPORTED]

    def to_json(self) -> dict[str, Any]:
        return {"findings": [f.to_json() for f in self.findings], "checked": list(self.checked),
                "skipped": [asdict(s) for s in self.skipped], "traces": list(self.traces),
                "ranks": list(self.ranks), "step_us": self.step_us, "steps": self.steps,
                "failed": list(self.failed), "notes": list(self.notes), "accounting": dict(self.accounting),
                "world_size": self.world_size, "missing": list(self.missing), "devices": list(self.devices),
                "dates": list(self.dates), "flight_recorder": list(self.flight_recorder),
                "profiler_overhead": {str(r): o.as_dict() for r, o in self.overhead.items()}}

