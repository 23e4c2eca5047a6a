"""The DataLoader's pinning step alone: a collated CNN batch (96 x 3 x 64 x 64 float32, 4.7 MB, stacked fresh each
time as default_collate does) copied into one pinned buffer, into one pageable buffer, and pinned through
``Tensor.pin_memory()`` (the caching host allocator), 60 times each, at the default intra-op threads and at 1.
Prints median, p10, p90 and max in us."""
import statistics
import time

import torch

src = torch.randn(96, 3, 64, 64)
pinned = torch.empty_like(src).pin_memory()
pageable = torch.empty_like(src)


def stats(ts):
    q = statistics.quantiles(ts, n=10)
    return f"median {statistics.median(ts):7.0f}  p10 {q[0]:7.0f}  p90 {q[-1]:7.0f}  max {max(ts):7.0f} us"


print(torch.cuda.get_device_name(), torch.__version__, "default threads", torch.get_num_threads())
for threads in (torch.get_num_threads(), 1):
    torch.set_num_threads(threads)
    for name in ("copy into pinned", "copy into pageable", "pin_memory()"):
        ts = []
        for _ in range(60):
            s = torch.stack([src[j] for j in range(96)])
            t = time.perf_counter()
            if name == "pin_memory()":
                s.pin_memory()
            else:
                (pinned if name == "copy into pinned" else pageable).copy_(s)
            ts.append((time.perf_counter() - t) * 1e6)
        print(f"threads {threads:2}  {name:20} {stats(ts[5:])}", flush=True)
