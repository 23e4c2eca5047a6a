"""`kit trace gaps`, `kit trace collectives` and `kit.traces.load_trace` (every frame, default CPU events) on a
100 MB trace.

Targets: each under 10 s; `kit trace collectives` and `load_trace` under 2 GB of memory (peak RSS of the
process).
The trace is built from a real 2xH200 tensor-parallel trace (tests/data/tp_rank0.json.gz): its events are
repeated, shifted in time, until the file is 100 MB -- the same mix of CPU ops, runtime calls and kernels as
a real profile, at the size of a long one.

    python benchmarks/bench_trace_tools.py [--mb 100]
"""

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S, TARGET_MB = 10.0, 2048


def build(path: Path, mb: int) -> None:
    src = json.loads(gzip.decompress((ROOT / "tests/data/tp_rank0.json.gz").read_bytes()))
    base = src["traceEvents"]
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in base) - min(e.get("ts", 0) for e in base if "ts" in e)
    head = {k: v for k, v in src.items() if k != "traceEvents"}
    with open(path, "w") as f:
        f.write('{\n  "traceEvents": [\n')
        first, k = True, 0
        while f.tell() < mb * 2**20:
            for e in base:
                e2 = dict(e)
                if "ts" in e2:
                    e2["ts"] = e2["ts"] + k * (span + 100)
                f.write(("" if first else ",\n") + "  " + json.dumps(e2))
                first = False
            k += 1
        f.write("\n  ],\n" + json.dumps(head)[1:-1] + "\n}\n")


def timed(args) -> tuple[float, float, int]:
    """Seconds, peak RSS (MB) and exit code of ``kit <args>`` -- or, for ``["load_trace", path]``, of
    ``kit.traces.load_trace(path)`` -- in a fresh process."""
    run = ("from kit import traces; traces.load_trace(sys.argv[2])" if args[0] == "load_trace"
           else "sys.argv = ['kit'] + sys.argv[1:]; runpy.run_module('kit', run_name='__main__')")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c",
                        "import resource, sys, runpy\n"
                        f"try:\n    {run}\n"
                        "finally:\n    print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)",
                        *args], cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t
    rss = [int(l.split()[1]) for l in p.stderr.splitlines() if l.startswith("MAXRSS_KB")]
    return dt, (rss[0] / 1024 if rss else float("nan")), p.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    a = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "big.json"
        build(trace, a.mb)
        size = trace.stat().st_size / 2**20
        for verb in (["trace", "gaps", str(trace), "--json"], ["trace", "collectives", str(trace), "--json"],
                     ["load_trace", str(trace)]):
            dt, rss, rc = timed(verb)
            mem = "collectives" in verb or verb[0] == "load_trace"
            good = rc == 0 and dt < TARGET_S and (not mem or rss < TARGET_MB)
            ok &= good
            what = "kit.traces.load_trace" if verb[0] == "load_trace" else f"kit {' '.join(verb[:2])}"
            print(f"{what} on {size:.0f} MB: {dt:.1f} s, peak RSS {rss:.0f} MB (targets < {TARGET_S:g} s"
                  f"{', < %d MB' % TARGET_MB if mem else ''}) -> {'PASS' if good else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
