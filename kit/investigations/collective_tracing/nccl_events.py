"""What NCCL's own events (its profiler plugin, :mod:`kit.nccl_profiler`) add to the traced collectives.

Read from the run directories: each rank's plugin dump (``nccl_profiler_<commHash>_<rank>.json.gz``) aligned
with that rank's Kineto trace of each part (``trace_part=<part>_rank<r>.json.gz``): a dump holds both parts and
the cost timings, and the alignment keeps the collectives of the part's traced steps (those that match a
kernel of its trace). Runs without dumps (any run made without ``nccl_profiler``) fall back to the recorded
runs with them (the set ``collective_tracing@nccl-profiler`` of kit.results.RECORDED_SETS), the way the FR table
falls back to its demo run.

Per collective, the phases on one clock (the Kineto trace's; µs):

* ``api_to_launch_us``  -- NCCL's Group API call until its kernel launch returned (host: NCCL enqueue + launch)
* ``launch_to_gpu_us``  -- the launch returned until the first channel ran on the GPU (queue + start latency)
* ``channels_us``       -- first channel start until the last channel stop NCCL recorded (the transfer, and
  any wait for a peer: a channel cannot finish before the peer's data arrived)
* ``tail_us``           -- that stop until the kernel's end in Kineto (the kernel's exit)

and ``task_host_us``, NCCL's task event (COLL) on the host: for a collective without proxy events (intranode,
as here) it spans the CPU's launch of the collective, not its completion (``ext-profiler/example/README.md``).
``launch_to_gpu_us`` includes the time the kernel waits in its stream behind earlier work (the TP forward's
matmuls): the host runs ahead of the GPU.

**The network proxy** (:func:`proxy_table`): where a collective crosses a network transport -- across nodes,
or across the emulated nodes of one host (:mod:`kit.launch.emulated`) -- NCCL's proxy thread moves the data,
and the plugin records, under each channel of the collective, one ProxyOp per peer and direction
(``ScheduleSend``/``ProgressSend``, ``ScheduleRecv``/``ProgressRecv``: channel, peer, steps, chunk size,
bytes) and one ProxyStep per network transfer (``step``) in its states (NCCL ``ext-profiler/README.md``,
v2.28.9-1): send ``SendGpuWait`` (waiting for the GPU to produce the step's data), ``SendPeerWait`` (waiting
for the receiver's clear-to-send credit), ``SendWait`` (the network send in flight); receive ``RecvWait`` (the
data on its way from the network), ``RecvFlushWait`` (flushing it to the GPU), ``RecvGpuWait`` (the GPU
consuming it). A channel keeps up to ``NCCL_STEPS`` = 8 steps in flight (``src/include/device.h``), so the
states of consecutive steps overlap: a step's ``RecvWait`` includes the steps queued before it, and the per-step
times do not add up to the kernel's. The example plugin keeps the last 1024 steps per collective
(``MAX_STEPS``, its ``event.h``).
Runs without such events fall back to the recorded emulated-nodes run (``collective_tracing@nccl-profiler-emulated``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ... import plot, results, stats, traces
from ...contract import Observation
from ...nccl_profiler import align as al
from ...nccl_profiler import dump as ncd

RECORDED_SET = "collective_tracing@nccl-profiler"
"""the recorded runs with the plugin (off and on) that runs without it fall back to (kit.results.RECORDED_SETS)"""
DTYPE_BYTES = {"ncclInt8": 1, "ncclUint8": 1, "ncclFloat8e4m3": 1, "ncclFloat8e5m2": 1, "ncclFloat16": 2,
               "ncclBfloat16": 2, "ncclInt32": 4, "ncclUint32": 4, "ncclFloat32": 4, "ncclInt64": 8,
               "ncclUint64": 8, "ncclFloat64": 8}
PHASES = ("api_to_launch_us", "launch_to_gpu_us", "channels_us", "tail_us")
PARTS = ("ddp", "tp")


def with_dumps(runs) -> "results.RunSet":
    """``runs`` when one of them holds plugin dumps (with the plugin-off launch of the same comparison beside
    it); else, for runs on NCCL (GPUs) made without the plugin, the recorded runs of
    ``collective_tracing@nccl-profiler`` (kit.results.RECORDED_SETS); for CPU (gloo) runs, none: gloo has no NCCL."""
    if any(ncd.find_dumps(d) for d in runs.dirs):
        return runs
    if not runs.cuda:
        return results.RunSet([], "no NCCL runs")
    return results.choose("collective_tracing", None, "recorded", set_name=RECORDED_SET)


def _dump_dirs(runs) -> list[Path]:
    return [d for d in with_dumps(runs).dirs if ncd.find_dumps(d)]


def files_stamp(files) -> tuple:
    """What changes when any of ``files`` is rewritten (its size and mtime, per file): a cached answer of older
    files is not reused. A run directory's stamp is that of its traces (``d.glob("*.json.gz")``)."""
    out = []
    for f in sorted(Path(x) for x in files):
        try:
            st = f.stat()
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((None, None))
    return tuple(out)


