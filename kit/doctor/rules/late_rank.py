"""``late_rank``: the rank every other rank waits for at the collectives, what it cost the others (their waiting
beyond the next-latest arrival that no compute hid) and, when the rank's own excess over its peers explains it,
what the rank was doing (:mod:`.late_arrival`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..collectives import Timeline, per_step_divisor, timeline
from ..findings import make, moment, moment_text
from ..model import RULES, Finding, RankView, Rule, Skip, rule
from ..contended import contended_gain
from ..overhead import own_work
from ..own_time import MIN_OWN_EXCESS_SHARE, own_excess, own_reason, steady
from .evidence import dur_text, excerpt, num
from .late_arrival import attribute, host_time_until
from .same_kernels import KERNEL_TOP, SLOW_GPU, extra_work, gpu_speed, kernel_speeds

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

MIN_LATE, LATE_MIN_US, LATE_STEP_SHARE = 2, 20.0, 0.01
"""late_rank needs the rank to be last at 2+ collective instances by at least 20 us, 5% of the transfer and 1% of
the step: two ranks running the same step drift apart by less than that (calibration: FINDINGS.md, "kit doctor's
thresholds against the recorded runs"). A trace of one step shows a rank that is late once per step (FSDP: at the
collective after its extra work) late once: there one instance is enough where the rank's own time per step
exceeds every other rank's by more than their spread (:func:`kit.doctor.own_time.own_excess` confirmed, not in
doubt) -- the step's own evidence of what a second step would repeat"""
LATE_PATTERN = 0.10
"""... and materially late at this share of the matched instances or more: a rank late at the first collective
of each step only is a once-per-step hiccup, not a late rank"""
LATE_EXPLAINED = 0.5
"""late_rank names a reason only when the rank's own excess over its peers (host activity, GPU still busy)
explains at least this share of the lateness it added; otherwise it says the lateness is not visible"""
SAME_WORK_REASONS = (None, "host_busy", "host_stall")
"""reasons a rank may be late that ranks running the same code share: issuing the same work more slowly, idle
host gaps (under the profiler mostly its own time between events), nothing visible. With them, late_rank names a
rank only when its own time exceeds the others' (:func:`kit.doctor.own_time.own_excess`); otherwise the slowest
of equal hosts sets the pace and fixing "that rank" would move the waiting to the next one"""
CPU_SAME_WORK_REASONS = (None, "host_busy")
"""... on a CPU-only job (no GPU kernels: the ranks' own time is their own ops): running the same ops more slowly,
or nothing visible. A stall there is a stretch of 1 ms or more with no recorded op at all -- not the profiler's
time between the events it records -- so it is the rank's own (a sleep, Python work), named without the check"""
SLOWED_SHARE = 0.5
"""a late rank whose GPU runs the same kernels slower is said to have a slow GPU (``gpu_slow``) only when that
slowdown accounts for at least this share of its GPU time's excess over the slowest other rank; below it, most of
the excess is work the other ranks do not have (``gpu_busy``). The basis is the majority, not a calibration: the
reason named is the one behind the larger part of the excess, as with :data:`LATE_EXPLAINED`"""
LATE_CHANCE = 0.05
"""a rank whose own time shows no excess (:func:`kit.doctor.own_time.own_excess` not confirmed), or one in doubt
(one step: an excess within an estimated overhead's :data:`kit.doctor.overhead.ESTIMATE_RANGE`, maybe the
profiler's uneven slowing of equal hosts), is named only when it is materially last at more of the collectives than
chance makes likely among equal ranks (each last with chance 1 / ranks), at this one-sided binomial significance
(the conventional 5% level, not a calibration): one delay that the next collectives inherit is one event"""
LATE_DOMINANCE = 2 / 3
"""late_rank names a rank only when the waiting it caused is at least this share of all waiting for late ranks"""


@dataclass(frozen=True)
class Before:
    """``late_rank``'s extract: a :class:`~kit.doctor.collectives.Timeline` and, per collective row, the rank's
    cumulative host time in each of :data:`kit.doctor.rules.late_arrival.HOST_REASONS` at the row's launch and at its end
    (:func:`kit.doctor.rules.late_arrival.host_time_until`)."""

    tl: Timeline
    cum: "pd.DataFrame"
    """same index as ``tl.rows``: ``<activity>@launch`` and ``<activity>@end`` (us since the trace began)"""
    kernels: "pd.DataFrame | None" = None
    """the rank's heaviest compute kernels (:data:`~kit.doctor.rules.same_kernels.KERNEL_TOP` by total time): per
    name ``median_us`` and ``total_us`` (:func:`~kit.doctor.rules.same_kernels.kernel_speeds`) -- to tell a slower
    GPU from more work"""
    waits_us: float | None = None
    """per step (median over the step annotations) the time the rank's host waited for its GPU or a peer inside
    the step's own annotation (:func:`step_waits`); None without annotations"""


def step_waits(view: RankView) -> float | None:
    """The median over the rank's step annotations of the time any of its threads waited for the GPU (the host
    model's ``sync``: ``.item()``, a synchronize, a blocking copy) or for a peer (``comm_wait``) inside the
    annotation -- the host's side of the step, the basis of :data:`kit.doctor.own_time.OWN_HOST`: a wait that
    outlasts the step's annotation, as the synchronize that closes a trace does, counts only inside it. None
    without step annotations or a host model."""
    import numpy as np

    from ...traces.intervals import covered, union_np
    from ..host_model import ALL

    st = view.steps
    if view.host is None or st is None or st.empty:
        return None
    (sa, sb), (ca, cb) = view.host.spans("sync", ALL), view.host.spans("comm_wait", ALL)
    ua, ub = union_np(np.r_[sa, ca], np.r_[sb, cb])
    return float(np.median(covered(ua, ub, st["ts"].to_numpy(float), st["end"].to_numpy(float))))


def extract_late(view: RankView) -> Before:
    tl = timeline(view)
    return Before(tl, host_time_until(view, tl), kernel_speeds(view), step_waits(view))


