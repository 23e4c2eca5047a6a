"""Run an experiment on N ranks and get every rank's rows back.

An experiment is a plain function ``fn(cfg, ctx) -> iterable of dict rows`` (a generator streams its rows;
the launcher saves each row as it arrives). ``cfg`` is the experiment's validated Config dataclass, ``ctx``
a :class:`Ctx` (rank, world size, device, ``step()`` for progress, ``barrier()``, the run directory).

Two modes, the same experiment code:

* **spawn** (one node, the default): ``torch.multiprocessing`` with the spawn start method, one process per
  rank, rendezvous on ``tcp://127.0.0.1:<free port>`` (a new port is tried if the one picked was taken).
  The caller (a notebook, the CLI) is the parent: it never touches CUDA, receives rows through a queue,
  writes them to the run directory and enforces the fault rules below.
* **in place** (already launched by torchrun, or srun under SLURM: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` or
  ``SLURM_PROCID``/``SLURM_NTASKS``): no spawn; this process is one rank. Rank 0 writes the run directory,
  streaming its own rows and gathering the other ranks' rows at the end.

Env overrides (``cfg.env``) are put into ``os.environ`` of each rank before ``init_process_group``, i.e.
before any NCCL communicator exists (NCCL reads most variables once, at its first initialisation), and are
recorded in ``meta.json``.

Faults (spawn mode), each covered by a test:

* a rank raises -> :class:`LaunchError` naming the rank with its traceback; the other ranks are killed at
  once (SIGTERM, SIGKILL 2 s later);
* a rank hangs -> the watchdog fires after ``cfg.timeout_s`` without progress (a ``ctx.step()`` or a row),
  dumps each silent rank's Python stack (faulthandler on SIGUSR1), kills all ranks and names the rank(s)
  with the least progress and their last step;
* teardown is bounded: once a rank has sent its last row it has ``cfg.teardown_s`` to exit (it calls
  ``destroy_process_group`` and then ``os._exit`` to skip interpreter-exit destructors, which have been seen
  to hang with a live profiler and a captured CUDA graph), after which it is killed; results are kept;
* Ctrl-C / SIGTERM to the parent kills every rank before re-raising; each rank also dies with its parent
  (``PR_SET_PDEATHSIG`` on Linux, plus a watcher thread), so no orphan keeps holding a GPU;
* rows produced before any fault are in ``rows.csv`` and on ``LaunchError.run``; ``meta.json`` says
  ``status: failed`` and ``error.txt`` holds the error.
"""

from __future__ import annotations

import ctypes
import dataclasses
import faulthandler
import os
import queue as queue_mod
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from . import results
from .config import LaunchConfig

ExperimentFn = Callable[[Any, "Ctx"], Iterable[dict]]

_KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL; a rank blocked inside NCCL may ignore nothing but SIGKILL
_POLL_S = 0.05  # parent loop tick: bounds how late a fault is noticed, costs nothing measurable
_PORT_TRIES = 4


class LaunchError(RuntimeError):
    """A run that did not complete. ``.run`` holds the rows produced before the fault; ``.rank`` the culprit."""

    def __init__(self, message: str, run: results.Run | None = None, rank: int | None = None, kind: str = "error"):
        super().__init__(message)
        self.run = run
        self.rank = rank
        self.kind = kind


# --------------------------------------------------------------------------------------------- rank context
@dataclass
class Ctx:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    run_dir: Path
    _emit: Callable[[tuple], None] = field(repr=False, default=lambda m: None)

    @property
    def is_cuda(self) -> bool:
        return self.backend == "nccl"

    @property
    def device(self):
        import torch

        return torch.device("cuda", self.local_rank) if self.is_cuda else torch.device("cpu")

    def step(self, name: str) -> None:
        """Report progress. The watchdog names the last step of a rank that hangs."""
        self._emit(("step", self.rank, str(name)))

    def log(self, *args) -> None:
        """A line shown by the parent (rank-prefixed) and written to the rank's log."""
        text = " ".join(str(a) for a in args)
        print(text, flush=True)
        self._emit(("log", self.rank, text))

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


# --------------------------------------------------------------------------------------------- helpers
def launched_externally() -> bool:
    """True under torchrun / torch.distributed.run or srun: this process already is one rank."""
    e = os.environ
    if "RANK" in e and "WORLD_SIZE" in e:
        return True
    return "SLURM_PROCID" in e and "SLURM_NTASKS" in e and int(e.get("SLURM_NTASKS", "1")) > 1


