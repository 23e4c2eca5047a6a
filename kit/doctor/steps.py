"""The steps stage of the doctor (per rank, right after parsing): which stretches of a rank's trace are its
training steps, and how long one step takes.

* :func:`steps_frame` -- one row per ``ProfilerStep#N`` annotation (the host's side of each step);
* :func:`inferred_steps` -- steps of a trace without those annotations, from the loop's own annotations;
* :func:`steady` -- those steps less one-time work: a first step that is start-up (:data:`WARMUP_RATIO`, a
  start-up call, :data:`STARTUP_US`), the profiler's teardown at the end of the last one
  (:data:`TEARDOWN_RATIO`), and in a trace without steps the start-up before the traced work (the frame's
  ``attrs[LEFT_OUT]`` says what was left out, for the capture notes);
* :func:`step_windows` -- the step windows every per-step number divides by: each step extended to the end of
  the GPU work it issued, tiled without overlap (the accounting's and the host model's windows);
* :func:`step_time` -- the rank's step time, the denominator of every finding's severity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .calls import DATALOADER, STEP_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

    from .model import RankView

INFERRED = "inferred"
"""the ``attrs`` key of a steps frame whose steps were inferred (its value says from what)"""
LEFT_OUT = "left_out"
"""the ``attrs`` key of a steps frame from which one-time work was left out (its value: sentences saying what)"""
SPAN = "span"
"""the ``attrs`` key of a steps frame that is the traced span after start-up (a trace without steps), not steps"""
WARMUP_RATIO = 3.0
"""a first step longer than this many times the median of the others (3+ steps) is start-up, not a step: the
steady steps of the public and committed traces vary by at most 2x, a start-up step by more (evidence: FINDINGS.md,
"kit doctor's thresholds against the recorded runs")"""
STEP_SPREAD = 0.03
"""steps of one loop differ by up to this share of their median between identical runs (the kit's recorded runs
move by 1-3%: :data:`kit.doctor.model.SEVERITY_SHARE`); a first inferred step within it of the others' median is one
of them, not the profiler's warm-up (:func:`steady`)"""
STARTUP_US = 100_000.0
"""a CUDA runtime or driver call at least this long, other than a copy or a synchronisation (those wait for the
GPU), during which the GPU idles (:data:`STARTUP_IDLE`), is one-time start-up: creating the context, loading a
library's kernels (cuDNN, cuBLAS) or a module on first use. In a steady step a launch takes microseconds and an
allocator call at most milliseconds (evidence: FINDINGS.md, "kit doctor's thresholds against the recorded runs")"""
STARTUP_IDLE = 0.9
"""the share of a start-up call's time the GPU must be idle: a cudaFree that waits for a busy GPU is not start-up"""
TEARDOWN_RATIO = 1.5
"""a last ``ProfilerStep`` longer than this many times the median of the others (3+ steps) holds the profiler's
own stop (without a final ``prof.step()`` the last annotation runs until the profiler exits): it is cut at the
others' median, or at its last call that issued GPU work if later (evidence: FINDINGS.md, "kit doctor's thresholds
against the recorded runs")"""


def steps_frame(cpu) -> "pd.DataFrame":
    """One row per ``ProfilerStep#N`` CPU annotation: step, ts, end, dur (empty frame when none)."""
    import pandas as pd

    cols = ["step", "ts", "end", "dur"]
    if cpu is None or cpu.empty:
        return pd.DataFrame(columns=cols)
    s = cpu[(cpu["cat"] == "user_annotation") & cpu["name"].astype(str).str.startswith(STEP_PREFIX)]
    if s.empty:
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame({"step": s["name"].astype(str).str[len(STEP_PREFIX):].astype(int), "ts": s["ts"],
                        "end": s["end"], "dur": s["dur"]})
    return out.sort_values("ts", kind="stable").reset_index(drop=True)


