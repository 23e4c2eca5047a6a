"""``kit doctor`` timed against another kit tree (issue 26's and issue 39's speed and memory targets).

``kit doctor --no-cache --workers W --json`` on the given traces (none: the 1-rank trace of
``bench_trace_tools.make_job``, ``--mb`` MB; ``--ranks N``: a generated job of N such traces, each rank skewed, one
run diagnosing them all), alternating between this checkout and ``--baseline`` (e.g. ``git worktree add
/tmp/kit-base <commit>``), ``--repeat`` times each, in fresh processes. Targets: the accounting within ~20% of the
doctor before it; 4 ranks x 40 MB in <= 5 s and <= 300 MB with 2 workers on two cores.

    python benchmarks/bench_doctor.py [TRACE ...] [--baseline DIR] [--repeat 3] [--mb 100]
    python benchmarks/bench_doctor.py --ranks 4 --mb 40 --workers 2 [--baseline DIR]

One markdown row per (tree, trace or job): median wall (GNU time) and min-max, the largest process's peak RSS (the
workers included), the CPU time of every process (median) and over the cores the workers can use, the load average
at the starts: on a shared box say it with every number. Every sample goes to stderr as it comes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def once(tree: Path, trace: "Path | list[Path]", workers: int = 1) -> tuple[float, float, float, float]:
    """One ``kit doctor`` run from ``tree``'s sources: (wall s from GNU time, the largest process's peak RSS MB, the
    CPU s of every process, the 1-minute load average at the start). CPU and each process's ``VmHWM`` are sampled
    every 20 ms over the process tree (GNU time does not see the forkserver's workers; a sample misses at most a
    peak of a process's last 20 ms). ``CPU / cores`` is the wall time the work needs on idle cores."""
    import time

    import psutil

    env = {**os.environ, "PYTHONPATH": str(tree), "KIT_TRACE_CACHE": "0"}
    files = [str(t) for t in trace] if isinstance(trace, list) else [str(trace)]
    cmd = ["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "kit", "doctor", *files, "--workers", str(workers),
           "--json"]
    load = os.getloadavg()[0]
    p = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu: dict[int, float] = {}
    hwm: dict[int, float] = {}
    root = psutil.Process(p.pid)
    while p.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for q in procs:
            try:
                t = q.cpu_times()
                cpu[q.pid] = max(cpu.get(q.pid, 0.0), t.user + t.system)
                hwm[q.pid] = max(hwm.get(q.pid, 0.0), _hwm_mb(q.pid))
            except (psutil.Error, OSError):
                pass
        time.sleep(0.02)
    err = p.stderr.read()
    if p.returncode not in (0, 3, 4):
        raise SystemExit(f"{tree}: kit doctor exited {p.returncode}: {err.strip().splitlines()[-1:]}")
    wall, kb = err.strip().splitlines()[-1].split()
    return float(wall), max(float(kb) / 1024, *hwm.values()), sum(cpu.values()), load


def _hwm_mb(pid: int) -> float:
    """The peak resident set of a live process so far (``VmHWM``), MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--baseline", type=Path, help="another kit source tree to compare with")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--workdir", default="/tmp/kit-bench-traces")
    ap.add_argument("--ranks", type=int, default=1, help="a generated job of this many ranks (default 1)")
    ap.add_argument("--workers", type=int, default=1, help="kit doctor --workers (default 1)")
    a = ap.parse_args()
    traces = a.traces
    if a.ranks > 1:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_trace_tools import make_job

        traces = [make_job(Path(a.workdir) / f"doctor_{a.ranks}x{a.mb:g}mb", a.ranks, mb=a.mb)]
    elif not traces:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_trace_tools import make_job

        traces = make_job(Path(a.workdir) / f"doctor_{a.mb:g}mb", 1, mb=a.mb)[:1]
    trees = [("this", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    print("| tree | trace | MB | wall s (median, min-max) | peak RSS MB, largest process | CPU s (median) | CPU / cores s | "
          "load average at start |\n|---|---|---|---|---|---|---|---|")
    cores = min(os.cpu_count() or 1, max(1, a.workers))
    for t in traces:
        got: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n, _ in trees}
        for _ in range(a.repeat):
            for name, tree in trees:  # alternating: a noisy neighbour hits both
                got[name].append(once(tree, [Path(x).resolve() for x in t] if isinstance(t, list)
                                      else Path(t).resolve(), a.workers))
                w_, m_, c_, l_ = got[name][-1]
                print(f"sample {name}: wall {w_:.2f} s, peak RSS {m_:.0f} MB, CPU {c_:.2f} s, load {l_:.2f}",
                      file=sys.stderr, flush=True)
        for name, _ in trees:
            w = [x[0] for x in got[name]]
            m = max(x[1] for x in got[name])
            c = statistics.median(x[2] for x in got[name])
            loads = [x[3] for x in got[name]]
            label = f"{len(t)} ranks" if isinstance(t, list) else Path(t).name
            mb = sum(Path(x).stat().st_size for x in (t if isinstance(t, list) else [t])) / 1e6
            print(f"| {name} | {label} | {mb:.0f} | {statistics.median(w):.2f} "
                  f"({min(w):.2f}-{max(w):.2f}) | {m:.0f} | {c:.2f} | {c / cores:.2f} | "
                  f"{min(loads):.1f}-{max(loads):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
