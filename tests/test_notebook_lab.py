"""A notebook run and saved in JupyterLab is not listed by ``git status`` (kit.lab.git_refresh, the post-save hook
``make lab`` sets), while a changed cell still is and nothing is staged -- in a scratch repository with a clean
filter, the notebook saved by hand and by jupyter_server's own contents manager."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT
from kit.lab import git_refresh


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


STRIP = """import json, sys
nb = json.load(sys.stdin)
for c in nb["cells"]:
    if c["cell_type"] == "code":
        c["outputs"], c["execution_count"] = [], None
sys.stdout.write(json.dumps(nb, indent=1, sort_keys=True) + "\\n")
"""
"""the clean filter of the scratch repository: outputs out, as nbstripout (which the project's filter runs) does --
the hook is the same for any filter, and nbstripout's start-up (~1 s) per git call would be most of these tests"""


@pytest.fixture
def repo(tmp_path):
    """A git repository holding one notebook committed without outputs, under a clean filter named nbstripout
    (the project's .gitattributes)."""
    r = tmp_path / "repo"
    r.mkdir()
    (tmp_path / "strip.py").write_text(STRIP)
    _git(r, "init", "-q")
    for k, v in (("user.email", "kit@example.com"), ("user.name", "kit"),
                 ("filter.nbstripout.clean", f'"{sys.executable}" -S "{tmp_path / "strip.py"}"'),
                 ("filter.nbstripout.smudge", "cat"), ("filter.nbstripout.required", "true")):
        _git(r, "config", k, v)
    (r / ".gitattributes").write_text((ROOT / ".gitattributes").read_text())
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('hi')", id="c1")])
    nbformat.write(nb, r / "n.ipynb")
    _git(r, "add", ".")
    _git(r, "commit", "-q", "-m", "n")
    return r


def _run_and_save(path: Path, text: str, source: str | None = None) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    nb.cells[0].execution_count = 1
    if source is not None:
        nb.cells[0].source = source
    nbformat.write(nb, path)


def test_saved_with_outputs_is_clean_after_the_hook(repo):
    nb = repo / "n.ipynb"
    blob = _git(repo, "rev-parse", ":n.ipynb")
    for text in ("hi\n", "hi again, a longer output\n"):  # a second save: listed again, cleared again
        _run_and_save(nb, text)
        assert _git(repo, "status", "--porcelain") == " M n.ipynb\n"  # git's size shortcut, without the hook
        assert _git(repo, "diff") == ""
        assert git_refresh(str(nb), model={"type": "notebook"})
        assert _git(repo, "status", "--porcelain") == ""
        assert _git(repo, "rev-parse", ":n.ipynb") == blob


def test_a_changed_cell_stays_listed_and_nothing_is_staged(repo):
    nb = repo / "n.ipynb"
    _run_and_save(nb, "hi\n", source="print('changed')")
    assert git_refresh(str(nb))
    assert _git(repo, "status", "--porcelain") == " M n.ipynb\n"
    assert _git(repo, "diff", "--cached") == "" and "changed" in _git(repo, "diff")


def test_untracked_outside_git_and_other_files_are_left_alone(repo, tmp_path):
    other = tmp_path / "outside.ipynb"
    other.write_text(json.dumps({"cells": []}))
    untracked = repo / "new.ipynb"
    untracked.write_text((repo / "n.ipynb").read_text())
    assert not git_refresh(str(other)) and not git_refresh(str(untracked))
    assert not git_refresh(str(repo / "n.ipynb"), model={"type": "file"})
    assert _git(repo, "status", "--porcelain") == "?? new.ipynb\n"


def test_jupyter_server_saves_through_the_hook_as_make_lab_sets_it(repo):
    """The contents manager JupyterLab saves with, configured as the Makefile's lab target configures it."""
    pytest.importorskip("jupyter_server")
    from jupyter_server.services.contents.filemanager import FileContentsManager

    hook = "kit.lab.git_refresh"
    assert f"--ContentsManager.post_save_hook={hook}" in (ROOT / "Makefile").read_text()
    cm = FileContentsManager(root_dir=str(repo), post_save_hook=hook)
    model = cm.get("n.ipynb")
    model["content"].cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    cm.save(model, "n.ipynb")
    assert "outputs" in (repo / "n.ipynb").read_text() and '"hi\\n"' in (repo / "n.ipynb").read_text()
    assert _git(repo, "status", "--porcelain", "--", "n.ipynb") == ""  # (its checkpoint: the repo's .gitignore)
