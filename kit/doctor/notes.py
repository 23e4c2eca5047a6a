"""The capture notes: what a rank's trace lacks for a full diagnosis, said as what to change in the capture
(:func:`capture_notes`, per rank, in the worker), how :mod:`kit.capture` recorded it (:func:`capture_facts_notes`),
and the job's notes (the job check, the trace layer's warnings, each capture note once: :func:`job_notes`,
:func:`group_notes`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .calls import GRAPH_LAUNCH
from .steps import INFERRED, LEFT_OUT, SPAN


def _runtime(trace):
    """The trace's CUDA runtime and driver calls (the host model's :func:`kit.doctor.host_model.runtime_calls`
    reads the same two categories)."""
    cpu = trace.cpu
    return cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"])] if not cpu.empty else cpu


def cuda_device(trace) -> bool:
    """Does the trace's header show a CUDA device (``deviceProperties``), i.e. did the machine have a GPU?"""
    props = trace.header.get("deviceProperties") if isinstance(getattr(trace, "header", None), dict) else None
    return bool(props)


def no_gpu_note(trace) -> str:
    """A trace without GPU activity: say so, and what that means for the GPU rules; advise
    ``ProfilerActivity.CUDA`` only where the machine had a CUDA device (the header names one)."""
    base = "no GPU activity in the trace: the rules that read GPU work cannot run; the host (main thread) is diagnosed"
    if cuda_device(trace):
        return f"{base}; the machine has a CUDA device: profile with ProfilerActivity.CUDA (kit.capture does)"
    return f"{base} (a CPU-only job: the trace names no CUDA device)"


def capture_notes(trace, steps) -> list[str]:
    """What the trace lacks for a full diagnosis, said as what to change in the capture (kit.capture does all)."""
    from ..capture import capture_info  # the trace header's kitCapture, else the sidecar beside the file

    facts = capture_info(trace)
    notes = []
    if trace.gpu.empty:
        notes.append(no_gpu_note(trace))
    if steps.attrs.get(INFERRED):
        notes.append(f"no ProfilerStep annotations: {len(steps)} steps inferred from {steps.attrs[INFERRED]}; call "
                     f"prof.step() once per training step (kit.capture does) for exact step windows")
    elif steps.empty or steps.attrs.get(SPAN):
        notes.append("no ProfilerStep annotations: call prof.step() once per training step (kit.capture does); "
                     "costs are per traced span, not per step")
    if steps.attrs.get(LEFT_OUT):
        notes.append(steps.attrs[LEFT_OUT])
    if trace.info.rank is None:
        notes.append("no distributedInfo in the trace header: profile after init_process_group; ranks are "
                     "taken from the file names")
    nccl = trace.gpu[trace.gpu["nccl"]] if not trace.gpu.empty else trace.gpu
    if len(nccl) and nccl["in_nelems"].isna().all():
        rt = _runtime(trace)
        replayed = len(rt) and rt["name"].astype(str).str.startswith(GRAPH_LAUNCH).any() and not (
            trace.cpu["cat"].eq("cpu_op") & trace.cpu["name"].astype(str).str.startswith("c10d::")).any()
        notes.append("NCCL kernels carry no collective metadata: "
                     + ("they are replayed from CUDA graphs, whose kernels the profiler records without the "
                        "launching op's metadata" if replayed else "torch < 2.3, or the collectives ran outside "
                        "the recorded ops") + "; bytes and busbw are unknown")
    if not trace.gpu.empty and _runtime(trace).empty:
        notes.append("no CUDA runtime events: host-side rules (launches, syncs, copies) cannot run")
    ops = trace.cpu[trace.cpu["cat"] == "cpu_op"] if not trace.cpu.empty else trace.cpu
    if len(ops) and "input_dims" in ops and ops["input_dims"].isna().all():
        notes.append("no input shapes on the CPU ops: profile with record_shapes=True (kit.capture does); "
                     "the sizes of collectives without NCCL metadata and of copies are unknown")
    return notes + capture_facts_notes(facts)


