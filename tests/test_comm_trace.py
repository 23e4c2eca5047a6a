"""Collective tracing: field extraction and bandwidth on real 2xH200 traces (tests/data) and on gloo traces,
cross-rank matching, merge, overlap, Flight Recorder, bad input; the collective_tracing investigation's tables,
figures and findings on the recorded 2xH200 run, on a gloo run, on empty and one-rank runs; and the notebook."""

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, assert_plan_kept, figure_says, kit_cli, make_run
from kit import collective_ops, contract, results, traces
from kit.traces import comm as CT

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
    assert collective_ops.canonical("_allgather_base") == "all_gather"
    assert collective_ops.from_kernel("ncclKernel_AllReduce_RING_LL_Sum_float") == "all_reduce"


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    """collective_tracing on 2 gloo ranks, tiny sizes: the parts, the traces, the FR demo at the end."""
    cfg = contract.make_config("collective_tracing", {
        "world_size": 2, "backend": "gloo", "ddp_layers": 2, "hidden": 64, "batch": 8, "tp_layers": 2,
        "tp_tokens": 64, "tp_hidden": 64, "timed_steps": 2, "profile_steps": 2,
        "results_root": str(tmp_path_factory.mktemp("ct"))})
    run = contract.execute("collective_tracing", cfg)
    assert_plan_kept("collective_tracing", cfg, run)
    return run


def test_gloo_traces_and_flight_recorder(gloo_run):
    run = gloo_run
    assert [f.path.name for f in traces.find_traces(run.dir, part="tp")] == ["trace_part=tp_rank0.json.gz",
                                                                              "trace_part=tp_rank1.json.gz"]
    df = CT.collectives([f.path for f in traces.find_traces(run.dir, part="tp")])
    assert set(df["backend"]) == {"gloo"} and set(df["rank"]) == {0, 1}
    ag = df[df.collective == "all_gather"]
    assert len(ag) == 2 * 2 * 2 and (ag["bytes"] == 64 * 64 * 4).all()  # ranks x layers x steps; fp32 on CPU
    rs = df[df.collective == "reduce_scatter"]
    assert (rs["bytes"] == 64 * 64 * 4).all()
    assert any(r["kind"] == "fr" and r["tag"] == "run" for r in run.rows)
    assert (run.dir / "merged_ddp.json.gz").exists() and (run.dir / "merged_tp.json.gz").exists()
    # the FR demo ends the run: rank 0 issues an all_reduce that rank 1 never joins
    mm = CT.fr_mismatches(pd.DataFrame([r for r in run.rows if r["kind"] == "fr" and r["tag"] == "mismatch"]))
    bad = mm[mm.problem != ""]
    assert len(bad) == 1 and bad.iloc[0]["missing"] == [1] and bad.iloc[0]["present"] == [0]
    assert bad.iloc[0]["seq"] == mm["seq"].max() and "all_reduce" in bad.iloc[0]["ops"]


def test_gloo_run_analyses(gloo_run):
    inv = contract.get("collective_tracing")
    runs = results.choose("collective_tracing", gloo_run, "this")
    said = {name: figure_says(fig(runs)) for name, fig in inv.figures.items()}
    assert said["traced-vs-sweep"] == "data" and said["overlap"].startswith("no overlap rows")  # no kernels on CPU
    assert said["nccl-phases"] == "no NCCL profiler dumps in these runs"  # gloo: no NCCL
    assert inv.table("overlap", runs).empty  # no kernels on CPU
    s = inv.table("summary", runs)
    assert set(s["part"]) == {"ddp", "tp"} and (s["duration_basis"] == "min over ranks per instance").all()
    fs = {f.key: f for f in inv.findings(runs)}
    assert fs["fr_missing_rank"].value == 1 and "never issued by rank(s) [1]" in fs["fr_missing_rank"].text
    assert "ddp_bucket_busbw" in fs and "late_peer_wait" in fs


def test_recorded_flight_recorder_on_nccl():
    d = _recorded_run("collective_tracing_fr", -1)
    df = results.load(d)
    mm = CT.fr_mismatches(df[df.kind == "fr"])
    bad = mm[mm.problem != ""]
    assert list(bad["missing"]) == [[1]] and "nccl:all_reduce" in bad.iloc[0]["ops"]


