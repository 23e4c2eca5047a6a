"""kit.doctor.overhead: the profiler's own overhead in a traced step -- measured from the unprofiled steps kit.capture
times before its window, else estimated from the recorded events per step and the per-event cost table that
benchmarks/bench_profiler_overhead.py recorded (recorded/profiler_overhead/)."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import pytest

from kit import capture
from kit.doctor import overhead as ov

DATA = Path(__file__).resolve().parent / "data" / "doctor"
CORPUS = DATA / "corpus"


def test_measured_where_kit_capture_timed_the_steps(tmp_path):
    """A loop whose step is a 3 ms sleep plus 200 small ops: kit.capture times 5 steps unprofiled; the overhead is
    the traced step minus their median, and both are what the header and the step windows say."""
    import torch

    x = torch.ones(8)

    def step():
        time.sleep(0.003)
        for _ in range(200):
            x.add(1)

    for attempt in range(3):  # on a loaded box the 5 samples can be too noisy to carry the overhead
        # (ov.unmeasurable: then it is estimated and the note says why); tests/test_overhead_basis.py tests that path
        cap = capture.profile_steps(step, steps=20, out_dir=tmp_path / str(attempt), wait=1, warmup=1, active=3)
        o = ov.overhead(cap.paths[0])
        if o.basis == "measured":
            break
        assert o.basis == "estimated" and o.note
    samples = capture.capture_info(cap.paths[0])["unprofiled_step_us"]
    assert o.basis == "measured" and len(samples) == 5
    assert o.unprofiled_step_us == pytest.approx(statistics.median(samples))
    assert o.traced_step_us >= 3000 and o.unprofiled_step_us >= 3000
    assert o.overhead_us == pytest.approx(max(0.0, o.traced_step_us - o.unprofiled_step_us))
    assert "5 steps kit.capture timed" in o.how and "perf_counter" in o.how
    assert o.net(o.overhead_us + 100.0) == pytest.approx(100.0) and o.net(0.0) == 0.0


@pytest.mark.skipif(not (CORPUS / "cpu-cnn-control").exists(), reason="corpus not here")
def test_estimated_from_the_cpu_table_on_a_trace_without_timing():
    """corpus/cpu-cnn-control was recorded before kit.capture timed steps: the estimate counts its ops per step
    (a CPU-only trace is read with every op) and prices them with the CPU table, record_shapes from its header."""
    trace = next((CORPUS / "cpu-cnn-control").glob("trace_rank*.json.gz"))
    o = ov.overhead(trace)
    assert o.basis == "estimated" and "every recorded op counted" in o.how and "record_shapes=True" in o.how
    _, row = ov.pick(None, False, True, False)
    ops = float(o.how.split(" ops")[0].split()[-1])
    assert ops > 500  # the CNN's forward, backward and optimizer: hundreds of aten ops per step
    assert o.overhead_us == pytest.approx(ops * row["us_per_op"], rel=0.01, abs=2.0)
    assert o.unprofiled_step_us == pytest.approx(o.traced_step_us - o.overhead_us)


@pytest.mark.skipif(not (CORPUS / "gpt-control").exists(), reason="corpus not here")
def test_no_table_says_so(tmp_path):
    trace = next((CORPUS / "gpt-control").glob("*.pt.trace.json.gz"))
    o = ov.overhead(trace, root=tmp_path)
    assert o.basis == "none" and o.overhead_us == 0.0 and "bench_profiler_overhead" in o.how
    assert o.traced_step_us > 0 and o.unprofiled_step_us is None


def test_table_choice(tmp_path):
    def table(name, device):
        (tmp_path / name).write_text(json.dumps({"machine": {"device": device}, "settings": [
            {"cuda": device != "cpu", "record_shapes": False, "with_stack": False, "us_per_op": 1.0,
             "us_per_runtime": 2.0}]}))

    table("a-cpu.json", "cpu")
    table("b-h100.json", "NVIDIA H100 80GB HBM3")
    table("c-h200.json", "NVIDIA H200")
    root = str(tmp_path)
    ov.tables.cache_clear()
    assert ov.pick("NVIDIA H100 80GB HBM3", True, False, False, root=root)[0]["file"] == "b-h100.json"
    assert ov.pick("NVIDIA A100", True, False, False, root=root)[0]["file"] in ("b-h100.json", "c-h200.json")
    assert ov.pick(None, False, False, False, root=root)[0]["file"] == "a-cpu.json"
    ov.tables.cache_clear()


@pytest.mark.skipif(not (CORPUS / "cnn-launch_bound").exists(), reason="corpus not here")
def test_launch_costs_are_stated_net_of_the_profiler():
    """reconcile takes the profiler's overhead off a finding that explains the launch slice (and only such a
    finding), with the traced cost and the overhead's numbers and basis in its evidence; the note says it."""
    from kit.doctor import diagnose
    from kit.doctor.finalize import profiler_notes
    from kit.doctor.reconcile import net_of_profiler

    d = diagnose(sorted((CORPUS / "cnn-launch_bound").glob("*.json.gz")), workers=1)
    f = next(f for f in d.findings if f.rule == "launch_bound")
    o = ov.ProfilerOverhead(d.step_us, d.step_us - 1000.0, 1000.0, "measured", "a test")
    g = net_of_profiler(f, {0: o})
    assert g.cost_us_per_step == pytest.approx(f.cost_us_per_step - 1000.0, abs=0.1)
    assert g.evidence["cost_traced_us_per_step"] == f.cost_us_per_step and g.evidence["basis"] == "measured"
    assert g.evidence["profiler_overhead_us"] == 1000.0
    other = next(x for x in d.findings if x.rule != "launch_bound")
    assert net_of_profiler(other, {0: o}) is other
    assert net_of_profiler(f, {0: ov.ProfilerOverhead(None, None, 0.0, "none", "")}) is f
    assert "without the profiler (measured" in profiler_notes({0: o})[0]


