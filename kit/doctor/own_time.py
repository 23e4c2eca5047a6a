"""Whether one rank's own time per step -- what it spends on its own, not waiting for a peer -- exceeds every
other rank's by more than ranks running the same code differ (:func:`own_excess`). Read by ``late_rank`` before it
names a rank and by the reconcile stage's job-level launch-bound verdict (:func:`kit.doctor.reconcile.
job_level_launch`).

Per rank, from the host model's per-step frame (:data:`kit.doctor.host_model.PER_STEP`, one row per step window,
shipped as ``JobContext.host_steps``): its own host time, :data:`OWN_HOST`, and its own GPU time,
:data:`OWN_GPU` (or the compute kernels' time the caller measured). The rank is late by its host or its GPU,
whichever exceeds the others' more: by more than the others' spread (the range of their medians plus their largest
step-to-step p10-p90 spread), :data:`MIN_OWN_EXCESS_SHARE` of the step and :data:`PROFILER_NOISE` of the profiler's
overhead on its step. Host time is compared less the tracer's cost in each rank's Python off its ops (:data:`TRACER`, the
low end of its price), and the floor leaves that cost out (it is the rank's own, not the profiler's uneven slowing). The excess is what the job would gain were the rank as fast as the next slowest.
"""

from __future__ import annotations

from .overhead import TRACER_TAKEN, tracer_taken  # noqa: F401  (TRACER_TAKEN: read here by name)

OWN_HOST = "own_host_us"
"""a rank's own host time per step (:data:`kit.doctor.host_model.OWN_KINDS` inside its step annotation): waiting
for its DataLoader, stalling, the allocator's device calls, issuing its work. Read on the host's side of the step,
not its window extended to the GPU work: a rank that waits runs ahead of its GPU, its host done with the step
before the window's GPU part"""
DATA_WAIT = "own_data_wait_us"
"""the part of :data:`OWN_HOST` a rank's main thread spent waiting for its DataLoader (read by the reconcile stage's
job-level input verdict, :func:`kit.doctor.reconcile.job_level_input`)"""
QUIET = "own_quiet_us"
"""the part of a rank's own host time, outside collective calls and waits for data or the GPU, in stretches of 1 ms or
more in which no recorded CPU event (the short ops the default frame drops included) began or ended on any of its
threads (:data:`kit.doctor.host_model.PER_STEP`): the host idle or descheduled (CPU contention takes the core in
slices of milliseconds), not the profiler's, paid at the events it records. A host excess under the profiler's floor
(:data:`PROFILER_NOISE`) but above every other rank's is the rank's own where its quiet excess clears
:func:`quiet_excess`'s floor; the excess is then the larger of the two (``by``: ``quiet``). A confirmed quiet excess
also takes a host excess on one step out of doubt (``in_doubt``)"""
STALL_LONGEST = "own_stall_longest_us"
"""the longest of a rank's stall stretches in a step (:data:`kit.doctor.host_model.PER_STEP`: no issuing call, no
recorded op): one stretch holds a stall's time, a contended core's is spread over many (:mod:`kit.doctor.contended`)"""
QUIET_IN_OPS = "own_quiet_in_ops_us"
"""the part of a rank's quiet time inside a recorded op or runtime call (:data:`kit.doctor.host_model.PER_STEP`): the
core taken away inside the framework's own code, which a stall in the user's code between ops is not
(:mod:`kit.doctor.contended`)"""
TRACER = "own_tracer_us"
"""the tracer's price of the rank's Python frames off its ops on its main thread, per step
(:attr:`kit.doctor.overhead.ProfilerOverhead.off_ops_steps`, at its own host's speed; set beside the host model's
columns by :mod:`kit.doctor.rank_phase`; absent, or 0, without stacks): the tracer's cost of one rank's pure-Python
work is that rank's, not the profiler's uneven slowing of equal hosts that :data:`PROFILER_NOISE` allows for, so
:func:`own_host` takes it off the rank's own time (:data:`TRACER_TAKEN` of it)"""
TRACER_IN_WAIT = "own_tracer_in_wait_us"
"""the part of :data:`TRACER` inside the main thread's DataLoader waits (:data:`DATA_WAIT`); the rest lies in its
stalls (a stretch of Python off the ops is a stretch without an op or a launch)"""
OWN_GPU = "gpu_compute_us"
"""a rank's own GPU time: busy outside the collectives"""
MIN_OWN_EXCESS_SHARE = 0.05
"""a late rank's own excess must reach this share of the step"""
MIN_QUIET_SHARE = 0.10
"""... and its quiet excess (:data:`QUIET`, no profiler floor) this share: above the committed multi-GPU controls' and
under the contended runs' (the readings: FINDINGS.md, "A CPU-contended rank")"""
PROFILER_NOISE = 1.0
"""... and, for an excess of host time, this share of the profiler's own overhead on the late rank's step
(:mod:`kit.doctor.overhead`): the profiler slows every rank's host, unevenly, by less than its overhead where the
ranks run the same host code, a planted host stall by more (evidence: FINDINGS.md, "kit doctor's thresholds against
the recorded runs"). GPU time is not the profiler's: no such floor. The callers pass the overhead priced at the
job's host speed (:func:`at_job_speed`), so that a host slower for its own reasons does not raise its own floor"""