def test_overlap_intervals():
    ev = pd.DataFrame([dict(cat="kernel", device=0, nccl=True, ts=0, end=10),
                       dict(cat="kernel", device=0, nccl=True, ts=20, end=30),
                       dict(cat="kernel", device=0, nccl=False, ts=5, end=25),
                       dict(cat="kernel", device=0, nccl=False, ts=8, end=12)])
    o = traces.overlap(ev).iloc[0]
    assert o["comm_us"] == 20 and o["overlapped_us"] == 10 and o["exposed_us"] == 10 and o["overlap_share"] == 0.5


_kit = kit_cli


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


@pytest.mark.slow
@pytest.mark.background("run", "collective_tracing", "--config", "configs/cpu-smoke.yaml", "--results-root", "{root}")
def test_kit_run_collective_tracing_cpu_smoke(background):
    p, tmp_path = background
    assert p.returncode == 0, p.stdout + p.stderr
    html = next((tmp_path / "reports").iterdir()).joinpath("collective_tracing.html").read_text()
    assert "never issued by rank(s) [1]" in html
    assert "recorded:" in html and "NVIDIA H200" in html


# ------------------------------------------------------------------------------------------------ the investigation
def _recorded_run(experiment: str, which: int = 0):
    """A recorded 2xH200 run of ``experiment``; the test is skipped where the checkout does not hold it."""
    got = results.recorded(experiment)
    if not got:
        pytest.skip(f"no recorded {experiment} run in this checkout (recorded/{results.MACHINE}/{experiment})")
    return got[which]


def _recorded():
    return results.RunSet([_recorded_run("collective_tracing")], "recorded")


def test_findings_on_the_recorded_2xh200_run():
    """FINDINGS.md: DDP's 33.5 MB (32 MiB) gradient buckets reach ~232 GB/s busbw; ~25% of their kernel time ran beside
    backward; one rank's all_reduce took 403 us of which 258 us waiting; FR names rank 1."""
    fs = {f.key: f for f in contract.get("collective_tracing").findings(_recorded())}
    assert fs["ddp_bucket_busbw"].value == pytest.approx(232, abs=3) and "24 x all_reduce of 32 MiB" in fs[
        "ddp_bucket_busbw"].text
    assert fs["tp_all_gather_busbw"].value == pytest.approx(184, abs=3)
    assert fs["tp_reduce_scatter_busbw"].value == pytest.approx(180, abs=3)
    assert fs["ddp_overlap_share"].value == pytest.approx(0.253, abs=0.01)
    assert fs["tp_overlap_share"].value == 0
    assert fs["late_peer_wait"].value == pytest.approx(258, abs=1) and "took 403 us" in fs["late_peer_wait"].text
    assert fs["ddp_vs_sweep"].value == pytest.approx(0.92, abs=0.03)
    assert fs["step_ms"].value == pytest.approx(2.66, abs=0.05)
    # the FR demo of that run was recorded beside it (collective_tracing_fr/)
    assert fs["fr_missing_rank"].value == 1 and "seq 4 (nccl:all_reduce)" in fs["fr_missing_rank"].text


def test_late_peer_example_on_the_test_traces():
    """FINDINGS.md: in a raw trace one rank's all-reduce "took" 358 us, 328 us of it waiting for its peer."""
    from kit.investigations.collective_tracing.analysis import late_peer

    f = late_peer(CT.collectives(NCCL))
    assert f.value == pytest.approx(328, abs=1) and "all_reduce took 358 us" in f.text
    assert late_peer(CT.collectives(NCCL[:1])) is None  # one rank: nothing to compare with


