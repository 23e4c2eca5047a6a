"""The edges of the trace layer: one job checked once (:func:`kit.traces.jobs.check_job` on real traces
recorded on 2xH200 and copies of them changed where a second job would differ), the per-trace validation
(``Trace.warnings``, fatal problems as one-line TraceErrors), and every ``kit trace`` verb's exit status and
line on each edge (2 bad input, 3 partial), without a traceback."""

import gzip
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT
from kit import traces
from kit.traces.jobs import JobCheck, JobError, RankIdentity, check_job, rank_identity

DATA = Path(__file__).parent / "data"
TP = [DATA / "tp_rank0.json.gz", DATA / "tp_rank1.json.gz"]
NCCL = [DATA / "colls_rank0.json.gz", DATA / "colls_rank1.json.gz"]


def _ids(paths):
    return [rank_identity(traces.load_trace(p, cache=False), p) for p in paths]


def _data(path) -> dict:
    return json.loads(gzip.decompress(Path(path).read_bytes()))


def _copy(tmp_path, src, name, change=None) -> Path:
    """A copy of a real trace, its header or events changed by ``change(data)``."""
    data = _data(src)
    if change:
        change(data)
    out = tmp_path / name
    out.write_bytes(gzip.compress(json.dumps(data).encode()))
    return out


# ------------------------------------------------------------------------------------------------ identity
def test_rank_identity_of_a_real_trace():
    i = _ids(NCCL[:1])[0]
    t = traces.load_trace(NCCL[0], cache=False)
    base = t.header["baseTimeNanoseconds"] / 1e3
    assert (i.rank, i.world_size, i.device) == (0, 2, "NVIDIA H200")
    assert i.span == (base + min(t.gpu.ts.min(), t.cpu.ts.min()), base + max(t.gpu.end.max(), t.cpu.end.max()))
    assert i.span[1] - i.span[0] == pytest.approx(2848.4, abs=0.1)


def test_one_complete_job():
    c = check_job(_ids(NCCL))
    assert isinstance(c, JobCheck) and [r.rank for r in c.ranks] == [0, 1] and c.world_size == 2
    assert c.missing == () and not c.partial and c.note() is None and c.warnings == ()


def test_some_ranks_missing_is_partial_and_named():
    ids = _ids(NCCL)
    c = check_job(ids[:1])
    assert c.partial and c.missing == (1,)
    assert c.note() == "1 of 2 ranks given; missing 1: cross-rank results are partial"
    eight = [replace(i, world_size=8) for i in ids]
    assert check_job(eight).note() == "2 of 8 ranks given; missing 2-7: cross-rank results are partial"


def test_rank_twice_and_another_time_is_not_one_job():
    with pytest.raises(JobError) as e:
        check_job(_ids([NCCL[0], TP[0]]))
    lines = str(e.value).splitlines()
    assert "tp_rank0.json.gz: rank 0 again (also colls_rank0.json.gz): give one trace per rank" in lines
    # recorded 29 minutes apart: their spans do not overlap
    assert any(x.startswith("tp_rank0.json.gz: traced 2026-") and "no overlap" in x and "a trace of another job" in x
               for x in lines)


def test_same_world_size_other_device_is_another_job():
    ids = _ids(NCCL)
    v100 = replace(ids[1], device="Tesla V100-SXM2-16GB")
    with pytest.raises(JobError, match=r"colls_rank1.json.gz: recorded on Tesla V100-SXM2-16GB \(V100\), the others "
                                       r"on H200: traces of different jobs") as e:
        check_job([ids[0], v100, replace(ids[0], path="x_rank2.json", rank=None, world_size=None)])
    assert len(str(e.value).splitlines()) == 1
    # PCIe and SXM parts of one family are one job
    assert not check_job([replace(ids[0], device="NVIDIA H100 PCIe"), replace(ids[1], device="NVIDIA H100 80GB HBM3")]).partial


def test_world_sizes_differ_and_rank_outside():
    ids = _ids(NCCL)
    with pytest.raises(JobError, match=r"world size 4, others \[2\]: traces of different jobs"):
        check_job([ids[0], replace(ids[1], world_size=4)])
    with pytest.raises(JobError, match="colls_rank1.json.gz: rank 5 outside the world size 2"):
        check_job([ids[0], replace(ids[1], rank=5)])