def at_job_speed(overhead: dict | None) -> dict | None:
    """Every rank's profiler overhead (rank -> :class:`kit.doctor.overhead.ProfilerOverhead`) priced at the job's host
    speed, for comparing ranks: an estimate priced by the rank's own kernel-launch length (``launch_us``) is scaled by
    the job's reading over the rank's (its host time, exposed part and overhead: linear in the per-op price), and the
    caller paces the job again (:func:`kit.doctor.overhead.job_floor`). A measured overhead (traced less unprofiled
    step) and a table's price stay as they are. Why: a really slower host (contention, NUMA, throttling) launches more
    slowly too, so its own reading prices its ops higher -- right for netting its own step, wrong for comparing ranks,
    where the overhead is the allowance for the profiler slowing *equal* hosts unevenly (:data:`PROFILER_NOISE`):
    read at the slow host's speed, the straggler excuses itself. The job's reading is the median launch length (with
    two ranks their mean: a slowed rank still raises it by half its excess, a stated limit). As given where no rank
    has a launch reading."""
    import statistics
    from dataclasses import replace

    if not overhead:
        return overhead
    reads = [o.launch_us for o in overhead.values() if o is not None and getattr(o, "launch_us", None)]
    if not reads:
        return overhead
    job = statistics.median(reads)
    out = {}
    for r, o in overhead.items():
        if o is None or o.basis != "estimated" or not getattr(o, "launch_us", None):
            out[r] = o
            continue
        k = job / o.launch_us
        over = o.overhead_us * k
        out[r] = replace(o, host_us=None if o.host_us is None else o.host_us * k,
                         exposed_us=None if o.exposed_us is None else o.exposed_us * k, overhead_us=over,
                         off_ops_us=float(getattr(o, "off_ops_us", 0.0) or 0.0) * k,
                         off_ops_exposed_us=float(getattr(o, "off_ops_exposed_us", 0.0) or 0.0) * k,
                         unprofiled_step_us=None if o.traced_step_us is None else o.traced_step_us - over)
    return out


def steady(host_steps: dict) -> dict:
    """Per rank with a host model, keyed by int rank, its per-step frame (``JobContext.host_steps``) over the steps
    that :func:`own_excess` and :func:`own_reason` read: the step windows (``step >= 0``) where there are any, else
    the one traced span. Idempotent: either function takes its result in place of ``host_steps``, so a caller asking
    both derives it once."""
    return {int(r): ps[ps["step"] >= 0] if (ps["step"] >= 0).any() else ps for r, ps in host_steps.items()
            if ps is not None and not ps.empty}


