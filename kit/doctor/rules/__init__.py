"""The doctor's rules: one module per rule (``<id>.py``), each declaring its :class:`kit.doctor.model.Rule` --
extract, judge, texts, whether it is cross-rank, which accounting slices it explains, its order -- and
registering it at import (:func:`kit.doctor.model.rule`). Importing this package imports every module in the
folder; the modules that hold no rule are what several rules share: :mod:`.comm` (the comm rules' extracts),
:mod:`.host` (the host rules' timeline and judge), :mod:`.late_arrival`, :mod:`.same_kernels`,
:mod:`.sync_costs`, :mod:`.evidence`.

:func:`parse_ids` is the one parser of a ``--rules`` list (the CLI, the doctor page and its notebook use it);
:func:`table` renders the rules' table of ``docs/cli.md`` from the registry (``make docs-rules`` writes it,
:func:`write_table`; a test checks the committed one).
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


TABLE_HEAD = "| rule | what it finds |\n|---|---|\n"
"""the first lines of the rules' table in ``docs/cli.md`` (the table runs to the next blank line)"""


def table() -> str:
    """The markdown table of every rule, in order: id, title, and what it needs beyond one rank's trace."""
    rows = []
    for r in RULES.values():
        needs = ([f"needs {r.needs_ranks} ranks"] if r.needs_ranks > 1 else []) + (
            ["against a collectives sweep of the same machine, `--sweep`"] if r.needs_sweep else [])
        said = f" ({'; '.join(needs)})" if needs else ""
        rows.append(f"| `{r.id}` | {r.title}{said} |\n")
    return TABLE_HEAD + "".join(rows)


def write_table(path: str = "docs/cli.md") -> bool:
    """Replace the rules' table in ``path`` by :func:`table`; whether the file changed."""
    from pathlib import Path

    p = Path(path)
    text = p.read_text()
    i = text.index(TABLE_HEAD)
    j = text.index("\n\n", i) + 1
    new = text[:i] + table() + text[j:]
    if new != text:
        p.write_text(new)
    return new != text