ENV_EFFECTS = {
    "CUDA_LAUNCH_BLOCKING": ("1", "every kernel launch waits for the kernel: launch_bound and host_sync findings "
                                  "are this setting's doing; unset it for a performance trace"),
    "NCCL_P2P_DISABLE": ("1", "NCCL may not use direct GPU-to-GPU (NVLink/PCIe P2P) transfers: collectives go "
                              "through host memory (see low_busbw)"),
    "NCCL_SHM_DISABLE": ("1", "NCCL may not use shared host memory between local ranks"),
    "NCCL_IB_DISABLE": ("1", "NCCL may not use InfiniBand/RoCE: inter-node traffic goes through sockets"),
    "NCCL_GRAPH_MIXING_SUPPORT": ("0", "NCCL's support for mixing graph and eager launches is off "
                                       "(see graph_mixing_gap: its caveats apply)"),
    "TORCH_NCCL_BLOCKING_WAIT": ("1", "wait() blocks the host until the collective ends: host_sync findings "
                                      "around collectives are this setting's doing"),
}
"""settings in a ``kitCapture`` environment that change what the rules see: value that has the effect, effect"""


def capture_facts_notes(facts: dict[str, Any] | None) -> list[str]:
    """Notes from how :mod:`kit.capture` recorded the trace: options that distort host-side costs, a window that
    includes the job's first steps, a capture that ended with an error, environment settings that explain
    findings (:data:`ENV_EFFECTS`). Nothing for a trace captured otherwise (the checks above cover it)."""
    if not isinstance(facts, dict):
        return []
    notes = []
    heavy = [k for k in ("with_stack", "profile_memory") if facts.get(k) is True]
    if heavy:
        notes.append(f"captured with {' and '.join(f'{k}=True' for k in heavy)}: the profiler's per-op cost grows, "
                     f"so host-side costs (launch_bound, host_sync) are inflated; capture without for timing")
    sched = facts.get("schedule")
    if isinstance(sched, dict) and not any(int(sched.get(k) or 0) for k in ("skip_first", "wait", "warmup")):
        notes.append("the recorded window starts at the job's first step (skip_first=wait=warmup=0): NCCL set-up, "
                     "autotuning and DDP's bucket rebuild count as step time")
    if facts.get("error"):
        notes.append(f"the capture ended with an error: {facts['error']}")
    env = facts.get("env") if isinstance(facts.get("env"), dict) else {}
    for var, (value, effect) in ENV_EFFECTS.items():
        if str(env.get(var, "")).strip() == value:
            notes.append(f"{var}={value} in the job's environment: {effect}")
    return notes


def job_notes(job, summaries: Sequence[Any]) -> list[str]:
    """``summaries``: :class:`kit.doctor.rank_phase.RankSummary` (not imported: that module imports this one). The
    job check's lines (missing ranks, ranks taken from file order) and each trace warning once."""
    out = ([job.note()] if job.partial else []) + list(job.warnings)
    seen = set()
    for s in summaries:
        for w in s.warnings:
            if w not in seen:
                seen.add(w)
                out.append(f"{Path(s.path).name}: {w}" if Path(s.path).name not in w else w)
    return out


def group_notes(summaries: Sequence[Any]) -> list[str]:
    """Each capture note once (``summaries``: :class:`kit.doctor.rank_phase.RankSummary`): without a prefix when
    every rank has it, else with the ranks that do."""
    by_note: dict[str, list[int]] = {}
    for s in summaries:
        for n in s.notes:
            by_note.setdefault(n, []).append(int(s.rank))  # type: ignore[arg-type]
    out = []
    for n, ranks in by_note.items():
        if len(ranks) == len(summaries):
            out.append(n)
        else:
            out.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))}: {n}")
    return out


def missing_wait_notes(waits: dict, step_us: float | None, missing: Sequence[int]) -> list[str]:
    """The time the ranks given spun at collectives whose process group has ranks not given (``waits``: rank ->
    us per step, :meth:`kit.doctor.context.JobContext.waits_for_missing`; ``missing``: the job's ranks not given),
    said once: what they waited for lies on ranks the doctor cannot see. [] when none."""
    if not waits or max(waits.values()) <= 0:
        return []
    worst = max(waits, key=waits.__getitem__)
    share = f"; {100 * waits[worst] / step_us:.0f}% of the step" if step_us else ""
    who = f" ({', '.join(map(str, missing[:16]))}{' ...' if len(missing) > 16 else ''})" if missing else ""
    return [f"the ranks given spent up to {waits[worst] / 1e3:.2f} ms per step (rank {worst}{share}) in collectives "
            f"whose other ranks are not given{who}: waiting for them or transferring, which the traces given cannot "
            "tell apart -- what the job waits for there lies on those ranks; give every rank's trace"]

