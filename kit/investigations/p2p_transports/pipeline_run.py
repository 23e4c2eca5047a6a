"""Experiment ``pipeline``: the 1F1B pipeline of :mod:`.pipeline` over a transport, driven two ways, and the
parts a model of its iteration time needs.

Drivers (``cfg.pipeline_drivers``):

* ``host`` -- what a PyTorch program does: each process issues its stages' kernels and transfers from Python,
  step by step (one thread taking turns over every stage for an in-process transport: :func:`.pipeline.drive`;
  with ``cfg.pipeline_one_core`` that process's threads run on one CPU core meanwhile, :class:`.pipeline.one_core`).
* ``device`` -- the host out of the way, where the transport allows it (asked by capability): an in-process
  transport gets one thread per stage (:func:`.pipeline.drive_threads`); a transport whose transfers can be
  captured (``caps.graph_capture``, NCCL) runs each stage's whole iteration as one CUDA graph, captured once
  after two eager iterations and replayed (:func:`graph_iteration`). Any other transport -- the IPC mailbox
  hands messages over through shared-memory counters on the host, and one process per stage already drives
  it -- gets a ``skipped`` row that says so.

Rows:

* ``pipeline`` -- per driver, step and stage: wall-clock per iteration from a barrier to every GPU idle, the
  loss and the stage's gradient norm (equal across transports and drivers: they compute the same thing), and
  for an eager driver the host's time in that stage's program during the iteration (``host_us``: from resuming
  it to its next yield, :func:`.pipeline.drive`) and in its forward and backward calls (``host_compute_us``);
* ``pipeline_part`` -- ``part`` ``F`` / ``B``: one micro-batch's forward / backward on a stage alone (CUDA
  events; timed next to the pipeline's steps, :class:`Parts`: ``m`` samples before each timed step of each driver,
  tagged ``driver`` and ``step``, the gradients accumulating as over an iteration's micro-batches; ``host_us`` the
  host's time to issue it; ``hold_us`` the GPU's hold before it, ``hold_short`` whether that hold ended before the
  host finished queueing the part: :func:`_compute_times`; ``host_threads_us``, for an in-process transport with the
  device driver, the host's time to issue it while every stage's thread issues its own:
  :func:`_concurrent_host_times`), ``transfer``: one activation between neighbouring
  stages over the transport (:func:`.harness.timed_rows`), posted as the pipeline posts it (:func:`.pipeline.post_ops`:
  a cross-process transport's op in one ``exchange`` on the comm stream made current, as the pipeline's step does --
  its host time then includes that stream switch; an in-process transport's send and then the receive on the
  receive stream -- not ``exchange``'s fast path, which the pipeline never takes; ``repeats`` samples, before the
  pipeline); the model (:mod:`.pipeline_analysis`) predicts the iteration from them; ``message host`` (in-process
  transports, next to the host-driven steps): the host's time per activation as the pipeline's one thread posts it,
  each after a forward was issued (:func:`_message_host_times`), and ``F after message`` / ``B after message``: the
  host's time in a forward / backward call that comes right after a message into its stage, as every step that
  receives does in the pipeline (the model of the one thread takes them for those steps: :mod:`.pipeline_analysis`);
* ``trace`` -- one profiled iteration per driver (``experiment=pipeline``), for the timeline and the
  host-caused idle time.

Copy-engine transports get communication streams per GPU (:class:`.pipeline.CommStreams`: a send stream, and
for the in-process transport a separate receive stream) so a transfer overlaps the stage's next compute; NCCL
runs on an internal stream of its own.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import nullcontext

from ... import timing, traces
from . import harness as H
from .pipeline import CommStreams, Stage, drive, drive_threads, forward, loss_of, one_core, post_ops, run_in_threads

PART_WARMUP = 20  # forward+backward pairs before the timed ones: ~30 ms of GEMMs, so the GPU's clocks have ramped
# up (after 3 warm-ups on 2xH200 a stage's backward still spread 0.93-1.28 ms, and the model came out 11% high)
HOLD_PROBE_CYCLES = 1 << 20  # the first warm-up's hold, only to calibrate the GPU's cycles per us (hold_cycles)
HOLD_MARGIN = 2.0  # a timed part's hold: this many times the median of its warm-up issue times (hold_cycles)


def hold_cycles(issue_us: list[float], cycles: int, hold_us: float) -> int:
    """GPU clock cycles for ``torch.cuda._sleep`` to hold a part's GPU while the host queues it: ``HOLD_MARGIN``
    times the median of the part's issue times so far (``issue_us``, the warm-up's), at the rate the last hold ran
    (``cycles`` took ``hold_us`` on the GPU, CUDA events: the clock as it is now, not a nominal one). The median,
    not the maximum: one cold or preempted warm-up would set every sample's hold; a sample whose issue outlasts its
    hold anyway is flagged (:func:`hold_short`)."""
    if not issue_us or not hold_us > 0:
        return HOLD_PROBE_CYCLES
    return max(1, round(HOLD_MARGIN * statistics.median(issue_us) * cycles / hold_us))


def hold_short(issue_us: float, hold_us: float) -> bool:
    """Did the hold (its time on the GPU) end before the host finished queueing the part? Then the GPU may have
    waited for a launch, and the part's CUDA events timed that wait as well. The hold is launched before the issue
    begins, so a sample flagged is certainly short; one that issued within a launch's latency of its hold's end may
    be short unflagged."""
    return bool(issue_us > hold_us)


def device_driver(T) -> str | None:
    """How ``T`` is driven device-bound (``threads`` / ``graph``), or None."""
    if T.caps.in_process:
        return "threads"
    if T.caps.graph_capture and T.caps.cuda:
        return "graph"
    return None


def why_no_device_driver(T) -> str:
    return (f"{T.name} has no device-bound driver: its transfers cannot be captured in a CUDA graph "
            "(caps.graph_capture: the hand-over runs on the host) and it is not driven from one process "
            "(caps.in_process: each stage already has its own process and thread); its host-driven run is the only one")


class Pipeline:
    """This process's stages, their devices and communication streams, and one iteration per driver."""

    def __init__(self, cfg, ctx, T, S, dt):
        self.cfg, self.ctx, self.T, self.S = cfg, ctx, T, S
        self.n = ctx.world_size
        mine = (list(range(self.n)) if ctx.rank == 0 else []) if T.caps.in_process else [ctx.rank]
        self.stages = {s: Stage(s, self.n, cfg.pipeline_layers, cfg.pipeline_hidden, cfg.pipeline_batch,
                                cfg.pipeline_micro_batches, T.device(s), dt) for s in mine}
        self.devs = sorted({st.device.index for st in self.stages.values()}) if S.is_cuda else []
        # separate send and receive streams where sends and receives are posted apart (one process: CommStreams)
        self.comm = CommStreams.make(self.devs, separate=T.caps.in_process) if T.caps.copy_engine and self.devs else None
        self.graph = None
        self.host_s: dict = {}  # stage -> the host's seconds in that stage's program in the last eager iteration

    def _host(self) -> list:
        self.host_s = {s: 0.0 for s in self.stages}
        return [0.0] * len(self.stages)

    def _keep(self, host: list) -> None:
        self.host_s = dict(zip(self.stages, host))

    def programs(self):
        for s, st in self.stages.items():
            st.zero_grad()
            yield st.iteration(self.T, s - 1 if s > 0 else None, s + 1 if s < self.n - 1 else None, self.comm)

    def sync(self) -> None:
        import torch

        for d in self.devs:
            torch.cuda.synchronize(d)

    def host(self) -> None:
        h = self._host()
        drive(list(self.programs()), self.T, host=h)
        self._keep(h)
        self.sync()

    def threads(self) -> None:
        h = self._host()
        drive_threads(list(self.programs()), self.T, [st.device for st in self.stages.values()], host=h)
        self._keep(h)
        self.sync()

    def graph_iteration(self) -> None:
        """Replay the captured iteration (captured on first use: two eager iterations on a side stream, as
        PyTorch documents for graphs with autograd, then the capture; NCCL's P2P connections exist by then)."""
        import torch

        if self.graph is None:
            dev = self.ctx.device
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(2):
                    drive(list(self.programs()), self.T)
            torch.cuda.current_stream(dev).wait_stream(side)
            self.sync()
            self.S.barrier()
            g = torch.cuda.CUDAGraph()
            progs = list(self.programs())  # zero_grad outside: the captured backward writes fresh gradients
            with torch.cuda.graph(g):
                drive(progs, self.T)
            self.sync()
            self.graph = g
        self.host_s = {}
        self.graph.replay()
        self.sync()

    def run(self, driver: str):
        return {"host": self.host, "threads": self.threads, "graph": self.graph_iteration}[driver]


