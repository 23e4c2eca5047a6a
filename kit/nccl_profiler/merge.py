"""NCCL's profiler-plugin dumps in a merged trace: the :class:`kit.traces.merge.Source` that puts each rank's
dumps (aligned with that rank's trace: :mod:`.align`) under its NCCL kernels, and :func:`merge`, the trace
layer's merge with it (what ``kit trace merge`` runs). The trace layer knows nothing of NCCL's plugin: this
module is the hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from ..traces.frames import load_trace
from ..traces.merge import merge as _merge
from ..traces.parse import TraceError


class NcclDumps:
    """The dumps given among the traces, plus (``nccl="auto"``) those beside them, or (a list) those files
    or directories; ``None``/``False``: none (only the given dumps are taken out of the traces). An unreadable
    dump is a TraceError naming it."""

    key = "nccl"
    label = "NCCL profiler"

    def __init__(self, nccl: Any = "auto"):
        self.nccl = nccl
        self.dumps: list = []

    def split(self, items: list[Path]) -> list[Path]:
        from .dump import MANIFEST, DumpError, find_dumps, is_dump, read_dump

        given = [p for p in items if is_dump(p)]
        rest = [p for p in items if not is_dump(p) and p.name != MANIFEST]
        if self.nccl in (None, False):
            found: list[Path] = []
        elif self.nccl == "auto":
            found = given + [d for parent in dict.fromkeys(p.parent for p in rest) for d in find_dumps(parent)]
        else:
            found = given + find_dumps(self.nccl)
        try:
            self.dumps = [read_dump(f) for f in dict.fromkeys(found)]
        except DumpError as e:
            raise TraceError(str(e)) from None
        if not rest and given:
            raise TraceError("no Kineto trace among the files given (only NCCL profiler dumps)")
        return rest

    def events(self, path: Path, rank: int, pid_of: Callable[[int, Any], int],
               cache: bool | None) -> tuple[list[dict], list[dict]]:
        """The NCCL events of ``rank`` (its dumps aligned with its trace at ``path``) and one info dict per dump."""
        from . import align, chrome
        from .dump import collectives

        mine = [d for d in self.dumps if d.rank == rank]
        if not mine:
            return [], []
        kernels = align.kineto_nccl_kernels(load_trace(path, cache=cache))  # kernels + their launch calls
        evs, info = [], []
        for d in mine:
            a, m = align.align(collectives(d), kernels, rank)
            info.append({"dump": str(d.path), "comm": str(d.comm), **a.to_json()})
            if not len(m):
                continue
            host = kernels["pid"].dropna()
            pg = pid_of(rank, int(m["kernel_pid"].iloc[0]))
            ph = pid_of(rank, int(host.iloc[0])) if len(host) else pg
            evs += chrome.events(d, m, a.host_offset_us, a.gpu_rel_offset_us, pg, ph, gpu_base_ns=a.gpu_base_ns)
            evs += chrome.thread_names(pg, ph, d.events["channel"].dropna().unique())
        return evs, info


def merge(paths: Iterable[str | Path] | str | Path, out: str | Path, *, nccl: Any = "auto",
          **kw: Any) -> dict[str, Any]:
    """:func:`kit.traces.merge` with NCCL's profiler-plugin dumps under each rank's kernels (``nccl``: see
    :class:`NcclDumps`); ``info["nccl"]``: per dump the offsets, the matched collectives and the alignment
    error -- only when some dump was found."""
    src = NcclDumps(nccl)
    info = _merge(paths, out, sources=[src], **kw)
    if not src.dumps:
        info.pop("nccl", None)
    return info