def test_recorded_tables_and_figures():
    inv = contract.get("collective_tracing")
    runs = _recorded()
    c = inv.table("collectives", runs)
    assert len(c) == 100 and {"part", "rank", "wait_us", "instance_min_us"} <= set(c.columns)
    tvs = inv.table("traced_vs_sweep", runs).set_index(["part", "collective"])
    assert tvs.loc[("ddp", "all_reduce"), "sweep_kernel_busbw_gbps"] == pytest.approx(253, abs=5)
    assert len(inv.table("overlap", runs)) == 4 and len(inv.table("steps", runs)) == 2
    assert list(inv.table("fr_mismatches", runs)["missing"].iloc[-1]) == [1]
    for name in inv.figures:
        fig = inv.figures[name](runs)
        assert fig.axes and fig.axes[0].has_data(), name


@pytest.mark.parametrize("rows", [
    [],  # an empty run
    [{"rank": 0, "kind": "step", "part": "ddp", "method": "eager", "sample": i, "time_us": 10.0 + i} for i in range(3)]
    + [{"rank": 0, "kind": "collective", "part": "ddp", "collective": "all_reduce", "bytes": 4096, "dur_us": 5.0,
        "busbw_gbps": 0.0}],  # one rank, no traces kept
    [{"rank": 0, "kind": "fr_unavailable", "tag": "run", "reason": "no buffer"}],  # no FR, nothing else
], ids=["empty", "one-rank", "fr-unavailable"])
def test_analyses_never_raise(tmp_path, rows):
    """Every table and figure on empty / one-rank / FR-less input: the rows each table has (the network-proxy
    tables show the recorded emulated-nodes run, whatever the input: nccl_events.proxy_runs), each figure drawn or
    saying why not."""
    inv = contract.get("collective_tracing")
    runs = results.RunSet([make_run(tmp_path / "collective_tracing" / "20990101-000000-x-000000", rows,
                                    "collective_tracing")] if rows else [])
    one = 1 if rows and rows[0]["kind"] == "step" else 0
    sizes = {name: len(inv.table(name, runs)) for name in inv.tables}
    assert sizes == {"collectives": one, "summary": one, "traced_vs_sweep": one, "overlap": 0, "steps": one,
                     "fr_mismatches": 0, "nccl_collectives": 0, "nccl_summary": 0, "nccl_alignment": 0,
                     "nccl_late_peer": 0, "nccl_cost": 0, "nccl_proxy": 462, "nccl_proxy_summary": 12}
    said = {name: figure_says(fig(runs)) for name, fig in inv.figures.items()}
    assert said["traced-vs-sweep"] == ("data" if one else "no traced collective with a known size in these runs")
    assert said["timeline-ranks"] == "no DDP traces kept in these runs" and said["nccl-proxy-steps"] == "data"
    assert said["nccl-phases"] == "no NCCL profiler dumps in these runs"
    fs = inv.findings(runs)
    if rows and rows[0]["kind"] == "step":
        keys = {f.key for f in fs}
        assert "step_ms" in keys and "late_peer_wait" not in keys  # one rank: no wait to measure
        assert inv.table("collectives", runs)["wait_us"].isna().all()
    else:
        assert [f.key for f in fs] == ["no_collectives"]


def test_one_rank_traces_give_a_statement(tmp_path):
    d = make_run(tmp_path / "collective_tracing" / "20990101-000000-x-000000",
                 [{"rank": 0, "kind": "step", "part": "ddp", "sample": 0, "time_us": 1.0}], "collective_tracing")
    info = {"backend": "nccl", "rank": 0, "world_size": 1}
    kern = {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 0, "dur": 5, "args": {"device": 0, "stream": 7}}
    traces.trace_path(d, rank=0, part="ddp").write_bytes(
        gzip.compress(json.dumps({"schemaVersion": 1, "distributedInfo": info, "traceEvents": [kern]}).encode()))
    fs = contract.get("collective_tracing").findings(results.RunSet([d]))
    assert fs[0].key == "no_collectives" and "with one rank NCCL launches none" in fs[0].text


def test_config_types():
    with pytest.raises(Exception, match="dtype"):
        contract.make_config("collective_tracing", {"dtype": "int8"})
    cfg = contract.make_config("collective_tracing", {})
    assert cfg.fr_demo and cfg.teardown_s == 5.0 and cfg.env["TORCH_FR_BUFFER_SIZE"]
