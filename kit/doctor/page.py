"""The doctor's report page: ``kit run doctor -p traces=[...]`` renders ``notebooks/doctor.ipynb`` as HTML.

An analysis page of the registry (:func:`kit.contract.analysis_page`): it launches nothing and needs no GPU; its
Config names the traces to diagnose. Its parameters derive from :class:`kit.config.LaunchConfig` only so that a
config file's ``defaults`` section (world size, backend, ...) applies to every page alike; the doctor ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import LaunchConfig
from ..contract import analysis_page
from ..results import recorded_index

DEFAULT_TRACES = list(recorded_index().get("doctor_page_traces", []))
"""the traces a plain ``kit run doctor`` diagnoses: ``doctor_page_traces`` in ``recorded/sets.json``
(:data:`kit.results.SETS_FILE`)"""


@dataclass
class DoctorConfig(LaunchConfig):
    traces: list[str] = field(default_factory=lambda: list(DEFAULT_TRACES))
    """rank traces of one job: files, directories or globs (relative to the repository or absolute)"""
    sweep: str = ""
    """a collectives sweep of the same machine (a kit collectives run directory or nccl-tests output); ""=none"""
    workers: int = 1
    """local processes for the per-rank phase (0 = one per core)"""
    flight_recorder: list[str] = field(default_factory=list)
    """Flight Recorder dumps of the same job (JSON, one per rank); [] = none"""
    rules: str = ""
    """comma-separated rule ids to run; "" = all"""

    def check(self) -> list[str]:
        from .rules import RuleIdError, parse_ids

        bad = [] if self.traces else ["traces: give at least one trace file, directory or glob"]
        try:
            parse_ids(self.rules)
        except RuleIdError as e:
            bad.append(f"rules: {e}")
        return bad


INVESTIGATION = analysis_page("doctor", DoctorConfig,
                              "which known causes does this job's trace show? (kit doctor on a job's per-rank traces)")
