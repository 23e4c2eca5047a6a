"""Collective tracing: field extraction and bandwidth on real 2xH200 traces (tests/data) and on gloo traces,
cross-rank matching, merge, overlap, Flight Recorder, bad input, and the notebook."""

import dataclasses
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT
from kit.traces import comm as CT
from kit import contract as experiments, results

DATA = Path(__file__).parent / "data"
NCCL = [DATA / "colls_rank0.json.gz", DATA / "colls_rank1.json.gz"]
TP = [DATA / "tp_rank0.json.gz", DATA / "tp_rank1.json.gz"]


def test_fields_from_nccl_kernels():
    rows = CT.collective_rows(NCCL[0])
    assert [r["collective"] for r in rows] == ["all_reduce", "all_gather", "reduce_scatter"]
    ar, ag, rs = rows
    assert ar["rank"] == 0 and ar["group_size"] == 2 and ar["dtype"] == "Float" and ar["process_group"] == "0"
    # nccl-tests' size: the larger buffer. 1M fp32 elements in; all_gather out = 2M; reduce_scatter in = 1M
    assert ar["bytes"] == 4 * 2**20 and ag["bytes"] == 8 * 2**20 and rs["bytes"] == 4 * 2**20
    # busbw by hand: all_reduce 2(n-1)/n = 1 for n = 2; all_gather (n-1)/n = 0.5
    assert ar["busbw_gbps"] == pytest.approx(4 * 2**20 / (ar["dur_us"] * 1e-6) / 1e9)
    assert ag["busbw_gbps"] == pytest.approx(8 * 2**20 / (ag["dur_us"] * 1e-6) / 1e9 * 0.5)


def test_late_peer_wait_removed_by_cross_rank_matching():
    df = CT.collectives(NCCL)
    ar = df[df.collective == "all_reduce"].set_index("rank")
    # recorded: rank 1's kernel ran ~358 us, waiting for rank 0; rank 0's ran ~30 us
    assert ar.loc[1, "dur_us"] > 10 * ar.loc[0, "dur_us"]
    assert ar.loc[1, "instance_min_us"] == ar.loc[0, "dur_us"] and ar.loc[0, "wait_us"] == 0
    s = CT.summary(df).set_index("collective")
    assert s.loc["all_reduce", "dur_us_p50"] == ar.loc[0, "dur_us"]
    assert s.loc["all_reduce", "duration_basis"] == "min over ranks per instance"
    one = CT.summary(CT.collectives(NCCL[1:])).set_index("collective")
    assert one.loc["all_reduce", "dur_us_p50"] == ar.loc[1, "dur_us"]  # one trace: raw durations
    assert one.loc["all_reduce", "duration_basis"].startswith("raw")


def test_tensor_parallel_trace_summary():
    s = CT.summary(CT.collectives(TP)).set_index("collective")
    assert s.loc["all_gather", "count"] == s.loc["reduce_scatter", "count"] == 12  # 4 layers x 3 steps
    assert s.loc["all_gather", "bytes"] == 4096 * 4096 * 2  # bf16 tokens x hidden, gathered
    assert 50 < s.loc["all_gather", "busbw_gbps_p50"] < 1000


def test_kernel_rows_without_metadata(tmp_path):
    t = json.loads(gzip.decompress(NCCL[0].read_bytes()))
    t.pop("distributedInfo")
    for e in t["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"] = {k: v for k, v in e["args"].items() if k in ("device", "stream")}
    p = tmp_path / "bare.json"
    p.write_text(json.dumps(t))
    rows = CT.collective_rows(p)
    assert [r["collective"] for r in rows] == ["all_reduce", "all_gather", "reduce_scatter"]  # from kernel names
    assert all(r["bytes"] is None and r["busbw_gbps"] is None and r["dur_us"] > 0 for r in rows)
    assert CT.canonical("_allgather_base") == "all_gather" and CT._kernel_collective("ncclKernel_AllReduce_RING_LL_Sum_float") == "all_reduce"


