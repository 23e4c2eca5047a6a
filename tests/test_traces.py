"""Trace analysis on real profiler traces recorded on 2xH200 (tests/data), the graph census on real dumps,
and `kit trace gaps` on good, truncated and foreign files."""

import gzip
import json
import subprocess
import sys
from pathlib import Path


from conftest import ROOT
from kit import traces

DATA = Path(__file__).parent / "data"


def test_nccl_kernel_names():
    assert traces.is_nccl_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    assert traces.is_nccl_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)")  # NCCL < 2.19 naming
    assert traces.is_nccl_kernel("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE")
    assert not traces.is_nccl_kernel("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x128x8")


def test_gpu_events_from_graph_replay_on_several_streams():
    ev = traces.gpu_events(traces.load(DATA / "graph_N10_default_rank0.json.gz"))
    k = ev[ev.cat == "kernel"]
    assert len(k) == 60 and k.nccl.sum() == 30  # 3 forwards x 10 layers x (GEMM + all_reduce)
    assert k.stream.nunique() >= 2  # graph replay spreads kernels over its own streams
    assert (ev.end >= ev.ts).all()


def test_gap_definition_on_a_constructed_timeline():
    import pandas as pd

    rows = [  # device 0: A on stream 1, B overlaps A on stream 2, C after a 5 us idle gap, D after a stall
        dict(name="gemmA", cat="kernel", device=0, stream=1, ts=0, dur=10, nccl=False),
        dict(name="ncclDevKernel_B", cat="kernel", device=0, stream=2, ts=4, dur=2, nccl=True),
        dict(name="memset", cat="gpu_memset", device=0, stream=1, ts=11, dur=1, nccl=False),
        dict(name="ncclDevKernel_C", cat="kernel", device=0, stream=1, ts=17, dur=3, nccl=True),
        dict(name="gemmD", cat="kernel", device=0, stream=1, ts=3020, dur=1, nccl=False),
        dict(name="gemmE", cat="kernel", device=1, stream=1, ts=100, dur=1, nccl=False),
    ]
    ev = pd.DataFrame(rows)
    ev["end"] = ev.ts + ev.dur
    g = traces.gaps(ev, threshold_us=1000).set_index("name")
    assert g.loc["ncclDevKernel_B", "gap_us"] == 0  # overlapping another stream is not idleness
    assert g.loc["ncclDevKernel_C", "gap_us"] == 5  # 17 - max(10, 6, 12)
    assert bool(g.loc["gemmD", "stall"]) and g.loc["gemmD", "gap_us"] == 3000
    assert "gemmA" not in g.index and "gemmE" not in g.index  # first activity on a device has no gap
    s = traces.gap_summary(g)["summary"]
    assert s["before_nccl_us"]["count"] == 2 and s["before_nccl_us"]["max"] == 5
    assert s["before_other_us"]["count"] == 0 and s["stalls"] == 1


def test_recorded_gap_finding_mixing_on_vs_off():
    """2xH200, N=10 graph replay: the gap before NCCL kernels is larger with NCCL's mixing support on."""
    on = traces.trace_gaps(DATA / "graph_N10_default_rank0.json.gz")["summary"]["before_nccl_us"]
    off = traces.trace_gaps(DATA / "graph_N10_mix0_rank0.json.gz")["summary"]["before_nccl_us"]
    assert on["count"] == off["count"] == 30
    assert on["median"] > 1.5 * off["median"]


def test_census_on_real_dumps():
    on = traces.graph_census((DATA / "graph_N4_default.dot").read_text())
    off = traces.graph_census((DATA / "graph_N4_mix0.dot").read_text())
    assert on["KERNEL:nccl"] == off["KERNEL:nccl"] == 4 and on["KERNEL:other"] == 4
    assert on["EVENT_RECORD"] == 4 and on["EVENT_WAIT"] == 1
    assert "EVENT_RECORD" not in off and "EVENT_WAIT" not in off
    assert on["edges"] > off["edges"]


