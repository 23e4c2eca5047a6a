"""One way to store results.

A run is a directory ``<root>/<experiment>/<run-id>/`` holding

* ``rows.csv``  -- tidy rows (one observation per row, every timing sample kept), appended as they arrive,
  so a sweep that crashes at its largest size keeps the smaller ones;
* ``meta.json`` -- experiment, config, env overrides, sysinfo, git commit, start/end time, status, error;
* ``error.txt`` -- the error, when the run failed; ``logs/rank<N>.log`` -- each rank's stdout/stderr;
* anything an experiment adds (traces, graph dumps) under the same directory.

Run ids (``YYYYmmdd-HHMMSS-<host>-<random>``) are created with ``mkdir(exist_ok=False)``: they never
collide and nothing is overwritten. Runs recorded on real GPUs and committed as evidence live under
``recorded/<machine>/<experiment>/<run-id>/`` in the repository (``recorded/probes/<name>/``: probe scripts with
their outputs); :data:`RECORDED_SETS` names the ones the notebooks show, :func:`recorded` lists a machine's runs.
"""

from __future__ import annotations

import csv
import json
import os
import re
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

REPO_ROOT = Path(__file__).resolve().parent.parent
RECORDED_ROOT = REPO_ROOT / "recorded"
MACHINE = "h200x2"
"""the machine whose recorded runs the notebooks show by default: 2x H200 (NV18)"""

SETS_FILE = RECORDED_ROOT / "sets.json"
"""the data file naming the recorded runs the notebooks show (and the doctor page's default traces)"""


def recorded_index(path: Path = SETS_FILE) -> dict[str, Any]:
    """:data:`SETS_FILE` as read; {} where it is not there (an installed kit without the repository's runs)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def recorded_sets(path: Path = SETS_FILE) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """``name -> (machine, experiment, run ids)`` from :data:`SETS_FILE`."""
    sets = recorded_index(path).get("sets", {})
    return {k: (v["machine"], v["experiment"], tuple(v["runs"])) for k, v in sets.items()}


RECORDED_SETS = recorded_sets()
"""every recorded set a notebook may show (``results.choose(..., recorded=name)``; the name defaults to the
experiment's own): runs under ``recorded/<machine>/<experiment>/``, as :data:`SETS_FILE` names them"""


def new_run_dir(root: str | Path, experiment: str) -> Path:
    base = Path(root) / experiment
    base.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0].replace("-", "")[:16] or "host"
    while True:
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{host}-{secrets.token_hex(3)}"
        path = base / run_id
        try:
            path.mkdir(exist_ok=False)
            return path
        except FileExistsError:
            continue


def git_commit() -> str | None:
    """The checkout's commit, ``-dirty`` when tracked files differ from it; None outside a git checkout.

    ``git status`` runs the notebooks' clean filter (nbstripout, a Python start per notebook) after a checkout or
    pull, which can take seconds: a status that does not answer in time leaves the commit known and says
    ``-dirty-unknown`` rather than losing the commit."""
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    commit = out.stdout.strip()
    try:
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return commit + "-dirty-unknown"
    return commit + ("-dirty" if dirty else "")


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "item"):  # numpy / torch scalars
        return x.item()
    return str(x)


def write_json(path: Path, obj: Any) -> None:
    """Atomic write: readers never see half a file."""
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(_jsonable(obj), indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


class RowWriter:
    """Append rows to ``rows.csv`` as they arrive; the header is the union of keys seen so far.

    A row with a key the header lacks rewrites the file once with the wider header (rare: experiments emit
    uniform rows), so the CSV on disk is always complete and parseable.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.rows: list[dict] = []
        self.header: list[str] = []

    def _open_write(self, rows: Iterable[dict], mode: str) -> None:
        with open(self.path, mode, newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.header, restval="")
            if mode == "w":
                w.writeheader()
            for r in rows:
                w.writerow({k: _cell(v) for k, v in r.items()})

    def rewrite(self, rows: list[dict]) -> None:
        """Replace the file's content with ``rows`` (header: the union of their keys)."""
        self.rows = rows
        self.header = list(dict.fromkeys(k for r in rows for k in r))
        self._open_write(rows, "w")

    def add(self, row: dict) -> None:
        self.rows.append(row)
        new = [k for k in row if k not in self.header]
        if new or not self.path.exists():
            self.header.extend(new)
            self._open_write(self.rows, "w")
        else:
            self._open_write([row], "a")

    def extend(self, rows: Iterable[dict]) -> None:
        for r in rows:
            self.add(r)


def _cell(v: Any) -> Any:
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(_jsonable(v))
    return v


@dataclass
class Run:
    """A run directory, its metadata and its rows (rows also live in ``rows.csv``)."""

    dir: Path
    meta: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.dir.name

    def df(self):
        return load(self.dir)

    def add_rows(self, rows: Iterable[dict]) -> None:
        """Rows computed after the ranks finished (e.g. nccl-tests): appended here and in rows.csv."""
        self.rows.extend(rows)
        RowWriter(self.dir / "rows.csv").rewrite(self.rows)

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r}, status={self.meta.get('status')!r}, rows={len(self.rows)})"


