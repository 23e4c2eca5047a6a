"""``diagnose(traces)``: run every rule over the rank traces of one job.

Two phases (see :mod:`kit.doctor.model` for why): per rank, in parallel (:func:`kit.traces.jobs.map_ranks`:
local processes, or a Dask cluster with ``client=``), :func:`rank_summary` parses the trace once and runs every
rule's ``extract``; then, on the caller, every rule's ``judge`` over the summaries of all ranks. A rank whose
trace cannot be read is named in ``Diagnosis.failed`` and the other ranks are still diagnosed.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from .context import JobContext
from .model import RULES, Diagnosis, Finding, RankView, Skip, severity
from .steps import INFERRED, find_steps, step_time


from ..traces.jobs import JobError  # noqa: E402  (the trace layer's one job check; re-exported by kit.doctor)


@dataclass(frozen=True)
class RankSummary:
    """What a worker sends back for one rank: identity, step facts, capture notes, each rule's summary."""

    path: str
    rank: int | None
    world_size: int | None
    step_us: float | None
    steps: int
    notes: tuple[str, ...]
    per_rule: dict[str, Any]
    """rule id -> extract's summary, or a Skip"""
    identity: Any = None
    """who the trace says it is (:class:`kit.traces.jobs.RankIdentity`): what the job check compares"""
    warnings: tuple[str, ...] = ()
    """what the trace layer dropped or doubted while reading it (:attr:`kit.traces.Trace.warnings`)"""
    account: Any = None
    """the rank's step accounting (:class:`kit.doctor.accounting.Account`), or a Skip saying why there is none"""
    span: tuple[float, float] | None = None
    """first and last GPU activity in Unix time (us: the header's ``baseTimeNanoseconds`` + the trace clock);
    None when the trace has no GPU activity or no base time. The ranks of one job are traced at the same time."""
    host_steps: Any = None
    """the rank's host model per step (:attr:`kit.doctor.host_model.HostModel.per_step`), None without one"""
    capture: dict | None = None
    """how :mod:`kit.capture` recorded the trace (its ``kitCapture`` header), None when it did not"""
    comm: Any = None
    """the rank's collectives (:class:`kit.doctor.collectives.Timeline`), None when they could not be read"""


def capture_notes(trace, steps) -> list[str]:
    """What the trace lacks for a full diagnosis, said as what to change in the capture (kit.capture does all)."""
    notes = []
    if trace.gpu.empty:
        notes.append("no GPU activity: profile with ProfilerActivity.CUDA (kit.capture does)")
    if steps.attrs.get(INFERRED):
        notes.append(f"no ProfilerStep annotations: {len(steps)} steps inferred from {steps.attrs[INFERRED]}; call "
                     f"prof.step() once per training step (kit.capture does) for exact step windows")
    elif steps.empty:
        notes.append("no ProfilerStep annotations: call prof.step() once per training step (kit.capture does); "
                     "costs are per traced span, not per step")
    if trace.info.rank is None:
        notes.append("no distributedInfo in the trace header: profile after init_process_group; ranks are "
                     "taken from the file names")
    nccl = trace.gpu[trace.gpu["nccl"]] if not trace.gpu.empty else trace.gpu
    if len(nccl) and nccl["in_nelems"].isna().all():
        rt = trace.cpu[trace.cpu["cat"] == "cuda_runtime"] if not trace.cpu.empty else trace.cpu
        replayed = len(rt) and rt["name"].astype(str).eq("cudaGraphLaunch").any() and not (
            trace.cpu["cat"].eq("cpu_op") & trace.cpu["name"].astype(str).str.startswith("c10d::")).any()
        notes.append("NCCL kernels carry no collective metadata: "
                     + ("they are replayed from CUDA graphs, whose kernels the profiler records without the "
                        "launching op's metadata" if replayed else "torch < 2.3, or the collectives ran outside "
                        "the recorded ops") + "; bytes and busbw are unknown")
    if trace.cpu.empty or not (trace.cpu["cat"] == "cuda_runtime").any():
        notes.append("no CUDA runtime events: host-side rules (launches, syncs, copies) cannot run")
    ops = trace.cpu[trace.cpu["cat"] == "cpu_op"] if not trace.cpu.empty else trace.cpu
    if len(ops) and "input_dims" in ops and ops["input_dims"].isna().all():
        notes.append("no input shapes on the CPU ops: profile with record_shapes=True (kit.capture does); "
                     "the sizes of collectives without NCCL metadata and of copies are unknown")
    from ..capture import capture_info  # the trace header's kitCapture, else the sidecar beside the file

    return notes + capture_facts_notes(capture_info(trace))


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


