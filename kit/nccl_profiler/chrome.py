"""The dump's events as Chrome trace events: beneath the Kineto kernels (merge), or alone (``convert``).

Placement in a merged trace (one process per rank and original process, as :func:`kit.traces.merge` lays
them out): the **channel events** go into the rank's GPU process, one thread per channel (``NCCL ch <c>``),
right under the stream that ran the kernel; the **host events** (Group API, the collective API call, the kernel
launch, NCCL's task, proxy operations and steps) into the rank's host process, on threads ``NCCL host`` and
``NCCL proxy``. Every event keeps the plugin's args (algorithm, protocol, nChannels, SeqNum, ...). Where the
plugin stamped only one end of an event (the KernelLaunch and API events' begin is always 0; most channels'
stop is not recorded by NCCL 2.28), the event says so in ``args`` rather than inventing it: an event without a
begin is an instant at its end; a channel without a stop is drawn to its collective's last recorded stop with
``stop: "not recorded"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CHANNEL_TID = 100_000
HOST_TID = 200_001
PROXY_TID = 200_002
HOST_CATS = ("GROUP_API", "KERNEL_LAUNCH", "COLL_API", "P2P_API", "COLL", "P2P")
_ARGS = ("seq", "count", "datatype", "algorithm", "protocol", "n_channels", "channel", "peer", "steps", "chunk_size",
         "trans_size", "step")


def _args(row) -> dict[str, Any]:
    """The plugin's args of one event row: the columns it has, as JSON values."""
    import pandas as pd

    out = {}
    for k in _ARGS:
        v = row.get(k)
        if v is not None and not pd.isna(v):
            out[k] = int(v) if isinstance(v, np.integer) else v
    return out


def _slice(name, cat, pid, tid, ts, end, args) -> dict:
    ok_ts, ok_end = ts == ts and ts is not None, end == end and end is not None
    if ok_ts and ok_end and end >= ts:
        return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": float(ts), "dur": float(end - ts),
                "args": args}
    at = end if ok_end else ts
    return {"ph": "i", "s": "t", "name": f"{name} ({'end' if ok_end else 'begin'})", "cat": cat, "pid": pid,
            "tid": tid, "ts": float(at), "args": {**args, "note": "the plugin stamped only this end"}}


def thread_names(pid_gpu, pid_host, channels) -> list[dict]:
    meta = [{"ph": "M", "name": "thread_name", "pid": pid_host, "tid": HOST_TID, "args": {"name": "NCCL host (plugin)"}},
            {"ph": "M", "name": "thread_name", "pid": pid_host, "tid": PROXY_TID, "args": {"name": "NCCL proxy (plugin)"}}]
    for c in sorted(channels):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid_gpu, "tid": CHANNEL_TID + int(c),
                     "args": {"name": f"NCCL ch {int(c)} (plugin)"}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid_gpu, "tid": CHANNEL_TID + int(c),
                     "args": {"sort_index": CHANNEL_TID + int(c)}})
    return meta


