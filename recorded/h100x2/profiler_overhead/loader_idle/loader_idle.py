"""The multi-GPU corpus's control jobs run unprofiled (tests/corpus/planted_multi.MultiJob, the recorded sizes),
with each DataLoader next() timed on the host (perf_counter) and the GPU's idle it leaves measured on the GPU: a CUDA
event recorded just before next() completes when the work queued before it is done, one recorded right after next()
returns completes at once on an idle GPU -- the time between them is the GPU's idle waiting for the batch (0 when
queued work outlasts next()). Per rank, every step kept. torchrun --nproc-per-node N loader_idle.py OUT.json CASE..."""
import json, os, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent / "tests" / "corpus"))
import torch
import torch.distributed as dist
import planted_multi as M

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
cuda = torch.cuda.is_available()
dev = f"cuda:{rank}" if cuda else "cpu"
if cuda:
    torch.cuda.set_device(rank)
dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": torch.device(dev)} if cuda else {}))
out = {}
for name in sys.argv[2:]:
    job = M.MultiJob(M.CASES[name], dev, rank, world)
    it = job.it
    rec = []

    class Timed:
        def __next__(self):
            e0 = torch.cuda.Event(enable_timing=True) if cuda else None
            if cuda:
                e0.record()
            t = time.perf_counter()
            b = next(it)
            host = (time.perf_counter() - t) * 1e6
            e1 = None
            if cuda:
                e1 = torch.cuda.Event(enable_timing=True)
                e1.record()
            rec.append((host, e0, e1))
            return b

    job.it = Timed()
    for _ in range(8):
        job.step()
    if cuda:
        torch.cuda.synchronize()
    rec.clear()
    n = 30
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else None
    ts = [time.perf_counter()]
    if cuda:
        ev[0].record()
    for i in range(n):
        job.step()
        if cuda:
            ev[i + 1].record()
        ts.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize()
    steps = [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(n)] if cuda else [(b - a) * 1e6 for a, b in zip(ts, ts[1:])]
    host = [h for h, _, _ in rec]
    idle = [e0.elapsed_time(e1) * 1e3 for _, e0, e1 in rec] if cuda else []
    med = lambda x: round(statistics.median(x), 1) if x else None
    out[name] = {"rank": rank, "world": world, "step_us": {"median": med(steps), "samples": [round(x, 1) for x in steps]},
                 "next_host_us": {"median": med(host), "samples": [round(x, 1) for x in host]},
                 "next_gpu_idle_us": {"median": med(idle), "samples": [round(x, 1) for x in idle]},
                 "nexts_per_step": len(rec) / n}
    print(f"rank {rank} {name}: step {med(steps)} us, next() host {med(host)} us, GPU idle in next() {med(idle)} us "
          f"({len(rec) / n:g} per step)", flush=True)
    job.close()
    dist.barrier()
Path(sys.argv[1] + f".rank{rank}.json").write_text(json.dumps(out, indent=1))
dist.destroy_process_group()
