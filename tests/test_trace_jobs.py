"""Many rank traces: which files a directory or glob names, per-rank work in this process,
in a local process pool and on a real ``distributed.LocalCluster`` (not a mock) with identical results, one
bad file among many (named, the others analysed, exit 3), and 16 generated ranks whose collectives match
across all of them."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_trace_tools import SKEW_US, make_job
from conftest import ROOT
from kit import traces
from kit.traces.jobs import RankFailure, expand, map_ranks

DATA = Path(__file__).parent / "data"
TP = [DATA / "tp_rank0.json.gz", DATA / "tp_rank1.json.gz"]
NCCL = [DATA / "colls_rank0.json.gz", DATA / "colls_rank1.json.gz"]


def _kit(*args):
    return subprocess.run([sys.executable, "-m", "kit", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _json(*args):
    p = _kit(*args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        with distributed.Client(c) as client:
            yield c, client


@pytest.fixture(scope="module")
def job16(tmp_path_factory):
    """16 ranks from tp_rank0/1: rank r's clock skewed by r x SKEW_US, two repetitions of the source events."""
    return make_job(tmp_path_factory.mktemp("job16"), 16, reps=2, suffix=".json.gz")


def _truncated(tmp_path, name="trace_job=x_rank2.json"):
    raw = gzip.decompress(TP[0].read_bytes())
    p = tmp_path / name
    p.write_bytes(raw[: len(raw) // 3])
    return p


# ------------------------------------------------------------------------------------------------ expand
def test_expand_directory_glob_and_files(tmp_path):
    for p in [*TP, *NCCL]:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    for junk in ("merged_part=x.json.gz", "fr_rank0.json", ".stamps.json", "notes.txt"):
        (tmp_path / junk).write_text("{}")
    (tmp_path / ".kitcache").mkdir()
    (tmp_path / ".kitcache" / "tp_rank0.json.gz.none.gpu.parquet").write_text("x")
    found = expand([tmp_path])
    assert [p.name for p in found] == ["colls_rank0.json.gz", "tp_rank0.json.gz", "colls_rank1.json.gz",
                                       "tp_rank1.json.gz"]  # by rank, then by name
    assert [p.name for p in expand(str(tmp_path / "tp_*.json.gz"))] == ["tp_rank0.json.gz", "tp_rank1.json.gz"]
    assert expand([TP[1], TP[0], TP[1]]) == TP  # sorted by rank, each once
    assert expand(tmp_path / "nope.json") == [tmp_path / "nope.json"]  # a missing file fails when read, named
    with pytest.raises(traces.TraceError, match="no trace file matches"):
        expand([str(tmp_path / "*.pt.trace.json")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(traces.TraceError, match="no rank trace"):
        expand([tmp_path / "empty"])


def test_a_directorys_other_json_is_not_a_rank(tmp_path):
    """A job's folder often holds other JSON (a config, metrics, the corpus' truth.json): without a rank or 'trace'
    in its name and without traceEvents it is not a rank (before: an unreadable rank, exit 3 'partial'); a trace
    under any name still is, and a file given by name is always read."""
    (tmp_path / TP[0].name).write_bytes(TP[0].read_bytes())
    (tmp_path / "truth.json").write_text(json.dumps({"case": "x", "step_us": 1.0}))
    (tmp_path / "config.json.gz").write_bytes(gzip.compress(b'{"lr": 0.1}'))
    with gzip.open(TP[1]) as f:
        (tmp_path / "job.json").write_bytes(f.read())  # rank 1's trace, named neither by rank nor as a trace
    assert sorted(p.name for p in expand([tmp_path])) == ["job.json", "tp_rank0.json.gz"]
    assert expand([tmp_path / "truth.json"]) == [tmp_path / "truth.json"]
    from kit.doctor import diagnose

    d = diagnose([tmp_path])
    assert not d.failed and sorted(d.ranks) == [0, 1]


def test_a_sidecar_is_told_by_its_content_and_each_skipped_file_by_its_reason(tmp_path):
    """kit.capture's ``capture_rank0.json`` has a rank in its name: it is left out because it holds no
    traceEvents, and a directory holding nothing else says so for it -- not that its name lacks a rank -- and each
    other file skipped with its own reason; a trace saved under a sidecar's name is a rank."""
    sidecar = {"rank": 0, "world_size": 1, "device": "cpu", "files": ["trace_rank0.json.gz"]}
    (tmp_path / "capture_rank0.json").write_text(json.dumps(sidecar))
    (tmp_path / "config.json.gz").write_bytes(gzip.compress(b'{"lr": 0.1}'))
    (tmp_path / "fr_rank0.json").write_text("{}")
    with pytest.raises(traces.TraceError) as e:
        expand([tmp_path])
    msg = str(e.value)
    assert ("other JSON skipped: capture_rank0.json (kit.capture's sidecar, not a trace: no traceEvents); "
            "config.json.gz (no rank or 'trace' in its name, no traceEvents in its first 64 KB); "
            "fr_rank0.json (a Flight Recorder dump))") in msg, msg
    (tmp_path / TP[0].name).write_bytes(TP[0].read_bytes())
    assert [p.name for p in expand([tmp_path])] == [TP[0].name]
    with gzip.open(TP[1]) as f:
        (tmp_path / "capture_rank1.json").write_bytes(f.read())  # a trace under a sidecar's name
    assert [p.name for p in expand([tmp_path])] == [TP[0].name, "capture_rank1.json"]


def test_a_directorys_json_that_is_not_json_is_read_and_named(tmp_path):
    """``rank0.json`` holding something else than JSON (a log written under the wrong name) is kept, so that
    reading it says what is wrong with it, not that other JSON was skipped."""
    from kit.doctor import diagnose
    from kit.traces import TraceError

    (tmp_path / "rank0.json").write_text("Traceback (most recent call last):\n")
    assert [p.name for p in expand([tmp_path])] == ["rank0.json"]
    with pytest.raises(TraceError) as e:
        diagnose([tmp_path], workers=1)
    assert "rank0.json" in str(e.value) and "other JSON skipped" not in str(e.value)


# ------------------------------------------------------------------------------------------------ map_ranks
def _kernels(path):
    return int((traces.load_trace(path, cpu="none").gpu["cat"] == "kernel").sum())


def _boom(path):
    raise RuntimeError(f"no luck with {Path(path).name}")


def test_map_ranks_in_process_pool_and_dask(tmp_path, cluster):
    bad = _truncated(tmp_path)
    paths = [TP[0], bad, TP[1]]
    local = map_ranks(paths, _kernels, workers=1)
    assert [p for p, _ in local.ok] == [TP[0], TP[1]] and local.values() == [62, 62] and local.partial
    assert local.failed[0].path == bad and "truncated" in local.failed[0].error
    assert "Traceback" not in local.failed[0].error
    for other in (map_ranks(paths, _kernels, workers=2), map_ranks(paths, _kernels, client=cluster[1])):
        assert other == local
    boom = map_ranks(TP, _boom, workers=2)
    assert boom.failed == [RankFailure(TP[0], "RuntimeError: no luck with tp_rank0.json.gz"),
                           RankFailure(TP[1], "RuntimeError: no luck with tp_rank1.json.gz")]
    assert not boom.partial
    with pytest.raises(traces.TraceError) as e:
        boom.raise_if_all_failed()
    assert len(str(e.value).splitlines()) == 2


# ------------------------------------------------------------------------------------------------ identical everywhere
@pytest.mark.parametrize("pair", [TP, NCCL], ids=["tp", "colls"])
def test_collectives_and_gaps_identical_locally_and_on_dask(pair, cluster):
    addr = cluster[0].scheduler_address
    for verb in ("collectives", "gaps"):
        one = _json("trace", verb, *pair, "--workers", "1")
        assert one == _json("trace", verb, *pair, "--workers", "2") == _json("trace", verb, *pair, "--scheduler", addr)
    # the Python API with a Client gives the same frame as in this process
    a = traces.collectives(pair)
    b = traces.collectives(pair, client=cluster[1])
    assert a.equals(b) and a.attrs["failed"] == b.attrs["failed"] == []


def test_two_rank_outputs_unchanged():
    """For 1-2 traces the outputs are the ones of the one-process code: same JSON as the API on loaded Traces."""
    loaded = [traces.load_trace(p, cpu="comm") for p in TP]
    df = traces.collectives(loaded)
    assert _json("trace", "collectives", *TP) == json.loads(json.dumps(traces.to_json(df, traces.summary(df)),
                                                                       default=str))
    single = _json("trace", "gaps", TP[0])
    assert "per_rank" not in single and single["trace"] == str(TP[0]) and "per_gpu" in single


def test_gaps_many_ranks_per_rank_and_combined():
    res = traces.trace_gaps(TP)
    assert [r["rank"] for r in res["per_rank"]] == [0, 1] and res["failed"] == []
    for r, p in zip(res["per_rank"], TP):  # each rank's block is the one-file result
        assert {k: v for k, v in r.items() if k != "rank"} == traces.trace_gaps(p)
    c = res["combined"]
    assert c["ranks"] == 2 and c["kernels"] == sum(r["kernels"] for r in res["per_rank"])
    import numpy as np

    pooled = np.concatenate([g[~g.stall & (g.before == "nccl")].gap_us.to_numpy()
                             for g in (traces.gaps(traces.load_trace(p).gpu) for p in TP)])
    s = c["summary"]["before_nccl_us"]
    assert s["count"] == len(pooled)
    assert abs(s["median"] - np.median(pooled)) < 1e-3 and abs(s["p90"] - np.percentile(pooled, 90)) < 1e-3
    assert abs(s["max"] - pooled.max()) < 1e-3
    text = _kit("trace", "gaps", *TP).stdout
    assert "2 ranks, 124 kernels" in text and "all ranks, all GPUs" in text


# ------------------------------------------------------------------------------------------------ one bad file
def test_one_bad_file_among_many(tmp_path):
    bad = _truncated(tmp_path)
    for verb in ("collectives", "gaps"):
        p = _kit("trace", verb, *TP, bad, "--json", "--workers", "2")
        assert p.returncode == 3, p.stderr
        out = json.loads(p.stdout)
        assert [f["trace"] for f in out["failed"]] == [str(bad)] and "truncated" in out["failed"][0]["error"]
        assert "partial result" in p.stderr and "Traceback" not in p.stderr
        text = _kit("trace", verb, *TP, bad)
        assert text.returncode == 3 and "could not read 1 rank trace(s)" in text.stdout and str(bad) in text.stdout
    rows = json.loads(_kit("trace", "collectives", *TP, bad, "--json").stdout)["collectives"]
    assert {r["rank"] for r in rows} == {0, 1}
    merged = tmp_path / "m.json"
    p = _kit("trace", "merge", *TP, bad, "-o", merged)
    assert p.returncode == 3 and str(bad) in p.stdout
    assert json.loads(merged.read_text())["kit"]["ranks"] == [0, 1]
    assert "exit status" in _kit("trace", "collectives", "--help").stdout and "3 partial" in _kit(
        "trace", "gaps", "--help").stdout


def test_every_file_bad_is_exit_2_one_line_each(tmp_path):
    bad = [_truncated(tmp_path, "a_rank0.json"), tmp_path / "missing_rank1.json.gz"]
    for verb in (["collectives"], ["gaps"], ["merge", "-o", tmp_path / "o.json"]):
        p = _kit("trace", *verb[:1], *bad, *verb[1:])
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 2 and "Traceback" not in p.stderr, (verb, p.stderr)
        assert any(str(bad[0]) in x and "truncated" in x for x in lines)
        assert any(str(bad[1]) in x and "no such file" in x for x in lines)
    p = _kit("trace", "gaps", tmp_path / "nothing*.json")
    assert p.returncode == 2 and "no trace file matches" in p.stderr


def test_traces_of_different_jobs_are_bad_input(tmp_path):
    """One rank twice, or world sizes that differ: collectives and merge refuse (exit 2, one line per file)
    instead of pairing unrelated kernels."""
    twice = tmp_path / "again_rank0.json.gz"
    twice.write_bytes(TP[0].read_bytes())
    for verb in (["collectives"], ["merge", "-o", tmp_path / "o.json"]):
        p = _kit("trace", verb[0], TP[0], twice, *verb[1:])
        assert p.returncode == 2 and "Traceback" not in p.stderr, (verb, p.stderr)
        assert "rank 0 again" in p.stderr and "again_rank0.json.gz" in p.stderr and "tp_rank0.json.gz" in p.stderr
    one = tmp_path / "one_rank1.json"
    data = json.loads(gzip.decompress(TP[1].read_bytes()))
    data["distributedInfo"]["world_size"] = 4
    one.write_text(json.dumps(data))
    p = _kit("trace", "collectives", TP[0], one)
    assert p.returncode == 2 and "world size 4, others [2]: traces of different jobs" in p.stderr


# ------------------------------------------------------------------------------------------------ inputs
def test_directory_and_glob_inputs(tmp_path):
    for p in TP:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    files = _json("trace", "collectives", *TP)
    assert _json("trace", "collectives", tmp_path) == _json("trace", "collectives", tmp_path / "tp_rank*.json.gz")
    rows = _json("trace", "collectives", tmp_path)["collectives"]
    assert [{k: v for k, v in r.items() if k != "trace"} for r in rows] == [
        {k: v for k, v in r.items() if k != "trace"} for r in files["collectives"]]
    g = _json("trace", "gaps", tmp_path)
    assert [r["rank"] for r in g["per_rank"]] == [0, 1]


# ------------------------------------------------------------------------------------------------ many ranks
def test_sixteen_ranks_match_and_align(job16, tmp_path, cluster):
    assert len(job16) == 16 and expand([job16[0].parent]) == job16
    df = traces.collectives(job16[0].parent, workers=2)
    assert sorted(df["rank"].unique()) == list(range(16)) and df.attrs["failed"] == []
    per_rank = df.groupby("rank").size()
    assert per_rank.nunique() == 1 and per_rank.iloc[0] == 2 * 25  # every NCCL kernel of both repetitions
    assert (df["ranks_seen"] == 16).all()  # every instance matched on all 16 ranks
    assert (df["wait_us"] >= 0).all() and (df.groupby(["match_key", "instance"])["wait_us"].min() == 0).all()
    assert df.equals(traces.collectives(job16, client=cluster[1]))
    off = traces.clock_offsets(job16, workers=2)
    tp = off[1] + SKEW_US  # the real offset between the two source traces (tp_rank1's clock vs tp_rank0's)
    assert all(abs(off[r] - (-r * SKEW_US + (tp if r % 2 else 0.0))) < 1e-3 for r in range(16)), off
    info = traces.merge(job16, tmp_path / "m.json.gz", workers=2)
    merged = json.loads(gzip.decompress((tmp_path / "m.json.gz").read_bytes()))
    assert info["ranks"] == list(range(16)) and merged["kit"]["ranks"] == list(range(16))
    names = {e["args"]["name"].split(" |")[0] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert names == {f"rank {r}" for r in range(16)}


def test_without_dask_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    with pytest.raises(ImportError, match=r"pip install 'kit\[cluster\]'"):
        map_ranks(TP, _kernels, client="tcp://127.0.0.1:8786")


# ------------------------------------------------------------------------------------------------ one job, checked
DOC = DATA / "doctor"
P2P = DOC / "recorded-p2p_transports"


@pytest.mark.parametrize("verb", [["trace", "gaps"], ["doctor", "--workers", "1"]])
def test_two_runs_seconds_apart_are_not_one_job(verb):
    """Rank 0 of one 2-rank run and rank 1 of another recorded 16 s later on the same host (kit.capture: host and
    pid in the header): world sizes agree, ranks do not repeat, but the traced spans do not overlap -- on one host
    that is one clock, so another run; without hosts named (5.6 s apart), another run or clocks that disagree."""
    p = _kit(*verb, DOC / "clean/trace_rank0.json.gz", DOC / "p2p-disabled/trace_rank1.json.gz", "--no-cache")
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "Traceback" not in p.stderr, p.stderr
    assert ("trace_rank1.json.gz: traced 2026-11-23 05:35:53.893 to 05:35:54.031 UTC, not with the others (traced "
            "2026-11-23 05:35:37.768 to 05:35:37.902): 16 s after them, no overlap; recorded on their host vm (one "
            "clock; pid 785, theirs 677): a trace of another job (another run)") in err[0]
    p = _kit(*verb, P2P / "trace_experiment=comm_compute_transport=copy_rank0.json.gz",
             P2P / "trace_experiment=comm_compute_transport=ipc_rank1.json.gz", "--no-cache")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert ("5.56 s after them, no overlap; the traces do not name their hosts: a trace of another job (another "
            "run), or the hosts' clocks disagree by at least 5.56 s") in p.stderr


def test_spans_apart_say_which_hosts_pids_and_base_times():
    from dataclasses import replace

    from kit.traces.jobs import JobError, check_job, rank_identity

    a, b = (rank_identity(traces.load_trace(DOC / f"clean/trace_rank{r}.json.gz", cpu="none", cache=False))
            for r in (0, 1))
    assert (a.host, a.pid, b.host, b.pid, a.base_ns) == ("vm", 677, "vm", 678, 1790857026000000000)
    assert check_job([a, b]).world_size == 2  # one run: spans overlap
    later = replace(b, span=(a.span[1] + 3e6, a.span[1] + 4e6))
    with pytest.raises(JobError, match=r"3 s after them, no overlap; recorded on their host vm \(one clock; pid 678, "
                                       r"theirs 677\): a trace of another job"):
        check_job([a, later])
    with pytest.raises(JobError, match=r"host node7, the others on vm: a trace of another job \(another run\), or the "
                                       r"hosts' clocks disagree by at least 3 s; baseTimeNanoseconds 1 vs 1790857026"):
        check_job([a, replace(later, host="node7", base_ns=1)])
    with pytest.raises(JobError, match=r"recorded by their process \(host vm, pid 677\): another profiling window"):
        check_job([a, replace(later, pid=677, rank=None)])
