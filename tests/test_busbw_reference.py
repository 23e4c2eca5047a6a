"""The reference table of known GPU/link types (kit/doctor/busbw_reference.csv, read by kit/doctor/busbw_reference.py)
and low_busbw without a sweep of the job's machine, on the committed 2xH100 corpus: the NCCL_P2P_DISABLE=1 case is
named against the table, the controls are not. CPU only."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from kit.doctor import diagnose
from kit.doctor import busbw_reference as ref

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "doctor" / "corpus-h100x2"


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """A rule's internal error fails the test (it is a kit bug), instead of becoming a skip line."""
    monkeypatch.setenv("KIT_DOCTOR_STRICT", "1")


@pytest.fixture(scope="module")
def table():
    return ref.load_table()


def _cited_runs(table) -> list[str]:
    """The recorded runs the kit-sweep rows cite; skips the test when one is not in this checkout (an optional
    recorded run that is absent skips, never fails)."""
    runs = sorted(table.loc[table["method"].str.startswith("kit sweep"), "source"].unique())
    missing = [r for r in runs if not (ROOT / r / "meta.json").is_file()]
    if missing:
        pytest.skip(f"recorded run(s) the table cites not here: {', '.join(missing)}")
    return runs


def test_every_row_names_its_source(table):
    """A kit-sweep row points at a recorded run (committed; skipped where absent); a published row at the page it
    was copied from."""
    sweeps = table[table["method"].str.startswith("kit sweep")]
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= set(sweeps["gpu"])
    assert set(sweeps["collective"]) == set(ref.COLLECTIVES_KEPT)
    assert sweeps["source"].str.startswith("recorded/").all()
    published = table[~table["method"].str.startswith("kit sweep")]
    assert published["source"].str.startswith("https://").all()
    _cited_runs(table)


def test_the_sweep_rows_are_what_the_recorded_runs_give(table, tmp_path):
    """Rebuilding the kit-sweep rows from the runs they cite gives the table as committed (no number typed in)."""
    copy = tmp_path / "t.csv"
    shutil.copy(ref.TABLE, copy)
    runs = _cited_runs(table)
    ref.rebuild([ROOT / r for r in runs], copy)
    again = ref.load_table(copy)
    again["source"] = again["source"].str.replace(str(ROOT) + "/", "", regex=False)
    key = ["source", "collective", "bytes"]
    pd.testing.assert_frame_equal(again.sort_values(key).reset_index(drop=True),
                                  table.sort_values(key).reset_index(drop=True))


def test_a_cited_run_that_is_absent_skips(table):
    """A checkout without one of the cited runs (e.g. recorded/ left out): the tests that read it skip."""
    gone = table.copy()
    gone.loc[gone["method"].str.startswith("kit sweep"), "source"] = "recorded/no-such-machine/collectives/run"
    with pytest.raises(pytest.skip.Exception, match="no-such-machine"):
        _cited_runs(gone)


def test_only_bandwidth_bound_sizes_are_compared(table):
    """On 2xH100 the all_reduce curve reaches half its peak at 8 MiB: a 2 MiB all_reduce has no reference."""
    r = ref.reference(["NVIDIA H100 80GB HBM3"] * 2, ["vm", "vm"], table)
    curve = table[(table["gpu"] == "NVIDIA H100 80GB HBM3") & (table["gpus"] == 2)
                  & (table["collective"] == "all_reduce")]
    peak = curve["busbw_gbps"].max()
    first = ref.bandwidth_bound(curve)["bytes"].min()
    assert curve.loc[curve["bytes"] == first, "busbw_gbps"].item() >= peak / 2
    assert (curve.loc[curve["bytes"] < first, "busbw_gbps"] < peak / 2).all()
    assert ref.attainable(r, "all_reduce", 2 << 20, 2) is None
    bw, src = ref.attainable(r, "all_reduce", 64 << 20, 2)
    assert bw == pytest.approx(curve.loc[curve["bytes"] == 64 << 20, "busbw_gbps"].item()) and "h100x2" in src
    assert ref.attainable(r, "all_reduce", 64 << 20, 8) is None  # no 8-GPU row: no answer


