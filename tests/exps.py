"""Tiny experiments for the launcher tests. Module-level so spawned ranks can import them."""

import os
import time
from pathlib import Path


def echo(cfg, ctx):
    """One row per rank: what the rank saw (env override, world, backend), plus an all_reduce result."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(t)
    yield {"world": ctx.world_size, "backend": ctx.backend, "env_seen": os.environ.get("KIT_TEST_VAR", ""),
           "nccl_algo": os.environ.get("NCCL_ALGO", ""), "sum": float(t.item()), "pid": os.getpid()}


def trivial(cfg, ctx):
    return [{"ok": 1}]


def write_pid(ctx):
    d = Path(ctx.run_dir) / "pids"
    d.mkdir(exist_ok=True)
    (d / str(ctx.rank)).write_text(str(os.getpid()))


def raise_on_rank1(cfg, ctx):
    """Rows first (they must survive), then rank 1 raises while rank 0 waits in a collective."""
    import torch.distributed as dist

    write_pid(ctx)
    for i in range(3):
        yield {"i": i}
    ctx.step("about to fail")
    if ctx.rank == 1:
        raise ValueError("deliberate failure on rank 1")
    dist.barrier()
    time.sleep(60)


def hang_on_rank1(cfg, ctx):
    write_pid(ctx)
    yield {"i": 0}
    if ctx.rank == 1:
        ctx.step("stuck in a sleep")
        time.sleep(600)
    else:
        ctx.step("waiting for rank 1")
        import torch.distributed as dist

        dist.barrier()


def hang_in_teardown(cfg, ctx):
    """Finishes its work, then hangs forever in destroy_process_group (as seen with profiler + CUDA graph)."""
    import torch.distributed as dist

    write_pid(ctx)
    dist.destroy_process_group = lambda *a, **k: time.sleep(600)
    yield {"done": 1}


def exit_hard_on_rank0(cfg, ctx):
    write_pid(ctx)
    yield {"i": 0}
    if ctx.rank == 0:
        os._exit(3)
    time.sleep(60)


def sleep_forever(cfg, ctx):
    write_pid(ctx)
    ctx.step("sleeping")
    yield {"started": 1}
    time.sleep(600)


def profiler_and_graph_then_finish(cfg, ctx):
    """The teardown case seen on 2xH200: a live profiler and a captured CUDA graph with a collective in it."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    write_pid(ctx)
    x = torch.ones(1 << 20, device=ctx.device)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(x)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()  # deliberately left open, graph alive: teardown must still be bounded
    g.replay()
    torch.cuda.synchronize()
    ctx._keep = (g, prof)
    yield {"value": float(x[0].item())}


def sync_equivalence(cfg, ctx):
    """Each sync mode's averaged gradients, and the average computed by hand from both ranks' local grads."""
    import torch
    import torch.distributed as dist

    from kit import dataloader_sync as D

    g = torch.Generator().manual_seed(10 + ctx.rank)  # different data on each rank
    x = torch.randn(4, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (4,), generator=g)

    def grads(mode, sync=True):
        model, module, _ = D.build(cfg, ctx, mode, 25.0)
        torch.manual_seed(123)  # same dropout masks in every mode
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if sync:
            D.sync_gradients(module, mode, ctx.world_size)
        return torch.cat([p.grad.flatten() for p in module.parameters()])

    local = grads("per_param", sync=False)
    both = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(both, local)
    expected = torch.stack(both).mean(0)
    for mode in D.SYNC_MODES:
        got = grads(mode)
        yield {"mode": mode, "max_abs_err": float((got - expected).abs().max()), "norm": float(expected.norm())}