@lru_cache(maxsize=16)
def _aligned(run_dir: str, stamp: tuple):
    """``(collectives, alignment)`` of one run: every matched collective of every part and rank, and one
    alignment record per (part, rank)."""
    import pandas as pd

    d = Path(run_dir)
    label = results.run_label(results.read_meta(d)) or d.name
    dumps, recs = [], []
    for f in ncd.find_dumps(d):  # one unreadable dump (a rank that gave up on its teardown writes none or half
        try:                     # of one) is a note row; the other ranks are still shown
            dumps.append(ncd.read_dump(f))
        except ncd.DumpError as e:
            recs.append({"label": label, "part": "", "rank": None, "error": str(e)})
    frames = []
    for part in PARTS:
        for f in traces.find_traces(d, part=part):
            t = traces.load_trace(f.path)
            rank = t.info.rank if t.info.rank is not None else -1
            kernels = al.kineto_nccl_kernels(t)
            for dump in (x for x in dumps if x.rank == rank):
                a, m = al.align(ncd.collectives(dump), kernels, rank)
                recs.append({"label": label, "part": part, **a.to_json()})
                if len(m):
                    frames.append(m.assign(label=label, part=part, run=d.name))
    cols = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return cols, pd.DataFrame(recs)


def _all(runs):
    import pandas as pd

    got = [_aligned(str(d), files_stamp(d.glob("*.json.gz"))) for d in _dump_dirs(runs)]
    cols = pd.concat([g[0] for g in got if len(g[0])], ignore_index=True) if any(len(g[0]) for g in got) else pd.DataFrame()
    recs = pd.concat([g[1] for g in got if len(g[1])], ignore_index=True) if any(len(g[1]) for g in got) else pd.DataFrame()
    return cols, recs


def collectives_table(runs):
    """One row per traced collective and rank with NCCL's choices and the phases (module docstring)."""
    import pandas as pd

    c, _ = _all(runs)
    if c.empty:
        return pd.DataFrame(columns=["part", "rank", "name", "seq", "bytes", "algorithm", "protocol", "n_channels",
                                     "kernel", "kernel_us", *PHASES])
    out = pd.DataFrame({
        "label": c["label"], "run": c["run"], "part": c["part"], "rank": c["rank"], "name": c["name"], "seq": c["seq"],
        "bytes": c["count"].astype("float64") * c["datatype"].map(DTYPE_BYTES).astype("float64"),
        "datatype": c["datatype"], "algorithm": c["algorithm"], "protocol": c["protocol"],
        "n_channels": c["n_channels"], "channels_seen": c["channels_seen"],
        "kernel": c["kernel"].str.replace(r"\(.*", "", regex=True), "kernel_us": c["kernel_end"] - c["kernel_ts"],
        "api_to_launch_us": c["launch_end"] - c["group_ts"], "launch_to_gpu_us": c["gpu_start"] - c["launch_end"],
        "channels_us": c["gpu_stop"] - c["gpu_start"], "tail_us": c["kernel_end"] - c["gpu_stop"],
        "task_host_us": c["coll_end"] - c["coll_ts"], "channel_skew_us": c["channel_skew_us"].astype("float64"),
        "gpu_start": c["gpu_start"]})
    if out["label"].nunique() <= 1:
        out = out.drop(columns="label")
    return out.reset_index(drop=True)


