"""What a CPU-contended rank costs its job without the profiler (:func:`contended_gain`): the cost model of a rank
whose host loses its core to other work (another process on its cores, a busy loop sharing them), read by
``late_rank`` where it names a rank for its host and that rank's quiet time confirms the contention
(:data:`kit.doctor.own_time.QUIET`; ``own_excess``'s ``quiet``).

A contended host runs everything it does more slowly by one factor: the core is taken away from it for a share
``q`` of its time, so each microsecond of its own work takes ``1 / (1 - q)`` -- its ops and the profiler's own
time on them alike (the profiler's per-op cost is paid on the same core). The trace shows ``q``: the rank's quiet
time beyond every other rank's over its own host time, summed over the traced steps (quiet: no event begins or ends
on any of its threads for 1 ms or more -- the core was elsewhere; :func:`quiet_share`). The same code's host time without the profiler is the other ranks' traced own
host time less the profiler's own time on their ops (:attr:`kit.doctor.overhead.ProfilerOverhead.host_us`, the
estimate already made for each rank); the slowest of them sets the job's pace were the contended rank as fast. The
contended rank's host then takes that times the stretch, and the job's step is the larger of its host and the
step's GPU-bound time (the most GPU work of its own any rank does per step, :func:`kit.doctor.overhead.own_work`):
the job gains ``max(U_late, G) - max(U, G)`` -- little where the GPU hides the host (a CNN), the whole stretch of
the host's work where the host sets the pace (an eager transformer).

Why not the traced excess: it holds the contended host's share of the profiler's own time (stretched too). Why not
kit.capture's measured host times where they exist: each rank's drained step of a synchronous job holds its waits
for the contended rank at the collectives (FSDP's all-gathers block the host; DDP's drained step waits for the
all-reduce), so the other ranks' measured host is not their own work and the measured excess is low (FINDINGS.md,
"A CPU-contended rank"); it stays in the evidence."""

from __future__ import annotations

from .own_time import OWN_HOST, QUIET, QUIET_IN_OPS, STALL_LONGEST, own_host_net

QUIET_IN_NODES = "own_quiet_in_nodes_us"
"""the part of a rank's quiet time inside autograd's node evaluations alone (:data:`kit.doctor.host_model.PER_STEP`):
where the user's backward hooks run (a full backward hook, a post-accumulate-grad hook: an optimizer in the backward,
gradient logging), so a hook's stall lies there as the core taken away does -- the trace does not tell them apart"""


def quiet_share(host_steps: dict, late: int) -> float | None:
    """Rank ``late``'s quiet share of its own host time over every traced step the ranks share: the sum of its quiet
    time (:data:`kit.doctor.own_time.QUIET`) less, step by step, the largest other rank's, over the sum of its own host
    time (:data:`kit.doctor.own_time.OWN_HOST`); ``host_steps``: :func:`kit.doctor.own_time.steady`'s frames. A ratio of
    sums, not of medians: a contended core is taken in whole scheduler ticks, a step holds a few of them, and the median
    step keeps one step's draw of them (FINDINGS.md, "A CPU-contended rank"). None where the ranks share no step or
    lack the readings."""
    import pandas as pd

    mine = host_steps.get(late)
    if mine is None or mine.empty or QUIET not in mine or OWN_HOST not in mine:
        return None
    others = [ps.drop_duplicates("step").set_index("step")[QUIET] for r, ps in host_steps.items()
              if r != late and ps is not None and QUIET in ps]
    if not others:
        return None
    m = mine.drop_duplicates("step").set_index("step")
    theirs = pd.concat(others, axis=1).dropna().max(axis=1)
    steps = m.index.intersection(theirs.index)
    host = float(m.loc[steps, OWN_HOST].sum())
    if not len(steps) or host <= 0:
        return None
    return (float(m.loc[steps, QUIET].sum()) - float(theirs.loc[steps].sum())) / host


def _beyond_others(host_steps: dict | None, late: int, col: str) -> float:
    """Rank ``late``'s median per step of ``col`` less the largest other rank's (0 without the readings)."""
    med = {r: float(ps[col].median()) for r, ps in (host_steps or {}).items()
           if ps is not None and col in ps and len(ps)}
    if late not in med:
        return 0.0
    return med[late] - max((v for r, v in med.items() if r != late), default=0.0)


def shows_lost_core(own: dict | None, late: int, host_steps: dict | None = None) -> bool:
    """Does rank ``late``'s quiet time show its core taken away (the readings :func:`contended_gain` applies its model
    on, its docstring): ``own`` (:func:`kit.doctor.own_time.own_excess`'s result) has its quiet excess confirmed, and
    that excess clears its floor without the rank's longest stall stretch
    (:data:`kit.doctor.own_time.STALL_LONGEST`), with its quiet inside the framework's ops beyond every other rank's
    (:data:`kit.doctor.own_time.QUIET_IN_OPS`), and without its quiet inside autograd's nodes beyond the others'
    (:data:`QUIET_IN_NODES`, from ``host_steps``). False where a reading is missing (one rank, a CPU-only job)."""
    quiet = own.get("quiet") if own else None
    per = own.get("per_rank") if own else None
    if not quiet or not quiet.get("confirmed") or not per or str(late) not in per:
        return False
    mine = per[str(late)]
    if quiet["excess_us"] - mine.get(STALL_LONGEST, 0.0) <= quiet["floor_us"]:
        return False  # without its longest stall the quiet excess is not confirmed: a stall, not a contended core
    ops = mine.get(QUIET_IN_OPS, 0.0) - max((p.get(QUIET_IN_OPS, 0.0) for r, p in per.items() if r != str(late)),
                                            default=0.0)
    if ops <= quiet["floor_us"]:
        return False  # no quiet inside the framework's ops beyond the others': between ops, a stall's
    if quiet["excess_us"] - _beyond_others(host_steps, late, QUIET_IN_NODES) <= quiet["floor_us"]:
        return False  # the quiet excess lies where backward hooks run: a hook's stall as likely as a lost core
    return True


