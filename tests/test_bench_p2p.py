"""benchmarks/bench_p2p.py's both-ways ipc line on small synthetic runs (CPU): the plain 95% target, the branch that
measures ipc against the copy-out limit of the same run (copy both ways with a local copy beside it), and runs
without those rows; and where the bandwidth experiment times that reference."""

import types

import pandas as pd
import pytest

from benchmarks import bench_p2p as B
from kit.investigations.p2p_transports import analysis as A
from kit.investigations.p2p_transports import bandwidth as BW

N = 256 << 20


def _rows(us: dict[str, float], samples: int = 5) -> pd.DataFrame:
    """Bandwidth rows both ways at 256 MiB: per transport (or reference) ``samples`` samples around its median."""
    out = []
    for t, med in us.items():
        for k in range(samples):
            out.append(dict(kind="bandwidth", transport=t, direction="both", src=0, dst=1, bytes=N, iters=10,
                            sample=k, rank=0, time_us=med * (1 + 0.001 * (k - samples // 2)), world_size=2))
    return pd.DataFrame(out)


def _check(us) -> tuple[B.Check, str]:
    check = B.Check()
    both = A.at_size(_rows(us), N, "both")
    B.check_ipc_both(both, check)
    return check, both


def test_plain_target_passes_without_the_limit(capsys):
    check, _ = _check({"copy": 716.0, "ipc": 740.0, BW.BESIDE: 769.0})  # 0.968
    out = capsys.readouterr().out
    assert check.ok and "passes on the plain target: ipc 0.968 >= 0.95" in out and "limit" not in out


def test_limit_branch_passes_with_its_numbers(capsys):
    # the 4x H100 case: the link both ways 7.4% slower with a local copy beside it, ipc 0.887 of copy
    check, both = _check({"copy": 716.0, "ipc": 807.2, BW.BESIDE: 769.0})
    out = capsys.readouterr().out
    lim = A.copy_out_limit(both)
    assert lim["limit"] == pytest.approx(716.0 / 769.0) and lim["slowdown"] == pytest.approx(769.0 / 716.0 - 1)
    assert check.ok
    assert "against this run's copy-out limit" in out and "PASS" in out
    assert "ipc 0.887 < 0.95; this run's copy-out limit 0.931 (link both ways +7.4% with a local copy beside it: " \
           "769.0 vs 716.0 us per round); ipc at 0.953 of it: passes on the copy-out limit" in out


def test_limit_branch_fails_when_ipc_is_below_095_of_the_limit(capsys):
    check, _ = _check({"copy": 716.0, "ipc": 850.0, BW.BESIDE: 769.0})  # 0.842 of copy, 0.905 of the limit
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
    df = _rows({"copy": 716.0, "ipc": 807.2, "ipc-direct": 733.0, BW.BESIDE: 769.0})
    check = B.Check()
    B.check_run(df, check, "synthetic")
    out = capsys.readouterr().out
    assert check.ok and "ipc at 0.953 of it" in out and "ipc-direct / copy, 256 MiB both ways" in out
    f = {o.key: o for o in A.findings(df)}[f"bandwidth.both.{BW.BESIDE}"]
    assert f.value == pytest.approx(716.0 / 769.0, rel=1e-3)
    assert "769.0 us per round against 716.0 alone (+7.4%)" in f.text and "at most 0.931x copy" in f.text


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
