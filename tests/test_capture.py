"""kit.capture on CPU: a one-process loop, and examples/train_ddp.py on two gloo ranks under torchrun -- one readable
trace per rank with ProfilerStep annotations, the sidecar, and what the planted flags put into the trace."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit import capture, traces

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"


def _steps(t):
    names = t.cpu["name"].astype(str)
    return t.cpu[names.str.startswith("ProfilerStep#")].sort_values("ts")


def _per_step(t, name: str, cat: str | None = None, prefix: bool = False) -> list[int]:
    """How many CPU events called ``name`` (``prefix``: starting with it) begin in each recorded step."""
    cpu = t.cpu if cat is None else t.cpu[t.cpu["cat"] == cat]
    names = cpu["name"].astype(str)
    ev = cpu[names.str.startswith(name) if prefix else names == name]
    return [int(((ev["ts"] >= s.ts) & (ev["ts"] < s.ts + s.dur)).sum()) for s in _steps(t).itertuples()]


def test_one_process_loop(tmp_path):
    import torch

    w = torch.randn(32, 32)
    cap = capture.profile_steps(lambda: (w @ w).relu_().sum(), steps=10, out_dir=tmp_path, wait=1, warmup=1, active=2,
                                unprofiled=0)
    assert cap.done and cap.paths == [tmp_path / "trace_rank0.json.gz"]
    t = traces.load_trace(cap.paths[0], cache=False)
    assert [s.name for s in _steps(t).itertuples()] == ["ProfilerStep#2", "ProfilerStep#3"]
    assert t.header[capture.HEADER_KEY]["rank"] == 0 and t.header[capture.HEADER_KEY]["world_size"] == 1
    side = json.loads(cap.sidecar.read_text())
    assert side["traces"] == ["trace_rank0.json.gz"] and side["distributed"] is False
    assert side["cycles"] == [{"trace": "trace_rank0.json.gz", "first_step": 2, "last_step": 4}]
    assert side["schedule"] == {"skip_first": 0, "wait": 1, "warmup": 1, "active": 2, "repeat": 1}
    assert capture.capture_info(cap.paths[0])["steps_run"] == 4  # the loop stopped once the window was written
    assert [f.rank for f in traces.find_traces(tmp_path)] == [0]  # sidecar and summaries are not traces


def test_unprofiled_steps_are_timed_before_the_window(tmp_path):
    """The default schedule times 5 steps without the profiler, then 5 more on the host's clock alone, just before
    the recorded window; every sample goes into the trace header and the sidecar; the recorded steps come after
    them. A host-timed step is the host's time between the step() calls around it: the step function's own time."""
    import time

    cap = capture.profile_steps(lambda: time.sleep(0.002), steps=20, out_dir=tmp_path, wait=1, warmup=1, active=2)
    t = traces.load_trace(cap.paths[0], cache=False)
    head = t.header[capture.HEADER_KEY]
    assert head["unprofiled"] == 5 and head["unprofiled_clock"] == "perf_counter"
    assert len(head["unprofiled_step_us"]) == 5 and all(s >= 2000 for s in head["unprofiled_step_us"])
    assert head["unprofiled_host"] == 5 and len(head["unprofiled_host_us"]) == 5
    assert all(2000 <= s < 2000 + 0.5 * 2000 * 10 for s in head["unprofiled_host_us"])  # the sleep, and little else
    side = json.loads(cap.sidecar.read_text())
    assert side["unprofiled_step_us"] == head["unprofiled_step_us"]
    assert side["unprofiled_host_us"] == head["unprofiled_host_us"]
    assert [s.name for s in _steps(t).itertuples()] == ["ProfilerStep#12", "ProfilerStep#13"]


def test_host_timed_steps_follow_unprofiled_and_can_be_left_out(tmp_path):
    """``unprofiled_host`` defaults to ``unprofiled``; 0 times none (the window starts that much earlier)."""
    cap = capture.profile_steps(lambda: None, steps=12, out_dir=tmp_path / "a", wait=0, warmup=1, active=1,
                                unprofiled=2, unprofiled_host=0)
    head = traces.load_trace(cap.paths[0], cache=False).header[capture.HEADER_KEY]
    assert head["unprofiled_host"] == 0 and head["unprofiled_host_us"] == [] and len(head["unprofiled_step_us"]) == 2
    cap = capture.profile_steps(lambda: None, steps=12, out_dir=tmp_path / "b", wait=0, warmup=1, active=1,
                                unprofiled=2)
    assert len(capture.capture_info(cap.paths[0])["unprofiled_host_us"]) == 2
    assert cap.cycles[0]["first_step"] == 5  # 2 + 2 host-timed + 1 warm-up
    with pytest.raises(ValueError, match="unprofiled_host"):
        capture.Capture(tmp_path, unprofiled_host=-1)


@pytest.fixture
def no_teardown_env(monkeypatch):
    """TEARDOWN_CUPTI unset for the test and as it was afterwards (setenv first, so that the removal is undone)."""
    monkeypatch.setenv(capture.TEARDOWN_ENV, "x")
    monkeypatch.delenv(capture.TEARDOWN_ENV)
    monkeypatch.setattr(capture, "_KIT_HOLDS", 0)
    return monkeypatch


def test_teardown_cupti_is_set_unless_the_user_set_it(no_teardown_env):
    """Kineto detaches CUPTI at a trace's end only with TEARDOWN_CUPTI=1, read then: kit.capture sets it where a GPU
    is profiled and the variable is unset, calls its own value its own while a capture holds it, removes it when the
    last one is done, keeps a value the user set, and sets nothing when asked not to."""
    env = capture.os.environ
    assert capture._teardown_default(cuda=False, wanted=True)["teardown_cupti_set_by"] is None
    assert capture._teardown_default(cuda=True, wanted=False)["teardown_cupti_set_by"] is None
    assert capture.TEARDOWN_ENV not in env
    assert capture._teardown_default(cuda=True, wanted=True)["teardown_cupti_set_by"] == "kit.capture"
    assert env[capture.TEARDOWN_ENV] == "1"
    assert capture._teardown_default(cuda=True, wanted=True)["teardown_cupti_set_by"] == "kit.capture"  # not the user's
    capture._teardown_release()
    assert env[capture.TEARDOWN_ENV] == "1"  # the second capture still holds it
    capture._teardown_release()
    assert capture.TEARDOWN_ENV not in env
    no_teardown_env.setenv(capture.TEARDOWN_ENV, "0")
    assert capture._teardown_default(cuda=True, wanted=True) == {"teardown_cupti_set_by": "environment",
                                                                  "teardown_cupti_not_set": None}
    capture._teardown_release()  # nothing held: the user's value stays
    assert env[capture.TEARDOWN_ENV] == "0"


def test_teardown_cupti_is_not_set_where_torch_turns_teardown_off_for_cuda_graphs(no_teardown_env):
    """PyTorch's profiler sets TEARDOWN_CUPTI=0 with CUDA graphs on CUDA < 12.6 (re-attaching CUPTI after a teardown
    crashes there); kit.capture cannot see a graph captured by hand, so it sets nothing on such a build and says why."""
    import torch

    no_teardown_env.setattr(torch.version, "cuda", "12.4")
    got = capture._teardown_default(cuda=True, wanted=True)
    assert got["teardown_cupti_set_by"] is None and "CUDA 12.4 < 12.6" in got["teardown_cupti_not_set"]
    assert capture.TEARDOWN_ENV not in capture.os.environ
    no_teardown_env.setattr(torch.version, "cuda", "12.6")
    assert capture._teardown_default(cuda=True, wanted=True)["teardown_cupti_not_set"] is None
    capture._teardown_release()


def test_two_captures_each_set_teardown_cupti_and_leave_the_environment_as_it_was(tmp_path, no_teardown_env):
    """Each capture of a process (a GPU's, stood in for on the CPU) records kit.capture as the setter, has the value
    in effect while it records and at its trace's end, and removes it after its last trace."""
    real = capture._teardown_default
    no_teardown_env.setattr(capture, "_teardown_default", lambda cuda, wanted: real(True, wanted))
    no_teardown_env.setattr(capture, "_ENDED", [])
    seen = []
    kw = dict(wait=0, warmup=1, active=1, unprofiled=1)
    caps = [capture.profile_steps(lambda: seen.append(capture.os.environ.get(capture.TEARDOWN_ENV)), steps=6,
                                  out_dir=tmp_path / str(k), **kw) for k in (1, 2)]
    heads = [traces.load_trace(c.paths[0], cache=False).header[capture.HEADER_KEY] for c in caps]
    assert [h["teardown_cupti_set_by"] for h in heads] == ["kit.capture", "kit.capture"]
    assert [h["teardown_cupti"] for h in heads] == ["1", "1"] and heads[1]["earlier_traces"] == [{"teardown_cupti": "1"}]
    assert set(seen) == {"1"} and capture.TEARDOWN_ENV not in capture.os.environ and capture._KIT_HOLDS == 0


def test_the_header_says_which_traces_came_before_in_the_process(tmp_path, monkeypatch):
    """A second capture in one process times its unprofiled steps after the first one's trace: its header lists
    that trace with the TEARDOWN_CUPTI value in effect at its end (CUPTI stays attached unless it was 1)."""
    monkeypatch.setattr(capture, "_ENDED", [])
    monkeypatch.setenv(capture.TEARDOWN_ENV, "0")
    kw = dict(wait=0, warmup=1, active=1, unprofiled=1)
    first = capture.profile_steps(lambda: None, steps=6, out_dir=tmp_path / "1", **kw)
    second = capture.profile_steps(lambda: None, steps=6, out_dir=tmp_path / "2", **kw)
    h1 = traces.load_trace(first.paths[0], cache=False).header[capture.HEADER_KEY]
    h2 = traces.load_trace(second.paths[0], cache=False).header[capture.HEADER_KEY]
    assert h1["earlier_traces"] == [] and h1["teardown_cupti"] == "0" and h1["teardown_cupti_set_by"] == "environment"
    assert h2["earlier_traces"] == [{"teardown_cupti": "0"}]


def test_cycles_tags_and_a_loop_too_short(tmp_path, monkeypatch):
    for k in capture.relevant_env():  # e.g. OMP_NUM_THREADS=1 left by a Dask test in this process
        monkeypatch.delenv(k)
    monkeypatch.setenv("NCCL_GRAPH_MIXING_SUPPORT", "0")
    monkeypatch.setenv("SOME_SECRET", "x")
    with capture.profile(tmp_path, wait=0, warmup=1, active=1, repeat=2, tags={"part": "fwd"}, unprofiled=0) as prof:
        for _ in range(6):
            prof.step()
    names = [p.name for p in prof.paths]
    assert names == ["trace_part=fwd_cycle=1_rank0.json.gz", "trace_part=fwd_cycle=2_rank0.json.gz"]
    assert [f.tags for f in traces.find_traces(tmp_path, part="fwd")] == [{"part": "fwd", "cycle": "1"},
                                                                        {"part": "fwd", "cycle": "2"}]
    info = capture.capture_info(prof.paths[1])  # the sidecar of the tag set, found from a cycle's trace
    assert info["traces"] == names and info["env"] == {"NCCL_GRAPH_MIXING_SUPPORT": "0"}
    with pytest.warns(UserWarning, match="no trace was written"):
        with capture.profile(tmp_path / "short", wait=1, warmup=1, active=1) as p2:
            p2.step()
    assert p2.paths == [] and json.loads(p2.sidecar.read_text())["traces"] == []
    with pytest.raises(ValueError, match="tag"):
        capture.Capture(tmp_path, tags={"bad_key": 1})


def _torchrun(out: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
           "--out", str(out), "--device", "cpu", "--wait", "0", "--warmup", "1", "--active", "2", *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    r = _torchrun(out, "--flight-recorder")
    return out, r


def test_train_ddp_two_gloo_ranks(clean):
    out, r = clean
    assert "train_ddp: 2 rank(s) (gloo)" in r.stdout and "planted: nothing" in r.stdout
    found = traces.find_traces(out)
    assert [f.rank for f in found] == [0, 1] and [f.path.name for f in found] == ["trace_rank0.json.gz",
                                                                                 "trace_rank1.json.gz"]
    for f in found:
        t = traces.load_trace(f.path, cpu="all", cache=False)
        assert (t.info.rank, t.info.world_size, t.info.backend) == (f.rank, 2, "gloo")
        assert len(_steps(t)) == 2
        assert _per_step(t, "gloo:", "user_annotation", prefix=True) == [1, 1]  # DDP: the tiny model's gradients in one bucket
        assert all(n >= 1 for n in _per_step(t, "enumerate(DataLoader)", "user_annotation", prefix=True))
        info = capture.capture_info(t)
        assert (info["rank"], info["world_size"], info["backend"], info["distributed"]) == (f.rank, 2, "gloo", True)
        side = json.loads((out / f"capture_rank{f.rank}.json").read_text())
        assert side["traces"] == [f.path.name] and side["device"] == "cpu" and side["torch"]
        assert side["flight_recorder"]["requested"] is True
        if side["flight_recorder"]["file"]:  # gloo keeps a Flight Recorder in recent PyTorch
            fr = json.loads((out / side["flight_recorder"]["file"]).read_text())
            assert any(e["profiling_name"].startswith("gloo:all_reduce") for e in fr["entries"])
        summary = json.loads((out / f"summary_rank{f.rank}.json").read_text())
        assert summary["planted"] == [] and summary["step_ms"] > 0


def test_train_ddp_planted_flags_on_cpu(clean, tmp_path):
    """--per-param-allreduce, --item and --late-rank in one run: each leaves its own mark (CUDA-only flags are
    dropped with a line; on CPU there is no cudaStreamSynchronize, so --item shows as one more aten::item)."""
    base_out, _ = clean
    r = _torchrun(tmp_path, "--per-param-allreduce", "--item", "--late-rank", "1", "--late-ms", "150", "--pageable")
    assert "--pageable needs CUDA" in r.stdout
    summary = json.loads((tmp_path / "summary_rank0.json").read_text())
    assert summary["planted"] == ["per_param_allreduce", "item", "late_rank=1"]
    t = {r: traces.load_trace(tmp_path / f"trace_rank{r}.json.gz", cpu="all", cache=False) for r in (0, 1)}
    clean_t = traces.load_trace(base_out / "trace_rank0.json.gz", cpu="all", cache=False)
    # per_param_allreduce: one gloo all_reduce per parameter tensor (2 blocks x 12 + embeddings, norm, head = 29)
    assert _per_step(t[0], "gloo:", "user_annotation", prefix=True) == [29, 29]
    # item: one more aten::item per step than the clean run (AdamW reads its step counters with .item() on CPU)
    assert [a - b for a, b in zip(_per_step(t[0], "aten::item"), _per_step(clean_t, "aten::item"))] == [1, 1]
    # late_rank: rank 0 waits in its first all-reduce of each step for rank 1, which slept 150 ms
    g0 = t[0].cpu[t[0].cpu["name"].astype(str).str.startswith("gloo:") & (t[0].cpu["cat"] == "user_annotation")]
    g1 = t[1].cpu[t[1].cpu["name"].astype(str).str.startswith("gloo:") & (t[1].cpu["cat"] == "user_annotation")]
    assert g0["dur"].max() > 100e3 and g1["dur"].max() < 100e3


def test_flight_recorder_needs_the_variable_before_the_group(monkeypatch, tmp_path):
    import os
    import socket

    import torch
    import torch.distributed as dist

    for n in capture.FR_ENV:
        monkeypatch.delenv(n, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with pytest.warns(UserWarning, match="before torch.distributed.init_process_group"):
            capture.enable_flight_recorder()
        with capture.profile(tmp_path, wait=0, warmup=1, active=1, flight_recorder=True, unprofiled=0) as prof:
            for _ in range(3):
                dist.all_reduce(torch.ones(4))
                prof.step()
        monkeypatch.setattr("kit.traces.flight_recorder.dump_flight_recorder", lambda: {"entries": []})
        with capture.profile(tmp_path / "empty", wait=0, warmup=1, active=1, flight_recorder=True, unprofiled=0) as empty:
            empty.step()
            empty.step()
    finally:
        dist.destroy_process_group()
    side = json.loads(prof.sidecar.read_text())
    assert side["distributed"] is True and side["backend"] == "gloo"
    if side["flight_recorder"]["file"]:  # this build records without the variable (PyTorch 2.13 on gloo does)
        fr = json.loads((tmp_path / side["flight_recorder"]["file"]).read_text())
        assert [e["profiling_name"] for e in fr["entries"]][-3:] == ["gloo:all_reduce"] * 3
    else:
        assert "TORCH_FR_BUFFER_SIZE" in side["flight_recorder"]["note"]
    note = json.loads(empty.sidecar.read_text())["flight_recorder"]
    assert note["file"] is None and note["note"].startswith("empty: set TORCH_FR_BUFFER_SIZE")
    assert not list((tmp_path / "empty").glob("fr_*"))
    for n in capture.FR_ENV:
        monkeypatch.delenv(n, raising=False)
    capture.enable_flight_recorder(entries=123)  # no group now: the variable is set for the next one
    assert os.environ[capture.FR_ENV[0]] == "123" and capture.flight_recorder_enabled()


# ------------------------------------------------------------------------------------------------ the GPU data
GPU_DATA = ROOT / "tests" / "data" / "doctor"


def _gpu_case(case: str):
    return [traces.load_trace(GPU_DATA / case / f"trace_rank{r}.json.gz", cpu="all", cache=False) for r in (0, 1)]


def _in_steps(t, frame):
    st = _steps(t)
    return frame[(frame["ts"] >= st["ts"].min()) & (frame["ts"] < (st["ts"] + st["dur"]).max())]


def _runtime(t, name: str):
    """Runtime or driver calls called ``name`` made inside the recorded steps."""
    calls = t.cpu[t.cpu["cat"].isin(["cuda_runtime", "cuda_driver"])]
    return _in_steps(t, calls[calls["name"].astype(str) == name])


def test_gpu_traces_carry_what_the_doctor_needs():
    """The committed 2xH200 excerpts (recorded/h200x2/doctor, cut by tests/data/doctor/make_test_data.py): two ranks of
    one NCCL job, the capture facts in the header and the sidecar, the recorded steps the cut kept."""
    for case in ("clean", "late-rank", "cuda-graph-per-param"):
        for r, t in enumerate(_gpu_case(case)):
            assert (t.info.rank, t.info.world_size, t.info.backend) == (r, 2, "nccl")
            info = capture.capture_info(t)
            assert info["device_name"] == "NVIDIA H200" and info["device"] == f"cuda:{r}"
            assert info["torch"].startswith("2.11") and info["nccl"] == "2.28.9"
            assert capture.capture_info(t.path)["traces"] == [t.path.name]  # the sidecar beside it
            assert [s.name for s in _steps(t).itertuples()] == t.header["kitTrimmed"]["kept_steps"]


def test_gpu_traces_hold_what_each_flag_plants():
    clean = _gpu_case("clean")[0]
    memcpy = lambda t: t.gpu[t.gpu["name"].astype(str).str.startswith("Memcpy HtoD")]  # noqa: E731
    # pageable: the batches come from pageable memory; the clean job's are pinned
    assert set(memcpy(_gpu_case("pageable")[0])["name"]) == {"Memcpy HtoD (Pageable -> Device)"}
    assert set(memcpy(clean)["name"]) == {"Memcpy HtoD (Pinned -> Device)"}
    # h2d on the compute stream: the copies share the stream of the most kernels; clean prefetches on another
    for t, same in ((_gpu_case("h2d-on-compute-stream")[0], True), (clean, False)):
        compute = t.gpu[t.gpu["cat"] == "kernel"]["stream"].value_counts().idxmax()
        assert (set(memcpy(t)["stream"]) == {compute}) is same
    # item: a stream synchronisation inside the step; none in the clean step
    assert len(_runtime(_gpu_case("item")[0], "cudaStreamSynchronize")) == 1
    assert len(_runtime(clean, "cudaStreamSynchronize")) == len(_runtime(clean, "cudaDeviceSynchronize")) == 0
    # cuda graph: one replay per step
    assert len(_runtime(_gpu_case("cuda-graph-per-param")[0], "cudaGraphLaunch")) == 3
    # per-parameter all-reduce: 77 NCCL kernels launched in the step (one per parameter; NCCL launches through
    # the driver's cuLaunchKernelEx); DDP's 11 buckets
    for case, n in (("per-param-allreduce", 77), ("clean", 11)):
        t = _gpu_case(case)[0]
        launches = _runtime(t, "cuLaunchKernelEx")
        nccl = t.gpu[t.gpu["nccl"].astype(bool) & t.gpu["correlation"].isin(launches["correlation"])]
        assert len(nccl) == n, case
    # late rank: rank 0 waits in an all-reduce for rank 1, which slept 200 ms
    r0, r1 = _gpu_case("late-rank")
    assert r0.gpu[r0.gpu["nccl"].astype(bool)]["dur"].max() > 150e3 > r1.gpu[r1.gpu["nccl"].astype(bool)]["dur"].max()