def experiment(cfg, ctx, T, S):
    """Rows ``pipeline``, ``pipeline_part``, ``trace`` and ``skipped`` (see the module docstring). The parts a
    model with the host needs are timed next to the pipeline steps (:class:`Parts`: before every timed step, one
    iteration's worth of them), so a host whose speed drifts during the run moves the model and the measurement
    alike."""
    import torch

    n = ctx.world_size
    if T.caps.in_process and torch.cuda.device_count() < n:
        yield dict(kind="skipped", transport=T.name, experiment="pipeline", rank=ctx.rank,
                   reason=f"{n} stages need {n} GPUs in one process")
        return
    dt = H.compute_dtype(cfg, ctx, cuda=S.is_cuda)
    elem = torch.tensor([], dtype=dt).element_size()
    act = cfg.pipeline_batch * cfg.pipeline_hidden * elem
    T.setup([(s, s + 1) for s in range(n - 1)] + [(s + 1, s) for s in range(n - 1)], act)
    P = Pipeline(cfg, ctx, T, S, dt)
    keys = dict(transport=T.name, micro_batches=cfg.pipeline_micro_batches, layers=cfg.pipeline_layers,
                hidden=cfg.pipeline_hidden, batch=cfg.pipeline_batch, dtype=str(dt).replace("torch.", ""),
                world_size=n)
    parts = Parts(cfg, ctx, T, S, P, keys, act)
    yield from parts.transfers()
    for driver in cfg.pipeline_drivers:
        how = "host" if driver == "host" else device_driver(T)
        if how is None:
            yield dict(kind="skipped", transport=T.name, experiment=f"pipeline {driver}", rank=ctx.rank,
                       reason=why_no_device_driver(T))
            continue
        step_fn = P.run(how)
        pin = cfg.pipeline_one_core and how == "host" and T.caps.in_process and bool(P.stages)
        with one_core(None if cfg.pipeline_core < 0 else cfg.pipeline_core) if pin else nullcontext() as core:
            keys_d = dict(keys, core=core) if core is not None else keys
            for step in range(-2, cfg.pipeline_steps):
                if step >= 0:
                    ctx.step(f"{T.name} pipeline {driver} parts {step}", point=False)
                    yield from parts.next_to(driver, how, step, core)
                ctx.step(f"{T.name} pipeline {driver} step {step}", point=False)
                S.barrier()
                t0 = time.perf_counter()
                step_fn()
                t = (time.perf_counter() - t0) * 1e6
                if step < 0:
                    continue
                for s, st in P.stages.items():
                    gn = math.sqrt(sum(float(w.grad.float().pow(2).sum()) for w in st.weights))
                    hs = P.host_s.get(s)
                    yield dict(keys_d, kind="pipeline", driver=driver, how=how, step=step, stage=s, time_us=t,
                               loss=float(st.loss) if s == n - 1 else math.nan, grad_norm=gn,
                               host_us=hs * 1e6 if hs is not None else math.nan,
                               host_compute_us=st.host_compute_s * 1e6 if hs is not None else math.nan)
            if cfg.profile and S.is_cuda:
                ctx.step(f"{T.name} pipeline {driver} profile", point=False)
                path = traces.trace_path(ctx, experiment="pipeline", transport=T.name, driver=driver)
                timing.trace_steps(step_fn, S, 1, path, record_shapes=False)
                if P.stages:
                    yield dict(kind="trace", experiment="pipeline", transport=T.name, driver=driver,
                               path=str(path.relative_to(ctx.run_dir)), rank=ctx.rank)
                else:
                    path.unlink(missing_ok=True)
        P.graph = None
    parts.close()
    P.stages.clear()
    H.free(ctx)


