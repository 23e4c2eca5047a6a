"""Why a late rank arrived last (``kit.doctor.rules.late_arrival.attribute``): on synthetic collectives, where what
happened is known, and on a real recording."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kit.doctor.rules.late_arrival import HOST_REASONS, attribute

AFTER = Path(__file__).resolve().parent / "data" / "doctor" / "recorded-h200x2-fsdp-stall-before-step"


def _job(stall_us: float = 0.0, slower: float = 0.0, steps: int = 3, per_step: int = 24, at: int = 0):
    """Two ranks, ``per_step`` collectives a step, each stretch between two collectives issued by the host in
    1.2-1.8 ms (the same on both ranks but ``slower``, rank 1's extra share) and run by the GPU in 1 ms: the job is
    host-bound. Rank 0's host is 20 ms ahead of rank 1's from the start (a lag from before the trace), and rank 1's
    host stalls ``stall_us`` before the first collective of every step but the first (a sleep between backward() and
    optimizer.step()), or before its collective ``at`` of every step (a stall inside the step). Each rank's arrival is its launch or its GPU's end of the stretch, whichever is later; a
    collective runs 0.1 ms from the later arrival. Rank 1's clock is 1 s ahead of rank 0's. Returns (df, inst) as
    ``attribute`` reads them."""
    skew = {0: 0.0, 1: 1e6}
    n = steps * per_step
    # the stretches' host cost, the same on each rank: the first of a step (the optimizer, the forward's start) 4.7 ms
    shape = [4700.0 if k % per_step == 0 else 1500.0 + 150.0 * ((k * 7) % 5 - 2) for k in range(n)]
    launch = {0: [], 1: []}
    stall_at = {0: [], 1: []}  # cumulative stall before each launch
    host = {0: 0.0, 1: 20_000.0}
    stalled = {0: 0.0, 1: 0.0}
    step_ts = {0: [], 1: []}
    for k in range(n):
        for r in (0, 1):
            if r == 1 and k > 0 and k % per_step == at and stall_us:
                host[r] += stall_us
                stalled[r] += stall_us
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


def test_a_host_that_issues_more_slowly_stays_host_busy():
    """Rank 1 issues every stretch 30% more slowly than rank 0 (a contended or slower host) and stalls 1 ms once a
    step: its lag is mostly slower issuing, so is its lateness -- host_busy."""
    df, inst = _job(stall_us=1000.0, slower=0.3)
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
    its fix (CPU binding, other load), and the evidence says why (it said host_stall, whose fix starts from a sleep)."""
    from conftest import diagnosed

    f = diagnosed(sorted(CONTENDED.glob("*.json.gz"))).problems[0]
    ev = f.evidence
    assert (f.rule, f.ranks, ev["cost_basis"], ev["reason"]) == ("late_rank", (1,), "contended_host", "host_busy")
    assert ev["reason_from_stall"] == "contended_host" and "CPU binding" in f.fix
    assert ev["reason_us_per_step"]["host_stall"] > ev["reason_us_per_step"]["host_busy"]
