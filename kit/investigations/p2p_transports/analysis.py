"""The tables and findings of p2p_transports, from the rows of any runs (:class:`kit.results.RunSet` or a
DataFrame): GPU runs, CPU (gloo) runs, old recorded runs, or nothing -- a table without its rows is empty, the
findings say only what the rows show.

Time per message is the slowest participant of each barrier-aligned sample, median over samples
(:func:`kit.stats.slowest_rank_stats`); bandwidth is ``bytes / time`` per direction (:func:`kit.stats.gbps`;
``total_gbps`` counts both directions). Comparisons find their reference by capability: besides ``vs copy_ loop``
the 256 MiB tables have a ``vs <name>`` column for the in-process copy-engine transport (``vs copy``).
"""

from __future__ import annotations

import math

import pandas as pd

from ... import stats, traces, transports
from ...contract import Observation
from .bandwidth import AT, BARE, BESIDE, FLOOR_COPY, FLOOR_EVENTS, LOCAL, REFERENCES

_human = stats.human_bytes


def frame(data) -> pd.DataFrame:
    """The rows of a RunSet (``.df``) or a DataFrame."""
    df = getattr(data, "df", data)
    return df if df is not None else pd.DataFrame()


def rows_of(df: pd.DataFrame, *kinds: str) -> pd.DataFrame:
    """The rows of the given kinds (none when the rows have no ``kind`` column)."""
    if df is None or df.empty or "kind" not in df.columns:
        return pd.DataFrame()
    return df[df["kind"].isin(kinds)]


def _ordered(names) -> list[str]:
    """Transport names in registry order (the reference row last), unknown names after."""
    reg = transports.names()
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda t: (t in REFERENCES, REFERENCES.index(t) if t in REFERENCES else 0,
                                        reg.index(t) if t in reg else len(reg), str(t)))


def _per_transport(d: pd.DataFrame):
    """(transport, its rows) in registry order."""
    return [(t, d[d["transport"] == t]) for t in _ordered(d["transport"])]


def copy_engine_reference(names) -> str | None:
    """The in-process copy-engine transport among ``names`` (what the other transports are compared with)."""
    for t in _ordered(names):
        c = transports.capabilities(t)
        if c is not None and c.in_process and c.copy_engine:
            return t
    return None


# ------------------------------------------------------------------------------------------------ tables
def bandwidth(data) -> pd.DataFrame:
    """Per (label, kind, transport, direction, src, dst, bytes): time per message statistics (slowest
    participant per sample), ``gbps`` per direction and ``total_gbps`` over both directions."""
    d = rows_of(frame(data), "bandwidth", "matrix")
    if d.empty or "time_us" not in d.columns:
        return pd.DataFrame()
    keys = [k for k in ("label", "kind", "transport", "direction", "src", "dst", "bytes") if k in d.columns]
    s = stats.slowest_rank_stats(d, keys)
    s["gbps"] = stats.gbps(s["bytes"], s["time_us_median"])
    s["total_gbps"] = s["gbps"] * s["direction"].map({"one": 1, "both": 2})
    s.loc[s["transport"] == LOCAL, "total_gbps"] = s["gbps"]  # a copy inside each GPU: no second direction
    return s.sort_values(keys).reset_index(drop=True)


def at_size(data, nbytes: int = AT, direction: str = "one", spread: bool = False) -> pd.DataFrame:
    """GB/s per transport at ``nbytes`` (the largest measured size at or below it), indexed by transport;
    ``spread``: also each time's p10 and p90 over the samples."""
    b = bandwidth(data)
    if b.empty:
        return b
    b = b[(b["kind"] == "bandwidth") & (b["direction"] == direction)]
    size = b.loc[b["bytes"] <= nbytes, "bytes"].max()
    if b.empty or pd.isna(size):
        return pd.DataFrame()
    cols = ["bytes", "time_us_median", "gbps", "total_gbps"] + (["time_us_p10", "time_us_p90"] if spread else [])
    t = b[b["bytes"] == size].set_index("transport")[cols]
    return t.loc[_ordered(t.index)]


