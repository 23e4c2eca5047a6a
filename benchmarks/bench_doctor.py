"""``kit doctor`` with its step accounting against a kit without it (issue 26's speed and memory targets).

The accounting must not cost more than ~20% over the doctor before it, and on one real 150 MB rank trace the
doctor stays within 5 s and 500 MB on two cores. This times ``kit doctor --no-cache --workers 1 --json`` (every
trace parsed, in one process) on the given traces, alternating between this checkout and ``--baseline`` (another
kit source tree, e.g. ``git worktree add /tmp/kit-base <commit>``), ``--repeat`` times each, in fresh processes;
wall time and peak RSS from GNU time. Without traces it uses the 1-rank trace of
``benchmarks/bench_trace_tools.py`` (``make_job``, ``--mb`` MB).

    python benchmarks/bench_doctor.py [TRACE ...] [--baseline DIR] [--repeat 3] [--mb 100]
    python benchmarks/bench_doctor.py --ranks 4 --mb 40 --workers 2 [--baseline DIR]   # a 4-rank job

With ``--ranks N`` the generated job has N rank traces of ``--mb`` MB each (``make_job``: rank 0's events, each
rank skewed) and one run diagnoses them all (the multi-GPU target: 4 ranks x 40 MB in <= 5 s and <= 300 MB with 2
workers on two cores; peak RSS is the largest process's, the workers included).

Prints one markdown row per (tree, trace or job): median wall, min-max, peak RSS, the CPU time of every process of
the run (median) and that over the cores the workers can use (``--workers``, at most the machine's), and the load
average when the runs started: on a shared box say it with every number. Every sample is printed to stderr as it
comes (keep them).
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
    """One ``kit doctor`` run from ``tree``'s sources on one trace or a job's traces: (wall s, peak RSS MB of the
    largest process, CPU s summed over every process of the run, the 1-minute load average when it started).

    Wall time comes from GNU time. The CPU time and each process's peak RSS are sampled from the process tree
    every 20 ms (psutil; the peak is the kernel's high-water mark, ``VmHWM`` of ``/proc/PID/status``, so a sample
    misses at most a peak reached in the last 20 ms of a process): the workers are forked from a forkserver that
    GNU time does not wait for, so its own figures are the main process's alone (its peak RSS is taken too). On a
    shared box the wall time grows with the load, the CPU time much less: ``CPU / cores`` is the wall time the
    same work needs on idle cores when it is spread over them."""
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
