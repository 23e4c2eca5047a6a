"""price22 (session 12): each probe window's features -- stack17's features.py (overhead_eval.rank_features, Python
frames in the steps' span) plus the frames off the ops: per step, the Python frames that start on a thread that
records ops but more than 1 ms from any of its ops (as kit.traces' _frames_off), and how many of those are clock reads
(perf_counter/time/monotonic), plus TraceInfo's file-level counts and the traced steps' own-time spread.
python3 recorded/profiler_overhead/multi/offops/features.py ROOT OUT.json [procs] [seconds] (the pool, the deadline and the
windows: tests/corpus/overhead_eval.features_main, shared with stack/features.py since session 13)"""
import gzip
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "corpus"))
CLOCK = ("perf_counter", "built-in function time>", "monotonic", "process_time", "thread_time")


def one(f):
    t0 = time.time()
    import overhead_eval as E
    feat, err = E.window_features(f)
    if feat is None:
        return str(f), None, err, time.time() - t0
    try:
        import numpy as np

        from kit import traces
        from kit.doctor.overhead import _per_step, _view
        from kit.traces.frames import short_threads
        v = _view(str(f))
        ps = _per_step(v)
        a, b = float(ps["ts"].min()), float(ps["end"].max())
        raw = json.loads(gzip.open(f, "rt").read())
        ev = raw["traceEvents"] if isinstance(raw, dict) else raw
        n = max(1, feat["steps"])
        py = [e for e in ev if e.get("cat") == "python_function"]
        ops = [e for e in ev if e.get("cat") == "cpu_op"]
        pin = [e for e in py if a <= float(e.get("ts", -1)) < b]
        oa = np.array([float(e["ts"]) for e in ops]); ob = oa + np.array([float(e.get("dur", 0)) for e in ops])
        ot = np.array([float(e.get("tid")) if isinstance(e.get("tid"), (int, float)) else np.nan for e in ops])
        sa, sb, st = short_threads(oa, ob, ot)
        off = []
        for e in pin:
            t = e.get("tid")
            k = st == (float(t) if isinstance(t, (int, float)) else np.nan)
            if not k.any():
                continue
            x = float(e["ts"]); i = np.searchsorted(sa[k], x, side="right") - 1
            if not (i >= 0 and x < sb[k][max(i, 0)]):
                off.append(e)
        clock = sum(1 for e in off if any(c in e["name"] for c in CLOCK))
        # stretches of off-op frames per thread (starts < 1 ms apart); in each, the frames from its first clock read
        # to its last (a loop to a deadline) where it reads the clock more than twice
        timed, stretches = 0, []
        byt = {}
        for e in off:
            byt.setdefault(e.get("tid"), []).append(e)
        for t, es in byt.items():
            es.sort(key=lambda e: float(e["ts"]))
            cur = [es[0]]
            for e in es[1:] + [None]:
                if e is not None and float(e["ts"]) - float(cur[-1]["ts"]) < 1000:
                    cur.append(e)
                    continue
                k = [i for i, x in enumerate(cur) if any(c in x["name"] for c in CLOCK)]
                tf = (k[-1] - k[0] + 1) if len(k) > 2 else 0
                timed += tf
                stretches.append([round(float(cur[0]["ts"]) - a, 1), round(float(cur[-1]["ts"]) - a, 1), len(cur), len(k), tf])
                cur = [e] if e is not None else []
        # the off-op frames' outermost extent per thread: the stretch they cover (us per step)
        span = 0.0
        if off:
            fa = np.array([float(e["ts"]) for e in off]); fb = fa + np.array([float(e.get("dur", 0)) for e in off])
            from kit.traces.intervals import union_np
            ua, ub = union_np(fa, fb)
            span = float((ub - ua).sum())
        t = traces.load_trace(str(f))
        feat.update(py_frames=len(pin) / n, py_off=len(off) / n, py_off_clock=clock / n, py_off_span_us=span / n,
                    py_off_timed=timed / n, py_off_stretches=[x for x in stretches if x[2] >= 20],
                    file_python_frames=t.info.python_frames, file_python_frames_off_ops=t.info.python_frames_off_ops,
                    mem_events=sum(1 for e in ev if e.get("name") == "[memory]" and a <= float(e.get("ts", -1)) < b) / n,
                    step_durs=[round(float(x), 1) for x in ps["dur"]], bytes_gz=os.path.getsize(f))
    except Exception as e:  # noqa: BLE001
        feat["extra_error"] = f"{type(e).__name__}: {e}"
    return str(f), feat, None, time.time() - t0


def main():
    import overhead_eval as E

    E.features_main(one, "price22 features.py: probe windows with shapes / +stack (ABBA)")


if __name__ == "__main__":
    main()