def test_overlapping_spans_are_one_job_apart_ones_are_not():
    """The ranks of one job wait for each other in their collectives: their traced spans overlap, however far
    their starts are apart; a span that starts after the others ended is another run (or another clock)."""
    ids = _ids(NCCL)
    a0, a1 = ids[0].span
    overlapping = replace(ids[1], span=(a1 - 1.0, a1 + 50e6))  # starts 1 us before rank 0's last event ends
    assert check_job([ids[0], overlapping]).world_size == 2
    apart = replace(ids[1], span=(a1 + 1.0, a1 + 2.0))  # 1 us after
    with pytest.raises(JobError, match="colls_rank1.json.gz: traced 2026-.* no overlap"):
        check_job([ids[0], apart])


def test_traces_without_rank_take_file_order_with_a_warning():
    anon = [RankIdentity(f"/x/t{k}.json", None, None, None, None) for k in range(3)]
    c = check_job([anon[0], RankIdentity("/x/r1.json", 1, None, None, None), anon[1]])
    assert [r.rank for r in c.ranks] == [0, 1, 2] and c.world_size is None and not c.partial
    assert c.warnings == ("t0.json: no rank in the trace or its name: taken as rank 0 (file order)",
                          "t1.json: no rank in the trace or its name: taken as rank 2 (file order)")
    assert check_job(anon[:1]).warnings == ()


# ------------------------------------------------------------------------------------------------ one trace
def _events_changed(tmp_path, name, fn):
    def change(d):
        fn(d["traceEvents"])
    return _copy(tmp_path, TP[0], name, change)


def test_negative_and_zero_kernel_durations_are_dropped_with_a_count(tmp_path):
    src = traces.load_trace(TP[0], cache=False)

    def corrupt(evs):
        ks = [e for e in evs if e.get("cat") == "kernel"]
        ks[0]["dur"], ks[1]["dur"], ks[2]["dur"] = -5, -1.5, 0
    p = _events_changed(tmp_path, "neg_rank0.json.gz", corrupt)
    t = traces.load_trace(p, cache=False)
    assert t.warnings == ("neg_rank0.json.gz: 3 GPU event(s) dropped, 2 with a negative duration and 1 with zero "
                          "duration (lost or corrupt timestamps)",)
    assert len(t.gpu) == len(src.gpu) - 3 and (t.gpu.dur > 0).all()
    assert traces.load_trace(TP[0], cache=False).warnings == ()


def test_zero_duration_profiler_step_is_dropped_with_a_warning(tmp_path):
    def steps(evs):
        t0 = min(e["ts"] for e in evs if "ts" in e)
        evs += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1,
                 "ts": t0 + 100 * k, "dur": 0 if k == 2 else 100, "args": {}} for k in (1, 2, 3)]
    p = _events_changed(tmp_path, "steps_rank0.json.gz", steps)
    t = traces.load_trace(p, cache=False)
    assert t.warnings == ("steps_rank0.json.gz: 1 ProfilerStep annotation(s) of zero duration dropped "
                          "(ProfilerStep#2): a step without length",)
    kept = t.cpu[t.cpu.name.astype(str).str.startswith("ProfilerStep")]
    assert list(kept.name) == ["ProfilerStep#1", "ProfilerStep#3"]


def test_warnings_survive_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_TRACE_CACHE", str(tmp_path / "cache"))

    def corrupt(evs):
        next(e for e in evs if e.get("cat") == "kernel")["dur"] = -2
    p = _events_changed(tmp_path, "neg_rank0.json.gz", corrupt)
    first = traces.load_trace(p)
    again = traces.load_trace(p)
    assert first.warnings == again.warnings and len(again.warnings) == 1 and len(again.gpu) == len(first.gpu)


