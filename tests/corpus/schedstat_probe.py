"""How the kernel shares a CPU-contended rank's core, unprofiled and traced: ``planted_multi``'s ``cpu_rank`` pairs
(every thread of one rank's process pinned to one core shared with busy loops; :class:`planted_multi.Contention`)
recorded as ``planted_multi --pair`` records them (one job, the control and the fault arm by turns in ABBA rounds,
then each arm traced with ``tensorboard_trace_handler``), with the scheduler's own accounts read at every step.

Per step, on every rank: the step's CUDA-event time and the host's ``perf_counter`` period (as
``planted.time_unprofiled``), and from ``/proc/self/task/<tid>/schedstat`` of the main thread and the autograd
engine's device threads (``pt_autograd_*``) the time each ran on a CPU and the time each waited on a run queue
(runnable, not running), with the main thread's voluntary and involuntary context switches
(``getrusage(RUSAGE_THREAD)``); on the contended rank also each busy loop's run time. Per block (its first and last
step), the same for every thread of the process, with its name. What a step's host did then reads directly: run
(on the core), run-queue wait (the core taken by another task: what the doctor's quiet time stands for), and the
rest, asleep (blocked: waiting for the GPU, a peer, a lock). The traced steps are read the same way, so the
scheduler's share under the profiler sits beside the trace of the same steps.

Once per rank before the job (its core free, and again on the contended rank with the busy loops on): how CUDA waits
(``cuCtxGetFlags``'s scheduling flags, and what a ``torch.cuda.synchronize`` behind a 100 ms kernel and 5000 launches
behind it (a full queue) cost the thread on the CPU: spinning runs, blocking sleeps).

Each pair writes ``<out>/<case>/`` as ``planted_multi --pair`` does (traces, ``truth.json``, so the doctor can be
scored on them) and ``<out>/sched.json``: per rank, per arm, per block the per-step readings.

    python tests/corpus/schedstat_probe.py --pair ddp_cpu --out /tmp/probe --steps 30 --alternations 6
    python tests/corpus/schedstat_probe.py --pair ddp_cpu --out /tmp/probe --device cpu --steps 5 --alternations 2
    python tests/corpus/schedstat_probe.py --out /tmp/probe --summarize   # what is committed (summarize)

``PLANTED_MULTI_RANK`` picks the contended rank (as for ``planted_multi``). Exit status 0, 1 a rank failed, 2 bad
arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
import planted_multi as PM  # noqa: E402  (beside it: run as a script, its folder is on sys.path)
TRACED_STEPS = 4
"""steps of each arm's trace (``schedule(wait=1, warmup=1, active=TRACED_STEPS)``)"""


def _read3(fd) -> list[int]:
    return [int(x) for x in os.pread(fd, 128, 0).split()[:3]]


def _comm(tid) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    return "?"


def _switches(path: str) -> list[int]:
    v = n = -1
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                v = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                n = int(line.split()[1])
    return [v, n]


def _cpus(tid: int) -> str:
    """The thread's allowed CPUs (its affinity), as a count where it has more than four."""
    try:
        c = sorted(os.sched_getaffinity(tid))
    except OSError:
        return "?"
    return ",".join(map(str, c)) if len(c) <= 4 else f"{len(c)} cpus"


