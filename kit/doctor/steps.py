"""The steps stage of the doctor (per rank, right after parsing): which stretches of a rank's trace are its
training steps, and how long one step takes.

* :func:`steps_frame` -- one row per ``ProfilerStep#N`` annotation (the host's side of each step);
* :func:`inferred_steps` -- steps of a trace without those annotations, from the loop's own annotations;
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


def find_steps(cpu, cpu_all=None) -> "pd.DataFrame":
    """The rank's steps: its ``ProfilerStep`` annotations, else the steps inferred from its loop; ``cpu_all``
    (every CPU op of a CPU-only trace) is read when the default CPU frame gives neither."""
    st = steps_frame(cpu)
    if st.empty:
        st = inferred_steps(cpu)
    if cpu_all is not None and (st.empty or st.attrs.get(INFERRED)):
        st2 = steps_frame(cpu_all)
        st = st2 if not st2.empty else (st if not st.empty else inferred_steps(cpu_all))
    return st


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
    """Where the GPU work queued before the trace began ends: activities whose issuing call is not in a trace that
    records runtime calls (the steps before the profiler's window, still running when it opened), up to the first
    work a traced step issued. The first window starts there, as every later window starts where the previous one
    ended: the previous steps' work is the profiler's start-up, not the first step's."""
    import numpy as np

    if g.empty or g["call_ts"].isna().all():
        return None
    own = g["call_ts"].notna().to_numpy()
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


__all__ = ["INFERRED", "find_steps", "inferred_steps", "rank_windows", "step_time", "step_windows", "steps_frame",
           ]