FIX_BY_REASON = {
    "data_wait": ("That rank's input pipeline is the bottleneck: more DataLoader workers, pin_memory=True with "
                  "prefetching (prefetch_factor), faster storage or pre-processed shards on that node."),
    "host_sync": ("Remove the synchronising calls from the step on that rank (.item(), .cpu(), printing or "
                  "logging tensors, torch.cuda.synchronize()); log asynchronously every N steps."),
    "host_stall": ("Find what that rank's host does between steps without launching work (sleep, checkpointing, "
                  "logging, garbage collection, another process on its cores): py-spy dump on that rank."),
    "host_busy": ("That rank's host issues the same work more slowly: check its CPU binding and NUMA node "
                  "(one core per rank near its GPU), CPU frequency and other load on the host; CUDA graphs "
                  "take the per-kernel launch cost off the host."),
    "gpu_busy": ("That rank does more GPU work per step (its extra kernels are in the evidence, extra_kernels): "
                 "balance the work (sequence lengths, experts, pipeline stages) or remove what only that rank "
                 "runs; if the trace shows none, check that GPU for other processes (nvidia-smi) and for throttling "
                 "(nvidia-smi -q -d PERFORMANCE,CLOCK)."),
    "gpu_slow": ("That rank's GPU runs the same kernels more slowly: check its clocks and throttle reasons "
                 "(nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE,POWER) while the job runs; a GPU held at lower "
                 "clocks by power or temperature limits slows every rank of a synchronous job to its pace."),
}
"""late_rank's fix, by what the late rank was doing (:data:`.late_arrival.REASONS`)"""


REASON_TEXT = {"data_wait": "waiting for its DataLoader", "host_sync": "blocked in synchronising calls",
               "host_stall": "on the host without issuing any GPU work", "host_busy": "issuing work more slowly on "
               "the host", "gpu_busy": "with its GPU still busy (longer compute) when it launched the collective"}
"""what the late rank was doing, by reason (a GPU job)"""
REASON_TEXT_CPU = {**REASON_TEXT, "host_stall": "stalled on the host, with no recorded op for 1 ms or more at a time",
                   "host_busy": "running its own ops more slowly"}
"""... on a CPU-only job (no GPU: the main thread runs the work)"""


BASIS_TEXT = {"own_excess": "its own time per step beyond the slowest other rank's; the others' waiting also holds "
                            "the profiler's uneven slowing of the hosts",
              "measured_host": "its host time per step beyond the slowest other rank's, as kit.capture measured every "
                               "rank's host without the profiler",
              "others_host": "its GPU's excess over the others' is larger, but each other rank's step is at least its "
                             "own host time: their step less that, net of the profiler",
              "reason_excess": "the lateness its reason added beyond the other ranks' same activity; the others' "
                               "waiting also holds the profiler's uneven slowing of the hosts",
              "contended_host": "its host contended: its core was elsewhere for {q:.0f}% of its host time, stretches "
                                "with no recorded event, so the {u} the others' hosts take per step without the "
                                "profiler take it {ul}, against {g} of GPU work of its own per step"}
"""how late_rank's cost was read, when it is not the others' waiting"""
OTHERS_HOST_TEXT = {"measured": "; their host time as kit.capture measured it without the profiler",
                    "measured_less_waits": "; their host time as kit.capture measured it without the profiler, less "
                                           "what their traced steps waited for the GPU or a peer",
                    "estimated": "; their host time estimated as the traced less the profiler's, a lower bound where "
                                 "the host paid more per recorded op than the estimate's price"}
"""which basis the others' host time had (:func:`host_room`)"""


def _extra_text(late: int, summaries: list, ev: dict) -> str:
    """The late rank's extra kernels (:func:`~kit.doctor.rules.same_kernels.extra_work`) into the evidence
    (``extra_kernels``) and a clause for the sentence."""
    extra = extra_work(late, {r: b.kernels for r, b in summaries})
    ev["extra_kernels"] = extra
    if not extra:
        return ""
    return ": " + ", ".join(f"{x['extra_per_step']:.0f} more launches per step of {x['kernel'][:60]} "
                            f"({dur_text(x['extra_us_per_step'])})" for x in extra)


def own_gain(own: dict | None, reason: str | None, excess: dict, n: int) -> tuple[float | None, str]:
    """What the job would gain were the late rank as fast as the others (never more than the others' waiting): its
    own time's confirmed excess over the slowest other rank (:func:`kit.doctor.own_time.own_excess`), else the
    lateness its reason added beyond the others' same activity (``excess``, summed; ``n`` steps), else None (the
    others' waiting, which grows with the profiler's uneven slowing of the hosts). Returns (gain per step, basis)."""
    if own is not None and own.get("confirmed") and own.get("excess_us", 0) > 0:
        return float(own["excess_us"]), "own_excess"
    if reason is not None and excess.get(reason, 0.0) > 0:
        return float(excess[reason]) / n, "reason_excess"
    return None, "others_wait"


TRACER_REASONS = ("data_wait", "host_sync", "host_stall", "host_busy", None)
"""the reasons whose lateness is the late rank's host time, where the tracer's cost in its Python off the ops
(:data:`kit.doctor.own_time.TRACER`) lies: a cost read off the collectives for them is taken net of that cost"""


def tracer_excess(host_steps: dict | None, late: int, whole: bool = False) -> float:
    """Rank ``late``'s tracer cost in its Python off the ops per step (:data:`kit.doctor.own_time.TRACER`, median
    over :func:`~kit.doctor.own_time.steady`'s steps) beyond the other ranks' median of theirs, at its low end
(:func:`kit.doctor.overhead.tracer_taken`, as own time takes it; ``whole``: all of it), at least 0: the part
    of its host time, and of the lateness read at the collectives, that is the profiler's on that rank alone (a
    with_stack trace's price of pure-Python work on the training thread). 0 without the column."""
    import numpy as np

    from ..overhead import tracer_taken
    from ..own_time import TRACER

    have = {r: ps for r, ps in (host_steps or {}).items() if TRACER in ps}
    if late not in have or len(have) < 2:
        return 0.0
    med = {r: float(np.median(ps[TRACER])) for r, ps in have.items()}
    return max(0.0, tracer_taken(med[late] - float(np.median([v for r, v in med.items() if r != late])), whole))


