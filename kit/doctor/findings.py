"""The one finding builder: a rule's finding with its fixed text (:func:`make`), the worst rank among the ranks
where a rule fired, with every firing rank's evidence up to a limit (:func:`across_ranks`), and the finding for
slices of the step accounting (:func:`slice_finding`, said with the explaining rule's
:class:`kit.doctor.model.Explains`)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .model import RULES, SEVERITY_SHARE, Finding

PER_RANK_LIMIT = 16
"""evidence lists every firing rank's numbers up to this many ranks, else the :data:`PER_RANK_SHOWN` costliest"""
PER_RANK_SHOWN = 8
LOW = SEVERITY_SHARE["low"]


MOMENT_STEPS = 3
"""a cause can be told a moment (:func:`moment`) in a window of at least this many steps: with two, one step of two
is as much every other step as a one-off"""


def moment(per_step: dict) -> dict | None:
    """Whether a cause's time in a window of :data:`MOMENT_STEPS` or more steps (``per_step``: step -> us) is one
    step's: its largest step exceeds every other step by more than half of the window's total. Seen once, it is a
    rate the trace never saw repeat -- no per-step cause; a second step of like size is a repeat (FINDINGS.md,
    "Session 13: the slow host moment"). Returns ``step``, ``steps``, ``in_step_us``, ``share`` (of the total) and
    ``next_us`` (the most in another step), or None."""
    vals = {int(k): float(v) for k, v in per_step.items()}
    total = sum(vals.values())
    if len(vals) < MOMENT_STEPS or total <= 0:
        return None
    top = max(vals, key=vals.get)
    after = max(v for k, v in vals.items() if k != top)
    if vals[top] - after <= 0.5 * total:
        return None
    return {"step": top, "steps": len(vals), "in_step_us": round(vals[top], 1), "share": round(vals[top] / total, 3),
            "next_us": round(after, 1)}


def moment_text(m: dict, what: str = "it") -> str:
    """'; 98% of it in 1 of the 3 steps (step 2: 29.6 ms there) -- seen once in the window: a one-off, or a cause
    with a longer period than the window (profile more steps to tell)'. What the window shows, not what the cause is:
    a DataLoader straggler behind prefetching workers waits once in several steps and still costs every step
    unprofiled (FINDINGS.md, "Session 13: the slow host moment")."""
    return (f"; {100 * m['share']:.0f}% of {what} in 1 of the {m['steps']} steps (step {m['step']}: "
            f"{m['in_step_us'] / 1e3:.1f} ms there) -- seen once in the window: a one-off, or a cause with a longer "
            f"period than the window (profile more steps to tell)")


def make(rid: str, cost: float, ranks: Iterable[int], evidence: dict, summary: str,
         fix: str | None = None) -> Finding:
    """A finding of rule ``rid`` with the rule's cause, fix (unless refined), caveats and notebook."""
    r = RULES[rid]
    return Finding(rule=rid, cost_us_per_step=float(cost), ranks=tuple(int(x) for x in ranks), evidence=evidence,
                   summary=summary, cause=r.cause, fix=fix or r.fix, caveats=r.caveats, notebook=r.notebook)


def who(worst: int, ranks: tuple[int, ...], of: int) -> str:
    """'rank 3', 'every rank (4; worst: rank 3)' or '2 of 4 ranks (1, 3; worst: rank 3)'."""
    if len(ranks) == 1:
        return f"rank {worst}"
    listed = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    if of > 1 and len(ranks) == of:
        return f"every rank ({len(ranks)}; worst: rank {worst})"
    return f"{len(ranks)} of {of} ranks ({listed}; worst: rank {worst})"


def across_ranks(fired: list[tuple[int, float, dict]]) -> tuple[int, tuple[int, ...], dict[str, Any]]:
    """The worst rank (highest cost), every firing rank (sorted) and the ``per_rank`` evidence: each firing rank's
    cost and numbers, the :data:`PER_RANK_SHOWN` costliest when more than :data:`PER_RANK_LIMIT` fired (then
    ``per_rank_note`` says so)."""
    fired = sorted(fired, key=lambda x: -x[1])
    shown = fired if len(fired) <= PER_RANK_LIMIT else fired[:PER_RANK_SHOWN]
    ev: dict[str, Any] = {"per_rank": {str(rk): {"cost_us_per_step": _r(c), **e} for rk, c, e in shown}}
    if len(shown) < len(fired):
        ev["per_rank_note"] = f"the {PER_RANK_SHOWN} costliest of {len(fired)} ranks"
    return fired[0][0], tuple(sorted(rk for rk, _, _ in fired)), ev