@pytest.mark.skipif(not (CORPUS / "cnn-control").exists(), reason="corpus not here")
def test_the_all_clear_guard_judges_the_same_costs_the_findings_state():
    """The guard behind an all-clear (reconcile.must_speak) judges the GPU's idle net of the profiler, as the
    findings' costs are stated: cnn-control's GPU idles 11.4% of the traced step, most of it the host issuing
    (launch); with no overhead the guard speaks for that slice at its traced cost, with the launch slice's worth of
    overhead it stays silent (the idle left is below the guard), and a diagnosis grades each finding once, on the
    cost it states."""
    from dataclasses import replace

    from kit.doctor import diagnose
    from kit.doctor.accounting import IDLE
    from kit.doctor.job_phase import check_one_job, job_context
    from kit.doctor.model import severity
    from kit.doctor.rank_phase import rank_summary
    from kit.doctor.reconcile import MUST_SPEAK, must_speak, net_costs

    paths = sorted((CORPUS / "cnn-control").glob("*.json.gz"))
    summaries, _ = check_one_job([rank_summary(p) for p in paths])
    ctx = job_context(summaries)
    accounts = [(int(s.rank), s.account) for s in summaries]
    (rk, a), = accounts
    step = a.step_us or a.window_us
    idle = sum(a.cost(s) for s in IDLE) / step
    assert idle >= MUST_SPEAK > (sum(a.cost(s) for s in IDLE) - a.cost("launch")) / step
    said, = must_speak(accounts, [], replace(ctx, overhead=None))
    assert said.rule == "launch_bound" and said.cost_us_per_step == pytest.approx(a.cost("launch"), abs=0.1)
    o = ov.ProfilerOverhead(step, step - a.cost("launch"), a.cost("launch"), "measured", "a test")
    assert net_costs(a, o)["launch"] == 0.0
    assert must_speak(accounts, [], replace(ctx, overhead={rk: o})) == []
    half = ov.ProfilerOverhead(step, step - 100.0, 100.0, "measured", "a test")
    said, = must_speak(accounts, [], replace(ctx, overhead={rk: half}))
    assert said.cost_us_per_step == pytest.approx(a.cost("launch") - 100.0, abs=0.1)
    assert said.evidence["cost_traced_us_per_step"] == pytest.approx(a.cost("launch"), abs=0.1)

    d = diagnose(paths, workers=1)
    assert all(f.severity == severity(f.cost_us_per_step, d.step_us) for f in d.findings)


H2_CNN_CONTROL = CORPUS.parent / "corpus-h100x2" / "cnn-ddp-fp32-control"


@pytest.mark.skipif(not H2_CNN_CONTROL.exists(), reason="corpus not here")
def test_input_costs_are_net_of_the_profilers_ops_inside_the_dataloader():
    """A DataLoader in the main process records every sample's indexing, the collate and the pinning inside its
    next() (590 of the 1398 aten ops of a step of the 2-GPU CNN control): that share of the overhead lands in the
    input slice, and so does the GPU's idle while the host caught up after the wait (the queue-drain debt, issued at
    the profiler's pace). input_bound is stated net of both on its rank, whatever the launch slice holds; launch takes
    what is left."""
    from kit.doctor import diagnose
    from kit.doctor.rank_phase import rank_summary

    paths = sorted(H2_CNN_CONTROL.glob("*.json.gz"))
    d = diagnose(paths, workers=1)
    f = next(x for x in d.findings if x.rule == "input_bound")
    ev = f.evidence
    rk = ev["rank"]
    a = {int(k): v for k, v in d.accounting.items()}[rk]
    s = next(x for x in map(rank_summary, paths) if x.rank == rk)
    caught = s.account.caught_up_cost("input")
    assert caught > 0 and ev["profiler_in_catch_up_us"] == pytest.approx(
        ev["profiler_overhead_left_us"] - ev["profiler_in_data_wait_us"], abs=0.2)
    assert ev["profiler_overhead_left_us"] == pytest.approx(
        min(ev["profiler_overhead_us"], ev["profiler_in_data_wait_us"] + caught), abs=5.0)
    assert f.cost_us_per_step == max(0.0, round(ev["cost_traced_us_per_step"] - ev["profiler_overhead_left_us"], 1))
    assert "recorded inside the DataLoader's waits" in f.summary and f"{f.cost_us_per_step / 1e3:.2f} ms" in f.summary
    launch = next(x for x in d.findings if x.rule == "launch_bound")  # the overhead the input slice did not take
    took = min(a["share"]["input"] * a["step_us"], ev["profiler_overhead_left_us"])
    assert launch.evidence["profiler_overhead_left_us"] == pytest.approx(ev["profiler_overhead_us"] - took, abs=5.0)
    s = rank_summary(paths[0])
    assert s.overhead.data_wait_us / s.overhead.host_us == pytest.approx(590 / 1398, abs=0.02)


def test_an_input_wait_without_the_profilers_ops_is_not_netted():
    """A loader fed by worker processes records nothing of its work in the main process's next(): no part of the
    overhead lands there (data_wait_us 0 or unknown), and input_bound keeps its traced cost."""
    import kit.doctor.rules  # noqa: F401 -- registers the rules whose slices net_of_profiler looks up
    from kit.doctor.model import Finding
    from kit.doctor.reconcile import net_of_profiler

    f = Finding(rule="input_bound", cost_us_per_step=1000.0, ranks=(0,), evidence={"rank": 0}, summary="s",
                cause="c", fix="f")
    acct = type("A", (), {"cost": lambda self, s: 200.0, "caught_up_cost": lambda self, s: 0.0})()
    for part in (None, 0.0):
        o = ov.ProfilerOverhead(5000.0, 4000.0, 1000.0, "estimated", "a test", data_wait_us=part)
        assert net_of_profiler(f, {0: o}, {0: acct}) is f
    o = ov.ProfilerOverhead(5000.0, 4000.0, 1000.0, "estimated", "a test", data_wait_us=300.0)
    assert net_of_profiler(f, {0: o}, {0: acct}).cost_us_per_step == pytest.approx(700.0)  # min(300, 1000)
    assert net_of_profiler(f, {0: o}).cost_us_per_step == pytest.approx(700.0)  # the first slice: no account needed
    launch = Finding(rule="launch_bound", cost_us_per_step=1000.0, ranks=(0,), evidence={"rank": 0}, summary="s",
                     cause="c", fix="f")
    assert net_of_profiler(launch, {0: o}, {0: acct}).cost_us_per_step == pytest.approx(200.0)  # 1000 - (1000 - 200)
    assert net_of_profiler(launch, {0: o}) is launch  # without the rank's account: what input took is unknown


