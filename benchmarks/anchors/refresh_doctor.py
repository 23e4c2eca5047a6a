"""Re-run only the ``kit doctor`` column of the multi-GPU tables in RESULTS.md, on the current code.

The anchors (traceinsight, torch-tb-profiler, TraceLens) do not change between the kit's commits; the doctor
does. For every table row whose case is ``recorded: <path>`` (a job under the device results folder, as
``compare.py`` prints it) or a committed multi-GPU corpus case ``tests/data/doctor/corpus-<machine>/<case>`` (read
from this checkout), this runs ``kit doctor --json --workers 1 --sweep RUN`` with the machine's sweep
(chosen by the case's ``truth.json``: its device and world size, e.g. ``h100x2``) through
:func:`compare.run_doctor`, formats the cell with :func:`compare._doctor_cell` and rewrites the row's last cell.
It prints each case whose cell moved, old and new, and writes every result to ``--json`` when given. Usage::

    .venv/bin/python benchmarks/anchors/refresh_doctor.py benchmarks/anchors/RESULTS.md \
        --results-root .device/results --kit-python .venv/bin/python \
        --sweep h100x2=recorded/h100x2/collectives/RUN --sweep h100x4=... --sweep h200x2=... [--only SUBSTR]

Without ``--results-root`` the ``recorded:`` rows are left as they are. Exit codes: 0 on success, 2 on a missing
results root, sweep or job.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

ROW = re.compile(r"^\| `(?P<where>recorded: )?(?P<job>(?(where)[^`]+|tests/data/doctor/corpus-[^`]+))` "
                 r"(?P<rest>.*) \| (?P<doctor>[^|]*) \|$")
REPO = compare.REPO


def machine(job: Path) -> str:
    """``h100x2``, ``h100x4``, ``h200x2``, ...: the GPU's model word and the world size from the case's truth.json."""
    t = json.loads((job / "truth.json").read_text())
    word = re.search(r"\b([A-Z]\d{2,4})\b", t["device"])
    return f"{word.group(1).lower() if word else 'gpu'}x{t['world_size']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("markdown", type=Path)
    ap.add_argument("--results-root", type=Path, help="the folder 'recorded: ' stands for")
    ap.add_argument("--kit-python", required=True)
    ap.add_argument("--sweep", action="append", default=[], help="MACHINE=RUN, e.g. h100x2=recorded/h100x2/...")
    ap.add_argument("--only", action="append", default=[], help="refresh only cases whose path holds this")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sweeps = dict(s.split("=", 1) for s in args.sweep)
    if (args.results_root and not args.results_root.is_dir()) or any(not Path(p).is_dir() for p in sweeps.values()):
        print(f"refresh_doctor.py: no such results root or sweep: {args.results_root} {sweeps}", file=sys.stderr)
        return 2
    lines = args.markdown.read_text().split("\n")
    out, moved, seen = [], [], []
    for line in lines:
        m = ROW.match(line)
        if (not m or (args.only and not any(s in m["job"] for s in args.only))
                or (m["where"] and not args.results_root)):
            out.append(line)
            continue
        job = args.results_root / m["job"] if m["where"] else REPO / m["job"]
        if not job.exists() or not compare.trace_files(job):
            print(f"refresh_doctor.py: no trace file in {job}", file=sys.stderr)
            return 2
        sweep = sweeps.get(machine(job))
        doc = compare.run_doctor(job.resolve(), args.kit_python, Path(sweep).resolve() if sweep else None)
        cell = compare._doctor_cell(doc)
        seen.append({"job": m["job"], "machine": machine(job), "doctor": doc, "cell": cell, "old": m["doctor"]})
        if cell != m["doctor"]:
            moved.append(m["job"])
            print(f"{m['job']}\n  was: {m['doctor']}\n  now: {cell}", flush=True)
        out.append(f"| `{m['where'] or ''}{m['job']}` {m['rest']} | {cell} |")
    args.markdown.write_text("\n".join(out))
    if args.json:
        args.json.write_text(json.dumps(seen, indent=1, default=str))
    print(f"{len(seen)} cases, {len(moved)} moved", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
