import os
import sys
import time
from pathlib import Path
from typing import Any

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
    config.addinivalue_line("markers", "background(*args): reads `python -m kit ARGS` ({root}: its own folder), run in "
                                       "the background while the other tests run (fixture background; prepare=f: f(folder) writes what "
                                       "the command reads there and returns variables for its environment)")


@pytest.hookimpl(trylast=True)  # after -m/-k deselected what will not run
def pytest_collection_modifyitems(config, items):
    _background_last(items)
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


_DIAGNOSED: dict = {}


def diagnosed(files, sweep=None):
    """``kit.doctor.diagnose(files, workers=1, sweep=sweep)``, once per session for the same files and sweep: the
    corpus, invariant and wording tests read the same diagnoses (none changes one). A diagnosis made under
    ``KIT_DOCTOR_STRICT`` (no rule raised) also serves a test without it; one made without it is made again for a
    strict test (a rule error there was a skip line)."""
    from kit.doctor import diagnose
    from kit.doctor.rank_phase import strict

    key = (tuple(str(f) for f in files), None if sweep is None else str(sweep))
    got = _DIAGNOSED.get(key)
    if got is None or (strict() and not got[1]):
        got = _DIAGNOSED[key] = (diagnose(files, workers=1, sweep=sweep), strict())
    return got[0]


def unprofiled_idle_us(d, step_us: float) -> float:
    """The GPU idle of a job's step without the profiler (``step_us``: its unprofiled step, microseconds), for a
    Diagnosis ``d``: that step less the busiest GPU's own kernels per step (the largest over its traces of the median,
    over the steps, of the kernels other than NCCL's: the host model's ``gpu_kernels_us``) and the least
    communication of any rank (the accounting's ``comm`` slice). Not the accounting's compute slice: a rank's slice
    is its share of the rank's window times its step, which shrinks the work of a GPU that runs past the host's last
    step."""
    from kit.doctor.overhead import _per_step, _view

    busiest = max(float(_per_step(_view(p))["gpu_kernels_us"].median()) for p in d.traces)
    return step_us - busiest - min(a["us_per_step"]["comm"] for a in d.accounting.values())


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


# ------------------------------------------------------------------------------------------------ background runs
def _job(mark) -> tuple:
    """A background command: its arguments and its ``prepare`` (a function of its folder that writes what the
    command reads there and returns variables for its environment; None: nothing to prepare)."""
    return tuple(mark.args), mark.kwargs.get("prepare")


def _jobs(items) -> list[tuple]:
    return list(dict.fromkeys(_job(m) for item in items for m in item.iter_markers("background")))


def _background_last(items) -> None:
    """The tests that read a background run go last: the runs, started with the first test, then run beside the
    others (a test process is one core of two; a notebook or a launch of many ranks, most of the time its own,
    takes the other) instead of making the first of their readers wait."""
    readers = [i for i in items if i.get_closest_marker("background")]
    if readers:
        items[:] = [i for i in items if not i.get_closest_marker("background")] + readers


class Background:
    """The ``python -m kit ARGS`` commands of the selected tests' ``background(*args)`` marks (``{root}`` in an
    argument: a folder of the command's own), run one after another in a thread from the session's first test on
    -- the notebook runs of configs/cpu-smoke.yaml, the 8-rank launches, the toy recipe's commands, 2-40 s apiece,
    each as its test once ran it. One command marked by several tests runs once."""

    def __init__(self, jobs: list[tuple], base: Path):
        import threading

        self.roots = {job: base / f"job{i}" for i, job in enumerate(jobs)}
        self.env = dict(os.environ)  # as the session starts: a test's monkeypatched variables are not the commands'
        self.done: dict[tuple[str, ...], Any] = {}
        self.took: dict[tuple[str, ...], float] = {}  # wall seconds of each command (the terminal summary)
        self.ready = {job: threading.Event() for job in jobs}
        self.procs: list[Any] = []
        self._stop = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, args=(jobs,), daemon=True)
        self.thread.start()

    TIMEOUT_S = 420
    """one command's limit (the slowest, a notebook run, takes ~40 s on two quiet cores): past it the command's
    process group is killed and its readers fail, instead of the session waiting"""

    def _run(self, jobs) -> None:
        import subprocess

        for job in jobs:
            start = time.monotonic()
            try:
                args, prepare = job
                root = self.roots[job]
                root.mkdir(parents=True)
                env = {**self.env, **(prepare(root) if prepare else {})}
                cmd = [sys.executable, "-m", "kit", *(str(a).replace("{root}", str(root)) for a in args)]
                with self._lock:
                    if self._stop:
                        raise RuntimeError("the session ended first")
                    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, start_new_session=True)
                    self.procs.append(proc)
                try:
                    out, err = proc.communicate(timeout=self.TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._kill(proc)
                    out, err = proc.communicate()
                    err += f"\nkilled after {self.TIMEOUT_S} s"
                self.done[job] = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
            except Exception as e:  # a timeout, a failed start: the readers fail with it
                self.done[job] = subprocess.CompletedProcess(list(job[0]), -1, "", f"{type(e).__name__}: {e}")
            finally:
                self.took[job] = time.monotonic() - start
                self.ready[job].set()

    @staticmethod
    def _kill(proc) -> None:
        """The command and every process it started (its ranks, notebook kernels): they share its session."""
        import signal

        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def result(self, job: tuple):
        """``(CompletedProcess, the command's folder)``, once it ended (or was killed at its limit)."""
        if not self.ready[job].wait(self.TIMEOUT_S * (len(self.ready) + 1)):
            raise RuntimeError(f"background run {job} never ended")
        return self.done[job], self.roots[job]

    def stop(self) -> None:
        with self._lock:
            self._stop = True
        for p in self.procs:  # the group too where the command itself ended: nothing it started may outlive the session
            self._kill(p)
        self.thread.join(timeout=30)


_BACKGROUND: Background | None = None


def pytest_terminal_summary(terminalreporter):
    """How long the background commands took, one after another beside the other tests: when their sum nears the
    session's time, they -- not the tests in the foreground -- set how long ``make test`` takes."""
    bg = _BACKGROUND
    if bg is not None and bg.took:
        terminalreporter.write_line(f"background runs: {len(bg.took)} commands, {sum(bg.took.values()):.0f} s in all ("
                                    + ", ".join(f"{' '.join(j[0][:2])} {t:.0f} s" for j, t in bg.took.items()) + ")")


@pytest.fixture(scope="session", autouse=True)
def _background(request, _trace_cache, tmp_path_factory):
    """Started with the session's first test when any selected test reads a background run (after the trace
    cache's folder is set: the commands' CLIs write their trace caches there too)."""
    global _BACKGROUND
    jobs = _jobs(request.session.items)
    bg = _BACKGROUND = Background(jobs, tmp_path_factory.mktemp("background")) if jobs else None
    yield bg
    if bg is not None:
        bg.stop()


@pytest.fixture
def background(request, _background):
    """``(CompletedProcess, folder)`` of the command this test marks ``background(*args)``."""
    return _background.result(_job(request.node.get_closest_marker("background")))


@pytest.fixture
def backgrounds(request, _background):
    """Every command this test marks ``background(*args)``: ``{args: (CompletedProcess, folder)}``."""
    return {_job(m)[0]: _background.result(_job(m)) for m in request.node.iter_markers("background")}