class Parts:
    """The ``pipeline_part`` rows of one transport's pipeline: one activation over each hop alone, timed once
    (:meth:`transfers`); each stage's forward and backward alone (:func:`_compute_times`), and for an in-process
    transport the host's time per message as the pipeline's one thread posts it (:func:`_message_host_times`,
    host driver) or each step's host time with every stage's thread issuing at once (:func:`_concurrent_host_times`,
    the thread-per-stage driver), timed next to the pipeline's steps (:meth:`next_to`: before each timed step of
    each driver, ``m`` samples -- an iteration's worth: the first into fresh gradients, the others accumulating, as
    in the iteration -- tagged with the driver and the step they precede). Timed in one phase before the pipeline,
    the parts met another host than the steps: the host's speed drifted more than 10% between the two within one
    run (FINDINGS.md, P2P on 2 and 4 H100s). The warm-ups (which size the GPU holds) run once, in :meth:`transfers`."""

    def __init__(self, cfg, ctx, T, S, P: Pipeline, keys: dict, act: int):
        self.cfg, self.ctx, self.T, self.S, self.P, self.keys, self.act = cfg, ctx, T, S, P, keys, act
        self.stages = list(P.stages.values())
        self.m = cfg.pipeline_micro_batches
        self.holds: dict = {}
        self.sample = 0  # a running index per transport: samples before different steps and drivers never share one
        self.one = T.caps.in_process and P.comm is not None and bool(P.stages)
        self.cross = not T.caps.in_process and "host" in cfg.pipeline_drivers  # every rank takes part (barriers)

    def transfers(self):
        """Warm the compute parts up (sizing their holds) and the host-time passes; then one activation sent between
        neighbours over ``T`` (:func:`.harness.timed_rows`), posted as the pipeline posts them (:func:`.pipeline.post_ops`)."""
        cfg, ctx, T, S, P = self.cfg, self.ctx, self.T, self.S, self.P
        ctx.step(f"{T.name} pipeline parts warm-up", point=False)
        _compute_times(self.stages, P.n, max(cfg.warmup, PART_WARMUP), 0, S.is_cuda, self.holds)
        if self._threads():
            _concurrent_host_times(self.stages, cfg.warmup, 0, S.is_cuda)
        if self.one:
            _message_host_times(T, P, cfg.warmup, 0, {}, {})
        post = lambda T_, op_list: post_ops(T_, op_list, P.comm)  # noqa: E731 -- as the pipeline posts them
        for s in range(P.n - 1):
            ctx.step(f"{T.name} pipeline parts transfer {s}->{s + 1}", point=False)
            yield from H.timed_rows(cfg, ctx, T, S, [(s, s + 1, self.act)],
                                    dict(self.keys, part="transfer", src=s, dst=s + 1, bytes=self.act),
                                    kind="pipeline_part", post=post)
        if self.cross:  # after the transfers: NCCL connects a pair on its first send and receive, both posted at
            # once (the sides' pass posts them a host barrier apart: as the first P2P of a pair it hung on 2x H200)
            _message_sides_times(T, P, S, cfg.warmup, 0)
        H.free(ctx)

    def _threads(self) -> bool:
        return device_driver(self.T) == "threads" and len(self.stages) > 1 and "device" in self.cfg.pipeline_drivers

    def next_to(self, driver: str, how: str, step: int, core: int | None = None):
        """``m`` samples of each stage's forward and backward (and of the host times ``how`` is modelled with),
        rows tagged ``driver`` and ``step`` (and ``core``: the one CPU core the driver's threads ran on)."""
        cuda, m, k0 = self.S.is_cuda, self.m, self.sample
        # the gradients the pipeline left are given back after: a CUDA graph's replay writes the gradients it
        # captured, which the parts (fresh gradients once per m samples, dropped at the end) would leave unread
        kept = [(w, w.grad) for st in self.stages for w in st.weights]
        times = _compute_times(self.stages, self.P.n, 0, m, cuda, self.holds)
        if how == "threads" and self._threads():
            for s, samples in _concurrent_host_times(self.stages, 0, m, cuda).items():
                for us, more in zip(times[s], samples):
                    us.update(more)
        tag = dict(self.keys, kind="pipeline_part", driver=driver, step=step, **({} if core is None else {"core": core}))
        for s, samples in times.items():
            for i, us in enumerate(samples):
                yield from (dict(tag, part=part, stage=s, sample=k0 + i, time_us=us[part], host_us=us[f"{part} host"],
                                 hold_us=us.get(f"{part} hold", math.nan), hold_short=us.get(f"{part} hold short", math.nan),
                                 host_threads_us=us.get(f"{part} host threads", math.nan)) for part in ("F", "B"))
        if how == "host" and self.one:
            after: dict = {"F": {}, "B": {}}
            for (a, b), samples in _message_host_times(self.T, self.P, 0, m, after["F"], after["B"]).items():
                yield from (dict(tag, part="message host", src=a, dst=b, bytes=self.act, sample=k0 + i,
                                 time_us=math.nan, host_us=us) for i, us in enumerate(samples))
            for part, by_stage in after.items():
                for s, samples in by_stage.items():
                    yield from (dict(tag, part=f"{part} after message", stage=s, sample=k0 + i, time_us=math.nan,
                                     host_us=us) for i, us in enumerate(samples))
        if how == "host" and self.cross:
            for (a, b), samples in _message_sides_times(self.T, self.P, self.S, 0, m).items():
                yield from (dict(tag, part="message host", src=a, dst=b, bytes=self.act, sample=k0 + i, side=side,
                                 time_us=math.nan, host_us=us) for i, (side, us) in enumerate(samples))
        for w, g in kept:
            w.grad = g
        self.sample += m

    def close(self) -> None:
        for st in self.stages:
            st.zero_grad()


