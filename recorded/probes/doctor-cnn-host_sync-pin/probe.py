"""Why the CNN host_sync case's DataLoader is slower in its profiled steps (FINDINGS: 6-9 ms against 2.2 ms).

In the committed trace the extra time is inside ``aten::pin_memory`` -> ``aten::copy_`` (5.3 and 4.3 ms against
0.2 ms in the control). This probe times, per step, the DataLoader's ``next()`` and inside it the pinning
(``torch.utils.data._utils.pin_memory.pin_memory``), and records the pinned batch's address, for the control and
the host_sync job of ``tests/corpus/planted.py``, unprofiled and under ``kit.capture`` (record_shapes on, as the
corpus case), with and without ``pin_memory``. Usage: python3 probe.py OUT_DIR [THREADS [unprofiled]]  (writes
OUT_DIR/probe.json)."""
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.utils.data._utils.pin_memory as pm

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "corpus"))
import planted as P  # noqa: E402
from kit import capture  # noqa: E402

out = Path(sys.argv[1])
if len(sys.argv) > 2:  # intra-op threads (the copy into the pinned buffer is a parallel_for over them)
    torch.set_num_threads(int(sys.argv[2]))
only_none = len(sys.argv) > 3  # unprofiled only
out.mkdir(parents=True, exist_ok=True)
real_pin = pm.pin_memory
rec = {}


def timed_pin(data, device=None):
    t = time.perf_counter()
    r = real_pin(data, device)
    rec["pin_us"] = (time.perf_counter() - t) * 1e6
    rec["ptr"] = r[0].data_ptr() if isinstance(r, (list, tuple)) else None
    return r


pm.pin_memory = timed_pin
cases = P._cases()
results = []
for base in ("cnn-control", "cnn-host_sync"):
    for pin in (True, False):
        for prof in (("none",) if only_none else ("none", "kit.capture")):
            case = dict(cases[base])
            job = P.Job(case, "cuda", {**P.SIZES["cuda"]["cnn"], **case["sizes"]})
            if not pin:
                job.loader = torch.utils.data.DataLoader(job.loader.dataset, batch_size=job.size["batch"],
                                                         num_workers=0, pin_memory=False)
                job.it = iter(job.loader)
            inner = job.it
            steps = []

            class Timed:
                def __next__(self):
                    rec.clear()
                    t = time.perf_counter()
                    v = next(inner)
                    steps.append({"next_us": (time.perf_counter() - t) * 1e6, **rec})
                    return v

            job.it = Timed()
            for _ in range(5):
                job.step()
            torch.cuda.synchronize()
            steps.clear()
            walls = []
            if prof == "none":
                for _ in range(20):
                    t = time.perf_counter()
                    job.step()
                    walls.append((time.perf_counter() - t) * 1e6)
            else:
                d = out / f"{base}-pin{int(pin)}"
                with capture.profile(d, cuda=True, active=P.PROFILED_STEPS, record_shapes=True) as cap:
                    while not cap.done:
                        t = time.perf_counter()
                        job.step()
                        walls.append((time.perf_counter() - t) * 1e6)
                        cap.step()
            torch.cuda.synchronize()
            job.close()
            r = {"case": base, "pin_memory": pin, "profiler": prof, "steps": steps, "host_step_us": walls,
                 "next_us_median": statistics.median(s["next_us"] for s in steps),
                 "pin_us_median": statistics.median(s.get("pin_us", 0.0) for s in steps),
                 "distinct_pinned_ptrs": len({s.get("ptr") for s in steps if s.get("ptr")})}
            results.append(r)
            print(f"{base:14} pin={int(pin)} {prof:11} next {r['next_us_median']:8.0f} us  pin "
                  f"{r['pin_us_median']:8.0f} us  per step: {[round(s['next_us']) for s in steps]}  "
                  f"pin: {[round(s.get('pin_us', 0)) for s in steps]}  pinned buffers {r['distinct_pinned_ptrs']}",
                  flush=True)
(out / "probe.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "threads": torch.get_num_threads(), "results": results}, indent=1))