@pytest.mark.parametrize("devices, hosts, why", [
    (["NVIDIA A100-SXM4-80GB"] * 2, [None, None], "not in the reference table"),
    (["NVIDIA H100 PCIe"] * 2, [None, None], "nccl-tests/issues/194"),
    (["NVIDIA H100 80GB HBM3"] * 2, ["a", "b"], "2 hosts"),
    (["NVIDIA H100 80GB HBM3", "NVIDIA H200"], [None, None], "different GPUs"),
    ([None, None], [None, None], "name no GPU"),
])
def test_no_reference_says_why(table, devices, hosts, why):
    got = ref.reference(devices, hosts, table)
    assert isinstance(got, str) and why in got


def test_environment_differences():
    assert ref.environment_differences({"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_VERSION": "2"},
                                       "NCCL_NVLS_ENABLE=0") == ["NCCL_P2P_DISABLE=1 (the reference: unset)"]
    assert ref.environment_differences({}, "NCCL_ALGO=Ring") == ["NCCL_ALGO unset (the reference: Ring)"]
    assert ref.environment_differences({"NCCL_ALGO": "Tree"}, None) == ["NCCL_ALGO=Tree"]


def test_a_bad_table_is_one_clear_error(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("gpu,link\nx,y\n")
    with pytest.raises(ref.TableError, match="missing column"):
        ref.load_table(bad)


# ------------------------------------------------------------------------------------------- on the corpus
def _case(name: str):
    files = sorted(p for p in (CORPUS / name).iterdir() if p.name.startswith("trace_") or ".pt.trace." in p.name)
    return diagnose(files, workers=1)  # no sweep


def test_p2p_off_is_named_against_the_reference_table_without_a_sweep():
    """NCCL_P2P_DISABLE=1 on 2 NVLink H100s: the gradient all-reduces run at a tenth of the table's 2xH100 figures
    (the kit's own sweep of that machine kind); low_busbw comes first, both ranks, the basis and the setting said."""
    case = CORPUS / "gpt-ddp-bf16-p2p_off"
    if not case.is_dir():
        pytest.skip("corpus not here")
    d = _case(case.name)
    f = d.problems[0]
    assert f.rule == "low_busbw" and f.ranks == (0, 1) and f.evidence["basis"] == "reference table"
    assert f.evidence["reference_sources"] == ["recorded/h100x2/collectives/20261127-041658-vm-67be38"]
    assert max(s["ratio"] for s in f.evidence["sizes"]) < 0.2
    assert "reference table: kit sweep" in f.summary and "NCCL_P2P_DISABLE=1 (the reference: unset)" in f.summary


@pytest.mark.parametrize("name", ["gpt-ddp-bf16-control", "gpt-fsdp-bf16-control"])
def test_controls_are_silent_against_the_reference_table(name):
    """The same job with P2P on (DDP buckets of 16-49 MiB) and the FSDP control (all_gather/reduce_scatter):
    judged against the table and below nothing."""
    if not (CORPUS / name).is_dir():
        pytest.skip("corpus not here")
    d = _case(name)
    assert "low_busbw" in d.checked and not any(f.rule == "low_busbw" for f in d.findings)


def test_latency_bound_collectives_are_not_judged():
    """The CNN's 2.3-2.5 MiB all-reduces are below the table's bandwidth-bound sizes on 2xH100: skipped, said."""
    name = "cnn-ddp-fp32-control"
    if not (CORPUS / name).is_dir():
        pytest.skip("corpus not here")
    (why,) = [s.why for s in _case(name).skipped if s.rule == "low_busbw"]
    assert "bandwidth-bound sizes cover none" in why and "all_reduce 2.29 MiB" in why
