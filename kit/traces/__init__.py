"""Analysis of PyTorch profiler traces (Chrome trace JSON, plain or gzipped) -- one layer for every analysis.

Works on any trace ``torch.profiler`` (Kineto) writes, not only the kit's: point it at a trace of your own job.

The layer, bottom up:

* :mod:`~kit.traces.parse` -- the only JSON decoding: msgspec, into structs that hold only the declared fields,
  a chunk of events at a time (a 100 MB trace: ~0.8 s, ~240 MB peak for ``kit trace gaps``); fatal problems
  (not UTF-8, no events, not a trace) raise a one-line :class:`TraceError`.
* :mod:`~kit.traces.columns` -- the frames as numpy columns until a DataFrame is asked for.
* :mod:`~kit.traces.cache` -- those columns in Parquet beside the trace (``.kitcache/``), keyed by the file and
  the kit's trace-layer version, written and read without pandas; it knows nothing of the layers above.
* :mod:`~kit.traces.frames` -- ``load_trace(path) -> Trace``: each file parsed **once** into typed frames
  ``gpu`` (kernels/memcpy/memset), ``cpu`` (annotations, runtime launches with correlation, c10d ops),
  ``collectives`` (one row per NCCL kernel or gloo op, :mod:`~kit.traces.collective_frame`) and ``info`` (rank,
  world size, backend, NCCL version), through a declared :class:`Adapter` per trace format, picked by the
  events' categories -- the one place raw ``args`` keys are named; ``Trace.warnings``: what was dropped, and a
  trace that looks subsampled.
* :mod:`~kit.traces.jobs` -- many ranks: ``check_job(rank_identity(t) for t in ...)`` (one job: world size,
  no rank twice, one GPU family, overlapping spans -- else :class:`JobError`; missing ranks named, the result
  partial), ``expand(files|dirs|globs)``, ``map_ranks(paths, fn, workers=, client=)``: per-rank work in a local
  process pool or on a Dask cluster, one rank's events per worker at a time, a bad file named and left out;
  ``collectives``/``trace_gaps``/``merge``/``clock_offsets`` take ``workers=``/``client=`` and check the job.
* analyses on the frames: :mod:`~kit.traces.gaps` (idle GPU time before kernels), :mod:`~kit.traces.comm`
  (collectives matched across ranks, bandwidth, summary), :mod:`~kit.traces.overlap` (communication hidden by
  compute), :mod:`~kit.traces.merge` (one clock for all ranks, one merged trace), :mod:`~kit.traces.census`
  (CUDA-graph node types), :mod:`~kit.traces.flight_recorder`. No import cycle among these modules (``tests/test_layers.py`` checks it).
* :mod:`~kit.traces.names` -- ``trace_path(ctx, **tags)`` names the traces an investigation keeps and
  ``find_traces(dirs, **tags)`` finds them again (old names in ``recorded/`` included).

Every analysis takes empty input (no events, no NCCL kernel, one rank) and returns an empty frame with its
columns, or says what is missing -- never a KeyError.

Quick use::

    from kit import traces
    t = traces.load_trace("trace_part=ddp_rank0.json.gz")
    t.gpu, t.cpu, t.collectives, t.info
    traces.gaps(t.gpu); traces.overlap(t.gpu)
    df = traces.collectives([f.path for f in traces.find_traces(run_dir, part="ddp")])
"""

from __future__ import annotations

from .frames import (ADAPTERS, CPU_COLUMNS, GPU_CATS, GPU_COLUMNS, KINETO, KINETO_LEGACY, Adapter, Trace,
                     TraceInfo, from_dict, gpu_events, is_nccl_kernel, load_trace)
from .gaps import DEFAULT_STALL_US, combine_gaps, format_gaps, gap_summary, gaps, trace_gaps
from .jobs import JobCheck, JobError, RankFailure, RankIdentity, RankResults, check_job, expand, map_ranks, rank_identity
from .merge import aligned_gpu, clock_offsets, merge
from .names import TraceFile, find_traces, parse_name, trace_path
from .overlap import OVERLAP_COLUMNS, overlap
from .parse import TraceError, load

_LAZY = {  # imported on first use (PEP 562): `kit trace gaps` needs none of them (the collectives' modules and
    # multiprocessing were 0.03 s of its CPU). The names that are also a submodule's (gaps, merge, overlap) stay
    # above: a submodule imported after the package would rebind the name to itself.
    **dict.fromkeys(("NODE_TYPES", "graph_census", "graph_edges"), "census"),
    **dict.fromkeys(("COLLECTIVE_COLUMNS", "collective_rows", "collectives", "explain_empty", "format_text",
                     "match_instances", "summary", "to_json", "write_json"), "comm"),
    **dict.fromkeys(("dump_flight_recorder", "fr_entries", "fr_mismatches", "fr_statements"), "flight_recorder"),
}


def __getattr__(name: str):
    from importlib import import_module

    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in {"census", "comm", "flight_recorder", "collective_frame"}:  # kit.traces.comm without importing it
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["ADAPTERS", "Adapter", "COLLECTIVE_COLUMNS", "CPU_COLUMNS", "DEFAULT_STALL_US", "GPU_CATS", "GPU_COLUMNS",
           "JobCheck", "JobError", "KINETO", "KINETO_LEGACY", "NODE_TYPES", "OVERLAP_COLUMNS", "RankFailure", "RankIdentity", "RankResults", "Trace",
           "TraceError", "TraceFile", "TraceInfo", "aligned_gpu", "check_job", "clock_offsets", "collective_rows", "collectives",
           "combine_gaps", "dump_flight_recorder", "expand", "explain_empty", "find_traces", "format_gaps",
           "format_text", "fr_entries", "fr_mismatches", "fr_statements", "from_dict", "gap_summary", "gaps",
           "gpu_events", "graph_census", "graph_edges", "is_nccl_kernel", "load", "load_trace", "map_ranks", "match_instances",
           "merge", "overlap", "parse_name", "rank_identity", "summary", "to_json", "trace_gaps", "trace_path", "write_json"]
