"""kit.doctor.host_model's quiet time against every recorded op, on committed traces."""

from pathlib import Path

import numpy as np
import pytest

from kit import traces
from kit.doctor import host_model as hm

CASE = Path(__file__).resolve().parent / "data" / "doctor" / "corpus-h100x2" / "gpt-ddp-bf16-cpu_rank"


@pytest.mark.parametrize("rank", [0, 1])
def test_quiet_time_breaks_at_the_short_ops_the_frame_left_out(rank):
    """Rank 0 of this contended DDP case has a 1.05 ms stretch of 56 ops under 1 ms and no event the default frame
    keeps: with the trace layer's short-op spans its quiet stretches are those of the frame of every op, that one not
    among them; rank 1, its core shared with a busy loop, stays quiet for ms."""
    from kit.doctor.model import RankView
    from kit.doctor.steps import find_steps

    assert hm.STALL_US >= traces.frames.LONG_CPU_OP_US  # the gap the short ops' spans are merged across
    t, every = (traces.load_trace(sorted(CASE.glob("*.json.gz"))[rank], cpu=c) for c in ("default", "all"))
    span = (np.r_[t.cpu["ts"].min()], np.r_[t.cpu["end"].max()])
    got, want = hm._quiet(t.cpu, *span, t.short_spans), hm._quiet(every.cpu, *span)
    assert t.info.short_ops > 0 and np.array_equal(got, want)
    quiet = hm.host_model(RankView(trace=t, steps=find_steps(t.cpu, None, t.gpu), rank=rank)).per_step["own_quiet_us"]
    frame = hm._quiet(t.cpu, *span)  # the default frame alone: the 56 ops' stretch
    assert quiet.max() == 0.0 < max(frame[1] - frame[0]) - 1000 if rank == 0 else quiet.median() > 5000.0


def test_a_dataloader_wait_is_not_quiet():
    """The input straggler's rank 1 runs its DataLoader's transform on the main thread (Python, a short op per sample):
    waiting for its data, not preempted -- no quiet time."""
    from kit.doctor.rank_phase import rank_summary

    case = CASE.parent / "gpt-ddp-bf16-input_rank"
    steps = rank_summary(sorted(case.glob("*.json.gz"))[1]).host_steps
    assert steps["own_data_wait_us"].median() > 10_000.0 and steps["own_quiet_us"].max() == 0.0


def test_the_short_ops_keep_their_thread():
    """The trace layer keeps where each thread ran the ops its default frame leaves out (per thread, those less than
    LONG_CPU_OP_US apart merged): exactly the spans of the frame of every op, thread by thread, through the trace
    cache too; merged over the threads they are the process's short-op spans."""
    from kit.traces.intervals import union_np

    p = sorted(CASE.glob("*.json.gz"))[0]
    fresh, every = traces.load_trace(p, cache=False), traces.load_trace(p, cpu="all")
    traces.load_trace(p)
    cached = traces.load_trace(p)  # the second read comes from the cache
    kept = fresh.cpu[fresh.cpu["cat"] == "cpu_op"]
    ops = every.cpu[every.cpu["cat"] == "cpu_op"].merge(kept[["tid", "ts", "dur"]], how="left", indicator=True)
    short = ops[ops["_merge"] == "left_only"]
    assert len(short) == fresh.info.short_ops and short["tid"].nunique() >= 2  # the main and the autograd thread
    for tid, g in short.groupby("tid"):
        want = union_np(g["ts"], g["ts"] + g["dur"], traces.frames.LONG_CPU_OP_US)
        for t in (fresh, cached):
            assert all(np.array_equal(x, y) for x, y in zip(t.short_spans_of([tid]), want))
    assert all(np.array_equal(x, y) for x, y in zip(union_np(*fresh.short_threads[:2], traces.frames.LONG_CPU_OP_US),
                                                    fresh.short_spans))


def test_the_backward_taken_over_by_the_autograd_thread_is_not_a_stall():
    """Rank 0 of the committed 4-GPU GPT control: its main thread waits in backward() while the autograd thread runs
    the backward's ops (TBackward0, ViewBackward0, ... short ops, which only the trace layer's per-thread spans keep)
    for 1.4-1.5 ms before its next launch. The ops that led the autograd thread into that launch (at most STALL_US of
    them) are the rank issuing: what is left is under STALL_US, no stall. Without the threads (every short op on one
    unknown thread) the two stretches were stalls."""
    from kit.doctor.model import RankView
    from kit.doctor.steps import find_steps

    t = traces.load_trace(sorted((CASE.parents[1] / "corpus-h100x4" / "gpt-ddp-bf16-control").glob("*.json.gz"))[0])
    view = RankView(trace=t, steps=find_steps(t.cpu, None, t.gpu), rank=0)
    now = hm.host_model(view)
    a, b, tid = t.short_threads
    t.short_threads = (a, b, np.full(tid.shape, np.nan))
    was = hm.host_model(view)
    wa, wb = was.spans("stall", was.main_tid)
    assert not len(now.spans("stall", now.main_tid)[0]) and len(wa) == 2 and (wb - wa).min() > 1400.0


