"""``kit runs [NAME ...] [--root DIR]``: the runs on disk, one line each, with the status a reader should see.

Each line: experiment, run id, status, rows, label, hardware. The status is
:func:`kit.results.run_status`: what ``meta.json`` says, except that a run still marked ``running`` whose
supervisor process is gone reads ``died`` (its launcher was killed before it could write an end status; the
rows it streamed to ``rows.csv`` are still there and load as usual). ``NAME`` is an experiment under
``--root`` (default ``results``) or a path to a run directory or a folder of runs; none = every run under
the root. ``--root recorded`` lists the committed evidence.
"""

from __future__ import annotations

import csv
import gzip
import json
import sys
from pathlib import Path

COLUMNS = ("experiment", "run_id", "status", "rows", "label", "hardware")


def add_parser(sub) -> None:
    p = sub.add_parser("runs", help="list runs: experiment, run id, status (running/ok/failed/died...), rows, "
                                    "label, hardware")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="experiment names under --root, or run directories / folders of runs (default: all)")
    p.add_argument("--root", default="results", help="results root (default: results; 'recorded' for the evidence)")
    p.add_argument("--json", action="store_true", help="print a JSON list of runs (with their directories)")
    p.set_defaults(fn=cmd_runs)


def cmd_runs(args) -> int:
    dirs, missing = run_dirs(args.names, args.root)
    for m in missing:
        print(f"kit runs: no runs at {m}", file=sys.stderr)
    runs = [describe(d) for d in dirs]
    print(json.dumps(runs, indent=1) if args.json else format_table(runs))
    return 2 if missing and not runs else 0


def run_dirs(names: list[str], root: str | Path) -> tuple[list[Path], list[str]]:
    """The run directories that ``names`` designate (see the module docstring), and the names that match none."""
    from ..results import run_dirs as _run_dirs

    found: list[Path] = []
    missing: list[str] = []
    for name in names or [str(root)]:
        path = Path(name) if Path(name).is_dir() or not names else Path(root) / name
        dirs = _run_dirs(path) if path.exists() else []
        if not dirs:
            missing.append(str(path))
        found.extend(dirs)
    return sorted(dict.fromkeys(found), key=lambda d: (d.parent.name, d.name)), missing


def describe(run_dir: Path) -> dict:
    """One run, as ``kit runs`` shows it."""
    from .. import sysinfo
    from ..results import read_meta, run_label, run_status

    meta = read_meta(run_dir)
    info = meta.get("sysinfo") or {}
    return {"experiment": meta.get("experiment") or run_dir.parent.name, "run_id": run_dir.name,
            "status": run_status(meta) if meta else "no meta.json", "rows": count_rows(run_dir),
            "label": run_label(meta), "hardware": sysinfo.summary(info).split(" | ")[0] if info else "?",
            "dir": str(run_dir)}


def count_rows(run_dir: Path) -> int:
    for name, opener in (("rows.csv", open), ("rows.csv.gz", gzip.open)):
        path = Path(run_dir) / name
        if path.exists():
            with opener(path, "rt", newline="") as f:
                return max(sum(1 for _ in csv.reader(f)) - 1, 0)
    return 0


def format_table(runs: list[dict]) -> str:
    if not runs:
        return "no runs"
    cells = [[str(r[c]) for c in COLUMNS] for r in runs]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip()]
    lines += ["  ".join(v.rjust(w) if c == "rows" else v.ljust(w) for c, v, w in zip(COLUMNS, row, widths)).rstrip()
              for row in cells]
    return "\n".join(lines)