class Sched:
    """The scheduler's accounts of this process's threads (and of the busy loops, where this rank has them)."""

    def __init__(self, spinners=()):
        self.main = threading.get_native_id()
        self.spin_pids = [p.pid for p in spinners]
        self.fds = {}
        self.refresh()

    def _open(self, path):
        if path not in self.fds:
            with contextlib.suppress(OSError):
                self.fds[path] = os.open(path, os.O_RDONLY)
        return self.fds.get(path)

    def refresh(self) -> None:
        """Find the autograd threads (they start at the first backward)."""
        self.autograd = sorted(int(t) for t in os.listdir("/proc/self/task") if _comm(t).startswith("pt_autograd"))
        self.step_paths = ([f"/proc/self/task/{self.main}/schedstat"]
                           + [f"/proc/self/task/{t}/schedstat" for t in self.autograd]
                           + [f"/proc/{p}/schedstat" for p in self.spin_pids])

    def step(self) -> list:
        """[perf_counter_ns, time_ns, main nvcsw, main nivcsw, [run, wait, slices] per step path]."""
        ru = resource.getrusage(resource.RUSAGE_THREAD)
        out = [time.perf_counter_ns(), time.time_ns(), ru.ru_nvcsw, ru.ru_nivcsw]
        for p in self.step_paths:
            fd = self._open(p)
            try:
                out.append(_read3(fd) if fd is not None else None)
            except OSError:
                out.append(None)
        return out

    def threads(self) -> dict:
        """Every thread of this process: name, [run, wait, slices], [voluntary, involuntary switches], allowed
        CPUs; the busy loops' under ``spin:<pid>``."""
        out = {}
        for t in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError, ValueError):
                ss = [int(x) for x in Path(f"/proc/self/task/{t}/schedstat").read_text().split()[:3]]
                out[t] = [_comm(t), ss, _switches(f"/proc/self/task/{t}/status"), _cpus(int(t))]
        for p in self.spin_pids:
            with contextlib.suppress(OSError, ValueError):
                out[f"spin:{p}"] = ["spinner", [int(x) for x in Path(f"/proc/{p}/schedstat").read_text().split()[:3]],
                                    _switches(f"/proc/{p}/status"), _cpus(p)]
        return out

    def paths(self) -> list[str]:
        return ["main"] + [f"autograd:{t}" for t in self.autograd] + [f"spin:{p}" for p in self.spin_pids]


def cuda_waits(dev: str, sched: Sched) -> dict:
    """How CUDA waits on this thread: the context's scheduling flags, and the CPU a wait costs it."""
    out = {}
    with contextlib.suppress(Exception):
        lib = ctypes.CDLL("libcuda.so.1")
        flags = ctypes.c_uint(0)
        rc = lib.cuCtxGetFlags(ctypes.byref(flags))
        names = {0: "auto", 1: "spin", 2: "yield", 4: "blocking_sync"}
        out["cuCtxGetFlags"] = {"rc": rc, "flags": flags.value, "sched": names.get(flags.value & 7, "?")}
    if not dev.startswith("cuda"):
        return out
    main = f"/proc/self/task/{sched.main}/schedstat"
    fd = sched._open(main)
    torch.cuda.synchronize()
    # cycles for ~100 ms: torch.cuda._sleep spins the GPU for a clock count; calibrate with events
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(10_000_000)
    e.record()
    e.synchronize()
    cycles = int(10_000_000 * 100.0 / max(0.1, s.elapsed_time(e)))
    for what in ("synchronize", "launch_queue"):
        torch.cuda._sleep(cycles)
        a, t0 = _read3(fd), time.perf_counter_ns()
        ru0 = resource.getrusage(resource.RUSAGE_THREAD)
        if what == "synchronize":
            torch.cuda.synchronize()
        else:  # tiny launches until the queue is full: the host then waits for the 100 ms kernel
            x = torch.zeros(1, device=dev)
            for _ in range(5000):
                x.add_(1)
        b, t1 = _read3(fd), time.perf_counter_ns()
        ru1 = resource.getrusage(resource.RUSAGE_THREAD)
        torch.cuda.synchronize()
        out[what] = {"wall_us": round((t1 - t0) / 1e3, 1), "run_us": round((b[0] - a[0]) / 1e3, 1),
                     "runq_wait_us": round((b[1] - a[1]) / 1e3, 1),
                     "nvcsw": ru1.ru_nvcsw - ru0.ru_nvcsw, "nivcsw": ru1.ru_nivcsw - ru0.ru_nivcsw}
    return out