def read_meta(run_dir: str | Path) -> dict:
    p = Path(run_dir) / "meta.json"
    return json.loads(p.read_text()) if p.exists() else {}


def run_dirs(path: Path) -> list[Path]:
    """The run directories at or below ``path``."""
    if (path / "meta.json").exists() or (path / "rows.csv").exists() or (path / "rows.csv.gz").exists():
        return [path]
    if path.is_dir():  # an experiment folder (or a results root): every run below it
        return sorted({p.parent for p in path.rglob("meta.json")})
    return []


def load(*paths: str | Path, meta_columns: bool = True):
    """A pandas DataFrame of the rows of one run or several.

    Each path is a run directory, a folder of runs (``results/collectives``) or a glob. Columns added from
    ``meta.json``: ``run_id``, ``label`` (the run's label, else its env overrides, else its run id),
    ``gpu``, ``host`` and ``status`` (:func:`run_status`: a run whose supervisor was killed reads ``died``) --
    so two machines or two env settings can be put side by side.
    """
    import glob as _glob

    import pandas as pd

    dirs: list[Path] = []
    for p in paths:
        p = Path(p)
        matches = [Path(m) for m in _glob.glob(str(p))] if any(c in str(p) for c in "*?[") else [p]
        for m in matches:
            dirs.extend(run_dirs(m))
    frames = []
    for d in dirs:
        csv_path = d / "rows.csv"
        if not csv_path.exists():
            csv_path = d / "rows.csv.gz"  # recorded runs are stored gzipped
        if not csv_path.exists() or csv_path.stat().st_size == 0:
            continue
        df = pd.read_csv(csv_path)
        if meta_columns:
            meta = read_meta(d)
            df["run_id"] = d.name
            df["label"] = run_label(meta) or d.name
            gpus = (meta.get("sysinfo") or {}).get("gpus") or []
            df["gpu"] = gpus[0]["name"] if gpus else "cpu"
            df["host"] = (meta.get("sysinfo") or {}).get("hostname")
            df["status"] = run_status(meta)  # 'died' when its supervisor is gone without an end status
        frames.append(df)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def run_label(meta: dict) -> str:
    if meta.get("label"):
        return meta["label"]
    env = meta.get("env_overrides") or {}
    return " ".join(f"{k}={v}" for k, v in env.items()) or "default env"


def recorded(experiment: str, root: str | Path | None = None) -> list[Path]:
    """Committed GPU runs of ``experiment`` on one machine (newest last): under ``root`` (a folder of
    ``<experiment>/<run-id>/``), by default ``recorded/<MACHINE>/``."""
    base = Path(root or RECORDED_ROOT / MACHINE) / experiment
    return sorted(p.parent for p in base.glob("*/meta.json"))


def describe(run: str | Path | dict, title: bool = False) -> str:
    """A run (its directory or its meta.json as a dict) in one line for labelling recorded results,
    '2x NVIDIA H200 (NV18) | ... | recorded 2026-11-22', or with ``title`` as a figure's two-line title,
    '2x NVIDIA H200 (NV18) | ... \\n collectives run 2026-11-22'."""
    from . import sysinfo

    meta = run if isinstance(run, dict) else read_meta(run)
    when = (meta.get("start_time") or "")[:10]
    hardware = sysinfo.summary(meta.get("sysinfo") or {})
    return f"{hardware}\n{meta.get('experiment', '')} run {when}" if title else f"{hardware} | recorded {when}"


RECORD_MAX_FILE = 2 * 2**20  # files larger than this stay behind (keep the repository small)


# the model in a GPU's name: H100 in 'NVIDIA H100 80GB HBM3', A100 in 'NVIDIA A100-SXM4-80GB', L40S, GH200
_GPU_MODEL = re.compile(r"\b([A-Z]{1,2}\d{1,4}[A-Z]?)\b")


