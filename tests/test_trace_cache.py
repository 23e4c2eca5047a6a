"""The trace layer's decoding and cache: msgspec decoding into narrow frames, the Parquet
cache beside the trace -- hit, stale, corrupt, bypassed, unwritable folder -- on real 2xH200 traces."""

import gzip
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from kit import traces
from kit.traces import cache, parse

DATA = Path(__file__).parent / "data"
TP0 = DATA / "tp_rank0.json.gz"


@pytest.fixture
def trace(tmp_path, monkeypatch):
    """A private copy of a real trace and a cache that lives beside it (the default location)."""
    monkeypatch.delenv("KIT_TRACE_CACHE", raising=False)
    p = tmp_path / "run" / TP0.name
    p.parent.mkdir()
    shutil.copy(TP0, p)
    return p


def _reads(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = parse.read_bytes
    monkeypatch.setattr(parse, "read_bytes", lambda p: calls.append(str(p)) or real(p))
    return calls


def test_second_open_comes_from_the_cache_and_equals_the_parse(trace, monkeypatch):
    calls = _reads(monkeypatch)
    a = traces.load_trace(trace)
    assert cache.entry(trace) == trace.parent / ".kitcache" / f"{trace.name}.default.gpu.parquet"
    b = traces.load_trace(trace)
    assert calls == [str(trace)]  # parsed once
    for x, y in ((a.gpu, b.gpu), (a.cpu, b.cpu)):
        pd.testing.assert_frame_equal(x, y)
    assert a.info == b.info and a.header == b.header and a.adapter == b.adapter
    # the analyses give the same answers from the cache
    assert traces.gap_summary(traces.gaps(a.gpu)) == traces.gap_summary(traces.gaps(b.gpu))
    pd.testing.assert_frame_equal(a.collectives, b.collectives)


def test_each_cpu_mode_has_its_own_entry(trace, monkeypatch):
    calls = _reads(monkeypatch)
    first = {m: traces.load_trace(trace, cpu=m) for m in ("none", "comm", "default", "all")}
    assert len(calls) == 4 and first["none"].cpu.empty and len(first["default"].cpu) > 0
    # list-valued args (process-group ranks, input dims) come back as lists
    assert first["all"].cpu["input_dims"].map(lambda v: isinstance(v, list)).any()
    for m, t in first.items():
        again = traces.load_trace(trace, cpu=m)
        pd.testing.assert_frame_equal(t.cpu, again.cpu)
        pd.testing.assert_frame_equal(t.gpu, again.gpu)
    assert len(calls) == 4  # every mode from its own entry


def test_a_rewritten_trace_is_parsed_again(trace, monkeypatch):
    calls = _reads(monkeypatch)
    traces.load_trace(trace, cpu="none")
    # same size, new content and mtime: the key (size, mtime, hash of both ends) no longer matches
    data = gzip.decompress(trace.read_bytes()).replace(b'"ph": "X"', b'"ph":  "X"', 1)
    trace.write_bytes(gzip.compress(data))
    st = trace.stat()
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    traces.load_trace(trace, cpu="none")
    assert len(calls) == 2


def test_a_corrupt_cache_is_rebuilt_never_trusted(trace, monkeypatch):
    calls = _reads(monkeypatch)
    a = traces.load_trace(trace, cpu="none")
    g = cache.entry(trace, "none")
    g.write_bytes(g.read_bytes()[: len(g.read_bytes()) // 2])  # truncated
    b = traces.load_trace(trace, cpu="none")
    assert len(calls) == 2
    pd.testing.assert_frame_equal(a.gpu, b.gpu)
    g.write_bytes(b"not parquet at all")
    traces.load_trace(trace, cpu="none")
    assert len(calls) == 3 and cache.entry(trace, "none").read_bytes()[:4] == b"PAR1"


def test_bypass_and_off_switch(trace, monkeypatch):
    calls = _reads(monkeypatch)
    traces.load_trace(trace, cache=False)
    assert cache.entry(trace) is None
    monkeypatch.setenv("KIT_TRACE_CACHE", "0")
    traces.load_trace(trace)
    traces.load_trace(trace)
    assert len(calls) == 3 and cache.entry(trace) is None


def test_unwritable_folder_falls_back_to_the_user_cache(trace, monkeypatch, tmp_path):
    if os.geteuid() == 0:  # root writes anywhere: simulate the folder being unwritable
        real_mkdir = Path.mkdir

        def mkdir(self, *a, **k):
            if self.name == ".kitcache":
                raise PermissionError(13, "Permission denied", str(self))
            return real_mkdir(self, *a, **k)

        monkeypatch.setattr(Path, "mkdir", mkdir)
    else:
        trace.parent.chmod(0o555)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    try:
        calls = _reads(monkeypatch)
        traces.load_trace(trace, cpu="none")
        traces.load_trace(trace, cpu="none")
        assert len(calls) == 1
        assert str(cache.entry(trace, "none")).startswith(str(tmp_path / "xdg" / "kit" / "traces"))
    finally:
        trace.parent.chmod(0o755)


def test_frames_are_narrow_and_keep_sub_microsecond_times():
    t = traces.load_trace(TP0, cache=False)
    assert isinstance(t.gpu["name"].dtype, pd.CategoricalDtype) and isinstance(t.cpu["name"].dtype, pd.CategoricalDtype)
    assert t.gpu["device"].dtype == "int64" and t.gpu["stream"].dtype == "int64"
    assert t.gpu["correlation"].dtype == "float64" and t.gpu["ts"].dtype == "float64"
    # Kineto writes ns-resolution timestamps (us with 3 decimals); nothing is rounded to whole us (HTA does)
    assert (t.gpu["ts"] % 1 != 0).mean() > 0.5
    g = traces.gaps(t.gpu)
    assert (g["gap_us"] % 1 != 0).any()


def test_only_the_declared_args_keys_are_decoded():
    keys = traces.frames.raw_arg_keys()
    assert "External id" in keys and "Collective name" in keys and "Input Strides" not in keys
    a, attr = parse.args_type(keys)
    assert set(attr) == set(keys) and len(a.__struct_fields__) == len(keys)


def test_chunked_and_preselected_decoding_give_the_same_frames(monkeypatch):
    whole = {m: traces.load_trace(TP0, cpu=m, cache=False) for m in ("none", "comm", "default")}
    monkeypatch.setattr(parse, "CHUNK", 7)  # many chunks, one ragged
    for m, w in whole.items():
        pieces = traces.load_trace(TP0, cpu=m, cache=False)
        pd.testing.assert_frame_equal(w.gpu, pieces.gpu)
        pd.testing.assert_frame_equal(w.cpu, pieces.cpu)
        assert w.info == pieces.info
    # "none" decodes only the GPU events (a first pass on cat/ph), yet counts every event of the file
    assert whole["none"].info.events == whole["default"].info.events > len(whole["default"].gpu) + len(whole["default"].cpu)
    pd.testing.assert_frame_equal(whole["none"].gpu, whole["default"].gpu)


def test_no_hand_written_scanner_left():
    src = "".join(p.read_text() for p in (Path(traces.__file__).parent).glob("*.py"))
    assert "raw_decode" not in src and "JSONDecoder" not in src and "import json\n" not in parse.__loader__.get_source("kit.traces.parse")


def test_gaps_writes_and_reads_the_cache_without_pandas(trace):
    """``kit trace gaps``' path (cpu="none": arrays, no DataFrame) writes its entry and reads it back through
    pyarrow's buffers: pandas (0.18 s of CPU to import) is never imported, and the entry holds the frames
    exactly (codes, categories, dtypes, list columns)."""
    import subprocess
    import sys

    code = ("import sys; from kit import traces; t = traces.load_trace(sys.argv[1], cpu={cpu!r}); "
            "print(type(t._frames['gpu']).__name__, 'pandas' in sys.modules)")
    for cpu in ("none", "comm"):
        for _ in range(2):  # write, then read
            out = subprocess.run([sys.executable, "-c", code.format(cpu=cpu), str(trace)], capture_output=True,
                                 text=True, timeout=60)
            assert out.stdout.split() == ["Columns", "False"], out.stderr
        assert cache.entry(trace, cpu).read_bytes()[:4] == b"PAR1"
    for cpu in ("none", "comm", "default", "all"):
        parsed = traces.load_trace(trace, cpu=cpu, cache=False)
        traces.load_trace(trace, cpu=cpu)
        again = traces.load_trace(trace, cpu=cpu)
        for w in ("gpu", "cpu"):
            a, b = parsed._frames[w], again._frames[w]
            assert (a.n, a.columns, a.categories) == (b.n, b.columns, b.categories), (cpu, w)
            for c in a.columns:
                x, y = a.values[c], b.values[c]
                assert type(x) is type(y) and (getattr(x, "dtype", None) == getattr(y, "dtype", None)), (cpu, w, c)
                assert (list(x) == list(y)) if isinstance(x, list) else bool(((x == y) | (x != x) & (y != y)).all())