def test_non_utf8_byte_is_one_line_with_its_offset(tmp_path):
    raw = gzip.decompress(TP[0].read_bytes())
    at = raw.index(b'"name": "') + 9
    bad = raw[:at] + b"\xff" + raw[at:]
    (tmp_path / "bad_rank0.json").write_bytes(bad)
    (tmp_path / "bad_rank1.json.gz").write_bytes(gzip.compress(bad))
    with pytest.raises(traces.TraceError) as e:
        traces.load_trace(tmp_path / "bad_rank0.json", cache=False)
    assert str(e.value) == (f"{tmp_path / 'bad_rank0.json'}: not UTF-8 text: byte 0xff at byte offset {at} of the file "
                            f"(a corrupt or binary file?)")
    with pytest.raises(traces.TraceError, match=f"byte 0xff at byte offset {at} of the decompressed JSON"):
        traces.load_trace(tmp_path / "bad_rank1.json.gz", cache=False)
    # UTF-8 beyond ASCII is fine
    ok = raw[:at] + "é".encode() + raw[at:]
    (tmp_path / "ok_rank0.json").write_bytes(ok)
    assert len(traces.load_trace(tmp_path / "ok_rank0.json", cache=False).gpu) == len(traces.load_trace(TP[0]).gpu)


def test_empty_event_list_is_fatal(tmp_path):
    p = tmp_path / "empty_rank0.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": []}))
    for fn in (traces.load_trace, traces.load):
        with pytest.raises(traces.TraceError, match=r"empty_rank0.json: no events \(traceEvents is empty"):
            fn(p)


# ------------------------------------------------------------------------------------------------ every verb
def _kit(*args):
    return subprocess.run([sys.executable, "-m", "kit", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _verbs(tmp_path, *files):
    """``kit trace gaps|collectives|merge`` on the files: (verb, CompletedProcess) each."""
    out = []
    for verb, extra in (("gaps", ()), ("collectives", ()), ("merge", ("-o", tmp_path / "merged.json"))):
        p = _kit("trace", verb, *files, *extra)
        assert "Traceback" not in p.stderr, (verb, p.stderr)
        out.append((verb, p))
    return out


def _header(**changes):
    def change(d):
        for k, v in changes.items():
            if k == "device":
                for prop in d["deviceProperties"]:
                    prop["name"] = v
            else:
                d["distributedInfo"][k] = v
    return change


def test_cli_rank_twice_is_exit_2_for_every_verb(tmp_path):
    twice = _copy(tmp_path, TP[0], "again_rank0.json.gz")
    for verb, p in _verbs(tmp_path, TP[0], twice):
        assert p.returncode == 2, (verb, p.stderr)
        # expand() sorts the files by rank, then name: again_rank0 comes first
        assert p.stderr.splitlines() == [f"kit trace {verb}: tp_rank0.json.gz: rank 0 again (also again_rank0.json.gz): "
                                         f"give one trace per rank"], p.stderr
        assert not p.stdout


def test_cli_two_jobs_same_world_size_other_device_is_exit_2(tmp_path):
    other = _copy(tmp_path, TP[1], "a100_rank1.json.gz", _header(device="NVIDIA A100-SXM4-40GB"))
    for verb, p in _verbs(tmp_path, TP[0], other):
        assert p.returncode == 2, (verb, p.stderr)
        assert p.stderr.splitlines() == [f"kit trace {verb}: a100_rank1.json.gz: recorded on NVIDIA A100-SXM4-40GB "
                                         f"(A100), the others on H200: traces of different jobs"], p.stderr


def test_cli_two_of_eight_ranks_is_exit_3_with_the_missing_named(tmp_path):
    files = [_copy(tmp_path, src, src.name, _header(world_size=8)) for src in TP]
    for verb, p in _verbs(tmp_path, *files):
        assert p.returncode == 3, (verb, p.stderr)
        assert p.stderr.splitlines() == [f"kit trace {verb}: 2 of 8 ranks given; missing 2-7: cross-rank results "
                                         f"are partial"], p.stderr
        assert p.stdout  # the result is still printed
    p = _kit("trace", "collectives", *files, "--json")
    assert p.returncode == 3 and json.loads(p.stdout)["job"] == {
        "world_size": 8, "ranks": [0, 1], "missing": [2, 3, 4, 5, 6, 7], "partial": True,
        "note": "2 of 8 ranks given; missing 2-7: cross-rank results are partial"}
    one = _kit("trace", "gaps", files[0])  # one trace: a per-rank analysis
    assert one.returncode == 0 and not one.stderr


def test_cli_non_utf8_byte_names_file_and_offset(tmp_path):
    raw = gzip.decompress(TP[1].read_bytes())
    at = raw.index(b'"name": "') + 9
    bad = tmp_path / "tp_rank1.json"
    bad.write_bytes(raw[:at] + b"\xfe" + raw[at:])
    line = f"{bad}: not UTF-8 text: byte 0xfe at byte offset {at} of the file (a corrupt or binary file?)"
    for verb, p in _verbs(tmp_path, bad):
        assert p.returncode == 2 and p.stderr.splitlines() == [f"kit trace {verb}: {line}"], (verb, p.stderr)
    for verb, p in _verbs(tmp_path, TP[0], bad):  # with a good rank: the bad one named, the other analysed
        assert p.returncode == 3 and line in p.stdout + p.stderr, (verb, p.stdout, p.stderr)


def test_cli_empty_event_list_is_exit_2(tmp_path):
    p0 = tmp_path / "empty_rank0.json"
    p0.write_text(json.dumps({"schemaVersion": 1, "traceEvents": []}))
    for verb, p in _verbs(tmp_path, p0):
        assert p.returncode == 2, (verb, p.stderr)
        assert p.stderr.splitlines() == [f"kit trace {verb}: {p0}: no events (traceEvents is empty: was the profiler "
                                         f"stopped before its first step?)"], p.stderr


def test_cli_negative_durations_and_zero_step_are_warnings_once(tmp_path):
    def corrupt(d):
        evs = d["traceEvents"]
        next(e for e in evs if e.get("cat") == "kernel")["dur"] = -3
        t0 = min(e["ts"] for e in evs if "ts" in e)
        evs.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": t0,
                    "dur": 0, "args": {}})
    bad = _copy(tmp_path, TP[1], "tp_rank1.json.gz", corrupt)
    for verb, p in _verbs(tmp_path, TP[0], bad):
        assert p.returncode == 0, (verb, p.stderr)
        warned = [x for x in p.stderr.splitlines() if x.startswith(f"kit trace {verb}: warning: ")]
        assert len(set(warned)) == len(warned) >= 1, p.stderr
        assert (f"kit trace {verb}: warning: tp_rank1.json.gz: 1 GPU event(s) dropped, 1 with a negative duration "
                f"(lost or corrupt timestamps)") in warned
    gaps = _kit("trace", "gaps", TP[0], bad, "--json")
    assert json.loads(gaps.stdout)["warnings"] == [
        "tp_rank1.json.gz: 1 GPU event(s) dropped, 1 with a negative duration (lost or corrupt timestamps)"]