def _compute_times(stages: list, n: int, warmup: int, repeats: int, cuda: bool,
                   holds: dict | None = None) -> dict[int, list[dict]]:
    """Per stage, per sample {"F": us, "B": us, "F host": us, "B host": us} (and on a GPU "F hold" / "B hold":
    the hold's time on the GPU, "F hold short" / "B hold short": :func:`hold_short`): one forward and one backward of a
    micro-batch on the stage alone, on the device (CUDA events) and the host's time to issue each (the call's wall
    time: what a host-driven pipeline spends per step before its GPU can start the next one; the events' records
    outside it -- the pipeline makes no such calls). Before each part the
    GPU spins (``torch.cuda._sleep``, :func:`hold_cycles` of the part's warm-up issue times, fixed after the
    warm-up) while the host queues the part, so its events time the
    kernels back to back: the part's device time without waits for its launches (where the host issues a part
    about as fast as the GPU runs it, the events would otherwise also time the host -- which the model with the
    host counts on its own, and a device-bound driver never pays). The stages of one
    process are issued as its one driving thread issues them, taking turns (:func:`.pipeline.drive`): every
    stage's forward in stage order, then every backward in reverse order, each on its own input (no stage waits
    for another), synchronised once per sample. The weights' gradients accumulate over ``m`` samples (fresh once per
    ``m``, as once per iteration of ``m`` micro-batches): in the pipeline every backward of an iteration but the first
    adds into the existing gradients -- an in-place add per weight on the GPU, and its launch on the host -- which a
    backward into fresh gradients (taken over, no kernel) does not pay. A thread that takes turns over several GPUs' autograd graphs
    issues each step slower than one stage's steps back to back (FINDINGS.md, P2P on 4 H100s), and its time per
    step in that setting is what the model with the host needs. ``holds``: {(stage, part): cycles}, sized by this
    call's warm-up and kept for the caller's next call (:class:`Parts`: one warm-up, then samples without)."""
    import torch

    prep = {}
    for st in stages:
        x0 = st.inputs[0] if st.inputs is not None else torch.randn(st.batch, st.hidden, device=st.device, dtype=st.dtype)
        prep[st.stage] = (x0, torch.randn(st.batch, st.hidden, device=st.device, dtype=st.dtype))
    out = {st.stage: [] for st in stages}
    holds = {} if holds is None else holds  # kept by the caller: a later call without warm-up keeps its holds
    for st in stages:
        for p in "FB":
            holds.setdefault((st.stage, p), HOLD_PROBE_CYCLES)
    issued = {k: [] for k in holds}
    clock = time.perf_counter
    m = stages[0].m if stages else 1  # a rank of an in-process transport other than 0 drives no stage
    for i in range(-warmup, repeats):
        timers, ys, us = {}, {}, {}
        if (i + warmup) % m == 0:  # fresh gradients once per m samples, as once per iteration of m micro-batches
            for st in stages:
                st.zero_grad()
        for st in stages:
            s = st.stage
            with torch.cuda.device(st.device) if cuda else nullcontext():
                x = prep[s][0].detach().requires_grad_(s > 0)
                timers[s] = timing.PhaseTimer(cuda)
                if cuda:
                    with timers[s].phase("F hold"):
                        torch.cuda._sleep(holds[(s, "F")])
                with timers[s].phase("F"):  # its events recorded outside the host's window (not the pipeline's calls)
                    h0 = clock()
                    y = _run_part("F", st, x, None)
                    us[s] = {"F host": (clock() - h0) * 1e6}
                ys[s] = y
        for st in reversed(stages):
            s, last = st.stage, st.stage == n - 1
            with torch.cuda.device(st.device) if cuda else nullcontext():
                if cuda:
                    with timers[s].phase("B hold"):
                        torch.cuda._sleep(holds[(s, "B")])
                with timers[s].phase("B"):
                    h0 = clock()
                    _run_part("B", st, ys[s], None if last else prep[s][1])
                    us[s]["B host"] = (clock() - h0) * 1e6
        for st in stages:
            s = st.stage
            us[s].update(timers[s].read())
            for p in "FB" if cuda else "":
                us[s][f"{p} hold short"] = hold_short(us[s][f"{p} host"], us[s][f"{p} hold"])
                if i < 0:  # the warm-up sizes the hold; the timed samples keep the last one
                    issued[(s, p)].append(us[s][f"{p} host"])
                    holds[(s, p)] = hold_cycles(issued[(s, p)], holds[(s, p)], us[s][f"{p} hold"])
            if i >= 0:
                out[s].append(us[s])
    for st in stages:
        st.zero_grad()
    return out


