"""NCCL's profiler plugin next to Kineto (kit.nccl_profiler): the dump reader on real 2xH200 dumps of NCCL
2.28.9's example plugin (tests/data/nccl_profiler: a DDP step x3, an all_reduce sweep, one all_reduce with a
late peer, one all_gather; both ranks, with their Kineto traces), the clock alignment and its error bound,
the merge (every rank, valid JSON, channels under their kernels), the one-line errors (truncated dump, another
interface version, not a dump), the CLI, sysinfo, and the collective_tracing option's config rules."""

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, figure_says
from kit import contract, sysinfo, traces
from kit.nccl_profiler import align, chrome, dump, runtime
from kit.nccl_profiler import plugin as build
from kit.nccl_profiler.merge import merge as nccl_merge

DATA = Path(__file__).parent / "data" / "nccl_profiler"
DUMPS = sorted(DATA.glob("nccl_profiler_*.json.gz"))
TRACES = sorted(DATA.glob("trace_rank*.json.gz"))
COMM = 3188246364155158381


def _kit(*args):
    """``kit nccl-profiler ...`` (also ``python -m kit.nccl_profiler ...``)."""
    assert args[0] == "nccl-profiler"
    return subprocess.run([sys.executable, "-m", "kit.nccl_profiler", *args[1:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _raw(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


def test_dump_is_not_strict_json_and_reads_anyway():
    raw = _raw(DUMPS[0])
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # bare ncclBfloat16, 0x... stream pointers
    assert b'"datatype": ncclBfloat16' in raw
    d = dump.read_dump(DUMPS[0])
    assert d.rank == 0 and d.comm == COMM  # the 64-bit hash exactly (never through a float)
    assert set(d.events["cat"]) >= {"GROUP_API", "KERNEL_LAUNCH", "COLL_API", "COLL", "GPU", "PROXY"}
    api = d.events[d.events["cat"] == "COLL_API"].iloc[0]
    assert api["datatype"] == "ncclBfloat16" and api["ts"] != api["ts"]  # begin never stamped: NaN, not 0


def test_fix_json_quotes_bare_values_only():
    line = b'{"a": ncclFloat32, "s": (nil), "p": 0x7f00, "n": 3, "t": true, "q": "x"}'
    assert json.loads(dump.fix_json(line)) == {"a": "ncclFloat32", "s": "(nil)", "p": "0x7f00", "n": 3, "t": True,
                                               "q": "x"}


def test_collective_fields():
    c = dump.collectives(dump.read_dump(DUMPS[0]))
    assert len(c) == 20 and list(c["name"].value_counts().items()) == [("AllReduce", 19), ("AllGather", 1)]
    first = c.iloc[0]
    assert (first["seq"], first["count"], first["datatype"]) == (859, 16785408, "ncclBfloat16")
    assert (first["algorithm"], first["protocol"], first["n_channels"], first["channels_seen"]) == ("RING", "SIMPLE", 24, 24)
    assert int(first["gpu_start_ns"]) == 1795419337156050688  # the earliest channel's start, exact
    small = c[c["count"] == 1024].iloc[0]
    assert (small["protocol"], small["n_channels"]) == ("LL", 1)
    # every collective: its groups' launch, a GPU start, and channel starts within a microsecond of each other
    assert c["launch_end"].notna().all() and c["gpu_start_ns"].notna().all() and (c["channel_skew_us"] < 1).all()


@pytest.mark.parametrize("rank", [0, 1])
def test_alignment_within_bound(rank):
    d = dump.read_dump(DUMPS[rank])
    k = align.kineto_nccl_kernels(traces.load_trace(TRACES[rank]))
    a, m = align.align(dump.collectives(d), k, rank)
    assert a.matched == a.plugin_collectives == a.kineto_kernels == 20
    assert a.gpu_error_us <= align.ERROR_BOUND_US and a.host_error_us <= align.ERROR_BOUND_US
    # channels run inside their kernel; launch-to-first-channel on the aligned clocks agrees with Kineto's
    # own launch-to-kernel (the GPU may start the kernel ~1 µs before the launch call returns: both show it)
    assert ((m["gpu_start"] - m["kernel_ts"]).abs() <= align.ERROR_BOUND_US).all()
    assert (m["gpu_stop"] <= m["kernel_end"]).all()
    both = (m["gpu_start"] - m["launch_end"]) - (m["kernel_ts"] - m["kineto_launch_end"])
    assert (both.abs() <= 2 * align.ERROR_BOUND_US).all()
    assert all(n.lower() in k.lower().replace("_", "") for n, k in zip(m["name"], m["kernel"]))


def test_alignment_ignores_extra_and_missing_events():
    d = dump.read_dump(DUMPS[0])
    k = align.kineto_nccl_kernels(traces.load_trace(TRACES[0]))
    a, m = align.align(dump.collectives(d).iloc[5:], k.iloc[:12], 0)  # dump lacks 5, trace lacks 8
    assert a.matched == 7 and a.gpu_error_us <= align.ERROR_BOUND_US


def test_merge_puts_nccl_events_under_each_rank(tmp_path):
    out = tmp_path / "merged.json.gz"
    info = nccl_merge(DATA, out)  # the dumps beside the traces are found
    data = json.loads(gzip.decompress(out.read_bytes()))  # valid JSON
    assert info["ranks"] == [0, 1] and len(info["nccl"]) == 2
    for n in info["nccl"]:
        assert n["matched"] == 20 and n["gpu_error_us"] <= align.ERROR_BOUND_US
    ev = data["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    chans = [e for e in ev if e.get("cat") == "nccl_channel"]
    ranks = {names[e["pid"]].split(" |")[0] for e in chans}
    assert ranks == {"rank 0", "rank 1"} and len(chans) == 2 * 361
    # each channel lies under an NCCL kernel of its own process (the rank's GPU), on the merged clock
    kernels = [e for e in ev if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]
    for c in chans[:50] + chans[-50:]:
        assert any(k["pid"] == c["pid"] and k["ts"] - 1 <= c["ts"] <= k["ts"] + k["dur"] for k in kernels)
    assert {e["cat"] for e in ev if str(e.get("cat", "")).startswith("nccl_")} >= {
        "nccl_group_api", "nccl_coll", "nccl_kernel_launch", "nccl_channel"}
    assert nccl_merge(TRACES, tmp_path / "plain.json", nccl=None).get("nccl") is None
    assert traces.merge(DATA, tmp_path / "plain2.json").get("nccl") is None  # the trace layer alone: no dumps


def test_truncated_dump_one_clear_error(tmp_path):
    bad = tmp_path / f"nccl_profiler_{COMM}_0.json"
    bad.write_bytes(_raw(DUMPS[0])[:20000])
    with pytest.raises(dump.DumpError, match="truncated"):
        dump.read_dump(bad)
    for t in TRACES:
        (tmp_path / t.name).write_bytes(t.read_bytes())
    with pytest.raises(traces.TraceError, match="truncated"):
        nccl_merge(tmp_path, tmp_path / "m.json")
    p = _kit("nccl-profiler", "convert", str(bad), "-o", str(tmp_path / "c.json"))
    assert p.returncode == 2 and "truncated" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_other_interface_version_one_clear_error(tmp_path):
    f = tmp_path / f"nccl_profiler_{COMM}_0.json.gz"
    f.write_bytes(DUMPS[0].read_bytes())
    (tmp_path / dump.MANIFEST).write_text(json.dumps({"plugin": {"interface": 4}}))
    with pytest.raises(dump.DumpError, match="interface v4"):
        dump.read_dump(f)
    # a v4-shaped dump (NCCL <= 2.27's example: top-level GROUP events, no GROUP_API), no manifest
    v4 = tmp_path / "v4" / f"nccl_profiler_{COMM}_0.json"
    v4.parent.mkdir()
    v4.write_text('[\n{"name": "Group", "cat": "GROUP", "ph": "b", "id": 0, "pid": 1, "tid": 1, "ts": 1.0, '
                  '"args": {"groupId": 0}},\n{"name": "Group", "cat": "GROUP", "ph": "e", "id": 0, "pid": 1, '
                  '"tid": 1, "ts": 2.0},\n{}]\n')
    with pytest.raises(dump.DumpError, match="v4 or older"):
        dump.read_dump(v4)
    with pytest.raises(dump.DumpError, match="not a profiler-plugin dump"):
        (tmp_path / "v4" / "x.json").write_text('{"traceEvents": []}')
        dump.read_dump(tmp_path / "v4" / "x.json")


def test_cli_convert_writes_valid_chrome_json(tmp_path):
    out = tmp_path / "nccl.json"
    p = _kit("nccl-profiler", "convert", str(DATA), "-o", str(out))
    assert p.returncode == 0, p.stderr
    ev = json.loads(out.read_text())["traceEvents"]
    assert sum(e.get("cat") == "nccl_channel" for e in ev) == 2 * 361
    launches = [e for e in ev if e.get("cat") == "nccl_kernel_launch"]
    assert launches and all(e["ph"] == "i" and "only this end" in e["args"]["note"] for e in launches)


def test_chrome_channel_without_stop_says_so():
    d = dump.read_dump(DUMPS[0])
    ev = chrome.standalone(d, 1, 2)
    ch = [e for e in ev if e.get("cat") == "nccl_channel"]
    assert sum("stop" in e["args"] for e in ch) == 361 - 20  # NCCL 2.28 recorded one channel stop per collective


def test_build_errors_are_one_line(tmp_path):
    with pytest.raises(build.PluginError, match="ext-profiler/example/Makefile"):
        build.build(tmp_path, tmp_path / "out")
    with pytest.raises(build.PluginError, match="kit nccl-profiler build"):
        build.find(tmp_path / "nothing")
    p = _kit("nccl-profiler", "build", "--nccl-src", str(tmp_path), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (tmp_path / "makefiles").mkdir()
    (tmp_path / "makefiles" / "version.mk").write_text("NCCL_MAJOR   := 2\nNCCL_MINOR   := 28\nNCCL_PATCH   := 9\n")
    assert build.nccl_version(tmp_path) == "2.28.9"


def test_launch_env_and_sysinfo():
    env = runtime.launch_env(build.Plugin(path="/x/lib.so", interface=5, nccl_version="2.28.9"))
    assert env["NCCL_PROFILER_PLUGIN"] == "/x/lib.so" and env["NCCL_PROFILE_EVENT_MASK"] == "0"
    assert sysinfo.nccl_profiler_info(None) is None and sysinfo.nccl_profiler_info("none") is None
    assert "error" in sysinfo.nccl_profiler_info("/no/such/lib.so")


def test_collective_tracing_option_rules():
    with pytest.raises(Exception, match="fr_demo: false"):
        contract.make_config("collective_tracing", {"nccl_profiler": "auto"})
    cfg = contract.make_config("collective_tracing", {"nccl_profiler": "/no/such/plugin.json", "fr_demo": False})
    assert "NCCL_PROFILER_PLUGIN" not in cfg.env  # not found: needs() says so, nothing is set
    ok = contract.make_config("collective_tracing", {"fr_demo": False})
    assert "NCCL_PROFILER_PLUGIN" not in ok.env and ok.nccl_profiler == ""


# ------------------------------------------------------------------ the collective_tracing analyses, recorded run
def _recorded():
    from kit import results
    from kit.investigations.collective_tracing.nccl_events import with_dumps

    return with_dumps(results.choose("collective_tracing", [], "recorded"))


def test_recorded_run_alignment_every_rank_and_part():
    inv = contract.get("collective_tracing")
    a = inv.table("nccl_alignment", _recorded())
    assert sorted(zip(a["part"], a["rank"])) == [("ddp", 0), ("ddp", 1), ("tp", 0), ("tp", 1)]
    assert (a["matched"] == a["kineto_kernels"]).all() and (a["matched"] > 0).all()
    assert (a["gpu_error_us"] <= align.ERROR_BOUND_US).all() and (a["host_error_us"] <= align.ERROR_BOUND_US).all()


def test_recorded_run_tables_and_findings():
    inv = contract.get("collective_tracing")
    runs = _recorded()
    s = inv.table("nccl_summary", runs)
    bucket = s[(s["part"] == "ddp") & (s["bytes"] > 2**24)].iloc[0]
    assert (bucket["algorithm"], bucket["protocol"], bucket["n_channels"]) == ("RING", "SIMPLE", 24)
    assert bucket["kernel"].endswith("_RING_LL")  # the name is the launched kernel, not the protocol that ran
    assert bucket["channels_us"] < bucket["kernel_us"]
    cost = inv.table("nccl_cost", runs)
    assert set(cost["what"]) == {"all_reduce", "step ddp", "step tp"}
    assert cost[["off_us", "idle_us", "on_us"]].notna().all().all()
    lp = inv.table("nccl_late_peer", runs)
    assert lp["late_us"].iloc[0] > 100 and lp["early_channels_us"].iloc[0] > lp["late_channels_us"].iloc[0]
    keys = {f.key for f in inv.findings(runs)}
    assert {"nccl_alignment", "nccl_channels", "nccl_protocol_vs_name", "nccl_phases", "nccl_late_peer",
            "nccl_cost_all_reduce_1_MiB", "nccl_cost_step_ddp"} <= keys


def test_one_unreadable_dump_leaves_the_others_shown(tmp_path):
    """A rank whose teardown gave up writes no dump, or half of one: the tables show the other rank and the
    findings name the file (found by review: one truncated dump made every table raise)."""
    import shutil

    from kit import results

    src = next(d for d in _recorded().dirs if dump.find_dumps(d))
    d = tmp_path / src.name
    shutil.copytree(src, d)
    bad = sorted(dump.find_dumps(d))[-1]
    bad.write_bytes(gzip.compress(_raw(bad)[:5000]) if bad.suffix == ".gz" else _raw(bad)[:5000])
    runs = results.RunSet([d], "one dump truncated")
    inv = contract.get("collective_tracing")
    a = inv.table("nccl_alignment", runs)
    assert a["error"].notna().sum() == 1 and (a["matched"] > 0).any()
    assert len(inv.table("nccl_summary", runs)) > 0
    f = [x for x in inv.findings(runs) if x.key == "nccl_dump_unreadable"]
    assert len(f) == 1 and bad.name in f[0].text


def test_bad_dump_files_are_one_line_not_a_traceback(tmp_path):
    """A corrupt gzip, a negative communicator hash, an output path that cannot be written (found by review)."""
    gz = tmp_path / f"nccl_profiler_{COMM}_0.json.gz"
    gz.write_bytes(b"\x1f\x8b" + b"not gzip at all" * 10)
    with pytest.raises(dump.DumpError, match="cannot read it"):
        dump.read_dump(gz)
    neg = tmp_path / "neg" / f"nccl_profiler_{COMM}_0.json"
    neg.parent.mkdir()
    neg.write_bytes(re.sub(rb'"CommHash": *"?[0-9]+"?', b'"CommHash": -5', _raw(DUMPS[0]), count=3))
    assert len(dump.read_dump(neg).events) > 0
    p = _kit("nccl-profiler", "convert", str(DUMPS[0]), "-o", str(tmp_path / "no" / "such" / "dir" / "o.json"))
    assert p.returncode == 2 and "cannot write" in p.stderr and "Traceback" not in p.stderr


def test_analyses_without_dumps_are_empty_not_errors(tmp_path, monkeypatch):
    from kit import results
    from kit.investigations.collective_tracing import nccl_events

    monkeypatch.setattr(results, "RECORDED_ROOT", tmp_path)  # no recorded plugin run either
    d = tmp_path / "run"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"experiment": "collective_tracing", "backend": "nccl"}))
    runs = results.RunSet([d], "a GPU run without the plugin")
    assert nccl_events.with_dumps(runs).dirs == []
    for name in nccl_events.NCCL_TABLES:
        assert len(nccl_events.NCCL_TABLES[name](runs)) == 0
    said = {name: figure_says(fig(runs)) for name, fig in nccl_events.NCCL_FIGURES.items()}
    assert set(said) == {"nccl-phases", "nccl-cost", "nccl-proxy-steps"} and "data" not in said.values()
    assert said["nccl-phases"] == "no NCCL profiler dumps in these runs"
    assert said["nccl-cost"].startswith("no plugin cost rows")
    assert nccl_events.nccl_findings(runs) == []


def test_option_needs_nccl_and_a_plugin():
    cfg = contract.make_config("collective_tracing", {"nccl_profiler": "auto", "fr_demo": False, "backend": "gloo"})
    m = contract.Machine(gpus=0, nccl=False, world_size=2)
    assert any("CUDA" in r for r in contract.get("collective_tracing").needs(cfg, m))


def test_proxy_rows_take_the_first_event_of_a_repeated_collective_index(tmp_path, monkeypatch):
    """A dump whose collective index repeats: the proxy row reads that collective's first event (a lookup by index
    would give a frame there), as the scan it replaced did."""
    import types

    import pandas as pd

    from kit.investigations.collective_tracing import nccl_events as ne

    ev = pd.DataFrame([dict(idx=i, cat=cat, depth=d, coll=c, ts=t, end=t + 5, seq=q, name=n, count=256, datatype="ncclFloat32",
                            algorithm="RING", protocol="SIMPLE", n_channels=2, trans_size=1024, steps=4)
                       for i, cat, d, c, t, q, n in ((0, "COLL", 0, -1, 0, 7, "AllReduce"), (0, "COLL", 0, -1, 1, 8, "AllReduce"),
                                                     (1, "PROXY", 4, 0, 2, 0, "ProgressSend"), (2, "NET", 5, 0, 3, 0, "SendWait"))])
    monkeypatch.setattr(ne.ncd, "find_dumps", lambda d: [tmp_path / "dump.json"])
    monkeypatch.setattr(ne.ncd, "read_dump", lambda f: types.SimpleNamespace(rank=0, events=ev))
    monkeypatch.setattr(ne, "_aligned", lambda run_dir, stamp: (pd.DataFrame(), None))
    rows = ne._proxy_rows.__wrapped__(str(tmp_path), 0.0, ())
    assert [(r["name"], r["seq"], r["proxy_ops"], r["send_steps"]) for r in rows] == [("AllReduce", 7, 1, 1)]


# ------------------------------------------------------------------ the network proxy, recorded emulated-nodes run
@pytest.mark.slow  # parses the recorded run's dumps: ~50 s on 2 busy cores
def test_recorded_emulated_run_proxy_steps():
    """2xH200 as 2 emulated nodes (NCCL NET/Socket): the dumps hold ProxyOp/ProxyStep events under the
    channels; per collective the steps and their states; the one-node tables do not take that run in."""
    from kit import results
    from kit.investigations.collective_tracing import nccl_events as ne

    inv = contract.get("collective_tracing")
    one_node = _recorded()
    assert one_node.dirs and not any("emulated" in str(d) for d in one_node.dirs)
    runs = ne.proxy_runs(one_node)  # NVLink runs have no proxy steps: the recorded emulated run instead
    assert [d.parent.parent.name for d in runs.dirs] == ["h200x2-emulated"]
    t = inv.table("nccl_proxy", runs)
    assert len(t) == 462 and sorted(t["rank"].unique()) == [0, 1]
    assert t["proxy_ops"].sum() == 1740 and (t["send_steps"] + t["recv_steps"]).sum() == 9016
    s = inv.table("nccl_proxy_summary", runs).set_index(["part", "name", "bytes"])
    bucket = s.loc[("ddp", "AllReduce", 33570816.0)]
    assert (bucket["protocol"], bucket["n_channels"], bucket["send_steps"]) == ("SIMPLE", 2, 40)
    assert bucket["step_bytes"] == pytest.approx(839270.4) and bucket["SendPeerWait_us"] < 1
    assert bucket["SendWait_us"] < bucket["SendGpuWait_us"] and bucket["kernel_us"] == pytest.approx(11032.8, abs=1)
    assert {("tp", "AllGather"), ("tp", "ReduceScatter")} <= {k[:2] for k in s.index}
    assert ne.proxy_runs(runs).dirs == runs.dirs  # a run with steps is analysed as it is
    f = {x.key: x for x in ne.proxy_findings(one_node)}
    assert "40 send + 40 receive steps of 820 KiB" in f["nccl_proxy_steps"].text
    assert f["nccl_proxy_events"].value == 9016
    fig = ne.proxy_figure(one_node)
    assert len(fig.axes[0].patches) == 6 * len(s)
    import matplotlib.pyplot as plt

    plt.close(fig)
    assert ne.proxy_table(results.RunSet([one_node.dirs[-1]])).shape[0] > 0  # falls back, never empty