def test_the_catch_up_after_a_wait_is_netted_as_issuing():
    """The GPU's idle while the host caught up after a DataLoader wait that drained it (the queue-drain debt: in the
    input slice) was issued at the profiler's pace: input takes the overhead up to the part recorded inside the waits
    plus that catch-up; launch takes what is left."""
    from kit.doctor.model import Finding
    from kit.doctor.reconcile import net_costs, net_of_profiler

    class Acct:
        def cost(self, s):
            return {"input": 3000.0, "launch": 1000.0}.get(s, 0.0)

        def caught_up_cost(self, s):
            return 1500.0 if s == "input" else 0.0

    def finding(rule):
        return Finding(rule=rule, cost_us_per_step=Acct().cost(rule.split("_")[0]), ranks=(0,), evidence={"rank": 0},
                       summary="s", cause="c", fix="f")

    o = ov.ProfilerOverhead(9000.0, 5000.0, 4000.0, "estimated", "a test", data_wait_us=1000.0)
    got = net_of_profiler(finding("input_bound"), {0: o}, {0: Acct()})
    assert got.cost_us_per_step == pytest.approx(500.0)  # 3000 - (1000 inside the waits + 1500 caught up)
    assert got.evidence["profiler_in_catch_up_us"] == pytest.approx(1500.0)
    assert net_of_profiler(finding("launch_bound"), {0: o}, {0: Acct()}).cost_us_per_step == 0.0  # 1000 - 1500
    assert net_costs(Acct(), o)["input"] == pytest.approx(500.0)
    small = ov.ProfilerOverhead(7000.0, 5000.0, 2000.0, "estimated", "a test", data_wait_us=1000.0)
    assert net_of_profiler(finding("input_bound"), {0: small}, {0: Acct()}).cost_us_per_step == pytest.approx(1000.0)


def test_the_job_floor_counts_a_gpus_own_kernels_not_its_transfer():
    """No rank steps faster than the GPU with the most work of its own: its busy time less its collectives' waiting,
    at most its non-NCCL kernels' own time (a transfer that overlaps the backward without the profiler is no floor);
    measured overheads are left as they are."""
    import pandas as pd

    def est(host=8000.0, traced=16000.0):
        return ov.ProfilerOverhead(traced, traced - host, host, "estimated", "a test", host_us=host)

    def ps(busy, kernels):
        return pd.DataFrame({"step": [1, 2, 3], "gpu_busy_us": [busy] * 3, "gpu_kernels_us": [kernels] * 3})

    steps = {0: ps(15800.0, 9900.0), 1: ps(15100.0, 10300.0), 2: ps(10000.0, 9800.0)}
    got = ov.job_floor({0: est(), 1: est(), 2: est()}, {0: 5400.0, 1: 3900.0, 2: 0.0}, steps)
    # rank 1: busy less waiting 11200 us, its kernels 10300: the floor is 10300 (rank 0: min(10400, 9900))
    assert {r: o.unprofiled_step_us for r, o in got.items()} == {0: 10300.0, 1: 10300.0, 2: 10300.0}
    assert all(o.overhead_us == 5700.0 and "rank 1: 10300 us" in o.how for o in got.values())
    m = ov.ProfilerOverhead(16000.0, 9000.0, 7000.0, "measured", "a test")
    got = ov.job_floor({0: m, 1: est()}, {}, steps)
    assert got[0].overhead_us == 7000.0 and got[0].unprofiled_step_us == 9000.0 and got[0].own_work_us == 10300.0


def test_a_measured_jobs_launch_gain_is_at_most_its_unprofiled_step_less_the_busiest_gpus_work():
    """A measured overhead stays as measured; in a job of several ranks it gets the job floor as a cap: were every
    host instant, the job would still take its busiest GPU's own work (rank 1: busy less waiting 9800 us, its
    kernels 8950), so a launch-bound cost net of the profiler is at most 10750 - 8950 = 1800 us."""
    import pandas as pd

    from kit.doctor.model import Finding
    from kit.doctor.reconcile import net_costs, net_of_profiler
    import kit.doctor.rules  # noqa: F401 -- registers the rules whose slices net_of_profiler looks up

    def ps(busy, kernels):
        return pd.DataFrame({"step": [1, 2, 3], "gpu_busy_us": [busy] * 3, "gpu_kernels_us": [kernels] * 3})

    m = ov.ProfilerOverhead(18150.0, 10750.0, 7400.0, "measured", "a test")
    got = ov.job_floor({0: m, 1: m}, {0: 200.0, 1: 600.0}, {0: ps(2500.0, 2100.0), 1: ps(10400.0, 8950.0)})
    assert all(o.gain_cap_us == pytest.approx(1800.0) and o.overhead_us == 7400.0 for o in got.values())
    f = Finding("launch_bound", 14740.0, (0, 1), {}, "the GPU sat idle 14.74 ms per step", "c", "f")
    g = net_of_profiler(f, got)
    assert g.cost_us_per_step == pytest.approx(1800.0) and g.evidence["profiler_gain_cap_us"] == pytest.approx(1800.0)
    assert net_of_profiler(dataclasses.replace(f, cost_us_per_step=8000.0), got).cost_us_per_step == 600.0
    acct = type("A", (), {"cost": lambda self, s: 14740.0 if s == "launch" else 0.0,
                          "caught_up_cost": lambda self, s: 0.0})()
    assert net_costs(acct, got[0])["launch"] == pytest.approx(1800.0)  # must_speak's net idle: the same cap


