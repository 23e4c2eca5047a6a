"""What the profiler's per-op cost on a real job depends on: the corpus jobs (tests/corpus/planted_multi.py's and
planted.py's models and faults), each timed step by step with CUDA events at every step's end, unprofiled and under
torch.profiler with each setting, paired (unprofiled steps right before each profiled window), several rounds:

* ``cuda``: activities CUDA only (CUPTI: runtime-call callbacks and GPU activity, no op recorded);
* ``cpu``: activities CPU only (every op recorded, no CUPTI);
* ``cpu_cuda``: both, no shapes;  ``cpu_cuda_shapes``: both with record_shapes (the corpus's setting);
* ``cpu_cuda_shapes_stack``: both with record_shapes and with_stack.

The recorded events per step (aten ops, runtime calls) are counted once per setting in a trace exported from the
first round (rank 0; kit.traces). Plus a CPU loop whose one op takes k inputs (``torch.cat`` of k tiny tensors), to
see what record_shapes costs per recorded input.

    python probe.py OUT  --world 2 --cases gpt-ddp-bf16-control ...   # a spawn of 2 ranks (multi-GPU corpus)
    python probe.py OUT  --single gpt-host_sync gpt-launch_bound        # one GPU (planted.py's corpus)
    python probe.py OUT  --inputs                                       # the k-input loop (CPU)
    python probe.py OUT  --dry ...                                      # CPU/gloo, tiny: checks the script runs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SETTINGS = {"cuda": (False, True, False, False), "cpu": (True, False, False, False),
            "cpu_cuda": (True, True, False, False), "cpu_cuda_shapes": (True, True, True, False),
            "cpu_cuda_shapes_stack": (True, True, True, True)}
"""name -> (CPU activity, CUDA activity, record_shapes, with_stack)"""


def _load(name):
    if name in sys.modules:
        return sys.modules[name]
    root = Path(os.environ.get("KIT_ROOT", HERE))
    spec = importlib.util.spec_from_file_location(name, root / "tests" / "corpus" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _events(n, cuda):
    return [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else None


def _timed(step, n, cuda, after=None):
    """n steps, each one's time (us): CUDA events at each step's end on a GPU, else perf_counter."""
    if cuda:
        ev = _events(n, True)
        ev[0].record()
        for i in range(n):
            step()
            ev[i + 1].record()  # before the profiler's step: the last one processes and exports the trace
            if after:
                after()
        torch.cuda.synchronize()
        return [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(n)]
    ts = [time.perf_counter()]
    for _ in range(n):
        step()
        ts.append(time.perf_counter())
        if after:
            after()
    return [(b - a) * 1e6 for a, b in zip(ts, ts[1:])]


def _profiled(step, n, cuda, setting, export: Path | None):
    from torch.profiler import ProfilerActivity, profile, schedule

    cpu_a, cuda_a, shapes, stack = SETTINGS[setting]
    acts = ([ProfilerActivity.CPU] if cpu_a else []) + ([ProfilerActivity.CUDA] if cuda_a and cuda else [])
    if not acts:
        acts = [ProfilerActivity.CPU]
    ready = (lambda p: p.export_chrome_trace(str(export))) if export else (lambda p: None)
    with profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=n), record_shapes=shapes,
                 with_stack=stack, on_trace_ready=ready) as prof:
        step()
        prof.step()  # the warm-up step: recording starts
        samples = _timed(step, n, cuda, after=prof.step)
    return samples


KEEP = "cpu_cuda_shapes"
"""the setting whose round-0 traces are kept (the corpus's): the doctor's estimate is checked on them"""


def _keep(paths: dict, out: Path, keep: bool) -> None:
    import shutil

    if keep and KEEP in paths:
        (out / "traces").mkdir(exist_ok=True)
        shutil.copy(paths[KEEP], out / "traces" / paths[KEEP].name)


def _count(path: Path) -> dict:
    from kit import traces

    cpu = traces.load_trace(path, cpu="all", cache=False).cpu
    names = cpu["name"].astype(str)
    cats = cpu["cat"].astype(str)
    steps = cpu[(cats == "user_annotation") & names.str.startswith("ProfilerStep#")]
    n = max(1, len(steps))
    return {"ops": float((cats == "cpu_op").sum() / n), "runtime": float(cats.isin(["cuda_runtime",
            "cuda_driver"]).sum() / n), "python": float((cats == "python_function").sum() / n),
            "input_values": float(sum(len(x) if isinstance(x, list) else 0 for x in cpu.get("input_dims", [])) / n)
            if "input_dims" in cpu else None, "steps": len(steps)}


def measure(step, cuda, rounds, n_unprof, n_prof, settings, sync=None, tag="", barrier=None):
    """Per round and setting: n_unprof unprofiled steps, then n_prof profiled ones (paired). Traces of round 0 are
    exported to a temp dir (their paths returned) for counting."""
    out = {s: {"unprofiled": [], "profiled": []} for s in settings}
    tmp = Path(tempfile.mkdtemp(prefix="probe-"))
    paths = {}
    for r in range(rounds):
        for s in settings:
            if barrier:
                barrier()
            out[s]["unprofiled"].append(_timed(step, n_unprof, cuda))
            if barrier:
                barrier()
            exp = tmp / f"{tag}{s}.json.gz" if r == 0 else None
            out[s]["profiled"].append(_profiled(step, n_prof, cuda, s, exp))
            if exp:
                paths[s] = exp
    return out, paths


def _summary(res):
    for s, d in res.items():
        u = statistics.median(x for xs in d["unprofiled"] for x in xs)
        p = statistics.median(x for xs in d["profiled"] for x in xs)
        d["median_unprofiled_us"], d["median_profiled_us"] = round(u, 1), round(p, 1)
        d["overhead_us"] = round(p - u, 1)
        d["overhead_per_round_us"] = [round(statistics.median(pp) - statistics.median(uu), 1)
                                      for uu, pp in zip(d["unprofiled"], d["profiled"])]


# ------------------------------------------------------------------------------------------- multi-rank jobs
def _rank(rank, world, names, out, rounds, nu, np_, port, env, dry, settings, deadline):
    import torch.distributed as dist

    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    cuda = not dry
    dev = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            **({"device_id": torch.device(dev)} if cuda else {}))
    PM = _load("planted_multi")
    for name in names:
        go = [time.time() < deadline]
        dist.broadcast_object_list(go, src=0)
        if not go[0]:
            if rank == 0:
                print(f"{name}: skipped (deadline)", flush=True)
            continue
        t0 = time.time()
        case = PM.CASES[name]
        job = PM.MultiJob(case, dev, rank, world)
        for _ in range(5):
            job.step()
        if cuda:
            torch.cuda.synchronize()
        res, paths = measure(job.step, cuda, rounds, nu, np_, settings, tag=f"{name}-r{rank}-",
                             barrier=dist.barrier)
        counts = {s: _count(p) for s, p in paths.items()} if rank == 0 else None
        _keep(paths, Path(out), "deep" not in name)
        allres = [None] * world
        dist.all_gather_object(allres, res)
        if rank == 0:
            # the job's step: the slowest rank's, step by step
            job_res = {}
            for s in settings:
                job_res[s] = {k: [[max(r[s][k][i][j] for r in allres) for j in range(len(allres[0][s][k][i]))]
                                  for i in range(rounds)] for k in ("unprofiled", "profiled")}
            _summary(job_res)
            rec = {"case": name, "world_size": world, "nccl_env": env, "rounds": rounds, "job": job_res,
                   "per_rank": allres, "counts_rank0": counts, "wall_s": round(time.time() - t0, 1)}
            (Path(out) / f"job-{name}.json").write_text(json.dumps(rec))
            print(name, {s: (job_res[s]["median_unprofiled_us"], job_res[s]["median_profiled_us"],
                             job_res[s]["overhead_per_round_us"], (counts or {}).get(s, {}).get("ops"))
                         for s in settings}, f"[{rec['wall_s']} s]", flush=True)
        job.close()
        del job
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()


def run_world(out, world, names, rounds, nu, np_, env, dry, settings, budget_s):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(world, names, str(out), rounds, nu, np_, port, env, dry, settings,
                          time.time() + budget_s), nprocs=world)


# ------------------------------------------------------------------------------------------- one-GPU jobs
def run_single(out, names, rounds, nu, np_, dry, settings, budget_s):
    P = _load("planted")
    deadline = time.time() + budget_s
    dev = "cpu" if dry else "cuda"
    for name in names:
        if time.time() > deadline:
            print(f"{name}: skipped (deadline)", flush=True)
            continue
        t0 = time.time()
        case = P.CASES[name]
        size = {**P.SIZES[dev][case["model"]], **case["sizes"]}
        job = P.Job({**case, "device": dev}, dev, size)
        for _ in range(5):
            job.step()
        if not dry:
            torch.cuda.synchronize()
        res, paths = measure(job.step, not dry, rounds, nu, np_, settings, tag=f"{name}-")
        counts = {s: _count(p) for s, p in paths.items()}
        _keep(paths, Path(out), True)
        _summary(res)
        rec = {"case": name, "world_size": 1, "rounds": rounds, "job": res, "counts": counts,
               "wall_s": round(time.time() - t0, 1)}
        (Path(out) / f"single-{name}.json").write_text(json.dumps(rec))
        print(name, {s: (res[s]["median_unprofiled_us"], res[s]["median_profiled_us"],
                         res[s]["overhead_per_round_us"], counts.get(s, {}).get("ops")) for s in settings},
              f"[{rec['wall_s']} s]", flush=True)
        job.close()
        if not dry:
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------- k inputs per op
def run_inputs(out, ks, n_ops, steps, rounds):
    """torch.cat of k tiny CPU tensors, n_ops per step: profiled (CPU activity; shapes off and on) against
    unprofiled, paired; the overhead per op for each k."""
    rec = []
    for k in ks:
        xs = [torch.ones(2) for _ in range(k)]

        def step():
            for _ in range(n_ops):
                torch.cat(xs)

        for _ in range(3):
            step()
        for shapes in (False, True):
            s = "cpu_shapes" if shapes else "cpu"
            SETTINGS[s] = (True, False, shapes, False)
            res, paths = measure(step, False, rounds, steps, steps, [s], tag=f"cat{k}-")
            _summary(res)
            d = res[s]
            d["k"], d["record_shapes"], d["ops_per_step"] = k, shapes, n_ops
            d["counts"] = _count(paths[s])
            d["us_per_op"] = round(d["overhead_us"] / n_ops, 3)
            rec.append(d)
            print(f"k={k:4d} shapes={shapes!s:5s} {d['median_unprofiled_us']:9.1f} -> {d['median_profiled_us']:9.1f} us"
                  f"  {d['us_per_op']:.2f} us/op  rounds {d['overhead_per_round_us']}", flush=True)
    (Path(out) / "inputs.json").write_text(json.dumps(rec))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--cases", nargs="*", default=[])
    ap.add_argument("--single", nargs="*", default=[])
    ap.add_argument("--inputs", action="store_true")
    ap.add_argument("--env", default="", help="NAME=VALUE,... for the spawn (NCCL's environment)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--unprofiled", type=int, default=8)
    ap.add_argument("--profiled", type=int, default=6)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--budget-s", type=float, default=60)
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    settings = a.settings.split(",")
    env = dict(kv.split("=", 1) for kv in a.env.split(",") if kv)
    if a.cases:
        run_world(a.out, a.world, a.cases, a.rounds, a.unprofiled, a.profiled, env, a.dry, settings, a.budget_s)
    if a.single:
        run_single(a.out, a.single, a.rounds, a.unprofiled, a.profiled, a.dry, settings, a.budget_s)
    if a.inputs:
        run_inputs(a.out, [1, 4, 16, 64, 256], 200 if not a.dry else 20, 10 if not a.dry else 3, a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
