"""Is the FSDP control's traced host stall the job's or the profiler's?

The balanced GPT FSDP bf16 job (tests/corpus/planted_multi.py's gpt-fsdp-bf16-control) runs windows of: 20 plain
unprofiled steps, then one kit.capture window (5 unprofiled + 5 host-timed + wait 1 + warmup 2 + active 3, as the
corpus recorded it: record_shapes). Every step, on every rank, is instrumented outside its timed span: wall time
(perf_counter around the step and a cuda synchronize), host time (to the step's return), the main thread's and all
threads' scheduler stats (/proc/self/task/*/schedstat: run ns, runqueue-wait ns), the machine's steal time
(/proc/stat), Python GC collections inside the step (gc.callbacks: generation and duration), a fixed pure-Python
probe loop after the step (the CPU's speed then) and whether the profiler was on. Odd windows run with
gc.disable(). Rank 0 writes steps.jsonl per rank; traces stay under w<k>/.

usage: python hoststall.py --world 2 --windows 8 --out DIR [--cpu] [--deadline S]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _pm():
    spec = importlib.util.spec_from_file_location("planted_multi", HERE / "tests" / "corpus" / "planted_multi.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules["planted_multi"] = m
    spec.loader.exec_module(m)
    return m


def schedstats() -> dict:
    """per thread id: (run_ns, wait_ns, slices)"""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                a = f.read().split()
            out[int(tid)] = (int(a[0]), int(a[1]), int(a[2]))
        except (OSError, IndexError, ValueError):
            pass
    return out


def steal() -> tuple[int, int]:
    with open("/proc/stat") as f:
        a = f.readline().split()
    v = list(map(int, a[1:]))
    return (v[7] if len(v) > 7 else 0), sum(v)


def probe(n: int = 20000) -> float:
    t = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return (time.perf_counter() - t) * 1e6


GC: list = []


def _gc_cb(phase, info):
    GC.append((phase, info.get("generation"), time.perf_counter()))


def main_rank(rank: int, world: int, args) -> None:
    import torch.distributed as dist

    pm = _pm()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(args.port))
    torch.set_num_threads(4)
    cuda = not args.cpu
    dev = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            **({"device_id": torch.device(dev)} if cuda else {}))
    case = pm.CASES["gpt-fsdp-bf16-control"]
    job = pm.MultiJob(case, dev, rank, world)
    out = Path(args.out)
    rows = []
    me = os.getpid()
    gc.callbacks.append(_gc_cb)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(window: int, part: str):
        s0, st0 = schedstats(), steal()
        GC.clear()
        on = bool(torch._C._autograd._profiler_enabled())
        sync()
        t0 = time.perf_counter()
        job.step()
        t_host = time.perf_counter()
        sync()
        t1 = time.perf_counter()
        g = list(GC)
        s1, st1 = schedstats(), steal()
        pr = probe()
        gcs, open_ = [], {}
        for ph, gen, t in g:
            if ph == "start":
                open_[gen] = t
            elif gen in open_:
                a = open_.pop(gen)
                gcs.append([gen, round((t - a) * 1e6, 1), round((a - t0) * 1e6, 1)])
        d = {k: (s1[k][0] - s0[k][0], s1[k][1] - s0[k][1]) for k in s1 if k in s0}
        busiest = max(d, key=lambda k: d[k][0]) if d else None
        rows.append({"w": window, "part": part, "profiler": on, "gc_enabled": gc.isenabled(),
                     "wall_us": round((t1 - t0) * 1e6, 1), "host_us": round((t_host - t0) * 1e6, 1),
                     "main_run_us": round(d.get(me, (0, 0))[0] / 1e3, 1), "main_wait_us": round(d.get(me, (0, 0))[1] / 1e3, 1),
                     "all_run_us": round(sum(v[0] for v in d.values()) / 1e3, 1),
                     "all_wait_us": round(sum(v[1] for v in d.values()) / 1e3, 1),
                     "busiest_tid": busiest, "busiest_run_us": round(d[busiest][0] / 1e3, 1) if busiest else None,
                     "busiest_wait_us": round(d[busiest][1] / 1e3, 1) if busiest else None,
                     "threads": len(s1), "steal_ticks": st1[0] - st0[0], "cpu_ticks": st1[1] - st0[1],
                     "gc": gcs, "probe_us": round(pr, 1)})

    from kit import capture

    for _ in range(8):  # warm
        step(-1, "warm")
    t_start = time.time()
    for w in range(args.windows):
        go = [time.time() - t_start < args.deadline]
        dist.broadcast_object_list(go, src=0)
        if not go[0]:
            break
        gc.enable() if w % 2 == 0 else gc.disable()
        for _ in range(20):
            step(w, "plain")
        d = out / f"w{w}"
        if rank == 0:
            d.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        with capture.profile(d, cuda=cuda, active=3, record_shapes=True, with_stack=False) as prof:
            while not prof.done:
                step(w, "capture")
                prof.step()
        dist.barrier()
    gc.enable()
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            names[tid] = open(f"/proc/self/task/{tid}/comm").read().strip()
        except OSError:
            pass
    (out / f"steps_rank{rank}.json").write_text(json.dumps({"rank": rank, "pid": me, "thread_names": names,
                                                            "gc_threshold": gc.get_threshold(),
                                                            "gc_count": gc.get_count(),
                                                            "gc_objects": len(gc.get_objects()),
                                                            "rows": rows}))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--deadline", type=float, default=40.0)
    ap.add_argument("--port", type=int, default=29611)
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    import torch.multiprocessing as mp

    mp.spawn(main_rank, args=(args.world, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
