"""Record a real one-rank trace of the size users bring: a plain GPT training loop on one GPU, profiled with
``with_stack=True``, ``profile_memory=True`` and ``record_shapes=True`` (the heaviest settings), written by
``torch.profiler.tensorboard_trace_handler`` -- the input of ``benchmarks/bench_doctor.py`` and
``bench_trace_tools.py``'s real-trace rows. Needs a CUDA GPU.

    python benchmarks/record_stack_trace.py OUT_DIR [--active 12] [--layers 8]

Prints the file and its size; not committed (150 MB): regenerate it on a GPU node.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    import torch
    import torch.nn as nn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--active", type=int, default=12, help="profiled steps")
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("record_stack_trace: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = "cuda"
    d, vocab, seq, batch = 512, 8192, 256, 16
    layer = lambda: nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True)  # noqa: E731
    model = nn.Sequential(nn.Embedding(vocab, d), *[layer() for _ in range(a.layers)], nn.Linear(d, vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(vocab, (64, seq + 1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=batch, shuffle=True,
                                         drop_last=True)

    def step(x):
        x = x.to(dev, non_blocking=True)
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    a.out.mkdir(parents=True, exist_ok=True)
    sched = torch.profiler.schedule(wait=1, warmup=2, active=a.active, repeat=1)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    t0 = time.time()
    with torch.profiler.profile(activities=acts, schedule=sched, with_stack=True, profile_memory=True,
                                record_shapes=True,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(a.out))) as prof:
        it = iter(())
        for _ in range(3 + a.active):
            try:
                (x,) = next(it)
            except StopIteration:
                it = iter(loader)
                (x,) = next(it)
            step(x)
            prof.step()
    torch.cuda.synchronize()
    for f in sorted(a.out.glob("*.json*")):
        print(f"{f} {f.stat().st_size / 1e6:.1f} MB ({time.time() - t0:.0f} s, torch {torch.__version__}, "
              f"{torch.cuda.get_device_name()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