def _kit(*args):
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_cli_trace_gaps_json():
    p = _kit("trace", "gaps", str(DATA / "graph_N10_default_rank0.json.gz"), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for key in ("before_nccl_us", "before_other_us"):
        assert set(out["summary"][key]) >= {"count", "median", "p90", "max"}
    assert out["summary"]["before_nccl_us"]["count"] == 30
    assert "0" in out["per_gpu"]
    text = _kit("trace", "gaps", str(DATA / "graph_N10_default_rank0.json.gz"), "--threshold-us", "2").stdout
    assert "before NCCL" in text and "stalls:" in text


def test_cli_trace_gaps_bad_input(tmp_path):
    raw = gzip.decompress((DATA / "graph_N10_default_rank0.json.gz").read_bytes())
    (tmp_path / "trunc.json").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "trunc.json.gz").write_bytes(gzip.compress(raw)[:2000])
    (tmp_path / "foreign.json").write_text('{"hello": 1}')
    (tmp_path / "binary.json").write_bytes(bytes(range(256)))
    for name, msg in (("trunc.json", "truncated"), ("trunc.json.gz", "is the file complete"),
                      ("foreign.json", "not a PyTorch profiler trace"), ("binary.json", "not"), ("missing.json", "no such file")):
        p = _kit("trace", "gaps", str(tmp_path / name))
        assert p.returncode == 2, name
        assert msg in p.stderr and "Traceback" not in p.stderr, (name, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


# ------------------------------------------------------------------------------------------------ the trace layer
RECORDED = ROOT / "recorded"


def _write(tmp_path, name, events, **header):
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, **header, "traceEvents": events}))
    return p


def _kernel(name, ts, dur, device=0, stream=7, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": device, "stream": stream, **args}}


def test_trace_gaps_reads_arrays_without_pandas_and_agrees_with_the_frames(tmp_path):
    """`kit trace gaps FILE` works on the trace's columns as arrays (no DataFrame, no pandas import: 0.3-0.4 s
    of a command); its result is the one the DataFrame path (gaps + gap_summary) gives, on two devices with
    overlapping streams, ties and a stall, and on a real trace."""
    evs = [_kernel("gemmA", 0, 10), _kernel("ncclDevKernel_B", 4, 2, stream=8), _kernel("gemmC", 17, 3),
           _kernel("gemmT", 17, 1, stream=8), _kernel("ncclDevKernel_D", 3020, 1),
           {**_kernel("memcpy", 20, 30, device=1), "cat": "gpu_memcpy"}, _kernel("gemmE", 55.125, 1, device=1),
           _kernel("ncclDevKernel_F", 56.5, 1, device=1), {**_kernel("flow", 60, 1, device=1), "ph": "f"}]
    two = _write(tmp_path, "two.json", evs, distributedInfo={"rank": 3, "world_size": 4})
    code = ("import json, sys; from kit.traces import trace_gaps; "
            "r = [trace_gaps(p, 1000.0, cache=False) for p in sys.argv[1:]]; "
            "print(json.dumps({'res': r, 'pandas': 'pandas' in sys.modules}))")
    real = DATA / "graph_N10_default_rank0.json.gz"
    p = subprocess.run([sys.executable, "-c", code, str(two), str(real)], capture_output=True, text=True, cwd=ROOT)
    out = json.loads(p.stdout)
    assert out["pandas"] is False, "trace_gaps on one file imported pandas"
    for path, res in zip((two, real), out["res"]):
        t = traces.load_trace(path, cpu="none", cache=False)
        g = traces.gaps(t.gpu, 1000.0)
        assert {k: res[k] for k in ("summary", "per_gpu")} == traces.gap_summary(g)
        assert res["kernels"] == int((t.gpu["cat"] == "kernel").sum()) and res["nccl_kernels"] == int(t.gpu.nccl.sum())
    res = out["res"][0]
    assert set(res["per_gpu"]) == {"0", "1"} and res["summary"]["stalls"] == 1
    assert res["per_gpu"]["1"]["before_other_us"] == {"count": 1, "median": 5.125, "p90": 5.125, "max": 5.125}
    assert res["per_gpu"]["1"]["before_nccl_us"]["max"] == 0.375  # sub-us gaps kept exactly


def test_load_trace_frames_on_a_real_nccl_trace():
    t = traces.load_trace(DATA / "colls_rank0.json.gz")
    assert list(t.gpu.columns) == list(traces.GPU_COLUMNS) and list(t.cpu.columns) == list(traces.CPU_COLUMNS)
    assert t.info.rank == 0 and t.info.world_size == 2 and t.info.backend == "nccl" and t.info.nccl_version
    assert t.info.events > len(t.gpu) + len(t.cpu)  # flows, metadata... counted, not kept
    k = t.gpu[t.gpu.nccl]
    assert len(k) == 3 and set(k.collective) >= {"allreduce"} and (k.in_nelems == 2**20).any()
    # the launch of each kernel is in the cpu frame with the kernel's correlation id (for the doctor)
    launches = t.cpu[t.cpu.cat.isin(["cuda_runtime", "cuda_driver"])]
    assert set(k.correlation) <= set(launches.correlation)
    assert {"nccl:all_reduce", "record_param_comms"} <= set(t.cpu.name)
    assert list(t.collectives.collective) == ["all_reduce", "all_gather", "reduce_scatter"]
    assert t.adapter == "kineto"


def test_cpu_modes_keep_only_what_is_asked():
    p = DATA / "colls_rank0.json.gz"
    none, comm, full = (traces.load_trace(p, cpu=m) for m in ("none", "comm", "all"))
    assert none.cpu.empty and list(none.cpu.columns) == list(traces.CPU_COLUMNS)
    assert set(comm.cpu.name) <= {n for n in full.cpu.name if n.startswith(("nccl:", "c10d::", "gloo:", "record_param"))}
    assert len(full.cpu) > len(traces.load_trace(p).cpu) > len(comm.cpu) > 0
    assert none.gpu.equals(full.gpu)


def test_gpu_events_is_the_gpu_frame():
    d = traces.load(DATA / "graph_N10_default_rank0.json.gz")
    assert traces.gpu_events(d).equals(traces.load_trace(DATA / "graph_N10_default_rank0.json.gz").gpu)


def test_every_arg_is_read_through_a_declared_adapter(tmp_path):
    # a future torch that renames 'Collective name' and 'In msg nelems': one adapter, the analyses unchanged
    ev = [_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10, 20, **{"coll": "allreduce", "nIn": 1024,
                                                                      "Out msg nelems": 1024, "dtype": "Float",
                                                                      "Group size": 2})]
    p = _write(tmp_path, "future.json", ev, future=True)
    assert traces.load_trace(p).gpu.in_nelems.isna().all()  # unknown keys: not read
    future = traces.KINETO.extend("future", args={"coll": "collective", "nIn": "in_nelems"},
                                  detect=lambda h: "future" in h)
    traces.ADAPTERS.insert(0, future)
    try:
        t = traces.load_trace(p)
        assert t.adapter == "future" and t.gpu.in_nelems.iloc[0] == 1024
        assert t.collectives.bytes.iloc[0] == 4096 and t.collectives.collective.iloc[0] == "all_reduce"
    finally:
        traces.ADAPTERS.remove(future)
    import pytest

    with pytest.raises(ValueError, match="unknown column"):
        traces.KINETO.extend("bad", args={"x": "no_such_column"})


