"""The one-GPU probe matrix of the growing gap: no PyTorch, no NCCL, no profiler.

``recorded/probes/graph_gaps-repro/repro.cu`` captures N layers of a busy kernel (spins ``work_us`` on every SM, the
stand-in for a GEMM) on the main stream and a one-thread kernel on a side stream (the stand-in for a collective),
followed by an event record of one kind, and replays the graph many times; every kernel stamps its own start and
end with ``%globaltimer``. ``recorded/probes/graph_gaps-matrix/run_matrix.py`` runs it once per point, one factor
changed at a time from a base (N = 160, 200 us of work, one *shared* external event recorded on the side stream,
the next busy kernel depending on the record): the record kind (none / internal / shared / distinct / node), the
record's stream (side / main), the join (edge / external wait node / none), the work, N, graph upload, node
priority, queued replays and a one-block busy kernel.

Here the stamps become GPU activity rows (one device, ``ts``/``end`` in us) and :func:`kit.traces.gaps` gives each
kernel's gap (its start minus the latest end of any earlier kernel, all streams) -- the same arithmetic as every
profiler trace of the kit. :func:`collect` keeps every sample as compact rows (``gaps.parquet``: point, replay,
position, kernel, gap, duration) beside ``points.csv`` per hardware; :func:`slope_table` states each point's
gap per position (least squares over every sample of positions >= 1) and quarters.
"""

from __future__ import annotations

import json
import re
import tarfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ... import traces
from ...results import RECORDED_ROOT

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

MATRIX = RECORDED_ROOT / "probes" / "graph_gaps-matrix"
FACTORS = ["n", "work_us", "record", "where", "join", "upload", "priority", "grid", "queued", "replays", "busy", "hidden",
           "tail", "autofree", "pdl", "launch"]
# the repro's defaults of the factors added after the first run (its rows lack them)
DEFAULTS = {"busy": "spin", "hidden": 2048, "tail": 0, "autofree": 0, "pdl": 0, "launch": "created"}


class MatrixError(ValueError):
    """A raw stamp file or a run folder that is not what the repro writes."""


def read_raw(path) -> tuple[dict, "np.ndarray"]:
    """The repro's ``--raw`` file: a JSON header line, then int64 (start, end) ns per [replay][slot] (slot 2i =
    busy_i, 2i+1 = tiny_i). Returns (header, array of shape (replays, 2n, 2))."""
    import numpy as np

    data = Path(path).read_bytes()
    nl = data.find(b"\n")
    try:
        head = json.loads(data[:nl])
    except ValueError as e:
        raise MatrixError(f"{path}: no JSON header line ({e})") from None
    body = np.frombuffer(data[nl + 1:], dtype="<u8")
    want = head["replays"] * 2 * head["n"] * 2
    if body.size != want:
        raise MatrixError(f"{path}: {body.size} stamps, the header says {want}")
    st = body.reshape(head["replays"], 2 * head["n"], 2)
    if (st[..., 0] == np.iinfo(np.uint64).max).any() or (st[..., 1] == 0).any():
        raise MatrixError(f"{path}: a kernel never stamped")
    return head, st


