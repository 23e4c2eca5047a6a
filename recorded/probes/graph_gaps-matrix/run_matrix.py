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
            replays=20, busy="spin", hidden=2048, tail=0, autofree=0, pdl=0, launch="created")
ARGS = ("n", "work_us", "record", "where", "join", "upload", "priority", "grid", "queued", "replays", "busy", "hidden",
        "tail", "autofree", "pdl", "launch")
# the GEMM base mirrors the PyTorch probe (recorded/probes/graph_gaps-nonccl-h200): tanh(x @ w), 1024 x 2048, fp32
GEMM = dict(busy="gemm", hidden=2048, tail=1)


def points() -> list[tuple[str, str, dict]]:
    """(set, point name, parameters): every set varies one or two factors from BASE."""
    out = []

    def add(group, base=None, **kw):
        p = {**BASE, **(base or {}), **kw}
        if p["n"] >= 640:
            p["replays"] = min(p["replays"], 10)  # long replays: fewer of them, every one still kept
        name = ("gemm_" if base else "") + ("_".join(f"{k}-{v}" for k, v in kw.items()) or "base")
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
        add("spin_torchlike", record=rec, tail=1, autofree=1)  # spin with PyTorch's tail kernel and flag
        for w in (10, 50, 200, 1000):
            add("copy_work", record=rec, busy="copy", work_us=w)
        for pdl in (1, 2, 3):  # programmatic dependent launch: busy, a split-K-reduce-like kernel after it, both
            add("pdl", record=rec, pdl=pdl)
        add("pdl", GEMM, record=rec, pdl=2)
        add("spin_torchlike", record=rec, tail=1, autofree=1, priority=2, pdl=2)  # PyTorch's flags + a reduce
    for rec in ("none", "shared", "distinct"):  # the stream the graph is replayed into
        add("launch_stream", record=rec, launch="legacy")
        add("launch_stream", GEMM, record=rec, launch="legacy")
        add("launch_stream", record=rec, launch="legacy", grid=128, work_us=50)
    add("launch_stream", GEMM, record="shared", launch="legacy", hidden=1024)
    add("launch_stream", record="shared", launch="legacy", n=640)
    # the factors varied above on a created stream only, now on the legacy default stream
    for kw in (dict(record="internal"), dict(record="node"), dict(join="extwait"), dict(join="none"),
               dict(where="main"), dict(priority=2, autofree=1), dict(pdl=3), dict(upload=1)):
        add("legacy_more", launch="legacy", **kw)
    for kw in (dict(record="node"), dict(hidden=512), dict(hidden=1536), dict(hidden=3072)):
        add("legacy_more", GEMM, launch="legacy", **kw)
    add("gemm_base", GEMM)
    add("gemm_base", GEMM, rep=1)
    for rec in ("none", "internal", "shared", "distinct", "node"):
        for join in ("edge", "none") + (("extwait",) if rec in ("shared", "distinct", "node") else ()):
            add("gemm_structure", GEMM, record=rec, join=join)
    for rec in ("none", "internal", "shared", "distinct"):
        add("gemm_structure", GEMM, record=rec, where="main")
    for rec in ("none", "shared", "distinct"):
        for h in (512, 1024, 1536, 2048, 3072, 4096):
            add("gemm_work", GEMM, record=rec, hidden=h)
        for n in (10, 40, 160, 640, 1000):
            add("gemm_layers", GEMM, record=rec, n=n)
    for rec in ("none", "shared"):
        for kw in (dict(upload=1), dict(priority=1), dict(autofree=1), dict(queued=1), dict(tail=0)):
            add("gemm_launch", GEMM, record=rec, **kw)
    return out


def build(exe) -> str:
    """nvcc the repro with cuBLAS; where nvcc does not find cublas_v2.h, look for the headers and library of the
    CUDA install or of Python's nvidia-cublas wheel. Returns '' or the error."""
    import glob

    cmd = ["nvcc", "-O2", "-arch=sm_90", "-o", str(exe), str(SRC)]
    r = subprocess.run(cmd + ["-lcublas"], capture_output=True, text=True)
    if not r.returncode:
        return ""
    roots = ["/usr/local/cuda*", "/usr/include", "/usr/lib/x86_64-linux-gnu"] + [p for p in sys.path if "site-packages" in p]
    hdr = [h for root in roots for h in glob.glob(f"{root}/**/cublas_v2.h", recursive=True)]
    lib = [h for root in roots for h in glob.glob(f"{root}/**/libcublas.so*", recursive=True)]
    if not hdr or not lib:
        return r.stderr + f"\nno cublas_v2.h / libcublas.so found (headers {hdr[:3]}, libs {lib[:3]})"
    libdir = os.path.dirname(lib[0])
    name = sorted(os.path.basename(x) for x in lib if os.path.dirname(x) == libdir)[0]
    extra = ["-I", os.path.dirname(hdr[0]), "-L", libdir, f"-l:{name}", "-Xlinker", f"-rpath={libdir}"]
    r = subprocess.run(cmd + extra, capture_output=True, text=True)
    return "" if not r.returncode else r.stderr + " ".join(extra)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--only", default="", help="comma-separated sets (default: all)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per point")
    ap.add_argument("--list", action="store_true", help="print the points and exit")
    ap.add_argument("--build", action="store_true", help="only build OUT (the executable's path) and exit")
    a = ap.parse_args()
    pts = [p for p in points() if not a.only or p[0] in a.only.split(",")]
    if a.build:
        err = build(a.out)
        print(err or f"built {a.out}", file=sys.stderr if err else sys.stdout)
        return 2 if err else 0
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
    err = build(exe)
    if err:
        print(err, file=sys.stderr)
        return 2
    with open(root / "points.jsonl", "w") as log:
        for g, name, p in pts:
            args = [str(exe), "--quiet", "1", "--raw", str(root / "raw" / f"{name}.bin")]
            for k in ARGS:
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
