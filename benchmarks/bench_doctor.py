"""``kit doctor`` with its step accounting against a kit without it (issue 26's speed and memory targets).

The accounting must not cost more than ~20% over the doctor before it, and on one real 150 MB rank trace the
doctor stays within 5 s and 500 MB on two cores. This times ``kit doctor --no-cache --workers 1 --json`` (every
trace parsed, in one process) on the given traces, alternating between this checkout and ``--baseline`` (another
kit source tree, e.g. ``git worktree add /tmp/kit-base <commit>``), ``--repeat`` times each, in fresh processes;
wall time and peak RSS from GNU time. Without traces it uses the 1-rank trace of
``benchmarks/bench_trace_tools.py`` (``make_job``, ``--mb`` MB).

    python benchmarks/bench_doctor.py [TRACE ...] [--baseline DIR] [--repeat 3] [--mb 100]

Prints one markdown row per (tree, trace): median wall, min-max, peak RSS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def once(tree: Path, trace: Path) -> tuple[float, float]:
    """One ``kit doctor`` run from ``tree``'s sources: (wall s, peak RSS MB)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "KIT_TRACE_CACHE": "0"}
    cmd = ["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "kit", "doctor", str(trace), "--workers", "1",
           "--json"]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode not in (0, 3, 4):
        raise SystemExit(f"{tree}: kit doctor exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    wall, kb = p.stderr.strip().splitlines()[-1].split()
    return float(wall), float(kb) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--baseline", type=Path, help="another kit source tree to compare with")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--workdir", default="/tmp/kit-bench-traces")
    a = ap.parse_args()
    traces = a.traces
    if not traces:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_trace_tools import make_job

        traces = make_job(Path(a.workdir) / f"doctor_{a.mb:g}mb", 1, mb=a.mb)[:1]
    trees = [("this", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    print("| tree | trace | MB | wall s (median, min-max) | peak RSS MB |\n|---|---|---|---|---|")
    for t in traces:
        got: dict[str, list[tuple[float, float]]] = {n: [] for n, _ in trees}
        for _ in range(a.repeat):
            for name, tree in trees:  # alternating: a noisy neighbour hits both
                got[name].append(once(tree, Path(t).resolve()))
        for name, _ in trees:
            w = [x for x, _ in got[name]]
            m = max(r for _, r in got[name])
            print(f"| {name} | {Path(t).name} | {Path(t).stat().st_size / 1e6:.0f} | {statistics.median(w):.2f} "
                  f"({min(w):.2f}-{max(w):.2f}) | {m:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
