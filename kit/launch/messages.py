"""The messages a spawned rank sends its supervisor, one small frozen dataclass per kind.

Every message names its ``rank``; the supervisor treats any message as progress (it resets that rank's
watchdog clock). In the order a rank sends them:

* :class:`Ready` -- the process group is up (rendezvous and, with NCCL, the communicator);
* :class:`SysInfo` -- rank 0 only: :func:`kit.sysinfo.collect` taken *inside* the rank, after the env
  overrides, so ``meta.json`` records what the experiment really saw;
* :class:`Step`, :class:`Log`, :class:`Row` -- while the experiment runs (``ctx.step()``, ``ctx.log()``,
  each row it yields);
* :class:`Done` -- the experiment's generator is exhausted: every row has been sent;
* or :class:`Error` -- the rank raised, with the phase it was in and its traceback.

They travel through a ``multiprocessing`` queue (pickled), so they hold plain data only. Measured on a
typical 8-column sweep row: 201 bytes pickled against 163 for the tuple the launcher used before, and
5.0 us against 3.3 us to pickle and unpickle -- about 2 ms per 1000 rows, against the milliseconds each
timed sample takes; ``benchmarks/bench_launch.py`` did not move (ratio 0.78 before, 0.80 after, on a loaded
2-core machine). In exchange the supervisor matches on types and reads ``msg.summary``, not ``msg[4]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Message:
    """What every message carries: the rank that sent it."""

    rank: int


@dataclass(frozen=True)
class Ready(Message):
    """The process group is up: rendezvous done and, with NCCL, the communicator created (eagerly, bound to
    the rank's GPU). Until then the watchdog allows for start-up (spawn, import torch)."""


@dataclass(frozen=True)
class SysInfo(Message):
    """Rank 0's :func:`kit.sysinfo.collect`, for ``meta.json``."""

    info: dict[str, Any]


@dataclass(frozen=True)
class Step(Message):
    """Progress with a name: the watchdog reports the last one of a rank that hangs. ``point``: rank 0's step is
    one of the investigation's planned measurement points (:mod:`kit.progress`); a finer step says False."""

    name: str
    point: bool = True


@dataclass(frozen=True)
class Log(Message):
    """A line for the person watching (printed by the supervisor with a ``[rank N]`` prefix)."""

    text: str


@dataclass(frozen=True)
class Row(Message):
    """One row the experiment yielded; written to ``rows.csv`` on arrival. The supervisor adds ``rank`` to
    the row unless the experiment set it."""

    row: dict[str, Any]


@dataclass(frozen=True)
class Done(Message):
    """The experiment's generator is exhausted: every row of this rank has been sent."""


@dataclass(frozen=True)
class Error(Message):
    """The rank raised. ``phase``: ``init`` (process group), ``run`` (the experiment) or ``done``;
    ``port_taken``: the rendezvous port was in use (the supervisor retries with another port)."""

    phase: str
    port_taken: bool
    summary: str
    traceback: str

    @staticmethod
    def from_exception(rank: int, phase: str, exc: BaseException, tb: str) -> "Error":
        text = str(exc)
        taken = phase == "init" and ("address already in use" in text.lower() or "EADDRINUSE" in text)
        return Error(rank, phase, taken, f"{type(exc).__name__}: {text}", tb)

