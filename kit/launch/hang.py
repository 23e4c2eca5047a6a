"""The hang diagnosis: when the watchdog fires, who hung, where, and why the others are waiting.

A rank "hangs" when it has reported no progress (a ``ctx.step()`` or a row) for ``timeout_s``. In a
collective job one hung rank makes every peer wait inside the next collective, so "which ranks are silent"
does not name the culprit. The diagnosis:

1. **stacks** -- send SIGUSR1 to every silent rank; faulthandler (registered in each rank, see
   :mod:`kit.launch.rank`) writes all its threads' Python stacks to ``logs/rank<N>.stacks`` synchronously
   from the signal handler, even while the main thread is blocked in C (NCCL, gloo, a sleep);
2. **culprits** -- silent ranks whose main thread is *not* blocked in a ``torch.distributed`` call or a
   device synchronisation (the others wait for them); if that singles nobody out (all waiting, or none),
   the silent ranks with the least progress;
3. **the message** -- the culprit(s) and their last step, one line per rank (finished / last step / blocked in
   a collective), then the culprits' innermost frames.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Mapping, Protocol

from .rank import stacks_path, tail

_STACK_WAIT_S = 0.5  # faulthandler writes from the signal handler; this covers process scheduling
_WAITING_MARKERS = ("torch/distributed/", "torch\\distributed\\", " in synchronize", " in wait", " in barrier")


class RankProgress(Protocol):
    """What the diagnosis reads of each rank's state (kept by the supervisor)."""

    pid: int | None
    steps: int
    step: str
    done: bool


def dump_stacks(pids: Mapping[int, int | None], run_dir: Path) -> dict[int, str]:
    """Ask each rank for its Python stacks (SIGUSR1); return each rank's ``.stacks`` file content."""
    for pid in pids.values():
        if pid:
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass
    time.sleep(_STACK_WAIT_S)
    return {r: tail(stacks_path(run_dir, r), 200) for r in pids}


def main_thread_frames(stack_text: str) -> list[str]:
    """The 'File ... in func' lines of the thread that handled SIGUSR1 (the main thread), innermost first."""
    frames, inside = [], False
    for line in stack_text.splitlines():
        if line.startswith("Current thread") or line.startswith("Thread"):
            inside = line.startswith("Current thread")
            continue
        if inside and line.strip().startswith("File "):
            frames.append(line.strip())
    return frames


def waiting_in_collective(frames: list[str]) -> bool:
    """A rank blocked inside a torch.distributed call (or a device sync) is most likely waiting for a peer."""
    return any(m in f for f in frames[:4] for m in _WAITING_MARKERS)


def culprits(states: Mapping[int, RankProgress], stacks: Mapping[int, str]) -> list[int]:
    """Among the silent ranks (the keys of ``stacks``), the ones the others wait for."""
    silent = sorted(stacks)
    not_waiting = [r for r in silent if not waiting_in_collective(main_thread_frames(stacks[r]))]
    if not_waiting and len(not_waiting) < len(silent):
        return not_waiting
    least = min(states[r].steps for r in silent)
    return [r for r in silent if states[r].steps == least]


def report(states: Mapping[int, RankProgress], stacks: Mapping[int, str], timeout_s: float) -> tuple[str, int]:
    """The watchdog's message and the rank it blames (the first culprit)."""
    who = culprits(states, stacks)
    lines = [f"rank {', '.join(map(str, who))} hung: no progress for {timeout_s:g} s "
             f"(watchdog timeout_s) in step {states[who[0]].step!r}"]
    for r, s in sorted(states.items()):
        if s.done:
            state = "finished"
        else:
            state = f"last step {s.step!r} after {s.steps} progress reports"
            if r in stacks and r not in who:
                state += " (blocked in a collective, waiting)"
        lines.append(f"  rank {r}: {state}")
    for r in sorted(stacks, key=lambda r: (r not in who, r)):
        frames = main_thread_frames(stacks[r])
        if frames:
            lines.append(f"--- Python stack of rank {r} when the watchdog fired (innermost first) ---\n  "
                         + "\n  ".join(frames[:12]))
    return "\n".join(lines), who[0]


def name_culprit(states: Mapping[int, RankProgress], silent: list[int], run_dir: Path,
                 timeout_s: float) -> tuple[str, int]:
    """Dump the silent ranks' stacks, choose the culprit, describe it. Returns (message, culprit rank)."""
    stacks = dump_stacks({r: states[r].pid for r in silent}, run_dir)
    return report(states, stacks, timeout_s)