def summary_table(runs):
    """Per part, collective, size and NCCL's choice: how many, and the median of each phase."""
    import pandas as pd

    t = collectives_table(runs)
    if t.empty:
        return pd.DataFrame()
    keys = [k for k in ("label", "part", "name", "bytes", "algorithm", "protocol", "n_channels", "kernel") if k in t.columns]
    g = t.groupby(keys, dropna=False)
    s = g[["kernel_us", *PHASES, "task_host_us"]].median()
    s.insert(0, "n", g.size())
    return s.reset_index()


def alignment_table(runs):
    """Per run, part and rank: collectives matched between dump and trace, the two clock offsets and the
    alignment error (largest residual, µs) -- :mod:`kit.nccl_profiler.align`."""
    return _all(runs)[1]


def late_peer_table(runs, top: int = 5):
    """The collectives whose ranks' channels started furthest apart. The ranks' GPU clocks are put on one clock
    with the Kineto traces' offsets (:func:`kit.traces.clock_offsets`); per instance (part, collective, SeqNum,
    the same on every rank of the communicator): ``late_us`` -- how much later the last rank's channels
    started; ``early_channels_us`` vs ``late_channels_us`` -- the channel time of the first and the last rank to
    arrive: the early rank's extra channel time is where the wait shows."""
    import pandas as pd

    t = collectives_table(runs)
    if t.empty or t["rank"].nunique() < 2:
        return pd.DataFrame()
    rows = []
    for d in _dump_dirs(runs):
        for part in PARTS:
            paths = [f.path for f in traces.find_traces(d, part=part)]
            if len(paths) < 2:
                continue
            offs = traces.clock_offsets(paths)
            q = t[(t["part"] == part) & (t["run"] == d.name)]
            q = q.assign(start=q["gpu_start"] + q["rank"].map(offs).astype("float64"))
            for (name, seq), g in q.groupby(["name", "seq"]):
                if g["rank"].nunique() < 2:
                    continue
                early, late = g.loc[g["start"].idxmin()], g.loc[g["start"].idxmax()]
                rows.append({"run": d.name, "part": part, "name": name, "seq": int(seq), "bytes": early["bytes"],
                             "late_rank": int(late["rank"]), "late_us": late["start"] - early["start"],
                             "early_channels_us": early["channels_us"], "late_channels_us": late["channels_us"],
                             "early_launch_to_gpu_us": early["launch_to_gpu_us"],
                             "early_kernel_us": early["kernel_us"]})
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).sort_values("late_us", ascending=False).head(top).reset_index(drop=True)


def cost_table(runs):
    """The plugin's cost: per step part or all_reduce size, the median time per call (slowest rank per sample)
    with the plugin off (not loaded: the ``NCCL_PROFILER_PLUGIN=none`` launch), idle (loaded, events off) and
    on (every event of the mask), ``on_vs_idle`` (same process, back to back: the events' cost) and
    ``on_vs_off`` (two launches: also what differs between launches), and ``on_iqr_us`` (the spread of the
    'on' samples) to read them against."""
    import pandas as pd

    df = runs.df
    if df.empty or "kind" not in df.columns or not (df["kind"] == "nccl_cost").any():
        df = with_dumps(runs).df
    if df.empty or "kind" not in df.columns:
        return pd.DataFrame()
    q = df[df["kind"] == "nccl_cost"].copy()
    if q.empty:
        return pd.DataFrame()
    q["what"] = q["what"].where(q["what"] != "step", "step " + q["part"].astype(str))
    q["bytes"] = pd.to_numeric(q.get("bytes"), errors="coerce")
    # the slowest rank per sample, then the median over samples
    per = q.groupby(["what", "bytes", "plugin", "sample"], dropna=False)["time_us"].max().reset_index()
    med = per.groupby(["what", "bytes", "plugin"], dropna=False)["time_us"].median().unstack("plugin")
    for c in ("off", "idle", "on"):
        if c not in med.columns:
            med[c] = float("nan")
    med = med[["off", "idle", "on"]].rename(columns=lambda c: f"{c}_us")
    on = per[per["plugin"] == "on"].groupby(["what", "bytes"], dropna=False)["time_us"]
    med["on_iqr_us"] = on.quantile(0.75) - on.quantile(0.25)
    med["on_minus_idle_us"] = med["on_us"] - med["idle_us"]
    med["on_vs_idle"] = med["on_us"] / med["idle_us"]
    med["on_vs_off"] = med["on_us"] / med["off_us"]
    return med.reset_index().sort_values(["what", "bytes"]).reset_index(drop=True)


