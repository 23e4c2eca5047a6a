"""Records ``trace.json.gz`` here: a CPU trace with ``record_shapes`` and ``with_stack``, 1 recorded step, each with
a few ops, then three stretches without an op on the main thread -- a pure-Python loop of a fixed amount of work
(``ord`` over a string: its frames are the tracer's to pay), a loop that runs to a deadline (``json.dumps`` until
0.5 ms have passed, reading ``perf_counter`` each round: the tracer does not lengthen it) and a ``time.sleep``.
Read by tests/test_profiler_overhead.py (the trace layer's stretches of Python off the ops).

    python tests/data/python-off-ops/record.py      # torch 2.11, CPU; ~20 KB
"""
import gzip
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

OUT = Path(__file__).resolve().parent / "trace.json.gz"
WORK = "kit" * 80  # 240 characters: 480 frames (ord, append)


def step(x):
    y = (x @ x).relu().sum()
    codes = []
    for ch in WORK:  # pure Python, no op: a fixed amount of work
        codes.append(ord(ch))
    t, rec = time.perf_counter(), {"step": 0, "codes": len(codes)}
    while time.perf_counter() - t < 0.0005:  # runs to a deadline
        rec["step"] += 1
        json.dumps(rec)
    time.sleep(0.003)
    return y + (x * 2).mean()


def main():
    x = torch.randn(64, 64)
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True,
                     schedule=schedule(wait=0, warmup=1, active=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(f"{tmp}/t.json")) as prof:
            for _ in range(2):
                step(x)
                prof.step()
        raw = json.loads(Path(f"{tmp}/t.json").read_text())
        OUT.write_bytes(gzip.compress(json.dumps(raw, separators=(",", ":")).encode(), 9, mtime=0))
    print(OUT, OUT.stat().st_size)


if __name__ == "__main__":
    main()
