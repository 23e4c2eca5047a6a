"""The rules that read the step accounting (:mod:`kit.doctor.accounting`): every idle slice of a step becomes a
finding when it costs at least 'low', so the doctor never gives an all-clear on a step it has not accounted for.

* ``input_bound``      -- the GPU idles while the host waits for its DataLoader;
* ``host_stall``       -- the GPU idles while the host runs work that issues nothing (Python, GC, logging);
* ``allocator_churn``  -- the GPU idles while the host is in the caching allocator's device calls;
* ``queued_idle``      -- the GPU idles with its next work already issued (dispatch gaps, stream waits);
* ``unexplained_idle`` -- idle the trace cannot attribute (the issuing call is not in it), said with why.

The ``sync`` and ``launch`` slices are what ``host_sync`` and ``launch_bound`` (:mod:`.host`) explain; when those
signature rules stay silent although the slice costs at least 'low', :func:`explain_rest` says the slice with the
accounting's numbers, under the same rule id -- one microsecond, one cause.

**Across ranks.** A slice is judged on every rank; the finding names every rank where it costs at least 'low'.
When that is every rank of a multi-rank job, it is one job-level finding ("on every rank"), not a late rank:
``late_rank`` (:mod:`.comm`) charges a rank only for the waiting it caused beyond the next-latest arrival.
The cost is the worst rank's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..accounting import Account
from ..model import RULES, SEVERITY_SHARE, Finding, RankView, Rule, Skip, rule
from ..texts import TEXT

SLICE_RULE = {"input": "input_bound", "host_stall": "host_stall", "allocator": "allocator_churn",
              "queued": "queued_idle", "unexplained": "unexplained_idle", "sync": "host_sync",
              "launch": "launch_bound", "step_start": "launch_bound"}
"""which rule explains which idle slice"""
LOW = SEVERITY_SHARE["low"]


def _extract(rid: str):
    def extract(view: RankView):
        a = view.account
        return Skip(rid, a.why) if isinstance(a, Skip) else a

    return extract


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(float(x), nd)


def _charged(a: Account, s: str, whole: bool = False) -> float:
    """The part of slice ``s`` a finding charges (:data:`PART`; all of it when ``whole``)."""
    return 1.0 if whole or s not in PART else PART[s](a)


def _slices(a: Account, slices: tuple[str, ...], whole: bool = False) -> float:
    return sum(a.cost(s) * _charged(a, s, whole) for s in slices)


PART = {"queued": lambda a: float(a.queued.get("above_median_share") or 0.0)}
"""the part of a slice a finding charges: of ``queued``, only what exceeds the GPU's own dispatch gap (the
median queued gap of the rank): the dispatch floor is the price of the kernel count (``launch``-side findings
and fusion address it), not a wait anything could remove; it stays in the accounting table"""
MUST_SPEAK = SEVERITY_SHARE["high"]
"""GPU idle at or above this share of a step is never left without a finding at or above 'low'"""


def slice_finding(rid: str, slices: tuple[str, ...], accounts: list[tuple[int, Account]], ctx,
                  whole: bool = False) -> list[Finding]:
    """One finding for the idle ``slices`` of ``accounts`` naming every rank where they cost >= 'low' of its
    step; [] when none does. ``whole``: the whole slice, not only the part a finding charges (:data:`PART`)."""
    def cost(a: Account) -> float:
        return _slices(a, slices, whole)

    def share(a: Account) -> float:
        return sum(a.share(s) * _charged(a, s, whole) for s in slices)

    fired = sorted(((rk, a) for rk, a in accounts if share(a) >= LOW), key=lambda ra: -cost(ra[1]))
    if not fired:
        return []
    worst_rank, worst = fired[0]
    ranks = tuple(sorted(rk for rk, _ in fired))
    everyone = len(accounts) > 1 and len(ranks) == len(accounts)
    who = (f"on every rank ({len(ranks)}; worst: rank {worst_rank})" if everyone else
           f"on rank {worst_rank}" if len(ranks) == 1 else
           f"on {len(ranks)} of {len(accounts)} ranks ({', '.join(map(str, ranks[:8]))}{', ...' if len(ranks) > 8 else ''}; worst: rank {worst_rank})")
    worst_cost = cost(worst)
    ev: dict[str, Any] = {"rank": worst_rank, "slices": list(slices), "share_of_step": _r(share(worst), 4),
                          "job_level": everyone, "gpu_idle_share": _r(worst.idle_us / worst.window_us, 4)
                          if worst.window_us else None, "mode": worst.mode}
    ev["steps_with_it"] = f"{int((worst.per_step[list(slices)].sum(axis=1) > 0).sum())} of {worst.steps}"
    ev.update(DETAIL.get(rid, lambda a: {})(worst))
    ev["per_rank"] = {str(rk): {"cost_us_per_step": _r(cost(a)), "share_of_step": _r(share(a), 4)}
                      for rk, a in fired[:16]}
    r = RULES.get(rid)
    t = TEXT.get(rid) or {"cause": r.cause, "fix": r.fix, "caveats": r.caveats, "notebook": r.notebook}
    summary = SENTENCE[rid](worst, worst_cost, share(worst), who)
    return [Finding(rule=rid, cost_us_per_step=round(worst_cost, 1), ranks=ranks, evidence=ev, summary=summary,
                    cause=t["cause"], fix=t["fix"], caveats=t.get("caveats", ""), notebook=t.get("notebook"))]


def _calls_text(a: Account, key: str, n: int = 3) -> str:
    got = a.calls.get(key) or {}
    top = sorted(got.items(), key=lambda kv: -kv[1]["host_us"])[:n]
    return ", ".join(f"{name} x{v['calls'] / a.steps:.3g}/step ({v['host_us'] / a.steps / 1e3:.2f} ms)"
                     for name, v in top)


def _inside_text(a: Account) -> str:
    """'; most of it in aten::pin_memory (4.3 ms per step) ...' when one op the trace kept takes at least half of
    the DataLoader's time: the part of next() to fix."""
    inside, total = a.calls.get("input_inside") or {}, sum(v["host_us"] for v in (a.calls.get("input") or {}).values())
    if not inside or not total:
        return ""
    name, v = max(inside.items(), key=lambda kv: kv[1]["host_us"])
    if v["host_us"] < 0.5 * total:
        return ""
    why = " -- the batch's pinning, which with num_workers=0 runs in the training thread" if "pin_memory" in name else ""
    return f"; most of it in {name} ({v['host_us'] / a.steps / 1e3:.2f} ms per step){why}"


