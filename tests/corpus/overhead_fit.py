"""The profiler's per-op host cost on real jobs: fitted on the multi-GPU corpus cases whose overhead kit.capture
measured (traced step minus the unprofiled median, :mod:`kit.doctor.overhead`), for traces that carry no
unprofiled step time -- where ``benchmarks/bench_profiler_overhead.py``'s isolated-op loops give 3-5x less than
real jobs pay (FINDINGS.md).

Per case: the measured overhead (median over ranks) and its exposure curve: for each per-op cost of :data:`GRID`,
the profiler time that lengthened the job's step -- its recorded ops at that cost, replayed against its GPU's work
(:func:`kit.doctor.overhead._exposed`: only where the GPU waited for the host), the largest over its ranks (the job
steps at its slowest host's pace). The case's per-op cost is where the curve meets the measured overhead; a case
whose curve never does, or that is GPU-bound without the profiler (unprofiled step < :data:`GPU_BOUND` x its
slowest GPU's compute: its host's profiler time hides behind the GPU), says nothing about the cost and is left
out. The table's cost is the median over the cases kept, runtime calls folded into it (they come with the ops),
and each case is checked leave-one-out: the others' median cost through its own curve against its measured
overhead.

    python tests/corpus/overhead_fit.py tests/data/doctor/corpus-h100x2 tests/data/doctor/corpus-h100x4 \\
        --out recorded/profiler_overhead/h100-jobs.json

Exit status 0; 2 when no case has a measured overhead.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_BOUND = 1.25
"""a case is GPU-bound without the profiler when its unprofiled step is below this x its slowest GPU's compute: its
host's profiler time hides behind the GPU, and where little is left to hide behind the cost is not determined"""
GRID = [round(0.5 * i, 1) for i in range(61)]
"""the per-op costs (us) each case's exposed overhead is computed at: 0-30 us"""


def case_point(case: Path) -> dict | None:
    """One corpus case's point (:func:`point`): its overhead as kit.capture measured it on each rank (traced step
    minus the unprofiled median), the median over ranks; None without a measured overhead."""
    from kit.doctor.overhead import overhead

    t = json.loads((case / "truth.json").read_text())
    files = sorted(case.glob("*.json.gz"))
    got = [overhead(f) for f in files]
    if not got or any(o.basis != "measured" for o in got):
        return None
    return point(f"{case.parent.name}/{case.name}", files, statistics.median(o.overhead_us for o in got),
                 float(t["step_us_unprofiled"]["median"]), t)


def curves(files: list[Path]) -> tuple[list[dict], list[float]]:
    """A job's ranks (their traces ``files``; a rank without steps left out): per rank its ops and runtime calls per
    step, median traced step and GPU compute; and the job's exposure curve: for each per-op cost of :data:`GRID`, the
    profiler time that lengthened the job's step (the largest over its ranks of
    :func:`kit.doctor.overhead._exposed`: the job steps at its slowest host's pace)."""
    from kit.doctor.overhead import _counts, _events, _exposed, _per_step, _view

    per, each = [], []
    for f in files:
        v = _view(f)
        ps = _per_step(v)
        if ps is None:
            continue
        ev = _events(v, ps)
        ops, rt, _ = _counts(ev)
        per.append({"ops": ops, "runtime": rt, "traced_us": float(ps["dur"].median()),
                    "gpu_compute_us": float(ps["gpu_compute_us"].median())})
        each.append([_exposed(v, ps, ev, c, 0.0)[0] for c in GRID])
    return per, [max(c[i] for c in each) for i in range(len(GRID))]


def point(name: str, files: list[Path], overhead_us: float, unprof: float, meta: dict) -> dict:
    """A job's measured overhead, ops and runtime calls per step, and its exposure curve (:func:`curves`)."""
    per, curve = curves(files)
    ovh = overhead_us
    ops = max(p["ops"] for p in per)
    gpu = max(p["gpu_compute_us"] for p in per)
    curve = [round(x, 1) for x in curve]
    c = solve(curve, ovh)
    left_out = (f"GPU-bound without the profiler (unprofiled step {unprof / 1e3:.2f} ms against {gpu / 1e3:.2f} ms of "
                f"GPU compute): its host's profiler time hides behind the GPU" if unprof < GPU_BOUND * gpu else
                None if c is not None else
                "no overhead measured (kit.capture's unprofiled steps as slow as the traced ones)" if ovh <= 0 else
                "its host's profiler time hides behind its GPU at any cost" if curve[-1] < 0.5 * ovh else
                f"its measured overhead is all the GPU idle time the replay can remove ({curve[-1] / 1e3:.2f} ms): any "
                f"cost above {next(g for g, e in zip(GRID, curve) if e >= 0.99 * curve[-1])} us per op fits")
    return {"case": name, "overhead_us": round(ovh, 1), "ops_per_step": round(ops, 1),
            "runtime_per_step": round(max(p["runtime"] for p in per), 1), "unprofiled_us": unprof,
            "traced_us": round(statistics.median(p["traced_us"] for p in per), 1), "gpu_compute_us": round(gpu, 1),
            "record_shapes": bool(meta.get("record_shapes")), "with_stack": bool(meta.get("with_stack")),
            "world_size": int(meta.get("world_size") or 1), "exposed_us": curve,
            "left_out": left_out, "us_per_op": c if not left_out else None}