def tracer_range(cost: float, own: dict | None, basis: str, tracer: float, traced_gain: float, o, whole_excess,
                 host_steps: dict | None, late: int) -> dict | None:
    """Where the late rank's ``cost`` holds the tracer's price of its Python off the ops at its low end (``basis``
    own_excess of host time: :func:`kit.doctor.own_time.own_excess`; or the collectives' reading less ``tracer``,
    :func:`tracer_excess`) and is more than the one point cap allows (``o``'s
    :attr:`~kit.doctor.overhead.ProfilerOverhead.point_cap_us`, as the step accounting's slices read it: its step
    without the profiler at the overhead's point value less its GPU work): ``cost_us``, the largest cost in the
    price's range the point value does not contradict (:func:`kit.doctor.overhead.within_point`), with both ends
    (``whole_excess``: a callable giving own_excess with the price whole), that bound and whether the cost is it
    (``at_point_cap``: a maximum, said as one). None elsewhere."""
    from ..overhead import within_point

    point = None if o is None or o.basis not in ("measured", "estimated") else o.point_cap_us
    if point is None or cost <= point:
        return None
    if basis == "own_excess" and own is not None and own.get("kind") == "host":
        w = whole_excess()
        other = None if w is None else w["excess_us"]
    elif tracer > 0:
        other = traced_gain - tracer_excess(host_steps, late, whole=True)
    else:
        return None
    if other is None or other >= cost:
        return None
    other = max(0.0, other)
    got = within_point(cost, other, point)
    return {"cost_us": num(got), "cost_at_low_end_us": num(cost), "cost_at_whole_price_us": num(other),
            "point_step_us": num(o.unprofiled_step_us), "point_cap_us": num(point),
            "own_gpu_work_us": num(o.own_work_us or 0.0), "at_point_cap": bool(num(got) >= num(point))}


def step_bound(o, late: int, work: dict) -> dict | None:
    """The most any late rank can cost the job per step net of the profiler: the late rank's step without it less
    the GPU work it would still do were it as fast as the others -- its own GPU work
    (:func:`kit.doctor.overhead.own_work`, ``work``: rank -> us per step), at most the other ranks' most (a rank late
    for more GPU work keeps the others' share of it). The step without the profiler: the longest it can be
    (:attr:`kit.doctor.overhead.ProfilerOverhead.unprofiled_high_us` of ``o``, the rank's overhead: kit.capture's
    measured step, or an estimate's at the low end of its range -- a bound from above must survive the estimate's
    error). None where the rank has neither, or no GPU work is known."""
    if o is None or o.basis not in ("measured", "estimated") or late not in work:
        return None
    step = o.unprofiled_high_us
    if step is None:
        return None
    others = [v for r, v in work.items() if r != late]
    gpu = min(work[late], max(others)) if others else work[late]
    return {"unprofiled_step_us": num(step), "basis": o.basis, "own_gpu_work_us": num(gpu),
            "cap_us": num(max(0.0, step - gpu))}


def unprofiled_host_us(capture: dict | None) -> float | None:
    """The median of the host times :mod:`kit.capture` measured per step without the profiler on this rank
    (``kitCapture.unprofiled_host_us``: one ``step()`` call to the next, the GPU drained before it, waits included);
    None where the trace has none."""
    import statistics

    xs = _host_samples(capture)
    return statistics.median(xs) if xs else None


def _host_samples(capture: dict | None) -> list[float]:
    """kit.capture's ``unprofiled_host_us`` samples of one rank (none where the trace has none)."""
    return [float(x) for x in (capture or {}).get("unprofiled_host_us") or [] if x is not None]


def measured_excess(capture: dict | None, late: int, step_us: float | None = None) -> tuple[float, bool] | None:
    """Rank ``late``'s measured host time per step (:func:`unprofiled_host_us`) beyond the slowest other rank's, at
    least 0, and whether that is confirmed; None unless every rank has it. It is low for any late rank, as every other
    rank's drained step holds its waits for the late one at the collectives (FSDP's all-gathers block its host; DDP's
    drained step waits for the all-reduce; FINDINGS.md, "A CPU-contended rank"): a confirmed one bounds only a host
    excess the trace cannot vouch for -- not a contended core (:mod:`kit.doctor.contended`), nor a rank whose quiet
    excess is confirmed (time with no recorded event is not the profiler's: a stall's, a lost core's). Confirmed:
    it and the median over the steps of the late rank's time beyond the slowest other's in that step (paired: a burst
    lengthens the others' drained steps too) both clear :data:`kit.doctor.own_time.MIN_OWN_EXCESS_SHARE` of the step
    and the range of the others' medians."""
    import numpy as np

    xs = {r: _host_samples(c) for r, c in (capture or {}).items()}
    if late not in xs or len(xs) < 2 or not all(xs.values()):
        return None
    med = {r: float(np.median(v)) for r, v in xs.items()}
    others = [r for r in xs if r != late]
    excess = max(0.0, med[late] - max(med[r] for r in others))
    n = min(len(v) for v in xs.values())
    paired = float(np.median([xs[late][i] - max(xs[r][i] for r in others) for i in range(n)]))
    floor = max(MIN_OWN_EXCESS_SHARE * (step_us or 0.0), max(med[r] for r in others) - min(med[r] for r in others))
    return excess, bool(min(excess, paired) > floor)


def others_host(ps, o, measured: float | None, waits: float | None, scale: float = 1.0) -> tuple[float, str, dict]:
    """One other rank's own host time per step without the profiler, for :func:`host_room` (``ps``: its per-step
    frame; ``o``: its :class:`~kit.doctor.overhead.ProfilerOverhead` or None; ``measured``: :func:`unprofiled_host_us`;
    ``waits``: :func:`step_waits`, as traced; ``scale``: its unprofiled over its traced step). Two readings: the
    trace's own host time (:data:`kit.doctor.own_time.OWN_HOST`) less the profiler's on it, at least the larger of
    the overhead on the step and its ops' price (``estimated``); and kit.capture's measured time, which holds any
    wait the step makes (``.item()``; under DDP also for the late rank's all-reduce). With no traced wait the measured
    time is the host's own (``measured``); else less those waits, scaled as the step is (``measured_less_waits``), but
    never below the smaller reading, each an upper bound where the other errs (``estimated`` where that holds). The
    result is continuous in every input. Returns (own host us, basis, the readings for the evidence)."""
    from ..own_time import own_host_net

    traced = own_host_net(ps, o, with_step=True)
    if measured is None:
        return traced, "estimated", {"traced_net_us": round(traced, 1)}
    raw = waits or 0.0
    waits = raw * scale
    low = min(measured, traced)
    net = max(measured - waits, low)
    basis = ("measured" if net >= measured else "measured_less_waits" if measured - waits > low
             else "estimated")
    return net, basis, {"measured_us": round(measured, 1), "traced_waits_us": round(raw, 1),
                        "waits_net_us": round(waits, 1), "traced_net_us": round(traced, 1), "used": basis}


