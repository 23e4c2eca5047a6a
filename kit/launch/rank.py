"""The rank's side: :class:`Ctx` (what an experiment sees), process-group set-up and teardown, and the main
function of a spawned rank.

A spawned rank (``rank_main``):

1. ignores SIGINT (a terminal Ctrl-C reaches the whole process group; the supervisor coordinates it: it
   drains the rows already sent, then kills the ranks) and arranges to die with its supervisor
   (``PR_SET_PDEATHSIG`` = SIGKILL, which works even while the rank is blocked inside NCCL, plus a thread
   that watches ``getppid()`` for platforms without prctl);
2. sends its stdout/stderr (NCCL_DEBUG output included) to ``logs/rank<N>.log`` -- a notebook kernel would
   lose it -- and registers faulthandler on SIGUSR1 to ``logs/rank<N>.stacks`` for the hang diagnosis;
3. sets the env overrides, creates the process group, runs the experiment and sends every row as a
   :mod:`~kit.launch.messages` message;
4. flushes the queue (``join_thread``: every message is in the pipe before anything is torn down), tears the
   process group down (:func:`destroy_pg`: live CUDA graphs released first; the rank itself gives up after
   a few seconds -- a CUDA graph that captured NCCL kernels and was never destroyed holds NCCL's teardown
   forever -- and the supervisor's ``teardown_s`` bounds whatever the rank cannot) and leaves with ``os._exit``, skipping interpreter-exit destructors, the
   other place teardown has been seen to hang.
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .messages import Done, Error, Log, Message, Ready, Row, Step, SysInfo

ExperimentFn = Callable[[Any, "Ctx"], Iterable[dict]]


@dataclass
class Ctx:
    """What an experiment's ``run(cfg, ctx)`` gets: who it is, its device, progress reports, a barrier.

    Built inside the rank (never pickled); ``_emit`` sends a message to the supervisor (spawn mode) or feeds
    the rank's own watchdog (in place)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    run_dir: Path
    _emit: Callable[[Message], None] = field(repr=False, default=lambda m: None)

    @property
    def is_cuda(self) -> bool:
        return self.backend == "nccl"

    @property
    def device(self):
        import torch

        return torch.device("cuda", self.local_rank) if self.is_cuda else torch.device("cpu")

    def step(self, name: str, point: bool = True) -> None:
        """Report progress. The watchdog names the last step of a rank that hangs. Rank 0's steps are the
        investigation's measurement points (the progress bar's count against ``Investigation.points``); a finer
        step, there only for the watchdog's message, passes ``point=False``."""
        self._emit(Step(self.rank, str(name), bool(point)))

    def log(self, *args) -> None:
        """A line shown by the supervisor (rank-prefixed) and written to the rank's log."""
        text = " ".join(str(a) for a in args)
        print(text, flush=True)
        self._emit(Log(self.rank, text))

    def sync(self) -> None:
        if self.is_cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        """All ranks here, and this rank's device idle: the start line for a timed sample."""
        import torch
        import torch.distributed as dist

        if self.world_size > 1:
            if self.is_cuda:
                # a 1-element all_reduce is a barrier that also orders this rank's stream (no device_ids warning)
                t = torch.ones(1, device=self.device)
                dist.all_reduce(t)
            else:
                dist.barrier()
        self.sync()


# --------------------------------------------------------------------------------------------- files of a rank
def log_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.log"


def stacks_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.stacks"


def tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------- process group
def set_rank_env(rank: int, world: int, local_rank: int, port: int | None, env: dict[str, str]) -> None:
    os.environ.update({k: str(v) for k, v in env.items()})
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def init_pg(backend: str, rank: int, world: int, local_rank: int, init_method: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=max(timeout_s, 30))
    kwargs = {}
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)  # eager communicator init, bound to our GPU
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=timeout,
                                **kwargs)
    except TypeError:  # torch < 2.3 has no device_id: the communicator is then created at the first collective
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=timeout)


def release_graphs() -> list[str]:
    """Reset every ``torch.cuda.CUDAGraph`` still alive; returns what referred to each (type names).

    Why: a CUDA graph that captured NCCL kernels holds a reference on the communicator's persistent resources
    (NCCL releases them from the graph's destructor), and ``ncclCommDestroy`` waits for them -- with such a graph
    alive, ``destroy_process_group`` never returns. Measured on 2xH200 (NCCL 2.28.9, torch 2.11): 2 ranks, a
    4-layer all_reduce model captured in a graph, destroy_process_group still running after 40 s with the graph
    alive, 0.3 s once it was deleted (0.5 s with no graph at all); the profiler made no difference."""
    import gc

    import torch

    graphs = [o for o in gc.get_objects() if issubclass(type(o), torch.cuda.CUDAGraph)]  # no isinstance: a
    # proxy among gc's objects (torch.distributed.reduce_op) warns when asked for its class
    holders = []
    for g in graphs:
        refs = [type(r).__name__ for r in gc.get_referrers(g) if r is not graphs]
        holders.append("/".join(sorted(set(refs))) or "nothing")
        g.reset()
    return holders


DESTROY_STUCK = "teardown did not finish within"
"""the rank log's line when the rank gave up on destroy_process_group (the supervisor reports it)"""


