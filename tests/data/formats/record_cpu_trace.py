"""Regenerates ``worker0.<ms>.pt.trace.json.gz`` here: a real trace of the PyTorch profiler on CPU, as
``torch.profiler.tensorboard_trace_handler`` names it, with the options that add event kinds to a trace --
``with_stack`` (``python_function`` events and stacks), ``profile_memory`` (``[memory]`` instant events),
``record_shapes`` -- and ``ProfilerStep#N`` annotations. Small on purpose (a two-layer MLP, 2 active steps).

    .venv/bin/python tests/data/formats/record_cpu_trace.py
"""

from pathlib import Path

import torch


def main() -> None:
    out = Path(__file__).parent
    for old in out.glob("worker0.*.pt.trace.json.gz"):
        old.unlink()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out), "worker0", use_gzip=True),
                                with_stack=True, profile_memory=True, record_shapes=True) as prof:
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            prof.step()


if __name__ == "__main__":
    main()