def _stall_text(a: Account) -> str:
    if not a.stalls:
        return ""
    s = a.stalls[0]
    around = f" between {s['before'] or 'the step start'} and {s['after'] or 'the step end'}"
    within = f", inside {', '.join(s['within'][:3])}" if s.get("within") else ""
    return f"; the longest: {s['dur_us'] / 1e3:.1f} ms without issuing GPU work{around}{within}"


def _launch_text(a: Account) -> str:
    L = a.launch or {}
    if L.get("kernel_median_us") is None or L.get("launch_interval_median_us") is None:
        return ""
    return (f"; {L['kernels_per_step']:.0f} kernels per step, median {L['kernel_median_us']:.1f} us each, "
            f"launched every {L['launch_interval_median_us']:.1f} us (median)")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


SENTENCE = {
    "input_bound": lambda a, c, sh, who: (
        f"the GPU sat idle {c / 1e3:.2f} ms per step ({_pct(sh)} of the step) while the host waited for its "
        f"DataLoader {who}" + (f" ({_calls_text(a, 'input', 1)})" if a.calls.get("input") else "")
        + _inside_text(a)),
    "host_stall": lambda a, c, sh, who: (
        f"the GPU sat idle {c / 1e3:.2f} ms per step ({_pct(sh)}) while the host ran work that issued nothing "
        f"for stretches of >= 1 ms {who}{_stall_text(a)}"),
    "allocator_churn": lambda a, c, sh, who: (
        f"the GPU sat idle {c / 1e3:.2f} ms per step ({_pct(sh)}) while the host was in the caching allocator's "
        f"device calls {who}" + (f": {_calls_text(a, 'allocator')}" if a.calls.get("allocator") else "")),
    "queued_idle": lambda a, c, sh, who: (
        f"the GPU sat idle {c / 1e3:.2f} ms per step ({_pct(sh)}) with its next work already issued {who}"
        + (f" ({a.queued['gaps_per_step']:.0f} gaps per step, median {a.queued['median_us']:.1f} us)"
           if a.queued.get("median_us") is not None else "")),
    "unexplained_idle": lambda a, c, sh, who: (
        f"the GPU sat idle {c / 1e3:.2f} ms per step ({_pct(sh)}) where the trace holds no host call that issued "
        f"the next GPU work, or no GPU work followed {who}"),
    "host_sync": lambda a, c, sh, who: (
        f"the GPU sat idle {c / 1e3:.2f} ms per step ({_pct(sh)}) while the host was blocked in synchronising "
        f"calls and then refilled the GPU's queue {who}" + (f": {_calls_text(a, 'sync')}" if a.calls.get("sync")
                                                              else "")),
    "launch_bound": lambda a, c, sh, who: (
        f"the GPU sat idle {c / 1e3:.2f} ms per step ({_pct(sh)}) waiting for the host to issue its next work "
        f"{who}{_launch_text(a)}" + (f"; {a.cost('step_start') / 1e3:.2f} ms of it before the step's first GPU "
                                      f"work" if a.cost("step_start") > 0 else "")),
}

