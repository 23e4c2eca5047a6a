"""``kit doctor``: which of the known causes does *your* job suffer from, from its per-rank profiler traces.

See :mod:`kit.doctor.model` (rules, findings, severity), :mod:`kit.doctor.engine` (per-rank extract in
parallel, cross-rank judge), :mod:`kit.doctor.rules` (the rules).
"""

from .engine import JobError, diagnose, rank_summary
from .model import RULES, Diagnosis, Finding, Rule, Skip, rule, severity

__all__ = ["Diagnosis", "Finding", "JobError", "RULES", "Rule", "Skip", "diagnose", "rank_summary", "rule", "severity"]