def test_legacy_kineto_categories(tmp_path):
    """PyTorch 1.8-1.9 traces: capitalised categories, lower-case 'external id', no schemaVersion."""
    ev = [{"ph": "X", "cat": "Kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0, "tid": 7,
           "ts": 5, "dur": 10, "args": {"device": 0, "stream": 7, "correlation": 3, "external id": 9}},
          {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 2,
           "args": {"correlation": 3, "external id": 9}},
          {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 0, "dur": 1, "args": {"device": 0}}]
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    t = traces.load_trace(p)
    assert t.adapter == "kineto-legacy"
    assert list(t.gpu.cat) == ["kernel", "gpu_memcpy"] and t.gpu.external_id.iloc[0] == 9 and t.gpu.nccl.iloc[0]
    assert t.cpu.correlation.iloc[0] == 3 and t.cpu.cat.iloc[0] == "cuda_runtime"
    assert t.collectives.collective.iloc[0] == "all_reduce"


def test_every_real_trace_parses(tmp_path):
    files = sorted(DATA.glob("*.json.gz")) + [f.path for f in traces.find_traces(RECORDED)]
    assert len(files) > 30
    for f in files:
        t = traces.load_trace(f)
        world = t.info.world_size  # 1, 2 or 4: the machines' folders (a probe may run 2 ranks on a 4-GPU box)
        assert len(t.gpu) and world in (1, 2, 4) and t.info.rank in range(world), f
        assert (t.gpu.end >= t.gpu.ts).all()
        g = traces.gaps(t.gpu)
        k = t.gpu[t.gpu.cat == "kernel"]  # one gap per kernel but each device's first (a copy-only trace: none)
        assert len(g) == len(k) - k.device.nunique() or len(g) > 0, f
        o = traces.overlap(t.gpu)
        assert (o.overlapped_us <= o.comm_us + 1e-6).all() and set(o.device) == set(k.device), f
        c = traces.collectives([t])
        n = t.counts()
        assert len(c) == n["nccl_kernels"] + n["gloo_ops"] and c.collective.notna().all(), f


