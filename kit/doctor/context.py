"""What every judge gets besides its rule's per-rank summaries: the :class:`JobContext` of the job -- the ranks, the
step time, the optional sweep, every rank's small per-step host frame and capture
facts, and the collectives matched across ranks, computed once, on first use, for every judge that asks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .collectives import Timeline


@dataclass(frozen=True)
class JobContext:
    """The job, as the judges see it (module docstring). One per diagnosis; no module-global state."""

    ranks: tuple[int, ...]
    step_us: float | None
    """the job's step time: the median over ranks of each rank's median step"""
    steps: int
    """profiled steps (the minimum over ranks)"""
    sweep: "pd.DataFrame | None" = None
    """a collectives sweep of the same machine: ``collective, bytes, busbw_gbps`` rows"""
    summaries: dict = field(default_factory=dict, repr=False)
    """rank -> :class:`kit.doctor.rank_phase.RankSummary`"""
    host_steps: "dict[int, pd.DataFrame]" = field(default_factory=dict, repr=False)
    """rank -> the host model's per-step frame (:attr:`kit.doctor.host_model.HostModel.per_step`)"""
    capture: "dict[int, dict | None]" = field(default_factory=dict, repr=False)
    """rank -> the ``kitCapture`` facts of its trace (:func:`kit.capture.capture_info`), None when not captured so"""
    comm: "dict[int, Timeline]" = field(default_factory=dict, repr=False)
    """rank -> its collectives timeline (:class:`kit.doctor.collectives.Timeline`)"""
    overhead: "dict[int, Any] | None" = None
    """rank -> the profiler's overhead on its step (``kit.doctor.overhead``), when measured or estimated"""
    overhead_at_job: "dict[int, Any] | None" = None
    """... priced at the job's host speed, for comparing ranks (:func:`kit.doctor.own_time.at_job_speed`)"""
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    def collectives(self, backend: str | None = None) -> "pd.DataFrame | None":
        """Every rank's collectives matched across ranks (:func:`kit.doctor.collectives.matched`), with each
        kernel's waiting and transfer parts that no compute hid (:func:`kit.doctor.collectives.exposed_parts`);
        with who arrived last and whether launched inside a step (``last``, ``in_step``: :func:`kit.doctor.
        collectives.arrivals`); only ``backend``'s rows when given. None when no rank traced such a collective.
        Matched once per job."""
        from .collectives import arrivals, exposed_parts, matched, no_collectives

        if "all" not in self._memo:
            tls = sorted(self.comm.items())
            self._memo["all"] = None if not tls or no_collectives(tls) else arrivals(
                exposed_parts(matched(tls), self.comm), self.comm)
        df = self._memo["all"]
        if df is None:
            return None
        if backend is not None:
            df = df[df["backend"] == backend]
        return None if df.empty else df

    def comm_waits(self) -> dict[int, float]:
        """Per rank, the communication time per step spent waiting for peers that no compute hid (the kernels of
        the ranks that arrived early spin until the last one arrives): the ``comm`` slice's waiting part; the rest
        of the slice is transfer. At a collective seen on some ranks of its group but not all (``whole`` False:
        :func:`kit.doctor.collectives.arrivals`) every rank given may have waited for one not given and the
        transfer is not known: its whole exposed kernel counts as waiting (:meth:`waits_for_missing`). {} when the
        collectives cannot be matched across ranks (one rank, no NCCL metadata). Derived once per job, for the
        overhead's job floor (:mod:`.job_phase`) and the accounting rows."""
        if "waits" not in self._memo:
            self._memo["waits"], self._memo["missing"], self._memo["waits_by_step"] = self._waits()
        return self._memo["waits"]

    def comm_waits_by_step(self) -> dict[int, dict[int, float] | float]:
        """:meth:`comm_waits` per step number (the step each collective was launched in) where a rank's lie in
        profiled steps, else its :meth:`comm_waits`: for :func:`kit.doctor.overhead.own_work`, so one step's long wait
        is not taken off the others."""
        mean = self.comm_waits()
        by_step = self._memo["waits_by_step"]
        return {r: by_step[r] if by_step.get(r) else w for r, w in mean.items()}

    def waits_for_missing(self) -> dict[int, float]:
        """Per rank, the part of :meth:`comm_waits` at collectives seen on some ranks of their group but not all:
        time the ranks given spun for ranks not given (or in a transfer that cannot be told from it)."""
        self.comm_waits()
        return self._memo["missing"]

    def _waits(self) -> tuple[dict[int, float], dict[int, float], dict[int, dict[int, float]]]:
        from .collectives import per_step_divisor

        tls = sorted(self.comm.items())
        df = self.collectives("nccl") if len(tls) >= 2 else None
        out, missing, by_step = {}, {}, {}
        if df is not None and not df.empty and (df["ranks_seen"] > 1).any():
            part = df["part_of_group"]
            unknown = df["exposed_wait_us"] + df["exposed_transfer_us"]
            for r, tl in tls:
                mine = (df["rank"] == r) & df["in_step"]
                n = per_step_divisor(tl)
                missing[r] = float(unknown[mine & part].sum()) / n
                out[r] = float(df.loc[mine & ~part, "exposed_wait_us"].sum()) / n + missing[r]
                w = df["exposed_wait_us"].where(~part, unknown)[mine & df["step"].notna()]
                by_step[r] = {int(k): float(v) for k, v in w.groupby(df.loc[w.index, "step"]).sum().items()}
        return out, missing, by_step
