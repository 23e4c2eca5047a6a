"""How each rank got to each collective, for ``late_rank``: the rank's host time until each collective, split by
the host model (:mod:`kit.doctor.host_model`: the same host activity the step accounting reads) into waiting for
data, synchronising calls and stalls (:func:`host_time_until`), how one arrival splits into host and GPU parts
(:func:`arrival_parts`), and why the late rank arrived last, per reason, over the instances it was last at
(:func:`attribute`)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from ...traces.intervals import covered
from ..collectives import Timeline
from ..model import RankView

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

HOST_REASONS = {"data_wait": "data_wait", "host_sync": "sync", "host_stall": "stall"}
"""the host activities :func:`host_time_until` counts, from the host model's kinds (the rest of the host time is
``host_busy``)"""


def host_time_until(view: RankView, tl: Timeline) -> "pd.DataFrame":
    """Per collective row, how much host time the rank had spent, from the trace's start until the row's launch,
    until its end and until the start of its step (``step_ts``), in

    * ``data_wait`` -- the host model's ``data_wait`` (the host waiting for the next batch, any thread);
    * ``host_sync`` -- its ``sync`` (synchronising calls and blocking copies, any thread);
    * ``host_stall`` -- its ``stall`` (stretches of >= 1 ms in which the issuing threads issued nothing, outside
      every recorded op: ``time.sleep``, Python work, a blocked GIL) -- the accounting's ``host_stall``.

    Differences between two moments give the activity in between (:func:`arrival_parts`)."""
    import numpy as np
    import pandas as pd

    rows = tl.rows
    moments = ("launch", "end", "step")
    cols = ["step_ts"] + [f"{c}@{w}" for c in HOST_REASONS for w in moments]
    if rows.empty:
        return pd.DataFrame(columns=cols, index=rows.index, dtype=float)
    host = view.host
    empty = (np.empty(0), np.empty(0))
    iv = {c: host.spans(k) if host is not None else empty for c, k in HOST_REASONS.items()}
    step_ts = rows["step"].map(dict(zip(view.steps["step"], view.steps["ts"]))).to_numpy(dtype=float)
    out = {"step_ts": step_ts}
    for w, t in (("launch", rows["launch_us"].to_numpy(dtype=float)), ("end", rows["end_us"].to_numpy(dtype=float)),
                 ("step", np.nan_to_num(step_ts, nan=-np.inf))):
        lo = np.full(t.shape, -np.inf)
        for c, v in iv.items():
            out[f"{c}@{w}"] = covered(*v, lo, t)
    return pd.DataFrame(out, index=rows.index)[cols]


REASONS = ("data_wait", "host_sync", "host_stall", "host_busy", "gpu_busy")
"""what a late rank may have been doing: the :data:`HOST_REASONS` activities, issuing work (``host_busy``), its GPU still
busy with earlier work (``gpu_busy``)"""


def arrival_parts(row: dict, origin: dict) -> dict:
    """How a rank got from ``origin`` (the end of an earlier collective every rank ran: the same moment on all
    ranks) to the start of ``row``'s kernel: host time until the launch split into :data:`HOST_REASONS` and
    ``host_busy`` (the rest: issuing work), then ``gpu_busy`` (launched, but the GPU was still busy with earlier
    work). The parts add up to ``row.start - origin.end``, so their difference between two ranks adds up to how
    much later one arrived. Values may be numpy arrays (one entry per instance)."""
    import numpy as np

    o_end, launch, start = origin["end_us"], row["launch_us"], row["start_us"]
    host_end = np.maximum(launch, o_end)
    after = launch > o_end
    parts = {c: np.where(after, np.clip(row[f"{c}@launch"] - origin[f"{c}@end"], 0, None), 0.0) for c in HOST_REASONS}
    parts["host_busy"] = np.clip(host_end - o_end - sum(parts.values()), 0, None)
    parts["gpu_busy"] = np.clip(start - host_end, 0, None)
    return parts


def attribute(df: "pd.DataFrame", inst: "pd.DataFrame", late: int) -> tuple[dict[str, float], int]:
    """Why ``late`` arrived last, per reason (us, summed over the collectives it was last at).

    Lateness carries over within a step: a rank that started a step late arrives late at every collective of that
    step, and between two of them it is the one still computing -- that compute is the consequence, not the cause.
    So each instance contributes only the lateness it *adds* (its lateness minus this rank's lateness at the previous
    instance of the same step; a step begins afresh, its ranks resynchronised by the previous step's end, where the
    optimizer waits for the gradients' collectives: a rank late by the same amount at every step adds it at every
    step), explained by how each rank got from that previous instance's end (the same moment on every rank)
    to this one (:func:`arrival_parts`): the late rank's parts minus the other ranks' median parts. The first
    instance of a trace is counted from each rank's start of its step instead. Returns the excess per reason and
    how many instances added lateness that could be explained."""
    import numpy as np

    cols = ["launch_us", "start_us", "end_us", "step_ts", "step"] + [f"{c}@{w}" for c in HOST_REASONS
                                                              for w in ("launch", "end", "step")]
    wide = df.set_index(["match_key", "instance", "rank"])[cols].unstack("rank")
    inst = inst.set_index(["match_key", "instance"]).reindex(wide.index)
    t = wide[("end_us", late)].to_numpy(dtype=float)  # order on the late rank's own clock
    keep = ~np.isnan(t)
    wide, inst = wide[keep], inst[keep]
    order = np.argsort(t[keep], kind="stable")
    wide, inst = wide.iloc[order], inst.iloc[order]
    late_by = inst["late_by_us"].to_numpy(dtype=float)
    mine = inst["rank"].to_numpy() == late
    step = wide[("step", late)].to_numpy(dtype=float)
    same_step = np.r_[True, ~(step[1:] != step[:-1])]  # NaN (no steps in the trace): one step
    prev_late = np.where(same_step, np.r_[0.0, np.where(mine, late_by, 0.0)[:-1]], 0.0)
    added = np.where(mine, np.clip(late_by - prev_late, 0, None), 0.0)
    total = {c: 0.0 for c in REASONS}
    k = np.flatnonzero(added > 0)
    if k.size == 0:
        return total, 0
    ranks = list(wide["end_us"].columns)

    def row(i, r):
        return {c: wide[(c, r)].to_numpy(dtype=float)[i] for c in cols}

    def origin(i, r):  # the previous instance's end, or (for the first) the rank's step start
        prev, here = row(np.clip(i - 1, 0, None), r), row(i, r)
        first = i == 0
        o = {"end_us": np.where(first, here["step_ts"], prev["end_us"])}
        o.update({f"{c}@end": np.where(first, here[f"{c}@step"], prev[f"{c}@end"]) for c in HOST_REASONS})
        return o

    parts = {r: arrival_parts(row(k, r), origin(k, r)) for r in ranks}
    with warnings.catch_warnings():  # an instance some rank did not see: NaN, left out
        warnings.simplefilter("ignore", RuntimeWarning)
        ex = {c: parts[late][c] - np.nanmedian(np.vstack([parts[r][c] for r in ranks if r != late]), axis=0)
              for c in REASONS}
    pos = np.nansum(np.vstack([np.clip(ex[c], 0, None) for c in REASONS]), axis=0)
    ok = pos > 0
    # each instance's added lateness is explained only as far as the rank's own excess over its peers reaches:
    # a 56 us excess does not explain 9 ms of lateness (the rest stays unexplained, not shared out)
    expl = np.minimum(pos, added[k])
    for c in REASONS:
        total[c] = float(np.nansum(expl[ok] * np.clip(ex[c][ok], 0, None) / pos[ok]))
    total["_added"] = float(np.nansum(added[k]))
    return total, int(ok.sum())

