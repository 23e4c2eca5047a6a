"""The child processes of a launch, whichever mode started them: one supervisor template, one escalation, one
way to reap (the shape of torch elastic's ``PContext``: ``_start`` / ``_poll`` / ``_close``).

* :class:`ProcessSupervisor` -- :meth:`~ProcessSupervisor.supervise` starts the children (``_start``), follows
  them until the run ends (``_poll``, the mode's own rules: spawn's message queue and watchdog, the emulated
  nodes' agents) and always closes (``_close``): whatever is still alive then is stopped. Spawn mode
  (:class:`kit.launch.supervisor.Supervisor`: ranks as ``multiprocessing`` processes) and emulated nodes
  (:mod:`kit.launch.emulated`: torchrun agents as ``subprocess.Popen``) are its two subclasses; in place (under
  torchrun or srun, :mod:`kit.launch.inplace`) the kit starts no process: the external launcher owns them.
* :func:`stop` -- SIGTERM to every live child, then, ``grace_s`` later, SIGKILL to those still alive (with
  ``session``: to each child's whole session, so that what the child started goes too); every child reaped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any


def is_alive(p: Any) -> bool:
    """A ``multiprocessing.Process`` or a ``subprocess.Popen`` still running."""
    return p.is_alive() if hasattr(p, "is_alive") else p.poll() is None


def exit_code(p: Any) -> int | None:
    """Its exit code (negative: the signal that ended it), None while it runs."""
    return p.exitcode if hasattr(p, "exitcode") else p.poll()


def reap(p: Any, timeout: float | None) -> None:
    """Wait up to ``timeout`` s (None: for good) for ``p`` to end, collecting its exit status."""
    if hasattr(p, "join"):
        p.join(timeout)
        return
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


def stop(procs: list, grace_s: float, session: bool = False) -> None:
    """SIGTERM to each live process, SIGKILL ``grace_s`` later to any still alive (``session``: to its session,
    i.e. its process group, which it leads: ``start_new_session=True``); every one reaped."""
    live = [p for p in procs if is_alive(p)]
    for p in live:
        try:
            p.terminate()
        except (ProcessLookupError, OSError):
            pass
    deadline = time.monotonic() + grace_s
    for p in live:
        reap(p, max(0.0, deadline - time.monotonic()))
    for p in procs if session else live:
        if not session and not is_alive(p):
            continue
        try:
            if session:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    for p in procs if session else live:
        reap(p, None if session else 1.0)


class ProcessSupervisor:
    """The template: :meth:`supervise` = ``_start``, ``_poll`` until the run ends, always ``_close``."""

    kill_grace_s: float = 2.0
    """SIGTERM -> SIGKILL"""
    kill_session: bool = False
    """SIGKILL the children's sessions (they lead one each), not only the children"""

    def __init__(self) -> None:
        self.procs: list = []

    def supervise(self, *args, **kwargs):
        """Start, follow to the end (the result of ``_poll``), and stop whatever is left on any way out."""
        self.procs = []
        try:
            self._start(*args, **kwargs)
            return self._poll()
        finally:
            self._close()

    def _start(self, *args, **kwargs) -> None:
        raise NotImplementedError

    def _poll(self):
        raise NotImplementedError

    def _close(self) -> None:
        self.stop_all()

    def stop_all(self, grace_s: float | None = None) -> None:
        """The one escalation, for every child still running (none: nothing happens)."""
        if any(is_alive(p) for p in self.procs):
            stop(self.procs, self.kill_grace_s if grace_s is None else grace_s, self.kill_session)