def own_excess(host_steps: dict, late: int, step_us: float | None, gpu_us: dict | None = None,
               overhead=None, kinds: tuple[str, ...] = ("host", "gpu"), whole: bool = False) -> dict | None:
    """Does rank ``late`` have time of its own -- :data:`OWN_HOST`, or GPU compute (``gpu_us``: rank -> its compute
    kernels' time per step, overlapping a collective or not; else :data:`OWN_GPU`) -- beyond every other rank's by more
    than their spread, :data:`MIN_OWN_EXCESS_SHARE` of the step and (host) :data:`PROFILER_NOISE` of the profiler's
    overhead on its step (``overhead``: its :class:`kit.doctor.overhead.ProfilerOverhead` or None; less its
    ``off_ops_exposed_us``: the tracer's cost of the rank's own Python, part of which :func:`own_host` takes off its
    time)? ``confirmed``,
    ``excess_us`` (per step, beyond the next slowest), ``kind`` (of ``kinds``), ``by`` (the kind or ``quiet``),
    ``spread_us``, per rank the medians, ``in_doubt``: a host excess on one step that an estimated overhead could
    still be, within :data:`kit.doctor.overhead.ESTIMATE_RANGE`, and no confirmed quiet excess (the caller weighs it),
    and ``quiet`` where every rank has its quiet time: the late rank's quiet excess, the others' spread, the floor it
    must clear (as :func:`quiet_excess`) and whether it does. None without every rank's host steps. ``whole``: the
    tracer's price of each rank's Python off its ops taken whole (:func:`own_host`), the other end of its range."""
    # the profiler's overhead on the step less the part of it in the rank's Python off the ops (the part that
    # lengthened the step): that is the rank's own cost, not the uneven slowing of equal hosts PROFILER_NOISE allows for
    overhead_us = max(0.0, overhead.overhead_us - float(getattr(overhead, "off_ops_exposed_us", 0.0) or 0.0)) \
        if overhead is not None else 0.0
    estimated = overhead is not None and overhead.basis == "estimated"
    have = steady(host_steps)
    if late not in have or len(have) < 2:
        return None
    per = {}
    for r, ps in have.items():
        gpu = ps[OWN_GPU] if not (gpu_us and gpu_us.get(r) is not None) else [float(gpu_us[r])]
        st = {**_stats("host", own_host(ps, whole)), **_stats("gpu", gpu)}
        per[r] = {k: st[k] for k in ("host_us", "gpu_us", "host_spread_us", "gpu_spread_us")}
        if QUIET in ps:
            per[r].update(_stats("quiet", ps[QUIET]))
        for col in (STALL_LONGEST, QUIET_IN_OPS):
            if col in ps:
                per[r][col] = _stats("s", ps[col])["s_us"]
    out = {kind: _beyond(per, late, kind) for kind in kinds}
    step = _step(have, step_us)
    floors = {k: max(out[k][1], MIN_OWN_EXCESS_SHARE * step, PROFILER_NOISE * overhead_us if k == "host" else 0.0)
              for k in out}
    quiet = None
    if "host" in out and all("quiet_us" in p for p in per.values()):
        q, q_spread = _beyond(per, late, "quiet")
        q_floor = max(q_spread, MIN_QUIET_SHARE * step)
        quiet = {"excess_us": round(q, 1), "spread_us": round(q_spread, 1), "floor_us": round(q_floor, 1),
                 "confirmed": bool(q > q_floor)}
    by = "host"
    if quiet is not None and 0 < out["host"][0] <= floors["host"] and quiet["confirmed"]:
        # the host's quiet time: no profiler floor (QUIET)
        out["host"], floors["host"], by = (max(out["host"][0], q), q_spread), q_floor, "quiet"
    kind = max(out, key=lambda k: out[k][0] - floors[k])
    (excess, spread), floor = out[kind], floors[kind]
    from .overhead import ESTIMATE_RANGE

    one_step = max(len(ps) for ps in have.values()) < 2
    doubt = (excess > floor and kind == "host" and estimated and one_step and not (quiet and quiet["confirmed"])
             and excess <= ESTIMATE_RANGE * PROFILER_NOISE * overhead_us)
    got = {"confirmed": bool(excess > floor), "in_doubt": bool(doubt), "excess_us": round(excess, 1), "kind": kind,
           "by": by if kind == "host" else kind, "spread_us": round(spread, 1), "floor_us": round(floor, 1),
           "per_rank": {str(r): {k: round(v, 1) for k, v in p.items()} for r, p in sorted(per.items())}}
    if quiet is not None:
        got["quiet"] = quiet
    return got


def own_host(ps, whole: bool = False):
    """A rank's own host time per step (:data:`OWN_HOST`) less the tracer's in its Python off the ops
    (:data:`TRACER_TAKEN` of :data:`TRACER`, where the frame has it; ``whole``: all of it), at least 0."""
    return (ps[OWN_HOST] - tracer_taken(ps[TRACER], whole)).clip(lower=0.0) if TRACER in ps else ps[OWN_HOST]


def own_host_net(ps, o, with_step: bool = False) -> float:
    """A rank's own host time per step net of the profiler (``ps``: its per-step frame; ``o``: its
    :class:`kit.doctor.overhead.ProfilerOverhead` or None): the median of :data:`OWN_HOST` as traced (not less
    :data:`TRACER`) less its recorded events' price (``host_us``, which holds the tracer's price of its Python off
    the ops, :attr:`kit.doctor.overhead.ProfilerOverhead.off_ops_us`, here at its low end:
    :func:`kit.doctor.overhead.tracer_taken`), so the tracer is netted once; ``with_step``:
    less the larger of that and the profiler's overhead on its step (a measured overhead is the job's: a rank whose
    host sets no pace can show more of it than its events' price -- the reading ``late_rank.others_host`` bounds a
    step with)."""
    import numpy as np

    on = 0.0 if o is None else float(getattr(o, "host_us", None) or 0.0)
    off = 0.0 if o is None else float(getattr(o, "off_ops_us", None) or 0.0)
    on -= off - tracer_taken(off)  # the tracer's price of its Python off the ops at its low end, as own time takes it
    if with_step and o is not None:
        on = max(on, float(o.overhead_us or 0.0))
    return float(np.median(ps[OWN_HOST])) - on