# ------------------------------------------------------------------------------------------------ empty / one rank
def test_empty_trace_every_analysis(tmp_path):
    """A trace file without events is bad input (one line); a Trace without events (built from a dict, or
    what is left of one) goes through every analysis as empty frames."""
    import pytest

    p = _write(tmp_path, "empty.json", [])
    for fn in (traces.load_trace, traces.trace_gaps, lambda x: traces.collectives([x]),
               lambda x: traces.merge([x], tmp_path / "m.json")):
        with pytest.raises(traces.TraceError, match="no events"):
            fn(p)
    t = traces.from_dict({"schemaVersion": 1, "traceEvents": []})
    assert t.gpu.empty and list(t.gpu.columns) == list(traces.GPU_COLUMNS) and t.info.events == 0
    assert t.collectives.empty and list(t.collectives.columns) == traces.COLLECTIVE_COLUMNS
    df = traces.collectives([t])
    assert df.empty and "wait_us" in df.columns
    assert traces.explain_empty(df) == "the trace(s) hold no events at all"
    assert traces.format_text(df, traces.summary(df)) == "the trace(s) hold no events at all"
    assert traces.summary(df).empty and "busbw_gbps_p50" in traces.summary(df).columns
    assert traces.to_json(df, traces.summary(df))["notes"] == "the trace(s) hold no events at all"
    g = traces.gaps(t.gpu)
    assert g.empty and "gap_us" in g.columns
    assert traces.gap_summary(g)["summary"]["before_nccl_us"]["count"] == 0
    assert traces.overlap(t.gpu).empty and list(traces.overlap(t.gpu).columns) == traces.OVERLAP_COLUMNS
    assert traces.overlap(__import__("pandas").DataFrame()).empty
    assert traces.clock_offsets([t]) == {0: 0.0}
    assert traces.aligned_gpu([t]).empty
    assert traces.collectives([]).empty and traces.explain_empty(traces.collectives([])) == "no trace given"


def test_one_rank_trace_says_why_there_is_no_nccl_kernel(tmp_path):
    one = {"backend": "nccl", "rank": 0, "world_size": 1}
    p = _write(tmp_path, "one.json", [_kernel("sm90_gemm", 0, 5), _kernel("sm90_gemm", 10, 5)], distributedInfo=one)
    df = traces.collectives([p])
    text = traces.format_text(df, traces.summary(df))
    assert text == "no NCCL kernel in this trace: with one rank NCCL launches none"
    res = traces.trace_gaps(p)
    assert res["nccl_kernels"] == 0 and res["summary"]["before_nccl_us"]["count"] == 0
    assert "no NCCL kernel" in traces.format_gaps(res)
    o = traces.overlap(traces.load_trace(p).gpu).iloc[0]
    assert o.comm_us == 0 and o.compute_us == 10 and o.overlap_share != o.overlap_share  # NaN: nothing to hide
    # gloo records its collectives even on one rank; busbw follows nccl-tests (0 for all_reduce over 1 rank)
    gl = {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
          "args": {"Input Dims": [[256]], "Input type": ["float"]}}
    q = _write(tmp_path, "gloo1.json", [gl], distributedInfo={"backend": "gloo", "rank": 0, "world_size": 1})
    c = traces.collectives([q])
    assert len(c) == 1 and c.bytes.iloc[0] == 1024 and c.busbw_gbps.iloc[0] == 0 and c.wait_us.isna().all()
    s = traces.summary(c)
    assert s.duration_basis.iloc[0].startswith("raw")


def test_no_gpu_kernels_and_no_collective_metadata(tmp_path):
    p = _write(tmp_path, "cpu.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
                                       "dur": 3, "args": {}}],
               distributedInfo={"backend": "nccl", "rank": 0, "world_size": 2})
    df = traces.collectives([p])
    assert traces.explain_empty(df).startswith("no GPU kernel in the trace(s)")
    k = _write(tmp_path, "k.json", [_kernel("sm90_gemm", 0, 5)], distributedInfo={"backend": "nccl", "rank": 0,
                                                                                  "world_size": 2})
    assert "no collective ran in the profiled window" in traces.explain_empty(traces.collectives([k]))


