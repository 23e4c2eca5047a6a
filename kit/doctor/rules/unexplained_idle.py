"""``unexplained_idle``: GPU idle time the trace cannot attribute (the accounting's ``unexplained`` slice: the host
call that issued the next GPU work is not in the trace)."""

from __future__ import annotations

from dataclasses import replace

from ..accounting import Account, slice_extract
from ..findings import slice_finding
from ..model import Explains, Finding, Rule, rule

CAPTURED_FIX = ("These traces were captured with kit.capture, which already records CPU and CUDA activity over whole "
                "steps: the idle is GPU work issued before the recorded window began (its host call is not in the "
                "trace) or the end of a step after its last GPU work. Look at the step's edges in the excerpt; a "
                "larger warmup (kit.capture.profile(warmup=N)) starts the window later in steady state.")
"""the fix on traces :mod:`kit.capture` recorded: its advice on how to profile is already followed"""


def sentence(a: Account, c: float, sh: float, who: str) -> str:
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) where the trace holds no host call that "
            f"issued the next GPU work, or no GPU work followed, on {who}")


def judge(summaries: list[tuple[int, Account]], ctx) -> list[Finding]:
    """The slice finding; on traces kit.capture recorded, the fix does not advise a capture they already had."""
    out = slice_finding("unexplained_idle", ("unexplained",), summaries)
    if out and all(ctx.capture.get(rk) for rk in out[0].ranks):
        out = [replace(out[0], fix=CAPTURED_FIX)]
    return out


rule(Rule(
    id="unexplained_idle", title="GPU idle time the trace cannot attribute", order=150,
    extract=slice_extract("unexplained_idle"), judge=judge,
    explains=Explains(("unexplained",), sentence),
    cause=("The GPU was idle and the trace does not say why: the host call that issued the next GPU work is "
           "not in the trace (issued before the recorded window began, or the profiler dropped CPU events), "
           "or no GPU work followed in the step."),
    fix=("Profile with ProfilerActivity.CPU and CUDA together, with a schedule that records whole steps "
         "(wait/warmup before active), and call prof.step() once per step; then run kit doctor again."),
    caveats="Idle at the end of a step that the host ended without issuing more work is counted here."))