def host_room(host_steps: dict, late: int, overhead: dict | None, capture: dict | None = None,
              waits: dict | None = None) -> tuple[float | None, str, dict]:
    """What the job could gain at most were the GPU-late rank ``late`` as fast as the others, as their hosts allow:
    the least over the others of their step less their own host time (:func:`others_host`; ``waits``: rank ->
    :func:`step_waits`), both net of the profiler, each rank with its own overhead. GPU time against GPU time alone
    overstates the gain where the others' steps are their hosts' (the late rank's extra kernels first fill its GPU's
    idle time). Returns (room, basis of the bounding rank, per other rank the readings): room None where an other
    rank's *estimated* host time exceeds its netted step (overlapping threads, launches queued behind its GPU) or the
    steps are missing; a measured host time at or above the step leaves 0."""
    import numpy as np

    from ..own_time import OWN_HOST

    rooms, seen = {}, {}
    for r, ps in host_steps.items():
        if r == late:
            continue
        o = (overhead or {}).get(r)
        traced = float(np.median(ps["dur"]))
        step = traced - (o.overhead_us if o is not None else 0.0)
        net, basis, seen[str(r)] = others_host(ps, o, unprofiled_host_us((capture or {}).get(r)),
                                               (waits or {}).get(r), step / traced if traced > 0 else 1.0)
        if not float(np.median(ps[OWN_HOST])) or (basis == "estimated" and net > step):
            return None, basis, seen
        rooms[r] = (max(0.0, step - net), basis)
    if not rooms:
        return None, "estimated", seen
    room, basis = min(rooms.values())
    return room, basis, seen


def moments(inst: "pd.DataFrame", waits: "pd.DataFrame", steps: dict, cost_of: dict) -> dict:
    """The ranks of ``cost_of`` (rank -> the others' waiting per step it caused) whose lateness is a moment
    (:func:`kit.doctor.findings.moment` of, per step of ``steps[rank]``, the most any other rank waited for it there
    at the instances it was materially last at: the columns of ``waits``), with ``us_per_step`` (its ``cost_of``)."""
    out = {}
    for rank, per in cost_of.items():
        g = inst[inst["material"] & (inst["rank"] == rank)]
        if g.empty or g["step"].isna().any():
            continue
        cols = [r for r in waits.columns if int(r) != int(rank)]
        by = {int(k): max((float(x[r].sum()) for r in cols), default=0.0) for k, x in g.groupby("step")}
        m = moment({int(k): by.get(int(k), 0.0) for k in steps.get(int(rank), ())})
        if m is not None:
            out[int(rank)] = {**m, "us_per_step": num(per)}
    return out


def moments_text(once: dict) -> str:
    """A clause for each moment set aside (:func:`moments`)."""
    return "".join(f"; rank {r}'s lateness was one step's ({100 * m['share']:.0f}% of the others' waiting for it: "
                   f"{dur_text(m['in_step_us'])} in step {m['step']} of {m['steps']}; {dur_text(m['us_per_step'])} "
                   f"per step over the window) -- seen once in the window (a one-off, or a cause with a longer period: "
                   f"profile more steps to tell), so not weighed against a rank late in every step"
                   for r, m in sorted(once.items()))


def by_chance(late_at: int, instances: int, ranks: int) -> float:
    """The chance that one of ``ranks`` equal ranks is last at ``late_at`` or more of ``instances`` collectives
    (one-sided binomial tail, each collective's last rank equally likely; the standard library's ``math.comb``
    suffices, no statistics package is needed for it)."""
    from math import comb

    p = 1.0 / ranks
    return sum(comb(instances, k) * p ** k * (1 - p) ** (instances - k) for k in range(late_at, instances + 1))


def contended_elsewhere(hs, late: int, ctx, gpu_us: dict, cpu_only: bool, tl_of: dict) -> dict | None:
    """Where the rank last at the collectives (``late``) has no own excess: another rank whose own host time per step
    exceeds every other rank's, confirmed (:func:`kit.doctor.own_time.own_excess`, a host excess), with its quiet
    excess confirmed and the contended-host model applying (:func:`kit.doctor.contended.contended_gain`: the lost
    core shown beyond its longest stall and inside the framework's ops) -- the rank that sets the job's pace over
    many steps, though in the traced ones it did not arrive last: a one-off pause on ``late`` (no event on any of its
    Python threads for 82-116 ms, most likely a garbage collection) left the contended rank's host up to a step
    ahead of its GPU, and ``late`` made the lag up step by step inside the window (FINDINGS.md, "Held-out jobs,
    judged blind"). The per-step own times hold no waiting, so they do not depend on who arrived last. Returns the
    rank with the largest modelled gain, its own excess and the model; None where no rank qualifies."""
    if not hs:
        return None
    best = None
    for r in sorted(tl_of):
        if r == late or r not in hs:
            continue
        ovh = (ctx.overhead_at_job or ctx.overhead or {}).get(r)
        own = own_excess(hs, r, ctx.step_us, None if cpu_only else gpu_us, ovh,
                         kinds=("host",) if cpu_only else ("host", "gpu"))
        if (own is None or not own["confirmed"] or own["in_doubt"] or own["kind"] != "host"
                or not (own.get("quiet") or {}).get("confirmed")):
            continue
        model = contended_gain(own, r, ctx.overhead, own_work(hs, ctx.comm_waits_by_step()), hs)
        if model is not None and model["gain_us"] > 0 and (best is None or model["gain_us"] > best["model"]["gain_us"]):
            best = {"rank": r, "own": own, "model": model}
    return best


