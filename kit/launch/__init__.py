"""Run an experiment on N ranks and get every rank's rows back.

An experiment is a plain function ``fn(cfg, ctx) -> iterable of dict rows`` (a generator streams its rows;
the launcher saves each row as it arrives). ``cfg`` is the experiment's validated Config dataclass, ``ctx``
a :class:`Ctx` (rank, world size, device, ``step()`` for progress, ``barrier()``, the run directory).

Two modes, the same experiment code:

* **spawn** (one node, the default): one process per rank (``torch.multiprocessing``, spawn start method),
  rendezvous on ``tcp://127.0.0.1:<free port>`` (a new port is tried if the one picked was taken). The caller
  (a notebook, the CLI) is the **supervisor** (:class:`~kit.launch.supervisor.Supervisor`): it never touches
  CUDA, receives typed messages (:mod:`kit.launch.messages`) through a queue, writes rows to the run
  directory and enforces the fault rules below.
* **emulated nodes** (``KIT_NODES=K`` in ``cfg.env`` or the environment; :mod:`kit.launch.emulated`): this
  host plays K nodes -- K torchrun agents started by the kit, each with its own ``NCCL_HOSTID`` and GPUs, NCCL's
  network transport between them; the ranks run in place (below) and the meta records the transport NCCL
  chose per peer.
* **in place** (already launched by torchrun, or srun under SLURM: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` or
  ``SLURM_PROCID``/``SLURM_NTASKS``; :mod:`kit.launch.inplace`): no spawn; this process is one rank. Rank 0
  writes the run directory, streaming its own rows and gathering the other ranks' rows at the end.

The modes that start processes (spawn's ranks, the emulated nodes' agents) supervise them on one template,
:class:`kit.launch.procs.ProcessSupervisor` (start, poll until the run ends, close), and stop them one way
(:func:`kit.launch.procs.stop`: SIGTERM, then SIGKILL after a grace period; every child reaped).

Env overrides (``cfg.env``) are put into ``os.environ`` of each rank before ``init_process_group``, i.e.
before any NCCL communicator exists (NCCL reads most variables once, at its first initialisation), and are
recorded in ``meta.json`` (:mod:`kit.launch.meta`), with the supervisor's pid and host so that a reader can
tell a run whose supervisor was killed (:func:`kit.results.run_status` says ``died``).

Faults (spawn mode), each covered by a test in ``tests/test_launch.py``:

* a rank raises -> :class:`LaunchError` naming the rank with its traceback; the other ranks are killed at
  once (SIGTERM, SIGKILL 2 s later);
* a rank hangs -> the watchdog fires after ``cfg.timeout_s`` without progress (a ``ctx.step()`` or a row),
  dumps each silent rank's Python stack and names the culprit (:mod:`kit.launch.hang`), kills all ranks;
* teardown is bounded: once a rank has sent its last row it has ``cfg.teardown_s`` to exit, after which it
  is killed; results are kept;
* Ctrl-C / SIGTERM to the supervisor kills every rank before re-raising; each rank also dies with its
  supervisor, SIGKILL included (``PR_SET_PDEATHSIG``), so no orphan keeps holding a GPU;
* rows produced before any fault are in ``rows.csv`` and on ``LaunchError.run``; ``meta.json`` says
  ``status: failed`` and ``error.txt`` holds the error.

Modules: ``node`` (GPUs, backend, free port, launched externally?, node id), ``emulated``, ``rank`` (:class:`Ctx`, the spawned
rank's main, process-group set-up), ``messages``, ``supervisor``, ``hang``, ``meta``, ``inplace``.

**Why the kit spawns and kills its ranks itself** rather than on ``torch.distributed.elastic``'s process
context (``start_processes`` / ``MultiprocessContext``, read in torch 2.13's
``torch/distributed/elastic/multiprocessing/api.py``, and probed with two ranks on gloo):

1. *No row streaming.* A ``PContext`` returns one value per rank when all have finished
   (``RunProcsResult.return_values``). Rows must reach ``rows.csv`` as they are made, so the queue and the
   loop reading it would be ours anyway.
2. *Kill before drain.* When a rank fails, ``MultiprocessContext._poll`` (via ``ProcessContext.join``)
   terminates the others inside the poll, before the caller regains control. The kit first saves the rows
   the other ranks already sent, then kills: a rank killed while writing to a queue can leave half a message
   in the pipe.
3. *Unbounded teardown.* Once every rank has returned, ``_poll`` blocks in ``while not self._pc.join()``
   until every process has exited. Probed: ``wait(timeout=0.2)`` returned after 8.5 s when a rank's
   interpreter exit took 8 s. The teardown hang seen on 2xH200 (live profiler + captured CUDA graph) never
   ends, so ``cfg.teardown_s`` cannot be built on ``wait()``.
4. *Death signal.* torch's process wrapper sets ``PR_SET_PDEATHSIG`` to SIGINT. Kit ranks ignore SIGINT (a
   terminal Ctrl-C reaches the whole process group; the supervisor must drain, then kill), and a rank
   blocked in a C call (an NCCL wait) runs no Python handler until the call returns. The kit uses SIGKILL.
5. *Process-wide signal handlers.* ``PContext.start()`` on the main thread replaces the SIGTERM, SIGINT,
   SIGHUP and SIGQUIT handlers with one raising ``SignalException`` and never restores them (probed: SIGINT
   went from ``default_int_handler`` to ``_terminate_process_handler``). In a Jupyter kernel that changes
   what "interrupt" raises for the rest of the session.
6. *Log specs.* stdout and stderr go to separate files, ``<log_dir>/<run id>/attempt_0/<rank>/stdout.log``
   and ``stderr.log``, each opened ``w+b`` (one file for both would be clobbered). The kit keeps one
   ``logs/rank<N>.log`` per rank with both streams in order (a traceback after the NCCL_DEBUG lines that
   led to it), the file whose tail a :class:`LaunchError` shows.
7. *No progress watchdog, no stack dumps* (elastic's ``timer`` kills an expired worker, it does not
   diagnose).

What would remain to use is process start and ``close()`` (SIGTERM, then SIGKILL), the ~20 lines of
``Supervisor._kill_all``. Worth revisiting if NUMA binding (``numa_options``) is wanted; ``rank_main`` can
also set its affinity itself.
"""