def kernel_events(stamps: "np.ndarray") -> "pd.DataFrame":
    """GPU activity rows of the trace layer's shape (device, stream, name, cat, nccl, ts, end, dur in us from the
    first stamp) for stamps of shape (replays, 2n, 2), with replay, position and kernel (busy / tiny)."""
    import numpy as np
    import pandas as pd

    r, slots, _ = stamps.shape
    t0 = stamps[..., 0].min()
    ts = (stamps[..., 0] - t0).astype(np.int64).reshape(-1) / 1e3
    end = (stamps[..., 1] - t0).astype(np.int64).reshape(-1) / 1e3
    slot = np.tile(np.arange(slots), r)
    kernel = np.where(slot % 2 == 0, "busy", "tiny")
    return pd.DataFrame({"device": 0, "stream": np.where(slot % 2 == 0, 0, 1), "name": kernel, "cat": "kernel",
                         "nccl": False, "ts": ts, "end": end, "dur": end - ts,
                         "replay": np.repeat(np.arange(r), slots), "position": slot // 2, "kernel": kernel})


def point_gaps(stamps: "np.ndarray") -> "pd.DataFrame":
    """Every kernel's gap (kit.traces.gaps, no stall threshold: a replay's first kernel keeps the host's
    synchronisation gap) as compact rows: replay, position, kernel, gap_us, dur_us. The very first kernel of the
    point has no predecessor and no row."""
    ev = kernel_events(stamps)
    g = traces.gaps(ev, threshold_us=float("inf"))
    return g[["replay", "position", "kernel", "gap_us", "dur"]].rename(columns={"dur": "dur_us"})


def collect(src, dest) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """A run_matrix.py output (its folder or its .tar.gz) -> ``dest/points.csv`` (one row per point: set, point,
    factors, rc, seconds, device, driver, runtime, nodes, and the node census by type where the repro printed one)
    and ``dest/gaps.parquet`` (every kernel's gap). A point
    name listed twice (one run's list had a clash) has one raw file, the last one's: only the last row is kept."""
    import pandas as pd

    src = Path(src)
    if src.name.endswith(".tar.gz"):
        out = src.parent / src.name[: -len(".tar.gz")]
        with tarfile.open(src) as t:
            t.extractall(src.parent, filter="data")
        src = out
    if not (src / "points.jsonl").exists():
        raise MatrixError(f"{src}: no points.jsonl (not a run_matrix.py output)")
    pts, frames = [], []
    lines = [json.loads(x) for x in (src / "points.jsonl").read_text().splitlines()]
    last = {p["point"]: i for i, p in enumerate(lines)}
    for i, p in enumerate(lines):
        if last[p["point"]] != i:
            continue
        row = {"point_id": i, **{k: p.get(k, DEFAULTS.get(k)) for k in ["set", "point", *FACTORS, "rc", "seconds"]}}
        census = [x.split("nodes: ", 1)[1] for x in p.get("summary", []) if "nodes: " in x]  # the repro's node census
        if census:
            row["census"] = census[0]
        raw = src / "raw" / f"{p['point']}.bin"
        if p["rc"] == 0 and raw.exists():
            head, st = read_raw(raw)
            row.update(device=head["device"], driver=head["driver"], runtime=head["runtime"], nodes=head["nodes"],
                       grid=head["grid"])
            frames.append(point_gaps(st).assign(point_id=i))
        pts.append(row)
    points = pd.DataFrame(pts)
    gaps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    gaps = compact(gaps)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    points.to_csv(dest / "points.csv", index=False)
    if (src / "gpu.txt").exists():  # nvidia-smi's name and driver, nvcc's release
        (dest / "gpu.txt").write_text((src / "gpu.txt").read_text())
    gaps.to_parquet(dest / "gaps.parquet", index=False, compression="zstd")
    return points, gaps


def compact(g: "pd.DataFrame") -> "pd.DataFrame":
    """Small dtypes for committing: ids as int16/int32, kernel categorical, gap and duration float32 rounded to
    the ns (the stamps' unit)."""
    import numpy as np

    if g.empty:
        return g
    return g.assign(point_id=g["point_id"].astype(np.int16), replay=g["replay"].astype(np.int16),
                    position=g["position"].astype(np.int16), kernel=g["kernel"].astype("category"),
                    gap_us=g["gap_us"].round(3).astype(np.float32),
                    dur_us=g["dur_us"].round(3).astype(np.float32))[["point_id", "replay", "position", "kernel",
                                                                     "gap_us", "dur_us"]]


def hardware(root=MATRIX) -> list[str]:
    """The hardware folders with committed runs (``h100x1``, ``h200x1``)."""
    return sorted({p.parent.parent.name for p in Path(root).glob("*/*/gaps.parquet")})


def source(hw: str, root=MATRIX) -> dict:
    """What a figure of one hardware's committed matrix shows, for its caption in the report
    (:func:`kit.plot.note_source`): the folder and the GPU its runs' ``gpu.txt`` name."""
    names = set()
    for f in sorted((Path(root) / hw).glob("*/gpu.txt")):
        lines = f.read_text(errors="replace").splitlines()
        if len(lines) > 1 and lines[1].strip():
            names.add(lines[1].split(",")[0].strip())
    rel = Path(root).resolve() / hw
    try:
        rel = rel.relative_to(RECORDED_ROOT.parent)
    except ValueError:
        pass
    return {"source": "recorded", "what": f"recorded probe matrix {rel}", "hardware": ", ".join(sorted(names))}


def load(hw: str, root=MATRIX) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """(points, gaps) of one hardware's committed runs (``<root>/<hw>/<run>/``, each run one fresh machine),
    with ``run`` and a ``pid`` unique over the runs (run index x 10000 + point_id) on both. Runs committed
    without their samples (repeats kept small: points.csv and the repro's summary lines, :func:`log_table`) are
    left out."""
    import pandas as pd

    runs = sorted(p.parent for p in (Path(root) / hw).glob("*/gaps.parquet"))
    if not runs:
        raise MatrixError(f"{Path(root) / hw}: no committed probe matrix (<run>/gaps.parquet)")
    pts, gps = [], []
    for k, d in enumerate(runs):
        p, g = pd.read_csv(d / "points.csv"), pd.read_parquet(d / "gaps.parquet")
        pts.append(p.assign(run=d.name, pid=p["point_id"] + 10000 * k))
        gps.append(g.assign(pid=g["point_id"].astype(int) + 10000 * k))
    return pd.concat(pts, ignore_index=True), pd.concat(gps, ignore_index=True)


def _fit(d: "pd.DataFrame", by: list[str]) -> "pd.DataFrame":
    """Least-squares slope and intercept of gap_us against position per group (closed form on the groups' sums);
    NaN where a group has fewer than 3 distinct positions."""
    import numpy as np

    x, y = d["position"].astype(float), d["gap_us"].astype(float)
    s = d.assign(x=x, y=y, xx=x * x, xy=x * y).groupby(by)[["x", "y", "xx", "xy"]].agg("sum")
    s["m"] = d.groupby(by).size()
    s["k"] = d.groupby(by)["position"].nunique()
    den = s["m"] * s["xx"] - s["x"] ** 2
    slope = (s["m"] * s["xy"] - s["x"] * s["y"]) / den.where(den > 0)
    out = s.assign(slope=slope.where(s["k"] > 2), intercept=((s["y"] - slope * s["x"]) / s["m"]).where(s["k"] > 2))
    return out[["slope", "intercept", "m"]].replace([np.inf, -np.inf], np.nan)


def slope_table(points: "pd.DataFrame", gaps: "pd.DataFrame", quarters: int = 4) -> "pd.DataFrame":
    """One row per point: its factors, the busy kernel's median duration, the median gap before busy kernels in
    each quarter of the replay (positions >= 1), the least-squares slope and intercept of every such sample
    against its position (us per layer), the same slope over the first replay alone, the idle time per layer
    (all gaps of a replay but its first kernel's, / N, median over replays) and ``layer_us``, the work between
    records (busy slot + the gap before tiny_i). ``gap_is_idle`` is False for GEMM points without a join: there
    the stamp kernel of layer i+1 does not wait for tiny_i, so the gap before it is the unstamped GEMM itself, not
    idle time -- their statistics are left empty."""
    import numpy as np
    import pandas as pd

    key = "pid" if "pid" in points.columns else "point_id"
    p = points.copy()
    for k, v in DEFAULTS.items():
        if k not in p.columns:
            p[k] = v
    p["gap_is_idle"] = ~((p["busy"] == "gemm") & (p["join"] == "none"))
    cols = [c for c in ["run", "set", "point", *FACTORS, "rc", "gap_is_idle"] if c in p.columns]
    ok = p.loc[(p["rc"] == 0) & p["gap_is_idle"], [key, "n"]]
    g = gaps.assign(**{key: gaps[key].astype(int)}).merge(ok, on=key)
    b = g[(g["kernel"] == "busy") & (g["position"] >= 1)]
    fit = _fit(b, [key])
    first = b[b["replay"] == b.groupby(key)["replay"].transform("min")]
    fit["slope_first_replay"] = _fit(first, [key])["slope"]
    q = np.minimum(((b["position"] - 1) * quarters) // np.maximum(b["n"] - 1, 1), quarters - 1)
    quart = b.assign(q=q).groupby([key, "q"])["gap_us"].median().unstack()
    quart.columns = [f"q{int(c) + 1}_us" for c in quart.columns]
    inner = g[~((g["kernel"] == "busy") & (g["position"] == 0))]
    idle = inner.groupby([key, "replay"])["gap_us"].sum().groupby(level=0).median() / ok.set_index(key)["n"]
    busy = g[g["kernel"] == "busy"].set_index([key, "replay", "position"])
    tiny = g[g["kernel"] == "tiny"].set_index([key, "replay", "position"])
    layer = (busy["dur_us"] + tiny["gap_us"]).dropna().groupby(level=0).median()
    stats = pd.DataFrame({"busy_us": busy["dur_us"].groupby(level=0).median(), "layer_us": layer}).join(quart)
    stats = stats.join(fit.rename(columns={"slope": "slope_us_per_layer", "intercept": "intercept_us",
                                           "m": "samples"}))
    stats["idle_per_layer_us"] = idle
    out = p[[key] + cols].merge(stats, left_on=key, right_index=True, how="left")
    return out.drop(columns=[key]).reset_index(drop=True)


def matrix_table(_runs=None, root=MATRIX) -> "pd.DataFrame":
    """:func:`slope_table` of every committed hardware, one column ``hw`` first (empty without any). Computed
    once per folder and process (a few seconds), a copy returned."""
    return _matrix_table(str(Path(root).resolve())).copy()


@lru_cache(maxsize=4)
def _matrix_table(root: str) -> "pd.DataFrame":
    import pandas as pd

    t = [slope_table(*load(hw, root)).assign(hw=hw) for hw in hardware(root)]
    if not t:
        return pd.DataFrame()
    d = pd.concat(t, ignore_index=True)
    return d[["hw"] + [c for c in d.columns if c != "hw"]]


_LOG = re.compile(r"^(?P<point>\S+) (?P<rc>-?\d+) (?P<seconds>[\d.]+) # median gap before busy_i by quarter \(i>=1\): "
                  r"(?P<q>[-\d. ]+) us; slope (?P<slope>-?[\d.]+) us per layer$")


def log_table(hw: str, root=MATRIX) -> "pd.DataFrame":
    """Every run's ``matrix.log`` (run_matrix.py's line per point: the repro's own median gap per quarter and
    least-squares slope of the per-position medians, computed on the device) as rows: run, point, q1..q4, slope.
    The runs committed without samples are compared with the others through this."""
    import pandas as pd

    rows = []
    for log in sorted((Path(root) / hw).glob("*/matrix.log")):
        for line in log.read_text().splitlines():
            m = _LOG.match(line)
            if m:
                q = [float(x) for x in m["q"].split()]
                rows.append({"run": log.parent.name, "point": m["point"], "rc": int(m["rc"]),
                             **{f"q{i + 1}_us": v for i, v in enumerate(q)}, "slope_us_per_layer": float(m["slope"])})
    return pd.DataFrame(rows)


def versions(root=MATRIX) -> "pd.DataFrame":
    """Device, driver and CUDA runtime per committed hardware (as the repro read them)."""
    import pandas as pd

    rows = []
    for hw in hardware(root):
        p = load(hw, root)[0].dropna(subset=["device"])
        for dev, drv, rt in p[["device", "driver", "runtime"]].drop_duplicates().itertuples(index=False):
            rows.append({"hw": hw, "device": dev, "driver_api": f"{int(drv) // 1000}.{int(drv) % 1000 // 10}",
                         "runtime": f"{int(rt) // 1000}.{int(rt) % 1000 // 10}"})
    return pd.DataFrame(rows)


KEYS = ["busy", "hidden", "work_us", "grid", "tail", "autofree", "pdl", "record", "where", "join", "launch", "upload",
        "priority", "queued", "n"]


def factor_table(t: "pd.DataFrame") -> "pd.DataFrame":
    """:func:`slope_table` rows pooled per combination of factors, over the runs (each a fresh machine) and the sets
    of a run that repeat it: how many points, the median slope and its min..max, the median quarters and
    ``layer_us``."""
    import pandas as pd

    t = t[(t["rc"] == 0) & t["gap_is_idle"].astype(bool)] if len(t) else t
    if t.empty:
        return pd.DataFrame()
    keys = [k for k in ["hw", *KEYS] if k in t.columns]
    agg = dict(points=("slope_us_per_layer", "size"), slope_us_per_layer=("slope_us_per_layer", "median"),
               slope_min=("slope_us_per_layer", "min"), slope_max=("slope_us_per_layer", "max"),
               layer_us=("layer_us", "median"), **{f"q{i}_us": (f"q{i}_us", "median") for i in range(1, 5)})
    return t.groupby(keys, dropna=False).agg(**agg).reset_index()


def launch_table(_runs=None, root=MATRIX) -> "pd.DataFrame":
    """The decisive rows: N = 160, record kind none / shared / distinct, side stream, edge join, default flags,
    spin (200 us, full grid) and GEMM (1024 x 2048 x 2048 + tanh) work, replayed into a created stream or the
    legacy default stream -- slope and quarters per hardware (pooled over runs by :func:`factor_table`)."""
    f = factor_table(matrix_table(root=root))
    if f.empty:
        return f
    m = ((f["n"] == 160) & (f["where"] == "side") & (f["join"] == "edge") & (f["upload"] == 0) & (f["priority"] == 0)
         & (f["queued"] == 0) & (f["pdl"] == 0) & (f["autofree"] == 0) & f["record"].isin(["none", "shared", "distinct"])
         & (((f["busy"] == "spin") & (f["work_us"] == 200) & (f["grid"] == 264) & (f["tail"] == 0))
            | ((f["busy"] == "gemm") & (f["hidden"] == 2048) & (f["tail"] == 1))))
    cols = ["hw", "busy", "launch", "record", "points", "layer_us", "q1_us", "q2_us", "q3_us", "q4_us",
            "slope_us_per_layer", "slope_min", "slope_max"]
    return f.loc[m, cols].sort_values(["hw", "busy", "launch", "record"]).reset_index(drop=True)


def median_by_position(points: "pd.DataFrame", gaps: "pd.DataFrame", point: str, run: str | None = None) -> "pd.Series":
    """Median over replays of the gap before busy_i, by position i, of one named point (of ``run``; default the
    last run that has it)."""
    key = "pid" if "pid" in points.columns else "point_id"
    sel = points["point"] == point
    if run is not None and "run" in points.columns:
        sel &= points["run"] == run
    pid = points.loc[sel, key]
    if pid.empty:
        raise MatrixError(f"no point {point!r}" + (f" in run {run!r}" if run else ""))
    g = gaps[(gaps[key] == int(pid.iloc[-1])) & (gaps["kernel"] == "busy")]
    return g.groupby("position")["gap_us"].median()


def figure(hw: str, root=MATRIX):
    """Three panels of one hardware's matrix: (a) the median gap before busy_i by position at N = 160 for the
    launch stream x record kind x work (the rows of :func:`launch_table`); (b) the legacy-stream spin point at
    N = 640; (c) every point's slope against the work between records (``layer_us``), created-stream points
    grey, legacy-stream points coloured by work."""
    import matplotlib.pyplot as plt

    from ... import plot

    try:
        points, gaps = load(hw, root)
    except MatrixError as e:
        return plot.message(str(e))
    t = slope_table(points, gaps)
    t = t[(t["rc"] == 0) & t["gap_is_idle"].astype(bool)]
    fig, ax = plt.subplots(1, 3, figsize=(17, 4.4))
    base = ((t["n"] == 160) & (t["join"] == "edge") & (t["where"] == "side") & (t["pdl"] == 0) & (t["upload"] == 0)
            & (t["priority"] == 0) & (t["queued"] == 0) & (t["autofree"] == 0)
            & (((t["busy"] == "spin") & (t["work_us"] == 200) & (t["grid"] == 264) & (t["tail"] == 0))
               | ((t["busy"] == "gemm") & (t["hidden"] == 2048) & (t["tail"] == 1))))
    sel = t[base & t["record"].isin(["none", "shared", "distinct"])].drop_duplicates(
        ["busy", "launch", "record"], keep="last")
    for r in sel.itertuples():
        m = median_by_position(points, gaps, r.point, r.run)
        ax[0].plot(m.index[1:], m.values[1:], lw=1.2, ls="-" if r.launch == "legacy" else ":",
                   color={"none": "grey", "shared": "C3", "distinct": "C0"}[r.record],
                   marker=None if r.busy == "gemm" else ".", markevery=16, label=f"{r.launch} | {r.busy} | {r.record}")
    ax[0].set(yscale="symlog", xlabel="position i (layer)", ylabel="median gap before layer i's work (us)",
              title="(a) N=160: replay stream | work | record kind")
    ax[0].legend(fontsize=7)
    big = t[(t["launch"] == "legacy") & (t["n"] == 640)]
    for r in big.itertuples():
        m = median_by_position(points, gaps, r.point, r.run)
        ax[1].plot(m.index[1:], m.values[1:], lw=1, label=f"run {r.run} | {r.busy} {r.work_us:g} us | {r.record}")
    ax[1].set(xlabel="position i (layer)", ylabel="median gap before busy_i (us)", title="(b) N=640, legacy stream")
    ax[1].legend(fontsize=7)
    c = t[t["launch"] == "created"]
    ax[2].scatter(c["layer_us"], c["slope_us_per_layer"], s=10, color="grey", label="created stream (all points)")
    for busy, d in t[t["launch"] == "legacy"].groupby("busy"):
        ax[2].scatter(d["layer_us"], d["slope_us_per_layer"], s=30, label=f"legacy stream, {busy}")
    ax[2].set(xscale="log", xlabel="work between records (us)", ylabel="slope of the gap (us per layer)",
              title="(c) slope against the work between records")
    ax[2].legend(fontsize=7)
    dev = points["device"].dropna()
    fig.suptitle(f"graph_gaps probe matrix without PyTorch or NCCL, {hw} ({dev.iloc[0] if len(dev) else '?'}), "
                 f"{points['run'].nunique()} runs", fontsize=10)
    fig.tight_layout()
    return fig


REPRO = RECORDED_ROOT / "probes" / "graph_gaps-repro"
_HEAD = re.compile(r"^# n (?P<n>\d+) busy (?P<busy>\S+) .*? tail (?P<tail>\d+) record (?P<record>\S+) where (?P<where>\S+) "
                   r"join (?P<join>\S+) .*? queued (?P<queued>\d+) replays (?P<replays>\d+)")
_LAUNCH = re.compile(r"^# pdl (?P<pdl>\d+)(?: launch (?P<launch>[a-z_]+))?(?: post (?P<post>\d+) after (?P<after>\S+) "
                     r"blockers (?P<blockers>\d+))?(?: marks (?P<marks>\d+))?")
_SPAN = re.compile(r"replay span median [\d.]+ us \((?P<per_layer>[\d.]+) us per layer\)")
_QUART = re.compile(r"^# median gap before busy_i by quarter \(i>=1\): (?P<q>[-\d. ]+) us; slope (?P<slope>-?[\d.]+)")
_POST = re.compile(r"^# post: .*? by quarter: (?P<a>[-\d. ]+) us; .*? by quarter: (?P<b>[-\d. ]+) us")
_MARKS = re.compile(r"^# marks: .*? in (?P<early>\d+) of (?P<pairs>\d+) pairs; start\(r\+1\) - end\(r\) median "
                    r"(?P<gap>-?[\d.]+) us")
_CMD = re.compile(r"^\$ (?P<env>(?:[A-Z_]+=\S+ )*)\s*\./repro ")


def outputs_table(_runs=None, root=REPRO) -> "pd.DataFrame":
    """The reproducer's committed printouts (``<root>/**/*.txt``; a file may hold several runs, each from its
    ``# device`` line, the command line above it giving its environment): one row per run -- file, environment,
    busy kind, launch stream (a printout without it: the created stream, the repro's first default), record kind,
    its stream, join, queued, pdl, the switches ``post`` / ``after`` / ``blockers``, time per layer of a
    replay, the median gap before busy_i per quarter and its slope, and with ``--post`` the lag per quarter from
    tiny_i's end to post_i's start (``rec_q*``: the record and an edge on its own branch -- ``post`` 2: on a third
    branch forked off the record) and from post_i's end to the next layer (``join_q*``: the edge across, with
    ``post`` 1); with ``--marks``, in how many of the pairs of consecutive replays
    the later one started before the earlier one ended, and the median time from one's end to the next's start
    (``next_replay_after_us``, negative: overlapping). Runs that did not finish (no summary) are left out."""
    import pandas as pd

    rows, env = [], ""
    for f in sorted(Path(root).rglob("*.txt")):
        row = None
        for ln in f.read_text(errors="replace").splitlines():
            if (m := _CMD.match(ln)):
                env = m["env"].strip()
            elif ln.startswith("# device "):
                row = {"file": str(f.relative_to(root)), "env": env, "launch": DEFAULTS["launch"], "pdl": 0, "post": 0,
                       "after": "none", "blockers": 0, "marks": 0}
                rows.append(row)
            elif row is None:
                continue
            elif (m := _HEAD.match(ln)):
                row.update({k: (int(v) if v.isdigit() else v) for k, v in m.groupdict().items()})
            elif (m := _LAUNCH.match(ln)):
                row.update(launch=m["launch"] or DEFAULTS["launch"], pdl=int(m["pdl"]), post=int(m["post"] or 0), after=m["after"] or "none",
                           blockers=int(m["blockers"] or 0), marks=int(m["marks"] or 0))
            elif (m := _QUART.match(ln)):
                row.update({f"q{i + 1}_us": float(v) for i, v in enumerate(m["q"].split())},
                           slope_us_per_layer=float(m["slope"]))
            elif (m := _MARKS.match(ln)):
                row.update(replays_overlapping=int(m["early"]), replay_pairs=int(m["pairs"]),
                           next_replay_after_us=float(m["gap"]))
            elif (m := _POST.match(ln)):
                row.update({f"rec_q{i + 1}_us": float(v) for i, v in enumerate(m["a"].split())})
                row.update({f"join_q{i + 1}_us": float(v) for i, v in enumerate(m["b"].split())})
            if row is not None and (m := _SPAN.search(ln)):
                row["layer_us"] = float(m["per_layer"])
        env = ""
    cols = ["file", "env", "busy", "launch", "record", "where", "join", "queued", "pdl", "post", "after", "blockers", "n", "layer_us",
            "q1_us", "q2_us", "q3_us", "q4_us", "slope_us_per_layer", *(f"rec_q{i}_us" for i in range(1, 5)),
            *(f"join_q{i}_us" for i in range(1, 5)), "marks", "replays_overlapping", "replay_pairs",
            "next_replay_after_us"]
    t = pd.DataFrame([r for r in rows if "slope_us_per_layer" in r])
    return t.reindex(columns=cols) if len(t) else pd.DataFrame(columns=cols)