def inferred_steps(cpu) -> "pd.DataFrame":
    """Steps of a trace without ``ProfilerStep`` annotations, from the loop's own annotations: each step starts
    where the host asks the DataLoader for a batch (``enumerate(DataLoader)...``) and runs to the next such
    request; the last one ends with its ``Optimizer.step``. Only for a loop that reads as one batch and one
    optimizer step per iteration (as many DataLoader requests as ``Optimizer.step`` annotations, 2+): gradient
    accumulation or a span cut mid-step stays one traced span. The frame's ``attrs[INFERRED]`` says so."""
    import numpy as np
    import pandas as pd

    cols = ["step", "ts", "end", "dur"]
    if cpu is None or cpu.empty:
        return pd.DataFrame(columns=cols)
    ann = cpu[cpu["cat"] == "user_annotation"]
    names = ann["name"].astype(str)
    main = ann[names.str.startswith(DATALOADER)]
    if len(main) < 2:
        return pd.DataFrame(columns=cols)
    main = main[main["tid"] == main["tid"].mode().iloc[0]]
    starts = np.sort(main["ts"].to_numpy(dtype=float))
    if len(starts) < 2:
        return pd.DataFrame(columns=cols)
    opt = ann[names.str.startswith("Optimizer.step#")]["end"].to_numpy(dtype=float)
    if len(opt) != len(starts):  # not one batch and one optimizer step per iteration (accumulation, a cut span)
        return pd.DataFrame(columns=cols)
    after = opt[opt > starts[-1]]
    last_end = float(after.min()) if after.size else starts[-1] + float(np.median(np.diff(starts)))
    ends = np.r_[starts[1:], last_end]
    out = pd.DataFrame({"step": np.arange(len(starts)), "ts": starts, "end": ends, "dur": ends - starts})
    out.attrs[INFERRED] = "the DataLoader requests"
    return out


def find_steps(cpu, cpu_all=None, gpu=None) -> "pd.DataFrame":
    """The rank's steady steps (:func:`steady`): its ``ProfilerStep`` annotations, else the steps inferred from its
    loop; ``cpu_all`` (every CPU op of a CPU-only trace) is read when the default CPU frame gives neither; ``gpu``:
    the trace's GPU activity (what tells start-up from a step)."""
    st = steps_frame(cpu)
    if st.empty:
        st = inferred_steps(cpu)
    if cpu_all is not None and (st.empty or st.attrs.get(INFERRED)):
        st2 = steps_frame(cpu_all)
        st = st2 if not st2.empty else (st if not st.empty else inferred_steps(cpu_all))
    return steady(st, cpu, gpu)


def startup_calls(cpu, gpu) -> "pd.DataFrame":
    """The one-time start-up calls of a trace (:data:`STARTUP_US`, :data:`STARTUP_IDLE`): name, ts, end, dur."""
    import pandas as pd

    from ..traces.intervals import covered, union_np
    from .calls import BLOCKING_COPY_CALLS, SYNC_CALLS, base_name

    if cpu is None or cpu.empty or gpu is None or gpu.empty:
        return pd.DataFrame(columns=["name", "ts", "end", "dur"])
    c = cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"]) & (cpu["dur"] >= STARTUP_US)]
    base = c["name"].astype(str).map(base_name)
    c = c[~base.isin(SYNC_CALLS | BLOCKING_COPY_CALLS) & ~base.str.contains("Memcpy")]
    if c.empty:
        return c[["name", "ts", "end", "dur"]]
    a, b = union_np(gpu["ts"], gpu["end"])
    busy = covered(a, b, c["ts"], c["end"])
    c = c[busy <= (1 - STARTUP_IDLE) * c["dur"].to_numpy(dtype=float)]
    return c[["name", "ts", "end", "dur"]].assign(name=lambda d: d["name"].astype(str))


