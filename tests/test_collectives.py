"""The collective-bandwidth experiment: formulas, sizes, the gloo sweep, the summary, nccl-tests parsing."""

from pathlib import Path

import pandas as pd
import pytest

from kit.investigations import collectives as C
from kit import contract as experiments

DATA = Path(__file__).parent / "data"


def test_bus_factors_match_nccl_tests():
    assert C.bus_factor("all_reduce", 2) == 1.0
    assert C.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert C.bus_factor("all_gather", 8) == C.bus_factor("reduce_scatter", 8) == C.bus_factor("all_to_all", 8) == 0.875
    assert C.bus_factor("broadcast", 8) == 1.0


def test_sizes_and_alignment():
    assert C.sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    # 3 ranks, fp32: each part rounded down to 16 B (4 elements), as nccl-tests does
    assert C.per_rank_count(1024, 3, 4) == 84  # 1024/3/4 = 85.3 -> 85 -> 84
    assert C.per_rank_count(16, 8, 4) == 1  # never zero


def test_gloo_sweep_rows_and_bandwidths(tmp_path):
    cfg = experiments.make_config("collectives", {"world_size": 2, "backend": "gloo", "max_bytes": 4096,
                                                  "iters": 2, "repeats": 3, "warmup": 1,
                                                  "results_root": str(tmp_path)})
    run = experiments.execute("collectives", cfg)
    df = run.df()
    # every (collective, size, rank, sample) is a row; CPU has only the eager method
    assert len(df) == 5 * 3 * 2 * 3
    assert set(df["method"]) == {"eager"}
    assert set(df["bytes"]) == {1024, 2048, 4096}
    r = df.iloc[0]
    assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
    ar = df[df.collective == "all_reduce"]
    assert (ar["busbw_gbps"] == ar["algbw_gbps"]).all()  # 2(n-1)/n = 1 for n = 2
    ag = df[df.collective == "all_gather"]
    assert ag["busbw_gbps"].to_numpy() == pytest.approx(ag["algbw_gbps"].to_numpy() * 0.5)


def test_summary_takes_slowest_rank_per_sample():
    rows = []
    for sample, (t0, t1) in enumerate([(10, 12), (11, 30), (9, 10)]):
        rows += [dict(collective="all_reduce", bytes=1 << 20, method="eager", sample=sample, rank=0, time_us=t0,
                      world_size=2, host_us=4.0),
                 dict(collective="all_reduce", bytes=1 << 20, method="eager", sample=sample, rank=1, time_us=t1,
                      world_size=2, host_us=6.0)]
    s = C.summarize(pd.DataFrame(rows)).iloc[0]
    assert s["time_us_median"] == 12  # max per sample: 12, 30, 10 -> median 12
    assert s["time_us_min"] == 10 and s["host_us_median"] == 5.0
    assert s["busbw_gbps"] == pytest.approx((1 << 20) / 12e-6 / 1e9)  # factor 1 for 2 ranks


def test_kernel_summary_takes_the_rank_that_arrived_last():
    """Recorded on 2xH200 at 1 MiB: one rank's kernels spin ~50 us waiting for the other's launch."""
    rows = []
    for sample, (t0, t1) in enumerate([(57.1, 11.5), (63.0, 11.8), (339.2, 11.9)]):
        rows += [dict(collective="all_reduce", bytes=1 << 20, method="kernel", sample=sample, rank=0, time_us=t0, world_size=2),
                 dict(collective="all_reduce", bytes=1 << 20, method="kernel", sample=sample, rank=1, time_us=t1, world_size=2)]
    s = C.summarize(pd.DataFrame(rows)).iloc[0]
    assert s["time_us_median"] == 11.8


def test_recorded_gpu_run_summary():
    """The committed 2-GPU run: every method present, and busbw rises with size toward the link plateau."""
    from kit import results

    runs = results.recorded("collectives")
    assert runs, "no recorded GPU run under recorded/collectives"
    df = results.load(runs[-1])
    s = C.summarize(df)
    ar = s[(s.collective == "all_reduce") & (s.method == "graph")].set_index("bytes")["busbw_gbps"]
    assert ar.loc[1 << 30] > 3 * ar.loc[1 << 20] > 0  # latency-bound at 1 MiB, bandwidth-bound at 1 GiB
    assert {"eager", "graph", "kernel", "nccl-tests"} <= set(s["method"])
    assert results.read_meta(runs[-1])["sysinfo"]["gpus"]


def test_parse_nccl_tests_output():
    text = (DATA / "all_reduce_perf.txt").read_text()
    rows = C.parse_nccl_tests(text, "all_reduce")
    oop = {r["bytes"]: r for r in rows if r["placement"] == "out-of-place"}
    assert len(oop) >= 10 and 1048576 in oop
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
