"""The doctor's rules, registered at import (:func:`kit.doctor.model.rule`). ``idle`` -- the step accounting's idle
slices (input-bound, host stall, allocator churn, queued, unexplained); ``host`` -- one rank's GPU and host
timeline (CUDA-graph mixing gap, pageable and compute-stream H2D copies, launch-bound, host syncs); ``comm`` --
communication across ranks (per-parameter all-reduce, exposed communication, late rank, contention, busbw vs the
machine's sweep)."""

from . import comm, host, idle  # noqa: F401
