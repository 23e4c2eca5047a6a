"""What every ``kit doctor`` answer must satisfy, on every trace set there is here: the committed ones under
``tests/data/doctor`` (always) and the public traces a developer fetched into ``.scratch/public/`` (skipped where
they are absent; ``KIT_PUBLIC_TRACES`` points elsewhere; see tests/data/public/README.md).

* a finding's cost is the step time it would save: an idle-slice finding costs at most the GPU idle time of its
  slices on each rank it names (the accounting's, net of nothing added);
* the costs said on one rank for one step never sum above that step; a cost stated net of the profiler, never above
  the step without it (measured, or the longest an estimate allows: REVIEW_S12 H3; for late_rank, the late rank's
  overhead as the diagnosis reports it, not the rule's own step_bound: REVIEW_S12b N3), and above the estimate's
  point value only with the range said (N3/N6), and then at most the point cap or the range's low end, whichever is
  larger (REVIEW_S13 L1);
* one cost per finding (a finite number >= 0) and one sentence (no line break);
* one-time start-up work is not a per-step cause (the public traces that hold it, below).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import diagnosed
from kit.doctor import RULES, diagnose
from kit.doctor.overhead import ESTIMATE_RANGE
from kit.traces import TraceError
from kit.traces.jobs import expand
from kit.traces.names import parse_name

ROOT = Path(__file__).resolve().parents[1]
DOCTOR = ROOT / "tests" / "data" / "doctor"
PUBLIC = Path(os.environ.get("KIT_PUBLIC_TRACES") or ROOT / ".scratch" / "public")
TOLERANCE = 1.01
"""costs are rounded to 0.1 us and shares to 4 digits: 1% over is rounding, more is a wrong cost"""

def jobs(top: Path) -> list[tuple[str, list[str]]]:
    """The jobs under ``top``: per folder, its rank traces (:func:`kit.traces.jobs.expand`, the doctor's own
    reading of a folder), one job per folder -- tensorboard_trace_handler names (``<host>_<pid>.<stamp>.pt.trace
    .json.gz``) carry the rank only inside the trace -- except where the kit's names tell several jobs apart by
    their tags (``trace_<tags>_rank<r>``); a group in which two files claim one rank (two captures of one worker)
    is one job per file."""
    out = []
    for d in sorted({p.parent for p in top.rglob("*.json*") if p.is_file()}):
        try:
            files = expand(d)
        except TraceError:
            continue
        groups: dict[tuple, list[Path]] = defaultdict(list)
        for p in files:
            parsed = parse_name(p.name)
            tags = {k: v for k, v in parsed[0].items() if k != "worker"} if parsed else {}
            groups[tuple(sorted(tags.items()))].append(p)
        for files in groups.values():
            ranks = [r for r in ((parse_name(p.name) or ({}, None))[1] for p in files) if r is not None]
            split = len(ranks) != len(set(ranks))
            for part in ([[p] for p in files] if split else [files]):
                name = str(part[0].relative_to(top) if split or len(groups) > 1 else d.relative_to(top))
                out.append((name, [str(p) for p in part]))
    return out


def committed() -> list:
    return [pytest.param(files, id=f"doctor/{name}") for name, files in jobs(DOCTOR)]


def public() -> list:
    if not PUBLIC.is_dir():
        return [pytest.param(None, id="public", marks=pytest.mark.skip(
            reason=f"public traces not fetched here ({PUBLIC}; see tests/data/public/README.md)"))]
    return [pytest.param(files, id=f"public/{name}") for name, files in jobs(PUBLIC)]


def rank_costs(f) -> dict[int, float]:
    """The finding's cost on each rank it names: its per-rank costs where it gives them, else its one cost; a rank
    its per-rank evidence leaves out (a job-level finding's waiting ranks) is charged nothing."""
    per = f.evidence.get("per_rank") if isinstance(f.evidence, dict) else None
    out = {}
    for r in f.ranks:
        if isinstance(per, dict) and str(r) not in per:
            continue
        n = per.get(str(r)) if isinstance(per, dict) else None
        c = n.get("cost_us_per_step") if isinstance(n, dict) else None
        out[r] = float(c) if c is not None else float(f.cost_us_per_step)
    return out


def unprofiled_bound(ev: dict) -> float | None:
    """The step without the profiler that a cost stated net of it must stay under, where the evidence has one: a
    finding whose evidence has the profiler's overhead, its measured ``unprofiled_step_us``, or an estimate's high end
    (its traced step less the estimated overhead over :data:`kit.doctor.overhead.ESTIMATE_RANGE`: the estimate may be
    that much too large). late_rank's own ``step_bound`` is not read here (the rule caps itself by it): its bound is
    :func:`rank_bound`'s."""
    if ev.get("unprofiled_step_us") is None:
        return None
    if ev.get("basis") == "measured":
        return float(ev["unprofiled_step_us"])
    traced, over = ev.get("traced_step_us"), ev.get("profiler_overhead_us")
    if ev.get("basis") == "estimated" and traced is not None and over is not None:
        return max(float(traced) - float(over) / ESTIMATE_RANGE, float(ev["unprofiled_step_us"]))
    return None


RANGE_SAID = ("tracer_price_range", "cost_range_us", "cost_at_tracer_full_price_us")
"""evidence keys of a cost stated with the range of the price it is net of (REVIEW_S12b N3/N6): a cost above the
point-estimated step without the profiler is allowed only with one of them"""


def point_range(ev: dict) -> tuple[float, float] | None:
    """A ranged cost's point cap and the low end of its range, from the evidence (late_rank's ``tracer_price_range``,
    the accounting slices' ``point_cap_us`` and ``cost_range_us``); None where the evidence has no ranged cost."""
    r = ev.get("tracer_price_range")
    if isinstance(r, dict) and r.get("point_cap_us") is not None:
        return float(r["point_cap_us"]), float(min(r["cost_at_whole_price_us"], r["cost_at_low_end_us"]))
    if ev.get("point_cap_us") is not None and ev.get("cost_range_us"):
        return float(ev["point_cap_us"]), float(min(ev["cost_range_us"]))
    return None


def rank_bound(d, f) -> tuple[float, float] | None:
    """A one-rank finding's step without the profiler, from that rank's overhead as the diagnosis reports it
    (``Diagnosis.overhead``, not the finding's evidence): (the longest it can be, ``unprofiled_high_us``; its point
    value, ``unprofiled_step_us``). None where the rank has no overhead with an unprofiled step."""
    if len(f.ranks) != 1:
        return None
    o = (getattr(d, "overhead", None) or {}).get(f.ranks[0])
    if o is None or o.basis == "none" or o.unprofiled_step_us is None:
        return None
    return float(o.unprofiled_high_us), float(o.unprofiled_step_us)


def check(d) -> None:
    """The invariants of the module docstring on one diagnosis."""
    total: dict[int, float] = defaultdict(float)
    for f in d.findings:
        assert isinstance(f.cost_us_per_step, float | int) and math.isfinite(f.cost_us_per_step), f.rule
        assert f.cost_us_per_step >= 0, f"{f.rule}: negative cost {f.cost_us_per_step}"
        assert "\n" not in f.summary, f"{f.rule}: more than one line: {f.summary!r}"
        if d.step_us:
            assert f.cost_us_per_step <= d.step_us * TOLERANCE, f"{f.rule} costs more than a step"
        sb = f.evidence.get("step_bound") if isinstance(f.evidence, dict) else None
        if isinstance(sb, dict) and sb.get("cap_us") is not None and sb.get("unprofiled_step_us") is not None:
            assert 0 <= sb["cap_us"] <= sb["unprofiled_step_us"] + 1.0, f"{f.rule}: step_bound {sb}"
        u = unprofiled_bound(f.evidence) if isinstance(f.evidence, dict) else None
        if u is not None:
            assert f.cost_us_per_step <= u * TOLERANCE + 1.0, (
                f"{f.rule} costs {f.cost_us_per_step:.0f} us per step net of the profiler, more than the step without "
                f"it ({u:.0f} us)")
        point = f.evidence.get("unprofiled_step_us") if isinstance(f.evidence, dict) else None
        rb = rank_bound(d, f) if f.rule == "late_rank" else None
        if rb is not None:
            assert f.cost_us_per_step <= rb[0] * TOLERANCE + 1.0, (
                f"late_rank {f.ranks} costs {f.cost_us_per_step:.0f} us per step, more than that rank's step without "
                f"the profiler can be ({rb[0]:.0f} us)")
            point = rb[1]
        if point is not None and f.cost_us_per_step > float(point) * TOLERANCE + 1.0:
            assert any(k in f.evidence for k in RANGE_SAID), (
                f"{f.rule} costs {f.cost_us_per_step:.0f} us per step, more than the step without the profiler at the "
                f"estimate's point value ({float(point):.0f} us), with no range said")
        ranged = point_range(f.evidence) if isinstance(f.evidence, dict) else None
        if ranged is not None:  # a ranged cost: at most the point cap, or the range's low end where that is above it
            cap, low = ranged
            assert f.cost_us_per_step <= max(cap, low) * TOLERANCE + 1.0, (
                f"{f.rule} costs {f.cost_us_per_step:.0f} us per step with a range said, above both its point cap "
                f"({cap:.0f} us) and the range's low end ({low:.0f} us)")
        r = RULES.get(f.rule)
        for rk, c in rank_costs(f).items():
            total[rk] += c
            a = d.accounting.get(str(rk))
            if a is None or r is None or r.explains is None:
                continue
            idle = sum(a["us_per_step"].get(s, 0.0) for s in r.explains.slices)
            assert c <= idle * TOLERANCE + 1.0, (
                f"{f.rule} on rank {rk} costs {c:.1f} us per step, more than the GPU idle of its slices "
                f"{r.explains.slices} ({idle:.1f} us)")
    for rk, c in total.items():
        a = d.accounting.get(str(rk))
        step = max(d.step_us or 0.0, (a or {}).get("step_us") or 0.0)
        if step:
            assert c <= step * TOLERANCE, (
                f"rank {rk}: the findings' costs sum to {c:.0f} us per step, {c / step:.0%} of its {step:.0f} us step: "
                + ", ".join(f"{f.rule} {rank_costs(f).get(rk, 0):.0f}" for f in d.findings if rk in f.ranks))


@pytest.mark.parametrize("files", committed())
def test_costs_add_up_on_every_committed_trace_set(files):
    check(diagnosed(files))


@pytest.mark.parametrize("files", public())
def test_costs_add_up_on_every_public_trace_set(files):
    check(diagnose(files, workers=1))


# ------------------------------------------------------------------------------ one-time work, public traces
def _public(rel: str) -> Path:
    p = PUBLIC / rel
    if not p.exists():
        pytest.skip(f"public trace {rel} not fetched here (see tests/data/public/README.md)")
    return p


def _costs(d) -> dict[str, float]:
    return {f.rule: f.cost_us_per_step for f in d.findings}


def test_start_up_in_a_trace_without_steps_is_left_out():
    """HTA's critical_path/alexnet: the first forward holds CUDA start-up (a 6.0 s cudaFree in the first
    convolution, a 3.1 s cudaLaunchKernel); the doctor diagnoses the span after it and says so."""
    d = diagnose([_public("hta/alexnet")], workers=1)
    assert any("one-time start-up left out" in n for n in d.notes)
    assert d.step_us < 1e6  # not the 12.9 s of the whole traced GPU span
    assert all(f.cost_us_per_step < 0.5 * d.step_us for f in d.findings)


def test_a_first_step_of_start_up_is_not_a_step():
    """param's resnet_kineto (no ProfilerStep; 30 steps inferred): the first is 4.5 s of start-up (DataLoader
    workers starting, cuDNN's first allocations) against ~0.16 s for the others."""
    d = diagnose([_public("param_resnet/resnet_kineto.json.gz")], workers=1)
    assert d.steps == 29 and any("left out as one-time start-up" in n for n in d.notes)
    assert "allocator_churn" not in _costs(d)
    assert _costs(d).get("pageable_h2d", 0.0) < 0.01 * d.step_us  # the GPU runs the copies while the host blocks
    assert max(d.findings, key=lambda f: f.cost_us_per_step).rule == "input_bound"


def test_the_profilers_stop_in_the_last_step_is_not_a_host_stall():
    """kineto's ResNet50 sample (num_workers=4): the last ProfilerStep runs 85 ms past its last launch, into the
    profiler's stop."""
    d = diagnose([_public("kineto4/worker0.1623213129365.pt.trace.json.gz")], workers=1)
    assert any("the profiler's own stop" in n for n in d.notes)
    assert _costs(d).get("host_stall", 0.0) < 0.02 * d.step_us


def test_work_queued_before_the_trace_is_not_unexplained_idle():
    """param's 8-rank DLRM: on ranks 1 and 3 the trace opens on the previous step's optimizer kernels (issued before
    the trace); before them the GPU's state is not known, so it is not idle time that needs a cause."""
    d = diagnose([_public("param_dlrm/dlrm_kineto")], workers=1)
    assert "unexplained_idle" not in _costs(d)
    f = next(f for f in d.findings if f.rule == "input_bound")
    assert 3 in f.ranks


# ------------------------------------------------------------------------------ one-time work, planted timelines
def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _work(corr, ts, dur=500):
    """A launch at ``ts`` and its kernel 10 us later."""
    return [_x("cudaLaunchKernel", "cuda_runtime", ts, 8, correlation=corr),
            _x(f"k{corr}", "kernel", ts + 10, dur, tid=7, device=0, stream=7, correlation=corr)]


def _steps(events):
    from kit import traces
    from kit.doctor.steps import find_steps

    t = traces.from_dict({"schemaVersion": 1, "traceEvents": events})
    return find_steps(t.cpu, None, t.gpu)


def test_a_first_step_many_times_the_others_is_start_up():
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 40_000)] + _work(1, 35_000)
    for i, t0 in enumerate((40_000, 44_000, 48_000, 52_000), start=2):
        ev += [_x(f"ProfilerStep#{i}", "user_annotation", t0, 4_000)] + _work(i, t0 + 100)
    st = _steps(ev)
    assert list(st["step"]) == [2, 3, 4, 5] and "step 1 left out as one-time start-up" in st.attrs["left_out"]


