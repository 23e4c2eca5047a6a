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


def pytest_configure(config):
    config.addinivalue_line("markers", "smoke_run(notebook): reads the session's one `kit run` of configs/cpu-smoke.yaml "
                                       "(fixture smoke_run), which runs in the background while the other tests run")


@pytest.hookimpl(trylast=True)  # after -m/-k deselected what will not run
def pytest_collection_modifyitems(config, items):
    _smoke_run_last(items)
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


# ------------------------------------------------------------------------------------------------ the shared kit run
SMOKE_CONFIG = "configs/cpu-smoke.yaml"


def _smoke_notebooks(items) -> list[str]:
    return sorted({m.args[0] for item in items for m in item.iter_markers("smoke_run")})


def _smoke_run_last(items) -> None:
    """The tests that read the shared ``kit run`` go last: the run, started when the first test starts, then
    runs beside the others (a test process is one core of two; the run's notebooks are most of their own time on
    the other) instead of making the first of them wait for it."""
    readers = [i for i in items if i.get_closest_marker("smoke_run")]
    if readers:
        items[:] = [i for i in items if not i.get_closest_marker("smoke_run")] + readers


class SmokeRun:
    """One ``kit run NOTEBOOKS --config configs/cpu-smoke.yaml`` in the background, for the whole session: every
    notebook a selected test marks ``smoke_run(name)`` (each once ran its own ``kit run``, 20-40 s apiece)."""

    def __init__(self, names: list[str], root: Path):
        import subprocess

        self.names, self.root = names, root
        self._out, self._err = open(root / "stdout.txt", "w+"), open(root / "stderr.txt", "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "kit", "run", *names, "--config", SMOKE_CONFIG,
                                      "--results-root", str(root / "results")], cwd=ROOT, stdout=self._out,
                                     stderr=self._err, text=True)
        self._done = None

    def result(self, name: str, timeout: float = 1500):
        """``(CompletedProcess of notebook name, results root)``: the run's output, with returncode 0 when that
        notebook's entry in the report is ok (a failing notebook fails its own tests only)."""
        import json
        import subprocess

        if self._done is None:
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
            self._out.seek(0), self._err.seek(0)
            self._done = rc, self._out.read(), self._err.read()
        rc, out, err = self._done
        reports = list((self.root / "results" / "reports").glob("*/report.json"))
        entries = {e["name"]: e for e in json.loads(reports[0].read_text())["entries"]} if reports else {}
        ok = name in entries and entries[name]["status"] == "ok" and rc in (0, 1)
        args = self.proc.args
        return subprocess.CompletedProcess(args, 0 if ok else (rc or 1), out, err), self.root / "results"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close(), self._err.close()


@pytest.fixture(scope="session", autouse=True)
def _smoke_run(request, _trace_cache, tmp_path_factory):
    """Started with the session's first test when any selected test reads it (after the trace cache's folder is
    set: the run's CLIs write their trace caches there too)."""
    names = _smoke_notebooks(request.session.items)
    run = SmokeRun(names, tmp_path_factory.mktemp("cpu-smoke-run")) if names else None
    yield run
    if run is not None:
        run.stop()


@pytest.fixture
def smoke_run(request, _smoke_run):
    """``(result, results root)`` of the shared ``kit run`` for the notebook this test marks ``smoke_run(name)``:
    the report under ``<root>/reports/<id>/``, the notebook's runs under ``<root>/<name>/``."""
    return _smoke_run.result(request.node.get_closest_marker("smoke_run").args[0])
