"""JupyterLab's post-save hook (``make lab`` sets it): a notebook run and saved is not listed by ``git status``.

Notebooks are committed without outputs through a git clean filter (nbstripout, ``.gitattributes``; the Makefile
says why). After a save with outputs, ``git diff`` is empty and ``git add`` would store the committed blob
unchanged, yet ``git status`` lists the notebook as modified: the index holds the size the file had when it was
added, and git takes a size that differs for a change without running the filter (``git update-index
--refresh`` judges the same way). Only an index entry that records no size makes git compare the file's content,
through the filter -- and record its new size when they agree.

:func:`git_refresh` gives a saved notebook's index entry that: the same blob and mode, its size and times
forgotten (``git update-index --cacheinfo``). The next ``git status`` runs the filter on the file once: outputs
only, and the notebook is clean (its new size recorded); a changed cell, and it is listed, as it should be.
Nothing is staged -- the entry keeps the blob it had -- so no edit of the user's reaches the index this way.
A file outside a git checkout, untracked, or in a merge conflict is left alone, and a failing git is silent
(the save already happened; the hook only spares a line of ``git status``). A notebook written by something
else (papermill, ``nbconvert --inplace``) is listed until a ``git add``, which stores nothing new.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def git_refresh(os_path: str, model: dict[str, Any] | None = None, contents_manager: Any = None,
                **_: Any) -> bool:
    """The post-save hook (jupyter_server calls it with these keywords): forget the saved notebook's stat
    data in the git index, keeping its blob. True when the entry was reset."""
    if model is not None and model.get("type") != "notebook":
        return False
    path = Path(os_path).resolve()

    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", "-C", str(path.parent), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout if p.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if not top:
        return False
    try:
        rel = path.relative_to(Path(top.strip()).resolve()).as_posix()
    except ValueError:
        return False
    entries = [e for e in (git("-C", top.strip(), "ls-files", "-z", "--stage", "--", rel) or "").split("\0") if e]
    if len(entries) != 1:  # untracked, or several stages: a merge conflict
        return False
    meta, name = entries[0].split("\t", 1)
    mode, blob, stage = meta.split()
    if stage != "0" or name != rel:
        return False
    return git("-C", top.strip(), "update-index", "--cacheinfo", f"{mode},{blob},{rel}") is not None