def at_256mib(direction: str):
    """Table: :func:`at_size` at 256 MiB with the ratios to the bare ``copy_`` loop and to the in-process
    copy-engine transport."""

    def table(data) -> pd.DataFrame:
        t = at_size(data, AT, direction)
        if t.empty:
            return t
        if BARE in t.index:
            t[f"vs {BARE}"] = t["gbps"] / t.loc[BARE, "gbps"]
        ref = copy_engine_reference(t.index)
        if ref is not None:
            t[f"vs {ref}"] = t["gbps"] / t.loc[ref, "gbps"]
        return t.assign(**{c: t[c].where(t.index != LOCAL) for c in t.columns if c.startswith("vs ")})  # a local copy

    table.__name__ = f"at_256mib_{direction}"
    return table


def copy_out_limit(both: pd.DataFrame) -> dict | None:
    """What a buffered receive's copy-out leaves a transport both ways at most, from one run's :func:`at_size`
    table both ways (indexed by transport): ``limit`` = copy's round / the round of :data:`.bandwidth.BESIDE`
    (copy both ways with a local ``copy_`` of the message beside it on each receiving GPU, timed in turn with copy's
    own rounds); ``copy_us``, ``beside_us`` the two medians; ``slowdown`` = beside / copy - 1; ``copy_p90``,
    ``beside_p10`` where the table has the spread (:func:`at_size` with ``spread``), else NaN. None without both rows.

    Why it is a limit: a transport that receives into a mailbox and copies each message out on the receiving GPU
    moves the same bytes over the same link as ``copy`` and, in the same round, reads and writes them once more in
    that GPU's memory. At best the copy-out hides entirely under the link, and then its round is the link's round
    with that traffic beside it: ``beside_us``. It assumes (1) the copy-out's traffic is the local ``copy_``'s (the
    message read and written once; it is, with ``copy_`` doing both); (2) the link loses the same time whether those
    bytes pass in one local copy during the round or in pieces spread over it (the same bytes in the same round);
    (3) the cross-process transport's copies use the link as ``copy``'s do (copy engines, peer writes). What it
    leaves out makes the true limit lower, never higher: the part of the copy-out that cannot overlap (the last
    piece's, copied after it arrives) and the transport's own protocol."""
    ref = copy_engine_reference([t for t in both.index if t not in REFERENCES]) if len(both) else None
    if ref is None or BESIDE not in both.index:
        return None
    c, b = float(both.loc[ref, "time_us_median"]), float(both.loc[BESIDE, "time_us_median"])
    q = {k: float(both.loc[t, f"time_us_{p}"]) if f"time_us_{p}" in both.columns else float("nan")
         for k, t, p in (("copy_p90", ref, "p90"), ("beside_p10", BESIDE, "p10"))}
    return dict(reference=ref, copy_us=c, beside_us=b, slowdown=b / c - 1, limit=c / b, bytes=int(both.loc[BESIDE, "bytes"]),
                **q)


def latency(data) -> pd.DataFrame:
    """One way, at the smallest measured size: time per message per transport, and (when the runs have the
    bare ``copy_`` loop) its ratio to that loop's."""
    b = bandwidth(data)
    if b.empty:
        return b
    b = b[(b["kind"] == "bandwidth") & (b["direction"] == "one")]
    if b.empty:
        return pd.DataFrame()
    t = b[b["bytes"] == b["bytes"].min()].set_index("transport")
    t = t.loc[_ordered(t.index), ["bytes", "time_us_median", "time_us_p10", "time_us_p90"]]
    if BARE in t.index:
        t["vs_copy_loop"] = t["time_us_median"] / t.loc[BARE, "time_us_median"]
    if FLOOR_COPY in t.index:
        t["vs_floor"] = t["time_us_median"] / t.loc[FLOOR_COPY, "time_us_median"]
    return t


def matrix(data, transport: str, direction: str = "one") -> pd.DataFrame:
    """src x dst GB/s (per direction) at the matrix size for ``transport`` (empty with two endpoints); ``both``:
    the pair both ways at once, shown in both cells of the pair."""
    b = _matrix_rows(data)
    if b.empty:
        return b
    b = b[(b["transport"] == transport) & (b["direction"] == direction)]
    return b.pivot(index="src", columns="dst", values="gbps") if len(b) else pd.DataFrame()