def steady(st: "pd.DataFrame", cpu=None, gpu=None) -> "pd.DataFrame":
    """The steps less one-time work (what is left out is said in ``attrs[LEFT_OUT]``):

    * the first step when it is start-up: longer than :data:`WARMUP_RATIO` times the median of the others (3+
      steps), or holding a start-up call (:func:`startup_calls`; 2+ steps); of 3+ inferred steps, the first when it
      lies above the others' median by more than their spread and :data:`STEP_SPREAD` (the profiler's warm-up);
    * the end of the last ``ProfilerStep`` when it holds the profiler's stop (:data:`TEARDOWN_RATIO`): cut at the
      others' median, or at the end of its last call that issued GPU work if later (an inferred step ends at its
      ``Optimizer.step``: nothing to cut);
    * without steps: the traced span after the last start-up call is the one step (``attrs[SPAN]``), when GPU work
      follows that call -- the first iterations of a process that loads its libraries are not its steps."""
    import numpy as np
    import pandas as pd

    attrs = dict(st.attrs)
    said: list[str] = []
    boot = startup_calls(cpu, gpu)
    if st.empty:
        if boot.empty or gpu is None or gpu.empty:
            return st
        start = float(boot["end"].max())
        if not (gpu["ts"] >= start).any():
            return st
        end = float(gpu["end"].max())
        out = pd.DataFrame({"step": [-1], "ts": [start], "end": [end], "dur": [end - start]})
        out.attrs.update(attrs)
        out.attrs[SPAN] = True
        out.attrs[LEFT_OUT] = (f"one-time start-up left out: the traced span before the end of the last start-up call "
                               f"({_calls_text(boot)}), {(start - float(gpu['ts'].min())) / 1e6:.2f} s after the "
                               f"first GPU work; the rest, to the last GPU work ({(end - start) / 1e3:.2f} ms), is diagnosed as one step")
        return out
    st = st.sort_values("ts", kind="stable").reset_index(drop=True)
    dur = st["dur"].to_numpy(dtype=float)
    if len(st) >= 2:
        rest = float(np.median(dur[1:]))
        first = boot[(boot["ts"] >= st["ts"].iloc[0]) & (boot["ts"] < st["end"].iloc[0])]
        if (len(st) >= 3 and dur[0] > WARMUP_RATIO * rest) or len(first):
            why = f"start-up calls: {_calls_text(first)}" if len(first) else "start-up"
            said.append(f"step {int(st['step'].iloc[0])} left out as one-time start-up ({dur[0] / 1e3:.1f} ms against "
                        f"a median of {rest / 1e3:.1f} ms for the others; {why})")
            st = st.iloc[1:].reset_index(drop=True)
            dur = dur[1:]
        elif attrs.get(INFERRED) and len(st) >= 3 and dur[0] - rest > max(
                float(np.abs(dur[1:] - rest).max()), STEP_SPREAD * rest):
            # steps inferred: the profiler never stepped, so it had no schedule and no warm-up -- its first step
            # is the profiler's warm-up, the one torch.profiler.schedule(warmup=...) discards ("skewed by an
            # extra overhead": the first CUDA calls after CUPTI starts, e.g. the first pin_memory's is_pinned).
            # It is told from a step of the loop by its margin above the others' median: more than any other step
            # lies from that median, and more than steps of one loop differ between runs (STEP_SPREAD) -- a first
            # step inside the others' spread is one of them, whichever side of the median noise puts it
            said.append(f"step {int(st['step'].iloc[0])} left out as the profiler's warm-up ({dur[0] / 1e3:.1f} ms "
                        f"against a median of {rest / 1e3:.1f} ms for the others: traced without a schedule, the "
                        f"first step carries the profiler's own start-up)")
            st = st.iloc[1:].reset_index(drop=True)
            dur = dur[1:]
    if len(st) >= 3 and not attrs.get(INFERRED) and dur[-1] > TEARDOWN_RATIO * float(np.median(dur[:-1])):
        ts, end = float(st["ts"].iloc[-1]), float(st["end"].iloc[-1])
        cut = ts + float(np.median(dur[:-1]))
        if cpu is not None and not cpu.empty and gpu is not None and not gpu.empty:
            calls = cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"]) & (cpu["ts"] >= ts) & (cpu["ts"] < end)
                        & cpu["correlation"].isin(set(gpu["correlation"].dropna()))]
            if len(calls):
                cut = max(cut, float(calls["end"].max()))
        if cut < end:
            said.append(f"the last {(end - cut) / 1e3:.1f} ms of step {int(st['step'].iloc[-1])} left out: after its "
                        f"last call that issued GPU work and beyond the others' median step, the profiler's own stop")
            st = st.copy()
            st.loc[st.index[-1], ["end", "dur"]] = [cut, cut - ts]
    st.attrs.update(attrs)
    if said:
        st.attrs[LEFT_OUT] = "; ".join(said)
    return st


def _calls_text(calls: "pd.DataFrame", n: int = 3) -> str:
    top = calls.sort_values("dur", ascending=False).head(n)
    more = f" and {len(calls) - n} more" if len(calls) > n else ""
    return ", ".join(f"{name} {d / 1e6:.2f} s" for name, d in zip(top["name"], top["dur"])) + more