def test_an_estimated_launch_cost_is_capped_where_the_estimates_range_allows_the_step_to_be():
    """An estimated overhead gets a cap on its own terms: its rank's GPU idles at most the longest the unprofiled step
    can be (the traced step less the overhead at the low end of its range, ESTIMATE_RANGE: unprofiled_high_us) less
    the rank's own GPU work -- not the busiest GPU's, and not the estimate's point value: a difference of two large
    numbers that the estimate's error could overturn (REVIEW_S12 H4: an FSDP job over-priced 1.55x read 'nothing to
    fix'). Rank 0 (2.1 ms of its own kernels) on a 27 ms traced step, 8.8 ms of it estimated to be the profiler's: at
    most 27.0 - 4.4 - 2.1 = 20.5 ms. Where the launch slice and the step are read in one window the GPU idles at most
    the step less its own work, so the cap does not bind (24.9 ms traced idle: 16.1 ms net); it binds only where they
    disagree (a rank's window longer than the job's median step), and says so as an estimate. There (30 ms traced
    idle) the capped 20.5 ms is more than the point estimate allows -- its step (18.2 ms) less the rank's own work, the
    one point cap the input slice and late_rank read too: the cost said is at most that, the estimate's range said
    beside it (REVIEW_S13 M1: not the whole step, a control's launch idle as long as its estimated step)."""
    import pandas as pd

    from kit.doctor.model import Finding
    from kit.doctor.reconcile import net_of_profiler
    import kit.doctor.rules  # noqa: F401 -- registers the rules whose slices net_of_profiler looks up

    def ps(busy, kernels):
        return pd.DataFrame({"step": [1, 2, 3], "gpu_busy_us": [busy] * 3, "gpu_kernels_us": [kernels] * 3})

    def est():
        return ov.ProfilerOverhead(27000.0, 18200.0, 8800.0, "estimated", "a test", host_us=9000.0, exposed_us=8800.0)

    got = ov.job_floor({0: est(), 1: est()}, {0: 100.0, 1: 100.0}, {0: ps(2500.0, 2100.0), 1: ps(2900.0, 2600.0)})
    assert {r: o.own_work_us for r, o in got.items()} == {0: 2100.0, 1: 2600.0}
    assert got[0].unprofiled_step_us == 18200.0 and got[0].unprofiled_high_us == pytest.approx(27000.0 - 4400.0)
    assert got[0].gain_cap_us == pytest.approx(20500.0)
    f = Finding("launch_bound", 24900.0, (0, 1), {"rank": 0}, "the GPU sat idle 24.90 ms per step", "c", "f")
    g = net_of_profiler(f, {0: got[0], 1: got[1]})
    assert g.cost_us_per_step == pytest.approx(16100.0) and "profiler_gain_cap_us" not in g.evidence
    longer = net_of_profiler(dataclasses.replace(f, cost_us_per_step=30000.0), {0: got[0], 1: got[1]})
    low, high = longer.evidence["cost_range_us"]
    # the one point cap (the input slice's and late_rank's too): the point-estimated step less the rank's own work
    assert longer.evidence["point_cap_us"] == pytest.approx(got[0].unprofiled_step_us - got[0].own_work_us)
    assert low <= longer.cost_us_per_step <= longer.evidence["point_cap_us"] < got[0].unprofiled_step_us
    assert longer.evidence["profiler_gain_cap_basis"] == "estimated" and "the longest the unprofiled step can be as " \
        "estimated (the profiler's overhead at the low end of its range) less rank 0's own GPU work" in longer.summary
    # a cost that is the bound is said as one, with the range (REVIEW_S13 M2)
    assert longer.evidence["cost_is_point_cap"] and longer.summary.startswith("at most ")
    assert f"{low / 1e3:.2f}-{high / 1e3:.2f} ms over the estimate's range" in longer.summary


SLOW_WINDOW = DATA / "recorded-h100x2-fsdp-control-slow-window"


@pytest.mark.skipif(not SLOW_WINDOW.exists(), reason="case not here")
def test_an_estimated_launch_cost_on_a_real_control_is_at_most_its_step_less_its_gpus_own_work(tmp_path):
    """The launch slice's point bound on real data (REVIEW_S13 M1): the committed FSDP control with kitCapture
    stripped, so its overhead is estimated, its rank 0 idle ~64.6 ms of a traced step waiting on its host. The cost
    said is not above the point-estimated step less the GPU's own work per step -- the GPU does that work whatever
    its host does -- and, where the point estimate binds, it is said as a bound ("at most"), the estimate's range
    beside it. (The held-out s11r2 rec_input2 control, not committed: FINDINGS.md.)"""
    import gzip

    from kit.doctor import diagnose

    for p in sorted(SLOW_WINDOW.glob("*.json.gz")):
        t = json.loads(gzip.decompress(p.read_bytes()))
        t.pop("kitCapture", None)
        (tmp_path / p.name).write_bytes(gzip.compress(json.dumps(t).encode(), compresslevel=1))
    d = diagnose(sorted(tmp_path.glob("*.json.gz")), workers=1)
    f = next(x for x in d.findings if x.rule == "launch_bound")
    o = d.overhead[f.evidence["rank"]]
    assert o.basis == "estimated" and o.own_work_us > 0
    assert f.cost_us_per_step <= o.unprofiled_step_us - o.own_work_us + 0.1 < o.unprofiled_step_us
    assert f.cost_us_per_step <= o.point_cap_us + 0.1
    low, high = f.evidence["cost_range_us"]
    assert low <= f.cost_us_per_step < high
    from test_doctor_invariants import check  # the invariants, on the estimated basis too (REVIEW_S13 L1)

    check(d)
    if f.evidence["cost_is_point_cap"]:
        assert f.summary.startswith("at most ") and "the point estimate's bound" in f.summary
        assert f"{low / 1e3:.2f}-{high / 1e3:.2f} ms over the estimate's range" in f.summary


@pytest.mark.skipif(not SLOW_WINDOW.exists(), reason="case not here")
@pytest.mark.xfail(strict=True, reason="the estimated overhead of this window is low: launch_bound 43.22 ms said with "
                   "kitCapture stripped against 15.06 ms on the measured basis (2.87x), inside its own bound (REVIEW_S13 "
                   "L8; the held-out rec_input2 control likewise, 2.0x: FINDINGS.md)")
def test_an_estimated_launch_cost_on_a_real_control_is_near_its_measured_reading(tmp_path):
    """The same committed FSDP control read twice: with its kitCapture header (the unprofiled step measured) and
    without it (the overhead estimated). The estimated reading's launch_bound is within 0.5-2x of the measured one's."""
    import gzip

    from kit.doctor import diagnose

    def launch(paths):
        d = diagnose(sorted(paths), workers=1)
        return next(x for x in d.findings if x.rule == "launch_bound").cost_us_per_step

    for p in sorted(SLOW_WINDOW.glob("*.json.gz")):
        t = json.loads(gzip.decompress(p.read_bytes()))
        t.pop("kitCapture", None)
        (tmp_path / p.name).write_bytes(gzip.compress(json.dumps(t).encode(), compresslevel=1))
    measured, estimated = launch(SLOW_WINDOW.glob("*.json.gz")), launch(tmp_path.glob("*.json.gz"))
    assert 0.5 * measured <= estimated <= 2.0 * measured, (estimated, measured)