def _stall_case(tmp, mutate):
    """The committed 2-GPU CNN stall_rank case (rank 1: ~20 ms of json.dumps after its optimizer) with rank 1's trace
    events changed by ``mutate(events, gaps)`` (``gaps``: its stretches of 15 ms or more between CPU events), in ``tmp``."""
    import gzip
    import json

    case = CASE.parent / "cnn-ddp-fp32-stall_rank"
    for p in sorted(case.glob("*.json.gz")):
        j = json.loads(gzip.decompress(p.read_bytes()))
        if (j.get("distributedInfo") or {}).get("rank") == 1:
            ev = j["traceEvents"]
            cpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation",
                                                                           "python_function", "cuda_driver")]
            pts = sorted({(e["ts"], e["tid"], e["pid"]) for e in cpu} | {(e["ts"] + e.get("dur", 0), e["tid"], e["pid"])
                                                                          for e in cpu})
            mutate(ev, [(a, b, tid, pid) for (a, tid, pid), (b, _, _) in zip(pts, pts[1:]) if b - a >= 15_000])
        (tmp / p.name).write_bytes(gzip.compress(json.dumps(j).encode(), 1))
    return json.loads((case / "truth.json").read_text())["added_us"]


@pytest.mark.parametrize("where", ["main", "helper"])
def test_cpu_work_without_a_launch_stays_a_stall(tmp_path, where):
    """The stall case with a 20 us CPU op every 500 us through rank 1's 20 ms stall (metrics on CPU tensors), on its
    main thread or on a helper thread that issued one copy at the trace's start (an EMA, checkpoint or logging thread):
    ops that lead to no launch are work that issues nothing -- late_rank [1] for its stall, at 0.5-2x the added time."""
    from kit.doctor import diagnose

    def mutate(ev, gaps):
        helper = 424242
        for a, b, tid, pid in gaps:
            ev += [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": pid, "tid": tid if where == "main" else helper,
                    "ts": t, "dur": 20.0, "args": {}} for t in np.arange(a + 200.0, b - 200.0, 500.0).tolist()]
        if where == "helper":
            k0 = next(e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel")
            r0 = next(e for e in ev if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaLaunchKernel")
            t = min(e["ts"] for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")) + 50
            ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": r0["pid"], "tid": helper, "ts": t,
                    "dur": 8.0, "args": {"correlation": 10 ** 9 + 7, "external id": 0}},
                   {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": k0["pid"],
                    "tid": k0["tid"], "ts": t + 10.0, "dur": 3.0, "args": {**k0["args"], "correlation": 10 ** 9 + 7}}]
        assert gaps

    added = _stall_case(tmp_path, mutate)
    f = diagnose(sorted(tmp_path.glob("*.json.gz")), workers=1).problems[0]
    assert f.rule == "late_rank" and f.ranks == (1,) and f.evidence["reason"] == "host_stall"
    assert 0.5 <= f.cost_us_per_step / added <= 2.0


def test_a_trace_with_thread_names_keeps_its_stall(tmp_path):
    """The Chrome trace format allows a string tid: the one-GPU CNN with ~20 ms of json.dumps per step, every CPU
    event's tid written as "thread <n>". The short ops are then kept as one unknown thread's; its host model is built
    as for numeric tids, and host_stall is first at the same cost."""
    import gzip
    import json

    from kit.doctor import diagnose

    case = CASE.parents[1] / "corpus" / "cnn-host_stall"
    want = diagnose(sorted(case.glob("*.json.gz")), workers=1).problems[0]
    for p in case.glob("*.json.gz"):
        j = json.loads(gzip.decompress(p.read_bytes()))
        for e in j["traceEvents"]:
            if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function",
                                "overhead") and isinstance(e.get("tid"), int):
                e["tid"] = f"thread {e['tid']}"
        (tmp_path / p.name).write_bytes(gzip.compress(json.dumps(j).encode(), 1))
    t = traces.load_trace(next(tmp_path.glob("*.json.gz")))
    assert t.info.short_ops and np.isnan(t.short_threads[2]).all() and not len(t.short_spans_of(["thread 441"])[0])
    got = diagnose(sorted(tmp_path.glob("*.json.gz")), workers=1).problems[0]
    assert got.rule == want.rule == "host_stall" and got.cost_us_per_step == want.cost_us_per_step


HOOK = CASE.parent.parent / "recorded-h200x2-fsdp-hook-stall"


@pytest.mark.skipif(not HOOK.exists(), reason="case not here")
def test_a_user_hook_sleeping_inside_fsdps_post_backward_stays_a_stall():
    """FSDP2 runs a parameter's post-accumulate-grad hooks inside ``FSDP::post_backward_reduce``: rank 1's hook sleeps
    8 ms there, no event recorded on its thread. FSDP's own code in those regions records an event every < 1 ms (the
    slow window's control: up to 0.95 ms apart, tests/test_control_clean.py), so that stretch is a stall, on the main
    thread waiting in backward() too, and rank 1 is late by a host stall (it was host_busy while the whole region
    counted as FSDP issuing: the fix pointed at CPU binding)."""
    from conftest import diagnosed
    from kit.doctor.model import RankView
    from kit.doctor.steps import find_steps

    t = traces.load_trace(HOOK / "rank1.json.gz")
    m = hm.host_model(RankView(trace=t, steps=find_steps(t.cpu, None, t.gpu), rank=1))
    reg = t.cpu[t.cpu["name"].astype(str).str.startswith("FSDP::post_backward_reduce (3)")].iloc[0]
    a, b = m.spans("stall", m.main_tid)
    inside = np.minimum(b, reg["end"]) - np.maximum(a, reg["ts"])
    assert inside.max() > 8000.0  # the hook's 8 ms sleep (the region: 9.3 ms)
    d = diagnosed(sorted(HOOK.glob("rank*.json.gz")))
    f = d.problems[0]
    assert (f.rule, f.ranks, f.evidence["reason"]) == ("late_rank", (1,), "host_stall")