def _contended_finding(other: dict, last: int, inst: "pd.DataFrame", tl_of: dict) -> Finding:
    """late_rank for a contended rank that the traced window does not show last (:func:`contended_elsewhere`)."""
    r, own, model = other["rank"], other["own"], other["model"]
    cost = float(model["gain_us"])
    mine = inst[inst["rank"] == r]
    theirs = inst[inst["rank"] == last]
    worst = theirs.loc[theirs["late_by_us"].idxmax()] if len(theirs) else inst.iloc[0]
    ev = {"late_rank": r, "last_at": len(mine), "late_at": int(mine["material"].sum()), "instances": len(inst),
          "cost_basis": "contended_host", "reason": "host_busy", "own_excess": own, "contended_host": model,
          "last_in_window": last, "last_in_window_at": int(theirs["material"].sum()),
          "last_in_window_late_by_us_median": num(theirs["late_by_us"].median()) if len(theirs) else None,
          "excerpt": excerpt(last, float(worst["start_us"]) - 2 * float(worst["late_by_us"]), float(worst["end_us"]),
                             ranks=sorted(tl_of))}
    said = BASIS_TEXT["contended_host"].format(q=100 * model["quiet_share"], u=dur_text(model["host_us"]),
                                               ul=dur_text(model["late_host_us"]), g=dur_text(model["gpu_bound_us"]))
    summary = (f"were rank {r} as fast as the others the job would gain about {dur_text(cost)} per step ({said}): "
               f"its own host time per step exceeds every other rank's by {dur_text(own['excess_us'])}, "
               f"{REASON_TEXT['host_busy']}; in the traced steps it was not the rank the others waited for -- rank "
               f"{last}, with no excess of its own, arrived last at {ev['last_in_window_at']} of {len(inst)} "
               f"collectives (a median {dur_text(ev['last_in_window_late_by_us_median'])} after the first): it was "
               f"making up a lag, from before the window or from a pause of its own; over many steps rank {r}'s "
               f"slower host sets the pace")
    return make("late_rank", cost, [r], ev, summary, fix=f"{FIX_BY_REASON['host_busy']} {RULES['late_rank'].fix}")


def charged(df: "pd.DataFrame", tl_of: dict, step_us: float | None):
    """Who arrived last at each collective instance seen on 2+ ranks (``df``) and what it cost the others: returns
    ``df`` with ``charged_us``; ``inst`` (per instance its last rank, ``step``, ``late_by_us``, ``lead_us``,
    ``floor_us``, ``material`` and the ``waits`` columns); ``waits`` (per instance, per rank the waiting charged to
    the last rank); ``cost_of`` (rank -> the most any other rank waited for it per step where it was materially last)."""
    import numpy as np

    keys = ["match_key", "instance"]
    last = df[df["last"]]
    inst = last[keys + ["rank", "start_us", "end_us", "step"]].assign(
        rank=last["rank"].astype(int), dur_min_us=last["dur_us"].to_numpy(dtype=float))
    inst = inst.merge(df.groupby(keys)["wait_us"].max().rename("late_by_us").reset_index(), on=keys)
    # what the last rank alone cost: how much later it arrived than the next-latest rank (the smallest wait of the
    # other ranks); the rest of the others' waiting was for the next-latest one too
    lead = df[df["wait_us"] > 0].groupby(keys)["wait_us"].min().rename("lead_us").reset_index()
    inst = inst.merge(lead, on=keys, how="left").fillna({"lead_us": 0.0})
    # late enough to be more than jitter: LATE_MIN_US, 5% of the transfer, LATE_STEP_SHARE of the step
    floor = np.maximum(np.maximum(LATE_MIN_US, 0.05 * inst["dur_min_us"]), LATE_STEP_SHARE * (step_us or 0.0))
    inst["material"] = inst["lead_us"] >= floor
    inst["floor_us"] = floor
    # what each rank's lateness cost the others: their exposed waiting at the instances it was materially last at
    df = df.assign(exposed_wait_us=df["exposed_wait_us"].where(df["in_step"], 0.0))
    df = df.merge(inst[keys + ["lead_us"]], on=keys, how="left")
    df["charged_us"] = np.minimum(df["exposed_wait_us"], df["lead_us"].fillna(0.0))
    waits = df.pivot_table(index=keys, columns="rank", values="charged_us", aggfunc="sum", fill_value=0.0)
    inst = inst.join(waits, on=keys)
    cost_of = {}
    for rank, g in inst[inst["material"]].groupby("rank"):
        cost_of[int(rank)] = max((float(g[r].sum()) / per_step_divisor(tl_of[int(r)]) for r in waits.columns
                                  if int(r) != int(rank)), default=0.0)
    return df, inst, waits, cost_of


def weigh(inst: "pd.DataFrame", waits: "pd.DataFrame", df: "pd.DataFrame", tl_of: dict, cost_of: dict):
    """The rank the others wait for (:func:`charged`'s readings): the most waiting caused per step, at least
    :data:`LATE_DOMINANCE` of all -- weighing only the ranks whose lateness is no moment (:func:`moments`) where any is
    not: a one-off averaged over the window is no per-step cause. Returns (the rank, the moments set aside, its own
    moment or None), or None (ranks take turns, or no waiting)."""
    if sum(cost_of.values()) <= 0:
        return None

    def steps(r):
        return sorted({int(k) for k in df.loc[df["rank"] == r, "step"].dropna()})

    once = moments(inst, waits, {r: steps(r) for r in tl_of}, cost_of)
    weighed = {r: c for r, c in cost_of.items() if r not in once}
    if not any(c > 0 for c in weighed.values()):
        weighed, once = cost_of, {}
    late = max(weighed, key=weighed.get)
    if weighed[late] < LATE_DOMINANCE * sum(weighed.values()):  # ranks take turns arriving last: not one late rank
        return None
    return late, once, moments(inst, waits, {late: steps(late)}, {late: cost_of[late]}).get(late)


