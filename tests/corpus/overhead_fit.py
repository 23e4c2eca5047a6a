"""The profiler's per-op host cost on real jobs: fitted on the multi-GPU corpus cases whose overhead kit.capture
measured (traced step minus the unprofiled median, :mod:`kit.doctor.overhead`), for traces that carry no
unprofiled step time -- where ``benchmarks/bench_profiler_overhead.py``'s isolated-op loops give 3-5x less than
real jobs pay (FINDINGS.md).

Per case: the measured overhead (median over ranks), the recorded ``aten::`` ops per step of the rank with most
(its host sets the pace: every rank but an input-bound one runs the same ops), the per-op cost = overhead / ops.
Cases whose step without the profiler is GPU-bound (unprofiled step < :data:`GPU_BOUND` x the slowest rank's GPU
compute) are left out: their host overhead hides behind the GPU. The table's cost is the median over the cases
kept, runtime calls folded into it (they come with the ops), and each case is checked leave-one-out: the median of
the others' costs x its ops against its measured overhead.

    python tests/corpus/overhead_fit.py tests/data/doctor/corpus-h100x2 tests/data/doctor/corpus-h100x4 \\
        --out recorded/profiler_overhead/h100-jobs.json

Exit status 0; 2 when no case has a measured overhead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_BOUND = 1.25
"""a case is GPU-bound without the profiler when its unprofiled step is below this x its slowest GPU's compute"""


def case_point(case: Path) -> dict | None:
    """One case's measured overhead, ops and runtime calls per step; None without a measured overhead."""
    from kit.doctor.overhead import _counts, _per_step, _view, overhead

    t = json.loads((case / "truth.json").read_text())
    per = []
    for f in sorted(case.glob("*.json.gz")):
        v = _view(f)
        o, ps = overhead(v), _per_step(v)
        if o.basis != "measured" or ps is None:
            return None
        ops, rt, _ = _counts(v, ps)
        per.append({"overhead_us": o.overhead_us, "ops": ops, "runtime": rt, "traced_us": o.traced_step_us,
                    "gpu_compute_us": float(ps["gpu_compute_us"].median())})
    if not per:
        return None
    unprof = float(t["step_us_unprofiled"]["median"])
    ops = max(p["ops"] for p in per)
    ovh = statistics.median(p["overhead_us"] for p in per)
    gpu = max(p["gpu_compute_us"] for p in per)
    return {"case": f"{case.parent.name}/{case.name}", "overhead_us": round(ovh, 1), "ops_per_step": round(ops, 1),
            "runtime_per_step": round(max(p["runtime"] for p in per), 1), "unprofiled_us": unprof,
            "traced_us": round(statistics.median(p["traced_us"] for p in per), 1), "gpu_compute_us": round(gpu, 1),
            "record_shapes": bool(t.get("record_shapes")), "with_stack": bool(t.get("with_stack")),
            "world_size": int(t.get("world_size") or 1),
            "gpu_bound": unprof < GPU_BOUND * gpu, "us_per_op": round(ovh / ops, 3) if ops else None}


def fit(points: list[dict]) -> dict:
    """The median per-op cost of the host-bound cases and each case's leave-one-out check."""
    kept = [p for p in points if not p["gpu_bound"] and p["us_per_op"]]
    for p in kept:
        others = [q["us_per_op"] for q in kept if q is not p]
        if others:
            est = statistics.median(others) * p["ops_per_step"]
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
             "how": "tests/corpus/overhead_fit.py: per-op cost = median over host-bound corpus jobs of kit.capture's "
                    "measured overhead / recorded ops per step (runtime calls folded in)",
             "sources": [str(c) for c in a.corpora]}
    text = json.dumps(table, indent=1) + "\n"
    if a.out:
        a.out.write_text(text)
    for p in points:
        loo = p.get("leave_one_out") or {}
        print(f"{p['case']:45s} {p['overhead_us'] / 1e3:6.2f} ms {p['ops_per_step']:6.0f} ops "
              f"{p['us_per_op']:5.2f} us/op{'  (GPU-bound: left out)' if p['gpu_bound'] else ''}"
              + (f"  leave-one-out {loo['estimate_us'] / 1e3:.2f} ms = {loo['ratio']}x" if loo else ""))
    print(json.dumps(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
