"""The collective-bandwidth investigation: sizes, the gloo sweep, the summary, nccl-tests parsing, the analyses on
empty / one-rank / old recorded rows, and the findings of the recorded 2xH200 run."""

from pathlib import Path

import pandas as pd
import pytest

from conftest import assert_plan_kept, figure_says, make_run
from kit import contract, results, stats
from kit.config import ConfigError
from kit.investigations import collectives as C

DATA = Path(__file__).parent / "data"
MiB = 1 << 20


def test_sizes_and_alignment():
    assert stats.pow2_sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    # 3 ranks, fp32: each part rounded down to 16 B (4 elements), as nccl-tests does
    assert C.per_rank_count(1024, 3, 4) == 84  # 1024/3/4 = 85.3 -> 85 -> 84
    assert C.per_rank_count(16, 8, 4) == 1  # never zero


def test_config_allowed_values_are_types():
    with pytest.raises(ConfigError, match="'allreduce' is not one of 'all_reduce'"):
        contract.make_config("collectives", {"collectives": ["allreduce"]})
    with pytest.raises(ConfigError, match="'float8' is not one of"):
        contract.make_config("collectives", {"dtype": "float8"})
    with pytest.raises(ConfigError, match="min_bytes <= max_bytes"):
        contract.make_config("collectives", {"min_bytes": 4096, "max_bytes": 1024})


def test_needs_two_ranks():
    cfg = contract.make_config("collectives", {"world_size": 1})
    why = C.INVESTIGATION.needs(cfg, contract.Machine(gpus=1, gpu_name="H100", nccl=True, world_size=1))
    assert why and "at least 2 ranks" in why[0]
    assert C.INVESTIGATION.needs(cfg, contract.Machine(gpus=0, world_size=2)) == []


def test_gloo_sweep_rows_and_bandwidths(tmp_path):
    cfg = contract.make_config("collectives", {"world_size": 2, "backend": "gloo", "max_bytes": 4096,
                                               "iters": 2, "repeats": 3, "warmup": 1,
                                               "results_root": str(tmp_path)})
    run = contract.execute("collectives", cfg)
    assert_plan_kept("collectives", cfg, run)  # 5 collectives x 3 sizes
    df = run.df()
    # every (collective, size, rank, sample) is a row; CPU has only the eager method
    assert len(df) == 5 * 3 * 2 * 3
    assert set(df["method"]) == {"eager"} and set(df["kind"]) == {"sample"}
    assert set(df["bytes"]) == {1024, 2048, 4096}
    r = df.iloc[0]
    assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
    ar = df[df.collective == "all_reduce"]
    assert (ar["busbw_gbps"] == ar["algbw_gbps"]).all()  # 2(n-1)/n = 1 for n = 2
    ag = df[df.collective == "all_gather"]
    assert ag["busbw_gbps"].to_numpy() == pytest.approx(ag["algbw_gbps"].to_numpy() * 0.5)
    runs = results.RunSet([run.dir])
    assert set(C.busbw_table(runs)["method"]) == {"eager"}
    fs = {f.key: f for f in C.findings(runs)}  # no 64 MiB point: the largest size stands in
    assert fs["all_reduce_busbw_4KiB_eager"].value > 0


def test_summary_takes_slowest_rank_per_sample():
    rows = []
    for sample, (t0, t1) in enumerate([(10, 12), (11, 30), (9, 10)]):
        rows += [dict(collective="all_reduce", bytes=MiB, method="eager", sample=sample, rank=0, time_us=t0,
                      world_size=2, host_us=4.0),
                 dict(collective="all_reduce", bytes=MiB, method="eager", sample=sample, rank=1, time_us=t1,
                      world_size=2, host_us=6.0)]
    s = C.summarize(pd.DataFrame(rows)).iloc[0]  # rows without `kind` (as recorded): samples
    assert s["time_us_median"] == 12  # max per sample: 12, 30, 10 -> median 12
    assert s["time_us_min"] == 10 and s["host_us_median"] == 5.0
    assert s["busbw_gbps"] == pytest.approx(MiB / 12e-6 / 1e9)  # factor 1 for 2 ranks