def worst_rank(rid: str, fired: list[tuple[int, float, dict]], of: int, sentence: Callable[[int, str], str],
               evidence: Callable[[int], dict], excerpt: Callable[[int], dict | None] = lambda rk: None) -> Finding:
    """One finding naming every rank where rule ``rid`` fired: the worst rank's cost, its evidence
    (``evidence(rank)``) and sentence (``sentence(rank, who)``), every firing rank's numbers
    (:func:`across_ranks`) and, when the rule points at one, the worst rank's timeline excerpt."""
    worst, ranks, per = across_ranks(fired)
    cost = max(c for _, c, _ in fired)
    ev = {"rank": worst, **evidence(worst), **per}
    ex = excerpt(worst)
    if ex is not None:  # kit.doctor.notebook draws it
        ev["excerpt"] = ex
    return make(rid, round(cost, 1), ranks, ev, sentence(worst, who(worst, ranks, of)))


def restated(summary: str, cost_us: float, basis: str, before: str) -> str:
    """A finding's sentence once :mod:`kit.doctor.reconcile` changed its cost: the cost it now carries first, with
    ``basis`` saying what it is (e.g. net of the profiler's overhead), then the sentence as said before, labelled
    ``before`` (e.g. 'as traced'). One sentence, one cost: its first cost per step is the finding's."""
    return f"{cost_us / 1e3:.2f} ms per step {basis}; {before}: {summary}"


def slice_cost(a, slices: tuple[str, ...], whole: bool = False) -> float:
    """What the idle ``slices`` of one rank's :class:`~kit.doctor.accounting.Account` cost per step: the part a
    finding charges (:meth:`~kit.doctor.accounting.Account.charged`), or the ``whole`` slices."""
    return sum(a.cost(s) * a.charged(s, whole) for s in slices)


def slice_share(a, slices: tuple[str, ...], whole: bool = False) -> float:
    """:func:`slice_cost`'s share of the rank's window."""
    return sum(a.share(s) * a.charged(s, whole) for s in slices)


def slice_sentence(rid: str, slices: tuple[str, ...], a, who_: str, whole: bool = False) -> str:
    """Rule ``rid``'s sentence for the ``slices`` of one rank's account, said of ``who_`` (:func:`who`): its
    :class:`~kit.doctor.model.Explains` sentence, which states :func:`slice_cost` first."""
    return RULES[rid].explains.sentence(a, slice_cost(a, slices, whole), slice_share(a, slices, whole), who_)


def slice_finding(rid: str, slices: tuple[str, ...], accounts: list, whole: bool = False,
                  of: int | None = None) -> list[Finding]:
    """One finding for the idle ``slices`` of ``accounts`` (``[(rank, Account)]``) naming every rank where they cost
    >= 'low' of its step; [] when none does. ``whole``: the whole slice, not only the part a finding charges
    (:meth:`kit.doctor.accounting.Account.charged`). ``of``: the job's ranks when ``accounts`` are some of them.
    Said with rule ``rid``'s :class:`~kit.doctor.model.Explains` (:func:`slice_sentence`)."""
    def cost(a) -> float:
        return slice_cost(a, slices, whole)

    def share(a) -> float:
        return slice_share(a, slices, whole)

    ex = RULES[rid].explains
    fired = [(rk, cost(a), {"share_of_step": _r(share(a), 4)}) for rk, a in accounts if share(a) >= LOW]
    if not fired:
        return []
    n = of or len(accounts)
    of = dict(accounts)

    def evidence(rk: int) -> dict:
        a = of[rk]
        ev = {"slices": list(slices), "share_of_step": _r(share(a), 4),
              "job_level": n > 1 and len(fired) == n,
              "gpu_idle_share": _r(a.idle_us / a.window_us, 4) if a.window_us else None, "mode": a.mode,
              "steps_with_it": f"{int((a.per_step[list(slices)].sum(axis=1) > 0).sum())} of {a.steps}"}
        m = slice_moment(a, slices)
        if m is not None:
            ev["moment"] = m
        return {**ev, **ex.evidence(a)}

    def sentence(rk: int, w: str) -> str:
        m = slice_moment(of[rk], slices)
        return slice_sentence(rid, slices, of[rk], w, whole) + (moment_text(m) if m is not None else "")

    return [worst_rank(rid, fired, n, sentence, evidence)]


def slice_moment(a, slices: tuple[str, ...]) -> dict | None:
    """:func:`moment` of one rank's ``slices`` over its account's steps (None without step windows)."""
    ps = a.per_step
    if ps is None or "step" not in ps or len(ps) < MOMENT_STEPS or (ps["step"] < 0).any():
        return None
    return moment(dict(zip(ps["step"].astype(int), ps[list(slices)].sum(axis=1))))


def slice_judge(rid: str):
    """The judge of a rule that is its accounting slices (:attr:`kit.doctor.model.Rule.explains`)."""

    def judge(summaries: list, ctx) -> list[Finding]:
        return slice_finding(rid, RULES[rid].explains.slices, summaries)

    return judge


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(float(x), nd)
