"""Progress over an investigation's planned measurement points (tqdm; ``tqdm.auto``: an ipywidgets bar in Jupyter).

A *measurement point* is one ``ctx.step(name)`` of rank 0 (a collective at one size, a model at one depth, one
training configuration); an investigation plans them before anything starts (``Investigation.points``, summed over
``env_sets`` by :func:`kit.contract.planned_points`). Whoever writes rank 0's rows also writes
``<run_dir>/progress.json`` -- ``{"points": done, "step": last point's name, "t": unix time}`` -- through
:class:`PointsFile`: the spawn supervisor, or rank 0 itself under torchrun/SLURM and emulated nodes. One reader,
:func:`watch`, turns the files of the runs that appear meanwhile into one bar ``done/planned``, wherever the launch
happens: in this process (a notebook, ``kit exp``) or in a notebook kernel (``kit run`` watches from its terminal).

A bar on a terminal that is not a TTY (a CI log) stays silent.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

POINTS_FILE = "progress.json"


class PointsFile:
    """Rank 0's points so far in ``<run_dir>/progress.json``: written whole and renamed (a reader never sees half a
    file), at most every ``every_s`` while points pass and once more at :meth:`close`."""

    def __init__(self, run_dir: str | Path, every_s: float = 0.25):
        self.path = Path(run_dir) / POINTS_FILE
        self.points, self.last, self.every_s = 0, "", every_s
        self._written = 0.0
        self._write()

    def step(self, name: str, point: bool = True) -> None:
        if not point:
            return
        self.points += 1
        self.last = name
        if time.monotonic() - self._written >= self.every_s:
            self._write()

    def close(self) -> None:
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f".{POINTS_FILE}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps({"points": self.points, "step": self.last, "t": time.time()}))
            os.replace(tmp, self.path)
        except OSError:  # progress is for the person watching; a full disk must not fail the run
            pass
        self._written = time.monotonic()


def read_points(run_dir: str | Path) -> tuple[int, str]:
    """(points done, last point's name) of one run; (0, "") before its file exists."""
    try:
        d = json.loads((Path(run_dir) / POINTS_FILE).read_text())
        return int(d.get("points", 0)), str(d.get("step", ""))
    except (OSError, ValueError, TypeError):
        return 0, ""


def points_of_new_runs(root: Path, before: set[str]) -> tuple[int, str]:
    """Points of the runs under ``root`` (``results/<name>``: one level of run directories) not in ``before``
    (the directories there when the watch began), and the last point of the one written most recently. A set of
    names, not file times: a file's mtime comes from the kernel's coarse clock, which can be behind time.time()."""
    n, newest, last = 0, -1.0, ""
    for f in Path(root).glob(f"*/{POINTS_FILE}"):
        if f.parent.name in before:
            continue
        try:
            mtime = f.stat().st_mtime
        except OSError:
            continue
        done, step = read_points(f.parent)
        n += done
        if mtime > newest:
            newest, last = mtime, step
    return n, last


def _size() -> dict[str, int]:
    """{} (tqdm sizes the bar to the terminal) unless stderr is a terminal that reports 0 columns or rows -- a
    pty opened without a size (``script``, some ``docker exec -t``): there tqdm draws an empty line, so 80 x 24."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return {}
    return {} if size.columns > 0 and size.lines > 0 else {"ncols": size.columns or 80, "nrows": size.lines or 24}


@dataclass
class Seen:
    """What :func:`watch` has seen so far (the bar draws it; a disabled bar -- no TTY -- still counts here)."""

    done: int = 0
    total: int | None = None
    last: str = ""


@contextmanager
def watch(root: str | Path, desc: str, total: int | None, *, notebook: bool = False, every_s: float = 0.5):
    """A bar ``done/total`` over the points of the runs that appear under ``root`` (``<results_root>/<name>``)
    while the block runs; ``total``: the planned points (:func:`kit.contract.planned_points`; None: a count
    without a total). The last point's name is the bar's postfix. A thread polls the files; the final count is
    read once more when the block ends. Yields the :class:`Seen` counts."""
    if notebook:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=desc, unit=" points", mininterval=every_s)
    else:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit=" points", file=sys.stderr, disable=None, mininterval=every_s,
                   **_size())
    seen = Seen(total=total)
    root = Path(root)
    before = {d.name for d in root.iterdir()} if root.is_dir() else set()
    stop = threading.Event()
    lock = threading.Lock()

    def poll() -> None:
        n, last = points_of_new_runs(root, before)
        with lock:
            if seen.total is not None and n > seen.total:  # more than planned: the plan undercounted; never overflow
                seen.total = bar.total = n
            if last and last != seen.last:
                seen.last = last
                bar.set_postfix_str(last, refresh=False)
            if n > seen.done:
                bar.update(n - seen.done)
                seen.done = n

    def loop() -> None:
        while not stop.wait(every_s):
            poll()

    t = threading.Thread(target=loop, daemon=True, name="kit-progress")
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join(timeout=2 * every_s)
        poll()
        bar.close()