def test_gloo_traces_and_flight_recorder(tmp_path):
    cfg = experiments.make_config("collective_tracing", {"world_size": 2, "backend": "gloo", "ddp_layers": 2,
                                                         "hidden": 64, "batch": 8, "tp_layers": 2, "tp_tokens": 64,
                                                         "tp_hidden": 64, "timed_steps": 2, "profile_steps": 2,
                                                         "results_root": str(tmp_path)})
    run = experiments.execute("collective_tracing", cfg)
    df = CT.collectives(sorted(run.dir.glob("trace_tp_rank*.json.gz")))
    assert set(df["backend"]) == {"gloo"} and set(df["rank"]) == {0, 1}
    ag = df[df.collective == "all_gather"]
    assert len(ag) == 2 * 2 * 2 and (ag["bytes"] == 64 * 64 * 4).all()  # ranks x layers x steps; fp32 on CPU
    rs = df[df.collective == "reduce_scatter"]
    assert (rs["bytes"] == 64 * 64 * 4).all()
    assert any(r["kind"] == "fr" for r in run.rows)
    # the mismatch demo: rank 0 issues a 4th all_reduce that rank 1 never joins
    from kit.investigations import collective_tracing as T
    from kit.launch import launch

    demo = launch(T.mismatch, dataclasses.replace(cfg, teardown_s=5.0), "fr_demo")
    fr = pd.DataFrame([r for r in demo.rows if r["kind"] == "fr"])
    mm = CT.fr_mismatches(fr)
    bad = mm[mm.problem != ""]
    assert len(bad) == 1 and bad.iloc[0]["seq"] == 4 and bad.iloc[0]["missing"] == [1] and bad.iloc[0]["present"] == [0]


def test_recorded_flight_recorder_on_nccl():
    d = results.recorded("collective_tracing_fr")[-1]
    df = results.load(d)
    mm = CT.fr_mismatches(df[df.kind == "fr"])
    bad = mm[mm.problem != ""]
    assert list(bad["missing"]) == [[1]] and "nccl:all_reduce" in bad.iloc[0]["ops"]


def test_overlap_intervals():
    ev = pd.DataFrame([dict(cat="kernel", device=0, nccl=True, ts=0, end=10),
                       dict(cat="kernel", device=0, nccl=True, ts=20, end=30),
                       dict(cat="kernel", device=0, nccl=False, ts=5, end=25),
                       dict(cat="kernel", device=0, nccl=False, ts=8, end=12)])
    o = CT.overlap(ev).iloc[0]
    assert o["comm_us"] == 20 and o["overlapped_us"] == 10 and o["exposed_us"] == 10 and o["overlap_share"] == 0.5


def _kit(*args):
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_collectives_json_keys():
    p = _kit("trace", "collectives", *map(str, TP), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(CT.ROW_KEYS) <= set(out["collectives"][0])
    assert set(CT.SUMMARY_KEYS) <= set(out["summary"][0])


def test_cli_merge_valid_json_with_every_rank(tmp_path):
    out = tmp_path / "merged.json.gz"
    p = _kit("trace", "merge", *map(str, TP), "-o", str(out))
    assert p.returncode == 0, p.stderr
    m = json.loads(gzip.decompress(out.read_bytes()))
    names = [e["args"]["name"] for e in m["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"]
    assert any(n.startswith("rank 0") for n in names) and any(n.startswith("rank 1") for n in names)
    assert m["kit"]["ranks"] == [0, 1] and abs(m["kit"]["offsets_us"]["1"]) < 1000
    n_in = sum(len(json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]) for f in TP)
    assert len([e for e in m["traceEvents"] if e.get("ph") != "M" or e["name"] not in ("process_name", "process_sort_index")]) <= n_in


def test_cli_bad_traces(tmp_path):
    raw = gzip.decompress(TP[0].read_bytes())
    (tmp_path / "trunc.json").write_bytes(raw[: len(raw) // 3])
    (tmp_path / "foreign.json").write_text("[1, 2, 3]")
    for name in ("trunc.json", "foreign.json", "nope.json"):
        for verb in (["collectives"], ["merge", "-o", str(tmp_path / "o.json")]):
            p = _kit("trace", verb[0], str(tmp_path / name), *verb[1:])
            assert p.returncode == 2 and "Traceback" not in p.stderr, (name, verb, p.stderr)


def test_kit_run_collective_tracing_cpu_smoke(tmp_path):
    p = _kit("run", "collective_tracing", "--config", "configs/cpu-smoke.yaml", "--results-root", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    html = next((tmp_path / "reports").iterdir()).joinpath("collective_tracing.html").read_text()
    assert "never issued by rank(s) [1]" in html
    assert "recorded:" in html and "NVIDIA H200" in html
