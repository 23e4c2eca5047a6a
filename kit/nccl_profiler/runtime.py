"""Turn the plugin on for a window of steps inside a rank.

NCCL loads the library named by ``NCCL_PROFILER_PLUGIN`` when a communicator is created and passes the
plugin a pointer to the one event-activation mask it reads before each event (``ncclProfilerEventMask`` in
NCCL's ``src/plugin/profiler.cc``). The example plugin sets that mask from ``NCCL_PROFILE_EVENT_MASK`` at
init and exports two functions that change it later, ``exampleProfilerStart(mask, dump_name)`` and
``exampleProfilerStop()`` -- the start/stop hooks meant for a tracer such as Kineto. So the kit launches with
the plugin loaded and the mask 0 (:func:`launch_env`), and a rank calls :func:`start` before the traced steps
and :func:`stop` after them: outside the window NCCL creates no events. The dump is written when the
communicator is destroyed (``destroy_process_group``): ``<dump_name>_<commHash>_<rank>.json``.

Event mask bits (NCCL ``ext-profiler/example/nccl/profiler.h``): Group 1, Coll 2, P2p 4, ProxyOp 8,
ProxyStep 16, ProxyCtrl 32, KernelCh 64, NetPlugin 128, GroupApi 256, CollApi 512, P2pApi 1024,
KernelLaunch 2048; 4095 = all.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .plugin import Plugin, PluginError

ALL_EVENTS = 4095
DUMP_STEM = "nccl_profiler"
POOL_SIZE = 4096
"""events of each kind the example keeps (its default is 256: a traced window of a DDP step + sweep needs more)"""

_keep: list[bytes] = []  # the plugin keeps the dump-name pointer: the bytes must outlive the process's comms


def launch_env(plugin: Plugin, *, initial_mask: int = 0, pool_size: int = POOL_SIZE) -> dict[str, str]:
    """The environment a run is launched with: the plugin loaded, its mask ``initial_mask`` (0: off until
    :func:`start`), larger event pools."""
    env = {"NCCL_PROFILER_PLUGIN": plugin.path, "NCCL_PROFILE_EVENT_MASK": str(int(initial_mask))}
    for pool in ("GROUP_API", "COLL_API", "P2P_API", "KERNEL_LAUNCH", "GROUP", "COLL", "P2P", "PROXY_DETACH"):
        env[f"NCCL_PROFILE_{pool}_POOL_SIZE"] = str(pool_size)
    return env


def loaded_path() -> str | None:
    """The plugin this process was launched with (``NCCL_PROFILER_PLUGIN``), None when none or ``none``."""
    p = os.environ.get("NCCL_PROFILER_PLUGIN", "")
    return p if p and p.lower() != "none" else None


def _lib():
    path = os.environ.get("NCCL_PROFILER_PLUGIN")
    if not path:
        raise PluginError("NCCL_PROFILER_PLUGIN is not set in this process: launch with launch_env()")
    try:  # RTLD_NOLOAD: the library NCCL already opened (same globals), never a second copy
        return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
    except OSError:
        raise PluginError(f"NCCL has not loaded {path} in this process yet: create the communicator (one "
                          f"collective) before start()") from None


def _fn(lib, *names):
    """The example exports its hooks from C++ without ``extern "C"``: look up the plain and the mangled name."""
    for n in names:
        if hasattr(lib, n):
            return getattr(lib, n)
    raise PluginError(f"the loaded profiler plugin has no {names[0]}: only NCCL's example plugin has the start/stop "
                      f"hooks; use NCCL_PROFILE_EVENT_MASK for the whole run instead")


def start(dump_prefix: str | os.PathLike, mask: int = ALL_EVENTS) -> None:
    """Turn NCCL's events on (``mask``) and name the dump ``<dump_prefix>_<commHash>_<rank>.json``."""
    Path(dump_prefix).parent.mkdir(parents=True, exist_ok=True)
    os.environ["NCCL_PROFILE_DUMP_FILE"] = str(dump_prefix)  # what a plugin without the name argument reads
    name = str(dump_prefix).encode()
    _keep.append(name)
    _fn(_lib(), "exampleProfilerStart", "_Z20exampleProfilerStartiPKc")(ctypes.c_int(int(mask)), ctypes.c_char_p(name))


def stop() -> None:
    """Turn NCCL's events off again (mask 0); what was recorded stays in the plugin until the dump."""
    _fn(_lib(), "exampleProfilerStop", "_Z19exampleProfilerStopv")()
