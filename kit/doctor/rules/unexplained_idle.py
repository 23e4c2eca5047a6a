"""``unexplained_idle``: GPU idle time the trace cannot attribute (the accounting's ``unexplained`` slice: the host
call that issued the next GPU work is not in the trace)."""

from __future__ import annotations

from ..accounting import Account, slice_extract
from ..findings import slice_judge
from ..model import Explains, Rule, rule


def sentence(a: Account, c: float, sh: float, who: str) -> str:
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) where the trace holds no host call that "
            f"issued the next GPU work, or no GPU work followed, on {who}")


rule(Rule(
    id="unexplained_idle", title="GPU idle time the trace cannot attribute", order=150,
    extract=slice_extract("unexplained_idle"), judge=slice_judge("unexplained_idle"),
    explains=Explains(("unexplained",), sentence),
    cause=("The GPU was idle and the trace does not say why: the host call that issued the next GPU work is "
           "not in the trace (issued before the recorded window began, or the profiler dropped CPU events), "
           "or no GPU work followed in the step."),
    fix=("Profile with ProfilerActivity.CPU and CUDA together, with a schedule that records whole steps "
         "(wait/warmup before active), and call prof.step() once per step; then run kit doctor again."),
    caveats="Idle at the end of a step that the host ended without issuing more work is counted here."))
