"""Interval arithmetic on numpy arrays: the one place the doctor and the analyses cut time into pieces.

A *set* of time is two sorted float arrays ``(a, b)`` of disjoint intervals ``[a_i, b_i)``. :func:`union_np`
makes one from any intervals; :func:`covered` measures how much of each query interval a set covers;
:func:`cover` says, for the start of each elementary segment of a partition, whether a set covers it -- the
building block of an exact accounting: cut the time at every endpoint of every set (:func:`partition`), then
each elementary segment is wholly inside or wholly outside each set, and classifying segments by a precedence
of sets splits the time exactly (the pieces sum to the whole).

Vectorised (``searchsorted`` over the sorted starts) rather than the list-based :mod:`kit.traces.overlap`,
because the doctor cuts a rank's whole trace (10^5-10^6 intervals) at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np


def union_np(a, b, gap: float | None = None) -> "tuple[np.ndarray, np.ndarray]":
    """Sorted disjoint intervals covering ``[a_i, b_i]`` (intervals of zero or negative length are dropped); with
    ``gap``: zero-length ones kept, those less than ``gap`` apart merged (:attr:`kit.traces.Trace.short_spans`)."""
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = ((b > a) if gap is None else (b >= a)) & ~np.isnan(a) & ~np.isnan(b)
    a, b = a[ok], b[ok]
    if a.size == 0:
        return a, b
    o = np.argsort(a, kind="stable")
    a, b = a[o], b[o]
    run_end = np.maximum.accumulate(b)
    new = np.r_[True, a[1:] > run_end[:-1] if gap is None else a[1:] - run_end[:-1] >= gap]
    idx = np.flatnonzero(new)
    ends = np.r_[idx[1:] - 1, a.size - 1]
    return a[idx], run_end[ends]


def covered(ua, ub, qa, qb) -> "np.ndarray":
    """For each query ``[qa_i, qb_i]``: how much of it the sorted disjoint intervals ``ua, ub`` cover."""
    import numpy as np

    qa, qb = np.asarray(qa, dtype=float), np.asarray(qb, dtype=float)
    if len(ua) == 0 or qa.size == 0:
        return np.zeros(qa.shape)
    cum = np.r_[0.0, np.cumsum(ub - ua)]

    def upto(x):
        i = np.searchsorted(ua, x, side="right") - 1
        ok = i >= 0
        j = np.clip(i, 0, None)
        part = np.clip(x - ua[j], 0.0, (ub - ua)[j])
        return np.where(ok, cum[j] + part, 0.0)

    return np.clip(upto(qb) - upto(qa), 0.0, None)


def partition(sets: Iterable[tuple["np.ndarray", "np.ndarray"]], extra=()) -> "np.ndarray":
    """The sorted unique endpoints of every set (and the ``extra`` points): consecutive points bound the
    elementary segments, each wholly inside or outside every set."""
    import numpy as np

    parts = [np.asarray(x, dtype=float) for s in sets for x in s] + [np.asarray(extra, dtype=float).ravel()]
    pts = np.concatenate(parts) if parts else np.empty(0)
    return np.unique(pts[~np.isnan(pts)])


def cover(a: "np.ndarray", b: "np.ndarray", starts: "np.ndarray") -> "np.ndarray":
    """For each segment start: is it inside the set ``(a, b)``? (Exact for segments of a :func:`partition` that
    includes the set's endpoints.)"""
    import numpy as np

    starts = np.asarray(starts, dtype=float)
    if len(a) == 0:
        return np.zeros(starts.shape, dtype=bool)
    i = np.searchsorted(a, starts, side="right") - 1
    return (i >= 0) & (starts < b[np.clip(i, 0, None)])


def gaps_between(a: "np.ndarray", b: "np.ndarray", min_len: float) -> "tuple[np.ndarray, np.ndarray]":
    """The holes of at least ``min_len`` between consecutive intervals of the set ``(a, b)``."""
    import numpy as np

    if len(a) < 2:
        return np.empty(0), np.empty(0)
    keep = (a[1:] - b[:-1]) >= min_len
    return b[:-1][keep], a[1:][keep]


def subtract(x: "tuple[np.ndarray, np.ndarray]", y: "tuple[np.ndarray, np.ndarray]") -> "tuple[np.ndarray, np.ndarray]":
    """The set ``x`` minus the set ``y``."""
    import numpy as np

    pts = partition([x, y])
    if pts.size < 2:
        return np.empty(0), np.empty(0)
    s, e = pts[:-1], pts[1:]
    keep = cover(*x, s) & ~cover(*y, s)
    return union_np(s[keep], e[keep])
