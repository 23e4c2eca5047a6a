"""``allocator_churn``: the GPU waits while the host is in the caching allocator's device calls (the accounting's
``allocator`` slice)."""

from __future__ import annotations

from ..accounting import Account, slice_extract
from ..findings import slice_judge
from ..model import Explains, Rule, rule


def sentence(a: Account, c: float, sh: float, who: str) -> str:
    return (f"the GPU sat idle {c / 1e3:.2f} ms per step ({100 * sh:.1f}%) while the host was in the caching "
            f"allocator's device calls on {who}" + (f": {a.calls_text('allocator')}" if a.calls.get("allocator")
                                                    else ""))


rule(Rule(
    id="allocator_churn", title="the GPU waits for the caching allocator's device calls", order=130,
    extract=slice_extract("allocator_churn"), judge=slice_judge("allocator_churn"),
    explains=Explains(("allocator",), sentence, lambda a: {"allocator_calls": a.calls.get("allocator", {})}),
    cause=("The issuing thread was in the CUDA caching allocator's device calls (cudaMalloc/cudaFree, "
           "expandable segments' cuMemMap/Unmap, pinned-memory allocation) while the GPU had nothing queued: "
           "memory is returned to the driver and requested again every step. cudaFree waits for the whole "
           "device, so it also drains the GPU's queue. torch.cuda.empty_cache() is a run of cudaFree."),
    fix=("Do not call torch.cuda.empty_cache() in the training loop; keep tensor shapes steady (pad to a few "
         "bucket sizes) so cached blocks are reused; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
         "check torch.cuda.memory_stats()['num_alloc_retries'] (allocations that had to free the cache)."),
    caveats="Allocations in the first steps of a job are expected; profile after a few warm-up steps."))