# ------------------------------------------------------------------------------------------------ network proxy
EMULATED_SET = "collective_tracing@nccl-profiler-emulated"
"""the collective_tracing run on 2 emulated nodes (NCCL NET/Socket) with every event on (kit.results.RECORDED_SETS)"""
SEND_STATES = ("SendGpuWait", "SendPeerWait", "SendWait")
RECV_STATES = ("RecvWait", "RecvFlushWait", "RecvGpuWait")


def proxy_runs(runs) -> "results.RunSet":
    """``runs`` when a dump of theirs holds proxy steps; else the recorded emulated-nodes run with them."""
    if any(_has_steps(f) for d in runs.dirs for f in ncd.find_dumps(d)):
        return runs
    return results.choose("collective_tracing", None, "recorded", set_name=EMULATED_SET)


def _has_steps(path) -> bool:
    return _dump_has_steps(str(path), files_stamp([path]))


@lru_cache(maxsize=64)
def _dump_has_steps(path: str, stamp: tuple) -> bool:
    try:
        return bool((ncd.read_dump(path).events["cat"] == "NET").any())
    except ncd.DumpError:
        return False


def proxy_table(runs):
    """One row per collective and rank that went through the network proxy: NCCL's choice, the proxy's
    operations and steps (``step_bytes``: bytes per step, median over the operations), ``proxy_us`` (first ScheduleSend/Recv to the last ProgressSend/Recv end), the
    median µs per step in each state (module docstring), and the part (ddp/tp, by the collective's type and
    SeqNum among the traced ones; ``other``: the warm-up, timed and cost-sweep calls) with ``kernel_us`` from
    the Kineto trace where it was traced; ``send_gbps``: a step's bytes over its median ``SendWait`` (the rate
    of one send in flight). ``proxy_us`` starts when the host posts the operation, so it also holds the wait
    for the kernel to start (in ``SendGpuWait``)."""
    import pandas as pd

    rows = [r for d in proxy_runs(runs).dirs if ncd.find_dumps(d)
            for r in _proxy_rows(str(d), files_stamp(d.glob("*.json.gz")), files_stamp(ncd.find_dumps(d)))]
    t = pd.DataFrame([dict(r) for r in rows])
    if len(t) and t["label"].nunique() <= 1:
        t = t.drop(columns="label")
    return t