def cuda_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def resolve(cfg: LaunchConfig, local_world_size: int | None = None) -> tuple[int, str]:
    """(world_size, backend) for a spawn launch on this node; raises ConfigError when impossible."""
    from .config import ConfigError

    ngpu = cuda_device_count()
    world = cfg.world_size or (max(ngpu, 1) if ngpu else 2)
    local = local_world_size or world
    backend = cfg.backend
    if backend == "auto":
        backend = "nccl" if ngpu >= local and ngpu > 0 else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ConfigError(f"backend must be auto, nccl or gloo, not {backend!r}")
    if backend == "nccl" and local > ngpu:
        raise ConfigError(f"world_size {local} needs {local} GPUs (one per rank) but {ngpu} are visible")
    return world, backend


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(parent_pid: int) -> None:
    """Make this rank exit when the launcher dies, whatever killed it."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(70)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="kit-parent-watch").start()


def _set_rank_env(rank: int, world: int, local_rank: int, port: int | None, env: dict[str, str]) -> None:
    os.environ.update({k: str(v) for k, v in env.items()})
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def _init_pg(backend: str, rank: int, world: int, local_rank: int, init_method: str, timeout_s: float) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    kwargs = {}
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)  # eager communicator init, bound to our GPU
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=max(timeout_s, 30)), **kwargs)
    except TypeError:  # torch < 2.3 has no device_id: the communicator is then created at the first collective
        kwargs.pop("device_id", None)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=max(timeout_s, 30)))


def _destroy_pg() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


# --------------------------------------------------------------------------------------------- spawn: rank side
def _rank_main(fn: ExperimentFn, cfg: Any, rank: int, world: int, backend: str, port: int, run_dir: str,
               q, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates Ctrl-C
    _die_with_parent(parent_pid)
    logs = Path(run_dir) / "logs"
    # Each rank's stdout/stderr (NCCL_DEBUG output included) goes to logs/rank<N>.log: a notebook kernel
    # would otherwise lose it. The parent shows the tail of it when the rank fails.
    log = open(logs / f"rank{rank}.log", "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    stacks = open(logs / f"rank{rank}.stacks", "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    code, phase = 0, "init"

    def emit(msg):
        q.put(msg)

    try:
        _set_rank_env(rank, world, rank, port, cfg.env)
        _init_pg(backend, rank, world, rank, f"tcp://127.0.0.1:{port}", cfg.timeout_s)
        emit(("ready", rank))
        if rank == 0:
            from . import sysinfo

            emit(("sysinfo", rank, sysinfo.collect()))
        phase = "run"
        ctx = Ctx(rank, world, rank, backend, Path(run_dir), emit)
        for row in fn(cfg, ctx) or ():
            emit(("row", rank, dict(row)))
        phase = "done"
        emit(("done", rank))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        code = 1
        port_taken = phase == "init" and ("address already in use" in str(e).lower() or "EADDRINUSE" in str(e))
        emit(("error", rank, phase, "port" if port_taken else "", f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        try:
            q.close()
            q.join_thread()  # every message is in the pipe before we tear anything down
        except Exception:
            pass
        if code == 0:
            _destroy_pg()  # may hang (seen with profiler + CUDA graph): the parent bounds it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter-exit destructors, the other place teardown has been seen to hang


# --------------------------------------------------------------------------------------------- spawn: parent side
@dataclass
class _RankState:
    proc: Any
    last_progress: float
    steps: int = 0
    step: str = "(start-up)"
    done: bool = False
    exited_at: float | None = None


def _kill_all(states: dict[int, _RankState], grace: float = _KILL_GRACE_S) -> None:
    procs = [s.proc for s in states.values() if s.proc.is_alive()]
    for p in procs:
        try:
            p.terminate()
        except Exception:
            pass
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            try:
                p.kill()
            except Exception:
                pass
            p.join(1.0)


def _tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])
    except OSError:
        return ""


class _Terminated(BaseException):
    pass


def _spawn_once(fn, cfg, world, backend, run_dir: Path, writer: results.RowWriter, meta: dict, port: int,
                on_row: Callable[[dict], None] | None, verbose: bool) -> dict:
    """One attempt. Returns a status dict; raises LaunchError for faults."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    states: dict[int, _RankState] = {}
    now = time.monotonic()
    for r in range(world):
        p = ctx.Process(target=_rank_main, args=(fn, cfg, r, world, backend, port, str(run_dir), q, os.getpid()),
                        name=f"kit-rank{r}", daemon=False)  # not daemonic: ranks may start DataLoader workers
        p.start()
        states[r] = _RankState(p, now)
    warnings: list[str] = []
    run = results.Run(run_dir, meta, writer.rows)

    def fail(message: str, rank: int | None, kind: str):
        # Collect what the other ranks already sent, *then* kill: a rank killed while writing to the queue
        # can leave half a message in the pipe, so the queue is never read after a kill.
        _drain(q, states, writer, meta, on_row, verbose)
        _kill_all(states)
        raise LaunchError(message, run, rank, kind)

    try:
        while True:
            try:
                msg = q.get(timeout=_POLL_S)
            except queue_mod.Empty:
                msg = None
            if msg is not None:
                err = _handle(msg, states, writer, meta, on_row, verbose)
                if err is not None:
                    rank, phase, tag, summary, tb = err
                    if tag == "port":
                        _kill_all(states)
                        return {"retry_port": True}
                    log_tail = _tail(run_dir / "logs" / f"rank{rank}.log")
                    fail(f"rank {rank} raised in {phase} (step {states[rank].step!r}): {summary}\n\n"
                         f"--- traceback of rank {rank} ---\n{tb}" +
                         (f"--- end of logs/rank{rank}.log ---\n{log_tail}\n" if log_tail.strip() else ""),
                         rank, "error")
                continue  # drain quickly while messages flow
            t = time.monotonic()
            # exits: a rank that exits before 'done' without an error message died (segfault, os._exit, OOM kill)
            for r, s in states.items():
                code = s.proc.exitcode
                if code is None:
                    continue
                if s.exited_at is None:
                    s.exited_at = t
                if not s.done and code != 0 and t - s.exited_at > 0.5:  # let its last messages arrive
                    _drain(q, states, writer, meta, on_row, verbose)
                    if states[r].done:
                        continue
                    sig = f" (signal {signal.Signals(-code).name})" if code < 0 else ""
                    fail(f"rank {r} died with exit code {code}{sig} in step {s.step!r} without reporting an error\n"
                         f"--- end of logs/rank{r}.log ---\n{_tail(run_dir / 'logs' / f'rank{r}.log')}", r, "died")
                if not s.done and code == 0 and t - s.exited_at > 0.5:
                    _drain(q, states, writer, meta, on_row, verbose)
                    if not states[r].done:
                        fail(f"rank {r} exited (code 0) before finishing, in step {s.step!r}", r, "died")
            if all(s.done for s in states.values()):
                break
            # watchdog
            silent = {r: s for r, s in states.items() if not s.done and t - s.last_progress > cfg.timeout_s}
            if silent:
                message, culprit = _hang_report(states, silent, run_dir, cfg.timeout_s)
                fail(message, culprit, "hang")
        # every rank delivered everything; teardown is bounded
        deadline = time.monotonic() + cfg.teardown_s
        for r, s in states.items():
            s.proc.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r, s in states.items() if s.proc.is_alive()]
        if stuck:
            warnings.append(f"rank(s) {stuck} did not exit within teardown_s={cfg.teardown_s:g} s after finishing "
                            f"(stuck in destroy_process_group or interpreter exit); killed. Results are complete.")
            _kill_all(states)
        return {"warnings": warnings}
    except BaseException:
        _kill_all(states)
        raise
    finally:
        q.close()


