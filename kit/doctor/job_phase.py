"""The cross-rank phase (on the caller, over the small per-rank summaries): the job check first (the ranks read
are one job: :func:`check_one_job`), then the :class:`kit.doctor.context.JobContext` every judge shares
(:func:`job_context`), then every rule's ``judge`` (:func:`judge_all`). What follows is :mod:`.reconcile` and
:mod:`.finalize`."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Iterable, Sequence

from .context import JobContext
from .model import RULES, Finding, Skip
from .rank_phase import RankSummary, strict


def check_one_job(summaries: Sequence[RankSummary]):
    """The trace layer's job check (:func:`kit.traces.jobs.check_job`) on the ranks read: raises JobError when they
    are not one job; returns the summaries with ranks filled in (file order where the traces say nothing) and the
    :class:`kit.traces.jobs.JobCheck` (which ranks of the world size are missing)."""
    from ..traces.jobs import check_job

    check = check_job([s.identity for s in summaries])
    filled = [replace(s, rank=i.rank) if s.rank != i.rank else s for s, i in zip(summaries, check.ranks)]
    return settle_split(filled), check


def settle_split(summaries: Sequence[RankSummary]) -> list[RankSummary]:
    """The summaries with, for each rank whose quiet time shows its core taken away
    (:func:`kit.doctor.contended.lost_cores`, over every rank's host steps), the step accounting that counts only its
    one stall a step as ``host_stall`` (:attr:`kit.doctor.accounting.Account.split`: its other stall stretches are the
    core's slices, issuing done more slowly) in place of the one that counts every stretch -- in the summary and in
    each rule's summary that is that account. A rank with no lost core keeps every stall stretch a stall in its
    accounting."""
    from .accounting import Account
    from .contended import lost_cores

    hs = {int(s.rank): s.host_steps for s in summaries if s.rank is not None and s.host_steps is not None}
    times = [s.step_us for s in summaries if s.step_us]
    lost = set(lost_cores(hs, statistics.median(times) if times else None))
    out = []
    for s in summaries:
        if s.rank is None or int(s.rank) not in lost:
            out.append(s)
            continue
        a = s.account
        new = a.split if isinstance(a, Account) and a.split is not None else a
        out.append(replace(s, account=new, per_rule={k: new if v is a else v for k, v in s.per_rule.items()}))
    return out


def job_context(summaries: Sequence[RankSummary], *, sweep=None) -> JobContext:
    """The job as every judge sees it: ranks, the median step time, the per-rank host steps, capture facts and
    collectives timelines (matched across ranks on first use)."""
    step_times = [s.step_us for s in summaries if s.step_us]
    ctx = JobContext(ranks=tuple(int(s.rank) for s in summaries),  # type: ignore[arg-type]
                      step_us=statistics.median(step_times) if step_times else None,
                      steps=min((s.steps for s in summaries), default=0), sweep=sweep,
                      summaries={int(s.rank): s for s in summaries},  # type: ignore[arg-type]
                      host_steps={int(s.rank): s.host_steps for s in summaries  # type: ignore[arg-type]
                                  if s.host_steps is not None},
                      capture={int(s.rank): s.capture for s in summaries},  # type: ignore[arg-type]
                      comm={int(s.rank): s.comm for s in summaries if s.comm is not None},  # type: ignore[arg-type]
                      overhead={int(s.rank): s.overhead for s in summaries  # type: ignore[arg-type]
                                if getattr(s, "overhead", None) is not None} or None)
    if ctx.overhead and len(ctx.ranks) > 1 and any(o.basis != "none" for o in ctx.overhead.values()):
        from .overhead import job_floor  # the job's busiest GPU (its own work): bounds an estimate, caps a measured gain

        from .own_time import at_job_speed  # ranks compared at the job's host speed, not each one's own

        waits = ctx.comm_waits_by_step()  # per step where the steps are known (own_work)
        ctx = replace(ctx, overhead=job_floor(ctx.overhead, waits, ctx.host_steps),
                      overhead_at_job=job_floor(at_job_speed(ctx.overhead), waits, ctx.host_steps))
    return ctx


def judge_all(ctx: JobContext, only: Iterable[str] | None = None) -> tuple[list[Finding], list[str], list[Skip],
                                                                            list[str]]:
    """Every rule's judge over the per-rank summaries of the ranks that did not skip it: the findings (as the
    rules said them), the rules checked, the rules skipped (with why) and a line per rule judged on some ranks
    only."""
    from . import rules  # noqa: F401  (registers them)

    findings: list[Finding] = []
    checked: list[str] = []
    skipped: list[Skip] = []
    partial: list[str] = []
    want = set(only) if only is not None else None
    summaries = list(ctx.summaries.values())
    for rid, r in RULES.items():
        if want is not None and rid not in want:
            continue
        if len(ctx.ranks) < r.needs_ranks:
            skipped.append(Skip(rid, f"needs traces of {r.needs_ranks}+ ranks of one job; got {len(ctx.ranks)}"))
            continue
        if r.needs_sweep and ctx.sweep is None:
            skipped.append(Skip(rid, "needs a collectives sweep of the same machine (--sweep RUN_DIR or "
                                     "nccl-tests output)"))
            continue
        got = [(int(s.rank), s.per_rule.get(rid)) for s in summaries]  # type: ignore[arg-type]
        skips = [v for _, v in got if isinstance(v, Skip)]
        usable = [(rk, v) for rk, v in got if not isinstance(v, Skip) and v is not None]
        if not usable:
            skipped.append(skips[0] if skips else Skip(rid, "no rank gave it anything to look at"))
            continue
        if skips:  # judged on the other ranks; said, never silently narrowed
            left = [rk for rk, v in got if isinstance(v, Skip)]
            partial.append(f"{rid} judged on {len(usable)} of {len(got)} ranks, not on rank(s) "
                           f"{', '.join(map(str, left[:16]))}{' ...' if len(left) > 16 else ''}: {skips[0].why}")
        try:
            out = r.judge(usable, ctx)
        except Exception as e:  # a bug in the rule: never hide the other rules' findings, never pass it silently
            if strict():
                raise
            skipped.append(Skip(rid, f"internal error in the rule (a kit bug: please report it with the traces): "
                                     f"{type(e).__name__}: {e}"))
            continue
        if isinstance(out, Skip):
            skipped.append(out)
            continue
        checked.append(rid)
        findings += out
    return findings, checked, skipped, partial