def _run_part(part: str, st, x, grad):
    """Issue one micro-batch's forward (``part`` "F": returns its output, the loss on the last stage) or backward
    ("B" of output ``x`` with ``grad``) of stage ``st``, as the pipeline's step does."""
    if part == "F":
        y = forward(st.weights, x)
        return loss_of(y, st.m) if st.stage == st.n - 1 else y
    x.backward(grad)
    return None


def _concurrent_host_times(stages: list, warmup: int, repeats: int, cuda: bool) -> dict[int, list[dict]]:
    """Per stage, per sample {"F host threads": us, "B host threads": us}: the host's time to issue one forward /
    backward when every stage's thread issues its own at once (a thread per stage, released together by a barrier:
    every forward, then every backward), as the thread-per-stage driver (:func:`.pipeline.drive_threads`) issues
    them in its steady state. The threads share one interpreter lock, so a step's issue takes longer than alone by
    the Python the other threads run meanwhile; the model of that driver takes these times (:mod:`.pipeline_analysis`).
    No events or holds: only the host is timed."""
    import threading

    import torch

    prep = {}
    for st in stages:
        x0 = st.inputs[0] if st.inputs is not None else torch.randn(st.batch, st.hidden, device=st.device, dtype=st.dtype)
        prep[st.stage] = (x0, torch.randn(st.batch, st.hidden, device=st.device, dtype=st.dtype))
    out = {st.stage: [] for st in stages}
    clock = time.perf_counter

    def together(fn):  # every stage's thread released at once by a gate (a failing thread aborts it)
        gate = threading.Barrier(len(stages))

        def timed(st):
            with torch.cuda.device(st.device) if cuda else nullcontext():
                gate.wait()
                h0 = clock()
                r = fn(st)
                return (clock() - h0) * 1e6, r

        got = run_in_threads([lambda st=st: timed(st) for st in stages], [None] * len(stages), on_error=gate.abort)
        return {st.stage: g for st, g in zip(stages, got)}

    m = stages[0].m if stages else 1
    for i in range(-warmup, repeats):
        if (i + warmup) % m == 0:  # gradients accumulate over m samples, as over an iteration's micro-batches
            for st in stages:
                st.zero_grad()
        fw = together(lambda st: _run_part("F", st, prep[st.stage][0].detach().requires_grad_(st.stage > 0), None))
        bw = together(lambda st: _run_part("B", st, fw[st.stage][1], None if st.stage == st.n - 1 else prep[st.stage][1]))
        for st in stages:
            if cuda:
                torch.cuda.synchronize(st.device)
            if i >= 0:
                out[st.stage].append({"F host threads": fw[st.stage][0], "B host threads": bw[st.stage][0]})
    for st in stages:
        st.zero_grad()
    return out