def _block(job, sched: Sched, n: int, prof=None) -> dict:
    """``n`` steps (``prof.step()`` after each where traced): the per-step readings and CUDA-event step times. A
    step's reading is taken before its ``prof.step()``, so each traced step's holds the previous ``prof.step()``.
    Every thread's readings (``threads_before``/``after``, a few ms of reading /proc) span the block; where traced,
    the schedule's warm-up step only (profiler on, its events discarded), so that no recorded step holds them."""
    cuda = job.dev.startswith("cuda")
    sched.refresh()
    before = sched.threads() if prof is None else None
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else []
    rows = [sched.step()]
    if cuda:
        ev[0].record()
    after = None
    for i in range(n):
        job.step()
        if cuda:
            ev[i + 1].record()
        rows.append(sched.step())  # before prof.step(): the last one writes the trace, in no step's reading
        if (prof is None and i == n - 1) or (prof is not None and i == 1):
            after = sched.threads()
        if prof is not None:
            prof.step()
            if i == 0:
                before = sched.threads()
    if cuda:
        torch.cuda.synchronize()
        samples = [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(n)]
    else:
        samples = [(b[0] - a[0]) / 1e3 for a, b in zip(rows, rows[1:])]
    return {"paths": sched.paths(), "rows": rows, "samples": [round(s, 1) for s in samples],
            "threads_before": before, "threads_after": after, "threads_steps": n if prof is None else 1}


def _traced(job, case: dict, out: Path, sched: Sched) -> dict:
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if job.dev.startswith("cuda") else [])
    with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=TRACED_STEPS),
                 on_trace_ready=tensorboard_trace_handler(str(out), use_gzip=True),
                 record_shapes=case["record_shapes"], with_stack=case["with_stack"]) as prof:
        blk = _block(job, sched, 2 + TRACED_STEPS, prof)
    blk["profiled_steps"] = f"the last {TRACED_STEPS} (schedule wait=1, warmup=1)"
    return blk


