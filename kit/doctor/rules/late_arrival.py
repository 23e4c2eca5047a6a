"""How each rank got to each collective, for ``late_rank``: the rank's host time until each collective, split by
the host model (:mod:`kit.doctor.host_model`: the same host activity the step accounting reads) into waiting for
data, synchronising calls and stalls (:func:`host_time_until`), how one arrival splits into host and GPU parts
(:func:`arrival_parts`), and why the late rank arrived last, per reason, over the instances it was last at
(:func:`attribute`; a host catching up a lag behind its peers', :func:`lag_shares`)."""

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
SINGLE_STALL = "host_stall_single"
"""the part of ``host_stall`` that is one stall of the rank's own code: the host model's
:data:`kit.doctor.host_model.ONE_STALL` (each step's longest stall stretch and the backward hooks' stall spans, however
many pieces) -- the split the step accounting's ``host_stall`` slice reads too where the rank's core is shown lost
(:func:`kit.doctor.contended.lost_cores`; elsewhere that slice keeps every stretch). A core the scheduler shares with
another process is taken in slices of milliseconds, many to a step, between ops as well as inside them: its issuing
done more slowly, not a stall (:func:`lag_shares`)"""


def host_time_until(view: RankView, tl: Timeline) -> "pd.DataFrame":
    """Per collective row, how much host time the rank had spent, from the trace's start until the row's launch,
    until its end and until the start of its step (``step_ts``), in

    * ``data_wait`` -- the host model's ``data_wait`` (the host waiting for the next batch, any thread);
    * ``host_sync`` -- its ``sync`` (synchronising calls and blocking copies, any thread);
    * ``host_stall`` -- its ``stall`` (stretches of >= 1 ms in which the issuing threads issued nothing, outside
      every recorded op: ``time.sleep``, Python work, a blocked GIL, a core taken away), all of it;
    * ``host_stall_single`` -- the part of it that is one stall of the rank's own code (:data:`SINGLE_STALL`: each
      step's longest stall stretch, the hooks').

    Differences between two moments give the activity in between (:func:`arrival_parts`)."""
    import numpy as np
    import pandas as pd

    rows = tl.rows
    moments = ("launch", "end", "step")
    cols = ["step_ts"] + [f"{c}@{w}" for c in (*HOST_REASONS, SINGLE_STALL) for w in moments]
    if rows.empty:
        return pd.DataFrame(columns=cols, index=rows.index, dtype=float)
    host = view.host
    empty = (np.empty(0), np.empty(0))
    iv = {c: host.spans(k) if host is not None else empty for c, k in HOST_REASONS.items()}
    iv[SINGLE_STALL] = host.one_stall() if host is not None else empty
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
LAG_PARTS = ("host_stall", "host_busy")
"""what a late rank's host did while it caught up a lag of its host behind its peers' (:func:`lag_shares`)"""


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
    to this one (:func:`arrival_parts`): the late rank's parts minus the other ranks' median parts -- where it was
    catching up a lag of its host behind theirs, its stall and issuing parts split as the lag was built
    (:func:`lag_shares`). The first instance of a trace is counted from each rank's start of its step instead.
    ``inst`` holds each instance's lateness floor (``floor_us``). Returns the excess per reason and how many
    instances added lateness that could be explained."""
    import numpy as np

    cols = ["launch_us", "start_us", "end_us", "step_ts", "step"] + [f"{c}@{w}" for c in HOST_REASONS
                                                              for w in ("launch", "end", "step")]
    cols += [c for c in (f"{SINGLE_STALL}@launch",) if c in df.columns]  # (lag_shares)
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
    peers = [r for r in ranks if r != late]
    with warnings.catch_warnings():  # an instance some rank did not see: NaN, left out
        warnings.simplefilter("ignore", RuntimeWarning)
        ex = {c: parts[late][c] - np.nanmedian(np.vstack([parts[r][c] for r in peers]), axis=0)
              for c in REASONS}
        # catching up a lag: its host's time since the origin is a stall's or slower issuing as the lag was built
        share = lag_shares(wide, late, peers, k, inst["floor_us"].to_numpy(dtype=float)[k])
        behind = sum(np.clip(ex[c], 0, None) for c in LAG_PARTS)
        for c in LAG_PARTS:
            ex[c] = np.where(np.isnan(share[c]), ex[c], behind * share[c])
    pos = np.nansum(np.vstack([np.clip(ex[c], 0, None) for c in REASONS]), axis=0)
    ok = pos > 0
    # each instance's added lateness is explained only as far as the rank's own excess over its peers reaches:
    # a 56 us excess does not explain 9 ms of lateness (the rest stays unexplained, not shared out)
    expl = np.minimum(pos, added[k])
    for c in REASONS:
        total[c] = float(np.nansum(expl[ok] * np.clip(ex[c][ok], 0, None) / pos[ok]))
    total["_added"] = float(np.nansum(added[k]))
    return total, int(ok.sum())


def lag_shares(wide: "pd.DataFrame", late: int, peers: list, k: "np.ndarray", floor: "np.ndarray") -> dict:
    """At the instances ``k`` (positions in ``wide``: :func:`attribute`'s rows, in order) at which rank ``late`` is
    catching up a lag of its host behind its peers', how its host time since the origin splits into a stall's
    (``host_stall``) and slower issuing (``host_busy``): their shares (:data:`LAG_PARTS`); NaN at the other instances.

    Catching up: its host launched the collective after the previous one ended, the peers' hosts (their median)
    before it, and its GPU started the collective within the instance's lateness floor (``floor``) of its launch -- it
    waited for its host, not its host for it. There the peers' host parts (:func:`arrival_parts`) are empty (their
    hosts issued this stretch's work before the origin) while the late rank's hold all its issuing since: a host that
    issues as fast as its peers' but behind them -- since a stall of its own -- shows every later stretch it issues as
    excess ``host_busy``, and a host-bound job's stretches, each issued more slowly than its GPU runs it, lengthen and
    shorten its lateness collective by collective. What its host time there is, a stall's or slower issuing, is what
    put it behind: each rank's host time between its launches of the first and the last instance of the run at which
    the late rank's host was behind the peers' (:func:`host_lag` > 0; from the last instance before the run at which
    it was level or ahead, else the trace's first), in a stall and the rest, the late rank's less the peers' median --
    a stall leaves its length there, a host that issues the same work more slowly its slower issuing. A stall there
    is one stretch: each step's longest (:data:`SINGLE_STALL`, where ``wide`` has it); a contended core's other
    slices with no event between its launches are the same work issued more slowly, and count as issuing. A wait for
    data or a synchronising call after the origin is an event at the instance itself and keeps its own part."""
    import numpy as np

    out = {c: np.full(k.shape, np.nan) for c in LAG_PARTS}
    if not len(k):
        return out
    ranks = [late, *peers]
    launch = {r: wide[("launch_us", r)].to_numpy(dtype=float) for r in ranks}
    end = {r: wide[("end_us", r)].to_numpy(dtype=float) for r in ranks}
    start = wide[("start_us", late)].to_numpy(dtype=float)[k]
    prev = np.clip(k - 1, 0, None)
    ahead = np.nanmedian(np.vstack([launch[r][k] - end[r][prev] for r in peers]), axis=0) <= 0
    behind = launch[late][k] > end[late][prev]
    starved = start - np.maximum(launch[late][k], end[late][prev]) < floor  # its GPU waited for the launch
    catch = (k > 0) & behind & ahead & starved
    if not catch.any():
        return out
    lag = host_lag(wide, late, peers)
    n = len(lag)
    level = lag <= 0  # NaN (an instance some rank did not see): not level
    since = np.maximum.accumulate(np.where(level, np.arange(n), 0))[prev]  # the run's start: the last level one before
    until = np.minimum.accumulate(np.where(level, np.arange(n), n)[::-1])[::-1][k] - 1  # its last instance behind
    spent = {}
    single = (f"{SINGLE_STALL}@launch", late) in wide.columns

    def diff(col, r):
        x = wide[(f"{col}@launch", r)].to_numpy(dtype=float)
        return x[until] - x[since]

    for r in ranks:
        d = {c: diff(c, r) for c in HOST_REASONS}
        d["host_busy"] = launch[r][until] - launch[r][since] - sum(d.values())
        if single:  # a stall is one stretch a step; the other slices with no event are issuing, slowed
            one = diff(SINGLE_STALL, r)
            d["host_busy"] = d["host_busy"] + d["host_stall"] - one
            d["host_stall"] = one
        spent[r] = d
    pos = {c: np.clip(spent[late][c] - np.nanmedian(np.vstack([spent[r][c] for r in peers]), axis=0), 0, None)
           for c in LAG_PARTS}
    total = sum(pos.values())
    ok = catch & (total > 0)
    for c in LAG_PARTS:
        out[c][ok] = pos[c][ok] / total[ok]
    return out


def host_lag(wide: "pd.DataFrame", late: int, peers: list) -> "np.ndarray":
    """Per instance (``wide``: :func:`attribute`'s rows, in order), how much later rank ``late``'s host launched the
    collective than the median of the ``peers``' hosts, each launch read against the instance's end on the rank's
    own clock (the same moment on every rank: no clock alignment). Positive: its host is behind theirs."""
    import numpy as np

    rel = {r: wide[("launch_us", r)].to_numpy(dtype=float) - wide[("end_us", r)].to_numpy(dtype=float)
           for r in [late, *peers]}
    return rel[late] - np.nanmedian(np.vstack([rel[r] for r in peers]), axis=0)