def solve(curve: list[float], overhead_us: float) -> float | None:
    """The per-op cost at which the exposure curve reaches the measured overhead (linear between grid points);
    None where no cost of the grid does (the host's profiler time hides behind the GPU: the case says nothing about
    the cost, or the measured overhead is all it can remove) or nothing was measured."""
    if overhead_us <= 0 or curve[-1] < overhead_us:
        return None
    for i in range(1, len(GRID)):
        if curve[i] >= overhead_us:
            lo, hi = curve[i - 1], curve[i]
            f = (overhead_us - lo) / (hi - lo) if hi > lo else 1.0
            return round(GRID[i - 1] + f * (GRID[i] - GRID[i - 1]), 3)
    return None


def exposed_at(curve: list[float], c: float) -> float:
    """The exposure curve at per-op cost ``c`` (linear between grid points)."""
    i = min(len(GRID) - 1, max(1, next((k for k, g in enumerate(GRID) if g >= c), len(GRID) - 1)))
    f = (c - GRID[i - 1]) / (GRID[i] - GRID[i - 1])
    return curve[i - 1] + f * (curve[i] - curve[i - 1])


def fit(points: list[dict]) -> dict:
    """The median per-op cost of the cases that carry one and each case's leave-one-out check: the others' median
    cost through its own exposure curve, against its measured overhead."""
    kept = [p for p in points if not p["left_out"] and p["us_per_op"]]
    for p in kept:
        others = [q["us_per_op"] for q in kept if q is not p]
        if others:
            est = exposed_at(p["exposed_us"], statistics.median(others))
            p["leave_one_out"] = {"estimate_us": round(est, 1),
                                  "ratio": round(est / p["overhead_us"], 2) if p["overhead_us"] > 0 else None}
    return {"us_per_op": round(statistics.median(p["us_per_op"] for p in kept), 3) if kept else None,
            "cases": len(kept)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpora", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, help="write the table here (recorded/profiler_overhead/<machine>-jobs.json)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    points, machine = [], {}
    for corpus in a.corpora:
        for truth in sorted(corpus.glob("*/truth.json")):
            if int(json.loads(truth.read_text()).get("world_size") or 1) < 2:
                continue  # multi-process jobs only: one-GPU jobs pay the isolated loops' per-op cost (FINDINGS.md)
            p = case_point(truth.parent)
            if p is not None:
                points.append(p)
                t = json.loads(truth.read_text())
                machine = {"device": t.get("device"), "torch": t.get("torch"), "cuda_runtime": t.get("cuda"),
                           "nccl": t.get("nccl"), "host_cpu": t.get("host_cpu")}
    if not points:
        print("overhead_fit: no case with a measured overhead", file=sys.stderr)
        return 2
    settings = []
    for shapes, stack in sorted({(p["record_shapes"], p["with_stack"]) for p in points}):
        mine = [p for p in points if (p["record_shapes"], p["with_stack"]) == (shapes, stack)]
        f = fit(mine)
        if f["us_per_op"] is not None:
            settings.append({"cuda": True, "record_shapes": shapes, "with_stack": stack, "distributed": True,
                             "world_sizes": sorted({p["world_size"] for p in mine}), "us_per_op": f["us_per_op"],
                             "us_per_runtime": 0.0, "cases": f["cases"]})
    table = {"kind": "jobs", "machine": machine, "settings": settings, "points": points,
             "how": "tests/corpus/overhead_fit.py: per-op cost = median over the corpus jobs of the cost at which the "
                    "profiler time that lengthens the job's step (recorded ops x cost, replayed against the GPU's "
                    "work: kit.doctor.overhead._exposed) equals kit.capture's measured overhead (runtime calls "
                    "folded in)",
             "sources": [str(c) for c in a.corpora]}
    # each list of numbers (the exposure curves) on one line
    text = re.sub(r"\[\s+([-\d.,\s]+?)\s+\]", lambda m: "[" + ", ".join(m.group(1).split(",")).replace("  ", "")
                  .replace("\n", "").replace(" ,", ",") + "]", json.dumps(table, indent=1)) + "\n"
    if a.out:
        a.out.write_text(text)
    for p in points:
        loo = p.get("leave_one_out") or {}
        print(f"{p['case']:45s} {p['overhead_us'] / 1e3:6.2f} ms {p['ops_per_step']:6.0f} ops "
              + (f"{p['us_per_op']:5.2f} us/op" if p["us_per_op"] is not None else f"  left out: {p['left_out']}")
              + (f"  leave-one-out {loo['estimate_us'] / 1e3:.2f} ms = {loo['ratio']}x" if loo else ""))
    print(json.dumps(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
