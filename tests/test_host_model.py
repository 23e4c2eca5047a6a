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


@pytest.mark.parametrize("case, stalls", [("corpus-h100x4/gpt-ddp-bf16-control", 0), ("corpus/cnn-host_stall", 3)])
def test_a_thread_waiting_for_another_issuing_thread_is_not_stalled(case, stalls):
    """The main thread waits in backward() while the autograd thread runs the backward's ops, and the autograd thread
    waits while the main thread resumes after it: where the other issuing thread ran ops (its short ops, which only
    the trace layer's per-thread spans keep) the rank is issuing. Rank 0 of the committed 4-GPU GPT control: its main
    thread's 'stalls' of 1.4-1.5 ms inside the backward (the autograd thread in TBackward0, ViewBackward0, ... without
    a launch) are gone; the one-GPU CNN with ~20 ms of json.dumps after its optimizer: the 1.17 ms from the autograd
    thread's last op to optimizer.step is not a stall, the three planted stalls stay whole. Without the threads (every
    short op on one unknown thread) they were stalls."""
    from kit.doctor.model import RankView
    from kit.doctor.steps import find_steps
    from kit.traces.intervals import covered

    t = traces.load_trace(sorted((CASE.parents[1] / case).glob("*.json.gz"))[0])
    view = RankView(trace=t, steps=find_steps(t.cpu, None, t.gpu), rank=0)
    now = hm.host_model(view)
    others = t.short_spans_of([x for x in now.threads if x != now.main_tid])
    a, b, tid = t.short_threads
    t.short_threads = (a, b, np.full(tid.shape, np.nan))
    was = hm.host_model(view)
    sa, sb = now.spans("stall", now.main_tid)
    wa, wb = was.spans("stall", was.main_tid)
    assert len(sa) == stalls and not covered(*others, sa, sb).any()
    assert len(wa) > stalls and covered(*others, wa, wb).max() > 300.0
    if case.endswith("host_stall"):
        assert (sb - sa).min() > 20_000.0 and set(sa) <= set(wa)
