"""In-place mode: this process already is one rank of a job started by torchrun or srun.

There is no supervisor process of the kit's own: the job's launcher (torchrun's agent, slurmstepd) owns the
processes. Rank 0 names the run directory (broadcast to the others: ranks may write traces there on a
shared filesystem), writes ``meta.json`` -- recording *itself* as the run's supervisor -- and streams its own
rows to ``rows.csv``; the other ranks' rows are gathered to rank 0 at the end. Each rank runs its own
watchdog thread: silent for ``timeout_s``, it dumps its stacks to stderr and exits (code 3), and the job's
launcher tears the job down.

The meta records the placement (:func:`kit.launch.meta.placement`: nodes, ranks per node, as
:func:`kit.launch.node.node_id` tells them apart). A launcher that made the run directory already (emulated
nodes, :mod:`kit.launch.emulated`) names it in ``KIT_RUN_DIR``; rank 0 then writes there.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from .. import results
from ..progress import PointsFile
from . import meta as run_meta
from .messages import Message, Step
from .node import node_id, resolve
from .rank import Ctx, ExperimentFn, destroy_pg, init_pg, set_rank_env


def external_ranks() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size or 0) from torchrun's or SLURM's variables."""
    e = os.environ
    if "RANK" in e and "WORLD_SIZE" in e:
        return int(e["RANK"]), int(e["WORLD_SIZE"]), int(e.get("LOCAL_RANK", 0)), int(e.get("LOCAL_WORLD_SIZE", 0) or 0)
    rank, world = int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"])
    local = int(e.get("SLURM_LOCALID", 0))
    per_node = e.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    os.environ.setdefault("MASTER_PORT", str(20000 + int(e.get("SLURM_JOB_ID", "0")) % 20000))
    if "MASTER_ADDR" not in e:
        import subprocess

        nodes = subprocess.run(["scontrol", "show", "hostnames", e.get("SLURM_JOB_NODELIST", "")],
                               capture_output=True, text=True).stdout.split()
        os.environ["MASTER_ADDR"] = nodes[0] if nodes else "127.0.0.1"
    return rank, world, local, int(per_node) if per_node.isdigit() else 0


class _Watchdog:
    """This rank's own progress clock: fed by ``ctx`` messages and rows, checked by a daemon thread."""

    def __init__(self, rank: int, timeout_s: float):
        self.rank, self.timeout_s = rank, timeout_s
        self.last, self.step = time.monotonic(), "(start-up)"
        self._stop = threading.Event()

    def __call__(self, msg: Message | None = None) -> None:
        self.last = time.monotonic()
        if isinstance(msg, Step):
            self.step = msg.name

    def start(self) -> None:
        threading.Thread(target=self._watch, daemon=True, name="kit-watchdog").start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:  # torchrun restarts/kills the group once this rank exits
        while not self._stop.wait(1.0):
            if time.monotonic() - self.last > self.timeout_s:
                print(f"[kit] rank {self.rank} hung: no progress for {self.timeout_s:g} s in step {self.step!r}; "
                      f"stacks follow", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)


def launch_in_place(fn: ExperimentFn, cfg, experiment: str, on_row=None) -> results.Run:
    import torch.distributed as dist

    rank, world, local_rank, local_world = external_ranks()
    _, backend = resolve(dataclasses.replace(cfg, world_size=world), local_world or 1)
    set_rank_env(rank, world, local_rank, None, cfg.env)
    init_pg(backend, rank, world, local_rank, "env://", cfg.timeout_s)
    holder = [None]
    meta = run_meta.start_meta(experiment, cfg, world, backend, "in-place")
    where = [None] * world
    dist.all_gather_object(where, {"rank": rank, "node": node_id(), "local_rank": local_rank})
    meta["placement"] = run_meta.placement(where)
    if rank == 0:
        given = os.environ.get("KIT_RUN_DIR")
        run_dir = Path(given) if given else results.new_run_dir(cfg.results_root, experiment)
        (run_dir / "logs").mkdir(exist_ok=True)
        holder[0] = str(run_dir)
        from .. import sysinfo

        meta["sysinfo"] = sysinfo.collect()
        run_meta.write(run_dir, meta)
    dist.broadcast_object_list(holder, src=0)
    run_dir = Path(holder[0])
    writer = results.RowWriter(run_dir / "rows.csv") if rank == 0 else None
    mine: list[dict] = []
    watchdog = _Watchdog(rank, cfg.timeout_s)
    watchdog.start()
    points = PointsFile(run_dir) if rank == 0 else None  # the measurement points, for the progress bar

    def emit(msg: Message) -> None:
        watchdog(msg)
        if points is not None and isinstance(msg, Step):
            points.step(msg.name, msg.point)

    ctx = Ctx(rank, world, local_rank, backend, run_dir, emit)
    run = results.Run(run_dir, meta, writer.rows if writer else mine)
    failed = False
    try:
        for row in fn(cfg, ctx) or ():
            row = {"rank": rank, **row}
            watchdog()
            mine.append(row)
            if writer:
                writer.add(row)
                if on_row:
                    on_row(row)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if writer:
            for r, rows in enumerate(gathered):
                if r != 0:
                    writer.extend(rows)
            run_meta.finish(run_dir, meta, "ok")
        return run
    except BaseException as e:
        failed = True
        if writer:
            run_meta.finish(run_dir, meta, "failed", f"rank 0: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        raise
    finally:
        watchdog.stop()
        if points is not None:
            points.close()
        destroy_pg(sys.stderr, failed=failed)  # bounded: a failed rank's GPU may wait for a dead peer forever
