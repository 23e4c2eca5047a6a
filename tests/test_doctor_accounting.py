"""The doctor's step accounting (kit.doctor.accounting): a planted timeline split exactly by the documented
precedence, and on every committed trace the slices of every step sum to the step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kit import traces
from kit.doctor.accounting import SLICES, account
from kit.doctor.steps import step_time, steps_frame
from kit.doctor.model import RankView


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """A rule's internal error fails the test (it is a kit bug), instead of becoming a skip line."""
    monkeypatch.setenv("KIT_DOCTOR_STRICT", "1")

DATA = Path(__file__).resolve().parent / "data"


def _view(t, rank=0) -> RankView:
    v = RankView(trace=t, steps=steps_frame(t.cpu), rank=rank)
    return replace(v, step_us=step_time(v))


def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _kernel(corr, ts, dur):
    return _x(f"k{corr}", "kernel", ts, dur, tid=7, device=0, stream=7, correlation=corr)


def _launch(corr, ts, dur=10):
    return _x("cudaLaunchKernel", "cuda_runtime", ts, dur, correlation=corr)


def planted():
    """One 10 ms step: each idle stretch planted with one cause (see the test for the arithmetic)."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 10000),
          _launch(1, 50), _kernel(1, 100, 1000),
          _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 900, 3000),
          _launch(2, 4000), _kernel(2, 4100, 1000),
          _x("cudaStreamSynchronize", "cuda_runtime", 5000, 110),
          _launch(3, 5600), _kernel(3, 5700, 300),
          _launch(4, 8000), _kernel(4, 8050, 950),  # 5610 -> 8000: 2.4 ms without issuing anything
          _x("cudaFree", "cuda_runtime", 9000, 500),
          _launch(5, 9600), _kernel(5, 9700, 300)]
    return traces.from_dict({"schemaVersion": 1, "traceEvents": ev})


def test_planted_step_is_split_by_the_precedence():
    a = account(_view(planted()))
    got = {s: round(a.per_step_us(s), 3) for s in SLICES if a.per_step_us(s)}
    # compute: 1000 + 1000 + 300 + 950 + 300. input: idle 1100-3900 inside the 3000 us DataLoader wait + its
    # catch-up to the next launch (3900-4010; the wait's budget: 3000 - 2800 = 200). sync: 5100-5110 inside the
    # 110 us synchronize + 100 us of catch-up (a host blocked 110 us is at most 110 us behind); the other 400 us
    # to the next launch are the host's own issuing pace: launch. host_stall: 6000-8010 (no issuing call
    # 5610-8000). allocator: 9000-9500 in cudaFree (its whole 500 us: no budget left), then 9500-9610 launch.
    # queued: the launch had returned (60-100, 4010-4100, 5610-5700, 8010-8050, 9610-9700). step_start: 0-60.
    assert got == {"compute": 3550, "input": 2910, "sync": 110, "launch": 510, "host_stall": 2010, "allocator": 500,
                   "queued": 350, "step_start": 60}
    assert sum(got.values()) == 10000 and a.window_us == 10000


def test_a_block_that_starts_on_an_idle_gpu_keeps_only_its_own_time():
    """A DataLoader wait that begins after the GPU already ran dry did not drain it: the host was behind
    (launch-bound); only the wait itself is input."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 3000), _launch(1, 0), _kernel(1, 20, 100),
          _x("enumerate(DataLoader)#x", "user_annotation", 500, 200), _launch(2, 1500), _kernel(2, 1600, 1400)]
    a = account(_view(traces.from_dict({"schemaVersion": 1, "traceEvents": ev})))
    assert round(a.per_step_us("input")) == 200 and round(a.per_step_us("launch")) == 1190


def _committed():
    return sorted(p for p in DATA.rglob("*.json*") if p.name.endswith((".json", ".json.gz"))
                  and "rank" in p.name and "nccl_profiler" not in p.parts and not p.name.startswith(("capture_", "fr_")))