def test_the_job_steps_at_the_pace_of_the_rank_that_loses_most():
    """A rank that waits for a peer sees none of its own profiler time lengthen its step (its GPU waited for the peer,
    not for its host), but it waits for the peer's: every rank's step is shortened by the largest exposed overhead
    of the job, as far as the job's busiest GPU allows."""
    def est(exposed, traced=16000.0):
        return ov.ProfilerOverhead(traced, traced - exposed, exposed, "estimated", "a test", host_us=7000.0,
                                   exposed_us=exposed)

    got = ov.job_floor({0: est(100.0), 1: est(6500.0), 2: est(300.0, traced=15800.0)}, {}, {})
    assert {r: o.overhead_us for r, o in got.items()} == {0: 6500.0, 1: 6500.0, 2: 6500.0}
    assert "rank 1: 6500 us per step" in got[0].how and "pace" not in got[1].how


@pytest.mark.skipif(not (CORPUS / "gpt-host_sync").exists(), reason="corpus not here")
def test_profiler_time_hides_where_the_gpu_still_has_work():
    """gpt-host_sync waits for its GPU after the forward, after every parameter's norm and at the step's end: the
    profiler's time while the forward and backward queue ahead of the GPU lengthens nothing, the per-parameter
    .item() loop's does. Estimated with the one-GPU loop table: 2.24 ms of profiler time per step, 0.68 ms of it
    exposed, against the 0.71 ms the step lost (13.18 ms traced, 12.46 ms unprofiled in the corpus's timing); the
    GPU-bound control exposes almost none of its 1.34 ms."""
    case = CORPUS / "gpt-host_sync"
    t = json.loads((case / "truth.json").read_text())
    o = ov.overhead(next(case.glob("*.json.gz")))
    assert o.basis == "estimated" and o.exposed_us < 0.5 * o.host_us and "waited for the host" in o.how
    lost = o.traced_step_us - t["step_us_unprofiled"]["median"]
    assert 0.5 <= o.overhead_us / lost <= 2.0
    ctl = ov.overhead(next((CORPUS / "gpt-control").glob("*.json.gz")))
    assert ctl.exposed_us < 0.2 * ctl.host_us




def test_the_trace_layer_counts_the_short_ops_it_leaves_out():
    """The default CPU frame keeps only long ops; it counts the others (TraceInfo.short_ops): with them, every
    aten op of the file is accounted for."""
    from kit import traces

    trace = next((CORPUS.parent / "corpus-h100x2" / "gpt-fsdp-bf16-control").glob("*.pt.trace.json.gz"), None)
    if trace is None:
        pytest.skip("corpus not here")
    t = traces.load_trace(trace, cache=False)
    every = traces.load_trace(trace, cpu="all", cache=False)
    kept = int((t.cpu["cat"] == "cpu_op").sum())
    assert t.info.short_ops > 10 * kept and kept + t.info.short_ops == int((every.cpu["cat"] == "cpu_op").sum())


SCALED = json.loads((ov.TABLES / "jobs-launch.json").read_text())


def _case_dir(case: str) -> Path:
    """A jobs-launch point's traces (tests/corpus/overhead_eval.py names the 2x H200 example jobs examples-h200x2/)."""
    return DATA / case.split("/", 1)[1] if case.startswith("examples-") else DATA / case


@pytest.mark.parametrize("point", [p for p in SCALED["points"]
                                   if p["world_size"] > 1 and _case_dir(p["case"]).is_dir()], ids=lambda p: p["case"])
def test_the_estimate_against_the_measured_overhead(point):
    """Every multi-GPU job the scaled price was fitted on (recorded/profiler_overhead/jobs-launch.json, by
    tests/corpus/overhead_eval.py: H100 and H200 hosts), estimated as the doctor does for a trace without kit.capture's
    timing -- its ops at the table's factor x the rank's own median kernel launch, the ranks stepping at the pace of
    the one that loses most (job_floor) -- is within 0.5-2x of its measured overhead (the truth's unprofiled step
    against the traced one). In sample; the held-out errors are the eval script's (FINDINGS.md). The points whose
    traces are not committed (recorded/profiler_overhead/multi: features only) are the eval script's alone."""
    files = sorted(str(f) for f in _case_dir(point["case"]).glob("*.json.gz"))
    views = [ov._view(f) for f in files]
    est = ov.job_floor({i: ov.overhead(v, capture={}) for i, v in enumerate(views)}, {},
                       {i: v.host.per_step for i, v in enumerate(views)})
    assert all(o.basis == "estimated" and "jobs-launch.json" in o.how and "median kernel launch" in o.how
               for o in est.values())
    got = statistics.median(o.overhead_us for o in est.values())
    assert 0.5 <= got / point["overhead_us"] <= 2.0


def test_the_scaled_price_is_the_median_of_its_jobs():
    """The table's factor per profiler setting is the median, over the jobs it lists, of each job's implied per-op
    price over its pace rank's median kernel launch (what tests/corpus/overhead_eval.py --out writes); a CPU trace is
    priced from the other tables (kit.doctor.overhead.pick)."""
    import numpy as np

    for row in SCALED["settings"]:
        mine = [p for p in SCALED["points"] if (p["record_shapes"], p["with_stack"]) == (row["record_shapes"],
                                                                                         row["with_stack"])
                and row.get("distributed", p["world_size"] > 1) == (p["world_size"] > 1) and p.get("fitted", True)]
        assert row["cases"] == len(mine)
        if "us_per_frame_per_launch_us" in row:  # a + b x Python frames per op: least squares (overhead_eval.frame_fit)
            a, b = np.linalg.lstsq(np.c_[np.ones(len(mine)), [p["frames_per_op"] for p in mine]],
                                   [p["us_per_op"] / p["launch_us"] for p in mine], rcond=None)[0]
            assert (row["us_per_op_per_launch_us"], row["us_per_frame_per_launch_us"]) == pytest.approx((a, b),
                                                                                                         rel=2e-2)
            continue
        assert row["us_per_op_per_launch_us"] == pytest.approx(
            statistics.median(p["us_per_op"] / p["launch_us"] for p in mine), rel=2e-3)
    assert ov.pick_scaled(False, True, False)[1] is None
    assert ov.pick_scaled(True, True, False)[1]["us_per_op_per_launch_us"] > 0
    # the with_stack row is fitted on multi-process jobs alone: a one-GPU trace with stacks gets the row without them
    stack = ov.pick_scaled(True, True, True, distributed=True)[1]
    assert stack["with_stack"] and stack["distributed"] and ov.pick_scaled(True, True, True)[1] is \
        ov.pick_scaled(True, True, False)[1]
    assert ov._lower_bound(True, ov.pick_scaled(True, True, True)[1]) and not ov._lower_bound(True, stack)


