"""kit: notebook-driven investigations of distributed-GPU performance in PyTorch.

Flat modules, one job each: ``launch`` (run an experiment on N ranks), ``timing`` (one way to time),
``results`` (one way to store and load runs), ``plot`` (one way to plot), ``sysinfo`` (what a result came
from), ``traces``/``comm_trace`` (analyses of any PyTorch profiler trace), and one module per investigation
(``collectives``, ``graph_gaps``, ``collective_tracing``, ``dataloader_sync``). Nothing heavy is imported
here: every spawned rank imports this package.
"""

__version__ = "0.1.0"