def events(dump, matched, host_offset_us: float, gpu_offset_us: float, pid_gpu, pid_host,
           gpu_base_ns: int | None = None) -> list[dict]:
    """Chrome events of the ``matched`` collectives (:func:`kit.nccl_profiler.align.align`'s frame, or every
    collective of :func:`collectives` with offsets of your choosing) and their groups: host events shifted by
    ``host_offset_us``, channel events at ``gpu_ns / 1000 + gpu_offset_us`` -- or, exactly, at ``(gpu_ns -
    gpu_base_ns) / 1000 + gpu_offset_us`` when ``gpu_base_ns`` is given (an Alignment's ``gpu_base_ns`` and
    ``gpu_rel_offset_us``)."""
    from .align import rel_us

    ev = dump.events
    if not len(matched):
        return []
    groups, colls = set(matched["group"].astype(int)), set(matched["coll_idx"].astype(int))
    out: list[dict] = []
    host = ev[ev["group"].isin(groups) & (ev["cat"] != "GPU")]
    if host_offset_us != host_offset_us:  # no KernelLaunch events (event mask without 2048): no host clock
        host = host.iloc[0:0]
    for row in host.to_dict("records"):
        tid = HOST_TID if row["cat"] in HOST_CATS else PROXY_TID
        name = row["name"] if row["cat"] not in ("COLL", "P2P") else f"{row['name']} (NCCL task)"
        out.append(_slice(name, f"nccl_{row['cat'].lower()}", pid_host, tid, row["ts"] + host_offset_us,
                          row["end"] + host_offset_us, _args(row)))
    if len(host):  # the proxy thread's own states (top level) during these groups
        lo, hi = np.nanmin(host[["ts", "end"]].to_numpy()), np.nanmax(host[["ts", "end"]].to_numpy())
        ctrl = ev[(ev["group"] == -1) & (ev["cat"] == "PROXY") & (ev["end"] >= lo) & (ev["ts"] <= hi)]
        for row in ctrl.to_dict("records"):
            out.append(_slice(row["name"], "nccl_proxy_ctrl", pid_host, PROXY_TID, row["ts"] + host_offset_us,
                              row["end"] + host_offset_us, {}))
    ch = ev[ev["coll"].isin(colls) & (ev["cat"] == "GPU")]
    if len(ch):
        if gpu_base_ns is None:
            base = int(ch["start_gpu_ns"].dropna().astype("uint64").min())
            shift = base / 1e3 + gpu_offset_us
        else:
            base, shift = int(gpu_base_ns), gpu_offset_us
        start = rel_us(ch["start_gpu_ns"], base) + shift
        stop = rel_us(ch["stop_gpu_ns"], base) + shift
        last = dict(zip(matched["coll_idx"].astype(int), matched["gpu_stop"]))
        names = dict(zip(ev["idx"].astype(int), ev["name"]))
        for row, s, e in zip(ch.to_dict("records"), start, stop):
            a = _args(row)
            coll = int(row["coll"])
            a.update({"collective": names.get(coll), "seq": matched.loc[matched["coll_idx"] == coll, "seq"].iloc[0]})
            a["seq"] = int(a["seq"]) if a["seq"] == a["seq"] else None
            if e != e:
                e = last.get(coll, np.nan)
                a["stop"] = "not recorded by NCCL for this channel: drawn to the collective's last recorded stop"
            out.append(_slice(f"{names.get(coll)} ch{row['channel']}", "nccl_channel", pid_gpu,
                              CHANNEL_TID + int(row["channel"]), s, e, a))
    return out


def standalone(dump, pid_host: int, pid_gpu: int) -> list[dict]:
    """Every event of one dump on its own clocks (no Kineto trace to align with): host events at the plugin's
    µs, channel events at the GPU timer's µs since its first stamp, shifted to start with the host events."""
    from .align import rel_us
    from .dump import collectives

    c = collectives(dump)
    if not len(c):
        return []
    first_gpu = c["gpu_start_ns"].dropna()
    gpu_off = 0.0
    if len(first_gpu):
        base = int(first_gpu.astype("uint64").min())
        first = c.loc[c["gpu_start_ns"] == base, "launch_end"].astype("float64")
        gpu_off = (float(first.iloc[0]) if len(first) and first.iloc[0] == first.iloc[0] else 0.0) - base / 1e3
    c["gpu_stop"] = rel_us(c["gpu_stop_ns"], base) + base / 1e3 + gpu_off if len(first_gpu) else np.nan
    return events(dump, c, 0.0, gpu_off, pid_gpu, pid_host) + thread_names(
        pid_gpu, pid_host, dump.events["channel"].dropna().unique())


def write_chrome(dumps, out) -> int:
    """The dumps as one Chrome trace on their own clocks (a host and a GPU process per dump); returns the
    number of events written. For NCCL's events beneath the Kineto kernels use ``kit trace merge``."""
    import gzip
    import json
    from pathlib import Path

    evs: list[dict] = []
    for i, d in enumerate(dumps):
        host, gpu = 2 * i + 1, 2 * i + 2
        for pid, what in ((host, "host, plugin clock"), (gpu, "GPU channels, GPU timer")):
            evs.append({"ph": "M", "name": "process_name", "pid": pid,
                        "args": {"name": f"rank {d.rank} comm {d.comm} ({what})"}})
        evs += standalone(d, host, gpu)
    out = Path(out)
    data = json.dumps({"traceEvents": evs, "displayTimeUnit": "ms",
                       "kit": {"sources": [str(d.path) for d in dumps], "clock": "the plugin's own"}}).encode()
    with (gzip.open(out, "wb") if out.suffix == ".gz" else open(out, "wb")) as f:
        f.write(data)
    return len(evs)
