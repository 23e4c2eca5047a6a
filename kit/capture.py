"""Traces of *your* training loop that ``kit doctor`` can read: ``torch.profiler`` with the settings it needs.

Add two lines to a training loop (torchrun, SLURM or one process; NCCL, gloo or no process group)::

    from kit import capture

    with capture.profile("traces/run1") as prof:      # every rank the same call
        for batch in loader:
            train_step(batch)
            prof.step()                                # once per training step
            if prof.done:                              # optional: the window is written
                break

then ``kit doctor traces/run1/trace_rank*.json.gz``. An existing loop can also be handed over whole:
``capture.profile_steps(train_step, steps=12, out_dir="traces/run1")``.

**What each rank writes** into ``out_dir`` (one directory for the whole job; created if missing):

* ``trace_rank<r>.json.gz`` -- the gzipped Chrome trace of the recorded steps (with ``repeat > 1`` one per cycle,
  ``trace_cycle=<k>_rank<r>.json.gz``; with ``tags`` the kit's name scheme,
  ``trace_<key>=<value>..._rank<r>.json.gz``: :func:`kit.traces.trace_path`). Every name is one that
  :func:`kit.traces.find_traces` / :func:`kit.traces.parse_name` read back with its rank.
* ``capture_rank<r>.json`` -- the sidecar: what the doctor needs that a trace lacks (see :func:`describe`):
  rank, world size, local rank, host, device name, torch / CUDA / NCCL versions, the environment variables that
  change communication (``NCCL_*``, ``TORCH_NCCL_*``, ``TORCH_FR_*``, ``CUDA_DEVICE_MAX_CONNECTIONS``,
  ``CUDA_LAUNCH_BLOCKING``, ...), the schedule, and the files written. The same facts (without the file list)
  are also put into each trace's header under ``"kitCapture"``, so a trace that travels alone keeps them;
  :func:`capture_info` reads either.
* ``fr_rank<r>.json`` -- with ``flight_recorder=True``: this rank's Flight Recorder buffer
  (:func:`kit.traces.dump_flight_recorder`), written when the block ends, also when it ends with an exception
  (a hang's timeout) -- that is when it is most useful.

**The settings, and why each is what it is**

* ``activities``: CPU always -- the host's side (runtime calls such as ``cudaLaunchKernel``,
  ``cudaStreamSynchronize``, ``cudaMemcpyAsync``; ``aten::`` ops; ``enumerate(DataLoader)``; c10d ops) is
  what ``host_sync``, ``launch_bound``, ``pageable_h2d`` and ``late_rank`` read; CUDA when a GPU is there
  (``cuda=None`` decides) -- kernels, memcpys and NCCL kernels with their collective metadata (bytes, dtype,
  group; PyTorch >= 2.3; none on kernels replayed from a CUDA graph).
* ``schedule(skip_first, wait, warmup, active, repeat)``: only a few steady-state steps are recorded.
  ``skip_first`` steps are passed once (NCCL communicators, cuBLAS/cuDNN autotuning, DDP's bucket rebuild after
  its first step, allocator growth, ``torch.compile``: none of them is the job's steady state); then per cycle
  ``wait`` idle steps, ``warmup`` steps during which the profiler runs and discards (CUPTI's start-up -- seen as
  a 290 ms "kernel" on 2xH200 -- stays out of the window) and ``active`` recorded steps. Three active steps
  tell a steady pattern from a one-off and keep the trace small (0.5-0.6 MB gzipped per rank for
  ``examples/train_ddp.py``'s 93 M-parameter GPT on 2xH200); the doctor reports costs per step. ``repeat`` cycles (0 = until the loop ends) give one file per cycle.
* ``unprofiled=5``: that many steps, after ``skip_first`` and before the schedule's ``wait``, are timed without the
  profiler (CUDA events recorded at each :meth:`Capture.step` on the current stream, read once the first recorded
  step begins; ``time.perf_counter`` without a GPU) and written into the trace header as
  ``kitCapture.unprofiled_step_us`` (every sample, microseconds): the doctor compares the traced steps with them
  and states costs net of the profiler's own overhead. ``unprofiled=0`` times nothing.
* ``unprofiled_host`` (default: as many as ``unprofiled``): that many more steps, right after those, time each rank's *host* without the profiler:
  ``kitCapture.unprofiled_host_us``, per step the host clock (``time.perf_counter``) from the return of the
  :meth:`Capture.step` call that began the step to the :meth:`Capture.step` call that ends it, the GPU drained by
  kit.capture's ``torch.cuda.synchronize()`` inside the call that began it (outside the clock), so no launch waits
  for a full queue. It holds what the host does to issue one step: Python, the framework's dispatch, the launch
  calls, the DataLoader's ``next()`` where the loop calls it between two :meth:`Capture.step` calls, and any wait
  the step itself makes for the GPU or a peer (``.item()``, ``.cpu()``, a synchronize, a blocking copy, a
  collective's ``wait()`` under ``TORCH_NCCL_BLOCKING_WAIT``); not the GPU's work after the step's last launch, nor
  the collectives' transfers (NCCL runs them asynchronously to the host). The doctor's host model counts a traced
  step's own host time the same way less the waits for the GPU and peers (``own_host_us``: issuing, DataLoader
  waits, stalls, the allocator): for a step that makes no such wait the two measure the same thing, else this one
  is the larger. ``late_rank`` reads it for what the other ranks' hosts leave of their step, per rank (a measured
  step overhead is the job's; each host's own is not). The drain makes these steps no pipelined steady state:
  they are not in ``unprofiled_step_us``. ``unprofiled_host=0`` (or ``unprofiled=0`` alone) times none.
* ``record_shapes=True``: every op's input shapes -- the sizes of copies, of ``.item()`` reads, of the tensors
  a collective gets.
* ``with_stack=False``, ``profile_memory=False``: Python stacks and allocator events multiply the trace's size
  and the host's cost per op, which would distort the very launch overhead ``launch_bound`` measures; no rule
  needs them.
* ``ProfilerStep#<n>`` annotations: ``torch.profiler`` wraps each step between two :meth:`Capture.step`
  calls in one; the doctor divides costs by the steps and assigns every kernel to its step. Call ``step()``
  exactly once per training step, at its end.
* one gzipped file per rank in one directory: the doctor lines the ranks up by the trace's ``distributedInfo``
  (written by Kineto when a process group exists while a step is recorded -- initialise ``torch.distributed``
  before the first recorded step) or, failing that, by the rank in the file name. gzip makes traces 5-10x
  smaller.

**Flight Recorder.** The buffer exists only if ``TORCH_FR_BUFFER_SIZE`` (recent PyTorch; older versions read
``TORCH_NCCL_TRACE_BUFFER_SIZE``, which recent ones still accept with a deprecation warning) is > 0 in the
environment **before** the process group is created: process groups read it once, at creation. Export it in the launch script, or call
:func:`enable_flight_recorder` before ``init_process_group`` (recent builds keep a buffer by default: PyTorch
2.13 does for gloo). With ``flight_recorder=True`` and an empty buffer
(the variable unset, on a build that keeps none by default), no dump is written and the sidecar says why.

**The profiler's own cost.** Recording CPU ops slows the host: ``examples/train_ddp.py`` at batch 8 ran 17.5 ms
per step without the profiler (GPU-bound) and 28-37 ms per recorded step, host-bound -- a job near the balance of
host and GPU time becomes launch-bound under the profiler, and the doctor would say so. The ``unprofiled`` steps
timed just before the window (above) are what the doctor compares the recorded steps with.

**CUPTI after the trace** (``teardown_cupti=True``). Kineto leaves CUPTI attached to the process when a trace ends
unless the environment variable ``TEARDOWN_CUPTI`` is ``1``, and CUPTI's callbacks then cost the host on every CUDA
call for the rest of the process (measured: FINDINGS.md, "The accumulation pair on 2 H100s re-recorded interleaved,
and what a first trace leaves behind"). So every step after a first trace -- a second capture's unprofiled steps,
the rest of the training run -- would be slowed. Kineto reads the variable with ``getenv`` when a trace is reset, at
its end (libkineto ``CuptiActivityApi::teardownContext``), so setting it in the process before that is expected to
take effect (the slowdown was measured with the variable exported before the processes started; ``planted_multi.py
--cupti-env-to-capture --after-rounds N`` checks the in-process setting on GPUs): :meth:`Capture.start` sets
``TEARDOWN_CUPTI=1`` when a GPU is profiled and the variable is unset, and removes it again once its last trace has
ended (a value the user exported is kept; ``teardown_cupti=False`` sets nothing). It does not set it where PyTorch's
profiler turns teardown off for CUDA graphs (``torch.version.cuda`` below 12.6, or a build without CUPTI's lazy
re-initialisation: re-attaching CUPTI after a teardown crashes there with a graph), since kit.capture cannot see a
graph captured by hand; PyTorch's own ``TEARDOWN_CUPTI=0`` for inductor's CUDA graphs wins too. The header records
what was in effect: ``teardown_cupti`` (the value when the recording began, what Kineto reads at this trace's end),
``teardown_cupti_set_by`` (``kit.capture``, ``environment`` or None), ``teardown_cupti_not_set`` (why kit.capture
left it unset, else None) and ``earlier_traces`` (each earlier kit.capture trace of this process with the value in
effect at its end: the unprofiled steps of this capture ran with CUPTI attached if one of them had another value
than ``1``; a trace taken by other code than kit.capture is not seen).

Works the same with or without ``torch.distributed`` initialised (rank and world size then come from torchrun's
``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, else 0 / 1 / 0), on CPU and on GPUs.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .traces.names import parse_name, trace_path

FORMAT = 1
"""version of the sidecar / ``kitCapture`` header layout"""
HEADER_KEY = "kitCapture"
"""the trace header key holding :func:`describe`'s facts"""
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""the Flight Recorder's buffer size, new and old name: set before the process group is created"""
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "TORCH_DISTRIBUTED_")
ENV_NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES", "CUDA_MODULE_LOADING",
             "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "GROUP_RANK", "SLURM_PROCID", "SLURM_NTASKS")