def _rank(rank, world, pair, root, warm, n, alternations, port, device):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    cuda = device == "cuda"
    dev = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            **({"device_id": torch.device(dev)} if cuda else {}))
    root = Path(root)
    t0 = time.time()
    arms = [PM.CASES[x] for x in PM.PAIRS[pair]]
    for c in arms:
        if rank == 0:
            (root / c["name"]).mkdir(parents=True, exist_ok=True)
            for f in (root / c["name"]).glob("*.json*"):
                f.unlink()
    dist.barrier()
    job = PM.MultiJob(arms[1], dev, rank, world)
    con = job.contention
    sched = Sched(con.procs if con is not None else ())
    waits = {}
    if con is not None:
        con.off()
    if cuda:
        torch.zeros(1, device=dev).add_(1)
    waits["free"] = cuda_waits(dev, sched)
    if con is not None:
        con.on()
        waits["contended"] = cuda_waits(dev, sched)
    dist.barrier()
    for c in arms:  # warm each arm
        job.arm(c)
        for _ in range(warm):
            job.step()
    res = {"rank": rank, "contended": con is not None, "main_tid": sched.main, "cuda_waits": waits,
           "blocks": {c["name"]: [] for c in arms}, "traced": {}}
    timing = {c["name"]: {"samples": [], "blocks": [], "position": [], "host": []} for c in arms}
    for r in range(alternations):
        for i, c in enumerate(PM.round_order(arms, r)):
            job.arm(c)
            job.step()  # settle after the switch (untimed, as planted_multi)
            b = _block(job, sched, n)
            b["round"], b["position"] = r, i
            res["blocks"][c["name"]].append(b)
            o = timing[c["name"]]
            o["blocks"].append([len(o["samples"]), len(o["samples"]) + n])
            o["position"].append(i)
            o["samples"] += b["samples"]
            o["host"] += [round((y[0] - x[0]) / 1e3, 1) for x, y in zip(b["rows"], b["rows"][1:])]
    dist.barrier()
    for c in arms:
        job.arm(c)
        res["traced"][c["name"]] = _traced(job, c, root / c["name"], sched)
        dist.barrier()
    timing = {k: PM.P.summarize(v["samples"]) | {"blocks": v["blocks"], "position": v["position"],
                                                 "host_period_us": v["host"]} for k, v in timing.items()}
    timings, allres = [None] * world, [None] * world
    dist.all_gather_object(timings, timing)
    dist.all_gather_object(allres, res)
    if rank == 0:
        env = {k: os.environ[k] for k in os.environ if k.startswith(("NCCL_", "TORCH_", "CUDA_"))}
        truths = PM._pair_truths(arms, world, device, timings, job.params_used, root, env, alternations, n)
        for name, truth in truths.items():
            truth["wall_s"] = round(time.time() - t0, 1)
            truth["recorded_by"] = "tests/corpus/schedstat_probe.py (per-step schedstat reads in every step)"
            PM._added(truth, root)
            (root / name / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
            s = truth["step_us_unprofiled"]
            added = "" if truth["added_us"] is None else f" added {truth['added_us'] / 1e3:+.2f} ms"
            print(f"{name:32s} {s['median'] / 1e3:8.2f} ms (p10 {s['p10'] / 1e3:.2f} p90 {s['p90'] / 1e3:.2f})"
                  f"{added}  [{truth['wall_s']} s]", flush=True)
        meta = {"pair": pair, "world": world, "device": device, "contended_rank": PM.ONE_RANK,
                "params": job.params_used, "uname": os.uname().release, "steps": n, "alternations": alternations,
                "row": "[perf_counter_ns, time_ns, main nvcsw, main nivcsw, then per path [run_ns, wait_ns, slices]]",
                "thread": "tid: [name, [run_ns, wait_ns, slices], [voluntary, involuntary switches], allowed cpus]"}
        (root / "sched.json").write_text(json.dumps({"meta": meta, "ranks": allres}, separators=(",", ":")))
    job.close()
    dist.barrier()
    dist.destroy_process_group()


STEP_COLUMNS = ("rank", "contended", "arm", "phase", "round", "step", "wall_us", "cuda_step_us", "main_run_us",
                "main_runq_us", "autograd_run_us", "autograd_runq_us", "spin_run_us", "spin_runq_us", "main_nvcsw",
                "main_nivcsw")
"""the per-step table :func:`summarize` writes: ``phase`` unprofiled or traced (the traced block's steps 0-1 are the
schedule's wait and warm-up), ``wall_us`` the host's period (``perf_counter``), ``*_run_us`` time on a CPU,
``*_runq_us`` time runnable on a run queue, ``spin`` the busy loops (the contended rank only)"""


def _threads(threads: dict, r: dict, phase: str, arm: str, b: dict, n: int) -> None:
    """Add block ``b``'s every-thread run and run-queue time (``n`` steps) to ``threads`` by rank, arm and phase."""
    acc = threads.setdefault(f"rank{r['rank']}/{arm}/{phase}", {"steps": 0, "threads": {}})
    acc["steps"] += n
    a, c = b["threads_before"] or {}, b["threads_after"] or {}
    for t, v in c.items():
        if t in a:
            o = acc["threads"].setdefault(v[0], {"run_us": 0.0, "runq_us": 0.0, "cpus": v[3] if len(v) > 3 else ""})
            o["run_us"] += (v[1][0] - a[t][1][0]) / 1e3
            o["runq_us"] += (v[1][1] - a[t][1][1]) / 1e3


def summarize(out: Path) -> None:
    """From ``out/sched.json``: ``sched_steps.csv.gz`` (one row per step of the contended rank, :data:`STEP_COLUMNS`)
    and ``sched_summary.json.gz`` (the meta, each rank's CUDA waits, and per rank, arm and phase every thread's run and
    run-queue time per step by thread name, with its allowed CPUs): what is committed. Microseconds, rounded."""
    import csv
    import gzip
    import io

    d = json.loads((out / "sched.json").read_text())
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(STEP_COLUMNS)
    threads = {}
    for r in d["ranks"]:
        phases = [("unprofiled", arm, b) for arm, bl in r["blocks"].items() for b in bl]
        if not r["contended"]:  # the others' threads per block only (threads_per_step), not per step
            phases = [(ph, arm, dict(b, rows=b["rows"][:1])) for ph, arm, b in phases]
            phases += [("traced", arm, dict(b, rows=b["rows"][:1])) for arm, b in r["traced"].items()]
            for ph, arm, b in phases:
                _threads(threads, r, ph, arm, b, b.get("threads_steps", len(b["samples"])))
            continue
        phases += [("traced", arm, b) for arm, b in r["traced"].items()]
        for phase, arm, b in phases:
            idx = {p: i for i, p in enumerate(b["paths"])}
            for k, (x, y) in enumerate(zip(b["rows"], b["rows"][1:])):
                def dt(kind, j):
                    keys = [p for p in b["paths"] if p.split(":")[0] == kind]
                    vals = [(y[4 + idx[p]][j] - x[4 + idx[p]][j]) / 1e3 for p in keys
                            if x[4 + idx[p]] is not None and y[4 + idx[p]] is not None]
                    return round(sum(vals)) if vals else ""
                w.writerow([r["rank"], int(r["contended"]), arm, phase, b.get("round", ""), k,
                            round((y[0] - x[0]) / 1e3), round(b["samples"][k]), dt("main", 0), dt("main", 1),
                            dt("autograd", 0), dt("autograd", 1), dt("spin", 0), dt("spin", 1), y[2] - x[2],
                            y[3] - x[3]])
            _threads(threads, r, phase, arm, b, b.get("threads_steps", len(b["rows"]) - 1))
    for acc in threads.values():
        for o in acc["threads"].values():
            o["run_us"] = round(o["run_us"] / acc["steps"], 1)
            o["runq_us"] = round(o["runq_us"] / acc["steps"], 1)
    (out / "sched_steps.csv.gz").write_bytes(gzip.compress(buf.getvalue().encode(), 9))
    summary = {"meta": d["meta"], "cuda_waits": {str(r["rank"]): r["cuda_waits"] for r in d["ranks"]},
               "threads_per_step": threads}
    (out / "sched_summary.json.gz").write_bytes(gzip.compress(json.dumps(summary, indent=1).encode(), 9))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=("ddp_cpu", "cnn_cpu", "fsdp_cpu"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summarize", action="store_true", help="write --out's sched_steps.csv.gz and "
                    "sched_summary.json.gz from its sched.json (summarize) and stop")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--alternations", type=int, default=6)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--profiler", choices=("tb_handler",), default="tb_handler")
    a = ap.parse_args(argv)
    if a.summarize:
        if not (a.out / "sched.json").is_file():
            print(f"schedstat_probe: no {a.out / 'sched.json'}", file=sys.stderr)
            return 2
        summarize(a.out)
        return 0
    if a.pair is None:
        print("schedstat_probe: --pair is required (or --summarize)", file=sys.stderr)
        return 2
    if a.steps < 3 or a.alternations < 2 or a.world < 2:
        print("schedstat_probe: --steps >= 3, --alternations >= 2, --world >= 2", file=sys.stderr)
        return 2
    os.environ[PM.PROFILER_OVERRIDE] = a.profiler
    for c in PM.CASES.values():
        c["profiler"] = a.profiler
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parents[1]), str(HERE),
                                                             os.environ.get("PYTHONPATH")]))
    a.out.mkdir(parents=True, exist_ok=True)
    import torch.multiprocessing as mp

    try:
        mp.start_processes(_rank, args=(a.world, a.pair, str(a.out), a.warm, a.steps, a.alternations,
                                        PM._free_port(), a.device), nprocs=a.world, join=True, start_method="spawn")
    except Exception as e:
        print(f"schedstat_probe: {type(e).__name__}: {str(e)[-1500:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