def rank_summary(path: str | Path) -> RankSummary:
    """The per-rank phase, in a worker (module-level, picklable): parse once -> steps -> the host model -> the
    step accounting -> the collectives timeline -> every rule's extract (each gets the same :class:`RankView`)."""
    from .. import traces
    from ..capture import capture_info
    from ..traces.jobs import rank_identity
    from ..traces.names import parse_name
    from . import rules  # noqa: F401  (registers the rules in this process)
    from .accounting import rank_account
    from .collectives import timeline
    from .host_model import host_model

    t = traces.load_trace(path)
    # a CPU-only job: the host model reads every CPU op (small traces)
    cpu_all = traces.load_trace(path, cpu="all").cpu if t.gpu.empty and not t.cpu.empty else None
    st = find_steps(t.cpu, cpu_all)
    rank = t.info.rank
    if rank is None:
        parsed = parse_name(Path(path).name)
        rank = parsed[1] if parsed else None
    view = RankView(trace=t, steps=st, rank=rank if rank is not None else -1)
    view = replace(view, step_us=step_time(view))  # the same memo: what step_time computed is shared
    name = Path(path).name
    host = _stage(lambda: host_model(view, cpu_all), "step_accounting", name)
    acct = host if isinstance(host, Skip) else _stage(lambda: rank_account(view, host, cpu_all), "step_accounting",
                                                      name)
    view = replace(view, host=host if not isinstance(host, Skip) else None, account=acct)
    comm = _stage(lambda: timeline(view), None, name)
    per_rule: dict[str, Any] = {rid: _stage(lambda: r.extract(view), rid, name) for rid, r in RULES.items()}
    base = t.header.get("baseTimeNanoseconds")
    span = None
    if isinstance(base, (int, float)) and not t.gpu.empty:
        span = (base / 1e3 + float(t.gpu["ts"].min()), base / 1e3 + float(t.gpu["end"].max()))
    return RankSummary(path=str(path), rank=rank, world_size=t.info.world_size, step_us=view.step_us,
                       steps=int(len(st)), notes=tuple(capture_notes(t, st)), per_rule=per_rule, span=span,
                       account=acct, identity=rank_identity(t, path),
                       warnings=tuple(getattr(t, "warnings", ()) or ()),
                       host_steps=view.host.per_step if view.host is not None else None,
                       capture=capture_info(t), comm=None if isinstance(comm, Skip) else comm)


def _stage(fn, rid: str | None, name: str):
    """``fn()``; a bug in it becomes a Skip (of rule ``rid``; None for a stage every rule reads) so that it does not
    lose the other rules' findings of this rank, unless ``KIT_DOCTOR_STRICT`` is set."""
    try:
        return fn()
    except Exception as e:
        if strict():
            raise
        return Skip(rid or "", f"internal error on {name} (a kit bug: please report it with the trace): "
                               f"{type(e).__name__}: {e}")


def check_one_job(summaries: Sequence[RankSummary]):
    """The trace layer's job check (:func:`kit.traces.jobs.check_job`) on the ranks read: raises JobError when they
    are not one job; returns the summaries with ranks filled in (file order where the traces say nothing) and the
    :class:`kit.traces.jobs.JobCheck` (which ranks of the world size are missing)."""
    from ..traces.jobs import check_job

    check = check_job([s.identity for s in summaries])
    filled = [replace(s, rank=i.rank) if s.rank != i.rank else s for s, i in zip(summaries, check.ranks)]
    return filled, check


