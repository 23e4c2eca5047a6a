"""Derive ``tests/data/doctor/`` (small traces for the CPU tests of ``kit doctor``) from the runs in
``recorded/h200x2/doctor/``.

    python tests/data/doctor/make_test_data.py

Each case keeps its **last** ``KEEP[case]`` recorded steps: every event (host and GPU, all streams) from the
start of the first kept ``ProfilerStep#N`` on -- the trace the profiler would have written had its window begun
there (the GPU work still queued from earlier steps, which a GPU running behind its host executes inside the
window, stays, as it does at the start of any profiled window; so does GPU work already running at that start: a
collective spinning for a late peer across it is the window's waiting, and dropping it would leave GPU idle the
recorded trace does not have). Metadata events and the header are unchanged;
``"kitTrimmed": {"source", "kept_steps"}`` is added to the header.

The collectives sweep of the same machine (run ``20261123-053754-vm-8edfff``) is committed once, as the run
directory ``kit doctor --sweep`` reads, in ``sweep_h200x2/`` (meta.json, rows.csv.gz; its logs stay beside the
traces in ``recorded/h200x2/doctor/collectives/``). The sidecars (``capture_rank<r>.json``) are copied beside
the traces.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import shutil
from pathlib import Path

OUT = Path(__file__).resolve().parent
ROOT = OUT.parents[2]
HERE = ROOT / "recorded" / "h200x2" / "doctor"
"""the full recorded traces (the source)"""
KEEP = {"contention": 2,  # a contended and an uncontended step: the all-reduce alone and beside the matmuls
        "cuda-graph-per-param": 3, "cuda-graph-per-param-mixing0": 3}  # graph replays: small already
"""recorded steps kept per case (default 1)"""


@functools.cache
def _cut():
    """``cut`` of ``tests/corpus/trim.py``: the one trim of a trace's events, shared with the multi-GPU corpus."""
    spec = importlib.util.spec_from_file_location("corpus_trim", ROOT / "tests" / "corpus" / "trim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.cut


def trim(src: Path, dst: Path, keep: int) -> dict:
    with gzip.open(src, "rt") as f:
        data = json.load(f)
    ev = data["traceEvents"]
    data["traceEvents"], kept = _cut()(ev, keep)
    data["kitTrimmed"] = {"source": str(src.relative_to(ROOT)), "kept_steps": [e["name"] for e in kept]}
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt", compresslevel=9) as f:
        json.dump(data, f, separators=(",", ":"))
    return {"events": len(ev), "kept": len(data["traceEvents"]), "steps": [e["name"] for e in kept]}


def main() -> None:
    for case in sorted(p for p in HERE.iterdir() if p.is_dir() and (p / "trace_rank0.json.gz").exists()):
        for r in (0, 1):
            src = case / f"trace_rank{r}.json.gz"
            res = trim(src, OUT / case.name / src.name, KEEP.get(case.name, 1))
            shutil.copy2(case / f"capture_rank{r}.json", OUT / case.name / f"capture_rank{r}.json")
            print(f"{case.name}/{src.name}: {res['kept']} of {res['events']} events, {res['steps']}, "
                  f"{(OUT / case.name / src.name).stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
