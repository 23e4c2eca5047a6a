"""The doctor's rules, one module each, registered at import (:func:`kit.doctor.model.rule`) in this order.

Communication across ranks, on the per-rank timeline of :mod:`.comm`: ``per_param_allreduce``, ``exposed_comm``,
``late_rank`` (with :mod:`.late_arrival` and :mod:`.same_kernels`), ``comm_compute_contention``, ``low_busbw``
(against the machine's sweep). One rank's GPU and host timeline, on :mod:`.host`: ``graph_mixing_gap`` (CUDA-graph
mixing gap), ``pageable_h2d``, ``h2d_on_compute_stream``, ``launch_bound``, ``host_sync`` (with
:mod:`.sync_costs`). :mod:`.idle` -- the step accounting's idle slices (input-bound, host stall, allocator churn,
queued, unexplained). Their fixed texts are in :mod:`kit.doctor.texts`.
"""

from . import per_param_allreduce, exposed_comm, late_rank, comm_compute_contention, low_busbw  # noqa: F401, I001
from . import graph_mixing_gap, pageable_h2d, h2d_on_compute_stream, launch_bound, host_sync  # noqa: F401, I001
from . import idle  # noqa: F401
