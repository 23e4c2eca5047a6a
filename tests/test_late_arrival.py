"""Why a late rank arrived last (``kit.doctor.rules.late_arrival.attribute``): on synthetic collectives, where what
happened is known, and on a real recording."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kit.doctor.rules.late_arrival import HOST_REASONS, SINGLE_STALL, attribute

AFTER = Path(__file__).resolve().parent / "data" / "doctor" / "recorded-h200x2-fsdp-stall-before-step"


def _job(stall_us: float = 0.0, slower: float = 0.0, steps: int = 3, per_step: int = 24, at: int = 0,
         sliced: bool = False):
    """Two ranks, ``per_step`` collectives a step, each stretch between two collectives issued by the host in
    1.2-1.8 ms (the same on both ranks but ``slower``, rank 1's extra share) and run by the GPU in 1 ms: the job is
    host-bound. Rank 0's host is 20 ms ahead of rank 1's from the start (a lag from before the trace), and rank 1's
    host stalls ``stall_us`` before the first collective of every step but the first (a sleep between backward() and
    optimizer.step()), or before its collective ``at`` of every step (a stall inside the step). ``sliced``: rank 1's
    core is shared with another process, as a scheduler shares it -- before every third collective it loses a slice
    of 1, 2 or 3 ms with no event (8 slices, 16 ms a step), between its launches; the host model's stall stretches,
    of which each step's longest is :data:`SINGLE_STALL`'s. Each rank's arrival is its launch or its GPU's end of the
    stretch, whichever is later; a
    collective runs 0.1 ms from the later arrival. Rank 1's clock is 1 s ahead of rank 0's. Returns (df, inst) as
    ``attribute`` reads them."""
    skew = {0: 0.0, 1: 1e6}
    n = steps * per_step
    # the stretches' host cost, the same on each rank: the first of a step (the optimizer, the forward's start) 4.7 ms
    shape = [4700.0 if k % per_step == 0 else 1500.0 + 150.0 * ((k * 7) % 5 - 2) for k in range(n)]
    launch = {0: [], 1: []}
    stall_at = {0: [], 1: []}  # cumulative stall before each launch
    # rank 1's stall stretches before each launch (a stall, a slice) and which is its step's longest
    span = [(stall_us if k > 0 and k % per_step == at and stall_us else 0.0)
            + (1000.0 + 1000.0 * ((k * 5) % 3) if sliced and k % 3 == 1 else 0.0) for k in range(n)]
    longest = {k // per_step: max(range(k, k + per_step), key=lambda i: span[i]) for k in range(0, n, per_step)}
    single_at = {0: [0.0] * n, 1: list(__import__("itertools").accumulate(
        span[k] if longest[k // per_step] == k else 0.0 for k in range(n)))}
    host = {0: 0.0, 1: 20_000.0}
    stalled = {0: 0.0, 1: 0.0}
    step_ts = {0: [], 1: []}
    for k in range(n):
        for r in (0, 1):
            if r == 1 and span[k]:
                host[r] += span[k]
                stalled[r] += span[k]
            if k % per_step == 0:
                step_ts[r].append((host[r] - 50.0, stalled[r] - (stall_us if r == 1 and k > 0 and at == 0 else 0.0)))
            host[r] += shape[k] * (1 + (slower if r == 1 else 0.0))
            launch[r].append(host[r])
            stall_at[r].append(stalled[r])
    rows, last = [], []
    end = 0.0
    for k in range(n):
        arrive = {r: max(launch[r][k] + 5.0, end + 1000.0) for r in (0, 1)}
        end = max(arrive.values()) + 100.0
        late = max(arrive, key=arrive.get)
        last.append({"match_key": f"step{k // per_step}|c{k % per_step}", "instance": 0, "rank": late,
                     "late_by_us": arrive[late] - min(arrive.values()), "floor_us": 20.0})
        for r in (0, 1):
            ts, st = step_ts[r][k // per_step]
            row = {"match_key": f"step{k // per_step}|c{k % per_step}", "instance": 0, "rank": r,
                   "launch_us": launch[r][k] + skew[r], "start_us": arrive[r] + skew[r], "end_us": end + skew[r],
                   "step_ts": ts + skew[r], "step": k // per_step}
            for c in HOST_REASONS:
                stall = c == "host_stall"
                row[f"{c}@launch"] = stall_at[r][k] if stall else 0.0
                row[f"{c}@end"] = stall_at[r][k] if stall else 0.0
                row[f"{c}@step"] = st if stall else 0.0
            row[f"{SINGLE_STALL}@launch"] = single_at[r][k]
            rows.append(row)
    return pd.DataFrame(rows), pd.DataFrame(last)


@pytest.mark.parametrize("at", [0, 12])
def test_a_stall_whose_lag_the_rank_carries_is_the_stall(at):
    """Rank 1 sleeps 8 ms once a step and then issues its work as fast as rank 0, whose host stays ahead: at every
    collective it is late by its host's launch against rank 0's GPU. The lateness it adds is the stall's lag carried
    through a host-bound step, not slower issuing: host_stall, not host_busy (its issuing since each collective's
    end, which rank 0 did before that end, read as excess host_busy: 20.5 ms of host_busy against 14.7 of host_stall
    before ``lag_shares``; CPU binding was the fix shown). The same for a stall in the middle of the step."""
    df, inst = _job(stall_us=8000.0, at=at)
    assert (inst["rank"] == 1).all()
    got, n = attribute(df, inst, 1)
    assert n > 0 and got["host_stall"] > 2 * got["host_busy"]


@pytest.mark.parametrize("sliced", [False, True])
def test_a_host_that_issues_more_slowly_stays_host_busy(sliced):
    """Rank 1 issues every stretch 30% more slowly than rank 0 (a slower host) and stalls 1 ms once a step; or its
    core is shared with another process, taken from it in slices of 1-3 ms between its launches (``sliced``, as a
    contended core looks in a real trace: gaps with no event, not every stretch slower). Its lag is mostly slower
    issuing, so is its lateness -- host_busy: a contended core's slices are not one stall (a stall is one stretch a
    step, :data:`SINGLE_STALL`: host_busy 67.1 vs host_stall 9.3 ms; all of its stall time read as a stall, it was
    host_stall 76.4 vs host_busy 0)."""
    df, inst = _job(stall_us=1000.0, **({"sliced": True} if sliced else {"slower": 0.3}))
    assert (inst["rank"] == 1).all()
    got, n = attribute(df, inst, 1)
    assert n > 0 and got["host_busy"] > 2 * got["host_stall"] > 0


@pytest.mark.skipif(not AFTER.exists(), reason="case not here")
def test_a_real_stall_before_the_optimizer_step_is_a_stall():
    """Real FSDP2 on 2 H200s (tests/data/doctor/recorded-h200x2-fsdp-stall-before-step/README.md): rank 1 sleeps 8 ms
    between ``loss.backward()`` and ``optimizer.step()``. The job is host-bound; rank 0's host runs ahead, rank 1's
    arrives at every collective by its launch. late_rank [1], for its host's stall, read at the collectives (it was
    host_busy: host_stall 4.04 / host_busy 4.93 ms per step on this cut, 5.36 / 5.76 on the whole recording)."""
    from conftest import diagnosed

    f = diagnosed(sorted(AFTER.glob("rank*.json.gz"))).problems[0]
    assert (f.rule, f.ranks, f.evidence["reason"], f.evidence["reason_from"]) == ("late_rank", (1,), "host_stall",
                                                                                  "collectives")
    per = f.evidence["reason_us_per_step"]
    assert per["host_stall"] > per["host_busy"]


CONTENDED = Path(__file__).resolve().parent / "data" / "doctor" / "corpus-h100x2" / "gpt-ddp-bf16-cpu_rank"


@pytest.mark.skipif(not CONTENDED.exists(), reason="case not here")
def test_a_contended_cores_stall_time_is_said_as_slower_issuing():
    """2 H100s, bf16 DDP GPT, rank 1's process on one core shared with a busy loop (its truth: host_busy). Its host's
    lag is built of stretches with no event (the scheduler's slices, the host model's stall time: host_stall 9.3 of
    12.5 ms per step of its explained lateness), and the contended-host model holds: the reason said is host_busy, with
    its fix (CPU binding, other load), and the evidence says why (it said host_stall, whose fix starts from a sleep).
    Its per-reason numbers agree with the reason said (the slices folded into host_busy; as the collectives read them
    in ``reason_us_per_step_as_read``)."""
    from conftest import diagnosed

    f = diagnosed(sorted(CONTENDED.glob("*.json.gz"))).problems[0]
    ev = f.evidence
    assert (f.rule, f.ranks, ev["cost_basis"], ev["reason"]) == ("late_rank", (1,), "contended_host", "host_busy")
    assert ev["reason_from_stall"] == "contended_host" and "CPU binding" in f.fix
    per = ev["reason_us_per_step"]
    assert max(per, key=per.get) == ev["reason"] == "host_busy" and per["host_stall"] == 0
    raw = ev["reason_us_per_step_as_read"]
    assert raw["host_stall"] > raw["host_busy"] and per["host_busy"] == pytest.approx(raw["host_busy"] + raw["host_stall"],
                                                                                      abs=0.2)


INPUT_STACK = Path(__file__).resolve().parent / "data" / "doctor" / "recorded-h200x2-ddp-input-stack"


@pytest.mark.skipif(not INPUT_STACK.exists(), reason="case not here")
def test_a_late_rank_under_the_tracer_is_costed_net_of_it():
    """Real DDP on 2 H200s, with_stack (tests/data/doctor/recorded-h200x2-ddp-input-stack/README.md): rank 1
    tokenizes in pure Python, ~7.2 ms added per step, 14.43 ms unprofiled, 44.0 ms traced. late_rank [1] for its
    DataLoader, at kit.capture's measured host excess (6.89 ms, 0.96x), at most the unprofiled step less its GPU work
    (12.43 ms) -- not the lateness read at the collectives, 26.4 ms, nearly all the tracer's on that rank and 1.8x the
    whole unprofiled step (REVIEW_S12 H1: what main said before own time took the tracer's price off, 30e26ae)."""
    from conftest import diagnosed

    d = diagnosed(sorted(INPUT_STACK.glob("*.json.gz")))
    f = next(x for x in d.findings if x.rule == "late_rank")
    ev = f.evidence
    assert (f.ranks, ev["reason"]) == ((1,), "data_wait") and d.problems[0] is f
    b = ev["step_bound"]
    assert b["basis"] == "measured" and 14_000 < b["unprofiled_step_us"] < 15_000
    assert f.cost_us_per_step <= b["cap_us"] and 0.5 <= f.cost_us_per_step / 7_200 <= 2.0


@pytest.mark.skipif(not INPUT_STACK.exists(), reason="case not here")
def test_a_lateness_the_tracers_price_leaves_unconfirmed_is_measured_by_kit_capture(monkeypatch):
    """The same window with the tracer's whole price taken (``overhead.TRACER_TAKEN`` 1.0, as main had it at
    30e26ae): rank 1's own excess is not confirmed, and the lateness read at the collectives (26.4 ms per step) less
    the tracer's price beyond rank 0's leaves under 5% of the step. Before declaring no cost confirmed, late_rank tries
    kit.capture's measurement the trace carries: rank 1's host beyond rank 0's without the profiler, near the ~7.2 ms
    per step the tokenizer adds (the cut's README) -- not 0 and "re-profile" (REVIEW_S12b N2)."""
    import kit.doctor.overhead as overhead
    from kit.doctor import diagnose

    monkeypatch.setattr(overhead, "TRACER_TAKEN", 1.0)
    d = diagnose(sorted(INPUT_STACK.glob("*.json.gz")), workers=1)
    f = next(x for x in d.findings if x.rule == "late_rank")
    ev = f.evidence
    assert (f.ranks, ev["reason"], ev["cost_basis"]) == ((1,), "data_wait", "measured_host")
    assert ev["cost_before_tracer_us"] > 20_000 and ev["tracer_excess_us"] > 0.9 * ev["cost_before_tracer_us"]
    assert ev["measured_host_confirmed"] and 0.5 <= f.cost_us_per_step / 7_200 <= 2.0
    assert "no cost of its lateness is confirmed" not in f.summary and "would gain" in f.summary


@pytest.mark.skipif(not INPUT_STACK.exists(), reason="case not here")
def test_a_lateness_that_is_the_tracers_own_is_not_a_cost_where_nothing_measures_it(monkeypatch, tmp_path):
    """As above with kitCapture stripped from both traces (no measurement without the profiler): then no cost of
    rank 1's lateness is confirmed net of the profiler, at 0, rather than "would gain 26.4 ms" (REVIEW_S12 H1)."""
    import gzip
    import json

    import kit.doctor.overhead as overhead
    from kit.doctor import diagnose

    for p in sorted(INPUT_STACK.glob("*.json.gz")):
        t = json.loads(gzip.decompress(p.read_bytes()))
        t.pop("kitCapture", None)
        (tmp_path / p.name).write_bytes(gzip.compress(json.dumps(t).encode(), compresslevel=1))
    monkeypatch.setattr(overhead, "TRACER_TAKEN", 1.0)
    d = diagnose(sorted(tmp_path.glob("*.json.gz")), workers=1)
    f = next(x for x in d.findings if x.rule == "late_rank")
    ev = f.evidence
    assert (f.ranks, ev["reason"], ev["cost_basis"], f.cost_us_per_step) == ((1,), "data_wait", "not_net_of_tracer", 0)
    assert "no cost of its lateness is confirmed" in f.summary and "would gain" not in f.summary


@pytest.mark.skipif(not INPUT_STACK.exists(), reason="case not here")
def test_an_input_stragglers_wait_is_net_of_the_tracers_price_at_its_low_end_with_the_range_said():
    """Rank 1 of the committed cut alone: its DataLoader wait, 27.9 ms per step traced, holds the tracer's price of the
    tokenizer's Python frames (25.5 ms whole). The price is taken at its low end (overhead.tracer_taken), the cost is at
    most the unprofiled step (14.4 ms, measured), and as the price is over half the slice the sentence says the cost at
    the full price too (2.4 ms): the ~7.2 ms the tokenizer adds (the cut's README) lies in the range said
    (REVIEW_S12b N1; the whole price alone said 2.44 ms, 0.34x, below a launch_bound)."""
    from kit.doctor import diagnose

    d = diagnose([INPUT_STACK / "trace_rank1.json.gz"], workers=1)
    f = d.problems[0]
    assert f.rule == "input_bound" and f.ranks == (1,)
    full = f.evidence["cost_at_tracer_full_price_us"]
    assert full <= 7_200 <= f.cost_us_per_step <= f.evidence["unprofiled_step_us"]
    assert f"{full / 1e3:.2f} ms with the tracer's price" in f.summary


@pytest.mark.xfail(strict=True, reason="the low end over-states it: 14.43 ms (2.0x of ~7.2 ms), held only by the "
                   "unprofiled step; the whole price said 2.44 ms (0.34x); the price per frame on this workload is "
                   "~1.3x its table's (FINDINGS: s12r1 check), between the two ends")
@pytest.mark.skipif(not INPUT_STACK.exists(), reason="case not here")
def test_an_input_stragglers_cost_alone_is_near_what_its_tokenizer_adds():
    from kit.doctor import diagnose

    f = diagnose([INPUT_STACK / "trace_rank1.json.gz"], workers=1).problems[0]
    assert f.rule == "input_bound" and 0.5 <= f.cost_us_per_step / 7_200 <= 2.0


def test_a_lateness_read_at_the_collectives_is_net_of_the_tracers_excess():
    """late_rank.tracer_excess: the late rank's tracer price in its Python off the ops (own_time.TRACER, median over
    its steps) beyond the other ranks' median -- what the collectives' reading of its lateness holds of the tracer's
    on that rank alone (the s12r1 window above: 27.2 ms of a 26.4 ms lateness, where own time did not confirm it) --
    at the price's low end, as own time takes it (overhead.tracer_taken: half)."""
    import pandas as pd

    from kit.doctor.overhead import tracer_taken
    from kit.doctor.own_time import TRACER
    from kit.doctor.rules.late_rank import tracer_excess

    steps = {0: pd.DataFrame({"step": [0, 1], TRACER: [200.0, 260.0]}),
             1: pd.DataFrame({"step": [0, 1], TRACER: [27_000.0, 27_400.0]}),
             2: pd.DataFrame({"step": [0, 1], TRACER: [100.0, 100.0]})}
    assert tracer_excess(steps, 1) == pytest.approx(tracer_taken(27_200.0 - 165.0))
    assert tracer_excess(steps, 0) == 0.0
    assert tracer_excess({r: ps.drop(columns=[TRACER]) for r, ps in steps.items()}, 1) == 0.0


def test_a_late_ranks_cost_is_at_most_its_step_without_the_profiler_less_its_gpu_work():
    """late_rank.step_bound: measured, kit.capture's unprofiled step less the GPU work the rank would still do (its
    own, at most the other ranks' most: a rank late for more GPU work keeps only their share); estimated, the traced
    step less the estimate over its range (the bound must survive the estimate being that much too large)."""
    from kit.doctor.overhead import ESTIMATE_RANGE, ProfilerOverhead
    from kit.doctor.rules.late_rank import step_bound

    measured = ProfilerOverhead(44_000.0, 14_431.0, 29_569.0, "measured", "kit.capture")
    assert step_bound(measured, 1, {0: 2_300.0, 1: 2_100.0})["cap_us"] == 12_331.0  # its own
    assert step_bound(measured, 1, {0: 2_000.0, 1: 9_000.0})["cap_us"] == 12_431.0  # more GPU work: the others'
    est = ProfilerOverhead(40_000.0, 20_000.0, 20_000.0, "estimated", "priced")
    assert step_bound(est, 0, {0: 5_000.0, 1: 5_000.0})["cap_us"] == 40_000.0 - 20_000.0 / ESTIMATE_RANGE - 5_000.0
    assert step_bound(ProfilerOverhead(40_000.0, None, 0.0, "none", "-"), 0, {0: 1.0, 1: 1.0}) is None