def destroy_wait(teardown_s: float) -> float:
    """How long a rank waits for destroy_process_group: 5 s, or ``$KIT_DESTROY_WAIT_S`` (to attach a debugger to
    a hanging teardown), never more than half the supervisor's ``teardown_s``."""
    try:
        want = float(os.environ.get("KIT_DESTROY_WAIT_S", "5"))
    except ValueError:
        want = 5.0
    return max(0.0, min(want, teardown_s / 2))


def destroy_pg(log=None, wait_s: float = 5.0, failed: bool = False) -> None:
    """Tear the process group down, in order: free what the experiment left unreferenced (CUDA graphs that
    captured NCCL kernels, profiler objects: ``gc.collect``, :func:`release_graphs`), wait for this rank's GPU
    work, then ``destroy_process_group`` -- all of it in a thread waited for ``wait_s`` at most, so a GPU
    that never finishes (a rank that ``failed`` while its NCCL kernel waits for a dead peer) or a
    communicator that never lets go cannot hold the rank. Each phase goes to ``log`` (``kit: teardown ...``).
    After a failure the garbage collection and the synchronisation are skipped: only the communicator is
    destroyed.

    Why the bound: a CUDA graph that captured NCCL kernels and still exists keeps ``ncclCommFinalize`` polling
    forever (``commDestroySync`` in NCCL's ``src/init.cc``: "keep polling until all graphs referencing us
    die"), and not every such graph is a Python object :func:`release_graphs` can reach: on 2xH200 (NCCL
    2.28.9, torch 2.11) graph_gaps' ranks hung there because ``CUDAGraph.enable_debug_mode()`` -- a process-wide
    flag -- made PyTorch leak the captured graph of every later capture (found with a native stack, fixed in
    graph_gaps: ``recorded/probes/graph_gaps-teardown-h200x2/``). Results are complete by then: the rank exits
    after ``wait_s`` on its own and says so, instead of costing the run ``teardown_s`` and a kill. (A communicator not destroyed writes no NCCL profiler-plugin dump: the
    collective_tracing analyses name a missing or unreadable dump and go on.)"""
    import gc

    def say(msg: str) -> None:
        if log is not None:
            print(f"kit: teardown: {msg}", file=log, flush=True)

    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # pragma: no cover - torch is a dependency
        return say(f"{type(e).__name__}: {e}")
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    device = torch.cuda.current_device() if cuda else None
    done: list[str] = []

    def teardown() -> None:
        try:
            if cuda:
                torch.cuda.set_device(device)  # a new thread starts on device 0
            if not failed:
                t = time.monotonic()
                gc.collect()
                if cuda:
                    torch.cuda.synchronize(device)
                    live = release_graphs()
                    if live:
                        say(f"{len(live)} CUDA graph(s) still referenced after the experiment (by "
                            f"{', '.join(live)}): reset before the communicator is destroyed")
                say(f"gc + synchronize {time.monotonic() - t:.2f} s")
            if dist.is_initialized():
                t = time.monotonic()
                dist.destroy_process_group()
                say(f"destroy_process_group {time.monotonic() - t:.2f} s")
        except Exception as e:
            say(f"{type(e).__name__}: {e}")
        done.append("done")

    th = threading.Thread(target=teardown, daemon=True, name="kit-teardown")
    th.start()
    th.join(wait_s)
    if not done:
        say(f"{DESTROY_STUCK} {wait_s:g} s: exiting without it (the process's exit releases the GPU)")


def die_with_parent(parent_pid: int) -> None:
    """Make this rank exit when the supervisor dies, whatever killed it (SIGKILL included)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills us, even inside a C call
        except Exception:
            pass

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(70)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="kit-parent-watch").start()


# --------------------------------------------------------------------------------------------- spawned rank
def rank_main(fn: ExperimentFn, cfg: Any, rank: int, world: int, backend: str, port: int, run_dir: str,
              q, parent_pid: int) -> None:
    """The target of each spawned rank process (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
    log = open(log_path(run_dir, rank), "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    stacks = open(stacks_path(run_dir, rank), "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    code, phase = 0, "init"
    emit = q.put
    try:
        set_rank_env(rank, world, rank, port, cfg.env)
        init_pg(backend, rank, world, rank, f"tcp://127.0.0.1:{port}", cfg.timeout_s)
        emit(Ready(rank))
        if rank == 0:
            from .. import sysinfo

            emit(SysInfo(rank, sysinfo.collect()))
        phase = "run"
        ctx = Ctx(rank, world, rank, backend, Path(run_dir), emit)
        for row in fn(cfg, ctx) or ():
            emit(Row(rank, dict(row)))
        phase = "done"
        emit(Done(rank))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the supervisor
        code = 1
        emit(Error.from_exception(rank, phase, e, traceback.format_exc()))
    finally:
        try:
            q.close()
            q.join_thread()  # every message is in the pipe before we tear anything down
        except Exception:
            pass
        if code == 0:
            destroy_pg(log, wait_s=destroy_wait(cfg.teardown_s))  # the supervisor's teardown_s bounds the rest
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter-exit destructors, the other place teardown has been seen to hang
