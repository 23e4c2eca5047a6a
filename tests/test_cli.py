"""The ``kit`` entry point: the kit/cli package, a closed pipe, a mistake under ``defaults:`` said once."""

import subprocess
import sys

from conftest import ROOT, kit_cli


def test_closed_pipe_is_quiet():
    """``kit runs --root recorded | head -1``: the reader leaves early; no BrokenPipeError traceback, exit 0."""
    p = subprocess.Popen([sys.executable, "-m", "kit", "runs", "--root", "recorded", "--json"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before kit writes (it starts in ~1 s): every write meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_mistake_under_defaults_reported_once(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  bogus_key: 1\n")
    p = kit_cli("run", "collectives", "--config", bad, "--results-root", tmp_path / "r")
    assert p.returncode == 2
    assert p.stderr.count("bogus_key") == 1, p.stderr
    assert "Traceback" not in p.stderr