DETAIL = {
    "input_bound": lambda a: {"dataloader": a.calls.get("input", {}),
                              "dataloader_inside": a.calls.get("input_inside", {})},
    "host_stall": lambda a: {"longest_stalls": list(a.stalls)},
    "allocator_churn": lambda a: {"allocator_calls": a.calls.get("allocator", {})},
    "queued_idle": lambda a: {"queued": dict(a.queued)},
    "host_sync": lambda a: {"sync_calls": a.calls.get("sync", {})},
    "launch_bound": lambda a: {"launch": dict(a.launch), "step_start_us": _r(a.cost("step_start"))},
}


def _judge(rid: str):
    slices = tuple(s for s, r in SLICE_RULE.items() if r == rid)

    def judge(summaries: list[tuple[int, Account]], ctx) -> list[Finding]:
        return slice_finding(rid, slices, summaries, ctx)

    return judge


def comm_waits(ctx) -> dict[int, float]:
    """Per rank, the communication time per step spent waiting for peers that no compute hid (the kernels of the
    ranks that arrived early spin until the last one arrives): the ``comm`` slice's waiting part; the rest of the
    slice is transfer. {} when the collectives cannot be matched across ranks (one rank, no NCCL metadata)."""
    from ..collectives import per_step_divisor

    tls = sorted(ctx.comm.items())
    if len(tls) < 2:
        return {}
    df = ctx.collectives("nccl")
    if df is None or df.empty or (df["ranks_seen"] <= 1).all():
        return {}
    out = {}
    for r, tl in tls:
        mine = df[df["rank"] == r]
        if tl.steps:
            mine = mine[mine["step"].notna()]
        out[r] = float(mine["exposed_wait_us"].sum()) / per_step_divisor(tl)
    return out