CROSS_RANK = frozenset({"late_rank", "exposed_comm", "comm_compute_contention", "per_param_allreduce", "low_busbw"})
"""rules whose costs compare ranks (their evidence says 'partial' when ranks of the job are missing)"""


def job_notes(job, summaries: Sequence[RankSummary]) -> list[str]:
    """The job check's lines (missing ranks, ranks taken from file order) and each trace warning once."""
    out = ([job.note()] if job.partial else []) + list(job.warnings)
    seen = set()
    for s in summaries:
        for w in s.warnings:
            if w not in seen:
                seen.add(w)
                out.append(f"{Path(s.path).name}: {w}" if Path(s.path).name not in w else w)
    return out


def group_notes(summaries: Sequence[RankSummary]) -> list[str]:
    """Each capture note once: without a prefix when every rank has it, else with the ranks that do."""
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


def judge_all(summaries: Sequence[RankSummary], *, sweep=None, flight_recorder=None,
              only: Iterable[str] | None = None) -> tuple[list[Finding], list[str], list[Skip], JobContext]:
    """The cross-rank phase: every rule's judge over the per-rank summaries; findings ranked by cost."""
    from . import rules  # noqa: F401

    ranks = tuple(int(s.rank) for s in summaries)  # type: ignore[arg-type]
    step_times = [s.step_us for s in summaries if s.step_us]
    step_us = statistics.median(step_times) if step_times else None
    ctx = JobContext(ranks=ranks, step_us=step_us, steps=min((s.steps for s in summaries), default=0),
                     sweep=sweep, flight_recorder=flight_recorder, summaries={int(s.rank): s for s in summaries},
                     host_steps={int(s.rank): s.host_steps for s in summaries if s.host_steps is not None},
                     capture={int(s.rank): s.capture for s in summaries},
                     comm={int(s.rank): s.comm for s in summaries if s.comm is not None})
    findings: list[Finding] = []
    checked: list[str] = []
    skipped: list[Skip] = []
    partial: list[str] = []
    want = set(only) if only is not None else None
    for rid, r in RULES.items():
        if want is not None and rid not in want:
            continue
        if len(ranks) < r.needs_ranks:
            skipped.append(Skip(rid, f"needs traces of {r.needs_ranks}+ ranks of one job; got {len(ranks)}"))
            continue
        if r.needs_sweep and sweep is None:
            skipped.append(Skip(rid, "needs a collectives sweep of the same machine (--sweep RUN_DIR or "
                                     "nccl-tests output)"))
            continue
        got = [(int(s.rank), s.per_rule.get(rid)) for s in summaries]  # type: ignore[arg-type]
        skips = [v for _, v in got if isinstance(v, Skip)]
        usable = [(rk, v) for rk, v in got if not isinstance(v, Skip) and v is not None]
        if not usable:
            skipped.append(skips[0] if skips else Skip(rid, "no rank gave it anything to look at"))
            continue
        if skips:  # judged on the other ranks; said, never silently narrowed
            left = [rk for rk, v in got if isinstance(v, Skip)]
            partial.append(f"{rid} judged on {len(usable)} of {len(got)} ranks, not on rank(s) "
                           f"{', '.join(map(str, left[:16]))}{' ...' if len(left) > 16 else ''}: {skips[0].why}")
        try:
            out = r.judge(usable, ctx)
        except Exception as e:  # a bug in the rule: never hide the other rules' findings, never pass it silently
            if strict():
                raise
            skipped.append(Skip(rid, f"internal error in the rule (a kit bug: please report it with the traces): "
                                     f"{type(e).__name__}: {e}"))
            continue
        if isinstance(out, Skip):
            skipped.append(out)
            continue
        checked.append(rid)
        for f in out:
            f = capped(f, step_us)
            findings.append(replace(f, severity=severity(f.cost_us_per_step, step_us),
                                    notebook=f.notebook or r.notebook))
    accounts = [(int(s.rank), s.account) for s in summaries  # type: ignore[arg-type]
                if s.account is not None and not isinstance(s.account, Skip)]
    if accounts and want is None:
        from .rules.idle import explain_rest

        try:
            findings += explain_rest(accounts, findings, ctx)  # may also set signature rules' costs to their slice
        except Exception as e:
            if strict():
                raise
            skipped.append(Skip("step_accounting", f"internal error (a kit bug: please report it with the traces): "
                                                   f"{type(e).__name__}: {e}"))
        findings = [replace(g, severity=severity(g.cost_us_per_step, step_us)) for g in (capped(f, step_us) for f in findings)]
    findings.sort(key=lambda f: -(f.cost_us_per_step or 0))
    return findings, checked, skipped, replace(ctx, notes=tuple(partial))


