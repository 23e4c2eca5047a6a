"""The fixed text of the step-accounting rules (:mod:`kit.doctor.rules.idle`): cause, fix, caveats, notebook --
one table, so the wording of every finding can be read and reviewed in one place."""

from __future__ import annotations

TEXT: dict[str, dict[str, str]] = {
    "input_bound": dict(
        cause=("The host thread that issues the GPU's work was inside next(iter(DataLoader)) while the GPU had "
               "nothing queued: batches are produced more slowly than the GPU consumes them (loading and "
               "transforms in the training process, too few workers, or slow storage)."),
        fix=("Load in worker processes (DataLoader(num_workers=N>0, persistent_workers=True, prefetch_factor=2+)), "
             "pin_memory=True with .to(device, non_blocking=True), move per-sample transforms to the GPU or "
             "precompute them; check that the workers keep up (their own profile, or time next(it) alone)."),
        caveats=("The time counted is the GPU's idle time while the host waited, plus the host's catch-up after "
                 "it; with prefetching workers a short wait can remain at the first step of an epoch."),
        notebook="dataloader_sync"),
    "host_stall": dict(
        cause=("The thread that issues the GPU's work ran for >= 1 ms at a time without any CUDA call while the GPU "
               "had nothing queued: Python or C++ work on the training thread that issues no GPU work -- logging or "
               "metrics, checkpointing, garbage collection (gc.collect over a large heap), time.sleep, a lock."),
        fix=("Find the stretch (the evidence gives the longest, with the CUDA calls around it; profile with "
             "with_stack=True to name the Python), then move that work off the training thread (a background "
             "thread or process), do it every N steps, or for GC: gc.freeze() after start-up and a larger "
             "gc.set_threshold, collecting explicitly between steps only when needed."),
        caveats=("A stretch without CUDA calls can also be CPU-side tensor work in an op the profiler recorded "
                 "without a CUDA call (a CPU tensor op, a data-dependent shape); the evidence names the ops around "
                 "it. Stretches below 1 ms are counted as launch cost, not as stalls."),
    ),
    "allocator_churn": dict(
        cause=("The issuing thread was in the CUDA caching allocator's device calls (cudaMalloc/cudaFree, "
               "expandable segments' cuMemMap/Unmap, pinned-memory allocation) while the GPU had nothing queued: "
               "memory is returned to the driver and requested again every step. cudaFree waits for the whole "
               "device, so it also drains the GPU's queue. torch.cuda.empty_cache() is a run of cudaFree."),
        fix=("Do not call torch.cuda.empty_cache() in the training loop; keep tensor shapes steady (pad to a few "
             "bucket sizes) so cached blocks are reused; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
             "check torch.cuda.memory_stats()['num_alloc_retries'] (allocations that had to free the cache)."),
        caveats="Allocations in the first steps of a job are expected; profile after a few warm-up steps.",
    ),
    "queued_idle": dict(
        cause=("The GPU was idle although the host had already issued its next work: the gaps the GPU itself "
               "takes between kernels (dispatch, a few us each), waits between streams (an event one stream waits "
               "for), or dependencies inside a replayed CUDA graph."),
        fix=("Fewer, larger kernels (torch.compile, fused optimizers, fused attention); look for cross-stream "
             "waits in the timeline; for graph-replayed collectives see graph_mixing_gap."),
        caveats=("With many short kernels a few us of dispatch per kernel adds up; it is the GPU's own cost and "
                 "CUDA graphs remove the host's launch cost, not this gap."),
        notebook="graph_gaps"),
    "unexplained_idle": dict(
        cause=("The GPU was idle and the trace does not say why: the host call that issued the next GPU work is "
               "not in the trace (issued before the recorded window began, or the profiler dropped CPU events), "
               "or no GPU work followed in the step."),
        fix=("Profile with ProfilerActivity.CPU and CUDA together, with a schedule that records whole steps "
             "(wait/warmup before active), and call prof.step() once per step; then run kit doctor again."),
        caveats="Idle at the end of a step that the host ended without issuing more work is counted here.",
    ),
}
