"""Collective bandwidth: what a PyTorch program gets from each collective, next to what the hardware does.

For every collective and size, on every rank, three timings (all samples kept, rows ``kind="sample"``):

* ``eager``  -- CUDA events around ``iters`` queued ``torch.distributed`` calls on the current stream: what a
  PyTorch program gets. The host time to enqueue one call is kept beside it (``host_us``): when it exceeds the
  device time, the GPU waits for Python and the eager number measures the host, not the network.
* ``graph``  -- the same ``iters`` calls captured in one CUDA graph and replayed: device-only time without
  per-call host work (CUDA only).
* ``kernel`` -- the durations of the NCCL kernels of one profiled eager loop (torch.profiler / CUPTI), CUDA
  only. A collective kernel starts on each GPU when that rank launches it and spins until its peers arrive,
  so on every rank but the last to arrive it includes waiting for a late peer (seen on 2xH200 at 1 MiB:
  12 us on one rank, 63 us on the other, whose host was ahead). The summary therefore takes, per call, the
  *shortest* duration over ranks (``kit.stats.per_sample(how="min")``): the last rank to arrive waits for no
  one, its kernel is the transfer. With one rank NCCL launches no kernel at all: the run then writes a
  ``kind="note"`` row saying so instead of kernel samples.
* ``nccl-tests`` / ``nccl-tests-graph`` (rows ``kind="nccl-tests"``) -- when the nccl-tests binaries are
  available (``nccl_tests`` parameter), their out-of-place time for the same sizes, plain and with ``-G`` (its
  own CUDA-graph mode, the like-for-like reference for ``graph``), run by the launcher after the ranks finish.

Sizes follow nccl-tests: ``bytes`` is the larger of the send and receive buffers (for all_gather the gathered
output, for reduce_scatter the input), rounded down so each rank's part is a whole number of 16-byte aligned
elements. ``algbw = bytes / time`` (``kit.stats.gbps``); ``busbw = algbw * factor`` with nccl-tests' factors
(``kit.collective_ops``). busbw is comparable across collectives and to the link speed; algbw is what the
caller sees per byte of its buffer.

Needs two ranks: with one, nothing crosses a link (all_reduce's bus factor is 0) and NCCL launches no kernel.
The analyses (:func:`summarize` and the ``tables`` / ``figures`` / ``findings``) read runs recorded before rows
had a ``kind`` (``recorded/h200x2/collectives/``) by filling it from ``method`` (:func:`rows`).

Package layout: :mod:`.sweep` (Config, the rank function), :mod:`.nccl_tests` (the launcher-side reference),
:mod:`.analysis` (summary, tables, figure, findings).
"""

from __future__ import annotations

from ...contract import Investigation, Needs
from ... import regimes as kit_regimes
from .analysis import (at_1mib_table, busbw_figure, busbw_table, findings, notes_table, regime_findings,
                       regimes_figure, regimes_table, rows, summarize, times_table)
from .nccl_tests import after, find_nccl_tests, parse_nccl_tests, run_nccl_tests
from .sweep import NO_KERNEL, Config, kernel_durations, per_rank_count, points, run

INVESTIGATION = Investigation(
    name="collectives",
    Config=Config,
    run=run,
    columns=("kind", "collective", "bytes", "method"),
    tables={"busbw": busbw_table, "times": times_table, "at_1mib": at_1mib_table, "notes": notes_table,
            "regimes": regimes_table, "nccl_transports": kit_regimes.transports_table},
    figures={"busbw": busbw_figure, "busbw-regimes": regimes_figure},
    findings=findings,
    needs=Needs(ranks=2),
    after=after,
    points=points,
    question="what busbw each collective reaches from PyTorch (eager, graph, kernel) next to nccl-tests",
)

__all__ = ["Config", "INVESTIGATION", "NO_KERNEL", "after", "at_1mib_table", "busbw_figure", "busbw_table",
           "find_nccl_tests", "findings", "kernel_durations", "notes_table", "parse_nccl_tests", "per_rank_count",
           "regime_findings", "regimes_figure", "regimes_table", "rows", "run", "run_nccl_tests", "summarize",
           "times_table"]