def capped(f: Finding, step_us: float | None) -> Finding:
    """No finding costs more than a step: a cost measured on a rank whose step is longer than the job's median
    step is cut to the step, and the evidence says so."""
    if not step_us or f.cost_us_per_step <= step_us:
        return f
    return replace(f, cost_us_per_step=round(float(step_us), 1),
                   evidence={**f.evidence, "cost_capped_from_us": f.cost_us_per_step})


def strict() -> bool:
    """Rule errors raise instead of becoming a skip line (``KIT_DOCTOR_STRICT=1``; the tests set it)."""
    import os

    return os.environ.get("KIT_DOCTOR_STRICT", "") not in ("", "0")


def accounting_row(a, wait_us: float | None = None) -> dict[str, Any]:
    """One rank's account as plain JSON: the mode, windows, mean window and per slice us per step and share;
    ``comm_split``: the ``comm`` slice's waiting for peers (exposed, matched across ranks) and transfer, when the
    collectives could be matched."""
    from .accounting import SLICES

    row = {"mode": a.mode, "steps": a.steps, "window_us": round(a.window_us, 1),
           "step_us": round(a.step_us, 1) if a.step_us else None,
           "us_per_step": {s: round(a.cost(s), 1) for s in SLICES},
           "share": {s: round(a.share(s), 4) for s in SLICES}}
    if wait_us is not None:
        comm = a.cost("comm")
        scale = (a.step_us or a.window_us) / a.window_us if a.window_us else 1.0
        wait = min(comm, wait_us * scale)
        row["comm_split"] = {"waiting_us": round(wait, 1), "transfer_us": round(comm - wait, 1)}
    return row


FR_RANK = re.compile(r"rank[_-]?(\d+)")


def load_flight_recorder(paths: Iterable[str | Path]) -> "Any":
    """The rows of Flight Recorder dumps (:func:`kit.traces.fr_entries`), one JSON dump per rank (the rank from
    the file name, ``fr_run_rank0.json``, else the dump's order). A missing or unreadable file, or a pickled dump
    (never unpickled here: a pickle can run code), is a TraceError naming it."""
    import json

    import pandas as pd

    from ..traces import TraceError, fr_entries

    frames, bad = [], []
    for i, p in enumerate(Path(x) for x in paths):
        try:
            raw = p.read_bytes()
        except OSError as e:
            bad.append(f"{p}: cannot read ({e.strerror or e})")
            continue
        if raw[:2] == b"\x1f\x8b":  # gzipped (fr_rank0.json.gz)
            import gzip

            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as e:
                bad.append(f"{p}: a truncated or corrupt gzip file ({e})")
                continue
        if raw[:1] == b"\x80":
            bad.append(f"{p}: a pickled Flight Recorder dump; give the JSON one (TORCH_FR_DUMP as JSON, or "
                       f"json.dump(pickle.load(f)) where you trust the file)")
            continue
        try:
            dump = json.loads(raw.decode("utf-8", errors="replace"))
        except ValueError as e:
            bad.append(f"{p}: not JSON ({e})")
            continue
        if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
            bad.append(f"{p}: not a Flight Recorder dump (no 'entries' list)")
            continue
        m = FR_RANK.search(p.name)
        frames.append(fr_entries(dump, int(m.group(1)) if m else int(dump.get("rank", i))))
    if bad:
        raise TraceError("\n".join(bad))
    return pd.concat(frames, ignore_index=True) if frames else None


