"""stack17: each probe window's features (tests/corpus/overhead_eval.py's multi_features format, plus with_stack /
profile_memory from the kit.capture sidecar and per-step counts of Python frames and [memory] events), computed in
parallel on the device.  python3 recorded/profiler_overhead/multi/stack/features.py ROOT OUT.json [procs]"""
import gzip
import json
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "corpus"))


def one(f):
    t0 = time.time()
    try:
        import overhead_eval as E
        feat = E.rank_features(str(f))
    except Exception as e:  # noqa: BLE001
        return str(f), None, f"{type(e).__name__}: {e}", time.time() - t0
    if feat is None:
        return str(f), None, "no steps", time.time() - t0
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
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    procs = int(sys.argv[3]) if len(sys.argv) > 3 else os.cpu_count()
    deadline = time.time() + (float(sys.argv[4]) if len(sys.argv) > 4 else 1e9)
    files = sorted(root.glob("*x*/*/*/trace_rank*.json.gz"), key=lambda f: (f.stat().st_mtime_ns // 10**9 // 40, str(f)))
    print(f"features: {len(files)} traces, {procs} procs", flush=True)
    t0 = time.time()
    got = {}
    p = Pool(procs)
    it = p.imap_unordered(one, files)
    for _ in files:
        try:
            f, feat, err, dt = it.next(timeout=max(0.1, deadline - time.time()))
        except Exception as e:  # noqa: BLE001  (the deadline)
            print(f"features: stopped at the deadline with {len(got)} of {len(files)} ({type(e).__name__})", flush=True)
            break
        got[f] = feat
        print(f"  {Path(f).relative_to(root)} {dt:.1f} s {err or ''}", flush=True)
    p.terminate()
    sys.path.insert(0, str(ROOT / "tests" / "corpus"))
    import overhead_eval as E

    jobs = E.probe_windows(root, lambda f: got.get(str(f)))  # the same window walk as overhead_eval's --multi-from
    out.write_text(json.dumps({"how": "stack17 features.py: probe windows with shapes / +stack / +stack+memory",
                               "jobs": jobs}))
    print(f"features: {len(jobs)} windows in {time.time() - t0:.0f} s -> {out}", flush=True)


if __name__ == "__main__":
    main()
