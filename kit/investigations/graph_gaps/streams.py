"""The stream a CUDA graph is replayed into: the factor ``replay_streams`` of graph_gaps.

``CUDAGraph.replay()`` launches the graph (``cudaGraphLaunch``) into PyTorch's *current* stream. Unless a stream
is entered, that is the default stream, handle 0, which PyTorch (built without ``--default-stream per-thread``)
gets as CUDA's **legacy default stream**: CUDA documents it as synchronising implicitly with every other
*blocking* stream of the context (work on it waits for all earlier work of those streams, and their later work
waits for it; streams created with ``cudaStreamNonBlocking`` are exempt). The choices:

* ``legacy``     -- ``torch.cuda.default_stream()`` (handle 0): what ``g.replay()`` uses in a plain loop;
* ``created``    -- ``torch.cuda.Stream()``: a stream of PyTorch's pool, created ``cudaStreamNonBlocking``;
* ``per_thread`` -- CUDA's per-thread default stream (``cudaStreamPerThread``, handle 2), reached as
  ``torch.cuda.ExternalStream(2)``: a blocking stream that is not the legacy one (it synchronises with the legacy
  stream only);
* ``blocking``   -- a stream created with ``cudaStreamCreate`` (default flags: blocking), by the CUDA runtime
  PyTorch loaded, wrapped as ``torch.cuda.ExternalStream``: like ``created`` but blocking. With ``per_thread``
  it separates "launched into the legacy stream" from "launched into a stream that synchronises with it".

The replay function of a non-legacy stream is the pattern a user writes: the stream waits for the current
stream, the graph is replayed inside ``with torch.cuda.stream(s)``, the current stream waits for it -- so the
timing (CUDA events on the current stream) covers the whole replay and the join costs are included.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

STREAMS = ("legacy", "created", "per_thread", "blocking")
PER_THREAD_HANDLE = 2  # cudaStreamPerThread (driver_types.h: ((cudaStream_t)0x2))


def _cudart():
    """The CUDA runtime library this process already loaded (PyTorch's), from /proc/self/maps; None if none."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    paths = sorted({ln.split()[-1] for ln in maps if "libcudart.so" in ln.split()[-1]})
    for p in paths:
        try:
            return ctypes.CDLL(p)
        except OSError:
            continue
    return None


def make_stream(name: str, device):
    """``(stream, note)``: the torch stream of choice ``name`` on ``device``, or ``(None, why not)``."""
    import torch

    if name == "legacy":
        return torch.cuda.default_stream(device), ""
    if name == "created":
        return torch.cuda.Stream(device=device), ""
    if name == "per_thread":
        try:
            return torch.cuda.ExternalStream(PER_THREAD_HANDLE, device=device), ""
        except Exception as e:  # noqa: BLE001 -- the build may refuse the handle: say so in the rows
            return None, f"torch.cuda.ExternalStream(2) refused: {type(e).__name__}: {e}"
    if name == "blocking":
        rt = _cudart()
        if rt is None:
            return None, "no libcudart.so in this process's maps: cannot create a blocking stream"
        with torch.cuda.device(device):
            handle = ctypes.c_void_p()
            err = rt.cudaStreamCreate(ctypes.byref(handle))
        if err != 0 or not handle.value:
            return None, f"cudaStreamCreate returned {err}"
        return torch.cuda.ExternalStream(handle.value, device=device), ""
    raise ValueError(f"unknown replay stream {name!r}; one of {STREAMS}")


def replay_on(g, stream, device):
    """The call that replays graph ``g`` into ``stream`` (see the module docstring); the legacy stream: ``g.replay``."""
    import torch

    cur = torch.cuda.current_stream(device)
    if stream is None or stream.cuda_stream == cur.cuda_stream:
        return g.replay

    def replay():
        stream.wait_stream(cur)
        with torch.cuda.stream(stream):
            g.replay()
        cur.wait_stream(stream)

    return replay


def handle(stream) -> str:
    """The stream's CUDA handle as hex (0x0 = the legacy default stream, 0x2 = per-thread)."""
    return hex(int(stream.cuda_stream)) if stream is not None else ""
