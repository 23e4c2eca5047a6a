"""nccl-tests beside the sweep: find the ``*_perf`` binaries, run them at the sweep's sizes (plain and with
``-G``, its CUDA-graph mode) once the ranks are done, and parse their table into rows ``kind="nccl-tests"``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from ...collective_ops import SWEEPABLE, nccl_tests_binary
from .sweep import Config

_NCCL_TESTS_DTYPE = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double",
                     "int32": "int32", "int8": "int8"}


def find_nccl_tests(setting: str) -> dict[str, str]:
    """Map collective -> nccl-tests binary. ``setting``: 'auto' (PATH, $NCCL_TESTS_DIR), a directory, a binary."""
    if not setting:
        return {}
    dirs: list[str] = []
    if setting == "auto":
        if os.environ.get("NCCL_TESTS_DIR"):
            dirs.append(os.environ["NCCL_TESTS_DIR"])
    elif os.path.isfile(setting):
        dirs.append(os.path.dirname(setting) or ".")
    else:
        dirs.append(setting)
    found = {}
    for coll in SWEEPABLE:
        exe = nccl_tests_binary(coll)
        cands = [os.path.join(d, sub, exe) for d in dirs for sub in ("", "build")]
        hit = next((c for c in cands if os.access(c, os.X_OK)), None)
        if hit is None and setting == "auto":
            hit = shutil.which(exe)
        if hit:
            found[coll] = hit
    return found


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


def parse_nccl_tests(text: str, collective: str) -> list[dict]:
    """Rows (``kind="nccl-tests"``) from nccl-tests' table: size, count, type, redop, root, then out-of-place
    and in-place (time us, algbw GB/s, busbw GB/s, #wrong). Both placements are kept (``placement`` column)."""
    rows = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _ROW.match(line)
        if not m:
            continue
        size = int(m.group(1))
        for placement, (t, a, b) in (("out-of-place", m.group(6, 7, 8)), ("in-place", m.group(10, 11, 12))):
            try:
                t, a, b = float(t), float(a), float(b)
            except ValueError:
                continue
            rows.append(dict(kind="nccl-tests", collective=collective, bytes=size, method="nccl-tests",
                             placement=placement, sample=0, time_us=t, algbw_gbps=a, busbw_gbps=b, rank=-1))
    return rows


def run_nccl_tests(binaries: dict[str, str], cfg: Config, ngpus: int, timeout_s: float = 600) -> tuple[list[dict], list[str]]:
    """Run each binary over the configured sizes on ``ngpus`` GPUs of this node (one process, -g ngpus)."""
    rows, logs = [], []
    env = {**os.environ, **cfg.env}
    # as many timed calls as one of our points (iters x repeats); a longer warm-up than ours because each
    # binary is a fresh process whose GPU clocks and NCCL connections start cold
    n, w = cfg.iters * cfg.repeats, max(cfg.warmup, 20)
    for coll in cfg.collectives:
        exe = binaries.get(coll)
        if not exe:
            continue
        base = [exe, "-b", str(cfg.min_bytes), "-e", str(cfg.max_bytes), "-f", "2", "-g", str(ngpus),
                "-w", str(w), "-d", _NCCL_TESTS_DTYPE[cfg.dtype], "-c", "0"]
        for method, extra in (("nccl-tests", ["-n", str(n)]), ("nccl-tests-graph", ["-n", str(cfg.iters), "-G", str(cfg.repeats)])):
            cmd = base + extra
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logs.append(f"$ {' '.join(cmd)}\n(timed out after {timeout_s:g} s)")
                continue
            logs.append(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
            for r in parse_nccl_tests(p.stdout, coll):
                r.update(method=method, world_size=ngpus, iters=cfg.iters, dtype=cfg.dtype)
                rows.append(r)
    return rows, logs


def after(cfg: Config, run) -> None:
    """Launcher-side step once the ranks are done: nccl-tests at the same sizes, into the same run."""
    from ... import results

    meta = run.meta
    if meta.get("backend") != "nccl" or meta.get("mode") != "spawn":
        return
    binaries = find_nccl_tests(cfg.nccl_tests)
    meta["nccl_tests"] = {"binaries": binaries}
    if not binaries:
        return
    rows, logs = run_nccl_tests(binaries, cfg, meta["world_size"])
    (run.dir / "nccl-tests.log").write_text("\n\n".join(logs))
    run.add_rows(rows)
    results.write_json(run.dir / "meta.json", meta)
