import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))


def pids_of(run_dir) -> list[int]:
    d = Path(run_dir) / "pids"
    return [int(p.read_text()) for p in d.iterdir() if not p.name.startswith(".")] if d.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes (it holds no GPU); check /proc state where available
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def wait_dead(pids, timeout=10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def finding(d, rule):
    """The doctor's one finding of ``rule`` in a Diagnosis (None when it found nothing)."""
    got = [f for f in d.findings if f.rule == rule]
    assert len(got) <= 1
    return got[0] if got else None


def silent(d, rule) -> bool:
    """The doctor checked ``rule`` and found nothing at or above 'low'."""
    from kit.doctor.model import REPORTED

    f = finding(d, rule)
    return rule in d.checked and (f is None or f.severity not in REPORTED)


@pytest.fixture
def cfg(tmp_path):
    from kit.config import LaunchConfig

    return LaunchConfig(world_size=2, backend="gloo", results_root=str(tmp_path / "results"), timeout_s=60)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        ngpu = 0
    for item in items:
        m = item.get_closest_marker("gpu")
        need = m.kwargs.get("gpus", 2) if m is not None else 0
        if m is not None and ngpu < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA GPU(s)"))


@pytest.fixture(autouse=True, scope="session")
def _trace_cache(tmp_path_factory):
    """Every test (and the CLIs they start) reads and writes parsed-trace caches in one temporary folder: the
    cache path is exercised everywhere, and no .kitcache/ appears beside tests/data or recorded/."""
    import os

    old = os.environ.get("KIT_TRACE_CACHE")
    os.environ["KIT_TRACE_CACHE"] = str(tmp_path_factory.mktemp("trace-cache"))
    yield
    if old is None:
        os.environ.pop("KIT_TRACE_CACHE", None)
    else:
        os.environ["KIT_TRACE_CACHE"] = old


@pytest.fixture(autouse=True)
def _close_figures():
    """Figures a test drew are closed after it (a notebook shows and closes them; tests only inspect them)."""
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


# ------------------------------------------------------------------------------------------------ shared helpers
def make_run(path, rows, experiment, **meta):
    """A run directory at ``path`` (created) holding ``rows`` as rows.csv and a meta.json for ``experiment``."""
    import json

    import pandas as pd

    d = Path(path)
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"experiment": experiment, "status": "ok", **meta}))
    pd.DataFrame(rows).to_csv(d / "rows.csv", index=False)
    return d


def kit_cli(*args, env=None, timeout=120, cwd=None):
    """``python -m kit ARGS`` from the repository root: the CompletedProcess, output as text."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "kit", *map(str, args)], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def figure_says(fig) -> str:
    """What a figure of an analysis shows: ``"data"`` when a panel has data, else the text of the message figure
    (:func:`kit.plot.message`) that says why there is nothing to draw. Fails on a figure with neither."""
    assert fig.axes, "a figure without axes"
    if any(ax.has_data() for ax in fig.axes):
        return "data"
    said = " ".join(t.get_text() for ax in fig.axes for t in ax.texts).strip()
    assert said, "an empty figure that does not say why"
    return said


def wait_for(condition, timeout=60.0, every=0.05):
    """Poll ``condition()`` until it is true (returns its value) or ``timeout`` s pass (returns the last value):
    a test waits for the event it needs, not for a fixed time."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(every)


def assert_plan_kept(name, cfg, runs):
    """The runs of ``cfg`` reported exactly the measurement points their investigation planned (kit.progress:
    rank 0's ``ctx.step`` calls against ``Investigation.points``): the progress bar ends at its total."""
    from kit import contract, progress

    runs = runs if isinstance(runs, (list, tuple)) else [runs]
    done = [progress.read_points(getattr(r, "dir", r))[0] for r in runs]
    planned = contract.planned_points(name, cfg)
    assert planned and sum(done) == planned, f"{name}: planned {planned} points, rank 0 reported {done}"
