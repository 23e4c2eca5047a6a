"""``meta.json`` of a run, as the launcher writes it: once at the start (``status: running``), once at the end.

The start meta records the run's **supervisor** (:func:`kit.results.supervisor_identity`: pid, host, process
start time) -- in spawn mode the launching process (a notebook kernel, ``kit exp``), in place (torchrun,
srun) rank 0's process, the one that writes the run directory. A supervisor killed before it could write the
end status (SIGKILL, OOM killer, a node reboot) leaves ``running`` behind; :func:`kit.results.run_status`
then reads the run as ``died`` because that process is gone. Ranks die with a spawn supervisor, so a
``died`` run holds no GPU; its rows (streamed to ``rows.csv`` as they arrived) stay usable.

End statuses: ``ok``, ``failed`` (``error`` and ``error.txt`` hold why), ``interrupted`` (Ctrl-C / SIGTERM
to the supervisor).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from .. import results


def start_meta(experiment: str, cfg, world: int, backend: str, mode: str) -> dict:
    """The meta of a run that is starting. ``mode``: ``spawn`` or ``in-place``."""
    return {
        "experiment": experiment,
        "status": "running",
        "mode": mode,
        "world_size": world,
        "backend": backend,
        "label": getattr(cfg, "label", ""),
        "config": dataclasses.asdict(cfg),
        "env_overrides": dict(cfg.env),
        "git_commit": results.git_commit(),
        "start_time": _now(),
        "end_time": None,
        "supervisor": {**results.supervisor_identity(), "role": "launcher" if mode == "spawn" else "rank 0"},
        "sysinfo": None,
    }


def placement(ranks: list[dict]) -> dict:
    """Where the ranks ran, from one ``{"rank", "node", "local_rank"}`` per rank: the nodes (in order of their
    lowest rank), the ranks of each, and ranks per node (None when nodes differ in size)."""
    by_node: dict[str, list[int]] = {}
    for r in sorted(ranks, key=lambda r: r["rank"]):
        by_node.setdefault(str(r["node"]), []).append(int(r["rank"]))
    sizes = {len(v) for v in by_node.values()}
    return {"nodes": len(by_node), "ranks_per_node": sizes.pop() if len(sizes) == 1 else None,
            "ranks": by_node}


def write(run_dir: Path, meta: dict) -> None:
    results.write_json(Path(run_dir) / "meta.json", meta)


def finish(run_dir: Path, meta: dict, status: str, error: str | None = None) -> None:
    """Write the end status (and ``error.txt`` when there is an error)."""
    meta["status"] = status
    meta["end_time"] = _now()
    if error:
        meta["error"] = error
        (Path(run_dir) / "error.txt").write_text(error + "\n")
    if meta.get("sysinfo") is None:  # the rank never got far enough; the supervisor's view is still worth having
        from .. import sysinfo

        meta["sysinfo"] = sysinfo.collect()
    write(run_dir, meta)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
