"""The fixed text of every doctor rule: cause, fix, caveats, notebook -- one table, so the wording of every finding
can be read and reviewed in one place. The step accounting's rules (:mod:`kit.doctor.rules.idle`), the
communication rules across ranks (per_param_allreduce ... low_busbw, on :mod:`kit.doctor.rules.comm`), the host
rules of one rank (graph_mixing_gap ... host_sync, on :mod:`kit.doctor.rules.host`), and late_rank's fix by what the
late rank was doing (:data:`FIX_BY_REASON`)."""

from __future__ import annotations

NCCL_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs"

TEXT: dict[str, dict[str, str]] = {
    "input_bound": dict(
        cause=("The host thread that issues the GPU's work was inside next(iter(DataLoader)) while the GPU had "
               "nothing queued: batches are produced more slowly than the GPU consumes them (loading and "
               "transforms in the training process, too few workers, or slow storage)."),
        fix=("Load in worker processes (DataLoader(num_workers=N>0, persistent_workers=True, prefetch_factor=2+)), "
             "pin_memory=True with .to(device, non_blocking=True), move per-sample transforms to the GPU or "
             "precompute them; check that the workers keep up (their own profile, or time next(it) alone). When "
             "the summary names pin_memory: pinning a large batch is a copy over every intra-op thread, which "
             "straggles when they are as many as the cores -- workers (their pin-memory thread does it) or fewer "
             "threads (torch.set_num_threads)."),
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
    # ---- communication across ranks (kit.doctor.rules.comm and the rule modules on it)
    "per_param_allreduce": dict(
        cause="Gradients are all-reduced one tensor at a time: every call pays the collective's fixed latency "
              "(launch, NCCL's protocol handshake, a few us even for 4 bytes) and its host overhead, so dozens of "
              "small tensors cost far more than the same bytes in a few large buffers.",
        fix="Let DistributedDataParallel bucket the gradients (bucket_cap_mb, default 25 MB; its buckets also "
            "overlap with backward), or flatten them yourself (torch._utils._flatten_dense_tensors, or "
            "torch.distributed's all_reduce_coalesced) into a few all-reduces of >= 25 MB.",
        caveats="The saving is estimated from the trace's own bandwidth at large sizes (or the sweep's): it counts "
                "the kernels' time, not the host time of issuing each call, nor the overlap with backward that DDP "
                "adds on top. Bucketing holds gradients until a bucket is full, and changes the reduction order "
                "(bitwise results may differ). Small all-reduces of activations (tensor parallelism: each waits "
                "for the layer before it) cannot be bucketed; the rule cannot tell them from gradients.",
        notebook="dataloader_sync"),
    "exposed_comm": dict(
        cause="Collective kernels run while no compute kernel runs beside them: the step waits for the network. In "
              "data parallelism this is the gradient sync that starts after backward (or one large final bucket); "
              "in tensor/sequence parallelism, collectives that the next layer depends on.",
        fix="Overlap communication with compute: DDP's bucketed all-reduce during backward (a smaller bucket_cap_mb "
            "starts the first buckets earlier), FSDP's backward_prefetch/forward_prefetch, async tensor parallelism "
            "(torch.compile's micro-pipelining, symmetric memory); otherwise send fewer bytes (bf16 gradients, a "
            "compression comm hook) or use a faster interconnect.",
        caveats="Counts the transfer part of each kernel (its duration on the rank that arrived last) on the rank "
                "that arrived last at each collective (the critical path); waiting for a late peer is late_rank's. "
                "Kernels of several process groups running at once are each counted. Overlapped communication is "
                "not free either: it competes with compute for SMs and memory bandwidth (comm_compute_contention).",
        notebook="collective_tracing"),
    "late_rank": dict(
        cause="A collective finishes only when its last rank arrives: every other rank's kernel spins, holding its "
              "GPU, until then. One slow rank sets the pace of the whole job.",
        fix="Then re-profile: the late rank should change or disappear.",
        caveats="'Arrived last' is read off kernel durations (the rank whose kernel is shortest waited for no one), "
                "so no clock alignment is needed. The reason compares how each rank got from the last collective at "
                "which all ranks arrived together to this one (host activity until the launch, then the GPU still "
                "busy), so a lag created once is blamed on what created it. The cost is the other ranks' waiting "
                "that no compute hid, at the collectives this rank was last at; fixing the rank may move some of it "
                "elsewhere. Arriving less than 1% of a step late is jitter, not counted; no finding when ranks take "
                "turns arriving last. Telling an idle host from a "
                "busy one needs CUDA runtime events (a CPU-only trace has none).",
        notebook="collective_tracing"),
    "comm_compute_contention": dict(
        cause="NCCL moves data with kernels on the GPU's SMs: beside large compute kernels (GEMMs that fill every "
              "SM) they get fewer SMs and less memory bandwidth, so the same transfer takes longer -- and the "
              "compute beside it slows down too.",
        fix="Give NCCL fewer, dedicated resources or move bytes without SMs: NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS "
            "to bound its SMs, copy-engine transfers for point-to-point (CUDA IPC / peer copies between GPUs of one "
            "node), or schedule the large transfers beside lighter kernels.",
        caveats="Compares transfer-only kernels (the last-arriving rank's, so waiting does not pass for slowness) of "
                "the same collective and size; point-to-point kernels are not matched across ranks, so a receive "
                "may include waiting for its sender. A stretched transfer that stays hidden behind compute costs no "
                "step time by itself; the compute it slows is not counted here.",
        notebook="p2p_transports"),
    "low_busbw": dict(
        cause="The job's collectives reach a fraction of the bandwidth the same machine reaches at the same size: "
              "NCCL is configured differently in the job (an NCCL_* variable forcing a protocol, algorithm or fewer "
              "channels), the traffic takes another path (a process group across nodes, P2P disabled, wrong NIC), "
              "or the kernels share the GPU with compute.",
        fix="Compare the job's NCCL environment with the sweep's (NCCL_DEBUG=INFO prints the chosen algorithm, "
            "protocol, channels and transport per communicator); unset NCCL_ALGO/NCCL_PROTO/NCCL_MAX_NCHANNELS "
            "overrides; check NCCL_P2P_DISABLE, NCCL_IB_HCA/NCCL_SOCKET_IFNAME; run the sweep with the job's "
            "environment to confirm.",
        caveats="Traced durations are the per-instance minimum over ranks (the transfer, not the waiting) when 2+ "
                "ranks are given; with one rank they include waiting and understate busbw. The sweep must come "
                "from the same machine and group size; sizes outside the sweep's range are not judged.",
        notebook="collectives"),
    # ---- one rank's host and GPU timeline (kit.doctor.rules.host and the rule modules on it)
    "graph_mixing_gap": dict(
        cause=("NCCL's graph-mixing support (on by default) makes every captured NCCL call bring event record/wait "
               "nodes into the graph that serialise it against NCCL's internal stream; in the replayed graph they "
               "are extra dependencies in front of each NCCL kernel, and the GPU idles before it."),
        fix=("Set NCCL_GRAPH_MIXING_SUPPORT=0 (NCCL >= 2.13) in the environment of every rank before the "
             "communicator is created -- only where the condition in the caveats holds."),
        caveats=("Only safe when no communicator ever has (1) CUDA-graph launches outstanding in parallel (graphs "
                 "replayed on different streams with nothing ordering them) or (2) a graph launch outstanding while "
                 "a non-captured NCCL call is issued on it: stream ordering is not sufficient, the replay must have "
                 "completed (the host synchronised) before an eager collective -- e.g. every collective of that "
                 "communicator inside the graph, or a synchronize between a replay and eager NCCL calls. With it on, "
                 "NCCL notes its mechanism has been seen to deadlock CUDA when graphs of several communicators are "
                 f"cudaGraphLaunch()ed from one thread. Sources: {NCCL_DOCS}/env.html#nccl-graph-mixing-support, "
                 f"{NCCL_DOCS}/usage/cudagraph.html"),
        notebook="graph_gaps"),
    "pageable_h2d": dict(
        cause=("A copy from pageable (not page-locked) host memory is staged by CUDA through a pinned bounce buffer: "
               "the call returns only when the data is staged, so the host is blocked for the copy whatever "
               "non_blocking says, cannot queue further work, and the copy runs below the link's bandwidth."),
        fix=("Pin the source: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, non_blocking=True); "
             "better, copy the next batch on a side stream while this step computes (dataloader_sync's 'prefetch')."),
        caveats=("Pinned memory is page-locked host RAM taken from the OS: pin batches, not whole datasets. "
                 "non_blocking=True on a pageable tensor changes nothing. The copy's GPU time, when it runs on "
                 "the compute stream, is also h2d_on_compute_stream's: one stretch of time seen from the host and "
                 "the GPU."),
        notebook="dataloader_sync"),
    "h2d_on_compute_stream": dict(
        cause=("The batch is copied to the GPU on the stream that runs the step's kernels; a stream executes in "
               "order, so the compute waits for each copy although the copy engine could run it beside the kernels."),
        fix=("Copy the next batch on a side stream (torch.cuda.Stream) from pinned memory with non_blocking=True while "
             "this step computes; make the compute stream wait for it (current_stream().wait_stream(side)) and call "
             "batch.record_stream(current_stream()) -- or use a prefetching loader."),
        caveats=("Only a copy from pinned memory overlaps anything: a pageable copy blocks the host as well "
                 "(pageable_h2d, fix that first; one stretch of time may appear in both findings). Without "
                 "record_stream the caching allocator may reuse the batch's memory while the compute stream "
                 "reads it."),
        notebook="dataloader_sync"),
    "launch_bound": dict(
        cause=("The kernels are shorter than the time the host needs to issue each one (Python, the dispatcher, the "
               "launch call): the GPU finishes a kernel before the next is submitted and idles in between."),
        fix=("Give the GPU more work per launch: capture the step in a CUDA graph (torch.cuda.graphs, "
             "torch.compile(mode='reduce-overhead')), fuse kernels (torch.compile, fused/foreach optimizers), or "
             "grow the batch."),
        caveats=("CUDA graphs need static shapes and addresses; with NCCL inside the graph, see graph_mixing_gap. The "
                 "graph_gaps notebook's launch-overhead section measures what graphs give on this machine."),
        notebook="graph_gaps"),
    "host_sync": dict(
        cause=("A call that blocks the host until the GPU is done (stream/device/event synchronize; a copy to host "
               "memory such as .item(), .cpu(), .tolist() or printing a CUDA tensor) empties the GPU's queue: when it "
               "returns nothing is queued, the GPU idles while the host issues the next work, then runs each "
               "kernel as soon as it is launched until the host is ahead again."),
        fix=("Take the synchronising call out of the step or make it rare: keep losses and metrics on the GPU and read "
             "them every N steps; avoid .item()/.cpu()/print of CUDA tensors and data-dependent shapes (nonzero, "
             "boolean masks) inside the step; torch.cuda.set_sync_debug_mode('warn') names each call in the code."),
        caveats=("Some synchronisation is needed (a value the host branches on, an early stop): move it out of the hot "
                 "loop rather than remove it. The host time blocked in the call is mostly the GPU's own queued work "
                 "and is not the cost; the idle GPU after it is, until the host has rebuilt its lead."),
        notebook="dataloader_sync"),
}
"""every rule's fixed cause, fix, caveats and notebook (a finding repeats them; it may refine the fix)"""

FIX_BY_REASON = {
    "data_wait": ("That rank's input pipeline is the bottleneck: more DataLoader workers, pin_memory=True with "
                  "prefetching (prefetch_factor), faster storage or pre-processed shards on that node."),
    "host_sync": ("Remove the synchronising calls from the step on that rank (.item(), .cpu(), printing or "
                  "logging tensors, torch.cuda.synchronize()); log asynchronously every N steps."),
    "host_idle": ("Find what that rank's host does between steps without launching work (sleep, checkpointing, "
                  "logging, garbage collection, another process on its cores): py-spy dump on that rank."),
    "host_busy": ("That rank's host issues the same work more slowly: check its CPU binding and NUMA node "
                  "(one core per rank near its GPU), CPU frequency and other load on the host; CUDA graphs "
                  "take the per-kernel launch cost off the host."),
    "gpu_busy": ("That rank does more GPU work per step: balance the work (sequence lengths, experts, "
                 "pipeline stages) or check that GPU for throttling (nvidia-smi -q -d PERFORMANCE)."),
    "gpu_slow": ("That rank's GPU runs the same kernels more slowly: check its clocks and throttle reasons "
                 "(nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE,POWER) while the job runs; a GPU held at lower "
                 "clocks by power or temperature limits slows every rank of a synchronous job to its pace."),
}
"""late_rank's fix, by what the late rank was doing (:data:`kit.doctor.rules.late_arrival.REASONS`)"""