@pytest.mark.parametrize("path", _committed(), ids=lambda p: str(p.relative_to(DATA)))
def test_slices_and_host_kinds_sum_to_every_step_on_committed_traces(path):
    from kit.doctor.host_model import KINDS, host_model

    t = traces.load_trace(path)
    if t.gpu.empty:  # a CPU-only trace: read with every CPU op, the main thread plays the device
        return _cpu_slices_are_the_host_models_kinds(path, t)
    view = _view(t)
    a = account(view)
    ps = a.per_step
    assert len(ps) >= 1 and (ps["dur"] > 0).all()
    assert (ps[list(SLICES)] >= -1e-6).all().all()
    assert ((ps[list(SLICES)].sum(axis=1) - ps["dur"]).abs() <= 1e-6 * ps["dur"] + 1e-6).all()
    assert a.cost("compute") <= (a.step_us or a.window_us) + 1e-6
    # the host model's kinds split the same windows, and its GPU busy time is the accounting's
    hs = host_model(view).per_step
    assert ((hs[[f"{k}_us" for k in KINDS]].sum(axis=1) - hs["dur"]).abs() <= 1e-6 * hs["dur"] + 1e-3).all()
    busy = ps[["compute", "comm", "memory"]].sum(axis=1).to_numpy()
    assert hs["gpu_busy_us"].to_numpy() == pytest.approx(busy, rel=1e-6, abs=1e-3)


def _cpu_slices_are_the_host_models_kinds(path, t):
    """One precedence on a CPU-only job: each slice is the sum of the host model's kinds it maps
    (:data:`kit.doctor.accounting.CPU_SLICES`), step by step, and the slices sum to the step."""
    from kit.doctor.accounting import CPU_SLICES, account_cpu
    from kit.doctor.host_model import KINDS, host_model
    from kit.doctor.steps import find_steps

    cpu_all = traces.load_trace(path, cpu="all").cpu
    if cpu_all.empty:
        pytest.skip("no GPU activity and no CPU ops")
    view = RankView(trace=t, steps=find_steps(t.cpu, cpu_all), rank=0)
    view = replace(view, step_us=step_time(view))
    host = host_model(view, cpu_all)
    a = account_cpu(view, cpu_all, host)
    if a is None:
        pytest.skip("no CPU ops to place a window on")
    ps, hs = a.per_step, host.per_step
    assert a.mode == "cpu" and len(ps) == len(hs) >= 1 and (ps["dur"] > 0).all()
    assert set(k for ks in CPU_SLICES.values() for k in ks) == set(KINDS)
    for sl, kinds in CPU_SLICES.items():
        assert ps[sl].to_numpy() == pytest.approx(hs[[f"{k}_us" for k in kinds]].sum(axis=1).to_numpy(), abs=1e-6)
    assert ((ps[list(SLICES)].sum(axis=1) - ps["dur"]).abs() <= 1e-6 * ps["dur"] + 1e-3).all()


def test_diagnosis_carries_the_accounting_table_and_figure():
    """What the text report, --json and the HTML page show: per rank the slices in ms that add up to the step."""
    import matplotlib

    matplotlib.use("Agg")
    from kit.doctor import diagnose
    from kit.doctor import notebook as dn
    from kit.doctor.accounting import SLICES
    from kit.doctor.report import format_text

    d = diagnose([DATA / "doctor" / "late-rank"], workers=1)
    tab = dn.accounting_table(d)
    assert list(tab["rank"]) == [0, 1] and set(f"{s}_ms" for s in SLICES) <= set(tab.columns)
    total = tab[[f"{s}_ms" for s in SLICES]].sum(axis=1)
    assert ((total - tab["step_ms"]).abs() <= 0.01 * tab["step_ms"]).all()
    # the planted late rank stalls on the host: rank 1's GPU idles for it, rank 0's NCCL kernels wait for rank 1
    assert tab.loc[1, "host_stall_ms"] > 0.5 * tab.loc[1, "step_ms"]
    assert tab.loc[0, "comm_ms"] > 0.4 * tab.loc[0, "step_ms"]
    assert d.accounting["0"]["comm_split"]["waiting_us"] > 0
    assert "step accounting" in format_text(d) and "rank 1: idle" in format_text(d)
    fig = dn.accounting_figure(d)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 1"]


def _ti():
    import json

    d = json.loads((DATA / "anchors" / "traceinsight_temporal.json").read_text())
    return d["traces"]