def _handle(msg, states, writer, meta, on_row, verbose):
    kind, rank = msg[0], msg[1]
    s = states[rank]
    s.last_progress = time.monotonic()
    if kind == "row":
        row = {"rank": rank, **msg[2]} if "rank" not in msg[2] else msg[2]
        writer.add(row)
        s.steps += 1
        if on_row:
            on_row(row)
    elif kind == "step":
        s.steps += 1
        s.step = msg[2]
        if verbose:
            print(f"[rank {rank}] {msg[2]}", flush=True)
    elif kind == "log":
        print(f"[rank {rank}] {msg[2]}", flush=True)
    elif kind == "sysinfo":
        meta["sysinfo"] = msg[2]
    elif kind == "ready":
        s.step = "(ready)"
    elif kind == "done":
        s.done = True
    elif kind == "error":
        return msg[1:]
    return None


def _drain(q, states, writer, meta, on_row, verbose, quiet_s: float = 0.3) -> None:
    """Handle messages until none has arrived for ``quiet_s`` (rows in flight from live ranks)."""
    while True:
        try:
            msg = q.get(timeout=quiet_s)
        except (queue_mod.Empty, OSError, EOFError, ValueError):
            return
        if msg[0] != "error":
            _handle(msg, states, writer, meta, on_row, verbose)


