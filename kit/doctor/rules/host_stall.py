"""``host_stall``: the step waits while the host runs work that issues nothing (the accounting's ``host_stall``
slice: stretches of >= :data:`kit.doctor.host_model.STALL_US`)."""

from __future__ import annotations

from ..accounting import Account, slice_extract
from ..findings import slice_judge
from ..host_model import STALL_US
from ..model import Explains, Rule, rule

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
    return f"; the longest: {s['dur_us'] / 1e3:.1f} ms {what}{where}{around}{within}"


def sentence(a: Account, c: float, sh: float, who: str) -> str:
    if a.mode == "cpu":
        return (f"the main thread ran {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) without any recorded op, in "
                f"stretches of >= {MIN}, on {who}{stall_text(a)}")
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) while the host ran work that issued "
            f"nothing for stretches of >= {MIN} on {who}{stall_text(a)}")


rule(Rule(
    id="host_stall", title="the step waits while the host runs work that issues nothing", order=120,
    extract=slice_extract("host_stall"), judge=slice_judge("host_stall"),
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
             f"it. Stretches below {MIN} are counted as launch cost, not as stalls.")))