def test_gpu_idle_agrees_with_traceinsight_within_2_points():
    """traceinsight 0.6.1's temporal breakdown (recorded by benchmarks/anchors/compare.py) against the doctor's
    accounting over the same span (the traced GPU span, one window). Compared where traceinsight kept every GPU
    event of the trace (it drops GPU events whose launching CPU op is not in the trace: on the trimmed doctor
    traces it keeps 692 of 1729 and reports 59% idle on a job whose GPU is busy 98% of its span) and where its
    whole-us times cannot move the share by a point (GPU events x 1 us <= 1% of the span; below that the
    truncation itself moves the idle share, see the next test)."""
    import numpy as np
    import pandas as pd

    from kit.doctor.accounting import IDLE

    compared = 0
    for path, e in _ti().items():
        p = DATA.parent.parent / path
        if not p.exists():
            continue
        t = traces.load_trace(p)
        ti = e["all_steps"]
        if "error" in ti:  # traceinsight failed on it (CPU-only traces: no GPU kernel to index)
            continue
        if ti["gpu_events"] != len(t.gpu) or len(t.gpu) * 1.0 > 0.01 * ti["span_us"]:
            continue  # it dropped events, or its whole-us times move the idle share by up to ~1 us per event
        v = RankView(trace=t, steps=pd.DataFrame(columns=["step", "ts", "end", "dur"]), rank=0)
        a = account(v)
        assert abs(100 * sum(a.share(s) for s in IDLE) - 100 * ti["idle_share"]) <= 2.0, path
        compared += 1
    assert compared >= 10


def test_traceinsight_whole_us_explains_the_tiny_kernel_difference():
    """On 6,692 kernels of ~0.9 us traceinsight reports 55.9% idle, the accounting 50.1%: with every start and
    duration truncated to whole us, as traceinsight holds them, the same union gives 55.1%."""
    import numpy as np

    from kit.traces.intervals import union_np

    path = "tests/data/doctor/tiny-kernels/trace_rank0.json.gz"
    ti = _ti()[path]["all_steps"]["idle_share"]
    g = traces.load_trace(DATA.parent.parent / path).gpu
    ts, dur = np.floor(g["ts"].to_numpy(float)), np.floor(g["dur"].to_numpy(float))
    a, b = union_np(ts, ts + dur)
    idle = 1 - (b - a).sum() / (b.max() - a.min())
    assert abs(idle - ti) <= 0.02


def _acc(ev):
    return account(_view(traces.from_dict({"schemaVersion": 1, "traceEvents": ev})))


def test_catch_up_is_the_blocked_threads_and_a_block_is_charged_once():
    """A reviewer's cases: (1) a synchronize on thread 1 does not take thread 2's launch gaps as catch-up;
    (2) a stall that crosses a step boundary is charged the same as one inside a step (not its duration twice);
    (3) a long op on another thread does not hide this thread's stall."""
    def sync_then(tid):  # thread 1: a 2 ms synchronize begun while the GPU is busy; then `tid` issues the rest
        launch = lambda c, ts: _x("cudaLaunchKernel", "cuda_runtime", ts, 10, tid=tid, correlation=c)  # noqa: E731
        return [_x("ProfilerStep#1", "user_annotation", 0, 6000), _launch(1, 0), _kernel(1, 50, 1000),
                _x("cudaDeviceSynchronize", "cuda_runtime", 20, 2000), _launch(2, 2030), _kernel(2, 2100, 100),
                launch(3, 2400), _kernel(3, 2450, 100), launch(4, 2700), _kernel(4, 2750, 100),
                launch(5, 3000), _kernel(5, 3050, 2950)]
    other, same = _acc(sync_then(2)), _acc(sync_then(1))
    assert other.per_step_us("launch") > 0 and same.per_step_us("launch") == 0
    assert other.per_step_us("sync") < same.per_step_us("sync")

    work = [_launch(1, 0), _kernel(1, 100, 4900), _launch(2, 12000), _kernel(2, 12050, 100),
            _launch(3, 12600), _kernel(3, 12650, 100), _launch(4, 13200), _kernel(4, 13250, 100),
            _launch(5, 13800), _kernel(5, 13850, 6000)]
    step = lambda ts, d: _x(f"ProfilerStep#{ts}", "user_annotation", ts, d)  # noqa: E731
    across = _acc([step(0, 10000), step(10000, 10000)] + work).total
    inside = _acc([step(0, 4000), step(4000, 16000)] + work).total
    assert across["host_stall"] == pytest.approx(inside["host_stall"]) and across["host_stall"] < 12000

    base = [step(0, 5000), _launch(1, 0), _kernel(1, 50, 100), _launch(2, 4000), _kernel(2, 4100, 900)]
    pinned = base + [_x("aten::copy_", "cpu_op", 100, 3800, tid=99)]
    assert _acc(pinned).per_step_us("host_stall") == _acc(base).per_step_us("host_stall") > 3000


