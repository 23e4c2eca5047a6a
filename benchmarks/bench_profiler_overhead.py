"""The profiler's own host cost per recorded event, on this machine, for each profiler setting the doctor meets:
what ``kit.doctor.overhead`` multiplies a trace's recorded events per step by when the trace carries no
unprofiled step time (``kitCapture.unprofiled_step_us``).

Two host-bound loops of tiny ops (each step synchronised at its end, in both conditions alike):

* ``launch``: ``y = x + 1`` on a tiny tensor -- one ``aten::add`` and, on a GPU, one ``cudaLaunchKernel`` each;
* ``view``:   ``x.view(-1)`` -- an op that launches nothing (``aten::view``).

Each loop is timed per step (``time.perf_counter`` between step ends, many steps, median) under
``torch.profiler.profile`` and right after without it (paired: a busy host drifts), ``--rounds`` pairs per setting
(the median of their differences is kept), with each setting: activities CPU (+ CUDA on a GPU), ``record_shapes`` off/on,
``with_stack`` off/on. The recorded events per step are counted in the exported trace with the kit's own reader
(``kit.traces.load_trace(cpu="all")``: ``cpu_op``, ``cuda_runtime``/``cuda_driver``, ``user_annotation``), and the
extra time per step is split over them by least squares over the two loops: ``us_per_op`` (an ``aten::`` op) and
``us_per_runtime`` (a CUDA runtime/driver call, on a GPU). Every sample is kept.

    python benchmarks/bench_profiler_overhead.py --out recorded/profiler_overhead/cpu-<host>.json   # here
    python benchmarks/bench_profiler_overhead.py --device cuda --out OUT/h100.json                  # on a GPU

Exit status 0; 2 on bad arguments (no GPU for ``--device cuda``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _loop(kind: str, x, n: int):
    if kind == "launch":
        for _ in range(n):
            x + 1
    else:
        for _ in range(n):
            x.view(-1)


def _steps(kind, x, n, steps, sync, prof=None) -> list[float]:
    out = []
    t = time.perf_counter()
    for _ in range(steps):
        _loop(kind, x, n)
        sync()
        now = time.perf_counter()
        out.append((now - t) * 1e6)
        t = now
        if prof is not None:
            prof.step()
    return out


def _count(path: Path) -> dict[str, float]:
    """Recorded host events per ProfilerStep window, by kind (the kit's reader, every CPU event)."""
    from kit import traces

    cpu = traces.load_trace(path, cpu="all", cache=False).cpu
    names = cpu["name"].astype(str)
    steps = cpu[(cpu["cat"] == "user_annotation") & names.str.startswith("ProfilerStep#")]
    inside = None
    for s in steps.itertuples():
        m = (cpu["ts"] >= s.ts) & (cpu["ts"] < s.end)
        inside = m if inside is None else inside | m
    ev = cpu[inside & ~names.str.startswith("ProfilerStep#")]
    n = max(1, len(steps))
    cats = ev["cat"].astype(str)
    return {"op": float((cats == "cpu_op").sum() / n),
            "runtime": float(cats.isin(["cuda_runtime", "cuda_driver"]).sum() / n),
            "annotation": float((cats == "user_annotation").sum() / n)}


def measure(device: str, n: int, steps: int, warm: int, rounds: int = 3) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from kit.sysinfo import software

    cuda = device == "cuda"
    x = torch.ones(4, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    base = {}
    for kind in ("launch", "view"):
        _steps(kind, x, n, warm, sync)
        base[kind] = _steps(kind, x, n, steps, sync)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    settings = [{"cuda": cuda, "record_shapes": rs, "with_stack": ws}
                for rs, ws in itertools.product((False, True), (False, True))]
    with tempfile.TemporaryDirectory() as tmp:
        for st in settings:
            per = {}
            for kind in ("launch", "view"):
                path = Path(tmp) / f"{kind}.json.gz"
                prof_s, unprof_s, extras = [], [], []
                for _ in range(rounds):  # profiled, then the same loop unprofiled right after: drift cancels
                    with profile(activities=acts, record_shapes=st["record_shapes"], with_stack=st["with_stack"],
                                 schedule=schedule(wait=0, warmup=1, active=steps),
                                 on_trace_ready=lambda p, path=path: p.export_chrome_trace(str(path))) as prof:
                        _steps(kind, x, n, 1, sync, prof)  # the warm-up step
                        samples = _steps(kind, x, n, steps, sync, prof)
                    paired = _steps(kind, x, n, steps, sync)
                    prof_s += samples
                    unprof_s += paired
                    extras.append(statistics.median(samples) - statistics.median(paired))
                counts = _count(path)
                per[kind] = {"samples_us": [round(s, 1) for s in prof_s], "counts_per_step": counts,
                             "unprofiled_samples_us": [round(s, 1) for s in unprof_s],
                             "extra_us_per_round": [round(e, 1) for e in extras],
                             "extra_us_per_step": round(statistics.median(extras), 1)}
            # least squares over the two loops: extra = a * ops + b * runtime calls (b only on a GPU)
            import numpy as np

            A = np.array([[per[k]["counts_per_step"]["op"], per[k]["counts_per_step"]["runtime"]]
                          for k in ("launch", "view")])
            y = np.array([per[k]["extra_us_per_step"] for k in ("launch", "view")])
            if cuda:
                a, b = np.linalg.lstsq(A, y, rcond=None)[0]
            else:
                a, b = float(np.dot(A[:, 0], y) / max(1e-9, np.dot(A[:, 0], A[:, 0]))), 0.0
            rows.append({**st, "us_per_op": round(float(a), 3), "us_per_runtime": round(float(b), 3), "loops": per})
    info = {"device": torch.cuda.get_device_name() if cuda else "cpu", **software()}
    try:
        from kit.sysinfo import collect

        info["host"] = {k: v for k, v in collect().items() if k in ("cpu", "cpu_model", "cores", "hostname", "os")}
    except Exception as e:  # the measurement stands without it
        info["host_error"] = f"{type(e).__name__}: {e}"
    return {"what": "profiler host cost per recorded event (benchmarks/bench_profiler_overhead.py)",
            "ops_per_step": n, "steps": steps, "warm": warm, "rounds": rounds,
            "unprofiled_us": {k: {"median": round(statistics.median(v), 1), "samples": [round(s, 1) for s in v]}
                              for k, v in base.items()},
            "settings": rows, "machine": info,
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--ops", type=int, default=1000, help="ops per step (default 1000)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per condition (default 30)")
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="profiled/unprofiled pairs per setting; the median "
                    "difference is kept (default 3)")
    ap.add_argument("--out", type=Path, help="write the JSON here (default: print it)")
    a = ap.parse_args(argv)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_profiler_overhead: --device cuda without a GPU", file=sys.stderr)
        return 2
    res = measure(a.device, a.ops, a.steps, a.warm, a.rounds)
    for r in res["settings"]:
        print(f"cuda={r['cuda']!s:5} record_shapes={r['record_shapes']!s:5} with_stack={r['with_stack']!s:5}  "
              f"{r['us_per_op']:7.2f} us/op  {r['us_per_runtime']:7.2f} us/runtime call")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {a.out}")
    else:
        print(json.dumps(res)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