def test_gpu_event_outside_the_profilers_window_is_dropped(tmp_path):
    """Every GPU event of a real trace lies inside Kineto's 'PyTorch Profiler' window; one moved an hour later
    (a corrupt timestamp) would stretch every span it falls in."""
    src = traces.load_trace(TP[0], cache=False)

    def corrupt(evs):
        next(e for e in evs if e.get("cat") == "kernel")["ts"] += 3.6e9
    p = _events_changed(tmp_path, "late_rank0.json.gz", corrupt)
    for cpu in ("none", "default"):
        t = traces.load_trace(p, cpu=cpu, cache=False)
        assert len(t.warnings) == 1 and t.warnings[0].startswith(
            "late_rank0.json.gz: 1 GPU event(s) wholly outside the profiler's window (")
        assert len(t.gpu) == len(src.gpu) - 1 and t.gpu.end.max() == src.gpu.end.max()


def test_cli_legacy_categories_and_subsampled_trace(tmp_path):
    """A schemaVersion-1 trace with PyTorch 1.9's categories is read (its kernels counted), and a subsampled
    trace is said once on stderr -- exit 0 for both (one trace each: per-rank analyses), no traceback."""
    legacy = tmp_path / "worker0.1623143089861.pt.trace.json"
    legacy.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 100 + 20 * i,
         "dur": 10, "args": {"device": 0, "stream": 7, "correlation": i, "external id": i}} for i in range(5)] + [
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 95 + 20 * i, "dur": 2,
         "args": {"correlation": i, "external id": i}} for i in range(5)] + [
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 90, "dur": 100, "args": {}}]}))
    p = _kit("trace", "gaps", legacy, "--no-cache")
    assert p.returncode == 0 and p.stdout.startswith(f"{legacy}: 5 kernels (0 NCCL)") and not p.stderr, p.stderr
    sampled = tmp_path / "s_rank0.json"
    sampled.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5 * i, "dur": 2.5,
         "args": {"device": 0, "stream": 7, "External id": 1000 + 200 * i, "correlation": i}} for i in range(300)]}))
    p = _kit("trace", "gaps", sampled, "--no-cache")
    lines = p.stderr.splitlines()
    assert p.returncode == 0 and len(lines) == 1 and lines[0].startswith(
        "kit trace gaps: warning: s_rank0.json: looks subsampled: its GPU events come from 300 of the 59801 ops"), p.stderr