def test_a_drained_queue_is_charged_to_the_block_that_drained_it():
    """The queue-drain attribution: (1) a 2910 us synchronize drains the GPU; the host issues a 1 ms kernel and
    waits 5 ms for its DataLoader, which the empty queue no longer hides: of the wait's 3940 us of idle the first
    2880 us are the sync's (its 2910 us less its own 10 us and the 20 us launch after it: the host would have been
    that much further ahead, no more), the rest is the wait's, and so is the launch after it (the wait's own debt);
    (2) a synchronize after a DataLoader wait ends the wait's debt (the lead it cost would have been spent waiting
    in the synchronize): the launch after the synchronize is the host's own pace; (3) the same as (1) with the
    batch from worker processes: the wait ends when the workers have it, however early the host comes -- all of it
    is the wait's. Queued: 90 us at each start."""
    sync = lambda ts, d: _x("cudaStreamSynchronize", "cuda_runtime", ts, d)  # noqa: E731
    loader = lambda ts, d, it="_SingleProcessDataLoaderIter": _x(  # noqa: E731
        f"enumerate(DataLoader)#{it}.__next__", "user_annotation", ts, d)

    def drained(it="_SingleProcessDataLoaderIter"):
        return _acc([_x("ProfilerStep#1", "user_annotation", 0, 12000), _launch(1, 0), _kernel(1, 100, 3000),
                     sync(200, 2910), _launch(2, 3120), _kernel(2, 3200, 1000), loader(3140, 5000, it),
                     _launch(3, 8150), _kernel(3, 8200, 3800)])

    got = {s: round(drained().per_step_us(s)) for s in ("sync", "input", "launch", "queued")}
    assert got == {"sync": 10 + 20 + 2880, "input": 3940 - 2880 + 20, "launch": 0, "queued": 90 + 70 + 40}
    got = {s: round(drained("_MultiProcessingDataLoaderIter").per_step_us(s)) for s in ("sync", "input", "launch")}
    assert got == {"sync": 10 + 20, "input": 3940 + 20, "launch": 0}
    b = _acc([_x("ProfilerStep#1", "user_annotation", 0, 8000), _launch(1, 0), _kernel(1, 100, 1000),
              loader(200, 3000), sync(3210, 20), _launch(2, 3300), _kernel(2, 3400, 4600)])
    got = {s: round(b.per_step_us(s)) for s in ("sync", "input", "launch", "queued")}
    assert got == {"sync": 20, "input": 2100 + 10, "launch": 80, "queued": 90 + 90}


def test_a_paid_off_debt_does_not_date_the_next_blocks_debt():
    """A reviewer's case: two 100 us synchronizes each drain the GPU and are followed by 80 us of issuing idle; a
    batch from worker processes is waited for between them while queued GPU work hides the wait. The first sync's
    debt (100 less its own 50 us of idle) is paid off by the 80 us after it (50 to sync); the second's (100 less its
    own 20) takes all 80 after it. The worker wait began after the first sync but before the second: it ends no
    debt of the second's, so the sync slice is 50 + 20 + 50 + 80 with or without it, not 50 + 20 + 50."""
    sync = lambda ts: _x("cudaStreamSynchronize", "cuda_runtime", ts, 100)  # noqa: E731

    def two_syncs(wait):
        ev = [_x("ProfilerStep#1", "user_annotation", 0, 6000), _launch(1, 0), _kernel(1, 50, 100), sync(100),
              _launch(2, 270), _kernel(2, 280, 2000), sync(2200), _launch(3, 2370), _kernel(3, 2380, 3620)]
        loader = _x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "user_annotation", 400, 1000)
        return _acc(ev + [loader] * wait)

    for wait in (0, 1):
        got = {s: round(two_syncs(wait).per_step_us(s)) for s in ("sync", "launch", "input")}
        assert got == {"sync": 50 + 20 + 50 + 80, "launch": 30, "input": 0}, wait