@lru_cache(maxsize=16)
def _proxy_rows(run_dir: str, stamp: tuple, dump_stamps: tuple) -> tuple[dict, ...]:
    """:func:`proxy_table`'s rows of one run directory, read once per process (a notebook's tables, figure and
    findings of the network proxy all start from them; the dumps' size and mtime in the key: a rewritten dump
    is read again). The caller gets fresh rows: a table built from them cannot change the cached ones."""
    d = Path(run_dir)
    label = results.run_label(results.read_meta(d)) or d.name
    traced, _ = _aligned(run_dir, stamp)
    part = ({(int(r.rank), r.name, int(r.seq)): (r.part, r.kernel_end - r.kernel_ts) for r in traced.itertuples()}
            if len(traced) else {})  # NCCL numbers each collective type on its own (SeqNum)
    rows = []
    for f in ncd.find_dumps(d):
        try:
            dump = ncd.read_dump(f)
        except ncd.DumpError:
            continue  # named by nccl_findings (alignment_table)
        e = dump.events.assign(dur=lambda x: (x["end"] - x["ts"]).astype("float64"))
        sub = e[e["cat"].isin(["PROXY", "NET"]) & (e["depth"] >= 4)]
        colls = e.set_index("idx")
        for cidx, g in sub.groupby("coll"):
            c = colls.loc[cidx]
            if c.ndim == 2:  # a dump with a repeated idx gives a frame: its first event, as the scan before found
                c = c.iloc[0]
            ops = g[g["cat"] == "PROXY"]
            steps = g[g["cat"] == "NET"]
            seq = int(c["seq"])
            where, kernel_us = part.get((dump.rank, c["name"], seq), ("other", float("nan")))
            row = {"label": label, "part": where, "rank": dump.rank, "name": c["name"], "seq": seq,
                   "bytes": float(c["count"]) * DTYPE_BYTES.get(c["datatype"], float("nan")),
                   "algorithm": c["algorithm"], "protocol": c["protocol"], "n_channels": c["n_channels"],
                   "proxy_ops": int(ops["name"].str.startswith("Progress").sum()),
                   "send_steps": int((steps["name"] == "SendWait").sum()),
                   "recv_steps": int((steps["name"] == "RecvWait").sum()),
                   "step_bytes": float((ops["trans_size"].astype("float64") / ops["steps"].astype("float64")).median()),
                   "kernel_us": kernel_us,
                   "proxy_us": float(ops["end"].max() - ops["ts"].min())}
            med = steps.groupby("name")["dur"].median()
            row.update({f"{st}_us": float(med.get(st, float("nan"))) for st in SEND_STATES + RECV_STATES})
            row["send_gbps"] = row["step_bytes"] / row["SendWait_us"] / 1e3  # one step's bytes over its send
            rows.append(row)
    return tuple(rows)


def proxy_summary_table(runs):
    """Per part, collective, size and NCCL's choice: how many, and the medians of :func:`proxy_table`."""
    t = proxy_table(runs)
    if t.empty:
        return t
    keys = [k for k in ("label", "part", "name", "bytes", "algorithm", "protocol", "n_channels") if k in t.columns]
    vals = ["proxy_ops", "send_steps", "recv_steps", "step_bytes", "kernel_us", "proxy_us",
            *[f"{st}_us" for st in SEND_STATES + RECV_STATES], "send_gbps"]
    g = t.groupby(keys, dropna=False)
    s = g[vals].median()
    s.insert(0, "n", g.size())
    return s.reset_index()