def test_kernel_summary_takes_the_rank_that_arrived_last():
    """Recorded on 2xH200 at 1 MiB: one rank's kernels spin ~50 us waiting for the other's launch."""
    rows = []
    for sample, (t0, t1) in enumerate([(57.1, 11.5), (63.0, 11.8), (339.2, 11.9)]):
        rows += [dict(kind="sample", collective="all_reduce", bytes=MiB, method="kernel", sample=sample, rank=0,
                      time_us=t0, world_size=2),
                 dict(kind="sample", collective="all_reduce", bytes=MiB, method="kernel", sample=sample, rank=1,
                      time_us=t1, world_size=2)]
    s = C.summarize(pd.DataFrame(rows)).iloc[0]
    assert s["time_us_median"] == 11.8


def test_old_rows_get_a_kind():
    df = pd.DataFrame([dict(method="eager", collective="all_reduce", bytes=1, sample=0, time_us=1.0),
                       dict(method="nccl-tests-graph", collective="all_reduce", bytes=1, sample=0, time_us=1.0,
                            placement="out-of-place"),
                       dict(kind="note", method="kernel", collective="all_reduce", bytes=1, note=C.NO_KERNEL)])
    assert C.rows(df)["kind"].tolist() == ["sample", "nccl-tests", "note"]


def test_kernel_durations_without_nccl_kernels(monkeypatch):
    """One rank: NCCL launches no kernel, the profile is empty -- no KeyError."""
    from kit import gpu_profile

    for empty in (pd.DataFrame(), pd.DataFrame(columns=["name", "nccl", "dur"]),
                  pd.DataFrame({"name": ["gemm"], "nccl": [False], "dur": [3.0]})):
        monkeypatch.setattr(gpu_profile, "profile_gpu", lambda fn, ctx, n, e=empty: e)
        assert C.kernel_durations(lambda: None, None, 3) == []


ONE_RANK = ([dict(kind="sample", collective="all_reduce", bytes=b, method=m, sample=i, rank=0, time_us=5.0 + i,
                  world_size=1, host_us=3.0) for b in (1024, MiB) for m in ("eager", "graph") for i in range(3)]
            + [dict(kind="note", collective="all_reduce", bytes=b, method="kernel", rank=0, world_size=1,
                    note=C.NO_KERNEL) for b in (1024, MiB)])


@pytest.mark.parametrize("rows, sizes, drawn", [
    ([], {"busbw": 0, "times": 0, "at_1mib": 0, "notes": 0, "regimes": 0, "nccl_transports": 0},
     {"busbw": "no collective samples in these runs", "busbw-regimes": "no all_reduce samples in these runs"}),
    (ONE_RANK, {"busbw": 4, "times": 2, "at_1mib": 2, "notes": 1, "regimes": 2, "nccl_transports": 0},
     {"busbw": "data", "busbw-regimes": "data"}),
], ids=["empty", "one-rank"])
def test_analyses_never_raise(tmp_path, rows, sizes, drawn):
    """Every table and figure on empty and one-rank (CPU) input: rows per table, and each figure drawn or saying
    why not."""
    runs = results.RunSet([make_run(tmp_path / "r", rows, "collectives")] if rows else [])
    assert {name: len(C.INVESTIGATION.table(name, runs)) for name in C.INVESTIGATION.tables} == sizes
    assert {name: figure_says(fig(runs)) for name, fig in C.INVESTIGATION.figures.items()} == drawn
    if rows:
        assert list(C.INVESTIGATION.table("times", runs).columns[:3]) == ["label", "collective", "bytes"]
        assert C.INVESTIGATION.table("notes", runs)["note"].iloc[0] == C.NO_KERNEL
    fs = C.findings(runs)
    if not rows:
        assert fs == [] and C.busbw_table(runs).empty and C.times_table(runs).empty
    else:
        keys = {f.key for f in fs}
        assert "no_kernel" in keys and "all_reduce_1MiB_kernel_us" not in keys
        assert "with one rank NCCL launches none" in C.notes_table(runs)["note"].iloc[0]
        s = C.busbw_table(runs)
        assert (s["busbw_gbps"] == 0).all()  # one rank: all_reduce moves nothing over a bus (factor 0)


