"""One table of facts per collective, as nccl-tests keeps them: the bus-bandwidth factor, the nccl-tests
binary, and the names the collective has in PyTorch profiler traces (Kineto's ``Collective name``, gloo's
``gloo:<op>`` annotations, c10d's op names, NCCL's kernel names). Used by the bandwidth sweep
(kit.investigations.collectives) and by trace analysis (kit.traces) alike.

``busbw = algbw x factor(n)`` (nccl-tests' PERFORMANCE.md): all_reduce 2(n-1)/n; all_gather, reduce_scatter,
all_to_all (n-1)/n; broadcast, reduce and point-to-point 1. busbw is comparable across collectives and to the
link speed; algbw (bytes / time) is what the caller sees per byte of its buffer. ``bytes`` is the larger of the
send and receive buffers (all_gather: the gathered output; reduce_scatter: the input).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Collective:
    name: str
    factor: str
    """'2(n-1)/n', '(n-1)/n' or '1'"""
    nccl_tests: str | None
    """the nccl-tests binary that measures it"""
    aliases: tuple[str, ...] = ()
    """names in traces and in c10d (lower-case), besides ``name``"""
    kernel: str | None = None
    """the word in NCCL's kernel name: ncclDevKernel_<kernel>_..."""

    def bus_factor(self, n: int) -> float:
        if self.factor == "2(n-1)/n":
            return 2 * (n - 1) / n
        if self.factor == "(n-1)/n":
            return (n - 1) / n
        return 1.0


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("all_reduce", "2(n-1)/n", "all_reduce_perf", ("allreduce", "allreduce_coalesced"), "AllReduce"),
    Collective("all_gather", "(n-1)/n", "all_gather_perf",
               ("allgather", "_allgather_base", "_all_gather_base", "all_gather_into_tensor",
                "allgather_into_tensor_coalesced"), "AllGather"),
    Collective("reduce_scatter", "(n-1)/n", "reduce_scatter_perf",
               ("_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"), "ReduceScatter"),
    Collective("broadcast", "1", "broadcast_perf", (), "Broadcast"),
    Collective("all_to_all", "(n-1)/n", "alltoall_perf", ("alltoall", "alltoall_base", "all_to_allv",
                                                          "all_to_all_single"), "AllToAll"),
    Collective("reduce", "1", "reduce_perf", (), "Reduce"),
    Collective("send", "1", "sendrecv_perf", ()),
    Collective("recv", "1", None, ()),
    Collective("send_recv", "1", "sendrecv_perf", ("sendrecv",), "SendRecv"),
    Collective("gather", "1", "gather_perf", ()),
    Collective("scatter", "1", "scatter_perf", ()),
    Collective("barrier", "1", None, ()),
)}
SWEEPABLE = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
"""the collectives the bandwidth sweep times (one buffer-in, buffer-out call each in torch.distributed)"""

_BY_ALIAS = {a: c.name for c in COLLECTIVES.values() for a in (c.name, *c.aliases)}
_BY_KERNEL = {c.kernel: c.name for c in COLLECTIVES.values() if c.kernel}
_KNAME = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)")


def canonical(name: str | None) -> str | None:
    """The table's name for a collective as traces and c10d spell it (``gloo:allreduce``, ``_allgather_base``,
    ``AllReduce``); unknown names come back lower-cased."""
    if not name:
        return None
    n = str(name).split(":")[-1].strip()
    return _BY_ALIAS.get(n, _BY_ALIAS.get(n.lower(), n.lower()))


def from_kernel(kernel_name: str | None) -> str | None:
    """The collective of a NCCL kernel name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``), or None."""
    m = _KNAME.search(kernel_name or "")
    return _BY_KERNEL.get(m.group(1), m.group(1).lower()) if m else None


def bus_factor(name: str, n: int) -> float:
    """nccl-tests' busbw factor of collective ``name`` over ``n`` ranks, as nccl-tests computes it (so 0 for
    all_reduce on one rank: nothing crosses a bus); 1 for unknown ops or an unknown group size."""
    c = COLLECTIVES.get(canonical(name) or "")
    return c.bus_factor(int(n)) if (c is not None and n and int(n) >= 1) else 1.0


def nccl_tests_binary(name: str) -> str | None:
    c = COLLECTIVES.get(name)
    return c.nccl_tests if c else None