def lost_cores(host_steps: dict | None, step_us: float | None) -> tuple[int, ...]:
    """The ranks whose quiet time shows their core taken away (:func:`shows_lost_core` on
    :func:`kit.doctor.own_time.own_excess`'s quiet reading, which needs no GPU or overhead reading): the ranks whose
    stall time the host model's one-stall split (:data:`kit.doctor.host_model.ONE_STALL`) applies to -- each step's
    longest stretch a stall, the other stretches a core's slices (issuing done more slowly). Elsewhere every stretch
    stays a stall."""
    from .own_time import own_excess, steady

    if not host_steps or len(host_steps) < 2:
        return ()
    hs = steady(host_steps)
    return tuple(r for r in sorted(hs) if shows_lost_core(own_excess(hs, r, step_us, kinds=("host",)), r, hs))


def contended_gain(own: dict, late: int, overhead: dict | None, own_work: dict,
                   host_steps: dict | None = None) -> dict | None:
    """The model (module docstring) for rank ``late``: ``own`` is :func:`kit.doctor.own_time.own_excess`'s result
    (its per-rank medians of own host and quiet time, its ``quiet`` excess, which must be confirmed), ``overhead``
    rank -> :class:`kit.doctor.overhead.ProfilerOverhead` (each rank's own, for netting its own host), ``own_work``
    rank -> GPU work of its own per step (:func:`kit.doctor.overhead.own_work`), ``host_steps`` the ranks' steady
    per-step frames (``q`` from them, :func:`quiet_share`; without them the medians' quiet excess over the median own
    host). Returns the gain per step and the
    readings (``q``, ``stretch``, per other rank its host net of the profiler, ``U``, ``U_late``, ``G``), or None
    where the quiet excess is not confirmed, is one stall, or a reading is missing.

    One stall or a contended core: a contended core takes the rank's time in slices with the rank's work between them,
    a stall (a sleep, a long Python loop, however many short ops or single launches it holds) is one stretch with next
    to no work in it. The model applies only where the quiet excess less the rank's longest stall stretch
    (:data:`kit.doctor.own_time.STALL_LONGEST`, median per step) still clears the floor that confirmed it
    (``own_excess``'s ``quiet``): the contention must show beyond its one longest stretch; and where its quiet time
    inside the framework's ops and runtime calls (:data:`kit.doctor.own_time.QUIET_IN_OPS`, median per step) beyond
    every other rank's clears that floor too: the scheduler takes the core wherever the thread is, inside an op as
    between ops, while a stall -- in however many pieces, with work between them -- is the user's code between ops.
    And where the quiet excess less the rank's quiet inside autograd's node evaluations beyond the others'
    (:data:`QUIET_IN_NODES`, median per step) still clears the floor: the user's backward hooks run there, between the
    node's recorded ops, so a stall split over hooks (per-module hooks that sleep, log or compute on the CPU) is quiet
    inside "ops" in as many pieces as it has hooks; the scheduler takes a core elsewhere too.
    Elsewhere the rank's own excess is its cost (the readings: FINDINGS.md, "A CPU-contended rank"). Not the stall
    time beyond the others': a contended core's slices between launches are stall time too (as much as its quiet
    excess, or more)."""
    if not shows_lost_core(own, late, host_steps):
        return None
    per = own["per_rank"]
    mine = per[str(late)]
    if not mine.get("host_us"):
        return None
    quiet = own["quiet"]
    q = quiet_share(host_steps, late) if host_steps else None
    if q is None:
        q = quiet["excess_us"] / mine["host_us"]
    if not 0 < q < 1:
        return None
    net = {}
    for r, p in per.items():
        if r == str(late):
            continue
        o = (overhead or {}).get(int(r))
        if o is None or o.host_us is None:
            return None
        ps = (host_steps or {}).get(int(r))  # as traced: the tracer netted once, in its events' price (own_host_net)
        net[r] = max(0.0, own_host_net(ps, o) if ps is not None and OWN_HOST in ps else p["host_us"] - o.host_us)
    u = max(net.values())
    stretch = 1.0 / (1.0 - q)
    u_late = stretch * u
    g = max(own_work.values(), default=0.0)
    gain = max(u_late, g) - max(u, g)
    return {"gain_us": round(gain, 1), "quiet_share": round(q, 3), "stretch": round(stretch, 3),
            "others_host_net_us": {r: round(v, 1) for r, v in sorted(net.items())}, "host_us": round(u, 1),
            "late_host_us": round(u_late, 1), "gpu_bound_us": round(g, 1)}