def test_chunked_first_pass_selects_the_same_events(monkeypatch):
    """The first pass reads ``cat`` a stretch of the file at a time (or, where it cannot, a chunk of views at a
    time) and the selected events are decoded after the file's bytes are dropped: with stretches of one event,
    chunks of 7 views and of 5 selected events the frames are those of the file read at once."""
    from kit.traces import parse

    path = Path(__file__).parent / "data" / "tp_rank0.json.gz"
    whole = traces.load_trace(path, cpu="none", cache=False)
    monkeypatch.setattr(parse, "STRETCH", 1)
    monkeypatch.setattr(parse, "CHUNK", 5)
    small = traces.load_trace(path, cpu="none", cache=False)
    monkeypatch.setattr(parse, "_bounds", lambda buf: None)  # the split into views instead
    monkeypatch.setattr(parse, "HEAD_CHUNK", 7)
    views = traces.load_trace(path, cpu="none", cache=False)
    assert len(small.gpu) == len(whole.gpu) > 50
    for t in (small, views):
        assert t.gpu.equals(whole.gpu) and t.info == whole.info


def test_first_pass_cuts_only_between_events(monkeypatch, tmp_path):
    """The first pass cuts the events array where ``}, {`` stands; one inside a name, a nested value or the
    header's tail (below: all three, and ``},{`` without blanks) makes a stretch that does not decode, and the next
    one is taken -- the frames are those of the split into views, the count of events too. Where the array cannot
    be found that way (a nested ``traceEvents`` first), the split into views reads the file."""
    from kit.traces import parse

    def kernel(i, name):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 100.5 + 10 * i, "dur": 2.25,
                "args": {"device": 0, "stream": 7, "correlation": i, "External id": i}}

    events = [kernel(0, "void f<{1}, {2}>"), kernel(1, "g},{h"),
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 99.5, "dur": 50.0,
               "args": {"Input Dims": [[{"a": 1}, {"b": 2}]], "External id": 1}},
              kernel(2, "k"), {"ph": "i", "cat": "fwdbwd", "name": "x", "pid": 1, "tid": 1, "ts": 120.0}]
    body = ",\n".join(json.dumps(e, separators=(",", ":")) if i == 1 else json.dumps(e) for i, e in enumerate(events))
    text = ('{"schemaVersion": 1, "traceEvents": [\n' + body + '\n], "traceName": "/tmp/run[1]/x}, {y].json"}')
    path = tmp_path / "cuts_rank0.json"
    path.write_text(text)
    nested = tmp_path / "nested_rank0.json"
    nested.write_text(text.replace('{"schemaVersion": 1,', '{"schemaVersion": 1, "meta": {"traceEvents": []},'))
    fallback = []
    real = parse._raw_events
    monkeypatch.setattr(parse, "_raw_events", lambda p, buf: fallback.append(p.name) or real(p, buf))
    got = {}
    for stretch in (1, 1 << 22):
        monkeypatch.setattr(parse, "STRETCH", stretch)
        got[stretch] = traces.load_trace(path, cpu="none", cache=False)
    assert fallback == []
    got["nested"] = traces.load_trace(nested, cpu="none", cache=False)
    assert fallback == [nested.name]
    monkeypatch.setattr(parse, "_bounds", lambda buf: None)
    views = traces.load_trace(path, cpu="none", cache=False)
    assert list(views.gpu["name"]) == ["void f<{1}, {2}>", "g},{h", "k"] and views.info.events == len(events)
    for t in got.values():
        assert t.gpu.equals(views.gpu) and t.info == views.info


