"""What the blocking host calls of one rank cost the GPU (:func:`sync_costs`): ``host_sync``'s own estimate (its
evidence; the finding's cost is the step accounting's ``sync`` slice), and the catch-up kernels ``launch_bound`` does
not count again."""

from __future__ import annotations

from dataclasses import dataclass

from ...traces.intervals import covered
from ..accounting import waiting_calls
from ..model import RankView
from .host import EXCERPT_PAD_US, host_timeline


@dataclass(frozen=True)
class SyncCosts:
    """What the blocking calls of one rank cost (:func:`sync_costs`)."""

    cost_us: float
    catch_up: frozenset
    """labels (in ``HostTimeline.kernels``) of the starved kernels counted as a call's catch-up"""
    window: tuple[float, float] | None = None
    """the costliest call: the end of its wait, the bubble and the catch-up that follows"""


def sync_costs(view: RankView) -> SyncCosts:
    """The GPU time the blocking calls cost: the lead of queued work each destroyed.

    Before the call the host was ahead of the GPU; while it waits the GPU drains its queue. When it returns
    nothing is queued: the GPU idles until the host issues the next work (the *bubble*, from the later of the
    call's start and the GPU's last work to the next GPU work), and then runs each kernel as soon as it is
    launched until the host is ahead again -- the run of starved kernels that follows (the *catch-up*). A call
    that is the last thing its step issues (``loss.item()`` at the end of the step) is followed by the next step,
    which a trace of one step does not hold: its catch-up is then the starved run that opens its own step, the
    previous step having ended the same way (steady state). A call counts when the GPU was still busy as it was
    made (else it waited for nothing); its cost is bubble + catch-up but at most the time it blocked (without
    the call the host would have been that much further ahead, no more), less any wait of the call's thread for a
    DataLoader's worker processes in the bubble (the batch arrives when the workers have it: a host that got there
    earlier would only have waited longer, and lost its lead all the same; an in-process DataLoader loads when asked
    and would have loaded earlier: :func:`kit.doctor.accounting.waiting_calls`). Successive calls followed by the
    same kernels (``.item()``: a copy, then a stream synchronize) count once."""
    return view.shared("sync_costs", _sync_costs)


def _sync_costs(view: RankView) -> SyncCosts:
    import numpy as np

    h = host_timeline(view)
    b, n = h.blocking, len(h.starts)
    if b.empty or not n:
        return SyncCosts(0.0, frozenset(), None)
    k = h.kernels[h.kernels["in_step"]].sort_values("ts", kind="stable")
    kts, kgap, kstarved = (k[c].to_numpy(dtype=float) for c in ("ts", "gap_us", "starved"))
    kcall = k["call_ts"].to_numpy(dtype=float)
    labels = k.index.to_numpy()

    fed = np.flatnonzero(kstarved == 0)  # positions of the kernels the host had issued in time
    workers = {t: waiting_calls(view.host, t)["input"] for t in b["tid"].unique()}  # each thread's waits for
    # a DataLoader's worker processes

    def run_from(j: int) -> "np.ndarray":  # positions j, j+1, ... while starved
        i = int(np.searchsorted(fed, j))
        return np.arange(j, int(fed[i]) if i < len(fed) else len(k))

    step_start = view.steps["ts"].to_numpy(dtype=float) if len(view.steps) else np.array([-np.inf])
    best: dict[int, tuple[float, "np.ndarray"]] = {}
    for call, ret, dur, tid in b[["ts", "end", "dur", "tid"]].itertuples(index=False):
        i = int(np.searchsorted(h.starts, call, side="right"))
        busy_call = h.busy_until[i - 1] if i > 0 else -np.inf
        i = int(np.searchsorted(h.starts, ret, side="right"))
        busy_ret = h.busy_until[i - 1] if i > 0 else -np.inf
        if busy_call <= call or busy_ret > ret:
            continue  # the GPU was idle when it was called, or still busy when it returned: it drained nothing
        a = max(busy_ret, call)
        nxt = h.starts[i] if i < n else np.nan
        bubble = waited = 0.0
        if nxt == nxt and nxt > a:
            bubble, waited = nxt - a, float(covered(*workers[tid], [a], [nxt])[0])
        step = int(np.searchsorted(step_start, call, side="right"))
        in_step = np.searchsorted(step_start, kcall, side="right") == step  # kernels issued in the call's step
        j = int(np.searchsorted(kts, ret))
        run = run_from(j) if j < len(k) else np.arange(0)
        run = run[in_step[run]] if len(run) else run
        key = j
        if j >= len(k) or not in_step[j:].any() or (len(run) and not in_step[run[-1] + 1:].any()):
            # a step-end call: nothing after it in its step but its catch-up, cut off by the step's end; the
            # catch-up goes on in the next step -- in steady state the starved run that opens this one
            first = int(np.argmax(in_step)) if in_step.any() else len(k)
            run = np.concatenate([run, run_from(first)]) if first < len(k) else run
        catch_up = float(kgap[run[1:] if len(run) and run[0] == j else run].sum())  # j's own gap is the bubble
        cost = max(0.0, min(dur, bubble + catch_up) - waited)
        if key not in best or cost > best[key][0]:
            after = [kts[r] + k["dur"].to_numpy()[r] for r in run[-1:] if r > j] or [nxt if nxt == nxt else ret]
            best[key] = (cost, run, (ret - min(dur, 2 * EXCERPT_PAD_US) - EXCERPT_PAD_US,
                                     float(after[0]) + EXCERPT_PAD_US))
    top = max(best.values(), key=lambda x: x[0]) if best else None
    return SyncCosts(float(sum(x[0] for x in best.values())),
                     frozenset(labels[np.concatenate([x[1] for x in best.values()])]) if best else frozenset(),
                     top[2] if top and top[0] > 0 else None)
