"""Launch overhead: kit.launch of a trivial experiment vs a bare torch.multiprocessing.spawn of it, and vs
torch.distributed.elastic's ``start_processes`` (what kit.launch could have been built on; see the
``kit.launch`` docstring for why it is not).

Target: the kit's launch costs at most 1.3x the bare spawn on 2 gloo ranks. Every side starts 2 processes and
creates a gloo process group (the bare function does the same init a real experiment needs), so what is
measured is the kit's own machinery: run directory, meta.json, sysinfo, typed messages through a queue,
watchdog, bounded teardown.

    python benchmarks/bench_launch.py [--repeats 5]
"""

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
TARGET = 1.3


def _bare(rank, world, port):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = [{"ok": 1}]
    dist.destroy_process_group()
    return rows


def trivial(cfg, ctx):
    return [{"ok": 1}]


def _elastic(port: int, log_dir: str) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    try:
        pc = start_processes("bench", _bare, {r: (r, 2, port) for r in range(2)}, {0: {}, 1: {}},
                             DefaultLogsSpecs(log_dir=log_dir), start_method="spawn")
        result = pc.wait(period=0.05)
        assert result is not None and not result.is_failed(), result
    finally:
        for s, h in handlers.items():  # start() replaces them for good
            signal.signal(s, h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import torch.multiprocessing as mp

    from kit.config import LaunchConfig
    from kit.launch import free_port, launch

    bare, elastic, kit = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = LaunchConfig(world_size=2, backend="gloo", results_root=tmp)
        for i in range(args.repeats):  # interleaved, so drift affects all
            t = time.perf_counter()
            mp.spawn(_bare, args=(2, free_port()), nprocs=2, join=True)
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            _elastic(free_port(), os.path.join(tmp, f"elastic{i}"))
            elastic.append(time.perf_counter() - t)
            t = time.perf_counter()
            launch(trivial, cfg, "bench")
            kit.append(time.perf_counter() - t)
    b, e, k = statistics.median(bare), statistics.median(elastic), statistics.median(kit)
    print(f"bare mp.spawn          : median {b:.2f} s  {['%.2f' % x for x in bare]}")
    print(f"elastic start_processes: median {e:.2f} s  {['%.2f' % x for x in elastic]}")
    print(f"kit.launch             : median {k:.2f} s  {['%.2f' % x for x in kit]}")
    print(f"ratio kit/bare {k / b:.2f} (target <= {TARGET}) -> {'PASS' if k / b <= TARGET else 'FAIL'}; "
          f"elastic/bare {e / b:.2f}")
    return 0 if k / b <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
