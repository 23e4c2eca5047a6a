"""Progress bars over the rows a run streams (tqdm; its ``tqdm.auto`` is an ipywidgets bar in JupyterLab).

* :func:`rows_bar` -- ``launch(..., on_row=bar)`` in the process that launches (a notebook, ``kit exp``).
* :func:`watch_rows` -- ``kit run``: the notebook runs in a kernel, so the launching process counts the lines of
  the run's ``rows.csv`` (rows are appended as they arrive) and shows the bar in its own terminal.

A bar on a terminal that is not a TTY (a CI log) stays silent."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def rows_bar(desc: str, *, notebook: bool = True):
    """Yields ``on_row(row)`` that advances the bar and shows the last row's ``kind``; closes it on exit."""
    if notebook:
        from tqdm.auto import tqdm

        bar = tqdm(desc=desc, unit=" rows", mininterval=0.5)
    else:
        from tqdm import tqdm

        bar = tqdm(desc=desc, unit=" rows", file=sys.stderr, mininterval=1.0, disable=None)
    last = [None]

    def on_row(row: dict) -> None:
        if row.get("kind") != last[0]:
            last[0] = row.get("kind")
            bar.set_postfix_str(str(last[0]), refresh=False)
        bar.update(1)

    try:
        yield on_row
    finally:
        bar.close()


def _rows_so_far(root: Path, since: float) -> int:
    """Rows in the ``rows.csv`` files under ``root`` (one level of run directories) written after ``since``."""
    n = 0
    for f in root.glob("*/rows.csv"):
        try:
            if f.stat().st_mtime >= since:
                with f.open("rb") as fh:
                    n += max(sum(1 for _ in fh) - 1, 0)
        except OSError:
            pass
    return n


@contextmanager
def watch_rows(root: Path, desc: str, every_s: float = 1.0):
    """A bar on stderr counting the rows of the runs appearing under ``root`` (``results/<name>``) meanwhile."""
    from tqdm import tqdm

    since = time.time()
    bar = tqdm(desc=desc, unit=" rows", file=sys.stderr, disable=None, mininterval=every_s)
    stop = threading.Event()

    def poll():
        while not stop.wait(every_s):
            n = _rows_so_far(root, since)
            if n > bar.n:
                bar.update(n - bar.n)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        yield bar
    finally:
        stop.set()
        t.join(timeout=2 * every_s)
        bar.close()
