"""Spawn mode's supervisor: one object that owns a run's rank processes, their states, the message queue,
the row writer and ``meta.json``, and applies the fault rules.

The loop (``_attempt``) reads the queue every ``_POLL_S``: each :mod:`~kit.launch.messages` message is
progress for its rank; a :class:`~kit.launch.messages.Row` goes to ``rows.csv`` at once (a sweep that
crashes at its largest size keeps the smaller ones). Between messages it checks

* **exits** -- a rank that exits before :class:`Done` without an :class:`Error` died (segfault, ``os._exit``,
  OOM kill): after 0.5 s (its last messages may still be in the pipe) the run fails with kind ``died``;
* **the watchdog** -- ranks silent for ``cfg.timeout_s``: :func:`kit.launch.hang.name_culprit` names the culprit,
  kind ``hang``. Until a rank is :class:`Ready` the bound is at least ``_STARTUP_S`` (60 s): starting a
  Python process and importing torch is no progress report, and takes over 3 s on a loaded 2-core machine
  (the tests use ``timeout_s=3``); a rendezvous that never completes ends earlier anyway, with the process
  group's own timeout (``max(timeout_s, 30)`` s) as an :class:`Error` from ``init``;
* **errors** -- an :class:`Error` fails the run with the rank's traceback and the tail of its log, kind
  ``error``; an init error because the rendezvous port was taken starts a new attempt on another port.

Every failure first **drains** the queue (rows the other ranks already sent are saved) and only *then* kills
the ranks (:func:`kit.launch.procs.stop`: SIGTERM, SIGKILL ``_KILL_GRACE_S`` later): a rank killed while writing
to the queue can leave half a message in the pipe, so the queue is never read after a kill. The run follows
:class:`kit.launch.procs.ProcessSupervisor`'s template (``_start`` the ranks, ``_poll`` them, ``_close``).
Once every rank is done, teardown is bounded by ``cfg.teardown_s``; a rank still alive then is killed and the
run is still ``ok`` (with a warning).
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from .. import results
from ..progress import PointsFile
from . import hang, meta as run_meta
from .procs import ProcessSupervisor
from .messages import Done, Error, Log, Message, Ready, Row, Step, SysInfo
from .rank import DESTROY_STUCK, ExperimentFn, log_path, rank_main, tail

_KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL; a rank blocked inside NCCL may ignore nothing but SIGKILL
_POLL_S = 0.05  # loop tick: bounds how late a fault is noticed, costs nothing measurable
_EXIT_GRACE_S = 0.5  # after a rank exits, how long its last messages may take to arrive
_DRAIN_QUIET_S = 0.3  # a drain ends once no message came for this long
_STARTUP_S = 60.0  # until Ready, the watchdog allows at least this: spawn + import torch + rendezvous
PORT_TRIES = 4


class LaunchError(RuntimeError):
    """A run that did not complete. ``.run`` holds the rows produced before the fault; ``.rank`` the culprit;
    ``.kind`` is ``error`` (a rank raised), ``died`` (a rank exited without reporting), ``hang`` (watchdog)
    or ``port`` (no free rendezvous port)."""

    def __init__(self, message: str, run: results.Run | None = None, rank: int | None = None, kind: str = "error"):
        super().__init__(message)
        self.run = run
        self.rank = rank
        self.kind = kind


class _Terminated(BaseException):
    """SIGTERM to the supervisor, turned into an exception so the ranks are killed on the way out."""


class _PortTaken(Exception):
    pass


@dataclass
class RankState:
    proc: Any
    last_progress: float
    steps: int = 0
    step: str = "(start-up)"
    ready: bool = False
    done: bool = False
    exited_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid


class Supervisor(ProcessSupervisor):
    """One spawn-mode run. Creating it creates the run directory and writes the start meta; :meth:`launch`
    runs the ranks to the end and returns the :class:`~kit.results.Run` or raises :class:`LaunchError`."""

    kill_grace_s = _KILL_GRACE_S

    def __init__(self, fn: ExperimentFn, cfg, experiment: str, world: int, backend: str, *,
                 on_row: Callable[[dict], None] | None = None, verbose: bool = False):
        super().__init__()
        self.fn, self.cfg, self.world, self.backend = fn, cfg, world, backend
        self.on_row, self.verbose = on_row, verbose
        self.run_dir = results.new_run_dir(cfg.results_root, experiment)
        (self.run_dir / "logs").mkdir()
        self.meta = run_meta.start_meta(experiment, cfg, world, backend, "spawn")
        run_meta.write(self.run_dir, self.meta)
        self.writer = results.RowWriter(self.run_dir / "rows.csv")
        self.points = PointsFile(self.run_dir)  # rank 0's measurement points, for the progress bar
        self.run = results.Run(self.run_dir, self.meta, self.writer.rows)
        self.states: dict[int, RankState] = {}
        self.q = None

    # ----------------------------------------------------------------------------------------- the whole run
    def launch(self, next_port: Callable[[], int]) -> results.Run:
        """Run to the end; retry with ``next_port()`` while the rendezvous port turns out to be taken."""
        old_term = None
        if threading.current_thread() is threading.main_thread():
            def on_term(signum, frame):
                raise _Terminated()
            old_term = signal.signal(signal.SIGTERM, on_term)
        try:
            for _ in range(PORT_TRIES):
                try:
                    warnings = self._attempt(next_port())
                    break
                except _PortTaken:
                    continue
            else:
                raise LaunchError(f"could not find a free rendezvous port in {PORT_TRIES} tries", self.run, 0, "port")
            self.meta["warnings"] = warnings
            run_meta.finish(self.run_dir, self.meta, "ok")
            return self.run
        except LaunchError as e:
            run_meta.finish(self.run_dir, self.meta, "failed", str(e))
            raise
        except (KeyboardInterrupt, _Terminated) as e:
            what = "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else "terminated (SIGTERM)"
            run_meta.finish(self.run_dir, self.meta, "interrupted", f"launcher {what}; all ranks were killed")
            if isinstance(e, _Terminated):
                raise SystemExit(143) from None
            raise
        finally:
            self.points.close()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)

    # ----------------------------------------------------------------------------------------- one attempt
    def _attempt(self, port: int) -> list[str]:
        """Start the ranks on ``port`` and supervise them. Returns warnings; raises LaunchError, _PortTaken."""
        return self.supervise(port)

    def _start(self, port: int) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.q = ctx.Queue()
        self.states = {}
        now = time.monotonic()
        for r in range(self.world):
            p = ctx.Process(target=rank_main, name=f"kit-rank{r}", daemon=False,  # ranks may start DataLoader workers
                            args=(self.fn, self.cfg, r, self.world, self.backend, port, str(self.run_dir), self.q,
                                  os.getpid()))
            p.start()
            self.procs.append(p)
            self.states[r] = RankState(p, now)

    def _poll(self) -> list[str]:
        while not all(s.done for s in self.states.values()):
            try:
                msg = self.q.get(timeout=_POLL_S)
            except queue_mod.Empty:
                msg = None
            if msg is not None:
                err = self._handle(msg)
                if err is not None:
                    self._on_error(err)
                continue  # drain quickly while messages flow
            t = time.monotonic()
            self._check_exits(t)
            self._watchdog(t)
        return self._teardown()

    def _close(self) -> None:
        """Kill what still runs (any way out), then close the queue (never read after a kill)."""
        self.stop_all()
        if self.q is not None:
            self.q.close()

    def _handle(self, msg: Message) -> Error | None:
        """Apply one message; an :class:`Error` is returned for the caller to act on."""
        s = self.states[msg.rank]
        s.last_progress = time.monotonic()
        match msg:
            case Row(rank=rank, row=row):
                row = row if "rank" in row else {"rank": rank, **row}
                self.writer.add(row)
                s.steps += 1
                if self.on_row:
                    self.on_row(row)
            case Step(rank=rank, name=name, point=point):
                s.steps += 1
                s.step = name
                if rank == 0:
                    self.points.step(name, point)
                if self.verbose:
                    print(f"[rank {rank}] {name}", flush=True)
            case Log(rank=rank, text=text):
                print(f"[rank {rank}] {text}", flush=True)
            case SysInfo(info=info):
                self.meta["sysinfo"] = info
            case Ready():
                s.step, s.ready = "(ready)", True
            case Done():
                s.done = True
            case Error():
                return msg
        return None

    def _drain(self, quiet_s: float = _DRAIN_QUIET_S) -> None:
        """Handle messages until none has arrived for ``quiet_s`` (rows in flight from live ranks)."""
        while True:
            try:
                msg = self.q.get(timeout=quiet_s)
            except (queue_mod.Empty, OSError, EOFError, ValueError):
                return
            if not isinstance(msg, Error):
                self._handle(msg)

    # ----------------------------------------------------------------------------------------- fault rules
    def _on_error(self, err: Error) -> None:
        if err.port_taken:
            self.stop_all()
            raise _PortTaken()
        log_tail = tail(log_path(self.run_dir, err.rank))
        self._fail(f"rank {err.rank} raised in {err.phase} (step {self.states[err.rank].step!r}): {err.summary}\n\n"
                   f"--- traceback of rank {err.rank} ---\n{err.traceback}" +
                   (f"--- end of logs/rank{err.rank}.log ---\n{log_tail}\n" if log_tail.strip() else ""),
                   err.rank, "error")

    def _check_exits(self, t: float) -> None:
        """A rank that exited before Done without an Error died (segfault, os._exit, OOM kill)."""
        for r, s in self.states.items():
            code = s.proc.exitcode
            if code is None:
                continue
            if s.exited_at is None:
                s.exited_at = t
            if s.done or t - s.exited_at <= _EXIT_GRACE_S:  # let its last messages arrive
                continue
            self._drain()
            if s.done:
                continue
            if code != 0:
                sig = f" (signal {signal.Signals(-code).name})" if code < 0 else ""
                self._fail(f"rank {r} died with exit code {code}{sig} in step {s.step!r} without reporting an error\n"
                           f"--- end of logs/rank{r}.log ---\n{tail(log_path(self.run_dir, r))}", r, "died")
            self._fail(f"rank {r} exited (code 0) before finishing, in step {s.step!r}", r, "died")

    def _watchdog(self, t: float) -> None:
        def limit(s: RankState) -> float:
            return self.cfg.timeout_s if s.ready else max(self.cfg.timeout_s, _STARTUP_S)

        silent = [r for r, s in self.states.items() if not s.done and t - s.last_progress > limit(s)]
        if silent:
            bound = max(limit(self.states[r]) for r in silent)
            message, culprit = hang.name_culprit(self.states, silent, self.run_dir, bound)
            self._fail(message, culprit, "hang")

    def _fail(self, message: str, rank: int | None, kind: str) -> NoReturn:
        """Save what the other ranks already sent, *then* kill them (see the module docstring)."""
        self._drain()
        self.stop_all()
        raise LaunchError(message, self.run, rank, kind)

    def _teardown(self) -> list[str]:
        """Every rank delivered everything: give them ``teardown_s`` to exit, then kill the stragglers."""
        deadline = time.monotonic() + self.cfg.teardown_s
        for s in self.states.values():
            s.proc.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r, s in self.states.items() if s.proc.is_alive()]
        gave_up = [r for r in self.states if r not in stuck and _gave_up_destroy(log_path(self.run_dir, r))]
        notes = [f"rank(s) {gave_up} exited without completing their teardown (destroy_process_group did not "
                 f"finish in time; their logs say how long): results are complete"] if gave_up else []
        if not stuck:
            return notes
        self.stop_all()
        return notes + [f"rank(s) {stuck} did not exit within teardown_s={self.cfg.teardown_s:g} s after finishing "
                        f"(stuck in destroy_process_group or interpreter exit); killed. Results are complete."]


def _gave_up_destroy(path) -> bool:
    """True when the rank's log says it exited without finishing its teardown (rank.DESTROY_STUCK)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            return DESTROY_STUCK.encode() in f.read()
    except OSError:
        return False
