"""CUDA-graph gaps before NCCL kernels, and what CUDA graphs buy.

The reported setup: N layers of ``Linear(hidden, hidden, bias=False)``, each followed by ``all_reduce``, in
inference mode (batch 1024, hidden 2048, fp32, TF32 a parameter), plus a matmul-only control model. For every
N, model and mode (``eager`` = the Python loop; ``graph`` = the same forward captured once in a CUDA graph,
warm-up on a side stream first, and replayed), on every rank:

* ``kind=time``    -- time per forward, ``iters`` forwards per sample, every sample kept (kit.timing);
* ``kind=profile`` -- from a torch.profiler (CUPTI) trace of ``profile_forwards`` forwards: the sum of kernel
  durations per forward (the pure device work: time above it is overhead) and the gaps before NCCL kernels and
  before other kernels (kit.traces.gaps: start minus the latest end of any earlier activity on that GPU, all
  streams; gaps above ``gap_threshold_us`` count as stalls). Traces for N in ``keep_traces`` are kept, gzipped,
  named by kit.traces.trace_path (``trace_model=allreduce_layers=10_mode=graph_rank0.json.gz``) and found again
  by kit.traces.find_traces (older recorded names included);
* ``kind=census``  -- node types of the captured graph at N = ``census_layers`` (``CUDAGraph.debug_dump``,
  kit.traces.graph_census): the structural evidence of what NCCL inserts, and proof the variable reached NCCL;
* ``kind=launch``  -- why graphs exist: a chain of ``launch_layers`` small Linear layers, eager vs graphed, and
  a small training step eager vs ``torch.cuda.make_graphed_callables``, per batch size;
* ``kind=check``   -- without CUDA, the output's RMS (the eager timing is all that runs, on gloo).

Every row names its mode in one column, ``mode`` (kit.timing calls it ``method``; :func:`.experiment.timed_rows`
is the one place it is renamed), as the recorded runs do.

Settings: ``env_sets`` (default: NCCL's default and ``NCCL_GRAPH_MIXING_SUPPORT=0``) -- one launch per set, since
NCCL reads the variable when the communicator is created. Weights differ per rank (like tensor-parallel shards)
and are drawn with variance 1/(hidden * world): the all-reduced sum of the ranks' outputs then keeps E|y|^2
constant through any number of layers, so the timing is of real numbers, neither inf nor underflowed zeros
(each profile row records the output's RMS as proof).

**One GPU.** Launch overhead and graph replay are meaningful with one rank (time per forward, graph/eager, the
launch benchmark, the census of a graph without NCCL); the gap before NCCL kernels is not -- with one rank the
``allreduce`` model runs no all_reduce and NCCL launches no kernel -- and the analyses say so instead of showing
numbers. Hence ``needs = Needs(ranks=1)``.

* ``stream`` (a column of every time / profile / position row): the stream each graph was replayed into,
  ``replay_streams`` (:mod:`.streams`: ``legacy`` -- what ``g.replay()`` uses in a plain loop --, ``created``,
  ``per_thread``, ``blocking``); eager rows say ``legacy``. ``kind=stream`` rows: each stream's CUDA handle, or
  why it is not available. :mod:`.stream_factor` analyses it (the ``streams`` table, the ``replay-stream`` figure).
* ``kind=position`` -- the gap before every NCCL kernel of the profiled forwards by its position (every run).
* ``kind=work|work_time|replay|replay_gap|edge|launch_profile`` -- why the gap grows with N
  (:mod:`.mechanism`, ``mechanism=True``, CUDA only).

Package layout: :mod:`.experiment` (Config, model, the rank function), :mod:`.analysis` (tables, kept-trace
gaps), :mod:`.figures`, :mod:`.findings`, :mod:`.mechanism` (the mechanism experiments, their tables and
figures), :mod:`.record_probe` (the no-NCCL control: event-record nodes alone, and its PyTorch bisection),
:mod:`.matrix` (the one-GPU probe matrix without PyTorch or NCCL: ``recorded/probes/graph_gaps-repro/repro.cu``),
:mod:`.streams` (the replay streams), :mod:`.stream_factor` (their analysis).
"""

from __future__ import annotations

from functools import partial

from ...contract import Investigation, Needs
from .analysis import (NO_NCCL, census_table, forward_table, gaps_table, kept_trace_gaps, launch_table,
                       one_layer_window, table_census, table_forward, table_gaps, table_launch)
from .experiment import Config, build_forward, capture, points, run, timed_rows
from .figures import FIGURES
from .findings import findings
from .mechanism import (edges_table, gap_by_position, gap_vs_work, launch_profile_table, position_table,
                        replay_table, work_table)
from .matrix import figure as matrix_figure, hardware as matrix_hardware, source as matrix_source
from .matrix import factor_table, launch_table as probe_launch_table, matrix_table, outputs_table
from .record_probe import probe_table, torch_table
from .compile_probe import compile_table
from .stream_factor import stream_figure, stream_findings, stream_runs, stream_table

def _figure(hw: str, _runs=None):
    """The probe matrix figure of one hardware (committed rows: the runs are not used)."""
    return matrix_figure(hw)


def _matrix_figures() -> dict:
    """``probe-matrix-<hw>`` per committed hardware, each saying what it shows (``source``: kit.contract.figure)."""
    out = {}
    for hw in matrix_hardware():
        fn = partial(_figure, hw)
        fn.source = matrix_source(hw)
        out[f"probe-matrix-{hw}"] = fn
    return out


INVESTIGATION = Investigation(
    name="graph_gaps",
    Config=Config,
    run=run,
    columns=("kind", "mode"),
    tables={"streams": lambda runs: stream_table(runs.df), "forward": table_forward, "gaps": table_gaps, "census": table_census, "launch": table_launch,
            "position": lambda runs: position_table(runs.df), "work": lambda runs: work_table(runs.df),
            "replays": lambda runs: replay_table(runs.df), "edges": lambda runs: edges_table(runs.df),
            "launch_profile": lambda runs: launch_profile_table(runs.df), "record_node_probe": probe_table,
            "torch_probe": torch_table, "torch_compile": compile_table, "probe_matrix_launch": probe_launch_table,
            "probe_matrix": lambda runs: factor_table(matrix_table()), "repro_outputs": outputs_table},
    figures={**FIGURES, "replay-stream": stream_figure, "gap-by-position": gap_by_position, "gap-vs-work": gap_vs_work,
             **_matrix_figures()},
    findings=findings,
    needs=Needs(ranks=1),
    points=points,
    question="why a CUDA graph idles before each NCCL kernel (NCCL_GRAPH_MIXING_SUPPORT), and what graphs buy",
)

__all__ = ["Config", "FIGURES", "INVESTIGATION", "NO_NCCL", "build_forward", "capture", "census_table", "findings",
           "forward_table", "gaps_table", "kept_trace_gaps", "launch_table", "one_layer_window", "run", "timed_rows",
           "edges_table", "gap_by_position", "gap_vs_work", "launch_profile_table", "position_table", "replay_table",
           "work_table", "probe_table", "torch_table", "matrix_table", "factor_table", "probe_launch_table",
           "stream_table", "stream_figure", "stream_findings", "stream_runs", "compile_table", "outputs_table"]
