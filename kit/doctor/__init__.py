"""``kit doctor``: which of the known causes does *your* job suffer from, from its per-rank profiler traces.

The stages (:mod:`kit.doctor.engine` walks them): per rank :mod:`~kit.doctor.rank_phase` (:mod:`~kit.doctor.steps`,
:mod:`~kit.doctor.host_model`, :mod:`~kit.doctor.accounting`, :mod:`~kit.doctor.collectives`, the rules'
extracts); across ranks :mod:`~kit.doctor.job_phase` (job check, :class:`~kit.doctor.context.JobContext`, the
rules' judges), :mod:`~kit.doctor.reconcile`, :mod:`~kit.doctor.finalize`. The types are in
:mod:`kit.doctor.model`, the rules (one module each) in :mod:`kit.doctor.rules`.
"""

from ..traces.jobs import JobError
from .engine import diagnose
from .model import RULES, Diagnosis, Finding, Rule, Skip, rule, severity
from .rank_phase import rank_summary

__all__ = ["Diagnosis", "Finding", "JobError", "RULES", "Rule", "Skip", "diagnose", "rank_summary", "rule", "severity"]
