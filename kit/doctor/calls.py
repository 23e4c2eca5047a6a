"""Which host calls do what: the one definition every doctor rule and the step accounting share.

Names as the CUDA runtime and driver APIs spell them in Kineto's ``cuda_runtime`` / ``cuda_driver`` events
(a ``_v2``-style suffix is matched by :func:`base_name`).
"""

from __future__ import annotations

import re

SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                        "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"})
"""host calls that block until the GPU (a device, a stream, an event) is done"""
BLOCKING_COPY_CALLS = frozenset({"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyFromSymbol",
                                 "cudaMemcpyToSymbol", "cuMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD",
                                 "cuMemcpyDtoD"})
"""copy calls that are synchronous for the host whatever the memory (the CUDA runtime's 'synchronous' API); a
``cudaMemcpyAsync`` from or to pageable memory blocks too (the doctor tells those by their copy's name)"""
ALLOC_CALLS = frozenset({"cudaMalloc", "cudaFree", "cudaMallocHost", "cudaHostAlloc", "cudaFreeHost",
                         "cudaMallocAsync", "cudaFreeAsync", "cudaMallocManaged", "cudaHostRegister",
                         "cudaHostUnregister", "cuMemAlloc", "cuMemFree", "cuMemAllocHost", "cuMemFreeHost",
                         "cuMemHostAlloc", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
                         "cuMemAddressReserve", "cuMemAddressFree", "cuMemSetAccess", "cuMemHostRegister",
                         "cuMemHostUnregister"})
"""the caching allocator's device and pinned-memory calls: device memory (``cudaMalloc``/``cudaFree``: a
``cudaFree`` also waits for the whole device), expandable segments (``cuMem*`` map/unmap), pinned host memory
(``cudaHostAlloc``); ``torch.cuda.empty_cache()`` shows as a run of ``cudaFree``"""
STREAM_ORDER_CALLS = frozenset({"cudaEventRecord", "cudaEventRecordWithFlags", "cudaStreamWaitEvent", "cuEventRecord",
                                "cuEventRecordWithFlags", "cuStreamWaitEvent"})
"""host calls that put a command on a stream with no GPU activity of their own in the trace: an event record, a wait
on an event (FSDP's and DDP's ordering of their streams) -- issuing the step's work as a launch does, not waiting
(a query such as ``cudaEventQuery`` polls, and a loop of them is a stall)"""
GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")
"""host calls that replay a CUDA graph (prefixes: ``cudaGraphLaunch_v10000`` etc. included)"""
ALLREDUCE_OP = "c10d::allreduce_"
"""the prefix of the host's c10d call behind each all-reduce (its time includes launching the NCCL kernel)"""
DATALOADER = "enumerate(DataLoader)"
"""the prefix of the annotation PyTorch puts around ``next(iter(loader))``"""
FREE_CALLS = frozenset({"cudaFree", "cuMemFree"})
"""the allocator's calls that wait for the GPU: freeing device memory synchronises the device (the CUDA runtime
API's note on cudaFree: an implicit device synchronisation; ``empty_cache()`` is a run of them); the queue is
drained when they return, like a synchronising call's"""
WORKER_LOADER = "_MultiProcessingDataLoaderIter"
"""in a DataLoader request's annotation: the batch comes from worker processes (``num_workers > 0``)"""
STEP_PREFIX = "ProfilerStep#"
FRAMEWORK_REGIONS = ("Optimizer.step#", "Optimizer.zero_grad#", "FSDP::")
"""prefixes of the annotations PyTorch itself puts around its own code that issues GPU work (the optimizer's step and
zero_grad, FSDP2's hooks): the framework's Python and dispatch before a region's first launch (an FSDP2 optimizer's
DTensor dispatch, a few hundred us) is issuing, not a stall (:func:`kit.doctor.host_model._dispatch`). User code runs
inside them too (the optimizer's step hooks, a custom optimizer), and regions around the user's code are not among
them (DDP's forward runs the user's modules; a user's own ``record_function``): a stall there stays a stall"""

FRAMEWORK_ONLY_REGIONS = ("FSDP::post_backward", "FSDP::root_post_backward_callback")
"""prefixes of FSDP2's post-backward regions (``FSDP::post_backward_accumulate``, ``_reshard``, ``_reduce``,
``_rs_wait``; the engine's final callback), which hold FSDP's own code -- accumulating, resharding and reduce-scattering
the gradients and wrapping each shard in a DTensor -- after their first launch too: the framework's Python between its
recorded ops there is issuing, not a stall (:func:`kit.doctor.host_model._framework_only`), where those ops come less
than a stall's length apart. Not the whole region: FSDP2 calls user code from its reduce (a parameter's
post-accumulate-grad hooks, ``set_all_reduce_hook``; an optimizer in the backward; logging, a sleep), and a stretch
of a stall's length with no recorded event stays a stall; a hook's own recorded ops (CPU tensor work) count as the
region's progress, a limitation. Measured: FINDINGS.md, "A slow traced window" (session 11)"""

AUTOGRAD_NODE = "autograd::engine::evaluate_function: "
"""the prefix of the op autograd's engine records around each node of the backward it evaluates
(``autograd::engine::evaluate_function: MmBackward0``): the node's tensor pre-hooks and pre-hooks, its function (the
op named after the node, ``MmBackward0``, whose work is its own recorded ops: the aten ops and their launches) and its
post-hooks run inside it -- so do the user's backward hooks (``Tensor.register_hook``, ``register_full_backward_hook``,
``register_post_accumulate_grad_hook``, inside the ``torch::autograd::AccumulateGrad`` node's op): a stretch of a
stall's length inside a node and its op that none of their recorded ops covers is the user's code, not the
framework's (:func:`kit.doctor.host_model.autograd_nodes`)"""

_SUFFIX = re.compile(r"(_v\d+|_ptsz|_ptds|_spt)+$")


def base_name(name: str) -> str:
    """A runtime/driver call's name without its version suffix (``cuMemcpyDtoH_v2`` -> ``cuMemcpyDtoH``,
    ``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``)."""
    return _SUFFIX.sub("", str(name))
