"""stack17: each probe window's features (tests/corpus/overhead_eval.py's multi_features format, plus with_stack /
profile_memory from the kit.capture sidecar and per-step counts of Python frames and [memory] events), computed in
parallel on the device.  python3 recorded/profiler_overhead/multi/stack/features.py ROOT OUT.json [procs]"""
import gzip
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "corpus"))


def one(f):
    t0 = time.time()
    import overhead_eval as E
    feat, err = E.window_features(f)
    if feat is None:
        return str(f), None, err, time.time() - t0
    # Python frames and [memory] instants inside the steps' span (the trace's raw events)
    try:
        from kit import traces
        from kit.doctor.overhead import _per_step, _view
        v = _view(str(f))
        ps = _per_step(v)
        a, b = float(ps["ts"].min()), float(ps["end"].max())
        raw = json.loads(gzip.open(f, "rt").read())
        ev = raw["traceEvents"] if isinstance(raw, dict) else raw
        n = max(1, feat["steps"])
        py = sum(1 for e in ev if e.get("cat") == "python_function" and a <= float(e.get("ts", -1)) < b)
        mem = sum(1 for e in ev if e.get("name") == "[memory]" and a <= float(e.get("ts", -1)) < b)
        feat.update(py_frames=py / n, mem_events=mem / n, mem_events_all=sum(1 for e in ev if e.get("name") == "[memory]"),
                    bytes_gz=os.path.getsize(f))
    except Exception as e:  # noqa: BLE001
        feat["extra_error"] = f"{type(e).__name__}: {e}"
    return str(f), feat, None, time.time() - t0


def main():
    import overhead_eval as E

    E.features_main(one, "stack17 features.py: probe windows with shapes / +stack / +stack+memory",
                    order=lambda f: (f.stat().st_mtime_ns // 10**9 // 40, str(f)))


if __name__ == "__main__":
    main()