def _matrix_rows(data) -> pd.DataFrame:
    """The matrix rows of :func:`bandwidth`, a both-ways pair also under its reversed (src, dst)."""
    b = bandwidth(data)
    if b.empty or not (b["kind"] == "matrix").any():
        return pd.DataFrame()
    b = b[b["kind"] == "matrix"]
    both = b[b["direction"] == "both"]
    return pd.concat([b, both.assign(src=both["dst"], dst=both["src"])], ignore_index=True)


def matrices(data) -> pd.DataFrame:
    """Table: every transport's GPU-pair matrix, one way and both ways at once (rows: transport, direction,
    source; columns: destination; GB/s per direction)."""
    b = _matrix_rows(data)
    if b.empty:
        return b
    return b.pivot_table(index=["transport", "direction", "src"], columns="dst", values="gbps")


def comm_comm(data) -> pd.DataFrame:
    """Per (transport, scenario, mode, flow): completion time of the flow (slowest participant per sample);
    ``flow_name`` says its size."""
    d = rows_of(frame(data), "comm_comm")
    if d.empty:
        return pd.DataFrame()
    keys = [k for k in ("label", "transport", "scenario", "mode", "flow", "bytes") if k in d.columns]
    s = stats.slowest_rank_stats(d, keys)
    s["flow_name"] = [f"flow {int(f)} ({_human(int(n))})" for f, n in zip(s["flow"], s["bytes"])]
    return s


def comm_compute(data) -> pd.DataFrame:
    """Per transport: compute alone / comm alone / overlapped (median over samples of the slowest rank), the
    compute slowdown under overlap (per device, worst device) and the overlapped total vs the serial sum."""
    d = rows_of(frame(data), "comm_compute")
    if d.empty:
        return pd.DataFrame()
    rows = []
    for t, g in _per_transport(d):

        def med(phase, col):  # per sample the slowest device/rank, then the median over samples
            return stats.per_sample(g[g["phase"] == phase], [], value=col)[col].median()

        by = "device" if "device" in g.columns else "rank"
        comp_alone = g[g["phase"] == "compute"].groupby(by)["compute_us"].median()
        comp_over = g[g["phase"] == "overlapped"].groupby(by)["compute_us"].median()
        c, m, o = med("compute", "total_us"), med("comm", "total_us"), med("overlapped", "total_us")
        rows.append(dict(transport=t, compute_alone_us=c, comm_alone_us=m, overlapped_us=o, serial_sum_us=c + m,
                         overlapped_vs_serial=o / (c + m), compute_slowdown=(comp_over / comp_alone).max(),
                         comm_in_overlap_us=med("overlapped", "comm_us"),
                         compute_in_overlap_us=med("overlapped", "compute_us")))
    return pd.DataFrame(rows)


def semantics(data) -> pd.DataFrame:
    """Per (transport, api, role, bytes): median host time in the call, in wait(), until done; stream time;
    how late this rank's receive was posted (``delay_ms``) and its peer's (``peer_delay_ms``)."""
    d = rows_of(frame(data), "semantics")
    if d.empty:
        return pd.DataFrame()
    keys = ["transport", "api", "role", "bytes"]
    cols = [c for c in ("call_us", "wait_us", "done_us", "device_us", "delay_ms", "peer_delay_ms") if c in d.columns]
    s = d.groupby(keys, sort=False)[cols].median().reset_index()
    s["bytes"] = s["bytes"].astype("int64")
    return s


def skipped(data) -> pd.DataFrame:
    """Transports (or one experiment of a transport) that could not run, with the reason."""
    d = rows_of(frame(data), "skipped")
    if d.empty:
        return pd.DataFrame()
    d = d.assign(experiment=d["experiment"] if "experiment" in d.columns else None)
    d["experiment"] = d["experiment"].fillna("all")
    return d[["transport", "experiment", "reason"]].drop_duplicates().reset_index(drop=True)