def _message_host_times(T, P: Pipeline, warmup: int, repeats: int, forwards: dict | None = None,
                        backwards: dict | None = None) -> dict[tuple[int, int], list[float]]:
    """{(src, dst): host us per sample}: an in-process transport's whole host path for one activation as the
    pipeline's thread posts it -- the receive buffer allocated on the receive stream, send and receive posted
    (:func:`.pipeline.post_ops`), both waited for, the buffer kept to the sample's end (as the pipeline keeps it to
    its iteration's end: :meth:`.pipeline.Stage._release`) -- each
    right after the sending stage's forward was issued, over every hop in turn (as in the pipeline, where a message
    follows a compute step and the thread takes turns over the stages), synchronised once per sample. The
    transfer part's ``host_us`` times the same path back to back with nothing in between, which costs the host
    less than in the pipeline (FINDINGS.md, P2P on 4 H100s). ``forwards``: filled with {stage: [host us per sample]}
    of each stage's forward call that comes right after the previous hop's message (stages 1 and on, the last one's
    on the activation it received, with its loss as its step and its F part issue it: the host's time to issue a
    compute call after a message path, beside the parts' own, alone). ``backwards``: then, hop by
    hop from the last, a gradient sent back as the pipeline sends it and the receiving stage's backward (of its
    forward above) issued right after, its host time filled in as ``forwards`` (stages up to the last but one: in
    the pipeline every forward of a later stage and every backward of an earlier one comes right after a receive)."""
    import torch

    st = P.stages
    hops = [(s, s + 1) for s in range(P.n - 1)]
    xs = {s: torch.randn(st[s].batch, st[s].hidden, device=st[s].device, dtype=st[s].dtype) for s, _ in hops}
    gs = {b: torch.randn(st[b].batch, st[b].hidden, device=st[b].device, dtype=st[b].dtype) for _, b in hops}
    out = {h: [] for h in hops}
    clock = time.perf_counter
    for i in range(-warmup, repeats):
        kept, ys = [], {}
        for a, b in hops:
            with torch.cuda.device(st[a].device):
                x = xs[a].detach().requires_grad_(a > 0)  # as the pipeline's (and the F part's) input
                h0 = clock()
                y = forward(st[a].weights, x)
                if forwards is not None and a > 0 and i >= 0:
                    forwards.setdefault(a, []).append((clock() - h0) * 1e6)
                if backwards is not None:
                    ys[a] = y
                y = y.detach()
            h0 = clock()
            buf = st[b]._buffer(P.comm)
            ws = post_ops(T, [("send", y, b), ("recv", buf, a)], P.comm)
            ws[1].wait()
            kept.append(buf)
            ws[0].wait()
            if i >= 0:
                out[(a, b)].append((clock() - h0) * 1e6)
        if forwards is not None and hops:  # the last stage's forward and loss (as its step issues them: the
            last = hops[-1][1]  # F part's call), on the activation it just received
            with torch.cuda.device(st[last].device):
                x = kept[-1].detach().requires_grad_(True)
                h0 = clock()
                _run_part("F", st[last], x, None)
                if i >= 0:
                    forwards.setdefault(last, []).append((clock() - h0) * 1e6)
        for a, b in reversed(hops) if backwards is not None else ():
            buf = st[a]._buffer(P.comm)
            ws = post_ops(T, [("send", gs[b], a), ("recv", buf, b)], P.comm)
            ws[1].wait()
            kept.append(buf)
            ws[0].wait()
            with torch.cuda.device(st[a].device):
                h0 = clock()
                ys.pop(a).backward(buf)
                if i >= 0:
                    backwards.setdefault(a, []).append((clock() - h0) * 1e6)
        P.sync()
        kept.clear()  # every use of the buffers is done
    for s in st.values():
        s.zero_grad()
    return out


