"""``diagnose(traces)``: the doctor's stages, in one direction.

Per rank, in parallel (:func:`kit.traces.jobs.map_ranks`: local processes, or a Dask cluster with ``client=``):
:func:`kit.doctor.rank_phase.rank_summary` -- parse -> steps -> host model -> accounting -> collectives ->
every rule's ``extract``. Then, on the caller: the job check and the :class:`~kit.doctor.context.JobContext`
(:mod:`.job_phase`) -> every rule's ``judge`` -> :mod:`.reconcile` (costs net of the profiler) ->
:mod:`.finalize` (severity and capping, once) -> the :class:`~kit.doctor.model.Diagnosis`. A rank whose trace
cannot be read is named in ``Diagnosis.failed`` and the other ranks are still diagnosed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from .model import Diagnosis, Skip

WORKER_IMPORTS = ("pandas", "kit.capture", "kit.doctor.rules", "kit.doctor.accounting", "kit.doctor.collectives",
                  "kit.doctor.host_model", "kit.doctor.overhead")
"""what :func:`~kit.doctor.rank_phase.rank_summary` imports: once in the pool's forkserver, not in each worker"""


def diagnose(traces: Iterable[str | Path], *, sweep=None, flight_recorder=None, workers: int | None = None,
             client: Any = None, only: Iterable[str] | None = None) -> Diagnosis:
    """Diagnose one job from its rank traces (files, directories or globs: :func:`kit.traces.jobs.expand`).
    ``sweep``: a collectives sweep of the same machine (see :func:`kit.doctor.sweep.load_sweep`);
    ``flight_recorder``: Flight Recorder rows (:func:`kit.traces.flight_recorder.load_fr_dumps`);
    ``workers``/``client``: local processes or a ``dask.distributed.Client`` for the per-rank phase;
    ``only``: the rule ids to run (:func:`kit.doctor.rules.parse_ids`). Raises TraceError when no trace can be
    read, JobError when the traces are not one job."""
    from ..traces import TraceError
    from ..traces.jobs import expand, map_ranks
    from .finalize import accounting_row, captured_on, finalize, flight_recorder_lines, profiler_notes
    from .job_phase import check_one_job, job_context, judge_all
    from .notes import group_notes, job_notes, missing_wait_notes
    from .rank_phase import rank_summary, strict
    from .reconcile import net_of_profiler, reconcile

    paths = expand(traces)
    res = map_ranks(paths, rank_summary, workers=workers, client=client, preload=WORKER_IMPORTS)
    failed = [{"trace": str(f.path), "error": f.error} for f in res.failed]
    if not res.ok:
        raise TraceError("\n".join(f"{d['trace']}: {d['error']}" if not d["error"].startswith(d["trace"])
                                   else d["error"] for d in failed) or "no traces")
    summaries, job = check_one_job([s for _, s in res.ok])
    if sweep is not None and not hasattr(sweep, "columns"):
        from .sweep import load_sweep

        sweep = load_sweep(sweep)
    ctx = job_context(summaries, sweep=sweep)
    findings, checked, skipped, partial = judge_all(ctx, only)
    skipped += [e for s in summaries for e in s.stage_errors]  # a stage's bug on a rank: said, never dropped
    accounts = [(int(s.rank), s.account) for s in summaries  # type: ignore[arg-type]
                if s.account is not None and not isinstance(s.account, Skip)]
    if accounts:
        try:
            findings = reconcile(findings, accounts, ctx, None if only is None else set(only))
        except Exception as e:
            if strict():
                raise
            skipped.append(Skip("step_accounting", f"internal error (a kit bug: please report it with the traces): "
                                                   f"{type(e).__name__}: {e}"))
    else:  # nothing to reconcile with: the costs are still stated net of the profiler
        findings = [net_of_profiler(f, ctx.overhead) for f in findings]
    findings = finalize(findings, ctx.step_us, job.note() if job.partial else None)
    waits = ctx.comm_waits()
    accounting = {str(s.rank): accounting_row(s.account, waits.get(int(s.rank))) for s in summaries
                  if s.account is not None and not isinstance(s.account, Skip)}
    return Diagnosis(findings=findings, checked=checked, skipped=skipped, traces=[s.path for s in summaries],
                     accounting=accounting, ranks=list(ctx.ranks), step_us=ctx.step_us, steps=ctx.steps,
                     failed=failed, notes=job_notes(job, summaries) + group_notes(summaries) + partial
                     + missing_wait_notes(ctx.waits_for_missing(), ctx.step_us, list(job.missing))
                     + profiler_notes(ctx.overhead),
                     flight_recorder=flight_recorder_lines(flight_recorder), missing=list(job.missing),
                     world_size=job.world_size, overhead=dict(ctx.overhead or {}), **captured_on(summaries))
