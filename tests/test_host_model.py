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