def _message_sides_times(T, P: Pipeline, S, warmup: int, repeats: int) -> dict[tuple[int, int], list[tuple[str, float]]]:
    """{(src, dst): [(side, host us) per sample]}: a cross-process transport's host path for one activation, this
    rank's side of it, as the pipeline's step posts it: over every hop in turn the sending rank issues its stage's
    forward and posts the send (:func:`.pipeline.post_ops`: one ``exchange`` on the comm stream), the processes meet
    on the host (:meth:`.harness.Sync.host_barrier`: the receive's wait then holds no wait for the sender's post), the
    receiving rank issues a forward of its own (in the pipeline a receive follows a compute step) and then allocates
    the buffer, posts the receive and waits for it, keeping the buffer to the sample's end (as the pipeline keeps it
    to its iteration's end: :meth:`.pipeline.Stage._release`); the sender then waits
    for its send (a rendezvous transport issues its copy there), synchronised once per sample. The transfer part's
    ``host_us`` times a message back to back with nothing in between, which costs the host less than in the
    pipeline's steps (FINDINGS.md, P2P on 2 H200s)."""
    import torch

    me = P.stages  # this rank's stage
    hops = [(s, s + 1) for s in range(P.n - 1)]
    xs = {s: torch.randn(st.batch, st.hidden, device=st.device, dtype=st.dtype) for s, st in me.items()}
    out = {h: [] for h in hops}
    clock = time.perf_counter

    def fwd(s):
        with torch.cuda.device(me[s].device) if me[s].device.type == "cuda" else nullcontext():
            return forward(me[s].weights, xs[s]).detach()

    for i in range(-warmup, repeats):
        kept = []
        for a, b in hops:
            ws = []
            if a in me:
                y = fwd(a)
                h0 = clock()
                ws = post_ops(T, [("send", y, b)], P.comm)
                if i >= 0:
                    out[(a, b)].append(("send", (clock() - h0) * 1e6))
            S.host_barrier()
            if b in me:
                fwd(b)
                h0 = clock()
                buf = me[b]._buffer(P.comm)
                post_ops(T, [("recv", buf, a)], P.comm)[0].wait()
                kept.append(buf)
                if i >= 0:
                    out[(a, b)].append(("recv", (clock() - h0) * 1e6))
            for w in ws:
                w.wait()
        S.sync()
        kept.clear()  # every use of the buffers is done
    for st in me.values():
        st.zero_grad()
    return out