def step_windows(steps: "pd.DataFrame", gpu_ends: "tuple[np.ndarray, np.ndarray] | None",
                 carried_end: float | None = None) -> "pd.DataFrame":
    """The step windows: step, start, end. A window starts at its annotation's start or at the previous window's
    end, whichever is later, and ends at its annotation's end or at the end of the last GPU work the step issued
    (``gpu_ends``: the issuing call's ts and the activity's end), whichever is later -- so the windows tile the
    traced steps without overlap (as in torch-tb-profiler's step-time breakdown). Without steps: one row of NaN
    bounds (the caller takes the traced span)."""
    import numpy as np
    import pandas as pd

    st = steps.sort_values("ts", kind="stable")
    if st.empty:
        return pd.DataFrame({"step": [-1], "start": [np.nan], "end": [np.nan]})
    ts, end = st["ts"].to_numpy(dtype=float), st["end"].to_numpy(dtype=float)
    last = end.copy()
    if gpu_ends is not None and len(gpu_ends[0]):
        call_ts, g_end = gpu_ends
        k = np.searchsorted(ts, call_ts, side="right") - 1
        inside = (k >= 0) & (call_ts < end[np.clip(k, 0, None)])
        np.maximum.at(last, k[inside], g_end[inside])
    lo, hi = np.empty_like(ts), np.empty_like(ts)
    prev = -np.inf if carried_end is None or np.isnan(carried_end) else float(carried_end)
    for i in range(len(ts)):
        lo[i] = max(ts[i], prev)
        hi[i] = max(last[i], lo[i])
        prev = hi[i]
    return pd.DataFrame({"step": st["step"].to_numpy(), "start": lo, "end": hi})


def rank_windows(view: "RankView") -> "pd.DataFrame":
    """The rank's step windows (:func:`step_windows`) with the GPU work it issued; without step annotations the
    traced span of its GPU work (a CPU-only trace: of its main thread's ops, :mod:`kit.doctor.host_model`) is
    one window, step -1. Computed once per rank."""
    return view.shared("windows", _rank_windows)


def _rank_windows(view: "RankView") -> "pd.DataFrame":
    import pandas as pd

    g = view.issued()
    g = g[g["end"] > g["ts"]]
    win = step_windows(view.steps, (g["call_ts"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float))
                       if len(g) else None, carried_end(view, g))
    if win["start"].isna().all() and len(g):
        win = pd.DataFrame({"step": [-1], "start": [float(g["ts"].min())], "end": [float(g["end"].max())]})
    return win


def carried_end(view: "RankView", g: "pd.DataFrame") -> float | None:
    """Where the GPU work queued before the first step ends: activities whose issuing call is not in a trace that
    records runtime calls (the steps before the profiler's window, still running when it opened), or precedes the
    first step (one-time work :func:`steady` left out), up to the first work a step issued. The first window starts
    there, as every later window starts where the previous one ended: the previous steps' work is the profiler's
    start-up, not the first step's."""
    import numpy as np

    if g.empty or g["call_ts"].isna().all():
        return None
    call = g["call_ts"].to_numpy(dtype=float)
    first_step = float(view.steps["ts"].min()) if not view.steps.empty else np.nan
    own = ~np.isnan(call) & ~(call < first_step)
    if not own.any():
        return None
    first = float(g.loc[own, "ts"].min())
    before = g[~own & (g["ts"].to_numpy(dtype=float) < first)]
    return float(before["end"].max()) if len(before) else None


def step_time(view: "RankView") -> float | None:
    """The rank's step time (us): the denominator of every finding's severity.

    A ``ProfilerStep`` window is the host's side of a step only. Eagerly the host runs at most a step or two
    ahead of the GPU, so in steady state the host's step period is the GPU's; but a step replayed from a CUDA
    graph is one ``cudaGraphLaunch`` on the host (a millisecond) for tens of milliseconds of GPU work, and the
    host can be several replays ahead. So: with two or more steps, the larger of the median period between step
    starts (host) and between the ends of each step's GPU work (the work its host calls issued); with one step,
    the larger of its window and the GPU time its work kept the GPU busy; without step annotations, the traced
    GPU span (the whole trace is one step)."""
    import numpy as np

    st, gpu = view.steps, view.trace.gpu
    if st.empty:
        return float(gpu["end"].max() - gpu["ts"].min()) if not gpu.empty else None
    st = st.sort_values("ts")
    g = view.issued()
    g = g[g["in_step"] & g["call_ts"].notna()]
    step_of = np.searchsorted(st["ts"].to_numpy(dtype=float), g["call_ts"].to_numpy(dtype=float), side="right") - 1
    if len(st) >= 2:
        host = float(np.median(np.diff(st["ts"].to_numpy(dtype=float))))
        ends = g.groupby(step_of)["end"].max().sort_index().to_numpy(dtype=float)
        return max(host, float(np.median(np.diff(ends))) if len(ends) >= 2 else 0.0)
    from ..traces.intervals import union_np

    a, b = union_np(g["ts"], g["end"])
    return max(float(st["dur"].iloc[0]), float((b - a).sum()))


__all__ = ["INFERRED", "LEFT_OUT", "SPAN", "find_steps", "startup_calls", "steady", "inferred_steps", "rank_windows", "step_time", "step_windows", "steps_frame",
           ]
