"""Put a dump's events on the clock of the Kineto trace of the same rank, and say how well they fit.

The plugin stamps two clocks, neither of them Kineto's:

* **GPU**: each channel's ``StartGpuClk``/``StopGpuClk``, the GPU's global timer in ns. Kineto maps the same
  GPU's activity onto its own host-based clock, so the two differ by one constant per trace. It is found by
  *matching*: every (plugin collective, Kineto NCCL kernel) pair of the same operation proposes an offset
  ``kernel start - first channel start``; the offset most pairs agree on (within ``tol_us``) wins, and the
  pairs that agree are the matches -- robust to a dump that holds more collectives than the trace (events
  before or after the traced steps) and to kernels the dump lacks. The offset is the median over the matches;
  the **error** is the largest residual. What this cannot separate: a constant delay between a kernel's start
  and its first channel's start is absorbed in the offset (the residuals show only its variation).
* **host**: every other ``ts``, microseconds of CLOCK_MONOTONIC since the plugin's init (the init time is not
  in the dump). For the matched collectives, the end of the plugin's KernelLaunch event and the end of the
  Kineto launch call of that kernel (``cuLaunchKernelEx``, joined by correlation id) are the same moment, up
  to the few instructions between them; offset = median, error = largest residual.

Across ranks the global timers of two GPUs differ (~100 µs between the two H200s of one host), so the
cross-rank step is the Kineto merge's (:mod:`kit.traces.merge`), applied after this one.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

TOL_US = 5.0
"""pairs whose offset is within this of the winning offset are matches"""
ERROR_BOUND_US = 1.0
"""the residual the tests hold both alignments to (measured on 2x H200: the probe run in tests/data GPU <= 0.25 µs,
host <= 0.52 µs; the recorded collective_tracing run GPU <= 0.79 µs, host <= 0.25 µs)"""


@dataclass
class Alignment:
    rank: int
    matched: int
    plugin_collectives: int
    kineto_kernels: int
    gpu_offset_us: float
    """add to ``gpu_ns / 1000`` to get the Kineto trace's time"""
    gpu_error_us: float
    host_offset_us: float
    """add to the plugin's host ``ts`` to get the Kineto trace's time"""
    host_error_us: float
    host_matched: int
    gpu_base_ns: int = 0
    gpu_rel_offset_us: float = float("nan")
    """the exact form of the GPU offset: Kineto time = ``(gpu_ns - gpu_base_ns) / 1000 + gpu_rel_offset_us``
    (``gpu_offset_us`` is the same sum folded into one float: 0.25 µs steps at ~1.8e15 µs)"""

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in asdict(self).items()}


def _norm(s: str) -> str:
    return re.sub(r"[^a-z]", "", s.lower())


def rel_us(ns, base: int) -> np.ndarray:
    """Nanosecond stamps (UInt64, may be missing) as µs after ``base``: the difference is taken in integers
    (a float64 holds a 1.8e18 ns stamp only to 256 ns)."""
    import pandas as pd

    return np.array([np.nan if pd.isna(v) else (int(v) - base) / 1e3 for v in ns], dtype=np.float64)


def kineto_nccl_kernels(trace) -> "object":
    """The NCCL kernels of a loaded Kineto trace (:func:`kit.traces.load_trace`), with the launch call's
    ``launch_ts``/``launch_end`` (the runtime or driver event of the same correlation id)."""
    g = trace.gpu[trace.gpu["nccl"] & (trace.gpu["cat"] == "kernel")].copy()
    cpu = trace.cpu
    launches = cpu[cpu["cat"].isin(["cuda_runtime", "cuda_driver"]) & cpu["correlation"].notna()]
    launches = launches.drop_duplicates("correlation").set_index("correlation")
    g["launch_ts"] = g["correlation"].map(launches["ts"])
    g["launch_end"] = g["correlation"].map(launches["end"])
    g["pid"] = g["correlation"].map(launches["pid"])
    return g.sort_values("ts").reset_index(drop=True)