def topology(runs) -> pd.DataFrame:
    """The GPU connection matrix (NVML, as ``nvidia-smi topo -m``) of the first analysed run with GPUs."""
    for meta in getattr(runs, "metas", []):
        si = meta.get("sysinfo") or {}
        if si.get("topology") and si.get("gpus"):
            names = [f"GPU{g['index']}" for g in si["gpus"]]
            return pd.DataFrame(si["topology"], index=names, columns=names)
    return pd.DataFrame()


def trace_events(run_dir, transport: str) -> pd.DataFrame:
    """GPU events of the profiled overlapped iteration of ``transport``, every rank's trace together."""
    return _events(traces.find_traces(run_dir, experiment="comm_compute", transport=transport))


def _events(files, frame=None) -> pd.DataFrame:
    """Every rank's events of one profiled iteration: ``frame(trace)`` of each parsed trace (default: its GPU
    frame) with ``rank``; an unreadable trace is named and left out."""
    frames = []
    for f in files:
        try:
            t = traces.load_trace(f.path)
        except traces.TraceError as e:  # a truncated trace: say so, analyse the others
            print(f"{f.path}: unreadable trace ({e})")
            continue
        ev = frame(t) if frame is not None else t.gpu
        if len(ev):
            frames.append(ev.assign(rank=f.rank))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def traced(runs, experiment: str = "comm_compute", by: tuple[str, ...] = ("transport",), frame=None) -> dict:
    """{tags: events} (:func:`_events`) for every set of ``by`` tags with a profiled iteration of ``experiment``,
    from the first run that has any, in transport (registry) order; the key is the transport alone when ``by``
    is only the transport."""
    for d in getattr(runs, "dirs", []):
        files = traces.find_traces(d, experiment=experiment)
        keys = list(dict.fromkeys(tuple(f.tags.get(k) for k in by) for f in files))
        order = _ordered(k[0] for k in keys)
        keys.sort(key=lambda k: order.index(k[0]))
        ev = {k if len(by) > 1 else k[0]: _events([f for f in files if tuple(f.tags.get(x) for x in by) == k], frame)
              for k in keys}
        ev = {k: e for k, e in ev.items() if len(e)}
        if ev:
            return ev
    return {}


