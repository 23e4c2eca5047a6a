"""Launch overhead: kit.launch of a trivial experiment vs a bare torch.multiprocessing.spawn of it.

Target: the kit's launch costs at most 1.3x the bare spawn on 2 gloo ranks. Both sides start 2 processes and
create a gloo process group (the bare function does the same init a real experiment needs), so what is
measured is the kit's own machinery: run directory, meta.json, sysinfo, queue, watchdog, bounded teardown.

    python benchmarks/bench_launch.py [--repeats 5]
"""

import argparse
import os
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import torch.multiprocessing as mp

    from kit.config import LaunchConfig
    from kit.launch import free_port, launch

    bare, kit = [], []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = LaunchConfig(world_size=2, backend="gloo", results_root=tmp)
        for _ in range(args.repeats):  # interleaved, so drift affects both
            t = time.perf_counter()
            mp.spawn(_bare, args=(2, free_port()), nprocs=2, join=True)
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            launch(trivial, cfg, "bench")
            kit.append(time.perf_counter() - t)
    b, k = statistics.median(bare), statistics.median(kit)
    print(f"bare mp.spawn: median {b:.2f} s  {['%.2f' % x for x in bare]}")
    print(f"kit.launch   : median {k:.2f} s  {['%.2f' % x for x in kit]}")
    print(f"ratio {k / b:.2f} (target <= {TARGET}) -> {'PASS' if k / b <= TARGET else 'FAIL'}")
    return 0 if k / b <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