def diagnose(traces: Iterable[str | Path], *, sweep=None, flight_recorder=None, workers: int | None = None,
             client: Any = None, only: Iterable[str] | None = None) -> Diagnosis:
    """Diagnose one job from its rank traces (files, directories or globs: :func:`kit.traces.jobs.expand`).
    ``sweep``: a collectives sweep of the same machine (see :func:`kit.doctor.sweep.load_sweep`);
    ``workers``/``client``: local processes or a ``dask.distributed.Client`` for the per-rank phase.
    Raises TraceError when no trace can be read, JobError when the traces are not one job."""
    from ..traces import TraceError
    from ..traces.jobs import expand, map_ranks

    paths = expand(traces)
    res = map_ranks(paths, rank_summary, workers=workers, client=client)
    failed = [{"trace": str(f.path), "error": f.error} for f in res.failed]
    if not res.ok:
        raise TraceError("\n".join(f"{d['trace']}: {d['error']}" if not d["error"].startswith(d["trace"])
                                   else d["error"] for d in failed) or "no traces")
    summaries, job = check_one_job([s for _, s in res.ok])
    if sweep is not None and not hasattr(sweep, "columns"):
        from .sweep import load_sweep

        sweep = load_sweep(sweep)
    findings, checked, skipped, ctx = judge_all(summaries, sweep=sweep, flight_recorder=flight_recorder, only=only)
    if job.partial:  # a cross-rank cost read off some ranks of the job only
        findings = [replace(f, evidence={**f.evidence, "partial": job.note()}) if RULES[f.rule].needs_ranks > 1
                    or f.rule in CROSS_RANK else f for f in findings]
    fr = []
    if flight_recorder is not None and len(flight_recorder):
        from ..traces import fr_mismatches, fr_statements

        fr = fr_statements(fr_mismatches(flight_recorder)) or [
            f"{len(flight_recorder)} entries of {flight_recorder['rank'].nunique()} rank(s): every collective "
            f"reached by every rank, the same op at each sequence number"]
    from .rules.idle import comm_waits

    waits = comm_waits(ctx)
    accounting = {str(s.rank): accounting_row(s.account, waits.get(int(s.rank))) for s in summaries
                  if s.account is not None and not isinstance(s.account, Skip)}
    return Diagnosis(findings=findings, checked=checked, skipped=skipped, traces=[s.path for s in summaries],
                     accounting=accounting,
                     ranks=list(ctx.ranks), step_us=ctx.step_us, steps=ctx.steps, failed=failed,
                     notes=job_notes(job, summaries) + group_notes(summaries) + list(ctx.notes),
                     flight_recorder=fr, missing=list(job.missing), world_size=job.world_size,
                     **captured_on(summaries))


def captured_on(summaries: Sequence[RankSummary]) -> dict[str, Any]:
    """``devices`` (the GPU names the traces' headers give) and ``dates`` (UTC days their events span), for the
    report's captions: which hardware, when."""
    import datetime as dt

    ids = [s.identity for s in summaries if s.identity is not None]
    devices = sorted({i.device for i in ids if i.device})
    days = {dt.datetime.fromtimestamp(t / 1e6, dt.timezone.utc).strftime("%Y-%m-%d")
            for i in ids if i.span for t in i.span}
    return {"devices": devices, "dates": sorted(days)}
