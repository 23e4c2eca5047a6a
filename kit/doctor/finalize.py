"""The finalize stage: each finding's cost capped at a step and its severity set, once, after the judges and the
reconcile stage (:func:`finalize`; the costs arrive net of the profiler's overhead); cross-rank costs marked
partial when ranks of the job are missing; the :class:`kit.doctor.model.Diagnosis` assembled: the accounting rows
(:func:`accounting_row`), the Flight Recorder's statements, the hardware and dates the traces were captured on
(:func:`captured_on`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from .model import RULES, Finding, severity


def finalize(findings: list[Finding], step_us: float | None, partial: str | None = None) -> list[Finding]:
    """Every finding capped at the job's step (:func:`capped`), with its severity (:func:`kit.doctor.model.
    severity`), its rule's notebook when it names none, ``evidence["partial"]`` on cross-rank findings when
    ``partial`` (the job check's note on missing ranks); most costly first, a moment after the other ranks' per-step
    causes (:func:`moments_after`). Costs arrive net of the profiler's overhead
    (:func:`kit.doctor.reconcile.net_of_profiler`): this stage only caps and grades them."""
    out = []
    for f in findings:
        f = capped(f, step_us)
        r = RULES.get(f.rule)
        f = replace(f, severity=severity(f.cost_us_per_step, step_us),
                    notebook=f.notebook or (r.notebook if r else None))
        if partial and r is not None and (r.needs_ranks > 1 or r.cross_rank):  # a cost read off some ranks only
            f = replace(f, evidence={**f.evidence, "partial": partial})
        out.append(f)
    out.sort(key=lambda f: -(f.cost_us_per_step or 0))
    return said_after(moments_after(out))


def moments_after(findings: list[Finding]) -> list[Finding]:
    """A moment (``evidence["moment"]``, :func:`kit.doctor.findings.moment`) comes right after the last finding of
    'low' or more that is no moment and names none of its ranks: one host's one-off is no per-step cause ahead of
    another rank's repeated one. On the same rank cost decides: one occurrence cannot tell a one-off from a cause of
    a period longer than the window (FINDINGS.md, "Session 13: the slow host moment")."""
    out = list(findings)
    for f in [f for f in findings if f.evidence.get("moment")]:
        mine = set(f.ranks)
        last = max((i for i, x in enumerate(out) if not x.evidence.get("moment") and x.severity != "info"
                    and not mine & set(x.ranks)), default=-1)
        if last > out.index(f):
            out.remove(f)
            out.insert(last, f)
    return out


def said_after(findings: list[Finding]) -> list[Finding]:
    """A finding whose evidence names ``said_after`` (rule ids: the findings that say why part of its time was
    spent, :func:`kit.doctor.reconcile.host_work_first`) comes right after the last of them, whatever its cost."""
    out = list(findings)
    for f in [f for f in findings if f.evidence.get("said_after")]:
        ids = set(f.evidence["said_after"])
        last = max((i for i, x in enumerate(out) if x.rule in ids), default=-1)
        if last > out.index(f):
            out.remove(f)
            out.insert(last, f)
    return out


def profiler_notes(overhead: dict | None) -> list[str]:
    """One line: the traced step against the step without the profiler (median over ranks), and how it is known."""
    if not overhead:
        return []
    known = [o for o in overhead.values() if o.basis != "none" and o.traced_step_us]
    if not known:
        unknown = [o for o in overhead.values() if o.traced_step_us]
        return [f"the profiler's own overhead is not known ({unknown[0].how}): costs are stated as traced"] \
            if unknown else []
    import statistics

    traced = statistics.median(o.traced_step_us for o in known)
    unprof = statistics.median(o.unprofiled_step_us for o in known)
    bases = sorted({o.basis for o in known})
    return [f"the profiler's own overhead: traced step {traced / 1e3:.2f} ms, {unprof / 1e3:.2f} ms without the "
            f"profiler ({' and '.join(bases)}, median over {len(known)} rank(s); {known[0].how}); launch-bound costs "
            f"are stated net of it, and DataLoader waits net of its part recorded inside them"]


def capped(f: Finding, step_us: float | None) -> Finding:
    """No finding costs more than a step: a cost measured on a rank whose step is longer than the job's median
    step is cut to the step, and the evidence says so."""
    if not step_us or f.cost_us_per_step <= step_us:
        return f
    return replace(f, cost_us_per_step=round(float(step_us), 1),
                   evidence={**f.evidence, "cost_capped_from_us": f.cost_us_per_step})


def accounting_row(a, wait_us: float | None = None) -> dict[str, Any]:
    """One rank's account as plain JSON: the mode, windows, mean window and per slice us per step and share;
    ``comm_split``: the ``comm`` slice's waiting for peers (exposed, matched across ranks) and transfer, when the
    collectives could be matched."""
    from .accounting import SLICES

    row = {"mode": a.mode, "steps": a.steps, "window_us": round(a.window_us, 1),
           "step_us": round(a.step_us, 1) if a.step_us else None,
           "us_per_step": {s: round(a.cost(s), 1) for s in SLICES},
           "share": {s: round(a.share(s), 4) for s in SLICES}}
    if wait_us is not None:
        comm = a.cost("comm")
        scale = (a.step_us or a.window_us) / a.window_us if a.window_us else 1.0
        wait = min(comm, wait_us * scale)
        row["comm_split"] = {"waiting_us": round(wait, 1), "transfer_us": round(comm - wait, 1)}
    return row


def flight_recorder_lines(flight_recorder) -> list[str]:
    """What the Flight Recorder dumps show across ranks, one sentence each (:func:`kit.traces.fr_statements`)."""
    if flight_recorder is None or not len(flight_recorder):
        return []
    from ..traces import fr_mismatches, fr_statements

    return fr_statements(fr_mismatches(flight_recorder)) or [
        f"{len(flight_recorder)} entries of {flight_recorder['rank'].nunique()} rank(s): every collective "
        f"reached by every rank, the same op at each sequence number"]


def captured_on(summaries: Sequence[Any]) -> dict[str, Any]:
    """``devices`` (the GPU names the traces' headers give) and ``dates`` (UTC days their events span), for the
    report's captions: which hardware, when."""
    import datetime as dt

    ids = [s.identity for s in summaries if s.identity is not None]
    devices = sorted({i.device for i in ids if i.device})
    days = {dt.datetime.fromtimestamp(t / 1e6, dt.timezone.utc).strftime("%Y-%m-%d")
            for i in ids if i.span for t in i.span}
    return {"devices": devices, "dates": sorted(days)}