def test_the_estimate_says_which_jobs_its_row_was_fitted_on():
    """The sentence reads the row's provenance from its table's points: the record_shapes row names H100 and H200
    multi-process jobs; the one-GPU row without record_shapes was fitted on one-GPU H100 jobs only, which a
    multi-process trace priced by it would be told is likely low (the distributed row prices those: its own jobs)."""
    rows = {r["record_shapes"]: r for r in SCALED["settings"] if not r.get("distributed", False)}
    pts = {k: [p for p in SCALED["points"] if p["record_shapes"] == k and not p["with_stack"]
               and (k or p["world_size"] == 1)] for k in rows}
    with_shapes = ov._fitted_on(SCALED, rows[True], distributed=True)
    assert with_shapes == (f"{len(pts[True])} jobs of H100 and H200 hosts "
                           f"({sum(p['world_size'] > 1 for p in pts[True])} multi-process)")
    assert all(p["world_size"] == 1 and p["gpu"] == "H100" for p in pts[False])
    assert ov._fitted_on(SCALED, rows[False], distributed=False) == f"{len(pts[False])} jobs of H100 hosts (0 multi-process)"
    assert ov._fitted_on(SCALED, rows[False], distributed=True).endswith("; one-GPU jobs only, so likely low for this "
                                                                         "multi-process trace")
    dist = next(r for r in SCALED["settings"] if r.get("distributed"))
    assert ov._fitted_on(SCALED, dist, distributed=True) == f"{dist['cases']} jobs of H200 hosts ({dist['cases']} " \
                                                            "multi-process)"


MULTI_WINDOW = ov.TABLES / "multi" / "h200x2-gpt-ddp-bf16-control-0-noshapes"


def test_a_multi_process_trace_without_shapes_is_priced_by_the_distributed_row():
    """A rank of a 2-rank DDP job recorded without record_shapes (torch.profiler's default; kit.capture's window on a
    4x H200 host, recorded/profiler_overhead/multi: rank 0's trace kept) is priced, its unprofiled timing left aside, by the table's distributed
    row -- multi-process jobs paid about what they pay with shapes, not the one-GPU jobs' price without them -- and
    lands within 0.5-2x of its measured overhead (the trace's own unprofiled steps against its traced ones). In sample:
    the window is one of the row's 12; held out, the eval script's (FINDINGS.md)."""
    files = sorted(str(f) for f in MULTI_WINDOW.glob("trace_rank*.json.gz"))
    if not files:
        pytest.skip("the multi window is not here")
    dist, one = ov.pick_scaled(True, False, False, distributed=True)[1], ov.pick_scaled(True, False, False)[1]
    assert dist["distributed"] is True and one["distributed"] is False
    assert dist["us_per_op_per_launch_us"] > 2 * one["us_per_op_per_launch_us"]
    assert ov.pick_scaled(True, True, False, distributed=True)[1] is ov.pick_scaled(True, True, False)[1]
    views = [ov._view(f) for f in files]
    est = ov.job_floor({i: ov.overhead(v, capture={}) for i, v in enumerate(views)}, {},
                       {i: v.host.per_step for i, v in enumerate(views)})
    measured = [ov.overhead(v) for v in views]
    assert all(o.basis == "estimated" and f"{dist['cases']} multi-process)" in o.how and "record_shapes=False" in o.how
               and "likely low" not in o.how for o in est.values())
    assert all(o.basis == "measured" for o in measured)
    got = statistics.median(o.overhead_us for o in est.values())
    assert 0.5 <= got / statistics.median(o.overhead_us for o in measured) <= 2.0


def _held_out_ratios(ev, jobs: list[dict]) -> list[float]:
    """The committed price's estimate over the measured overhead on each scored window of ``jobs`` (at least 8)."""
    for j in jobs:
        ev.measured(j)
    scored = [j for j in jobs if j["scored"]]
    assert len(scored) >= 8
    _, price = ev.committed([])
    return [ev.estimate(j, [price(j, r) for r in j["ranks"]]) / j["overhead_us"] for j in scored]