def test_merge_decodes_each_file_once_more_than_its_offsets_need(monkeypatch, tmp_path):
    """merge streams each rank's events out once; the clock offsets come from the per-rank collective frames,
    which the trace cache keeps -- so a second merge of the same traces decodes each file once."""
    from kit.traces import parse

    calls = []
    real = parse.read_bytes  # every decode reads the file once
    monkeypatch.setattr(parse, "read_bytes", lambda p: calls.append(str(p)) or real(p))
    tp = []
    for f in (DATA / "tp_rank0.json.gz", DATA / "tp_rank1.json.gz"):
        tp.append(tmp_path / f.name)
        tp[-1].write_bytes(f.read_bytes())
    info = traces.merge(tp, tmp_path / "m.json.gz")
    assert sorted(calls) == sorted(map(str, tp * 2)) and info["ranks"] == [0, 1]
    calls.clear()
    traces.merge(tp, tmp_path / "m2.json.gz")
    assert sorted(calls) == sorted(map(str, tp))


def test_merge_copies_every_event_with_only_pid_and_ts_changed(tmp_path):
    """merge decodes only pid and ts; every other value (args, names, flows) is the source's, value for value."""
    tp = [DATA / "tp_rank0.json.gz", DATA / "tp_rank1.json.gz"]
    info = traces.merge(tp, tmp_path / "m.json", cache=False)
    merged = json.loads((tmp_path / "m.json").read_text())["traceEvents"]
    meta = {("M", "process_name"), ("M", "process_sort_index")}
    out = [e for e in merged if (e.get("ph"), e.get("name")) not in meta]
    src = []
    pids = {}
    for f in tp:
        t = json.loads(gzip.decompress(f.read_bytes()))
        r = t["distributedInfo"]["rank"]
        for e in t["traceEvents"]:
            if (e.get("ph"), e.get("name")) in meta:
                continue
            pids.setdefault((r, e.get("pid")), len(pids))
            src.append((r, e))
    assert len(out) == len(src)
    new_pid = {}
    for o, (r, e) in zip(out, src):
        assert {k: v for k, v in o.items() if k not in ("pid", "ts")} == {k: v for k, v in e.items()
                                                                          if k not in ("pid", "ts")}
        assert new_pid.setdefault((r, e.get("pid")), o["pid"]) == o["pid"]  # one merged pid per (rank, pid)
        if "ts" in e:
            assert o["ts"] == float(e["ts"]) + info["offsets_us"][r]
    assert len(set(new_pid.values())) == len(pids)


def test_aligned_gpu_puts_ranks_on_one_clock():
    tp = [DATA / "tp_rank0.json.gz", DATA / "tp_rank1.json.gz"]
    off = traces.clock_offsets(tp)
    ev = traces.aligned_gpu(tp)
    assert set(ev["rank"]) == {0, 1} and abs(off[1]) < 1000 and off[0] == 0
    raw1 = traces.load_trace(tp[1]).gpu
    assert ev[ev["rank"] == 1]["ts"].min() == raw1["ts"].min() + off[1]
    # the first collective every rank ran now ends at the same time on both ranks
    c = traces.collectives(tp)
    first = c[c.instance == 0].sort_values("start_us").groupby("rank").first()
    ends = (first.start_us + first.dur_us + first.index.map(off)).tolist()
    assert abs(ends[0] - ends[1]) < 1e-6


# ------------------------------------------------------------------------------------------------ names
def test_trace_path_round_trips(tmp_path):
    import pytest

    p = traces.trace_path(tmp_path, rank=1, model="matmul-only", layers=10, mode="graph")
    assert p == tmp_path / "trace_model=matmul-only_layers=10_mode=graph_rank1.json.gz"
    assert traces.parse_name(p.name) == ({"model": "matmul-only", "layers": "10", "mode": "graph"}, 1)
    q = traces.trace_path(tmp_path, rank=0, h2d="side_stream", sync="per_param")
    assert traces.parse_name(q.name) == ({"h2d": "side_stream", "sync": "per_param"}, 0)

    class Ctx:
        run_dir, rank = tmp_path, 3

    assert traces.trace_path(Ctx(), part="ddp").name == "trace_part=ddp_rank3.json.gz"
    assert traces.trace_path(tmp_path, part="ddp").name == "trace_part=ddp.json.gz"  # no rank: not one rank's
    for bad in ({"bucket_mb": 25}, {"x": "a b"}, {"x": "a=b"}, {"x": ""}, {}):
        with pytest.raises(ValueError):
            traces.trace_path(tmp_path, rank=0, **bad)


