"""The one-GPU probe matrix of the growing gap (issue 31): no PyTorch, no NCCL, no profiler.

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
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

from ... import traces
from ...results import RECORDED_ROOT

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

MATRIX = RECORDED_ROOT / "probes" / "graph_gaps-matrix"
FACTORS = ["n", "work_us", "record", "where", "join", "upload", "priority", "grid", "queued", "replays"]


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
    factors, rc, seconds, device, driver, runtime, nodes) and ``dest/gaps.parquet`` (every kernel's gap)."""
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
    for i, line in enumerate((src / "points.jsonl").read_text().splitlines()):
        p = json.loads(line)
        row = {"point_id": i, **{k: p.get(k) for k in ["set", "point", *FACTORS, "rc", "seconds"]}}
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
    """The hardware folders with committed rows (``h100x1``, ``h200x1``)."""
    return sorted(p.parent.name for p in Path(root).glob("*/gaps.parquet"))


def load(hw: str, root=MATRIX) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """(points, gaps) of one hardware's committed matrix."""
    import pandas as pd

    d = Path(root) / hw
    if not (d / "points.csv").exists():
        raise MatrixError(f"{d}: no committed probe matrix (points.csv)")
    return pd.read_csv(d / "points.csv"), pd.read_parquet(d / "gaps.parquet")


def slope_table(points: "pd.DataFrame", gaps: "pd.DataFrame", quarters: int = 4) -> "pd.DataFrame":
    """One row per point: its factors, the busy kernel's median duration, the median gap before busy kernels in
    each quarter of the replay (positions >= 1), the least-squares slope and intercept of every such sample
    against its position (us per layer), the same slope over the first replay alone, and the idle time per layer
    (all gaps of a replay but its first kernel's, / N, median over replays)."""
    import numpy as np
    import pandas as pd

    out = []
    for p in points.itertuples(index=False):
        row = {k: getattr(p, k) for k in ["set", "point", *FACTORS, "rc"] if hasattr(p, k)}
        g = gaps[gaps["point_id"] == p.point_id]
        b = g[(g["kernel"] == "busy") & (g["position"] >= 1)]
        if p.rc != 0 or b.empty:
            out.append(row)
            continue
        x, y = b["position"].to_numpy(float), b["gap_us"].to_numpy(float)
        slope, icpt = np.polyfit(x, y, 1) if np.unique(x).size > 2 else (np.nan, np.nan)
        f = b[b["replay"] == b["replay"].min()]
        first = np.polyfit(f["position"], f["gap_us"], 1)[0] if f["position"].nunique() > 2 else np.nan
        q = np.minimum(((b["position"] - 1) * quarters) // max(int(p.n) - 1, 1), quarters - 1)
        med = b.groupby(q.to_numpy())["gap_us"].median()
        inner = g[~((g["kernel"] == "busy") & (g["position"] == 0))]
        idle = inner.groupby("replay")["gap_us"].sum().median() / int(p.n)
        row.update(busy_us=float(g.loc[g["kernel"] == "busy", "dur_us"].median()),
                   **{f"q{i + 1}_us": float(med.get(i, np.nan)) for i in range(quarters)},
                   slope_us_per_layer=float(slope), intercept_us=float(icpt), slope_first_replay=float(first),
                   idle_per_layer_us=float(idle), samples=len(b))
        out.append(row)
    return pd.DataFrame(out)


def matrix_table(_runs=None, root=MATRIX) -> "pd.DataFrame":
    """:func:`slope_table` of every committed hardware, one column ``hw`` first (empty without any)."""
    import pandas as pd

    t = [slope_table(*load(hw, root)).assign(hw=hw) for hw in hardware(root)]
    if not t:
        return pd.DataFrame()
    d = pd.concat(t, ignore_index=True)
    return d[["hw"] + [c for c in d.columns if c != "hw"]]


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


def median_by_position(points: "pd.DataFrame", gaps: "pd.DataFrame", point: str) -> "pd.Series":
    """Median over replays of the gap before busy_i, by position i, of one named point."""
    pid = points.loc[points["point"] == point, "point_id"]
    if pid.empty:
        raise MatrixError(f"no point {point!r}")
    g = gaps[(gaps["point_id"] == int(pid.iloc[0])) & (gaps["kernel"] == "busy")]
    return g.groupby("position")["gap_us"].median()


def figure(hw: str, root=MATRIX):
    """Four panels of one hardware's matrix: (a) median gap before busy_i by position at the base (N = 160,
    200 us) per record kind and join; (b) the same for N = 10 .. 1000 (shared record); (c) the slope against the
    work between records per record kind; (d) the slope per launch variant."""
    import matplotlib.pyplot as plt

    from ... import plot

    try:
        points, gaps = load(hw, root)
    except MatrixError as e:
        return plot.message(str(e))
    t = slope_table(points, gaps)
    fig, ax = plt.subplots(1, 4, figsize=(20, 4.2))
    s = t[(t["set"] == "structure") & (t["rc"] == 0)]
    for r in s.itertuples():
        m = median_by_position(points, gaps, r.point)
        ax[0].plot(m.index[1:], m.values[1:], lw=1, ls="-" if r.where == "side" else ":",
                   label=f"{r.record}/{r.join}/{r.where}")
    ax[0].set(yscale="symlog", xlabel="position i (layer)", ylabel="median gap before busy_i (us)",
              title="(a) record kind / join / stream, N=160, 200 us")
    ax[0].legend(fontsize=6, ncol=2)
    for r in t[(t["set"] == "layers") & (t["record"] == "shared") & (t["rc"] == 0)].itertuples():
        m = median_by_position(points, gaps, r.point)
        ax[1].plot(m.index[1:], m.values[1:], lw=1, label=f"N={r.n}")
    ax[1].set(xlabel="position i (layer)", ylabel="median gap before busy_i (us)",
              title="(b) shared external record, 200 us, N sweep")
    ax[1].legend(fontsize=7)
    for rec, d in t[(t["set"] == "work") & (t["rc"] == 0)].groupby("record"):
        d = d.sort_values("work_us")
        ax[2].plot(d["busy_us"], d["slope_us_per_layer"], marker="o", label=rec)
    ax[2].set(xscale="log", xlabel="busy kernel (us)", ylabel="slope (us per layer)",
              title="(c) slope against the work between records, N=160")
    ax[2].legend(fontsize=7)
    la = t[t["set"].isin(["launch", "base"]) & (t["rc"] == 0)]
    ax[3].barh(la["point"].str.replace("launch-", ""), la["slope_us_per_layer"])
    ax[3].set(xlabel="slope (us per layer)", title="(d) launch variants, N=160, 200 us")
    ax[3].tick_params(axis="y", labelsize=7)
    dev = points["device"].dropna()
    fig.suptitle(f"graph_gaps probe matrix, {hw} ({dev.iloc[0] if len(dev) else '?'})", fontsize=10)
    fig.tight_layout()
    return fig