def test_a_first_step_holding_a_start_up_call_is_start_up():
    """A 200 ms cudaFree with the GPU idle (a context or a library loading) marks the step as start-up, whatever its
    length against the others; one that waits for a busy GPU does not."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 300_000), _x("cudaFree", "cuda_runtime", 1_000, 200_000)]
    ev += _work(1, 250_000)
    for i, t0 in enumerate((300_000, 500_000), start=2):
        ev += [_x(f"ProfilerStep#{i}", "user_annotation", t0, 200_000)] + _work(i, t0 + 100)
    st = _steps(ev)
    assert list(st["step"]) == [2, 3] and "cudaFree 0.20 s" in st.attrs["left_out"]
    busy = [e for e in ev if e["name"] != "k1"] + [_x("k1", "kernel", 500, 250_000, tid=7, device=0, stream=7,
                                                        correlation=1)]
    assert list(_steps(busy)["step"]) == [1, 2, 3]


def test_the_profilers_stop_is_cut_from_the_last_step():
    ev = []
    for i, t0 in enumerate((0, 4_000, 8_000, 12_000), start=1):
        ev += [_x(f"ProfilerStep#{i}", "user_annotation", t0, 4_000 if i < 4 else 12_000)] + _work(i, t0 + 100)
    st = _steps(ev)
    assert st["dur"].iloc[-1] == pytest.approx(4_000) and "the profiler's own stop" in st.attrs["left_out"]
    assert list(st["dur"].iloc[:-1]) == [4_000, 4_000, 4_000]


def test_without_steps_the_span_after_start_up_is_the_step():
    ev = _work(1, 0) + [_x("cudaFree", "cuda_runtime", 1_000, 500_000)] + _work(2, 502_000) + _work(3, 503_000)
    st = _steps(ev)
    assert st.attrs.get("span") and list(st["step"]) == [-1]
    assert st["ts"].iloc[0] == pytest.approx(501_000) and "one-time start-up left out" in st.attrs["left_out"]
    assert _steps(_work(1, 0) + _work(2, 1_000)).empty  # nothing to leave out: the traced span stays the step


def _loop(first_us: float) -> list:
    """4 iterations of a loop traced without ProfilerStep: a DataLoader request, a kernel, an optimizer step; the
    first iteration ``first_us`` long, the others 5 ms."""
    nxt, opt = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "Optimizer.step#SGD.step"
    ev, t0 = [], 0.0
    for i, d in enumerate((first_us, 5_000, 5_000, 5_000)):
        ev += [_x(nxt, "user_annotation", t0, 1_000), _x(opt, "user_annotation", t0 + d - 500, 400)]
        ev += _work(i + 1, t0 + d - 2_000, dur=2_500)
        t0 += d
    return ev


def test_without_a_schedule_the_first_inferred_step_is_the_profilers_warm_up():
    """No ProfilerStep (the profiler never stepped: no schedule, no warm-up): the first of 3+ steps inferred from
    the DataLoader requests, when longer than the others by more than their spread, is the profiler's warm-up and left
    out; its GPU work that runs into the next step is not that step's (the window starts where it ends)."""
    from kit import traces
    from kit.doctor.model import RankView
    from kit.doctor.steps import rank_windows

    ev = _loop(7_000)
    st = _steps(ev)
    assert list(st["step"]) == [1, 2, 3] and "left out as the profiler's warm-up" in st.attrs["left_out"]
    win = rank_windows(RankView(trace=traces.from_dict({"schemaVersion": 1, "traceEvents": ev}), steps=st, rank=0))
    assert win["start"].iloc[0] == pytest.approx(5_000 + 10 + 2_500)  # the left-out step's kernel ends in step 1
    assert list(_steps(_loop(5_000))["step"]) == [0, 1, 2, 3]  # a first step no longer than the others stays
    # nor one longer within the others' spread: two traces of one loop keep or drop it alike (STEP_SPREAD)
    from kit.doctor.steps import STEP_SPREAD
    assert list(_steps(_loop(5_000 * (1 + STEP_SPREAD / 2)))["step"]) == [0, 1, 2, 3]