def test_host_syncs_estimate_counts_an_in_process_dataloader_in_its_bubble():
    """host_sync's own estimate (:func:`kit.doctor.rules.sync_costs.sync_costs`) agrees with the accounting on
    what a drained queue exposes: a synchronize that waited for the GPU, then a 2000 us DataLoader request in the
    2100 us bubble before the next kernel -- the sync's (min of bubble and blocked time) when the DataLoader loads
    in the process (it would have loaded earlier), not when the batch comes from worker processes."""
    from kit.doctor.host_model import host_model
    from kit.doctor.rules.sync_costs import sync_costs

    def cost(it):
        ev = [_x("ProfilerStep#1", "user_annotation", 0, 10000), _launch(1, 0), _kernel(1, 100, 1000),
              _launch(3, 20), _kernel(3, 1100, 2000), _x("cudaStreamSynchronize", "cuda_runtime", 200, 2910),
              _x(f"enumerate(DataLoader)#{it}.__next__", "user_annotation", 3120, 2000),
              _launch(2, 5130), _kernel(2, 5200, 3800)]
        v = _view(traces.from_dict({"schemaVersion": 1, "traceEvents": ev}))
        return sync_costs(replace(v, host=host_model(v))).cost_us

    assert cost("_SingleProcessDataLoaderIter") == pytest.approx(2100)
    assert cost("_MultiProcessingDataLoaderIter") == pytest.approx(100)


def test_zero_length_activity_only_is_a_skip_not_an_error(tmp_path):
    from kit.doctor import diagnose

    (tmp_path / "trace_rank0.json").write_text(__import__("json").dumps(
        {"schemaVersion": 1, "traceEvents": [_launch(1, 0), _kernel(1, 50, 0), _x("aten::mm", "cpu_op", 0, 20)]}))
    d = diagnose([tmp_path], workers=1)
    assert d.accounting == {} and any(s.rule == "input_bound" for s in d.skipped)


@pytest.mark.parametrize("case", ["gpt-host_stall", "cnn-host_stall_gc", "cnn-allocator_churn"])
def test_each_host_stall_is_listed_once(case):
    """A stretch with no thread issuing GPU work is seen from every thread that issues (the main thread and
    autograd's): the evidence lists it once, with the calls around it, not once per thread."""
    from kit.doctor import diagnose

    d = diagnose([str(Path(__file__).parent / "data" / "doctor" / "corpus" / case)])
    (f,) = [f for f in d.findings if f.rule == "host_stall"]
    st = sorted(f.evidence["longest_stalls"], key=lambda s: s["start_us"])
    assert st and all(a["start_us"] + a["dur_us"] <= b["start_us"] for a, b in zip(st, st[1:])), st
    assert st[0]["before"] is not None and all(s["dur_us"] >= 1000 for s in st)


def test_input_bound_names_what_next_spends_its_time_in():
    """cnn-host_sync's DataLoader steps spend most of next() pinning the batch (aten::pin_memory, kept as a long
    op): the summary says so; where no kept op dominates (cnn-input_bound: a Python transform), it says nothing."""
    from kit.doctor import diagnose

    corpus = Path(__file__).parent / "data" / "doctor" / "corpus"
    (f,) = [f for f in diagnose([str(corpus / "cnn-host_sync")]).findings if f.rule == "input_bound"]
    inside = f.evidence["dataloader_inside"]
    assert list(inside)[0] == "aten::pin_memory" and inside["aten::pin_memory"]["host_us"] > 5000
    assert "most of it in aten::pin_memory" in f.summary and "pinning" in f.summary
    (g,) = [f for f in diagnose([str(corpus / "cnn-input_bound")]).findings if f.rule == "input_bound"]
    assert "most of it" not in g.summary


