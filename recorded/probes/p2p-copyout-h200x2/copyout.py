"""Is ipc's copy-out the whole reason ipc both ways runs below copy both ways? Emulated on 2 GPUs at 256 MiB:
copy both ways (a peer copy_ on each GPU's stream, as kit's `copy` transport issues it) timed alone and with a
concurrent local copy_ of the same size on each receiving GPU (the copy-out's HBM pass), interleaved samples,
CUDA events on GPU 0's stream around both GPUs' work (cross-device event waits), every sample kept."""
import json, statistics, subprocess, sys, torch

N = 256 << 20
OUT = sys.argv[1]
REPS, WARM = int(sys.argv[2]) if len(sys.argv) > 2 else 40, 5
d = [torch.device("cuda", 0), torch.device("cuda", 1)]
src = [torch.empty(N, dtype=torch.uint8, device=x).fill_(1) for x in d]
dst = [torch.empty(N, dtype=torch.uint8, device=x) for x in d]          # dst[i] receives from src[1-i]
slot = [torch.empty(N, dtype=torch.uint8, device=x).fill_(2) for x in d]  # a copy-out's source on the receiver
out = [torch.empty(N, dtype=torch.uint8, device=x) for x in d]
link = [torch.cuda.Stream(device=x) for x in d]   # stream issuing the outgoing peer copy on each GPU
local = [torch.cuda.Stream(device=x) for x in d]  # stream for the copy-out on each GPU
for i in range(2):  # peer access, as the copy transport enables it
    with torch.cuda.device(d[i]):
        torch.cuda.synchronize()


def round_(variant):
    t0 = torch.cuda.Event(enable_timing=True); t1 = torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(d[0]):
        t0.record(link[0])
    ends = []
    for i in range(2):
        with torch.cuda.device(d[i]):
            for s in (link[i], local[i]):
                s.wait_event(t0)
            if variant in ("both", "both+copyout"):
                with torch.cuda.stream(link[i]):
                    dst[1 - i].copy_(src[i], non_blocking=True)
            if variant in ("both+copyout", "copyout"):
                with torch.cuda.stream(local[i]):
                    out[i].copy_(slot[i], non_blocking=True)
            for s in (link[i], local[i]):
                e = torch.cuda.Event(); e.record(s); ends.append(e)
    with torch.cuda.device(d[0]):
        for e in ends:
            link[0].wait_event(e)
        t1.record(link[0])
    for x in d:
        torch.cuda.synchronize(x)
    return t0.elapsed_time(t1) * 1000.0


variants = ["both", "both+copyout", "copyout"]
for _ in range(WARM):
    for v in variants:
        round_(v)
samples = {v: [] for v in variants}
for r in range(REPS):
    for v in (variants if r % 2 == 0 else variants[::-1]):
        samples[v].append(round_(v))
med = {v: statistics.median(s) for v, s in samples.items()}
pairs = [a / b for a, b in zip(samples["both"], samples["both+copyout"])]
res = {"bytes": N, "reps": REPS, "warmup": WARM, "median_us": med,
       "p10_p90_us": {v: [sorted(s)[len(s) // 10], sorted(s)[len(s) * 9 // 10]] for v, s in samples.items()},
       "both_over_both_plus_copyout_median_of_ratios": statistics.median(pairs),
       "ratio_of_medians": med["both"] / med["both+copyout"], "samples_us": samples,
       "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": list(torch.cuda.nccl.version()),
       "gpus": [torch.cuda.get_device_name(i) for i in range(2)],
       "peer_access": [torch.cuda.can_device_access_peer(0, 1), torch.cuda.can_device_access_peer(1, 0)]}
json.dump(res, open(f"{OUT}/copyout.json", "w"), indent=1)
print(json.dumps({k: v for k, v in res.items() if k != "samples_us"}, indent=1))