def test_recorded_gpu_run_findings():
    """The committed 2xH200 run: FINDINGS.md's numbers (busbw vs nccl-tests at 64 MiB and 1 GiB; the 1 MiB
    per-call times; the host's enqueue time), from old rows without `kind`."""
    dirs = [d for d in results.recorded("collectives") if d.name == "20261122-132357-vm-53269d"]
    assert dirs, "the 2026-11-22 2xH200 run under recorded/h200x2/collectives"
    runs = results.RunSet(dirs)
    assert "kind" not in pd.read_csv(dirs[-1] / "rows.csv.gz", nrows=1).columns  # old rows: analyses fill kind
    f = {x.key: x.value for x in C.findings(runs)}
    assert f["all_reduce_busbw_64MiB_graph"] == pytest.approx(266, abs=2)
    assert f["all_reduce_busbw_64MiB_nccl-tests"] == pytest.approx(271, abs=2)
    assert f["all_reduce_busbw_1GiB_graph"] == pytest.approx(330, abs=2)
    assert f["all_reduce_busbw_1GiB_nccl-tests"] == pytest.approx(332, abs=2)
    assert f["all_reduce_1MiB_eager_us"] == pytest.approx(34, abs=1)
    assert f["all_reduce_1MiB_graph_us"] == pytest.approx(17, abs=0.5)
    assert f["all_reduce_1MiB_kernel_us"] == pytest.approx(11.7, abs=0.3)
    assert 33 <= f["all_reduce_1MiB_host_us"] <= 35 and 33 <= f["all_reduce_host_us"] <= 35
    assert MiB <= f["all_reduce_host_bound_up_to_bytes"] <= 8 * MiB  # "up to a few MiB eager measures the host"
    s = C.busbw_table(runs)
    assert {"eager", "graph", "kernel", "nccl-tests", "nccl-tests-graph"} <= set(s["method"])
    ar = s[(s.collective == "all_reduce") & (s.method == "graph")].set_index("bytes")["busbw_gbps"]
    assert ar.loc[1 << 30] > 3 * ar.loc[MiB] > 0  # latency-bound at 1 MiB, bandwidth-bound at 1 GiB
    t = C.times_table(runs)
    assert {"eager", "graph", "kernel", "host_enqueue_us"} <= set(t.columns)
    assert list(C.at_1mib_table(runs)["method"]) == ["eager", "graph", "kernel", "nccl-tests", "nccl-tests-graph"]
    assert C.notes_table(runs).empty


def test_parse_nccl_tests_output():
    text = (DATA / "all_reduce_perf.txt").read_text()
    rows = C.parse_nccl_tests(text, "all_reduce")
    oop = {r["bytes"]: r for r in rows if r["placement"] == "out-of-place"}
    assert len(oop) >= 10 and 1048576 in oop and {r["kind"] for r in rows} == {"nccl-tests"}
    r = oop[1048576]
    # algbw = bytes / time, busbw = algbw * 2(n-1)/n: check the printed numbers against the formula
    assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9, rel=0.02)
    assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"], rel=0.02)  # 2 GPUs: factor 1
    assert {r["placement"] for r in rows} == {"out-of-place", "in-place"}


def test_find_nccl_tests(tmp_path, monkeypatch):
    (tmp_path / "build").mkdir()
    exe = tmp_path / "build" / "all_reduce_perf"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert C.find_nccl_tests(str(tmp_path)) == {"all_reduce": str(exe)}
    monkeypatch.setenv("NCCL_TESTS_DIR", str(tmp_path))
    assert C.find_nccl_tests("auto")["all_reduce"] == str(exe)
    assert C.find_nccl_tests("") == {}


def test_recorded_rerun_agrees():
    """The 2026-11-23 re-run (after the refactor, another 2xH200 machine; rows with `kind`): the same headline
    numbers within the run-to-run spread."""
    dirs = [d for d in results.recorded("collectives") if d.name == "20261123-022931-vm-d798f8"]
    assert dirs
    f = {x.key: x.value for x in C.findings(results.RunSet(dirs))}
    assert f["all_reduce_busbw_64MiB_graph"] == pytest.approx(266, abs=3)
    assert f["all_reduce_busbw_1GiB_graph"] == pytest.approx(328.5, abs=2)
    assert f["all_reduce_busbw_1GiB_nccl-tests"] == pytest.approx(332, abs=2)
    assert f["all_reduce_1MiB_graph_us"] == pytest.approx(16.8, abs=1)
    assert f["all_reduce_1MiB_kernel_us"] == pytest.approx(11.8, abs=0.5)