def test_a_gzip_of_two_members_is_read_whole(tmp_path):
    """The reader sizes its buffer from the gzip trailer (the last member's size only): a file of two gzip members
    (``cat a.gz b.gz``) is read on to its end, as ``gzip`` reads it."""
    path = Path(__file__).parent / "data" / "tp_rank0.json.gz"
    raw = gzip.decompress(path.read_bytes())
    two = tmp_path / "two_members_rank0.json.gz"
    two.write_bytes(gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]))
    a, b = (traces.load_trace(p, cpu="none", cache=False) for p in (path, two))
    assert len(a.gpu) == len(b.gpu) > 50 and a.gpu.equals(b.gpu)


def test_a_plain_file_that_changed_size_while_read_is_read_whole(tmp_path, monkeypatch):
    """A plain trace is read into a buffer of the size the file had a moment before (an anonymous mapping where
    the kernel can populate one): a file that grew or shrank meanwhile is read to its end, as it now is."""
    import os as _os

    from kit.traces import parse

    path = tmp_path / "grown_rank0.json"
    data = gzip.decompress(TP[0].read_bytes())
    path.write_bytes(data)
    real = Path.stat
    for delta in (-1000, 0, 1000):
        size = len(data) + delta

        def stat(self, *a, **kw):
            st = real(self, *a, **kw)
            return _os.stat_result((*st[:6], size, *st[7:])) if self == path else st

        monkeypatch.setattr(Path, "stat", stat)
        got = parse._read_into(path, False)
        monkeypatch.setattr(Path, "stat", real)
        assert bytes(got) == data and (delta == 0 or isinstance(got, bytearray)), delta
    assert traces.load_trace(path, cpu="none", cache=False).gpu.equals(traces.load_trace(TP[0], cpu="none", cache=False).gpu)


def test_columns_made_per_chunk_are_those_made_at_once():
    """``concat`` of per-chunk ``to_columns`` is ``to_columns`` of all the rows: a pid that is a string in one chunk
    only, a count that is a string, names met first in a later chunk, an empty chunk."""
    import numpy as np

    from kit.traces.columns import concat, to_columns
    from kit.traces.frames import CPU_COLUMNS

    keys = ("name", "cat", "pid", "tid", "ts", "dur", "correlation", "in_nelems", "collective")
    rows = [("b", "cpu_op", 7, 1, 1.0, 2, None, 3, None), ("a", "cuda_runtime", 7, 2, 2.5, 1.5, 4.0, None, "x"),
            ("c", "cpu_op", "Spans", 1, 3.0, None, 5, 6.0, None), ("a", "user_annotation", 8, 1, None, 1.0, 7, 8, "y"),
            ("b", "cpu_op", 9, 3, 5.0, 0.5, None, None, None)]
    cols = lambda rs: {c: [r[keys.index(c)] if c in keys else None for r in rs] for c in CPU_COLUMNS}  # noqa: E731
    whole = to_columns(cols(rows), CPU_COLUMNS)
    for cuts in ([0, 2, 2, 5], [0, 3, 5], [0, 1, 2, 3, 4, 5]):
        parts = concat([to_columns(cols(rows[a:b]), CPU_COLUMNS) for a, b in zip(cuts, cuts[1:])])
        assert (whole.n, whole.categories, whole.columns) == (parts.n, parts.categories, parts.columns)
        for c, v in whole.values.items():
            p = parts.values[c]
            assert type(v) is type(p) and (v == p if isinstance(v, list) else
                                           v.dtype == p.dtype and np.array_equal(v, p, equal_nan=True)), c
    ints = concat([to_columns(cols(rows[:2]), CPU_COLUMNS), to_columns(cols(rows[3:]), CPU_COLUMNS)])
    assert ints.values["pid"].dtype == np.int64 and ints.values["pid"].tolist() == [7, 7, 8, 9]
