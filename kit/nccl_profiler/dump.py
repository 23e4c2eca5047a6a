"""Read the example plugin's dump: Chrome async events, one file per communicator and rank, into one row per
event (a *slice*: begin and end paired), with the nesting NCCL gave them.

The dump (``<name>_<commHash>_<rank>.json``, written when the communicator is destroyed) is a JSON array of
``{"name", "cat", "ph": "b"|"e", "id", "pid", "tid", "ts", "args"}`` objects ending in ``{}]``. It is *not*
strict JSON: the plugin prints some values unquoted -- the API events' datatype (``ncclFloat32``) and
stream pointers (``0x5020000567d0``, ``(nil)``) -- so :func:`read_dump` first quotes every bare token in a value
position (one regular expression), then decodes with msgspec.

What the events are (NCCL 2.28, profiler interface v5; ``ext-profiler/example/print_event.cc``): the file is
written depth-first, every child between its parent's ``b`` and ``e`` line, so the nesting is the file order
(the ``id`` field is a per-category print counter, not an identity):

    GROUP_API "Group API"           ncclGroupStart..ncclGroupEnd (one per collective call outside a group)
      KERNEL_LAUNCH "KernelLaunch"  the kernel launch; its begin is never stamped (ts 0), its end is
      COLL_API "AllReduce", ...     the API call (count, datatype, stream); begin not stamped (ts 0)
        COLL "AllReduce", ...       NCCL's task: SeqNum, CommHash, Algorithm, Protocol, nChannels; from
                                    enqueue to the moment the host saw it complete
          GPU "KernelCh"            one per channel: StartGpuClk/StopGpuClk (the GPU's global timer, ns)
            PROXY "ScheduleSend"..  proxy operations and NET steps, only when a network transport is used
    PROXY "Idle"/"Sleep"/"Append"   the proxy thread's states (top level, after the groups)

Interface versions: NCCL 2.28 asks a plugin for v5 first; the v4 example (NCCL 2.24-2.27) wrote top-level
``GROUP`` events and no ``*_API`` ones. The converter reads v5 dumps; a dump of another version (declared in the
run's ``nccl_profiler.json``, or recognised by its top-level ``GROUP`` events) is one :class:`DumpError`, as is a
truncated file (the process ended before the communicator was destroyed).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import msgspec

SUPPORTED_INTERFACES = (5,)
DUMP_GLOB = "nccl_profiler*_*_*.json*"
MANIFEST = "nccl_profiler.json"
"""written beside the dumps by the run: the plugin (path, interface version, NCCL version) and the event mask"""
_NAME = re.compile(r"_(\d+)_(\d+)\.json(?:\.gz)?$")
_BARE = re.compile(rb'(:\s*)(\(nil\)|0x[0-9a-fA-F]+|[A-Za-z_][A-Za-z0-9_]*)(?=\s*[,}\]])')
_KEEP = {b"true", b"false", b"null"}
# args keys -> frame columns (the plugin's spelling varies between event kinds)
ARG_COLUMNS = {"SeqNum": "seq", "CommHash": "comm", "Count": "count", "count": "count", "Datatype": "datatype",
               "datatype": "datatype", "Algorithm": "algorithm", "Protocol": "protocol", "nChannels": "n_channels",
               "Channel": "channel", "StartGpuClk": "start_gpu_ns", "StopGpuClk": "stop_gpu_ns", "Peer": "peer",
               "Steps": "steps", "ChunkSize": "chunk_size", "transSize": "trans_size", "Step": "step",
               "Rank": "nccl_rank"}
COLUMNS = ("idx", "parent", "depth", "group", "coll", "cat", "name", "ts", "end", *dict.fromkeys(ARG_COLUMNS.values()))


COLL_COLUMNS = ("rank", "comm", "seq", "name", "count", "datatype", "algorithm", "protocol", "n_channels",
                "coll_idx", "group", "group_ts", "group_end", "launch_end", "coll_ts", "coll_end", "channels_seen",
                "gpu_start_ns", "gpu_stop_ns", "channel_skew_us")
"""the columns of :func:`collectives`"""


class DumpError(Exception):
    """A dump the converter cannot read: one line naming the file and what to do."""


class _Event(msgspec.Struct):
    name: str = ""
    cat: str = ""
    ph: str = ""
    ts: float = 0.0
    pid: int = 0
    args: dict = {}


@dataclass
class Dump:
    path: Path
    rank: int
    comm: int
    pid: int
    events: "object"
    """pandas DataFrame, one row per slice (:data:`COLUMNS`); ``ts``/``end`` on the plugin's own clock (µs since
    the plugin's init, CLOCK_MONOTONIC), NaN where the plugin did not stamp it"""
    interface: int = 5
    notes: list[str] = field(default_factory=list)