def test_find_traces_new_and_old_names(tmp_path):
    for r in (0, 1):
        for part in ("ddp", "tp"):
            traces.trace_path(tmp_path, rank=r, part=part).write_text("{}")
    (tmp_path / "merged_ddp.json.gz").write_text("{}")
    (tmp_path / "fr_run_rank0.json").write_text("{}")
    (tmp_path / "meta.json").write_text("{}")
    found = traces.find_traces(tmp_path, part="ddp")
    assert [(f.tags, f.rank) for f in found] == [({"part": "ddp"}, 0), ({"part": "ddp"}, 1)]
    assert all(f.run_dir == tmp_path for f in found)
    assert len(traces.find_traces(tmp_path)) == 4 and len(traces.find_traces(tmp_path, rank=1)) == 2
    assert len(traces.find_traces([tmp_path], part=["ddp", "tp"], rank=[0])) == 2
    # the names the kit wrote before the naming scheme (runs of 2026-11-22 in recorded/), with today's tags: the
    # files are made here, so the check does not depend on which recorded runs the repository keeps
    old = tmp_path / "old"
    names = {"ct": ["trace_ddp_rank0.json.gz", "trace_ddp_rank1.json.gz", "merged_ddp.json.gz"],
             "gg": [f"trace_{m}_N{n}_{mode}_rank{r}.json.gz" for m in ("allreduce", "matmul-only") for n in (10, 160)
                    for mode in ("eager", "graph") for r in (0, 1)],
             "dl": ["trace_pageable_per_param_rank0.json.gz", "trace_pageable_per_param_rank1.json.gz"],
             "p2p": ["traces/comm_compute-nccl-rank0.json.gz", "traces/comm_compute-nccl-rank1.json.gz"]}
    for run, files in names.items():
        (old / run).mkdir(parents=True)
        (old / run / "meta.json").write_text("{}")
        for n in files:
            (old / run / n).parent.mkdir(exist_ok=True)
            (old / run / n).write_text("{}")
    ct = traces.find_traces(old / "ct", part="ddp")
    assert [f.rank for f in ct] == [0, 1] and ct[0].path.name == "trace_ddp_rank0.json.gz"
    assert ct[0].run_dir == old / "ct"
    gg = traces.find_traces(old / "gg", model="allreduce", layers=10, mode="graph")
    assert len(gg) == 2 and gg[0].path.name == "trace_allreduce_N10_graph_rank0.json.gz"
    assert traces.find_traces(old / "gg", model="matmul-only", layers=160, mode="eager", rank=1)
    dl = traces.find_traces(old / "dl", h2d="pageable", sync="per_param")
    assert [f.path.name for f in dl] == ["trace_pageable_per_param_rank0.json.gz", "trace_pageable_per_param_rank1.json.gz"]
    p2p = traces.find_traces(old / "p2p", experiment="comm_compute", transport="nccl")
    assert [f.rank for f in p2p] == [0, 1] and p2p[0].path.parent.name == "traces" and p2p[0].run_dir == old / "p2p"
    assert not traces.find_traces(old, name="merged_ddp")  # merged traces and FR dumps are not rank traces
    data = traces.find_traces(DATA, name="tp")
    assert [f.rank for f in data] == [0, 1]
    assert traces.find_traces(tmp_path / "nowhere") == []


def test_flight_recorder_and_census_on_empty_and_one_rank():
    import pandas as pd

    assert traces.fr_mismatches(pd.DataFrame()).empty and traces.fr_statements(traces.fr_mismatches(pd.DataFrame())) == []
    one = pd.DataFrame([{"rank": 0, "pg_name": "0", "seq": s, "op": "gloo:all_reduce", "state": "completed",
                         "is_p2p": False} for s in (1, 2)])
    mm = traces.fr_mismatches(one)
    assert list(mm.problem) == ["", ""] and traces.fr_statements(mm) == []
    two = pd.concat([one, one.assign(rank=1).iloc[:1]], ignore_index=True)
    assert traces.fr_statements(traces.fr_mismatches(two)) == [
        "seq 2 (gloo:all_reduce): reached by rank(s) [0], never issued by rank(s) [1]"]
    assert traces.graph_census("") == {"edges": 0}
