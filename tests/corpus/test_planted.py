"""The planted-fault corpus (tests/data/doctor/corpus) is what its truth.json files say, and its generator still runs
on CPU. What the doctor concludes on it is tested in tests/test_doctor*.py."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "doctor" / "corpus"
KEYS = {"case", "fault", "expected_rule", "expected_ranks", "model", "profiler", "device", "torch", "world_size",
        "step_us_unprofiled", "control", "added_us", "fault_params"}
FAULTS = {"none", "input_bound", "host_stall", "allocator_churn", "launch_bound", "host_sync", "late_rank"}


def _planted():
    spec = importlib.util.spec_from_file_location("planted", ROOT / "tests" / "corpus" / "planted.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _truths():
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(CORPUS.glob("*/truth.json"))}


def _events(path):
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def test_every_case_is_in_the_corpus_with_its_truth():
    planted, truths = _planted(), _truths()
    assert set(truths) == set(planted.CASES)
    assert len(truths) == 26
    for name, t in truths.items():
        assert KEYS <= set(t), name
        assert t["case"] == name and t["fault"] in FAULTS
        assert t["expected_rule"] == (None if t["fault"] == "none" else t["fault"])
        assert t["model"] in ("gpt", "cnn") and t["profiler"] in ("tb_handler", "kit.capture", "no_steps")
        assert t["device"] == "cpu" or t["device"].startswith("NVIDIA")
        s = t["step_us_unprofiled"]
        assert len(s["samples"]) >= 30 and s["p10"] <= s["median"] <= s["p90"]
        ctl = truths[t["control"]]
        assert ctl["fault"] == "none" and ctl["model"] == t["model"] and ctl["device"] == t["device"]
        if t["control"] == name:
            assert t["added_us"] is None
        else:
            assert t["added_us"] == pytest.approx(s["median"] - ctl["step_us_unprofiled"]["median"], abs=0.2)
            assert t["added_us"] > 0, name  # every planted fault made its job slower than its control
        if t["fault"] == "late_rank":
            assert t["expected_ranks"] == [t["fault_params"]["rank"]]


def test_traces_are_named_and_recorded_as_the_truth_says():
    for name, t in _truths().items():
        d = CORPUS / name
        traces = sorted(d.glob("*.json.gz"))
        assert [p.name for p in traces] == sorted(f for f in t["files"] if f.endswith(".json.gz")), name
        assert len(traces) == t["world_size"]
        pattern = {"tb_handler": "*.pt.trace.json.gz", "kit.capture": "trace_rank*.json.gz",
                   "no_steps": "trace.json.gz"}[t["profiler"]]
        assert sorted(d.glob(pattern)) == traces
        ev = _events(traces[0])
        steps = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
        assert len(steps) == (0 if t["profiler"] == "no_steps" else t["profiled_steps"]), name
        cats = {e.get("cat") for e in ev}
        assert ("kernel" in cats) == (t["device"] != "cpu")
        assert ("python_function" in cats) == t["with_stack"], name
        assert any("Input Dims" in e.get("args", {}) for e in ev) == t["record_shapes"], name


def test_readme_table_is_generated_from_the_truths():
    assert (CORPUS / "README.md").read_text() == _planted().readme(CORPUS)


def test_generator_runs_a_cpu_case_and_its_control(tmp_path):
    planted = _planted()
    rc = planted.main(["--cases", "cpu-gpt-control,cpu-gpt-host_stall", "--out", str(tmp_path), "--steps", "3",
                       "--warm", "1", "--threads", "1"])
    assert rc == 0
    ctl = json.loads((tmp_path / "cpu-gpt-control" / "truth.json").read_text())
    t = json.loads((tmp_path / "cpu-gpt-host_stall" / "truth.json").read_text())
    assert ctl["added_us"] is None and len(ctl["step_us_unprofiled"]["samples"]) == 3
    assert t["added_us"] == pytest.approx(t["step_us_unprofiled"]["median"] - ctl["step_us_unprofiled"]["median"],
                                          abs=0.2)
    (trace,) = (tmp_path / "cpu-gpt-host_stall").glob("*.pt.trace.json.gz")
    names = [e.get("name", "") for e in _events(trace)]
    assert sum(n.startswith("ProfilerStep#") for n in names) >= 3
    assert planted.main(["--cases", "no-such-case"]) == 2