def _main_thread_frames(stack_text: str) -> list[str]:
    """The 'File ... in func' lines of the thread that handled SIGUSR1 (the main thread), innermost first."""
    frames, inside = [], False
    for line in stack_text.splitlines():
        if line.startswith("Current thread") or line.startswith("Thread"):
            inside = line.startswith("Current thread")
            continue
        if inside and line.strip().startswith("File "):
            frames.append(line.strip())
    return frames


_WAITING_MARKERS = ("torch/distributed/", "torch\\distributed\\", " in synchronize", " in wait", " in barrier")


def _waiting_in_collective(frames: list[str]) -> bool:
    """A rank blocked inside a torch.distributed call (or a device sync) is most likely waiting for a peer."""
    return any(m in f for f in frames[:4] for m in _WAITING_MARKERS)


def _hang_report(states, silent, run_dir: Path, timeout_s: float) -> tuple[str, int]:
    """Dump every silent rank's Python stack, decide who hung, and describe it. Returns (message, culprit).

    Culprits: silent ranks *not* blocked inside a torch.distributed call (the others wait for them); if that
    does not single anyone out, the silent ranks with the least progress.
    """
    for r in silent:
        try:
            os.kill(states[r].proc.pid, signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(0.5)  # faulthandler writes synchronously from the signal handler
    stacks = {r: _tail(run_dir / "logs" / f"rank{r}.stacks", 200) for r in silent}
    not_waiting = [r for r in silent if not _waiting_in_collective(_main_thread_frames(stacks[r]))]
    if not_waiting and len(not_waiting) < len(silent):
        culprits = sorted(not_waiting)
    else:
        least = min(states[r].steps for r in silent)
        culprits = sorted(r for r in silent if states[r].steps == least)
    lines = [f"rank {', '.join(map(str, culprits))} hung: no progress for {timeout_s:g} s "
             f"(watchdog timeout_s) in step {states[culprits[0]].step!r}"]
    for r, s in sorted(states.items()):
        if s.done:
            state = "finished"
        else:
            state = f"last step {s.step!r} after {s.steps} progress reports"
            if r in silent and r not in culprits:
                state += " (blocked in a collective, waiting)"
        lines.append(f"  rank {r}: {state}")
    for r in sorted(silent, key=lambda r: (r not in culprits, r)):
        frames = _main_thread_frames(stacks[r])
        if frames:
            lines.append(f"--- Python stack of rank {r} when the watchdog fired (innermost first) ---\n  "
                         + "\n  ".join(frames[:12]))
    return "\n".join(lines), culprits[0]


# --------------------------------------------------------------------------------------------- public API
def launch(fn: ExperimentFn, cfg: LaunchConfig, experiment: str | None = None, *,
           on_row: Callable[[dict], None] | None = None, verbose: bool = False) -> results.Run:
    """Run ``fn(cfg, ctx)`` on every rank; return the :class:`~kit.results.Run` with all ranks' rows.

    Spawns ``cfg.world_size`` ranks on this node, or runs in place when launched by torchrun / SLURM.
    Raises :class:`LaunchError` (with ``.run`` holding the rows saved before the fault) on any fault.
    """
    experiment = experiment or getattr(fn, "__module__", "experiment").rsplit(".", 1)[-1]
    if launched_externally():
        return _launch_in_place(fn, cfg, experiment, on_row)
    world, backend = resolve(cfg)
    run_dir = results.new_run_dir(cfg.results_root, experiment)
    (run_dir / "logs").mkdir()
    meta = _start_meta(experiment, cfg, world, backend, "spawn")
    results.write_json(run_dir / "meta.json", meta)
    writer = results.RowWriter(run_dir / "rows.csv")
    run = results.Run(run_dir, meta, writer.rows)

    old_term = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):
            raise _Terminated()
        old_term = signal.signal(signal.SIGTERM, on_term)
    try:
        for attempt in range(_PORT_TRIES):
            status = _spawn_once(fn, cfg, world, backend, run_dir, writer, meta, free_port(), on_row, verbose)
            if not status.get("retry_port"):
                break
        else:
            raise LaunchError(f"could not find a free rendezvous port in {_PORT_TRIES} tries", run, 0, "port")
        meta["warnings"] = status.get("warnings", [])
        _finish(run_dir, meta, "ok")
        return run
    except LaunchError as e:
        _finish(run_dir, meta, "failed", str(e))
        raise
    except (KeyboardInterrupt, _Terminated) as e:
        what = "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else "terminated (SIGTERM)"
        _finish(run_dir, meta, "interrupted", f"launcher {what}; all ranks were killed")
        if isinstance(e, _Terminated):
            raise SystemExit(143) from None
        raise
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _start_meta(experiment, cfg, world, backend, mode) -> dict:
    return {
        "experiment": experiment,
        "status": "running",
        "mode": mode,
        "world_size": world,
        "backend": backend,
        "label": getattr(cfg, "label", ""),
        "config": dataclasses.asdict(cfg),
        "env_overrides": dict(cfg.env),
        "git_commit": results.git_commit(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "end_time": None,
        "sysinfo": None,
    }


def _finish(run_dir: Path, meta: dict, status: str, error: str | None = None) -> None:
    meta["status"] = status
    meta["end_time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if error:
        meta["error"] = error
        (run_dir / "error.txt").write_text(error + "\n")
    if meta.get("sysinfo") is None:  # the rank never got far enough; the parent's view is still worth having
        from . import sysinfo

        meta["sysinfo"] = sysinfo.collect()
    results.write_json(run_dir / "meta.json", meta)


# --------------------------------------------------------------------------------------------- in place (torchrun / SLURM)
def _external_ranks() -> tuple[int, int, int, int]:
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


def _launch_in_place(fn, cfg, experiment, on_row) -> results.Run:
    import torch.distributed as dist

    rank, world, local_rank, local_world = _external_ranks()
    _, backend = resolve(dataclasses.replace(cfg, world_size=world), local_world or 1)
    _set_rank_env(rank, world, local_rank, None, cfg.env)
    _init_pg(backend, rank, world, local_rank, "env://", cfg.timeout_s)
    # rank 0 names the run directory; everyone learns it (ranks may write traces there on a shared filesystem)
    holder = [None]
    meta = _start_meta(experiment, cfg, world, backend, "in-place")
    if rank == 0:
        run_dir = results.new_run_dir(cfg.results_root, experiment)
        (run_dir / "logs").mkdir()
        holder[0] = str(run_dir)
        from . import sysinfo

        meta["sysinfo"] = sysinfo.collect()
        results.write_json(run_dir / "meta.json", meta)
    dist.broadcast_object_list(holder, src=0)
    run_dir = Path(holder[0])
    writer = results.RowWriter(run_dir / "rows.csv") if rank == 0 else None
    mine: list[dict] = []
    last = {"t": time.monotonic(), "step": "(start-up)"}

    def emit(msg):
        last["t"] = time.monotonic()
        if msg[0] == "step":
            last["step"] = msg[2]

    stop = threading.Event()

    def watchdog():  # torchrun restarts/kills the group once this rank exits
        while not stop.wait(1.0):
            if time.monotonic() - last["t"] > cfg.timeout_s:
                print(f"[kit] rank {rank} hung: no progress for {cfg.timeout_s:g} s in step {last['step']!r}; "
                      f"stacks follow", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)

    threading.Thread(target=watchdog, daemon=True, name="kit-watchdog").start()
    ctx = Ctx(rank, world, local_rank, backend, run_dir, emit)
    run = results.Run(run_dir, meta, writer.rows if writer else mine)
    try:
        for row in fn(cfg, ctx) or ():
            row = {"rank": rank, **row}
            emit(("row", rank))
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
            _finish(run_dir, meta, "ok")
        return run
    except BaseException as e:
        if writer:
            _finish(run_dir, meta, "failed", f"rank 0: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        raise
    finally:
        stop.set()
        _destroy_pg()
