"""Names of the traces an investigation keeps, and finding them again.

**The scheme** (:func:`trace_path`): ``trace_<key>=<value>_<key>=<value>..._rank<r>.json.gz`` in the run
directory, tags in the order given, e.g. ``trace_part=ddp_rank0.json.gz``,
``trace_model=matmul-only_layers=10_mode=graph_rank1.json.gz``, ``trace_h2d=pageable_sync=per_param_rank0.json.gz``.
Keys are letters and digits (``[A-Za-z][A-Za-z0-9]*``: no ``_``, no ``=``); values are letters, digits and
``. _ + -`` (``str(value)``: ``layers=10``). ``=`` makes a name unambiguous however many ``_`` or ``-`` a value has
(``per_param``, ``matmul-only``) and tells it apart from the older names below; every name :func:`trace_path`
writes parses back to the same tags (it checks).

**Finding them** (:func:`find_traces`): every trace file under the given run directories (and their
sub-folders, e.g. p2p's ``traces/``) whose name carries the tags asked for. It also reads the names the kit
wrote before this scheme, already in ``recorded/``, with the tags the current writers use:

=============================================================  ==========================================
old name                                                       tags
=============================================================  ==========================================
``trace_ddp_rank0.json.gz`` (collective_tracing)               ``part=ddp``
``trace_allreduce_N10_graph_rank0.json.gz`` (graph_gaps)       ``model=allreduce layers=10 mode=graph``
``trace_pageable_per_param_rank0.json.gz`` (dataloader_sync)   ``h2d=pageable sync=per_param``
``traces/comm_compute-nccl-rank0.json.gz`` (p2p_transports)    ``experiment=comm_compute transport=nccl``
any other ``<stem>_rank<r>.json.gz`` / ``<stem>-rank<r>...``   ``name=<stem>``
``<worker>.<ms>.pt.trace.json[.gz]`` (tensorboard_trace_handler)  ``worker=<worker>``; the rank where the
                                                               worker name says ``rank<r>``/``worker<r>``
=============================================================  ==========================================

Query values are compared as strings (``layers=10`` matches ``"10"``); a list/tuple/set matches any of its
values. Files that are not traces of one rank (``merged_*.json.gz``, Flight Recorder dumps ``fr_*.json``, graph
dumps) are never returned.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, NamedTuple

_KEY = re.compile(r"[A-Za-z][A-Za-z0-9]*\Z")
_VALUE = re.compile(r"[A-Za-z0-9._+-]+\Z")
_SUFFIX = re.compile(r"(\.pt\.trace)?\.json(\.gz)?\Z")
_RANK = re.compile(r"_rank(\d+)\Z")
_SPLIT = re.compile(r"_(?=[A-Za-z][A-Za-z0-9]*=)")
_LEGACY = [  # (pattern on the stem, fixed tags); the named groups are tags too
    (re.compile(r"trace_(?P<model>.+?)_N(?P<layers>\d+)_(?P<mode>eager|graph)_rank(?P<rank>\d+)\Z"), {}),
    (re.compile(r"trace_(?P<h2d>pageable|pinned|side_stream|prefetch)_"
                r"(?P<sync>per_param|flat|ddp_one_bucket|ddp)_rank(?P<rank>\d+)\Z"), {}),
    (re.compile(r"trace_(?P<part>[A-Za-z0-9]+)_rank(?P<rank>\d+)\Z"), {}),
    (re.compile(r"comm_compute-(?P<transport>[A-Za-z0-9]+)-rank(?P<rank>\d+)\Z"), {"experiment": "comm_compute"}),
]
_GENERIC = re.compile(r"(?P<name>.+?)[_-]rank(?P<rank>\d+)\Z")
_HANDLER = re.compile(r"(?P<worker>[^.]+)\.(?P<stamp>[^/]+)\Z")
"""``torch.profiler.tensorboard_trace_handler``'s ``<worker name>.<time in ms>.pt.trace.json[.gz]`` (worker
name: ``<host>_<pid>`` by default, or what the user gave: ``worker0``, ``rank-3``, ``worker1_step_12``)"""
_WORKER_RANK = re.compile(r"(?:^|[_-])(?:rank|worker)[-_]?(?P<rank>\d+)(?=$|[_-])", re.IGNORECASE)


class TraceFile(NamedTuple):
    """One trace found by :func:`find_traces`."""

    path: Path
    tags: dict[str, str]
    rank: int | None
    run_dir: Path
    """the run directory it belongs to (nearest folder with a meta.json, else its folder)"""


def trace_path(where: Any, rank: int | None = None, **tags: Any) -> Path:
    """Where to keep a trace: ``<run dir>/trace_<k>=<v>..._rank<r>.json.gz`` (see the module docstring).

    ``where``: a :class:`kit.launch.Ctx` (its ``run_dir``; ``rank`` defaults to ``ctx.rank``) or a directory.
    ``rank=None`` with a directory: no rank part (a trace that is not one rank's). Raises ValueError for a
    tag key or value outside the scheme, or no tags.
    """
    run_dir = Path(getattr(where, "run_dir", where))
    if rank is None and hasattr(where, "rank"):
        rank = where.rank
    if not tags:
        raise ValueError("trace_path needs at least one tag, e.g. trace_path(ctx, part='ddp')")
    parts = []
    for k, v in tags.items():
        v = str(v)
        if not _KEY.match(k):
            raise ValueError(f"trace tag key {k!r}: letters and digits only, starting with a letter")
        if not _VALUE.match(v):
            raise ValueError(f"trace tag {k}={v!r}: the value may hold letters, digits and . _ + - only")
        parts.append(f"{k}={v}")
    name = "trace_" + "_".join(parts) + ("" if rank is None else f"_rank{int(rank)}") + ".json.gz"
    parsed = parse_name(name)
    if parsed is None or parsed[0] != {k: str(v) for k, v in tags.items()}:  # e.g. a value ending in '_x=' ...
        raise ValueError(f"trace tags {tags} do not survive the round trip through the name {name!r}")
    return run_dir / name


def parse_name(name: str) -> tuple[dict[str, str], int | None] | None:
    """``(tags, rank)`` of a trace file name under the scheme or an older kit name; None if not a trace name."""
    m = _SUFFIX.search(name)
    if not m:
        return None
    stem = name[: m.start()]
    if stem.startswith("trace_") and "=" in stem:
        body, rank = stem[len("trace_"):], None
        r = _RANK.search(body)
        if r:
            body, rank = body[: r.start()], int(r.group(1))
        tags = {}
        for part in _SPLIT.split(body):
            k, sep, v = part.partition("=")
            if not sep or not _KEY.match(k) or not v or "=" in v:
                return None
            tags[k] = v
        return tags, rank
    for pattern, fixed in _LEGACY:
        lm = pattern.match(stem)
        if lm:
            g = lm.groupdict()
            rank = int(g.pop("rank"))
            return {**fixed, **g}, rank
    if m.group(1):
        h = _HANDLER.match(stem)
        if h and not stem.startswith(("fr_", "merged")):
            r = _WORKER_RANK.search(h.group("worker"))
            return {"worker": h.group("worker")}, int(r.group("rank")) if r else None
    if name.endswith(".gz") or m.group(1):  # plain .json files are traces only under the kit's names
        gm = _GENERIC.match(stem)
        if gm and not stem.startswith(("fr_", "merged")):
            return {"name": gm.group("name")}, int(gm.group("rank"))
    return None


def _run_dir(p: Path, roots: list[Path]) -> Path:
    for d in p.parents:
        if (d / "meta.json").exists():
            return d
        if d in roots:
            break
    return p.parent


def _matches(have: dict[str, str], want: dict[str, Any]) -> bool:
    for k, v in want.items():
        options = {str(x) for x in v} if isinstance(v, (list, tuple, set, frozenset)) else {str(v)}
        if have.get(k) not in options:
            return False
    return True


def find_traces(dirs: Any, rank: int | Iterable[int] | None = None, **tags: Any) -> list[TraceFile]:
    """Every kept trace under ``dirs`` whose tags include ``tags`` (see the module docstring).

    ``dirs``: a run directory, a folder of runs, a trace file, a :class:`kit.results.RunSet` (its ``dirs``),
    or a list of these. ``rank``: only this rank (or these ranks). Sorted by run directory, tags, rank: the
    traces of one tag set across ranks come together, ready for ``collectives([f.path for f in ...])``.
    A DataFrame: ``pd.DataFrame([{**f.tags, "rank": f.rank, "path": f.path} for f in find_traces(...)])``.
    """
    if hasattr(dirs, "dirs") and not isinstance(dirs, (str, Path)):
        dirs = dirs.dirs
    roots = [Path(dirs)] if isinstance(dirs, (str, Path)) else [Path(d) for d in dirs]
    ranks = None if rank is None else ({int(rank)} if isinstance(rank, int) else {int(r) for r in rank})
    found: dict[Path, TraceFile] = {}
    for root in roots:
        files = [root] if root.is_file() else (sorted(root.rglob("*.json*")) if root.is_dir() else [])
        for f in files:
            parsed = parse_name(f.name)
            if parsed is None or f in found:
                continue
            t, r = parsed
            if _matches(t, tags) and (ranks is None or r in ranks):
                found[f] = TraceFile(f, t, r, _run_dir(f, roots))
    return sorted(found.values(), key=lambda x: (str(x.run_dir), sorted(x.tags.items()), x.rank is None,
                                                 x.rank or 0, str(x.path)))