def _text(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError, zlib.error) as e:
        raise DumpError(f"{path}: cannot read it ({type(e).__name__}: {e}); is the file complete?") from None


def fix_json(raw: bytes) -> bytes:
    """Quote the bare tokens the plugin prints as values (``ncclFloat32``, ``0x7f..``, ``(nil)``)."""
    return _BARE.sub(lambda m: m.group(0) if m.group(2) in _KEEP else m.group(1) + b'"' + m.group(2) + b'"', raw)


def declared_interface(directory: Path) -> int | None:
    """The interface version the run's manifest (``nccl_profiler.json`` beside the dump) declares, if any."""
    m = directory / MANIFEST
    if not m.is_file():
        return None
    try:
        return int(json.loads(m.read_text()).get("plugin", {}).get("interface"))
    except (ValueError, TypeError, json.JSONDecodeError):
        return None


def read_dump(path: str | os.PathLike, interface: int | None = None) -> Dump:
    """One dump file -> :class:`Dump`. ``interface``: the plugin's interface version if known (else the
    manifest's beside the file); DumpError for an unsupported version, a truncated or a non-dump file."""
    import pandas as pd

    path = Path(path)
    interface = interface if interface is not None else declared_interface(path.parent)
    if interface is not None and interface not in SUPPORTED_INTERFACES:
        raise DumpError(f"{path}: written by a profiler plugin of interface v{interface}; the kit reads "
                        f"v{'/'.join(map(str, SUPPORTED_INTERFACES))} dumps (NCCL 2.28's example plugin)")
    raw = _text(path).rstrip()
    if not raw.startswith(b"["):
        raise DumpError(f"{path}: not a profiler-plugin dump (a JSON array of Chrome events)")
    if not raw.endswith(b"]"):
        raise DumpError(f"{path}: truncated (no closing ']'): the process ended before NCCL destroyed the "
                        f"communicator; call torch.distributed.destroy_process_group() at the end of the job")
    try:
        events = msgspec.json.decode(fix_json(raw), type=list[_Event])
    except msgspec.ValidationError as e:
        raise DumpError(f"{path}: not a profiler-plugin dump ({e})") from None
    except msgspec.DecodeError as e:
        raise DumpError(f"{path}: not valid even after quoting bare values ({e}); truncated or not a dump") from None
    cats = {e.cat for e in events}
    if "GROUP_API" not in cats and "GROUP" in cats:
        raise DumpError(f"{path}: top-level GROUP events and no GROUP_API: a dump of profiler interface v4 or "
                        f"older (NCCL <= 2.27); the kit reads v5 dumps -- build the plugin from the NCCL that "
                        f"torch loads (torch.cuda.nccl.version())")
    rows, stack, notes = [], [], []
    for e in events:
        if not e.ph:
            continue  # the closing {}
        if e.ph == "b":
            parent = stack[-1] if stack else None
            row = {"idx": len(rows), "parent": parent["idx"] if parent else -1, "depth": len(stack),
                   "cat": e.cat, "name": e.name, "ts": e.ts or float("nan"), "end": float("nan"),
                   "group": (parent["group"] if parent else -1), "coll": (parent["coll"] if parent else -1)}
            if e.cat == "GROUP_API":
                row["group"] = row["idx"]
            if e.cat in ("COLL", "P2P"):
                row["coll"] = row["idx"]
            for k, v in e.args.items():
                col = ARG_COLUMNS.get(k)
                if col:
                    row[col] = v
            rows.append(row)
            stack.append(row)
        elif e.ph == "e":
            if not stack or stack[-1]["name"] != e.name or stack[-1]["cat"] != e.cat:
                raise DumpError(f"{path}: an end of {e.cat} {e.name!r} that closes nothing: not a dump of the "
                                f"example plugin's layout")
            stack.pop()["end"] = e.ts or float("nan")
    if stack:
        raise DumpError(f"{path}: {len(stack)} event(s) never end: truncated")
    df = _frame(rows)
    m = _NAME.search(path.name)
    ranks = df["nccl_rank"].dropna().unique()
    rank = int(ranks[0]) if len(ranks) else (int(m.group(2)) if m else -1)
    comms = df["comm"].dropna().unique()
    comm = int(comms[0]) if len(comms) else (int(m.group(1)) if m else 0)
    if not len(df):
        notes.append("no events: the plugin was loaded but its event mask stayed 0")
    return Dump(path=path, rank=rank, comm=comm, pid=events[0].pid if events and events[0].ph else 0, events=df,
                interface=interface or 5, notes=notes)


