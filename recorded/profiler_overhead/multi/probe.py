"""The profiler's overhead on multi-process jobs recorded with and without ``record_shapes``, each trace carrying its
own unprofiled step (kit.capture's timing): the jobs that price the doctor's estimate for a DDP/FSDP trace recorded
with torch.profiler's defaults (``record_shapes=False``).

One spawn of ``--world`` ranks (``torch.multiprocessing``, NCCL; gloo on CPU with ``--device cpu``) runs each job of
``--jobs`` (``tests/corpus/planted_multi.py``'s cases: its models, sizes and training step) in turn: ``--warm``
steps, then ``kit.capture.profile`` windows by turns without and with ``record_shapes`` (:data:`ARMS`, ABBA: a drift
within the job biases one pair one way, the next the other), each window ``unprofiled`` steps timed without the
profiler (CUDA events at each step's end: ``kitCapture.unprofiled_step_us``) and ``unprofiled_host`` host-timed ones,
then ``wait`` 1, ``warmup`` 2 and ``--active`` recorded steps. ``TEARDOWN_CUPTI=1`` (kit.capture's default): CUPTI
is detached as each trace ends, so the next window's unprofiled steps run as before any trace. A window starts only
if the session's deadline leaves room for it (rank 0 decides, every rank follows). Writes
``OUT/<job>/<k>-<shapes|noshapes>/`` (each rank's trace and sidecar) and ``OUT/<job>/meta.json`` (the job, its
sizes, the device, versions, the host CPU, each window's wall time). ``PROBE_ARMS=stack`` (``stack/run.sh``, session
11): six windows instead, ABCCBA, with ``record_shapes``, + ``with_stack``, + ``with_stack`` and ``profile_memory``
(:data:`STACK_ARMS`), named ``<k>-shapes``, ``<k>-stack``, ``<k>-stackmem``. ``PROBE_ARMS=stack2`` (``offops/run.sh``, session 12):
four windows, ABBA, with ``record_shapes`` and + ``with_stack``. A job named ``<case>+<load>`` (``offops/run-s12r2.sh``)
runs ``load`` -- ``ord``, ``dict``, ``fib`` or ``sort``: pure Python outside any op, about ``PROBE_LOAD_MS`` (5) ms of
it unprofiled -- after each of the case's steps on every rank.

    python probe.py OUT --world 2 --jobs gpt-ddp-bf16-control,gpt-fsdp-bf16-control --budget-s 30
    python probe.py OUT --world 2 --device cpu --jobs gpt-ddp-bf16-control --budget-s 60   # gloo dry run
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(os.environ.get("KIT_ROOT", Path.cwd()))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "corpus"))
ARMS = (("noshapes", False, False, False), ("shapes", True, False, False), ("shapes", True, False, False),
        ("noshapes", False, False, False))
"""(name, record_shapes, with_stack, profile_memory) of each window, in order (ABBA)"""
STACK_ARMS = (("shapes", True, False, False), ("stack", True, True, False), ("stackmem", True, True, True),
              ("stackmem", True, True, True), ("stack", True, True, False), ("shapes", True, False, False))
"""``PROBE_ARMS=stack`` (``stack/run.sh``, session 11): record_shapes, + with_stack, + with_stack and profile_memory
(ABCCBA)"""
STACK2_ARMS = (("shapes", True, False, False), ("stack", True, True, False), ("stack", True, True, False),
               ("shapes", True, False, False))
"""``PROBE_ARMS=stack2`` (``offops/run.sh``, session 12): record_shapes, + with_stack (ABBA)"""
if os.environ.get("PROBE_ARMS") == "stack":
    ARMS = STACK_ARMS
elif os.environ.get("PROBE_ARMS") == "stack2":
    ARMS = STACK2_ARMS


TEXT = "the quick brown fox jumps over the lazy dog; " * 2
KEYS = [f"metric/{i}" for i in range(50)]


def _fib(n):
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)


def _unit(kind: str) -> None:
    """One unit of a pure-Python workload (PROBE_PYLOAD, price22 s12r2): builtin calls (``ord``: ord + append per
    character), builtin methods on a dict (``dict``: dict.get per key), Python function calls (``fib``: a recursive
    function) and a sort with a Python key (``sort``: a lambda per element)."""
    if kind == "ord":
        codes = []
        for ch in TEXT:
            codes.append(ord(ch))
    elif kind == "dict":
        d = {}
        for i in range(100):
            k = KEYS[i % 50]
            d[k] = d.get(k, 0) + i
    elif kind == "fib":
        _fib(12)
    elif kind == "sort":
        sorted(range(200, 0, -1), key=lambda x: (x * 7919) % 1009)


def _with_load(job, kind: str, ms: float, rank: int):
    """``job.step`` followed by ``kind``'s units for about ``ms`` unprofiled (rank 0's count, broadcast): a fixed
    amount of pure Python on the training thread, outside any op."""
    import torch.distributed as dist

    t0 = time.perf_counter()
    for _ in range(50):
        _unit(kind)
    per = (time.perf_counter() - t0) / 50
    n = [max(1, int(ms / 1e3 / per))]
    dist.broadcast_object_list(n, src=0)
    n = n[0]
    step = job.step

    def stepped():
        step()
        for _ in range(n):
            _unit(kind)
    job.step = stepped
    job.load = {"kind": kind, "units": n, "unit_us_calibrated": round(per * 1e6, 2)}
    return job


def _rank(rank, world, out, jobs, port, deadline, device, warm, active, unprofiled):
    import torch.distributed as dist

    import planted_multi as PM
    from kit import capture

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cuda = device == "cuda"
    dev = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            **({"device_id": torch.device(dev)} if cuda else {}))
    est = 4.0  # seconds a window takes, until one was timed
    for name in jobs:
        base, _, load = name.partition("+")
        case = dict(PM.CASES[base])
        t0 = time.time()
        job = PM.MultiJob(case, dev, rank, world)
        if load:
            job = _with_load(job, load, float(os.environ.get("PROBE_LOAD_MS", "5")), rank)
        for _ in range(warm):
            job.step()
        walls = []
        for k, (arm, shapes, stack, mem) in enumerate(ARMS):
            go = [time.time() + est < deadline]
            dist.broadcast_object_list(go, src=0)
            if not go[0]:
                break
            w0 = time.time()
            d = Path(out) / name / f"{k}-{arm}"
            with capture.profile(d, cuda=cuda, wait=1, warmup=2, active=active, unprofiled=unprofiled,
                                 record_shapes=shapes, with_stack=stack, profile_memory=mem) as prof:
                while not prof.done:
                    job.step()
                    prof.step()
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            walls.append(round(time.time() - w0, 2))
            est = max(est * 0.5, walls[-1] * 1.3)
            if rank == 0:
                u = json.loads((d / "capture_rank0.json").read_text())["unprofiled_step_us"]
                print(f"x{world} {name:24s} {d.name:10s} unprofiled median {sorted(u)[len(u) // 2] / 1e3:6.2f} ms "
                      f"[{walls[-1]:.1f} s, {time.time() - t0:.1f} s into the job]", flush=True)
        if rank == 0 and walls:
            meta = {"job": name, "load": getattr(job, "load", None),
                    "case": {k: v for k, v in case.items() if k not in ("profiler", "record_shapes", "with_stack")},
                    "profiler": "kit.capture", "world_size": world, "sizes": job.size,
                    "arms": [list(x) for x in ARMS[:len(walls)]],
                    "window_wall_s": walls, "warm": warm, "active": active, "unprofiled": unprofiled,
                    "device": torch.cuda.get_device_name() if cuda else "cpu", "backend": "nccl" if cuda else "gloo",
                    "torch": torch.__version__, "cuda": torch.version.cuda,
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                    "host_cpu": PM.P._host_cpu(), "hostname": socket.gethostname(),
                    "teardown_cupti": os.environ.get("TEARDOWN_CUPTI"),
                    "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (Path(out) / name / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        job.close()
        del job
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        if len(walls) < len(ARMS):
            break  # out of time: the next job would not get a pair either
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--jobs", default="gpt-ddp-bf16-control,gpt-fsdp-bf16-control,cnn-ddp-fp32-hostbound")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--active", type=int, default=2)
    ap.add_argument("--unprofiled", type=int, default=10)
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp

    import planted_multi as PM

    jobs = a.jobs.split(",")
    bad = [j for j in jobs if j.partition("+")[0] not in PM.CASES]
    if bad or a.world < 2:
        print(f"probe: unknown job {bad} (planted_multi.py --list) or --world < 2", file=sys.stderr)
        return 2
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    deadline = time.time() + a.budget_s
    a.out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.start_processes(_rank, args=(a.world, str(a.out), jobs, port, deadline, a.device, a.warm, a.active,
                                        a.unprofiled), nprocs=a.world, join=True, start_method="spawn")
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