"""environment variables the sidecar keeps: those that change how ranks communicate, launch and synchronise
(``CUDA_DEVICE_MAX_CONNECTIONS=1`` serialises streams; ``CUDA_LAUNCH_BLOCKING=1`` makes every launch a sync;
``NCCL_GRAPH_MIXING_SUPPORT``, ``NCCL_P2P_DISABLE``, ``NCCL_ALGO``/``NCCL_PROTO`` change what a collective
costs). Nothing else from the environment is written."""


# ------------------------------------------------------------------------------------------------ identity
def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def relevant_env() -> dict[str, str]:
    """The environment variables of :data:`ENV_PREFIXES` / :data:`ENV_NAMES`, sorted."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def describe(cuda: bool | None = None) -> dict[str, Any]:
    """What the doctor needs about this process that a profiler trace does not say (or says only when a process
    group exists): ``rank``, ``world_size``, ``local_rank``, ``backend``, ``distributed`` (a process group was
    initialised), ``hostname``, ``pid``, ``device`` / ``device_name`` / ``device_count``, ``torch``,
    ``cuda_runtime``, ``nccl``, ``python``, ``env`` (:func:`relevant_env`). Never raises."""
    import torch

    from .sysinfo import software

    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    cuda = torch.cuda.is_available() if cuda is None else cuda
    out: dict[str, Any] = {
        "format": FORMAT,
        "rank": dist.get_rank() if initialised else (_env_int("RANK", "SLURM_PROCID") or 0),
        "world_size": dist.get_world_size() if initialised else (_env_int("WORLD_SIZE", "SLURM_NTASKS") or 1),
        "local_rank": _env_int("LOCAL_RANK", "SLURM_LOCALID"),
        "backend": str(dist.get_backend()) if initialised else None,
        "distributed": bool(initialised),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        **software(),
        "platform": platform.platform(),
        "device": "cpu", "device_name": platform.processor() or platform.machine(), "device_count": 0,
    }
    if cuda:
        try:
            i = torch.cuda.current_device()
            out.update(device=f"cuda:{i}", device_name=torch.cuda.get_device_name(i),
                       device_count=torch.cuda.device_count())
        except Exception as e:  # a broken driver: say so, do not fail the user's job
            out["device_error"] = f"{type(e).__name__}: {e}"
    if out["local_rank"] is None:
        out["local_rank"] = int(out["device"].split(":")[1]) if out["device"].startswith("cuda:") else 0
    out["env"] = relevant_env()
    return out


# ------------------------------------------------------------------------------------------------ file names
def _names(out_dir: Path, rank: int, tags: dict[str, Any], cycle: int | None) -> Path:
    """A trace's path: ``trace_rank<r>.json.gz``, or the kit's tagged scheme when there are tags or cycles."""
    t = dict(tags)
    if cycle is not None:
        t["cycle"] = cycle
    return trace_path(out_dir, rank=rank, **t) if t else out_dir / f"trace_rank{rank}.json.gz"


def _stem(tags: dict[str, Any], rank: int) -> str:
    return "_".join([*(f"{k}={v}" for k, v in tags.items()), f"rank{rank}"])


def sidecar_path(out_dir: str | Path, rank: int, tags: dict[str, Any] | None = None) -> Path:
    """``<out_dir>/capture_[<tags>_]rank<r>.json``: one sidecar per rank (and tag set) for all its cycles."""
    return Path(out_dir) / f"capture_{_stem(tags or {}, rank)}.json"


def fr_path(out_dir: str | Path, rank: int, tags: dict[str, Any] | None = None) -> Path:
    """``<out_dir>/fr_[<tags>_]rank<r>.json``: the rank's Flight Recorder dump (never taken for a trace)."""
    return Path(out_dir) / f"fr_{_stem(tags or {}, rank)}.json"