def quiet_excess(host_steps: dict, late: int, step_us: float | None = None) -> tuple[float, float, float] | None:
    """Rank ``late``'s quiet time per step (:data:`QUIET`, median over :func:`steady`'s steps) beyond every other
    rank's, the others' spread (the range of their medians plus their largest p10-p90 spread) and the floor it must
    clear to confirm an excess: the larger of that spread and :data:`MIN_QUIET_SHARE` of the step (``step_us``, else
    the ranks' median step), as :func:`own_excess` reads it. None unless every rank, two or more, has its quiet
    time."""
    have = steady(host_steps)
    if late not in have or len(have) < 2 or not all(QUIET in ps for ps in have.values()):
        return None
    excess, spread = _beyond({r: _stats("quiet", ps[QUIET]) for r, ps in have.items()}, late, "quiet")
    return excess, spread, max(spread, MIN_QUIET_SHARE * _step(have, step_us))


def _stats(kind: str, values) -> dict:
    """``{kind}_us``: the median of a rank's per-step ``values``, ``{kind}_spread_us``: their p10-p90 range."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    return {f"{kind}_us": float(np.median(v)), f"{kind}_spread_us": float(np.ptp(np.percentile(v, [10, 90])))}


def _beyond(per: dict, late: int, kind: str) -> tuple[float, float]:
    """Rank ``late``'s ``kind`` (:func:`_stats`) beyond the slowest other rank's, and the others' spread: the range
    of their medians plus their largest p10-p90 range."""
    vals = [p[f"{kind}_us"] for r, p in per.items() if r != late]
    wide = max(p[f"{kind}_spread_us"] for r, p in per.items() if r != late)
    return per[late][f"{kind}_us"] - max(vals), max(vals) - min(vals) + wide


def _step(have: dict, step_us: float | None) -> float:
    """``step_us``, else the ranks' median step."""
    import statistics

    return step_us or float(statistics.median(ps["dur"].median() for ps in have.values()))


def _net_parts(ps):
    """A rank's per-step frame with :data:`OWN_HOST`, :data:`DATA_WAIT` and its stall net of the tracer's price of
    its Python off the ops, as :func:`own_host` takes it: the part inside the DataLoader waits off those, the rest off
    its stalls."""
    if TRACER not in ps:
        return ps
    wait = tracer_taken(ps[TRACER_IN_WAIT] if TRACER_IN_WAIT in ps else 0.0)
    rest = tracer_taken(ps[TRACER]) - wait
    return ps.assign(**{OWN_HOST: own_host(ps), DATA_WAIT: (ps[DATA_WAIT] - wait).clip(lower=0.0),
                        "own_stall_us": (ps["own_stall_us"] - rest).clip(lower=0.0)})


OWN_REASONS = {"own_stall_us": "host_stall", DATA_WAIT: "data_wait", "own_issue_us": "host_busy"}
"""the parts of a rank's own host time (:data:`OWN_HOST`, on its basis: inside the step annotation; the host model's
:data:`kit.doctor.host_model.PER_STEP`; ``own_issue_us``: the rest of it, issuing and the allocator), by the reason
``late_rank`` names (:data:`kit.doctor.rules.late_arrival.REASONS`)"""


def own_reason(host_steps: dict, late: int, excess_us: float, share: float) -> tuple[str, float] | None:
    """Which of rank ``late``'s own host kinds (:data:`OWN_REASONS`) holds at least ``share`` of its own excess
    (``excess_us``, :func:`own_excess`): its median per step beyond the largest other rank's, over the same steps
    (:func:`steady`). Returns (reason, that excess per step) or None."""
    import numpy as np

    parts = {r: _net_parts(ps).assign(own_issue_us=lambda x: x[OWN_HOST] - x["own_stall_us"] - x[DATA_WAIT])
             for r, ps in steady(host_steps).items()}
    med = {r: {c: float(np.median(ps[c])) for c in OWN_REASONS} for r, ps in parts.items()}
    if late not in med or len(med) < 2 or excess_us <= 0:
        return None
    more = {c: med[late][c] - max(m[c] for r, m in med.items() if r != late) for c in OWN_REASONS}
    c = max(more, key=more.get)
    return (OWN_REASONS[c], round(more[c], 1)) if more[c] >= share * excess_us else None
