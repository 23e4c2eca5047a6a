"""``host_stall``: the step waits while the host runs work that issues nothing (the accounting's ``host_stall``
slice: stretches of >= :data:`kit.doctor.host_model.STALL_US` with no GPU work issued; on a rank whose quiet time
shows its core taken away, :func:`kit.doctor.contended.lost_cores`, only each step's longest and the backward hooks',
:data:`kit.doctor.host_model.ONE_STALL`: a core the scheduler shares with another process is taken in many slices a
step, its other stretches the rank's issuing done more slowly, ``launch``), net of a traced window that ran slower than its
unprofiled steps (:attr:`kit.doctor.overhead.ProfilerOverhead.slow_window_us`).

A stall is host time in which no event is recorded, so the profiler's per-event price does not lengthen it; the
measured overhead (kit.capture: the traced step less the steps timed without the profiler just before) lands in the
slices where the events are (:data:`kit.doctor.reconcile.NET_OF_PROFILER_SLICES`). But a window can run slower than
its unprofiled steps for more than the profiler's events -- every call and the Python between them slower, stretches
without an event among them (FINDINGS.md, "A slow traced window": a balanced control's stall). The part of the
measured overhead that the rank's recorded events do not explain even at the top of their price's range
(:data:`kit.doctor.overhead.ESTIMATE_RANGE` x :attr:`kit.doctor.overhead.ProfilerOverhead.host_us`) is host time the
window spent slower for other reasons, in every slice, stretches with no event among them: a stall no longer than
that may be the window's own slowness (:attr:`~kit.doctor.overhead.ProfilerOverhead.slow_window_us`; the reconcile
stage's guard reads the slice net of it too), and only its excess over it is charged (the launch slice's netting
takes the whole measured overhead too: in such a window the stall errs low, never high). Where the events explain
the overhead nothing changes; an estimated overhead has no measurement to compare."""

from __future__ import annotations

import dataclasses

from ..accounting import Account, slice_extract
from ..findings import restated, slice_finding
from ..host_model import STALL_US
from ..model import Explains, Finding, Rule, rule

MIN = f"{STALL_US / 1e3:g} ms"
"""the shortest stretch counted as a stall, as said"""


def stall_text(a: Account) -> str:
    if not a.stalls:
        return ""
    s = a.stalls[0]
    around = f" between {s['before'] or 'the step start'} and {s['after'] or 'the step end'}"
    within = f", inside {', '.join(s['within'][:3])}" if s.get("within") else ""
    what = "without a recorded op" if a.mode == "cpu" else "without issuing GPU work"
    where = (f" in step {s['step']}, {s['into_step_us'] / 1e3:.1f} ms into it" if s.get("step", -1) >= 0 else
             f" {s['into_step_us'] / 1e3:.1f} ms into the traced span" if "into_step_us" in s else "")
    maybe = f": {s['maybe']}" if s.get("maybe") else ""
    return f"; the longest: {s['dur_us'] / 1e3:.1f} ms {what}{where}{around}{within}{maybe}"


def sentence(a: Account, c: float, sh: float, who: str) -> str:
    if a.mode == "cpu":
        return (f"the main thread ran {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) without any recorded op, in "
                f"stretches of >= {MIN}, on {who}{stall_text(a)}")
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) while the host ran work that issued "
            f"nothing for stretches of >= {MIN} on {who}{stall_text(a)}")


def net_of_slow_window(f: Finding, overhead: dict | None) -> Finding:
    """``f`` with each rank's cost less that rank's :attr:`~kit.doctor.overhead.ProfilerOverhead.slow_window_us` (at
    least 0), the finding's cost the largest left; the traced cost and each rank's slow window in the evidence.
    Unchanged where no rank has one."""
    slow = {rk: o.slow_window_us if (o := (overhead or {}).get(rk)) is not None else 0.0 for rk in f.ranks}
    if not any(slow.values()):
        return f
    per = f.evidence.get("per_rank") if isinstance(f.evidence.get("per_rank"), dict) else {}
    traced = {rk: float((per.get(str(rk)) or per.get(rk) or {}).get("cost_us_per_step", f.cost_us_per_step))
              for rk in f.ranks}
    net = {rk: max(0.0, traced[rk] - slow[rk]) for rk in f.ranks}
    worst = max(net, key=net.__getitem__)
    cost = round(net[worst], 1)
    ev = {**f.evidence, "cost_traced_us_per_step": f.cost_us_per_step,
          "slow_window_us_per_step": {str(rk): round(v, 1) for rk, v in slow.items()}}
    if per:
        ev["per_rank"] = {k: ({**v, "cost_us_per_step": round(net[int(k)], 1), "cost_traced_us_per_step":
                               v.get("cost_us_per_step")} if isinstance(v, dict) and int(k) in net else v)
                          for k, v in per.items()}
    basis = (f"beyond the traced window's own slowness (rank {worst}: {slow[worst] / 1e3:.2f} ms per step of the "
             "measured profiler overhead that its recorded events do not explain even at twice their price: its host "
             "ran slower in the window than in kit.capture's unprofiled steps, stretches with no event among them)")
    return dataclasses.replace(f, cost_us_per_step=cost, evidence=ev,
                               summary=restated(f.summary, cost, basis, "as traced"))


def judge_host_stall(summaries: list, ctx) -> list[Finding]:
    return [net_of_slow_window(f, ctx.overhead) for f in slice_finding("host_stall", ("host_stall",), summaries)]


rule(Rule(
    id="host_stall", title="the step waits while the host runs work that issues nothing", order=120,
    extract=slice_extract("host_stall"), judge=judge_host_stall,
    explains=Explains(("host_stall",), sentence, lambda a: {"longest_stalls": list(a.stalls)}),
    cause=(f"The thread that issues the GPU's work ran for >= {MIN} at a time without any CUDA call while the "
           "GPU had nothing queued: Python or C++ work on the training thread that issues no GPU work -- logging or "
           "metrics, checkpointing, garbage collection (gc.collect over a large heap), time.sleep, a lock."),
    fix=("Find the stretch (the evidence gives the longest, with the CUDA calls around it; profile with "
         "with_stack=True to name the Python), then move that work off the training thread (a background "
         "thread or process), do it every N steps, or for GC: gc.freeze() after start-up and a larger "
         "gc.set_threshold, collecting explicitly between steps only when needed."),
    caveats=("A stretch without CUDA calls can also be CPU-side tensor work in an op the profiler recorded "
             "without a CUDA call (a CPU tensor op, a data-dependent shape); the evidence names the ops around "
             f"it. Stretches below {MIN} are counted as launch cost, not as stalls; so are, on a rank whose quiet "
             "time inside ops shows its core taken away, a step's stretches besides its longest (outside backward "
             "hooks: the core's slices), and a lone hole in an autograd node that does not recur. In a step with one "
             "stretch the trace does not tell a sleep from a scheduler's slice of a core shared with another "
             "process: check the host's load too.")))
