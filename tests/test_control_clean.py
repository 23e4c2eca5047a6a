"""Balanced controls (no planted fault; every rank the same code) stay clean on the shapes of trace set users hand
the doctor that the corpus does not hold: a traced window that ran slower than its unprofiled steps, and a subset of
a bigger job's ranks. Clean: no finding on a single rank at 10% of the step or more and no input/sync/allocator/stall
finding at 5% or more (as ``test_doctor_corpus``'s controls), and what each case's README says it must not say."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import diagnosed

DATA = Path(__file__).resolve().parent / "data" / "doctor"
SLOW = DATA / "recorded-h100x2-fsdp-control-slow-window"
SUBSET = DATA / "recorded-h100x4-control-tb-2of4"
HOST_RULES = ("input_bound", "host_sync", "allocator_churn", "host_stall")
SINGLE_RANK_SHARE, HOST_RULE_SHARE = 0.10, 0.05


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("KIT_DOCTOR_STRICT", "1")


def _clean(d) -> None:
    for f in d.problems:
        share = f.cost_us_per_step / d.step_us
        assert not (len(f.ranks) == 1 and share >= SINGLE_RANK_SHARE), f"{f.rule} {f.ranks} {share:.0%}"
        assert not (f.rule in HOST_RULES and share >= HOST_RULE_SHARE), f"{f.rule} {share:.0%}"


@pytest.mark.skipif(not SLOW.exists(), reason="case not here")
def test_a_slow_traced_window_is_not_a_host_stall():
    """The FSDP control's traced steps ran 3.3x its unprofiled ones, rank 0's measured overhead 3.2x what its
    recorded events cost at their price: its 8 ms stretch without a launch (FSDP's post-backward, its event records,
    stream waits and short ops spaced out up to ~1 ms apart) is that window's slowness, not the job's. Inside FSDP2's
    post-backward regions it is FSDP's own code issuing (calls.FRAMEWORK_ONLY_REGIONS: 3.1 ms per step); what is left
    of it as traced -- the gaps of 1 ms or more between its stream calls outside them, the main thread's Python between
    the backward and the optimizer (2.3 ms per step, 3.0%) -- host_stall charges only beyond the measured overhead its
    events do not explain at twice their price: nothing here; the job's launch_bound first."""
    d = diagnosed(sorted(SLOW.glob("trace_rank*.json.gz")))
    _clean(d)
    assert "host_stall" not in {f.rule for f in d.problems}
    stall = next(f for f in d.findings if f.rule == "host_stall")
    assert stall.evidence["cost_traced_us_per_step"] > 0.02 * d.step_us  # as traced there is one, under the 5% bar
    assert stall.evidence["slow_window_us_per_step"]["0"] >= stall.evidence["cost_traced_us_per_step"]
    assert d.problems[0].rule == "launch_bound" and set(d.problems[0].ranks) == {0, 1}


@pytest.mark.skipif(not SLOW.exists(), reason="case not here")
def test_a_slow_traced_window_without_kit_capture_is_not_a_host_stall(tmp_path):
    """The same two steps with the ``kitCapture`` header stripped (what a tensorboard_trace_handler user has; the
    overhead estimated): the right answer is the same as with it. Was host_stall [0] 5.39 ms (7.1%) while FSDP2's
    post-backward regions, after their first launch, counted as stalls; now 2.26 ms (3.0%), launch_bound first."""
    import gzip
    import json

    for f in sorted(SLOW.glob("trace_rank*.json.gz")):
        t = json.load(gzip.open(f, "rt"))
        t.pop("kitCapture")
        with gzip.open(tmp_path / f"host_{1000 + t['distributedInfo']['rank']}.1.pt.trace.json.gz", "wt") as g:
            json.dump(t, g)
    d = diagnosed(sorted(tmp_path.glob("*.pt.trace.json.gz")))
    assert all(o.basis == "estimated" for o in d.overhead.values())
    _clean(d)


