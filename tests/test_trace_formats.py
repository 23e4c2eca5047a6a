"""Every PyTorch profiler trace users have: the adapter picked by the events' categories,
traces with stacks, ``[memory]`` events and ``python_function`` events, ``tensorboard_trace_handler``'s names,
legacy (PyTorch 1.8-1.9) categories under ``schemaVersion: 1``, subsampled traces, and jobs from public
repositories.

The committed trace (``tests/data/formats/worker0.*.pt.trace.json.gz``) is recorded here by
``tests/data/formats/record_cpu_trace.py``. The public traces (HTA's tests/data, kineto's 2021 tb_plugin
samples, param's 8-rank DLRM job; provenance in ``tests/data/public/README.md``) may not be committed: they are
read from ``.scratch/public/`` where a developer fetched them, and those tests are skipped elsewhere (CI)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from kit import traces
from kit.traces.jobs import JobError, check_job, expand, rank_identity
from kit.traces.names import parse_name

DATA = Path(__file__).parent / "data"
FORMATS = DATA / "formats"
PUBLIC = ROOT / ".scratch" / "public"


def _public(rel: str) -> Path:
    p = PUBLIC / rel
    if not p.exists():
        pytest.skip(f"public trace {rel} not fetched here (see tests/data/public/README.md)")
    return p


def _kit(*args):
    return subprocess.run([sys.executable, "-m", "kit", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


# ------------------------------------------------------------------------------------------------ names
@pytest.mark.parametrize("name, parsed", [
    ("host_12345.1700000000000.pt.trace.json.gz", ({"worker": "host_12345"}, None)),
    ("worker0.1234.pt.trace.json", ({"worker": "worker0"}, 0)),
    ("worker3_step_12.1694128201557.pt.trace.json", ({"worker": "worker3_step_12"}, 3)),
    ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", ({"worker": "rank-34"}, 34)),
    ("trace_part=ddp_rank1.json.gz", ({"part": "ddp"}, 1)),
    ("merged.1700000000000.pt.trace.json", None),
])
def test_tensorboard_trace_handler_names(name, parsed):
    assert parse_name(name) == parsed


# ------------------------------------------------------------------------------------------------ stacks, memory
@pytest.fixture(scope="module")
def stack_trace() -> Path:
    found = sorted(FORMATS.glob("worker0.*.pt.trace.json.gz"))
    assert len(found) == 1, found
    return found[0]


def test_stacks_memory_and_python_function_events(stack_trace):
    """A real trace recorded with with_stack, profile_memory and record_shapes (torch 2.13, CPU): its
    python_function events and [memory] instant events are read past; the frames hold the CPU ops and the
    two ProfilerSteps, and nothing is dropped."""
    t = traces.load_trace(stack_trace, cpu="all", cache=False)
    assert t.adapter == "kineto" and t.warnings == () and t.info.events == 800
    assert t.gpu.empty
    assert (t.cpu.cat == "cpu_op").sum() == 232 and (t.cpu.cat == "user_annotation").sum() == 6
    assert "python_function" not in set(t.cpu.cat.astype(str))
    steps = t.cpu[t.cpu.name.astype(str).str.startswith("ProfilerStep#")]
    assert list(steps.name) == ["ProfilerStep#1", "ProfilerStep#2"] and (steps.dur > 0).all()
    assert t.header["with_stack"] == 1 and t.header["profile_memory"] == 1
    ident = rank_identity(t, stack_trace)
    assert ident.rank == 0 and ident.world_size is None and ident.device is None and ident.span is not None
    assert expand(FORMATS) == [stack_trace]  # the handler's name is a rank trace in a directory
    p = _kit("trace", "gaps", stack_trace)
    assert p.returncode == 2 and "the trace has no GPU kernels" in p.stderr and "Traceback" not in p.stderr


# ------------------------------------------------------------------------------------------------ legacy
def _legacy_events():
    return [{"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 100, "dur": 10,
             "args": {"device": 0, "stream": 7, "correlation": 3, "external id": 9}},
            {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 114, "dur": 0,
             "args": {"device": 0, "stream": 7, "correlation": 4, "external id": 10}},
            {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 95, "dur": 2,
             "args": {"correlation": 3, "external id": 9}},
            {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 90, "dur": 9,
             "args": {"external id": 9}}]


def test_legacy_categories_under_schema_version_1(tmp_path):
    """PyTorch 1.9 wrote schemaVersion: 1 with the legacy categories: the adapter follows the categories. Times
    in whole us: a zero-duration kernel is one shorter than 1 us, kept."""
    p = tmp_path / "worker0.1623143089861.pt.trace.json"
    p.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [{"name": "Tesla V100-DGXS-32GB"}],
                             "traceEvents": _legacy_events()}))
    t = traces.load_trace(p, cache=False)
    assert t.adapter == "kineto-legacy" and t.warnings == ()
    assert list(t.gpu.cat) == ["kernel", "kernel"] and list(t.gpu.dur) == [10, 0]
    assert list(t.gpu.external_id) == [9, 10] and t.cpu.cat.iloc[0] == "cuda_runtime"
    res = traces.trace_gaps(p, cache=False)
    assert res["kernels"] == 2 and res["summary"]["before_other_us"]["count"] == 1
    assert res["summary"]["before_other_us"]["median"] == 4.0


def test_kineto_2021_tb_plugin_sample():
    """kineto's tb_plugin ResNet50 sample (PyTorch 1.9, schemaVersion 1, 'Kernel'/'Runtime'/'Operator'): every
    one of its 8,772 kernels read (was: "no GPU kernels")."""
    f = _public("kineto_tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    t = traces.load_trace(f, cache=False)
    assert t.adapter == "kineto-legacy" and t.warnings == ()
    assert (t.gpu.cat == "kernel").sum() == 8772 and (t.cpu.cat == "cuda_runtime").sum() > 8000
    p = _kit("trace", "gaps", f, "--no-cache")
    assert p.returncode == 0 and "8772 kernels (0 NCCL)" in p.stdout, p.stderr


def test_two_profiling_windows_of_one_worker_are_not_one_job():
    fs = sorted(_public("kineto_tb_plugin/resnet50_num_workers_0").glob("*.pt.trace.json.gz"))
    p = _kit("trace", "gaps", *fs)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "rank 0 again" in p.stderr and "not with the others" in p.stderr


# ------------------------------------------------------------------------------------------------ subsampled
def test_subsampled_trace_is_said(tmp_path):
    """GPU events whose launching ops' ids are sparse (0.5% of the range here, as in HTA's sampled traces)."""
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5 * i, "dur": 2.5,
           "args": {"device": 0, "stream": 7, "External id": 1000 + 200 * i, "correlation": i}} for i in range(300)]
    p = tmp_path / "s_rank0.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    t = traces.load_trace(p, cache=False)
    assert len(t.warnings) == 1 and t.warnings[0].startswith(
        "s_rank0.json: looks subsampled: its GPU events come from 300 of the 59801 ops between their first and last "
        "launching op (0.5%")
    for i, e in enumerate(ev):  # dense ids: complete
        e["args"]["External id"] = 1000 + 3 * i
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    assert traces.load_trace(p, cache=False).warnings == ()


def test_hta_sampled_ranks():
    f = _public("hta/trace_filter/sampled_rank-0.json.gz")
    t = traces.load_trace(f, cache=False)
    assert len(t.warnings) == 1 and "looks subsampled" in t.warnings[0] and "1204 of the 259691 ops" in t.warnings[0]
    p = _kit("trace", "gaps", f, f.with_name("sampled_rank-1.json.gz"), "--no-cache")
    assert p.returncode == 3, p.stderr  # 2 of 128 ranks
    lines = p.stderr.splitlines()
    assert "kit trace gaps: 2 of 128 ranks given; missing 2-127: cross-rank results are partial" in lines
    assert sum("looks subsampled" in x for x in lines) == 2
    for complete in ("hta/trace_diff/control/control.json.gz", "hta/negative_queue_length_values_check/rank0.json.gz"):
        assert traces.load_trace(_public(complete), cache=False).warnings == ()


# ------------------------------------------------------------------------------------------------ public jobs
def test_dlrm_eight_ranks_one_job_and_a_foreign_trace():
    d = _public("param_dlrm/dlrm_kineto")
    ranks = sorted(d.glob("worker*_step_12.*.pt.trace.json"))
    assert len(ranks) == 8
    ids = [rank_identity(traces.load_trace(f), f) for f in ranks]
    job = check_job(ids)
    assert job.world_size == 8 and [r.rank for r in job.ranks] == list(range(8)) and not job.partial
    assert {i.device for i in ids} == {"Tesla V100-SXM2-32GB"}
    assert check_job(ids[:2]).note() == "2 of 8 ranks given; missing 2-7: cross-rank results are partial"
    a100 = _public("hta/trace_diff/control/control.json.gz")  # rank 3 of 8, A100
    with pytest.raises(JobError) as e:
        check_job(ids + [rank_identity(traces.load_trace(a100), a100)])
    lines = str(e.value).splitlines()
    assert "control.json.gz: rank 3 again (also worker3_step_12.1694128201557.pt.trace.json): give one trace per " \
           "rank" in lines
    assert "control.json.gz: recorded on NVIDIA A100-PG509-200 (A100), the others on V100: traces of different " \
           "jobs" in lines
    p = _kit("trace", "collectives", *ranks[:6], a100)
    assert p.returncode == 2 and "(A100), the others on V100" in p.stderr and "Traceback" not in p.stderr


def test_legacy_trace_opening_with_python_functions(tmp_path):
    """The adapter is picked from the categories of the file's first 65536 events, not of the parse's first chunk
    (8192): a PyTorch 1.9 trace that opens with 9,000 ``python_function`` events is still read as legacy."""
    p = tmp_path / "worker0.1623143089862.pt.trace.json"
    py = [{"ph": "X", "cat": "python_function", "name": f"f{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(9000)]
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": py + _legacy_events()}))
    t = traces.load_trace(p, cache=False)
    assert t.adapter == "kineto-legacy" and list(t.gpu.cat) == ["kernel", "kernel"]
