"""A notebook as git would commit it: what the tests about committed notebooks read (no outputs, cell ids, the
parameters cell), so that running and saving a notebook in JupyterLab -- outputs in the file -- breaks no test.

``make setup`` / ``make lab`` install nbstripout as the git clean filter that ``.gitattributes`` names for
``*.ipynb``: ``git add`` stores the notebook without outputs, execution counts or the kernel's
``language_info``, and ``git diff`` shows a notebook that was only run and saved as unchanged (``git status`` too
after a save in ``make lab``: :mod:`kit.lab`). This module runs
that same filter -- the command git has configured for the path -- on the file, so a test sees what a commit
would hold; where no filter is configured (not a git checkout, or ``make setup`` not run) it reads the file as it
is, and a saved notebook fails the tests, as it would fail in a commit.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def clean_filter(path: Path) -> str | None:
    """The clean command git runs on ``path`` when it is added (``filter.<name>.clean`` of the ``filter``
    attribute ``.gitattributes`` gives it), or None when there is none."""
    rel = str(Path(path).resolve().relative_to(ROOT))
    attr = _git("check-attr", "filter", "--", rel)  # "notebooks/x.ipynb: filter: nbstripout"
    name = attr.rsplit(": ", 1)[-1] if attr else None
    if not name or name in ("unspecified", "unset", "set"):
        return None
    return _git("config", "--get", f"filter.{name}.clean") or None


def run_filter(cmd: str, rel: str, data: bytes) -> bytes:
    """``data`` through the clean command ``cmd`` as git runs it for the path ``rel`` (``sh -c``, ``%f`` the path,
    from the top of the work tree)."""
    cmd = cmd.replace("%f", shlex.quote(rel))
    p = subprocess.run(["sh", "-c", cmd], cwd=ROOT, input=data, capture_output=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{rel}: the git clean filter {cmd!r} failed: {p.stderr.decode()[-500:]}")
    return p.stdout


def as_committed(path: str | Path) -> str:
    """The text ``git add`` would store for the notebook at ``path`` (see the module docstring). A file whose bytes
    are those of the index is read as it is (the filter leaves a committed notebook unchanged: a test checks it),
    which spares starting the filter (~1.7 s) for every notebook nobody has saved."""
    path = Path(path)
    cmd = clean_filter(path)
    if cmd is None:
        return path.read_text()
    rel = str(path.resolve().relative_to(ROOT))
    if _git("hash-object", "--no-filters", "--", rel) == _git("rev-parse", "--verify", "-q", f":{rel}"):
        return path.read_text()
    return run_filter(cmd, rel, path.read_bytes()).decode()
