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


def test_kit_alone_lists_the_commands():
    """``kit`` (and ``kit trace``) without a command: the usage and the commands, exit 2 -- not argparse's
    'the following arguments are required: cmd'."""
    p = kit_cli()
    assert p.returncode == 2 and "required" not in p.stdout + p.stderr and "Traceback" not in p.stderr
    assert p.stdout.startswith("usage: kit") and all(f"\n    {c} " in p.stdout for c in ("run", "trace", "doctor"))
    p = kit_cli("trace")
    assert p.returncode == 2 and "required" not in p.stdout + p.stderr
    assert all(v in p.stdout for v in ("gaps", "collectives", "merge"))


def test_a_directory_with_an_empty_rank_trace_says_it_is_empty(tmp_path):
    """A profiler stopped before it wrote leaves ``rank0.json`` of 0 bytes: given the directory, both commands
    name that file as empty, as they do when it is named; a directory of other JSON says what it skipped."""
    (tmp_path / "rank0.json").write_bytes(b"")
    for verb in (["trace", "gaps"], ["doctor"]):
        for where in (tmp_path, tmp_path / "rank0.json"):
            p = kit_cli(*verb, where)
            assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
            assert f"{tmp_path / 'rank0.json'}: empty file" in p.stderr, p.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"lr": 0.1}')
    p = kit_cli("trace", "gaps", other)
    assert p.returncode == 2 and "no rank trace" in p.stderr and "other JSON skipped: config.json" in p.stderr


def test_the_reference_lists_every_doctor_rule():
    """docs/cli.md's table of the doctor's rules is the one the registry renders (``make docs-rules`` writes it):
    every registered rule, in order, and no other."""
    from kit.doctor.model import RULES
    from kit.doctor.rules import TABLE_HEAD, table

    text = (ROOT / "docs" / "cli.md").read_text()
    committed = text[text.index(TABLE_HEAD):]
    committed = committed[:committed.index("\n\n") + 1]
    assert committed == table(), "docs/cli.md's rules table is stale: run `make docs-rules`"
    assert len(committed.splitlines()) == 2 + len(RULES)
