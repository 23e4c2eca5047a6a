"""``input_bound``: the step waits while the host waits for its DataLoader (the accounting's ``input`` slice).

**The job's, or one rank's.** In a job that synchronises every step, a rank's DataLoader wait holds up its GPU only
where the other ranks do not wait for it: on the ranks that arrive early the wait lies inside their all-reduce's wait
for the last one (their GPU spins in NCCL through it), and on the last to arrive it is on the step's path. So the slice
shows on whichever rank is last, while every rank does the same input work on its training thread. Where every rank
waits for its DataLoader each step, every rank's wait within 2x of the longest by the median and by the mean over
the steps (:data:`kit.doctor.reconcile.INPUT_ALIKE`: a straggler whose loader falls behind every few steps is alike
by the median only), and no rank is late for reasons of its own (no ``late_rank``), the cause
is the job's: the finding names every rank (``job_level``, as a job-level ``launch_bound``;
:func:`kit.doctor.reconcile.job_level_input`), with the rank it was on the path of as context, at that rank's cost --
what the step would save were the loader off the training thread, stated net of the profiler's events inside the
waits. A rank whose wait does exceed the others' is an input straggler, named by ``late_rank`` (its wait folded into
it), or by this finding alone: where the slice cost 'low' or more on every rank but the waits are not alike, it names
the ranks whose mean wait is within 2x of the longest, not every rank."""

from __future__ import annotations

from ..accounting import Account, slice_extract
from ..findings import slice_judge
from ..model import Explains, Rule, rule


def inside_text(a: Account) -> str:
    """'; most of it in aten::pin_memory (4.3 ms per step) ...' when one op the trace kept takes at least half of
    the DataLoader's time: the part of next() to fix."""
    inside, total = a.calls.get("input_inside") or {}, sum(v["host_us"] for v in (a.calls.get("input") or {}).values())
    if not inside or not total:
        return ""
    name, v = max(inside.items(), key=lambda kv: kv[1]["host_us"])
    if v["host_us"] < 0.5 * total:
        return ""
    pinning = "pin_memory" in name
    why = " -- the batch's pinning, which with num_workers=0 runs in the training thread" if pinning else ""
    return f"; most of it in {name} ({v['host_us'] / a.steps / 1e3:.2f} ms per step){why}"


def sentence(a: Account, c: float, sh: float, who: str) -> str:
    loader = f" ({a.calls_text('input', 1)})" if a.calls.get("input") else ""
    if a.mode == "cpu":
        return (f"the main thread waited {c / 1e3:.2f} ms per step ({100 * sh:.1f}% of the step) for its DataLoader "
                f"on {who}{loader}{inside_text(a)}")
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}% of the step) while the host waited for its "
            f"DataLoader, or refilled the GPU's queue the wait had drained, on {who}{loader}{inside_text(a)}")


rule(Rule(
    id="input_bound", title="the step waits for the DataLoader", order=110,
    extract=slice_extract("input_bound"), judge=slice_judge("input_bound"),
    explains=Explains(("input",), sentence, lambda a: {"dataloader": a.calls.get("input", {}),
                                                       "dataloader_inside": a.calls.get("input_inside", {})}),
    cause=("The host thread that issues the GPU's work was inside next(iter(DataLoader)) while the GPU had "
           "nothing queued: batches are produced more slowly than the GPU consumes them (loading and "
           "transforms in the training process, too few workers, or slow storage)."),
    fix=("Load in worker processes (DataLoader(num_workers=N>0, persistent_workers=True, prefetch_factor=2+)), "
         "pin_memory=True with .to(device, non_blocking=True), move per-sample transforms to the GPU or "
         "precompute them; check that the workers keep up (their own profile, or time next(it) alone). When "
         "the summary names pin_memory: pinning a large batch is a copy over every intra-op thread, which "
         "straggles when they are as many as the cores -- workers (their pin-memory thread does it) or fewer "
         "threads (torch.set_num_threads)."),
    caveats=("The time counted is the GPU's idle time while the host waited, plus the host's catch-up after "
             "it; with prefetching workers a short wait can remain at the first step of an epoch."),
    notebook="dataloader_sync"))