def judge_late(summaries: list[tuple[int, Before]], ctx) -> list[Finding] | Skip:
    import numpy as np
    import pandas as pd

    tls = [(r, b.tl) for r, b in summaries]
    df = ctx.collectives()
    if df is None:
        return []
    cum = pd.concat([b.tl.rows[["stream", "start_us"]].assign(rank=r).join(b.cum) for r, b in summaries
                     if len(b.tl.rows)], ignore_index=True)
    df = df.merge(cum, on=["rank", "stream", "start_us"], how="left")
    df = df[df["ranks_seen"] > 1]
    if df.empty:
        return Skip("late_rank", "no collective instance was found on 2+ ranks (different process groups, or "
                                 "traces of different windows of the job)")
    tl_of = dict(tls)
    df, inst, waits, cost_of = charged(df, tl_of, ctx.step_us)
    chosen = weigh(inst, waits, df, tl_of, cost_of)
    if chosen is None:
        return []
    late, once, itself = chosen
    cost = cost_of[late]
    keys = ["match_key", "instance"]
    floor = inst["floor_us"]
    mine = inst[inst["rank"] == late]
    late_n = int(mine["material"].sum())
    one_step = tl_of[late].steps == 1  # one traced step: a rank late once per step is late once in the trace
    if late_n < max(1 if one_step else MIN_LATE, LATE_PATTERN * len(inst)):
        return []  # late once or rarely (e.g. the first collective after start-up): no pattern
    gpu_us = {r: float(b.kernels["total_us"].sum()) for r, b in summaries  # per step (kernel_speeds)
              if b.kernels is not None and r in tl_of}
    excess, explained = attribute(df, inst, late)
    added = excess.pop("_added", 0.0)
    seen = sum(excess.values())
    visible = added > 0 and seen >= LATE_EXPLAINED * added
    reason = max(excess, key=excess.get) if explained and visible and max(excess.values()) > 0 else None
    ovh = (ctx.overhead_at_job or ctx.overhead or {}).get(late)  # ranks compared at the job's host speed
    cpu_only = tl_of[late].gpu_kernels == 0
    hs = steady(ctx.host_steps) if ctx.host_steps else None  # the steps both own-time checks read, derived once
    own = (own_excess(hs, late, ctx.step_us, None if cpu_only else gpu_us, ovh,
                      kinds=("host",) if cpu_only else ("host", "gpu"))
           if hs else None)
    same_work = reason in (CPU_SAME_WORK_REASONS if cpu_only else SAME_WORK_REASONS)
    if own is not None and not own["confirmed"] and same_work:
        # late for issuing its work more slowly, no more of it: the slowest of equal hosts (job-level) -- unless
        # another rank's host is contended (a lost core, confirmed): then the window holds a lag it was making up
        other = contended_elsewhere(hs, late, ctx, gpu_us, cpu_only, tl_of)
        return [] if other is None else [_contended_finding(other, late, inst, tl_of)]
    if late_n < MIN_LATE and (own is None or not own["confirmed"] or own["in_doubt"]):
        return []  # late at one collective of its one step: named only where its own time per step says why
    chance = by_chance(int(mine["material"].sum()), len(inst), len(tl_of))
    if own is not None and (own["in_doubt"] if same_work else not own["confirmed"]) and chance >= LATE_CHANCE:
        return []  # its own time shows no excess (or one in doubt), and chance makes it last as often: no pattern
    n = per_step_divisor(tl_of[late])
    by_own = own is not None and own["confirmed"] and own["kind"] == "gpu" and reason in SAME_WORK_REASONS
    if by_own:
        reason = "gpu_busy"  # its own GPU time exceeds the others' by more than they differ: its GPU, not its host
    # its own host time exceeds the others' but its lateness at the collectives it was last at is not explained (the
    # others waited for it where another rank's kernel ended last): the reason is the host kind behind that excess
    in_own = (own_reason(hs, late, own["excess_us"], LATE_EXPLAINED)
              if reason is None and own is not None and own["confirmed"] and own["kind"] == "host" else None)
    if in_own is not None:
        reason = in_own[0]
    waited = min(cost, ctx.step_us) if ctx.step_us else cost  # no rank waits longer than its step
    clipped = waited < cost  # their charged waits reach the step: said as a bound
    gain, basis = own_gain(own, reason, excess, n)
    # a cost read at the collectives (the reason's added lateness, or the others' waiting) holds the tracer's cost in
    # the late rank's Python off the ops (own_excess' is net of it): taken off; where what is left is under the share
    # of the step an own excess must reach (MIN_OWN_EXCESS_SHARE), no cost is confirmed net of the profiler
    tracer = tracer_excess(hs, late) if basis in ("reason_excess", "others_wait") and reason in TRACER_REASONS \
        else 0.0
    traced_gain = gain if gain is not None else waited
    if tracer > 0:
        gain = max(0.0, traced_gain - tracer)
        if gain <= MIN_OWN_EXCESS_SHARE * (ctx.step_us or 0.0):
            gain = 0.0
    by_host = basis == "own_excess" and own["kind"] == "host"
    # where the tracer's price leaves no confirmed cost of the lateness read at the collectives, kit.capture's
    # measurement (without the profiler) is tried before none is declared
    untraced = tracer > 0 and gain <= 0
    got = measured_excess(ctx.capture, late, ctx.step_us) if by_host or untraced else None
    measured, measured_ok = got if got is not None else (None, False)
    # a contended host (its quiet time spread over the step): the contended-host model, not the traced excess (which
    # holds the stretched profiler's time) nor kit.capture's measured excess (every rank's drained step holds its waits
    # for the late one at the collectives: the others' measured host is not their own work, FINDINGS.md)
    work = own_work(hs, ctx.comm_waits_by_step()) if hs else {}
    model = contended_gain(own, late, ctx.overhead, work, hs) if by_host else None
    if model is not None:
        gain, basis = model["gain_us"], "contended_host"
    elif measured_ok and measured < gain and not (own.get("quiet") or {}).get("confirmed"):  # (measured_excess)
        gain, basis = measured, "measured_host"
    elif untraced and measured_ok and measured > 0:  # (measured_excess) the trace's own reading is all tracer
        gain, basis = measured, "measured_host"
    # a contended core (the model's reading) is taken from the rank in slices between its launches as inside its ops:
    # its host's stall time is the same work issued more slowly, not a stall of its own (kit.doctor.contended)
    sliced = model is not None and reason == "host_stall"
    if sliced:
        reason = "host_busy"
    # the most the job could gain: each other rank's step is its own time plus its waiting, so the least any other
    # rank waits per step at the collectives bounds it -- counted at every collective where that rank waited more
    # than jitter (the instance's lateness floor), not only where this rank's kernel ended last (a broadcast's root
    # finishes without waiting for the others, so their wait there is charged to no one)
    fl = df.merge(inst[keys + ["floor_us"]], on=keys, how="left")
    waits = fl["exposed_wait_us"].where(fl["wait_us"] >= fl["floor_us"], 0.0)
    bound = min(float(waits[fl["rank"] == r].sum()) / per_step_divisor(tl_of[r]) for r in tl_of if r != late)
    if gain is not None:
        cost = min(max(waited, bound) if basis in ("own_excess", "measured_host", "contended_host") else waited, gain)
    room, room_basis, room_of = (host_room(hs, late, ctx.overhead, ctx.capture,
                                                {r: b.waits_us for r, b in summaries})
                                 if basis == "own_excess" and own["kind"] == "gpu" else (None, None, None))
    if room is not None and room < cost:  # its GPU's excess fills time the others' hosts would take anyway
        cost, basis = room, "others_host"
    # no rank can cost the job more than its step without the profiler less the GPU work it would still do
    bound_by = step_bound((ctx.overhead or {}).get(late), late, work)
    # the tracer's price of its Python off the ops taken at its low end (overhead.tracer_taken) can leave a cost that
    # the point estimate of its step contradicts: then the largest cost in the price's range that it does not, the
    # range said (overhead.within_point)
    ranged = tracer_range(cost, own, basis, tracer, traced_gain, (ctx.overhead or {}).get(late),
                          lambda: own_excess(hs, late, ctx.step_us, None if cpu_only else gpu_us, ovh,
                                             kinds=("host",), whole=True), hs, late)
    if ranged is not None:
        cost = ranged["cost_us"]
    capped = bound_by is not None and cost > bound_by["cap_us"]
    if capped:
        bound_by["cost_before_us"] = num(cost)
        cost = float(bound_by["cap_us"])
    unnetted = tracer > 0 and cost <= 0  # the tracer's cost on the rank holds all of its lateness
    late_at = mine[mine["material"]]
    worst = late_at.loc[late_at["late_by_us"].idxmax()]
    ev = {"late_rank": late, "last_at": len(mine), "late_at": len(late_at), "instances": len(inst),
          "cost_basis": basis,
          "late_floor_us": num(float(floor.min())), "late_by_us_median": num(late_at["late_by_us"].median()),
          "late_by_us_max": num(late_at["late_by_us"].max()), "others_wait_us_per_step": num(waited),
          "others_least_wait_us_per_step": num(bound),
          "after_next_latest_us_median": num(late_at["lead_us"].median()),
          "cost_by_late_rank": {str(r): num(v) for r, v in cost_of.items()}, "reason": reason,
          "explained_instances": explained, "reason_us_per_step": {c: num(v / n) for c, v in excess.items()},
          "excerpt": excerpt(late, float(worst["start_us"]) - 2 * float(worst["late_by_us"]), float(worst["end_us"]),
                              ranks=sorted(tl_of))}
    ev["last_by_chance"] = num(chance, 4)
    if once:  # the ranks set aside as moments (one step's of several): said, with their share
        ev["moments"] = {str(r): m for r, m in once.items()}
    if itself is not None:  # kit.doctor.finalize orders a moment after the per-step causes
        ev["moment"] = itself
    if tracer > 0:  # the tracer's cost in its Python off the ops beyond the others', taken off the collectives' reading
        ev["tracer_excess_us"] = num(tracer)
        ev["cost_before_tracer_us"] = num(traced_gain)
    if bound_by is not None:
        ev["step_bound"] = bound_by
    if ranged is not None:
        ev["tracer_price_range"] = ranged
    if basis == "others_host":  # the others' host time: measured unprofiled (kit.capture) or estimated
        ev["others_host_basis"] = room_basis
        ev["others_host_us"] = room_of
    if own is not None:  # its own time beyond the next slowest rank's: what made the others wait
        ev["own_excess"] = own
    if model is not None:
        ev["contended_host"] = model
    if measured is not None:
        ev["measured_host_excess_us"] = num(measured)
        ev["measured_host_confirmed"] = measured_ok
    slower = gpu_speed(late, {r: b.kernels for r, b in summaries})
    ev["same_kernels_slower_pct"] = num(100 * slower) if slower is not None else None
    ev["lateness_explained_share"] = num(seen / added, 3) if added > 0 else None
    ev["reason_from"] = "own_time" if in_own else "collectives"
    if sliced:  # the host model's stall time of a contended core: its slices (kit.doctor.contended), its issuing
        ev["reason_from_stall"] = "contended_host"
        ev["reason_us_per_step_as_read"] = ev["reason_us_per_step"]
        per = dict(ev["reason_us_per_step"])
        per["host_busy"], per["host_stall"] = num((per["host_busy"] or 0.0) + (per["host_stall"] or 0.0)), 0.0
        ev["reason_us_per_step"] = per
    words = REASON_TEXT_CPU if tl_of[late].gpu_kernels == 0 else REASON_TEXT
    why = (f"; its GPU busy with {dur_text(own['excess_us'])} more compute per step than the slowest other rank's"
           if by_own else f"; {words[reason]} ({dur_text(in_own[1])} per step more than any other rank, in its "
                          f"step's host activity)" if in_own else
           f"; {words[reason]} ({100 * (excess[reason] + excess['host_stall']) / added:.0f}% of its lateness, "
           f"with stretches of no event as its core was taken)" if sliced else
           f"; {words[reason]} ({100 * excess[reason] / added:.0f}% of its lateness)" if reason else
           f"; what made it late is not visible in the trace (its own activity explains "
           f"{100 * seen / added if added else 0:.0f}% of its lateness: it may have begun before the traced "
           f"window, or lie in work the trace does not record)")
    if reason == "gpu_busy" and slower is not None:
        # slower at the same kernels, and that slowness -- not extra work -- is most of its GPU's excess
        slowed = slower / (1 + slower) * gpu_us.get(late, 0.0) if slower > 0 else 0.0
        more = own is not None and own.get("kind") == "gpu" and slowed < SLOWED_SHARE * own.get("excess_us", 0.0)
        reason = "gpu_slow" if slower >= SLOW_GPU and not more else reason
        why += (f": its GPU ran the same kernels {100 * slower:.1f}% slower than the other ranks' (its "
                f"{KERNEL_TOP} heaviest, median durations) -- the same work taking longer on that GPU (its "
                f"clocks, power or thermal limits, or other work on it), not more work" if reason == "gpu_slow"
                else f": its GPU ran the kernels it shares with the others {abs(100 * slower):.1f}% "
                     f"{'slower' if slower > 0 else 'faster'} than theirs, and more GPU work besides -- work the other "
                     f"ranks do not have" + _extra_text(late, summaries, ev))
    ev["reason"] = reason
    said = ("what the others waited for it" if basis == "others_wait" else
            BASIS_TEXT[basis] + (OTHERS_HOST_TEXT[room_basis] if basis == "others_host" else "")
            if basis != "contended_host" else BASIS_TEXT[basis].format(
                q=100 * model["quiet_share"], u=dur_text(model["host_us"]), ul=dur_text(model["late_host_us"]),
                g=dur_text(model["gpu_bound_us"])))
    if cost > waited and not capped:
        said = (f"its own time per step beyond the slowest other rank's: each other rank waits {dur_text(bound)} or more "
                f"per step at the collectives, some of it where another rank's kernel ended last, as a broadcast's "
                f"root does without waiting")
    pieces = []
    if tracer > 0:  # the collectives' reading, net of the tracer's cost on that rank
        pieces.append(f"net of the tracer's cost in its Python off the ops, {dur_text(tracer)} per step more than the "
                      f"other ranks'")
    if ranged is not None:
        pieces.append(f"the tracer's price of its Python off the ops, between its low end and whole, puts it at "
                      f"{dur_text(ranged['cost_at_whole_price_us'])}-{dur_text(ranged['cost_at_low_end_us'])} per "
                      f"step, and its step without the profiler ({dur_text(ranged['point_step_us'])}, "
                      f"{'measured' if (ctx.overhead or {})[late].basis == 'measured' else 'as estimated'}) less "
                      f"{dur_text(ranged['own_gpu_work_us'])} of GPU work allows at most "
                      f"{dur_text(ranged['point_cap_us'])}")
    if capped:
        high = "measured" if bound_by["basis"] == "measured" else "at the estimate's high end"
        pieces.append(f"at most its step without the profiler ({dur_text(bound_by['unprofiled_step_us'])}, {high}) "
                      f"less the {dur_text(bound_by['own_gpu_work_us'])} of GPU work it would still do; "
                      f"{dur_text(bound_by['cost_before_us'])} as read")
    basis_text = (f" ({'; '.join(pieces + [said])})" if pieces or cost != waited else ", what the others waited for it")
    if unnetted:
        summary = (f"rank {late} arrived last at {len(late_at)} of {len(inst)} collectives, a median "
                   f"{dur_text(ev['after_next_latest_us_median'])} after the next-latest rank{why}; but of the "
                   f"lateness read there, {dur_text(traced_gain)} per step, what the tracer's own cost in its Python "
                   f"off the ops ({dur_text(tracer)} per step more than the other ranks') leaves is under "
                   f"{100 * MIN_OWN_EXCESS_SHARE:.0f}% of the step: no cost of its lateness is confirmed net of the "
                   f"profiler (re-profile without with_stack to measure it)"
                   f"{moment_text(itself, 'its lateness') if itself else ''}{moments_text(once)}")
        ev["cost_basis"] = "not_net_of_tracer"
        return [make("late_rank", 0.0, [late], ev, summary, fix=f"{FIX_BY_REASON[reason]} {RULES['late_rank'].fix}"
                     if reason else None)]
    # its cost first (one sentence, one cost), then what made it late and what the others waited
    gain = (f"at most {dur_text(cost)} per step (the point estimate's bound; "
            f"{dur_text(ranged['cost_at_whole_price_us'])}-{dur_text(ranged['cost_at_low_end_us'])} over the tracer's "
            f"price range)" if ranged is not None and ranged["at_point_cap"] and not capped else
            f"about {dur_text(cost)} per step")
    summary = (f"were rank {late} as fast as the others the job would gain {gain}"
               f"{basis_text}: it arrived last at {len(late_at)} of {len(inst)} collectives, a median "
               f"{dur_text(ev['after_next_latest_us_median'])} after the next-latest rank (up to "
               f"{dur_text(ev['late_by_us_max'])} after the first){why}; the other ranks waited "
               f"{'up to their whole step, ' if clipped else ''}{dur_text(waited)} per step, for it alone"
               f"{' in the traced steps' if basis in ('measured_host', 'contended_host') else ''}"
               f"{moment_text(itself, 'their waiting for it') if itself else ''}{moments_text(once)}")
    return [make("late_rank", cost, [late], ev, summary, fix=f"{FIX_BY_REASON[reason]} {RULES['late_rank'].fix}"
                 if reason else None)]


rule(Rule(id="late_rank", title="one rank arrives late at the collectives", extract=extract_late, judge=judge_late,
          needs_ranks=2,
          order=30, cross_rank=True,
          cause=("A collective finishes only when its last rank arrives: every other rank's kernel spins, holding "
                 "its GPU, until then. One slow rank sets the pace of the whole job."),
          fix="Then re-profile: the late rank should change or disappear.",
          caveats=("'Arrived last' is read off kernel durations (the rank whose kernel is shortest waited for no "
                   "one), so no clock alignment is needed. The reason compares how each rank got from the last "
                   "collective at which all ranks arrived together to this one (host activity until the launch, then"
                   " the GPU still busy), so a lag created once is blamed on what created it. The cost is the other "
                   "ranks' waiting that no compute hid, at the collectives this rank was last at; fixing the rank "
                   "may move some of it elsewhere. Arriving less than 1% of a step late is jitter, not counted; no "
                   "finding when ranks take turns arriving last. What the host was doing is the host model's (the "
                   "step accounting's): CUDA runtime calls on a GPU job, every recorded op on a CPU-only one."),
          notebook="collective_tracing"))
