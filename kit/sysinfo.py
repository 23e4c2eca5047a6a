"""Capture the hardware and software a result came from.

GPU facts come from NVML (package ``nvidia-ml-py``, imported as ``pynvml``): name, UUID, PCI bus id, memory,
current and max SM clock, NVLink links up, and the GPU x GPU connection matrix in the vocabulary of
``nvidia-smi topo -m`` (``NV<n>`` = n NVLinks between the pair; otherwise the PCIe level ``PIX``/``PXB``/
``PHB``/``NODE``/``SYS``). Software: torch, CUDA runtime, NCCL, Python, host, CPUs, and every ``NCCL_*``,
``TORCH_*``, ``CUDA_*`` environment variable. Without an NVIDIA driver the GPU list is empty and
``nvml_error`` says why; nothing raises.

NVML does not create a CUDA context, so this is safe to call in a launcher parent process.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "PYTORCH_", "NVSHMEM_")

# nvmlDeviceGetTopologyCommonAncestor levels -> the labels `nvidia-smi topo -m` prints.
_TOPO_LABELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _gpu_info(pynvml) -> dict[str, Any]:
    info: dict[str, Any] = {"gpus": [], "topology": [], "driver_version": None, "cuda_driver_version": None}
    info["driver_version"] = _s(pynvml.nvmlSystemGetDriverVersion())
    try:
        v = pynvml.nvmlSystemGetCudaDriverVersion()
        info["cuda_driver_version"] = f"{v // 1000}.{(v % 1000) // 10}"
    except pynvml.NVMLError:
        pass
    n = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    bus_ids_all = {_s(pynvml.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles}
    bus_ids = []
    for i, h in enumerate(handles):
        g: dict[str, Any] = {"index": i, "name": _s(pynvml.nvmlDeviceGetName(h))}
        g["uuid"] = _s(pynvml.nvmlDeviceGetUUID(h))
        bus = _s(pynvml.nvmlDeviceGetPciInfo(h).busId)
        g["pci_bus_id"] = bus
        bus_ids.append(bus.lower())
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        g["memory_total_mib"] = mem.total // 2**20
        for key, fn in (("sm_clock_mhz", pynvml.nvmlDeviceGetClockInfo), ("sm_clock_max_mhz", pynvml.nvmlDeviceGetMaxClockInfo)):
            try:
                g[key] = fn(h, pynvml.NVML_CLOCK_SM)
            except pynvml.NVMLError:
                g[key] = None
        links, remotes = 0, []
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED:
                    links += 1
                    remotes.append(_s(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower())
            except pynvml.NVMLError:
                break  # no such link / NVLink not supported on this GPU
        g["nvlinks_up"] = links
        g["_remotes"] = remotes
        # links that end on an NVSwitch (HGX boards) rather than on a peer GPU
        g["nvlinks_to_switch"] = sum(1 for r in remotes if r not in bus_ids_all)
        info["gpus"].append(g)
    # Connection matrix: NVLink count where links connect the pair, else the PCIe common ancestor level.
    for i, hi in enumerate(handles):
        row = []
        for j, hj in enumerate(handles):
            if i == j:
                row.append("X")
                continue
            nv = sum(1 for r in info["gpus"][i]["_remotes"] if r == bus_ids[j])
            if not nv and info["gpus"][i]["nvlinks_to_switch"] and info["gpus"][j]["nvlinks_to_switch"]:
                # Through NVSwitches every link of a GPU reaches every peer on the fabric, as nvidia-smi
                # topo -m reports it (NV18 on HGX H100/H200); only if NVML says the pair can use NVLink P2P.
                try:
                    ok = pynvml.nvmlDeviceGetP2PStatus(hi, hj, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == pynvml.NVML_P2P_STATUS_OK
                except (pynvml.NVMLError, AttributeError):
                    ok = False
                if ok:
                    nv = min(info["gpus"][i]["nvlinks_to_switch"], info["gpus"][j]["nvlinks_to_switch"])
            if nv:
                row.append(f"NV{nv}")
                continue
            try:
                lvl = pynvml.nvmlDeviceGetTopologyCommonAncestor(hi, hj)
                row.append(_TOPO_LABELS.get(int(lvl), str(lvl)))
            except pynvml.NVMLError:
                row.append("?")
        info["topology"].append(row)
    for g in info["gpus"]:
        g.pop("_remotes")
    return info


def software() -> dict[str, Any]:
    sw: dict[str, Any] = {"python": platform.python_version(), "torch": None, "cuda_runtime": None, "nccl": None}
    try:
        import torch

        sw["torch"] = torch.__version__
        sw["cuda_runtime"] = torch.version.cuda
        try:
            if torch.distributed.is_nccl_available():
                sw["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    except ImportError:
        pass
    return sw


def nccl_profiler_info(plugin: str | None) -> dict[str, Any] | None:
    """Which NCCL profiler plugin this process runs with: its library, the interface version it exports
    (``ncclProfiler_v<N>``, what NCCL loads), the NCCL version it was built from (its build record, see
    :mod:`kit.nccl_profiler.plugin`) and the event mask it starts with. None without one (or ``none``)."""
    if not plugin or plugin.lower() == "none":
        return None
    try:
        from .nccl_profiler.plugin import describe

        info: dict[str, Any] = describe(plugin).to_json()
    except Exception as e:  # a missing or foreign library: say so, never raise
        info = {"path": plugin, "error": f"{type(e).__name__}: {e}"}
    info["event_mask_at_start"] = os.environ.get("NCCL_PROFILE_EVENT_MASK")
    return info


def collect() -> dict[str, Any]:
    """Everything about this machine that a performance number depends on. Never raises."""
    out: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python_executable": sys.executable,
        "gpus": [],
        "topology": [],
        "nvml_error": None,
    }
    out.update(software())
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out.update(_gpu_info(pynvml))
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # no driver, no library, no permission: an empty GPU list, not a crash
        out["nvml_error"] = f"{type(e).__name__}: {e}"
    plugin = os.environ.get("NCCL_PROFILER_PLUGIN")
    out["nccl_profiler_plugin"] = plugin or None
    out["nccl_profiler"] = nccl_profiler_info(plugin)
    out["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return out


def summary(info: dict[str, Any]) -> str:
    """One line: '2x NVIDIA H200 (NV18) | driver 580.x | torch 2.11 | CUDA 13.0 | NCCL 2.28.9'."""
    gpus = info.get("gpus") or []
    if gpus:
        names = sorted({g["name"] for g in gpus})
        link = ""
        topo = info.get("topology") or []
        if len(topo) > 1:
            link = f" ({topo[0][1]})"
        hw = f"{len(gpus)}x {'/'.join(names)}{link} | driver {info.get('driver_version')}"
    else:
        hw = f"CPU only ({info.get('cpu_count')} cores)"
    parts = [hw, f"torch {info.get('torch')}"]
    if info.get("cuda_runtime"):
        parts.append(f"CUDA {info['cuda_runtime']}")
    if info.get("nccl") and gpus:
        parts.append(f"NCCL {info['nccl']}")
    return " | ".join(parts)


def format_text(info: dict[str, Any]) -> str:
    lines = [f"host          {info['hostname']} ({info['cpu_count']} CPUs, {info['platform']})",
             f"python        {info['python']}",
             f"torch         {info['torch']} (CUDA runtime {info['cuda_runtime']}, NCCL {info['nccl']})"]
    if info["gpus"]:
        lines.append(f"driver        {info['driver_version']} (CUDA driver {info['cuda_driver_version']})")
        for g in info["gpus"]:
            lines.append(
                f"GPU{g['index']}          {g['name']}  {g['memory_total_mib']} MiB  SM {g['sm_clock_mhz']}/"
                f"{g['sm_clock_max_mhz']} MHz  NVLinks up {g['nvlinks_up']}  {g['pci_bus_id']}  {g['uuid']}"
            )
        n = len(info["gpus"])
        lines.append("topology      " + "".join(f"{'GPU' + str(j):>7}" for j in range(n)))
        for i, row in enumerate(info["topology"]):
            lines.append(f"{'GPU' + str(i):<14}" + "".join(f"{c:>7}" for c in row))
    else:
        lines.append(f"GPUs          none ({info['nvml_error']})")
    if info.get("nccl_profiler_plugin"):
        pi = info.get("nccl_profiler") or {}
        what = f" (interface v{pi['interface']}, built from NCCL {pi.get('nccl_version')})" if pi.get("interface") else ""
        lines.append(f"NCCL profiler plugin  {info['nccl_profiler_plugin']}{what}")
    for k, v in info["env"].items():
        lines.append(f"env           {k}={v}")
    return "\n".join(lines)


def peer_access() -> bool | None:
    """True when every pair of GPUs can read each other's memory (NVML's P2P read status), False when a pair
    cannot, None when NVML cannot tell (no driver). Creates no CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        for i, a in enumerate(hs):
            for b in hs[i + 1:]:
                if pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_READ) != pynvml.NVML_P2P_STATUS_OK:
                    return False
        return True
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