_UINT = ("comm", "start_gpu_ns", "stop_gpu_ns")  # 64-bit values: never through float64 (ns clocks, hashes)
_INT = ("idx", "parent", "depth", "group", "coll", "seq", "count", "n_channels", "channel", "nccl_rank", "peer",
        "steps", "chunk_size", "trans_size", "step")


def _frame(rows: list[dict]):
    import pandas as pd

    def num(v):
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def unsigned(v):  # a foreign or corrupted value outside uint64 is missing, not a crash
        v = num(v)
        return v if v is not None and 0 < v < 2**64 else None

    cols = {}
    for c in COLUMNS:
        vals = [r.get(c) for r in rows]
        if c in _UINT:  # the plugin prints 0 where a channel's stop was not recorded: missing
            cols[c] = pd.array([unsigned(v) for v in vals], dtype="UInt64")
        elif c in _INT:
            cols[c] = pd.array([num(v) for v in vals], dtype="Int64")
        elif c in ("ts", "end"):
            cols[c] = pd.array(vals, dtype="float64")
        else:
            cols[c] = pd.array([None if v is None else str(v) for v in vals], dtype="object")
    return pd.DataFrame(cols)


def is_dump(p: Path) -> bool:
    """A profiler-plugin dump by its name: ``nccl_profiler*_<commHash>_<rank>.json[.gz]``."""
    return p.name.startswith("nccl_profiler") and bool(_NAME.search(p.name))


def find_dumps(paths: Iterable[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    """Dump files among ``paths`` (files, or directories searched for ``nccl_profiler*_<comm>_<rank>.json[.gz]``)."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.glob(DUMP_GLOB) if _NAME.search(f.name))
        else:
            out.append(p)
    return out


def read_dumps(paths) -> list[Dump]:
    """Every dump among ``paths`` (see :func:`find_dumps`); DumpError when there is none or one is unreadable."""
    files = find_dumps(paths)
    if not files:
        raise DumpError(f"no profiler-plugin dump (nccl_profiler*_<commHash>_<rank>.json[.gz]) in "
                        f"{', '.join(map(str, [paths] if isinstance(paths, (str, os.PathLike)) else paths))}")
    return [read_dump(f) for f in files]


def collectives(dump: Dump) -> "object":
    """One row per collective / P2P task of a dump: what NCCL chose (algorithm, protocol, channels) and its
    times -- host (plugin clock, µs): ``group_ts`` (the Group API call), ``launch_end`` (the kernel launch
    returned), ``coll_ts``/``coll_end`` (NCCL's task: enqueued .. seen complete by the host); GPU (global
    timer, ns): ``gpu_start_ns`` (first channel started), ``gpu_stop_ns`` (the last channel stop the plugin
    got), ``channel_skew_us`` (first to last channel start), ``channels_seen``."""
    import pandas as pd

    ev = dump.events
    if not len(ev):
        return pd.DataFrame(columns=list(COLL_COLUMNS))
    colls = ev[ev["cat"].isin(["COLL", "P2P"])]
    ch = ev[ev["cat"] == "GPU"].groupby("coll").agg(channels_seen=("channel", "nunique"),
                                                    gpu_start_ns=("start_gpu_ns", "min"),
                                                    last_start_ns=("start_gpu_ns", "max"),
                                                    gpu_stop_ns=("stop_gpu_ns", "max"))
    groups = ev[ev["cat"] == "GROUP_API"].set_index("idx")
    launch = ev[ev["cat"] == "KERNEL_LAUNCH"].groupby("group")["end"].max()
    out = pd.DataFrame({
        "rank": dump.rank, "comm": colls["comm"].astype("UInt64").values, "seq": colls["seq"].values,
        "name": colls["name"].values, "count": colls["count"].values, "datatype": colls["datatype"].values,
        "algorithm": colls["algorithm"].values, "protocol": colls["protocol"].values,
        "n_channels": colls["n_channels"].values, "coll_idx": colls["idx"].values,
        "group": colls["group"].values, "group_ts": colls["group"].map(groups["ts"]).values,
        "group_end": colls["group"].map(groups["end"]).values, "launch_end": colls["group"].map(launch).values,
        "coll_ts": colls["ts"].values, "coll_end": colls["end"].values})
    out = out.join(ch, on="coll_idx")
    out["channels_seen"] = out["channels_seen"].fillna(0).astype(int)
    out["channel_skew_us"] = (out["last_start_ns"].astype("Float64") - out["gpu_start_ns"].astype("Float64")) / 1e3
    return out.drop(columns=["last_start_ns"]).reset_index(drop=True)