def sidecar_for(trace: str | Path) -> Path | None:
    """The sidecar :class:`Capture` wrote beside ``trace`` (None for a name that is not a rank's trace)."""
    p = Path(trace)
    parsed = parse_name(p.name)
    if parsed is None or parsed[1] is None:
        return None
    tags, rank = parsed
    tags = {k: v for k, v in tags.items() if k != "cycle" and not (k == "name" and v == "trace")}
    return sidecar_path(p.parent, rank, tags)


def capture_info(trace: Any) -> dict[str, Any] | None:
    """The capture facts of one trace: a loaded :class:`kit.traces.Trace` (its header's ``kitCapture``, else
    the sidecar beside its file) or a path (the sidecar, without parsing the trace). None when the trace was
    not captured with this module (the doctor then says which fields it misses)."""
    header = getattr(trace, "header", None)
    if isinstance(header, dict) and isinstance(header.get(HEADER_KEY), dict):
        return header[HEADER_KEY]
    path = getattr(trace, "path", trace)
    side = sidecar_for(path) if path is not None else None
    if side is None or not side.is_file():
        return None
    try:
        return json.loads(side.read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------ Flight Recorder
def flight_recorder_enabled() -> bool:
    return any(_env_int(n) for n in FR_ENV)


def enable_flight_recorder(entries: int = 2000) -> None:
    """Set :data:`FR_ENV` (unless already set) so that the process group created next keeps a Flight Recorder
    buffer of ``entries`` collectives per rank. Once a process group exists this changes nothing for it (it read
    the environment at creation; some builds keep a buffer by default): a warning says so."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and not flight_recorder_enabled():
        warnings.warn("kit.capture.enable_flight_recorder: the process group already exists and read the environment "
                      "when it was created: call this before torch.distributed.init_process_group, or export "
                      "TORCH_FR_BUFFER_SIZE in the launch script", stacklevel=2)
    # the new name alone where it works (2.11 on 2xH200, 2.13 here: the old one draws a deprecation warning per
    # process group there); both before, where only the old one may be read
    new = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2] if x.isdigit()) >= (2, 11)
    for n in FR_ENV[:1] if new else FR_ENV:
        os.environ.setdefault(n, str(int(entries)))


# ------------------------------------------------------------------------------------------------ CUPTI
TEARDOWN_ENV = "TEARDOWN_CUPTI"
"""Kineto detaches CUPTI (``cuptiFinalize``) when a trace ends only if this is ``1`` (the module docstring)"""
_ENDED: list[str | None] = []
"""per kit.capture trace this process ended, the :data:`TEARDOWN_ENV` value in effect at its end"""
_KIT_HOLDS = 0
"""captures of this process relying on the :data:`TEARDOWN_ENV` that kit.capture set (removed when none is left)"""


def _teardown_risk() -> str | None:
    """Why kit.capture must not set :data:`TEARDOWN_ENV` here (None: no reason): PyTorch's profiler turns teardown
    off for CUDA graphs on CUDA < 12.6 or without CUPTI's lazy re-initialisation (re-attaching after a teardown
    crashes there); kit.capture cannot see a graph captured by hand, so it sets nothing under those conditions."""
    import torch

    cuda = getattr(torch.version, "cuda", None)
    if cuda and torch.torch_version.TorchVersion(cuda) < "12.6":
        return f"CUDA {cuda} < 12.6: re-attaching CUPTI after a teardown crashes with CUDA graphs"
    try:
        from torch._utils_internal import profiler_allow_cudagraph_cupti_lazy_reinit_cuda12 as lazy
    except ImportError:
        return None
    return None if lazy() else "this PyTorch build allows no lazy CUPTI re-initialisation with CUDA graphs"


def _teardown_default(cuda: bool, wanted: bool) -> dict[str, Any]:
    """Set :data:`TEARDOWN_ENV` to ``1`` where a GPU is profiled, ``wanted``, the variable is unset and
    :func:`_teardown_risk` has no reason against it: ``teardown_cupti_set_by`` ('kit.capture' -- also for the value
    an earlier capture of the process set and has not removed yet --, 'environment' or None) and
    ``teardown_cupti_not_set`` (the risk's reason, else None). Where it says 'kit.capture', :func:`_teardown_release`
    once the capture's last trace has ended."""
    global _KIT_HOLDS
    if TEARDOWN_ENV in os.environ and not _KIT_HOLDS:
        return {"teardown_cupti_set_by": "environment", "teardown_cupti_not_set": None}
    if TEARDOWN_ENV not in os.environ:
        why = _teardown_risk() if cuda and wanted else None
        if why or not (cuda and wanted):
            return {"teardown_cupti_set_by": None, "teardown_cupti_not_set": why}
        os.environ[TEARDOWN_ENV] = "1"
    _KIT_HOLDS += 1
    return {"teardown_cupti_set_by": "kit.capture", "teardown_cupti_not_set": None}


def _teardown_release() -> None:
    """One capture holding kit.capture's :data:`TEARDOWN_ENV` is done; the last one removes it (unless PyTorch has
    put its own value there since): a later profiler of the process finds the environment as it was."""
    global _KIT_HOLDS
    _KIT_HOLDS = max(_KIT_HOLDS - 1, 0)
    if not _KIT_HOLDS and os.environ.get(TEARDOWN_ENV) == "1":
        del os.environ[TEARDOWN_ENV]


# ------------------------------------------------------------------------------------------------ the capture
class Capture:
    """``torch.profiler.profile`` with the doctor's settings, writing per-rank files (see the module docstring).

    Use as a context manager (``with Capture(dir) as prof: ... prof.step()``) or by hand (``start()``,
    ``step()``, ``stop()``). After the block: ``paths`` (traces written), ``sidecar`` (its path), ``fr``
    (the Flight Recorder dump's path or None), ``done`` (every cycle written), ``prof`` (the underlying
    ``torch.profiler.profile``, e.g. for ``key_averages()``)."""

    def __init__(self, out_dir: str | Path, *, wait: int = 1, warmup: int = 2, active: int = 3, repeat: int = 1,
                 skip_first: int = 0, unprofiled: int = 5, unprofiled_host: int | None = None, flight_recorder: bool = False,
                 tags: dict[str, Any] | None = None, cuda: bool | None = None, record_shapes: bool = True,
                 with_stack: bool = False, profile_memory: bool = False, teardown_cupti: bool = True):
        unprofiled_host = unprofiled if unprofiled_host is None else unprofiled_host
        if min(wait, warmup, skip_first, repeat, unprofiled, unprofiled_host) < 0 or active < 1:
            raise ValueError("capture: wait, warmup, skip_first, repeat, unprofiled, unprofiled_host must be >= 0 and "
                             "active >= 1")
        if tags:
            trace_path(".", rank=0, **tags)  # a bad tag is an error now, not when the first trace is written
        self.out_dir = Path(out_dir)
        self.schedule = {"skip_first": skip_first, "wait": wait, "warmup": warmup, "active": active,
                         "repeat": repeat}
        self.unprofiled = int(unprofiled)
        self.unprofiled_host = int(unprofiled_host)
        self._marks: list[Any] = []  # CUDA events or perf_counter values at the ends of the unprofiled steps
        self._host_us: list[float] = []  # the host-timed steps' host times (unprofiled_host_us)
        self._host_t0: float | None = None
        self.teardown_cupti = teardown_cupti
        self._teardown: dict[str, Any] = {}
        self._holds = False  # this capture holds kit.capture's TEARDOWN_CUPTI (_teardown_release)
        self.tags = dict(tags or {})
        self.flight_recorder = flight_recorder
        self.options = {"record_shapes": record_shapes, "with_stack": with_stack, "profile_memory": profile_memory}
        self.cuda = cuda
        self.paths: list[Path] = []
        self.cycles: list[dict[str, Any]] = []
        self.sidecar: Path | None = None
        self.fr: Path | None = None
        self.fr_note: str | None = None
        self.prof = None
        self._recording_from: int | None = None
        self._steps = 0

    # -- lifecycle
    def start(self) -> "Capture":
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.cuda = torch.cuda.is_available() if self.cuda is None else self.cuda
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch_schedule = {**self.schedule, "skip_first": self.schedule["skip_first"] + self.unprofiled
                          + self.unprofiled_host}
        self._teardown = {**_teardown_default(self.cuda, self.teardown_cupti),
                          "earlier_traces": [{"teardown_cupti": v} for v in _ENDED]}
        self._holds = self._teardown["teardown_cupti_set_by"] == "kit.capture"
        self.prof = profile(activities=acts, schedule=schedule(**torch_schedule), on_trace_ready=self._ready,
                            **self.options)
        describe(self.cuda)  # its first call imports what it reads (~1 s): before the first step, not inside one
        self._quiet(self.prof.start)
        self._mark()
        self._host_mark(None)
        self._tag_if_recording()
        return self

    def step(self) -> None:
        """Mark the end of one training step (once per step)."""
        import time

        now = time.perf_counter()  # first: the host-timed step ends at this call
        self._steps += 1
        self._mark()
        self._quiet(self.prof.step)
        self._host_mark(now)
        self._tag_if_recording()

    @property
    def unprofiled_step_us(self) -> list[float]:
        """The unprofiled steps' times in microseconds (empty until they have run; waits for their GPU work)."""
        if len(self._marks) < 2:
            return []
        if self.cuda:
            self._marks[-1].synchronize()
            return [round(a.elapsed_time(b) * 1e3, 1) for a, b in zip(self._marks, self._marks[1:])]
        return [round((b - a) * 1e6, 1) for a, b in zip(self._marks, self._marks[1:])]

    def stop(self, exc: BaseException | None = None) -> None:
        try:
            if self.prof is not None:
                self.prof.stop()  # writes a cycle cut short by the end of the loop
        finally:
            self._release()
            if self.flight_recorder:
                self._dump_fr()
            if not self.paths:
                need = (self.schedule["skip_first"] + self.unprofiled + self.unprofiled_host + self.schedule["wait"]
                        + self.schedule["warmup"] + 1)
                warnings.warn(f"kit.capture: the loop ran {self._steps} step(s); the schedule records from step "
                              f"{need} on (skip_first + unprofiled + unprofiled_host + wait + warmup + 1): no trace "
                              f"was written",
                              stacklevel=3)
            self._write_sidecar(error=None if exc is None else f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(exc)

    @property
    def done(self) -> bool:
        """True once every cycle of a finite schedule (``repeat >= 1``) has been written."""
        return self.schedule["repeat"] > 0 and len(self.paths) >= self.schedule["repeat"]

    # -- internals
    @staticmethod
    def _quiet(fn) -> None:
        """One file per cycle is the point: torch's warning that a cycle's events are not kept is not for us."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
            fn()

    def _mark(self) -> None:
        """At the start of the first unprofiled step and the end of each: a CUDA event on the current stream (no
        synchronisation) or the host clock."""
        first = self.schedule["skip_first"]
        if not (first <= self._steps <= first + self.unprofiled) or not self.unprofiled:
            return
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append(ev)
        else:
            import time

            self._marks.append(time.perf_counter())

    def _host_mark(self, now: float | None) -> None:
        """The host-timed steps (``unprofiled_host``, after the ``unprofiled`` ones): the one that ended at this call
        (``now``: the call's first clock reading; None from :meth:`start`) is recorded; before the next one the GPU
        is drained (``torch.cuda.synchronize()``) and the clock starts as the call returns."""
        import time

        first = self.schedule["skip_first"] + self.unprofiled
        if now is not None and self._host_t0 is not None:
            self._host_us.append(round((now - self._host_t0) * 1e6, 1))
            self._host_t0 = None
        if first <= self._steps < first + self.unprofiled_host:
            if self.cuda:
                import torch

                torch.cuda.synchronize()
            self._host_t0 = time.perf_counter()

    def _recording(self) -> bool:
        from torch.profiler import ProfilerAction

        return self.prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    def _tag_if_recording(self) -> None:
        """At the first recorded step of a cycle: put :func:`describe` into the trace header (Kineto accepts
        metadata only while it records)."""
        if self._recording_from is None and self._recording():
            self._recording_from = self.prof.step_num
            facts = {**describe(self.cuda), "schedule": self.schedule, **self.options, "tags": self.tags,
                     **self._timing()}
            self.prof.add_metadata_json(HEADER_KEY, json.dumps(facts, default=str))

    def _timing(self) -> dict[str, Any]:
        return {"unprofiled": self.unprofiled, "unprofiled_step_us": self.unprofiled_step_us,
                "unprofiled_clock": "cuda_event" if self.cuda else "perf_counter",
                "unprofiled_host": self.unprofiled_host, "unprofiled_host_us": list(self._host_us),
                "unprofiled_host_clock": ("perf_counter from the step() that began the step, after a "
                                          "torch.cuda.synchronize(), to the step() that ends it" if self.cuda else
                                          "perf_counter from the step() that began the step to the one that ends it"),
                "teardown_cupti": os.environ.get(TEARDOWN_ENV), **self._teardown}

    def _ready(self, prof) -> None:
        """on_trace_ready: export this cycle's trace under the rank's name."""
        rank = describe(self.cuda)["rank"]
        cycle = len(self.paths) + 1 if self.schedule["repeat"] != 1 else None
        path = _names(self.out_dir, rank, self.tags, cycle)
        prof.export_chrome_trace(str(path))  # '.gz': torch writes it gzipped
        _ENDED.append(os.environ.get(TEARDOWN_ENV))  # what Kineto reads as this trace is reset
        self.paths.append(path)
        self.cycles.append({"trace": path.name, "first_step": self._recording_from, "last_step": prof.step_num})
        self._recording_from = None
        if self.done:
            self._release()
        self._write_sidecar()

    def _release(self) -> None:
        """After this capture's last trace (Kineto read :data:`TEARDOWN_ENV` at its end): give back the value
        kit.capture set, once."""
        if self._holds:
            self._holds = False
            _teardown_release()

    def _dump_fr(self) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self.fr_note = "no process group: nothing to record"
            return
        from .traces.flight_recorder import dump_flight_recorder

        try:  # some builds keep a buffer by default (NCCL, torch >= 2.6): try even without the variable
            dump = dump_flight_recorder()
        except Exception as e:  # a build without the recorder: say so in the sidecar
            self.fr_note = f"dump failed: {type(e).__name__}: {e}"
            return
        if not dump.get("entries"):
            self.fr_note = ("empty: set TORCH_FR_BUFFER_SIZE (older name TORCH_NCCL_TRACE_BUFFER_SIZE) > 0 before "
                            "init_process_group (kit.capture.enable_flight_recorder)")
            return
        self.fr = fr_path(self.out_dir, dist.get_rank(), self.tags)
        self.fr.write_text(json.dumps(dump, default=str))
        self.fr_note = f"{len(dump.get('entries', []))} entries"

    def _write_sidecar(self, error: str | None = None) -> None:
        facts = describe(self.cuda)
        body = {**facts, "schedule": self.schedule, **self.options, "tags": self.tags, **self._timing(),
                "steps_run": self._steps,
                "traces": [p.name for p in self.paths], "cycles": self.cycles,
                "flight_recorder": {"requested": self.flight_recorder, "file": self.fr.name if self.fr else None,
                                    "note": self.fr_note},
                "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if error:
            body["error"] = error
        self.sidecar = sidecar_path(self.out_dir, facts["rank"], self.tags)
        tmp = self.sidecar.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(body, indent=1, default=str))
        os.replace(tmp, self.sidecar)


def profile(out_dir: str | Path, **settings: Any) -> Capture:
    """``with kit.capture.profile(out_dir, wait=1, warmup=2, active=3, flight_recorder=False) as prof:`` --
    a :class:`Capture` (every keyword of it; see the module docstring for what each does and why)."""
    return Capture(out_dir, **settings)


def profile_steps(step_fn: Callable[[], Any], steps: int, out_dir: str | Path, **settings: Any) -> Capture:
    """Run ``step_fn()`` ``steps`` times under a :class:`Capture` (``prof.step()`` after each call) and return
    it: for a loop that is already a function. ``steps`` should cover ``skip_first + unprofiled + unprofiled_host
    + (wait + warmup + active) * repeat``; the loop stops early once every cycle is written."""
    with Capture(out_dir, **settings) as cap:
        for _ in range(steps):
            step_fn()
            cap.step()
            if cap.done:
                break
    return cap
