"""The layers of ``kit/``, declared once, and every import checked against them (module level and inside
functions, read with ``ast``): a file imports only from its own layer's group or from a layer below, and no two
files import each other, directly or through others.

    infrastructure -> traces -> transports -> investigations | doctor -> cli

``investigations`` and ``doctor`` are siblings: neither imports the other (what both need lives below them, e.g.
:mod:`kit.sweeps`). An import of ``kit.a.b`` counts as an import of the deepest kit module it names (as
``python -m`` would load it); a module's own package ``__init__`` above it is not a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[1] / "kit"

LEVELS: list[dict[str, list[str]]] = [
    {"infrastructure": [
        "kit", "kit.config", "kit.stats", "kit.sysinfo", "kit.results", "kit.plot", "kit.collective_ops",
        "kit.progress", "kit.wheelhouse", "kit.sweeps", "kit.timing", "kit.launch", "kit.contract", "kit.regimes",
        "kit.runner", "kit.notebook",
        "kit.nccl_profiler.plugin",  # builds and describes NCCL's profiler plugin: what sysinfo reports
    ]},
    {"traces": ["kit.traces", "kit.nccl_profiler", "kit.capture", "kit.gpu_profile"]},
    {"transports": ["kit.transports"]},
    {"investigations": ["kit.investigations"], "doctor": ["kit.doctor"]},
    {"cli": ["kit.cli", "kit.__main__"]},
]
"""Lowest level first. A module belongs to the group with the longest prefix naming it."""

KNOWN_CYCLES: list[set[str]] = []
"""Cycles tolerated for now, each with its issue (none: add one only with the issue that removes it)."""


def modules(root: Path = KIT) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The kit modules ``name`` imports anywhere in its file (module level, functions, ``TYPE_CHECKING``)."""

    def resolve(target: str) -> str | None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1]) if node.level else ""
            src = ".".join(x for x in (base, node.module or "") if x)
            targets = [src] + [f"{src}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] == "kit":
                r = resolve(t)
                if r and r != name and not name.startswith(r + "."):
                    found.add(r)
    return found


def where(module: str) -> tuple[int, str]:
    """(level, group) of a module: the group with the longest prefix naming it."""
    best = None
    for lvl, groups in enumerate(LEVELS):
        for group, prefixes in groups.items():
            for p in prefixes:
                if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[0]):
                    best = (len(p), lvl, group)
    if best is None:
        raise KeyError(f"{module}: in no layer; add it to LEVELS in tests/test_layers.py")
    return best[1], best[2]


def graph(root: Path = KIT) -> dict[str, set[str]]:
    mods = modules(root)
    return {m: imports(m, p, mods) for m, p in mods.items()}


def upward(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in sorted(edges.items()):
        la, ga = where(a)
        for b in sorted(targets):
            lb, gb = where(b)
            if lb > la or (lb == la and gb != ga):
                bad.append(f"{a} ({ga}) imports {b} ({gb})")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
    return out


def test_every_module_has_a_layer():
    missing = []
    for m in modules():
        try:
            where(m)
        except KeyError as e:
            missing.append(str(e))
    assert not missing


def test_imports_point_down():
    edges = graph()
    assert len(edges) > 100 and sum(map(len, edges.values())) > 200  # the walk sees the package
    bad = upward(edges)
    assert not bad, "imports against the layers:\n  " + "\n  ".join(bad)


def test_no_import_cycle_between_files():
    found = [c for c in cycles(graph()) if c not in KNOWN_CYCLES]
    assert not found, "import cycles (imports inside functions count):\n  " + "\n  ".join(
        " <-> ".join(sorted(c)) for c in found)


@pytest.mark.parametrize("plant, expect", [
    ("from ..investigations import collectives", "kit.traces.planted (traces) imports kit.investigations"),
    ("def f():\n    from kit.doctor import engine\n", "kit.traces.planted (traces) imports kit.doctor.engine"),
])
def test_a_planted_upward_import_fails(tmp_path, plant, expect):
    """The check itself: a copy of kit/ with one upward import (at module level, or inside a function) added."""
    import shutil

    copy = tmp_path / "kit"
    shutil.copytree(KIT, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (copy / "traces" / "planted.py").write_text(plant + "\n")
    bad = upward(graph(copy))
    assert any(b.startswith(expect) for b in bad), bad


def test_a_planted_cycle_fails(tmp_path):
    import shutil

    copy = tmp_path / "kit"
    shutil.copytree(KIT, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    with open(copy / "stats.py", "a") as f:
        f.write("\n\ndef _planted():\n    from . import results  # noqa\n")
    with open(copy / "results.py", "a") as f:
        f.write("\n\ndef _planted():\n    from . import stats  # noqa\n")
    assert {"kit.stats", "kit.results"} in cycles(graph(copy))