# ------------------------------------------------------------------------------------------- the host model
def test_host_model_splits_the_planted_step_and_feeds_the_accounting():
    """The planted step's host side, by kind (kit.doctor.host_model): the DataLoader wait, the synchronize, the
    cudaFree and the 2.4 ms without an issuing call are the same spans the accounting splits GPU idle time by."""
    from kit.doctor.host_model import KINDS, PER_STEP, host_model

    h = host_model(_view(planted()))
    (row,) = h.per_step.to_dict("records")
    assert list(h.per_step.columns) == list(PER_STEP)
    assert row["dur"] == 10000 and sum(row[f"{k}_us"] for k in KINDS) == pytest.approx(10000)
    assert row["data_wait_us"] == 3000 and row["sync_us"] == 110 and row["alloc_us"] == 500
    assert row["stall_us"] == pytest.approx(2390, abs=1)  # 5610 -> 8000: nothing issued, no recorded op
    assert row["gpu_busy_us"] == 3550 and row["gpu_comm_us"] == 0 and row["gpu_compute_us"] == 3550
    assert set(h.activity["kind"]) <= set(KINDS)
    assert h.activity.loc[h.activity["kind"] == "sync", "name"].tolist() == ["cudaStreamSynchronize"]


def test_late_rank_reason_comes_from_the_host_activity_the_accounting_uses():
    """gloo3-cnn-late_rank: rank 1 sleeps before its backward. The accounting calls that stretch host_stall;
    late_rank's reason reads the same host model, so it says the rank stalled on the host (host_stall), not that it
    issued work more slowly while listing a 30 ms stall beside it."""
    from kit.doctor import diagnose

    d = diagnose([DATA / "doctor" / "corpus" / "gloo3-cnn-late_rank"], workers=1)
    (f,) = [f for f in d.findings if f.rule == "late_rank"]
    assert f.evidence["reason"] == "host_stall"
    stall = f.evidence["own_idle"]["host_stall"]["longest_stalls"][0]["dur_us"]
    assert f.evidence["reason_us_per_step"]["host_stall"] == pytest.approx(stall, rel=0.1)


def test_excerpt_host_lane_draws_the_host_models_sync_calls():
    """A cudaMemcpyAsync into pageable host memory (``.cpu()``) blocks like a sync: the excerpt draws it as the
    accounting counts it (a synchronising call), not as an 'other call'; a collective op is drawn as one."""
    from kit.doctor import notebook as dn

    ev = [_x("ProfilerStep#1", "user_annotation", 0, 3000), _launch(1, 0), _kernel(1, 20, 100),
          _x("cudaMemcpyAsync", "cuda_runtime", 200, 900, correlation=2),
          _x("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 1000, 50, tid=7, device=0, stream=7, correlation=2),
          _x("c10d::allreduce_", "cpu_op", 1200, 300), _launch(3, 1600), _kernel(3, 1700, 100)]
    t = traces.from_dict({"schemaVersion": 1, "traceEvents": ev})
    bars = dn._host_bars(t, 0.0, 0.0, 3000.0)
    assert (200.0, 900.0, dn.SYNC_COLOR) in bars and not any(c == dn.CALL_COLOR for _, _, c in bars)
    assert (1200.0, 300.0, dn.COMM_COLOR) in bars


def test_capture_notes_read_driver_calls_and_every_graph_launch_name():
    """Launches through the driver API (``cuLaunchKernel``) are CUDA calls the host rules read: no 'no CUDA runtime
    events' note; a graph replayed by ``cudaGraphLaunch_v10000`` is a graph replay."""
    from kit.doctor.notes import capture_notes

    def notes(ev):
        t = traces.from_dict({"schemaVersion": 1, "traceEvents": [_x("ProfilerStep#1", "user_annotation", 0, 3000)]
                              + ev})
        return capture_notes(t, steps_frame(t.cpu))

    drv = [_x("cuLaunchKernel", "cuda_driver", 0, 10, correlation=1), _kernel(1, 20, 100)]
    assert not any("no CUDA runtime events" in n for n in notes(drv))
    nccl = [_x("cudaGraphLaunch_v10000", "cuda_runtime", 0, 10, correlation=1),
            _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 20, 100, tid=7, device=0, stream=7,
               correlation=1)]
    got = [n for n in notes(nccl) if n.startswith("NCCL kernels carry no collective metadata")]
    assert got and "replayed from CUDA graphs" in got[0]