def gpu_model(name: str) -> str:
    """The model word of a GPU name, lower case: 'h100' for 'NVIDIA H100 80GB HBM3', 'h200' for 'NVIDIA H200',
    'a100' for 'NVIDIA A100-SXM4-80GB'; else its first word with a digit ('4090' for 'NVIDIA GeForce RTX
    4090'), else its last word."""
    m = _GPU_MODEL.search(name)
    if m:
        return m.group(1).lower()
    words = name.split() or ["gpu"]
    return next((w for w in words if any(c.isdigit() for c in w)), words[-1]).lower()


def run_gpu_count(meta: dict) -> int:
    """How many GPUs a run used: its world size (the launcher runs one rank per GPU), else the devices
    ``CUDA_VISIBLE_DEVICES`` in its sysinfo left visible, else every GPU of the host. Not the length of the
    sysinfo's GPU list: NVML lists every GPU of the host, whatever ``CUDA_VISIBLE_DEVICES`` says."""
    info = meta.get("sysinfo") or {}
    gpus = info.get("gpus") or []
    if isinstance(meta.get("world_size"), int) and meta["world_size"] > 0:
        return meta["world_size"]
    visible = (info.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return min(len([d for d in visible.split(",") if d.strip()]), len(gpus))
    return len(gpus)


def machine_name(meta: dict) -> str:
    """The folder a run's machine gets under ``recorded/``: ``h200x2`` (2x NVIDIA H200), ``h100x1``, with
    ``-emulated`` for runs on emulated nodes; ``cpu`` without GPUs. The model is :func:`gpu_model`, the count
    :func:`run_gpu_count` (the GPUs the run used, not the host's)."""
    gpus = (meta.get("sysinfo") or {}).get("gpus") or []
    if not gpus:
        return "cpu"
    model = gpu_model(gpus[0].get("name", "gpu"))
    return f"{model}x{run_gpu_count(meta)}" + ("-emulated" if meta.get("emulated") else "")


def record(run_dir: str | Path, root: str | Path | None = None) -> Path:
    """Copy a run into ``recorded/<machine>/<experiment>/<run-id>/`` (:func:`machine_name`) for committing:
    meta.json, rows gzipped, small files (logs, traces already gzipped, graph dumps) up to 2 MiB each. Returns the
    new directory; name it in :data:`RECORDED_SETS` for the notebooks to show it."""
    import gzip
    import shutil

    src = Path(run_dir)
    meta = read_meta(src)
    if not meta:
        raise FileNotFoundError(f"{src} is not a run directory (no meta.json)")
    dest = Path(root or RECORDED_ROOT) / machine_name(meta) / meta.get("experiment", src.parent.name) / src.name
    dest.mkdir(parents=True, exist_ok=False)
    for f in sorted(src.rglob("*")):
        if not f.is_file():
            continue
        rel = f.relative_to(src)
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if rel.name == "rows.csv":
            with open(f, "rb") as fi, gzip.open(dest / "rows.csv.gz", "wb", compresslevel=9) as fo:
                shutil.copyfileobj(fi, fo)
        elif f.stat().st_size <= RECORD_MAX_FILE and not rel.name.endswith(".stacks"):
            shutil.copy2(f, out)
    return dest


# ------------------------------------------------------------------------------------------------ run status
def run_status(meta: dict) -> str:
    """The run's status as a reader should see it: ``meta["status"]``, except that a run still marked
    ``running`` whose supervisor process (``meta["supervisor"]``: pid and host) is gone is ``died`` -- its
    launcher was killed before it could write an end status. Its rows are still usable."""
    status = meta.get("status") or "unknown"
    sup = meta.get("supervisor") or {}
    if status != "running" or not sup.get("pid"):
        return status
    if sup.get("host") and sup["host"] != socket.gethostname():
        return status  # another machine's process: cannot tell from here
    try:
        os.kill(int(sup["pid"]), 0)
    except ProcessLookupError:
        return "died"
    except PermissionError:
        return status  # alive, someone else's
    try:
        if Path(f"/proc/{int(sup['pid'])}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return "died"  # exited, not yet reaped by its parent
    except (OSError, IndexError):
        pass
    if sup.get("start_ticks") is not None and _start_ticks(int(sup["pid"])) not in (None, sup["start_ticks"]):
        return "died"  # the pid was reused by another process
    return status


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid, an
    identity that survives pid reuse. None where /proc is not available."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def supervisor_identity() -> dict:
    """What a run records about the process that supervises it, so readers can tell a dead run."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "start_ticks": _start_ticks(os.getpid())}


# ------------------------------------------------------------------------------------------------ run sets
@dataclass
class RunSet:
    """The runs a notebook analyses: their directories, rows (one DataFrame, ``label``/``run_id`` columns from
    each run's meta) and metadata. Every investigation's ``tables``/``figures``/``findings`` take one."""

    dirs: list[Path]
    source: str = ""
    """where they come from, for people: 'this run', 'recorded: 2x NVIDIA H200 ...', 'given'"""

    def __post_init__(self) -> None:
        self.dirs = [Path(d) for d in self.dirs]
        self._df = None

    @property
    def df(self):
        if self._df is None:
            self._df = load(*self.dirs) if self.dirs else _empty_frame()
        return self._df

    @property
    def metas(self) -> list[dict]:
        return [read_meta(d) for d in self.dirs]

    @property
    def meta(self) -> dict:
        """The first run's meta (hardware and software are the same for every run of a set)."""
        return self.metas[0] if self.dirs else {}

    @property
    def cuda(self) -> bool:
        return any(m.get("backend") == "nccl" for m in self.metas)

    @property
    def title(self) -> str:
        return describe(self.meta, title=True) if self.dirs else "no runs"

    def files(self, pattern: str) -> list[Path]:
        """Files matching ``pattern`` (a glob) in every run directory, sorted."""
        return sorted(f for d in self.dirs for f in d.glob(pattern))

    def __repr__(self) -> str:
        if not self.dirs:
            return "RunSet(no runs)"
        statuses = ", ".join(sorted({run_status(m) for m in self.metas}))
        return (f"RunSet({self.source or 'runs'}: {len(self.dirs)} run(s), {statuses}; "
                f"{self.title.replace(chr(10), ' | ')}; {', '.join(str(d) for d in self.dirs)})")


def _empty_frame():
    import pandas as pd

    return pd.DataFrame()


def recorded_set(name: str, root: str | Path | None = None) -> list[Path]:
    """The recorded runs a notebook shows: the runs :data:`RECORDED_SETS` names for ``name`` (those present);
    with ``root`` (a folder of ``<experiment>/<run-id>/``), the newest run per label of experiment ``name`` there
    (one per env setting of an ``env_sets`` comparison)."""
    if root is None and name in RECORDED_SETS:
        machine, experiment, ids = RECORDED_SETS[name]
        base = Path(RECORDED_ROOT) / machine / experiment
        return [base / i for i in ids if (base / i / "meta.json").exists()]
    if root is None:
        return []
    latest: dict[str, Path] = {}
    for d in recorded(name, root):
        latest[run_label(read_meta(d)) or d.name] = d
    return sorted(latest.values())


def choose(experiment: str, this=None, analyse: Any = "auto", root: str | Path | None = None,
           set_name: str | None = None) -> RunSet:
    """The one rule every notebook uses to pick the runs it analyses.

    ``this``: the Run(s) just made (or None/[] when the investigation could not run here). ``analyse``:
    ``"auto"`` -- this run when it ran on CUDA GPUs, else the recorded GPU runs (:func:`recorded_set`), else
    this run; ``"this"``; ``"recorded"``; or a list of run directories to analyse instead. ``set_name``: which
    of :data:`RECORDED_SETS` (default: the experiment's own); ``root``: a folder of recorded runs instead.
    """
    if isinstance(this, Run):
        this = [this]
    mine = [r.dir for r in (this or [])]
    if isinstance(analyse, (list, tuple)):
        empty = [str(p) for p in analyse if not run_dirs(Path(p))]
        if empty:
            raise ValueError(f"no run directory at {', '.join(empty)} (a run directory holds meta.json / rows.csv)")
        return RunSet([Path(d) for p in analyse for d in run_dirs(Path(p))], "given")
    if analyse not in ("auto", "this", "recorded"):
        raise ValueError(f"analyse must be 'auto', 'this', 'recorded' or a list of run directories, not {analyse!r}")
    rec = recorded_set(experiment, root) if root is not None else recorded_set(set_name or experiment)
    rec_set = RunSet(rec, f"recorded: {describe(rec[0])}" if rec else "recorded (none)")
    if analyse == "recorded":
        return rec_set
    here = RunSet(mine, "this run")
    if analyse == "this" or (here.dirs and here.cuda) or not rec:
        return here
    return rec_set
