"""How much of the communication the compute hid, from a trace's GPU frame -- the one overlap every
investigation uses (collective_tracing, dataloader_sync).

Per device: ``comm_us`` is the union of the NCCL kernel intervals (kernels on several streams at once count
once), ``overlapped_us`` the part of that union during which any other kernel ran, ``exposed_us`` the rest (the
communication time a faster network would save), ``overlap_share = overlapped / comm`` and ``compute_us`` the
union of the other kernels. memcpy/memset are neither. A NCCL kernel that spins waiting for a late peer counts
as communication time for its whole duration: it holds SMs and the step waits for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

Intervals = list[tuple[float, float]]
OVERLAP_COLUMNS = ["device", "comm_us", "overlapped_us", "exposed_us", "overlap_share", "compute_us"]


def union(iv: Intervals) -> Intervals:
    """Sorted, disjoint intervals covering the same time as ``iv``."""
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(iv: Intervals) -> float:
    return sum(b - a for a, b in iv)


def intersect(x: Intervals, y: Intervals) -> Intervals:
    """The intersection of two sorted, disjoint interval lists."""
    i = j = 0
    out = []
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap(events: "pd.DataFrame") -> "pd.DataFrame":
    """One row per device of ``events`` (a trace's ``gpu`` frame, or any frame with cat, device, nccl, ts,
    end): see the module docstring. Empty in (or no kernels), empty out with :data:`OVERLAP_COLUMNS`."""
    import pandas as pd

    need = {"cat", "device", "nccl", "ts", "end"}
    if events is None or events.empty or not need <= set(events.columns):
        return pd.DataFrame(columns=OVERLAP_COLUMNS)
    rows = []
    k = events[events["cat"] == "kernel"]
    for dev, d in k.groupby("device"):
        nccl = d["nccl"].astype(bool)
        comm = union(list(zip(d[nccl]["ts"], d[nccl]["end"])))
        comp = union(list(zip(d[~nccl]["ts"], d[~nccl]["end"])))
        c, o = length(comm), length(intersect(comm, comp))
        rows.append({"device": dev, "comm_us": c, "overlapped_us": o, "exposed_us": c - o,
                     "overlap_share": o / c if c else float("nan"), "compute_us": length(comp)})
    return pd.DataFrame(rows, columns=OVERLAP_COLUMNS)
