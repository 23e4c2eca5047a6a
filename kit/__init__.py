"""kit: notebook-driven investigations of distributed-GPU performance in PyTorch.

The map, layer by layer (each imports only from its own layer or below: ``tests/test_layers.py`` declares and
checks it; details and the recipe for a new investigation: ``kit/README.md``):

* infrastructure -- ``launch`` (run an experiment on N ranks: spawn, torchrun, SLURM, emulated nodes), ``timing``
  (one way to time), ``stats`` (one way to summarise), ``results`` (one way to store, load and choose runs; the
  recorded sets the notebooks show), ``regimes`` (one node beside emulated nodes), ``config`` (typed configs),
  ``sysinfo``, ``plot``, ``contract`` (what an investigation is; the registry), ``runner`` (``kit run``),
  ``notebook`` (the calls a notebook makes), ``progress``, ``collective_ops`` (facts per collective), ``sweeps``
  (a collectives sweep as rows; nccl-tests output parsed), ``wheelhouse``;
* traces -- ``traces/`` (analyses of any PyTorch profiler trace, a user's job's too), ``nccl_profiler/`` (NCCL's
  own events next to Kineto), ``capture`` (traces of a user's training loop for ``kit doctor``), ``gpu_profile``
  (the GPU events of a few calls);
* ``transports/`` -- point-to-point transports behind one interface, chosen by capability;
* ``investigations/`` -- ``collectives``, ``graph_gaps``, ``collective_tracing``, ``dataloader_sync``,
  ``p2p_transports``: one module or small package each; beside them ``doctor/`` (``kit doctor``: which known
  causes a job's traces show), neither importing the other;
* ``cli/`` -- the ``kit`` command (``python -m kit``).

Nothing heavy is imported here: every spawned rank imports this package.
"""

__version__ = "0.1.0"
"""the same as pyproject.toml's (tests/test_repo_size.py checks it)"""