def test_host_rules_skip_without_a_host_model():
    """The host rules read the host model only: a rank without one (its stage failed) is a skip line, never a
    second view of the host built on the side."""
    import kit.doctor.rules  # noqa: F401  (registers every rule)
    from kit.doctor.model import RULES, Skip

    view = _view(planted())
    assert view.host is None
    for rid in ("launch_bound", "host_sync", "pageable_h2d", "graph_mixing_gap"):
        got = RULES[rid].extract(view)
        assert isinstance(got, Skip) and "no host model" in got.why, rid


def test_a_cpu_ranks_gap_around_a_collective_is_waiting_for_its_peer():
    """A CPU-only rank (gloo): the main thread's gap in which a collective runs on gloo's thread is the thread blocked
    waiting for it, up to its wake-up after the collective's span ends -- comm_wait, not a stall; a gap with no
    collective in it (a sleep) stays a stall."""
    import numpy as np

    from kit.doctor.host_model import _blocked_on_peers

    (wa, wb), (sa, sb) = _blocked_on_peers((np.array([10.0]), np.array([20.0])),
                                           (np.array([5.0, 30.0]), np.array([25.0, 40.0])))
    assert list(wa) == [5.0] and list(wb) == [25.0] and list(sa) == [30.0] and list(sb) == [40.0]


def test_a_cpu_ranks_wait_ends_at_its_wake_up_after_the_collective():
    """A 10 us collective inside a 50 ms gap of the main thread's ops: the thread waited for it up to its wake-up
    after the collective ended; the rest of the gap is its own work without recorded ops -- a stall, not comm_wait."""
    import numpy as np

    from kit.doctor.host_model import STALL_US, WAKE_US, _blocked_on_peers

    (wa, wb), (sa, sb) = _blocked_on_peers((np.array([100.0]), np.array([110.0])),
                                           (np.array([0.0]), np.array([50_000.0])))
    assert list(wa) == [0.0] and list(wb) == [110.0 + WAKE_US]
    assert list(sa) == [110.0 + WAKE_US] and list(sb) == [50_000.0]
    # a wake-up a little late (past WAKE_US, shorter than a stall) is still the wait, not a stall
    (wa, wb), (sa, sb) = _blocked_on_peers((np.array([100.0]), np.array([110.0])),
                                           (np.array([0.0]), np.array([110.0 + WAKE_US + 0.5 * STALL_US])))
    assert list(wa) == [0.0] and list(wb) == [110.0 + WAKE_US + 0.5 * STALL_US] and len(sa) == 0


def test_pytorchs_own_regions_are_issuing_not_a_stall():
    """1.5 ms between two launches, 1.2 ms of it inside ``Optimizer.step#...`` (PyTorch's annotation around the
    optimizer: its Python and dispatch before its first launch, e.g. an FSDP2 optimizer's DTensor dispatch): the
    host issuing its work (launch), not a stall; the 290 us before the region is not a stall either (shorter than
    a stall). Inside a region around the user's code (DDP's forward runs the user's modules; a user's own
    record_function) the same gap stays a stall."""
    def gap(region):
        return _acc([_x("ProfilerStep#1", "user_annotation", 0, 6000), _launch(1, 0), _kernel(1, 50, 100),
                     _x(region, "user_annotation", 300, 1500), _launch(2, 1500), _kernel(2, 1550, 4450)])
    framework, user = gap("Optimizer.step#SGD.step"), gap("## logging ##")
    assert framework.per_step_us("host_stall") == 0 and framework.per_step_us("launch") == pytest.approx(1360)
    assert user.per_step_us("host_stall") == pytest.approx(1360)
    assert gap("DistributedDataParallel.forward").per_step_us("host_stall") == pytest.approx(1360)


