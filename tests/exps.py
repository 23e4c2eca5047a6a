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
    tmp = d / f".{ctx.rank}.tmp"  # written whole, then renamed: a reader polling the directory never sees it half-written
    tmp.write_text(str(os.getpid()))
    tmp.replace(d / str(ctx.rank))


def slept_out(ctx):
    """Reached only when the sleep before it ran to its end: ``<run dir>/slept/<rank>``. A test that finds every rank
    process gone and no such file knows the sleeping rank was ended, not waited out (no clock involved)."""
    d = Path(ctx.run_dir) / "slept"
    d.mkdir(exist_ok=True)
    (d / str(ctx.rank)).write_text("")


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
    slept_out(ctx)


def hang_on_rank1(cfg, ctx):
    write_pid(ctx)
    yield {"i": 0}
    if ctx.rank == 1:
        ctx.step("stuck in a sleep")
        time.sleep(600)
        slept_out(ctx)
    else:
        ctx.step("waiting for rank 1")
        import torch.distributed as dist

        dist.barrier()


def hang_in_teardown(cfg, ctx):
    """Finishes its work, then hangs forever in destroy_process_group (as seen with profiler + CUDA graph)."""
    import torch.distributed as dist

    write_pid(ctx)
    def hang(*a, **k):
        time.sleep(600)
        slept_out(ctx)

    dist.destroy_process_group = hang
    yield {"done": 1}


def hang_after_teardown(cfg, ctx):
    """Finishes its work, then hangs where the rank's own bound cannot help: the garbage collection of the
    teardown runs a finalizer that sleeps in C *holding the GIL* (ctypes.PyDLL keeps it), so the rank's main
    thread never runs again."""
    import ctypes
    import gc

    write_pid(ctx)

    class Stuck:
        def __del__(self):
            ctypes.PyDLL(None).sleep(600)

    a, b = Stuck(), Stuck()
    a.other, b.other = b, a  # a cycle: freed only by gc.collect() at teardown
    del a, b
    gc.disable()  # keep it for the teardown's gc.collect()
    yield {"done": 1}


def raise_on_rank1_while_rank0_ignores_sigterm(cfg, ctx):
    """Rank 1 raises; rank 0 ignores SIGTERM and sleeps (as a rank stuck in a driver call would): stopping the
    run must still leave no rank process behind."""
    import signal

    write_pid(ctx)
    if ctx.rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)
    slept_out(ctx)
    yield {"x": 1}


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


def rows_then_sleep(cfg, ctx):
    """Three rows per rank, then a long sleep: the supervisor is killed while the run is still 'running'."""
    write_pid(ctx)
    for i in range(3):
        yield {"i": i}
    ctx.step("sleeping")
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

    from kit.investigations import dataloader_sync as D

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