def _eval_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("overhead_eval_t",
                                                  Path(__file__).parent / "corpus" / "overhead_eval.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_distributed_row_held_out_on_another_host():
    """The distributed row (fitted on 4x H200 kit.capture windows) priced, as committed, on the multi-process windows
    recorded later on 4x H100 without record_shapes (recorded/profiler_overhead/multi: their features, never fitted
    on: overhead_eval.MULTI_HELD_OUT) through each rank's exposure curve, as tests/corpus/overhead_eval.py judges it:
    at least 3 in 4 of the scored windows within 0.5-2x of their measured overhead and their median within
    0.75-1.33x -- the rule the row was to be refitted by had they failed it (FINDINGS.md)."""
    ev = _eval_script()
    if not ev.MULTI.is_file():
        pytest.skip("the multi windows' features are not here")
    import gzip

    jobs = [{**j, "unprof": {int(r): v for r, v in j["unprof"].items()}}
            for j in json.loads(gzip.decompress(ev.MULTI.read_bytes()))["jobs"]
            if j["case"].startswith(ev.MULTI_HELD_OUT) and not j["record_shapes"]]
    ratios = _held_out_ratios(ev, jobs)
    assert sum(0.5 <= x <= 2.0 for x in ratios) >= 0.75 * len(ratios)
    assert 0.75 <= statistics.median(ratios) <= 1.33


def test_a_gpu_trace_recorded_with_stack_is_read_so():
    """The default CPU frame keeps no Python frame, so the trace layer counts them (TraceInfo.python_frames) and the
    doctor reads with_stack from the count: a one-GPU H100 trace recorded by tensorboard_trace_handler with
    with_stack=True (corpus gpt-host_stall_gc, its truth.json says so) is read as recorded with stacks -- before, a GPU
    trace's stacks went unseen and it was priced as recorded without them. No row of the scaled table covers its
    settings (no record_shapes, stacks, one GPU), so it keeps the no-stack row's price, said to be likely low; a trace
    without stacks counts none."""
    from kit import traces

    case = CORPUS / "gpt-host_stall_gc"
    trace = next(case.glob("*.json.gz"), None)
    if trace is None:
        pytest.skip("corpus not here")
    assert json.loads((case / "truth.json").read_text())["with_stack"] is True
    t = traces.load_trace(trace, cache=False)
    assert t.info.python_frames > 1000 and t.info.memory_events == 0
    assert not (t.cpu["cat"] == "python_function").any()  # not kept: counted
    v = ov._view(trace)
    assert ov._settings(v, None)[:2] == (False, True)
    o = ov.overhead(v)
    row = ov.pick_scaled(True, False, False)[1]
    assert o.basis == "estimated" and "with_stack=False" in o.how and "recorded with_stack" in o.how \
        and "likely low" in o.how
    assert o.host_us == pytest.approx(float(o.how.split(" ops and ")[0].split()[-1]) * row["us_per_op_per_launch_us"]
                                      * o.launch_us, rel=0.01)
    # of its frames, those of a stretch of Python without an op (off the ops) are counted apart: not the model's
    assert 0 < t.info.python_frames_off_ops < t.info.python_frames
    plain = next((CORPUS / "gpt-host_stall").glob("*.json.gz"), None)
    if plain is not None:
        assert traces.load_trace(plain, cache=False).info.python_frames == 0


def test_a_multi_process_trace_with_stack_is_priced_by_the_stack_row():
    """A rank of a 2-rank DDP job whose settings say record_shapes and with_stack (the kitCapture facts given here,
    on the committed multi window's real trace) is priced by the table's with_stack row -- fitted on 35 kit.capture
    windows of GPT and CNN DDP jobs and a GPT FSDP job on 4x H200 recorded with stacks
    (recorded/profiler_overhead/multi/stack.json.xz and offops/) -- and the sentence says so; the same trace without stacks by the record_shapes row: the two prices differ by the
    rows' factors alone (the same ops, the same launch reading; this trace holds no Python frame, so the row's term
    per frame adds nothing)."""
    files = sorted(str(f) for f in MULTI_WINDOW.glob("trace_rank*.json.gz"))
    if not files:
        pytest.skip("the multi window is not here")
    v = ov._view(files[0])
    stack = ov.overhead(v, capture={"record_shapes": True, "with_stack": True, "profile_memory": True})
    plain = ov.overhead(v, capture={"record_shapes": True, "with_stack": False})
    row = ov.pick_scaled(True, True, True, distributed=True)[1]
    shapes = ov.pick_scaled(True, True, False, distributed=True)[1]
    assert stack.basis == plain.basis == "estimated"
    assert "with_stack=True" in stack.how and f"{row['cases']} jobs of H200 hosts ({row['cases']} multi-process)" \
        in stack.how and "likely low" not in stack.how
    assert "with_stack=False" in plain.how
    shown = ov._shown_us(ov._per_step(v))
    assert ov._frames_per_op(v) == 0.0  # recorded without stacks: the frame term adds nothing
    assert (stack.host_us - shown) / (plain.host_us - shown) == pytest.approx(
        row["us_per_op_per_launch_us"] / shapes["us_per_op_per_launch_us"], rel=1e-3)


def test_the_stack_row_on_its_windows_and_what_memory_adds():
    """The stack probe's windows (recorded/profiler_overhead/multi/stack.json.xz: 6 DDP jobs on 2 of 4x H200, 4 on 4,
    each ABCCBA with record_shapes / + with_stack / + with_stack and profile_memory): the with_stack row as committed
    (per op and per Python frame) prices every scored stack window it was fitted on within 0.5-2x of its measured
    overhead, their median within 0.8-1.25x (in sample; one job out, tests/corpus/overhead_eval.py prints it). Paired within each job,
    stacks cost more than shapes alone (median ratio of the measured overheads above 1.2) and profile_memory nothing
    measurable on top (0.8-1.25x): it is not a setting of the table."""
    ev = _eval_script()
    if not ev.MULTI_STACK.is_file():
        pytest.skip("the stack windows' features are not here")
    import lzma

    jobs = [{**j, "unprof": {int(r): v for r, v in j["unprof"].items()}}
            for j in json.loads(lzma.decompress(ev.MULTI_STACK.read_bytes()))["jobs"]]
    for j in jobs:
        ev.measured(j)
    _, price = ev.committed([])
    # the stall_rank windows' features count the frames of their deadline loop, which the doctor leaves out
    scored = [j for j in jobs if j["scored"] and j["with_stack"] and not any(k in j["case"] for k in ev.FRAME_FIT_OUT)]
    assert len(scored) >= 30
    ratios = [ev.estimate(j, [price(j, r) for r in j["ranks"]]) / j["overhead_us"] for j in scored]
    assert all(0.5 <= x <= 2.0 for x in ratios) and 0.8 <= statistics.median(ratios) <= 1.25
    by = {}
    for j in jobs:
        by.setdefault(j["group"], {}).setdefault(ev._arm(j), []).append(j["overhead_us"])
    med = {g: {a: statistics.median(v) for a, v in arms.items()} for g, arms in by.items()}
    assert statistics.median(m["stack"] / m["shapes"] for m in med.values()) > 1.2
    assert 0.8 <= statistics.median(m["stack+memory"] / m["stack"] for m in med.values()) <= 1.25


def test_the_stack_row_held_out_in_a_later_session():
    """The with_stack row as committed (fitted on round s11r1b's windows) priced on the stack windows recorded later
    (round s11r2, overhead_eval.STACK_HELD_OUT: never fitted on) through each rank's exposure curve: at least 3 in 4 of
    the scored stack windows within 0.5-2x of their measured overhead and their median within 0.67-1.5x."""
    ev = _eval_script()
    if not ev.MULTI_STACK.is_file():
        pytest.skip("the stack windows' features are not here")
    import lzma

    jobs = [{**j, "unprof": {int(r): v for r, v in j["unprof"].items()}}
            for j in json.loads(lzma.decompress(ev.MULTI_STACK.read_bytes()))["jobs"]
            if j["case"].startswith(ev.STACK_HELD_OUT) and j["with_stack"]]
    if not jobs:
        pytest.skip("no held-out stack windows")
    ratios = _held_out_ratios(ev, jobs)
    assert sum(0.5 <= x <= 2.0 for x in ratios) >= 0.75 * len(ratios)
    assert 0.67 <= statistics.median(ratios) <= 1.5


OFF_OPS = Path(__file__).resolve().parent / "data" / "python-off-ops" / "trace.json.gz"


def test_python_off_the_ops_is_priced_but_a_loop_that_runs_to_a_deadline_is_not():
    """A real CPU trace with stacks (tests/data/python-off-ops/record.py, 23 KB): one step of a few ops, then on the
    same thread a pure-Python loop of a fixed amount of work (240 x ``ord`` and ``list.append``), a ``json.dumps``
    loop that runs until 0.5 ms have passed (reading ``perf_counter`` each round) and a sleep. The trace layer keeps
    where its frames off the ops lie (TraceInfo.python_off_ops_stretches): the two loops are one stretch (less than
    1 ms apart), which reads the clock hundreds of times. The doctor prices the frames before its first clock read
    (the fixed work: the tracer lengthens it) and leaves out those from the first clock read to the last (the tracer
    cannot lengthen a loop that stops on the clock; it records fewer rounds)."""
    from kit import traces

    t = traces.load_trace(OFF_OPS, cache=False)
    st = t.info.python_off_ops_stretches
    assert sum(s[3] for s in st) == t.info.python_frames_off_ops > 0
    loop = max(st, key=lambda s: s[3])
    assert loop[4] > ov.TIMED_CLOCK_READS and 0 < loop[5] < loop[3]  # clock reads; frames from the first to the last
    assert loop[3] - loop[5] >= 2 * 240  # ord and append of every character, before the first clock read
    v = ov._view(OFF_OPS)
    off = ov._off_ops(v, ov._per_step(v))
    assert off["timed"] == 1 and off["timed_frames"] == loop[5]
    assert ov.overhead(v).off_ops_us == 0.0  # a CPU trace: no row prices frames off the ops (nor says so)
    assert "profiler_off_ops_us" not in ov.overhead(v).as_dict()
    assert loop[3] - loop[5] in off["frames"].tolist()
    assert off["frames"].sum() < t.info.python_frames_off_ops - loop[5] + 1  # the deadline loop's frames not priced


def test_a_frame_off_the_ops_is_priced_by_its_own_fit():
    """The with_stack row's price per Python frame off the ops is overhead_eval.off_frame_fit's on
    recorded/profiler_overhead/multi/off_frames.json (derived once): the median implied price of five pure-Python
    workloads -- session 11's held-out GPT input straggler (a tokenizer in its DataLoader, 142k frames a step) and
    round s12r2's ord+append, dict.get, a recursive function and a sort with a Python key after each step (0.037-0.084
    us per frame per us of launch) -- 0.050, below the frame term among the ops (0.089; the DDP-only term, 0.209, would
    have put 282 ms on a 103 ms step). Only the check recorded apart is judged (round s12r1: the tokenizer in a 2-GPU
    kit.capture window, 57k frames a step): priced within 0.5-2x of its measured overhead (1.23x)."""
    ev = _eval_script()
    row = ov.pick_scaled(True, True, True, distributed=True)[1]
    assert row["us_per_off_frame_per_launch_us"] == pytest.approx(ev.off_frame_fit(), abs=5e-5)
    assert row["us_per_off_frame_per_launch_us"] < row["us_per_frame_per_launch_us"]
    points = json.loads(ev.OFF_FRAMES.read_text())["points"]
    held_out = [p for p in points if not p["fitted"]]
    assert held_out
    for p in held_out:  # each check's own overhead, as the row prices it
        priced = p["ops_overhead_us"] + row["us_per_off_frame_per_launch_us"] * p["off_frames"] * p["launch_us"]
        assert 0.5 <= priced / p["overhead_us"] <= 2.0, p["case"]


def test_the_stack_rows_fsdp_term_held_out_on_two_other_fsdp_jobs():
    """REVIEW_S12b N8: the with_stack row's term per Python frame was fitted with one FSDP job's windows (s12r1's
    gpt-fsdp-bf16-control). Round s13r1 (2x H200, recorded/profiler_overhead/multi/offops/features-s13r1-h200x2.json.xz,
    never fitted on) recorded two other FSDP jobs with and without stacks: a 12-block GPT (13 FSDP units) and a
    4-block one sharded at the root only. The committed row prices each of their scored stack windows within 0.5-2x
    of its measured overhead (0.89-1.26x when recorded; the fitted job again on that host: 1.08x, 1.17x)."""
    import lzma

    ev = _eval_script()
    path = ev.ROOT / "recorded" / "profiler_overhead" / "multi" / "offops" / "features-s13r1-h200x2.json.xz"
    if not path.is_file():
        pytest.skip("the s13r1 FSDP windows' features are not here")
    jobs = [{**j, "unprof": {int(r): v for r, v in j["unprof"].items()},
             "ranks": [{**r, "py_frames": max(0.0, (r.get("py_frames") or 0.0) - (r.get("py_off") or 0.0))}
                       for r in j["ranks"]]}
            for j in json.loads(lzma.decompress(path.read_bytes()))["jobs"]
            if j["with_stack"] and j["parallel"] == "fsdp" and "/gpt-fsdp-bf16-control/" not in j["case"]]
    for j in jobs:
        ev.measured(j)
    scored = [j for j in jobs if j["scored"]]
    assert len({j["group"] for j in scored}) == 2 and len(scored) >= 4
    _, price = ev.committed([])
    ratios = [ev.estimate(j, [price(j, r) for r in j["ranks"]]) / j["overhead_us"] for j in scored]
    assert all(0.5 <= x <= 2.0 for x in ratios), ratios