@pytest.mark.skipif(not SUBSET.exists(), reason="case not here")
def test_two_of_four_ranks_of_a_control_have_no_slow_collectives():
    """Ranks 0-1 of a 4-rank control spun ~11 ms per step in all-reduces waiting for ranks 2-3, which are not given:
    their shortest kernel is not the transfer. low_busbw skips those collectives and says why; exposed_comm counts
    none of them; the accounting reads that time as waiting, and a note says it lies on the ranks not given."""
    d = diagnosed(sorted(SUBSET.glob("*.pt.trace.json.gz")))
    _clean(d)
    assert not {"low_busbw", "exposed_comm"} & {f.rule for f in d.problems}
    (why,) = [s.why for s in d.skipped if s.rule == "low_busbw"]
    assert "seen on 2 of the 4 ranks of their process group" in why
    for rk in ("0", "1"):
        split = d.accounting[rk]["comm_split"]
        assert split["waiting_us"] > 10 * split["transfer_us"]
    (note,) = [n for n in d.notes if "whose other ranks are not given (2, 3)" in n]
    assert "ms per step (rank 0; 75% of the step)" in note


@pytest.mark.parametrize("case, on_path", [("corpus-h100x2/gpt-ddp-bf16-control", {0}),
                                           ("corpus-h100x4/gpt-ddp-bf16-control", {1, 2})])
def test_every_ranks_dataloader_on_its_training_thread_is_the_jobs(case, on_path):
    """The corpus GPT DDP controls load with ``num_workers=0, pin_memory=True``: every rank spends 0.4-0.9 ms per step
    in next() on its training thread, the same work. On the ranks that arrive early that wait lies inside their
    all-reduce's wait for the last one (their GPU in NCCL); only on the rank the others wait for does the GPU idle
    through it (rank 0 of 2; ranks 1 and 2 of 4). The cause is the job's: input_bound names every rank (job_level), the
    rank it held up the step on as context, at that rank's cost (its part on the step's path, net of the profiler) --
    not a finding of whichever rank happened to arrive last. Alike: every rank's median wait within 2x of the
    longest (INPUT_ALIKE)."""
    from test_doctor_corpus import _diagnose

    d = _diagnose(case)
    _clean(d)
    f = next(f for f in d.findings if f.rule == "input_bound")
    ev = f.evidence
    assert f.ranks == tuple(d.ranks) and ev["job_level"] and set(ev["ranks_seen_input_bound"]) == on_path
    assert ev["on_path_rank"] in on_path and f.cost_us_per_step == ev["per_rank"][str(ev["on_path_rank"])]["cost_us_per_step"]
    waits = ev["data_wait_us_per_step"].values()
    assert min(waits) > 300.0 and min(waits) >= 0.5 * max(waits)


@pytest.mark.parametrize("case", ["corpus-h100x2/gpt-ddp-bf16-input_rank", "corpus-h100x4/gpt-ddp-bf16-input_rank"])
def test_an_input_straggler_stays_its_ranks(case):
    """The genuine input straggler (rank 1's loader slowed, +17.5 ms on 2 GPUs, +9.1 ms on 4): its DataLoader wait
    exceeds the others' by far more than they differ, so it is not the job's -- late_rank [1], for its data wait, its
    input slice folded into it, no input_bound of the job beside it."""
    from test_doctor_corpus import _diagnose

    d = _diagnose(case)
    f = d.problems[0]
    assert f.rule == "late_rank" and f.ranks == (1,) and f.evidence["reason"] == "data_wait"
    assert "input_bound" in f.evidence["own_idle"] and not any(x.rule == "input_bound" for x in d.findings)


def test_one_ranks_slow_loader_is_not_the_jobs(tmp_path):
    """The committed 4-GPU GPT control with ranks 0, 2 and 3's DataLoader waits cut to 50 us (a prefetching loader's
    next()) and rank 1's left at ~0.6 ms: not the same input work on every rank (0.08x of the longest, under
    INPUT_ALIKE), so input_bound stays on the rank it was seen on, not said for the job."""
    import gzip
    import json

    from kit.doctor import diagnose

    case = DATA / "corpus-h100x4" / "gpt-ddp-bf16-control"
    for p in sorted(case.glob("*.json.gz")):
        j = json.loads(gzip.decompress(p.read_bytes()))
        if j["distributedInfo"]["rank"] != 1:
            for e in j["traceEvents"]:
                if e.get("ph") == "X" and str(e.get("name", "")).startswith("enumerate(DataLoader)"):
                    e["dur"] = min(e["dur"], 50.0)
        (tmp_path / p.name).write_bytes(gzip.compress(json.dumps(j).encode(), 1))
    f = next(f for f in diagnose(sorted(tmp_path.glob("*.json.gz")), workers=1).findings if f.rule == "input_bound")
    assert f.ranks == (1,) and not f.evidence.get("job_level") and "on_path_rank" not in f.evidence