def test_the_profilers_buffer_requests_are_its_own_time_not_a_stall():
    """1.5 ms between two launches, 1.3 ms of it inside CUPTI's ``Activity Buffer Request`` (category ``overhead``,
    on its own lane): the profiler's time (the host model's ``profiler`` kind, left to ``launch``, which is stated net
    of the profiler), not a host stall nor the rank's own time; a launch waiting for the GPU's full queue
    (``Command Buffer Full``) is no profiler time: the same gap stays a stall. The trace layer keeps the category."""
    from kit.doctor.host_model import host_model

    def gap(name):
        ev = [_x("ProfilerStep#1", "user_annotation", 0, 6000), _launch(1, 0), _kernel(1, 50, 100),
              {"ph": "X", "name": name, "cat": "overhead", "ts": 200, "dur": 1300, "pid": -1, "tid": 0},
              _launch(2, 1500), _kernel(2, 1550, 4450)]
        v = _view(traces.from_dict({"schemaVersion": 1, "traceEvents": ev}))
        return account(v), host_model(v).per_step.iloc[0]
    (prof, ps), (full, fs) = gap("Activity Buffer Request"), gap("Command Buffer Full")
    assert prof.per_step_us("host_stall") == 0 and prof.per_step_us("launch") == pytest.approx(1360)
    assert full.per_step_us("host_stall") == pytest.approx(1360)
    assert ps["profiler_us"] == pytest.approx(1300) and fs["profiler_us"] == 0  # (the stall after the last launch
    assert fs["stall_us"] - ps["stall_us"] == pytest.approx(1490)  # to the step's end is the same in both)
    assert fs["own_host_us"] - ps["own_host_us"] == pytest.approx(1490)  # (the 190 us before it: idle, not own)
    kept = traces.load_trace(DATA / "doctor" / "corpus" / "gpt-control-nosteps" / "trace.json.gz", cache=False).cpu
    assert (kept["cat"] == "overhead").sum() == 1


def _hooked(region: str, first_launch: float) -> "Account":
    """A 25.55 ms step: a launch at 0, then ``region`` from 300 to 21800 with a launch at ``first_launch`` inside
    it and the step's last launch at 21500 (its kernel runs 21550-25550); nothing else recorded."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 25550), _launch(1, 0), _kernel(1, 50, 100),
          _x(region, "user_annotation", 300, 21500), _launch(3, 21500), _kernel(3, 21550, 4000)]
    return _acc(ev + ([_launch(2, first_launch), _kernel(2, first_launch + 50, 100)] if first_launch else []))


def test_a_stall_after_the_optimizers_first_launch_stays_a_stall():
    """``Optimizer.step#`` wraps the user's step post-hooks and a custom optimizer's Python too: a 21 ms stretch
    with no op inside it after the region's first launch (a post-hook that logs or sleeps) is a stall, as in a
    user's own region; only the stretch before the first launch is the framework's dispatch."""
    for region in ("Optimizer.step#SGD.step", "## logging ##"):
        assert _hooked(region, 400).per_step_us("host_stall") == pytest.approx(21000, abs=200)


@pytest.mark.xfail(strict=True, reason="a stall in a step pre-hook lies before the optimizer's first launch, where "
                                       "the framework's dispatch is (Python, DTensor dispatch, grouping parameters: "
                                       "0.5-1.3 ms measured); the hooks carry no annotation, so the trace does not "
                                       "tell them apart and the stretch is taken for dispatch (launch)")
def test_a_stall_in_a_step_pre_hook_is_a_stall():
    assert _hooked("Optimizer.step#SGD.step", None).per_step_us("host_stall") == pytest.approx(21200, abs=300)


def test_a_block_begun_on_a_dry_gpu_owes_nothing_across_a_step_boundary():
    """The GPU runs dry while the host is in the optimizer (issuing: launch); a 3.5 ms stall follows and crosses
    into the next step, whose DataLoader wait the GPU then idles through. The stall began after the GPU ran dry: it
    drained nothing, so it owes no catch-up -- the window's start cutting the idle stretch in two is not a drain
    (before, the second part registered the stall's whole duration as a debt and took the wait's idle)."""
    a = _acc([_x("ProfilerStep#1", "user_annotation", 0, 5000), _x("ProfilerStep#2", "user_annotation", 5000, 7000),
              _launch(1, 0), _kernel(1, 50, 1000), _x("Optimizer.step#SGD.step", "user_annotation", 20, 1580),
              _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 5100, 2900),
              _launch(2, 8050), _kernel(2, 8100, 3900)])
    assert a.total["host_stall"] == pytest.approx(3500) and a.total["input"] >= 2900
