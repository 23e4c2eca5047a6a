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