def explain_rest(accounts: list[tuple[int, Account]], findings: list[Finding], ctx) -> list[Finding]:
    """The idle slices a signature rule should explain but did not (``host_sync``, ``launch_bound`` silent while
    their slice costs >= 'low'): said from the accounting under that rule's id. Findings of those rules that did
    fire get the accounted cost in their evidence."""
    have = {f.rule for f in findings}
    out = []
    for rid in ("host_sync", "launch_bound"):
        slices = tuple(s for s, r in SLICE_RULE.items() if r == rid)
        if rid in have:  # the signature rule names it; the accounting's slice is its cost (one us, one cause)
            worst = max((_slices(a, slices) for _, a in accounts), default=0.0)
            findings[:] = [dataclasses.replace(f, cost_us_per_step=round(worst, 1), evidence={
                **f.evidence, "rule_estimate_us_per_step": f.cost_us_per_step, "accounted_us_per_step": _r(worst)})
                if f.rule == rid else f for f in findings]
            continue
        out += slice_finding(rid, slices, accounts, ctx)
    out += must_speak(accounts, findings + out, ctx)
    fold_into_late_rank(findings, out)
    return out


OWN_IDLE = ("input_bound", "host_stall", "allocator_churn", "host_sync", "launch_bound")


def fold_into_late_rank(findings: list[Finding], new: list[Finding]) -> None:
    """One cause, one finding: when ``late_rank`` names rank L and an idle-slice finding names L alone (the other
    ranks do not idle for that reason), that slice is why L is late -- it becomes late_rank's evidence
    (``own_idle``) and sentence, and is not said again. Slice findings on every rank stay job-level findings."""
    late = next((f for f in findings if f.rule == "late_rank"), None)
    if late is None or len(late.ranks) != 1:
        return
    L = late.ranks[0]
    own = [f for f in findings + new if f.rule in OWN_IDLE and f.ranks == (L,)]
    if not own:
        return
    ids = {id(f) for f in own}
    text = "; ".join(f"{f.rule} {f.cost_us_per_step / 1e3:.2f} ms per step" for f in own)
    merged = dataclasses.replace(late, summary=f"{late.summary}; on rank {L} itself the GPU idled for its own "
                                               f"reasons ({text}): fix those and the others stop waiting",
                                 evidence={**late.evidence, "own_idle": {f.rule: f.evidence for f in own}})
    findings[:] = [merged if f is late else f for f in findings if id(f) not in ids]
    new[:] = [f for f in new if id(f) not in ids]


def must_speak(accounts: list[tuple[int, Account]], findings: list[Finding], ctx) -> list[Finding]:
    """The guard behind every all-clear: a rank whose GPU idles >= :data:`MUST_SPEAK` of its step while no
    finding at or above 'low' names it gets one for its largest idle slice, at that slice's full cost."""
    from ..accounting import IDLE
    from ..model import severity

    named = {rk for f in findings if severity(f.cost_us_per_step, ctx.step_us) != "info" for rk in f.ranks}
    out = []
    for rk, a in accounts:
        idle = sum(a.share(s) for s in IDLE)
        if rk in named or idle < MUST_SPEAK:
            continue
        s = max(IDLE, key=a.share)
        rid = SLICE_RULE[s]
        f = slice_finding(rid, (s,), [(rk, a)], ctx, whole=True)
        if not f:
            continue
        cost = max(a.cost(s), LOW * (a.step_us or a.window_us))
        out.append(dataclasses.replace(f[0], cost_us_per_step=round(cost, 1), evidence={
            **f[0].evidence, "note": f"GPU idle {100 * idle:.0f}% of the step: said although no rule found a "
                                      f"cause above 'low'"}))
    return out


for _rid, _title in (("input_bound", "the GPU waits for the DataLoader"),
                     ("host_stall", "the GPU waits while the host runs work that issues nothing"),
                     ("allocator_churn", "the GPU waits for the caching allocator's device calls"),
                     ("queued_idle", "the GPU idles with work already issued"),
                     ("unexplained_idle", "GPU idle time the trace cannot attribute")):
    rule(Rule(id=_rid, title=_title, extract=_extract(_rid), judge=_judge(_rid), cause=TEXT[_rid]["cause"],
              fix=TEXT[_rid]["fix"], caveats=TEXT[_rid].get("caveats", ""), notebook=TEXT[_rid].get("notebook")))
