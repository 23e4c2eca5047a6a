"""kit: notebook-driven investigations of distributed-GPU performance in PyTorch.

The map (details and the recipe for a new investigation: ``kit/README.md``):

* infrastructure -- ``launch`` (run an experiment on N ranks: spawn, torchrun, SLURM), ``timing`` (one way to
  time), ``stats`` (one way to summarise), ``results`` (one way to store, load and choose runs), ``config``
  (typed configs), ``sysinfo``, ``plot``, ``contract`` (what an investigation is; the registry), ``runner``
  (``kit run``), ``notebook`` (the calls a notebook makes), ``collective_ops`` (facts per collective), ``cli``;
* ``traces/`` -- analyses of any PyTorch profiler trace (a user's job's too);
* ``transports/`` -- point-to-point transports behind one interface, chosen by capability;
* ``investigations/`` -- ``collectives``, ``graph_gaps``, ``collective_tracing``, ``dataloader_sync``,
  ``p2p_transports``: one module or small package each.

Nothing heavy is imported here: every spawned rank imports this package.
"""

__version__ = "0.2.0"
