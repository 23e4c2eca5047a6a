"""benchmarks/bench_p2p.py's both-ways ipc line on small synthetic runs (CPU): the plain 95% target, the branch that
measures ipc against the copy-out limit of the same run (copy both ways with a local copy beside it), the limit's two
guards (not below the fully serialised bound; the slowdown outside the spread), and runs without those rows; and where
the bandwidth experiment times that reference."""

import types

import pandas as pd
import pytest

from benchmarks import bench_p2p as B
from kit.investigations.p2p_transports import analysis as A
from kit.investigations.p2p_transports import bandwidth as BW

N = 256 << 20


def _rows(us: dict[str, float], samples: int = 5, step: float = 0.001) -> pd.DataFrame:
    """Bandwidth rows both ways at 256 MiB: per transport (or reference) ``samples`` samples around its median,
    ``step`` apart (relative)."""
    out = []
    for t, med in us.items():
        for k in range(samples):
            out.append(dict(kind="bandwidth", transport=t, direction="both", src=0, dst=1, bytes=N, iters=10,
                            sample=k, rank=0, time_us=med * (1 + step * (k - samples // 2)), world_size=2))
    return pd.DataFrame(out)


def _check(us, step: float = 0.001) -> tuple[B.Check, str]:
    check = B.Check()
    both = A.at_size(_rows(us, step=step), N, "both", spread=True)  # as check_run reads it
    B.check_ipc_both(both, check)
    return check, both


def test_plain_target_passes_without_the_limit(capsys):
    check, _ = _check({"copy": 716.0, "ipc": 740.0, BW.BESIDE: 769.0})  # 0.968
    out = capsys.readouterr().out
    assert check.ok and "passes on the plain target: ipc 0.968 >= 0.95" in out and "limit" not in out


def test_limit_branch_passes_with_its_numbers(capsys):
    # the 4x H100 case: the link both ways 7.4% slower with a local copy beside it, ipc 0.887 of copy
    check, both = _check({"copy": 716.0, "ipc": 807.2, BW.BESIDE: 769.0, BW.LOCAL: 184.0})
    out = capsys.readouterr().out
    lim = A.copy_out_limit(both)
    assert lim["limit"] == pytest.approx(716.0 / 769.0) and lim["slowdown"] == pytest.approx(769.0 / 716.0 - 1)
    assert check.ok
    assert "against this run's copy-out limit" in out and "PASS" in out
    assert "ipc 0.887 < 0.95; this run's copy-out limit 0.931 (link both ways +7.4% with a local copy beside it: " \
           "769.0 vs 716.0 us per round); ipc at 0.953 of it: passes on the copy-out limit" in out
    assert "the limit's guards: not below the fully serialised bound 0.796; the beside rounds' p10 767.8 us above " \
           "copy's p90 717.1 us" in out


def test_limit_branch_fails_when_ipc_is_below_095_of_the_limit(capsys):
    check, _ = _check({"copy": 716.0, "ipc": 850.0, BW.BESIDE: 769.0, BW.LOCAL: 184.0})  # 0.842: 0.905 of the limit
    out = capsys.readouterr().out
    assert not check.ok and "FAIL" in out and "ipc at 0.905 of it: below 0.95 of the limit: FAILS" in out


def test_a_limit_at_or_above_095_excuses_nothing(capsys):
    check, _ = _check({"copy": 716.0, "ipc": 800.0, BW.BESIDE: 720.0})  # the H200 case: +0.6%, limit 0.994
    out = capsys.readouterr().out
    assert not check.ok and "is not below 0.95: it excuses nothing" in out and "passes" not in out


def test_without_the_interference_rows_it_is_the_plain_check(capsys):
    check, both = _check({"copy": 716.0, "ipc": 807.2, BW.LOCAL: 184.0})
    out = capsys.readouterr().out
    assert A.copy_out_limit(both) is None and not check.ok
    assert "(target >= 0.95) FAIL" in out and "no copy-out limit measured in this run" in out


def test_check_run_reads_the_limit_and_the_finding_states_it(capsys):
    df = _rows({"copy": 716.0, "ipc": 807.2, "ipc-direct": 733.0, BW.BESIDE: 769.0, BW.LOCAL: 184.0})
    check = B.Check()
    B.check_run(df, check, "synthetic")
    out = capsys.readouterr().out
    assert check.ok and "ipc at 0.953 of it" in out and "ipc-direct / copy, 256 MiB both ways" in out
    f = {o.key: o for o in A.findings(df)}[f"bandwidth.both.{BW.BESIDE}"]
    assert f.value == pytest.approx(716.0 / 769.0, rel=1e-3)
    assert "769.0 us per round against 716.0 alone (+7.4%)" in f.text and "at most 0.931x copy" in f.text


def test_a_limit_below_the_fully_serialised_bound_is_not_used(capsys):
    # beside a local copy the link is 33% slower: more than the copy-out alone after the round (716 / 900 = 0.796)
    check, both = _check({"copy": 716.0, "ipc": 950.0, BW.BESIDE: 950.0, BW.LOCAL: 184.0})  # ipc = the limit
    out = capsys.readouterr().out
    assert A.copy_out_limit(both)["limit"] == pytest.approx(716.0 / 950.0) and not check.ok
    assert "(target >= 0.95) FAIL" in out and "against this run's copy-out limit" not in out
    assert "this run's copy-out limit 0.754 is not used: below the fully serialised bound 0.796" in out


def test_a_slowdown_inside_the_spread_is_not_used(capsys):
    # the same medians as the passing case, samples 5% apart: beside p10 < copy p90
    check, both = _check({"copy": 716.0, "ipc": 807.2, BW.BESIDE: 769.0, BW.LOCAL: 184.0}, step=0.05)
    out = capsys.readouterr().out
    lim = A.copy_out_limit(both)
    assert lim["beside_p10"] <= lim["copy_p90"] and not check.ok and "(target >= 0.95) FAIL" in out
    assert "this run's copy-out limit 0.931 is not used: the beside rounds' p10 " in out
    assert "the slowdown is inside the spread" in out


def test_without_the_copy_out_alone_the_limit_is_not_used(capsys):
    check, _ = _check({"copy": 716.0, "ipc": 807.2, BW.BESIDE: 769.0})
    out = capsys.readouterr().out
    assert not check.ok and "(target >= 0.95) FAIL" in out
    assert "is not used: no copy-out alone (local copy_) timed in this run to bound it from below" in out


def _fake(in_process: bool, copy_engine: bool = True):
    caps = types.SimpleNamespace(in_process=in_process, copy_engine=copy_engine)
    return types.SimpleNamespace(caps=caps, name="t"), types.SimpleNamespace(is_cuda=True)


def test_the_reference_is_timed_for_the_in_process_transport_both_ways_at_one_size_only():
    assert BW.beside_size([1 << 10, 128 << 20, 256 << 20, 512 << 20, 1 << 30]) == 256 << 20
    assert BW.beside_size([1 << 10, 64 << 20]) == 64 << 20 and BW.beside_size([1 << 30]) is None
    flows = [(0, 1, N), (1, 0, N)]
    T, S = _fake(in_process=True)
    ref = BW.references(T, S, "both", flows)  # the interference rows, joined once per sample as copy's own
    assert callable(ref) and ref.joined == (BW.BESIDE,)
    assert BW.references(T, S, "both") is None  # the other both-ways sizes: none
    assert BW.references(T, S, "one", flows) is BW._copy_references
    T, S = _fake(in_process=False)
    assert BW.references(T, S, "both", flows) is BW._local_reference  # ipc keeps its copy-out alone
    assert BW.references(*_fake(True, copy_engine=False), "both", flows) is None
    assert BW.references(T, types.SimpleNamespace(is_cuda=False), "both", flows) is None  # CPU: no references