def p2p_integrity(cfg, ctx):
    """Every transport this job can run: odd sizes, several dtypes, non-contiguous send and receive tensors,
    both directions at once, and a burst of more messages in flight than ipc has slots; the receiver
    compares with what the sender made (same seeded generator). One row per checked message."""
    import torch

    from kit import transports as p2p

    # every registered transport this job can run (CUDA ones only in a CUDA job)
    names = [n for n in p2p.names() if ctx.is_cuda or not p2p.capabilities(n).cuda]
    shapes = [(1,), (7,), (3, 5), (1001,), (4099,), (33, 65)]
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.uint8]
    # on GPUs also one message above ipc's PIECE_MIN_BYTES with an odd tail: it moves in pieces
    big = (p2p.ipc.PIECE_MIN_BYTES // 4 + 1001,)
    if ctx.is_cuda:
        shapes.append(big)

    def make(shape, dtype, seed, dev, strided):
        g = torch.Generator().manual_seed(seed)
        c = (torch.randn(*shape, generator=g) * 100).to(dtype).to(dev)
        if not strided:
            return c
        s = torch.empty(*shape[:-1], 2 * shape[-1], dtype=dtype, device=dev)[..., ::2]
        return s.copy_(c)

    def empty(shape, dtype, dev, strided):
        if not strided:
            return torch.empty(*shape, dtype=dtype, device=dev)
        return torch.empty(*shape[:-1], 2 * shape[-1], dtype=dtype, device=dev)[..., ::2]

    for name in names:
        T = p2p.make(name, ctx)
        T.setup([(0, 1), (1, 0)], (big[0] * 4 if ctx.is_cuda else 0) + (1 << 20))
        seq = 0
        for shape in shapes:
            for dtype in dtypes if shape != big else [torch.float32]:
                for strided in (False, True):
                    seq += 1
                    ops, expect = [], []
                    if T.caps.in_process:
                        if ctx.rank == 0:
                            for src, dst in ((0, 1), (1, 0)):
                                x = make(shape, dtype, seq * 10 + src, T.device(src), strided)
                                out = empty(shape, dtype, T.device(dst), strided)
                                ops += [("send", x, dst), ("recv", out, src)]
                                expect.append((out, make(shape, dtype, seq * 10 + src, "cpu", False)))
                    elif ctx.rank < 2:
                        peer, dev = 1 - ctx.rank, T.device(ctx.rank)
                        ops = [("send", make(shape, dtype, seq * 10 + ctx.rank, dev, strided), peer),
                               ("recv", empty(shape, dtype, dev, strided), peer)]
                        expect.append((ops[1][1], make(shape, dtype, seq * 10 + peer, "cpu", False)))
                    for w in T.exchange(ops):
                        w.wait()
                    if ctx.is_cuda:
                        torch.cuda.synchronize()
                        for d in range(torch.cuda.device_count()):
                            torch.cuda.synchronize(d)
                    for out, want in expect:
                        yield {"transport": name, "shape": str(shape), "dtype": str(dtype), "strided": strided,
                               "out_contiguous": out.is_contiguous(), "ok": torch.equal(out.cpu(), want)}
        if not T.caps.in_process and ctx.rank < 2:
            dev = T.device(ctx.rank)
            if ctx.rank == 0:
                works = [T.isend(torch.full((513,), float(i), device=dev), 1) for i in range(10)]
            else:
                outs = [torch.empty(513, device=dev) for _ in range(10)]
                works = [T.irecv(o, 0) for o in outs]
            for w in works:
                w.wait()
            ctx.sync()
            if ctx.rank == 1:
                yield {"transport": name, "shape": "burst of 10", "dtype": "float32", "strided": False,
                       "out_contiguous": True, "ok": all(bool((o == i).all()) for i, o in enumerate(outs))}
        ctx.barrier()
        T.close()


def pipeline_vs_reference(cfg, ctx):
    """One 1F1B iteration on gloo ranks against the single-process forward/backward: per stage, the largest
    gradient difference and (last stage) the loss."""
    import torch

    from kit import transports as p2p
    from kit.investigations.p2p_transports import pipeline as P

    n, layers, hidden, batch, m = ctx.world_size, 2, 16, 4, cfg.pipeline_micro_batches
    T = p2p.make("gloo", ctx)
    st = P.Stage(ctx.rank, n, layers, hidden, batch, m, torch.device("cpu"), torch.float32)
    P.drive([st.iteration(T, ctx.rank - 1 if ctx.rank else None, ctx.rank + 1 if ctx.rank < n - 1 else None)])
    loss, grads = P.reference(n, layers, hidden, batch, m)
    err = max(float((w.grad - g).abs().max()) for w, g in zip(st.weights, grads[ctx.rank]))
    scale = max(float(g.abs().max()) for g in grads[ctx.rank])
    yield {"stage": ctx.rank, "max_err": err, "scale": scale,
           "loss": float(st.loss) if ctx.rank == n - 1 else float("nan"), "ref_loss": loss}


def p2p_new_transport(cfg, ctx):
    """The recipe for a new transport, followed in a test: one class with its capabilities and one register
    line, then the whole investigation over it. This one is gloo without a blocking send and without a second
    channel, so the experiments must adapt by capability (semantics: isend only; comm_comm: one channel, and
    a skipped row for two)."""
    import dataclasses

    from kit import transports as p2p
    from kit.investigations import p2p_transports as X

    class GlooOneChannel(p2p.GlooTransport):
        caps = dataclasses.replace(p2p.GlooTransport.caps, blocking_send=False, second_channel=False)

    if "gloo_one_channel" not in p2p.names():
        p2p.register("gloo_one_channel")(GlooOneChannel)
    yield from X.run(dataclasses.replace(cfg, transports=["gloo_one_channel"]), ctx)


class WorkerKind:
    """A map-style dataset whose items say how the process that loaded them was started (ForkProcess,
    SpawnProcess, ...): what dataloader_sync's loader gives its workers in a rank."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        import multiprocessing

        import torch

        return torch.zeros(1), type(multiprocessing.current_process()).__name__


def dataloader_sync_worker_kind(cfg, ctx):
    """dataloader_sync's loader (make_loader) in a rank this kit spawned: one batch, and how its worker started."""
    from kit.investigations import dataloader_sync as D

    _, kinds = next(iter(D.make_loader(cfg, ctx, WorkerKind(), pinned=False)))
    yield {"kind": "worker", "process": kinds[0]}


def dataloader_sync_waits(cfg, ctx):
    """dataloader_sync's run with every way of waiting for the GPU counted (torch.cuda.synchronize, stream and
    event synchronize, elapsed_time, query), and where: inside a timed window (from the "N steps" progress step
    to the ctx.sync() after it) or outside. One row per rank."""
    import torch

    from kit.investigations import dataloader_sync as D

    log, step, sync = [], ctx.step, ctx.sync
    ctx.step = lambda name: (log.append(("step", name)), step(name))[1]
    ctx.sync = lambda: (log.append(("sync", "")), sync())[1]

    def counted(owner, name):
        fn = getattr(owner, name)

        def wrapper(*a, **k):
            log.append(("wait", name))
            return fn(*a, **k)

        setattr(owner, name, wrapper)

    for owner, name in ((torch.cuda, "synchronize"), (torch.cuda.Stream, "synchronize"), (torch.cuda.Event, "synchronize"),
                        (torch.cuda.Event, "elapsed_time"), (torch.cuda.Event, "query")):
        counted(owner, name)
    n = sum(1 for _ in D.run(cfg, ctx))
    inside, waits, windows = False, 0, 0
    for kind, name in log:
        if kind == "step":
            inside = name.endswith(" steps")
            windows += inside
        elif kind == "sync":
            inside = False
        elif inside:
            waits += 1
    yield {"kind": "check", "rows": n, "waits_in_timed_steps": waits, "timed_windows": windows}