# ------------------------------------------------------------------------------------------------ findings
def findings(data) -> list[Observation]:
    """What the rows show, one statement each (the old notebook's closing cell, measured)."""
    df = frame(data)
    out: list[Observation] = []
    for t, r in at_size(df, AT, "one").iterrows():
        if t in (FLOOR_COPY, FLOOR_EVENTS):  # per-message floors: meaningful at the smallest size only
            continue
        out.append(Observation(f"bandwidth.one.{t}", f"{t}: {_human(int(r.bytes))} one way: {r.gbps:.1f} GB/s",
                               float(r.gbps), "GB/s"))
    both = at_size(df, AT, "both")
    for t, r in both.iterrows():
        if t == LOCAL:  # a copy inside each GPU beside the cross-process points: what a copy-out costs alone
            out.append(Observation(f"bandwidth.both.{t}", f"a copy of {_human(int(r.bytes))} inside one GPU (a buffered "
                                   f"receive's copy-out, alone): {r.time_us_median:.1f} us, {2 * r.gbps / 1e3:.2f} TB/s "
                                   "of memory reads + writes", float(r.time_us_median), "us"))
            continue
        if t == BESIDE and (lim := copy_out_limit(both)) is not None:
            out.append(Observation(f"bandwidth.both.{t}", f"{lim['reference']} both ways with a local copy_ of the "
                                   f"message beside it on each receiving GPU (a buffered receive's copy-out traffic): "
                                   f"{lim['beside_us']:.1f} us per round against {lim['copy_us']:.1f} alone "
                                   f"({100 * lim['slowdown']:+.1f}%): a transport that copies out what it receives "
                                   f"reaches at most {lim['limit']:.3f}x {lim['reference']} both ways here",
                                   lim["limit"], "x"))
            continue
        out.append(Observation(f"bandwidth.both.{t}", f"{t}: {_human(int(r.bytes))} each way at once: "
                                                  f"{r.total_gbps:.1f} GB/s total ({r.time_us_median:.1f} us per round)",
                               float(r.total_gbps), "GB/s"))
    for r in comm_compute(df).itertuples():
        out.append(Observation(f"comm_compute.{r.transport}.overlapped_vs_serial",
                               f"{r.transport}: compute + transfers overlapped {r.overlapped_us / 1e3:.2f} ms vs "
                               f"serial sum {r.serial_sum_us / 1e3:.2f} ms ({r.overlapped_vs_serial:.2f}); compute slowed "
                               f"{r.compute_slowdown:.3f}x", float(r.overlapped_vs_serial)))
        out.append(Observation(f"comm_compute.{r.transport}.comm_in_overlap_ms",
                               f"{r.transport}: transfers {r.comm_alone_us / 1e3:.2f} ms alone, "
                               f"{r.comm_in_overlap_us / 1e3:.2f} ms overlapped with compute",
                               float(r.comm_in_overlap_us / 1e3), "ms"))
    lat = latency(df)
    if FLOOR_COPY in lat.index:
        ev = f", {FLOOR_EVENTS} {lat.loc[FLOOR_EVENTS, 'time_us_median']:.1f} us" if FLOOR_EVENTS in lat.index else ""
        out.append(Observation("latency.floor", f"the CUDA floor at {_human(int(lat['bytes'].iloc[0]))} one way: "
                               f"{FLOOR_COPY} {lat.loc[FLOOR_COPY, 'time_us_median']:.1f} us per message{ev}",
                               float(lat.loc[FLOOR_COPY, "time_us_median"]), "us"))
    for t, r in lat.iterrows() if "vs_copy_loop" in lat.columns else []:
        if t not in REFERENCES:
            floor = (f", {r.vs_floor:.2f}x the CUDA floor ({FLOOR_COPY} {lat.loc[FLOOR_COPY, 'time_us_median']:.1f} us)"
                     if "vs_floor" in lat.columns and r.vs_floor == r.vs_floor else "")
            out.append(Observation(f"latency.{t}", f"{t}: {_human(int(r.bytes))} one way {r.time_us_median:.1f} us per "
                                               f"message, {r.vs_copy_loop:.2f}x the bare copy_ loop's "
                                               f"{lat.loc[BARE, 'time_us_median']:.1f} us{floor}", float(r.vs_copy_loop)))
    out += _semantics_findings(df)
    cc = comm_comm(df)
    for (t, sc, mode), g in cc.groupby(["transport", "scenario", "mode"], sort=False) if len(cc) else []:
        f = g.set_index("flow")["time_us_median"]
        f0, f1 = f.get(0, math.nan), f.get(1, math.nan)
        out.append(Observation(f"comm_comm.{t}.{sc}.{mode}", f"{t} {sc} {mode}: flow 0 done at {f0:.1f} us, "
                                                          f"flow 1 at {f1:.1f} us", float(f1), "us"))
    for r in skipped(df).itertuples():
        what = "" if r.experiment == "all" else f" ({r.experiment})"
        out.append(Observation(f"skipped.{r.transport}" + ("" if r.experiment == "all" else f".{r.experiment}"),
                               f"{r.transport}{what} not measured: {r.reason}"))
    return out


def _semantics_findings(df) -> list[Observation]:
    se = semantics(df)
    out = []
    for r in se[se["role"] != "recv"].itertuples() if len(se) else []:
        late = getattr(r, "peer_delay_ms", 0.0)
        late = f" (receiver {late:g} ms late)" if late and late > 0 else ""
        out.append(Observation(f"semantics.{r.transport}.{r.api}.{int(r.bytes)}",
                               f"{r.transport} {r.api} {_human(int(r.bytes))}: host in call {r.call_us:.1f} us, in wait "
                               f"{r.wait_us:.1f} us, until done {r.done_us / 1e3:.2f} ms{late}", float(r.call_us), "us"))
    return out


TABLES = {"skipped": skipped, "topology": topology, "bandwidth": bandwidth, "at_256mib_one": at_256mib("one"),
          "at_256mib_both": at_256mib("both"), "latency": latency, "matrix": matrices, "comm_comm": comm_comm,
          "comm_compute": comm_compute, "semantics": semantics}
