"""The corpus CNN/GPT DataLoader's next() (single process, pin_memory on a GPU) timed per call without and under
torch.profiler (record_shapes on, CPU+CUDA activities, as the corpus traces), alternating blocks, every sample kept.
Usage: python loader_next.py OUT.json [device]"""
import json, statistics, sys, time, platform
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent / "tests" / "corpus"))
import torch
import planted as P

dev = sys.argv[2] if len(sys.argv) > 2 else ("cuda" if torch.cuda.is_available() else "cpu")
CASES = {"cnn96": ("cnn", dict(width=64, blocks=1, img=64, batch=96, classes=100)),
         "cnn8_hostbound": ("cnn", dict(width=16, blocks=1, img=32, batch=8, classes=10)),
         "gpt8": ("gpt", dict(vocab=8192, d=1024, layers=2, heads=16, seq=256, batch=8))}
out = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
       "cuda": torch.version.cuda, "python": platform.python_version(), "host": platform.node(), "cases": {}}
if dev == "cuda":
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else [])

def block(it, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); next(it); ts.append((time.perf_counter() - t) * 1e6)
    return ts

for name, (model, size) in CASES.items():
    dl = torch.utils.data.DataLoader(P.Data(model, size, 0), batch_size=size["batch"], num_workers=0,
                                     pin_memory=(dev == "cuda"))
    it = iter(dl)
    block(it, 20)
    un, pr, nops = [], [], None
    for r in range(3):
        un += block(it, 50)
        with torch.profiler.profile(activities=acts, record_shapes=True, with_stack=False) as prof:
            pr += block(it, 25)
        if nops is None:
            ev = [e for e in prof.events() if e.name.startswith("aten::")]
            nops = len(ev) / 25
    out["cases"][name] = {"unprofiled_us": {"median": statistics.median(un), "p10": statistics.quantiles(un, n=10)[0],
                                            "p90": statistics.quantiles(un, n=10)[-1], "samples": [round(x, 1) for x in un]},
                          "profiled_us": {"median": statistics.median(pr), "p10": statistics.quantiles(pr, n=10)[0],
                                          "p90": statistics.quantiles(pr, n=10)[-1], "samples": [round(x, 1) for x in pr]},
                          "aten_ops_per_next": nops, "size": size}
    c = out["cases"][name]
    print(name, f"unprofiled {c['unprofiled_us']['median']:.0f} us, profiled {c['profiled_us']['median']:.0f} us, "
          f"{nops:.0f} aten ops -> {(c['profiled_us']['median'] - c['unprofiled_us']['median']) / max(nops, 1):.2f} us/op", flush=True)
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