from __future__ import annotations

from typing import Callable

from .. import results
from ..config import LaunchConfig
from .inplace import launch_in_place
from .node import cuda_device_count, free_port, launched_externally, resolve
from .rank import Ctx, ExperimentFn
from .supervisor import LaunchError, Supervisor

__all__ = ["launch", "Ctx", "LaunchError", "ExperimentFn", "launched_externally", "cuda_device_count", "resolve",
           "free_port"]


def launch(fn: ExperimentFn, cfg: LaunchConfig, experiment: str | None = None, *,
           on_row: Callable[[dict], None] | None = None, verbose: bool = False) -> results.Run:
    """Run ``fn(cfg, ctx)`` on every rank; return the :class:`~kit.results.Run` with all ranks' rows.

    Spawns ``cfg.world_size`` ranks on this node, or runs in place when launched by torchrun / SLURM.
    Raises :class:`LaunchError` (with ``.run`` holding the rows saved before the fault) on any fault.
    """
    experiment = experiment or getattr(fn, "__module__", "experiment").rsplit(".", 1)[-1]
    if launched_externally():
        return launch_in_place(fn, cfg, experiment, on_row)
    from . import emulated  # not at import time: ``python -m kit.launch.emulated`` is the agents' worker

    nodes = emulated.nodes_requested(cfg)
    if nodes > 1:
        return emulated.launch_emulated(fn, cfg, experiment, nodes, on_row=on_row, verbose=verbose)
    world, backend = resolve(cfg)
    # free_port is looked up here, at call time, so that a test can replace kit.launch.free_port
    return Supervisor(fn, cfg, experiment, world, backend, on_row=on_row, verbose=verbose).launch(
        lambda: free_port())
