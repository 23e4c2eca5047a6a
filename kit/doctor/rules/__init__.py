"""The doctor's rules: one module per rule (``<id>.py``), each declaring its :class:`kit.doctor.model.Rule` --
extract, judge, texts, whether it is cross-rank, which accounting slices it explains, its order -- and
registering it at import (:func:`kit.doctor.model.rule`). Importing this package imports every module in the
folder; the modules that hold no rule are what several rules share: :mod:`.comm` (the comm rules' extracts),
:mod:`.host` (the host rules' timeline and judge), :mod:`.late_arrival`, :mod:`.same_kernels`,
:mod:`.sync_costs`, :mod:`.evidence`.

:func:`parse_ids` is the one parser of a ``--rules`` list (the CLI, the doctor page and its notebook use it).
"""

from __future__ import annotations

import importlib
import pkgutil

from ..model import RULES

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")


class RuleIdError(ValueError):
    """A ``--rules`` list names a rule that does not exist."""


def parse_ids(spec: str | None) -> list[str] | None:
    """``"late_rank, host_sync"`` -> ``["late_rank", "host_sync"]``; None for all rules (empty or None);
    RuleIdError naming the unknown ids and listing the rules."""
    ids = [r.strip() for r in (spec or "").split(",") if r.strip()]
    if not ids:
        return None
    unknown = [r for r in ids if r not in RULES]
    if unknown:
        raise RuleIdError(f"unknown rule(s) {', '.join(unknown)}; the rules are {', '.join(RULES)}")
    return ids


def ids() -> list[str]:
    """Every rule id, in order."""
    return list(RULES)