def match(colls, kernels, tol_us: float = TOL_US):
    """``(offset_us, base_ns, pairs)``: the GPU-clock offset -- Kineto time = ``(gpu_ns - base_ns) / 1000 +
    offset_us``, kept relative to ``base_ns`` (the first channel start) because an absolute offset of ~1.8e15
    µs would hold only 0.25 µs steps in a float64 -- and the matched ``(collective row, kernel row)`` index
    pairs (each collective at most once; several collectives may share a kernel: a group of them)."""
    if not len(colls) or not len(kernels):
        return float("nan"), 0, []
    c = colls[colls["gpu_start_ns"].notna()]
    if not len(c):
        return float("nan"), 0, []
    cstart = c["gpu_start_ns"].astype("uint64").to_numpy()
    base = int(cstart.min())
    cs = (cstart - base).astype(np.float64) / 1e3  # µs since the first channel start, exact enough
    ks = kernels["ts"].to_numpy(np.float64)
    same = np.array([[_norm(n) in _norm(k) for k in kernels["name"]] for n in c["name"]])
    d = ks[None, :] - cs[:, None]  # kernel start - channel start, for every pair
    cand = d[same]
    if not cand.size:
        return float("nan"), base, []
    # the offset most same-operation pairs agree on: the densest tol-wide window of candidate offsets
    srt = np.sort(cand)
    hi = np.searchsorted(srt, srt + tol_us, side="right")
    best = int(np.argmax(hi - np.arange(srt.size)))
    centre = float(np.median(srt[best:hi[best]]))
    pairs = []
    for i in range(len(c)):
        ok = np.where(same[i] & (np.abs(d[i] - centre) <= tol_us))[0]
        if ok.size:
            j = ok[np.argmin(np.abs(d[i][ok] - centre))]
            pairs.append((c.index[i], kernels.index[j], d[i, j]))
    off = float(np.median([p[2] for p in pairs]))
    return off, base, [(i, j) for i, j, _ in pairs]


def align(colls, kernels, rank: int = -1, tol_us: float = TOL_US) -> tuple[Alignment, "object"]:
    """Align one rank's dump collectives (:func:`kit.nccl_profiler.dump.collectives`) with its Kineto NCCL
    kernels (:func:`kineto_nccl_kernels`). Returns the :class:`Alignment` and the matched collectives with
    the kernel's columns (``kernel``, ``kernel_ts``, ``kernel_end``, ``kineto_launch_end``) and every plugin
    time on the Kineto clock: ``gpu_start``/``gpu_stop`` (channels), ``group_ts``/``launch_end``/``coll_ts``/
    ``coll_end`` (host)."""
    import pandas as pd

    off, base, pairs = match(colls, kernels, tol_us)
    if not pairs:
        a = Alignment(rank, 0, len(colls), len(kernels), float("nan"), float("nan"), float("nan"), float("nan"), 0)
        return a, colls.iloc[0:0]
    ci, ki = zip(*pairs)
    m = colls.loc[list(ci)].reset_index(drop=True)
    k = kernels.loc[list(ki)].reset_index(drop=True)
    m["kernel"] = k["name"].values
    m["kernel_ts"] = k["ts"].values
    m["kernel_end"] = k["end"].values
    m["kernel_pid"] = k["device"].values
    m["kernel_stream"] = k["stream"].values
    m["kineto_launch_end"] = k["launch_end"].values
    # ns -> µs relative to match's base, then the relative offset: never a 1e15-µs float in between
    m["gpu_start"] = rel_us(m["gpu_start_ns"], base) + off
    m["gpu_stop"] = rel_us(m["gpu_stop_ns"], base) + off
    gpu_res = (m["gpu_start"] - m["kernel_ts"]).abs()
    h = (m["kineto_launch_end"] - m["launch_end"].astype("float64")).dropna()
    h_off = float(h.median()) if len(h) else float("nan")
    h_err = float((h - h_off).abs().max()) if len(h) else float("nan")
    for col in ("group_ts", "launch_end", "coll_ts", "coll_end"):
        m[col] = m[col].astype("float64") + h_off
    a = Alignment(rank, len(m), len(colls), len(kernels), off - base / 1e3, float(gpu_res.max()), h_off, h_err,
                  len(h), base, off)
    return a, m
