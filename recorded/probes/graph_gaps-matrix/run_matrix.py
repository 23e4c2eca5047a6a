"""The graph_gaps probe matrix (issue 31) on one GPU: builds ../graph_gaps-repro/repro.cu with nvcc and runs it
once per point (one factor changed at a time from the base), each run under a timeout, keeping every replay's raw
%globaltimer stamps. Stdlib only: runs with the device's python3 and no kit install.

    python3 recorded/probes/graph_gaps-matrix/run_matrix.py OUTDIR [--tag h100x1] [--only base,work,...]

writes OUTDIR/<tag>/points.jsonl (one line per point: its parameters, rc, seconds, the repro's summary lines) and
OUTDIR/<tag>/raw/<point>.bin (the repro's --raw file), then OUTDIR/<tag>.tar.gz of that folder. The analysis
(kit.investigations.graph_gaps.matrix) turns the stamps into gaps with kit.traces.gaps.
"""

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "graph_gaps-repro" / "repro.cu"
BASE = dict(n=160, work_us=200, record="shared", where="side", join="edge", upload=0, priority=0, grid=0, queued=0,
            replays=20)


def points() -> list[tuple[str, str, dict]]:
    """(set, point name, parameters): every set varies one or two factors from BASE."""
    out = []

    def add(group, **kw):
        p = {**BASE, **kw}
        if p["n"] >= 640:
            p["replays"] = min(p["replays"], 10)  # long replays: fewer of them, every one still kept
        name = "_".join(f"{k}-{v}" for k, v in kw.items()) or "base"
        out.append((group, f"{group}-{name}", p))

    add("base")
    add("base", rep=1)  # the same point twice: the run-to-run spread
    for rec in ("none", "internal", "shared", "distinct", "node"):
        for join in ("edge", "none") + (("extwait",) if rec in ("shared", "distinct", "node") else ()):
            add("structure", record=rec, join=join)
    for rec in ("none", "internal", "shared", "distinct"):
        add("structure", record=rec, where="main")
    for rec in ("none", "shared", "distinct"):
        for w in (10, 20, 50, 100, 200, 500, 1000):
            add("work", record=rec, work_us=w)
        for n in (10, 40, 160, 640, 1000):
            add("layers", record=rec, n=n)
    for n in (40, 640):
        add("layers_short", record="shared", n=n, work_us=50)
    for rec in ("none", "shared"):
        for up in (0, 1):
            for pr in (0, 1):
                add("launch", record=rec, upload=up, priority=pr)
        add("launch", record=rec, queued=1)
        add("launch", record=rec, grid=1)  # one block of busy work: the GPU mostly empty
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--only", default="", help="comma-separated sets (default: all)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per point")
    ap.add_argument("--list", action="store_true", help="print the points and exit")
    a = ap.parse_args()
    pts = [p for p in points() if not a.only or p[0] in a.only.split(",")]
    if a.list:
        for g, name, p in pts:
            print(g, name, json.dumps(p))
        return 0
    root = Path(a.out) / a.tag
    (root / "raw").mkdir(parents=True, exist_ok=True)
    exe = root / "repro"
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw",
                          "--format=csv"], capture_output=True, text=True)
    nv = subprocess.run(["nvcc", "--version"], capture_output=True, text=True)
    (root / "gpu.txt").write_text(smi.stdout + smi.stderr + nv.stdout.strip().splitlines()[-1] + "\n")
    b = subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-o", str(exe), str(SRC)], capture_output=True, text=True)
    if b.returncode:
        print(b.stdout, b.stderr, file=sys.stderr)
        return 2
    with open(root / "points.jsonl", "w") as log:
        for g, name, p in pts:
            args = [str(exe), "--quiet", "1", "--raw", str(root / "raw" / f"{name}.bin")]
            for k in ("n", "work_us", "record", "where", "join", "upload", "priority", "grid", "queued", "replays"):
                args += [f"--{k.replace('_', '-')}", str(p[k])]
            t0 = time.time()
            try:
                r = subprocess.run(args, capture_output=True, text=True, timeout=a.timeout)
                rc, text = r.returncode, r.stdout + r.stderr
            except subprocess.TimeoutExpired:
                rc, text = 124, "timeout"
            row = dict(set=g, point=name, **p, rc=rc, seconds=round(time.time() - t0, 2),
                       summary=[line for line in text.splitlines() if line.strip()][-6:])
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(name, rc, row["seconds"], (row["summary"] or [""])[-1], flush=True)
    exe.unlink()
    with tarfile.open(Path(a.out) / f"{a.tag}.tar.gz", "w:gz") as t:
        t.add(root, arcname=a.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