def proxy_figure(runs):
    """Median µs per network step in each state, per (part, collective, size): send states on the left of
    each group, receive states on the right; log scale."""
    import matplotlib.pyplot as plt
    import numpy as np

    s = proxy_summary_table(runs)
    if s.empty:
        return plot.message("no proxy steps in these runs (they need a network transport: emulated or real nodes)",
                            runs.title)
    s = s.sort_values(["part", "name", "bytes"]).reset_index(drop=True)
    states = SEND_STATES + RECV_STATES
    fig, ax = plt.subplots(figsize=(9, 0.9 * len(s) + 1.5))
    y = np.arange(len(s))
    h = 0.8 / len(states)
    for i, st in enumerate(states):
        ax.barh(y + i * h, s[f"{st}_us"].clip(lower=0.1).fillna(0.1), height=h, label=st,
                hatch="//" if st.startswith("Recv") else None)
    ax.set_yticks(y + 0.4 - h / 2)
    ax.set_yticklabels([f"{r.part} {r.name} {stats.human_bytes(r.bytes, 3)}\n{r.protocol}, {r.n_channels} ch, "
                        f"{r.send_steps:.0f} send steps" for r in s.itertuples()], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("µs per step (median over steps, instances and ranks)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("The network proxy's steps (NCCL profiler ProxyStep events)\n" + proxy_runs(runs).title, fontsize=8)
    return fig


def proxy_findings(runs) -> list[Observation]:
    """How many proxy operations and steps the dumps hold, and for the largest traced collective where the
    time of a step goes."""
    s = proxy_summary_table(runs)
    if s.empty:
        return []
    t = proxy_table(runs)
    out = [Observation("nccl_proxy_events", f"network proxy: {int(t['proxy_ops'].sum())} proxy operations and "
                                        f"{int(t['send_steps'].sum() + t['recv_steps'].sum())} network steps "
                                        f"(send + receive) in {len(t)} collective instances x ranks",
                       float(t["send_steps"].sum() + t["recv_steps"].sum()), "steps")]
    q = s[s["part"] != "other"] if (s["part"] != "other").any() else s
    r = q.sort_values("bytes").iloc[-1]
    send = ", ".join(f"{st} {r[f'{st}_us']:.0f}" for st in SEND_STATES)
    recv = ", ".join(f"{st} {r[f'{st}_us']:.0f}" for st in RECV_STATES)
    out.append(Observation("nccl_proxy_steps",
                           f"{r['part']} {r['name']} {stats.human_bytes(r['bytes'], 3)} ({r['protocol']}, {int(r['n_channels'])} channels): "
                           f"{r['send_steps']:.0f} send + {r['recv_steps']:.0f} receive steps of {stats.human_bytes(r['step_bytes'], 3)} "
                           f"per rank, from posting to the last step {r['proxy_us'] / 1e3:.2f} ms (kernel "
                           f"{r['kernel_us'] / 1e3:.2f} ms); µs per step (median): send {send}; receive {recv}; one send in "
                           f"flight moves {r['send_gbps']:.1f} GB/s", float(r["proxy_us"]), "µs"))
    return out


# ------------------------------------------------------------------------------------------------ figures
def phases_figure(runs):
    """Median of each phase per traced collective kind: one group of bars per (part, collective, size,
    protocol/channels), log scale (the phases span 1 µs to ms); a phase <= 0 (a kernel can start before its
    launch call returns) is drawn at 0.1 µs."""
    import matplotlib.pyplot as plt
    import numpy as np

    s = summary_table(runs)
    if s.empty:
        return plot.message("no NCCL profiler dumps in these runs", runs.title)
    s = s.sort_values(["part", "name", "bytes"]).reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(9, 0.8 * len(s) + 1.5))
    y = np.arange(len(s))
    h = 0.8 / len(PHASES)
    for i, ph in enumerate(PHASES):
        ax.barh(y + i * h, s[ph].clip(lower=0.1).fillna(0.1), height=h, label=ph.replace("_us", ""))
    ax.set_yticks(y + 0.4 - h / 2)
    ax.set_yticklabels([f"{r.part} {r.name} {stats.human_bytes(r.bytes, 3)}\n{r.algorithm}/{r.protocol}, {r.n_channels} ch"
                        for r in s.itertuples()], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("µs (median over instances and ranks)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("Where a collective's time goes, from NCCL's own events\n" + runs.title, fontsize=8)
    return fig


def cost_figure(runs):
    """Time per all_reduce vs size with the plugin off / idle / on, and per step."""
    import matplotlib.pyplot as plt

    c = cost_table(runs)
    if c.empty:
        return plot.message("no plugin cost rows (run with nccl_profiler set)", runs.title)
    fig, ax = plt.subplots(figsize=(7, 4))
    s = c[c["what"] == "all_reduce"]
    for col, mark in (("off_us", "o-"), ("idle_us", "s--"), ("on_us", "^-")):
        ax.plot(s["bytes"], s[col], mark, label=col.replace("_us", ""))
    ax.set_yscale("log")
    plot.log2_bytes_axis(ax)
    ax.set_xlabel("all_reduce size")
    ax.set_ylabel("µs per call (median, slowest rank)")
    steps = c[c["what"].str.startswith("step")]
    txt = "; ".join(f"{r.what}: {r.off_us / 1e3:.2f} / {r.idle_us / 1e3:.2f} / {r.on_us / 1e3:.2f} ms"
                    for r in steps.itertuples())
    ax.set_title(f"NCCL profiler plugin cost (off / idle / on)\n{txt}", fontsize=8)
    ax.legend()
    return fig


# ------------------------------------------------------------------------------------------------ findings
def nccl_findings(runs) -> list[Observation]:
    out: list[Observation] = []
    a = alignment_table(runs)
    if a.empty:
        return out
    if (a["matched"] > 0).any():
        m = a[a["matched"] > 0]
        out.append(Observation("nccl_alignment", f"NCCL profiler dumps aligned with the Kineto traces: {int(m['matched'].sum())} "
                                             f"collectives matched over {len(m)} (part, rank) traces; largest residual "
                                             f"{m['gpu_error_us'].max():.2f} µs on the GPU clock, "
                                             f"{m['host_error_us'].max():.2f} µs on the host clock",
                               float(max(m["gpu_error_us"].max(), m["host_error_us"].max())), "µs"))
    if "error" in a.columns:
        for e in a["error"].dropna():
            out.append(Observation("nccl_dump_unreadable", f"NCCL profiler dump left out: {e}"))
    t = collectives_table(runs)
    if len(t):
        ch = t.groupby(["name", "bytes", "protocol"])["n_channels"].agg(lambda x: sorted(set(int(v) for v in x)))
        text = "; ".join(f"{n} {stats.human_bytes(b, 3)} {p}: {'/'.join(map(str, v))}" for (n, b, p), v in ch.items())
        out.append(Observation("nccl_channels", f"channels NCCL used per traced collective: {text}"))
        out += _protocol_vs_name(t)
        med = t[list(PHASES)].median()
        out.append(Observation("nccl_phases", "median phases over all traced collectives: " + ", ".join(
            f"{p.replace('_us', '')} {med[p]:.1f} µs" for p in PHASES), float(med["channels_us"]), "µs"))
    out += _late_peer(late_peer_table(runs, top=1))
    c = cost_table(runs)
    for r in (c.itertuples() if len(c) else ()):
        if r.on_vs_idle == r.on_vs_idle:
            what = r.what if r.what != "all_reduce" else f"all_reduce {stats.human_bytes(r.bytes, 3)}"
            out.append(Observation(f"nccl_cost_{what.replace(' ', '_')}",
                                   f"plugin cost, {what}: {r.on_minus_idle_us:+.1f} µs per call with every event on vs "
                                   f"loaded and idle ({r.idle_us:.1f} -> {r.on_us:.1f} µs, {r.on_vs_idle:.2f}x; 'on' "
                                   f"samples spread {r.on_iqr_us:.1f} µs IQR); not loaded: {r.off_us:.1f} µs",
                                   float(r.on_vs_idle), "x"))
    return out


def _protocol_vs_name(t) -> list[Observation]:
    """Kernels whose name's protocol suffix is not the protocol NCCL ran (NCCL names the kernel it launches,
    one per collective and type -- ``best_kernel`` in its ``src/device/generate.py`` -- and runs the chosen
    algorithm/protocol inside it)."""
    named = t[t["kernel"].str.contains("_LL$|_LL128$|_SIMPLE$", regex=True)]
    diff = named[named["kernel"].str.rsplit("_", n=1).str[-1] != named["protocol"]]
    if not len(diff):
        return []
    r = diff.iloc[0]
    text = (f"{len(diff)} of {len(named)} traced kernels ran another protocol than their name says: e.g. "
            f"{r['kernel']} ran {r['algorithm']}/{r['protocol']} on {int(r['n_channels'])} channels "
            f"({stats.human_bytes(r['bytes'], 3)}) -- the name is the kernel NCCL launched; only NCCL's events say what ran")
    return [Observation("nccl_protocol_vs_name", text, float(len(diff)), "")]


def _late_peer(lp) -> list[Observation]:
    if not len(lp):
        return []
    r = lp.iloc[0]
    text = (f"{r['part']} {r['name']} #{r['seq']}: rank {r['late_rank']}'s channels started {r['late_us']:.0f} µs "
            f"after its peer's; the early rank's wait shows inside its channels ({r['early_channels_us']:.0f} µs vs "
            f"{r['late_channels_us']:.0f} µs on the late rank), not before them (launch to first channel "
            f"{r['early_launch_to_gpu_us']:.1f} µs)")
    return [Observation("nccl_late_peer", text, float(r["late_us"]), "µs")]


NCCL_TABLES = {"nccl_collectives": collectives_table, "nccl_summary": summary_table,
               "nccl_alignment": alignment_table, "nccl_late_peer": late_peer_table, "nccl_cost": cost_table,
               "nccl_proxy": proxy_table, "nccl_proxy_summary": proxy_summary_table}
NCCL_FIGURES = {"nccl-phases": phases_figure, "nccl-cost": cost_figure, "nccl-proxy-steps": proxy_figure}
